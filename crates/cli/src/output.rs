//! What a verdict command prints and writes besides its verdict: `--format text|json|sarif|junit`
//! on stdout and `--html FILE`, shared by `run`, `verify` and `check`. Each command converts its
//! engine's result into a [`shardproof_report::Report`]; this module prints or writes it.

use crate::Verdict;
use shardproof_ir::Graph;
use shardproof_report::{html, junit, sarif, Command, Location, Report};
use std::path::{Path, PathBuf};

/// What a verdict command prints on stdout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// The text report (the default).
    Text,
    /// The JSON report (the same as `--json`).
    Json,
    /// SARIF 2.1.0, for code-scanning interfaces.
    Sarif,
    /// JUnit XML, for CI dashboards.
    Junit,
}

impl Format {
    fn name(self) -> &'static str {
        match self {
            Format::Text => "text",
            Format::Json => "json",
            Format::Sarif => "sarif",
            Format::Junit => "junit",
        }
    }
}

/// The output flags of `run`, `verify` and `check`.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct OutputArgs {
    /// Print machine-readable JSON on stdout (the same as `--format json`).
    #[arg(long)]
    pub json: bool,
    /// What to print on stdout: text (the default), json, sarif (SARIF 2.1.0) or junit (JUnit
    /// XML); see docs/formats/reports.md.
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub format: Option<Format>,
    /// Also write a self-contained HTML report to FILE: the verdict, the certificate or the
    /// findings, and for a failure the operators around it drawn as a graph.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
}

impl OutputArgs {
    /// The format stdout gets: `--format` when given, else JSON for `--json`, else text.
    pub fn format(&self) -> Format {
        match (self.format, self.json) {
            (Some(f), _) => f,
            (None, true) => Format::Json,
            (None, false) => Format::Text,
        }
    }

    /// Whether stdout gets the JSON report.
    pub fn json(&self) -> bool {
        self.format() == Format::Json
    }

    /// Whether stdout gets the text report (and so progress may be shown on stderr).
    pub fn text(&self) -> bool {
        self.format() == Format::Text
    }

    /// Checks the flags and opens the `--html` file before any work, so a path that cannot be
    /// written is refused in milliseconds, not after a long verification. `Err` is the message
    /// of an invalid command line.
    pub fn prepare(&self) -> Result<Option<HtmlFile>, String> {
        if let (Some(f), true) = (self.format, self.json) {
            if f != Format::Json {
                return Err(format!(
                    "error: `--json` means `--format json` and cannot be combined with `--format {}`\n  hint: give one of the two",
                    f.name()
                ));
            }
        }
        let Some(path) = &self.html else {
            return Ok(None);
        };
        match std::fs::File::create(path) {
            Ok(file) => Ok(Some(HtmlFile {
                path: path.clone(),
                file,
            })),
            Err(e) => Err(cannot_write(path, &e)),
        }
    }
}

fn cannot_write(path: &Path, e: &std::io::Error) -> String {
    format!(
        "error: cannot write the HTML report to `{}`: {e}\n  hint: give --html a file in a directory that exists and is writable",
        path.display()
    )
}

/// The `--html` file, opened by [`OutputArgs::prepare`].
#[derive(Debug)]
pub struct HtmlFile {
    path: PathBuf,
    file: std::fs::File,
}

impl HtmlFile {
    /// Writes the page of `report`; `Err` is the message naming the path.
    pub fn write(mut self, report: &Report) -> Result<(), String> {
        use std::io::Write as _;
        self.file
            .write_all(html::render(report).as_bytes())
            .and_then(|()| self.file.flush())
            .map_err(|e| cannot_write(&self.path, &e))
    }
}

/// Prints `report` as SARIF or JUnit when that is the format; returns whether it did.
pub fn print_document(output: &OutputArgs, report: &Report) -> bool {
    match output.format() {
        Format::Sarif => outln!("{}", sarif::render(report)),
        Format::Junit => outln!("{}", junit::render(report).trim_end()),
        Format::Text | Format::Json => return false,
    }
    true
}

/// Writes the HTML page (when asked), then prints the report through `print` (text or JSON,
/// the command's own) or as a SARIF or JUnit document, and returns the verdict. A page that
/// cannot be written makes the command's result an invalid command line (exit 2), reported
/// through `invalid`.
pub fn finish(
    output: &OutputArgs,
    html: Option<HtmlFile>,
    report: &Report,
    print: impl FnOnce(),
    invalid: impl FnOnce(&str) -> Verdict,
    verdict: Verdict,
) -> Verdict {
    if let Some(h) = html {
        if let Err(message) = h.write(report) {
            return invalid(&message);
        }
    }
    if !print_document(output, report) {
        print();
    }
    verdict
}

/// Reports an invalid input (exit 2) in every form asked for: the page (when its file is
/// open), a SARIF or JUnit document of the invalid input, or the command's own JSON through
/// `json`; the message on stderr in every format but JSON (where `json_silent` says the
/// command keeps stderr quiet).
pub fn invalid(
    output: &OutputArgs,
    html: Option<HtmlFile>,
    report: &Report,
    json: impl FnOnce(),
    stderr_under_json: bool,
) -> Verdict {
    if let Some(h) = html {
        if let Err(message) = h.write(report) {
            errln!("{message}");
        }
    }
    if !print_document(output, report) && output.json() {
        json();
    }
    if !output.json() || stderr_under_json {
        errln!("{}", report.summary);
    }
    Verdict::Invalid
}

/// A report of `command` on `case` (the case file as given) with this binary's version.
pub fn report(
    command: Command,
    case: &str,
    case_file: &Path,
    verdict: Verdict,
    summary: impl Into<String>,
) -> Report {
    let mut r = Report::new(command, case, report_verdict(verdict), summary);
    r.case_file = Some(case_file.display().to_string());
    r.tool_version = env!("CARGO_PKG_VERSION").to_string();
    r
}

/// The report's verdict of the command's verdict.
pub fn report_verdict(v: Verdict) -> shardproof_report::Verdict {
    match v {
        Verdict::Holds => shardproof_report::Verdict::Holds,
        Verdict::Violated => shardproof_report::Verdict::Violated,
        Verdict::Invalid => shardproof_report::Verdict::Invalid,
        Verdict::Inconclusive => shardproof_report::Verdict::Inconclusive,
    }
}

/// Where `graph` defines the value `name`: the graph file and line, and the captured Python
/// source when recorded.
pub fn value_locations(graph: &Graph, name: &str) -> (Option<Location>, Option<Location>) {
    let Some(v) = graph.find(name) else {
        return (None, None);
    };
    let node = &graph.nodes[v.node];
    let file = graph
        .path
        .as_ref()
        .map_or(graph.name.clone(), |p| p.display().to_string());
    let at = Location {
        line: node.line.and_then(|l| u32::try_from(l).ok()),
        ..Location::file(file)
    };
    let source = node.loc.as_ref().map(|l| Location {
        line: Some(l.line),
        ..Location::file(l.file.clone())
    });
    (Some(at), source)
}

/// The first line of `text`.
pub fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or_default()
}

/// What a command line that clap refused asks for: its verdict command and `--format`, read
/// from the raw arguments (there are no parsed flags to ask).
pub fn requested(args: &[String]) -> (Option<Command>, Option<Format>) {
    let args: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .take_while(|a| *a != "--")
        .collect();
    let command = args.iter().find_map(|a| match *a {
        "run" => Some(Command::Run),
        "verify" => Some(Command::Verify),
        "check" => Some(Command::Check),
        "prove" => Some(Command::Prove),
        _ => None,
    });
    let parse = |v: &str| match v {
        "sarif" => Some(Format::Sarif),
        "junit" => Some(Format::Junit),
        "json" => Some(Format::Json),
        "text" => Some(Format::Text),
        _ => None,
    };
    let mut format = None;
    for (k, a) in args.iter().enumerate() {
        if let Some(v) = a.strip_prefix("--format=") {
            format = parse(v).or(format);
        } else if *a == "--format" {
            format = args.get(k + 1).and_then(|v| parse(v)).or(format);
        }
    }
    if format.is_none() && args.contains(&"--json") {
        format = Some(Format::Json);
    }
    (command, format)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_refused_command_line_still_names_its_format() {
        let (c, f) = requested(&strings(&["verify", "--format", "sarif", "--bogus"]));
        assert_eq!((c, f), (Some(Command::Verify), Some(Format::Sarif)));
        let (c, f) = requested(&strings(&["check", "--format=junit", "x"]));
        assert_eq!((c, f), (Some(Command::Check), Some(Format::Junit)));
        let (_, f) = requested(&strings(&["run", "--json", "--", "--format", "sarif"]));
        assert_eq!(f, Some(Format::Json));
        assert_eq!(requested(&strings(&["zoo", "emit"])), (None, None));
    }

    #[test]
    fn json_is_format_json() {
        let o = OutputArgs {
            json: true,
            ..OutputArgs::default()
        };
        assert!(o.json() && o.prepare().is_ok());
        let both = OutputArgs {
            json: true,
            format: Some(Format::Sarif),
            html: None,
        };
        assert!(both.prepare().unwrap_err().contains("--format sarif"));
    }
}
