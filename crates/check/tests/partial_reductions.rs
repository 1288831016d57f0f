//! An output declared `Partial(avg)` and held as `Partial(sum)` (or the reverse) is another
//! tensor: pieces that sum to it average to 1/n of it. Before, any two linear reductions
//! passed the postcondition (a false holds). A product with a tensor the checker does not
//! know to be scaled may make up for the factor n between the two (scalings by a number are
//! followed: tests/avg_scaling.rs), so the mismatch is inconclusive, never a pass; a max
//! against a sum is a finding.

use shardproof_check::{check_case, plan::parse_plan, Report, Verdict};
use std::path::Path;

/// Each rank reduces its rows of `x` (sharded over dp=2) with `op`; `y` declared `declared`.
fn check(op: &str, declared: &str) -> Report {
    let text = format!(
        "mesh dp=2\n\
         input x: f32[4, 8] dp=Shard(0)\n\
         y = {op}(x)\n\
         output y dp=Partial({declared})\n"
    );
    let case = parse_plan(Path::new("partial.plan"), &text).unwrap_or_else(|e| panic!("{e}"));
    check_case(&case).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn a_sum_declared_as_an_average_is_not_a_pass() {
    let r = check("sum", "avg");
    assert_eq!(r.verdict, Verdict::Inconclusive, "{}", r.render());
    assert!(
        r.render().contains("differ by the mesh size"),
        "{}",
        r.render()
    );
}

#[test]
fn an_average_declared_as_a_sum_is_not_a_pass() {
    let r = check("mean", "sum");
    assert_eq!(r.verdict, Verdict::Inconclusive, "{}", r.render());
}

#[test]
fn a_maximum_declared_as_a_sum_is_a_finding() {
    let r = check("amax", "sum");
    assert_eq!(r.verdict, Verdict::Violated, "{}", r.render());
    assert!(r.render().contains("another reduction"), "{}", r.render());
}

#[test]
fn the_declared_reduction_holds() {
    assert_eq!(check("sum", "sum").verdict, Verdict::Holds);
    assert_eq!(check("mean", "avg").verdict, Verdict::Holds);
}
