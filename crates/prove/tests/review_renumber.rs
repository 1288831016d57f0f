//! Adversarial review of the stage memo up to renumbering the holding ranks
//! (`stage/renumber.rs`): twins that are the same stage up to a renumbering of their ranks
//! except in one rank-dependent place must keep their own keys (the wrong twin refuted, not
//! proved by its right twin's proof); twins that are the same stage share one proof.
//!
//! The case: a mesh { pp: 2, tp: 4 }; every rank reads `x` (pipeline stage 0) or `y`
//! (stage 1) whole, slices its own two rows at an offset written in its graph, and gathers
//! `relu` of them over process group `g` (pairs) into `a` (stage 0) or `b` (stage 1), both
//! expected in halves held by pairs of consecutive tp ranks. A rank's graph file is named by
//! its row offset.

use shardproof_prove::stage::plan_with;
use shardproof_prove::{PlanOptions, ProveConfig, Verdict};

const SPEC: &str = "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[8, 2]\", y: \"f32[8, 2]\"):\n        a: \"f32[8, 2]\" = torch.ops.aten.relu.default(x)\n        b: \"f32[8, 2]\" = torch.ops.aten.relu.default(y)\n        return (a, b)\n";

/// A rank that takes rows `[offset, offset + 2)` of `x` and of `y`.
fn rank(offset: usize) -> String {
    let end = offset + 2;
    format!("class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[8, 2]\", y: \"f32[8, 2]\"):\n        sx: \"f32[2, 2]\" = torch.ops.aten.slice.Tensor(x, 0, {offset}, {end})\n        rx: \"f32[2, 2]\" = torch.ops.aten.relu.default(sx)\n        gx: \"f32[4, 2]\" = torch.ops._c10d_functional.all_gather_into_tensor.default(rx, 2, 'g')\n        a: \"f32[4, 2]\" = torch.ops._c10d_functional.wait_tensor.default(gx)\n        sy: \"f32[2, 2]\" = torch.ops.aten.slice.Tensor(y, 0, {offset}, {end})\n        ry: \"f32[2, 2]\" = torch.ops.aten.relu.default(sy)\n        gy: \"f32[4, 2]\" = torch.ops._c10d_functional.all_gather_into_tensor.default(ry, 2, 'g')\n        b: \"f32[4, 2]\" = torch.ops._c10d_functional.wait_tensor.default(gy)\n        return (a, b)\n")
}

/// The case with ranks 0-7 reading rows at `offsets` and group `g` written as `pairs`.
fn case_with(offsets: [usize; 8], pairs: &str) -> (tempfile::TempDir, shardproof_case::Case) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("spec.py"), SPEC).unwrap();
    for o in [0, 2, 4, 6] {
        std::fs::write(d.join(format!("s{o}.py")), rank(o)).unwrap();
    }
    let graphs: Vec<String> = offsets.iter().map(|o| format!("s{o}.py")).collect();
    std::fs::write(
        d.join("case.yaml"),
        format!(
            "version: 1\nname: renumber-twins\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ pp: 2, tp: 4 }}\n  graphs: [{}]\n  groups:\n    \"g\": {pairs}\n    \"pp\": pp\n    \"tp\": tp\ninputs:\n  x: {{ placement: Replicate(), at: {{ pp: 0 }} }}\n  y: {{ placement: Replicate(), at: {{ pp: 1 }} }}\noutputs:\n  a: {{ placement: {{ tp: Shard(0) }}, replicas: 2, at: {{ pp: 0 }} }}\n  b: {{ placement: {{ tp: Shard(0) }}, replicas: 2, at: {{ pp: 1 }} }}\n",
            graphs.join(", ")
        ),
    )
    .unwrap();
    let case = shardproof_case::load_case(&d.join("case.yaml")).unwrap();
    (dir, case)
}

const PAIRS: &str = "[[0, 1], [2, 3], [4, 5], [6, 7]]";
const RIGHT: [usize; 8] = [0, 2, 4, 6, 0, 2, 4, 6];

fn opts() -> PlanOptions {
    PlanOptions {
        outputs_apart: true,
        ..PlanOptions::default()
    }
}

/// The plan's stages as (target, representative), with unreduced or reduced keys.
fn reps(case: &shardproof_case::Case, reduce: bool) -> Vec<(String, usize)> {
    let plan = plan_with(case, reduce, &opts()).unwrap();
    plan.stages
        .iter()
        .map(|s| (s.target.clone(), s.rep))
        .collect()
}

/// Asserts the stage of `b` keeps its own key (reduced and not) and the staged proof refutes.
fn assert_own_key_and_refuted(case: &shardproof_case::Case) {
    for reduce in [false, true] {
        assert_eq!(
            reps(case, reduce),
            vec![("output `a`".to_string(), 0), ("output `b`".to_string(), 1)],
            "reduce: {reduce}"
        );
    }
    let staged =
        shardproof_prove::stage::prove_staged_with(case, &ProveConfig::default(), 1, &opts());
    assert_eq!(staged.verdict, Verdict::Refuted, "{:?}", staged.message);
}

/// The positive control: pipeline stage 1's ranks read the rows stage 0's do, by position,
/// so the stage of `b` is the stage of `a` renumbered, one proof.
#[test]
fn twins_with_rank_literals_in_the_same_positions_share_a_proof() {
    let (_dir, case) = case_with(RIGHT, PAIRS);
    for reduce in [false, true] {
        assert_eq!(
            reps(&case, reduce),
            vec![("output `a`".to_string(), 0), ("output `b`".to_string(), 0)],
            "reduce: {reduce}"
        );
    }
    let staged =
        shardproof_prove::stage::prove_staged_with(&case, &ProveConfig::default(), 1, &opts());
    assert_eq!(staged.verdict, Verdict::Proved, "{:?}", staged.message);
    assert_eq!((staged.distinct_stages, staged.memo_hits), (1, 1));
}

/// Ranks 4 and 5 swap their graphs (rows 2 and 0): each holder of the stage of `b` runs a
/// graph some holder of `a` runs, but not the one at its position, so `b`'s first half is
/// rows 2, 3, 0, 1. It keeps its own key and is refuted.
#[test]
fn holders_that_swap_their_graphs_are_another_stage() {
    let (_dir, case) = case_with([0, 2, 4, 6, 2, 0, 4, 6], PAIRS);
    assert_own_key_and_refuted(&case);
}

/// Rank 5 reads rows 4, 5 (a rank-dependent slice offset off by one piece): another key.
#[test]
fn a_holder_with_another_slice_offset_is_another_stage() {
    let (_dir, case) = case_with([0, 2, 4, 6, 0, 4, 4, 6], PAIRS);
    assert_own_key_and_refuted(&case);
}

/// Pipeline stage 1's pairs listed the other way round (`[5, 4]`) are the same groups: the
/// case sorts a group's ranks as `torch.distributed.new_group` does, and `all_gather` stacks
/// in that order. So the stage of `b` is still `a`'s renumbered (a memo hit) and right.
#[test]
fn a_group_listed_in_another_order_is_the_same_stage() {
    let (_dir, case) = case_with(RIGHT, "[[0, 1], [2, 3], [5, 4], [7, 6]]");
    assert_eq!(
        reps(&case, false),
        vec![("output `a`".to_string(), 0), ("output `b`".to_string(), 0)]
    );
    let staged =
        shardproof_prove::stage::prove_staged_with(&case, &ProveConfig::default(), 1, &opts());
    assert_eq!(staged.verdict, Verdict::Proved, "{:?}", staged.message);
}
