//! A pipeline plan's full iteration proved in stages (docs/prove.md sections 2 and 7), cut as
//! `prove_presets` cuts llama3-405b's (pp, dp, tp, microbatches): at every module output and
//! every module input gradient, each as the microbatches a pipeline stage's ranks compute, the
//! gradients scaled by the replica count, each weight update a stage of its own. A missing tp
//! all-reduce in a backward layer is refuted through the same cuts, a wrong scale is never
//! proved, and a time limit stops the plan and the stages cleanly.

#[path = "../examples/common/layer_cuts.rs"]
mod layer_cuts;
mod zoo_emit;

use shardproof_case::Case;
use shardproof_prove::stage::{plan_until, prove_stages, PlanError};
use shardproof_prove::{
    prove_staged_with, CutScales, PlanOptions, ProveConfig, StagedProof, Verdict,
};
use shardproof_zoo::{find_bug, EmitExtras, EmitOptions, Mesh, MlpConfig, PipelineOptions};
use std::path::Path;
use std::time::{Duration, Instant};

/// A four-layer width-4 llama on `mesh` with two microbatches per dp rank (llama3-405b's
/// structure at test size: pp, dp, tp, microbatches; vocab-parallel with `vocab_parallel`) and
/// catalog bug `bug`, its full iteration emitted into `dir` and cut as `prove_presets` cuts
/// it: the case, the plan's options and the microbatched backward cuts' scales.
fn emit_cut(
    dir: &Path,
    mesh: &str,
    vocab_parallel: bool,
    bug: Option<&str>,
) -> (Case, PlanOptions, CutScales) {
    let opts = EmitOptions {
        model: "llama".into(),
        mlp: MlpConfig::default(),
        llama: zoo_emit::width4_llama(4, 8, 8),
        mesh: Mesh::parse(mesh).unwrap(),
        bug: bug.map(|b| find_bug(b).unwrap()),
        forward_only: false,
        vocab_parallel,
    };
    let pipeline = PipelineOptions {
        microbatches: 2,
        ..PipelineOptions::default()
    };
    zoo_emit::emit(dir, &opts, &EmitExtras::default(), &pipeline);
    layer_cuts::cut_at_modules(dir, true);
    let micro = layer_cuts::microbatch_cuts_at_modules(dir, true);
    let mut scales = layer_cuts::backward_scales(dir);
    let backward = layer_cuts::microbatch_backward_scales(dir, &micro);
    scales.extend(backward.clone());
    let case = shardproof_case::load_case(&dir.join("case.yaml")).unwrap();
    let plan = PlanOptions {
        scales,
        outputs_apart: true,
        microbatch_cuts: micro,
        ..PlanOptions::default()
    };
    (case, plan, backward)
}

fn summary(p: &StagedProof) -> String {
    format!(
        "{:?}: {} stages, {} distinct, {} memo hits; {:?}",
        p.verdict,
        p.stages.len(),
        p.distinct_stages,
        p.memo_hits,
        p.message
    )
}

/// The pipeline meshes of llama3-405b's plan at test size.
const MESH: &str = "dp=2,pp=2,tp=2";

#[test]
fn a_pipeline_full_iteration_is_proved_through_backward_microbatch_cuts() {
    let dir = tempfile::tempdir().unwrap();
    let (case, opts, backward) = emit_cut(dir.path(), MESH, false, None);
    // Every layer's attention and MLP input gradient is a microbatched backward cut, scaled by
    // dp: the cuts this plan adds beyond the forward ones.
    assert_eq!(backward.len(), 2 * 4, "{backward:?}");
    assert!(backward.values().all(|&c| c == 2), "{backward:?}");
    let proof = prove_staged_with(&case, &ProveConfig::default(), 1, &opts);
    eprintln!("{}", summary(&proof));
    assert_eq!(proof.verdict, Verdict::Proved, "{}", summary(&proof));
    // The backward cuts are established and assumed by stages of their own, and the memo
    // proves repeated layers once.
    let reading = proof
        .stages
        .iter()
        .filter(|s| s.assumes.iter().any(|a| backward.contains_key(a.as_str())))
        .count();
    assert!(reading > backward.len(), "{reading}");
    assert!(proof.memo_hits > 0, "{}", summary(&proof));
}

#[test]
fn a_missing_tp_all_reduce_in_a_backward_layer_is_refuted_at_its_cut() {
    let dir = tempfile::tempdir().unwrap();
    let bug = Some("llama-qkv-grad-missing-allreduce");
    let (case, opts, backward) = emit_cut(dir.path(), MESH, false, bug);
    let proof = prove_staged_with(&case, &ProveConfig::default(), 1, &opts);
    eprintln!("{}", summary(&proof));
    assert_eq!(proof.verdict, Verdict::Refuted, "{}", summary(&proof));
    // Refuted where layer 0's attention input gradient is established, a backward cut.
    let first = proof
        .stages
        .iter()
        .find(|s| s.verdict == Some(Verdict::Refuted))
        .unwrap();
    let cut = first
        .target
        .trim_start_matches("cut `")
        .trim_end_matches('`');
    assert!(backward.contains_key(cut), "{}", first.target);
    let refuted = proof.refuted.as_ref().expect("the refuted stage's proof");
    assert!(refuted.counterexample.is_some(), "{:?}", refuted.message);
}

#[test]
fn backward_microbatch_cuts_without_their_replica_count_are_never_proved() {
    let dir = tempfile::tempdir().unwrap();
    let (case, mut opts, backward) = emit_cut(dir.path(), MESH, false, None);
    for name in backward.keys() {
        opts.scales.remove(name);
    }
    let proof = prove_staged_with(&case, &ProveConfig::default(), 1, &opts);
    eprintln!("{}", summary(&proof));
    assert_ne!(proof.verdict, Verdict::Proved, "{}", summary(&proof));
}

#[test]
fn a_time_limit_stops_the_plan_and_the_stages_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let (case, opts, _) = emit_cut(dir.path(), MESH, false, None);
    // A limit already passed: the plan stops before its first stage, inconclusive.
    let cfg = ProveConfig {
        time_limit: Some(Duration::ZERO),
        ..ProveConfig::default()
    };
    let proof = prove_staged_with(&case, &cfg, 1, &opts);
    assert_eq!(proof.verdict, Verdict::Inconclusive);
    let message = proof.message.clone().unwrap_or_default();
    assert!(
        message.starts_with("limit reached: the time limit ran out while cutting"),
        "{message}"
    );
    let late = PlanOptions {
        deadline: Some(Instant::now()),
        ..opts.clone()
    };
    assert!(matches!(
        plan_until(&case, true, &late),
        Err(PlanError::OutOfTime(_))
    ));
    // A stage begun after the limit is not proved: it is inconclusive at once, saying so.
    let plan = plan_until(&case, true, &opts).unwrap();
    let late = ProveConfig {
        time_limit: Some(Duration::from_secs(1)),
        started: Instant::now().checked_sub(Duration::from_secs(5)),
        ..ProveConfig::default()
    };
    let outcomes = prove_stages(&plan, &plan.distinct, &late, 1);
    assert_eq!(outcomes.len(), plan.distinct.len());
    for (_, o, _) in &outcomes {
        assert_eq!(o.verdict, Verdict::Inconclusive);
        let m = o.message.as_deref().unwrap_or_default();
        assert!(m.contains("ran out before this stage began"), "{m}");
    }
}
