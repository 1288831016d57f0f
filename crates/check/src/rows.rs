//! Rows of a selection ([`Place::Rows`]): which rules may see them as a plain shard, and what
//! their outputs are then.
//!
//! A value `Rows(d, id)` on a mesh dim is, in coordinate order, a shard along `d` of a tensor
//! whose rows are a fixed selection of another's (a microbatch of a batch shard). A rule that
//! only pairs rows with rows (element-wise operators, products over other dims, norms and
//! softmax over other dims, sums over `d`) computes, on every coordinate, the same function
//! of its rows as on a shard: its output is a shard of the function of the selected tensor,
//! in the same order, so the rule runs as on `Shard(d)` and its shards are the selection's
//! rows again. That needs every operand that meets the rows to hold the same selection
//! (the same `id`): a replicated operand along `d` (the whole tensor's rows; unless equal runs
//! that whole blocks of the selection fill, [`runs_fill_blocks`]) or a plain shard would meet
//! other rows than the ones the selection names. Anything that reads the order
//! (a gather, a declared shard) sees `Varying`.

use crate::place::{Place, RowKey, RowTable};
use crate::rules::Runs;
use shardproof_ir::{Arg, ValueId};
use shardproof_ops::{Args, Meta};

/// How a call takes its `Rows` inputs on one mesh dim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RowsMode {
    /// No input holds rows.
    None,
    /// The rule reads rows itself (slices).
    Own,
    /// The rule sees every `Rows(d, id)` input as `Shard(d)` (as `Blocked(d, blocks)` where
    /// the selection is [`RowKey::Blocks`]); `(v, d)` is the first of them.
    AsShard {
        /// The selection.
        id: u16,
        /// The first input with rows.
        v: ValueId,
        /// Its rows dim.
        d: u8,
        /// The blocks the rows dim holds the selection in (1: a plain shard of it).
        blocks: u16,
    },
    /// The rule sees rows as `Varying` (no known layout).
    Varying,
}

/// Whether `family`'s rule reads `Rows` itself.
fn reads_rows(family: &str) -> bool {
    matches!(family, "slice" | "select")
}

/// Families whose rules pair the elements of their operands, dim by dim, after broadcasting:
/// a replicated operand must not reach along the rows dim.
fn broadcasting(family: &str) -> bool {
    matches!(
        family,
        "linear-unary"
            | "nonlinear-unary"
            | "elementwise-add"
            | "elementwise-mul"
            | "elementwise-div"
            | "nonlinear-binary"
            | "activation-backward"
            | "pow"
            | "max-min"
            | "where"
            | "masked-fill"
            | "lerp"
            | "addcmul"
            | "reduction"
            | "softmax"
            | "softmax-backward"
            | "norm"
            | "norm-backward"
            | "view"
            | "transpose"
            | "permute"
            | "unsqueeze"
            | "squeeze"
            | "expand"
            | "split"
            | "copy"
            | "all-reduce"
            | "all-gather"
            | "reduce-scatter"
            | "send"
    )
}

/// Families whose every operand of rank 1 or more must hold the rows (a loss and its target,
/// pieces concatenated): a replicated one would pair the whole tensor's rows with the
/// selection's.
fn all_rows(family: &str) -> bool {
    matches!(
        family,
        "nll-loss"
            | "nll-loss-backward"
            | "mse-loss"
            | "mse-loss-backward"
            | "cat"
            | "stack"
            | "embedding-backward"
    )
}

/// Families whose one tensor operand is read row by row along a `dim` argument (a sort, the
/// top k): each output row depends on the same input row only, so rows seen as a shard of
/// another dim are the same selection; along the rows' own dim the rule's finding for a
/// sharded sorted dim applies.
fn along_rows(family: &str) -> bool {
    family == "sort"
}

/// The tensor arguments of a bound call, with their argument names.
pub(crate) fn tensors<'a>(bound: &'a Args) -> Vec<(&'a str, ValueId)> {
    let mut out = Vec::new();
    for a in &bound.schema().args {
        let Some(arg) = bound.get(&a.name) else {
            continue;
        };
        match arg {
            Arg::Value(v) => out.push((a.name.as_str(), v)),
            other => {
                let mut vs = Vec::new();
                other.values(&mut vs);
                out.extend(vs.into_iter().map(|v| (a.name.as_str(), v)));
            }
        }
    }
    out
}

/// How the call takes its `Rows` inputs on one mesh dim (`place`: the inputs' placements
/// there, `meta`: their local metas, `key`: a selection's key; `runs`: a replicated operand's
/// equal runs, [`Runs`]; `whole_elsewhere`: whether every other mesh dim holds a value whole,
/// `Replicate()` or a pending sum, so the rank holds every block of its rows dim).
pub(crate) fn rows_mode(
    family: &str,
    bound: &Args,
    place: impl Fn(ValueId) -> Place,
    meta: impl Fn(ValueId) -> Option<Meta>,
    key: impl Fn(u16) -> Option<RowKey>,
    runs: impl Fn(ValueId) -> Runs,
    whole_elsewhere: impl Fn(ValueId) -> bool,
) -> RowsMode {
    let ts = tensors(bound);
    let rows: Vec<(&str, ValueId, u8, u16)> = ts
        .iter()
        .filter_map(|&(n, v)| match place(v) {
            Place::Rows(d, id) => Some((n, v, d, id)),
            _ => None,
        })
        .collect();
    let Some(&(_, v0, d0, id)) = rows.first() else {
        return RowsMode::None;
    };
    if reads_rows(family) {
        return RowsMode::Own;
    }
    let rank = |v: ValueId| meta(v).map(|m| m.shape.len());
    // A concatenation of spread rows along their own dim (a rank's two sequence chunks): the
    // cat rule joins their segments itself (`cat_spread`).
    if family == "cat" && rows.len() == ts.len() {
        let dim = bound.get("dim").and_then(|a| a.as_int()).unwrap_or(0);
        let along = rows.iter().all(|&(_, v, d, id)| {
            let dim = rank(v).and_then(|r| {
                let d = if dim < 0 { dim + r as i64 } else { dim };
                (0..r as i64).contains(&d).then_some(d as u8)
            });
            dim == Some(d) && matches!(key(id), Some(RowKey::Spread { .. }))
        });
        if along {
            return RowsMode::Own;
        }
    }
    // One selection; no plain shard or pending sum with rows beside it (their rows are
    // other rows). A scalar has no rows: the rule judges it as beside a shard (a loss's
    // total weight, a partial count).
    let alike = rows.iter().all(|r| r.3 == id)
        && ts.iter().all(|&(_, v)| {
            rank(v) == Some(0)
                || !matches!(
                    place(v),
                    Place::Shard(_) | Place::Blocked(..) | Place::Partial(_) | Place::Unmasked
                )
        });
    if !alike {
        return RowsMode::Varying;
    }
    let replicated: Vec<(&str, ValueId)> = ts
        .iter()
        .copied()
        .filter(|&(_, v)| place(v) == Place::Replicate)
        .collect();
    let gather_fits = || {
        // `gather(self, dim, index)` with both operands the same rows (checked above, and
        // neither replicated): output row `i` reads row `i` of `self` at the index's row `i`,
        // where the gather runs along another dim than the rows' (a loss picking each
        // token's label column). Along the rows' dim the index's values are global rows.
        let dim = bound
            .get("dim")
            .and_then(|a| a.as_int())
            .zip(bound.get("self").and_then(|a| a.as_value()).and_then(rank))
            .and_then(|(d, r)| {
                let d = if d < 0 { d + r as i64 } else { d };
                (0..r as i64).contains(&d).then_some(d as usize)
            });
        rows.len() == 2 && dim.is_some_and(|dim| rows.iter().all(|r| r.2 as usize != dim))
    };
    // Right-aligned, every operand's spread rows must face one output dim: rows of one
    // selection along two dims (an outer comparison of a rank's positions) pair no row with
    // its own, and each coordinate holds only its own block of the comparison. (Microbatch
    // rows keep their reading: the rule's finding for shards of two dims.)
    let spread_id = |mut id: u16| {
        for _ in 0..=u16::MAX {
            match key(id) {
                Some(RowKey::Merge { parent, .. })
                | Some(RowKey::Blocks { parent, .. })
                | Some(RowKey::Slice {
                    parent: Some(parent),
                    ..
                }) => id = parent,
                Some(RowKey::Spread { .. }) => return true,
                _ => return false,
            }
        }
        false
    };
    let out_rank = ts.iter().filter_map(|&(_, v)| rank(v)).max().unwrap_or(0);
    let one_dim = || {
        let mut at = rows
            .iter()
            .map(|&(_, v, d, _)| rank(v).map(|r| d as usize + out_rank - r));
        let first = at.next().flatten();
        first.is_some() && at.all(|j| j == first)
    };
    if broadcasting(family) && rows.iter().any(|r| spread_id(r.3)) && !one_dim() {
        return RowsMode::Varying;
    }
    // A product of two operands holding spread rows pairs rows with rows only where it
    // contracts them (the left's last dim against the right's second to last: a sum over the
    // rows) or both sit at one batch dim; any other product of them (a rank's queries against
    // its keys) is each coordinate's own block of the product: no reading.
    if matches!(family, "matmul" | "matmul-bias" | "linear")
        && rows.len() >= 2
        && rows.iter().any(|r| spread_id(r.3))
    {
        let at = |k: usize| rank(rows[k].1).map(|r| (rows[k].2 as usize, r));
        let fits = rows.len() == 2
            && match (at(0), at(1)) {
                (Some((dl, rl)), Some((dr, rr))) if rl >= 2 && rr >= 2 => {
                    (dl + 1 == rl && dr + 2 == rr)
                        || (dl + 2 < rl && dr + 2 < rr && rl - dl == rr - dr)
                }
                _ => false,
            };
        if !fits {
            return RowsMode::Varying;
        }
    }
    // A pad of other dims than the rows' (an expert-parallel rank's columns put in place):
    // each output row is its input row, extended.
    let pad_spares_rows = || {
        // Pads not written as numbers could reach the rows dim: no reading.
        let Some(pads) = bound.get("pad").and_then(|a| a.as_int_list()) else {
            return false;
        };
        rows.iter().all(|&(_, v, d, _)| {
            rank(v).is_some_and(|r| {
                (0..pads.len() / 2)
                    .filter(|&i| pads[2 * i] != 0 || pads[2 * i + 1] != 0)
                    .all(|i| r.checked_sub(i + 1) != Some(d as usize))
            })
        })
    };
    let fits = if replicated.is_empty() {
        broadcasting(family)
            || all_rows(family)
            || along_rows(family)
            || matches!(family, "matmul" | "matmul-bias" | "linear" | "embedding")
            || (family == "gather" && gather_fits())
            || (family == "pad" && pad_spares_rows())
    } else if broadcasting(family) {
        // Right-aligned broadcasting: a replicated operand's dim facing a rows dim must be
        // absent or of size 1, and then the rows more than one (one local row against one
        // replicated row pairs them: a row of the replicated tensor, not a broadcast); or
        // the operand is equal runs there that whole blocks of the selection fill
        // ([`runs_fill_blocks`]).
        replicated.iter().all(|&(_, rv)| {
            let Some(rm) = meta(rv) else { return false };
            rows.iter().all(|&(_, v, d, id)| {
                let Some(m) = meta(v) else { return false };
                let r = m.shape.len();
                let j = d as i64 + rm.shape.len() as i64 - r as i64;
                j < 0
                    || (rm.shape.get(j as usize).is_some_and(|&s| s == 1)
                        && m.shape.get(d as usize).is_some_and(|&l| l > 1))
                    || runs_fill_blocks(runs(rv), j as usize, key(id), || whole_elsewhere(v))
            })
        })
    } else if all_rows(family) {
        // Scalars and the optional class weights only.
        replicated
            .iter()
            .all(|&(n, rv)| n == "weight" || rank(rv) == Some(0))
    } else if matches!(family, "matmul" | "matmul-bias" | "linear") {
        // The rows are the left operand's rows (or its batch dims, broadcast against a 2-d
        // right operand); replicated operands are the right operand (2-d) and biases (1-d).
        let left = ["mat1", "batch1", "input", "self"]
            .into_iter()
            .find(|n| ts.iter().any(|t| t.0 == *n) && !(family == "matmul-bias" && *n == "self"));
        rows.iter().all(|&(n, v, d, _)| {
            Some(n) == left && rank(v).is_some_and(|r| r >= 2 && (d as usize) + 2 <= r)
        }) && replicated.iter().all(|&(n, rv)| {
            let r = rank(rv).unwrap_or(usize::MAX);
            // A batched right factor (a product per expert) meets no rows where they are
            // the left's row dim (second to last): its batch dims face the left's others.
            let rows_are_left_rows = || {
                rows.iter()
                    .all(|&(_, v, d, _)| rank(v).is_some_and(|rl| d as usize + 2 == rl))
            };
            Some(n) != left
                && (r <= 1
                    || (r == 2 && !matches!(n, "self" | "bias"))
                    || (matches!(n, "mat2" | "other" | "batch2") && rows_are_left_rows()))
        })
    } else if family == "scatter" && bound.schema().name.starts_with("scatter") {
        // The rows are the index's and the source's; a replicated `self` is left to the rule,
        // which takes it as a piece of the global `self` only where it is a zero fill (a zero
        // tensor's rows are zero whichever rows are selected) and else claims no shard.
        replicated.iter().all(|&(n, _)| n == "self")
    } else if family == "embedding" {
        // The rows are the indices'; the table is replicated.
        rows.iter().all(|r| r.0 == "indices") && replicated.iter().all(|r| r.0 == "weight")
    } else {
        false
    };
    // Rows merged with outer dims are a blocked shard of the selected tensor: only rules that
    // take blocked shards read them.
    let blocks = match key(id) {
        Some(RowKey::Blocks { blocks, .. }) => u16::try_from(blocks).ok(),
        _ => Some(1),
    };
    match blocks {
        Some(blocks) if fits && (blocks == 1 || crate::rules::takes_blocked(family)) => {
            RowsMode::AsShard {
                id,
                v: v0,
                d: d0,
                blocks,
            }
        }
        _ => RowsMode::Varying,
    }
}

/// Whether a replicated operand whose dim `j` faces a selection's rows dim (selection key
/// `key`) pairs every row with the row the single-device program pairs it with: `runs` are
/// R equal runs along `j`, each constant (a `[b, E]` table unsqueezed, expanded over each
/// batch's tokens and merged: the router's aux-loss gradient under context parallelism),
/// and the selection holds its rows in k blocks (`RowKey::Blocks`: outer dims merged onto
/// the rows, each block one outer index's selected rows; 1 for any other key) with R
/// dividing k. Each run then holds k/R whole blocks locally, and the spec's same
/// construction at the global size (runs of the whole blocks) pairs each block with the same
/// run. Where another mesh dim splits the rows operand (`whole`: false), the rank may hold
/// fewer blocks than k (a dp shard of the outer dim, read by factors) and its runs would cut
/// a block: only one run (constant along the dim) pairs alike then.
fn runs_fill_blocks(runs: Runs, j: usize, key: Option<RowKey>, whole: impl Fn() -> bool) -> bool {
    let Runs::Along { dim, count } = runs else {
        return false;
    };
    let blocks = match key {
        Some(RowKey::Blocks { blocks, .. }) => blocks,
        Some(_) => 1,
        None => return false,
    };
    dim == j && count >= 1 && blocks.is_multiple_of(count) && (count == 1 || whole())
}

/// The placement a rule's output takes where it ran on rows seen as a shard: a shard of a
/// dim that keeps the rows' local size is the same selection (a view that merged the dims
/// inside the rows, or split them off again, names the selection it makes); a pending sum
/// stays (a sum over the rows is one over the selection, in any order); anything else that
/// differs across coordinates is `Varying`, and a replicated result is too (a gather of the
/// rows holds them in an order not proven).
///
/// `by_factors`: the view's placement was read by factors against the spec's global shapes
/// (`rules::view_by_factors`), every mesh dim's pieces included; its block count is then the
/// global one, and other mesh dims may hold some of the blocks (a dp shard of a local batch
/// of 1 merged with cp rows: `Blocked(0, 2)` on cp with one block held locally).
pub(crate) fn rows_output(
    p: Place,
    family: &str,
    in_size: Option<usize>,
    out_shape: Option<&[usize]>,
    id: u16,
    table: &mut RowTable,
    by_factors: bool,
) -> Place {
    // The blocks the rule saw the input rows in (`rows_mode`).
    let (parent_of_blocks, k_in) = match table.key(id) {
        Some(RowKey::Blocks { parent, blocks }) => (Some(parent), blocks),
        _ => (None, 1),
    };
    match p {
        Place::Shard(_) | Place::Blocked(..) => {
            let Some((e, k_out)) = p.blocks() else {
                return Place::Varying;
            };
            let (Some(l_in), Some(&l_out)) = (in_size, out_shape.and_then(|s| s.get(e))) else {
                return Place::Varying;
            };
            let Ok(e) = u8::try_from(e) else {
                return Place::Varying;
            };
            if l_out == l_in && k_out == k_in {
                return Place::Rows(e, id);
            }
            if family != "view" || l_in == 0 || l_out == 0 {
                return Place::Varying;
            }
            match (k_in, k_out) {
                (1, 1) => {}
                // Outer dims merged onto the rows (`[b, s] -> [b * s]`), none inside them:
                // every block is the parent's rows. Where the factor reading placed the
                // blocks, another mesh dim may shard them (the rank holding fewer than k):
                // the row set is the same.
                (1, k) if l_out == k * l_in || (by_factors && l_out == l_in) => {
                    return table
                        .intern(RowKey::Blocks {
                            parent: id,
                            blocks: k,
                        })
                        .map_or(Place::Varying, |id2| Place::Rows(e, id2));
                }
                // The blocks split off again (`[b * s] -> [b, s]`): the parent's rows (as
                // above where other mesh dims shard the blocks).
                (k, 1) if l_in == k * l_out || (by_factors && l_in == l_out) => {
                    return parent_of_blocks
                        .map_or(Place::Varying, |parent| Place::Rows(e, parent));
                }
                _ => return Place::Varying,
            }
            if l_out % l_in == 0 {
                let key = RowKey::Merge {
                    parent: id,
                    factor: l_out / l_in,
                };
                return table
                    .intern(key)
                    .map_or(Place::Varying, |id2| Place::Rows(e, id2));
            }
            match table.key(id) {
                Some(RowKey::Merge { parent, factor }) if l_out * factor == l_in => {
                    Place::Rows(e, parent)
                }
                _ => Place::Varying,
            }
        }
        // A sum or mean over spread rows is the tensor's only where the coordinates' segments
        // hold every row of it once.
        // Rows gathered over another mesh dim: kept as the selection's sum only where the
        // engine's check across mesh dims finds that mesh dim's result no sum
        // (`gathered_over`).
        Place::Partial(_) if gathered_over(table, id).is_some() => p,
        Place::Partial(_) if spread_covers(table, id) == Some(false) => Place::Varying,
        Place::Partial(_) | Place::Varying | Place::Unknown => p,
        _ => Place::Varying,
    }
}

/// The key of rows picked at per-coordinate segments `segs` of a dim of `base` rows (`None`:
/// positions made by `arange`) of the tensor `src` ([`RowKey::Spread`]), adjacent segments
/// merged; `None` where fewer than two coordinates hold rows, a segment is empty or past
/// `base`, or the coordinates hold different numbers of rows (no shard of any tensor then).
pub(crate) fn spread(
    base: Option<usize>,
    segs: Vec<Vec<(usize, usize)>>,
    src: Option<String>,
) -> Option<RowKey> {
    if segs.len() < 2 {
        return None;
    }
    let mut norm = Vec::with_capacity(segs.len());
    let mut count = None;
    for s in segs {
        let mut out: Vec<(usize, usize)> = Vec::with_capacity(s.len());
        let mut n = 0;
        for (a, b) in s {
            if b <= a || base.is_some_and(|base| b > base) {
                return None;
            }
            n += b - a;
            match out.last_mut() {
                Some(last) if last.1 == a => last.1 = b,
                _ => out.push((a, b)),
            }
        }
        if count.is_some_and(|c| c != n) {
            return None;
        }
        count = Some(n);
        norm.push(out);
    }
    Some(RowKey::Spread {
        base,
        segs: norm,
        src,
    })
}

/// Whether spread rows are a plain shard: coordinate `k` holds the rows `k*L..(k+1)*L` of a
/// dim of `n*L` (positions: of `arange(0, n*L)`), the layout `Shard(d)` names.
pub(crate) fn spread_is_shard(key: &RowKey) -> bool {
    let RowKey::Spread { base, segs, .. } = key else {
        return false;
    };
    let Some(l) = segs.first().and_then(|s| s.first()).map(|&(a, b)| b - a) else {
        return false;
    };
    base.is_none_or(|b| b == segs.len() * l)
        && segs
            .iter()
            .enumerate()
            .all(|(k, s)| s.as_slice() == [(k * l, (k + 1) * l)])
}

/// `M` where the segments of all coordinates together hold every row of `0..M` exactly once.
fn tiling(segs: &[Vec<(usize, usize)>]) -> Option<usize> {
    let mut all: Vec<(usize, usize)> = segs.iter().flatten().copied().collect();
    all.sort_unstable();
    let mut next = 0;
    for (a, b) in all {
        if a != next {
            return None;
        }
        next = b;
    }
    Some(next)
}

/// The key of spread rows concatenated in the order of `keys` along their dim: each
/// coordinate's segments joined in that order. `None` unless every key is a spread of the
/// same tensor (`src`; or all positions) over the same base and as many coordinates. The
/// result names no tensor (pieces of one tensor joined are rows of it, as positions joined
/// are rows of `arange(0, M)` where they tile `0..M`: one key for both).
pub(crate) fn cat_spread(keys: &[RowKey]) -> Option<RowKey> {
    let Some(RowKey::Spread {
        base: base0,
        src: src0,
        ..
    }) = keys.first()
    else {
        return None;
    };
    let mut segs: Vec<Vec<(usize, usize)>> = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        let RowKey::Spread { base, segs: s, src } = k else {
            return None;
        };
        if i == 0 {
            segs = vec![Vec::new(); s.len()];
        } else if base != base0 || src != src0 || s.len() != segs.len() {
            return None;
        }
        for (out, s) in segs.iter_mut().zip(s) {
            out.extend_from_slice(s);
        }
    }
    // Positions carry no tensor; pieces of a tensor must name it (a joined key has none).
    if src0.is_none() != base0.is_none() {
        return None;
    }
    let base = base0.or_else(|| tiling(&segs));
    spread(base, segs, None)
}

/// Whether selection `id`, read through merging views, holds every row of the spread it
/// picks exactly once: `Some(true)` for a spread whose segments tile its whole base,
/// `Some(false)` for any other spread or a slice of one, `None` where no spread is involved
/// (a microbatch of a plain shard).
pub(crate) fn spread_covers(table: &RowTable, mut id: u16) -> Option<bool> {
    let mut sliced = false;
    for _ in 0..=u16::MAX {
        match table.key(id)? {
            RowKey::Merge { parent, .. } | RowKey::Blocks { parent, .. } => id = parent,
            RowKey::Slice {
                parent: Some(p), ..
            } => {
                sliced = true;
                id = p;
            }
            RowKey::Slice { parent: None, .. } => return None,
            // One sender's rows, on every rank that received them; rows gathered over another
            // mesh dim (each coordinate's pieces counted once per coordinate of that dim).
            RowKey::Received { .. } | RowKey::Gathered { .. } => return Some(false),
            RowKey::Spread { base, segs, .. } => {
                return Some(!sliced && base.is_some() && base == tiling(&segs));
            }
        }
    }
    None
}

/// A sum over a selection's frame ([`Place::Selected`]) on every coordinate: the output of a
/// framed call whose shadow lane gave `Partial(sum)` for rows `id` (the rule contracted the
/// frame's rows dim, the whole selection on every coordinate, so the output leaves the
/// frame), where its frame lane gave `ordinary`. It is that placement of the selection's sum
/// where `ordinary` is a shard or replicated and each of the selection's rows counts once (a
/// microbatch of a shard: no spread, received or gathered rows, [`spread_covers`]); `None`
/// otherwise (a sum of the frame's sums, or rows that count more than once).
pub(crate) fn frame_summed(
    ordinary: Place,
    rows: Place,
    id: u16,
    table: &RowTable,
) -> Option<Place> {
    (rows == Place::Partial(crate::place::Red::Sum)
        && matches!(ordinary, Place::Replicate | Place::Shard(_))
        && (spread_covers(table, id).is_none() || gathered_over(table, id).is_some()))
    .then_some(ordinary)
}

/// The mesh dim that selection `id`, read through merging views, was gathered over
/// ([`RowKey::Gathered`]) where the selection gathered is no spread or received rows
/// (`spread_covers` gives `None` for it): a sum over such rows on one mesh dim holds every
/// row of the selection once per coordinate of the mesh dim gathered over, so it is the
/// selection's sum only where that mesh dim's result is no sum of its own (the engine checks
/// it once every mesh dim is placed). `None` for any other selection.
pub(crate) fn gathered_over(table: &RowTable, mut id: u16) -> Option<u8> {
    for _ in 0..=u16::MAX {
        match table.key(id)? {
            RowKey::Merge { parent, .. } | RowKey::Blocks { parent, .. } => id = parent,
            RowKey::Gathered { parent, over, .. } => {
                return spread_covers(table, parent).is_none().then_some(over);
            }
            _ => return None,
        }
    }
    None
}

/// How many nodes [`mean_rows`] visits at most before giving up (a mean's rows are a few
/// operators below it).
const MEAN_ROWS_VISITS: usize = 4096;

/// The rows a microbatch mean `m` averages (the value, its rows dim and selection): the first
/// value holding `Rows` among its inputs,
/// breadth first through the expression (a mean's own input; the mean under a scaling by the
/// spec's number, or each term of a sum of means, as DeepSeek's per-layer auxiliary losses of
/// one microbatch are, a level or two further down). Which selection this names is only where
/// [`microbatch_average`] starts: it then requires every selection the whole expression reads
/// to be that one, so a term reading another microbatch's rows is still not proven.
fn mean_rows(
    g: &shardproof_ir::Graph,
    m: ValueId,
    place: &dyn Fn(ValueId) -> Place,
) -> Option<(ValueId, u8, u16)> {
    let mut seen = std::collections::HashSet::new();
    let mut queue: std::collections::VecDeque<usize> = std::collections::VecDeque::from([m.node]);
    while let Some(j) = queue.pop_front() {
        if seen.len() >= MEAN_ROWS_VISITS {
            return None;
        }
        for u in g.nodes[j].inputs() {
            if let Place::Rows(d, id) = place(u) {
                return Some((u, d, id));
            }
            if seen.insert(u.node) {
                queue.push_back(u.node);
            }
        }
    }
    None
}

/// How a rank's rows and messages pair, for [`microbatch_average`] and [`microbatch_sum`]:
/// the selections' row keys, and whether two recvs (node indices) take one expression of one
/// tensor up to the rows they select (a row key names no tensor).
pub(crate) struct RowPairing<'a> {
    /// The selections' row keys.
    pub table: &'a RowTable,
    /// Whether two recvs' messages are alike but for their rows.
    pub received: &'a dyn Fn(usize, usize) -> bool,
}

/// Whether node `i` of `g` (an `add`, not yet placed, of partial pieces whose factor is not known on a mesh
/// dim: `scale_unknown`) is the average of K microbatch means (gradient accumulation:
/// `M_0 / K + .. + M_(K-1) / K`, through nested adds), so that its pieces are the means over
/// the rank's whole shard, as a program without microbatches computes them (issue 44).
/// Returns `Some(0)` where every `M_k`'s factor is known, `Some(k + 1)` where every `M_k` is
/// the same pending share of mesh dim `k` (`share_of`: its factor is unknown only by a
/// division by `k`'s size, which a sum over `k` makes up for): the average is that share of
/// the average, and `None` where it is not proven. With it, each term and its mean (the
/// divisions read as the 1/K).
///
/// Proven only where: every term is `div(M_k, K)` (or `mul(M_k, 1/K)`) with one K, there are
/// exactly K terms, each `M_k` is `Partial(avg)` on the mesh dim (`place`) with a known factor
/// (`scale_unknown` false), or every `M_k` with the same pending share (`share_of`, nonzero,
/// one for all), and computed from rows of a selection (its first input holding
/// `Rows` is the mean's rows); the K selections, read through merging views (one chain of
/// factors for all), are slices of the rank's plain shard (no parent) of one local size,
/// step 1, each a K-th of it, at distinct starts (together: the whole shard, each row once);
/// and every `M_k` is the same expression as `M_0` where every slice or recv holding rows of
/// selection 0 pairs with one of the same operator (a slice of the same input along the same
/// dim) holding selection k's rows, all else equal, literals included. A wrong K, a term
/// missing or repeated, microbatches of unequal or overlapping rows, a term with another
/// share or none, or a term that reads another microbatch's rows anywhere is not proven.
pub(crate) fn microbatch_average(
    g: &shardproof_ir::Graph,
    i: usize,
    place: &dyn Fn(ValueId) -> Place,
    scale_unknown: &dyn Fn(ValueId) -> bool,
    share_of: &dyn Fn(ValueId) -> u8,
    part_rows: &dyn Fn(ValueId) -> bool,
    pairing: &RowPairing,
) -> Option<MicrobatchAverage> {
    use shardproof_ir::NodeKind;
    let call = |j: usize| match &g.nodes[j].kind {
        NodeKind::Call { op, args, kwargs } => Some((op, args, kwargs)),
        _ => None,
    };
    let terms = accumulated_terms(g, i, place, scale_unknown);
    // Each term `M / K`: (M, K).
    let mut parts = Vec::new();
    for &t in &terms {
        let (op, args, kwargs) = call(t.node)?;
        let x = match args.get(1) {
            Some(Arg::Float(x)) => *x,
            Some(Arg::Int(x)) => *x as f64,
            _ => return None,
        };
        let k = match op.name.as_str() {
            "div" => x,
            "mul" if x != 0.0 => 1.0 / x,
            _ => return None,
        };
        let &m = g.nodes[t.node].inputs().first()?;
        if t.output != 0 || args.len() != 2 || !kwargs.is_empty() || m.node == t.node {
            return None;
        }
        parts.push((m, k));
    }
    let count = parts.len();
    if count < 2 || parts.iter().any(|&(_, k)| (k - count as f64).abs() > 1e-9) {
        return None;
    }
    // The pending share every term's mean holds (0: none, every factor known).
    let share = parts.first().map_or(0, |&(m, _)| share_of(m));
    for &(m, _) in &parts {
        // A mean over its microbatch is unknown for that alone (`part_rows`): the K of them
        // averaged are the whole shard's, which is what is proven here.
        let known = (!scale_unknown(m) || part_rows(m)) && share == 0 && share_of(m) == 0;
        let shared = scale_unknown(m) && share != 0 && share_of(m) == share;
        if place(m) != Place::Partial(crate::place::Red::Avg) || !(known || shared) {
            return None;
        }
    }
    let means: Vec<ValueId> = parts.iter().map(|&(m, _)| m).collect();
    microbatches_tile(g, &means, place, &|_, _| false, pairing).then(|| MicrobatchAverage {
        share,
        terms: terms
            .into_iter()
            .zip(parts.iter().map(|&(m, _)| m))
            .collect(),
    })
}

/// The terms of the `add` at node `i` of `g`, through nested adds (`add(x, y)`, no alpha) of
/// partial pieces whose factor is not known (`scale_unknown`): the K terms of a gradient
/// accumulation, in no particular order.
fn accumulated_terms(
    g: &shardproof_ir::Graph,
    i: usize,
    place: &dyn Fn(ValueId) -> Place,
    scale_unknown: &dyn Fn(ValueId) -> bool,
) -> Vec<ValueId> {
    use shardproof_ir::NodeKind;
    let mut terms = Vec::new();
    let mut stack = vec![ValueId::new(i, 0)];
    while let Some(v) = stack.pop() {
        let nested = v.node == i || scale_unknown(v);
        match &g.nodes[v.node].kind {
            NodeKind::Call { op, args, kwargs }
                if nested
                    && v.output == 0
                    && op.name == "add"
                    && args.len() == 2
                    && kwargs.is_empty()
                    && (v.node == i || place(v).is_partial()) =>
            {
                stack.extend(g.nodes[v.node].inputs());
            }
            _ => terms.push(v),
        }
    }
    terms
}

/// Whether selection `id`, read through merging views and slices of selections, is part of
/// each rank's rows: its root is a slice of the rank's plain shard (`RowKey::Slice` with no
/// parent; a slice that takes the whole dim keeps the shard, so every such key is a strict
/// part). A sum over such rows is the sum of the selected rows only (one microbatch's), never
/// the tensor's: the engine records it (`RankPlacements::part_rows`) so that no reduction of
/// it is proven, unless K of them added are the whole shard's ([`microbatch_sum`]). Spread,
/// received and gathered rows have their own coverage checks (`spread_covers`,
/// `gathered_over`): `false` for them.
pub(crate) fn part_of_rows(table: &RowTable, mut id: u16) -> bool {
    for _ in 0..=u16::MAX {
        match table.key(id) {
            Some(RowKey::Merge { parent, .. })
            | Some(RowKey::Blocks { parent, .. })
            | Some(RowKey::Slice {
                parent: Some(parent),
                ..
            }) => id = parent,
            Some(RowKey::Slice { parent: None, .. }) => return true,
            _ => return false,
        }
    }
    false
}

/// Whether node `i` of `g` (an `add`, not yet placed, whose pieces sum on a mesh dim) is the
/// sum of K microbatch sums (gradient accumulation of a sum: `S_0 + .. + S_(K-1)`, through
/// nested adds), so that its pieces are the sums over the rank's whole shard, as a program
/// without microbatches computes them (issue 44). Proven only where there are at least two
/// terms, each `Partial(sum)` on the mesh dim (`place`) whose factor is unknown only because
/// it sums part of each rank's rows (`part_rows`: [`part_of_rows`], carried by copies and
/// views alone), and the terms are one expression over the K microbatches of the rank's
/// shard, each once ([`microbatches_tile`]); a term's rows may be one chunk of its
/// microbatch (a slice of it: the combine of an expert-parallel frame over mesh dims inside
/// the frame's) only where `chunked` says another mesh dim holds them as its shard of their
/// dim (whose pieces then hold every chunk), the same chunk in every term. A microbatch missing or counted twice, a term
/// scaled by a factor the spec lacks, or a term reading another microbatch's rows is not
/// proven.
pub(crate) fn microbatch_sum(
    g: &shardproof_ir::Graph,
    i: usize,
    place: &dyn Fn(ValueId) -> Place,
    scale_unknown: &dyn Fn(ValueId) -> bool,
    part_rows: &dyn Fn(ValueId) -> bool,
    chunked: &dyn Fn(ValueId, u8) -> bool,
    pairing: &RowPairing,
) -> bool {
    let terms = accumulated_terms(g, i, place, scale_unknown);
    terms.len() >= 2
        && terms.iter().all(|&t| {
            place(t) == Place::Partial(crate::place::Red::Sum) && scale_unknown(t) && part_rows(t)
        })
        && microbatches_tile(g, &terms, place, chunked, pairing)
}

/// Whether `values` (K of them, at least 2) are one expression over the K microbatches of the
/// rank's shard, each once: each value's rows (its first input holding `Rows`, [`mean_rows`]),
/// read through merging views (one chain of factors for all), are a step-1 slice of the rank's
/// plain shard (no parent) of one local size, each a K-th of it, at distinct starts (together:
/// the whole shard, each row once); and every value is the same expression as the first where
/// every slice or recv holding rows of the first's selection pairs with one of the same
/// operator (a slice of the same input along the same dim) holding the other's rows, all else
/// equal, literals included; a pair of recvs only where `received` says their messages are
/// one expression of one tensor up to the rows they select. Shared by [`microbatch_average`]
/// and [`microbatch_sum`].
fn microbatches_tile(
    g: &shardproof_ir::Graph,
    values: &[ValueId],
    place: &dyn Fn(ValueId) -> Place,
    chunked: &dyn Fn(ValueId, u8) -> bool,
    pairing: &RowPairing,
) -> bool {
    use shardproof_ir::NodeKind;
    let (table, received) = (pairing.table, pairing.received);
    let call = |j: usize| match &g.nodes[j].kind {
        NodeKind::Call { op, args, kwargs } => Some((op, args, kwargs)),
        _ => None,
    };
    let count = values.len();
    if count < 2 {
        return false;
    }
    // Each mean's rows: the selection, resolved through merging views to its slice; through
    // slices of a selection too where `chunks` (the rows' value is, on another mesh dim, a
    // shard of their dim: that mesh dim's pieces hold every chunk of the selection). The
    // chain records each step (a merge's factor, a chunk's bounds) so that every term's must
    // be the same.
    let root = |mut id: u16, chunks: bool| {
        let mut chain: Vec<[usize; 5]> = Vec::new();
        loop {
            match table.key(id)? {
                RowKey::Merge { parent, factor } => {
                    chain.push([0, factor, 0, 0, 0]);
                    id = parent;
                }
                RowKey::Slice {
                    parent: None,
                    size,
                    start,
                    end,
                    step: 1,
                } => return Some((id, chain, size, start, end)),
                RowKey::Slice {
                    parent: Some(parent),
                    size,
                    start,
                    end,
                    step,
                } if chunks => {
                    chain.push([1, size, start, end, step]);
                    id = parent;
                }
                RowKey::Slice { .. }
                | RowKey::Spread { .. }
                | RowKey::Blocks { .. }
                | RowKey::Received { .. }
                | RowKey::Gathered { .. } => return None,
            }
        }
    };
    let mut roots = Vec::new();
    for &m in values {
        let Some(r) = mean_rows(g, m, place).and_then(|(u, d, id)| root(id, chunked(u, d))) else {
            return false;
        };
        roots.push(r);
    }
    let (_, chain0, size, _, _) = roots[0].clone();
    if size % count != 0 {
        return false;
    }
    let piece = size / count;
    let mut starts: Vec<usize> = Vec::new();
    for (_, chain, s, start, end) in &roots {
        if *chain != chain0 || *s != size || end - start != piece || start % piece != 0 {
            return false;
        }
        starts.push(*start);
    }
    starts.sort_unstable();
    starts.dedup();
    if starts.len() != count {
        return false;
    }
    // The selection's root of a value, where it holds rows.
    let rows_root = |v: ValueId| match place(v) {
        Place::Rows(d, id) => root(id, chunked(v, d)).map(|r| r.0),
        _ => None,
    };
    let (m0, id0) = (values[0], roots[0].0);
    values.iter().zip(&roots).skip(1).all(|(&mk, rk)| {
        let idk = rk.0;
        let leaf = |x: usize, y: usize| {
            let (vx, vy) = (ValueId::new(x, 0), ValueId::new(y, 0));
            let (Some((ox, ax, _)), Some((oy, ay, _))) = (call(x), call(y)) else {
                return None;
            };
            // A slice that selects rows (of a tensor holding none; a slice of rows along
            // another dim keeps them and is compared as any call) or a received message.
            let selects = |o: &shardproof_ir::OpName, z: usize| match o.name.as_str() {
                "recv" => true,
                "slice" => g.nodes[z]
                    .inputs()
                    .first()
                    .is_some_and(|&u| !matches!(place(u), Place::Rows(..))),
                _ => false,
            };
            let selection = selects(ox, x) || selects(oy, y);
            match rows_root(vx) {
                Some(a) if selection => Some(
                    a == id0
                        && ox == oy
                        && selects(oy, y)
                        && rows_root(vy) == Some(idk)
                        // Two messages alike in their rows may still be of two tensors
                        // (rows 0..4 of `a`, 4..8 of `b`): the senders' values must be one.
                        && (ox.name != "recv" || received(x, y))
                        && (ox.name != "slice"
                            || (g.nodes[x].inputs() == g.nodes[y].inputs()
                                && ax.first() == ay.first()
                                && ax.get(1) == ay.get(1))),
                ),
                _ if selection && rows_root(vy).is_some() => Some(false),
                _ => None,
            }
        };
        let mut memo = crate::engine::ExprMemo::default();
        m0.output == mk.output
            && crate::engine::same_expression_upto(
                g,
                None,
                m0.node,
                g,
                None,
                mk.node,
                &mut memo,
                &leaf,
                &|_, _| false,
            )
    })
}

/// A proven microbatch average ([`microbatch_average`]).
pub(crate) struct MicrobatchAverage {
    /// The pending share every microbatch's mean holds (`share_of`: k + 1; 0: none).
    pub share: u8,
    /// Each term `M_k / K` and its mean `M_k`.
    pub terms: Vec<(ValueId, ValueId)>,
}
