//! `shardproof prove`: the element-level prover (crates/prove) on a case: every expected
//! output decided element by element, each refutation with a counterexample the reference
//! interpreter confirms.

use crate::output::{self, HtmlFile, OutputArgs};
use crate::Verdict;
use clap::Args as ClapArgs;
use shardproof_ops::Registry;
use shardproof_prove::{prove_case, Proof, ProveConfig, Verdict as ProofVerdict};
use shardproof_report::{self as report, Checked, Command, Level, Status};
use std::path::PathBuf;
use std::time::Duration;

/// Arguments of `shardproof prove`.
#[derive(ClapArgs)]
pub struct ProveArgs {
    /// The case file.
    pub(crate) case: PathBuf,
    #[command(flatten)]
    pub(crate) output: OutputArgs,
    /// Write a refutation's counterexample into DIR: the inputs and both outputs as
    /// safetensors, and counterexample.json, the index.
    #[arg(long, value_name = "DIR")]
    pub(crate) counterexample: Option<PathBuf>,
    /// Stop after this many seconds (0: no limit): inconclusive, exit 3, naming where it was.
    #[arg(long, value_name = "SECONDS", default_value_t = 0.0, value_parser = crate::watch::parse_seconds)]
    pub(crate) time_limit: f64,
    /// Print nothing on stderr (progress, and the time taken).
    #[arg(long)]
    pub(crate) quiet: bool,
    /// Prove at the case's full sizes instead of the shape-reduced ones (shape reduction
    /// refuses programs with operators it is not proved sound for).
    #[arg(long)]
    pub(crate) no_reduce: bool,
    /// Prove stage by stage (the case's cuts, and one stage per output) on N threads; the
    /// report is the same at any N. A case with cuts is always proved in stages.
    #[arg(long, value_name = "N")]
    pub(crate) jobs: Option<usize>,
    /// Prove only the I-th of N parts of the distinct stages and write their results into
    /// --shard-dir (for array jobs; `--merge` gives the verdict).
    #[arg(long, value_name = "I/N", requires = "shard_dir", value_parser = parse_shard)]
    pub(crate) shard: Option<(usize, usize)>,
    /// Where `--shard` writes its results.
    #[arg(long, value_name = "DIR", requires = "shard")]
    pub(crate) shard_dir: Option<PathBuf>,
    /// Combine the results the shards wrote into DIR into the case's verdict.
    #[arg(long, value_name = "DIR", conflicts_with = "shard")]
    pub(crate) merge: Option<PathBuf>,
}

/// The CLI verdict (and exit code) of a prover verdict.
pub(crate) fn verdict_of(v: ProofVerdict) -> Verdict {
    match v {
        ProofVerdict::Proved => Verdict::Holds,
        ProofVerdict::Refuted => Verdict::Violated,
        ProofVerdict::Inconclusive => Verdict::Inconclusive,
    }
}

fn parse_shard(text: &str) -> Result<(usize, usize), String> {
    shardproof_prove::stage::shard::parse_shard(text)
}

pub(crate) fn invalid(
    args: &ProveArgs,
    html: Option<HtmlFile>,
    case: &str,
    message: &str,
) -> Verdict {
    let r = output::report(Command::Prove, case, &args.case, Verdict::Invalid, message);
    let json = || crate::print_invalid_json(Some(case), message);
    output::invalid(&args.output, html, &r, json, true)
}

/// Proves the case and prints the report.
pub fn main(args: &ProveArgs) -> Verdict {
    let started = std::time::Instant::now();
    let name = args.case.display().to_string();
    let html = match args.output.prepare() {
        Ok(h) => h,
        Err(message) => return invalid(args, None, &name, &message),
    };
    let time_limit = (args.time_limit > 0.0).then(|| Duration::from_secs_f64(args.time_limit));
    // `prove` states the case's scaled relations (`scale:`) in its stages; the other engines
    // refuse them.
    let case = match shardproof_case::load_case_with_scales(&args.case).and_then(|c| {
        c.validate_ops(&|op| Registry::builtin().get(op).is_some())?;
        Ok(c)
    }) {
        Ok(c) => c,
        Err(e) => return invalid(args, html, &name, &format!("error: {e}")),
    };
    // Programs that do not type-check get no verdict (exit 2); ranks that would hang are a
    // bug (exit 1), as in every engine.
    if let Err(stop) = crate::preflight::check(&case) {
        if stop.verdict == Verdict::Invalid {
            return invalid(args, html, &case.name, &stop.message);
        }
        let r = output::report(
            Command::Prove,
            &case.name,
            &args.case,
            stop.verdict,
            &stop.message,
        );
        let print = || {
            if args.output.json() {
                crate::print_invalid_json(Some(&case.name), &stop.message);
            } else {
                outln!("refuted: {}", stop.message);
            }
        };
        return output::finish(
            &args.output,
            html,
            &r,
            print,
            |m| invalid(args, None, &case.name, m),
            stop.verdict,
        );
    }
    // Approximation overrides (`assume:`) replace the ranks' approximate computations by the
    // strict ones; a wrong one is invalid input at its entry.
    let (case, applied) = match shardproof_prove::assume::apply_overrides(&case) {
        Ok(x) => x,
        Err(e) => return invalid(args, html, &case.name, &format!("error: {e}")),
    };
    let staged = args.jobs.is_some()
        || args.shard.is_some()
        || args.merge.is_some()
        || case.inputs.iter().any(|r| r.cut)
        // A scaled relation is stated by the stage builder (`PlanOptions::scales`).
        || !case.scales().is_empty();
    if staged {
        return crate::prove_staged::main(args, html, &case, &applied, started, time_limit);
    }
    let progress = std::sync::Arc::new(shardproof_ir::Progress::default());
    let cfg = ProveConfig {
        time_limit,
        // The limit covers the whole command: loading and checking the case used part of it.
        started: Some(started),
        progress: Some(progress.clone()),
        reduce: !args.no_reduce,
        ..ProveConfig::default()
    };
    let owned = case.clone();
    // The prover keeps its own time limit (checked before every node and between goals), so
    // it ends with a report naming where it was; the watcher only shows its progress.
    let watched = crate::watch::watch_shown(
        move || prove_case(&owned, &cfg),
        progress,
        crate::watch::Shown {
            visible: !args.quiet && args.output.text(),
            prefix: format!("prove {}: ", case.name),
            units: "steps (nodes executed, then outputs decided)",
            preparing: "preparing the programs",
            limit: 0.0,
        },
    );
    let mut proof = match watched {
        crate::watch::Watched::Done(p) => p,
        _ => {
            let message =
                "inconclusive: the prover stopped without a result (its thread ended early)";
            let r = output::report(
                Command::Prove,
                &case.name,
                &args.case,
                Verdict::Inconclusive,
                message,
            );
            let json = || crate::print_stop_json(Some(&case.name), "inconclusive", message);
            output::invalid(&args.output, html, &r, json, true);
            return Verdict::Inconclusive;
        }
    };
    proof.assumptions = applied;
    let mut verdict = verdict_of(proof.verdict);
    if let (Some(dir), Some(cx)) = (&args.counterexample, &proof.counterexample) {
        if let Err(e) = cx.write(dir, &proof.case) {
            return invalid(
                args,
                html,
                &case.name,
                &format!("error: cannot write the counterexample: {e}"),
            );
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let converted = convert(&proof, args, verdict, seconds);
    let print = || {
        if args.output.json() {
            outln!(
                "{}",
                serde_json::to_string_pretty(&proof).unwrap_or_default()
            );
        } else {
            print_text(&proof, args);
        }
    };
    verdict = output::finish(
        &args.output,
        html,
        &converted,
        print,
        |message| invalid(args, None, &case.name, message),
        verdict,
    );
    if !args.quiet && verdict != Verdict::Invalid {
        errln!(
            "decided {} distinct goals over {} symbols in {:.1} ms",
            proof.stats.goals,
            proof.stats.symbols,
            seconds * 1e3
        );
    }
    verdict
}

pub(crate) fn layers_text(layers: &std::collections::BTreeMap<String, usize>) -> String {
    if layers.is_empty() {
        return "no goals".into();
    }
    layers
        .iter()
        .map(|(l, n)| format!("{l} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn shape_text(s: &[u64]) -> String {
    let parts: Vec<String> = s.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

/// Prints the approximation overrides a proof holds under, one line each.
pub(crate) fn print_assumptions(applied: &[shardproof_prove::assume::AppliedOverride]) {
    for a in applied {
        outln!(
            "assuming {} (TrainVerify 5.3 override, {} of the ranks' graphs rewritten): {}",
            a.assumption,
            a.graphs,
            a.substituted
        );
    }
}

/// The mesh-dim reduction along dp (docs/prove.md section 2), as the JSON's `mesh` and
/// `mesh_kept` say it: the replica count proved and the conditions that let the proof carry
/// over, or why the case was proved at its own mesh.
pub(crate) fn print_mesh(p: &Proof) {
    if let Some(m) = &p.mesh {
        let how = match p.verdict {
            ProofVerdict::Proved => "proved on two replicas; conditions checked: (a) one program along dp, no rank-dependent constant; (b) the spec batch-local along the dp-sharded dim; (c) batch reductions as means, linear after".to_string(),
            ProofVerdict::Refuted => format!(
                "refuted on two replicas, the counterexample confirmed on the case as written ({} {})",
                m.dim, m.original
            ),
            ProofVerdict::Inconclusive => "undecided on two replicas".to_string(),
        };
        outln!(
            "mesh-reduced: {} {} -> {} ({how}){}",
            m.dim,
            m.original,
            m.reduced,
            if m.rewritten.is_empty() {
                String::new()
            } else {
                format!(
                    "; {} literals rewritten with the replica count",
                    m.rewritten.len()
                )
            }
        );
        for r in &m.rewritten {
            outln!("  {r}");
        }
    }
    if let Some(why) = &p.mesh_kept {
        outln!("mesh kept: {why}");
    }
}

/// The tail of a verdict line that holds under overrides.
pub(crate) fn under_assumptions(applied: &[shardproof_prove::assume::AppliedOverride]) -> String {
    if applied.is_empty() {
        return String::new();
    }
    let keys: Vec<String> = applied
        .iter()
        .map(|a| format!("`{}`", a.assumption))
        .collect();
    format!(", under the assumptions {}", keys.join(", "))
}

/// The header line: the case's rank count and, when the proof went through the mesh-dim
/// reduction, that the sizes and element counts below are the reduced case's (a
/// refutation is confirmed on the case as written, so its counts are that case's).
fn header_text(p: &Proof) -> String {
    let head = format!("case {}: spec + {} ranks", p.case, p.ranks);
    match &p.mesh {
        Some(m) if p.verdict != ProofVerdict::Refuted => {
            // dp divides the rank count (the reduction requires it); otherwise no count.
            let ranks = if m.original > 0 && p.ranks.is_multiple_of(m.original) {
                format!("spec + {} ranks, ", p.ranks / m.original * m.reduced)
            } else {
                String::new()
            };
            format!(
                "{head}; the sizes and element counts below are the mesh-reduced case's ({ranks}{} {})",
                m.dim, m.reduced
            )
        }
        _ => head,
    }
}

/// The prover's message without the mesh-kept reason it ends with, which the `mesh kept:`
/// line already prints (the JSON keeps the message whole for its readers).
fn message_text(p: &Proof) -> &str {
    let message = p.message.as_deref().unwrap_or_default();
    p.mesh_kept
        .as_deref()
        .and_then(|why| message.strip_suffix(&format!(" ({why})")))
        .unwrap_or(message)
}

fn print_text(p: &Proof, args: &ProveArgs) {
    outln!("{}", header_text(p));
    print_assumptions(&p.assumptions);
    print_mesh(p);
    if let Some(r) = &p.reduction {
        let reduced = r.sizes.iter().filter(|s| s.reduced < s.original).count();
        outln!(
            "shape-reduced: {} of {} size variables reduced, {} tensor elements instead of {} (--no-reduce proves at full size)",
            reduced,
            r.sizes.len(),
            r.elements_after,
            r.elements_before
        );
        for i in r.inputs.iter().filter(|i| i.original != i.reduced) {
            outln!(
                "  {}: {} -> {}",
                i.name,
                shape_text(&i.original),
                shape_text(&i.reduced)
            );
        }
    }
    for o in &p.outputs {
        outln!(
            "  {} ({}): {} elements, {} distinct goals [{}]: {}{}",
            o.name,
            o.placement.as_deref().unwrap_or("no placement"),
            o.elements,
            o.distinct_goals,
            layers_text(&o.layers),
            o.status,
            o.note
                .as_ref()
                .map(|n| format!(" ({n})"))
                .unwrap_or_default()
        );
    }
    match p.verdict {
        ProofVerdict::Proved => outln!(
            "proved: every expected output equals the spec's for all inputs (decided by {}){}",
            layers_text(&p.layers),
            under_assumptions(&p.assumptions)
        ),
        ProofVerdict::Refuted => {
            outln!("refuted: {}", p.message.as_deref().unwrap_or_default());
            if let Some(f) = &p.failure {
                outln!("  spec:           {}", f.spec);
                outln!("  implementation: {}", f.implementation);
            }
            if p.reduction
                .as_ref()
                .is_some_and(|r| r.counterexample_reduced)
            {
                outln!("  the counterexample is for the shape-reduced programs (the full-size case is over the element limit)");
            }
            match &args.counterexample {
                Some(dir) => outln!("  counterexample written to {}", dir.display()),
                None => outln!("  hint: --counterexample DIR writes the inputs and both outputs"),
            }
        }
        ProofVerdict::Inconclusive => {
            outln!("inconclusive: {}", message_text(p));
            if let Some(op) = &p.unsupported_op {
                if p.reduction_refused() {
                    outln!("  hint: `{op}` is not on shape reduction's list of sound operators; `--no-reduce` proves at full size");
                } else {
                    outln!("  hint: `{op}` has no symbolic rule in the prover yet; `shardproof run` and `verify` may still decide the case");
                }
            }
        }
    }
}

/// The proof as the one report every format is rendered from.
fn convert(p: &Proof, args: &ProveArgs, verdict: Verdict, seconds: f64) -> report::Report {
    let summary = match p.verdict {
        ProofVerdict::Proved => format!(
            "proved: {} outputs equal the spec's for all inputs ({}){}",
            p.outputs.len(),
            layers_text(&p.layers),
            under_assumptions(&p.assumptions)
        ),
        _ => p.message.clone().unwrap_or_default(),
    };
    let mut out = output::report(Command::Prove, &p.case, &args.case, verdict, summary);
    out.seconds = Some(seconds);
    if let Some(f) = &p.failure {
        let cx = p.counterexample.as_ref();
        out.findings.push(report::Finding {
            hint: Some(
                "`shardproof prove --counterexample DIR` writes inputs on which the outputs differ"
                    .into(),
            ),
            ..report::Finding::new(
                "refuted",
                Level::Error,
                f.output.clone(),
                format!(
                    "element {:?} differs from the spec ({}){}",
                    f.index,
                    f.layer,
                    cx.map(|c| format!(": spec {} vs rebuilt {}", c.spec_value, c.rebuilt_value))
                        .unwrap_or_default()
                ),
            )
        });
    }
    if let Some(op) = &p.unsupported_op {
        out.findings.push(report::Finding::new(
            "unsupported-operator",
            Level::Warning,
            op.clone(),
            p.message.clone().unwrap_or_default(),
        ));
    }
    for o in &p.outputs {
        let status = match o.status.as_str() {
            "proved" => Status::Passed,
            "refuted" | "misfit" => Status::Failed,
            _ => Status::Skipped,
        };
        let mut c = Checked::new(o.name.clone(), status);
        c.message = Some(format!(
            "{} elements, {} distinct goals ({}){}",
            o.elements,
            o.distinct_goals,
            layers_text(&o.layers),
            o.note
                .as_ref()
                .map(|n| format!(": {n}"))
                .unwrap_or_default()
        ));
        out.checked.push(c);
    }
    out.fact("ranks", p.ranks.to_string());
    out.fact("symbols", p.stats.symbols.to_string());
    out.fact("expressions", p.stats.expressions.to_string());
    out.fact("distinct goals", p.stats.goals.to_string());
    out.fact("decided by", layers_text(&p.layers));
    if let Some(r) = &p.reduction {
        out.fact(
            "shape reduction",
            format!(
                "{} tensor elements instead of {}",
                r.elements_after, r.elements_before
            ),
        );
    }
    out
}
