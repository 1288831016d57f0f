//! The vocab-parallel cross-entropy stage of a tiny llama (issue 45): a one-layer llama forward
//! of width 4 (`2·tp` past tp = 2, a head per rank) with the vocab-parallel embedding and loss (the llama3-405b plan's loss, at
//! sizes where nothing needs reducing), cut at its layers, every stage proved, the loss stage's
//! report printed with its goals by layer.
//!
//! ```text
//! cargo run --release -p shardproof-prove --example prove_loss_stage -- \
//!     [--batch 1] [--seq 1] [--vocab 8] [--tp 2] [--z3 10] [--time-limit 600] [--bug ID] [--dir D]
//! ```
//!
//! Labels = batch x seq. Times are wall seconds of the proof; measure CPU seconds with
//! `/usr/bin/time -v` around the process.
//!
//! With `--preset NAME` (e.g. `llama3-405b`) the zoo preset's forward is emitted at real size
//! and cut as `prove_presets --forward` cuts it; only its loss stage is proved (through the
//! mesh reduction along dp and shape reduction, the vocabulary reduced with the labels where
//! `reduce/vocab.rs`'s conditions hold), and the vocabulary's reduction is printed;
//! `--terms T` raises the terms one expression may hold.

#[path = "common/layer_cuts.rs"]
mod layer_cuts;
use layer_cuts::microbatch_cuts_at_modules;

use shardproof_prove::{prove_staged_with, PlanOptions, ProveConfig};
use shardproof_zoo::{
    emit_to_dir, find_bug, find_preset, EmitExtras, EmitOptions, LlamaConfig, Mesh, MlpConfig,
    PipelineOptions, TrainOptions,
};
use std::time::{Duration, Instant};

fn arg(args: &[String], name: &str, default: f64) -> f64 {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map_or(default, |s| {
            s.parse().unwrap_or_else(|_| panic!("{name} NUMBER"))
        })
}

/// The argument after `name`, if given.
fn text_arg<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

/// The process's peak resident set, in GB, where /proc tells it.
fn peak_gb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0 / 1024.0)
}

/// The loss stage of preset `name`'s forward at real size, proved alone.
fn preset_loss_stage(name: &str, limit: f64, terms: Option<usize>, dir: &std::path::Path) {
    let preset = find_preset(name).expect("a zoo preset");
    let (mut opts, extras, pipeline) = preset.request();
    opts.forward_only = true;
    let started = Instant::now();
    emit_to_dir(&opts, &extras, &TrainOptions::PLAIN, &pipeline, dir).expect("emit");
    let emitted = started.elapsed().as_secs_f64();
    let cuts = layer_cuts::cut_at_layers(dir);
    let microbatch_cuts = microbatch_cuts_at_modules(dir, false);
    let case = shardproof_case::load_case(&dir.join("case.yaml")).expect("case");
    let plan_opts = PlanOptions {
        microbatch_cuts,
        ..PlanOptions::default()
    };
    let planning = Instant::now();
    let plan = shardproof_prove::stage::plan_with(&case, false, &plan_opts).expect("a plan");
    let planned = planning.elapsed().as_secs_f64();
    let stage = plan
        .stages
        .iter()
        .find(|s| s.target == "output `loss`")
        .expect("a loss stage");
    println!(
        "{name} forward: emitted in {emitted:.1} s, {cuts} layer cuts, planned in {planned:.1} s: {} stages; the loss stage assumes {:?}",
        plan.stages.len(),
        stage.assumes
    );
    // What the prover reduces: the mesh reduction along dp first, then shape reduction.
    let meshed = shardproof_prove::reduce::mesh::reduce_mesh(&stage.case)
        .and_then(|m| m.ok())
        .map(|m| m.case);
    match shardproof_prove::reduce::reduce_case(meshed.as_ref().unwrap_or(&stage.case)) {
        Ok(r) => {
            for v in &r.vocabulary {
                println!("  vocabulary: {v:?}");
            }
            for (input, full, reduced) in &r.inputs {
                println!("  input {input}: {full:?} -> {reduced:?}");
            }
        }
        Err(e) => println!("  shape reduction refused: {e:?}"),
    }
    let mut cfg = ProveConfig {
        time_limit: Some(Duration::from_secs_f64(limit)),
        ..ProveConfig::default()
    };
    if let Some(t) = terms {
        cfg.budget.terms_per_expr = t;
    }
    let proving = Instant::now();
    let proof = shardproof_prove::prove_case(&stage.case, &cfg);
    let json = serde_json::to_value(&proof).unwrap_or_default();
    println!(
        "  loss stage: {:?} in {:.1} s, goals by layer {}, elements {} -> {}, peak {:.2} GB{}",
        proof.verdict,
        proving.elapsed().as_secs_f64(),
        json["layers"],
        json["reduction"]["elements_before"],
        json["reduction"]["elements_after"],
        peak_gb().unwrap_or(0.0),
        proof
            .message
            .as_deref()
            .map(|m| format!("\n  {m}"))
            .unwrap_or_default()
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(name) = text_arg(&args, "--preset") {
        let limit = arg(&args, "--time-limit", 600.0);
        let temp = tempfile::tempdir().expect("a temporary directory");
        // `--terms T`: the terms one expression may hold (the prover's default: 20,000).
        let terms = text_arg(&args, "--terms").map(|t| t.parse().expect("--terms NUMBER"));
        preset_loss_stage(name, limit, terms, temp.path());
        return;
    }
    let batch = arg(&args, "--batch", 1.0) as usize;
    let seq = arg(&args, "--seq", 1.0) as usize;
    let vocab = arg(&args, "--vocab", 8.0) as usize;
    let tp = arg(&args, "--tp", 2.0) as usize;
    let z3 = arg(&args, "--z3", 10.0);
    let limit = arg(&args, "--time-limit", 600.0);
    let bug = args
        .iter()
        .position(|a| a == "--bug")
        .and_then(|i| args.get(i + 1))
        .map(|b| find_bug(b).expect("a catalog bug id"));
    let opts = EmitOptions {
        model: "llama".into(),
        mlp: MlpConfig::default(),
        // Width 4 and two heads, as the staged tests; more heads (and width) where tp needs them.
        llama: LlamaConfig {
            hidden: 2 * tp.max(2),
            heads: tp.max(2),
            kv_heads: tp.max(2),
            ffn: 2 * tp.max(2),
            layers: 1,
            seq,
            batch,
            vocab,
            ..LlamaConfig::default()
        },
        mesh: Mesh::parse(&format!("tp={tp}")).expect("a mesh"),
        bug,
        forward_only: true,
        vocab_parallel: true,
    };
    let temp = tempfile::tempdir().expect("a temporary directory");
    // `--dir D` emits into D (kept afterwards, to read the graphs).
    let kept = args
        .iter()
        .position(|a| a == "--dir")
        .and_then(|i| args.get(i + 1))
        .map(std::path::PathBuf::from);
    if let Some(d) = &kept {
        std::fs::create_dir_all(d).expect("--dir");
    }
    let dir = kept.as_deref().unwrap_or(temp.path());
    emit_to_dir(
        &opts,
        &EmitExtras::default(),
        &TrainOptions::PLAIN,
        &PipelineOptions::default(),
        dir,
    )
    .expect("emit");
    let cuts = layer_cuts::cut_at_layers(dir);
    let case = shardproof_case::load_case(&dir.join("case.yaml")).expect("case");
    let mut cfg = ProveConfig {
        time_limit: Some(Duration::from_secs_f64(limit)),
        ..ProveConfig::default()
    };
    cfg.decide.z3_timeout = (z3 > 0.0).then(|| Duration::from_secs_f64(z3));
    let started = Instant::now();
    let proof = prove_staged_with(&case, &cfg, 1, &PlanOptions::default());
    let secs = started.elapsed().as_secs_f64();
    println!(
        "llama width {}, tp={tp}, vocab {vocab}, {} labels ({batch} x {seq}), cut at {cuts} layer outputs: {:?} in {secs:.1} s, {} stages{}",
        opts.llama.hidden,
        batch * seq,
        proof.verdict,
        proof.stages.len(),
        proof
            .message
            .as_deref()
            .map(|m| format!("\n  {m}"))
            .unwrap_or_default()
    );
    for p in &proof.proofs {
        let q = &p.proof;
        println!(
            "  stage {} ({}): {}, goals {}",
            p.stage, proof.stages[p.stage].target, q["verdict"], q["layers"]
        );
        if let Some(m) = q["message"].as_str() {
            println!("    {m}");
        }
    }
}
