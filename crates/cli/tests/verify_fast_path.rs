//! `verify --no-fast-path`: every operator goes to the e-graph, and the report is the same as
//! with the fast path (the fast path writes relations exactly as the e-graph's extraction does).

mod common;

use common::emit_zoo;
use std::path::Path;
use std::process::Command;

/// The JSON report of `verify --json --trace CASE [EXTRA]` without its timing, and the exit
/// code.
fn report(case: &Path, extra: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_shardproof"))
        .args(["verify", "--json", "--quiet", "--trace", "--jobs", "1"])
        .args(extra)
        .arg(case)
        .output()
        .unwrap();
    let mut json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    json.as_object_mut().unwrap().remove("seconds");
    (out.status.code().unwrap_or(-1), json.to_string())
}

#[test]
fn the_fast_path_switch_changes_nothing_in_the_report() {
    for (model, mesh, extra, code) in [
        ("mlp", "tp=2", &["--forward-only"][..], 0),
        ("llama", "tp=2", &["--forward-only"][..], 0),
        ("mlp", "tp=2", &["--bug", "tp-missing-allreduce"][..], 1),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let case = emit_zoo(model, dir.path(), mesh, extra);
        let with = report(&case, &[]);
        assert_eq!(with.0, code, "{model} {mesh}: {}", with.1);
        let without = report(&case, &["--no-fast-path"]);
        assert_eq!(with, without, "{model} {mesh} {extra:?}");
    }
}

#[test]
fn the_fast_path_switch_is_documented() {
    let out = Command::new(env!("CARGO_BIN_EXE_shardproof"))
        .args(["verify", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("--no-fast-path"), "{help}");
}
