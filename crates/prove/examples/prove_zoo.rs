//! Emits a zoo plan and proves it, printing the verdict, the deciding layers and figures.
//!
//! ```text
//! cargo run -p shardproof-prove --example prove_zoo -- mlp tp=2 [--bug ID] [--full] [--hidden N] [--layers N] [--no-z3]
//! ```

use shardproof_prove::{prove_case, ProveConfig};
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
    if let Some(h) = flag("--hidden") {
        mlp.hidden = h.parse().expect("--hidden N");
        mlp.ffn = 2 * mlp.hidden;
    }
    if let Some(l) = flag("--layers") {
        mlp.layers = l.parse().expect("--layers N");
    }
    let opts = EmitOptions {
        model,
        mlp,
        llama: LlamaConfig::default(),
        mesh: Mesh::parse(&mesh).expect("mesh"),
        bug: flag("--bug").map(|b| find_bug(&b).expect("a catalog bug")),
        forward_only: !args.iter().any(|a| a == "--full"),
        vocab_parallel: false,
    };
    let dir = tempfile::tempdir().expect("temp dir");
    shardproof_zoo::emit_to_dir(
        &opts,
        &EmitExtras::default(),
        &TrainOptions::default(),
        &PipelineOptions::default(),
        dir.path(),
    )
    .expect("emit");
    let case = shardproof_case::load_case(&dir.path().join("case.yaml")).expect("case");
    let started = Instant::now();
    let mut cfg = ProveConfig::default();
    if args.iter().any(|a| a == "--no-z3") {
        cfg.decide.z3_timeout = None;
    }
    let proof = prove_case(&case, &cfg);
    let secs = started.elapsed().as_secs_f64();
    println!("{}", serde_json::to_string_pretty(&proof).expect("json"));
    println!("verdict {:?} in {secs:.3} s", proof.verdict);
}
