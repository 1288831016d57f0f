//! An `expand` that broadcasts the sharded dim from a local size of 1 repeats the rank's piece:
//! the result is no shard of any global tensor (the global dim has one row per rank, which
//! no expand can broadcast). Before, the shard was moved along and a declared `Shard(0)` held.

use shardproof_check::{check_case, plan::parse_plan, Report, Verdict};
use std::path::Path;

fn check(input: &str, size: &str) -> Report {
    let text = format!(
        "mesh tp=2\n\
         input x: f32[{input}] tp=Shard(0)\n\
         y = expand(x, [{size}])\n\
         output y tp=Shard(0)\n"
    );
    let case = parse_plan(Path::new("expand_shard.plan"), &text).unwrap_or_else(|e| panic!("{e}"));
    check_case(&case).unwrap()
}

#[test]
fn broadcasting_the_sharded_dim_is_no_shard() {
    let r = check("2, 8", "4, 8");
    assert_ne!(r.verdict, Verdict::Holds, "{}", r.render());
}

#[test]
fn broadcasting_another_dim_keeps_the_shard() {
    let r = check("4, 1", "2, 8");
    assert_eq!(r.verdict, Verdict::Holds, "{}", r.render());
}
