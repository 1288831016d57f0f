//! A contraction computed chunk by chunk (issue 44): `mm(t(G[s_0:e_0]), X[s_0:e_0]) + .. +
//! mm(t(G[s_k:e_k]), X[s_k:e_k])`, where the row chunks partition the contracted dim, is
//! `mm(t(G), X)`. Tensor-parallel communication overlap computes a row-parallel weight's
//! gradient so, each rank taking its own chunk first: the chunks' offsets depend on the rank,
//! so each slice is `Varying` to the rules, and so was the sum, where the whole product has a
//! known placement.

use crate::place::Place;
use shardproof_ir::{Arg, Graph, NodeKind, ValueId};

/// The placement on one mesh dim of the sum at node `i` of `g`, where it is a contraction
/// computed by row chunks: every term (through nested two-tensor adds) is `mm(t(slice(G, 0,
/// s, e)), slice(X, 0, s, e))` of one `G` and one `X`, the two slices of a term at the same
/// rows, step 1, and the terms' row ranges partition `[0, rows(G))` with `rows(X) ==
/// rows(G)` (each row contracted once). `G` and `X` must be plain (`plain`: no 1/n or n
/// times record) and placed `Replicate()` or `Shard(1)` on the dim (`place`), not both
/// sharded; the result is then the placement of `mm(t(G), X)`: `Replicate()`, `Shard(1)`
/// (`X` sharded by columns) or `Shard(0)` (`G` sharded by columns). Anything else: `None`
/// (a chunk missing, repeated or overlapping, a term pairing rows of `G` with other rows of
/// `X`, another operator).
pub(crate) fn contraction(
    g: &Graph,
    i: usize,
    place: &dyn Fn(ValueId) -> Place,
    plain: &dyn Fn(ValueId) -> bool,
    rows: &dyn Fn(ValueId) -> Option<i64>,
) -> Option<Place> {
    // ATen calls only (another namespace's `mm` or `slice` is another operator).
    let call = |j: usize| match &g.nodes[j].kind {
        NodeKind::Call { op, args, kwargs } if op.namespace == "aten" => Some((op, args, kwargs)),
        _ => None,
    };
    // The terms, through nested adds of two tensors (no `alpha`).
    let mut terms = Vec::new();
    let mut stack = vec![ValueId::new(i, 0)];
    while let Some(v) = stack.pop() {
        match call(v.node) {
            Some((op, args, kwargs))
                if v.output == 0
                    && op.name == "add"
                    && args.len() == 2
                    && kwargs.is_empty()
                    && g.nodes[v.node].inputs().len() == 2 =>
            {
                stack.extend(g.nodes[v.node].inputs());
            }
            _ => terms.push(v),
        }
    }
    if terms.len() < 2 {
        return None;
    }
    // `slice(T, 0, s, e)` (step 1): (T, s, e).
    let slice = |v: ValueId| -> Option<(ValueId, i64, i64)> {
        let (op, args, kwargs) = call(v.node)?;
        if v.output != 0 || op.name != "slice" || !kwargs.is_empty() {
            return None;
        }
        let int = |k: usize| match args.get(k) {
            Some(Arg::Int(x)) => Some(*x),
            _ => None,
        };
        let step = if args.len() == 5 { int(4)? } else { 1 };
        if args.len() < 4 || args.len() > 5 || int(1)? != 0 || step != 1 {
            return None;
        }
        let src = *g.nodes[v.node].inputs().first()?;
        Some((src, int(2)?, int(3)?))
    };
    let mut operands = None;
    let mut ranges = Vec::new();
    for &t in &terms {
        let (op, args, kwargs) = call(t.node)?;
        let ins = g.nodes[t.node].inputs();
        if t.output != 0 || op.name != "mm" || args.len() != 2 || !kwargs.is_empty() {
            return None;
        }
        let (&a, &b) = (ins.first()?, ins.get(1)?);
        let (top, _, tkw) = call(a.node)?;
        if a.output != 0 || top.name != "t" || !tkw.is_empty() {
            return None;
        }
        let (gsrc, gs, ge) = slice(*g.nodes[a.node].inputs().first()?)?;
        let (xsrc, xs, xe) = slice(b)?;
        if (gs, ge) != (xs, xe) || *operands.get_or_insert((gsrc, xsrc)) != (gsrc, xsrc) {
            return None;
        }
        ranges.push((gs, ge));
    }
    let (gv, xv) = operands?;
    let n = rows(gv)?;
    if rows(xv)? != n || !plain(gv) || !plain(xv) {
        return None;
    }
    // The row ranges, in order, must tile [0, n): each row once.
    ranges.sort_unstable();
    let mut at = 0;
    for (s, e) in ranges {
        if s != at || e <= s {
            return None;
        }
        at = e;
    }
    if at != n {
        return None;
    }
    match (place(gv), place(xv)) {
        (Place::Replicate, Place::Replicate) => Some(Place::Replicate),
        (Place::Replicate, Place::Shard(1)) => Some(Place::Shard(1)),
        (Place::Shard(1), Place::Replicate) => Some(Place::Shard(0)),
        _ => None,
    }
}
