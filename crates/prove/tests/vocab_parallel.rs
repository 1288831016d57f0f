//! The vocab-parallel embedding (`--vocab-parallel`, the llama3-70b and -405b Table 2 plans):
//! its out-of-range mask `bitwise_or(lt(tokens, lo), ge(tokens, hi))` is a boolean elementwise
//! operator shape reduction accepts, so the embedding's stage of a tp plan cut at its layers is
//! proved on reduced sizes (at dp = 4 through the mesh reduction too, the mask being row-wise),
//! and the unmasked embedding (a catalog bug) is refuted there.

#[path = "../examples/common/layer_cuts.rs"]
mod layer_cuts;
mod zoo_emit;

use shardproof_prove::{prove_staged_with, PlanOptions, ProveConfig, Verdict};
use shardproof_zoo::{find_bug, EmitExtras, EmitOptions, Mesh, MlpConfig, PipelineOptions};
use std::path::Path;

/// A one-layer llama of width 4 on tp = 2 with the vocab-parallel embedding and LM head,
/// forward and loss, cut at the embedding's and the layer's outputs.
fn emit(dir: &Path, bug: Option<&str>) -> shardproof_case::Case {
    emit_on(dir, "tp=2", 2, bug)
}

/// [`emit`] on `mesh` with a global batch of `batch`.
fn emit_on(dir: &Path, mesh: &str, batch: usize, bug: Option<&str>) -> shardproof_case::Case {
    let opts = EmitOptions {
        model: "llama".into(),
        mlp: MlpConfig::default(),
        llama: zoo_emit::width4_llama(1, batch, 8),
        mesh: Mesh::parse(mesh).unwrap(),
        bug: bug.map(|b| find_bug(b).unwrap()),
        forward_only: true,
        vocab_parallel: true,
    };
    zoo_emit::emit_loaded(
        dir,
        &opts,
        &EmitExtras::default(),
        &PipelineOptions::default(),
    );
    assert!(layer_cuts::cut_at_layers(dir) >= 2);
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}

/// The embedding stage's proof report: the first stage, which establishes the embedding's cut
/// from the tokens alone.
fn embedding_stage(case: &shardproof_case::Case) -> serde_json::Value {
    let proof = prove_staged_with(case, &ProveConfig::default(), 1, &PlanOptions::default());
    let first = proof
        .proofs
        .iter()
        .find(|p| p.stage == 0)
        .expect("the first stage is proved");
    let spec = case.spec.path.as_deref().expect("spec file");
    let embedding = &layer_cuts::layer_outputs(spec)["embedding"];
    assert!(
        proof.stages[0].target.contains(embedding.as_str()),
        "stage 0 establishes `{}`, not the embedding's `{embedding}`",
        proof.stages[0].target
    );
    first.proof.clone()
}

#[test]
fn the_vocab_parallel_embedding_stage_is_proved_on_reduced_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let case = emit(dir.path(), None);
    let p = embedding_stage(&case);
    assert_eq!(p["verdict"], "proved", "{p}");
    // Through shape reduction, not at full size: before the boolean operators were listed it
    // refused at `bitwise_or` and the stage was inconclusive.
    assert!(p["reduction"].is_object(), "{p}");
}

#[test]
fn the_unmasked_vocab_parallel_embedding_is_refuted() {
    let dir = tempfile::tempdir().unwrap();
    let case = emit(dir.path(), Some("llama-vocab-embedding-unmasked"));
    let p = embedding_stage(&case);
    assert_eq!(p["verdict"], "refuted", "{p}");
    let proof = prove_staged_with(&case, &ProveConfig::default(), 1, &PlanOptions::default());
    assert_eq!(proof.verdict, Verdict::Refuted);
}

#[test]
fn the_vocab_parallel_embedding_stage_goes_through_the_mesh_reduction_at_dp_4() {
    let dir = tempfile::tempdir().unwrap();
    let case = emit_on(dir.path(), "dp=4,tp=2", 4, None);
    let p = embedding_stage(&case);
    assert_eq!(p["verdict"], "proved", "{p}");
    // The mask is row-wise in the rank's own tokens, so dp = 4 is proved at 2 replicas, then
    // on reduced sizes (which refused `bitwise_or` before).
    assert_eq!(p["mesh"]["original"], 4, "{p}");
    assert_eq!(p["mesh"]["reduced"], 2, "{p}");
    let dir = tempfile::tempdir().unwrap();
    let bad = emit_on(
        dir.path(),
        "dp=4,tp=2",
        4,
        Some("llama-vocab-embedding-unmasked"),
    );
    assert_eq!(embedding_stage(&bad)["verdict"], "refuted");
}
