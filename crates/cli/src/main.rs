//! `shardproof`: the command-line front of the shardproof engines.
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

mod check;
mod demo;
mod inspect;
mod preflight;
mod run;
mod verify;
mod zoo;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// Proves a distributed program computes what its single-device specification computes.
#[derive(Parser)]
#[command(name = "shardproof", version, about)]
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
    /// The model zoo: list models, parallelisms and the bug catalog, or emit a case.
    #[command(subcommand)]
    Zoo(zoo::ZooCommand),
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

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let verdict = match cli.command {
        Command::Inspect { path, strict, json } => inspect::main(&path, strict, json),
        Command::Run(args) => run::main(&args),
        Command::Verify(args) => verify::main(&args),
        Command::Check(args) => check::main(&args),
        Command::Demo => demo::main(),
        Command::Zoo(cmd) => zoo::main(&cmd),
    };
    ExitCode::from(verdict.code())
}
