//! `shardproof trace compare` on traces the trace crate's writer makes in a temporary
//! directory: a correct candidate holds (exit 0), a planted divergence in one module is found
//! and named (exit 1), divergent DP replicas are a bug at once (exit 1), a malformed trace is
//! invalid input (exit 2), and the JSON, SARIF and HTML outputs carry the result.

mod common;

use common::Scratch;
use shardproof_trace::synthetic::{write_candidate, write_reference, Bug, Spec};
use shardproof_trace::RunDtype;

/// Writes `ref/` (with one perturbed run) and `cand/` of `spec` into the scratch directory.
fn traces(spec: &Spec) -> Scratch {
    let s = Scratch::new();
    write_reference(&s.path().join("ref"), spec, 1).unwrap();
    write_candidate(&s.path().join("cand"), spec).unwrap();
    s
}

#[test]
fn a_correct_candidate_holds() {
    let s = traces(&Spec {
        dtype: RunDtype::Bfloat16,
        ..Spec::default()
    });
    let out = s.run(&["trace", "compare", "ref", "cand"]);
    out.expect_code(0)
        .stdout_has(&["holds: all", "layers.3.mlp", "from 1 perturbed run"]);
    out.stderr_has(&["compared"]);
    let quiet = s.run(&["trace", "compare", "ref", "cand", "--quiet"]);
    assert_eq!(quiet.stderr, "");
}

#[test]
fn a_planted_divergence_names_its_module() {
    let spec = Spec {
        bug: Some(Bug::Diverge {
            module: "layers.2.mlp".into(),
            relative: 0.05,
        }),
        ..Spec::default()
    };
    let s = traces(&spec);
    s.run(&["trace", "compare", "ref", "cand", "--html", "page.html"])
        .expect_code(1)
        .stdout_has(&[
            "first divergence at module `layers.2.mlp`",
            "tensor:          it0/mb0/forward_output/layers.2.mlp/0",
        ]);
    let page = std::fs::read_to_string(s.path().join("page.html")).unwrap();
    assert!(page.contains("<svg class=\"plot\"") && page.contains("class=\"marked\""));
    let json = s
        .run(&["trace", "compare", "ref", "cand", "--json"])
        .expect_code(1)
        .json();
    let first = json["first_divergence"].as_u64().unwrap() as usize;
    assert_eq!(json["tensors"][first]["id"]["module"], "layers.2.mlp");
    assert_eq!(json["verdict"], "violated");
    let sarif = s
        .run(&["trace", "compare", "ref", "cand", "--format", "sarif"])
        .expect_code(1)
        .json();
    assert_eq!(sarif["runs"][0]["results"][0]["ruleId"], "trace-divergence");
}

#[test]
fn divergent_replicas_are_a_bug() {
    let s = traces(&Spec {
        bug: Some(Bug::DivergentReplica {
            parameter: "layers.0.mlp.weight".into(),
        }),
        ..Spec::default()
    });
    s.run(&["trace", "compare", "ref", "cand"])
        .expect_code(1)
        .stdout_has(&[
            "replica-disagreement",
            "layers.0.mlp.weight",
            "replicas disagree",
        ]);
}

#[test]
fn a_malformed_trace_is_invalid_input() {
    let s = traces(&Spec::default());
    let meta = s.path().join("cand/trace.json");
    let text = std::fs::read_to_string(&meta).unwrap();
    std::fs::write(&meta, text.replace("\"version\": 1", "\"version\": 9")).unwrap();
    s.run(&["trace", "compare", "ref", "cand"])
        .expect_code(2)
        .stderr_has(&[
            "cand/trace.json: at $.version: expected version 1, found 9",
            "hint:",
        ]);
    s.run(&["trace", "compare", "ref", "nowhere"])
        .expect_code(2)
        .stderr_has(&["nowhere/trace.json: cannot read"]);
}

/// `zoo emit ARGS`, then `trace emit` of the case into `traces` with `dtype`.
fn emitted(s: &Scratch, name: &str, zoo: &[&str], dtype: &str) -> common::Out {
    let case = format!("{name}/case.yaml");
    let mut args = vec!["zoo", "emit"];
    args.extend_from_slice(zoo);
    args.extend_from_slice(&["-o", name]);
    s.run(&args).expect_code(0);
    s.run(&[
        "trace",
        "emit",
        &case,
        "-o",
        &format!("{name}-traces"),
        "--dtype",
        dtype,
    ])
}

#[test]
fn interpreter_traces_of_zoo_cases_hold_or_find_the_catalog_bug() {
    let s = Scratch::new();
    emitted(&s, "ok", &["mlp", "--mesh", "dp=2,tp=2"], "bf16")
        .expect_code(0)
        .stdout_has(&["ok-traces/ref (2 perturbed runs)"]);
    s.run(&["trace", "compare", "ok-traces/ref", "ok-traces/cand"])
        .expect_code(0)
        .stdout_has(&["holds: all 12 tensors"]);
    for (bug, mesh, first) in [
        ("tp-missing-allreduce", "tp=2", "module `layers.0`"),
        ("dp-loss-not-averaged", "dp=2", "module `loss`"),
        (
            "dp-grad-not-averaged",
            "dp=2",
            "module `w1_0` (param_after_step",
        ),
    ] {
        emitted(&s, bug, &["mlp", "--mesh", mesh, "--bug", bug], "f32").expect_code(0);
        let traces = format!("{bug}-traces");
        s.run(&[
            "trace",
            "compare",
            &format!("{traces}/ref"),
            &format!("{traces}/cand"),
        ])
        .expect_code(1)
        .stdout_has(&[first]);
    }
    // Emitting again into the same directory would mix runs: refused.
    s.run(&["trace", "emit", "ok/case.yaml", "-o", "ok-traces"])
        .expect_code(2)
        .stderr_has(&["is not empty"]);
}

#[test]
fn interpreter_traces_refuse_what_they_cannot_represent() {
    // Integer inputs (token ids, labels) are drawn and fed, not recorded: llama emits.
    let s = Scratch::new();
    emitted(&s, "llama", &["llama", "--mesh", "tp=2"], "f32")
        .expect_code(0)
        .stdout_has(&["module outputs)"]);
    // An input laid out by an `expr:` has no per-rank pieces.
    let r = common::rowpar();
    r.write(
        "case.yaml",
        &common::CASE_ROWPAR.replace(
            "  w: Shard(0)",
            "  w: { expr: \"concat([r0.w, r1.w], 0)\" }",
        ),
    );
    r.run(&["trace", "emit", "case.yaml", "-o", "t"])
        .expect_code(3)
        .stderr_has(&["`w` is laid out by an `expr:`", "hint:"]);
}
