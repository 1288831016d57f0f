//! A replicated operand beside a shard, element by element: rank `r` pairs its piece
//! (elements `r*L .. (r+1)*L` of the sharded dim) with elements `0 .. L` of the replicated
//! operand, where the single-device program pairs the whole dim with the whole operand. The
//! two agree only where the operand is constant along the dim: absent or of size 1
//! (broadcast), or a fill of one literal value. A replicated table of the piece's size (made or
//! sliced locally, without the rank's offset: the zoo's `cp-rope-no-offset`) is a `shape`
//! finding, never a pass; the sound forms still hold.

use shardproof_check::{check_case, plan::parse_plan, Report, Verdict};
use std::path::Path;

fn check(text: &str) -> Report {
    let case = parse_plan(Path::new("broadcast.plan"), text).unwrap_or_else(|e| panic!("{e}"));
    check_case(&case).unwrap_or_else(|e| panic!("{e}"))
}

/// A plan on tp=2 with the given inputs and body, its output `y` declared `tp=Shard(d)`.
fn plan(inputs: &str, body: &str, out: &str) -> String {
    format!("mesh tp=2\n{inputs}{body}output y tp={out}\n")
}

fn shape_finding(r: &Report) -> bool {
    r.findings
        .iter()
        .any(|f| f.check.name() == "shape-divisibility")
}

/// The lead's example: `a: f32[4, 3] tp=Shard(0)` plus `b: f32[2, 3] tp=Replicate()`. The
/// global program `A[4, 3] + b[2, 3]` does not type-check; every order of the operands and
/// every element-wise form is a shape finding.
#[test]
fn a_replicated_table_of_the_pieces_size_is_a_shape_finding() {
    let inputs = "input a: f32[4, 3] tp=Shard(0)\ninput b: f32[2, 3] tp=Replicate()\n";
    for body in [
        "y = add(a, b)\n",
        "y = add(b, a)\n",
        "y = mul(b, a)\n",
        "y = sub(a, b)\n",
        "y = div(a, b)\n",
        "y = maximum(b, a)\n",
        // In place: the plan's `add_` writes `a`.
        "add_(a, b)\ny = mul(a, 1.0)\n",
        // Ternaries: the table as `self` or as a factor.
        "y = addcmul(b, a, a)\n",
        "y = addcmul(a, b, b)\n",
        "y = lerp(a, b, 0.5)\n",
    ] {
        let r = check(&plan(inputs, body, "Shard(0)"));
        assert_eq!(r.verdict, Verdict::Violated, "{body}: {}", r.render());
        assert!(shape_finding(&r), "{body}: {}", r.render());
    }
}

/// `where` with the table as a value or as the condition, and `masked_fill` with a table mask.
#[test]
fn where_and_masked_fill_with_a_local_table_are_never_a_pass() {
    let inputs = "input a: f32[4, 3] tp=Shard(0)\n\
                  input b: f32[2, 3] tp=Replicate()\n\
                  input m: b8[2, 3] tp=Replicate()\n\
                  input ms: b8[4, 3] tp=Shard(0)\n";
    for body in [
        "y = aten.where.self(ms, a, b)\n",
        "y = aten.where.self(m, a, a)\n",
        "y = masked_fill(a, m, 0.0)\n",
    ] {
        let r = check(&plan(inputs, body, "Shard(0)"));
        assert_ne!(r.verdict, Verdict::Holds, "{body}: {}", r.render());
        assert!(shape_finding(&r), "{body}: {}", r.render());
    }
}

/// Three dims, the shard in the middle: `b[2, 3]` aligns with dims 1 and 2 of `a[2, 4, 3]`.
#[test]
fn a_table_aligned_from_the_right_in_three_dims_is_a_shape_finding() {
    let r = check(&plan(
        "input a: f32[2, 4, 3] tp=Shard(1)\ninput b: f32[2, 3] tp=Replicate()\n",
        "y = add(a, b)\n",
        "Shard(1)",
    ));
    assert_eq!(r.verdict, Verdict::Violated, "{}", r.render());
    assert!(shape_finding(&r), "{}", r.render());
    // The same table sharded like `a` is the sound form.
    let r = check(&plan(
        "input a: f32[2, 4, 3] tp=Shard(1)\ninput b: f32[4, 3] tp=Shard(0)\n",
        "y = add(a, b)\n",
        "Shard(1)",
    ));
    assert_eq!(r.verdict, Verdict::Holds, "{}", r.render());
}

/// The RoPE pattern of `cp-rope-no-offset`: positions `0..s` made on every rank multiply a
/// sequence shard. Made with the rank's offset (`arange` of the rank's range), it is the
/// shard of the global table and holds.
#[test]
fn local_positions_against_a_sequence_shard_are_a_shape_finding() {
    let inputs = "input q: f32[8, 4] tp=Shard(0)\ninput table: f32[8, 4] tp=Replicate()\n";
    let wrong = "pos = slice(table, 0, 0, 4)\ny = mul(q, pos)\n";
    let r = check(&plan(inputs, wrong, "Shard(0)"));
    assert_eq!(r.verdict, Verdict::Violated, "{}", r.render());
    assert!(shape_finding(&r), "{}", r.render());
    let right = "pos = slice(table, 0, tp[0, 4], tp[4, 8])\ny = mul(q, pos)\n";
    let r = check(&plan(inputs, right, "Shard(0)"));
    assert_eq!(r.verdict, Verdict::Holds, "{}", r.render());
}

/// Sound broadcasts still hold: size 1 along the sharded dim, the dim absent, a fill made on
/// each rank (zeros, ones, full) of the piece's shape, a view of a fill.
#[test]
fn broadcasts_and_fills_still_hold() {
    let a = "input a: f32[4, 3] tp=Shard(0)\n";
    for (inputs, body) in [
        ("input b: f32[1, 3] tp=Replicate()\n", "y = add(a, b)\n"),
        ("input b: f32[3] tp=Replicate()\n", "y = mul(b, a)\n"),
        ("input b: f32[4, 1] tp=Shard(0)\n", "y = add(a, b)\n"),
        ("", "z = zeros([2, 3])\ny = add(a, z)\n"),
        ("", "z = ones([2, 3])\ny = mul(z, a)\n"),
        ("", "z = full([2, 3], 2.0)\ny = addcmul(a, z, a)\n"),
        ("", "z = ones([6])\nw = view(z, [2, 3])\ny = sub(w, a)\n"),
        ("", "z = zeros([2, 3])\ny = cat([a, z], 1)\n"),
    ] {
        let r = check(&plan(&format!("{a}{inputs}"), body, "Shard(0)"));
        assert_eq!(r.verdict, Verdict::Holds, "{inputs}{body}: {}", r.render());
    }
}

/// A shard of local size 1 broadcast against a larger replicated operand holds its one element
/// against all of them: no shard is claimed (and no pass with a shard declared).
#[test]
fn a_broadcast_shard_is_never_a_shard() {
    let r = check(&plan(
        "input a: f32[2, 3] tp=Shard(0)\ninput b: f32[2, 3] tp=Replicate()\n",
        "y = add(a, b)\n",
        "Shard(0)",
    ));
    assert_ne!(r.verdict, Verdict::Holds, "{}", r.render());
}

/// `cat`, `stack` and `slice_scatter` pair operands of one shape without broadcasting: a
/// replicated operand beside a shard along another dim is the piece's size there, never the
/// whole dim (a size-1 operand is no broadcast either). A fill is a piece of the whole.
#[test]
fn joins_of_a_shard_and_a_local_table_are_never_a_pass() {
    let inputs = "input a: f32[4, 3] tp=Shard(0)\n\
                  input b: f32[2, 3] tp=Replicate()\n\
                  input c: f32[2, 2] tp=Replicate()\n";
    for (body, out) in [
        ("y = cat([a, b], 1)\n", "Shard(0)"),
        ("y = stack([b, a], 0)\n", "Shard(1)"),
        ("y = stack([a, b], 2)\n", "Shard(0)"),
        ("y = slice_scatter(a, c, 1, 0, 2)\n", "Shard(0)"),
    ] {
        let r = check(&plan(inputs, body, out));
        assert_eq!(r.verdict, Verdict::Violated, "{body}: {}", r.render());
        assert!(shape_finding(&r), "{body}: {}", r.render());
    }
    let r = check(&plan(
        "input a: f32[2, 3] tp=Shard(0)\ninput b: f32[1, 3] tp=Replicate()\n",
        "y = cat([a, b], 1)\n",
        "Shard(0)",
    ));
    assert_ne!(r.verdict, Verdict::Holds, "{}", r.render());
    // A stack of a shard and a fill is the shard, one dim further out.
    let r = check(&plan(
        "input a: f32[4, 3] tp=Shard(0)\n",
        "z = zeros([2, 3])\ny = stack([z, a], 0)\n",
        "Shard(1)",
    ));
    assert_eq!(r.verdict, Verdict::Holds, "{}", r.render());
}

/// A replicated source written along the shard's dim by `slice_scatter` (self sharded on the
/// written dim is handled before), or a sharded source written along its own sharded dim into
/// a replicated tensor: each rank writes its rows at the same local offset, the single-device
/// program once.
#[test]
fn a_source_sharded_along_the_written_dim_is_never_a_shard() {
    let r = check(&plan(
        "input s: f32[4, 3] tp=Shard(0)\n",
        "z = zeros([8, 3])\ny = slice_scatter(z, s, 0, 0, 2)\n",
        "Shard(0)",
    ));
    assert_ne!(r.verdict, Verdict::Holds, "{}", r.render());
}

/// Replicated indices into the sharded dim of `index_put` name local rows, other global rows
/// on every rank; a replicated table of values pairs with the piece in no proven layout.
#[test]
fn index_put_into_a_shard_with_local_rows_is_never_a_pass() {
    let inputs = "input a: f32[4, 3] tp=Shard(0)\n\
                  input i: i64[1] tp=Replicate()\n\
                  input v: f32[3] tp=Replicate()\n\
                  input w: f32[2, 2] tp=Replicate()\n\
                  input j: i64[2] tp=Replicate()\n";
    for body in [
        "y = index_put(a, [i], v)\n",
        "y = index_put(a, [None, j], w)\n",
    ] {
        let r = check(&plan(inputs, body, "Shard(0)"));
        assert_ne!(r.verdict, Verdict::Holds, "{body}: {}", r.render());
    }
}
