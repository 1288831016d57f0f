//! Reduction rules: sum/mean/amax and friends, scans, softmax, norms and their backward,
//! sort, and the losses (nll_loss, mse_loss).

use super::*;

pub(super) fn reduced_dims(c: &Ctx, rank: usize) -> Option<Vec<usize>> {
    match c.arg("dim") {
        None | Some(Arg::None) => Some((0..rank).collect()),
        Some(a) => {
            let ds = a.as_int_list()?;
            if ds.is_empty() {
                return Some((0..rank).collect());
            }
            ds.iter().map(|&d| norm_dim(d, rank)).collect()
        }
    }
}

pub(super) fn reduction(c: &Ctx) -> Outcome {
    let Some(x) = c.t("self") else {
        return c.all(Place::Unknown);
    };
    let name = c.args.schema().name.clone();
    let base = name.split('.').next().unwrap_or("").to_string();
    let r = x.rank();
    let Some(dims) = reduced_dims(c, r) else {
        return c.all(Place::Unknown);
    };
    let keep = c.arg("keepdim").and_then(|a| a.as_bool()).unwrap_or(false)
        || (c.out_rank(0) == r && r > 0);
    let red = match base.as_str() {
        "sum" => Some(Red::Sum),
        "mean" => Some(Red::Avg),
        "amax" | "max" => Some(Red::Max),
        "amin" | "min" => Some(Red::Min),
        _ => None,
    };
    let n = c.n_out();
    // A blocked shard is a shard of its dim for a reduction: each rank holds an equal share
    // of the dim's elements, so a reduction over it is pending and the other dims keep it.
    match x.p {
        Place::Shard(_) | Place::Blocked(..)
            if x.p.blocks().is_some_and(|(d, _)| dims.contains(&d)) =>
        {
            let d = x.p.blocks().map_or(0, |(d, _)| d);
            match red {
            Some(red) => {
                let mut v = vec![Place::Partial(red)];
                if n > 1 {
                    // max.dim / min.dim indices: local positions.
                    v.push(Place::Varying);
                }
                Ok(v)
            }
            None => bad(
                Kind::Consistency,
                format!("`{base}` reduces over dim {d}, which is sharded: each rank reduces only its shard"),
                Hint::GatherShard,
                vec![Place::Replicate; n],
            ),
            }
        }
        Place::Shard(_) | Place::Blocked(..) => {
            let (d, k) = x.p.blocks().unwrap_or((0, 1));
            let nd = if keep {
                d
            } else {
                d - dims.iter().filter(|&&e| e < d).count()
            };
            c.all(Place::blocked(nd, k))
        }
        Place::Partial(pr) if pr.is_linear() && matches!(red, Some(Red::Sum | Red::Avg)) => {
            c.all(Place::Partial(pr))
        }
        Place::Partial(_) | Place::Unmasked => one(merge(&[x], 0, Lin::None, false), n),
        p => c.all(p),
    }
}

pub(super) fn scan(c: &Ctx) -> Outcome {
    let Some(x) = c.t("self") else {
        return c.all(Place::Unknown);
    };
    let Some(dim) = c.int("dim").and_then(|d| norm_dim(d, x.rank())) else {
        return c.all(Place::Unknown);
    };
    let linear = c.args.schema().name.starts_with("cumsum");
    match x.p {
        Place::Shard(d) if d as usize == dim => c.all(Place::Varying),
        Place::Partial(_) | Place::Unmasked => one(
            merge(&[x], 0, if linear { Lin::Add } else { Lin::None }, false),
            1,
        ),
        p => c.all(p),
    }
}

pub(super) fn softmax(c: &Ctx) -> Outcome {
    let Some(x) = c.t("self") else {
        return c.all(Place::Unknown);
    };
    let Some(dim) = c.int("dim").and_then(|d| norm_dim(d, x.rank())) else {
        return c.all(Place::Unknown);
    };
    match x.p {
        p if p.blocks().is_some_and(|(d, _)| d == dim) => bad(
            Kind::Consistency,
            format!("softmax over dim {dim}, which is sharded: each rank normalizes over its shard only"),
            Hint::GatherShard,
            vec![Place::Varying; c.n_out()],
        ),
        Place::Partial(_) | Place::Unmasked => one(merge(&[x], 0, Lin::None, false), c.n_out()),
        // In no known layout, the softmax dim may be sharded: no claim.
        p if c.varying_may_shard(p) => c.all(Place::Unknown),
        p => c.all(p),
    }
}

pub(super) fn softmax_backward(c: &Ctx) -> Outcome {
    let (Some(g), Some(y)) = (c.t("grad_output"), c.t("output")) else {
        return c.all(Place::Unknown);
    };
    let Some(dim) = c.int("dim").and_then(|d| norm_dim(d, y.rank())) else {
        return c.all(Place::Unknown);
    };
    if [y.p, g.p]
        .iter()
        .any(|p| p.blocks().is_some_and(|(d, _)| d == dim))
    {
        return bad(
            Kind::Consistency,
            format!("softmax backward over dim {dim}, which is sharded"),
            Hint::GatherShard,
            vec![Place::Varying; c.n_out()],
        );
    }
    if c.varying_may_shard(y.p) || c.varying_may_shard(g.p) {
        return c.all(Place::Unknown);
    }
    one(merge(&[g, y], c.out_rank(0), Lin::First, false), c.n_out())
}

/// Checks a norm's input against its normalized dims (the last `k`); the output placements
/// for (output, statistics...).
pub(super) fn norm_core(c: &Ctx, x: &T, k: usize, params: &[T]) -> Outcome {
    let r = x.rank();
    let first = r.saturating_sub(k);
    let n = c.n_out();
    match x.p {
        p if p.blocks().is_some_and(|(d, _)| d >= first) => bad(
            Kind::Consistency,
            format!(
                "normalizes over dim {}, which is sharded: the statistics are those of the \
                 rank's shard, not of the whole dim",
                x.p.blocks().map_or(0, |(d, _)| d)
            ),
            Hint::GatherShard,
            vec![x.p; n],
        ),
        Place::Partial(_) | Place::Unmasked => {
            one(merge(std::slice::from_ref(x), 0, Lin::None, false), n)
        }
        // In no known layout, the normalized dims may be sharded: no claim.
        p if c.varying_may_shard(p) => c.all(Place::Unknown),
        p => {
            for w in params {
                if w.p.is_partial() || w.p.blocks().is_some() {
                    return bad(
                        Kind::Consistency,
                        format!(
                            "the norm's weight or bias is {} where the normalized dims are whole",
                            w.p
                        ),
                        Hint::Text("replicate the norm's weight and bias".into()),
                        vec![p; n],
                    );
                }
            }
            let varying = params.iter().any(|w| w.p == Place::Varying);
            let out = if varying { Place::Varying } else { p };
            let mut v = vec![out];
            v.extend(std::iter::repeat_n(p, n - 1));
            Ok(v)
        }
    }
}

pub(super) fn norm(c: &Ctx) -> Outcome {
    let Some(x) = c.t("input") else {
        return c.all(Place::Unknown);
    };
    let k = c.ints("normalized_shape").map_or(1, |s| s.len());
    let params = tensors(c, &["weight", "bias"]);
    norm_core(c, &x, k, &params)
}

pub(super) fn apex_norm(c: &Ctx) -> Outcome {
    let mut places = norm(c)?;
    // The statistics are flattened to one dim of the rows. With one row dim that is the
    // input's dim 0 itself; else a shard of dim 0 (in blocks or not) stays one, and a layout
    // of an inner row dim (or rows of a selection, numbered by the dim's own size)
    // interleaves with the dims outside it: no claim.
    let row_dims = c.t("input").and_then(|x| {
        let normalized = c.ints("normalized_shape")?.len();
        Some(x.meta?.shape.len().saturating_sub(normalized))
    });
    let flattened_alike = |p: Place| {
        row_dims.is_some_and(|r| r <= 1)
            || matches!(
                p,
                Place::Replicate | Place::Partial(_) | Place::Unknown | Place::Varying
            )
            || matches!(p, Place::Shard(0) | Place::Blocked(0, _))
    };
    for p in places.iter_mut().skip(1) {
        if !flattened_alike(*p) {
            *p = Place::Varying;
        }
    }
    Ok(places)
}

pub(super) fn norm_backward(c: &Ctx) -> Outcome {
    let (Some(g), Some(x)) = (c.t("grad_out"), c.t("input")) else {
        return c.all(Place::Unknown);
    };
    let k = c.ints("normalized_shape").map_or(1, |s| s.len());
    let r = x.rank();
    let first = r.saturating_sub(k);
    let n = c.n_out();
    for t in [&g, &x] {
        if let Some((d, _)) = t.p.blocks() {
            if d >= first {
                return bad(
                    Kind::Consistency,
                    format!("norm backward over dim {d}, which is sharded"),
                    Hint::GatherShard,
                    vec![t.p; n],
                );
            }
        }
    }
    if x.p.is_partial() {
        return one(merge(&[x], 0, Lin::None, false), n);
    }
    if c.varying_may_shard(g.p) || c.varying_may_shard(x.p) {
        return c.all(Place::Unknown);
    }
    // The statistics and the weight enter the input gradient too (`mean` and `rstd`
    // broadcast along the normalized dims, the weight along the rows): each rank must hold
    // them as it holds `input`'s rows. Statistics of another rank than `input`'s (flattened
    // rows) do not align with its dims by broadcast: unless everything is replicated, no
    // claim.
    let stats = tensors(c, &["mean", "rstd"]);
    let (aligned, flat): (Vec<T>, Vec<T>) = stats.into_iter().partition(|s| s.rank() == x.rank());
    let all_replicated = [&g, &x]
        .into_iter()
        .chain(&flat)
        .all(|t| t.p == Place::Replicate);
    if !flat.is_empty() && !all_replicated {
        return c.all(Place::Unknown);
    }
    let mut operands = vec![g.clone(), x.clone()];
    operands.extend(aligned);
    operands.extend(tensors(c, &["weight"]));
    let gi = match merge(&operands, c.out_rank(0), Lin::First, false) {
        Ok(p) => p,
        Err(v) => return one(Err(v), n),
    };
    // The parameter gradients sum over the batch dims.
    let param = match gi.blocks() {
        Some((d, _)) if d < first => Place::Partial(Red::Sum),
        _ => gi,
    };
    let mut v = vec![gi];
    v.extend(std::iter::repeat_n(param, n - 1));
    Ok(v)
}

pub(super) fn sort(c: &Ctx) -> Outcome {
    let Some(x) = c.t("self") else {
        return c.all(Place::Unknown);
    };
    let Some(dim) = norm_dim(c.int("dim").unwrap_or(-1), x.rank()) else {
        return c.all(Place::Unknown);
    };
    match x.p {
        p if p.blocks().is_some_and(|(d, _)| d == dim) => bad(
            Kind::Consistency,
            format!("sorts (or takes the top k) along dim {dim}, which is sharded"),
            Hint::GatherShard,
            vec![Place::Varying; c.n_out()],
        ),
        Place::Partial(_) | Place::Unmasked => one(merge(&[x], 0, Lin::None, false), c.n_out()),
        p if c.varying_may_shard(p) => c.all(Place::Unknown),
        p => c.all(p),
    }
}

pub(super) fn nll_loss(c: &Ctx) -> Outcome {
    let (Some(x), Some(tg)) = (c.t("self"), c.t("target")) else {
        return c.all(Place::Unknown);
    };
    let reduction = c.int("reduction").unwrap_or(1);
    let class_dim = if x.rank() >= 2 { 1 } else { 0 };
    if x.p.blocks().is_some_and(|(d, _)| d == class_dim) {
        return bad(
            Kind::Consistency,
            "the loss picks each target's log-probability along the class dim, which is sharded",
            Hint::Text("use the vocab-parallel cross-entropy (gather the target logit on its rank, mask, all-reduce)".into()),
            vec![Place::Replicate; c.n_out()],
        );
    }
    if tg.p.is_partial() {
        return one(merge(&[tg], 0, Lin::None, false), c.n_out());
    }
    // Rows sharded (in blocks or not): each rank holds an equal share of the rows.
    let batchish = |p: Place| p.blocks().is_some_and(|(d, _)| d == 0);
    let base = match (x.p, tg.p) {
        (Place::Partial(r), Place::Replicate) if r.is_linear() => Place::Partial(r),
        (Place::Partial(_), _) | (Place::Unmasked, _) => {
            return one(merge(&[x], 0, Lin::None, false), c.n_out())
        }
        // Row `i` of the input goes with target `i`: a rank computes its rows' losses only
        // where both are sharded alike (the loss type-checks, so as many rows), or the
        // replicated one is constant along the rows (a fill made on each rank). A replicated
        // target beside row-sharded logits (labels not sliced at the rank's offset), or the
        // converse, pairs every rank's rows with the same rows: no shard (issue 44: held).
        (p, q) if batchish(p) || batchish(q) => {
            if p == q
                || (q == Place::Replicate && tg.constant_along(0))
                || (p == Place::Replicate && x.constant_along(0))
            {
                if batchish(p) {
                    p
                } else {
                    q
                }
            } else {
                Place::Varying
            }
        }
        (Place::Replicate, Place::Replicate) => Place::Replicate,
        // A shard of another dim (the positions of a K-dim loss): each rank's loss covers
        // its own positions, in a layout not read here (was `Replicate()`: a false pass).
        _ => Place::Varying,
    };
    let out = match (base, reduction) {
        (p, 0) if batchish(p) => p,
        (p, 1) if batchish(p) => Place::Partial(Red::Avg),
        (p, _) if batchish(p) => Place::Partial(Red::Sum),
        (p, _) => p,
    };
    let total = match base {
        p if batchish(p) => Place::Partial(Red::Sum),
        Place::Partial(_) => Place::Replicate,
        p => p,
    };
    let mut v = vec![out];
    if c.n_out() > 1 {
        v.push(total);
    }
    Ok(v)
}

pub(super) fn nll_loss_backward(c: &Ctx) -> Outcome {
    let (Some(g), Some(x), Some(tg)) = (c.t("grad_output"), c.t("self"), c.t("target")) else {
        return c.all(Place::Unknown);
    };
    let class_dim = if x.rank() >= 2 { 1 } else { 0 };
    if x.p.blocks().is_some_and(|(d, _)| d == class_dim) {
        return bad(
            Kind::Consistency,
            "nll_loss backward over a sharded class dim",
            Hint::GatherShard,
            vec![Place::Varying],
        );
    }
    // In the input's dims (the target lacks the class dim); a shard pairs the rows only
    // where both are sharded alike or the replicated one is a fill along the rows (as in
    // `nll_loss`).
    let shape = match merge_joined(&[x.clone(), tg.clone()], Lin::None, false) {
        Ok(p) if p.blocks().is_some() => {
            let alike = x.p == tg.p
                || (tg.p == Place::Replicate && tg.constant_along(0))
                || (x.p == Place::Replicate && x.constant_along(0));
            // Rows only: a shard of a K-dim loss's positions is not read (no claim).
            if alike && p.blocks().is_some_and(|(d, _)| d == 0) {
                p
            } else {
                Place::Varying
            }
        }
        Ok(p) => p,
        Err(v) => return one(Err(v), 1),
    };
    // A mean divides every row by `total_weight`. A replicated one is the spec's divisor; a
    // partial one on a mesh dim that splits the targets is the rank's own count (a local
    // mean, whose factor `local_means` reads); a partial one on a mesh dim that keeps the
    // targets divides every rank along it by a different piece (was `Replicate()`: a false
    // claim, issue 44). Ignored without a mean.
    if c.int("reduction") == Some(1) {
        if let Some(tw) = c.t("total_weight") {
            let targets_split =
                matches!(tg.p, Place::Shard(_) | Place::Blocked(..) | Place::Rows(..));
            match tw.p {
                Place::Replicate => {}
                Place::Partial(_) if targets_split => {}
                Place::Partial(_) | Place::Varying => return c.all(Place::Varying),
                _ => return c.all(Place::Unknown),
            }
        }
    }
    match g.p {
        Place::Partial(r) if r.is_linear() && shape == Place::Replicate => c.all(Place::Partial(r)),
        Place::Partial(_) | Place::Unmasked => one(merge(&[g], 0, Lin::None, false), 1),
        Place::Replicate => c.all(shape),
        Place::Varying => c.all(Place::Varying),
        _ => c.all(Place::Varying),
    }
}

pub(super) fn mse_loss(c: &Ctx) -> Outcome {
    let ts = tensors(c, &["self", "target"]);
    let p = match merge(&ts, ts.first().map_or(0, T::rank), Lin::None, false) {
        Ok(p) => p,
        Err(v) => return one(Err(v), 1),
    };
    let reduction = c.int("reduction").unwrap_or(1);
    c.all(match (p, reduction) {
        (Place::Shard(_), 1) => Place::Partial(Red::Avg),
        (Place::Shard(_), 2) => Place::Partial(Red::Sum),
        (p, _) => p,
    })
}

pub(super) fn mse_loss_backward(c: &Ctx) -> Outcome {
    let ts = tensors(c, &["grad_output", "self", "target"]);
    let merged = merge(&ts, c.out_rank(0), Lin::First, false);
    // A mean scales by 2/numel of the rank's operands: over any split of the elements (a
    // shard, blocks, rows of a selection), not the spec's numel. Whole operands (or a
    // partial gradient of whole operands) are the spec's; `Unknown` stays inconclusive.
    let mean = c.int("reduction").unwrap_or(1) == 1;
    let whole = |p: &Place| matches!(p, Place::Replicate | Place::Partial(_) | Place::Unknown);
    if mean && merged.as_ref().is_ok_and(|p| !whole(p)) {
        // A plain shard: every rank holds as many elements of `self` (whose count is the
        // divisor), so each piece is the spec's times n (a local mean, as nll's backward
        // over row shards): the shard is claimed with that factor (`PieceFactor::Times`,
        // the local-means walk). Blocks or rows of a selection may count differently per
        // rank: no claim.
        if matches!(merged, Ok(Place::Shard(_))) {
            return one(merged, 1);
        }
        return c.all(Place::Varying);
    }
    one(merged, 1)
}
