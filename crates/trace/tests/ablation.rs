//! The ablation of seed 002 section 6.5 on synthetic traces: a fixed relative tolerance (3e-2,
//! what `shardproof run` uses in bf16) misjudges both ways, the perturbation tolerance does
//! not — a false alarm deep in a correct bf16 model, and a bug smaller than 3e-2 in f32.

use shardproof_trace::synthetic::{write_candidate, write_reference, Bug, Spec};
use shardproof_trace::{compare_dirs, Comparison, RunDtype, Status, Verdict};

const FIXED: f64 = 3e-2;

fn run(spec: &Spec) -> Comparison {
    let dir = tempfile::tempdir().unwrap();
    let (r, c) = (dir.path().join("ref"), dir.path().join("cand"));
    write_reference(&r, spec, 2).unwrap();
    write_candidate(&c, spec).unwrap();
    compare_dirs(&r, &c).unwrap()
}

#[test]
fn a_deep_bf16_model_is_no_false_alarm() {
    // Rounding noise grows as sqrt(layer): past some depth it exceeds any fixed tolerance.
    let spec = Spec {
        layers: 64,
        dtype: RunDtype::Bfloat16,
        ..Spec::default()
    };
    let result = run(&spec);
    assert_eq!(result.verdict, Verdict::Holds, "{}", result.render());
    let beyond_fixed = result
        .tensors
        .iter()
        .filter(|t| t.relative_error.unwrap() > FIXED)
        .count();
    assert!(
        beyond_fixed > 0,
        "a fixed tolerance of {FIXED} would have passed too"
    );
}

#[test]
fn a_bug_below_the_fixed_tolerance_is_caught() {
    let spec = Spec {
        dtype: RunDtype::Float32,
        bug: Some(Bug::Diverge {
            module: "layers.1.mlp".into(),
            relative: 1e-3,
        }),
        ..Spec::default()
    };
    let result = run(&spec);
    assert_eq!(result.verdict, Verdict::Violated);
    let first = &result.tensors[result.first_divergence.unwrap()];
    assert_eq!(
        (first.id.module.as_str(), first.status.clone()),
        ("layers.1.mlp", Status::Diverged)
    );
    assert!(
        first.relative_error.unwrap() < FIXED,
        "a fixed tolerance of {FIXED} would have caught it too"
    );
}
