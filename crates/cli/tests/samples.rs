//! `shardproof inspect` on the Megatron-LM graphs of the Entangle samples (read from the shared
//! folder at run time; skipped with a message when it is absent).

mod common;

use common::{entangle_samples, shardproof_in};

const BUG_SPEC: &str = "bug_missing_allreduce_under_wrong_config/tp1/both.g0.r0.py";

#[test]
fn inspect_strict_is_clean_on_the_correct_case() {
    let Some(dir) = entangle_samples() else {
        return;
    };
    let out = shardproof_in(&dir, &["inspect", "--strict", "case-tp2.yaml"]);
    out.expect_code(0).stdout_has(&[
        "spec: gpt/paral1_layer1/fw.g0.r0.py",
        "rank 0: gpt/paral2_layer1/fw.g0.r0.py",
        "rank 1: gpt/paral2_layer1/fw.g0.r1.py",
        "on group \"12\"",
        "clean: every line parsed, no opaque operator, every shape agrees",
    ]);
    assert!(
        !out.stdout.contains("opaque operators: tg."),
        "{}",
        out.stdout
    );
}

#[test]
fn inspect_strict_is_clean_on_the_bug_case_thanks_to_its_ops() {
    // The graphs call the capture tool's `tg.*` operators; the case's `ops:` declares them.
    let Some(dir) = entangle_samples() else {
        return;
    };
    shardproof_in(&dir, &["inspect", "--strict", "case-bug-tp2.yaml"])
        .expect_code(0)
        .stdout_has(&[
            "rank 1: bug_missing_allreduce_under_wrong_config/tp2.bug/both.g0.r1.py",
            "clean: every line parsed",
        ]);
}

#[test]
fn inspect_json_on_the_cases_reports_every_graph_clean() {
    let Some(dir) = entangle_samples() else {
        return;
    };
    for case in ["case-tp2.yaml", "case-bug-tp2.yaml"] {
        let out = shardproof_in(&dir, &["inspect", "--strict", "--json", case]);
        out.expect_code(0);
        let v = out.json();
        assert_eq!(v["clean"], true, "{case}");
        let graphs = v["graphs"].as_array().expect("graphs");
        let roles: Vec<&str> = graphs.iter().map(|g| g["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["spec", "rank 0", "rank 1"], "{case}");
        for g in graphs {
            let what = format!("{case}: {}", g["role"]);
            assert_eq!(
                g["lines"]["unparsed"].as_array().unwrap().len(),
                0,
                "{what}"
            );
            assert_eq!(g["opaque"].as_array().unwrap().len(), 0, "{what}");
            assert_eq!(g["shape_mismatches"].as_array().unwrap().len(), 0, "{what}");
            assert_eq!(
                g["inference_failures"].as_array().unwrap().len(),
                0,
                "{what}"
            );
            assert!(g["shapes_checked"].as_u64().unwrap() > 100, "{what}");
            let lines = &g["lines"];
            assert_eq!(
                lines["total"].as_u64().unwrap(),
                lines["parsed"].as_u64().unwrap() + lines["ignored"].as_u64().unwrap(),
                "{what}"
            );
        }
        // The rank graphs call collectives; the spec's are on one-member groups.
        assert!(
            !graphs[1]["collectives"].as_array().unwrap().is_empty(),
            "{case}"
        );
    }
}

#[test]
fn inspect_strict_on_the_bug_spec_alone_finds_the_opaque_tg_ops() {
    // Without the case, nothing gives the `tg.*` operators a meaning.
    let Some(dir) = entangle_samples() else {
        return;
    };
    shardproof_in(&dir, &["inspect", "--strict", BUG_SPEC])
        .expect_code(1)
        .stdout_has(&[
            "graph: bug_missing_allreduce_under_wrong_config/tp1/both.g0.r0.py",
            "opaque operators: tg.inplace_log_tensor.default x",
            "tg.log_tensor.default x",
            "not clean (--strict)",
        ]);
    // Without --strict the same report exits 0.
    shardproof_in(&dir, &["inspect", BUG_SPEC])
        .expect_code(0)
        .stdout_has(&["not clean: "]);
}

#[test]
fn inspect_json_on_the_bug_spec_alone_parses_every_line() {
    let Some(dir) = entangle_samples() else {
        return;
    };
    let out = shardproof_in(&dir, &["inspect", "--strict", "--json", BUG_SPEC]);
    out.expect_code(1);
    let v = out.json();
    assert_eq!(v["path"], BUG_SPEC);
    assert_eq!(v["clean"], false);
    let graphs = v["graphs"].as_array().unwrap();
    assert_eq!(graphs.len(), 1);
    let g = &graphs[0];
    assert_eq!(g["role"], "graph");
    assert_eq!(g["lines"]["unparsed"].as_array().unwrap().len(), 0);
    assert!(g["lines"]["parsed"].as_u64().unwrap() > 0);
    assert!(g["nodes"].as_u64().unwrap() > 100);
    let opaque: Vec<&str> = g["opaque"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o[0].as_str().unwrap())
        .collect();
    assert!(!opaque.is_empty());
    assert!(
        opaque.iter().all(|o| o.starts_with("tg.")),
        "only the tg.* operators are opaque: {opaque:?}"
    );
    assert_eq!(g["shape_mismatches"].as_array().unwrap().len(), 0);
    assert_eq!(g["inference_failures"].as_array().unwrap().len(), 0);
}
