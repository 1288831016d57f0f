//! The memo up to renumbering the ranks that hold a stage: a stage on one pipeline stage's ranks
//! and the same stage on another's are one proof, and two stages whose collectives run over
//! member sets that differ (up to that renumbering) are not.
//!
//! The case: a mesh { pp: 2, tp: 4 }; every rank gathers `relu` of its tp shard of `x` into `a`
//! and of `y` into `b` over process group `g` (pairs of ranks); `x` and `a` live on pipeline
//! stage 0 (ranks 0-3), `y` and `b` on stage 1 (ranks 4-7); `a` and `b` are expected in halves,
//! each held by a pair of consecutive tp ranks. With one output stage each, the stage of `b` is
//! the stage of `a` with ranks 0-3 renumbered as 4-7 when `g` pairs stage 1's ranks as it pairs
//! stage 0's.

use shardproof_prove::stage::plan_with;
use shardproof_prove::{PlanOptions, ProveConfig, Verdict};

const SPEC: &str = "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[8, 2]\", y: \"f32[8, 2]\"):\n        a: \"f32[8, 2]\" = torch.ops.aten.relu.default(x)\n        b: \"f32[8, 2]\" = torch.ops.aten.relu.default(y)\n        return (a, b)\n";

const RANK: &str = "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[2, 2]\", y: \"f32[2, 2]\"):\n        rx: \"f32[2, 2]\" = torch.ops.aten.relu.default(x)\n        gx: \"f32[4, 2]\" = torch.ops._c10d_functional.all_gather_into_tensor.default(rx, 2, 'g')\n        a: \"f32[4, 2]\" = torch.ops._c10d_functional.wait_tensor.default(gx)\n        ry: \"f32[2, 2]\" = torch.ops.aten.relu.default(y)\n        gy: \"f32[4, 2]\" = torch.ops._c10d_functional.all_gather_into_tensor.default(ry, 2, 'g')\n        b: \"f32[4, 2]\" = torch.ops._c10d_functional.wait_tensor.default(gy)\n        return (a, b)\n";

/// The case with process group `g` written as `pairs` (YAML), in a temporary directory.
fn case_with(pairs: &str) -> (tempfile::TempDir, shardproof_case::Case) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("spec.py"), SPEC).unwrap();
    std::fs::write(d.join("rank.py"), RANK).unwrap();
    std::fs::write(
        d.join("case.yaml"),
        format!(
            "version: 1\nname: two-stages\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ pp: 2, tp: 4 }}\n  graphs: [{ranks}]\n  groups:\n    \"g\": {pairs}\n    \"pp\": pp\n    \"tp\": tp\ninputs:\n  x: {{ placement: {{ tp: Shard(0) }}, at: {{ pp: 0 }} }}\n  y: {{ placement: {{ tp: Shard(0) }}, at: {{ pp: 1 }} }}\noutputs:\n  a: {{ placement: {{ tp: Shard(0) }}, replicas: 2, at: {{ pp: 0 }} }}\n  b: {{ placement: {{ tp: Shard(0) }}, replicas: 2, at: {{ pp: 1 }} }}\n",
            ranks = ["rank.py"; 8].join(", ")
        ),
    )
    .unwrap();
    let case = shardproof_case::load_case(&d.join("case.yaml")).unwrap();
    (dir, case)
}

/// The plan's stages as (target, representative), unreduced and reduced keys alike.
fn reps(case: &shardproof_case::Case, reduce: bool) -> Vec<(String, usize)> {
    let opts = PlanOptions {
        outputs_apart: true,
        ..PlanOptions::default()
    };
    let plan = plan_with(case, reduce, &opts).unwrap();
    plan.stages
        .iter()
        .map(|s| (s.target.clone(), s.rep))
        .collect()
}

/// The two stages are one proof: the second reuses the first's.
#[test]
fn a_stage_on_another_pipeline_stages_ranks_is_a_memo_hit() {
    let (_dir, case) = case_with("[[0, 1], [2, 3], [4, 5], [6, 7]]");
    for reduce in [false, true] {
        assert_eq!(
            reps(&case, reduce),
            vec![("output `a`".to_string(), 0), ("output `b`".to_string(), 0)],
            "reduce: {reduce}"
        );
    }
    // And the staged proof proves both (the second by the first's proof).
    let cfg = ProveConfig::default();
    let opts = PlanOptions {
        outputs_apart: true,
        ..PlanOptions::default()
    };
    let staged = shardproof_prove::stage::prove_staged_with(&case, &cfg, 1, &opts);
    assert_eq!(staged.verdict, Verdict::Proved, "{:?}", staged.message);
    assert_eq!((staged.distinct_stages, staged.memo_hits), (1, 1));
}

/// Stage 1's ranks are paired otherwise (tp 0 with 2, 1 with 3): each gathers two quarters
/// that are not a half, a different theorem (false here), so it must not reuse stage 0's proof.
#[test]
fn a_group_that_pairs_the_holders_otherwise_is_another_stage() {
    let (_dir, case) = case_with("[[0, 1], [2, 3], [4, 6], [5, 7]]");
    for reduce in [false, true] {
        assert_eq!(
            reps(&case, reduce),
            vec![("output `a`".to_string(), 0), ("output `b`".to_string(), 1)],
            "reduce: {reduce}"
        );
    }
    let opts = PlanOptions {
        outputs_apart: true,
        ..PlanOptions::default()
    };
    let staged =
        shardproof_prove::stage::prove_staged_with(&case, &ProveConfig::default(), 1, &opts);
    assert_eq!(staged.verdict, Verdict::Refuted, "{:?}", staged.message);
}
