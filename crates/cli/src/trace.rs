//! `shardproof trace`: trace testing (crates/trace). `trace compare REF CAND` compares a
//! candidate run's trace with a reference run's, with tolerances from the reference's
//! perturbed runs, and reports the first divergent tensor in execution order. `trace emit CASE`
//! writes the traces of a case's interpreter runs (the spec as the reference, the ranks as the
//! candidate).

use crate::output::{self, HtmlFile, OutputArgs};
use crate::Verdict;
use clap::{Args as ClapArgs, Subcommand};
use shardproof_report::{
    self as report, Checked, Command, Level, Location, Plot, Rule, Series, Status,
};
use shardproof_trace::compare::{sci, source_word};
use shardproof_trace::emit::{emit_case, EmitError, EmitOptions};
use shardproof_trace::{Comparison, RunDtype, TensorResult};
use std::path::PathBuf;

/// The `trace` subcommands.
#[derive(Subcommand)]
pub enum TraceCommand {
    /// Compare a candidate run's trace with a reference run's (and its perturbed runs in
    /// REF/perturbed-K/): merge every logical tensor from its ranks' pieces, check overlap,
    /// omission and replicas, and report the first tensor beyond its tolerance in execution
    /// order (forward, backward, optimizer) with a per-module table. Exit 0 no divergence,
    /// 1 divergence or consistency finding, 2 invalid trace, 3 inconclusive.
    Compare(CompareArgs),
    /// Emit the traces of a case's interpreter runs: DIR/ref (the spec run, with perturbed
    /// reruns in DIR/ref/perturbed-K/) and DIR/cand (the ranks' run), recording the case's
    /// inputs and expected outputs with each rank's pieces from their layouts; then
    /// `shardproof trace compare DIR/ref DIR/cand`. Exit 3 for what a trace cannot represent
    /// (`expr:` inputs, partial layouts).
    Emit(EmitArgs),
}

/// Arguments of `shardproof trace emit`.
#[derive(ClapArgs)]
pub struct EmitArgs {
    /// The case file.
    case: PathBuf,
    /// The directory to write `ref/` and `cand/` into.
    #[arg(short = 'o', long = "out", value_name = "DIR")]
    out: PathBuf,
    /// The runs' dtype: f32 (float32), bf16 (bfloat16) or f64 (float64).
    #[arg(long, default_value = "f32", value_parser = parse_dtype)]
    dtype: RunDtype,
    /// The seed of the inputs.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Perturbed reference runs.
    #[arg(long, default_value_t = 2)]
    perturbed: u64,
}

fn parse_dtype(s: &str) -> Result<RunDtype, String> {
    match s {
        "f32" | "float32" => Ok(RunDtype::Float32),
        "bf16" | "bfloat16" => Ok(RunDtype::Bfloat16),
        "f64" | "float64" => Ok(RunDtype::Float64),
        _ => Err(format!("unknown dtype `{s}`: f32, bf16 or f64")),
    }
}

fn emit(args: &EmitArgs) -> Verdict {
    let case = match shardproof_case::load_case(&args.case) {
        Ok(c) => c,
        Err(e) => {
            errln!("error: {e}");
            return Verdict::Invalid;
        }
    };
    if let Err(stop) = crate::preflight::typecheck_all(&case) {
        errln!("{}", stop.message);
        return Verdict::Invalid;
    }
    let options = EmitOptions {
        dtype: args.dtype,
        seed: args.seed,
        perturbed: args.perturbed,
    };
    match emit_case(&case, &args.out, &options) {
        Ok(e) => {
            outln!(
                "wrote {0}/ref ({1} perturbed runs) and {0}/cand ({2} ranks): {3} tensors each ({4} module outputs), {5}",
                args.out.display(),
                args.perturbed,
                e.ranks,
                e.tensors,
                e.modules,
                args.dtype
            );
            if e.unplaced > 0 {
                errln!(
                    "note: {} module outputs left out: a rank's copy fits no even split of the spec's tensor, the ranks run the module a different number of times, or it is a backward gradient under data parallelism",
                    e.unplaced
                );
            }
            Verdict::Holds
        }
        Err(EmitError::Invalid(m)) => {
            errln!("{m}");
            Verdict::Invalid
        }
        Err(EmitError::Unsupported(m)) => {
            errln!("{m}");
            Verdict::Inconclusive
        }
        Err(EmitError::Violated(m)) => {
            errln!("{m}");
            Verdict::Violated
        }
    }
}

/// Arguments of `shardproof trace compare`.
#[derive(ClapArgs)]
pub struct CompareArgs {
    /// The reference trace directory (perturbed runs in its perturbed-0/, perturbed-1/, ...).
    reference: PathBuf,
    /// The candidate trace directory.
    candidate: PathBuf,
    #[command(flatten)]
    output: OutputArgs,
    /// Print nothing on stderr (progress, and the time taken).
    #[arg(long)]
    quiet: bool,
    /// Stop after this many seconds (0: no limit): exit 3, naming the tensor it had reached.
    #[arg(long, value_name = "SECONDS", default_value_t = 0.0, value_parser = crate::watch::parse_seconds)]
    time_limit: f64,
}

/// Runs a `trace` subcommand.
pub fn main(command: &TraceCommand) -> Verdict {
    match command {
        TraceCommand::Compare(args) => compare(args),
        TraceCommand::Emit(args) => emit(args),
    }
}

fn name(args: &CompareArgs) -> String {
    format!(
        "{} vs {}",
        args.candidate.display(),
        args.reference.display()
    )
}

fn invalid(args: &CompareArgs, html: Option<HtmlFile>, message: &str) -> Verdict {
    let r = output::report(
        Command::Trace,
        &name(args),
        &args.candidate,
        Verdict::Invalid,
        message,
    );
    let json = || crate::print_invalid_json(Some(&name(args)), message);
    output::invalid(&args.output, html, &r, json, true)
}

fn compare(args: &CompareArgs) -> Verdict {
    let started = std::time::Instant::now();
    let html = match args.output.prepare() {
        Ok(h) => h,
        Err(message) => return invalid(args, None, &message),
    };
    let progress = std::sync::Arc::new(shardproof_ir::Progress::default());
    let counted = progress.clone();
    let (reference, candidate) = (args.reference.clone(), args.candidate.clone());
    let watched = crate::watch::watch_shown(
        move || shardproof_trace::compare_dirs_counted(&reference, &candidate, &counted),
        progress,
        crate::watch::Shown {
            visible: !args.quiet && args.output.text(),
            prefix: format!("trace compare {}: ", name(args)),
            units: "tensors",
            preparing: "reading the traces",
            limit: args.time_limit,
        },
    );
    let unfinished = match watched {
        crate::watch::Watched::Done(Ok(r)) => Ok(r),
        crate::watch::Watched::Done(Err(e)) => return invalid(args, html, &format!("error: {e}")),
        crate::watch::Watched::TimedOut(at) => Err(format!(
            "inconclusive: the comparison did not finish within the time limit ({} s; --time-limit): {}",
            at.limit,
            at.at("tensor")
        )),
        crate::watch::Watched::Lost => Err(
            "inconclusive: the comparison stopped without a result (its thread ended early)".into(),
        ),
    };
    let result = match unfinished {
        Ok(r) => r,
        Err(message) => {
            // Printed as an invalid input's report is, with its own verdict and exit code.
            let r = output::report(
                Command::Trace,
                &name(args),
                &args.reference,
                Verdict::Inconclusive,
                &message,
            );
            let json = || crate::print_stop_json(Some(&name(args)), "inconclusive", &message);
            output::invalid(&args.output, html, &r, json, true);
            return Verdict::Inconclusive;
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    let verdict = match result.verdict {
        shardproof_trace::Verdict::Holds => Verdict::Holds,
        shardproof_trace::Verdict::Violated => Verdict::Violated,
        shardproof_trace::Verdict::Inconclusive => Verdict::Inconclusive,
    };
    let converted = convert(&result, args, verdict, seconds);
    let print = || {
        if args.output.json() {
            outln!(
                "{}",
                serde_json::to_string_pretty(&result).unwrap_or_default()
            );
        } else {
            outln!("{}", result.render().trim_end());
        }
    };
    let verdict = output::finish(
        &args.output,
        html,
        &converted,
        print,
        |m| invalid(args, None, m),
        verdict,
    );
    if !args.quiet && verdict != Verdict::Invalid {
        errln!(
            "compared {} tensors ({:.1} MB read) in {:.2} s",
            result.compared,
            result.bytes_read as f64 / 1e6,
            seconds
        );
    }
    verdict
}

/// The rules of `trace compare`, in report order.
const RULES: [(&str, &str); 9] = [
    ("trace-divergence", "A candidate tensor whose relative error from the reference exceeds its tolerance (from the reference's perturbation response)."),
    ("replica-disagreement", "Replicas of a candidate tensor (ranks mapping the same full box) that differ beyond its tolerance, or at all where declared bit-identical (exact_replicas), e.g. DP gradients without their all-reduce."),
    ("recompute-mismatch", "A candidate's recomputed module input or output (activation recomputation) that is not bit-identical to the same rank's forward value."),
    ("shard-overlap", "Pieces of a candidate tensor on different ranks that overlap partially."),
    ("shard-omission", "A part of a candidate's logical tensor that no rank holds."),
    ("shape-mismatch", "A candidate tensor whose logical full shape is not the reference's."),
    ("missing-tensor", "A tensor the reference recorded and the candidate did not (a missing module)."),
    ("unmatched-tensor", "A tensor only the candidate recorded: it cannot be judged."),
    ("not-comparable", "A tensor whose reference is inconsistent or not finite: it cannot be judged."),
];

/// Findings carried into the report (the text and JSON outputs list all).
const MAX_FINDINGS: usize = 100;

fn hint(t: &TensorResult) -> Option<String> {
    Some(match t.status.rule()? {
        "trace-divergence" => format!(
            "the first divergent tensor in execution order localizes the bug: look at module `{}` ({}) and what feeds it",
            t.id.module, t.id.kind
        ),
        "replica-disagreement" => "replicas must agree: a missing or wrong all-reduce, or a rank that skipped a synchronization".into(),
        "recompute-mismatch" => format!(
            "the recomputation of module `{}` read other tensors than its forward did (a stale input, a weight instead of its cast)",
            t.id.module
        ),
        "shard-overlap" | "shard-omission" => "check the collector's shard annotations (tp_dim, sp/cp dims) and the ranks' partitioning".into(),
        "missing-tensor" => "a module the candidate never ran (e.g. a wrong pipeline stage division), or a collector that did not hook it".into(),
        _ => return None,
    })
}

/// The comparison as the one report every format is rendered from.
fn convert(r: &Comparison, args: &CompareArgs, verdict: Verdict, seconds: f64) -> report::Report {
    let mut out = output::report(
        Command::Trace,
        &name(args),
        &args.candidate,
        verdict,
        r.summary.clone(),
    );
    out.seconds = Some(seconds);
    out.rules = RULES.iter().map(|(id, d)| Rule::new(*id, *d)).collect();
    let findings: Vec<&TensorResult> = r.findings().collect();
    for t in findings.iter().take(MAX_FINDINGS) {
        let level = if t.status.is_violation() {
            Level::Error
        } else {
            Level::Warning
        };
        let mut f = report::Finding::new(
            t.status.rule().unwrap_or("trace-divergence"),
            level,
            t.name.clone(),
            t.message(),
        );
        f.graph = Some(Location::file(args.candidate.display().to_string()));
        f.hint = hint(t);
        if let Some(s) = &t.replicas {
            if t.status == shardproof_trace::Status::ReplicasDisagree {
                f.ranks = vec![s.against as usize, s.rank as usize];
            }
        }
        out.findings.push(f);
    }
    if findings.len() > MAX_FINDINGS {
        out.findings.push(report::Finding::new(
            "trace-divergence",
            Level::Note,
            "more findings",
            format!(
                "{} more findings (the JSON report lists every one)",
                findings.len() - MAX_FINDINGS
            ),
        ));
    }
    for m in &r.modules {
        let status = if m.findings > 0 {
            Status::Failed
        } else if m.compared < m.tensors {
            Status::Skipped
        } else {
            Status::Passed
        };
        let mut c = Checked::new(m.module.clone(), status);
        c.message = Some(format!(
            "{} tensors, {} compared, {} findings; worst ratio {} (relative error {} against tolerance {})",
            m.tensors,
            m.compared,
            m.findings,
            m.worst_ratio.map_or("-".into(), |x| format!("{x:.2}")),
            m.max_relative_error.map_or("-".into(), sci),
            m.tolerance.map_or("-".into(), sci)
        ));
        if m.findings > 0 {
            c.rule = findings
                .iter()
                .find(|t| t.id.module == m.module)
                .and_then(|t| t.status.rule())
                .map(str::to_string);
        }
        c.detail = m.worst.clone();
        out.checked.push(c);
    }
    let marked_module = r
        .first_divergence
        .map(|k| &r.tensors[k])
        .or_else(|| findings.first().copied())
        .map(|t| t.id.module.clone());
    let categories: Vec<String> = r.modules.iter().map(|m| m.module.clone()).collect();
    out.plots.push(Plot {
        title: "Relative error against tolerance, per module in execution order".into(),
        x_label: "module".into(),
        y_label: "relative error".into(),
        marked: marked_module.and_then(|m| categories.iter().position(|c| *c == m)),
        categories,
        series: vec![
            Series {
                name: "error (worst tensor)".into(),
                values: r.modules.iter().map(|m| m.worst_error).collect(),
            },
            Series {
                name: "its tolerance".into(),
                values: r.modules.iter().map(|m| m.tolerance).collect(),
            },
        ],
        log_scale: true,
    });
    if let Some(k) = r.first_divergence {
        let t = &r.tensors[k];
        out.fact("first divergence", t.name.clone());
        out.fact(
            "module",
            format!(
                "{}{}",
                t.id.module,
                t.module_class
                    .as_ref()
                    .map_or(String::new(), |c| format!(" ({c})"))
            ),
        );
        if let Some(tol) = t.tolerance {
            out.fact(
                "tolerance",
                format!("{} ({})", sci(tol.value), source_word(tol.source)),
            );
        }
    }
    out.fact("reference", r.reference.clone());
    out.fact("candidate", r.candidate.clone());
    out.fact("dtype", r.dtype.to_string());
    out.fact("tolerances", r.tolerance_line());
    out.fact("tensors compared", r.compared.to_string());
    out.fact("bytes read", r.bytes_read.to_string());
    out
}
