//! `check` on programs captured from PyTorch with the fake process group
//! (`$SHARDPROOF_ORACLE_DIR/check`, written by `scripts/oracle-capture` from
//! python/oracle/check_cases.py): the seed's four bug types (a row-parallel matmul's missing
//! all-reduce, a layer norm over a sharded hidden dim, an asynchronous all-reduce read without
//! its wait, a recv whose tag no send uses: it waits for a message no rank sends), each with
//! its correct version.

use shardproof_check::{check_case, Verdict};
use std::path::PathBuf;

/// The captured cases, or `None` (with a message) when `SHARDPROOF_ORACLE_DIR` is unset.
fn cases() -> Option<Vec<PathBuf>> {
    let Some(root) = std::env::var_os("SHARDPROOF_ORACLE_DIR") else {
        eprintln!(
            "SKIPPED: SHARDPROOF_ORACLE_DIR is not set; run `scripts/oracle-capture` and set it \
             to its output (target/oracle) to check the captured PyTorch programs"
        );
        return None;
    };
    let dir = PathBuf::from(root).join("check");
    let mut out: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| {
            panic!(
                "SHARDPROOF_ORACLE_DIR is set but {} is missing ({e}): run `scripts/oracle-capture`",
                dir.display()
            )
        })
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("case.yaml").exists())
        .collect();
    out.sort();
    Some(out)
}

#[test]
fn captured_programs_get_their_verdicts_at_their_operators() {
    let Some(cases) = cases() else { return };
    assert_eq!(cases.len(), 8, "{cases:?}");
    for dir in cases {
        let expected: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap())
                .unwrap();
        let case = shardproof_case::load_case(&dir.join("case.yaml"))
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let report = check_case(&case).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        match expected["verdict"].as_str() {
            Some("holds") => {
                assert_eq!(
                    report.verdict,
                    Verdict::Holds,
                    "{name}:\n{}",
                    report.render()
                );
                assert_eq!(report.unknown_values, 0, "{name}:\n{}", report.render());
            }
            _ => {
                assert_eq!(
                    report.verdict,
                    Verdict::Violated,
                    "{name}:\n{}",
                    report.render()
                );
                let check = expected["check"].as_str().unwrap();
                let op = expected["op"].as_str().unwrap();
                assert!(
                    report
                        .findings
                        .iter()
                        .any(|f| f.check.name() == check && f.op.as_deref() == Some(op)),
                    "{name}: no {check} finding at {op}:\n{}",
                    report.render()
                );
            }
        }
    }
}
