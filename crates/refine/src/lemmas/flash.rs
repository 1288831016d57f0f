//! Lemmas for ring attention's backward: the ranks recompute each block's probabilities from
//! the saved (merged) log-sum-exp and accumulate the block products of the gradients.
//!
//! The spec's attention backward multiplies whole matrices: `dV = P^T dO`, where `P` (after the
//! forward's lemmas) is a grid of key blocks, zero fills where the causal mask hides a whole
//! block. The ranks compute `P_ij^T dO_i` only for the blocks they see, over the rows they hold
//! (two chunks each), and sum the steps' contributions. The lemmas here drop the zero blocks'
//! products and terms, and join a sum of block products back into the products of the larger
//! blocks the ranks multiply: always from pieces already in the e-graph (concatenations
//! present, adjacent slices, transposes of either), never by cutting a tensor anew.

use super::ring::{
    calls, calls_op, cats_along, finite_lse, fully_masked, has, has_op, is_maximum_of, make_fill,
    normalizer_parts,
};
use super::{classes_of, int, is_one, op, shape, slice, zero_fill, Graph, Lemma, SUM};
use crate::term::{is_op, sym, Term, CAT, SLICE};
use egg::Id;
use std::sync::Arc;

/// The lemmas of this module.
pub(super) fn lemmas() -> Vec<Lemma> {
    vec![
        product_with_zero_block(),
        sum_drops_zero_terms(),
        sum_of_contraction_blocks(),
        product_of_row_slice(),
        transposed_product(),
        product_of_contraction_block(),
        recomputed_masked_block(),
        softmax_backward_key_blocks(),
        rowsum_of_scores_gradient(),
        softmax_backward_through_view(),
        sum_of_common_layout(),
    ]
}

const BMM: &str = "aten.bmm.default";
const MM: &str = "aten.mm.default";
const MATMUL: &str = "aten.matmul.default";
const FULL: &str = "aten.full.default";
const TRANSPOSE: &str = "aten.transpose.int";
const ADD: &str = "aten.add.Tensor";

/// The matrix products a lemma reads (both operands tensors of the same rank, 2 for `mm`, 3
/// for `bmm`, 3 or more for `matmul`).
const PRODUCTS: [&str; 3] = [BMM, MM, MATMUL];

/// [`PRODUCTS`] as symbols, interned once, for [`super::node_sym`].
fn product_syms() -> [egg::Symbol; 3] {
    [sym!(BMM), sym!(MM), sym!(MATMUL)]
}

/// A zero fill of `shape` with the value and options of `fill`.
fn zeros(g: &mut Graph, shape: &[usize], fill: &(Id, Vec<Id>)) -> Id {
    make_fill(g, shape, fill.0, &fill.1)
}

/// The (row, contraction) dims of a product's left operand and the contraction dim of its
/// right one, for operands of ranks `ra`, `rb`: `None` unless both have the same rank
/// (batched products pair their batch dims; a broadcast operand is left alone).
fn product_dims(sym: &str, ra: usize, rb: usize) -> Option<(usize, usize, usize)> {
    let ok = ra == rb
        && match sym {
            MM => ra == 2,
            BMM => ra == 3,
            MATMUL => ra >= 3,
            _ => false,
        };
    ok.then(|| (ra - 2, ra - 1, ra - 2))
}

/// The products `sym(a, b)` of a class (a few at most).
fn products(g: &Graph, id: Id) -> Vec<(&'static str, Id, Id)> {
    let mut out = Vec::new();
    for (sym, interned) in PRODUCTS.into_iter().zip(product_syms()) {
        for k in calls_op(g, id, interned) {
            if k.len() == 2 {
                out.push((sym, k[0], k[1]));
            }
        }
    }
    out.truncate(4);
    out
}

/// A product with a zero block is zeros; a product whose contraction is split into pieces, some
/// of them zeros, is the sum of the other pieces' products.
fn product_with_zero_block() -> Lemma {
    Lemma {
        name: "product-with-zero-block",
        doc: "mm/bmm/matmul(a, b) = zeros (the product's shape) when a or b is a zero fill (or a transpose, view or slice of one); mm/bmm/matmul(cat_k(a_i), cat_k'(b_i)) along the contraction dim (pieces of equal sizes) = the sum of a_i b_i over the i where neither a_i nor b_i is zeros (one term: that product; none: zeros): masked blocks of attention probabilities contribute nothing to the gradients",
        roots: PRODUCTS.iter().map(|s| s.to_string()).collect(),
        examples: vec![
            ("(aten.bmm.default (aten.transpose.int (aten.full.default (list 2 3 2) f:0.0 dt:f64 none dev b:false) 1 2) %r0:b)", &[("b", "f64[2,3,4]")]),
            ("(aten.mm.default %r0:a (aten.full.default (list 3 4) f:0.0 dt:f64 none dev b:false))", &[("a", "f64[2,3]")]),
            ("(aten.bmm.default (cat 2 %r0:a (aten.full.default (list 2 2 3) f:0.0 dt:f64 none dev b:false) %r1:a) (cat 1 %r0:b %r1:b %r2:b))", &[("a", "f64[2,2,3]"), ("b", "f64[2,3,4]")]),
            ("(aten.matmul.default (cat 3 (aten.full.default (list 2 2 2 3) f:0.0 dt:f64 none dev b:false) %r0:a) (cat 2 %r0:b %r1:b))", &[("a", "f64[2,2,2,3]"), ("b", "f64[2,2,3,4]")]),
        ],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            let Some(sym) = super::node_sym(g, eclass, kids, &product_syms()).map(|s| s.as_str()) else {
                return vec![];
            };
            let (Some(sa), Some(sb), Some(out)) = (shape(g, kids[0]), shape(g, kids[1]), shape(g, eclass)) else {
                return vec![];
            };
            let Some((_, ka, kb)) = product_dims(sym, sa.len(), sb.len()) else { return vec![] };
            if let Some(f) = zero_fill(g, kids[0], 2).or_else(|| zero_fill(g, kids[1], 2)) {
                return vec![zeros(g, &out, &f)];
            }
            let mut res = Vec::new();
            for a in cats_along(g, kids[0], ka).into_iter().take(2) {
                let Some(szs) = super::sizes(g, &a, ka) else { continue };
                for b in cats_along(g, kids[1], kb).into_iter().take(2) {
                    if super::sizes(g, &b, kb).as_deref() != Some(&szs[..]) {
                        continue;
                    }
                    let zero: Vec<Option<(Id, Vec<Id>)>> = a
                        .iter()
                        .zip(&b)
                        .map(|(&x, &y)| zero_fill(g, x, 2).or_else(|| zero_fill(g, y, 2)))
                        .collect();
                    let Some(f) = zero.iter().flatten().next().cloned() else { continue };
                    let terms: Vec<Id> = (0..a.len())
                        .filter(|&i| zero[i].is_none())
                        .map(|i| op(g, sym, vec![a[i], b[i]]))
                        .collect();
                    res.push(match terms.len() {
                        0 => zeros(g, &out, &f),
                        1 => terms[0],
                        _ => op(g, SUM, terms),
                    });
                }
            }
            res
        }),
    }
}

/// Zeros add nothing to a sum.
fn sum_drops_zero_terms() -> Lemma {
    Lemma {
        name: "sum-drops-zero-terms",
        doc: "sum(x_i) = the sum of the x_i that are not zero fills (one left: that term; none: zeros): the steps of a ring whose blocks are masked contribute nothing",
        roots: vec![SUM.into()],
        examples: vec![
            ("(sum %r0:a (aten.full.default (list 2 3) f:0.0 dt:f64 none dev b:false) %r1:a)", &[("a", "f64[2,3]")]),
            ("(sum (aten.transpose.int (aten.full.default (list 3 2) f:0.0 dt:f64 none dev b:false) 0 1) %r0:a)", &[("a", "f64[2,3]")]),
        ],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            if !kids.iter().any(|&t| has_op(g, t, sym!(FULL)) || has_op(g, t, sym!(TRANSPOSE))) {
                return vec![];
            }
            let zero: Vec<Option<(Id, Vec<Id>)>> = kids.iter().map(|&t| zero_fill(g, t, 2)).collect();
            let Some(f) = zero.iter().flatten().next().cloned() else { return vec![] };
            let kept: Vec<Id> = kids.iter().zip(&zero).filter(|(_, z)| z.is_none()).map(|(&t, _)| t).collect();
            match kept.len() {
                0 => {
                    let Some(out) = shape(g, eclass) else { return vec![] };
                    vec![zeros(g, &out, &f)]
                }
                1 => kept,
                _ => vec![g.add(Term::Op(sym!(SUM), kept))],
            }
        }),
    }
}

/// The concatenation along `d` of `pieces`, when the e-graph already holds it: a `cat` node of
/// exactly these pieces, adjacent slices of one tensor (their union, sliced from it), or
/// transposes of pieces that join along the transposed dim (joined once, then transposed).
fn join(g: &mut Graph, pieces: &[Id], d: usize, depth: usize) -> Option<Id> {
    if let [p] = pieces {
        return Some(*p);
    }
    let dim = g.lookup(crate::term::Term::Num(d as i64));
    if let Some(dim) = dim {
        let node = crate::term::Term::Op(
            sym!(CAT),
            std::iter::once(dim).chain(pieces.iter().copied()).collect(),
        );
        if let Some(id) = g.lookup(node) {
            return Some(id);
        }
    }
    if let Some(id) = adjacent_slices(g, pieces, d) {
        return Some(id);
    }
    if depth == 0 {
        return None;
    }
    // Transposes of the same two dims throughout: join the operands along the swapped dim.
    let first = calls(g, pieces[0], TRANSPOSE);
    for t in first.iter().filter(|k| k.len() == 3) {
        let (Some(a), Some(b)) = (int(g, t[1]), int(g, t[2])) else {
            continue;
        };
        let inner_d = if d as i64 == a {
            b
        } else if d as i64 == b {
            a
        } else {
            d as i64
        };
        let inner: Option<Vec<Id>> = pieces
            .iter()
            .map(|&p| {
                calls(g, p, TRANSPOSE)
                    .into_iter()
                    .find(|k| k.len() == 3 && int(g, k[1]) == Some(a) && int(g, k[2]) == Some(b))
                    .map(|k| k[0])
            })
            .collect();
        let Some(inner) = inner else { continue };
        let Ok(inner_d) = usize::try_from(inner_d) else {
            continue;
        };
        if let Some(x) = join(g, &inner, inner_d, depth - 1) {
            return Some(op(g, TRANSPOSE, vec![x, t[1], t[2]]));
        }
    }
    None
}

/// The slice `[a_0, b_n)` along `d` of one tensor `x` when the pieces are its slices `[a_i, b_i)`
/// in order with `b_i = a_{i+1}` (`x` itself when they cover it).
pub(super) fn adjacent_slices(g: &mut Graph, pieces: &[Id], d: usize) -> Option<Id> {
    let slices_of = |g: &Graph, p: Id| -> Vec<(i64, i64, Id)> {
        calls(g, p, SLICE)
            .into_iter()
            .filter(|k| k.len() == 4 && int(g, k[0]) == Some(d as i64))
            .filter_map(|k| Some((int(g, k[1])?, int(g, k[2])?, g.find(k[3]))))
            .collect()
    };
    for (a0, mut end, x) in slices_of(g, pieces[0]) {
        let mut ok = true;
        for &p in &pieces[1..] {
            match slices_of(g, p)
                .into_iter()
                .find(|&(a, _, y)| a == end && y == x)
            {
                Some((_, b, _)) => end = b,
                None => {
                    ok = false;
                    break;
                }
            }
        }
        if ok {
            let (Ok(a0), Ok(end)) = (usize::try_from(a0), usize::try_from(end)) else {
                continue;
            };
            return Some(slice(g, d, a0, end, x));
        }
    }
    None
}

/// One term of a sum read as a product of joined pieces: the operator, the left operand's
/// pieces along its contraction dim and the right operand's along its own.
struct Blocks {
    sym: &'static str,
    a: Vec<Id>,
    b: Vec<Id>,
}

/// A sum of products of matching blocks along the contraction dim is the product of the
/// joined blocks.
fn sum_of_contraction_blocks() -> Lemma {
    Lemma {
        name: "sum-of-contraction-blocks",
        doc: "sum_i mm/bmm/matmul(a_i, b_i) (among other terms) = mm/bmm/matmul(cat_k(a_i), cat_k'(b_i)) along the contraction dims, where the e-graph already holds both concatenations (a cat of exactly those pieces, adjacent slices of one tensor, or transposes of either): the ranks' block products over both of their chunks, which the spec's product meets block by block",
        roots: vec![SUM.into()],
        examples: vec![
            ("(sum (aten.bmm.default %r0:a %r0:b) (aten.bmm.default %r1:a %r1:b) (aten.bmm.default (cat 2 %r0:a %r1:a) (cat 1 %r0:b %r1:b)))", &[("a", "f64[2,2,3]"), ("b", "f64[2,3,4]")]),
            ("(sum (aten.bmm.default (aten.transpose.int (slice 1 0 2 %r0:p) 1 2) (slice 1 0 2 %r0:o)) %r1:c (aten.bmm.default (aten.transpose.int (slice 1 2 5 %r0:p) 1 2) (slice 1 2 5 %r0:o)))", &[("p", "f64[2,5,3]"), ("o", "f64[2,5,4]"), ("c", "f64[2,3,4]")]),
            ("(sum (aten.mm.default (slice 1 0 1 %r0:a) (slice 0 0 1 %r0:b)) (aten.mm.default (slice 1 1 3 %r0:a) (slice 0 1 3 %r0:b)))", &[("a", "f64[2,3]"), ("b", "f64[3,4]")]),
        ],
        requires: None,
        build: Arc::new(|g, _, kids| {
            if kids.iter().filter(|&&t| product_syms().into_iter().any(|s| has_op(g, t, s))).count() < 2 {
                return vec![];
            }
            // Per term: its products, each as one block on either side.
            let mut terms: Vec<(Id, Vec<Blocks>)> = kids
                .iter()
                .map(|&t| {
                    let blocks = products(g, t)
                        .into_iter()
                        .map(|(sym, a, b)| Blocks { sym, a: vec![a], b: vec![b] })
                        .collect();
                    (t, blocks)
                })
                .collect();
            let mut merged = false;
            // Greedy: join any two terms whose blocks join on both sides, until none do.
            'again: loop {
                for i in 0..terms.len() {
                    for j in i + 1..terms.len() {
                        if let Some((id, blocks)) = join_terms(g, &terms[i].1, &terms[j].1) {
                            terms[i] = (id, vec![blocks]);
                            terms.remove(j);
                            merged = true;
                            continue 'again;
                        }
                    }
                }
                break;
            }
            if !merged {
                return vec![];
            }
            let ids: Vec<Id> = terms.iter().map(|t| t.0).collect();
            vec![if ids.len() == 1 { ids[0] } else { g.add(Term::Op(sym!(SUM), ids)) }]
        }),
    }
}

/// The product of two terms' blocks joined (either order), when both sides join.
fn join_terms(g: &mut Graph, x: &[Blocks], y: &[Blocks]) -> Option<(Id, Blocks)> {
    for p in x {
        for q in y.iter().filter(|q| q.sym == p.sym) {
            let (Some(ra), Some(rb)) = (
                shape(g, p.a[0]).map(|s| s.len()),
                shape(g, p.b[0]).map(|s| s.len()),
            ) else {
                continue;
            };
            let Some((_, ka, kb)) = product_dims(p.sym, ra, rb) else {
                continue;
            };
            for (first, second) in [(p, q), (q, p)] {
                let a: Vec<Id> = first.a.iter().chain(&second.a).copied().collect();
                let b: Vec<Id> = first.b.iter().chain(&second.b).copied().collect();
                let Some(ja) = join(g, &a, ka, 1) else {
                    continue;
                };
                let Some(jb) = join(g, &b, kb, 1) else {
                    continue;
                };
                let id = op(g, p.sym, vec![ja, jb]);
                return Some((id, Blocks { sym: p.sym, a, b }));
            }
        }
    }
    None
}

/// Rows of a product are the product of the rows; columns likewise.
fn product_of_row_slice() -> Lemma {
    Lemma {
        name: "product-of-row-slice",
        doc: "mm/bmm/matmul(slice_row(a), b) = slice_row(mm/bmm/matmul(a, b)) and mm/bmm/matmul(a, slice_col(b)) = slice_col(mm/bmm/matmul(a, b)), also through a transpose of the last two dims (transpose(slice(x)) is a slice of transpose(x)), only where the whole product is already in the e-graph (also as the multiple of a rank tensor that scales it, t = (p/q) product): a block product of the spec meets the rows of a rank's product",
        roots: PRODUCTS.iter().map(|s| s.to_string()).collect(),
        examples: vec![
            ("(cat 1 (aten.bmm.default (slice 1 0 2 %r0:a) %r0:b) (aten.bmm.default %r0:a %r0:b))", &[("a", "f64[2,3,3]"), ("b", "f64[2,3,4]")]),
            ("(cat 1 (aten.bmm.default (aten.transpose.int (slice 2 1 3 %r0:p) 1 2) %r0:o) (aten.bmm.default (aten.transpose.int %r0:p 1 2) %r0:o))", &[("p", "f64[2,4,3]"), ("o", "f64[2,4,5]")]),
            ("(cat 1 (aten.mm.default %r0:a (slice 1 1 4 %r0:b)) (aten.mm.default %r0:a %r0:b))", &[("a", "f64[2,3]"), ("b", "f64[3,4]")]),
        ],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            if !(has(g, kids[0], SLICE) || has(g, kids[0], TRANSPOSE) || has(g, kids[1], SLICE) || has(g, kids[1], TRANSPOSE)) {
                return vec![];
            }
            let Some(sym) = super::node_sym(g, eclass, kids, &product_syms()).map(|s| s.as_str()) else {
                return vec![];
            };
            let (Some(ra), Some(rb)) = (shape(g, kids[0]).map(|s| s.len()), shape(g, kids[1]).map(|s| s.len())) else {
                return vec![];
            };
            let Some((row, _, _)) = product_dims(sym, ra, rb) else { return vec![] };
            let col = row + 1;
            let mut out = Vec::new();
            // Rows of the left operand (dim `row`), columns of the right one (dim `col`).
            for (side, d) in [(0usize, row), (1usize, col)] {
                for (a, b, whole) in sliced_operand(g, kids[side], d) {
                    let mut k = kids.to_vec();
                    k[side] = whole;
                    let node = crate::term::Term::Op(egg::Symbol::from(sym), k);
                    let Some(product) = g.lookup(node) else { continue };
                    for product in with_rank_multiple(g, product) {
                        out.push(slice(g, d, a, b, product));
                    }
                }
            }
            out
        }),
    }
}

/// A product found in the e-graph, and where a rank tensor `t = (p/q) x` scales it (a rank's
/// gradient of its local loss: the spec's product is a multiple of it), also `x = (q/p) t`, so
/// the relation reaches the rank's tensor. Only products the lemmas here look up get the
/// multiple (the engine's general `scaled-rank-tensor` runs only on its wider attempt).
fn with_rank_multiple(g: &mut Graph, x: Id) -> Vec<Id> {
    let x = g.find(x);
    let mut out = vec![x];
    if g[x].nodes.iter().any(crate::term::is_leaf) {
        return out;
    }
    let parents: Vec<Id> = g[x].parents().map(|p| g.find(p)).collect();
    let multiple = parents.into_iter().find_map(|t| {
        if !g[t].nodes.iter().any(crate::term::is_leaf) {
            return None;
        }
        calls(g, t, super::SCALE).into_iter().find_map(|k| {
            if k.len() != 3 || g.find(k[2]) != x {
                return None;
            }
            let (p, q) = (int(g, k[0])?, int(g, k[1])?);
            (p != 0).then_some((p, q, t))
        })
    });
    if let Some((p, q, t)) = multiple {
        out.push(super::scale(g, q, p, t));
    }
    out
}

/// A slice along a dim: (dim, start, end).
type Cut = (usize, usize, usize);

/// The transposes (last two dims `r`, `r + 1`) of a class already in the e-graph, with the
/// slice that must follow: `x` itself for `transpose(x)`, `transpose(x)` where present, and for
/// `slice(sliced, s, e, z)` (`sliced` the operand's non-contracted dim: `r` for the left one,
/// `r + 1` for the right one) the transpose of `z`, sliced along the other dim.
fn present_transposes(g: &Graph, id: Id, r: usize, sliced: usize) -> Vec<(Id, Option<Cut>)> {
    let swaps = |t: &[Id]| {
        let dims = (int(g, t[1]), int(g, t[2]));
        let (a, b) = (Some(r as i64), Some(r as i64 + 1));
        dims == (a, b) || dims == (b, a)
    };
    let whole = |x: Id| -> Option<Id> {
        calls(g, x, TRANSPOSE)
            .into_iter()
            .find(|t| swaps(t))
            .map(|t| t[0])
            .or_else(|| {
                let (a, b) = (
                    g.lookup(crate::term::Term::Num(r as i64))?,
                    g.lookup(crate::term::Term::Num(r as i64 + 1))?,
                );
                g.lookup(crate::term::Term::Op(sym!(TRANSPOSE), vec![x, a, b]))
            })
    };
    let mut out: Vec<(Id, Option<Cut>)> = whole(id).into_iter().map(|t| (t, None)).collect();
    for k in calls(g, id, SLICE) {
        let (Some(d), Some(s), Some(e)) = (int(g, k[0]), int(g, k[1]), int(g, k[2])) else {
            continue;
        };
        // Slicing the contracted dim would not commute with the product.
        if d != sliced as i64 {
            continue;
        }
        let other = if sliced == r { r + 1 } else { r };
        if let Some(t) = whole(k[3]) {
            out.push((t, Some((other, s as usize, e as usize))));
        }
    }
    out.truncate(4);
    out
}

/// A product with a transposed operand is the transpose of the product the other way round,
/// where that product is already in the e-graph: the spec's `dK^T = Q^T dS` meets the ranks'
/// `dK = dS^T Q`.
fn transposed_product() -> Lemma {
    Lemma {
        name: "transposed-product",
        doc: "mm/bmm(a, b) = transpose(mm/bmm(transpose(b), transpose(a))) (transposes of the last two dims), where transpose(a) and transpose(b) are present or cancel a transpose, and slice_col(z)^T = slice_row(z^T): only where the product the other way round is already in the e-graph (also as the multiple of a rank tensor that scales it)",
        roots: vec![BMM.into(), MM.into()],
        examples: vec![
            ("(cat 2 (aten.bmm.default (aten.transpose.int %r0:q 1 2) (slice 2 0 2 %r0:s)) (aten.bmm.default (aten.transpose.int %r0:s 1 2) %r0:q))", &[("q", "f64[2,3,4]"), ("s", "f64[2,3,4]")]),
            ("(cat 0 (aten.mm.default %r0:a (aten.transpose.int %r0:b 0 1)) (aten.mm.default %r0:b (aten.transpose.int %r0:a 0 1)))", &[("a", "f64[2,3]"), ("b", "f64[2,3]")]),
        ],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            if !(has(g, kids[0], TRANSPOSE) || has(g, kids[1], TRANSPOSE)) {
                return vec![];
            }
            let Some(sym) = super::node_sym(g, eclass, kids, &[sym!(BMM), sym!(MM)]).map(|s| s.as_str()) else {
                return vec![];
            };
            let (Some(sa), Some(sb)) = (shape(g, kids[0]), shape(g, kids[1])) else { return vec![] };
            let Some((row, _, _)) = product_dims(sym, sa.len(), sb.len()) else { return vec![] };
            let mut found = Vec::new();
            for (ta, cut_a) in present_transposes(g, kids[0], row, row) {
                for (tb, cut_b) in present_transposes(g, kids[1], row, row + 1) {
                    // Only one operand may need its slice moved out of the product.
                    if cut_a.is_some() && cut_b.is_some() {
                        continue;
                    }
                    let node = crate::term::Term::Op(egg::Symbol::from(sym), vec![tb, ta]);
                    if let Some(p) = g.lookup(node) {
                        found.push((p, cut_a.or(cut_b)));
                    }
                }
            }
            let mut out = Vec::new();
            for (p, cut) in found.into_iter().take(2) {
                out.extend(transposed_back(g, p, cut, row));
            }
            out
        }),
    }
}

/// Whether dims `s..e` along `d` of a class are zeros: a block of a rank tensor the element
/// analysis proved zero, a zero fill, or a zero piece of a concatenation along `d`.
fn zero_range(g: &Graph, id: Id, d: usize, s: usize, e: usize) -> bool {
    if s >= e || zero_fill(g, id, 2).is_some() || zero_block(g, id, Some((d, s, e))) {
        return true;
    }
    super::cats(g, id).into_iter().any(|(cd, pieces)| {
        if cd != d {
            return false;
        }
        let mut at = 0;
        let mut covered = true;
        for p in pieces {
            let Some(n) = shape(g, p).and_then(|sh| sh.get(d).copied()) else {
                return false;
            };
            if at < e && at + n > s && zero_fill(g, p, 2).is_none() {
                covered = false;
            }
            at += n;
        }
        covered
    })
}

/// A product of two blocks of the contraction is the product of the whole operands when the
/// rest of the contraction contributes zeros.
fn product_of_contraction_block() -> Lemma {
    Lemma {
        name: "product-of-contraction-block",
        doc: "mm/bmm/matmul(slice_k(a, s, e), slice_k(b, s, e)) = mm/bmm/matmul(a, b), both sliced along the contraction dims (also a transpose of a slice, its whole transpose present), when for the rest of the contraction a's or b's block is zeros (a zero fill, a zero piece of a concatenation, or a block of a rank tensor the ranks' programs make zero); a block is also a piece of a concatenation present (a rank tensor joined from its chunks) or, for rows of a rank tensor's block, slice_k(slice_row(x)); where a^T is absent the product is taken the other way round, mm(z^T, b) = mm(b^T, z)^T, only if that product is present: a rank multiplies its whole block of recomputed probabilities, whose masked part adds nothing",
        roots: PRODUCTS.iter().map(|s| s.to_string()).collect(),
        examples: vec![
            ("(aten.bmm.default (slice 2 2 4 %r0:a) (slice 1 2 4 (cat 1 (aten.full.default (list 2 2 3) f:0.0 dt:f64 none dev b:false) %r0:b)))", &[("a", "f64[2,3,4]"), ("b", "f64[2,2,3]")]),
            ("(cat 1 (aten.mm.default (aten.transpose.int (slice 0 0 1 %r0:q) 0 1) (slice 0 0 1 (cat 0 %r0:s (aten.full.default (list 2 3) f:0.0 dt:f64 none dev b:false)))) (aten.transpose.int %r0:q 0 1))", &[("q", "f64[3,2]"), ("s", "f64[1,3]")]),
            // The other way round: z^T is absent, the product b^T z present.
            ("(cat 0 (aten.bmm.default (aten.transpose.int (slice 1 0 2 %r0:z) 1 2) (slice 1 0 2 (cat 1 %r0:s (aten.full.default (list 2 2 5) f:0.0 dt:f64 none dev b:false)))) (aten.transpose.int (aten.bmm.default (aten.transpose.int (cat 1 %r0:s (aten.full.default (list 2 2 5) f:0.0 dt:f64 none dev b:false)) 1 2) %r0:z) 1 2))", &[("z", "f64[2,4,3]"), ("s", "f64[2,2,5]")]),
            // A piece of a concatenation present as the left block.
            ("(cat 0 (aten.bmm.default (aten.transpose.int %r0:p 1 2) (slice 1 0 2 (cat 1 %r0:s (aten.full.default (list 2 2 5) f:0.0 dt:f64 none dev b:false)))) (aten.bmm.default (cat 2 (aten.transpose.int %r0:p 1 2) %r0:q) (cat 1 %r0:s (aten.full.default (list 2 2 5) f:0.0 dt:f64 none dev b:false))))", &[("p", "f64[2,2,3]"), ("q", "f64[2,3,2]"), ("s", "f64[2,2,5]")]),
            // Rows of a rank tensor's contraction block.
            ("(aten.bmm.default (slice 1 0 1 (slice 2 0 2 %r0:m)) (slice 1 0 2 (cat 1 %r0:s (aten.full.default (list 2 2 5) f:0.0 dt:f64 none dev b:false))))", &[("m", "f64[2,3,4]"), ("s", "f64[2,2,5]")]),
        ],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            // Both operands slices or transposes (a piece of a concatenation, found through
            // its parents, is one too where the ranks' tensors are joined from transposed
            // chunks). One of them alone let every product scan its operands' parents: llama
            // cp=2 full took 38 s instead of 28.
            let sliced = |id: Id| has(g, id, SLICE) || has(g, id, TRANSPOSE);
            if !(sliced(kids[0]) && sliced(kids[1])) {
                return vec![];
            }
            let Some(sym) = super::node_sym(g, eclass, kids, &product_syms()).map(|s| s.as_str()) else {
                return vec![];
            };
            let (Some(sa), Some(sb)) = (shape(g, kids[0]), shape(g, kids[1])) else { return vec![] };
            let Some((_, ka, kb)) = product_dims(sym, sa.len(), sb.len()) else { return vec![] };
            let mut out = Vec::new();
            let mut lefts = blocks_along(g, kids[0], ka);
            lefts.extend(rows_of_blocks(g, kids[0], ka));
            let mut rights = blocks_along(g, kids[1], kb);
            rights.extend(rows_of_blocks(g, kids[1], kb));
            for &(s, e, a) in &lefts {
                for &(s2, e2, b) in &rights {
                    let (Some(wa), Some(wb)) = (shape(g, a), shape(g, b)) else { continue };
                    let n = wa[ka];
                    if (s, e) != (s2, e2) || wb[kb] != n || e > n {
                        continue;
                    }
                    let rest_zero = |lo: usize, hi: usize| {
                        zero_range(g, a, ka, lo, hi) || zero_range(g, b, kb, lo, hi)
                    };
                    if rest_zero(0, s) && rest_zero(e, n) {
                        out.push(op(g, sym, vec![a, b]));
                    }
                }
            }
            if out.is_empty() && (sym == BMM || sym == MM) {
                out = contraction_block_the_other_way(g, sym, kids, ka);
            }
            out.truncate(2);
            out
        }),
    }
}

/// `product-of-contraction-block` where one operand is `transpose(slice_k(z))` and the e-graph
/// lacks `transpose(z)`: the whole product is the transpose of the product the other way round,
/// `mm(z^T, b) = mm(b^T, z)^T` (and `mm(a, z^T) = mm(z, a^T)^T`), taken only where that product
/// is already present (`b^T` present, or a slice of a present transpose). Building `z^T` instead
/// would add a transpose every other lemma rewrites; the rank computes the other way round.
fn contraction_block_the_other_way(g: &mut Graph, sym: &str, kids: &[Id], k: usize) -> Vec<Id> {
    let row = k - 1;
    let mut found = Vec::new();
    for z_side in [0usize, 1] {
        // The contraction runs along `z`'s dim `zk` and the other operand `w`'s dim `zk` too
        // (left: `z^T` contracts its dim `k`, which is `z`'s `row`, against `w`'s `row`; right:
        // the mirror image); `w`'s other dim `wk` is the one its transpose's slice cuts.
        let (zk, wk) = if z_side == 0 {
            (row, row + 1)
        } else {
            (row + 1, row)
        };
        for (s, e, z, cut_dim) in transposed_blocks(g, kids[z_side], wk) {
            if cut_dim != zk {
                continue;
            }
            for (s2, e2, w) in blocks_along(g, kids[1 - z_side], zk) {
                let (Some(wz), Some(ww)) = (shape(g, z), shape(g, w)) else {
                    continue;
                };
                let n = wz[zk];
                if (s, e) != (s2, e2) || ww[zk] != n || e > n {
                    continue;
                }
                let rest_zero = |lo: usize, hi: usize| {
                    zero_range(g, z, zk, lo, hi) || zero_range(g, w, zk, lo, hi)
                };
                if !(rest_zero(0, s) && rest_zero(e, n)) {
                    continue;
                }
                for (tw, cut) in present_transposes(g, w, row, wk) {
                    let pair = if z_side == 0 {
                        vec![tw, z]
                    } else {
                        vec![z, tw]
                    };
                    let node = Term::Op(egg::Symbol::from(sym), pair);
                    if let Some(p) = g.lookup(node) {
                        found.push((p, cut));
                    }
                }
            }
        }
    }
    let mut out = Vec::new();
    for (p, cut) in found.into_iter().take(2) {
        out.extend(transposed_back(g, p, cut, row));
    }
    out
}

/// `transpose(slice(cut, p))` over the last two dims (`row`, `row + 1`), for the product `p`
/// and the rank tensor it is a multiple of.
fn transposed_back(g: &mut Graph, p: Id, cut: Option<Cut>, row: usize) -> Vec<Id> {
    let mut out = Vec::new();
    for p in with_rank_multiple(g, p) {
        let p = match cut {
            Some((d, s, e)) => slice(g, d, s, e, p),
            None => p,
        };
        let (a, b) = (super::num(g, row as i64), super::num(g, row as i64 + 1));
        out.push(op(g, TRANSPOSE, vec![p, a, b]));
    }
    out
}

/// The `(a, b, x)` where a class is `slice(d, a, b, x)`, or `transpose(slice(d', a, b, z), d,
/// d')` with `x = transpose(z, d, d')` already in the e-graph (the last two dims swapped).
fn sliced_operand(g: &Graph, id: Id, d: usize) -> Vec<(usize, usize, Id)> {
    let mut out = Vec::new();
    for k in calls(g, id, SLICE) {
        if k.len() == 4 && int(g, k[0]) == Some(d as i64) {
            if let (Some(a), Some(b)) = (int(g, k[1]), int(g, k[2])) {
                out.push((a as usize, b as usize, k[3]));
            }
        }
    }
    let transposed = transposed_slices(g, id, d).into_iter();
    out.extend(transposed.filter_map(|(a, b, _, whole, _)| Some((a, b, whole?))));
    out.truncate(4);
    out
}

/// The `(a, b, z, transpose(z), d')` where a class is `transpose(slice(d', a, b, z), d, d')`,
/// the whole transpose `None` where the e-graph lacks it.
fn transposed_slices(g: &Graph, id: Id, d: usize) -> Vec<(usize, usize, Id, Option<Id>, usize)> {
    let mut out = Vec::new();
    for (t, other) in transposes_of(g, id, d) {
        for k in calls(g, t[0], SLICE) {
            if k.len() != 4 || int(g, k[0]) != Some(other as i64) {
                continue;
            }
            let (Some(a), Some(b)) = (int(g, k[1]), int(g, k[2])) else {
                continue;
            };
            let node = Term::Op(sym!(TRANSPOSE), vec![k[3], t[1], t[2]]);
            out.push((a as usize, b as usize, k[3], g.lookup(node), other));
        }
    }
    out
}

/// The transposes `transpose(x, d, d')` (either order) a class holds, with `d'`.
fn transposes_of(g: &Graph, id: Id, d: usize) -> Vec<(Vec<Id>, usize)> {
    let mut out = Vec::new();
    for t in calls(g, id, TRANSPOSE) {
        let (Some(x), Some(y)) = (int(g, t[1]), int(g, t[2])) else {
            continue;
        };
        let other = match (x == d as i64, y == d as i64) {
            (true, _) => y,
            (_, true) => x,
            _ => continue,
        };
        if let Ok(other) = usize::try_from(other) {
            out.push((t, other));
        }
    }
    out
}

/// The `(a, b, z, d')` where a class is the transpose (dims `d`, `d'`) of the block `a..b`
/// along `d'` of `z`: `transpose(slice(d', a, b, z))`, or `transpose(p)` for `p` a piece of a
/// concatenation `z` along `d'` already in the e-graph (a rank tensor joined from its chunks).
fn transposed_blocks(g: &Graph, id: Id, d: usize) -> Vec<(usize, usize, Id, usize)> {
    let mut out: Vec<_> = transposed_slices(g, id, d)
        .into_iter()
        .map(|(a, b, z, _, other)| (a, b, z, other))
        .collect();
    for (t, other) in transposes_of(g, id, d) {
        for (a, b, whole) in pieces_of_cats(g, t[0], other) {
            out.push((a, b, whole, other));
        }
    }
    out.sort_unstable();
    out.dedup();
    out.truncate(4);
    out
}

/// The `(a, b, z)` where a class is the piece `a..b` along `d` of a concatenation `z` already
/// in the e-graph.
fn pieces_of_cats(g: &Graph, id: Id, d: usize) -> Vec<(usize, usize, Id)> {
    let piece = g.find(id);
    let mut out = Vec::new();
    for parent in g[piece].parents() {
        for (cd, pieces) in super::cats(g, parent) {
            if cd != d {
                continue;
            }
            let mut at = 0;
            for p in pieces {
                let Some(n) = shape(g, p).and_then(|sh| sh.get(cd).copied()) else {
                    break;
                };
                if g.find(p) == piece {
                    out.push((at, at + n, g.find(parent)));
                    break;
                }
                at += n;
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// The `(a, b, slice(d', a', b', x))` where a class is `slice(d', a', b', slice(d, a, b, x))`
/// (`d' != d`) of a rank tensor `x`: the block with its slice along `d` moved outside, so the
/// rows of a rank's tensor are a whole whose contraction block the spec multiplies.
fn rows_of_blocks(g: &mut Graph, id: Id, d: usize) -> Vec<(usize, usize, Id)> {
    let mut found = Vec::new();
    for outer in calls(g, id, SLICE) {
        if outer.len() != 4 {
            continue;
        }
        let (Some(d2), Some(a2), Some(b2)) = (int(g, outer[0]), int(g, outer[1]), int(g, outer[2]))
        else {
            continue;
        };
        if d2 == d as i64 {
            continue;
        }
        for inner in calls(g, outer[3], SLICE) {
            if inner.len() != 4
                || int(g, inner[0]) != Some(d as i64)
                || !g[inner[3]].nodes.iter().any(crate::term::is_leaf)
            {
                continue;
            }
            if let (Some(a), Some(b)) = (int(g, inner[1]), int(g, inner[2])) {
                found.push((
                    a as usize,
                    b as usize,
                    (d2 as usize, a2 as usize, b2 as usize, inner[3]),
                ));
            }
        }
    }
    found.truncate(2);
    found
        .into_iter()
        .map(|(a, b, (d2, a2, b2, x))| (a, b, slice(g, d2, a2, b2, x)))
        .collect()
}

/// `sliced_operand`, and the pieces of concatenations along `d` already in the e-graph: a
/// rank tensor the e-graph joins from its chunks is a whole whose blocks the spec multiplies.
fn blocks_along(g: &Graph, id: Id, d: usize) -> Vec<(usize, usize, Id)> {
    let mut out = sliced_operand(g, id, d);
    out.extend(pieces_of_cats(g, id, d));
    out.truncate(6);
    out
}

/// Whether a class is a finite per-row statistic: a log-sum-exp over scores whose every row has
/// a finite entry, the ring's merge `maximum(l_1, l_2) + log(exp(l_1 - m) + exp(l_2 - m))` of
/// two finite ones, or row pieces, slices and views of such.
fn finite_statistic(g: &Graph, l: Id, depth: usize) -> bool {
    if finite_lse(g, l) {
        return true;
    }
    if depth == 0 {
        return false;
    }
    g[l].nodes.iter().any(|n| {
        let crate::term::Term::Op(s, k) = n else {
            return false;
        };
        match s.as_str() {
            // m + log(t), with m = maximum(l_1, l_2) and t = exp(l_1 - m) + exp(l_2 - m): m is
            // finite, 1 <= t <= 2.
            ADD if k.len() == 3 && is_one(g, k[2]) => {
                [(k[0], k[1]), (k[1], k[0])].into_iter().any(|(m, lg)| {
                    calls(g, lg, "aten.log.default").iter().any(|lk| {
                        normalizer_parts(g, lk[0]).iter().any(|&(_, _, l1, l2)| {
                            is_maximum_of(g, m, l1, l2)
                                && finite_statistic(g, l1, depth - 1)
                                && finite_statistic(g, l2, depth - 1)
                        })
                    })
                })
            }
            CAT if k.len() >= 2 => k[1..].iter().all(|&p| finite_statistic(g, p, depth - 1)),
            SLICE if k.len() == 4 => finite_statistic(g, k[3], depth - 1),
            "aten.view.default" | "aten.expand.default" if !k.is_empty() => {
                finite_statistic(g, k[0], depth - 1)
            }
            _ => false,
        }
    })
}

/// A fully masked block's probabilities, recomputed against the merged log-sum-exp, are zeros.
fn recomputed_masked_block() -> Lemma {
    Lemma {
        name: "recomputed-masked-block",
        doc: "exp((x + full(-inf)) - l) = zeros (the exp's shape) for x a finite product and l a finite per-row statistic: a log-sum-exp over scores whose every row has a finite entry, the ring's merge maximum(l_1, l_2) + log(exp(l_1 - m) + exp(l_2 - m)) of two such, or row pieces or slices of one (-inf - l = -inf, exp(-inf) = 0): the probabilities ring attention's backward recomputes for a block the causal mask hides",
        roots: vec!["aten.exp.default".into()],
        examples: vec![(
            "(aten.exp.default (aten.sub.Tensor (aten.add.Tensor (scale 1 2 (aten.bmm.default %r0:q %r1:k)) (aten.full.default (list 2 3) f:-inf dt:f64 none dev b:false) 1) (slice 1 0 2 (cat 1 (aten.logsumexp.default (aten.bmm.default %r0:q %r0:k) (list 2) b:true) (aten.add.Tensor (aten.maximum.default (aten.logsumexp.default (aten.bmm.default %r0:q %r0:k) (list 2) b:true) (aten.logsumexp.default (aten.bmm.default %r0:q %r2:k) (list 2) b:true)) (aten.log.default (aten.add.Tensor (aten.exp.default (aten.sub.Tensor (aten.logsumexp.default (aten.bmm.default %r0:q %r0:k) (list 2) b:true) (aten.maximum.default (aten.logsumexp.default (aten.bmm.default %r0:q %r0:k) (list 2) b:true) (aten.logsumexp.default (aten.bmm.default %r0:q %r2:k) (list 2) b:true)) 1)) (aten.exp.default (aten.sub.Tensor (aten.logsumexp.default (aten.bmm.default %r0:q %r2:k) (list 2) b:true) (aten.maximum.default (aten.logsumexp.default (aten.bmm.default %r0:q %r0:k) (list 2) b:true) (aten.logsumexp.default (aten.bmm.default %r0:q %r2:k) (list 2) b:true)) 1)) 1)) 1))) 1))",
            &[("q", "f64[2,2,4]"), ("k", "f64[2,4,3]")],
        )],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            if !has(g, kids[0], "aten.sub.Tensor") {
                return vec![];
            }
            let Some(out_shape) = shape(g, eclass) else { return vec![] };
            for k in calls(g, kids[0], "aten.sub.Tensor") {
                if k.len() != 3 || !is_one(g, k[2]) || !has(g, k[0], ADD) || !fully_masked(g, k[0]) {
                    continue;
                }
                if !finite_statistic(g, k[1], 6) {
                    continue;
                }
                // The fill's options (dtype, device) from the mask.
                let options = calls(g, k[0], ADD)
                    .into_iter()
                    .flat_map(|a| a.into_iter().take(2))
                    .flat_map(|m| calls(g, m, FULL))
                    .find(|f| f.len() == 6 && super::ring::float_literal(g, f[1]) == Some(f64::NEG_INFINITY))
                    .map(|f| f[2..].to_vec());
                let Some(options) = options else { continue };
                let zero = op(g, "f:0.0", vec![]);
                return vec![zeros(g, &out_shape, &(zero, options))];
            }
            vec![]
        }),
    }
}

/// The dtype of a single-tensor class.
fn dtype(g: &Graph, id: Id) -> Option<shardproof_ir::DType> {
    g[id].data.meta().map(|m| m.dtype)
}

const SOFTMAX_BACKWARD: &str = "aten._softmax_backward_data.default";
const SUM_DIM: &str = "aten.sum.dim_IntList";
const VIEW: &str = "aten.view.default";
const MUL: &str = "aten.mul.Tensor";

/// The softmax backward of key blocks is blockwise, with the row statistic taken once over
/// all blocks; a masked (zero) block of probabilities has a zero gradient.
fn softmax_backward_key_blocks() -> Lemma {
    Lemma {
        name: "softmax-backward-key-blocks",
        doc: "_softmax_backward_data(g, cat_k(y_j), k) = cat_k(y_j * (g_j - s)) with g_j the pieces of g along k (its own pieces of the same sizes, or slices) and s = sum(g * y, [k], keepdim), the output in the inputs' dtype; a zero-fill block y_j gives zeros (0 * (g_j - s) = 0 for finite gradients, the premise of the masked-block lemmas): ring attention's backward computes y_ij * (dP_ij - D_i) block by block, the causally masked blocks not at all",
        roots: vec![SOFTMAX_BACKWARD.into()],
        examples: vec![
            ("(aten._softmax_backward_data.default %r0:g (cat 1 %r0:y (aten.full.default (list 2 2) f:0.0 dt:f64 none dev b:false) %r1:y) 1 dt:f64)", &[("g", "f64[2,6]"), ("y", "f64[2,2]")]),
            ("(aten._softmax_backward_data.default %r0:g (cat 2 %r0:y %r1:y) -1 dt:f64)", &[("g", "f64[2,3,4]"), ("y", "f64[2,3,2]")]),
            ("(aten._softmax_backward_data.default (cat 3 %r0:g %r1:g) (cat 3 %r0:y %r1:y) 3 dt:f64)", &[("g", "f64[2,2,3,2]"), ("y", "f64[2,2,3,2]")]),
        ],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            if kids.len() != 4 || !has(g, kids[1], CAT) {
                return vec![];
            }
            let (Some(out), Some(k)) = (shape(g, eclass), int(g, kids[2])) else {
                return vec![];
            };
            let rank = out.len() as i64;
            let k = if k < 0 { k + rank } else { k };
            let Ok(k) = usize::try_from(k) else { return vec![] };
            // Elementwise arithmetic keeps the inputs' dtype: only a backward that does too.
            let dt = dtype(g, eclass);
            if dt.is_none() || dtype(g, kids[0]) != dt || dtype(g, kids[1]) != dt {
                return vec![];
            }
            let mut res = Vec::new();
            for ys in cats_along(g, kids[1], k).into_iter().take(2) {
                let Some(szs) = super::sizes(g, &ys, k) else { continue };
                let Some(gs) = super::split_alike(g, kids[0], k, &szs) else { continue };
                let product = op(g, MUL, vec![kids[0], kids[1]]);
                let dims = super::list(g, &[k]);
                let (keep, none) = (op(g, "b:true", vec![]), op(g, "none", vec![]));
                let s = op(g, SUM_DIM, vec![product, dims, keep, none]);
                let one = super::num(g, 1);
                let blocks: Vec<Id> = ys
                    .iter()
                    .zip(&gs)
                    .map(|(&y, &gj)| match zero_fill(g, y, 2) {
                        Some(f) => {
                            let shape = shape(g, y).expect("a piece has a shape");
                            zeros(g, &shape, &f)
                        }
                        None => {
                            let d = op(g, "aten.sub.Tensor", vec![gj, s, one]);
                            op(g, MUL, vec![y, d])
                        }
                    })
                    .collect();
                res.push(super::cat(g, k, blocks));
            }
            res
        }),
    }
}

/// The row sums of a score gradient times the probabilities are the row sums of the output
/// gradient times the output.
fn rowsum_of_scores_gradient() -> Lemma {
    Lemma {
        name: "rowsum-of-scores-gradient",
        doc: "sum((a @ b) * p, [-1]) = sum(a * (p @ b^T), [-1]) (either operand order of the *, keepdim either way, the product mm/bmm/matmul of same-rank operands, p of the product's shape; b^T is v where b = transpose(v) of the last two dims): sum_j sum_c a_ic b_cj p_ij = sum_c a_ic sum_j p_ij b_cj; with a = dO, b = V^T, p = P: rowsum(dP * P) = rowsum(dO * O), the statistic the ranks compute from their outputs",
        roots: vec![SUM_DIM.into()],
        examples: vec![
            ("(aten.sum.dim_IntList (aten.mul.Tensor (aten.bmm.default %r0:a (aten.transpose.int %r0:v 1 2)) %r0:p) (list 2) b:true none)", &[("a", "f64[2,3,4]"), ("v", "f64[2,5,4]"), ("p", "f64[2,3,5]")]),
            ("(aten.sum.dim_IntList (aten.mul.Tensor %r0:p (aten.mm.default %r0:a %r0:b)) (list 1) b:false none)", &[("a", "f64[3,4]"), ("b", "f64[4,5]"), ("p", "f64[3,5]")]),
            ("(aten.sum.dim_IntList (aten.mul.Tensor (aten.matmul.default %r0:a (aten.transpose.int %r0:v 3 2)) %r0:p) (list -1) b:true none)", &[("a", "f64[2,2,3,4]"), ("v", "f64[2,2,5,4]"), ("p", "f64[2,2,3,5]")]),
        ],
        requires: None,
        build: Arc::new(|g, _, kids| {
            if kids.len() != 4 || !has(g, kids[0], MUL) || !super::is_none(g, kids[3]) {
                return vec![];
            }
            let Some(dims) = super::int_list(g, kids[1]) else { return vec![] };
            let mut res = Vec::new();
            for m in calls(g, kids[0], MUL) {
                if m.len() != 2 {
                    continue;
                }
                for (u, p) in [(m[0], m[1]), (m[1], m[0])] {
                    let (Some(su), Some(sp)) = (shape(g, u), shape(g, p)) else { continue };
                    let r = su.len() as i64;
                    if su != sp || dims.len() != 1 || (dims[0] != r - 1 && dims[0] != -1) {
                        continue;
                    }
                    for (sym, a, b) in products(g, u) {
                        let (Some(ra), Some(rb)) = (shape(g, a).map(|s| s.len()), shape(g, b).map(|s| s.len())) else {
                            continue;
                        };
                        if product_dims(sym, ra, rb).is_none() || ra != su.len() {
                            continue;
                        }
                        // Batch dims equal (no broadcast to reason about).
                        let batch = |t: Id| shape(g, t).map(|s| s[..ra - 2].to_vec());
                        if batch(a) != batch(b) || batch(a) != batch(p) {
                            continue;
                        }
                        let (x, y) = (ra as i64 - 2, ra as i64 - 1);
                        // b^T: the transposed operand itself when b is a transpose of the last
                        // two dims, else a new transpose.
                        let bt = calls(g, b, TRANSPOSE)
                            .into_iter()
                            .find(|t| {
                                t.len() == 3
                                    && matches!((int(g, t[1]), int(g, t[2])), (Some(i), Some(j)) if (i == x && j == y) || (i == y && j == x))
                            })
                            .map(|t| t[0]);
                        let bt = match bt {
                            Some(v) => v,
                            // A square `b` (head dim equal to the key block's length) would
                            // take a transpose the graph never computes at every square product
                            // of the attention, each a new start for this lemma.
                            None if shape(g, b).is_some_and(|s| s.len() >= 2 && s[s.len() - 2] == s[s.len() - 1]) => continue,
                            None => {
                                let (nx, ny) = (super::num(g, x), super::num(g, y));
                                op(g, TRANSPOSE, vec![b, nx, ny])
                            }
                        };
                        let pb = op(g, sym, vec![p, bt]);
                        let prod = op(g, MUL, vec![a, pb]);
                        res.push(op(g, SUM_DIM, vec![prod, kids[1], kids[2], kids[3]]));
                    }
                }
            }
            res.truncate(4);
            res
        }),
    }
}

/// The softmax backward over the last dim of two equally viewed tensors is the view of the
/// backward of the tensors, when the view keeps the rows.
fn softmax_backward_through_view() -> Lemma {
    Lemma {
        name: "softmax-backward-through-view",
        doc: "_softmax_backward_data(view(g, s), view(y, s), -1, dt) = view(_softmax_backward_data(g, y, -1, dt), s) for g, y of one shape whose last dim is s's last dim: the backward is row by row (y_r * (g_r - sum(g_r * y_r))) and a row-major view that keeps the last dim keeps every row whole and in order; the spec's 4-d backward meets its 3-d products (dP = dO V^T, the probabilities' 3-d block grid)",
        roots: vec![SOFTMAX_BACKWARD.into()],
        examples: vec![
            ("(aten._softmax_backward_data.default (aten.view.default %r0:g (list 2 3 2 5)) (aten.view.default %r0:y (list 2 3 2 5)) 3 dt:f64)", &[("g", "f64[6,2,5]"), ("y", "f64[6,2,5]")]),
            ("(aten._softmax_backward_data.default (aten.view.default %r0:g (list 2 2 3)) (aten.view.default %r0:y (list 2 2 3)) -1 dt:f64)", &[("g", "f64[4,3]"), ("y", "f64[4,3]")]),
        ],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            if kids.len() != 4 || !has(g, kids[0], VIEW) || !has(g, kids[1], VIEW) {
                return vec![];
            }
            let Some(out) = shape(g, eclass) else { return vec![] };
            let r = out.len() as i64;
            if !matches!(int(g, kids[2]), Some(d) if d == r - 1 || d == -1) {
                return vec![];
            }
            let pairs: Vec<(Id, Id)> = super::views(g, kids[0])
                .into_iter()
                .flat_map(|a| super::views(g, kids[1]).into_iter().map(move |b| (a, b)))
                .collect();
            let mut res = Vec::new();
            for (a, b) in pairs {
                let Some(sa) = shape(g, a).filter(|sa| Some(sa) == shape(g, b).as_ref()) else { continue };
                if sa.is_empty() || sa.last() != out.last() || sa == out {
                    continue;
                }
                let last = super::num(g, sa.len() as i64 - 1);
                let inner = op(g, SOFTMAX_BACKWARD, vec![a, b, last, kids[3]]);
                let target = super::list(g, &out);
                res.push(op(g, VIEW, vec![inner, target]));
            }
            res.truncate(2);
            res
        }),
    }
}

/// A block of a rank tensor: the leaf, one half-open range per leaf dim, and for each dim of
/// the block the leaf dim it runs along (transposes permute them).
type LeafBlock = (egg::Symbol, Vec<(usize, usize)>, Vec<usize>);

/// The blocks of rank tensors a class is (the leaf itself, slices and transposes of it), at
/// most `depth` operators down, for leaves the element analysis found zeros in.
fn leaf_blocks(g: &Graph, id: Id, depth: usize) -> Vec<LeafBlock> {
    let mut out = Vec::new();
    for n in &g[id].nodes {
        let crate::term::Term::Op(s, k) = n else {
            continue;
        };
        if k.is_empty() {
            if g.analysis.zeros.has(*s) {
                if let Some(sh) = shape(g, id) {
                    out.push((
                        *s,
                        sh.iter().map(|&n| (0, n)).collect(),
                        (0..sh.len()).collect(),
                    ));
                }
            }
            continue;
        }
        if depth == 0 {
            continue;
        }
        match s.as_str() {
            SLICE if k.len() == 4 => {
                let (Some(d), Some(a), Some(b)) = (int(g, k[0]), int(g, k[1]), int(g, k[2])) else {
                    continue;
                };
                for (sym, mut ranges, perm) in leaf_blocks(g, k[3], depth - 1) {
                    let Some(&ld) = usize::try_from(d).ok().and_then(|d| perm.get(d)) else {
                        continue;
                    };
                    let start = ranges[ld].0;
                    ranges[ld] = (start + a as usize, start + b as usize);
                    out.push((sym, ranges, perm));
                }
            }
            TRANSPOSE if k.len() == 3 => {
                let (Some(i), Some(j)) = (int(g, k[1]), int(g, k[2])) else {
                    continue;
                };
                for (sym, ranges, mut perm) in leaf_blocks(g, k[0], depth - 1) {
                    let (Ok(i), Ok(j)) = (usize::try_from(i), usize::try_from(j)) else {
                        continue;
                    };
                    if i < perm.len() && j < perm.len() {
                        perm.swap(i, j);
                        out.push((sym, ranges, perm));
                    }
                }
            }
            _ => {}
        }
        if out.len() > 8 {
            break;
        }
    }
    out
}

/// Whether a class is a block of a rank tensor that the element analysis proved all zeros,
/// after narrowing its dim `narrow.0` to `narrow.1..narrow.2`.
fn zero_block(g: &Graph, id: Id, narrow: Option<(usize, usize, usize)>) -> bool {
    leaf_blocks(g, id, 4)
        .into_iter()
        .any(|(sym, mut ranges, perm)| {
            if let Some((d, a, b)) = narrow {
                let Some(&ld) = perm.get(d) else { return false };
                let start = ranges[ld].0;
                ranges[ld] = (start + a, start + b);
            }
            g.analysis.zeros.is_zero(sym, &ranges)
        })
}

/// Unites with a zero fill every block of a rank tensor that the ranks' programs make zero for
/// any input (see [`crate::kinds`]: a recomputed probability block the causal mask hides, and
/// every product of it), and every row or column block of a product whose operand's matching
/// block is such a zero block. Returns whether it united anything.
///
/// Runs before and during saturation rather than as a lemma: the facts come from the
/// implementation's programs, not from the terms, so no rewrite of terms could state them.
pub fn mark_zero_blocks(g: &mut Graph) -> bool {
    if g.analysis.zeros.is_empty() {
        return false;
    }
    let mut zero = Vec::new();
    let candidates: Vec<Id> = classes_of(g, SLICE)
        .into_iter()
        .chain(classes_of(g, TRANSPOSE))
        .collect();
    for c in candidates {
        if zero_fill(g, c, 0).is_some() {
            continue;
        }
        let mut is_zero = zero_block(g, c, None);
        if !is_zero {
            // A row (column) block of a product is zero where its left (right) operand's rows
            // (columns) are.
            is_zero = g[c].nodes.iter().any(|n| {
                let crate::term::Term::Op(s, k) = n else {
                    return false;
                };
                if !is_op!(s, SLICE) || k.len() != 4 {
                    return false;
                }
                let (Some(d), Some(a), Some(b)) = (int(g, k[0]), int(g, k[1]), int(g, k[2])) else {
                    return false;
                };
                let (Ok(d), Ok(a), Ok(b)) =
                    (usize::try_from(d), usize::try_from(a), usize::try_from(b))
                else {
                    return false;
                };
                products(g, k[3]).into_iter().any(|(sym, x, y)| {
                    let (Some(sx), Some(sy)) = (shape(g, x), shape(g, y)) else {
                        return false;
                    };
                    let Some((row, _, _)) = product_dims(sym, sx.len(), sy.len()) else {
                        return false;
                    };
                    if d < row {
                        zero_block(g, x, Some((d, a, b))) || zero_block(g, y, Some((d, a, b)))
                    } else if d == row {
                        zero_block(g, x, Some((d, a, b)))
                    } else {
                        zero_block(g, y, Some((d, a, b)))
                    }
                })
            });
        }
        if is_zero {
            zero.push(c);
        }
    }
    let mut changed = false;
    for c in zero {
        let (Some(sh), Some(dt)) = (shape(g, c), dtype(g, c)) else {
            continue;
        };
        let options = vec![
            op(g, &format!("dt:{}", dt.short_name()), vec![]),
            op(g, "none", vec![]),
            op(g, "dev", vec![]),
            op(g, "b:false", vec![]),
        ];
        let value = op(g, "f:0.0", vec![]);
        let fill = make_fill(g, &sh, value, &options);
        changed |= g.union(c, fill);
    }
    changed
}

/// The layout operators `sum-of-common-layout` factors out of a sum, with the position of
/// their tensor operand; interned once per call site (the lemma scans every two-term sum).
fn layouts() -> [(egg::Symbol, usize); 4] {
    [
        (sym!("aten.permute.default"), 0),
        (sym!(TRANSPOSE), 0),
        (sym!("aten.view.default"), 0),
        (sym!(SLICE), 3),
    ]
}

/// The layout calls two terms share: `(operator, arguments, the two operands)` for each layout
/// operator with the same arguments (dims, shape, range) in both classes. Compared in place:
/// the lemma scans every two-term sum of every e-graph.
fn common_layouts(g: &Graph, a: Id, b: Id) -> Vec<(egg::Symbol, Vec<Id>, [Id; 2])> {
    let mut out = Vec::new();
    for (sym, at) in layouts() {
        let of = |id: Id| {
            g[id].nodes.iter().filter_map(move |n| match n {
                Term::Op(s, k) if *s == sym && k.len() > at => Some(k),
                _ => None,
            })
        };
        for ka in of(a) {
            let same = |kb: &&Vec<Id>| {
                kb.len() == ka.len()
                    && (0..ka.len()).all(|i| i == at || g.find(ka[i]) == g.find(kb[i]))
            };
            if let Some(kb) = of(b).find(same) {
                out.push((sym, ka.clone(), [ka[at], kb[at]]));
            }
        }
    }
    out.truncate(4);
    out
}

/// The class of the graph's own addition `a + b` of two terms, where the e-graph already holds
/// it, or of a present `sum(a, b)` that a collective computes (see [`named_by_rank`]). Not every
/// present sum: `linear-over-sum` already put `sum(f(x_i))` in the class of `f(sum(x_i))`
/// wherever `f(sum(x_i))` is present, and finding those again only repeated that work, a sixth
/// of the demo bug case's time. A collective's sum has no such layout above it: the spec's
/// chunks of tensor-parallel partial sums meet the all-reduced tensor only through this lookup.
fn present_total(g: &Graph, [a, b]: [Id; 2]) -> Option<Id> {
    let added = g.lookup(Term::Num(1)).and_then(|one| {
        [(a, b), (b, a)]
            .into_iter()
            .find_map(|(x, y)| g.lookup(Term::Op(sym!(ADD), vec![x, y, one])))
    });
    added.or_else(|| {
        [(a, b), (b, a)]
            .into_iter()
            .find_map(|(x, y)| g.lookup(Term::Op(sym!(SUM), vec![x, y])))
            .filter(|&s| named_by_rank(g, s))
    })
}

/// Whether a class is a rank's tensor, or the whole that a rank's tensor is a slice of: the sum
/// an all-reduce computes, or the one a reduce-scatter cuts its rows from.
fn named_by_rank(g: &Graph, id: Id) -> bool {
    let id = g.find(id);
    if g[id].nodes.iter().any(crate::term::is_leaf) {
        return true;
    }
    g[id].parents().any(|p| {
        let p = g.find(p);
        let slices_this = |n: &Term| {
            matches!(n, Term::Op(s, k) if is_op!(s, SLICE) && k.last().is_some_and(|&x| g.find(x) == id))
        };
        g[p].nodes.iter().any(crate::term::is_leaf) && g[p].nodes.iter().any(slices_this)
    })
}

/// The layout call `sym(args)` with its tensor operand replaced by `x`.
fn relayout(g: &mut Graph, sym: egg::Symbol, args: &[Id], x: Id) -> Id {
    let at = layouts()
        .into_iter()
        .find(|&(s, _)| s == sym)
        .map_or(0, |(_, at)| at);
    let mut kids = args.to_vec();
    kids[at] = x;
    g.add(Term::Op(sym, kids))
}

/// A sum of the same layout of two terms is that layout of their sum, where a rank's addition
/// of the operands is already in the e-graph, also two layouts deep: a ring's
/// gradient pieces, transposed and sliced like the spec's blocks, meet the addition a rank
/// makes to the gradient it passes on.
fn sum_of_common_layout() -> Lemma {
    Lemma {
        name: "sum-of-common-layout",
        doc: "sum(f(x_1), f(x_2)) = f(x_1 + x_2) and sum(f(g(x_1)), f(g(x_2))) = f(g(x_1 + x_2)) for f, g layout operators (permute, transpose, view, slice) with the same arguments on both terms, only where the addition x_1 + x_2 is already in the e-graph (a rank's own, or a collective's sum): the spec's transposed block of a sum of ranks' gradient pieces meets the sum a rank passes along the ring, and chunks of tensor-parallel partial sums meet the all-reduced tensor",
        roots: vec![format!("{SUM}/2")],
        examples: vec![
            ("(cat 0 (sum (aten.transpose.int %r0:a 0 1) (aten.transpose.int %r1:b 0 1)) (aten.add.Tensor %r0:a %r1:b 1))", &[("a", "f64[3,3]"), ("b", "f64[3,3]")]),
            ("(cat 0 (sum (aten.permute.default (slice 0 1 3 %r0:a) (list 1 0)) (aten.permute.default (slice 0 1 3 %r1:b) (list 1 0))) (aten.add.Tensor %r0:a %r1:b 1))", &[("a", "f64[4,2]"), ("b", "f64[4,2]")]),
            // An all-reduce's result, and a reduce-scatter's rows of the whole sum.
            ("(cat 0 (sum (aten.transpose.int %r0:a 0 1) (aten.transpose.int %r1:b 0 1)) %r0:s)", &[("a", "f64[3,3]"), ("b", "f64[3,3]"), ("s", "=(sum %r0:a %r1:b)")]),
            ("(cat 1 (sum (aten.transpose.int %r0:a 0 1) (aten.transpose.int %r1:b 0 1)) (aten.transpose.int %r0:s 0 1))", &[("a", "f64[4,3]"), ("b", "f64[4,3]"), ("s", "=(slice 0 0 2 (sum %r0:a %r1:b))")]),
        ],
        requires: None,
        build: Arc::new(|g, _, kids| {
            if kids.len() != 2 || !kids.iter().all(|&k| layouts().into_iter().any(|(s, _)| has_op(g, k, s))) {
                return vec![];
            }
            let mut found = Vec::new();
            for (sym, args, inners) in common_layouts(g, kids[0], kids[1]) {
                if let Some(x) = present_total(g, inners) {
                    found.push((sym, args, None, x));
                    continue;
                }
                for (sym2, args2, inners2) in common_layouts(g, inners[0], inners[1]) {
                    if let Some(x) = present_total(g, inners2) {
                        found.push((sym, args.clone(), Some((sym2, args2)), x));
                        break;
                    }
                }
            }
            let mut out = Vec::new();
            for (sym, args, inner, x) in found.into_iter().take(2) {
                let x = match inner {
                    Some((sym2, args2)) => relayout(g, sym2, &args2, x),
                    None => x,
                };
                out.push(relayout(g, sym, &args, x));
            }
            out
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::term::{Shapes, Term};
    use egg::RecExpr;
    use shardproof_ir::DType;
    use shardproof_ops::Meta;

    /// An e-graph holding the given rank tensors, each `f64[2, 3]`, and their classes.
    fn graph_of_leaves<const N: usize>(names: [&str; N]) -> (Graph, [Id; N]) {
        let mut g = Graph::new(Shapes::default());
        let ids = names.map(|name| {
            g.analysis
                .leaves
                .insert(name.into(), Meta::new(DType::F64, vec![2, 3]));
            let leaf: RecExpr<Term> = name.parse().unwrap();
            g.add_expr(&leaf)
        });
        (g, ids)
    }

    /// A present sum counts as a total only once a rank's tensor names it (an all-reduce's
    /// result): other sums are `linear-over-sum`'s work already.
    #[test]
    fn a_present_sum_is_a_total_only_when_a_rank_computes_it() {
        let (mut g, [a, b, s]) = graph_of_leaves(["%r0:a", "%r1:a", "%r0:s"]);
        let total = crate::lemmas::op(&mut g, SUM, vec![a, b]);
        g.rebuild();
        assert_eq!(present_total(&g, [a, b]), None);
        g.union(s, total);
        g.rebuild();
        assert_eq!(present_total(&g, [b, a]), Some(g.find(total)));
    }

    /// Joining pieces builds nothing new when no concatenation of them is present.
    #[test]
    fn join_needs_the_pieces_present() {
        let (mut g, [a, b]) = graph_of_leaves(["%r0:a", "%r1:a"]);
        let _ = crate::lemmas::num(&mut g, 0);
        g.rebuild();
        let before = g.total_size();
        assert!(join(&mut g, &[a, b], 0, 1).is_none());
        assert_eq!(g.total_size(), before);
        let whole = crate::lemmas::cat(&mut g, 0, vec![a, b]);
        assert_eq!(join(&mut g, &[a, b], 0, 1), Some(whole));
    }
}
