//! `shardproof check`: the static checker (crates/check) on a case: placements, SPMD types,
//! async timing and the ranks' communication, with no spec and no values.

use crate::output::{self, HtmlFile, OutputArgs};
use crate::Verdict;
use clap::Args as ClapArgs;
use shardproof_check::{Check, Report, Verdict as CheckVerdict};
use shardproof_ops::Registry;
use shardproof_report::{self as report, Checked, Command, Level, Location, Rule, Status};
use std::path::PathBuf;

/// Arguments of `shardproof check`.
#[derive(ClapArgs)]
pub struct CheckArgs {
    /// The case file, or a plan file (`.plan`, docs/formats/plan.md).
    case: PathBuf,
    #[command(flatten)]
    output: OutputArgs,
    /// Print nothing on stderr (progress, and the time taken).
    #[arg(long)]
    quiet: bool,
    /// Stop after this many seconds (0: no limit): exit 3, naming the rank it had reached.
    #[arg(long, value_name = "SECONDS", default_value_t = 0.0, value_parser = crate::watch::parse_seconds)]
    time_limit: f64,
}

fn invalid(args: &CheckArgs, html: Option<HtmlFile>, case: &str, message: &str) -> Verdict {
    let r = output::report(Command::Check, case, &args.case, Verdict::Invalid, message);
    let json = || crate::print_invalid_json(Some(case), message);
    output::invalid(&args.output, html, &r, json, true)
}

/// The checker on its own thread, its progress shown (ranks typed and placed) and stopped at
/// `--time-limit` (see [`crate::watch`]).
fn check_watched(
    args: &CheckArgs,
    case: &shardproof_case::Case,
) -> Result<Report, (Verdict, String)> {
    let progress = std::sync::Arc::new(shardproof_ir::Progress::default());
    let counted = progress.clone();
    let owned = case.clone();
    let watched = crate::watch::watch_shown(
        move || shardproof_check::check_case_counted(&owned, &counted),
        progress,
        crate::watch::Shown {
            visible: !args.quiet && args.output.text(),
            prefix: format!("check {}: ", case.name),
            units: "steps",
            preparing: "preparing the programs",
            limit: args.time_limit,
        },
    );
    match watched {
        crate::watch::Watched::Done(result) => result.map_err(|e| (Verdict::Invalid, e.message)),
        crate::watch::Watched::TimedOut(stopped) => Err((
            Verdict::Inconclusive,
            format!(
                "inconclusive: the check did not finish within the time limit ({} s; --time-limit): {}",
                stopped.limit,
                stopped.at("step")
            ),
        )),
        crate::watch::Watched::Lost => Err((
            Verdict::Inconclusive,
            "inconclusive: the check stopped without a result (its thread ended early)".into(),
        )),
    }
}

/// Runs the static checker and prints its report.
pub fn main(args: &CheckArgs) -> Verdict {
    let started = std::time::Instant::now();
    let name = args.case.display().to_string();
    let html = match args.output.prepare() {
        Ok(h) => h,
        Err(message) => return invalid(args, None, &name, &message),
    };
    // A file ending in `.plan` is a hand-written plan (docs/formats/plan.md); anything else
    // is a case file.
    let loaded = if shardproof_check::plan::is_plan_path(&args.case) {
        shardproof_check::plan::load_plan(&args.case)
    } else {
        shardproof_case::load_case(&args.case)
    };
    let case = match loaded.and_then(|c| {
        c.validate_ops(&|op| Registry::builtin().get(op).is_some())?;
        Ok(c)
    }) {
        Ok(c) => c,
        Err(e) => return invalid(args, html, &name, &format!("error: {e}")),
    };
    // A program that does not type-check gets no verdict (exit 2), as in every engine.
    if let Err(stop) = crate::preflight::typecheck_all(&case) {
        return invalid(args, html, &case.name, &stop.message);
    }
    let result: Report = match check_watched(args, &case) {
        Ok(r) => r,
        Err((verdict, message)) if verdict == Verdict::Inconclusive => {
            let r = output::report(Command::Check, &case.name, &args.case, verdict, &message);
            let json = || crate::print_stop_json(Some(&case.name), "inconclusive", &message);
            // Printed as an invalid input's report is, with its own verdict and exit code.
            output::invalid(&args.output, html, &r, json, true);
            return verdict;
        }
        Err((_, message)) => return invalid(args, html, &case.name, &message),
    };
    let verdict = match result.verdict {
        CheckVerdict::Holds => Verdict::Holds,
        CheckVerdict::Violated => Verdict::Violated,
        CheckVerdict::Inconclusive => Verdict::Inconclusive,
    };
    let seconds = started.elapsed().as_secs_f64();
    let converted = convert(&result, args, verdict, seconds);
    let print = || {
        if args.output.json() {
            outln!(
                "{}",
                serde_json::to_string_pretty(&result).unwrap_or_default()
            );
        } else {
            let text = result.render();
            outln!("{}", text.trim_end());
        }
    };
    let verdict = output::finish(
        &args.output,
        html,
        &converted,
        print,
        |message| invalid(args, None, &case.name, message),
        verdict,
    );
    if !args.quiet && verdict != Verdict::Invalid {
        errln!(
            "checked {} operators on {} ranks in {:.1} ms",
            result.operators,
            result.ranks,
            seconds * 1e3
        );
    }
    verdict
}

/// Every check, in the order reports list them (the rules of the SARIF driver, the test cases
/// of JUnit).
const CHECKS: [Check; 13] = [
    Check::Postcondition,
    Check::CommLegality,
    Check::PlacementConsistency,
    Check::ShapeDivisibility,
    Check::SpmdType,
    Check::GradientDuality,
    Check::MissingWait,
    Check::OrphanedHandle,
    Check::DataRace,
    Check::BufferAliasing,
    Check::CollectiveMismatch,
    Check::DependencyViolation,
    Check::PipelineSchedule,
];

/// The rule id of the unknown placements that make a check inconclusive.
const UNKNOWN_PLACEMENT: &str = "unknown-placement";

/// One line on what each check finds. A match, so that a new check fails to compile until
/// it is described here (and added to [`CHECKS`]).
fn describe(c: Check) -> &'static str {
    match c {
        Check::Postcondition => "A program output whose placement is not the one the case declares.",
        Check::CommLegality => "A collective on an input it cannot take (an all-reduce of a replicated tensor, an all-gather of a partial sum).",
        Check::PlacementConsistency => "Inputs whose placements admit no output placement, or ranks that disagree on a placement.",
        Check::ShapeDivisibility => "Sizes through a collective (group sizes, divisibility, split sizes), and a replicated operand of a shard's piece size paired with the shard (a table made without the rank's offset).",
        Check::SpmdType => "An SPMD type rule broken: partial x partial, partial + replicate, a nonlinear function of a partial, an unmasked vocabulary lookup.",
        Check::MissingWait => "A functional collective's result read before its wait_tensor.",
        Check::OrphanedHandle => "A functional collective whose result is never waited on.",
        Check::DataRace => "An in-place write to a buffer an unfinished collective reads or writes.",
        Check::BufferAliasing => "Two unfinished collectives on the same buffer.",
        Check::CollectiveMismatch => "Ranks whose collectives cannot meet (a hang), or meet with incompatible shapes or dtypes.",
        Check::DependencyViolation => "A recv whose matching send never comes (a hang), or a message of another type than its recv declares.",
        Check::GradientDuality => "A forward communication without its dual in the backward (all-gather <-> reduce-scatter, all-to-all <-> all-to-all, send <-> recv).",
        Check::PipelineSchedule => "A pipeline order that misses a microbatch's forward or backward on a stage, or synchronizes gradients before the last backward.",
    }
}

/// The checker's report as the one report every format is rendered from: a SARIF result per
/// finding (and per source of unknown placements), a JUnit test case per check kind.
fn convert(r: &Report, args: &CheckArgs, verdict: Verdict, seconds: f64) -> report::Report {
    let summary = match r.verdict {
        CheckVerdict::Holds => format!(
            "holds: no findings ({} ranks, {} operators, {} output placements checked)",
            r.ranks, r.operators, r.outputs_checked
        ),
        CheckVerdict::Violated => {
            let f = &r.findings[0];
            let more = match r.findings.len() {
                1 => String::new(),
                n => format!(" and {} more", n - 1),
            };
            format!(
                "violated: {} at node `{}` on {}{more}",
                f.check.name(),
                f.node,
                shardproof_check::ranks_text(&f.ranks)
            )
        }
        CheckVerdict::Inconclusive => format!(
            "inconclusive: no findings, but {} values have unknown placements (never guessed){}",
            r.unknown_values,
            if r.unknown_outputs.is_empty() {
                String::new()
            } else {
                format!(", among them outputs {}", r.unknown_outputs.join(", "))
            }
        ),
    };
    let mut out = output::report(Command::Check, &r.case, &args.case, verdict, summary);
    out.seconds = Some(seconds);
    out.rules = CHECKS
        .iter()
        .map(|c| Rule::new(c.name(), describe(*c)))
        .collect();
    out.rules.push(Rule::new(
        UNKNOWN_PLACEMENT,
        "Values whose placement the checker could not infer (an operator without a rule): no conclusion on them.",
    ));
    for f in &r.findings {
        out.findings.push(report::Finding {
            source: f.source.as_deref().and_then(Location::parse),
            graph: Some(Location {
                line: f.line.and_then(|l| u32::try_from(l).ok()),
                ..Location::file(f.file.clone())
            }),
            ranks: f.ranks.clone(),
            placements: f.placements.clone(),
            hint: (!f.hint.is_empty()).then(|| f.hint.clone()),
            ..report::Finding::new(
                f.check.name(),
                Level::Error,
                f.node.clone(),
                f.message.clone(),
            )
        });
    }
    if r.verdict == CheckVerdict::Inconclusive {
        for u in &r.unknown {
            // `first` is `file:line: `node``.
            let (at, node) = u.first.rsplit_once(": `").unwrap_or((u.first.as_str(), ""));
            out.findings.push(report::Finding {
                graph: Location::parse(at),
                ..report::Finding::new(
                    UNKNOWN_PLACEMENT,
                    Level::Warning,
                    node.trim_end_matches('`'),
                    format!("{} values with an unknown placement: {}", u.count, u.reason),
                )
            });
        }
    }
    for c in CHECKS {
        let found: Vec<&shardproof_check::Finding> =
            r.findings.iter().filter(|f| f.check == c).collect();
        let mut case = Checked::new(c.name(), Status::Passed);
        if let Some(first) = found.first() {
            case.status = Status::Failed;
            case.rule = Some(c.name().to_string());
            case.message = Some(format!(
                "{} finding{}: first at node `{}` on {}: {}",
                found.len(),
                if found.len() == 1 { "" } else { "s" },
                first.node,
                shardproof_check::ranks_text(&first.ranks),
                first.message
            ));
            let lines: Vec<String> = found
                .iter()
                .map(|f| {
                    let at = f.line.map_or(f.file.clone(), |l| format!("{}:{l}", f.file));
                    format!("{at}: node `{}`: {}\n  hint: {}", f.node, f.message, f.hint)
                })
                .collect();
            case.detail = Some(lines.join("\n"));
        }
        out.checked.push(case);
    }
    if r.verdict == CheckVerdict::Inconclusive {
        out.checked.push(Checked {
            rule: Some(UNKNOWN_PLACEMENT.into()),
            message: Some(format!(
                "{} values have unknown placements: the checks above say nothing about them",
                r.unknown_values
            )),
            ..Checked::new(UNKNOWN_PLACEMENT, Status::Skipped)
        });
    }
    out.fact("ranks", r.ranks.to_string());
    out.fact("operators", r.operators.to_string());
    out.fact("output placements checked", r.outputs_checked.to_string());
    out.fact("collectives and messages matched", r.meetings.to_string());
    out
}
