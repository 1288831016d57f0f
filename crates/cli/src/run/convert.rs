//! `run`'s result as the one report every format is rendered from: a SARIF result per
//! mismatching output (at the spec's definition of it), a JUnit test case per compared output.

use super::{OutputResult, RunArgs, RunReport};
use crate::output;
use crate::Verdict;
use shardproof_case::Case;
use shardproof_report::{Checked, Finding, Level, Rule, Status};

/// The rules of `run`'s reports.
fn rules() -> Vec<Rule> {
    vec![
        Rule::new(MISMATCH, "An expected output of the ranks differs from the spec's by more than the tolerance (relative Frobenius error), or does not fit its declared placement."),
        Rule::new(HANG, "The ranks' communication cannot complete (a deadlock), or a message is never received."),
        Rule::new(INCONCLUSIVE, "The run could not decide: the case is over the memory budget, uses an operator without a meaning, or lays out an input by an expression."),
    ]
}

/// The rule ids of `run`'s reports.
const MISMATCH: &str = "output-mismatch";
const HANG: &str = "hang";
const INCONCLUSIVE: &str = "inconclusive";

/// The run's report as the one report every format is rendered from: a SARIF result per
/// mismatching output (at the spec's definition of it, in `case` when it was loaded), a JUnit
/// test case per compared output.
pub(super) fn report(
    r: &RunReport,
    args: &RunArgs,
    verdict: Verdict,
    case: Option<&Case>,
) -> shardproof_report::Report {
    let mismatch_text = |o: &OutputResult| {
        match (o.rel_error, &o.note) {
        (Some(e), _) => format!(
            "output `{}` differs from the spec: relative error {e:.3e} over the tolerance {:e} ({}, seed {})",
            o.name, o.tolerance.unwrap_or(r.tolerance), r.dtype, r.seed
        ),
        (None, Some(note)) => format!("output `{}` does not fit its placement: {note}", o.name),
        (None, None) => format!("output `{}` does not fit its placement", o.name),
    }
    };
    let message = r.message.as_deref().unwrap_or_default();
    let summary = match verdict {
        Verdict::Holds => format!(
            "holds: every compared output matches the spec ({} outputs, {}, seed {})",
            r.outputs.len(),
            r.dtype,
            r.seed
        ),
        Verdict::Violated => match r.outputs.iter().find(|o| !o.matched) {
            Some(o) => format!("violated: {}", mismatch_text(o)),
            None => output::first_line(message).to_string(),
        },
        Verdict::Invalid | Verdict::Inconclusive => output::first_line(message).to_string(),
    };
    let mut out = output::report(
        shardproof_report::Command::Run,
        &r.case,
        &args.case,
        verdict,
        summary,
    );
    out.rules = rules();
    for o in &r.outputs {
        let mut checked = Checked::new(o.name.clone(), Status::Passed);
        let error = o.rel_error.map_or("-".to_string(), |e| format!("{e:.3e}"));
        checked.detail = Some(format!(
            "placement {}; relative error {error} (tolerance {:e})",
            o.placement.as_deref().unwrap_or("-"),
            o.tolerance.unwrap_or(r.tolerance)
        ));
        if !o.matched {
            checked.status = Status::Failed;
            checked.rule = Some(MISMATCH.into());
            checked.message = Some(mismatch_text(o));
            let (graph, source) =
                case.map_or((None, None), |c| output::value_locations(&c.spec, &o.name));
            out.findings.push(Finding {
                graph,
                source,
                ..Finding::new(MISMATCH, Level::Error, o.name.clone(), mismatch_text(o))
            });
        }
        out.checked.push(checked);
    }
    if out.findings.is_empty() && matches!(verdict, Verdict::Violated | Verdict::Inconclusive) {
        let (rule, level) = if verdict == Verdict::Violated {
            (HANG, Level::Error)
        } else {
            (INCONCLUSIVE, Level::Warning)
        };
        let hint = message
            .lines()
            .find_map(|l| l.trim_start().strip_prefix("hint: "))
            .map(str::to_string);
        out.findings.push(Finding {
            hint,
            ..Finding::new(rule, level, "", output::first_line(message))
        });
    }
    if r.ranks > 0 {
        out.fact("ranks", r.ranks.to_string());
    }
    out.fact("seed", r.seed.to_string());
    out.fact("precision", r.dtype.clone());
    out.fact("tolerance", format!("{:e}", r.tolerance));
    out
}
