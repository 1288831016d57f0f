//! Pipeline plans (send/recv) through shape reduction (docs/prove.md section 2): a recv's
//! buffer takes the sizes of the tensor its matched send posts. The zoo's llama forwards at
//! pp = 2 (with dp and tp) are proved on reduced sizes, the pipeline bugs of the catalog are
//! refuted with a counterexample the interpreter confirms, a hang is refused, and a recv that
//! declares another shape than its message is never proved.

use shardproof_prove::reduce::reduce_case;
use shardproof_prove::{prove_case, ProveConfig, Verdict};
use shardproof_zoo::{EmitExtras, EmitOptions, LlamaConfig, MlpConfig, PipelineOptions};
use std::path::Path;

mod zoo_emit;

/// A two-layer llama wide enough for the reduction to shrink it (hidden 16, two heads, ffn
/// 32, eight positions), `microbatches` per dp rank.
fn emit_llama_pp(
    dir: &Path,
    mesh: &str,
    bug: Option<&str>,
    microbatches: usize,
) -> shardproof_case::Case {
    let opts = EmitOptions {
        model: "llama".into(),
        mlp: MlpConfig::default(),
        llama: LlamaConfig {
            hidden: 16,
            heads: 2,
            kv_heads: 2,
            ffn: 32,
            layers: 2,
            seq: 8,
            batch: 4,
            vocab: 16,
            ..LlamaConfig::default()
        },
        mesh: shardproof_zoo::Mesh::parse(mesh).unwrap(),
        bug: bug.map(|b| shardproof_zoo::find_bug(b).unwrap()),
        forward_only: true,
        vocab_parallel: false,
    };
    let pipeline = PipelineOptions {
        microbatches,
        ..PipelineOptions::default()
    };
    zoo_emit::emit_loaded(dir, &opts, &EmitExtras::default(), &pipeline)
}

fn elements(case: &shardproof_case::Case) -> usize {
    shardproof_prove::reduce::graph_elements(&case.spec, case)
        + case
            .program
            .ranks
            .iter()
            .map(|g| shardproof_prove::reduce::graph_elements(g, case))
            .sum::<usize>()
}

#[test]
fn llama_pp_forwards_are_proved_on_reduced_sizes() {
    for mesh in ["pp=2", "dp=2,pp=2", "dp=2,pp=2,tp=2"] {
        let dir = tempfile::tempdir().unwrap();
        let case = emit_llama_pp(dir.path(), mesh, None, 2);
        let reduced = reduce_case(&case).unwrap_or_else(|r| panic!("{mesh}: {}", r.message));
        let (before, after) = (elements(&case), elements(&reduced.case));
        assert!(after < before, "{mesh}: {before} -> {after}");
        let proof = prove_case(&case, &ProveConfig::default());
        assert_eq!(
            proof.verdict,
            Verdict::Proved,
            "{mesh}: {:?}",
            proof.message
        );
        let summary = proof.reduction.expect("proved on reduced sizes");
        assert!(summary.elements_after < summary.elements_before, "{mesh}");
    }
}

#[test]
fn pipeline_bugs_are_refuted_through_the_reduction() {
    for (mesh, bug) in [
        ("pp=2", "pp-shuffled-microbatches"),
        ("pp=2", "pp-wrong-stage-division"),
        ("dp=2,pp=2", "pp-shuffled-microbatches"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let case = emit_llama_pp(dir.path(), mesh, Some(bug), 2);
        // The bug keeps every message's shape: the reduction applies.
        reduce_case(&case).unwrap_or_else(|r| panic!("{mesh} {bug}: {}", r.message));
        let proof = prove_case(&case, &ProveConfig::default());
        assert_eq!(
            proof.verdict,
            Verdict::Refuted,
            "{mesh} {bug}: {:?}",
            proof.message
        );
        assert!(proof.counterexample.is_some(), "{mesh} {bug}");
    }
}

#[test]
fn a_hanging_pipeline_is_not_reduced() {
    let dir = tempfile::tempdir().unwrap();
    let case = emit_llama_pp(dir.path(), "pp=2", Some("pp-mismatched-send-recv"), 2);
    let why = reduce_case(&case).expect_err("messages that do not pair");
    assert!(why.message.contains("do not pair"), "{}", why.message);
    let proof = prove_case(&case, &ProveConfig::default());
    assert_ne!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
}
