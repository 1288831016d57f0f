//! Linear operators move through sums over ranks (partial sums) and through scale factors.

use super::{
    int, is_true, is_zero, linear_positions, node_sym, op, product_reduced, same_ratio, scale,
    scales, sums, with_kids, zero_fill, Graph, Lemma, ELEMENTWISE, LINEAR, SCALE, WIDENED,
};
use crate::term::{is_op, sym, Term, SUM};
use egg::{Id, Symbol};
use std::sync::Arc;

/// Whether class `id` holds a sum node (as `sums` reads them): a cheap test that
/// linear-over-sum has anything to build.
fn holds_sum(g: &Graph, id: Id) -> bool {
    g[id]
        .nodes
        .iter()
        .any(|n| matches!(n, Term::Op(s, _) if is_op!(s, SUM)))
}

/// Whether class `id` holds a scale node of three children (as `scales` reads them): a cheap
/// test that linear-over-scale has anything to build.
fn holds_scale(g: &Graph, id: Id) -> bool {
    g[id]
        .nodes
        .iter()
        .any(|n| matches!(n, Term::Op(s, k) if is_op!(s, SCALE) && k.len() == 3))
}

/// The lemmas of this family, in the library's order.
pub(super) fn lemmas() -> Vec<Lemma> {
    let mut l = Vec::new();
    // Linear operators move through sums over ranks and through scale factors.
    let lin_roots: Vec<String> = ELEMENTWISE
        .iter()
        .filter(|e| !e.2.is_empty())
        .map(|e| e.0.to_string())
        .chain(LINEAR.iter().map(|e| e.0.to_string()))
        .collect();
    // Interned once: the appliers compare the matched node's symbol with these on every match.
    let lr: Vec<Symbol> = ELEMENTWISE
        .iter()
        .filter(|e| !e.2.is_empty())
        .map(|e| Symbol::from(e.0))
        .chain(LINEAR.iter().map(|e| Symbol::from(e.0)))
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
            // Every right-hand side spreads over a sum node of an operand's class. Nearly every
            // match has none (16-rank DeepSeek: a million matches in its first 150 s of CPU, no
            // sum found for a non-additive one), and then finding the matched node's operator
            // among the roots was the lemma's whole cost.
            if !kids.iter().any(|&k| holds_sum(g, k)) {
                return vec![];
            }
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
            let sym = sym!("aten.scatter.src");
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
        name: "accumulate-over-sum",
        doc: "index_put(x, I, v, accumulate=True) and scatter_add(x, d, i, v) are linear in (x, v) together: with v = sum_k v_k and x = sum_k x_k (n terms each) or x a zero fill, they are sum_k f(x_k, v_k), x_k = x for a zero fill (zeros + zeros = zeros): experts' outputs, partial sums over tp, added into a zero buffer at their tokens' rows (the MoE combine)",
        roots: vec![
            "aten.index_put.default".into(),
            "aten.scatter_add.default".into(),
        ],
        examples: vec![
            (
                "(aten.index_put.default (aten.full.default (list 4 3) f:0.0 dt:f64 none dev b:false) (list %r0:i) (sum %r0:a %r1:a) b:true)",
                &[("i", "i64[3]<4"), ("a", "f64[3,3]")],
            ),
            (
                "(aten.index_put.default (sum %r0:x %r1:x) (list %r0:i) (sum %r0:a %r1:a) b:true)",
                &[("x", "f64[4,3]"), ("i", "i64[3]<4"), ("a", "f64[3,3]")],
            ),
            (
                "(aten.scatter_add.default (sum %r0:x %r1:x) 0 %r0:i (sum %r0:a %r1:a))",
                &[("x", "f64[4,3]"), ("i", "i64[2,3]<4"), ("a", "f64[2,3]")],
            ),
            (
                "(aten.scatter_add.default (aten.full.default (list 4 3) f:0.0 dt:f64 none dev b:false) 1 %r0:i (sum %r0:a %r1:a))",
                &[("i", "i64[4,2]<3"), ("a", "f64[4,2]")],
            ),
        ],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            let roots = [sym!("aten.index_put.default"), sym!("aten.scatter_add.default")];
            let Some(sym) = node_sym(g, eclass, kids, &roots) else {
                return vec![];
            };
            let (x_at, v_at) = if is_op!(sym, "aten.index_put.default") {
                // Without accumulate, later writes replace earlier ones: not linear.
                if kids.len() != 4 || !is_true(g, kids[3]) {
                    return vec![];
                }
                (0, 2)
            } else {
                if kids.len() != 4 {
                    return vec![];
                }
                (0, 3)
            };
            let zero_x = zero_fill(g, kids[x_at], 0).is_some();
            let mut out = Vec::new();
            for v in sums(g, kids[v_at]) {
                let xs: Vec<Id> = if zero_x {
                    vec![kids[x_at]; v.len()]
                } else {
                    match sums(g, kids[x_at]).into_iter().find(|s| s.len() == v.len()) {
                        Some(s) => s,
                        None => continue,
                    }
                };
                let terms: Vec<Id> = xs
                    .iter()
                    .zip(&v)
                    .map(|(&x, &vk)| g.add(with_kids(sym, kids, &[(x_at, x), (v_at, vk)])))
                    .collect();
                out.push(op(g, SUM, terms));
            }
            out
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
            // As for linear-over-sum: every right-hand side takes a scale node (of three
            // children, as `scales` reads them) from an operand's class.
            if !kids.iter().any(|&k| holds_scale(g, k)) {
                return vec![];
            }
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
            // A sibling is a scale node over x, so its class is among x's parents' (egg keeps
            // every node over a class among its parents, through unions). Without one outside
            // this class there is nothing to build; the full scan below is only for its order
            // (the first four in the e-graph's class order), and it was a tenth of 16-rank
            // DeepSeek's CPU.
            let me = g.find(eclass);
            let any_sibling = g[x].parents().any(|p| {
                let c = g.find(p);
                c != me
                    && g[c].nodes.iter().any(
                        |n| matches!(n, Term::Op(s, k) if is_op!(s, SCALE) && g.find(k[2]) == x),
                    )
            });
            if !any_sibling {
                return vec![];
            }
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

    l
}
