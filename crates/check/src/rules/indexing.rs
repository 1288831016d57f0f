//! Lookup rules: embedding (vocabulary shards, `Unmasked`) and its backward, gather,
//! index, index_select, index_put and scatter.

use super::*;

pub(super) fn embedding(c: &Ctx) -> Outcome {
    let (Some(w), Some(idx)) = (c.t("weight"), c.t("indices")) else {
        return c.all(Place::Unknown);
    };
    let out_r = c.out_rank(0);
    if idx.p.is_partial() {
        return one(merge(&[idx], 0, Lin::None, false), 1);
    }
    match w.p {
        Place::Shard(0) => c.all(Place::Unmasked),
        Place::Shard(_) => c.all(match idx.p {
            Place::Replicate => Place::shard(out_r.saturating_sub(1)),
            _ => Place::Varying,
        }),
        Place::Partial(r) if idx.p == Place::Replicate => c.all(Place::Partial(r)),
        Place::Partial(_) | Place::Unmasked => one(merge(&[w], 0, Lin::None, false), 1),
        Place::Varying => c.all(Place::Varying),
        _ => c.all(idx.p),
    }
}

pub(super) fn embedding_backward(c: &Ctx) -> Outcome {
    let (Some(g), Some(idx)) = (c.t("grad_output"), c.t("indices")) else {
        return c.all(Place::Unknown);
    };
    if idx.p.is_partial() {
        return one(merge(&[idx], 0, Lin::None, false), 1);
    }
    let gr = g.rank();
    // Scaled by the frequency of each id among the rank's tokens: over token shards the
    // counts are the rank's, not the batch's (a flag that is no literal may be set). An
    // unmasked lookup's gradient stays a finding.
    let by_freq = c.arg("scale_grad_by_freq").and_then(|a| a.as_bool()) != Some(false);
    if by_freq && idx.p != Place::Replicate && g.p != Place::Unmasked {
        return c.all(Place::Varying);
    }
    match (g.p, idx.p) {
        (Place::Partial(r), Place::Replicate) => c.all(Place::Partial(r)),
        (Place::Partial(_), _) | (Place::Unmasked, _) => one(merge(&[g], 0, Lin::Mul, false), 1),
        (Place::Shard(d), _) if d as usize + 1 == gr && idx.p == Place::Replicate => {
            c.all(Place::Shard(1))
        }
        (Place::Shard(d), Place::Shard(e)) if d == e && (d as usize) + 1 < gr => {
            c.all(Place::Partial(Red::Sum))
        }
        (Place::Replicate, Place::Replicate) => c.all(Place::Replicate),
        _ => c.all(Place::Varying),
    }
}

pub(super) fn gather(c: &Ctx) -> Outcome {
    let (Some(x), Some(idx)) = (c.t("self"), c.t("index")) else {
        return c.all(Place::Unknown);
    };
    let Some(dim) = c.int("dim").and_then(|d| norm_dim(d, x.rank())) else {
        return c.all(Place::Unknown);
    };
    if idx.p.is_partial() {
        return one(merge(&[idx], 0, Lin::None, false), 1);
    }
    match x.p {
        Place::Shard(d) if d as usize == dim => c.all(Place::Unmasked),
        // Positions along a blocked dim: the index's global positions fall in other blocks
        // and pieces than the rank's, and no masking of one range recovers them.
        Place::Blocked(d, _) if d as usize == dim => c.all(Place::Varying),
        Place::Partial(r) if r.is_linear() && idx.p == Place::Replicate => c.all(Place::Partial(r)),
        Place::Partial(_) | Place::Unmasked => one(merge(&[x], 0, Lin::None, false), 1),
        _ => match merge_joined(&[x.clone(), idx.clone()], Lin::None, false) {
            // A shard of another dim than the gather's: output row `i` reads row `i` of
            // `self` at the index's row `i`, so a rank computes its piece only where `self`
            // and the index are sharded alike with as many rows (the index may have fewer
            // rows than `self`: then the global gather reads other rows than the ranks').
            // A replicated operand beside the shard (an index or a table made without the
            // rank's offset) is not a piece of the global one: no shard (issue 44).
            Ok(p) if p.blocks().is_some() => c.all(if sharded_alike(&x, &idx, p) {
                p
            } else {
                Place::Varying
            }),
            r => one(r, 1),
        },
    }
}

/// Whether `a` and `b` are both the shard `p` with the same local size along its dim: their
/// rows pair one for one on every rank, as the global tensors' rows do.
pub(super) fn sharded_alike(a: &T, b: &T, p: Place) -> bool {
    let Some((d, _)) = p.blocks() else {
        return false;
    };
    let size = |t: &T| t.meta.as_ref().and_then(|m| m.shape.get(d).copied());
    a.p == p && b.p == p && size(a).is_some() && size(a) == size(b)
}

pub(super) fn index_select(c: &Ctx) -> Outcome {
    let (Some(x), Some(idx)) = (c.t("self"), c.t("index")) else {
        return c.all(Place::Unknown);
    };
    let Some(dim) = c.int("dim").and_then(|d| norm_dim(d, x.rank())) else {
        return c.all(Place::Unknown);
    };
    if idx.p.is_partial() {
        return one(merge(&[idx], 0, Lin::None, false), 1);
    }
    match x.p {
        Place::Shard(d) if d as usize == dim => c.all(Place::Unmasked),
        Place::Shard(d) if idx.p == Place::Replicate => c.all(Place::Shard(d)),
        Place::Partial(r) if r.is_linear() && idx.p == Place::Replicate => c.all(Place::Partial(r)),
        Place::Partial(_) | Place::Unmasked => one(merge(&[x], 0, Lin::None, false), 1),
        Place::Replicate => c.all(match idx.p {
            Place::Shard(_) | Place::Varying => Place::Varying,
            p => p,
        }),
        _ => c.all(Place::Varying),
    }
}

pub(super) fn index(c: &Ctx) -> Outcome {
    let Some(x) = c.t("self") else {
        return c.all(Place::Unknown);
    };
    let Some(Arg::List(items)) = c.arg("indices") else {
        return c.all(Place::Unknown);
    };
    let idx: Vec<Option<T>> = items
        .iter()
        .map(|a| a.as_value().map(|v| c.value(v)))
        .collect();
    if idx.iter().flatten().any(|t| t.p.is_partial()) {
        // A partial index: a finding whatever the pairing.
        return one(
            merge_joined(
                &idx.into_iter().flatten().collect::<Vec<_>>(),
                Lin::None,
                false,
            ),
            1,
        );
    }
    let indexed: Vec<usize> = idx
        .iter()
        .enumerate()
        .filter(|(_, t)| t.is_some())
        .map(|(i, _)| i)
        .collect();
    let idx_p: Vec<Place> = idx.iter().flatten().map(|t| t.p).collect();
    let idx_plain = idx_p.iter().all(|p| *p == Place::Replicate);
    match x.p {
        Place::Shard(d) if indexed.contains(&(d as usize)) => c.all(Place::Unmasked),
        Place::Shard(d)
            if idx_plain && indexed.iter().all(|&i| i > d as usize) && indexed.len() == 1 =>
        {
            c.all(Place::Shard(d))
        }
        Place::Partial(r) if r.is_linear() && idx_plain => c.all(Place::Partial(r)),
        Place::Partial(_) | Place::Unmasked => one(merge(&[x], 0, Lin::None, false), 1),
        Place::Replicate if idx_plain => c.all(Place::Replicate),
        _ => c.all(Place::Varying),
    }
}

pub(super) fn index_put(c: &Ctx) -> Outcome {
    let Some(x) = c.t("self") else {
        return c.all(Place::Unknown);
    };
    let vals = c.t("values");
    let mut idx = Vec::new();
    if let Some(a) = c.arg("indices") {
        a.values(&mut idx);
    }
    let idx: Vec<Place> = idx.into_iter().map(|v| (c.place)(v)).collect();
    let zero_fill = vals
        .as_ref()
        .is_some_and(|v| v.meta.as_ref().is_some_and(|m| m.shape.is_empty()));
    if x.p == Place::Unmasked {
        // Megatron's `predicted[mask] = 0.0`: the values are a 0-d (lifted) constant.
        if idx.iter().all(|p| *p == Place::Varying) && !idx.is_empty() && zero_fill {
            return c.all(Place::Partial(Red::Sum));
        }
        return bad(
            Kind::Spmd,
            "writes into a vocabulary-shard lookup without zeroing the rows outside the rank's range",
            Hint::Text("zero the out-of-range rows (index_put of 0 at the mask)".into()),
            vec![Place::Varying; c.n_out()],
        );
    }
    if idx.iter().any(|p| p.is_partial()) {
        return bad(
            Kind::Spmd,
            "indexes with a partial tensor",
            Hint::ReducePartial,
            vec![Place::Varying; c.n_out()],
        );
    }
    let mut ts = vec![x.clone()];
    ts.extend(vals.clone());
    // In `self`'s dims; the pairing of a shard is checked below.
    let r = merge_joined(&ts, Lin::Add, false);
    match r {
        // Indices that differ across ranks: each rank writes its own positions, so neither a
        // shard nor the terms of a partial sum are where the spec writes them (as `scatter`).
        Ok(_) if idx.iter().any(|q| *q != Place::Replicate) => c.all(Place::Varying),
        Ok(p) if p.blocks().is_some() => {
            // Replicated indices into a shard. Indices along the sharded dim name local rows,
            // which are other global rows on every rank; values with more than one element
            // pair with the piece in a layout not read here (a replicated table of the
            // piece's size along the sharded dim is the pattern of a missing offset). Either
            // way no shard is claimed; a fill or a single value written at other dims keeps it.
            let (d, _) = p.blocks().unwrap_or_default();
            let along = matches!(c.arg("indices"), Some(Arg::List(items))
                if items.get(d).is_some_and(|a| a.as_value().is_some()));
            let wide = c.t("values").is_some_and(|v| {
                v.p == Place::Replicate
                    && v.constant != u64::MAX
                    && v.meta.as_ref().is_none_or(|m| m.numel() > 1)
            });
            // Sharded values written into `self`: their dims are `self`'s only where one
            // 1-d index (or mask) replaces one dim after the sharded one, in place, and
            // they pair row for row with `self`'s piece only where `self` is the same shard
            // with as many rows, or is constant along the dim (a fill made on each rank, a
            // piece of the fill of any size). A replicated `self` of the piece's size that
            // is not a fill is a table without the rank's offset (issue 44: it held).
            let values_ok = vals.as_ref().is_none_or(|v| {
                if v.p.blocks().is_none() {
                    return true;
                }
                let items = match c.arg("indices") {
                    Some(Arg::List(items)) => items,
                    _ => return false,
                };
                let tensors: Vec<(usize, ValueId)> = items
                    .iter()
                    .enumerate()
                    .filter_map(|(j, a)| a.as_value().map(|v| (j, v)))
                    .collect();
                let one_index = matches!(tensors.as_slice(), [(j, iv)]
                    if *j > d && (c.meta)(*iv).is_some_and(|m| m.shape.len() == 1));
                let size = |t: &T| t.meta.as_ref().and_then(|m| m.shape.get(d).copied());
                one_index
                    && v.p == p
                    && v.rank() == x.rank()
                    && size(v).is_some()
                    && size(v) == size(&x)
                    && (x.p == p || (x.p == Place::Replicate && x.constant_along(d)))
            });
            c.all(if along || wide || !values_ok {
                Place::Varying
            } else {
                p
            })
        }
        r => one(r, c.n_out()),
    }
}

pub(super) fn scatter(c: &Ctx) -> Outcome {
    let Some(x) = c.t("self") else {
        return c.all(Place::Unknown);
    };
    let Some(dim) = c.int("dim").and_then(|d| norm_dim(d, x.rank())) else {
        return c.all(Place::Unknown);
    };
    let idx = c.t("index");
    let src = c
        .t("src")
        .or_else(|| c.t("source"))
        .or_else(|| c.t("value"));
    let mut ts = vec![x.clone()];
    ts.extend(src.clone());
    // A scatter is linear in (self, src) jointly for a fixed index: a replicated zero `self`
    // is the partial sum of zeros, so a partial `src` scattered into it stays partial (the
    // router gradient's `scatter(zeros, 1, topk, grad)`).
    // Linear in them: a plain scatter (positions replaced), a sum, a mean (a sum over a count
    // the index fixes). A product, `amax` or `amin` of partial terms is no partial of the
    // spec's.
    let linear = c
        .str("reduce")
        .is_none_or(|r| matches!(r.as_str(), "sum" | "add" | "mean"));
    if let Some(s) = src.as_ref().filter(|s| s.p.is_partial()) {
        let summing = c
            .str("reduce")
            .is_none_or(|r| matches!(r.as_str(), "sum" | "add"));
        if x.p == Place::Replicate && c.is_zero(&x) && c.num("value").is_none() && summing {
            ts[0].p = s.p;
        }
    }
    if idx.as_ref().is_some_and(|t| t.p.is_partial()) {
        return bad(
            Kind::Spmd,
            "scatters at partial indices",
            Hint::ReducePartial,
            vec![Place::Varying; c.n_out()],
        );
    }
    // Along the scatter's own dim a piece (plain or blocked) is written at positions of the
    // global dim that the local index does not name.
    if x.p.blocks().is_some_and(|(d, _)| d == dim) {
        return c.all(Place::Varying);
    }
    // In `self`'s dims: a shard is kept only by `rows_alike` below.
    let stripped = ts;
    let mut all = stripped.clone();
    all.extend(idx.clone());
    let nonzero = c.num("value").is_some_and(|v| v != 0.0);
    if stripped.iter().any(|t| t.p.is_partial()) {
        // The ranks' partial terms add up position by position only where every rank writes
        // the same positions: a sharded index puts each rank's terms elsewhere.
        if idx.as_ref().is_some_and(|i| i.p != Place::Replicate) {
            return c.all(Place::Varying);
        }
        let lin = if linear { Lin::Add } else { Lin::None };
        return one(merge_joined(&stripped, lin, nonzero), c.n_out());
    }
    match merge_joined(&all, Lin::None, false) {
        Ok(Place::Replicate) => c.all(Place::Replicate),
        Ok(_) => {
            // A zero-filled self made on each rank is a piece of the zeros of any size, so it
            // takes the index's shard (the router's `scatter(zeros, 1, topk, weights)` over a
            // token shard).
            let mut x = x;
            if x.p == Place::Replicate && c.is_zero(&x) {
                x.p = idx.as_ref().map_or(x.p, |i| i.p);
            }
            // Any other mix writes each rank's positions into its own tensor: a replicated
            // self with a sharded index, or a shard with an index that does not cover its
            // rows, is neither a replica nor a piece of the global scatter.
            // `index_add`/`index_copy`/`index_fill` take a 1-d index of positions along
            // `dim`, not an index shaped as `self`: its dim 0 is no row of `self`.
            let by_positions = c.args.schema().name.starts_with("index_");
            let alike = if by_positions {
                positions_alike(&x, dim, idx.as_ref(), src.as_ref())
            } else {
                rows_alike(&x, dim, idx.as_ref(), src.as_ref())
            };
            c.all(if alike { x.p } else { Place::Varying })
        }
        r => one(r, c.n_out()),
    }
}

/// Whether a scatter runs row by row on each rank's piece: self, index and source sharded
/// alike along a dim other than the scatter's, with the same local size there (the index
/// covers every row of the piece, and the source's rows are the index's). Then each global
/// row is scattered by the rank holding it, exactly as on one device.
/// A blocked shard (`Shard(d, blocks=k)`) is as good as a plain one: the rows are still
/// each held by one rank, the same rows for self, index and source (one placement).
fn rows_alike(x: &T, dim: usize, idx: Option<&T>, src: Option<&T>) -> bool {
    let Some((d, _)) = x.p.blocks() else {
        return false;
    };
    let size = |t: &T| t.meta.as_ref().and_then(|m| m.shape.get(d).copied());
    d != dim
        && size(x).is_some()
        && idx
            .iter()
            .chain(src.iter())
            .all(|t| t.p == x.p && size(t) == size(x))
}

/// Whether an `index_add`/`index_copy`/`index_fill` runs row by row on each rank's piece:
/// `self` sharded along a dim other than `dim`, the 1-d index of positions along `dim`
/// replicated (every rank writes the same positions of its own rows), and the source sharded
/// alike with the same local size there (its rows are `self`'s), or a 0-d replicated fill
/// value. A sharded index writes other positions on each rank: no piece of the global result.
fn positions_alike(x: &T, dim: usize, idx: Option<&T>, src: Option<&T>) -> bool {
    let Place::Shard(d) = x.p else { return false };
    let d = d as usize;
    let size = |t: &T| t.meta.as_ref().and_then(|m| m.shape.get(d).copied());
    d != dim
        && size(x).is_some()
        && idx.is_some_and(|i| i.p == Place::Replicate)
        && src.is_none_or(|s| {
            (s.p == x.p && size(s) == size(x))
                || (s.p == Place::Replicate && s.meta.as_ref().is_some_and(|m| m.shape.is_empty()))
        })
}
