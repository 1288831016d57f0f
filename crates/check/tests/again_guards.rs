//! Each comparison by which a rank propagated again takes an earlier rank's latest run
//! (`Again` in the crate root) is needed: on a zoo-emitted `pp=2,dp=2` llama (group-relative
//! peers, so the two replicas of a stage run graphs of one class and would share runs), the
//! case is edited so that the stage-0 replicas (ranks 0 and 1) differ in one read only, and
//! every rank must get what its own run gives (placements, findings, unknowns, the report).
//! Each test fails when its comparison is left out of `Again::of` (measured by removing each
//! one: without the input comparison (i) fails on rank 1's placements, and (ii) too, where
//! rank 3 takes rank 2's run; without the senders' placements (ii) fails on rank 1's
//! placements; without the finding comparison (iii) fails: the report names rank 0 only).

mod common;

use common::plans::Plan;
use shardproof_case::{Case, Layout, PlacedLayout, Placement, Reduce};
use shardproof_check::{check_case, propagate, twins_off, Propagation};

/// The zoo's llama on `pp=2,dp=2` (two microbatches, full iteration): ranks 0 and 1 run
/// stage 0 and receive their gradients from ranks 2 and 3, after which they run again.
fn pipeline_case(dir: &std::path::Path) -> Case {
    let plan = Plan {
        microbatches: 2,
        ..Plan::new("llama", "pp=2,dp=2", false)
    };
    shardproof_case::load_case(&plan.emit(dir).unwrap()).unwrap()
}

/// Gives input `name` on `ranks` its own layout, `edit` applied to a copy of the case's.
fn edit_input(case: &mut Case, name: &str, ranks: &[usize], edit: impl Fn(&mut PlacedLayout)) {
    let at = case
        .inputs
        .iter()
        .position(|i| i.impl_name == name)
        .unwrap_or_else(|| panic!("no input `{name}`"));
    let mut own = case.inputs[at].clone();
    own.rank_values.retain(|(r, _)| ranks.contains(r));
    assert!(!own.rank_values.is_empty(), "`{name}` on none of {ranks:?}");
    case.inputs[at]
        .rank_values
        .retain(|(r, _)| !ranks.contains(r));
    let Layout::Placed(pl) = &mut own.layout else {
        panic!("`{name}` has no placements")
    };
    edit(pl);
    case.inputs.push(own);
}

/// A finding as a comparable tuple (its rank included: a finding names its rank).
fn finding_keys(p: &Propagation, r: usize) -> Vec<(usize, usize, String, String)> {
    p.ranks[r]
        .findings
        .iter()
        .map(|f| {
            (
                f.rank,
                f.node,
                f.check.name().to_string(),
                f.message.clone(),
            )
        })
        .collect()
}

/// Propagates `case` with and without twins: every rank gets the same placements, findings
/// (with their ranks), unknowns, and the report is the same. Returns the runs again taken
/// from a twin.
fn again_exact(case: &Case, label: &str) -> usize {
    let shared = propagate(case).unwrap();
    let report = check_case(case).unwrap().render();
    twins_off(true);
    let own = propagate(case).unwrap();
    let own_report = check_case(case).unwrap().render();
    twins_off(false);
    assert_eq!(own.again_twin_runs, 0, "{label}");
    assert!(own.again_runs > 0, "{label}: nothing ran again");
    for r in 0..case.program.ranks.len() {
        let (a, b) = (&shared.ranks[r], &own.ranks[r]);
        assert!(a.places == b.places, "{label}: rank {r}'s placements");
        assert_eq!(
            finding_keys(&shared, r),
            finding_keys(&own, r),
            "{label}: rank {r}"
        );
        assert_eq!(a.unknown_values, b.unknown_values, "{label}: rank {r}");
        assert_eq!(a.unknown_sources, b.unknown_sources, "{label}: rank {r}");
    }
    assert_eq!(report, own_report, "{label}");
    shared.again_twin_runs
}

/// The unedited case: the stage-0 replicas read alike, and rank 1 takes rank 0's run again
/// (the edits below each break one read, so that a share there would be wrong).
#[test]
fn unedited_replicas_share_their_runs_again() {
    let dir = tempfile::tempdir().unwrap();
    let case = pipeline_case(dir.path());
    assert!(again_exact(&case, "unedited") >= 1);
}

/// (i) Rank 1 holds `w_down_0` as the same tensor on both stages (`Replicate()` over pp,
/// where rank 0 holds its stage's own): what it sends forward is the same, so its senders
/// send back what rank 0's do, but its placements differ. Without the input comparison
/// rank 1 takes rank 0's run again.
#[test]
fn replicas_with_other_input_placements_run_again_on_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let mut case = pipeline_case(dir.path());
    edit_input(&mut case, "w_down_0", &[1], |pl| {
        pl.at.clear();
        pl.placements[0] = Placement::Replicate;
    });
    again_exact(&case, "input");
}

/// (ii) Rank 3 (stage 1, dp 1) holds `wo_1` as a partial sum over dp: the gradient it sends
/// back to rank 1 is not what rank 2 sends rank 0, while ranks 0 and 1 are alike in
/// everything else. Without the comparison of the senders' placements rank 1 takes rank 0's
/// run again.
#[test]
fn replicas_whose_senders_send_other_placements_run_again_on_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let mut case = pipeline_case(dir.path());
    edit_input(&mut case, "wo_1", &[3], |pl| {
        pl.placements[1] = Placement::Partial(Reduce::Sum);
    });
    again_exact(&case, "senders");
}

/// (iii) Both stage-0 replicas hold `attn_norm_0` as a partial sum over dp: its product with
/// the normalized activations is a finding on each replica (an SPMD-type one, named by its
/// rank), which a run again keeps. Everything else the replicas read is alike. Without the
/// finding comparison rank 1 takes rank 0's run again, and the report names rank 0 only.
#[test]
fn a_replica_with_a_finding_is_not_a_source_for_its_twin() {
    let dir = tempfile::tempdir().unwrap();
    let mut case = pipeline_case(dir.path());
    edit_input(&mut case, "attn_norm_0", &[0, 1], |pl| {
        pl.placements[1] = Placement::Partial(Reduce::Sum);
    });
    let report = check_case(&case).unwrap();
    assert!(
        report
            .findings
            .iter()
            .any(|f| f.ranks == [0, 1] && f.check.name() == "spmd-type"),
        "{}",
        report.render()
    );
    again_exact(&case, "finding");
}
