//! `embedding_dense_backward`'s indices are an index use: tokens whose only use is an
//! embedding's backward (a stage holding the embedding's update, without the forward lookup)
//! range over the backward's `num_weights` rows, as they would over an `embedding`'s table
//! (`shardproof_interp::index_uses`). Out-of-range ids are no valid input there: the
//! interpreter stops on them.
//!
//! The fixture is the embedding's update of a vocab-parallel model (Megatron's
//! `VocabParallelEmbedding` backward) on a `tp = 2` mesh: rank `r` holds rows `[4r, 4r + 4)`
//! of an 8-row table, masks the tokens outside them, shifts the rest to local rows and
//! scatters the gradient into its 4 rows. Pinned:
//! - the right program is proved, at full size and through shape reduction, by the case split
//!   on the tokens (which needs index symbols: with the tokens plain integers it declines);
//! - a wrong `padding_idx` and a mask off by one row are refuted with counterexamples whose
//!   tokens are valid rows and whose difference the interpreter computes again here;
//! - shape reduction keeps the 8 rows where the ranks compute on the tokens (their range is
//!   read), and reduces them with the tokens' range where nothing does (a data-parallel
//!   update), each time with the full-size verdict.

use shardproof_interp::RunConfig;
use shardproof_prove::{prove_case, Proof, ProveConfig, Verdict};
use std::path::Path;

/// Positions (tokens) and the gradient's width.
const T: usize = 4;
const D: usize = 3;
/// The table's rows, and a rank's share of them.
const V: usize = 8;
const BLOCK: usize = V / 2;

/// The spec: the table's gradient, no padding row.
fn spec() -> String {
    format!(
        r#"class GraphModule(torch.nn.Module):
    def forward(self, grad: "f32[{T}, {D}]", tokens: "i64[{T}]"):
        table: "f32[{V}, {D}]" = torch.ops.aten.embedding_dense_backward.default(grad, tokens, {V}, -1, False)
        return (table,)
"#
    )
}

/// A planted bug in the vocab-parallel ranks.
#[derive(Clone, Copy, PartialEq)]
enum Bug {
    None,
    /// Each rank drops its local row 0 (`padding_idx = 0` where the spec has none).
    PaddingRow,
    /// Rank 0 masks from row 3 on, one row early: no rank writes row 3.
    RowsOffByOne,
    /// Rank 0 masks from row 5 on, one row late: token 4 is local row 4 of its 4 rows.
    MaskOneRowLong,
}

/// Rank `r` of the vocab-parallel update.
fn vocab_rank(r: usize, bug: Bug) -> String {
    let lo = r * BLOCK;
    let hi = match bug {
        Bug::RowsOffByOne if r == 0 => lo + BLOCK - 1,
        Bug::MaskOneRowLong if r == 0 => lo + BLOCK + 1,
        _ => lo + BLOCK,
    };
    let pad = if bug == Bug::PaddingRow { 0 } else { -1 };
    format!(
        r#"class GraphModule(torch.nn.Module):
    def forward(self, grad: "f32[{T}, {D}]", tokens: "i64[{T}]"):
        lt: "b8[{T}]" = torch.ops.aten.lt.Scalar(tokens, {lo})
        ge: "b8[{T}]" = torch.ops.aten.ge.Scalar(tokens, {hi})
        outside: "b8[{T}]" = torch.ops.aten.bitwise_or.Tensor(lt, ge)
        shifted: "i64[{T}]" = torch.ops.aten.sub.Scalar(tokens, {lo})
        local: "i64[{T}]" = torch.ops.aten.masked_fill.Scalar(shifted, outside, 0)
        outside_1: "b8[{T}, 1]" = torch.ops.aten.unsqueeze.default(outside, 1)
        kept: "f32[{T}, {D}]" = torch.ops.aten.masked_fill.Scalar(grad, outside_1, 0.0)
        table: "f32[{BLOCK}, {D}]" = torch.ops.aten.embedding_dense_backward.default(kept, local, {BLOCK}, {pad}, False)
        return (table,)
"#
    )
}

/// The vocab-parallel case: tokens and gradient replicated, the table's rows split over tp.
fn vocab_case(dir: &Path, bug: Bug) -> shardproof_case::Case {
    std::fs::write(dir.join("spec.py"), spec()).unwrap();
    for r in 0..2 {
        std::fs::write(dir.join(format!("r{r}.py")), vocab_rank(r, bug)).unwrap();
    }
    std::fs::write(
        dir.join("case.yaml"),
        "version: 1\nname: vocab-embedding-update\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r1.py]\ninputs:\n  grad: Replicate()\n  tokens: Replicate()\noutputs:\n  table: Shard(0)\n",
    )
    .unwrap();
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}

/// A data-parallel rank: its half of the positions scattered into the whole table, summed
/// over dp (`padding_idx` as given).
fn dp_rank(pad: i64) -> String {
    let t = T / 2;
    format!(
        r#"class GraphModule(torch.nn.Module):
    def forward(self, grad: "f32[{t}, {D}]", tokens: "i64[{t}]"):
        part: "f32[{V}, {D}]" = torch.ops.aten.embedding_dense_backward.default(grad, tokens, {V}, {pad}, False)
        all_reduce: "f32[{V}, {D}]" = torch.ops._c10d_functional.all_reduce.default(part, 'sum', 'dp')
        table: "f32[{V}, {D}]" = torch.ops._c10d_functional.wait_tensor.default(all_reduce)
        return (table,)
"#
    )
}

fn dp_case(dir: &Path, pad: i64) -> shardproof_case::Case {
    std::fs::write(dir.join("spec.py"), spec()).unwrap();
    std::fs::write(dir.join("r.py"), dp_rank(pad)).unwrap();
    std::fs::write(
        dir.join("case.yaml"),
        "version: 1\nname: dp-embedding-update\nspec:\n  graph: spec.py\nimpl:\n  mesh: { dp: 2 }\n  graphs: [r.py, r.py]\n  groups:\n    \"dp\": dp\ninputs:\n  grad: { dp: Shard(0) }\n  tokens: { dp: Shard(0) }\noutputs:\n  table: Replicate()\n",
    )
    .unwrap();
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}

fn full_size() -> ProveConfig {
    ProveConfig {
        reduce: false,
        ..ProveConfig::default()
    }
}

/// The reduced sizes of spec input `name`.
fn reduced_shape(case: &shardproof_case::Case, name: &str) -> Vec<u64> {
    let red = shardproof_prove::reduce::reduce_case(case).expect("reducible");
    red.inputs
        .iter()
        .find(|(n, _, _)| n == name)
        .map(|(_, _, r)| r.clone())
        .unwrap_or_else(|| panic!("no input `{name}` in {:?}", red.inputs))
}

/// A refutation's counterexample, checked on its own: every token a valid row of the spec's
/// table, and the interpreter, run again on the spec's and the ranks' inputs, giving the
/// table row the counterexample names different values on the spec and on the rank holding
/// it (`Shard(0)` over tp: rank `row / BLOCK`, local row `row % BLOCK`).
fn assert_confirmed(proof: &Proof, case: &shardproof_case::Case) {
    assert_eq!(proof.verdict, Verdict::Refuted, "{:?}", proof.message);
    let cx = proof.counterexample.as_ref().expect("a counterexample");
    let tokens = &cx.spec_inputs["tokens"];
    assert!(
        tokens.data.iter().all(|&t| (0.0..V as f64).contains(&t)),
        "tokens outside the table's rows: {:?}",
        tokens.data
    );
    let cfg = RunConfig::default();
    let spec_env = shardproof_interp::run_graph(&case.spec, &cx.spec_inputs, &cfg).unwrap();
    let spec_table = spec_env.get(case.spec.find("table").unwrap()).unwrap();
    let (row, col) = (cx.index[0], cx.index[1]);
    let holder = row / BLOCK;
    let g = &case.program.ranks[holder];
    let rank_env = shardproof_interp::run_graph(g, &cx.rank_inputs[holder], &cfg).unwrap();
    let rank_table = rank_env.get(g.find("table").unwrap()).unwrap();
    let (s, r) = (
        spec_table.data[row * D + col],
        rank_table.data[(row % BLOCK) * D + col],
    );
    assert!(
        (s - r).abs() > 1e-6 * s.abs().max(1.0),
        "the interpreter finds no difference at {:?}: {s} vs {r}",
        cx.index
    );
    assert_eq!((s, r), (cx.spec_value, cx.rebuilt_value));
}

#[test]
fn a_vocab_parallel_embedding_update_is_proved_by_the_case_split_on_its_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let case = vocab_case(dir.path(), Bug::None);
    for cfg in [full_size(), ProveConfig::default()] {
        let proof = prove_case(&case, &cfg);
        assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
        // The spec's `[t == -1]` padding test is 0 for a token in its rows, and each rank's
        // mask is decided token by token: the case split, on index symbols only.
        assert!(
            proof.layers.contains_key("case-split"),
            "reduce {}: {:?}",
            cfg.reduce,
            proof.layers
        );
    }
}

#[test]
fn a_padding_row_the_spec_does_not_have_is_refuted_on_valid_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let case = vocab_case(dir.path(), Bug::PaddingRow);
    for cfg in [full_size(), ProveConfig::default()] {
        let proof = prove_case(&case, &cfg);
        assert_confirmed(&proof, &case);
    }
}

#[test]
fn a_mask_one_row_short_is_refuted_on_valid_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let case = vocab_case(dir.path(), Bug::RowsOffByOne);
    for cfg in [full_size(), ProveConfig::default()] {
        let proof = prove_case(&case, &cfg);
        assert_confirmed(&proof, &case);
        assert_eq!(proof.counterexample.as_ref().unwrap().index[0], 3);
    }
}

/// The ranks compute on the tokens (`t - 4`, compared with 4 and 8): the tokens keep their
/// range, so the table keeps the 8 rows the backward's `num_weights` names (reduced, the
/// literal 4 would no longer be a block's edge).
#[test]
fn the_vocab_parallel_update_keeps_the_rows_its_tokens_range_over() {
    let dir = tempfile::tempdir().unwrap();
    for bug in [Bug::None, Bug::PaddingRow, Bug::RowsOffByOne] {
        let case = vocab_case(dir.path(), bug);
        // The positions reduce; the rows do not.
        assert!(reduced_shape(&case, "tokens")[0] < T as u64);
        let proof = prove_case(&case, &ProveConfig::default());
        let reduction = proof.reduction.as_ref().expect("reduced");
        // The spec's 8 rows are two blocks of the ranks' rows: the block keeps its 4 rows,
        // pinned by the tokens' range.
        let rows = reduction
            .sizes
            .iter()
            .find(|s| s.origin.contains("table rows"))
            .unwrap_or_else(|| panic!("no table rows in {:?}", reduction.sizes));
        assert_eq!(
            (rows.original, rows.reduced),
            (BLOCK as u64, BLOCK as u64),
            "{:?}",
            reduction.sizes
        );
        assert!(
            rows.why
                .as_deref()
                .is_some_and(|w| w.contains("an integer input's range")),
            "{rows:?}"
        );
        let full = prove_case(&case, &full_size()).verdict;
        assert_eq!(proof.verdict, full, "{:?}", proof.message);
    }
}

/// Nothing computes on the tokens of a data-parallel update: the table's rows reduce, the
/// `num_weights` literals with them and the tokens' range with the literal; the verdict is
/// the full-size one, and the interpreter agrees with the proof at full size on valid tokens.
#[test]
fn a_data_parallel_update_reduces_its_rows_with_the_tokens_range() {
    let dir = tempfile::tempdir().unwrap();
    let case = dp_case(dir.path(), -1);
    let red = shardproof_prove::reduce::reduce_case(&case).expect("reducible");
    let rows = red
        .sizes
        .iter()
        .find(|s| s.origin.contains("table rows"))
        .unwrap_or_else(|| panic!("no table rows in {:?}", red.sizes));
    assert!(rows.reduced < V as u64, "{:?}", red.sizes);
    let proof = prove_case(&case, &ProveConfig::default());
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
    assert!(proof.reduction.is_some());
    assert_eq!(prove_case(&case, &full_size()).verdict, Verdict::Proved);
    // The interpreter at full size, every token a valid row: the ranks' sum is the spec's.
    let grad: Vec<f64> = (0..T * D).map(|i| (i * 37 % 11) as f64 - 4.5).collect();
    let tokens = [7.0, 0.0, 7.0, 3.0];
    let tensor = |dtype, shape: Vec<usize>, data: Vec<f64>| {
        shardproof_ops::Tensor::new(shardproof_ops::Meta::new(dtype, shape), data)
    };
    let cfg = RunConfig::default();
    let leaves = |rows: std::ops::Range<usize>| {
        std::collections::BTreeMap::from([
            (
                "grad".to_string(),
                tensor(
                    shardproof_ir::DType::F32,
                    vec![rows.len(), D],
                    grad[rows.start * D..rows.end * D].to_vec(),
                ),
            ),
            (
                "tokens".to_string(),
                tensor(
                    shardproof_ir::DType::I64,
                    vec![rows.len()],
                    tokens[rows].to_vec(),
                ),
            ),
        ])
    };
    let table = |g: &shardproof_ir::Graph, rows| {
        let env = shardproof_interp::run_graph(g, &leaves(rows), &cfg).unwrap();
        env.get(g.find("table").unwrap()).unwrap().data.to_vec()
    };
    let spec = table(&case.spec, 0..T);
    let rank = &case.program.ranks[0];
    let sum: Vec<f64> = table(rank, 0..T / 2)
        .iter()
        .zip(table(rank, T / 2..T))
        .map(|(a, b)| a + b)
        .collect();
    assert_eq!(spec, sum);
    // A rank dropping the last row (padding_idx 7 where the spec has none) keeps the rows
    // (a non-negative padding_idx is a fixed row) and is refuted, reduced and at full size.
    let bad = dp_case(dir.path(), 7);
    assert_eq!(
        prove_case(&bad, &ProveConfig::default()).verdict,
        Verdict::Refuted
    );
    assert_eq!(prove_case(&bad, &full_size()).verdict, Verdict::Refuted);
}

/// A rank whose mask lets one token too many through reads a row past its table: the kernel
/// fails there (the interpreter stops), where the rows' equality tests would drop it and the
/// other rank's rows make up the spec's. Never proved: the index's interval, known from the
/// tokens' range, reaches past the rows.
#[test]
fn a_mask_one_row_long_is_not_proved() {
    let dir = tempfile::tempdir().unwrap();
    let case = vocab_case(dir.path(), Bug::MaskOneRowLong);
    let grad = shardproof_ops::Tensor::new(
        shardproof_ops::Meta::new(shardproof_ir::DType::F32, vec![T, D]),
        vec![1.0; T * D],
    );
    let tokens = shardproof_ops::Tensor::new(
        shardproof_ops::Meta::new(shardproof_ir::DType::I64, vec![T]),
        vec![4.0, 0.0, 1.0, 7.0],
    );
    let leaves = std::collections::BTreeMap::from([
        ("grad".to_string(), grad),
        ("tokens".to_string(), tokens),
    ]);
    let cfg = RunConfig::default();
    assert!(shardproof_interp::run_graph(&case.spec, &leaves, &cfg).is_ok());
    let err = shardproof_interp::run_graph(&case.program.ranks[0], &leaves, &cfg).unwrap_err();
    assert!(err.to_string().contains("out of range"), "{err}");
    for cfg in [full_size(), ProveConfig::default()] {
        let proof = prove_case(&case, &cfg);
        assert_ne!(proof.verdict, Verdict::Proved, "reduce {}", cfg.reduce);
    }
    let full = prove_case(&case, &full_size());
    let message = full.message.unwrap_or_default();
    assert!(message.contains("outside its 4 rows"), "{message}");
}
