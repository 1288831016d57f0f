//! DeepSeek's expert-parallel dispatcher read through a selection's frame (issue 44): the
//! smallest zoo plans where the frame meets the router's backward on the last stage.

mod common;

use common::plans::Plan;

/// `pp=2,tp=2,ep=2` with 1 and 2 microbatches: the frame makes the gate gradient a tp partial
/// beside the aux loss's gradient, the rank's 1/tp share folded into a constant on a stage
/// whose node names are shifted (`mul(sum_2, 7.8125e-5)` at the spec's `mul_68`), with the
/// microbatch average folded in too where there are 2. Read by name (or by the spec's
/// elements over the rank's), the share was no share: 6 and 7 false findings "partial +
/// replicate" and "all-reduce of a replicated tensor" on tp.
#[test]
fn deepseek_pipeline_with_expert_and_tensor_parallelism_has_no_finding() {
    for mb in [1, 2] {
        let plan = Plan {
            microbatches: mb,
            ..Plan::new("deepseek", "pp=2,tp=2,ep=2", false)
        };
        let report = plan.check();
        assert!(
            report.findings.is_empty(),
            "{}: {}",
            plan.label(),
            report.render()
        );
    }
}
