//! The prover over the zoo's correct plans: every model on every 2-way mesh it can be emitted
//! on, forward and full iteration, at the zoo's tiny sizes. Prints, per case, the verdict
//! (proved is the expected one), whether shape reduction applied, the deciding layers and the
//! time; then the totals and the cases not proved. A plan the reduction refuses (send/recv,
//! top-k) is proved at full size, as `verify`'s hand-off does.
//!
//! A full iteration on tp, dp x tp or tp x cp that splits MoE experts' inner width over tp is
//! cut into stages at every module output and input gradient the zoo's lineage names
//! (attention and MoE blocks; on a dp or cp mesh each input gradient is a scaled cut: a rank
//! holds the replica count times the spec's tokens; on cp every cut holds of the load-balanced
//! sequence chunks) and proved stage by stage (TrainVerify's Algorithm 2, every cut
//! proved as its own stage): whole, its goals repeat the experts' products in other groupings
//! far past the term budgets. Its stages are shape-reduced (the router's topk, scatter and
//! gather keep their experts and k); where that leaves it undecided, it is proved again at
//! full size within what is left of the time limit.
//!
//! ```text
//! cargo run -p shardproof-prove --example zoo_sweep -- [MODEL ...] [--forward | --full] [--mesh M] [--time-limit S] [--outputs-apart]
//! ```

#[path = "common/layer_cuts.rs"]
mod layer_cuts;
use shardproof_prove::{
    prove_case_or_full_size, prove_staged_with, PlanOptions, ProveConfig, Verdict,
};
use shardproof_zoo::{
    emit_to_dir, EmitExtras, EmitOptions, LlamaConfig, Mesh, MlpConfig, PipelineOptions,
    TrainOptions, MODELS,
};
use std::time::{Duration, Instant};

/// The 2-way meshes of every parallelism the zoo emits, and their combinations with tp.
const MESHES: &[&str] = &[
    "tp=2",
    "dp=2",
    "dp=2,tp=2",
    "cp=2",
    "tp=2,cp=2",
    "pp=2",
    "ep=2",
];

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
    };
    let limit = flag("--time-limit").map_or(120.0, |s| s.parse().expect("--time-limit SECONDS"));
    let only_mesh = flag("--mesh");
    // One stage per expected output of a cut full iteration (`PlanOptions::outputs_apart`).
    let apart = args.iter().any(|a| a == "--outputs-apart");
    let models: Vec<&str> = args
        .iter()
        .enumerate()
        .filter(|(i, a)| {
            !a.starts_with("--")
                && (*i == 0 || !matches!(args[i - 1].as_str(), "--time-limit" | "--mesh"))
        })
        .map(|(_, a)| a.as_str())
        .collect();
    let phases: &[bool] = if args.iter().any(|a| a == "--forward") {
        &[true]
    } else if args.iter().any(|a| a == "--full") {
        &[false]
    } else {
        &[true, false]
    };
    let (mut proved, mut skipped) = (0, 0);
    let mut not_proved = Vec::new();
    let all = Instant::now();
    for &(model, _) in MODELS {
        if !models.is_empty() && !models.contains(&model) {
            continue;
        }
        for &mesh in MESHES {
            if only_mesh.is_some_and(|m| m != mesh) {
                continue;
            }
            for &forward_only in phases {
                let phase = if forward_only { "forward" } else { "full" };
                // A pipeline needs a layer per stage and is run with two microbatches.
                let pp = mesh.contains("pp");
                let layers = if pp { 2 } else { 1 };
                let opts = EmitOptions {
                    model: model.into(),
                    mlp: MlpConfig {
                        hidden: 8,
                        ffn: 16,
                        batch: 4,
                        layers,
                        ..MlpConfig::default()
                    },
                    llama: LlamaConfig {
                        layers: layers.max(LlamaConfig::default().layers),
                        ..LlamaConfig::default()
                    },
                    mesh: Mesh::parse(mesh).expect("mesh"),
                    bug: None,
                    forward_only,
                    vocab_parallel: false,
                };
                let pipeline = PipelineOptions {
                    microbatches: if pp { 2 } else { 1 },
                    ..PipelineOptions::default()
                };
                let dir = tempfile::tempdir().expect("a temporary directory");
                if let Err(e) = emit_to_dir(
                    &opts,
                    &EmitExtras::default(),
                    &TrainOptions::default(),
                    &pipeline,
                    dir.path(),
                ) {
                    println!("{model} {mesh} {phase}: not emitted ({e})");
                    skipped += 1;
                    continue;
                }
                // Only tp, dp and cp: the cuts are laid out as the residual stream there (on
                // cp its load-balanced sequence chunks, an order the plan is given).
                let moe_tp = !forward_only
                    && mesh.contains("tp")
                    && mesh.split(',').all(|d| {
                        d.starts_with("tp=") || d.starts_with("dp=") || d.starts_with("cp=")
                    })
                    && has_moe(dir.path());
                let (cuts, chunked) = if !moe_tp {
                    (0, Default::default())
                } else if mesh.contains("cp") {
                    layer_cuts::cut_at_modules_load_balanced(dir.path(), true)
                } else {
                    (
                        layer_cuts::cut_at_modules(dir.path(), true),
                        Default::default(),
                    )
                };
                let scales = layer_cuts::backward_scales(dir.path());
                let case = shardproof_case::load_case(&dir.path().join("case.yaml")).expect("case");
                let started = Instant::now();
                let cfg = ProveConfig {
                    time_limit: Some(Duration::from_secs_f64(limit)),
                    started: Some(started),
                    ..ProveConfig::default()
                };
                let (verdict, layers, message, how) = if cuts > 0 {
                    // Each stage shape-reduced (the router's topk, scatter and gather keep
                    // their experts and k); where that leaves the plan unproved, once more at
                    // full size on the same clock, as `prove_case_or_full_size` does.
                    let opts = PlanOptions {
                        scales,
                        chunked,
                        outputs_apart: apart,
                        ..PlanOptions::default()
                    };
                    let p = prove_staged_with(&case, &cfg, 1, &opts);
                    let timed_out = started.elapsed().as_secs_f64() >= limit;
                    if p.verdict == Verdict::Inconclusive && !timed_out {
                        let full = ProveConfig {
                            reduce: false,
                            ..cfg
                        };
                        let q = prove_staged_with(&case, &full, 1, &opts);
                        let how = format!(
                            "full size after reduced stages undecided ({}), {} stages at {cuts} cuts",
                            p.message.as_deref().unwrap_or(""),
                            q.stages.len()
                        );
                        (q.verdict, q.layers, q.message, how)
                    } else {
                        let how = format!("reduced, {} stages at {cuts} cuts", p.stages.len());
                        (p.verdict, p.layers, p.message, how)
                    }
                } else {
                    let (p, full_size) = prove_case_or_full_size(&case, &cfg);
                    let how = if full_size { "full size" } else { "reduced" };
                    (p.verdict, p.layers, p.message, how.to_string())
                };
                let secs = started.elapsed().as_secs_f64();
                let line = format!(
                    "{model} {mesh} {phase}: {verdict:?} ({how}, {layers:?}, {secs:.1} s){}",
                    match verdict {
                        Verdict::Proved => String::new(),
                        _ => format!(": {}", message.as_deref().unwrap_or("")),
                    }
                );
                println!("{line}");
                if verdict == Verdict::Proved {
                    proved += 1;
                } else {
                    not_proved.push(line);
                }
            }
        }
    }
    println!(
        "{proved} proved, {} not, {skipped} not emitted (the zoo refuses the mesh); {:.1} s",
        not_proved.len(),
        all.elapsed().as_secs_f64()
    );
    for line in &not_proved {
        println!("  not proved: {line}");
    }
}

/// Whether the emitted spec's lineage names an MoE block.
fn has_moe(dir: &std::path::Path) -> bool {
    layer_cuts::module_outputs(&dir.join("spec.py"), false)
        .keys()
        .any(|m| m.contains(".moe "))
}
