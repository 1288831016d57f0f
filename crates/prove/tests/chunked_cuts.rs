//! Load-balanced sequence-chunk cuts (`stage::chunks`): under context parallelism a rank's
//! residual stream is its sequence chunks `i` and `2cp-1-i`. A cp full iteration cut at its
//! module outputs and input gradients, the cuts stated as `Shard(1)` over cp of the spec value's
//! load-balanced reordering (the gradients also scaled by cp, a rank's loss being the mean over
//! its own tokens), is proved stage by stage; the same cuts stated otherwise, or a planted
//! bug, are refuted with a counterexample the interpreter confirmed.

#[path = "../examples/common/layer_cuts.rs"]
mod layer_cuts;
mod zoo_emit;

use shardproof_prove::stage::plan_with;
use shardproof_prove::{
    prove_staged_with, ChunkedCuts, CutScales, LoadBalanced, PlanOptions, ProveConfig, Verdict,
};
use shardproof_zoo::{find_bug, EmitExtras, EmitOptions, Mesh, MlpConfig, PipelineOptions};
use std::path::Path;

/// A one-layer llama of width 4 (2 heads, 4 tokens: two chunks of one token per cp rank,
/// vocabulary 4, batch 2) on `mesh`, full iteration, with `bug` planted, cut at every module
/// output and input gradient its lineage names.
fn emit_cut(dir: &Path, mesh: &str, bug: Option<&str>) -> (shardproof_case::Case, PlanOptions) {
    let opts = EmitOptions {
        model: "llama".into(),
        mlp: MlpConfig::default(),
        llama: shardproof_zoo::LlamaConfig {
            seq: 4,
            ..zoo_emit::width4_llama(1, 2, 4)
        },
        mesh: Mesh::parse(mesh).unwrap(),
        bug: bug.map(|b| find_bug(b).unwrap()),
        forward_only: false,
        vocab_parallel: false,
    };
    zoo_emit::emit(
        dir,
        &opts,
        &EmitExtras::default(),
        &PipelineOptions::default(),
    );
    let (cuts, chunked) = layer_cuts::cut_at_modules_load_balanced(dir, true);
    assert!(cuts >= 4, "{cuts}");
    assert_eq!(chunked.len(), cuts);
    let scales = layer_cuts::backward_scales(dir);
    assert!(!scales.is_empty() && scales.values().all(|&c| c == 2), "{scales:?}");
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

fn with_scales(opts: &PlanOptions, scales: CutScales) -> PlanOptions {
    PlanOptions {
        scales,
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
fn cp_2_full_iteration_cut_at_load_balanced_chunks_is_proved() {
    let dir = tempfile::tempdir().unwrap();
    let (case, opts) = emit_cut(dir.path(), "cp=2", None);
    let (reads, makes) = chunked_stages(&case, &opts);
    assert!(reads >= 4 && makes >= 4, "{reads} {makes}");
    let proof = prove_staged_with(&case, &ProveConfig::default(), 1, &opts);
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
    assert!(proof.stages.len() >= 5);
}

#[test]
fn tp_2_cp_2_full_iteration_cut_at_load_balanced_chunks_is_proved() {
    let dir = tempfile::tempdir().unwrap();
    let (case, opts) = emit_cut(dir.path(), "tp=2,cp=2", None);
    let proof = prove_staged_with(&case, &ProveConfig::default(), 1, &opts);
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
}

#[test]
fn cuts_stated_in_another_chunk_order_are_refuted() {
    // The ranks' values are the load-balanced chunks: stated as contiguous shards (no order)
    // or as one chunk pair per rank of a 1-rank split (the identity order), the first cut's
    // stage is refuted, its counterexample confirmed by the interpreter.
    let dir = tempfile::tempdir().unwrap();
    let (case, opts) = emit_cut(dir.path(), "cp=2", None);
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
        assert_eq!(proof.verdict, Verdict::Refuted, "{wrong:?}: {:?}", proof.message);
        assert!(proof.refuted.is_some_and(|p| p.counterexample.is_some()));
    }
}

#[test]
fn backward_cuts_without_the_cp_scale_are_refuted() {
    let dir = tempfile::tempdir().unwrap();
    let (case, opts) = emit_cut(dir.path(), "cp=2", None);
    let unscaled = opts.scales.keys().map(|k| (k.clone(), 1)).collect();
    let proof = prove_staged_with(
        &case,
        &ProveConfig::default(),
        1,
        &with_scales(&opts, unscaled),
    );
    assert_eq!(proof.verdict, Verdict::Refuted, "{:?}", proof.message);
}

#[test]
fn catalog_cp_bugs_are_refuted_through_the_chunked_cuts() {
    // The loss scaled by cp once more (every gradient cp times too large) and RoPE at local
    // positions: each refuted at some stage with a counterexample the interpreter confirmed,
    // never proved.
    for bug in ["cp-loss-overscaled", "cp-rope-no-offset"] {
        let dir = tempfile::tempdir().unwrap();
        let (case, opts) = emit_cut(dir.path(), "cp=2", Some(bug));
        let proof = prove_staged_with(&case, &ProveConfig::default(), 1, &opts);
        assert_eq!(proof.verdict, Verdict::Refuted, "{bug}: {:?}", proof.message);
        assert!(proof.refuted.is_some_and(|p| p.counterexample.is_some()));
    }
}

#[test]
fn a_chunk_order_the_sizes_do_not_allow_is_refused() {
    // 4 tokens are not 6 equal chunks: the plan is refused, nothing is proved.
    let dir = tempfile::tempdir().unwrap();
    let (case, opts) = emit_cut(dir.path(), "cp=2", None);
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
