//! `trace compare`: aligns a candidate trace with a reference by canonical id, merges each
//! logical tensor on both sides ([`crate::merge`]), checks the candidate's shard maps and
//! replicas, derives tolerances from the reference's perturbed runs ([`crate::tolerance`]) and
//! reports the first divergent tensor in execution order with a per-module table.
//!
//! Logical tensors are processed in parallel, each streamed from the mapped files and released
//! when done, so memory stays bounded by the tensors being read. The result is the same at any
//! thread count: every sum is added in a fixed order and results are kept in id order.

use crate::format::{CanonicalId, Phase, RunDtype};
use crate::merge::{Inconsistency, Layout, RecomputeCheck, ReplicaSpread};
use crate::reader::Trace;
use crate::tolerance::{layer_of, Measurement, Model, Source, Tolerance};
use rayon::prelude::*;
use shardproof_ir::Progress;
use std::collections::BTreeMap;

/// The outcome of a comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Every tensor matches within its tolerance and every shard map is consistent (exit 0).
    Holds,
    /// A divergence or a consistency finding (exit 1).
    Violated,
    /// Nothing comparable, or tensors that could not be judged (exit 3).
    Inconclusive,
}

impl Verdict {
    /// The exit code.
    pub fn exit_code(self) -> i32 {
        match self {
            Verdict::Holds => 0,
            Verdict::Violated => 1,
            Verdict::Inconclusive => 3,
        }
    }
}

/// How one logical tensor came out.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Status {
    /// Within tolerance.
    Passed,
    /// Beyond tolerance.
    Diverged,
    /// Its replicas disagree (beyond its tolerance, or at all where declared bit-identical);
    /// compared from the first replica.
    ReplicasDisagree,
    /// A recomputation (`recompute_input` / `recompute_output`) differs from the candidate's
    /// own forward value: the same kernels on the same inputs must give the same bits.
    RecomputeDiffers,
    /// The candidate's pieces do not tile the full tensor.
    Inconsistent {
        /// What is wrong with them.
        problems: Vec<Inconsistency>,
    },
    /// The candidate's full shape is not the reference's.
    ShapeMismatch {
        /// The reference's shape.
        reference: Vec<u64>,
        /// The candidate's.
        candidate: Vec<u64>,
    },
    /// The reference has it, the candidate does not.
    MissingInCandidate,
    /// The candidate has it, the reference does not: it cannot be judged.
    OnlyInCandidate,
    /// The reference's own pieces are inconsistent or not finite: it cannot be judged.
    NotComparable {
        /// Why.
        reason: String,
    },
}

impl Status {
    /// Whether it makes the verdict violated.
    pub fn is_violation(&self) -> bool {
        matches!(
            self,
            Status::Diverged
                | Status::ReplicasDisagree
                | Status::RecomputeDiffers
                | Status::Inconsistent { .. }
                | Status::ShapeMismatch { .. }
                | Status::MissingInCandidate
        )
    }

    /// The rule id of a finding of this status (`None` for passed).
    pub fn rule(&self) -> Option<&'static str> {
        Some(match self {
            Status::Passed => return None,
            Status::Diverged => "trace-divergence",
            Status::ReplicasDisagree => "replica-disagreement",
            Status::RecomputeDiffers => "recompute-mismatch",
            Status::Inconsistent { problems } => match problems.first() {
                Some(Inconsistency::Overlap { .. }) => "shard-overlap",
                _ => "shard-omission",
            },
            Status::ShapeMismatch { .. } => "shape-mismatch",
            Status::MissingInCandidate => "missing-tensor",
            Status::OnlyInCandidate => "unmatched-tensor",
            Status::NotComparable { .. } => "not-comparable",
        })
    }
}

/// One logical tensor's result.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TensorResult {
    /// Its canonical id.
    pub id: CanonicalId,
    /// `it{iteration}/mb{microbatch}/{kind}/{module}/{index}`.
    pub name: String,
    /// The recording module's class.
    pub module_class: Option<String>,
    /// Its layer, from the module name.
    pub layer: Option<u64>,
    /// Its sequence number in the reference (the candidate's for a candidate-only tensor; for
    /// a recomputation, the reference's of the backward tensor the candidate recorded just
    /// before it).
    pub seq: u64,
    /// Its place after the tensor at `seq` in execution order: 0 for a tensor of the
    /// reference, 1 + the candidate's sequence number for a recomputation.
    pub after: u64,
    /// rel_err(reference, candidate), when compared.
    pub relative_error: Option<f64>,
    /// Its tolerance, when it has a reference.
    pub tolerance: Option<Tolerance>,
    /// Perturbation responses, normalized to one unit of precision
    /// ([`RunDtype::precision`]), one per perturbed run that has it.
    pub responses: Vec<f64>,
    /// The worst replica disagreement, when the candidate holds replicas.
    pub replicas: Option<ReplicaSpread>,
    /// For a recomputation kind: the candidate's recomputation against its forward value
    /// (the reference's, when only the reference recomputes it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recompute: Option<RecomputeCheck>,
    /// How it came out.
    pub status: Status,
    /// Bytes of tensor data read for it.
    pub bytes: u64,
}

impl TensorResult {
    /// relative error / tolerance, when both are known.
    pub fn ratio(&self) -> Option<f64> {
        Some(self.relative_error? / self.tolerance?.value)
    }

    /// One line saying what is wrong (or that it passed).
    pub fn message(&self) -> String {
        let tol = self.tolerance.map_or(f64::NAN, |t| t.value);
        let errors = |e: f64| {
            format!(
                "relative error {} against tolerance {} (ratio {})",
                sci(e),
                sci(tol),
                ratio(e / tol)
            )
        };
        match &self.status {
            Status::Passed => self
                .relative_error
                .map_or_else(|| "passed".into(), |e| format!("passed: {}", errors(e))),
            Status::Diverged => format!(
                "diverges: {}",
                errors(self.relative_error.unwrap_or(f64::NAN))
            ),
            Status::ReplicasDisagree => {
                let r = self.replicas.as_ref();
                let bound = match r.and_then(|r| r.unequal) {
                    Some(n) => {
                        format!("{n} elements differ where the replicas are declared bit-identical")
                    }
                    None => format!("tolerance {}", sci(tol)),
                };
                format!(
                    "replicas disagree: rank {} holds {} with relative error {} from rank {} ({bound})",
                    r.map_or(0, |r| r.rank),
                    r.map_or(String::new(), |r| r.region.to_string()),
                    sci(r.map_or(f64::NAN, |r| r.relative_error)),
                    r.map_or(0, |r| r.against),
                )
            }
            Status::RecomputeDiffers => {
                let c = self.recompute.as_ref();
                format!(
                    "the recomputation differs from the forward value: {} of {} elements, relative error {} on rank {}; \
                     a recomputation runs the same kernels on the same inputs, so it must be bit-identical",
                    c.map_or(0, |c| c.unequal),
                    c.map_or(0, |c| c.elements),
                    sci(c.map_or(f64::NAN, |c| c.relative_error)),
                    c.map_or(0, |c| c.rank)
                )
            }
            Status::Inconsistent { problems } => problems
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; "),
            Status::ShapeMismatch {
                reference,
                candidate,
            } => {
                format!("full shape {candidate:?} in the candidate, {reference:?} in the reference")
            }
            Status::MissingInCandidate => "recorded by the reference, not by the candidate".into(),
            Status::OnlyInCandidate => {
                "recorded by the candidate, not by the reference: not judged".into()
            }
            Status::NotComparable { reason } => format!("not judged: {reason}"),
        }
    }
}

/// Scientific notation with 2 decimals (`3.10e-1`); `inf` and `nan` as such.
pub fn sci(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.2e}")
    } else {
        format!("{x}")
    }
}

fn ratio(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.1}")
    } else {
        format!("{x}")
    }
}

/// One row of the per-module table.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ModuleRow {
    /// The canonical module (or parameter) name.
    pub module: String,
    /// Its class, when recorded.
    pub module_class: Option<String>,
    /// Its layer.
    pub layer: Option<u64>,
    /// Its logical tensors.
    pub tensors: usize,
    /// Of those, compared against a tolerance, or (recomputations) checked bit for bit.
    pub compared: usize,
    /// Of those, findings (violations).
    pub findings: usize,
    /// The largest relative error / tolerance among its tensors.
    pub worst_ratio: Option<f64>,
    /// The tensor with that ratio.
    pub worst: Option<String>,
    /// The largest relative error among its tensors.
    pub max_relative_error: Option<f64>,
    /// The relative error of the tensor with the worst ratio.
    pub worst_error: Option<f64>,
    /// The tolerance of the tensor with the worst ratio.
    pub tolerance: Option<f64>,
}

/// What the tolerances rest on.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ToleranceSummary {
    /// Perturbed runs of the reference.
    pub perturbed_runs: usize,
    /// The model (epsilon, layers, growth fits).
    pub model: Model,
    /// Tensors whose tolerance is the dtype default.
    pub dtype_default: usize,
    /// A note for the report when tolerances are not all from perturbation.
    pub note: Option<String>,
}

/// The result of comparing a candidate trace with a reference.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Comparison {
    /// The reference directory.
    pub reference: String,
    /// The candidate directory.
    pub candidate: String,
    /// The reference's dtype.
    pub dtype: RunDtype,
    /// The verdict.
    pub verdict: Verdict,
    /// One line on the verdict.
    pub summary: String,
    /// Index into `tensors` of the first divergent tensor in execution order (beyond its
    /// tolerance, or with replicas that disagree).
    pub first_divergence: Option<usize>,
    /// What the tolerances rest on.
    pub tolerances: ToleranceSummary,
    /// Every logical tensor, in execution order.
    pub tensors: Vec<TensorResult>,
    /// The per-module table, in execution order of each module's first tensor.
    pub modules: Vec<ModuleRow>,
    /// Tensors compared against a tolerance.
    pub compared: usize,
    /// Bytes of tensor data read.
    pub bytes_read: u64,
}

/// What the streaming pass measures of one id before tolerances are known.
struct Measured {
    result: TensorResult,
    /// The measured response, normalized to one unit of precision (max over runs).
    response: Option<f64>,
}

fn layout_bytes(layout: &Layout<'_>) -> u64 {
    layout.bytes()
}

/// Compares `candidate` against `reference`, whose perturbed runs are `perturbed`.
pub fn compare(reference: &Trace, perturbed: &[Trace], candidate: &Trace) -> Comparison {
    compare_counted(reference, perturbed, candidate, &Progress::default())
}

/// [`compare`], counting the logical tensors measured in `progress`, for another thread to
/// show while it runs.
pub fn compare_counted(
    reference: &Trace,
    perturbed: &[Trace],
    candidate: &Trace,
    progress: &Progress,
) -> Comparison {
    let mut ids: Vec<&CanonicalId> = reference
        .logical
        .keys()
        .chain(candidate.logical.keys())
        .collect();
    ids.sort();
    ids.dedup();
    let epsilon = reference.meta.dtype.precision();
    progress.start(ids.len());
    let measured: Vec<Measured> = ids
        .par_iter()
        .map(|id| {
            progress.enter(&id.to_string());
            let m = measure(reference, perturbed, candidate, id, epsilon);
            progress.leave();
            m
        })
        .collect();
    let responses: Vec<Measurement> = measured
        .iter()
        .map(|m| Measurement {
            id: &m.result.id,
            elements: reference
                .logical
                .get(&m.result.id)
                .map(|r| r.full_shape.iter().product()),
            response: m.response,
        })
        .collect();
    let model = Model::fit(reference.meta.dtype, &responses, !perturbed.is_empty());
    let mut tensors: Vec<TensorResult> = measured
        .iter()
        .zip(&responses)
        .map(|(m, measurement)| {
            let mut r = m.result.clone();
            if r.id.kind.recomputed().is_none() && reference.logical.contains_key(&r.id) {
                let tol = model.tolerance(measurement);
                r.tolerance = Some(tol);
                judge(&mut r, tol);
            }
            r
        })
        .collect();
    tensors.sort_by_key(exec_key);
    finish(reference, perturbed.len(), candidate, model, tensors)
}

/// Execution order: iteration, then phase (forward, backward, optimizer), then the
/// reference's sequence number (a recomputation right after the backward tensor the candidate
/// recorded before it); candidate-only tensors after the reference's.
fn exec_key(t: &TensorResult) -> (u64, Phase, bool, u64, u64, CanonicalId) {
    let only = t.status == Status::OnlyInCandidate;
    (
        t.id.iteration,
        t.id.kind.phase(),
        only,
        t.seq,
        t.after,
        t.id.clone(),
    )
}

/// Whether `error` is within `tolerance`; NaN is within none.
fn within(error: f64, tolerance: f64) -> bool {
    error <= tolerance
}

/// The status of a compared tensor once its tolerance is known.
fn judge(r: &mut TensorResult, tol: Tolerance) {
    if r.status != Status::Passed {
        return;
    }
    // Disagreeing replicas say more than the divergence they usually cause as well (the first
    // replica is compared with the reference): they name the missing synchronization. NaN is
    // within no tolerance.
    if r.replicas.as_ref().is_some_and(|s| s.disagrees(tol.value)) {
        r.status = Status::ReplicasDisagree;
    } else if r.relative_error.is_some_and(|e| !within(e, tol.value)) {
        r.status = Status::Diverged;
    }
}

fn measure(
    reference: &Trace,
    perturbed: &[Trace],
    candidate: &Trace,
    id: &CanonicalId,
    epsilon: f64,
) -> Measured {
    let mut result = TensorResult {
        id: id.clone(),
        name: id.to_string(),
        module_class: None,
        layer: layer_of(&id.module),
        seq: 0,
        after: 0,
        relative_error: None,
        tolerance: None,
        responses: Vec::new(),
        replicas: None,
        recompute: None,
        status: Status::Passed,
        bytes: 0,
    };
    if let Some(forward) = id.kind.recomputed() {
        measure_recompute(reference, candidate, id, forward, &mut result);
        return Measured {
            result,
            response: None,
        };
    }
    let (r, c) = (reference.logical.get(id), candidate.logical.get(id));
    let (Some(r), Some(c)) = (r, c) else {
        if let Some(r) = r {
            result.seq = r.seq;
            result.module_class.clone_from(&r.module_class);
            result.status = Status::MissingInCandidate;
        } else if let Some(c) = c {
            result.seq = c.seq;
            result.module_class.clone_from(&c.module_class);
            result.status = Status::OnlyInCandidate;
        }
        return Measured {
            result,
            response: None,
        };
    };
    result.seq = r.seq;
    result.module_class = r.module_class.clone().or_else(|| c.module_class.clone());
    let ref_layout = Layout::new(reference, r);
    let ref_problems = ref_layout.inconsistencies();
    let mut response = None;
    // The responses, whatever the candidate: they fit the growth model for every tensor.
    if ref_problems.is_empty() {
        for run in perturbed {
            let Some(p) = run.logical.get(id) else {
                continue;
            };
            if p.full_shape != r.full_shape {
                continue;
            }
            let p_layout = Layout::new(run, p);
            if !p_layout.inconsistencies().is_empty() {
                continue;
            }
            let s = p_layout.compare(&ref_layout);
            result.bytes += layout_bytes(&p_layout);
            p_layout.release();
            let scale = run.meta.perturbation.map_or(epsilon, |q| q.relative_scale);
            let normalized = s.relative_error() * epsilon / scale;
            if normalized.is_finite() {
                result.responses.push(normalized);
                response = Some(response.map_or(normalized, |m: f64| m.max(normalized)));
            }
        }
    }
    let cand_layout = Layout::new(candidate, c);
    if c.full_shape != r.full_shape {
        result.status = Status::ShapeMismatch {
            reference: r.full_shape.clone(),
            candidate: c.full_shape.clone(),
        };
    } else if !ref_problems.is_empty() {
        let problems: Vec<String> = ref_problems.iter().map(ToString::to_string).collect();
        result.status = Status::NotComparable {
            reason: format!("the reference's own pieces: {}", problems.join("; ")),
        };
    } else {
        let problems = cand_layout.inconsistencies();
        result.replicas = cand_layout.replica_spread();
        if problems.is_empty() {
            let s = cand_layout.compare(&ref_layout);
            result.bytes += layout_bytes(&cand_layout) + layout_bytes(&ref_layout);
            if s.ref_sq.is_finite() {
                result.relative_error = Some(s.relative_error());
            } else {
                result.status = Status::NotComparable {
                    reason: "the reference holds non-finite values".into(),
                };
            }
        } else {
            result.status = Status::Inconsistent { problems };
        }
    }
    cand_layout.release();
    ref_layout.release();
    tracing::trace!(tensor = %id, error = ?result.relative_error, "compared");
    Measured { result, response }
}

/// A recomputation kind: checked within each trace that recorded it against that trace's own
/// forward value, bit for bit, never against the other trace. A candidate whose recomputation
/// differs is a finding; a reference whose recomputation differs cannot vouch for itself (not
/// judged).
fn measure_recompute(
    reference: &Trace,
    candidate: &Trace,
    id: &CanonicalId,
    forward: crate::format::Kind,
    result: &mut TensorResult,
) {
    let forward_id = CanonicalId {
        kind: forward,
        ..id.clone()
    };
    fn check<'t>(
        trace: &'t Trace,
        id: &CanonicalId,
        forward_id: &CanonicalId,
    ) -> Option<(&'t crate::reader::Logical, RecomputeCheck)> {
        let l = trace.logical.get(id)?;
        Some((
            l,
            RecomputeCheck::new(trace, l, trace.logical.get(forward_id)),
        ))
    }
    let reference_check = check(reference, id, &forward_id);
    if let Some((l, c)) = &reference_check {
        result.seq = l.seq;
        result.module_class.clone_from(&l.module_class);
        result.bytes += c.bytes;
        if c.problem.is_some() || c.unequal > 0 {
            result.status = Status::NotComparable {
                reason: format!(
                    "the reference's own recomputation differs from its forward value ({})",
                    c.problem
                        .clone()
                        .unwrap_or_else(|| format!("{} of {} elements", c.unequal, c.elements))
                ),
            };
        }
        result.recompute = Some(c.clone());
    }
    let Some((l, c)) = check(candidate, id, &forward_id) else {
        return;
    };
    result.module_class = l.module_class.clone().or(result.module_class.take());
    result.bytes += c.bytes;
    let (seq, after) = recompute_place(reference, candidate, l);
    result.seq = seq;
    result.after = after;
    if result.status == Status::Passed {
        if let Some(problem) = &c.problem {
            result.status = Status::NotComparable {
                reason: format!("the candidate's recomputation: {problem}"),
            };
        } else if c.unequal > 0 {
            result.status = Status::RecomputeDiffers;
        }
        result.relative_error = Some(c.relative_error);
        result.recompute = Some(c);
    }
}

/// Where a candidate's recomputation goes in execution order: after the backward tensor of the
/// same iteration and microbatch that the candidate recorded last before it on the same rank
/// and the reference recorded too (`(that tensor's reference seq, 1 + the recomputation's
/// candidate seq)`, the earliest over the ranks); at the start of the backward phase when there
/// is none.
fn recompute_place(
    reference: &Trace,
    candidate: &Trace,
    recomputed: &crate::reader::Logical,
) -> (u64, u64) {
    let mut best: Option<(u64, u64)> = None;
    for h in &recomputed.holders {
        let entries = &candidate.ranks[h.rank].index.tensors;
        let me = &entries[h.entry];
        let anchor = entries[..h.entry]
            .iter()
            .rev()
            .filter(|e| {
                e.id.iteration == me.id.iteration
                    && e.id.microbatch == me.id.microbatch
                    && e.id.kind.phase() == Phase::Backward
                    && e.id.kind.recomputed().is_none()
            })
            .find_map(|e| reference.logical.get(&e.id).map(|l| l.seq))
            .unwrap_or(0);
        let place = (anchor, 1 + me.seq);
        if best.is_none_or(|b| place < b) {
            best = Some(place);
        }
    }
    best.unwrap_or((0, 1))
}

fn finish(
    reference: &Trace,
    perturbed_runs: usize,
    candidate: &Trace,
    model: Model,
    tensors: Vec<TensorResult>,
) -> Comparison {
    let first_divergence = tensors.iter().position(|t| {
        matches!(
            t.status,
            Status::Diverged | Status::ReplicasDisagree | Status::RecomputeDiffers
        )
    });
    let recomputations = tensors
        .iter()
        .filter(|t| t.status == Status::Passed && t.recompute.is_some())
        .count();
    let compared = tensors
        .iter()
        .filter(|t| t.relative_error.is_some() && t.tolerance.is_some())
        .count();
    let violations: Vec<&TensorResult> =
        tensors.iter().filter(|t| t.status.is_violation()).collect();
    let undecided = tensors
        .iter()
        .filter(|t| {
            matches!(
                t.status,
                Status::OnlyInCandidate | Status::NotComparable { .. }
            )
        })
        .count();
    let verdict = if !violations.is_empty() {
        Verdict::Violated
    } else if compared == 0 || undecided > 0 {
        Verdict::Inconclusive
    } else {
        Verdict::Holds
    };
    let summary = match (verdict, first_divergence) {
        (Verdict::Violated, Some(k)) => {
            let t = &tensors[k];
            format!(
                "violated: first divergence at module `{}` ({}, iteration {}, microbatch {}): {}{}",
                t.id.module,
                t.id.kind,
                t.id.iteration,
                t.id.microbatch,
                t.message().replacen("diverges: ", "", 1),
                more(violations.len())
            )
        }
        (Verdict::Violated, None) => {
            let t = violations[0];
            format!(
                "violated: {} `{}`: {}{}",
                t.status.rule().unwrap_or(""),
                t.name,
                t.message().replacen("diverges: ", "", 1),
                more(violations.len())
            )
        }
        (Verdict::Inconclusive, _) if compared == 0 => {
            "inconclusive: no tensor of the candidate could be compared with the reference".into()
        }
        (Verdict::Inconclusive, _) => format!(
            "inconclusive: {compared} tensors within tolerance, but {undecided} could not be judged"
        ),
        (Verdict::Holds, _) => format!(
            "holds: all {compared} tensors within tolerance{}, shard maps and replicas consistent",
            match recomputations {
                0 => String::new(),
                n => format!(", {n} recomputations bit-identical to the forward"),
            }
        ),
    };
    let dtype_default = tensors
        .iter()
        .filter(|t| {
            t.tolerance
                .is_some_and(|x| x.source == Source::DtypeDefault)
        })
        .count();
    let note = if perturbed_runs == 0 {
        Some(format!(
            "the reference has no perturbed run (perturbed-0/): every tolerance is the {} default of {} machine epsilons ({}), not a measured one",
            reference.meta.dtype,
            crate::tolerance::DEFAULT_FACTOR,
            sci(crate::tolerance::DEFAULT_FACTOR * model.epsilon)
        ))
    } else if dtype_default > 0 {
        Some(format!(
            "{dtype_default} tensors are in no perturbed run: their tolerance is the {} default",
            reference.meta.dtype
        ))
    } else {
        None
    };
    let modules = module_table(&tensors);
    Comparison {
        reference: reference.dir.display().to_string(),
        candidate: candidate.dir.display().to_string(),
        dtype: reference.meta.dtype,
        verdict,
        summary,
        first_divergence,
        tolerances: ToleranceSummary {
            perturbed_runs,
            model,
            dtype_default,
            note,
        },
        bytes_read: tensors.iter().map(|t| t.bytes).sum(),
        compared,
        tensors,
        modules,
    }
}

fn more(n: usize) -> String {
    match n {
        0 | 1 => String::new(),
        n => format!(" (and {} more findings)", n - 1),
    }
}

fn module_table(tensors: &[TensorResult]) -> Vec<ModuleRow> {
    let mut order: Vec<String> = Vec::new();
    let mut rows: BTreeMap<String, ModuleRow> = BTreeMap::new();
    for t in tensors {
        let row = rows.entry(t.id.module.clone()).or_insert_with(|| {
            order.push(t.id.module.clone());
            ModuleRow {
                module: t.id.module.clone(),
                module_class: t.module_class.clone(),
                layer: t.layer,
                tensors: 0,
                compared: 0,
                findings: 0,
                worst_ratio: None,
                worst: None,
                max_relative_error: None,
                worst_error: None,
                tolerance: None,
            }
        });
        row.tensors += 1;
        row.findings += usize::from(t.status.is_violation());
        if t.recompute.is_some() && matches!(t.status, Status::Passed | Status::RecomputeDiffers) {
            row.compared += 1;
        }
        if let (Some(e), Some(ratio)) = (t.relative_error, t.ratio()) {
            row.compared += 1;
            row.max_relative_error = Some(row.max_relative_error.map_or(e, |m| m.max(e)));
            if row.worst_ratio.is_none_or(|w| ratio > w) {
                row.worst_ratio = Some(ratio);
                row.worst = Some(t.name.clone());
                row.worst_error = Some(e);
                row.tolerance = t.tolerance.map(|x| x.value);
            }
        }
    }
    order.into_iter().filter_map(|m| rows.remove(&m)).collect()
}

impl Comparison {
    /// The exit code of the verdict.
    pub fn exit_code(&self) -> i32 {
        self.verdict.exit_code()
    }

    /// The findings (violations and tensors not judged), in execution order.
    pub fn findings(&self) -> impl Iterator<Item = &TensorResult> {
        self.tensors.iter().filter(|t| t.status != Status::Passed)
    }

    /// The text report: the verdict, the first divergence, the findings, the tolerance note
    /// and the per-module table.
    pub fn render(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let _ = writeln!(out, "{}", self.summary);
        let _ = writeln!(
            out,
            "reference: {}  candidate: {}  dtype: {}",
            self.reference, self.candidate, self.dtype
        );
        if let Some(k) = self.first_divergence {
            let t = &self.tensors[k];
            let _ = writeln!(
                out,
                "\nfirst divergence (execution order: forward, backward, optimizer):"
            );
            let _ = writeln!(out, "  tensor:          {}", t.name);
            let _ = writeln!(
                out,
                "  module:          {}{}",
                t.id.module,
                t.module_class
                    .as_ref()
                    .map_or(String::new(), |c| format!(" ({c})"))
            );
            let _ = writeln!(out, "  kind:            {}", t.id.kind);
            let _ = writeln!(
                out,
                "  iteration:       {}  microbatch: {}",
                t.id.iteration, t.id.microbatch
            );
            let tol = t.tolerance.map_or(f64::NAN, |x| x.value);
            let e = t.relative_error.unwrap_or(f64::NAN);
            let _ = writeln!(out, "  relative error:  {}", sci(e));
            let exact = match (&t.status, &t.replicas) {
                (Status::RecomputeDiffers, _) => Some(("recomputation", "forward value")),
                (Status::ReplicasDisagree, Some(r)) if r.unequal.is_some() => {
                    Some(("replicas", "first replica (declared exact)"))
                }
                _ => None,
            };
            if let Some((what, against)) = exact {
                let _ = writeln!(
                    out,
                    "  tolerance:       none: the {what} must equal the {against} bit for bit"
                );
                let _ = writeln!(out, "  finding:         {}", t.message());
            } else {
                let _ = writeln!(
                    out,
                    "  tolerance:       {} ({})",
                    sci(tol),
                    t.tolerance.map_or("none", |x| source_word(x.source))
                );
                let _ = writeln!(out, "  ratio:           {}", ratio(e / tol));
            }
        }
        let findings: Vec<&TensorResult> = self.findings().collect();
        if !findings.is_empty() {
            let _ = writeln!(out, "\nfindings ({}):", findings.len());
            const SHOWN: usize = 20;
            for t in findings.iter().take(SHOWN) {
                let _ = writeln!(
                    out,
                    "  {}: {}: {}",
                    t.status.rule().unwrap_or(""),
                    t.name,
                    t.message()
                );
            }
            if findings.len() > SHOWN {
                let _ = writeln!(
                    out,
                    "  ... and {} more (--json lists every one)",
                    findings.len() - SHOWN
                );
            }
        }
        let _ = writeln!(out, "\ntolerances: {}", self.tolerance_line());
        let _ = writeln!(
            out,
            "\n{:<40} {:>7} {:>10} {:>10} {:>8}  worst tensor",
            "module", "tensors", "max error", "tolerance", "ratio"
        );
        for m in &self.modules {
            let flag = if m.findings > 0 { " !" } else { "" };
            let _ = writeln!(
                out,
                "{:<40} {:>7} {:>10} {:>10} {:>8}  {}{}",
                m.module,
                m.tensors,
                m.max_relative_error.map_or("-".into(), sci),
                m.tolerance.map_or("-".into(), sci),
                m.worst_ratio.map_or("-".into(), ratio),
                m.worst.as_deref().unwrap_or("-"),
                flag
            );
        }
        out
    }

    /// One line on what the tolerances rest on.
    pub fn tolerance_line(&self) -> String {
        let t = &self.tolerances;
        if let Some(note) = &t.note {
            return note.clone();
        }
        let fits: Vec<String> = t
            .model
            .fits
            .iter()
            .map(|f| format!("{} {:.2}", f.kind, f.coefficient))
            .collect();
        format!(
            "from {} perturbed run{} (x{} safety, floor 1 eps = {}){}",
            t.perturbed_runs,
            if t.perturbed_runs == 1 { "" } else { "s" },
            crate::tolerance::SAFETY_FACTOR,
            sci(t.model.epsilon),
            if fits.is_empty() {
                String::new()
            } else {
                format!(
                    "; growth model in eps over {} layers: {}",
                    t.model.layers,
                    fits.join(", ")
                )
            }
        )
    }
}

/// How a tolerance source reads in the report.
pub fn source_word(s: Source) -> &'static str {
    match s {
        Source::Perturbation => "perturbation response",
        Source::GrowthModel => "growth model across layers",
        Source::Floor => "floor: one machine epsilon",
        Source::DtypeDefault => "dtype default: no perturbed run",
    }
}
