//! The zoo's vocab-parallel cross-entropy stage (the llama3-405b plan's loss, issue 45) at
//! tiny sizes: a one-layer width-4 llama forward on tp = 2, vocabulary 8, cut at its layers.
//! The loss stage is decided by cases on each label separately (`decide/split.rs`), and
//! planted bugs in the ranks' loss (the target logit from the wrong vocab shard, the max not
//! all-reduced, a label mask off by one at a shard edge) are refuted with counterexamples the
//! interpreter confirms, found by the symbolic layers (the random run first is off).

#[path = "../examples/common/layer_cuts.rs"]
mod layer_cuts;
mod zoo_emit;
use zoo_emit::{edit_rank, with_literal};

use shardproof_prove::{prove_staged_with, PlanOptions, ProveConfig};
use shardproof_zoo::{EmitExtras, EmitOptions, Mesh, MlpConfig, PipelineOptions};
use std::path::Path;

/// Rows per rank: the vocabulary is `2 · ROWS`.
const ROWS: i64 = 4;

/// The tiny llama with the vocab-parallel loss, `batch` sequences of `seq` tokens (a label
/// each), emitted into `dir` and cut at its layers.
fn emit(dir: &Path, batch: usize, seq: usize) {
    let opts = EmitOptions {
        model: "llama".into(),
        mlp: MlpConfig::default(),
        llama: shardproof_zoo::LlamaConfig {
            seq,
            ..zoo_emit::width4_llama(1, batch, 2 * ROWS as usize)
        },
        mesh: Mesh::parse("tp=2").unwrap(),
        bug: None,
        forward_only: true,
        vocab_parallel: true,
    };
    zoo_emit::emit(
        dir,
        &opts,
        &EmitExtras::default(),
        &PipelineOptions::default(),
    );
    assert!(layer_cuts::cut_at_layers(dir) >= 2);
}

/// The loss stage's report (the stage establishing the output `loss`), proved on the
/// symbolic layers alone.
fn loss_stage(dir: &Path) -> serde_json::Value {
    let case = shardproof_case::load_case(&dir.join("case.yaml")).unwrap();
    let cfg = ProveConfig {
        run_first: false,
        ..ProveConfig::default()
    };
    let proof = prove_staged_with(&case, &cfg, 1, &PlanOptions::default());
    let p = proof
        .proofs
        .iter()
        .find(|p| proof.stages[p.stage].target == "output `loss`")
        .unwrap_or_else(|| panic!("no loss stage: {:?}", proof.stages));
    p.proof.clone()
}

// The loss's label lines on every rank (the embedding's token lines use `tokens`).
const MASK_BELOW: &str = "aten.lt.Scalar(view_15";
const MASK_ABOVE: &str = "aten.ge.Scalar(view_15";
const OFFSET: &str = "aten.sub.Scalar(view_15";

#[test]
fn the_vocab_parallel_loss_is_proved_by_cases_on_each_label() {
    for (batch, seq) in [(1, 1), (2, 2)] {
        let dir = tempfile::tempdir().unwrap();
        emit(dir.path(), batch, seq);
        let p = loss_stage(dir.path());
        assert_eq!(p["verdict"], "proved", "{batch} x {seq}: {p}");
        assert_eq!(p["layers"]["case-split"], 1, "{batch} x {seq}: {p}");
    }
}

/// A planted bug in the ranks' loss over 2 x 2 labels: refuted (an interpreter-confirmed
/// counterexample), never proved.
fn refuted(edit: &dyn Fn(&Path)) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    emit(dir.path(), 2, 2);
    edit(dir.path());
    let p = loss_stage(dir.path());
    assert_eq!(p["verdict"], "refuted", "{p}");
    p
}

#[test]
fn a_target_logit_from_the_wrong_vocab_shard_is_refuted() {
    // Rank 1 masks and shifts by rank 0's range: labels below ROWS get two logits (rank 1's
    // column of the same local position too), the others none.
    refuted(&|d| {
        edit_rank(d, 1, MASK_BELOW, &|l| with_literal(l, 0));
        edit_rank(d, 1, MASK_ABOVE, &|l| with_literal(l, ROWS));
        edit_rank(d, 1, OFFSET, &|l| with_literal(l, 0));
    });
}

#[test]
fn the_max_not_all_reduced_is_refuted() {
    // Each rank shifts its logits by its own max: the ranks' exponentials are summed on
    // different scales.
    refuted(&|d| {
        for r in 0..2 {
            edit_rank(d, r, "all_reduce.default(amax", &|l| {
                let head = &l[..l.find("= ").unwrap() + 2];
                format!("{head}torch.ops.aten.clone.default(amax)")
            });
        }
    });
}

#[test]
fn a_label_mask_off_by_one_at_the_shard_edge_is_refuted() {
    // A gap: rank 1's range starts one label late (its offset kept), so label ROWS gets no
    // logit; no random label need hit it, the cases do.
    let p = refuted(&|d| edit_rank(d, 1, MASK_BELOW, &|l| with_literal(l, ROWS + 1)));
    assert_eq!(p["layers"]["case-split"], 1, "{p}");
    // `<=` for `<`: rank 1 masks its first label too.
    let p = refuted(&|d| {
        edit_rank(d, 1, MASK_BELOW, &|l| {
            l.replace("aten.lt.Scalar", "aten.le.Scalar")
        })
    });
    assert_eq!(p["layers"]["case-split"], 1, "{p}");
}
