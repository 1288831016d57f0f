//! Elementwise operators through layouts, decided element by element.
//!
//! An elementwise operator over rearranged pieces of tensors (slices, views, permutes of them)
//! is the same rearrangement of the operator over the tensors whole wherever every operand's
//! elements sit where the whole operator reads them. Expert parallelism under context
//! parallelism needs it: the spec multiplies each expert's outputs by its gates, and the
//! relations of both are the ranks' sequence chunks, cut out of tensors the ranks multiply
//! whole (`r.mul = r.bmm * unsqueeze(r.gates)`), through different chains of views (the gates
//! have no hidden dim and an extra unit dim). The lemmas that move one layout operator at a
//! time meet such chains only where both operands are rearranged the same way; here each
//! operand's chain is reduced to a map from the result's coordinates to its base tensor's
//! elements, computed on the concrete shapes, and the maps are compared.
//!
//! A concatenation of such pieces is likewise a rearrangement of the concatenation of the
//! tensors whole, where the graph holds that as an implementation tensor (the ranks
//! reduce-scatter the gradient of their experts' gates: the spec's chunks of it are the ep
//! ranks' pieces side by side).
//!
//! Constrained like the other lemmas: the whole operator is only looked up, never built.

use super::{ew, int, int_list, node_sym, shape, Graph, Lemma};
use crate::term::{is_leaf, is_op, sym, Term, CAT, SLICE};
use egg::Id;
use std::sync::Arc;

/// The most elements a result may have for its maps to be compared (a map is computed per
/// element; the zoo's tiny shapes stay far below, a full-size model's tensors are skipped).
const MAX_ELEMENTS: usize = 1 << 14;

/// The largest e-graph (in egg's hash-cons entries) the lemmas act in. They are made for the
/// per-token arithmetic between the products (the experts' combine: 2.3k nodes); in an
/// attention block's e-graph the one-operator lemmas relate what these would, and every node
/// added counts against the node limit: llama cp=2's first softmax backward with square
/// blocks ends its fifth round at 19.9k of 20k nodes, and crossed the limit with these lemmas
/// acting up to 10k nodes (its first round has 9k). The gates' gradient of deepseek cp x ep
/// (9.4k nodes) is left to a later change for that reason.
const MAX_GRAPH_NODES: usize = 8_000;

/// The largest e-graph in which the lemmas look for a whole operator over one expert's slice
/// of a broadcast, or merge the pieces of single experts (see [`broadcast_wholes`] and
/// [`cat_wholes`]): the experts' gradients in deepseek cp=2 x ep=2 are related in e-graphs of
/// 9-11k nodes. Attention blocks have neither shape, so their e-graphs keep the limit above
/// (llama cp=2 with these lemmas acting everywhere up to 14k: 16 s -> 42 s and exit 3).
const MAX_GRAPH_NODES_EXPERTS: usize = 14_000;

/// How many layout operators a chain follows.
const MAX_DEPTH: usize = 6;

/// How many chains one class yields at most (a class holds several equal layouts).
const MAX_CHAINS: usize = 24;

/// The fewest layout operators a chain through an elementwise operator has (see [`mixed_hops`]).
/// Shorter chains, and chains of slices only or of no slice, are what the lemmas moving one
/// operator at a time build already: taking them too cost deepseek dp=2 x ep=2 a third more
/// time (13.4 -> 20 s), while deepseek cp=2 x ep=2 needs the chains of three and four steps
/// that cut its ranks' sequence chunks out of their whole products.
const MIN_CHAIN_STEPS: usize = 3;

/// What one layout operator does to a coordinate of its result.
#[derive(Clone, Debug)]
enum Move {
    /// A view: the same position in row-major order.
    View,
    /// A slice along `dim` from `start`.
    Slice { dim: usize, start: usize },
    /// A permutation: result dim `i` is input dim `p[i]`.
    Permute(Vec<usize>),
    /// A new unit dim at `dim`.
    Unsqueeze(usize),
    /// A broadcast: the input's unit dims repeat, missing leading dims are new.
    Expand,
}

/// One layout operator of a chain: the node (its tensor operand at `at`), what it does, and the
/// shapes of its input and result.
#[derive(Clone, Debug)]
struct Step {
    node: Term,
    at: usize,
    moves: Move,
    input: Vec<usize>,
    result: Vec<usize>,
}

fn dim(d: i64, rank: usize) -> Option<usize> {
    let d = if d < 0 { d + rank as i64 } else { d };
    usize::try_from(d).ok().filter(|&d| d < rank)
}

/// The layout operator a node is, if it is one: its tensor operand and what it does.
fn step_of(g: &Graph, node: &Term, result: &[usize]) -> Option<(Id, Step)> {
    let Term::Op(s, k) = node else { return None };
    let (at, moves) = if is_op!(s, "aten.view.default") && k.len() == 2 {
        (0, Move::View)
    } else if is_op!(s, SLICE) && k.len() == 4 {
        let d = dim(int(g, k[0])?, result.len())?;
        (
            3,
            Move::Slice {
                dim: d,
                start: usize::try_from(int(g, k[1])?).ok()?,
            },
        )
    } else if is_op!(s, "aten.transpose.int") && k.len() == 3 {
        let (a, b) = (
            dim(int(g, k[1])?, result.len())?,
            dim(int(g, k[2])?, result.len())?,
        );
        let mut p: Vec<usize> = (0..result.len()).collect();
        p.swap(a, b);
        (0, Move::Permute(p))
    } else if is_op!(s, "aten.permute.default") && k.len() == 2 {
        let p = int_list(g, k[1])?;
        let p: Vec<usize> = p
            .iter()
            .map(|&d| dim(d, result.len()))
            .collect::<Option<_>>()?;
        (0, Move::Permute(p))
    } else if is_op!(s, "aten.unsqueeze.default") && k.len() == 2 {
        (0, Move::Unsqueeze(dim(int(g, k[1])?, result.len())?))
    } else if is_op!(s, "aten.expand.default") && !k.is_empty() {
        (0, Move::Expand)
    } else {
        return None;
    };
    let input = shape(g, k[at])?;
    let step = Step {
        node: node.clone(),
        at,
        moves,
        input,
        result: result.to_vec(),
    };
    Some((g.find(k[at]), step))
}

/// The layout chains that end at `id`: (base, steps from `id` inward), the empty chain first.
/// Every layout node of a class is followed, up to [`MAX_DEPTH`] steps and [`MAX_CHAINS`]
/// bases visited.
fn chains(g: &Graph, id: Id) -> Vec<(Id, Vec<Step>)> {
    chains_to(g, id, |_, _| true)
}

/// The chains of [`chains`] whose base `keep` accepts (the steps are built for those only).
fn chains_to(g: &Graph, id: Id, keep: impl Fn(Id, &[Hop]) -> bool) -> Vec<(Id, Vec<Step>)> {
    let mut found = Vec::new();
    let mut path = Vec::new();
    let mut visited = 0;
    walk(
        g,
        g.find(id),
        &mut path,
        &mut visited,
        &mut |base, path: &[Hop]| {
            if !keep(base, path) {
                return;
            }
            let steps = path
                .iter()
                .map(|&(class, i)| {
                    let result = shape(g, class)?;
                    step_of(g, &g[class].nodes[i], &result).map(|(_, s)| s)
                })
                .collect::<Option<Vec<_>>>();
            if let Some(steps) = steps {
                found.push((base, steps));
            }
        },
    );
    found
}

/// A whole operator found in the graph: its class and its node's children.
type Whole = (Id, Vec<Id>);

/// One step of a walk: a class and the index of the layout node followed out of it.
type Hop = (Id, usize);

/// The operand a layout node rearranges (by its symbol alone).
fn layout_operand(node: &Term) -> Option<Id> {
    let Term::Op(s, k) = node else { return None };
    let at = if is_op!(s, SLICE) && k.len() == 4 {
        3
    } else if (is_op!(s, "aten.view.default")
        || is_op!(s, "aten.transpose.int")
        || is_op!(s, "aten.permute.default")
        || is_op!(s, "aten.unsqueeze.default")
        || is_op!(s, "aten.expand.default"))
        && !k.is_empty()
    {
        0
    } else {
        return None;
    };
    Some(k[at])
}

/// Visits the bases of the layout chains from `id` (depth first, the path as (class, node
/// index) pairs from the outside inward).
fn walk(
    g: &Graph,
    id: Id,
    path: &mut Vec<Hop>,
    visited: &mut usize,
    visit: &mut dyn FnMut(Id, &[Hop]),
) {
    if *visited >= MAX_CHAINS {
        return;
    }
    *visited += 1;
    visit(id, path);
    if path.len() >= MAX_DEPTH {
        return;
    }
    for (i, node) in g[id].nodes.iter().enumerate() {
        let Some(inner) = layout_operand(node).map(|x| g.find(x)) else {
            continue;
        };
        if inner == id || path.iter().any(|&(c, _)| c == inner) {
            continue;
        }
        path.push((id, i));
        walk(g, inner, path, visited, visit);
        path.pop();
    }
}

fn ravel(c: &[usize], shape: &[usize]) -> usize {
    c.iter().zip(shape).fold(0, |acc, (&i, &n)| acc * n + i)
}

fn unravel(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut c = vec![0; shape.len()];
    for (slot, &n) in c.iter_mut().zip(shape).rev() {
        if n > 0 {
            *slot = flat % n;
            flat /= n;
        }
    }
    c
}

/// The coordinate of a tensor of shape `own` that a result of shape `out` reads at `c` by
/// broadcasting (trailing dims aligned, unit dims repeated).
fn broadcast(c: &[usize], own: &[usize]) -> Option<Vec<usize>> {
    let lead = c.len().checked_sub(own.len())?;
    Some(
        own.iter()
            .enumerate()
            .map(|(j, &n)| if n == 1 { 0 } else { c[lead + j] })
            .collect(),
    )
}

/// The base tensor's element (row-major index) that a chain (steps from the outside inward)
/// reads at coordinate `c` of its outermost result; `None` where a step's shapes disagree.
fn base_element(steps: &[Step], mut c: Vec<usize>, base: &[usize]) -> Option<usize> {
    // A coordinate outside the outermost result reads nothing (a later step's offset could
    // otherwise carry it back in range).
    if let Some(outer) = steps.first() {
        if c.len() != outer.result.len() || c.iter().zip(&outer.result).any(|(i, n)| i >= n) {
            return None;
        }
    }
    for s in steps {
        c = match &s.moves {
            Move::View => unravel(ravel(&c, &s.result), &s.input),
            Move::Slice { dim, start } => {
                let mut c = c;
                *c.get_mut(*dim)? += start;
                c
            }
            Move::Permute(p) => {
                let mut inner = vec![0; c.len()];
                for (i, &pi) in p.iter().enumerate() {
                    *inner.get_mut(pi)? = c[i];
                }
                inner
            }
            Move::Unsqueeze(d) => {
                let mut c = c;
                (*d < c.len()).then(|| c.remove(*d))?;
                c
            }
            Move::Expand => broadcast(&c, &s.input)?,
        };
        if c.len() != s.input.len() || c.iter().zip(&s.input).any(|(i, n)| i >= n) {
            return None;
        }
    }
    (c.len() == base.len()).then(|| ravel(&c, base))
}

/// The base elements a chain reads at the coordinates `coords` (of its outermost result).
fn element_map(g: &Graph, base: Id, steps: &[Step], coords: &[Vec<usize>]) -> Option<Vec<usize>> {
    let bs = shape(g, base)?;
    coords
        .iter()
        .map(|c| base_element(steps, c.clone(), &bs))
        .collect()
}

/// A few coordinates spread over `n` (the first, the last and some between): chains that
/// read different elements almost always differ there, so only pairs that agree on them are
/// compared whole.
fn sample(n: usize) -> Vec<usize> {
    let mut at: Vec<usize> = (0..8).map(|k| k * (n - 1) / 7).collect();
    at.dedup();
    at
}

/// Whether two classes read the same elements of one base: `a` at coordinates `ca`, `b` at
/// `cb` (one to one), through some chain of each.
fn same_elements(g: &Graph, a: Id, ca: &[Vec<usize>], b: Id, cb: &[Vec<usize>]) -> bool {
    let picks = sample(ca.len());
    let (sa, sb): (Vec<Vec<usize>>, Vec<Vec<usize>>) = picks
        .iter()
        .map(|&i| (ca[i].clone(), cb[i].clone()))
        .unzip();
    let sampled = |id: Id, at: &[Vec<usize>]| -> Vec<(Id, Vec<Step>, Vec<usize>)> {
        chains(g, id)
            .into_iter()
            .filter_map(|(base, steps)| {
                let m = element_map(g, base, &steps, at)?;
                Some((base, steps, m))
            })
            .collect()
    };
    let left = sampled(a, &sa);
    if left.is_empty() {
        return false;
    }
    for (rb, rs, rm) in sampled(b, &sb) {
        for (lb, ls, lm) in &left {
            if *lb == rb
                && *lm == rm
                && element_map(g, *lb, ls, ca)
                    .is_some_and(|l| element_map(g, rb, &rs, cb) == Some(l))
            {
                return true;
            }
        }
    }
    false
}

/// `f(L(x), y) = L(f(x, y'))` for an elementwise `f` and a layout chain `L`, where the graph
/// already holds `f(x, y')` and `y` reads, at every coordinate, the element of the same base
/// tensor that `y'` contributes to `f(x, y')` at the coordinate `L` reads of `x`.
fn elementwise_through_layout() -> Lemma {
    let roots = super::elementwise_roots();
    let matched = super::symbols(&roots);
    Lemma {
        name: "elementwise-through-layout",
        doc: "f(L(x), y) = L(f(x, y')) for an elementwise f and a chain L of slices, views, permutes, unsqueezes and expands, when the graph holds f(x, y') and y and y' read the same elements of one tensor there (each operand's chain reduced to the base elements it reads, compared on the concrete shapes)",
        roots: roots.clone(),
        examples: vec![
            // A rank multiplies its experts' outputs by its gates whole; the spec multiplies
            // one sequence chunk of each, the gates viewed without their unit dim.
            (
                "(cat 0 (aten.mul.Tensor (aten.view.default (slice 2 0 2 (aten.view.default (slice 1 0 8 %r0:o) (list 2 2 4 3))) (list 2 4 3)) (aten.view.default (slice 2 0 2 (aten.view.default (slice 1 0 8 %r0:g) (list 2 2 4))) (list 2 4 1))) (slice 1 0 4 (aten.mul.Tensor %r0:o (aten.unsqueeze.default %r0:g 2))))",
                &[("o", "f64[2,16,3]"), ("g", "f64[2,16]")],
            ),
            // One expert's piece of the ranks' product over their experts: the tokens are
            // broadcast over the experts (`expand(unsqueeze(w, 0))`), the piece reads expert 1.
            (
                "(aten.add.Tensor (aten.mul.Tensor (aten.view.default (slice 1 0 2 (aten.view.default %r0:w (list 4 4 2))) (list 8 2)) (aten.view.default (slice 1 0 2 (aten.view.default (slice 0 1 2 %r0:g) (list 4 4 1))) (list 8 1))) (slice 0 0 8 (aten.view.default (aten.mul.Tensor (aten.expand.default (aten.unsqueeze.default %r0:w 0) (list 2 16 2)) %r0:g) (list 32 2))) 1)",
                &[("w", "f64[16,2]"), ("g", "f64[2,16,1]")],
            ),
            // Rows of a sum, viewed and transposed: both operands rearranged alike.
            (
                "(cat 0 (aten.add.Tensor (aten.transpose.int (aten.view.default (slice 0 2 6 %r0:a) (list 2 2 2)) 0 2) (aten.transpose.int (aten.view.default (slice 0 2 6 %r1:b) (list 2 2 2)) 0 2) 1) (aten.view.default (aten.add.Tensor %r0:a %r1:b 1) (list 4 2 2)))",
                &[("a", "f64[8,2]"), ("b", "f64[8,2]")],
            ),
        ],
        requires: None,
        build: Arc::new(move |g, eclass, kids| {
            let size = g.total_size();
            if size > MAX_GRAPH_NODES_EXPERTS {
                return vec![];
            }
            let plain = size <= MAX_GRAPH_NODES;
            let Some(sym) = node_sym(g, eclass, kids, &matched) else { return vec![] };
            let Some(&(_, tensors, _, _)) = ew(sym.as_str()) else { return vec![] };
            if tensors.len() < 2 {
                return vec![];
            }
            let Some(out) = shape(g, eclass) else { return vec![] };
            let n: usize = out.iter().product();
            if n == 0 || n > MAX_ELEMENTS {
                return vec![];
            }
            let mut results = Vec::new();
            // The bases the class is already a layout of: a whole operator among them is
            // related to it (a second chain to it, slices in another order, adds an equal term).
            let mut related: Option<Vec<Id>> = None;
            for &t in tensors {
                if shape(g, kids[t]).as_deref() != Some(&out[..]) {
                    continue;
                }
                let top = g.find(kids[t]);
                let bases = chains_to(g, kids[t], |b, path| {
                    b != top
                        && mixed_hops(g, path, MIN_CHAIN_STEPS)
                        && ((plain && !wholes(g, sym, kids, t, b).is_empty())
                            || !broadcast_wholes(g, sym, kids, t, b).is_empty())
                });
                for (base, steps) in bases {
                    // The whole operator over the base itself, or over the base broadcast
                    // along a new dim (one index of which the piece reads).
                    let plain_wholes = if plain { wholes(g, sym, kids, t, base) } else { vec![] };
                    let mut candidates: Vec<(Vec<Step>, Whole)> = plain_wholes
                        .into_iter()
                        .map(|w| (steps.clone(), w))
                        .collect();
                    let Some(base_shape) = shape(g, base) else { continue };
                    for b in broadcast_wholes(g, sym, kids, t, base) {
                        for j in 0..b.wide[b.dim] {
                            let mut longer = steps.clone();
                            longer.extend(select_index(g, &b, &base_shape, j));
                            candidates.push((longer, b.whole.clone()));
                        }
                    }
                    for (steps, whole) in candidates {
                        let known = related.get_or_insert_with(|| {
                            chains(g, eclass).into_iter().map(|(b, _)| b).collect()
                        });
                        if known.contains(&whole.0) {
                            continue;
                        }
                        let w = whole.0;
                        if let Some(id) =
                            rebuild_if_same(g, eclass, kids, tensors, t, &out, &steps, whole)
                        {
                            results.push(id);
                            known.push(w);
                        }
                    }
                }
            }
            results
        }),
    }
}

/// Whether a walk's path is one the lemmas moving one layout operator at a time do not already
/// take: `min_steps` steps at least, slices mixed with other layout operators (a chain of
/// slices only is a box of the operator's result, a chain without slices a rearrangement of
/// all of it; a concatenation's pieces cut out by a view and a slice are two). Decided from
/// the nodes' operators, before the steps are built.
fn mixed_hops(g: &Graph, path: &[Hop], min_steps: usize) -> bool {
    let slices = path
        .iter()
        .filter(|&&(c, i)| matches!(&g[c].nodes[i], Term::Op(s, _) if is_op!(s, SLICE)))
        .count();
    path.len() >= min_steps && slices > 0 && slices < path.len()
}

/// The classes of `sym` nodes with `base` at operand `t` and the other non-tensor operands of
/// `kids`: (class, the node's children).
fn wholes(g: &Graph, sym: egg::Symbol, kids: &[Id], t: usize, base: Id) -> Vec<Whole> {
    let Some(tensors) = ew(sym.as_str()).map(|e| e.1) else {
        return vec![];
    };
    let mut out = Vec::new();
    for p in g[base].parents() {
        let p = g.find(p);
        for node in &g[p].nodes {
            let Term::Op(s, k) = node else { continue };
            if *s != sym || k.len() != kids.len() || g.find(k[t]) != base {
                continue;
            }
            let same_args = (0..k.len())
                .filter(|i| !tensors.contains(i))
                .all(|i| g.find(k[i]) == g.find(kids[i]));
            if same_args && !out.iter().any(|(c, _)| *c == p) {
                out.push((p, k.clone()));
            }
        }
    }
    out
}

/// A whole operator over its base broadcast along one new dim: the node's class and children,
/// the new dim, and the shapes with that dim as a unit dim and broadcast.
struct Broadcast {
    whole: Whole,
    dim: usize,
    unit: Vec<usize>,
    wide: Vec<usize>,
}

/// The classes of `sym` nodes whose operand `t` is `base` broadcast along one new dim
/// (`expand(unsqueeze(base, d), ..)`, or a view adding the unit dim). The ranks multiply
/// their experts' inputs, the gathered tokens broadcast over the rank's experts, by the gates;
/// the spec's piece of one expert reads one index of that broadcast.
fn broadcast_wholes(
    g: &Graph,
    sym: egg::Symbol,
    kids: &[Id],
    t: usize,
    base: Id,
) -> Vec<Broadcast> {
    let Some(bs) = shape(g, base) else {
        return vec![];
    };
    let mut out: Vec<Broadcast> = Vec::new();
    let mut seen: Vec<Id> = Vec::new();
    for unit in g[base].parents() {
        let unit = g.find(unit);
        if seen.contains(&unit) {
            continue;
        }
        seen.push(unit);
        let Some(us) = shape(g, unit) else { continue };
        // `us` is `bs` with a 1 inserted at `d` (a view to it is an unsqueeze).
        let Some(d) = (0..us.len()).find(|&d| {
            us.len() == bs.len() + 1 && us[d] == 1 && us[..d] == bs[..d] && us[d + 1..] == bs[d..]
        }) else {
            continue;
        };
        let adds_unit = g[unit].nodes.iter().any(|n| {
            matches!(n, Term::Op(s, k) if (is_op!(s, "aten.unsqueeze.default") || is_op!(s, "aten.view.default"))
                && k.len() == 2 && g.find(k[0]) == base)
        });
        if !adds_unit {
            continue;
        }
        for wide in g[unit].parents() {
            let wide = g.find(wide);
            let expands = g[wide].nodes.iter().any(|n| {
                matches!(n, Term::Op(s, k) if is_op!(s, "aten.expand.default") && !k.is_empty() && g.find(k[0]) == unit)
            });
            let Some(ws) = shape(g, wide) else { continue };
            if !expands || ws.len() != us.len() || (0..ws.len()).any(|i| i != d && ws[i] != us[i]) {
                continue;
            }
            for whole in wholes(g, sym, kids, t, wide) {
                if !out.iter().any(|b| b.whole.0 == whole.0) {
                    out.push(Broadcast {
                        whole,
                        dim: d,
                        unit: us.clone(),
                        wide: ws.clone(),
                    });
                }
            }
        }
    }
    out
}

/// The steps that read index `j` of a broadcast whole as its base (outermost first): a view
/// dropping the unit dim, over a slice of that index.
fn select_index(g: &mut Graph, b: &Broadcast, base_shape: &[usize], j: usize) -> Vec<Step> {
    let whole = b.whole.0;
    let (d, start, end) = (
        super::num(g, b.dim as i64),
        super::num(g, j as i64),
        super::num(g, j as i64 + 1),
    );
    vec![
        Step {
            // The view's shape is given when the chain is built.
            node: Term::Op(sym!("aten.view.default"), vec![whole, whole]),
            at: 0,
            moves: Move::View,
            input: b.unit.clone(),
            result: base_shape.to_vec(),
        },
        Step {
            node: Term::Op(sym!(SLICE), vec![d, start, end, whole]),
            at: 3,
            moves: Move::Slice {
                dim: b.dim,
                start: j,
            },
            input: b.wide.clone(),
            result: b.unit.clone(),
        },
    ]
}

/// `steps` rebuilt over `whole` when every other tensor operand of the match reads what the
/// whole operator's does at the same elements.
#[allow(clippy::too_many_arguments)]
fn rebuild_if_same(
    g: &mut Graph,
    eclass: Id,
    kids: &[Id],
    tensors: &[usize],
    t: usize,
    out: &[usize],
    steps: &[Step],
    (whole, whole_kids): (Id, Vec<Id>),
) -> Option<Id> {
    // Already merged (the rewrite runs on every match in every round).
    if present(g, steps, whole) == Some(g.find(eclass)) {
        return None;
    }
    let base_shape = shape(g, whole_kids[t])?;
    if shape(g, whole)? != base_shape {
        return None;
    }
    // On a few coordinates first: most candidates fail there.
    let n: usize = out.iter().product();
    let all: Vec<usize> = (0..n).collect();
    for at in [sample(n), all] {
        let coords: Vec<Vec<usize>> = at.iter().map(|&f| unravel(f, out)).collect();
        // Where the chain reads the base, in the whole operator's coordinates.
        let mut inner: Vec<Vec<usize>> = Vec::with_capacity(coords.len());
        for c in &coords {
            let flat = base_element(steps, c.clone(), &base_shape)?;
            inner.push(unravel(flat, &base_shape));
        }
        for &u in tensors.iter().filter(|&&u| u != t) {
            let (mine, theirs) = (shape(g, kids[u])?, shape(g, whole_kids[u])?);
            let at_mine: Vec<Vec<usize>> = coords
                .iter()
                .map(|c| broadcast(c, &mine))
                .collect::<Option<_>>()?;
            let at_theirs: Vec<Vec<usize>> = inner
                .iter()
                .map(|c| broadcast(c, &theirs))
                .collect::<Option<_>>()?;
            if !same_elements(g, kids[u], &at_mine, whole_kids[u], &at_theirs) {
                return None;
            }
        }
    }
    build_chain(g, steps, whole)
}

/// The class of `steps` over `whole` if the graph holds every node of it.
fn present(g: &Graph, steps: &[Step], whole: Id) -> Option<Id> {
    let mut x = whole;
    for s in steps.iter().rev() {
        let shape_list = match s.moves {
            Move::View => {
                let nums = s
                    .result
                    .iter()
                    .map(|&n| g.lookup(Term::Num(n as i64)))
                    .collect::<Option<Vec<_>>>()?;
                Some(g.lookup(Term::Op(sym!(crate::term::LIST), nums))?)
            }
            _ => None,
        };
        x = g.find(g.lookup(step_node(s, x, shape_list)?)?);
    }
    Some(x)
}

/// `steps` built over `whole` (outermost first): the class of the outermost node.
fn build_chain(g: &mut Graph, steps: &[Step], whole: Id) -> Option<Id> {
    let mut x = whole;
    for s in steps.iter().rev() {
        let shape_list = matches!(s.moves, Move::View).then(|| super::list(g, &s.result));
        x = g.add(step_node(s, x, shape_list)?);
    }
    Some(x)
}

/// A step's node over `x` (a view to the step's result shape, given as `shape_list`).
fn step_node(s: &Step, x: Id, shape_list: Option<Id>) -> Option<Term> {
    let Term::Op(sym, k) = &s.node else {
        return None;
    };
    let mut k = k.clone();
    k[s.at] = x;
    if let Some(l) = shape_list {
        *k.get_mut(1)? = l;
    }
    Some(Term::Op(*sym, k))
}

/// `cat_d(L(b_1), .., L(b_k)) = L'(cat_e(b_1, .., b_k))` for one layout chain `L` over equally
/// shaped tensors, when the graph holds the implementation tensor `cat_e(b_1, .., b_k)`:
/// `L'` is `L` with the concatenated dim grown `k` times (checked element by element).
fn cat_through_layout() -> Lemma {
    Lemma {
        name: "cat-through-layout",
        doc: "cat_d(L(b_1), .., L(b_k)) = L'(cat_e(b_1, .., b_k)) for one chain L of views, slices, permutes and unsqueezes over equally shaped b_i, when the graph holds cat_e(b_1, .., b_k) as an implementation tensor: L' is L with dim e grown k times, and every element is checked to be read from the same place (the ranks' reduce-scatter of their experts' gate gradients, against the spec's chunks of them)",
        roots: vec![CAT.into()],
        examples: vec![
            (
                "(aten.add.Tensor (cat 2 (slice 1 2 4 (aten.view.default (slice 0 0 8 %r0:a) (list 2 4 2))) (slice 1 2 4 (aten.view.default (slice 0 0 8 %r1:a) (list 2 4 2)))) (slice 1 0 2 (aten.view.default %r0:w (list 2 4 4))) 1)",
                &[("a", "f64[16,2]"), ("w", "=(cat 1 (slice 0 0 8 %r0:a) (slice 0 0 8 %r1:a))")],
            ),
            // A view adding a unit dim before the concatenated dim: the dim that holds the
            // rows grows, not the unit dim.
            (
                "(aten.add.Tensor (cat 1 (aten.view.default (slice 1 2 4 (aten.view.default (slice 0 0 8 %r0:a) (list 2 4 2))) (list 1 2 2 2)) (aten.view.default (slice 1 2 4 (aten.view.default (slice 0 0 8 %r1:a) (list 2 4 2))) (list 1 2 2 2))) (slice 1 0 4 (aten.view.default %r0:w (list 1 8 2 2))) 1)",
                &[("a", "f64[16,2]"), ("w", "=(cat 0 (slice 0 0 8 %r0:a) (slice 0 0 8 %r1:a))")],
            ),
            // A run of two pieces, one expert of `p` each (the unit dim the inner view drops
            // comes back as the pieces' dim), beside a piece of another tensor.
            (
                "(cat 0 (aten.view.default (slice 0 0 2 (aten.view.default (slice 0 0 1 %r0:p) (list 4 2))) (list 1 2 2)) (aten.view.default (slice 0 0 2 (aten.view.default (slice 0 1 2 %r0:p) (list 4 2))) (list 1 2 2)) (aten.view.default (slice 0 0 2 (aten.view.default (slice 0 0 1 %r0:q) (list 4 2))) (list 1 2 2)))",
                &[("p", "f64[2,4,2]"), ("q", "f64[2,4,2]")],
            ),
        ],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            let size = g.total_size();
            if size > MAX_GRAPH_NODES_EXPERTS {
                return vec![];
            }
            let plain = size <= MAX_GRAPH_NODES;
            let Some(d) = int(g, kids[0]).and_then(|d| usize::try_from(d).ok()) else {
                return vec![];
            };
            let pieces = &kids[1..];
            let Some(out) = shape(g, eclass) else {
                return vec![];
            };
            let n: usize = out.iter().product();
            if pieces.len() < 2 || n == 0 || n > MAX_ELEMENTS || out.get(d).is_none_or(|&m| m % pieces.len() != 0) {
                return vec![];
            }
            // Equal pieces: the element check finds each coordinate's piece by division.
            let mut piece = out.clone();
            piece[d] /= pieces.len();
            if pieces.iter().any(|&p| shape(g, p).as_ref() != Some(&piece)) {
                return vec![];
            }
            // Every run of adjacent pieces that one chain cuts out of one whole: the run
            // becomes a layout of the whole (all pieces: the class itself, else a shorter
            // concatenation with the run in its place).
            let mut results = Vec::new();
            for start in 0..pieces.len() - 1 {
                let most = pieces.len() - start;
                let bases = chains_to(g, pieces[start], |b, path| {
                    mixed_hops(g, path, 2) && !cat_wholes(g, b, plain, pieces.len(), most).is_empty()
                });
                for (base, steps) in bases {
                    for (whole, wkids) in cat_wholes(g, base, plain, pieces.len(), most) {
                        let k = wkids.len() - 1;
                        let Some(run) = pieces.get(start..start + k) else { continue };
                        let mut run_out = piece.clone();
                        run_out[d] *= k;
                        let Some(lifted) = lift(g, &steps, &wkids, d, &run_out) else {
                            continue;
                        };
                        let rest = |id: Id| -> Option<Term> {
                            (k < pieces.len()).then(|| {
                                let mut around = kids[..=start].to_vec();
                                around.push(id);
                                around.extend(&pieces[start + k..]);
                                Term::Op(sym!(CAT), around)
                            })
                        };
                        let known = present(g, &lifted, whole).and_then(|id| match rest(id) {
                            None => Some(g.find(id)),
                            Some(node) => g.lookup(node).map(|c| g.find(c)),
                        });
                        if known == Some(g.find(eclass)) || !cat_reads_same(g, run, d, &run_out, &wkids, &lifted) {
                            continue;
                        }
                        let Some(id) = build_chain(g, &lifted, whole) else { continue };
                        match rest(id) {
                            None => results.push(id),
                            Some(node) => results.push(g.add(node)),
                        }
                    }
                }
            }
            results
        }),
    }
}

/// The implementation tensors that are concatenations, the first piece `base`, every piece
/// shaped alike: (class, the concatenation's children: its dim, then the pieces). A `cat` node
/// of the graph counts where it has all `n` pieces of the spec's; the slices of one index each
/// along a dim count where there are at most `most` of them (a run of the spec's pieces: one
/// expert each, cut out of a rank's product over its experts). Runs of wider slices are left
/// alone: they would merge the sequence chunks the attention lemmas expect apart. The `cat`
/// nodes are looked at only where `plain` (see [`MAX_GRAPH_NODES_EXPERTS`]).
fn cat_wholes(g: &Graph, base: Id, plain: bool, n: usize, most: usize) -> Vec<Whole> {
    let mut out = Vec::new();
    for p in g[base].parents().filter(|_| plain) {
        let p = g.find(p);
        if !g[p].nodes.iter().any(is_leaf) || out.iter().any(|(c, _)| *c == p) {
            continue;
        }
        for node in &g[p].nodes {
            let Term::Op(s, kids) = node else { continue };
            if is_op!(s, CAT) && kids.len() == n + 1 && g.find(kids[1]) == base {
                let first = shape(g, kids[1]);
                if first.is_some() && kids[2..].iter().all(|&b| shape(g, b) == first) {
                    out.push((p, kids.clone()));
                    break;
                }
            }
        }
    }
    // The base as the first of the unit slices of an implementation tensor along one dim: the
    // tensor is their concatenation.
    for node in &g[base].nodes {
        let Term::Op(s, kids) = node else { continue };
        if !is_op!(s, SLICE) || kids.len() != 4 || int(g, kids[1]) != Some(0) {
            continue;
        }
        let x = g.find(kids[3]);
        let Some(xs) = shape(g, x) else { continue };
        let Some(e) = int(g, kids[0]).and_then(|e| dim(e, xs.len())) else {
            continue;
        };
        let k = xs[e];
        if int(g, kids[2]) != Some(1)
            || !(2..=most).contains(&k)
            || !g[x].nodes.iter().any(is_leaf)
            || out.iter().any(|(c, _)| *c == x)
        {
            continue;
        }
        let slices = (0..k as i64)
            .map(|i| {
                let (a, b) = (g.lookup(Term::Num(i))?, g.lookup(Term::Num(i + 1))?);
                g.lookup(Term::Op(*s, vec![kids[0], a, b, x]))
            })
            .collect::<Option<Vec<Id>>>();
        let e = g.lookup(Term::Num(e as i64));
        if let (Some(slices), Some(e)) = (slices, e) {
            out.push((x, std::iter::once(e).chain(slices).collect()));
        }
    }
    out
}

/// The chain `steps` (outermost first, over the first piece of `wkids`) rebuilt over the whole
/// concatenation: the concatenated dim followed outward and grown `k` times, each step's
/// shapes with it; `None` where a step does not keep the pieces apart (a slice along that dim,
/// a view merging it into dims before it, an expand) or it does not end at dim `d` of `out`.
///
/// A view keeps the concatenated dim, splits it (its outermost part grows: `[16, 16] ->
/// [4, 4, 16]` over two pieces of 8 rows) or, where it is a unit dim the view drops, the
/// pieces' dim is inserted where it stood (one expert each, `[1, 16, 16] -> [16, 16]`,
/// concatenated: `[2, 16, 16] -> [2, 16, 16]`); the steps after it then carry that extra dim
/// (their dims renumbered, their nodes rebuilt), up to a view that brings a unit dim back
/// there.
fn lift(g: &mut Graph, steps: &[Step], wkids: &[Id], d: usize, out: &[usize]) -> Option<Vec<Step>> {
    let k = wkids.len() - 1;
    let mut at = usize::try_from(int(g, wkids[0])?).ok()?;
    let mut input = shape(g, wkids[1])?;
    *input.get_mut(at)? *= k;
    // Whether the concatenated dim is one the steps' own shapes lack (at `at` of the lifted
    // shapes, before the step's own dim `at`).
    let mut extra = false;
    let tail = |v: &[usize], i: usize| v[i..].iter().product::<usize>();
    let mut lifted = Vec::with_capacity(steps.len());
    for s in steps.iter().rev() {
        let mut node = s.node.clone();
        let mut moves = s.moves.clone();
        let mut result = s.result.clone();
        match &s.moves {
            Move::View => {
                // The result dims whose outer boundary is the concatenated dim's: more than
                // one where unit dims stand before it. A concatenated dim of more than one
                // row goes to the last of them (the dim that holds its rows, not a unit dim
                // the view adds before it); one that is a unit dim itself, or carried as an
                // extra dim, to the first (a unit dim there takes it).
                let mut at_boundary =
                    (0..result.len()).filter(|&j| tail(&result, j) == tail(&s.input, at));
                let j = if !extra && s.input[at] > 1 {
                    at_boundary.next_back()?
                } else {
                    at_boundary.next()?
                };
                // A unit dim where the concatenated dim stands takes it again.
                if result[j] == 1 {
                    extra = false;
                } else if !extra && s.input[at] == 1 {
                    extra = true;
                }
                at = j;
            }
            // In extra mode a step's own dims from `at` on sit one further out.
            Move::Slice { dim, start } if extra => {
                let Term::Op(sym, kids) = &s.node else {
                    return None;
                };
                let dim = dim + usize::from(*dim >= at);
                let mut kids = kids.clone();
                kids[0] = super::num(g, dim as i64);
                node = Term::Op(*sym, kids);
                moves = Move::Slice { dim, start: *start };
            }
            Move::Unsqueeze(u) if extra => {
                // A unit dim inserted at or before the concatenated dim moves it out.
                let u = if *u <= at {
                    at += 1;
                    *u
                } else {
                    u + 1
                };
                let Term::Op(sym, kids) = &s.node else {
                    return None;
                };
                node = Term::Op(*sym, vec![kids[0], super::num(g, u as i64)]);
                moves = Move::Unsqueeze(u);
            }
            Move::Permute(p) if extra => {
                // The concatenated dim stays where it is among the others.
                let mut q: Vec<usize> = p.iter().map(|&i| i + usize::from(i >= at)).collect();
                q.insert(at, at);
                let Term::Op(_, kids) = &s.node else {
                    return None;
                };
                let list = super::list(g, &q);
                node = Term::Op(sym!("aten.permute.default"), vec![kids[s.at], list]);
                moves = Move::Permute(q);
            }
            Move::Slice { dim, .. } if *dim == at => return None,
            Move::Slice { .. } => {}
            Move::Permute(p) => at = p.iter().position(|&i| i == at)?,
            Move::Unsqueeze(u) => {
                if *u <= at {
                    at += 1;
                }
            }
            Move::Expand => return None,
        }
        if extra {
            result.insert(at, k);
        } else {
            *result.get_mut(at)? *= k;
        }
        lifted.push(Step {
            node,
            at: s.at,
            moves,
            input: input.clone(),
            result: result.clone(),
        });
        input = result;
    }
    lifted.reverse();
    (at == d && input == out).then_some(lifted)
}

/// Whether the lifted chain over the concatenation reads, at every coordinate of the spec's
/// `cat_d(pieces)`, the element that piece reads there of its own base (checked on a few
/// coordinates, then on all).
fn cat_reads_same(
    g: &Graph,
    pieces: &[Id],
    d: usize,
    out: &[usize],
    wkids: &[Id],
    lifted: &[Step],
) -> bool {
    let (Some(e), Some(bs)) = (int(g, wkids[0]), shape(g, wkids[1])) else {
        return false;
    };
    let Ok(e) = usize::try_from(e) else {
        return false;
    };
    let mut ws = bs.clone();
    ws[e] *= pieces.len();
    let m = out[d] / pieces.len();
    let n: usize = out.iter().product();
    let all: Vec<usize> = (0..n).collect();
    for at in [sample(n), all] {
        // Per piece: its local coordinates and the base elements the lifted chain reads there.
        let mut per_piece: Vec<(Vec<Vec<usize>>, Vec<usize>)> =
            vec![(vec![], vec![]); pieces.len()];
        for &f in &at {
            let o = unravel(f, out);
            let i = o[d] / m;
            let Some(flat) = base_element(lifted, o.clone(), &ws) else {
                return false;
            };
            let mut wc = unravel(flat, &ws);
            if wc[e] / bs[e] != i {
                return false;
            }
            wc[e] %= bs[e];
            let mut local = o;
            local[d] %= m;
            per_piece[i].0.push(local);
            per_piece[i].1.push(ravel(&wc, &bs));
        }
        for (i, (coords, want)) in per_piece.iter().enumerate() {
            if coords.is_empty() {
                continue;
            }
            let target = g.find(wkids[i + 1]);
            let found = chains_to(g, pieces[i], |b, _| b == target)
                .iter()
                .any(|(b, steps)| element_map(g, *b, steps, coords).as_ref() == Some(want));
            if !found {
                return false;
            }
        }
    }
    true
}

/// The lemmas of this module.
pub(super) fn lemmas() -> Vec<Lemma> {
    vec![elementwise_through_layout(), cat_through_layout()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coordinates_round_trip() {
        let s = [2, 3, 4];
        for f in 0..24 {
            assert_eq!(ravel(&unravel(f, &s), &s), f);
        }
        assert_eq!(broadcast(&[1, 2, 3], &[3, 1]), Some(vec![2, 0]));
        assert_eq!(broadcast(&[1], &[2, 1]), None);
    }

    /// A coordinate past a slice's result reads nothing, though its offset would land inside
    /// the sliced tensor (a piece indexed past its end must not pass as another's element).
    #[test]
    fn coordinates_outside_the_result_read_nothing() {
        let slice = Step {
            node: Term::Num(0),
            at: 3,
            moves: Move::Slice { dim: 0, start: 1 },
            input: vec![4],
            result: vec![2],
        };
        let steps = [slice];
        assert_eq!(base_element(&steps, vec![1], &[4]), Some(2));
        assert_eq!(base_element(&steps, vec![2], &[4]), None);
    }

    /// The gates' chain reads the same tokens the outputs' chain does only at matching
    /// offsets: one sequence chunk of the outputs times another chunk of the gates is no
    /// slice of the rank's product, and the lemma leaves it alone; the matching chunk merges.
    #[test]
    fn operands_reading_other_elements_are_left_alone() {
        use crate::term::Shapes;
        use egg::{RecExpr, Runner};
        use shardproof_ir::DType;
        use shardproof_ops::Meta;
        let product = |gates_chunk: &str| {
            format!(
                "(aten.mul.Tensor (aten.view.default (slice 2 0 2 (aten.view.default (slice 1 0 8 %r0:o) (list 2 2 4 3))) (list 2 4 3)) (aten.view.default (slice 2 {gates_chunk} (aten.view.default (slice 1 0 8 %r0:g) (list 2 2 4))) (list 2 4 1)))"
            )
        };
        for (chunk, merges) in [("2 4", false), ("0 2", true)] {
            let mut g = Graph::new(Shapes::default());
            g.analysis
                .leaves
                .insert("%r0:o".into(), Meta::new(DType::F64, vec![2, 16, 3]));
            g.analysis
                .leaves
                .insert("%r0:g".into(), Meta::new(DType::F64, vec![2, 16]));
            let lhs: RecExpr<Term> = product(chunk).parse().unwrap();
            let whole: RecExpr<Term> = "(aten.mul.Tensor %r0:o (aten.unsqueeze.default %r0:g 2))"
                .parse()
                .unwrap();
            let root = g.add_expr(&lhs);
            g.add_expr(&whole);
            g.rebuild();
            let g = Runner::default()
                .with_egraph(g)
                .with_iter_limit(3)
                .run(&elementwise_through_layout().rewrites())
                .egraph;
            let slices = g[g.find(root)]
                .nodes
                .iter()
                .any(|n| !matches!(n, Term::Op(s, _) if s.as_str() == "aten.mul.Tensor"));
            assert_eq!(slices, merges, "gates chunk {chunk}");
        }
    }
}
