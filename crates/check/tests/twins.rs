//! Ranks whose graphs are equal share one propagation only where the run read nothing that
//! differs between them (`Twins` in the crate root): a rank's coordinate read by a proof makes
//! its equal-graph peers propagate on their own. Two tensor-parallel ranks that both build the
//! one-hot of ids over the range `[0, 8)` run equal graphs; the range is rank 0's own and not
//! rank 1's, so taking rank 1's placements from rank 0's run would prove the concatenation of
//! the two (equal) one-hots to be the one-hot over 16 classes: a false pass.

use shardproof_check::{check_case, plan::parse_plan, propagate, Verdict};
use std::path::Path;

fn plan(lo: &str, hi: &str) -> String {
    format!(
        "mesh tp=2\n\
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
         output y tp=Shard(1)\n"
    )
}

#[test]
fn equal_graphs_whose_proof_reads_the_coordinate_are_not_twins() {
    let load =
        |text: &str| parse_plan(Path::new("twins.plan"), text).unwrap_or_else(|e| panic!("{e}"));
    // Rank-dependent literals: each rank its own range, the one-hot's columns `Shard(1)`.
    let r = check_case(&load(&plan("tp[0, 8]", "tp[8, 16]"))).unwrap();
    assert_eq!(r.verdict, Verdict::Holds, "{}", r.render());
    // The same range on both ranks (equal graphs): rank 1's columns are not its own.
    let case = load(&plan("0", "8"));
    let r = check_case(&case).unwrap();
    assert_ne!(r.verdict, Verdict::Holds, "{}", r.render());
    assert_eq!(propagate(&case).unwrap().twin_ranks, 0);
}
