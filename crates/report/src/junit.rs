//! JUnit XML, the format CI dashboards read: one `<testsuite>` for the command on its case, one
//! `<testcase>` per checked thing ([`Report::checked`]).
//!
//! - A passed case is empty but for its detail in `<system-out>` (verify: the relation);
//!   a failed one holds `<failure message=.. type=RULE>` with the detail as its text; an
//!   undecided one `<skipped message=..>`; one that could not be checked `<error>`.
//! - A report with nothing checked one by one (invalid input, a run stopped before comparing)
//!   gets one test case named after the case, standing for the verdict: invalid input is then
//!   an `<error>`, so a dashboard counts it as broken rather than as passed.
//! - The suite carries the counts, the report's seconds as `time`, and the command, case,
//!   verdict, exit code and facts as `<properties>`; the summary is its `<system-out>`.

use crate::escape::{attribute, markup};
use crate::{Checked, Report, Status, Verdict};
use std::fmt::Write as _;

/// How many test cases a document has, by outcome.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// All test cases.
    pub tests: usize,
    /// Those that failed.
    pub failures: usize,
    /// Those that could not be checked.
    pub errors: usize,
    /// Those left undecided.
    pub skipped: usize,
}

/// The test cases of a report: its checked things, or one for the verdict when it has none.
///
/// ```
/// use shardproof_report::{junit, Command, Report, Status, Verdict};
/// let r = Report::new(Command::Verify, "mlp", Verdict::Invalid, "error: no such file");
/// let cases = junit::cases(&r);
/// assert_eq!((cases.len(), cases[0].status), (1, Status::Error));
/// ```
pub fn cases(report: &Report) -> Vec<Checked> {
    if !report.checked.is_empty() {
        return report.checked.clone();
    }
    let status = match report.verdict {
        Verdict::Holds => Status::Passed,
        Verdict::Violated => Status::Failed,
        Verdict::Inconclusive => Status::Skipped,
        Verdict::Invalid => Status::Error,
    };
    let mut whole = Checked::new(report.case.clone(), status);
    if status != Status::Passed {
        whole.message = Some(report.summary.clone());
    }
    if status == Status::Failed {
        whole.rule = Some(crate::sarif::VERDICT_RULE.to_string());
    }
    vec![whole]
}

/// The counts of [`cases`].
pub fn counts(report: &Report) -> Counts {
    let cases = cases(report);
    let count = |s: Status| cases.iter().filter(|c| c.status == s).count();
    Counts {
        tests: cases.len(),
        failures: count(Status::Failed),
        errors: count(Status::Error),
        skipped: count(Status::Skipped),
    }
}

/// The report as a JUnit XML document.
///
/// ```
/// use shardproof_report::{junit, Checked, Command, Report, Status, Verdict};
/// let mut r = Report::new(Command::Run, "mlp", Verdict::Violated, "output `loss` differs");
/// r.checked.push(Checked::new("logits", Status::Passed));
/// r.checked.push(Checked {
///     message: Some("relative error 4.5e-1 over 1e-9".into()),
///     ..Checked::new("loss", Status::Failed)
/// });
/// let xml = junit::render(&r);
/// assert!(xml.contains(r#"tests="2" failures="1" errors="0" skipped="0""#));
/// assert!(xml.contains(r#"<failure message="relative error 4.5e-1 over 1e-9""#));
/// ```
pub fn render(report: &Report) -> String {
    let cases = cases(report);
    let c = counts(report);
    let time = report
        .seconds
        .filter(|s| s.is_finite() && *s >= 0.0)
        .unwrap_or(0.0);
    let counts = format!(
        r#"tests="{}" failures="{}" errors="{}" skipped="{}" time="{time:.3}""#,
        c.tests, c.failures, c.errors, c.skipped
    );
    let suite = format!("{} {}", report.command.name(), report.case);
    let class = format!("shardproof.{}.{}", report.command.name(), report.case);
    let mut x = String::new();
    x.push_str("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        x,
        r#"<testsuites name="shardproof {}" {counts}>"#,
        attribute(report.command.name())
    );
    let _ = writeln!(x, r#"  <testsuite name="{}" {counts}>"#, attribute(&suite));
    x.push_str("    <properties>\n");
    let mut property = |name: &str, value: &str| {
        let _ = writeln!(
            x,
            r#"      <property name="{}" value="{}"/>"#,
            attribute(name),
            attribute(value)
        );
    };
    property("command", report.command.name());
    property("case", &report.case);
    property("verdict", report.verdict_word());
    property("exit_code", &report.exit_code().to_string());
    for f in &report.facts {
        property(&f.label, &f.value);
    }
    x.push_str("    </properties>\n");
    for case in &cases {
        testcase(&mut x, &class, case);
    }
    let _ = writeln!(
        x,
        "    <system-out>{}</system-out>",
        markup(&report.summary)
    );
    x.push_str("  </testsuite>\n</testsuites>\n");
    x
}

fn testcase(x: &mut String, class: &str, case: &Checked) {
    let open = format!(
        r#"    <testcase name="{}" classname="{}""#,
        attribute(&case.name),
        attribute(class)
    );
    let message = case.message.as_deref().unwrap_or("");
    let detail = case.detail.as_deref().unwrap_or("");
    let kind = attribute(case.rule.as_deref().unwrap_or(""));
    let element = match case.status {
        Status::Passed if detail.is_empty() => {
            let _ = writeln!(x, "{open}/>");
            return;
        }
        Status::Passed => {
            let _ = writeln!(
                x,
                "{open}>\n      <system-out>{}</system-out>\n    </testcase>",
                markup(detail)
            );
            return;
        }
        Status::Failed => "failure",
        Status::Error => "error",
        Status::Skipped => "skipped",
    };
    let _ = writeln!(x, "{open}>");
    let typed = if kind.is_empty() || case.status == Status::Skipped {
        String::new()
    } else {
        format!(r#" type="{kind}""#)
    };
    if detail.is_empty() {
        let _ = writeln!(
            x,
            r#"      <{element} message="{}"{typed}/>"#,
            attribute(message)
        );
    } else {
        let _ = writeln!(
            x,
            r#"      <{element} message="{}"{typed}>{}</{element}>"#,
            attribute(message),
            markup(detail)
        );
    }
    x.push_str("    </testcase>\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Command;

    fn parse(xml: &str) -> roxmltree::Document<'_> {
        roxmltree::Document::parse(xml).unwrap_or_else(|e| panic!("{e}\n{xml}"))
    }

    fn attr<'a>(node: roxmltree::Node<'a, 'a>, name: &str) -> &'a str {
        node.attribute(name).unwrap_or_default()
    }

    #[test]
    fn counts_follow_the_checked_outputs() {
        let mut r = Report::new(Command::Verify, "c", Verdict::Violated, "refuted");
        for (name, status) in [
            ("a", Status::Passed),
            ("b", Status::Failed),
            ("c", Status::Skipped),
            ("d", Status::Skipped),
        ] {
            r.checked.push(Checked {
                message: Some(format!("{name} went so")),
                detail: Some(format!("{name} = r0.{name}")),
                rule: Some("relations-stop".into()),
                ..Checked::new(name, status)
            });
        }
        let xml = render(&r);
        let doc = parse(&xml);
        let suite = doc
            .descendants()
            .find(|n| n.has_tag_name("testsuite"))
            .unwrap();
        assert_eq!(
            ["tests", "failures", "errors", "skipped"].map(|a| attr(suite, a)),
            ["4", "1", "0", "2"]
        );
        let cases: Vec<_> = suite
            .children()
            .filter(|n| n.has_tag_name("testcase"))
            .collect();
        assert_eq!(cases.len(), 4);
        let failure = cases[1]
            .children()
            .find(|n| n.has_tag_name("failure"))
            .unwrap();
        assert_eq!(attr(failure, "message"), "b went so");
        assert_eq!(attr(failure, "type"), "relations-stop");
        assert_eq!(failure.text(), Some("b = r0.b"));
        assert!(cases[2].children().any(|n| n.has_tag_name("skipped")));
        assert_eq!(counts(&r).skipped, 2);
    }

    #[test]
    fn names_with_markup_stay_well_formed() {
        let mut r = Report::new(Command::Check, "a<b>&\"c'", Verdict::Violated, "x\ny");
        r.checked.push(Checked {
            message: Some("<&\"'>\nsecond line".into()),
            ..Checked::new("n<&\"'>\u{1}", Status::Failed)
        });
        let xml = render(&r);
        let doc = parse(&xml);
        let case = doc
            .descendants()
            .find(|n| n.has_tag_name("testcase"))
            .unwrap();
        assert_eq!(attr(case, "name"), "n<&\"'>\u{FFFD}");
        let failure = case.first_element_child().unwrap();
        assert_eq!(attr(failure, "message"), "<&\"'>\nsecond line");
        let suite = doc
            .descendants()
            .find(|n| n.has_tag_name("testsuite"))
            .unwrap();
        assert_eq!(attr(suite, "name"), "check a<b>&\"c'");
    }

    #[test]
    fn invalid_input_is_one_error() {
        let r = Report::new(Command::Run, "c", Verdict::Invalid, "error: bad yaml");
        let xml = render(&r);
        let doc = parse(&xml);
        let suite = doc
            .descendants()
            .find(|n| n.has_tag_name("testsuite"))
            .unwrap();
        assert_eq!(attr(suite, "errors"), "1");
        let error = doc.descendants().find(|n| n.has_tag_name("error")).unwrap();
        assert_eq!(attr(error, "message"), "error: bad yaml");
        let exit = doc
            .descendants()
            .find(|n| n.has_tag_name("property") && attr(*n, "name") == "exit_code")
            .unwrap();
        assert_eq!(attr(exit, "value"), "2");
    }
}
