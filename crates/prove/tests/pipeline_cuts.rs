//! Cuts on pipeline plans (`stage/micro.rs`, docs/prove.md section 7): a layer output that a
//! pipeline stage's ranks compute once per microbatch is cut as one relation, the microbatches
//! concatenated along dim 0 being the rank's piece. The zoo's llama pp plans are proved layer
//! by layer with the memo; the catalog's pipeline bugs and planted wrong messages are refuted
//! at a cut's stage by the symbolic layers, with a counterexample the interpreter confirms; a
//! cut that names its microbatches wrongly is never proved.

#[path = "../examples/common/layer_cuts.rs"]
mod layer_cuts;
mod zoo_emit;

use shardproof_case::Case;
use shardproof_prove::{
    prove_staged_with, MicrobatchCut, PlanOptions, ProveConfig, StagedProof, Verdict,
};
use shardproof_zoo::{
    find_bug, EmitExtras, EmitOptions, LlamaConfig, Mesh, MlpConfig, PipelineOptions,
};
use std::path::Path;

/// A four-layer llama (hidden 16, two heads, ffn 32, seq 6, batch 8, two microbatches per dp
/// rank) emitted into `dir` and cut at every layer output: the case and the microbatched cuts.
fn emit_cut(dir: &Path, mesh: &str, bug: Option<&str>, forward: bool) -> (Case, PlanOptions) {
    let opts = EmitOptions {
        model: "llama".into(),
        mlp: MlpConfig::default(),
        llama: LlamaConfig {
            hidden: 16,
            heads: 2,
            kv_heads: 2,
            ffn: 32,
            layers: 4,
            seq: 6,
            batch: 8,
            vocab: 16,
            ..LlamaConfig::default()
        },
        mesh: Mesh::parse(mesh).unwrap(),
        bug: bug.map(|b| find_bug(b).unwrap()),
        forward_only: forward,
        vocab_parallel: false,
    };
    let pipeline = PipelineOptions {
        microbatches: 2,
        ..PipelineOptions::default()
    };
    zoo_emit::emit(dir, &opts, &EmitExtras::default(), &pipeline);
    layer_cuts::cut_at_layers(dir);
    let plan = PlanOptions {
        microbatch_cuts: layer_cuts::microbatch_cuts_at_layers(dir),
        ..PlanOptions::default()
    };
    let case = shardproof_case::load_case(&dir.join("case.yaml")).unwrap();
    (case, plan)
}

/// Every refutation from the symbolic layers: no run of the case first.
fn symbolic() -> ProveConfig {
    ProveConfig {
        run_first: false,
        ..ProveConfig::default()
    }
}

/// The target of the first refuted stage, after checking that its counterexample was
/// confirmed.
fn refuted_at(proof: &StagedProof) -> String {
    assert_eq!(proof.verdict, Verdict::Refuted, "{:?}", proof.message);
    let stage = proof.refuted.as_ref().expect("the refuted stage's proof");
    assert!(stage.counterexample.is_some(), "{:?}", stage.message);
    let first = proof
        .stages
        .iter()
        .find(|s| s.verdict == Some(Verdict::Refuted))
        .unwrap();
    first.target.clone()
}

#[test]
fn llama_pp_forwards_are_proved_layer_by_layer() {
    for mesh in ["pp=2", "dp=2,pp=2", "dp=2,pp=2,tp=2"] {
        let dir = tempfile::tempdir().unwrap();
        let (case, plan) = emit_cut(dir.path(), mesh, None, true);
        // The embedding and four layers, each run by one pipeline stage's ranks.
        assert_eq!(plan.microbatch_cuts.len(), 5, "{mesh}");
        assert!(plan.microbatch_cuts.iter().all(|c| c.values.len() == 2));
        let proof = prove_staged_with(&case, &ProveConfig::default(), 1, &plan);
        assert_eq!(
            proof.verdict,
            Verdict::Proved,
            "{mesh}: {:?}",
            proof.message
        );
        assert_eq!(proof.stages.len(), 6, "{mesh}");
        // The second layer of the first pipeline stage is the first's theorem renamed.
        assert!(proof.memo_hits >= 1, "{mesh}");
        for p in &proof.proofs {
            assert!(
                p.proof["reduction"].is_object(),
                "{mesh}: stage {}",
                p.stage
            );
        }
    }
}

#[test]
fn pipeline_bugs_are_refuted_at_a_cut_stage() {
    for (mesh, bug, stage) in [
        // Stage 0 runs every microbatch alike; the last stage's loss reads the wrong labels.
        ("pp=2", "pp-shuffled-microbatches", "output `loss`"),
        ("dp=2,pp=2", "pp-shuffled-microbatches", "output `loss`"),
        // Stage 0 runs one layer too many: the first cut of stage 1 is wrong.
        ("pp=2", "pp-wrong-stage-division", "cut `add_20`"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (case, plan) = emit_cut(dir.path(), mesh, Some(bug), true);
        let proof = prove_staged_with(&case, &symbolic(), 1, &plan);
        assert_eq!(refuted_at(&proof), stage, "{mesh} {bug}");
    }
}

/// Rewrites the graph file `file` of `dir` by `edit` and reloads the case.
fn edit_rank(dir: &Path, file: &str, edit: impl Fn(&str) -> String) -> Case {
    let path = dir.join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    let edited = edit(&text);
    assert_ne!(edited, text, "the edit changes {file}");
    std::fs::write(&path, edited).unwrap();
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}

/// The first pipeline stage posts each microbatch's activations under the other's tag: the
/// second stage then runs microbatch 1 where microbatch 0 belongs. Refuted at the first cut
/// the second stage computes, never proved.
#[test]
fn a_send_of_the_wrong_microbatch_is_refuted_at_the_next_cut() {
    for mesh in ["pp=2", "dp=2,pp=2"] {
        let dir = tempfile::tempdir().unwrap();
        let (_, plan) = emit_cut(dir.path(), mesh, None, true);
        let case = edit_rank(dir.path(), "r0.py", |t| {
            t.replace("(add_13, 1, 0, 'pp')", "(add_13, 1, 9, 'pp')")
                .replace("(add_27, 1, 1, 'pp')", "(add_27, 1, 0, 'pp')")
                .replace("(add_13, 1, 9, 'pp')", "(add_13, 1, 1, 'pp')")
        });
        let proof = prove_staged_with(&case, &symbolic(), 1, &plan);
        assert_eq!(refuted_at(&proof), "cut `add_20`", "{mesh}");
    }
}

/// A cut naming its microbatches in the wrong order states a false relation: the stage that
/// establishes it is refuted. Naming one of two microbatches states no concatenation of the
/// piece: the plan is refused, never proved.
#[test]
fn a_cut_naming_its_microbatches_wrongly_is_never_proved() {
    let dir = tempfile::tempdir().unwrap();
    let (case, plan) = emit_cut(dir.path(), "pp=2", None, true);
    let with = |edit: &dyn Fn(&mut MicrobatchCut)| {
        let mut plan = plan.clone();
        let cut = plan
            .microbatch_cuts
            .iter_mut()
            .find(|c| c.spec_name == "add_6")
            .unwrap();
        edit(cut);
        plan
    };
    let swapped = with(&|c| c.values.reverse());
    let proof = prove_staged_with(&case, &symbolic(), 1, &swapped);
    assert_eq!(refuted_at(&proof), "cut `add_6`");
    let one = with(&|c| c.values.truncate(1));
    let proof = prove_staged_with(&case, &ProveConfig::default(), 1, &one);
    assert_eq!(proof.verdict, Verdict::Inconclusive, "{:?}", proof.message);
    let why = proof.message.unwrap_or_default();
    assert!(why.contains("do not concatenate"), "{why}");
}

/// The second pipeline stage reads its first message at another shape (`[6, 4, 16]` for the
/// `[4, 6, 16]` posted): never proved through the cuts.
#[test]
fn a_recv_read_at_the_wrong_shape_is_never_proved_through_the_cuts() {
    let dir = tempfile::tempdir().unwrap();
    let (_, plan) = emit_cut(dir.path(), "pp=2", None, true);
    let case = edit_rank(dir.path(), "r1.py", |t| {
        t.replacen(
            "recv: \"f32[4, 6, 16]\" = torch.ops.shardproof_p2p.recv.default([4, 6, 16]",
            "recv: \"f32[6, 4, 16]\" = torch.ops.shardproof_p2p.recv.default([6, 4, 16]",
            1,
        )
    });
    let proof = prove_staged_with(&case, &ProveConfig::default(), 1, &plan);
    assert_ne!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
}
