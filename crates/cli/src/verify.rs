//! `shardproof verify`: the refinement engine on a case.

mod convert;
mod handoff;

use crate::output::{self, HtmlFile, OutputArgs};
use crate::run::{search_counterexample, Counterexample, Search, SEARCH_SEEDS};
use crate::watch;
use crate::Verdict;
use clap::Args as ClapArgs;
use handoff::{hand_off, Asked, Handoff};
use shardproof_ops::Registry;
use shardproof_prove::Verdict as ProofVerdict;
use shardproof_refine::{verify, Options, Outcome, Progress, Verdict as RefineVerdict};
use std::path::PathBuf;

/// Arguments of `shardproof verify`.
#[derive(ClapArgs)]
pub struct VerifyArgs {
    /// The case file.
    case: PathBuf,
    #[command(flatten)]
    output: OutputArgs,
    /// Show no progress on stderr (a spinner on a terminal, else a line every 5 seconds;
    /// SHARDPROOF_PROGRESS_SECONDS sets the interval).
    #[arg(long)]
    quiet: bool,
    /// E-graph size limit per spec operator, counted in egg's hash-cons entries (merged
    /// nodes' stale entries included).
    #[arg(long, default_value_t = 20_000)]
    node_limit: usize,
    /// Print every spec operator's inferred relation, in order.
    #[arg(long)]
    trace: bool,
    /// Stop relation inference after this many seconds (0: no limit). The verdict then rests on
    /// the counterexample search: refuted when a run shows a difference, else inconclusive.
    #[arg(long, value_name = "SECONDS", default_value_t = 0.0, value_parser = crate::watch::parse_seconds)]
    time_limit: f64,
    /// Worker threads for relation inference (default: the available cores). The report is
    /// the same at any count.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    jobs: Option<u32>,
    /// Send every operator to the e-graph: no operator is related by its family's placement
    /// rule first (the fast path). The report is the same either way; this only costs time
    /// (for comparing the two paths, or timing the e-graph alone).
    #[arg(long)]
    no_fast_path: bool,
    /// Do not hand what relation inference leaves undecided to the element-level prover. By
    /// default an inconclusive case is proved or refuted by `shardproof prove`'s engine (on
    /// the shape-reduced case), and a refutation no run confirms gets its counterexample.
    #[arg(long)]
    no_prove: bool,
    /// Stop the element-level prover after this many seconds (0: no limit); the verdict then
    /// stays what relation inference and the runs made it.
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_PROVE_SECONDS, value_parser = crate::watch::parse_seconds)]
    prove_time_limit: f64,
    /// Write the element-level prover's counterexample into DIR when it refutes the case (the
    /// inputs and both outputs as safetensors, an index and a PyTorch replay, as `prove`).
    #[arg(long, value_name = "DIR")]
    counterexample: Option<PathBuf>,
}

/// The prover's default time limit under verify: the zoo's tiny cases are decided in a few
/// seconds, and a case it cannot decide costs verify no more than this.
const DEFAULT_PROVE_SECONDS: f64 = 30.0;

#[derive(serde::Serialize)]
struct Report<'a> {
    case: String,
    /// Only when there is no outcome (invalid input, or a finding before relation inference);
    /// the outcome carries its own verdict.
    #[serde(skip_serializing_if = "Option::is_none")]
    verdict: Option<&'static str>,
    #[serde(flatten)]
    outcome: Option<&'a Outcome>,
    message: Option<String>,
    #[serde(flatten)]
    decision: &'a Decision,
}

/// Which engine settled the verdict, and the concrete evidence behind it.
#[derive(serde::Serialize, Default)]
struct Decision {
    /// `typecheck` (the programs do not type-check), `schedule` (the ranks' communication
    /// cannot complete), `relations` (the e-graph engine's relations), `counterexample` (a
    /// concrete run of the reference interpreter on seeded random inputs) or `prove` (the
    /// element-level prover, on what the others left undecided).
    decided_by: &'static str,
    /// The inputs' seed and the output a concrete run shows differing, when one does.
    #[serde(skip_serializing_if = "Option::is_none")]
    counterexample: Option<Counterexample>,
    /// What the counterexample search did (seeds tried, or why it could not run).
    #[serde(skip_serializing_if = "Option::is_none")]
    search: Option<String>,
    /// What the static checker found on the same programs, shown beside the verdict.
    #[serde(skip_serializing_if = "Option::is_none")]
    static_check: Option<StaticCheck>,
    /// What the element-level prover decided, when the case was handed to it.
    #[serde(skip_serializing_if = "Option::is_none")]
    prove: Option<Handoff>,
    /// A refutation by relations that no run confirmed (the case could not run): the prover
    /// is asked for its counterexample.
    #[serde(skip)]
    unconfirmed: bool,
}

/// What the static checker (`shardproof check`: placements, SPMD types, async waits, with no
/// spec and no values) says of the case, run before relation inference. It is shown beside
/// verify's verdict and never changes it: its findings are its own command's verdict, and a
/// misplaced tensor it names is often the cause of a refutation the relations find downstream.
#[derive(serde::Serialize)]
struct StaticCheck {
    /// `holds`, `violated`, `inconclusive` or `skipped`.
    verdict: &'static str,
    /// How many findings.
    findings: usize,
    /// The first few, one line each.
    first: Vec<String>,
    /// Why it was skipped or is inconclusive.
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
}

/// Rank operators above which verify leaves the static check to its own command: the checker
/// handles tens of thousands of operators a second, and verify must not spend minutes on a
/// large preset before its own work.
const STATIC_CHECK_MAX_OPERATORS: usize = 200_000;

/// How many findings verify's report lists (`shardproof check` lists them all).
const STATIC_CHECK_SHOWN: usize = 3;

/// Runs the static checker on `case` within [`STATIC_CHECK_MAX_OPERATORS`].
fn static_check(case: &shardproof_case::Case) -> StaticCheck {
    let operators: usize = case.program.ranks.iter().map(|g| g.nodes.len()).sum();
    if operators > STATIC_CHECK_MAX_OPERATORS {
        return StaticCheck {
            verdict: "skipped",
            findings: 0,
            first: Vec::new(),
            note: Some(format!(
                "{operators} rank operators, over verify's budget of {STATIC_CHECK_MAX_OPERATORS} for it; run `shardproof check` on the case"
            )),
        };
    }
    // Without fix synthesis: verify shows the findings, not their hints.
    match shardproof_check::check_case_without_fixes(case) {
        Err(e) => StaticCheck {
            verdict: "inconclusive",
            findings: 0,
            first: Vec::new(),
            note: Some(e.message),
        },
        Ok(report) => {
            let first = report
                .findings
                .iter()
                .take(STATIC_CHECK_SHOWN)
                .map(|f| {
                    let ranks: Vec<String> = f.ranks.iter().map(usize::to_string).collect();
                    format!(
                        "{} at `{}` (rank {}): {}",
                        f.check.name(),
                        f.node,
                        ranks.join(", "),
                        f.message
                    )
                })
                .collect();
            let note = (report.unknown_values > 0).then(|| {
                format!(
                    "{} values have no known placement (operators without a placement rule)",
                    report.unknown_values
                )
            });
            StaticCheck {
                verdict: match report.verdict {
                    shardproof_check::Verdict::Holds => "holds",
                    shardproof_check::Verdict::Violated => "violated",
                    shardproof_check::Verdict::Inconclusive => "inconclusive",
                },
                findings: report.findings.len(),
                first,
                note,
            }
        }
    }
}

/// The static check's lines of verify's text report.
fn print_static_check(s: &StaticCheck) {
    match s.verdict {
        "holds" => outln!("static check: holds (no findings)"),
        "violated" => {
            outln!(
                "static check: {} finding{} (`shardproof check` lists them all):",
                s.findings,
                if s.findings == 1 { "" } else { "s" }
            );
            for f in &s.first {
                outln!("  {f}");
            }
        }
        other => outln!(
            "static check: {other}: {}",
            s.note.as_deref().unwrap_or("no reason given")
        ),
    }
}

/// `a run on seeded random inputs (f64, seed N) confirms it: output `o` differs ...`.
fn describe(c: &Counterexample, verb: &str) -> String {
    let by = c
        .rel_error
        .map_or("does not fit its expected placement".to_string(), |e| {
            format!("differs from the spec by a relative error of {e:.3e}")
        });
    format!(
        "a run on seeded random inputs (f64, seed {}) {verb}: output `{}` {by} (`shardproof run --seed {}` reproduces it)",
        c.seed, c.output, c.seed
    )
}

fn seeds_tried() -> String {
    let seeds: Vec<String> = SEARCH_SEEDS.iter().map(u64::to_string).collect();
    format!("seeds {}", seeds.join(", "))
}

/// Runs `verify` and prints its report.
pub fn main(args: &VerifyArgs) -> Verdict {
    let path = args.case.display().to_string();
    // The `--html` file is opened first: a path that cannot be written is refused at once.
    let html = match args.output.prepare() {
        Ok(h) => h,
        Err(message) => return early_stop(args, None, &path, Verdict::Invalid, "", message),
    };
    let case = match shardproof_case::load_case(&args.case).and_then(|c| {
        c.validate_ops(&|op| Registry::builtin().get(op).is_some())?;
        Ok(c)
    }) {
        Ok(c) => c,
        Err(e) => {
            return early_stop(
                args,
                html,
                &path,
                Verdict::Invalid,
                "",
                format!("error: {e}"),
            )
        }
    };
    // A program that does not type-check, or whose ranks cannot meet, gets no verdict on values.
    if let Err(stop) = crate::preflight::check(&case) {
        return early_stop(
            args,
            html,
            &case.name,
            stop.verdict,
            stop.decided_by,
            stop.message,
        );
    }
    let static_check = static_check(&case);
    let spinner = watch::spinner(!args.quiet && args.output.text());
    // The concrete search comes first: it takes well under a second on a small case and
    // settles most bugs, so a time limit on the relations never hides one the run shows.
    if let Some(s) = &spinner {
        s.set_message(format!(
            "searching {} for a counterexample ({})",
            case.name,
            seeds_tried()
        ));
    }
    let started = std::time::Instant::now();
    let search = search_counterexample(&case);
    let search_seconds = started.elapsed().as_secs_f64();
    if let Some(s) = &spinner {
        s.set_message(match &search {
            Search::Counterexample(c) => format!(
                "output `{}` differs on seed {}: locating where relations stop in {}",
                c.output, c.seed, case.name
            ),
            _ => format!("inferring relations for {}", case.name),
        });
    }
    let opts = Options {
        node_limit: args.node_limit,
        trace: args.trace,
        jobs: args.jobs.map(|n| n as usize),
        fast_path: !args.no_fast_path,
        ..Options::default()
    };
    let display = watch::Display::new(
        spinner.as_ref(),
        args.quiet || !args.output.text(),
        format!("verify {}: ", case.name),
    );
    let (mut outcome, time_limited) = infer_relations(&case, opts, args.time_limit, display);
    outcome.seconds += search_seconds;
    let decision = if let Some(output) = outcome.unmet_expectation.clone() {
        settle_expectation(search, &output, &mut outcome)
    } else {
        match outcome.verdict {
            RefineVerdict::Refuted => confirm_refutation(search, &mut outcome),
            RefineVerdict::Inconclusive => settle(search, None, time_limited, &mut outcome),
            RefineVerdict::Verified => challenge_verified(search, &mut outcome),
        }
    };
    let (mut verdict, mut decision) = decision;
    if !args.no_prove {
        verdict = consult_prover(&case, args, verdict, &mut decision, &mut outcome, &spinner);
    }
    if let Some(s) = spinner {
        s.finish_and_clear();
    }
    decision.static_check = Some(static_check);
    let converted = convert::report(&case, &args.case, &outcome, verdict, &decision);
    let print = || {
        if args.output.json() {
            let r = Report {
                case: case.name.clone(),
                verdict: (verdict == Verdict::Invalid).then_some("invalid"),
                outcome: Some(&outcome),
                message: None,
                decision: &decision,
            };
            outln!(
                "{}",
                serde_json::to_string_pretty(&r).expect("report serializes")
            );
        } else {
            print_text(&case.name, &outcome, verdict, &decision);
        }
    };
    // A page that could not be written after all (the disk filled up): an invalid run.
    let unwritten =
        |message: &str| early_stop(args, None, &case.name, Verdict::Invalid, "", message.into());
    output::finish(&args.output, html, &converted, print, unwritten, verdict)
}

/// Relation inference on its own thread, shown as it goes and stopped after `limit` seconds
/// when `limit` is positive (see [`crate::watch`]): an unfinished inference is inconclusive and
/// names the operator it had reached. The flag says whether the limit stopped it.
fn infer_relations(
    case: &shardproof_case::Case,
    mut opts: Options,
    limit: f64,
    display: watch::Display,
) -> (Outcome, bool) {
    let progress = std::sync::Arc::new(Progress::default());
    opts.progress = Some(progress.clone());
    let owned = case.clone();
    let watched = watch::watch(
        move || verify(&owned, &opts),
        watch::Watch {
            progress,
            units: "spec operators",
            limit,
            display,
            preparing: "preparing the programs",
        },
    );
    match watched {
        watch::Watched::Done(outcome) => (outcome, false),
        watch::Watched::Lost => (
            Outcome::inconclusive(
                Some("relation inference stopped without a result (its thread ended early)".into()),
                0,
            ),
            false,
        ),
        watch::Watched::TimedOut(stopped) => {
            let mut outcome = Outcome::inconclusive(
                Some(format!(
                    "relation inference did not finish within the time limit ({limit} s; --time-limit): {}",
                    stopped.at("spec operator")
                )),
                0,
            );
            outcome.seconds = limit;
            (outcome, true)
        }
    }
}

/// Hands an inconclusive verdict, or a refutation no run confirmed, to the element-level
/// prover and folds its answer into the verdict: proved makes it verified, a refutation with a
/// confirmed counterexample makes it refuted, and anything else leaves the verdict as it was
/// with the prover's reason added. A verdict the relations or a run settled is not asked about.
fn consult_prover(
    case: &shardproof_case::Case,
    args: &VerifyArgs,
    verdict: Verdict,
    d: &mut Decision,
    o: &mut Outcome,
    spinner: &Option<indicatif::ProgressBar>,
) -> Verdict {
    let asked = match verdict {
        Verdict::Inconclusive => Asked::Decide,
        // A run's counterexample is a seed, not files: with --counterexample the prover is
        // asked for its own, which it writes there.
        Verdict::Violated if d.unconfirmed || args.counterexample.is_some() => Asked::Confirm,
        _ => return verdict,
    };
    if let Some(s) = spinner {
        s.set_message(format!(
            "handing {} to the element-level prover{}",
            case.name,
            if args.prove_time_limit > 0.0 {
                format!(" (at most {} s)", args.prove_time_limit)
            } else {
                String::new()
            }
        ));
    }
    let settings = handoff::Settings {
        time_limit: args.prove_time_limit,
        jobs: args.jobs.map_or(1, |n| n as usize),
        counterexample: args.counterexample.as_deref(),
    };
    let h = hand_off(case, asked, &settings);
    o.seconds += h.seconds;
    let summary = h.summary();
    let verdict = match (asked, h.verdict) {
        (Asked::Confirm, ProofVerdict::Proved) if !d.unconfirmed => {
            // A concrete run shows a difference the proof says cannot be: one of the engines
            // is wrong, and the run's numbers stand (never a false "verified").
            let note = format!(
                "{summary}, although a concrete run shows a difference (a shardproof bug: please report it with this case)"
            );
            add_note(o, note);
            verdict
        }
        (_, ProofVerdict::Proved) => {
            // The prover's proof covers every input; where relations stopped (or even named
            // an operator as wrong, unconfirmed by any run), they lacked a lemma.
            let before = match (&o.failure, o.reason.take()) {
                (Some(f), _) if asked == Asked::Confirm => format!(
                    "relations stop at spec operator `{}` ({}), unconfirmed by any run",
                    f.operator, f.op
                ),
                (_, Some(r)) => format!("relation inference alone was inconclusive: {r}"),
                (_, None) => "relation inference alone was inconclusive".to_string(),
            };
            o.verdict = RefineVerdict::Verified;
            o.failure = None;
            o.unmet_expectation = None;
            o.reason = Some(format!("{summary}; {before}"));
            d.decided_by = "prove";
            Verdict::Holds
        }
        (Asked::Decide, ProofVerdict::Refuted) => {
            refute_by_run(o, summary);
            d.decided_by = "prove";
            Verdict::Violated
        }
        (Asked::Confirm, _) => {
            add_note(o, summary);
            verdict
        }
        (Asked::Decide, ProofVerdict::Inconclusive) => {
            o.reason = Some(match o.reason.take() {
                Some(r) => format!("{r}; {summary}"),
                None => summary,
            });
            verdict
        }
    };
    d.prove = Some(h);
    verdict
}

/// Adds `note` to a refutation's evidence: the failure's hint, or the reason when relations
/// named no operator.
fn add_note(o: &mut Outcome, note: String) {
    let slot = match &mut o.failure {
        Some(f) => &mut f.hint,
        None => &mut o.reason,
    };
    *slot = Some(match slot.take() {
        Some(h) => format!("{h}; {note}"),
        None => note,
    });
}

/// Reports a verdict reached before relation inference (invalid input, a program that does
/// not type-check, ranks that cannot meet).
fn early_stop(
    args: &VerifyArgs,
    html: Option<HtmlFile>,
    name: &str,
    verdict: Verdict,
    decided_by: &'static str,
    message: String,
) -> Verdict {
    let word = match verdict {
        Verdict::Holds => "verified",
        Verdict::Violated => "refuted",
        Verdict::Invalid => "invalid",
        Verdict::Inconclusive => "inconclusive",
    };
    let report = convert::early(name, &args.case, verdict, decided_by, &message);
    let mut verdict = verdict;
    if let Some(h) = html {
        if let Err(unwritten) = h.write(&report) {
            errln!("{unwritten}");
            verdict = Verdict::Invalid;
        }
    }
    if output::print_document(&args.output, &report) {
        if report.verdict != shardproof_report::Verdict::Violated {
            errln!("{message}");
        }
    } else if args.output.json() {
        let decision = Decision {
            decided_by,
            ..Decision::default()
        };
        let r = Report {
            case: name.to_string(),
            verdict: Some(word),
            outcome: None,
            message: Some(message),
            decision: &decision,
        };
        outln!(
            "{}",
            serde_json::to_string_pretty(&r).expect("report serializes")
        );
    } else if verdict == Verdict::Violated {
        outln!(
            "refuted: {name}
  {message}
decided by: {decided_by}"
        );
    } else {
        errln!("{message}");
    }
    verdict
}

fn cli_verdict(v: RefineVerdict) -> Verdict {
    match v {
        RefineVerdict::Verified => Verdict::Holds,
        RefineVerdict::Refuted => Verdict::Violated,
        RefineVerdict::Inconclusive => Verdict::Inconclusive,
    }
}

/// Turns `o` into a refutation by a concrete finding (a counterexample or a hang), keeping the
/// engine's evidence of where relations stop.
fn refute_by_run(o: &mut Outcome, finding: String) {
    o.verdict = RefineVerdict::Refuted;
    match &mut o.failure {
        Some(f) => {
            let stopped = o
                .reason
                .take()
                .map(|r| format!("; {r}"))
                .unwrap_or_default();
            let hint = f.hint.take().map(|h| format!("{h}; ")).unwrap_or_default();
            f.hint = Some(format!("{hint}{finding}{stopped}"));
        }
        None => {
            let stopped = o
                .reason
                .take()
                .map(|r| format!(" (relation inference: {r})"))
                .unwrap_or_default();
            o.reason = Some(format!("{finding}{stopped}"));
        }
    }
}

/// Settles an output whose clean relation is not the expected one by the counterexample
/// search: a numeric mismatch is a counterexample (refuted, the engine's evidence kept);
/// agreement, or a case the run cannot execute, leaves the verdict inconclusive with the run's
/// finding added, since the engine may only lack a lemma between the two expressions.
fn settle_expectation(search: Search, output: &str, o: &mut Outcome) -> (Verdict, Decision) {
    let search = match search {
        // An `expr:` the ranks' tensors cannot even be evaluated into: no number to show.
        Search::Counterexample(Counterexample {
            misfit: Some(why), ..
        }) => Search::Undecided(Verdict::Inconclusive, why),
        other => other,
    };
    // An unmet expectation is a finished inference: no time limit stopped it.
    settle(search, Some(output), false, o)
}

/// Where relations stop short of a verdict, the counterexample search decides: a
/// counterexample makes the verdict refuted, with the location where relations stopped kept as
/// evidence.
fn settle(
    search: Search,
    output: Option<&str>,
    time_limited: bool,
    o: &mut Outcome,
) -> (Verdict, Decision) {
    let mut d = Decision {
        decided_by: "relations",
        ..Decision::default()
    };
    match search {
        Search::Counterexample(c) => {
            refute_by_run(o, describe(&c, "is a counterexample"));
            d.decided_by = "counterexample";
            d.counterexample = Some(c);
        }
        Search::Hang(why) => {
            refute_by_run(o, format!("a run hangs: {}", first_line(&why)));
            d.decided_by = "counterexample";
        }
        Search::Agrees => {
            let reason = o.reason.take().unwrap_or_default();
            d.search = Some(format!("a run on {} matches every output", seeds_tried()));
            // A time limit says nothing about the lemmas: more time may prove it.
            let why = if time_limited {
                "so no bug shows there; a longer --time-limit may prove it"
            } else {
                "so this is likely a missing lemma"
            };
            o.reason = Some(format!(
                "{reason}; a run on seeded random inputs (f64, {}) meets {}, {why}",
                seeds_tried(),
                if output.is_some() {
                    "the expectation"
                } else {
                    "every output"
                }
            ));
        }
        Search::Undecided(Verdict::Invalid, why) => {
            // The program cannot run: no verdict on its values.
            d.decided_by = "counterexample";
            d.search = Some(first_line(&why).to_string());
            let reason = o.reason.take().unwrap_or_default();
            o.reason = Some(format!(
                "{reason}; the programs cannot run: {}",
                run_stop_reason(&why)
            ));
            return (Verdict::Invalid, d);
        }
        Search::Undecided(_, why) => {
            let why = run_stop_reason(&why);
            d.search = Some(format!("no counterexample search: {why}"));
            let reason = o.reason.take().unwrap_or_default();
            o.reason = Some(format!("{reason}; a run could not settle it: {why}"));
        }
    }
    (cli_verdict(o.verdict), d)
}

/// Checks a refutation against concrete runs on seeded random inputs. An output the ranks
/// miss is a counterexample and confirms the engine's evidence; runs that match every output
/// turn the verdict inconclusive, since the evidence (a relation off by a factor, a partial sum
/// left unreduced) may only mean the library lacks a lemma for how the program combines its
/// values. A case the run cannot execute (too large, inputs laid out by an `expr:`) keeps the
/// engine's verdict, and the report says it was not confirmed.
fn confirm_refutation(finding: Search, o: &mut Outcome) -> (Verdict, Decision) {
    let mut d = Decision {
        decided_by: "relations",
        ..Decision::default()
    };
    let Some(f) = &mut o.failure else {
        return (cli_verdict(o.verdict), d);
    };
    let hint = f.hint.take();
    let with_hint = |note: String| match &hint {
        Some(h) => format!("{h}; {note}"),
        None => note,
    };
    match finding {
        Search::Counterexample(c) => {
            f.hint = Some(with_hint(describe(&c, "confirms it")));
            d.counterexample = Some(c);
        }
        Search::Hang(why) => {
            f.hint = Some(with_hint(format!("a run hangs: {}", first_line(&why))));
        }
        Search::Agrees => {
            let evidence = hint
                .as_ref()
                .map_or(String::new(), |h| format!(", where the evidence read: {h}"));
            o.verdict = RefineVerdict::Inconclusive;
            o.reason = Some(format!(
                "`{}` cannot be related: relations stop at spec operator `{}` ({}){evidence}; but a run on seeded random inputs (f64, {}) matches every output, so this is likely a missing lemma, not a bug{}",
                f.output,
                f.operator,
                f.op,
                seeds_tried(),
                f.other_stops_clause()
            ));
            d.search = Some(format!("a run on {} matches every output", seeds_tried()));
            f.hint = None;
        }
        Search::Undecided(Verdict::Invalid, why) => {
            f.hint = hint;
            d.decided_by = "counterexample";
            d.search = Some(first_line(&why).to_string());
            o.reason = Some(format!(
                "the programs cannot run: {}",
                run_stop_reason(&why)
            ));
            return (Verdict::Invalid, d);
        }
        Search::Undecided(_, why) => {
            let note = format!("not confirmed by a run: {}", run_stop_reason(&why));
            d.search = Some(note.clone());
            d.unconfirmed = true;
            f.hint = Some(match hint {
                Some(h) => format!("{h} ({note})"),
                None => note,
            });
        }
    }
    (cli_verdict(o.verdict), d)
}

/// A verified case must survive a counterexample search: a run that shows a difference (or
/// hangs) refutes it, and the report says the relations were contradicted. A case too large
/// to run keeps the engine's verdict, and the report says no search ran.
fn challenge_verified(search: Search, o: &mut Outcome) -> (Verdict, Decision) {
    let mut d = Decision {
        decided_by: "relations",
        ..Decision::default()
    };
    let contradicted = |o: &mut Outcome, finding: String| {
        o.verdict = RefineVerdict::Refuted;
        o.reason = Some(format!(
            "{finding}, although relation inference related every output (a shardproof bug: please report it with this case)"
        ));
    };
    match search {
        Search::Counterexample(c) => {
            contradicted(o, describe(&c, "is a counterexample"));
            d.decided_by = "counterexample";
            d.counterexample = Some(c);
        }
        Search::Hang(why) => {
            contradicted(o, format!("a run hangs: {}", first_line(&why)));
            d.decided_by = "counterexample";
        }
        Search::Agrees => {
            d.search = Some(format!(
                "no counterexample: a run on {} matches every output",
                seeds_tried()
            ));
        }
        Search::Undecided(Verdict::Invalid, why) => {
            o.verdict = RefineVerdict::Inconclusive;
            o.reason = Some(format!(
                "the programs cannot run: {}",
                run_stop_reason(&why)
            ));
            d.decided_by = "counterexample";
            d.search = Some(first_line(&why).to_string());
            return (Verdict::Invalid, d);
        }
        Search::Undecided(_, why) => {
            d.search = Some(format!(
                "no counterexample search: {}",
                run_stop_reason(&why)
            ));
        }
    }
    (cli_verdict(o.verdict), d)
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or_default()
}

/// The first line of why a run stopped, without its verdict prefix (it is quoted inside
/// verify's own report).
fn run_stop_reason(why: &str) -> &str {
    let why = first_line(why);
    why.strip_prefix("inconclusive: ")
        .or_else(|| why.strip_prefix("error: "))
        .or_else(|| why.strip_prefix("violated: "))
        .unwrap_or(why)
}

fn print_text(name: &str, o: &Outcome, verdict: Verdict, d: &Decision) {
    if verdict == Verdict::Invalid {
        // No verdict for invalid input: the error alone, on stderr, as for every other command.
        errln!(
            "invalid: {name}: {}",
            o.reason.as_deref().unwrap_or("the programs cannot run")
        );
        return;
    }
    if !o.trace.is_empty() {
        outln!("trace:");
        for t in &o.trace {
            outln!("  {} ({}) [{}] {}", t.tensor, t.op, t.status, t.detail);
        }
    }
    match o.verdict {
        RefineVerdict::Verified if d.decided_by == "prove" => {
            outln!(
                "verified: {name}: {}",
                o.reason.as_deref().unwrap_or_default()
            );
        }
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
            } else if let Some(r) = &o.reason {
                outln!("  {r}");
            }
        }
        RefineVerdict::Inconclusive => {
            outln!(
                "inconclusive: {name}: {}",
                o.reason.as_deref().unwrap_or("a limit was reached")
            );
        }
    }
    if let Some(c) = &d.counterexample {
        outln!("counterexample: {}", describe(c, "shows it"));
    }
    if let Some(s) = &d.search {
        outln!("counterexample search: {s}");
    }
    if let Some(h) = &d.prove {
        outln!(
            "element-level prover: {} ({})",
            match h.verdict {
                ProofVerdict::Proved => "proved",
                ProofVerdict::Refuted => "refuted",
                ProofVerdict::Inconclusive => "inconclusive",
            },
            h.sizes
        );
    }
    if let Some(s) = &d.static_check {
        print_static_check(s);
    }
    outln!("decided by: {}", d.decided_by);
    outln!("time: {:.3} s", o.seconds);
}
