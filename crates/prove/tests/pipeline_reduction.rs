//! Pipeline plans (send/recv) through shape reduction (docs/prove.md section 2): a recv's
//! buffer takes the sizes of the tensor its matched send posts. The zoo's llama forwards at
//! pp = 2 (with dp and tp) are proved on reduced sizes, the pipeline bugs of the catalog are
//! refuted with a counterexample the interpreter confirms, a hang is refused, and a recv that
//! declares another shape than its message is never proved.

use shardproof_prove::reduce::reduce_case;
use shardproof_prove::{prove_case, ProveConfig, Verdict};
use shardproof_zoo::{EmitExtras, EmitOptions, LlamaConfig, MlpConfig, PipelineOptions};
use std::path::Path;

mod zoo_emit;

/// A two-layer llama wide enough for the reduction to shrink it (hidden 16, two heads, ffn
/// 32), `microbatches` per dp rank.
fn emit_llama_pp(
    dir: &Path,
    mesh: &str,
    bug: Option<&str>,
    microbatches: usize,
) -> shardproof_case::Case {
    emit_llama_sized(dir, mesh, bug, microbatches, (8, 4))
}

/// [`emit_llama_pp`] with (seq, global batch).
fn emit_llama_sized(
    dir: &Path,
    mesh: &str,
    bug: Option<&str>,
    microbatches: usize,
    (seq, batch): (usize, usize),
) -> shardproof_case::Case {
    let opts = EmitOptions {
        model: "llama".into(),
        mlp: MlpConfig::default(),
        llama: LlamaConfig {
            hidden: 16,
            heads: 2,
            kv_heads: 2,
            ffn: 32,
            layers: 2,
            seq,
            batch,
            vocab: 16,
            ..LlamaConfig::default()
        },
        mesh: shardproof_zoo::Mesh::parse(mesh).unwrap(),
        bug: bug.map(|b| shardproof_zoo::find_bug(b).unwrap()),
        forward_only: true,
        vocab_parallel: false,
    };
    let pipeline = PipelineOptions {
        microbatches,
        ..PipelineOptions::default()
    };
    zoo_emit::emit_loaded(dir, &opts, &EmitExtras::default(), &pipeline)
}

fn elements(case: &shardproof_case::Case) -> usize {
    shardproof_prove::reduce::graph_elements(&case.spec, case)
        + case
            .program
            .ranks
            .iter()
            .map(|g| shardproof_prove::reduce::graph_elements(g, case))
            .sum::<usize>()
}

#[test]
fn llama_pp_forwards_are_proved_on_reduced_sizes() {
    for mesh in ["pp=2", "dp=2,pp=2", "dp=2,pp=2,tp=2"] {
        let dir = tempfile::tempdir().unwrap();
        let case = emit_llama_pp(dir.path(), mesh, None, 2);
        let reduced = reduce_case(&case).unwrap_or_else(|r| panic!("{mesh}: {}", r.message));
        let (before, after) = (elements(&case), elements(&reduced.case));
        assert!(after < before, "{mesh}: {before} -> {after}");
        let proof = prove_case(&case, &ProveConfig::default());
        assert_eq!(
            proof.verdict,
            Verdict::Proved,
            "{mesh}: {:?}",
            proof.message
        );
        let summary = proof.reduction.expect("proved on reduced sizes");
        assert!(summary.elements_after < summary.elements_before, "{mesh}");
    }
}

#[test]
fn pipeline_bugs_are_refuted_through_the_reduction() {
    for (mesh, bug) in [
        ("pp=2", "pp-shuffled-microbatches"),
        ("pp=2", "pp-wrong-stage-division"),
        ("dp=2,pp=2", "pp-shuffled-microbatches"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let case = emit_llama_pp(dir.path(), mesh, Some(bug), 2);
        // The bug keeps every message's shape: the reduction applies.
        reduce_case(&case).unwrap_or_else(|r| panic!("{mesh} {bug}: {}", r.message));
        let proof = prove_case(&case, &ProveConfig::default());
        assert_eq!(
            proof.verdict,
            Verdict::Refuted,
            "{mesh} {bug}: {:?}",
            proof.message
        );
        assert!(proof.counterexample.is_some(), "{mesh} {bug}");
    }
}

/// dp = 4 x pp = 2 (x tp = 2): the mesh reduction along dp (4 -> 2) carries the classes of
/// its conditions along each replica's pipeline messages, then shape reduction shrinks the
/// two-replica case. The loss left unaveraged over dp and shuffled microbatches are refuted
/// on the case as written. Six positions and a batch of 8 (2 rows per replica, one per
/// microbatch), so that no reshape can take the batch's dp factor for the positions.
#[test]
fn llama_dp_pp_forwards_are_proved_through_both_reductions() {
    for mesh in ["dp=4,pp=2", "dp=4,pp=2,tp=2"] {
        let dir = tempfile::tempdir().unwrap();
        let case = emit_llama_sized(dir.path(), mesh, None, 2, (6, 8));
        let proof = prove_case(&case, &ProveConfig::default());
        assert_eq!(
            proof.verdict,
            Verdict::Proved,
            "{mesh}: {:?}",
            proof.message
        );
        let m = proof.mesh.as_ref().expect("through the mesh reduction");
        assert_eq!((m.original, m.reduced), (4, 2), "{mesh}");
        let r = proof.reduction.as_ref().expect("and shape reduction");
        assert!(r.elements_after < r.elements_before, "{mesh}");
    }
    for bug in ["dp-loss-not-averaged", "pp-shuffled-microbatches"] {
        let dir = tempfile::tempdir().unwrap();
        let case = emit_llama_sized(dir.path(), "dp=4,pp=2", Some(bug), 2, (6, 8));
        let proof = prove_case(&case, &ProveConfig::default());
        assert_eq!(
            proof.verdict,
            Verdict::Refuted,
            "{bug}: {:?}",
            proof.message
        );
        assert!(proof.counterexample.is_some(), "{bug}");
        assert_eq!(proof.ranks, case.program.ranks.len(), "{bug}: as written");
    }
}

#[test]
fn a_hanging_pipeline_is_not_reduced() {
    let dir = tempfile::tempdir().unwrap();
    let case = emit_llama_pp(dir.path(), "pp=2", Some("pp-mismatched-send-recv"), 2);
    let why = reduce_case(&case).expect_err("messages that do not pair");
    assert!(why.message.contains("do not pair"), "{}", why.message);
    let proof = prove_case(&case, &ProveConfig::default());
    assert_ne!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
}

/// A two-stage case: stage 0 posts `cat([x, x])` (rows `2·v`), stage 1 receives it as
/// `recv_shape` and sums it; the spec sums the same concatenation.
fn write_two_stages(dir: &Path, recv_shape: &str) -> shardproof_case::Case {
    let spec = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[3, 2]"):
        c: "f32[6, 2]" = torch.ops.aten.cat.default([x, x], 0)
        s: "f32[]" = torch.ops.aten.sum.default(c)
        return (s,)
"#;
    let first = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[3, 2]"):
        c: "f32[6, 2]" = torch.ops.aten.cat.default([x, x], 0)
        sent: "f32[6, 2]" = torch.ops.shardproof_p2p.send.default(c, 1, 0, 'pp')
        return (sent,)
"#;
    let dims: Vec<&str> = recv_shape.split(',').map(str::trim).collect();
    let second = format!(
        r#"class GraphModule(torch.nn.Module):
    def forward(self):
        v: "f32[{recv_shape}]" = torch.ops.shardproof_p2p.recv.default([{}], torch.float32, 0, 0, 'pp')
        s: "f32[]" = torch.ops.aten.sum.default(v)
        return (s,)
"#,
        dims.join(", ")
    );
    std::fs::write(dir.join("spec.py"), spec).unwrap();
    std::fs::write(dir.join("s0.py"), first).unwrap();
    std::fs::write(dir.join("s1.py"), second).unwrap();
    let case = "version: 1\nname: two-stages\nspec:\n  graph: spec.py\nimpl:\n  mesh: { pp: 2 }\n  graphs: [s0.py, s1.py]\n  groups:\n    \"pp\": pp\ninputs:\n  x: { placement: Replicate(), at: { pp: 0 } }\noutputs:\n  s: { placement: Replicate(), at: { pp: 1 } }\n";
    std::fs::write(dir.join("case.yaml"), case).unwrap();
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}

/// The recv's rows are a size of their own in stage 1's graph (nothing there relates them to
/// stage 0's `2·v`): only the message relates them. Reduced apart, stage 1 would declare 2
/// rows where stage 0 posts 4.
#[test]
fn a_recv_takes_its_senders_reduced_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let case = write_two_stages(dir.path(), "6, 2");
    let reduced = reduce_case(&case).unwrap_or_else(|r| panic!("{}", r.message));
    let posted = shardproof_interp::infer_graph(&reduced.case.program.ranks[0], &reduced.case.ops)
        .metas[1][0]
        .clone()
        .unwrap();
    let received =
        shardproof_interp::infer_graph(&reduced.case.program.ranks[1], &reduced.case.ops).metas[0]
            [0]
        .clone()
        .unwrap();
    assert_eq!(posted.shape, received.shape);
    assert!(posted.shape[0] < 6, "{:?}", posted.shape);
    let proof = prove_case(&case, &ProveConfig::default());
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
    assert!(proof.reduction.is_some());
}

/// A recv that declares another shape than its message (the interpreter refuses to run it):
/// the sum of its elements equals the spec's, but the program means nothing, so it is never
/// proved, on reduced sizes (the reduction refuses: the sizes differ) or at full size (the
/// symbolic recv checks the message's type).
#[test]
fn a_recv_at_the_wrong_shape_is_never_proved() {
    let dir = tempfile::tempdir().unwrap();
    let case = write_two_stages(dir.path(), "2, 6");
    let why = reduce_case(&case).expect_err("the message's sizes differ");
    assert!(why.message.contains("differ"), "{}", why.message);
    for reduce in [true, false] {
        let cfg = ProveConfig {
            reduce,
            ..ProveConfig::default()
        };
        let proof = prove_case(&case, &cfg);
        assert_ne!(
            proof.verdict,
            Verdict::Proved,
            "{reduce}: {:?}",
            proof.message
        );
    }
}

/// dp = 4 x pp = 2 by hand: stage 0 averages its rows, sums the replicas' means over dp,
/// scales the sum by `scale` and sends it to stage 1, which returns it as the loss (the spec's
/// mean over all 8 rows).
fn write_dp_pp_loss(dir: &Path, scale: &str) -> shardproof_case::Case {
    let spec = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[8, 2]"):
        l: "f32[]" = torch.ops.aten.mean.default(x)
        return (l,)
"#;
    let first = format!(
        r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[2, 2]"):
        m: "f32[]" = torch.ops.aten.mean.default(x)
        a: "f32[]" = torch.ops._c10d_functional.all_reduce.default(m, 'sum', 'dp')
        w: "f32[]" = torch.ops._c10d_functional.wait_tensor.default(a)
        h: "f32[]" = torch.ops.aten.mul.Tensor(w, {scale})
        s: "f32[]" = torch.ops.shardproof_p2p.send.default(h, 1, 0, 'pp')
        return (s,)
"#
    );
    let second = r#"class GraphModule(torch.nn.Module):
    def forward(self):
        l: "f32[]" = torch.ops.shardproof_p2p.recv.default([], torch.float32, 0, 0, 'pp')
        return (l,)
"#;
    std::fs::write(dir.join("spec.py"), spec).unwrap();
    std::fs::write(dir.join("s0.py"), first).unwrap();
    std::fs::write(dir.join("s1.py"), second).unwrap();
    let graphs = ["s0.py", "s1.py"].repeat(4).join(", ");
    let case = format!(
        "version: 1\nname: dp-pp-loss\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ dp: 4, pp: 2 }}\n  graphs: [{graphs}]\n  groups:\n    \"dp\": dp\n    \"pp\": pp\ninputs:\n  x: {{ placement: {{ dp: Shard(0) }}, at: {{ pp: 0 }} }}\noutputs:\n  l: {{ placement: Replicate(), at: {{ pp: 1 }} }}\n"
    );
    std::fs::write(dir.join("case.yaml"), case).unwrap();
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}

/// A value's class crosses the message with it: the dp sum scaled by `1/4` is a mean (its
/// literal rewritten to `1/2` on two replicas) and proved through the mesh reduction; scaled
/// by `1/2` it is right on two replicas only, and stays an undivided sum after the message, so
/// the proof does not lift (were the received value read as batch-free, the two-replica case
/// would prove it). Refuted on the case as written.
#[test]
fn a_dp_sum_keeps_its_class_across_a_pipeline_message() {
    let dir = tempfile::tempdir().unwrap();
    let right = write_dp_pp_loss(dir.path(), "0.25");
    let m = shardproof_prove::reduce::mesh::reduce_mesh(&right)
        .unwrap()
        .unwrap();
    assert_eq!(m.lifts, Ok(()));
    let proof = prove_case(&right, &ProveConfig::default());
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
    assert_eq!(proof.mesh.as_ref().map(|m| m.reduced), Some(2));

    let dir = tempfile::tempdir().unwrap();
    let wrong = write_dp_pp_loss(dir.path(), "0.5");
    let m = shardproof_prove::reduce::mesh::reduce_mesh(&wrong)
        .unwrap()
        .unwrap();
    let why = m
        .lifts
        .expect_err("an undivided sum over dp reaches the output");
    assert!(why.contains("(c)"), "{why}");
    let proof = prove_case(&wrong, &ProveConfig::default());
    assert_eq!(proof.verdict, Verdict::Refuted, "{:?}", proof.message);
    assert!(proof.counterexample.is_some());
    assert_eq!(proof.ranks, 8);
}
