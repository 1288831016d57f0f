//! One spec operator's relation (Listing 2, `compute_node_out_rel`): its e-graph built from its
//! inputs' relations, explored and saturated with the lemmas within the node budget, and its
//! output's clean expressions (or the best unclean one) kept as its relation. Also the budget
//! itself: node and size limits, the wider and roomier attempts.

use super::explore::{
    define_scaled_consumers, explore, latest_scalars, scalar_frontier, COMBINE_ABOVE_NODES,
};
use super::extract::{extract, leaf_groups, slice_groups, MAX_EXTRACT_DEPTH};
use super::pieces::fold_nested_scales;
use super::relation::{add_rec, add_relation, add_tpl, tpl_values, Impl, Rel, State};
use super::report::render;
use super::seeds::{nested_slices, seed_spec_equations, spec_form};
use super::Options;
use crate::lemmas::{Graph, SCALE};
use crate::lower::{Tpl, ValueRef};
use crate::term::{is_op, Shapes, Term};
use egg::{Id, RecExpr, Rewrite, Symbol};
use shardproof_ir::ValueId;
use std::collections::{HashMap, HashSet};

/// An empty e-graph over the implementation's tensors.
pub(super) fn new_graph(imp: &Impl) -> Graph {
    Graph::new(Shapes {
        zeros: imp.zeros.clone(),
        ..Shapes::default()
    })
}

/// A saturation run's wall-clock limit: far above what the node and iteration limits allow on
/// an idle machine, so that those limits, not the machine's load, decide where a run stops (a
/// 10 s limit made context-parallel cases inconclusive on a loaded machine).
const SATURATION_WALL_CLOCK: std::time::Duration = std::time::Duration::from_secs(120);

/// Infers the relations of one spec value defined by `t` (Listing 2, `compute_node_out_rel`):
/// step 1 puts the operator over its inputs' relations into a fresh e-graph; steps 2 and 3
/// saturate it with the lemmas while [`explore`] brings in the implementation's operators over
/// related tensors; step 4 keeps its output's clean expressions ([`relation_of`]).
#[allow(clippy::too_many_arguments)]
pub(super) fn infer_one(
    imp: &Impl,
    rules: &[Rewrite<Term, Shapes>],
    opts: &Options,
    state: &HashMap<ValueId, State>,
    t: &Tpl,
    expect: Option<&[RecExpr<Term>]>,
    mismatches: &mut HashMap<ValueId, (String, Option<String>)>,
    v: ValueId,
    scalar_chain: bool,
    seeds: &[(Tpl, ValueId)],
    attempt: &Attempt,
) -> State {
    let mut ins = Vec::new();
    tpl_values(t, &mut ins);
    for x in &ins {
        match state.get(&x.value) {
            Some(State::Related(_)) => {}
            Some(s) => return s.clone(),
            None => return State::Unrelated("an input was never computed".into()),
        }
    }
    // Step 1: the operator over its inputs' relations, and the spec equations it is seeded with.
    let mut eg = new_graph(imp);
    let mut ids: HashMap<ValueId, Id> = HashMap::new();
    for x in &ins {
        if ids.contains_key(&x.value) {
            continue;
        }
        let Some(State::Related(r)) = state.get(&x.value) else {
            unreachable!()
        };
        ids.insert(x.value, add_relation(&mut eg, imp, r));
    }
    seed_spec_equations(&mut eg, imp, state, seeds, &mut ids);
    if ins.is_empty() {
        // A constant: the term itself is its (clean) relation.
        let root = add_tpl(&mut eg, t, &mut |_, _| unreachable!());
        eg.rebuild();
        let e = extract(&eg, root, false).into_iter().next();
        return match e {
            Some(e) => State::Related(Rel {
                exprs: vec![e],
                clean: true,
                equal_leaves: Vec::new(),
                equal_slices: Vec::new(),
                explored: Vec::new(),
            }),
            None => State::Unrelated("constant".into()),
        };
    }
    let root = add_tpl(&mut eg, t, &mut |_, x| ids[&x.value]);
    let expect_ids: Vec<Id> = expect
        .unwrap_or(&[])
        .iter()
        .map(|e| add_rec(&mut eg, imp, e))
        .collect();

    // Steps 2 and 3: the lemmas and the implementation neighbourhood, round by round.
    let mut added = explore(
        &mut eg,
        imp,
        rules,
        opts,
        attempt,
        state,
        &ins,
        root,
        &expect_ids,
    );
    define_scaled_consumers(&mut eg, imp, root, &mut added);
    // Only along a chain of 0-d operators (a running sum of per-layer losses), and only where
    // the relation has grown: a reduction of a tensor to 0-d, and a small relation, keep what
    // the lemmas found.
    let sizeable = || {
        extract(&eg, root, false)
            .first()
            .is_some_and(|e| e.as_ref().len() > COMBINE_ABOVE_NODES)
    };
    if scalar_chain && sizeable() {
        let latest = latest_scalars(imp, &added);
        let candidates: Vec<Id> = latest.into_iter().map(|v| imp.leaf(&mut eg, v)).collect();
        crate::lemmas::express_by_combination(&mut eg, root, &candidates);
    }
    let root = eg.find(root);
    record_expectation(&eg, root, expect, &expect_ids, mismatches, v);
    // Step 4: the clean expressions of the output are its relation.
    relation_of(&mut eg, imp, state, t, root, &added, v)
}

/// One saturation run of the lemmas over `eg` within the attempt's node budget (the wider and
/// roomier attempts get [`WIDE_NODE_FACTOR`] times the limit), the zero blocks marked before
/// and between iterations and equal sums merged after; the attempt records its peak size.
pub(super) fn saturate(
    eg: &mut Graph,
    rules: &[Rewrite<Term, Shapes>],
    opts: &Options,
    attempt: &Attempt,
) {
    let widened = attempt.widened;
    // Also before the runner: its hooks run only while the limits allow an iteration, and
    // an e-graph at the node limit still gets this round's zero blocks.
    crate::lemmas::mark_zero_blocks(eg);
    eg.rebuild();
    let node_limit = if widened || attempt.roomier {
        opts.node_limit.saturating_mul(WIDE_NODE_FACTOR)
    } else {
        opts.node_limit
    };
    eg.analysis.node_cap = node_limit.saturating_mul(NODE_CAP_FACTOR);
    run_rules(
        eg,
        rules,
        RunLimits::new(opts.iter_limit, node_limit),
        |eg| {
            if crate::lemmas::mark_zero_blocks(eg) {
                eg.rebuild();
            }
            false
        },
    );
    attempt
        .peak_nodes
        .set(attempt.peak_nodes.get().max(eg.total_size()));
    crate::lemmas::merge_equal_sums(eg);
}

/// A rule's search limit before its first ban, and its first ban's length in iterations.
const MATCH_LIMIT: usize = 1_000;
const BAN_LENGTH: usize = 5;

/// Exponential rule backoff, with the settings and the decisions of egg's `BackoffScheduler`
/// at its defaults: a rule whose search finds more than its limit of matches is not applied
/// and is banned for some iterations; each ban doubles its limit and its next ban's length.
/// egg's keeps each rule's record in a map by rule name, looked up twice per rule and
/// iteration (6% of case-tp2's CPU); here it is a vector indexed by the rule's position.
/// Rules of the same name share one record, as they share one entry in egg's map.
struct Backoff {
    /// A rule's search limit before its first ban.
    limit: usize,
    /// Each rule's record, by the rule's position.
    record: Vec<usize>,
    bans: Vec<Ban>,
}

#[derive(Clone, Copy, Default)]
struct Ban {
    /// The first iteration the rule is searched again.
    until: usize,
    times: u32,
}

impl Backoff {
    fn new(rules: &[&Rewrite<Term, Shapes>], limit: usize) -> Backoff {
        let mut by_name: HashMap<Symbol, usize> = HashMap::new();
        let record = rules
            .iter()
            .map(|rw| {
                let next = by_name.len();
                *by_name.entry(rw.name).or_insert(next)
            })
            .collect();
        Backoff {
            limit,
            record,
            bans: vec![Ban::default(); by_name.len()],
        }
    }

    /// The matches of rule `k` to apply in `iteration`: none while it is banned, and none (the
    /// rule then banned) where they are more than its limit.
    fn search<'a>(
        &mut self,
        k: usize,
        iteration: usize,
        eg: &Graph,
        rw: &'a Rewrite<Term, Shapes>,
    ) -> Vec<egg::SearchMatches<'a, Term>> {
        let ban = &mut self.bans[self.record[k]];
        if iteration < ban.until {
            return Vec::new();
        }
        let limit = self.limit.checked_shl(ban.times).unwrap_or(usize::MAX);
        let matches = rw.search_with_limit(eg, limit.saturating_add(1));
        let found: usize = matches.iter().map(|m| m.substs.len()).sum();
        if found > limit {
            ban.until = iteration + BAN_LENGTH.checked_shl(ban.times).unwrap_or(usize::MAX);
            ban.times += 1;
            return Vec::new();
        }
        matches
    }

    /// Whether a run that applied nothing in `iteration` has saturated: no rule is banned.
    /// Otherwise the bans are brought forward so that the earliest one ends now.
    fn can_stop(&mut self, iteration: usize) -> bool {
        let banned = |b: &&mut Ban| b.until > iteration;
        let Some(earliest) = self.bans.iter_mut().filter(banned).map(|b| b.until).min() else {
            return true;
        };
        let skipped = earliest - iteration;
        for b in self.bans.iter_mut().filter(banned) {
            b.until -= skipped;
        }
        false
    }
}

/// The limits of one saturation run ([`run_rules`]).
pub(super) struct RunLimits {
    /// Iterations (search, apply, rebuild) at most.
    pub iterations: usize,
    /// The e-graph's size (`EGraph::total_size`) past which no further rule is applied.
    pub nodes: usize,
    /// A rule's search limit before its first ban ([`MATCH_LIMIT`]).
    pub matches: usize,
}

impl RunLimits {
    /// At most `iterations` iterations within `nodes`, rules banned past [`MATCH_LIMIT`].
    pub fn new(iterations: usize, nodes: usize) -> RunLimits {
        RunLimits {
            iterations,
            nodes,
            matches: MATCH_LIMIT,
        }
    }
}

/// egg's `Runner` loop with [`Backoff`], without a clock read per rule: egg's
/// runner checks all its limits, wall clock included, after applying each rule, and with
/// hundreds of rules and a few milliseconds per operator's e-graph those reads were 8-9% of
/// case-tp2's CPU. Here the node limit is still checked after each rule (an apply phase stops
/// at the first rule that takes the e-graph past it, as egg's does), the iteration limit before
/// each iteration, and the wall clock ([`SATURATION_WALL_CLOCK`], a guard against a runaway
/// run that the node and iteration limits keep out of reach) only before each iteration and
/// after each search phase. So the e-graph ends as egg's runner leaves it. `hook` runs before
/// each iteration's search, as egg's hooks do; returning true ends the run there.
///
/// Returns the positions in `rules` of the rules whose application changed the e-graph (a
/// union or a new node), ascending: a reuse check passes them on to the next layer's check
/// of the same operator, which tries them alone first (`reuse::check`).
pub(super) fn run_rules(
    eg: &mut Graph,
    rules: &[Rewrite<Term, Shapes>],
    limits: RunLimits,
    hook: impl FnMut(&mut Graph) -> bool,
) -> Vec<usize> {
    run_rule_refs(eg, &rules.iter().collect::<Vec<_>>(), limits, hook, None)
}

/// [`run_rules`] over rules picked from a larger set (a reuse check's first try). `done`, where
/// given, is asked after each rule's application too: true ends the run there, mid-iteration
/// (a reuse check's goals, met once their classes are one, stay met whatever follows).
pub(super) fn run_rule_refs(
    eg: &mut Graph,
    rules: &[&Rewrite<Term, Shapes>],
    limits: RunLimits,
    mut hook: impl FnMut(&mut Graph) -> bool,
    done: Option<&dyn Fn(&Graph) -> bool>,
) -> Vec<usize> {
    let started = std::time::Instant::now();
    let over_time = || started.elapsed() > SATURATION_WALL_CLOCK;
    let over_size = |eg: &Graph| eg.total_size() > limits.nodes;
    let mut scheduler = Backoff::new(rules, limits.matches);
    let mut changed_by = vec![false; rules.len()];
    let used = |changed_by: Vec<bool>| -> Vec<usize> {
        (0..rules.len()).filter(|&k| changed_by[k]).collect()
    };
    eg.rebuild();
    for iteration in 0..limits.iterations {
        if over_time() || over_size(eg) {
            return used(changed_by);
        }
        let before = (eg.total_size(), eg.number_of_classes());
        if hook(eg) {
            eg.rebuild();
            return used(changed_by);
        }
        let after_hook = (eg.total_size(), eg.number_of_classes());
        let matches: Vec<Vec<egg::SearchMatches<Term>>> = rules
            .iter()
            .enumerate()
            .map(|(k, rw)| scheduler.search(k, iteration, eg, rw))
            .collect();
        // A search changes nothing the node limit reads, so one check covers the phase (the
        // hook may have grown the e-graph).
        if over_time() || over_size(eg) {
            eg.rebuild();
            return used(changed_by);
        }
        let mut applied = false;
        let mut stopped = false;
        for (k, (rw, ms)) in rules.iter().zip(matches).enumerate() {
            if !ms.is_empty() {
                let nodes = eg.total_size();
                let changed = !rw.apply(eg, &ms).is_empty();
                applied |= changed;
                changed_by[k] |= changed || eg.total_size() != nodes;
                if changed && done.is_some_and(|done| done(eg)) {
                    eg.rebuild();
                    return used(changed_by);
                }
            }
            if over_size(eg) {
                stopped = true;
                break;
            }
        }
        eg.rebuild();
        let unchanged = before == after_hook && before == (eg.total_size(), eg.number_of_classes());
        // `can_stop` fast-forwards banned rules, so it is asked only where egg's runner asks.
        if stopped || (!applied && scheduler.can_stop(iteration) && unchanged) {
            return used(changed_by);
        }
    }
    used(changed_by)
}

/// Records whether the output's class meets the expected relations: a mismatch (what was
/// expected, what was found) where it does not, cleared where a retry meets them.
fn record_expectation(
    eg: &Graph,
    root: Id,
    expect: Option<&[RecExpr<Term>]>,
    expect_ids: &[Id],
    mismatches: &mut HashMap<ValueId, (String, Option<String>)>,
    v: ValueId,
) {
    // The record is the latest attempt's: a retry that meets the expectation clears it.
    if expect_ids.iter().all(|&e| eg.find(e) == root) {
        if !expect_ids.is_empty() {
            mismatches.remove(&v);
        }
    } else {
        let found = extract(eg, root, true)
            .first()
            .map(|e| render(e, e.as_ref().len() - 1));
        let want = expect
            .map(|e| render(&e[0], e[0].as_ref().len() - 1))
            .unwrap_or_default();
        mismatches.insert(v, (want, found));
    }
}

/// Step 4 of Listing 2: the relation of spec value `v` from the class `root` of its output
/// (the operator `t`): its clean expressions (with the equal leaves and slices they use), else
/// a constant multiple of clean ones, else its smallest expression within the size limit.
fn relation_of(
    eg: &mut Graph,
    imp: &Impl,
    state: &HashMap<ValueId, State>,
    t: &Tpl,
    root: Id,
    added: &HashSet<ValueRef>,
    v: ValueId,
) -> State {
    let mut clean = extract(eg, root, true);
    let mut named = false;
    if clean.is_empty() && crate::lemmas::ring::name_chunks(eg) {
        // Chunks of rank tensors (context parallelism) get their slice names, only where the
        // output has no clean expression without them.
        clean = extract(eg, eg.find(root), true);
        named = true;
    }
    if !clean.is_empty() {
        // The leaves and slices equal to those of the spec form too: the next operators
        // reach the ranks' tensors from them as they did before the chunks were named.
        // Only for nested chunk names (a rank's attention block cut to the spec's chunks): a
        // clean form of single chunks carries every operator the next lemmas need, and the
        // spec form beside it would only grow the next e-graphs.
        let spec_form = (named && nested_slices(&clean[0]))
            .then(|| spec_form(imp, state, t))
            .flatten();
        let mut used = clean.clone();
        used.extend(spec_form.iter().cloned());
        let equal_leaves = leaf_groups(eg, &used);
        let mut equal_slices = slice_groups(eg, &used);
        if let Some(f) = spec_form {
            equal_slices.push(vec![clean[0].clone(), f]);
        }
        return State::Related(Rel {
            exprs: clean,
            clean: true,
            equal_leaves,
            equal_slices,
            explored: Vec::new(),
        });
    }
    // A constant multiple of clean expressions (a gradient before the data-parallel averaging
    // absorbs the factor): keep every clean alternative, as a clean relation does, so the next
    // operators can use whichever the implementation computes from.
    let scaled: Vec<(i64, i64, Id)> = eg[root]
        .nodes
        .iter()
        .filter_map(|n| match n {
            Term::Op(s, k) if is_op!(s, SCALE) && k.len() == 3 => {
                let num = |id: Id| {
                    eg[id].nodes.iter().find_map(|n| match n {
                        Term::Num(x) => Some(*x),
                        _ => None,
                    })
                };
                Some((num(k[0])?, num(k[1])?, k[2]))
            }
            _ => None,
        })
        .collect();
    for (p, q, inner) in scaled {
        let exprs: Vec<RecExpr<Term>> = extract(eg, inner, true)
            .into_iter()
            .map(|mut e| {
                let x = Id::from(e.as_ref().len() - 1);
                let (pn, qn) = (e.add(Term::Num(p)), e.add(Term::Num(q)));
                e.add(Term::Op(Symbol::from(SCALE), vec![pn, qn, x]));
                e
            })
            .collect();
        if !exprs.is_empty() {
            let equal_leaves = leaf_groups(eg, &exprs);
            let equal_slices = slice_groups(eg, &exprs);
            return State::Related(Rel {
                exprs,
                clean: false,
                equal_leaves,
                equal_slices,
                explored: scalar_frontier(imp, added),
            });
        }
    }
    match extract(eg, root, false).into_iter().next() {
        Some(e) if e.as_ref().len() <= max_unclean_nodes(imp) => {
            let e = fold_nested_scales(&e);
            let equal_leaves = leaf_groups(eg, std::slice::from_ref(&e));
            let equal_slices = slice_groups(eg, std::slice::from_ref(&e));
            State::Related(Rel {
                exprs: vec![e],
                clean: false,
                equal_leaves,
                equal_slices,
                explored: scalar_frontier(imp, added),
            })
        }
        // Named here: every consumer inherits this state, and the report quotes it at the
        // output, far from the operator whose expression outgrew the limit.
        Some(e) => State::Lost(format!(
            "the expression computed for `{}` grew beyond the size limit ({} nodes, at most {})",
            imp.case.spec.value_name(v),
            e.as_ref().len(),
            max_unclean_nodes(imp)
        )),
        None => State::Lost(format!(
            "no expression for `{}` could be built within the size limit (none nested at most {MAX_EXTRACT_DEPTH} operators deep)",
            imp.case.spec.value_name(v)
        )),
    }
}

/// The largest expression kept for a spec value without a clean relation, per rank of the
/// implementation (at least four counted): past it the value is lost (see [`State::Lost`]),
/// which bounds the e-graphs of its consumers.
const MAX_UNCLEAN_NODES_PER_RANK: usize = 100;

/// [`MAX_UNCLEAN_NODES_PER_RANK`] times the ranks: an expression over the ranks' pieces grows
/// with their number (a context-parallel attention block holds a piece per cp rank and per
/// chunk of every other dim), so a bound fixed for four ranks lost eight-rank plans whose
/// expressions were the four-rank ones twice over.
pub(super) fn max_unclean_nodes(imp: &Impl) -> usize {
    MAX_UNCLEAN_NODES_PER_RANK * imp.case.program.ranks.len().max(4)
}

/// The scale rewrites applied everywhere at the first operator without a relation, with the
/// operator each applies at ([`crate::lemmas::apply_everywhere`]).
pub(super) const SCALE_REWRITES: &[(&str, &str)] = &[
    ("linear-over-scale", crate::lemmas::SCALE),
    ("scale-through-sibling", crate::lemmas::SCALE),
    ("scale-and-cat", crate::term::CAT),
];

/// How many times [`SCALE_REWRITES`] are applied at most: a fold, a sibling, a concatenation.
pub(super) const SCALE_PASSES: usize = 3;

/// Only an operator whose e-graphs stayed below this many nodes is attempted again, wider: the
/// steps are made for the small e-graphs of per-token arithmetic and for an attention block's
/// product whose ranks read their key through a chain of layouts (llama dp x tp x cp's query
/// gradient, 9000 nodes), while a larger one is a product chain where the wider steps only add
/// nodes (and a second attempt costs seconds).
pub(super) const WIDEN_BELOW_NODES: usize = 10_000;

/// The wider attempt's node limit, in multiples of the first attempt's: it explores the
/// sources of the ranks' layouts besides all the first attempt did (llama dp x tp x cp's query
/// gradient reaches the ranks' products at 24 thousand nodes).
const WIDE_NODE_FACTOR: usize = 2;

/// Within one saturation iteration the lemmas stop adding terms at this many times the node
/// limit ([`Shapes::node_cap`](crate::term::Shapes::node_cap)): the iteration that crosses
/// the limit still completes the rewrites it can afford, and the runner stops after it.
const NODE_CAP_FACTOR: usize = 10;

/// One attempt at a spec operator's relation.
#[derive(Default)]
pub(super) struct Attempt {
    /// The second attempt's wider steps: the sources of the ranks' views explored, and the
    /// [`WIDENED`] lemmas.
    pub(super) widened: bool,
    /// The wider attempt's node limit with the first attempt's steps: a 0-d chain's retry.
    pub(super) roomier: bool,
    /// The largest e-graph its saturations left.
    pub(super) peak_nodes: std::cell::Cell<usize>,
    /// Each round brings in the element moves over its operators ([`follow_element_moves`]):
    /// the retry of an operator whose e-graph outgrew the node limit.
    pub(super) follow_moves: bool,
    /// Whether some round left element moves over its operators to later rounds: only then
    /// does the retry that follows them differ.
    pub(super) moves_deferred: std::cell::Cell<bool>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardproof_ir::DType;
    use shardproof_ops::Meta;

    /// A sum of six rank tensors of one shape (commuting and reassociating it gives thousands
    /// of matches, so small match limits ban rules) beside a library lemma's term.
    fn graph() -> (Graph, Id) {
        let mut g = Graph::new(Shapes::default());
        for leaf in ["%r0:a", "%r1:a", "%r2:a", "%r3:a", "%r0:b", "%r1:b"] {
            g.analysis
                .leaves
                .insert(leaf.into(), Meta::new(DType::F64, vec![2, 4]));
        }
        let sum = "(aten.add.Tensor (aten.add.Tensor (aten.add.Tensor %r0:a %r1:a) \
                   (aten.add.Tensor %r2:a %r3:a)) (aten.add.Tensor %r0:b %r1:b))";
        let root = g.add_expr(&sum.parse().unwrap());
        g.add_expr(
            &"(cat 1 (slice 1 0 2 1 %r0:a) (slice 1 2 4 1 %r0:a))"
                .parse()
                .unwrap(),
        );
        g.rebuild();
        (g, root)
    }

    fn rules() -> Vec<Rewrite<Term, Shapes>> {
        let mut rules = vec![
            egg::rewrite!("add-comm"; "(aten.add.Tensor ?a ?b)" => "(aten.add.Tensor ?b ?a)"),
            egg::rewrite!("add-assoc"; "(aten.add.Tensor (aten.add.Tensor ?a ?b) ?c)"
                => "(aten.add.Tensor ?a (aten.add.Tensor ?b ?c))"),
        ];
        rules.extend(crate::lemmas::library().iter().flat_map(|l| l.rewrites()));
        rules
    }

    /// Every class of `g` with its nodes, in id order: two runs that made the same unions and
    /// added the same nodes in the same order print the same.
    fn dump(g: &Graph) -> String {
        format!("{:?}", g.dump())
    }

    /// The saturation loop ends with the e-graph egg's runner and backoff scheduler leave, at
    /// match limits that ban rules (and ban them again), node limits that stop an apply phase
    /// part way, iteration limits, and a hook that ends the run.
    #[test]
    fn the_saturation_loop_leaves_the_egraph_as_eggs_runner_does() {
        let rules = rules();
        // The small limits ban `add-comm` at its first search, and a run that applied
        // nothing then does not stop while the ban lasts.
        let mut backoff = Backoff::new(&rules.iter().collect::<Vec<_>>(), 2);
        let (g, _) = graph();
        assert!(!rules[0].search(&g).is_empty());
        assert!(backoff.search(0, 0, &g, &rules[0]).is_empty());
        assert!(!backoff.can_stop(0));
        assert!(backoff.can_stop(BAN_LENGTH));
        for matches in [2, 7, 40, 1_000] {
            for nodes in [60, 150, 400, 5_000] {
                for iterations in [1, 3, 12] {
                    for stop_at_merge in [false, true] {
                        let (mut ours, root) = graph();
                        let (theirs, _) = graph();
                        let other =
                            ours.lookup_expr(&"(aten.add.Tensor %r1:b %r0:b)".parse().unwrap());
                        let merged = move |g: &Graph| {
                            stop_at_merge
                                && g.lookup_expr(&"(aten.add.Tensor %r1:b %r0:b)".parse().unwrap())
                                    .is_some_and(|x| g.find(x) == g.find(root))
                        };
                        assert!(other.is_none());
                        let limits = RunLimits {
                            iterations,
                            nodes,
                            matches,
                        };
                        run_rules(&mut ours, &rules, limits, |g| merged(g));
                        let runner = egg::Runner::default()
                            .with_scheduler(
                                egg::BackoffScheduler::default().with_initial_match_limit(matches),
                            )
                            .with_egraph(theirs)
                            .with_iter_limit(iterations)
                            .with_node_limit(nodes)
                            .with_hook(move |r| {
                                if merged(&r.egraph) {
                                    return Err("merged".into());
                                }
                                Ok(())
                            })
                            .run(&rules);
                        assert_eq!(
                            dump(&ours),
                            dump(&runner.egraph),
                            "match limit {matches}, node limit {nodes}, {iterations} iterations, stop at merge {stop_at_merge}"
                        );
                    }
                }
            }
        }
    }
}
