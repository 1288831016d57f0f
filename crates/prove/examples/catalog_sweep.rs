//! The prover over the zoo's bug catalog: every bug whose plan needs no extra emit option,
//! on every model it is defined for, at the zoo's tiny sizes on a 2-way mesh of the
//! parallelism it needs. Prints, per case, the verdict (refuted with a counterexample the
//! interpreter confirmed is the expected one), whether shape reduction applied, and the time;
//! then the totals. A plan the reduction refuses (send/recv, top-k) is proved at full size.
//!
//! ```text
//! cargo run --release -p shardproof-prove --example catalog_sweep -- [MODEL ...] [--time-limit S]
//! ```

use shardproof_prove::{prove_case_or_full_size, ProveConfig, Verdict};
use shardproof_zoo::{
    emit_to_dir, EmitExtras, EmitOptions, LlamaConfig, Mesh, MlpConfig, PipelineOptions,
    TrainOptions, BUGS,
};
use std::time::{Duration, Instant};

/// The 2-way mesh a catalog parallelism names, or `None` when it needs another emit option.
fn mesh_of(parallelism: &str) -> Option<&'static str> {
    let plain = parallelism.trim_end_matches(" (full iteration)");
    Some(match plain {
        "tp" => "tp=2",
        "dp" => "dp=2",
        "dp x tp" => "dp=2,tp=2",
        "cp" => "cp=2",
        "pp" => "pp=2",
        "ep" => "ep=2",
        "tp x cp" => "tp=2,cp=2",
        _ => return None,
    })
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let limit = args
        .iter()
        .position(|a| a == "--time-limit")
        .and_then(|i| args.get(i + 1))
        .map_or(120.0, |s| s.parse().expect("--time-limit SECONDS"));
    let models: Vec<&str> = args
        .iter()
        .enumerate()
        .filter(|(i, a)| !a.starts_with("--") && (*i == 0 || args[i - 1] != "--time-limit"))
        .map(|(_, a)| a.as_str())
        .collect();
    let (mut refuted, mut other, mut skipped) = (0, 0, 0);
    let all = Instant::now();
    for bug in BUGS {
        let Some(mesh) = mesh_of(bug.parallelism) else {
            skipped += bug.models.len();
            continue;
        };
        for &model in bug.models {
            if !models.is_empty() && !models.contains(&model) {
                continue;
            }
            // A pipeline needs a layer per stage.
            let layers = if mesh.contains("pp") { 2 } else { 1 };
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
                bug: Some(bug),
                forward_only: !bug.needs_backward,
                vocab_parallel: bug.needs_vocab_parallel,
            };
            let dir = tempfile::tempdir().expect("a temporary directory");
            let pipeline = PipelineOptions {
                microbatches: if mesh.contains("pp") { 2 } else { 1 },
                ..PipelineOptions::default()
            };
            if let Err(e) = emit_to_dir(
                &opts,
                &EmitExtras::default(),
                &TrainOptions::default(),
                &pipeline,
                dir.path(),
            ) {
                println!("{model} {mesh} {}: not emitted ({e})", bug.id);
                skipped += 1;
                continue;
            }
            let case = shardproof_case::load_case(&dir.path().join("case.yaml")).expect("case");
            let started = Instant::now();
            let cfg = ProveConfig {
                time_limit: Some(Duration::from_secs_f64(limit)),
                started: Some(started),
                ..ProveConfig::default()
            };
            let (proof, full_size) = prove_case_or_full_size(&case, &cfg);
            let how = if full_size { "full size" } else { "reduced" };
            let confirmed = proof.counterexample.is_some();
            match proof.verdict {
                Verdict::Refuted if confirmed => refuted += 1,
                _ => other += 1,
            }
            println!(
                "{model} {mesh} {}: {:?}{} ({how}, {:.1} s){}",
                bug.id,
                proof.verdict,
                if confirmed {
                    " with a counterexample"
                } else {
                    ""
                },
                started.elapsed().as_secs_f64(),
                match proof.verdict {
                    Verdict::Refuted => String::new(),
                    _ => format!(": {}", proof.message.as_deref().unwrap_or("")),
                }
            );
        }
    }
    println!(
        "{refuted} refuted with a confirmed counterexample, {other} not, {skipped} skipped (need other emit options); {:.1} s",
        all.elapsed().as_secs_f64()
    );
}
