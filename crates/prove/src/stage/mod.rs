//! Staged proofs (TrainVerify's Algorithm 2): the spec and the ranks are cut at tensors whose
//! relation is known, every stage is proved on its own assuming the relations of its inputs,
//! and the stages chain into the case's verdict.
//!
//! A stage's *targets* are one cut (a case `inputs:` entry naming a non-input spec tensor) or
//! the expected outputs together (their slices overlap: a full iteration's gradients share its
//! whole backward). Its graphs are the backward slices of the target in the spec and in
//! every rank, stopping at tensors the case relates (its inputs and cuts), closed under the
//! whole program's pairing of collectives and messages (see [`slice`]). The cut tensors it
//! reads become inputs laid out by their relation, its target an output expected in the
//! cut's layout, and the stage is proved by [`prove_case`] like any case (shape reduction
//! included).
//!
//! # Why a chain of stage proofs proves the case
//!
//! The stages are ordered: cuts in spec order, then the outputs. The plan is refused unless
//! every cut a stage assumes is the target of an *earlier* stage, so the assumptions form no
//! cycle. Take any inputs satisfying the case's input relations and run the whole programs. By
//! induction along the order, every cut's spec value and rank values satisfy its relation: the
//! stage computing it is the exact backward slice of the whole programs (same operators, same
//! arguments, collectives paired with the same members, which [`slice::same_pairing`] checks
//! against the interpreter's schedule of the whole run), its own inputs satisfy their
//! relations (case inputs by hypothesis, earlier cuts by induction), and its proof covers all
//! such inputs. The same argument at the output stages gives the case's outputs. So the case is
//! [`Verdict::Proved`] only when every stage is proved.
//!
//! A refuted stage carries the counterexample its own proof confirmed on the stage's programs:
//! inputs satisfying every relation the stage assumes, on which the target's relation fails.
//! The case's cuts are claims of the case (its format makes them assumptions), so this shows
//! that a stated relation does not follow from the relations stated before it:
//! [`Verdict::Refuted`], naming the stage. Anything else is inconclusive.
//!
//! # Memo
//!
//! A stage's key is its structure up to renaming: the operators and their arguments, the
//! shapes (after shape reduction, where it applies), the relations of its inputs and target,
//! the mesh and groups. Stages with one key state the same theorem about renamed tensors, so
//! the first is proved and the others reuse its result: the identical layers of a deep model
//! are proved once.
//!
//! # Memo up to renumbering the holding ranks
//!
//! A stage's theorem reads the ranks that hold nothing of it not at all (their graphs are
//! empty, no relation names them), and the ranks that hold it only through their graphs, the
//! member sets of the groups their calls name, the relations' holders and the pieces their
//! layouts give each holder, which depend on the holder's mesh coordinates on the dims a layout
//! shards or splits into partial shares. So the key ([`renumber`]) relabels the coordinates of
//! the dims every relation places `Replicate()` (the active ranks' coordinates first), numbers
//! the holders by their relabelled coordinates, and writes each holder's graph and coordinates,
//! each named group's member sets in holder positions, and the relations in positions. Two
//! stages with one key are related by the rank permutation that relabels one's dims and undoes
//! the other's: it maps holders to holders position by position, keeps every coordinate a
//! layout reads, maps group sets and relations onto the other's. The theorem of one, ranks
//! renamed by it, is the other's, so a proof (or a counterexample) of one is one of the other.
//! Stages that name ranks otherwise (a point-to-point call to a global rank, an `expr:` layout)
//! are keyed with absolute rank numbers.
//!
//! # Memo up to node order
//!
//! A rank's values depend on its graph's dataflow and its schedule's pairing, not on the order
//! its nodes are written in: where the stage's own schedule completes and every collective
//! meeting joins one canonical node of each member, the renumbered key writes the graphs in a
//! canonical order, the peers of sends and recvs blank, and the messages (each recv's send)
//! instead ([`canon`]). A 1F1B pipeline interleaves each pipeline stage's microbatches
//! otherwise and names other `pp` peers on each: those stages are one proof.

mod canon;
pub mod chunks;
pub mod micro;
mod renumber;
pub mod scale;
pub mod shard;
mod slice;

use crate::equiv::{prove_case, Proof, ProveConfig, Verdict};
use serde::{Deserialize, Serialize};
use shardproof_case::{Case, InputRelation, Layout, OutputExpectation};
use shardproof_ir::{Arg, Graph, NodeKind, Program, ValueId};
use slice::{Mark, Marks, PairingIndex, RankMarks, Sliced};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Instant;

/// One stage of a plan.
#[derive(Clone, Debug)]
pub struct Stage {
    /// What it establishes, in words: ``cut `h1` ``, ``output `loss` `` or ``outputs `a`, `b` ``.
    pub target: String,
    /// The relations it assumes (case inputs and cuts), by spec name.
    pub assumes: Vec<String>,
    /// The stage as a case of its own; a memo hit's is its representative's, shared (unless
    /// [`PlanOptions::keep_memo_hit_cases`]).
    pub case: Arc<Case>,
    /// Its structure up to renaming (the memo key); stages with one key share one copy of it
    /// (a key on thousands of ranks is hundreds of kilobytes, and a deep model's stages repeat
    /// a few keys).
    pub key: Arc<str>,
    /// A short stable digest of the key (16 hex digits).
    pub digest: String,
    /// The first stage with the same key, whose proof this one reuses (itself when first).
    pub rep: usize,
    /// Nodes of its spec graph.
    pub spec_nodes: usize,
    /// Nodes of its rank graphs together.
    pub rank_nodes: usize,
}

/// The stages of a case, in proof order.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Every stage.
    pub stages: Vec<Stage>,
    /// The stages proved (the first of every key), in order.
    pub distinct: Vec<usize>,
    /// A digest of the whole plan: shards of one plan carry it, and a merge checks it.
    pub digest: String,
}

/// What a stage (or the stage whose proof it reuses) was found to be.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct StageOutcome {
    /// The stage proof's verdict.
    pub verdict: Verdict,
    /// Distinct goals per deciding layer.
    pub layers: BTreeMap<String, usize>,
    /// Why it is not proved.
    pub message: Option<String>,
    /// The stage's whole proof report, as JSON text (kept as text so that a merge reproduces
    /// it byte for byte).
    pub proof: String,
}

impl StageOutcome {
    fn of(proof: &Proof) -> StageOutcome {
        StageOutcome {
            verdict: proof.verdict,
            layers: proof.layers.clone(),
            message: proof.message.clone(),
            proof: serde_json::to_string(proof).unwrap_or_default(),
        }
    }
}

/// One stage in the report.
#[derive(Clone, Debug, Serialize)]
pub struct StageReport {
    /// Its position in the plan.
    pub index: usize,
    /// What it establishes.
    pub target: String,
    /// The relations it assumes.
    pub assumes: Vec<String>,
    /// Nodes of its spec graph.
    pub spec_nodes: usize,
    /// Nodes of its rank graphs.
    pub rank_nodes: usize,
    /// Its memo key's digest.
    pub key: String,
    /// Whether it reuses an earlier stage's proof.
    pub memo_hit: bool,
    /// The stage whose proof decides it.
    pub proved_by: usize,
    /// Its verdict (`None`: no result, e.g. a shard's file is missing).
    pub verdict: Option<Verdict>,
    /// Distinct goals per deciding layer of the proof that decides it.
    pub layers: BTreeMap<String, usize>,
    /// Why it is not proved.
    pub message: Option<String>,
}

/// A distinct stage's proof in the report.
#[derive(Clone, Debug, Serialize)]
pub struct StageProof {
    /// The stage proved.
    pub stage: usize,
    /// Its proof report.
    pub proof: serde_json::Value,
}

/// The result of a staged proof.
#[derive(Clone, Debug, Serialize)]
pub struct StagedProof {
    /// The case's name.
    pub case: String,
    /// Ranks of the program.
    pub ranks: usize,
    /// The verdict.
    pub verdict: Verdict,
    /// Why the verdict is not `proved`, in words.
    pub message: Option<String>,
    /// Every stage, in proof order.
    pub stages: Vec<StageReport>,
    /// Stages proved (one per memo key).
    pub distinct_stages: usize,
    /// Stages decided by another stage's proof.
    pub memo_hits: usize,
    /// Distinct goals per deciding layer, over the distinct stages.
    pub layers: BTreeMap<String, usize>,
    /// The distinct stages' proofs.
    pub proofs: Vec<StageProof>,
    /// The refuted stage's proof, when this process ran it (for writing its counterexample).
    #[serde(skip)]
    pub refuted: Option<Box<Proof>>,
    /// The approximation overrides of `assume:` the proof holds under (recorded by the
    /// caller, who applied them); empty: none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub assumptions: Vec<crate::assume::AppliedOverride>,
}

/// FNV-1a, 64 bits: a digest that is the same in every process and on every machine.
pub(crate) fn digest(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// What a stage is built to establish.
#[derive(Clone, Copy, Debug)]
enum Target {
    /// A cut: `case.inputs[i]`.
    Cut(usize),
    /// An explicit expectation: `case.outputs[i]`.
    Output(usize),
    /// A spec output without a stated placement, by its index among the graph's outputs.
    Implicit(usize),
}

/// Cuts `case` into stages and keys them. With `reduce`, keys compare the shape-reduced
/// stages. Refused (with the reason) where a cut cannot start a stage, the stages would
/// assume one another in a cycle, or the ranks' communication cannot be scheduled.
pub fn plan(case: &Case, reduce: bool) -> Result<Plan, String> {
    plan_with(case, reduce, &PlanOptions::default())
}

/// How a plan is cut beyond the case's own cuts.
#[derive(Clone, Debug, Default)]
pub struct PlanOptions {
    /// Relations stating `rank tensor = c · piece` ([`scale`]): a data-parallel rank's
    /// activation gradients at backward cuts.
    pub scales: scale::CutScales,
    /// One stage per expected output instead of one for them all: each assumes only cuts, so
    /// the chain is the same, and outputs of the same structure (a layer's weight updates, layer
    /// after layer) become memo hits, where together they are one stage as large as the model.
    pub outputs_apart: bool,
    /// Cuts whose rank values are a pipeline rank's microbatches of its piece ([`micro`]): a
    /// layer output on a pipeline plan, computed once per microbatch on one stage's ranks.
    pub microbatch_cuts: Vec<micro::MicrobatchCut>,
    /// Relations whose layout holds of their spec value's load-balanced sequence chunks
    /// ([`chunks`]): a context-parallel rank's residual stream and its gradient.
    pub chunked: chunks::ChunkedCuts,
    /// When planning must stop: a plan of thousands of stages on thousands of ranks takes
    /// minutes, and a time limit must end it cleanly ([`PlanError::OutOfTime`]). `None`: no
    /// limit ([`prove_staged_with`] takes the proof's own limit where this is `None`).
    pub deadline: Option<Instant>,
    /// Every stage keeps the case it was built as. Otherwise a memo hit's [`Stage::case`] is
    /// its representative's (the one proved; the hit's own differs only by the renaming its
    /// key quotients by), which on thousands of ranks saves megabytes a stage: for tests that
    /// pin every stage's own graphs and relations.
    pub keep_memo_hit_cases: bool,
}

/// Why a plan was not made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlanError {
    /// The case cannot be cut into stages (a cut that cannot start a stage, a cycle, ranks
    /// whose communication cannot be scheduled): the reason.
    Refused(String),
    /// [`PlanOptions::deadline`] passed before the plan was complete: where it stopped.
    OutOfTime(String),
}

impl std::fmt::Display for PlanError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PlanError::Refused(why) | PlanError::OutOfTime(why) => f.write_str(why),
        }
    }
}

impl From<String> for PlanError {
    fn from(why: String) -> Self {
        PlanError::Refused(why)
    }
}

/// Whether `deadline` has passed.
fn passed(deadline: Option<Instant>) -> bool {
    deadline.is_some_and(|d| Instant::now() >= d)
}

/// [`plan`] with [`PlanOptions`].
pub fn plan_with(case: &Case, reduce: bool, opts: &PlanOptions) -> Result<Plan, String> {
    plan_until(case, reduce, opts).map_err(|e| e.to_string())
}

/// [`plan_with`], telling a refusal from [`PlanOptions::deadline`] passing: the deadline is
/// checked before the whole run's schedule, before every stage is built and before it is
/// keyed (shape reduction of the stage), so a plan stops within one stage's work of it.
pub fn plan_until(case: &Case, reduce: bool, opts: &PlanOptions) -> Result<Plan, PlanError> {
    let out_of_time = |done: usize, of: usize| {
        PlanError::OutOfTime(format!(
            "the time limit ran out while cutting the case into stages ({done} of {of} stages built)"
        ))
    };
    let added = case.inputs.len();
    let extended = micro::add_relations(case, &opts.microbatch_cuts)?;
    let case = &extended;
    let scales = &opts.scales;
    let given = scales
        .keys()
        .map(|n| ("a scale", n))
        .chain(opts.chunked.keys().map(|n| ("a chunk order", n)));
    for (what, name) in given {
        let known = case.inputs.iter().any(|r| &r.spec_name == name)
            || case.outputs.iter().any(|o| &o.spec_name == name);
        if !known {
            return Err(PlanError::Refused(format!(
                "{what} is given for `{name}`, which the case does not relate"
            )));
        }
    }
    // A chunk order restates a relation: on a cut the chain proves the restated one, but a
    // case input's or output's would replace what the case states of it.
    for name in opts.chunked.keys() {
        if !case.inputs.iter().any(|r| &r.spec_name == name && r.cut) {
            return Err(PlanError::Refused(format!(
                "a chunk order is given for `{name}`, which is not a cut: it would change what the case states of it"
            )));
        }
    }
    let nranks = case.program.ranks.len();
    let spec_stops: HashSet<ValueId> = case.inputs.iter().map(|r| r.spec_value).collect();
    let mut rank_stops: Vec<HashSet<ValueId>> = vec![HashSet::new(); nranks];
    for rel in &case.inputs {
        for &(r, v) in &rel.rank_values {
            rank_stops[r].insert(v);
        }
    }
    // The whole run, from the case's true inputs only: the pairing every stage must keep.
    // The cuts' values bucketed by rank in one pass: a scan of every cut's holders per rank
    // was quadratic in the ranks (253 cuts of 8192 values each, for each of 8192 ranks).
    let mut cut_values: Vec<Vec<ValueId>> = vec![Vec::new(); nranks];
    for rel in case.inputs.iter().filter(|rel| rel.cut) {
        for &(h, v) in &rel.rank_values {
            if let Some(values) = cut_values.get_mut(h) {
                values.push(v);
            }
        }
    }
    let names: Vec<BTreeSet<String>> = (0..nranks)
        .map(|r| {
            let g = &case.program.ranks[r];
            let mut leaves = case.rank_leaves(r);
            for &v in &cut_values[r] {
                leaves.remove(g.value_name(v));
            }
            leaves
        })
        .collect();
    if passed(opts.deadline) {
        return Err(out_of_time(0, 0));
    }
    let full = shardproof_interp::schedule(&case.program, &case.ops, Some(&names));
    if let Some(p) = &full.problem {
        return Err(PlanError::Refused(format!(
            "the ranks' communication cannot be scheduled: {}",
            p.message()
        )));
    }
    let mut cuts: Vec<usize> = (0..case.inputs.len())
        .filter(|&i| case.inputs[i].cut)
        .collect();
    cuts.sort_by_key(|&i| {
        (
            case.inputs[i].spec_value.node,
            case.inputs[i].spec_value.output,
        )
    });
    let mut targets: Vec<Vec<Target>> = cuts.iter().map(|&i| vec![Target::Cut(i)]).collect();
    // The outputs are one stage: their slices overlap (a full iteration's gradients share
    // its forward and backward), and one proof shares their expressions as the whole-case
    // proof does.
    let mut finals = Vec::new();
    if case.outputs.is_empty() {
        let mut seen = Vec::new();
        for (i, o) in case.spec.outputs.iter().enumerate() {
            if let Some(v) = o {
                if !seen.contains(v) {
                    seen.push(*v);
                    finals.push(Target::Implicit(i));
                }
            }
        }
    } else {
        let mut outs: Vec<usize> = (0..case.outputs.len()).collect();
        outs.sort_by_key(|&i| case.outputs[i].spec_value);
        finals.extend(outs.into_iter().map(Target::Output));
    }
    if opts.outputs_apart {
        targets.extend(finals.into_iter().map(|f| vec![f]));
    } else if !finals.is_empty() {
        targets.push(finals);
    }
    // Shapes of the whole graphs, inferred once: every stage's cut tensors are typed by them.
    let spec_metas = shardproof_interp::infer_graph(&case.spec, &case.ops).metas;
    let mut by_graph: BTreeMap<usize, Arc<Metas>> = BTreeMap::new();
    let rank_metas: Vec<Arc<Metas>> = case
        .program
        .ranks
        .iter()
        .map(|g| {
            by_graph
                .entry(Arc::as_ptr(g) as usize)
                .or_insert_with(|| Arc::new(shardproof_interp::infer_graph(g, &case.ops).metas))
                .clone()
        })
        .collect();
    micro::check_shapes(case, added, &spec_metas, &rank_metas)?;
    // A stage's own relations are resolved; the case file's entries (thousands on a full
    // iteration's plan) are the whole case's, and a copy per stage held gigabytes.
    let source = shardproof_case::CaseFile {
        inputs: Vec::new(),
        outputs: Vec::new(),
        ..case.source.clone()
    };
    // The whole run's pairing by call, once: every stage closes under it and checks its own
    // against it.
    let pairing = PairingIndex::new(&full, nranks);
    let related = Related::new(case, nranks);
    let whole = Whole {
        source: &source,
        spec_stops: &spec_stops,
        rank_stops: &rank_stops,
        pairing: &pairing,
        related: &related,
        spec_metas: &spec_metas,
        rank_metas: &rank_metas,
    };
    let stage_of_cut: BTreeMap<usize, usize> =
        cuts.iter().enumerate().map(|(k, &i)| (i, k)).collect();
    let mut stages: Vec<Stage> = Vec::new();
    let mut first: HashMap<Arc<str>, usize> = HashMap::new();
    let mut reduced_keys: HashMap<String, Arc<str>> = HashMap::new();
    let mut distinct = Vec::new();
    for (k, t) in targets.iter().enumerate() {
        if passed(opts.deadline) {
            return Err(out_of_time(k, targets.len()));
        }
        let (mut stage, assumed) = build_stage(case, t, &whole)?;
        // A cut's scale and chunk order restate the cut's relation only.
        let cut_target = matches!(t.as_slice(), [Target::Cut(_)]);
        // Not shared yet: `make_mut` clones nothing.
        scale::encode(Arc::make_mut(&mut stage.case), scales, cut_target)
            .map_err(|e| format!("{}: {e}", stage.target))?;
        chunks::encode(Arc::make_mut(&mut stage.case), &opts.chunked, cut_target)
            .map_err(|e| format!("{}: {e}", stage.target))?;
        for rel in &assumed {
            if let Some(&s) = stage_of_cut.get(rel) {
                if s >= k {
                    return Err(PlanError::Refused(format!(
                        "{} assumes cut `{}`, which is established later: the cuts depend on each other in a cycle",
                        stage.target, case.inputs[*rel].spec_name
                    )));
                }
            }
        }
        if passed(opts.deadline) {
            return Err(out_of_time(k, targets.len()));
        }
        // Stages of one structure as written (a deep model's layers) reduce alike: shape
        // reduction, the costliest step of keying, runs once per such structure. Equal
        // structures are the same theorem up to renaming whatever their reduction.
        let key: Arc<str> = if reduce {
            let written = structure(&stage.case);
            match reduced_keys.get(&written) {
                Some(key) => key.clone(),
                None => {
                    let key: Arc<str> = stage_key(&stage.case, true).into();
                    reduced_keys.insert(written, key.clone());
                    key
                }
            }
        } else {
            stage_key(&stage.case, false).into()
        };
        let key = match first.get_key_value(&key) {
            Some((shared, _)) => shared.clone(),
            None => key,
        };
        stage.digest = digest(&key);
        stage.rep = *first.entry(key.clone()).or_insert(k);
        stage.key = key;
        if stage.rep == k {
            distinct.push(k);
        } else if !opts.keep_memo_hit_cases {
            // A memo hit is never proved on its own case (the representative's proof is its
            // proof): it keeps the representative's, and its own graphs are freed.
            stage.case = stages[stage.rep].case.clone();
        }
        stages.push(stage);
    }
    let mut all = String::new();
    for s in &stages {
        let _ = writeln!(all, "{} {} {}", s.digest, s.rep, s.target);
    }
    Ok(Plan {
        digest: digest(&all),
        stages,
        distinct,
    })
}

/// Shapes of every value of a graph.
type Metas = Vec<Vec<Option<shardproof_ops::Meta>>>;

/// The case's relations by the nodes that hold them, indexed once per plan: on the spec, and
/// on each rank (sorted by node), each with the relations (indices, ascending) whose value is
/// an output of the node.
struct Related {
    at_spec: HashMap<usize, Vec<usize>>,
    at_rank: Vec<Vec<(usize, usize)>>,
}

impl Related {
    fn new(case: &Case, nranks: usize) -> Related {
        let mut at_spec: HashMap<usize, Vec<usize>> = HashMap::new();
        let mut at_rank: Vec<Vec<(usize, usize)>> = vec![Vec::new(); nranks];
        for (i, rel) in case.inputs.iter().enumerate() {
            at_spec.entry(rel.spec_value.node).or_default().push(i);
            for &(r, v) in &rel.rank_values {
                if let Some(at) = at_rank.get_mut(r) {
                    at.push((v.node, i));
                }
            }
        }
        for at in &mut at_rank {
            at.sort_unstable();
            at.dedup();
        }
        Related { at_spec, at_rank }
    }

    /// The relations with a value at node `n` of rank `r`, as (node, relation).
    fn on(&self, r: usize, n: usize) -> &[(usize, usize)] {
        let Some(at) = self.at_rank.get(r) else {
            return &[];
        };
        let from = at.partition_point(|&(x, _)| x < n);
        let to = from + at[from..].partition_point(|&(x, _)| x == n);
        &at[from..to]
    }
}

/// What every stage of a case is cut from.
struct Whole<'a> {
    /// The case file as every stage carries it (without the whole case's entries).
    source: &'a shardproof_case::CaseFile,
    spec_stops: &'a HashSet<ValueId>,
    rank_stops: &'a [HashSet<ValueId>],
    pairing: &'a PairingIndex<'a>,
    related: &'a Related,
    spec_metas: &'a Metas,
    rank_metas: &'a [Arc<Metas>],
}

/// One stage's graphs and relations, and the case relations it assumes (indices).
fn build_stage(
    case: &Case,
    targets: &[Target],
    whole: &Whole,
) -> Result<(Stage, Vec<usize>), String> {
    let (spec_stops, rank_stops) = (whole.spec_stops, whole.rank_stops);
    let nranks = case.program.ranks.len();
    let mut names = Vec::new();
    let mut ends: Vec<(ValueId, Vec<(usize, ValueId)>)> = Vec::new();
    for &target in targets {
        let (name, spec_target, holders) = match target {
            Target::Cut(i) => {
                let rel = &case.inputs[i];
                if let Layout::Expr(_) = rel.layout {
                    return Err(format!(
                        "cut `{}` is laid out by an `expr:`; stages begin at placed cuts only",
                        rel.spec_name
                    ));
                }
                (
                    rel.spec_name.clone(),
                    rel.spec_value,
                    rel.rank_values.clone(),
                )
            }
            Target::Output(i) => {
                let o = &case.outputs[i];
                (o.spec_name.clone(), o.spec_value, o.rank_values.clone())
            }
            Target::Implicit(i) => {
                let v = case.spec.outputs[i].expect("a spec output");
                let holders = case
                    .program
                    .ranks
                    .iter()
                    .enumerate()
                    .filter_map(|(r, g)| g.outputs.get(i).copied().flatten().map(|rv| (r, rv)))
                    .collect();
                (case.spec.value_name(v).to_string(), v, holders)
            }
        };
        names.push(format!("`{name}`"));
        ends.push((spec_target, holders));
    }
    let label = match targets {
        [Target::Cut(_)] => format!("cut {}", names[0]),
        [_] => format!("output {}", names[0]),
        _ if names.len() <= 4 => format!("outputs {}", names.join(", ")),
        _ => format!(
            "outputs {} and {} more",
            names[..3].join(", "),
            names.len() - 3
        ),
    };
    let mut spec_marks = Marks::new(&case.spec);
    let starts: Vec<usize> = ends.iter().map(|(v, _)| v.node).collect();
    spec_marks.close(&case.spec, &starts, spec_stops)?;
    let ranks_in = &case.program.ranks;
    let mut marks: RankMarks = (0..nranks).map(|_| None).collect();
    let mut work = Vec::new();
    for (_, holders) in &ends {
        for &(r, v) in holders {
            let mut computed = Vec::new();
            slice::marks_of(&mut marks, ranks_in, r).close_noting(
                &ranks_in[r],
                &[v.node],
                &rank_stops[r],
                &mut computed,
            )?;
            work.extend(computed.into_iter().map(|n| (r, n)));
        }
    }
    slice::close_under_pairing(ranks_in, &mut marks, rank_stops, whole.pairing, work)?;
    // A relation is assumed where some side reads it as an input; every side of it is then
    // laid out, so that its pieces are the relation's whole. The relations read are found
    // from the boundary nodes of the ranks holding part of the stage (`Related`), not by
    // scanning every relation's every holder: a full iteration's thousand relations of up to
    // 8192 values each, for each of its 1,643 stages.
    let related = whole.related;
    let mut read = vec![false; case.inputs.len()];
    for (i, rel) in case.inputs.iter().enumerate() {
        read[i] = spec_marks.marks[rel.spec_value.node] == Mark::Boundary;
    }
    for (r, m) in marks.iter().enumerate() {
        if let Some(m) = m {
            for &(n, i) in &related.at_rank[r] {
                if m.marks[n] == Mark::Boundary {
                    read[i] = true;
                }
            }
        }
    }
    let mut assumed = Vec::new();
    for i in 0..case.inputs.len() {
        if !read[i] {
            continue;
        }
        let rel = &case.inputs[i];
        assumed.push(i);
        // A side laid out here becomes a boundary, which the relations after this one that
        // name the same node then read too (they are examined after it).
        let spec_node = rel.spec_value.node;
        if spec_marks.marks[spec_node] == Mark::Out {
            spec_marks.marks[spec_node] = Mark::Boundary;
            for &j in related.at_spec.get(&spec_node).into_iter().flatten() {
                if j > i {
                    read[j] = true;
                }
            }
        }
        for &(r, v) in &rel.rank_values {
            let m = slice::marks_of(&mut marks, ranks_in, r);
            if m.marks[v.node] == Mark::Out {
                m.marks[v.node] = Mark::Boundary;
                for &(_, j) in related.on(r, v.node) {
                    if j > i {
                        read[j] = true;
                    }
                }
            }
        }
    }
    let spec = slice::build(&case.spec, &spec_marks, whole.spec_metas)?;
    // Ranks that run one graph and slice it alike share the stage graph, as they share the
    // whole one: found by graph, then by marks compared in place (a key holding a copy of
    // every rank's marks cost a copy of its whole graph's marks per rank and stage).
    // A rank without marks holds nothing of the stage: its slice is its graph's empty one (a
    // rank with marks has some node marked, so the two never share a slice).
    let mut built: Vec<Arc<Sliced>> = Vec::with_capacity(nranks);
    let mut shared: HashMap<usize, Vec<(usize, Arc<Sliced>)>> = HashMap::new();
    let mut empty: HashMap<usize, Arc<Sliced>> = HashMap::new();
    for (r, g) in case.program.ranks.iter().enumerate() {
        let ptr = Arc::as_ptr(g) as usize;
        let Some(own) = &marks[r] else {
            let s = match empty.get(&ptr) {
                Some(s) => s.clone(),
                None => {
                    let s = Arc::new(slice::build(g, &Marks::new(g), &whole.rank_metas[r])?);
                    empty.insert(ptr, s.clone());
                    s
                }
            };
            built.push(s);
            continue;
        };
        let slices = shared.entry(ptr).or_default();
        let found = slices
            .iter()
            .find(|(first, _)| marks[*first].as_ref().is_some_and(|m| m.marks == own.marks));
        let s = match found {
            Some((_, s)) => s.clone(),
            None => {
                let s = Arc::new(slice::build(g, own, &whole.rank_metas[r])?);
                slices.push((r, s.clone()));
                s
            }
        };
        built.push(s);
    }
    let map_ranks = |values: &[(usize, ValueId)]| -> Vec<(usize, ValueId)> {
        values
            .iter()
            .filter_map(|&(r, v)| built[r].value(v).map(|nv| (r, nv)))
            .collect()
    };
    let map_impl = |values: &[ValueId]| -> Vec<ValueId> {
        let mapped: Vec<Option<ValueId>> = values
            .iter()
            .enumerate()
            .map(|(r, &v)| built[r].value(v))
            .collect();
        mapped
            .into_iter()
            .collect::<Option<Vec<_>>>()
            .unwrap_or_default()
    };
    let mut inputs: Vec<InputRelation> = assumed
        .iter()
        .map(|&i| {
            let rel = &case.inputs[i];
            InputRelation {
                spec_value: spec.value(rel.spec_value).expect("marked above"),
                impl_values: map_impl(&rel.impl_values),
                rank_values: map_ranks(&rel.rank_values),
                cut: false,
                ..rel.clone()
            }
        })
        .collect();
    inputs.sort_by_key(|r| r.spec_value);
    let spec_outs: Vec<ValueId> = ends
        .iter()
        .map(|(v, _)| spec.value(*v).expect("a target is computed"))
        .collect();
    let mut spec_graph = spec.graph.clone();
    spec_graph.outputs = spec_outs.iter().map(|&v| Some(v)).collect();
    // Each target's values on each rank: one, or a pipeline rank's microbatches in order.
    // Bucketed by rank in one pass over the holders (in their order): a scan of every
    // holder per rank was quadratic in the ranks (8192 on llama3-405b, for every stage).
    let mut rank_outputs: Vec<Vec<Vec<ValueId>>> = vec![vec![Vec::new(); ends.len()]; nranks];
    for (e, (_, holders)) in ends.iter().enumerate() {
        for &(r, v) in holders {
            if let Some(nv) = built[r].value(v) {
                rank_outputs[r][e].push(nv);
            }
        }
    }
    // Ranks that share a stage graph and its output share the whole stage graph. Microbatches
    // are expected as their concatenation ([`micro`]).
    let mut ranks: Vec<Arc<Graph>> = Vec::with_capacity(nranks);
    let mut joined: BTreeMap<(usize, Vec<Vec<ValueId>>), Arc<Graph>> = BTreeMap::new();
    for (sliced, outs) in built.iter().zip(&rank_outputs) {
        let id = (Arc::as_ptr(sliced) as usize, outs.clone());
        let g = match joined.get(&id) {
            Some(g) => g.clone(),
            None => {
                let mut g = sliced.graph.clone();
                let mut outputs = Vec::with_capacity(outs.len());
                for values in outs {
                    outputs.push(match values.as_slice() {
                        [] => None,
                        [v] => Some(*v),
                        several => Some(
                            micro::append_cat(&mut g, several)
                                .map_err(|e| format!("{label}: {e}"))?,
                        ),
                    });
                }
                g.outputs = outputs;
                let g = Arc::new(g);
                joined.insert(id, g.clone());
                g
            }
        };
        ranks.push(g);
    }
    // A target's value on each rank that holds it: the stage graph's output.
    let holders_of = |e: usize, values: &[(usize, ValueId)]| -> Vec<(usize, ValueId)> {
        let mut out: Vec<(usize, ValueId)> = Vec::new();
        for &(r, _) in values {
            if out.last().is_some_and(|&(h, _)| h == r) {
                continue;
            }
            if let Some(v) = ranks[r].outputs.get(e).copied().flatten() {
                out.push((r, v));
            }
        }
        out
    };
    let mut outputs = Vec::new();
    for (e, (&target, &spec_out)) in targets.iter().zip(&spec_outs).enumerate() {
        match target {
            Target::Cut(i) => {
                let rel = &case.inputs[i];
                outputs.push(OutputExpectation {
                    spec_name: rel.spec_name.clone(),
                    spec_value: spec_out,
                    is_graph_output: true,
                    impl_name: rel.impl_name.clone(),
                    impl_values: map_impl(&rel.impl_values),
                    rank_values: holders_of(e, &rel.rank_values),
                    layout: rel.layout.clone(),
                    span: rel.span,
                });
            }
            Target::Output(i) => {
                let o = &case.outputs[i];
                outputs.push(OutputExpectation {
                    spec_value: spec_out,
                    is_graph_output: true,
                    impl_values: map_impl(&o.impl_values),
                    rank_values: holders_of(e, &o.rank_values),
                    ..o.clone()
                });
            }
            Target::Implicit(_) => {}
        }
    }
    // Each rank's leaves: its inputs' values (one pass over the relations, bucketed by rank:
    // a scan of every relation's holders per rank was quadratic in the ranks) and its
    // constants.
    let mut stage_names: Vec<BTreeSet<String>> = vec![BTreeSet::new(); nranks];
    for &(r, v) in inputs.iter().flat_map(|rel| rel.rank_values.iter()) {
        stage_names[r].insert(ranks[r].value_name(v).to_string());
    }
    for (names, g) in stage_names.iter_mut().zip(&ranks) {
        for n in &g.nodes {
            if let NodeKind::Constant { .. } = n.kind {
                names.insert(n.outputs[0].name.clone());
            }
        }
    }
    let program = Program {
        mesh: case.program.mesh.clone(),
        groups: case.program.groups.clone(),
        ranks,
    };
    let sched = shardproof_interp::schedule(&program, &case.ops, Some(&stage_names));
    let refs: Vec<&Sliced> = built.iter().map(|s| &**s).collect();
    slice::same_pairing(&sched, whole.pairing, &refs).map_err(|e| format!("{label}: {e}"))?;
    let spec_nodes = spec_graph.nodes.len();
    let rank_nodes = program.ranks.iter().map(|g| g.nodes.len()).sum();
    let assumes = inputs.iter().map(|r| r.spec_name.clone()).collect();
    let mut stage_case = Case {
        file: case.file.clone(),
        name: format!("{} ({label})", case.name),
        spec: spec_graph,
        program,
        inputs,
        outputs,
        ops: case.ops.clone(),
        assume: case.assume.clone(),
        constants: case.constants.clone(),
        source: whole.source.clone(),
    };
    micro::encode_inputs(&mut stage_case).map_err(|e| format!("{label}: {e}"))?;
    Ok((
        Stage {
            target: label,
            assumes,
            case: Arc::new(stage_case),
            key: Arc::from(""),
            digest: String::new(),
            rep: 0,
            spec_nodes,
            rank_nodes,
        },
        assumed,
    ))
}

/// The memo key of a stage: its structure with every tensor name dropped.
fn stage_key(case: &Case, reduce: bool) -> String {
    if reduce {
        if let Ok(r) = crate::reduce::reduce_case(case) {
            // The original sizes too: a proof on reduced sizes stands after its second-size
            // check, which runs at sizes the originals bound (and not at all where the reduced
            // sizes are the originals), so two stages reduced from different sizes are
            // different proofs.
            let sizes: Vec<(u64, u64)> = r.sizes.iter().map(|s| (s.reduced, s.original)).collect();
            return format!("reduced {sizes:?}\n{}", structure(&r.case));
        }
    }
    format!("full\n{}", structure(case))
}

/// An argument as the key writes it, a value's node written as `node` gives it (its number, or
/// its place in a canonical order).
fn arg_key(out: &mut String, a: &Arg, node: &dyn Fn(usize) -> usize) {
    match a {
        Arg::Value(v) => {
            let _ = write!(out, "%{}.{}", node(v.node), v.output);
        }
        Arg::List(items) => {
            out.push('[');
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                arg_key(out, x, node);
            }
            out.push(']');
        }
        other => {
            let _ = write!(out, "{other:?}");
        }
    }
}

fn graph_key(out: &mut String, g: &Graph, case: &Case) {
    graph_key_in(out, g, case, None);
}

/// A graph as the key writes it: every node's operator, arguments, dtypes and shapes, then its
/// outputs. In program order with node numbers, or (given `order`) in that canonical order with
/// nodes written by their place in it and point-to-point peers blank (the key then writes the
/// messages: [`canon`]).
fn graph_key_in(out: &mut String, g: &Graph, case: &Case, order: Option<&canon::NodeOrder>) {
    let metas = shardproof_interp::infer_graph(g, &case.ops).metas;
    let program_order: Vec<usize>;
    let nodes: &[usize] = match order {
        Some(o) => &o.order,
        None => {
            program_order = (0..g.nodes.len()).collect();
            &program_order
        }
    };
    let place = |n: usize| order.map_or(n, |o| o.place.get(n).copied().unwrap_or(usize::MAX));
    for &i in nodes {
        let node = &g.nodes[i];
        match &node.kind {
            NodeKind::Input => out.push_str("in"),
            // Constants are leaves by attribute: their value, or one symbol per attribute.
            NodeKind::Constant { attr } => {
                let _ = write!(
                    out,
                    "const {attr} {:?} {:?}",
                    case.constants.get(attr),
                    node.loc.as_ref().and_then(|l| l.assigned_literal())
                );
            }
            NodeKind::Call { op, args, kwargs } => {
                let _ = write!(out, "{op}(");
                let peer = order.and(canon::peer_argument(op));
                for (k, a) in args.iter().enumerate() {
                    if peer.is_some_and(|(at, _)| at == k) {
                        out.push_str("peer");
                    } else {
                        arg_key(out, a, &place);
                    }
                    out.push(',');
                }
                for (k, a) in kwargs {
                    let _ = write!(out, "{k}=");
                    if peer.is_some_and(|(_, name)| name == k) {
                        out.push_str("peer");
                    } else {
                        arg_key(out, a, &place);
                    }
                    out.push(',');
                }
                out.push(')');
            }
        }
        for m in &metas[i] {
            match m {
                Some(m) => {
                    let _ = write!(out, " {:?}{:?}", m.dtype, m.shape);
                }
                None => out.push_str(" ?"),
            }
        }
        out.push('\n');
    }
    match order {
        None => {
            let _ = writeln!(out, "outputs {:?}", g.outputs);
        }
        Some(_) => {
            let outputs: Vec<Option<(usize, usize)>> = g
                .outputs
                .iter()
                .map(|v| v.map(|v| (place(v.node), v.output)))
                .collect();
            let _ = writeln!(out, "outputs {outputs:?}");
        }
    }
}

/// Everything a proof depends on, names aside, and the holding ranks' numbers aside where the
/// stage names ranks only through its holders' mesh positions and groups ([`renumber`]).
fn structure(case: &Case) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "mesh {:?}\nops {:?}\nassume {:?}",
        case.program.mesh, case.ops, case.assume
    );
    if let Some(rest) =
        renumber::renumbered(case, |out, g, order| graph_key_in(out, g, case, order))
    {
        out.push_str(&rest);
        return out;
    }
    let _ = writeln!(out, "absolute\ngroups {:?}", case.program.groups);
    out.push_str(&absolute_structure(case));
    out
}

/// The digest of a stage case's unreduced key with absolute rank numbers, as keys were before
/// they were taken up to renumbering the holding ranks: for tests that pin a plan's stages
/// (their graphs and relations) apart from its memo.
#[doc(hidden)]
pub fn absolute_key_digest(case: &Case) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "full\nmesh {:?}\ngroups {:?}\nops {:?}\nassume {:?}",
        case.program.mesh, case.program.groups, case.ops, case.assume
    );
    out.push_str(&absolute_structure(case));
    digest(&out)
}

/// The stage's graphs and relations with absolute rank numbers: every rank's graph, the
/// relations' holders as numbered.
fn absolute_structure(case: &Case) -> String {
    let mut out = String::new();
    out.push_str("spec\n");
    graph_key(&mut out, &case.spec, case);
    let mut seen: Vec<*const Graph> = Vec::new();
    for (r, g) in case.program.ranks.iter().enumerate() {
        match seen.iter().position(|p| *p == Arc::as_ptr(g)) {
            Some(k) => {
                let _ = writeln!(out, "rank {r} = graph {k}");
            }
            None => {
                let _ = writeln!(out, "rank {r} = graph {}", seen.len());
                seen.push(Arc::as_ptr(g));
                graph_key(&mut out, g, case);
            }
        }
    }
    for rel in &case.inputs {
        let _ = writeln!(
            out,
            "input {:?} {:?} {:?} {:?}",
            rel.spec_value, rel.layout, rel.rank_values, rel.impl_values
        );
    }
    for o in &case.outputs {
        let _ = writeln!(
            out,
            "output {:?} {:?} {:?} {:?}",
            o.spec_value, o.layout, o.rank_values, o.impl_values
        );
    }
    out
}

/// Proves the distinct stages `which` (indices into the plan) on `jobs` threads; the results
/// are in the order of `which`, whatever the threads' timing.
pub fn prove_stages(
    plan: &Plan,
    which: &[usize],
    cfg: &ProveConfig,
    jobs: usize,
) -> Vec<(usize, StageOutcome, Proof)> {
    use rayon::prelude::*;
    let cfg = ProveConfig {
        // One progress counter cannot follow stages proved at once.
        progress: None,
        started: Some(cfg.started.unwrap_or_else(std::time::Instant::now)),
        ..cfg.clone()
    };
    let deadline = cfg.time_limit.zip(cfg.started).map(|(t, s)| s + t);
    let one = |&k: &usize| {
        let stage = &plan.stages[k];
        // A stage begun after the limit would still be type-checked and shape-reduced (seconds
        // each on a plan of thousands of ranks) before its proof saw the limit.
        if passed(deadline) {
            let proof = not_begun(&stage.case, &cfg);
            return (k, StageOutcome::of(&proof), proof);
        }
        tracing::debug!(stage = k, target = %stage.target, "proving stage");
        let proof = prove_case(&stage.case, &cfg);
        tracing::info!(stage = k, target = %stage.target, verdict = ?proof.verdict, "stage decided");
        (k, StageOutcome::of(&proof), proof)
    };
    match rayon::ThreadPoolBuilder::new()
        .num_threads(jobs.max(1))
        .build()
    {
        Ok(pool) => pool.install(|| which.par_iter().map(one).collect()),
        Err(e) => {
            tracing::warn!(error = %e, "no thread pool; proving the stages one by one");
            which.iter().map(one).collect()
        }
    }
}

/// The inconclusive proof of a stage the time limit ran out before.
fn not_begun(case: &Case, cfg: &ProveConfig) -> Proof {
    Proof {
        case: case.name.clone(),
        ranks: case.program.ranks.len(),
        verdict: Verdict::Inconclusive,
        outputs: Vec::new(),
        layers: BTreeMap::new(),
        failure: None,
        counterexample: None,
        unsupported_op: None,
        message: Some(format!(
            "the time limit of {} s ran out before this stage began",
            cfg.time_limit.unwrap_or_default().as_secs_f64()
        )),
        stats: Default::default(),
        reduction: None,
        assumptions: Vec::new(),
        mesh: None,
        mesh_kept: None,
        counted_on: crate::CountedOn::as_written(case.program.ranks.len()),
    }
}

/// The first refuted stage of a merged result proved again in this process, for its
/// counterexample (a shard's file holds only its verdict): the shards' verdict stands either
/// way; `None` when no stage is refuted or the local proof does not refute it (a time limit).
pub fn reprove_refuted(
    plan: &Plan,
    outcomes: &BTreeMap<usize, StageOutcome>,
    cfg: &ProveConfig,
) -> Option<Box<Proof>> {
    let k = first_refuted(plan, outcomes)?;
    let rep = plan.stages[k].rep;
    let (_, _, proof) = prove_stages(plan, &[rep], cfg, 1).pop()?;
    (proof.verdict == Verdict::Refuted && proof.counterexample.is_some()).then(|| Box::new(proof))
}

/// Proves `case` stage by stage on `jobs` threads.
pub fn prove_staged(case: &Case, cfg: &ProveConfig, jobs: usize) -> StagedProof {
    prove_staged_with(case, cfg, jobs, &PlanOptions::default())
}

/// [`prove_staged`] with [`PlanOptions`].
pub fn prove_staged_with(
    case: &Case,
    cfg: &ProveConfig,
    jobs: usize,
    opts: &PlanOptions,
) -> StagedProof {
    // The plan stops at the proof's own limit unless the caller set another.
    let started = cfg.started.unwrap_or_else(Instant::now);
    let cfg = &ProveConfig {
        started: Some(started),
        ..cfg.clone()
    };
    let opts = &PlanOptions {
        deadline: opts.deadline.or(cfg.time_limit.map(|t| started + t)),
        ..opts.clone()
    };
    let plan = match plan_until(case, cfg.reduce, opts) {
        Ok(p) => p,
        Err(PlanError::Refused(why)) => return refused(case, &why),
        Err(PlanError::OutOfTime(why)) => return limit_reached(case, &why),
    };
    let results = prove_stages(&plan, &plan.distinct, cfg, jobs);
    let mut outcomes = BTreeMap::new();
    let mut proofs = BTreeMap::new();
    for (k, o, p) in results {
        outcomes.insert(k, o);
        proofs.insert(k, p);
    }
    let mut staged = assemble(case, &plan, &outcomes);
    if let Some(k) = first_refuted(&plan, &outcomes) {
        staged.refuted = proofs.remove(&plan.stages[k].rep).map(Box::new);
    }
    staged
}

/// The report of a plan that could not be made.
pub fn refused(case: &Case, why: &str) -> StagedProof {
    StagedProof {
        case: case.name.clone(),
        ranks: case.program.ranks.len(),
        verdict: Verdict::Inconclusive,
        message: Some(format!("the case cannot be cut into stages: {why}")),
        stages: Vec::new(),
        distinct_stages: 0,
        memo_hits: 0,
        layers: BTreeMap::new(),
        proofs: Vec::new(),
        refuted: None,
        assumptions: Vec::new(),
    }
}

/// The report of a plan the time limit stopped: inconclusive, saying where.
pub fn limit_reached(case: &Case, why: &str) -> StagedProof {
    StagedProof {
        message: Some(format!("limit reached: {why}")),
        ..refused(case, why)
    }
}

fn first_refuted(plan: &Plan, outcomes: &BTreeMap<usize, StageOutcome>) -> Option<usize> {
    (0..plan.stages.len()).find(|&k| {
        outcomes
            .get(&plan.stages[k].rep)
            .is_some_and(|o| o.verdict == Verdict::Refuted)
    })
}

/// Chains the distinct stages' outcomes (by stage index) into the case's verdict.
pub fn assemble(case: &Case, plan: &Plan, outcomes: &BTreeMap<usize, StageOutcome>) -> StagedProof {
    let mut stages = Vec::new();
    for (k, s) in plan.stages.iter().enumerate() {
        let o = outcomes.get(&s.rep);
        stages.push(StageReport {
            index: k,
            target: s.target.clone(),
            assumes: s.assumes.clone(),
            spec_nodes: s.spec_nodes,
            rank_nodes: s.rank_nodes,
            key: s.digest.clone(),
            memo_hit: s.rep != k,
            proved_by: s.rep,
            verdict: o.map(|o| o.verdict),
            layers: o.map(|o| o.layers.clone()).unwrap_or_default(),
            message: match o {
                Some(o) => o.message.clone(),
                None => Some("no result: no shard proved this stage".into()),
            },
        });
    }
    let mut layers: BTreeMap<String, usize> = BTreeMap::new();
    let mut proofs = Vec::new();
    for &k in &plan.distinct {
        if let Some(o) = outcomes.get(&k) {
            for (l, n) in &o.layers {
                *layers.entry(l.clone()).or_default() += n;
            }
            proofs.push(StageProof {
                stage: k,
                proof: serde_json::from_str(&o.proof).unwrap_or(serde_json::Value::Null),
            });
        }
    }
    let finals = plan
        .stages
        .iter()
        .filter(|s| !s.target.starts_with("cut"))
        .count();
    let (verdict, message) = if let Some(k) = first_refuted(plan, outcomes) {
        let s = &plan.stages[k];
        let why = stages[k].message.clone().unwrap_or_default();
        (
            Verdict::Refuted,
            Some(format!(
                "stage {k} ({}) is refuted under the relations it assumes{}: {why}",
                s.target,
                if s.rep == k {
                    String::new()
                } else {
                    format!(
                        " (by the proof of stage {}, the same up to renaming)",
                        s.rep
                    )
                }
            )),
        )
    } else if let Some(r) = stages.iter().find(|r| r.verdict != Some(Verdict::Proved)) {
        (
            Verdict::Inconclusive,
            Some(format!(
                "stage {} ({}) is not proved: {}",
                r.index,
                r.target,
                r.message.clone().unwrap_or_default()
            )),
        )
    } else if finals == 0 {
        (
            Verdict::Inconclusive,
            Some("there is nothing to compare: the spec returns no tensor and the case sets no `outputs:`".into()),
        )
    } else {
        (Verdict::Proved, None)
    };
    StagedProof {
        case: case.name.clone(),
        ranks: case.program.ranks.len(),
        verdict,
        message,
        distinct_stages: plan.distinct.len(),
        memo_hits: plan.stages.len() - plan.distinct.len(),
        stages,
        layers,
        proofs,
        refuted: None,
        assumptions: Vec::new(),
    }
}
