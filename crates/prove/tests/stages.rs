//! Staged proofs: a chain of identical tensor-parallel residual blocks cut at every block's
//! output is proved one block at a time with the memo, a wrong block before a cut is refuted
//! (the cut is established, never assumed), the report is the same at any thread count, and
//! shards merged give the single-process report.

use shardproof_prove::stage::{self, shard};
use shardproof_prove::{prove_staged, ProveConfig, Verdict};
use std::fmt::Write as _;
use std::path::Path;

/// A chain of `layers` residual blocks `h = h + relu(h @ a) @ b`, the spec and a tp=2 rank
/// (a column-parallel, b row-parallel, an all-reduce), cut at every block's output but the
/// last, which is the expected output. The rank of block `bug` forgets its all-reduce.
fn chain(dir: &Path, layers: usize, bug: Option<usize>) -> shardproof_case::Case {
    let mut spec =
        String::from("class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[4, 8]\"");
    let mut rank =
        String::from("class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[4, 8]\"");
    for l in 0..layers {
        let _ = write!(spec, ", a{l}: \"f32[8, 8]\", b{l}: \"f32[8, 8]\"");
        let _ = write!(rank, ", a{l}: \"f32[8, 4]\", b{l}: \"f32[4, 8]\"");
    }
    spec.push_str("):\n");
    rank.push_str("):\n");
    let mut case = String::from(
        "version: 1\nname: chain\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r1.py]\ninputs:\n  x: Replicate()\n",
    );
    for l in 0..layers {
        let h = if l == 0 {
            "x".to_string()
        } else {
            format!("h{}", l - 1)
        };
        let _ = write!(
            spec,
            "        mm{l}: \"f32[4, 8]\" = torch.ops.aten.mm.default({h}, a{l})\n        \
             relu{l}: \"f32[4, 8]\" = torch.ops.aten.relu.default(mm{l})\n        \
             down{l}: \"f32[4, 8]\" = torch.ops.aten.mm.default(relu{l}, b{l})\n        \
             h{l}: \"f32[4, 8]\" = torch.ops.aten.add.Tensor({h}, down{l})\n"
        );
        let _ = write!(
            rank,
            "        mm{l}: \"f32[4, 4]\" = torch.ops.aten.mm.default({h}, a{l})\n        \
             relu{l}: \"f32[4, 4]\" = torch.ops.aten.relu.default(mm{l})\n        \
             down{l}: \"f32[4, 8]\" = torch.ops.aten.mm.default(relu{l}, b{l})\n"
        );
        if bug == Some(l) {
            let _ = writeln!(
                rank,
                "        h{l}: \"f32[4, 8]\" = torch.ops.aten.add.Tensor({h}, down{l})"
            );
        } else {
            let _ = write!(
                rank,
                "        ar{l}: \"f32[4, 8]\" = torch.ops._c10d_functional.all_reduce.default(down{l}, 'sum', '0')\n        \
                 wt{l}: \"f32[4, 8]\" = torch.ops._c10d_functional.wait_tensor.default(ar{l})\n        \
                 h{l}: \"f32[4, 8]\" = torch.ops.aten.add.Tensor({h}, wt{l})\n"
            );
        }
        let _ = write!(case, "  a{l}: Shard(1)\n  b{l}: Shard(0)\n");
    }
    for l in 0..layers - 1 {
        let _ = writeln!(case, "  h{l}: Replicate()");
    }
    let last = layers - 1;
    let _ = writeln!(spec, "        return (h{last},)");
    let _ = writeln!(rank, "        return (h{last},)");
    let _ = write!(case, "outputs:\n  h{last}: Replicate()\n");
    std::fs::write(dir.join("spec.py"), spec).unwrap();
    std::fs::write(dir.join("r0.py"), &rank).unwrap();
    std::fs::write(dir.join("r1.py"), &rank).unwrap();
    std::fs::write(dir.join("case.yaml"), case).unwrap();
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}

#[test]
fn identical_blocks_are_proved_once_and_chained() {
    let dir = tempfile::tempdir().unwrap();
    let case = chain(dir.path(), 3, None);
    let proof = prove_staged(&case, &ProveConfig::default(), 1);
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
    let targets: Vec<&str> = proof.stages.iter().map(|s| s.target.as_str()).collect();
    assert_eq!(targets, ["cut `h0`", "cut `h1`", "output `h2`"]);
    // Block 1 assumes block 0's output, established by stage 0.
    assert_eq!(proof.stages[1].assumes, ["h0", "a1", "b1"]);
    assert_eq!((proof.distinct_stages, proof.memo_hits), (1, 2));
    assert!(proof.stages[1].memo_hit && proof.stages[2].memo_hit);
    assert_eq!(proof.stages[2].proved_by, 0);
    assert!(proof
        .stages
        .iter()
        .all(|s| s.verdict == Some(Verdict::Proved)));
    assert!(proof.layers.get("normal-form").copied().unwrap_or(0) > 0);
}

#[test]
fn a_wrong_block_before_a_cut_is_refuted_not_assumed() {
    let dir = tempfile::tempdir().unwrap();
    // Block 0 forgets its all-reduce: h0 is not replicated as the cut claims. The proof with
    // the cut as a bare assumption would only look at the blocks after it.
    let case = chain(dir.path(), 3, Some(0));
    let proof = prove_staged(&case, &ProveConfig::default(), 2);
    assert_eq!(proof.verdict, Verdict::Refuted, "{:?}", proof.message);
    assert_eq!(proof.stages[0].verdict, Some(Verdict::Refuted));
    assert!(proof
        .message
        .as_deref()
        .unwrap()
        .contains("stage 0 (cut `h0`)"));
    // The two correct blocks are still one proof.
    assert_eq!((proof.distinct_stages, proof.memo_hits), (2, 1));
    assert!(proof.refuted.as_ref().unwrap().counterexample.is_some());
}

#[test]
fn a_wrong_last_block_is_refuted_at_the_output() {
    let dir = tempfile::tempdir().unwrap();
    let case = chain(dir.path(), 2, Some(1));
    let proof = prove_staged(&case, &ProveConfig::default(), 1);
    assert_eq!(proof.verdict, Verdict::Refuted, "{:?}", proof.message);
    assert_eq!(proof.stages[0].verdict, Some(Verdict::Proved));
    assert_eq!(proof.stages[1].verdict, Some(Verdict::Refuted));
}

#[test]
fn the_report_is_the_same_at_any_thread_count() {
    let dir = tempfile::tempdir().unwrap();
    let case = chain(dir.path(), 4, Some(2));
    let one = serde_json::to_string(&prove_staged(&case, &ProveConfig::default(), 1)).unwrap();
    for jobs in [2, 3] {
        let many =
            serde_json::to_string(&prove_staged(&case, &ProveConfig::default(), jobs)).unwrap();
        assert_eq!(one, many, "--jobs {jobs}");
    }
}

#[test]
fn merged_shards_give_the_single_process_report() {
    let dir = tempfile::tempdir().unwrap();
    let case = chain(dir.path(), 3, Some(1));
    let cfg = ProveConfig::default();
    let single = serde_json::to_string(&prove_staged(&case, &cfg, 1)).unwrap();
    let out = dir.path().join("results");
    let plan = stage::plan(&case, cfg.reduce).unwrap();
    assert_eq!(plan.distinct.len(), 2);
    for i in 0..2 {
        let mine = shard::shard_stages(&plan, i, 2);
        assert_eq!(mine.len(), 1);
        let results: Vec<_> = stage::prove_stages(&plan, &mine, &cfg, 1)
            .into_iter()
            .map(|(k, o, _)| (k, o))
            .collect();
        shard::write_shard(&out, &case.name, &plan, i, 2, &results).unwrap();
    }
    let outcomes = shard::read_shards(&out, &plan).unwrap();
    let merged = serde_json::to_string(&stage::assemble(&case, &plan, &outcomes)).unwrap();
    assert_eq!(single, merged);
    // Without one shard's file the verdict is not given.
    std::fs::remove_file(shard::shard_path(&out, 1, 2)).unwrap();
    let outcomes = shard::read_shards(&out, &plan).unwrap();
    let partial = stage::assemble(&case, &plan, &outcomes);
    assert_eq!(partial.verdict, Verdict::Inconclusive);
    // A shard file of another plan is refused.
    let other = tempfile::tempdir().unwrap();
    let other_case = chain(other.path(), 2, None);
    let other_plan = stage::plan(&other_case, cfg.reduce).unwrap();
    assert!(shard::read_shards(&out, &other_plan).is_err());
}

#[test]
fn shard_arguments_are_checked() {
    assert_eq!(shard::parse_shard("1/4"), Ok((1, 4)));
    assert!(shard::parse_shard("4/4").is_err());
    assert!(shard::parse_shard("0/0").is_err());
    assert!(shard::parse_shard("x").is_err());
}

#[test]
fn a_cut_computed_from_a_later_cut_is_refused_not_assumed() {
    // The spec computes c1 before c2; the rank computes c1 from c2. Stage c1 would assume c2,
    // which only a later stage establishes: circular, so no verdict.
    let dir = tempfile::tempdir().unwrap();
    let spec = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[4, 8]"):
        c1: "f32[4, 8]" = torch.ops.aten.relu.default(x)
        c2: "f32[4, 8]" = torch.ops.aten.neg.default(x)
        out: "f32[4, 8]" = torch.ops.aten.add.Tensor(c1, c2)
        return (out,)
"#;
    let rank = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[4, 8]"):
        c2: "f32[4, 8]" = torch.ops.aten.neg.default(x)
        c1: "f32[4, 8]" = torch.ops.aten.relu.default(c2)
        out: "f32[4, 8]" = torch.ops.aten.add.Tensor(c1, c2)
        return (out,)
"#;
    std::fs::write(dir.path().join("spec.py"), spec).unwrap();
    std::fs::write(dir.path().join("r0.py"), rank).unwrap();
    std::fs::write(dir.path().join("r1.py"), rank).unwrap();
    std::fs::write(
        dir.path().join("case.yaml"),
        "version: 1\nname: cycle\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r1.py]\ninputs:\n  x: Replicate()\n  c1: Replicate()\n  c2: Replicate()\noutputs:\n  out: Replicate()\n",
    )
    .unwrap();
    let case = shardproof_case::load_case(&dir.path().join("case.yaml")).unwrap();
    let proof = prove_staged(&case, &ProveConfig::default(), 1);
    assert_eq!(proof.verdict, Verdict::Inconclusive);
    assert!(
        proof.message.as_deref().unwrap().contains("cycle"),
        "{:?}",
        proof.message
    );
}
