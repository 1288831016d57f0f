//! Extraction: the clean expressions of an e-class (leaves, layout operators, rank reductions),
//! smallest first with a preference for the earliest tensors, or the smallest unclean one; and
//! the groups of equal leaves and slices a relation carries to the next operator.

use super::report::render;
use crate::lemmas::{Graph, SCALE};
use crate::term::{is_leaf, is_op, Data, Term, CAT, GET, LIST, MAX, MIN, SLICE, SUM};
use egg::{Id, RecExpr, Symbol};
use std::collections::{BTreeSet, HashMap, HashSet};

/// The deepest expression [`extract`] builds.
pub(super) const MAX_EXTRACT_DEPTH: usize = 200;

/// The groups of leaves proven equal in `eg` that contain a leaf used by `exprs`.
pub(super) fn leaf_groups(eg: &Graph, exprs: &[RecExpr<Term>]) -> Vec<Vec<Symbol>> {
    let used: HashSet<Symbol> = exprs
        .iter()
        .flat_map(|e| e.as_ref().iter())
        .filter_map(|n| match n {
            Term::Op(s, k) if k.is_empty() && s.as_str().starts_with("%r") => Some(*s),
            _ => None,
        })
        .collect();
    let mut groups = Vec::new();
    for class in eg.classes() {
        let mut leaves: Vec<Symbol> = class
            .nodes
            .iter()
            .filter_map(|n| match n {
                Term::Op(s, k) if k.is_empty() && s.as_str().starts_with("%r") => Some(*s),
                _ => None,
            })
            .collect();
        if leaves.len() > 1 && leaves.iter().any(|l| used.contains(l)) {
            leaves.sort_by(|a, b| a.as_str().cmp(b.as_str()));
            groups.push(leaves);
        }
    }
    groups.sort_by(|a, b| a[0].as_str().cmp(b[0].as_str()));
    groups
}

/// The groups of equal slices of implementation tensors (`slice(d, a, b, leaf)`, or a leaf)
/// in `eg` that contain a slice used by `exprs` and at least one other such name.
pub(super) fn slice_groups(eg: &Graph, exprs: &[RecExpr<Term>]) -> Vec<Vec<RecExpr<Term>>> {
    let leaf_of = |id: Id| -> Option<Symbol> {
        eg[id].nodes.iter().find_map(|n| match n {
            Term::Op(s, k) if k.is_empty() && s.as_str().starts_with("%r") => Some(*s),
            _ => None,
        })
    };
    let num_of = |id: Id| -> Option<i64> {
        eg[id].nodes.iter().find_map(|n| match n {
            Term::Num(x) => Some(*x),
            _ => None,
        })
    };
    let slice_of = |d: i64, a: i64, b: i64, leaf: Symbol| {
        let mut e = RecExpr::default();
        let ids = [d, a, b].map(|x| e.add(Term::Num(x)));
        let l = e.add(Term::Op(leaf, vec![]));
        e.add(Term::Op(
            Symbol::from(SLICE),
            vec![ids[0], ids[1], ids[2], l],
        ));
        e
    };
    // A piece of a concatenation that is an implementation tensor is a slice of it: a chunk one
    // rank holds whole is a slice of another rank's tensor, and both names travel on.
    let mut piece_names: HashMap<Id, Vec<RecExpr<Term>>> = HashMap::new();
    for class in eg.classes() {
        let Some(leaf) = leaf_of(class.id) else {
            continue;
        };
        for n in &class.nodes {
            let Term::Op(s, k) = n else { continue };
            if !is_op!(s, CAT) || k.len() < 3 {
                continue;
            }
            let Some(d) = num_of(k[0]) else { continue };
            // A concatenation of whole rank tensors (a gather, a split's outputs) names nothing
            // new: its pieces are already tensors.
            if k[1..].iter().all(|&p| leaf_of(p).is_some()) {
                continue;
            }
            let mut off = 0i64;
            for &p in &k[1..] {
                let Some(len) = eg[p]
                    .data
                    .shape()
                    .and_then(|sh| sh.get(usize::try_from(d).ok()?).copied())
                else {
                    break;
                };
                let p = eg.find(p);
                piece_names
                    .entry(p)
                    .or_default()
                    .push(slice_of(d, off, off + len as i64, leaf));
                off += len as i64;
            }
        }
    }
    // A class's names: its leaves and its slices of leaves, as expressions.
    let names = |class: &egg::EClass<Term, Data>| -> Vec<RecExpr<Term>> {
        let mut out = piece_names.get(&class.id).cloned().unwrap_or_default();
        for n in &class.nodes {
            match n {
                Term::Op(s, k) if k.is_empty() && s.as_str().starts_with("%r") => {
                    let mut e = RecExpr::default();
                    e.add(Term::Op(*s, vec![]));
                    out.push(e);
                }
                Term::Op(s, k) if is_op!(s, SLICE) && k.len() == 4 => {
                    let (Some(d), Some(a), Some(b)) = (num_of(k[0]), num_of(k[1]), num_of(k[2]))
                    else {
                        continue;
                    };
                    if let Some(leaf) = leaf_of(k[3]) {
                        out.push(slice_of(d, a, b, leaf));
                        continue;
                    }
                    // A block of a rank's attention matrix: a slice of a slice of a leaf.
                    for inner in &eg[k[3]].nodes {
                        let Term::Op(s2, k2) = inner else { continue };
                        if !is_op!(s2, SLICE) || k2.len() != 4 {
                            continue;
                        }
                        let (Some(d2), Some(a2), Some(b2), Some(leaf)) =
                            (num_of(k2[0]), num_of(k2[1]), num_of(k2[2]), leaf_of(k2[3]))
                        else {
                            continue;
                        };
                        let mut e = slice_of(d2, a2, b2, leaf);
                        let x = Id::from(e.as_ref().len() - 1);
                        let ids = [d, a, b].map(|v| e.add(Term::Num(v)));
                        e.add(Term::Op(
                            Symbol::from(SLICE),
                            vec![ids[0], ids[1], ids[2], x],
                        ));
                        out.push(e);
                    }
                }
                _ => {}
            }
        }
        out
    };
    // The slices the expressions use.
    let mut used: HashSet<String> = HashSet::new();
    for e in exprs {
        let nodes = e.as_ref();
        for (i, n) in nodes.iter().enumerate() {
            let atom = matches!(n, Term::Op(s, k) if (is_op!(s, SLICE) && k.len() == 4)
                || (k.is_empty() && s.as_str().starts_with("%r")));
            if atom {
                let sub = RecExpr::from(nodes[..=i].to_vec());
                used.insert(render(&sub, i));
            }
        }
    }
    if used.is_empty() {
        return Vec::new();
    }
    let mut groups = Vec::new();
    for class in eg.classes() {
        let mut ns = names(class);
        let has_slice = ns.iter().any(|e| e.as_ref().len() > 1);
        if ns.len() < 2
            || !has_slice
            || !ns
                .iter()
                .any(|e| used.contains(&render(e, e.as_ref().len() - 1)))
        {
            continue;
        }
        ns.sort_by_key(|e| e.to_string());
        ns.dedup_by_key(|e| e.to_string());
        // Names within one rank are that rank's own definitions (a split's outputs): the next
        // operator rebuilds them. Names across ranks (a chunk received whole, or sent) are not.
        let ranks: BTreeSet<usize> = ns
            .iter()
            .filter_map(|e| {
                e.as_ref().iter().find_map(|n| match n {
                    Term::Op(s, k) if k.is_empty() => {
                        crate::term::parse_leaf(s.as_str()).map(|x| x.0)
                    }
                    _ => None,
                })
            })
            .collect();
        // Blocks of different tensors of one rank (a block of the forward's probabilities and
        // the same block the backward recomputes) are not: the next operator would need both
        // definitions to meet them again.
        let leaves: BTreeSet<String> = ns
            .iter()
            .filter_map(|e| {
                e.as_ref().iter().find_map(|n| match n {
                    Term::Op(s, k) if k.is_empty() && s.as_str().starts_with("%r") => {
                        Some(s.to_string())
                    }
                    _ => None,
                })
            })
            .collect();
        let blocks = ns.iter().all(|e| e.as_ref().len() > 1)
            && ns.iter().any(|e| {
                e.as_ref()
                    .iter()
                    .filter(|n| matches!(n, Term::Op(s, _) if is_op!(s, SLICE)))
                    .count()
                    > 1
            });
        if ns.len() > 1 && (ranks.len() > 1 || (blocks && leaves.len() > 1)) {
            groups.push(ns);
        }
    }
    groups
}

/// Whether class `root` has a clean expression or a multiple of one.
pub(super) fn relates_up_to_factor(eg: &Graph, root: Id) -> bool {
    let root = eg.find(root);
    !extract(eg, root, true).is_empty()
        || eg[root].nodes.iter().any(|n| {
            matches!(n, Term::Op(s, k) if is_op!(s, SCALE) && k.len() == 3
                && !extract(eg, k[2], true).is_empty())
        })
}

pub(super) const CLEAN_OPS: &[&str] = &[
    CAT,
    SUM,
    MAX,
    MIN,
    SLICE,
    GET,
    "aten.transpose.int",
    "aten.view.default",
    "aten.permute.default",
];

/// An extraction cost: the node count, then a tie-break that prefers, among equally small
/// expressions, the implementation tensors computed earliest and the lowest ranks (see
/// [`Shapes::preference`](crate::term::Shapes)). Without it ties follow the order terms
/// entered the e-graph, so one relation may name a piece through a rank's all-gathered copy
/// and its neighbour through the tensor itself, or a replica of one tensor-parallel group
/// beside a replica of another, and a later operator meets no impl operator reading them.
#[derive(Clone, Copy, PartialEq)]
struct Cost {
    nodes: f64,
    tie: u64,
}

impl Cost {
    const INF: Cost = Cost {
        nodes: f64::INFINITY,
        tie: 0,
    };

    fn new(nodes: f64) -> Cost {
        Cost { nodes, tie: 0 }
    }

    fn plus(self, other: Cost) -> Cost {
        Cost {
            nodes: self.nodes + other.nodes,
            tie: self.tie.saturating_add(other.tie),
        }
    }

    fn is_finite(self) -> bool {
        self.nodes.is_finite()
    }

    fn cmp(self, other: Cost) -> std::cmp::Ordering {
        self.nodes
            .total_cmp(&other.nodes)
            .then(self.tie.cmp(&other.tie))
    }

    fn min(self, other: Cost) -> Cost {
        if other.cmp(self).is_lt() {
            other
        } else {
            self
        }
    }
}

/// The size [`extract`] ranks a clean expression by (its cost's node count, without the
/// tie-break): a leaf or a layout operator counts one, a number or literal argument none, and
/// a constant subterm one per computed node plus one. `usize::MAX` for an expression that is
/// not clean. Reuse sorts a renamed relation by it as extraction would have.
pub(super) fn clean_size(e: &RecExpr<Term>) -> usize {
    fn cost(nodes: &[Term], i: usize, constant: bool) -> f64 {
        let n = &nodes[i];
        let Term::Op(s, kids) = n else {
            return 0.0;
        };
        if is_leaf(n) {
            return if constant { f64::INFINITY } else { 1.0 };
        }
        let sum = |constant: bool| -> f64 {
            kids.iter()
                .map(|&k| cost(nodes, usize::from(k), constant))
                .sum()
        };
        let literal = kids.is_empty() || is_op!(s, LIST);
        let konst = if is_op!(s, SUM) || is_op!(s, CAT) || is_op!(s, SCALE) {
            f64::INFINITY
        } else {
            sum(true) + if literal { 0.0 } else { 1.0 }
        };
        if constant {
            return konst;
        }
        let clean = if literal {
            0.0
        } else if CLEAN_OPS.contains(&s.as_str()) {
            sum(false) + 1.0
        } else {
            f64::INFINITY
        };
        clean.min(konst + 1.0)
    }
    let nodes = e.as_ref();
    if nodes.is_empty() {
        return usize::MAX;
    }
    let c = cost(nodes, nodes.len() - 1, false);
    if c.is_finite() {
        c as usize
    } else {
        usize::MAX
    }
}

/// Expressions of class `root`: the clean ones (leaves, layout operators, rank reductions,
/// constants), simplest first; or, with `clean_only == false`, the single cheapest expression.
pub(super) fn extract(eg: &Graph, root: Id, clean_only: bool) -> Vec<RecExpr<Term>> {
    const INF: Cost = Cost::INF;
    let classes: Vec<Id> = eg.classes().map(|c| c.id).collect();
    // cost[class] = [clean cost, any cost, constant cost]
    let mut cost: HashMap<Id, [Cost; 3]> = classes.iter().map(|&c| (c, [INF; 3])).collect();
    let node_cost = |cost: &HashMap<Id, [Cost; 3]>, n: &Term| -> [Cost; 3] {
        match n {
            Term::Num(_) => [Cost::new(0.0); 3],
            Term::Op(s, kids) => {
                if is_leaf(n) {
                    let c = Cost {
                        nodes: 1.0,
                        tie: eg.analysis.preference(*s),
                    };
                    return [c, c, INF];
                }
                let sum = |which: usize| -> Cost {
                    kids.iter()
                        .fold(Cost::new(0.0), |acc, k| acc.plus(cost[&eg.find(*k)][which]))
                };
                let literal = kids.is_empty() || is_op!(s, LIST);
                let one = Cost::new(1.0);
                let any = sum(1).plus(one);
                let konst = if is_op!(s, SUM) || is_op!(s, CAT) || is_op!(s, SCALE) {
                    INF
                } else {
                    sum(2).plus(if literal { Cost::new(0.0) } else { one })
                };
                let clean = if literal {
                    Cost::new(0.0)
                } else if CLEAN_OPS.contains(&s.as_str()) {
                    sum(0).plus(one)
                } else {
                    INF
                };
                [clean.min(konst.plus(one)), any, konst]
            }
        }
    };
    loop {
        let mut changed = false;
        for class in eg.classes() {
            let mut best = cost[&class.id];
            for n in &class.nodes {
                let c = node_cost(&cost, n);
                for which in 0..3 {
                    if c[which].cmp(best[which]).is_lt() {
                        best[which] = c[which];
                        changed = true;
                    }
                }
            }
            cost.insert(class.id, best);
        }
        if !changed {
            break;
        }
    }
    let pick = |cost: &HashMap<Id, [Cost; 3]>, c: Id, which: usize| -> Option<Term> {
        eg[c]
            .nodes
            .iter()
            .map(|n| (node_cost(cost, n)[which], n))
            .filter(|(k, _)| k.is_finite())
            .min_by(|a, b| a.0.cmp(b.0))
            .map(|(_, n)| n.clone())
    };
    fn build(
        eg: &Graph,
        c: Id,
        which: usize,
        pick: &dyn Fn(Id, usize) -> Option<Term>,
        r: &mut RecExpr<Term>,
        depth: usize,
    ) -> Option<Id> {
        if depth > MAX_EXTRACT_DEPTH {
            return None;
        }
        let n = pick(c, which)?;
        // Inside a clean expression, constant subterms are built as constants.
        let kid_which = |s: &str| {
            if which == 0 && !CLEAN_OPS.contains(&s) && !is_leaf(&n) {
                2
            } else {
                which
            }
        };
        let n2 = match &n {
            Term::Op(s, kids) => {
                let w = kid_which(s.as_str());
                let mut ids = Vec::new();
                for k in kids {
                    ids.push(build(
                        eg,
                        eg.find(*k),
                        if is_op!(s, LIST) { which.min(2) } else { w },
                        pick,
                        r,
                        depth + 1,
                    )?);
                }
                Term::Op(*s, ids)
            }
            t => t.clone(),
        };
        Some(r.add(n2))
    }
    let root = eg.find(root);
    let pickf = |c: Id, w: usize| {
        let p = pick(&cost, c, w);
        // Lists and literals are the same in every mode.
        p.or_else(|| pick(&cost, c, 1))
    };
    if !clean_only {
        let mut r = RecExpr::default();
        return build(eg, root, 1, &pickf, &mut r, 0)
            .map(|_| r)
            .into_iter()
            .collect();
    }
    if !cost[&root][0].is_finite() {
        return Vec::new();
    }
    // One expression per clean node of the root class: all leaves (replicas) and the best
    // composite of each kind.
    let mut out: Vec<(Cost, String, RecExpr<Term>)> = Vec::new();
    for n in &eg[root].nodes {
        let c = node_cost(&cost, n)[0];
        if !c.is_finite() {
            continue;
        }
        let mut r = RecExpr::default();
        let Term::Op(s, kids) = n else { continue };
        let mut ids = Vec::new();
        let w = if CLEAN_OPS.contains(&s.as_str()) || is_leaf(n) {
            0
        } else {
            2
        };
        let mut ok = true;
        for k in kids {
            match build(eg, eg.find(*k), w, &pickf, &mut r, 1) {
                Some(id) => ids.push(id),
                None => ok = false,
            }
        }
        if !ok {
            continue;
        }
        r.add(Term::Op(*s, ids));
        let key = r.to_string();
        if !out.iter().any(|o| o.1 == key) {
            out.push((c, key, r));
        }
    }
    out.sort_by(|a, b| a.0.nodes.total_cmp(&b.0.nodes).then_with(|| a.1.cmp(&b.1)));
    let leaves = out.iter().filter(|o| o.0.nodes <= 1.0).count();
    out.truncate(leaves.max(1) + 3);
    out.into_iter().map(|o| o.2).collect()
}
