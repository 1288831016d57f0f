//! Fuzz targets of shardproof and their seed corpora.
//!
//! Each target takes arbitrary bytes and must return normally whatever they hold: a panic is a
//! bug (libFuzzer reports it as a crash). Beyond not panicking, the targets check the
//! diagnostics contract: every parse error names a line and column inside the input, and
//! quotes no more than a short excerpt of it ([`check_error`]).
//!
//! The targets run under libFuzzer through cargo-fuzz (`crates/fuzz/fuzz`, see
//! `docs/fuzzing.md`); the workspace builds this crate on stable, and its tests run every
//! target over the seed corpus ([`seeds`]) so that the targets keep compiling and the seeds
//! stay clean.

#![warn(missing_docs)]

use shardproof_ir::{Graph, NodeKind, SourceError};
use shardproof_ops::Tensor;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

pub mod seeds;

/// The longest excerpt of the input a diagnostic may quote between backticks (the excerpt
/// limit of the diagnostics contract, ~80 characters plus an ellipsis, with some slack for
/// quoted names the message composes).
pub const MAX_QUOTE: usize = 100;

/// Element budget of the graphs the `interp` target runs (bytes of f64 storage).
const INTERP_BUDGET: u64 = 1 << 22;

/// Checks a diagnostic about `text`: it names a line and column inside the text, and every
/// backtick-quoted excerpt is short. Panics (a fuzz finding) otherwise.
pub fn check_error(e: &SourceError, text: &str) {
    let shown = e.to_string();
    let span = e
        .span
        .unwrap_or_else(|| panic!("a parse error without a line and column: {shown}"));
    // YAML (the case file) also breaks lines at a lone `\r`; count the most lines either way.
    let lines = text
        .split('\n')
        .count()
        .max(text.replace("\r\n", "\n").split(['\n', '\r']).count());
    assert!(
        span.line >= 1 && span.line <= lines + 1 && span.col >= 1,
        "a parse error at {}:{} outside the input ({lines} lines): {shown}",
        span.line,
        span.col
    );
    assert!(
        e.message.chars().count() <= shardproof_import::MAX_MESSAGE_CHARS + 1,
        "a parse error of {} characters: {shown:.400}",
        e.message.chars().count()
    );
    // Quotes can only be told apart when the input holds no backtick of its own.
    let quotes_known = !text.contains('`');
    for (i, quoted) in e.message.split('`').enumerate().filter(|_| quotes_known) {
        assert!(
            i % 2 == 0 || quoted.chars().count() <= MAX_QUOTE,
            "a parse error quotes {} characters: {shown:.400}",
            quoted.chars().count()
        );
    }
}

/// The input as text (invalid UTF-8 must be reported at its line and column).
fn text_of<'a>(data: &'a [u8], path: &Path) -> Option<&'a str> {
    match shardproof_import::decode_utf8(data, path) {
        Ok(t) => Some(t),
        Err(e) => {
            let lossy = String::from_utf8_lossy(data);
            check_error(&e, &lossy);
            None
        }
    }
}

/// Parses a graph: JSON when the text starts with `{`, torch.fx text (lenient) otherwise.
fn parse_graph(text: &str) -> Option<Graph> {
    if text.trim_start().starts_with('{') {
        shardproof_import::from_json(text, Path::new("fuzz.json")).ok()
    } else {
        shardproof_import::parse_fx_lenient(text, Path::new("fuzz.py"))
            .ok()
            .map(|p| p.graph)
    }
}

/// torch.fx text: strict and lenient parses never panic, errors are located, a parsed graph is
/// well formed and survives a JSON round trip.
pub fn fx(data: &[u8]) {
    let path = Path::new("fuzz.py");
    let Some(text) = text_of(data, path) else {
        return;
    };
    for lenient in [false, true] {
        let parsed = if lenient {
            shardproof_import::parse_fx_lenient(text, path)
        } else {
            shardproof_import::parse_fx(text, path)
        };
        match parsed {
            Ok(p) => {
                if let Err(e) = p.graph.check_structure() {
                    panic!("parse_fx made a malformed graph: {e}");
                }
                let json = shardproof_import::to_json(&p.graph);
                if let Err(e) = shardproof_import::from_json(&json, Path::new("rt.json")) {
                    panic!("the JSON of a parsed graph does not read back: {e}");
                }
            }
            Err(e) => check_error(&e, text),
        }
    }
}

/// The JSON graph format: never panics, errors are located, a graph read is well formed and
/// reads back from its own JSON.
pub fn json(data: &[u8]) {
    let path = Path::new("fuzz.json");
    let Some(text) = text_of(data, path) else {
        return;
    };
    match shardproof_import::from_json(text, path) {
        Ok(g) => {
            if let Err(e) = g.check_structure() {
                panic!("from_json made a malformed graph: {e}");
            }
            let json = shardproof_import::to_json(&g);
            if let Err(e) = shardproof_import::from_json(&json, Path::new("rt.json")) {
                panic!("to_json of a graph read from JSON does not read back: {e}");
            }
        }
        Err(e) => check_error(&e, text),
    }
}

/// The graphs a fuzzed case is resolved against: the zoo's MLP under tp=2 (spec, rank 0,
/// rank 1), parsed once.
fn case_graphs() -> &'static (Graph, Vec<Graph>) {
    static G: OnceLock<(Graph, Vec<Graph>)> = OnceLock::new();
    G.get_or_init(|| {
        let files = seeds::zoo_case("mlp", "tp=2", true);
        let parse = |name: &str| {
            let text = &files.iter().find(|(n, _)| n == name).expect("zoo file").1;
            shardproof_import::parse_fx(text, Path::new(name))
                .expect("zoo graphs parse")
                .graph
        };
        (parse("spec.py"), vec![parse("r0.py"), parse("r1.py")])
    })
}

/// The case file: parsing never panics and its errors are located; a parsed case is resolved
/// against fixed graphs ([`case_graphs`], repeated to the case's rank count, at most 16), which
/// must not panic either.
pub fn case(data: &[u8]) {
    let path = Path::new("fuzz.yaml");
    let Some(text) = text_of(data, path) else {
        return;
    };
    match shardproof_case::parse_case(text, path) {
        Ok(file) => {
            let (spec, ranks) = case_graphs();
            let n = file.impl_.graphs.len().clamp(1, 16);
            let ranks: Vec<Graph> = (0..n).map(|r| ranks[r % ranks.len()].clone()).collect();
            // Resolution errors may concern the graphs rather than the case text: only the
            // absence of a panic is checked.
            let _ = shardproof_case::resolve_case(file, spec.clone(), ranks);
        }
        Err(e) => check_error(&e, text),
    }
}

/// Shape inference and type checking of any graph that parses: never panics, and every type
/// error names the graph's file.
pub fn infer(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Some(graph) = parse_graph(text) else {
        return;
    };
    let _ = shardproof_interp::infer_graph(&graph, &BTreeMap::new());
    if let Err(errors) = shardproof_interp::typecheck(&graph, &BTreeMap::new()) {
        let file = graph
            .path
            .as_ref()
            .map_or_else(|| graph.name.clone(), |p| p.display().to_string());
        for e in errors {
            let shown = e.to_string();
            assert!(
                shown.starts_with(&file),
                "a type error without its file: {shown}"
            );
        }
    }
}

/// Runs a small graph that type-checks on deterministic inputs: the interpreter returns a
/// value or an error, never panics.
pub fn interp(data: &[u8]) {
    let _ = run_small(data);
}

/// What the `interp` target does: `None` when the input is not a graph that type-checks and
/// needs at most 4 MiB, else the run's result.
pub fn run_small(
    data: &[u8],
) -> Option<Result<shardproof_interp::Env, shardproof_interp::InterpError>> {
    let text = std::str::from_utf8(data).ok()?;
    let graph = parse_graph(text)?;
    let inference = shardproof_interp::typecheck(&graph, &BTreeMap::new()).ok()?;
    if shardproof_interp::storage_bytes(&inference.metas, None).is_none_or(|b| b > INTERP_BUDGET) {
        return None;
    }
    let mut leaves = BTreeMap::new();
    for (i, node) in graph.nodes.iter().enumerate() {
        if !matches!(node.kind, NodeKind::Input | NodeKind::Constant { .. }) {
            continue;
        }
        for (o, out) in node.outputs.iter().enumerate() {
            let Some(Some(meta)) = inference.metas[i].get(o) else {
                continue;
            };
            let n = meta.numel();
            let data = (0..n)
                .map(|k| {
                    if meta.dtype.is_float() {
                        ((k % 7) as f64 - 3.0) / 4.0
                    } else {
                        (k % 2) as f64
                    }
                })
                .collect();
            leaves.insert(out.name.clone(), Tensor::new(meta.clone(), data));
        }
    }
    let cfg = shardproof_interp::RunConfig::default();
    Some(shardproof_interp::run_graph(&graph, &leaves, &cfg))
}

/// A fuzz target: runs on one input, panics on a finding.
pub type Target = fn(&[u8]);

/// Every target by name, for the seed tests and the replay tool.
pub const TARGETS: [(&str, Target); 5] = [
    ("fx", fx),
    ("json", json),
    ("case", case),
    ("infer", infer),
    ("interp", interp),
];

/// The shared samples folder (`$SHARDPROOF_SHARED/samples`, else `shared/samples` beside the
/// checkout), when present.
pub fn samples_dir() -> Option<PathBuf> {
    let root = std::env::var_os("SHARDPROOF_SHARED").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"),
        PathBuf::from,
    );
    let dir = root.join("samples");
    dir.is_dir().then_some(dir)
}
