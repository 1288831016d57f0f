//! Relations and states: what inference knows about each spec tensor ([`State`], [`Rel`]), and
//! the implementation side those relations are over ([`Impl`]: the ranks' lowered operators,
//! their consumers, canonical values and constants), with the helpers that put relations and
//! implementation terms into an e-graph.

use super::extract::CLEAN_OPS;
use crate::kinds::{self, Abs, Kind, ZeroBlocks};
use crate::lemmas::{Graph, SCALE};
use crate::lower::{lower, LowerCtx, Lowered, Tpl, ValueRef};
use crate::term::{is_leaf, is_op, leaf_symbol, Term, LIST};
use egg::{Id, Language, RecExpr, Symbol};
use shardproof_case::Case;
use shardproof_interp::infer_graph;
use shardproof_ir::{NodeKind, OpName, ValueId};
use shardproof_ops::Meta;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};

/// A spec tensor's relation: expressions over implementation tensors (all equal to it), and
/// what the next operators need to reach the ranks' tensors from them.
#[derive(Clone, Debug)]
pub(super) struct Rel {
    /// The expressions, simplest first.
    pub(super) exprs: Vec<RecExpr<Term>>,
    /// Whether they are clean (only leaves, layout operators and rank reductions).
    pub(super) clean: bool,
    /// Groups of implementation tensors proven equal (replicas) among those the expressions
    /// use, so the next operator knows every rank's copy.
    pub(super) equal_leaves: Vec<Vec<Symbol>>,
    /// Groups of slices of implementation tensors (and tensors) proven equal, among those the
    /// expressions use: a chunk that one rank holds whole and another as a slice of a larger
    /// tensor (context parallelism's load-balanced chunks) keeps both names.
    pub(super) equal_slices: Vec<Vec<RecExpr<Term>>>,
    /// The implementation's 0-d float values that the inference of a relation without a clean
    /// expression brought in (and those its inputs carried): the next operator starts from
    /// their definitions. A loss the spec sums layer by layer while each pipeline stage sums
    /// its own layers first is clean only at the stages' final reduction, a chain of one
    /// addition per layer deeper than one operator's exploration rounds reach.
    pub(super) explored: Vec<ValueRef>,
}

impl Rel {
    /// Adds the groups of equal tensors and slices that `other` carries.
    pub(super) fn take_equalities(&mut self, other: &Rel) {
        self.equal_leaves.extend(other.equal_leaves.iter().cloned());
        self.equal_slices.extend(other.equal_slices.iter().cloned());
    }

    /// A relation by these expressions alone, with no equal tensors or explored values.
    pub(super) fn of(exprs: Vec<RecExpr<Term>>, clean: bool) -> Rel {
        Rel {
            exprs,
            clean,
            equal_leaves: Vec::new(),
            equal_slices: Vec::new(),
            explored: Vec::new(),
        }
    }
}

/// What inference knows about a spec tensor (its entry in the relation R of Listing 1).
#[derive(Clone, Debug)]
pub(super) enum State {
    /// A relation, clean or not.
    Related(Rel),
    /// No relation: an input the case does not relate, or beyond a non-clean expression cap.
    Unrelated(String),
    /// Beyond the size limit of non-clean expressions: relations stopped somewhere upstream.
    Lost(String),
    /// An operator without meaning feeds it.
    Blocked(String),
}

/// The implementation as inference reads it ([`build_impl`]): the ranks' programs lowered to
/// terms once, with what exploration looks up.
pub(super) struct Impl<'a> {
    /// The case.
    pub(super) case: &'a Case,
    /// Per rank, node and output: its inferred meta.
    pub(super) metas: Vec<Vec<Vec<Option<Meta>>>>,
    /// Every rank value's lowering (the cut values have none).
    pub(super) lowered: HashMap<ValueRef, Lowered>,
    /// Aliases (views that rename, recvs) to the value at the end of their chain.
    pub(super) canon: HashMap<ValueRef, ValueRef>,
    /// Per canonical rank value: the (rank, node) terms that read it.
    pub(super) consumers: HashMap<ValueRef, Vec<(usize, usize)>>,
    /// Per canonical rank value: the (rank, node) calls lowered as its aliases (a `clone`, a
    /// multiplication by 1), which `consumers` leaves out, in rank and program order.
    pub(super) alias_calls: HashMap<ValueRef, Vec<(usize, usize)>>,
    /// Rank values computed from constants only.
    pub(super) const_only: HashSet<ValueRef>,
    /// Rank values of the case's cuts (`inputs:` entries that are no graph inputs): leaves,
    /// their producers never lowered.
    pub(super) cut: HashSet<ValueRef>,
    /// Module constants of unknown value (see [`unknown_constants`]).
    pub(super) unknown_consts: HashSet<ValueRef>,
    /// The blocks of rank tensors the ranks' programs make zero.
    pub(super) zeros: Arc<ZeroBlocks>,
    /// Per rank: each value's name, to its value ([`Impl::find`]).
    names: Vec<HashMap<String, ValueId>>,
    /// Per operator name: the (rank, node) calls of it ([`Impl::calls_of`]).
    calls: HashMap<String, Vec<(usize, usize)>>,
    /// Where each rank tensor's partial sum goes, per split into summands, once computed
    /// ([`super::evidence::reduction_path`], a function of the program alone). Fast refutation
    /// diagnoses every unclean value of a correct plan, and the same residual-stream tensors
    /// recur in them: in the 8-layer llama3-70b-tiny, 20824 searches over 4640 distinct ones.
    pub(super) reduction_paths: ReductionPaths,
    /// The program as that search walks it, once (see `evidence::SearchGraph`).
    pub(super) search_graph: OnceLock<super::evidence::SearchGraph>,
    /// Per canonical rank value, its neighbourhood once computed (`Impl::neighbourhood`): reuse
    /// asks it of every renamed tensor of every twin tried, and the same tensors recur.
    pub(super) neighbourhoods: Mutex<HashMap<ValueRef, Arc<Neighbourhood<'a>>>>,
}

/// The operators consuming a rank value and, for each, those consuming its outputs, by name,
/// sorted (`Impl::neighbourhood`).
pub(super) type Neighbourhood<'a> = Vec<(Option<&'a OpName>, Vec<Option<&'a OpName>>)>;

/// The memo of [`Impl::reduction_paths`]: per tensor and summands, the search's answer.
pub(super) type ReductionPaths =
    Mutex<HashMap<(ValueRef, Vec<BTreeSet<usize>>), super::evidence::ReductionPath>>;

impl Impl<'_> {
    pub(super) fn canon(&self, v: ValueRef) -> ValueRef {
        self.canon.get(&v).copied().unwrap_or(v)
    }

    pub(super) fn meta(&self, v: ValueRef) -> Option<Meta> {
        let r = v.rank?;
        self.metas[r]
            .get(v.value.node)?
            .get(v.value.output)?
            .clone()
    }

    /// The value of rank `r` named `name`: `Graph::find`, from an index (relations name
    /// tensors, and a scan of the rank's program per name grows with the model's depth).
    pub(super) fn find(&self, r: usize, name: &str) -> Option<ValueId> {
        self.names.get(r)?.get(name).copied()
    }

    /// The (rank, node) calls of operator `op` (`aten.mm.default`), in rank and program order:
    /// from an index, since the evidence checks look up the counterparts of a spec operator
    /// for every unclean value fast refutation diagnoses, and a scan of every rank's program
    /// per look-up made a deep model's walk quadratic in its depth.
    pub(super) fn calls_of(&self, op: &str) -> &[(usize, usize)] {
        self.calls.get(op).map_or(&[], Vec::as_slice)
    }

    pub(super) fn name(&self, v: ValueRef) -> String {
        let g = &self.case.program.ranks[v.rank.unwrap_or(0)];
        g.value_name(v.value).to_string()
    }

    pub(super) fn leaf(&self, eg: &mut Graph, v: ValueRef) -> Id {
        let v = self.canon(v);
        let sym = Symbol::from(leaf_symbol(v.rank.unwrap_or(0), &self.name(v)));
        self.describe_leaf(eg, sym, v);
        eg.add(Term::Op(sym, Vec::new()))
    }

    /// Tells the e-graph's analysis about leaf `sym`, the rank tensor `v`: its meta, and
    /// where it is computed (the extraction's preference).
    pub(super) fn describe_leaf(&self, eg: &mut Graph, sym: Symbol, v: ValueRef) {
        if let Some(m) = self.meta(v) {
            eg.analysis.leaves.insert(sym, m);
        }
        eg.analysis
            .positions
            .insert(sym, (v.value.node, v.rank.unwrap_or(0)));
    }

    /// Inputs (canonical) of an impl node's term.
    pub(super) fn term_inputs(&self, v: ValueRef) -> Vec<ValueRef> {
        let mut out = Vec::new();
        if let Some(Lowered::Term(t)) = self.lowered.get(&v) {
            tpl_values(t, &mut out);
        }
        out.into_iter().map(|x| self.canon(x)).collect()
    }
}

pub(super) fn tpl_values(t: &Tpl, out: &mut Vec<ValueRef>) {
    match t {
        Tpl::Value(v) => out.push(*v),
        Tpl::Num(_) => {}
        Tpl::Op(_, kids) => kids.iter().for_each(|k| tpl_values(k, out)),
    }
}

pub(super) fn add_tpl(
    eg: &mut Graph,
    t: &Tpl,
    value: &mut dyn FnMut(&mut Graph, ValueRef) -> Id,
) -> Id {
    match t {
        Tpl::Value(v) => value(eg, *v),
        Tpl::Num(n) => eg.add(Term::Num(*n)),
        Tpl::Op(s, kids) => {
            let ids = kids.iter().map(|k| add_tpl(eg, k, value)).collect();
            eg.add(Term::Op(Symbol::from(s.as_str()), ids))
        }
    }
}

/// The implementation's module constants whose values neither the case nor the captured
/// source gives, among the ancestors (up to cuts) of the implementation tensors the check
/// compares: the expected outputs' tensors, or every graph output.
fn unknown_constants(case: &Case, ctx: &LowerCtx, cut: &HashSet<ValueRef>) -> Vec<ValueRef> {
    let mut out = Vec::new();
    for (r, g) in case.program.ranks.iter().enumerate() {
        let mut stack: Vec<ValueId> = if case.outputs.is_empty() {
            g.outputs.iter().flatten().copied().collect()
        } else {
            case.outputs
                .iter()
                .filter_map(|o| o.rank_values.iter().find(|(q, _)| *q == r).map(|p| p.1))
                .collect()
        };
        let mut seen = vec![false; g.nodes.len()];
        while let Some(v) = stack.pop() {
            if std::mem::replace(&mut seen[v.node], true)
                || cut.contains(&ValueRef {
                    rank: Some(r),
                    value: v,
                })
            {
                continue;
            }
            let node = &g.nodes[v.node];
            if let NodeKind::Constant { .. } = &node.kind {
                if crate::lower::scalar_constant(ctx, g, v, false).is_none() {
                    out.push(ValueRef {
                        rank: Some(r),
                        value: v,
                    });
                }
            }
            stack.extend(node.inputs().iter().copied());
        }
    }
    out
}

pub(super) fn build_impl<'a>(case: &'a Case, ctx: &LowerCtx) -> Impl<'a> {
    let metas: Vec<_> = case
        .program
        .ranks
        .iter()
        .map(|g| infer_graph(g, &case.ops).metas)
        .collect();
    let mut cut = HashSet::new();
    for r in &case.inputs {
        if r.cut {
            for &(rank, v) in &r.rank_values {
                cut.insert(ValueRef {
                    rank: Some(rank),
                    value: v,
                });
            }
        }
    }
    let mut lowered = HashMap::new();
    for (r, g) in case.program.ranks.iter().enumerate() {
        for (n, node) in g.nodes.iter().enumerate() {
            for k in 0..node.outputs.len() {
                let v = ValueRef {
                    rank: Some(r),
                    value: ValueId::new(n, k),
                };
                // Every leaf symbol is interned here, in program order, before any pass
                // could intern it in a hash map's order: the e-graph orders a class's nodes
                // by symbol number, so the numbering decides which of equal relations is kept,
                // and it must not change from run to run.
                let _ = Symbol::from(leaf_symbol(r, g.value_name(v.value)));
                if !cut.contains(&v) {
                    lowered.insert(v, lower(ctx, g, &metas[r], Some(r), n, k));
                }
            }
        }
    }
    // Aliases resolve to the value at the end of their chain. A recv aliases a tensor of
    // another rank, possibly one lowered later, so chains are followed after lowering.
    let mut canon: HashMap<ValueRef, ValueRef> = HashMap::new();
    for (&v, low) in &lowered {
        if let Lowered::Alias(a) = low {
            let mut target = *a;
            let mut steps = 0;
            while let Some(Lowered::Alias(next)) = lowered.get(&target) {
                target = *next;
                steps += 1;
                if steps > lowered.len() {
                    break;
                }
            }
            canon.insert(v, target);
        }
    }
    let mut alias_calls: HashMap<ValueRef, Vec<(usize, usize)>> = HashMap::new();
    for (v, target) in &canon {
        if let Some(r) = v.rank {
            alias_calls
                .entry(*target)
                .or_default()
                .push((r, v.value.node));
        }
    }
    for calls in alias_calls.values_mut() {
        calls.sort_unstable();
        calls.dedup();
    }
    let mut consumers: HashMap<ValueRef, Vec<(usize, usize)>> = HashMap::new();
    let mut terms: Vec<(ValueRef, Vec<ValueRef>)> = Vec::new();
    for (r, g) in case.program.ranks.iter().enumerate() {
        for (n, node) in g.nodes.iter().enumerate() {
            for k in 0..node.outputs.len() {
                let v = ValueRef {
                    rank: Some(r),
                    value: ValueId::new(n, k),
                };
                let Some(Lowered::Term(t)) = lowered.get(&v) else {
                    continue;
                };
                let mut ins = Vec::new();
                tpl_values(t, &mut ins);
                let ins: Vec<ValueRef> = ins
                    .iter()
                    .map(|x| canon.get(x).copied().unwrap_or(*x))
                    .collect();
                let mut seen = HashSet::new();
                for &x in &ins {
                    if seen.insert(x) {
                        consumers.entry(x).or_default().push((r, n));
                    }
                }
                terms.push((v, ins));
            }
        }
    }
    // Terms over constants only, to a fixpoint: across ranks, program order is no
    // topological order.
    let mut const_only = HashSet::new();
    loop {
        let before = const_only.len();
        for (v, ins) in &terms {
            if !const_only.contains(v) && ins.iter().all(|x| const_only.contains(x)) {
                const_only.insert(*v);
            }
        }
        if const_only.len() == before {
            break;
        }
    }
    let unknown_consts = unknown_constants(case, ctx, &cut).into_iter().collect();
    let mut imp = Impl {
        case,
        metas,
        lowered,
        canon,
        consumers,
        alias_calls,
        const_only,
        cut,
        unknown_consts,
        zeros: Arc::default(),
        names: case.program.ranks.iter().map(|g| name_index(g)).collect(),
        calls: call_index(case),
        reduction_paths: Mutex::default(),
        search_graph: OnceLock::new(),
        neighbourhoods: Mutex::default(),
    };
    imp.zeros = Arc::new(zero_blocks(&imp));
    imp
}

/// Each value of `g` by name; the first node's where names repeat, as `Graph::find` answers.
fn name_index(g: &shardproof_ir::Graph) -> HashMap<String, ValueId> {
    let mut index = HashMap::new();
    for (n, node) in g.nodes.iter().enumerate() {
        for (k, o) in node.outputs.iter().enumerate() {
            index.entry(o.name.clone()).or_insert(ValueId::new(n, k));
        }
    }
    index
}

/// Every rank's operator calls by operator name, in rank and program order.
fn call_index(case: &Case) -> HashMap<String, Vec<(usize, usize)>> {
    let mut index: HashMap<String, Vec<(usize, usize)>> = HashMap::new();
    for (r, g) in case.program.ranks.iter().enumerate() {
        for (n, node) in g.nodes.iter().enumerate() {
            if let Some(op) = node.op() {
                index.entry(op.to_string()).or_default().push((r, n));
            }
        }
    }
    index
}

/// The element analysis of every rank tensor ([`crate::kinds`]), kept where it found zeros.
fn zero_blocks(imp: &Impl) -> ZeroBlocks {
    let mut done: HashMap<ValueRef, Option<Arc<Abs>>> = HashMap::new();
    let mut visiting: HashSet<ValueRef> = HashSet::new();
    for (r, g) in imp.case.program.ranks.iter().enumerate() {
        for (n, node) in g.nodes.iter().enumerate() {
            for k in 0..node.outputs.len() {
                let v = imp.canon(ValueRef {
                    rank: Some(r),
                    value: ValueId::new(n, k),
                });
                // Depth-first, with an explicit stack: a model's chain of values is longer
                // than the call stack allows.
                let mut stack = vec![(v, false)];
                while let Some((x, ready)) = stack.pop() {
                    if done.contains_key(&x) {
                        continue;
                    }
                    let t = match imp.lowered.get(&x) {
                        Some(Lowered::Term(t)) => t,
                        Some(Lowered::Leaf) => {
                            let is_input =
                                matches!(g_node(imp, x).map(|n| &n.kind), Some(NodeKind::Input));
                            // Inputs are finite reals; module constants of unstated value and
                            // cut values could be anything.
                            let a = imp.meta(x).map(|m| {
                                let kind = if is_input && m.dtype.is_float() {
                                    Kind::Finite
                                } else {
                                    Kind::Any
                                };
                                Arc::new(Abs::Uniform(m, kind))
                            });
                            done.insert(x, a);
                            continue;
                        }
                        _ => {
                            done.insert(x, None);
                            continue;
                        }
                    };
                    if ready {
                        visiting.remove(&x);
                        let a =
                            kinds::interpret(t, &|y| done.get(&imp.canon(y)).cloned().flatten());
                        done.insert(x, a.map(Arc::new));
                        continue;
                    }
                    if !visiting.insert(x) {
                        done.insert(x, None);
                        continue;
                    }
                    stack.push((x, true));
                    let mut ins = Vec::new();
                    tpl_values(t, &mut ins);
                    for i in ins {
                        let i = imp.canon(i);
                        if !done.contains_key(&i) {
                            stack.push((i, false));
                        }
                    }
                }
            }
        }
    }
    ZeroBlocks::new(done.into_iter().filter_map(|(v, a)| {
        let a = a?;
        Some((Symbol::from(leaf_symbol(v.rank?, &imp.name(v))), a))
    }))
}

/// The graph node of an implementation value.
fn g_node<'a>(imp: &'a Impl, v: ValueRef) -> Option<&'a shardproof_ir::Node> {
    imp.case.program.ranks.get(v.rank?)?.nodes.get(v.value.node)
}

/// Adds a relation's expressions (all equal) and its equal leaves and slices; returns the class
/// of its expressions.
pub(super) fn add_relation(eg: &mut Graph, imp: &Impl, r: &Rel) -> Id {
    let mut first = None;
    for e in &r.exprs {
        let id = add_rec(eg, imp, e);
        match first {
            None => first = Some(id),
            Some(f) => {
                eg.union(f, id);
            }
        }
    }
    for group in &r.equal_leaves {
        let ids: Vec<Id> = group
            .iter()
            .map(|s| {
                let mut e = RecExpr::default();
                e.add(Term::Op(*s, vec![]));
                add_rec(eg, imp, &e)
            })
            .collect();
        for w in ids.windows(2) {
            eg.union(w[0], w[1]);
        }
    }
    for group in &r.equal_slices {
        let ids: Vec<Id> = group.iter().map(|e| add_rec(eg, imp, e)).collect();
        for w in ids.windows(2) {
            eg.union(w[0], w[1]);
        }
    }
    first.expect("a relation has an expression")
}

/// Whether a relation is a constant multiple of a clean expression.
pub(super) fn scaled_clean(s: Option<&State>) -> bool {
    let Some(State::Related(r)) = s else {
        return false;
    };
    let Some(e) = r.exprs.first() else {
        return false;
    };
    let nodes = e.as_ref();
    // Clean as `extract` means it: layout operators and reductions over rank tensors, with
    // constant subterms (a zero fill) anywhere.
    let mut reads_rank = vec![false; nodes.len()];
    for (i, n) in nodes.iter().enumerate() {
        reads_rank[i] = is_leaf(n) || n.children().iter().any(|&k| reads_rank[usize::from(k)]);
    }
    matches!(nodes.last(), Some(Term::Op(s, _)) if is_op!(s, SCALE))
        && nodes[..nodes.len() - 1]
            .iter()
            .enumerate()
            .all(|(i, n)| match n {
                Term::Num(_) => true,
                Term::Op(s, k) => {
                    k.is_empty()
                        || CLEAN_OPS.contains(&s.as_str())
                        || is_op!(s, LIST)
                        || !reads_rank[i]
                }
            })
}

pub(super) fn add_rec(eg: &mut Graph, imp: &Impl, e: &RecExpr<Term>) -> Id {
    let mut ids: Vec<Id> = Vec::with_capacity(e.as_ref().len());
    for node in e.as_ref() {
        let n = node.clone().map_children(|c| ids[usize::from(c)]);
        if let Term::Op(s, kids) = &n {
            if kids.is_empty() {
                if let Some((r, name)) = crate::term::parse_leaf(s.as_str()) {
                    if let Some(v) = imp.find(r, name) {
                        let v = ValueRef {
                            rank: Some(r),
                            value: v,
                        };
                        imp.describe_leaf(eg, *s, v);
                    }
                }
            }
        }
        ids.push(eg.add(n));
    }
    *ids.last().expect("non-empty expression")
}

/// Whether every input's relation is clean, or a constant multiple of a clean expression: the
/// operator is the first one without a relation along its chain.
pub(super) fn inputs_relate_up_to_factor(
    state: &HashMap<ValueId, State>,
    ins: &[ValueRef],
) -> bool {
    ins.iter()
        .all(|x| state.get(&x.value).is_some_and(clean_up_to_factor))
}

/// Whether a relation is clean, or a constant multiple of a clean expression.
pub(super) fn clean_up_to_factor(s: &State) -> bool {
    matches!(s, State::Related(r) if r.clean) || scaled_clean(Some(s))
}
