//! The mesh-dim reduction along dp (docs/prove.md section 2): zoo plans at dp = 4 proved
//! through it, dp catalog bugs still refuted with a confirmed counterexample, and hand-made
//! plans violating each of its conditions (a)-(c) refused by it, never proved through it.

use shardproof_prove::reduce::mesh::reduce_mesh;
use shardproof_prove::{prove_case, ProveConfig, Verdict};
use std::path::Path;
use zoo_emit::emit_sized;

mod zoo_emit;

fn emit_mlp(
    dir: &Path,
    mesh: &str,
    bug: Option<&str>,
    forward_only: bool,
) -> shardproof_case::Case {
    emit_sized("mlp", dir, mesh, bug, forward_only, (8, 16, 8))
}

#[test]
fn zoo_plans_at_dp_4_are_proved_through_the_mesh_reduction() {
    for (mesh, fw) in [("dp=4", false), ("dp=4", true), ("dp=4,tp=2", false)] {
        let dir = tempfile::tempdir().unwrap();
        let case = emit_mlp(dir.path(), mesh, None, fw);
        let m = reduce_mesh(&case).expect("a dp dim of 4").expect("reduced");
        assert_eq!(m.lifts, Ok(()), "{mesh} {fw}");
        assert_eq!(m.case.program.ranks.len(), case.program.ranks.len() / 2);
        let proof = prove_case(&case, &ProveConfig::default());
        assert_eq!(
            proof.verdict,
            Verdict::Proved,
            "{mesh} {fw}: {:?}",
            proof.message
        );
        let mesh_summary = proof
            .mesh
            .as_ref()
            .expect("proved through the mesh reduction");
        assert_eq!((mesh_summary.original, mesh_summary.reduced), (4, 2));
        assert_eq!(proof.mesh_kept, None);
        // The dp average's 1/4 became 1/2; a full iteration's spec mean over 8 rows, written as
        // a literal, became one over 4.
        assert!(mesh_summary.rewritten.iter().any(|r| r.contains("4 -> 2")));
    }
}

#[test]
fn dp_catalog_bugs_are_refuted_through_the_mesh_reduction() {
    for (mesh, bug, fw) in [
        ("dp=4", "dp-grad-not-averaged", false),
        ("dp=4", "dp-loss-not-averaged", true),
        ("dp=4,tp=2", "wrong-group", false),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let case = emit_mlp(dir.path(), mesh, Some(bug), fw);
        let proof = prove_case(&case, &ProveConfig::default());
        assert_eq!(
            proof.verdict,
            Verdict::Refuted,
            "{bug}: {:?}",
            proof.message
        );
        assert!(proof.counterexample.is_some(), "{bug}");
        assert_eq!(
            proof.ranks,
            case.program.ranks.len(),
            "{bug}: on the case as written"
        );
        // Found on the two replicas, confirmed on the four.
        let m = proof
            .mesh
            .as_ref()
            .expect("refuted through the mesh reduction");
        assert_eq!((m.original, m.reduced), (4, 2), "{bug}");
    }
}

/// A case of one spec graph and four dp ranks (`r0.py` .. `r3.py`).
fn write_dp4(
    dir: &Path,
    spec: &str,
    ranks: [&str; 4],
    inputs: &str,
    outputs: &str,
) -> shardproof_case::Case {
    std::fs::write(dir.join("spec.py"), spec).unwrap();
    for (r, g) in ranks.iter().enumerate() {
        std::fs::write(dir.join(format!("r{r}.py")), g).unwrap();
    }
    let case = format!(
        "version: 1\nname: dp4\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ dp: 4 }}\n  graphs: [r0.py, r1.py, r2.py, r3.py]\n  groups:\n    \"dp\": dp\ninputs:\n{inputs}outputs:\n{outputs}"
    );
    std::fs::write(dir.join("case.yaml"), case).unwrap();
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}

const SPEC_SCALE: &str = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[8, 2]"):
        y: "f32[8, 2]" = torch.ops.aten.mul.Scalar(x, 3)
        return (y,)
"#;

fn rank_scale(c: u32) -> String {
    format!(
        r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[2, 2]"):
        y: "f32[2, 2]" = torch.ops.aten.mul.Scalar(x, {c})
        return (y,)
"#
    )
}

#[test]
fn a_rank_dependent_constant_refuses_the_reduction_condition_a() {
    // Ranks 0 and 1 are right, rank 3 scales by 5: the two kept replicas alone would prove it.
    let dir = tempfile::tempdir().unwrap();
    let (ok, wrong) = (rank_scale(3), rank_scale(5));
    let case = write_dp4(
        dir.path(),
        SPEC_SCALE,
        [&ok, &ok, &ok, &wrong],
        "  x: { dp: Shard(0) }\n",
        "  y: { dp: Shard(0) }\n",
    );
    let why = reduce_mesh(&case).unwrap().unwrap_err();
    assert!(why.starts_with("(a)"), "{why}");
    let proof = prove_case(&case, &ProveConfig::default());
    assert_eq!(proof.verdict, Verdict::Refuted, "{:?}", proof.message);
    assert!(proof.mesh.is_none());
}

const SPEC_BATCH_NORM: &str = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[8, 2]"):
        mean: "f32[1, 2]" = torch.ops.aten.mean.dim(x, [0], True)
        y: "f32[8, 2]" = torch.ops.aten.sub.Tensor(x, mean)
        return (y,)
"#;

const RANK_BATCH_NORM: &str = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[2, 2]"):
        mean: "f32[1, 2]" = torch.ops.aten.mean.dim(x, [0], True)
        all_reduce: "f32[1, 2]" = torch.ops._c10d_functional.all_reduce.default(mean, 'avg', 'dp')
        wait_tensor: "f32[1, 2]" = torch.ops._c10d_functional.wait_tensor.default(all_reduce)
        y: "f32[2, 2]" = torch.ops.aten.sub.Tensor(x, wait_tensor)
        return (y,)
"#;

#[test]
fn a_batch_statistic_read_back_into_the_rows_refuses_the_reduction_condition_b() {
    // A correct synchronized batch norm: proved, but at dp = 4, not through the reduction.
    let dir = tempfile::tempdir().unwrap();
    let r = RANK_BATCH_NORM;
    let case = write_dp4(
        dir.path(),
        SPEC_BATCH_NORM,
        [r, r, r, r],
        "  x: { dp: Shard(0) }\n",
        "  y: { dp: Shard(0) }\n",
    );
    let m = reduce_mesh(&case).unwrap().unwrap();
    let why = m.lifts.unwrap_err();
    assert!(why.starts_with("(b)"), "{why}");
    let proof = prove_case(&case, &ProveConfig::default());
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
    assert!(proof.mesh.is_none());
    // The report says why the case was proved at its own mesh: the failed condition.
    let kept = proof.mesh_kept.as_deref().unwrap_or_default();
    assert!(kept.contains("(b)"), "{kept:?}");
}

const SPEC_SUM_QUARTER: &str = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[8]"):
        sum_1: "f32[]" = torch.ops.aten.sum.default(x)
        loss: "f32[]" = torch.ops.aten.div.Scalar(sum_1, 4)
        return (loss,)
"#;

const RANK_SUM_EIGHTH: &str = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[2]"):
        sum_1: "f32[]" = torch.ops.aten.sum.default(x)
        all_reduce: "f32[]" = torch.ops._c10d_functional.all_reduce.default(sum_1, 'sum', 'dp')
        wait_tensor: "f32[]" = torch.ops._c10d_functional.wait_tensor.default(all_reduce)
        loss: "f32[]" = torch.ops.aten.div.Scalar(wait_tensor, 8)
        return (loss,)
"#;

const SPEC_SQUARED_MEAN: &str = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[8]"):
        mean: "f32[]" = torch.ops.aten.mean.default(x)
        loss: "f32[]" = torch.ops.aten.mul.Tensor(mean, mean)
        return (loss,)
"#;

const RANK_SQUARED_MEAN: &str = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[2]"):
        mean: "f32[]" = torch.ops.aten.mean.default(x)
        all_reduce: "f32[]" = torch.ops._c10d_functional.all_reduce.default(mean, 'sum', 'dp')
        wait_tensor: "f32[]" = torch.ops._c10d_functional.wait_tensor.default(all_reduce)
        m: "f32[]" = torch.ops.aten.div.Scalar(wait_tensor, 4)
        loss: "f32[]" = torch.ops.aten.mul.Tensor(m, m)
        return (loss,)
"#;

#[test]
fn reductions_that_are_not_means_or_not_linear_refuse_the_reduction_condition_c() {
    // The spec sums the batch and divides by a constant 4; the ranks divide the sum by
    // 8 = 2 x dp. At dp = 2 (the rank's 8 rewritten to 4) both are sum / 4, at dp = 4 they
    // differ: a proof at dp = 2 must not carry over.
    let dir = tempfile::tempdir().unwrap();
    let r = RANK_SUM_EIGHTH;
    let case = write_dp4(
        dir.path(),
        SPEC_SUM_QUARTER,
        [r, r, r, r],
        "  x: { dp: Shard(0) }\n",
        "  loss: Replicate()\n",
    );
    let m = reduce_mesh(&case).unwrap().unwrap();
    let why = m.lifts.clone().unwrap_err();
    assert!(why.starts_with("(c)"), "{why}");
    let at_two = prove_case(&m.case, &ProveConfig::default());
    assert_eq!(at_two.verdict, Verdict::Proved, "{:?}", at_two.message);
    let proof = prove_case(&case, &ProveConfig::default());
    assert_eq!(proof.verdict, Verdict::Refuted, "{:?}", proof.message);
    assert!(proof.counterexample.is_some());
    // A loss that squares the batch mean: right at every dp, but not linear in the mean.
    let dir = tempfile::tempdir().unwrap();
    let r = RANK_SQUARED_MEAN;
    let case = write_dp4(
        dir.path(),
        SPEC_SQUARED_MEAN,
        [r, r, r, r],
        "  x: { dp: Shard(0) }\n",
        "  loss: Replicate()\n",
    );
    let why = reduce_mesh(&case).unwrap().unwrap().lifts.unwrap_err();
    assert!(why.starts_with("(c)"), "{why}");
    let proof = prove_case(&case, &ProveConfig::default());
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
    assert!(proof.mesh.is_none());
}

/// A zoo plan with pipeline or context parallelism: two-layer mlp or the smallest llama the
/// ring runs on, `microbatches` per dp rank.
fn emit_p2p(
    dir: &Path,
    model: &str,
    mesh: &str,
    bug: Option<&str>,
    forward_only: bool,
    microbatches: usize,
) -> shardproof_case::Case {
    use shardproof_zoo::{EmitExtras, EmitOptions, LlamaConfig, MlpConfig, PipelineOptions};
    let opts = EmitOptions {
        model: model.into(),
        mlp: MlpConfig {
            hidden: 8,
            ffn: 16,
            batch: 8,
            layers: 2,
            ..MlpConfig::default()
        },
        llama: LlamaConfig {
            hidden: 4,
            heads: 1,
            kv_heads: 1,
            ffn: 4,
            layers: 1,
            seq: 4,
            batch: 4,
            vocab: 4,
            ..LlamaConfig::default()
        },
        mesh: shardproof_zoo::Mesh::parse(mesh).unwrap(),
        bug: bug.map(|b| shardproof_zoo::find_bug(b).unwrap()),
        forward_only,
        vocab_parallel: false,
    };
    let pipeline = PipelineOptions {
        microbatches,
        ..PipelineOptions::default()
    };
    zoo_emit::emit_loaded(dir, &opts, &EmitExtras::default(), &pipeline)
}

/// Since send/recv name their peers within the 'pp'/'cp' group, the dp replicas of a pp or cp
/// plan run one graph. dp x pp goes through the reduction: its stages' inputs are held `at:`
/// pipeline coordinates, the same at every dp coordinate, and each message stays within its
/// replica, so the classes of (b)-(c) are carried from sender to receiver; the correct plan is
/// proved through it and its bugs are refuted on the case as written. dp x cp's ring lifts the
/// same way (its messages stay within a replica's cp group), and its two-replica case is
/// decided at full size, and through the default configuration (the ring's `logsumexp` is
/// reduced since s72). Bugs are never proved; both are checked at full size too.
#[test]
fn dp_4_pp_and_cp_plans_are_proved_through_the_mesh_reduction_and_their_bugs_refuted() {
    let full_size = ProveConfig {
        reduce: false,
        ..ProveConfig::default()
    };
    for (model, mesh, bug, fw, mb) in [
        ("mlp", "dp=4,pp=2", "pp-shuffled-microbatches", false, 2),
        ("mlp", "dp=4,pp=2", "pp-wrong-stage-division", true, 1),
        ("llama", "dp=4,cp=2", "cp-causal-mask-local", true, 1),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let good = emit_p2p(dir.path(), model, mesh, None, fw, mb);
        let bad_dir = tempfile::tempdir().unwrap();
        let bad = emit_p2p(bad_dir.path(), model, mesh, Some(bug), fw, mb);
        for (case, buggy) in [(&good, false), (&bad, true)] {
            let m = reduce_mesh(case)
                .expect("a dp dim of 4")
                .expect("a p2p plan is reduced");
            assert_eq!(m.lifts, Ok(()), "{mesh} {bug} {buggy}");
            assert_eq!(m.case.program.ranks.len(), 4);
            if mesh.contains("cp") {
                // The reduced mesh's rings: the 'cp' slices at dp coordinates 0 and 1, in
                // rank order, so that a peer index names the same neighbour as in the case.
                let cp = m.case.program.group("cp").expect("a cp group");
                assert_eq!(cp.members, vec![vec![0, 1], vec![2, 3]]);
            }
            let through = prove_case(case, &ProveConfig::default());
            if mesh.contains("cp") {
                // The ring's `logsumexp` is reduced (docs/prove.md, section 2): the correct
                // plan is proved through the default configuration, the bug never; the
                // two-replica case at full size is decided alike.
                if buggy {
                    assert_ne!(
                        through.verdict,
                        Verdict::Proved,
                        "{bug}: {:?}",
                        through.message
                    );
                } else {
                    assert_eq!(
                        through.verdict,
                        Verdict::Proved,
                        "{bug}: {:?}",
                        through.message
                    );
                }
                let two = prove_case(&m.case, &full_size);
                let want = if buggy {
                    Verdict::Refuted
                } else {
                    Verdict::Proved
                };
                assert_eq!(two.verdict, want, "{bug} {buggy}: {:?}", two.message);
                continue;
            }
            let reduced = through.mesh.as_ref().map(|m| (m.original, m.reduced));
            assert_eq!(
                reduced,
                Some((4, 2)),
                "{mesh} {bug} {buggy}: {:?} {:?}",
                through.mesh_kept,
                through.message
            );
            if buggy {
                assert_eq!(through.verdict, Verdict::Refuted, "{:?}", through.message);
                assert!(through.counterexample.is_some(), "{bug}");
                assert_eq!(through.ranks, case.program.ranks.len(), "{bug}: as written");
            } else {
                assert_eq!(through.verdict, Verdict::Proved, "{:?}", through.message);
            }
        }
        let proof = prove_case(&bad, &full_size);
        assert_eq!(
            proof.verdict,
            Verdict::Refuted,
            "{bug}: {:?}",
            proof.message
        );
        assert!(proof.counterexample.is_some(), "{bug}");
        let proof = prove_case(&good, &full_size);
        assert_eq!(
            proof.verdict,
            Verdict::Proved,
            "{mesh}: {:?}",
            proof.message
        );
    }
}

/// A tensor held `at:` some dp coordinates only: the replicas do not hold the same pieces
/// (here ranks 2 and 3 are given no `w` at all), so the reduction along dp refuses it
/// (condition (a)): the two replicas it keeps both hold `w` and would prove it. An `at:`
/// naming other mesh dims only (a pipeline stage's weights) is accepted
/// (`tests/pipeline_reduction.rs`).
#[test]
fn a_tensor_held_at_some_dp_coordinates_refuses_the_reduction_condition_a() {
    let dir = tempfile::tempdir().unwrap();
    let spec = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[8, 2]", w: "f32[2]"):
        y: "f32[8, 2]" = torch.ops.aten.mul.Tensor(x, w)
        return (y,)
"#;
    let rank = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[2, 2]", w: "f32[2]"):
        y: "f32[2, 2]" = torch.ops.aten.mul.Tensor(x, w)
        return (y,)
"#;
    let case = write_dp4(
        dir.path(),
        spec,
        [rank, rank, rank, rank],
        "  x: { dp: Shard(0) }\n  w: { placement: Replicate(), at: { dp: [0, 1] } }\n",
        "  y: { dp: Shard(0) }\n",
    );
    let why = reduce_mesh(&case).unwrap().unwrap_err();
    assert!(why.starts_with("(a)") && why.contains("at:"), "{why}");
    let proof = prove_case(&case, &ProveConfig::default());
    assert_ne!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
}
