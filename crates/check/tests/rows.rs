//! Rows of a selection (`Rows(d, id)`): the microbatch slices of a batch shard. The correct
//! gradient accumulation holds; every program that pairs the rows with other rows (another
//! microbatch, the whole replicated batch), reads their order (a gather, a declared shard) or
//! sums them over the mesh dim is never a pass.

use shardproof_check::{check_case, plan::parse_plan, Report, Verdict};
use std::path::Path;

fn check(text: &str) -> Report {
    let case = parse_plan(Path::new("rows.plan"), text).unwrap_or_else(|e| panic!("{e}"));
    check_case(&case).unwrap_or_else(|e| panic!("{e}"))
}

/// Two microbatches of a dp-sharded batch and its labels, each through a product and a
/// squared error summed over its rows (a partial sum over dp), accumulated and all-reduced.
fn accumulation(labels_mb0: &str, extra: &str, out: &str) -> String {
    format!(
        "mesh dp=2\n\
         input x: f32[8, 4] dp=Shard(0)\n\
         input t: f32[8, 4] dp=Shard(0)\n\
         input w: f32[4, 4] dp=Replicate()\n\
         x0 = slice(x, 0, 0, 2)\n\
         t0 = slice(t, 0, {labels_mb0})\n\
         y0 = mm(x0, w)\n\
         e0 = sub(y0, t0)\n\
         q0 = mul(e0, e0)\n\
         s0 = aten.sum.dim_IntList(q0, [0])\n\
         x1 = slice(x, 0, 2, 4)\n\
         t1 = slice(t, 0, 2, 4)\n\
         y1 = mm(x1, w)\n\
         e1 = sub(y1, t1)\n\
         q1 = mul(e1, e1)\n\
         s1 = aten.sum.dim_IntList(q1, [0])\n\
         s = add(s0, s1)\n\
         {extra}\
         {out}"
    )
}

#[test]
fn gradient_accumulation_over_microbatches_holds() {
    let r = check(&accumulation(
        "0, 2",
        "g = all_reduce(s, sum, dp)\n",
        "output g dp=Replicate()\n",
    ));
    assert_eq!(r.verdict, Verdict::Holds, "{}", r.render());
    assert_eq!(r.unknown_values, 0, "{}", r.render());
}

/// The weight gradient of a microbatch: the product of its rows transposed with its rows
/// (a contraction over the selection) is a partial sum.
#[test]
fn a_contraction_over_the_rows_of_one_selection_is_partial() {
    let r = check(
        "mesh dp=2\n\
         input x: f32[8, 4] dp=Shard(0)\n\
         input g: f32[8, 4] dp=Shard(0)\n\
         x0 = slice(x, 0, 2, 4)\n\
         g0 = slice(g, 0, 2, 4)\n\
         xt = t(x0)\n\
         dw = mm(xt, g0)\n\
         w = all_reduce(dw, sum, dp)\n\
         output w dp=Replicate()\n",
    );
    assert_eq!(r.verdict, Verdict::Holds, "{}", r.render());
}

/// The labels of the other microbatch: each rank subtracts rows of other samples. A real
/// bug; the rows of two selections never pair.
#[test]
fn rows_of_another_microbatch_are_never_a_pass() {
    let r = check(&accumulation(
        "2, 4",
        "g = all_reduce(s, sum, dp)\n",
        "output g dp=Replicate()\n",
    ));
    assert_ne!(r.verdict, Verdict::Holds, "{}", r.render());
}

/// The same microbatch bounds on a tensor of another local size select other rows.
#[test]
fn the_same_bounds_on_another_shard_size_are_other_rows() {
    let r = check(
        "mesh dp=2\n\
         input x: f32[8, 4] dp=Shard(0)\n\
         input t: f32[16, 4] dp=Shard(0)\n\
         x0 = slice(x, 0, 0, 2)\n\
         t0 = slice(t, 0, 0, 2)\n\
         e0 = sub(x0, t0)\n\
         s0 = aten.sum.dim_IntList(e0, [0])\n\
         g = all_reduce(s0, sum, dp)\n\
         output g dp=Replicate()\n",
    );
    assert_ne!(r.verdict, Verdict::Holds, "{}", r.render());
}

/// Replicated labels of the microbatch's size: each rank pairs its rows with the same rows of
/// the replicated tensor. A real bug (the labels are the whole batch's first rows).
#[test]
fn a_replicated_operand_along_the_rows_is_never_a_pass() {
    let r = check(
        "mesh dp=2\n\
         input x: f32[8, 4] dp=Shard(0)\n\
         input t: f32[2, 4] dp=Replicate()\n\
         x0 = slice(x, 0, 0, 2)\n\
         e0 = sub(x0, t)\n\
         s0 = aten.sum.dim_IntList(e0, [0])\n\
         g = all_reduce(s0, sum, dp)\n\
         output g dp=Replicate()\n",
    );
    assert_ne!(r.verdict, Verdict::Holds, "{}", r.render());
    // Broadcast along the other dims (a bias) is fine.
    let r = check(
        "mesh dp=2\n\
         input x: f32[8, 4] dp=Shard(0)\n\
         input b: f32[4] dp=Replicate()\n\
         x0 = slice(x, 0, 0, 2)\n\
         e0 = add(x0, b)\n\
         s0 = aten.sum.dim_IntList(e0, [0])\n\
         g = all_reduce(s0, sum, dp)\n\
         output g dp=Replicate()\n",
    );
    assert_eq!(r.verdict, Verdict::Holds, "{}", r.render());
}

/// Gathering a microbatch: rows 0-1 and 4-5 of the batch, which are not the microbatch's
/// rows of the spec in order. Never a pass.
#[test]
fn a_gathered_microbatch_is_never_a_pass() {
    let r = check(
        "mesh dp=2\n\
         input x: f32[8, 4] dp=Shard(0)\n\
         x0 = slice(x, 0, 0, 2)\n\
         y = all_gather(x0, dp)\n\
         output y dp=Replicate()\n",
    );
    assert_ne!(r.verdict, Verdict::Holds, "{}", r.render());
}

/// A microbatch declared a shard of the output: its row order is not proven.
#[test]
fn a_microbatch_declared_a_shard_is_not_proven() {
    let r = check(
        "mesh dp=2\n\
         input x: f32[8, 4] dp=Shard(0)\n\
         input w: f32[4, 4] dp=Replicate()\n\
         x0 = slice(x, 0, 0, 2)\n\
         y = mm(x0, w)\n\
         output y dp=Shard(0)\n",
    );
    assert_eq!(r.verdict, Verdict::Inconclusive, "{}", r.render());
    assert!(
        r.unknown_outputs
            .iter()
            .any(|o| o.contains("layout not proven")),
        "{}",
        r.render()
    );
}

/// All-reducing the rows themselves adds different samples: a finding.
#[test]
fn an_all_reduce_of_rows_is_a_finding() {
    let r = check(
        "mesh dp=2\n\
         input x: f32[8, 4] dp=Shard(0)\n\
         x0 = slice(x, 0, 0, 2)\n\
         y = all_reduce(x0, sum, dp)\n\
         output y dp=Replicate()\n",
    );
    assert_eq!(r.verdict, Verdict::Violated, "{}", r.render());
}

/// A view that merges the rows with the dims inside them, and splits them back, keeps the
/// selection; the labels merged alike pair with them, and the split rows with the slice.
#[test]
fn views_merge_and_split_the_rows() {
    let r = check(
        "mesh dp=2\n\
         input x: f32[8, 3, 4] dp=Shard(0)\n\
         input t: f32[8, 3, 4] dp=Shard(0)\n\
         x0 = slice(x, 0, 0, 2)\n\
         t0 = slice(t, 0, 0, 2)\n\
         xf = view(x0, [6, 4])\n\
         tf = view(t0, [6, 4])\n\
         e = sub(xf, tf)\n\
         eb = view(e, [2, 3, 4])\n\
         d = sub(eb, x0)\n\
         s = aten.sum.dim_IntList(d, [0])\n\
         g = all_reduce(s, sum, dp)\n\
         output g dp=Replicate()\n",
    );
    assert_eq!(r.verdict, Verdict::Holds, "{}", r.render());
}

/// A MoE router on a microbatch: scores of the microbatch's tokens, the top k experts of each
/// token (along the experts, a dim the selection does not cut), their gates scattered into a
/// zero gate matrix; the gates summed over the tokens (a partial sum over dp) and all-reduced.
fn router(topk_dim: i64, table: &str) -> String {
    format!(
        "mesh dp=2\n\
         input x: f32[8, 4] dp=Shard(0)\n\
         input w: f32[4, 6] dp=Replicate()\n\
         input u: f32[2, 6] dp=Replicate()\n\
         x0 = slice(x, 0, 2, 4)\n\
         s = mm(x0, w)\n\
         p = sigmoid(s)\n\
         v, i = topk(p, 2, {topk_dim})\n\
         vs = aten.sum.dim_IntList(v, [1], True)\n\
         gv = div(v, vs)\n\
         z = zeros([2, 6])\n\
         g = aten.scatter.src(z, 1, i, gv)\n\
         h = aten.scatter.value(z, 1, i, 1.0)\n\
         gh = add(g, h)\n\
         m = mul(gh, {table})\n\
         c = aten.sum.dim_IntList(m, [0])\n\
         r = all_reduce(c, sum, dp)\n\
         output r dp=Replicate()\n"
    )
}

#[test]
fn a_router_on_a_microbatch_holds() {
    let r = check(&router(1, "gh"));
    assert_eq!(r.verdict, Verdict::Holds, "{}", r.render());
    assert_eq!(r.unknown_values, 0, "{}", r.render());
}

/// The top k along the tokens: each rank picks among its own microbatch rows only. A real bug
/// (the sort rule's sharded-dim check); never a pass.
#[test]
fn a_topk_along_the_rows_is_never_a_pass() {
    let r = check(&router(0, "gh"));
    assert_ne!(r.verdict, Verdict::Holds, "{}", r.render());
}

/// Gates scattered into a replicated table that is not a zero fill: the table's rows `0..2`
/// are not the selection's rows of the spec's table. Never a pass.
#[test]
fn a_scatter_into_a_replicated_table_beside_rows_is_never_a_pass() {
    let text = router(1, "gh").replace(
        "g = aten.scatter.src(z, 1, i, gv)",
        "g = aten.scatter.src(u, 1, i, gv)",
    );
    let r = check(&text);
    assert_ne!(r.verdict, Verdict::Holds, "{}", r.render());
}

/// Routed experts on a microbatch: the rows expanded per expert (`[E, m, h]`, the rows the
/// product's row dim) times the experts' replicated weights `[E, h, f]`.
fn experts(x_shape: &str, slice_dim: i64, lhs: &str) -> String {
    format!(
        "mesh dp=2\n\
         input x: f32{x_shape} dp=Shard(0)\n\
         input w: f32[2, 4, 5] dp=Replicate()\n\
         x0 = aten.slice.Tensor(x, {slice_dim}, 2, 4)\n\
         {lhs}\
         y = bmm(e, w)\n\
         s = aten.sum.dim_IntList(y, [0, 1])\n\
         r = all_reduce(s, sum, dp)\n\
         output r dp=Replicate()\n"
    )
}

#[test]
fn experts_on_a_microbatch_hold() {
    let r = check(&experts(
        "[8, 4]",
        0,
        "u = unsqueeze(x0, 0)\ne = expand(u, [2, 2, 4])\n",
    ));
    assert_eq!(r.verdict, Verdict::Holds, "{}", r.render());
    assert_eq!(r.unknown_values, 0, "{}", r.render());
}

/// The rows in the product's batch dim beside batched replicated weights: the rank's rows
/// `0..2` of the microbatch meet the weights' batches `0..2` (the spec's would meet other
/// batches). Never a pass.
#[test]
fn a_batched_replicated_factor_along_the_rows_is_never_a_pass() {
    let r = check(&experts("[8, 2, 4]", 0, "e = clone(x0)\n"));
    assert_ne!(r.verdict, Verdict::Holds, "{}", r.render());
}
