//! The fast path's rules for views of concatenations (the ranks view their pieces with their
//! own shape literals) and for linear operators over partial sums, against the interpreter on
//! random inputs and against the e-graph (the audit); and the preconditions of each, every one
//! a case where the rule would be false or written otherwise, which must be declined.

use super::fastpath::{form_of, Form};
use super::tests::impl_of;
use super::tests_fastpath::{fast_z, holds, write_case, Plan};
use super::{verify, Options, Verdict};
use shardproof_case::Case;
use std::path::Path;

/// Audits `case` (every operator by the e-graph, the fast path's relation compared) and
/// asserts no difference, `fast` operators decided alike, and the verdict `verdict`.
#[track_caller]
fn audited(case: &Case, fast: usize, verdict: Verdict, what: &str) {
    let audit = verify(
        case,
        &Options {
            audit_fast_path: true,
            ..Options::default()
        },
    );
    assert!(
        audit.fast_path_differences.is_empty(),
        "{what}: {:#?}",
        audit.fast_path_differences
    );
    assert_eq!(audit.operators_fast, fast, "{what}");
    assert_eq!(audit.verdict, verdict, "{what}");
    let on = verify(case, &Options::default());
    assert_eq!(on.verdict, verdict, "{what}");
}

/// Views of a concatenation: (spec call, layout, spec shapes `X | Y | Z`, rank call with the
/// rank's own shape literal, rank shapes, the dim the output concatenates along).
const VIEWS_OF_SHARDS: &[(&str, &str, &str, &str, &str, i64)] = &[
    (
        "aten.view.default(x, [2, 2, 6])",
        "Shard(0)",
        "4, 6 | 4, 6 | 2, 2, 6",
        "aten.view.default(x, [1, 2, 6])",
        "2, 6 | 2, 6 | 1, 2, 6",
        0,
    ),
    (
        "aten.view.default(x, [24])",
        "Shard(0)",
        "4, 6 | 4, 6 | 24",
        "aten.view.default(x, [12])",
        "2, 6 | 2, 6 | 12",
        0,
    ),
    (
        "aten._unsafe_view.default(x, [2, 12])",
        "Shard(1)",
        "2, 4, 3 | 2, 4, 3 | 2, 12",
        "aten._unsafe_view.default(x, [2, 6])",
        "2, 2, 3 | 2, 2, 3 | 2, 6",
        1,
    ),
    (
        "aten.reshape.default(x, [4, 2, 3])",
        "Shard(1)",
        "4, 6 | 4, 6 | 4, 2, 3",
        "aten.reshape.default(x, [4, 1, 3])",
        "4, 3 | 4, 3 | 4, 1, 3",
        1,
    ),
    (
        "aten.view.default(x, [3, 8])",
        "Shard(1)",
        "3, 2, 4 | 3, 2, 4 | 3, 8",
        "aten.view.default(x, [3, 4])",
        "3, 1, 4 | 3, 1, 4 | 3, 4",
        1,
    ),
];

/// A view of a concatenation whose dims before the split one flatten alike and whose pieces
/// fill whole rows of the target: the concatenation of the ranks' views (each to its own
/// shape) along the dim the split dim starts, beside the spec's view of the input's
/// concatenation; on random inputs, and the audit finds the e-graph's relation written alike.
#[test]
fn a_view_of_shards_concatenates_the_ranks_views() {
    for &(call, layout, spec_shapes, rank_call, rank_shapes, out_dim) in VIEWS_OF_SHARDS {
        let dir = tempfile::tempdir().unwrap();
        let out = format!("Shard({out_dim})");
        let case = write_case(
            dir.path(),
            &Plan {
                mesh: "{ tp: 2 }",
                ranks: 2,
                layout: [layout, layout, &out],
                spec: (spec_shapes, call),
                rank: (rank_shapes, rank_call),
            },
        );
        let rel = fast_z(&case).unwrap_or_else(|| panic!("{call}: declined"));
        let text = rel.exprs[0].to_string();
        assert!(
            text.starts_with(&format!("(cat {out_dim} ")),
            "{call}: {text}"
        );
        assert_eq!(rel.exprs.len(), 2, "{call}: {:?}", rel.exprs);
        for seed in [0.11, 0.23, 0.59] {
            holds(&case, &rel, seed).unwrap_or_else(|e| panic!("{call}: {e}"));
        }
        audited(&case, 1, Verdict::Verified, call);
    }
}

/// The same over four ranks (a data-parallel batch flattened into rows).
#[test]
fn a_view_of_four_shards_concatenates_the_ranks_views() {
    let dir = tempfile::tempdir().unwrap();
    let call = "aten.view.default(x, [2, 4, 3])";
    let case = write_case(
        dir.path(),
        &Plan {
            mesh: "{ dp: 4 }",
            ranks: 4,
            layout: ["Shard(0)", "Shard(0)", "Shard(1)"],
            spec: ("8, 3 | 8, 3 | 2, 4, 3", call),
            rank: ("2, 3 | 2, 3 | 2, 1, 3", "aten.view.default(x, [2, 1, 3])"),
        },
    );
    // [8, 3] in four pieces of 2 rows viewed as [2, 4, 3]: each piece is 6 elements, not whole
    // rows of dim 0 (12 elements): the pieces interleave in dim 1, declined.
    assert!(fast_z(&case).is_none());
    let call = "aten.view.default(x, [4, 2, 3])";
    let dir = tempfile::tempdir().unwrap();
    let case = write_case(
        dir.path(),
        &Plan {
            mesh: "{ dp: 4 }",
            ranks: 4,
            layout: ["Shard(0)", "Shard(0)", "Shard(0)"],
            spec: ("8, 3 | 8, 3 | 4, 2, 3", call),
            rank: ("2, 3 | 2, 3 | 1, 2, 3", "aten.view.default(x, [1, 2, 3])"),
        },
    );
    let rel = fast_z(&case).expect("declined");
    for seed in [0.11, 0.23, 0.59] {
        holds(&case, &rel, seed).unwrap();
    }
    audited(&case, 1, Verdict::Verified, call);
}

/// Precondition: the ranks' views are to the piece's rows of the target. Where the pieces
/// interleave in the target (a dim of more than one element flattens before the split dim:
/// the ranks' heads merged into the batch), the concatenation of the ranks' views is not the
/// spec's view, and the e-graph writes only the view of the concatenation: declined.
#[test]
fn a_view_where_the_pieces_interleave_is_declined() {
    let dir = tempfile::tempdir().unwrap();
    let case = write_case(
        dir.path(),
        &Plan {
            mesh: "{ tp: 2 }",
            ranks: 2,
            layout: ["Shard(1)", "Shard(1)", "Shard(0)"],
            spec: ("2, 4, 3 | 2, 4, 3 | 8, 3", "aten.view.default(x, [8, 3])"),
            rank: ("2, 2, 3 | 2, 2, 3 | 4, 3", "aten.view.default(x, [4, 3])"),
        },
    );
    assert!(fast_z(&case).is_none());
}

/// Precondition: the ranks' view is to the piece's own shape as the rule computes it. A rank
/// view to another shape of the same size (the pieces' rows regrouped otherwise) is no piece
/// of the spec's view: declined.
#[test]
fn a_view_to_another_piece_shape_is_declined() {
    let dir = tempfile::tempdir().unwrap();
    let case = write_case(
        dir.path(),
        &Plan {
            mesh: "{ tp: 2 }",
            ranks: 2,
            layout: ["Shard(0)", "Shard(0)", "Shard(1)"],
            spec: ("4, 6 | 4, 6 | 2, 2, 6", "aten.view.default(x, [2, 2, 6])"),
            rank: ("2, 6 | 2, 6 | 2, 1, 6", "aten.view.default(x, [2, 1, 6])"),
        },
    );
    assert!(fast_z(&case).is_none());
}

/// Preconditions (the e-graph's form): no collective reads the ranks' views, and no rank
/// views them back to the input's shape or slices the input's pieces. The e-graph relates such
/// a consumer too (the gathered view is the spec's view; a view back is the piece itself; the
/// slices move through the view): declined.
#[test]
fn a_view_of_shards_a_rank_gathers_views_back_or_slices_is_left_to_the_e_graph() {
    let spec = "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[4, 6]\", y: \"f32[4, 6]\"):\n        z: \"f32[24]\" = torch.ops.aten.view.default(x, [24])\n        out: \"f32[24]\" = torch.ops.aten.tanh.default(z)\n        return (out,)\n";
    let head = "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[2, 6]\", y: \"f32[2, 6]\"):\n        z: \"f32[12]\" = torch.ops.aten.view.default(x, [12])\n";
    let tail = "        out: \"f32[12]\" = torch.ops.aten.tanh.default(z)\n        return (out,)\n";
    for (what, extra, out) in [
        (
            "gathered",
            "        all_gather_into_tensor: \"f32[24]\" = torch.ops._c10d_functional.all_gather_into_tensor.default(z, 2, '0')\n        wait_tensor: \"f32[24]\" = torch.ops._c10d_functional.wait_tensor.default(all_gather_into_tensor)\n        out: \"f32[24]\" = torch.ops.aten.tanh.default(wait_tensor)\n        return (out,)\n",
            "Replicate()",
        ),
        (
            "viewed back",
            "        back: \"f32[2, 6]\" = torch.ops.aten.view.default(z, [2, 6])\n        again: \"f32[12]\" = torch.ops.aten.view.default(back, [12])\n        out: \"f32[12]\" = torch.ops.aten.tanh.default(again)\n        return (out,)\n",
            "Shard(0)",
        ),
        (
            "sliced",
            "        half: \"f32[1, 6]\" = torch.ops.aten.slice.Tensor(x, 0, 0, 1)\n        out: \"f32[12]\" = torch.ops.aten.tanh.default(z)\n        return (out,)\n",
            "Shard(0)",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("spec.py"), spec).unwrap();
        for r in 0..2 {
            std::fs::write(dir.path().join(format!("r{r}.py")), format!("{head}{tail}")).unwrap();
        }
        let yaml = |out: &str| format!("version: 1\nname: views\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ tp: 2 }}\n  graphs: [r0.py, r1.py]\ninputs:\n  x: Shard(0)\n  y: Shard(0)\noutputs:\n  out: {out}\n");
        std::fs::write(dir.path().join("case.yaml"), yaml("Shard(0)")).unwrap();
        let plain = shardproof_case::load_case(&dir.path().join("case.yaml")).unwrap();
        assert!(fast_z(&plain).is_some(), "{what}");
        for r in 0..2 {
            std::fs::write(dir.path().join(format!("r{r}.py")), format!("{head}{extra}")).unwrap();
        }
        std::fs::write(dir.path().join("case.yaml"), yaml(out)).unwrap();
        let case = shardproof_case::load_case(&dir.path().join("case.yaml")).unwrap();
        assert!(fast_z(&case).is_none(), "{what}");
    }
}

/// A case whose spec computes `z = CALL` over `x`, `y` (both `Partial()`, each rank holding a
/// summand), then `w = 1.5 z` and `out = tanh(w)`; each rank computes its `z` and `w` alike
/// and all-reduces `w` before the `tanh`. Shapes `X | Y | Z`.
fn partial_case(dir: &Path, mesh: &str, ranks: usize, shapes: &str, call: &str) -> Case {
    let parts: Vec<&str> = shapes.split(" | ").collect();
    let (x, y, z) = (parts[0], parts[1], parts[2]);
    let head = format!(
        "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[{x}]\", y: \"f32[{y}]\"):\n        z: \"f32[{z}]\" = torch.ops.{call}\n        w: \"f32[{z}]\" = torch.ops.aten.mul.Scalar(z, 1.5)\n"
    );
    let spec = format!(
        "{head}        out: \"f32[{z}]\" = torch.ops.aten.tanh.default(w)\n        return (out,)\n"
    );
    let rank = format!(
        "{head}        all_reduce: \"f32[{z}]\" = torch.ops._c10d_functional.all_reduce.default(w, 'sum', '0')\n        wait_tensor: \"f32[{z}]\" = torch.ops._c10d_functional.wait_tensor.default(all_reduce)\n        out: \"f32[{z}]\" = torch.ops.aten.tanh.default(wait_tensor)\n        return (out,)\n"
    );
    std::fs::write(dir.join("spec.py"), spec).unwrap();
    let mut graphs = Vec::new();
    for r in 0..ranks {
        std::fs::write(dir.join(format!("r{r}.py")), &rank).unwrap();
        graphs.push(format!("r{r}.py"));
    }
    let yaml = format!(
        "version: 1\nname: partial\nspec:\n  graph: spec.py\nimpl:\n  mesh: {mesh}\n  graphs: [{}]\ninputs:\n  x: Partial()\n  y: Partial()\noutputs:\n  out: Replicate()\n",
        graphs.join(", ")
    );
    std::fs::write(dir.join("case.yaml"), yaml).unwrap();
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}

/// Linear calls over partial sums: (call, shapes `X | Y | Z`).
const LINEAR_CALLS: &[(&str, &str)] = &[
    ("aten.sub.Tensor(x, y)", "4, 6 | 4, 6 | 4, 6"),
    ("aten.add.Tensor(x, y, alpha = 2)", "4, 6 | 4, 6 | 4, 6"),
    ("aten.add.Tensor(x, y)", "4, 6 | 6 | 4, 6"),
    ("aten.mul.Scalar(x, 3.0)", "4, 6 | 4, 6 | 4, 6"),
    ("aten.div.Scalar(x, 4.0)", "4, 6 | 4, 6 | 4, 6"),
    ("aten.neg.default(x)", "4, 6 | 4, 6 | 4, 6"),
    ("aten.view.default(x, [24])", "4, 6 | 4, 6 | 24"),
    ("aten.t.default(x)", "4, 6 | 4, 6 | 6, 4"),
    ("aten.transpose.int(x, 0, 1)", "4, 6 | 4, 6 | 6, 4"),
    (
        "aten.permute.default(x, [1, 2, 0])",
        "2, 3, 4 | 2, 3, 4 | 3, 4, 2",
    ),
];

/// Add, subtract, scale, view, transpose and permute of partial sums: the sum of the ranks'
/// results (beside, for a layout call, the call over the input's sum), on random inputs over
/// two and four ranks; and the audit finds the e-graph's relation written alike, and the plan
/// verifies.
#[test]
fn a_linear_call_over_partial_sums_is_the_sum_of_the_ranks_calls() {
    for (mesh, ranks) in [("{ tp: 2 }", 2), ("{ dp: 4 }", 4)] {
        for &(call, shapes) in LINEAR_CALLS {
            let dir = tempfile::tempdir().unwrap();
            let case = partial_case(dir.path(), mesh, ranks, shapes, call);
            let rel = fast_z(&case).unwrap_or_else(|| panic!("{call} on {mesh}: declined"));
            assert!(
                rel.exprs[0].to_string().starts_with("(sum "),
                "{call}: {:?}",
                rel.exprs
            );
            for seed in [0.11, 0.23, 0.59] {
                holds(&case, &rel, seed).unwrap_or_else(|e| panic!("{call} on {mesh}: {e}"));
            }
            if ranks == 2 {
                audited(&case, 1, Verdict::Verified, call);
            }
        }
    }
}

/// Precondition: the operator is linear (`LINEAR_OVER_SUMS`). A nonlinear call on each
/// summand, or a product of two partial sums, is no summand of the spec's result: declined.
#[test]
fn a_nonlinear_call_over_partial_sums_is_declined() {
    for (call, shapes) in [
        ("aten.relu.default(x)", "4, 6 | 4, 6 | 4, 6"),
        ("aten.mul.Tensor(x, y)", "4, 6 | 4, 6 | 4, 6"),
        ("aten.exp.default(x)", "4, 6 | 4, 6 | 4, 6"),
        ("aten.add.Scalar(x, 1.0)", "4, 6 | 4, 6 | 4, 6"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let case = partial_case(dir.path(), "{ tp: 2 }", 2, shapes, call);
        assert!(fast_z(&case).is_none(), "{call}");
    }
}

/// Precondition (the e-graph's form): an `add` of alpha 1 over summands of one shape is
/// declined. The e-graph also writes the sum with each rank's addition split into its two
/// terms (`add-into-sum`: one form per combination), which the rule does not write; the audit
/// agrees. With another alpha, or a broadcast operand, the rule applies (above).
#[test]
fn an_add_of_partial_sums_the_e_graph_flattens_is_left_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let case = partial_case(
        dir.path(),
        "{ tp: 2 }",
        2,
        "4, 6 | 4, 6 | 4, 6",
        "aten.add.Tensor(x, y)",
    );
    assert!(fast_z(&case).is_none());
    audited(&case, 0, Verdict::Verified, "add");
}

/// Precondition: every operand of an additive call is a partial sum. A partial sum plus a
/// replica is not the sum of the ranks' sums (each rank would add the replica once): declined.
#[test]
fn a_partial_sum_plus_a_replica_is_declined() {
    let dir = tempfile::tempdir().unwrap();
    let case = partial_case(
        dir.path(),
        "{ tp: 2 }",
        2,
        "4, 6 | 4, 6 | 4, 6",
        "aten.sub.Tensor(x, y)",
    );
    let text = std::fs::read_to_string(dir.path().join("case.yaml")).unwrap();
    std::fs::write(
        dir.path().join("case.yaml"),
        text.replace("y: Partial()", "y: Replicate()"),
    )
    .unwrap();
    let case2 = shardproof_case::load_case(&dir.path().join("case.yaml")).unwrap();
    assert!(fast_z(&case).is_some());
    assert!(fast_z(&case2).is_none());
}

/// Precondition of a partial sum's form: one expression. Equal sums need not have equal
/// summands (`x0 + x1 = y0 + y1` says nothing of `x0` and `y0`), so a second sum is not merged
/// piece by piece, unlike a concatenation's alternatives.
#[test]
fn two_sums_are_not_merged_piece_by_piece() {
    let dir = tempfile::tempdir().unwrap();
    let case = partial_case(
        dir.path(),
        "{ tp: 2 }",
        2,
        "4, 6 | 4, 6 | 4, 6",
        "aten.add.Tensor(x, y)",
    );
    let imp = impl_of(&case);
    let e = |s: &str| -> egg::RecExpr<crate::term::Term> { s.parse().unwrap() };
    let rel = |exprs: Vec<egg::RecExpr<crate::term::Term>>| super::relation::Rel::of(exprs, true);
    let one = rel(vec![e("(sum %r0:x %r1:x)")]);
    assert!(matches!(form_of(&imp, &one), Some(Form::Summed { .. })));
    let two = rel(vec![e("(sum %r0:x %r1:x)"), e("(sum %r0:y %r1:y)")]);
    assert_eq!(form_of(&imp, &two), None);
}

/// Preconditions (the e-graph's form): no collective reads the summands the rule names, and
/// no call combines two of them. Where the ranks all-reduce the sum itself, the all-reduced
/// tensors are the spec's value and the e-graph's relation names them too: declined (this
/// case fails only when both guards are removed: the all-reduce does both).
#[test]
fn a_partial_sum_a_collective_reads_is_left_to_the_e_graph() {
    let dir = tempfile::tempdir().unwrap();
    let spec = "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[4, 6]\", y: \"f32[4, 6]\"):\n        z: \"f32[4, 6]\" = torch.ops.aten.sub.Tensor(x, y)\n        out: \"f32[4, 6]\" = torch.ops.aten.tanh.default(z)\n        return (out,)\n";
    let rank = "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[4, 6]\", y: \"f32[4, 6]\"):\n        z: \"f32[4, 6]\" = torch.ops.aten.sub.Tensor(x, y)\n        all_reduce: \"f32[4, 6]\" = torch.ops._c10d_functional.all_reduce.default(z, 'sum', '0')\n        wait_tensor: \"f32[4, 6]\" = torch.ops._c10d_functional.wait_tensor.default(all_reduce)\n        out: \"f32[4, 6]\" = torch.ops.aten.tanh.default(wait_tensor)\n        return (out,)\n";
    std::fs::write(dir.path().join("spec.py"), spec).unwrap();
    for r in 0..2 {
        std::fs::write(dir.path().join(format!("r{r}.py")), rank).unwrap();
    }
    let yaml = "version: 1\nname: reduced\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r1.py]\ninputs:\n  x: Partial()\n  y: Partial()\noutputs:\n  out: Replicate()\n";
    std::fs::write(dir.path().join("case.yaml"), yaml).unwrap();
    let case = shardproof_case::load_case(&dir.path().join("case.yaml")).unwrap();
    assert!(fast_z(&case).is_none());
    audited(&case, 0, Verdict::Verified, "all-reduced partial sum");
}

/// Precondition (the e-graph's form): no rank concatenates or slices the summands the rule
/// names. The e-graph brings such a consumer in and relates it too: declined.
#[test]
fn a_partial_sum_a_rank_concatenates_is_left_to_the_e_graph() {
    let dir = tempfile::tempdir().unwrap();
    let case = partial_case(
        dir.path(),
        "{ tp: 2 }",
        2,
        "4, 6 | 4, 6 | 4, 6",
        "aten.sub.Tensor(x, y)",
    );
    assert!(fast_z(&case).is_some());
    let rank = std::fs::read_to_string(dir.path().join("r0.py"))
        .unwrap()
        .replace(
            "        w: ",
            "        both: \"f32[8, 6]\" = torch.ops.aten.cat.default([z, x])\n        w: ",
        );
    for r in 0..2 {
        std::fs::write(dir.path().join(format!("r{r}.py")), &rank).unwrap();
    }
    let case = shardproof_case::load_case(&dir.path().join("case.yaml")).unwrap();
    assert!(fast_z(&case).is_none());
}
