//! Adversarial review of the prover's index bounds on embeddings (`interp::index_uses`,
//! `exec/range.rs::may_leave`, `exec/nn.rs::embedding` and `embedding_backward`): each case is
//! a rank program the interpreter shows wrong on valid inputs (a value differing from the
//! spec's, or a kernel stopping on an index outside its table, which the spec does not do)
//! and that must not be proved; or a right one that must stay proved.
//!
//! The fixtures are the vocab-parallel embedding of Megatron (`VocabParallelEmbedding`) on a
//! `tp = 2` mesh: rank `r` holds rows `[4r, 4r + 4)` of an 8-row table.

use shardproof_interp::RunConfig;
use shardproof_ir::DType;
use shardproof_ops::{Meta, Tensor};
use shardproof_prove::{prove_case, prove_case_or_full_size, Proof, ProveConfig, Verdict};
use std::collections::BTreeMap;
use std::path::Path;

/// Positions (tokens) and the embedding's width.
const T: usize = 4;
const D: usize = 3;
/// The table's rows, and a rank's share of them.
const V: usize = 8;
const BLOCK: usize = V / 2;

fn full_size() -> ProveConfig {
    ProveConfig {
        reduce: false,
        ..ProveConfig::default()
    }
}

fn report(p: &Proof) -> String {
    format!(
        "{:?} {:?} layers={:?} second={:?}",
        p.verdict,
        p.message,
        p.layers,
        p.reduction.as_ref().and_then(|r| r.second_size.as_ref())
    )
}

fn tensor(dtype: DType, shape: &[usize], data: Vec<f64>) -> Tensor {
    Tensor::new(Meta::new(dtype, shape.to_vec()), data)
}

/// Writes `spec.py`, `r0.py`, `r1.py` and a `tp = 2` case with the given relations.
fn write_case(
    dir: &Path,
    spec: &str,
    ranks: [&str; 2],
    inputs: &str,
    outputs: &str,
) -> shardproof_case::Case {
    std::fs::write(dir.join("spec.py"), spec).unwrap();
    std::fs::write(dir.join("r0.py"), ranks[0]).unwrap();
    std::fs::write(dir.join("r1.py"), ranks[1]).unwrap();
    std::fs::write(
        dir.join("case.yaml"),
        format!("version: 1\nname: review-embed\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ tp: 2 }}\n  graphs: [r0.py, r1.py]\ninputs:\n{inputs}outputs:\n{outputs}"),
    )
    .unwrap();
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}

// ---------------------------------------------------------------------------------------
// Forward: the vocab-parallel lookup.
// ---------------------------------------------------------------------------------------

/// The spec's lookup of every token in the whole table.
fn forward_spec() -> String {
    format!(
        r#"class GraphModule(torch.nn.Module):
    def forward(self, w: "f32[{V}, {D}]", tokens: "i64[{T}]"):
        out: "f32[{T}, {D}]" = torch.ops.aten.embedding.default(w, tokens)
        return (out,)
"#
    )
}

/// How a forward rank forms its local index.
#[derive(Clone, Copy, PartialEq)]
enum Local {
    /// `masked_fill(t - lo, outside, 0)`: Megatron's `masked_input[input_mask] = 0`.
    Masked,
    /// `t - lo`: the index mask forgotten, only the output masked. A token of another rank's
    /// rows is read past this rank's 4 rows, where `F.embedding` raises.
    Unmasked,
}

/// Rank `r` of the vocab-parallel lookup: its rows' lookup, the other ranks' tokens zeroed,
/// summed over tp.
fn forward_rank(r: usize, local: Local) -> String {
    let lo = r * BLOCK;
    let hi = lo + BLOCK;
    let index = match local {
        Local::Masked => format!(
            "        local: \"i64[{T}]\" = torch.ops.aten.masked_fill.Scalar(shifted, outside, 0)\n"
        ),
        Local::Unmasked => {
            format!("        local: \"i64[{T}]\" = torch.ops.aten.clone.default(shifted)\n")
        }
    };
    format!(
        r#"class GraphModule(torch.nn.Module):
    def forward(self, w: "f32[{BLOCK}, {D}]", tokens: "i64[{T}]"):
        lt: "b8[{T}]" = torch.ops.aten.lt.Scalar(tokens, {lo})
        ge: "b8[{T}]" = torch.ops.aten.ge.Scalar(tokens, {hi})
        outside: "b8[{T}]" = torch.ops.aten.bitwise_or.Tensor(lt, ge)
        shifted: "i64[{T}]" = torch.ops.aten.sub.Scalar(tokens, {lo})
{index}        part: "f32[{T}, {D}]" = torch.ops.aten.embedding.default(w, local)
        outside_1: "b8[{T}, 1]" = torch.ops.aten.unsqueeze.default(outside, 1)
        kept: "f32[{T}, {D}]" = torch.ops.aten.masked_fill.Scalar(part, outside_1, 0.0)
        all_reduce: "f32[{T}, {D}]" = torch.ops._c10d_functional.all_reduce.default(kept, 'sum', '0')
        out: "f32[{T}, {D}]" = torch.ops._c10d_functional.wait_tensor.default(all_reduce)
        return (out,)
"#
    )
}

fn forward_case(dir: &Path, local: Local) -> shardproof_case::Case {
    write_case(
        dir,
        &forward_spec(),
        [&forward_rank(0, local), &forward_rank(1, local)],
        "  w: Shard(0)\n  tokens: Replicate()\n",
        "  out: Replicate()\n",
    )
}

/// Leaves of the forward's spec (`w` whole) or of rank `r` (its rows).
fn forward_leaves(rank: Option<usize>, tokens: &[f64]) -> BTreeMap<String, Tensor> {
    let w: Vec<f64> = (0..V * D).map(|i| 1.0 + i as f64).collect();
    let w = match rank {
        None => tensor(DType::F32, &[V, D], w),
        Some(r) => tensor(
            DType::F32,
            &[BLOCK, D],
            w[r * BLOCK * D..(r + 1) * BLOCK * D].to_vec(),
        ),
    };
    BTreeMap::from([
        ("w".to_string(), w),
        (
            "tokens".to_string(),
            tensor(DType::I64, &[tokens.len()], tokens.to_vec()),
        ),
    ])
}

/// The right vocab-parallel lookup is proved, at full size and reduced.
#[test]
fn a_vocab_parallel_lookup_is_proved() {
    let dir = tempfile::tempdir().unwrap();
    let case = forward_case(dir.path(), Local::Masked);
    for cfg in [full_size(), ProveConfig::default()] {
        let proof = prove_case(&case, &cfg);
        assert_eq!(proof.verdict, Verdict::Proved, "{}", report(&proof));
    }
}

/// The forward's out-of-range index: the rank forgets to zero the other ranks' tokens in its
/// index and masks only the output. On a token of rank 1's rows rank 0 looks up a row past
/// its 4 (`F.embedding` raises "index out of range"; so does the interpreter); the prover's
/// lookup of an index outside the table is a value the output mask then drops, and the case
/// split over the tokens finds every token's row right.
#[test]
fn a_forward_lookup_past_the_rows_is_not_proved() {
    let dir = tempfile::tempdir().unwrap();
    let case = forward_case(dir.path(), Local::Unmasked);
    let tokens = [5.0, 0.0, 1.0, 7.0];
    let cfg = RunConfig::default();
    assert!(shardproof_interp::run_graph(&case.spec, &forward_leaves(None, &tokens), &cfg).is_ok());
    let err = shardproof_interp::run_graph(
        &case.program.ranks[0],
        &forward_leaves(Some(0), &tokens),
        &cfg,
    )
    .unwrap_err();
    assert!(err.to_string().contains("out of range"), "{err}");
    assert_none_proved(&case);
}

/// The verdicts at full size, reduced, and through `prove_case_or_full_size` (the CLI's
/// path): none may be `Proved`.
fn assert_none_proved(case: &shardproof_case::Case) {
    let full = prove_case(case, &full_size());
    let reduced = prove_case(case, &ProveConfig::default());
    let (cli, _) = prove_case_or_full_size(case, &ProveConfig::default());
    let all = [("full size", &full), ("reduced", &reduced), ("cli", &cli)];
    assert!(
        all.iter().all(|(_, p)| p.verdict != Verdict::Proved),
        "{}",
        all.iter()
            .map(|(k, p)| format!("{k}: {}", report(p)))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

// ---------------------------------------------------------------------------------------
// Backward: the vocab-parallel update, its local index masked by a product.
// ---------------------------------------------------------------------------------------

/// The spec: the table's gradient, no padding row.
fn backward_spec() -> String {
    format!(
        r#"class GraphModule(torch.nn.Module):
    def forward(self, grad: "f32[{T}, {D}]", tokens: "i64[{T}]"):
        table: "f32[{V}, {D}]" = torch.ops.aten.embedding_dense_backward.default(grad, tokens, {V}, -1, False)
        return (table,)
"#
    )
}

/// Rank `r` of the vocab-parallel update, its local index `(t - lo) * inside` (the mask as an
/// integer factor, not a `masked_fill`); `hi_extra` rows added to rank 0's mask.
fn backward_rank(r: usize, hi_extra: usize) -> String {
    let lo = r * BLOCK;
    let hi = lo + BLOCK + if r == 0 { hi_extra } else { 0 };
    format!(
        r#"class GraphModule(torch.nn.Module):
    def forward(self, grad: "f32[{T}, {D}]", tokens: "i64[{T}]"):
        lt: "b8[{T}]" = torch.ops.aten.lt.Scalar(tokens, {lo})
        ge: "b8[{T}]" = torch.ops.aten.ge.Scalar(tokens, {hi})
        outside: "b8[{T}]" = torch.ops.aten.bitwise_or.Tensor(lt, ge)
        inside: "b8[{T}]" = torch.ops.aten.bitwise_not.default(outside)
        inside_i: "i64[{T}]" = torch.ops.aten._to_copy.default(inside, dtype = torch.int64)
        shifted: "i64[{T}]" = torch.ops.aten.sub.Scalar(tokens, {lo})
        local: "i64[{T}]" = torch.ops.aten.mul.Tensor(shifted, inside_i)
        outside_1: "b8[{T}, 1]" = torch.ops.aten.unsqueeze.default(outside, 1)
        kept: "f32[{T}, {D}]" = torch.ops.aten.masked_fill.Scalar(grad, outside_1, 0.0)
        table: "f32[{BLOCK}, {D}]" = torch.ops.aten.embedding_dense_backward.default(kept, local, {BLOCK}, -1, False)
        return (table,)
"#
    )
}

fn backward_case(dir: &Path, hi_extra: usize) -> shardproof_case::Case {
    write_case(
        dir,
        &backward_spec(),
        [&backward_rank(0, hi_extra), &backward_rank(1, hi_extra)],
        "  grad: Replicate()\n  tokens: Replicate()\n",
        "  table: Shard(0)\n",
    )
}

/// The right update, its index masked by a product, is proved (the product's interval is
/// unknown, but every token's case is decided).
#[test]
fn a_vocab_parallel_update_masked_by_a_product_is_proved() {
    let dir = tempfile::tempdir().unwrap();
    let case = backward_case(dir.path(), 0);
    let proof = prove_case(&case, &full_size());
    assert_eq!(proof.verdict, Verdict::Proved, "{}", report(&proof));
}

/// Rank 0's mask one row long, as in `embedding_backward_tokens::a_mask_one_row_long_is_not_proved`,
/// but the local index masked by a product: token 4 is local row 4 of rank 0's 4 rows (the
/// kernel fails; the interpreter stops), while the rows' equality tests drop it and rank 1's
/// row 0 makes up the spec's row 4. `may_leave` sees no interval for `(t - 0) * inside` (a
/// product of two atoms), so it does not refuse.
#[test]
fn a_mask_one_row_long_through_a_product_is_not_proved() {
    let dir = tempfile::tempdir().unwrap();
    let case = backward_case(dir.path(), 1);
    let leaves = BTreeMap::from([
        (
            "grad".to_string(),
            tensor(DType::F32, &[T, D], vec![1.0; T * D]),
        ),
        (
            "tokens".to_string(),
            tensor(DType::I64, &[T], vec![4.0, 0.0, 1.0, 7.0]),
        ),
    ]);
    let cfg = RunConfig::default();
    assert!(shardproof_interp::run_graph(&case.spec, &leaves, &cfg).is_ok());
    let err = shardproof_interp::run_graph(&case.program.ranks[0], &leaves, &cfg).unwrap_err();
    assert!(err.to_string().contains("out of range"), "{err}");
    assert_none_proved(&case);
}

/// Rank `r` of the vocab-parallel update, its local index `clamp(t - lo, 0, top)` (no
/// `masked_fill`: the other ranks' tokens are clamped into the rows, their gradient masked).
fn clamped_rank(r: usize, top: usize) -> String {
    let lo = r * BLOCK;
    let hi = lo + BLOCK;
    format!(
        r#"class GraphModule(torch.nn.Module):
    def forward(self, grad: "f32[{T}, {D}]", tokens: "i64[{T}]"):
        lt: "b8[{T}]" = torch.ops.aten.lt.Scalar(tokens, {lo})
        ge: "b8[{T}]" = torch.ops.aten.ge.Scalar(tokens, {hi})
        outside: "b8[{T}]" = torch.ops.aten.bitwise_or.Tensor(lt, ge)
        shifted: "i64[{T}]" = torch.ops.aten.sub.Scalar(tokens, {lo})
        local: "i64[{T}]" = torch.ops.aten.clamp.default(shifted, 0, {top})
        outside_1: "b8[{T}, 1]" = torch.ops.aten.unsqueeze.default(outside, 1)
        kept: "f32[{T}, {D}]" = torch.ops.aten.masked_fill.Scalar(grad, outside_1, 0.0)
        table: "f32[{BLOCK}, {D}]" = torch.ops.aten.embedding_dense_backward.default(kept, local, {BLOCK}, -1, False)
        return (table,)
"#
    )
}

/// The local index clamped to `[0, 4]` instead of `[0, 3]`: a token of rank 1's rows is local
/// row 4 of rank 0's 4 rows (the kernel fails; the interpreter stops), its gradient masked, so
/// the rows' equality tests dropping it change nothing. A `clamp` (a `max` and a `min`) has no
/// interval in `exec/range.rs`, so `may_leave` does not refuse, with or without the product
/// rule of fix 2: only an index shown within its rows would be safe to drop.
#[test]
fn an_index_clamped_one_row_past_is_not_proved() {
    let dir = tempfile::tempdir().unwrap();
    let case = write_case(
        dir.path(),
        &backward_spec(),
        [&clamped_rank(0, BLOCK), &clamped_rank(1, BLOCK)],
        "  grad: Replicate()\n  tokens: Replicate()\n",
        "  table: Shard(0)\n",
    );
    let leaves = BTreeMap::from([
        (
            "grad".to_string(),
            tensor(DType::F32, &[T, D], vec![1.0; T * D]),
        ),
        (
            "tokens".to_string(),
            tensor(DType::I64, &[T], vec![4.0, 0.0, 1.0, 7.0]),
        ),
    ]);
    let cfg = RunConfig::default();
    assert!(shardproof_interp::run_graph(&case.spec, &leaves, &cfg).is_ok());
    let err = shardproof_interp::run_graph(&case.program.ranks[0], &leaves, &cfg).unwrap_err();
    assert!(err.to_string().contains("out of range"), "{err}");
    assert_none_proved(&case);
}

/// Clamped to `[0, 3]`, the update is right; it is proved today (and would be refused where
/// only indices shown within the rows are accepted).
#[test]
fn an_index_clamped_into_the_rows_is_proved() {
    let dir = tempfile::tempdir().unwrap();
    let case = write_case(
        dir.path(),
        &backward_spec(),
        [&clamped_rank(0, BLOCK - 1), &clamped_rank(1, BLOCK - 1)],
        "  grad: Replicate()\n  tokens: Replicate()\n",
        "  table: Shard(0)\n",
    );
    let proof = prove_case(&case, &full_size());
    assert_eq!(proof.verdict, Verdict::Proved, "{}", report(&proof));
}

/// The spec scatters the gradient by a one-hot of the tokens built with `eq` and `arange`
/// (no index use: the tokens are integers of any value, a token past the 4 classes a zero
/// row); every rank by `embedding_dense_backward` over 4 rows, whose kernel fails on such a
/// token (the interpreter stops). Both sides drop it in the prover's terms (`[t == k]` for
/// no row `k`), and the proof stands though the rank fails on inputs the spec accepts. Only
/// an index shown within the rows (fix 4) refuses it.
#[test]
fn a_backward_over_tokens_the_spec_does_not_bound_is_not_proved() {
    let classes = BLOCK;
    let spec = format!(
        r#"class GraphModule(torch.nn.Module):
    def forward(self, grad: "f32[{T}, {D}]", tokens: "i64[{T}]"):
        tu: "i64[{T}, 1]" = torch.ops.aten.unsqueeze.default(tokens, 1)
        ar: "i64[{classes}]" = torch.ops.aten.arange.default({classes}, dtype = torch.int64, device = device(type='cpu'), pin_memory = False)
        hb: "b8[{T}, {classes}]" = torch.ops.aten.eq.Tensor(tu, ar)
        oh: "f32[{T}, {classes}]" = torch.ops.aten._to_copy.default(hb, dtype = torch.float32)
        oht: "f32[{classes}, {T}]" = torch.ops.aten.t.default(oh)
        table: "f32[{classes}, {D}]" = torch.ops.aten.mm.default(oht, grad)
        return (table,)
"#
    );
    let rank = format!(
        r#"class GraphModule(torch.nn.Module):
    def forward(self, grad: "f32[{T}, {D}]", tokens: "i64[{T}]"):
        table: "f32[{classes}, {D}]" = torch.ops.aten.embedding_dense_backward.default(grad, tokens, {classes}, -1, False)
        return (table,)
"#
    );
    let dir = tempfile::tempdir().unwrap();
    let case = write_case(
        dir.path(),
        &spec,
        [&rank, &rank],
        "  grad: Replicate()\n  tokens: Replicate()\n",
        "  table: Replicate()\n",
    );
    let leaves = BTreeMap::from([
        (
            "grad".to_string(),
            tensor(DType::F32, &[T, D], vec![1.0; T * D]),
        ),
        (
            "tokens".to_string(),
            tensor(DType::I64, &[T], vec![5.0, 0.0, 1.0, 3.0]),
        ),
    ]);
    let cfg = RunConfig::default();
    assert!(shardproof_interp::run_graph(&case.spec, &leaves, &cfg).is_ok());
    let err = shardproof_interp::run_graph(&case.program.ranks[0], &leaves, &cfg).unwrap_err();
    assert!(err.to_string().contains("out of range"), "{err}");
    assert_none_proved(&case);
}
