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
//! (the same `id`): a replicated operand along `d` (the whole tensor's rows) or a plain shard
//! would meet other rows than the ones the selection names. Anything that reads the order
//! (a gather, a declared shard) sees `Varying`.

use crate::place::{Place, RowKey, RowTable};
use shardproof_ir::{Arg, ValueId};
use shardproof_ops::{Args, Meta};

/// How a call takes its `Rows` inputs on one mesh dim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RowsMode {
    /// No input holds rows.
    None,
    /// The rule reads rows itself (slices).
    Own,
    /// The rule sees every `Rows(d, id)` input as `Shard(d)`; `(v, d)` is the first of them.
    AsShard {
        /// The selection.
        id: u16,
        /// The first input with rows.
        v: ValueId,
        /// Its rows dim.
        d: u8,
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
/// there, `meta`: their local metas).
pub(crate) fn rows_mode(
    family: &str,
    bound: &Args,
    place: impl Fn(ValueId) -> Place,
    meta: impl Fn(ValueId) -> Option<Meta>,
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
    let fits = if replicated.is_empty() {
        broadcasting(family)
            || all_rows(family)
            || matches!(family, "matmul" | "matmul-bias" | "linear" | "embedding")
            || (family == "gather" && gather_fits())
    } else if broadcasting(family) {
        // Right-aligned broadcasting: a replicated operand's dim facing a rows dim must be
        // absent or of size 1.
        replicated.iter().all(|&(_, rv)| {
            let Some(rm) = meta(rv) else { return false };
            rows.iter().all(|&(_, v, d, _)| {
                let Some(r) = rank(v) else { return false };
                let j = d as i64 + rm.shape.len() as i64 - r as i64;
                j < 0 || rm.shape.get(j as usize).is_some_and(|&s| s == 1)
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
            Some(n) != left && (r <= 1 || (r == 2 && !matches!(n, "self" | "bias")))
        })
    } else if family == "embedding" {
        // The rows are the indices'; the table is replicated.
        rows.iter().all(|r| r.0 == "indices") && replicated.iter().all(|r| r.0 == "weight")
    } else {
        false
    };
    if fits {
        RowsMode::AsShard { id, v: v0, d: d0 }
    } else {
        RowsMode::Varying
    }
}

/// The placement a rule's output takes where it ran on rows seen as a shard: a shard of a
/// dim that keeps the rows' local size is the same selection (a view that merged the dims
/// inside the rows, or split them off again, names the selection it makes); a pending sum
/// stays (a sum over the rows is one over the selection, in any order); anything else that
/// differs across coordinates is `Varying`, and a replicated result is too (a gather of the
/// rows holds them in an order not proven).
pub(crate) fn rows_output(
    p: Place,
    family: &str,
    in_size: Option<usize>,
    out_shape: Option<&[usize]>,
    id: u16,
    table: &mut RowTable,
) -> Place {
    match p {
        Place::Shard(e) => {
            let (Some(l_in), Some(l_out)) = (in_size, out_shape.and_then(|s| s.get(e as usize)))
            else {
                return Place::Varying;
            };
            let l_out = *l_out;
            if l_out == l_in {
                return Place::Rows(e, id);
            }
            if family != "view" || l_in == 0 || l_out == 0 {
                return Place::Varying;
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
        Place::Partial(_) | Place::Varying | Place::Unknown => p,
        _ => Place::Varying,
    }
}
