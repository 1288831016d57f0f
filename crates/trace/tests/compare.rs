//! End-to-end comparisons of synthetic traces: correct candidates hold, each planted bug is
//! found and localized, malformed traces are invalid input naming the file, and the result is
//! the same at any thread count.

use shardproof_trace::synthetic::{write_candidate, write_reference, Bug, Spec};
use shardproof_trace::{compare_dirs, Comparison, RunDtype, Status, Verdict};
use std::path::Path;

fn run(spec: &Spec, perturbed: u64) -> Comparison {
    let dir = tempfile::tempdir().unwrap();
    let (r, c) = (dir.path().join("ref"), dir.path().join("cand"));
    write_reference(&r, spec, perturbed).unwrap();
    write_candidate(&c, spec).unwrap();
    compare_dirs(&r, &c).unwrap()
}

fn with_bug(bug: Bug) -> Spec {
    Spec {
        bug: Some(bug),
        ..Spec::default()
    }
}

#[test]
fn correct_candidates_hold_in_every_dtype() {
    for dtype in [
        RunDtype::Float32,
        RunDtype::Bfloat16,
        RunDtype::Float16,
        RunDtype::Float64,
    ] {
        let spec = Spec {
            dtype,
            ..Spec::default()
        };
        let result = run(&spec, 2);
        assert_eq!(
            result.verdict,
            Verdict::Holds,
            "{dtype}: {}",
            result.render()
        );
        assert!(result.compared > 0 && result.tolerances.note.is_none());
        // The candidate's noise is real: errors are not zero, and tolerances are above them.
        assert!(result
            .tensors
            .iter()
            .any(|t| t.relative_error.unwrap() > 0.0));
    }
}

#[test]
fn a_divergent_module_is_the_first_divergence() {
    let result = run(
        &with_bug(Bug::Diverge {
            module: "layers.2.mlp".into(),
            relative: 0.05,
        }),
        1,
    );
    assert_eq!(result.verdict, Verdict::Violated);
    let first = &result.tensors[result.first_divergence.unwrap()];
    assert_eq!(
        first.id.to_string(),
        "it0/mb0/forward_output/layers.2.mlp/0"
    );
    assert!(first.ratio().unwrap() > 1.0);
    assert!(
        result.summary.contains("module `layers.2.mlp`"),
        "{}",
        result.summary
    );
    // Layers before it pass.
    let row = result
        .modules
        .iter()
        .find(|m| m.module == "layers.1.mlp")
        .unwrap();
    assert_eq!(row.findings, 0);
    assert!(result.render().contains("first divergence"));
}

#[test]
fn divergent_dp_replicas_are_a_bug_at_once() {
    let result = run(
        &with_bug(Bug::DivergentReplica {
            parameter: "layers.1.mlp.weight".into(),
        }),
        1,
    );
    assert_eq!(result.verdict, Verdict::Violated);
    let t = result.findings().next().unwrap();
    assert_eq!(t.status, Status::ReplicasDisagree, "{}", result.render());
    assert_eq!(t.id.module, "layers.1.mlp.weight");
    assert!(t.message().contains("from rank 1"), "{}", t.message());
}

#[test]
fn a_missing_module_and_a_missing_piece_are_findings() {
    let result = run(
        &with_bug(Bug::MissingModule {
            module: "layers.3.mlp".into(),
        }),
        1,
    );
    assert_eq!(result.verdict, Verdict::Violated);
    assert!(
        result
            .findings()
            .all(|t| t.status == Status::MissingInCandidate
                && t.id.module.starts_with("layers.3.mlp"))
    );
    let result = run(
        &with_bug(Bug::MissingPiece {
            module: "layers.0.mlp".into(),
        }),
        1,
    );
    assert_eq!(result.verdict, Verdict::Violated);
    let t = result.findings().next().unwrap();
    assert_eq!(t.status.rule(), Some("shard-omission"));
    assert!(t.message().contains("[0:8, 8:16]"), "{}", t.message());
}

#[test]
fn without_perturbed_runs_the_report_says_so() {
    let result = run(&Spec::default(), 0);
    assert_eq!(result.verdict, Verdict::Holds);
    let note = result.tolerances.note.as_deref().unwrap();
    assert!(note.contains("no perturbed run"), "{note}");
    assert!(result.render().contains("no perturbed run"));
}

#[test]
fn results_are_identical_at_any_thread_count() {
    let spec = Spec {
        hidden: 64,
        tokens: 300,
        bug: Some(Bug::Diverge {
            module: "layers.1.mlp".into(),
            relative: 0.01,
        }),
        ..Spec::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let (r, c) = (dir.path().join("ref"), dir.path().join("cand"));
    write_reference(&r, &spec, 1).unwrap();
    write_candidate(&c, &spec).unwrap();
    let at = |threads| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| serde_json::to_string(&compare_dirs(&r, &c).unwrap()).unwrap())
    };
    assert_eq!(at(1), at(4));
}

fn corrupt(file: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(file).unwrap();
    assert!(text.contains(from), "{from} not in {}", file.display());
    std::fs::write(file, text.replacen(from, to, 1)).unwrap();
}

#[test]
fn malformed_traces_are_invalid_input_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let (r, c) = (dir.path().join("ref"), dir.path().join("cand"));
    write_reference(&r, &Spec::default(), 1).unwrap();
    write_candidate(&c, &Spec::default()).unwrap();
    let err = |from: &str, to: &str, file: &str| {
        let path = c.join(file);
        let original = std::fs::read(&path).unwrap();
        corrupt(&path, from, to);
        let e = compare_dirs(&r, &c).unwrap_err().to_string();
        std::fs::write(&path, original).unwrap();
        e
    };
    let e = err("\"t000003\"", "\"t999999\"", "rank-00001/index.json");
    assert!(
        e.contains("rank-00001/tensors.safetensors: at tensor \"t999999\": missing"),
        "{e}"
    );
    let e = err("\"world_size\": 4", "\"world_size\": 5", "trace.json");
    assert!(e.contains("rank-00004/index.json: cannot read"), "{e}");
    let e = err("\"tp\": 1", "\"tp\": 7", "rank-00001/index.json");
    assert!(e.contains("at $.coords.tp: coordinate 7"), "{e}");
    let e = err(
        "\"dtype\": \"float32\"",
        "\"dtype\": \"bfloat16\"",
        "trace.json",
    );
    assert!(
        e.contains("stored as F32, but a bfloat16 run stores BF16"),
        "{e}"
    );
    // A truncated safetensors file.
    let st = c.join("rank-00000/tensors.safetensors");
    let bytes = std::fs::read(&st).unwrap();
    std::fs::write(&st, &bytes[..bytes.len() - 3]).unwrap();
    let e = compare_dirs(&r, &c).unwrap_err().to_string();
    assert!(
        e.contains("rank-00000/tensors.safetensors: not a valid safetensors file"),
        "{e}"
    );
    // The reference given as the candidate's perturbed run.
    let e = compare_dirs(&r.join("perturbed-0"), &c)
        .unwrap_err()
        .to_string();
    assert!(e.contains("expected a reference trace"), "{e}");
}
