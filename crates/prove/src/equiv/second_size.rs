//! The second-size check of a proof made on reduced shapes (docs/prove/reduction.md,
//! "Second-size check"). Shape reduction proves a case at small sizes and claims the full
//! size; where a program reads a size as a value in a way no rule sees (an opaque function
//! of positions interpolated by a polynomial in them, a constant computed without literals
//! that equals a reduced size), the two programs can agree at the reduced sizes and at no
//! other. So a proof on reduced shapes is checked once more: the case is reduced again with
//! every reduced size variable forced strictly above its value in the proof
//! ([`crate::reduce::reduce_case_above`]), and the reference interpreter runs the spec and
//! every rank there on random inputs (a few seeds, drawn as the symbols' kinds range),
//! comparing every expected output element, rebuilt by the placement the proof chose, with
//! the spec's: a clear difference (beyond rounding) is a real one.
//!
//! The check only removes proofs. A real difference withdraws the proof (inconclusive,
//! naming both reductions' sizes and the element), or, where the second sizes are the
//! case's own, refutes it with a counterexample the interpreter confirms. A check that
//! cannot be completed (its reduction refused, a limit, the time) withdraws the proof too:
//! no proof stands on a path that skipped work. Where the first reduction already is the
//! full size nothing is checked.

use super::counterexample;
use super::layout::rebuild;
use super::{
    expectations, inputs, program_elements, time_ran_out, unflatten, Failure, Proof, ProveConfig,
    Verdict,
};
use crate::decide::{Point, Rng};
use crate::eval::{clearly_differ, FloatEval};
use crate::expr::{Arena, SymbolKind};
use crate::reduce::{reduce_case_above, Reduction};
use crate::tensor::SymTensor;
use num_rational::BigRational;
use serde::Serialize;
use shardproof_case::{Case, Reduce};
use shardproof_interp::{run_graph, run_program, RunConfig};
use shardproof_ops::{Meta, Tensor};
use std::collections::BTreeMap;
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
    /// Expected output elements compared per run (every holder's copy of each).
    pub elements: usize,
    /// Runs of the interpreter on random inputs (one seed each).
    pub runs: usize,
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
    runs: usize,
}

/// Runs of the interpreter at the second sizes, one seed each. A difference a coincidence
/// leaves shows on almost every random input; a second draw covers an unlucky one (an element
/// whose difference a zero input hides). Fewer than the three of a run of the case as written
/// before a proof (`numeric_refutation`): the check runs after every proof on reduced sizes.
const SEEDS: u64 = 2;

/// `proof`, made on `first`'s reduced case of `case`, checked at the second sizes: returned
/// as it is unless it is [`Verdict::Proved`]; withdrawn (inconclusive) where spec and ranks
/// differ there or the check cannot be completed; refuted where they differ at the case's own
/// sizes and the interpreter confirms it. The check's record goes into the proof's reduction
/// summary.
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
    if counts.program_elements > cfg.max_run_elements {
        let why = format!(
            "the second-size check's case holds {} tensor elements, over the limit of {} for \
             its interpreter runs",
            counts.program_elements, cfg.max_run_elements
        );
        return not_completed(proof, sizes, full_size, counts, why);
    }
    let finding = compare(at, cfg, started, &proof, full_size, &mut counts);
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
            runs: counts.runs,
            note,
        });
    }
}

/// Inputs for the interpreter at one seed.
type Inputs = (BTreeMap<String, Tensor>, Vec<BTreeMap<String, Tensor>>);

/// The case's inputs at one seed's random point, as the interpreter takes them: the values
/// [`counterexample::confirm`] draws for the same seed, with the returned point, so that a
/// difference found here is found there again. Integers of unknown range are drawn in [-4, 4]
/// as `confirm` draws them, or, with `rows`, as 0 or 1: valid indices into any dim the
/// reduction leaves (at least 2), for the token ids an embedding backward reads that no range
/// bounds (drawn in [-4, 4], the interpreter stops on a negative row).
fn inputs_at(
    arena: &Arena,
    leaves: &inputs::Leaves,
    seed: u64,
    rows: bool,
    scale: i64,
) -> (Inputs, Point) {
    let mut rng = Rng::new(seed ^ 0xc0de);
    let mut values: Vec<f64> = arena
        .symbols()
        .iter()
        .map(|(_, kind)| rng.value(*kind).to_f64())
        .collect();
    let mut point = Point::default();
    for (s, (_, kind)) in arena.symbols().iter().enumerate() {
        if *kind == SymbolKind::Real && scale != 1 {
            // Reals drawn `scale` times wider ([-2, 2) times it): a coincidence gated by
            // the inputs' size (`relu(x - 3)`) is 0 on every draw in [-2, 2).
            let v = crate::expr::Coeff::from_float(values[s]).unwrap_or_default();
            let v = &v * &crate::expr::Coeff::from_integer(scale);
            values[s] = v.to_f64();
            point.values.push((s as u32, v.to_big()));
        }
        if rows && *kind == SymbolKind::Int {
            let bit = (values[s].abs() as i64) % 2;
            values[s] = bit as f64;
            point
                .values
                .push((s as u32, BigRational::from_integer(bit.into())));
        }
    }
    let mut eval = FloatEval::new(arena, values);
    let mut concrete = |t: &SymTensor| {
        let data = t.elems.iter().map(|&e| eval.eval(e)).collect();
        Tensor::new(Meta::new(t.dtype, t.shape.clone()), data)
    };
    let spec = leaves
        .spec
        .iter()
        .map(|(n, t)| (n.clone(), concrete(t)))
        .collect();
    let ranks = leaves
        .ranks
        .iter()
        .map(|l| l.iter().map(|(n, t)| (n.clone(), concrete(t))).collect())
        .collect();
    ((spec, ranks), point)
}

/// Combines the interpreter's partial shares of an element.
fn combine(reduce: Reduce, xs: Vec<f64>) -> Result<f64, String> {
    Ok(match reduce {
        Reduce::Sum => xs.iter().sum(),
        Reduce::Avg => xs.iter().sum::<f64>() / xs.len() as f64,
        Reduce::Max => xs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        Reduce::Min => xs.iter().copied().fold(f64::INFINITY, f64::min),
    })
}

/// Runs `at` through the interpreter on [`SEEDS`] random inputs and compares every expected
/// output element, each holder's copy apart (the ranks may differ on one copy only), rebuilt
/// by the placement the proof chose; `Err` where that cannot be done (inputs not laid out, an
/// interpreter error, a placement that does not fit, the time limit).
fn compare(
    at: &Case,
    cfg: &ProveConfig,
    started: Instant,
    proof: &Proof,
    full_size: bool,
    counts: &mut Counts,
) -> Result<Finding, String> {
    let deadline = cfg.time_limit.map(|t| started + t);
    let out_of_time = || deadline.is_some_and(|d| Instant::now() > d);
    // Symbols only: the leaves say which input element each random value goes to.
    let mut arena = Arena::new(cfg.budget);
    let leaves = inputs::make_leaves(&mut arena, at)
        .map_err(|e| format!("its inputs are not laid out: {}", e.message))?;
    let exps = expectations(at).map_err(|e| e.message)?;
    let mut placed = Vec::new();
    for exp in &exps {
        let placement = proof
            .outputs
            .iter()
            .find(|o| o.name == exp.name)
            .and_then(|o| o.placement.clone())
            .ok_or_else(|| format!("output `{}` has no proved placement", exp.name))?;
        let layout = exp
            .layouts
            .iter()
            .find(|l| l.to_string() == placement)
            .ok_or_else(|| format!("output `{}` has no placement {placement}", exp.name))?;
        placed.push((exp, layout));
    }
    let run_cfg = RunConfig {
        custom_ops: at.ops.clone(),
        ..RunConfig::default()
    };
    for k in 0..SEEDS {
        if out_of_time() {
            return Err(time_ran_out(cfg));
        }
        let seed = cfg.decide.seed.wrapping_add(k);
        // Every other run draws its reals 8 times wider.
        let scale = if k % 2 == 1 { 8 } else { 1 };
        let run = |rows: bool| {
            let ((spec_inputs, rank_inputs), point) = inputs_at(&arena, &leaves, seed, rows, scale);
            let spec_env = run_graph(&at.spec, &spec_inputs, &run_cfg)
                .map_err(|e| format!("the interpreter stops on the spec: {e}"))?;
            let rank_envs = run_program(&at.program, &rank_inputs, &run_cfg)
                .map_err(|e| format!("the interpreter stops on the ranks: {e}"))?;
            Ok::<_, String>((spec_env, rank_envs, point))
        };
        // Integers of unknown range drawn widely first: a coincidence multiplied by `t·(t -
        // 1)` is 0 wherever every `t` is 0 or 1. Where the interpreter stops on them (an
        // index out of range), drawn as rows.
        let (spec_env, rank_envs, point) = match run(false) {
            Ok(r) => r,
            Err(_) => run(true)?,
        };
        counts.runs += 1;
        let mut elements = 0;
        for &(exp, layout) in &placed {
            let spec = spec_env
                .get(exp.spec_value)
                .ok_or_else(|| format!("the interpreter did not compute `{}`", exp.name))?;
            let value_of = |r: usize| -> Option<&Tensor> {
                let &(_, v) = exp.holders.iter().find(|(h, _)| *h == r)?;
                rank_envs[r].get(v)
            };
            let shape_of = |r: usize| value_of(r).map(|t| t.shape().to_vec());
            let mut covered = vec![false; spec.numel()];
            for &(h, _) in &exp.holders {
                let pieces = rebuild(
                    layout,
                    spec.shape(),
                    &at.program.mesh,
                    &[h],
                    &shape_of,
                    &mut |r, i| value_of(r).expect("shape checked").data[i],
                    &mut combine,
                )
                .map_err(|m| {
                    format!(
                        "output `{}` does not fit its placement {layout} there: {}",
                        exp.name, m.0
                    )
                })?;
                for p in pieces {
                    elements += 1;
                    covered[p.spec_index] = true;
                    let want = spec.data[p.spec_index];
                    // NaN on one side only is a difference too: `clearly_differ` leaves out
                    // NaN (equal expressions may both be NaN on a random input), but a rank
                    // that is NaN where the spec is finite computes something else.
                    if !clearly_differ(want, p.value) && want.is_nan() == p.value.is_nan() {
                        continue;
                    }
                    // At the case's own sizes the difference is a refutation once the
                    // interpreter confirms it on the same inputs, with its replay.
                    let confirmed = full_size.then(|| {
                        counterexample::confirm(
                            at,
                            &arena,
                            &leaves,
                            &exp.name,
                            exp.spec_value,
                            &exp.holders,
                            layout,
                            Some(p.spec_index),
                            &point,
                            seed,
                        )
                    });
                    counts.elements = counts.elements.max(elements);
                    return Ok(Finding::Differed(Box::new(Difference {
                        output: exp.name.clone(),
                        index: unflatten(p.spec_index, spec.shape()),
                        spec: want.to_string(),
                        implementation: p.value.to_string(),
                        layer: format!("second-size check, a run on random inputs (seed {seed})"),
                        confirmed,
                    })));
                }
            }
            if covered.iter().any(|c| !c) {
                return Err(format!(
                    "the ranks' pieces of `{}` do not cover it there",
                    exp.name
                ));
            }
        }
        counts.elements = elements;
    }
    Ok(Finding::Agreed)
}
