//! Row-wise operators (softmax, normalizations, losses, embeddings, index operators) act row
//! by row along dims they leave unpartitioned, so they act piece by piece on concatenations
//! along them.

use super::ring;
use super::{
    calls2, cat, cats, ew, int, int_list, is_arange, is_false, is_none, is_zero,
    last_dim_column_gathers, list, list_items, masked_shard_index, node_sym, num, op,
    output_per_piece, output_per_piece_at, scale, scales, shape, sizes, split_elementwise, sums,
    views, with_kids, Graph, Lemma,
};
use crate::term::{is_op, sym, Term, GET, LIST, SUM};
use egg::{Id, Symbol};
use std::sync::Arc;

/// The lemmas of this family, in the library's order.
pub(super) fn lemmas() -> Vec<Lemma> {
    let mut l = Vec::new();
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
            let roots = [sym!("aten._softmax.default"), sym!("aten._log_softmax.default"), sym!("aten._softmax_backward_data.default"), sym!("aten._log_softmax_backward_data.default")];
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
        name: "apex-norm-backward-over-cat",
        doc: "apex's fused layer norm backward with the gradient and input split alike along dim 0 and the flattened per-row statistics (mean, invvar) split into the matching row ranges: the input gradient is per piece (cat along 0), the weight and bias gradients are the sum of the pieces' (Megatron's sequence-parallel layer norm, whose weight gradients are partial sums over tp)",
        roots: vec![GET.into()],
        examples: vec![
            ("(get 0 (apex.fused_layer_norm_affine_bwd.default (cat 0 %r0:g %r1:g) (cat 0 %r0:m %r1:m) (cat 0 %r0:r %r1:r) (cat 0 %r0:x %r1:x) (list 3) %r0:w %r0:b f:1e-5 b:false))", &[("g", "f64[2,2,3]"), ("x", "f64[2,2,3]"), ("m", "f64[4]"), ("r", "f64[4]"), ("w", "f64[3]"), ("b", "f64[3]")]),
            ("(get 1 (apex.fused_layer_norm_affine_bwd.default (cat 0 %r0:g %r1:g) (cat 0 %r0:m %r1:m) (cat 0 %r0:r %r1:r) (cat 0 %r0:x %r1:x) (list 3) %r0:w %r0:b f:1e-5 b:false))", &[("g", "f64[2,2,3]"), ("x", "f64[2,2,3]"), ("m", "f64[4]"), ("r", "f64[4]"), ("w", "f64[3]"), ("b", "f64[3]")]),
            ("(get 2 (apex.fused_layer_norm_affine_bwd.default (cat 0 %r0:g %r1:g) (cat 0 %r0:m %r1:m) (cat 0 %r0:r %r1:r) (cat 0 %r0:x %r1:x) (list 3) %r0:w %r0:b f:1e-5 b:false))", &[("g", "f64[1,2,3]"), ("x", "f64[1,2,3]"), ("m", "f64[2]"), ("r", "f64[2]"), ("w", "f64[3]"), ("b", "f64[3]")]),
        ],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let Some(k) = int(g, kids[0]) else { return vec![] };
            let mut out = Vec::new();
            for n in g[kids[1]].nodes.clone() {
                let Term::Op(s, ck) = n else { continue };
                if !is_op!(s, "apex.fused_layer_norm_affine_bwd.default") || ck.len() < 8 {
                    continue;
                }
                let (Some(normalized), Some(x)) = (int_list(g, ck[4]), shape(g, ck[3])) else {
                    continue;
                };
                let rows = x.len().saturating_sub(normalized.len());
                if rows == 0 {
                    continue;
                }
                // Statistics rows per index of dim 0.
                let per: usize = x[1..rows].iter().product();
                for (d, xs) in cats(g, ck[3]) {
                    let Some(szs) = sizes(g, &xs, d) else { continue };
                    if d != 0 {
                        continue;
                    }
                    let split = |g: &Graph, id: Id, want: &[usize]| {
                        cats(g, id)
                            .into_iter()
                            .find(|(e, ps)| *e == 0 && sizes(g, ps, 0).as_deref() == Some(want))
                            .map(|(_, ps)| ps)
                    };
                    let stat_sizes: Vec<usize> = szs.iter().map(|n| n * per).collect();
                    let (Some(gs), Some(ms), Some(rs)) = (
                        split(g, ck[0], &szs),
                        split(g, ck[1], &stat_sizes),
                        split(g, ck[2], &stat_sizes),
                    ) else {
                        continue;
                    };
                    let parts: Vec<Id> = (0..xs.len())
                        .map(|i| {
                            let call = g.add(with_kids(
                                s,
                                &ck,
                                &[(0, gs[i]), (1, ms[i]), (2, rs[i]), (3, xs[i])],
                            ));
                            op(g, GET, vec![kids[0], call])
                        })
                        .collect();
                    out.push(if k == 0 { cat(g, 0, parts) } else { op(g, SUM, parts) });
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
            let roots = [sym!("aten.embedding.default"), sym!(crate::term::VOCAB_LOOKUP), sym!(crate::term::VOCAB_PICK)];
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
            let Some(s) = node_sym(g, eclass, kids, &[sym!("aten.nll_loss_backward.default")]) else { return vec![] };
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
            let Some(sym) = node_sym(g, eclass, kids, &[sym!("aten.embedding_dense_backward.default")]) else { return vec![] };
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
            for (x, idx_col, w) in last_dim_column_gathers(g, kids[0]) {
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
            let sym = sym!("aten.embedding.default");
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
    l
}
