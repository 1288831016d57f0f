//! Lemmas for mixture-of-experts training (DeepSeek-style routers under tp, ep and dp).
//!
//! The MoE backward mixes partial sums with replicated terms: under tensor parallelism the
//! router's gradient is partial over tp (the gates weight the experts' tp-partial outputs),
//! while the auxiliary load-balancing loss, computed in full on every rank, contributes its
//! gradient scaled by 1/tp on each rank. Each rank adds its replicated share to its partial
//! sum, and the all-reduce recombines them.

use super::{
    cat, cats, int, int_list, is_one, is_zero, node_sym, op, scale, scales, shape, sizes, sums,
    with_kids, Graph, Lemma,
};
use crate::term::{Term, SUM};
use egg::{Id, Symbol};
use std::sync::Arc;

/// The MoE lemmas.
pub(super) fn lemmas() -> Vec<Lemma> {
    vec![
        add_replicated_into_sum(),
        gather_over_cat(),
        sum_of_padded_pieces(),
        scatter_into_zeros_over_scale(),
    ]
}

/// `sum(x_1..x_n) + n * y = sum(x_1 + y, .., x_n + y)`.
fn add_replicated_into_sum() -> Lemma {
    Lemma {
        name: "add-replicated-into-sum",
        doc: "sum(x_1..x_n) + n * y = sum(x_1 + y, .., x_n + y): every rank adds its share y of a replicated term to its partial sum before the reduction (the MoE auxiliary-loss gradient divided by tp)",
        roots: vec!["aten.add.Tensor".into()],
        examples: vec![
            (
                "(aten.add.Tensor (sum %r0:a %r1:a) (scale 2 1 %r0:b) 1)",
                &[("a", "f64[2,3]"), ("b", "f64[2,3]")],
            ),
            (
                "(aten.add.Tensor (scale 3 1 %r0:b) (sum %r0:a %r1:a %r2:a) 1)",
                &[("a", "f64[2,3]"), ("b", "f64[3]")],
            ),
        ],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            if node_sym(g, eclass, kids, &["aten.add.Tensor"]).is_none() || !is_one(g, kids[2]) {
                return vec![];
            }
            let mut out = Vec::new();
            for (s, r, sum_first) in [(kids[0], kids[1], true), (kids[1], kids[0], false)] {
                for terms in sums(g, s).into_iter().take(2) {
                    let n = terms.len() as i64;
                    let Some(y) = replicated_share(g, r, n) else { continue };
                    let parts: Vec<Id> = terms
                        .iter()
                        .map(|&x| {
                            // The operands keep their order: the ranks compute it that way.
                            let pair = if sum_first { vec![x, y, kids[2]] } else { vec![y, x, kids[2]] };
                            op(g, "aten.add.Tensor", pair)
                        })
                        .collect();
                    out.push(op(g, SUM, parts));
                }
            }
            out
        }),
    }
}

/// The `y` of a class holding `n * y`.
fn replicated_share(g: &Graph, id: Id, n: i64) -> Option<Id> {
    scales(g, id)
        .into_iter()
        .find(|&(p, q, _)| q != 0 && p == n * q)
        .map(|(_, _, y)| y)
}

/// `gather(cat_d(x_i), k, cat_d(t_i)) = cat_d(gather(x_i, k, t_i))` for `d != k`.
fn gather_over_cat() -> Lemma {
    Lemma {
        name: "gather-over-cat",
        doc: "gather(cat_d(x_i), k, cat_d(t_i)) = cat_d(gather(x_i, k, t_i)) for d != k, the source and the indices split alike along d (each token picks its routed experts' gate gradients from its own row)",
        roots: vec!["aten.gather.default".into()],
        examples: vec![
            (
                "(aten.gather.default (cat 0 %r0:x %r1:x) 1 (cat 0 %r0:t %r1:t) b:false)",
                &[("x", "f64[3,4]"), ("t", "i64[3,2]<4")],
            ),
            (
                "(aten.gather.default (cat 1 %r0:x %r1:y) 0 (cat 1 %r0:t %r1:u) b:false)",
                &[("x", "f64[3,2]"), ("y", "f64[3,1]"), ("t", "i64[2,2]<3"), ("u", "i64[2,1]<3")],
            ),
        ],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let (Some(src), Some(index), Some(k)) = (shape(g, kids[0]), shape(g, kids[2]), int(g, kids[1])) else {
                return vec![];
            };
            let k = if k < 0 { k + src.len() as i64 } else { k };
            let mut out = Vec::new();
            for (d, ts) in cats(g, kids[2]) {
                // The pieces of x must start where the index pieces do: equal extents along d.
                if d as i64 == k || src.get(d) != index.get(d) {
                    continue;
                }
                let Some(szs) = sizes(g, &ts, d) else { continue };
                // Only pieces present: the source already split alike (no slices built).
                let Some((_, xs)) = cats(g, kids[0])
                    .into_iter()
                    .find(|(e, xs)| *e == d && sizes(g, xs, d).as_deref() == Some(&szs[..]))
                else {
                    continue;
                };
                let parts: Vec<Id> = xs
                    .iter()
                    .zip(&ts)
                    .map(|(&x, &t)| op(g, "aten.gather.default", vec![x, kids[1], t, kids[3]]))
                    .collect();
                out.push(cat(g, d, parts));
            }
            out
        }),
    }
}

/// `sum_i pad(x_i)` with zero pads that place the pieces side by side along one dim is their
/// concatenation.
fn sum_of_padded_pieces() -> Lemma {
    Lemma {
        name: "sum-of-padded-pieces",
        doc: "sum_i constant_pad_nd(x_i, p_i, 0) = cat_d(x_i) when every p_i pads only dim d and the pads put the pieces side by side, covering d once (expert-parallel ranks zero-pad their experts' columns and reduce-scatter)",
        roots: vec![SUM.into()],
        examples: vec![
            (
                "(sum (aten.constant_pad_nd.default %r0:a (list 0 2) f:0.0) (aten.constant_pad_nd.default %r1:a (list 2 0) f:0.0))",
                &[("a", "f64[3,2]")],
            ),
            (
                "(sum (aten.constant_pad_nd.default %r1:b (list 0 0 2 0) 0) (aten.constant_pad_nd.default %r0:a (list 0 0 0 1) 0))",
                &[("a", "f64[2,3]"), ("b", "f64[1,3]")],
            ),
        ],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            let Some(out_shape) = shape(g, eclass) else { return vec![] };
            // (dim, offset, piece) of every operand.
            let mut placed: Vec<(usize, usize, Id)> = Vec::new();
            for &k in kids {
                let Some(p) = zero_pad_placement(g, k, &out_shape) else { return vec![] };
                placed.push(p);
            }
            let d = placed[0].0;
            if placed.iter().any(|p| p.0 != d) {
                return vec![];
            }
            placed.sort_by_key(|p| p.1);
            let mut at = 0;
            for &(_, off, x) in &placed {
                let Some(w) = shape(g, x).and_then(|s| s.get(d).copied()) else { return vec![] };
                if off != at {
                    return vec![];
                }
                at += w;
            }
            if at != out_shape[d] {
                return vec![];
            }
            let pieces = placed.iter().map(|p| p.2).collect();
            vec![cat(g, d, pieces)]
        }),
    }
}

/// A class holding `constant_pad_nd(x, p, 0)` that pads only one dim `d` (and keeps the other
/// extents of `out`): `(d, left pad, x)`.
fn zero_pad_placement(g: &Graph, id: Id, out: &[usize]) -> Option<(usize, usize, Id)> {
    g[id].nodes.iter().find_map(|n| {
        let Term::Op(s, k) = n else { return None };
        if s.as_str() != "aten.constant_pad_nd.default" || k.len() != 3 || !is_zero(g, k[2]) {
            return None;
        }
        let pads = int_list(g, k[1])?;
        let x = shape(g, k[0])?;
        if x.len() != out.len() || pads.len() % 2 != 0 || pads.len() / 2 > x.len() {
            return None;
        }
        let mut dim = None;
        for (j, pair) in pads.chunks(2).enumerate() {
            if pair[0] < 0 || pair[1] < 0 {
                return None; // a negative pad crops
            }
            if pair[0] != 0 || pair[1] != 0 {
                if dim.is_some() {
                    return None;
                }
                dim = Some((x.len() - 1 - j, pair[0] as usize));
            }
        }
        let (d, left) = dim?;
        let same_elsewhere = (0..x.len()).all(|e| e == d || x[e] == out[e]);
        same_elsewhere.then_some((d, left, k[0]))
    })
}

/// `scatter(zeros, d, i, c * x) = c * scatter(zeros, d, i, x)`.
fn scatter_into_zeros_over_scale() -> Lemma {
    Lemma {
        name: "scatter-into-zeros-over-scale",
        doc: "scatter(zeros, d, i, c * x) = c * scatter(zeros, d, i, x): scattering into a zero fill is linear in the source (the gate gradients of data-parallel ranks, scaled by 1/dp)",
        roots: vec!["aten.scatter.src".into()],
        examples: vec![(
            "(aten.scatter.src (aten.full.default (list 2 4) f:0.0 dt:f64 none dev b:false) 1 %r0:i (scale 1 2 %r0:a))",
            &[("i", "i64[2,2]<4"), ("a", "f64[2,2]")],
        )],
        requires: None,
        build: Arc::new(|g, _, kids| {
            if !is_zero_fill(g, kids[0]) {
                return vec![];
            }
            let sym = Symbol::from("aten.scatter.src");
            scales(g, kids[3])
                .into_iter()
                .map(|(p, q, x)| {
                    let inner = g.add(with_kids(sym, kids, &[(3, x)]));
                    scale(g, p, q, inner)
                })
                .collect()
        }),
    }
}

/// Whether a class is a fill with zeros (`full(shape, 0)`).
fn is_zero_fill(g: &Graph, id: Id) -> bool {
    g[id].nodes.iter().any(|n| {
        matches!(n, Term::Op(s, k) if s.as_str() == "aten.full.default" && k.len() > 1 && is_zero(g, k[1]))
    })
}
