//! Adversarial review: loss targets against `nll_loss`'s `ignore_index`, and `padding_idx`.
//!
//! A target equal to `ignore_index` (-100, what padded batches hold) is a valid input of the
//! spec, but the prover ranges every label over the classes `[0, C)` only (`kind_of` in
//! `equiv/inputs.rs`, `index_bound_known` in the interpreter): `t == ignore_index` folds to
//! false. A data-parallel loss averaging the ranks' own means is the spec's mean only where no
//! target is ignored (the case format's `assume: ignore-index: unused`); with one ignored
//! target on one rank it is another number, which the interpreter computes, yet the case
//! without the assumption is proved.
//!
//! Shape reduction shrinks `nll_loss`'s classes, and an embedding gradient's rows, with the
//! indices' range: a rank whose non-negative `ignore_index` (or `padding_idx`) names a class
//! (a row) that the reduced sizes do not have compares nothing there, and a rank ignoring
//! class 5 of 6 (zeroing row 5 of 6) is proved on reduced sizes, refuted (or undecided) at
//! full size.
//!
//! Pinned: the truth (interpreter), the right programs proved (the ranks summing their losses
//! and their target counts; the mean of means under the assumption), and the three holes as
//! ignored tests that fail while they are open.

use shardproof_ir::DType;
use shardproof_ops::{Meta, Tensor};
use shardproof_prove::{prove_case, ProveConfig, Verdict};
use std::collections::BTreeMap;
use std::path::Path;

const ROWS: usize = 4;
const CLASSES: usize = 6;

/// The spec: the mean cross-entropy of `ROWS` rows over `CLASSES` classes, ignore_index -100.
fn spec() -> String {
    format!(
        r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[{ROWS}, {CLASSES}]", labels: "i64[{ROWS}]"):
        _log_softmax: "f32[{ROWS}, {CLASSES}]" = torch.ops.aten._log_softmax.default(x, 1, False)
        nll_loss_forward = torch.ops.aten.nll_loss_forward.default(_log_softmax, labels, None, 1, -100)
        nll: "f32[]" = nll_loss_forward[0]
        total_weight: "f32[]" = nll_loss_forward[1]
        loss: "f32[]" = torch.ops.aten.clone.default(nll)
        return (loss,)
"#
    )
}

/// A dp = 2 rank averaging its own mean with the other's (Megatron's `average_losses_across_
/// data_parallel_group`): right only where both ranks count the same number of targets.
fn mean_of_means() -> String {
    let r = ROWS / 2;
    format!(
        r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[{r}, {CLASSES}]", labels: "i64[{r}]"):
        _log_softmax: "f32[{r}, {CLASSES}]" = torch.ops.aten._log_softmax.default(x, 1, False)
        nll_loss_forward = torch.ops.aten.nll_loss_forward.default(_log_softmax, labels, None, 1, -100)
        nll: "f32[]" = nll_loss_forward[0]
        total_weight: "f32[]" = nll_loss_forward[1]
        all_reduce: "f32[]" = torch.ops._c10d_functional.all_reduce.default(nll, 'sum', 'dp')
        wait_tensor: "f32[]" = torch.ops._c10d_functional.wait_tensor.default(all_reduce)
        loss: "f32[]" = torch.ops.aten.div.Scalar(wait_tensor, 2)
        return (loss,)
"#
    )
}

/// A dp = 2 rank summing its losses and its counted targets, then dividing: the spec's mean
/// whatever the labels (ignored ones included, as long as one target counts).
fn sum_over_count() -> String {
    let r = ROWS / 2;
    format!(
        r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[{r}, {CLASSES}]", labels: "i64[{r}]"):
        _log_softmax: "f32[{r}, {CLASSES}]" = torch.ops.aten._log_softmax.default(x, 1, False)
        nll_loss_forward = torch.ops.aten.nll_loss_forward.default(_log_softmax, labels, None, 2, -100)
        nll: "f32[]" = nll_loss_forward[0]
        total_weight: "f32[]" = nll_loss_forward[1]
        all_reduce: "f32[]" = torch.ops._c10d_functional.all_reduce.default(nll, 'sum', 'dp')
        wait_tensor: "f32[]" = torch.ops._c10d_functional.wait_tensor.default(all_reduce)
        all_reduce_1: "f32[]" = torch.ops._c10d_functional.all_reduce.default(total_weight, 'sum', 'dp')
        wait_tensor_1: "f32[]" = torch.ops._c10d_functional.wait_tensor.default(all_reduce_1)
        loss: "f32[]" = torch.ops.aten.div.Tensor(wait_tensor, wait_tensor_1)
        return (loss,)
"#
    )
}

fn write_case(dir: &Path, rank: &str, assume: bool) -> shardproof_case::Case {
    std::fs::write(dir.join("spec.py"), spec()).unwrap();
    std::fs::write(dir.join("r0.py"), rank).unwrap();
    std::fs::write(dir.join("r1.py"), rank).unwrap();
    let assume = if assume {
        "assume:\n  ignore-index: unused\n"
    } else {
        ""
    };
    std::fs::write(
        dir.join("case.yaml"),
        format!(
            "version: 1\nname: dploss\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ dp: 2 }}\n  graphs: [r0.py, r1.py]\n  groups:\n    \"dp\": dp\ninputs:\n  x: {{ dp: Shard(0) }}\n  labels: {{ dp: Shard(0) }}\noutputs:\n  loss: Replicate()\n{assume}"
        ),
    )
    .unwrap();
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}

/// The spec's loss and every rank's, by the interpreter, on irregular logits and `labels`.
fn run(case: &shardproof_case::Case, labels: [i64; ROWS]) -> (f64, Vec<f64>) {
    let x: Vec<f64> = (0..ROWS * CLASSES)
        .map(|i| ((i * 7919 + 13) % 101) as f64 / 17.0 - 2.5)
        .collect();
    let tensor =
        |dtype, shape: Vec<usize>, data: Vec<f64>| Tensor::new(Meta::new(dtype, shape), data);
    let leaves = |rows: std::ops::Range<usize>| {
        let n = rows.len();
        BTreeMap::from([
            (
                "x".to_string(),
                tensor(
                    DType::F32,
                    vec![n, CLASSES],
                    x[rows.start * CLASSES..rows.end * CLASSES].to_vec(),
                ),
            ),
            (
                "labels".to_string(),
                tensor(
                    DType::I64,
                    vec![n],
                    labels[rows].iter().map(|&l| l as f64).collect(),
                ),
            ),
        ])
    };
    let cfg = shardproof_interp::RunConfig::default();
    let spec = shardproof_interp::run_graph(&case.spec, &leaves(0..ROWS), &cfg).unwrap();
    let loss = |g: &shardproof_ir::Graph, env: &shardproof_interp::Env| {
        env.get(g.find("loss").unwrap()).unwrap().data[0]
    };
    let half = ROWS / 2;
    let ranks =
        shardproof_interp::run_program(&case.program, &[leaves(0..half), leaves(half..ROWS)], &cfg)
            .unwrap();
    let rank_losses = ranks
        .iter()
        .enumerate()
        .map(|(r, env)| loss(&case.program.ranks[r], env))
        .collect();
    (loss(&case.spec, &spec), rank_losses)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * (1.0 + a.abs())
}

#[test]
fn the_mean_of_means_differs_from_the_spec_once_one_target_is_ignored() {
    // The truth: on vocabulary labels both programs agree; with rank 0's first target
    // ignored, rank 0's mean is over one target and rank 1's over two, and their average is
    // not the spec's mean over three. The sum over the count agrees on both.
    let dir = tempfile::tempdir().unwrap();
    let wrong = write_case(dir.path(), &mean_of_means(), false);
    let (spec, ranks) = run(&wrong, [1, 2, 3, 4]);
    assert!(ranks.iter().all(|&r| close(spec, r)), "{spec} {ranks:?}");
    let (spec, ranks) = run(&wrong, [-100, 2, 3, 4]);
    assert!(spec.is_finite());
    assert!(ranks.iter().all(|&r| !close(spec, r)), "{spec} {ranks:?}");
    let dir = tempfile::tempdir().unwrap();
    let right = write_case(dir.path(), &sum_over_count(), false);
    for labels in [[1, 2, 3, 4], [-100, 2, 3, 4], [5, -100, -100, 0]] {
        let (spec, ranks) = run(&right, labels);
        assert!(ranks.iter().all(|&r| close(spec, r)), "{spec} {ranks:?}");
    }
}

#[test]
fn the_sum_over_the_count_is_proved() {
    let dir = tempfile::tempdir().unwrap();
    let case = write_case(dir.path(), &sum_over_count(), false);
    let proof = prove_case(&case, &ProveConfig::default());
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
}

#[test]
fn the_mean_of_means_is_proved_under_ignore_index_unused() {
    // With the assumption stated, labels are classes and the ranks count equal numbers of
    // targets: the mean of means is the mean, and proving it is right.
    let dir = tempfile::tempdir().unwrap();
    let case = write_case(dir.path(), &mean_of_means(), true);
    let proof = prove_case(&case, &ProveConfig::default());
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
}

#[test]
fn the_mean_of_means_is_not_proved_without_the_assumption() {
    let dir = tempfile::tempdir().unwrap();
    let case = write_case(dir.path(), &mean_of_means(), false);
    for run_first in [true, false] {
        let cfg = ProveConfig {
            run_first,
            ..ProveConfig::default()
        };
        let proof = prove_case(&case, &cfg);
        assert_ne!(
            proof.verdict,
            Verdict::Proved,
            "{run_first}: a program the interpreter shows wrong on labels [-100, 2, 3, 4]"
        );
    }
}

/// The verdicts with and without shape reduction.
fn reduced_and_full(case: &shardproof_case::Case) -> (Verdict, Verdict) {
    let at = |reduce| {
        prove_case(
            case,
            &ProveConfig {
                reduce,
                ..ProveConfig::default()
            },
        )
        .verdict
    };
    (at(true), at(false))
}

/// Ranks that sum over the count but ignore class 5 (`ignore_index = 5`, a class id as a pad
/// token would be), against the spec's -100: wrong wherever a target is 5.
fn ignoring_class_5() -> String {
    sum_over_count().replace("None, 2, -100)", "None, 2, 5)")
}

#[test]
fn a_rank_ignoring_a_class_is_refuted_at_full_size() {
    let dir = tempfile::tempdir().unwrap();
    let case = write_case(dir.path(), &ignoring_class_5(), false);
    let (spec, ranks) = run(&case, [5, 2, 3, 4]);
    assert!(ranks.iter().all(|&r| !close(spec, r)), "{spec} {ranks:?}");
    assert_eq!(reduced_and_full(&case).1, Verdict::Refuted);
}

#[test]
fn a_rank_ignoring_a_class_is_not_proved_on_reduced_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let case = write_case(dir.path(), &ignoring_class_5(), false);
    let (reduced, full) = reduced_and_full(&case);
    assert_eq!(full, Verdict::Refuted);
    assert_ne!(reduced, Verdict::Proved);
}

/// The gradient of a 6-row embedding table over 4 tokens (`padding_idx` as given: the row
/// whose gradient is zeroed, -1 for none).
fn table_grad(padding_idx: i64) -> String {
    format!(
        r#"class GraphModule(torch.nn.Module):
    def forward(self, grad: "f32[4, 3]", tokens: "i64[4]"):
        table: "f32[6, 3]" = torch.ops.aten.embedding_dense_backward.default(grad, tokens, 6, {padding_idx}, False)
        return (table,)
"#
    )
}

#[test]
fn a_rank_zeroing_a_padding_row_is_not_proved_on_reduced_sizes() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("spec.py"), table_grad(-1)).unwrap();
    std::fs::write(dir.path().join("r0.py"), table_grad(5)).unwrap();
    std::fs::write(dir.path().join("r1.py"), table_grad(5)).unwrap();
    std::fs::write(
        dir.path().join("case.yaml"),
        "version: 1\nname: padrow\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r1.py]\ninputs:\n  grad: Replicate()\n  tokens: Replicate()\noutputs:\n  table: Replicate()\n",
    )
    .unwrap();
    let case = shardproof_case::load_case(&dir.path().join("case.yaml")).unwrap();
    // The truth: on tokens holding 5 the ranks' row 5 is 0, the spec's is not.
    let cfg = shardproof_interp::RunConfig::default();
    let grad = Tensor::new(
        Meta::new(DType::F32, vec![4, 3]),
        (0..12).map(|i| i as f64 + 1.0).collect(),
    );
    let tokens = Tensor::new(Meta::new(DType::I64, vec![4]), vec![5.0, 1.0, 5.0, 0.0]);
    let leaves = BTreeMap::from([("grad".to_string(), grad), ("tokens".to_string(), tokens)]);
    let row5 = |g: &shardproof_ir::Graph| {
        let env = shardproof_interp::run_graph(g, &leaves, &cfg).unwrap();
        env.get(g.find("table").unwrap()).unwrap().data[15..18].to_vec()
    };
    assert_eq!(row5(&case.spec), vec![8.0, 10.0, 12.0]);
    assert_eq!(row5(&case.program.ranks[0]), vec![0.0, 0.0, 0.0]);
    // The tokens range over the backward's 6 rows (an index use), so a witness holding 5 is
    // drawn and the interpreter confirms it at full size; reduced, the padding row keeps the
    // table's rows and the same refutation is found.
    assert_eq!(
        reduced_and_full(&case),
        (Verdict::Refuted, Verdict::Refuted)
    );
}
