//! Emits a zoo plan and proves it, printing the verdict, the deciding layers and figures.
//!
//! ```text
//! cargo run --release -p shardproof-prove --example prove_zoo -- mlp tp=2 [--bug ID] [--full] [--hidden N] [--layers N] [--no-z3] [--no-reduce] [--dir D] [--seq N] [--batch N] [--vocab N] [--width N] [--stages] [--jobs N] [--microbatches M]
//! ```
//!
//! With `--stages` the case is cut at the embedding's and every decoder layer's output, read from the module
//! lineage the zoo writes into its graphs (`# Annotation: {'module': 'layers.3.mlp', 'output':
//! 'add_41'}`), the residual stream laid out as the zoo lays it out (batch-sharded on `dp`,
//! replicated elsewhere), and proved in stages with the memo on `--jobs` threads. Only the
//! forward's layer outputs are cut (`--full` adds the backward, which then lies in the last
//! stage).

#[path = "common/layer_cuts.rs"]
mod layer_cuts;
use layer_cuts::{cut_at_layers, microbatch_cuts_at_layers};
use shardproof_prove::{prove_case, prove_staged_with, PlanOptions, ProveConfig};
use shardproof_zoo::{
    find_bug, EmitExtras, EmitOptions, LlamaConfig, Mesh, MlpConfig, PipelineOptions, TrainOptions,
};
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let model = args.first().cloned().unwrap_or_else(|| "mlp".into());
    let mesh = args.get(1).cloned().unwrap_or_else(|| "tp=2".into());
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let mut mlp = MlpConfig {
        hidden: 8,
        ffn: 16,
        batch: 4,
        layers: 1,
        ..MlpConfig::default()
    };
    let mut llama = LlamaConfig::default();
    if let Some(h) = flag("--hidden") {
        mlp.hidden = h.parse().expect("--hidden N");
        mlp.ffn = 2 * mlp.hidden;
    }
    if let Some(l) = flag("--layers") {
        mlp.layers = l.parse().expect("--layers N");
        llama.layers = mlp.layers;
    }
    // The llama-family sizes (llama, gpt2, deepseek), to compare a plan at other sizes.
    for (name, slot) in [
        ("--seq", &mut llama.seq),
        ("--batch", &mut llama.batch),
        ("--vocab", &mut llama.vocab),
        ("--width", &mut llama.hidden),
    ] {
        if let Some(n) = flag(name) {
            *slot = n.parse().expect("a size");
        }
    }
    let mesh = Mesh::parse(&mesh).expect("mesh");
    let opts = EmitOptions {
        model,
        mlp,
        llama,
        mesh,
        bug: flag("--bug").map(|b| find_bug(&b).expect("a catalog bug")),
        forward_only: !args.iter().any(|a| a == "--full"),
        vocab_parallel: false,
    };
    let temp = tempfile::tempdir().expect("temp dir");
    // `--dir D` emits into D (kept afterwards, to read the graphs) instead of a temp dir.
    let kept_dir = flag("--dir").map(std::path::PathBuf::from);
    if let Some(d) = &kept_dir {
        std::fs::create_dir_all(d).expect("--dir");
    }
    let dir = kept_dir.unwrap_or_else(|| temp.path().to_path_buf());
    shardproof_zoo::emit_to_dir(
        &opts,
        &EmitExtras::default(),
        &TrainOptions::default(),
        &PipelineOptions {
            microbatches: flag("--microbatches")
                .map_or(1, |m| m.parse().expect("--microbatches M")),
            ..PipelineOptions::default()
        },
        dir.as_path(),
    )
    .expect("emit");
    let staged = args.iter().any(|a| a == "--stages");
    let mut plan = PlanOptions::default();
    if staged {
        let cuts = cut_at_layers(dir.as_path());
        plan.microbatch_cuts = microbatch_cuts_at_layers(dir.as_path());
        println!(
            "cut at {cuts} layer outputs and {} microbatched ones (zoo lineage)",
            plan.microbatch_cuts.len()
        );
    }
    let case = shardproof_case::load_case(&dir.as_path().join("case.yaml")).expect("case");
    let started = Instant::now();
    let mut cfg = ProveConfig::default();
    if args.iter().any(|a| a == "--no-z3") {
        cfg.decide.z3_timeout = None;
    }
    if args.iter().any(|a| a == "--no-reduce") {
        cfg.reduce = false;
    }
    if staged {
        let jobs = flag("--jobs").map_or(1, |j| j.parse().expect("--jobs N"));
        let proof = prove_staged_with(&case, &cfg, jobs, &plan);
        let secs = started.elapsed().as_secs_f64();
        if args.iter().any(|a| a == "--json") {
            println!("{}", serde_json::to_string_pretty(&proof).expect("json"));
        }
        for s in &proof.stages {
            println!(
                "stage {} {}: {:?} ({}; {} spec + {} rank nodes)",
                s.index,
                s.target,
                s.verdict,
                if s.memo_hit {
                    format!("memo hit of stage {}", s.proved_by)
                } else {
                    format!("{:?}", s.layers)
                },
                s.spec_nodes,
                s.rank_nodes
            );
        }
        if let Some(m) = &proof.message {
            println!("{m}");
        }
        println!(
            "verdict {:?} in {secs:.3} s: {} stages, {} proved, {} memo hits, jobs {jobs}",
            proof.verdict,
            proof.stages.len(),
            proof.distinct_stages,
            proof.memo_hits
        );
        return;
    }
    let proof = prove_case(&case, &cfg);
    let secs = started.elapsed().as_secs_f64();
    println!("{}", serde_json::to_string_pretty(&proof).expect("json"));
    println!("verdict {:?} in {secs:.3} s", proof.verdict);
}
