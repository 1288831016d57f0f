//! `nll_loss_forward` reads each label's entry by one lookup (`exec/nn.rs`), and the
//! vocab-parallel cross-entropy is decided against it by the same case split as the
//! vocab-parallel embedding (`decide/split.rs`).
//!
//! The spec's loss over `N` labels and `V` classes holds `O(N)` terms (the one-hot over the
//! classes held `N·V`: one `[t == k]` selector per class per label), the ranks' masked lookups
//! at `label - start` are proved equal to it label by label, and the planted bugs (a rank's
//! range off by one, `<=` for `<` in the mask, a rank's partial missing, the wrong row, the
//! ignored labels not masked) are refuted with counterexamples the interpreter confirms; a
//! rank reading its local table at the global label is never proved.

use shardproof_prove::exec::{run_graph, ExecLimits};
use shardproof_prove::expr::{Arena, Atom, Func, SymbolKind};
use shardproof_prove::tensor::SymTensor;
use shardproof_prove::{prove_case, ProveConfig, Verdict};
use std::collections::BTreeMap;
use std::path::Path;

/// Labels (rows of logits).
const N: usize = 4;

/// The spec: the cross-entropy of `N` rows over `v` classes (`reduction` 1 mean, 2 sum).
fn spec(v: usize, reduction: u8, ignore: i64) -> String {
    format!(
        r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[{N}, {v}]", labels: "i64[{N}]"):
        _log_softmax: "f32[{N}, {v}]" = torch.ops.aten._log_softmax.default(x, 1, False)
        nll_loss_forward = torch.ops.aten.nll_loss_forward.default(_log_softmax, labels, None, {reduction}, {ignore})
        loss: "f32[]" = nll_loss_forward[0]
        total_weight: "f32[]" = nll_loss_forward[1]
        return (loss,)
"#
    )
}

/// Rank `r`'s vocab-parallel cross-entropy over its `rows` classes `[r·rows, (r+1)·rows)`
/// (Megatron's `_VocabParallelCrossEntropy`, as the zoo emits it): the max all-reduced, the
/// labels outside the range masked and the others read at `label - start`, the partial target
/// logits and the exponential sums all-reduced. With `ignore`, the labels equal to it add 0
/// and the losses are summed (the spec's `reduction` 2); else their mean.
fn rank(r: usize, rows: usize, ignore: Option<i64>) -> String {
    let (start, end) = (r * rows, (r + 1) * rows);
    let tail = match ignore {
        None => r#"        loss: "f32[]" = torch.ops.aten.mean.default(sub_2)
"#
        .to_string(),
        Some(ig) => format!(
            r#"        eq: "b8[{N}]" = torch.ops.aten.eq.Scalar(labels, {ig})
        unsqueeze_2: "b8[{N}, 1]" = torch.ops.aten.unsqueeze.default(eq, 1)
        masked_fill_2: "f32[{N}, 1]" = torch.ops.aten.masked_fill.Scalar(sub_2, unsqueeze_2, 0.0)
        loss: "f32[]" = torch.ops.aten.sum.default(masked_fill_2)
"#
        ),
    };
    format!(
        r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[{N}, {rows}]", labels: "i64[{N}]"):
        amax: "f32[{N}, 1]" = torch.ops.aten.amax.default(x, [1], True)
        all_reduce: "f32[{N}, 1]" = torch.ops._c10d_functional.all_reduce.default(amax, 'max', 'tp')
        wait_tensor: "f32[{N}, 1]" = torch.ops._c10d_functional.wait_tensor.default(all_reduce)
        sub: "f32[{N}, {rows}]" = torch.ops.aten.sub.Tensor(x, wait_tensor)
        lt: "b8[{N}]" = torch.ops.aten.lt.Scalar(labels, {start})
        ge: "b8[{N}]" = torch.ops.aten.ge.Scalar(labels, {end})
        bitwise_or: "b8[{N}]" = torch.ops.aten.bitwise_or.Tensor(lt, ge)
        sub_1: "i64[{N}]" = torch.ops.aten.sub.Scalar(labels, {start})
        masked_fill: "i64[{N}]" = torch.ops.aten.masked_fill.Scalar(sub_1, bitwise_or, 0)
        unsqueeze: "i64[{N}, 1]" = torch.ops.aten.unsqueeze.default(masked_fill, 1)
        unsqueeze_1: "b8[{N}, 1]" = torch.ops.aten.unsqueeze.default(bitwise_or, 1)
        gather: "f32[{N}, 1]" = torch.ops.aten.gather.default(sub, 1, unsqueeze)
        masked_fill_1: "f32[{N}, 1]" = torch.ops.aten.masked_fill.Scalar(gather, unsqueeze_1, 0.0)
        all_reduce_1: "f32[{N}, 1]" = torch.ops._c10d_functional.all_reduce.default(masked_fill_1, 'sum', 'tp')
        wait_tensor_1: "f32[{N}, 1]" = torch.ops._c10d_functional.wait_tensor.default(all_reduce_1)
        exp: "f32[{N}, {rows}]" = torch.ops.aten.exp.default(sub)
        sum_1: "f32[{N}, 1]" = torch.ops.aten.sum.dim_IntList(exp, [1], True)
        all_reduce_2: "f32[{N}, 1]" = torch.ops._c10d_functional.all_reduce.default(sum_1, 'sum', 'tp')
        wait_tensor_2: "f32[{N}, 1]" = torch.ops._c10d_functional.wait_tensor.default(all_reduce_2)
        log: "f32[{N}, 1]" = torch.ops.aten.log.default(wait_tensor_2)
        sub_2: "f32[{N}, 1]" = torch.ops.aten.sub.Tensor(log, wait_tensor_1)
{tail}        return (loss,)
"#
    )
}

/// The case of `tp` ranks of `rows` classes each, rank `r`'s program edited by `edit(r, text)`.
fn case(
    dir: &Path,
    tp: usize,
    rows: usize,
    ignore: Option<i64>,
    edit: &dyn Fn(usize, String) -> String,
) -> shardproof_case::Case {
    // Labels never equal the negative ignore_index (as the zoo's cases assume): each label
    // ranges over the classes alone, not also over -100 (`equiv/inputs.rs`).
    let (reduction, ig, assume) = match ignore {
        Some(ig) => (2, ig, ""),
        None => (1, -100, "assume:\n  ignore-index: unused\n"),
    };
    std::fs::write(dir.join("spec.py"), spec(tp * rows, reduction, ig)).unwrap();
    let mut graphs = Vec::new();
    for r in 0..tp {
        let name = format!("r{r}.py");
        std::fs::write(dir.join(&name), edit(r, rank(r, rows, ignore))).unwrap();
        graphs.push(name);
    }
    std::fs::write(
        dir.join("case.yaml"),
        format!(
            "version: 1\nname: vocab-parallel-nll\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ tp: {tp} }}\n  graphs: [{}]\n  groups:\n    \"tp\": tp\ninputs:\n  x: {{ tp: Shard(1) }}\n  labels: Replicate()\noutputs:\n  loss: Replicate()\n{assume}",
            graphs.join(", ")
        ),
    )
    .unwrap();
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}

/// The case's proof on the symbolic layers alone (no random interpreter run first), at the
/// case's own sizes.
fn prove(case: &shardproof_case::Case) -> shardproof_prove::Proof {
    let cfg = ProveConfig {
        run_first: false,
        reduce: false,
        ..ProveConfig::default()
    };
    prove_case(case, &cfg)
}

/// The spec's loss, symbolically executed with labels of `kind`: the terms the loss's own
/// polynomial holds, and whether any lookup is reachable from it.
fn spec_loss_terms(v: usize, kind: SymbolKind) -> (usize, bool) {
    // The summed loss (`reduction` 2): a polynomial in the per-label terms, where the mean's
    // division by the counted labels is one product atom.
    let dir = tempfile::tempdir().unwrap();
    case(dir.path(), 2, v / 2, None, &|_, g| g);
    std::fs::write(dir.path().join("spec.py"), spec(v, 2, -100)).unwrap();
    let graph = shardproof_case::load_case(&dir.path().join("case.yaml"))
        .unwrap()
        .spec;
    let mut arena = Arena::default();
    let x: Vec<_> = (0..N * v)
        .map(|i| arena.symbol(&format!("x{i}"), SymbolKind::Real).unwrap())
        .collect();
    let labels: Vec<_> = (0..N)
        .map(|i| arena.symbol(&format!("t{i}"), kind).unwrap())
        .collect();
    let leaves = BTreeMap::from([
        (
            "x".to_string(),
            SymTensor::new(shardproof_ir::DType::F32, vec![N, v], x),
        ),
        (
            "labels".to_string(),
            SymTensor::new(shardproof_ir::DType::I64, vec![N], labels),
        ),
    ]);
    let env = run_graph(
        &mut arena,
        &graph,
        &leaves,
        &BTreeMap::new(),
        &ExecLimits::default(),
    )
    .unwrap();
    let at = graph.find("loss").unwrap();
    let loss = env[at.node][at.output].as_ref().unwrap().elems[0];
    let lookups = arena
        .reachable_atoms(&[loss])
        .into_iter()
        .any(|a| matches!(arena.atom(a), Atom::App(Func::Lookup, _)));
    (arena.poly(loss).terms.len(), lookups)
}

#[test]
fn the_spec_loss_holds_terms_per_label_not_per_class() {
    for v in [16, 256] {
        // Labels ranging over the classes: one lookup per label, O(N) terms whatever v.
        let (terms, lookups) = spec_loss_terms(v, SymbolKind::Index(v as u32));
        assert!(lookups, "v = {v}");
        assert!(terms <= 2 * N, "v = {v}: {terms} terms");
        // Labels not known to be classes (any integer): the one-hot over every class.
        let (enumerated, lookups) = spec_loss_terms(v, SymbolKind::Int);
        assert!(!lookups, "v = {v}: a lookup at a label not proven in range");
        assert!(enumerated >= N * v, "v = {v}: {enumerated} terms");
    }
}

#[test]
fn the_vocab_parallel_loss_is_proved_against_the_lookup() {
    for (tp, rows) in [(2, 8), (4, 16)] {
        let dir = tempfile::tempdir().unwrap();
        let p = prove(&case(dir.path(), tp, rows, None, &|_, g| g));
        assert_eq!(p.verdict, Verdict::Proved, "tp {tp}: {:?}", p.message);
        assert_eq!(
            p.layers.get("case-split"),
            Some(&1),
            "tp {tp}: {:?}",
            p.layers
        );
    }
}

/// A planted bug on tp = 2, 8 classes a rank: refuted, the counterexample confirmed by the
/// interpreter (a refutation is only reported so), found by the case split.
fn refuted(ignore: Option<i64>, edit: &dyn Fn(usize, String) -> String) {
    let dir = tempfile::tempdir().unwrap();
    let p = prove(&case(dir.path(), 2, 8, ignore, edit));
    assert_eq!(p.verdict, Verdict::Refuted, "{:?}", p.message);
    assert!(p.counterexample.is_some());
}

#[test]
fn a_rank_range_off_by_one_is_refuted() {
    // Rank 1 takes [9, 17): label 8 gets no logit (its gather stays in range).
    refuted(None, &|r, g| {
        if r != 1 {
            return g;
        }
        g.replace("lt.Scalar(labels, 8)", "lt.Scalar(labels, 9)")
            .replace("ge.Scalar(labels, 16)", "ge.Scalar(labels, 17)")
            .replace("sub.Scalar(labels, 8)", "sub.Scalar(labels, 9)")
    });
}

#[test]
fn le_for_lt_in_the_mask_is_refuted() {
    // Rank 1 masks its first label, 8, as well.
    refuted(None, &|r, g| {
        if r != 1 {
            return g;
        }
        g.replace("aten.lt.Scalar(labels, 8)", "aten.le.Scalar(labels, 8)")
    });
}

#[test]
fn a_missing_rank_partial_is_refuted() {
    // Rank 1's partial target logit never reaches the sum.
    refuted(None, &|r, g| {
        if r != 1 {
            return g;
        }
        g.replace(
            "aten.masked_fill.Scalar(gather, unsqueeze_1, 0.0)",
            "aten.mul.Scalar(gather, 0.0)",
        )
    });
}

#[test]
fn the_wrong_row_is_refuted() {
    // Every rank reads each label's logit from another label's row.
    refuted(None, &|_, g| {
        g.replace(
            "unsqueeze: \"i64[4, 1]\" = torch.ops.aten.unsqueeze.default(masked_fill, 1)",
            "flip: \"i64[4]\" = torch.ops.aten.flip.default(masked_fill, [0])\n        unsqueeze: \"i64[4, 1]\" = torch.ops.aten.unsqueeze.default(flip, 1)",
        )
    });
}

#[test]
fn a_local_table_read_at_the_global_label_is_never_proved() {
    // Rank 1 reads its 8 rows at `label` in [8, 16): outside its table, which the interpreter's
    // gather refuses (no counterexample exists to confirm); the gather is not executed.
    let dir = tempfile::tempdir().unwrap();
    let p = prove(&case(dir.path(), 2, 8, None, &|r, g| {
        if r != 1 {
            return g;
        }
        g.replace("sub.Scalar(labels, 8)", "sub.Scalar(labels, 0)")
    }));
    assert_eq!(p.verdict, Verdict::Inconclusive, "{:?}", p.message);
    assert!(
        p.message.as_deref().unwrap_or("").contains("gather"),
        "{:?}",
        p.message
    );
}

#[test]
fn ignored_labels_are_masked_or_refuted() {
    // ignore_index 3, a class of rank 0: the ranks zero those labels' losses and sum.
    let dir = tempfile::tempdir().unwrap();
    let p = prove(&case(dir.path(), 2, 8, Some(3), &|_, g| g));
    assert_eq!(p.verdict, Verdict::Proved, "{:?}", p.message);
    // Not masked: a label 3 adds its loss.
    refuted(Some(3), &|_, g| {
        g.replace("aten.sum.default(masked_fill_2)", "aten.sum.default(sub_2)")
    });
}

#[test]
fn a_lookup_of_infinite_entries_is_the_entry() {
    // lookup(t, -inf, -inf) is -inf in range; taking the shared -inf out of the entries would
    // leave `-inf - (-inf)`, NaN, in the table.
    let mut ar = Arena::default();
    let t = ar.symbol("t", SymbolKind::Index(2)).unwrap();
    let ninf = ar.float(f64::NEG_INFINITY).unwrap();
    let l = ar.lookup_in_range(t, &[ninf, ninf]).unwrap();
    assert_eq!(ar.pure_nonfinite(l), Some(-1));
    // A finite shared term comes out: lookup(t, a + c, b + c) = c + lookup(t, a, b).
    let a = ar.symbol("a", SymbolKind::Real).unwrap();
    let b = ar.symbol("b", SymbolKind::Real).unwrap();
    let c = ar.symbol("c", SymbolKind::Real).unwrap();
    let (ac, bc) = (ar.add(a, c).unwrap(), ar.add(b, c).unwrap());
    let shifted = ar.lookup_in_range(t, &[ac, bc]).unwrap();
    let plain = ar.lookup_in_range(t, &[a, b]).unwrap();
    assert_eq!(shifted, ar.add(c, plain).unwrap());
}

#[test]
fn the_json_report_says_what_became_of_the_vocabulary() {
    let reduced = |rows: usize| {
        let dir = tempfile::tempdir().unwrap();
        let cfg = ProveConfig {
            run_first: false,
            ..ProveConfig::default()
        };
        let p = prove_case(&case(dir.path(), 2, rows, None, &|_, g| g), &cfg);
        serde_json::to_value(&p).unwrap()["reduction"].clone()
    };
    // 16 rows a rank: the labels reduce to N = 2, and the block to the smallest of at least
    // (4B + 2)·(N + 3) = 10 rows.
    let r = reduced(16);
    let v = &r["vocabulary"][0];
    assert_eq!(v["labels"], serde_json::json!(["labels"]), "{r}");
    assert_eq!(v["block"], 16, "{r}");
    assert_eq!(v["reduced_block"], 10, "{r}");
    assert_eq!(v["label_elements"], 2, "{r}");
    assert!(v.get("kept").is_none(), "{r}");
    // 8 rows: no smaller block leaves room for the labels; kept, and why.
    let r = reduced(8);
    let v = &r["vocabulary"][0];
    assert_eq!(v["block"], 8, "{r}");
    assert_eq!(v["reduced_block"], 8, "{r}");
    assert!(v["kept"].as_str().is_some_and(|k| !k.is_empty()), "{r}");
}
