//! Malformed inputs: every kind exits 2 with a message located at file:line:col (and a hint),
//! through both `shardproof run` and `shardproof inspect`.

mod common;

use common::{rowpar, Out, Scratch, CASE_ROWPAR, SPEC_MM};

/// The case file with `from` replaced by `to` (which must occur).
fn case_with(from: &str, to: &str) -> String {
    assert!(CASE_ROWPAR.contains(from), "the case contains {from:?}");
    CASE_ROWPAR.replacen(from, to, 1)
}

/// Runs `run CASE`, `run --json CASE` and `inspect CASE` (and `inspect --strict --json CASE`) on
/// `case` in `s`; each must exit 2 with `parts` in its message. Returns the outputs of `run` and
/// `inspect`.
#[track_caller]
fn invalid_everywhere(s: &Scratch, case: &str, parts: &[&str]) -> (Out, Out) {
    let run = s.run(&["run", case]);
    run.expect_code(2)
        .stderr_has(parts)
        .stderr_has(&["error: ", "hint: "]);
    assert!(
        run.stdout.is_empty(),
        "run prints no verdict for invalid input: {}",
        run.stdout
    );

    let json = s.run(&["run", "--json", case]);
    json.expect_code(2);
    let v = json.json();
    assert_eq!(v["verdict"], "invalid", "{}", json.stdout);
    let message = v["message"].as_str().expect("an invalid run has a message");
    for p in parts {
        assert!(message.contains(p), "JSON message lacks {p:?}: {message}");
    }

    let inspect = s.run(&["inspect", case]);
    inspect
        .expect_code(2)
        .stderr_has(parts)
        .stderr_has(&["error: ", "hint: "]);
    assert!(
        inspect.stdout.is_empty(),
        "inspect prints no report for invalid input: {}",
        inspect.stdout
    );
    let json = s.run(&["inspect", "--strict", "--json", case]);
    json.expect_code(2).stderr_has(parts);
    assert_eq!(json.json()["verdict"], "invalid", "{}", json.stdout);
    (run, inspect)
}

// ---------------------------------------------------------------------------------------------
// Truncated graphs.

#[test]
fn truncated_spec_graph_without_return() {
    let s = rowpar();
    // The first three lines: the file ends after the last node, without `return`.
    let cut: String = SPEC_MM.lines().take(3).map(|l| format!("{l}\n")).collect();
    let last = SPEC_MM.lines().nth(2).unwrap();
    s.write("spec.py", &cut);
    let at = format!("spec.py:3:{}", last.len() + 1);
    assert_eq!(at, "spec.py:3:73");
    invalid_everywhere(&s, "case.yaml", &[&at, "`return`", "truncated"]);
    // The graph file on its own.
    s.run(&["inspect", "spec.py"]).expect_code(2).stderr_has(&[
        &at,
        "`return`",
        "hint: the file looks truncated",
    ]);
    s.run(&["inspect", "--strict", "--json", "spec.py"])
        .expect_code(2)
        .stderr_has(&[&at]);
}

#[test]
fn truncated_rank_graph_cut_mid_call() {
    let s = rowpar();
    // Rank 1 is cut inside the all_reduce call: its `(` is never closed.
    let text = common::RANK_MM_ALLREDUCE;
    let cut_at = text.find("(mm, 'sum'").unwrap() + "(mm, ".len();
    let line4 = text.lines().nth(3).unwrap();
    let open_col = line4.find("(mm").unwrap() + 1;
    s.write("r1.py", &text[..cut_at]);
    let at = format!("r1.py:4:{open_col}");
    assert_eq!(at, "r1.py:4:80");
    invalid_everywhere(&s, "case.yaml", &[&at, "unterminated `(`", "truncated"]);
    s.run(&["inspect", "r1.py"])
        .expect_code(2)
        .stderr_has(&[&at, "unterminated `(`"]);
    // Rank 0 is intact: the error must name rank 1's file, not rank 0's.
    let run = s.run(&["run", "case.yaml"]);
    assert!(!run.stderr.contains("r0.py"), "{}", run.stderr);
}

#[test]
fn truncated_graph_cut_mid_token() {
    let s = rowpar();
    // Cut inside the operator name of the first node.
    let cut_at = SPEC_MM.find("torch.ops.aten.mm").unwrap() + 3;
    s.write("spec.py", &SPEC_MM[..cut_at]);
    let col = SPEC_MM.lines().nth(2).unwrap().find("torch.ops").unwrap() + 1;
    let at = format!("spec.py:3:{col}");
    assert_eq!(at, "spec.py:3:27");
    invalid_everywhere(&s, "case.yaml", &[&at, "operator call"]);
    s.run(&["inspect", "spec.py"])
        .expect_code(2)
        .stderr_has(&[&at]);
}

#[test]
fn truncated_graph_cut_inside_a_type_string() {
    let s = rowpar();
    let cut_at = SPEC_MM.find(r#""f32[8"#).unwrap() + 6;
    s.write("spec.py", &SPEC_MM[..cut_at]);
    let col = SPEC_MM.lines().nth(1).unwrap().find(r#""f32[8"#).unwrap() + 1;
    let at = format!("spec.py:2:{col}");
    assert_eq!(at, "spec.py:2:42");
    invalid_everywhere(&s, "case.yaml", &[&at, "unterminated string"]);
}

#[test]
fn empty_graph_file() {
    let s = rowpar();
    s.write("spec.py", "");
    let run = s.run(&["run", "case.yaml"]);
    run.expect_code(2).stderr_has(&["spec.py"]);
    s.run(&["inspect", "spec.py"])
        .expect_code(2)
        .stderr_has(&["spec.py"]);
}

// ---------------------------------------------------------------------------------------------
// Unknown tensors in a case.

#[test]
fn unknown_input_tensor_suggests_the_nearest_name() {
    let s = rowpar();
    s.write("case.yaml", &case_with("  w: Shard(0)", "  ww: Shard(0)"));
    invalid_everywhere(
        &s,
        "case.yaml",
        &["case.yaml:10:3", "unknown tensor `ww`", "did you mean `w`?"],
    );
}

#[test]
fn unknown_output_tensor_suggests_the_nearest_name() {
    let s = rowpar();
    s.write(
        "case.yaml",
        &case_with("  mm: Partial()", "  mn: Partial()"),
    );
    invalid_everywhere(
        &s,
        "case.yaml",
        &[
            "case.yaml:12:3",
            "unknown tensor `mn`",
            "did you mean `mm`?",
        ],
    );
}

#[test]
fn unknown_impl_tensor_names_the_rank() {
    let s = rowpar();
    s.write(
        "case.yaml",
        &case_with("  w: Shard(0)", "  w: { impl: wq, placement: Shard(0) }"),
    );
    invalid_everywhere(
        &s,
        "case.yaml",
        &[
            "case.yaml:10:14",
            "`wq`",
            "rank 0 (r0.py)",
            "did you mean `w`?",
        ],
    );
}

#[test]
fn unknown_key_suggests_the_nearest_key() {
    let s = rowpar();
    s.write("case.yaml", &case_with("outputs:", "outptus:"));
    invalid_everywhere(
        &s,
        "case.yaml",
        &["case.yaml:11:1", "`outptus`", "did you mean `outputs`?"],
    );
}

// ---------------------------------------------------------------------------------------------
// Placements.

#[test]
fn placement_with_a_missing_parenthesis() {
    let s = rowpar();
    s.write("case.yaml", &case_with("  x: Shard(1)", "  x: Shard(1"));
    // The column points just past the scalar, where `)` is missing.
    invalid_everywhere(&s, "case.yaml", &["case.yaml:9:13", "missing `)`"]);
}

#[test]
fn misspelt_placement_suggests_the_nearest_spelling() {
    let s = rowpar();
    s.write("case.yaml", &case_with("  x: Shard(1)", "  x: Shrd(1)"));
    invalid_everywhere(
        &s,
        "case.yaml",
        &[
            "case.yaml:9:6",
            "`Shrd(1)` is not a placement",
            "did you mean `Shard`?",
        ],
    );
}

#[test]
fn negative_shard_dim_is_rejected_at_the_number() {
    let s = rowpar();
    s.write("case.yaml", &case_with("  x: Shard(1)", "  x: Shard(-1)"));
    invalid_everywhere(&s, "case.yaml", &["case.yaml:9:12", "must not be negative"]);
}

#[test]
fn bad_placement_in_outputs() {
    let s = rowpar();
    s.write(
        "case.yaml",
        &case_with("  mm: Partial()", "  mm: Partial(prod)"),
    );
    invalid_everywhere(
        &s,
        "case.yaml",
        &["case.yaml:12:15", "`prod` is not a reduction"],
    );
}

#[test]
fn placement_that_does_not_fit_shows_both_shapes() {
    let s = rowpar();
    // x is f32[4, 8] in the spec and f32[4, 4] on each rank: Shard(0) would be f32[2, 8].
    s.write("case.yaml", &case_with("  x: Shard(1)", "  x: Shard(0)"));
    invalid_everywhere(
        &s,
        "case.yaml",
        &[
            "case.yaml:9:6",
            "does not fit",
            "spec f32[4, 8]",
            "f32[4, 4]",
            "along dim 0",
        ],
    );
}

#[test]
fn shard_dim_out_of_range_shows_both_shapes() {
    let s = rowpar();
    s.write("case.yaml", &case_with("  w: Shard(0)", "  w: Shard(2)"));
    invalid_everywhere(
        &s,
        "case.yaml",
        &[
            "case.yaml:10:6",
            "does not fit",
            "spec f32[8, 6]",
            "f32[4, 6]",
            "out of range",
        ],
    );
}

#[test]
fn output_placement_that_does_not_fit_shows_both_shapes() {
    let s = rowpar();
    s.write("case.yaml", &case_with("  mm: Partial()", "  mm: Shard(1)"));
    invalid_everywhere(
        &s,
        "case.yaml",
        &[
            "case.yaml:12:7",
            "does not fit",
            "spec f32[4, 6]",
            "ranks 0-1 have f32[4, 6]",
            "expected 3 = 6 / 2 along dim 1",
        ],
    );
}

#[test]
fn bare_shard_on_a_2d_mesh_is_ambiguous() {
    let s = rowpar();
    s.write("r2.py", common::RANK_MM_ALLREDUCE);
    s.write("r3.py", common::RANK_MM_ALLREDUCE);
    let case = case_with("mesh: { tp: 2 }", "mesh: { dp: 2, tp: 2 }").replace(
        "graphs: [r0.py, r1.py]",
        "graphs: [r0.py, r1.py, r2.py, r3.py]",
    );
    s.write("case.yaml", &case);
    invalid_everywhere(
        &s,
        "case.yaml",
        &["case.yaml:9:6", "ambiguous on the 2-d mesh"],
    );
}

// ---------------------------------------------------------------------------------------------
// The impl section.

#[test]
fn too_many_rank_graphs() {
    let s = rowpar();
    s.write(
        "case.yaml",
        &case_with("graphs: [r0.py, r1.py]", "graphs: [r0.py, r1.py, r1.py]"),
    );
    invalid_everywhere(
        &s,
        "case.yaml",
        &["case.yaml:7:11", "has 2 ranks", "lists 3 graphs"],
    );
}

#[test]
fn too_few_rank_graphs() {
    let s = rowpar();
    s.write(
        "case.yaml",
        &case_with("graphs: [r0.py, r1.py]", "graphs: [r0.py]"),
    );
    invalid_everywhere(
        &s,
        "case.yaml",
        &["case.yaml:7:11", "has 2 ranks", "lists 1 graph"],
    );
}

#[test]
fn missing_rank_graph_file_is_located_in_the_case() {
    let s = rowpar();
    s.write("case.yaml", &case_with("r1.py]", "r9.py]"));
    invalid_everywhere(&s, "case.yaml", &["case.yaml:7:19", "rank 1", "`r9.py`"]);
}

// ---------------------------------------------------------------------------------------------
// YAML that does not parse.

#[test]
fn unclosed_flow_mapping() {
    let s = rowpar();
    s.write("case.yaml", &case_with("mesh: { tp: 2 }", "mesh: { tp: 2"));
    invalid_everywhere(&s, "case.yaml", &["case.yaml:7:9", "not valid YAML"]);
}

#[test]
fn bad_indentation() {
    let s = rowpar();
    // `x` is indented deeper than the `mesh` key that follows it.
    s.write("case.yaml", &case_with("impl:\n", "impl:\n   x: 1\n"));
    invalid_everywhere(
        &s,
        "case.yaml",
        &["case.yaml:7:3", "not valid YAML", "indentation"],
    );
}

#[test]
fn tab_indentation() {
    let s = rowpar();
    s.write(
        "case.yaml",
        &case_with("  graph: spec.py", "\tgraph: spec.py"),
    );
    invalid_everywhere(&s, "case.yaml", &["case.yaml:4:2", "tabs"]);
}

#[test]
fn wrong_version() {
    let s = rowpar();
    s.write("case.yaml", &case_with("version: 1", "version: 2"));
    invalid_everywhere(
        &s,
        "case.yaml",
        &["case.yaml:1:10", "version 2", "`version: 1`"],
    );
}

#[test]
fn missing_case_file() {
    let s = Scratch::new();
    s.run(&["run", "nope.yaml"])
        .expect_code(2)
        .stderr_has(&["nope.yaml", "cannot read"]);
    s.run(&["inspect", "nope.yaml"])
        .expect_code(2)
        .stderr_has(&["nope.yaml", "cannot read"]);
    s.run(&["inspect", "nope.py"])
        .expect_code(2)
        .stderr_has(&["nope.py", "cannot read"]);
}

// ---------------------------------------------------------------------------------------------
// Usage errors.

#[test]
fn unknown_flag_is_a_usage_error() {
    let s = rowpar();
    s.run(&["run", "--frobnicate", "case.yaml"])
        .expect_code(2)
        .stderr_has(&["--frobnicate", "Usage:"]);
    s.run(&["inspect", "--frobnicate", "case.yaml"])
        .expect_code(2)
        .stderr_has(&["--frobnicate", "Usage:"]);
}

#[test]
fn bad_option_values_are_usage_errors() {
    let s = rowpar();
    s.run(&["run", "--dtype", "f16", "case.yaml"])
        .expect_code(2)
        .stderr_has(&["f16", "f64", "bf16"]);
    s.run(&["run", "--seed", "-3", "case.yaml"]).expect_code(2);
    s.run(&["run", "--seed", "x", "case.yaml"]).expect_code(2);
    s.run(&["run", "--max-memory", "lots", "case.yaml"])
        .expect_code(2)
        .stderr_has(&["lots", "8GB"]);
}

#[test]
fn missing_arguments_and_unknown_commands_are_usage_errors() {
    let s = rowpar();
    s.run(&[]).expect_code(2).stderr_has(&["Usage:"]);
    s.run(&["run"]).expect_code(2).stderr_has(&["<CASE>"]);
    s.run(&["inspect"]).expect_code(2).stderr_has(&["<PATH>"]);
    s.run(&["verfy", "case.yaml"]).expect_code(2);
    s.run(&["run", "case.yaml", "extra.yaml"]).expect_code(2);
}

#[test]
fn help_and_version_exit_0() {
    let s = Scratch::new();
    s.run(&["--help"])
        .expect_code(0)
        .stdout_has(&["inspect", "run", "demo"]);
    s.run(&["run", "--help"]).expect_code(0).stdout_has(&[
        "--seed",
        "--dtype",
        "--max-memory",
        "--json",
        "--quiet",
    ]);
    s.run(&["--version"])
        .expect_code(0)
        .stdout_has(&["shardproof"]);
}

// ---------------------------------------------------------------------------------------------
// Inputs the run needs but the case does not lay out.

#[test]
fn run_names_the_spec_input_the_case_does_not_lay_out() {
    let s = rowpar();
    s.write("case.yaml", &case_with("  w: Shard(0)\n", ""));
    // Not an error of the case on its own: inspect reads it.
    s.run(&["inspect", "--strict", "case.yaml"]).expect_code(0);
    // But `mm` depends on `w`, which has no layout: the message must say which input to add.
    s.run(&["run", "case.yaml"])
        .expect_code(2)
        .stderr_has(&["`mm`", "`w`", "hint: ", "inputs:"]);
}

// ---------------------------------------------------------------------------------------------
// A closed stdout (`shardproof run --json case.yaml | true`).

#[test]
fn a_closed_stdout_does_not_panic() {
    use std::process::{Command, Stdio};
    let s = rowpar();
    for args in [
        &["run", "--json", "case.yaml"][..],
        &["run", "case.yaml"][..],
        &["inspect", "--json", "case.yaml"][..],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_shardproof"))
            .args(args)
            .current_dir(s.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the binary starts");
        // Close the read end before the report is written.
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("the binary ends");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !stderr.contains("panicked"),
            "{args:?} with a closed stdout panics (exit {:?}):\n{stderr}",
            out.status.code()
        );
        assert!(
            matches!(out.status.code(), Some(0..=3)),
            "{args:?} with a closed stdout exits {:?}",
            out.status.code()
        );
    }
}
