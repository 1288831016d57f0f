//! A share read by the folded mean (`engine/scaling.rs`, issue 44) rests on the other mesh
//! dims averaging their local means: a rank scaling its rows by the spec's factor times dp's
//! split over tp's size is read as a local mean divided by tp (a share on tp), which is right
//! only where dp averages the local means later. The checker records, per share, the mesh
//! dims whose local means are pending or were summed (`folded_pending`, `folded_summed`).
//!
//! Mesh `dp × tp`: the tokens `a [B, H]` sharded on dp, replicated on tp. The spec computes
//! `sum(neg(neg(neg(a))) * (1/B))`; each rank does so on its rows with its own factor, then
//! reduces over dp (an all-reduce sum, an average, or a sum divided by dp) and sums over tp,
//! in either order. Every program is run by the interpreter and compared with the spec: a
//! program whose ranks are wrong must never hold, and the right programs this reading covers
//! hold.

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

/// How the ranks reduce their scalar over dp.
#[derive(Clone, Copy, Debug)]
enum OverDp {
    /// An all-reduce sum.
    Sum,
    /// An all-reduce average.
    Avg,
    /// An all-reduce sum, then a division by this number (dp's size where right).
    SumThenDivide(usize),
    /// A division by this number (dp's size where right), then an all-reduce sum.
    DivideThenSum(usize),
}

/// A program: the ranks' factor, their reduction over dp, whether dp's reduction comes
/// before tp's sum, and the mesh `(dp, tp)`.
#[derive(Clone, Copy, Debug)]
struct Program {
    factor: f64,
    over_dp: OverDp,
    dp_first: bool,
    mesh: (usize, usize),
}

/// Lines reducing `input` over dp as `how`, defining `output` (names prefixed `tag`).
fn over_dp(how: OverDp, input: &str, output: &str, tag: &str) -> String {
    let all_reduce = |op: &str, to: &str| {
        format!(
            "        {tag}ar: \"f64[]\" = torch.ops._c10d_functional.all_reduce.default({input}, '{op}', 'dp')
        {to}: \"f64[]\" = torch.ops._c10d_functional.wait_tensor.default({tag}ar)
"
        )
    };
    match how {
        OverDp::Sum => all_reduce("sum", output),
        OverDp::Avg => all_reduce("avg", output),
        OverDp::DivideThenSum(n) => format!(
            "        {tag}q: \"f64[]\" = torch.ops.aten.div.Scalar({input}, {n})
        {tag}ar: \"f64[]\" = torch.ops._c10d_functional.all_reduce.default({tag}q, 'sum', 'dp')
        {output}: \"f64[]\" = torch.ops._c10d_functional.wait_tensor.default({tag}ar)
"
        ),
        OverDp::SumThenDivide(n) => format!(
            "{}        {output}: \"f64[]\" = torch.ops.aten.div.Scalar({tag}w, {n})
",
            all_reduce("sum", &format!("{tag}w"))
        ),
    }
}

/// Lines summing `input` over tp, defining `output` (names prefixed `tag`).
fn over_tp(input: &str, output: &str, tag: &str) -> String {
    format!(
        "        {tag}ar: \"f64[]\" = torch.ops._c10d_functional.all_reduce.default({input}, 'sum', 'tp')
        {output}: \"f64[]\" = torch.ops._c10d_functional.wait_tensor.default({tag}ar)
"
    )
}

/// What the checker and the interpreter say of `p`: the verdict, whether every rank's output
/// is the spec's, and the report.
fn run(p: Program) -> (Verdict, bool, String) {
    let tail = if p.dp_first {
        over_dp(p.over_dp, "l", "d", "d_") + &over_tp("d", "out", "t_")
    } else {
        over_tp("l", "t", "t_") + &over_dp(p.over_dp, "t", "out", "d_")
    };
    run_on((p.mesh.0, p.mesh.1, 1), p.factor, &tail)
}

/// What the checker and the interpreter say of ranks on mesh `dp × tp` (`× xs` where `xs` >
/// 1, a mesh dim the tokens are replicated on) scaling by `factor`, followed by `tail`.
fn run_on((dp, tp, xs): (usize, usize, usize), factor: f64, tail: &str) -> (Verdict, bool, String) {
    let spec = scaled_sum_graph(
        (B, H),
        1.0 / B as f64,
        "        out: \"f64[]\" = torch.ops.aten.clone.default(l)\n",
    );
    let rank = scaled_sum_graph((B / dp, H), factor, tail);
    let mesh: &[(&str, usize)] = if xs > 1 {
        &[("dp", dp), ("tp", tp), ("xs", xs)]
    } else {
        &[("dp", dp), ("tp", tp)]
    };
    let folded = Folded {
        name: "piece-factors",
        mesh,
        inputs: &[("a", "{ dp: Shard(0) }".to_string())],
    };
    let data: Vec<f64> = (0..B * H).map(|i| 0.25 + i as f64 * 0.5).collect();
    let tensor =
        |rows: usize, d: &[f64]| Tensor::new(Meta::new(DType::F64, vec![rows, H]), d.to_vec());
    let leaves = BTreeMap::from([("a".to_string(), tensor(B, &data))]);
    let piece = B / dp * H;
    check_and_run(&folded, &spec, &rank, &leaves, |q| {
        let d = q / (tp * xs);
        BTreeMap::from([(
            "a".to_string(),
            tensor(B / dp, &data[d * piece..(d + 1) * piece]),
        )])
    })
}

/// A local mean divided by tp: the rank's factor is its split of the rows over `B`, over tp.
fn local_mean_share((dp, tp): (usize, usize)) -> f64 {
    dp as f64 / B as f64 / tp as f64
}

/// Asserts the interpreter finds `p` wrong and the checker does not say it holds.
fn wrong_never_holds(p: Program) {
    let (verdict, right, report) = run(p);
    assert!(!right, "{p:?} is right when run\n{report}");
    assert_ne!(verdict, Verdict::Holds, "{p:?}\n{report}");
}

/// Asserts the interpreter finds `p` right and the checker says it holds.
fn right_holds(p: Program) {
    let (verdict, right, report) = run(p);
    assert!(right, "{p:?} is wrong when run\n{report}");
    assert_eq!(verdict, Verdict::Holds, "{p:?}\n{report}");
}

/// Asserts the interpreter finds `p` right and the checker finds nothing wrong in it (it
/// may be inconclusive, but not because its share was refuted).
fn right_is_no_finding(p: Program) {
    let (verdict, right, report) = run(p);
    eprintln!("{p:?}: {verdict:?}\n{report}");
    assert!(right, "{p:?} is wrong when run\n{report}");
    assert_ne!(verdict, Verdict::Violated, "{p:?}\n{report}");
    assert!(!report.contains(REFUTED), "{p:?}\n{report}");
}

/// The words of a share whose local means were summed (`engine::mod`).
const REFUTED: &str = "not averaged: the share is not proven";

#[test]
fn local_means_summed_over_dp_never_hold() {
    // dp = 4 x tp = 2 and dp = 2 x tp = 4 (the factor is the spec's times 2 and times 1/2),
    // and dp = 2 x tp = 2 (the spec's factor itself): dp sums the local means, before or after
    // tp's sum.
    for mesh in [(4, 2), (2, 4), (2, 2)] {
        for dp_first in [true, false] {
            wrong_never_holds(Program {
                factor: local_mean_share(mesh),
                over_dp: OverDp::Sum,
                dp_first,
                mesh,
            });
        }
    }
}

#[test]
fn a_global_mean_that_forgets_the_tp_share_never_holds() {
    // The spec's 1/B on dp = 2 x tp = 2 is a local mean over tp too: summed over dp (the
    // global mean), then over tp, it is tp times the spec's; in either order.
    for dp_first in [true, false] {
        wrong_never_holds(Program {
            factor: 1.0 / B as f64,
            over_dp: OverDp::Sum,
            dp_first,
            mesh: (2, 2),
        });
    }
}

#[test]
fn local_means_averaged_after_the_tp_sum_hold() {
    // The share summed over tp first: dp's pieces are then a partial that averages, which
    // dp's average (or its sum divided by dp) completes.
    for mesh in [(4, 2), (2, 4), (2, 2)] {
        for over_dp in [OverDp::Avg, OverDp::SumThenDivide(mesh.0)] {
            right_holds(Program {
                factor: local_mean_share(mesh),
                over_dp,
                dp_first: false,
                mesh,
            });
        }
    }
}

#[test]
fn local_means_averaged_before_the_tp_sum_are_no_finding() {
    // dp's reduction first: the share's pending dp is settled by the average (or the sum and
    // the division by dp) before tp lifts it. dp's own lane reads an average of a partial sum
    // (the shard's factor is not read there), so these may stay inconclusive, never a finding.
    for mesh in [(4, 2), (2, 4), (2, 2)] {
        for over_dp in [OverDp::Avg, OverDp::SumThenDivide(mesh.0)] {
            right_is_no_finding(Program {
                factor: local_mean_share(mesh),
                over_dp,
                dp_first: true,
                mesh,
            });
        }
    }
}

#[test]
fn a_local_mean_summed_over_dp_and_divided_by_another_size_never_holds() {
    // dp = 4 x tp = 2: the local means summed over dp and divided by tp's size (2), not dp's
    // (4): the division makes up for no dp of that size.
    for dp_first in [true, false] {
        wrong_never_holds(Program {
            factor: local_mean_share((4, 2)),
            over_dp: OverDp::SumThenDivide(2),
            dp_first,
            mesh: (4, 2),
        });
    }
}

#[test]
fn local_means_divided_by_dp_before_the_sum_are_no_finding() {
    // Each rank divides its local mean by dp's size, then dp sums: the average.
    for mesh in [(4, 2), (2, 4), (2, 2)] {
        for dp_first in [true, false] {
            right_is_no_finding(Program {
                factor: local_mean_share(mesh),
                over_dp: OverDp::DivideThenSum(mesh.0),
                dp_first,
                mesh,
            });
        }
    }
}

#[test]
fn local_means_divided_by_another_size_before_the_sum_never_hold() {
    // dp = 4 x tp = 2: divided by tp's size (2), not dp's (4), then summed over dp.
    for dp_first in [true, false] {
        wrong_never_holds(Program {
            factor: local_mean_share((4, 2)),
            over_dp: OverDp::DivideThenSum(2),
            dp_first,
            mesh: (4, 2),
        });
    }
}

#[test]
fn an_average_over_another_mesh_dim_settles_no_local_mean_of_dp() {
    // Mesh dp = 2 x tp = 2 x xs = 2, the tokens replicated on xs: an average over xs (of
    // copies: the identity) does not average dp's local means, which dp then sums.
    let tail =
        "        x_ar: \"f64[]\" = torch.ops._c10d_functional.all_reduce.default(l, 'avg', 'xs')
        x_w: \"f64[]\" = torch.ops._c10d_functional.wait_tensor.default(x_ar)
        d_ar: \"f64[]\" = torch.ops._c10d_functional.all_reduce.default(x_w, 'sum', 'dp')
        d: \"f64[]\" = torch.ops._c10d_functional.wait_tensor.default(d_ar)
        t_ar: \"f64[]\" = torch.ops._c10d_functional.all_reduce.default(d, 'sum', 'tp')
        out: \"f64[]\" = torch.ops._c10d_functional.wait_tensor.default(t_ar)
";
    let (verdict, right, report) = run_on((2, 2, 2), local_mean_share((2, 2)), tail);
    assert!(!right, "{report}");
    assert_ne!(verdict, Verdict::Holds, "{report}");
}

#[test]
fn local_means_gathered_over_dp_never_hold() {
    // dp = 2 x tp = 2: the scaled rows (each a local mean's factor over tp) gathered over dp,
    // summed, then summed over tp: the gathered pieces are each dp times the spec's, so the
    // total is dp times the spec's value. (A gather carries no share on tp: tp's sum is of a
    // replicated value, a finding.)
    let tail = format!(
        "        g_ag: \"f64[{B}, {H}]\" = torch.ops._c10d_functional.all_gather_into_tensor.default(m, 2, 'dp')
        g: \"f64[{B}, {H}]\" = torch.ops._c10d_functional.wait_tensor.default(g_ag)
        s: \"f64[]\" = torch.ops.aten.sum.default(g)
        t_ar: \"f64[]\" = torch.ops._c10d_functional.all_reduce.default(s, 'sum', 'tp')
        out: \"f64[]\" = torch.ops._c10d_functional.wait_tensor.default(t_ar)
"
    );
    let (verdict, right, report) = run_on((2, 2, 1), local_mean_share((2, 2)), &tail);
    assert!(!right, "{report}");
    assert_ne!(verdict, Verdict::Holds, "{report}");
}

#[test]
fn local_means_averaged_twice_never_hold() {
    // dp = 4 x tp = 2: each rank takes the mean of its scaled rows (dp's pieces then average,
    // `Partial(avg)`), sums over tp and averages over dp. The factor already was a local
    // mean's, so the mean divides by the rank's elements once more: wrong. The share's lift
    // finds dp's pieces averaging, which the pending local means cannot be carried into.
    let tail = "        mn: \"f64[]\" = torch.ops.aten.mean.default(m)
        t_ar: \"f64[]\" = torch.ops._c10d_functional.all_reduce.default(mn, 'sum', 'tp')
        t: \"f64[]\" = torch.ops._c10d_functional.wait_tensor.default(t_ar)
        d_ar: \"f64[]\" = torch.ops._c10d_functional.all_reduce.default(t, 'avg', 'dp')
        out: \"f64[]\" = torch.ops._c10d_functional.wait_tensor.default(d_ar)
";
    let (verdict, right, report) = run_on((4, 2, 1), local_mean_share((4, 2)), tail);
    assert!(!right, "{report}");
    assert_ne!(verdict, Verdict::Holds, "{report}");
}

#[test]
fn a_global_mean_divided_by_tp_summed_over_dp_holds() {
    // The spec's 1/B over tp (the global batch's mean, each rank's share on tp): dp sums the
    // pieces (each the spec's), tp the shares; in either order. Was a false finding (tp's
    // all-reduce of a value taken as replicated, not a share).
    for mesh in [(4, 2), (2, 4), (2, 2)] {
        for dp_first in [true, false] {
            right_holds(Program {
                factor: 1.0 / B as f64 / mesh.1 as f64,
                over_dp: OverDp::Sum,
                dp_first,
                mesh,
            });
        }
    }
}

#[test]
fn a_global_mean_divided_by_tp_and_averaged_over_dp_never_holds() {
    // The same share averaged over dp instead: dp's pieces are the spec's, so their average
    // is 1/dp of it.
    for mesh in [(4, 2), (2, 4), (2, 2)] {
        for dp_first in [true, false] {
            wrong_never_holds(Program {
                factor: 1.0 / B as f64 / mesh.1 as f64,
                over_dp: OverDp::Avg,
                dp_first,
                mesh,
            });
        }
    }
}
