//! The fast path before the e-graph (issue 48 item 4): a spec operator whose inputs relate by
//! plain placements (every replica of the tensor, or one concatenation of rank tensors along a
//! dim) and whose counterpart on the ranks is the same call over the related tensors gets its
//! relation by the placement rule of its operator family, with no e-graph.
//!
//! The rule table (`RULES`) has one rule per family of `shardproof-check`'s rule table
//! (`rules::rule`), so the two engines agree on what an operator is; the placements themselves
//! are not shared: check's rules read placements per mesh dim, refine's relations name the
//! ranks' tensors. Element-wise calls map replicas to a replica and pieces concatenated alike
//! to the concatenation of the ranks' results; deterministic calls (views, reductions, softmax)
//! map replicas to a replica; transposes and permutes move a concatenation's dim; a view of
//! a concatenation is the concatenation of the ranks' views (each to its piece's own shape)
//! where the pieces stay whole rows of the target; products concatenate over rows, batches or
//! columns and sum over contraction pieces; linear calls (a constant factor, `sub`, `add`,
//! views, transposes, permutes) over partial sums are the sums of the ranks' calls.
//!
//! Sound by construction: every leaf of an input's relation equals that input (the relation is
//! proven), so a rank tensor whose definition is the spec's call with every spec input replaced
//! by such a leaf (the same literals) equals the spec's output, or its piece, or (a
//! contraction) its summand; anything short of that (another form, another shape, a broadcast,
//! an operator outside the table, a zero block, a seed) answers `None`, and the operator goes to
//! the e-graph. The fast path never decides that an operator is unrelated.
//!
//! The relation it builds is the one the e-graph's extraction writes for these forms: the
//! output's leaves sorted as extraction sorts them, a concatenation naming each piece by its
//! earliest-computed tensor, a layout call also written over its input's cheapest form, and
//! the groups of equal leaves sorted alike. Where the e-graph would write more (a consumer
//! that combines, slices or views back the output, a permute that is a transpose, a view of a
//! view, a reduction that is a view), the fast path declines. `Options::audit_fast_path` runs
//! both and counts every difference.

use super::relation::{Impl, Rel, State};
use crate::lemmas::SCALE;
use crate::lower::{Lowered, Tpl, ValueRef};
use crate::term::{is_op, parse_leaf, Term, CAT, LIST, SLICE, SUM};
use egg::{RecExpr, Symbol};
use shardproof_ir::ValueId;
use std::collections::{BTreeSet, HashMap};

/// What the placement rule of an operator family derives from its inputs' plain forms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rule {
    /// The call maps elements to elements, deterministically, given its literal arguments:
    /// over replicas it computes a replica, and over tensors concatenated alike along dim `d`
    /// the concatenation along `d` of its results on the pieces.
    Elementwise,
    /// A transpose or permute: over replicas a replica; over a concatenation along dim `d`,
    /// the concatenation of its results on the pieces along the dim `d` moves to.
    MovesDims,
    /// A product (`mm`, `bmm`): over replicas a replica; over row pieces (or batch pieces of
    /// both operands) and a replicated right operand, the concatenation of the ranks'
    /// products along that dim; over a replicated left operand and column pieces, the
    /// concatenation along the last dim; over pieces of the contraction dim, the sum over
    /// ranks of the pieces' products (a partial sum).
    Product,
    /// A reduction: over replicas a replica, where it combines elements (over size-1 dims
    /// only it is a view, which the e-graph also writes as one).
    Reduction,
    /// The call is a deterministic function of its tensors and literal arguments: over
    /// replicas it computes a replica. Its pieces are not the spec's pieces in general (a
    /// product contracts, a view regroups, a reduction combines elements), so tensors
    /// concatenated along a dim are left to the e-graph.
    OverReplicas,
}

/// The fast path's rule table: the operator families of `shardproof-check`'s rule table
/// (`rules::rule`) it derives relations for, each with its rule. A family not listed (random
/// ones such as dropout, collectives, creation and `*_like` calls, scatters) is declined.
const RULES: &[(&str, Rule)] = &[
    ("linear-unary", Rule::Elementwise),
    ("nonlinear-unary", Rule::Elementwise),
    ("elementwise-add", Rule::Elementwise),
    ("elementwise-mul", Rule::Elementwise),
    ("elementwise-div", Rule::Elementwise),
    ("nonlinear-binary", Rule::Elementwise),
    ("pow", Rule::Elementwise),
    ("matmul", Rule::Product),
    ("matmul-bias", Rule::OverReplicas),
    ("linear", Rule::OverReplicas),
    ("view", Rule::OverReplicas),
    ("transpose", Rule::MovesDims),
    ("permute", Rule::MovesDims),
    ("unsqueeze", Rule::OverReplicas),
    ("squeeze", Rule::OverReplicas),
    ("reduction", Rule::Reduction),
    ("softmax", Rule::OverReplicas),
    ("softmax-backward", Rule::OverReplicas),
    ("activation-backward", Rule::OverReplicas),
];

/// The layout operators among extraction's clean operators (`CLEAN_OPS`), as lowering names
/// them: extraction writes a call of one over clean expressions as a clean expression.
pub(super) const LAYOUT_OPS: &[&str] = &[
    "aten.transpose.int",
    "aten.view.default",
    "aten.permute.default",
];

/// The view operator, as lowering writes every reshape.
const VIEW: &str = "aten.view.default";

/// The linear operators the fast path moves through a partial sum (`sum_i x_i`), as lowering
/// names them: additive ones (every tensor operand a partial sum over as many pieces, paired
/// piece by piece: `add`, `sub`) and those linear in their one tensor operand (a constant
/// factor, which lowering writes as `scale` for `mul.Scalar`, `div.Scalar` and `neg`; a view,
/// transpose or permute). These are the e-graph's `linear-over-sum` cases for them: the ranks'
/// call on the pieces, summed.
const LINEAR_OVER_SUMS: &[&str] = &[
    "aten.add.Tensor",
    "aten.sub.Tensor",
    SCALE,
    "aten.view.default",
    "aten.transpose.int",
    "aten.permute.default",
];

/// The shapes of a concatenation's pieces, in order.
type PieceShapes = Vec<Vec<usize>>;

/// A rank tensor named in a relation: its leaf symbol and its (canonical) value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct Leaf {
    at: ValueRef,
}

/// A relation in plain form (the preconditions of every rule).
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Form {
    /// Every listed rank tensor equals the spec tensor.
    Replicated(BTreeSet<Leaf>),
    /// The spec tensor is the concatenation along `dim` of the pieces; each piece lists every
    /// rank tensor equal to it.
    Sharded {
        dim: i64,
        pieces: Vec<BTreeSet<Leaf>>,
    },
    /// The spec tensor is the sum of the pieces (a partial sum over ranks); each piece lists
    /// every rank tensor equal to it.
    Summed { pieces: Vec<BTreeSet<Leaf>> },
}

/// The relation of the spec value defined by `t` by the placement rule of its family, where
/// every precondition holds (see the module's docs); `None` otherwise.
pub(super) fn decide(imp: &Impl, state: &HashMap<ValueId, State>, t: &Tpl) -> Option<Rel> {
    let Tpl::Op(name, kids) = t else {
        return None;
    };
    let rule = rule_of(name)?;
    if swaps_two_dims(t) {
        return None;
    }
    // A layout call or a reduction over a layout call: the e-graph composes the two (a view
    // of a view, a reduction of a view rewritten as a view) and writes that form too.
    if (is_layout(t) || rule == Rule::Reduction) && reads_layout_calls(imp, state, t) {
        return None;
    }
    if rule == Rule::Reduction && reduces_size_one_dims(imp, state, t) {
        return None;
    }
    // The spec inputs, each once, with their forms; every other argument a literal.
    let mut forms: Vec<(ValueId, Form)> = Vec::new();
    for k in kids {
        match k {
            Tpl::Value(x) if x.rank.is_none() => {
                if forms.iter().any(|(y, _)| *y == x.value) {
                    continue;
                }
                let Some(State::Related(rel)) = state.get(&x.value) else {
                    return None;
                };
                forms.push((x.value, form_of(imp, rel)?));
            }
            Tpl::Value(_) => return None,
            literal if !has_value(literal) => {}
            _ => return None,
        }
    }
    if forms.is_empty() {
        return None;
    }
    if forms.iter().all(|(_, f)| matches!(f, Form::Replicated(_))) {
        let replicas: HashMap<ValueId, &BTreeSet<Leaf>> = forms
            .iter()
            .filter_map(|(x, f)| match f {
                Form::Replicated(l) => Some((*x, l)),
                Form::Sharded { .. } | Form::Summed { .. } => None,
            })
            .collect();
        let outs = counterparts(imp, t, &replicas);
        if related_by_consumers(imp, &outs) || round_trips_through_layout(imp, &outs) {
            return None;
        }
        if is_layout(t) && replicas.values().any(|ls| related_by_consumers(imp, ls)) {
            return None;
        }
        return replicated_relation(imp, t, &forms, outs);
    }
    if forms.iter().any(|(_, f)| matches!(f, Form::Summed { .. })) {
        return linear_over_sums(imp, t, &forms);
    }
    match rule {
        Rule::Elementwise => {}
        Rule::MovesDims => return moved_shards(imp, t, &forms),
        Rule::Product => return product(imp, t, &forms),
        Rule::OverReplicas if name == VIEW => return viewed_shards(imp, t, &forms),
        Rule::OverReplicas | Rule::Reduction => return None,
    }
    // Over concatenations the e-graph relates an operator only where its element-wise table
    // has the overload (the lemma that moves it through `cat`); elsewhere the fast path would
    // relate what the e-graph leaves unrelated, and the report would change with the option.
    if !crate::lemmas::ELEMENTWISE
        .iter()
        .any(|&(op, ..)| op == name)
    {
        return None;
    }
    // Sharded alike: one dim, as many pieces, piece i of every input on the same shape.
    let (dim, n) = match &forms[0].1 {
        Form::Sharded { dim, pieces } => (*dim, pieces.len()),
        Form::Replicated(_) | Form::Summed { .. } => return None,
    };
    let mut pieces_out = Vec::with_capacity(n);
    for i in 0..n {
        let mut piece: HashMap<ValueId, &BTreeSet<Leaf>> = HashMap::new();
        for (x, f) in &forms {
            match f {
                Form::Sharded { dim: d, pieces } if *d == dim && pieces.len() == n => {
                    piece.insert(*x, &pieces[i]);
                }
                _ => return None,
            }
        }
        // Every input's piece i of one shape (the spec's shapes are equal, so the pieces pair
        // elements at the same positions).
        let shapes: BTreeSet<Vec<usize>> = piece
            .values()
            .flat_map(|ls| ls.iter())
            .map(|l| imp.meta(l.at).map(|m| m.shape))
            .collect::<Option<_>>()?;
        if shapes.len() != 1 {
            return None;
        }
        let outs = counterparts(imp, t, &piece);
        if outs.is_empty() {
            return None;
        }
        pieces_out.push(outs);
    }
    if pieces_out
        .iter()
        .any(|p| related_by_consumers(imp, p) || round_trips_through_layout(imp, p))
    {
        return None;
    }
    sharded_relation(imp, dim, pieces_out)
}

/// Whether a consumer relates the rank tensors `outs` to others: a collective (it reads
/// another rank's tensor), a concatenation, or a slice (a split, a rank's own chunk of a
/// replica under sequence parallelism). The e-graph brings such a consumer in, and where it
/// equals the spec's output (an all-gather of the pieces, the concatenation of the ranks'
/// chunks) the output's relation also names it, which the rule would not write: the e-graph
/// decides.
fn related_by_consumers(imp: &Impl, outs: &BTreeSet<Leaf>) -> bool {
    outs.iter().any(|l| {
        imp.consumers.get(&l.at).is_some_and(|users| {
            users.iter().any(|&(r, node)| {
                let at = ValueRef {
                    rank: Some(r),
                    value: ValueId::new(node, 0),
                };
                Some(r) != l.at.rank
                    || matches!(imp.lowered.get(&at), Some(Lowered::Term(Tpl::Op(s, _))) if s == CAT || s == SLICE)
            })
        })
    })
}

/// Whether a layout call over one of the tensors `outs` is read by a layout call back to
/// its shape (a view of a view, a transpose of a transpose): the e-graph composes the two
/// into the tensor itself and names the result among its equal leaves, which the rule does
/// not write.
fn round_trips_through_layout(imp: &Impl, outs: &BTreeSet<Leaf>) -> bool {
    let layout_users = |x: ValueRef| -> Vec<ValueRef> {
        imp.consumers
            .get(&x)
            .into_iter()
            .flatten()
            .map(|&(r, node)| ValueRef {
                rank: Some(r),
                value: ValueId::new(node, 0),
            })
            .filter(|at| matches!(imp.lowered.get(at), Some(Lowered::Term(u)) if is_layout(u)))
            .collect()
    };
    outs.iter().any(|l| {
        let shape = imp.meta(l.at).map(|m| m.shape);
        layout_users(l.at).into_iter().any(|once| {
            layout_users(once)
                .into_iter()
                .any(|twice| imp.meta(twice).map(|m| m.shape) == shape)
        })
    })
}

/// Whether some rank call reads tensors of two of the pieces (a rank adding its
/// microbatches' partial products, a collective over the ranks' partial products).
fn combines_pieces(imp: &Impl, pieces: &[BTreeSet<Leaf>]) -> bool {
    let piece_of: HashMap<ValueRef, usize> = pieces
        .iter()
        .enumerate()
        .flat_map(|(i, p)| p.iter().map(move |l| (l.at, i)))
        .collect();
    pieces.iter().flatten().any(|l| {
        imp.consumers.get(&l.at).is_some_and(|users| {
            users.iter().any(|&(r, node)| {
                let g = &imp.case.program.ranks[r];
                (0..g.nodes[node].outputs.len()).any(|k| {
                    let at = ValueRef {
                        rank: Some(r),
                        value: ValueId::new(node, k),
                    };
                    let Some(Lowered::Term(u)) = imp.lowered.get(&at) else {
                        return false;
                    };
                    let mut read = Vec::new();
                    super::relation::tpl_values(u, &mut read);
                    let touched: BTreeSet<usize> = read
                        .iter()
                        .filter_map(|x| piece_of.get(&imp.canon(*x)).copied())
                        .collect();
                    touched.len() > 1
                })
            })
        })
    })
}

/// Whether the reduction `t` reduces only dims of size 1 of its input (it keeps every
/// element: the e-graph also writes it as a view). Unknown shapes count as such (declined).
fn reduces_size_one_dims(imp: &Impl, state: &HashMap<ValueId, State>, t: &Tpl) -> bool {
    let Tpl::Op(_, kids) = t else {
        return true;
    };
    let Some(Tpl::Value(x)) = kids.first() else {
        return true;
    };
    let Some(State::Related(rel)) = state.get(&x.value) else {
        return true;
    };
    // A replica's shape is the spec input's.
    let Some(shape) = rel
        .exprs
        .iter()
        .find_map(|e| single_leaf(imp, e))
        .and_then(|l| imp.meta(l.at))
        .map(|m| m.shape)
    else {
        return true;
    };
    if !shape.contains(&1) {
        return false;
    }
    // The dims reduced: a literal dim or list after the input, else every dim.
    let rank = shape.len() as i64;
    let dims: Vec<i64> = match kids.get(1) {
        Some(Tpl::Num(d)) => vec![*d],
        Some(Tpl::Op(_, ds)) if !has_value(&kids[1]) => ds
            .iter()
            .filter_map(|d| match d {
                Tpl::Num(d) => Some(*d),
                _ => None,
            })
            .collect(),
        _ => (0..rank).collect(),
    };
    dims.iter().all(|&d| {
        let d = if d < 0 { d + rank } else { d };
        usize::try_from(d)
            .ok()
            .and_then(|d| shape.get(d))
            .is_none_or(|&n| n == 1)
    })
}

/// The rule of the operator `name` (`aten.add.Tensor`), by its family in `shardproof-check`'s
/// rule table; `None` outside the fast path's table.
fn rule_of(name: &str) -> Option<Rule> {
    // Lowering writes multiplication and division by a constant, and negation, as `scale`:
    // check's linear-unary family.
    if name == SCALE {
        return Some(Rule::Elementwise);
    }
    let (base, _overload) = name.rsplit_once('.')?;
    let family = shardproof_check::rules::rule(base)?.family;
    RULES.iter().find(|(f, _)| *f == family).map(|&(_, r)| r)
}

fn has_value(t: &Tpl) -> bool {
    match t {
        Tpl::Value(_) => true,
        Tpl::Num(_) => false,
        Tpl::Op(_, kids) => kids.iter().any(has_value),
    }
}

/// The rank tensor a leaf symbol names.
fn leaf_of(imp: &Impl, sym: Symbol) -> Option<Leaf> {
    let (r, name) = parse_leaf(sym.as_str())?;
    let at = ValueRef {
        rank: Some(r),
        value: imp.find(r, name)?,
    };
    Some(Leaf { at: imp.canon(at) })
}

/// The single leaf of an expression, if it is one.
fn single_leaf(imp: &Impl, e: &RecExpr<Term>) -> Option<Leaf> {
    match e.as_ref() {
        [Term::Op(s, kids)] if kids.is_empty() => leaf_of(imp, *s),
        _ => None,
    }
}

/// The plain form of a relation, or `None`: leaves only (replicas), or concatenations of
/// leaves along one literal dim into pieces of the same shapes.
pub(super) fn form_of(imp: &Impl, rel: &Rel) -> Option<Form> {
    // Groups of leaves proven equal, where every member is a plain rank tensor.
    let groups: Vec<BTreeSet<Leaf>> = rel
        .equal_leaves
        .iter()
        .filter_map(|g| g.iter().map(|&s| leaf_of(imp, s)).collect::<Option<_>>())
        .collect();
    // A leaf with every leaf proven equal to it.
    let with_group = |l: Leaf| -> BTreeSet<Leaf> {
        let mut out: BTreeSet<Leaf> = groups
            .iter()
            .filter(|g| g.contains(&l))
            .flatten()
            .copied()
            .collect();
        out.insert(l);
        out
    };
    // A layout call over the input's own plain form (what extraction writes beside the
    // output of a view, transpose or permute) names nothing new: skipped. Every other
    // expression plain: a relation that also has composite alternatives (a sum over ranks
    // beside its all-reduced replicas, a concatenation of slices) carries them through the
    // e-graph's lemmas into the output's relation, which the rule would not write.
    let plain: Vec<&RecExpr<Term>> = rel.exprs.iter().filter(|e| !layout_expr(e)).collect();
    if plain.is_empty() {
        return None;
    }
    if plain.iter().all(|e| single_leaf(imp, e).is_some()) {
        let mut replicas = BTreeSet::new();
        for e in &plain {
            replicas.extend(with_group(single_leaf(imp, e)?));
        }
        return Some(Form::Replicated(replicas));
    }
    // A partial sum: one sum of rank tensors. Equal sums need not have equal summands, so a
    // second expression is not merged piece by piece: declined.
    if let Some(leaves) = sum_of_leaves(imp, plain[0]) {
        if plain.len() != 1 {
            return None;
        }
        let pieces = leaves.into_iter().map(with_group).collect();
        return Some(Form::Summed { pieces });
    }
    // Concatenations of rank tensors along one literal dim into pieces of the same shapes:
    // piece `i` of each is piece `i` of the first (equal concatenations of equal-shaped pieces
    // have equal pieces).
    let mut first: Option<(i64, Vec<BTreeSet<Leaf>>, PieceShapes)> = None;
    for e in plain {
        let (dim, leaves) = cat_of_leaves(imp, e)?;
        let shapes: PieceShapes = leaves
            .iter()
            .map(|l| imp.meta(l.at).map(|m| m.shape))
            .collect::<Option<_>>()?;
        match &mut first {
            None => {
                let pieces = leaves.into_iter().map(with_group).collect();
                first = Some((dim, pieces, shapes));
            }
            Some((d, pieces, first_shapes)) => {
                if *d != dim || *first_shapes != shapes {
                    return None;
                }
                for (p, l) in pieces.iter_mut().zip(leaves) {
                    p.extend(with_group(l));
                }
            }
        }
    }
    first.map(|(dim, pieces, _)| Form::Sharded { dim, pieces })
}

/// Whether the expression is a layout call (`CLEAN_OPS`: a view, transpose or permute) over
/// a rank tensor or a concatenation of rank tensors.
fn layout_expr(e: &RecExpr<Term>) -> bool {
    let nodes = e.as_ref();
    let Some(Term::Op(s, kids)) = nodes.last() else {
        return false;
    };
    let is_leaf = |l: &egg::Id| matches!(&nodes[usize::from(*l)], Term::Op(p, pk) if pk.is_empty() && p.as_str().starts_with("%r"));
    let over = |k: &egg::Id| match &nodes[usize::from(*k)] {
        Term::Op(p, pk) if pk.is_empty() => p.as_str().starts_with("%r"),
        Term::Op(c, ck) if is_op!(c, CAT) => ck[1..].iter().all(is_leaf),
        Term::Op(c, ck) if is_op!(c, SUM) => ck.iter().all(is_leaf),
        _ => false,
    };
    LAYOUT_OPS.contains(&s.as_str()) && kids.first().is_some_and(over)
}

/// The dim and pieces of a concatenation of rank tensors along a literal dim.
fn cat_of_leaves(imp: &Impl, e: &RecExpr<Term>) -> Option<(i64, Vec<Leaf>)> {
    let nodes = e.as_ref();
    let Some(Term::Op(s, kids)) = nodes.last() else {
        return None;
    };
    if !is_op!(s, CAT) || kids.len() < 3 {
        return None;
    }
    let Term::Num(dim) = nodes[usize::from(kids[0])] else {
        return None;
    };
    let mut pieces = Vec::new();
    for &k in &kids[1..] {
        let Term::Op(p, pk) = &nodes[usize::from(k)] else {
            return None;
        };
        if !pk.is_empty() {
            return None;
        }
        pieces.push(leaf_of(imp, *p)?);
    }
    Some((dim, pieces))
}

/// The summands of a sum of rank tensors (at least two), in order.
fn sum_of_leaves(imp: &Impl, e: &RecExpr<Term>) -> Option<Vec<Leaf>> {
    let nodes = e.as_ref();
    let Some(Term::Op(s, kids)) = nodes.last() else {
        return None;
    };
    if !is_op!(s, SUM) || kids.len() < 2 {
        return None;
    }
    kids.iter()
        .map(|&k| match &nodes[usize::from(k)] {
            Term::Op(p, pk) if pk.is_empty() => leaf_of(imp, *p),
            _ => None,
        })
        .collect()
}

/// The rank tensors whose definition is the spec's call `t` with every spec input replaced by
/// one of its given rank tensors (the same literals, the same operator).
fn counterparts(imp: &Impl, t: &Tpl, inputs: &HashMap<ValueId, &BTreeSet<Leaf>>) -> BTreeSet<Leaf> {
    let mut out = BTreeSet::new();
    let Some(first) = first_value(t) else {
        return out;
    };
    for l in inputs[&first].iter() {
        let Some(users) = imp.consumers.get(&l.at) else {
            continue;
        };
        for &(r, node) in users {
            let g = &imp.case.program.ranks[r];
            for k in 0..g.nodes[node].outputs.len() {
                let z = ValueRef {
                    rank: Some(r),
                    value: ValueId::new(node, k),
                };
                if imp.canon(z) != z {
                    continue;
                }
                let Some(Lowered::Term(u)) = imp.lowered.get(&z) else {
                    continue;
                };
                if same_call(imp, t, u, inputs) {
                    out.insert(Leaf { at: z });
                }
            }
        }
    }
    out
}

fn first_value(t: &Tpl) -> Option<ValueId> {
    match t {
        Tpl::Value(x) => Some(x.value),
        Tpl::Num(_) => None,
        Tpl::Op(_, kids) => kids.iter().find_map(first_value),
    }
}

/// Whether the rank term `u` is the spec term `t` with each spec input replaced by one of its
/// rank tensors.
fn same_call(imp: &Impl, t: &Tpl, u: &Tpl, inputs: &HashMap<ValueId, &BTreeSet<Leaf>>) -> bool {
    match (t, u) {
        (Tpl::Value(x), Tpl::Value(w)) => {
            let w = imp.canon(*w);
            inputs
                .get(&x.value)
                .is_some_and(|ls| ls.contains(&Leaf { at: w }))
        }
        (Tpl::Num(a), Tpl::Num(b)) => a == b,
        (Tpl::Op(a, ak), Tpl::Op(b, bk)) => {
            a == b
                && ak.len() == bk.len()
                && ak.iter().zip(bk).all(|(x, y)| same_call(imp, x, y, inputs))
        }
        _ => false,
    }
}

fn leaf_symbol_of(imp: &Impl, l: Leaf) -> Symbol {
    Symbol::from(crate::term::leaf_symbol(
        l.at.rank.unwrap_or(0),
        &imp.name(l.at),
    ))
}

fn leaf_expr(sym: Symbol) -> RecExpr<Term> {
    let mut e = RecExpr::default();
    e.add(Term::Op(sym, vec![]));
    e
}

/// Extraction's preference among equal leaves: the earliest computed, then the lowest rank.
fn preference(l: Leaf) -> (usize, usize) {
    (l.at.value.node, l.at.rank.unwrap_or(0))
}

/// A group of equal leaves as extraction writes it: sorted by name.
fn group(imp: &Impl, ls: &BTreeSet<Leaf>) -> Vec<Symbol> {
    let mut g: Vec<Symbol> = ls.iter().map(|&l| leaf_symbol_of(imp, l)).collect();
    g.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    g
}

/// A replicated output: every replica, as extraction lists the leaves of a class. A layout
/// operator (`CLEAN_OPS`: a view, transpose or permute) is clean itself, so extraction also
/// writes the spec's call over each input's preferred replica (after the leaves, which are
/// smaller), and the groups of equal leaves then include the inputs' replicas it names.
fn replicated_relation(
    imp: &Impl,
    t: &Tpl,
    inputs: &[(ValueId, Form)],
    outs: BTreeSet<Leaf>,
) -> Option<Rel> {
    if outs.is_empty() {
        return None;
    }
    let names = group(imp, &outs);
    let mut exprs: Vec<RecExpr<Term>> = names.iter().map(|&s| leaf_expr(s)).collect();
    exprs.sort_by_key(|e| e.to_string());
    let mut equal_leaves = if names.len() > 1 {
        vec![names]
    } else {
        Vec::new()
    };
    if is_layout(t) {
        add_layout_form(imp, t, inputs, &mut exprs, &mut equal_leaves)?;
    }
    Some(Rel {
        exprs,
        clean: true,
        equal_leaves,
        equal_slices: Vec::new(),
        explored: Vec::new(),
    })
}

/// Whether the spec's call `t` is a layout operator that extraction counts as clean
/// (`CLEAN_OPS`: a view, transpose or permute).
fn is_layout(t: &Tpl) -> bool {
    matches!(t, Tpl::Op(name, _) if LAYOUT_OPS.contains(&name.as_str()))
}

/// A layout call is clean itself, so extraction also writes the spec's call over each input's
/// cheapest clean expression (a replica, or the concatenation of the pieces, each by its
/// preferred tensor), after the output's smaller forms; the groups of equal leaves then
/// include those of the tensors it names.
fn add_layout_form(
    imp: &Impl,
    t: &Tpl,
    inputs: &[(ValueId, Form)],
    exprs: &mut Vec<RecExpr<Term>>,
    equal_leaves: &mut Vec<Vec<Symbol>>,
) -> Option<()> {
    let mut e = RecExpr::default();
    over_preferred(imp, t, inputs, &mut e)?;
    exprs.push(e);
    let mut named: Vec<&BTreeSet<Leaf>> = Vec::new();
    for (_, f) in inputs {
        match f {
            Form::Replicated(ls) => named.push(ls),
            Form::Sharded { pieces, .. } | Form::Summed { pieces } => named.extend(pieces),
        }
    }
    named.sort();
    named.dedup();
    equal_leaves.extend(
        named
            .into_iter()
            .filter(|ls| ls.len() > 1)
            .map(|ls| group(imp, ls)),
    );
    equal_leaves.sort_by(|a, b| a[0].as_str().cmp(b[0].as_str()));
    equal_leaves.dedup();
    Some(())
}

/// The preferred tensor among equal ones (extraction's choice).
fn preferred(ls: &BTreeSet<Leaf>) -> Option<Leaf> {
    ls.iter().copied().min_by_key(|&l| preference(l))
}

/// The spec's call `t` with each spec input replaced by its cheapest clean expression (its
/// preferred replica, or the concatenation of its pieces' preferred tensors), added to `e`.
fn over_preferred(
    imp: &Impl,
    t: &Tpl,
    inputs: &[(ValueId, Form)],
    e: &mut RecExpr<Term>,
) -> Option<egg::Id> {
    Some(match t {
        Tpl::Value(x) => match &inputs.iter().find(|(y, _)| *y == x.value)?.1 {
            Form::Replicated(ls) => e.add(Term::Op(leaf_symbol_of(imp, preferred(ls)?), vec![])),
            Form::Sharded { dim, pieces } => {
                let mut kids = vec![e.add(Term::Num(*dim))];
                for p in pieces {
                    kids.push(e.add(Term::Op(leaf_symbol_of(imp, preferred(p)?), vec![])));
                }
                e.add(Term::Op(Symbol::from(CAT), kids))
            }
            Form::Summed { pieces } => {
                let mut kids = Vec::with_capacity(pieces.len());
                for p in pieces {
                    kids.push(e.add(Term::Op(leaf_symbol_of(imp, preferred(p)?), vec![])));
                }
                e.add(Term::Op(Symbol::from(SUM), kids))
            }
        },
        Tpl::Num(n) => e.add(Term::Num(*n)),
        Tpl::Op(s, kids) => {
            let ids = kids
                .iter()
                .map(|k| over_preferred(imp, k, inputs, e))
                .collect::<Option<Vec<_>>>()?;
            e.add(Term::Op(Symbol::from(s.as_str()), ids))
        }
    })
}

/// A transpose or permute of a concatenation along `dim`: the concatenation, along the dim
/// `dim` moves to, of the ranks' same call on each piece, and (a layout call) the spec's call
/// over the input's concatenation.
fn moved_shards(imp: &Impl, t: &Tpl, forms: &[(ValueId, Form)]) -> Option<Rel> {
    let [(x, Form::Sharded { dim, pieces })] = forms else {
        return None;
    };
    let out_dim = moved_dim(t, *dim)?;
    let mut pieces_out = Vec::with_capacity(pieces.len());
    for p in pieces {
        let outs = counterparts(imp, t, &HashMap::from([(*x, p)]));
        if outs.is_empty()
            || related_by_consumers(imp, &outs)
            || round_trips_through_layout(imp, &outs)
            || related_by_consumers(imp, p)
        {
            return None;
        }
        pieces_out.push(outs);
    }
    let mut rel = sharded_relation(imp, out_dim, pieces_out)?;
    add_layout_form(imp, t, forms, &mut rel.exprs, &mut rel.equal_leaves)?;
    Some(rel)
}

/// A view of a concatenation along `dim` (see `view-over-cat` in the lemmas): where the dims
/// before the concatenated one flatten to whole dims of the target (their product is the
/// product of the target's first `td` dims) and every piece fills whole rows of the target's
/// dim `td`, the view is the concatenation along `td` of the ranks' views of the pieces, each
/// to the target with dim `td` scaled to its piece (the ranks' own shape literals), and (a
/// layout call) the spec's view of the input's concatenation. Where the pieces interleave in
/// the target (a dim of more than one element before the split one in its group, as a view
/// merging heads into the batch of tensor-parallel heads), the e-graph writes only the view
/// of the concatenation and relates what follows through its chunk lemmas: declined.
fn viewed_shards(imp: &Impl, t: &Tpl, forms: &[(ValueId, Form)]) -> Option<Rel> {
    let [(x, Form::Sharded { dim, pieces })] = forms else {
        return None;
    };
    let Tpl::Op(name, kids) = t else {
        return None;
    };
    let [Tpl::Value(_), Tpl::Op(list, target)] = kids.as_slice() else {
        return None;
    };
    if list != LIST {
        return None;
    }
    let target: Vec<usize> = target
        .iter()
        .map(|d| match d {
            Tpl::Num(n) => usize::try_from(*n).ok(),
            _ => None,
        })
        .collect::<Option<_>>()?;
    let d = usize::try_from(*dim).ok()?;
    // The input's shape: its pieces' (equal but for dim `d`) with dim `d` their sum.
    let piece_shapes: Vec<Vec<usize>> = pieces
        .iter()
        .map(|p| preferred(p).and_then(|l| imp.meta(l.at)).map(|m| m.shape))
        .collect::<Option<_>>()?;
    let mut src = piece_shapes.first()?.clone();
    if d >= src.len() {
        return None;
    }
    for s in &piece_shapes {
        if s.len() != src.len() || (0..s.len()).any(|k| k != d && s[k] != src[k]) {
            return None;
        }
    }
    src[d] = piece_shapes.iter().map(|s| s[d]).sum();
    if src.iter().product::<usize>() != target.iter().product::<usize>() {
        return None;
    }
    let (td, rest, trest) = crate::lemmas::layout::cat_dim_in_view(&src, &target, d)?;
    if trest == 0 {
        return None;
    }
    let mut pieces_out = Vec::with_capacity(pieces.len());
    for (p, shape) in pieces.iter().zip(&piece_shapes) {
        let rows = shape[d] * rest;
        if !rows.is_multiple_of(trest) {
            return None;
        }
        let mut own = target.clone();
        own[td] = rows / trest;
        let own: Vec<i64> = own
            .iter()
            .map(|&n| i64::try_from(n).ok())
            .collect::<Option<_>>()?;
        let call = Tpl::Op(
            name.clone(),
            vec![kids[0].clone(), crate::lower::int_list(&own)],
        );
        let outs = counterparts(imp, &call, &HashMap::from([(*x, p)]));
        if outs.is_empty()
            || related_by_consumers(imp, &outs)
            || round_trips_through_layout(imp, &outs)
            || related_by_consumers(imp, p)
        {
            return None;
        }
        pieces_out.push(outs);
    }
    let mut rel = sharded_relation(imp, i64::try_from(td).ok()?, pieces_out)?;
    add_layout_form(imp, t, forms, &mut rel.exprs, &mut rel.equal_leaves)?;
    Some(rel)
}

/// A linear operator over partial sums (`LINEAR_OVER_SUMS`): the sum over the pieces of the
/// ranks' same call on them (piece `i` of every operand for `add` and `sub`), as the e-graph's
/// `linear-over-sum` writes it, and (a layout call) the spec's call over the input's sum.
/// Every operand a partial sum over as many pieces. Sound: `f(sum_i x_i, sum_i y_i) =
/// sum_i f(x_i, y_i)` for `f` additive (broadcasting is linear too), and `f(sum_i x_i) =
/// sum_i f(x_i)` for `f` linear in its one tensor operand.
fn linear_over_sums(imp: &Impl, t: &Tpl, forms: &[(ValueId, Form)]) -> Option<Rel> {
    let Tpl::Op(name, _) = t else {
        return None;
    };
    // Whether the operator is additive or linear in its one tensor operand, the ranks' calls
    // pair the operands' pieces by index (one operand: each piece alone).
    if !LINEAR_OVER_SUMS.contains(&name.as_str()) {
        return None;
    }
    let mut operands: Vec<(ValueId, &Vec<BTreeSet<Leaf>>)> = Vec::with_capacity(forms.len());
    for (x, f) in forms {
        let Form::Summed { pieces } = f else {
            return None;
        };
        operands.push((*x, pieces));
    }
    let n = operands[0].1.len();
    if operands.iter().any(|(_, p)| p.len() != n) {
        return None;
    }
    if adds_into_terms(imp, t, &operands) {
        return None;
    }
    let mut pieces_out = Vec::with_capacity(n);
    for i in 0..n {
        let piece: HashMap<ValueId, &BTreeSet<Leaf>> =
            operands.iter().map(|(x, p)| (*x, &p[i])).collect();
        let outs = counterparts(imp, t, &piece);
        if outs.is_empty()
            || related_by_consumers(imp, &outs)
            || round_trips_through_layout(imp, &outs)
        {
            return None;
        }
        if is_layout(t) && piece.values().any(|p| related_by_consumers(imp, p)) {
            return None;
        }
        pieces_out.push(outs);
    }
    // Summands some call combines are related to the sum too: the e-graph decides.
    if combines_pieces(imp, &pieces_out) {
        return None;
    }
    let mut rel = summed_relation(imp, pieces_out)?;
    if is_layout(t) {
        add_layout_form(imp, t, forms, &mut rel.exprs, &mut rel.equal_leaves)?;
    }
    Some(rel)
}

/// Whether `t` is an `add` (alpha 1) of full-shaped summands: the e-graph writes a sum
/// whose term is such an addition also with the addition's two operands as terms
/// (`add-into-sum`), one form per combination of terms, which the rule does not write.
fn adds_into_terms(imp: &Impl, t: &Tpl, operands: &[(ValueId, &Vec<BTreeSet<Leaf>>)]) -> bool {
    let Tpl::Op(name, kids) = t else {
        return false;
    };
    if name != "aten.add.Tensor" {
        return false;
    }
    // Alpha, unless a literal other than 1 (as the lemma reads it, `1` or `f:1.0`).
    let other_alpha = match kids.get(2) {
        Some(Tpl::Num(a)) => *a != 1,
        Some(Tpl::Op(s, k)) if k.is_empty() => s
            .strip_prefix("f:")
            .and_then(|f| f.parse::<f64>().ok())
            .is_some_and(|f| f != 1.0),
        _ => false,
    };
    if other_alpha {
        return false;
    }
    let shapes: BTreeSet<Option<Vec<usize>>> = operands
        .iter()
        .flat_map(|(_, p)| p.iter().flatten())
        .map(|l| imp.meta(l.at).map(|m| m.shape))
        .collect();
    shapes.len() == 1
}

/// Whether a spec input of the call `t` is one that a rank defines by a layout call,
/// or whose relation writes it as one: the e-graph composes the two (a view of a view is one
/// view of the first's input) and writes that form too, which the rule does not write.
fn reads_layout_calls(imp: &Impl, state: &HashMap<ValueId, State>, t: &Tpl) -> bool {
    let Tpl::Op(_, kids) = t else {
        return false;
    };
    kids.iter().any(|k| {
        let Tpl::Value(x) = k else {
            return false;
        };
        let Some(State::Related(rel)) = state.get(&x.value) else {
            return true;
        };
        rel.exprs.iter().any(|e| {
            e.as_ref().iter().any(|n| match n {
                Term::Op(s, kids) if kids.is_empty() && s.as_str().starts_with("%r") => leaf_of(
                    imp, *s,
                )
                .is_none_or(
                    |l| matches!(imp.lowered.get(&l.at), Some(Lowered::Term(u)) if is_layout(u)),
                ),
                Term::Op(s, _) => LAYOUT_OPS.contains(&s.as_str()),
                Term::Num(_) => false,
            })
        }) || rel.equal_leaves.iter().flatten().any(|&s| {
            leaf_of(imp, s).is_none_or(
                |l| matches!(imp.lowered.get(&l.at), Some(Lowered::Term(u)) if is_layout(u)),
            )
        })
    })
}

/// Whether `t` is a permute that swaps two dims: the e-graph also writes it as a transpose,
/// a form the rule does not write.
fn swaps_two_dims(t: &Tpl) -> bool {
    let Tpl::Op(name, kids) = t else {
        return false;
    };
    match (name.as_str(), kids.as_slice()) {
        ("aten.permute.default", [_, Tpl::Op(_, p)]) => {
            let moved = p
                .iter()
                .enumerate()
                .filter(|(i, q)| !matches!(q, Tpl::Num(q) if *q == *i as i64))
                .count();
            moved == 2
        }
        _ => false,
    }
}

/// Where a transpose (`aten.transpose.int(x, a, b)`, dims normalized) or a permute
/// (`aten.permute.default(x, [p...])`) moves dim `d` of its input.
fn moved_dim(t: &Tpl, d: i64) -> Option<i64> {
    let Tpl::Op(name, kids) = t else {
        return None;
    };
    match (name.as_str(), kids.as_slice()) {
        ("aten.transpose.int", [_, Tpl::Num(a), Tpl::Num(b)]) => Some(if d == *a {
            *b
        } else if d == *b {
            *a
        } else {
            d
        }),
        ("aten.permute.default", [_, Tpl::Op(list, p)]) if list == LIST => {
            let at = p.iter().position(|q| matches!(q, Tpl::Num(q) if *q == d))?;
            i64::try_from(at).ok()
        }
        _ => None,
    }
}

/// A product (`mm`, `bmm`) over operands of which at least one is concatenated (see
/// [`Rule::Product`]): each piece of the output is the ranks' product of the operands'
/// matching pieces, and a contraction over pieces is their sum. Other layouts (a product
/// over one operand twice, a split the product interleaves, `matmul`'s broadcasting forms)
/// are declined.
fn product(imp: &Impl, t: &Tpl, forms: &[(ValueId, Form)]) -> Option<Rel> {
    let Tpl::Op(name, kids) = t else {
        return None;
    };
    let dims: i64 = match name.as_str() {
        "aten.mm.default" => 2,
        "aten.bmm.default" => 3,
        _ => return None,
    };
    let [Tpl::Value(a), Tpl::Value(b)] = kids.as_slice() else {
        return None;
    };
    let (Some((_, fa)), Some((_, fb))) = (
        forms.iter().find(|(x, _)| *x == a.value),
        forms.iter().find(|(x, _)| *x == b.value),
    ) else {
        return None;
    };
    if a.value == b.value {
        return None;
    }
    // The pieces of each operand, per output piece (a replicated operand in every one).
    let pieces_of = |f: &Form, n: usize| -> Vec<BTreeSet<Leaf>> {
        match f {
            Form::Replicated(ls) => vec![ls.clone(); n],
            Form::Sharded { pieces, .. } | Form::Summed { pieces } => pieces.clone(),
        }
    };
    let (out_dim, n) = match (fa, fb) {
        (Form::Replicated(_), Form::Sharded { dim, pieces }) if *dim == dims - 1 => {
            (Some(dims - 1), pieces.len())
        }
        (Form::Sharded { dim, pieces }, Form::Replicated(_)) if *dim < dims - 1 => {
            (Some(*dim), pieces.len())
        }
        (
            Form::Sharded {
                dim: da,
                pieces: pa,
            },
            Form::Sharded {
                dim: db,
                pieces: pb,
            },
        ) if pa.len() == pb.len() => {
            if dims == 3 && *da == 0 && *db == 0 {
                (Some(0), pa.len())
            } else if *da == dims - 1 && *db == dims - 2 {
                (None, pa.len())
            } else {
                return None;
            }
        }
        _ => return None,
    };
    let (pa, pb) = (pieces_of(fa, n), pieces_of(fb, n));
    let mut pieces_out = Vec::with_capacity(n);
    for i in 0..n {
        let outs = counterparts(
            imp,
            t,
            &HashMap::from([(a.value, &pa[i]), (b.value, &pb[i])]),
        );
        if outs.is_empty() {
            return None;
        }
        pieces_out.push(outs);
    }
    // A collective over the partial products (an all-reduce's whole sum, a reduce-scatter's
    // pieces of it) is related to the output too: the e-graph decides.
    if pieces_out
        .iter()
        .any(|p| related_by_consumers(imp, p) || round_trips_through_layout(imp, p))
    {
        return None;
    }
    // Summands some call combines (a rank adding its microbatches' partial products) are
    // related to the sum too: the e-graph decides.
    if out_dim.is_none() && combines_pieces(imp, &pieces_out) {
        return None;
    }
    match out_dim {
        Some(d) => sharded_relation(imp, d, pieces_out),
        None => summed_relation(imp, pieces_out),
    }
}

/// A partial sum: the sum over the pieces of each one's preferred tensor, as extraction
/// writes it, with the groups of equal tensors among each piece's.
fn summed_relation(imp: &Impl, pieces: Vec<BTreeSet<Leaf>>) -> Option<Rel> {
    pieces_relation(imp, SUM, None, &pieces)
}

/// A sharded output: the concatenation of the pieces, each named by its preferred replica.
fn sharded_relation(imp: &Impl, dim: i64, pieces: Vec<BTreeSet<Leaf>>) -> Option<Rel> {
    pieces_relation(imp, CAT, Some(dim), &pieces)
}

/// `op` (a `cat` along `dim`, or a `sum`) over each piece's preferred tensor, with the groups
/// of equal tensors among each piece's, sorted as extraction writes them.
fn pieces_relation(
    imp: &Impl,
    op: &str,
    dim: Option<i64>,
    pieces: &[BTreeSet<Leaf>],
) -> Option<Rel> {
    let mut e = RecExpr::default();
    let mut kids: Vec<_> = dim.map(|d| e.add(Term::Num(d))).into_iter().collect();
    for p in pieces {
        kids.push(e.add(Term::Op(leaf_symbol_of(imp, preferred(p)?), vec![])));
    }
    e.add(Term::Op(Symbol::from(op), kids));
    let mut equal_leaves: Vec<Vec<Symbol>> = pieces
        .iter()
        .filter(|p| p.len() > 1)
        .map(|p| group(imp, p))
        .collect();
    equal_leaves.sort_by(|a, b| a[0].as_str().cmp(b[0].as_str()));
    Some(Rel {
        exprs: vec![e],
        clean: true,
        equal_leaves,
        equal_slices: Vec::new(),
        explored: Vec::new(),
    })
}

/// Whether two relations are written alike (the audit's comparison).
pub(super) fn same_relation(a: &State, b: &State) -> bool {
    let (State::Related(a), State::Related(b)) = (a, b) else {
        return false;
    };
    let strings = |es: &[RecExpr<Term>]| es.iter().map(|e| e.to_string()).collect::<Vec<_>>();
    a.clean == b.clean
        && strings(&a.exprs) == strings(&b.exprs)
        && a.equal_leaves == b.equal_leaves
        && a.equal_slices.len() == b.equal_slices.len()
        && a.equal_slices
            .iter()
            .zip(&b.equal_slices)
            .all(|(x, y)| strings(x) == strings(y))
        && a.explored == b.explored
}
