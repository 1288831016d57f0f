//! A selection's frame ([`Place::Selected`]): rows of a selection gathered whole onto every
//! coordinate of their own mesh dim (the expert-parallel dispatcher's all-gather of a
//! microbatch's tokens), followed through the experts and back to `Rows` by the combine's
//! reduce-scatter.
//!
//! A call whose inputs hold one selection's frame on a mesh dim runs its rule twice: on the
//! frame's placements (`base`: what the value is, its rows dim taken as the whole selection)
//! and on a shadow lane where every framed input is `Rows(d, id)` and every other input
//! `Replicate()` (`rows::rows_mode`: an operand outside the frame must not meet the rows, and
//! the rule's shard of the output says where the rows went). The output is framed only where
//! both lanes place it; anything else is `Varying`.

use crate::place::{Place, Red, RowKey, RowTable, SELECTED_PARTIAL};
use crate::rows::{self, RowsMode};
use crate::rules::{Ctx, Rule, Runs};
use shardproof_ir::ValueId;
use shardproof_ops::{Args, Meta};

/// The collective's group as a call sees it on mesh dim `m`: `(m, in_group, group_dims,
/// group_len)`.
pub(super) type GroupOnDim<'a> = (usize, bool, &'a [usize], usize);

/// The shadow lane of a framed call (`ctx`: the call on its mesh dim `m` as the ordinary lane
/// saw it, `first` its first input; `place`: the inputs' placements there): per output, `Rows(e, id)` where the rule,
/// run on the framed inputs' rows seen as shards and every other input as `Replicate()`,
/// puts the rows in dim `e`; `None` where `rows::rows_mode` does not read the rows as a shard
/// (an operand outside the frame meets them) or the rule refuses.
pub(super) fn shadow_lane(
    ctx: &Ctx,
    rule: &Rule,
    bound: &Args,
    place: &dyn Fn(ValueId) -> Place,
    meta: &dyn Fn(ValueId) -> Option<Meta>,
    rows_table: &std::cell::RefCell<RowTable>,
    (m, first): (usize, Option<ValueId>),
) -> Option<Vec<Place>> {
    let lane = |v: ValueId| shadow(place(v));
    // No equal-runs reading in the shadow lane: an operand outside the frame stands for
    // any placement there, so its runs say nothing about the frame's rows.
    let mode = rows::rows_mode(
        rule.family,
        bound,
        lane,
        meta,
        |id| rows_table.borrow().key(id),
        |_| Runs::Unknown,
        |_| false,
    );
    let seen = |v: ValueId| match (lane(v), mode) {
        (Place::Rows(d, _), RowsMode::AsShard { .. }) => Place::Shard(d),
        (p, _) => p,
    };
    let mut input_places = ctx.input_places.to_vec();
    if let (Some(v), Some(q)) = (first, input_places.get_mut(m)) {
        *q = seen(v);
    }
    let by_factors = std::cell::Cell::new(false);
    let (id, v, d) = match mode {
        RowsMode::AsShard {
            id,
            v,
            d,
            blocks: 1,
        } => (id, v, d),
        // A slice or select along another dim than the rows': each output row is its input
        // row, whichever columns each coordinate picks (the rule's literal comparison is for
        // the frame's lane, which ran it).
        RowsMode::Own => {
            let rows_dim = first.map(lane).and_then(|p| match p {
                Place::Rows(d, _) => Some(d as i64),
                _ => None,
            })?;
            let rank = first.and_then(meta).map(|mm| mm.shape.len() as i64)?;
            let dim = bound
                .schema()
                .index_of("dim")
                .and_then(|_| bound.get("dim"))
                .and_then(|a| a.as_int())
                .unwrap_or(0);
            let dim = if dim < 0 { dim + rank } else { dim };
            if dim == rows_dim {
                return None;
            }
            let sctx = Ctx {
                place: &lane,
                input_places: &input_places,
                by_factors: &by_factors,
                varies: false,
                rows_input: true,
                ..*ctx
            };
            return (rule.f)(&sctx).ok();
        }
        _ => return None,
    };
    let sctx = Ctx {
        place: &seen,
        input_places: &input_places,
        by_factors: &by_factors,
        rows_input: first.is_some_and(|f| matches!(lane(f), Place::Rows(..))),
        rows_dims: ctx.rows_dims | 1u64.checked_shl(m as u32).unwrap_or(0),
        ..*ctx
    };
    let out = (rule.f)(&sctx).ok()?;
    let in_size = meta(v).and_then(|mm| mm.shape.get(d as usize).copied());
    let mut table = rows_table.borrow_mut();
    Some(
        out.into_iter()
            .enumerate()
            .map(|(o, p)| {
                let shape = ctx
                    .outs
                    .get(o)
                    .and_then(|mm| mm.as_ref())
                    .map(|mm| mm.shape.as_slice());
                rows::rows_output(p, rule.family, in_size, shape, id, &mut table, false)
            })
            .collect(),
    )
}

/// An all-gather of rows along dim 0 over one mesh dim alone, as mesh dim `m` sees it where the
/// rule gave `p` for rows `(id, d)` of local size `in_size` seen as a shard and the output's
/// dim 0 is `out0`: over `m` itself (the rule's `Replicate()`) the whole selection on every
/// coordinate, `Selected(0, id, Replicate())`; over another mesh dim `g` (the rule's blocks
/// of dim 0) rows of `RowKey::Gathered`. A reduce-scatter over `g` along dim 0 of rows
/// gathered over `g` gives back the parent's rows. `None`: not such a call.
pub(super) fn gathered_rows(
    family: &str,
    (id, d, in_size): (u16, u8, Option<usize>),
    (p, out0): (Place, Option<usize>),
    table: &mut RowTable,
    (m, in_group, group_dims, group_len): GroupOnDim,
) -> Option<Place> {
    let [g] = *group_dims else { return None };
    let (in0, out0) = (in_size?, out0?);
    if d != 0 || group_len < 2 || matches!(table.key(id)?, RowKey::Blocks { .. }) {
        return None;
    }
    match family {
        "all-gather" if in_group && g == m => (p == Place::Replicate && out0 == in0 * group_len)
            .then_some(Place::Selected(0, id, u8::MAX)),
        "all-gather" if !in_group && g != m => {
            if out0 != in0 * group_len || p.blocks().is_none_or(|(e, _)| e != 0) {
                return None;
            }
            let over = u8::try_from(g).ok()?;
            let key = RowKey::Gathered {
                parent: id,
                over,
                n: group_len,
            };
            Some(
                table
                    .intern(key)
                    .map_or(Place::Varying, |k| Place::Rows(0, k)),
            )
        }
        "reduce-scatter" if !in_group && g != m => match table.key(id)? {
            RowKey::Gathered { parent, over, n }
                if over as usize == g
                    && n == group_len
                    && in0 == out0 * n
                    && p == Place::Shard(0) =>
            {
                Some(Place::Rows(0, parent))
            }
            _ => None,
        },
        _ => None,
    }
}

/// The combine's reduce-scatter of `Selected(0, id, Partial(sum))` (`input`, dim 0 of local
/// size `in0`) along dim 0, which the frame's lane made `Shard(0)` (`p`, dim 0 of size
/// `out0`), over a group whose outermost mesh dim is the frame's own `m`:
/// - over `m` alone, coordinate `r` gets the rows it holds of the selection, `Rows(0, id)`;
/// - over `m` and mesh dims inside it (`inner`, `c` coordinates together; ranks in a group are
///   in row-major order, so the group position is `m`'s coordinate then `inner`'s), the
///   selection's `n_m * L` rows are cut into `n_m * c` chunks of `out0 = L / c` and the rank at
///   inner position `j` gets chunk `j` of its own coordinate's `L` rows: rows `j * out0 ..
///   (j + 1) * out0` of its piece of the selection, `Rows(0, Slice { parent: id, .. })` (the key
///   a slice of its own rows at those bounds makes, so the rows it weights them by pair).
///
/// With `m` inside another group dim the chunks fall in other coordinates' rows: `None`, as for
/// any other call. `coords` and `sizes`: the rank's mesh coordinates and the mesh dims' sizes.
pub(super) fn combined(
    family: &str,
    input: Option<Place>,
    (in0, out0): (Option<usize>, Option<usize>),
    (m, in_group, group_dims, group_len): GroupOnDim,
    p: Place,
    (coords, sizes): (&[usize], &[usize]),
    table: &mut RowTable,
) -> Option<Place> {
    let Some(Place::Selected(0, id, SELECTED_PARTIAL)) = input else {
        return None;
    };
    let (in0, out0) = (in0?, out0?);
    if family != "reduce-scatter"
        || !in_group
        || group_len < 2
        || p != Place::Shard(0)
        || in0 != out0 * group_len
    {
        return None;
    }
    match group_dims {
        [g] if *g == m => Some(Place::Rows(0, id)),
        [g, inner @ ..] if *g == m && !inner.is_empty() => {
            let n_m = *sizes.get(m)?;
            let j = inner
                .iter()
                .try_fold(0usize, |a, &k| Some(a * sizes.get(k)? + coords.get(k)?))?;
            let c: usize = inner
                .iter()
                .map(|&k| sizes.get(k).copied())
                .product::<Option<usize>>()?;
            if n_m < 2 || n_m * c != group_len || j >= c {
                return None;
            }
            let key = RowKey::Slice {
                parent: Some(id),
                size: in0 / n_m,
                start: j * out0,
                end: (j + 1) * out0,
                step: 1,
            };
            Some(
                table
                    .intern(key)
                    .map_or(Place::Varying, |k| Place::Rows(0, k)),
            )
        }
        _ => None,
    }
}

/// An all-gather along dim 0 over other mesh dims (`group_dims`, `m` not among them) of a
/// frame whose value is the same on every coordinate of `m` (`Selected(0, id, Replicate())`,
/// `input`; the frame's lane kept `Replicate()`, `p`), where on every mesh dim `g` gathered
/// over the input holds, in dim 0, the rows the frame's own gather left there
/// (`RowKey::Gathered` over `m` of `m`'s size, `key_on(g)`): the gather over `g` enters `g`'s
/// frame of them ([`gathered_rows`]), the whole selection in its order, which says what dim 0
/// holds from then on. On `m` every coordinate gathers the same frames (they were equal along
/// `m` at each coordinate of `g`): `Replicate()`, the frame left. `None`: not such a call.
pub(super) fn gathered_elsewhere(
    family: &str,
    input: Option<Place>,
    p: Place,
    (m, in_group, group_dims, group_len): GroupOnDim,
    size_m: usize,
    key_on: &dyn Fn(usize) -> Option<RowKey>,
) -> Option<Place> {
    let Some(Place::Selected(0, _, u8::MAX)) = input else {
        return None;
    };
    (family == "all-gather"
        && !in_group
        && !group_dims.is_empty()
        && group_len >= 2
        && p == Place::Replicate
        && group_dims.iter().all(|&g| {
            g != m
                && matches!(key_on(g), Some(RowKey::Gathered { over, n, .. })
                    if over as usize == m && n == size_m)
        }))
    .then_some(Place::Replicate)
}

/// How a call takes framed inputs on one mesh dim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum FrameMode {
    /// No input is framed.
    None,
    /// Every framed input holds selection `id`; every other input is `Replicate()`, a plain
    /// shard or a partial sum.
    Frame {
        /// The selection.
        id: u16,
    },
    /// Frames of two selections, or a framed input beside a placement the frame does not
    /// read: the framed inputs are `Varying`.
    Varying,
}

/// How a call with inputs placed `places` on one mesh dim takes framed inputs.
pub(super) fn frame_mode(places: impl IntoIterator<Item = Place>) -> FrameMode {
    let mut id = None;
    let mut other = false;
    for p in places {
        match p {
            Place::Selected(_, k, _) => {
                if id.is_some_and(|j| j != k) {
                    return FrameMode::Varying;
                }
                id = Some(k);
            }
            Place::Replicate | Place::Shard(_) | Place::Partial(Red::Sum) => {}
            _ => other = true,
        }
    }
    match id {
        None => FrameMode::None,
        Some(_) if other => FrameMode::Varying,
        Some(id) => FrameMode::Frame { id },
    }
}

/// The placement a framed value has in its frame (`Selected`'s `base`).
pub(super) fn base(p: Place) -> Place {
    match p {
        Place::Selected(_, _, u8::MAX) => Place::Replicate,
        Place::Selected(_, _, SELECTED_PARTIAL) => Place::Partial(Red::Sum),
        Place::Selected(_, _, b) => Place::Shard(b),
        p => p,
    }
}

/// The placement the frame mode's ordinary lane shows a rule.
pub(super) fn ordinary(p: Place, mode: FrameMode) -> Place {
    match (p, mode) {
        (Place::Selected(..), FrameMode::Frame { .. }) => base(p),
        (Place::Selected(..), _) => Place::Varying,
        (p, _) => p,
    }
}

/// The placement the shadow lane shows `rows::rows_mode`: a framed value's rows, and every
/// other value as one that holds no rows (`Replicate()`), which must not meet them.
pub(super) fn shadow(p: Place) -> Place {
    match p {
        Place::Selected(d, id, _) => Place::Rows(d, id),
        Place::Replicate | Place::Shard(_) | Place::Partial(Red::Sum) => Place::Replicate,
        _ => Place::Varying,
    }
}

/// The framed output: `ordinary` the rule's placement in the frame, `rows` the shadow lane's
/// (`Rows(e, id)`: the output's dim `e` holds selection `id`). `Varying` where either lane
/// does not place it, where the frame's rows dim would be sharded, or where `id` merges the
/// rows with outer dims (`RowKey::Blocks`, not followed in a frame).
pub(super) fn framed(ordinary: Place, rows: Place, key: impl Fn(u16) -> Option<RowKey>) -> Place {
    let Place::Rows(e, id) = rows else {
        return if ordinary == Place::Unknown {
            Place::Unknown
        } else {
            Place::Varying
        };
    };
    if !matches!(
        key(id),
        Some(RowKey::Slice { .. } | RowKey::Merge { .. } | RowKey::Gathered { .. })
    ) {
        return Place::Varying;
    }
    match ordinary {
        Place::Replicate => Place::Selected(e, id, u8::MAX),
        Place::Partial(Red::Sum) => Place::Selected(e, id, SELECTED_PARTIAL),
        Place::Shard(k) if k != e && k < SELECTED_PARTIAL => Place::Selected(e, id, k),
        Place::Unknown => Place::Unknown,
        _ => Place::Varying,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_reads_one_selection_beside_ordinary_placements() {
        let sel = Place::Selected(0, 3, u8::MAX);
        assert_eq!(
            frame_mode([sel, Place::Shard(0)]),
            FrameMode::Frame { id: 3 }
        );
        assert_eq!(
            frame_mode([sel, Place::Selected(1, 4, 0)]),
            FrameMode::Varying
        );
        assert_eq!(frame_mode([sel, Place::Rows(0, 3)]), FrameMode::Varying);
        assert_eq!(
            frame_mode([sel, Place::Partial(Red::Avg)]),
            FrameMode::Varying
        );
        assert_eq!(frame_mode([Place::Shard(0)]), FrameMode::None);
        assert_eq!(
            base(Place::Selected(1, 3, SELECTED_PARTIAL)),
            Place::Partial(Red::Sum)
        );
        assert_eq!(base(Place::Selected(1, 3, 0)), Place::Shard(0));
    }

    #[test]
    fn a_framed_output_needs_both_lanes() {
        let key = |_| {
            Some(RowKey::Slice {
                parent: None,
                size: 4,
                start: 0,
                end: 2,
                step: 1,
            })
        };
        assert_eq!(
            framed(Place::Shard(0), Place::Rows(1, 2), key),
            Place::Selected(1, 2, 0)
        );
        // The rows dim sharded in the frame, or no rows in the shadow lane.
        assert_eq!(
            framed(Place::Shard(1), Place::Rows(1, 2), key),
            Place::Varying
        );
        assert_eq!(
            framed(Place::Replicate, Place::Replicate, key),
            Place::Varying
        );
        assert_eq!(
            framed(Place::Partial(Red::Avg), Place::Rows(0, 2), key),
            Place::Varying
        );
    }
}
