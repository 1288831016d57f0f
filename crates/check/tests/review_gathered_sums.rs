//! Adversarial review of the two readings for the experts' gradients (issue 44):
//! `rows::frame_summed` (a sum over a frame's whole selection keeps the frame lane's
//! placement) and `rows::gathered_over` with `engine::gathered_sums` (a dp partial over rows
//! gathered over ep). Each program is run through the interpreter; a program the interpreter
//! shows wrong must never hold.
//!
//! Mesh `dp: 2, ep: 2`. Rank `(d, e)` holds block `2d + e` of the tokens `x [K*L, H]`; per
//! microbatch k it slices its rows and gathers them over ep (`t{k}`: dp's block d's
//! microbatch on both ep coordinates), then each scenario sums them its own way.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use shardproof_check::{check_case, Verdict};
use shardproof_ops::Tensor;
use std::collections::BTreeMap;

mod common;
use common::dispatch::{
    block, dp_and_ep_groups, gathered_rows, load_written, rank_outs, spec_out, ty, Declared, Ran,
};
use common::values::{close, random};

/// Coordinates of dp and of ep.
const N: usize = 2;
/// Microbatches.
const K: usize = 2;
/// Rows a microbatch of a rank's shard.
const L: usize = 2;
/// Hidden size.
const H: usize = 3;

/// How a mesh dim holds the output, as the case declares it and the assembly reads it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Lay {
    Sum,
    Rep,
}

impl Lay {
    fn yaml(self) -> &'static str {
        match self {
            Lay::Sum => "Partial(sum)",
            Lay::Rep => "Replicate()",
        }
    }
}

/// One program: the body after the gathers (`t{k}` of shape `[N*L, H]`), ending in `out`
/// of shape `out_shape`; the spec's body over `x [B, H]` ending in `out`; the layout declared.
struct Scenario {
    name: &'static str,
    body: Vec<String>,
    out_shape: Vec<usize>,
    spec_body: Vec<String>,
    dp: Lay,
    ep: Lay,
}

fn rank_graph(s: &Scenario) -> String {
    let params = vec![format!("x: {}", ty(&[K * L, H]))];
    let mut b = Vec::new();
    for k in 0..K {
        b.extend(gathered_rows(k, (L, H), ("ep", N), &format!("t{k}")));
    }
    b.extend(s.body.iter().cloned());
    common::hand::graph_module(&params, &b)
}

/// What the checker and the interpreter say of `s`, the ranks' outputs assembled as declared.
fn run(s: &Scenario) -> Ran {
    let batch = N * N * K * L;
    let spec_params = vec![format!("x: {}", ty(&[batch, H]))];
    let case = load_written(
        &common::hand::graph_module(&spec_params, &s.spec_body),
        &vec![rank_graph(s); N * N],
        &Declared {
            name: "review-gathered-sums",
            mesh: &[("dp", N), ("ep", N)],
            groups: &dp_and_ep_groups(),
            inputs: &[("x", "{ dp: Shard(0), ep: Shard(0) }".to_string())],
            outputs: &[(
                "out",
                format!("{{ dp: {}, ep: {} }}", s.dp.yaml(), s.ep.yaml()),
            )],
        },
    );
    let report = check_case(&case).unwrap_or_else(|e| panic!("{e}"));
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let xs = random(&[batch, H], &mut rng);
    let leaves = BTreeMap::from([("x".to_string(), xs.clone())]);
    let want = spec_out(&case, &leaves);
    let per_rank: Vec<BTreeMap<String, Tensor>> = (0..N * N)
        .map(|q| BTreeMap::from([("x".to_string(), block(&xs, &[K * L, H], q))]))
        .collect();
    let envs = rank_outs(&case, &per_rank).expect("the ranks run");
    let outs: Vec<Vec<f64>> = envs
        .iter()
        .map(|o| {
            let o = o.as_ref().unwrap();
            assert_eq!(o.meta.shape, s.out_shape, "{}", s.name);
            o.data.to_vec()
        })
        .collect();
    // Combine over ep within each dp coordinate, then over dp; a replicated dim must hold
    // the same values on every coordinate.
    let combine = |parts: Vec<Vec<f64>>, lay: Lay| -> Option<Vec<f64>> {
        match lay {
            Lay::Sum => Some(parts.iter().fold(vec![0.0; parts[0].len()], |a, p| {
                a.iter().zip(p).map(|(x, y)| x + y).collect()
            })),
            Lay::Rep => parts
                .iter()
                .all(|p| close(p, &parts[0]))
                .then(|| parts[0].clone()),
        }
    };
    let per_dp: Option<Vec<Vec<f64>>> = (0..N)
        .map(|d| combine((0..N).map(|e| outs[d * N + e].clone()).collect(), s.ep))
        .collect();
    let got = per_dp.and_then(|p| combine(p, s.dp));
    let right = matches!((got, want), (Some(g), Some(w)) if close(&g, &w));
    Ran {
        verdict: report.verdict,
        right,
        report: report.render(),
    }
}

/// Sums of each microbatch's gathered rows over dim 0, `s{k}: [H]`, added into `sum`.
fn summed(rows: &dyn Fn(usize) -> String) -> Vec<String> {
    let mut b = Vec::new();
    for k in 0..K {
        b.push(rows(k));
        b.push(format!(
            "s{k}: {} = torch.ops.aten.sum.dim_IntList(r{k}, [0])",
            ty(&[H])
        ));
    }
    b.push(format!(
        "sum: {} = torch.ops.aten.add.Tensor(s0, s1)",
        ty(&[H])
    ));
    b
}

/// The gathered rows as they are.
fn plain_rows(k: usize) -> String {
    format!(
        "r{k}: {} = torch.ops.aten.clone.default(t{k})",
        ty(&[N * L, H])
    )
}

/// The scenario `name` whose spec sums `x`'s rows into `out [H]`, the ranks running `body`,
/// the output declared `dp` on dp and `ep` on ep.
fn sum_of_x(name: &'static str, body: Vec<String>, dp: Lay, ep: Lay) -> Scenario {
    Scenario {
        name,
        body,
        out_shape: vec![H],
        spec_body: spec_sum(),
        dp,
        ep,
    }
}

fn spec_sum() -> Vec<String> {
    vec![format!(
        "out: {} = torch.ops.aten.sum.dim_IntList(x, [0])",
        ty(&[H])
    )]
}

fn all_reduce(input: &str, out: &str, group: &str) -> Vec<String> {
    vec![
        format!(
            "ar_{out}: {} = torch.ops._c10d_functional.all_reduce.default({input}, 'sum', '{group}')",
            ty(&[H])
        ),
        format!(
            "{out}: {} = torch.ops._c10d_functional.wait_tensor.default(ar_{out})",
            ty(&[H])
        ),
    ]
}

fn with_tail(mut b: Vec<String>, tail: Vec<String>) -> Vec<String> {
    b.extend(tail);
    b
}

fn rename_sum_to_out(b: Vec<String>) -> Vec<String> {
    with_tail(
        b,
        vec![format!(
            "out: {} = torch.ops.aten.clone.default(sum)",
            ty(&[H])
        )],
    )
}

fn never_holds(s: Scenario) {
    run(&s).assert_never_holds(s.name);
}

fn right_when_run(s: Scenario) -> Verdict {
    let ran = run(&s);
    eprintln!("{}: {:?}\n{}", s.name, ran.verdict, ran.report);
    assert!(
        ran.right,
        "{}: the correct program is wrong when run",
        s.name
    );
    ran.verdict
}

/// The gathered rows' sum over dp's tokens: correct, and the readings take it.
#[test]
fn a_sum_of_gathered_rows_is_read() {
    let v = right_when_run(sum_of_x(
        "sum",
        rename_sum_to_out(summed(&plain_rows)),
        Lay::Sum,
        Lay::Rep,
    ));
    eprintln!("sum of gathered rows: {v:?}");
}

/// Each microbatch's gathered rows repeated: every row counts twice.
#[test]
fn repeated_gathered_rows_never_hold() {
    never_holds(sum_of_x(
        "repeat",
        rename_sum_to_out(summed(&|k| {
            format!(
                "r{k}: {} = torch.ops.aten.repeat.default(t{k}, [2, 1])",
                ty(&[2 * N * L, H])
            )
        })),
        Lay::Sum,
        Lay::Rep,
    ));
}

/// Each microbatch's gathered rows concatenated with themselves: every row counts twice.
#[test]
fn gathered_rows_concatenated_twice_never_hold() {
    never_holds(sum_of_x(
        "cat",
        rename_sum_to_out(summed(&|k| {
            format!(
                "r{k}: {} = torch.ops.aten.cat.default([t{k}, t{k}])",
                ty(&[2 * N * L, H])
            )
        })),
        Lay::Sum,
        Lay::Rep,
    ));
}

/// The sum declared a sum over ep too: ep's coordinates hold the same sum, added twice.
#[test]
fn the_gathered_sum_declared_a_sum_over_ep_never_holds() {
    never_holds(sum_of_x(
        "ep-sum",
        rename_sum_to_out(summed(&plain_rows)),
        Lay::Sum,
        Lay::Sum,
    ));
}

/// The gathered sum all-reduced over dp: the whole sum on every rank.
#[test]
fn the_gathered_sum_all_reduced_over_dp_is_read() {
    let v = right_when_run(sum_of_x(
        "all-reduce dp",
        with_tail(summed(&plain_rows), all_reduce("sum", "out", "dp")),
        Lay::Rep,
        Lay::Rep,
    ));
    eprintln!("all-reduced over dp: {v:?}");
}

/// All-reduced over dp and then over ep: twice the sum.
#[test]
fn the_gathered_sum_all_reduced_over_dp_and_ep_never_holds() {
    let mut b = with_tail(summed(&plain_rows), all_reduce("sum", "dsum", "dp"));
    b.extend(all_reduce("dsum", "out", "ep"));
    never_holds(sum_of_x("all-reduce dp, ep", b, Lay::Rep, Lay::Rep));
}

/// The partial over gathered rows all-reduced over ep before anything else: each ep
/// coordinate adds the other's copy of the same sum.
#[test]
fn the_gathered_partial_all_reduced_over_ep_never_holds() {
    never_holds(sum_of_x(
        "all-reduce ep",
        with_tail(summed(&plain_rows), all_reduce("sum", "out", "ep")),
        Lay::Sum,
        Lay::Rep,
    ));
}

/// The partial over gathered rows through a view first: still the sum.
#[test]
fn the_gathered_partial_through_a_view_is_read() {
    let mut b = summed(&plain_rows);
    b.push(format!(
        "out: {} = torch.ops.aten.view.default(sum, [1, {H}])",
        ty(&[1, H])
    ));
    let v = right_when_run(Scenario {
        name: "view",
        body: b,
        out_shape: vec![1, H],
        spec_body: vec![
            format!("s: {} = torch.ops.aten.sum.dim_IntList(x, [0])", ty(&[H])),
            format!(
                "out: {} = torch.ops.aten.view.default(s, [1, {H}])",
                ty(&[1, H])
            ),
        ],
        dp: Lay::Sum,
        ep: Lay::Rep,
    });
    eprintln!("through a view: {v:?}");
}

/// The gathered tokens reduce-scattered over ep (a sum of ep's two copies of dp's block:
/// each rank gets twice its own rows back), then summed.
#[test]
fn gathered_rows_reduce_scattered_over_ep_never_hold() {
    let mut b = Vec::new();
    for k in 0..K {
        b.push(format!(
            "rs{k}: {} = torch.ops._c10d_functional.reduce_scatter_tensor.default(t{k}, 'sum', {N}, 'ep')",
            ty(&[L, H])
        ));
        b.push(format!(
            "r{k}: {} = torch.ops._c10d_functional.wait_tensor.default(rs{k})",
            ty(&[L, H])
        ));
        b.push(format!(
            "s{k}: {} = torch.ops.aten.sum.dim_IntList(r{k}, [0])",
            ty(&[H])
        ));
    }
    b.push(format!(
        "out: {} = torch.ops.aten.add.Tensor(s0, s1)",
        ty(&[H])
    ));
    never_holds(sum_of_x("reduce-scatter ep", b, Lay::Sum, Lay::Sum));
}

/// Each microbatch's tokens gathered over ep (`t{k}`) and then over dp: `r{k}`, the whole
/// microbatch on every rank, each row once.
fn gathered_twice(k: usize) -> String {
    format!(
        "a{k}: {} = torch.ops._c10d_functional.all_gather_into_tensor.default(t{k}, {N}, 'dp')\n        r{k}: {} = torch.ops._c10d_functional.wait_tensor.default(a{k})",
        ty(&[N * N * L, H]),
        ty(&[N * N * L, H])
    )
}

/// The tokens gathered over ep and then over dp: right when run, so no finding may be
/// reported (was a postcondition finding: the second gather made ep's frame `Varying`).
#[test]
fn rows_gathered_over_ep_then_dp_are_no_finding() {
    let v = right_when_run(sum_of_x(
        "gathered twice",
        rename_sum_to_out(summed(&gathered_twice)),
        Lay::Rep,
        Lay::Rep,
    ));
    assert_ne!(v, Verdict::Violated);
}

/// The gathered rows gathered again over dp: every rank holds the whole microbatch, each row
/// once, so the sum is replicated. On ep the gather over dp leaves the frame (every ep
/// coordinate gathers the same frames: `Replicate()`, `frame::gathered_elsewhere`); on dp it
/// enters dp's frame of the rows gathered over ep, whose sum `frame_summed` reads.
#[test]
fn rows_gathered_over_ep_then_dp_hold() {
    let v = right_when_run(sum_of_x(
        "gathered twice",
        rename_sum_to_out(summed(&gathered_twice)),
        Lay::Rep,
        Lay::Rep,
    ));
    assert_eq!(v, Verdict::Holds);
}

/// Gathered over ep and dp, then repeated: every row counts twice.
#[test]
fn rows_gathered_twice_then_repeated_never_hold() {
    never_holds(sum_of_x(
        "gathered twice, repeated",
        rename_sum_to_out(summed(&|k| {
            format!(
                "{}\n        r{k}: {} = torch.ops.aten.repeat.default(q{k}, [2, 1])",
                gathered_twice(k).replace(&format!("r{k}:"), &format!("q{k}:")),
                ty(&[2 * N * N * L, H])
            )
        })),
        Lay::Rep,
        Lay::Rep,
    ));
}

/// Gathered over ep and dp, summed, declared a sum over ep (or over dp): the whole sum on
/// every coordinate, added again.
#[test]
fn rows_gathered_twice_declared_a_sum_never_hold() {
    for (dp, ep) in [(Lay::Rep, Lay::Sum), (Lay::Sum, Lay::Rep)] {
        never_holds(sum_of_x(
            "gathered twice, declared a sum",
            rename_sum_to_out(summed(&gathered_twice)),
            dp,
            ep,
        ));
    }
}

/// Gathered over ep and dp, summed, then all-reduced over ep: twice the sum.
#[test]
fn rows_gathered_twice_all_reduced_over_ep_never_hold() {
    never_holds(sum_of_x(
        "gathered twice, all-reduced over ep",
        with_tail(summed(&gathered_twice), all_reduce("sum", "out", "ep")),
        Lay::Rep,
        Lay::Rep,
    ));
}

/// Gathered over ep and then over ep again (not dp): each ep coordinate's rows twice, dp's
/// other rows never.
#[test]
fn rows_gathered_over_ep_twice_never_hold() {
    never_holds(sum_of_x(
        "gathered over ep twice",
        rename_sum_to_out(summed(&|k| gathered_twice(k).replace("'dp'", "'ep'"))),
        Lay::Rep,
        Lay::Rep,
    ));
}

/// Gathered over ep and dp, then only the first half of the rows summed (dp coordinate 0's).
#[test]
fn half_of_the_rows_gathered_twice_never_hold() {
    never_holds(sum_of_x(
        "gathered twice, half summed",
        rename_sum_to_out(summed(&|k| {
            format!(
                "{}\n        r{k}: {} = torch.ops.aten.slice.Tensor(q{k}, 0, 0, {})",
                gathered_twice(k).replace(&format!("r{k}:"), &format!("q{k}:")),
                ty(&[N * L, H]),
                N * L
            )
        })),
        Lay::Rep,
        Lay::Rep,
    ));
}
