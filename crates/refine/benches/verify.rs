//! Refinement benchmark: times `verify` on the ../shared samples and on zoo cases (MLP, Llama,
//! GPT-2 and DeepSeek, forward-only and full iteration, degrees 2-8, 1-8 layers, pipelines, the
//! three models' ring-attention full iterations under cp=2, dp=2 x cp=2, tp=2 x cp=2 and
//! dp=2 x tp=2 x cp=2, llama's under cp=2 with an irrational softmax scale, deepseek's forward
//! on 16 ranks, dp=2 x cp=2 x tp=2 x ep=2) and prints one
//! line per case. Run with `cargo bench -p shardproof-refine --bench verify` (release build);
//! set `SHARDPROOF_SHARED` to the shared folder to include the samples (default `../shared`).
//!
//! A word after `--` keeps only the cases whose label contains it
//! (`cargo bench -p shardproof-refine --bench verify -- megatron`).
//!
//! Figures are printed, never asserted: timings depend on the machine.

use shardproof_case::{load_case, Case};
use shardproof_refine::{verify, Options, Verdict};
use shardproof_zoo::{
    emit_to_dir, EmitExtras, EmitOptions, LlamaConfig, Mesh, MlpConfig, PipelineOptions,
    TrainOptions,
};
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

/// The label filter: the first argument that is not a flag (cargo passes `--bench`).
fn selected(label: &str) -> bool {
    std::env::args()
        .skip(1)
        .find(|a| !a.starts_with("--"))
        .is_none_or(|word| label.contains(&word))
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

/// A zoo case to time: label, options, extras, pipeline options.
type ZooCase = (String, EmitOptions, EmitExtras, PipelineOptions);

fn zoo_case(dir: &Path, (_, opts, extras, pipeline): &ZooCase) -> Option<Case> {
    emit_to_dir(opts, extras, &TrainOptions::PLAIN, pipeline, dir).ok()?;
    load_case(&dir.join("case.yaml")).ok()
}

/// Options for `model` on `mesh`, everything else at its default.
fn options(model: &str, mesh: &str, layers: usize, forward_only: bool) -> EmitOptions {
    EmitOptions {
        model: model.into(),
        mlp: MlpConfig {
            layers,
            ..MlpConfig::default()
        },
        llama: LlamaConfig {
            layers,
            ..LlamaConfig::default()
        },
        mesh: Mesh::parse(mesh).expect("mesh"),
        bug: None,
        forward_only,
        vocab_parallel: false,
    }
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
            _ if !selected("megatron") => {}
            Ok(c) => run("megatron gpt tp2+sp+vp (case-tp2 + constants)", &c, 5),
            Err(e) => println!("megatron gpt: {e}"),
        }
        match load_case(&samples.join("case-bug-tp2.yaml")) {
            _ if !selected("megatron") => {}
            Ok(c) => run("megatron missing all-reduce (case-bug-tp2)", &c, 5),
            Err(e) => println!("megatron bug: {e}"),
        }
    } else {
        println!("(../shared/samples not found: set SHARDPROOF_SHARED to include the samples)");
    }
    let mut cases: Vec<ZooCase> = Vec::new();
    let plain = |label: String, opts: EmitOptions| {
        (
            label,
            opts,
            EmitExtras::default(),
            PipelineOptions::default(),
        )
    };
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
            cases.push(plain(
                format!("zoo mlp {mesh} layers={layers} {pass}"),
                options("mlp", mesh, layers, forward_only),
            ));
        }
        for (mesh, layers) in [("tp=2", 1), ("tp=2", 2), ("tp=4", 2), ("tp=2", 4)] {
            cases.push(plain(
                format!("zoo llama {mesh} layers={layers} {pass}"),
                options("llama", mesh, layers, forward_only),
            ));
        }
        for (mesh, sp) in [("tp=2", false), ("dp=2,tp=2", true)] {
            let extras = EmitExtras {
                sequence_parallel: sp,
                ..EmitExtras::default()
            };
            let sp = if sp { "+sp" } else { "" };
            cases.push((
                format!("zoo gpt2 {mesh}{sp} {pass}"),
                options("gpt2", mesh, 2, forward_only),
                extras,
                PipelineOptions::default(),
            ));
        }
        for (model, mesh) in [("mlp", "pp=2,dp=2,tp=2"), ("llama", "pp=2")] {
            cases.push((
                format!("zoo {model} {mesh} layers=2 mb=2 {pass}"),
                options(model, mesh, 2, forward_only),
                EmitExtras::default(),
                PipelineOptions {
                    microbatches: 2,
                    ..PipelineOptions::default()
                },
            ));
        }
    }
    for mesh in ["tp=2", "ep=2"] {
        cases.push(plain(
            format!("zoo deepseek {mesh} fw"),
            options("deepseek", mesh, 2, true),
        ));
    }
    // Ring attention's full iterations take half a minute to a minute each: timed once.
    let mut slow: Vec<ZooCase> = Vec::new();
    for model in ["llama", "gpt2", "deepseek"] {
        slow.push(plain(
            format!("zoo {model} cp=2 full (1 run)"),
            options(model, "cp=2", 2, false),
        ));
    }
    // dp x cp and tp x cp: the softmax backward inferred piece by piece along the batch, or
    // along the heads; cp x ep: the experts' gradients through layouts of the ranks' products;
    // dp x tp x cp: along the batch, each batch row along its heads, and (llama) the
    // query gradient through the layout chains over the ring's key blocks; dp x cp x ep: eight
    // ranks' expressions under the size bound per rank.
    for (model, mesh) in [
        ("deepseek", "cp=2,ep=2"),
        ("deepseek", "dp=2,cp=2,ep=2"),
        ("deepseek", "dp=2,tp=2,cp=2"),
        ("gpt2", "dp=2,tp=2,cp=2"),
        ("llama", "dp=2,tp=2,cp=2"),
        ("llama", "dp=2,cp=2"),
        ("deepseek", "dp=2,cp=2"),
        ("gpt2", "dp=2,cp=2"),
        ("llama", "tp=2,cp=2"),
        ("gpt2", "tp=2,cp=2"),
        ("deepseek", "tp=2,cp=2"),
    ] {
        slow.push(plain(
            format!("zoo {model} {mesh} full (1 run)"),
            options(model, mesh, 2, false),
        ));
    }
    // tp x cp x ep, one layer: the experts' gradient in ep's pairs of tp partials (the copies
    // of the expanded gradient regrouped per rank) and the gate gradient's per-token sums over
    // the cp chunks of the ranks' sums.
    slow.push(plain(
        "zoo deepseek cp=2,tp=2,ep=2 layers=1 full (1 run)".into(),
        options("deepseek", "cp=2,tp=2,ep=2", 1, false),
    ));
    // 16 ranks, forward: the chunks of one relation named on ranks of one tp group (the
    // extraction's tie-break) and the loss's 0-d chain retried with twice the node limit.
    slow.push(plain(
        "zoo deepseek dp=2,cp=2,tp=2,ep=2 fw (1 run)".into(),
        options("deepseek", "dp=2,cp=2,tp=2,ep=2", 2, true),
    ));
    // 16 ranks, full iteration, one layer: the MoE backward's product relates in the retry
    // that brings each round's element moves in with it (the ranks' gathered routing weights,
    // unsqueezed and expanded, in one round).
    slow.push(plain(
        "zoo deepseek dp=2,cp=2,tp=2,ep=2 layers=1 full (1 run)".into(),
        options("deepseek", "dp=2,cp=2,tp=2,ep=2", 1, false),
    ));
    // A softmax scale that is no integer's inverse: head dim 8, 1/sqrt(8).
    let mut head_dim_8 = options("llama", "cp=2", 1, false);
    head_dim_8.llama = LlamaConfig {
        hidden: 16,
        heads: 2,
        kv_heads: 1,
        ..head_dim_8.llama
    };
    slow.push(plain(
        "zoo llama cp=2 hd=8 layers=1 full (1 run)".into(),
        head_dim_8,
    ));
    for (list, repeats) in [(&cases, 3), (&slow, 1)] {
        for case in list.iter().filter(|c| selected(&c.0)) {
            let label = &case.0;
            let tmp = tempfile::tempdir().expect("temp dir");
            match zoo_case(tmp.path(), case) {
                Some(c) => run(label, &c, repeats),
                None => println!("{label:<44} (not emitted: the sizes do not split)"),
            }
        }
    }
}
