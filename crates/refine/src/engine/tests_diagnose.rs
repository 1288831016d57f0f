//! Diagnosis tests on whole cases: where a refutation is located, and evidence checks that
//! must stay bounded on tensors of real size.

use super::{verify, Options, Verdict};
use std::path::Path;

/// An element-wise program `tanh(add(x, y))` over `f32[rows, cols]`; with `drop_y`, a rank's
/// program that adds `x` to itself and never reads its `y` (a dropped input).
fn elementwise(rows: usize, cols: usize, drop_y: bool) -> String {
    let y = if drop_y { "x" } else { "y" };
    let t = format!("\"f32[{rows}, {cols}]\"");
    format!(
        "class GraphModule(torch.nn.Module):\n    def forward(self, x: {t}, y: {t}):\n        add: {t} = torch.ops.aten.add.Tensor(x, {y})\n        tanh: {t} = torch.ops.aten.tanh.default(add)\n        return (tanh,)\n"
    )
}

/// Writes the element-wise case over `2^15 x 2^15` (2^30 elements) on tp=2 into `dir`, its
/// ranks dropping `y`, and loads it.
fn huge_case(dir: &Path) -> shardproof_case::Case {
    const N: usize = 1 << 15;
    std::fs::write(dir.join("spec.py"), elementwise(N, N, false)).unwrap();
    for r in 0..2 {
        std::fs::write(dir.join(format!("r{r}.py")), elementwise(N / 2, N, true)).unwrap();
    }
    let case = "version: 1\nname: huge-elementwise\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r1.py]\ninputs:\n  x: Shard(0)\n  y: Shard(0)\n";
    std::fs::write(dir.join("case.yaml"), case).unwrap();
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}

/// A dropped input on 2^30-element tensors is refuted from shapes and relations alone: the
/// row-alignment evidence, which needs an id per element (16 GiB here), is not computed, and
/// the diagnosis says so instead of allocating.
#[test]
fn a_huge_elementwise_case_is_refuted_without_per_element_evidence() {
    let dir = tempfile::tempdir().unwrap();
    let case = huge_case(dir.path());
    let started = std::time::Instant::now();
    let o = verify(&case, &Options::default());
    assert_eq!(o.verdict, Verdict::Refuted, "{o:#?}");
    let f = o.failure.as_ref().unwrap();
    assert_eq!(f.operator, "add", "{f:#?}");
    assert!(
        f.hint
            .as_deref()
            .is_some_and(|h| h.contains("no implementation operator reads")),
        "{f:#?}"
    );
    assert!(
        f.not_computed
            .as_deref()
            .is_some_and(|n| n.contains("not computed")),
        "{f:#?}"
    );
    // Not a timed assertion on speed: a bound far above the few milliseconds it takes, which
    // filling 16 GiB of ids could not meet.
    assert!(started.elapsed().as_secs() < 60, "{:?}", started.elapsed());
}

/// The same case at a size the ids fit: the check runs (no `not_computed`), and the verdict and
/// location are those of the huge case.
#[test]
fn the_row_check_runs_below_its_bound() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("spec.py"), elementwise(8, 4, false)).unwrap();
    for r in 0..2 {
        std::fs::write(dir.path().join(format!("r{r}.py")), elementwise(4, 4, true)).unwrap();
    }
    let case = "version: 1\nname: small-elementwise\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r1.py]\ninputs:\n  x: Shard(0)\n  y: Shard(0)\n";
    std::fs::write(dir.path().join("case.yaml"), case).unwrap();
    let case = shardproof_case::load_case(&dir.path().join("case.yaml")).unwrap();
    let o = verify(&case, &Options::default());
    assert_eq!(o.verdict, Verdict::Refuted, "{o:#?}");
    let f = o.failure.as_ref().unwrap();
    assert_eq!(f.operator, "add", "{f:#?}");
    assert!(f.not_computed.is_none(), "{f:#?}");
}

/// A Llama block captured from PyTorch's sequence-parallel plan with the FFN's down projection
/// (`feed_forward.w2`) left without its reduce-scatter: the refutation names the FFN's residual
/// add (line 144), not the attention's (line 143), whose value the ranks reduced correctly
/// although inference also writes it as a sum of unreduced parts.
#[test]
fn a_dropped_ffn_reduction_is_located_at_the_ffn_residual() {
    let case =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("src/engine/testdata/llama_sp_w2/case.yaml");
    let case = shardproof_case::load_case(&case).unwrap();
    let o = verify(&case, &Options::default());
    assert_eq!(o.verdict, Verdict::Refuted, "{o:#?}");
    let f = o.failure.as_ref().unwrap();
    assert_eq!(
        (f.operator.as_str(), f.op.as_str()),
        ("add_3", "aten.add.Tensor"),
        "{f:#?}"
    );
    assert!(
        f.source
            .as_deref()
            .is_some_and(|s| s.starts_with("models.py:144 ")),
        "{f:#?}"
    );
}
