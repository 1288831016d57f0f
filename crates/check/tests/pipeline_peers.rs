//! A pipeline dim's coordinates run other stages' programs: a node of the same name on
//! another stage is another tensor. Before, the slice rule read the other stage's node of
//! the same name as this tensor's peer (a slice at "the stage's block" claimed `Shard(d)` on
//! `pp`: llama3-70b-tiny's rope halves), and a value the stages computed differently from a
//! replicated input stayed `Replicate()` on `pp`; both plans below held (exit 0).

use shardproof_check::{check_case, plan::parse_plan, Report, Verdict};
use std::path::Path;

fn check(text: &str) -> Report {
    let case = parse_plan(Path::new("pipeline_peers.plan"), text).unwrap_or_else(|e| panic!("{e}"));
    check_case(&case).unwrap()
}

#[test]
fn slices_of_different_stage_tensors_are_no_shard_on_the_pipeline_dim() {
    // Stage 0 takes the left half of its own `x`, stage 1 the right half of another tensor
    // also named `x`: not the pieces of one tensor.
    let r = check(
        "mesh pp=2\n\
         on pp=0 {\n\
           input a: f32[4, 8]\n\
           x = relu(a)\n\
           h = slice(x, 1, 0, 4)\n\
         }\n\
         on pp=1 {\n\
           input b: f32[4, 8]\n\
           x = neg(b)\n\
           h = slice(x, 1, 4, 8)\n\
         }\n\
         output h pp=Shard(1)\n",
    );
    assert_eq!(r.verdict, Verdict::Inconclusive, "{}", r.render());
    assert!(r.findings.is_empty(), "{}", r.render());
}

fn stages(second: &str) -> String {
    format!(
        "mesh pp=2\n\
         input w: f32[4, 8]\n\
         on pp=0 {{\n\
           x = relu(w)\n\
         }}\n\
         on pp=1 {{\n\
           x = {second}(w)\n\
         }}\n\
         output x pp=Replicate()\n"
    )
}

#[test]
fn a_value_the_stages_compute_differently_is_not_replicated_on_the_pipeline_dim() {
    let r = check(&stages("neg"));
    assert_eq!(r.verdict, Verdict::Violated, "{}", r.render());
    assert!(
        r.findings.iter().any(|f| f.check.name() == "postcondition"),
        "{}",
        r.render()
    );
}

#[test]
fn the_same_computation_on_every_stage_is_replicated() {
    let r = check(&stages("relu"));
    assert_eq!(r.verdict, Verdict::Holds, "{}", r.render());
}

#[test]
fn a_sum_over_the_stages_of_their_own_values_is_not_taken_as_proven() {
    // Each stage's own term summed over `pp` (a tied weight's gradient shares): the result
    // is the same on every stage, but whether each term is its stage's share of one sum is
    // not proven; a replicated value summed over the stages is counted twice.
    let own = "mesh pp=2\n\
               on pp=0 {\n\
                 input a: f32[4, 8]\n\
                 g = relu(a)\n\
               }\n\
               on pp=1 {\n\
                 input b: f32[4, 8]\n\
                 g = neg(b)\n\
               }\n\
               s = all_reduce(g, sum, pp)\n\
               output s pp=Replicate()\n";
    let r = check(own);
    assert_eq!(r.verdict, Verdict::Inconclusive, "{}", r.render());
    let twice = "mesh pp=2\n\
                 input w: f32[4, 8]\n\
                 g = relu(w)\n\
                 s = all_reduce(g, sum, pp)\n\
                 output s pp=Replicate()\n";
    let r = check(twice);
    assert_eq!(r.verdict, Verdict::Violated, "{}", r.render());
}
