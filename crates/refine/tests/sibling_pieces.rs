//! Symmetric ranks once (issue 48, item 6) for pieces whose relations are constant multiples
//! of clean ones: a data-parallel gradient's pieces (each rank's local mean) are such
//! multiples, and a later piece takes the first one's relation, renamed and checked.

use shardproof_refine::{verify, Options, Outcome, Verdict};
use std::path::Path;

/// The spec doubles `g` and takes the softmax backward over it and `p` (rows split over dp=2),
/// then halves it; each rank takes the softmax backward over its rows as they are. The spec's
/// operator is twice the ranks' concatenated (a multiple of a clean relation, as a gradient's
/// is under data parallelism), and its output their concatenation.
fn scaled_case(dir: &Path) -> shardproof_case::Case {
    case_with_second_rank(dir, None)
}

/// [`scaled_case`], with rank 1's program replaced by `second` where given.
fn case_with_second_rank(dir: &Path, second: Option<&str>) -> shardproof_case::Case {
    let spec = "class GraphModule(torch.nn.Module):\n    def forward(self, g: \"f32[4, 6]\", p: \"f32[4, 6]\"):\n        gs: \"f32[4, 6]\" = torch.ops.aten.mul.Tensor(g, 2)\n        y: \"f32[4, 6]\" = torch.ops.aten._softmax_backward_data.default(gs, p, -1, torch.float32)\n        out: \"f32[4, 6]\" = torch.ops.aten.mul.Tensor(y, 0.5)\n        return (out,)\n";
    let rank = "class GraphModule(torch.nn.Module):\n    def forward(self, g: \"f32[2, 6]\", p: \"f32[2, 6]\"):\n        y: \"f32[2, 6]\" = torch.ops.aten._softmax_backward_data.default(g, p, -1, torch.float32)\n        out: \"f32[2, 6]\" = torch.ops.aten.mul.Tensor(y, 1)\n        return (out,)\n";
    std::fs::write(dir.join("spec.py"), spec).unwrap();
    for r in 0..2 {
        let program = if r == 1 { second.unwrap_or(rank) } else { rank };
        std::fs::write(dir.join(format!("r{r}.py")), program).unwrap();
    }
    let yaml = "version: 1\nname: scaled-pieces\nspec:\n  graph: spec.py\nimpl:\n  mesh: { dp: 2 }\n  graphs: [r0.py, r1.py]\ninputs:\n  g: Shard(0)\n  p: Shard(0)\noutputs:\n  out: Shard(0)\n";
    std::fs::write(dir.join("case.yaml"), yaml).unwrap();
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}

/// The report as text: everything but timing and the counters of reuse and the fast path.
fn report_text(o: &Outcome) -> String {
    format!(
        "{:?}",
        (
            o.verdict,
            &o.certificate,
            &o.failure,
            &o.reason,
            &o.trace,
            o.spec_operators
        )
    )
}

/// The softmax backward's e-graph outgrows a node limit of 10 (its first attempts reach 16
/// nodes and more), so it is inferred piece by piece over the dp ranks; the first piece's
/// relation is twice its rank's output (a multiple of a clean expression, not clean), and the
/// second piece takes it, renamed onto the other rank and checked. The report is the one
/// inference of every piece gives. Fails if only clean first pieces are kept for siblings.
#[test]
fn a_sibling_piece_takes_the_first_pieces_multiple_and_reports_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let case = scaled_case(dir.path());
    let run = |reuse: bool| {
        verify(
            &case,
            &Options {
                node_limit: 10,
                jobs: Some(1),
                trace: true,
                reuse,
                ..Options::default()
            },
        )
    };
    let (with, without) = (run(true), run(false));
    assert_eq!(with.verdict, Verdict::Verified);
    // The premise: `y` went piecewise, and its relation (the joined pieces') is a multiple.
    let y = with
        .operator_times
        .iter()
        .find(|t| t.tensor == "y")
        .unwrap();
    assert!(y.attempts.iter().any(|a| a.starts_with("pieces")), "{y:?}");
    let step = with.trace.iter().find(|s| s.tensor == "y").unwrap();
    assert!(step.detail.ends_with("* 2/1)"), "{step:?}");
    assert!(
        with.pieces_reused > 0,
        "no piece took its sibling's relation"
    );
    assert_eq!(without.pieces_reused, 0);
    assert_eq!(report_text(&with), report_text(&without));
}

/// A planted bug in the second dp rank (its softmax backward reads the gradient negated, so
/// its output is the negation of what the spec's `out` needs): `y` goes piecewise, the
/// second piece takes no relation from the first (rank 1's `y` is no image of rank 0's), and
/// the case is not verified, the same with reuse on as off.
#[test]
fn a_sibling_piece_over_a_buggy_rank_takes_no_relation() {
    let dir = tempfile::tempdir().unwrap();
    let buggy = "class GraphModule(torch.nn.Module):\n    def forward(self, g: \"f32[2, 6]\", p: \"f32[2, 6]\"):\n        gn: \"f32[2, 6]\" = torch.ops.aten.neg.default(g)\n        y: \"f32[2, 6]\" = torch.ops.aten._softmax_backward_data.default(gn, p, -1, torch.float32)\n        out: \"f32[2, 6]\" = torch.ops.aten.mul.Tensor(y, 1)\n        return (out,)\n";
    let case = case_with_second_rank(dir.path(), Some(buggy));
    let run = |reuse: bool| {
        verify(
            &case,
            &Options {
                node_limit: 10,
                jobs: Some(1),
                trace: true,
                reuse,
                ..Options::default()
            },
        )
    };
    let (with, without) = (run(true), run(false));
    assert_ne!(with.verdict, Verdict::Verified, "{:?}", with.reason);
    assert_eq!(with.verdict, without.verdict);
    assert_eq!(with.pieces_reused, 0);
    let y = with
        .operator_times
        .iter()
        .find(|t| t.tensor == "y")
        .unwrap();
    assert!(y.attempts.iter().any(|a| a.starts_with("pieces")), "{y:?}");
}
