//! Adversarial review of the folded mean's share tracking (`engine/scaling.rs`
//! `folded_share`, `consumed_folded`; `engine/local_means.rs` `commit_folded`; issue 44).
//!
//! The spec computes `sum(neg(neg(neg(a))) * (1/B))` on tokens `a [B, C]`. Each rank does the
//! same on its piece of `a` (sharded on dp, and on cp where the mesh has one) with its own
//! factor, then reduces in the order a test gives. Every program is run by the interpreter
//! and compared with the spec: a program whose ranks are wrong must never hold; a right one
//! is asserted to hold where the checker follows it, and else never to be a finding.

use shardproof_check::Verdict;
use shardproof_ir::DType;
use shardproof_ops::{Meta, Tensor};
use std::collections::BTreeMap;

mod common;
use common::folded::{check_and_run, Folded};

/// Rows of the spec's tokens.
const B: usize = 8;
/// Columns of the spec's tokens (the axis cp shards).
const C: usize = 4;

/// The spec's factor.
const SPEC: f64 = 1.0 / B as f64;

/// A mesh: its dims (name, size), and the tensor axis each dim shards `a` on (`None`:
/// replicated).
struct Mesh<'a>(&'a [(&'a str, usize, Option<usize>)]);

impl Mesh<'_> {
    /// The local shape of `a` on a rank.
    fn local(&self) -> (usize, usize) {
        let mut shape = [B, C];
        for &(_, n, axis) in self.0 {
            if let Some(x) = axis {
                shape[x] /= n;
            }
        }
        (shape[0], shape[1])
    }

    /// The number of ranks.
    fn ranks(&self) -> usize {
        self.0.iter().map(|d| d.1).product()
    }

    /// Rank `q`'s piece of `data` (`[B, C]` row-major), ranks row-major over the mesh dims.
    fn piece(&self, q: usize, data: &[f64]) -> Vec<f64> {
        let (mut r0, mut c0) = (0, 0);
        let (mut rows, mut cols) = (B, C);
        let mut stride = self.ranks();
        for &(_, n, axis) in self.0 {
            stride /= n;
            let coord = (q / stride) % n;
            match axis {
                Some(0) => {
                    rows /= n;
                    r0 += coord * rows;
                }
                Some(1) => {
                    cols /= n;
                    c0 += coord * cols;
                }
                _ => {}
            }
        }
        (r0..r0 + rows)
            .flat_map(|r| (c0..c0 + cols).map(move |c| data[r * C + c]))
            .collect()
    }
}

/// The graph reading `a` of shape `(r, c)` and running `body` (lines defining `out`).
fn graph((r, c): (usize, usize), body: &str) -> String {
    format!(
        "class G(torch.nn.Module):
    def forward(self, a: \"f64[{r}, {c}]\"):
{body}        return (out,)
"
    )
}

/// Lines scaling the rank's tokens by `factor` into `m` (`f64[r, c]`).
fn scale((r, c): (usize, usize), factor: f64) -> String {
    format!(
        "        t1: \"f64[{r}, {c}]\" = torch.ops.aten.neg.default(a)
        t2: \"f64[{r}, {c}]\" = torch.ops.aten.neg.default(t1)
        t3: \"f64[{r}, {c}]\" = torch.ops.aten.neg.default(t2)
        m: \"f64[{r}, {c}]\" = torch.ops.aten.mul.Tensor(t3, {factor:?})
"
    )
}

/// Lines scaling the rank's tokens by `factor` and summing the scaled rows over tp into `g`
/// (`f64[r, c]`): the share lifted while dp still shards it.
fn lifted_over_tp((r, c): (usize, usize), factor: f64) -> String {
    scale((r, c), factor) + &ar("m", "sum", "tp", "g", &format!("f64[{r}, {c}]"))
}

/// Lines summing `input` to the scalar `output`.
fn sum(input: &str, output: &str) -> String {
    format!("        {output}: \"f64[]\" = torch.ops.aten.sum.default({input})\n")
}

/// Lines of an all-reduce `op` of `input` (type `ty`) over `group`, defining `output`.
fn ar(input: &str, op: &str, group: &str, output: &str, ty: &str) -> String {
    format!(
        "        {output}_ar: \"{ty}\" = torch.ops._c10d_functional.all_reduce.default({input}, '{op}', '{group}')
        {output}: \"{ty}\" = torch.ops._c10d_functional.wait_tensor.default({output}_ar)
"
    )
}

/// Lines of an all-reduce `op` of the scalar `input` over `group`, defining `output`.
fn ar0(input: &str, op: &str, group: &str, output: &str) -> String {
    ar(input, op, group, output, "f64[]")
}

/// Lines of `op` (`div.Scalar`, `mul.Tensor`) of scalar `input` by `x`, defining `output`.
fn scalar(op: &str, input: &str, x: f64, output: &str) -> String {
    format!("        {output}: \"f64[]\" = torch.ops.aten.{op}({input}, {x:?})\n")
}

/// The spec's last line: `out` is `l`.
const SPEC_OUT: &str = "        out: \"f64[]\" = torch.ops.aten.clone.default(l)\n";

/// What the checker and the interpreter say of ranks on `mesh` running `body`: the
/// verdict, whether every rank's `out` is the spec's, and the report.
fn run(mesh: &Mesh, body: &str) -> (Verdict, bool, String) {
    run_against(SPEC_OUT, mesh, body)
}

/// As [`run`], against a spec whose last lines (`spec_out`, reading `l`) define `out`.
fn run_against(spec_out: &str, mesh: &Mesh, body: &str) -> (Verdict, bool, String) {
    let spec_body = scale((B, C), SPEC) + &sum("m", "l") + spec_out;
    let spec = graph((B, C), &spec_body);
    let rank = graph(mesh.local(), body);
    let dims: Vec<(&str, usize)> = mesh.0.iter().map(|d| (d.0, d.1)).collect();
    let placement: Vec<String> = mesh
        .0
        .iter()
        .filter_map(|d| d.2.map(|x| format!("{}: Shard({x})", d.0)))
        .collect();
    let folded = Folded {
        name: "review-piece-factors",
        mesh: &dims,
        inputs: &[("a", format!("{{ {} }}", placement.join(", ")))],
    };
    let data: Vec<f64> = (0..B * C).map(|i| 0.25 + i as f64 * 0.5).collect();
    let tensor =
        |(r, c): (usize, usize), d: Vec<f64>| Tensor::new(Meta::new(DType::F64, vec![r, c]), d);
    let leaves = BTreeMap::from([("a".to_string(), tensor((B, C), data.clone()))]);
    check_and_run(&folded, &spec, &rank, &leaves, |q| {
        BTreeMap::from([("a".to_string(), tensor(mesh.local(), mesh.piece(q, &data)))])
    })
}

/// Asserts the interpreter finds the program wrong and the checker does not say it holds.
fn wrong_never_holds(what: &str, mesh: &Mesh, body: &str) {
    wrong_never_holds_against(SPEC_OUT, what, mesh, body);
}

/// As [`wrong_never_holds`], against a spec whose last lines are `spec_out`.
fn wrong_never_holds_against(spec_out: &str, what: &str, mesh: &Mesh, body: &str) {
    let (verdict, right, report) = run_against(spec_out, mesh, body);
    eprintln!("{what}: {verdict:?} (right: {right})\n{report}");
    assert!(!right, "{what} is right when run\n{report}");
    assert_ne!(verdict, Verdict::Holds, "{what}\n{report}");
}

/// Asserts the interpreter finds the program right and the checker says it holds.
fn right_holds(what: &str, mesh: &Mesh, body: &str) {
    let (verdict, right, report) = run(mesh, body);
    eprintln!("{what}: {verdict:?} (right: {right})\n{report}");
    assert!(right, "{what} is wrong when run\n{report}");
    assert_eq!(verdict, Verdict::Holds, "{what}\n{report}");
}

/// Asserts the interpreter finds the program right and the checker finds nothing wrong.
fn right_is_no_finding(what: &str, mesh: &Mesh, body: &str) {
    right_is_no_finding_against(SPEC_OUT, what, mesh, body);
}

/// As [`right_is_no_finding`], against a spec whose last lines are `spec_out`.
fn right_is_no_finding_against(spec_out: &str, what: &str, mesh: &Mesh, body: &str) {
    let (verdict, right, report) = run_against(spec_out, mesh, body);
    eprintln!("{what}: {verdict:?} (right: {right})\n{report}");
    assert!(right, "{what} is wrong when run\n{report}");
    assert_ne!(verdict, Verdict::Violated, "{what}\n{report}");
}

/// Mesh `dp × tp`, `a` sharded on dp.
fn dp_tp(dp: usize, tp: usize) -> [(&'static str, usize, Option<usize>); 2] {
    [("dp", dp, Some(0)), ("tp", tp, None)]
}

/// A local mean over dp divided by tp: the spec's factor times dp's split, over tp.
fn local_mean_share(dp: usize, tp: usize) -> f64 {
    SPEC * dp as f64 / tp as f64
}

#[test]
fn a_share_lifted_while_sharded_then_summed_over_dp_never_holds() {
    // The shard branch of `commit_folded`: tp sums the scaled rows themselves (dp still a
    // shard, whose pending local means are "left as the rules read it"); each rank then sums
    // its rows and dp sums the local means instead of averaging them. On 2 x 2 the factor is
    // the spec's own (a global mean forgetting the 1/tp) and holds too.
    for (dp, tp) in [(4, 2), (2, 4), (2, 2)] {
        let mesh = dp_tp(dp, tp);
        let mesh = Mesh(&mesh);
        let (r, c) = mesh.local();
        let body = lifted_over_tp((r, c), local_mean_share(dp, tp))
            + &sum("g", "l")
            + &ar0("l", "sum", "dp", "out");
        wrong_never_holds(&format!("shard lift, dp sum, {dp}x{tp}"), &mesh, &body);
    }
}

#[test]
fn a_share_lifted_while_sharded_then_averaged_over_dp_is_right() {
    // The control: dp averages the local means. Inconclusive today (dp's average of what the
    // rules read as a partial sum is `Varying`), never a finding.
    for (dp, tp) in [(4, 2), (2, 4), (2, 2)] {
        let mesh = dp_tp(dp, tp);
        let mesh = Mesh(&mesh);
        let (r, c) = mesh.local();
        let body = lifted_over_tp((r, c), local_mean_share(dp, tp))
            + &sum("g", "l")
            + &ar0("l", "avg", "dp", "out");
        right_is_no_finding(&format!("shard lift, dp avg, {dp}x{tp}"), &mesh, &body);
    }
}

#[test]
fn a_share_lifted_while_sharded_then_gathered_over_dp_never_holds() {
    // tp sums the scaled rows, dp gathers them (each dp times the spec's), each rank sums.
    for (dp, tp) in [(4, 2), (2, 2)] {
        let mesh = dp_tp(dp, tp);
        let mesh = Mesh(&mesh);
        let (r, c) = mesh.local();
        let body = lifted_over_tp((r, c), local_mean_share(dp, tp))
            + &format!(
                "        ag: \"f64[{B}, {c}]\" = torch.ops._c10d_functional.all_gather_into_tensor.default(g, {dp}, 'dp')
        full: \"f64[{B}, {c}]\" = torch.ops._c10d_functional.wait_tensor.default(ag)
"
            )
            + &sum("full", "out");
        wrong_never_holds(&format!("shard lift, dp gather, {dp}x{tp}"), &mesh, &body);
    }
}

#[test]
fn a_share_lifted_while_sharded_then_divided_by_the_wrong_size_never_holds() {
    // dp = 4 x tp = 2: after tp's sum of the rows, dp sums the local means and divides by
    // tp's size (2), not dp's (4).
    let mesh = dp_tp(4, 2);
    let mesh = Mesh(&mesh);
    let (r, c) = mesh.local();
    let body = lifted_over_tp((r, c), local_mean_share(4, 2))
        + &sum("g", "l")
        + &ar0("l", "sum", "dp", "d")
        + &scalar("div.Scalar", "d", 2.0, "out");
    wrong_never_holds("shard lift, dp sum / 2, 4x2", &mesh, &body);
}

#[test]
fn an_average_over_dp_followed_by_another_sum_over_dp_never_holds() {
    // The local means averaged over dp (settling them), then summed over dp once more.
    for (dp, tp) in [(4, 2), (2, 2)] {
        let mesh = dp_tp(dp, tp);
        let mesh = Mesh(&mesh);
        let (r, c) = mesh.local();
        for tp_first in [true, false] {
            let reduce = |input: &str, output: &str| {
                ar0(input, "avg", "dp", &format!("{output}_a"))
                    + &ar0(&format!("{output}_a"), "sum", "dp", output)
            };
            let body = scale((r, c), local_mean_share(dp, tp))
                + &sum("m", "l")
                + &if tp_first {
                    ar0("l", "sum", "tp", "t") + &reduce("t", "out")
                } else {
                    reduce("l", "d") + &ar0("d", "sum", "tp", "out")
                };
            wrong_never_holds(
                &format!("dp avg then dp sum, tp first {tp_first}, {dp}x{tp}"),
                &mesh,
                &body,
            );
        }
    }
}

#[test]
fn the_factor_applied_after_the_tp_sum_never_holds_when_dp_sums() {
    // The scaling moved past tp's all-reduce: each rank sums its unscaled rows, tp sums the
    // tp copies (tp times the local sum), the rank multiplies by the local mean's factor
    // over tp, then dp sums the local means: wrong. (With dp's average it is right, and a
    // `comm-legality` finding: tp's all-reduce of a replicated value is one whatever follows.)
    for (dp, tp) in [(4, 2), (2, 2)] {
        let mesh = dp_tp(dp, tp);
        let mesh = Mesh(&mesh);
        let (r, c) = mesh.local();
        let body = format!(
            "        t1: \"f64[{r}, {c}]\" = torch.ops.aten.neg.default(a)
        t2: \"f64[{r}, {c}]\" = torch.ops.aten.neg.default(t1)
        t3: \"f64[{r}, {c}]\" = torch.ops.aten.neg.default(t2)
"
        ) + &sum("t3", "l")
            + &ar0("l", "sum", "tp", "t")
            + &scalar("mul.Tensor", "t", local_mean_share(dp, tp), "s")
            + &ar0("s", "sum", "dp", "out");
        wrong_never_holds(
            &format!("factor after tp sum, dp sum, {dp}x{tp}"),
            &mesh,
            &body,
        );
    }
}

#[test]
fn a_factor_split_in_two_products_averaged_over_dp_is_no_finding() {
    // dp = 4 x tp = 2: the local mean's factor over tp (2/B) applied as 4/B (dp's local mean)
    // and then 1/2 (tp's share, a plain division by n that records no local means); dp
    // averages the local means: right. (With dp's sum it is wrong and holds: the 4/B where
    // the spec has 1/B changes no placement, a value difference as `y = x * 4` is, which
    // `check` does not claim; `verify`, `prove` and `run` do.)
    let mesh = dp_tp(4, 2);
    let mesh = Mesh(&mesh);
    let (r, c) = mesh.local();
    for tp_first in [true, false] {
        let body = scale((r, c), SPEC * 4.0)
            + &format!("        h: \"f64[{r}, {c}]\" = torch.ops.aten.mul.Tensor(m, 0.5)\n")
            + &sum("h", "l")
            + &if tp_first {
                ar0("l", "sum", "tp", "t") + &ar0("t", "avg", "dp", "out")
            } else {
                ar0("l", "avg", "dp", "d") + &ar0("d", "sum", "tp", "out")
            };
        right_is_no_finding(
            &format!("split factor, dp avg, tp first {tp_first}"),
            &mesh,
            &body,
        );
    }
}

#[test]
fn the_share_through_views_and_copies_keeps_its_local_means() {
    // The scaled rows pass a clone, a transpose and a view before the sum: the pending local
    // means must survive them; dp then sums them (wrong) or averages them (right, and holds:
    // tp's lift turns dp's partial sum into a partial average).
    for (dp, tp) in [(4, 2), (2, 2)] {
        let mesh = dp_tp(dp, tp);
        let mesh = Mesh(&mesh);
        let (r, c) = mesh.local();
        for (op, right) in [("avg", true), ("sum", false)] {
            let body = scale((r, c), local_mean_share(dp, tp))
                + &format!(
                    "        k: \"f64[{r}, {c}]\" = torch.ops.aten.clone.default(m)
        tr: \"f64[{c}, {r}]\" = torch.ops.aten.t.default(k)
        v: \"f64[{n}]\" = torch.ops.aten.view.default(tr, [{n}])
",
                    n = r * c
                )
                + &sum("v", "l")
                + &ar0("l", "sum", "tp", "t")
                + &ar0("t", op, "dp", "out");
            let what = format!("through views, dp {op}, {dp}x{tp}");
            if right {
                right_holds(&what, &mesh, &body);
            } else {
                wrong_never_holds(&what, &mesh, &body);
            }
        }
    }
}

#[test]
fn the_scalar_share_through_copies_keeps_its_local_means() {
    // The summed share passes clones and a mul by 1 before dp sums it, then tp lifts it.
    for (dp, tp) in [(4, 2), (2, 2)] {
        let mesh = dp_tp(dp, tp);
        let mesh = Mesh(&mesh);
        let (r, c) = mesh.local();
        let body = scale((r, c), local_mean_share(dp, tp))
            + &sum("m", "l")
            + "        k1: \"f64[]\" = torch.ops.aten.clone.default(l)\n"
            + &scalar("mul.Tensor", "k1", 1.0, "k2")
            + &ar0("k2", "sum", "dp", "d")
            + "        k3: \"f64[]\" = torch.ops.aten.clone.default(d)\n"
            + &ar0("k3", "sum", "tp", "out");
        wrong_never_holds(&format!("scalar copies, dp sum, {dp}x{tp}"), &mesh, &body);
    }
}

/// The spec's last line where `out` is `l + l`.
const SPEC_TWICE: &str = "        out: \"f64[]\" = torch.ops.aten.add.Tensor(l, l)\n";

/// Lines reducing the share `l` twice, `x` by dp's `x_op` and `y` by dp's `y_op`, each
/// summed over tp (first where `tp_first`), and adding them into `out`.
fn twice(x_op: &str, y_op: &str, tp_first: bool) -> String {
    let reduced = if tp_first {
        ar0("l", "sum", "tp", "t") + &ar0("t", x_op, "dp", "x") + &ar0("t", y_op, "dp", "y")
    } else {
        ar0("l", x_op, "dp", "xd")
            + &ar0("l", y_op, "dp", "yd")
            + &ar0("xd", "sum", "tp", "x")
            + &ar0("yd", "sum", "tp", "y")
    };
    reduced + "        out: \"f64[]\" = torch.ops.aten.add.Tensor(x, y)\n"
}

#[test]
fn the_same_share_summed_once_and_averaged_once_never_holds() {
    // The spec computes `l + l`; the ranks use one share twice: dp averages one copy and
    // sums the other, each summed over tp, in either order.
    for (dp, tp) in [(4, 2), (2, 2)] {
        let mesh = dp_tp(dp, tp);
        let mesh = Mesh(&mesh);
        let (r, c) = mesh.local();
        for tp_first in [true, false] {
            let body = scale((r, c), local_mean_share(dp, tp))
                + &sum("m", "l")
                + &twice("avg", "sum", tp_first);
            let what = format!("summed once, averaged once, tp first {tp_first}, {dp}x{tp}");
            wrong_never_holds_against(SPEC_TWICE, &what, &mesh, &body);
        }
    }
}

#[test]
fn the_same_share_averaged_twice_is_right() {
    // The control: both copies averaged over dp.
    for (dp, tp) in [(4, 2), (2, 2)] {
        let mesh = dp_tp(dp, tp);
        let mesh = Mesh(&mesh);
        let (r, c) = mesh.local();
        for tp_first in [true, false] {
            let body = scale((r, c), local_mean_share(dp, tp))
                + &sum("m", "l")
                + &twice("avg", "avg", tp_first);
            let what = format!("averaged twice, tp first {tp_first}, {dp}x{tp}");
            right_is_no_finding_against(SPEC_TWICE, &what, &mesh, &body);
        }
    }
}

/// Mesh `dp × cp × tp`, `a` sharded on dp (rows) and cp (columns).
fn dp_cp_tp(dp: usize, cp: usize, tp: usize) -> [(&'static str, usize, Option<usize>); 3] {
    [("dp", dp, Some(0)), ("cp", cp, Some(1)), ("tp", tp, None)]
}

#[test]
fn a_mean_folded_over_two_dims_summed_over_one_never_holds() {
    // dp = 2 x cp = 2 x tp = 2: the factor is the spec's times dp's and cp's splits, over
    // tp. One of dp, cp sums its local means, the other averages them; tp sums, in every
    // order.
    let mesh = dp_cp_tp(2, 2, 2);
    let mesh = Mesh(&mesh);
    let (r, c) = mesh.local();
    let factor = SPEC * 4.0 / 2.0;
    for (dp_op, cp_op) in [("sum", "avg"), ("avg", "sum"), ("sum", "sum")] {
        for order in [["dp", "cp", "tp"], ["tp", "dp", "cp"], ["cp", "tp", "dp"]] {
            let mut body = scale((r, c), factor) + &sum("m", "l0");
            for (i, g) in order.iter().enumerate() {
                let op = match *g {
                    "dp" => dp_op,
                    "cp" => cp_op,
                    _ => "sum",
                };
                let out = if i == 2 {
                    "out".to_string()
                } else {
                    format!("l{}", i + 1)
                };
                body += &ar0(&format!("l{i}"), op, g, &out);
            }
            wrong_never_holds(
                &format!("dp {dp_op}, cp {cp_op}, order {order:?}"),
                &mesh,
                &body,
            );
        }
    }
}

#[test]
fn a_mean_folded_over_two_dims_averaged_over_both_is_right() {
    // The control: dp and cp average their local means.
    let mesh = dp_cp_tp(2, 2, 2);
    let mesh = Mesh(&mesh);
    let (r, c) = mesh.local();
    let factor = SPEC * 4.0 / 2.0;
    for order in [["dp", "cp", "tp"], ["tp", "dp", "cp"], ["cp", "tp", "dp"]] {
        let mut body = scale((r, c), factor) + &sum("m", "l0");
        for (i, g) in order.iter().enumerate() {
            let op = if *g == "tp" { "sum" } else { "avg" };
            let out = if i == 2 {
                "out".to_string()
            } else {
                format!("l{}", i + 1)
            };
            body += &ar0(&format!("l{i}"), op, g, &out);
        }
        right_is_no_finding(&format!("dp avg, cp avg, order {order:?}"), &mesh, &body);
    }
}

#[test]
fn a_mean_folded_over_two_dims_divided_once_never_holds() {
    // dp = 2 x cp = 2 x tp = 2: both dp and cp sum the local means; one division by 2 makes
    // up for one of them only.
    let mesh = dp_cp_tp(2, 2, 2);
    let mesh = Mesh(&mesh);
    let (r, c) = mesh.local();
    let factor = SPEC * 4.0 / 2.0;
    let body = scale((r, c), factor)
        + &sum("m", "l")
        + &ar0("l", "sum", "dp", "d")
        + &ar0("d", "sum", "cp", "e")
        + &scalar("div.Scalar", "e", 2.0, "f")
        + &ar0("f", "sum", "tp", "out");
    wrong_never_holds("dp sum, cp sum, / 2, tp sum", &mesh, &body);
}

#[test]
fn a_mean_folded_over_two_dims_divided_by_both_is_right() {
    // The control: both summed, then divided by dp's and cp's sizes.
    let mesh = dp_cp_tp(2, 2, 2);
    let mesh = Mesh(&mesh);
    let (r, c) = mesh.local();
    let factor = SPEC * 4.0 / 2.0;
    let body = scale((r, c), factor)
        + &sum("m", "l")
        + &ar0("l", "sum", "dp", "d")
        + &ar0("d", "sum", "cp", "e")
        + &scalar("div.Scalar", "e", 2.0, "f")
        + &scalar("div.Scalar", "f", 2.0, "g")
        + &ar0("g", "sum", "tp", "out");
    right_is_no_finding("dp sum, cp sum, / 2 / 2, tp sum", &mesh, &body);
}

#[test]
fn a_mean_folded_over_one_of_two_sharding_dims_never_holds() {
    // dp = 2 x cp = 2 x tp = 2: the factor counts dp's split only (the spec's times 2, over
    // tp: the spec's itself), forgetting cp's; dp and cp average, tp sums. The reading needs
    // the factor to count both splits.
    let mesh = dp_cp_tp(2, 2, 2);
    let mesh = Mesh(&mesh);
    let (r, c) = mesh.local();
    let body = scale((r, c), SPEC)
        + &sum("m", "l")
        + &ar0("l", "avg", "dp", "d")
        + &ar0("d", "avg", "cp", "e")
        + &ar0("e", "sum", "tp", "out");
    wrong_never_holds("factor counts dp only, dp avg, cp avg", &mesh, &body);
}

/// What the checker and the interpreter say of ranks on `dp × tp` whose second input `g`
/// (`[B, C]`) is sharded on dp and a partial sum on tp (rank `(d, t)` holds its rows of `g`
/// over tp), the spec computing `sum(neg(neg(neg(a))) * (1/B) + g)`, the ranks running
/// `body` (reading `a` and `g`, defining `out`).
fn run_beside_partial((dp, tp): (usize, usize), body: &str) -> (Verdict, bool, String) {
    let header = |r: usize| {
        format!(
            "class G(torch.nn.Module):
    def forward(self, a: \"f64[{r}, {C}]\", g: \"f64[{r}, {C}]\"):
"
        )
    };
    let spec = header(B)
        + &scale((B, C), SPEC)
        + &format!("        y: \"f64[{B}, {C}]\" = torch.ops.aten.add.Tensor(m, g)\n")
        + &sum("y", "l")
        + SPEC_OUT
        + "        return (out,)\n";
    let rank = header(B / dp) + body + "        return (out,)\n";
    let folded = Folded {
        name: "review-beside-partial",
        mesh: &[("dp", dp), ("tp", tp)],
        inputs: &[
            ("a", "{ dp: Shard(0) }".to_string()),
            ("g", "{ dp: Shard(0), tp: Partial() }".to_string()),
        ],
    };
    let a: Vec<f64> = (0..B * C).map(|i| 0.25 + i as f64 * 0.5).collect();
    let g: Vec<f64> = (0..B * C).map(|i| 1.5 - i as f64 * 0.125).collect();
    let tensor = |r: usize, d: Vec<f64>| Tensor::new(Meta::new(DType::F64, vec![r, C]), d);
    let leaves = BTreeMap::from([
        ("a".to_string(), tensor(B, a.clone())),
        ("g".to_string(), tensor(B, g.clone())),
    ]);
    let piece = B / dp * C;
    check_and_run(&folded, &spec, &rank, &leaves, |q| {
        let d = q / tp;
        let rows = |x: &[f64]| x[d * piece..(d + 1) * piece].to_vec();
        BTreeMap::from([
            ("a".to_string(), tensor(B / dp, rows(&a))),
            (
                "g".to_string(),
                tensor(B / dp, rows(&g).iter().map(|v| v / tp as f64).collect()),
            ),
        ])
    })
}

#[test]
fn a_share_added_to_a_partial_while_sharded_then_summed_over_dp_never_holds() {
    // The share lifted by a partial plus it (not an all-reduce) while dp still shards it:
    // each rank adds its tp-partial piece of `g` to its scaled rows, sums, tp sums, and dp
    // sums the local means (wrong) or averages (also wrong: `g`'s rows sum over dp).
    let mut held = Vec::new();
    for (dp, tp) in [(4, 2), (2, 2)] {
        let (r, c) = (B / dp, C);
        for op in ["sum", "avg"] {
            let body = scale((r, c), local_mean_share(dp, tp))
                + &format!("        y: \"f64[{r}, {c}]\" = torch.ops.aten.add.Tensor(m, g)\n")
                + &sum("y", "l")
                + &ar0("l", "sum", "tp", "t")
                + &ar0("t", op, "dp", "out");
            let what = format!("share plus partial, dp {op}, {dp}x{tp}");
            let (verdict, right, report) = run_beside_partial((dp, tp), &body);
            eprintln!("{what}: {verdict:?} (right: {right})\n{report}");
            assert!(!right, "{what} is right when run\n{report}");
            if verdict == Verdict::Holds {
                held.push(what);
            }
        }
    }
    assert!(held.is_empty(), "wrong programs that hold: {held:?}");
}

#[test]
fn a_spec_share_added_to_a_partial_is_right() {
    // The control: the spec's factor over tp (a share of the spec's own pieces on dp, no
    // local mean), plus the partial, summed over tp and over dp: right, and a finding
    // (`spmd-type`: the scaled rows are not read as a share, so the add is partial plus
    // replicate).
    // (On 2 x 2 the spec's factor over tp is also its factor over dp: which mesh dim the share
    // is of is ambiguous there, as for a plain 1/n, and it stays a finding.)
    let (dp, tp) = (4, 2);
    let (r, c) = (B / dp, C);
    let body = scale((r, c), SPEC / tp as f64)
        + &format!("        y: \"f64[{r}, {c}]\" = torch.ops.aten.add.Tensor(m, g)\n")
        + &sum("y", "l")
        + &ar0("l", "sum", "tp", "t")
        + &ar0("t", "sum", "dp", "out");
    let what = format!("spec share plus partial, {dp}x{tp}");
    let (verdict, right, report) = run_beside_partial((dp, tp), &body);
    eprintln!("{what}: {verdict:?} (right: {right})\n{report}");
    assert!(right, "{what} is wrong when run\n{report}");
    assert_ne!(verdict, Verdict::Violated, "{what}\n{report}");
}

#[test]
fn a_mean_folded_over_two_dims_of_distinct_sizes_divided_once_never_holds() {
    // dp = 2 x cp = 4 x tp = 8 (no two mesh dims of one size, so a division names its dim):
    // the factor is the spec's times dp's and cp's splits over tp (the spec's own). Both dp
    // and cp sum the local means; a division by cp's size makes up for cp's sum only.
    let mesh = dp_cp_tp(2, 4, 8);
    let mesh = Mesh(&mesh);
    let (r, c) = mesh.local();
    let factor = SPEC * 8.0 / 8.0;
    let reduce = |divisions: &[f64]| {
        let mut body = scale((r, c), factor)
            + &sum("m", "l")
            + &ar0("l", "sum", "dp", "d")
            + &ar0("d", "sum", "cp", "q0");
        for (i, x) in divisions.iter().enumerate() {
            body += &scalar("div.Scalar", &format!("q{i}"), *x, &format!("q{}", i + 1));
        }
        body + &ar0(&format!("q{}", divisions.len()), "sum", "tp", "out")
    };
    wrong_never_holds("dp sum, cp sum, / 4, tp sum", &mesh, &reduce(&[4.0]));
    right_is_no_finding(
        "dp sum, cp sum, / 4 / 2, tp sum",
        &mesh,
        &reduce(&[4.0, 2.0]),
    );
}

#[test]
fn two_microbatches_of_local_means_summed_over_dp_never_hold() {
    // Each rank runs its rows as two microbatches (halves), each scaled by the local mean's
    // factor over tp and over K = 2, and adds the two sums (the gradient accumulation); dp
    // then sums the local means (wrong) or averages them (right, and holds: the add of two
    // folded shares carries both records).
    for (dp, tp) in [(4, 2), (2, 2)] {
        let mesh = dp_tp(dp, tp);
        let mesh = Mesh(&mesh);
        let (r, c) = mesh.local();
        let h = r / 2;
        let factor = local_mean_share(dp, tp);
        let micro = |k: usize| {
            format!(
                "        a{k}: \"f64[{h}, {c}]\" = torch.ops.aten.slice.Tensor(a, 0, {}, {})
        n{k}a: \"f64[{h}, {c}]\" = torch.ops.aten.neg.default(a{k})
        n{k}b: \"f64[{h}, {c}]\" = torch.ops.aten.neg.default(n{k}a)
        n{k}c: \"f64[{h}, {c}]\" = torch.ops.aten.neg.default(n{k}b)
        m{k}: \"f64[{h}, {c}]\" = torch.ops.aten.mul.Tensor(n{k}c, {factor:?})
        s{k}: \"f64[]\" = torch.ops.aten.sum.default(m{k})
",
                k * h,
                (k + 1) * h
            )
        };
        for (op, right) in [("sum", false), ("avg", true)] {
            let body = micro(0)
                + &micro(1)
                + "        l: \"f64[]\" = torch.ops.aten.add.Tensor(s0, s1)\n"
                + &ar0("l", "sum", "tp", "t")
                + &ar0("t", op, "dp", "out");
            let what = format!("two microbatches, dp {op}, {dp}x{tp}");
            if right {
                right_holds(&what, &mesh, &body);
            } else {
                wrong_never_holds(&what, &mesh, &body);
            }
        }
    }
}

#[test]
fn local_means_on_a_mesh_listed_tp_first_are_followed() {
    // The mesh listed `tp × dp` (the records index mesh dims by position): dp summing the
    // local means never holds, dp averaging them holds, in either order against tp's sum.
    for (dp, tp) in [(4, 2), (2, 2)] {
        let mesh = [("tp", tp, None), ("dp", dp, Some(0))];
        let mesh = Mesh(&mesh);
        let (r, c) = mesh.local();
        for tp_first in [true, false] {
            for op in ["sum", "avg"] {
                let body = scale((r, c), local_mean_share(dp, tp))
                    + &sum("m", "l")
                    + &if tp_first {
                        ar0("l", "sum", "tp", "t") + &ar0("t", op, "dp", "out")
                    } else {
                        ar0("l", op, "dp", "d") + &ar0("d", "sum", "tp", "out")
                    };
                let what = format!("tp listed first, dp {op}, tp first {tp_first}, {dp}x{tp}");
                if op == "avg" && tp_first {
                    right_holds(&what, &mesh, &body);
                } else if op == "avg" {
                    right_is_no_finding(&what, &mesh, &body);
                } else {
                    wrong_never_holds(&what, &mesh, &body);
                }
            }
        }
    }
}
