//! Relation inference (Entangle, Listings 1-3): the spec operators in topological order, each
//! expressed through the relations of its inputs, saturated with the lemmas in a small e-graph
//! that also holds the implementation operators related to those inputs, and its outputs'
//! clean expressions kept as their relations.
//!
//! This module is Listing 1 (`compute_out_rel`): [`verify`] walks the spec and asks
//! `saturate::infer_one` (Listing 2, `compute_node_out_rel`) for each operator's relation.
//! The steps live in submodules:
//! - `relation`: relations and states, and the implementation side they are over;
//! - `inputs`: the case's own relations (`inputs:`, expected `outputs:`) as clean terms;
//! - `seeds`: spec equations seeded into an operator's e-graph, relations viewed back;
//! - `explore`: the implementation neighbourhood T_rel (Listing 3's rounds);
//! - `saturate`: one operator's e-graph, saturation, and the node budget;
//! - `extract`: clean (and unclean) expressions out of an e-class;
//! - `pieces`: piecewise inference where an operator's e-graph outgrew the budget;
//! - `diagnose` and `evidence`: where relations stop, and which bug class the evidence
//!   matches (the report's hint);
//! - `report`: the verdict and report types.

mod diagnose;
mod evidence;
mod explore;
mod extract;
mod fastpath;
mod inputs;
mod pieces;
mod relation;
mod report;
mod reuse;
mod saturate;
mod schedule;
mod seeds;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_diagnose;
#[cfg(test)]
mod tests_fastpath;
#[cfg(test)]
mod tests_fastpath_linear;

pub use report::{render, Certificate, Failure, OperatorTime, Outcome, TraceStep, Verdict};

use crate::lemmas::{library_for, PIECEWISE, WIDENED};
use crate::lower::{
    lower, pair_collectives, pair_messages, LowerCtx, Lowered, Messages, Partners, Tpl, ValueRef,
};
use crate::term::{Shapes, Term};
use diagnose::{blame, fused_product, is_float_scalar, is_float_value, strong_evidence, Detail};
use egg::{RecExpr, Rewrite};
use evidence::{is_rank_sum, never_completed, shard_reductions_never_completed};
use inputs::{expected_exprs, input_state};
use pieces::{infer_by_pieces, PieceLog};
use relation::{
    build_impl, clean_up_to_factor, inputs_relate_up_to_factor, tpl_values, Impl, Rel, State,
};
use report::{certificate_exprs, trace_step, undecided_by_constants};
use saturate::{infer_one, Attempt, WIDEN_BELOW_NODES};
use seeds::{spec_seeds, view_back, views_back};
use shardproof_case::Case;
use shardproof_interp::infer_graph;
use shardproof_ir::Progress;
use shardproof_ir::{Graph as IrGraph, NodeKind, ValueId};
use shardproof_ops::Meta;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Limits of the search.
#[derive(Clone, Debug)]
pub struct Options {
    /// Saturation iterations per exploration round.
    pub iter_limit: usize,
    /// E-graph size limit per spec operator, in egg's hash-cons entries (`EGraph::total_size`):
    /// the entries of merged nodes stay, so it is 1.3-3 times the distinct nodes.
    pub node_limit: usize,
    /// Rounds of bringing in implementation operators per spec operator.
    pub explore_rounds: usize,
    /// Further rounds taken only while the operator's output still has no clean expression, or
    /// has one but not the one the case expects (a merge of ranks' partial results can lie
    /// deeper than most relations, as in tp x cp). Rounds that bring in only 0-d values do not
    /// count against either limit.
    pub deepen_rounds: usize,
    /// Record every spec operator's relation in [`Outcome::trace`].
    pub trace: bool,
    /// Where the walk reports how far it has come (see [`Progress`]), for another thread to
    /// read while it runs.
    pub progress: Option<std::sync::Arc<Progress>>,
    /// Worker threads for independent work (`None`: the available cores). Reports are the
    /// same at any count.
    pub jobs: Option<usize>,
    /// Try each operator first by its twin's relation (the same operator of an earlier layer),
    /// and each piece of piecewise inference by its first sibling piece's over other ranks,
    /// renamed onto its tensors and checked (see `reuse`); off, every operator and piece is
    /// inferred.
    pub reuse: bool,
    /// Relate an operator by the placement rule of its family where its inputs relate by plain
    /// placements and the ranks compute the same call over them (see `fastpath`), before any
    /// e-graph; off, every operator goes to reuse or inference.
    pub fast_path: bool,
    /// Decide every operator by the e-graph as with the fast path off, and compare the fast
    /// path's relation, where it has one, with the e-graph's ([`Outcome::fast_path_differences`]).
    pub audit_fast_path: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            iter_limit: 8,
            node_limit: 20_000,
            explore_rounds: 12,
            deepen_rounds: 4,
            trace: false,
            progress: None,
            jobs: None,
            reuse: true,
            fast_path: true,
            audit_fast_path: false,
        }
    }
}

/// Checks that the implementation refines the specification of `case`.
///
/// Listing 1 of the Entangle paper (`compute_out_rel`): the spec operators the checked outputs
/// depend on, in topological order, each given its outputs' relations by
/// [`Walk::infer_value`] from the relations found so far (the case's `inputs:` to start
/// with); then the verdict on the checked outputs' relations. The walk stops early once that
/// verdict is settled: the first failing checked output is refuted on the strongest evidence,
/// or relates cleanly but not as expected ([`Outcome::operators_skipped`] counts the rest).
pub fn verify(case: &Case, opts: &Options) -> Outcome {
    let start = Instant::now();
    let finish = |mut o: Outcome| {
        o.seconds = start.elapsed().as_secs_f64();
        o
    };
    let rules = Rules::for_case(case);
    let mut outcome = Outcome::inconclusive(None, rules.lemmas);
    if let Some(reason) = untypable(case) {
        outcome.reason = Some(reason);
        return finish(outcome);
    }
    let (partners, messages) = match pair_ranks(case) {
        Ok(paired) => paired,
        Err(reason) => {
            outcome.reason = Some(reason);
            return finish(outcome);
        }
    };
    let ctx = LowerCtx {
        messages: &messages,
        custom_ops: &case.ops,
        same_mask: case.assume.dropout.is_some(),
        program: &case.program,
        partners: &partners,
        constants: &case.constants,
        ignore_index_unused: case.assume.ignore_index_unused.is_some(),
    };
    let imp = build_impl(case, &ctx);
    let spec = &case.spec;
    let spec_metas = infer_graph(spec, &case.ops).metas;

    let checked = checked_outputs(case);
    if checked.is_empty() {
        outcome.reason = Some("there is nothing to check: the spec returns no computed tensor and the case sets no `outputs:`".into());
        return finish(outcome);
    }
    let cuts: HashMap<ValueId, usize> = case
        .inputs
        .iter()
        .enumerate()
        .map(|(i, r)| (r.spec_value, i))
        .collect();
    let needed = needed_operators(spec, &checked, &cuts);

    let mut walk = Walk {
        case,
        opts,
        ctx: &ctx,
        imp: &imp,
        spec_metas: &spec_metas,
        spec_users: spec.consumers(),
        rules: &rules,
        checked: &checked,
        cuts: &cuts,
        keep: HashSet::new(),
        solved: Mutex::new(HashMap::new()),
    };
    let mut grown = Grown::default();
    let order: Vec<usize> = (0..spec.nodes.len()).filter(|&n| needed[n]).collect();
    if let Some(p) = opts.progress.as_deref() {
        p.start(order.len());
    }
    let mut plans: Vec<NodePlan> = order.iter().map(|&n| walk.plan(n)).collect();
    walk.keep = assign_twins(&mut plans, opts.reuse);
    let ended = schedule::run(&walk, &order, &plans, &mut grown, |grown, i, result| {
        walk.commit(grown, order[i], result, &mut outcome)
            .map_err(|reason| {
                outcome.reason = Some(reason);
                None
            })?;
        let n = order[i];
        if walk.checked.iter().any(|c| c.0.node == n) {
            if let Some(mut settled) = walk.settled_early(grown, &outcome, &needed, n) {
                settled.operators_skipped += needed[n + 1..].iter().filter(|&&x| x).count();
                return Err(Some(Box::new(settled)));
            }
        }
        Ok(())
    });
    match ended {
        Err(Some(settled)) => finish(*settled),
        Err(None) => finish(outcome),
        Ok(()) => finish(walk.conclude(&grown, outcome)),
    }
}

/// Evidence no later operator can make good: a partial sum the implementation never reduces
/// across ranks. The other strong evidence is final only at a checked output: mid-walk a
/// wrong-looking scale factor is normal under data parallelism (each rank's local mean, made
/// good by the gradient average), and a reduction over a shard or over another group may be
/// completed by a later collective (`blame` then finds the value compensated downstream);
/// [`Walk::refuted_here`] takes a reduction over another group, or over each rank's shard, as
/// final only where no such collective is reachable ([`never_completed`],
/// [`shard_reductions_never_completed`]).
fn final_evidence(hint: &str) -> bool {
    hint.contains("the implementation never reduces it across ranks")
}

/// The relation of a value not explored because it lies downstream of an operator refuted on
/// strong evidence: unclean, with no expression (inference never produces that otherwise).
fn unexplored_state() -> State {
    State::Related(Rel {
        exprs: Vec::new(),
        clean: false,
        equal_leaves: Vec::new(),
        equal_slices: Vec::new(),
        explored: Vec::new(),
    })
}

/// Whether `s` is [`unexplored_state`].
fn unexplored(s: &State) -> bool {
    matches!(s, State::Related(r) if !r.clean && r.exprs.is_empty())
}

/// Whether the relation `rel` that full inference gave the operator `t` is kept for its twins
/// (see `reuse`). A clean one always. An unclean one too (the attention backward's `grad x V^T`
/// product stays unclean in every layer, so each layer inferred it, and its consumer, afresh),
/// since the check proves every renamed expression equal to the operator, whatever its kind;
/// but only with an expression to prove (an unexplored relation has none, and its check would
/// hold vacuously), and not for a fused linear, whose unclean relation comes with its
/// product's relation (the evidence a missing reduction leaves), which reuse does not give.
fn keepable(t: &Tpl, rel: &Rel) -> bool {
    rel.clean || (!rel.exprs.is_empty() && fused_product(t).is_none())
}

/// The state of an operator `t` that reads the output of a refuted operator (in `refuted`) or
/// a value not explored for that reason, without exploring it: the first input's state that
/// is no relation, as inference would inherit it (see `infer_one`), else unexplored. `None`
/// when `t` reads neither.
fn downstream_of_refutation(
    t: &Tpl,
    view: &HashMap<ValueId, State>,
    refuted: &HashSet<ValueId>,
) -> Option<State> {
    let mut ins = Vec::new();
    tpl_values(t, &mut ins);
    let downstream = ins
        .iter()
        .any(|x| refuted.contains(&x.value) || view.get(&x.value).is_some_and(unexplored));
    if !downstream {
        return None;
    }
    for x in &ins {
        match view.get(&x.value) {
            Some(State::Related(_)) => {}
            Some(s) => return Some(s.clone()),
            None => return Some(State::Unrelated("an input was never computed".into())),
        }
    }
    Some(unexplored_state())
}

impl Walk<'_> {
    /// Whether a spec node after `at` views spec value `v` (a view can carry a clean relation
    /// back onto it, `view_back`).
    fn viewed_after(&self, v: ValueId, at: usize) -> bool {
        let spec = &self.case.spec;
        self.spec_users.get(v.node).into_iter().flatten().any(|&u| {
            u > at && views_back(&spec.nodes[u]) && spec.nodes[u].inputs().first() == Some(&v)
        })
    }

    /// Whether spec value `v` is refuted where it stands (fast refutation, issue 48): a float
    /// value its operator's inference left without a clean relation while every float input
    /// relates cleanly, where the evidence is final ([`final_evidence`]: a partial sum the
    /// implementation never reduces; `blame` may name an operator before it, a clean sum no
    /// rank holds; a sum over the wrong group or a statistic over each rank's shard that no
    /// later collective can complete), and no later view can carry a clean relation back onto
    /// it (`view_back`). A bug in what the
    /// ranks compute then reaches every consumer, so they are not explored; operators on
    /// independent paths into the same outputs still are (the report's other stops).
    /// `at` is the spec node just committed: `v`'s producer, or a view of `v` after which no
    /// view of `v` remains.
    fn refuted_here(&self, grown: &Grown, v: ValueId, at: usize) -> bool {
        let spec = &self.case.spec;
        let Some(s) = grown.state.get(&v) else {
            return false;
        };
        let inferred = matches!(s, State::Related(r) if !r.clean) || matches!(s, State::Lost(_));
        if !inferred || unexplored(s) || !is_float_value(self.spec_metas, v) {
            return false;
        }
        let viewed_later = self.viewed_after(v, at);
        let inputs_relate = spec.nodes[v.node]
            .inputs()
            .iter()
            .filter(|x| is_float_value(self.spec_metas, **x))
            .all(|x| grown.state.get(x).is_some_and(clean_up_to_factor));
        if viewed_later || !inputs_relate {
            return false;
        }
        let name = spec.value_name(v);
        let f = blame(
            self.case,
            self.imp,
            &grown.state,
            &grown.products,
            self.spec_metas,
            &grown.widened,
            v,
            name,
            Detail::Hint,
        );
        // The unit tests' walks (every fast refutation test among them) check that the short
        // form decides as the full report would.
        if cfg!(test) {
            let full = blame(
                self.case,
                self.imp,
                &grown.state,
                &grown.products,
                self.spec_metas,
                &grown.widened,
                v,
                name,
                Detail::Report,
            );
            assert_eq!(
                (&full.operator, &full.hint, &full.not_computed),
                (&f.operator, &f.hint, &f.not_computed),
                "blame's short form differs from its report at `{name}`"
            );
        }
        // The rank sums at the operator's own inputs and product: `blame` may name a sum it
        // walked back to (a correct llama dp2 x tp2's norm, whose input is no sum, named its
        // residual's tp all-reduces), which later operators can compensate.
        let own_sums = || -> Vec<&RecExpr<Term>> {
            let mut reads: Vec<&State> = spec.nodes[v.node]
                .inputs()
                .iter()
                .filter_map(|x| grown.state.get(x))
                .collect();
            reads.extend(grown.products.get(&v));
            reads
                .into_iter()
                .flat_map(|s| match s {
                    State::Related(r) => r.exprs.as_slice(),
                    _ => &[],
                })
                .filter(|e| is_rank_sum(e))
                .collect()
        };
        // A sum the strict walk finds nothing completing (see `never_completed`).
        let own_sums_final = || {
            let exprs = own_sums();
            !exprs.is_empty() && never_completed(self.case, self.imp, exprs)
        };
        match f.hint.as_deref() {
            // Past its views, only on evidence at the operator's own inputs or product that
            // nothing completes (a partial sum never reduced, taken past the views on the hint
            // alone, stopped a correct llama dp2 x tp2).
            Some(h) if final_evidence(h) => {
                at == v.node || (f.operator == name && own_sums_final())
            }
            // A sum over the wrong ranks is final where nothing the implementation computes
            // from its tensors, linearly, reaches a collective that would complete it.
            Some(h) if h.contains("wrong process group") => own_sums_final(),
            // A statistic over a sharded dim is final at the operator itself, where none of the
            // ranks' partial statistics reaches a collective that could complete it.
            Some(h) if h.contains("each rank reduces its own shard") => {
                at == v.node
                    && f.operator == name
                    && shard_reductions_never_completed(
                        self.case,
                        self.imp,
                        &grown.state,
                        self.spec_metas,
                        &spec.nodes[v.node],
                    )
            }
            _ => false,
        }
    }
}

/// The lemma sets of a case's attempts (see [`Attempt`]): the first attempt's, the piecewise
/// inference's, and the wider second attempt's.
struct Rules {
    first: Vec<Rewrite<Term, Shapes>>,
    pieces: Vec<Rewrite<Term, Shapes>>,
    wide: Vec<Rewrite<Term, Shapes>>,
    /// The lemmas of the widest set (the report's count).
    lemmas: usize,
}

impl Rules {
    /// The lemmas whose assumptions the case states.
    fn for_case(case: &Case) -> Rules {
        let mut assumed = Vec::new();
        if case.assume.ignore_index_unused.is_some() {
            assumed.push("ignore-index");
        }
        if case.assume.dropout.is_some() {
            assumed.push("dropout");
        }
        let lemmas = library_for(&assumed);
        let rules: Vec<Rewrite<Term, Shapes>> = lemmas.iter().flat_map(|l| l.rewrites()).collect();
        let piece_rules: Vec<Rewrite<Term, Shapes>> =
            library_for(&[assumed.as_slice(), &[PIECEWISE]].concat())
                .iter()
                .flat_map(|l| l.rewrites())
                .collect();
        assumed.push(WIDENED);
        let wide_lemmas = library_for(&assumed);
        let wide_rules: Vec<Rewrite<Term, Shapes>> =
            wide_lemmas.iter().flat_map(|l| l.rewrites()).collect();
        Rules {
            first: rules,
            pieces: piece_rules,
            wide: wide_rules,
            lemmas: wide_lemmas.len(),
        }
    }
}

/// Why the programs are not analysed, when one of them does not type-check: such a program is
/// never verified (and its shapes would mislead the lemmas' side conditions).
fn untypable(case: &Case) -> Option<String> {
    let first = shardproof_interp::first_equal(&case.program.ranks);
    let distinct = case
        .program
        .ranks
        .iter()
        .enumerate()
        .filter(|&(r, _)| first[r] == r)
        .map(|(_, g)| &**g);
    for graph in std::iter::once(&case.spec).chain(distinct) {
        if let Err(errors) = shardproof_interp::typecheck(graph, &case.ops) {
            return Some(format!(
                "the programs do not type-check: {}",
                errors.first().map(|e| e.to_string()).unwrap_or_default()
            ));
        }
    }
    None
}

/// The ranks' collectives paired across ranks, and their point-to-point messages; why not,
/// when collectives cannot meet (a hang, never a sum: no verdict past them).
fn pair_ranks(case: &Case) -> Result<(Partners, Messages), String> {
    let leaves: Vec<_> = (0..case.program.ranks.len())
        .map(|r| case.rank_leaves(r))
        .collect();
    let (partners, unpaired) = pair_collectives(&case.program, &case.ops, &leaves);
    if let Some(problem) = unpaired {
        return Err(format!(
            "the ranks' collectives cannot all run: {}",
            problem.message()
        ));
    }
    Ok((partners, pair_messages(&case.program)))
}

/// What to check: the case's expectations (each with its `outputs:` position), else every
/// tensor the spec returns.
fn checked_outputs(case: &Case) -> Vec<(ValueId, Option<usize>)> {
    let spec = &case.spec;
    if case.outputs.is_empty() {
        let mut seen = BTreeSet::new();
        spec.outputs
            .iter()
            .flatten()
            .filter(|v| seen.insert(**v))
            .filter(|v| !matches!(spec.nodes[v.node].kind, NodeKind::Input))
            .map(|&v| (v, None))
            .collect()
    } else {
        case.outputs
            .iter()
            .enumerate()
            .map(|(i, o)| (o.spec_value, Some(i)))
            .collect()
    }
}

/// The spec nodes the checked outputs depend on, back to the case's cuts (its `inputs:`).
fn needed_operators(
    spec: &IrGraph,
    checked: &[(ValueId, Option<usize>)],
    cuts: &HashMap<ValueId, usize>,
) -> Vec<bool> {
    let mut needed = vec![false; spec.nodes.len()];
    let mut stack: Vec<usize> = checked.iter().map(|c| c.0.node).collect();
    while let Some(n) = stack.pop() {
        if std::mem::replace(&mut needed[n], true) {
            continue;
        }
        let node = &spec.nodes[n];
        if node
            .outputs
            .iter()
            .enumerate()
            .any(|(k, _)| cuts.contains_key(&ValueId::new(n, k)))
        {
            continue;
        }
        stack.extend(node.inputs().iter().map(|v| v.node));
    }
    needed
}

/// The walk of Listing 1 over the spec: what it reads. It is shared by the worker threads; the
/// relation R it grows is [`Grown`], which only the in-order commit writes.
struct Walk<'a> {
    case: &'a Case,
    opts: &'a Options,
    ctx: &'a LowerCtx<'a>,
    imp: &'a Impl<'a>,
    spec_metas: &'a [Vec<Option<Meta>>],
    spec_users: Vec<Vec<usize>>,
    rules: &'a Rules,
    checked: &'a [(ValueId, Option<usize>)],
    cuts: &'a HashMap<ValueId, usize>,
    /// The values some later operator names as its twin: their solutions are kept.
    keep: HashSet<ValueId>,
    /// The kept solutions, written by the twin's inference, read by operators that wait for it.
    solved: Mutex<HashMap<ValueId, Arc<reuse::Solved>>>,
}

/// Gives each plan's outputs their twins (see `reuse`), each twin added to what the plan reads
/// so that it is committed first; returns the twins. Nothing when `enabled` is off.
fn assign_twins(plans: &mut [NodePlan], enabled: bool) -> HashSet<ValueId> {
    let mut keep = HashSet::new();
    if !enabled {
        return keep;
    }
    let sigs: Vec<Vec<(ValueId, Option<String>)>> = plans
        .iter_mut()
        .map(|p| std::mem::take(&mut p.signatures))
        .collect();
    for (plan, twins) in plans.iter_mut().zip(reuse::assign_twins(&sigs)) {
        for t in twins.iter().flatten() {
            plan.reads.insert(*t);
            keep.insert(*t);
        }
        plan.twins = twins;
    }
    keep
}

/// The relation R the walk grows, and what diagnosis reads beside it.
#[derive(Default)]
struct Grown {
    /// Every spec value's relation so far (the relation R).
    state: HashMap<ValueId, State>,
    /// The checked outputs whose clean relation is not the expected one: (expected, found).
    mismatches: HashMap<ValueId, (String, Option<String>)>,
    /// The relations of the products inside fused linears without a clean relation.
    products: HashMap<ValueId, State>,
    /// Spec operators whose relation only the wider second attempt found.
    widened: HashSet<ValueId>,
    /// Outputs of operators refuted on strong evidence where their inputs relate (see
    /// [`Walk::refuted_here`]): their consumers are not explored.
    refuted: HashSet<ValueId>,
}

/// What a spec node's inference needs besides the relations: its outputs' lowered terms and
/// the spec equations it is seeded with; and the spec values whose relations it reads.
pub(super) struct NodePlan {
    /// Per output: the lowered term (`None` for a cut, whose relation the case states).
    lowered: Vec<Option<Lowered>>,
    /// The spec equations seeded into its e-graphs.
    seeds: Vec<(Tpl, ValueId)>,
    /// Every spec value of another node whose relation the inference reads (and the twins,
    /// whose solutions it reads).
    pub(super) reads: BTreeSet<ValueId>,
    /// Per output, its problem's signature (see `reuse::signature`), until twins are assigned.
    signatures: Vec<(ValueId, Option<String>)>,
    /// Per output, the earlier values whose solutions it tries first, nearest first.
    twins: Vec<Vec<ValueId>>,
}

/// One change a node's inference makes to the relation R, replayed in order on the walk's
/// own copy of the relations and, at commit, on the shared one.
#[derive(Clone)]
enum Effect {
    /// The value's relation is this state.
    Set(ValueId, State),
    /// A clean relation of the node's output carried back to its input (`view_back`).
    ViewBack(usize, State),
}

/// The result of one spec node's inference, committed in node order.
pub(super) struct NodeResult {
    /// The changes to R, in order.
    effects: Vec<Effect>,
    /// Operators inferred (each counts in [`Outcome::spec_operators`]).
    inferred: usize,
    /// Operators not explored, downstream of a refuted one.
    unexplored: usize,
    /// Operators related by their twin's checked relation.
    reused: usize,
    /// Pieces related by a sibling piece's checked relation over other ranks.
    pieces_reused: usize,
    /// Operators related by the fast path's placement rules.
    fast: usize,
    /// Operators where the audit found the fast path's relation written otherwise than the
    /// e-graph's: the spec tensor, with both.
    fast_differences: Vec<String>,
    /// `--trace` steps, in order.
    trace: Vec<TraceStep>,
    /// Expectations found unmet, per value.
    mismatches: HashMap<ValueId, (String, Option<String>)>,
    /// Fused linears' products.
    products: Vec<(ValueId, State)>,
    /// Values only the wider attempt related.
    widened: Vec<ValueId>,
    /// Why the walk stops here (an expectation that cannot be checked).
    error: Option<String>,
    /// Wall seconds the node's inference took (see [`OperatorTime`]).
    seconds: f64,
    /// The attempts of full inference its operators took, in order (see [`OperatorTime`]).
    attempts: Vec<String>,
}

/// One attempt of full inference, for [`OperatorTime::attempts`]: its kind, its seconds since
/// `clock`, its peak e-graph size (none for pieces) and whether it related the value cleanly
/// (up to a factor).
fn attempt_time(kind: &str, clock: Instant, a: &Attempt, clean: bool) -> String {
    let outcome = if clean { "clean" } else { "not clean" };
    let secs = clock.elapsed().as_secs_f64();
    match a.peak_nodes.get() {
        0 => format!("{kind} {secs:.2} s {outcome}"),
        peak => format!("{kind} {secs:.2} s {peak} nodes {outcome}"),
    }
}

impl Effect {
    fn apply(
        self,
        spec: &IrGraph,
        metas: &[Vec<Option<Meta>>],
        state: &mut HashMap<ValueId, State>,
    ) {
        match self {
            Effect::Set(v, s) => {
                state.insert(v, s);
            }
            Effect::ViewBack(n, s) => view_back(metas, &spec.nodes[n], &s, state),
        }
    }
}

impl Walk<'_> {
    /// Node `n`'s plan: its lowered outputs, its seeds, what it reads.
    fn plan(&self, n: usize) -> NodePlan {
        let spec = &self.case.spec;
        let node = &spec.nodes[n];
        let mut reads = Vec::new();
        let lowered: Vec<Option<Lowered>> = (0..node.outputs.len())
            .map(|k| {
                let v = ValueId::new(n, k);
                if self.cuts.contains_key(&v) {
                    return None;
                }
                let low = lower(self.ctx, spec, self.spec_metas, None, n, k);
                match &low {
                    Lowered::Alias(a) => reads.push(*a),
                    Lowered::Term(t) => tpl_values(t, &mut reads),
                    Lowered::Leaf | Lowered::Unsupported(_) => {}
                }
                Some(low)
            })
            .collect();
        let seeds = spec_seeds(self.ctx, spec, self.spec_metas, &self.spec_users, n);
        // Checked outputs are never reused: their expectations are checked in full.
        let signatures = lowered
            .iter()
            .enumerate()
            .map(|(k, low)| {
                let v = ValueId::new(n, k);
                let sig = match low {
                    Some(Lowered::Term(t)) if !self.checked.iter().any(|c| c.0 == v) => {
                        Some(reuse::signature(self.spec_metas, v, t, &seeds))
                    }
                    _ => None,
                };
                (v, sig)
            })
            .collect();
        for (t, w) in &seeds {
            reads.push(ValueRef {
                rank: None,
                value: *w,
            });
            tpl_values(t, &mut reads);
        }
        NodePlan {
            twins: vec![Vec::new(); lowered.len()],
            signatures,
            lowered,
            seeds,
            reads: reads
                .into_iter()
                .map(|r| r.value)
                .filter(|v| v.node != n)
                .collect(),
        }
    }

    /// Infers every output of spec node `n` (Listing 1, lines 5 and 8) from `view`, the
    /// relations of what it reads as of just before it in node order. Nothing shared changes:
    /// the result is committed by [`Walk::commit`].
    fn compute(
        &self,
        n: usize,
        plan: &NodePlan,
        mut view: HashMap<ValueId, State>,
        refuted: &HashSet<ValueId>,
    ) -> NodeResult {
        let mut r = NodeResult {
            effects: Vec::new(),
            inferred: 0,
            unexplored: 0,
            reused: 0,
            pieces_reused: 0,
            fast: 0,
            fast_differences: Vec::new(),
            trace: Vec::new(),
            mismatches: HashMap::new(),
            products: Vec::new(),
            widened: Vec::new(),
            error: None,
            seconds: 0.0,
            attempts: Vec::new(),
        };
        let started = Instant::now();
        for (k, low) in plan.lowered.iter().enumerate() {
            let before = r.effects.len();
            if let Err(reason) =
                self.infer_value(n, k, low.as_ref(), plan, (&view, refuted), &mut r)
            {
                r.error = Some(reason);
                r.seconds = started.elapsed().as_secs_f64();
                return r;
            }
            // Later outputs of the node read the earlier ones' relations.
            if k + 1 < plan.lowered.len() {
                for e in &r.effects[before..] {
                    e.clone().apply(&self.case.spec, self.spec_metas, &mut view);
                }
            }
        }
        r.seconds = started.elapsed().as_secs_f64();
        r
    }

    /// Commits node `n`'s result to the relation R and the outcome, in node order.
    fn commit(
        &self,
        grown: &mut Grown,
        n: usize,
        r: NodeResult,
        outcome: &mut Outcome,
    ) -> Result<(), String> {
        let spec = &self.case.spec;
        let progress = self.opts.progress.as_deref();
        if let Some(p) = progress {
            p.enter(&spec.nodes[n].name);
        }
        outcome.spec_operators += r.inferred;
        outcome.operators_reused += r.reused;
        outcome.pieces_reused += r.pieces_reused;
        outcome.operators_fast += r.fast;
        outcome.fast_path_differences.extend(r.fast_differences);
        let path = if r.inferred == 0 {
            "input"
        } else if r.fast == r.inferred {
            "fast"
        } else if r.reused > 0 {
            "reused"
        } else if r.pieces_reused > 0 {
            "pieces"
        } else {
            "inferred"
        };
        outcome.operator_times.push(OperatorTime {
            tensor: spec.nodes[n].name.clone(),
            op: spec.nodes[n]
                .op()
                .map(|o| o.to_string())
                .unwrap_or_default(),
            seconds: r.seconds,
            path,
            attempts: r.attempts,
        });
        // A node none of whose operators was explored counts as skipped, not done.
        let skipped = r.unexplored > 0 && r.inferred == 0;
        if skipped {
            outcome.operators_skipped += 1;
        }
        outcome.trace.extend(r.trace);
        for e in r.effects {
            e.apply(spec, self.spec_metas, &mut grown.state);
        }
        grown.mismatches.extend(r.mismatches);
        grown.products.extend(r.products);
        grown.widened.extend(r.widened);
        if let Some(reason) = r.error {
            return Err(reason);
        }
        for k in 0..spec.nodes[n].outputs.len() {
            let v = ValueId::new(n, k);
            if self.refuted_here(grown, v, n) {
                grown.refuted.insert(v);
            }
        }
        // A value viewed later is judged once its last view has been committed (no view can
        // carry a clean relation back onto it any more); the views, unclean with it, share its
        // refutation where nothing views them later in turn.
        if views_back(&spec.nodes[n]) {
            let x = spec.nodes[n].inputs().first().copied();
            if let Some(x) = x.filter(|&x| !grown.refuted.contains(&x)) {
                if self.refuted_here(grown, x, n) {
                    grown.refuted.insert(x);
                    for k in 0..spec.nodes[n].outputs.len() {
                        let u = ValueId::new(n, k);
                        if self.viewed_after(u, n) {
                            continue;
                        }
                        if grown.state.get(&u).is_some_and(|s| {
                            !unexplored(s)
                                && (matches!(s, State::Related(r) if !r.clean)
                                    || matches!(s, State::Lost(_)))
                        }) {
                            grown.refuted.insert(u);
                        }
                    }
                }
            }
        }
        if let Some(p) = progress.filter(|_| !skipped) {
            p.leave();
        }
        Ok(())
    }

    /// Output `k` of spec node `n` gets its state (Listing 1, lines 5 and 8): a cut's from the
    /// case, an operator's from inference over its lowered term `low`, recorded as effects in
    /// `r`. An error when the expectation for it cannot be checked.
    fn infer_value(
        &self,
        n: usize,
        k: usize,
        low: Option<&Lowered>,
        plan: &NodePlan,
        (view, refuted): (&HashMap<ValueId, State>, &HashSet<ValueId>),
        r: &mut NodeResult,
    ) -> Result<(), String> {
        let (case, imp) = (self.case, self.imp);
        let spec = &case.spec;
        let node = &spec.nodes[n];
        let v = ValueId::new(n, k);
        let expect = match self.checked.iter().find(|c| c.0 == v).and_then(|c| c.1) {
            None => None,
            Some(i) => match expected_exprs(case, i, imp) {
                Ok(e) => Some(e),
                Err(m) => {
                    return Err(format!(
                        "the expectation for `{}` cannot be checked: {m}",
                        case.outputs[i].spec_name
                    ));
                }
            },
        };
        let own;
        let mut view = view;
        let low = match (self.cuts.get(&v), low) {
            (Some(&i), _) => {
                let s = input_state(case, i, imp);
                if expect.is_none() {
                    r.effects.push(Effect::Set(v, s));
                    return Ok(());
                }
                // A cut that is also an expected output: check it against its own relation.
                own = {
                    let mut own = view.clone();
                    own.insert(v, s.clone());
                    own
                };
                view = &own;
                r.effects.push(Effect::Set(v, s));
                Lowered::Term(Tpl::Value(ValueRef {
                    rank: None,
                    value: v,
                }))
            }
            (None, Some(low)) => low.clone(),
            (None, None) => lower(self.ctx, spec, self.spec_metas, None, n, k),
        };
        // An expected output is checked in an e-graph even when it only renames a value.
        let term = match low {
            Lowered::Alias(a) if expect.is_some() => Lowered::Term(Tpl::Value(a)),
            other => other,
        };
        let s = match term {
            Lowered::Leaf => match &node.kind {
                NodeKind::Constant { attr } => State::Blocked(format!(
                    "the value of the spec's module constant `{attr}` is not in the graph text; state it in the case: `constants: {{ {attr}: VALUE }}`"
                )),
                _ => State::Unrelated(format!(
                    "spec input `{}` has no relation in the case's `inputs:`",
                    node.outputs[k].name
                )),
            },
            Lowered::Unsupported(m) => State::Blocked(m),
            Lowered::Alias(a) => view
                .get(&a.value)
                .cloned()
                .unwrap_or_else(|| State::Unrelated("unrelated".into())),
            Lowered::Term(t) => match downstream_of_refutation(&t, view, refuted) {
                Some(s) => {
                    r.unexplored += 1;
                    s
                }
                None => {
                    r.inferred += 1;
                    let twins = plan.twins.get(k).map_or(&[][..], Vec::as_slice);
                    self.infer_operator(v, &t, expect.as_deref(), (&plan.seeds, twins), view, r)
                }
            },
        };
        if self.opts.trace {
            let mut step = trace_step(spec, v, &s);
            if unexplored(&s) {
                step.status = "unexplored";
                step.detail =
                    "not explored: downstream of a partial sum the implementation never reduces"
                        .into();
            }
            r.trace.push(step);
        }
        // Only a view's clean relation is carried back (see `view_back`).
        if views_back(node) && matches!(&s, State::Related(c) if c.clean) {
            r.effects.push(Effect::ViewBack(n, s.clone()));
        }
        r.effects.push(Effect::Set(v, s));
        Ok(())
    }

    /// The relation of spec value `v`, output of node `n` defined by the term `t` over its
    /// inputs (Listing 2, [`infer_one`]), by the attempts of [`Attempt`]: the first; where it
    /// finds nothing clean in a small e-graph, a wider one; where the e-graph outgrew the node
    /// limit, one following element moves, or piece by piece ([`infer_by_pieces`]), or (a 0-d
    /// chain) a roomier one. Also records the relation of a fused linear's product. First, where
    /// the operator has a twin with a kept solution, that solution renamed and checked
    /// (`reuse`).
    #[allow(clippy::too_many_arguments)]
    fn infer_operator(
        &self,
        v: ValueId,
        t: &Tpl,
        expect: Option<&[RecExpr<Term>]>,
        (seeds, twins): (&[(Tpl, ValueId)], &[ValueId]),
        state: &HashMap<ValueId, State>,
        r: &mut NodeResult,
    ) -> State {
        let (imp, opts, spec_metas) = (self.imp, self.opts, self.spec_metas);
        let mut ins = Vec::new();
        tpl_values(t, &mut ins);
        // A chain of operators on 0-d values (a loss summed layer by layer).
        let scalar_chain = is_float_scalar(spec_metas, v)
            && ins
                .iter()
                .filter(|x| is_float_value(spec_metas, x.value))
                .all(|x| is_float_scalar(spec_metas, x.value));
        // Reuse only without expectation, outside 0-d chains (whose relations carry explored
        // values a renaming does not follow).
        let reusable = expect.is_none() && !scalar_chain;
        let twins: Vec<Arc<reuse::Solved>> = match self.solved.lock() {
            Ok(solved) if reusable => twins
                .iter()
                .filter_map(|w| solved.get(w).cloned())
                .collect(),
            _ => Vec::new(),
        };
        // The fast path: a placement rule, where every precondition holds (never with an
        // expectation, which is checked in an e-graph, nor with seeds, whose equations the
        // e-graph would use).
        let fast = ((opts.fast_path || opts.audit_fast_path) && reusable && seeds.is_empty())
            .then(|| fastpath::decide(imp, state, t))
            .flatten();
        if let Some(rel) = fast {
            if !opts.audit_fast_path {
                r.fast += 1;
                if keepable(t, &rel) {
                    self.keep_solution(v, (t, seeds), state, &rel, false, None);
                }
                return State::Related(rel);
            }
            let s = self.infer_by_egraph(v, t, expect, (seeds, &twins), state, r, scalar_chain);
            let fast = State::Related(rel);
            if fastpath::same_relation(&fast, &s) {
                r.fast += 1;
            } else {
                r.fast_differences.push(format!(
                    "{}: fast path {:?}, e-graph {:?}",
                    self.case.spec.value_name(v),
                    fast,
                    s
                ));
            }
            return s;
        }
        self.infer_by_egraph(v, t, expect, (seeds, &twins), state, r, scalar_chain)
    }

    /// [`Walk::infer_operator`] past the fast path: the twins' relations, else full inference.
    #[allow(clippy::too_many_arguments)]
    fn infer_by_egraph(
        &self,
        v: ValueId,
        t: &Tpl,
        expect: Option<&[RecExpr<Term>]>,
        (seeds, twins): (&[(Tpl, ValueId)], &[Arc<reuse::Solved>]),
        state: &HashMap<ValueId, State>,
        r: &mut NodeResult,
        scalar_chain: bool,
    ) -> State {
        let (imp, opts, rules) = (self.imp, self.opts, self.rules);
        let reusable = expect.is_none() && !scalar_chain;
        let lemmas = (&rules.first[..], &rules.wide[..]);
        if let Some(found) = reuse::reuse(imp, lemmas, opts, state, t, seeds, twins) {
            r.reused += 1;
            if found.widened {
                r.widened.push(v);
            }
            let used = Some(found.lemmas_used);
            self.keep_solution(v, (t, seeds), state, &found.rel, found.widened, used);
            return State::Related(found.rel);
        }
        let s = self.infer_afresh(v, t, expect, seeds, state, r, scalar_chain);
        if reusable {
            if let State::Related(rel) = &s {
                if keepable(t, rel) {
                    let widened = r.widened.contains(&v);
                    self.keep_solution(v, (t, seeds), state, rel, widened, None);
                }
            }
        }
        s
    }

    /// Keeps the solution of `v` (the operator `t` over `state`, related as `rel`) where a
    /// later operator names it as its twin; `used`: the lemmas its reuse check needed.
    fn keep_solution(
        &self,
        v: ValueId,
        (t, seeds): (&Tpl, &[(Tpl, ValueId)]),
        state: &HashMap<ValueId, State>,
        rel: &Rel,
        widened: bool,
        used: Option<Arc<[usize]>>,
    ) {
        if !self.keep.contains(&v) {
            return;
        }
        if let Some(solved) = reuse::Solved::new(t, seeds, state, rel, widened) {
            if let Ok(mut map) = self.solved.lock() {
                map.insert(v, Arc::new(solved.checked_with(used)));
            }
        }
    }

    /// [`Walk::infer_operator`] without a twin: the attempts of full inference.
    #[allow(clippy::too_many_arguments)]
    fn infer_afresh(
        &self,
        v: ValueId,
        t: &Tpl,
        expect: Option<&[RecExpr<Term>]>,
        seeds: &[(Tpl, ValueId)],
        state: &HashMap<ValueId, State>,
        r: &mut NodeResult,
        scalar_chain: bool,
    ) -> State {
        let (imp, opts, rules) = (self.imp, self.opts, self.rules);
        let mismatches = &mut r.mismatches;
        let mut ins = Vec::new();
        tpl_values(t, &mut ins);
        let mut attempt = |rules: &[Rewrite<Term, Shapes>], a: &Attempt| {
            let want = expect;
            infer_one(
                imp,
                rules,
                opts,
                state,
                t,
                want,
                mismatches,
                v,
                scalar_chain,
                seeds,
                a,
            )
        };
        let first = Attempt::default();
        let clock = Instant::now();
        let mut s = attempt(&rules.first, &first);
        r.attempts
            .push(attempt_time("first", clock, &first, clean_up_to_factor(&s)));
        // Neither clean nor a multiple of a clean expression, in a small e-graph:
        // once more with the wider steps (the sources of the ranks' views
        // explored, a rank's tensor taken as a multiple of a spec value), kept
        // only when it does better. Only here: on every operator they change which
        // of several equal relations is kept, and later operators depend on that
        // choice (llama's cp=2 full iteration stops verifying). And only where
        // every input relates (up to a factor): past the first operator without
        // a relation every consumer inherits the gap, and a second attempt there
        // repeated the work (a quarter of the llama tp=2 bug case's time).
        if !scalar_chain
            && first.peak_nodes.get() < WIDEN_BELOW_NODES
            && !clean_up_to_factor(&s)
            && inputs_relate_up_to_factor(state, &ins)
        {
            let wider = Attempt {
                widened: true,
                ..Attempt::default()
            };
            let clock = Instant::now();
            let wide = attempt(&rules.wide, &wider);
            r.attempts.push(attempt_time(
                "wide",
                clock,
                &wider,
                clean_up_to_factor(&wide),
            ));
            if clean_up_to_factor(&wide) {
                r.widened.push(v);
                s = wide;
            }
        }
        // An e-graph that outgrew the node limit without a relation: once more
        // with each round's element moves brought in with it, where a round left
        // some to later rounds (see `follow_element_moves`), then piece by piece
        // along a dim where the operands split; a 0-d chain, which
        // has no dim to split, once more with the wider attempt's limit. Such a
        // chain meets every rank's scalars at once: the 16-rank deepseek plan's
        // loss (each rank's loss and tp-reduced aux loss, summed over eight ranks)
        // relates at 28 thousand nodes in three seconds.
        if first.peak_nodes.get() >= opts.node_limit && !clean_up_to_factor(&s) {
            let retry = if scalar_chain {
                let roomier = Attempt {
                    roomier: true,
                    ..Attempt::default()
                };
                let clock = Instant::now();
                let found = attempt(&rules.first, &roomier);
                r.attempts.push(attempt_time(
                    "roomier",
                    clock,
                    &roomier,
                    clean_up_to_factor(&found),
                ));
                Some(found).filter(clean_up_to_factor)
            } else {
                let moves = Attempt {
                    follow_moves: true,
                    ..Attempt::default()
                };
                let followed = first
                    .moves_deferred
                    .get()
                    .then(|| {
                        let clock = Instant::now();
                        let found = attempt(&rules.first, &moves);
                        r.attempts.push(attempt_time(
                            "moves",
                            clock,
                            &moves,
                            clean_up_to_factor(&found),
                        ));
                        found
                    })
                    .filter(clean_up_to_factor);
                followed.or_else(|| {
                    let log = PieceLog::default();
                    let clock = Instant::now();
                    let found =
                        infer_by_pieces(imp, &rules.pieces, opts, state, t, v, seeds, 0, &log);
                    let clean = found.as_ref().is_some_and(clean_up_to_factor);
                    let steps = log.steps.take().join(", ");
                    r.attempts.push(format!(
                        "{} [{steps}]",
                        attempt_time("pieces", clock, &Attempt::default(), clean)
                    ));
                    r.pieces_reused += log.reused.get();
                    found
                })
            };
            if let Some(r) = retry {
                s = r;
            }
        }
        // Only such a chain carries its explored scalars: a reduction of a tensor
        // brings in dozens, which would crowd its consumers' e-graphs to the node
        // limit.
        if let State::Related(r) = &mut s {
            if !scalar_chain {
                r.explored.clear();
            }
        }
        // A fused linear (addmm: a product plus a bias) without a clean relation:
        // the product's own relation is the evidence a missing or late reduction
        // leaves, as it is for an unfused product.
        if !matches!(&s, State::Related(r) if r.clean) {
            if let Some(product) = fused_product(t) {
                let p = infer_one(
                    imp,
                    &rules.first,
                    opts,
                    state,
                    product,
                    None,
                    mismatches,
                    v,
                    false,
                    &[],
                    &Attempt::default(),
                );
                r.products.push((v, p));
            }
        }
        s
    }

    /// The verdict, before the walk past spec node `done` when it is already settled (fast
    /// refutation, issue 48): the checked outputs before the first one that fails all relate
    /// cleanly as expected, and that one either relates cleanly but not as the case expects
    /// (a clean relation is final, and its diagnosis reads nothing downstream) or is refuted
    /// on the strongest evidence (see `strong_evidence`), which names a bug in what the ranks
    /// compute up to there. Operators further on cannot change that output's relation: only
    /// a later view of a value can (`view_back`), so an output, or an input of the operator
    /// blamed, that a later view still reads waits for it. `None` when the walk goes on.
    fn settled_early(
        &self,
        grown: &Grown,
        outcome: &Outcome,
        needed: &[bool],
        done: usize,
    ) -> Option<Outcome> {
        let spec = &self.case.spec;
        let deciding = self.checked.iter().map(|c| c.0).find(|v| {
            !matches!(grown.state.get(v), Some(State::Related(r)) if r.clean && !grown.mismatches.contains_key(v))
        })?;
        grown.state.get(&deciding)?;
        let viewed_later = |x: &ValueId| {
            self.spec_users
                .get(x.node)
                .into_iter()
                .flatten()
                .any(|&u| u > done && needed[u] && views_back(&spec.nodes[u]))
        };
        if viewed_later(&deciding) {
            return None;
        }
        let settled = self.conclude(grown, outcome.clone());
        // The whole diagnosis is what the full walk would give: any verdict, any hint.
        if self.diagnosis_final(grown, needed, done, deciding) {
            return Some(settled);
        }
        let f = settled.failure.as_ref()?;
        let strong =
            settled.verdict == Verdict::Refuted && f.hint.as_deref().is_some_and(strong_evidence);
        if !strong && settled.unmet_expectation.is_none() {
            return None;
        }
        let blamed = spec.find(&f.operator)?;
        if spec.nodes[blamed.node].inputs().iter().any(viewed_later) {
            return None;
        }
        Some(settled)
    }

    /// Whether the diagnosis of the failing checked output `deciding` ([`Walk::conclude`],
    /// `blame`) reads nothing the walk past spec node `done` can change, so that it is the
    /// full walk's whatever its verdict or hint. `blame` walks back from the output through
    /// float values without a clean relation (`walked`, here taken without its pruning, a
    /// superset) and reads their states, their inputs' and the impl's. A clean relation is
    /// final; one that is not changes later only by a view carried back onto it
    /// (`view_back`), so no later view may read a walked value. And `blame` asks of each
    /// walked value but the output whether some spec value computed from it relates cleanly
    /// (`has_clean_descendant`), which the operators after `done` may answer: none of them may
    /// be reachable from a walked value. A loss refuted where its inputs relate (microbatches
    /// paired wrongly, a missing average) then settles the verdict before the backward.
    fn diagnosis_final(
        &self,
        grown: &Grown,
        needed: &[bool],
        done: usize,
        deciding: ValueId,
    ) -> bool {
        let spec = &self.case.spec;
        let is_clean =
            |v: &ValueId| matches!(grown.state.get(v), Some(State::Related(r)) if r.clean);
        let mut walked: HashSet<ValueId> = HashSet::new();
        let mut stack = vec![deciding];
        while let Some(v) = stack.pop() {
            if !walked.insert(v) {
                continue;
            }
            stack.extend(spec.nodes[v.node].inputs().into_iter().filter(|x| {
                grown.state.contains_key(x) && !is_clean(x) && is_float_value(self.spec_metas, *x)
            }));
        }
        let viewed_later = walked.iter().any(|x| {
            self.spec_users
                .get(x.node)
                .into_iter()
                .flatten()
                .any(|&u| u > done && needed[u] && views_back(&spec.nodes[u]))
        });
        if viewed_later {
            return false;
        }
        // Forward from the walked values but the output: no needed operator after `done`.
        let mut reached = vec![false; spec.nodes.len()];
        for (n, node) in spec.nodes.iter().enumerate() {
            reached[n] = node
                .inputs()
                .iter()
                .any(|i| (i.node < n && reached[i.node]) || (*i != deciding && walked.contains(i)));
            if reached[n] && n > done && needed[n] {
                return false;
            }
        }
        true
    }

    /// The verdict (Listing 1, lines 6 and 9): certificates when every checked output has a
    /// clean relation (meeting its expectation), else the first output without one, localized
    /// by [`blame`] and refuted only where its evidence names a bug class.
    fn conclude(&self, grown: &Grown, mut outcome: Outcome) -> Outcome {
        let (case, imp, state) = (self.case, self.imp, &grown.state);
        let spec = &case.spec;
        let blame_at = |v, name: &str| {
            blame(
                case,
                imp,
                state,
                &grown.products,
                self.spec_metas,
                &grown.widened,
                v,
                name,
                Detail::Report,
            )
        };
        for &(v, _) in self.checked {
            let name = spec.value_name(v).to_string();
            match state.get(&v) {
                Some(State::Related(r)) if r.clean && !grown.mismatches.contains_key(&v) => {
                    outcome.certificate.push(Certificate {
                        tensor: name,
                        relations: certificate_exprs(&r.exprs)
                            .map(|e| render(e, e.as_ref().len() - 1))
                            .collect(),
                    });
                }
                Some(State::Blocked(m)) => {
                    outcome.reason = Some(format!(
                        "`{name}` depends on an operator the engine cannot interpret: {m}"
                    ));
                    outcome.verdict = Verdict::Inconclusive;
                    return outcome;
                }
                Some(State::Unrelated(m)) => {
                    outcome.reason = Some(format!("`{name}` cannot be related: {m}"));
                    outcome.verdict = Verdict::Inconclusive;
                    return outcome;
                }
                Some(State::Lost(m)) => {
                    // Relations stopped upstream and the computed expressions outgrew the limit: a
                    // verdict only where the evidence at the stopping point names a bug class.
                    let f = blame_at(v, &name);
                    // Only the strongest evidence (see `strong_evidence`).
                    if f.hint.as_deref().is_some_and(strong_evidence) {
                        outcome.failure = Some(f);
                        outcome.verdict = Verdict::Refuted;
                        return undecided_by_constants(outcome, imp);
                    }
                    outcome.reason = Some(format!(
                        "`{name}` cannot be related: relations stop at spec operator `{}` ({}) and {m}; no known bug pattern matches there, so this may be a missing lemma{}",
                        f.operator,
                        f.op,
                        f.other_stops_clause()
                    ));
                    outcome.verdict = Verdict::Inconclusive;
                    return outcome;
                }
                Some(State::Related(r)) if r.clean => {
                    // A clean relation that is not the expected one: a wrong placement, or a lemma
                    // the library lacks between the two expressions. Only a concrete run can tell
                    // (see `Outcome::unmet_expectation`), so the engine alone stays undecided.
                    let mut f = blame_at(v, &name);
                    let (want, found) = &grown.mismatches[&v];
                    let found = found.as_deref().unwrap_or("something else");
                    f.hint = Some(format!(
                        "the case expects `{name}` = {want}, but it is {found}"
                    ));
                    outcome.reason = Some(format!(
                        "the case expects `{name}` = {want}, but its relation is {found}, and no lemma relates the two: a wrong expectation, or a lemma the library lacks"
                    ));
                    outcome.failure = Some(f);
                    outcome.unmet_expectation = Some(name);
                    outcome.verdict = Verdict::Inconclusive;
                    return undecided_by_constants(outcome, imp);
                }
                _ => {
                    // The output is only computed, not rebuilt. A bug, or a lemma the library lacks:
                    // refuted only where the evidence at the stopping point names a bug class.
                    let f = blame_at(v, &name);
                    if f.hint.is_none() {
                        outcome.reason = Some(format!(
                            "`{name}` has no clean relation: relations stop at spec operator `{}` ({}), and no known bug pattern matches there, so this may be a missing lemma{} (`--trace` shows every relation){}",
                            f.operator,
                            f.op,
                            f.other_stops_clause(),
                            f.not_computed.as_ref().map(|n| format!("; {n}")).unwrap_or_default()
                        ));
                        outcome.failure = Some(f);
                        outcome.verdict = Verdict::Inconclusive;
                        return undecided_by_constants(outcome, imp);
                    }
                    outcome.failure = Some(f);
                    outcome.verdict = Verdict::Refuted;
                    return undecided_by_constants(outcome, imp);
                }
            }
        }
        outcome.verdict = Verdict::Verified;
        outcome
    }
}
