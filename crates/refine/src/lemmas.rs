//! The lemma library: equalities between terms, each with the condition under which it holds.
//!
//! A lemma matches a root operator with an egg pattern and, where the rewrite depends on
//! shapes or on how a child is partitioned (which `cat`/`sum` nodes its e-class holds), a
//! small condition function builds the right-hand side. Lemmas only ever add terms built from
//! pieces already in the e-graph, so the e-graph stays small (the constrained lemmas of the
//! Entangle paper, section 4.3.2). Every lemma carries examples; `tests::every_lemma_is_sound`
//! instantiates each with random values and checks both sides with the reference kernels.

use crate::term::{is_op, Data, Shapes, Term, CAT, GET, LIST, MAX, MIN, SLICE, SUM};
use egg::{
    Applier, EGraph, Id, Pattern, PatternAst, Rewrite, SearchMatches, Searcher, Subst, Symbol, Var,
};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

mod chunks;
mod elements;
mod flash;
pub use flash::mark_zero_blocks;
mod identities;
mod moe;
pub(crate) mod pieces;
pub(crate) mod ring;
mod rows;
mod vocab;

/// The e-graph type of the engine.
pub type Graph = EGraph<Term, Shapes>;

type Build = dyn Fn(&mut Graph, Id, &[Id]) -> Vec<Id> + Send + Sync;

/// One lemma: a name, what it says, the root operators it applies to, its right-hand sides.
pub struct Lemma {
    /// Stable identifier.
    pub name: &'static str,
    /// The equality in words.
    pub doc: &'static str,
    /// Root operators (full names, or clean operator names) the lemma rewrites; `name/n` matches
    /// only calls with `n` children.
    pub roots: Vec<String>,
    /// Examples: a left-hand side term and the shapes of its leaves, for the soundness test.
    pub examples: Vec<(&'static str, &'static [(&'static str, &'static str)])>,
    /// The case assumption (`assume:` key) the lemma needs, if any; the engine only uses it
    /// when the case states that assumption. Its examples satisfy the assumption. ([`WIDENED`]
    /// marks a lemma of the engine's wider second attempt instead.)
    pub requires: Option<&'static str>,
    build: Arc<Build>,
}

struct FnApplier {
    build: Arc<Build>,
    vars: Vec<Var>,
    /// Bound by a [`WideSearcher`]: the leading variables the match binds, not all of them.
    wide: bool,
}

/// The most children a [`WideSearcher`] binds.
const MAX_WIDE_ARITY: usize = 256;

/// Matches a variadic operator (`sum`, `max`, `min`, `cat`) with more children than the
/// per-count patterns cover (see [`root_arities`]), binding `?a0`, `?a1`, .. to its children.
/// Written by hand because an egg pattern has a fixed child count: without it a lemma never saw
/// a sum of more than 16 terms (a gradient norm over the 17th parameter on).
struct WideSearcher {
    op: Symbol,
    min: usize,
    vars: Vec<Var>,
}

impl Searcher<Term, Shapes> for WideSearcher {
    fn search_eclass_with_limit(
        &self,
        egraph: &Graph,
        eclass: Id,
        limit: usize,
    ) -> Option<SearchMatches<'_, Term>> {
        let substs: Vec<Subst> = egraph[eclass]
            .nodes
            .iter()
            .filter_map(|n| match n {
                Term::Op(s, k)
                    if *s == self.op && (self.min..=self.vars.len()).contains(&k.len()) =>
                {
                    let mut sub = Subst::with_capacity(k.len());
                    for (v, &c) in self.vars.iter().zip(k) {
                        sub.insert(*v, c);
                    }
                    Some(sub)
                }
                _ => None,
            })
            .take(limit)
            .collect();
        (!substs.is_empty()).then_some(SearchMatches {
            eclass,
            substs,
            ast: None,
        })
    }

    fn search_with_limit(&self, egraph: &Graph, mut limit: usize) -> Vec<SearchMatches<'_, Term>> {
        let mut out = Vec::new();
        for id in egraph.classes_for_op(&Some(self.op)).into_iter().flatten() {
            if limit == 0 {
                break;
            }
            if let Some(m) = self.search_eclass_with_limit(egraph, id, limit) {
                limit = limit.saturating_sub(m.substs.len());
                out.push(m);
            }
        }
        out
    }

    fn vars(&self) -> Vec<Var> {
        self.vars.clone()
    }
}

impl Applier<Term, Shapes> for FnApplier {
    fn apply_one(
        &self,
        egraph: &mut Graph,
        eclass: Id,
        subst: &Subst,
        _: Option<&PatternAst<Term>>,
        _: Symbol,
    ) -> Vec<Id> {
        let cap = egraph.analysis.node_cap;
        if cap != 0 && egraph.total_size() >= cap {
            return Vec::new();
        }
        let kids: Vec<Id> = if self.wide {
            self.vars
                .iter()
                .map_while(|v| subst.get(*v).copied())
                .collect()
        } else {
            self.vars.iter().map(|v| subst[*v]).collect()
        };
        let mut changed = Vec::new();
        for new in (self.build)(egraph, eclass, &kids) {
            // A lemma that unions other classes itself reports the match class as changed.
            if new == eclass || egraph.union(eclass, new) {
                changed.push(eclass);
            }
        }
        changed
    }
}

impl Lemma {
    /// The egg rewrites of this lemma, one per root operator (`arity` children each).
    pub fn rewrites(&self) -> Vec<Rewrite<Term, Shapes>> {
        let reg = shardproof_ops::Registry::builtin();
        self.roots
            .iter()
            .flat_map(|root| {
                // `sum/2`: only that many children.
                let (root, arities) = match root.split_once('/') {
                    Some((name, n)) => (name, n.parse().into_iter().collect()),
                    None => (root.as_str(), root_arities(reg, root)),
                };
                arities.into_iter().map(move |arity| (root, arity))
            })
            .filter_map(|(root, arity)| {
                let vars: Vec<Var> = (0..arity)
                    .map(|i| format!("?a{i}").parse().expect("var"))
                    .collect();
                let pat: Pattern<Term> = format!(
                    "({root} {})",
                    vars.iter()
                        .map(|v| v.to_string())
                        .collect::<Vec<_>>()
                        .join(" ")
                )
                .parse()
                .ok()?;
                Rewrite::new(
                    format!("{}@{root}/{arity}", self.name),
                    pat,
                    FnApplier {
                        build: self.build.clone(),
                        vars,
                        wide: false,
                    },
                )
                .ok()
            })
            .chain(self.roots.iter().filter_map(|root| {
                let min = root_arities(reg, root).into_iter().max()? + 1;
                (min > 1 && [SUM, MAX, MIN, CAT].contains(&root.as_str())).then(|| {
                    let vars: Vec<Var> = (0..MAX_WIDE_ARITY)
                        .map(|i| format!("?a{i}").parse().expect("var"))
                        .collect();
                    Rewrite::new(
                        format!("{}@{root}/{min}+", self.name),
                        WideSearcher {
                            op: Symbol::from(root.as_str()),
                            min,
                            vars: vars.clone(),
                        },
                        FnApplier {
                            build: self.build.clone(),
                            vars,
                            wide: true,
                        },
                    )
                    .expect("a wide rewrite binds every variable it applies")
                })
            }))
            .collect()
    }
}

/// The child counts a root operator is matched with: its schema's, fixed ones for the clean
/// operators, and every group size up to 16 for the variadic `sum`/`cat`.
fn root_arities(reg: &shardproof_ops::Registry, root: &str) -> Vec<usize> {
    match root {
        SCALE | crate::term::VOCAB_LOOKUP | crate::term::VOCAB_PICK | crate::term::VOCAB_ONEHOT => {
            vec![3]
        }
        crate::term::VOCAB_GRAD => vec![4],
        SLICE => vec![4],
        GET => vec![2],
        SUM | MAX | MIN => (2..=16).collect(),
        CAT => (3..=17).collect(),
        _ => shardproof_ir::OpName::parse(root)
            .and_then(|o| reg.get(&o))
            .map_or_else(Vec::new, |def| vec![def.schema.args.len()]),
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers over e-classes.

/// The single-tensor shape of a class.
pub fn shape(g: &Graph, id: Id) -> Option<Vec<usize>> {
    g[id].data.shape().map(<[usize]>::to_vec)
}

fn int(g: &Graph, id: Id) -> Option<i64> {
    match g[id].data {
        Data::Int(n) => Some(n),
        _ => None,
    }
}

fn int_list(g: &Graph, id: Id) -> Option<Vec<i64>> {
    g[id].nodes.iter().find_map(|n| match n {
        Term::Op(s, kids) if is_op!(s, LIST) => kids.iter().map(|&k| int(g, k)).collect(),
        _ => None,
    })
}

/// The `cat` nodes of a class: (dim, pieces).
pub fn cats(g: &Graph, id: Id) -> Vec<(usize, Vec<Id>)> {
    let mut out: Vec<(usize, Vec<Id>)> = g[id]
        .nodes
        .iter()
        .filter_map(|n| match n {
            Term::Op(s, kids) if is_op!(s, CAT) && kids.len() >= 3 => {
                Some((usize::try_from(int(g, kids[0])?).ok()?, kids[1..].to_vec()))
            }
            _ => None,
        })
        .collect();
    out.truncate(4);
    out
}

/// The `sum` nodes of a class (rank reductions): their operands.
pub fn sums(g: &Graph, id: Id) -> Vec<Vec<Id>> {
    let mut out: Vec<Vec<Id>> = g[id]
        .nodes
        .iter()
        .filter_map(|n| match n {
            Term::Op(s, kids) if is_op!(s, SUM) => Some(kids.clone()),
            _ => None,
        })
        .collect();
    out.truncate(4);
    out
}

/// `sum(xs) + sum(ys)` as one sum: every term of `ys` joins a distinct term `x` of `xs` for
/// which the graph already has `x + y` (either operand order, alpha `one`), or is kept as a
/// term of its own; `None` when no term joins (then nothing is gained) or the sum would have
/// more terms than a lemma can match ([`MAX_WIDE_ARITY`]). Past 16 terms only
/// [`WideSearcher`]'s rewrites match the sum: a gradient norm's running total grows by one
/// term per parameter, and gpt2 has more than 16.
fn pair_sums(g: &mut Graph, xs: &[Id], ys: &[Id], one: Id) -> Option<Id> {
    let add = Symbol::from("aten.add.Tensor");
    let mut terms: Vec<Id> = xs.to_vec();
    let mut joined = vec![false; xs.len()];
    let mut alone = Vec::new();
    for &y in ys {
        let hit = (0..xs.len()).filter(|&i| !joined[i]).find_map(|i| {
            let x = xs[i];
            g.lookup(Term::Op(add, vec![x, y, one]))
                .or_else(|| g.lookup(Term::Op(add, vec![y, x, one])))
                .map(|s| (i, s))
        });
        match hit {
            Some((i, s)) => {
                terms[i] = s;
                joined[i] = true;
            }
            None => alone.push(y),
        }
    }
    if !joined.contains(&true) || terms.len() + alone.len() > MAX_WIDE_ARITY {
        return None;
    }
    terms.extend(alone);
    Some(op(g, SUM, terms))
}

/// The classes holding a node of operator `sym` (egg's per-operator index).
pub(crate) fn classes_of(g: &Graph, sym: &str) -> Vec<Id> {
    g.classes_for_op(&Some(Symbol::from(sym)))
        .map(|it| it.map(|c| g.find(c)).collect())
        .unwrap_or_default()
}

/// Merges the classes of sums of the same terms in different orders: `sum(x_1, .., x_n) =
/// sum(x_p(1), .., x_p(n))` for any permutation `p` (chunks of a sequence summed in chunk order
/// by the spec and in rank order by the implementation; ranks' running totals reduced over tp,
/// then dp). Returns whether it merged anything.
///
/// Runs after every saturation round rather than as a lemma: a rewrite would put a reordered
/// copy of every sum in the e-graph and every lemma over sums would then work twice; here no
/// node is built, and congruence carries the merge to every operator of the sums.
fn merge_permuted_sums(g: &mut Graph) -> bool {
    let mut by_terms: HashMap<Vec<Id>, Id> = HashMap::new();
    let mut merges = Vec::new();
    for c in classes_of(g, SUM) {
        for n in &g[c].nodes {
            let Term::Op(s, k) = n else { continue };
            if !is_op!(s, SUM) {
                continue;
            }
            let mut terms: Vec<Id> = k.iter().map(|&x| g.find(x)).collect();
            terms.sort_unstable();
            match by_terms.get(&terms) {
                Some(&other) if other != c => merges.push((other, c)),
                Some(_) => {}
                None => {
                    by_terms.insert(terms, c);
                }
            }
        }
    }
    union_all(g, merges)
}

/// Merges the classes of sums that are equal by the laws of addition alone, building no node:
/// the same terms in another order ([`merge_permuted_sums`]) and, for 0-d tensors, the same
/// linear combination of the same values ([`merge_linear_scalars`]). The engine runs it after
/// every saturation round. Returns whether it merged anything.
pub fn merge_equal_sums(g: &mut Graph) -> bool {
    let permuted = merge_permuted_sums(g);
    merge_linear_scalars(g) || permuted
}

/// Applies each `(lemma, root operator)` pair once at every node of that operator, outside the
/// runner; returns whether anything changed. The runner's scheduler bans a lemma for a few
/// iterations after it matched often, and the rewrites that turn multiples of chunks into one
/// multiple of a concatenation (a scale of a scale folded, a multiple named by the rank tensor
/// it is a multiple of, a concatenation of equal multiples) match thousands of times in an
/// attention backward's e-graph: the operators brought in last were never rewritten by them.
pub fn apply_everywhere(g: &mut Graph, pairs: &[(&str, &str)]) -> bool {
    let lemmas: Vec<Lemma> = library()
        .into_iter()
        .filter(|l| pairs.iter().any(|p| p.0 == l.name))
        .collect();
    let reg = shardproof_ops::Registry::builtin();
    // Every match first: the e-graph changes as the lemmas apply. Only the child counts the
    // runner's patterns match: a build may rely on them.
    let mut matches: Vec<(usize, Id, Vec<Id>)> = Vec::new();
    for class in g.classes() {
        for n in &class.nodes {
            let Term::Op(s, kids) = n else { continue };
            let arity_matched = match s.as_str() {
                SUM | MAX | MIN => (2..=MAX_WIDE_ARITY).contains(&kids.len()),
                CAT => (3..=MAX_WIDE_ARITY + 1).contains(&kids.len()),
                root => root_arities(reg, root).contains(&kids.len()),
            };
            if !arity_matched {
                continue;
            }
            for (i, l) in lemmas.iter().enumerate() {
                if pairs
                    .iter()
                    .any(|&(name, root)| name == l.name && root == s.as_str())
                {
                    matches.push((i, class.id, kids.to_vec()));
                }
            }
        }
    }
    let before = (g.total_size(), g.number_of_classes());
    let mut united = false;
    for (i, class, kids) in matches {
        let class = g.find(class);
        let kids: Vec<Id> = kids.iter().map(|&k| g.find(k)).collect();
        for new in (lemmas[i].build)(g, class, &kids) {
            united |= g.union(class, new);
        }
    }
    // A build that unites classes itself returns the match's class: the counts tell.
    let changed = united || (g.total_size(), g.number_of_classes()) != before;
    if changed {
        g.rebuild();
    }
    changed
}

/// Unites each pair of classes and restores the e-graph's invariants; whether any changed.
fn union_all(g: &mut Graph, merges: Vec<(Id, Id)>) -> bool {
    let mut changed = false;
    for (a, b) in merges {
        changed |= g.union(a, b);
    }
    if changed {
        g.rebuild();
    }
    changed
}

/// Whether a class holds 0-d tensors.
fn is_scalar(g: &Graph, id: Id) -> bool {
    g[id].data.shape().is_some_and(<[usize]>::is_empty)
}

/// A scalar's value as a linear combination of atom classes with rational coefficients
/// (atom, numerator, denominator), sorted by atom, no zero coefficient.
type Linear = Vec<(Id, i128, i128)>;

/// Merges the classes of 0-d tensors that are the same linear combination of the same atoms
/// (classes without a `sum`, `scale` or unit-alpha addition of 0-d operands): a loss summed
/// over ranks as one flat sum by the spec and as nested reductions and additions by the
/// implementation (aux losses all-reduced over tp, then pp, added to each dp rank's loss,
/// then all-reduced over dp). See [`linear_forms`] for how each class's combination is found.
/// Only 0-d classes take part, so models whose reductions are all of tensors pay nothing.
fn merge_linear_scalars(g: &mut Graph) -> bool {
    let mut todo: Vec<Id> = classes_of(g, SUM)
        .into_iter()
        .chain(classes_of(g, SCALE))
        .chain(classes_of(g, "aten.add.Tensor"))
        .filter(|&c| is_scalar(g, c))
        .collect();
    if todo.is_empty() {
        return false;
    }
    todo.sort_unstable();
    todo.dedup();
    let mut merges = Vec::new();
    for breaking in [CycleBreaking::OnePerCycle, CycleBreaking::AllStuck] {
        let (forms, stuck) = linear_forms(g, breaking);
        let identities = identities_between_definitions(g, &forms);
        let mut by_form: HashMap<Linear, Id> = HashMap::new();
        for &c in &todo {
            let Some(form) = forms.get(&c).filter(|f| !f.is_empty()) else {
                continue;
            };
            let form = if identities.is_empty() {
                form.clone()
            } else {
                identities.reduce(form).unwrap_or_else(|| form.clone())
            };
            match by_form.get(&form) {
                Some(&other) if other != c => merges.push((other, c)),
                Some(_) => {}
                None => {
                    by_form.insert(form, c);
                }
            }
        }
        if !stuck {
            // No cycle was left to break: the other choice gives the same combinations.
            break;
        }
    }
    union_all(g, merges)
}

/// Unites a 0-d class with a combination of `candidates` (implementation values, in order of
/// preference) that equals it: its combination lies in the span of theirs, modulo the
/// identities between definitions (see [`linear_forms`] and [`identities`]). Built as
/// `scale(c, sum(x_k))` when the coefficients agree, else `sum(scale(c_k, x_k))`. A stage's
/// running sum of per-layer balance losses is then one small term over the ranks' latest
/// sums, where the lemmas' pairing of terms, one layer deeper each time, runs out of rounds.
/// Returns whether it built anything.
pub fn express_by_combination(g: &mut Graph, root: Id, candidates: &[Id]) -> bool {
    let root = g.find(root);
    if !is_scalar(g, root) {
        return false;
    }
    let (forms, _) = linear_forms(g, CycleBreaking::OnePerCycle);
    let known = identities_between_definitions(g, &forms);
    let Some(target) = forms.get(&root).and_then(|f| known.reduce(f)) else {
        return false;
    };
    let mut span = identities::Span::default();
    let mut seen = HashSet::new();
    for &c in candidates {
        let c = g.find(c);
        if c == root {
            return false;
        }
        let Some(f) = forms.get(&c).and_then(|f| known.reduce(f)) else {
            continue;
        };
        if !f.is_empty() && seen.insert(f.clone()) {
            span.insert_tagged(&f, c);
        }
    }
    if span.is_empty() {
        return false;
    }
    let Some(combo) = span.solve(&target) else {
        return false;
    };
    let Ok(coefs) = combo
        .iter()
        .map(|&(x, n, d)| Ok((x, i64::try_from(n)?, i64::try_from(d)?)))
        .collect::<Result<Vec<(Id, i64, i64)>, std::num::TryFromIntError>>()
    else {
        return false;
    };
    let built = match coefs.as_slice() {
        [] => return false,
        [(x, 1, 1)] => *x,
        [(_, n, d), rest @ ..] if rest.iter().all(|&(_, n2, d2)| (n2, d2) == (*n, *d)) => {
            let total = op(g, SUM, coefs.iter().map(|c| c.0).collect());
            scale(g, *n, *d, total)
        }
        _ => {
            let parts = coefs
                .iter()
                .map(|&(x, n, d)| {
                    if (n, d) == (1, 1) {
                        x
                    } else {
                        scale(g, n, d, x)
                    }
                })
                .collect();
            op(g, SUM, parts)
        }
    };
    union_all(g, vec![(root, built)])
}

/// The identities between the atoms that a class's linear definitions give beside the one
/// its combination came from: each other definition whose operands have combinations is the
/// same value, so the two combinations are equal (see [`identities`]).
fn identities_between_definitions(g: &Graph, forms: &HashMap<Id, Linear>) -> identities::Span {
    let mut found = identities::Span::default();
    let mut classes: Vec<Id> = forms.keys().copied().collect();
    classes.sort_unstable();
    for c in classes {
        for n in &g[c].nodes {
            let Some(parts) = linear_parts(g, n) else {
                continue;
            };
            if !parts.iter().all(|(_, _, x)| forms.contains_key(x)) {
                continue;
            }
            if let Some(other) = combine(&parts, forms).filter(|f| *f != forms[&c]) {
                found.insert_identity(&forms[&c], &other);
            }
        }
    }
    found
}

/// The operands of a linear node over 0-d classes, (numerator, denominator, operand) each:
/// a `sum`, a `scale` by integers, or a unit-alpha addition; `None` for any other node or
/// when an operand is not 0-d.
fn linear_parts(g: &Graph, n: &Term) -> Option<Vec<(i128, i128, Id)>> {
    let Term::Op(s, k) = n else { return None };
    let parts: Vec<(i128, i128, Id)> = match s.as_str() {
        SUM => k.iter().map(|&x| (1, 1, g.find(x))).collect(),
        SCALE if k.len() == 3 => match (int(g, k[0]), int(g, k[1])) {
            (Some(p), Some(q)) if q != 0 => vec![(i128::from(p), i128::from(q), g.find(k[2]))],
            _ => return None,
        },
        "aten.add.Tensor" if k.len() == 3 && is_one(g, k[2]) => {
            vec![(1, 1, g.find(k[0])), (1, 1, g.find(k[1]))]
        }
        _ => return None,
    };
    parts
        .iter()
        .all(|&(_, _, x)| is_scalar(g, x))
        .then_some(parts)
}

/// The combination `sum p/q * form(x)` over a linear node's parts; `None` on overflow.
fn combine(parts: &[(i128, i128, Id)], forms: &HashMap<Id, Linear>) -> Option<Linear> {
    let mut acc: std::collections::BTreeMap<Id, (i128, i128)> = Default::default();
    for &(p, q, x) in parts {
        for &(a, fp, fq) in &forms[&x] {
            let e = acc.entry(a).or_insert((0, 1));
            // e + p fp / (q fq)
            let (n, d) = (p.checked_mul(fp)?, q.checked_mul(fq)?);
            let (n, d) = (
                e.0.checked_mul(d)?.checked_add(n.checked_mul(e.1)?)?,
                e.1.checked_mul(d)?,
            );
            let r = gcd128(n, d) * d.signum();
            *e = (n / r, d / r);
        }
    }
    Some(
        acc.into_iter()
            .filter(|&(_, (n, _))| n != 0)
            .map(|(a, (n, d))| (a, n, d))
            .collect(),
    )
}

/// Which classes [`linear_forms`] makes atoms when only cycles are left. Each choice gives
/// true identities; they differ in which of two equal values (replicas on two ranks, a value
/// and its half) a combination names, so [`merge_linear_scalars`] merges by both.
#[derive(Clone, Copy)]
enum CycleBreaking {
    /// One class per cycle that waits on nothing else ([`cycle_breakers`]).
    OnePerCycle,
    /// Every stuck class that holds a definition of its own.
    AllStuck,
}

/// Every 0-d class's value as a linear combination of atom classes (see
/// [`merge_linear_scalars`]), built bottom-up: a class with no linear node is an atom; a class
/// gets its combination from the first of its linear nodes whose operands all have theirs, in
/// passes until nothing changes. The scalar classes hold cycles (`x = sum(x/2, x/2)`, `y = 2x`
/// beside `x = y/2`); when only classes on or behind such cycles are left, one class of each
/// cycle that waits on nothing else becomes an atom (see [`cycle_breakers`]), and the passes
/// go on, so a class that merely waits on a cycle still gets the combination of its
/// definition.
///
/// Bottom-up rather than by recursion from each class: a recursion that cuts a cycle where it
/// meets it makes a class an atom or not by the order it is reached in, and then one value has
/// two combinations (a loss's last layers' aux terms stayed behind `2 * aux_loss` atoms on one
/// side only, so the loss of a 28-layer model never merged).
/// Also returns whether any cycle was left to break (if not, `breaking` made no difference).
fn linear_forms(g: &Graph, breaking: CycleBreaking) -> (HashMap<Id, Linear>, bool) {
    let mut forms: HashMap<Id, Linear> = HashMap::new();
    let mut stuck = false;
    let mut pending: Vec<Pending> = Vec::new();
    let mut scalars: Vec<Id> = g
        .classes()
        .filter(|c| c.data.shape().is_some_and(<[usize]>::is_empty))
        .map(|c| c.id)
        .collect();
    scalars.sort_unstable();
    for c in scalars {
        let mut lin = Vec::new();
        let mut own = 0;
        for n in &g[c].nodes {
            match linear_parts(g, n) {
                Some(p) => lin.push(p),
                None if matches!(n, Term::Op(_, k) if !k.is_empty()) => own = 2,
                None => own = own.max(1),
            }
        }
        if lin.is_empty() {
            forms.insert(c, vec![(c, 1, 1)]);
        } else {
            pending.push((c, lin, own));
        }
    }
    while !pending.is_empty() {
        let before = pending.len();
        pending.retain(|(c, lin, _)| {
            let found = lin
                .iter()
                .filter(|parts| parts.iter().all(|(_, _, x)| forms.contains_key(x)))
                .find_map(|parts| combine(parts, &forms));
            match found {
                Some(f) => {
                    forms.insert(*c, f);
                    false
                }
                None => true,
            }
        });
        if pending.len() == before {
            // Only cycles (or overflowing combinations) are left: some of their classes
            // become atoms (see `CycleBreaking`), and the passes go on.
            stuck = true;
            let mut atoms = match breaking {
                CycleBreaking::OnePerCycle => cycle_breakers(&pending),
                CycleBreaking::AllStuck => {
                    pending.iter().filter(|p| p.2 > 0).map(|p| p.0).collect()
                }
            };
            if atoms.is_empty() {
                atoms.push(pending[0].0);
            }
            pending.retain(|p| !atoms.contains(&p.0));
            for c in atoms {
                forms.insert(c, vec![(c, 1, 1)]);
            }
        }
    }
    (forms, stuck)
}

/// A class [`linear_forms`] has no combination for yet: its id, its linear nodes' parts, and
/// how much of a definition of its own it holds (2: an operator of another kind, 1: only
/// names and constants, 0: none).
type Pending = (Id, Vec<Vec<(i128, i128, Id)>>, u8);

/// The classes that become atoms when [`linear_forms`] is stuck: one per strongly connected
/// component of the pending classes (linked by their linear nodes' operands) that waits on no
/// other pending class, the one with the most definition of its own, then the first. A
/// component that waits on another may still get its combination once that one has an atom,
/// and one atom per cycle keeps one value from becoming two unrelated atoms (`x` and its
/// `x/2`). Kosaraju's algorithm from petgraph: it runs without recursion, and chains of
/// additions can run deep.
fn cycle_breakers(pending: &[Pending]) -> Vec<Id> {
    let index_of: HashMap<Id, u32> = (0u32..).zip(pending).map(|(i, p)| (p.0, i)).collect();
    let edges: Vec<(u32, u32)> = (0u32..)
        .zip(pending)
        .flat_map(|(i, p)| {
            p.1.iter()
                .flatten()
                .filter_map(|(_, _, x)| index_of.get(x).map(|&j| (i, j)))
                .collect::<Vec<_>>()
        })
        .collect();
    let mut graph = petgraph::graph::DiGraph::<(), ()>::with_capacity(pending.len(), edges.len());
    for _ in pending {
        graph.add_node(());
    }
    graph.extend_with_edges(&edges);
    let sccs = petgraph::algo::kosaraju_scc(&graph);
    let mut comp = vec![0; pending.len()];
    for (k, scc) in sccs.iter().enumerate() {
        for w in scc {
            comp[w.index()] = k;
        }
    }
    let mut breakers: Vec<Id> = sccs
        .iter()
        .enumerate()
        .filter(|(k, scc)| {
            scc.iter()
                .all(|&w| graph.neighbors(w).all(|x| comp[x.index()] == *k))
        })
        .filter_map(|(_, scc)| {
            scc.iter()
                .map(|w| &pending[w.index()])
                .max_by_key(|p| (p.2, std::cmp::Reverse(p.0)))
                .map(|p| p.0)
        })
        .collect();
    breakers.sort_unstable();
    breakers
}

fn gcd128(a: i128, b: i128) -> i128 {
    if b == 0 {
        a.abs().max(1)
    } else {
        gcd128(b, a % b)
    }
}

/// `(p/q) (p2/q2)` in lowest terms, when that fits: factors that are exact binary fractions
/// (`1/sqrt(d)` is `m / 2^k`) meet their inverses only after reduction, their raw products
/// overflow.
pub(crate) fn product_reduced(a: (i64, i64), b: (i64, i64)) -> Option<(i64, i64)> {
    let n = i128::from(a.0) * i128::from(b.0);
    let d = i128::from(a.1) * i128::from(b.1);
    let r = gcd128(n, d) * d.signum();
    if r == 0 {
        return None;
    }
    Some((i64::try_from(n / r).ok()?, i64::try_from(d / r).ok()?))
}

/// The `scale` nodes of a class: (numerator, denominator, operand).
fn scales(g: &Graph, id: Id) -> Vec<(i64, i64, Id)> {
    g[id]
        .nodes
        .iter()
        .filter_map(|n| match n {
            Term::Op(s, kids) if is_op!(s, SCALE) && kids.len() == 3 => {
                Some((int(g, kids[0])?, int(g, kids[1])?, kids[2]))
            }
            _ => None,
        })
        .take(2)
        .collect()
}

pub(super) fn num(g: &mut Graph, n: i64) -> Id {
    g.add(Term::Num(n))
}

fn op(g: &mut Graph, sym: &str, kids: Vec<Id>) -> Id {
    g.add(Term::Op(Symbol::from(sym), kids))
}

fn cat(g: &mut Graph, d: usize, pieces: Vec<Id>) -> Id {
    if pieces.len() == 1 {
        return pieces[0];
    }
    let d = num(g, d as i64);
    op(g, CAT, std::iter::once(d).chain(pieces).collect())
}

fn slice(g: &mut Graph, d: usize, a: usize, b: usize, x: Id) -> Id {
    let full = shape(g, x).and_then(|s| s.get(d).copied());
    if a == 0 && full == Some(b) {
        return x;
    }
    let kids = vec![num(g, d as i64), num(g, a as i64), num(g, b as i64), x];
    op(g, SLICE, kids)
}

fn int_list_node(g: &mut Graph, v: &[i64]) -> Id {
    let kids = v.iter().map(|&d| num(g, d)).collect();
    op(g, LIST, kids)
}

/// Up to this many additions inside a sum are split into terms one at a time (every subset of
/// them splits in turn); more are split all at once.
const MAX_SEPARATE_ADDS: usize = 3;

/// Whether `a.0 / a.1 == b.0 / b.1`, cross-multiplied in i128 (the i64 products of two scale
/// factors overflow, and a wrapped product could call two different factors equal).
pub(crate) fn same_ratio(a: (i64, i64), b: (i64, i64)) -> bool {
    i128::from(a.0) * i128::from(b.1) == i128::from(a.1) * i128::from(b.0)
}

/// Rational scale factor node: `(scale P Q x)` is `x * P / Q`.
pub const SCALE: &str = "scale";

/// `x * p / q`, the fraction reduced, folded into nothing when it is one.
pub fn scale(g: &mut Graph, p: i64, q: i64, x: Id) -> Id {
    // Any multiple of zeros is those zeros: scaling a zero fill anew would start a chain c x,
    // c^2 x, .. through the scale lemmas (ring attention's masked blocks are zero fills) until
    // the factor overflows.
    if zero_fill(g, x, 2).is_some() {
        return x;
    }
    // Reduced in i128: `i64::MIN / -1` overflows an i64 (a factor built by the scale lemmas'
    // products can reach it); a fraction that does not fit stays unreduced.
    let s = gcd128(i128::from(p), i128::from(q)) * i128::from(q.signum());
    let (p, q) = match (
        i64::try_from(i128::from(p) / s),
        i64::try_from(i128::from(q) / s),
    ) {
        (Ok(a), Ok(b)) if s != 0 => (a, b),
        _ => (p, q),
    };
    if p == q {
        return x;
    }
    let kids = vec![num(g, p), num(g, q), x];
    op(g, SCALE, kids)
}

/// The sizes of pieces along `d`.
pub(super) fn sizes(g: &Graph, pieces: &[Id], d: usize) -> Option<Vec<usize>> {
    pieces
        .iter()
        .map(|&p| shape(g, p)?.get(d).copied())
        .collect()
}

/// Rebuilds `root`'s call with children replaced.
fn with_kids(sym: Symbol, kids: &[Id], replace: &[(usize, Id)]) -> Term {
    let mut k = kids.to_vec();
    for &(i, id) in replace {
        k[i] = id;
    }
    Term::Op(sym, k)
}

// ---------------------------------------------------------------------------------------------
// Operator tables.

/// Elementwise operators: (name, positions of tensor operands, positions it is linear in,
/// whether those linear positions are jointly additive like `add`).
pub const ELEMENTWISE: &[(&str, &[usize], &[usize], bool)] = &[
    ("aten.add.Tensor", &[0, 1], &[0, 1], true),
    ("aten.sub.Tensor", &[0, 1], &[0, 1], true),
    ("aten.mul.Tensor", &[0, 1], &[0, 1], false),
    ("aten.div.Tensor", &[0, 1], &[0], false),
    ("aten.where.self", &[0, 1, 2], &[1, 2], true),
    // lerp(a, b, w) = (1 - w) a + w b: jointly linear in a and b (Adam's first moment).
    ("aten.lerp.Scalar", &[0, 1], &[0, 1], true),
    ("aten.addcmul.default", &[0, 1, 2], &[], false),
    ("aten.addcdiv.default", &[0, 1, 2], &[], false),
    ("aten.maximum.default", &[0, 1], &[], false),
    ("aten.minimum.default", &[0, 1], &[], false),
    ("aten.threshold_backward.default", &[0, 1], &[0], false),
    ("aten.gelu_backward.default", &[0, 1], &[0], false),
    ("aten.silu_backward.default", &[0, 1], &[0], false),
    ("aten.sigmoid_backward.default", &[0, 1], &[0], false),
    ("aten.tanh_backward.default", &[0, 1], &[0], false),
    ("aten.native_dropout_backward.default", &[0, 1], &[0], false),
    ("aten.masked_fill.Scalar", &[0, 1], &[], false),
    ("aten.eq.Tensor", &[0, 1], &[], false),
    ("aten.ne.Tensor", &[0, 1], &[], false),
    ("aten.lt.Tensor", &[0, 1], &[], false),
    ("aten.le.Tensor", &[0, 1], &[], false),
    ("aten.gt.Tensor", &[0, 1], &[], false),
    ("aten.ge.Tensor", &[0, 1], &[], false),
    ("aten.bitwise_or.Tensor", &[0, 1], &[], false),
    ("aten.bitwise_and.Tensor", &[0, 1], &[], false),
    ("aten.logical_and.default", &[0, 1], &[], false),
    ("aten.logical_or.default", &[0, 1], &[], false),
    ("aten.add.Scalar", &[0], &[], false),
    ("aten.sub.Scalar", &[0], &[], false),
    ("aten.rsub.Scalar", &[0], &[], false),
    ("aten.mul.Scalar", &[0], &[0], false),
    ("aten.div.Scalar", &[0], &[0], false),
    ("aten.pow.Tensor_Scalar", &[0], &[], false),
    ("aten.eq.Scalar", &[0], &[], false),
    ("aten.ne.Scalar", &[0], &[], false),
    ("aten.lt.Scalar", &[0], &[], false),
    ("aten.le.Scalar", &[0], &[], false),
    ("aten.gt.Scalar", &[0], &[], false),
    ("aten.ge.Scalar", &[0], &[], false),
    ("aten._to_copy.default", &[0], &[0], false),
    ("aten.neg.default", &[0], &[0], false),
    ("aten.abs.default", &[0], &[], false),
    ("aten.exp.default", &[0], &[], false),
    ("aten.log.default", &[0], &[], false),
    ("aten.sqrt.default", &[0], &[], false),
    ("aten.rsqrt.default", &[0], &[], false),
    ("aten.tanh.default", &[0], &[], false),
    ("aten.sigmoid.default", &[0], &[], false),
    ("aten.relu.default", &[0], &[], false),
    ("aten.gelu.default", &[0], &[], false),
    ("aten.silu.default", &[0], &[], false),
    ("aten.sin.default", &[0], &[], false),
    ("aten.cos.default", &[0], &[], false),
    ("aten.erf.default", &[0], &[], false),
    ("aten.reciprocal.default", &[0], &[], false),
    ("aten.logical_not.default", &[0], &[], false),
    ("aten.bitwise_not.default", &[0], &[], false),
    ("aten.clamp.default", &[0], &[], false),
    ("aten.sign.default", &[0], &[], false),
    ("aten.sgn.default", &[0], &[], false),
    ("aten.floor.default", &[0], &[], false),
    ("aten.ceil.default", &[0], &[], false),
    ("aten.round.default", &[0], &[], false),
    ("aten.trunc.default", &[0], &[], false),
    ("aten.fix.default", &[0], &[], false),
    ("aten.frac.default", &[0], &[], false),
    ("aten.exp2.default", &[0], &[], false),
    ("aten.expm1.default", &[0], &[], false),
    ("aten.log2.default", &[0], &[], false),
    ("aten.log10.default", &[0], &[], false),
    ("aten.log1p.default", &[0], &[], false),
    ("aten.tan.default", &[0], &[], false),
    ("aten.asin.default", &[0], &[], false),
    ("aten.acos.default", &[0], &[], false),
    ("aten.atan.default", &[0], &[], false),
    ("aten.sinh.default", &[0], &[], false),
    ("aten.cosh.default", &[0], &[], false),
    ("aten.asinh.default", &[0], &[], false),
    ("aten.acosh.default", &[0], &[], false),
    ("aten.atanh.default", &[0], &[], false),
    ("aten.erfc.default", &[0], &[], false),
    ("aten.erfinv.default", &[0], &[], false),
    ("aten.clamp_min.default", &[0], &[], false),
    ("aten.clamp_max.default", &[0], &[], false),
    (SCALE, &[2], &[2], false),
];

/// Non-elementwise operators linear in some tensor operands (each on its own): sums over
/// ranks and scale factors move through them.
pub const LINEAR: &[(&str, &[usize])] = &[
    ("aten.mm.default", &[0, 1]),
    ("aten.bmm.default", &[0, 1]),
    ("aten.view.default", &[0]),
    ("aten.transpose.int", &[0]),
    ("aten.permute.default", &[0]),
    ("aten.expand.default", &[0]),
    ("aten.sum.dim_IntList", &[0]),
    ("aten.sum.default", &[0]),
    ("aten.mean.dim", &[0]),
    ("aten.mean.default", &[0]),
    ("aten.select.int", &[0]),
    ("aten.embedding_dense_backward.default", &[0]),
    ("aten.nll_loss_backward.default", &[0]),
    ("aten._log_softmax_backward_data.default", &[0]),
    ("aten._softmax_backward_data.default", &[0]),
    ("aten.matmul.default", &[0, 1]),
    ("aten.gather.default", &[0]),
    (SLICE, &[3]),
    (crate::term::VOCAB_GRAD, &[0]),
];

fn elementwise_roots() -> Vec<String> {
    ELEMENTWISE.iter().map(|e| e.0.to_string()).collect()
}

fn ew(root: &str) -> Option<&'static (&'static str, &'static [usize], &'static [usize], bool)> {
    ELEMENTWISE.iter().find(|e| e.0 == root)
}

/// Which operator a matched class node is: the lemma framework hands the children only, so
/// the applier re-finds the node with these children. The children are compared first: the
/// symbol's name is looked up only for the node they single out.
fn node_sym(g: &Graph, eclass: Id, kids: &[Id], roots: &[impl AsRef<str>]) -> Option<Symbol> {
    g[eclass].nodes.iter().find_map(|n| match n {
        Term::Op(s, k)
            if k.len() == kids.len()
                && k.iter().zip(kids).all(|(a, b)| g.find(*a) == g.find(*b))
                && {
                    let name = s.as_str();
                    roots.iter().any(|r| r.as_ref() == name)
                } =>
        {
            Some(*s)
        }
        _ => None,
    })
}

// ---------------------------------------------------------------------------------------------
// The lemmas.

/// The lemmas a case may use: every lemma whose required assumption (if any) it states.
pub fn library_for(assumed: &[&str]) -> Vec<Lemma> {
    library()
        .into_iter()
        .filter(|l| l.requires.is_none_or(|a| assumed.contains(&a)))
        .collect()
}

/// The `requires` of lemmas used only on the engine's second, wider attempt at a spec
/// operator that found no clean relation: on every attempt they would change which of several
/// equal relations is kept, and later operators depend on that choice.
pub const WIDENED: &str = "widened";

/// The `requires` of lemmas used only where an operator is inferred piece by piece: on every
/// operator they would only grow the e-graphs (a fifth more time on llama's cp=2 full
/// iteration).
pub const PIECEWISE: &str = "piecewise";

/// Every lemma of the library.
pub fn library() -> Vec<Lemma> {
    let mut l = Vec::new();
    let all_ew: Vec<&str> = ELEMENTWISE.iter().map(|e| e.0).collect();

    // Elementwise operators act piece by piece on concatenations.
    let roots = all_ew.clone();
    l.push(Lemma {
        name: "elementwise-over-cat",
        doc: "f(cat_d(x_i), y) = cat_d(f(x_i, y_i)): y is split like x (or broadcast along d); where the x_i are rank sums, y's finer pieces regroup into x's (per-expert copies against per-rank groups of experts)",
        roots: elementwise_roots(),
        examples: vec![
            (
                "(aten.add.Tensor (cat 0 %r0:a %r1:a) (cat 0 %r0:b %r1:b) 1)",
                &[("a", "f64[2,3]"), ("b", "f64[2,3]")],
            ),
            (
                "(aten.mul.Tensor (cat 1 %r0:a %r1:c) %r0:b)",
                &[("a", "f64[2,3]"), ("c", "f64[2,1]"), ("b", "f64[2,4]")],
            ),
            (
                "(aten.add.Tensor (cat 1 %r0:a %r1:a) %r0:b 1)",
                &[("a", "f64[2,3]"), ("b", "f64[6]")],
            ),
            (
                "(aten.gelu.default (cat 0 %r0:a %r1:a) s:none)",
                &[("a", "f64[2,3]")],
            ),
            // Per-expert copies of a gradient against two ranks' groups of experts, each a sum
            // of tensor-parallel partials: the copies regroup in pairs.
            (
                "(aten.mul.Tensor (cat 0 %r0:a %r0:a %r0:a %r0:a) (cat 0 (sum %r0:b %r2:b) (sum %r1:b %r3:b)))",
                &[("a", "f64[1,3]"), ("b", "f64[2,3]")],
            ),
        ],
        requires: None,
        build: Arc::new(move |g, eclass, kids| {
            let Some(sym) = node_sym(g, eclass, kids, &roots) else {
                return vec![];
            };
            let Some(&(_, tensors, _, _)) = ew(sym.as_str()) else {
                return vec![];
            };
            let Some(out) = g[eclass].data.meta().map(|m| m.shape.clone()) else {
                return vec![];
            };
            let mut results = Vec::new();
            for &t in tensors {
                for (d, pieces) in cats(g, kids[t]) {
                    let Some(ts) = shape(g, kids[t]) else {
                        continue;
                    };
                    let od = d + out.len() - ts.len();
                    if ts[d] != out[od] {
                        continue;
                    }
                    let Some(szs) = sizes(g, &pieces, d) else {
                        continue;
                    };
                    if let Some(id) =
                        split_elementwise(g, sym, kids, tensors, &out, od, &szs, t, &pieces)
                    {
                        results.push(id);
                    }
                }
            }
            results
        }),
    });

    // Linear operators move through sums over ranks and through scale factors.
    let lin_roots: Vec<String> = ELEMENTWISE
        .iter()
        .filter(|e| !e.2.is_empty())
        .map(|e| e.0.to_string())
        .chain(LINEAR.iter().map(|e| e.0.to_string()))
        .collect();
    let lr: Vec<&'static str> = ELEMENTWISE
        .iter()
        .filter(|e| !e.2.is_empty())
        .map(|e| e.0)
        .chain(LINEAR.iter().map(|e| e.0))
        .collect();
    let lr2 = lr.clone();
    l.push(Lemma {
        name: "linear-over-sum",
        doc: "f(sum_i x_i) = sum_i f(x_i) for f linear in x (additive ops: both operands sums); a factor is not spread over n copies of one term, which sum-of-replicas names n x",
        roots: lin_roots.clone(),
        examples: vec![
            (
                "(aten.mm.default (sum %r0:a %r1:a) %r0:b)",
                &[("a", "f64[2,3]"), ("b", "f64[3,4]")],
            ),
            (
                "(aten.add.Tensor (sum %r0:a %r1:a) (sum %r0:b %r1:b) 1)",
                &[("a", "f64[2,3]"), ("b", "f64[2,3]")],
            ),
            (
                "(aten.view.default (sum %r0:a %r1:a) (list 6))",
                &[("a", "f64[2,3]")],
            ),
            (
                "(aten.sum.dim_IntList (sum %r0:a %r1:a) (list 0) b:false none)",
                &[("a", "f64[2,3]")],
            ),
        ],
        requires: None,
        build: Arc::new(move |g, eclass, kids| {
            let Some(sym) = node_sym(g, eclass, kids, &lr) else {
                return vec![];
            };
            let (positions, additive) = linear_positions(sym.as_str());
            let mut out = Vec::new();
            if additive {
                let Some(first) = sums(g, kids[positions[0]]).into_iter().next() else {
                    return vec![];
                };
                let n = first.len();
                let mut operands = vec![first];
                for &p in &positions[1..] {
                    match sums(g, kids[p]).into_iter().find(|s| s.len() == n) {
                        Some(s) => operands.push(s),
                        None => return vec![],
                    }
                }
                let terms: Vec<Id> = (0..n)
                    .map(|i| {
                        let rep: Vec<(usize, Id)> = positions
                            .iter()
                            .zip(&operands)
                            .map(|(&p, s)| (p, s[i]))
                            .collect();
                        g.add(with_kids(sym, kids, &rep))
                    })
                    .collect();
                out.push(op(g, SUM, terms));
                return out;
            }
            for &p in &positions {
                for s in sums(g, kids[p]) {
                    // A factor is not spread over n copies of one term: that sum is already
                    // n x (sum-of-replicas), and c x in turn a sum of copies of c x / n, so
                    // each spread names a new multiple, c/2, c/4, .. without end.
                    if is_op!(sym, SCALE) && s.iter().all(|&x| g.find(x) == g.find(s[0])) {
                        continue;
                    }
                    let terms: Vec<Id> = s
                        .iter()
                        .map(|&x| g.add(with_kids(sym, kids, &[(p, x)])))
                        .collect();
                    out.push(op(g, SUM, terms));
                }
            }
            out
        }),
    });
    l.push(Lemma {
        name: "scatter-into-zeros-over-sum",
        doc: "scatter(zeros, d, i, sum_k x_k) = sum_k scatter(zeros, d, i, x_k): scattering into a zero fill is linear in the source (MoE gate matrices)",
        roots: vec!["aten.scatter.src".into()],
        examples: vec![(
            "(aten.scatter.src (aten.full.default (list 2 4) f:0.0 dt:f64 none dev b:false) 1 %r0:i (sum %r0:a %r1:a))",
            &[("i", "i64[2,2]<4"), ("a", "f64[2,2]")],
        )],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let zero_fill = g[kids[0]].nodes.iter().any(|n| {
                matches!(n, Term::Op(s, k) if is_op!(s, "aten.full.default") && k.len() > 1 && is_zero(g, k[1]))
            });
            if !zero_fill {
                return vec![];
            }
            let sym = Symbol::from("aten.scatter.src");
            sums(g, kids[3])
                .into_iter()
                .map(|s| {
                    let terms: Vec<Id> = s
                        .iter()
                        .map(|&x| g.add(with_kids(sym, kids, &[(3, x)])))
                        .collect();
                    op(g, SUM, terms)
                })
                .collect()
        }),
    });
    l.push(Lemma {
        name: "linear-over-scale",
        doc: "f(c * x) = c * f(x) for f linear in x (additive ops: both operands scaled by c)",
        roots: lin_roots,
        examples: vec![
            (
                "(aten.mm.default (scale 1 2 %r0:a) %r0:b)",
                &[("a", "f64[2,3]"), ("b", "f64[3,4]")],
            ),
            (
                "(aten.sub.Tensor (scale 3 2 %r0:a) (scale 3 2 %r0:b) 1)",
                &[("a", "f64[2,3]"), ("b", "f64[2,3]")],
            ),
            ("(scale 2 1 (scale 1 4 %r0:a))", &[("a", "f64[2,3]")]),
            // 1/sqrt(8) as the binary fraction it is, then its inverse over two: one half.
            (
                "(scale 4503599627370496 3184525836262886 (scale 1592262918131443 4503599627370496 %r0:a))",
                &[("a", "f64[2,3]")],
            ),
        ],
        requires: None,
        build: Arc::new(move |g, eclass, kids| {
            let Some(sym) = node_sym(g, eclass, kids, &lr2) else {
                return vec![];
            };
            let (positions, additive) = linear_positions(sym.as_str());
            let mut out = Vec::new();
            if is_op!(sym, SCALE) {
                let (Some(p), Some(q)) = (int(g, kids[0]), int(g, kids[1])) else {
                    return vec![];
                };
                // A class that is a multiple of itself (`x = x / 2`: two zero blocks merged)
                // is zeros; nesting its factor would only add x / 4, x / 8, .. one more each
                // iteration (an attention backward's e-graph reached the node limit on them).
                if g.find(kids[2]) == g.find(eclass) {
                    return vec![];
                }
                for (p2, q2, x) in scales(g, kids[2]) {
                    // A factor that overflows is left unbuilt (wrapped, it would be wrong).
                    if let Some((p, q)) = product_reduced((p, q), (p2, q2)) {
                        out.push(scale(g, p, q, x));
                    }
                }
                return out;
            }
            if additive {
                let Some((p, q, x0)) = scales(g, kids[positions[0]]).into_iter().next() else {
                    return vec![];
                };
                let mut rep = vec![(positions[0], x0)];
                for &pos in &positions[1..] {
                    match scales(g, kids[pos])
                        .into_iter()
                        .find(|s| same_ratio((s.0, s.1), (p, q)))
                    {
                        Some((_, _, x)) => rep.push((pos, x)),
                        None => return vec![],
                    }
                }
                let inner = g.add(with_kids(sym, kids, &rep));
                out.push(scale(g, p, q, inner));
                return out;
            }
            for &pos in &positions {
                for (p, q, x) in scales(g, kids[pos]) {
                    let inner = g.add(with_kids(sym, kids, &[(pos, x)]));
                    out.push(scale(g, p, q, inner));
                }
            }
            out
        }),
    });
    l.push(Lemma {
        name: "scale-through-sibling",
        doc: "x * a = (x * b) * (a / b) when x * b is already in the e-graph",
        roots: vec![SCALE.into()],
        examples: vec![(
            "(aten.add.Tensor (scale 1 8 %r0:a) (scale 1 4 %r0:a) 1)",
            &[("a", "f64[2,3]")],
        )],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            let (Some(p), Some(q)) = (int(g, kids[0]), int(g, kids[1])) else {
                return vec![];
            };
            let x = g.find(kids[2]);
            let mut siblings = Vec::new();
            for class in g.classes() {
                if class.id == g.find(eclass) {
                    continue;
                }
                for n in &class.nodes {
                    if let Term::Op(s, k) = n {
                        if is_op!(s, SCALE) && g.find(k[2]) == x {
                            if let (Some(p2), Some(q2)) = (int(g, k[0]), int(g, k[1])) {
                                siblings.push((p2, q2, class.id));
                            }
                        }
                    }
                }
            }
            // A rank tensor first: the sibling is there to name `x * a` by an implementation
            // tensor (a rank's dq chunk is half the spec's sum of blocks, where `x` has a
            // dozen other multiples).
            siblings.sort_by_key(|&(_, _, id)| !g[id].nodes.iter().any(crate::term::is_leaf));
            siblings
                .into_iter()
                .take(4)
                .filter_map(|(p2, q2, id)| {
                    let (a, b) = product_reduced((p, q), (q2, p2))?;
                    Some(scale(g, a, b, id))
                })
                .collect()
        }),
    });
    l.push(Lemma {
        name: "scaled-rank-tensor",
        doc: "t = (p/q) x with t an implementation tensor gives x = (q/p) t (p != 0): the spec's value is a multiple of the rank's tensor, not only the other way round (a rank's gradient of its local loss is a multiple of the spec's until the data-parallel averaging); only on the engine's wider second attempt",
        roots: vec![SCALE.into()],
        examples: vec![(
            "(= %r0:a (scale 2 1 (aten.div.Tensor %r0:a (aten.full.default (list 2 3) f:2.0 dt:f64 none dev b:false))))",
            &[("a", "f64[2,3]")],
        )],
        requires: Some(WIDENED),
        build: Arc::new(|g, eclass, kids| {
            let (Some(p), Some(q)) = (int(g, kids[0]), int(g, kids[1])) else {
                return vec![];
            };
            if p == 0 || !g[eclass].nodes.iter().any(crate::term::is_leaf) {
                return vec![];
            }
            let back = scale(g, q, p, eclass);
            g.union(kids[2], back);
            vec![eclass]
        }),
    });
    l.push(Lemma {
        name: "sum-of-scaled",
        doc: "sum_i (c * x_i) = c * sum_i x_i; n equal terms c * x are (n c) * x",
        roots: vec![SUM.into()],
        examples: vec![
            (
                "(sum (scale 1 2 %r0:a) (scale 1 2 %r1:a))",
                &[("a", "f64[2,3]")],
            ),
            (
                "(sum (scale 1 2 %r0:a) (scale 1 2 %r0:a) (scale 1 2 %r0:a))",
                &[("a", "f64[]")],
            ),
        ],
        requires: None,
        build: Arc::new(|g, eclass, _| {
            let operands = sums(g, eclass);
            let mut out = Vec::new();
            for s in operands {
                let sc: Vec<Vec<(i64, i64, Id)>> = s.iter().map(|&x| scales(g, x)).collect();
                let Some(&(p, q, _)) = sc.first().and_then(|v| v.first()) else {
                    continue;
                };
                let xs: Option<Vec<Id>> = sc
                    .iter()
                    .map(|v| {
                        v.iter()
                            .find(|t| same_ratio((t.0, t.1), (p, q)))
                            .map(|t| t.2)
                    })
                    .collect();
                if let Some(xs) = xs {
                    // Replicas (n equal terms) are n * c * x: no sum of copies is built, which
                    // would start a chain 2x, 4x, 8x, .. through sum-of-replicas.
                    let first = g.find(xs[0]);
                    if xs.iter().all(|&x| g.find(x) == first) {
                        if let Some(n) = p.checked_mul(xs.len() as i64) {
                            out.push(scale(g, n, q, first));
                        }
                        continue;
                    }
                    let inner = op(g, SUM, xs);
                    out.push(scale(g, p, q, inner));
                }
            }
            out
        }),
    });

    // Matrix products of partitioned operands.
    l.push(Lemma {
        name: "mm-over-cat",
        doc: "cat_0(a_i) @ b = cat_0(a_i @ b); a @ cat_1(b_i) = cat_1(a @ b_i); cat_1(a_i) @ cat_0(b_i) = sum_i a_i @ b_i",
        roots: vec!["aten.mm.default".into()],
        examples: vec![
            ("(aten.mm.default (cat 0 %r0:a %r1:a) %r0:b)", &[("a", "f64[2,3]"), ("b", "f64[3,4]")]),
            ("(aten.mm.default %r0:a (cat 1 %r0:b %r1:b))", &[("a", "f64[2,3]"), ("b", "f64[3,4]")]),
            ("(aten.mm.default (cat 1 %r0:a %r1:a) (cat 0 %r0:b %r1:b))", &[("a", "f64[2,3]"), ("b", "f64[3,4]")]),
        ],
        requires: None,
        build: Arc::new(|g, _, kids| matmul_over_cat(g, "aten.mm.default", kids, 0)),
    });
    l.push(Lemma {
        name: "bmm-over-cat",
        doc: "batched products: batch-dim pieces pair up; row pieces of a, column pieces of b, and contracted pieces sum",
        roots: vec!["aten.bmm.default".into()],
        examples: vec![
            ("(aten.bmm.default (cat 0 %r0:a %r1:a) (cat 0 %r0:b %r1:b))", &[("a", "f64[2,2,3]"), ("b", "f64[2,3,4]")]),
            ("(aten.bmm.default (cat 2 %r0:a %r1:a) (cat 1 %r0:b %r1:b))", &[("a", "f64[2,2,3]"), ("b", "f64[2,3,4]")]),
            ("(aten.bmm.default (cat 0 %r0:a %r1:a %r2:a %r3:a) (cat 0 %r0:b %r1:b))", &[("a", "f64[1,2,3]"), ("b", "f64[2,3,4]")]),
        ],
        requires: None,
        build: Arc::new(|g, _, kids| matmul_over_cat(g, "aten.bmm.default", kids, 1)),
    });

    // Layout operators through concatenations.
    l.push(Lemma {
        name: "transpose-over-cat",
        doc: "transpose(cat_d(x_i), a, b) = cat_{swap(d)}(transpose(x_i, a, b))",
        roots: vec!["aten.transpose.int".into()],
        examples: vec![(
            "(aten.transpose.int (cat 1 %r0:a %r1:a) 0 1)",
            &[("a", "f64[2,3]")],
        )],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let (Some(a), Some(b)) = (int(g, kids[1]), int(g, kids[2])) else {
                return vec![];
            };
            let mut out = Vec::new();
            for (d, pieces) in cats(g, kids[0]) {
                let nd = if d as i64 == a {
                    b
                } else if d as i64 == b {
                    a
                } else {
                    d as i64
                } as usize;
                let ps: Vec<Id> = pieces
                    .iter()
                    .map(|&p| op(g, "aten.transpose.int", vec![p, kids[1], kids[2]]))
                    .collect();
                out.push(cat(g, nd, ps));
            }
            // Transposing back undoes a transpose.
            for (x, xa, xb) in transposes(g, kids[0]) {
                if (int(g, xa), int(g, xb)) == (Some(a), Some(b)) {
                    out.push(x);
                }
            }
            out
        }),
    });
    l.push(Lemma {
        name: "view-over-cat",
        doc: "view(cat_d(x_i), s) = cat_d'(view(x_i, s_i)) when every piece is a whole block of rows of dim d' of s; view(view(x)) = view(x); a view to x's own shape is x",
        roots: vec!["aten.view.default".into()],
        examples: vec![
            ("(aten.view.default (cat 0 %r0:a %r1:a) (list 12 4))", &[("a", "f64[3,2,4]")]),
            ("(aten.view.default (cat 2 %r0:a %r1:a) (list 6 8))", &[("a", "f64[3,2,4]")]),
            ("(aten.view.default (cat 1 %r0:a %r1:a) (list 2 2 6))", &[("a", "f64[2,6]")]),
            ("(aten.view.default (aten.view.default %r0:a (list 6)) (list 3 2))", &[("a", "f64[2,3]")]),
            ("(aten.view.default (cat 0 %r0:a %r1:a %r2:a %r3:a) (list 2 4 3))", &[("a", "f64[2,3]")]),
        ],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            let Some(target) = shape(g, eclass) else { return vec![] };
            let mut out = Vec::new();
            for (d, pieces) in cats(g, kids[0]) {
                let Some(src) = shape(g, kids[0]) else { continue };
                if let Some(id) = view_of_cat(g, &src, &target, d, &pieces) {
                    out.push(id);
                }
            }
            // Collapse chains of views, and views back to a class's own shape.
            for inner in views(g, kids[0]) {
                if shape(g, inner).as_deref() == Some(&target[..]) {
                    out.push(inner);
                } else {
                    out.push(op(g, "aten.view.default", vec![inner, kids[1]]));
                }
            }
            out
        }),
    });
    l.push(Lemma {
        name: "permute-over-cat",
        doc: "permute(cat_d(x_i), p) = cat_{p^-1(d)}(permute(x_i, p))",
        roots: vec!["aten.permute.default".into()],
        examples: vec![(
            "(aten.permute.default (cat 1 %r0:a %r1:a) (list 2 0 1))",
            &[("a", "f64[2,3,4]")],
        )],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let Some(p) = int_list(g, kids[1]) else {
                return vec![];
            };
            let mut out = Vec::new();
            for (d, pieces) in cats(g, kids[0]) {
                let Some(nd) = p.iter().position(|&x| x == d as i64) else {
                    continue;
                };
                let ps: Vec<Id> = pieces
                    .iter()
                    .map(|&x| op(g, "aten.permute.default", vec![x, kids[1]]))
                    .collect();
                out.push(cat(g, nd, ps));
            }
            out
        }),
    });
    l.push(Lemma {
        name: "layout-chain",
        doc: "a chain of views, transposes and permutes that only reorders x's elements is permute(view(x, s), p) (strides computed exactly)",
        roots: vec!["aten.view.default".into()],
        examples: vec![
            ("(aten.view.default (aten.transpose.int (aten.view.default %r0:a (list 3 8 2)) 0 1) (list 2 4 3 2))", &[("a", "f64[3,2,4,2]")]),
            ("(aten.view.default (aten.permute.default %r0:a (list 0 2 1)) (list 3 2 2 2))", &[("a", "f64[3,4,2]")]),
            ("(aten.view.default (aten.transpose.int %r0:a 1 2) (list 1 4 3 1 2))", &[("a", "f64[4,2,3]")]),
        ],
        requires: None,
        build: Arc::new(|g, eclass, _| {
            let Some(target) = shape(g, eclass) else { return vec![] };
            let mut out = Vec::new();
            for (base, steps) in layout_chains(g, eclass) {
                if !steps.iter().any(|s| matches!(s, LayoutStep::Permute(_))) {
                    continue;
                }
                let Some(bs) = shape(g, base) else { continue };
                let Some((split, perm)) = strided_permutation(&bs, &steps, &target) else { continue };
                // A permutation of `base` itself that only a view to unit dims follows is the
                // chain as it was: the unit dims go into the split instead.
                let (split, perm) = if split == bs {
                    units_in_split(&split, &perm, &target).unwrap_or((split, perm))
                } else {
                    (split, perm)
                };
                let mut x = base;
                if split != bs {
                    let l = list(g, &split);
                    x = op(g, "aten.view.default", vec![x, l]);
                }
                if perm.iter().enumerate().any(|(i, &p)| i != p) {
                    let l = list(g, &perm);
                    x = op(g, "aten.permute.default", vec![x, l]);
                }
                let now: Vec<usize> = perm.iter().map(|&p| split[p]).collect();
                if now != target {
                    let l = list(g, &target);
                    x = op(g, "aten.view.default", vec![x, l]);
                }
                out.push(x);
            }
            out
        }),
    });
    l.push(Lemma {
        name: "view-through-unary",
        doc: "view(f(x, c), s) = f(view(x, s), c) for an elementwise f of one tensor",
        roots: vec!["aten.view.default".into()],
        examples: vec![
            (
                "(aten.view.default (aten.mul.Scalar %r0:a f:0.5) (list 6))",
                &[("a", "f64[2,3]")],
            ),
            (
                "(aten.view.default (scale 1 3 %r0:a) (list 3 2))",
                &[("a", "f64[2,3]")],
            ),
        ],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let mut out = Vec::new();
            for n in g[kids[0]].nodes.clone() {
                let Term::Op(s, ck) = n else { continue };
                let at = if is_op!(s, SCALE) {
                    2
                } else if ew(s.as_str()).is_some_and(|e| e.1 == [0]) {
                    0
                } else {
                    continue;
                };
                let v = op(g, "aten.view.default", vec![ck[at], kids[1]]);
                let mut k = ck.clone();
                k[at] = v;
                out.push(g.add(Term::Op(s, k)));
            }
            out
        }),
    });
    l.push(Lemma {
        name: "bmm-unflatten",
        doc: "view(bmm(a, b), [B.., m, n]) with prod(B) the batch = matmul(view(a, [B.., m, k]), view(b, [B.., k, n]))",
        roots: vec!["aten.view.default".into()],
        examples: vec![("(aten.view.default (aten.bmm.default %r0:a %r0:b) (list 2 3 2 4))", &[("a", "f64[6,2,5]"), ("b", "f64[6,5,4]")])],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            let Some(target) = shape(g, eclass) else { return vec![] };
            if target.len() < 4 {
                return vec![];
            }
            let mut out = Vec::new();
            for n in g[kids[0]].nodes.clone() {
                let Term::Op(s, ck) = n else { continue };
                if !is_op!(s, "aten.bmm.default") {
                    continue;
                }
                let (Some(a), Some(b)) = (shape(g, ck[0]), shape(g, ck[1])) else { continue };
                let r = target.len();
                let batch: usize = target[..r - 2].iter().product();
                if batch != a[0] || target[r - 2] != a[1] || target[r - 1] != b[2] {
                    continue;
                }
                let mut sa = target[..r - 2].to_vec();
                sa.extend([a[1], a[2]]);
                let mut sb = target[..r - 2].to_vec();
                sb.extend([b[1], b[2]]);
                let (la, lb) = (list(g, &sa), list(g, &sb));
                let va = op(g, "aten.view.default", vec![ck[0], la]);
                let vb = op(g, "aten.view.default", vec![ck[1], lb]);
                out.push(op(g, "aten.matmul.default", vec![va, vb]));
            }
            out
        }),
    });
    l.push(Lemma {
        name: "matmul-flatten",
        doc: "matmul(view(a, [B.., m, k]), y) with a of shape [prod(B), m, k] and y batched alike = view(bmm(a, view(y, [prod(B), k, n])), [B.., m, n]): the inverse of bmm-unflatten, for a product whose left operand was unflattened from a 3-d one (the piece of an attention product over one head group, whose ranks multiply 3-d blocks)",
        roots: vec!["aten.matmul.default".into()],
        examples: vec![("(aten.matmul.default (aten.view.default %r0:a (list 2 3 2 5)) %r0:b)", &[("a", "f64[6,2,5]"), ("b", "f64[2,3,5,4]")])],
        requires: Some(PIECEWISE),
        build: Arc::new(|g, eclass, kids| {
            let (Some(out), Some(sy)) = (shape(g, eclass), shape(g, kids[1])) else {
                return vec![];
            };
            let r = out.len();
            if r < 4 || sy.len() != r || sy[..r - 2] != out[..r - 2] {
                return vec![];
            }
            let batch: usize = out[..r - 2].iter().product();
            let Some(a) = views(g, kids[0]).into_iter().find(|&a| {
                shape(g, a).is_some_and(|sa| sa.len() == 3 && sa[0] == batch && sa[1] == out[r - 2])
            }) else {
                return vec![];
            };
            let flat_y = list(g, &[batch, sy[r - 2], sy[r - 1]]);
            let vy = op(g, "aten.view.default", vec![kids[1], flat_y]);
            let product = op(g, "aten.bmm.default", vec![a, vy]);
            let target = list(g, &out);
            vec![op(g, "aten.view.default", vec![product, target])]
        }),
    });
    l.push(Lemma {
        name: "matmul-over-cat",
        doc: "batched matmul: batch-dim pieces pair up (or meet a broadcast operand); row pieces of a, column pieces of b, and contracted pieces sum",
        roots: vec!["aten.matmul.default".into()],
        examples: vec![
            ("(aten.matmul.default (cat 1 %r0:a %r1:a) (cat 1 %r0:b %r1:b))", &[("a", "f64[2,2,3,4]"), ("b", "f64[2,2,4,3]")]),
            ("(aten.matmul.default (cat 1 %r0:a %r1:a) %r0:b)", &[("a", "f64[2,2,3,4]"), ("b", "f64[2,1,4,3]")]),
            ("(aten.matmul.default (cat 3 %r0:a %r1:a) (cat 2 %r0:b %r1:b))", &[("a", "f64[2,2,3,4]"), ("b", "f64[2,2,4,3]")]),
        ],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let (Some(a), Some(b)) = (shape(g, kids[0]), shape(g, kids[1])) else { return vec![] };
            if a.len() != b.len() || a.len() < 3 {
                return vec![];
            }
            matmul_over_cat(g, "aten.matmul.default", kids, a.len() - 2)
        }),
    });
    l.push(Lemma {
        name: "cat-interchange",
        doc: "cat_d(cat_e(x_i), cat_e(y_i), ...) = cat_e(cat_d(x_i, y_i, ...)) when every operand is split along e (e != d) into pieces of the same sizes",
        roots: vec![CAT.into()],
        examples: vec![("(cat 1 (cat 0 %r0:a %r1:a) (cat 0 %r0:b %r1:b))", &[("a", "f64[2,3]"), ("b", "f64[2,2]")])],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let Some(d) = int(g, kids[0]) else { return vec![] };
            let d = d as usize;
            let operands = &kids[1..];
            let mut out = Vec::new();
            let Some(first) = operands.first() else { return vec![] };
            for (e, pieces0) in cats(g, *first) {
                if e == d {
                    continue;
                }
                let Some(szs) = sizes(g, &pieces0, e) else { continue };
                let mut columns: Vec<Vec<Id>> = vec![Vec::new(); pieces0.len()];
                let mut ok = true;
                for &o in operands {
                    let found = cats(g, o)
                        .into_iter()
                        .find(|(oe, ps)| *oe == e && sizes(g, ps, e).as_deref() == Some(&szs[..]));
                    match found {
                        Some((_, ps)) => {
                            for (c, p) in columns.iter_mut().zip(ps) {
                                c.push(p);
                            }
                        }
                        None => {
                            ok = false;
                            break;
                        }
                    }
                }
                if ok {
                    let parts: Vec<Id> = columns.into_iter().map(|c| cat(g, d, c)).collect();
                    out.push(cat(g, e, parts));
                }
            }
            out
        }),
    });
    l.push(Lemma {
        name: "sum-of-replicas",
        doc: "sum(x, x, .., x) of n equal terms = n * x (a replicated value all-reduced: each rank's share counted once per rank); a sum in which each distinct term appears k times = k * the sum of the distinct terms (a value summed over a mesh dim it is replicated on)",
        roots: vec![SUM.into()],
        examples: vec![
            ("(sum %r0:a %r0:a %r0:a)", &[("a", "f64[2,3]")]),
            ("(sum %r0:a %r0:a %r1:a %r1:a)", &[("a", "f64[2,3]")]),
            ("(sum %r0:a %r1:a %r2:a %r1:a %r0:a %r2:a)", &[("a", "f64[2,3]")]),
        ],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let first = g.find(kids[0]);
            if kids.iter().all(|&k| g.find(k) == first) {
                return vec![scale(g, kids.len() as i64, 1, first)];
            }
            // Distinct terms in order of first appearance, with their counts.
            let mut distinct: Vec<(Id, usize)> = Vec::new();
            for &k in kids {
                let k = g.find(k);
                match distinct.iter_mut().find(|(d, _)| *d == k) {
                    Some((_, n)) => *n += 1,
                    None => distinct.push((k, 1)),
                }
            }
            let copies = distinct[0].1;
            if copies < 2 || distinct.iter().any(|&(_, n)| n != copies) {
                return vec![];
            }
            let terms: Vec<Id> = distinct.into_iter().map(|(d, _)| d).collect();
            let inner = op(g, SUM, terms);
            vec![scale(g, copies as i64, 1, inner)]
        }),
    });
    l.push(Lemma {
        name: "sum-of-sums",
        doc: "sum(sum(x_1..x_n), sum(y_1..y_m), ...) = sum(x_1..x_n, y_1..y_m, ...): rank sums nested by mesh dim are one sum",
        roots: vec![SUM.into()],
        examples: vec![("(sum (sum %r0:a %r1:a) (sum %r2:a %r3:a))", &[("a", "f64[2,3]")])],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let mut flat = Vec::new();
            for &k in kids {
                let Some(inner) = sums(g, k).into_iter().next() else { return vec![] };
                flat.extend(inner);
            }
            if flat.len() > 16 {
                return vec![];
            }
            vec![op(g, SUM, flat)]
        }),
    });
    l.push(Lemma {
        name: "add-into-sum",
        doc: "a + sum(b_1..b_n) = sum(b_1, .., a + b_k, .., b_n) (a running total one rank adds to before the reduction); sum(a_i) + sum(b_j) = sum of the a_i with each b_j added to the term the graph adds it to; sum(.., a + b, ..) = sum(.., a, b, ..); sum(a, b, c) = (a + b) + c where the graph has those additions",
        roots: vec!["aten.add.Tensor".into(), SUM.into()],
        examples: vec![
            ("(aten.add.Tensor %r0:a (sum %r0:b %r1:b) 1)", &[("a", "f64[2,3]"), ("b", "f64[2,3]")]),
            ("(sum (aten.add.Tensor %r0:a %r0:b 1) %r1:a)", &[("a", "f64[2,3]"), ("b", "f64[2,3]")]),
            // Running totals: the ranks' own additions sit beside the two sums.
            ("(cat 0 (aten.add.Tensor (sum %r0:a %r1:a %r2:a) (sum %r0:b %r2:b) 1) (aten.add.Tensor %r0:a %r0:b 1) (aten.add.Tensor %r2:a %r2:b 1))", &[("a", "f64[2,3]"), ("b", "f64[2,3]")]),
            // The addition the rank computed sits beside the sum.
            ("(cat 0 (sum %r0:a %r0:b %r0:c) (aten.add.Tensor (aten.add.Tensor %r0:a %r0:b 1) %r0:c 1))", &[("a", "f64[2,3]"), ("b", "f64[2,3]"), ("c", "f64[2,3]")]),
        ],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            let Some(out) = shape(g, eclass) else { return vec![] };
            let full = |g: &Graph, id: Id| shape(g, id).as_deref() == Some(&out[..]);
            let mut res = Vec::new();
            if node_sym(g, eclass, kids, &["aten.add.Tensor"]).is_some() {
                if !is_one(g, kids[2]) || !full(g, kids[0]) || !full(g, kids[1]) {
                    return vec![];
                }
                // Two rank sums added: each term of one joins a term of the other where the
                // graph has their addition (a rank adding to its own running total: the
                // squared norms of a global gradient norm), looked up, never built; terms
                // without a partner stay terms.
                for xs in sums(g, kids[0]).into_iter().take(2) {
                    for ys in sums(g, kids[1]).into_iter().take(2) {
                        res.extend(pair_sums(g, &xs, &ys, kids[2]));
                    }
                }
                for (a, b, a_first) in [(kids[0], kids[1], true), (kids[1], kids[0], false)] {
                    if !sums(g, a).is_empty() {
                        continue;
                    }
                    for terms in sums(g, b).into_iter().take(1) {
                        for k in 0..terms.len() {
                            if !full(g, terms[k]) {
                                continue;
                            }
                            let mut t = terms.clone();
                            // The operands keep their order: the rank computes it that way.
                            let pair = if a_first { vec![a, terms[k], kids[2]] } else { vec![terms[k], a, kids[2]] };
                            t[k] = op(g, "aten.add.Tensor", pair);
                            res.push(op(g, SUM, t));
                        }
                    }
                }
                return res;
            }
            // A sum of tensors one rank adds up itself (microbatch losses, accumulated
            // gradients) is those additions, in order, when the graph has them: looked up, never
            // built, so sums do not grow additions nobody computes.
            if kids.len() >= 2 && kids.iter().all(|&k| full(g, k)) {
                if let Some(one) = g.lookup(Term::Num(1)) {
                    let add = Symbol::from("aten.add.Tensor");
                    let mut acc = Some(kids[0]);
                    for &k in &kids[1..] {
                        acc = acc.and_then(|a| {
                            g.lookup(Term::Op(add, vec![a, k, one]))
                                .or_else(|| g.lookup(Term::Op(add, vec![k, a, one])))
                        });
                    }
                    res.extend(acc);
                }
            }
            // Inside a sum, an addition is more terms of the sum.
            if kids.len() >= 16 {
                return res;
            }
            let adds: Vec<Option<(Id, Id)>> = kids
                .iter()
                .map(|&k| {
                    g[k].nodes.iter().find_map(|n| match n {
                        Term::Op(s, c) if is_op!(s, "aten.add.Tensor") && is_one(g, c[2]) => {
                            Some((c[0], c[1])).filter(|&(a, b)| full(g, a) && full(g, b))
                        }
                        _ => None,
                    })
                })
                .collect();
            // The additions at `only` (all of them for `None`) split into their terms.
            let split = |g: &mut Graph, only: Option<usize>| {
                let mut t = Vec::with_capacity(kids.len() + 1);
                for (i, &k) in kids.iter().enumerate() {
                    match adds[i] {
                        Some((a, b)) if only.is_none_or(|j| j == i) => t.extend([a, b]),
                        _ => t.push(k),
                    }
                }
                op(g, SUM, t)
            };
            let positions: Vec<usize> = (0..kids.len()).filter(|&i| adds[i].is_some()).collect();
            if positions.len() <= MAX_SEPARATE_ADDS {
                for &i in &positions {
                    res.push(split(g, Some(i)));
                }
            } else {
                // One addition at a time, a sum of many additions would grow every subset of
                // them split (2^n sums, gpt2's attention backward under cp): all at once.
                res.push(split(g, None));
            }
            res
        }),
    });
    l.push(Lemma {
        name: "cat-of-sums",
        doc: "cat_d(sum_i x_i, sum_i y_i, ...) = sum_i cat_d(x_i, y_i, ...) (rank sums of the same length, paired in order)",
        roots: vec![CAT.into()],
        examples: vec![("(cat 1 (sum %r0:a %r1:a) (sum %r0:b %r1:b))", &[("a", "f64[2,3]"), ("b", "f64[2,2]")])],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let Some(d) = int(g, kids[0]).and_then(|d| usize::try_from(d).ok()) else { return vec![] };
            let Some(first) = sums(g, kids[1]).into_iter().next() else { return vec![] };
            let n = first.len();
            let mut operands = vec![first];
            for &k in &kids[2..] {
                match sums(g, k).into_iter().find(|s| s.len() == n) {
                    Some(s) => operands.push(s),
                    None => return vec![],
                }
            }
            let terms: Vec<Id> = (0..n)
                .map(|i| {
                    let pieces = operands.iter().map(|s| s[i]).collect();
                    cat(g, d, pieces)
                })
                .collect();
            vec![op(g, SUM, terms)]
        }),
    });
    l.push(Lemma {
        name: "cat-flatten",
        doc: "cat_d(.., cat_d(x_i), ..) = cat_d(.., x_i, ..): nested concatenations along one dim are one; backwards only where the inner concatenation is in the e-graph already (finer pieces regroup into the ones the ranks hold)",
        roots: vec![CAT.into()],
        examples: vec![
            ("(cat 1 (cat 1 %r0:a %r1:a) %r0:b)", &[("a", "f64[2,3]"), ("b", "f64[2,2]")]),
            ("(cat 0 (cat 0 %r0:a %r1:a) %r0:a %r1:a %r2:a)", &[("a", "f64[2,3]")]),
        ],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let Some(d) = int(g, kids[0]) else { return vec![] };
            let d = d as usize;
            // Backwards: runs of pieces whose concatenation is present (looked up, not built).
            let regrouped = moe::present_runs(g, d, &kids[1..]);
            let mut flat = Vec::new();
            let mut changed = false;
            for &o in &kids[1..] {
                match cats(g, o).into_iter().find(|(od, _)| *od == d) {
                    Some((_, ps)) => {
                        flat.extend(ps);
                        changed = true;
                    }
                    None => flat.push(o),
                }
            }
            let mut out: Vec<Id> = regrouped.into_iter().collect();
            if changed && flat.len() <= 16 {
                out.push(cat(g, d, flat));
            }
            out
        }),
    });
    l.push(Lemma {
        name: "expand-as-cat",
        doc: "expanding one size-1 dim e to n (no other dim expanded) is the cat along e of n copies (n <= 8), or past 8 the cat of n/m copies of a shorter expand to m of the same source already in the graph (many experts per rank: a routing mask over 16 or 32 experts)",
        roots: vec!["aten.expand.default".into()],
        examples: vec![
            ("(aten.expand.default %r0:a (list 2 3 4) b:false)", &[("a", "f64[2,1,4]")]),
            (
                "(cat 1 (aten.expand.default %r0:a (list 2 16 4) b:false) (aten.expand.default %r0:a (list 2 32 4) b:false))",
                &[("a", "f64[2,1,4]")],
            ),
        ],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            let (Some(target), Some(src)) = (shape(g, eclass), shape(g, kids[0])) else { return vec![] };
            if src.len() != target.len() {
                return vec![];
            }
            let diff: Vec<usize> = (0..src.len()).filter(|&i| src[i] != target[i]).collect();
            let [e] = diff.as_slice() else { return vec![] };
            let e = *e;
            let n = target[e];
            if src[e] != 1 || n < 2 {
                return vec![];
            }
            if n <= 8 {
                return vec![cat(g, e, vec![kids[0]; n])];
            }
            // Past 8 copies a flat cat would explode; a shorter expand of the same source that
            // the graph already holds (looked up, never built) splits it into at most 8 blocks.
            let here = g.find(eclass);
            let shorter: Vec<(Id, usize)> = g[kids[0]]
                .parents()
                .filter(|&p| g.find(p) != here)
                .filter_map(|p| {
                    let s = shape(g, p)?;
                    let m = *s.get(e)?;
                    let expands_source = g[p].nodes.iter().any(|t| {
                        matches!(t, Term::Op(sym, c) if is_op!(sym, "aten.expand.default") && g.find(c[0]) == g.find(kids[0]))
                    });
                    let same_elsewhere = s.len() == target.len() && (0..s.len()).all(|i| i == e || s[i] == target[i]);
                    (expands_source && same_elsewhere && m >= 2 && m < n && n % m == 0 && n / m <= 8).then_some((p, m))
                })
                .collect();
            let mut best: Option<(Id, usize)> = None;
            for (p, m) in shorter {
                if best.is_none_or(|(_, bm)| m > bm) {
                    best = Some((p, m));
                }
            }
            match best {
                Some((p, m)) => vec![cat(g, e, vec![p; n / m])],
                None => vec![],
            }
        }),
    });
    l.push(Lemma {
        name: "scale-and-cat",
        doc: "scale(c, cat_d(x_i)) = cat_d(scale(c, x_i)); cat_d(scale(c_i, x_i)) = scale(c_1, cat_d(scale(c_i / c_1, x_i)))",
        roots: vec![SCALE.into(), CAT.into()],
        examples: vec![
            ("(scale 1 2 (cat 0 %r0:a %r1:a))", &[("a", "f64[2,3]")]),
            ("(cat 1 (scale 1 2 %r0:a) (scale -1 2 %r1:a))", &[("a", "f64[2,3]")]),
        ],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            let mut out = Vec::new();
            if kids.len() == 3 && node_sym(g, eclass, kids, &[SCALE]).is_some() {
                for (d, pieces) in cats(g, kids[2]) {
                    let parts: Vec<Id> = pieces.iter().map(|&p| op(g, SCALE, vec![kids[0], kids[1], p])).collect();
                    out.push(cat(g, d, parts));
                }
                return out;
            }
            let Some(d) = int(g, kids[0]) else { return vec![] };
            let factors: Option<Vec<(i64, i64, Id)>> = kids[1..].iter().map(|&k| scales(g, k).into_iter().next()).collect();
            let Some(factors) = factors else { return vec![] };
            let (p1, q1, _) = factors[0];
            if p1 == 0 {
                return vec![];
            }
            // (p/q) / (p1/q1), reduced; a ratio that does not fit back in i64 leaves the cat
            // alone.
            let ratios: Option<Vec<(i64, i64, Id)>> = factors
                .iter()
                .map(|&(p, q, x)| {
                    let (n, m) = product_reduced((p, q), (q1, p1))?;
                    Some((n, m, x))
                })
                .collect();
            let Some(ratios) = ratios else { return vec![] };
            let parts: Vec<Id> = ratios
                .into_iter()
                .map(|(n, m, x)| {
                    if n == m {
                        x
                    } else {
                        let (a, b) = (num(g, n), num(g, m));
                        op(g, SCALE, vec![a, b, x])
                    }
                })
                .collect();
            let inner = cat(g, d as usize, parts);
            let (a, b) = (num(g, p1), num(g, q1));
            vec![op(g, SCALE, vec![a, b, inner])]
        }),
    });
    l.push(Lemma {
        name: "expand-over-cat",
        doc: "expand(cat_d(x_i), s) = cat_d(expand(x_i, s_i)) when dim d is not broadcast (s_i is s with the piece's size at d)",
        roots: vec!["aten.expand.default".into()],
        examples: vec![("(aten.expand.default (cat 0 %r0:a %r1:a) (list 2 3 4) b:false)", &[("a", "f64[1,1,4]")])],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            let Some(target) = shape(g, eclass) else { return vec![] };
            let Some(src) = shape(g, kids[0]) else { return vec![] };
            if src.len() > target.len() {
                return vec![];
            }
            let lead = target.len() - src.len();
            let mut out = Vec::new();
            for (d, pieces) in cats(g, kids[0]) {
                if src[d] != target[lead + d] {
                    continue; // broadcast along the split dim
                }
                let Some(szs) = sizes(g, &pieces, d) else { continue };
                let parts: Vec<Id> = pieces
                    .iter()
                    .zip(&szs)
                    .map(|(&p, &n)| {
                        let mut t = target.clone();
                        t[lead + d] = n;
                        let l = list(g, &t);
                        op(g, "aten.expand.default", vec![p, l, kids[2]])
                    })
                    .collect();
                out.push(cat(g, lead + d, parts));
            }
            out
        }),
    });
    l.push(Lemma {
        name: "slice-of-cat",
        doc: "a slice of cat_d(x_i) along d is the pieces it covers (sliced at the ends); along another dim it is the cat of the sliced pieces; slice(slice(x)) is one slice",
        roots: vec![SLICE.into()],
        examples: vec![
            ("(slice 0 2 4 (cat 0 %r0:a %r1:a))", &[("a", "f64[2,3]")]),
            ("(slice 0 1 3 (cat 0 %r0:a %r1:a))", &[("a", "f64[2,3]")]),
            ("(slice 1 1 3 (cat 0 %r0:a %r1:a))", &[("a", "f64[2,3]")]),
            ("(slice 0 1 3 (slice 0 1 4 %r0:a))", &[("a", "f64[5,3]")]),
        ],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let (Some(d), Some(a), Some(b)) = (int(g, kids[0]), int(g, kids[1]), int(g, kids[2])) else { return vec![] };
            let (d, a, b) = (d as usize, a as usize, b as usize);
            let mut out = Vec::new();
            for (cd, pieces) in cats(g, kids[3]) {
                let Some(szs) = sizes(g, &pieces, cd) else { continue };
                if cd == d {
                    let mut parts = Vec::new();
                    let mut off = 0;
                    for (&p, &n) in pieces.iter().zip(&szs) {
                        let (lo, hi) = (a.max(off), b.min(off + n));
                        if lo < hi {
                            parts.push(slice(g, d, lo - off, hi - off, p));
                        }
                        off += n;
                    }
                    if !parts.is_empty() {
                        out.push(cat(g, d, parts));
                    }
                } else {
                    let parts = pieces.iter().map(|&p| slice(g, d, a, b, p)).collect();
                    out.push(cat(g, cd, parts));
                }
            }
            for n in g[kids[3]].nodes.clone() {
                if let Term::Op(s, k) = n {
                    if is_op!(s, SLICE) && int(g, k[0]) == Some(d as i64) {
                        if let Some(a2) = int(g, k[1]) {
                            out.push(slice(g, d, a + a2 as usize, b + a2 as usize, k[3]));
                        }
                    }
                }
            }
            out
        }),
    });
    l.push(Lemma {
        name: "cat-of-adjacent-slices",
        doc: "x = cat_d(x[a_0:a_1], x[a_1:a_2], ...) when slices of x that tile dim d are already in the e-graph",
        roots: vec![SLICE.into()],
        examples: vec![("(cat 0 (slice 0 0 2 %r0:a) (slice 0 2 5 %r0:a))", &[("a", "f64[5,3]")])],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            let (Some(d), Some(x)) = (int(g, kids[0]), Some(kids[3])) else { return vec![] };
            let Some(n) = shape(g, x).and_then(|s| s.get(d as usize).copied()) else { return vec![] };
            // Every slice of x along d present in the e-graph, by start.
            let mut by_start: Vec<(i64, i64, Id)> = Vec::new();
            for class in g.classes() {
                for node in &class.nodes {
                    if let Term::Op(s, k) = node {
                        if is_op!(s, SLICE) && g.find(k[3]) == g.find(x) && int(g, k[0]) == Some(d) {
                            if let (Some(a), Some(b)) = (int(g, k[1]), int(g, k[2])) {
                                by_start.push((a, b, class.id));
                            }
                        }
                    }
                }
            }
            by_start.sort();
            by_start.dedup_by_key(|t| t.0);
            let mut parts = Vec::new();
            let mut at = 0;
            for &(a, b, id) in &by_start {
                if a == at {
                    parts.push(id);
                    at = b;
                }
            }
            if at as usize != n || parts.len() < 2 {
                return vec![];
            }
            let whole = cat(g, d as usize, parts);
            if g.union(whole, x) {
                vec![eclass]
            } else {
                vec![]
            }
        }),
    });

    l.push(Lemma {
        name: "cat-pieces-equal",
        doc: "cat_d(a_i) = cat_d(b_i) with equal piece sizes implies a_i = b_i",
        roots: vec![CAT.into()],
        examples: vec![(
            "(= (cat 0 %r0:a %r0:b) (cat 0 (slice 0 0 2 (cat 0 %r0:a %r0:b)) (slice 0 2 5 (cat 0 %r0:a %r0:b))))",
            &[("a", "f64[2,3]"), ("b", "f64[3,3]")],
        )],
        requires: None,
        build: Arc::new(|g, eclass, _| {
            let cs = cats(g, eclass);
            let mut changed = false;
            for (i, (d, ps)) in cs.iter().enumerate() {
                for (d2, qs) in &cs[i + 1..] {
                    if d == d2 && ps.len() == qs.len() && sizes(g, ps, *d) == sizes(g, qs, *d) {
                        for (&p, &q) in ps.iter().zip(qs) {
                            changed |= g.union(p, q);
                        }
                    }
                }
            }
            if changed {
                vec![eclass]
            } else {
                vec![]
            }
        }),
    });

    // Reductions.
    l.push(Lemma {
        name: "reduce-over-cat",
        doc: "sum over dims of cat_d(x_i): a sum over ranks of the pieces' sums when d is reduced, else the cat of the pieces' sums (dim renumbered); max (min) along d is the max (min) over ranks",
        roots: vec![
            "aten.sum.dim_IntList".into(),
            "aten.sum.default".into(),
            "aten.amax.default".into(),
            "aten.amin.default".into(),
            "aten.max.default".into(),
            "aten.min.default".into(),
            "aten.mean.default".into(),
            "aten.mean.dim".into(),
        ],
        examples: vec![
            ("(aten.sum.dim_IntList (cat 0 %r0:a %r1:a) (list 0) b:false none)", &[("a", "f64[2,3]")]),
            ("(aten.sum.dim_IntList (cat 1 %r0:a %r1:a) (list 0) b:false none)", &[("a", "f64[2,3]")]),
            ("(aten.sum.default (cat 1 %r0:a %r1:a) none)", &[("a", "f64[2,3]")]),
            ("(aten.amax.default (cat 1 %r0:a %r1:a) (list 1) b:true)", &[("a", "f64[2,3]")]),
            ("(aten.amin.default (cat 0 %r0:a %r1:a) (list 0) b:false)", &[("a", "f64[2,3]")]),
            ("(aten.max.default (cat 1 %r0:a %r1:a))", &[("a", "f64[2,3]")]),
            ("(aten.min.default (cat 0 %r0:a %r1:a))", &[("a", "f64[2,3]")]),
            ("(aten.mean.default (cat 0 %r0:a %r1:a) none)", &[("a", "f64[2,3]")]),
            ("(aten.mean.dim (cat 1 %r0:a %r1:a) (list 1) b:false none)", &[("a", "f64[2,3]")]),
        ],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            let roots = [
                "aten.sum.dim_IntList",
                "aten.sum.default",
                "aten.amax.default",
                "aten.amin.default",
                "aten.max.default",
                "aten.min.default",
                "aten.mean.default",
                "aten.mean.dim",
            ];
            let Some(sym) = node_sym(g, eclass, kids, &roots) else {
                return vec![];
            };
            let whole = matches!(
                sym.as_str(),
                "aten.sum.default" | "aten.mean.default" | "aten.max.default" | "aten.min.default"
            );
            let mean = sym.as_str().starts_with("aten.mean");
            let Some(src) = shape(g, kids[0]) else { return vec![] };
            let all: Vec<i64> = (0..src.len() as i64).collect();
            let dims = if whole { all.clone() } else { int_list(g, kids[1]).unwrap_or_default() };
            let dims = if dims.is_empty() { all } else { dims };
            let keep = !whole && is_true(g, kids[2]);
            let combine = match sym.as_str() {
                "aten.amax.default" | "aten.max.default" => MAX,
                "aten.amin.default" | "aten.min.default" => MIN,
                _ => SUM,
            };
            let mut out = Vec::new();
            for (d, pieces) in cats(g, kids[0]) {
                let parts: Vec<Id> = pieces.iter().map(|&p| g.add(with_kids(sym, kids, &[(0, p)]))).collect();
                if dims.contains(&(d as i64)) {
                    if mean {
                        // A mean of equal pieces is the average of the pieces' means.
                        let Some(szs) = sizes(g, &pieces, d) else { continue };
                        if szs.iter().any(|&s| s != szs[0]) {
                            continue;
                        }
                        let n = parts.len() as i64;
                        let total = op(g, combine, parts);
                        out.push(scale(g, 1, n, total));
                        continue;
                    }
                    out.push(op(g, combine, parts));
                } else {
                    let nd = if keep { d } else { d - dims.iter().filter(|&&x| x < d as i64).count() };
                    out.push(cat(g, nd, parts));
                }
            }
            out
        }),
    });
    l.push(Lemma {
        name: "reduce-over-unit-dims",
        doc: "a sum or mean over dims of size one only drops them: view(x, out shape)",
        roots: vec!["aten.sum.dim_IntList".into(), "aten.mean.dim".into()],
        examples: vec![
            (
                "(aten.sum.dim_IntList %r0:a (list 1) b:false none)",
                &[("a", "f64[2,1,3]")],
            ),
            (
                "(aten.mean.dim %r0:a (list 2) b:true none)",
                &[("a", "f64[2,3,1]")],
            ),
        ],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            let (Some(src), Some(out)) = (shape(g, kids[0]), shape(g, eclass)) else {
                return vec![];
            };
            let Some(dims) = int_list(g, kids[1]) else {
                return vec![];
            };
            let rank = src.len() as i64;
            let unit = !dims.is_empty()
                && dims.iter().all(|&d| {
                    let d = if d < 0 { d + rank } else { d };
                    usize::try_from(d).ok().and_then(|d| src.get(d)) == Some(&1)
                });
            if !unit || src.iter().product::<usize>() != out.iter().product::<usize>() {
                return vec![];
            }
            let l = list(g, &out);
            vec![op(g, "aten.view.default", vec![kids[0], l])]
        }),
    });
    l.push(Lemma {
        name: "max-dim-over-cat",
        doc: "max.dim(cat_d(x_i), d).values = max over ranks of max.dim(x_i, d).values; along another dim, the cat of the pieces' results",
        roots: vec![GET.into()],
        examples: vec![
            ("(get 0 (aten.max.dim (cat 1 %r0:a %r1:a) 1 b:false))", &[("a", "f64[2,3]")]),
            ("(get 1 (aten.max.dim (cat 0 %r0:a %r1:a) 1 b:false))", &[("a", "f64[2,3]")]),
        ],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let Some(k) = int(g, kids[0]) else { return vec![] };
            let mut out = Vec::new();
            for n in g[kids[1]].nodes.clone() {
                let Term::Op(s, ck) = n else { continue };
                if !is_op!(s, "aten.max.dim") && !is_op!(s, "aten.min.dim") {
                    continue;
                }
                let (Some(dim), keep) = (int(g, ck[1]), is_true(g, ck[2])) else { continue };
                for (d, pieces) in cats(g, ck[0]) {
                    let parts = output_per_piece(g, s, &ck, kids[0], &pieces);
                    if d as i64 == dim {
                        if k == 0 {
                            out.push(op(g, if is_op!(s, "aten.max.dim") { MAX } else { MIN }, parts));
                        }
                    } else {
                        let nd = if keep || (d as i64) < dim { d } else { d - 1 };
                        out.push(cat(g, nd, parts));
                    }
                }
            }
            out
        }),
    });

    l.push(Lemma {
        name: "topk-over-cat",
        doc: "topk / sort along dim k of cat_d(x_i), d != k: values and indices are the cat of the pieces' (a router's top-k over the experts of each token)",
        roots: vec![GET.into()],
        examples: vec![
            ("(get 0 (aten.topk.default (cat 0 %r0:a %r1:a) 2 1 b:true b:true))", &[("a", "f64[2,4]")]),
            ("(get 1 (aten.topk.default (cat 0 %r0:a %r1:a) 2 -1 b:true b:true))", &[("a", "f64[2,4]")]),
        ],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let mut out = Vec::new();
            for n in g[kids[1]].nodes.clone() {
                let Term::Op(s, ck) = n else { continue };
                let dim_at = match s.as_str() {
                    "aten.topk.default" => 2,
                    "aten.sort.default" | "aten.sort.stable" => 1,
                    _ => continue,
                };
                let Some(rank) = shape(g, ck[0]).map(|x| x.len() as i64) else { continue };
                let Some(k) = ck.get(dim_at).and_then(|&d| int(g, d)) else { continue };
                let k = if k < 0 { k + rank } else { k };
                for (d, pieces) in cats(g, ck[0]) {
                    if d as i64 == k {
                        continue;
                    }
                    let parts = output_per_piece(g, s, &ck, kids[0], &pieces);
                    out.push(cat(g, d, parts));
                }
            }
            out
        }),
    });

    l.push(Lemma {
        name: "scatter-over-cat",
        doc: "scatter along dim k into cat_d(s_i) with indices (and source) split alike along d != k is the cat of the pieces' scatters; a constant fill splits into smaller fills",
        roots: vec!["aten.scatter.src".into(), "aten.scatter.value".into()],
        examples: vec![
            ("(aten.scatter.src (aten.full.default (list 4 3) f:0.0 dt:f64 none dev b:false) 1 (cat 0 %r0:i %r1:i) (cat 0 %r0:x %r1:x))", &[("i", "i64[2,2]<3"), ("x", "f64[2,2]")]),
            ("(aten.scatter.value (cat 0 %r0:s %r1:s) 1 (cat 0 %r0:i %r1:i) f:1.0)", &[("s", "f64[2,3]"), ("i", "i64[2,2]<3")]),
        ],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            let roots = ["aten.scatter.src", "aten.scatter.value"];
            let Some(sym) = node_sym(g, eclass, kids, &roots) else { return vec![] };
            let Some(rank) = shape(g, kids[0]).map(|x| x.len() as i64) else { return vec![] };
            let Some(k) = int(g, kids[1]) else { return vec![] };
            let k = if k < 0 { k + rank } else { k };
            let src_is_tensor = is_op!(sym, "aten.scatter.src");
            let mut out = Vec::new();
            for (d, index) in cats(g, kids[2]) {
                if d as i64 == k {
                    continue;
                }
                let Some(szs) = sizes(g, &index, d) else { continue };
                let Some(selves) = split_alike(g, kids[0], d, &szs) else { continue };
                let srcs = if src_is_tensor {
                    match split_alike(g, kids[3], d, &szs) {
                        Some(p) => p,
                        None => continue,
                    }
                } else {
                    vec![kids[3]; szs.len()]
                };
                let parts = (0..szs.len())
                    .map(|i| g.add(with_kids(sym, kids, &[(0, selves[i]), (2, index[i]), (3, srcs[i])])))
                    .collect();
                out.push(cat(g, d, parts));
            }
            out
        }),
    });

    // Row-wise operators along unpartitioned dims.
    l.push(Lemma {
        name: "rowwise-over-cat",
        doc: "softmax / log-softmax along dim k (and their backward) of cat_d(x_i), d != k, is the cat of the pieces' results",
        roots: vec![
            "aten._softmax.default".into(),
            "aten._log_softmax.default".into(),
            "aten._softmax_backward_data.default".into(),
            "aten._log_softmax_backward_data.default".into(),
        ],
        examples: vec![
            ("(aten._softmax.default (cat 0 %r0:a %r1:a) 1 b:false)", &[("a", "f64[2,3]")]),
            ("(aten._softmax_backward_data.default (cat 0 %r0:a %r1:a) (cat 0 %r0:b %r1:b) 1 dt:f64)", &[("a", "f64[2,3]"), ("b", "f64[2,3]")]),
        ],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            let roots = ["aten._softmax.default", "aten._log_softmax.default", "aten._softmax_backward_data.default", "aten._log_softmax_backward_data.default"];
            let Some(sym) = node_sym(g, eclass, kids, &roots) else { return vec![] };
            let backward = sym.as_str().contains("backward");
            let (tensors, dim_at): (&[usize], usize) = if backward { (&[0, 1], 2) } else { (&[0], 1) };
            let Some(k) = int(g, kids[dim_at]) else { return vec![] };
            let Some(out) = shape(g, eclass) else { return vec![] };
            let mut res = Vec::new();
            for (d, pieces) in cats(g, kids[0]) {
                if d as i64 == k {
                    continue;
                }
                let Some(szs) = sizes(g, &pieces, d) else { continue };
                if let Some(id) = split_elementwise(g, sym, kids, tensors, &out, d, &szs, 0, &pieces) {
                    res.push(id);
                }
            }
            res
        }),
    });
    l.push(Lemma {
        name: "dropout-over-cat",
        doc: "with same-mask dropout, native_dropout(cat_d(x_i)) outputs are the cat of the pieces' outputs",
        roots: vec![GET.into()],
        examples: vec![
            ("(get 0 (aten.native_dropout.default (cat 1 %r0:a %r1:a) f:0.5 b:true))", &[("a", "f64[2,3]")]),
            ("(get 1 (aten.native_dropout.default (cat 0 %r0:a %r1:a) f:0.5 b:true))", &[("a", "f64[2,3]")]),
        ],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let mut out = Vec::new();
            for n in g[kids[1]].nodes.clone() {
                let Term::Op(s, ck) = n else { continue };
                if !is_op!(s, "aten.native_dropout.default") {
                    continue;
                }
                for (d, pieces) in cats(g, ck[0]) {
                    let parts = output_per_piece(g, s, &ck, kids[0], &pieces);
                    out.push(cat(g, d, parts));
                }
            }
            out
        }),
    });
    l.push(Lemma {
        name: "norm-over-cat",
        doc: "layer norm over the last dims of cat_d(x_i), d a row dim, is per piece: outputs cat_d, per-row statistics cat along their row dim",
        roots: vec![GET.into()],
        examples: vec![
            ("(get 0 (apex.fused_layer_norm_affine_fwd.default (cat 0 %r0:a %r1:a) %r0:w %r0:b (list 3) f:1e-5 b:false))", &[("a", "f64[2,2,3]"), ("w", "f64[3]"), ("b", "f64[3]")]),
            ("(get 2 (apex.fused_layer_norm_affine_fwd.default (cat 0 %r0:a %r1:a) %r0:w %r0:b (list 3) f:1e-5 b:false))", &[("a", "f64[2,2,3]"), ("w", "f64[3]"), ("b", "f64[3]")]),
            ("(get 1 (aten.native_layer_norm.default (cat 1 %r0:a %r1:a) (list 3) %r0:w %r0:b f:1e-5))", &[("a", "f64[2,2,3]"), ("w", "f64[3]"), ("b", "f64[3]")]),
        ],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let Some(k) = int(g, kids[0]) else { return vec![] };
            let mut out = Vec::new();
            for n in g[kids[1]].nodes.clone() {
                let Term::Op(s, ck) = n else { continue };
                // (normalized_shape position, whether the statistics are flattened to 1-d).
                let (norm_at, flat_stats) = match s.as_str() {
                    "apex.fused_layer_norm_affine_fwd.default" => (3, true),
                    "aten.native_layer_norm.default" => (1, false),
                    _ => continue,
                };
                let Some(normalized) = int_list(g, ck[norm_at]) else { continue };
                let Some(x) = shape(g, ck[0]) else { continue };
                let rows = x.len().saturating_sub(normalized.len());
                for (d, pieces) in cats(g, ck[0]) {
                    // Flattened statistics stay contiguous per piece only for a split of dim 0.
                    if d >= rows || (k > 0 && flat_stats && d != 0) {
                        continue;
                    }
                    let parts = output_per_piece(g, s, &ck, kids[0], &pieces);
                    out.push(cat(g, if k > 0 && flat_stats { 0 } else { d }, parts));
                }
            }
            out
        }),
    });
    l.push(Lemma {
        name: "norm-backward-over-cat",
        doc: "layer norm backward with the gradient, input and statistics split alike along a row dim: the input gradient is per piece (cat), the weight and bias gradients are the sum over ranks of the pieces'; all three are linear in the gradient",
        roots: vec![GET.into()],
        examples: vec![
            ("(get 0 (aten.native_layer_norm_backward.default (cat 1 %r0:g %r1:g) (cat 1 %r0:x %r1:x) (list 3) (cat 1 %r0:m %r1:m) (cat 1 %r0:r %r1:r) %r0:w %r0:b (list b:true b:true b:true)))", &[("g", "f64[2,1,3]"), ("x", "f64[2,1,3]"), ("m", "f64[2,1,1]"), ("r", "f64[2,1,1]"), ("w", "f64[3]"), ("b", "f64[3]")]),
            ("(get 1 (aten.native_layer_norm_backward.default (cat 0 %r0:g %r1:g) (cat 0 %r0:x %r1:x) (list 3) (cat 0 %r0:m %r1:m) (cat 0 %r0:r %r1:r) %r0:w %r0:b (list b:true b:true b:true)))", &[("g", "f64[2,2,3]"), ("x", "f64[2,2,3]"), ("m", "f64[2,2,1]"), ("r", "f64[2,2,1]"), ("w", "f64[3]"), ("b", "f64[3]")]),
            ("(get 2 (aten.native_layer_norm_backward.default (scale 1 2 %r0:g) %r0:x (list 3) %r0:m %r0:r %r0:w %r0:b (list b:true b:true b:true)))", &[("g", "f64[2,2,3]"), ("x", "f64[2,2,3]"), ("m", "f64[2,2,1]"), ("r", "f64[2,2,1]"), ("w", "f64[3]"), ("b", "f64[3]")]),
            ("(get 0 (aten.native_layer_norm_backward.default (sum %r0:g %r1:g) %r0:x (list 3) %r0:m %r0:r %r0:w %r0:b (list b:true b:true b:true)))", &[("g", "f64[2,2,3]"), ("x", "f64[2,2,3]"), ("m", "f64[2,2,1]"), ("r", "f64[2,2,1]"), ("w", "f64[3]"), ("b", "f64[3]")]),
        ],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let Some(k) = int(g, kids[0]) else { return vec![] };
            let mut out = Vec::new();
            for n in g[kids[1]].nodes.clone() {
                let Term::Op(s, ck) = n else { continue };
                if !is_op!(s, "aten.native_layer_norm_backward.default") {
                    continue;
                }
                // Linear in the upstream gradient.
                for (p, q, x) in scales(g, ck[0]) {
                    let parts = output_per_piece_at(g, s, &ck, 0, kids[0], &[x]);
                    out.push(scale(g, p, q, parts[0]));
                }
                for terms in sums(g, ck[0]) {
                    let parts = output_per_piece_at(g, s, &ck, 0, kids[0], &terms);
                    out.push(op(g, SUM, parts));
                }
                let Some(normalized) = int_list(g, ck[2]) else { continue };
                let Some(x) = shape(g, ck[1]) else { continue };
                let rows = x.len().saturating_sub(normalized.len());
                for (d, xs) in cats(g, ck[1]) {
                    let Some(szs) = sizes(g, &xs, d) else { continue };
                    if d >= rows {
                        continue;
                    }
                    let split_alike = |g: &Graph, id: Id| {
                        cats(g, id)
                            .into_iter()
                            .find(|(e, ps)| *e == d && sizes(g, ps, d).as_deref() == Some(&szs[..]))
                            .map(|(_, ps)| ps)
                    };
                    let (Some(gs), Some(ms), Some(rs)) =
                        (split_alike(g, ck[0]), split_alike(g, ck[3]), split_alike(g, ck[4]))
                    else {
                        continue;
                    };
                    let parts: Vec<Id> = (0..xs.len())
                        .map(|i| {
                            let call = g.add(with_kids(s, &ck, &[(0, gs[i]), (1, xs[i]), (3, ms[i]), (4, rs[i])]));
                            op(g, GET, vec![kids[0], call])
                        })
                        .collect();
                    out.push(if k == 0 { cat(g, d, parts) } else { op(g, SUM, parts) });
                }
            }
            out
        }),
    });
    l.push(Lemma {
        name: "vocab-masked-lookup",
        doc: "Megatron's masked embedding: masked_fill(embedding(w, masked_fill(t - s, m, c)), m, 0) with m = (t < s) | (t >= s + rows(w)) and 0 <= c < rows(w) is vocab_lookup(w, t, s)",
        roots: vec!["aten.masked_fill.Scalar".into()],
        examples: vec![
            ("(aten.masked_fill.Scalar (aten.embedding.default %r0:w (aten.masked_fill.Scalar (aten.sub.Tensor %r0:t 3 1) (aten.bitwise_or.Tensor (aten.lt.Scalar %r0:t 3) (aten.ge.Scalar %r0:t 6)) 0) -1 b:false b:false) (aten.view.default (aten.bitwise_or.Tensor (aten.lt.Scalar %r0:t 3) (aten.ge.Scalar %r0:t 6)) (list 2 4 1)) f:0.0)", &[("w", "f64[3,5]"), ("t", "i64[2,4]<9")]),
        ],
        requires: None,
        build: Arc::new(|g, _, kids| {
            if !is_zero(g, kids[2]) {
                return vec![];
            }
            let mut out = Vec::new();
            for (w, idx) in calls2(g, kids[0], "aten.embedding.default") {
                let Some(rows) = shape(g, w).map(|s| s[0]) else { continue };
                for (t, s) in masked_shard_index(g, idx, rows, kids[1]) {
                    let sn = num(g, s);
                    out.push(op(g, crate::term::VOCAB_LOOKUP, vec![w, t, sn]));
                }
            }
            out
        }),
    });
    l.push(Lemma {
        name: "vocab-masked-pick",
        doc: "vocab-parallel cross-entropy's target logit: masked_fill(view(index(view(x, [N, w]), [arange(N), view(masked_fill(t - s, m, c), [N])]), shape(t)), m, 0) with m = (t < s) | (t >= s + w) is vocab_pick(x, t, s)",
        roots: vec!["aten.masked_fill.Scalar".into()],
        examples: vec![
            ("(aten.masked_fill.Scalar (aten.view.default (aten.index.Tensor (aten.view.default %r0:x (list 6 4)) (list (aten.arange.start 0 6 none none dev b:false) (aten.view.default (aten.masked_fill.Scalar (aten.sub.Tensor %r0:t 4 1) (aten.bitwise_or.Tensor (aten.lt.Scalar %r0:t 4) (aten.ge.Scalar %r0:t 8)) 0) (list 6)))) (list 3 2)) (aten.bitwise_or.Tensor (aten.lt.Scalar %r0:t 4) (aten.ge.Scalar %r0:t 8)) f:0.0)", &[("x", "f64[3,2,4]"), ("t", "i64[3,2]<12")]),
        ],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            if !is_zero(g, kids[2]) {
                return vec![];
            }
            let Some(tshape) = shape(g, eclass) else { return vec![] };
            let n: usize = tshape.iter().product();
            let mut out = Vec::new();
            for picked in views(g, kids[0]) {
                for n2 in g[picked].nodes.clone() {
                    let Term::Op(sym, k) = n2 else { continue };
                    if !is_op!(sym, "aten.index.Tensor") {
                        continue;
                    }
                    let Some([rows_ix, col_ix]) = list_items(g, k[1]) else { continue };
                    if !is_arange(g, rows_ix, n) {
                        continue;
                    }
                    {
                        let Some(&[rows, w]) = shape(g, k[0]).as_deref() else { continue };
                        if rows != n {
                            continue;
                        }
                        let mut xs = tshape.clone();
                        xs.push(w);
                        let xl = list(g, &xs);
                        let flat = op(g, "aten.view.default", vec![k[0], xl]);
                        for idx in views(g, col_ix) {
                            for (t, s) in masked_shard_index(g, idx, w, kids[1]) {
                                let sn = num(g, s);
                                out.push(op(g, crate::term::VOCAB_PICK, vec![flat, t, sn]));
                            }
                        }
                    }
                }
            }
            out
        }),
    });
    l.push(Lemma {
        name: "vocab-over-cat",
        doc: "embedding(cat_0(w_i), t) = sum_i vocab_lookup(w_i, t, o_i) for t in range (the spec's own precondition); vocab_lookup / vocab_pick of cat(x_i) along the vocab dim = sum_i of the pieces at offsets s + o_i",
        roots: vec!["aten.embedding.default".into(), crate::term::VOCAB_LOOKUP.into(), crate::term::VOCAB_PICK.into()],
        examples: vec![
            ("(aten.embedding.default (cat 0 %r0:w %r1:w) %r0:t -1 b:false b:false)", &[("w", "f64[3,2]"), ("t", "i64[2,3]<6")]),
            ("(vocab_lookup (cat 0 %r0:w %r1:w) %r0:t 2)", &[("w", "f64[3,2]"), ("t", "i64[2,3]<9")]),
            ("(vocab_pick (cat 2 %r0:x %r1:x) %r0:t 1)", &[("x", "f64[2,3,2]"), ("t", "i64[2,3]<6")]),
        ],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            let roots = ["aten.embedding.default", crate::term::VOCAB_LOOKUP, crate::term::VOCAB_PICK];
            let Some(sym) = node_sym(g, eclass, kids, &roots) else { return vec![] };
            let (base, piece_op) = match sym.as_str() {
                "aten.embedding.default" => {
                    // Only the plain lookup (no padding_idx gradient rule, no sparse flag).
                    if int(g, kids[2]) != Some(-1) {
                        return vec![];
                    }
                    (0, crate::term::VOCAB_LOOKUP)
                }
                s => match int(g, kids[2]) {
                    Some(b) => (b, s),
                    None => return vec![],
                },
            };
            let vocab_dim = |g: &Graph| match piece_op {
                crate::term::VOCAB_PICK => shape(g, kids[0]).map(|s| s.len() - 1),
                _ => Some(0),
            };
            let Some(vd) = vocab_dim(g) else { return vec![] };
            let mut out = Vec::new();
            for (d, pieces) in cats(g, kids[0]) {
                if d != vd {
                    continue;
                }
                let Some(szs) = sizes(g, &pieces, d) else { continue };
                let mut off = base;
                let mut parts = Vec::new();
                for (&p, &n) in pieces.iter().zip(&szs) {
                    let o = num(g, off);
                    parts.push(op(g, piece_op, vec![p, kids[1], o]));
                    off += n as i64;
                }
                out.push(op(g, SUM, parts));
            }
            out
        }),
    });
    l.push(Lemma {
        name: "nll-sum-over-cat",
        doc: "a sum-reduced NLL of row pieces is the sum of the pieces' NLLs; its backward is the cat of the pieces' backwards (ignored targets contribute nothing either way)",
        roots: vec![GET.into(), "aten.nll_loss_backward.default".into()],
        examples: vec![
            ("(get 0 (aten.nll_loss_forward.default (cat 0 %r0:x %r1:x) (cat 0 %r0:t %r1:t) none 2 -100))", &[("x", "f64[3,4]"), ("t", "i64[3]<4")]),
            ("(aten.nll_loss_backward.default %r0:g (cat 0 %r0:x %r1:x) (cat 0 %r0:t %r1:t) none 2 -100 %r0:g)", &[("g", "f64[]"), ("x", "f64[3,4]"), ("t", "i64[3]<4")]),
        ],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            let mut out = Vec::new();
            let pieces_of = |g: &Graph, x: Id, t: Id| -> Vec<(Vec<Id>, Vec<Id>)> {
                let mut res = Vec::new();
                for (dx, xs) in cats(g, x) {
                    if dx != 0 || shape(g, x).is_none_or(|s| s.len() != 2) {
                        continue;
                    }
                    let Some(szs) = sizes(g, &xs, 0) else { continue };
                    for (dt, ts) in cats(g, t) {
                        if dt == 0 && sizes(g, &ts, 0).as_deref() == Some(&szs[..]) {
                            res.push((xs.clone(), ts));
                        }
                    }
                }
                res
            };
            if kids.len() == 2 {
                if int(g, kids[0]) != Some(0) {
                    return vec![];
                }
                let forward = "aten.nll_loss_forward.default";
                let s = Symbol::from(forward);
                for ck in ring::calls(g, kids[1], forward) {
                    if int(g, ck[3]) != Some(2) || !is_none(g, ck[2]) {
                        continue;
                    }
                    for (xs, ts) in pieces_of(g, ck[0], ck[1]) {
                        let parts: Vec<Id> = xs
                            .iter()
                            .zip(&ts)
                            .map(|(&x, &t)| {
                                let call = g.add(with_kids(s, &ck, &[(0, x), (1, t)]));
                                op(g, GET, vec![kids[0], call])
                            })
                            .collect();
                        out.push(op(g, SUM, parts));
                    }
                }
                return out;
            }
            let Some(s) = node_sym(g, eclass, kids, &["aten.nll_loss_backward.default"]) else { return vec![] };
            if int(g, kids[4]) != Some(2) || !is_none(g, kids[3]) {
                return vec![];
            }
            for (xs, ts) in pieces_of(g, kids[1], kids[2]) {
                let parts: Vec<Id> = xs
                    .iter()
                    .zip(&ts)
                    .map(|(&x, &t)| g.add(with_kids(s, kids, &[(1, x), (2, t)])))
                    .collect();
                out.push(cat(g, 0, parts));
            }
            out
        }),
    });
    l.push(Lemma {
        name: "embedding-backward-over-cat",
        doc: "embedding_dense_backward(cat_d(g_i), cat_d(t_i), n, p, false) = sum_i embedding_dense_backward(g_i, t_i, n, p, false) for d a dim of the indices",
        roots: vec!["aten.embedding_dense_backward.default".into()],
        examples: vec![("(aten.embedding_dense_backward.default (cat 0 %r0:g %r1:g) (cat 0 %r0:t %r1:t) 5 -1 b:false)", &[("g", "f64[2,3,4]"), ("t", "i64[2,3]<5")])],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            let Some(sym) = node_sym(g, eclass, kids, &["aten.embedding_dense_backward.default"]) else { return vec![] };
            if !is_false(g, kids[4]) {
                return vec![];
            }
            let Some(ts) = shape(g, kids[1]) else { return vec![] };
            let mut out = Vec::new();
            for (d, gp) in cats(g, kids[0]) {
                if d >= ts.len() {
                    continue;
                }
                let Some(szs) = sizes(g, &gp, d) else { continue };
                let Some((_, tp)) = cats(g, kids[1]).into_iter().find(|(td, tp)| *td == d && sizes(g, tp, d).as_deref() == Some(&szs[..])) else { continue };
                let parts: Vec<Id> = gp
                    .iter()
                    .zip(&tp)
                    .map(|(&a, &b)| g.add(with_kids(sym, kids, &[(0, a), (1, b)])))
                    .collect();
                out.push(op(g, SUM, parts));
            }
            out
        }),
    });
    l.push(Lemma {
        name: "nll-of-log-softmax",
        doc: "with no ignored targets (so every target indexes a class), the summed NLL of log_softmax(x) over the last dim is sum(log(sum(exp(x - m))) - pick(x - m, t)), m = amax(x): the max / sum-exp / target-logit form of vocab-parallel cross-entropy",
        roots: vec![GET.into()],
        examples: vec![(
            "(get 0 (aten.nll_loss_forward.default (aten._log_softmax.default %r0:x 1 b:false) %r0:t none 2 -100))",
            &[("x", "f64[4,5]"), ("t", "i64[4]<5")],
        )],
        requires: Some("ignore-index"),
        build: Arc::new(|g, _, kids| {
            if int(g, kids[0]) != Some(0) {
                return vec![];
            }
            let mut out = Vec::new();
            for n in g[kids[1]].nodes.clone() {
                let Term::Op(s, ck) = n else { continue };
                if !is_op!(s, "aten.nll_loss_forward.default") || int(g, ck[3]) != Some(2) || !is_none(g, ck[2]) {
                    continue;
                }
                let (t, ls) = (ck[1], ck[0]);
                let Some(ts) = shape(g, t) else { continue };
                for m in g[ls].nodes.clone() {
                    let Term::Op(ms, mk) = m else { continue };
                    if !is_op!(ms, "aten._log_softmax.default") || !is_false(g, mk[2]) {
                        continue;
                    }
                    let x = mk[0];
                    let Some(xs) = shape(g, x) else { continue };
                    let last = xs.len() as i64 - 1;
                    if xs.len() != 2 || int(g, mk[1]) != Some(last) || ts.len() != 1 || ts[0] != xs[0] {
                        continue;
                    }
                    let dims = {
                        let d = num(g, last);
                        op(g, LIST, vec![d])
                    };
                    let yes = op(g, "b:true", vec![]);
                    let amax = op(g, "aten.amax.default", vec![x, dims, yes]);
                    let one = num(g, 1);
                    let shifted = op(g, "aten.sub.Tensor", vec![x, amax, one]);
                    let e = op(g, "aten.exp.default", vec![shifted]);
                    let none = op(g, "none", vec![]);
                    let se = op(g, "aten.sum.dim_IntList", vec![e, dims, yes, none]);
                    let lse = op(g, "aten.log.default", vec![se]);
                    let tl = list(g, &ts);
                    let lse_flat = op(g, "aten.view.default", vec![lse, tl]);
                    let zero = num(g, 0);
                    let pick = op(g, crate::term::VOCAB_PICK, vec![shifted, t, zero]);
                    let per_row = op(g, "aten.sub.Tensor", vec![lse_flat, pick, one]);
                    out.push(op(g, "aten.sum.default", vec![per_row, none]));
                }
            }
            out
        }),
    });
    l.push(Lemma {
        name: "vocab-masked-gather",
        doc: "the gather form of the target-logit pick: masked_fill(gather(x, last, view(masked_fill(t - s, m, c), [.., 1])), view(m, [.., 1]), 0) with m = (t < s) | (t >= s + w), 0 <= c < w, is view(vocab_pick(x, t, s), [.., 1])",
        roots: vec!["aten.masked_fill.Scalar".into()],
        examples: vec![(
            "(aten.masked_fill.Scalar (aten.gather.default %r0:x 1 (aten.view.default (aten.masked_fill.Scalar (aten.sub.Scalar %r0:t 3 1) (aten.bitwise_or.Tensor (aten.lt.Scalar %r0:t 3) (aten.ge.Scalar %r0:t 7)) 0) (list 5 1)) b:false) (aten.view.default (aten.bitwise_or.Tensor (aten.lt.Scalar %r0:t 3) (aten.ge.Scalar %r0:t 7)) (list 5 1)) f:0.0)",
            &[("x", "f64[5,4]"), ("t", "i64[5]<10")],
        )],
        requires: None,
        build: Arc::new(|g, _, kids| {
            if !is_zero(g, kids[2]) {
                return vec![];
            }
            let mut out = Vec::new();
            for n in g[kids[0]].nodes.clone() {
                let Term::Op(s, k) = n else { continue };
                if !is_op!(s, "aten.gather.default") || k.len() < 3 {
                    continue;
                }
                let (x, idx_col) = (k[0], k[2]);
                let Some(xs) = shape(g, x) else { continue };
                let Some(&w) = xs.last() else { continue };
                if int(g, k[1]) != Some(xs.len() as i64 - 1) || shape(g, idx_col).is_none_or(|s| s.last() != Some(&1)) {
                    continue;
                }
                // The mask of the fill is a view of the range mask; the index a view of the shifted index.
                let masks = views(g, kids[1]);
                for idx in views(g, idx_col) {
                    for &m in &masks {
                        for (t, st) in masked_shard_index(g, idx, w, m) {
                            if shape(g, t).map(|mut s| { s.push(1); s }) != shape(g, idx_col) {
                                continue;
                            }
                            let sn = num(g, st);
                            let pick = op(g, crate::term::VOCAB_PICK, vec![x, t, sn]);
                            let l = list(g, &shape(g, idx_col).unwrap_or_default());
                            out.push(op(g, "aten.view.default", vec![pick, l]));
                        }
                    }
                }
            }
            out
        }),
    });
    l.push(Lemma {
        name: "sum-flatten",
        doc: "sum.default(x) = sum.default(view(x, [numel])) for a tensor of two or more dims",
        roots: vec!["aten.sum.default".into()],
        examples: vec![("(aten.sum.default %r0:a none)", &[("a", "f64[2,3]")])],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let Some(xs) = shape(g, kids[0]) else {
                return vec![];
            };
            if xs.len() < 2 {
                return vec![];
            }
            let n: usize = xs.iter().product();
            let l = list(g, &[n]);
            let v = op(g, "aten.view.default", vec![kids[0], l]);
            vec![op(g, "aten.sum.default", vec![v, kids[1]])]
        }),
    });
    l.push(Lemma {
        name: "view-through-binary",
        doc: "view(f(a, b), s) = f(view(a, s), view(b, s)) for an elementwise f whose tensor operands all have the output's shape",
        roots: vec!["aten.view.default".into()],
        examples: vec![("(aten.view.default (aten.sub.Tensor %r0:a %r0:b 1) (list 6))", &[("a", "f64[2,3]"), ("b", "f64[2,3]")])],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let mut out = Vec::new();
            for n in g[kids[0]].nodes.clone() {
                let Term::Op(s, ck) = n else { continue };
                let Some(e) = ew(s.as_str()) else { continue };
                if e.1.len() < 2 {
                    continue;
                }
                let Some(os) = shape(g, kids[0]) else { continue };
                if !e.1.iter().all(|&i| ck.get(i).is_some_and(|&c| shape(g, c).as_deref() == Some(&os[..]))) {
                    continue;
                }
                let mut k = ck.clone();
                for &i in e.1 {
                    k[i] = op(g, "aten.view.default", vec![ck[i], kids[1]]);
                }
                out.push(g.add(Term::Op(s, k)));
            }
            out
        }),
    });
    l.push(Lemma {
        name: "embedding-over-cat",
        doc: "embedding(w, cat_d(i_k)) = cat_d(embedding(w, i_k)); embedding(cat_1(w_k), i) = cat_last(embedding(w_k, i))",
        roots: vec!["aten.embedding.default".into()],
        examples: vec![("(aten.embedding.default %r0:w (cat 0 %r0:i %r1:j) -1 b:false b:false)", &[("w", "f64[5,3]"), ("i", "i64[2]<5"), ("j", "i64[3]<5")])],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            let sym = Symbol::from("aten.embedding.default");
            let mut out = Vec::new();
            for (d, pieces) in cats(g, kids[1]) {
                let parts = pieces.iter().map(|&p| g.add(with_kids(sym, kids, &[(1, p)]))).collect();
                out.push(cat(g, d, parts));
            }
            let last = shape(g, eclass).map_or(1, |s| s.len()) - 1;
            for (d, pieces) in cats(g, kids[0]) {
                if d == 1 {
                    let parts = pieces.iter().map(|&p| g.add(with_kids(sym, kids, &[(0, p)]))).collect();
                    out.push(cat(g, last, parts));
                }
            }
            out
        }),
    });
    l.extend(rows::lemmas());
    l.extend(chunks::lemmas());
    l.extend(vocab::lemmas());
    l.extend(moe::lemmas());
    l.extend(ring::lemmas());
    l.extend(flash::lemmas());
    l.extend(elements::lemmas());
    l
}

/// Whether an operator may be linear in its argument `pos` (over-approximated: used only to
/// withhold bug evidence, never to build terms).
pub fn may_be_linear_in(sym: &str, pos: usize) -> bool {
    let (positions, _) = linear_positions(sym);
    if positions.contains(&pos) {
        return true;
    }
    matches!(
        (sym, pos),
        (
            "aten.scatter.src" | "aten.scatter_add.default" | "aten.index_add.default",
            0 | 3
        ) | (
            "aten.index_put.default" | "aten._unsafe_index_put.default",
            0 | 2
        ) | ("aten.masked_fill.Scalar" | "aten.masked_fill.Tensor", 0)
            | ("aten.cat.default" | "aten.stack.default", 0)
            | (
                "aten.clone.default"
                    | "aten.contiguous.default"
                    | "aten.alias.default"
                    | "aten.reshape.default"
                    | "aten._unsafe_view.default"
                    | "aten.unsqueeze.default"
                    | "aten.squeeze.dim"
                    | "aten.expand.default"
                    | "aten.t.default"
                    | "aten.slice.Tensor"
                    | "aten.select.int"
                    | "aten.index_select.default"
                    | "aten.addmm.default"
                    | "aten.baddbmm.default",
                _
            )
    )
}

fn linear_positions(sym: &str) -> (Vec<usize>, bool) {
    if let Some(e) = ew(sym) {
        return (e.2.to_vec(), e.3);
    }
    LINEAR
        .iter()
        .find(|e| e.0 == sym)
        .map_or((Vec::new(), false), |e| (e.1.to_vec(), false))
}

/// The transpose nodes of a class: (input, dim a, dim b).
fn transposes(g: &Graph, id: Id) -> Vec<(Id, Id, Id)> {
    g[id]
        .nodes
        .iter()
        .filter_map(|n| match n {
            Term::Op(s, k) if is_op!(s, "aten.transpose.int") => Some((k[0], k[1], k[2])),
            _ => None,
        })
        .collect()
}

/// One step of a layout chain, from the base tensor outward.
#[derive(Clone, Debug)]
enum LayoutStep {
    /// A view to this shape.
    View(Vec<usize>),
    /// A permutation of dims (`out[i] = in[p[i]]`).
    Permute(Vec<usize>),
}

/// The chains of views, transposes and permutes that end at `id`: (base, steps from the base
/// outward), one per class along the way (2 steps at least). One node per class is followed,
/// up to 5 steps.
fn layout_chains(g: &Graph, id: Id) -> Vec<(Id, Vec<LayoutStep>)> {
    let mut classes = vec![id];
    let mut top_down: Vec<LayoutStep> = Vec::new();
    for _ in 0..5 {
        let at = *classes.last().expect("non-empty");
        let Some(out_shape) = shape(g, at) else { break };
        let next = g[at].nodes.iter().find_map(|n| match n {
            Term::Op(s, k) if is_op!(s, "aten.view.default") => {
                Some((k[0], LayoutStep::View(out_shape.clone())))
            }
            Term::Op(s, k) if is_op!(s, "aten.transpose.int") => {
                let (a, b) = (int(g, k[1])? as usize, int(g, k[2])? as usize);
                let mut p: Vec<usize> = (0..out_shape.len()).collect();
                p.swap(a, b);
                Some((k[0], LayoutStep::Permute(p)))
            }
            Term::Op(s, k) if is_op!(s, "aten.permute.default") => {
                let p = int_list(g, k[1])?.into_iter().map(|d| d as usize).collect();
                Some((k[0], LayoutStep::Permute(p)))
            }
            _ => None,
        });
        let Some((inner, step)) = next else { break };
        if classes.contains(&g.find(inner)) {
            break;
        }
        top_down.push(step);
        classes.push(g.find(inner));
    }
    (2..classes.len())
        .map(|k| {
            let mut steps = top_down[..k].to_vec();
            steps.reverse();
            (classes[k], steps)
        })
        .collect()
}

/// When viewing `base` through `steps` gives `target` as a pure reordering of `base`'s elements:
/// the shape `split` that `base` is viewed to and the permutation `perm` such that
/// `view(permute(view(base, split), perm), target)` is the chain.
fn strided_permutation(
    base: &[usize],
    steps: &[LayoutStep],
    target: &[usize],
) -> Option<(Vec<usize>, Vec<usize>)> {
    // Dims as (size, stride) over base's contiguous storage.
    let mut dims: Vec<(usize, usize)> = Vec::new();
    let mut stride = 1;
    for &n in base.iter().rev() {
        dims.push((n, stride));
        stride *= n;
    }
    dims.reverse();
    for step in steps {
        match step {
            LayoutStep::Permute(p) => {
                if p.len() != dims.len() {
                    return None;
                }
                dims = p
                    .iter()
                    .map(|&i| dims.get(i).copied())
                    .collect::<Option<_>>()?;
            }
            LayoutStep::View(shape) => dims = view_strides(&dims, shape)?,
        }
    }
    if dims.iter().map(|d| d.0).collect::<Vec<_>>() != target {
        return None;
    }
    // Non-unit dims ordered by decreasing stride must tile the storage densely.
    let mut order: Vec<usize> = (0..dims.len()).filter(|&i| dims[i].0 != 1).collect();
    order.sort_by(|&a, &b| dims[b].1.cmp(&dims[a].1));
    let mut expect = 1;
    for &i in order.iter().rev() {
        if dims[i].1 != expect {
            return None;
        }
        expect *= dims[i].0;
    }
    let split: Vec<usize> = order.iter().map(|&i| dims[i].0).collect();
    // perm: the result's non-unit dims in target order, as positions in `split`.
    let perm: Vec<usize> = (0..dims.len())
        .filter(|&i| dims[i].0 != 1)
        .map(|i| order.iter().position(|&o| o == i).expect("listed"))
        .collect();
    let split = if split.is_empty() { vec![1] } else { split };
    let perm = if perm.is_empty() { vec![0] } else { perm };
    Some((split, perm))
}

/// A split and permutation of [`strided_permutation`] whose result differs from `target` only
/// by unit dims, with those unit dims leading the split and `perm` putting every dim where
/// `target` has it (no view after the permutation): the form a rank holding one sequence
/// builds (`permute(view(x, [1, 4, 2, 4]), [0, 1, 3, 2])`, the ring's key gradient under dp x
/// cp). `None` when the result differs otherwise or `target` has no unit dim.
fn units_in_split(
    split: &[usize],
    perm: &[usize],
    target: &[usize],
) -> Option<(Vec<usize>, Vec<usize>)> {
    let units: Vec<usize> = (0..target.len()).filter(|&i| target[i] == 1).collect();
    let now: Vec<usize> = perm.iter().map(|&p| split[p]).collect();
    let rest: Vec<usize> = target.iter().copied().filter(|&n| n != 1).collect();
    if units.is_empty() || now != rest || split.contains(&1) {
        return None;
    }
    let mut with_units = vec![1; units.len()];
    with_units.extend_from_slice(split);
    let mut kept = perm.iter();
    let full = (0..target.len())
        .map(|i| match units.iter().position(|&u| u == i) {
            Some(u) => Some(u),
            None => kept.next().map(|&p| units.len() + p),
        })
        .collect::<Option<Vec<usize>>>()?;
    Some((with_units, full))
}

/// The strides of viewing strided dims as `shape`, by torch's rule (`computeStride`): each
/// group of target dims must cover source dims that are contiguous among themselves.
fn view_strides(dims: &[(usize, usize)], shape: &[usize]) -> Option<Vec<(usize, usize)>> {
    let total: usize = dims.iter().map(|d| d.0).product();
    if shape.iter().product::<usize>() != total || dims.is_empty() {
        return (total == 1 || dims.is_empty() && shape.iter().product::<usize>() == 1)
            .then(|| shape.iter().map(|&n| (n, 1)).collect());
    }
    let mut out = vec![(0usize, 0usize); shape.len()];
    let mut view_d = shape.len() as isize - 1;
    let mut chunk_base = dims[dims.len() - 1].1;
    let (mut tensor_n, mut view_n) = (1usize, 1usize);
    for td in (0..dims.len()).rev() {
        tensor_n *= dims[td].0;
        if td == 0 || (dims[td - 1].0 != 1 && dims[td - 1].1 != tensor_n * chunk_base) {
            while view_d >= 0 && (view_n < tensor_n || shape[view_d as usize] == 1) {
                let vd = view_d as usize;
                out[vd] = (shape[vd], view_n * chunk_base);
                view_n *= shape[vd];
                view_d -= 1;
            }
            if view_n != tensor_n {
                return None;
            }
            if td > 0 {
                chunk_base = dims[td - 1].1;
                tensor_n = 1;
                view_n = 1;
            }
        }
    }
    (view_d == -1).then_some(out)
}

/// A `list` class of integers.
/// The `list` node of these integers.
pub(crate) fn list(g: &mut Graph, v: &[usize]) -> Id {
    let ids: Vec<Id> = v.iter().map(|&n| num(g, n as i64)).collect();
    op(g, LIST, ids)
}

/// The fill value and the options (dtype, layout, device, pin_memory) of a zero fill in a
/// class, directly or under up to `depth` layout operators (a transposed or sliced zero block
/// is zeros too): what a zero fill of another shape is built from.
fn zero_fill(g: &Graph, id: Id, depth: usize) -> Option<(Id, Vec<Id>)> {
    for n in &g[id].nodes {
        let Term::Op(s, k) = n else { continue };
        match s.as_str() {
            "aten.full.default" if k.len() == 6 && is_zero(g, k[1]) => {
                return Some((k[1], k[2..].to_vec()))
            }
            "aten.transpose.int"
            | "aten.permute.default"
            | "aten.view.default"
            | "aten.expand.default"
            | "aten.clone.default"
                if depth > 0 && !k.is_empty() =>
            {
                if let Some(f) = zero_fill(g, k[0], depth - 1) {
                    return Some(f);
                }
            }
            SLICE if depth > 0 && k.len() == 4 => {
                if let Some(f) = zero_fill(g, k[3], depth - 1) {
                    return Some(f);
                }
            }
            _ => {}
        }
    }
    None
}

/// Whether a class is the number zero (an integer or a float literal).
fn is_zero(g: &Graph, id: Id) -> bool {
    g[id].nodes.iter().any(|n| match n {
        Term::Num(0) => true,
        Term::Op(s, k) if k.is_empty() => {
            matches!(
                s.as_str().strip_prefix("f:").map(str::parse::<f64>),
                Some(Ok(0.0))
            )
        }
        _ => false,
    })
}

/// The pieces of `id` along dim `d` of sizes `szs`: its own pieces when it is split so, smaller
/// fills when it is a constant fill, else slices.
fn split_alike(g: &mut Graph, id: Id, d: usize, szs: &[usize]) -> Option<Vec<Id>> {
    if let Some((_, ps)) = cats(g, id)
        .into_iter()
        .find(|(e, ps)| *e == d && sizes(g, ps, d).as_deref() == Some(szs))
    {
        return Some(ps);
    }
    let shape_of = shape(g, id)?;
    if shape_of.get(d).copied() != Some(szs.iter().sum()) {
        return None;
    }
    let fill = g[id].nodes.iter().find_map(|n| match n {
        Term::Op(s, k) if is_op!(s, "aten.full.default") => Some(k.clone()),
        _ => None,
    });
    let mut off = 0;
    let mut pieces = Vec::new();
    for &n in szs {
        pieces.push(match &fill {
            Some(k) => {
                let mut s = shape_of.clone();
                s[d] = n;
                let l = list(g, &s);
                let mut k = k.clone();
                k[0] = l;
                g.add(Term::Op(Symbol::from("aten.full.default"), k))
            }
            None => slice(g, d, off, off + n, id),
        });
        off += n;
    }
    Some(pieces)
}

/// Pieces of sizes `have` along `d`, grouped into consecutive runs of sizes `want` (each run a
/// cat of its pieces); `None` when the boundaries do not line up.
fn regroup(
    g: &mut Graph,
    pieces: &[Id],
    d: usize,
    have: &[usize],
    want: &[usize],
) -> Option<Vec<Id>> {
    if want.len() >= have.len() {
        return None;
    }
    let mut out = Vec::new();
    let mut at = 0;
    for &w in want {
        let mut run = Vec::new();
        let mut filled = 0;
        while filled < w {
            filled += *have.get(at)?;
            run.push(pieces[at]);
            at += 1;
        }
        if filled != w {
            return None;
        }
        out.push(cat(g, d, run));
    }
    (at == pieces.len()).then_some(out)
}

/// Whether a class is the number one (an integer or a float literal).
fn is_one(g: &Graph, id: Id) -> bool {
    g[id].nodes.iter().any(|n| match n {
        Term::Num(1) => true,
        Term::Op(s, k) if k.is_empty() => {
            matches!(
                s.as_str().strip_prefix("f:").map(str::parse::<f64>),
                Some(Ok(1.0))
            )
        }
        _ => false,
    })
}

/// The (first, second) children of the `sym` calls in a class.
fn calls2(g: &Graph, id: Id, sym: &str) -> Vec<(Id, Id)> {
    let sym = Symbol::from(sym);
    g[id]
        .nodes
        .iter()
        .filter_map(|n| match n {
            Term::Op(s, k) if *s == sym && k.len() >= 2 => Some((k[0], k[1])),
            _ => None,
        })
        .take(3)
        .collect()
}

/// The two items of a `list` class.
fn list_items(g: &Graph, id: Id) -> Option<[Id; 2]> {
    g[id].nodes.iter().find_map(|n| match n {
        Term::Op(s, k) if is_op!(s, LIST) && k.len() == 2 => Some([k[0], k[1]]),
        _ => None,
    })
}

/// Whether a class is `arange(0, n)` (integers 0..n).
fn is_arange(g: &Graph, id: Id, n: usize) -> bool {
    g[id].nodes.iter().any(|node| match node {
        Term::Op(s, k) if is_op!(s, "aten.arange.start") && k.len() >= 2 => {
            int(g, k[0]) == Some(0) && int(g, k[1]) == Some(n as i64)
        }
        Term::Op(s, k) if is_op!(s, "aten.arange.default") && !k.is_empty() => {
            int(g, k[0]) == Some(n as i64)
        }
        _ => false,
    })
}

/// Megatron's shard-local index: `idx` = masked_fill(t - s, m, c) with 0 <= c < width, where
/// `mask_class` is m (or a view of m adding unit dims) and m = (t < s) | (t >= s + width).
/// Returns every (t, s) that fits.
fn masked_shard_index(g: &Graph, idx: Id, width: usize, mask_class: Id) -> Vec<(Id, i64)> {
    let mut out = Vec::new();
    let mask_ok = |g: &Graph, m: Id| {
        g.find(m) == g.find(mask_class)
            || views(g, mask_class).iter().any(|&v| g.find(v) == g.find(m))
    };
    for n in &g[idx].nodes {
        let Term::Op(sym, k) = n else { continue };
        if !is_op!(sym, "aten.masked_fill.Scalar") || k.len() != 3 {
            continue;
        }
        let (shifted, m, c) = (k[0], k[1], k[2]);
        if !mask_ok(g, m) || !int(g, c).is_some_and(|c| (0..width as i64).contains(&c)) {
            continue;
        }
        // m = bitwise_or(lt(t, s), ge(t, e)) with e - s = width.
        for mn in &g[m].nodes {
            let Term::Op(ms, mk) = mn else { continue };
            if !is_op!(ms, "aten.bitwise_or.Tensor") {
                continue;
            }
            let (Some((t1, s)), Some((t2, e))) = (
                scalar_cmp(g, mk[0], "aten.lt.Scalar"),
                scalar_cmp(g, mk[1], "aten.ge.Scalar"),
            ) else {
                continue;
            };
            if g.find(t1) != g.find(t2) || e - s != width as i64 {
                continue;
            }
            // The shifted index is t itself (s = 0) or sub(t, s, 1).
            let shifted_ok = (s == 0 && g.find(shifted) == g.find(t1))
                || g[shifted].nodes.iter().any(|sn| match sn {
                    Term::Op(ss, sk)
                        if matches!(ss.as_str(), "aten.sub.Tensor" | "aten.sub.Scalar")
                            && sk.len() == 3 =>
                    {
                        g.find(sk[0]) == g.find(t1)
                            && int(g, sk[1]) == Some(s)
                            && int(g, sk[2]) == Some(1)
                    }
                    _ => false,
                });
            if shifted_ok {
                out.push((t1, s));
            }
        }
    }
    out
}

/// `(tensor, integer)` of a `sym(tensor, integer)` comparison node in a class.
fn scalar_cmp(g: &Graph, id: Id, sym: &str) -> Option<(Id, i64)> {
    let sym = Symbol::from(sym);
    g[id].nodes.iter().find_map(|n| match n {
        Term::Op(s, k) if *s == sym && k.len() == 2 => Some((k[0], int(g, k[1])?)),
        _ => None,
    })
}

/// Whether a class is the literal `False`.
fn is_false(g: &Graph, id: Id) -> bool {
    g[id]
        .nodes
        .iter()
        .any(|n| matches!(n, Term::Op(s, _) if is_op!(s, "b:false")))
}

/// Whether a class is the literal `None`.
fn is_none(g: &Graph, id: Id) -> bool {
    g[id]
        .nodes
        .iter()
        .any(|n| matches!(n, Term::Op(s, k) if k.is_empty() && is_op!(s, "none")))
}

/// Whether a class is the literal `True`.
fn is_true(g: &Graph, id: Id) -> bool {
    g[id]
        .nodes
        .iter()
        .any(|n| matches!(n, Term::Op(s, _) if is_op!(s, "b:true")))
}

/// Output `k` of the multi-output call `sym(call_kids)` applied to each piece in place of its
/// first operand.
fn output_per_piece(g: &mut Graph, sym: Symbol, call_kids: &[Id], k: Id, pieces: &[Id]) -> Vec<Id> {
    output_per_piece_at(g, sym, call_kids, 0, k, pieces)
}

/// Output `k` of the multi-output call `sym(call_kids)` applied to each piece in place of its
/// operand `at`.
fn output_per_piece_at(
    g: &mut Graph,
    sym: Symbol,
    call_kids: &[Id],
    at: usize,
    k: Id,
    pieces: &[Id],
) -> Vec<Id> {
    pieces
        .iter()
        .map(|&p| {
            let call = g.add(with_kids(sym, call_kids, &[(at, p)]));
            op(g, GET, vec![k, call])
        })
        .collect()
}

/// The inputs of the view nodes of a class.
fn views(g: &Graph, id: Id) -> Vec<Id> {
    g[id]
        .nodes
        .iter()
        .filter_map(|n| match n {
            Term::Op(s, k) if is_op!(s, "aten.view.default") => Some(k[0]),
            _ => None,
        })
        .take(3)
        .collect()
}

/// Splits an elementwise call along output dim `od` into pieces of `szs`, operand `driver`
/// already split into `pieces`; other tensor operands are split likewise (broadcast ones kept).
#[allow(clippy::too_many_arguments)]
fn split_elementwise(
    g: &mut Graph,
    sym: Symbol,
    kids: &[Id],
    tensors: &[usize],
    out: &[usize],
    od: usize,
    szs: &[usize],
    driver: usize,
    pieces: &[Id],
) -> Option<Id> {
    let mut per_operand: Vec<(usize, Vec<Id>)> = vec![(driver, pieces.to_vec())];
    for &t in tensors {
        if t == driver {
            continue;
        }
        let ts = shape(g, kids[t])?;
        if ts.len() + od < out.len() || ts[ts.len() + od - out.len()] == 1 {
            continue; // broadcast along the split dim: every piece takes it whole
        }
        let d = ts.len() + od - out.len();
        let along: Vec<Vec<Id>> = cats(g, kids[t])
            .into_iter()
            .filter(|(cd, _)| *cd == d)
            .map(|(_, ps)| ps)
            .collect();
        // Finer pieces regroup into the driver's only where the driver's are rank sums: per-expert
        // copies of a gradient against per-rank groups of experts that are tensor-parallel
        // partials. Split per expert, the partials' sums outgrow the bound below; plain pieces
        // relate per expert as they are (regrouping those too changed which names the
        // forward's experts take, and their gradient's products no longer met the ranks').
        let partials = |g: &Graph| pieces.iter().all(|&p| !sums(g, p).is_empty());
        let mut same = None;
        for ps in &along {
            let Some(have) = sizes(g, ps, d) else {
                continue;
            };
            if have == szs {
                same = Some(ps.clone());
                break;
            }
            if partials(g) {
                if let Some(rs) = regroup(g, ps, d, &have, szs) {
                    same = Some(rs);
                    break;
                }
            }
        }
        let ps = match same {
            Some(ps) => ps,
            None => {
                let mut off = 0;
                szs.iter()
                    .map(|&n| {
                        let s = slice(g, d, off, off + n, kids[t]);
                        off += n;
                        s
                    })
                    .collect()
            }
        };
        per_operand.push((t, ps));
    }
    let parts: Vec<Id> = (0..szs.len())
        .map(|i| {
            let rep: Vec<(usize, Id)> = per_operand.iter().map(|(t, ps)| (*t, ps[i])).collect();
            g.add(with_kids(sym, kids, &rep))
        })
        .collect();
    Some(cat(g, od, parts))
}

fn matmul_over_cat(g: &mut Graph, sym: &str, kids: &[Id], batch: usize) -> Vec<Id> {
    let s = Symbol::from(sym);
    let (a, b) = (kids[0], kids[1]);
    let (row, inner_a, inner_b, col) = (batch, batch + 1, batch, batch + 1);
    let mut out = Vec::new();
    let ca = cats(g, a);
    let cb = cats(g, b);
    for (d, pieces) in &ca {
        if *d == row {
            let parts = pieces
                .iter()
                .map(|&p| g.add(Term::Op(s, vec![p, b])))
                .collect();
            out.push(cat(g, row, parts));
        }
        if *d < batch {
            // A batch dim of a: b must be split the same way, or broadcast along it.
            let Some(szs) = sizes(g, pieces, *d) else {
                continue;
            };
            // b's pieces along d, regrouped where one side is split finer than the other
            // (per-expert pieces against per-rank groups of experts).
            let paired = cb.iter().filter(|(bd, _)| bd == d).find_map(|(_, bp)| {
                let bs = sizes(g, bp, *d)?;
                if bs == szs {
                    return Some((pieces.clone(), bp.clone()));
                }
                if let Some(ap) = regroup(g, pieces, *d, &szs, &bs) {
                    return Some((ap, bp.clone()));
                }
                regroup(g, bp, *d, &bs, &szs).map(|bp| (pieces.clone(), bp))
            });
            if let Some((ap, bp)) = paired {
                let parts = ap
                    .iter()
                    .zip(&bp)
                    .map(|(&x, &y)| g.add(Term::Op(s, vec![x, y])))
                    .collect();
                out.push(cat(g, *d, parts));
            } else if shape(g, b).is_some_and(|bs| bs.get(*d) == Some(&1)) {
                let parts = pieces
                    .iter()
                    .map(|&x| g.add(Term::Op(s, vec![x, b])))
                    .collect();
                out.push(cat(g, *d, parts));
            }
        }
        if *d == inner_a {
            let Some(szs) = sizes(g, pieces, *d) else {
                continue;
            };
            if let Some((_, bp)) = cb.iter().find(|(bd, bp)| {
                *bd == inner_b && sizes(g, bp, inner_b).as_deref() == Some(&szs[..])
            }) {
                let parts = pieces
                    .iter()
                    .zip(bp)
                    .map(|(&x, &y)| g.add(Term::Op(s, vec![x, y])))
                    .collect();
                out.push(op(g, SUM, parts));
            }
        }
    }
    for (d, pieces) in &cb {
        if *d == col {
            let parts = pieces
                .iter()
                .map(|&p| g.add(Term::Op(s, vec![a, p])))
                .collect();
            out.push(cat(g, col, parts));
        }
    }
    out
}

/// The pieces of `view(cat_d(pieces), target)` when each piece is a block of whole rows of one
/// target dim.
/// `view(cat_d(pieces), target)` when the pieces tile target dim `td + 1` inside each row of
/// target dim `td` (a flattened batch x heads dim split back, with pieces of a few heads): a cat
/// along `td` of cats along `td + 1`.
fn nested_view_of_cat(
    g: &mut Graph,
    target: &[usize],
    td: usize,
    rest: usize,
    szs: &[usize],
    pieces: &[Id],
) -> Option<Id> {
    if td + 1 >= target.len() {
        return None;
    }
    let inner: usize = target[td + 2..].iter().product();
    let row = target[td + 1] * inner;
    let mut rows = Vec::new();
    let mut current = Vec::new();
    let mut filled = 0;
    for (&p, &m) in pieces.iter().zip(szs) {
        let n = m * rest;
        if !n.is_multiple_of(inner) || filled + n > row {
            return None;
        }
        let mut s: Vec<i64> = target.iter().map(|&x| x as i64).collect();
        s[td] = 1;
        s[td + 1] = (n / inner) as i64;
        let l = int_list_node(g, &s);
        current.push(op(g, "aten.view.default", vec![p, l]));
        filled += n;
        if filled == row {
            rows.push(cat(g, td + 1, std::mem::take(&mut current)));
            filled = 0;
        }
    }
    if filled != 0 || rows.len() != target[td] {
        return None;
    }
    Some(cat(g, td, rows))
}

fn view_of_cat(
    g: &mut Graph,
    src: &[usize],
    target: &[usize],
    d: usize,
    pieces: &[Id],
) -> Option<Id> {
    let before: usize = src[..d].iter().product();
    // The target dim where the partitioned dim starts: the products before it must agree.
    let mut acc = 1;
    let mut td = 0;
    while td < target.len() && acc < before {
        acc *= target[td];
        td += 1;
    }
    if acc != before || td >= target.len() {
        return None;
    }
    let rest: usize = src[d + 1..].iter().product();
    let trest: usize = target[td + 1..].iter().product();
    let szs = sizes(g, pieces, d)?;
    if szs.iter().any(|&m| !(m * rest).is_multiple_of(trest)) {
        return nested_view_of_cat(g, target, td, rest, &szs, pieces);
    }
    let mut parts = Vec::new();
    for (&p, &m) in pieces.iter().zip(&szs) {
        if !(m * rest).is_multiple_of(trest) {
            return None;
        }
        let mut s: Vec<i64> = target.iter().map(|&x| x as i64).collect();
        s[td] = (m * rest / trest) as i64;
        let l = int_list_node(g, &s);
        parts.push(op(g, "aten.view.default", vec![p, l]));
    }
    Some(cat(g, td, parts))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::eval;
    use egg::RecExpr;
    use shardproof_ir::DType;
    use shardproof_ops::{Meta, Tensor};

    /// An e-graph of `term` over rank tensors of the given shapes, run with one lemma; whether
    /// `expected` is then in the term's class (a term not built by the lemma would be a new
    /// class).
    fn lemma_relates(name: &str, leaves: &[(&str, &[usize])], term: &str, expected: &str) -> bool {
        let mut g = Graph::new(Shapes::default());
        for (leaf, dims) in leaves {
            g.analysis
                .leaves
                .insert((*leaf).into(), Meta::new(DType::F64, dims.to_vec()));
        }
        let root = g.add_expr(&term.parse().unwrap());
        g.rebuild();
        let lemma = library().into_iter().find(|l| l.name == name).unwrap();
        let mut g = egg::Runner::default()
            .with_egraph(g)
            .with_iter_limit(2)
            .run(&lemma.rewrites())
            .egraph;
        let other = g.add_expr(&expected.parse().unwrap());
        g.rebuild();
        g.find(root) == g.find(other)
    }

    /// Copies of a gradient per expert regroup in the ranks' groups of experts only where those
    /// are sums of tensor-parallel partials; plain groups keep the per-expert split.
    #[test]
    fn expert_copies_regroup_only_against_rank_sums() {
        let leaves: &[(&str, &[usize])] = &[
            ("%r0:a", &[1, 3]),
            ("%r0:b", &[2, 3]),
            ("%r1:b", &[2, 3]),
            ("%r2:b", &[2, 3]),
            ("%r3:b", &[2, 3]),
        ];
        let copies = "(cat 0 %r0:a %r0:a %r0:a %r0:a)";
        let pair = "(cat 0 %r0:a %r0:a)";
        let partials =
            format!("(aten.mul.Tensor {copies} (cat 0 (sum %r0:b %r2:b) (sum %r1:b %r3:b)))");
        let paired = format!(
            "(cat 0 (aten.mul.Tensor {pair} (sum %r0:b %r2:b)) (aten.mul.Tensor {pair} (sum %r1:b %r3:b)))"
        );
        assert!(lemma_relates(
            "elementwise-over-cat",
            leaves,
            &partials,
            &paired
        ));
        let plain = format!("(aten.mul.Tensor {copies} (cat 0 %r0:b %r1:b))");
        let paired =
            format!("(cat 0 (aten.mul.Tensor {pair} %r0:b) (aten.mul.Tensor {pair} %r1:b))");
        assert!(!lemma_relates(
            "elementwise-over-cat",
            leaves,
            &plain,
            &paired
        ));
    }

    /// A chunk's per-token sum becomes the chunk of the rank's sum only when the rank's sum is
    /// in the graph.
    #[test]
    fn a_chunk_sum_is_the_ranks_only_where_the_rank_sums() {
        let leaves: &[(&str, &[usize])] = &[("%r0:z", &[2, 16, 3])];
        let chunk = "(aten.sum.dim_IntList (slice 2 0 2 (aten.view.default %r0:z (list 2 4 4 3))) (list 3) b:false none)";
        let rank = "(aten.sum.dim_IntList %r0:z (list 2) b:false none)";
        let expected = format!("(slice 2 0 2 (aten.view.default {rank} (list 2 4 4)))");
        assert!(!lemma_relates("sum-over-chunk", leaves, chunk, &expected));
        let both = format!(
            "(cat 0 (aten.view.default {chunk} (list 16)) (aten.view.default {rank} (list 32)))"
        );
        let expected_both = format!(
            "(cat 0 (aten.view.default {expected} (list 16)) (aten.view.default {rank} (list 32)))"
        );
        assert!(lemma_relates(
            "sum-over-chunk",
            leaves,
            &both,
            &expected_both
        ));
    }

    /// Factors compose in lowest terms: `1/sqrt(8)` as the binary fraction it is, times its
    /// inverse over two, is one half, though the raw products overflow an i64; a product that
    /// does not fit even reduced is none.
    #[test]
    fn factors_compose_reduced() {
        let (m, k) = crate::lower::rational(0.35355339059327373).unwrap();
        assert!(m.checked_mul(k).is_none());
        assert_eq!(product_reduced((k, m), (m, 2 * k)), Some((1, 2)));
        assert_eq!(product_reduced((-k, m), (m, k)), Some((-1, 1)));
        assert_eq!(product_reduced((i64::MAX, 1), (i64::MAX, 1)), None);
        assert_eq!(product_reduced((1, 2), (3, 0)), None);
    }

    /// A permutation of a tensor itself that only a view to unit dims follows puts the unit
    /// dims into the split, so the chain needs no trailing view: the transposed chunk a
    /// single-sequence rank builds as `permute(view(x, [1, 4, 2, 4]), [0, 1, 3, 2])` comes out
    /// in that form; a result that differs by more than unit dims is left alone.
    #[test]
    fn unit_dims_go_into_the_split() {
        let steps = [
            LayoutStep::Permute(vec![0, 2, 1]),
            LayoutStep::View(vec![1, 4, 4, 2]),
        ];
        let (split, perm) = strided_permutation(&[4, 2, 4], &steps, &[1, 4, 4, 2]).unwrap();
        assert_eq!((&split[..], &perm[..]), (&[4, 2, 4][..], &[0, 2, 1][..]));
        assert_eq!(
            units_in_split(&split, &perm, &[1, 4, 4, 2]),
            Some((vec![1, 4, 2, 4], vec![0, 1, 3, 2]))
        );
        assert_eq!(
            units_in_split(&[3, 2], &[1, 0], &[2, 1, 3]),
            Some((vec![1, 3, 2], vec![2, 0, 1]))
        );
        assert_eq!(units_in_split(&[3, 2], &[1, 0], &[2, 3]), None);
        assert_eq!(units_in_split(&[3, 2], &[1, 0], &[1, 6]), None);
    }

    /// Adds `text` to `g`, returning its class and the expression (for evaluation).
    fn add(g: &mut Graph, text: &str) -> (Id, RecExpr<Term>) {
        let e: RecExpr<Term> = text.parse().expect("term");
        (g.add_expr(&e), e)
    }

    /// The merge of 0-d linear combinations unites exactly the classes the reference kernels
    /// evaluate equal: a flat sum with halved duplicates, nested sums and additions of the
    /// same scalars, and leaves apart one whose coefficients differ.
    #[test]
    fn equal_linear_combinations_of_scalars_merge() {
        let mut g = Graph::new(Shapes::default());
        let mut leaves = HashMap::new();
        let mut x = 0.1;
        for (leaf, key) in [("%r0:a", "r0:a"), ("%r1:a", "r1:a"), ("%r0:b", "r0:b")] {
            g.analysis
                .leaves
                .insert(Symbol::from(leaf), Meta::new(DType::F64, vec![]));
            x += 0.37;
            leaves.insert(
                key.to_string(),
                Tensor::new(Meta::new(DType::F64, vec![]), vec![x]),
            );
        }
        let (flat, flat_e) = add(
            &mut g,
            "(sum %r0:a (scale 1 2 %r0:b) %r1:a (scale 1 2 %r0:b))",
        );
        let (nested, nested_e) = add(
            &mut g,
            "(aten.add.Tensor (sum %r0:a %r0:b) (scale 2 2 %r1:a) 1)",
        );
        let (other, other_e) = add(
            &mut g,
            "(aten.add.Tensor (sum %r0:a %r0:b) (scale 1 2 %r1:a) 1)",
        );
        g.rebuild();
        assert!(merge_linear_scalars(&mut g));
        let value = |e: &RecExpr<Term>| eval(e, &leaves).expect("evaluates")[0].data[0];
        assert_eq!(g.find(flat), g.find(nested));
        assert!((value(&flat_e) - value(&nested_e)).abs() < 1e-12);
        assert_ne!(g.find(flat), g.find(other));
        assert!((value(&flat_e) - value(&other_e)).abs() > 1e-3);
    }

    /// The scale rewrites applied everywhere name a concatenation of multiples by the rank
    /// tensors: a rank's `t = x / 2` makes the spec's chunk `x / 8` the multiple `t / 4`, and
    /// the concatenation of it with `c / 4` is `cat(c, t) / 4`, as the reference kernels
    /// evaluate it.
    #[test]
    fn scale_rewrites_everywhere_name_multiples_by_rank_tensors() {
        let mut g = Graph::new(Shapes::default());
        let meta = Meta::new(DType::F64, vec![2, 3]);
        for leaf in ["%r0:a", "%r0:b", "%r0:c", "%r0:t"] {
            g.analysis.leaves.insert(Symbol::from(leaf), meta.clone());
        }
        let (x, _) = add(&mut g, "(aten.add.Tensor %r0:a %r0:b 1)");
        let (t, _) = add(&mut g, "%r0:t");
        let (half, _) = add(&mut g, "(scale 1 2 (aten.add.Tensor %r0:a %r0:b 1))");
        g.union(t, half);
        let (chunks, chunks_e) = add(
            &mut g,
            "(cat 0 (scale 1 4 %r0:c) (scale 1 8 (aten.add.Tensor %r0:a %r0:b 1)))",
        );
        g.rebuild();
        let named = "(scale 1 4 (cat 0 %r0:c %r0:t))";
        let pairs = [
            ("linear-over-scale", SCALE),
            ("scale-through-sibling", SCALE),
            ("scale-and-cat", CAT),
        ];
        for _ in 0..3 {
            apply_everywhere(&mut g, &pairs);
        }
        let found = g.lookup_expr(&named.parse().expect("term"));
        assert_eq!(found.map(|f| g.find(f)), Some(g.find(chunks)));
        assert_ne!(g.find(x), g.find(t));
        // The rank tensor is half the sum; both forms evaluate alike.
        let mut leaves = HashMap::new();
        let vals = |k: f64| (0..6).map(|i| k + f64::from(i)).collect::<Vec<_>>();
        for (name, k) in [("r0:a", 0.5), ("r0:b", -1.25), ("r0:c", 2.0)] {
            leaves.insert(name.to_string(), Tensor::new(meta.clone(), vals(k)));
        }
        let sum: Vec<f64> = vals(0.5)
            .iter()
            .zip(vals(-1.25))
            .map(|(p, q)| (p + q) / 2.0)
            .collect();
        leaves.insert("r0:t".to_string(), Tensor::new(meta.clone(), sum));
        let value = |e: &RecExpr<Term>| eval(e, &leaves).expect("evaluates")[0].data.clone();
        assert_eq!(value(&chunks_e), value(&named.parse().expect("term")));
    }

    /// A factor over a sum of copies of one term is not spread into the copies: `sum(a, a) / 2`
    /// spread as `sum(a / 2, a / 2)` names `a / 2`, whose class holds a sum of copies in turn,
    /// a new multiple each iteration (a context-parallel MoE gradient's e-graph filled with
    /// `a / 2^k`). The factor still reaches `a` by the replicas' multiple: `sum(a, a) / 2 = a`.
    #[test]
    fn a_factor_is_not_spread_over_copies_of_one_term() {
        let mut g = Graph::new(Shapes::default());
        let meta = Meta::new(DType::F64, vec![2, 3]);
        g.analysis
            .leaves
            .insert(Symbol::from("%r0:a"), meta.clone());
        let (half, half_e) = add(&mut g, "(scale 1 2 (sum %r0:a %r0:a))");
        let (a, _) = add(&mut g, "%r0:a");
        g.rebuild();
        let pairs = [
            ("linear-over-sum", SCALE),
            ("sum-of-replicas", SUM),
            ("linear-over-scale", SCALE),
        ];
        for _ in 0..6 {
            apply_everywhere(&mut g, &pairs);
        }
        assert_eq!(g.find(half), g.find(a));
        for k in [4, 8, 16] {
            let deeper = format!("(scale 1 {k} %r0:a)");
            assert!(
                g.lookup_expr(&deeper.parse().expect("term")).is_none(),
                "{deeper}"
            );
        }
        let vals: Vec<f64> = (0..6).map(|i| 0.25 + f64::from(i)).collect();
        let leaves = HashMap::from([("r0:a".to_string(), Tensor::new(meta, vals.clone()))]);
        assert_eq!(*eval(&half_e, &leaves).expect("evaluates")[0].data, vals);
    }

    /// At the node cap a lemma's match adds nothing, where below it the same match adds its
    /// terms: one iteration stops growing the e-graph once it reaches the cap.
    #[test]
    fn lemmas_add_nothing_at_the_node_cap() {
        let rules: Vec<Rewrite<Term, Shapes>> = library()
            .into_iter()
            .filter(|l| l.name == "sum-of-replicas")
            .flat_map(|l| l.rewrites())
            .collect();
        let tripled = |capped: bool| {
            let mut g = Graph::new(Shapes::default());
            let meta = Meta::new(DType::F64, vec![2, 3]);
            g.analysis.leaves.insert(Symbol::from("%r0:a"), meta);
            add(&mut g, "(sum %r0:a %r0:a %r0:a)");
            g.rebuild();
            if capped {
                g.analysis.node_cap = g.total_size();
            }
            let runner = egg::Runner::default()
                .with_egraph(g)
                .with_iter_limit(1)
                .run(&rules);
            let three = "(scale 3 1 %r0:a)".parse().expect("term");
            runner.egraph.lookup_expr(&three).is_some()
        };
        assert!(tripled(false));
        assert!(!tripled(true));
    }

    /// Declares 0-d f64 leaves.
    fn scalar_leaves(g: &mut Graph, names: &[&str]) {
        for leaf in names {
            g.analysis
                .leaves
                .insert(Symbol::from(*leaf), Meta::new(DType::F64, vec![]));
        }
    }

    /// Two replicas' running sums found equal (one class, both definitions) make their
    /// per-layer atoms equal too: a combination over one replica's atoms merges with the same
    /// combination over the other's, though no class unites the atoms themselves.
    #[test]
    fn combinations_over_replica_atoms_merge_by_the_replicas_identity() {
        let mut g = Graph::new(Shapes::default());
        scalar_leaves(&mut g, &["%r0:a", "%r2:a", "%r1:b"]);
        let (half0, _) = add(&mut g, "(scale 1 2 %r0:a)");
        let (half2, _) = add(&mut g, "(scale 1 2 %r2:a)");
        g.union(half0, half2);
        let (over0, _) = add(&mut g, "(aten.add.Tensor (scale 1 4 %r0:a) %r1:b 1)");
        let (over2, _) = add(&mut g, "(aten.add.Tensor (scale 1 4 %r2:a) %r1:b 1)");
        let (other, _) = add(&mut g, "(aten.add.Tensor (scale 1 2 %r2:a) %r1:b 1)");
        g.rebuild();
        assert!(merge_linear_scalars(&mut g));
        assert_eq!(g.find(over0), g.find(over2));
        assert_ne!(g.find(over0), g.find(other));
    }

    /// A flat sum of the ranks' terms is expressed by the ranks' own running sums (each the
    /// sum of its terms), with one coefficient; a sum that mixes terms no candidate
    /// combination reaches is left alone.
    #[test]
    fn a_scalar_is_expressed_by_the_candidates_combination() {
        let mut g = Graph::new(Shapes::default());
        scalar_leaves(
            &mut g,
            &["%r0:a", "%r0:b", "%r1:a", "%r1:b", "%r0:s", "%r1:s"],
        );
        let mut candidates = Vec::new();
        for r in 0..2 {
            let (leaf, _) = add(&mut g, &format!("%r{r}:s"));
            let (def, _) = add(&mut g, &format!("(aten.add.Tensor %r{r}:a %r{r}:b 1)"));
            g.union(leaf, def);
            candidates.push(leaf);
        }
        let (root, root_e) = add(
            &mut g,
            "(sum (scale 1 2 %r0:a) (scale 1 2 %r0:b) (scale 1 2 %r1:a) (scale 1 2 %r1:b))",
        );
        let (mixed, _) = add(&mut g, "(sum %r0:a %r1:b)");
        g.rebuild();
        assert!(express_by_combination(&mut g, root, &candidates));
        let (want, _) = add(&mut g, "(scale 1 2 (sum %r0:s %r1:s))");
        g.rebuild();
        assert_eq!(g.find(root), g.find(want));
        assert!(!express_by_combination(&mut g, mixed, &candidates));
        // The built term evaluates to the root's value with the candidates' definitions.
        let mut leaves = HashMap::new();
        let mut x = 0.25;
        for key in ["r0:a", "r0:b", "r1:a", "r1:b"] {
            x += 0.5;
            leaves.insert(
                key.to_string(),
                Tensor::new(Meta::new(DType::F64, vec![]), vec![x]),
            );
        }
        for r in 0..2 {
            let s = leaves[&format!("r{r}:a")].data[0] + leaves[&format!("r{r}:b")].data[0];
            leaves.insert(
                format!("r{r}:s"),
                Tensor::new(Meta::new(DType::F64, vec![]), vec![s]),
            );
        }
        let value = |text: &str| {
            let e: RecExpr<Term> = text.parse().expect("term");
            eval(&e, &leaves).expect("evaluates")[0].data[0]
        };
        let built = value("(scale 1 2 (sum %r0:s %r1:s))");
        assert!((eval(&root_e, &leaves).expect("evaluates")[0].data[0] - built).abs() < 1e-12);
    }

    /// A class reached through a cycle of scalings (`b = 2a` beside `a = b/2`) still gets the
    /// combination of its grounded definition, whatever order the classes are met in: `a =
    /// sum(x, y)` merges with `x + y` built elsewhere, and `b` with `2x + 2y`.
    #[test]
    fn scalars_on_a_cycle_of_scalings_merge_by_their_definitions() {
        let mut g = Graph::new(Shapes::default());
        for leaf in ["%r0:x", "%r0:y"] {
            g.analysis
                .leaves
                .insert(Symbol::from(leaf), Meta::new(DType::F64, vec![]));
        }
        let (a, _) = add(&mut g, "(sum %r0:x %r0:y)");
        let (b, _) = add(&mut g, "(scale 2 1 (sum %r0:x %r0:y))");
        let (half_b, _) = add(&mut g, "(scale 1 2 (scale 2 1 (sum %r0:x %r0:y)))");
        g.union(a, half_b);
        let (added, _) = add(&mut g, "(aten.add.Tensor %r0:x %r0:y 1)");
        let (doubled, _) = add(
            &mut g,
            "(aten.add.Tensor (scale 2 1 %r0:x) (scale 2 1 %r0:y) 1)",
        );
        g.rebuild();
        assert!(merge_linear_scalars(&mut g));
        assert_eq!(g.find(a), g.find(added));
        assert_eq!(g.find(b), g.find(doubled));
        assert_ne!(g.find(a), g.find(b));
    }
}
