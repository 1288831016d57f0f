//! `shardproof check`: the static checker (crates/check) on a case: placements, SPMD types,
//! async timing and the ranks' communication, with no spec and no values.

use crate::Verdict;
use clap::Args as ClapArgs;
use shardproof_check::{check_case, Report, Verdict as CheckVerdict};
use shardproof_ops::Registry;
use std::path::PathBuf;

/// Arguments of `shardproof check`.
#[derive(ClapArgs)]
pub struct CheckArgs {
    /// The case file.
    case: PathBuf,
    /// Print machine-readable JSON on stdout.
    #[arg(long)]
    json: bool,
    /// Print nothing on stderr (the time taken).
    #[arg(long)]
    quiet: bool,
}

fn invalid(args: &CheckArgs, case: &str, message: &str) -> Verdict {
    if args.json {
        crate::print_invalid_json(Some(case), message);
    }
    errln!("{message}");
    Verdict::Invalid
}

/// Runs the static checker and prints its report.
pub fn main(args: &CheckArgs) -> Verdict {
    let started = std::time::Instant::now();
    let name = args.case.display().to_string();
    let case = match shardproof_case::load_case(&args.case).and_then(|c| {
        c.validate_ops(&|op| Registry::builtin().get(op).is_some())?;
        Ok(c)
    }) {
        Ok(c) => c,
        Err(e) => return invalid(args, &name, &format!("error: {e}")),
    };
    // A program that does not type-check gets no verdict (exit 2), as in every engine.
    if let Err(stop) = crate::preflight::typecheck_all(&case) {
        return invalid(args, &case.name, &stop.message);
    }
    let report: Report = match check_case(&case) {
        Ok(r) => r,
        Err(e) => return invalid(args, &case.name, &e.message),
    };
    if args.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
    } else {
        let text = report.render();
        outln!("{}", text.trim_end());
    }
    if !args.quiet {
        errln!(
            "checked {} operators on {} ranks in {:.1} ms",
            report.operators,
            report.ranks,
            started.elapsed().as_secs_f64() * 1e3
        );
    }
    match report.verdict {
        CheckVerdict::Holds => Verdict::Holds,
        CheckVerdict::Violated => Verdict::Violated,
        CheckVerdict::Inconclusive => Verdict::Inconclusive,
    }
}
