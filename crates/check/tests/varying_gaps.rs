//! The two ways a tensor of unknown layout (`Varying`) could end a buggy program with a pass:
//! an all-reduce (or reduce-scatter) of it, and its comparison with a declared shard. Each
//! program below is wrong; the checker may not prove it wrong, but it may never say "holds".

use shardproof_check::{check_case, plan::parse_plan, Report, Verdict};
use std::path::Path;

fn check(text: &str) -> Report {
    let case = parse_plan(Path::new("gap.plan"), text).unwrap_or_else(|e| panic!("{e}"));
    check_case(&case).unwrap_or_else(|e| panic!("{e}"))
}

/// A shard whose local size is 1 merged with a size-1 dim by a view: the local shapes leave
/// its layout open (`Shard(0)` of `[n, 4]` or `Shard(1)` of `[1, 4n]`: `Varying`).
/// All-reducing it adds the ranks' different rows: a real bug (the program returns x[0] +
/// x[1]). Before, the all-reduce made the `Varying` value replicated and the program held
/// (exit 0).
#[test]
fn all_reduce_of_a_varying_shard_is_never_a_pass() {
    let r = check(
        "mesh tp=2\n\
         input x: f32[2, 1, 4] tp=Shard(0)\n\
         v = view(x, [1, 4])\n\
         y = all_reduce(v, sum, tp)\n\
         output y tp=Replicate()\n",
    );
    assert_ne!(r.verdict, Verdict::Holds, "{}", r.render());
    assert_eq!(r.verdict, Verdict::Inconclusive, "{}", r.render());
    assert!(
        r.unknown
            .iter()
            .any(|u| u.reason.contains("reduces a tensor of unknown layout")),
        "{}",
        r.render()
    );
}

/// The same with a reduce-scatter (a sum of different slices, then scattered). The flattened
/// size-1 shard has one reading (`Shard(0)` of `[4n]`), so this is a finding now.
#[test]
fn reduce_scatter_of_a_varying_shard_is_never_a_pass() {
    let r = check(
        "mesh tp=2\n\
         input x: f32[2, 4] tp=Shard(0)\n\
         v = view(x, [4])\n\
         y = reduce_scatter(v, sum, tp)\n\
         output y tp=Shard(0)\n",
    );
    assert_eq!(r.verdict, Verdict::Violated, "{}", r.render());
}

/// A column shard of local size 1 flattened: each rank holds every other element of the
/// flattened tensor (`Shard(0, blocks=4)`), not its contiguous half. Declaring `Shard(0)`
/// is wrong; the local shapes alone leave the layout open (`Varying`), which the
/// postcondition used to accept ("layout not checked", exit 0).
#[test]
fn a_varying_output_where_a_shard_is_declared_is_never_a_pass() {
    let r = check(
        "mesh tp=2\n\
         input x: f32[4, 2] tp=Shard(1)\n\
         v = view(x, [4])\n\
         output v tp=Shard(0)\n",
    );
    assert_eq!(r.verdict, Verdict::Inconclusive, "{}", r.render());
    assert_eq!(r.outputs_layout_unchecked, 2, "{}", r.render());
    assert!(
        r.unknown_outputs
            .iter()
            .any(|o| o.contains("layout not proven")),
        "{}",
        r.render()
    );
}

/// The correct all-reduce of a partial sum, and the gather of a shard, still hold.
#[test]
fn the_correct_programs_still_hold() {
    let r = check(
        "mesh tp=2\n\
         input x: f32[8, 16] tp=Shard(1)\n\
         input w: f32[16, 32] tp=Shard(0)\n\
         p = mm(x, w)\n\
         y = all_reduce(p, sum, tp)\n\
         output y tp=Replicate()\n",
    );
    assert_eq!(r.verdict, Verdict::Holds, "{}", r.render());
}

/// A pending sum sent to another coordinate: the receiver holds a piece of some partial sum,
/// in no recorded arrangement; all-gathering or all-reducing it proves nothing.
#[test]
fn a_partial_moved_along_its_mesh_dim_is_unknown() {
    let r = check(
        "mesh tp=2\n\
         input x: f32[4, 8] tp=Shard(1)\n\
         input w: f32[8, 4] tp=Shard(0)\n\
         p = mm(x, w)\n\
         send(p, tp=+1, tag=0)\n\
         q = recv(f32[4, 4], tp=-1, tag=0)\n\
         y = all_reduce(q, sum, tp)\n\
         output y tp=Replicate()\n",
    );
    assert_eq!(r.verdict, Verdict::Inconclusive, "{}", r.render());
    assert!(
        r.unknown.iter().any(|u| u.reason.contains("partial sum")),
        "{}",
        r.render()
    );
}

/// A norm over a tensor of unknown layout: its normalized dim may be the sharded one. Here the
/// rank flattens its row of a row-sharded `[2, 8]` and normalizes it, where the program's
/// tensor is the flattened `[16]`: each rank's statistics are those of its half. Before, the
/// norm passed `Varying` on and the all-gather made it replicated (exit 0).
#[test]
fn a_norm_over_a_varying_tensor_is_never_a_pass() {
    let r = check(
        "mesh tp=2\n\
         input x: f32[2, 1, 8] tp=Shard(0)\n\
         v = view(x, [1, 8])\n\
         n = layer_norm(v, [1, 8])\n\
         y = all_gather(n, tp)\n\
         output y tp=Replicate()\n",
    );
    assert_eq!(r.verdict, Verdict::Inconclusive, "{}", r.render());
    assert!(
        r.unknown.iter().any(|u| u.reason.contains("normalizes")),
        "{}",
        r.render()
    );
}

/// The same program with a softmax in place of the norm.
#[test]
fn a_softmax_over_a_varying_tensor_is_never_a_pass() {
    let r = check(
        "mesh tp=2\n\
         input x: f32[2, 1, 8] tp=Shard(0)\n\
         v = view(x, [1, 8])\n\
         n = softmax(v, 1)\n\
         y = all_gather(n, tp)\n\
         output y tp=Replicate()\n",
    );
    assert_eq!(r.verdict, Verdict::Inconclusive, "{}", r.render());
}

/// A column shard of local size 1 flattened (`Varying`: the local shapes leave its layout
/// open) and all-gathered: every rank holds its column, then the other's, where the program's
/// tensor is the flattened rows (`x[0,0], x[0,1], ...`). The gathered data is the same on
/// every rank, in the wrong order: a real bug. Before, the all-gather made the `Varying`
/// value replicated and the program held (exit 0).
#[test]
fn all_gather_of_a_varying_shard_is_never_a_pass() {
    let r = check(
        "mesh tp=2\n\
         input x: f32[4, 2] tp=Shard(1)\n\
         v = view(x, [4])\n\
         y = all_gather(v, tp)\n\
         output y tp=Replicate()\n",
    );
    assert_ne!(r.verdict, Verdict::Holds, "{}", r.render());
    assert_eq!(r.verdict, Verdict::Inconclusive, "{}", r.render());
    assert!(
        r.unknown
            .iter()
            .any(|u| u.reason.contains("gathers a tensor of unknown layout")),
        "{}",
        r.render()
    );
}

/// The gather of a proven shard still holds.
#[test]
fn all_gather_of_a_proven_shard_holds() {
    let r = check(
        "mesh tp=2\n\
         input x: f32[4, 2] tp=Shard(0)\n\
         y = all_gather(x, tp)\n\
         output y tp=Replicate()\n",
    );
    assert_eq!(r.verdict, Verdict::Holds, "{}", r.render());
}

/// Megatron's sequence-parallel reduce-scatter: the row-parallel product's partial sum, its
/// token dim split back into `[s, b, h]` by a view, scattered over tp alone. No other mesh dim
/// shards it, so the chunks of dim 0 are `Shard(0)` of the tensor itself (was `Varying`, and
/// the layer norm after it inconclusive on the Entangle sample).
#[test]
fn a_reduce_scatter_of_a_regrouped_dim_on_one_mesh_dim_is_a_shard() {
    let r = check(
        "mesh tp=2\n\
         input x: f32[8, 16] tp=Shard(1)\n\
         input w: f32[16, 4] tp=Shard(0)\n\
         p = mm(x, w)\n\
         v = view(p, [4, 2, 4])\n\
         y = reduce_scatter(v, sum, tp)\n\
         n = layer_norm(y, [4])\n\
         output n tp=Shard(0)\n",
    );
    assert_eq!(r.verdict, Verdict::Holds, "{}", r.render());
}

/// The same with a dp mesh dim sharding the batch: the regrouped dim 0 is a flattening the
/// other mesh dim cuts too, so its chunks claim no shard and the declared `Shard(0)` is not
/// proven.
#[test]
fn a_reduce_scatter_of_a_regrouped_dim_another_mesh_dim_shards_is_not_a_shard() {
    let r = check(
        "mesh dp=2 tp=2\n\
         input x: f32[8, 16] dp=Shard(0) tp=Shard(1)\n\
         input w: f32[16, 4] dp=Replicate() tp=Shard(0)\n\
         p = mm(x, w)\n\
         v = view(p, [2, 2, 4])\n\
         y = reduce_scatter(v, sum, tp)\n\
         output y dp=Shard(0) tp=Shard(0)\n",
    );
    assert_ne!(r.verdict, Verdict::Holds, "{}", r.render());
}

/// A shard of local size 1 flattened with the dims inside it (`[1, 4] -> [4]`) has one
/// reading, `Shard(0)` of the flattened `[4n]`: all-reducing it is a finding now (it adds the
/// ranks' different rows), and a norm over it one too (each rank normalizes its half).
#[test]
fn a_flattened_size_one_shard_is_a_shard() {
    let r = check(
        "mesh tp=2\n\
         input x: f32[2, 4] tp=Shard(0)\n\
         v = view(x, [4])\n\
         y = all_reduce(v, sum, tp)\n\
         output y tp=Replicate()\n",
    );
    assert_eq!(r.verdict, Verdict::Violated, "{}", r.render());
    assert!(
        r.findings.iter().any(|f| f.check.name() == "comm-legality"),
        "{}",
        r.render()
    );
    let r = check(
        "mesh tp=2\n\
         input x: f32[2, 8] tp=Shard(0)\n\
         v = view(x, [8])\n\
         n = layer_norm(v, [8])\n\
         y = all_gather(n, tp)\n\
         output y tp=Replicate()\n",
    );
    assert_eq!(r.verdict, Verdict::Violated, "{}", r.render());
    assert!(
        r.findings
            .iter()
            .any(|f| f.check.name() == "placement-consistency"),
        "{}",
        r.render()
    );
    // The flattened shard gathered back: the tensor's elements in order.
    let r = check(
        "mesh tp=2\n\
         input x: f32[2, 4] tp=Shard(0)\n\
         v = view(x, [4])\n\
         y = all_gather(v, tp)\n\
         output y tp=Replicate()\n",
    );
    assert_eq!(r.verdict, Verdict::Holds, "{}", r.render());
}

/// ZeRO's gather of a column chunk: every rank holds the pieces of dim 1 stacked along dim 0
/// (`Stacked(1)`); split off and permuted outside dim 1, then merged, it is the tensor. The
/// program that views the stacked pieces straight to the tensor's shape scrambles its columns:
/// before, the gather was taken as replicated and it held (exit 0).
#[test]
fn a_gathered_column_shard_is_the_tensor_only_once_rearranged() {
    let wrong = check(
        "mesh dp=2\n\
         input w: f32[4, 8] dp=Shard(1)\n\
         g = all_gather(w, dp)\n\
         v = view(g, [4, 8])\n\
         output v dp=Replicate()\n",
    );
    assert_ne!(wrong.verdict, Verdict::Holds, "{}", wrong.render());
    let right = check(
        "mesh dp=2\n\
         input w: f32[4, 8] dp=Shard(1)\n\
         g = all_gather(w, dp)\n\
         s = view(g, [2, 4, 4])\n\
         p = permute(s, [1, 0, 2])\n\
         c = clone(p)\n\
         v = view(c, [4, 8])\n\
         output v dp=Replicate()\n",
    );
    assert_eq!(right.verdict, Verdict::Holds, "{}", right.render());
    // Permuted the wrong way round: the coordinate inside the piece's dim.
    let inside = check(
        "mesh dp=2\n\
         input w: f32[4, 8] dp=Shard(1)\n\
         g = all_gather(w, dp)\n\
         s = view(g, [2, 4, 4])\n\
         p = permute(s, [1, 2, 0])\n\
         c = clone(p)\n\
         v = view(c, [4, 8])\n\
         output v dp=Replicate()\n",
    );
    assert_ne!(inside.verdict, Verdict::Holds, "{}", inside.render());
    // A blocked shard gathered: no arrangement is followed, never a pass.
    let blocked = check(
        "mesh tp=2\n\
         input x: f32[4, 2] tp=Shard(1)\n\
         v = view(x, [4])\n\
         y = all_gather(v, tp)\n\
         output y tp=Replicate()\n",
    );
    assert_ne!(blocked.verdict, Verdict::Holds, "{}", blocked.render());
}
