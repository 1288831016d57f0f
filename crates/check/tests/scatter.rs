//! Scatters whose index or source is sharded: each rank writes its own rows into its own
//! tensor, which is a shard of the global scatter only when self, index and source are
//! sharded alike along a dim other than the scatter's and the index covers self's rows.
//! Each wrong program below may be inconclusive, never "holds".

use shardproof_check::{check_case, plan::parse_plan, Report, Verdict};
use std::path::Path;

fn check(text: &str) -> Report {
    let case = parse_plan(Path::new("scatter.plan"), text).unwrap_or_else(|e| panic!("{e}"));
    check_case(&case).unwrap_or_else(|e| panic!("{e}"))
}

/// A replicated `self` with a row-sharded index and source: every rank writes its rows
/// into the first rows of its whole copy, so the ranks' results are neither replicas nor
/// pieces of one tensor.
#[test]
fn replicated_self_with_a_sharded_index_is_never_a_pass() {
    for out in ["Shard(0)", "Replicate()"] {
        let r = check(&format!(
            "mesh tp=2\n\
             input x: f32[4, 6] tp=Replicate()\n\
             input i: i64[4, 2] tp=Shard(0)\n\
             input s: f32[4, 2] tp=Shard(0)\n\
             y = aten.scatter.src(x, 1, i, s)\n\
             output y tp={out}\n"
        ));
        assert_ne!(r.verdict, Verdict::Holds, "{out}: {}", r.render());
    }
}

/// A row-sharded `self` with a replicated index of one row: each rank writes row 0 of its
/// piece, where the global scatter writes global row 0 only.
#[test]
fn sharded_self_with_a_short_replicated_index_is_never_a_pass() {
    let r = check(
        "mesh tp=2\n\
         input x: f32[4, 6] tp=Shard(0)\n\
         input i: i64[1, 2] tp=Replicate()\n\
         input s: f32[1, 2] tp=Replicate()\n\
         y = aten.scatter.src(x, 1, i, s)\n\
         output y tp=Shard(0)\n",
    );
    assert_ne!(r.verdict, Verdict::Holds, "{}", r.render());
}

/// An index sharded along the scatter dim: each rank writes its own positions into the
/// replicated tensor.
#[test]
fn an_index_sharded_along_the_scatter_dim_is_never_a_pass() {
    let r = check(
        "mesh tp=2\n\
         input x: f32[4, 6] tp=Replicate()\n\
         input i: i64[4, 2] tp=Shard(1)\n\
         input s: f32[4, 2] tp=Shard(1)\n\
         y = aten.scatter.src(x, 1, i, s)\n\
         output y tp=Replicate()\n",
    );
    assert_ne!(r.verdict, Verdict::Holds, "{}", r.render());
}

/// A partial source scattered into zeros at sharded indices: the ranks' partial terms land
/// at different positions, so their sum is not the scatter of the summed source.
#[test]
fn a_partial_source_at_sharded_indices_is_never_a_pass() {
    let r = check(
        "mesh tp=2\n\
         input i: i64[4, 2] tp=Shard(0)\n\
         input s: f32[2, 2] tp=Partial()\n\
         z = zeros([2, 6])\n\
         y = aten.scatter.src(z, 1, i, s)\n\
         r = all_reduce(y, sum, tp)\n\
         output r tp=Replicate()\n",
    );
    assert_ne!(r.verdict, Verdict::Holds, "{}", r.render());
}

/// The sound case: self, index and source sharded alike along the rows, the index covering
/// every row of the piece: the rows scatter independently, so the result is the same shard.
#[test]
fn rows_sharded_alike_hold() {
    let r = check(
        "mesh tp=2\n\
         input x: f32[4, 6] tp=Shard(0)\n\
         input i: i64[4, 2] tp=Shard(0)\n\
         input s: f32[4, 2] tp=Shard(0)\n\
         y = aten.scatter.src(x, 1, i, s)\n\
         output y tp=Shard(0)\n",
    );
    assert_eq!(r.verdict, Verdict::Holds, "{}", r.render());
}

/// The same with `index_put`: partial values accumulated at row-sharded indices land at
/// each rank's own positions.
#[test]
fn index_put_of_a_partial_at_sharded_indices_is_never_a_pass() {
    let r = check(
        "mesh tp=2\n\
         input i: i64[4] tp=Shard(0)\n\
         input v: f32[2, 3] tp=Partial()\n\
         z = zeros([5, 3])\n\
         y = aten.index_put.default(z, [i], v, True)\n\
         r = all_reduce(y, sum, tp)\n\
         output r tp=Replicate()\n",
    );
    assert_ne!(r.verdict, Verdict::Holds, "{}", r.render());
}

/// A zero-filled self made on each rank takes the index's shard: the router's one-hot of
/// its top-k over a token shard.
#[test]
fn zeros_scattered_at_row_sharded_indices_hold() {
    let r = check(
        "mesh tp=2\n\
         input i: i64[4, 2] tp=Shard(0)\n\
         input s: f32[4, 2] tp=Shard(0)\n\
         z = zeros([2, 6])\n\
         y = aten.scatter.src(z, 1, i, s)\n\
         output y tp=Shard(0)\n",
    );
    assert_eq!(r.verdict, Verdict::Holds, "{}", r.render());
}
