//! A replicated operand beside a blocked shard `Shard(0, blocks=k)` (issue 44, DeepSeek `tp=2`
//! full with sequence parallelism: the router's `[4, 4]` weights expanded per token and merged
//! to `[16, 4]`, times the probabilities `Shard(0, blocks=4)`). An operand constant within
//! each of k runs pairs run b with block b on every rank, as the global program does, so the
//! pairing is no `shape-divisibility` finding; the checker keeps no record of such runs, so
//! it is open (inconclusive), never a pass. Before, it was a false finding.

use shardproof_check::{check_case, plan::parse_plan, Report, Verdict};
use std::path::Path;

fn check(table: &str) -> Report {
    let text = format!(
        "mesh tp=2\n\
         input x3: f32[4, 4, 4] tp=Shard(1)\n\
         {table}\
         x = view(x3, [8, 4])\n\
         y = mul(x, w)\n\
         output y tp=Shard(0)\n"
    );
    let case = parse_plan(Path::new("blocked_runs.plan"), &text).unwrap_or_else(|e| panic!("{e}"));
    check_case(&case).unwrap_or_else(|e| panic!("{e}"))
}

/// The router's shape: a `[4, 4]` table, one row per block, expanded over the block's rows.
#[test]
fn a_table_constant_within_each_block_is_no_finding() {
    let r = check(
        "input t: f32[4, 4] tp=Replicate()\n\
         u = unsqueeze(t, 1)\n\
         e = expand(u, [4, 2, 4])\n\
         c = clone(e)\n\
         w = view(c, [8, 4])\n",
    );
    assert_ne!(r.verdict, Verdict::Violated, "{}", r.render());
    assert_ne!(r.verdict, Verdict::Holds, "{}", r.render());
}

/// A table of the piece's size made without the rank's offset: never a pass (inconclusive
/// since the pairing above is open; before, a finding).
#[test]
fn a_table_of_the_pieces_rows_is_never_a_pass() {
    let r = check("input w: f32[8, 4] tp=Replicate()\n");
    assert_ne!(r.verdict, Verdict::Holds, "{}", r.render());
}
