//! `shardproof inspect`: what a graph or a case contains, and whether our shape inference agrees
//! with the shapes the capture recorded.

use crate::Verdict;
use serde::Serialize;
use shardproof_interp::{infer_graph, NodeInference};
use shardproof_ir::{Graph, NodeKind, OpMeaning, SourceError};
use shardproof_ops::{Args, Meta, OpClass, Registry, Tensor, Values};
use std::collections::BTreeMap;
use std::path::Path;

/// Parse coverage of one graph file.
#[derive(Serialize, Default)]
struct Lines {
    total: usize,
    parsed: usize,
    ignored: usize,
    unparsed: Vec<Unparsed>,
}

#[derive(Serialize)]
struct Unparsed {
    line: usize,
    text: String,
}

#[derive(Serialize)]
struct Io {
    name: String,
    #[serde(rename = "type")]
    ty: Option<String>,
}

#[derive(Serialize)]
struct Collective {
    group: String,
    op: String,
    count: usize,
}

#[derive(Serialize)]
struct ShapeMismatch {
    node: String,
    line: Option<usize>,
    op: String,
    recorded: String,
    inferred: String,
}

#[derive(Serialize)]
struct InferenceFailure {
    node: String,
    line: Option<usize>,
    op: String,
    error: String,
}

/// Everything `inspect` reports about one graph.
#[derive(Serialize)]
struct GraphReport {
    role: String,
    path: String,
    lines: Option<Lines>,
    nodes: usize,
    inputs: Vec<Io>,
    outputs: Vec<Io>,
    operators: Vec<(String, usize)>,
    collectives: Vec<Collective>,
    opaque: Vec<(String, usize)>,
    shapes_checked: usize,
    shape_mismatches: Vec<ShapeMismatch>,
    inference_failures: Vec<InferenceFailure>,
}

impl GraphReport {
    fn clean(&self) -> bool {
        self.lines.as_ref().is_none_or(|l| l.unparsed.is_empty())
            && self.opaque.is_empty()
            && self.shape_mismatches.is_empty()
            && self.inference_failures.is_empty()
    }
}

#[derive(Serialize)]
struct Report {
    path: String,
    graphs: Vec<GraphReport>,
    clean: bool,
}

/// How `inspect` shows its work: without `quiet` (and without `json`), a spinner on a
/// terminal or a line every few seconds in a log counting the graphs read; a positive
/// `time_limit` (seconds) ends it inconclusive, naming the graph it had reached.
#[derive(Clone, Copy, Debug, Default)]
pub struct Watching {
    /// Show no progress.
    pub quiet: bool,
    /// Seconds before it stops (0: no limit).
    pub time_limit: f64,
}

/// Runs `inspect` and returns the verdict (exit code).
pub fn main(path: &Path, strict: bool, json: bool, watching: Watching) -> Verdict {
    let progress = std::sync::Arc::new(shardproof_ir::Progress::default());
    let counted = progress.clone();
    let owned = path.to_path_buf();
    let watched = crate::watch::watch_shown(
        move || build(&owned, Some(&counted)),
        progress,
        crate::watch::Shown {
            visible: !watching.quiet && !json,
            prefix: format!("inspect {}: ", path.display()),
            units: "graphs",
            preparing: "reading the graphs",
            limit: watching.time_limit,
        },
    );
    let built = match watched {
        crate::watch::Watched::Done(built) => built,
        crate::watch::Watched::TimedOut(stopped) => {
            let message = format!(
                "inconclusive: inspect did not finish within the time limit ({} s; --time-limit): {}",
                stopped.limit,
                stopped.at("graph")
            );
            if json {
                crate::print_invalid_json(Some(&path.display().to_string()), &message);
            }
            errln!("{message}");
            return Verdict::Inconclusive;
        }
        crate::watch::Watched::Lost => {
            errln!("inconclusive: inspect stopped without a result (its thread ended early)");
            return Verdict::Inconclusive;
        }
    };
    let report = match built {
        Ok(r) => r,
        Err(e) => {
            let message = format!("error: {e}");
            if json {
                crate::print_invalid_json(Some(&path.display().to_string()), &message);
            }
            errln!("{message}");
            return Verdict::Invalid;
        }
    };
    if json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&report).expect("report serializes")
        );
    } else {
        print_text(&report, strict);
    }
    if strict && !report.clean {
        Verdict::Violated
    } else {
        Verdict::Holds
    }
}

/// `inspect --strict` with a one-line summary instead of the full report (for the demo).
pub fn summary(path: &Path) -> Verdict {
    match build(path, None) {
        Err(e) => {
            errln!("error: {e}");
            Verdict::Invalid
        }
        Ok(r) => {
            let nodes: usize = r.graphs.iter().map(|g| g.nodes).sum();
            let checked: usize = r.graphs.iter().map(|g| g.shapes_checked).sum();
            let collectives: usize = r
                .graphs
                .iter()
                .flat_map(|g| &g.collectives)
                .map(|c| c.count)
                .sum();
            outln!(
                "inspect: {} graphs, {nodes} nodes, {collectives} collectives, {checked} recorded shapes checked: {}",
                r.graphs.len(),
                if r.clean {
                    "every line parsed, no opaque operator, every shape agrees"
                } else {
                    "NOT clean (run `shardproof inspect --strict` on the case for details)"
                }
            );
            if r.clean {
                Verdict::Holds
            } else {
                Verdict::Violated
            }
        }
    }
}

fn is_case(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("yaml") || e.eq_ignore_ascii_case("yml"))
}

/// Reads `path` and reports on every graph, counting them in `progress` when given.
fn build(path: &Path, progress: Option<&shardproof_ir::Progress>) -> Result<Report, SourceError> {
    let mut graphs = Vec::new();
    if is_case(path) {
        let case = shardproof_case::load_case(path)?;
        case.validate_ops(&|op| Registry::builtin().get(op).is_some())?;
        let graph_names = std::iter::once("spec".to_string())
            .chain((0..case.program.ranks.len()).map(|r| format!("rank {r}")));
        let all = std::iter::once(&case.spec).chain(case.program.ranks.iter().map(|g| &**g));
        if let Some(p) = progress {
            p.start(1 + case.program.ranks.len());
        }
        for (name, g) in graph_names.zip(all) {
            if let Some(p) = progress {
                p.enter(&name);
            }
            graphs.push(graph_report(&name, g, &case.ops)?);
            if let Some(p) = progress {
                p.leave();
            }
        }
    } else {
        let graph = shardproof_import::load_graph(path)?;
        graphs.push(graph_report("graph", &graph, &BTreeMap::new())?);
    }
    let clean = graphs.iter().all(GraphReport::clean);
    Ok(Report {
        path: path.display().to_string(),
        graphs,
        clean,
    })
}

/// Reads parse coverage by re-reading the graph file as torch.fx text.
fn line_coverage(graph: &Graph) -> Result<Option<Lines>, SourceError> {
    let Some(path) = &graph.path else {
        return Ok(None);
    };
    if path.extension().and_then(|e| e.to_str()) == Some("json") {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| SourceError::new(path, None, format!("cannot read: {e}")))?;
    let parsed = shardproof_import::parse_fx_lenient(&text, path)?;
    let s = parsed.stats;
    Ok(Some(Lines {
        total: s.lines_total,
        parsed: s.lines_parsed,
        ignored: s.lines_ignored,
        unparsed: s
            .unparsed
            .into_iter()
            .map(|(line, text)| Unparsed { line, text })
            .collect(),
    }))
}

struct MetaOnly<'a>(&'a [Vec<Option<Meta>>]);

impl Values for MetaOnly<'_> {
    fn meta(&self, v: shardproof_ir::ValueId) -> Option<Meta> {
        self.0.get(v.node)?.get(v.output)?.clone()
    }
    fn tensor(&self, _: shardproof_ir::ValueId) -> Option<&Tensor> {
        None
    }
}

fn graph_report(
    role: &str,
    graph: &Graph,
    ops: &BTreeMap<String, OpMeaning>,
) -> Result<GraphReport, SourceError> {
    let inference = infer_graph(graph, ops);
    let io = |v: shardproof_ir::ValueId| Io {
        name: graph.value_name(v).to_string(),
        ty: graph.recorded_type(v).map(|t| t.to_string()),
    };
    let mut operators: BTreeMap<String, usize> = BTreeMap::new();
    let mut collectives: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut opaque: BTreeMap<String, usize> = BTreeMap::new();
    let mut mismatches = Vec::new();
    let mut failures = Vec::new();
    let mut checked = 0;
    let reg = Registry::builtin();
    for (i, node) in graph.nodes.iter().enumerate() {
        let NodeKind::Call { op, args, kwargs } = &node.kind else {
            continue;
        };
        *operators.entry(op.to_string()).or_default() += 1;
        if let Some(def) = reg.get(op).filter(|d| d.class == OpClass::Collective) {
            let metas = MetaOnly(&inference.metas);
            let group = Args::bind(&def.schema, args, kwargs, &metas)
                .and_then(|a| a.str("group_name"))
                .unwrap_or_else(|_| "?".to_string());
            *collectives.entry((group, op.name.clone())).or_default() += 1;
        }
        match &inference.nodes[i] {
            NodeInference::Opaque(o) => *opaque.entry(o.to_string()).or_default() += 1,
            NodeInference::Error(e) => failures.push(InferenceFailure {
                node: node.name.clone(),
                line: node.line,
                op: op.to_string(),
                error: e.clone(),
            }),
            NodeInference::Inferred(ms) => {
                for (o, out) in node.outputs.iter().enumerate() {
                    let (Some(rec), Some(inf)) = (&out.ty, ms.get(o)) else {
                        continue;
                    };
                    checked += 1;
                    let inferred = inf.to_type();
                    if *rec != inferred {
                        mismatches.push(ShapeMismatch {
                            node: out.name.clone(),
                            line: node.line,
                            op: op.to_string(),
                            recorded: rec.to_string(),
                            inferred: inferred.to_string(),
                        });
                    }
                }
            }
            NodeInference::Leaf => {}
        }
    }
    let mut operators: Vec<(String, usize)> = operators.into_iter().collect();
    operators.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    Ok(GraphReport {
        role: role.to_string(),
        path: graph
            .path
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| graph.name.clone()),
        lines: line_coverage(graph)?,
        nodes: graph.nodes.len(),
        inputs: graph.inputs.iter().map(|&v| io(v)).collect(),
        outputs: graph
            .outputs
            .iter()
            .map(|o| match o {
                Some(v) => io(*v),
                None => Io {
                    name: "None".into(),
                    ty: None,
                },
            })
            .collect(),
        operators,
        collectives: collectives
            .into_iter()
            .map(|((group, op), count)| Collective { group, op, count })
            .collect(),
        opaque: opaque.into_iter().collect(),
        shapes_checked: checked,
        shape_mismatches: mismatches,
        inference_failures: failures,
    })
}

fn list<T>(items: &[T], max: usize, f: impl Fn(&T) -> String) -> String {
    let mut parts: Vec<String> = items.iter().take(max).map(f).collect();
    if items.len() > max {
        parts.push(format!("... ({} more)", items.len() - max));
    }
    parts.join(", ")
}

fn print_text(report: &Report, strict: bool) {
    outln!("{}", report.path);
    for g in &report.graphs {
        outln!("\n{}: {} ({} nodes)", g.role, g.path, g.nodes);
        if let Some(l) = &g.lines {
            outln!(
                "  lines: {} total, {} parsed, {} ignored, {} unparsed",
                l.total,
                l.parsed,
                l.ignored,
                l.unparsed.len()
            );
            for u in &l.unparsed {
                outln!("    line {}: {}", u.line, u.text);
            }
        }
        let io = |x: &Io| match &x.ty {
            Some(t) => format!("{}: {t}", x.name),
            None => x.name.clone(),
        };
        outln!("  inputs ({}): {}", g.inputs.len(), list(&g.inputs, 8, io));
        outln!(
            "  outputs ({}): {}",
            g.outputs.len(),
            list(&g.outputs, 8, io)
        );
        outln!(
            "  operators ({} {}): {}",
            g.operators.len(),
            if g.operators.len() == 1 {
                "kind"
            } else {
                "kinds"
            },
            list(&g.operators, 12, |(o, c)| format!("{o} x{c}"))
        );
        if g.collectives.is_empty() {
            outln!("  collectives: none");
        } else {
            outln!(
                "  collectives: {}",
                list(&g.collectives, 20, |c| format!(
                    "{} on group \"{}\" x{}",
                    c.op, c.group, c.count
                ))
            );
        }
        if g.opaque.is_empty() {
            outln!("  opaque operators: none");
        } else {
            outln!(
                "  opaque operators: {}",
                list(&g.opaque, 20, |(o, c)| format!("{o} x{c}"))
            );
        }
        outln!(
            "  shape check: {} values checked, {} mismatches, {} inference errors",
            g.shapes_checked,
            g.shape_mismatches.len(),
            g.inference_failures.len()
        );
        for m in &g.shape_mismatches {
            outln!(
                "    line {}: {} ({}): recorded {}, inferred {}",
                m.line.map_or("?".into(), |l| l.to_string()),
                m.node,
                m.op,
                m.recorded,
                m.inferred
            );
        }
        for f in &g.inference_failures {
            outln!(
                "    line {}: {} ({}): {}",
                f.line.map_or("?".into(), |l| l.to_string()),
                f.node,
                f.op,
                f.error
            );
        }
    }
    outln!();
    if report.clean {
        outln!("clean: every line parsed, no opaque operator, every shape agrees");
    } else if strict {
        outln!("not clean (--strict): see the unparsed lines, opaque operators and shape problems above");
    } else {
        outln!("not clean: see the unparsed lines, opaque operators and shape problems above");
    }
}
