//! `at:` (an extension of the contract): tensors that live on part of the mesh, as pipeline
//! stages hold their own layers' weights and only the last stage holds the loss.

mod common;

use common::{assert_error, G};
use shardproof_case::{parse_case, rank_pieces, resolve_case, Case, Layout};
use shardproof_ir::{Graph, SourceError};
use std::path::Path;

/// The spec: `y = relu(x @ w0) @ w1`.
fn spec() -> Graph {
    G::new("spec")
        .input("x", &[4, 8])
        .input("w0", &[8, 8])
        .input("w1", &[8, 8])
        .call("h", "mm", &["x", "w0"], &[4, 8])
        .call("r", "relu", &["h"], &[4, 8])
        .call("y", "mm", &["r", "w1"], &[4, 8])
        .outputs(&["y"])
        .build()
}

/// Stage 0 of a pp x tp plan: `x` and its tp shard of `w0` (columns).
fn stage0(rank: usize) -> Graph {
    G::new(&format!("r{rank}"))
        .input("x", &[4, 8])
        .input("w0", &[8, 4])
        .call("h", "mm", &["x", "w0"], &[4, 4])
        .build()
}

/// Stage 1: its tp shard of `w1` (rows) and the result.
fn stage1(rank: usize) -> Graph {
    G::new(&format!("r{rank}"))
        .input("r", &[4, 4])
        .input("w1", &[4, 8])
        .call("y", "mm", &["r", "w1"], &[4, 8])
        .outputs(&["y"])
        .build()
}

const CASE: &str = r#"version: 1
name: two-stages
spec: { graph: spec.py }
impl:
  mesh: { pp: 2, tp: 2 }
  graphs: [r0.py, r1.py, r2.py, r3.py]
inputs:
  x: { placement: Replicate(), at: { pp: 0 } }
  w0: { placement: { tp: Shard(1) }, at: { pp: 0 } }
  w1: { placement: { tp: Shard(0) }, at: { pp: [1] } }
outputs:
  y: { placement: { tp: Partial() }, at: { pp: 1 } }
"#;

fn resolve(text: &str) -> Result<Case, SourceError> {
    let file = parse_case(text, Path::new("case.yaml"))?;
    resolve_case(
        file,
        spec(),
        vec![stage0(0), stage0(1), stage1(2), stage1(3)],
    )
}

/// `CASE` with line `line` (1-based) replaced.
fn with_line(line: usize, new: &str) -> String {
    let mut lines: Vec<&str> = CASE.lines().collect();
    lines[line - 1] = new;
    lines.join("\n") + "\n"
}

#[test]
fn tensors_live_on_the_stages_at_names() {
    let case = resolve(CASE).unwrap_or_else(|e| panic!("{e}"));
    let w0 = case.input("w0").unwrap();
    // Only the holders have values; the rank-indexed form stays empty for older engines.
    assert_eq!(
        w0.rank_values.iter().map(|(r, _)| *r).collect::<Vec<_>>(),
        vec![0, 1]
    );
    assert!(w0.impl_values.is_empty());
    let y = &case.outputs[0];
    assert_eq!(
        y.rank_values.iter().map(|(r, _)| *r).collect::<Vec<_>>(),
        vec![2, 3]
    );
    assert_eq!(y.layout.to_string(), "[Replicate(), Partial()] at pp = 1");
    // Pieces: rank 3 holds rows 4..8 of w1; rank 0 holds none of it.
    let Layout::Placed(l) = &case.input("w1").unwrap().layout else {
        panic!("placed")
    };
    let mesh = &case.program.mesh;
    assert!(l.holds(mesh, 2) && !l.holds(mesh, 1));
    let p = rank_pieces(&case.input("w1").unwrap().layout, &[8, 8], mesh, 3).unwrap();
    assert_eq!(p.blocks, vec![vec![4..8, 0..8]]);
    let e = rank_pieces(&case.input("w1").unwrap().layout, &[8, 8], mesh, 0).unwrap_err();
    assert!(e.message.contains("rank 0 holds no piece"), "{e}");
    // Partial shares combine within the stage that holds the output.
    let share = rank_pieces(&y.layout, &[4, 8], mesh, 3)
        .unwrap()
        .partial
        .unwrap();
    assert_eq!((share.index, share.group), (1, vec![2, 3]));
    // Without `at`, every rank holds a tensor: both forms list them all.
    let x = case.input("x").unwrap();
    assert_eq!(x.rank_values.len(), 2);
}

#[test]
fn every_holder_needs_the_tensor_but_no_other_rank_does() {
    // The stage-1 ranks lack `w0`, which is fine; but a holder without the tensor is an error
    // naming the rank and where the layout puts it.
    let text = with_line(10, "  w1: { placement: { tp: Shard(0) }, at: { pp: 0 } }");
    let e = assert_error(
        resolve(&text),
        10,
        3,
        "`w1` is not a value of the graph of rank 0",
    );
    assert!(e.hint.unwrap().contains("pp = 0"));
}

#[test]
fn at_errors_point_at_the_offending_key_or_value() {
    // Line 10 as written, the column of the error, and a part of its message.
    let cases = [
        (
            "  w1: { placement: { tp: Shard(0) }, at: { ppp: 1 } }",
            44,
            "unknown mesh dim `ppp` in the `at` of `w1` — did you mean `pp`?",
        ),
        (
            "  w1: { placement: { tp: Shard(0) }, at: { pp: 2 } }",
            48,
            "`w1` is held at pp = 2, but mesh dim `pp` has size 2",
        ),
        (
            "  w1: { placement: { pp: Shard(0) }, at: { pp: 1 } }",
            44,
            "placed Shard(0) over mesh dim `pp` and restricted",
        ),
        (
            "  w1: { placement: Replicate(), at: { pp: [] } }",
            43,
            "`at` lists no coordinate of `pp`",
        ),
        (
            "  w1: { placement: Replicate(), at: { pp: -1 } }",
            43,
            "a mesh coordinate must be at least 0",
        ),
        (
            "  w1: { placement: Replicate(), at: pp }",
            37,
            "`at` must be a mapping",
        ),
        (
            "  w1: { placement: Replicate(), at: {} }",
            37,
            "`at` names no mesh dim",
        ),
        (
            "  w1: { expr: \"r2.w1\", at: { pp: 1 } }",
            24,
            "`at` cannot be combined with `expr`",
        ),
    ];
    for (line, col, needle) in cases {
        assert_error(resolve(&with_line(10, line)), 10, col, needle);
    }
    // A placement that does not fit is checked on the holders only, and says so.
    let text = with_line(10, "  w1: { placement: { tp: Shard(1) }, at: { pp: 1 } }");
    let e = assert_error(resolve(&text), 10, 7, "does not fit");
    assert!(e.message.contains("ranks 2-3 have f32[4, 8]"), "{e}");
}

#[test]
fn at_is_reserved_as_a_mesh_dim_name() {
    let text = CASE.replace("mesh: { pp: 2, tp: 2 }", "mesh: { at: 2, tp: 2 }");
    let e = resolve(&text).unwrap_err();
    assert!(e.message.contains("`at`"), "{e}");
}
