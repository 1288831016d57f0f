//! The one report of shardproof's verdict commands (`run`, `verify`, `check`) and the documents
//! rendered from it: SARIF 2.1.0 for code-scanning interfaces ([`sarif`]), JUnit XML for CI
//! dashboards ([`junit`]) and a self-contained HTML page that draws where relations stop
//! ([`html`]).
//!
//! Data flows one way: the command line converts each engine's result into a [`Report`], and
//! the renderers read only the report. They know nothing of the engines, so a new engine gets
//! every format by filling a `Report`, and a new format reads every engine. Every renderer is
//! deterministic: the same report gives the same bytes (the only time in a document is the
//! report's own [`Report::seconds`]).
//!
//! ```
//! use shardproof_report::{Command, Finding, Level, Location, Report, Verdict};
//!
//! let mut report = Report::new(Command::Check, "rowpar", Verdict::Violated, "1 finding");
//! report.findings.push(Finding {
//!     source: Location::parse("model.py:88"),
//!     graph: Location::parse("r0.py:12"),
//!     ..Finding::new("spmd-type", Level::Error, "mm", "adds a partial sum and a replicated tensor")
//! });
//! assert_eq!(report.exit_code(), 1);
//! // The user's source comes first, the graph file after it.
//! assert_eq!(report.findings[0].location().unwrap().to_string(), "model.py:88");
//! let sarif = shardproof_report::sarif::render(&report);
//! assert!(sarif.contains("\"ruleId\": \"spmd-type\""));
//! let junit = shardproof_report::junit::render(&report);
//! assert!(junit.contains("<testsuite "));
//! let page = shardproof_report::html::render(&report);
//! assert!(page.starts_with("<!DOCTYPE html>"));
//! ```

#![warn(missing_docs)]

mod escape;
mod graph;
pub mod html;
pub mod junit;
mod plot;
pub mod sarif;

use std::fmt;

/// The command a report comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// `shardproof run`: the numerical differential check.
    Run,
    /// `shardproof verify`: the refinement engine.
    Verify,
    /// `shardproof check`: the static placement checker.
    Check,
    /// `shardproof prove`: the element-level prover.
    Prove,
    /// `shardproof trace compare`: trace testing of a real run against a reference run.
    Trace,
}

impl Command {
    /// The command's name on the command line (`run`, `verify`, `check`).
    pub fn name(self) -> &'static str {
        match self {
            Command::Run => "run",
            Command::Verify => "verify",
            Command::Check => "check",
            Command::Prove => "prove",
            Command::Trace => "trace",
        }
    }

    /// The word the command's text report uses for `verdict`: `verify` says verified and
    /// refuted where `run` and `check` say holds and violated.
    ///
    /// ```
    /// use shardproof_report::{Command, Verdict};
    /// assert_eq!(Command::Verify.verdict_word(Verdict::Violated), "refuted");
    /// assert_eq!(Command::Run.verdict_word(Verdict::Violated), "violated");
    /// ```
    pub fn verdict_word(self, verdict: Verdict) -> &'static str {
        match (self, verdict) {
            (Command::Verify, Verdict::Holds) => "verified",
            (Command::Verify, Verdict::Violated) => "refuted",
            (Command::Prove, Verdict::Holds) => "proved",
            (Command::Prove, Verdict::Violated) => "refuted",
            (_, v) => v.word(),
        }
    }
}

/// A command's verdict; it decides the exit code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The property holds (exit 0).
    Holds,
    /// The property is violated: a bug was found (exit 1).
    Violated,
    /// The input is invalid (exit 2): no verdict on the program.
    Invalid,
    /// Inconclusive: an unsupported operator, a limit, unknown placements (exit 3).
    Inconclusive,
}

impl Verdict {
    /// The process exit code of the verdict.
    pub fn exit_code(self) -> i32 {
        match self {
            Verdict::Holds => 0,
            Verdict::Violated => 1,
            Verdict::Invalid => 2,
            Verdict::Inconclusive => 3,
        }
    }

    /// `holds`, `violated`, `invalid` or `inconclusive`.
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Holds => "holds",
            Verdict::Violated => "violated",
            Verdict::Invalid => "invalid",
            Verdict::Inconclusive => "inconclusive",
        }
    }
}

/// How serious a finding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// A violation: the finding makes the verdict violated.
    Error,
    /// An inconclusive finding: something the command could not decide.
    Warning,
    /// Information only.
    Note,
}

impl Level {
    /// SARIF's name of the level (`error`, `warning`, `note`).
    pub fn sarif_name(self) -> &'static str {
        match self {
            Level::Error => "error",
            Level::Warning => "warning",
            Level::Note => "note",
        }
    }
}

/// A place in a file: the user's Python source, a graph file, a case file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    /// The file's path, as the capture or the command line wrote it (relative or absolute).
    pub file: String,
    /// The 1-based line, when known.
    pub line: Option<u32>,
    /// The 1-based column, when known.
    pub column: Option<u32>,
}

impl Location {
    /// A location of a whole file.
    pub fn file(file: impl Into<String>) -> Location {
        Location {
            file: file.into(),
            line: None,
            column: None,
        }
    }

    /// Reads a location as the engines write one: `file`, `file:line`, or `file:line in
    /// function` (verify's captured source). A Windows drive (`C:\m.py:3`) stays in the file.
    /// `None` for empty text.
    ///
    /// ```
    /// use shardproof_report::Location;
    /// let l = Location::parse("model.py:88 in forward").unwrap();
    /// assert_eq!((l.file.as_str(), l.line), ("model.py", Some(88)));
    /// assert_eq!(Location::parse("spec.py").unwrap().line, None);
    /// assert_eq!(Location::parse(""), None);
    /// ```
    pub fn parse(text: &str) -> Option<Location> {
        let text = text.trim();
        if text.is_empty() {
            return None;
        }
        // The rightmost `:DIGITS` that ends the text or is followed by ` in FUNCTION`.
        for (colon, _) in text.rmatch_indices(':') {
            let rest = &text[colon + 1..];
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            let after = &rest[digits..];
            if digits == 0 || !(after.is_empty() || after.starts_with(" in ")) {
                continue;
            }
            let (Ok(line), false) = (rest[..digits].parse::<u32>(), colon == 0) else {
                continue;
            };
            return Some(Location {
                file: text[..colon].to_string(),
                line: Some(line),
                column: None,
            });
        }
        Some(Location::file(text))
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
            if let Some(column) = self.column {
                write!(f, ":{column}")?;
            }
        }
        Ok(())
    }
}

/// A rule a command checks: a SARIF rule, a JUnit failure type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// Its id (`relations-stop`, `spmd-type`, `output-mismatch`, ...).
    pub id: String,
    /// One sentence saying what it finds.
    pub description: String,
}

impl Rule {
    /// A rule with `id` and `description`.
    pub fn new(id: impl Into<String>, description: impl Into<String>) -> Rule {
        Rule {
            id: id.into(),
            description: description.into(),
        }
    }
}

/// Something a command found: a check's finding, where relations stop, a mismatching output.
/// One SARIF result each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// The rule it breaks (an id of [`Report::rules`]).
    pub rule: String,
    /// Error for a violation, warning for what could not be decided.
    pub level: Level,
    /// The operator or output it is about (a node name, a spec tensor).
    pub subject: String,
    /// What is wrong.
    pub message: String,
    /// The user's Python source the operator was captured from, when the capture recorded it.
    pub source: Option<Location>,
    /// The operator's place in the graph file.
    pub graph: Option<Location>,
    /// The ranks it concerns (empty: the spec, or every rank).
    pub ranks: Vec<usize>,
    /// The placements involved, as text.
    pub placements: Vec<String>,
    /// How to fix it, or what the evidence suggests.
    pub hint: Option<String>,
}

impl Finding {
    /// A finding with no location, ranks, placements or hint yet.
    pub fn new(
        rule: impl Into<String>,
        level: Level,
        subject: impl Into<String>,
        message: impl Into<String>,
    ) -> Finding {
        Finding {
            rule: rule.into(),
            level,
            subject: subject.into(),
            message: message.into(),
            source: None,
            graph: None,
            ranks: Vec::new(),
            placements: Vec::new(),
            hint: None,
        }
    }

    /// Where a user reads it: the captured source when there is one (that is the code they
    /// wrote), else the graph file.
    pub fn location(&self) -> Option<&Location> {
        self.source.as_ref().or(self.graph.as_ref())
    }
}

/// How one checked thing came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// It holds.
    Passed,
    /// It is violated.
    Failed,
    /// It was not decided (inconclusive, or not reached).
    Skipped,
    /// It could not be checked: the input is invalid.
    Error,
}

/// One thing a command checked: an output (run, verify) or a check kind (check). One JUnit
/// test case each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checked {
    /// Its name (the output's spec tensor, the check's id).
    pub name: String,
    /// How it came out.
    pub status: Status,
    /// The rule it fails, for a failure.
    pub rule: Option<String>,
    /// One line: why it failed or was skipped.
    pub message: Option<String>,
    /// More text: the relation, the relative error, the findings.
    pub detail: Option<String>,
}

impl Checked {
    /// A checked thing with no rule, message or detail yet.
    pub fn new(name: impl Into<String>, status: Status) -> Checked {
        Checked {
            name: name.into(),
            status,
            rule: None,
            message: None,
            detail: None,
        }
    }
}

/// A spec tensor and its clean expressions over implementation tensors: one line of verify's
/// certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Relation {
    /// The spec tensor.
    pub tensor: String,
    /// Its expressions (simplest first).
    pub relations: Vec<String>,
}

/// Where relations stop, as verify found it: the spec operator, its inputs and their
/// relations, and the implementation operators that read those inputs' tensors. The HTML page
/// draws it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Neighbourhood {
    /// The checked output that has no clean relation.
    pub output: String,
    /// The spec operator's tensor, where relations stop.
    pub operator: String,
    /// Its operator (`aten.add.Tensor`).
    pub op: String,
    /// Its place in the spec graph.
    pub graph: Option<Location>,
    /// The captured Python source, when recorded.
    pub source: Option<Location>,
    /// Its inputs, each with its relations to the implementation.
    pub inputs: Vec<NeighbourInput>,
    /// What the operator's output can only be computed as (not a clean relation), when known.
    pub computed: Option<String>,
    /// The implementation operators that read the inputs' tensors.
    pub consumers: Vec<Consumer>,
    /// The bug class the evidence matches.
    pub hint: Option<String>,
    /// Other spec operators where relations stop on other paths into the same output.
    pub other_stops: Vec<String>,
}

/// An input of the operator where relations stop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NeighbourInput {
    /// The spec tensor.
    pub name: String,
    /// Its relations to implementation tensors (or why it has none).
    pub relations: Vec<String>,
}

/// An implementation operator reading the tensors of the inputs' relations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Consumer {
    /// Its name with its rank (`r0.add_1`).
    pub name: String,
    /// Its operator.
    pub op: String,
    /// Which inputs (indices into [`Neighbourhood::inputs`]) it reads a tensor of; empty when
    /// not known.
    pub reads: Vec<usize>,
}

/// A labelled fact of a report (`decided by: relations`, `seed: 0`): shown by the page, kept
/// as properties by SARIF and JUnit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fact {
    /// What it is.
    pub label: String,
    /// Its value.
    pub value: String,
}

/// What a verdict command found, whatever the engine: the input of every renderer.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// The command.
    pub command: Command,
    /// The case's name (its `name:`, or the path given when the case could not be read).
    pub case: String,
    /// The case file as given on the command line, when known: where a finding without a
    /// place of its own, or an invalid input, points.
    pub case_file: Option<String>,
    /// The verdict.
    pub verdict: Verdict,
    /// One line on what the verdict rests on; for invalid input, the error (with its hint
    /// lines, as stderr shows it).
    pub summary: String,
    /// Seconds the command took, when measured.
    pub seconds: Option<f64>,
    /// The version of the tool (SARIF's driver version); this crate's version by default.
    pub tool_version: String,
    /// The rules the command checks, in a stable order.
    pub rules: Vec<Rule>,
    /// What it found (empty when the verdict holds).
    pub findings: Vec<Finding>,
    /// What it checked, one by one.
    pub checked: Vec<Checked>,
    /// verify's certificate: each checked output with its relation.
    pub certificate: Vec<Relation>,
    /// verify's neighbourhood of the spec operator where relations stop.
    pub neighbourhood: Option<Neighbourhood>,
    /// More facts, in order.
    pub facts: Vec<Fact>,
    /// Charts the page draws (trace: error against tolerance per module).
    pub plots: Vec<Plot>,
}

/// A chart of values over named categories (modules, layers): one line of points per series,
/// on a logarithmic or linear value axis, with one category optionally marked (the bug's
/// module). The HTML page draws it in SVG; the other formats leave it out.
#[derive(Clone, Debug, PartialEq)]
pub struct Plot {
    /// Its title.
    pub title: String,
    /// What the categories are (`module`).
    pub x_label: String,
    /// What the values are (`relative error`).
    pub y_label: String,
    /// The categories, left to right.
    pub categories: Vec<String>,
    /// The series, each with one value (or none) per category.
    pub series: Vec<Series>,
    /// The category to mark, if any.
    pub marked: Option<usize>,
    /// Whether the value axis is logarithmic (non-positive values are then not drawn).
    pub log_scale: bool,
}

/// One series of a [`Plot`].
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// Its name in the legend.
    pub name: String,
    /// One value per category of the plot (`None`: no point).
    pub values: Vec<Option<f64>>,
}

impl Report {
    /// A report with a verdict and a summary and nothing else yet.
    pub fn new(
        command: Command,
        case: impl Into<String>,
        verdict: Verdict,
        summary: impl Into<String>,
    ) -> Report {
        Report {
            command,
            case: case.into(),
            case_file: None,
            verdict,
            summary: summary.into(),
            seconds: None,
            tool_version: env!("CARGO_PKG_VERSION").to_string(),
            rules: Vec::new(),
            findings: Vec::new(),
            checked: Vec::new(),
            certificate: Vec::new(),
            neighbourhood: None,
            facts: Vec::new(),
            plots: Vec::new(),
        }
    }

    /// The exit code of the verdict.
    pub fn exit_code(&self) -> i32 {
        self.verdict.exit_code()
    }

    /// The verdict in the command's own word (`refuted`, `holds`, ...).
    pub fn verdict_word(&self) -> &'static str {
        self.command.verdict_word(self.verdict)
    }

    /// Adds a fact.
    pub fn fact(&mut self, label: impl Into<String>, value: impl Into<String>) {
        self.facts.push(Fact {
            label: label.into(),
            value: value.into(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_parse_as_the_engines_write_them() {
        let l = |t: &str| Location::parse(t).map(|l| (l.file, l.line));
        assert_eq!(l("r0.py:12"), Some(("r0.py".into(), Some(12))));
        assert_eq!(
            l("/home/u/model.py:88 in forward"),
            Some(("/home/u/model.py".into(), Some(88)))
        );
        assert_eq!(l("C:\\m\\a.py:3"), Some(("C:\\m\\a.py".into(), Some(3))));
        assert_eq!(l("dir:x/a.py"), Some(("dir:x/a.py".into(), None)));
        assert_eq!(l("a.py:"), Some(("a.py:".into(), None)));
        assert_eq!(l(":12"), Some((":12".into(), None)));
        // A line number too large for u32 is not a line.
        assert_eq!(
            l("a.py:99999999999"),
            Some(("a.py:99999999999".into(), None))
        );
        assert_eq!(l("   "), None);
    }

    #[test]
    fn verdicts_keep_the_exit_codes() {
        let codes: Vec<i32> = [
            Verdict::Holds,
            Verdict::Violated,
            Verdict::Invalid,
            Verdict::Inconclusive,
        ]
        .iter()
        .map(|v| v.exit_code())
        .collect();
        assert_eq!(codes, [0, 1, 2, 3]);
        assert_eq!(Command::Verify.verdict_word(Verdict::Holds), "verified");
        assert_eq!(Command::Check.verdict_word(Verdict::Holds), "holds");
    }
}
