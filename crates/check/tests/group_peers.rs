//! Group-relative point-to-point peers (issues 44 and 45): the zoo writes a send's and recv's
//! peer as an index into the rank's `pp` or `cp` group, so data-parallel replicas share one
//! graph text. The checker reads the global peer either way: the same plan with its peers
//! rewritten to global ranks gets the same report, correct or with a planted pipeline bug.

mod common;

use common::plans::Plan;
use shardproof_case::Case;
use shardproof_check::{check_case, Verdict};
use shardproof_ir::{Arg, NodeKind};
use shardproof_ops::{p2p_node_call, program_members, P2pEnd};
use shardproof_zoo::find_bug;
use std::sync::Arc;

/// `plan` loaded as the zoo writes it (group-relative peers), and with every peer rewritten to
/// its global rank and the group dropped (what a torch capture records). Returns the number
/// of calls rewritten too.
fn both_forms(plan: &Plan) -> (Case, Case, usize) {
    let dir = tempfile::tempdir().unwrap();
    let file = plan
        .emit(dir.path())
        .unwrap_or_else(|e| panic!("{}: {e}", plan.label()));
    let grouped = shardproof_case::load_case(&file).unwrap();
    let mut global = shardproof_case::load_case(&file).unwrap();
    let mut rewritten = 0;
    let program = grouped.program.clone();
    for (r, g) in global.program.ranks.iter_mut().enumerate() {
        let members = program_members(&program, r);
        let mut graph = (**g).clone();
        for node in &mut graph.nodes {
            let NodeKind::Call { op, args, kwargs } = &mut node.kind else {
                continue;
            };
            let Some(call) = p2p_node_call(op, args, kwargs, &members) else {
                continue;
            };
            let call = call.unwrap_or_else(|e| panic!("{}: {e}", plan.label()));
            let at = if call.end == P2pEnd::Send { 1 } else { 2 };
            assert!(args.len() > at + 2, "the zoo names the group: {args:?}");
            args.truncate(at);
            args.extend([Arg::Int(call.peer as i64), Arg::Int(call.tag)]);
            kwargs.retain(|(k, _)| !matches!(k.as_str(), "dst" | "src" | "tag" | "group"));
            rewritten += 1;
        }
        *g = Arc::new(graph);
    }
    (grouped, global, rewritten)
}

/// The report of both forms of `plan`: equal, and returned.
fn same_report(plan: &Plan) -> shardproof_check::Report {
    let (grouped, global, rewritten) = both_forms(plan);
    assert!(rewritten > 0, "{}", plan.label());
    // The group form shares graphs between replicas; the global form does not.
    let distinct = |c: &Case| {
        let mut texts: Vec<String> = c
            .program
            .ranks
            .iter()
            .map(|g| format!("{:?}", g.nodes))
            .collect();
        texts.sort();
        texts.dedup();
        texts.len()
    };
    assert!(
        distinct(&grouped) < distinct(&global),
        "{}: {} vs {} distinct graphs",
        plan.label(),
        distinct(&grouped),
        distinct(&global)
    );
    let a = check_case(&grouped).unwrap_or_else(|e| panic!("{}: {e}", plan.label()));
    let b = check_case(&global).unwrap_or_else(|e| panic!("{}: {e}", plan.label()));
    assert_eq!(a.render(), b.render(), "{}", plan.label());
    a
}

#[test]
fn pipelined_plans_check_alike_with_group_and_global_peers() {
    let plan = Plan {
        microbatches: 2,
        ..Plan::new("mlp", "dp=2,pp=2", false)
    };
    assert_eq!(same_report(&plan).verdict, Verdict::Holds);
    // A planted schedule bug is found in either form.
    let bug = Plan {
        bug: Some(find_bug("pp-mismatched-send-recv").unwrap()),
        ..plan.clone()
    };
    assert_eq!(same_report(&bug).verdict, Verdict::Violated);
    let bug = Plan {
        bug: Some(find_bug("pp-grad-sync-before-last-microbatch").unwrap()),
        ..plan
    };
    assert_ne!(same_report(&bug).verdict, Verdict::Holds);
}

#[test]
fn context_parallel_rings_check_alike_with_group_and_global_peers() {
    let plan = Plan::new("llama", "dp=2,cp=2", true);
    same_report(&plan);
}
