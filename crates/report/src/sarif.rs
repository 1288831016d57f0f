//! SARIF 2.1.0 ([OASIS standard](https://docs.oasis-open.org/sarif/sarif/v2.1.0/)), the format
//! code-scanning interfaces read: one run of the tool `shardproof`, one result per finding.
//!
//! - **Driver**: name `shardproof`, the report's version, and the command's rules (ids and
//!   one-line descriptions); a result's rule not among them is added with its id as its text.
//! - **Results**: one per [`Finding`], at its [`Finding::location`] (the captured Python source
//!   when there is one, else the graph file and line); the graph node is a related location
//!   when the source comes first, and the node or output is a logical location. Levels:
//!   `error` for a violation, `warning` for an inconclusive finding. A violated or
//!   inconclusive verdict that no finding carries gets one result of rule `verdict` at the
//!   case file, so a code-scanning view never shows such a run as clean.
//! - **Invocation**: the exit code, `executionSuccessful: false` for invalid input, with the
//!   error as a notification (no results then).
//! - **Paths**: relative paths as relative URIs with `uriBaseId` `%SRCROOT%` (the directory
//!   shardproof ran in), absolute ones as `file://` URIs; characters other than unreserved ones
//!   and `/` are percent-encoded.
//! - **Run properties**: the command, case, verdict, summary, seconds, certificate and facts.

use crate::{Finding, Location, Report, Verdict};
use serde_json::{json, Map, Value};

/// The URI of the SARIF 2.1.0 schema (OASIS errata 01), written as the document's `$schema`.
pub const SCHEMA_URI: &str =
    "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json";

/// The base every relative path is resolved against: the directory shardproof ran in.
pub const SOURCE_ROOT: &str = "%SRCROOT%";

/// The rule of a result that stands for a whole verdict no finding carries.
pub const VERDICT_RULE: &str = "verdict";

/// The report as a SARIF 2.1.0 document (pretty-printed JSON, no trailing newline).
///
/// ```
/// use shardproof_report::{sarif, Command, Finding, Level, Location, Report, Verdict};
/// let mut r = Report::new(Command::Run, "mlp", Verdict::Violated, "output `loss` differs");
/// r.findings.push(Finding {
///     graph: Location::parse("spec.py:9"),
///     ..Finding::new("output-mismatch", Level::Error, "loss", "relative error 0.45")
/// });
/// let doc: serde_json::Value = serde_json::from_str(&sarif::render(&r)).unwrap();
/// let result = &doc["runs"][0]["results"][0];
/// assert_eq!(result["level"], "error");
/// let at = &result["locations"][0]["physicalLocation"];
/// assert_eq!(at["artifactLocation"]["uri"], "spec.py");
/// assert_eq!(at["artifactLocation"]["uriBaseId"], "%SRCROOT%");
/// assert_eq!(at["region"]["startLine"], 9);
/// assert_eq!(doc["runs"][0]["invocations"][0]["exitCode"], 1);
/// ```
pub fn render(report: &Report) -> String {
    // A `Value` always serializes; the fallback is never reached.
    serde_json::to_string_pretty(&document(report)).unwrap_or_default()
}

/// The report as a SARIF document, for callers that add to it before writing.
pub fn document(report: &Report) -> Value {
    let findings = findings_of(report);
    let mut rules: Vec<(String, String)> = report
        .rules
        .iter()
        .map(|r| (r.id.clone(), r.description.clone()))
        .collect();
    for f in &findings {
        if !rules.iter().any(|(id, _)| *id == f.rule) {
            let description = if f.rule == VERDICT_RULE {
                "The command's verdict, where no single finding carries it.".to_string()
            } else {
                f.rule.clone()
            };
            rules.push((f.rule.clone(), description));
        }
    }
    let results: Vec<Value> = findings
        .iter()
        .map(|f| {
            let index = rules.iter().position(|(id, _)| *id == f.rule).unwrap_or(0);
            result(report, f, index)
        })
        .collect();
    let rules: Vec<Value> = rules
        .iter()
        .map(|(id, text)| json!({ "id": id, "shortDescription": { "text": text } }))
        .collect();
    let mut invocation = json!({
        "executionSuccessful": report.verdict != Verdict::Invalid,
        "exitCode": report.exit_code(),
    });
    if report.verdict == Verdict::Invalid {
        let mut notification = json!({
            "level": "error",
            "message": { "text": report.summary },
        });
        if let Some(file) = &report.case_file {
            notification["locations"] = json!([location(&Location::file(file.clone()), None)]);
        }
        invocation["toolExecutionNotifications"] = json!([notification]);
    }
    json!({
        "$schema": SCHEMA_URI,
        "version": "2.1.0",
        "runs": [{
            "tool": { "driver": {
                "name": "shardproof",
                "version": report.tool_version,
                "rules": rules,
            }},
            "invocations": [invocation],
            "results": results,
            "properties": run_properties(report),
        }],
    })
}

/// The report's findings, plus one standing for the verdict when none carries it.
fn findings_of(report: &Report) -> Vec<Finding> {
    let mut findings = report.findings.clone();
    let undecided_or_violated = matches!(report.verdict, Verdict::Violated | Verdict::Inconclusive);
    if findings.is_empty() && undecided_or_violated {
        let level = if report.verdict == Verdict::Violated {
            crate::Level::Error
        } else {
            crate::Level::Warning
        };
        let mut f = Finding::new(VERDICT_RULE, level, "", report.summary.clone());
        f.graph = report.case_file.clone().map(Location::file);
        findings.push(f);
    }
    findings
}

fn result(report: &Report, f: &Finding, rule_index: usize) -> Value {
    let text = match &f.hint {
        Some(h) => format!("{}\nhint: {h}", f.message),
        None => f.message.clone(),
    };
    let mut r = json!({
        "ruleId": f.rule,
        "ruleIndex": rule_index,
        "level": f.level.sarif_name(),
        "message": { "text": text },
    });
    let subject = (!f.subject.is_empty()).then_some(f.subject.as_str());
    // A result with no place of its own points at the case file: code-scanning views need one.
    let primary = f
        .location()
        .cloned()
        .or_else(|| report.case_file.clone().map(Location::file));
    if let Some(at) = &primary {
        r["locations"] = json!([location(at, subject)]);
    }
    if let (Some(_), Some(graph)) = (&f.source, &f.graph) {
        let mut related = location(graph, subject);
        related["id"] = json!(1);
        related["message"] = json!({ "text": "the operator in the graph file" });
        r["relatedLocations"] = json!([related]);
    }
    let mut properties = Map::new();
    if let Some(s) = subject {
        properties.insert("subject".into(), json!(s));
    }
    if !f.ranks.is_empty() {
        properties.insert("ranks".into(), json!(f.ranks));
    }
    if !f.placements.is_empty() {
        properties.insert("placements".into(), json!(f.placements));
    }
    if let Some(h) = &f.hint {
        properties.insert("hint".into(), json!(h));
    }
    if !properties.is_empty() {
        r["properties"] = Value::Object(properties);
    }
    r
}

fn run_properties(report: &Report) -> Value {
    let mut p = Map::new();
    p.insert("command".into(), json!(report.command.name()));
    p.insert("case".into(), json!(report.case));
    p.insert("verdict".into(), json!(report.verdict_word()));
    p.insert("summary".into(), json!(report.summary));
    if let Some(s) = report.seconds.filter(|s| s.is_finite()) {
        p.insert("seconds".into(), json!(s));
    }
    if !report.certificate.is_empty() {
        let certificate: Vec<Value> = report
            .certificate
            .iter()
            .map(|c| json!({ "tensor": c.tensor, "relations": c.relations }))
            .collect();
        p.insert("certificate".into(), json!(certificate));
    }
    if !report.facts.is_empty() {
        let facts: Vec<Value> = report
            .facts
            .iter()
            .map(|f| json!({ "label": f.label, "value": f.value }))
            .collect();
        p.insert("facts".into(), json!(facts));
    }
    Value::Object(p)
}

/// A SARIF `location`: the file and line, and the operator as a logical location.
fn location(at: &Location, subject: Option<&str>) -> Value {
    let mut physical = json!({ "artifactLocation": artifact(&at.file) });
    if let Some(line) = at.line.filter(|&l| l >= 1) {
        let mut region = json!({ "startLine": line });
        if let Some(column) = at.column.filter(|&c| c >= 1) {
            region["startColumn"] = json!(column);
        }
        physical["region"] = region;
    }
    let mut l = json!({ "physicalLocation": physical });
    if let Some(s) = subject {
        l["logicalLocations"] = json!([{ "name": s }]);
    }
    l
}

/// A SARIF `artifactLocation` for a path as the engines wrote it.
fn artifact(path: &str) -> Value {
    let path = path.replace('\\', "/");
    let drive = path.len() >= 3
        && path.as_bytes()[0].is_ascii_alphabetic()
        && &path.as_bytes()[1..3] == b":/";
    if drive {
        // `C:/m/a.py` is `file:///C:/m/a.py`; the drive's colon is no scheme there.
        return json!({ "uri": format!("file:///{}:{}", &path[..1], encode(&path[2..])) });
    }
    if path.starts_with('/') {
        return json!({ "uri": format!("file://{}", encode(&path)) });
    }
    json!({ "uri": encode(&path), "uriBaseId": SOURCE_ROOT })
}

/// Percent-encodes everything but unreserved characters and `/` (RFC 3986), byte by byte:
/// a `:` left in a relative path's first segment would read as a scheme.
fn encode(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Command, Level, Rule};

    fn finding(source: Option<&str>, graph: Option<&str>) -> Finding {
        Finding {
            source: source.and_then(Location::parse),
            graph: graph.and_then(Location::parse),
            ..Finding::new("spmd-type", Level::Error, "add_1", "partial + replicate")
        }
    }

    fn first_result(report: &Report) -> Value {
        document(report)["runs"][0]["results"][0].clone()
    }

    #[test]
    fn a_result_sits_at_the_source_with_the_graph_related() {
        let mut r = Report::new(Command::Check, "c", Verdict::Violated, "1 finding");
        r.findings
            .push(finding(Some("model.py:88 in forward"), Some("r0.py:12")));
        let res = first_result(&r);
        let at = &res["locations"][0]["physicalLocation"];
        assert_eq!(at["artifactLocation"]["uri"], "model.py");
        assert_eq!(at["region"]["startLine"], 88);
        let related = &res["relatedLocations"][0]["physicalLocation"];
        assert_eq!(related["artifactLocation"]["uri"], "r0.py");
        assert_eq!(related["region"]["startLine"], 12);
        assert_eq!(res["locations"][0]["logicalLocations"][0]["name"], "add_1");
    }

    #[test]
    fn without_source_a_result_sits_at_the_graph() {
        let mut r = Report::new(Command::Check, "c", Verdict::Violated, "1 finding");
        r.findings.push(finding(None, Some("dir/r0.py:12")));
        let res = first_result(&r);
        let at = &res["locations"][0]["physicalLocation"];
        assert_eq!(at["artifactLocation"]["uri"], "dir/r0.py");
        assert_eq!(at["artifactLocation"]["uriBaseId"], SOURCE_ROOT);
        assert_eq!(at["region"]["startLine"], 12);
        assert!(res.get("relatedLocations").is_none());
    }

    #[test]
    fn absolute_and_odd_paths_are_uris() {
        assert_eq!(
            artifact("/home/u/my model.py"),
            json!({ "uri": "file:///home/u/my%20model.py" })
        );
        assert_eq!(
            artifact("C:\\m\\a.py"),
            json!({ "uri": "file:///C:/m/a.py" })
        );
        assert_eq!(
            artifact("a:b/ü.py"),
            json!({ "uri": "a%3Ab/%C3%BC.py", "uriBaseId": SOURCE_ROOT })
        );
    }

    #[test]
    fn rules_are_indexed_and_unknown_ones_added() {
        let mut r = Report::new(Command::Check, "c", Verdict::Violated, "2 findings");
        r.rules = vec![Rule::new("postcondition", "a"), Rule::new("spmd-type", "b")];
        r.findings.push(finding(None, None));
        r.findings
            .push(Finding::new("new-rule", Level::Warning, "x", "y"));
        let doc = document(&r);
        let run = &doc["runs"][0];
        assert_eq!(run["results"][0]["ruleIndex"], 1);
        assert_eq!(run["results"][1]["ruleIndex"], 2);
        assert_eq!(run["results"][1]["level"], "warning");
        assert_eq!(run["tool"]["driver"]["rules"][2]["id"], "new-rule");
    }

    #[test]
    fn a_verdict_without_findings_still_gets_a_result() {
        let mut r = Report::new(Command::Run, "c", Verdict::Inconclusive, "too large");
        r.case_file = Some("case.yaml".into());
        let res = first_result(&r);
        assert_eq!(res["ruleId"], VERDICT_RULE);
        assert_eq!(res["level"], "warning");
        assert_eq!(
            res["locations"][0]["physicalLocation"]["artifactLocation"]["uri"],
            "case.yaml"
        );
        let holds = Report::new(Command::Run, "c", Verdict::Holds, "ok");
        assert_eq!(document(&holds)["runs"][0]["results"], json!([]));
    }

    #[test]
    fn invalid_input_is_an_unsuccessful_invocation() {
        let mut r = Report::new(
            Command::Verify,
            "c",
            Verdict::Invalid,
            "error: no such file",
        );
        r.case_file = Some("case.yaml".into());
        let doc = document(&r);
        let inv = &doc["runs"][0]["invocations"][0];
        assert_eq!(inv["executionSuccessful"], false);
        assert_eq!(inv["exitCode"], 2);
        assert_eq!(
            inv["toolExecutionNotifications"][0]["message"]["text"],
            "error: no such file"
        );
        assert_eq!(doc["runs"][0]["results"], json!([]));
    }
}
