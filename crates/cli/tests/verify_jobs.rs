//! `verify --jobs N`: the report is byte-identical at any thread count (the engine commits each
//! spec operator's relation in node order, whatever order the workers finish in).

mod common;

use common::{emit_zoo, entangle_samples};
use std::path::Path;
use std::process::Command;

/// The JSON report of `verify --json --jobs JOBS CASE` without its timing, and the exit code.
fn report(case: &Path, jobs: &str) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_shardproof"))
        .args(["verify", "--json", "--quiet", "--trace", "--jobs", jobs])
        .arg(case)
        .output()
        .unwrap();
    let mut json: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    json.as_object_mut().unwrap().remove("seconds");
    (out.status.code().unwrap_or(-1), json.to_string())
}

#[track_caller]
fn same_at_one_and_two_jobs(case: &Path, code: i32) {
    let one = report(case, "1");
    assert_eq!(one.0, code, "{}", one.1);
    assert_eq!(one, report(case, "2"), "{}", case.display());
}

#[test]
fn zoo_reports_are_the_same_at_one_and_two_jobs() {
    for (model, mesh, extra, code) in [
        ("mlp", "dp=2,tp=2", &[][..], 0),
        ("llama", "tp=2", &["--forward-only"][..], 0),
        ("gpt2", "tp=2", &["--forward-only"][..], 0),
        ("mlp", "tp=2", &["--bug", "tp-missing-allreduce"][..], 1),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let case = emit_zoo(model, dir.path(), mesh, extra);
        same_at_one_and_two_jobs(&case, code);
    }
}

#[test]
fn megatron_sample_reports_are_the_same_at_one_and_two_jobs() {
    let Some(samples) = entangle_samples() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(samples.join("case-tp2.yaml")).unwrap();
    let text = text.replace("gpt/", &format!("{}/", samples.join("gpt").display()))
        + "constants:\n  _tensor_constant0: 0\n  _tensor_constant1: 0.0\n  _tensor_constant2: 0\n  _tensor_constant3: 0.0\n";
    let case = dir.path().join("case.yaml");
    std::fs::write(&case, text).unwrap();
    same_at_one_and_two_jobs(&case, 0);
    same_at_one_and_two_jobs(&samples.join("case-bug-tp2.yaml"), 1);
}

#[test]
fn zero_jobs_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let case = emit_zoo("mlp", dir.path(), "tp=2", &["--forward-only"]);
    let out = Command::new(env!("CARGO_BIN_EXE_shardproof"))
        .args(["verify", "--jobs", "0"])
        .arg(&case)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}
