//! `trace emit` of zoo cases with module outputs (item 6 of issue 46): the zoo's graphs
//! annotate their modules as torch.fx prints `torch.fx.traceback.annotate`, so the traces of
//! the interpreter's runs hold every layer's output (and, without data parallelism, its
//! input gradient) besides the case's inputs and outputs. Every correct plan holds; every
//! catalog bug with a numeric effect is violated, and the first tensor that is not within
//! tolerance in execution order (a divergence, disagreeing replicas, or pieces that do not
//! tile) is the module the bug is planted in, or the first tensor it reaches when it is not
//! inside a module (a loss scaling, a gradient reduction, an optimizer step).
//!
//! A few entries run in the default suite; `heavy::` runs the whole catalog.

mod common;

use common::Scratch;
use shardproof_zoo::BUGS;

/// Every catalog bug with a numeric effect: the plan it is planted in (2 layers), and the
/// module of the first tensor in execution order that is not within tolerance (float32
/// traces). An empty module: the ranks' run deadlocks, a violation before any trace.
const CATALOG: &[(&str, &str, &str)] = &[
    ("tp-missing-allreduce", "mlp --mesh tp=2", "layers.0"),
    ("tp-bias-before-allreduce", "mlp --mesh tp=2", "layers.0"),
    ("dp-loss-not-averaged", "mlp --mesh dp=2", "loss"),
    ("dp-grad-not-averaged", "mlp --mesh dp=2", "w1_0"),
    ("wrong-group", "mlp --mesh dp=2,tp=2", "layers.0"),
    (
        "llama-oproj-missing-allreduce",
        "llama --mesh tp=2",
        "layers.0.attention",
    ),
    (
        "llama-attn-scale-local",
        "llama --mesh tp=2",
        "layers.0.attention",
    ),
    (
        "llama-qkv-grad-missing-allreduce",
        "llama --mesh tp=2",
        "layers.0.attention",
    ),
    ("llama-kv-grad-unsynced", "llama --mesh tp=4", "wk_0"),
    (
        "llama-vocab-embedding-unmasked",
        "llama --mesh tp=2 --vocab-parallel",
        "embedding",
    ),
    (
        "sp-layernorm-grad-not-reduced",
        "gpt2 --mesh tp=2 --sequence-parallel",
        "ln1_w_0",
    ),
    (
        "sp-scatter-wrong-chunk",
        "gpt2 --mesh tp=2 --sequence-parallel",
        "layers.0",
    ),
    (
        "grad-accum-loss-not-scaled",
        "mlp --mesh tp=2 --grad-accum 2",
        "loss",
    ),
    (
        "zero-param-update-skipped",
        "mlp --mesh dp=2 --zero 1",
        "w1_0",
    ),
    (
        "grad-norm-replicated-overcounted",
        "mlp --mesh tp=2 --clip-grad 0.5",
        "w1_0",
    ),
    (
        "loss-scale-not-unscaled",
        "mlp --mesh tp=2 --loss-scale 1024",
        "w1_0",
    ),
    (
        "moe-aux-loss-not-divided-by-tp",
        "deepseek --mesh tp=2",
        "loss",
    ),
    (
        "moe-router-grad-unsynced",
        "deepseek --mesh tp=2",
        "router_0",
    ),
    (
        "ep-expert-grad-not-averaged",
        "deepseek --mesh ep=2",
        "expert_gate_0",
    ),
    (
        "pp-grad-sync-before-last-microbatch",
        "mlp --mesh dp=2,pp=2 --microbatches 2",
        "w1_0",
    ),
    (
        "pp-shuffled-microbatches",
        "mlp --mesh pp=2 --microbatches 2",
        "loss",
    ),
    ("pp-wrong-stage-division", "mlp --mesh pp=2", "layers.0"),
    ("pp-mismatched-send-recv", "mlp --mesh pp=2", ""),
    (
        "norm-sharded-hidden",
        "deepseek --mesh tp=2",
        "layers.0.moe",
    ),
    (
        "sp-pad-slice-mismatch",
        "gpt2 --mesh tp=2 --sequence-parallel",
        "layers.0",
    ),
    ("dangling-backward-tensor", "mlp --mesh tp=2", "w1_0"),
    (
        "zero-tied-embedding-untied",
        "gpt2 --mesh dp=2 --zero 1",
        "wte",
    ),
    (
        "recompute-stale-input",
        "mlp --mesh tp=2 --recompute",
        "layers.1",
    ),
    (
        "fp8-amax-wrong-group",
        "mlp --mesh dp=2,tp=2 --fp8",
        "layers.0",
    ),
    (
        "fp8-recompute-wrong-cast",
        "mlp --mesh tp=2 --fp8 --recompute",
        "w2_0",
    ),
    (
        "tp-overlap-wrong-chunk-order",
        "gpt2 --mesh tp=2 --sequence-parallel --tp-comm-overlap",
        "wo_0",
    ),
    (
        "moe-experts-sharded-under-sp",
        "deepseek --mesh tp=2 --sequence-parallel",
        "layers.0.moe",
    ),
    (
        "cp-rope-no-offset",
        "llama --mesh cp=2",
        "layers.0.attention",
    ),
    ("cp-loss-overscaled", "llama --mesh cp=2", "loss"),
    (
        "cp-causal-mask-local",
        "llama --mesh cp=2",
        "layers.0.attention",
    ),
    (
        "tp-cp-layernorm-grad-scaled-by-tp",
        "llama --mesh cp=2,tp=2",
        "attn_norm_0",
    ),
];

/// `zoo emit PLAN --layers 2 [--bug BUG]` into `dir`, then `trace emit` (float32) of it into
/// `dir-traces`: the trace emission's output.
fn emit_traces(s: &Scratch, dir: &str, plan: &str, bug: Option<&str>) -> common::Out {
    let mut args: Vec<&str> = vec!["zoo", "emit"];
    args.extend(plan.split_whitespace());
    args.extend(["--layers", "2", "-o", dir]);
    if let Some(bug) = bug {
        args.extend(["--bug", bug]);
    }
    s.run(&args).expect_code(0);
    let (case, traces) = (format!("{dir}/case.yaml"), format!("{dir}-traces"));
    s.run(&["trace", "emit", &case, "-o", &traces])
}

/// The module of the first tensor in execution order that is not within tolerance.
fn first_finding(s: &Scratch, dir: &str) -> String {
    let json = s
        .run(&[
            "trace",
            "compare",
            &format!("{dir}-traces/ref"),
            &format!("{dir}-traces/cand"),
            "--json",
        ])
        .expect_code(1)
        .json();
    json["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["status"]["status"] != "passed")
        .map(|t| t["id"]["module"].as_str().unwrap().to_string())
        .unwrap()
}

/// The correct plans of `entries` hold, with module outputs recorded; each bug is found at
/// its module.
fn check(entries: &[&(&str, &str, &str)]) {
    let s = Scratch::new();
    let mut plans: Vec<&str> = entries.iter().map(|e| e.1).collect();
    plans.sort();
    plans.dedup();
    for (i, plan) in plans.iter().enumerate() {
        let dir = format!("ok{i}");
        let out = emit_traces(&s, &dir, plan, None);
        out.expect_code(0);
        assert!(
            !out.stdout.contains("(0 module outputs)"),
            "{plan}: {}",
            out.stdout
        );
        s.run(&[
            "trace",
            "compare",
            &format!("{dir}-traces/ref"),
            &format!("{dir}-traces/cand"),
        ])
        .expect_code(0);
    }
    for (i, (bug, plan, module)) in entries.iter().enumerate() {
        let dir = format!("bug{i}");
        let out = emit_traces(&s, &dir, plan, Some(bug));
        if module.is_empty() {
            out.expect_code(1)
                .stderr_has(&["violated: the ranks' run", "deadlock"]);
            continue;
        }
        out.expect_code(0);
        assert_eq!(&first_finding(&s, &dir), module, "{bug} on {plan}");
    }
}

#[test]
fn module_traces_of_zoo_plans_localize_catalog_bugs() {
    // One of each model and kind of localization: a forward module (mlp, llama, deepseek's
    // MoE), a backward module (recomputation), an embedding (integer token inputs), an
    // updated parameter, shards that do not tile (a sequence chunk taken twice).
    let picked = [
        "tp-missing-allreduce",
        "llama-vocab-embedding-unmasked",
        "norm-sharded-hidden",
        "recompute-stale-input",
        "sp-scatter-wrong-chunk",
        "moe-router-grad-unsynced",
    ];
    let entries: Vec<_> = CATALOG.iter().filter(|e| picked.contains(&e.0)).collect();
    assert_eq!(entries.len(), picked.len());
    check(&entries);
}

mod heavy {
    use super::*;

    #[test]
    fn every_catalog_bug_with_a_numeric_effect_is_localized() {
        let numeric: Vec<&str> = BUGS
            .iter()
            .filter(|b| !b.listed_only() && !b.mutation.numerically_invisible())
            .map(|b| b.id)
            .collect();
        let listed: Vec<&str> = CATALOG.iter().map(|e| e.0).collect();
        assert_eq!(listed, numeric, "the table follows the catalog");
        check(&CATALOG.iter().collect::<Vec<_>>());
    }
}

/// `run --dtype bf16` judges each output by its perturbation tolerance (the spec rerun with
/// inputs perturbed at bf16's machine epsilon, the tolerance model of `trace compare`), not by
/// a fixed 3e-2: a deep correct model whose bf16 rounding exceeds 3e-2 holds, and bugs are
/// still caught.
#[test]
fn run_in_bf16_uses_perturbation_tolerances() {
    let s = Scratch::new();
    // Eight mlp blocks under tp: rounding alone moves some updated weights past 3e-2.
    s.run(&[
        "zoo", "emit", "mlp", "--mesh", "tp=2", "--layers", "8", "-o", "deep",
    ])
    .expect_code(0);
    let json = s
        .run(&[
            "run",
            "deep/case.yaml",
            "--dtype",
            "bf16",
            "--json",
            "--quiet",
        ])
        .expect_code(0)
        .json();
    assert_eq!(json["perturbed_runs"], 2);
    let outputs = json["outputs"].as_array().unwrap();
    let worst = outputs
        .iter()
        .map(|o| o["rel_error"].as_f64().unwrap())
        .fold(0.0, f64::max);
    assert!(
        worst > 3e-2,
        "a fixed 3e-2 would flag the correct plan: {worst}"
    );
    for o in outputs {
        let t = o["tolerance"].as_f64().unwrap();
        assert!(t.is_finite() && t >= 2f64.powi(-7), "{o}");
    }
    s.run(&["run", "deep/case.yaml", "--dtype", "bf16", "--quiet"])
        .expect_code(0)
        .stdout_has(&["perturbation tolerances from 2 perturbed spec runs"]);
    for (bug, plan) in [
        ("tp-missing-allreduce", "mlp --mesh tp=2"),
        ("llama-oproj-missing-allreduce", "llama --mesh tp=2"),
    ] {
        let mut args: Vec<&str> = vec!["zoo", "emit"];
        args.extend(plan.split_whitespace());
        args.extend(["--bug", bug, "-o", bug]);
        s.run(&args).expect_code(0);
        s.run(&[
            "run",
            &format!("{bug}/case.yaml"),
            "--dtype",
            "bf16",
            "--quiet",
        ])
        .expect_code(1)
        .stdout_has(&["MISMATCH"]);
    }
}
