//! What a user meets at the command line, apart from verdicts: `zoo list` fitted to the width
//! and as JSON, did-you-mean for names typed wrong, JSON errors under `--json`, no verdict
//! header for invalid input, shell completions and the man page.

mod common;

use common::{rowpar, Scratch, CASE_ROWPAR};
use shardproof_zoo::{BUGS, PRESETS};

/// The width `zoo list` fits when stdout is not a terminal (as here, captured by the test).
const PIPE_WIDTH: usize = 100;

#[test]
fn zoo_list_fits_100_columns_when_not_a_terminal() {
    let out = Scratch::new().run(&["zoo", "list"]);
    out.expect_code(0);
    let long: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| l.chars().count() > PIPE_WIDTH)
        .collect();
    assert!(
        long.is_empty(),
        "lines over {PIPE_WIDTH} columns: {long:#?}"
    );
    // And the catalog alone.
    let bugs = Scratch::new().run(&["zoo", "list", "--bugs"]);
    bugs.expect_code(0);
    let widest = bugs.stdout.lines().map(|l| l.chars().count()).max();
    assert!(widest.is_some_and(|w| w <= PIPE_WIDTH), "{widest:?}");
}

#[test]
fn zoo_list_aligns_the_bug_columns() {
    let out = Scratch::new().run(&["zoo", "list", "--bugs"]);
    let text = &out.expect_code(0).stdout;
    let header = text
        .lines()
        .find(|l| l.trim_start().starts_with("ID "))
        .expect("a header row");
    let engines_at = header.find("ENGINES").expect("an ENGINES column");
    let parallelism_at = header.find("PARALLELISM").expect("a PARALLELISM column");
    for bug in BUGS {
        let row = text
            .lines()
            .find(|l| {
                l.strip_prefix("  ")
                    .is_some_and(|r| r.starts_with(&format!("{} ", bug.id)))
            })
            .unwrap_or_else(|| panic!("no row starts with {}\n{text}", bug.id));
        // Each cell starts at its column: the id padded to the column, one gap, the cell.
        let engines_first = bug.engines.split_whitespace().next().unwrap();
        assert_eq!(
            row[engines_at..].split_whitespace().next(),
            Some(engines_first),
            "{row}"
        );
        let parallelism_first = bug.parallelism.split_whitespace().next().unwrap();
        assert_eq!(
            row[parallelism_at..].split_whitespace().next(),
            Some(parallelism_first),
            "{row}"
        );
        assert_eq!(&row[engines_at - 2..engines_at], "  ", "{row}");
    }
}

#[test]
fn zoo_list_json_has_every_row() {
    let out = Scratch::new().run(&["zoo", "list", "--json"]);
    let v = out.expect_code(0).json();
    let bugs = v["bugs"].as_array().expect("a bugs array");
    assert_eq!(bugs.len(), BUGS.len());
    for (row, bug) in bugs.iter().zip(BUGS) {
        assert_eq!(row["id"], bug.id);
        assert_eq!(row["engines"], bug.engines);
        assert_eq!(row["parallelism"], bug.parallelism);
        assert_eq!(row["description"], bug.description);
        assert_eq!(row["source"], bug.source);
        assert_eq!(
            row["models"].as_array().map(Vec::len),
            Some(bug.models.len())
        );
    }
    let presets = v["presets"].as_array().expect("a presets array");
    assert_eq!(presets.len(), PRESETS.len());
    assert_eq!(presets[0]["name"], PRESETS[0].name);
    for key in ["models", "parallelisms", "model_options", "training"] {
        assert!(
            v[key].as_array().is_some_and(|a| !a.is_empty()),
            "{key}: {}",
            out.stdout
        );
    }
    let only = Scratch::new().run(&["zoo", "list", "--bugs", "--json"]);
    let v = only.expect_code(0).json();
    assert!(v.get("models").is_none() && v["bugs"].as_array().is_some());
}

#[test]
fn a_misspelled_bug_id_gets_a_suggestion_not_the_whole_catalog() {
    let s = Scratch::new();
    let out = s.zoo_emit("out", &["mlp", "--bug", "tp-missing-allreduc"]);
    out.expect_code(2).stderr_has(&[
        "unknown bug `tp-missing-allreduc`",
        "did you mean `tp-missing-allreduce`?",
        "`shardproof zoo list --bugs` shows all",
    ]);
    // The other ids stay behind the hint.
    assert!(!out.stderr.contains("wrong-group"), "{}", out.stderr);
    // A prefix left out is found too.
    s.zoo_emit("out", &["llama", "--bug", "oproj-missing-allreduce"])
        .expect_code(2)
        .stderr_has(&["did you mean `llama-oproj-missing-allreduce`?"]);
    // Nothing near: no guess, the hint alone.
    let far = s.zoo_emit("out", &["mlp", "--bug", "nope"]);
    far.expect_code(2);
    assert!(!far.stderr.contains("did you mean"), "{}", far.stderr);
    assert!(!s.path().join("out").exists(), "nothing is written");
}

#[test]
fn misspelled_models_presets_and_mesh_dims_get_suggestions() {
    let s = Scratch::new();
    s.zoo_emit("out", &["lama"])
        .expect_code(2)
        .stderr_has(&["unknown model `lama`", "did you mean `llama`?"]);
    s.zoo_emit("out", &["--preset", "llama3-8b-tin"])
        .expect_code(2)
        .stderr_has(&["did you mean `llama3-8b-tiny`?"]);
    s.zoo_emit("out", &["mlp", "--mesh", "tq=2"])
        .expect_code(2)
        .stderr_has(&["unknown mesh dim `tq`", "did you mean `tp`?"]);
    s.run(&["man", "rn"])
        .expect_code(2)
        .stderr_has(&["unknown command `rn`", "did you mean `run`?"]);
}

#[test]
fn inspect_json_reports_invalid_input_as_json() {
    let s = rowpar();
    s.write("case.yaml", &CASE_ROWPAR.replace("Shard(1)", "Shrad(1)"));
    let out = s.run(&["inspect", "--json", "case.yaml"]);
    let v = out.expect_code(2).json();
    assert_eq!(v["verdict"], "invalid", "{}", out.stdout);
    assert_eq!(v["case"], "case.yaml");
    let message = v["message"].as_str().expect("a message");
    assert!(
        message.starts_with("error: ") && message.contains("Shrad"),
        "{message}"
    );
    // The same shape as `run --json` and `verify --json` give.
    for command in ["run", "verify", "check"] {
        let other = s.run(&[command, "--json", "case.yaml"]);
        let w = other.expect_code(2).json();
        assert_eq!(w["verdict"], "invalid", "{command}: {}", other.stdout);
        assert!(
            w["message"].as_str().is_some_and(|m| m.contains("Shrad")),
            "{command}"
        );
        assert!(w["case"].is_string(), "{command}");
    }
    // A usage error under --json is JSON too.
    let usage = s.run(&["inspect", "--json"]);
    let u = usage.expect_code(2).json();
    assert_eq!(u["verdict"], "invalid");
    assert!(u["case"].is_null());
}

#[test]
fn invalid_input_prints_no_verdict_header() {
    let s = rowpar();
    s.write("case.yaml", &CASE_ROWPAR.replace("Shard(1)", "Shrad(1)"));
    for command in ["run", "verify", "check", "inspect"] {
        let out = s.run(&[command, "case.yaml"]);
        out.expect_code(2).stderr_has(&["Shrad", "error: "]);
        assert!(
            out.stdout.is_empty(),
            "`{command}` printed on stdout for invalid input:\n{}",
            out.stdout
        );
    }
    // A case that loads but whose programs do not type-check is invalid as well, found later.
    s.write("case.yaml", CASE_ROWPAR);
    s.write(
        "r1.py",
        &common::RANK_MM_ALLREDUCE.replace("mm.default(x, w)", "mm.default(x, x)"),
    );
    for command in ["run", "verify"] {
        let out = s.run(&[command, "case.yaml"]);
        out.expect_code(2).stderr_has(&["do not type-check"]);
        assert!(out.stdout.is_empty(), "{command}: {}", out.stdout);
    }
}

#[test]
fn completions_for_bash_name_the_commands() {
    let out = Scratch::new().run(&["completions", "bash"]);
    let script = &out.expect_code(0).stdout;
    assert!(script.contains("_shardproof()"), "{script}");
    for command in ["verify", "zoo", "completions"] {
        assert!(script.contains(command), "{command}");
    }
    for shell in ["zsh", "fish", "elvish", "powershell"] {
        let other = Scratch::new().run(&["completions", shell]);
        assert!(!other.expect_code(0).stdout.is_empty(), "{shell}");
    }
    Scratch::new()
        .run(&["completions", "tcsh"])
        .expect_code(2)
        .stderr_has(&["tcsh"]);
}

#[test]
fn man_page_is_roff_with_a_title() {
    let out = Scratch::new().run(&["man"]);
    let page = &out.expect_code(0).stdout;
    // clap_mangen puts two lines defining the apostrophe string (`.ie`/`.el`) before the title.
    let first_macro = page
        .lines()
        .find(|l| l.starts_with('.') && !l.starts_with(".ie") && !l.starts_with(".el"))
        .expect("roff macros");
    assert!(first_macro.starts_with(".TH shardproof 1"), "{page}");
    assert!(
        page.contains(".SH SYNOPSIS") && page.contains("verify"),
        "{page}"
    );
    let run = Scratch::new().run(&["man", "run"]);
    assert!(
        run.expect_code(0).stdout.contains(".TH shardproof-run 1"),
        "{}",
        run.stdout
    );
}

#[test]
fn help_documents_completions_and_man() {
    let out = Scratch::new().run(&["--help"]);
    out.expect_code(0).stdout_has(&[
        "completions",
        "man",
        "shardproof completions bash",
        "shardproof man >",
    ]);
}

/// In a log (stderr not a terminal) verify prints where relation inference is every few
/// seconds, and a time limit names the operator it stopped at.
#[test]
fn verify_shows_progress_in_a_log_and_names_where_a_time_limit_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let case = common::emit_zoo("llama", dir.path(), "tp=2", &[]);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shardproof"))
        .args(["verify", case.to_str().unwrap()])
        .env("SHARDPROOF_PROGRESS_SECONDS", "0.01")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The first lines may come before the walk starts (`preparing the programs`); one names
    // the spec operator being inferred.
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("verify llama-tp2: ") && l.contains(" spec operators, at `")),
        "no progress line naming an operator:\n{stderr}"
    );
    // --quiet keeps the log clean.
    let quiet = std::process::Command::new(env!("CARGO_BIN_EXE_shardproof"))
        .args(["verify", "--quiet", case.to_str().unwrap()])
        .env("SHARDPROOF_PROGRESS_SECONDS", "0.01")
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&quiet.stderr), "");

    let limited = std::process::Command::new(env!("CARGO_BIN_EXE_shardproof"))
        .args([
            "verify",
            "--no-prove",
            "--time-limit",
            "0.000001",
            case.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(limited.status.code(), Some(3));
    let text = String::from_utf8_lossy(&limited.stdout);
    assert!(text.contains("; --time-limit): it stopped "), "{text}");
    assert!(
        text.contains("a longer --time-limit may prove it"),
        "{text}"
    );
    assert!(!text.contains("missing lemma"), "{text}");
}

/// `run` and `inspect` show their progress in a log as verify does (nodes run, graphs read),
/// and `--time-limit` ends them inconclusive, naming where they stopped.
#[test]
fn run_and_inspect_show_progress_in_a_log_and_stop_at_a_time_limit() {
    let dir = tempfile::tempdir().unwrap();
    // Large enough that a debug run takes about a second: progress lines come every 0.01 s
    // once the watcher, which looks every 0.2 s, sees the run going.
    let case = common::emit_zoo(
        "llama",
        dir.path(),
        "tp=2",
        &["--hidden", "256", "--ffn", "512", "--seq", "128"],
    );
    let shardproof = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_shardproof"))
            .args(args)
            .arg(&case)
            .env("SHARDPROOF_PROGRESS_SECONDS", "0.01")
            .output()
            .unwrap()
    };
    let run = shardproof(&["run"]);
    assert_eq!(run.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("run llama-tp2: ") && l.contains(" nodes, at `")),
        "no progress line naming a node:\n{stderr}"
    );
    let quiet = shardproof(&["run", "--quiet"]);
    assert_eq!(String::from_utf8_lossy(&quiet.stderr), "");

    let limited = shardproof(&["run", "--time-limit", "0.000001"]);
    assert_eq!(limited.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&limited.stderr);
    assert!(
        stderr.contains(
            "the run did not finish within the time limit (0.000001 s; --time-limit): it stopped "
        ),
        "{stderr}"
    );
    let json = shardproof(&["run", "--json", "--time-limit", "0.000001"]);
    assert_eq!(json.status.code(), Some(3));
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(report["verdict"], "inconclusive");

    let inspected = shardproof(&["inspect", "--time-limit", "0.000001"]);
    assert_eq!(inspected.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&inspected.stderr);
    assert!(
        stderr.contains("inspect did not finish within the time limit"),
        "{stderr}"
    );
    assert_eq!(shardproof(&["inspect", "--quiet"]).status.code(), Some(0));
    let bad = shardproof(&["run", "--time-limit", "soon"]);
    assert_eq!(bad.status.code(), Some(2));
}
