//! Checks every engine runs before it gives a verdict on values: the spec and every rank graph
//! type-check (shapes and dtypes inferred through every operator, no empty or overflowing
//! tensor), and the ranks' collectives and messages can all meet.

use crate::Verdict;
use shardproof_case::Case;
use shardproof_interp::{first_equal, schedule, typecheck, ScheduleProblem};

/// Why a case gets no verdict on values, and which check decided.
pub struct PreflightStop {
    /// Invalid (exit 2) for a program that does not type-check or a call without meaning;
    /// violated (exit 1) for ranks that would hang.
    pub verdict: Verdict,
    /// `typecheck` or `schedule`.
    pub decided_by: &'static str,
    /// What is wrong, with file and line, and a hint.
    pub message: String,
}

/// How many type errors a report lists before it counts the rest.
const SHOWN_ERRORS: usize = 5;

/// Type-checks the spec and every rank, then simulates the ranks' communication.
pub fn check(case: &Case) -> Result<(), PreflightStop> {
    typecheck_all(case)?;
    let leaves: Vec<_> = (0..case.program.ranks.len())
        .map(|r| case.rank_leaves(r))
        .collect();
    match schedule(&case.program, &case.ops, Some(&leaves)).problem {
        None => Ok(()),
        Some(ScheduleProblem::Invalid(m)) => Err(PreflightStop {
            verdict: Verdict::Invalid,
            decided_by: "schedule",
            message: format!("error: {m}"),
        }),
        Some(ScheduleProblem::Hang(m)) => Err(PreflightStop {
            verdict: Verdict::Violated,
            decided_by: "schedule",
            message: m,
        }),
    }
}

/// Type-checks the spec and every rank graph (the first [`SHOWN_ERRORS`] errors reported).
pub fn typecheck_all(case: &Case) -> Result<(), PreflightStop> {
    let mut errors = Vec::new();
    if let Err(e) = typecheck(&case.spec, &case.ops) {
        errors.extend(e);
    }
    // A rank graph equal to an earlier one has its errors (same file, same lines).
    let first = first_equal(&case.program.ranks);
    for (r, graph) in case.program.ranks.iter().enumerate() {
        if first[r] == r {
            if let Err(e) = typecheck(graph, &case.ops) {
                errors.extend(e);
            }
        }
    }
    if errors.is_empty() {
        return Ok(());
    }
    let mut lines: Vec<String> = errors
        .iter()
        .take(SHOWN_ERRORS)
        .map(|e| format!("error: {e}"))
        .collect();
    if errors.len() > SHOWN_ERRORS {
        lines.push(format!(
            "... and {} more type errors",
            errors.len() - SHOWN_ERRORS
        ));
    }
    Err(PreflightStop {
        verdict: Verdict::Invalid,
        decided_by: "typecheck",
        message: format!(
            "the programs do not type-check, so no engine gives them a verdict:\n{}",
            lines.join("\n")
        ),
    })
}
