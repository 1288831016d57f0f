//! `shardproof prove` in stages (`--jobs`, `--shard`, `--merge`, or a case with cuts): the
//! case is cut into stages proved on their own and chained (crates/prove, `stage`).

use crate::output::{self, HtmlFile};
use crate::prove::{invalid, layers_text, verdict_of, ProveArgs};
use crate::Verdict;
use shardproof_case::Case;
use shardproof_prove::stage::{self, shard, StagedProof};
use shardproof_prove::{ProveConfig, Verdict as ProofVerdict};
use shardproof_report::{self as report, Checked, Command, Status};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Proves `case` in stages as the arguments ask and prints the report.
pub fn main(
    args: &ProveArgs,
    html: Option<HtmlFile>,
    case: &Case,
    applied: &[shardproof_prove::assume::AppliedOverride],
    started: Instant,
    time_limit: Option<Duration>,
) -> Verdict {
    let cfg = ProveConfig {
        time_limit,
        started: Some(started),
        reduce: !args.no_reduce,
        ..ProveConfig::default()
    };
    let jobs = args.jobs.unwrap_or(1).max(1);
    // The case's `scale:` entries: each rank's tensor is `c` times its placed piece.
    // The plan of a case of thousands of ranks takes minutes: the limit bounds it too.
    let options = stage::PlanOptions {
        scales: case.scales(),
        deadline: time_limit.map(|t| started + t),
        ..stage::PlanOptions::default()
    };
    let plan = match stage::plan_until(case, cfg.reduce, &options) {
        Ok(p) => p,
        Err(e) => {
            let mut proof = match &e {
                stage::PlanError::Refused(why) => stage::refused(case, why),
                stage::PlanError::OutOfTime(why) => stage::limit_reached(case, why),
            };
            proof.assumptions = applied.to_vec();
            return finish(args, html, case, &proof, started);
        }
    };
    if let (Some((i, n)), Some(dir)) = (args.shard, &args.shard_dir) {
        let mine = shard::shard_stages(&plan, i, n);
        let results = stage::prove_stages(&plan, &mine, &cfg, jobs);
        let outcomes: Vec<_> = results.iter().map(|(k, o, _)| (*k, o.clone())).collect();
        let path = match shard::write_shard(dir, &case.name, &plan, i, n, &outcomes) {
            Ok(p) => p,
            Err(e) => {
                return invalid(
                    args,
                    html,
                    &case.name,
                    &format!("error: cannot write the shard's results: {e}"),
                )
            }
        };
        // A shard's exit code is the verdict of its own stages only; `--merge` gives the
        // case's.
        let worst =
            outcomes
                .iter()
                .map(|(_, o)| o.verdict)
                .fold(ProofVerdict::Proved, |w, v| match (w, v) {
                    (ProofVerdict::Refuted, _) | (_, ProofVerdict::Refuted) => {
                        ProofVerdict::Refuted
                    }
                    (ProofVerdict::Inconclusive, _) | (_, ProofVerdict::Inconclusive) => {
                        ProofVerdict::Inconclusive
                    }
                    _ => ProofVerdict::Proved,
                });
        if !args.quiet {
            errln!(
                "shard {i}/{n}: {} of {} distinct stages ({}), results in {} ({:.1} s)",
                mine.len(),
                plan.distinct.len(),
                match worst {
                    ProofVerdict::Proved => "all proved",
                    ProofVerdict::Refuted => "one refuted",
                    ProofVerdict::Inconclusive => "not all decided",
                },
                path.display(),
                started.elapsed().as_secs_f64()
            );
        }
        if args.output.json() {
            outln!(
                "{}",
                serde_json::json!({
                    "case": case.name,
                    "shard": i,
                    "shards": n,
                    "stages": mine,
                    "verdict": worst,
                    "results": path.display().to_string(),
                })
            );
        }
        return verdict_of(worst);
    }
    let mut proof = match &args.merge {
        Some(dir) => match shard::read_shards(dir, &plan) {
            Ok(outcomes) => {
                let mut merged = stage::assemble(case, &plan, &outcomes);
                if args.counterexample.is_some() {
                    merged.refuted = stage::reprove_refuted(&plan, &outcomes, &cfg);
                }
                merged
            }
            Err(why) => return invalid(args, html, &case.name, &format!("error: {why}")),
        },
        None => stage::prove_staged_with(case, &cfg, jobs, &options),
    };
    proof.assumptions = applied.to_vec();
    if let (Some(dir), Some(p)) = (&args.counterexample, &proof.refuted) {
        if let Some(cx) = &p.counterexample {
            if let Err(e) = cx.write(dir, &p.case) {
                return invalid(
                    args,
                    html,
                    &case.name,
                    &format!("error: cannot write the counterexample: {e}"),
                );
            }
        }
    }
    finish(args, html, case, &proof, started)
}

fn finish(
    args: &ProveArgs,
    html: Option<HtmlFile>,
    case: &Case,
    proof: &StagedProof,
    started: Instant,
) -> Verdict {
    let verdict = verdict_of(proof.verdict);
    let converted = convert(proof, args, verdict, started.elapsed().as_secs_f64());
    let print = || {
        if args.output.json() {
            outln!(
                "{}",
                serde_json::to_string_pretty(proof).unwrap_or_default()
            );
        } else {
            print_text(proof, args);
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
            "{} stages, {} distinct ({} memo hits) in {:.1} ms",
            proof.stages.len(),
            proof.distinct_stages,
            proof.memo_hits,
            started.elapsed().as_secs_f64() * 1e3
        );
    }
    verdict
}

fn verdict_word(v: Option<ProofVerdict>) -> &'static str {
    match v {
        Some(ProofVerdict::Proved) => "proved",
        Some(ProofVerdict::Refuted) => "refuted",
        Some(ProofVerdict::Inconclusive) => "inconclusive",
        None => "no result",
    }
}

fn print_text(p: &StagedProof, args: &ProveArgs) {
    outln!(
        "case {}: spec + {} ranks, {} stages, {} distinct, {} decided by the memo",
        p.case,
        p.ranks,
        p.stages.len(),
        p.distinct_stages,
        p.memo_hits
    );
    crate::prove::print_assumptions(&p.assumptions);
    for s in &p.stages {
        let how = if s.memo_hit {
            format!("memo hit of stage {}", s.proved_by)
        } else {
            layers_text(&s.layers)
        };
        // The stage's own proof (memo hits have none) says whether it went through the
        // mesh-dim reduction along dp, as the JSON's `proofs[].proof.mesh` does.
        let own = p
            .proofs
            .iter()
            .find(|q| q.stage == s.index)
            .map(|q| &q.proof);
        let mesh = match own {
            Some(q) if q["mesh"].is_object() => format!(
                ", mesh-reduced {} {} -> {}",
                q["mesh"]["dim"].as_str().unwrap_or("dp"),
                q["mesh"]["original"],
                q["mesh"]["reduced"]
            ),
            Some(q) if q["mesh_kept"].is_string() => {
                format!(
                    ", mesh kept: {}",
                    q["mesh_kept"].as_str().unwrap_or_default()
                )
            }
            _ => String::new(),
        };
        outln!(
            "  stage {} {} [{} spec nodes, {} rank nodes; assumes {}]: {} ({how}{mesh})",
            s.index,
            s.target,
            s.spec_nodes,
            s.rank_nodes,
            if s.assumes.is_empty() {
                "nothing".to_string()
            } else {
                s.assumes.join(", ")
            },
            verdict_word(s.verdict)
        );
    }
    match p.verdict {
        ProofVerdict::Proved => outln!(
            "proved: every stage is proved and each assumes only case inputs and cuts established before it (decided by {}){}",
            layers_text(&p.layers),
            crate::prove::under_assumptions(&p.assumptions)
        ),
        ProofVerdict::Refuted => {
            outln!("refuted: {}", p.message.as_deref().unwrap_or_default());
            match (&args.counterexample, &p.refuted) {
                (Some(dir), Some(_)) => {
                    outln!("  the stage's counterexample is written to {}", dir.display())
                }
                (Some(_), None) => outln!(
                    "  no counterexample written: the refuted stage, proved again here, was not refuted within the limits; prove the case without --merge to write it"
                ),
                (None, _) => outln!("  hint: --counterexample DIR writes the stage's inputs and both outputs"),
            }
        }
        ProofVerdict::Inconclusive => outln!("inconclusive: {}", message_text(p)),
    }
}

/// The staged proof's message without a stage's mesh-kept reason at its end, which that
/// stage's line already prints (the JSON keeps the message whole for its readers).
fn message_text(p: &StagedProof) -> &str {
    let message = p.message.as_deref().unwrap_or_default();
    p.proofs
        .iter()
        .filter_map(|q| q.proof["mesh_kept"].as_str())
        .find_map(|why| message.strip_suffix(&format!(" ({why})")))
        .unwrap_or(message)
}

fn convert(p: &StagedProof, args: &ProveArgs, verdict: Verdict, seconds: f64) -> report::Report {
    let summary = match p.verdict {
        ProofVerdict::Proved => format!(
            "proved: {} stages ({} distinct) chain into the outputs ({}){}",
            p.stages.len(),
            p.distinct_stages,
            layers_text(&p.layers),
            crate::prove::under_assumptions(&p.assumptions)
        ),
        _ => p.message.clone().unwrap_or_default(),
    };
    let mut out = output::report(Command::Prove, &p.case, &args.case, verdict, summary);
    out.seconds = Some(seconds);
    for s in &p.stages {
        let status = match s.verdict {
            Some(ProofVerdict::Proved) => Status::Passed,
            Some(ProofVerdict::Refuted) => Status::Failed,
            _ => Status::Skipped,
        };
        let mut c = Checked::new(format!("stage {} {}", s.index, s.target), status);
        c.message = Some(if s.memo_hit {
            format!("memo hit of stage {}", s.proved_by)
        } else {
            format!(
                "{}{}",
                layers_text(&s.layers),
                s.message
                    .as_ref()
                    .map(|m| format!(": {m}"))
                    .unwrap_or_default()
            )
        });
        out.checked.push(c);
    }
    let totals: BTreeMap<&str, usize> = [
        ("stages", p.stages.len()),
        ("distinct stages", p.distinct_stages),
        ("memo hits", p.memo_hits),
    ]
    .into_iter()
    .collect();
    for (k, v) in totals {
        out.fact(k, v.to_string());
    }
    out.fact("decided by", layers_text(&p.layers));
    out
}
