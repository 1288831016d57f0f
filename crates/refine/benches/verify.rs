//! Refinement benchmark: times `verify` on the ../shared samples and on zoo cases (MLP and
//! Llama, forward-only and full iteration, degrees 2-8, 1-8 layers) and prints one line per
//! case. Run with `cargo bench -p shardproof-refine --bench verify` (release build); set
//! `SHARDPROOF_SHARED` to the shared folder to include the samples (default `../shared`).
//!
//! Figures are printed, never asserted: timings depend on the machine.

use shardproof_case::{load_case, Case};
use shardproof_refine::{verify, Options, Verdict};
use shardproof_zoo::{emit, EmitOptions, LlamaConfig, Mesh, MlpConfig};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The Megatron GPT sample needs the values of its four cross-entropy constants.
const GPT_CONSTANTS: &str =
    "constants:\n  _tensor_constant0: 0\n  _tensor_constant1: 0.0\n  _tensor_constant2: 0\n  _tensor_constant3: 0.0\n";

fn shared() -> Option<PathBuf> {
    let dir = std::env::var_os("SHARDPROOF_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared"));
    dir.join("samples/entangle").is_dir().then_some(dir)
}

fn run(label: &str, case: &Case, repeats: usize) {
    let mut best = f64::INFINITY;
    let mut verdict = Verdict::Inconclusive;
    let mut ops = 0;
    for _ in 0..repeats {
        let t = Instant::now();
        let o = verify(case, &Options::default());
        best = best.min(t.elapsed().as_secs_f64());
        verdict = o.verdict;
        ops = o.spec_operators;
    }
    println!(
        "{label:<44} {:>12} {ops:>6} ops {best:>9.3} s",
        format!("{verdict:?}").to_lowercase()
    );
}

fn zoo_case(dir: &Path, opts: &EmitOptions) -> Option<Case> {
    let emitted = emit(opts).ok()?;
    emitted.write(dir).ok()?;
    load_case(&dir.join("case.yaml")).ok()
}

fn main() {
    println!(
        "{:<44} {:>12} {:>10} {:>11}",
        "case", "verdict", "spec", "best time"
    );
    if let Some(shared) = shared() {
        let samples = shared.join("samples/entangle");
        let tmp = tempfile::tempdir().expect("temp dir");
        let text = std::fs::read_to_string(samples.join("case-tp2.yaml")).expect("sample case");
        let text = text.replace("gpt/", &format!("{}/", samples.join("gpt").display()));
        let gpt = tmp.path().join("gpt.yaml");
        std::fs::write(&gpt, text + GPT_CONSTANTS).expect("write case");
        match load_case(&gpt) {
            Ok(c) => run("megatron gpt tp2+sp+vp (case-tp2 + constants)", &c, 5),
            Err(e) => println!("megatron gpt: {e}"),
        }
        match load_case(&samples.join("case-bug-tp2.yaml")) {
            Ok(c) => run("megatron missing all-reduce (case-bug-tp2)", &c, 5),
            Err(e) => println!("megatron bug: {e}"),
        }
    } else {
        println!("(../shared/samples not found: set SHARDPROOF_SHARED to include the samples)");
    }
    let mut cases: Vec<(String, EmitOptions)> = Vec::new();
    for forward_only in [true, false] {
        let pass = if forward_only { "fw" } else { "full" };
        for (mesh, layers) in [
            ("tp=2", 1),
            ("tp=4", 1),
            ("tp=8", 1),
            ("dp=2,tp=2", 1),
            ("dp=2,tp=4", 2),
            ("tp=2", 4),
            ("tp=2", 8),
        ] {
            let mlp = MlpConfig {
                layers,
                ..MlpConfig::default()
            };
            cases.push((
                format!("zoo mlp {mesh} layers={layers} {pass}"),
                EmitOptions {
                    model: "mlp".into(),
                    mlp,
                    llama: LlamaConfig::default(),
                    mesh: Mesh::parse(mesh).expect("mesh"),
                    bug: None,
                    forward_only,
                    vocab_parallel: false,
                },
            ));
        }
        for (mesh, layers) in [("tp=2", 1), ("tp=2", 2), ("tp=4", 2), ("tp=2", 4)] {
            let llama = LlamaConfig {
                layers,
                ..LlamaConfig::default()
            };
            cases.push((
                format!("zoo llama {mesh} layers={layers} {pass}"),
                EmitOptions {
                    model: "llama".into(),
                    mlp: MlpConfig::default(),
                    llama,
                    mesh: Mesh::parse(mesh).expect("mesh"),
                    bug: None,
                    forward_only,
                    vocab_parallel: false,
                },
            ));
        }
    }
    for (label, opts) in &cases {
        let tmp = tempfile::tempdir().expect("temp dir");
        match zoo_case(tmp.path(), opts) {
            Some(c) => run(label, &c, 3),
            None => println!("{label:<44} (not emitted: the sizes do not split)"),
        }
    }
}
