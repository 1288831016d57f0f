//! The zoo's vocab-parallel embedding stage (a llama forward on tp = 2 and tp = 4, cut at its
//! layers) decided by cases on the token (`decide/split.rs`), and planted bugs in the rank
//! graphs' masks, offsets and all-reduce never proved: refuted with a counterexample the
//! interpreter confirms, or inconclusive.

#[path = "../examples/common/layer_cuts.rs"]
mod layer_cuts;
mod zoo_emit;
use zoo_emit::{edit_rank, with_literal};

use shardproof_prove::{prove_staged_with, PlanOptions, ProveConfig};
use shardproof_zoo::{EmitExtras, EmitOptions, LlamaConfig, Mesh, MlpConfig, PipelineOptions};
use std::path::Path;

/// Rows per rank: the vocabulary is `ROWS · tp`.
const ROWS: usize = 12;

/// A one-layer llama forward with the vocab-parallel embedding on `tp` ranks, cut at its
/// layers, emitted into `dir`.
fn emit(dir: &Path, tp: usize) {
    let opts = EmitOptions {
        model: "llama".into(),
        mlp: MlpConfig::default(),
        llama: LlamaConfig {
            hidden: 8,
            heads: 4,
            kv_heads: 4,
            ffn: 8,
            layers: 1,
            seq: 2,
            batch: 1,
            vocab: ROWS * tp,
            ..LlamaConfig::default()
        },
        mesh: Mesh::parse(&format!("tp={tp}")).unwrap(),
        bug: None,
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
}

/// The embedding stage's report (the first stage, which establishes the embedding's output
/// from the tokens) of the case in `dir`, loaded afresh.
fn embedding_stage(dir: &Path) -> serde_json::Value {
    let case = shardproof_case::load_case(&dir.join("case.yaml")).unwrap();
    let proof = prove_staged_with(&case, &ProveConfig::default(), 1, &PlanOptions::default());
    let spec = case.spec.path.as_deref().expect("spec file");
    let embedding = &layer_cuts::layer_outputs(spec)["embedding"];
    let first = proof
        .proofs
        .iter()
        .find(|p| p.stage == 0)
        .expect("the first stage is proved");
    assert!(
        proof.stages[0].target.contains(embedding.as_str()),
        "stage 0 establishes `{}`, not the embedding's `{embedding}`",
        proof.stages[0].target
    );
    first.proof.clone()
}

#[test]
fn the_vocab_parallel_embedding_on_2_and_4_ranks_is_proved_by_cases() {
    for tp in [2, 4] {
        let dir = tempfile::tempdir().unwrap();
        emit(dir.path(), tp);
        let p = embedding_stage(dir.path());
        assert_eq!(p["verdict"], "proved", "tp {tp}: {p}");
        // The vocabulary (the tokens' range) is kept, so every goal holds the table and the
        // ranks' masked lookups: their normal forms differ and the split decides them.
        assert!(
            p["layers"]["case-split"].as_u64().is_some_and(|n| n > 0),
            "tp {tp}: {p}"
        );
    }
}

/// A planted bug in the rank files of a tp = 4 embedding: the verdict, never `proved`.
fn planted(edit: &dyn Fn(&Path)) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    emit(dir.path(), 4);
    edit(dir.path());
    let p = embedding_stage(dir.path());
    assert_ne!(p["verdict"], "proved", "{p}");
    p
}

#[test]
fn planted_mask_and_offset_bugs_are_refuted() {
    let lo = ROWS as i64;
    // Rank 1 masks and shifts by rank 0's range (its own rows): tokens below ROWS get two
    // rows, the others none.
    let p = planted(&|d| {
        edit_rank(d, 1, "aten.lt.Scalar(", &|l| with_literal(l, 0));
        edit_rank(d, 1, "aten.ge.Scalar(", &|l| with_literal(l, lo));
        edit_rank(d, 1, "aten.sub.Scalar(", &|l| with_literal(l, 0));
    });
    assert_eq!(p["verdict"], "refuted", "{p}");
    // Rank 1 masks its own range but shifts by rank 0's offset: it looks up rows past its
    // own, which the interpreter cannot run: not proved.
    planted(&|d| edit_rank(d, 1, "aten.sub.Scalar(", &|l| with_literal(l, 0)));
    // `<=` for `<`: rank 1 masks its first token too, which no rank then looks up.
    let p = planted(&|d| {
        edit_rank(d, 1, "aten.lt.Scalar(", &|l| {
            l.replace("aten.lt.Scalar", "aten.le.Scalar")
        })
    });
    assert_eq!(p["verdict"], "refuted", "{p}");
    assert_eq!(p["layers"]["case-split"], 1, "{p}");
    // A gap: rank 1's range starts one token late (its offset kept).
    let p = planted(&|d| edit_rank(d, 1, "aten.lt.Scalar(", &|l| with_literal(l, lo + 1)));
    assert_eq!(p["verdict"], "refuted", "{p}");
    // Overlapping ranges: rank 1's range starts one token early (rank 0 has it too). Rank 1
    // then looks up row -1 of its rows at that token, which the interpreter cannot run: not
    // proved, and refuted only where a confirmed counterexample exists.
    planted(&|d| edit_rank(d, 1, "aten.lt.Scalar(", &|l| with_literal(l, lo - 1)));
}

#[test]
fn the_embedding_without_its_all_reduce_is_refuted() {
    // Every rank keeps its own masked rows: the sum of the tp ranks never happens.
    let p = planted(&|d| {
        for r in 0..4 {
            edit_rank(d, r, "all_reduce.default(masked_fill_1", &|l| {
                let head = &l[..l.find("= ").unwrap() + 2];
                format!("{head}torch.ops.aten.clone.default(masked_fill_1)")
            });
        }
    });
    assert_eq!(p["verdict"], "refuted", "{p}");
}
