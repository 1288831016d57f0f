//! `shardproof`: the command-line front of the shardproof engines, as a library so that the
//! Python extension (`crates/py`) runs the very same commands in-process: [`main_with_args`]
//! takes a command line and returns the exit code; each command prints its report (`--json`
//! for the JSON one) on stdout as the binary does.
//!
//! Exit codes, for every verdict-producing command: 0 the property holds, 1 it is violated,
//! 2 the input is invalid (bad case, unreadable graph, usage error), 3 inconclusive.

/// `println!` that ignores a closed stdout (`shardproof run --json | head`) instead of panicking.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// `eprintln!` that ignores a closed stderr (`shardproof verify CASE 2>&1 | head`) instead of
/// panicking: exit codes stay 0-3 whatever the pipe does.
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

mod capture;
mod check;
mod demo;
mod inspect;
mod layout;
mod output;
mod preflight;
mod prove;
mod prove_staged;
mod run;
mod trace;
mod verify;
mod watch;
mod zoo;

use clap::{CommandFactory, Parser, Subcommand};
use std::path::PathBuf;

/// What `--help` adds after the commands: the exit codes, and how to install completions and the
/// man page (the two commands that are not about a program).
const AFTER_HELP: &str = "\
Exit codes: 0 the property holds, 1 it is violated, 2 invalid input or usage, 3 inconclusive.

Shell completions (bash, zsh, fish, elvish, powershell):
  shardproof completions bash > ~/.local/share/bash-completion/completions/shardproof
Man page:
  shardproof man > ~/.local/share/man/man1/shardproof.1";

/// Proves a distributed program computes what its single-device specification computes.
#[derive(Parser)]
#[command(name = "shardproof", version, about, after_help = AFTER_HELP)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Summarize a graph file or a case: operators, inputs, outputs, collectives, opaque
    /// operators, and a shape check of our inference against the recorded shapes.
    Inspect {
        /// A graph file (torch.fx text or JSON) or a case file (.yaml / .yml).
        path: PathBuf,
        /// Exit 0 only when every line parsed, no operator is opaque and every shape agrees.
        #[arg(long)]
        strict: bool,
        /// Print machine-readable JSON on stdout.
        #[arg(long)]
        json: bool,
        /// Show no progress on stderr (a spinner on a terminal, else a line every 5 seconds
        /// counting the graphs read; SHARDPROOF_PROGRESS_SECONDS sets the interval).
        #[arg(long)]
        quiet: bool,
        /// Stop after this many seconds (0: no limit): exit 3, naming the graph it had reached.
        #[arg(long, value_name = "SECONDS", default_value_t = 0.0, value_parser = watch::parse_seconds)]
        time_limit: f64,
    },
    /// Run the built-in demo: a tiny tensor-parallel Llama training iteration from the model
    /// zoo, correct and with a planted bug, through every engine.
    Demo,
    /// Numerical differential check: run the spec and every rank on seeded random inputs laid
    /// out by the case's placements, and compare each expected output.
    Run(run::RunArgs),
    /// Refinement check: infer, operator by operator, clean relations from every spec tensor
    /// to the implementation's tensors; prints the certificate, or where relations stop.
    Verify(verify::VerifyArgs),
    /// Static check, with no spec and no values: placement propagation over the mesh, SPMD
    /// types, collective legality, async waits and the ranks' communication schedule.
    Check(check::CheckArgs),
    /// Element-level proof: execute the spec and every rank on symbolic tensors and decide
    /// each expected output element by element (normal forms, random witnesses, Z3); every
    /// refutation comes with a counterexample the interpreter confirms.
    Prove(prove::ProveArgs),
    /// Run a Python capture script (one calling `shardproof.capture(...)`) and name the case
    /// files it wrote: the graphs and the case derived from a PyTorch parallel plan.
    Capture(capture::CaptureArgs),
    /// Trace testing of real runs: compare a distributed run's recorded tensors with a
    /// reference run's, with tolerances from perturbed reference runs.
    #[command(subcommand)]
    Trace(trace::TraceCommand),
    /// The model zoo: list models, parallelisms and the bug catalog, or emit a case.
    #[command(subcommand)]
    Zoo(zoo::ZooCommand),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) on stdout.
    ///
    /// E.g. `shardproof completions bash >
    /// ~/.local/share/bash-completion/completions/shardproof`, then start a new shell.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff) on stdout, or a command's (`shardproof man run`).
    ///
    /// E.g. `shardproof man > ~/.local/share/man/man1/shardproof.1`, then `man shardproof`;
    /// `shardproof man zoo emit` prints the page shardproof-zoo-emit(1).
    Man {
        /// The command whose page to print, e.g. `run` or `zoo emit` (default: shardproof's).
        command: Vec<String>,
    },
}

/// The JSON a command given `--json` prints on stdout for input it cannot take: the fields of
/// `run`'s and `verify`'s reports that an invalid input has (`case` is null when the command
/// line itself is wrong).
#[derive(serde::Serialize)]
struct InvalidJson<'a> {
    case: Option<&'a str>,
    verdict: &'static str,
    message: &'a str,
}

/// Prints the JSON error of an invalid input (see [`InvalidJson`]) on stdout.
pub fn print_invalid_json(case: Option<&str>, message: &str) {
    print_stop_json(case, "invalid", message);
}

/// Prints the JSON of a command that stopped before its report (`invalid`, or `inconclusive`
/// at a time limit) on stdout, with the fields of [`InvalidJson`].
pub fn print_stop_json(case: Option<&str>, verdict: &'static str, message: &str) {
    let report = InvalidJson {
        case,
        verdict,
        message,
    };
    outln!(
        "{}",
        serde_json::to_string_pretty(&report).unwrap_or_default()
    );
}

/// Prints, for a command line clap refused, the document its `--format` asks for: the JSON
/// error (`--json`, `--format json`), or a SARIF or JUnit document of the invalid input for
/// `run`, `verify` and `check`, so a pipeline reading it still gets a well-formed file.
fn print_usage_error(argv: &[std::ffi::OsString], message: &str) {
    let args: Vec<String> = argv
        .iter()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    match output::requested(&args) {
        (_, Some(output::Format::Json)) => print_invalid_json(None, message),
        (Some(command), Some(format @ (output::Format::Sarif | output::Format::Junit))) => {
            let mut report = shardproof_report::Report::new(
                command,
                "command line",
                shardproof_report::Verdict::Invalid,
                message,
            );
            report.tool_version = env!("CARGO_PKG_VERSION").to_string();
            let flags = output::OutputArgs {
                format: Some(format),
                ..output::OutputArgs::default()
            };
            output::print_document(&flags, &report);
        }
        _ => {}
    }
}

/// Writes what `completions` or `man` generate. Both go through a buffer: clap_complete panics
/// on a failed write, and `shardproof man | head` closes stdout early.
fn generate(command: &Command) -> Verdict {
    use std::io::Write as _;
    let mut cli = Cli::command();
    let mut text = Vec::new();
    match command {
        Command::Completions { shell } => {
            clap_complete::generate(*shell, &mut cli, "shardproof", &mut text);
        }
        Command::Man { command } => {
            // Built, so that subcommands carry their full names (`shardproof-run`) into the
            // page's title and synopsis.
            let mut page = cli.disable_help_subcommand(true);
            page.build();
            for name in command {
                let Some(sub) = page.find_subcommand(name).cloned() else {
                    let names = page.get_subcommands().map(|c| c.get_name());
                    errln!(
                        "error: {}",
                        shardproof_zoo::suggest::unknown(
                            "command",
                            name,
                            names,
                            "shardproof --help"
                        )
                    );
                    return Verdict::Invalid;
                };
                page = sub;
            }
            if let Err(e) = clap_mangen::Man::new(page).render(&mut text) {
                errln!("error: cannot render the man page: {e}");
                return Verdict::Invalid;
            }
        }
        _ => {}
    }
    let _ = std::io::stdout().write_all(&text);
    Verdict::Holds
}

/// The outcome of a command, mapped to the process exit code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The property holds (exit 0).
    Holds,
    /// The property is violated: a bug was found (exit 1).
    Violated,
    /// The input is invalid (exit 2).
    Invalid,
    /// Inconclusive: unsupported operator or a limit was hit (exit 3).
    Inconclusive,
}

impl Verdict {
    fn code(self) -> u8 {
        match self {
            Verdict::Holds => 0,
            Verdict::Violated => 1,
            Verdict::Invalid => 2,
            Verdict::Inconclusive => 3,
        }
    }
}

/// Runs one `shardproof` command line (`argv[0]` is the program name) and returns its exit
/// code: 0 holds, 1 violated, 2 invalid input or usage, 3 inconclusive. What the command
/// reports goes to stdout and stderr, as from the binary.
pub fn main_with_args<I, T>(argv: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let argv: Vec<std::ffi::OsString> = argv.into_iter().map(Into::into).collect();
    let cli = match Cli::try_parse_from(&argv) {
        Ok(c) => c,
        Err(e) => {
            if e.use_stderr() {
                print_usage_error(&argv, e.render().to_string().trim_end());
            }
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    let verdict = match cli.command {
        Command::Inspect {
            path,
            strict,
            json,
            quiet,
            time_limit,
        } => inspect::main(&path, strict, json, inspect::Watching { quiet, time_limit }),
        Command::Run(args) => run::main(&args),
        Command::Verify(args) => verify::main(&args),
        Command::Check(args) => check::main(&args),
        Command::Prove(args) => prove::main(&args),
        Command::Capture(args) => capture::main(&args),
        Command::Demo => demo::main(),
        Command::Trace(cmd) => trace::main(&cmd),
        Command::Zoo(cmd) => zoo::main(&cmd),
        Command::Completions { .. } | Command::Man { .. } => generate(&cli.command),
    };
    verdict.code()
}
