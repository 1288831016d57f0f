//! Piecewise inference: where an operator's e-graph outgrew the node limit, its relation is
//! inferred piece by piece along a dim where its operands split, each piece in an e-graph of
//! its own, and the pieces' relations are joined back.

use super::evidence::leaf_ranks;
use super::explore::rescaled;
use super::extract::extract;
use super::relation::{
    add_rec, add_relation, add_tpl, clean_up_to_factor, tpl_values, Impl, Rel, State,
};
use super::reuse::{across_ranks, Miss, Solved};
use super::saturate::{infer_one, new_graph, Attempt};
use super::seeds::seed_sides;
use super::Options;
use crate::lemmas::pieces::{Cut, Split};
use crate::lemmas::{product_reduced, same_ratio, Graph, SCALE};
use crate::lower::{Tpl, ValueRef};
use crate::term::{is_op, Shapes, Term, CAT, LIST};
use egg::{Id, Language, RecExpr, Rewrite, Symbol};
use shardproof_ir::ValueId;
use std::collections::{BTreeSet, HashMap};

/// How many times a piece is cut into pieces again: once, for the head groups of a batch
/// row (each dim of the mesh that parts the attention's batch x heads is one level).
const MAX_PIECE_DEPTH: usize = 1;

/// How many times the node limit a piece's e-graph may grow to: a piece is one group's share
/// of an operator whose e-graph outgrew the limit, and still holds every block of that group.
const PIECE_NODE_FACTOR: usize = 2;

/// A spec operator's relation inferred piece by piece along one of its dims, for an operator
/// whose e-graph outgrew the node limit: where the operator keeps a dim independent down to a
/// concatenation in its operands' relations (the data-parallel groups' batch rows, the
/// tensor-parallel groups' heads; the leading dim first), rows `[a, b)` of the output there
/// are the operator over rows of the operands ([`crate::lemmas::pieces`]), each inferred in
/// an e-graph of its own, and the output is the concatenation of the pieces' relations. The
/// spec equations the operator is seeded with are cut alike (rows of both sides of a true
/// equation are equal). `None` unless the pieces read disjoint ranks and each has a clean
/// relation or a multiple of one, at factors [`join_pieces`] can bring to one.
#[allow(clippy::too_many_arguments)]
pub(super) fn infer_by_pieces(
    imp: &Impl,
    rules: &[Rewrite<Term, Shapes>],
    opts: &Options,
    state: &HashMap<ValueId, State>,
    t: &Tpl,
    v: ValueId,
    seeds: &[(Tpl, ValueId)],
    depth: usize,
    log: &PieceLog,
) -> Option<State> {
    let mut ins = Vec::new();
    tpl_values(t, &mut ins);
    let mut eg = new_graph(imp);
    let mut ids: HashMap<ValueId, Id> = HashMap::new();
    // The equalities the inputs carry, handed to each piece for its own ranks only.
    let mut facts = Rel::of(Vec::new(), false);
    for x in &ins {
        let Some(State::Related(r)) = state.get(&x.value) else {
            return None;
        };
        if let std::collections::hash_map::Entry::Vacant(slot) = ids.entry(x.value) {
            // The expressions only: the equalities of their tensors, unioned in, would let
            // the cut pick another piece's form (a block of zeros for a spec operator).
            slot.insert(add_relation(
                &mut eg,
                imp,
                &Rel::of(r.exprs.clone(), r.clean),
            ));
            facts.take_equalities(r);
        }
    }
    let root = add_tpl(&mut eg, t, &mut |_, x| ids[&x.value]);
    eg.rebuild();
    let splits = crate::lemmas::pieces::splits(&eg, root);
    let out = crate::lemmas::shape(&eg, root)?;
    // Both sides of each seeded equation, the left one over the relations of its inputs.
    let equations = seed_sides(&mut eg, imp, state, seeds, &mut ids);
    eg.rebuild();
    let wider = Options {
        node_limit: opts.node_limit * PIECE_NODE_FACTOR,
        ..opts.clone()
    };
    let mut scope = PieceScope {
        imp,
        state,
        eg: &mut eg,
        ids: &ids,
        equations: &equations,
        t,
        root,
        out: &out,
    };
    // The first split whose pieces part the ranks: pieces that share ranks (the sequence
    // chunks of one group's attention) bring each other's operators back into every
    // exploration. Each piece's states, seeds and operator are built before any is inferred.
    let (split, prepared) = splits.into_iter().find_map(|split| {
        let prepared: Vec<Prepared> = split
            .cuts()
            .into_iter()
            .map(|c| scope.prepare(c, &facts))
            .collect::<Option<_>>()?;
        let mut seen: BTreeSet<usize> = BTreeSet::new();
        for (sub, _, _) in &prepared {
            let mut ranks = BTreeSet::new();
            for st in sub.values() {
                if let State::Related(r) = st {
                    ranks.extend(ranks_of(&r.exprs));
                }
            }
            if !seen.is_disjoint(&ranks) {
                return None;
            }
            seen.extend(ranks);
        }
        Some((split, prepared))
    })?;
    // The equalities the seeds' relations carry as well, for a piece that found no relation
    // without them (a received block equal to its sender's, in the attention output the
    // forward's equation relates); not at first: they slow every dp x cp piece by half.
    let mut with_seeds = facts.clone();
    for (st, w) in seeds {
        let mut values = vec![*w];
        let mut inside = Vec::new();
        tpl_values(st, &mut inside);
        values.extend(inside.iter().map(|x| x.value));
        for x in values {
            if let Some(State::Related(r)) = state.get(&x) {
                with_seeds.take_equalities(r);
            }
        }
    }
    let more = with_seeds.equal_leaves.len() > facts.equal_leaves.len()
        || with_seeds.equal_slices.len() > facts.equal_slices.len();
    let infer = |label: &str, (sub, sub_seeds, op_t): &Prepared| -> Option<Rel> {
        let attempt = Attempt::default();
        let clock = std::time::Instant::now();
        let mut found = infer_one(
            imp,
            rules,
            &wider,
            sub,
            op_t,
            None,
            &mut HashMap::new(),
            v,
            false,
            sub_seeds,
            &attempt,
        );
        log.record(depth, label, clock, attempt.peak_nodes.get(), &found);
        // A piece that outgrew its own limit, piece by piece in turn (a data-parallel
        // group's batch row, then its tensor-parallel head groups).
        if !clean_up_to_factor(&found)
            && depth < MAX_PIECE_DEPTH
            && attempt.peak_nodes.get() >= wider.node_limit
        {
            found = infer_by_pieces(imp, rules, opts, sub, op_t, v, sub_seeds, depth + 1, log)?;
        }
        if !clean_up_to_factor(&found) {
            return None;
        }
        match found {
            State::Related(r) => Some(r),
            _ => None,
        }
    };
    let mut parts: Vec<Rel> = Vec::new();
    // Symmetric ranks once: the pieces of a split read disjoint ranks, and those of the
    // members of another group usually repeat the first piece's problem over other ranks, so
    // each later piece first tries the first piece's relation, renamed and checked. Every
    // piece kept is clean or a constant multiple of a clean expression (`infer` returns no
    // other), and the check proves each renamed expression, the factor's `scale` included,
    // equal to the piece's operator: a gradient's pieces under data parallelism (the ring
    // attention backward's `_softmax_backward_data`, each piece half of a clean block) are
    // such multiples, and took no sibling's relation while only clean ones were kept.
    let mut representative: Option<Solved> = None;
    for (i, (c, piece)) in split.cuts().into_iter().zip(&prepared).enumerate() {
        let (sub, sub_seeds, op_t) = piece;
        let clock = std::time::Instant::now();
        let tried = representative
            .as_ref()
            .map(|twin| across_ranks(imp, rules, &wider, (sub, op_t, sub_seeds), twin));
        if let Some(t) = &tried {
            log.renaming(depth, i, clock, t.as_ref().err());
        }
        let renamed = tried.and_then(Result::ok);
        let renamed_here = renamed.is_some();
        if renamed_here {
            log.reused.set(log.reused.get() + 1);
        }
        let label = format!("p{i}");
        let found = match renamed.or_else(|| infer(&label, piece)) {
            Some(r) => r,
            None if more => infer(&format!("p{i}+seeds"), &scope.prepare(c, &with_seeds)?)?,
            None => return None,
        };
        if opts.reuse && representative.is_none() && !renamed_here {
            representative = Solved::new(op_t, sub_seeds, sub, &found, false);
        }
        parts.push(found);
    }
    join_pieces(imp, parts, &split, &out)
}

/// What piecewise inference tells its operator's timing record (see `OperatorTime`): how many
/// pieces took a sibling's relation, and each piece's attempt in order.
#[derive(Default)]
pub(super) struct PieceLog {
    /// Pieces related by a sibling piece's checked relation over other ranks.
    pub(super) reused: std::cell::Cell<usize>,
    /// Each piece's inference and renaming: depth, piece, seconds, peak size, outcome.
    pub(super) steps: std::cell::RefCell<Vec<String>>,
}

impl PieceLog {
    /// A piece's inference at `depth`, since `clock`, with its peak e-graph size and result.
    fn record(&self, depth: usize, label: &str, clock: std::time::Instant, peak: usize, s: &State) {
        let outcome = match s {
            State::Related(r) if r.clean => "clean",
            s if clean_up_to_factor(s) => "scaled",
            _ => "not clean",
        };
        let secs = clock.elapsed().as_secs_f64();
        self.steps.borrow_mut().push(format!(
            "d{depth}{label} {secs:.2} s {peak} nodes {outcome}"
        ));
    }

    /// Piece `i`'s renaming of its first sibling's relation at `depth`, since `clock`, and
    /// why it was not taken (`None`: taken).
    fn renaming(&self, depth: usize, i: usize, clock: std::time::Instant, miss: Option<&Miss>) {
        let outcome = match miss {
            None => "renamed".to_string(),
            Some(m) => format!("not renamed ({m})"),
        };
        let secs = clock.elapsed().as_secs_f64();
        self.steps
            .borrow_mut()
            .push(format!("d{depth}p{i} {secs:.2} s {outcome}"));
    }
}

/// A piece ready to infer: the states of its fresh values, its seeded equations, its operator.
type Prepared = (HashMap<ValueId, State>, Vec<(Tpl, ValueId)>, Tpl);

/// What [`infer_by_pieces`] cuts each piece from: the whole operator's e-graph, its inputs'
/// classes, the seeded equations' sides, the operator and its class and shape.
struct PieceScope<'a, 'i> {
    imp: &'a Impl<'i>,
    state: &'a HashMap<ValueId, State>,
    eg: &'a mut Graph,
    ids: &'a HashMap<ValueId, Id>,
    equations: &'a [(&'a Tpl, &'a Rel, Id, Id)],
    t: &'a Tpl,
    root: Id,
    out: &'a [usize],
}

impl PieceScope<'_, '_> {
    /// Piece `c` of the operator, with the equalities of `facts` among its own ranks: an
    /// equation over another tensor is cut where it takes the same blocks of the output, at
    /// the same fraction of their rows (the batch or the heads lead both).
    fn prepare(&mut self, c: Cut, facts: &Rel) -> Option<Prepared> {
        let mut pieces = Pieces {
            imp: self.imp,
            state: self.state,
            eg: &mut *self.eg,
            ids: self.ids,
            facts,
            sub: HashMap::new(),
            next: 0,
        };
        let mut sub_seeds = Vec::new();
        for &(ts, rw, lhs, rhs) in self.equations {
            let Some(lhs_cut) = crate::lemmas::shape(pieces.eg, lhs)
                .and_then(|s| crate::lemmas::pieces::matching_cut(&s, self.out, c))
            else {
                continue;
            };
            let Some(lhs_t) = pieces.operator(ts, lhs, lhs_cut) else {
                continue;
            };
            let rhs_rel = match cut_relation(self.imp, rw, lhs_cut, facts) {
                Some(r) => r,
                None => match pieces.cut_term(rhs, lhs_cut) {
                    Some(e) => Rel::of(vec![e], rw.clean),
                    None => continue,
                },
            };
            let w = pieces.fresh();
            pieces.sub.insert(w, State::Related(rhs_rel));
            sub_seeds.push((lhs_t, w));
        }
        let op_t = pieces.operator(self.t, self.root, c)?;
        Some((pieces.sub, sub_seeds, op_t))
    }
}

/// What one piece of [`infer_by_pieces`] is inferred from: the states of fresh values standing
/// for rows of spec tensors, built from the whole operator's e-graph.
struct Pieces<'a, 'i> {
    imp: &'a Impl<'i>,
    state: &'a HashMap<ValueId, State>,
    eg: &'a mut Graph,
    ids: &'a HashMap<ValueId, Id>,
    facts: &'a Rel,
    sub: HashMap<ValueId, State>,
    next: usize,
}

impl Pieces<'_, '_> {
    /// A value id no spec node has.
    fn fresh(&mut self) -> ValueId {
        self.next += 1;
        ValueId::new(usize::MAX - self.next, 0)
    }

    /// Cut `c` of class `id`, cut as a term and extracted.
    fn cut_term(&mut self, id: Id, c: Cut) -> Option<RecExpr<Term>> {
        let c = crate::lemmas::pieces::cut(self.eg, id, c)?;
        self.eg.rebuild();
        extract(self.eg, c, false).into_iter().next()
    }

    /// Cut `c` of the spec operator `t` (class `root`): the operator over its operands' cuts,
    /// each the cut relation of a fresh value (as the operator's inputs are), where its
    /// arguments are values and literals and it keeps the cut's dim independent; else one
    /// fresh value whose relation is the whole term cut, with the equalities among its ranks.
    fn operator(&mut self, t: &Tpl, root: Id, c: Cut) -> Option<Tpl> {
        if let Some(op_t) = self.by_operand(t, root, c) {
            return Some(op_t);
        }
        let expr = self.cut_term(root, c)?;
        // Only the equalities among this piece's ranks: the others name the other pieces'
        // ranks, whose operators the exploration would bring in.
        let (equal_leaves, equal_slices) =
            facts_within(self.facts, &ranks_of(std::slice::from_ref(&expr)));
        let x = self.fresh();
        self.sub.insert(
            x,
            State::Related(Rel {
                equal_leaves,
                equal_slices,
                ..Rel::of(vec![expr], false)
            }),
        );
        Some(Tpl::Value(ValueRef {
            rank: None,
            value: x,
        }))
    }

    /// [`Pieces::operator`] over its operands' rows, when the operator allows it.
    fn by_operand(&mut self, t: &Tpl, root: Id, c: Cut) -> Option<Tpl> {
        let Tpl::Op(name, args) = t else { return None };
        let mut kids = Vec::new();
        for x in args {
            kids.push(match x {
                Tpl::Value(v) => *self.ids.get(&v.value)?,
                literal => {
                    let mut inside = Vec::new();
                    tpl_values(literal, &mut inside);
                    if !inside.is_empty() {
                        return None;
                    }
                    add_tpl(self.eg, literal, &mut |_, _| {
                        unreachable!("a literal holds no value")
                    })
                }
            });
        }
        let out = crate::lemmas::shape(self.eg, root)?;
        let cuts =
            crate::lemmas::pieces::operand_cuts(self.eg, Symbol::from(name), &kids, &out, c)?;
        let mut new_args = args.clone();
        for (i, x) in args.iter().enumerate() {
            let Tpl::Value(v) = x else { continue };
            let Some(State::Related(r)) = self.state.get(&v.value) else {
                return None;
            };
            let rel = match cuts.iter().find(|k| k.0 == i) {
                Some(&(_, inner)) => cut_relation(self.imp, r, inner, self.facts)?,
                None => r.clone(),
            };
            let fresh = self.fresh();
            self.sub.insert(fresh, State::Related(rel));
            new_args[i] = Tpl::Value(ValueRef {
                rank: None,
                value: fresh,
            });
        }
        if name == "aten.view.default" {
            let mut target = out;
            target[c.dim] = c.len();
            new_args[1] = Tpl::Op(
                LIST.into(),
                target.iter().map(|&n| Tpl::Num(n as i64)).collect(),
            );
        }
        Some(Tpl::Op(name.clone(), new_args))
    }
}

/// Cut `c` of a relation: each alternative expression cut in an e-graph of its own (in one
/// class the cut would follow whichever nesting of the concatenations came first), with the
/// equalities among the tensors the cut expressions read.
fn cut_relation(imp: &Impl, r: &Rel, c: Cut, facts: &Rel) -> Option<Rel> {
    let mut exprs: Vec<RecExpr<Term>> = Vec::new();
    for alt in &r.exprs {
        let mut own = new_graph(imp);
        let id = add_rec(&mut own, imp, alt);
        own.rebuild();
        let Some(piece) = crate::lemmas::pieces::cut(&mut own, id, c) else {
            continue;
        };
        own.rebuild();
        if let Some(e) = extract(&own, piece, false).into_iter().next() {
            if !exprs.contains(&e) {
                exprs.push(e);
            }
        }
    }
    let ranks = ranks_of(&exprs);
    if ranks.is_empty() {
        return None;
    }
    let (equal_leaves, equal_slices) = facts_within(facts, &ranks);
    Some(Rel {
        equal_leaves,
        equal_slices,
        ..Rel::of(exprs, r.clean)
    })
}

/// The ranks whose tensors the expressions read.
fn ranks_of(exprs: &[RecExpr<Term>]) -> BTreeSet<usize> {
    exprs
        .iter()
        .flat_map(|e| leaf_ranks(e, Id::from(e.as_ref().len() - 1)))
        .collect()
}

/// The groups of equal tensors and slices in `facts`, each kept to its members that read only
/// tensors of `ranks` (a part of a group of equal tensors is equal), where two or more remain.
fn facts_within(
    facts: &Rel,
    ranks: &BTreeSet<usize>,
) -> (Vec<Vec<Symbol>>, Vec<Vec<RecExpr<Term>>>) {
    let inside =
        |s: &Symbol| crate::term::parse_leaf(s.as_str()).is_some_and(|(r, _)| ranks.contains(&r));
    let leaves = facts
        .equal_leaves
        .iter()
        .map(|g| g.iter().filter(|s| inside(s)).copied().collect::<Vec<_>>())
        .filter(|g| g.len() >= 2)
        .collect();
    let slices = facts
        .equal_slices
        .iter()
        .map(|g| {
            g.iter()
                .filter(|e| ranks_of(std::slice::from_ref(e)).is_subset(ranks))
                .cloned()
                .collect::<Vec<_>>()
        })
        .filter(|g| g.len() >= 2)
        .collect();
    (leaves, slices)
}

/// The pieces' relations put together along the split's dim (a concatenation; for a strided
/// split, of each piece viewed as its blocks, viewed back to `out`): clean when every piece
/// is, a multiple of the clean whole when every piece is the same multiple of a clean one.
/// Pieces at different multiples meet at one where their tensors allow ([`rescaled`]: one
/// group's ranks may expose the scaled gradient, another's only the unscaled one).
fn join_pieces(imp: &Impl, parts: Vec<Rel>, how: &Split, out: &[usize]) -> Option<State> {
    // Each piece's factor and the root of its clean expression (under the factor's `scale`).
    let split = |r: &Rel| -> Option<((i64, i64), usize)> {
        let e = r.exprs.first()?;
        let last = e.as_ref().len() - 1;
        if r.clean {
            return Some(((1, 1), last));
        }
        literal_scale(e, &e.as_ref()[last]).map(|(f, x)| (f, usize::from(x)))
    };
    let splits: Vec<_> = parts.iter().map(split).collect::<Option<_>>()?;
    // Each piece's clean expression and factor, at the first factor every piece reaches.
    let targets: Vec<(i64, i64)> = std::iter::once((1, 1))
        .chain(splits.iter().map(|s| s.0))
        .collect();
    let (f, exprs) = targets.into_iter().find_map(|f| {
        let exprs: Option<Vec<RecExpr<Term>>> = parts
            .iter()
            .zip(&splits)
            .map(|(r, &(g, top))| {
                let e = &r.exprs[0];
                if same_ratio(g, f) {
                    let mut own = RecExpr::default();
                    append(&mut own, e, top);
                    Some(own)
                } else {
                    // g x = f y: y = (g / f) x.
                    if f.0 == 0 {
                        return None;
                    }
                    let ratio = (
                        i64::try_from(i128::from(g.0) * i128::from(f.1)).ok()?,
                        i64::try_from(i128::from(g.1) * i128::from(f.0)).ok()?,
                    );
                    rescaled(imp, e, top, ratio)
                }
            })
            .collect();
        exprs.map(|x| (f, x))
    })?;
    let mut e: RecExpr<Term> = RecExpr::default();
    let (dim, outer) = (how.dim, how.outer);
    let view = Symbol::from("aten.view.default");
    let list = |e: &mut RecExpr<Term>, v: &[usize]| {
        let nums: Vec<Id> = v.iter().map(|&n| e.add(Term::Num(n as i64))).collect();
        e.add(Term::Op(Symbol::from(LIST), nums))
    };
    let mut kids = vec![e.add(Term::Num((dim + usize::from(outer > 1)) as i64))];
    for (x, c) in exprs.iter().zip(how.cuts()) {
        let piece = append(&mut e, x, x.as_ref().len() - 1);
        kids.push(if outer == 1 {
            piece
        } else {
            let mut blocks = out[..dim].to_vec();
            blocks.extend([outer, c.b - c.a]);
            blocks.extend_from_slice(&out[dim + 1..]);
            let shape = list(&mut e, &blocks);
            e.add(Term::Op(view, vec![piece, shape]))
        });
    }
    let mut joined = e.add(Term::Op(Symbol::from(CAT), kids));
    if outer > 1 {
        let shape = list(&mut e, out);
        joined = e.add(Term::Op(view, vec![joined, shape]));
    }
    let unit = same_ratio(f, (1, 1));
    if !unit {
        let (p, q) = (e.add(Term::Num(f.0)), e.add(Term::Num(f.1)));
        e.add(Term::Op(Symbol::from(SCALE), vec![p, q, joined]));
    }
    let mut rel = Rel::of(vec![e], unit);
    for r in &parts {
        rel.take_equalities(r);
    }
    Some(State::Related(rel))
}

/// `e` with every scale of a scale by literal factors folded into one (`(x * 2) * 1/8` is
/// `x * 1/4`, and `(x * 2) * 1/2` is `x`), and a factor that every piece of a concatenation
/// carries folded out of it (`cat(x * 1/8, y * 1/8)` is `cat(x, y) * 1/8`): a runner stopped
/// at its node limit can leave the class it extracts from without the folded term, and a
/// multiple of a clean expression is read only at the top.
pub(super) fn fold_nested_scales(e: &RecExpr<Term>) -> RecExpr<Term> {
    let nodes = e.as_ref();
    let mut out: RecExpr<Term> = RecExpr::default();
    let mut map: Vec<Id> = Vec::with_capacity(nodes.len());
    for node in nodes {
        let mut mapped = node.clone().map_children(|c| map[usize::from(c)]);
        if let Some((f, cat)) = common_factor_of_pieces(&out, &mapped) {
            // Elementwise, `cat_d(c x_i) = c cat_d(x_i)`: the concatenation of the operands,
            // scaled once (and merged below with a scale the operands' concatenation is not).
            let inner = out.add(cat);
            let (p, q) = (out.add(Term::Num(f.0)), out.add(Term::Num(f.1)));
            mapped = Term::Op(Symbol::from(SCALE), vec![p, q, inner]);
        }
        let id = match literal_scale(&out, &mapped) {
            Some((f, x)) => {
                // The operand is already folded: at most one literal scale to merge with.
                let (f, x) = match literal_scale(&out, &out[x]) {
                    Some((g, inner)) => match product_reduced(f, g) {
                        Some(fg) => (fg, inner),
                        None => (f, x),
                    },
                    None => (f, x),
                };
                if f == (1, 1) {
                    x
                } else {
                    let (p, q) = (out.add(Term::Num(f.0)), out.add(Term::Num(f.1)));
                    out.add(Term::Op(Symbol::from(SCALE), vec![p, q, x]))
                }
            }
            None => out.add(mapped),
        };
        map.push(id);
    }
    let mut folded = RecExpr::default();
    if let Some(&root) = map.last() {
        append(&mut folded, &out, usize::from(root));
    }
    folded
}

/// For `n`, a concatenation over nodes of `e` whose every piece is a scale by the same
/// literal factor: that factor and the concatenation of the pieces' operands. `None` where a
/// piece is not such a scale or the factors differ.
fn common_factor_of_pieces(e: &RecExpr<Term>, n: &Term) -> Option<((i64, i64), Term)> {
    let Term::Op(s, k) = n else {
        return None;
    };
    if !is_op!(s, CAT) || k.len() < 2 {
        return None;
    }
    let (f, _) = literal_scale(e, &e[k[1]])?;
    let mut kids = vec![k[0]];
    for &piece in &k[1..] {
        let (g, x) = literal_scale(e, &e[piece])?;
        if !same_ratio(f, g) {
            return None;
        }
        kids.push(x);
    }
    Some((f, Term::Op(*s, kids)))
}

/// The factor `(p, q)` and operand of `n`, a node of `e`, when it is a scale by literal numbers.
fn literal_scale(e: &RecExpr<Term>, n: &Term) -> Option<((i64, i64), Id)> {
    let Term::Op(s, k) = n else {
        return None;
    };
    if !is_op!(s, SCALE) || k.len() != 3 {
        return None;
    }
    match (&e[k[0]], &e[k[1]]) {
        (Term::Num(p), Term::Num(q)) => Some(((*p, *q), k[2])),
        _ => None,
    }
}

/// Copies the subterm of `src` rooted at node `top` into `dst`; returns its id there.
pub(super) fn append(dst: &mut RecExpr<Term>, src: &RecExpr<Term>, top: usize) -> Id {
    let node = src.as_ref()[top].clone();
    let node = node.map_children(|c| append(dst, src, usize::from(c)));
    dst.add(node)
}
