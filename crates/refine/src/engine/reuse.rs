//! Repeated layers once (issue 48, item 5): a spec operator whose inference problem repeats an
//! earlier one's up to a renaming of tensors (the same operator in the next layer, or the
//! sibling projection of the same layer) takes the earlier relation, renamed onto its own
//! tensors, and checks it in a small e-graph instead of exploring the implementation again.
//!
//! The renaming is only a guess, and nothing rests on it: the renamed relation is kept only
//! when a saturation of the operator over its inputs' relations, together with the
//! implementation's own definitions of the tensors the relation names, puts every renamed
//! expression (and every group of tensors it claims equal) in the operator's class. Every
//! union in that e-graph is a true equation (the inputs' relations, the spec seeds, the ranks'
//! definitions, the lemmas), as in inference itself; a check that fails falls back to the full
//! inference, so reuse changes what is inferred only where both find a relation.
//!
//! Which earlier operator to try is fixed before the walk, from the spec alone
//! ([`assign_twins`]): the nearest earlier operator whose term has the same shape over values
//! of the same metas. The later one then waits for it (it is among what it reads), so the
//! twin's solution is there whatever the thread count, and reports stay byte-identical.
//!
//! Symmetric ranks once (item 6, [`across_ranks`]): the same renaming and check, where the
//! renaming may also map ranks one to one, relate the pieces of piecewise inference that
//! repeat the first piece over another group's ranks.

use super::explore::define;
use super::extract::clean_size;
use super::relation::{
    add_rec, add_relation, add_tpl, tpl_values, Impl, Neighbourhood, Rel, State,
};
use super::saturate::{new_graph, run_rule_refs, RunLimits};
use super::seeds::seed_spec_equations;
use super::Options;
use crate::lemmas::Graph;
use crate::lower::{Lowered, Tpl, ValueRef};
use crate::term::{is_leaf, leaf_symbol, parse_leaf, Shapes, Term};
use egg::{Id, RecExpr, Rewrite, Symbol};
use shardproof_case::Case;
use shardproof_ir::{OpName, ValueId};
use shardproof_ops::Meta;
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::Arc;

/// An operator's solved inference problem, kept for the operators that name it as their twin:
/// its inputs' relations (in the order of its term's values) and the relation it found.
pub(super) struct Solved {
    /// The relations its inference read ([`input_rels`]).
    ins: Vec<Option<Rel>>,
    /// The relation it found (clean, or unclean with an expression: see `keepable`).
    out: Rel,
    /// Whether only the wider attempt found it (diagnosis reads this).
    pub(super) widened: bool,
    /// Where its relation was a twin's, checked: the lemmas that changed the check's e-graph
    /// (positions in the lemma set of the check), which the next layer's check tries alone
    /// first. `None` where inference found it.
    lemmas_used: Option<Arc<[usize]>>,
}

impl Solved {
    /// The problem of term `t` over `state`, solved as `out`; `None` where an input has no
    /// relation (such an operator inherits its input's state and is never worth keeping).
    pub(super) fn new(
        t: &Tpl,
        seeds: &[(Tpl, ValueId)],
        state: &HashMap<ValueId, State>,
        out: &Rel,
        widened: bool,
    ) -> Option<Solved> {
        Some(Solved {
            ins: input_rels(t, seeds, state)?,
            out: out.clone(),
            widened,
            lemmas_used: None,
        })
    }

    /// This solution as found by a reuse check whose e-graph the lemmas `used` changed.
    pub(super) fn checked_with(mut self, used: Option<Arc<[usize]>>) -> Solved {
        self.lemmas_used = used;
        self
    }
}

/// A twin's relation renamed onto an operator and checked ([`reuse`]).
pub(super) struct Reused {
    /// The renamed relation.
    pub(super) rel: Rel,
    /// Whether the twin's was found by the wider attempt (so the check used its lemmas).
    pub(super) widened: bool,
    /// The lemmas that changed the check's e-graph (see [`Solved::lemmas_used`]).
    pub(super) lemmas_used: Arc<[usize]>,
}

/// The relations an operator's inference reads: those of the values of `t`, in
/// [`tpl_values`] order (`None` where one has none: nothing to reuse), then per seed those of
/// its value and of its operator's values, where they have one.
fn input_rels(
    t: &Tpl,
    seeds: &[(Tpl, ValueId)],
    state: &HashMap<ValueId, State>,
) -> Option<Vec<Option<Rel>>> {
    let rel = |x: ValueId| match state.get(&x) {
        Some(State::Related(r)) => Some(r.clone()),
        _ => None,
    };
    let mut ins = Vec::new();
    tpl_values(t, &mut ins);
    let mut out = ins
        .iter()
        .map(|x| rel(x.value).map(Some))
        .collect::<Option<Vec<_>>>()?;
    for (s, w) in seeds {
        out.push(rel(*w));
        let mut xs = Vec::new();
        tpl_values(s, &mut xs);
        out.extend(xs.iter().map(|x| rel(x.value)));
    }
    Some(out)
}

/// The static shape of an operator's problem: its term with every spec value replaced by its
/// first position and meta, its seeds likewise, and its output's meta. Two operators with the
/// same signature are twins (the same operator of two layers, or two sibling projections).
pub(super) fn signature(
    metas: &[Vec<Option<Meta>>],
    v: ValueId,
    t: &Tpl,
    seeds: &[(Tpl, ValueId)],
) -> String {
    let meta = |x: ValueId| {
        metas
            .get(x.node)
            .and_then(|m| m.get(x.output))
            .cloned()
            .flatten()
    };
    let mut numbering: HashMap<ValueId, usize> = HashMap::new();
    let mut out = String::new();
    let _ = write!(out, "{:?}=", meta(v));
    write_tpl(&mut out, t, &mut numbering, &meta);
    for (s, w) in seeds {
        out.push_str(";seed ");
        let next = numbering.len();
        let i = *numbering.entry(*w).or_insert(next);
        let _ = write!(out, "v{i}:{:?}=", meta(*w));
        write_tpl(&mut out, s, &mut numbering, &meta);
    }
    out
}

fn write_tpl(
    out: &mut String,
    t: &Tpl,
    numbering: &mut HashMap<ValueId, usize>,
    meta: &dyn Fn(ValueId) -> Option<Meta>,
) {
    match t {
        Tpl::Num(n) => {
            let _ = write!(out, "{n}");
        }
        Tpl::Value(x) => {
            let next = numbering.len();
            let i = *numbering.entry(x.value).or_insert(next);
            let _ = write!(out, "v{i}:{:?}", meta(x.value));
        }
        Tpl::Op(s, kids) => {
            let _ = write!(out, "({s}");
            for k in kids {
                out.push(' ');
                write_tpl(out, k, numbering, meta);
            }
            out.push(')');
        }
    }
}

/// How many earlier operators of the same signature an operator may try, nearest first: a
/// layer repeats several operators of one signature (the query, key and value projections,
/// the weights' transposes), whose inputs relate differently, so the one that matches is the
/// same operator of the previous layer, a few signatures back.
pub(super) const MAX_TWINS: usize = 12;

/// Per operator (in walk order) and output, its twins: the nearest earlier outputs with the
/// same [`signature`], nearest first, at most [`MAX_TWINS`]; `sigs` holds each output's
/// signature (`None`: never reused nor kept).
pub(super) fn assign_twins(sigs: &[Vec<(ValueId, Option<String>)>]) -> Vec<Vec<Vec<ValueId>>> {
    let mut seen: HashMap<&str, Vec<ValueId>> = HashMap::new();
    sigs.iter()
        .map(|outs| {
            // Twins come from earlier nodes only: a node's outputs are inferred together.
            let twins: Vec<Vec<ValueId>> = outs
                .iter()
                .map(|(_, s)| {
                    let earlier = s.as_deref().and_then(|s| seen.get(s));
                    earlier
                        .map(|e| e.iter().rev().take(MAX_TWINS).copied().collect())
                        .unwrap_or_default()
                })
                .collect();
            for (v, s) in outs {
                if let Some(s) = s {
                    seen.entry(s.as_str()).or_default().push(*v);
                }
            }
            twins
        })
        .collect()
}

/// Most implementation tensors a reused relation may need defined: a layer's operator reaches
/// a few per rank (the ranks' local products and their collectives).
const MAX_DEFINED: usize = 256;

/// How many levels of the defined tensors' sources a reuse check defines too (see [`check`]).
const SOURCE_LEVELS: usize = 2;

/// A renaming of the twin's implementation tensors (leaf symbols) onto this operator's.
struct Renaming<'a, 'c> {
    imp: &'a Impl<'c>,
    map: HashMap<Symbol, Symbol>,
    /// The ranks' renaming, where the twin's ranks may differ (a sibling piece over other
    /// ranks, see [`across_ranks`]); `None`: each tensor keeps its rank.
    ranks: Option<HashMap<usize, usize>>,
    /// The tensors to define in the check, in dependency order.
    defined: Vec<ValueRef>,
    /// While a relation's equal slices are matched: each tensor of that relation's groups of
    /// equal tensors, to its group's first (see [`Renaming::match_rel`]); empty otherwise.
    equal: HashMap<Symbol, Symbol>,
    /// Whether equal slices match up to the relation's equal tensors (sibling pieces only).
    slices_up_to_equal: bool,
}

impl Renaming<'_, '_> {
    /// Matches `a` (the twin's) onto `b` node for node, extending the renaming of leaves;
    /// false where they differ in anything but leaf names, or a leaf is already renamed
    /// otherwise.
    fn match_expr(&mut self, a: &RecExpr<Term>, b: &RecExpr<Term>) -> bool {
        let (a, b) = (a.as_ref(), b.as_ref());
        a.len() == b.len()
            && a.iter().zip(b).all(|(x, y)| match (x, y) {
                (Term::Op(s, k), Term::Op(t, l)) if is_leaf(x) && is_leaf(y) => {
                    k.is_empty() && l.is_empty() && self.bind(*s, *t)
                }
                _ => x == y,
            })
    }

    /// Binds leaf `a` to `b`: only a tensor of the same rank (a layer's renaming keeps each
    /// rank's part), or across ranks of the rank `a`'s rank is renamed to (one to one), and
    /// only where `a` is not bound otherwise.
    fn bind(&mut self, a: Symbol, b: Symbol) -> bool {
        let rank = |s: Symbol| parse_leaf(s.as_str()).map(|p| p.0);
        let ranks_agree = match (&mut self.ranks, rank(a), rank(b)) {
            (Some(m), Some(x), Some(y)) => {
                let taken = m.iter().any(|(&k, &v)| v == y && k != x);
                !taken && *m.entry(x).or_insert(y) == y
            }
            (_, x, y) => x == y,
        };
        if !ranks_agree {
            return false;
        }
        let image = *self.map.entry(a).or_insert(b);
        image == b
            || self
                .equal
                .get(&image)
                .is_some_and(|g| self.equal.get(&b) == Some(g))
    }

    /// The rank the twin's rank `r` is renamed to (itself unless ranks are renamed).
    fn rank_image(&self, r: Option<usize>) -> Option<usize> {
        match (&self.ranks, r) {
            (Some(m), Some(r)) => m.get(&r).copied(),
            (_, r) => r,
        }
    }

    /// Whether every renamed tensor has the same implementation neighbourhood as its image:
    /// the operators that consume it, and those that consume theirs, by name. Exploration
    /// brings them in, so a tensor whose consumers differ (the rotary slices that read one
    /// layout of a projection and not its sibling's) can relate in more ways than its twin.
    fn same_neighbourhoods(&self) -> bool {
        let mut pairs: Vec<(Symbol, Symbol)> = self.map.iter().map(|(a, b)| (*a, *b)).collect();
        pairs.sort_unstable_by(|x, y| x.0.as_str().cmp(y.0.as_str()));
        pairs
            .iter()
            .all(|&(a, b)| match (self.value(a), self.value(b)) {
                (Some(x), Some(y)) => {
                    x == y || self.imp.neighbourhood(x) == self.imp.neighbourhood(y)
                }
                (None, None) => a == b,
                _ => false,
            })
    }

    /// Matches two relations in full: expressions, equal leaves and equal slices, one for
    /// one. Only an identical problem is worth the check: a twin whose inputs relate otherwise
    /// (one equal form fewer) would give a relation that checks but differs from what
    /// inference finds, and later operators depend on which of equal relations is kept (llama
    /// tp=2 went inconclusive with a looser match). The lists are matched as sets: they are
    /// sorted by the names of the tensors (extraction's tie-break), which a renaming reorders
    /// (`mm_95` before `mm_120` in one layer, after it in the next).
    ///
    /// A slice in a group of equal slices may name, of two tensors `b` proves equal (its
    /// equal leaves, matched before), the other one than the twin's image does: which one
    /// extraction names is its tie-break among equal tensors, and the data-parallel groups'
    /// pieces of one operator differ in it (`slice(view_32)` in one group, `slice(view_6)`
    /// in the next, with `view_32 = view_6` in both). Such a slice matches: the slices claim
    /// the same equality of the same tensors (the check's e-graph holds `b`'s equal leaves as
    /// one class), and the renamed relation is checked as any other.
    fn match_rel(&mut self, a: &Rel, b: &Rel) -> bool {
        let alike = a.exprs.len() == b.exprs.len()
            && a.equal_leaves.len() == b.equal_leaves.len()
            && a.equal_slices.len() == b.equal_slices.len()
            && self.match_unordered(&a.exprs, &b.exprs, &|m, x, y| m.match_expr(x, y))
            && self.match_unordered(&a.equal_leaves, &b.equal_leaves, &|m, g, h| {
                m.match_unordered(g, h, &|m, s, t| m.bind(*s, *t))
            });
        if !alike {
            return false;
        }
        if self.slices_up_to_equal {
            self.equal = b
                .equal_leaves
                .iter()
                .flat_map(|g| g.iter().map(move |s| (*s, g[0])))
                .collect();
        }
        let slices = self.match_unordered(&a.equal_slices, &b.equal_slices, &|m, g, h| {
            m.match_unordered(g, h, &|m, x, y| m.match_expr(x, y))
        });
        self.equal.clear();
        slices
    }

    /// Matches each item of `a` onto a distinct item of `b` by `f`: the one at the same
    /// position first, else the first unused one that matches; a failed trial leaves the
    /// renaming as it was. Greedy: a match it misses only means full inference.
    fn match_unordered<T>(
        &mut self,
        a: &[T],
        b: &[T],
        f: &dyn Fn(&mut Self, &T, &T) -> bool,
    ) -> bool {
        if a.len() != b.len() {
            return false;
        }
        let mut used = vec![false; b.len()];
        for (i, x) in a.iter().enumerate() {
            let order = std::iter::once(i).chain((0..b.len()).filter(|&j| j != i));
            let mut found = false;
            for j in order {
                if used[j] {
                    continue;
                }
                let saved = (self.map.clone(), self.ranks.clone());
                if f(self, x, &b[j]) {
                    used[j] = true;
                    found = true;
                    break;
                }
                (self.map, self.ranks) = saved;
            }
            if !found {
                return false;
            }
        }
        true
    }

    fn value(&self, sym: Symbol) -> Option<ValueRef> {
        let (r, name) = parse_leaf(sym.as_str())?;
        let v = self.imp.find(r, name)?;
        Some(self.imp.canon(ValueRef {
            rank: Some(r),
            value: v,
        }))
    }

    fn symbol(&self, v: ValueRef) -> Symbol {
        Symbol::from(leaf_symbol(v.rank.unwrap_or(0), &self.imp.name(v)))
    }

    /// The image of the twin's leaf `sym`: already renamed, else the implementation tensor
    /// computed from the images of its inputs by the same operator (found among their
    /// consumers), whose definition the check then needs. `None` where there is none.
    fn image(&mut self, sym: Symbol, depth: usize) -> Option<Symbol> {
        if let Some(&s) = self.map.get(&sym) {
            return Some(s);
        }
        if depth > 64 || self.defined.len() >= MAX_DEFINED {
            return None;
        }
        let imp = self.imp;
        let x = self.value(sym)?;
        let Some(Lowered::Term(tx)) = imp.lowered.get(&x) else {
            return None;
        };
        let mut ins = Vec::new();
        tpl_values(tx, &mut ins);
        let mut images = Vec::with_capacity(ins.len());
        for i in &ins {
            let i = imp.canon(*i);
            if imp.const_only.contains(&i) {
                images.push(None);
                continue;
            }
            let s = self.image(self.symbol(i), depth + 1)?;
            images.push(Some(self.value(s)?));
        }
        let first = images.iter().flatten().next().copied()?;
        let rank = self.rank_image(x.rank);
        let mut candidates: Vec<ValueRef> = imp
            .consumers
            .get(&first)
            .into_iter()
            .flatten()
            .map(|&(r, n)| ValueRef {
                rank: Some(r),
                value: ValueId::new(n, x.value.output),
            })
            .filter(|w| w.rank == rank && imp.canon(*w) == *w && !imp.cut.contains(w))
            .collect();
        candidates.sort_unstable();
        candidates.dedup();
        let mut matching = candidates.into_iter().filter(|w| {
            let Some(Lowered::Term(tw)) = imp.lowered.get(w) else {
                return false;
            };
            let mut wins = Vec::new();
            tpl_values(tw, &mut wins);
            same_shape(tx, tw)
                && wins.len() == images.len()
                && wins.iter().zip(&images).all(|(y, m)| {
                    let y = imp.canon(*y);
                    match m {
                        Some(m) => y == *m,
                        None => imp.const_only.contains(&y),
                    }
                })
        });
        // Several tensors can compute the same operator from the same images (each microbatch
        // transposes the same weight again): take one that no other twin tensor is renamed to
        // yet, so that distinct tensors stay distinct. Two renamed onto one still give a true
        // relation (it is checked), but one naming fewer tensors than inference finds
        // (`t_16 = t_16` for `t_16 = t_37`), whose readers in later layers then fail to rename.
        let first = matching.next()?;
        let taken = |w: &ValueRef| {
            let s = self.symbol(*w);
            self.map.values().any(|&m| m == s)
        };
        let w = if taken(&first) {
            std::iter::once(first)
                .chain(matching)
                .find(|w| !taken(w))
                .unwrap_or(first)
        } else {
            first
        };
        let s = self.symbol(w);
        self.map.insert(sym, s);
        self.defined.push(w);
        Some(s)
    }

    /// `e` with every leaf renamed (extending the renaming through the implementation where
    /// needed); `None` where a leaf has no image.
    fn rename(&mut self, e: &RecExpr<Term>) -> Option<RecExpr<Term>> {
        let mut out = RecExpr::default();
        for n in e.as_ref() {
            let n = match n {
                Term::Op(s, k) if k.is_empty() && is_leaf(n) => {
                    Term::Op(self.image(*s, 0)?, Vec::new())
                }
                other => other.clone(),
            };
            out.add(n);
        }
        Some(out)
    }

    fn rename_rel(&mut self, r: &Rel) -> Option<Rel> {
        let exprs = r
            .exprs
            .iter()
            .map(|e| self.rename(e))
            .collect::<Option<Vec<_>>>()?;
        let equal_leaves = r
            .equal_leaves
            .iter()
            .map(|g| {
                g.iter()
                    .map(|s| self.image(*s, 0))
                    .collect::<Option<Vec<_>>>()
            })
            .collect::<Option<Vec<_>>>()?;
        let equal_slices = r
            .equal_slices
            .iter()
            .map(|g| g.iter().map(|e| self.rename(e)).collect::<Option<Vec<_>>>())
            .collect::<Option<Vec<_>>>()?;
        Some(canonical_order(
            r,
            Rel {
                exprs,
                clean: r.clean,
                equal_leaves,
                equal_slices,
                explored: Vec::new(),
            },
        ))
    }
}

/// `renamed` (the twin's relation `twin` renamed) in the order inference would give it: each
/// list the twin holds in extraction's order (expressions by size, then by their text; leaves
/// and slices by name) sorted again, since the renaming changes the names that break ties;
/// a list in another order (a joined or seeded one) keeps the twin's.
fn canonical_order(twin: &Rel, mut renamed: Rel) -> Rel {
    let expr_key = |e: &RecExpr<Term>| (clean_size(e), e.to_string());
    let sorted_by = |xs: &[RecExpr<Term>], key: &dyn Fn(&RecExpr<Term>) -> (usize, String)| {
        xs.windows(2).all(|w| key(&w[0]) <= key(&w[1]))
    };
    if sorted_by(&twin.exprs, &expr_key) {
        renamed.exprs.sort_by_cached_key(expr_key);
    }
    let name_key = |e: &RecExpr<Term>| (0, e.to_string());
    for (g, h) in twin.equal_slices.iter().zip(&mut renamed.equal_slices) {
        if sorted_by(g, &name_key) {
            h.sort_by_cached_key(|e| e.to_string());
        }
    }
    let by_name = |g: &[Symbol]| g.windows(2).all(|w| w[0].as_str() <= w[1].as_str());
    if twin.equal_leaves.iter().all(|g| by_name(g))
        && twin
            .equal_leaves
            .windows(2)
            .all(|w| w[0][0].as_str() <= w[1][0].as_str())
    {
        for g in &mut renamed.equal_leaves {
            g.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        }
        renamed
            .equal_leaves
            .sort_by(|a, b| a[0].as_str().cmp(b[0].as_str()));
    }
    renamed
}

/// Whether relation `b` is relation `a` up to a renaming of tensors that keeps each one's
/// rank (the test of twins' inputs), or with `across`, renames ranks one to one and matches
/// equal slices up to `b`'s equal tensors (the test of sibling pieces' inputs).
#[cfg(test)]
pub(super) fn alike(imp: &Impl, a: &Rel, b: &Rel, across: bool) -> bool {
    Renaming {
        imp,
        map: HashMap::new(),
        ranks: across.then(HashMap::new),
        defined: Vec::new(),
        equal: HashMap::new(),
        slices_up_to_equal: across,
    }
    .match_rel(a, b)
}

/// `rel` renamed by the renaming that starts from the leaf pairs `bound` and extends through
/// the implementation (a twin's output relation renamed onto an operator's tensors).
#[cfg(test)]
pub(super) fn renamed(imp: &Impl, bound: &[(Symbol, Symbol)], rel: &Rel) -> Option<Rel> {
    Renaming {
        imp,
        map: bound.iter().copied().collect(),
        ranks: None,
        defined: Vec::new(),
        equal: HashMap::new(),
        slices_up_to_equal: false,
    }
    .rename_rel(rel)
}

impl<'c> Impl<'c> {
    /// The operators consuming `x` and, for each, those consuming its outputs, by name, sorted
    /// ([`Renaming::same_neighbourhoods`]); computed once per value. Names are compared as the
    /// program's own (no string per consumer).
    fn neighbourhood(&self, x: ValueRef) -> Arc<Neighbourhood<'c>> {
        if let Some(n) = self
            .neighbourhoods
            .lock()
            .ok()
            .and_then(|m| m.get(&x).cloned())
        {
            return n;
        }
        let case: &'c Case = self.case;
        let ops = |v: ValueRef| -> &[(usize, usize)] {
            self.consumers.get(&v).map_or(&[], Vec::as_slice)
        };
        let name = |r: usize, n: usize| case.program.ranks[r].nodes[n].op();
        let mut out: Neighbourhood<'c> = ops(x)
            .iter()
            .map(|&(r, n)| {
                let outs = case.program.ranks[r].nodes[n].outputs.len();
                let mut next: Vec<Option<&OpName>> = (0..outs)
                    .flat_map(|k| {
                        ops(self.canon(ValueRef {
                            rank: Some(r),
                            value: ValueId::new(n, k),
                        }))
                    })
                    .map(|&(r2, n2)| name(r2, n2))
                    .collect();
                next.sort_unstable();
                (name(r, n), next)
            })
            .collect();
        out.sort_unstable();
        let out = Arc::new(out);
        if let Ok(mut m) = self.neighbourhoods.lock() {
            m.insert(x, out.clone());
        }
        out
    }
}

/// A set of lemmas' rewrites.
type Lemmas<'a> = &'a [Rewrite<Term, Shapes>];

/// Whether two terms are the same operators and numbers, whatever values they read.
fn same_shape(a: &Tpl, b: &Tpl) -> bool {
    match (a, b) {
        (Tpl::Value(_), Tpl::Value(_)) => true,
        (Tpl::Num(x), Tpl::Num(y)) => x == y,
        (Tpl::Op(s, k), Tpl::Op(t, l)) => {
            s == t && k.len() == l.len() && k.iter().zip(l).all(|(x, y)| same_shape(x, y))
        }
        _ => false,
    }
}

/// The relation of the operator `t` (seeded with `seeds`) over `state`, by the solution of the
/// first of its `twins` whose inputs relate alike and whose renamed tensors have the same
/// neighbourhoods, renamed onto its tensors and checked ([`check`]); `None` where no twin is
/// alike or the check does not close.
///
/// The renaming may map ranks one to one: a pipeline stage's first layer has as twins only
/// the previous stage's layers, on other ranks (llama3-70b-tiny's stage 1 forward and stage
/// 0 backward), which a rank-keeping renaming never matches. A twin on the same ranks still
/// matches as before (each rank onto itself); the check decides either way.
pub(super) fn reuse(
    imp: &Impl,
    rules: (Lemmas, Lemmas),
    opts: &Options,
    state: &HashMap<ValueId, State>,
    t: &Tpl,
    seeds: &[(Tpl, ValueId)],
    twins: &[std::sync::Arc<Solved>],
) -> Option<Reused> {
    let twins: Vec<&Solved> = twins.iter().map(|t| &**t).collect();
    reuse_renamed(imp, rules, opts, (state, t, seeds), &twins, false).ok()
}

/// Symmetric ranks once (issue 48, item 6): the relation of a piece of an operator (see
/// `pieces`) by the solution of a sibling piece over other ranks, the members of another
/// data- or tensor-parallel group, whose inputs relate alike up to a renaming of ranks (one
/// to one) and of their tensors; renamed and checked as a twin's is ([`reuse`]), with
/// `rules`. `None` where the pieces are not alike or the check does not close.
pub(super) fn across_ranks(
    imp: &Impl,
    rules: Lemmas,
    opts: &Options,
    (state, t, seeds): (&HashMap<ValueId, State>, &Tpl, &[(Tpl, ValueId)]),
    twin: &Solved,
) -> Result<Rel, Miss> {
    reuse_renamed(imp, (rules, rules), opts, (state, t, seeds), &[twin], true).map(|r| r.rel)
}

/// Why a renaming was not taken (the piece log names it): the stage that failed, for the
/// last twin tried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Miss {
    /// An input of the problem has no relation, or no twin was offered.
    NoInputs,
    /// The problems read different numbers of relations.
    InputCount,
    /// Input `k`'s relations differ in their lists' lengths (expressions, equal leaves, equal
    /// slices: the twin's, then this problem's).
    Lengths(usize, [usize; 3], [usize; 3]),
    /// Input `k`'s relations have the same lengths but no renaming matches them.
    Unmatched(usize),
    /// The twin's relation names a tensor with no image here.
    NoImage,
    /// A renamed tensor's implementation neighbourhood differs from its original's.
    Neighbourhoods,
    /// The renamed relation did not check.
    Check,
}

impl std::fmt::Display for Miss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Miss::NoInputs => write!(f, "no inputs"),
            Miss::InputCount => write!(f, "input count"),
            Miss::Lengths(k, a, b) => write!(f, "input {k} lengths {a:?} vs {b:?}"),
            Miss::Unmatched(k) => write!(f, "input {k} unmatched"),
            Miss::NoImage => write!(f, "no image"),
            Miss::Neighbourhoods => write!(f, "neighbourhoods"),
            Miss::Check => write!(f, "check"),
        }
    }
}

/// [`reuse`] and [`across_ranks`]: the renaming may change ranks (one to one); with
/// `slices_up_to_equal` (sibling pieces), equal slices match up to the inputs' equal tensors
/// ([`Renaming::match_rel`]).
fn reuse_renamed(
    imp: &Impl,
    rules: (Lemmas, Lemmas),
    opts: &Options,
    (state, t, seeds): (&HashMap<ValueId, State>, &Tpl, &[(Tpl, ValueId)]),
    twins: &[&Solved],
    slices_up_to_equal: bool,
) -> Result<Reused, Miss> {
    let ins = input_rels(t, seeds, state).ok_or(Miss::NoInputs)?;
    let mut miss = Miss::NoInputs;
    let found = twins.iter().find_map(|twin| {
        let mut renaming = Renaming {
            imp,
            map: HashMap::new(),
            ranks: Some(HashMap::new()),
            defined: Vec::new(),
            equal: HashMap::new(),
            slices_up_to_equal,
        };
        if twin.ins.len() != ins.len() {
            miss = Miss::InputCount;
            return None;
        }
        for (k, (a, b)) in twin.ins.iter().zip(&ins).enumerate() {
            match (a, b) {
                (Some(a), Some(b)) => {
                    if !renaming.match_rel(a, b) {
                        let lengths =
                            |r: &Rel| [r.exprs.len(), r.equal_leaves.len(), r.equal_slices.len()];
                        miss = if lengths(a) == lengths(b) {
                            Miss::Unmatched(k)
                        } else {
                            Miss::Lengths(k, lengths(a), lengths(b))
                        };
                        return None;
                    }
                }
                (None, None) => {}
                _ => {
                    miss = Miss::Unmatched(k);
                    return None;
                }
            }
        }
        let Some(candidate) = renaming.rename_rel(&twin.out) else {
            miss = Miss::NoImage;
            return None;
        };
        if !renaming.same_neighbourhoods() {
            miss = Miss::Neighbourhoods;
            return None;
        }
        Some((twin, renaming, candidate))
    });
    let (twin, renaming, candidate) = found.ok_or(miss)?;
    let lemmas = if twin.widened { rules.1 } else { rules.0 };
    let problem = Problem {
        imp,
        opts,
        state,
        t,
        seeds,
    };
    let check =
        |rules: &[&Rewrite<Term, Shapes>]| check(&problem, rules, &candidate, &renaming.defined);
    // The twin's own check needed only a few of the hundreds of lemmas (those that changed
    // its e-graph); this layer's repeats it, so those alone usually close it, at a fraction of
    // the searches. Fewer lemmas make a check only less likely to close (each union is still
    // a true equation), and where they do not, the full set is tried as before.
    let first_try = twin.lemmas_used.as_ref().and_then(|used| {
        let few: Vec<&Rewrite<Term, Shapes>> = used.iter().filter_map(|&k| lemmas.get(k)).collect();
        check(&few).map(|u| u.iter().map(|&i| used[i]).collect::<Arc<[usize]>>())
    });
    let lemmas_used = first_try
        .or_else(|| check(&lemmas.iter().collect::<Vec<_>>()).map(Arc::from))
        .ok_or(Miss::Check)?;
    Ok(Reused {
        rel: candidate,
        widened: twin.widened,
        lemmas_used,
    })
}

/// The inference problem a reuse check is about: the operator `t` (seeded with `seeds`) over
/// the relations of `state`.
struct Problem<'a, 'c> {
    imp: &'a Impl<'c>,
    opts: &'a Options,
    state: &'a HashMap<ValueId, State>,
    t: &'a Tpl,
    seeds: &'a [(Tpl, ValueId)],
}

/// Whether `candidate` is a relation of the operator `t` over `state`: in an e-graph of the
/// operator over its inputs' relations and seeds, with the definitions of `defined` (the
/// implementation tensors the candidate names beyond its inputs'), saturation puts each of its
/// expressions in the operator's class and each of its groups of equal tensors and slices in
/// one class. The run stops as soon as they are, or at the node and iteration limits.
/// `Some` where it holds, with the positions in `rules` of those that changed the e-graph.
fn check(
    problem: &Problem,
    rules: &[&Rewrite<Term, Shapes>],
    candidate: &Rel,
    defined: &[ValueRef],
) -> Option<Vec<usize>> {
    let Problem {
        imp,
        opts,
        state,
        t,
        seeds,
    } = *problem;
    let mut eg = new_graph(imp);
    let mut ins = Vec::new();
    tpl_values(t, &mut ins);
    let mut ids: HashMap<ValueId, Id> = HashMap::new();
    for x in &ins {
        if ids.contains_key(&x.value) {
            continue;
        }
        let Some(State::Related(r)) = state.get(&x.value) else {
            return None;
        };
        ids.insert(x.value, add_relation(&mut eg, imp, r));
    }
    seed_spec_equations(&mut eg, imp, state, seeds, &mut ids);
    let root = add_tpl(&mut eg, t, &mut |_, x| ids[&x.value]);
    let mut added = HashSet::new();
    for &d in defined {
        if added.insert(d) {
            define(&mut eg, imp, d, &mut added);
        }
    }
    // And the tensors those are computed from, up to [`SOURCE_LEVELS`] back: they are the
    // inputs' tensors (or others defined), and exploration's rounds bring their definitions in
    // too. Without the first level the llama attention backward's `grad x V` product never
    // checked: its rank product reads `view(transpose_33)` while the value's relation names
    // both `view_100` and `transpose_33`, and only `transpose_33 = transpose(view_100)` joins
    // the two forms. Without the second, no residual add past a stage's first layer checked:
    // its ranks' sums are equal (`add_20 = add_18 + view(all_reduce_6)` on each tensor-parallel
    // rank) only through the all-reduce two levels back, so each layer inferred both afresh.
    let mut level: Vec<ValueRef> = defined.to_vec();
    for _ in 0..SOURCE_LEVELS {
        let mut sources = Vec::new();
        for &d in &level {
            if let Some(Lowered::Term(t)) = imp.lowered.get(&d) {
                let mut xs = Vec::new();
                tpl_values(t, &mut xs);
                sources.extend(xs.into_iter().map(|x| imp.canon(x)));
            }
        }
        for &d in &sources {
            if added.insert(d) {
                define(&mut eg, imp, d, &mut added);
            }
        }
        level = sources;
    }
    // Each goal: classes that must end as one.
    let mut goals: Vec<Vec<Id>> = vec![std::iter::once(root)
        .chain(candidate.exprs.iter().map(|e| add_rec(&mut eg, imp, e)))
        .collect()];
    for g in &candidate.equal_leaves {
        goals.push(
            g.iter()
                .map(|s| {
                    let mut e = RecExpr::default();
                    e.add(Term::Op(*s, Vec::new()));
                    add_rec(&mut eg, imp, &e)
                })
                .collect(),
        );
    }
    for g in &candidate.equal_slices {
        goals.push(g.iter().map(|e| add_rec(&mut eg, imp, e)).collect());
    }
    let met = |eg: &Graph, goals: &[Vec<Id>]| {
        goals
            .iter()
            .all(|g| g.iter().all(|&x| eg.find(x) == eg.find(g[0])))
    };
    crate::lemmas::mark_zero_blocks(&mut eg);
    eg.rebuild();
    if met(&eg, &goals) {
        return Some(Vec::new());
    }
    eg.analysis.node_cap = opts.node_limit.saturating_mul(10);
    let used = run_rule_refs(
        &mut eg,
        rules,
        RunLimits::new(opts.iter_limit * 2, opts.node_limit),
        |eg| {
            if crate::lemmas::mark_zero_blocks(eg) {
                eg.rebuild();
            }
            met(eg, &goals)
        },
        Some(&|eg: &Graph| met(eg, &goals)),
    );
    eg.rebuild();
    if !met(&eg, &goals) {
        crate::lemmas::merge_equal_sums(&mut eg);
    }
    met(&eg, &goals).then_some(used)
}
