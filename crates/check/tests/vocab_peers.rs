//! A vocabulary-range proof is a claim about every coordinate along a mesh dim: each peer
//! must build the one-hot over its own coordinate's range. On a `stage=2, tp=2` mesh whose
//! ranks take the tp coordinate's range `[8t, 8t + 8)`, the rank at stage 1 and tp 1 has
//! the range of stage coordinate 1 too; checking that rank alone claimed `Shard(1)` on
//! `stage` for its one-hot, whose peer at stage 0 holds the same columns (a false
//! `placement-consistency` finding on a correct program; llama3-70b-tiny's `sub_88` on `pp`
//! before the fix).

use shardproof_check::{check_case, plan::parse_plan, Verdict};
use std::path::Path;

fn plan(lo: &str, hi: &str, declared: &str) -> String {
    format!(
        "mesh stage=2 tp=2\n\
         input ids: i64[6] tp=Replicate()\n\
         below = lt(ids, {lo})\n\
         above = ge(ids, {hi})\n\
         mask = bitwise_or(below, above)\n\
         local = sub(ids, {lo})\n\
         idx = masked_fill(local, mask, 0)\n\
         x = unsqueeze(idx, 1)\n\
         ar = arange(8)\n\
         hot = eq(x, ar)\n\
         m = unsqueeze(mask, 1)\n\
         keep = bitwise_not(m)\n\
         y = bitwise_and(hot, keep)\n\
         output y {declared}\n"
    )
}

fn check(text: &str) -> shardproof_check::Report {
    let case = parse_plan(Path::new("vocab_peers.plan"), text).unwrap_or_else(|e| panic!("{e}"));
    check_case(&case).unwrap()
}

#[test]
fn a_range_that_is_one_coordinates_block_proves_no_shard_on_that_mesh_dim() {
    // Each tp rank its own range: the columns are `Shard(1)` on tp, the same on both stages.
    let r = check(&plan("tp[0, 8]", "tp[8, 16]", "tp=Shard(1)"));
    assert_eq!(r.verdict, Verdict::Holds, "{}", r.render());
    assert!(r.findings.is_empty(), "{}", r.render());
}

#[test]
fn a_range_of_the_stage_coordinate_still_proves_a_shard_on_the_stage() {
    // The range follows the stage coordinate: every stage peer holds its own block.
    let r = check(&plan("stage[0, 8]", "stage[8, 16]", "stage=Shard(1)"));
    assert_eq!(r.verdict, Verdict::Holds, "{}", r.render());
    // Declared replicated on the stage, it is not.
    let r = check(&plan("stage[0, 8]", "stage[8, 16]", "stage=Replicate()"));
    assert_eq!(r.verdict, Verdict::Violated, "{}", r.render());
}
