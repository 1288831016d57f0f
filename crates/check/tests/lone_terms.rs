//! A replicated term added to a partial on some ranks only (issue 44, soundness). A sum of the
//! pieces counts such a term once (Megatron's norm term), their average 1/n times: DeepSeek's
//! loss on cp adds the aux loss to each rank's token loss (`Partial(avg)`) on every rank, and a
//! rank that leaves it out makes the loss `ce + aux / n`. The checker cannot tell the two apart
//! where the term's expression crosses the ring attention (the ranks' graphs differ there), so
//! neither is a pass. Likewise every rank's share `b / n` of a term makes up `b` in a sum of
//! the pieces but `b / n` in their average.

mod common;

use common::plans::correct_plans;
use shardproof_check::{check_case, Verdict};

/// The DeepSeek `cp=2` forward plan, its rank 1 rewritten by `edit`, checked.
fn deepseek_cp_forward(edit: impl Fn(&str) -> String) -> shardproof_check::Report {
    let plan = correct_plans()
        .into_iter()
        .find(|p| p.model == "deepseek" && p.mesh == "cp=2" && p.forward_only)
        .expect("the DeepSeek cp=2 forward plan");
    let dir = tempfile::tempdir().unwrap();
    let case_path = plan.emit(dir.path()).unwrap();
    let r1 = dir.path().join("r1.py");
    let text = std::fs::read_to_string(&r1).unwrap();
    std::fs::write(&r1, edit(&text)).unwrap();
    check_case(&shardproof_case::load_case(&case_path).unwrap()).unwrap()
}

/// Rank 1 leaves the aux loss out of its local loss: the loss is `ce + aux / 2`. Not a pass
/// (held before: the add's lift took the term for one some ranks add alone, and the output
/// comparison counted it once).
#[test]
fn an_aux_loss_one_cp_rank_leaves_out_is_never_a_pass() {
    let add = "torch.ops.aten.add.Tensor(nll_loss, add_21)";
    let r = deepseek_cp_forward(|t| {
        assert!(t.contains(add), "the plan's local loss changed");
        t.replace(add, "torch.ops.aten.mul.Tensor(nll_loss, 1.0)")
    });
    assert_ne!(r.verdict, Verdict::Holds, "{}", r.render());
}

/// The correct plan holds: every rank adds the same aux loss (its expression matched up to the
/// all-reduced router counts, a collective whose region the output comparison checks) to its
/// `Partial(avg)` token loss (was inconclusive: the ranks' graphs differ below the all-reduce,
/// across the ring attention).
#[test]
fn the_correct_aux_loss_on_cp_holds() {
    let r = deepseek_cp_forward(|t| t.to_string());
    assert_eq!(r.verdict, Verdict::Holds, "{}", r.render());
}

/// Rank 1 adds its first layer's aux loss twice instead of both layers' (`add_21` reads other
/// inputs, so it has no peer node and the rules take it as replicated): the ranks add
/// different terms to their token losses. Not a pass: the add's peer comparison (up to the
/// all-reduced router counts) and the output comparison each refuse it.
#[test]
fn an_aux_loss_one_cp_rank_computes_otherwise_is_never_a_pass() {
    let sum = "torch.ops.aten.add.Tensor(aux_loss, aux_loss_1)";
    let r = deepseek_cp_forward(|t| {
        assert!(t.contains(sum), "the plan's aux loss changed");
        t.replace(sum, "torch.ops.aten.add.Tensor(aux_loss, aux_loss)")
    });
    assert_ne!(r.verdict, Verdict::Holds, "{}", r.render());
}

/// A local reduction of `x` (`reduce`: `mean` makes it `Partial(avg)` over dp, `sum`
/// `Partial(sum)`) plus the rank's term `bs = b_rank`, all-reduced and divided by 2 (a mean)
/// or not (a sum). Rank 1 adds the term only where `rank1_adds`. The spec computes
/// `reduce(x) + b`.
fn reduce_plus(reduce: &str, b_rank: &str, rank1_adds: bool) -> Verdict {
    let spec = common::hand::graph_module(
        &["x: \"f32[4, 8]\"".into(), "b: \"f32[]\"".into()],
        &[
            format!("m: \"f32[]\" = torch.ops.aten.{reduce}.default(x)"),
            "out: \"f32[]\" = torch.ops.aten.add.Tensor(m, b)".into(),
        ],
    );
    let finish = if reduce == "mean" {
        "out: \"f32[]\" = torch.ops.aten.div.Scalar(w, 2)"
    } else {
        "out: \"f32[]\" = torch.ops.aten.clone.default(w)"
    };
    let rank = |adds: bool| {
        common::hand::graph_module(
            &["x: \"f32[2, 8]\"".into(), "b: \"f32[]\"".into()],
            &[
                format!("m: \"f32[]\" = torch.ops.aten.{reduce}.default(x)"),
                format!("bs: \"f32[]\" = {b_rank}"),
                if adds {
                    "l: \"f32[]\" = torch.ops.aten.add.Tensor(m, bs)".into()
                } else {
                    "l: \"f32[]\" = torch.ops.aten.clone.default(m)".into()
                },
                "r: \"f32[]\" = torch.ops._c10d_functional.all_reduce.default(l, 'sum', 'dp')"
                    .into(),
                "w: \"f32[]\" = torch.ops._c10d_functional.wait_tensor.default(r)".into(),
                finish.into(),
            ],
        )
    };
    let case = "version: 1\nname: reduce-plus\nspec:\n  graph: spec.py\nimpl:\n  mesh: { dp: 2 }\n  graphs: [r0.py, r1.py]\ninputs:\n  x: { dp: Shard(0) }\n  b: Replicate()\noutputs:\n  out: Replicate()\n";
    common::hand::check_files(
        "reduce-plus",
        &[
            ("spec.py".into(), spec),
            ("r0.py".into(), rank(true)),
            ("r1.py".into(), rank(rank1_adds)),
            ("case.yaml".into(), case.into()),
        ],
    )
}

/// A local mean plus every rank's share `b / 2` of a replicated `b`: the loss is
/// `mean(x) + b / 2`, the spec's `mean(x) + b`. The "partial + replicate" finding (held
/// before s69: the share was read as a sum's).
#[test]
fn a_share_of_a_term_added_to_an_average_is_never_a_pass() {
    assert_eq!(
        reduce_plus("mean", "torch.ops.aten.div.Scalar(b, 2)", true),
        Verdict::Violated
    );
}

/// `mean(x_r) + b` on every rank, averaged: the average plus `b`, the spec's loss. Holds (was
/// the false finding "partial + replicate").
#[test]
fn a_term_every_rank_adds_to_an_average_holds() {
    assert_eq!(
        reduce_plus("mean", "torch.ops.aten.clone.default(b)", true),
        Verdict::Holds
    );
}

/// `sum(x_r) + b` on every rank, summed: the sum plus `2 b`. Stays the finding.
#[test]
fn a_term_every_rank_adds_to_a_sum_is_a_finding() {
    assert_eq!(
        reduce_plus("sum", "torch.ops.aten.clone.default(b)", true),
        Verdict::Violated
    );
}

/// Rank 0 adds `b` to its mean, rank 1 computes `b` but adds nothing: the average is
/// `mean(x) + b / 2`. Not a pass (the output comparison requires every member to add it).
#[test]
fn a_term_one_rank_adds_to_an_average_is_never_a_pass() {
    assert_ne!(
        reduce_plus("mean", "torch.ops.aten.clone.default(b)", false),
        Verdict::Holds
    );
}
