//! A gather of a microbatch's rows by an index of the same rows (a loss picking each token's
//! label column: llama3-70b-tiny's and 405b-tiny's last unknowns, the dp all-reduce of the
//! summed microbatch losses) keeps the rows; along the rows' dim, or with the index's rows
//! another selection, it is no reading.

use shardproof_check::{check_case, plan::parse_plan, Report, Verdict};
use std::path::Path;

fn check(dim: i64, label_rows: (i64, i64)) -> Report {
    let text = format!(
        "mesh dp=2\n\
         input x: f32[8, 4] dp=Shard(0)\n\
         input lab: i64[8, 1] dp=Shard(0)\n\
         xm = slice(x, 0, 0, 2)\n\
         lm = slice(lab, 0, {}, {})\n\
         g = gather(xm, {dim}, lm)\n\
         s = sum(g)\n\
         r = all_reduce(s, sum, dp)\n\
         output r dp=Replicate()\n",
        label_rows.0, label_rows.1
    );
    let case = parse_plan(Path::new("rows_gather.plan"), &text).unwrap_or_else(|e| panic!("{e}"));
    check_case(&case).unwrap()
}

#[test]
fn a_gather_along_columns_of_the_same_rows_keeps_them() {
    let r = check(1, (0, 2));
    assert_eq!(r.verdict, Verdict::Holds, "{}", r.render());
    let r = check(-1, (0, 2));
    assert_eq!(r.verdict, Verdict::Holds, "{}", r.render());
}

#[test]
fn a_gather_along_the_rows_or_of_other_rows_is_no_reading() {
    let r = check(0, (0, 2));
    assert_eq!(r.verdict, Verdict::Inconclusive, "{}", r.render());
    let r = check(1, (2, 4));
    assert_eq!(r.verdict, Verdict::Inconclusive, "{}", r.render());
}
