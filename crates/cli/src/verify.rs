//! `shardproof verify`: the refinement engine on a case.

use crate::Verdict;
use clap::Args as ClapArgs;
use shardproof_ops::Registry;
use shardproof_refine::{verify, Options, Outcome, Verdict as RefineVerdict};
use std::path::PathBuf;

/// Arguments of `shardproof verify`.
#[derive(ClapArgs)]
pub struct VerifyArgs {
    /// The case file.
    case: PathBuf,
    /// Print machine-readable JSON on stdout.
    #[arg(long)]
    json: bool,
    /// Show no progress on stderr.
    #[arg(long)]
    quiet: bool,
    /// E-graph size limit per spec operator, counted in egg's hash-cons entries (merged
    /// nodes' stale entries included).
    #[arg(long, default_value_t = 20_000)]
    node_limit: usize,
    /// Print every spec operator's inferred relation, in order.
    #[arg(long)]
    trace: bool,
}

#[derive(serde::Serialize)]
struct Report<'a> {
    case: String,
    /// Only when there is no outcome (invalid input); the outcome carries its own verdict.
    #[serde(skip_serializing_if = "Option::is_none")]
    verdict: Option<&'static str>,
    #[serde(flatten)]
    outcome: Option<&'a Outcome>,
    message: Option<String>,
}

/// Runs `verify` and prints its report.
pub fn main(args: &VerifyArgs) -> Verdict {
    let case = match shardproof_case::load_case(&args.case).and_then(|c| {
        c.validate_ops(&|op| Registry::builtin().get(op).is_some())?;
        Ok(c)
    }) {
        Ok(c) => c,
        Err(e) => {
            if args.json {
                let r = Report {
                    case: args.case.display().to_string(),
                    verdict: Some("invalid"),
                    outcome: None,
                    message: Some(e.to_string()),
                };
                outln!(
                    "{}",
                    serde_json::to_string_pretty(&r).expect("report serializes")
                );
            } else {
                eprintln!("error: {e}");
            }
            return Verdict::Invalid;
        }
    };
    let spinner = (!args.quiet
        && !args.json
        && std::io::IsTerminal::is_terminal(&std::io::stderr()))
    .then(|| {
        let s = indicatif::ProgressBar::new_spinner();
        s.set_message(format!("inferring relations for {}", case.name));
        s.enable_steady_tick(std::time::Duration::from_millis(120));
        s
    });
    let opts = Options {
        node_limit: args.node_limit,
        trace: args.trace,
        ..Options::default()
    };
    let mut outcome = verify(&case, &opts);
    if let Some(output) = outcome.unmet_expectation.clone() {
        if let Some(s) = &spinner {
            s.set_message(format!(
                "running {} to check the expectation of `{output}`",
                case.name
            ));
        }
        settle_expectation(&case, &output, &mut outcome);
    } else if outcome.verdict == RefineVerdict::Refuted {
        if let Some(s) = &spinner {
            s.set_message(format!("running {} to confirm the refutation", case.name));
        }
        confirm_refutation(&case, &mut outcome);
    }
    if let Some(s) = spinner {
        s.finish_and_clear();
    }
    let verdict = match outcome.verdict {
        RefineVerdict::Verified => Verdict::Holds,
        RefineVerdict::Refuted => Verdict::Violated,
        RefineVerdict::Inconclusive => Verdict::Inconclusive,
    };
    if args.json {
        let r = Report {
            case: case.name.clone(),
            verdict: None,
            outcome: Some(&outcome),
            message: None,
        };
        outln!(
            "{}",
            serde_json::to_string_pretty(&r).expect("report serializes")
        );
    } else {
        print_text(&case.name, &outcome);
    }
    verdict
}

/// Settles an output whose clean relation is not the expected one by running the case on
/// seeded random values: a numeric mismatch is a counterexample (refuted, the engine's evidence
/// kept); agreement, or a case the run cannot execute, leaves the verdict inconclusive with the
/// run's finding added, since the engine may only lack a lemma between the two expressions.
fn settle_expectation(case: &shardproof_case::Case, output: &str, o: &mut Outcome) {
    let started = std::time::Instant::now();
    let finding = crate::run::expectation_counterexample(case, output);
    o.seconds += started.elapsed().as_secs_f64();
    match finding {
        Ok(Some(error)) => {
            o.verdict = RefineVerdict::Refuted;
            o.reason = None;
            if let Some(f) = &mut o.failure {
                let hint = f.hint.take().unwrap_or_default();
                f.hint = Some(format!(
                    "{hint}; a run on seeded random inputs (f64, seed 0) confirms it: the ranks miss the expected placement by a relative error of {error:.3e}"
                ));
            }
        }
        Ok(None) => {
            let reason = o.reason.take().unwrap_or_default();
            o.reason = Some(format!(
                "{reason}; a run on seeded random inputs (f64, seed 0) meets the expectation, so this is likely a missing lemma"
            ));
        }
        Err(why) => {
            let reason = o.reason.take().unwrap_or_default();
            let why = run_stop_reason(&why);
            o.reason = Some(format!("{reason}; a run could not settle it: {why}"));
        }
    }
}

/// Checks a refutation against a concrete run on seeded random inputs. An output the ranks
/// miss is a counterexample and confirms the engine's evidence; a run that matches every
/// output turns the verdict inconclusive, since the evidence (a relation off by a factor, a
/// partial sum left unreduced) may only mean the library lacks a lemma for how the program
/// combines its values. A case the run cannot execute (too large, inputs laid out by an
/// `expr:`) keeps the engine's verdict, and the report says it was not confirmed.
fn confirm_refutation(case: &shardproof_case::Case, o: &mut Outcome) {
    let started = std::time::Instant::now();
    let finding = crate::run::outputs_counterexample(case);
    o.seconds += started.elapsed().as_secs_f64();
    let Some(f) = &mut o.failure else { return };
    let hint = f.hint.take();
    match finding {
        Ok(Some((output, error))) => {
            let by = error.map_or("does not fit its expected placement".into(), |e| {
                format!("differs from the spec by a relative error of {e:.3e}")
            });
            let confirmed = format!(
                "a run on seeded random inputs (f64, seed 0) confirms it: output `{output}` {by}"
            );
            f.hint = Some(match hint {
                Some(h) => format!("{h}; {confirmed}"),
                None => confirmed,
            });
        }
        Ok(None) => {
            let evidence =
                hint.map_or(String::new(), |h| format!(", where the evidence read: {h}"));
            o.verdict = RefineVerdict::Inconclusive;
            o.reason = Some(format!(
                "`{}` cannot be related: relations stop at spec operator `{}` ({}){evidence}; but a run on seeded random inputs (f64, seed 0) matches every output, so this is likely a missing lemma, not a bug{}",
                f.output,
                f.operator,
                f.op,
                f.other_stops_clause()
            ));
            f.hint = None;
        }
        Err(why) => {
            let note = format!("not confirmed by a run: {}", run_stop_reason(&why));
            f.hint = Some(match hint {
                Some(h) => format!("{h} ({note})"),
                None => note,
            });
        }
    }
}

/// The first line of why a run stopped, without its verdict prefix (it is quoted inside
/// verify's own report).
fn run_stop_reason(why: &str) -> &str {
    let why = why.lines().next().unwrap_or_default();
    why.strip_prefix("inconclusive: ")
        .or_else(|| why.strip_prefix("error: "))
        .unwrap_or(why)
}

fn print_text(name: &str, o: &Outcome) {
    if !o.trace.is_empty() {
        outln!("trace:");
        for t in &o.trace {
            outln!("  {} ({}) [{}] {}", t.tensor, t.op, t.status, t.detail);
        }
    }
    match o.verdict {
        RefineVerdict::Verified => {
            outln!(
                "verified: {name} ({} spec operators, {} lemmas)",
                o.spec_operators,
                o.lemmas
            );
            outln!("certificate:");
            for c in &o.certificate {
                outln!(
                    "  {} = {}",
                    c.tensor,
                    c.relations.first().map_or("", String::as_str)
                );
                for alt in c.relations.iter().skip(1) {
                    outln!("  {:w$} = {alt}", "", w = c.tensor.len());
                }
            }
        }
        RefineVerdict::Refuted => {
            outln!("refuted: {name}");
            if let Some(f) = &o.failure {
                if o.unmet_expectation.is_some() {
                    outln!(
                        "  output `{}` relates to the implementation, but not as the case expects",
                        f.output
                    );
                } else {
                    outln!(
                        "  output `{}` has no clean relation to the implementation",
                        f.output
                    );
                }
                outln!(
                    "  relations stop at spec operator `{}` ({})",
                    f.operator,
                    f.op
                );
                if !f.graph_location.is_empty() {
                    outln!("    defined at {}", f.graph_location);
                }
                if !f.other_stops.is_empty() {
                    outln!(
                        "  (relations also stop on other paths, at {})",
                        f.other_stops.join(", ")
                    );
                }
                if let Some(s) = &f.source {
                    outln!("    captured from {s}");
                }
                if !f.inputs.is_empty() {
                    outln!("  its inputs relate to the implementation as:");
                    for (n, rels) in &f.inputs {
                        for r in rels {
                            outln!("    {n} = {r}");
                        }
                    }
                }
                if let Some(c) = &f.computed {
                    outln!(
                        "  its output can only be computed, not rebuilt: {} = {c}",
                        f.operator
                    );
                }
                if !f.impl_consumers.is_empty() {
                    outln!("  implementation operators reading those tensors:");
                    for c in &f.impl_consumers {
                        outln!("    {c}");
                    }
                }
                if let Some(h) = &f.hint {
                    outln!("  hint: {h}");
                }
            }
        }
        RefineVerdict::Inconclusive => {
            outln!(
                "inconclusive: {name}: {}",
                o.reason.as_deref().unwrap_or("a limit was reached")
            );
        }
    }
    outln!("time: {:.3} s", o.seconds);
}
