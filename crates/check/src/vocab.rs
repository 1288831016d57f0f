//! The vocabulary range of a vocab-parallel lookup: where a lookup in a vocabulary shard
//! (`Unmasked`) is zeroed outside the rank's range (`masked_fill(x, mask, 0)`), the masked
//! rows are a `Partial(sum)` only if the mask is the rank's range and the lookup read the
//! rank's rows of it. Checked on the graph, on each rank with its own coordinate.
//!
//! The form proven (Megatron's `VocabParallelEmbedding` and vocab-parallel cross entropy):
//! with `I` a replicated tensor of ids, `L` the local size of the table's sharded dim and `r`
//! the rank's coordinate, `B = bitwise_or(lt(I, r*L), ge(I, (r+1)*L))` (either order, or
//! `logical_or`), the lookup's index is `S(masked_fill(sub(I, r*L), B, _))` and the mask is
//! `S(B)` (for `embedding`, `S(B)` unsqueezed at the end), where `S` is the same chain of
//! shape operators (unsqueeze, view, reshape, expand, clone, contiguous) with the same
//! arguments on both sides. Then every element of the lookup whose id lies in the rank's
//! range reads row `id - r*L` of the rank's shard, which is row `id` of the table, and every
//! other element is zeroed by a mask element at the same position: summed over the ranks,
//! each element is its id's row once.

use shardproof_ir::{Arg, Graph, NodeKind, OpName, ValueId};
use shardproof_ops::Meta;

/// The call that makes `v`: operator, positional arguments, and whether it has keywords.
fn call(g: &Graph, v: ValueId) -> Option<(&OpName, &[Arg], bool)> {
    match &g.nodes.get(v.node)?.kind {
        NodeKind::Call { op, args, kwargs } if v.output == 0 => {
            Some((op, args.as_slice(), !kwargs.is_empty()))
        }
        _ => None,
    }
}

fn aten(op: &OpName) -> Option<&str> {
    (op.namespace == "aten").then_some(op.name.as_str())
}

/// Operators that only reshape, broadcast or copy their first argument, element for element.
fn shape_op(name: &str) -> bool {
    matches!(
        name,
        "unsqueeze" | "view" | "reshape" | "_unsafe_view" | "expand" | "clone" | "contiguous"
    )
}

/// Operators between a lookup and its mask that act on each element alone.
fn elementwise_copy(name: &str) -> bool {
    matches!(
        name,
        "clone" | "contiguous" | "_to_copy" | "to" | "alias" | "detach" | "lift_fresh_copy"
    )
}

/// `(I, lo, hi)` where `b` is `lt(I, lo) | ge(I, hi)`.
fn range_mask(g: &Graph, b: ValueId) -> Option<(ValueId, i64, i64)> {
    let (op, args, kw) = call(g, b)?;
    if kw || !matches!(aten(op)?, "bitwise_or" | "logical_or") || args.len() != 2 {
        return None;
    }
    let cmp = |a: &Arg| -> Option<(&str, ValueId, i64)> {
        let (op, args, kw) = call(g, a.as_value()?)?;
        let name = aten(op)?;
        if kw || args.len() != 2 || !matches!(name, "lt" | "ge") {
            return None;
        }
        Some((name, args[0].as_value()?, args[1].as_int()?))
    };
    let (x, y) = (cmp(&args[0])?, cmp(&args[1])?);
    let ((_, i, lo), (_, j, hi)) = match (x.0, y.0) {
        ("lt", "ge") => (x, y),
        ("ge", "lt") => (y, x),
        _ => return None,
    };
    (i == j).then_some((i, lo, hi))
}

/// Whether the rows of the lookup behind `x` that `mask` leaves are exactly the rank's range
/// (see the module documentation); `coord` gives the rank's coordinate along the mesh dim (read
/// only where the proof needs it: the engine records the read), and
/// `replicated` tells whether a value is `Replicate()` there. `Err` says what is not proven.
///
/// `indexes` says how the mask meets the lookup: `false` for `masked_fill` (an embedding's
/// mask broadcast over the rows, unsqueezed at the end), `true` for `index_put(x, [mask], _)`
/// (Megatron's `output_parallel[input_mask, :] = 0.0`: the mask picks an embedding's rows by
/// the leading dims, so it has the index's shape, not unsqueezed).
#[allow(clippy::too_many_arguments)]
pub(crate) fn range_proven(
    g: &Graph,
    x: ValueId,
    mask: ValueId,
    indexes: bool,
    coord: &dyn Fn() -> usize,
    replicated: impl Fn(ValueId) -> bool,
    shard_dim: impl Fn(ValueId) -> Option<usize>,
    meta: impl Fn(ValueId) -> Option<Meta>,
) -> Result<(), &'static str> {
    const NO_LOOKUP: &str = "the masked rows do not come from an embedding or gather in a \
                             vocabulary shard";
    const NO_RANGE: &str = "the mask is not proven to be the rank's vocabulary range \
                            (`lt(ids, r*L) | ge(ids, (r+1)*L)`, the index `ids - r*L` masked \
                            by it, both reshaped alike)";
    if let Some(proven) = pick_proven(g, x, mask, coord, &replicated, &shard_dim, &meta) {
        return if proven { Ok(()) } else { Err(NO_RANGE) };
    }
    // Back from the masked value to the lookup, through element-wise copies.
    let mut v = x;
    let (lookup, args) = loop {
        let (op, args, _) = call(g, v).ok_or(NO_LOOKUP)?;
        let name = aten(op).ok_or(NO_LOOKUP)?;
        if matches!(name, "embedding" | "gather") || rows_of_table(name, args).is_some() {
            break (name, args);
        }
        let input = args.first().and_then(Arg::as_value).and_then(&meta);
        if !elementwise_copy(name) && !full_slice(name, args, input) {
            return Err(NO_LOOKUP);
        }
        v = args.first().and_then(Arg::as_value).ok_or(NO_LOOKUP)?;
    };
    // The table's sharded dim (its local size) and the index. `table[idx]` (`index` with one
    // index) is an embedding.
    let (lookup, table, dim, index) = match lookup {
        "embedding" => ("embedding", args.first(), Some(0), args.get(1)),
        "index" => (
            "embedding",
            args.first(),
            Some(0),
            rows_of_table(lookup, args),
        ),
        _ => (
            lookup,
            args.first(),
            args.get(1).and_then(Arg::as_int),
            args.get(2),
        ),
    };
    let (Some(table), Some(dim), Some(index)) = (
        table.and_then(Arg::as_value),
        dim,
        index.and_then(Arg::as_value),
    ) else {
        return Err(NO_LOOKUP);
    };
    let tmeta = meta(table).ok_or(NO_LOOKUP)?;
    let rank = tmeta.shape.len() as i64;
    let dim = if dim < 0 { dim + rank } else { dim };
    let local = *usize::try_from(dim)
        .ok()
        .and_then(|d| tmeta.shape.get(d))
        .ok_or(NO_LOOKUP)? as i64;
    // The mask: for an embedding, one more trailing dim (unsqueezed) than the index.
    let mut m = mask;
    if lookup == "embedding" && !indexes {
        let (op, args, kw) = call(g, m).ok_or(NO_RANGE)?;
        let mrank = meta(m).map_or(0, |mm| mm.shape.len() as i64);
        let last = args.get(1).and_then(Arg::as_int);
        if kw || aten(op) != Some("unsqueeze") || !(last == Some(-1) || last == Some(mrank - 1)) {
            return Err(NO_RANGE);
        }
        m = args[0].as_value().ok_or(NO_RANGE)?;
    }
    let (ids, lo, hi) = index_and_mask(g, index, m).ok_or(NO_RANGE)?;
    let r = coord() as i64;
    if !replicated(ids) || lo != r * local || hi != (r + 1) * local {
        return Err(NO_RANGE);
    }
    Ok(())
}

/// Where `x` is `S(masked_fill(sub(I, lo), B, _))` and `mask` is `S(B)` (the same chain S of
/// shape operators on both), with `B = lt(I, lo) | ge(I, hi)`: `(I, lo, hi)`.
fn index_and_mask(g: &Graph, x: ValueId, mask: ValueId) -> Option<(ValueId, i64, i64)> {
    let (mut i, mut m) = (x, mask);
    loop {
        let (op, args, kw) = call(g, i)?;
        let name = aten(op)?;
        if matches!(name, "masked_fill" | "index_put") {
            break;
        }
        if !shape_op(name) {
            return None;
        }
        let (mop, margs, mkw) = call(g, m)?;
        if kw || mkw || mop != op || margs.len() != args.len() || margs[1..] != args[1..] {
            return None;
        }
        i = args.first().and_then(Arg::as_value)?;
        m = margs.first().and_then(Arg::as_value)?;
    }
    // `masked_fill(s, B, _)`, or `index_put(s, [B], _)` (Megatron's `masked_input[mask] = 0`):
    // the positions of B get some value, the others keep s's.
    let (fop, fill_args, fill_kw) = call(g, i)?;
    let mask_arg = match (aten(fop)?, fill_args.get(1)?) {
        ("masked_fill", a) => a.as_value(),
        ("index_put", Arg::List(items)) if items.len() == 1 => items[0].as_value(),
        _ => None,
    };
    if fill_kw || mask_arg != Some(m) {
        return None;
    }
    let (ids, lo, hi) = range_mask(g, m)?;
    let (sop, sargs, skw) = fill_args
        .first()
        .and_then(Arg::as_value)
        .and_then(|s| call(g, s))?;
    let alpha_one = sargs.get(2).is_none_or(|a| a.as_int() == Some(1));
    // The ids the sub reads, through copies that keep every value (no casts).
    let mut base = sargs.first().and_then(Arg::as_value)?;
    while base != ids {
        let (op, args, kw) = call(g, base)?;
        if kw || !matches!(aten(op)?, "clone" | "contiguous" | "alias" | "detach") {
            return None;
        }
        base = args.first().and_then(Arg::as_value)?;
    }
    (aten(sop) == Some("sub")
        && !skw
        && alpha_one
        && sargs.get(1).and_then(Arg::as_int) == Some(lo))
    .then_some((ids, lo, hi))
}

/// Reshapes that keep the row-major order of the elements.
fn reshape_op(name: &str) -> bool {
    matches!(
        name,
        "view" | "reshape" | "_unsafe_view" | "clone" | "contiguous"
    )
}

/// The pick of one element per row of a 2-d table sharded on its columns (Megatron's
/// `predicted_logits = logits_2d[arange_1d, masked_target_1d]`), masked in the shape of the
/// rank's masked index: `x` is `V(index(T, [arange(0, N), W(M)]))` with V and W reshapes (the
/// row-major order kept), T `[N, L]` and `Shard(1)` (`shard_dim`), M the rank's masked index `S(masked_fill(sub(I, r*L), B,
/// _))` and `mask` `S(B)`, M, `mask` and `x` of one shape. Element p of x (row-major) is row
/// p's column `M[p]` of the rank's piece, column `M[p] + r*L` of the whole table, kept exactly
/// where the id lies in the rank's range: summed over the ranks, each row's element at its id.
/// `None` where x is no such pick (the other forms decide), `Some(false)` where it is one but
/// the range is not proven.
fn pick_proven(
    g: &Graph,
    x: ValueId,
    mask: ValueId,
    coord: &dyn Fn() -> usize,
    replicated: &impl Fn(ValueId) -> bool,
    shard_dim: &impl Fn(ValueId) -> Option<usize>,
    meta: &impl Fn(ValueId) -> Option<Meta>,
) -> Option<bool> {
    let mut v = x;
    let args = loop {
        let (op, args, _) = call(g, v)?;
        let name = aten(op)?;
        if name == "index" {
            break args;
        }
        if !reshape_op(name) && !elementwise_copy(name) {
            return None;
        }
        v = args.first().and_then(Arg::as_value)?;
    };
    let (table, rows, cols) = match args {
        [Arg::Value(t), Arg::List(items)] if items.len() == 2 => {
            (*t, items[0].as_value()?, items[1].as_value()?)
        }
        _ => return None,
    };
    let tshape = meta(table)?.shape;
    let [n, local] = tshape[..] else {
        return Some(false);
    };
    let shape = meta(x)?.shape;
    if !is_arange(g, rows, n as i64)
        || shard_dim(table) != Some(1)
        || meta(mask)?.shape != shape
        || meta(v)?.shape != [n]
    {
        return Some(false);
    }
    // The column index, back through reshapes to the masked index of the mask's shape.
    let mut c = cols;
    while meta(c)?.shape != shape {
        let (op, args, kw) = call(g, c)?;
        if kw || !reshape_op(aten(op)?) {
            return Some(false);
        }
        c = args.first().and_then(Arg::as_value)?;
    }
    let r = coord() as i64;
    let l = local as i64;
    Some(
        index_and_mask(g, c, mask)
            .is_some_and(|(ids, lo, hi)| replicated(ids) && lo == r * l && hi == (r + 1) * l),
    )
}

/// The index of `table[idx]` (`aten.index` with one index, on the table's rows).
fn rows_of_table<'a>(name: &str, args: &'a [Arg]) -> Option<&'a Arg> {
    match (name, args.get(1)?) {
        ("index", Arg::List(items)) if items.len() == 1 && items[0].as_value().is_some() => {
            items.first()
        }
        _ => None,
    }
}

/// Whether `slice(x, d, start, end, step)` keeps all of x (start 0, end past the dim, step 1),
/// `input` x's meta.
fn full_slice(name: &str, args: &[Arg], input: Option<Meta>) -> bool {
    let int = |i: usize, default: i64| args.get(i).map_or(Some(default), Arg::as_int);
    let (Some(d), Some(start), Some(end), Some(step), Some(input)) =
        (int(1, 0), int(2, 0), int(3, i64::MAX), int(4, 1), input)
    else {
        return false;
    };
    let Some(size) = usize::try_from(d).ok().and_then(|d| input.shape.get(d)) else {
        return false;
    };
    name == "slice" && start == 0 && step == 1 && end >= *size as i64
}

/// Whether `v` is `arange(0, len)` (or `arange(len)`) with `len` given.
fn is_arange(g: &Graph, v: ValueId, len: i64) -> bool {
    let Some((op, args, _)) = call(g, v) else {
        return false;
    };
    if aten(op) != Some("arange") {
        return false;
    }
    let ints: Vec<Option<i64>> = args.iter().map(Arg::as_int).collect();
    match op.overload.as_str() {
        "default" => ints.first() == Some(&Some(len)),
        "start" => ints.first() == Some(&Some(0)) && ints.get(1) == Some(&Some(len)),
        "start_step" => {
            ints.first() == Some(&Some(0))
                && ints.get(1) == Some(&Some(len))
                && ints.get(2) == Some(&Some(1))
        }
        _ => false,
    }
}

/// The one-hot of ids over the rank's vocabulary range, in local columns (the target of
/// vocab-parallel cross entropy's backward): `eq(X, arange(0, L)) & ~M`, X the index
/// `S(masked_fill(sub(I, r*L), B, _))` with a trailing dim of size 1, M the mask `S(B)`
/// (the same chain S), B the rank's range `[r*L, (r+1)*L)`, I replicated. Column j of the
/// rank's local result is `I == r*L + j`: the rank's columns of the one-hot of I over `n*L`
/// classes, `Shard(last)`. Returns that dim.
pub(crate) fn one_hot_shard(
    g: &Graph,
    lhs: ValueId,
    rhs: ValueId,
    coord: &dyn Fn() -> usize,
    replicated: impl Fn(ValueId) -> bool,
    meta: impl Fn(ValueId) -> Option<Meta>,
) -> Option<usize> {
    let not_of = |v: ValueId| {
        let (op, args, kw) = call(g, v)?;
        (!kw && matches!(aten(op)?, "bitwise_not" | "logical_not"))
            .then(|| args.first().and_then(Arg::as_value))
            .flatten()
    };
    let (eqv, mask) = match (not_of(lhs), not_of(rhs)) {
        (None, Some(m)) => (lhs, m),
        (Some(m), None) => (rhs, m),
        _ => return None,
    };
    let (op, args, kw) = call(g, eqv)?;
    if kw || aten(op) != Some("eq") || args.len() != 2 {
        return None;
    }
    let (x, ar) = (args[0].as_value()?, args[1].as_value()?);
    let xshape = meta(x)?.shape;
    let out = meta(eqv)?.shape;
    let len = *out.last()? as i64;
    if xshape.last() != Some(&1) || out.len() != xshape.len() || !is_arange(g, ar, len) {
        return None;
    }
    let (ids, lo, hi) = index_and_mask(g, x, mask)?;
    let r = coord() as i64;
    (replicated(ids) && lo == r * len && hi == (r + 1) * len).then(|| out.len() - 1)
}

/// The gradient of a vocab-parallel embedding's shard: `embedding_dense_backward(
/// masked_fill(G, M, 0), X, L, -1, False)` with G replicated, X the index
/// `S(masked_fill(sub(I, r*L), B, _))`, M the mask `S(B)` unsqueezed at the end, B the rank's
/// range `[r*L, (r+1)*L)` and I replicated. Row j of the rank's result sums the gradient rows
/// at the positions whose id is `r*L + j` (a masked position adds its zeroed row to row 0):
/// the rank's rows of the whole table's gradient, `Shard(0)`.
pub(crate) fn embedding_grad_shard(
    g: &Graph,
    node: usize,
    coord: &dyn Fn() -> usize,
    replicated: impl Fn(ValueId) -> bool,
    meta: impl Fn(ValueId) -> Option<Meta>,
) -> bool {
    let Some(NodeKind::Call { op, args, kwargs }) = g.nodes.get(node).map(|n| &n.kind) else {
        return false;
    };
    if aten(op) != Some("embedding_dense_backward") || !kwargs.is_empty() || args.len() != 5 {
        return false;
    }
    let (Some(grad), Some(x), Some(len)) =
        (args[0].as_value(), args[1].as_value(), args[2].as_int())
    else {
        return false;
    };
    if args[3].as_int() != Some(-1) || args[4].as_int() != Some(0) {
        return false;
    }
    let Some((fop, fargs, fkw)) = call(g, grad) else {
        return false;
    };
    let zero = fargs.get(2).and_then(Arg::as_f64) == Some(0.0);
    let (Some(gv), Some(mv)) = (
        fargs.first().and_then(Arg::as_value),
        fargs.get(1).and_then(Arg::as_value),
    ) else {
        return false;
    };
    if fkw || aten(fop) != Some("masked_fill") || !zero || !replicated(gv) {
        return false;
    }
    // The mask: unsqueezed at the end, then the index's chain.
    let Some((uop, uargs, ukw)) = call(g, mv) else {
        return false;
    };
    let mrank = meta(mv).map_or(0, |mm| mm.shape.len() as i64);
    let last = uargs.get(1).and_then(Arg::as_int);
    if ukw || aten(uop) != Some("unsqueeze") || !(last == Some(-1) || last == Some(mrank - 1)) {
        return false;
    }
    let Some(m0) = uargs.first().and_then(Arg::as_value) else {
        return false;
    };
    let r = coord() as i64;
    index_and_mask(g, x, m0)
        .is_some_and(|(ids, lo, hi)| replicated(ids) && lo == r * len && hi == (r + 1) * len)
}

/// `(X, a, t, W, sign)` where node `node` is `index_put(X, [a, t], V)` (not accumulating) and
/// V is `index(X, [a, t]) - W` (sign -1) or `+ W` (sign +1), alpha 1: the write-back of an
/// update of the elements the indices pick (vocab-parallel cross entropy's backward,
/// `grad_2d[arange, masked_target] -= 1 - target_mask`).
fn write_back(g: &Graph, node: usize) -> Option<(ValueId, ValueId, ValueId, ValueId)> {
    let NodeKind::Call { op, args, kwargs } = &g.nodes.get(node)?.kind else {
        return None;
    };
    if aten(op) != Some("index_put") || !kwargs.is_empty() {
        return None;
    }
    if args.get(3).is_some_and(|a| a.as_bool() != Some(false)) {
        return None;
    }
    let x = args.first()?.as_value()?;
    let idx = match args.get(1)? {
        Arg::List(items) if items.len() == 2 => (items[0].as_value()?, items[1].as_value()?),
        _ => return None,
    };
    let (vop, vargs, vkw) = call(g, args.get(2)?.as_value()?)?;
    if vkw
        || !matches!(aten(vop)?, "sub" | "add")
        || vop.overload != "Tensor"
        || vargs.len() != 2 && vargs.get(2).and_then(Arg::as_f64) != Some(1.0)
    {
        return None;
    }
    let (pop, pargs, pkw) = call(g, vargs[0].as_value()?)?;
    if pkw || aten(pop) != Some("index") || pargs.first()?.as_value()? != x {
        return None;
    }
    match pargs.get(1)? {
        Arg::List(items)
            if items.len() == 2
                && items[0].as_value() == Some(idx.0)
                && items[1].as_value() == Some(idx.1) => {}
        _ => return None,
    }
    Some((x, idx.0, idx.1, vargs[1].as_value()?))
}

/// The nodes of `g` that compute an update `index(X, I) ± W` which an `index_put(X, I, ..)`
/// writes back ([`update_shard`] decides, at the `index_put`, whether it keeps X's shard).
pub(crate) fn update_values(g: &Graph) -> std::collections::HashSet<usize> {
    (0..g.nodes.len())
        .filter_map(|i| {
            write_back(g, i)?;
            match &g.nodes[i].kind {
                NodeKind::Call { args, .. } => args.get(2)?.as_value().map(|v| v.node),
                _ => None,
            }
        })
        .collect()
}

/// Whether node `node` is the write-back `index_put(X, [a, t], index(X, [a, t]) ± W)` that
/// keeps X's `Shard(1)` (X 2-d, `L` its local columns): `a` is `arange(0, N)` (every row of X
/// once), `t` the rank's masked index `S(masked_fill(sub(I, r*L), B, _))` and W
/// `rsub(C(S(B)), 1)` = `1 - B` (C element-wise copies and casts, S the same chain of shape
/// operators on both), with `B = lt(I, r*L) | ge(I, (r+1)*L)` and I replicated. A row whose id
/// lies in the rank's range updates column `id - r*L` of the rank's piece, column `id` of X,
/// by `± 1`, as the single-device update does; every other row rewrites the element it read
/// (W is 0 there), so its piece is unchanged, and the single-device program updates that row
/// in another rank's columns. The pieces are the single-device result's: `Shard(1)`.
pub(crate) fn update_shard(
    g: &Graph,
    node: usize,
    coord: &dyn Fn() -> usize,
    replicated: impl Fn(ValueId) -> bool,
    meta: impl Fn(ValueId) -> Option<Meta>,
) -> bool {
    let Some((x, a, t, w)) = write_back(g, node) else {
        return false;
    };
    let Some(xs) = meta(x).map(|m| m.shape) else {
        return false;
    };
    let [rows, local] = xs[..] else {
        return false;
    };
    if !is_arange(g, a, rows as i64) {
        return false;
    }
    // W = rsub(C(M), 1) with C element-wise copies: M is the mask's chain.
    let Some((wop, wargs, wkw)) = call(g, w) else {
        return false;
    };
    let one = wargs.get(1).and_then(Arg::as_f64) == Some(1.0);
    let alpha = wargs.get(2).is_none_or(|a| a.as_f64() == Some(1.0));
    if wkw || aten(wop) != Some("rsub") || !one || !alpha {
        return false;
    }
    let Some(mut m) = wargs.first().and_then(Arg::as_value) else {
        return false;
    };
    while let Some((op, args, kw)) = call(g, m) {
        let Some(name) = aten(op) else { break };
        if kw && name != "_to_copy" || !elementwise_copy(name) {
            break;
        }
        let Some(v) = args.first().and_then(Arg::as_value) else {
            return false;
        };
        m = v;
    }
    let r = coord() as i64;
    let l = local as i64;
    index_and_mask(g, t, m)
        .is_some_and(|(ids, lo, hi)| replicated(ids) && lo == r * l && hi == (r + 1) * l)
}
