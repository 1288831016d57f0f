//! `shardproof zoo`: every emitted correct plan verifies with `run`, every planted bug is found
//! naming an output it changes, and `inspect --strict` accepts every emitted case.

use shardproof_zoo::{LlamaConfig, Site, BUGS};
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

/// Emits into `dir` with the extra flags and returns the case path.
fn emit(
    dir: &Path,
    model: &str,
    mesh: &str,
    flags: &[&str],
    layers: &str,
    bug: Option<&str>,
) -> String {
    let out = dir.to_str().unwrap();
    let mut args = vec![
        "zoo", "emit", model, "--mesh", mesh, "--layers", layers, "-o", out,
    ];
    args.extend(flags);
    if let Some(b) = bug {
        args.extend(["--bug", b]);
    }
    expect(&shardproof(&args), 0, &format!("{args:?}"));
    dir.join("case.yaml").to_str().unwrap().to_string()
}

/// Every correct plan of `model` on the meshes holds under `run` and `inspect --strict`; every
/// applicable catalog bug is found by `run`, naming the loss when the bug changes it and an
/// updated parameter otherwise.
fn check_model(model: &str, meshes: &[(&str, usize, usize)], vocab_parallel: bool) {
    let mut planted = 0;
    let site = |dp, tp, forward_only| Site {
        model,
        dp,
        tp,
        forward_only,
        kv_replicated: model == "llama" && LlamaConfig::default().kv_replicas(tp) > 1,
        vocab_parallel,
        sequence_parallel: false,
    };
    for &(mesh, dp, tp) in meshes {
        for forward_only in [true, false] {
            let mut flags = Vec::new();
            if forward_only {
                flags.push("--forward-only");
            }
            if vocab_parallel {
                flags.push("--vocab-parallel");
            }
            // The MLP needs two layers for the backward all-reduce between layers.
            let layers = match model {
                "mlp" if tp > 1 && !forward_only => "2",
                "mlp" => "1",
                _ => "2",
            };
            let tmp = tempfile::tempdir().unwrap();
            let what = format!("{model}, mesh {mesh}, flags {flags:?}");
            let case = emit(&tmp.path().join("ok"), model, mesh, &flags, layers, None);
            let out = expect(&shardproof(&["run", &case]), 0, &what);
            assert!(out.contains("verdict: holds"), "{what}\n{out}");
            expect(&shardproof(&["inspect", "--strict", &case]), 0, &what);
            for bug in BUGS {
                // The numerically invisible bugs (their values are the correct plan's) are
                // checked to hold under `run` in zoo_bugs_extra.rs.
                if bug.check_applies(&site(dp, tp, forward_only)).is_err() || !bug.run_catches() {
                    continue;
                }
                planted += 1;
                let what = format!("{what}, bug {}", bug.id);
                let case = emit(
                    &tmp.path().join(bug.id),
                    model,
                    mesh,
                    &flags,
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
    // Every catalog bug of the model (and of this vocab layout) was planted in the matrix (the
    // training bugs, which need training flags, in zoo_train.rs; the pipeline bugs in
    // zoo_pp.rs; the context-parallel bugs in zoo_cp.rs).
    for bug in BUGS.iter().filter(|b| b.models.contains(&model)) {
        if bug.needs_vocab_parallel != vocab_parallel
            || bug.needs_training()
            || bug.needs_pipeline()
            || bug.needs_cp()
        {
            continue;
        }
        assert!(
            meshes.iter().any(|&(_, dp, tp)| [true, false]
                .iter()
                .any(|&fw| bug.check_applies(&site(dp, tp, fw)).is_ok())),
            "{model}: bug {} is never planted",
            bug.id
        );
    }
    assert!(planted > 0);
}

const MESHES: &[(&str, usize, usize)] = &[
    ("tp=2", 1, 2),
    ("dp=2", 2, 1),
    ("dp=2,tp=2", 2, 2),
    ("tp=4", 1, 4),
];

#[test]
fn mlp_correct_plans_hold_and_bugs_are_found() {
    check_model("mlp", MESHES, false);
}

#[test]
fn llama_correct_plans_hold_and_bugs_are_found() {
    // tp=4 exceeds the 2 kv heads of the tiny size: kv heads are replicated over rank pairs.
    check_model("llama", MESHES, false);
    // 8 ranks: kv-head replicas inside each dp slice.
    check_model("llama", &[("dp=2,tp=4", 2, 4)], false);
}

#[test]
fn llama_vocab_parallel_plans_hold_and_bugs_are_found() {
    check_model(
        "llama",
        &[("tp=2", 1, 2), ("dp=2,tp=2", 2, 2), ("tp=4", 1, 4)],
        true,
    );
}

#[test]
fn llama_sizes_are_configurable() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().to_str().unwrap();
    let args = [
        "zoo",
        "emit",
        "llama",
        "--mesh",
        "dp=2,tp=2",
        "--hidden",
        "24",
        "--heads",
        "6",
        "--kv-heads",
        "2",
        "--ffn",
        "20",
        "--layers",
        "1",
        "--seq",
        "5",
        "--batch",
        "4",
        "--vocab",
        "11",
        "-o",
        out,
    ];
    expect(&shardproof(&args), 0, "emit");
    let case = tmp.path().join("case.yaml");
    let case = case.to_str().unwrap();
    let spec = std::fs::read_to_string(tmp.path().join("spec.py")).unwrap();
    assert!(
        spec.contains("tokens: \"i64[4, 5]\"") && spec.contains("embed: \"f32[11, 24]\""),
        "{spec}"
    );
    let rank = std::fs::read_to_string(tmp.path().join("r0.py")).unwrap();
    // 6 heads of width 4 over tp=2: 12 query rows and 4 kv rows per rank; batch 2 per dp rank.
    assert!(
        rank.contains("wq_0: \"f32[12, 24]\"") && rank.contains("wk_0: \"f32[4, 24]\""),
        "{rank}"
    );
    assert!(rank.contains("tokens: \"i64[2, 5]\""), "{rank}");
    expect(&shardproof(&["inspect", "--strict", case]), 0, "inspect");
    expect(&shardproof(&["run", case]), 0, "run");
}

#[test]
fn list_shows_models_and_bugs() {
    let out = expect(&shardproof(&["zoo", "list"]), 0, "zoo list");
    for word in ["mlp", "llama", "dp", "tp", "spec operator"] {
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
fn list_bugs_prints_only_the_catalog() {
    let out = expect(
        &shardproof(&["zoo", "list", "--bugs"]),
        0,
        "zoo list --bugs",
    );
    assert!(
        !out.contains("models:") && out.starts_with("bugs:"),
        "{out}"
    );
    for bug in BUGS {
        let line = out
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{} ", bug.id)))
            .unwrap_or_else(|| panic!("{} missing\n{out}", bug.id));
        for field in [bug.parallelism, bug.engines, bug.spec_op, bug.source] {
            assert!(line.contains(field), "{}: {field}\n{line}", bug.id);
        }
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
            vec!["zoo", "emit", "mlp", "--mesh", "zz=2", "-o", out],
            "unknown mesh dim `zz`",
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
        (
            vec!["zoo", "emit", "mlp", "--heads", "4", "-o", out],
            "--heads applies to the llama and gpt2 models",
        ),
        (
            vec!["zoo", "emit", "llama", "--mesh", "tp=3", "-o", out],
            "heads 4 is not divisible by tp = 3",
        ),
        (
            vec!["zoo", "emit", "mlp", "--vocab-parallel", "-o", out],
            "vocab parallelism applies to the llama model",
        ),
        (
            vec!["zoo", "emit", "llama", "--kv-heads", "0", "-o", out],
            "kv_heads must be at least 1",
        ),
        (
            vec![
                "zoo",
                "emit",
                "llama",
                "--bug",
                "llama-kv-grad-unsynced",
                "-o",
                out,
            ],
            "tp larger than the kv heads",
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
