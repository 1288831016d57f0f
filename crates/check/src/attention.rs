//! Ring attention's accumulation (issue 44): the causal attention of a rank's queries over the
//! whole sequence, computed block by block as keys and values go around the context-parallel
//! ring and merged by the log-sum-exp rule.
//!
//! The per-block scores pair the rank's query rows with another rank's key rows, two
//! row-selected dims that no placement expresses, so the rules see every block as `Varying`.
//! This form reads the whole accumulation at its last node instead and proves, on concrete
//! global positions, that every query row attends to every causally visible key exactly once:
//! then the output holds the rank's query rows of the full attention (`Rows(1, Q)`).
//!
//! What is read, per rank (nothing is assumed of the other ranks; a received block's key
//! positions are those its sender held, [`RowKey::Received`]):
//! - a block `bmm(exp(sub(S, L)), V)` with `L = logsumexp(S, [-1], True)` and `S = mul(bmm(Q,
//!   KT), scale)`, plus an additive mask; `Q` is the queries `q3` or a slice of them along the
//!   rows, `KT` holds key rows on dim 2 and `V` the same key rows on dim 1, all rows of one
//!   spread selection; one `q3` and one scale for all blocks;
//! - a mask must be `masked_fill(full(0), gt(unsqueeze(Pk, 0), unsqueeze(Pq, 1)), -inf)` with
//!   `Pq` and `Pk` concatenated `arange`s equal to the block's query and key positions (the
//!   global causal mask); a block without one must have every key at or before every query;
//! - the merge `out' = out * exp(l - m) / t + o * exp(l2 - m) / t`, `t = exp(l - m) + exp(l2 -
//!   m)`, `m = maximum(l, l2)`, `l' = m + log(t)`, each output paired with its own
//!   log-sum-exp; slices and concatenations of both along the rows.
//!
//! Every query row must then see each key at or before its position exactly once over its
//! blocks, at least one in every block, and the rows must be `q3`'s rows in order.
//!
//! The log-sum-exp that ends beside the output (`l' = m + log(t)` of the last merges, sliced
//! and concatenated alike) is read the same way without the values: its row `i` is the log of
//! the sum of `exp` of the causal scores of query position `qpos[i]` over the whole sequence,
//! the final normalization the ring's backward divides each block's probabilities by. It
//! holds `Rows(1, Q)` under the same coverage, mask and scale conditions.
//!
//! The backward's gradient of the queries (flash attention's, block by block under the final
//! normalization, [`Walk::dq`]) is read per rank the same way: its blocks must cover every
//! query row's causal keys once, and the log-sum-exp, output and output gradient it reads
//! must be the ring's own (read again, the same queries and scale) and the queries' rows.
//! The gradients of the keys and values travel on around the ring to their owners and are
//! not read here.

use crate::place::{Place, RowKey, RowTable};

pub(crate) mod key_grads;
use shardproof_ir::{Arg, Graph, NodeKind, ValueId};

/// One block of scores: query rows `rows` of `q3`, keys `kt` (rows on dim 2), values `v`
/// (rows on dim 1) and the mask, if any.
#[derive(Clone, Copy, Debug)]
struct Block {
    rows: (usize, usize),
    kt: ValueId,
    /// The values; none where only the log-sum-exp is read ([`Walk::lse`]).
    v: Option<ValueId>,
    /// The keys (rows on dim 1) a gradient block multiplies by ([`Walk::dq`]).
    k: Option<ValueId>,
    mask: Option<ValueId>,
}

/// What the walk has read: the blocks, the queries and scale they share, and a budget of
/// nodes so that a graph sharing subexpressions cannot make the walk exponential.
struct Walk<'a> {
    g: &'a Graph,
    blocks: Vec<Block>,
    q3: Option<ValueId>,
    /// The queries' local row count (from their placement).
    q_len: usize,
    scale: Option<u64>,
    budget: usize,
    /// What the queries' gradient reads beside its blocks, the same for all of them.
    grad: Option<GradInputs>,
}

/// The whole-row tensors a ring backward's query gradient reads: the ring's log-sum-exp
/// `lse` and output `out`, the output gradient `go` and `delta = sum(go * out, [2], True)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct GradInputs {
    lse: ValueId,
    out: ValueId,
    go: ValueId,
    delta: ValueId,
}

/// Where the walk gives up: more nodes than any ring of a real model merges.
const BUDGET: usize = 1 << 14;

/// The placement on one mesh dim of node `i` of `g` (an `add` or `cat`) where it ends a ring
/// attention's output or its log-sum-exp as the module documentation describes: `Rows(1, Q)`,
/// `Q` the queries' selection.
/// `place` gives a value's placement on the mesh dim, `coord` is the rank's coordinate on it.
/// `None` for anything else (a block missing or counted twice, a merge that is not the
/// log-sum-exp rule, a mask that is not the causal one on the global positions, a key seen
/// out of order).
pub(crate) fn ring_output(
    g: &Graph,
    i: usize,
    place: &dyn Fn(ValueId) -> Place,
    table: &RowTable,
    coord: usize,
) -> Option<Place> {
    // Cheap refusals first: most adds and cats are no attention.
    let NodeKind::Call { op, .. } = &g.nodes[i].kind else {
        return None;
    };
    if op.namespace != "aten" || !matches!(op.name.as_str(), "add" | "cat") {
        return None;
    }
    let end = ValueId::new(i, 0);
    // The output, or else the log-sum-exp that pairs with it: the blocks that make the one
    // make the other, and the backward reads both.
    let mut w = Walk::new(g);
    if let Some(rows) = w.acc(end, None, place, table, coord) {
        return settle(&w, &rows, place, table, coord);
    }
    let mut w = Walk::new(g);
    if let Some(rows) = w.lse(end, place, table, coord) {
        return settle(&w, &rows, place, table, coord);
    }
    let mut w = Walk::new(g);
    let rows = w.dq(end, place, table, coord)?;
    let got = settle(&w, &rows, place, table, coord)?;
    let grad = w.grad?;
    reads_the_ring(
        &w,
        got,
        Some(grad.out),
        grad.lse,
        grad.go,
        place,
        table,
        coord,
    )
    .then_some(got)
}

/// Whether a backward that `w` read (queries `Rows(1, Q)`, `got`) reads the ring's own
/// normalization `lse` and output `out` (read again, of the same queries and scale; `out`
/// only where the backward reads it) and the queries' rows of the output gradient `go`.
#[allow(clippy::too_many_arguments)]
fn reads_the_ring(
    w: &Walk,
    got: Place,
    out: Option<ValueId>,
    lse: ValueId,
    go: ValueId,
    place: &dyn Fn(ValueId) -> Place,
    table: &RowTable,
    coord: usize,
) -> bool {
    let Some(q3) = w.q3 else {
        return false;
    };
    let same_ring = |v: ValueId, lse: bool| -> bool {
        let mut f = Walk::new(w.g);
        let rows = if lse {
            f.lse(v, place, table, coord)
        } else {
            f.acc(v, None, place, table, coord)
        };
        rows.and_then(|rows| settle(&f, &rows, place, table, coord)) == Some(got)
            && f.q3 == Some(q3)
            && f.scale == w.scale
    };
    place(go) == got && same_ring(lse, true) && out.is_none_or(|o| same_ring(o, false))
}

/// The placement of what `w` read, `rows` per output row: `Rows(1, Q)` where every block's
/// keys (and values and keys of the gradient, where read) hold rows of `q3`'s spread
/// selection, masks are the causal mask of the global positions, and every query row sees
/// every key at or before its position exactly once, at least one in each block, the rows in
/// `q3`'s order.
fn settle(
    w: &Walk,
    rows: &AccRows,
    place: &dyn Fn(ValueId) -> Place,
    table: &RowTable,
    coord: usize,
) -> Option<Place> {
    let g = w.g;
    let q3 = w.q3?;
    let Place::Rows(1, qid) = place(q3) else {
        return None;
    };
    let (qroot, qpos) = positions(table, qid, coord)?;
    if qpos.len() != w.q_len || rows.len() != qpos.len() {
        return None;
    }
    // Per block: its key positions, and the visible ones per query row.
    let mut keys = Vec::with_capacity(w.blocks.len());
    for b in &w.blocks {
        keys.push(block_keys(g, b, qroot, &qpos, place, table, coord)?);
    }
    let mut seen = Vec::new();
    for (r, blocks) in rows.iter().enumerate() {
        // The rows in `q3`'s order, each once.
        if blocks.0 != r {
            return None;
        }
        let q = qpos[r];
        seen.clear();
        for &bi in &blocks.1 {
            let before = seen.len();
            for &k in &keys[bi] {
                if k <= q {
                    seen.push(k);
                } else if w.blocks[bi].mask.is_none() {
                    return None;
                }
            }
            // A block with every key masked has log-sum-exp -inf: the merge is NaN.
            if seen.len() == before {
                return None;
            }
        }
        seen.sort_unstable();
        if seen.len() != q + 1 || seen.iter().enumerate().any(|(j, &k)| j != k) {
            return None;
        }
    }
    Some(Place::Rows(1, qid))
}

/// The key positions of block `b` of queries `qpos` (of spread selection `qroot`): its keys
/// (and values and keys of the gradient, where read) hold rows of `qroot` at the same
/// positions, and its mask, if any, is the causal mask of the block's query and key positions.
fn block_keys(
    g: &Graph,
    b: &Block,
    qroot: u16,
    qpos: &[usize],
    place: &dyn Fn(ValueId) -> Place,
    table: &RowTable,
    coord: usize,
) -> Option<Vec<usize>> {
    let Place::Rows(2, kid) = place(b.kt) else {
        return None;
    };
    let (kroot, kpos) = positions(table, kid, coord)?;
    if kroot != qroot || kpos.is_empty() {
        return None;
    }
    for x in [b.v, b.k].into_iter().flatten() {
        let Place::Rows(1, xid) = place(x) else {
            return None;
        };
        let (xroot, xpos) = positions(table, xid, coord)?;
        if xroot != qroot || kpos != xpos {
            return None;
        }
    }
    if let Some(mask) = b.mask {
        let (pk, pq) = causal_mask(g, mask)?;
        if pq != qpos.get(b.rows.0..b.rows.1)? || pk != kpos {
            return None;
        }
    }
    Some(kpos)
}

/// The positions that selection `id` holds at coordinate `coord`, in order, with the spread
/// selection they index (its id): read through slices and received rows. `None` for any
/// other selection.
fn positions(table: &RowTable, id: u16, coord: usize) -> Option<(u16, Vec<usize>)> {
    let mut chain = Vec::new();
    let (mut id, mut coord) = (id, coord);
    for _ in 0..=u16::MAX {
        match table.key(id)? {
            RowKey::Spread {
                base: Some(_),
                segs,
                ..
            } => {
                let mut pos: Vec<usize> =
                    segs.get(coord)?.iter().flat_map(|&(a, b)| a..b).collect();
                for (size, start, end, step) in chain.into_iter().rev() {
                    if pos.len() != size || start > end || end > size {
                        return None;
                    }
                    pos = pos[start..end].iter().step_by(step).copied().collect();
                }
                return Some((id, pos));
            }
            RowKey::Slice {
                parent: Some(p),
                size,
                start,
                end,
                step,
            } if step >= 1 => {
                chain.push((size, start, end, step));
                id = p;
            }
            RowKey::Received { parent, from } => {
                id = parent;
                coord = from;
            }
            _ => return None,
        }
    }
    None
}

/// The ATen call at `v` (its first output) named `name`, with no keyword arguments: its
/// arguments.
fn aten<'a>(g: &'a Graph, v: ValueId, name: &str) -> Option<&'a [Arg]> {
    aten_with(g, v, name, &[])
}

/// [`aten`], allowing the keyword arguments named in `keywords` (a factory's device, dtype).
fn aten_with<'a>(g: &'a Graph, v: ValueId, name: &str, keywords: &[&str]) -> Option<&'a [Arg]> {
    match &g.nodes.get(v.node)?.kind {
        NodeKind::Call { op, args, kwargs }
            if v.output == 0
                && op.namespace == "aten"
                && op.name == name
                && kwargs.iter().all(|(k, _)| keywords.contains(&k.as_str())) =>
        {
            Some(args)
        }
        _ => None,
    }
}

/// The keywords of a factory that leave its values alone.
const FACTORY_KEYWORDS: [&str; 4] = ["dtype", "layout", "device", "pin_memory"];

/// The tensor arguments of the ATen call `name` at `v`, where it has exactly `n` arguments,
/// all tensors.
fn operands<const N: usize>(g: &Graph, v: ValueId, name: &str) -> Option<[ValueId; N]> {
    let args = aten(g, v, name)?;
    if args.len() != N {
        return None;
    }
    let mut out = [ValueId::new(0, 0); N];
    for (o, a) in out.iter_mut().zip(args) {
        *o = a.as_value()?;
    }
    Some(out)
}

/// `x` and `y` in either order equal to `a` and `b` (commutative operators).
fn pair_is(x: ValueId, y: ValueId, a: ValueId, b: ValueId) -> bool {
    (x == a && y == b) || (x == b && y == a)
}

/// `slice(x, 1, a, b)` with step 1: `(x, a, b)`.
fn row_slice(g: &Graph, v: ValueId) -> Option<(ValueId, usize, usize)> {
    let args = aten(g, v, "slice")?;
    let int = |k: usize| match args.get(k) {
        Some(Arg::Int(x)) => usize::try_from(*x).ok(),
        _ => None,
    };
    let step = if args.len() == 5 { int(4)? } else { 1 };
    if !(4..=5).contains(&args.len()) || int(1)? != 1 || step != 1 {
        return None;
    }
    let (a, b) = (int(2)?, int(3)?);
    (a <= b).then_some((args[0].as_value()?, a, b))
}

/// `cat([..], 1)`: its parts.
fn row_cat(g: &Graph, v: ValueId) -> Option<Vec<ValueId>> {
    let args = aten(g, v, "cat")?;
    if args.len() != 2 || args[1].as_int() != Some(1) {
        return None;
    }
    let Arg::List(parts) = &args[0] else {
        return None;
    };
    parts.iter().map(Arg::as_value).collect()
}

/// The positions a concatenation of `arange(start, end)` (or one) holds.
fn aranges(g: &Graph, v: ValueId) -> Option<Vec<usize>> {
    if let Some(args) = aten(g, v, "cat") {
        let Some(Arg::List(parts)) = args.first() else {
            return None;
        };
        if args.len() > 2 || args.get(1).is_some_and(|d| d.as_int() != Some(0)) {
            return None;
        }
        let mut out = Vec::new();
        for p in parts {
            out.extend(arange(g, p.as_value()?)?);
        }
        return Some(out);
    }
    arange(g, v)
}

/// `arange.start(start, end)` (factory keywords only): its values.
fn arange(g: &Graph, v: ValueId) -> Option<Vec<usize>> {
    let args = aten_with(g, v, "arange", &FACTORY_KEYWORDS)?;
    let NodeKind::Call { op, .. } = &g.nodes[v.node].kind else {
        return None;
    };
    let int = |k: usize| match args.get(k) {
        Some(Arg::Int(x)) => usize::try_from(*x).ok(),
        _ => None,
    };
    if op.overload != "start" || args.len() != 2 {
        return None;
    }
    let (a, b) = (int(0)?, int(1)?);
    (a <= b).then(|| (a..b).collect())
}

/// `masked_fill(full(_, 0), gt(unsqueeze(Pk, 0), unsqueeze(Pq, 1)), -inf)`: the positions
/// `(Pk, Pq)` of the keys and queries (-inf where a key follows the query).
fn causal_mask(g: &Graph, mask: ValueId) -> Option<(Vec<usize>, Vec<usize>)> {
    let args = aten(g, mask, "masked_fill")?;
    if args.len() != 3 || args[2].as_f64() != Some(f64::NEG_INFINITY) {
        return None;
    }
    let (zeros, future) = (args[0].as_value()?, args[1].as_value()?);
    let fill = aten_with(g, zeros, "full", &FACTORY_KEYWORDS)?;
    if fill.len() != 2 || fill[1].as_f64() != Some(0.0) {
        return None;
    }
    let [keys, queries] = operands::<2>(g, future, "gt")?;
    let unsq = |v: ValueId, d: i64| -> Option<ValueId> {
        let a = aten(g, v, "unsqueeze")?;
        if a.len() != 2 || a[1].as_int() != Some(d) {
            return None;
        }
        a[0].as_value()
    };
    Some((aranges(g, unsq(keys, 0)?)?, aranges(g, unsq(queries, 1)?)?))
}

/// Per output row of an accumulation: the row of `q3` it is, and the blocks merged into it.
type AccRows = Vec<(usize, Vec<usize>)>;

/// A reading of a value's rows by a [`Walk`] (its accumulation, log-sum-exp or gradient).
type RowReader<'a> =
    fn(&mut Walk<'a>, ValueId, &dyn Fn(ValueId) -> Place, &RowTable, usize) -> Option<AccRows>;

/// The rows of the sum of two accumulations of the same query rows: each row's blocks of
/// both; `None` where their rows differ.
fn join_rows(ra: AccRows, rb: AccRows) -> Option<AccRows> {
    if ra.len() != rb.len() {
        return None;
    }
    ra.into_iter()
        .zip(rb)
        .map(|((qa, mut ba), (qb, bb))| {
            (qa == qb).then(|| {
                ba.extend(bb);
                (qa, ba)
            })
        })
        .collect()
}

impl<'a> Walk<'a> {
    /// A walk of `g` that has read nothing yet.
    fn new(g: &'a Graph) -> Self {
        Walk {
            g,
            blocks: Vec::new(),
            q3: None,
            q_len: 0,
            scale: None,
            budget: BUDGET,
            grad: None,
        }
    }

    /// The rows of `v` where it is a row slice or a row concatenation of values `read` reads
    /// (`Some(None)` where one of them is not read); `None` where `v` is neither.
    fn through_row_moves(
        &mut self,
        v: ValueId,
        read: RowReader<'a>,
        place: &dyn Fn(ValueId) -> Place,
        table: &RowTable,
        coord: usize,
    ) -> Option<Option<AccRows>> {
        let g = self.g;
        if let Some((x, a, b)) = row_slice(g, v) {
            let rows = read(self, x, place, table, coord);
            return Some(rows.and_then(|rows| rows.get(a..b).map(<[_]>::to_vec)));
        }
        let parts = row_cat(g, v)?;
        let mut rows = Vec::new();
        for p in parts {
            match read(self, p, place, table, coord) {
                Some(r) => rows.extend(r),
                None => return Some(None),
            }
        }
        Some(Some(rows))
    }

    /// The rows of the accumulated output `out`, whose log-sum-exp must be `lse` where given
    /// (a merge reads it; the final output's is not read).
    fn acc(
        &mut self,
        out: ValueId,
        lse: Option<ValueId>,
        place: &dyn Fn(ValueId) -> Place,
        table: &RowTable,
        coord: usize,
    ) -> Option<AccRows> {
        self.budget = self.budget.checked_sub(1)?;
        let g = self.g;
        if let Some((x, a, b)) = row_slice(g, out) {
            let lx = match lse {
                Some(l) => {
                    let (lx, la, lb) = row_slice(g, l)?;
                    if (la, lb) != (a, b) {
                        return None;
                    }
                    Some(lx)
                }
                None => None,
            };
            let rows = self.acc(x, lx, place, table, coord)?;
            return rows.get(a..b).map(<[_]>::to_vec);
        }
        if let Some(parts) = row_cat(g, out) {
            let lparts = match lse {
                Some(l) => {
                    let lp = row_cat(g, l)?;
                    if lp.len() != parts.len() {
                        return None;
                    }
                    lp.into_iter().map(Some).collect()
                }
                None => vec![None; parts.len()],
            };
            let mut rows = Vec::new();
            for (p, l) in parts.into_iter().zip(lparts) {
                rows.extend(self.acc(p, l, place, table, coord)?);
            }
            return Some(rows);
        }
        if let Some([x, y]) = operands::<2>(g, out, "add") {
            return self.merge(x, y, lse, place, table, coord);
        }
        self.block(out, lse, place, table, coord)
    }

    /// `out = mul(out_a, div(Ea, T)) + mul(o_b, div(Eb, T))` (the log-sum-exp merge of the
    /// module documentation), its log-sum-exp `lse` (if given) `add(M, log(T))`.
    fn merge(
        &mut self,
        x: ValueId,
        y: ValueId,
        lse: Option<ValueId>,
        place: &dyn Fn(ValueId) -> Place,
        table: &RowTable,
        coord: usize,
    ) -> Option<AccRows> {
        let g = self.g;
        // `mul(o, div(E, T))`, either order: (o, E, T).
        let weighted = |v: ValueId| -> Option<(ValueId, ValueId, ValueId)> {
            let [a, b] = operands::<2>(g, v, "mul")?;
            [(a, b), (b, a)].into_iter().find_map(|(o, w)| {
                let [e, t] = operands::<2>(g, w, "div")?;
                Some((o, e, t))
            })
        };
        let (oa, ea, ta) = weighted(x)?;
        let (ob, eb, tb) = weighted(y)?;
        if ta != tb || ea == eb {
            return None;
        }
        let [t0, t1] = operands::<2>(g, ta, "add")?;
        if !pair_is(t0, t1, ea, eb) {
            return None;
        }
        // `E = exp(sub(l, M))`: (l, M).
        let shifted = |e: ValueId| -> Option<(ValueId, ValueId)> {
            let [d] = operands::<1>(g, e, "exp")?;
            let [l, m] = operands::<2>(g, d, "sub")?;
            Some((l, m))
        };
        let (la, ma) = shifted(ea)?;
        let (lb, mb) = shifted(eb)?;
        if ma != mb || la == lb {
            return None;
        }
        let [m0, m1] = operands::<2>(g, ma, "maximum")?;
        if !pair_is(m0, m1, la, lb) {
            return None;
        }
        if let Some(l) = lse {
            let [a, b] = operands::<2>(g, l, "add")?;
            let log_of = |v: ValueId| operands::<1>(g, v, "log").is_some_and(|[t]| t == ta);
            if !((a == ma && log_of(b)) || (b == ma && log_of(a))) {
                return None;
            }
        }
        let ra = self.acc(oa, Some(la), place, table, coord)?;
        let rb = self.acc(ob, Some(lb), place, table, coord)?;
        join_rows(ra, rb)
    }

    /// One block: `out = bmm(exp(sub(S, L)), V)`, `L = logsumexp(S, [-1], True)` (`lse` if
    /// given), `S = mul(bmm(Q, KT), scale)` plus a mask or not.
    fn block(
        &mut self,
        out: ValueId,
        lse: Option<ValueId>,
        place: &dyn Fn(ValueId) -> Place,
        table: &RowTable,
        coord: usize,
    ) -> Option<AccRows> {
        let g = self.g;
        let [p, v] = operands::<2>(g, out, "bmm")?;
        let [d] = operands::<1>(g, p, "exp")?;
        let [s, l] = operands::<2>(g, d, "sub")?;
        if lse.is_some_and(|x| x != l) {
            return None;
        }
        if aten(g, l, "logsumexp")?.first().and_then(Arg::as_value) != Some(s) {
            return None;
        }
        self.scores(l, Some(v), place, table, coord)
    }

    /// The rows of the log-sum-exp `l` of an accumulation read alone: row slices and
    /// concatenations, merges `add(M, log(add(exp(sub(l1, M)), exp(sub(l2, M)))))` with `M =
    /// maximum(l1, l2)` (each operator's operands in either order), and blocks
    /// `logsumexp(S, [-1], True)`. Row `r` is then the log of the sum of `exp` of the scores of
    /// every key of its blocks, which is what the output's merge computes beside it.
    fn lse(
        &mut self,
        l: ValueId,
        place: &dyn Fn(ValueId) -> Place,
        table: &RowTable,
        coord: usize,
    ) -> Option<AccRows> {
        self.budget = self.budget.checked_sub(1)?;
        let g = self.g;
        if let Some(rows) = self.through_row_moves(l, Self::lse, place, table, coord) {
            return rows;
        }
        if let Some([x, y]) = operands::<2>(g, l, "add") {
            let merged = [(x, y), (y, x)].into_iter().find_map(|(m, lt)| {
                let [t] = operands::<1>(g, lt, "log")?;
                let [e0, e1] = operands::<2>(g, t, "add")?;
                let shifted = |e: ValueId| -> Option<ValueId> {
                    let [d] = operands::<1>(g, e, "exp")?;
                    let [li, mi] = operands::<2>(g, d, "sub")?;
                    (mi == m).then_some(li)
                };
                let (la, lb) = (shifted(e0)?, shifted(e1)?);
                let [m0, m1] = operands::<2>(g, m, "maximum")?;
                (la != lb && pair_is(m0, m1, la, lb)).then_some((la, lb))
            });
            let (la, lb) = merged?;
            let ra = self.lse(la, place, table, coord)?;
            let rb = self.lse(lb, place, table, coord)?;
            return join_rows(ra, rb);
        }
        self.scores(l, None, place, table, coord)
    }

    /// A block's log-sum-exp `l = logsumexp(S, [-1], True)`, `S = mul(bmm(Q, KT), scale)` plus
    /// a mask or not, and its values `v` where the block's output is read.
    fn scores(
        &mut self,
        l: ValueId,
        v: Option<ValueId>,
        place: &dyn Fn(ValueId) -> Place,
        table: &RowTable,
        coord: usize,
    ) -> Option<AccRows> {
        let g = self.g;
        let la = aten(g, l, "logsumexp")?;
        let s = la.first()?.as_value()?;
        let last = la.get(1).and_then(Arg::as_int_list);
        if la.len() != 3
            || !matches!(last.as_deref(), Some([-1]) | Some([2]))
            || la[2] != Arg::Bool(true)
        {
            return None;
        }
        let bi = self.score_block(s, v, place, table, coord)?;
        let (a, b) = self.blocks[bi].rows;
        Some((a..b).map(|r| (r, vec![bi])).collect())
    }

    /// A block's scores `S = mul(bmm(Q, KT), scale)` plus a mask or not, with values `v`
    /// where read: the block, pushed (its index).
    fn score_block(
        &mut self,
        s: ValueId,
        v: Option<ValueId>,
        place: &dyn Fn(ValueId) -> Place,
        table: &RowTable,
        coord: usize,
    ) -> Option<usize> {
        let g = self.g;
        let (scaled, mask) = match operands::<2>(g, s, "add") {
            Some([a, b]) => {
                if aten(g, a, "mul").is_some() {
                    (a, Some(b))
                } else {
                    (b, Some(a))
                }
            }
            None => (s, None),
        };
        let ma = aten(g, scaled, "mul")?;
        let scale = match ma.get(1) {
            Some(Arg::Float(x)) => x.to_bits(),
            _ => return None,
        };
        if ma.len() != 2 || *self.scale.get_or_insert(scale) != scale {
            return None;
        }
        let [q, kt] = operands::<2>(g, ma[0].as_value()?, "bmm")?;
        let (q3, rows) = match row_slice(g, q) {
            Some((x, a, b)) => (x, Some((a, b))),
            None => (q, None),
        };
        if *self.q3.get_or_insert(q3) != q3 {
            return None;
        }
        if self.q_len == 0 {
            let Place::Rows(1, qid) = place(q3) else {
                return None;
            };
            self.q_len = positions(table, qid, coord)?.1.len();
        }
        let (a, b) = rows.unwrap_or((0, self.q_len));
        if b > self.q_len || a >= b {
            return None;
        }
        self.blocks.push(Block {
            rows: (a, b),
            kt,
            v,
            k: None,
            mask,
        });
        Some(self.blocks.len() - 1)
    }

    /// The rows of the queries' gradient `dq` of a ring backward: row slices and
    /// concatenations, sums `add(x, y)` of two such gradients of the same rows, and blocks
    /// [`Walk::grad_block`].
    fn dq(
        &mut self,
        dq: ValueId,
        place: &dyn Fn(ValueId) -> Place,
        table: &RowTable,
        coord: usize,
    ) -> Option<AccRows> {
        self.budget = self.budget.checked_sub(1)?;
        let g = self.g;
        if let Some(rows) = self.through_row_moves(dq, Self::dq, place, table, coord) {
            return rows;
        }
        if let Some([x, y]) = operands::<2>(g, dq, "add") {
            // Each step adds one block's product to what came before: without one, this is
            // no gradient sum (and a long chain of other adds is not walked).
            if aten(g, x, "bmm").is_none() && aten(g, y, "bmm").is_none() {
                return None;
            }
            let rx = self.dq(x, place, table, coord)?;
            let ry = self.dq(y, place, table, coord)?;
            return join_rows(rx, ry);
        }
        self.grad_block(dq, place, table, coord)
    }

    /// One block of the queries' gradient (flash attention's backward under the final
    /// normalization): `bmm(dS, K)` with `dS` a block's [`Walk::grad_scores`].
    fn grad_block(
        &mut self,
        out: ValueId,
        place: &dyn Fn(ValueId) -> Place,
        table: &RowTable,
        coord: usize,
    ) -> Option<AccRows> {
        let [ds, k] = operands::<2>(self.g, out, "bmm")?;
        let bi = self.grad_scores(ds, place, table, coord)?;
        self.blocks[bi].k = Some(k);
        let (ra, rb) = self.blocks[bi].rows;
        Some((ra..rb).map(|r| (r, vec![bi])).collect())
    }

    /// A block's gradient of its scores: `mul(mul(P, sub(bmm(dO_b, transpose(V, 1, 2)),
    /// D_b)), scale)` (the inner `mul`'s operands in either order), `P` a block's
    /// [`Walk::probabilities`], `dO_b` and `D_b` the block's query rows of the output gradient
    /// and of `D = sum(mul(dO, O), [2], True)`, the scale the scores'. The block, pushed (its
    /// index).
    fn grad_scores(
        &mut self,
        ds: ValueId,
        place: &dyn Fn(ValueId) -> Place,
        table: &RowTable,
        coord: usize,
    ) -> Option<usize> {
        let g = self.g;
        let sa = aten(g, ds, "mul")?;
        let scale = match sa.get(1) {
            Some(Arg::Float(x)) if sa.len() == 2 => x.to_bits(),
            _ => return None,
        };
        let [a, b] = operands::<2>(g, sa[0].as_value()?, "mul")?;
        let (p, centered) = [(a, b), (b, a)]
            .into_iter()
            .find(|&(p, _)| aten(g, p, "exp").is_some())?;
        let [dp, db] = operands::<2>(g, centered, "sub")?;
        let [gob, vt] = operands::<2>(g, dp, "bmm")?;
        let ta = aten(g, vt, "transpose")?;
        if ta.len() != 3 || ta[1].as_int() != Some(1) || ta[2].as_int() != Some(2) {
            return None;
        }
        let v = ta[0].as_value()?;
        let (bi, lse) = self.probabilities(p, Some(v), place, table, coord)?;
        if *self.scale.get_or_insert(scale) != scale {
            return None;
        }
        let (go, delta) = (self.rows_of(bi, gob)?, self.rows_of(bi, db)?);
        let da = aten(g, delta, "sum")?;
        let dims = da.get(1).and_then(Arg::as_int_list);
        if da.len() != 3 || !matches!(dims.as_deref(), Some([2]) | Some([-1])) {
            return None;
        }
        if da[2] != Arg::Bool(true) {
            return None;
        }
        let [x, y] = operands::<2>(g, da[0].as_value()?, "mul")?;
        let out = if x == go {
            y
        } else if y == go {
            x
        } else {
            return None;
        };
        let refs = GradInputs {
            lse,
            out,
            go,
            delta,
        };
        if *self.grad.get_or_insert(refs) != refs {
            return None;
        }
        Some(bi)
    }

    /// A block's probabilities under the final normalization, `P = exp(sub(S, L_b))`, `S` a
    /// block's scores (values `v` where read) and `L_b` the block's query rows of one
    /// log-sum-exp: the block, pushed (its index), and that log-sum-exp.
    fn probabilities(
        &mut self,
        p: ValueId,
        v: Option<ValueId>,
        place: &dyn Fn(ValueId) -> Place,
        table: &RowTable,
        coord: usize,
    ) -> Option<(usize, ValueId)> {
        let [d] = operands::<1>(self.g, p, "exp")?;
        let [s, lb] = operands::<2>(self.g, d, "sub")?;
        let bi = self.score_block(s, v, place, table, coord)?;
        Some((bi, self.rows_of(bi, lb)?))
    }

    /// The tensor whose rows `x` is: block `bi`'s query rows of it, a row slice, or the whole
    /// tensor where the block has all of the queries' rows.
    fn rows_of(&self, bi: usize, x: ValueId) -> Option<ValueId> {
        let (ra, rb) = self.blocks.get(bi)?.rows;
        match row_slice(self.g, x) {
            Some((whole, a, b)) if (a, b) == (ra, rb) => Some(whole),
            Some(_) => None,
            None => ((ra, rb) == (0, self.q_len)).then_some(x),
        }
    }
}
