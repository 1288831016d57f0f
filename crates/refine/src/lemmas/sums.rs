//! Sums merged by the laws of addition alone, outside the runner: sums of the same terms in
//! another order, and 0-d values that are the same linear combination of the same atoms; and
//! the rewrites the engine applies at every node at once ([`apply_everywhere`]).

use super::{
    classes_of, int, is_one, op, root_arities, scale, Graph, Lemma, MAX_WIDE_ARITY, SCALE,
};
use super::{identities, library};
use crate::term::{is_op, sym, Term, CAT, MAX, MIN, SUM};
use egg::Id;
use std::collections::{HashMap, HashSet};

/// `sum(xs) + sum(ys)` as one sum: every term of `ys` joins a distinct term `x` of `xs` for
/// which the graph already has `x + y` (either operand order, alpha `one`), or is kept as a
/// term of its own; `None` when no term joins (then nothing is gained) or the sum would have
/// more terms than a lemma can match ([`MAX_WIDE_ARITY`]). Past 16 terms only
/// [`WideSearcher`]'s rewrites match the sum: a gradient norm's running total grows by one
/// term per parameter, and gpt2 has more than 16.
pub(super) fn pair_sums(g: &mut Graph, xs: &[Id], ys: &[Id], one: Id) -> Option<Id> {
    let add = sym!("aten.add.Tensor");
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
pub(super) type Linear = Vec<(Id, i128, i128)>;

/// Merges the classes of 0-d tensors that are the same linear combination of the same atoms
/// (classes without a `sum`, `scale` or unit-alpha addition of 0-d operands): a loss summed
/// over ranks as one flat sum by the spec and as nested reductions and additions by the
/// implementation (aux losses all-reduced over tp, then pp, added to each dp rank's loss,
/// then all-reduced over dp). See [`linear_forms`] for how each class's combination is found.
/// Only 0-d classes take part, so models whose reductions are all of tensors pay nothing.
pub(super) fn merge_linear_scalars(g: &mut Graph) -> bool {
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
pub(super) fn combine(parts: &[(i128, i128, Id)], forms: &HashMap<Id, Linear>) -> Option<Linear> {
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

pub(super) fn gcd128(a: i128, b: i128) -> i128 {
    if b == 0 {
        a.abs().max(1)
    } else {
        gcd128(b, a % b)
    }
}

/// Up to this many additions inside a sum are split into terms one at a time (every subset of
/// them splits in turn); more are split all at once.
pub(super) const MAX_SEPARATE_ADDS: usize = 3;
