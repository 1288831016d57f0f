//! Adversarial review of the `scale:` key on case inputs (`load_case_with_scales`,
//! `Case::scales()`, `stage/scale.rs`): a scaled cut holds `rank tensor = c · piece`.
//!
//! The programs: the spec computes `h = 3·x`, `y = 5·h`; each rank (tp = 2, everything
//! replicated) computes `h = (3·k)·x` and `y = (5/k)·h`, so its `y` is the spec's whatever `k`
//! and its `h` is `k` times the spec's. Stated with the right scale the case is proved, with a
//! wrong one (or none) refuted at the cut's stage, never proved; `scale: 0` and negative
//! scales are refused when the case is read. An `outputs:` entry naming the scaled cut states
//! the *unscaled* relation (the case format refuses `scale` on outputs), which is false where
//! `k != 1`: it must not be proved (a known hole, ignored). A scaled `Partial` cut (a
//! row-parallel product) is proved at its scale only.

use shardproof_prove::{prove_staged_with, PlanOptions, ProveConfig, Verdict};
use std::path::Path;

fn spec() -> &'static str {
    r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[4, 2]"):
        h: "f32[4, 2]" = torch.ops.aten.mul.Tensor(x, 3)
        y: "f32[4, 2]" = torch.ops.aten.mul.Tensor(h, 5)
        return (y,)
"#
}

/// A rank whose `h` is `k` times the spec's and whose `y` is the spec's.
fn rank(k: u32) -> String {
    let (first, second) = (3 * k, 5.0 / f64::from(k));
    format!(
        r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[4, 2]"):
        h: "f32[4, 2]" = torch.ops.aten.mul.Tensor(x, {first})
        y: "f32[4, 2]" = torch.ops.aten.mul.Tensor(h, {second:?})
        return (y,)
"#
    )
}

/// The case with the cut `h` stated by `h_entry`, and `outputs` (yaml lines).
fn write(
    dir: &Path,
    k: u32,
    h_entry: &str,
    outputs: &str,
) -> Result<shardproof_case::Case, String> {
    std::fs::write(dir.join("spec.py"), spec()).unwrap();
    std::fs::write(dir.join("r0.py"), rank(k)).unwrap();
    std::fs::write(dir.join("r1.py"), rank(k)).unwrap();
    std::fs::write(
        dir.join("case.yaml"),
        format!(
            "version: 1\nname: scaled\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ tp: 2 }}\n  graphs: [r0.py, r1.py]\ninputs:\n  x: Replicate()\n  h: {h_entry}\noutputs:\n{outputs}"
        ),
    )
    .unwrap();
    shardproof_case::load_case_with_scales(&dir.join("case.yaml")).map_err(|e| e.to_string())
}

/// The case proved as `shardproof prove` proves a case with scales: in stages, the scales
/// from the case.
fn prove(case: &shardproof_case::Case) -> Verdict {
    let opts = PlanOptions {
        scales: case.scales(),
        ..PlanOptions::default()
    };
    let cfg = ProveConfig {
        run_first: false,
        ..ProveConfig::default()
    };
    prove_staged_with(case, &cfg, 1, &opts).verdict
}

const Y: &str = "  y: Replicate()\n";

#[test]
fn the_right_scale_is_proved_and_a_wrong_one_is_not() {
    let dir = tempfile::tempdir().unwrap();
    for (k, entry, want) in [
        (2, "{ placement: Replicate(), scale: 2 }", Verdict::Proved),
        (1, "Replicate()", Verdict::Proved),
        (1, "{ placement: Replicate(), scale: 1 }", Verdict::Proved),
        // The rank's h is twice the spec's: unscaled, or at 3, the cut is false.
        (2, "Replicate()", Verdict::Refuted),
        (2, "{ placement: Replicate(), scale: 3 }", Verdict::Refuted),
        (2, "{ placement: Replicate(), scale: 1 }", Verdict::Refuted),
        // Unscaled ranks stated as scaled.
        (1, "{ placement: Replicate(), scale: 2 }", Verdict::Refuted),
    ] {
        let case = write(dir.path(), k, entry, Y).unwrap();
        assert_eq!(prove(&case), want, "k = {k}, h: {entry}");
    }
}

#[test]
fn a_scale_of_zero_or_below_is_refused_when_read() {
    let dir = tempfile::tempdir().unwrap();
    for (entry, why) in [
        ("{ placement: Replicate(), scale: 0 }", "at least 1"),
        ("{ placement: Replicate(), scale: -2 }", "at least 1"),
        ("{ placement: Replicate(), scale: 1.5 }", "integer"),
    ] {
        let err = write(dir.path(), 2, entry, Y).unwrap_err();
        assert!(err.contains(why), "{entry}: {err}");
    }
}

#[test]
fn a_scale_is_read_by_the_prover_only() {
    // `load_case` (every other reader) refuses a case with a scale rather than check the
    // unscaled relation.
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), 2, "{ placement: Replicate(), scale: 2 }", Y).unwrap();
    let err = shardproof_case::load_case(&dir.path().join("case.yaml")).unwrap_err();
    assert!(err.to_string().contains("scale"), "{err}");
}

#[test]
fn an_output_entry_naming_a_scaled_cut_states_the_unscaled_relation() {
    // The ranks' h is twice the spec's: `outputs: h: Replicate()` claims it equal, false.
    let dir = tempfile::tempdir().unwrap();
    let case = write(
        dir.path(),
        2,
        "{ placement: Replicate(), scale: 2 }",
        "  y: Replicate()\n  h: Replicate()\n",
    )
    .unwrap();
    assert_ne!(prove(&case), Verdict::Proved);
}

#[test]
fn an_output_entry_naming_an_unscaled_cut_is_checked_as_stated() {
    // The control for the test above: with ranks holding the spec's h (k = 1), the same
    // entries are proved; with k = 2 and no scale anywhere, refuted.
    let dir = tempfile::tempdir().unwrap();
    let outputs = "  y: Replicate()\n  h: Replicate()\n";
    let case = write(dir.path(), 1, "Replicate()", outputs).unwrap();
    assert_eq!(prove(&case), Verdict::Proved);
    let case = write(dir.path(), 2, "Replicate()", outputs).unwrap();
    assert_eq!(prove(&case), Verdict::Refuted);
}

/// A row-parallel product on tp = 2: the spec's `h = x @ w`, `y = 5·h`; each rank's `h` is
/// `k` times its partial product and `y` the all-reduce of its `h` times `5/k`.
fn partial_case(dir: &Path, k: u32, h_entry: &str) -> shardproof_case::Case {
    std::fs::write(
        dir.join("spec.py"),
        r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[4, 4]", w: "f32[4, 2]"):
        h: "f32[4, 2]" = torch.ops.aten.mm.default(x, w)
        y: "f32[4, 2]" = torch.ops.aten.mul.Tensor(h, 5)
        return (y,)
"#,
    )
    .unwrap();
    let rank = format!(
        r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[4, 2]", w: "f32[2, 2]"):
        mm: "f32[4, 2]" = torch.ops.aten.mm.default(x, w)
        h: "f32[4, 2]" = torch.ops.aten.mul.Tensor(mm, {k})
        all_reduce: "f32[4, 2]" = torch.ops._c10d_functional.all_reduce.default(h, 'sum', 'tp')
        wait_tensor: "f32[4, 2]" = torch.ops._c10d_functional.wait_tensor.default(all_reduce)
        y: "f32[4, 2]" = torch.ops.aten.mul.Tensor(wait_tensor, {:?})
        return (y,)
"#,
        5.0 / f64::from(k)
    );
    std::fs::write(dir.join("r0.py"), &rank).unwrap();
    std::fs::write(dir.join("r1.py"), &rank).unwrap();
    std::fs::write(
        dir.join("case.yaml"),
        format!(
            "version: 1\nname: partial\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ tp: 2 }}\n  graphs: [r0.py, r1.py]\n  groups:\n    \"tp\": tp\ninputs:\n  x: Shard(1)\n  w: Shard(0)\n  h: {h_entry}\noutputs:\n  y: Replicate()\n"
        ),
    )
    .unwrap();
    shardproof_case::load_case_with_scales(&dir.join("case.yaml")).unwrap()
}

#[test]
fn a_scaled_partial_cut_is_proved_at_its_scale_only() {
    // Partial shares: the ranks' h sum to k times the spec's.
    let dir = tempfile::tempdir().unwrap();
    for (k, entry, want) in [
        (2, "{ placement: Partial(), scale: 2 }", Verdict::Proved),
        (1, "Partial()", Verdict::Proved),
        (2, "Partial()", Verdict::Refuted),
        (2, "{ placement: Partial(), scale: 4 }", Verdict::Refuted),
        (1, "{ placement: Partial(), scale: 2 }", Verdict::Refuted),
    ] {
        let case = partial_case(dir.path(), k, entry);
        assert_eq!(prove(&case), want, "k = {k}, h: {entry}");
    }
}
