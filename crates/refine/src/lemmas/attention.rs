//! Fused attention kernels split over heads (or batch), and division as a product with the
//! reciprocal.
//!
//! PyTorch's CPU attention kernel computes each (batch, head) block on its own: its causal mask
//! depends only on the query and key positions, its default scale only on the head size, so
//! tensor parallelism's head shards attend exactly as the whole tensor's heads do.

use super::{cat, cats, int, is_none, is_zero, op, shape, sizes, Graph, Lemma};
use crate::term::{is_op, Term, GET};
use egg::{Id, Symbol};
use std::sync::Arc;

/// One fused attention kernel: its name, the operand positions split alike, the dropout
/// probability's position, the mask's, and the outputs split along the same dim.
type Fused = (&'static str, &'static [usize], usize, usize, &'static [i64]);

/// The CPU flash-attention kernel and its backward (see [`Fused`]).
const FUSED: &[Fused] = &[
    (
        "aten._scaled_dot_product_flash_attention_for_cpu.default",
        &[0, 1, 2],
        3,
        5,
        &[0, 1],
    ),
    (
        "aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
        &[0, 1, 2, 3, 4, 5],
        6,
        8,
        &[0, 1, 2],
    ),
];

/// The lemmas of this family, in the library's order.
pub(super) fn lemmas() -> Vec<Lemma> {
    vec![fused_attention_over_heads(), div_as_reciprocal_product()]
}

fn fused_attention_over_heads() -> Lemma {
    Lemma {
        name: "fused-attention-over-heads",
        doc: "get(k, flash_attention_for_cpu(cat_d(q_i), cat_d(k_i), cat_d(v_i), p = 0, causal, mask = None, scale)) = cat_d(get(k, flash_attention_for_cpu(q_i, k_i, v_i, ..))) for d a batch or head dim (not the last two) and the pieces of equal sizes in every operand; likewise its backward with the gradient, output and logsumexp split alike: every (batch, head) block attends on its own (the causal mask depends on positions only, the default scale on the head size only)",
        roots: vec![GET.into()],
        examples: vec![
            (
                "(get 0 (aten._scaled_dot_product_flash_attention_for_cpu.default (cat 1 %r0:q %r1:q) (cat 1 %r0:k %r1:k) (cat 1 %r0:v %r1:v) f:0.0 b:true none none))",
                &[("q", "f64[2,1,3,2]"), ("k", "f64[2,1,3,2]"), ("v", "f64[2,1,3,2]")],
            ),
            (
                "(get 1 (aten._scaled_dot_product_flash_attention_for_cpu.default (cat 0 %r0:q %r1:q) (cat 0 %r0:k %r1:k) (cat 0 %r0:v %r1:v) f:0.0 b:false none f:0.5))",
                &[("q", "f64[1,2,3,2]"), ("k", "f64[1,2,4,2]"), ("v", "f64[1,2,4,2]")],
            ),
            (
                "(get 1 (aten._scaled_dot_product_flash_attention_for_cpu_backward.default (cat 1 %r0:g %r1:g) (cat 1 %r0:q %r1:q) (cat 1 %r0:k %r1:k) (cat 1 %r0:v %r1:v) (cat 1 %r0:o %r1:o) (cat 1 %r0:l %r1:l) f:0.0 b:true none none))",
                &[
                    ("g", "f64[2,1,3,2]"),
                    ("q", "f64[2,1,3,2]"),
                    ("k", "f64[2,1,3,2]"),
                    ("v", "f64[2,1,3,2]"),
                    ("o", "f64[2,1,3,2]"),
                    ("l", "f64[2,1,3]"),
                ],
            ),
        ],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let Some(k) = int(g, kids[0]) else {
                return vec![];
            };
            let mut out = Vec::new();
            for n in g[kids[1]].nodes.clone() {
                let Term::Op(s, ck) = n else { continue };
                let Some(&(_, split, dropout, mask, outputs)) =
                    FUSED.iter().find(|f| s.as_str() == f.0)
                else {
                    continue;
                };
                if ck.len() <= mask
                    || !outputs.contains(&k)
                    || !is_zero(g, ck[dropout])
                    || !is_none(g, ck[mask])
                {
                    continue;
                }
                let Some(rank) = shape(g, ck[split[0]]).map(|x| x.len()) else {
                    continue;
                };
                for (d, first) in cats(g, ck[split[0]]) {
                    if d + 2 >= rank {
                        continue; // the sequence and head-size dims mix across positions
                    }
                    if let Some(parts) = per_piece(g, s, &ck, split, d, &first, kids[0]) {
                        out.push(cat(g, d, parts));
                    }
                }
            }
            out
        }),
    }
}

/// Output `k` of `sym(call)` on each piece, every operand in `split` cut along `d` into pieces
/// of `first`'s sizes: only where each already is such a cat in the e-graph (slicing an operand
/// that is not would only grow the e-graph with terms no rank computes).
fn per_piece(
    g: &mut Graph,
    sym: Symbol,
    call: &[Id],
    split: &[usize],
    d: usize,
    first: &[Id],
    k: Id,
) -> Option<Vec<Id>> {
    let szs = sizes(g, first, d)?;
    let mut operands: Vec<Vec<Id>> = vec![first.to_vec()];
    for &at in &split[1..] {
        let pieces = cats(g, call[at])
            .into_iter()
            .find(|(e, ps)| *e == d && sizes(g, ps, d).as_deref() == Some(&szs[..]))
            .map(|(_, ps)| ps)?;
        operands.push(pieces);
    }
    Some(
        (0..szs.len())
            .map(|i| {
                let mut kids = call.to_vec();
                for (j, &at) in split.iter().enumerate() {
                    kids[at] = operands[j][i];
                }
                let c = g.add(Term::Op(sym, kids));
                op(g, GET, vec![k, c])
            })
            .collect(),
    )
}

/// Whether a class is the number one: a literal, or a fill or 0-d tensor of ones (how an
/// imported HLO constant reaches the e-graph).
fn one(g: &Graph, id: Id) -> bool {
    super::is_one(g, id)
        || g[id].nodes.iter().any(|n| match n {
            Term::Op(s, k) if is_op!(s, "aten.full.default") && k.len() >= 2 => {
                super::is_one(g, k[1])
            }
            Term::Op(s, k) if is_op!(s, "aten.scalar_tensor.default") && !k.is_empty() => {
                super::is_one(g, k[0])
            }
            _ => false,
        })
}

/// The reciprocal forms of a class: `b` for each `reciprocal(b)` or `div(1, b)` in it.
fn reciprocals(g: &Graph, id: Id) -> Vec<Id> {
    g[id]
        .nodes
        .iter()
        .filter_map(|n| match n {
            Term::Op(s, k) if is_op!(s, "aten.reciprocal.default") && k.len() == 1 => Some(k[0]),
            Term::Op(s, k) if is_op!(s, "aten.div.Tensor") && k.len() == 2 && one(g, k[0]) => {
                Some(k[1])
            }
            _ => None,
        })
        .take(3)
        .collect()
}

/// The elementwise layout operators a reciprocal moves through: `f(reciprocal(b)) =
/// reciprocal(f(b))` for each, as they only move or repeat elements.
const LAYOUT: &[&str] = &[
    "aten.view.default",
    "aten.expand.default",
    "aten.permute.default",
    "aten.transpose.int",
];

/// `d` for every way the class is `reciprocal(d)`: directly, or through up to `depth` layout
/// operators (`view(1 / b, s)` is `reciprocal(view(b, s))`), the denominator built with the same
/// layout over `b`.
fn denominators(g: &mut Graph, id: Id, depth: usize) -> Vec<Id> {
    let mut out = reciprocals(g, id);
    if depth == 0 {
        return out;
    }
    let layouts: Vec<(Symbol, Vec<Id>)> = g[id]
        .nodes
        .iter()
        .filter_map(|n| match n {
            Term::Op(s, k) if LAYOUT.contains(&s.as_str()) && !k.is_empty() => {
                Some((*s, k.clone()))
            }
            _ => None,
        })
        .take(3)
        .collect();
    for (s, k) in layouts {
        for b in denominators(g, k[0], depth - 1) {
            let mut k = k.clone();
            k[0] = b;
            out.push(g.add(Term::Op(s, k)));
        }
    }
    out
}

fn div_as_reciprocal_product() -> Lemma {
    Lemma {
        name: "div-as-reciprocal-product",
        doc: "a * reciprocal(b) = a / b, and through up to two layout operators (view, expand, permute, transpose) a * L(reciprocal(b)) = a / L(b) (b's reciprocal written reciprocal(b) or 1 / b): true over the reals wherever b != 0, and in IEEE arithmetic at b = 0 and b = inf too (1/0 = inf, a * inf = a / 0; 1/inf = 0), apart from rounding: XLA writes softmax's exp / sum as exp * (1 / sum). Only a product whose factor already is a reciprocal is rewritten, so the e-graph gains one division per such product",
        roots: vec!["aten.mul.Tensor".into()],
        examples: vec![
            (
                "(aten.mul.Tensor %r0:a (aten.reciprocal.default %r0:b))",
                &[("a", "f64[2,3]"), ("b", "f64[2,3]")],
            ),
            (
                "(aten.mul.Tensor (aten.div.Tensor f:1.0 %r0:b) %r0:a)",
                &[("a", "f64[2,3]"), ("b", "f64[2,1]")],
            ),
            (
                "(aten.mul.Tensor %r0:a (aten.expand.default (aten.div.Tensor f:1.0 %r0:b) (list 2 3) b:false))",
                &[("a", "f64[2,3]"), ("b", "f64[2,1]")],
            ),
            (
                "(aten.mul.Tensor %r0:a (aten.div.Tensor (aten.full.default (list) f:1.0 dt:f64 none dev b:false) %r0:b))",
                &[("a", "f64[2,3]"), ("b", "f64[3]")],
            ),
            (
                "(aten.mul.Tensor %r0:a (aten.expand.default (aten.view.default (aten.div.Tensor f:1.0 %r0:b) (list 2 1)) (list 2 3) b:false))",
                &[("a", "f64[2,3]"), ("b", "f64[2]")],
            ),
            (
                "(aten.mul.Tensor (aten.permute.default (aten.reciprocal.default %r0:b) (list 1 0)) %r0:a)",
                &[("a", "f64[2,3]"), ("b", "f64[3,2]")],
            ),
        ],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            if kids.len() != 2 {
                return vec![];
            }
            let want = g[eclass].data.meta().map(|m| m.shape.clone());
            let mut out = Vec::new();
            for (a, r) in [(kids[0], kids[1]), (kids[1], kids[0])] {
                let denominators = denominators(g, r, 2);
                for b in denominators {
                    let div = op(g, "aten.div.Tensor", vec![a, b]);
                    // Broadcasting may differ only in ways that keep the product's shape.
                    if g[div].data.meta().map(|m| m.shape.clone()) == want && want.is_some() {
                        out.push(div);
                    }
                }
            }
            out
        }),
    }
}
