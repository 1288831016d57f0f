//! Adversarial review (issue 44) of the newest readings of a lifted partial's factor
//! (`engine/local_means.rs`, `engine/scaling.rs`: `times_factor`, `scattered_factor`,
//! `divides_by_inverse`) and of products across mesh dims (`rules/matmul.rs`). Every program
//! is run by the interpreter and compared with the spec: a program the interpreter shows wrong
//! must never hold, and a program expected right is asserted right (so every attack's wrongness
//! is a fact of the values, not of the checker).
//!
//! Mesh `dp × ep × tp` = (4, 2, 2), the program of `review_factors.rs`: logits `z [B, V]`,
//! labels, tokens `a` split over dp and ep (dp outermost); `p` split alike and a partial sum on
//! tp. Each rank computes the loss gradient on its rows (a mean over its own rows: `dp · ep`
//! times the spec's pieces) times `p`, plus the share `neg³(a) · dp · ep / (B · tp)`, gathers
//! the sum's rows over ep (or not), sums, sums over tp and reduces as each test writes. The
//! factor of the value reduced over dp is `dp · ep` = 8.

use shardproof_check::{check_case, Red, Verdict};
use shardproof_interp::{run_graph, run_program, RunConfig};
use shardproof_ir::{DType, Graph, ValueId};
use shardproof_ops::{Meta, Tensor};
use std::collections::BTreeMap;

mod common;
use common::dispatch::{load_written, Declared};
use common::values::close;
#[path = "common/props.rs"]
mod props;
use props::{In, Input, Program, Seen};

/// Rows of the spec's tensors.
const B: usize = 16;
/// Classes (the columns of every tensor).
const V: usize = 4;
/// The spec's factor on the tokens.
const SPEC: f64 = 1.0 / B as f64;
/// The mesh: (dp, ep, tp).
const MESH: (usize, usize, usize) = (4, 2, 2);
/// The factor of the pieces reduced over dp: dp × ep.
const FACTOR: usize = MESH.0 * MESH.1;

/// The graph on `rows` rows: the share scaled by `factor`; `gather` lines define `yy` from
/// `y` (none: a copy); `tail` reduces `l` into `out`.
fn graph(rows: usize, factor: f64, gather: &str, tail: &str) -> String {
    let t = format!("\"f64[{rows}, {V}]\"");
    let gather = if gather.is_empty() {
        format!("        yy: {t} = torch.ops.aten.clone.default(y)\n")
    } else {
        gather.to_string()
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
        gp: {t} = torch.ops.aten.mul.Tensor(gz, p)
        t1: {t} = torch.ops.aten.neg.default(a)
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

/// A line copying `input` into `out`.
fn out_is(input: &str) -> String {
    format!("        out: \"f64[]\" = torch.ops.aten.clone.default({input})\n")
}

/// The verdict, whether every rank's `out` is the spec's, and the report of the program on
/// [`MESH`], the rows gathered over ep where `gathered`, reducing the tp sum `t` by `tail`
/// (lines defining `out`); the spec reduces its `l` by `spec_tail` (lines defining `out`).
fn run(gathered: bool, spec_tail: &str, tail: &str) -> (Verdict, bool, String) {
    run_raw(gathered, spec_tail, &(ar("l", "sum", "tp", "t") + tail))
}

/// As [`run`], `tail` reducing the rank's sum `l` (a partial sum on tp) itself.
fn run_raw(gathered: bool, spec_tail: &str, tail: &str) -> (Verdict, bool, String) {
    run_on(MESH, gathered, spec_tail, tail)
}

/// As [`run_raw`] on the mesh `(dp, ep, tp)`.
fn run_on(
    (dp, ep, tp): (usize, usize, usize),
    gathered: bool,
    spec_tail: &str,
    tail: &str,
) -> (Verdict, bool, String) {
    let blocks = dp * ep;
    let r = B / blocks;
    let spec = graph(B, SPEC, "", spec_tail);
    let gather = if gathered {
        format!(
            "        yg: \"f64[{g}, {V}]\" = torch.ops._c10d_functional.all_gather_into_tensor.default(y, {ep}, 'ep')
        yy: \"f64[{g}, {V}]\" = torch.ops._c10d_functional.wait_tensor.default(yg)
",
            g = r * ep
        )
    } else {
        String::new()
    };
    let rank = graph(r, SPEC * blocks as f64 / tp as f64, &gather, tail);
    let rows = "{ dp: Shard(0), ep: Shard(0) }";
    let mesh = [("dp", dp), ("ep", ep), ("tp", tp)];
    let groups: Vec<(&str, Vec<&str>)> = vec![
        ("dp", vec!["dp"]),
        ("ep", vec!["ep"]),
        ("tp", vec!["tp"]),
        ("dp_ep", vec!["dp", "ep"]),
        ("dp_tp", vec!["dp", "tp"]),
    ];
    let inputs = [
        ("z", rows.to_string()),
        ("labels", rows.to_string()),
        (
            "p",
            "{ dp: Shard(0), ep: Shard(0), tp: Partial() }".to_string(),
        ),
        ("a", rows.to_string()),
    ];
    let declared = Declared {
        name: "review-lifts",
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
            // Rank `q = (d * ep + e) * tp + t` holds row block `d * ep + e`.
            let block = q / tp;
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

/// Runs `tail` (the spec's tail a copy of `l`), asserts the values are as `expect_right`
/// says, and that a wrong program does not hold. Returns the verdict.
fn attack(what: &str, gathered: bool, tail: &str, expect_right: bool) -> Verdict {
    attack_spec(what, gathered, &out_is("l"), tail, expect_right)
}

/// As [`attack`], the spec's tail `spec_tail`.
fn attack_spec(
    what: &str,
    gathered: bool,
    spec_tail: &str,
    tail: &str,
    expect_right: bool,
) -> Verdict {
    let (verdict, right, report) = run(gathered, spec_tail, tail);
    eprintln!("{what}: {verdict:?} (right: {right})");
    assert_eq!(right, expect_right, "{what}: the values\n{report}");
    if !right {
        assert_ne!(verdict, Verdict::Holds, "{what}: a false hold\n{report}");
    }
    verdict
}

/// dp's reduce-scatter of `t` (each dp rank one element of the sum), then `between` (lines
/// reading `rw`, `f64[1]`, defining `q`, `f64[1]`), gathered back over dp, the first element
/// read.
fn scattered(between: &str) -> String {
    let dp = MESH.0;
    format!(
        "        e: \"f64[{dp}]\" = torch.ops.aten.expand.default(t, [{dp}])
        rs: \"f64[1]\" = torch.ops._c10d_functional.reduce_scatter_tensor.default(e, 'sum', {dp}, 'dp')
        rw: \"f64[1]\" = torch.ops._c10d_functional.wait_tensor.default(rs)
{between}        qg: \"f64[{dp}]\" = torch.ops._c10d_functional.all_gather_into_tensor.default(q, {dp}, 'dp')
        qw: \"f64[{dp}]\" = torch.ops._c10d_functional.wait_tensor.default(qg)
        out: \"f64[]\" = torch.ops.aten.select.int(qw, 0, 0)
"
    )
}

/// A line dividing the `f64[1]` value `input` by `n` into `output`.
fn div1(input: &str, n: usize, output: &str) -> String {
    format!("        {output}: \"f64[1]\" = torch.ops.aten.div.Tensor({input}, {n})\n")
}

// ---- The all-reduce's factor (`times_factor`, `read_times_n`) ----

#[test]
fn a_sum_over_dp_divided_by_the_factor_then_by_dp_never_holds() {
    // The second division by a mesh dim's size: a share of dp read where none is pending.
    let tail = ar("t", "sum", "dp", "s") + &div("s", FACTOR, "u") + &div("u", MESH.0, "out");
    attack("sum over dp, /8, /dp", true, &tail, false);
}

#[test]
fn a_sum_over_dp_divided_by_a_tensor_equal_to_the_factor() {
    // A divisor computed as a tensor (a fill of 8): right, but not read by its number.
    // Divided by a tensor of another value: wrong, never holds.
    for (n, right) in [(FACTOR, true), (MESH.0, false)] {
        let tail = ar("t", "sum", "dp", "s")
            + &format!(
                "        nn: \"f64[]\" = torch.ops.aten.full.default([], {n}.0, dtype = torch.float64)
        out: \"f64[]\" = torch.ops.aten.div.Tensor(s, nn)
"
            );
        attack(&format!("sum over dp, / full({n})"), true, &tail, right);
    }
}

#[test]
fn a_sum_over_dp_divided_by_the_rows_numel_never_holds() {
    // The divisor read off the local rows: `yy.numel()` as a tensor (a sum of ones), 16 on
    // the gathered rows (r * ep rows of V), not the factor 8.
    let tail = ar("t", "sum", "dp", "s")
        + "        ones: \"f64[4, 4]\" = torch.ops.aten.ones_like.default(yy)
        nn: \"f64[]\" = torch.ops.aten.sum.default(ones)
        out: \"f64[]\" = torch.ops.aten.div.Tensor(s, nn)
";
    attack("sum over dp, / numel(yy)", true, &tail, false);
}

#[test]
fn a_sum_over_ep_of_own_rows_then_over_dp_divided_by_dp_never_holds() {
    // Each rank's own rows: ep's sum then dp's sum, divided by dp only: ep times the tensor.
    let tail = ar("t", "sum", "ep", "s") + &ar("s", "sum", "dp", "v") + &div("v", MESH.0, "out");
    attack(
        "own rows: sum over ep, sum over dp, /dp",
        false,
        &tail,
        false,
    );
    let tail = ar("t", "sum", "ep", "s") + &ar("s", "sum", "dp", "v") + &div("v", FACTOR, "out");
    attack("own rows: sum over ep, sum over dp, /8", false, &tail, true);
}

#[test]
fn averages_over_ep_then_over_dp_of_own_rows() {
    // ep's average completes ep's part; dp's average completes dp's: right. dp's sum alone
    // after ep's average: dp times the tensor.
    let tail = ar("t", "avg", "ep", "s") + &ar("s", "avg", "dp", "out");
    attack("own rows: avg over ep, avg over dp", false, &tail, true);
    let tail = ar("t", "avg", "ep", "s") + &ar("s", "sum", "dp", "out");
    attack("own rows: avg over ep, sum over dp", false, &tail, false);
}

#[test]
fn own_rows_reduced_over_one_mesh_dim_and_divided_by_the_whole_factor_never_hold() {
    // Own rows are partial on dp and on ep: a sum over one of them divided by dp x ep leaves
    // the other's pieces unsummed.
    for group in ["dp", "ep"] {
        let tail = ar("t", "sum", group, "s") + &div("s", FACTOR, "out");
        attack(
            &format!("own rows: sum over {group} only, /8"),
            false,
            &tail,
            false,
        );
    }
}

// ---- A lifted partial times a loss mean ----

#[test]
fn a_lifted_partial_times_the_global_loss_is_right() {
    // The loss averaged over the data group is the spec's loss (equal row counts): the lifted
    // partial times it, summed over dp and divided by the factor, is the spec's `l * nl`.
    let spec_tail = "        out: \"f64[]\" = torch.ops.aten.mul.Tensor(l, nl)\n";
    let tail = ar("nl", "avg", "dp_ep", "ng")
        + "        u: \"f64[]\" = torch.ops.aten.mul.Tensor(t, ng)\n"
        + &ar("u", "sum", "dp", "s")
        + &div("s", FACTOR, "out");
    let verdict = attack_spec(
        "t * global nl, sum over dp, /8",
        true,
        spec_tail,
        &tail,
        true,
    );
    eprintln!("(a right program: {verdict:?})");
    assert_eq!(verdict, Verdict::Holds);
}

#[test]
fn a_lifted_partial_times_the_local_loss_never_holds() {
    // The rank's own loss (a mean over its rows): each dp piece times a different number.
    let spec_tail = "        out: \"f64[]\" = torch.ops.aten.mul.Tensor(l, nl)\n";
    let tail = "        u: \"f64[]\" = torch.ops.aten.mul.Tensor(t, nl)\n".to_string()
        + &ar("u", "sum", "dp", "s")
        + &div("s", FACTOR, "out");
    attack_spec(
        "t * local nl, sum over dp, /8",
        true,
        spec_tail,
        &tail,
        false,
    );
}

#[test]
fn a_lifted_partial_times_the_loss_averaged_over_dp_alone_never_holds() {
    // The loss averaged over dp only is still each ep block's own mean (the walk does not
    // count a loss as a local mean: the rules must see the ep average left to do).
    let spec_tail = "        out: \"f64[]\" = torch.ops.aten.mul.Tensor(l, nl)\n";
    for gathered in [true, false] {
        let tail = ar("nl", "avg", "dp", "ng")
            + "        u: \"f64[]\" = torch.ops.aten.mul.Tensor(t, ng)\n"
            + &ar("u", "sum", "dp", "s")
            + &div("s", FACTOR, "out");
        let what = format!("t * nl averaged over dp, sum over dp, /8 (gathered: {gathered})");
        attack_spec(&what, gathered, spec_tail, &tail, false);
    }
}

#[test]
fn a_lifted_partial_times_the_local_loss_gradient_sum_never_holds() {
    // sum(gz * p) is a local mean on dp and ep: the product of two local means is n² times.
    let spec_tail = "        gs: \"f64[]\" = torch.ops.aten.sum.default(gp)
        out: \"f64[]\" = torch.ops.aten.mul.Tensor(l, gs)
";
    let tail = "        gs: \"f64[]\" = torch.ops.aten.sum.default(gp)\n".to_string()
        + &ar("gs", "sum", "tp", "gt")
        + "        u: \"f64[]\" = torch.ops.aten.mul.Tensor(t, gt)\n"
        + &ar("u", "sum", "dp", "s")
        + &div("s", FACTOR, "out");
    attack_spec(
        "t * local sum(gz*p), sum over dp, /8",
        true,
        spec_tail,
        &tail,
        false,
    );
}

// ---- The reduce-scatter's factor (`scattered_factor`) ----

#[test]
fn a_reduce_scatter_divided_in_two_steps_is_right() {
    // /dp then /ep: right; the record is not cleared by either (recorded, not required).
    let between = div1("rw", MESH.0, "q0") + &div1("q0", MESH.1, "q");
    let verdict = attack("reduce-scatter, /dp, /ep", true, &scattered(&between), true);
    eprintln!("(a right program: {verdict:?})");
}

/// dp's reduce-scatter of `t` expanded to `[dp, 2]` (each dp rank one row `[1, 2]` of the
/// sum), transposed, divided by `n`, transposed back, gathered over dp, one element read.
fn scattered_transposed(n: usize) -> String {
    let dp = MESH.0;
    format!(
        "        t2d: \"f64[1, 1]\" = torch.ops.aten.view.default(t, [1, 1])
        e: \"f64[{dp}, 2]\" = torch.ops.aten.expand.default(t2d, [{dp}, 2])
        rs: \"f64[1, 2]\" = torch.ops._c10d_functional.reduce_scatter_tensor.default(e, 'sum', {dp}, 'dp')
        rw: \"f64[1, 2]\" = torch.ops._c10d_functional.wait_tensor.default(rs)
        rt: \"f64[2, 1]\" = torch.ops.aten.t.default(rw)
        rd: \"f64[2, 1]\" = torch.ops.aten.div.Tensor(rt, {n})
        q: \"f64[1, 2]\" = torch.ops.aten.t.default(rd)
        qg: \"f64[{dp}, 2]\" = torch.ops._c10d_functional.all_gather_into_tensor.default(q, {dp}, 'dp')
        qw: \"f64[{dp}, 2]\" = torch.ops._c10d_functional.wait_tensor.default(qg)
        q0: \"f64[2]\" = torch.ops.aten.select.int(qw, 0, 0)
        out: \"f64[]\" = torch.ops.aten.select.int(q0, 0, 1)
"
    )
}

#[test]
fn a_reduce_scatter_transposed_then_divided() {
    // A transpose, the division, a transpose back: by the factor right (the record carried
    // by the views, cleared by the division); by dp wrong, never holds.
    for (n, right) in [(FACTOR, true), (MESH.0, false)] {
        let verdict = attack(
            &format!("reduce-scatter, t, /{n}, t"),
            true,
            &scattered_transposed(n),
            right,
        );
        eprintln!("(transposed, /{n}: {verdict:?})");
        if right {
            assert_eq!(verdict, Verdict::Holds, "the right program holds");
        }
    }
}

#[test]
fn a_reduce_scatter_transposed_then_divided_never_holds_undivided() {
    attack(
        "reduce-scatter, t, /1, t",
        true,
        &scattered_transposed(1),
        false,
    );
}

#[test]
fn a_reduce_scatter_gathered_then_divided() {
    // The shard gathered over dp first, then divided: by the factor right, by dp wrong.
    let dp = MESH.0;
    for (n, right) in [(FACTOR, true), (dp, false)] {
        let tail = format!(
            "        e: \"f64[{dp}]\" = torch.ops.aten.expand.default(t, [{dp}])
        rs: \"f64[1]\" = torch.ops._c10d_functional.reduce_scatter_tensor.default(e, 'sum', {dp}, 'dp')
        rw: \"f64[1]\" = torch.ops._c10d_functional.wait_tensor.default(rs)
        qg: \"f64[{dp}]\" = torch.ops._c10d_functional.all_gather_into_tensor.default(rw, {dp}, 'dp')
        qw: \"f64[{dp}]\" = torch.ops._c10d_functional.wait_tensor.default(qg)
        qd: \"f64[{dp}]\" = torch.ops.aten.div.Tensor(qw, {n})
        out: \"f64[]\" = torch.ops.aten.select.int(qd, 0, 0)
"
        );
        let verdict = attack(&format!("reduce-scatter, gather, /{n}"), true, &tail, right);
        eprintln!("(gathered then /{n}: {verdict:?})");
    }
}

#[test]
fn a_reduce_scatter_of_own_rows_then_summed_over_ep() {
    // Each rank's own rows: dp's reduce-scatter, then ep's sum (a lifted reduction reading
    // the factor 8), divided by 8: right; by dp: wrong.
    for (n, right) in [(FACTOR, true), (MESH.0, false)] {
        let between =
            "        re: \"f64[1]\" = torch.ops._c10d_functional.all_reduce.default(rw, 'sum', 'ep')
        rx: \"f64[1]\" = torch.ops._c10d_functional.wait_tensor.default(re)
"
            .to_string() + &div1("rx", n, "q");
        let verdict = attack(
            &format!("own rows: reduce-scatter over dp, sum over ep, /{n}"),
            false,
            &scattered(&between),
            right,
        );
        eprintln!("(own rows, sum over ep, /{n}: {verdict:?})");
        if right {
            assert_eq!(verdict, Verdict::Holds, "the right program holds");
        }
    }
}

#[test]
fn a_reduce_scatter_over_dp_then_a_second_over_ep_never_holds_undivided() {
    // Own rows: dp's reduce-scatter, ep's all-reduce, no division: 8 times the tensor.
    let between =
        "        re: \"f64[1]\" = torch.ops._c10d_functional.all_reduce.default(rw, 'sum', 'ep')
        q: \"f64[1]\" = torch.ops._c10d_functional.wait_tensor.default(re)
";
    attack(
        "own rows: reduce-scatter over dp, sum over ep, undivided",
        false,
        &scattered(between),
        false,
    );
}

#[test]
fn two_reduce_scatters_over_dp_then_ep_of_own_rows() {
    // Own rows: dp's reduce-scatter, then ep's (a lifted reduction reading the factor 8),
    // divided by n, gathered back over ep then dp.
    let (dp, ep, _) = MESH;
    for (n, right) in [(FACTOR, true), (dp, false), (1, false)] {
        let tail = format!(
            "        e: \"f64[{de}]\" = torch.ops.aten.expand.default(t, [{de}])
        rs: \"f64[{ep}]\" = torch.ops._c10d_functional.reduce_scatter_tensor.default(e, 'sum', {dp}, 'dp')
        rw: \"f64[{ep}]\" = torch.ops._c10d_functional.wait_tensor.default(rs)
        rs2: \"f64[1]\" = torch.ops._c10d_functional.reduce_scatter_tensor.default(rw, 'sum', {ep}, 'ep')
        rw2: \"f64[1]\" = torch.ops._c10d_functional.wait_tensor.default(rs2)
        q: \"f64[1]\" = torch.ops.aten.div.Tensor(rw2, {n})
        qg: \"f64[{ep}]\" = torch.ops._c10d_functional.all_gather_into_tensor.default(q, {ep}, 'ep')
        qw: \"f64[{ep}]\" = torch.ops._c10d_functional.wait_tensor.default(qg)
        qg2: \"f64[{de}]\" = torch.ops._c10d_functional.all_gather_into_tensor.default(qw, {dp}, 'dp')
        qw2: \"f64[{de}]\" = torch.ops._c10d_functional.wait_tensor.default(qg2)
        out: \"f64[]\" = torch.ops.aten.select.int(qw2, 0, 0)
",
            de = dp * ep
        );
        let verdict = attack(
            &format!("own rows: reduce-scatter over dp, then over ep, /{n}"),
            false,
            &tail,
            right,
        );
        eprintln!("(two reduce-scatters, /{n}: {verdict:?})");
        if right {
            assert_eq!(verdict, Verdict::Holds, "the right program holds");
        }
    }
}

#[test]
fn a_reduce_scatter_over_the_data_group_of_own_rows() {
    // One reduce-scatter over dp x ep: /8 right; /dp, /ep wrong.
    let (dp, ep, _) = MESH;
    let de = dp * ep;
    for (n, right) in [(FACTOR, true), (dp, false), (ep, false)] {
        let tail = format!(
            "        e: \"f64[{de}]\" = torch.ops.aten.expand.default(t, [{de}])
        rs: \"f64[1]\" = torch.ops._c10d_functional.reduce_scatter_tensor.default(e, 'sum', {de}, 'dp_ep')
        rw: \"f64[1]\" = torch.ops._c10d_functional.wait_tensor.default(rs)
        q: \"f64[1]\" = torch.ops.aten.div.Tensor(rw, {n})
        qg: \"f64[{de}]\" = torch.ops._c10d_functional.all_gather_into_tensor.default(q, {de}, 'dp_ep')
        qw: \"f64[{de}]\" = torch.ops._c10d_functional.wait_tensor.default(qg)
        out: \"f64[]\" = torch.ops.aten.select.int(qw, 0, 0)
"
        );
        let verdict = attack(
            &format!("own rows: reduce-scatter over dp_ep, /{n}"),
            false,
            &tail,
            right,
        );
        eprintln!("(reduce-scatter over dp_ep, /{n}: {verdict:?})");
        if right {
            assert_eq!(verdict, Verdict::Holds, "the right program holds");
        }
    }
}

#[test]
fn an_average_over_dp_of_own_rows_then_a_sum_over_ep() {
    // dp's average completes dp's part of the factor; ep's sum is ep times the tensor.
    let (_, ep, _) = MESH;
    let base = ar("t", "avg", "dp", "s") + &ar("s", "sum", "ep", "v");
    attack(
        "own rows: avg over dp, sum over ep",
        false,
        &(base.clone() + &out_is("v")),
        false,
    );
    attack(
        "own rows: avg over dp, sum over ep, /ep",
        false,
        &(base + &div("v", ep, "out")),
        true,
    );
}

#[test]
fn a_sum_over_dp_and_tp_of_the_tp_pieces() {
    // The rank's sum `l` (a partial sum on tp) reduced over a group of dp and tp at once:
    // summed, the tp pieces complete and dp's local means are 8 times: /8 right, /(dp*tp)
    // = 8 too on (4, 2, 2), /dp wrong. Averaged over dp x tp (8 = the factor): right.
    let mut groups_tail = Vec::new();
    for (n, right) in [(FACTOR, true), (MESH.0, false)] {
        groups_tail.push((
            format!("sum over dp_tp, /{n}"),
            ar("l", "sum", "dp_tp", "s") + &div("s", n, "out"),
            right,
        ));
    }
    groups_tail.push((
        "avg over dp_tp".to_string(),
        ar("l", "avg", "dp_tp", "out"),
        true,
    ));
    for (what, tail, right) in groups_tail {
        let (verdict, r, report) = run_raw(true, &out_is("l"), &tail);
        eprintln!("{what}: {verdict:?} (right: {r})");
        assert_eq!(r, right, "{what}: the values\n{report}");
        if !r {
            assert_ne!(verdict, Verdict::Holds, "{what}: a false hold\n{report}");
        }
        if what.starts_with("sum") && r {
            assert_eq!(
                verdict,
                Verdict::Holds,
                "{what}: the right program holds\n{report}"
            );
        }
    }
}

#[test]
fn a_reduce_scatter_times_the_inverse_factor() {
    // `mul` by 1/8 (and `div.Scalar` by 8) clear the record as `div.Tensor` by 8 does; `mul`
    // by 1/4 leaves twice the spec's shard.
    for (line, right) in [
        ("torch.ops.aten.mul.Tensor(rw, 0.125)", true),
        ("torch.ops.aten.div.Scalar(rw, 8)", true),
        ("torch.ops.aten.mul.Tensor(rw, 0.25)", false),
    ] {
        let between = format!("        q: \"f64[1]\" = {line}\n");
        let verdict = attack(
            &format!("reduce-scatter, {line}"),
            true,
            &scattered(&between),
            right,
        );
        eprintln!("({line}: {verdict:?})");
        if right {
            assert_eq!(verdict, Verdict::Holds, "{line}: the right program holds");
        }
    }
}

#[test]
fn a_reduce_scatter_average_over_the_data_group_of_own_rows() {
    // Own rows: an average over dp x ep (as large as the factor) completes the mean; over dp
    // alone (4 of 8) each shard is ep times the spec's.
    let (dp, ep, _) = MESH;
    let de = dp * ep;
    for (group, size, right) in [("dp_ep", de, true), ("dp", dp, false)] {
        let tail = format!(
            "        e: \"f64[{size}]\" = torch.ops.aten.expand.default(t, [{size}])
        rs: \"f64[1]\" = torch.ops._c10d_functional.reduce_scatter_tensor.default(e, 'avg', {size}, '{group}')
        q: \"f64[1]\" = torch.ops._c10d_functional.wait_tensor.default(rs)
        qg: \"f64[{size}]\" = torch.ops._c10d_functional.all_gather_into_tensor.default(q, {size}, '{group}')
        qw: \"f64[{size}]\" = torch.ops._c10d_functional.wait_tensor.default(qg)
        out: \"f64[]\" = torch.ops.aten.select.int(qw, 0, 0)
"
        );
        let verdict = attack(
            &format!("own rows: reduce-scatter avg over {group}"),
            false,
            &tail,
            right,
        );
        eprintln!("(reduce-scatter avg over {group}: {verdict:?})");
        if right {
            assert_eq!(verdict, Verdict::Holds, "{group}: the right program holds");
        }
    }
}

#[test]
fn a_sum_over_dp_divided_by_dp_then_summed_again_never_holds() {
    // Mesh (4, 1, 2): the factor is dp's own size. After the division completes the mean
    // (`Replicate()`), a second sum over dp is dp times the tensor; read as a share of dp it
    // would hold. A second average over dp is right.
    let mesh = (4, 1, 2);
    let first = ar("l", "sum", "tp", "t") + &ar("t", "sum", "dp", "s") + &div("s", 4, "u");
    for (op, right) in [("sum", false), ("avg", true)] {
        let what = format!("sum over dp, /dp, {op} over dp");
        let tail = first.clone() + &ar("u", op, "dp", "out");
        let (verdict, r, report) = run_on(mesh, false, &out_is("l"), &tail);
        eprintln!("{what}: {verdict:?} (right: {r})");
        assert_eq!(r, right, "{what}: the values\n{report}");
        if !r {
            assert_ne!(verdict, Verdict::Holds, "{what}: a false hold\n{report}");
        }
    }
}

// ---- Products across mesh dims (the property harness checks every claimed placement) ----

const P: In = In::P(Red::Sum);

/// A program whose spec and ranks run the same `lines`, checking `checked`.
fn program(mesh: &[usize], inputs: Vec<Input>, lines: &[&str], checked: &[&str]) -> Program {
    let body: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    Program {
        mesh: mesh.to_vec(),
        inputs,
        spec: body.clone(),
        ranks: vec![body],
        checked: checked
            .iter()
            .map(|c| (c.to_string(), c.to_string()))
            .collect(),
    }
}

/// Runs `prog` on a few seeds: panics naming `what` on a claim the values contradict.
fn no_false_claim(what: &str, prog: &Program) -> Seen {
    let mut last = Seen::default();
    for seed in 0..3 {
        last = props::run(prog, seed).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(
            last.skipped.is_none(),
            "{what}: skipped: {:?}",
            last.skipped
        );
    }
    eprintln!(
        "{what}: claims {} declined {} finding {} places {:?}",
        last.claims, last.declined, last.finding, last.places
    );
    last
}

#[test]
fn matmul_of_a_batch_on_dp_against_columns_on_dp() {
    // x's batch on dp, y's columns on dp (y's batch 1, broadcast): rank d computes only
    // x[d] @ y[.., d], the diagonal of the spec's blocks.
    let prog = program(
        &[2, 2],
        vec![
            Input::f("x", &[1, 2, 3], &[In::S(0), In::R]),
            Input::f("y", &[1, 3, 1], &[In::S(2), In::R]),
        ],
        &["o = torch.ops.aten.matmul.default(x, y)"],
        &["o"],
    );
    let seen = no_false_claim("matmul, batch on dp against columns on dp", &prog);
    assert!(
        seen.finding,
        "mixed shards on dp are not reported: {seen:?}"
    );
}

#[test]
fn matmul_of_a_batch_on_dp_against_a_permuted_batch_on_dp() {
    // y stored [b, k, n] with its batch on dp, permuted so the sharded dim becomes columns.
    let prog = program(
        &[2, 2],
        vec![
            Input::f("x", &[1, 2, 3], &[In::S(0), In::R]),
            Input::f("ys", &[1, 3, 1], &[In::S(0), In::R]),
        ],
        &[
            "y = torch.ops.aten.permute.default(ys, [2, 1, 0])",
            "o = torch.ops.aten.matmul.default(x, y)",
        ],
        &["o"],
    );
    let seen = no_false_claim("matmul, batch on dp against a permuted batch on dp", &prog);
    assert!(
        seen.finding,
        "mixed shards on dp are not reported: {seen:?}"
    );
}

#[test]
fn addmm_with_beta_and_alpha_over_a_partial_product() {
    // The contracted dim on tp: the product is a partial sum; a partial bias keeps it, a
    // replicated one is counted tp times, whatever beta and alpha.
    for (bias, what) in [(P, "partial bias"), (In::R, "replicated bias")] {
        let prog = program(
            &[2, 2],
            vec![
                Input::f("b", &[2, 2], &[In::S(0), bias]),
                Input::f("x", &[2, 3], &[In::S(0), In::S(1)]),
                Input::f("w", &[3, 2], &[In::R, In::S(0)]),
            ],
            &["o = torch.ops.aten.addmm.default(b, x, w, beta = 0.5, alpha = 2.0)"],
            &["o"],
        );
        let seen = no_false_claim(&format!("addmm beta 0.5 alpha 2, {what}"), &prog);
        // The right program claims its product; the wrong one is a finding.
        assert_eq!(seen.finding, bias == In::R, "{what}: {seen:?}");
        assert_eq!(seen.claims > 0, bias == P, "{what}: {seen:?}");
    }
}

#[test]
fn addmm_with_a_bias_replicated_on_one_dim_and_partial_on_the_other() {
    // The contracted dim split over dp and tp: the product is a partial sum on both. A bias
    // partial on both is right; replicated on either is counted that dim's size times.
    for (bias, what) in [
        ([P, P], "bias partial on both"),
        ([In::R, P], "bias replicated on dp, partial on tp"),
        ([P, In::R], "bias partial on dp, replicated on tp"),
    ] {
        let prog = program(
            &[2, 2],
            vec![
                Input::f("b", &[2, 2], &bias),
                Input::f("x", &[2, 1], &[In::S(1), In::S(1)]),
                Input::f("w", &[1, 2], &[In::S(0), In::S(0)]),
            ],
            &["o = torch.ops.aten.addmm.default(b, x, w, beta = 0.5, alpha = 2.0)"],
            &["o"],
        );
        let seen = no_false_claim(&format!("addmm, {what}"), &prog);
        let right = bias == [P, P];
        assert_eq!(seen.finding, !right, "{what}: {seen:?}");
        assert_eq!(seen.claims > 0, right, "{what}: {seen:?}");
    }
}

#[test]
fn baddbmm_with_a_bias_replicated_on_dp_beside_a_product_partial_on_dp() {
    for (bias, what) in [
        ([P, In::S(0)], "partial on dp"),
        ([In::R, In::S(0)], "replicated on dp"),
    ] {
        let prog = program(
            &[2, 2],
            vec![
                Input::f("s", &[1, 2, 2], &bias),
                Input::f("x", &[1, 2, 3], &[In::S(2), In::S(0)]),
                Input::f("y", &[1, 3, 2], &[In::S(1), In::S(0)]),
            ],
            &["o = torch.ops.aten.baddbmm.default(s, x, y, beta = 2.0, alpha = 0.5)"],
            &["o"],
        );
        let seen = no_false_claim(&format!("baddbmm, bias {what}, batch on tp"), &prog);
        let right = bias[0] == P;
        assert_eq!(seen.finding, !right, "{what}: {seen:?}");
        assert_eq!(seen.claims > 0, right, "{what}: {seen:?}");
    }
}

// ---- A reduce-scatter's factor across a message (docs/check.md Open) ----

/// The verdict, whether every stage-1 rank's `out` is the spec's, and the report of a
/// pipeline `pp × dp × tp` = (2, 2, 2): stage 0 computes the lifted partial on rows split
/// over dp (factor dp = 2), sums over tp, reduce-scatters over dp and divides its shard by
/// `before` (1: none), then sends it to stage 1, which divides by `after`, gathers over dp and
/// reads the first element as `out`.
fn across_a_message(before: usize, after: usize) -> (Verdict, bool, String) {
    let (pp, dp, tp) = (2usize, 2usize, 2usize);
    let r = B / dp;
    let spec = graph(B, SPEC, "", &out_is("l"));
    let stage0_tail = ar("l", "sum", "tp", "t")
        + &format!(
            "        e: \"f64[{dp}]\" = torch.ops.aten.expand.default(t, [{dp}])
        rs: \"f64[1]\" = torch.ops._c10d_functional.reduce_scatter_tensor.default(e, 'sum', {dp}, 'dp')
        rw: \"f64[1]\" = torch.ops._c10d_functional.wait_tensor.default(rs)
        rd: \"f64[1]\" = torch.ops.aten.div.Tensor(rw, {before})
        sent: \"f64[1]\" = torch.ops.shardproof_p2p.send.default(rd, 1, 0, 'pp')
        out0: \"f64[]\" = torch.ops.aten.clone.default(one)
"
        );
    let stage0 = graph(r, SPEC * dp as f64 / tp as f64, "", &stage0_tail)
        .replace("return (out,)", "return (out0,)");
    let stage1 = format!(
        "class G(torch.nn.Module):
    def forward(self):
        v: \"f64[1]\" = torch.ops.shardproof_p2p.recv.default([1], torch.float64, 0, 0, 'pp')
        q: \"f64[1]\" = torch.ops.aten.div.Tensor(v, {after})
        qg: \"f64[{dp}]\" = torch.ops._c10d_functional.all_gather_into_tensor.default(q, {dp}, 'dp')
        qw: \"f64[{dp}]\" = torch.ops._c10d_functional.wait_tensor.default(qg)
        out: \"f64[]\" = torch.ops.aten.select.int(qw, 0, 0)
        return (out,)
"
    );
    let ranks = pp * dp * tp;
    let texts: Vec<String> = (0..ranks)
        .map(|q| {
            if q < dp * tp {
                stage0.clone()
            } else {
                stage1.clone()
            }
        })
        .collect();
    let at0 = |p: &str| format!("{{ placement: {p}, at: {{ pp: 0 }} }}");
    let inputs = [
        ("z", at0("{ dp: Shard(0) }")),
        ("labels", at0("{ dp: Shard(0) }")),
        ("p", at0("{ dp: Shard(0), tp: Partial() }")),
        ("a", at0("{ dp: Shard(0) }")),
    ];
    let groups: Vec<(&str, Vec<&str>)> =
        vec![("pp", vec!["pp"]), ("dp", vec!["dp"]), ("tp", vec!["tp"])];
    let declared = Declared {
        name: "review-lifts-message",
        mesh: &[("pp", pp), ("dp", dp), ("tp", tp)],
        groups: &groups,
        inputs: &inputs,
        outputs: &[(
            "out",
            "{ placement: Replicate(), at: { pp: 1 } }".to_string(),
        )],
    };
    let case = load_written(&spec, &texts, &declared);
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
            if q >= dp * tp {
                return BTreeMap::new();
            }
            // Stage-0 rank `q = d * tp + t` holds row block `d`.
            let block = q / tp;
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
        envs.iter()
            .zip(&case.program.ranks)
            .skip(dp * tp)
            .all(|(env, g)| {
                env.get(at(g))
                    .is_some_and(|t: &Tensor| want.as_ref().is_some_and(|w| close(&t.data, w)))
            })
    });
    (report.verdict, right, report.render())
}

#[test]
fn a_reduce_scatter_divided_before_its_message_holds() {
    // The control: the division by the factor on the sender settles the record; the receiver
    // gathers the spec's shards.
    let (verdict, right, report) = across_a_message(2, 1);
    eprintln!("divided before the send: {verdict:?} (right: {right})\n{report}");
    assert!(right, "{report}");
    assert_eq!(verdict, Verdict::Holds, "{report}");
    // Sent undivided, divided by the factor on the receiver: right (the receiver's division
    // of a plain shard keeps its placement).
    let (verdict, right, report) = across_a_message(1, 2);
    eprintln!("divided after the recv: {verdict:?} (right: {right})\n{report}");
    assert!(right, "{report}");
}

#[test]
fn a_reduce_scatter_sent_undivided_never_holds() {
    // Pins that the recv keeps the sender's `scattered_factor`: without it the receiver reads
    // the shard of twice the spec's as the rules read it, and the gathered value holds.
    let (verdict, right, report) = across_a_message(1, 1);
    eprintln!("sent undivided: {verdict:?} (right: {right})\n{report}");
    assert!(!right, "{report}");
    assert_ne!(verdict, Verdict::Holds, "{report}");
}
