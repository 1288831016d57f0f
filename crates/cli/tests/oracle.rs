//! `shardproof run` on the distributed programs PyTorch captured (`$SHARDPROOF_ORACLE_DIR/dist`,
//! written by `scripts/oracle-capture`): the verdict of every program must be the one its
//! `expected.json` records, whatever the seed, the precision or the output format.

mod common;

use common::shardproof_in;
use std::path::{Path, PathBuf};

/// The dist programs: (name, folder, expected verdict). `None` (with a message) when
/// `SHARDPROOF_ORACLE_DIR` is unset; panics when it is set but holds no dist fixtures.
fn programs() -> Option<Vec<(String, PathBuf, String)>> {
    let Some(root) = std::env::var_os("SHARDPROOF_ORACLE_DIR") else {
        println!(
            "SKIPPED: SHARDPROOF_ORACLE_DIR is not set; run `scripts/oracle-capture` and set it to \
             target/oracle (scripts/test does both) to check `run` on the captured programs"
        );
        return None;
    };
    let dist = PathBuf::from(root).join("dist");
    let index = dist.join("index.json");
    assert!(
        index.is_file(),
        "SHARDPROOF_ORACLE_DIR is set but {} is missing: run `scripts/oracle-capture` first",
        index.display()
    );
    let index = read_json(&index);
    let listed: Vec<String> = index["programs"]
        .as_array()
        .expect("index.json lists `programs`")
        .iter()
        .map(|p| {
            p["name"]
                .as_str()
                .expect("a program has a name")
                .to_string()
        })
        .collect();
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dist).expect("the dist folder is readable") {
        let dir = entry.expect("a dist entry").path();
        if !dir.join("case.yaml").is_file() {
            continue;
        }
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let expected = read_json(&dir.join("expected.json"));
        let verdict = expected["verdict"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: expected.json has a `verdict`"))
            .to_string();
        assert!(
            verdict == "holds" || verdict == "violated",
            "{name}: unknown expected verdict {verdict}"
        );
        if verdict == "violated" {
            assert_eq!(expected["bad_output"], "loss", "{name}: the bad output");
        }
        out.push((name, dir, verdict));
    }
    out.sort();
    let found: Vec<&String> = out.iter().map(|(n, _, _)| n).collect();
    for name in &listed {
        assert!(
            found.contains(&name),
            "{name} is listed in index.json but has no case.yaml"
        );
    }
    assert!(
        out.iter().any(|p| p.2 == "holds") && out.iter().any(|p| p.2 == "violated"),
        "the fixtures hold both correct and buggy programs: {found:?}"
    );
    Some(out)
}

fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

fn code_of(verdict: &str) -> i32 {
    match verdict {
        "holds" => 0,
        "violated" => 1,
        other => panic!("no exit code for {other}"),
    }
}

/// Runs `run EXTRA case.yaml` in every program's folder and checks the exit code and the text
/// report; collects every failure before panicking.
fn check_text(extra: &[&str]) {
    let Some(programs) = programs() else { return };
    let mut failures = Vec::new();
    for (name, dir, verdict) in &programs {
        let mut args = vec!["run"];
        args.extend_from_slice(extra);
        args.push("case.yaml");
        let out = shardproof_in(dir, &args);
        let want = code_of(verdict);
        let mut problems = Vec::new();
        if out.code != Some(want) {
            problems.push(format!("exit {:?}, expected {want}", out.code));
        }
        let last = out.stdout.lines().last().unwrap_or("");
        if verdict == "holds" {
            if !last.starts_with("verdict: holds") {
                problems.push(format!("last line {last:?}"));
            }
        } else {
            if !last.contains("first mismatching output `loss`") {
                problems.push(format!("last line {last:?} does not name `loss`"));
            }
            if !out
                .stdout
                .lines()
                .any(|l| l.trim_start().starts_with("loss ") && l.ends_with("MISMATCH"))
            {
                problems.push("no `loss ... MISMATCH` line".into());
            }
        }
        if !problems.is_empty() {
            failures.push(format!(
                "{name} (run {}): {}\n--- stdout:\n{}--- stderr:\n{}",
                extra.join(" "),
                problems.join("; "),
                out.stdout,
                out.stderr
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    println!(
        "{} programs checked (run {})",
        programs.len(),
        extra.join(" ")
    );
}

#[test]
fn run_gives_the_expected_verdict() {
    check_text(&[]);
}

#[test]
fn run_gives_the_expected_verdict_with_another_seed() {
    check_text(&["--seed", "7"]);
}

#[test]
fn run_gives_the_expected_verdict_in_f32() {
    // The correct programs still hold within the f32 tolerance; the bugs are 5% or more off.
    check_text(&["--dtype", "f32"]);
}

#[test]
fn run_json_gives_the_expected_verdict() {
    let Some(programs) = programs() else { return };
    let mut failures = Vec::new();
    for (name, dir, verdict) in &programs {
        for extra in [&[][..], &["--seed", "7"][..], &["--dtype", "f32"][..]] {
            let mut args = vec!["run", "--json"];
            args.extend_from_slice(extra);
            args.push("case.yaml");
            let out = shardproof_in(dir, &args);
            let what = format!("{name} (run {})", args[1..args.len() - 1].join(" "));
            if out.code != Some(code_of(verdict)) {
                failures.push(format!("{what}: exit {:?}\n{}", out.code, out.stderr));
                continue;
            }
            let v = out.json();
            let tolerance = v["tolerance"].as_f64().expect("a tolerance");
            let mut problems = Vec::new();
            if v["verdict"] != verdict.as_str() {
                problems.push(format!("verdict {}", v["verdict"]));
            }
            if v["case"] != name.as_str() {
                problems.push(format!("case {}", v["case"]));
            }
            if v["message"] != serde_json::Value::Null {
                problems.push(format!("message {}", v["message"]));
            }
            let outputs = v["outputs"].as_array().expect("outputs");
            let loss = outputs.iter().find(|o| o["name"] == "loss");
            match loss {
                None => problems.push("no output `loss`".into()),
                Some(loss) => {
                    let err = loss["rel_error"].as_f64();
                    if verdict == "holds" {
                        if loss["matched"] != true || !err.is_some_and(|e| e <= tolerance) {
                            problems.push(format!("loss {loss}"));
                        }
                        if v["first_mismatch"] != serde_json::Value::Null {
                            problems.push(format!("first_mismatch {}", v["first_mismatch"]));
                        }
                    } else {
                        if loss["matched"] != false || !err.is_some_and(|e| e > 1e-3) {
                            problems.push(format!("loss {loss}"));
                        }
                        if v["first_mismatch"] != "loss" {
                            problems.push(format!("first_mismatch {}", v["first_mismatch"]));
                        }
                    }
                }
            }
            if v["ranks"].as_u64().is_none_or(|r| r < 2) {
                problems.push(format!("ranks {}", v["ranks"]));
            }
            if !problems.is_empty() {
                failures.push(format!("{what}: {}\n{}", problems.join("; "), out.stdout));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn run_json_is_deterministic_on_the_captured_programs() {
    let Some(programs) = programs() else { return };
    for (name, dir, _) in &programs {
        let a = shardproof_in(dir, &["run", "--json", "--seed", "3", "case.yaml"]);
        let b = shardproof_in(dir, &["run", "--json", "--seed", "3", "case.yaml"]);
        assert_eq!(a.stdout, b.stdout, "{name}: two runs differ");
        assert_eq!(a.code, b.code, "{name}: two runs differ");
    }
}
