//! The second-size check (docs/prove/reduction.md, "Second-size check"): a proof on reduced
//! shapes is checked at the next admissible sizes above them, where a coincidence of the
//! reduction shows as a difference; a correct program stays proved and reports the sizes.

use shardproof_prove::equiv::second_size::COINCIDENCE;
use shardproof_prove::reduce::{reduce_case, reduce_case_above};
use shardproof_prove::{prove_case, prove_case_or_full_size, ProveConfig, Verdict};
use std::path::Path;

/// Writes `spec.py`, `r0.py` (every rank's graph) and a `tp=2` case with the given `inputs:`
/// and `outputs:` lines, and loads it.
fn write_case(
    dir: &Path,
    spec: &str,
    rank: &str,
    inputs: &str,
    outputs: &str,
) -> shardproof_case::Case {
    std::fs::write(dir.join("spec.py"), spec).unwrap();
    std::fs::write(dir.join("r0.py"), rank).unwrap();
    std::fs::write(
        dir.join("case.yaml"),
        format!("version: 1\nname: second-size\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ tp: 2 }}\n  graphs: [r0.py, r0.py]\ninputs:\n{inputs}outputs:\n{outputs}"),
    )
    .unwrap();
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}

/// A column-parallel linear layer and a ReLU: `y = relu(x @ w)` with `x: [rows, k]`
/// replicated, `w: [k, n]` and `y` sharded on their columns over `tp = 2`.
fn column_parallel(dir: &Path, rows: u64, k: u64, n: u64) -> shardproof_case::Case {
    let half = n / 2;
    let spec = format!(
        "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[{rows}, {k}]\", w: \"f32[{k}, {n}]\"):\n        h: \"f32[{rows}, {n}]\" = torch.ops.aten.mm.default(x, w)\n        y: \"f32[{rows}, {n}]\" = torch.ops.aten.relu.default(h)\n        return (y,)\n"
    );
    let rank = format!(
        "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[{rows}, {k}]\", w: \"f32[{k}, {half}]\"):\n        h: \"f32[{rows}, {half}]\" = torch.ops.aten.mm.default(x, w)\n        y: \"f32[{rows}, {half}]\" = torch.ops.aten.relu.default(h)\n        return (y,)\n"
    );
    write_case(
        dir,
        &spec,
        &rank,
        "  x: Replicate()\n  w: Shard(1)\n",
        "  y: Shard(1)\n",
    )
}

/// A rank returning `sum(x, 0) / k` with `k = (s + s) / s` (2 in the normal form) for the
/// spec's `mean(x, 0)` over `rows`: right at 2 rows only, and no literal is written.
fn halved_sum(dir: &Path, rows: u64, cols: u64) -> shardproof_case::Case {
    let spec = format!(
        "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[{rows}, {cols}]\"):\n        y: \"f32[{cols}]\" = torch.ops.aten.mean.dim(x, [0])\n        return (y,)\n"
    );
    let rank = format!(
        "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[{rows}, {cols}]\"):\n        s: \"f32[{cols}]\" = torch.ops.aten.sum.dim_IntList(x, [0])\n        ss: \"f32[{cols}]\" = torch.ops.aten.add.Tensor(s, s)\n        k: \"f32[{cols}]\" = torch.ops.aten.div.Tensor(ss, s)\n        y: \"f32[{cols}]\" = torch.ops.aten.div.Tensor(s, k)\n        return (y,)\n"
    );
    write_case(
        dir,
        &spec,
        &rank,
        "  x: Replicate()\n",
        "  y: Replicate()\n",
    )
}

/// Several dims reduced: the proof stands, and its summary names every size at both
/// reductions, each second size strictly above the first and at most the original.
#[test]
fn a_correct_program_with_several_reduced_dims_stays_proved_and_reports_the_second_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let case = column_parallel(dir.path(), 8, 12, 16);
    let proof = prove_case(&case, &ProveConfig::default());
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
    let reduction = proof.reduction.as_ref().expect("reduced");
    let check = reduction.second_size.as_ref().expect("the check ran");
    assert_eq!(check.outcome, "agreed", "{check:?}");
    assert!(!check.full_size, "{check:?}");
    assert!(check.elements > 0, "{check:?}");
    let grown: Vec<_> = check
        .sizes
        .iter()
        .filter(|s| s.first < s.original)
        .collect();
    assert!(grown.len() >= 3, "{:?}", check.sizes);
    for s in &check.sizes {
        if s.first < s.original {
            assert!(s.first < s.second && s.second <= s.original, "{s:?}");
        } else {
            assert_eq!(s.second, s.original, "{s:?}");
        }
    }
    // The JSON a user reads carries it.
    let json = serde_json::to_value(&proof).unwrap();
    assert_eq!(
        json["reduction"]["second_size"]["outcome"], "agreed",
        "{json}"
    );
}

/// A dim sharded over `tp = 2` is `2·v`: its second size is the next multiple of 2 above its
/// first, so the shards stay equal and non-empty.
#[test]
fn a_dim_divisible_by_tp_gets_an_admissible_second_size() {
    let dir = tempfile::tempdir().unwrap();
    let case = column_parallel(dir.path(), 8, 12, 16);
    let first = reduce_case(&case).unwrap();
    let second = reduce_case_above(&case, &first)
        .unwrap()
        .expect("some size can grow");
    let width = |r: &shardproof_prove::reduce::Reduction| {
        r.inputs.iter().find(|(n, _, _)| n == "w").unwrap().2[1]
    };
    let (a, b) = (width(&first), width(&second));
    assert_eq!(a % 2, 0, "{a}");
    assert_eq!(b % 2, 0, "{b}");
    assert!(a < b && b <= 16, "{a} -> {b}");
    let proof = prove_case(&case, &ProveConfig::default());
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
}

/// A coincidence below the original size: proved at 2 rows, different at 3 (of 8), so the
/// proof is withdrawn, naming both sizes; the full-size proof then refutes it.
#[test]
fn a_coincidence_below_the_original_size_withdraws_the_proof() {
    let dir = tempfile::tempdir().unwrap();
    let case = halved_sum(dir.path(), 8, 3);
    let proof = prove_case(&case, &ProveConfig::default());
    assert_eq!(proof.verdict, Verdict::Inconclusive, "{:?}", proof.message);
    let message = proof.message.clone().unwrap_or_default();
    assert!(message.contains(COINCIDENCE), "{message}");
    assert!(
        message.contains("= 2}") && message.contains("= 3}"),
        "{message}"
    );
    let check = proof
        .reduction
        .as_ref()
        .and_then(|r| r.second_size.as_ref())
        .expect("the check ran");
    assert_eq!(check.outcome, "differed", "{check:?}");
    assert!(!check.full_size);
    assert!(proof.counterexample.is_none());
    let (full, at_full_size) = prove_case_or_full_size(&case, &ProveConfig::default());
    assert_eq!(full.verdict, Verdict::Refuted, "{:?}", full.message);
    assert!(at_full_size);
}

/// A coincidence whose second sizes are the case's own (3 rows reduce to 2, and the next size
/// is 3): the difference is a refutation, confirmed by the interpreter.
#[test]
fn a_coincidence_at_the_original_size_is_a_confirmed_refutation() {
    let dir = tempfile::tempdir().unwrap();
    let case = halved_sum(dir.path(), 3, 2);
    let proof = prove_case(&case, &ProveConfig::default());
    assert_eq!(proof.verdict, Verdict::Refuted, "{:?}", proof.message);
    assert!(proof.counterexample.is_some());
    let message = proof.message.clone().unwrap_or_default();
    assert!(
        message.contains("the case's own sizes") && message.contains("interpreter confirms"),
        "{message}"
    );
    let check = proof
        .reduction
        .as_ref()
        .and_then(|r| r.second_size.as_ref())
        .expect("the check ran");
    assert!(check.full_size, "{check:?}");
    assert_eq!(check.outcome, "differed");
}

/// Where the reduction is the full size already (every dim at its smallest), nothing is
/// checked: no second reduction exists and the summary records no check; nor without
/// reduction.
#[test]
fn the_check_never_runs_at_full_size() {
    let dir = tempfile::tempdir().unwrap();
    let case = column_parallel(dir.path(), 2, 2, 4);
    let first = reduce_case(&case).unwrap();
    assert!(first.sizes.iter().all(|s| s.reduced == s.original));
    assert!(reduce_case_above(&case, &first).unwrap().is_none());
    let proof = prove_case(&case, &ProveConfig::default());
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
    let reduction = proof.reduction.as_ref().expect("reduction ran");
    assert!(
        reduction.second_size.is_none(),
        "{:?}",
        reduction.second_size
    );
    let unreduced = prove_case(
        &case,
        &ProveConfig {
            reduce: false,
            ..ProveConfig::default()
        },
    );
    assert_eq!(unreduced.verdict, Verdict::Proved);
    assert!(unreduced.reduction.is_none());
}

/// A check that cannot run (its case over the element limit) leaves no proof: a proof would
/// then stand on a path that skipped the check.
#[test]
fn a_check_over_the_element_limit_withdraws_the_proof() {
    let dir = tempfile::tempdir().unwrap();
    let case = column_parallel(dir.path(), 8, 12, 16);
    let proof = prove_case(&case, &ProveConfig::default());
    let check = proof
        .reduction
        .as_ref()
        .and_then(|r| r.second_size.as_ref())
        .expect("the check ran");
    let first_elements = proof.reduction.as_ref().unwrap().elements_after;
    assert!(first_elements < check.program_elements, "{check:?}");
    let limited = prove_case(
        &case,
        &ProveConfig {
            max_run_elements: first_elements,
            ..ProveConfig::default()
        },
    );
    assert_eq!(
        limited.verdict,
        Verdict::Inconclusive,
        "{:?}",
        limited.message
    );
    let check = limited
        .reduction
        .as_ref()
        .and_then(|r| r.second_size.as_ref())
        .expect("the check was tried");
    assert_eq!(check.outcome, "not-completed", "{check:?}");
}

/// A staged proof checks each distinct stage at its second sizes: the output stage of a case
/// cut at `h = x + x` holds the coincidence (`sum(h) / k` for `mean(h)` over 8 rows, right at
/// 2) and is not proved, though the cut's stage is.
#[test]
fn a_coincidence_in_a_stage_is_not_proved() {
    let dir = tempfile::tempdir().unwrap();
    let spec = "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[8, 3]\"):\n        h: \"f32[8, 3]\" = torch.ops.aten.add.Tensor(x, x)\n        y: \"f32[3]\" = torch.ops.aten.mean.dim(h, [0])\n        return (y,)\n";
    let rank = "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[8, 3]\"):\n        h: \"f32[8, 3]\" = torch.ops.aten.add.Tensor(x, x)\n        s: \"f32[3]\" = torch.ops.aten.sum.dim_IntList(h, [0])\n        ss: \"f32[3]\" = torch.ops.aten.add.Tensor(s, s)\n        k: \"f32[3]\" = torch.ops.aten.div.Tensor(ss, s)\n        y: \"f32[3]\" = torch.ops.aten.div.Tensor(s, k)\n        return (y,)\n";
    let case = write_case(
        dir.path(),
        spec,
        rank,
        "  x: Replicate()\n  h: Replicate()\n",
        "  y: Replicate()\n",
    );
    let staged = shardproof_prove::prove_staged(&case, &ProveConfig::default(), 1);
    assert_ne!(staged.verdict, Verdict::Proved, "{:?}", staged.message);
    let targets: Vec<&str> = staged.stages.iter().map(|s| s.target.as_str()).collect();
    assert_eq!(targets, ["cut `h`", "output `y`"]);
    assert_eq!(staged.stages[0].verdict, Some(Verdict::Proved));
    let last = &staged.stages[1];
    assert_eq!(last.verdict, Some(Verdict::Inconclusive));
    let message = last.message.clone().unwrap_or_default();
    assert!(message.contains(COINCIDENCE), "{message}");
}

/// Integer inputs of unknown range (indices an embedding backward reads through a slice,
/// which the range walk does not follow) are not shown within the backward's rows: the case
/// is refused before any check (the kernel fails on a row past them, which the rows' equality
/// tests would drop), never proved on draws that happen to be valid rows.
#[test]
fn integers_of_unknown_range_read_as_rows_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let graph = "class GraphModule(torch.nn.Module):\n    def forward(self, g: \"f32[6, 4]\", idx: \"i64[6]\"):\n        s: \"i64[6]\" = torch.ops.aten.slice.Tensor(idx, 0, 0, 6)\n        y: \"f32[8, 4]\" = torch.ops.aten.embedding_dense_backward.default(g, s, 8, -1, False)\n        return (y,)\n";
    let case = write_case(
        dir.path(),
        graph,
        graph,
        "  g: Replicate()\n  idx: Replicate()\n",
        "  y: Replicate()\n",
    );
    let proof = prove_case(&case, &ProveConfig::default());
    assert_eq!(proof.verdict, Verdict::Inconclusive, "{:?}", proof.message);
    let message = proof.message.clone().unwrap_or_default();
    assert!(message.contains("may fall outside"), "{message}");
}
