//! Adversarial review of the local-means factor (`engine/local_means.rs`,
//! `engine/scaling.rs`): every reduction of a lifted partial holds only after a division by
//! exactly the product of the sizes of the mesh dims whose local means reach it. Each program
//! below is run by the interpreter and compared with the spec; a program the interpreter shows
//! wrong must never hold, and a program expected right is asserted right (so every case is a
//! meaningful attack: its wrongness is a fact of the values, not of the checker).
//!
//! Mesh `dp × ep × tp`, the program of `lift_factor_groups.rs`: logits `z [B, V]`, labels,
//! tokens `a` split over dp and ep (dp outermost) or over dp alone; `p` split alike and a
//! partial sum on tp. Each rank computes the loss gradient on its rows (a mean over its own
//! rows: `n` times the spec's pieces, `n` the number of row blocks) times `p`, plus the share
//! `neg³(a) * n / (B * tp)`, optionally gathers the sum's rows over ep, sums, sums over tp and
//! reduces as each test writes.

use shardproof_check::{check_case, Verdict};
use shardproof_interp::{run_graph, run_program, RunConfig};
use shardproof_ir::{DType, Graph, ValueId};
use shardproof_ops::{Meta, Tensor};
use std::collections::BTreeMap;

mod common;
use common::dispatch::{load_written, Declared};
use common::values::close;

/// Rows of the spec's tensors.
const B: usize = 16;
/// Classes (the columns of every tensor).
const V: usize = 4;
/// The spec's factor on the tokens.
const SPEC: f64 = 1.0 / B as f64;

/// How the rows are laid out and what the ranks do before the tail.
#[derive(Clone, Copy)]
struct Layout {
    /// Rows split over dp and ep (dp outermost); else over dp alone, replicated over ep.
    split_ep: bool,
    /// The sum's rows gathered over ep before the sum.
    gathered: bool,
    /// The gathered rows sliced to the first ep block (the rank's own row count).
    sliced: bool,
}

/// The graph on `rows` rows: `partial` lines define `gp` from `gz` and `p`; the share is the
/// tokens scaled by `factor`; `gather` lines define `yy` from `y` (none: a copy; `ROWS` stands
/// for `rows`); `tail` reduces `l` into `out` (of type `out_ty`).
fn graph(rows: usize, partial: &str, factor: f64, gather: &str, tail: &str) -> String {
    let t = format!("\"f64[{rows}, {V}]\"");
    let gather = if gather.is_empty() {
        format!("        yy: {t} = torch.ops.aten.clone.default(y)\n")
    } else {
        gather.to_string()
    };
    let partial = if partial.is_empty() {
        format!("        gp: {t} = torch.ops.aten.mul.Tensor(gz, p)\n")
    } else {
        partial.replace("ROWS", &rows.to_string())
    };
    format!(
        "class G(torch.nn.Module):
    def forward(self, z: {t}, labels: \"i64[{rows}]\", p: {t}, a: {t}):
        ls: {t} = torch.ops.aten._log_softmax.default(z, 1, False)
        nf = torch.ops.aten.nll_loss_forward.default(ls, labels, None, 1, -100)
        nl: \"f64[]\" = nf[0]
        tw: \"f64[]\" = nf[1]
        one: \"f64[]\" = torch.ops.aten.full.default([], 1.0, dtype = torch.float64)
        gz: {t} = torch.ops.aten.nll_loss_backward.default(one, ls, labels, None, 1, -100, tw)
{partial}        t1: {t} = torch.ops.aten.neg.default(a)
        t2: {t} = torch.ops.aten.neg.default(t1)
        t3: {t} = torch.ops.aten.neg.default(t2)
        m: {t} = torch.ops.aten.mul.Tensor(t3, {factor:?})
        y: {t} = torch.ops.aten.add.Tensor(gp, m)
{gather}        l: \"f64[]\" = torch.ops.aten.sum.default(yy)
{tail}        return (out,)
"
    )
}

/// Lines of an all-reduce `op` of the scalar `input` over `group`, defining `output`.
fn ar(input: &str, op: &str, group: &str, output: &str) -> String {
    format!(
        "        {output}_ar: \"f64[]\" = torch.ops._c10d_functional.all_reduce.default({input}, '{op}', '{group}')
        {output}: \"f64[]\" = torch.ops._c10d_functional.wait_tensor.default({output}_ar)
"
    )
}

/// A line defining the scalar `output` as `input` divided by `n`.
fn div(input: &str, n: usize, output: &str) -> String {
    format!("        {output}: \"f64[]\" = torch.ops.aten.div.Tensor({input}, {n})\n")
}

/// A line defining the scalar `output` as `input` times `x`.
fn mul(input: &str, x: f64, output: &str) -> String {
    format!("        {output}: \"f64[]\" = torch.ops.aten.mul.Tensor({input}, {x:?})\n")
}

/// The verdict, whether every rank's `out` is the spec's, and the report of the program on
/// `(dp, ep, tp)` laid out as `layout`, the rank's partial side `partial` (spec: `spec_partial`,
/// both empty: `gz * p`), reducing the tp sum `t` by `tail` (lines defining `out`).
fn run(
    (dp, ep, tp): (usize, usize, usize),
    layout: Layout,
    partial: &str,
    spec_partial: &str,
    tail: &str,
) -> (Verdict, bool, String) {
    let blocks = if layout.split_ep { dp * ep } else { dp };
    let r = B / blocks;
    let spec = graph(
        B,
        spec_partial,
        SPEC,
        "",
        "        out: \"f64[]\" = torch.ops.aten.clone.default(l)\n",
    );
    let gather = if layout.gathered {
        format!(
            "        yg: \"f64[{g}, {V}]\" = torch.ops._c10d_functional.all_gather_into_tensor.default(y, {ep}, 'ep')
        yw: \"f64[{g}, {V}]\" = torch.ops._c10d_functional.wait_tensor.default(yg)
{keep}",
            g = r * ep,
            keep = if layout.sliced {
                format!("        yy: \"f64[{r}, {V}]\" = torch.ops.aten.slice.Tensor(yw, 0, 0, {r})\n")
            } else {
                format!("        yy: \"f64[{}, {V}]\" = torch.ops.aten.clone.default(yw)\n", r * ep)
            }
        )
    } else {
        String::new()
    };
    let rank = graph(
        r,
        partial,
        SPEC * blocks as f64 / tp as f64,
        &gather,
        &(ar("l", "sum", "tp", "t") + tail),
    );
    let rows = if layout.split_ep {
        "{ dp: Shard(0), ep: Shard(0) }"
    } else {
        "{ dp: Shard(0) }"
    };
    let p_place = if layout.split_ep {
        "{ dp: Shard(0), ep: Shard(0), tp: Partial() }"
    } else {
        "{ dp: Shard(0), tp: Partial() }"
    };
    let mesh = [("dp", dp), ("ep", ep), ("tp", tp)];
    let groups: Vec<(&str, Vec<&str>)> = vec![
        ("dp", vec!["dp"]),
        ("ep", vec!["ep"]),
        ("tp", vec!["tp"]),
        ("dp_ep", vec!["dp", "ep"]),
    ];
    let inputs = [
        ("z", rows.to_string()),
        ("labels", rows.to_string()),
        ("p", p_place.to_string()),
        ("a", rows.to_string()),
    ];
    let declared = Declared {
        name: "review-factors",
        mesh: &mesh,
        groups: &groups,
        inputs: &inputs,
        outputs: &[("out", "Replicate()".to_string())],
    };
    let ranks = dp * ep * tp;
    let case = load_written(&spec, &vec![rank; ranks], &declared);
    let report = check_case(&case).unwrap();
    let z: Vec<f64> = (0..B * V)
        .map(|i| ((i * 7) % 11) as f64 * 0.3 - 1.0)
        .collect();
    let labels: Vec<f64> = (0..B).map(|i| ((i * 3) % V) as f64).collect();
    let p: Vec<f64> = (0..B * V).map(|i| 1.5 - i as f64 * 0.125).collect();
    let a: Vec<f64> = (0..B * V).map(|i| 0.25 + i as f64 * 0.5).collect();
    let matrix = |n: usize, d: Vec<f64>| Tensor::new(Meta::new(DType::F64, vec![n, V]), d);
    let vector = |n: usize, d: Vec<f64>| Tensor::new(Meta::new(DType::I64, vec![n]), d);
    let leaves = BTreeMap::from([
        ("z".to_string(), matrix(B, z.clone())),
        ("labels".to_string(), vector(B, labels.clone())),
        ("p".to_string(), matrix(B, p.clone())),
        ("a".to_string(), matrix(B, a.clone())),
    ]);
    let per_rank: Vec<BTreeMap<String, Tensor>> = (0..ranks)
        .map(|q| {
            // Rank `q = (d * ep + e) * tp + t`.
            let (d, e) = (q / (ep * tp), (q / tp) % ep);
            let block = if layout.split_ep { d * ep + e } else { d };
            let cut = |x: &[f64]| x[block * r * V..(block + 1) * r * V].to_vec();
            BTreeMap::from([
                ("z".to_string(), matrix(r, cut(&z))),
                (
                    "labels".to_string(),
                    vector(r, labels[block * r..(block + 1) * r].to_vec()),
                ),
                (
                    "p".to_string(),
                    matrix(r, cut(&p).iter().map(|v| v / tp as f64).collect()),
                ),
                ("a".to_string(), matrix(r, cut(&a))),
            ])
        })
        .collect();
    let at = |g: &Graph| ValueId::new(g.nodes.iter().position(|n| n.name == "out").unwrap(), 0);
    let want = run_graph(&case.spec, &leaves, &RunConfig::default())
        .ok()
        .and_then(|env| env.get(at(&case.spec)).map(|t| t.data.to_vec()));
    let right = run_program(&case.program, &per_rank, &RunConfig::default()).is_ok_and(|envs| {
        envs.iter().zip(&case.program.ranks).all(|(env, g)| {
            env.get(at(g))
                .is_some_and(|t: &Tensor| want.as_ref().is_some_and(|w| close(&t.data, w)))
        })
    });
    (report.verdict, right, report.render())
}

/// Runs `tail` on `mesh` laid out as `layout` (the partial side `gz * p`), asserts the values
/// are as `expect_right` says, and that a wrong program does not hold. Returns the verdict.
fn attack(
    what: &str,
    mesh: (usize, usize, usize),
    layout: Layout,
    tail: &str,
    expect_right: bool,
) -> Verdict {
    attack_with(what, mesh, layout, "", "", tail, expect_right)
}

/// As [`attack`], with the rank's and the spec's partial sides.
fn attack_with(
    what: &str,
    mesh: (usize, usize, usize),
    layout: Layout,
    partial: &str,
    spec_partial: &str,
    tail: &str,
    expect_right: bool,
) -> Verdict {
    let what = format!("{what}, {mesh:?}");
    let (verdict, right, report) = run(mesh, layout, partial, spec_partial, tail);
    eprintln!("{what}: {verdict:?} (right: {right})");
    assert_eq!(right, expect_right, "{what}: the values\n{report}");
    if !right {
        assert_ne!(verdict, Verdict::Holds, "{what}: a false hold\n{report}");
    }
    verdict
}

/// Rows split over dp and ep, gathered over ep: the factor is dp × ep.
const GATHERED: Layout = Layout {
    split_ep: true,
    gathered: true,
    sliced: false,
};
/// Rows split over dp and ep, each rank summing its own: the factor is dp × ep.
const OWN_ROWS: Layout = Layout {
    split_ep: true,
    gathered: false,
    sliced: false,
};
/// Rows split over dp alone, replicated over ep: the factor is dp.
const DP_ROWS: Layout = Layout {
    split_ep: false,
    gathered: false,
    sliced: false,
};

/// The mesh on which dp, ep and the factors differ: (dp, ep, tp).
const MESH: (usize, usize, usize) = (4, 2, 2);

#[test]
fn a_division_before_the_reduction_by_the_right_factor_is_right() {
    // Linear: dividing before dp's sum is the same value. Not required to hold; recorded.
    let n = MESH.0 * MESH.1;
    let tail = div("t", n, "u") + &ar("u", "sum", "dp", "out");
    attack("/(dp*ep) then sum over dp", MESH, GATHERED, &tail, true);
}

#[test]
fn a_division_before_the_reduction_by_dp_alone_never_holds() {
    let tail = div("t", MESH.0, "u") + &ar("u", "sum", "dp", "out");
    attack("/dp then sum over dp", MESH, GATHERED, &tail, false);
}

#[test]
fn two_divisions_by_dp_never_hold_where_ep_differs() {
    // dp² is not dp × ep on (4, 2, 2).
    let tail = ar("t", "sum", "dp", "s") + &div("s", MESH.0, "u") + &div("u", MESH.0, "out");
    attack("sum over dp, /dp, /dp", MESH, GATHERED, &tail, false);
}

#[test]
fn a_division_by_dp_then_by_ep_is_right() {
    let tail = ar("t", "sum", "dp", "s") + &div("s", MESH.0, "u") + &div("u", MESH.1, "out");
    attack("sum over dp, /dp, /ep", MESH, GATHERED, &tail, true);
}

#[test]
fn a_multiply_by_the_wrong_inverse_never_holds() {
    let (dp, ep, tp) = MESH;
    for (x, right) in [
        (1.0 / (dp * ep) as f64, true),
        (1.0 / dp as f64, false),
        (1.0 / (dp * ep * tp) as f64, false),
    ] {
        let tail = ar("t", "sum", "dp", "s") + &mul("s", x, "out");
        attack(&format!("sum over dp, * {x}"), MESH, GATHERED, &tail, right);
    }
}

#[test]
fn the_factor_split_over_a_sum_on_dp_and_an_average_on_ep_never_holds_after_a_gather() {
    // After the gather over ep the value is the same on every ep rank: ep's average divides
    // nothing; the sum over dp is dp × ep times the spec's.
    let (dp, ep, _) = MESH;
    let avg_ep = ar("t", "sum", "dp", "s") + &ar("s", "avg", "ep", "v");
    attack(
        "sum over dp, avg over ep",
        MESH,
        GATHERED,
        &(avg_ep.clone() + "        out: \"f64[]\" = torch.ops.aten.clone.default(v)\n"),
        false,
    );
    attack(
        "sum over dp, avg over ep, /dp",
        MESH,
        GATHERED,
        &(avg_ep.clone() + &div("v", dp, "out")),
        false,
    );
    attack(
        "sum over dp, avg over ep, /(dp*ep)",
        MESH,
        GATHERED,
        &(avg_ep + &div("v", dp * ep, "out")),
        true,
    );
}

#[test]
fn the_factor_split_over_a_sum_on_dp_and_an_average_on_ep_on_own_rows() {
    // Each rank's own rows: ep's average completes the ep part of the factor.
    let (dp, _, _) = MESH;
    let avg_ep = ar("t", "sum", "dp", "s") + &ar("s", "avg", "ep", "v");
    attack(
        "own rows: sum over dp, avg over ep",
        MESH,
        OWN_ROWS,
        &(avg_ep.clone() + "        out: \"f64[]\" = torch.ops.aten.clone.default(v)\n"),
        false,
    );
    attack(
        "own rows: sum over dp, avg over ep, /dp",
        MESH,
        OWN_ROWS,
        &(avg_ep + &div("v", dp, "out")),
        true,
    );
}

#[test]
fn an_average_over_the_data_group_after_a_gather_never_holds() {
    // The gathered value is the same on every ep rank: dp_ep's average is dp's, ep x the spec.
    attack(
        "avg over dp_ep after the gather",
        MESH,
        GATHERED,
        &ar("t", "avg", "dp_ep", "out"),
        false,
    );
}

#[test]
fn an_average_over_the_data_group_of_own_rows_holds() {
    // Each rank's own rows: the value is a partial on dp and on ep, and dp_ep's average is
    // dp x ep, the factor.
    let verdict = attack(
        "own rows: avg over dp_ep",
        MESH,
        OWN_ROWS,
        &ar("t", "avg", "dp_ep", "out"),
        true,
    );
    assert_eq!(verdict, Verdict::Holds);
}

#[test]
fn rows_on_dp_alone_divided_by_dp_times_ep_never_hold() {
    // The factor is dp where ep replicates the rows: dp × ep divides too much.
    let (dp, ep, _) = MESH;
    let sum_dp = ar("t", "sum", "dp", "s");
    attack(
        "dp rows: sum over dp /(dp*ep)",
        MESH,
        DP_ROWS,
        &(sum_dp.clone() + &div("s", dp * ep, "out")),
        false,
    );
    attack(
        "dp rows: sum over dp /dp",
        MESH,
        DP_ROWS,
        &(sum_dp + &div("s", dp, "out")),
        true,
    );
}

#[test]
fn rows_on_dp_alone_summed_over_the_data_group() {
    // Summed over dp × ep: ep copies of dp × the spec; /(dp*ep) is right, /dp is ep × it.
    let (dp, ep, _) = MESH;
    let sum = ar("t", "sum", "dp_ep", "s");
    attack(
        "dp rows: sum over dp_ep /(dp*ep)",
        MESH,
        DP_ROWS,
        &(sum.clone() + &div("s", dp * ep, "out")),
        true,
    );
    attack(
        "dp rows: sum over dp_ep /dp",
        MESH,
        DP_ROWS,
        &(sum + &div("s", dp, "out")),
        false,
    );
}

/// dp's reduce-scatter of `t` spread over dp's ranks (each rank one element of the sum),
/// divided by `n`, gathered back over dp, and its first element read.
fn scattered_tail(dp: usize, n: usize) -> String {
    scattered_tail_op(dp, "sum", n)
}

/// As [`scattered_tail`], the reduce-scatter's op `op`.
fn scattered_tail_op(dp: usize, op: &str, n: usize) -> String {
    format!(
        "        e: \"f64[{dp}]\" = torch.ops.aten.expand.default(t, [{dp}])
        rs: \"f64[1]\" = torch.ops._c10d_functional.reduce_scatter_tensor.default(e, '{op}', {dp}, 'dp')
        rw: \"f64[1]\" = torch.ops._c10d_functional.wait_tensor.default(rs)
        q: \"f64[1]\" = torch.ops.aten.div.Tensor(rw, {n})
        qg: \"f64[{dp}]\" = torch.ops._c10d_functional.all_gather_into_tensor.default(q, {dp}, 'dp')
        qw: \"f64[{dp}]\" = torch.ops._c10d_functional.wait_tensor.default(qg)
        out: \"f64[]\" = torch.ops.aten.select.int(qw, 0, 0)
"
    )
}

#[test]
fn a_reduce_scatter_over_dp_divided_by_dp_times_ep_is_right() {
    let (dp, ep, _) = MESH;
    // The division by exactly the factor settles the shard's record: the program holds.
    let verdict = attack(
        "reduce-scatter over dp /(dp*ep)",
        MESH,
        GATHERED,
        &scattered_tail(dp, dp * ep),
        true,
    );
    assert_eq!(verdict, Verdict::Holds);
}

#[test]
fn a_reduce_scatter_over_dp_divided_by_dp_alone_never_holds() {
    // ep times the tensor: the factor is dp x ep. Held before the fix (as did no division).
    let (dp, _, _) = MESH;
    attack(
        "reduce-scatter over dp /dp",
        MESH,
        GATHERED,
        &scattered_tail(dp, dp),
        false,
    );
}

#[test]
fn a_slice_after_the_gather_over_ep_never_holds() {
    // The gathered rows sliced to the first ep block: the other blocks' rows are lost.
    let (dp, ep, _) = MESH;
    let sliced = Layout {
        sliced: true,
        ..GATHERED
    };
    let tail = ar("t", "sum", "dp", "s") + &div("s", dp * ep, "out");
    attack(
        "gathered then sliced to one block",
        MESH,
        sliced,
        &tail,
        false,
    );
}

#[test]
fn a_number_scattered_into_the_partial_product_never_holds() {
    // 0.5 written into `gz * p` (a partial sum on tp) on every rank: tp's sum is tp × 0.5
    // where the spec has 0.5.
    let scattered = "        ix: \"i64[ROWS, 1]\" = torch.ops.aten.unsqueeze.default(labels, 1)
        gq: \"f64[ROWS, V]\" = torch.ops.aten.mul.Tensor(gz, p)
        gp: \"f64[ROWS, V]\" = torch.ops.aten.scatter.value(gq, 1, ix, 0.5)
"
    .replace("V]", &format!("{V}]"));
    let (dp, ep, _) = MESH;
    let tail = ar("t", "sum", "dp", "s") + &div("s", dp * ep, "out");
    attack_with(
        "0.5 scattered into gz * p",
        MESH,
        GATHERED,
        &scattered,
        &scattered,
        &tail,
        false,
    );
}

#[test]
fn a_constant_scattered_into_zeros_beside_the_share_never_holds() {
    // A replicated buffer (zeros with 0.5 scattered in) in place of the partial side: every
    // tp rank adds it, tp's sum counts it tp times.
    let buffer = "        zb: \"f64[ROWS, V]\" = torch.ops.aten.zeros_like.default(z)
        ix: \"i64[ROWS, 1]\" = torch.ops.aten.unsqueeze.default(labels, 1)
        gp: \"f64[ROWS, V]\" = torch.ops.aten.scatter.value(zb, 1, ix, 0.5)
"
    .replace("V]", &format!("{V}]"));
    let (dp, ep, _) = MESH;
    let tail = ar("t", "sum", "dp", "s") + &div("s", dp * ep, "out");
    attack_with(
        "0.5 scattered into zeros",
        MESH,
        GATHERED,
        &buffer,
        &buffer,
        &tail,
        false,
    );
}

#[test]
fn a_fill_of_the_partial_product_never_holds() {
    let filled = "        gq: \"f64[ROWS, V]\" = torch.ops.aten.mul.Tensor(gz, p)
        gp: \"f64[ROWS, V]\" = torch.ops.aten.fill.Scalar(gq, 0.25)
"
    .replace("V]", &format!("{V}]"));
    let (dp, ep, _) = MESH;
    let tail = ar("t", "sum", "dp", "s") + &div("s", dp * ep, "out");
    attack_with(
        "fill of gz * p",
        MESH,
        GATHERED,
        &filled,
        &filled,
        &tail,
        false,
    );
}

#[test]
fn a_sum_over_the_data_group_after_a_gather_never_holds() {
    // The gathered value is the same on every ep rank: dp_ep's sum counts it ep times.
    let (dp, ep, _) = MESH;
    let tail = ar("t", "sum", "dp_ep", "s") + &div("s", dp * ep, "out");
    attack(
        "sum over dp_ep /(dp*ep) after the gather",
        MESH,
        GATHERED,
        &tail,
        false,
    );
}

#[test]
fn a_slice_after_a_gather_without_local_means_never_holds() {
    // No loss, no share: tokens split over dp and ep, gathered over ep, sliced to the first
    // ep block, summed, summed over dp. Half the rows are lost.
    let (dp, ep) = (2usize, 2usize);
    let r = B / (dp * ep);
    let g = r * ep;
    let h = g / 2;
    let spec = format!(
        "class G(torch.nn.Module):
    def forward(self, a: \"f64[{B}, {V}]\"):
        out: \"f64[]\" = torch.ops.aten.sum.default(a)
        return (out,)
"
    );
    let rank = format!(
        "class G(torch.nn.Module):
    def forward(self, a: \"f64[{r}, {V}]\"):
        ag: \"f64[{g}, {V}]\" = torch.ops._c10d_functional.all_gather_into_tensor.default(a, {ep}, 'ep')
        aw: \"f64[{g}, {V}]\" = torch.ops._c10d_functional.wait_tensor.default(ag)
        sl: \"f64[{h}, {V}]\" = torch.ops.aten.slice.Tensor(aw, 0, 0, {h})
        l: \"f64[]\" = torch.ops.aten.sum.default(sl)
        o_ar: \"f64[]\" = torch.ops._c10d_functional.all_reduce.default(l, 'sum', 'dp')
        out: \"f64[]\" = torch.ops._c10d_functional.wait_tensor.default(o_ar)
        return (out,)
"
    );
    let groups: Vec<(&str, Vec<&str>)> = vec![("dp", vec!["dp"]), ("ep", vec!["ep"])];
    let inputs = [("a", "{ dp: Shard(0), ep: Shard(0) }".to_string())];
    let declared = Declared {
        name: "review-slice",
        mesh: &[("dp", dp), ("ep", ep)],
        groups: &groups,
        inputs: &inputs,
        outputs: &[("out", "Replicate()".to_string())],
    };
    let case = load_written(&spec, &vec![rank; dp * ep], &declared);
    let report = check_case(&case).unwrap();
    eprintln!(
        "slice without local means: {:?}\n{}",
        report.verdict,
        report.render()
    );
    // The values: rank (d, e) holds row block d * ep + e; every rank's `out` is not the spec's.
    let a: Vec<f64> = (0..B * V).map(|i| 0.25 + i as f64 * 0.5).collect();
    let matrix = |n: usize, d: Vec<f64>| Tensor::new(Meta::new(DType::F64, vec![n, V]), d);
    let leaves = BTreeMap::from([("a".to_string(), matrix(B, a.clone()))]);
    let per_rank: Vec<BTreeMap<String, Tensor>> = (0..dp * ep)
        .map(|q| {
            BTreeMap::from([(
                "a".to_string(),
                matrix(r, a[q * r * V..(q + 1) * r * V].to_vec()),
            )])
        })
        .collect();
    let at = |g: &Graph| ValueId::new(g.nodes.iter().position(|n| n.name == "out").unwrap(), 0);
    let want = run_graph(&case.spec, &leaves, &RunConfig::default()).unwrap();
    let want = want.get(at(&case.spec)).unwrap().data.to_vec();
    let envs = run_program(&case.program, &per_rank, &RunConfig::default()).unwrap();
    for (env, g) in envs.iter().zip(&case.program.ranks) {
        assert!(
            !close(&env.get(at(g)).unwrap().data, &want),
            "the slice is right when run"
        );
    }
    assert_ne!(report.verdict, Verdict::Holds, "{}", report.render());
}

#[test]
fn a_reduce_scatter_average_over_dp_never_holds() {
    // dp's average of pieces dp x ep times the spec's: ep times the tensor.
    let (dp, _, _) = MESH;
    attack(
        "reduce-scatter avg over dp",
        MESH,
        GATHERED,
        &scattered_tail_op(dp, "avg", 1),
        false,
    );
}

#[test]
fn a_reduce_scatter_over_dp_undivided_never_holds() {
    let (dp, _, _) = MESH;
    attack(
        "reduce-scatter over dp, undivided",
        MESH,
        GATHERED,
        &scattered_tail(dp, 1),
        false,
    );
}

#[test]
fn a_reduce_scatter_then_exp_divided_by_the_factor_never_holds() {
    // exp of a shard dp x ep times the spec's, then divided by dp x ep: exp(8x)/8 is not the
    // spec's; only a copy or view keeps the record a division may clear.
    let (dp, ep, _) = MESH;
    let tail = scattered_tail(dp, dp * ep).replace(
        "torch.ops.aten.div.Tensor(rw,",
        "torch.ops.aten.div.Tensor(rx,",
    );
    let tail = tail.replacen(
        "        q:",
        "        rx: \"f64[1]\" = torch.ops.aten.exp.default(rw)\n        q:",
        1,
    );
    attack(
        "reduce-scatter over dp, exp, /(dp*ep)",
        MESH,
        GATHERED,
        &tail,
        false,
    );
}
