//! The fast path before the e-graph (issue 48 item 4): a spec operator whose inputs relate by
//! plain placements (every replica of the tensor, or one concatenation of rank tensors along a
//! dim) and whose counterpart on the ranks is the same call over the related tensors gets its
//! relation by the placement rule of its operator family, with no e-graph.
//!
//! The rule table is the element-wise one: an operator that maps elements to elements (every
//! tensor argument of the output's shape, literal arguments the same on the ranks) computes a
//! replica from replicas, and a concatenation along dim `d` from pieces concatenated along `d`
//! alike. The operator families are `shardproof-check`'s (`rules::rule`), so the two engines
//! agree on which operators are element-wise; the placements themselves are not shared: check's
//! rules read placements per mesh dim, refine's relations name the ranks' tensors.
//!
//! Sound by construction: every leaf of an input's relation equals that input (the relation is
//! proven), so a rank tensor whose definition is the spec's call with every spec input replaced
//! by such a leaf (the same literals) equals the spec's output, or its piece; anything short of
//! that (another form, another shape, a broadcast, an operator outside the table, a zero block,
//! a seed) answers `None`, and the operator goes to the e-graph. The fast path never decides
//! that an operator is unrelated.
//!
//! The relation it builds is the one the e-graph's extraction writes for these forms: the
//! output's leaves sorted as extraction sorts them, a concatenation naming each piece by its
//! earliest-computed tensor, and the groups of equal leaves sorted alike (`Options::audit_fast_path`
//! runs both and counts every difference).

use super::relation::{Impl, Rel, State};
use crate::lower::{Lowered, Tpl, ValueRef};
use crate::term::{is_op, parse_leaf, Term, CAT};
use egg::{RecExpr, Symbol};
use shardproof_ir::ValueId;
use std::collections::{BTreeSet, HashMap};

/// The operator families of `shardproof-check`'s rule table whose calls map elements to
/// elements, deterministically, given their literal arguments: the fast path's rule table.
const ELEMENTWISE_FAMILIES: &[&str] = &[
    "linear-unary",
    "nonlinear-unary",
    "elementwise-add",
    "elementwise-mul",
    "elementwise-div",
    "nonlinear-binary",
    "pow",
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
}

/// The relation of the spec value defined by `t` by the placement rule of its family, where
/// every precondition holds (see the module's docs); `None` otherwise.
pub(super) fn decide(imp: &Impl, state: &HashMap<ValueId, State>, t: &Tpl) -> Option<Rel> {
    let Tpl::Op(name, kids) = t else {
        return None;
    };
    if !elementwise(name) {
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
            .map(|(x, f)| match f {
                Form::Replicated(l) => (*x, l),
                Form::Sharded { .. } => unreachable!(),
            })
            .collect();
        let outs = counterparts(imp, t, &replicas);
        return replicated_relation(imp, outs);
    }
    // Sharded alike: one dim, as many pieces, piece i of every input on the same shape.
    let (dim, n) = match &forms[0].1 {
        Form::Sharded { dim, pieces } => (*dim, pieces.len()),
        Form::Replicated(_) => return None,
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
    if pieces_out.iter().any(|p| combined_by_consumers(imp, p)) {
        return None;
    }
    sharded_relation(imp, dim, pieces_out)
}

/// Whether a consumer combines the rank tensors `outs` with others: a collective (it reads
/// another rank's tensor) or a concatenation. The e-graph brings such a consumer in, and where
/// it equals the spec's output (an all-gather of the pieces under sequence parallelism) the
/// output's relation also names it, which the rule would not write: the e-graph decides.
fn combined_by_consumers(imp: &Impl, outs: &BTreeSet<Leaf>) -> bool {
    outs.iter().any(|l| {
        imp.consumers.get(&l.at).is_some_and(|users| {
            users.iter().any(|&(r, node)| {
                let at = ValueRef {
                    rank: Some(r),
                    value: ValueId::new(node, 0),
                };
                Some(r) != l.at.rank
                    || matches!(imp.lowered.get(&at), Some(Lowered::Term(Tpl::Op(s, _))) if s == CAT)
            })
        })
    })
}

/// Whether the operator `name` (`aten.add.Tensor`) is in the rule table.
fn elementwise(name: &str) -> bool {
    let Some((base, _overload)) = name.rsplit_once('.') else {
        return false;
    };
    shardproof_check::rules::rule(base).is_some_and(|r| ELEMENTWISE_FAMILIES.contains(&r.family))
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
    // Every expression plain: a relation that also has composite alternatives (a sum over
    // ranks beside its all-reduced replicas, a concatenation of slices) carries them through
    // the e-graph's lemmas into the output's relation, which the rule would not write.
    if rel.exprs.iter().all(|e| single_leaf(imp, e).is_some()) {
        let mut replicas = BTreeSet::new();
        for e in &rel.exprs {
            replicas.extend(with_group(single_leaf(imp, e)?));
        }
        return Some(Form::Replicated(replicas));
    }
    // Concatenations of rank tensors along one literal dim into pieces of the same shapes:
    // piece `i` of each is piece `i` of the first (equal concatenations of equal-shaped pieces
    // have equal pieces).
    let mut first: Option<(i64, Vec<BTreeSet<Leaf>>, PieceShapes)> = None;
    for e in &rel.exprs {
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

/// A replicated output: every replica, as extraction lists the leaves of a class.
fn replicated_relation(imp: &Impl, outs: BTreeSet<Leaf>) -> Option<Rel> {
    if outs.is_empty() {
        return None;
    }
    let names = group(imp, &outs);
    let mut exprs: Vec<RecExpr<Term>> = names.iter().map(|&s| leaf_expr(s)).collect();
    exprs.sort_by_key(|e| e.to_string());
    let equal_leaves = if names.len() > 1 {
        vec![names]
    } else {
        Vec::new()
    };
    Some(Rel {
        exprs,
        clean: true,
        equal_leaves,
        equal_slices: Vec::new(),
        explored: Vec::new(),
    })
}

/// A sharded output: the concatenation of the pieces, each named by its preferred replica.
fn sharded_relation(imp: &Impl, dim: i64, pieces: Vec<BTreeSet<Leaf>>) -> Option<Rel> {
    let mut e = RecExpr::default();
    let d = e.add(Term::Num(dim));
    let mut kids = vec![d];
    for p in &pieces {
        let best = p.iter().copied().min_by_key(|&l| preference(l))?;
        kids.push(e.add(Term::Op(leaf_symbol_of(imp, best), vec![])));
    }
    e.add(Term::Op(Symbol::from(CAT), kids));
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
