//! `shardproof check PLAN`: a `.plan` file is read as a plan (docs/formats/plan.md), with the
//! exit codes of every engine: 0 holds, 1 violated, 2 invalid input.

use std::path::PathBuf;
use std::process::Command;

fn plan(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/plans")
        .join(format!("{name}.plan"))
}

fn check(path: &std::path::Path, json: bool) -> (i32, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_shardproof"));
    cmd.arg("check").arg(path).arg("--quiet");
    if json {
        cmd.arg("--json");
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn plans_get_the_exit_codes_of_their_verdicts() {
    let (code, out, _) = check(&plan("tp_linear"), false);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("holds"), "{out}");
    let (code, out, _) = check(&plan("tp_linear_missing_allreduce"), false);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("insert all_reduce(sum) over tp after `y_partial`"),
        "{out}"
    );
    let (code, out, _) = check(&plan("overlap_demo"), true);
    assert_eq!(code, 1, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f["check"] == "missing-wait"));
}

#[test]
fn an_invalid_plan_is_exit_2_with_its_position_and_a_hint() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.plan");
    std::fs::write(
        &p,
        "mesh tp=2\ninput x: f32[8] tp=Shard(0)\ny = all_reduce(x, sum, dp)\n",
    )
    .unwrap();
    let (code, out, err) = check(&p, false);
    assert_eq!(code, 2, "{out}{err}");
    let text = format!("{out}{err}");
    assert!(
        text.contains("bad.plan:3:24: `dp` is not a group"),
        "{text}"
    );
    assert!(text.contains("hint: name a group: tp"), "{text}");
}
