//! Exploration (Listing 3): the implementation neighbourhood T_rel of an operator's e-graph.
//! Implementation operators whose inputs are all related are brought in round by round with
//! their definitions, and so are the operators exploration would otherwise stop short of:
//! element moves, recomputed attention probabilities, the sources of views, indices and masks,
//! the implementation's own scalings of a value, and the 0-d values a running sum carries.

use super::evidence::LAYOUT_OPS;
use super::extract::{extract, relates_up_to_factor, CLEAN_OPS};
use super::pieces::append;
use super::relation::{add_tpl, inputs_relate_up_to_factor, tpl_values, Impl, State};
use super::saturate::{saturate, Attempt, SCALE_PASSES, SCALE_REWRITES};
use super::Options;
use crate::lemmas::{same_ratio, Graph, ELEMENTWISE, SCALE};
use crate::lower::{Lowered, Tpl, ValueRef};
use crate::term::{is_op, leaf_symbol, Shapes, Term, CAT, LIST, MAX, MIN, SLICE};
use egg::{Id, RecExpr, Rewrite, Symbol};
use shardproof_ir::{Graph as IrGraph, ValueId};
use std::collections::{HashMap, HashSet};

/// Most exploration rounds per spec operator that bring in only 0-d values and are not counted
/// against [`Options::explore_rounds`]: far above a pipeline stage's layers.
pub(super) const MAX_SCALAR_ROUNDS: usize = 256;

/// Whether an implementation value is a 0-d float tensor.
pub(super) fn is_float_scalar_value(imp: &Impl, v: ValueRef) -> bool {
    imp.meta(v)
        .is_some_and(|m| m.dtype.is_float() && m.shape.is_empty())
}

/// Most implementation values a relation carries in [`Rel::explored`]: far above a loss's
/// chain of per-layer additions over every rank, a bound on the next e-graphs' growth.
const MAX_EXPLORED: usize = 4096;

/// The 0-d float values among `added`, sorted, at most [`MAX_EXPLORED`] (see
/// [`Rel::explored`]).
pub(super) fn scalar_frontier(imp: &Impl, added: &HashSet<ValueRef>) -> Vec<ValueRef> {
    let mut out: Vec<ValueRef> = added
        .iter()
        .copied()
        .filter(|&v| is_float_scalar_value(imp, v))
        .collect();
    out.sort_unstable();
    out.truncate(MAX_EXPLORED);
    out
}

/// Nodes above which a 0-d chain's relation is re-expressed by the ranks' latest values (see
/// [`crate::lemmas::express_by_combination`]): one layer's balance loss over the ranks' batch
/// statistics is about 11 nodes, the running sum plus one more layer's term about 21.
/// Re-expressing the small ones too cost the deepseek-v3-236b-tiny mesh with 32 layers 35%
/// more time (the next e-graphs start from other terms); above 16 it costs 8%.
pub(super) const COMBINE_ABOVE_NODES: usize = 16;

/// The 0-d float values among `added` that no other value of `added` consumes (each rank's
/// latest running sum and the shares not yet added to it), sorted: [`scalar_frontier`]'s values
/// without a consumer there.
pub(super) fn latest_scalars(imp: &Impl, added: &HashSet<ValueRef>) -> Vec<ValueRef> {
    scalar_frontier(imp, added)
        .into_iter()
        .filter(|v| {
            !imp.consumers.get(v).is_some_and(|cs| {
                cs.iter().any(|&(r, n)| {
                    added.contains(&ValueRef {
                        rank: Some(r),
                        value: ValueId::new(n, 0),
                    })
                })
            })
        })
        .collect()
}

/// Exploration may stop one operator short of the implementation's own scaling of a value
/// the spec scales (a loss averaged over dp after a long vocab-parallel cross-entropy and
/// several microbatches): the rank values that scale a leaf of the root's `scale` forms by the
/// same factor are defined, so the root meets them (or a factor still differs: real evidence).
pub(super) fn define_scaled_consumers(
    eg: &mut Graph,
    imp: &Impl,
    root: Id,
    added: &mut HashSet<ValueRef>,
) {
    let num = |eg: &Graph, id: Id| {
        eg[id].nodes.iter().find_map(|n| match n {
            Term::Num(x) => Some(*x),
            _ => None,
        })
    };
    let mut found = Vec::new();
    for n in &eg[root].nodes {
        let Term::Op(s, k) = n else { continue };
        if !is_op!(s, SCALE) || k.len() != 3 {
            continue;
        }
        let (Some(p), Some(q)) = (num(eg, k[0]), num(eg, k[1])) else {
            continue;
        };
        for leaf in &eg[k[2]].nodes {
            let Term::Op(ls, lk) = leaf else { continue };
            let Some((r, name)) = crate::term::parse_leaf(ls.as_str()).filter(|_| lk.is_empty())
            else {
                continue;
            };
            let Some(v) = imp.find(r, name) else {
                continue;
            };
            let x = imp.canon(ValueRef {
                rank: Some(r),
                value: v,
            });
            for out in scaling_consumers(imp, x, (p, q)) {
                if !added.contains(&out) && !imp.cut.contains(&out) {
                    found.push(out);
                }
            }
        }
    }
    if found.is_empty() {
        return;
    }
    for out in found {
        added.insert(out);
        define(eg, imp, out, added);
    }
    eg.rebuild();
}

/// The rank values that the implementation defines as `x` scaled by `p/q`.
fn scaling_consumers(imp: &Impl, x: ValueRef, (p, q): (i64, i64)) -> Vec<ValueRef> {
    let mut out = Vec::new();
    for &(r, n) in imp.consumers.get(&x).map_or(&[][..], Vec::as_slice) {
        let v = ValueRef {
            rank: Some(r),
            value: ValueId::new(n, 0),
        };
        let scales_x = matches!(
            imp.lowered.get(&v),
            Some(Lowered::Term(Tpl::Op(op, kids)))
                if op == SCALE
                    && matches!(kids.as_slice(), [Tpl::Num(p2), Tpl::Num(q2), Tpl::Value(y)]
                        if same_ratio((*p2, *q2), (p, q)) && imp.canon(*y) == x)
        );
        if scales_x && imp.canon(v) == v {
            out.push(v);
        }
    }
    out
}

/// The rank tensor equal to `f` times the rank tensor `x`, where the implementation has one:
/// a consumer of `x` that scales it by `f`, or the tensor `x` is itself `1/f` times.
fn scaled_tensor(imp: &Impl, x: ValueRef, (p, q): (i64, i64)) -> Option<ValueRef> {
    let x = imp.canon(x);
    if let Some(v) = scaling_consumers(imp, x, (p, q)).into_iter().next() {
        return Some(v);
    }
    match imp.lowered.get(&x) {
        Some(Lowered::Term(Tpl::Op(op, kids))) if op == SCALE => match kids.as_slice() {
            // x = (p2/q2) y, so (p/q) x = y.
            [Tpl::Num(p2), Tpl::Num(q2), Tpl::Value(y)] if same_ratio((p, q), (*q2, *p2)) => {
                Some(imp.canon(*y))
            }
            _ => None,
        },
        _ => None,
    }
}

/// `f` times the clean expression rooted at `top` of `e`, as a clean expression: a clean
/// expression is linear in its leaves (layout operators, rank sums; a rank max or min only
/// for `f > 0`), so each leaf is replaced by the rank tensor equal to `f` times it. `None`
/// where a leaf has no such tensor, or the expression holds a constant other than a zero fill.
pub(super) fn rescaled(
    imp: &Impl,
    e: &RecExpr<Term>,
    top: usize,
    f: (i64, i64),
) -> Option<RecExpr<Term>> {
    let mut out = RecExpr::default();
    rescale_into(imp, e, top, f, &mut out)?;
    Some(out)
}

/// [`rescaled`] of the subterm at `top`, appended to `dst`; returns its id there.
fn rescale_into(
    imp: &Impl,
    e: &RecExpr<Term>,
    top: usize,
    f: (i64, i64),
    dst: &mut RecExpr<Term>,
) -> Option<Id> {
    let node = &e.as_ref()[top];
    let Term::Op(s, kids) = node else {
        return Some(dst.add(node.clone()));
    };
    if kids.is_empty() {
        let Some((r, name)) = crate::term::parse_leaf(s.as_str()) else {
            // A literal argument stays; any other constant is no multiple of itself.
            return crate::term::literal_arg(s.as_str()).map(|_| dst.add(node.clone()));
        };
        let value = imp.find(r, name)?;
        let x = ValueRef {
            rank: Some(r),
            value,
        };
        let scaled = scaled_tensor(imp, x, f)?;
        let leaf = leaf_symbol(scaled.rank?, &imp.name(scaled));
        return Some(dst.add(Term::Op(Symbol::from(leaf), vec![])));
    }
    let positive = (f.0 > 0) == (f.1 > 0) && f.0 != 0;
    let linear = is_op!(s, LIST)
        || (CLEAN_OPS.contains(&s.as_str()) && (positive || !(is_op!(s, MAX) || is_op!(s, MIN))));
    if linear {
        let kids = kids
            .iter()
            .map(|&k| rescale_into(imp, e, usize::from(k), f, dst))
            .collect::<Option<_>>()?;
        return Some(dst.add(Term::Op(*s, kids)));
    }
    // A zero fill is every multiple of itself.
    let zero_fill = s.as_str() == "aten.full.default"
        && kids.get(1).is_some_and(|&v| {
            matches!(&e[v], Term::Op(z, k) if k.is_empty() && matches!(z.as_str(), "f:0.0" | "f:-0.0"))
        });
    zero_fill.then(|| append(dst, e, top))
}

/// Adds the definition of impl value `v` (and of the constants it needs): its leaf equals its
/// term.
pub(super) fn define(eg: &mut Graph, imp: &Impl, v: ValueRef, added: &mut HashSet<ValueRef>) {
    let leaf = imp.leaf(eg, v);
    if let Some(Lowered::Term(t)) = imp.lowered.get(&v) {
        let mut needs = Vec::new();
        tpl_values(t, &mut needs);
        for x in needs {
            let x = imp.canon(x);
            if imp.const_only.contains(&x) && added.insert(x) {
                define(eg, imp, x, added);
            }
        }
        let id = add_tpl(eg, t, &mut |eg, x| imp.leaf(eg, x));
        eg.union(leaf, id);
    }
}

/// How many element moves deep [`define_gathered_leaves`] follows a rank tensor down to the
/// collective whose result it moves: a `cat` of `slice`s of a wait of an all-gather is three.
const MAX_GATHER_DEPTH: usize = 6;

/// The chain of definitions by which rank tensor `v` only moves elements of collective
/// results, `v` first: each value's term moves elements ([`moves_elements`]) of values that
/// are either such values again or, at the bottom, the group members' tensors a collective
/// reads (a term reading another rank's tensor is a collective's meaning: an all-gather's
/// `cat` of the members' inputs). Empty where `v` is no such tensor (some input is computed,
/// no collective is reached within [`MAX_GATHER_DEPTH`], or a value is cut).
fn gathered_chain(imp: &Impl, v: ValueRef) -> Vec<ValueRef> {
    fn walk(imp: &Impl, v: ValueRef, depth: usize, chain: &mut Vec<ValueRef>) -> bool {
        if depth == 0 || imp.cut.contains(&v) || !moves_elements(imp, v) {
            return false;
        }
        let ins = imp.term_inputs(v);
        if ins.is_empty() {
            return false;
        }
        chain.push(v);
        // The collective itself: its inputs are the members' tensors, whatever computed them.
        if ins.iter().any(|x| x.rank != v.rank) {
            return true;
        }
        ins.into_iter()
            .filter(|x| !imp.const_only.contains(x))
            .all(|x| chain.contains(&x) || walk(imp, x, depth - 1, chain))
    }
    let mut chain = Vec::new();
    if walk(imp, imp.canon(v), MAX_GATHER_DEPTH, &mut chain) {
        chain
    } else {
        Vec::new()
    }
}

/// The leaves of the inputs' unclean relations that only move elements of collective results
/// (a rank's all-gathered gradient cut back into sequence chunks and concatenated, `cat(slice(
/// all_gather(g)), ..)`) are brought in with their definitions down to the collective, so the
/// e-graph learns that such a leaf is a layout of the members' tensors (`cat(g_0, g_1)`).
///
/// Why: an unclean relation is passed on as its smallest expression, in which such a tensor is
/// a bare leaf. Exploration only moves forward from present tensors, so the next operator
/// never sees it as the concatenation of the ranks' shards, and an elementwise operator over
/// it cannot split by shard to meet what each rank computes on its own shard (the
/// SequenceParallel block's residual gradient `(g + a) + b`). Definitions are true equations,
/// so this adds no unsound union; it is confined to unclean inputs, where relations are still
/// to be found, so operators that relate already see the same e-graph.
pub(super) fn define_gathered_leaves(
    eg: &mut Graph,
    imp: &Impl,
    state: &HashMap<ValueId, State>,
    ins: &[ValueRef],
    added: &mut HashSet<ValueRef>,
) -> bool {
    let mut leaves: Vec<ValueRef> = Vec::new();
    for x in ins {
        let Some(State::Related(r)) = state.get(&x.value) else {
            continue;
        };
        if r.clean {
            continue;
        }
        for e in &r.exprs {
            for n in e.as_ref() {
                let Term::Op(s, k) = n else { continue };
                let Some((rank, name)) =
                    crate::term::parse_leaf(s.as_str()).filter(|_| k.is_empty())
                else {
                    continue;
                };
                if let Some(value) = imp.find(rank, name) {
                    leaves.push(imp.canon(ValueRef {
                        rank: Some(rank),
                        value,
                    }));
                }
            }
        }
    }
    leaves.sort_unstable();
    leaves.dedup();
    let mut grew = false;
    for leaf in leaves {
        for v in gathered_chain(imp, leaf) {
            if added.insert(v) {
                define(eg, imp, v, added);
                grew = true;
            }
        }
    }
    if grew {
        eg.rebuild();
    }
    grew
}

/// Extends a round's new implementation operators with the operators that only move their
/// elements (see [`moves_elements`]) over them and over already related tensors, transitively,
/// so that the round brings them in together.
///
/// Why: each round ends with a saturation, and a chain of such operators before a product (an
/// expert-parallel gather of the routing weights, its unsqueeze and its expand) otherwise
/// takes a round per link. The e-graph can reach the node limit before the product arrives,
/// and then the product never meets the spec's (the 16-rank deepseek plan's MoE backward).
/// Only in the retry of an operator that outgrew the node limit: fewer rounds mean fewer
/// saturations, which changes which of several equal relations is kept, and later operators
/// depend on that choice (deepseek cp=2 x ep=2's expert gradient `bmm_6` stops relating).
pub(super) fn follow_element_moves(
    imp: &Impl,
    t_rel: &HashSet<ValueRef>,
    added: &HashSet<ValueRef>,
    new: &mut Vec<ValueRef>,
) {
    let mut taken: HashSet<ValueRef> = new.iter().copied().collect();
    let mut frontier = new.clone();
    while let Some(u) = frontier.pop() {
        for &(r, n) in imp.consumers.get(&u).map_or(&[][..], Vec::as_slice) {
            let g: &IrGraph = &imp.case.program.ranks[r];
            for k in 0..g.nodes[n].outputs.len() {
                let out = ValueRef {
                    rank: Some(r),
                    value: ValueId::new(n, k),
                };
                if imp.canon(out) != out
                    || added.contains(&out)
                    || taken.contains(&out)
                    || imp.cut.contains(&out)
                    || !moves_elements(imp, out)
                {
                    continue;
                }
                let ready = imp
                    .term_inputs(out)
                    .iter()
                    .all(|i| t_rel.contains(i) || taken.contains(i) || imp.const_only.contains(i));
                if ready {
                    taken.insert(out);
                    new.push(out);
                    frontier.push(out);
                }
            }
        }
    }
    new.sort();
}

/// Whether [`follow_element_moves`] brings in an implementation value with its inputs: its
/// term is one layout operator that traces elements (see [`LAYOUT_OPS`]; an all-gather is
/// lowered to a concatenation of the members' tensors, so it is one), or an expand, which
/// copies them, applied to tensors directly (its other arguments read no tensor). A
/// reduce-scatter, a slice of the group's sum, is not: it adds.
pub(super) fn moves_elements(imp: &Impl, v: ValueRef) -> bool {
    match imp.lowered.get(&v) {
        Some(Lowered::Term(Tpl::Op(op, kids))) => {
            (LAYOUT_OPS.contains(&op.as_str()) || op == "aten.expand.default")
                && kids.iter().all(|k| match k {
                    Tpl::Value(_) => true,
                    arg => {
                        let mut read = Vec::new();
                        tpl_values(arg, &mut read);
                        read.is_empty()
                    }
                })
        }
        _ => false,
    }
}

/// At most this many definitions of recomputed attention probabilities are unfolded per spec
/// operator (see [`unfold_recomputed`]).
pub(super) const UNFOLD_RECOMPUTED: usize = 96;

/// Operators through which [`unfold_recomputed`] follows a recomputation to its inputs: the
/// block's scores (a scaled product plus a mask) and the ranks' merged log-sum-exp.
const RECOMPUTE_OPS: &[&str] = &[
    "aten.exp.default",
    "aten.sub.Tensor",
    "aten.add.Tensor",
    "aten.masked_fill.Scalar",
    "aten.maximum.default",
    "aten.log.default",
    "aten.logsumexp.default",
    "aten.transpose.int",
    // The scores' product: unfolded (lemmas must see a product to know the scores finite),
    // its operands not followed (not in this list).
    "aten.bmm.default",
    CAT,
    SLICE,
    SCALE,
];

/// The operator of an implementation value's definition.
pub(super) fn defining_op<'a>(imp: &'a Impl, v: ValueRef) -> Option<&'a str> {
    match imp.lowered.get(&v) {
        Some(Lowered::Term(Tpl::Op(s, _))) => Some(s.as_str()),
        _ => None,
    }
}

/// Whether an implementation value is attention probabilities recomputed from a saved row
/// statistic, `exp(x - l)` with `l` one entry per row (ring attention's backward), or a
/// transpose of such.
fn recomputes_probabilities(imp: &Impl, v: ValueRef) -> bool {
    let Some(Lowered::Term(Tpl::Op(s, k))) = imp.lowered.get(&v) else {
        return false;
    };
    match (s.as_str(), k.first()) {
        ("aten.transpose.int", Some(Tpl::Value(x))) => {
            defining_op(imp, imp.canon(*x)) == Some("aten.exp.default")
                && recomputes_probabilities(imp, imp.canon(*x))
        }
        ("aten.exp.default", Some(Tpl::Value(x))) => {
            let Some(Lowered::Term(Tpl::Op(s2, k2))) = imp.lowered.get(&imp.canon(*x)) else {
                return false;
            };
            let last = |t: &Tpl| match t {
                Tpl::Value(y) => imp
                    .meta(imp.canon(*y))
                    .and_then(|m| m.shape.last().copied()),
                _ => None,
            };
            s2 == "aten.sub.Tensor"
                && k2.len() >= 2
                && last(&k2[0]).is_some_and(|n| n > 1)
                && last(&k2[1]) == Some(1)
        }
        _ => false,
    }
}

/// Unfolds the implementation's recomputed attention probabilities (ring attention's backward
/// recomputes each block's `exp(x + mask - l)` from the saved, merged log-sum-exp `l`) into
/// their definitions, down to the scores' products and the ranks' forward log-sum-exps, so
/// that lemmas can see a block the mask hides entirely and read it as zeros. Bounded by
/// `budget` definitions in all; only float values defined by [`RECOMPUTE_OPS`] are followed,
/// so models without such recomputations pay a look-up per leaf.
pub(super) fn unfold_recomputed(
    eg: &mut Graph,
    imp: &Impl,
    t_rel: &mut HashSet<ValueRef>,
    added: &mut HashSet<ValueRef>,
    budget: &mut usize,
) {
    let mut todo: Vec<ValueRef> = t_rel
        .iter()
        .copied()
        .filter(|&v| !added.contains(&v) && recomputes_probabilities(imp, v))
        .collect();
    todo.sort();
    while let Some(v) = todo.pop() {
        if *budget == 0 {
            break;
        }
        if !added.insert(v) {
            continue;
        }
        *budget -= 1;
        define(eg, imp, v, added);
        t_rel.insert(v);
        let Some(Lowered::Term(t)) = imp.lowered.get(&v) else {
            continue;
        };
        let mut ins = Vec::new();
        tpl_values(t, &mut ins);
        for x in ins {
            let x = imp.canon(x);
            t_rel.insert(x);
            let float = imp.meta(x).is_some_and(|m| m.dtype.is_float());
            if float
                && !added.contains(&x)
                && !imp.cut.contains(&x)
                && defining_op(imp, x).is_some_and(|s| RECOMPUTE_OPS.contains(&s))
            {
                todo.push(x);
            }
        }
    }
}

/// Operators that only reshape their input, so the input is the output viewed back.
pub(super) const RESHAPES: &[&str] = &[
    "aten.view.default",
    "aten.reshape.default",
    "aten._unsafe_view.default",
];

/// The sources of related implementation layouts are related too: a relation names the view
/// a rank took (`view(div_7, [4, 4, 4])`) or the key it transposed for a product, the rank's
/// next operators read the source (`div_7`), and exploration only moves forward from related
/// tensors. Each source is brought in with its definition inverted (`x = view(view(x, s),
/// shape(x))`, a transpose transposed back, a permute by the inverse permutation), so its
/// consumers can be explored, and so on up a chain of such layouts (a ring's key block is
/// viewed, transposed and viewed again before its product).
pub(super) fn unfold_view_sources(
    eg: &mut Graph,
    imp: &Impl,
    t_rel: &mut HashSet<ValueRef>,
    added: &mut HashSet<ValueRef>,
) {
    for _ in 0..MAX_LAYOUT_UNFOLD {
        let mut layouts: Vec<ValueRef> = t_rel
            .iter()
            .copied()
            .filter(|&v| {
                !added.contains(&v) && defining_op(imp, v).is_some_and(is_invertible_layout)
            })
            .collect();
        layouts.sort();
        let mut grew = false;
        for v in layouts {
            let Some(Lowered::Term(Tpl::Op(op, k))) = imp.lowered.get(&v) else {
                continue;
            };
            let Some((x, meta)) = layout_source(imp, v).and_then(|x| Some((x, imp.meta(x)?)))
            else {
                continue;
            };
            if imp.cut.contains(&x) || t_rel.contains(&x) {
                continue;
            }
            let leaf = imp.leaf(eg, v);
            let back = if RESHAPES.contains(&op.as_str()) {
                let list = crate::lemmas::list(eg, &meta.shape);
                eg.add(Term::Op(Symbol::from(op.as_str()), vec![leaf, list]))
            } else if op.as_str() == "aten.transpose.int" {
                let (Some(Tpl::Num(a)), Some(Tpl::Num(b))) = (k.get(1), k.get(2)) else {
                    continue;
                };
                let (a, b) = (eg.add(Term::Num(*a)), eg.add(Term::Num(*b)));
                eg.add(Term::Op(Symbol::from(op.as_str()), vec![leaf, a, b]))
            } else {
                let Some(p) = permutation(k.get(1)) else {
                    continue;
                };
                let mut inverse = vec![0usize; p.len()];
                for (i, &d) in p.iter().enumerate() {
                    inverse[d] = i;
                }
                let list = crate::lemmas::list(eg, &inverse);
                eg.add(Term::Op(Symbol::from(op.as_str()), vec![leaf, list]))
            };
            added.insert(v);
            define(eg, imp, v, added);
            let src = imp.leaf(eg, x);
            eg.union(src, back);
            t_rel.insert(x);
            grew = true;
        }
        if !grew {
            break;
        }
    }
}

/// The layout chains above related tensors, defined up to [`MAX_LAYOUT_UNFOLD`] operators deep
/// (without relating the sources a slice or broadcast does not determine): a rank's two chains
/// of views of one received tensor (a ring's key block, taken once for the forward and once
/// more for the backward) then meet by congruence, and the tensors at their ends are equal.
pub(super) fn define_layout_chains(
    eg: &mut Graph,
    imp: &Impl,
    t_rel: &HashSet<ValueRef>,
    added: &mut HashSet<ValueRef>,
) {
    let mut frontier: Vec<ValueRef> = t_rel.iter().copied().collect();
    frontier.sort();
    let mut defined: HashSet<ValueRef> = HashSet::new();
    for _ in 0..MAX_LAYOUT_UNFOLD {
        let mut next = Vec::new();
        for v in frontier {
            if !defined.insert(v) || imp.cut.contains(&v) {
                continue;
            }
            let Some(x) = layout_source(imp, v) else {
                continue;
            };
            added.insert(v);
            define(eg, imp, v, added);
            next.push(x);
        }
        next.sort();
        next.dedup();
        frontier = next;
    }
}

/// The one float tensor a layout operator (an invertible one or one of [`CHAIN_LAYOUTS`])
/// defining `v` reads.
fn layout_source(imp: &Impl, v: ValueRef) -> Option<ValueRef> {
    let Some(Lowered::Term(Tpl::Op(op, k))) = imp.lowered.get(&v) else {
        return None;
    };
    if !(is_invertible_layout(op.as_str()) || CHAIN_LAYOUTS.contains(&op.as_str())) {
        return None;
    }
    let sources: Vec<ValueRef> = k
        .iter()
        .filter_map(|t| match t {
            Tpl::Value(x) => Some(imp.canon(*x)),
            _ => None,
        })
        .collect();
    let [x] = sources[..] else {
        return None;
    };
    imp.meta(x).filter(|m| m.dtype.is_float()).map(|_| x)
}

/// Layouts [`define_layout_chains`] follows besides the invertible ones.
const CHAIN_LAYOUTS: &[&str] = &["aten.expand.default", SLICE];

/// How many layouts deep [`unfold_view_sources`] and [`define_layout_chains`] follow a related
/// tensor's sources.
const MAX_LAYOUT_UNFOLD: usize = 8;

/// Layout operators whose input is their output with the operator inverted.
fn is_invertible_layout(op: &str) -> bool {
    RESHAPES.contains(&op) || op == "aten.transpose.int" || op == "aten.permute.default"
}

/// A permutation written as a list of dims.
fn permutation(t: Option<&Tpl>) -> Option<Vec<usize>> {
    let Some(Tpl::Op(_, items)) = t else {
        return None;
    };
    let p: Vec<usize> = items
        .iter()
        .map(|i| match i {
            Tpl::Num(d) => usize::try_from(*d).ok(),
            _ => None,
        })
        .collect::<Option<_>>()?;
    let mut seen = vec![false; p.len()];
    for &d in &p {
        if d >= p.len() || std::mem::replace(&mut seen[d], true) {
            return None;
        }
    }
    Some(p)
}

/// Integer and boolean implementation tensors (indices, masks) are unfolded into their
/// definitions, a few levels deep: lemmas about masked lookups need to see the comparisons and
/// shifts that built them, which relations (clean expressions over leaves) do not carry.
pub(super) fn unfold_indices(
    eg: &mut Graph,
    imp: &Impl,
    t_rel: &mut HashSet<ValueRef>,
    added: &mut HashSet<ValueRef>,
) {
    for _ in 0..4 {
        let mut unfold: Vec<ValueRef> = t_rel
            .iter()
            .copied()
            .filter(|v| !added.contains(v) && imp.meta(*v).is_some_and(|m| !m.dtype.is_float()))
            .collect();
        if unfold.is_empty() {
            break;
        }
        unfold.sort();
        for v in unfold {
            added.insert(v);
            define(eg, imp, v, added);
        }
        collect_leaves(eg, imp, t_rel);
    }
}

pub(super) fn collect_leaves(eg: &Graph, imp: &Impl, out: &mut HashSet<ValueRef>) {
    for class in eg.classes() {
        for n in &class.nodes {
            if let Term::Op(s, k) = n {
                if k.is_empty() {
                    if let Some((r, name)) = crate::term::parse_leaf(s.as_str()) {
                        if let Some(v) = imp.find(r, name) {
                            out.insert(ValueRef {
                                rank: Some(r),
                                value: v,
                            });
                        }
                    }
                }
            }
        }
    }
}

/// Steps 2 and 3 of Listing 2, in Listing 3's rounds: from the implementation tensors the
/// e-graph of an operator already names (T_rel), each round brings in the implementation
/// operators whose inputs are all in T_rel, with their definitions, and saturates the e-graph
/// with the lemmas, until no operator is left, the rounds run out, or (in the deepening rounds)
/// the output meets its expectation with a clean expression. Returns the implementation values
/// brought in.
#[allow(clippy::too_many_arguments)]
pub(super) fn explore(
    eg: &mut Graph,
    imp: &Impl,
    rules: &[Rewrite<Term, Shapes>],
    opts: &Options,
    attempt: &Attempt,
    state: &HashMap<ValueId, State>,
    ins: &[ValueRef],
    root: Id,
    expect_ids: &[Id],
) -> HashSet<ValueRef> {
    let widened = attempt.widened;
    // Exploration: bring in implementation operators whose inputs are all related.
    let mut t_rel: HashSet<ValueRef> = HashSet::new();
    collect_leaves(eg, imp, &mut t_rel);
    let mut added: HashSet<ValueRef> = HashSet::new();
    let mut carried: Vec<ValueRef> = ins
        .iter()
        .filter_map(|x| match state.get(&x.value) {
            Some(State::Related(r)) => Some(r.explored.iter().copied()),
            _ => None,
        })
        .flatten()
        .collect();
    carried.sort_unstable();
    carried.dedup();
    for &out in &carried {
        if added.insert(out) {
            define(eg, imp, out, &mut added);
        }
    }
    // Only under an elementwise spec operator, the one kind that splits by the gathered
    // leaf's shards (see `define_gathered_leaves`): elsewhere the definitions only grow the
    // e-graph (a context-parallel Llama's attention backward, whose all-gathered keys and
    // values are leaves of every unclean relation, outgrew the node limit).
    let elementwise_root = eg[root]
        .nodes
        .iter()
        .any(|n| matches!(n, Term::Op(s, _) if ELEMENTWISE.iter().any(|e| e.0 == s.as_str())));
    if elementwise_root {
        define_gathered_leaves(eg, imp, state, ins, &mut added);
    }
    collect_leaves(eg, imp, &mut t_rel);
    let mut unfold_budget = UNFOLD_RECOMPUTED;
    unfold_recomputed(eg, imp, &mut t_rel, &mut added, &mut unfold_budget);
    unfold_indices(eg, imp, &mut t_rel, &mut added);
    if widened {
        unfold_view_sources(eg, imp, &mut t_rel, &mut added);
        define_layout_chains(eg, imp, &t_rel, &mut added);
    }
    // Rounds that bring in only 0-d values (a running sum of per-layer losses, one addition a
    // round) are not counted: a stage's chain of additions is as long as its layers, far more
    // than the rounds a tensor relation needs.
    let mut round = 0;
    let mut scalar_rounds = 0;
    let mut saturated = false;
    while round < opts.explore_rounds + opts.deepen_rounds {
        if round >= opts.explore_rounds {
            let root = eg.find(root);
            let met = expect_ids.iter().all(|&e| eg.find(e) == root);
            if met && !extract(eg, root, true).is_empty() {
                break;
            }
        }
        let mut new = Vec::new();
        for u in t_rel.iter() {
            for &(r, n) in imp.consumers.get(u).map_or(&[][..], Vec::as_slice) {
                let g: &IrGraph = &imp.case.program.ranks[r];
                for k in 0..g.nodes[n].outputs.len() {
                    let out = ValueRef {
                        rank: Some(r),
                        value: ValueId::new(n, k),
                    };
                    if imp.canon(out) != out || added.contains(&out) || imp.cut.contains(&out) {
                        continue;
                    }
                    let inputs = imp.term_inputs(out);
                    if inputs
                        .iter()
                        .all(|i| t_rel.contains(i) || imp.const_only.contains(i))
                    {
                        new.push(out);
                    }
                }
            }
        }
        new.sort();
        new.dedup();
        if new.is_empty() {
            break;
        }
        if attempt.follow_moves {
            follow_element_moves(imp, &t_rel, &added, &mut new);
        } else if !attempt.moves_deferred.get() {
            let mut followed = new.clone();
            follow_element_moves(imp, &t_rel, &added, &mut followed);
            attempt.moves_deferred.set(followed.len() > new.len());
        }
        if new.iter().all(|&v| is_float_scalar_value(imp, v)) && scalar_rounds < MAX_SCALAR_ROUNDS {
            scalar_rounds += 1;
        } else {
            round += 1;
        }
        for out in new {
            added.insert(out);
            define(eg, imp, out, &mut added);
            t_rel.insert(out);
        }
        saturate(eg, rules, opts, attempt);
        saturated = true;
        collect_leaves(eg, imp, &mut t_rel);
        unfold_recomputed(eg, imp, &mut t_rel, &mut added, &mut unfold_budget);
        unfold_indices(eg, imp, &mut t_rel, &mut added);
    }
    if !saturated {
        saturate(eg, rules, opts, attempt);
    } else if !relates_up_to_factor(eg, root) && inputs_relate_up_to_factor(state, ins) {
        // The first operator without a relation: the scheduler banned the scale rewrites
        // that name multiples by rank tensors while the last operators came in.
        for _ in 0..SCALE_PASSES {
            let changed = crate::lemmas::apply_everywhere(eg, SCALE_REWRITES);
            if !changed || relates_up_to_factor(eg, root) {
                break;
            }
        }
    }
    added
}
