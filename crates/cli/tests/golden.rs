//! Golden reports (insta snapshots in tests/snapshots/) of `inspect` and `run` on hand-made
//! graphs and cases, and the determinism of `run --json`.
//!
//! Every command runs inside its scratch directory with relative paths, so the reports hold no
//! temporary path; any that slipped in would be redacted to `[TMP]`. To accept changed reports:
//! `INSTA_UPDATE=always cargo test -p shardproof --test golden` (or `cargo insta review`).

mod common;

use common::{colpar, rowpar, Out, Scratch};

/// stdout of a command that must exit `code`, with the scratch path redacted.
#[track_caller]
fn stdout(s: &Scratch, args: &[&str], code: i32) -> String {
    let out: Out = s.run(args);
    out.expect_code(code);
    s.redact(&out.stdout)
}

#[test]
fn inspect_json_of_a_rank_graph() {
    let s = rowpar();
    insta::assert_snapshot!(
        "inspect_rank_graph_json",
        stdout(&s, &["inspect", "--json", "r0.py"], 0)
    );
}

#[test]
fn inspect_text_of_a_rank_graph() {
    let s = rowpar();
    insta::assert_snapshot!(
        "inspect_rank_graph_text",
        stdout(&s, &["inspect", "r0.py"], 0)
    );
}

#[test]
fn inspect_text_of_a_case() {
    let s = rowpar();
    insta::assert_snapshot!(
        "inspect_case_text",
        stdout(&s, &["inspect", "--strict", "case.yaml"], 0)
    );
}

#[test]
fn inspect_text_of_an_unclean_graph() {
    // An opaque operator and a recorded shape our inference disagrees with.
    let s = Scratch::new();
    s.write(
        "g.py",
        r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[4, 8]", w: "f32[8, 6]"):
        mm: "f32[4, 5]" = torch.ops.aten.mm.default(x, w);  x = w = None
        foo: "f32[4, 5]" = torch.ops.mylib.foo.default(mm);  mm = None
        return (foo,)
"#,
    );
    insta::assert_snapshot!(
        "inspect_unclean_graph_text",
        stdout(&s, &["inspect", "--strict", "g.py"], 1)
    );
    insta::assert_snapshot!(
        "inspect_unclean_graph_json",
        stdout(&s, &["inspect", "--json", "g.py"], 0)
    );
}

#[test]
fn run_json_of_a_case() {
    // Column parallel: every rank computes its columns exactly, so the error is exactly 0.
    let s = colpar();
    insta::assert_snapshot!(
        "run_colpar_json",
        stdout(&s, &["run", "--json", "case.yaml"], 0)
    );
}

#[test]
fn run_text_of_a_case() {
    let s = colpar();
    insta::assert_snapshot!("run_colpar_text", stdout(&s, &["run", "case.yaml"], 0));
}

#[test]
fn run_text_of_a_violated_case() {
    // Rank 1 applies neg instead of relu.
    let s = colpar();
    s.write(
        "r1.py",
        &common::RANK_COL.replace("aten.relu.default", "aten.neg.default"),
    );
    let out = s.run(&["run", "case.yaml"]);
    out.expect_code(1);
    // The error's digits depend on floating-point summation order; the rest is pinned.
    let text: String = out
        .stdout
        .lines()
        .map(|l| match l.find("rel. error") {
            Some(i) => {
                let rest = &l[i + "rel. error".len()..];
                let status = rest.trim_start().split_once(' ').map_or("", |x| x.1);
                format!("{}rel. error [ERR] {}\n", &l[..i], status.trim_start())
            }
            None => format!("{l}\n"),
        })
        .collect();
    insta::assert_snapshot!("run_violated_text", text);
}

#[test]
fn error_message_of_a_placement_that_does_not_fit() {
    let s = rowpar();
    s.write(
        "case.yaml",
        &common::CASE_ROWPAR.replace("  x: Shard(1)", "  x: Shard(0)"),
    );
    let out = s.run(&["run", "case.yaml"]);
    out.expect_code(2);
    insta::assert_snapshot!("error_does_not_fit", s.redact(&out.stderr));
}

// ---------------------------------------------------------------------------------------------
// Determinism.

#[test]
fn run_json_twice_is_byte_identical() {
    for s in [rowpar(), colpar()] {
        for extra in [&[][..], &["--seed", "7"][..], &["--dtype", "bf16"][..]] {
            let mut args = vec!["run", "--json"];
            args.extend_from_slice(extra);
            args.push("case.yaml");
            let a = s.run(&args);
            let b = s.run(&args);
            a.expect_code(0);
            assert_eq!(a.stdout, b.stdout, "run {args:?} differs between two runs");
            assert_eq!(a.stderr, b.stderr);
        }
    }
}

#[test]
fn run_json_of_a_violated_case_is_byte_identical_and_depends_on_the_seed() {
    let s = rowpar();
    s.write("r0.py", common::RANK_MM_PARTIAL);
    s.write("r1.py", common::RANK_MM_PARTIAL);
    s.write(
        "case.yaml",
        &common::CASE_ROWPAR.replace("mm: Partial()", "mm: Replicate()"),
    );
    let a = s.run(&["run", "--json", "case.yaml"]);
    let b = s.run(&["run", "--json", "case.yaml"]);
    a.expect_code(1);
    assert_eq!(a.stdout, b.stdout);
    let seeded = s.run(&["run", "--json", "--seed", "7", "case.yaml"]);
    seeded.expect_code(1);
    assert_ne!(
        a.json()["outputs"][0]["rel_error"],
        seeded.json()["outputs"][0]["rel_error"],
        "the seed changes the random inputs"
    );
    assert_eq!(seeded.json()["seed"], 7);
}

#[test]
fn quiet_changes_nothing_on_a_pipe() {
    let s = rowpar();
    let plain = s.run(&["run", "case.yaml"]);
    let quiet = s.run(&["run", "--quiet", "case.yaml"]);
    plain.expect_code(0);
    quiet.expect_code(0);
    assert_eq!(plain.stdout, quiet.stdout);
    // No progress output when stderr is not a terminal.
    assert_eq!(plain.stderr, "");
    assert_eq!(quiet.stderr, "");
}

#[test]
fn inspect_json_twice_is_byte_identical() {
    let s = rowpar();
    let a = s.run(&["inspect", "--json", "case.yaml"]);
    let b = s.run(&["inspect", "--json", "case.yaml"]);
    a.expect_code(0);
    assert_eq!(a.stdout, b.stdout);
}
