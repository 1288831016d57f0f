//! Selections and extremes of wrapped narrow integers: `argmax`/`argmin`, `max`/`min` along a
//! dim, of all elements and of two tensors, `topk`, `clamp`'s tensor bounds, and a `uint8`
//! read into an `int64` by promotion. Each reads the wrapped value on the ranks (`uint8`
//! 255 + 1 is 0) and must not be proved from the exact one; the same program whose values
//! provably fit the type stays proved.
//!
//! The fixtures: a `tp = 2` mesh whose two ranks run one graph on replicated inputs, a table
//! `w: f32[rows, 2]` and `tokens: i64[2]`. The lookup `bound = embedding(w, tokens)` bounds the
//! tokens by the rows (256 rows: every token fits `uint8`, and `narrow + 1` may wrap; 255
//! rows: `narrow + 1` fits).

#[path = "common/tokens.rs"]
mod tokens;
use shardproof_interp::RunConfig;
use shardproof_ir::DType;
use shardproof_ops::{Meta, Tensor};
use shardproof_prove::{prove_case, Verdict};
use std::collections::BTreeMap;
use std::path::Path;
use tokens::{assert_none_proved, full_size, report, run_both, D};

/// The rows where a token's `uint8` shift by one may wrap (token 255).
const WRAPS: usize = 256;
/// The rows where it cannot (tokens up to 254).
const FITS: usize = 255;

/// A `tp = 2` case from the spec's and the rank's bodies (after `forward`'s signature), each
/// after the lookup `bound = embedding(w, tokens)` that bounds the tokens by the rows.
fn write_case(dir: &Path, rows: usize, spec_body: &str, rank_body: &str) -> shardproof_case::Case {
    let bound = "        bound: \"f32[2, 2]\" = torch.ops.aten.embedding.default(w, tokens)\n";
    tokens::write_case(
        dir,
        rows,
        &format!("{bound}{spec_body}"),
        &format!("{bound}{rank_body}"),
    )
}

/// `body` is the selection's lines on `up` (the tokens plus one: `uint8` on the ranks,
/// `int64` in the spec) ending in `look`, a float of its result; the output adds it to the bound lookup.
/// With `WRAPS` rows the ranks' `up` wraps at token 255: checked against the interpreter,
/// then not proved. With `FITS` rows it fits and the case is proved.
fn check_selection(body: &str, wrong_tokens: &[f64]) {
    let tail = "        out: \"f32[2, 2]\" = torch.ops.aten.add.Tensor(look, bound)\n        return (out,)\n";
    let spec = format!("        up: \"i64[2]\" = torch.ops.aten.add.Tensor(tokens, 1)\n        narrow: \"i64[2]\" = torch.ops.aten.alias.default(tokens)\n{body}{tail}");
    let rank = format!("        narrow: \"u8[2]\" = torch.ops.aten._to_copy.default(tokens, dtype = torch.uint8)\n        up: \"u8[2]\" = torch.ops.aten.add.Tensor(narrow, 1)\n{body}{tail}")
        .replace("MIDTYPE", "u8");
    let spec = spec.replace("MIDTYPE", "i64");
    let dir = tempfile::tempdir().unwrap();
    let case = write_case(dir.path(), WRAPS, &spec, &rank);
    let (spec_out, rank_out) = run_both(&case, WRAPS, wrong_tokens);
    assert_ne!(
        Ok(spec_out),
        rank_out,
        "token 255 + 1 wraps to 0 on the ranks"
    );
    assert_none_proved(&case);
    let dir = tempfile::tempdir().unwrap();
    let case = write_case(dir.path(), FITS, &spec, &rank);
    let proof = prove_case(&case, &full_size());
    assert_eq!(proof.verdict, Verdict::Proved, "{}", report(&proof));
}

/// `argmax(up)` / `argmin(up)`: tokens (255, 1) are `up` (0, 2) on the ranks,
/// (256, 2) in the spec; the positions differ.
#[test]
fn the_position_of_a_wrapped_extreme_is_not_proved() {
    for op in ["argmax", "argmin"] {
        let body = format!("        at: \"i64[1]\" = torch.ops.aten.{op}.default(up, 0, True)\n        look: \"f32[1]\" = torch.ops.aten._to_copy.default(at, dtype = torch.float32)\n");
        check_selection(&body, &[255.0, 1.0]);
    }
}

/// `max.dim` / `min.dim` of `up`: the indices output.
#[test]
fn the_indices_of_a_wrapped_max_along_a_dim_are_not_proved() {
    for op in ["max", "min"] {
        let body = format!("        m = torch.ops.aten.{op}.dim(up, 0, True)\n        at: \"i64[1]\" = m[1]\n        look: \"f32[1]\" = torch.ops.aten._to_copy.default(at, dtype = torch.float32)\n");
        check_selection(&body, &[255.0, 1.0]);
    }
}

/// `topk(up, 1)`, largest and smallest: the index output.
#[test]
fn the_indices_of_a_wrapped_topk_are_not_proved() {
    for largest in ["True", "False"] {
        let body = format!("        k = torch.ops.aten.topk.default(up, 1, 0, {largest})\n        at: \"i64[1]\" = k[1]\n        look: \"f32[1]\" = torch.ops.aten._to_copy.default(at, dtype = torch.float32)\n");
        check_selection(&body, &[255.0, 1.0]);
    }
}

/// `min.other(up, narrow)` is the token exactly (`min(t + 1, t)`) and 0 on the ranks at
/// token 255 (`min(0, 255)`); widened to `int64`. Its interval `[0, 255]` fits
/// `uint8`, so the cast alone does not see the wrap.
#[test]
fn the_min_of_two_wrapped_tensors_is_not_proved() {
    let body = "        lo: \"MIDTYPE[2]\" = torch.ops.aten.min.other(up, narrow)\n        at: \"i64[2]\" = torch.ops.aten._to_copy.default(lo, dtype = torch.int64)\n        look: \"f32[2]\" = torch.ops.aten._to_copy.default(at, dtype = torch.float32)\n";
    check_selection(body, &[255.0, 1.0]);
}

/// `min.default` of `cat(up, narrow)`: exactly the least token (tokens (255, 1): 1), 0 on
/// the ranks (255 + 1 wrapped).
#[test]
fn the_min_of_all_wrapped_elements_is_not_proved() {
    let body = "        both: \"MIDTYPE[4]\" = torch.ops.aten.cat.default([up, narrow])\n        lo: \"MIDTYPE[]\" = torch.ops.aten.min.default(both)\n        at: \"i64[]\" = torch.ops.aten._to_copy.default(lo, dtype = torch.int64)\n        look: \"f32[]\" = torch.ops.aten._to_copy.default(at, dtype = torch.float32)\n";
    check_selection(body, &[255.0, 1.0]);
}

/// `clamp(narrow, max = up)`: exactly the token (`min(t, t + 1)`), 0 on the ranks at token
/// 255.
#[test]
fn a_clamp_to_a_wrapped_bound_is_not_proved() {
    let body = "        c: \"MIDTYPE[2]\" = torch.ops.aten.clamp.Tensor(narrow, None, up)\n        at: \"i64[2]\" = torch.ops.aten._to_copy.default(c, dtype = torch.int64)\n        look: \"f32[2]\" = torch.ops.aten._to_copy.default(at, dtype = torch.float32)\n";
    check_selection(body, &[255.0, 1.0]);
}

/// `up + zeros` with `zeros` an `int64`: torch promotes the sum to `int64`, so the wrapped
/// `uint8` is read as a value with no cast in the graph (255 + 1 is row 0 on the ranks).
#[test]
fn a_wrapped_uint8_promoted_by_an_add_is_not_proved() {
    let body = "        z: \"i64[2]\" = torch.ops.aten.mul.Tensor(tokens, 0)\n        at: \"i64[2]\" = torch.ops.aten.add.Tensor(up, z)\n        look: \"f32[2]\" = torch.ops.aten._to_copy.default(at, dtype = torch.float32)\n";
    check_selection(body, &[255.0, 1.0]);
}

/// A `tp = 2` case whose ranks each hold one token (`tokens` sharded on dim 0) and meet in an
/// `all_reduce` of `reduce_op` over a `uint8` value: rank 0's token plus one (it wraps at 255),
/// rank 1's token as it is. Output: the lookups' sum across the ranks plus the reduced value.
fn write_reduce_case(dir: &Path, rows: usize, reduce_op: &str) -> shardproof_case::Case {
    let spec_op = if reduce_op == "min" {
        "minimum"
    } else {
        "maximum"
    };
    let spec = format!("class GraphModule(torch.nn.Module):\n    def forward(self, w: \"f32[{rows}, {D}]\", tokens: \"i64[2]\"):\n        bound: \"f32[2, 2]\" = torch.ops.aten.embedding.default(w, tokens)\n        bs: \"f32[1, 2]\" = torch.ops.aten.sum.dim_IntList(bound, [0], True)\n        t0: \"i64[1]\" = torch.ops.aten.slice.Tensor(tokens, 0, 0, 1)\n        t1: \"i64[1]\" = torch.ops.aten.slice.Tensor(tokens, 0, 1, 2)\n        a: \"i64[1]\" = torch.ops.aten.add.Tensor(t0, 1)\n        m: \"i64[1]\" = torch.ops.aten.{spec_op}.default(a, t1)\n        mf: \"f32[1]\" = torch.ops.aten._to_copy.default(m, dtype = torch.float32)\n        out: \"f32[1, 2]\" = torch.ops.aten.add.Tensor(bs, mf)\n        return (out,)\n");
    let rank = |value: &str| {
        format!("class GraphModule(torch.nn.Module):\n    def forward(self, w: \"f32[{rows}, {D}]\", tokens: \"i64[1]\"):\n        bound: \"f32[1, 2]\" = torch.ops.aten.embedding.default(w, tokens)\n        bsr: \"f32[1, 2]\" = torch.ops._c10d_functional.all_reduce.default(bound, 'sum', 'tp')\n        bs: \"f32[1, 2]\" = torch.ops._c10d_functional.wait_tensor.default(bsr)\n        narrow: \"u8[1]\" = torch.ops.aten._to_copy.default(tokens, dtype = torch.uint8)\n{value}        r: \"u8[1]\" = torch.ops._c10d_functional.all_reduce.default(v, '{reduce_op}', 'tp')\n        rw: \"u8[1]\" = torch.ops._c10d_functional.wait_tensor.default(r)\n        mf: \"f32[1]\" = torch.ops.aten._to_copy.default(rw, dtype = torch.float32)\n        out: \"f32[1, 2]\" = torch.ops.aten.add.Tensor(bs, mf)\n        return (out,)\n")
    };
    std::fs::write(dir.join("spec.py"), spec).unwrap();
    std::fs::write(
        dir.join("rank0.py"),
        rank("        v: \"u8[1]\" = torch.ops.aten.add.Tensor(narrow, 1)\n"),
    )
    .unwrap();
    std::fs::write(
        dir.join("rank1.py"),
        rank("        v: \"u8[1]\" = torch.ops.aten.alias.default(narrow)\n"),
    )
    .unwrap();
    std::fs::write(
        dir.join("case.yaml"),
        "version: 1\nname: narrow-reduce\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [rank0.py, rank1.py]\ninputs:\n  w: Replicate()\n  tokens: Shard(0)\noutputs:\n  out: Replicate()\n",
    )
    .unwrap();
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}

/// An `all_reduce` min or max of a wrapped `uint8`: `min(t0 + 1, t1)` exactly, on the ranks
/// `min(0, t1)` at token 255 (so 0 where the spec has `t1`); the max likewise (`max(0, t1)`
/// against 256). The interpreter's run of the whole program disagrees with the spec there;
/// with every token within 254 the case is proved.
#[test]
fn a_min_or_max_across_ranks_of_wrapped_values_is_not_proved() {
    for op in ["min", "max"] {
        let dir = tempfile::tempdir().unwrap();
        let case = write_reduce_case(dir.path(), WRAPS, op);
        let leaves = |tokens: Vec<f64>| {
            let w: Vec<f64> = (0..WRAPS * D).map(|i| 1.0 + i as f64).collect();
            BTreeMap::from([
                (
                    "w".to_string(),
                    Tensor::new(Meta::new(DType::F32, vec![WRAPS, D]), w),
                ),
                (
                    "tokens".to_string(),
                    Tensor::new(Meta::new(DType::I64, vec![tokens.len()]), tokens),
                ),
            ])
        };
        let cfg = RunConfig::default();
        let spec = shardproof_interp::run_graph(&case.spec, &leaves(vec![255.0, 5.0]), &cfg)
            .expect("the spec runs");
        let spec_out = spec
            .get(case.spec.outputs[0].unwrap())
            .unwrap()
            .data
            .to_vec();
        let rank_leaves = [leaves(vec![255.0]), leaves(vec![5.0])];
        let ranks = shardproof_interp::run_program(&case.program, &rank_leaves, &cfg)
            .expect("the ranks run");
        let rank0 = &case.program.ranks[0];
        let rank_out = ranks[0]
            .get(rank0.outputs[0].unwrap())
            .unwrap()
            .data
            .to_vec();
        assert_ne!(spec_out, rank_out, "{op}: 255 + 1 wraps on rank 0");
        assert_none_proved(&case);
        let dir = tempfile::tempdir().unwrap();
        let case = write_reduce_case(dir.path(), FITS, op);
        let proof = prove_case(&case, &full_size());
        assert_eq!(proof.verdict, Verdict::Proved, "{op}: {}", report(&proof));
    }
}

/// `clamp(narrow, max = 510)` on a `uint8`: the kernel casts the bound to `uint8` (254), so
/// token 255 is 254 on the ranks; the prover's `min(t, 510)` is the token. A bound within the
/// type (254 itself) is proved against the spec's `min(t, 254)`.
#[test]
fn a_clamp_of_a_uint8_to_a_scalar_past_its_range_is_not_proved() {
    let rank = |bound: u32| {
        format!("        narrow: \"u8[2]\" = torch.ops.aten._to_copy.default(tokens, dtype = torch.uint8)\n        c: \"u8[2]\" = torch.ops.aten.clamp.default(narrow, None, {bound})\n        at: \"i64[2]\" = torch.ops.aten._to_copy.default(c, dtype = torch.int64)\n        look: \"f32[2]\" = torch.ops.aten._to_copy.default(at, dtype = torch.float32)\n        out: \"f32[2, 2]\" = torch.ops.aten.add.Tensor(look, bound)\n        return (out,)\n")
    };
    let spec = |top: &str| {
        format!("        c: \"i64[2]\" = torch.ops.aten.clamp.default(tokens, None, {top})\n        look: \"f32[2]\" = torch.ops.aten._to_copy.default(c, dtype = torch.float32)\n        out: \"f32[2, 2]\" = torch.ops.aten.add.Tensor(look, bound)\n        return (out,)\n")
    };
    let dir = tempfile::tempdir().unwrap();
    let case = write_case(dir.path(), WRAPS, &spec("510"), &rank(510));
    let (spec_out, rank_out) = run_both(&case, WRAPS, &[255.0, 1.0]);
    assert_ne!(Ok(spec_out), rank_out, "the bound 510 is 254 in uint8");
    assert_none_proved(&case);
    let dir = tempfile::tempdir().unwrap();
    let case = write_case(dir.path(), WRAPS, &spec("254"), &rank(254));
    let proof = prove_case(&case, &full_size());
    assert_eq!(proof.verdict, Verdict::Proved, "{}", report(&proof));
}

/// `narrow > 510` on a `uint8`: the kernel compares with 510 cast to `uint8` (254), so token
/// 255 passes on the ranks (row 255 read) and the spec reads nothing (0); the prover's
/// `255 > 510` is false. Against 254 (within the type) the same program is proved.
#[test]
fn a_comparison_of_a_uint8_with_a_scalar_past_its_range_is_not_proved() {
    let rank = |bound: u32| {
        format!("        narrow: \"u8[2]\" = torch.ops.aten._to_copy.default(tokens, dtype = torch.uint8)\n        pos: \"b8[2]\" = torch.ops.aten.gt.Scalar(narrow, {bound})\n        idx: \"i64[2]\" = torch.ops.aten.where.ScalarOther(pos, tokens, 0)\n        look: \"f32[2]\" = torch.ops.aten._to_copy.default(idx, dtype = torch.float32)\n        out: \"f32[2, 2]\" = torch.ops.aten.add.Tensor(look, bound)\n        return (out,)\n")
    };
    let spec = |top: u32| {
        format!("        pos: \"b8[2]\" = torch.ops.aten.gt.Scalar(tokens, {top})\n        idx: \"i64[2]\" = torch.ops.aten.where.ScalarOther(pos, tokens, 0)\n        look: \"f32[2]\" = torch.ops.aten._to_copy.default(idx, dtype = torch.float32)\n        out: \"f32[2, 2]\" = torch.ops.aten.add.Tensor(look, bound)\n        return (out,)\n")
    };
    let dir = tempfile::tempdir().unwrap();
    let case = write_case(dir.path(), WRAPS, &spec(510), &rank(510));
    let (spec_out, rank_out) = run_both(&case, WRAPS, &[255.0, 1.0]);
    assert_ne!(Ok(spec_out), rank_out, "510 is 254 in uint8");
    assert_none_proved(&case);
    let dir = tempfile::tempdir().unwrap();
    let case = write_case(dir.path(), WRAPS, &spec(254), &rank(254));
    let proof = prove_case(&case, &full_size());
    assert_eq!(proof.verdict, Verdict::Proved, "{}", report(&proof));
}
