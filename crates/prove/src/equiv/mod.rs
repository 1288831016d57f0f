//! Equivalence of a case, element by element: symbolic leaves laid out by the case, the spec
//! and every rank executed symbolically, each expected spec output rebuilt from the ranks'
//! outputs, and every (spec element, rebuilt element) pair decided. A refutation is reported
//! only with a counterexample the reference interpreter confirms.

pub mod counterexample;
pub mod inputs;
pub mod layout;
pub mod replay;
pub mod second_size;

use crate::decide::{decide, DecideConfig, Layer, Outcome, Point};
use crate::exec::{self, ExecError, ExecErrorKind, ExecLimits, SymEnv};
use crate::expr::{Arena, Budget, Coeff, ExprId, Func};
use crate::tensor::SymTensor;
use layout::{rebuild, Misfit};
use serde::Serialize;
use shardproof_case::{Case, Layout, Reduce};
use shardproof_ir::ValueId;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// Settings of a proof.
#[derive(Clone, Debug)]
pub struct ProveConfig {
    /// The decision procedure's settings.
    pub decide: DecideConfig,
    /// Limits on expressions.
    pub budget: Budget,
    /// Limits on tensors.
    pub limits: ExecLimits,
    /// Elements of all values of the spec and the ranks together, checked before executing.
    pub max_elements: usize,
    /// Elements of all values of the spec and the ranks together for the second-size check's
    /// interpreter runs ([`second_size`]): numeric runs of a few seeds cost far less per
    /// element than symbolic execution, so the bound is [`ProveConfig::max_elements`]'s scaled
    /// to memory (8 bytes an element), not to expression counts.
    pub max_run_elements: usize,
    /// Distinct goals decided.
    pub max_goals: usize,
    /// Wall-clock limit of the whole proof.
    pub time_limit: Option<Duration>,
    /// When the time limit began (`None`: when [`prove_case`] is called), so that a caller's
    /// own work before the proof counts against it.
    pub started: Option<Instant>,
    /// Where the proof counts its work, for another thread to show: the nodes executed, then
    /// the expected outputs decided.
    pub progress: Option<std::sync::Arc<shardproof_ir::Progress>>,
    /// Prove on the shape-reduced case ([`crate::reduce`]); refuse (inconclusive) where the
    /// reduction is not proved sound.
    pub reduce: bool,
    /// Run the case as written on random inputs, where it fits `max_elements`, before a
    /// symbolic proof at full size and before rechecking a refutation found on reduced sizes
    /// symbolically: a bug with a numeric effect is then refuted by the run's confirmed
    /// counterexample at once. Off, every refutation comes from the symbolic layers.
    pub run_first: bool,
}

impl Default for ProveConfig {
    fn default() -> Self {
        ProveConfig {
            decide: DecideConfig::default(),
            budget: Budget::default(),
            limits: ExecLimits::default(),
            max_elements: 4_000_000,
            max_run_elements: 32_000_000,
            max_goals: 1_000_000,
            time_limit: None,
            started: None,
            progress: None,
            reduce: true,
            run_first: true,
        }
    }
}

/// The verdict of a proof.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Every expected output equals the spec's for all inputs.
    Proved,
    /// Some output differs, with a counterexample the interpreter confirmed.
    Refuted,
    /// Neither: an operator without a rule, a limit, or goals no layer decided.
    Inconclusive,
}

/// What was decided of one expected output.
#[derive(Clone, Debug, Serialize)]
pub struct OutputResult {
    /// The spec tensor's name.
    pub name: String,
    /// The placement its elements were rebuilt by.
    pub placement: Option<String>,
    /// Elements compared.
    pub elements: usize,
    /// Distinct (spec, implementation) expression pairs among them.
    pub distinct_goals: usize,
    /// Distinct goals per deciding layer (`normal-form`, `random-witness`, `product-expansion`,
    /// `z3`, `unknown`).
    pub layers: BTreeMap<String, usize>,
    /// `proved`, `refuted`, `unknown` or `misfit`.
    pub status: String,
    /// Why, when not proved.
    pub note: Option<String>,
}

/// A goal that failed, in words.
#[derive(Clone, Debug, Serialize)]
pub struct Failure {
    /// The spec output.
    pub output: String,
    /// The element's index.
    pub index: Vec<usize>,
    /// The spec's expression (cut when long).
    pub spec: String,
    /// The rebuilt implementation's expression (cut when long).
    pub implementation: String,
    /// The layer that found the difference.
    pub layer: String,
}

/// Sizes of the symbolic execution.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Stats {
    /// Input symbols.
    pub symbols: usize,
    /// Distinct expressions.
    pub expressions: usize,
    /// Distinct atoms.
    pub atoms: usize,
    /// Polynomial terms stored.
    pub terms: usize,
    /// Distinct goals decided.
    pub goals: usize,
}

/// The result of proving a case.
#[derive(Clone, Debug, Serialize)]
pub struct Proof {
    /// The case's name.
    pub case: String,
    /// Ranks of the program.
    pub ranks: usize,
    /// The verdict.
    pub verdict: Verdict,
    /// Per expected output.
    pub outputs: Vec<OutputResult>,
    /// Distinct goals per deciding layer, over all outputs.
    pub layers: BTreeMap<String, usize>,
    /// The first failing goal, if any.
    pub failure: Option<Failure>,
    /// The confirmed counterexample of a refutation.
    pub counterexample: Option<counterexample::Counterexample>,
    /// The operator without a symbolic rule, when one stopped the proof.
    pub unsupported_op: Option<String>,
    /// Why the verdict is not `proved`, in words.
    pub message: Option<String>,
    /// Sizes.
    pub stats: Stats,
    /// How the case was shape-reduced before the proof (`None`: proved at full size).
    pub reduction: Option<ReductionSummary>,
    /// The approximation overrides of `assume:` the proof holds under (the caller applies
    /// them with [`crate::assume::apply_overrides`] and records them here); empty: none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub assumptions: Vec<crate::assume::AppliedOverride>,
    /// The mesh-dim reduction along dp the proof went through, when it did
    /// ([`crate::reduce::mesh`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mesh: Option<MeshSummary>,
    /// Why the case was proved at its own mesh although it has a dp dim the mesh-dim
    /// reduction could shrink (the condition that failed, or the undecided two-replica case).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mesh_kept: Option<String>,
    /// The case that the outputs' `elements` and `distinct_goals`, `layers`, `stats` and
    /// `reduction` count: the case as written (its ranks are `ranks`), or the two-replica case
    /// of `mesh` where the proof stands on that one.
    pub counted_on: CountedOn,
}

/// Which case a [`Proof`]'s counts are for (see [`Proof::counted_on`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CountedOn {
    /// `as-written`, or `mesh-reduced` (the case of [`Proof::mesh`] at its reduced size).
    pub case: String,
    /// Ranks of that case.
    pub ranks: usize,
}

impl CountedOn {
    /// The case as written, with `ranks` ranks.
    pub fn as_written(ranks: usize) -> Self {
        CountedOn {
            case: "as-written".into(),
            ranks,
        }
    }

    /// The mesh-reduced case, with `ranks` ranks.
    pub fn mesh_reduced(ranks: usize) -> Self {
        CountedOn {
            case: "mesh-reduced".into(),
            ranks,
        }
    }
}

/// What the mesh-dim reduction along dp did, for the report.
#[derive(Clone, Debug, Serialize)]
pub struct MeshSummary {
    /// The mesh dim (`dp`).
    pub dim: String,
    /// Its size in the case.
    pub original: usize,
    /// Its size in the case proved.
    pub reduced: usize,
    /// The literals rewritten with the replica count.
    pub rewritten: Vec<String>,
}

/// What shape reduction did, for the report.
#[derive(Clone, Debug, Serialize)]
pub struct ReductionSummary {
    /// Every spec input's original and reduced shape.
    pub inputs: Vec<ReducedInput>,
    /// The free size variables with their original and reduced sizes.
    pub sizes: Vec<crate::reduce::ReducedSize>,
    /// Sizes kept whole because no factor related an equation's sides.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kept_whole: Vec<crate::reduce::KeptSize>,
    /// Each vocabulary that integer inputs (the labels) index: its block reduced with them
    /// (`block` -> `reduced_block`, with `N` and `B`), or kept whole and the condition that
    /// failed (`kept`). Empty where no integer input indexes a vocabulary.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub vocabulary: Vec<crate::reduce::vocab::VocabReduction>,
    /// Tensor elements of the spec and the ranks, before and after.
    pub elements_before: usize,
    /// After.
    pub elements_after: usize,
    /// Whether the counterexample's inputs have the reduced shapes (the full-size case was
    /// over the element limit); otherwise a refutation was shown at full size.
    pub counterexample_reduced: bool,
    /// The second-size check of a proof on these sizes ([`second_size`]): the sizes it ran
    /// at and whether spec and ranks agreed there. Absent where the proof is not `proved` or
    /// the sizes are the case's own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub second_size: Option<second_size::SecondSizeCheck>,
}

/// One spec input's shapes.
#[derive(Clone, Debug, Serialize)]
pub struct ReducedInput {
    /// The spec input.
    pub name: String,
    /// Its shape in the case.
    pub original: Vec<u64>,
    /// Its shape in the reduced case.
    pub reduced: Vec<u64>,
}

impl ReductionSummary {
    /// The summary of `reduction` of `case`, its counterexample (if any) at full size.
    fn of(case: &Case, reduction: &crate::reduce::Reduction) -> Self {
        ReductionSummary {
            inputs: reduction
                .inputs
                .iter()
                .map(|(name, original, reduced)| ReducedInput {
                    name: name.clone(),
                    original: original.clone(),
                    reduced: reduced.clone(),
                })
                .collect(),
            sizes: reduction.sizes.clone(),
            kept_whole: reduction.kept_whole.clone(),
            vocabulary: reduction.vocabulary.clone(),
            elements_before: program_elements(case),
            elements_after: program_elements(&reduction.case),
            counterexample_reduced: false,
            second_size: None,
        }
    }
}

/// How the reason begins of a size [`crate::reduce::reduce_case_pinning_scaled_sizes`] pins.
const SCALED_SIZE_PIN: &str = crate::reduce::SCALED_SIZE_PIN;

/// How [`Proof::message`] begins when shape reduction refused the case.
const REDUCTION_REFUSED: &str = "shape reduction refused";

impl Proof {
    /// Whether shape reduction refused the case (an operator outside its list of sound ones),
    /// so that only a proof at full size can decide it.
    pub fn reduction_refused(&self) -> bool {
        self.verdict == Verdict::Inconclusive
            && self.reduction.is_none()
            && self
                .message
                .as_deref()
                .is_some_and(|m| m.starts_with(REDUCTION_REFUSED))
    }

    fn stopped(case: &Case, verdict: Verdict, e: &ExecError) -> Proof {
        Proof {
            case: case.name.clone(),
            ranks: case.program.ranks.len(),
            verdict,
            outputs: Vec::new(),
            layers: BTreeMap::new(),
            failure: None,
            counterexample: None,
            unsupported_op: e
                .op
                .clone()
                .filter(|_| e.kind == ExecErrorKind::Unsupported),
            message: Some(e.message.clone()),
            stats: Stats::default(),
            reduction: None,
            assumptions: Vec::new(),
            mesh: None,
            mesh_kept: None,
            counted_on: CountedOn::as_written(case.program.ranks.len()),
        }
    }
}

/// An expected output: the spec value, where the ranks hold it, and the layouts to try.
struct Expectation {
    name: String,
    spec_value: ValueId,
    holders: Vec<(usize, ValueId)>,
    layouts: Vec<Layout>,
    explicit: bool,
}

fn expectations(case: &Case) -> Result<Vec<Expectation>, ExecError> {
    if !case.outputs.is_empty() {
        let mut out = Vec::new();
        for e in &case.outputs {
            if let Layout::Expr(_) = e.layout {
                return Err(ExecError::unsupported(
                    "outputs",
                    format!("`{}` expects an `expr:` layout; the prover rebuilds outputs by placements only", e.spec_name),
                ));
            }
            out.push(Expectation {
                name: e.spec_name.clone(),
                spec_value: e.spec_value,
                holders: e.rank_values.clone(),
                layouts: vec![e.layout.clone()],
                explicit: true,
            });
        }
        out.sort_by_key(|e| e.spec_value);
        return Ok(out);
    }
    let mut seen = Vec::new();
    let mut out = Vec::new();
    for (i, o) in case.spec.outputs.iter().enumerate() {
        let Some(v) = *o else { continue };
        if seen.contains(&v) {
            continue;
        }
        seen.push(v);
        let holders = case
            .program
            .ranks
            .iter()
            .enumerate()
            .filter_map(|(r, g)| g.outputs.get(i).copied().flatten().map(|rv| (r, rv)))
            .collect();
        let rank = case.spec.recorded_type(v).map_or(0, |t| t.shape.len());
        out.push(Expectation {
            name: case.spec.value_name(v).to_string(),
            spec_value: v,
            holders,
            layouts: shardproof_case::simple_layouts(case.program.mesh.dims.len(), rank, 256),
            explicit: false,
        });
    }
    Ok(out)
}

/// Elements of every value inference knows, spec and ranks together.
fn program_elements(case: &Case) -> usize {
    let count = |g: &shardproof_ir::Graph| -> usize {
        shardproof_interp::infer_graph(g, &case.ops)
            .metas
            .iter()
            .flatten()
            .flatten()
            .map(|m| m.numel())
            .sum()
    };
    let first = shardproof_interp::first_equal(&case.program.ranks);
    let mut per_graph = HashMap::new();
    let mut total = count(&case.spec);
    for (r, g) in case.program.ranks.iter().enumerate() {
        let n = *per_graph.entry(first[r]).or_insert_with(|| count(g));
        total = total.saturating_add(n);
    }
    total
}

/// Combines partial shares symbolically.
fn combine_shares(arena: &mut Arena, reduce: Reduce, xs: Vec<ExprId>) -> Result<ExprId, String> {
    let r = match reduce {
        Reduce::Sum => arena.sum(&xs),
        Reduce::Avg => arena
            .sum(&xs)
            .and_then(|s| arena.scale(s, &Coeff::new(1, xs.len() as i64))),
        Reduce::Max => arena.app(Func::Max, xs),
        Reduce::Min => arena.app(Func::Min, xs),
    };
    r.map_err(|e| e.to_string())
}

/// A refuted goal and where.
struct Refutation {
    output: usize,
    layout: Layout,
    spec_index: usize,
    point: Point,
    layer: Layer,
}

/// Proves (or refutes) that the ranks of `case` compute its spec. A case that does not
/// type-check is inconclusive (the CLI reports it as invalid input first); an operator without a symbolic rule, a limit, or undecided goals
/// give [`Verdict::Inconclusive`]. With [`ProveConfig::reduce`] the proof runs on the
/// shape-reduced case, and a case the reduction refuses is inconclusive, naming why.
pub fn prove_case(case: &Case, cfg: &ProveConfig) -> Proof {
    // One clock for the whole proof: the reduced case, the full-size replay of a refutation
    // and every goal's decision share the one limit the user gave.
    let started = cfg.started.unwrap_or_else(Instant::now);
    // Symbolic execution reads shapes from the graphs' annotations: a graph they do not fit
    // could be "proved" (a library caller may skip the CLI's preflight), so it is stopped here.
    if let Some(e) = type_error(case) {
        return Proof::stopped(case, Verdict::Inconclusive, &e);
    }
    if cfg.reduce {
        if let Some(m) = crate::reduce::mesh::reduce_mesh(case) {
            return prove_mesh_reduced(case, cfg, started, m);
        }
    }
    prove_case_mesh_kept(case, cfg, started)
}

/// The first type error of the spec or of a rank graph (each distinct graph checked once),
/// as an invalid-program error: such a case gets no proof.
fn type_error(case: &Case) -> Option<ExecError> {
    let first = shardproof_interp::first_equal(&case.program.ranks);
    let graphs = std::iter::once(&case.spec).chain(
        case.program
            .ranks
            .iter()
            .enumerate()
            .filter(|&(r, _)| first[r] == r)
            .map(|(_, g)| &**g),
    );
    for graph in graphs {
        if let Err(errors) = shardproof_interp::typecheck(graph, &case.ops) {
            let first = errors.first().map(|e| e.to_string()).unwrap_or_default();
            return Some(ExecError {
                kind: ExecErrorKind::Invalid,
                op: None,
                message: format!("the programs do not type-check, so nothing is proved: {first}"),
            });
        }
    }
    None
}

/// [`prove_case`] through the mesh-dim reduction along dp (docs/prove.md section 2): a proof
/// of the two-replica case stands when the reduction's conditions hold; a refutation only
/// once confirmed on the case as written; anything else falls back to the case as written.
fn prove_mesh_reduced(
    case: &Case,
    cfg: &ProveConfig,
    started: Instant,
    m: Result<crate::reduce::mesh::MeshReduction, String>,
) -> Proof {
    let cfg = ProveConfig {
        started: Some(started),
        ..cfg.clone()
    };
    let timed_out = || cfg.time_limit.is_some_and(|t| started.elapsed() >= t);
    let kept = |why: String| {
        let mut p = prove_case_mesh_kept(case, &cfg, started);
        if p.verdict == Verdict::Inconclusive {
            // After the case's own reason, which callers read (a shape-reduction refusal
            // is retried at full size).
            p.message = Some(format!(
                "{} ({why})",
                p.message.as_deref().unwrap_or("undecided")
            ));
        }
        p.mesh_kept = Some(why);
        p
    };
    let m = match m {
        Ok(m) => m,
        Err(why) => {
            return kept(format!(
                "the mesh-dim reduction along dp does not apply: {why}"
            ))
        }
    };
    let summary = MeshSummary {
        dim: m.dim.clone(),
        original: m.original,
        reduced: m.reduced,
        rewritten: m.rewritten.clone(),
    };
    let mut proof = prove_case_mesh_kept(&m.case, &cfg, started);
    match (proof.verdict, &m.lifts) {
        (Verdict::Proved, Ok(())) => {
            proof.case = case.name.clone();
            proof.ranks = case.program.ranks.len();
            proof.counted_on = CountedOn::mesh_reduced(m.case.program.ranks.len());
            proof.mesh = Some(summary);
            proof
        }
        (Verdict::Refuted, _) => {
            // A refutation on two replicas is shown on the case as written, or not at all.
            let why = format!(
                "refuted at dp = {} ({})",
                m.reduced,
                proof.message.as_deref().unwrap_or("a counterexample")
            );
            if program_elements(case) <= cfg.max_elements && !timed_out() {
                let mut p = prove_case_mesh_kept(case, &cfg, started);
                if p.verdict == Verdict::Refuted {
                    p.mesh = Some(summary);
                    return p;
                }
                if let Err(w) = &m.lifts {
                    // The two-replica case is not the case's image (a literal left as it
                    // was, a sum not divided by the replicas): the case's own verdict stands.
                    p.mesh_kept = Some(format!("{why}, which does not carry over: {w}"));
                    return p;
                }
                // Under conditions (a)-(c) a refutation on two replicas is one on any even
                // number of them (replicas tiled in pairs): a disagreement is a bug here.
                p.verdict = Verdict::Inconclusive;
                p.counterexample = None;
                p.message = Some(format!(
                    "{why}, but not at the case's mesh ({}); the mesh-dim reduction changed the case's meaning",
                    p.message.as_deref().unwrap_or("proved")
                ));
                return p;
            }
            proof.verdict = Verdict::Inconclusive;
            proof.counterexample = None;
            proof.case = case.name.clone();
            proof.ranks = case.program.ranks.len();
            proof.counted_on = CountedOn::mesh_reduced(m.case.program.ranks.len());
            proof.message = Some(format!(
                "{why}; the case as written ({} tensor elements) is over the limit of {} or out of time, so no counterexample is confirmed on it",
                program_elements(case),
                cfg.max_elements
            ));
            proof.mesh = Some(summary);
            proof
        }
        (Verdict::Proved, Err(why)) => kept(format!(
            "the mesh-dim reduction along dp proved the case at dp = {}, which does not carry over: {why}",
            m.reduced
        )),
        (Verdict::Inconclusive, lifts) => {
            if timed_out() {
                proof.case = case.name.clone();
                proof.ranks = case.program.ranks.len();
                proof.counted_on = CountedOn::mesh_reduced(m.case.program.ranks.len());
                proof.mesh = Some(summary);
                return proof;
            }
            let why = format!(
                "through the mesh-dim reduction along dp ({} -> {}) it is undecided: {}{}",
                m.original,
                m.reduced,
                proof.message.as_deref().unwrap_or("undecided"),
                lifts
                    .as_ref()
                    .err()
                    .map(|w| format!("; and it would not carry over: {w}"))
                    .unwrap_or_default()
            );
            kept(why)
        }
    }
}

/// [`prove_case`] on the case's own mesh.
fn prove_case_mesh_kept(case: &Case, cfg: &ProveConfig, started: Instant) -> Proof {
    if !cfg.reduce {
        // A bug with a numeric effect shows in a run at once; the symbolic proof at full size
        // can take minutes.
        if let Some(p) = numeric_refutation(case, cfg) {
            return p;
        }
        return prove_sized(case, cfg, started);
    }
    let reduction = match crate::reduce::reduce_case(case) {
        Ok(r) => r,
        Err(refusal) => {
            let e = ExecError {
                kind: ExecErrorKind::Unsupported,
                op: refusal.op.clone(),
                message: format!("{REDUCTION_REFUSED}: {}", refusal.message),
            };
            return Proof::stopped(case, Verdict::Inconclusive, &e);
        }
    };
    tracing::debug!(sizes = reduction.sizes.len(), "shape-reduced");
    let summary = ReductionSummary::of(case, &reduction);
    let mut proof = prove_sized(&reduction.case, cfg, started);
    if proof.verdict == Verdict::Refuted && summary.elements_before <= cfg.max_elements {
        // A run of the case as written on random inputs usually shows a bug with a numeric
        // effect at once; the symbolic proof at full size is the fallback.
        if let Some(mut p) = numeric_refutation(case, cfg) {
            p.reduction = Some(summary);
            return p;
        }
        let pinned = proof_pinning_scaled_sizes(case, cfg, started, &reduction);
        if let Some(p) = pinned.as_ref().filter(|p| p.verdict == Verdict::Proved) {
            return p.clone();
        }
        // A refutation is shown on the case as written where it fits: the counterexample
        // then replays on the user's own graphs, and a disagreement would expose a reduction
        // that changed the program's meaning.
        let full = prove_sized(case, cfg, started);
        match full.verdict {
            Verdict::Refuted => {
                proof = full;
            }
            _ => {
                proof.verdict = Verdict::Inconclusive;
                proof.counterexample = None;
                proof.message = Some(format!(
                    "the shape-reduced case is refuted but the full-size case is not ({}){}; run with --no-reduce",
                    full.message.unwrap_or_else(|| "proved".into()),
                    pinned_note(pinned.as_ref())
                ));
            }
        }
        proof.reduction = Some(summary);
        return proof;
    }
    if proof.verdict == Verdict::Refuted && !reduction.mesh_literals.is_empty() {
        // Sizes a mesh-size or epsilon literal would have pinned were reduced: that keeps a proof sound
        // but may refute a program whose literal stands for a tensor size. The refutation
        // stands only on the strict reduction's sizes.
        return strict_refutation(case, cfg, started, proof, summary, &reduction);
    }
    proof.reduction = Some(ReductionSummary {
        counterexample_reduced: proof.counterexample.is_some(),
        ..summary
    });
    // A proof on reduced sizes may rest on a coincidence at those sizes.
    second_size::check(case, cfg, started, proof, &reduction)
}

/// A refutation on sizes that mesh-size literals did not pin, proved again on the sizes
/// [`crate::reduce::reduce_case_pinning_scaled_sizes`] keeps (a mesh-size literal scaling a
/// tensor with dims of exactly its size pins them: it may stand for that size, as a
/// microbatch's `div(g, b·S)` does). Its proof stands as the case's (sound as every
/// reduction is: pins only keep sizes whole, and every literal still keeps reduced sizes
/// from coinciding with it); any other verdict only informs the caller, which goes on to the
/// full-size or strict check (a refutation there is still on sizes other literals did not
/// pin). `None` where it does not apply: no mesh-size literal, nothing more pinned, the
/// reduction refused or over the element limit.
fn proof_pinning_scaled_sizes(
    case: &Case,
    cfg: &ProveConfig,
    started: Instant,
    relaxed: &crate::reduce::Reduction,
) -> Option<Proof> {
    if relaxed.mesh_literals.is_empty() {
        return None;
    }
    let pinned = crate::reduce::reduce_case_pinning_scaled_sizes(case).ok()?;
    let sizes =
        |r: &crate::reduce::Reduction| -> Vec<u64> { r.sizes.iter().map(|s| s.reduced).collect() };
    // Nothing more kept: the case already refuted.
    if sizes(&pinned) == sizes(relaxed) || program_elements(&pinned.case) > cfg.max_elements {
        return None;
    }
    let mut proof = prove_sized(&pinned.case, cfg, started);
    proof.reduction = Some(ReductionSummary::of(case, &pinned));
    Some(second_size::check(case, cfg, started, proof, &pinned))
}

/// What [`proof_pinning_scaled_sizes`] found, for an inconclusive verdict's message.
fn pinned_note(pinned: Option<&Proof>) -> String {
    let Some(p) = pinned else {
        return String::new();
    };
    let kept: Vec<String> = p
        .reduction
        .iter()
        .flat_map(|r| r.sizes.iter())
        .filter(|s| {
            s.why
                .as_deref()
                .is_some_and(|w| w.starts_with(SCALED_SIZE_PIN))
        })
        .map(|s| format!("{} ({})", s.origin, s.original))
        .collect();
    let outcome = match p.verdict {
        Verdict::Refuted => "refuted too".to_string(),
        _ => format!(
            "not refuted but undecided ({})",
            p.message.as_deref().unwrap_or("undecided")
        ),
    };
    format!(
        "; with the sizes a mesh-size literal scales kept whole ({}), it is {outcome}",
        kept.join(", ")
    )
}

/// [`prove_case`], and where shape reduction refuses the case (an operator off its list) or
/// the reduced case is undecided, once more at full size on the same clock unless the time limit has passed (the element
/// limit bounds the size); an inconclusive full-size proof keeps the refusal's reason in
/// front of its own. Returns the proof and whether it ran at full size.
pub fn prove_case_or_full_size(case: &Case, cfg: &ProveConfig) -> (Proof, bool) {
    let started = cfg.started.unwrap_or_else(Instant::now);
    let cfg = ProveConfig {
        started: Some(started),
        ..cfg.clone()
    };
    // A bug with a numeric effect shows in a run at once, where the symbolic proof of a
    // reduced full iteration can take minutes (the zoo's deepseek tp=2
    // `moe-router-grad-unsynced`: past 120 s reduced, 2.5 s by a run).
    if cfg.reduce {
        if let Some(p) = numeric_refutation(case, &cfg) {
            return (p, true);
        }
    }
    let mut proof = prove_case(case, &cfg);
    let timed_out = cfg.time_limit.is_some_and(|t| started.elapsed() >= t);
    // A reduced case can be harder for the decision layers than the case as written (the
    // zoo's deepseek tp=2 forward: one goal by the normal form at full size, 75,884 terms
    // apart on reduced sizes): an undecided reduced proof is tried at full size too.
    let reduced_undecided = proof.verdict == Verdict::Inconclusive
        && proof.reduction.is_some()
        && program_elements(case) <= cfg.max_elements;
    if !cfg.reduce || !(proof.reduction_refused() || reduced_undecided) || timed_out {
        return (proof, false);
    }
    let reason = proof.message.take().unwrap_or_default();
    proof = prove_case(
        case,
        &ProveConfig {
            reduce: false,
            ..cfg
        },
    );
    if proof.verdict == Verdict::Inconclusive {
        proof.message = Some(format!(
            "{reason}; at full size: {}",
            proof.message.as_deref().unwrap_or("undecided")
        ));
    }
    (proof, true)
}

/// A refutation on sizes that mesh-size or epsilon literals did not pin, checked again on the strict
/// reduction's sizes: its verdict stands; where it cannot be had, the case is inconclusive.
fn strict_refutation(
    case: &Case,
    cfg: &ProveConfig,
    started: Instant,
    relaxed: Proof,
    summary: ReductionSummary,
    relaxed_reduction: &crate::reduce::Reduction,
) -> Proof {
    let literals = &relaxed_reduction.mesh_literals;
    let why = |what: String| {
        let mut p = relaxed.clone();
        p.verdict = Verdict::Inconclusive;
        p.counterexample = None;
        p.message = Some(format!(
            "refuted on sizes that the literal products {literals:?} (mesh sizes, norm epsilons) did not pin, and {what}: the literal may stand for a tensor size; run with --no-reduce"
        ));
        p.reduction = Some(summary.clone());
        p
    };
    // A counterexample on the case as written needs no literal to mean anything.
    if let Some(mut p) = numeric_refutation(case, cfg) {
        p.reduction = Some(summary);
        return p;
    }
    let pinned = proof_pinning_scaled_sizes(case, cfg, started, relaxed_reduction);
    if let Some(p) = pinned.as_ref().filter(|p| p.verdict == Verdict::Proved) {
        return p.clone();
    }
    let why = |what: String| why(format!("{what}{}", pinned_note(pinned.as_ref())));
    let strict = match crate::reduce::reduce_case_strict(case) {
        Ok(r) => r,
        Err(refusal) => {
            return why(format!(
                "the strict reduction is refused ({})",
                refusal.message
            ))
        }
    };
    let elements = program_elements(&strict.case);
    if elements > cfg.max_elements {
        return why(format!(
            "the strict reduction holds {elements} tensor elements, over the limit of {}",
            cfg.max_elements
        ));
    }
    let mut proof = prove_sized(&strict.case, cfg, started);
    if proof.verdict == Verdict::Inconclusive {
        return why(format!(
            "the strict reduction is undecided ({})",
            proof.message.unwrap_or_default()
        ));
    }
    proof.reduction = Some(ReductionSummary {
        counterexample_reduced: proof.counterexample.is_some(),
        sizes: strict.sizes.clone(),
        kept_whole: strict.kept_whole.clone(),
        vocabulary: strict.vocabulary.clone(),
        inputs: strict
            .inputs
            .iter()
            .map(|(name, original, reduced)| ReducedInput {
                name: name.clone(),
                original: original.clone(),
                reduced: reduced.clone(),
            })
            .collect(),
        elements_after: elements,
        ..summary
    });
    second_size::check(case, cfg, started, proof, &strict)
}

/// Random inputs drawn per seed on which the interpreter shows a stated output of the case as
/// written clearly differing from the spec: a refutation with that counterexample (the same
/// test every counterexample passes), or `None` where no run shows one or the case is over
/// the element limit. Only outputs with a stated placement count: without one, a differing
/// candidate placement refutes nothing.
fn numeric_refutation(case: &Case, cfg: &ProveConfig) -> Option<Proof> {
    const SEEDS: u64 = 3;
    if !cfg.run_first || program_elements(case) > cfg.max_elements {
        return None;
    }
    let mut arena = Arena::new(cfg.budget);
    let leaves = inputs::make_leaves(&mut arena, case).ok()?;
    let exps = expectations(case).ok()?;
    for exp in exps.iter().filter(|e| e.explicit) {
        for layout in &exp.layouts {
            for k in 0..SEEDS {
                let seed = cfg.decide.seed.wrapping_add(k);
                let Ok(cx) = counterexample::confirm(
                    case,
                    &arena,
                    &leaves,
                    &exp.name,
                    exp.spec_value,
                    &exp.holders,
                    layout,
                    None,
                    &Point::default(),
                    seed,
                ) else {
                    continue;
                };
                let mut proof = Proof::stopped(
                    case,
                    Verdict::Refuted,
                    &ExecError {
                        kind: ExecErrorKind::Budget,
                        op: None,
                        message: format!(
                            "`{}`{:?} differs from the spec (a run of the case as written on random inputs found it; the interpreter confirms: spec {} vs rebuilt {})",
                            exp.name, cx.index, cx.spec_value, cx.rebuilt_value
                        ),
                    },
                );
                proof.layers = BTreeMap::from([(Layer::RandomWitness.name().to_string(), 1)]);
                proof.outputs.push(OutputResult {
                    name: exp.name.clone(),
                    placement: Some(layout.to_string()),
                    elements: cx.spec_output.numel(),
                    distinct_goals: 0,
                    layers: proof.layers.clone(),
                    status: "refuted".into(),
                    note: Some("a run on random inputs".into()),
                });
                proof.failure = Some(Failure {
                    output: exp.name.clone(),
                    index: cx.index.clone(),
                    spec: cx.spec_value.to_string(),
                    implementation: cx.rebuilt_value.to_string(),
                    layer: Layer::RandomWitness.name().into(),
                });
                proof.counterexample = Some(cx);
                return Some(proof);
            }
        }
    }
    None
}

/// Proves the case at the sizes it has, within `cfg.time_limit` of `started`.
fn prove_sized(case: &Case, cfg: &ProveConfig, started: Instant) -> Proof {
    let mut arena = Arena::new(cfg.budget);
    let proof = prove_in(case, cfg, started, &mut arena);
    // Freeing millions of hash-consed polynomials takes seconds on a big program (1.6 s of a
    // 3 s llama run); the verdict, a time limit's above all, does not wait for it.
    std::thread::spawn(move || drop(arena));
    proof
}

/// [`prove_sized`] with the expressions kept in `arena`.
fn prove_in(case: &Case, cfg: &ProveConfig, started: Instant, arena: &mut Arena) -> Proof {
    let elements = program_elements(case);
    if elements > cfg.max_elements {
        let e = ExecError {
            kind: ExecErrorKind::Budget,
            op: None,
            message: format!(
                "the spec and the ranks hold {elements} tensor elements, over the prover's limit of {} (after shape reduction, where it applies)",
                cfg.max_elements
            ),
        };
        return Proof::stopped(case, Verdict::Inconclusive, &e);
    }
    let deadline = cfg.time_limit.map(|t| started + t);
    let out_of_time = || deadline.is_some_and(|d| Instant::now() > d);
    if let Some(limit) = cfg.time_limit {
        arena.set_deadline(started, limit);
    }
    let decide_cfg = DecideConfig {
        deadline,
        ..cfg.decide.clone()
    };
    let limits = ExecLimits {
        deadline,
        progress: cfg.progress.clone(),
        ..cfg.limits.clone()
    };
    if let Some(p) = &cfg.progress {
        let nodes = case.spec.nodes.len()
            + case
                .program
                .ranks
                .iter()
                .map(|g| g.nodes.len())
                .sum::<usize>();
        p.start(nodes);
    }
    let mut run = || -> Result<(inputs::Leaves, SymEnv, Vec<SymEnv>), ExecError> {
        let leaves = inputs::make_leaves(arena, case)?;
        let spec = exec::run_graph(arena, &case.spec, &leaves.spec, &case.ops, &limits)?;
        let ranks = exec::run_program(arena, &case.program, &leaves.ranks, &case.ops, &limits)?;
        Ok((leaves, spec, ranks))
    };
    let (leaves, spec_env, rank_envs) = match run() {
        Ok(x) => x,
        // Programs that type-check but still fail here (an operator without a rule, a
        // limit, ranks that cannot communicate) get no verdict on values.
        Err(e) => return Proof::stopped(case, Verdict::Inconclusive, &e),
    };
    let expectations = match expectations(case) {
        Ok(e) => e,
        Err(e) => return Proof::stopped(case, Verdict::Inconclusive, &e),
    };
    let mut outputs = Vec::new();
    let mut totals: BTreeMap<String, usize> = BTreeMap::new();
    let mut decided: HashMap<(ExprId, ExprId), Outcome> = HashMap::new();
    let mut refutation: Option<Refutation> = None;
    let mut failure = None;
    let mut limit_hit: Option<String> = None;
    if let Some(p) = &cfg.progress {
        p.start(expectations.len());
    }
    'outputs: for (k, exp) in expectations.iter().enumerate() {
        if let Some(p) = &cfg.progress {
            if k > 0 {
                p.leave();
            }
            p.enter(&format!("goals of output `{}`", exp.name));
        }
        let Some(spec) = spec_env[exp.spec_value.node][exp.spec_value.output].clone() else {
            outputs.push(OutputResult {
                name: exp.name.clone(),
                placement: None,
                elements: 0,
                distinct_goals: 0,
                layers: BTreeMap::new(),
                status: "unknown".into(),
                note: Some("the spec tensor is not computed from the case's inputs".into()),
            });
            continue;
        };
        let mut best: Option<OutputResult> = None;
        let mut fitting = 0;
        for layout in &exp.layouts {
            let holders: Vec<usize> = exp.holders.iter().map(|&(r, _)| r).collect();
            let value_of = |r: usize| -> Option<&SymTensor> {
                let &(_, v) = exp.holders.iter().find(|(h, _)| *h == r)?;
                rank_envs[r][v.node][v.output].as_ref()
            };
            let rebuilt = rebuild(
                layout,
                &spec.shape,
                &case.program.mesh,
                &holders,
                &|r| value_of(r).map(|t| t.shape.clone()),
                &mut |r, i| value_of(r).expect("shape checked").elems[i],
                &mut |red, xs| combine_shares(arena, red, xs),
            );
            let rebuilt = match rebuilt {
                Ok(r) => r,
                Err(Misfit(why)) => {
                    if exp.explicit {
                        best = Some(OutputResult {
                            name: exp.name.clone(),
                            placement: Some(layout.to_string()),
                            elements: 0,
                            distinct_goals: 0,
                            layers: BTreeMap::new(),
                            status: "misfit".into(),
                            note: Some(why),
                        });
                    }
                    continue;
                }
            };
            // Every spec element must be rebuilt: a proof over some of them proves nothing of
            // the rest.
            let mut covered = vec![false; spec.numel()];
            for g in &rebuilt {
                covered[g.spec_index] = true;
            }
            let missing = covered.iter().filter(|c| !**c).count();
            if missing > 0 {
                if exp.explicit {
                    best = Some(OutputResult {
                        name: exp.name.clone(),
                        placement: Some(layout.to_string()),
                        elements: rebuilt.len(),
                        distinct_goals: 0,
                        layers: BTreeMap::new(),
                        status: "misfit".into(),
                        note: Some(format!(
                            "the ranks' pieces cover {} of the {} elements",
                            spec.numel() - missing,
                            spec.numel()
                        )),
                    });
                }
                continue;
            }
            fitting += 1;
            let mut layers: BTreeMap<String, usize> = BTreeMap::new();
            let mut local: HashMap<(ExprId, ExprId), ()> = HashMap::new();
            let mut status = "proved";
            let mut note = None;
            for g in &rebuilt {
                let key = (spec.elems[g.spec_index], g.value);
                if local.insert(key, ()).is_some() {
                    continue;
                }
                if decided.len() >= cfg.max_goals && !decided.contains_key(&key) {
                    limit_hit = Some(format!(
                        "more than {} distinct goals (the limit); the program is too large to prove element by element",
                        cfg.max_goals
                    ));
                    status = "unknown";
                    break;
                }
                if out_of_time() {
                    limit_hit = Some(time_ran_out(cfg));
                    status = "unknown";
                    break;
                }
                let outcome = decided
                    .entry(key)
                    .or_insert_with(|| decide(arena, key.0, key.1, &decide_cfg))
                    .clone();
                let layer = match &outcome {
                    Outcome::Proved(l) => *l,
                    Outcome::Refuted { layer, .. } => *layer,
                    Outcome::Unknown(_) => Layer::Unknown,
                };
                *layers.entry(layer.name().to_string()).or_default() += 1;
                match outcome {
                    Outcome::Proved(_) => {}
                    Outcome::Refuted { layer, point } => {
                        status = "refuted";
                        if refutation.is_none() {
                            failure = Some(Failure {
                                output: exp.name.clone(),
                                index: unflatten(g.spec_index, &spec.shape),
                                spec: arena.render(key.0, 400),
                                implementation: arena.render(key.1, 400),
                                layer: layer.name().into(),
                            });
                            refutation = Some(Refutation {
                                output: k,
                                layout: layout.clone(),
                                spec_index: g.spec_index,
                                point,
                                layer,
                            });
                        }
                        break;
                    }
                    Outcome::Unknown(why) => {
                        if status == "proved" {
                            status = "unknown";
                            note = Some(why);
                        }
                    }
                }
            }
            let result = OutputResult {
                name: exp.name.clone(),
                placement: Some(layout.to_string()),
                elements: rebuilt.len(),
                distinct_goals: local.len(),
                layers,
                status: status.into(),
                note,
            };
            let done = result.status == "proved" || exp.explicit || limit_hit.is_some();
            if best.is_none() || result.status == "proved" {
                best = Some(result);
            }
            if done {
                break;
            }
        }
        let mut result = best.unwrap_or_else(|| OutputResult {
            name: exp.name.clone(),
            placement: None,
            elements: 0,
            distinct_goals: 0,
            layers: BTreeMap::new(),
            status: "misfit".into(),
            note: Some("the ranks' outputs fit no simple placement".into()),
        });
        if !exp.explicit && result.status == "refuted" && fitting > 1 {
            // Without a stated placement, one refuted candidate says nothing of the others.
            result.status = "unknown".into();
            result.note = Some(
                "no simple placement of the ranks' outputs is proved; state the expected placement under `outputs:`".into(),
            );
            if refutation.as_ref().is_some_and(|r| r.output == k) {
                refutation = None;
                failure = None;
            }
        }
        for (l, n) in &result.layers {
            *totals.entry(l.clone()).or_default() += n;
        }
        outputs.push(result);
        if limit_hit.is_some() {
            break 'outputs;
        }
    }
    let stats = Stats {
        symbols: arena.symbols().len(),
        expressions: arena.len(),
        atoms: arena.atom_count(),
        terms: arena.stored_terms(),
        goals: decided.len(),
    };
    let mut proof = Proof {
        case: case.name.clone(),
        ranks: case.program.ranks.len(),
        verdict: Verdict::Inconclusive,
        outputs,
        layers: totals,
        failure,
        counterexample: None,
        unsupported_op: None,
        message: None,
        stats,
        reduction: None,
        assumptions: Vec::new(),
        mesh: None,
        mesh_kept: None,
        counted_on: CountedOn::as_written(case.program.ranks.len()),
    };
    if let Some(r) = refutation {
        let exp = &expectations[r.output];
        match counterexample::confirm(
            case,
            arena,
            &leaves,
            &exp.name,
            exp.spec_value,
            &exp.holders,
            &r.layout,
            Some(r.spec_index),
            &r.point,
            cfg.decide.seed,
        ) {
            Ok(cx) => {
                proof.verdict = Verdict::Refuted;
                proof.message = Some(format!(
                    "`{}`{:?} differs from the spec ({} found it; the interpreter confirms: spec {} vs rebuilt {})",
                    exp.name,
                    unflatten(r.spec_index, &spec_env[exp.spec_value.node][exp.spec_value.output].as_ref().map_or(vec![], |t| t.shape.clone())),
                    r.layer.name(),
                    cx.spec_value,
                    cx.rebuilt_value
                ));
                proof.counterexample = Some(cx);
            }
            Err(why) => {
                proof.message = Some(format!(
                    "a goal of `{}` differs symbolically, but the interpreter did not confirm the witness: {why}",
                    exp.name
                ));
            }
        }
        return proof;
    }
    if limit_hit.is_none() && out_of_time() && proof.outputs.iter().any(|o| o.status != "proved") {
        // The last goals' Z3 runs were cut short by the limit rather than undecidable.
        limit_hit = Some(time_ran_out(cfg));
    }
    if let Some(why) = limit_hit {
        proof.message = Some(why);
        return proof;
    }
    if proof.outputs.is_empty() {
        proof.message = Some("there is nothing to compare: the spec returns no tensor and the case sets no `outputs:`".into());
        return proof;
    }
    match proof.outputs.iter().find(|o| o.status != "proved") {
        None => proof.verdict = Verdict::Proved,
        Some(o) => {
            proof.message = Some(format!(
                "`{}` is not proved: {}",
                o.name,
                o.note.clone().unwrap_or_else(|| o.status.clone())
            ))
        }
    }
    proof
}

/// Why a proof stopped at its time limit.
fn time_ran_out(cfg: &ProveConfig) -> String {
    format!(
        "the time limit of {} s ran out",
        cfg.time_limit.unwrap_or_default().as_secs_f64()
    )
}

/// The multi-index of a flat index.
pub fn unflatten(flat: usize, shape: &[usize]) -> Vec<usize> {
    let st = crate::tensor::strides(shape);
    (0..shape.len())
        .map(|d| (flat / st[d]) % shape[d])
        .collect()
}
