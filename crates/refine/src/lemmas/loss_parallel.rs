//! Lemmas for DTensor's `loss_parallel` cross-entropy (torch/distributed/tensor/parallel/loss.py).
//!
//! Under `loss_parallel` each rank holds a vocabulary shard of the logits and computes the
//! log-softmax of the whole row from an all-reduced max and sum of exponentials; the target
//! log-probability is a `gather` at a shard-local index, masked outside the shard and
//! all-reduced; ignored targets are handled by `where(target != ignore_index, ..)` and the
//! mean divides by the count of kept targets. The backward writes the shard's negated one-hot
//! with an `index_put` into zeros and adds `exp(log_softmax)`.
//!
//! The spec side meets these forms through a few canonical terms: the log-softmax as max,
//! shift and log-sum-exp (only where its row is split into vocabulary shards), the summed NLL
//! as minus the sum of the picked log-probabilities (`vocab_pick`), and the one-hot as
//! `vocab_onehot`. The lemmas that read `target != ignore_index` as all true need the case's
//! `assume: { ignore-index: unused }`, and they apply only to tensors an NLL call in the
//! e-graph reads as its targets with that ignore index.

use super::{
    cats, int, is_false, is_one, is_zero, last_dim_column_gathers, list, list_items,
    masked_shard_index, num, op, scale, shape, views, Graph, Lemma, LIST, SUM,
};
use crate::term::{is_op, Term, VOCAB_ONEHOT, VOCAB_PICK};
use egg::Id;
use std::sync::Arc;

/// The assumption the target-mask lemmas need.
const IGNORE_INDEX: &str = "ignore-index";

/// The lemmas of this module.
pub(super) fn lemmas() -> Vec<Lemma> {
    vec![
        log_softmax_over_vocab_shards(),
        nll_as_pick(),
        kept_targets_select(),
        kept_targets_count(),
        masked_gather_column(),
        shard_onehot_by_index_put(),
        exp_of_log_shift(),
        fill_like(),
        log_softmax_backward_of_nll(),
    ]
}

/// Whether class `t` holds the targets (or a view of them) of an NLL call in the e-graph
/// whose ignore index is `c`: under `ignore-index: unused` such targets never equal `c`.
fn loss_target(g: &Graph, t: Id, c: i64) -> bool {
    let t = g.find(t);
    let mut aliases = vec![t];
    aliases.extend(views(g, t).into_iter().map(|v| g.find(v)));
    // One more level: `unsqueeze(view(target))` as DTensor's backward builds it.
    for v in aliases.clone() {
        aliases.extend(views(g, v).into_iter().map(|w| g.find(w)));
    }
    for (sym, target_at, ignore_at) in [
        ("aten.nll_loss_forward.default", 1, 4),
        ("aten.nll_loss_backward.default", 2, 5),
    ] {
        for class in super::classes_of(g, sym) {
            for n in &g[class].nodes {
                let Term::Op(s, k) = n else { continue };
                if s.as_str() != sym || k.len() <= ignore_at || int(g, k[ignore_at]) != Some(c) {
                    continue;
                }
                let target = g.find(k[target_at]);
                if aliases.contains(&target)
                    || views(g, target)
                        .iter()
                        .any(|&v| aliases.contains(&g.find(v)))
                {
                    return true;
                }
            }
        }
    }
    false
}

/// `(t, c)` of the `ne.Scalar(t, c)` nodes of a class whose `t` is a loss target with ignore
/// index `c`.
fn kept_target_mask(g: &Graph, id: Id) -> Option<Id> {
    g[id].nodes.iter().find_map(|n| match n {
        Term::Op(s, k) if is_op!(s, "aten.ne.Scalar") && k.len() == 2 => {
            let c = int(g, k[1])?;
            loss_target(g, k[0], c).then_some(k[0])
        }
        _ => None,
    })
}

/// The log-softmax along a dim split into shards, in the max / shift / log-sum-exp form that
/// `loss_parallel` computes per shard.
fn log_softmax_over_vocab_shards() -> Lemma {
    Lemma {
        name: "log-softmax-over-vocab-shards",
        doc: "_log_softmax(x, d, false) = (x - m) - log(sum_d(exp(x - m), keepdim)), m = amax_d(x, keepdim), for x a cat along d (the vocabulary shards of loss_parallel)",
        roots: vec!["aten._log_softmax.default".into()],
        examples: vec![(
            "(aten._log_softmax.default (cat 1 %r0:x %r1:x) 1 b:false)",
            &[("x", "f64[3,2]")],
        )],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let (x, d) = (kids[0], kids[1]);
            let Some(dim) = int(g, d) else { return vec![] };
            if !is_false(g, kids[2]) || !cats(g, x).iter().any(|(cd, _)| *cd as i64 == dim) {
                return vec![];
            }
            let dims = op(g, LIST, vec![d]);
            let yes = op(g, "b:true", vec![]);
            let none = op(g, "none", vec![]);
            let one = num(g, 1);
            let m = op(g, "aten.amax.default", vec![x, dims, yes]);
            let shifted = op(g, "aten.sub.Tensor", vec![x, m, one]);
            let e = op(g, "aten.exp.default", vec![shifted]);
            let se = op(g, "aten.sum.dim_IntList", vec![e, dims, yes, none]);
            let lse = op(g, "aten.log.default", vec![se]);
            vec![op(g, "aten.sub.Tensor", vec![shifted, lse, one])]
        }),
    }
}

/// The summed NLL as minus the sum of the picked log-probabilities.
fn nll_as_pick() -> Lemma {
    Lemma {
        name: "nll-as-pick",
        doc: "with no ignored targets (every target indexes a class), get(0, nll_loss_forward(y, t, None, sum, c)) over y [N, C] is -sum(vocab_pick(y, t, 0))",
        roots: vec!["get".into()],
        examples: vec![(
            "(get 0 (aten.nll_loss_forward.default %r0:y %r0:t none 2 -100))",
            &[("y", "f64[4,5]"), ("t", "i64[4]<5")],
        )],
        requires: Some(IGNORE_INDEX),
        build: Arc::new(|g, _, kids| {
            if int(g, kids[0]) != Some(0) {
                return vec![];
            }
            let mut out = Vec::new();
            for n in g[kids[1]].nodes.clone() {
                let Term::Op(s, k) = n else { continue };
                if !is_op!(s, "aten.nll_loss_forward.default")
                    || k.len() != 5
                    || int(g, k[3]) != Some(2)
                    || !super::is_none(g, k[2])
                {
                    continue;
                }
                let (y, t) = (k[0], k[1]);
                let (Some(ys), Some(ts)) = (shape(g, y), shape(g, t)) else { continue };
                if ys.len() != 2 || ts.len() != 1 || ts[0] != ys[0] {
                    continue;
                }
                let zero = num(g, 0);
                let pick = op(g, VOCAB_PICK, vec![y, t, zero]);
                let none = op(g, "none", vec![]);
                let total = op(g, "aten.sum.default", vec![pick, none]);
                out.push(op(g, "aten.neg.default", vec![total]));
                out.push(scale(g, -1, 1, total));
            }
            out
        }),
    }
}

/// `where(target != ignore_index, a, b)` is `a` when no target is ignored; a product with such
/// a selection of a 0-d `a` is the product with `a`.
fn kept_targets_select() -> Lemma {
    Lemma {
        name: "kept-targets-select",
        doc: "with no ignored targets, where(ne(t, c), a, b) = a for t the targets of an NLL with ignore index c and a of the result's shape; mul(x, where(ne(t, c), a, b)) = mul(x, a) for a 0-d a and x of the product's shape",
        roots: vec!["aten.where.self".into(), "aten.mul.Tensor".into()],
        examples: vec![
            // The NLL call beside the selection names its targets.
            (
                "(aten.add.Tensor (aten.where.self (aten.ne.Scalar %r0:t -100) %r0:a %r0:b) (get 0 (aten.nll_loss_forward.default %r0:y %r0:t none 2 -100)) 1)",
                &[("t", "i64[4]<5"), ("a", "f64[4]"), ("b", "f64[4]"), ("y", "f64[4,5]")],
            ),
            (
                "(aten.add.Tensor (aten.mul.Tensor %r0:x (aten.where.self (aten.ne.Scalar (aten.view.default %r0:t (list 4 1)) -100) %r0:s %r0:z)) (get 0 (aten.nll_loss_forward.default %r0:y %r0:t none 2 -100)) 1)",
                &[("t", "i64[4]<5"), ("x", "f64[4,3]"), ("s", "f64[]"), ("z", "f64[]"), ("y", "f64[4,5]")],
            ),
        ],
        requires: Some(IGNORE_INDEX),
        build: Arc::new(|g, eclass, kids| {
            let Some(out_meta) = g[eclass].data.meta().cloned() else { return vec![] };
            let out_shape = out_meta.shape.clone();
            // where.self has three children, mul.Tensor two. The selected operand must be the
            // result in shape and dtype (no broadcast, no promotion with the other branch).
            if kids.len() == 3 {
                if kept_target_mask(g, kids[0]).is_some()
                    && g[kids[1]].data.meta() == Some(&out_meta)
                {
                    return vec![kids[1]];
                }
                return vec![];
            }
            let mut out = Vec::new();
            for (x, w) in [(kids[0], kids[1]), (kids[1], kids[0])] {
                if shape(g, x).as_deref() != Some(&out_shape[..]) {
                    continue;
                }
                for n in g[w].nodes.clone() {
                    let Term::Op(s, k) = n else { continue };
                    if is_op!(s, "aten.where.self")
                        && k.len() == 3
                        && shape(g, k[1]).is_some_and(|s| s.is_empty())
                        && g[k[1]].data.meta().map(|m| m.dtype)
                            == g[w].data.meta().map(|m| m.dtype)
                        && kept_target_mask(g, k[0]).is_some()
                    {
                        out.push(op(g, "aten.mul.Tensor", vec![x, k[1]]));
                    }
                }
            }
            out
        }),
    }
}

/// The count of kept targets is the number of targets when none is ignored, so the mean's
/// division is a scale.
fn kept_targets_count() -> Lemma {
    Lemma {
        name: "kept-targets-count",
        doc: "with no ignored targets, div(x, _to_copy(sum(ne(t, c)), float)) = x / numel(t) for t the targets of an NLL with ignore index c",
        roots: vec!["aten.div.Tensor".into()],
        examples: vec![(
            "(aten.add.Tensor (aten.div.Tensor (aten.sum.default %r0:a none) (aten._to_copy.default (aten.sum.default (aten.ne.Scalar %r0:t -100) none) dt:f64 none none none b:false none)) (get 0 (aten.nll_loss_forward.default %r0:y %r0:t none 2 -100)) 1)",
            &[("t", "i64[4]<5"), ("a", "f64[4]"), ("y", "f64[4,5]")],
        )],
        requires: Some(IGNORE_INDEX),
        build: Arc::new(|g, eclass, kids| {
            // A float quotient of a numerator of the same dtype: the scale keeps its dtype.
            let Some(dtype) = g[eclass].data.meta().map(|m| m.dtype) else { return vec![] };
            if !dtype.is_float() || g[kids[0]].data.meta().map(|m| m.dtype) != Some(dtype) {
                return vec![];
            }
            let mut out = Vec::new();
            for n in g[kids[1]].nodes.clone() {
                let Term::Op(s, k) = n else { continue };
                if !is_op!(s, "aten._to_copy.default") || k.is_empty() {
                    continue;
                }
                for m in g[k[0]].nodes.clone() {
                    let Term::Op(ms, mk) = m else { continue };
                    if !is_op!(ms, "aten.sum.default") || mk.is_empty() {
                        continue;
                    }
                    let Some(t) = kept_target_mask(g, mk[0]) else { continue };
                    let Some(n) = shape(g, t).map(|s| s.iter().product::<usize>()) else {
                        continue;
                    };
                    if n > 0 {
                        out.push(scale(g, 1, n as i64, kids[0]));
                    }
                }
            }
            out
        }),
    }
}

/// `loss_parallel`'s target log-probability: a gather at the shard-local index of a target
/// column, zeroed outside the shard.
fn masked_gather_column() -> Lemma {
    Lemma {
        name: "loss-parallel-masked-gather",
        doc: "masked_fill(gather(x, last, masked_fill(u - s, m, c)), m, 0) with u a [.., 1] target column, m = (u < s) | (u >= s + w), 0 <= c < w, is view(vocab_pick(x, view(u, [..]), s), [.., 1])",
        roots: vec!["aten.masked_fill.Scalar".into()],
        examples: vec![(
            "(aten.masked_fill.Scalar (aten.gather.default %r0:x 1 (aten.masked_fill.Scalar (aten.sub.Tensor %r0:u 3 1) (aten.bitwise_or.Tensor (aten.lt.Scalar %r0:u 3) (aten.ge.Scalar %r0:u 7)) 0) b:false) (aten.bitwise_or.Tensor (aten.lt.Scalar %r0:u 3) (aten.ge.Scalar %r0:u 7)) f:0.0)",
            &[("x", "f64[5,4]"), ("u", "i64[5,1]<10")],
        )],
        requires: None,
        build: Arc::new(|g, _, kids| {
            if !is_zero(g, kids[2]) {
                return vec![];
            }
            let mut out = Vec::new();
            for (x, idx, _) in last_dim_column_gathers(g, kids[0]) {
                let (Some(xs), Some(is)) = (shape(g, x), shape(g, idx)) else { continue };
                let Some((&w, lead)) = xs.split_last() else { continue };
                if is.len() != xs.len() || is[..is.len() - 1] != *lead {
                    continue;
                }
                for (u, st) in masked_shard_index(g, idx, w, kids[1]) {
                    if shape(g, u).as_deref() != Some(&is[..]) {
                        continue;
                    }
                    let lead_list = list(g, lead);
                    let t = op(g, "aten.view.default", vec![u, lead_list]);
                    let sn = num(g, st);
                    let pick = op(g, VOCAB_PICK, vec![x, t, sn]);
                    let col = list(g, &is);
                    out.push(op(g, "aten.view.default", vec![pick, col]));
                }
            }
            out
        }),
    }
}

/// Whether a class is a fill of zeros (`full(.., 0)` or `zeros_like`).
fn zeros(g: &Graph, id: Id) -> bool {
    super::zero_fill(g, id, 1).is_some()
        || g[id]
            .nodes
            .iter()
            .any(|n| matches!(n, Term::Op(s, _) if is_op!(s, "aten.zeros_like.default")))
}

/// The negated one-hot `loss_parallel`'s backward writes: `index_put(zeros [N, w], [arange(N),
/// idx], float(m) - 1)` with idx the shard-local index of targets t and m their out-of-shard
/// mask; the shard's one-hot as a float of the given dtype, negated.
fn negated_onehot(g: &mut Graph, id: Id) -> Vec<Id> {
    let Some(meta) = g[id].data.meta().cloned() else {
        return vec![];
    };
    let Some((&w, lead)) = meta.shape.split_last() else {
        return vec![];
    };
    if meta.shape.len() != 2 || !meta.dtype.is_float() {
        return vec![];
    }
    let rows = lead[0];
    let mut found = Vec::new();
    for n in g[id].nodes.clone() {
        let Term::Op(s, k) = n else { continue };
        if !is_op!(s, "aten.index_put.default") || k.len() != 4 || !is_false(g, k[3]) {
            continue;
        }
        if !zeros(g, k[0]) {
            continue;
        }
        let Some([r, idx]) = list_items(g, k[1]) else {
            continue;
        };
        if !super::is_arange(g, r, rows) || shape(g, idx).as_deref() != Some(&[rows][..]) {
            continue;
        }
        // v = float(m) - 1 (sub with alpha 1, or add of -1).
        let masks: Vec<Id> = g[k[2]]
            .nodes
            .iter()
            .filter_map(|vn| match vn {
                Term::Op(vs, vk)
                    if (is_op!(vs, "aten.sub.Tensor") && vk.len() == 3 && is_one(g, vk[1]) && int(g, vk[2]) == Some(1))
                        || (is_op!(vs, "aten.add.Tensor")
                            && vk.len() == 3
                            && int(g, vk[2]) == Some(1)
                            && g[vk[1]].nodes.iter().any(|x| matches!(x, Term::Op(xs, xk) if xk.is_empty() && xs.as_str() == "f:-1.0"))) =>
                {
                    Some(vk[0])
                }
                _ => None,
            })
            .flat_map(|f| {
                g[f].nodes
                    .iter()
                    .filter_map(|fnode| match fnode {
                        Term::Op(fs, fk) if is_op!(fs, "aten._to_copy.default") && !fk.is_empty() => Some(fk[0]),
                        _ => None,
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        for m in masks {
            if shape(g, m).as_deref() != Some(&[rows][..]) {
                continue;
            }
            found.extend(masked_shard_index(g, idx, w, m));
        }
    }
    let mut out = Vec::new();
    for (t, st) in found {
        let (s, width) = (num(g, st), num(g, w as i64));
        let onehot = op(g, VOCAB_ONEHOT, vec![t, s, width]);
        let dtn = op(g, &format!("dt:{}", meta.dtype.short_name()), vec![]);
        let none = op(g, "none", vec![]);
        let no = op(g, "b:false", vec![]);
        let float = op(
            g,
            "aten._to_copy.default",
            vec![onehot, dtn, none, none, none, no, none],
        );
        out.push(float);
    }
    out
}

/// `loss_parallel`'s backward one-hot, and the softmax it is added to.
fn shard_onehot_by_index_put() -> Lemma {
    Lemma {
        name: "loss-parallel-onehot",
        doc: "index_put(zeros [N, w], [arange(N), masked_fill(t - s, m, c)], float(m) - 1) with m = (t < s) | (t >= s + w), 0 <= c < w, is -float(vocab_onehot(t, s, w)); added to y it is y - float(vocab_onehot(t, s, w))",
        roots: vec!["aten.index_put.default".into(), "aten.add.Tensor".into()],
        examples: vec![
            (
                "(aten.index_put.default (aten.full.default (list 5 4) f:0.0 dt:f64 none dev b:false) (list (aten.arange.default 5 none none none none) (aten.masked_fill.Scalar (aten.sub.Tensor %r0:t 3 1) (aten.bitwise_or.Tensor (aten.lt.Scalar %r0:t 3) (aten.ge.Scalar %r0:t 7)) 0)) (aten.sub.Tensor (aten._to_copy.default (aten.bitwise_or.Tensor (aten.lt.Scalar %r0:t 3) (aten.ge.Scalar %r0:t 7)) dt:f64 none none none b:false none) f:1.0 1) b:false)",
                &[("t", "i64[5]<10")],
            ),
            (
                "(aten.add.Tensor (aten.index_put.default (aten.full.default (list 5 4) f:0.0 dt:f64 none dev b:false) (list (aten.arange.default 5 none none none none) (aten.masked_fill.Scalar (aten.sub.Tensor %r0:t 3 1) (aten.bitwise_or.Tensor (aten.lt.Scalar %r0:t 3) (aten.ge.Scalar %r0:t 7)) 0)) (aten.sub.Tensor (aten._to_copy.default (aten.bitwise_or.Tensor (aten.lt.Scalar %r0:t 3) (aten.ge.Scalar %r0:t 7)) dt:f64 none none none b:false none) f:1.0 1) b:false) %r0:y 1)",
                &[("t", "i64[5]<10"), ("y", "f64[5,4]")],
            ),
        ],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            let Some(out_shape) = shape(g, eclass) else { return vec![] };
            // index_put.default has four children, add.Tensor three.
            if kids.len() == 4 {
                return negated_onehot(g, eclass)
                    .into_iter()
                    .map(|f| scale(g, -1, 1, f))
                    .collect();
            }
            if int(g, kids[2]) != Some(1) {
                return vec![];
            }
            let mut out = Vec::new();
            for (p, y) in [(kids[0], kids[1]), (kids[1], kids[0])] {
                if shape(g, p).as_deref() != Some(&out_shape[..])
                    || shape(g, y).as_deref() != Some(&out_shape[..])
                {
                    continue;
                }
                for f in negated_onehot(g, p) {
                    let one = num(g, 1);
                    out.push(op(g, "aten.sub.Tensor", vec![y, f, one]));
                }
            }
            out
        }),
    }
}

/// Whether every element of a class is positive by construction: an exponential, a sum of
/// exponentials along dims, a rank sum or a view of such.
fn positive(g: &Graph, id: Id, depth: usize) -> bool {
    g[id].nodes.iter().any(|n| match n {
        Term::Op(s, _) if is_op!(s, "aten.exp.default") => true,
        Term::Op(s, k)
            if depth > 0
                && (is_op!(s, "aten.sum.dim_IntList") || is_op!(s, "aten.view.default")) =>
        {
            !k.is_empty() && positive(g, k[0], depth - 1)
        }
        Term::Op(s, k) if depth > 0 && is_op!(s, SUM) => {
            !k.is_empty() && k.iter().all(|&c| positive(g, c, depth - 1))
        }
        _ => false,
    })
}

/// Whether class `y`, `[rows, classes]`, holds log-probabilities of classes split into shards:
/// a concatenation along the classes, or a `_log_softmax(cat(d; ...), d, false)`.
fn over_vocab_shards(g: &Graph, y: Id) -> bool {
    // Inside a backward operator's own problem `y` is a leaf related to the shards' outputs.
    if cats(g, y).iter().any(|(cd, _)| *cd == 1) {
        return true;
    }
    g[y].nodes.iter().any(|n| match n {
        Term::Op(s, k) if is_op!(s, "aten._log_softmax.default") && k.len() == 3 => {
            let Some(dim) = int(g, k[1]) else {
                return false;
            };
            let dim = if dim < 0 { dim + 2 } else { dim };
            cats(g, k[0]).iter().any(|(cd, _)| *cd as i64 == dim)
        }
        _ => false,
    })
}

/// The exponential of a log-softmax is the softmax: `exp(a - log(b)) = exp(a) / b` for a
/// positive `b` (a sum of exponentials).
fn exp_of_log_shift() -> Lemma {
    Lemma {
        name: "exp-of-log-shift",
        doc: "exp(a - log(b)) = exp(a) / b for b positive by construction (a sum of exponentials)",
        roots: vec!["aten.exp.default".into()],
        examples: vec![(
            "(aten.exp.default (aten.sub.Tensor %r0:a (aten.log.default (aten.sum.dim_IntList (aten.exp.default %r0:a) (list 1) b:true none)) 1))",
            &[("a", "f64[3,4]")],
        )],
        requires: None,
        build: Arc::new(|g, _, kids| {
            let mut out = Vec::new();
            for n in g[kids[0]].nodes.clone() {
                let Term::Op(s, k) = n else { continue };
                if !is_op!(s, "aten.sub.Tensor") || k.len() != 3 || int(g, k[2]) != Some(1) {
                    continue;
                }
                for l in g[k[1]].nodes.clone() {
                    let Term::Op(ls, lk) = l else { continue };
                    if is_op!(ls, "aten.log.default") && positive(g, lk[0], 4) {
                        let e = op(g, "aten.exp.default", vec![k[0]]);
                        out.push(op(g, "aten.div.Tensor", vec![e, lk[0]]));
                    }
                }
            }
            out
        }),
    }
}

/// `ones_like(x)` and `zeros_like(x)` in x's dtype are fills of x's shape, whatever x is: the
/// spec's backward seed and a rank's are then one term.
fn fill_like() -> Lemma {
    Lemma {
        name: "fill-like",
        doc: "ones_like(x) = full(shape(x), 1, dtype(x)), zeros_like(x) = full(shape(x), 0, dtype(x)) (no dtype given)",
        roots: vec!["aten.ones_like.default".into(), "aten.zeros_like.default".into()],
        examples: vec![
            ("(aten.ones_like.default %r0:x none none none none none)", &[("x", "f64[2,3]")]),
            ("(aten.zeros_like.default %r0:x none none none none none)", &[("x", "f64[]")]),
        ],
        requires: None,
        build: Arc::new(|g, eclass, kids| {
            if kids.len() < 2 || !super::is_none(g, kids[1]) {
                return vec![];
            }
            let Some(meta) = g[eclass].data.meta().cloned() else { return vec![] };
            let ones = g[eclass].nodes.iter().any(|n| matches!(n, Term::Op(s, k) if is_op!(s, "aten.ones_like.default") && k.as_slice() == kids));
            let value = if ones { "f:1.0" } else { "f:0.0" };
            let size = list(g, &meta.shape);
            let v = op(g, value, vec![]);
            let dt = op(g, &format!("dt:{}", meta.dtype.short_name()), vec![]);
            let none = op(g, "none", vec![]);
            let dev = op(g, "dev", vec![]);
            let no = op(g, "b:false", vec![]);
            vec![op(g, "aten.full.default", vec![size, v, dt, none, dev, no])]
        }),
    }
}

/// The cross-entropy backward through any log-probabilities `y`: `_log_softmax_backward_data`
/// is `d - exp(y) * sum(d)` row by row, and the summed NLL's backward `d` is `-g` at each
/// row's target, so the result is `g * (exp(y) - one_hot(t))` whatever `y` is.
fn log_softmax_backward_of_nll() -> Lemma {
    Lemma {
        name: "log-softmax-backward-of-nll-pick",
        doc: "with no ignored targets (every target indexes a class), _log_softmax_backward_data(nll_loss_backward(g, y, t, None, sum, c, w), y, 1, dt) over [N, C] is (exp(y) - float(vocab_onehot(t, 0, C))) * g",
        roots: vec!["aten._log_softmax_backward_data.default".into()],
        examples: vec![(
            "(aten._log_softmax_backward_data.default (aten.nll_loss_backward.default %r0:g (aten._log_softmax.default (cat 1 %r0:x %r1:x) 1 b:false) %r0:t none 2 -100 %r0:w) (aten._log_softmax.default (cat 1 %r0:x %r1:x) 1 b:false) 1 dt:f64)",
            &[("g", "f64[]"), ("x", "f64[4,3]"), ("t", "i64[4]<6"), ("w", "f64[]")],
        )],
        requires: Some(IGNORE_INDEX),
        build: Arc::new(|g, eclass, kids| {
            let (dy, y) = (kids[0], kids[1]);
            if int(g, kids[2]) != Some(1) {
                return vec![];
            }
            let Some(meta) = g[eclass].data.meta().cloned() else { return vec![] };
            if meta.shape.len() != 2 || g[y].data.meta() != Some(&meta) {
                return vec![];
            }
            let (rows, classes) = (meta.shape[0], meta.shape[1]);
            // Only the log-probabilities of vocabulary shards (loss_parallel): elsewhere the
            // rewrite is still true but only grows the e-graph (a cp ring attention's full
            // iteration outgrew the expression limit with it).
            if !over_vocab_shards(g, y) {
                return vec![];
            }
            let calls: Vec<(Id, Id)> = g[dy]
                .nodes
                .iter()
                .filter_map(|n| match n {
                    Term::Op(s, k) if is_op!(s, "aten.nll_loss_backward.default") && k.len() == 7 => Some(k.clone()),
                    _ => None,
                })
                .filter(|k| {
                    g.find(k[1]) == g.find(y)
                        && super::is_none(g, k[3])
                        && int(g, k[4]) == Some(2)
                        && shape(g, k[0]).is_some_and(|s| s.is_empty())
                        && shape(g, k[2]).as_deref() == Some(&[rows][..])
                })
                .map(|k| (k[0], k[2]))
                .collect();
            let mut out = Vec::new();
            for (seed, t) in calls {
                let e = op(g, "aten.exp.default", vec![y]);
                let (zero, width) = (num(g, 0), num(g, classes as i64));
                let onehot = op(g, VOCAB_ONEHOT, vec![t, zero, width]);
                let dtn = op(g, &format!("dt:{}", meta.dtype.short_name()), vec![]);
                let none = op(g, "none", vec![]);
                let no = op(g, "b:false", vec![]);
                let float = op(g, "aten._to_copy.default", vec![onehot, dtn, none, none, none, no, none]);
                let one = num(g, 1);
                let diff = op(g, "aten.sub.Tensor", vec![e, float, one]);
                out.push(op(g, "aten.mul.Tensor", vec![diff, seed]));
            }
            out
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::super::{library, Graph};
    use crate::term::Shapes;
    use shardproof_ir::DType;
    use shardproof_ops::Meta;

    /// Whether lemma `name` adds anything to an e-graph of `term` over the given leaves.
    fn fires(name: &str, leaves: &[(&str, DType, &[usize])], term: &str) -> bool {
        let mut g = Graph::new(Shapes::default());
        for (leaf, dt, dims) in leaves {
            g.analysis
                .leaves
                .insert((*leaf).into(), Meta::new(*dt, dims.to_vec()));
        }
        g.add_expr(&term.parse().unwrap());
        g.rebuild();
        let before = (g.total_size(), g.number_of_classes());
        let lemma = library().into_iter().find(|l| l.name == name).unwrap();
        let g = egg::Runner::default()
            .with_egraph(g)
            .with_iter_limit(2)
            .run(&lemma.rewrites())
            .egraph;
        (g.total_size(), g.number_of_classes()) != before
    }

    const LEAVES: &[(&str, DType, &[usize])] = &[
        ("%r0:t", DType::I64, &[4]),
        ("%r0:u", DType::I64, &[4]),
        ("%r0:a", DType::F64, &[4]),
        ("%r0:b", DType::F64, &[4]),
        ("%r0:y", DType::F64, &[4, 5]),
    ];

    /// `target != ignore_index` is read as all true only for the targets of an NLL call with
    /// that ignore index: not for another integer tensor, nor for another ignore index.
    #[test]
    fn kept_target_selection_needs_the_losss_own_targets() {
        let select = "(aten.where.self (aten.ne.Scalar %r0:t -100) %r0:a %r0:b)";
        let nll = |t: &str, c: i64| {
            format!("(get 0 (aten.nll_loss_forward.default %r0:y {t} none 2 {c}))")
        };
        let with = |loss: String| format!("(aten.add.Tensor {select} {loss} 1)");
        assert!(fires(
            "kept-targets-select",
            LEAVES,
            &with(nll("%r0:t", -100))
        ));
        assert!(!fires("kept-targets-select", LEAVES, select));
        assert!(!fires(
            "kept-targets-select",
            LEAVES,
            &with(nll("%r0:u", -100))
        ));
        assert!(!fires(
            "kept-targets-select",
            LEAVES,
            &with(nll("%r0:t", -1))
        ));
    }

    /// The log-softmax is decomposed only where its row is split into shards (a cat along
    /// its dim), so other cases' e-graphs do not grow.
    #[test]
    fn log_softmax_decomposes_only_over_shards_of_its_dim() {
        let leaves: &[(&str, DType, &[usize])] = &[("%r0:x", DType::F64, &[2, 3])];
        let name = "log-softmax-over-vocab-shards";
        assert!(fires(
            name,
            leaves,
            "(aten._log_softmax.default (cat 1 %r0:x %r0:x) 1 b:false)"
        ));
        assert!(!fires(
            name,
            leaves,
            "(aten._log_softmax.default (cat 0 %r0:x %r0:x) 1 b:false)"
        ));
        assert!(!fires(
            name,
            leaves,
            "(aten._log_softmax.default %r0:x 1 b:false)"
        ));
    }
}
