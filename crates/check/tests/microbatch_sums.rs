//! A microbatch's term that is itself a sum (issue 44): DeepSeek's stages add their layers'
//! auxiliary losses for one microbatch and divide that sum by the microbatch count K, so the
//! pipeline all-reduce's input is `(a_0 + b_0) / K + (a_1 + b_1) / K`, not a sum of terms each
//! divided by K, and the data-parallel mean over microbatches averages sums of means.
//!
//! Two readings make these hold: `rules::stage_shares` reads a division of a sum by a number
//! as the sum of its terms each divided by it (`(a + b) / c = a / c + b / c`), and
//! `rows::microbatch_average` finds a microbatch mean's rows below a sum of means (each
//! term's selection; the whole expression must still read that one selection only). Both
//! correct programs were inconclusive on the base (981d5a9^). Every other case computes a
//! wrong value (the arithmetic is given at each) and must stay not held. Every case also runs
//! through the reference interpreter against its spec, so an expectation that misreads a
//! program fails: a case that holds must compute the spec's value, a case that must not hold
//! must compute another.

mod common;

use shardproof_check::Verdict;
use shardproof_ir::DType;
use shardproof_ops::{Meta, Tensor};

/// A float tensor of `shape` with entries from a fixed sequence (`seed` picks the tensor).
fn data(seed: usize, shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::new(
        Meta::new(DType::F32, shape.to_vec()),
        (0..n)
            .map(|i| ((i * 37 + seed * 11) % 17) as f64 / 8.0 - 1.0)
            .collect(),
    )
}

/// Rows `start..end` of the 2-d tensor `t`.
fn rows(t: &Tensor, start: usize, end: usize) -> Tensor {
    let cols = t.meta.shape[1];
    Tensor::new(
        Meta::new(t.meta.dtype, vec![end - start, cols]),
        t.data[start * cols..end * cols].to_vec(),
    )
}

/// Asserts the case holds and computes the spec's value.
fn assert_right_holds((verdict, right): (Verdict, bool)) {
    assert!(right, "the interpreter finds the program wrong");
    assert_eq!(verdict, Verdict::Holds);
}

/// Asserts the case computes another value than the spec's and does not hold.
fn assert_wrong_not_held((verdict, right): (Verdict, bool)) {
    assert!(!right, "the interpreter finds the program right");
    assert_ne!(verdict, Verdict::Holds);
}

/// The pipeline cases' inputs: `x [4, 8]`, `w0`, `w1 [8, 8]`.
fn pipeline_leaf(name: &str) -> Tensor {
    match name {
        "x" => data(0, &[4, 8]),
        "w0" => data(1, &[8, 8]),
        _ => data(2, &[8, 8]),
    }
}

/// Pipeline (`pp=2`, 2 microbatches of `x: f32[4, 8]`, rows 0:2 and 2:4): the spec computes
/// `s = (mean(h) + mean(relu(h) @ w1)) + mean(relu(h))` with `h = x @ w0` (no spec node adds
/// stage 0's two terms alone); stage 0 the first and third terms, stage 1 the second (receiving `relu(h_k)` with tag k). `stage0` is stage 0's
/// lines after each microbatch's `m{k} = mean(h_k)`, `q{k} = mean(relu(h_k))` and its send,
/// ending in `t`; stage 1 adds `mean(recv_k @ w1) / 2`.
fn pipeline(stage0: &str, dir: &str) -> (Verdict, bool) {
    let module = |params: &str, body: &str| {
        format!(
            "class GraphModule(torch.nn.Module):\n    def forward(self, {params}):\n{body}        return (s,)\n"
        )
    };
    let reduce =
        "        a: \"f32[]\" = torch.ops._c10d_functional.all_reduce.default(t, 'sum', 'pp')\n\
                  \x20       s: \"f32[]\" = torch.ops._c10d_functional.wait_tensor.default(a)\n";
    let spec = "        h: \"f32[4, 8]\" = torch.ops.aten.mm.default(x, w0)\n\
                \x20       m: \"f32[]\" = torch.ops.aten.mean.default(h)\n\
                \x20       r: \"f32[4, 8]\" = torch.ops.aten.relu.default(h)\n\
                \x20       q: \"f32[]\" = torch.ops.aten.mean.default(r)\n\
                \x20       g: \"f32[4, 8]\" = torch.ops.aten.mm.default(r, w1)\n\
                \x20       n: \"f32[]\" = torch.ops.aten.mean.default(g)\n\
                \x20       u: \"f32[]\" = torch.ops.aten.add.Tensor(m, n)\n\
                \x20       s: \"f32[]\" = torch.ops.aten.add.Tensor(u, q)\n";
    let mut first = String::new();
    let mut second = String::new();
    for (k, (b, e)) in [(0, 2), (2, 4)].into_iter().enumerate() {
        first += &format!(
            "        x{k}: \"f32[2, 8]\" = torch.ops.aten.slice.Tensor(x, 0, {b}, {e})\n\
             \x20       h{k}: \"f32[2, 8]\" = torch.ops.aten.mm.default(x{k}, w0)\n\
             \x20       m{k}: \"f32[]\" = torch.ops.aten.mean.default(h{k})\n\
             \x20       r{k}: \"f32[2, 8]\" = torch.ops.aten.relu.default(h{k})\n\
             \x20       q{k}: \"f32[]\" = torch.ops.aten.mean.default(r{k})\n\
             \x20       send{k}: \"f32[2, 8]\" = torch.ops.shardproof_p2p.send.default(r{k}, 1, {k}, 'pp')\n"
        );
        second += &format!(
            "        v{k}: \"f32[2, 8]\" = torch.ops.shardproof_p2p.recv.default([2, 8], torch.float32, 0, {k}, 'pp')\n\
             \x20       g{k}: \"f32[2, 8]\" = torch.ops.aten.mm.default(v{k}, w1)\n\
             \x20       n{k}: \"f32[]\" = torch.ops.aten.mean.default(g{k})\n\
             \x20       e{k}: \"f32[]\" = torch.ops.aten.div.Scalar(n{k}, 2)\n"
        );
    }
    second += "        t: \"f32[]\" = torch.ops.aten.add.Tensor(e0, e1)\n";
    let all = "x: \"f32[4, 8]\", w0: \"f32[8, 8]\", w1: \"f32[8, 8]\"";
    let files = vec![
        ("spec.py".to_string(), module(all, spec)),
        (
            "r0.py".to_string(),
            module(
                "x: \"f32[4, 8]\", w0: \"f32[8, 8]\"",
                &(first + stage0 + reduce),
            ),
        ),
        (
            "r1.py".to_string(),
            module("w1: \"f32[8, 8]\"", &(second + reduce)),
        ),
        (
            "case.yaml".to_string(),
            "version: 1\nname: stage-sum-terms\nspec:\n  graph: spec.py\nimpl:\n  mesh: { pp: 2 }\n  \
             graphs: [r0.py, r1.py]\n  groups:\n    \"pp\": pp\ninputs:\n  \
             x: { placement: Replicate(), at: { pp: 0 } }\n  \
             w0: { placement: Replicate(), at: { pp: 0 } }\n  \
             w1: { placement: Replicate(), at: { pp: 1 } }\noutputs:\n  s: Replicate()\n"
                .to_string(),
        ),
    ];
    common::hand::check_and_run_files(
        &format!("stage-sum-terms-{dir}"),
        &files,
        "s",
        pipeline_leaf,
        |_, name| pipeline_leaf(name),
    )
}

/// Stage 0's `t = (a0 + b0) / k0 + (a1 + b1) / k1` for terms `[(a0, b0, k0), (a1, b1, k1)]`.
fn divided_sums(terms: [(&str, &str, u32); 2]) -> String {
    let mut out = String::new();
    for (k, (a, b, kk)) in terms.into_iter().enumerate() {
        out += &format!(
            "        u{k}: \"f32[]\" = torch.ops.aten.add.Tensor({a}, {b})\n\
             \x20       d{k}: \"f32[]\" = torch.ops.aten.div.Scalar(u{k}, {kk})\n"
        );
    }
    out + "        t: \"f32[]\" = torch.ops.aten.add.Tensor(d0, d1)\n"
}

#[test]
fn a_stage_dividing_each_microbatchs_sum_by_k_holds() {
    // Base: inconclusive (the atom `(m0 + q0) / 2` is no spec term).
    let body = divided_sums([("m0", "q0", 2), ("m1", "q1", 2)]);
    assert_right_holds(pipeline(&body, "holds"));
}

#[test]
fn a_sum_divided_by_another_count_is_not_held() {
    // (m0 + q0) / 4 + (m1 + q1) / 4: half the stage's terms.
    let body = divided_sums([("m0", "q0", 4), ("m1", "q1", 4)]);
    assert_wrong_not_held(pipeline(&body, "count"));
}

#[test]
fn one_microbatchs_sum_undivided_is_not_held() {
    // (m0 + q0) / 2 + (m1 + q1) / 1: microbatch 1 counted twice.
    let body = divided_sums([("m0", "q0", 2), ("m1", "q1", 1)]);
    assert_wrong_not_held(pipeline(&body, "undivided"));
}

#[test]
fn a_sum_divided_twice_is_not_held() {
    // ((m0 + q0) / 2) / 2 + ((m1 + q1) / 2) / 2: a quarter, not a half, of each.
    let body = "        u0: \"f32[]\" = torch.ops.aten.add.Tensor(m0, q0)\n\
                \x20       c0: \"f32[]\" = torch.ops.aten.div.Scalar(u0, 2)\n\
                \x20       d0: \"f32[]\" = torch.ops.aten.div.Scalar(c0, 2)\n\
                \x20       u1: \"f32[]\" = torch.ops.aten.add.Tensor(m1, q1)\n\
                \x20       c1: \"f32[]\" = torch.ops.aten.div.Scalar(u1, 2)\n\
                \x20       d1: \"f32[]\" = torch.ops.aten.div.Scalar(c1, 2)\n\
                \x20       t: \"f32[]\" = torch.ops.aten.add.Tensor(d0, d1)\n";
    assert_wrong_not_held(pipeline(body, "twice"));
}

#[test]
fn divided_sums_divided_again_are_not_held() {
    // ((m0 + q0) / 2 + (m1 + q1) / 2) / 2: the divisions multiply, a quarter of each term.
    let body = "        u0: \"f32[]\" = torch.ops.aten.add.Tensor(m0, q0)\n\
                \x20       d0: \"f32[]\" = torch.ops.aten.div.Scalar(u0, 2)\n\
                \x20       u1: \"f32[]\" = torch.ops.aten.add.Tensor(m1, q1)\n\
                \x20       d1: \"f32[]\" = torch.ops.aten.div.Scalar(u1, 2)\n\
                \x20       w: \"f32[]\" = torch.ops.aten.add.Tensor(d0, d1)\n\
                \x20       t: \"f32[]\" = torch.ops.aten.div.Scalar(w, 2)\n";
    assert_wrong_not_held(pipeline(body, "again"));
}

#[test]
fn a_sum_repeating_one_term_is_not_held() {
    // (m0 + m0) / 2 + (m1 + q1) / 2: q0 missing, m0 counted twice.
    let body = divided_sums([("m0", "m0", 2), ("m1", "q1", 2)]);
    assert_wrong_not_held(pipeline(&body, "repeat"));
}

#[test]
fn a_sum_nested_in_a_sum_divided_alike_holds() {
    // (m0 + q0) / 2 + (m1 / 2 + q1 / 2): the same value, divided at two levels.
    let body = "        u0: \"f32[]\" = torch.ops.aten.add.Tensor(m0, q0)\n\
                \x20       d0: \"f32[]\" = torch.ops.aten.div.Scalar(u0, 2)\n\
                \x20       a1: \"f32[]\" = torch.ops.aten.div.Scalar(m1, 2)\n\
                \x20       b1: \"f32[]\" = torch.ops.aten.div.Scalar(q1, 2)\n\
                \x20       d1: \"f32[]\" = torch.ops.aten.add.Tensor(a1, b1)\n\
                \x20       t: \"f32[]\" = torch.ops.aten.add.Tensor(d0, d1)\n";
    assert_right_holds(pipeline(body, "mixed"));
}

/// Data parallel (`dp=2`, `x: f32[8, 8]` sharded on rows, `f32[4, 8]` per rank): the spec
/// computes `loss = mean(x * x) + mean(x)`; each rank runs `body` (reading `x`,
/// writing `t`, its loss piece), then `loss = all_reduce(t, sum) / 2`.
fn data_parallel(body: &str, dir: &str) -> (Verdict, bool) {
    let graph = |rows: u32, body: &str| {
        format!(
            "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[{rows}, 8]\"):\n{body}        return (loss,)\n"
        )
    };
    let spec = "        p: \"f32[8, 8]\" = torch.ops.aten.mul.Tensor(x, x)\n\
                \x20       a: \"f32[]\" = torch.ops.aten.mean.default(p)\n\
                \x20       c: \"f32[]\" = torch.ops.aten.mean.default(x)\n\
                \x20       loss: \"f32[]\" = torch.ops.aten.add.Tensor(a, c)\n";
    let rank = body.to_string()
        + "        r: \"f32[]\" = torch.ops._c10d_functional.all_reduce.default(t, 'sum', 'dp')\n\
           \x20       w: \"f32[]\" = torch.ops._c10d_functional.wait_tensor.default(r)\n\
           \x20       loss: \"f32[]\" = torch.ops.aten.div.Scalar(w, 2)\n";
    let files = vec![
        ("spec.py".to_string(), graph(8, spec)),
        ("r0.py".to_string(), graph(4, &rank)),
        ("r1.py".to_string(), graph(4, &rank)),
        (
            "case.yaml".to_string(),
            "version: 1\nname: mb-sums\nspec:\n  graph: spec.py\nimpl:\n  mesh: { dp: 2 }\n  \
             graphs: [r0.py, r1.py]\n  groups:\n    \"dp\": dp\ninputs:\n  x: { dp: Shard(0) }\n\
             outputs:\n  loss: Replicate()\n"
                .to_string(),
        ),
    ];
    let x = data(3, &[8, 8]);
    common::hand::check_and_run_files(
        &format!("mb-sums-{dir}"),
        &files,
        "loss",
        |_| x.clone(),
        |q, _| rows(&x, 4 * q, 4 * q + 4),
    )
}

/// Microbatch `k`'s sum of means `M{k} = mean(s * s) + mean(z)` with `s` the rows `a`
/// and `z` the rows `b` of `x` (`start:end`), divided by `kk` (`d{k}`).
fn sum_of_means(k: usize, a: (u32, u32), b: (u32, u32), kk: u32) -> String {
    format!(
        "        s{k}: \"f32[{}, 8]\" = torch.ops.aten.slice.Tensor(x, 0, {}, {})\n\
         \x20       z{k}: \"f32[{}, 8]\" = torch.ops.aten.slice.Tensor(x, 0, {}, {})\n\
         \x20       p{k}: \"f32[{}, 8]\" = torch.ops.aten.mul.Tensor(s{k}, s{k})\n\
         \x20       a{k}: \"f32[]\" = torch.ops.aten.mean.default(p{k})\n\
         \x20       c{k}: \"f32[]\" = torch.ops.aten.mean.default(z{k})\n\
         \x20       M{k}: \"f32[]\" = torch.ops.aten.add.Tensor(a{k}, c{k})\n\
         \x20       d{k}: \"f32[]\" = torch.ops.aten.div.Scalar(M{k}, {kk})\n",
        a.1 - a.0,
        a.0,
        a.1,
        b.1 - b.0,
        b.0,
        b.1,
        a.1 - a.0,
    )
}

const DP_SUM: &str = "        t: \"f32[]\" = torch.ops.aten.add.Tensor(d0, d1)\n";

#[test]
fn microbatch_sums_of_means_hold() {
    // Base: inconclusive (no rows found on `M_k`, an add of means: the 1/2 stays unknown).
    let body = sum_of_means(0, (0, 2), (0, 2), 2) + &sum_of_means(1, (2, 4), (2, 4), 2) + DP_SUM;
    assert_right_holds(data_parallel(&body, "holds"));
}

#[test]
fn a_sum_of_means_reading_another_microbatch_is_not_held() {
    // M1's second mean over rows 0:2 again: mean(x[0:2]) counted twice, x[2:4] never.
    let body = sum_of_means(0, (0, 2), (0, 2), 2) + &sum_of_means(1, (2, 4), (0, 2), 2) + DP_SUM;
    assert_wrong_not_held(data_parallel(&body, "other"));
}

#[test]
fn sums_of_means_divided_by_another_count_are_not_held() {
    // Each microbatch's sum divided by 4: half the loss.
    let body = sum_of_means(0, (0, 2), (0, 2), 4) + &sum_of_means(1, (2, 4), (2, 4), 4) + DP_SUM;
    assert_wrong_not_held(data_parallel(&body, "count"));
}

#[test]
fn sums_of_means_over_unequal_rows_are_not_held() {
    // Microbatches of 1 and 3 rows: their means weigh rows unequally.
    let body = sum_of_means(0, (0, 1), (0, 1), 2) + &sum_of_means(1, (1, 4), (1, 4), 2) + DP_SUM;
    assert_wrong_not_held(data_parallel(&body, "unequal"));
}

/// Pipeline and tensor parallel (`pp=2 x tp=2`, ranks `2 * pp + tp`, 2 microbatches of
/// `x: f32[4, 8]` placed `x_place` on stage 0): the spec computes
/// `s = (sum(h) + sum(relu(h) @ w1)) + sum(relu(h))` with `h = x @ w0`; stage 0 computes each
/// microbatch's `m{k} = sum(h_k)`, `q{k} = sum(relu(h_k))` (rows `rows[k]` of its `x`), then
/// `stage0` (ending in `t`), all-reduced over `tp` and then over `pp`; stage 1 adds its
/// `sum(recv_k @ w1)` and all-reduces over `pp`. Sums over microbatches are not divided.
fn pipeline_tp(x_place: &str, micro: [(u32, u32); 2], stage0: &str, dir: &str) -> (Verdict, bool) {
    let module = |params: &str, body: &str| {
        format!(
            "class GraphModule(torch.nn.Module):\n    def forward(self, {params}):\n{body}        return (s,)\n"
        )
    };
    let spec = "        h: \"f32[4, 8]\" = torch.ops.aten.mm.default(x, w0)\n\
                \x20       m: \"f32[]\" = torch.ops.aten.sum.default(h)\n\
                \x20       r: \"f32[4, 8]\" = torch.ops.aten.relu.default(h)\n\
                \x20       q: \"f32[]\" = torch.ops.aten.sum.default(r)\n\
                \x20       g: \"f32[4, 8]\" = torch.ops.aten.mm.default(r, w1)\n\
                \x20       n: \"f32[]\" = torch.ops.aten.sum.default(g)\n\
                \x20       u: \"f32[]\" = torch.ops.aten.add.Tensor(m, n)\n\
                \x20       s: \"f32[]\" = torch.ops.aten.add.Tensor(u, q)\n";
    let local = micro[1].1;
    let mut first = String::new();
    let mut second = String::new();
    for (k, (b, e)) in micro.into_iter().enumerate() {
        let len = e - b;
        first += &format!(
            "        x{k}: \"f32[{len}, 8]\" = torch.ops.aten.slice.Tensor(x, 0, {b}, {e})\n\
             \x20       h{k}: \"f32[{len}, 8]\" = torch.ops.aten.mm.default(x{k}, w0)\n\
             \x20       m{k}: \"f32[]\" = torch.ops.aten.sum.default(h{k})\n\
             \x20       r{k}: \"f32[{len}, 8]\" = torch.ops.aten.relu.default(h{k})\n\
             \x20       q{k}: \"f32[]\" = torch.ops.aten.sum.default(r{k})\n\
             \x20       send{k}: \"f32[{len}, 8]\" = torch.ops.shardproof_p2p.send.default(r{k}, 1, {k}, 'pp')\n"
        );
        second += &format!(
            "        v{k}: \"f32[{len}, 8]\" = torch.ops.shardproof_p2p.recv.default([{len}, 8], torch.float32, 0, {k}, 'pp')\n\
             \x20       g{k}: \"f32[{len}, 8]\" = torch.ops.aten.mm.default(v{k}, w1)\n\
             \x20       n{k}: \"f32[]\" = torch.ops.aten.sum.default(g{k})\n"
        );
    }
    first += "        b: \"f32[]\" = torch.ops._c10d_functional.all_reduce.default(t, 'sum', 'tp')\n\
              \x20       c: \"f32[]\" = torch.ops._c10d_functional.wait_tensor.default(b)\n\
              \x20       a: \"f32[]\" = torch.ops._c10d_functional.all_reduce.default(c, 'sum', 'pp')\n\
              \x20       s: \"f32[]\" = torch.ops._c10d_functional.wait_tensor.default(a)\n";
    second += "        t: \"f32[]\" = torch.ops.aten.add.Tensor(n0, n1)\n\
               \x20       a: \"f32[]\" = torch.ops._c10d_functional.all_reduce.default(t, 'sum', 'pp')\n\
               \x20       s: \"f32[]\" = torch.ops._c10d_functional.wait_tensor.default(a)\n";
    let all = "x: \"f32[4, 8]\", w0: \"f32[8, 8]\", w1: \"f32[8, 8]\"";
    let stage0_file = module(
        &format!("x: \"f32[{local}, 8]\", w0: \"f32[8, 8]\""),
        &(first.replace(
            "        b: \"f32[]\" = torch",
            &format!("{stage0}        b: \"f32[]\" = torch"),
        )),
    );
    let files = vec![
        ("spec.py".to_string(), module(all, spec)),
        ("r0.py".to_string(), stage0_file),
        ("r2.py".to_string(), module("w1: \"f32[8, 8]\"", &second)),
        (
            "case.yaml".to_string(),
            format!(
                "version: 1\nname: stage-tp-shares\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ pp: 2, tp: 2 }}\n  \
                 graphs: [r0.py, r0.py, r2.py, r2.py]\n  groups:\n    \"pp\": pp\n    \"tp\": tp\ninputs:\n  \
                 x: {{ placement: {x_place}, at: {{ pp: 0 }} }}\n  \
                 w0: {{ placement: Replicate(), at: {{ pp: 0 }} }}\n  \
                 w1: {{ placement: Replicate(), at: {{ pp: 1 }} }}\noutputs:\n  s: Replicate()\n"
            ),
        ),
    ];
    // Rank `2 * pp + tp`: under `{ tp: Shard(0) }` stage 0's tp rank t holds rows 2t..2t+2.
    let split = x_place.contains("Shard");
    common::hand::check_and_run_files(
        &format!("stage-tp-shares-{dir}"),
        &files,
        "s",
        pipeline_leaf,
        |q, name| match name {
            "x" if split => rows(&pipeline_leaf("x"), 2 * (q % 2), 2 * (q % 2) + 2),
            _ => pipeline_leaf(name),
        },
    )
}

/// Stage 0's `t = (m0 / 2 + q0 / 2) + (m1 / 2 + q1 / 2)`: each term's tensor-parallel share.
const TP_SHARES: &str = "        a0: \"f32[]\" = torch.ops.aten.div.Scalar(m0, 2)\n\
                         \x20       b0: \"f32[]\" = torch.ops.aten.div.Scalar(q0, 2)\n\
                         \x20       u0: \"f32[]\" = torch.ops.aten.add.Tensor(a0, b0)\n\
                         \x20       a1: \"f32[]\" = torch.ops.aten.div.Scalar(m1, 2)\n\
                         \x20       b1: \"f32[]\" = torch.ops.aten.div.Scalar(q1, 2)\n\
                         \x20       u1: \"f32[]\" = torch.ops.aten.add.Tensor(a1, b1)\n\
                         \x20       t: \"f32[]\" = torch.ops.aten.add.Tensor(u0, u1)\n";

#[test]
fn stage_shares_summed_over_tp_first_hold() {
    // Base: inconclusive (the pp all-reduce's input is a tp all-reduce, no spec term).
    let v = pipeline_tp("Replicate()", [(0, 2), (2, 4)], TP_SHARES, "holds");
    assert_right_holds(v);
}

#[test]
fn stage_terms_summed_over_tp_undivided_are_not_held() {
    // (m0 + q0) + (m1 + q1) on both tp ranks, summed over tp: twice stage 0's terms.
    let body = "        u0: \"f32[]\" = torch.ops.aten.add.Tensor(m0, q0)\n\
                \x20       u1: \"f32[]\" = torch.ops.aten.add.Tensor(m1, q1)\n\
                \x20       t: \"f32[]\" = torch.ops.aten.add.Tensor(u0, u1)\n";
    let v = pipeline_tp("Replicate()", [(0, 2), (2, 4)], body, "undivided");
    assert_wrong_not_held(v);
}

#[test]
fn stage_shares_of_tp_shards_are_not_held() {
    // x split on tp by rows: each tp rank's sums cover its 2 rows, halved, summed over tp:
    // half of stage 0's terms.
    let v = pipeline_tp("{ tp: Shard(0) }", [(0, 1), (1, 2)], TP_SHARES, "shards");
    assert_wrong_not_held(v);
}
