//! `verify`'s outcome as the one report every format is rendered from: a SARIF result for the
//! refutation or the inconclusive verdict (at the user's source when the capture recorded it,
//! else at the spec graph's line), a JUnit test case per checked output, and the neighbourhood
//! where relations stop for the HTML page.

use super::{describe, Decision};
use crate::output;
use crate::Verdict;
use shardproof_case::Case;
use shardproof_ir::NodeKind;
use shardproof_refine::{Failure, Outcome, Verdict as RefineVerdict};
use shardproof_report::{
    Checked, Command, Consumer, Finding, Level, Location, NeighbourInput, Neighbourhood, Relation,
    Report, Rule, Status,
};
use std::collections::BTreeSet;
use std::path::Path;

const RELATIONS_STOP: &str = "relations-stop";
const UNMET_EXPECTATION: &str = "unmet-expectation";
const COUNTEREXAMPLE: &str = "counterexample";
const HANG: &str = "hang";
const INCONCLUSIVE: &str = "inconclusive";
const TYPECHECK: &str = "typecheck";

fn rules() -> Vec<Rule> {
    vec![
        Rule::new(RELATIONS_STOP, "An output has no clean relation to the implementation: relations stop at a spec operator, where the result points."),
        Rule::new(UNMET_EXPECTATION, "An output relates to the implementation, but not as the case's `outputs:` expects."),
        Rule::new(COUNTEREXAMPLE, "A run on seeded random inputs, or on inputs the element-level prover found, shows an output differing from the spec."),
        Rule::new(HANG, "The ranks' communication cannot complete (a deadlock), or a message is never received."),
        Rule::new(INCONCLUSIVE, "Relation inference could not decide (an operator without meaning, a limit, a missing lemma) and no run settled it."),
    ]
}

/// The outputs `verify` checks, as the engine chooses them (`checked_outputs` in
/// crates/refine/src/engine.rs): the case's `outputs:`, else every spec output that is not an
/// input, once each.
fn checked_outputs(case: &Case) -> Vec<String> {
    if !case.outputs.is_empty() {
        return case
            .outputs
            .iter()
            .map(|o| case.spec.value_name(o.spec_value).to_string())
            .collect();
    }
    let mut seen = BTreeSet::new();
    case.spec
        .outputs
        .iter()
        .flatten()
        .filter(|v| seen.insert(**v))
        .filter(|v| !matches!(case.spec.nodes[v.node].kind, NodeKind::Input))
        .map(|v| case.spec.value_name(*v).to_string())
        .collect()
}

/// The report of a verdict reached before relation inference (invalid input, a program that
/// does not type-check, ranks that cannot meet).
pub(super) fn early(
    name: &str,
    case_file: &Path,
    verdict: Verdict,
    decided_by: &str,
    message: &str,
) -> Report {
    let mut r = output::report(
        Command::Verify,
        name,
        case_file,
        verdict,
        message.trim_end(),
    );
    r.rules = rules();
    r.rules.push(Rule::new(
        TYPECHECK,
        "The programs do not type-check: no verdict on their values.",
    ));
    if matches!(verdict, Verdict::Violated | Verdict::Inconclusive) {
        let (rule, level) = match (decided_by, verdict) {
            ("schedule", _) => (HANG, Level::Error),
            (_, Verdict::Violated) => (COUNTEREXAMPLE, Level::Error),
            _ => (INCONCLUSIVE, Level::Warning),
        };
        r.findings
            .push(Finding::new(rule, level, "", output::first_line(message)));
    }
    if !decided_by.is_empty() {
        r.fact("decided by", decided_by);
    }
    r
}

/// The report of a finished verification.
pub(super) fn report(
    case: &Case,
    case_file: &Path,
    o: &Outcome,
    verdict: Verdict,
    d: &Decision,
) -> Report {
    let reason = o.reason.as_deref().unwrap_or_default();
    let stop_text = |f: &Failure| {
        let relates = if o.unmet_expectation.is_some() {
            "relates to the implementation, but not as the case expects"
        } else {
            "has no clean relation to the implementation"
        };
        format!(
            "output `{}` {relates}: relations stop at spec operator `{}` ({})",
            f.output, f.operator, f.op
        )
    };
    let summary = match (verdict, o.verdict, &o.failure) {
        (Verdict::Holds, ..) if d.decided_by == "prove" => format!("verified: {reason}"),
        (Verdict::Holds, ..) => format!(
            "verified: every checked output has a clean relation ({} outputs, {} spec operators)",
            o.certificate.len(),
            o.spec_operators
        ),
        (Verdict::Invalid, ..) => reason.to_string(),
        (_, RefineVerdict::Refuted, Some(f)) => format!("refuted: {}", stop_text(f)),
        (_, RefineVerdict::Refuted, None) => format!("refuted: {reason}"),
        _ => format!("inconclusive: {reason}"),
    };
    let mut r = output::report(Command::Verify, &case.name, case_file, verdict, summary);
    r.seconds = Some(o.seconds);
    r.rules = rules();
    r.certificate = o
        .certificate
        .iter()
        .map(|c| Relation {
            tensor: c.tensor.clone(),
            relations: c.relations.clone(),
        })
        .collect();
    let undecided = verdict == Verdict::Inconclusive;
    let level = if undecided {
        Level::Warning
    } else {
        Level::Error
    };
    if matches!(verdict, Verdict::Violated | Verdict::Inconclusive) {
        r.findings.push(finding(case, o, d, level, &stop_text));
        if let Some(f) = &o.failure {
            r.neighbourhood = Some(neighbourhood(case, f));
        }
    }
    r.checked = checked(case, o, verdict, d, &stop_text);
    r.fact("decided by", d.decided_by);
    if let Some(c) = &d.counterexample {
        r.fact("counterexample", describe(c, "shows it"));
    }
    if let Some(s) = &d.search {
        r.fact("counterexample search", s.clone());
    }
    if let Some(h) = &d.prove {
        r.fact("element-level prover", h.summary());
    }
    r.fact("spec operators", o.spec_operators.to_string());
    r.fact("lemmas", o.lemmas.to_string());
    r
}

/// The one finding of a refuted or inconclusive verification.
fn finding(
    case: &Case,
    o: &Outcome,
    d: &Decision,
    level: Level,
    stop_text: &dyn Fn(&Failure) -> String,
) -> Finding {
    let reason = o.reason.as_deref().unwrap_or_default();
    if let Some(f) = &o.failure {
        let rule = if o.unmet_expectation.is_some() {
            UNMET_EXPECTATION
        } else {
            RELATIONS_STOP
        };
        let message = if level == Level::Warning && !reason.is_empty() {
            reason.to_string()
        } else {
            stop_text(f)
        };
        return Finding {
            source: f.source.as_deref().and_then(Location::parse),
            graph: Location::parse(&f.graph_location),
            hint: f.hint.clone(),
            ..Finding::new(rule, level, f.operator.clone(), message)
        };
    }
    let (rule, output) = match (&d.counterexample, &o.unmet_expectation) {
        (Some(c), _) if level == Level::Error => (COUNTEREXAMPLE, Some(c.output.clone())),
        (None, _) if level == Level::Error && prover_blames(d).is_some() => {
            (COUNTEREXAMPLE, prover_blames(d))
        }
        (None, _) if level == Level::Error => (HANG, None),
        (_, unmet) => (INCONCLUSIVE, unmet.clone()),
    };
    let (graph, source) = output
        .as_deref()
        .map_or((None, None), |n| output::value_locations(&case.spec, n));
    Finding {
        graph,
        source,
        ..Finding::new(rule, level, output.unwrap_or_default(), reason)
    }
}

/// The output the element-level prover's counterexample shows differing, if it gave one.
fn prover_blames(d: &Decision) -> Option<String> {
    d.prove
        .as_ref()
        .and_then(|h| h.counterexample.as_ref())
        .map(|c| c.output.clone())
}

/// One entry per checked output: related (passed), the one that fails (failed, or skipped
/// when inconclusive), and the rest not decided.
fn checked(
    case: &Case,
    o: &Outcome,
    verdict: Verdict,
    d: &Decision,
    stop_text: &dyn Fn(&Failure) -> String,
) -> Vec<Checked> {
    if verdict == Verdict::Invalid {
        return Vec::new();
    }
    let reason = o.reason.as_deref().unwrap_or_default();
    let violated = verdict == Verdict::Violated;
    let blamed = o
        .failure
        .as_ref()
        .map(|f| f.output.clone())
        .or_else(|| d.counterexample.as_ref().map(|c| c.output.clone()))
        .or_else(|| prover_blames(d))
        .or_else(|| o.unmet_expectation.clone());
    checked_outputs(case)
        .into_iter()
        .map(|name| {
            let related = o.certificate.iter().find(|c| c.tensor == name);
            let mut c = Checked::new(name.clone(), Status::Passed);
            c.detail = related.map(|rel| {
                rel.relations
                    .iter()
                    .map(|e| format!("{name} = {e}"))
                    .collect::<Vec<_>>()
                    .join("\n")
            });
            if verdict == Verdict::Holds && d.decided_by == "prove" {
                // The prover proved every checked output, related or not.
                if related.is_none() {
                    c.message = Some("proved by the element-level prover".into());
                }
            } else if blamed.as_deref() == Some(name.as_str()) {
                c.status = if violated {
                    Status::Failed
                } else {
                    Status::Skipped
                };
                c.rule = Some(
                    match (&o.failure, o.unmet_expectation.is_some()) {
                        (Some(_), true) => UNMET_EXPECTATION,
                        (Some(_), false) => RELATIONS_STOP,
                        (None, _) if violated => COUNTEREXAMPLE,
                        (None, _) => INCONCLUSIVE,
                    }
                    .to_string(),
                );
                c.message = Some(match &o.failure {
                    Some(f) if violated => stop_text(f),
                    _ => output::first_line(reason).to_string(),
                });
                c.detail = o.failure.as_ref().and_then(|f| f.hint.clone()).or(c.detail);
            } else if related.is_none() {
                c.status = Status::Skipped;
                c.message = Some(match (&blamed, violated) {
                    (Some(b), true) => {
                        format!("not decided: the verdict was settled at output `{b}`")
                    }
                    _ => format!("not decided: {}", output::first_line(reason)),
                });
            }
            c
        })
        .collect()
}

/// Where relations stop, with which inputs each implementation consumer reads: a consumer
/// reads an input when one of its operands is a tensor that the input's relations name
/// (`r0.mm_1` in `sum(r0.mm_1, r1.mm_1)`).
fn neighbourhood(case: &Case, f: &Failure) -> Neighbourhood {
    let inputs: Vec<NeighbourInput> = f
        .inputs
        .iter()
        .map(|(name, relations)| NeighbourInput {
            name: name.clone(),
            relations: relations.clone(),
        })
        .collect();
    let leaves: Vec<BTreeSet<&str>> = f
        .inputs
        .iter()
        .map(|(_, rels)| rels.iter().flat_map(|r| rank_tensors(r)).collect())
        .collect();
    let consumers = f
        .impl_consumers
        .iter()
        .map(|text| {
            let (name, op) = text.split_once(" = ").unwrap_or((text.as_str(), ""));
            let operands = operands(case, name);
            let reads = leaves
                .iter()
                .enumerate()
                .filter(|(_, l)| operands.iter().any(|t| l.contains(t.as_str())))
                .map(|(i, _)| i)
                .collect();
            Consumer {
                name: name.to_string(),
                op: op.to_string(),
                reads,
            }
        })
        .collect();
    Neighbourhood {
        output: f.output.clone(),
        operator: f.operator.clone(),
        op: f.op.clone(),
        graph: Location::parse(&f.graph_location),
        source: f.source.as_deref().and_then(Location::parse),
        inputs,
        computed: f.computed.clone(),
        consumers,
        hint: f.hint.clone(),
        other_stops: f.other_stops.clone(),
    }
}

/// The implementation tensors an expression names: `rN.name` tokens.
fn rank_tensors(expr: &str) -> Vec<&str> {
    let ident = |c: char| c.is_alphanumeric() || c == '_' || c == '.';
    expr.split(|c: char| !ident(c))
        .filter(|t| {
            t.split_once('.').is_some_and(|(rank, name)| {
                rank.len() > 1
                    && rank.starts_with('r')
                    && rank[1..].bytes().all(|b| b.is_ascii_digit())
                    && !name.is_empty()
            })
        })
        .collect()
}

/// The operands of implementation node `rN.name`, as `rN.value` names.
fn operands(case: &Case, node: &str) -> Vec<String> {
    let Some((rank, name)) = node.split_once('.') else {
        return Vec::new();
    };
    let Some(graph) = rank
        .strip_prefix('r')
        .and_then(|r| r.parse::<usize>().ok())
        .and_then(|r| case.program.ranks.get(r))
    else {
        return Vec::new();
    };
    graph
        .nodes
        .iter()
        .find(|n| n.name == name)
        .map(|n| {
            n.inputs()
                .iter()
                .map(|v| format!("{rank}.{}", graph.value_name(*v)))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_tensors_are_the_leaves_of_an_expression() {
        assert_eq!(
            rank_tensors("sum(r0.mm_1, r1.mm_1) * 1/2"),
            ["r0.mm_1", "r1.mm_1"]
        );
        assert_eq!(
            rank_tensors("cat(dim=1; r12.x[dim 0: 0..4], lr.y, r.z)"),
            ["r12.x"]
        );
        assert!(rank_tensors("(none: unrelated)").is_empty());
    }
}
