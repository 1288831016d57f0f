//! Review of the folded mean factor (`engine/scaling.rs`, issue 44): a rank's `mul` by a
//! number read as a share of mesh dim `m` where it is the spec's factor times the split of
//! the other mesh dims over `m`'s size (a local mean divided by n). Where the other mesh dims
//! split the value into as many pieces as `m` has coordinates, that ratio is 1: the rank's
//! factor is the spec's, which a program normalizing by the global batch and forgetting the
//! 1/n has too.
//!
//! Mesh `dp × tp` (2 × 2): the tokens `a [B, H]` sharded on dp, replicated on tp. The spec
//! computes `sum(neg(neg(neg(a))) * (1/B))`; each rank does so on its rows with its own factor,
//! then all-reduces over dp and over tp. Each program is run by the interpreter: a program
//! whose ranks are wrong must never hold.
//!
//! Both planted bugs held until the share recorded the other mesh dims whose local means it
//! rests on (`folded_pending`): dp's all-reduce sum of them refutes the share
//! (`folded_summed`), so tp's lift of it is not proven. `tests/piece_factors.rs` covers
//! more meshes, both orders of the reductions and the right programs.

use shardproof_check::Verdict;
use shardproof_ir::DType;
use shardproof_ops::{Meta, Tensor};
use std::collections::BTreeMap;

mod common;
use common::folded::{check_and_run, scaled_sum_graph, Folded};

/// Rows of the spec's tokens.
const B: usize = 8;
/// Hidden size.
const H: usize = 2;

/// What the checker and the interpreter say of the ranks' program: scaling by `factor`, then
/// all-reduce `dp_op` over dp and a sum over tp.
fn run(factor: f64, dp_op: &str, (dp, tp): (usize, usize)) -> (Verdict, bool, String) {
    let spec = scaled_sum_graph(
        (B, H),
        1.0 / B as f64,
        "        out: \"f64[]\" = torch.ops.aten.clone.default(l)\n",
    );
    let tail = format!(
        "        ar1: \"f64[]\" = torch.ops._c10d_functional.all_reduce.default(l, '{dp_op}', 'dp')
        w1: \"f64[]\" = torch.ops._c10d_functional.wait_tensor.default(ar1)
        ar2: \"f64[]\" = torch.ops._c10d_functional.all_reduce.default(w1, 'sum', 'tp')
        out: \"f64[]\" = torch.ops._c10d_functional.wait_tensor.default(ar2)
"
    );
    let rank = scaled_sum_graph((B / dp, H), factor, &tail);
    let folded = Folded {
        name: "folded-mean",
        mesh: &[("dp", dp), ("tp", tp)],
        inputs: &[("a", "{ dp: Shard(0) }".to_string())],
    };
    let data: Vec<f64> = (0..B * H).map(|i| 0.25 + i as f64 * 0.5).collect();
    let tensor =
        |rows: usize, d: &[f64]| Tensor::new(Meta::new(DType::F64, vec![rows, H]), d.to_vec());
    let leaves = BTreeMap::from([("a".to_string(), tensor(B, &data))]);
    let piece = B / dp * H;
    check_and_run(&folded, &spec, &rank, &leaves, |q| {
        let d = q / tp;
        BTreeMap::from([(
            "a".to_string(),
            tensor(B / dp, &data[d * piece..(d + 1) * piece]),
        )])
    })
}

#[test]
fn a_global_mean_that_forgets_the_tp_share_never_holds() {
    // Planted bug: each rank scales its rows by the spec's 1/B (the global batch) and forgets
    // the 1/tp; dp sums the pieces to the spec's value, tp sums two copies of it. The factor
    // is the spec's; the folded-mean reading took it as a local mean (2/B, dp's split)
    // divided by tp.
    let (verdict, right, report) = run(1.0 / B as f64, "sum", (2, 2));
    assert!(!right, "{report}");
    assert_ne!(verdict, Verdict::Holds, "{report}");
}

#[test]
fn a_local_mean_summed_over_dp_never_holds() {
    // Planted bug on dp = 4, tp = 2: each rank scales its rows by a local mean's factor over
    // tp (4/B / 2, twice the spec's 1/B, not 1/tp itself), then dp sums the local means instead of averaging
    // them. The factor is the spec's times dp's split over tp: read as a tp share, while dp's
    // pieces (a shard when scaled, a partial sum after) were read as the spec's.
    let (verdict, right, report) = run(2.0 / B as f64, "sum", (4, 2));
    assert!(!right, "{report}");
    assert_ne!(verdict, Verdict::Holds, "{report}");
}

#[test]
fn the_correct_normalizations_are_right() {
    // Controls: the interpreter shows these right (what check says of them is printed: a
    // local mean whose split the check cannot follow may be inconclusive).
    for (factor, op, mesh) in [
        (1.0 / (2 * B) as f64, "sum", (2, 2)),
        (1.0 / B as f64, "avg", (2, 2)),
        (2.0 / B as f64, "avg", (4, 2)),
        (1.0 / (2 * B) as f64, "sum", (4, 2)),
    ] {
        let (verdict, right, report) = run(factor, op, mesh);
        eprintln!("{factor} {op} {mesh:?}: {verdict:?}\n{report}");
        assert!(right, "{report}");
    }
}
