//! The second-size check of a proof made on reduced shapes (docs/prove/reduction.md,
//! "Second-size check"). Shape reduction proves a case at small sizes and claims the full
//! size; where a program reads a size as a value in a way no rule sees (an opaque function
//! of positions interpolated by a polynomial in them, a constant computed without literals
//! that equals a reduced size), the two programs can agree at the reduced sizes and at no
//! other. So a proof on reduced shapes is checked once more: the case is reduced again with
//! every reduced size variable forced strictly above its value in the proof
//! ([`crate::reduce::reduce_case_above`]), executed symbolically there, and every expected
//! output element compared at random points modulo a large prime (the functions fixed
//! random functions); a pair that differs there goes through the decision layers, which tell
//! a real difference (a witness) from an identity of the functions (a softmax regrouped).
//!
//! The check only removes proofs. A real difference withdraws the proof (inconclusive,
//! naming both reductions' sizes and the element), or, where the second sizes are the
//! case's own, refutes it with a counterexample the interpreter confirms. A check that
//! cannot be completed (its reduction refused, a limit, the time) withdraws the proof too:
//! no proof stands on a path that skipped work. Where the first reduction already is the
//! full size nothing is checked.

use super::counterexample;
use super::layout::{rebuild, Misfit};
use super::{
    combine_shares, expectations, inputs, program_elements, time_ran_out, unflatten, Failure,
    Proof, ProveConfig, Verdict,
};
use crate::decide::{decide, DecideConfig, Outcome, Point, Rng};
use crate::eval::{ModEval, PRIME};
use crate::exec::{self, ExecLimits, SymEnv};
use crate::expr::{Arena, ExprId, SymbolKind};
use crate::reduce::{reduce_case_above, Reduction};
use crate::tensor::SymTensor;
use serde::Serialize;
use shardproof_case::Case;
use std::collections::HashSet;
use std::time::Instant;

/// What the second-size check did, for the report (in the reduction summary).
#[derive(Clone, Debug, Serialize)]
pub struct SecondSizeCheck {
    /// Every free size variable: where it comes from, its size in the case, in the proof and
    /// at the check.
    pub sizes: Vec<SecondSize>,
    /// Whether the second sizes are the case's own (a difference there is a refutation).
    pub full_size: bool,
    /// `agreed` (every element equal at the second sizes), `differed` (an element is not:
    /// the proof is withdrawn or refuted), or `not-completed` (the check could not finish:
    /// the proof is withdrawn; `note` says why).
    pub outcome: String,
    /// Tensor elements of the spec and the ranks at the second sizes.
    pub program_elements: usize,
    /// Expected output elements compared.
    pub elements: usize,
    /// Distinct (spec, ranks) pairs whose normal forms differ, evaluated at the random points.
    pub evaluated: usize,
    /// Of those, the pairs that differed at a random point and that the decision layers
    /// proved equal (identities of the functions, such as a regrouped softmax).
    pub by_decision_layers: usize,
    /// Why, where the outcome is not `agreed`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// One size variable at both reductions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SecondSize {
    /// Where it first appeared (`spec x dim 1`).
    pub origin: String,
    /// Its size in the case.
    pub original: u64,
    /// Its size in the reduced case the proof was made on.
    pub first: u64,
    /// Its size in the second reduced case.
    pub second: u64,
}

/// How the message of a proof withdrawn by the check ends.
pub const COINCIDENCE: &str = "a coincidence of the reduction, not a proof";

/// An element where spec and ranks differ at the second sizes.
struct Difference {
    output: String,
    index: Vec<usize>,
    spec: String,
    implementation: String,
    layer: String,
    /// The confirmed counterexample, at the case's own sizes only; or why it is not one.
    confirmed: Option<Result<counterexample::Counterexample, String>>,
}

/// What comparing spec and ranks at the second sizes found.
enum Finding {
    Agreed,
    Differed(Box<Difference>),
}

/// Counts of the comparison.
#[derive(Default)]
struct Counts {
    program_elements: usize,
    elements: usize,
    evaluated: usize,
    by_decision_layers: usize,
}

/// `proof`, made on `first`'s reduced case of `case`, checked at the second sizes: returned
/// as it is unless it is [`Verdict::Proved`]; withdrawn (inconclusive) or, at the case's own
/// sizes, refuted where spec and ranks differ there or the check cannot be completed. The
/// check's record goes into the proof's reduction summary.
pub(super) fn check(
    case: &Case,
    cfg: &ProveConfig,
    started: Instant,
    mut proof: Proof,
    first: &Reduction,
) -> Proof {
    if proof.verdict != Verdict::Proved || proof.reduction.is_none() {
        return proof;
    }
    let second = match reduce_case_above(case, first) {
        // Every size is the case's own already: the proof was made at full size.
        Ok(None) => return proof,
        Ok(Some(r)) => r,
        Err(refusal) => {
            let why = format!(
                "the second-size check could not reduce the case again ({})",
                refusal.message
            );
            return not_completed(proof, Vec::new(), false, Counts::default(), why);
        }
    };
    let sizes: Vec<SecondSize> = first
        .sizes
        .iter()
        .zip(&second.sizes)
        .map(|(a, b)| SecondSize {
            origin: a.origin.clone(),
            original: a.original,
            first: a.reduced,
            second: b.reduced,
        })
        .collect();
    let full_size = sizes.iter().all(|s| s.second == s.original);
    // At the case's own sizes the second case is the case itself (every shape literal
    // rewritten to its own value): the counterexample then replays on the user's graphs.
    let at = if full_size { case } else { &second.case };
    let mut counts = Counts {
        program_elements: program_elements(at),
        ..Counts::default()
    };
    if counts.program_elements > cfg.max_elements {
        let why = format!(
            "the second-size check's case holds {} tensor elements, over the prover's limit of {}",
            counts.program_elements, cfg.max_elements
        );
        return not_completed(proof, sizes, full_size, counts, why);
    }
    let mut arena = Arena::new(cfg.budget);
    let finding = compare(at, cfg, started, &proof, full_size, &mut arena, &mut counts);
    // As in `prove_sized`: the verdict does not wait for the expressions to be freed.
    std::thread::spawn(move || drop(arena));
    let difference = match finding {
        Ok(Finding::Agreed) => {
            record(&mut proof, sizes, full_size, "agreed", counts, None);
            return proof;
        }
        Ok(Finding::Differed(d)) => d,
        Err(why) => return not_completed(proof, sizes, full_size, counts, why),
    };
    let shown = |pick: fn(&SecondSize) -> u64| -> String {
        let parts: Vec<String> = sizes
            .iter()
            .filter(|s| s.first < s.original)
            .map(|s| format!("{} = {}", s.origin, pick(s)))
            .collect();
        format!("{{{}}}", parts.join(", "))
    };
    let element = format!(
        "`{}`{:?} (spec {} vs ranks {}, {})",
        difference.output,
        difference.index,
        difference.spec,
        difference.implementation,
        difference.layer
    );
    let mut message =
        format!(
        "proved at reduced sizes {} but spec and ranks differ at {}{}: {element}: {COINCIDENCE}",
        shown(|s| s.first),
        shown(|s| s.second),
        if full_size { ", the case's own sizes" } else { "" },
    );
    proof.failure = Some(Failure {
        output: difference.output.clone(),
        index: difference.index.clone(),
        spec: difference.spec.clone(),
        implementation: difference.implementation.clone(),
        layer: difference.layer.clone(),
    });
    proof.verdict = Verdict::Inconclusive;
    match difference.confirmed {
        Some(Ok(cx)) => {
            proof.verdict = Verdict::Refuted;
            message = format!(
                "{message}; at the case's own sizes this is a refutation (the interpreter confirms: spec {} vs rebuilt {})",
                cx.spec_value, cx.rebuilt_value
            );
            proof.counterexample = Some(cx);
        }
        Some(Err(why)) => {
            message = format!(
                "{message}; at the case's own sizes, but the interpreter did not confirm the witness: {why}"
            );
        }
        None => {}
    }
    for o in proof
        .outputs
        .iter_mut()
        .filter(|o| o.name == difference.output)
    {
        o.status = if proof.verdict == Verdict::Refuted {
            "refuted".into()
        } else {
            "unknown".into()
        };
        o.note = Some(message.clone());
    }
    proof.message = Some(message.clone());
    record(
        &mut proof,
        sizes,
        full_size,
        "differed",
        counts,
        Some(message),
    );
    proof
}

/// The proof withdrawn because the check could not be completed.
fn not_completed(
    mut proof: Proof,
    sizes: Vec<SecondSize>,
    full_size: bool,
    counts: Counts,
    why: String,
) -> Proof {
    proof.verdict = Verdict::Inconclusive;
    proof.message = Some(format!(
        "proved at reduced sizes, but {why}: without it the proof may rest on a coincidence of the reduction"
    ));
    record(
        &mut proof,
        sizes,
        full_size,
        "not-completed",
        counts,
        Some(why),
    );
    proof
}

/// Writes the check's record into the proof's reduction summary.
fn record(
    proof: &mut Proof,
    sizes: Vec<SecondSize>,
    full_size: bool,
    outcome: &str,
    counts: Counts,
    note: Option<String>,
) {
    if let Some(summary) = proof.reduction.as_mut() {
        summary.second_size = Some(SecondSizeCheck {
            sizes,
            full_size,
            outcome: outcome.into(),
            program_elements: counts.program_elements,
            elements: counts.elements,
            evaluated: counts.evaluated,
            by_decision_layers: counts.by_decision_layers,
            note,
        });
    }
}

/// The random points of the check: per point, every symbol's residue (an index symbol's
/// within its range, so that lookups are exact; a flag's 0 or 1) and the functions' seed.
fn points(arena: &Arena, cfg: &DecideConfig) -> Vec<(Vec<u64>, u64)> {
    let mut rng = Rng::new(cfg.seed ^ 0x7365_636f_6e64_7369);
    (0..cfg.modular_points.max(2))
        .map(|_| {
            let residues = arena
                .symbols()
                .iter()
                .map(|(_, kind)| match kind {
                    SymbolKind::Bool => rng.next() & 1,
                    SymbolKind::Index(bound) => rng.next() % (*bound).max(1) as u64,
                    _ => rng.next() % PRIME,
                })
                .collect();
            (residues, rng.next())
        })
        .collect()
}

/// Executes `at` symbolically and compares every expected output element of the proof's
/// placements; `Err` where that cannot be done (an execution error, a placement that does
/// not fit, the time limit, a pair no layer decides).
fn compare(
    at: &Case,
    cfg: &ProveConfig,
    started: Instant,
    proof: &Proof,
    full_size: bool,
    arena: &mut Arena,
    counts: &mut Counts,
) -> Result<Finding, String> {
    let deadline = cfg.time_limit.map(|t| started + t);
    let out_of_time = || deadline.is_some_and(|d| Instant::now() > d);
    if let Some(limit) = cfg.time_limit {
        arena.set_deadline(started, limit);
    }
    let limits = ExecLimits {
        deadline,
        progress: None,
        ..cfg.limits.clone()
    };
    let decide_cfg = DecideConfig {
        deadline,
        ..cfg.decide.clone()
    };
    let executed = (|| {
        let leaves = inputs::make_leaves(arena, at)?;
        let spec = exec::run_graph(arena, &at.spec, &leaves.spec, &at.ops, &limits)?;
        let ranks = exec::run_program(arena, &at.program, &leaves.ranks, &at.ops, &limits)?;
        Ok::<_, exec::ExecError>((leaves, spec, ranks))
    })();
    let (leaves, spec_env, rank_envs): (inputs::Leaves, SymEnv, Vec<SymEnv>) = match executed {
        Ok(x) => x,
        Err(e) if out_of_time() => return Err(format!("{} ({})", time_ran_out(cfg), e.message)),
        Err(e) => return Err(format!("the programs do not execute there: {}", e.message)),
    };
    let exps = expectations(at).map_err(|e| e.message)?;
    // Rebuilt first, while the arena may still grow (a partial share's sum); evaluated after.
    let mut goals: Vec<(usize, usize, Vec<(usize, ExprId, ExprId)>)> = Vec::new();
    for (k, exp) in exps.iter().enumerate() {
        let placed = proof
            .outputs
            .iter()
            .find(|o| o.name == exp.name)
            .and_then(|o| o.placement.clone())
            .ok_or_else(|| format!("output `{}` has no proved placement", exp.name))?;
        let li = exp
            .layouts
            .iter()
            .position(|l| l.to_string() == placed)
            .ok_or_else(|| format!("output `{}` has no placement {placed}", exp.name))?;
        let layout = &exp.layouts[li];
        let spec: SymTensor = spec_env[exp.spec_value.node][exp.spec_value.output]
            .clone()
            .ok_or_else(|| format!("the spec does not compute `{}`", exp.name))?;
        let value_of = |r: usize| -> Option<&SymTensor> {
            let &(_, v) = exp.holders.iter().find(|(h, _)| *h == r)?;
            rank_envs[r][v.node][v.output].as_ref()
        };
        let holders: Vec<usize> = exp.holders.iter().map(|&(r, _)| r).collect();
        let rebuilt = rebuild(
            layout,
            &spec.shape,
            &at.program.mesh,
            &holders,
            &|r| value_of(r).map(|t| t.shape.clone()),
            &mut |r, i| value_of(r).expect("shape checked").elems[i],
            &mut |red, xs| combine_shares(arena, red, xs),
        )
        .map_err(|Misfit(why)| {
            format!(
                "output `{}` does not fit its placement {placed} there: {why}",
                exp.name
            )
        })?;
        let mut covered = vec![false; spec.numel()];
        for g in &rebuilt {
            covered[g.spec_index] = true;
        }
        if covered.iter().any(|c| !c) {
            return Err(format!(
                "the ranks' pieces of `{}` do not cover it there",
                exp.name
            ));
        }
        let pairs = rebuilt
            .iter()
            .map(|g| (g.spec_index, spec.elems[g.spec_index], g.value))
            .collect();
        goals.push((k, li, pairs));
    }
    let arena: &Arena = arena;
    let mut evaluators: Vec<ModEval> = points(arena, &decide_cfg)
        .into_iter()
        .map(|(residues, seed)| ModEval::new(arena, residues, seed))
        .collect();
    let mut seen: HashSet<(ExprId, ExprId)> = HashSet::new();
    let mut undecided: Option<String> = None;
    for (k, li, pairs) in &goals {
        let exp = &exps[*k];
        for &(spec_index, a, b) in pairs {
            counts.elements += 1;
            if a == b || !seen.insert((a, b)) {
                continue;
            }
            counts.evaluated += 1;
            if out_of_time() {
                return Err(time_ran_out(cfg));
            }
            if evaluators.iter_mut().all(|ev| ev.eval(a) == ev.eval(b)) {
                continue;
            }
            // Residues differ also where the sides are equal only through identities of the
            // functions (`exp(a)·exp(b) = exp(a + b)`): the decision layers tell which.
            let (layer, point): (_, Point) = match decide(arena, a, b, &decide_cfg) {
                Outcome::Proved(_) => {
                    counts.by_decision_layers += 1;
                    continue;
                }
                Outcome::Unknown(why) => {
                    undecided.get_or_insert_with(|| {
                        format!(
                            "`{}`{:?} differs at a random point and no layer decides it there ({why})",
                            exp.name,
                            unflatten(spec_index, &spec_shape(&spec_env, exp))
                        )
                    });
                    continue;
                }
                Outcome::Refuted { layer, point } => (layer, point),
            };
            let confirmed = full_size.then(|| {
                counterexample::confirm(
                    at,
                    arena,
                    &leaves,
                    &exp.name,
                    exp.spec_value,
                    &exp.holders,
                    &exp.layouts[*li],
                    Some(spec_index),
                    &point,
                    cfg.decide.seed,
                )
            });
            return Ok(Finding::Differed(Box::new(Difference {
                output: exp.name.clone(),
                index: unflatten(spec_index, &spec_shape(&spec_env, exp)),
                spec: arena.render(a, 200),
                implementation: arena.render(b, 200),
                layer: format!("second-size check, {}", layer.name()),
                confirmed,
            })));
        }
    }
    match undecided {
        None => Ok(Finding::Agreed),
        Some(why) => Err(why),
    }
}

/// The spec output's shape at the second sizes.
fn spec_shape(spec_env: &SymEnv, exp: &super::Expectation) -> Vec<usize> {
    spec_env[exp.spec_value.node][exp.spec_value.output]
        .as_ref()
        .map_or_else(Vec::new, |t| t.shape.clone())
}
