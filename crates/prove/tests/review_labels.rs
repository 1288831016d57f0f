//! Adversarial review of the label-by-label decision (`decide/split.rs`, `decide_by_labels`)
//! on the zoo's vocab-parallel cross-entropy stage (llama width 4, tp = 2, vocabulary 8, 2 x 2
//! labels; rank 0 holds classes `[0, 4)`, rank 1 `[4, 8)`; one test on tp = 4, 16 classes),
//! the symbolic layers alone (no random run first). Planted in the ranks' loss: a mask edge
//! moved inside the range (wrong) or outside it (still right on every label), one class
//! masked (wrong for that class only), an offset off by one, a `log` whose argument is exactly
//! 0 on one label's case, and quotients `x / x` of a positive and of a possibly-zero `x`.
//! Every wrong program must not be proved; every right one should be (one, `S / S`, is left
//! inconclusive: never refuted).

#[path = "../examples/common/layer_cuts.rs"]
mod layer_cuts;
mod zoo_emit;
use zoo_emit::{edit_rank, with_literal};

use shardproof_prove::{prove_staged_with, PlanOptions, ProveConfig};
use shardproof_zoo::{EmitExtras, EmitOptions, Mesh, MlpConfig, PipelineOptions};
use std::path::Path;

/// Rows per rank: the vocabulary is `tp · ROWS`.
const ROWS: i64 = 4;

/// The loss stage's report (the stage establishing `loss`) of the tiny llama with the
/// vocab-parallel loss on `tp` ranks of `ROWS` classes each (width `2·tp`, `tp` heads), 2
/// sequences of 2 tokens, its ranks edited by `edit`.
fn loss_stage(tp: usize, edit: &dyn Fn(&Path)) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let width = 2 * tp.max(2);
    let opts = EmitOptions {
        model: "llama".into(),
        mlp: MlpConfig::default(),
        llama: shardproof_zoo::LlamaConfig {
            hidden: width,
            heads: width / 2,
            kv_heads: width / 2,
            ffn: width,
            ..zoo_emit::width4_llama(1, 2, tp * ROWS as usize)
        },
        mesh: Mesh::parse(&format!("tp={tp}")).unwrap(),
        bug: None,
        forward_only: true,
        vocab_parallel: true,
    };
    zoo_emit::emit(
        dir.path(),
        &opts,
        &EmitExtras::default(),
        &PipelineOptions::default(),
    );
    assert!(layer_cuts::cut_at_layers(dir.path()) >= 2);
    edit(dir.path());
    let case = shardproof_case::load_case(&dir.path().join("case.yaml")).unwrap();
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

/// The loss stage's verdict under `edit`; a refutation carries a counterexample the
/// interpreter confirmed.
fn verdict(edit: &dyn Fn(&Path)) -> String {
    verdict_on(2, edit)
}

/// [`verdict`] on `tp` ranks.
fn verdict_on(tp: usize, edit: &dyn Fn(&Path)) -> String {
    let p = loss_stage(tp, edit);
    let v = p["verdict"].as_str().unwrap().to_string();
    if v == "refuted" {
        assert!(!p["counterexample"].is_null(), "{p}");
    }
    v
}

// The loss's label lines on every rank.
const MASK_BELOW: &str = "aten.lt.Scalar(view_15";
const MASK_ABOVE: &str = "aten.ge.Scalar(view_15";
const OFFSET: &str = "aten.sub.Scalar(view_15";
const PER_TOKEN: &str = "sub_3: \"f32[4, 1]\" = torch.ops.aten.sub.Tensor(log, wait_tensor_4)";

#[test]
fn mask_edges_moved_outside_the_labels_range_are_still_proved() {
    // Labels range over [0, 8): `l < -1` is `l < 0`, `l >= 9` and `l == 8` are `l >= 8`.
    for (rank, pattern, lit) in [(0, MASK_BELOW, -1), (1, MASK_ABOVE, 2 * ROWS + 1)] {
        let v = verdict(&|d| edit_rank(d, rank, pattern, &|l| with_literal(l, lit)));
        assert_eq!(v, "proved", "rank {rank}: {pattern} {lit}");
    }
    let v = verdict(&|d| {
        edit_rank(d, 1, MASK_ABOVE, &|l| {
            l.replace("aten.ge.Scalar", "aten.eq.Scalar")
        })
    });
    assert_eq!(v, "proved");
}

#[test]
fn the_last_class_masked_on_its_own_rank_is_refuted() {
    // Rank 1's upper edge at 7: label 7 gets no logit.
    let v = verdict(&|d| edit_rank(d, 1, MASK_ABOVE, &|l| with_literal(l, 2 * ROWS - 1)));
    assert_eq!(v, "refuted");
}

#[test]
fn one_interior_class_masked_is_refuted() {
    // Rank 0 masks label 2 (its lower test `l < 0` becomes `l == 2`): wrong for class 2 only.
    let v = verdict(&|d| {
        edit_rank(d, 0, MASK_BELOW, &|l| {
            with_literal(&l.replace("aten.lt.Scalar", "aten.eq.Scalar"), 2)
        })
    });
    assert_eq!(v, "refuted");
}

#[test]
fn an_offset_off_by_one_is_not_proved() {
    // Rank 1 reads label l at column l - 3: the wrong logit, and label 7 outside its columns.
    let v = verdict(&|d| edit_rank(d, 1, OFFSET, &|l| with_literal(l, ROWS - 1)));
    assert_ne!(v, "proved");
}

/// Replaces rank `rank`'s per-token loss line by `lines` (which must define `sub_3`).
fn per_token(d: &Path, rank: usize, lines: &'static str) {
    edit_rank(d, rank, PER_TOKEN, &|_| lines.to_string());
}

#[test]
fn a_log_of_zero_on_one_labels_case_is_not_proved() {
    // Rank 1 adds `0 · log(S or 0)`, the 0 where the label is 3: 0 everywhere but on that
    // case, where `0 · -inf` is NaN.
    let v = verdict(&|d| {
        per_token(
            d,
            1,
            "        eq_rv: \"b8[4]\" = torch.ops.aten.eq.Scalar(view_15, 3)
        unsqueeze_rv: \"b8[4, 1]\" = torch.ops.aten.unsqueeze.default(eq_rv, 1)
        masked_fill_rv: \"f32[4, 1]\" = torch.ops.aten.masked_fill.Scalar(wait_tensor_5, unsqueeze_rv, 0.0)
        log_rv: \"f32[4, 1]\" = torch.ops.aten.log.default(masked_fill_rv)
        mul_rv: \"f32[4, 1]\" = torch.ops.aten.mul.Tensor(log_rv, 0.0)
        add_rv: \"f32[4, 1]\" = torch.ops.aten.add.Tensor(log, mul_rv)
        sub_3: \"f32[4, 1]\" = torch.ops.aten.sub.Tensor(add_rv, wait_tensor_4)",
        )
    });
    assert_ne!(v, "proved");
}

#[test]
fn quotients_of_a_positive_sum_and_of_a_possible_zero_are_never_proved_wrong() {
    // `S / S` of the exponentials' sum (positive) is 1; `m / m` of the all-reduced max is 1
    // except where the max is 0 (NaN).
    let v = verdict(&|d| {
        per_token(
            d,
            1,
            "        div_rv: \"f32[4, 1]\" = torch.ops.aten.div.Tensor(wait_tensor_5, wait_tensor_5)
        sub_rv: \"f32[4, 1]\" = torch.ops.aten.sub.Tensor(log, wait_tensor_4)
        sub_3: \"f32[4, 1]\" = torch.ops.aten.mul.Tensor(sub_rv, div_rv)",
        )
    });
    // Right, but not proved: the reciprocal's argument is rewritten with the exponentials'
    // shared shift (`1/S = exp(-C)/S'`), so `S·(1/S)` no longer meets one `X·(1/X)` to cancel;
    // the goal is past Z3's size. Never refuted.
    assert_ne!(v, "refuted");
    let v = verdict(&|d| {
        per_token(
            d,
            1,
            "        div_rv: \"f32[4, 1]\" = torch.ops.aten.div.Tensor(wait_tensor_3, wait_tensor_3)
        sub_rv: \"f32[4, 1]\" = torch.ops.aten.sub.Tensor(log, wait_tensor_4)
        sub_3: \"f32[4, 1]\" = torch.ops.aten.mul.Tensor(sub_rv, div_rv)",
        )
    });
    assert_ne!(v, "proved");
}

#[test]
fn an_inner_shard_edge_on_four_ranks_is_checked_on_both_sides() {
    // tp = 4, 16 classes: rank 2 holds [8, 12). Its lower edge one label late is a gap (label
    // 8 gets no logit); the last rank's upper edge past the range is still right.
    assert_eq!(verdict_on(4, &|_| {}), "proved");
    let gap = verdict_on(4, &|d| {
        edit_rank(d, 2, MASK_BELOW, &|l| with_literal(l, 2 * ROWS + 1))
    });
    assert_eq!(gap, "refuted");
    let past = verdict_on(4, &|d| {
        edit_rank(d, 3, MASK_ABOVE, &|l| with_literal(l, 4 * ROWS + 3))
    });
    assert_eq!(past, "proved");
}
