//! Slicing and joining rules: slice, select, cat, stack, split, slice_scatter, pad, flip,
//! triangle (moved out of `views.rs`, unchanged).

use super::*;

/// Slices along `dim` of `x` from `start` of length `len`: what the slice holds on this mesh
/// dim given the other ranks' slices.
pub(super) fn slice_like(
    c: &Ctx,
    x: &T,
    dim: usize,
    starts_name: &str,
    keeps_dim: bool,
) -> Outcome {
    let size = x
        .meta
        .as_ref()
        .and_then(|m| m.shape.get(dim).copied())
        .unwrap_or(0);
    let out_len = out_shape(c, 0)
        .and_then(|s| {
            if keeps_dim {
                s.get(dim).copied()
            } else {
                Some(1)
            }
        })
        .unwrap_or(0);
    let shift = |d: usize| {
        if keeps_dim || d < dim {
            Some(d)
        } else {
            Some(d - 1)
        }
    };
    // The same rows of every coordinate's piece (a microbatch of a batch shard): rows of a
    // selection the slice's literals name (`Rows`), never a plain shard.
    let rows_of = |parent: Option<u16>| -> Place {
        if !keeps_dim || c.varies || out_len == 0 {
            return Place::Varying;
        }
        let norm = |v: i64| -> usize {
            let v = if v < 0 { v + size as i64 } else { v };
            v.clamp(0, size as i64) as usize
        };
        let (Ok(start), Ok(end), Ok(step)) = (
            literal_bound(c, starts_name),
            slice_end(c, starts_name),
            literal_bound(c, "step"),
        ) else {
            return Place::Varying;
        };
        let start = norm(start.unwrap_or(0));
        let end = end.map_or(size, norm);
        let Some(step) = step
            .unwrap_or(1)
            .try_into()
            .ok()
            .filter(|&s: &usize| s >= 1)
        else {
            return Place::Varying;
        };
        if end <= start || (end - start).div_ceil(step) != out_len {
            return Place::Varying;
        }
        let key = RowKey::Slice {
            parent,
            size,
            start,
            end,
            step,
        };
        (c.rows)(key).map_or(Place::Varying, |id| Place::Rows(dim as u8, id))
    };
    match x.p {
        Place::Shard(d) if d as usize == dim => {
            if takes_whole_dim(c, dim, starts_name, size, out_len, keeps_dim) {
                c.all(x.p)
            } else {
                c.all(rows_of(None))
            }
        }
        Place::Rows(d, id) if d as usize == dim => {
            if out_len == size && keeps_dim && !c.varies {
                c.all(x.p)
            } else {
                c.all(rows_of(Some(id)))
            }
        }
        Place::Rows(d, id) => {
            if c.varies {
                return c.all(Place::Varying);
            }
            c.all(shift(d as usize).map_or(Place::Varying, |e| Place::Rows(e as u8, id)))
        }
        Place::Shard(d) => {
            if c.varies {
                return c.all(Place::Varying);
            }
            c.all(shift(d as usize).map_or(Place::Varying, Place::shard))
        }
        // The blocked dim itself: only a slice that takes the whole dim in the spec too (from
        // 0, step 1, its end past every coordinate's rows) keeps the layout; a part of it
        // takes part of every block, which no placement states.
        Place::Blocked(d, _) if d as usize == dim => {
            let whole = takes_whole_dim(c, dim, starts_name, size, out_len, keeps_dim);
            c.all(if whole { x.p } else { Place::Varying })
        }
        // Another dim: every coordinate's piece loses the same rows, each block stays whole
        // (the rope halves of merged `b*h` heads).
        Place::Blocked(d, k) => {
            if c.varies {
                return c.all(Place::Varying);
            }
            c.all(shift(d as usize).map_or(Place::Varying, |e| Place::blocked(e, k as usize)))
        }
        Place::Replicate if c.varies => {
            // A rank-dependent slice of a replicated tensor: a shard when every rank along the
            // mesh dim takes the block at its own coordinate.
            let starts = (c.peer_ints)(starts_name);
            // Every rank's start against its own coordinate's block: no rank reads its own.
            let n = c.coord.n;
            let own = keeps_dim
                && out_len > 0
                && out_len * n == size
                && starts.len() == n
                && starts.iter().enumerate().all(|(k, s)| {
                    s.map(|s| if s < 0 { s + size as i64 } else { s }) == Some((k * out_len) as i64)
                });
            c.all(if own {
                Place::shard(dim)
            } else {
                spread_slice(c, x, dim, size, out_len, &starts, keeps_dim)
            })
        }
        Place::Varying => c.all(Place::Varying),
        // One row of a longer dim that no mesh dim splits (every rank holds the dim whole),
        // at bounds alike on every rank: the bound may be a local length of 1 whose spec is
        // the global one (a table sliced without the rank's offset), and as a replicated
        // operand of size 1 the row would pair with a shard as a broadcast (rank k reading
        // row 0 where the spec reads row k). No claim, whatever the other dims' placements
        // (a table split on another dim by another mesh dim reads row 0 of its piece where
        // the spec reads row k: issue 44). A dim some mesh dim splits (a microbatch of one
        // row of a batch shard) is sliced within its pieces: that mesh dim's reading
        // (`Rows`) claims no whole, and this one keeps its reading.
        Place::Replicate
            if keeps_dim
                && out_len == 1
                && size > 1
                && !split_along(&c.on_every_mesh_dim(x), dim) =>
        {
            c.all(Place::Varying)
        }
        p @ (Place::Partial(_) | Place::Replicate) => c.all(p),
        p => c.all(p),
    }
}

/// Whether some mesh dim splits tensor dim `dim` (a shard, blocks or rows of a selection
/// along it), given a tensor's placements on every mesh dim.
fn split_along(places: &[Place], dim: usize) -> bool {
    places.iter().any(|p| {
        matches!(p, Place::Shard(d) | Place::Blocked(d, _) | Place::Rows(d, _) if *d as usize == dim)
    })
}

/// A slice of a replicated tensor at rank-dependent bounds along `dim` (of `size` rows),
/// every rank's `[start, end)` read, step 1 on every rank, the same dim on every rank: the
/// rows of a [`RowKey::Spread`] (a rank's sequence chunk), else `Varying`.
fn spread_slice(
    c: &Ctx,
    x: &T,
    dim: usize,
    size: usize,
    out_len: usize,
    starts: &[Option<i64>],
    keeps_dim: bool,
) -> Place {
    if !keeps_dim || out_len == 0 || starts.len() != c.coord.n {
        return Place::Varying;
    }
    let ends = (c.peer_ints)("end");
    let same_dim = (c.peer_ints)("dim")
        .iter()
        .all(|d| d.and_then(|d| norm_dim(d, x.rank())) == Some(dim));
    let steps_one = (c.peer_ints)("step").iter().all(|s| *s == Some(1));
    let norm = |v: i64| -> usize {
        let v = if v < 0 { v + size as i64 } else { v };
        v.clamp(0, size as i64) as usize
    };
    let segs: Option<Vec<Vec<(usize, usize)>>> = starts
        .iter()
        .zip(&ends)
        .map(|(s, e)| Some(vec![(norm((*s)?), norm((*e)?))]))
        .collect();
    match segs {
        // Every rank's slice as long as this rank's output (`spread` checks they are equal).
        Some(segs) if same_dim && steps_one && segs[0][0].1 - segs[0][0].0 == out_len => {
            crate::rows::spread(Some(size), segs, Some((c.value_name)(x.v)))
                .and_then(|k| (c.rows)(k))
                .map_or(Place::Varying, |id| Place::Rows(dim as u8, id))
        }
        _ => Place::Varying,
    }
}

pub(super) fn slice(c: &Ctx) -> Outcome {
    let Some(x) = c.t("self") else {
        return c.all(Place::Unknown);
    };
    let Some(dim) = norm_dim(c.int("dim").unwrap_or(0), x.rank()) else {
        return c.all(Place::Unknown);
    };
    slice_like(c, &x, dim, "start", true)
}

pub(super) fn select(c: &Ctx) -> Outcome {
    let Some(x) = c.t("self") else {
        return c.all(Place::Unknown);
    };
    let Some(dim) = c.int("dim").and_then(|d| norm_dim(d, x.rank())) else {
        return c.all(Place::Unknown);
    };
    slice_like(c, &x, dim, "index", false)
}

pub(super) fn cat(c: &Ctx) -> Outcome {
    let ts = c.ts("tensors");
    let r = c.out_rank(0);
    let Some(dim) = norm_dim(c.int("dim").unwrap_or(0), r) else {
        return c.all(Place::Unknown);
    };
    // Sizes along the cat dim differ: compare placements directly.
    let ts: Vec<T> = ts
        .into_iter()
        .filter(|t| {
            t.meta
                .as_ref()
                .is_none_or(|m| m.shape.iter().product::<usize>() > 0 || m.shape.len() == r)
        })
        .collect();
    // Spread rows joined along their dim (the engine passes them only when every operand is):
    // each coordinate's segments in the operands' order.
    if !ts.is_empty()
        && ts
            .iter()
            .all(|t| matches!(t.p, Place::Rows(d, _) if d as usize == dim))
    {
        let keys: Option<Vec<RowKey>> = ts
            .iter()
            .map(|t| match t.p {
                Place::Rows(_, id) => (c.row_key)(id),
                _ => None,
            })
            .collect();
        // Joined into every coordinate's own block, still rows: read as a plain shard, a
        // replicated operand of the local size beside it would be taken for its own tiling.
        return c.all(
            keys.and_then(|k| crate::rows::cat_spread(&k))
                .and_then(|k| (c.rows)(k))
                .map_or(Place::Varying, |id| Place::Rows(dim as u8, id)),
        );
    }
    // Pieces joined along their own dim (plain or blocked): every coordinate's pieces side by
    // side, no shard of the joined tensor.
    if ts
        .iter()
        .any(|t| t.p.blocks().is_some_and(|(d, _)| d == dim))
    {
        return c.all(if ts.len() == 1 {
            ts[0].p
        } else {
            Place::Varying
        });
    }
    let first = ts.first().map(|t| t.p);
    if ts.iter().all(|t| Some(t.p) == first) {
        return c.all(first.unwrap_or(Place::Replicate));
    }
    // Mixed: merge as a sum of disjoint blocks (a partial needs every block partial), in the
    // operands' own dims (their sizes along the cat dim differ; the pairing along the other
    // dims is checked below by `unbroadcast_pairing`).
    match merge_joined(&ts, Lin::Add, false) {
        Ok(p) => match unbroadcast_pairing(p, &ts) {
            Some(v) => one(Err(v), c.n_out()),
            None => c.all(p),
        },
        r => one(r, c.n_out()),
    }
}

pub(super) fn stack(c: &Ctx) -> Outcome {
    let ts = c.ts("tensors");
    let r = c.out_rank(0);
    let Some(dim) = norm_dim(c.int("dim").unwrap_or(0), r) else {
        return c.all(Place::Unknown);
    };
    let first = ts.first().map(|t| t.p);
    if !ts.iter().all(|t| Some(t.p) == first) {
        // The operands' dims in the input's numbering, moved past the new dim after the
        // merge; the pairing is checked by `unbroadcast_pairing`.
        return match merge_joined(&ts, Lin::Add, false) {
            Ok(p) => match unbroadcast_pairing(p, &ts) {
                Some(v) => one(Err(v), c.n_out()),
                None => c.all(match p {
                    Place::Shard(d) if d as usize >= dim => Place::shard(d as usize + 1),
                    Place::Blocked(d, k) if d as usize >= dim => {
                        Place::blocked(d as usize + 1, k as usize)
                    }
                    p => p,
                }),
            },
            r => one(r, c.n_out()),
        };
    }
    match first {
        Some(Place::Shard(d)) => c.all(Place::shard(if d as usize >= dim {
            d as usize + 1
        } else {
            d as usize
        })),
        Some(p) => c.all(p),
        None => c.all(Place::Replicate),
    }
}

pub(super) fn split(c: &Ctx) -> Outcome {
    let Some(x) = c.t("self") else {
        return c.all(Place::Unknown);
    };
    let Some(dim) = norm_dim(c.int("dim").unwrap_or(0), x.rank()) else {
        return c.all(Place::Unknown);
    };
    let unbind = c.args.schema().name.starts_with("unbind");
    // As `slice_like`: a piece of one row of a longer dim that no mesh dim splits, its
    // length read from a local shape (`split(t, 1)` where the spec splits by 2), pairs with a
    // shard as a broadcast. No claim.
    let size = x
        .meta
        .as_ref()
        .and_then(|m| m.shape.get(dim).copied())
        .unwrap_or(0);
    let one_row =
        (0..c.n_out()).any(|o| out_shape(c, o).and_then(|s| s.get(dim).copied()) == Some(1));
    if !unbind
        && x.p == Place::Replicate
        && size > 1
        && one_row
        && !split_along(&c.on_every_mesh_dim(&x), dim)
    {
        return c.all(Place::Varying);
    }
    match x.p {
        Place::Shard(d) if d as usize == dim => c.all(Place::Varying),
        Place::Shard(d) if unbind && d as usize > dim => c.all(Place::Shard(d - 1)),
        p => c.all(p),
    }
}

pub(super) fn slice_scatter(c: &Ctx) -> Outcome {
    let (Some(x), Some(src)) = (c.t("self"), c.t("src")) else {
        return c.all(Place::Unknown);
    };
    let Some(dim) = norm_dim(c.int("dim").unwrap_or(0), x.rank()) else {
        return c.all(Place::Unknown);
    };
    // A slice_scatter over the whole dim replaces the tensor by `src`.
    let size = x.meta.as_ref().and_then(|m| m.shape.get(dim).copied());
    // Against the spec's size of the dim: a `self` sharded on it has the rows of every mesh
    // dim sharding it (`None`: not known, never whole; so is a size not known).
    let global = if x.p.blocks().is_some_and(|(d, _)| d == dim) {
        size.and_then(|size| global_size(c, dim, size))
    } else {
        size.and_then(|size| i64::try_from(size).ok())
    };
    let whole = c.args.schema().name.starts_with("slice_scatter")
        && literal_bound(c, "start").is_ok_and(|s| s.unwrap_or(0) == 0)
        && global.is_some_and(|global| {
            literal_bound(c, "end").is_ok_and(|e| e.is_none_or(|e| e >= global))
        })
        && literal_bound(c, "step").is_ok_and(|s| s.unwrap_or(1) == 1);
    if whole && !c.varies {
        return c.all(src.p);
    }
    if c.varies || x.p == Place::Shard(dim as u8) {
        if x.p.is_partial() || src.p.is_partial() {
            // A partial operand: a finding whatever the pairing.
            return one(merge_joined(&[x, src], Lin::None, false), c.n_out());
        }
        return c.all(Place::Varying);
    }
    let src_p = match src.p {
        Place::Shard(d) if d as usize >= dim && c.args.schema().name.starts_with("select") => {
            Place::Shard(d + 1)
        }
        p => p,
    };
    // A source sharded along the written dim puts each rank's piece at the same local rows,
    // where the single-device program writes the whole source at its own rows: no shard.
    if src_p.blocks().is_some_and(|(d, _)| d == dim) {
        return c.all(Place::Varying);
    }
    let mut src = src;
    src.p = src_p;
    if src.constant != u64::MAX && c.args.schema().name.starts_with("select") {
        // The source lacks the written dim: its bits are in another numbering.
        src.constant = 0;
    }
    // `self` and the output share their dims, so a shard keeps its dim; the pairing is
    // checked by `unbroadcast_pairing`.
    match merge_joined(&[x.clone(), src.clone()], Lin::Add, false) {
        Ok(p) => match unbroadcast_pairing(p, &[x, src]) {
            Some(v) => one(Err(v), c.n_out()),
            None => c.all(p),
        },
        r => one(r, c.n_out()),
    }
}

pub(super) fn pad(c: &Ctx) -> Outcome {
    let Some(x) = c.t("self") else {
        return c.all(Place::Unknown);
    };
    let pads = c.ints("pad").unwrap_or_default();
    let r = x.rank();
    let padded: Vec<usize> = (0..pads.len() / 2)
        .filter(|i| pads[2 * i] != 0 || pads[2 * i + 1] != 0)
        .filter_map(|i| r.checked_sub(i + 1))
        .collect();
    let nonzero = c.num("value").is_some_and(|v| v != 0.0);
    // Each coordinate k pads its piece of dim d with zeros to the whole dim at its own block
    // (`k * w` before, `(n - 1 - k) * w` after, w the piece's size) and pads nothing else:
    // the ranks' results sum to the tensor (an expert-parallel rank's columns put back in
    // place before a reduce-scatter).
    if let Place::Shard(d) = x.p {
        let d = d as usize;
        let w = x.meta.as_ref().and_then(|m| m.shape.get(d).copied());
        let n = c.coord.n;
        let at = r.checked_sub(d + 1).map(|i| 2 * i);
        let placed = |k: usize, p: &[i64]| {
            let (Some(w), Some(at)) = (w, at) else {
                return false;
            };
            p.len().is_multiple_of(2)
                && p.len() > at + 1
                && p.iter().enumerate().all(|(q, &v)| {
                    if q == at {
                        v == (k * w) as i64
                    } else if q == at + 1 {
                        v == ((n - 1 - k) * w) as i64
                    } else {
                        v == 0
                    }
                })
        };
        let constant = c.str("mode").is_none_or(|m| m == "constant");
        if c.varies && constant && !nonzero && w.is_some_and(|w| w > 0) && n > 1 {
            let peers = (c.peer_int_lists)("pad");
            if peers.len() == n
                && peers
                    .iter()
                    .enumerate()
                    .all(|(k, p)| p.as_deref().is_some_and(|p| placed(k, p)))
            {
                return c.all(Place::Partial(Red::Sum));
            }
        }
    }
    match x.p {
        Place::Shard(d) if padded.contains(&(d as usize)) => c.all(Place::Varying),
        Place::Partial(_) | Place::Unmasked => one(merge(&[x], 0, Lin::Add, nonzero), 1),
        p => c.all(p),
    }
}

pub(super) fn flip(c: &Ctx) -> Outcome {
    let Some(x) = c.t("self") else {
        return c.all(Place::Unknown);
    };
    let dims = c.ints("dims").unwrap_or_default();
    let all_dims = c.ints("dims").is_none() || dims.is_empty();
    match x.p {
        Place::Shard(d)
            if all_dims
                || dims
                    .iter()
                    .any(|&e| norm_dim(e, x.rank()) == Some(d as usize)) =>
        {
            c.all(Place::Varying)
        }
        p => c.all(p),
    }
}

pub(super) fn triangle(c: &Ctx) -> Outcome {
    let Some(x) = c.t("self") else {
        return c.all(Place::Unknown);
    };
    let r = x.rank();
    match x.p {
        Place::Shard(d) if d as usize + 2 >= r => c.all(Place::Varying),
        p => c.all(p),
    }
}

/// Whether a slice of the sharded dim (local length `size`) takes the whole dim of the spec's
/// tensor too: from 0, step 1, an end past every coordinate's rows. A slice ending at the
/// local length takes each rank's whole piece but, read as the spec's slice with the same
/// literals, only the first `size` rows of the global dim: the pieces are no shard of it.
fn takes_whole_dim(
    c: &Ctx,
    dim: usize,
    starts_name: &str,
    size: usize,
    out_len: usize,
    keeps_dim: bool,
) -> bool {
    keeps_dim
        && !c.varies
        && out_len == size
        && literal_bound(c, starts_name).is_ok_and(|s| s.unwrap_or(0) == 0)
        && literal_bound(c, "step").is_ok_and(|s| s.unwrap_or(1) == 1)
        && global_size(c, dim, size).is_some_and(|global| {
            slice_end(c, starts_name).is_ok_and(|e| e.is_none_or(|e| e >= global))
        })
}

/// The spec's size of dim `dim` of the first input, sharded on this mesh dim with `size`
/// rows per rank: `size` times this mesh dim's size and every other mesh dim's that shards
/// the dim too (the input's placements on every mesh dim); `None` where another mesh dim
/// holds it as rows of a selection (the spec's dim holds more rows than the pieces).
fn global_size(c: &Ctx, dim: usize, size: usize) -> Option<i64> {
    let mut n = c.coord.n as i64;
    for (m, (p, &k)) in c.input_places.iter().zip(c.mesh_sizes).enumerate() {
        if m == c.mesh_dim || p.blocks().is_none_or(|(d, _)| d != dim) {
            continue;
        }
        if c.rows_dims & (1u64 << m) != 0 {
            return None;
        }
        n = n.saturating_mul(k as i64);
    }
    Some((size as i64).saturating_mul(n))
}

/// A slice bound as the literals give it: `Ok(None)` where the schema lacks it or it is
/// `None` (the default), `Ok(Some(v))` a literal, `Err(())` a bound that is no literal (a
/// symbolic size), which no reading may take for its default.
fn literal_bound(c: &Ctx, name: &str) -> Result<Option<i64>, ()> {
    match c.arg(name) {
        None | Some(Arg::None) => Ok(None),
        Some(a) => a.as_int().map(Some).ok_or(()),
    }
}

/// The end of a slice ([`literal_bound`]): `end`, or `start + length` of a `narrow`, which
/// has no `end` (read as "to the end of the dim", a narrow of a shard's local length kept
/// the shard though the spec's narrow takes that many rows of the global dim).
fn slice_end(c: &Ctx, starts_name: &str) -> Result<Option<i64>, ()> {
    if !c.has("length") {
        return literal_bound(c, "end");
    }
    // A negative start counts from the end of the dim: not summed with the length here.
    match (literal_bound(c, starts_name)?, literal_bound(c, "length")?) {
        (Some(start), _) if start < 0 => Err(()),
        (start, Some(length)) => Ok(Some(start.unwrap_or(0).saturating_add(length))),
        (_, None) => Err(()),
    }
}
