//! End to end: real multi-process PyTorch runs of the collector's example GPT (gloo on CPU,
//! bf16, fp32 and emulated fp8), traced by `shardproof.trace` and compared by `shardproof trace
//! compare`. Correct configurations hold; each planted bug of the seed's Table 1 is caught at
//! its module.
//!
//! Runs where the oracle suite is set up (`scripts/test` installs the collector into its
//! virtual environment); skipped with a message otherwise.

mod common;

use std::path::Path;
use std::process::Command;

/// One real run: a configuration, its dtype (`bf16`, or `fp8`: bf16 with emulated fp8 linears)
/// and the generator seed of parameters and data.
#[derive(Clone, Copy)]
struct Run<'a> {
    config: &'a str,
    dtype: &'a str,
    seed: u64,
}

const fn bf16(config: &str) -> Run<'_> {
    Run {
        config,
        dtype: "bf16",
        seed: 0,
    }
}

const fn fp8(config: &str, seed: u64) -> Run<'_> {
    Run {
        config,
        dtype: "fp8",
        seed,
    }
}

/// Writes a reference (with its perturbed runs) and a candidate trace for `run` (and `bug`)
/// under `out`, then compares them; returns the exit code and the JSON report.
fn traced(python: &Path, out: &Path, run: Run<'_>, bug: Option<&str>) -> (i32, serde_json::Value) {
    let Run {
        config,
        dtype,
        seed,
    } = run;
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../python");
    let mut demo = Command::new(python);
    demo.env("PYTHONPATH", &source)
        .args([
            "-m",
            "shardproof.trace.demo",
            "--config",
            config,
            "--dtype",
            dtype,
            "--seed",
            &seed.to_string(),
        ])
        .arg("--out")
        .arg(out);
    if let Some(b) = bug {
        demo.args(["--bug", b]);
    }
    let ran = demo.output().unwrap();
    assert!(
        ran.status.success(),
        "{config} {dtype} seed {seed} {bug:?}: {}",
        String::from_utf8_lossy(&ran.stderr)
    );
    let compared = Command::new(env!("CARGO_BIN_EXE_shardproof"))
        .args(["trace", "compare", "--json", "--quiet"])
        .arg(out.join("ref"))
        .arg(out.join("cand"))
        .output()
        .unwrap();
    let report = serde_json::from_slice(&compared.stdout).unwrap_or_else(|e| {
        panic!(
            "{config} {bug:?}: no JSON ({e}): {}",
            String::from_utf8_lossy(&compared.stderr)
        )
    });
    (compared.status.code().unwrap_or(-1), report)
}

/// The catalog's bugs the trace engine catches in real runs: (catalog id, the collector's
/// `--bug` switch, its run, where the first divergence must be).
const CAUGHT_IN_REAL_RUNS: &[(&str, &str, Run<'static>, &str)] = &[
    (
        "llama-vocab-embedding-unmasked",
        "embedding_mask",
        bf16("tp2"),
        "`embedding.word_embeddings` (forward_output",
    ),
    (
        // The recomputation of layer 2's MLP reads layer 3's input: its first recomputed
        // input differs from the forward's, where a correct recomputation is bit-identical.
        "recompute-stale-input",
        "stale_recompute",
        bf16("tp2-recompute"),
        "`layers.2.mlp.linear_fc1` (recompute_input",
    ),
    (
        "cp-loss-overscaled",
        "cp_loss_scale",
        bf16("cp2"),
        "`loss` (grad_output",
    ),
    (
        "dp-loss-not-averaged",
        "dp_loss_scale",
        bf16("dp2"),
        "`loss` (grad_output",
    ),
    (
        "zero-tied-embedding-untied",
        "untied_embedding",
        bf16("pp2"),
        "`embedding.word_embeddings.weight` (main_grad",
    ),
    (
        "zero-param-update-skipped",
        "zero_no_update",
        bf16("dp2-zero"),
        // In dp rank 0's range of the flat buffer; dp rank 1 keeps the old value.
        "`embedding.word_embeddings.weight` (param_after_step",
    ),
    (
        "pp-wrong-stage-division",
        "pp_stage_division",
        bf16("pp2"),
        "`layers.2.input_layernorm` (forward_output",
    ),
    (
        "tp-overlap-wrong-chunk-order",
        "tp_overlap_grad",
        bf16("tp2"),
        "`output_layer` (grad_input",
    ),
    (
        "sp-layernorm-grad-not-reduced",
        "sp_layernorm_unsynced",
        bf16("tp2-sp"),
        "`layers.0.input_layernorm.weight` (main_grad",
    ),
    (
        "cp-attn-grad-noncontiguous",
        "cp_attention_grad",
        bf16("cp2"),
        "`layers.3.self_attention.core_attention` (grad_input",
    ),
    (
        // The first layer's router gradient: its TP replicas are declared bit-identical (tp2's
        // sums run over two ranks), and the bug leaves each rank its own partial sum. By the
        // tolerance alone it would pass (one bf16 perturbation moves it by 32%, tolerance 1.28
        // against the bug's 1.13 spread) and layer 1's router would be the first.
        "moe-router-grad-unsynced",
        "sp_router_unsynced",
        bf16("tp2-sp-moe"),
        "`layers.0.mlp.router.weight` (main_grad",
    ),
    (
        "tp-cp-layernorm-grad-scaled-by-tp",
        "tpcp_layernorm_scale",
        bf16("tp2-cp2"),
        "`layers.0.input_layernorm.weight` (main_grad",
    ),
    (
        // The TP ranks' amax replicas differ (10% at seed 0) where a correct run's are
        // bit-identical (an all-reduce max, declared `exact_replicas`).
        "fp8-amax-wrong-group",
        "fp8_wrong_group",
        fp8("tp2-sp", 0),
        "`layers.0.self_attention.linear_qkv.input_amax` (forward_output",
    ),
    (
        // The recomputed MLP multiplies by the master weights, not their fp8 casts: the first
        // recomputation in backward (layer 3's fc1) differs from the forward's output. The
        // gradients it feeds are off by about one fp8 rounding, within the tolerance.
        "fp8-recompute-wrong-cast",
        "fp8_recompute_cast",
        fp8("tp2-recompute", 0),
        "`layers.3.mlp.linear_fc1` (recompute_output",
    ),
];

/// Runs the planted bugs `ids` of [`CAUGHT_IN_REAL_RUNS`] and the correct `runs`.
fn holds_and_catches(runs: &[Run<'_>], ids: &[&str]) {
    let Some(python) = common::oracle_python() else {
        eprintln!(
            "skipped: SHARDPROOF_ORACLE_DIR is not set (scripts/test sets up the Python side)"
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    for run in runs {
        let name = format!("{}-{}-{}", run.config, run.dtype, run.seed);
        let (code, report) = traced(&python, &dir.path().join(&name), *run, None);
        assert_eq!(code, 0, "{name}: {}", report["summary"]);
        if run.dtype == "fp8" {
            // The ablation of seed 002 section 6.5 on a real run: fp8 rounding flips move a
            // correct run's tensors by percents, past the fixed bf16 tolerance `shardproof run`
            // used (3e-2), which would raise false alarms where the perturbation tolerance holds.
            let beyond_fixed = report["tensors"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|t| t["relative_error"].as_f64().is_some_and(|e| e > 3e-2))
                .count();
            assert!(beyond_fixed > 0, "{name}: no tensor beyond 3e-2");
        }
    }
    for (id, bug, run, module) in CAUGHT_IN_REAL_RUNS.iter().filter(|c| ids.contains(&c.0)) {
        let (code, report) = traced(&python, &dir.path().join(bug), *run, Some(bug));
        assert_eq!(code, 1, "{id}: {}", report["summary"]);
        let summary = report["summary"].as_str().unwrap_or_default();
        assert!(
            summary.contains(&format!("first divergence at module {module}")),
            "{id}: {summary}"
        );
    }
}

#[test]
fn real_runs_hold_and_planted_bugs_are_localized_to_their_module() {
    holds_and_catches(
        &[
            bf16("tp2-sp"),
            bf16("dp2"),
            bf16("cp2"),
            fp8("tp2-sp", 0),
            fp8("tp2-recompute", 0),
        ],
        &[
            "llama-vocab-embedding-unmasked",
            "dp-loss-not-averaged",
            "sp-layernorm-grad-not-reduced",
            "cp-attn-grad-noncontiguous",
            "fp8-amax-wrong-group",
            "fp8-recompute-wrong-cast",
        ],
    );
}

#[test]
fn the_catalog_names_trace_for_exactly_the_bugs_real_runs_catch() {
    let claimed: std::collections::BTreeSet<&str> = shardproof_zoo::BUGS
        .iter()
        .filter(|b| {
            b.engines
                .split([',', ' ', ';'])
                .any(|e| e.trim() == "trace")
        })
        .map(|b| b.id)
        .collect();
    let caught: std::collections::BTreeSet<&str> =
        CAUGHT_IN_REAL_RUNS.iter().map(|c| c.0).collect();
    assert_eq!(claimed, caught);
}

/// Every catalog bug of [`CAUGHT_IN_REAL_RUNS`] and more correct configurations (about 5
/// minutes: `scripts/heavy`).
mod heavy {
    #[test]
    fn every_real_run_bug_is_localized_and_correct_plans_hold() {
        let ids: Vec<&str> = super::CAUGHT_IN_REAL_RUNS.iter().map(|c| c.0).collect();
        super::holds_and_catches(
            &[
                super::bf16("tp2"),
                super::bf16("dp2-zero"),
                super::bf16("pp2-mb2"),
                super::bf16("tp2-pp2"),
                super::bf16("pp2-vpp2-mb2"),
                super::bf16("tp2-cp2"),
                super::bf16("tp2-sp-cp2"),
                super::bf16("tp2-sp-dp2-zero"),
                super::bf16("tp2-recompute"),
                super::bf16("tp2-sp-moe"),
                // Other generator seeds, and fp32.
                super::Run {
                    config: "tp2-sp",
                    dtype: "bf16",
                    seed: 1,
                },
                super::Run {
                    config: "tp2-sp",
                    dtype: "bf16",
                    seed: 2,
                },
                super::Run {
                    config: "tp2-sp-dp2-zero",
                    dtype: "bf16",
                    seed: 1,
                },
                super::Run {
                    config: "pp2-mb2",
                    dtype: "bf16",
                    seed: 2,
                },
                super::Run {
                    config: "tp2-cp2",
                    dtype: "fp32",
                    seed: 1,
                },
                super::Run {
                    config: "tp2-pp2",
                    dtype: "fp32",
                    seed: 2,
                },
                // Emulated fp8 over several seeds: zero false alarms where fp8 rounding flips
                // move tensors by percents.
                super::fp8("tp2-sp", 1),
                super::fp8("tp2-sp", 2),
                super::fp8("tp2-sp", 3),
                super::fp8("tp2", 0),
                super::fp8("tp2", 1),
                // Recomputation bit-identical to the forward in every dtype and layout.
                super::fp8("tp2-sp-recompute", 1),
                super::bf16("pp2-mb2-recompute"),
                super::bf16("tp2-sp-dp2-zero-recompute"),
                super::bf16("tp2-cp2-recompute"),
                super::Run {
                    config: "pp2-vpp2-mb2-recompute",
                    dtype: "fp32",
                    seed: 1,
                },
            ],
            &ids,
        );
    }
}
