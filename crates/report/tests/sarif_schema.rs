//! The SARIF documents of hand-made reports validate against the official SARIF 2.1.0 schema
//! (tests/data/sarif-schema-2.1.0.json, from OASIS; see tests/data/README.md), formats
//! included. The command line's own documents are checked the same way in
//! crates/cli/tests/reports.rs.

use serde_json::Value;
use shardproof_report::{
    sarif, Command, Consumer, Finding, Level, Location, NeighbourInput, Neighbourhood, Relation,
    Report, Rule, Verdict,
};

fn validator() -> jsonschema::Validator {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/sarif-schema-2.1.0.json"
    );
    let text = std::fs::read_to_string(path).expect("the SARIF schema is in tests/data");
    let schema: Value = serde_json::from_str(&text).expect("the schema is JSON");
    jsonschema::options()
        .should_validate_formats(true)
        .build(&schema)
        .expect("the schema compiles")
}

/// The schema's complaints about `doc`, one line each.
fn errors(doc: &Value) -> Vec<String> {
    validator()
        .iter_errors(doc)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect()
}

#[track_caller]
fn assert_valid(report: &Report) -> Value {
    let doc: Value = serde_json::from_str(&sarif::render(report)).expect("SARIF is JSON");
    let errors = errors(&doc);
    assert!(errors.is_empty(), "{errors:#?}\n{doc:#}");
    doc
}

fn refutation() -> Report {
    let mut r = Report::new(
        Command::Verify,
        "mlp <tp2>",
        Verdict::Violated,
        "output `loss` has no clean relation to the implementation",
    );
    r.case_file = Some("cases/my case.yaml".into());
    r.seconds = Some(0.25);
    r.rules = vec![Rule::new(
        "relations-stop",
        "relations stop at a spec operator",
    )];
    r.findings.push(Finding {
        source: Location::parse("/home/user/model.py:88 in forward"),
        graph: Location::parse("cases/spec.py:9"),
        hint: Some("input `mm_1` is an unreduced partial sum".into()),
        ..Finding::new(
            "relations-stop",
            Level::Error,
            "add_1",
            "relations stop at `add_1`",
        )
    });
    r.certificate.push(Relation {
        tensor: "logits".into(),
        relations: vec!["cat(dim=1; r0.y, r1.y)".into()],
    });
    r.neighbourhood = Some(Neighbourhood {
        output: "loss".into(),
        operator: "add_1".into(),
        op: "aten.add.Tensor".into(),
        graph: Location::parse("cases/spec.py:9"),
        source: None,
        inputs: vec![NeighbourInput {
            name: "mm_1".into(),
            relations: vec!["sum(r0.mm_1, r1.mm_1)".into()],
        }],
        computed: None,
        consumers: vec![Consumer {
            name: "r0.add_1".into(),
            op: "aten.add.Tensor".into(),
            reads: vec![0],
        }],
        hint: None,
        other_stops: vec![],
    });
    r.fact("decided by", "relations");
    r
}

#[test]
fn a_refutation_with_source_and_graph_locations_validates() {
    let doc = assert_valid(&refutation());
    let result = &doc["runs"][0]["results"][0];
    assert_eq!(
        result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"],
        "file:///home/user/model.py"
    );
}

#[test]
fn check_findings_on_many_ranks_validate() {
    let mut r = Report::new(Command::Check, "c", Verdict::Violated, "2 findings");
    r.rules = vec![Rule::new("spmd-type", "x"), Rule::new("missing-wait", "y")];
    for (rule, line) in [("spmd-type", 12), ("missing-wait", 0)] {
        r.findings.push(Finding {
            graph: Some(Location {
                file: "C:\\work\\r0.py".into(),
                line: Some(line),
                column: Some(3),
            }),
            ranks: vec![0, 1],
            placements: vec!["`mm` {tp: Partial(sum) [P]}".into()],
            hint: Some("insert all_reduce".into()),
            ..Finding::new(rule, Level::Error, "mm", "partial + replicate")
        });
    }
    assert_valid(&r);
}

#[test]
fn inconclusive_holds_and_invalid_reports_validate() {
    let mut inconclusive = Report::new(Command::Run, "big", Verdict::Inconclusive, "too large");
    inconclusive.case_file = Some("case.yaml".into());
    assert_valid(&inconclusive);
    assert_valid(&Report::new(
        Command::Verify,
        "ok",
        Verdict::Holds,
        "verified",
    ));
    let mut invalid = Report::new(
        Command::Check,
        "bad",
        Verdict::Invalid,
        "error: no such file",
    );
    invalid.case_file = Some("missing/case.yaml".into());
    let doc = assert_valid(&invalid);
    assert_eq!(
        doc["runs"][0]["invocations"][0]["executionSuccessful"],
        false
    );
}

/// The schema test can fail: a document the schema forbids is caught.
#[test]
fn the_schema_rejects_what_sarif_forbids() {
    let mut doc: Value = serde_json::from_str(&sarif::render(&refutation())).unwrap();
    doc["runs"][0]["results"][0]["level"] = "fatal".into();
    doc["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["region"]["startLine"] =
        0.into();
    doc["runs"][0]["tool"]["driver"]["rules"][0]["id"] = Value::Null;
    let found = errors(&doc);
    assert!(found.len() >= 3, "{found:#?}");
    // Formats are checked too: `$schema` must be a URI. (The schema is draft-04, which knows
    // no `uri-reference` format, so artifact URIs are checked by the renderer's unit tests.)
    let mut doc: Value = serde_json::from_str(&sarif::render(&refutation())).unwrap();
    doc["$schema"] = "not a uri".into();
    assert_eq!(errors(&doc).len(), 1, "{:#?}", errors(&doc));
}
