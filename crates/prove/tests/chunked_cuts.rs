//! Load-balanced sequence-chunk cuts (`stage::chunks`): under context parallelism a rank's
//! residual stream is its sequence chunks `i` and `2cp-1-i`. A cp plan cut at its module
//! outputs, the cuts stated as `Shard` over cp of the spec value's load-balanced reordering
//! (an MoE block's flattened tokens as `batch` sequences), is proved stage by stage; the same
//! cuts stated otherwise, or a planted bug, are refuted with a counterexample the interpreter
//! confirmed. (The full iterations cut at their input gradients too, scaled by cp: deepseek
//! tp=2 x cp=2 in `examples/zoo_sweep.rs`, about 100 s, too slow for the suite.)

#[path = "../examples/common/layer_cuts.rs"]
mod layer_cuts;
mod zoo_emit;

use shardproof_prove::stage::plan_with;
use shardproof_prove::{
    prove_staged_with, ChunkedCuts, LoadBalanced, PlanOptions, ProveConfig, Verdict,
};
use shardproof_zoo::{find_bug, EmitExtras, EmitOptions, Mesh, MlpConfig, PipelineOptions};
use std::path::Path;

/// A one-layer `model` of width 4 (2 heads, 4 tokens: two chunks of one token per cp rank,
/// vocabulary 4, batch 2; deepseek: 4 experts of width 2, 2 per token) on `mesh` with `bug`
/// planted, cut at every module output (`full`: the full iteration, cut at the module input
/// gradients too, scaled by cp).
fn emit_cut(
    dir: &Path,
    model: &str,
    mesh: &str,
    bug: Option<&str>,
    full: bool,
) -> (shardproof_case::Case, PlanOptions) {
    let base = shardproof_zoo::LlamaConfig {
        seq: 4,
        ..zoo_emit::width4_llama(1, 2, 4)
    };
    let opts = EmitOptions {
        model: model.into(),
        mlp: MlpConfig::default(),
        llama: base.clone(),
        mesh: Mesh::parse(mesh).unwrap(),
        bug: bug.map(|b| find_bug(b).unwrap()),
        forward_only: !full,
        vocab_parallel: false,
    };
    let extras = EmitExtras {
        deepseek: shardproof_zoo::DeepseekConfig {
            base,
            moe_ffn: 2,
            experts: 4,
            top_k: 2,
            ..shardproof_zoo::DeepseekConfig::default()
        },
        ..EmitExtras::default()
    };
    zoo_emit::emit(dir, &opts, &extras, &PipelineOptions::default());
    let (cuts, chunked) = layer_cuts::cut_at_modules_load_balanced(dir, full);
    assert!(cuts >= 2, "{cuts}");
    assert_eq!(chunked.len(), cuts);
    let scales = layer_cuts::backward_scales(dir);
    assert!(scales.values().all(|&c| c == 2), "{scales:?}");
    let case = shardproof_case::load_case(&dir.join("case.yaml")).unwrap();
    let plan = PlanOptions {
        scales,
        chunked,
        ..PlanOptions::default()
    };
    (case, plan)
}

fn with_chunks(opts: &PlanOptions, chunked: ChunkedCuts) -> PlanOptions {
    PlanOptions {
        chunked,
        ..opts.clone()
    }
}

/// The stages of `opts`' plan that read or establish a chunked cut.
fn chunked_stages(case: &shardproof_case::Case, opts: &PlanOptions) -> (usize, usize) {
    let plan = plan_with(case, true, opts).unwrap();
    let reads = plan
        .stages
        .iter()
        .filter(|s| s.assumes.iter().any(|n| opts.chunked.contains_key(n)))
        .count();
    let makes = plan
        .stages
        .iter()
        .filter(|s| {
            opts.chunked
                .keys()
                .any(|n| s.target == format!("cut `{n}`"))
        })
        .count();
    (reads, makes)
}

#[test]
fn cp_2_forward_cut_at_load_balanced_chunks_is_proved() {
    for (model, mesh) in [
        ("llama", "cp=2"),
        ("llama", "tp=2,cp=2"),
        ("deepseek", "cp=2"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (case, opts) = emit_cut(dir.path(), model, mesh, None, false);
        let (reads, makes) = chunked_stages(&case, &opts);
        assert!(reads >= 2 && makes >= 2, "{model} {mesh}: {reads} {makes}");
        if model == "deepseek" {
            // The MoE block's output is its flattened tokens: `batch` sequences along dim 0;
            // the residual stream after it is a cut of its own.
            assert!(opts
                .chunked
                .values()
                .any(|lb| lb.dim == 0 && lb.sequences == 2));
            assert!(opts.chunked.len() >= 3, "{:?}", opts.chunked);
        }
        let proof = prove_staged_with(&case, &ProveConfig::default(), 1, &opts);
        assert_eq!(
            proof.verdict,
            Verdict::Proved,
            "{model} {mesh}: {:?}",
            proof.message
        );
    }
}

#[test]
fn cuts_stated_in_another_chunk_order_are_refuted() {
    // The ranks' values are the load-balanced chunks: stated as contiguous shards (no order)
    // or as one chunk pair per rank of a 1-rank split (the identity order), the first cut's
    // stage is refuted, its counterexample confirmed by the interpreter.
    let dir = tempfile::tempdir().unwrap();
    let (case, opts) = emit_cut(dir.path(), "llama", "cp=2", None, true);
    let identity: ChunkedCuts = opts
        .chunked
        .iter()
        .map(|(k, lb)| (k.clone(), LoadBalanced { ranks: 1, ..*lb }))
        .collect();
    for wrong in [ChunkedCuts::new(), identity] {
        let proof = prove_staged_with(
            &case,
            &ProveConfig::default(),
            1,
            &with_chunks(&opts, wrong.clone()),
        );
        assert_eq!(
            proof.verdict,
            Verdict::Refuted,
            "{wrong:?}: {:?}",
            proof.message
        );
        assert!(proof.refuted.is_some_and(|p| p.counterexample.is_some()));
    }
}

#[test]
fn catalog_cp_bugs_are_refuted_through_the_chunked_cuts() {
    // The loss scaled by cp once more, RoPE at local positions and the causal mask of local
    // positions: each refuted at some stage with a counterexample the interpreter confirmed,
    // never proved.
    for bug in [
        "cp-loss-overscaled",
        "cp-rope-no-offset",
        "cp-causal-mask-local",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (case, opts) = emit_cut(dir.path(), "llama", "cp=2", Some(bug), false);
        let proof = prove_staged_with(&case, &ProveConfig::default(), 1, &opts);
        assert_eq!(
            proof.verdict,
            Verdict::Refuted,
            "{bug}: {:?}",
            proof.message
        );
        assert!(proof.refuted.is_some_and(|p| p.counterexample.is_some()));
    }
}

#[test]
fn a_chunk_order_the_sizes_do_not_allow_is_refused() {
    // 4 tokens are not 6 equal chunks: the plan is refused, nothing is proved.
    let dir = tempfile::tempdir().unwrap();
    let (case, opts) = emit_cut(dir.path(), "llama", "cp=2", None, false);
    let three = opts
        .chunked
        .iter()
        .map(|(k, lb)| (k.clone(), LoadBalanced { ranks: 3, ..*lb }))
        .collect();
    let why = plan_with(&case, true, &with_chunks(&opts, three)).unwrap_err();
    assert!(why.contains("equal chunks"), "{why}");
    let mut unknown = opts.chunked.clone();
    unknown.insert(
        "no_such_tensor".into(),
        LoadBalanced {
            dim: 1,
            ranks: 2,
            sequences: 1,
        },
    );
    let why = plan_with(&case, true, &with_chunks(&opts, unknown)).unwrap_err();
    assert!(why.contains("no_such_tensor"), "{why}");
}
