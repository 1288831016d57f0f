//! Views beside a `Varying` mesh dim (issue 44, llama `dp=2,cp=2,tp=2` full: the ring
//! backward's `[b*h, n, d] -> [b, h, n, d]` of the keys' and values' gradients, `Varying` on
//! cp, dp `Shard(0)` and tp `Blocked(0, 2)`): read in the frame of one cp coordinate, the plan
//! holds; every static catalog bug planted in it does not.

mod common;

use common::plans::Plan;
use shardproof_check::{Report, Verdict};
use shardproof_zoo::find_bug;

fn check(plan: &Plan) -> Report {
    plan.check()
}

fn plan_051() -> Plan {
    Plan::new("llama", "dp=2,cp=2,tp=2", false)
}

#[test]
fn llama_dp_cp_tp_full_holds() {
    let report = check(&plan_051());
    assert_eq!(report.verdict, Verdict::Holds, "{}", report.render());
    assert_eq!(report.unknown_values, 0);
}

#[test]
fn llama_dp_cp_tp_full_with_a_planted_bug_never_holds() {
    for bug in [
        "llama-oproj-missing-allreduce",
        "llama-qkv-grad-missing-allreduce",
        "tp-cp-layernorm-grad-scaled-by-tp",
        "wrong-group",
    ] {
        let plan = Plan {
            bug: Some(find_bug(bug).unwrap()),
            ..plan_051()
        };
        let report = check(&plan);
        assert_eq!(
            report.verdict,
            Verdict::Violated,
            "{bug}: {}",
            report.render()
        );
    }
}
