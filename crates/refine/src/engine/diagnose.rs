//! Diagnosis: from a checked output without a clean relation back to the spec operator where
//! relations stop ([`blame`]), with the failure the report shows and the strength of its
//! evidence.

use super::evidence::arg_values;
use super::evidence::{
    added_to_before_reduction, changed_before_reduction, collective_ranks, dropped_clause,
    dropped_input, expr_leaves, is_rank_sum, leaf_ranks, linear_in_leaf, misaligned_pieces,
    misaligned_rows, reduced_over_shard, reduction_path, summands_of, unread_leaves, ReductionPath,
    MAX_ROW_IDS,
};
use super::relation::{scaled_clean, Impl, Rel, State};
use super::report::{render, Failure};
use crate::lower::{Tpl, ValueRef};
use crate::term::{is_op, Term, MAX, MIN, SUM};
use egg::{Id, RecExpr};
use shardproof_case::Case;
use shardproof_ir::{Graph as IrGraph, ValueId};
use shardproof_ops::Meta;
use std::collections::{BTreeSet, HashMap, HashSet};

/// Hints that name a bug by what the implementation does, not by the shape of a relation: a
/// partial sum never reduced (or reduced after an add), a reduction over the wrong ranks, a
/// different scale factor in the corresponding operator. A constant multiple of a clean value
/// alone is not among them: it is normal mid-backward under data parallelism.
pub(super) fn strong_evidence(hint: &str) -> bool {
    hint.contains("partial sum")
        || hint.contains("reduces its own shard")
        || hint.contains("wrong process group")
        || hint.contains("wrong scale factor")
}

/// The factor a multiplication (`c`) or a division (`1/c`) by the literal `c` applies to its
/// first operand.
fn literal_multiplier(nd: &shardproof_ir::Node) -> Option<f64> {
    let c = nd.args().get(1)?.as_f64()?;
    match nd.op()?.to_string().as_str() {
        "aten.mul.Tensor" | "aten.mul.Scalar" => Some(c),
        "aten.div.Tensor" | "aten.div.Scalar" if c != 0.0 => Some(1.0 / c),
        _ => None,
    }
}

/// How many operators past a scale [`ScaleChain`] follows.
const MAX_SCALE_CHAIN: usize = 8;

/// Whether two factors are the same up to rounding.
fn same_factor(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * b.abs().max(1.0)
}

/// The factors a scale reaches along the literal scales after it, through operators that keep
/// a factor of their operand: at every point, and at the chain's ends (`None` where
/// [`MAX_SCALE_CHAIN`] cut it off).
struct ScaleChain {
    points: Vec<f64>,
    ends: Option<Vec<f64>>,
}

impl ScaleChain {
    /// Whether some point of one is some point of the other: a factor split over other scales
    /// (1/4, then 1/2 for the spec's 1/8; 3, then 1/3 for the spec's 2, then 1/2).
    fn meets(&self, other: &ScaleChain) -> bool {
        self.points
            .iter()
            .any(|&a| other.points.iter().any(|&b| same_factor(a, b)))
    }

    /// Both chains' ends, where both are known and neither is empty.
    fn known_ends<'a>(&'a self, other: &'a ScaleChain) -> Option<(&'a [f64], &'a [f64])> {
        match (&self.ends, &other.ends) {
            (Some(a), Some(b)) if !a.is_empty() && !b.is_empty() => Some((a, b)),
            _ => None,
        }
    }

    /// Whether both chains' ends are known and some end of one is an end of the other
    /// (`Some(true)`), none is (`Some(false)`), or that is not known (`None`).
    fn ends_meet(&self, other: &ScaleChain) -> Option<bool> {
        let (a, b) = self.known_ends(other)?;
        Some(a.iter().any(|&x| b.iter().any(|&y| same_factor(x, y))))
    }

    /// Whether both chains' ends are known and every end of this one is an end of the other
    /// (a factor made up on every path, not only off the output), or that is not known.
    fn ends_within(&self, other: &ScaleChain) -> Option<bool> {
        let (a, b) = self.known_ends(other)?;
        Some(a.iter().all(|&x| b.iter().any(|&y| same_factor(x, y))))
    }

    fn show_ends(&self) -> String {
        let mut ends: Vec<String> = Vec::new();
        for e in self.ends.iter().flatten() {
            let e = e.to_string();
            if !ends.contains(&e) {
                ends.push(e);
            }
        }
        ends.join(" or ")
    }
}

/// How a chain steps past an operator that is no literal scale: `Loose` through any that may
/// be linear in the scaled value (to withhold evidence), `Strict` only through those that
/// scale their result by its factor ([`crate::lemmas::scales_with`]; to name a rank).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Step {
    Loose,
    Strict,
}

/// The one argument position at which a node reads `x` among `args`' values (of which
/// `values` gives the values, canonical), where it reads it at exactly one, as a tensor of its
/// own (not in a list).
fn single_position<V: PartialEq>(
    args: &[shardproof_ir::Arg],
    values: impl Fn(&shardproof_ir::Arg) -> Vec<V>,
    x: &V,
) -> Option<usize> {
    let mut at = None;
    for (i, a) in args.iter().enumerate() {
        let vals = values(a);
        let n = vals.iter().filter(|v| *v == x).count();
        if n == 0 {
            continue;
        }
        if n > 1 || at.is_some() || !matches!(a, shardproof_ir::Arg::Value(_)) {
            return None;
        }
        at = Some(i);
    }
    at
}

/// The factor a node applies to the scaled value `x` it reads: its literal multiplier, or 1
/// where it keeps the factor (see [`Step`]); `None` where the chain ends there.
fn step_factor(
    nd: &shardproof_ir::Node,
    pos: Option<usize>,
    step: Step,
    loose: impl Fn() -> bool,
) -> Option<f64> {
    if pos == Some(0) {
        if let Some(k) = literal_multiplier(nd) {
            return Some(k);
        }
    }
    let op = nd.op()?.to_string();
    let strict = pos.is_some_and(|i| crate::lemmas::scales_with(&op, i));
    (strict || (step == Step::Loose && loose())).then_some(1.0)
}

/// The chain of rank `r` from its node `n`, which multiplies by `first`.
fn rank_chain(case: &Case, imp: &Impl, r: usize, n: usize, first: f64, step: Step) -> ScaleChain {
    let mut points = vec![first];
    let mut ends = Vec::new();
    let mut frontier = vec![(n, first)];
    for _ in 0..MAX_SCALE_CHAIN {
        let mut next = Vec::new();
        for (n, m) in frontier {
            let out = imp.canon(ValueRef {
                rank: Some(r),
                value: ValueId::new(n, 0),
            });
            let mut continued = false;
            for &(r2, n2) in imp.consumers.get(&out).map_or(&[][..], Vec::as_slice) {
                if r2 != r {
                    continue;
                }
                let nd = &case.program.ranks[r2].nodes[n2];
                let pos = single_position(nd.args(), |a| arg_values(imp, r2, a), &out);
                let loose = || linear_in_leaf(case, imp, r2, n2, out);
                if let Some(k) = step_factor(nd, pos, step, loose) {
                    points.push(m * k);
                    next.push((n2, m * k));
                    continued = true;
                }
            }
            // A value the rank returns keeps its factor there, whatever its uses scale.
            let returned = case.program.ranks[r].outputs.iter().flatten().any(|&o| {
                imp.canon(ValueRef {
                    rank: Some(r),
                    value: o,
                }) == out
            });
            if !continued || returned {
                ends.push(m);
            }
        }
        frontier = next;
        if frontier.is_empty() {
            return ScaleChain {
                points,
                ends: Some(ends),
            };
        }
    }
    ScaleChain { points, ends: None }
}

/// The chain of the spec from its value `v`, which its node multiplies by `first`.
fn spec_chain(spec: &IrGraph, v: ValueId, first: f64, step: Step) -> ScaleChain {
    let mut points = vec![first];
    // Per value reached: its factor and how many operators past `v` it is.
    let mut at: HashMap<ValueId, (f64, usize)> = HashMap::from([(v, (first, 0))]);
    let mut continued: HashSet<ValueId> = HashSet::new();
    let mut cut = false;
    let values = |a: &shardproof_ir::Arg| {
        let mut vals = Vec::new();
        a.values(&mut vals);
        vals
    };
    for (n, nd) in spec.nodes.iter().enumerate().skip(v.node + 1) {
        let reached: Vec<ValueId> = nd
            .inputs()
            .into_iter()
            .filter(|x| at.contains_key(x))
            .collect();
        // A node reading two scaled values (a product of both, a sum) keeps no one factor.
        let [x] = reached.as_slice() else {
            continue;
        };
        let pos = single_position(nd.args(), values, x);
        let loose = || {
            pos.is_some_and(|i| {
                nd.op()
                    .is_some_and(|o| crate::lemmas::may_be_linear_in(&o.to_string(), i))
            })
        };
        let Some(k) = step_factor(nd, pos, step, loose) else {
            continue;
        };
        let (m, depth) = at[x];
        if depth + 1 > MAX_SCALE_CHAIN {
            cut = true;
            continue;
        }
        continued.insert(*x);
        points.push(m * k);
        at.insert(ValueId::new(n, 0), (m * k, depth + 1));
    }
    let mut ends: Vec<(ValueId, f64)> = at
        .iter()
        .filter(|(x, _)| !continued.contains(x))
        .map(|(x, (m, _))| (*x, *m))
        .collect();
    ends.sort_by_key(|a| a.0);
    ScaleChain {
        points,
        ends: (!cut).then(|| ends.into_iter().map(|e| e.1).collect()),
    }
}

/// Whether a spec operator multiplies by a constant itself: its result being a constant
/// multiple of a clean value is then its meaning, not evidence of wrong scaling.
fn scales_itself(node: &shardproof_ir::Node) -> bool {
    let op = node.op().map(|o| o.to_string());
    match op.as_deref() {
        Some("aten.mul.Scalar" | "aten.div.Scalar" | "aten.neg.default") => true,
        Some("aten.mul.Tensor" | "aten.div.Tensor") => node.inputs().len() == 1,
        _ => false,
    }
}

/// Whether `op` is a `_c10d_functional` collective (its name, written out, starts with
/// `_c10d_functional.`), read without writing the name out.
fn is_c10d_functional(op: &shardproof_ir::OpName) -> bool {
    op.namespace
        .strip_prefix("_c10d_functional")
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
}

/// The product term inside a lowered fused linear, `add(mm(a, b), bias)`.
pub(super) fn fused_product(t: &Tpl) -> Option<&Tpl> {
    match t {
        Tpl::Op(add, kids) if add == "aten.add.Tensor" => match kids.first() {
            Some(p @ Tpl::Op(mm, _)) if mm == "aten.mm.default" => Some(p),
            _ => None,
        },
        _ => None,
    }
}

/// Whether some float spec tensor computed from the values of `v` (transitively; shapes and
/// dtypes alone do not count) has a clean relation: then whatever `v` lacks (a constant factor
/// a later average supplies, a partial sum a later reduction completes) was made good
/// downstream, and `v` is not where relations broke. `horizon` is the last spec node with a
/// state in `state` (the walk's latest committed node, mid-walk).
pub(super) fn has_clean_descendant(
    spec: &IrGraph,
    state: &HashMap<ValueId, State>,
    is_float: &dyn Fn(&ValueId) -> bool,
    v: ValueId,
    horizon: usize,
) -> bool {
    // (name, overload) of `aten` operators that read only their input's shape and dtype.
    const SHAPE_ONLY: &[(&str, &str)] = &[
        ("zeros_like", "default"),
        ("ones_like", "default"),
        ("empty_like", "default"),
        ("full_like", "default"),
        ("new_zeros", "default"),
        ("new_ones", "default"),
        ("new_empty", "default"),
        ("new_full", "default"),
        ("sym_size", "int"),
    ];
    // Node order is topological, so one pass finds every node reached; it answers at the
    // first one with a clean float output (the walk asks this of values early in deep models,
    // where the first consumer usually relates cleanly, and reading on to the end of the
    // graph made each question cost the graph's size). No node past `horizon` (the last with
    // a state) can answer, so the pass ends there: mid-walk, fast refutation asks this of
    // values whose descendants are not inferred yet, and reading on to the end of the graph
    // made each question there cost the rest of the model.
    let end = (horizon + 1).min(spec.nodes.len());
    let mut reached = vec![false; end];
    for (n, node) in spec.nodes.iter().enumerate().take(end).skip(v.node + 1) {
        if node.op().is_some_and(|o| {
            o.namespace == "aten"
                && SHAPE_ONLY
                    .iter()
                    .any(|s| o.name == s.0 && o.overload == s.1)
        }) {
            continue;
        }
        reached[n] = node
            .inputs()
            .iter()
            .any(|i| *i == v || (i.node != v.node && reached[i.node]));
        if reached[n]
            && (0..node.outputs.len()).any(|k| {
                let x = ValueId::new(n, k);
                is_float(&x) && matches!(state.get(&x), Some(State::Related(r)) if r.clean)
            })
        {
            return true;
        }
    }
    false
}

/// Whether spec value `v` is a 0-d float (a loss or one of its addends).
pub(super) fn is_float_scalar(spec_metas: &[Vec<Option<Meta>>], v: ValueId) -> bool {
    spec_metas
        .get(v.node)
        .and_then(|m| m.get(v.output))
        .and_then(Option::as_ref)
        .is_some_and(|m| m.dtype.is_float() && m.shape.is_empty())
}

/// A spec value's clean relation and its shape.
pub(super) fn clean_with_shape<'s>(
    state: &'s HashMap<ValueId, State>,
    spec_metas: &[Vec<Option<Meta>>],
    v: ValueId,
) -> Option<(&'s Rel, Vec<usize>)> {
    let r = match state.get(&v) {
        Some(State::Related(r)) if r.clean => r,
        _ => return None,
    };
    let meta = spec_metas.get(v.node)?.get(v.output)?.as_ref()?;
    Some((r, meta.shape.clone()))
}

/// Whether spec value `v` is a float tensor (unknown metadata counts as float).
pub(super) fn is_float_value(spec_metas: &[Vec<Option<Meta>>], v: ValueId) -> bool {
    spec_metas
        .get(v.node)
        .and_then(|m| m.get(v.output))
        .and_then(Option::as_ref)
        .is_none_or(|m| m.dtype.is_float())
}

/// How much of a [`Failure`] [`blame`] writes out.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Detail {
    /// Everything the report shows.
    Report,
    /// Only the operator and the hint (and what decides them): fast refutation asks `blame`
    /// of thousands of values mid-walk and reads nothing else, so the relations rendered per
    /// input, the consumers' names and the other stops are left empty.
    Hint,
}

/// Localizes a failure: from the failing output back through spec values without clean
/// relations, to the first operator whose inputs all have clean relations.
// The walk reads every table the inference kept; a struct of them would only be unpacked here.
#[allow(clippy::too_many_arguments)]
pub(super) fn blame(
    case: &Case,
    imp: &Impl,
    state: &HashMap<ValueId, State>,
    products: &HashMap<ValueId, State>,
    spec_metas: &[Vec<Option<Meta>>],
    widened: &HashSet<ValueId>,
    out: ValueId,
    name: &str,
    detail: Detail,
) -> Failure {
    let report = detail == Detail::Report;
    // A multiple found only by the wider attempt is a rank's tensor taken as a multiple of the
    // spec's value (its gradient of the local loss): the ranks' convention, no evidence of a
    // wrong factor, so it counts as unclean here.
    let scaled = |v: &ValueId| scaled_clean(state.get(v)) && !widened.contains(v);
    let spec = &case.spec;
    let is_clean = |v: &ValueId| matches!(state.get(v), Some(State::Related(r)) if r.clean);
    let is_float = |v: &ValueId| is_float_value(spec_metas, *v);
    let mut frontier: Vec<ValueId> = Vec::new();
    let mut seen = HashSet::new();
    let mut stack = vec![out];
    // Memoized: the walk may meet a value along several paths.
    let mut compensated_memo: HashMap<ValueId, bool> = HashMap::new();
    // The last spec node with a state (mid-walk, the node just committed), found once.
    let mut horizon: Option<usize> = None;
    let mut compensated = |v: ValueId| {
        let last = *horizon.get_or_insert_with(|| state.keys().map(|x| x.node).max().unwrap_or(0));
        *compensated_memo
            .entry(v)
            .or_insert_with(|| has_clean_descendant(spec, state, &is_float, v, last))
    };
    while let Some(v) = stack.pop() {
        if !seen.insert(v) || is_clean(&v) || (v != out && compensated(v)) {
            continue;
        }
        if v != out && !scales_itself(&spec.nodes[v.node]) && scaled(&v) {
            // Clean up to a constant factor: the factor is the bug.
            frontier.push(v);
            continue;
        }
        let node = &spec.nodes[v.node];
        let ins = node.inputs();
        let unclean: Vec<ValueId> = ins
            .iter()
            .copied()
            .filter(|i| state.contains_key(i) && !is_clean(i))
            // Masks and indices often have no clean relation by design (each rank compares
            // against its own shard range): the data path decides where relations stop.
            .filter(|i| is_float(i))
            .collect();
        let unclean: Vec<ValueId> = unclean.into_iter().filter(|&i| !compensated(i)).collect();
        if unclean.is_empty() {
            frontier.push(v);
        } else {
            stack.extend(unclean);
        }
    }
    frontier.sort();
    let mut v = frontier.first().copied().unwrap_or(out);
    let first_stop = v;
    // The stops on other paths into the output (each an operator whose float inputs all
    // relate cleanly, so none merely inherits another's gap).
    let other_stops: Vec<String> = frontier
        .iter()
        .skip(1)
        .filter(|_| report)
        .map(|&s| {
            let op = spec.nodes[s.node]
                .op()
                .map(|o| o.to_string())
                .unwrap_or_default();
            format!("{} ({op})", spec.value_name(s))
        })
        .collect();
    // Relations stopped at an operator that is (or may be) linear in its rank-sum inputs while
    // every other operand is replicated on the summed ranks: summing the operator's results
    // later is then the same sum, and a partial sum flowing on to a later reduction is no
    // evidence of a missing one. (With a sharded operand, sum_r f(p_r, w_r) is another sum.)
    let stop = v;
    let deferrable = |partial_sum: &RecExpr<Term>| {
        let n = &spec.nodes[stop.node];
        let op = n.op().map(|o| o.to_string()).unwrap_or_default();
        let summands = summands_of(partial_sum);
        if summands.is_empty() {
            return false;
        }
        let mut any_partial = false;
        for (i, a) in n.args().iter().enumerate() {
            let shardproof_ir::Arg::Value(x) = a else {
                continue;
            };
            let Some(State::Related(r)) = state.get(x) else {
                continue;
            };
            if r.exprs.iter().any(is_rank_sum) {
                if !crate::lemmas::may_be_linear_in(&op, i) {
                    return false;
                }
                any_partial = true;
                continue;
            }
            // An operand that every relation spreads over several summands is sharded across
            // them: sum_k f(p_k, w_k) is then another sum. One held within a summand (or a
            // constant, held by none) may be each summand's own copy.
            let spread = |e: &RecExpr<Term>| {
                let ranks = leaf_ranks(e, Id::from(e.as_ref().len() - 1));
                summands
                    .iter()
                    .filter(|s| s.iter().any(|r| ranks.contains(r)))
                    .count()
                    >= 2
            };
            if r.exprs.iter().all(spread) {
                return false;
            }
        }
        any_partial
    };
    // A partial sum stays a (clean) partial sum through additions of other tensors, so the
    // relations stop only where something nonlinear reads it: the bug is where the partial
    // sum was first added to, the point a reduction was due.
    let partial = |x: &ValueId| match state.get(x) {
        Some(State::Related(r)) => r.exprs.iter().any(is_rank_sum),
        _ => false,
    };
    // An add that also relates cleanly with no rank sum anywhere (a residual the
    // implementation reduced, which inference may also write as the sum of its unreduced
    // parts) is complete: the partial sum was added to after it, so the walk stops there. A
    // layout of partial sums (a cat of per-token sums) is no such relation.
    let complete = |x: &ValueId| match state.get(x) {
        Some(State::Related(r)) => {
            r.clean
                && r.exprs.iter().any(|e| {
                    !e.as_ref()
                        .iter()
                        .any(|t| matches!(t, Term::Op(s, _) if is_op!(s, SUM)))
                })
        }
        _ => false,
    };
    let absorbed = |x: &ValueId| {
        let n = &spec.nodes[x.node];
        n.op().is_some_and(|o| o.to_string() == "aten.add.Tensor")
            && partial(x)
            && !complete(x)
            && n.inputs().iter().any(&partial)
    };
    let mut steps = 0;
    while let Some(x) = spec.nodes[v.node]
        .inputs()
        .into_iter()
        .find(|x| is_float(x) && absorbed(x))
    {
        if x == v || steps > spec.nodes.len() {
            break;
        }
        v = x;
        steps += 1;
    }
    let node = &spec.nodes[v.node];
    let rels = |st: Option<&State>| -> Vec<String> {
        match st {
            Some(State::Related(r)) => r
                .exprs
                .iter()
                .map(|e| render(e, e.as_ref().len() - 1))
                .collect(),
            Some(State::Unrelated(m)) | Some(State::Blocked(m)) | Some(State::Lost(m)) => {
                vec![format!("(none: {m})")]
            }
            None => vec!["(none)".into()],
        }
    };
    let mut inputs = Vec::new();
    let mut consumers = BTreeSet::new();
    let mut hint = None;
    // Set when the search for a partial sum's reduction stopped at its bounds: reported, and
    // no hint drawn from it.
    let mut search_cut: Option<String> = None;
    // The operator's inputs, and the product inside a fused linear.
    let mut evidence: Vec<(String, String, Option<&State>)> = node
        .inputs()
        .iter()
        .map(|x| {
            let name = spec.value_name(*x).to_string();
            (format!("input `{name}`"), name, state.get(x))
        })
        .collect();
    if let Some(p) = products.get(&v) {
        let name = spec.value_name(v);
        evidence.push((
            format!("the product inside `{name}`"),
            format!("{name} (its product)"),
            Some(p),
        ));
    }
    for (subject, name, st) in evidence {
        if report {
            inputs.push((name, rels(st)));
        }
        if let Some(State::Related(r)) = st {
            for e in &r.exprs {
                let top = e.as_ref().last();
                let top_is_sum = matches!(top, Some(Term::Op(s, _)) if is_op!(s, SUM));
                let leaves = expr_leaves(imp, e);
                let mut reduced = false;
                // The rank sets the implementation's collectives over these leaves reduce.
                let mut groups: BTreeSet<Vec<usize>> = BTreeSet::new();
                for l in &leaves {
                    for &(r, n) in imp.consumers.get(l).map_or(&[][..], Vec::as_slice) {
                        let g = &case.program.ranks[r];
                        let nd = &g.nodes[n];
                        if nd.op().is_some_and(is_c10d_functional) {
                            reduced = true;
                            if let Some(ranks) = collective_ranks(imp, r, n) {
                                groups.insert(ranks.into_iter().collect());
                            }
                        }
                        if report {
                            let op = nd.op().map(|o| o.to_string()).unwrap_or_default();
                            consumers.insert(format!("r{r}.{} = {}", nd.name, op));
                        }
                    }
                }
                let mut summed: Vec<usize> = leaves.iter().filter_map(|l| l.rank).collect();
                summed.sort_unstable();
                summed.dedup();
                let reduction = match top {
                    Some(Term::Op(s, _)) if is_op!(s, SUM) => Some("sum"),
                    Some(Term::Op(s, _)) if is_op!(s, MAX) => Some("max"),
                    Some(Term::Op(s, _)) if is_op!(s, MIN) => Some("min"),
                    _ => None,
                };
                if let Some(kind) = reduction.filter(|_| {
                    reduced
                        && !groups.is_empty()
                        && groups.iter().all(|g| g.len() > 1 && *g != summed)
                        && hint.is_none()
                }) {
                    let show = |v: &[usize]| {
                        v.iter()
                            .map(|r| format!("r{r}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    };
                    hint = Some(format!(
                        "{subject} is a {kind} over ranks {}, but the implementation's collectives over those tensors reduce over {} (a collective on the wrong process group?)",
                        show(&summed),
                        groups.iter().map(|g| format!("[{}]", show(g))).collect::<Vec<_>>().join(", ")
                    ));
                }
                // What follows reads only a rank sum the implementation does not reduce, and
                // sets only the first hint: the searches below (most of `blame`'s time mid-walk)
                // are not run for anything else, whose answer they cannot change.
                if !top_is_sum || reduced || hint.is_some() {
                    continue;
                }
                let late_op = changed_before_reduction(case, imp, &leaves);
                // Reduced further downstream, after more operators: the engine lacks the
                // lemma that relates the path, which is no evidence of a bug.
                //
                // At an operator nonlinear in the partial sum, the same holds when the
                // implementation reduces every piece before computing with it: relations then
                // stop for want of a lemma that regroups the reduction (the ranks' running
                // totals of a gradient norm, reduced in another order), not for a missing one.
                let paths: Vec<ReductionPath> = if late_op.is_none() {
                    let summands = summands_of(e);
                    leaves
                        .iter()
                        .map(|l| reduction_path(case, imp, *l, &summands))
                        .collect()
                } else {
                    Vec::new()
                };
                let reaches = paths.iter().any(|p| p.reduced);
                let reduced_later = reaches
                    && (deferrable(e) || paths.iter().all(|p| p.reduced && !p.used_unreduced));
                // A search cut off at its bounds decides nothing: a collective past them may
                // reduce the sum (and a hint is what turns a stop into a refutation).
                let cut_off = !reduced_later && paths.iter().any(|p| p.truncated);
                if !reduced_later && cut_off && search_cut.is_none() {
                    search_cut = Some(format!(
                        "whether the implementation reduces {subject}, a partial sum, was not decided: the search for a collective that reduces it was cut off at its bounds"
                    ));
                }
                if !reduced_later && !cut_off {
                    hint = Some(if let Some(late) = &late_op {
                        format!(
                            "{subject} is a partial sum, {}, that the implementation reduces only after `{late}` changes it: whatever that adds is counted once per rank (a bias or residual added before the all-reduce?)",
                            render(e, e.as_ref().len() - 1)
                        )
                    } else {
                        format!(
                        "{subject} is an unreduced partial sum, {} — the implementation never reduces it across ranks (a missing all-reduce?)",
                        render(e, e.as_ref().len() - 1)
                    )
                    });
                }
            }
        }
    }
    // Nothing at the first addition of the partial sums (the walk back above), but the operator
    // where relations first stopped reads a rank sum one of whose terms the implementation
    // changes just before reducing it: what that adds is counted once per rank (a replicated
    // parameter's squared norm summed on every rank into a gradient norm).
    if hint.is_none() && first_stop != v {
        let stop_node = &spec.nodes[first_stop.node];
        'late: for x in stop_node.inputs() {
            let Some(State::Related(r)) = state.get(&x) else {
                continue;
            };
            for e in r.exprs.iter().filter(|e| is_rank_sum(e)) {
                let leaves = expr_leaves(imp, e);
                let late = changed_before_reduction(case, imp, &leaves)
                    .or_else(|| added_to_before_reduction(case, imp, &leaves));
                if let Some(late) = late {
                    hint = Some(format!(
                        "input `{}` of `{}` is a partial sum, {}, that the implementation reduces only after `{late}` changes it: whatever that adds is counted once per rank (a replicated term summed on every rank, or a bias added before the all-reduce?)",
                        spec.value_name(x),
                        stop_node.name,
                        render(e, e.as_ref().len() - 1)
                    ));
                    break 'late;
                }
            }
        }
    }
    let computed = match state.get(&v) {
        Some(State::Related(r)) if report && !r.clean => {
            r.exprs.first().map(|e| render(e, e.as_ref().len() - 1))
        }
        _ => None,
    };
    // The spec operator scales by a constant and an implementation operator of the same kind
    // reading the related tensors scales by another: a wrong scale factor (however irrational).
    // A rank's multiplication by 1 is an alias of its operand, read here as a scale by 1.
    if hint.is_none() && scales_itself(node) {
        hint = other_scale_factor(case, imp, state, node, v);
    }
    // Set when the row check was too large to run, or a reduction search was cut off: the
    // report says so, but nothing is concluded from a check that did not run.
    let mut not_computed = search_cut;
    if hint.is_none() {
        hint = misaligned_pieces(case, imp, state, node);
    }
    if hint.is_none() {
        match misaligned_rows(case, imp, state, spec_metas, node) {
            Ok(h) => hint = h,
            Err(elements) => {
                let skipped = format!(
                    "whether the operands' rows pair the same spec rows was not computed ({elements} elements, over the limit of {MAX_ROW_IDS})"
                );
                not_computed = Some(match not_computed {
                    Some(cut) => format!("{cut}; {skipped}"),
                    None => skipped,
                });
            }
        }
    }
    if hint.is_none() {
        hint = dropped_input(case, imp, state, node);
    }
    if hint.is_none() {
        hint = reduced_over_shard(case, imp, state, spec_metas, node);
    }
    // Only a constant multiple of a clean expression is the implementation's value off by a
    // factor; a computed expression that happens to end in the spec's own scaling is not.
    if hint.is_none() && !scales_itself(node) && scaled(&v) {
        // A multiple of tensors the ranks never read is a dropped value, whatever the factor.
        let dropped = match state.get(&v) {
            Some(State::Related(r)) => unread_leaves(case, imp, r)
                .map(|names| (render(&r.exprs[0], r.exprs[0].as_ref().len() - 1), names)),
            _ => None,
        };
        hint = Some(match dropped {
            Some((value, names)) => format!("the value is {value}, but {}", dropped_clause(&names)),
            None => "the value is the implementation's off by a constant factor (wrong scaling, e.g. a missing or extra division by the parallel degree)".into(),
        });
    }
    let file = spec
        .path
        .as_ref()
        .map_or(spec.name.clone(), |p| p.display().to_string());
    let loc = node.line.map(|l| format!("{file}:{l}")).unwrap_or_default();
    Failure {
        output: name.to_string(),
        operator: spec.value_name(v).to_string(),
        op: node.op().map(|o| o.to_string()).unwrap_or_default(),
        graph_location: loc,
        source: node
            .loc
            .as_ref()
            .map(|l| format!("{}:{} in {}", l.file, l.line, l.function)),
        inputs,
        computed,
        impl_consumers: consumers.into_iter().take(12).collect(),
        hint,
        other_stops,
        not_computed,
    }
}

/// The wrong scale factor at a spec operator `v` (`node`) that multiplies by a literal, as a
/// hint naming the rank that multiplies otherwise: a rank's counterpart (an operator of the
/// same kind reading a tensor of the input's relation) with another literal whose factors
/// further on never meet the spec's ([`ScaleChain::meets`]). Where every such rank makes its
/// factor up later (the ranks split the spec's factors otherwise, the reason relations stop
/// here), a rank whose counterpart scales as the spec does but whose factors come to another
/// total at the chains' ends, where those ranks' come to the spec's, is the wrong one.
fn other_scale_factor(
    case: &Case,
    imp: &Impl,
    state: &HashMap<ValueId, State>,
    node: &shardproof_ir::Node,
    v: ValueId,
) -> Option<String> {
    let factor = |nd: &shardproof_ir::Node| nd.args().get(1).and_then(|a| a.as_f64());
    let c = factor(node)?;
    let want = literal_multiplier(node)?;
    let op = node.op().map(|o| o.to_string());
    let spec_loose = std::cell::OnceCell::new();
    let spec_loose = || spec_loose.get_or_init(|| spec_chain(&case.spec, v, want, Step::Loose));
    // Counterparts that multiply otherwise and make it up later, and those that multiply as
    // the spec does.
    let mut made_up: Vec<(usize, usize)> = Vec::new();
    let mut agreeing: Vec<(usize, usize)> = Vec::new();
    for x in node.inputs() {
        let Some(State::Related(r)) = state.get(&x) else {
            continue;
        };
        for e in &r.exprs {
            for t in e.as_ref() {
                let Term::Op(s, k) = t else { continue };
                let Some((rank, nm)) = crate::term::parse_leaf(s.as_str()).filter(|_| k.is_empty())
                else {
                    continue;
                };
                let Some(value) = imp.find(rank, nm) else {
                    continue;
                };
                let leaf = imp.canon(ValueRef {
                    rank: Some(rank),
                    value,
                });
                let calls = imp.consumers.get(&leaf).into_iter().flatten();
                let aliases = imp.alias_calls.get(&leaf).into_iter().flatten();
                for &(r2, n2) in calls.chain(aliases) {
                    let nd = &case.program.ranks[r2].nodes[n2];
                    if nd.op().map(|o| o.to_string()) != op {
                        continue;
                    }
                    let Some(c2) = factor(nd) else { continue };
                    if same_factor(c2, c) {
                        if !agreeing.contains(&(r2, n2)) {
                            agreeing.push((r2, n2));
                        }
                        continue;
                    }
                    let Some(m2) = literal_multiplier(nd) else {
                        continue;
                    };
                    // A factor split over other scales than the spec's: no evidence here.
                    let chain = rank_chain(case, imp, r2, n2, m2, Step::Loose);
                    let spec = spec_loose();
                    if chain.ends_within(spec).unwrap_or_else(|| chain.meets(spec)) {
                        if !made_up.contains(&(r2, n2)) {
                            made_up.push((r2, n2));
                        }
                        continue;
                    }
                    return Some(format!(
                        "the spec multiplies by {c} here, but `r{r2}.{}` multiplies the corresponding tensor by {c2} (a wrong scale factor, e.g. computed from a local size)",
                        nd.name
                    ));
                }
            }
        }
    }
    if made_up.is_empty() || agreeing.is_empty() {
        return None;
    }
    let spec = spec_chain(&case.spec, v, want, Step::Strict);
    let calibrated = made_up.iter().any(|&(r2, n2)| {
        let m2 = literal_multiplier(&case.program.ranks[r2].nodes[n2]).unwrap_or(1.0);
        rank_chain(case, imp, r2, n2, m2, Step::Strict).ends_meet(&spec) == Some(true)
    });
    if !calibrated {
        return None;
    }
    agreeing.iter().find_map(|&(r2, n2)| {
        let chain = rank_chain(case, imp, r2, n2, want, Step::Strict);
        (chain.ends_meet(&spec) == Some(false)).then(|| {
            format!(
                "the ranks split the spec's factors otherwise from here, and `r{r2}.{}`, which multiplies by {c} as the spec does, comes to {} in all where the spec comes to {} (a wrong scale factor, e.g. computed from a local size)",
                case.program.ranks[r2].nodes[n2].name,
                chain.show_ends(),
                spec.show_ends()
            )
        })
    })
}
