//! Elementwise operators act piece by piece on concatenations (of the ranks' shards), their
//! other operands split alike or broadcast.

use super::{
    cat, cats, elementwise_roots, ew, is_one, node_sym, regroup, shape, sizes, slice, sums,
    symbols, with_kids, Graph, Lemma, ELEMENTWISE,
};
use crate::term::{sym, Data, Term};
use egg::{Id, Symbol};
use std::sync::Arc;

/// The lemmas of this family, in the library's order.
pub(super) fn lemmas() -> Vec<Lemma> {
    let mut l = Vec::new();
    // Interned once: the appliers compare the matched node's symbol with these on every match.
    let all_ew = symbols(&ELEMENTWISE.iter().map(|e| e.0).collect::<Vec<_>>());
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
            // RMSNorm's `add(mean, eps)` with the mean over the sequence shards: the literal
            // goes whole into every piece.
            (
                "(aten.add.Tensor (cat 1 %r0:m %r1:m) f:1e-6 1)",
                &[("m", "f64[2,2,1]")],
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
    // Elementwise operators against 0-d operands act through views.
    let roots2 = all_ew.clone();
    l.push(Lemma {
        name: "elementwise-with-scalars-through-view",
        doc: "f(view(x, s), c..) = view(f(x, c..), s) for an elementwise f whose other tensor operands are 0-d (or literals), where x is a cat in the e-graph or f(x, c..) is already there: XLA's relu is maximum(x, 0-d zero) over the spec's reshaped product, whose column shards the ranks compute unreshaped",
        roots: elementwise_roots(),
        examples: vec![
            (
                "(aten.maximum.default (aten.view.default (cat 1 %r0:a %r1:a) (list 2 2 4)) (aten.scalar_tensor.default f:0.0 dt:f64 none none none))",
                &[("a", "f64[4,2]")],
            ),
            (
                "(aten.mul.Tensor (aten.view.default (cat 0 %r0:a %r1:a) (list 12)) %r0:c)",
                &[("a", "f64[2,3]"), ("c", "f64[]")],
            ),
        ],
        requires: None,
        build: Arc::new(move |g, eclass, kids| {
            let Some(sym) = node_sym(g, eclass, kids, &roots2) else {
                return vec![];
            };
            let Some(&(_, tensors, _, _)) = ew(sym.as_str()) else {
                return vec![];
            };
            let Some(out) = shape(g, eclass) else {
                return vec![];
            };
            // The one operand of the output's shape; every other is 0-d, and one at least is
            // a 0-d tensor. Why the last: a unary call or one with literals only (`neg`,
            // `mul.Scalar`) over a view of a cat is everywhere in an attention backward, and
            // moving each through its view grew the e-graphs of a context-parallel Llama
            // iteration past the node limit (its ring attention stopped relating).
            let mut full = None;
            let mut scalar_tensor = false;
            for &t in tensors {
                let Some(&k) = kids.get(t) else { return vec![] };
                if matches!(g[k].data, Data::Literal | Data::Int(_)) {
                    continue;
                }
                match shape(g, k) {
                    Some(ts) if ts.is_empty() => scalar_tensor = true,
                    Some(ts) if ts == out && full.is_none() => full = Some(t),
                    _ => return vec![],
                }
            }
            let Some(t) = full.filter(|_| scalar_tensor) else {
                return vec![];
            };
            let views: Vec<(Id, Id)> = g[kids[t]]
                .nodes
                .iter()
                .filter_map(|n| match n {
                    Term::Op(s, k) if s.as_str() == "aten.view.default" && k.len() == 2 => {
                        Some((k[0], k[1]))
                    }
                    _ => None,
                })
                .take(3)
                .collect();
            let mut results = Vec::new();
            for (x, size) in views {
                // Only where the unviewed call exists (a rank computes it) or x is a cat (the
                // call splits further); anything else would only grow the e-graph.
                let node = with_kids(sym, kids, &[(t, x)]);
                if cats(g, x).is_empty() && g.lookup(node.clone()).is_none() {
                    continue;
                }
                let inner = g.add(node);
                results.push(g.add(Term::Op(sym!("aten.view.default"), vec![inner, size])));
            }
            results
        }),
    });
    l.push(add_regrouped());

    l
}

/// `(x + y) + z = x + (y + z)` and back, only where the graph already has the other grouping's
/// inner addition: a rank that adds the two backward contributions of its own shard first and
/// the incoming gradient after (`g_r + (a_r + b_r)`) against the spec's `(g + a) + b` (the
/// SequenceParallel block's residual gradient). Looked up, never built, so additions nobody
/// computes do not grow. Exact over the reals, which relations are stated over (as sums of
/// ranks in another order are); every operand has the output's shape and alpha is one.
fn add_regrouped() -> Lemma {
    Lemma {
        name: "add-regrouped",
        doc: "(x + y) + z = x + (y + z), and x + (y + z) = (x + y) + z, where the graph has the other grouping's inner addition (looked up, never built); operands of the output's shape, alpha one",
        roots: vec!["aten.add.Tensor".into()],
        examples: vec![
            // The rank's inner addition sits beside the spec's grouping.
            (
                "(cat 0 (aten.add.Tensor (aten.add.Tensor %r0:g %r0:a 1) %r0:b 1) (aten.add.Tensor %r0:a %r0:b 1))",
                &[("g", "f64[2,3]"), ("a", "f64[2,3]"), ("b", "f64[2,3]")],
            ),
            (
                "(cat 0 (aten.add.Tensor %r0:g (aten.add.Tensor %r0:a %r0:b 1) 1) (aten.add.Tensor %r0:g %r0:a 1))",
                &[("g", "f64[2,3]"), ("a", "f64[2,3]"), ("b", "f64[2,3]")],
            ),
        ],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            let Some(out) = shape(g, eclass) else { return vec![] };
            let full = |g: &Graph, id: Id| shape(g, id).as_deref() == Some(&out[..]);
            if !is_one(g, kids[2]) || !full(g, kids[0]) || !full(g, kids[1]) {
                return vec![];
            }
            let add = sym!("aten.add.Tensor");
            let one = kids[2];
            // The unit-alpha, full-shape additions in a class, as their operand pairs.
            let adds = |g: &Graph, id: Id| -> Vec<(Id, Id)> {
                g[id]
                    .nodes
                    .iter()
                    .filter_map(|n| match n {
                        Term::Op(s, c) if *s == add && c.len() == 3 && is_one(g, c[2]) => {
                            Some((c[0], c[1])).filter(|&(a, b)| full(g, a) && full(g, b))
                        }
                        _ => None,
                    })
                    .take(4)
                    .collect()
            };
            let mut res = Vec::new();
            // (x + y) + z -> x + (y + z), where y + z exists.
            for (x, y) in adds(g, kids[0]) {
                let z = kids[1];
                if let Some(yz) = g.lookup(Term::Op(add, vec![y, z, one])) {
                    res.push(g.add(Term::Op(add, vec![x, yz, one])));
                }
            }
            // x + (y + z) -> (x + y) + z, where x + y exists.
            for (y, z) in adds(g, kids[1]) {
                let x = kids[0];
                if let Some(xy) = g.lookup(Term::Op(add, vec![x, y, one])) {
                    res.push(g.add(Term::Op(add, vec![xy, z, one])));
                }
            }
            res
        }),
    }
}

/// Splits an elementwise call along output dim `od` into pieces of `szs`, operand `driver`
/// already split into `pieces`; other tensor operands are split likewise (broadcast ones kept).
#[allow(clippy::too_many_arguments)]
pub(super) fn split_elementwise(
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
        // A literal operand (RMSNorm's `add(mean, eps)`) is a scalar: every piece takes it
        // whole, like a broadcast one. A tensor whose shape is unknown stops the split.
        if matches!(g[kids[t]].data, Data::Literal | Data::Int(_)) {
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
