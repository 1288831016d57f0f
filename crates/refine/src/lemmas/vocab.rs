//! Lemmas for the backward of vocabulary parallelism (Megatron's vocab-parallel cross-entropy
//! and embedding).
//!
//! The spec's cross-entropy backward, `_log_softmax_backward_data(nll_loss_backward(g, ..))`,
//! is `g * (softmax(x) - one_hot(t))`; Megatron computes it per vocabulary shard from the
//! all-reduced row max and sum of exponentials, with the one-hot restricted to the shard
//! (`eq(masked index, arange(w)) & ~out_of_range`). Both sides meet in two canonical terms:
//! `vocab_onehot(t, s, w)` (the one-hot of the targets within the shard `[s, s + w)`) and
//! `vocab_grad(G, t, s, n)` (rows `[s, s + n)` of the embedding gradient), which narrow under
//! slices of the vocabulary dim, so the spec's whole-vocabulary terms split into the ranks'.

use super::{
    cats, int, is_false, is_none, is_one, list_items, masked_shard_index, node_sym, num, op, shape,
    sizes, slice, views, with_kids, Graph, Lemma, LIST, SLICE,
};
use crate::term::{is_op, sym, Term, SUM, VOCAB_GRAD, VOCAB_ONEHOT};
use egg::Id;
use std::sync::Arc;

/// The lemmas of this module.
pub(super) fn lemmas() -> Vec<Lemma> {
    vec![
        masked_onehot(),
        onehot_over_cat(),
        embedding_grad_rows(),
        grad_over_cat(),
        grad_join(),
        sum_of_cats(),
        masked_embedding_grad(),
        vocab_slice(),
        log_softmax_backward_of_nll(),
        onehot_subtracted_in_place(),
        clamped_lookup(),
    ]
}

/// Megatron's shard one-hot: `bitwise_and(eq(view(idx, [.., 1]), arange(w)),
/// bitwise_not(view(m, [.., 1])))` with `idx = masked_fill(t - s, m, c)`,
/// `m = (t < s) | (t >= s + w)`, `0 <= c < w`, is `vocab_onehot(t, s, w)`: an out-of-range row
/// is all false (its mask), an in-range row true exactly at column `t - s`.
fn masked_onehot() -> Lemma {
    Lemma {
        name: "vocab-masked-onehot",
        doc: "bitwise_and(eq(view(masked_fill(t - s, m, c), [.., 1]), arange(w)), bitwise_not(view(m, [.., 1]))) with m = (t < s) | (t >= s + w), 0 <= c < w, is vocab_onehot(t, s, w)",
        roots: vec!["aten.bitwise_and.Tensor".into()],
        examples: vec![
            (
                "(aten.bitwise_and.Tensor (aten.eq.Tensor (aten.view.default (aten.masked_fill.Scalar (aten.sub.Scalar %r0:t 3 1) (aten.bitwise_or.Tensor (aten.lt.Scalar %r0:t 3) (aten.ge.Scalar %r0:t 7)) 0) (list 5 1)) (aten.arange.start 0 4 none none dev b:false)) (aten.bitwise_not.default (aten.view.default (aten.bitwise_or.Tensor (aten.lt.Scalar %r0:t 3) (aten.ge.Scalar %r0:t 7)) (list 5 1))))",
                &[("t", "i64[5]<10")],
            ),
            // Operands the other way round, shard at 0.
            (
                "(aten.bitwise_and.Tensor (aten.bitwise_not.default (aten.view.default (aten.bitwise_or.Tensor (aten.lt.Scalar %r0:t 0) (aten.ge.Scalar %r0:t 3)) (list 2 3 1))) (aten.eq.Tensor (aten.arange.start 0 3 none none dev b:false) (aten.view.default (aten.masked_fill.Scalar %r0:t (aten.bitwise_or.Tensor (aten.lt.Scalar %r0:t 0) (aten.ge.Scalar %r0:t 3)) 2) (list 2 3 1))))",
                &[("t", "i64[2,3]<6")],
            ),
        ],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            let Some(out) = shape(g, eclass) else { return vec![] };
            let Some((&w, lead)) = out.split_last() else { return vec![] };
            let mut unit_col = lead.to_vec();
            unit_col.push(1);
            let mut found = Vec::new();
            for (eq_side, not_side) in [(kids[0], kids[1]), (kids[1], kids[0])] {
                let masks: Vec<Id> = g[not_side]
                    .nodes
                    .iter()
                    .filter_map(|n| match n {
                        Term::Op(s, k) if is_op!(s, "aten.bitwise_not.default") => Some(k[0]),
                        _ => None,
                    })
                    .filter(|&m| shape(g, m).as_deref() == Some(&unit_col[..]))
                    .collect();
                if masks.is_empty() {
                    continue;
                }
                for n in &g[eq_side].nodes {
                    let Term::Op(s, k) = n else { continue };
                    if !is_op!(s, "aten.eq.Tensor") {
                        continue;
                    }
                    for (col, range) in [(k[0], k[1]), (k[1], k[0])] {
                        if shape(g, col).as_deref() != Some(&unit_col[..])
                            || shape(g, range).as_deref() != Some(&[w][..])
                            || !super::is_arange(g, range, w)
                        {
                            continue;
                        }
                        for idx in views(g, col) {
                            if shape(g, idx).as_deref() != Some(lead) {
                                continue;
                            }
                            for &m in &masks {
                                found.extend(masked_shard_index(g, idx, w, m));
                            }
                        }
                    }
                }
            }
            found
                .into_iter()
                .map(|(t, s)| {
                    let (s, w) = (num(g, s), num(g, w as i64));
                    op(g, VOCAB_ONEHOT, vec![t, s, w])
                })
                .collect()
        }),
    }
}

/// The one-hot of split targets is the cat of the pieces' one-hots (rows are independent).
fn onehot_over_cat() -> Lemma {
    Lemma {
        name: "vocab-onehot-over-cat",
        doc: "vocab_onehot(cat_d(t_i), s, w) = cat_d(vocab_onehot(t_i, s, w))",
        roots: vec![VOCAB_ONEHOT.into()],
        examples: vec![(
            "(vocab_onehot (cat 0 %r0:t %r1:t) 2 3)",
            &[("t", "i64[2,3]<6")],
        )],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            if node_sym(g, eclass, kids, &[sym!(VOCAB_ONEHOT)]).is_none() {
                return vec![];
            }
            let sym = sym!(VOCAB_ONEHOT);
            cats(g, kids[0])
                .into_iter()
                .map(|(d, pieces)| {
                    let parts = pieces
                        .iter()
                        .map(|&p| g.add(with_kids(sym, kids, &[(0, p)])))
                        .collect();
                    super::cat(g, d, parts)
                })
                .collect()
        }),
    }
}

/// The embedding gradient as rows of the whole vocabulary.
fn embedding_grad_rows() -> Lemma {
    Lemma {
        name: "embedding-grad-rows",
        doc: "embedding_dense_backward(G, t, V, -1, false) = vocab_grad(G, t, 0, V) for targets in [0, V) (the operator's own precondition)",
        roots: vec!["aten.embedding_dense_backward.default".into()],
        examples: vec![(
            "(aten.embedding_dense_backward.default %r0:g %r0:t 5 -1 b:false)",
            &[("g", "f64[2,3,4]"), ("t", "i64[2,3]<5")],
        )],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            if node_sym(g, eclass, kids, &[sym!("aten.embedding_dense_backward.default")]).is_none()
                || int(g, kids[3]) != Some(-1)
                || !is_false(g, kids[4])
                || int(g, kids[2]).is_none()
            {
                return vec![];
            }
            let zero = num(g, 0);
            vec![op(g, VOCAB_GRAD, vec![kids[0], kids[1], zero, kids[2]])]
        }),
    }
}

/// An embedding gradient over split tokens (data parallelism) is the sum of the pieces'
/// gradients: every token adds its gradient row to its own vocabulary row.
fn grad_over_cat() -> Lemma {
    Lemma {
        name: "vocab-grad-over-cat",
        doc: "vocab_grad(cat_d(G_i), cat_d(t_i), s, n) = sum_i vocab_grad(G_i, t_i, s, n) for d a dim of the targets, G and t split alike",
        roots: vec![VOCAB_GRAD.into()],
        examples: vec![(
            "(vocab_grad (cat 0 %r0:g %r1:g) (cat 0 %r0:t %r1:t) 1 4)",
            &[("g", "f64[1,3,2]"), ("t", "i64[1,3]<6")],
        )],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            if node_sym(g, eclass, kids, &[sym!(VOCAB_GRAD)]).is_none() {
                return vec![];
            }
            let Some(rank) = shape(g, kids[1]).map(|s| s.len()) else { return vec![] };
            let sym = sym!(VOCAB_GRAD);
            let mut out = Vec::new();
            for (d, grads) in cats(g, kids[0]) {
                if d >= rank {
                    continue;
                }
                let Some(szs) = sizes(g, &grads, d) else { continue };
                let targets = cats(g, kids[1])
                    .into_iter()
                    .find(|(td, ts)| *td == d && sizes(g, ts, d).as_deref() == Some(&szs[..]));
                let Some((_, targets)) = targets else { continue };
                let parts = grads
                    .iter()
                    .zip(&targets)
                    .map(|(&gp, &tp)| g.add(with_kids(sym, kids, &[(0, gp), (1, tp)])))
                    .collect();
                out.push(op(g, SUM, parts));
            }
            out
        }),
    }
}

/// The rows of an embedding gradient are the cat of the shards' rows that tile them. Only
/// shard terms already in the e-graph (the ranks' masked embedding backwards) are joined:
/// they say how the vocabulary is split, which the spec's own operator does not.
fn grad_join() -> Lemma {
    Lemma {
        name: "vocab-grad-join",
        doc: "vocab_grad(G, t, s, n) = cat_0(vocab_grad(G, t, s, n_1), vocab_grad(G, t, s + n_1, n_2), ..) for shard terms of the same G and t present in the e-graph that tile [s, s + n)",
        roots: vec![VOCAB_GRAD.into()],
        examples: vec![(
            "(cat 0 (vocab_grad %r0:g %r0:t 0 5) (vocab_grad %r0:g %r0:t 0 2) (vocab_grad %r0:g %r0:t 2 3))",
            &[("g", "f64[2,3,4]"), ("t", "i64[2,3]<6")],
        )],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            let (Some(start), Some(rows)) = (int(g, kids[2]), int(g, kids[3])) else {
                return vec![];
            };
            if node_sym(g, eclass, kids, &[sym!(VOCAB_GRAD)]).is_none() {
                return vec![];
            }
            let (grad, t) = (g.find(kids[0]), g.find(kids[1]));
            let sym = sym!(VOCAB_GRAD);
            let classes: Vec<Id> = g
                .classes_for_op(&Some(sym))
                .map_or_else(Vec::new, |c| c.collect());
            // Shards of the same gradient and targets inside [start, start + rows), by start.
            let mut shards: Vec<(i64, i64, Id)> = Vec::new();
            for c in classes {
                for n in &g[c].nodes {
                    let Term::Op(s, k) = n else { continue };
                    if *s != sym || g.find(k[0]) != grad || g.find(k[1]) != t {
                        continue;
                    }
                    if let (Some(a), Some(m)) = (int(g, k[2]), int(g, k[3])) {
                        if a >= start && m > 0 && m < rows && a + m <= start + rows {
                            shards.push((a, m, g.find(c)));
                        }
                    }
                }
            }
            // Greedy tiling: at each offset, the widest shard starting there.
            let mut pieces = Vec::new();
            let mut at = start;
            while at < start + rows {
                let Some(&(_, m, c)) = shards
                    .iter()
                    .filter(|(a, _, _)| *a == at)
                    .max_by_key(|(_, m, _)| *m)
                else {
                    return vec![];
                };
                pieces.push(c);
                at += m;
            }
            vec![super::cat(g, 0, pieces)]
        }),
    }
}

/// A rank sum of tensors split alike is split the same way: under dp x tp the embedding
/// gradient is a sum over dp pieces of the tp shards' concatenation, which the ranks all-reduce
/// shard by shard (the converse of `cat-of-sums`).
fn sum_of_cats() -> Lemma {
    Lemma {
        name: "sum-of-cats",
        doc: "sum_i cat_d(x_i1, .., x_ik) = cat_d(sum_i x_i1, .., sum_i x_ik) for operands split alike along d",
        roots: vec![SUM.into()],
        examples: vec![(
            "(sum (cat 0 %r0:a %r1:b) (cat 0 %r2:a %r3:b))",
            &[("a", "f64[2,3]"), ("b", "f64[1,3]")],
        )],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let Some((&first, rest)) = kids.split_first() else { return vec![] };
            let mut out = Vec::new();
            for (d, pieces) in cats(g, first) {
                let Some(szs) = sizes(g, &pieces, d) else { continue };
                let mut operands = vec![pieces];
                for &k in rest {
                    let alike = cats(g, k)
                        .into_iter()
                        .find(|(e, ps)| *e == d && sizes(g, ps, d).as_deref() == Some(&szs[..]));
                    match alike {
                        Some((_, ps)) => operands.push(ps),
                        None => break,
                    }
                }
                if operands.len() != kids.len() {
                    continue;
                }
                let parts = (0..szs.len())
                    .map(|j| {
                        let terms = operands.iter().map(|ps| ps[j]).collect();
                        op(g, SUM, terms)
                    })
                    .collect();
                out.push(super::cat(g, d, parts));
            }
            out
        }),
    }
}

/// Megatron's masked embedding backward: each rank zeroes the gradient rows of the tokens
/// outside its range and accumulates the others at their shard-local index.
fn masked_embedding_grad() -> Lemma {
    Lemma {
        name: "vocab-masked-embedding-grad",
        doc: "embedding_dense_backward(masked_fill(G, view(m, [.., 1]), 0), masked_fill(t - s, m, c), n, -1, false) with m = (t < s) | (t >= s + n), 0 <= c < n, is vocab_grad(G, t, s, n)",
        roots: vec!["aten.embedding_dense_backward.default".into()],
        examples: vec![(
            "(aten.embedding_dense_backward.default (aten.masked_fill.Scalar %r0:g (aten.view.default (aten.bitwise_or.Tensor (aten.lt.Scalar %r0:t 3) (aten.ge.Scalar %r0:t 6)) (list 2 3 1)) f:0.0) (aten.masked_fill.Scalar (aten.sub.Scalar %r0:t 3 1) (aten.bitwise_or.Tensor (aten.lt.Scalar %r0:t 3) (aten.ge.Scalar %r0:t 6)) 0) 3 -1 b:false)",
            &[("g", "f64[2,3,4]"), ("t", "i64[2,3]<9")],
        )],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            if node_sym(g, eclass, kids, &[sym!("aten.embedding_dense_backward.default")]).is_none()
                || int(g, kids[3]) != Some(-1)
                || !is_false(g, kids[4])
            {
                return vec![];
            }
            let Some(n) = int(g, kids[2]).and_then(|n| usize::try_from(n).ok()) else {
                return vec![];
            };
            let Some(idx_shape) = shape(g, kids[1]) else { return vec![] };
            let mut unit_col = idx_shape.clone();
            unit_col.push(1);
            let fills: Vec<(Id, Id)> = g[kids[0]]
                .nodes
                .iter()
                .filter_map(|node| match node {
                    Term::Op(s, k) if is_op!(s, "aten.masked_fill.Scalar") && k.len() == 3 => {
                        Some((k[0], k[1], k[2]))
                    }
                    _ => None,
                })
                .filter(|&(_, m, v)| {
                    super::is_zero(g, v) && shape(g, m).as_deref() == Some(&unit_col[..])
                })
                .map(|(grad, m, _)| (grad, m))
                .collect();
            let mut out = Vec::new();
            for (grad, m) in fills {
                for (t, s) in masked_shard_index(g, kids[1], n, m) {
                    let s = num(g, s);
                    out.push(op(g, VOCAB_GRAD, vec![grad, t, s, kids[2]]));
                }
            }
            out
        }),
    }
}

/// Slicing the vocabulary dim of a shard term narrows the shard; slicing another dim of a
/// one-hot slices its targets; a slice moves inside the float cast of a one-hot.
fn vocab_slice() -> Lemma {
    Lemma {
        name: "vocab-slice",
        doc: "slice(last, a, b, vocab_onehot(t, s, w)) = vocab_onehot(t, s + a, b - a); slice(d, a, b, vocab_onehot(t, s, w)) = vocab_onehot(slice(d, a, b, t), s, w) for another dim; slice(0, a, b, vocab_grad(G, t, s, n)) = vocab_grad(G, t, s + a, b - a); slice(_to_copy(x)) = _to_copy(slice(x)) for x a one-hot",
        roots: vec![SLICE.into()],
        examples: vec![
            ("(slice 1 1 3 (vocab_onehot %r0:t 2 4))", &[("t", "i64[3]<8")]),
            ("(slice 0 1 3 (vocab_onehot %r0:t 2 4))", &[("t", "i64[3,2]<8")]),
            ("(slice 0 2 5 (vocab_grad %r0:g %r0:t 1 6))", &[("g", "f64[2,3,4]"), ("t", "i64[2,3]<8")]),
            (
                "(slice 1 0 2 (aten._to_copy.default (vocab_onehot %r0:t 0 4) dt:f64 none none none b:false none))",
                &[("t", "i64[3]<4")],
            ),
        ],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let (Some(d), Some(a), Some(b)) = (int(g, kids[0]), int(g, kids[1]), int(g, kids[2]))
            else {
                return vec![];
            };
            let x = kids[3];
            let Some(rank) = shape(g, x).map(|s| s.len() as i64) else { return vec![] };
            let mut out = Vec::new();
            for node in g[x].nodes.clone() {
                let Term::Op(sym, k) = node else { continue };
                match sym.as_str() {
                    VOCAB_ONEHOT if d == rank - 1 => {
                        let Some(s) = int(g, k[1]) else { continue };
                        let (s, w) = (num(g, s + a), num(g, b - a));
                        out.push(op(g, VOCAB_ONEHOT, vec![k[0], s, w]));
                    }
                    VOCAB_ONEHOT => {
                        let t = slice(g, d as usize, a as usize, b as usize, k[0]);
                        out.push(op(g, VOCAB_ONEHOT, vec![t, k[1], k[2]]));
                    }
                    VOCAB_GRAD if d == 0 => {
                        let Some(s) = int(g, k[2]) else { continue };
                        let (s, n) = (num(g, s + a), num(g, b - a));
                        out.push(op(g, VOCAB_GRAD, vec![k[0], k[1], s, n]));
                    }
                    "aten._to_copy.default" if super::ring::has(g, k[0], VOCAB_ONEHOT) => {
                        let inner = slice(g, d as usize, a as usize, b as usize, k[0]);
                        out.push(g.add(with_kids(sym, &k, &[(0, inner)])));
                    }
                    _ => {}
                }
            }
            out
        }),
    }
}

/// Whether a class is a 0-d tensor filled with one (the backward's seed).
fn is_unit_seed(g: &Graph, id: Id) -> bool {
    shape(g, id).is_some_and(|s| s.is_empty())
        && g[id].nodes.iter().any(|n| match n {
            Term::Op(s, k) => is_op!(s, "aten.full.default") && k.len() >= 2 && is_one(g, k[1]),
            _ => false,
        })
}

/// The cross-entropy backward as softmax minus one-hot, in the max / sum-exp form that
/// vocab-parallel cross-entropy computes.
fn log_softmax_backward_of_nll() -> Lemma {
    Lemma {
        name: "log-softmax-backward-of-nll",
        doc: "with no ignored targets (every target indexes a class), _log_softmax_backward_data(nll_loss_backward(g, y, t, None, sum), y, 1) with y = log_softmax(x, 1) over [N, C] is g * (e / sum(e, 1) - float(vocab_onehot(t, 0, C))), e = exp(x - amax(x, 1)): softmax minus one-hot",
        roots: vec!["aten._log_softmax_backward_data.default".into()],
        examples: vec![
            (
                "(aten._log_softmax_backward_data.default (aten.nll_loss_backward.default %r0:g (aten._log_softmax.default %r0:x 1 b:false) %r0:t none 2 -100 %r0:w) (aten._log_softmax.default %r0:x 1 b:false) 1 dt:f64)",
                &[("g", "f64[]"), ("x", "f64[4,5]"), ("t", "i64[4]<5"), ("w", "f64[]")],
            ),
            (
                "(aten._log_softmax_backward_data.default (aten.nll_loss_backward.default (aten.full.default (list) f:1.0 dt:f64 none dev b:false) (aten._log_softmax.default %r0:x 1 b:false) %r0:t none 2 -100 %r0:w) (aten._log_softmax.default %r0:x 1 b:false) 1 dt:f64)",
                &[("x", "f64[3,4]"), ("t", "i64[3]<4"), ("w", "f64[]")],
            ),
        ],
        requires: Some("ignore-index"),
        build: Arc::new(|g, eclass, kids| {
            let (dy, y, dim, dt) = (kids[0], kids[1], kids[2], kids[3]);
            if node_sym(g, eclass, kids, &[sym!("aten._log_softmax_backward_data.default")]).is_none()
                || int(g, dim) != Some(1)
            {
                return vec![];
            }
            let Some(meta) = g[eclass].data.meta().cloned() else { return vec![] };
            let dtype = format!("dt:{}", meta.dtype.short_name());
            // The result is in the gradient's own dtype (no cast back to another input dtype).
            let dt_ok = g[dt]
                .nodes
                .iter()
                .any(|n| matches!(n, Term::Op(s, k) if k.is_empty() && s.as_str() == dtype));
            if !dt_ok || g[dy].data.meta() != Some(&meta) || meta.shape.len() != 2 {
                return vec![];
            }
            let xs: Vec<Id> = g[y]
                .nodes
                .iter()
                .filter_map(|n| match n {
                    Term::Op(s, k) if is_op!(s, "aten._log_softmax.default") && k.len() == 3 => {
                        (int(g, k[1]) == Some(1) && is_false(g, k[2]) && g[k[0]].data.meta() == Some(&meta))
                            .then_some(k[0])
                    }
                    _ => None,
                })
                .collect();
            if xs.is_empty() {
                return vec![];
            }
            let (rows, classes) = (meta.shape[0], meta.shape[1]);
            let calls: Vec<(Id, Id)> = g[dy]
                .nodes
                .iter()
                .filter_map(|n| match n {
                    Term::Op(s, k) if is_op!(s, "aten.nll_loss_backward.default") && k.len() == 7 => Some(k.clone()),
                    _ => None,
                })
                .filter(|k| {
                    g.find(k[1]) == g.find(y)
                        && is_none(g, k[3])
                        && int(g, k[4]) == Some(2)
                        && shape(g, k[0]).is_some_and(|s| s.is_empty())
                        && shape(g, k[2]).as_deref() == Some(&[rows][..])
                })
                .map(|k| (k[0], k[2]))
                .collect();
            let mut out = Vec::new();
            for (seed, t) in calls {
                for &x in &xs {
                    let dims = {
                        let one = num(g, 1);
                        op(g, LIST, vec![one])
                    };
                    let yes = op(g, "b:true", vec![]);
                    let none = op(g, "none", vec![]);
                    let one = num(g, 1);
                    let amax = op(g, "aten.amax.default", vec![x, dims, yes]);
                    let shifted = op(g, "aten.sub.Tensor", vec![x, amax, one]);
                    let e = op(g, "aten.exp.default", vec![shifted]);
                    let se = op(g, "aten.sum.dim_IntList", vec![e, dims, yes, none]);
                    let softmax = op(g, "aten.div.Tensor", vec![e, se]);
                    let (zero, width) = (num(g, 0), num(g, classes as i64));
                    let onehot = op(g, VOCAB_ONEHOT, vec![t, zero, width]);
                    let dtn = op(g, &dtype, vec![]);
                    let no = op(g, "b:false", vec![]);
                    let onehot = op(
                        g,
                        "aten._to_copy.default",
                        vec![onehot, dtn, none, none, none, no, none],
                    );
                    let diff = op(g, "aten.sub.Tensor", vec![softmax, onehot, one]);
                    out.push(if is_unit_seed(g, seed) {
                        diff
                    } else {
                        op(g, "aten.mul.Tensor", vec![diff, seed])
                    });
                }
            }
            out
        }),
    }
}

/// The rows' masks `m` of a class holding `rsub(float(m'), 1)` (= `1 - float(m')`), with `m'`
/// the mask itself or a view of it.
fn kept_row_masks(g: &Graph, v: Id) -> Vec<Id> {
    let floats: Vec<Id> = g[v]
        .nodes
        .iter()
        .filter_map(|n| match n {
            Term::Op(s, k)
                if is_op!(s, "aten.rsub.Scalar")
                    && k.len() == 3
                    && is_one(g, k[1])
                    && int(g, k[2]) == Some(1) =>
            {
                Some(k[0])
            }
            _ => None,
        })
        .collect();
    let mut masks = Vec::new();
    for f in floats {
        for n in &g[f].nodes {
            let Term::Op(s, k) = n else { continue };
            if is_op!(s, "aten._to_copy.default") && !k.is_empty() {
                masks.push(k[0]);
                masks.extend(views(g, k[0]));
            }
        }
    }
    masks
}

/// Megatron-core's vocab-parallel cross-entropy backward (0.16: `grad_2d[arange, masked_target]
/// -= 1 - target_mask`) subtracts the shard's one-hot from the softmax in place: row `r` of
/// `[n, w]` loses `1 - m[r]` at column `masked_target[r]`. The index is in `[0, w)` (the mask's
/// fill `c` is, and an unmasked `t - s` is), and `arange(n)` writes each row once, so only the
/// target's column of an in-range row changes, by one.
fn onehot_subtracted_in_place() -> Lemma {
    Lemma {
        name: "vocab-onehot-subtracted-in-place",
        doc: "index_put(x, [arange(n), i], index(x, [arange(n), i]) - rsub(float(view(m, [n])), 1)) over x [n, w] with i = view(masked_fill(t - s, m, c), [n]), m = (t < s) | (t >= s + w), 0 <= c < w, is x - float(vocab_onehot(view(t, [n]), s, w))",
        roots: vec!["aten.index_put.default".into()],
        examples: vec![
            // Targets [2, 3] flattened to 6 rows, shard [3, 7).
            (
                "(aten.index_put.default %r0:x (list (aten.arange.start 0 6 none none dev b:false) (aten.view.default (aten.masked_fill.Scalar (aten.sub.Tensor %r0:t 3 1) (aten.bitwise_or.Tensor (aten.lt.Scalar %r0:t 3) (aten.ge.Scalar %r0:t 7)) 0) (list 6))) (aten.sub.Tensor (aten.index.Tensor %r0:x (list (aten.arange.start 0 6 none none dev b:false) (aten.view.default (aten.masked_fill.Scalar (aten.sub.Tensor %r0:t 3 1) (aten.bitwise_or.Tensor (aten.lt.Scalar %r0:t 3) (aten.ge.Scalar %r0:t 7)) 0) (list 6)))) (aten.rsub.Scalar (aten._to_copy.default (aten.view.default (aten.bitwise_or.Tensor (aten.lt.Scalar %r0:t 3) (aten.ge.Scalar %r0:t 7)) (list 6)) dt:f64 none none none b:false none) f:1.0 1) 1) b:false)",
                &[("x", "f64[6,4]"), ("t", "i64[2,3]<10")],
            ),
            // The whole vocabulary (the single-device program): shard [0, 4), fill 2.
            (
                "(aten.index_put.default %r0:x (list (aten.arange.start 0 5 none none dev b:false) (aten.masked_fill.Scalar %r0:t (aten.bitwise_or.Tensor (aten.lt.Scalar %r0:t 0) (aten.ge.Scalar %r0:t 4)) 2)) (aten.sub.Tensor (aten.index.Tensor %r0:x (list (aten.arange.start 0 5 none none dev b:false) (aten.masked_fill.Scalar %r0:t (aten.bitwise_or.Tensor (aten.lt.Scalar %r0:t 0) (aten.ge.Scalar %r0:t 4)) 2))) (aten.rsub.Scalar (aten._to_copy.default (aten.bitwise_or.Tensor (aten.lt.Scalar %r0:t 0) (aten.ge.Scalar %r0:t 4)) dt:f64 none none none b:false none) f:1.0 1) 1) b:false)",
                &[("x", "f64[5,4]"), ("t", "i64[5]<4")],
            ),
        ],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            if node_sym(g, eclass, kids, &[sym!("aten.index_put.default")]).is_none()
                || kids.len() != 4
                || !is_false(g, kids[3])
            {
                return vec![];
            }
            let (x, at, vals) = (g.find(kids[0]), g.find(kids[1]), kids[2]);
            let Some(meta) = g[x].data.meta().cloned() else { return vec![] };
            let &[rows, w] = &meta.shape[..] else { return vec![] };
            if !meta.dtype.is_float() {
                return vec![];
            }
            let Some([r, idx]) = list_items(g, at) else { return vec![] };
            if !super::is_arange(g, r, rows) || shape(g, idx).as_deref() != Some(&[rows][..]) {
                return vec![];
            }
            // The values: x's own elements at the same places, minus the kept-row weights.
            let weights: Vec<Id> = g[vals]
                .nodes
                .iter()
                .filter_map(|n| match n {
                    Term::Op(s, k) if is_op!(s, "aten.sub.Tensor") && k.len() == 3 && int(g, k[2]) == Some(1) => {
                        let picks_x = g[k[0]].nodes.iter().any(|p| match p {
                            Term::Op(ps, pk) if is_op!(ps, "aten.index.Tensor") && pk.len() == 2 => {
                                g.find(pk[0]) == x && g.find(pk[1]) == at
                            }
                            _ => false,
                        });
                        picks_x.then_some(k[1])
                    }
                    _ => None,
                })
                .collect();
            let mut found = Vec::new();
            for v in weights {
                let masks = kept_row_masks(g, v);
                // The index as written, or its unflattened source (targets of any shape).
                let mut sources = vec![idx];
                sources.extend(views(g, idx));
                for &src in &sources {
                    for &m in &masks {
                        if shape(g, m) != shape(g, src) {
                            continue;
                        }
                        found.extend(masked_shard_index(g, src, w, m));
                    }
                }
            }
            found.sort();
            found.dedup();
            let mut out = Vec::new();
            for (t, s) in found {
                let flat = if shape(g, t).as_deref() == Some(&[rows][..]) {
                    t
                } else {
                    let dims = super::list(g, &[rows]);
                    op(g, "aten.view.default", vec![t, dims])
                };
                let (s, width) = (num(g, s), num(g, w as i64));
                let onehot = op(g, VOCAB_ONEHOT, vec![flat, s, width]);
                let dtn = op(g, &format!("dt:{}", meta.dtype.short_name()), vec![]);
                let none = op(g, "none", vec![]);
                let no = op(g, "b:false", vec![]);
                let float = op(
                    g,
                    "aten._to_copy.default",
                    vec![onehot, dtn, none, none, none, no, none],
                );
                let one = num(g, 1);
                out.push(op(g, "aten.sub.Tensor", vec![kids[0], float, one]));
            }
            out
        }),
    }
}

/// `(t, s)` of the `bitwise_and(ge(t, s), lt(t, s + rows))` nodes of a class (either order).
fn in_range_masks(g: &Graph, m: Id, rows: i64) -> Vec<(Id, i64)> {
    let cmp = |id: Id, name: &str| -> Vec<(Id, i64)> {
        g[id]
            .nodes
            .iter()
            .filter_map(|n| match n {
                Term::Op(s, k) if s.as_str() == name && k.len() == 2 => Some((k[0], int(g, k[1])?)),
                _ => None,
            })
            .collect()
    };
    let mut out = Vec::new();
    for n in &g[m].nodes {
        let Term::Op(sym, k) = n else { continue };
        if !is_op!(sym, "aten.bitwise_and.Tensor") || k.len() != 2 {
            continue;
        }
        for (lo, hi) in [(k[0], k[1]), (k[1], k[0])] {
            for (t1, s) in cmp(lo, "aten.ge.Scalar") {
                for (t2, e) in cmp(hi, "aten.lt.Scalar") {
                    if g.find(t1) == g.find(t2) && e - s == rows {
                        out.push((t1, s));
                    }
                }
            }
        }
    }
    out
}

/// Whether class `idx` is `clamp(t - s, 0, rows - 1)` (`t` itself for `s = 0`).
fn clamped_shard_index(g: &Graph, idx: Id, t: Id, s: i64, rows: i64) -> bool {
    g[idx].nodes.iter().any(|n| match n {
        Term::Op(sym, k) if is_op!(sym, "aten.clamp.default") && k.len() == 3 => {
            let bounds = int(g, k[1]) == Some(0) && int(g, k[2]) == Some(rows - 1);
            let shifted = (s == 0 && g.find(k[0]) == g.find(t))
                || g[k[0]].nodes.iter().any(|sn| match sn {
                    Term::Op(ss, sk)
                        if matches!(ss.as_str(), "aten.sub.Tensor" | "aten.sub.Scalar")
                            && sk.len() == 3 =>
                    {
                        g.find(sk[0]) == g.find(t)
                            && int(g, sk[1]) == Some(s)
                            && int(g, sk[2]) == Some(1)
                    }
                    _ => false,
                });
            bounds && shifted
        }
        _ => false,
    })
}

/// torchtitan's vocab-parallel embedding (`models/common/embedding.py`): each rank looks up
/// the clamped shard-local index and multiplies the rows of out-of-range tokens by zero. That
/// is the shard lookup for finite weights (`0 * w = 0`, the premise the masked-block lemmas
/// share: the engine relates programs over finite inputs).
fn clamped_lookup() -> Lemma {
    Lemma {
        name: "vocab-clamped-lookup",
        doc: "embedding(w, clamp(t - s, 0, rows(w) - 1)) * float(view(m, [.., 1])) with m = (t >= s) & (t < s + rows(w)) is vocab_lookup(w, t, s) for finite w",
        roots: vec!["aten.mul.Tensor".into()],
        examples: vec![
            (
                "(aten.mul.Tensor (aten.embedding.default %r0:w (aten.clamp.default (aten.sub.Tensor %r0:t 3 1) 0 2) -1 b:false b:false) (aten._to_copy.default (aten.view.default (aten.bitwise_and.Tensor (aten.ge.Scalar %r0:t 3) (aten.lt.Scalar %r0:t 6)) (list 2 4 1)) dt:f64 none none none b:false none))",
                &[("w", "f64[3,5]"), ("t", "i64[2,4]<9")],
            ),
            // The first shard (no shift), the mask first and its comparisons the other way round.
            (
                "(aten.mul.Tensor (aten._to_copy.default (aten.view.default (aten.bitwise_and.Tensor (aten.lt.Scalar %r0:t 4) (aten.ge.Scalar %r0:t 0)) (list 3 1)) dt:f64 none none none b:false none) (aten.embedding.default %r0:w (aten.clamp.default %r0:t 0 3) -1 b:false b:false))",
                &[("w", "f64[4,2]"), ("t", "i64[3]<8")],
            ),
        ],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            if node_sym(g, eclass, kids, &[sym!("aten.mul.Tensor")]).is_none() || kids.len() != 2 {
                return vec![];
            }
            let Some(meta) = g[eclass].data.meta().cloned() else { return vec![] };
            let mut out = Vec::new();
            for (rows_side, mask_side) in [(kids[0], kids[1]), (kids[1], kids[0])] {
                if g[rows_side].data.meta() != Some(&meta) {
                    continue;
                }
                let masks: Vec<Id> = g[mask_side]
                    .nodes
                    .iter()
                    .filter_map(|n| match n {
                        Term::Op(s, k) if is_op!(s, "aten._to_copy.default") && !k.is_empty() => Some(k[0]),
                        _ => None,
                    })
                    .flat_map(|col| views(g, col))
                    .collect();
                let lookups: Vec<(Id, Id)> = g[rows_side]
                    .nodes
                    .iter()
                    .filter_map(|n| match n {
                        Term::Op(s, k)
                            if is_op!(s, "aten.embedding.default") && k.len() == 5 && int(g, k[2]) == Some(-1) =>
                        {
                            Some((k[0], k[1]))
                        }
                        _ => None,
                    })
                    .collect();
                for (w, idx) in lookups {
                    let Some(rows) = shape(g, w).and_then(|s| s.first().copied()) else { continue };
                    let Some(tshape) = shape(g, idx) else { continue };
                    let mut col = tshape.clone();
                    col.push(1);
                    if shape(g, mask_side).as_deref() != Some(&col[..]) {
                        continue;
                    }
                    for &m in &masks {
                        if shape(g, m).as_deref() != Some(&tshape[..]) {
                            continue;
                        }
                        for (t, s) in in_range_masks(g, m, rows as i64) {
                            if clamped_shard_index(g, idx, t, s, rows as i64) {
                                let sn = num(g, s);
                                out.push(op(g, crate::term::VOCAB_LOOKUP, vec![w, t, sn]));
                            }
                        }
                    }
                }
            }
            out
        }),
    }
}
