//! Ranks whose graphs are equal (or equal up to their point-to-point peers) share one
//! propagation only where the run read nothing that differs between them (`Twins` in the
//! crate root): a coordinate read by a proof of the rank's own range, a recv whose sender
//! holds something else. Each test compares every rank's placements, findings, unknowns and
//! the report with the runs of every rank on its own (`twins_exact`).

mod common;

use common::plans::Plan;
use shardproof_case::{Case, Layout, Placement, Reduce};
use shardproof_check::{check_case, plan::parse_plan, propagate, twins_off, Verdict};
use std::path::Path;

/// Propagates `case` with and without twins: every rank gets the same placements, findings
/// and unknowns, and the report is the same. Returns the twin ranks.
fn twins_exact(case: &Case, label: &str) -> usize {
    let shared = propagate(case).unwrap();
    twins_off(true);
    let own = propagate(case).unwrap();
    let own_report = check_case(case).unwrap().render();
    twins_off(false);
    assert_eq!(own.twin_ranks, 0);
    for (a, b) in shared.ranks.iter().zip(&own.ranks) {
        assert_eq!(a.places, b.places, "{label}");
        assert_eq!(a.findings.len(), b.findings.len(), "{label}");
        assert_eq!(a.unknown_values, b.unknown_values, "{label}");
        assert_eq!(a.unknown_sources, b.unknown_sources, "{label}");
    }
    assert_eq!(check_case(case).unwrap().render(), own_report, "{label}");
    shared.twin_ranks
}

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
fn equal_graphs_whose_proof_reads_the_coordinate_get_their_own_result() {
    let load =
        |text: &str| parse_plan(Path::new("twins.plan"), text).unwrap_or_else(|e| panic!("{e}"));
    // Rank-dependent literals: each rank its own range, the one-hot's columns `Shard(1)`.
    let case = load(&plan("tp[0, 8]", "tp[8, 16]"));
    let r = check_case(&case).unwrap();
    assert_eq!(r.verdict, Verdict::Holds, "{}", r.render());
    twins_exact(&case, "own ranges");
    // The same range on both ranks (equal graphs): rank 1's columns are not its own. The
    // one-hot proof is a claim about both coordinates at once (each rank's graph at its own
    // coordinate, `peers_prove`), the same on either rank, so rank 1 may take rank 0's run
    // (stop 63; before, the proof's read of the coordinate kept them apart): it gets what its
    // own run gives, and the program does not hold.
    let case = load(&plan("0", "8"));
    let r = check_case(&case).unwrap();
    assert_ne!(r.verdict, Verdict::Holds, "{}", r.render());
    assert_eq!(twins_exact(&case, "one range"), 1);
}

/// Receiving ranks share a propagation only where every recv reads the same (issue 44,
/// step 3 of the class design). On `pp=2, tp=2, dp=2`, the second stage's ranks only receive
/// the first stage's `y` and declare it replicated over tp. The first stage's graphs are
/// equal up to their sends' peers except at `pp=0, tp=1, dp=1`, which scales by 3 where
/// its tp peer scales by 2: `y` is `Replicate()` over tp on the dp=0 ranks and `Varying` on
/// the dp=1 ranks. Rank 5 (`pp=1, tp=0, dp=1`) has rank 4's key (graphs equal up to peers,
/// its own peers' classes along every mesh dim, no coordinate read): only what its sender
/// holds differs. Taking its placements from rank 4's run passes its tp postcondition (a
/// false pass: checked by making the sender comparison always agree).
#[test]
fn receivers_whose_senders_hold_different_placements_are_not_twins() {
    let stage0 = |at: &str, factor: &str| {
        format!(
            "on pp=0 {at} {{\n\
             input x: f32[4, 8]\n\
             y = mul(x, {factor})\n\
             send(y, pp=1, tag=0)\n\
             }}\n"
        )
    };
    let text = format!(
        "mesh pp=2 tp=2 dp=2\n{}{}{}on pp=1 {{\n\
         z = recv(f32[4, 8], pp=0, tag=0)\n\
         output z tp=Replicate()\n\
         }}\n",
        stage0("tp=0", "2.0"),
        stage0("tp=1 dp=0", "2.0"),
        stage0("tp=1 dp=1", "3.0")
    );
    let case = parse_plan(Path::new("recv.plan"), &text).unwrap_or_else(|e| panic!("{e}"));
    let r = check_case(&case).unwrap();
    assert_eq!(r.verdict, Verdict::Violated, "{}", r.render());
    assert!(
        r.findings
            .iter()
            .any(|f| f.ranks.contains(&5) && f.message.contains("over mesh dim `tp`")),
        "{}",
        r.render()
    );
    twins_exact(&case, "recv");
}

/// Data-parallel replicas of a pipeline stage run graphs equal up to their sends' and recvs'
/// peers: the receiving ranks take a replica's placements (before, only ranks that receive
/// nothing could, and only from equal graphs).
#[test]
fn pipeline_replicas_that_receive_alike_are_twins() {
    let text = "mesh pp=2 dp=2\n\
                on pp=0 {\n\
                input x: f32[4, 8] dp=Shard(0)\n\
                input w: f32[8, 8]\n\
                h = mm(x, w)\n\
                send(h, pp=1, tag=0)\n\
                }\n\
                on pp=1 {\n\
                input v: f32[8, 8]\n\
                a = recv(f32[2, 8], pp=0, tag=0)\n\
                y = mm(a, v)\n\
                output y dp=Shard(0)\n\
                }\n";
    let case = parse_plan(Path::new("replicas.plan"), text).unwrap_or_else(|e| panic!("{e}"));
    let r = check_case(&case).unwrap();
    assert_eq!(r.verdict, Verdict::Holds, "{}", r.render());
    // Rank 1 (stage 0, dp 1) and rank 3 (stage 1, dp 1, a receiver) are twins.
    assert_eq!(twins_exact(&case, "replicas"), 2);
}

/// The zoo's pipelined plan (`dp=2,pp=2,tp=2`, two microbatches, forward and full): the dp
/// replicas of each stage run graphs equal up to peers and receive from the other stage (a
/// later rank's sends read `Unknown` in the first pass, then propagated again): at least
/// the replicas are twins (none before), each getting what its own run gives.
#[test]
fn pipeline_replicas_get_what_their_own_runs_give() {
    for forward_only in [true, false] {
        let plan = Plan {
            microbatches: 2,
            ..Plan::new("llama", "dp=2,pp=2,tp=2", forward_only)
        };
        let dir = tempfile::tempdir().unwrap();
        let case = shardproof_case::load_case(&plan.emit(dir.path()).unwrap()).unwrap();
        // Measured: 6 of 8 (the dp replica of every rank, and tp peers where their graphs
        // are equal).
        let twins = twins_exact(&case, &plan.label());
        assert!(twins >= 4, "{}: {twins} twins", plan.label());
    }
}

/// The vocabulary-parallel embedding and LM head (llama, `dp=2,tp=2`, forward and full):
/// their one-hot, embedding-gradient and update proofs are claims about the whole tp group;
/// the dp replicas share runs and each rank gets what its own run gives.
#[test]
fn vocabulary_parallel_replicas_get_what_their_own_runs_give() {
    for forward_only in [true, false] {
        let plan = Plan {
            vocab_parallel: true,
            ..Plan::new("llama", "dp=2,tp=2", forward_only)
        };
        let dir = tempfile::tempdir().unwrap();
        let case = shardproof_case::load_case(&plan.emit(dir.path()).unwrap()).unwrap();
        let twins = twins_exact(&case, &plan.label());
        assert!(twins >= 2, "{}: {twins} twins", plan.label());
    }
}

/// Propagates `case` with and without twins (as [`twins_exact`]) and returns the runs again
/// taken from a twin (`Again` in the crate root: a rank propagated again whose recvs read
/// what an earlier rank's latest run read).
fn again_exact(case: &Case, label: &str) -> usize {
    twins_exact(case, label);
    twins_off(true);
    let own = propagate(case).unwrap();
    twins_off(false);
    assert_eq!(own.again_twin_runs, 0, "{label}");
    propagate(case).unwrap().again_twin_runs
}

/// Zoo plans with a pipeline (dp, cp, ep beside it, forward and full): the first stages'
/// ranks are propagated again once the later stages' gradients are known (issue 44: on
/// llama3-70b, 384 of 512 ranks, every dp replica alike); a replica whose recvs read what
/// another's latest run read takes its placements, and gets what its own run gives. On the
/// plans without a pipeline nothing runs again, and the reports agree all the same.
#[test]
fn ranks_run_again_share_only_what_their_own_runs_give() {
    let plans = [
        ("llama", "pp=2,dp=2", false, 1),
        ("llama", "pp=2,dp=2,tp=2", false, 1),
        // Forward only: no stage receives from a later one.
        ("llama", "pp=2,dp=2", true, 0),
        // The zoo combines no cp with pp.
        ("llama", "cp=2,tp=2", false, 0),
        ("deepseek", "pp=2,dp=2,ep=2", false, 1),
        ("gpt2", "dp=2,cp=2", false, 0),
    ];
    for (model, mesh, forward_only, least) in plans {
        let plan = Plan {
            microbatches: if mesh.contains("pp") { 2 } else { 1 },
            ..Plan::new(model, mesh, forward_only)
        };
        let dir = tempfile::tempdir().unwrap();
        let case = shardproof_case::load_case(&plan.emit(dir.path()).unwrap()).unwrap();
        let shared = again_exact(&case, &plan.label());
        assert!(
            shared >= least,
            "{}: {shared} runs again shared",
            plan.label()
        );
    }
}

/// Two stage-0 replicas (dp 0 and 1) run one graph and receive alike, but hold `b` (read
/// after the recv) in different placements over dp (the case edited: a plan states one
/// layout per input): the replica whose `b` is a partial sum must not take the other's run
/// again (its `y` is a partial sum there: checked by leaving the input comparison out, when
/// it takes rank 0's run and the placements differ), in either pass.
#[test]
fn replicas_run_again_with_other_input_placements_are_not_twins() {
    let text = "mesh pp=2 dp=2\n\
                on pp=0 {\n\
                input x: f32[4, 8]\n\
                input b: f32[4, 8]\n\
                send(x, pp=1, tag=0)\n\
                g = recv(f32[4, 8], pp=1, tag=0)\n\
                y = add(g, b)\n\
                output y dp=Replicate()\n\
                }\n\
                on pp=1 {\n\
                a = recv(f32[4, 8], pp=0, tag=0)\n\
                send(a, pp=0, tag=0)\n\
                }\n";
    let mut case = parse_plan(Path::new("again.plan"), text).unwrap_or_else(|e| panic!("{e}"));
    // Rank 1 (pp=0, dp=1) holds its `b` as a partial sum over dp.
    let at = case.inputs.iter().position(|i| i.impl_name == "b").unwrap();
    let mut partial = case.inputs[at].clone();
    partial.rank_values.retain(|&(r, _)| r == 1);
    case.inputs[at].rank_values.retain(|&(r, _)| r != 1);
    let Layout::Placed(pl) = &mut partial.layout else {
        panic!("b has no placements")
    };
    pl.placements[1] = Placement::Partial(Reduce::Sum);
    case.inputs.push(partial);
    assert_eq!(again_exact(&case, "inputs"), 0);
}
