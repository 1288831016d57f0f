//! `shardproof zoo`: every emitted correct plan verifies with `run`, every planted bug is found
//! naming an output it changes, and `inspect --strict` accepts every emitted case.

use shardproof_zoo::BUGS;
use std::path::Path;
use std::process::{Command, Output};

fn shardproof(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shardproof"))
        .args(args)
        .output()
        .expect("run shardproof")
}

fn text(o: &Output) -> String {
    format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[track_caller]
fn expect(o: &Output, code: i32, what: &str) -> String {
    assert_eq!(o.status.code(), Some(code), "{what}\n{}", text(o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Emits into `dir` and returns the case path.
fn emit(dir: &Path, mesh: &str, forward_only: bool, layers: &str, bug: Option<&str>) -> String {
    let out = dir.to_str().unwrap();
    let mut args = vec![
        "zoo", "emit", "mlp", "--mesh", mesh, "--layers", layers, "-o", out,
    ];
    if forward_only {
        args.push("--forward-only");
    }
    if let Some(b) = bug {
        args.extend(["--bug", b]);
    }
    expect(&shardproof(&args), 0, &format!("{args:?}"));
    dir.join("case.yaml").to_str().unwrap().to_string()
}

#[test]
fn correct_plans_hold_and_bugs_are_found() {
    let meshes = [
        ("tp=2", 1, 2),
        ("dp=2", 2, 1),
        ("dp=2,tp=2", 2, 2),
        ("tp=4", 1, 4),
    ];
    for (mesh, dp, tp) in meshes {
        for forward_only in [true, false] {
            let layers = if tp > 1 && !forward_only { "2" } else { "1" };
            let tmp = tempfile::tempdir().unwrap();
            let what = format!("mesh {mesh}, forward_only {forward_only}");
            let case = emit(&tmp.path().join("ok"), mesh, forward_only, layers, None);
            let out = expect(&shardproof(&["run", &case]), 0, &what);
            assert!(out.contains("verdict: holds"), "{what}\n{out}");
            expect(&shardproof(&["inspect", "--strict", &case]), 0, &what);
            for bug in BUGS {
                if bug.check_applies(dp, tp, forward_only).is_err() {
                    continue;
                }
                let what = format!("{what}, bug {}", bug.id);
                let case = emit(
                    &tmp.path().join(bug.id),
                    mesh,
                    forward_only,
                    layers,
                    Some(bug.id),
                );
                expect(&shardproof(&["inspect", "--strict", &case]), 0, &what);
                let out = expect(&shardproof(&["run", &case]), 1, &what);
                let first = out
                    .split("first mismatching output `")
                    .nth(1)
                    .and_then(|r| r.split('`').next())
                    .unwrap_or_else(|| panic!("{what}: no mismatching output named\n{out}"));
                if bug.changes_loss {
                    assert_eq!(first, "loss", "{what}\n{out}");
                } else {
                    assert!(first.ends_with("_new"), "{what}\n{out}");
                }
            }
        }
    }
}

#[test]
fn list_shows_models_and_bugs() {
    let out = expect(&shardproof(&["zoo", "list"]), 0, "zoo list");
    for word in ["mlp", "dp", "tp", "spec operator"] {
        assert!(out.contains(word), "{word}\n{out}");
    }
    for bug in BUGS {
        assert!(
            out.contains(bug.id) && out.contains(bug.description),
            "{}\n{out}",
            bug.id
        );
    }
}

#[test]
fn invalid_requests_exit_2() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().to_str().unwrap();
    for (args, word) in [
        (
            vec!["zoo", "emit", "gpt9", "-o", out],
            "unknown model `gpt9`",
        ),
        (
            vec!["zoo", "emit", "mlp", "--bug", "nope", "-o", out],
            "unknown bug `nope`",
        ),
        (
            vec!["zoo", "emit", "mlp", "--mesh", "tp:2", "-o", out],
            "--mesh",
        ),
        (
            vec!["zoo", "emit", "mlp", "--mesh", "pp=2", "-o", out],
            "unknown mesh dim `pp`",
        ),
        (
            vec![
                "zoo",
                "emit",
                "mlp",
                "--mesh",
                "tp=2",
                "--bug",
                "wrong-group",
                "-o",
                out,
            ],
            "dp mesh dim",
        ),
    ] {
        let o = shardproof(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}\n{}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains(word),
            "{args:?}\n{}",
            text(&o)
        );
    }
}
