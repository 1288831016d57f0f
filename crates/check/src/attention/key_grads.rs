//! The ring backward's gradients of the keys and values (issue 44), which travel across ranks.
//!
//! Each key (and value) block goes around the ring a second time with the gradient
//! accumulated for it so far: at every step a rank adds its own query rows' contribution
//! against the block it holds and sends the sum on, and after the last step the sum reaches
//! the block's owner. No rank holds a piece of the gradient before that, so no placement of
//! the layouts says what the value in transit is. This reading records it instead
//! ([`Place::Accrued`]): the gradient of which block (its owner's coordinate and selection of
//! key positions), of which ring (the queries' spread selection and the scale), and the
//! (query, key) position pairs summed so far. A record is checked on every rank alone:
//!
//! - a contribution is `repeat_kv_backward(view(bmm(transpose(dS, 1, 2), Q_b)))` for the keys
//!   and the same of `bmm(transpose(P, 1, 2), dO_b)` for the values (`repeat_kv_backward` is
//!   `sum(view(x, [b, kv, rep, n, d]), [2])`, or nothing for one query head per key head),
//!   with `dS`, `P`, `Q_b` and `dO_b` the block's, read as the queries' gradient reads them
//!   (`Walk::grad_scores`, `Walk::probabilities`): the ring's own log-sum-exp, output and
//!   output gradient, the causal mask of the global positions or no key after a query;
//! - it adds the pairs of its query rows and causally visible keys, no pair twice, to a
//!   record of the same block and ring: `add(received, contribution)` for the whole block,
//!   or a concatenation along the key dim of a slice of the received sum with the
//!   contribution added and the other slice (the zoo's `add_to_part`); a contribution alone
//!   (the first step) starts a record;
//! - a recv holds the record its sender sent; the owner's recv of a record that holds every
//!   pair of its keys and every query position of the sequence, each once, holds the owner's
//!   rows of the gradient, `Rows(2, K)` ([`arrived`]).
//!
//! The gradient is linear in the blocks, so the sum of every causal pair's term once is the
//! whole sequence's. As for the forward, which global tensors the keys and values are is read
//! only through their positions.

use super::{block_keys, operands, positions, reads_the_ring, Walk};
use crate::place::{Place, RowKey, RowTable};
use shardproof_ir::{Arg, Graph, NodeKind, ValueId};
use std::collections::HashMap;

/// Which gradient a record sums.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Kind {
    /// `dS^T Q`.
    Keys,
    /// `P^T dO`.
    Values,
}

/// Which block's gradient, in which ring: what a record and a contribution to it share.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Block {
    kind: Kind,
    /// The coordinate that owns the block.
    owner: usize,
    /// The owner's selection of its key positions (its keys' rows).
    base: u16,
    /// The spread selection of the queries' and keys' positions.
    qroot: u16,
    /// The scores' scale, as bits.
    scale: u64,
    /// Query heads per key head (the `repeat_kv` factor).
    rep: usize,
}

/// A partial sum of the gradient of one key (or value) block over some (query, key) pairs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Record {
    block: Block,
    /// The gradient's shape, `[b, kv heads, keys, head dim]`.
    shape: Vec<usize>,
    /// The (query, key) position pairs summed, sorted, each once.
    pairs: Vec<(usize, usize)>,
}

/// The records of the ring backward's key and value gradients in transit, numbered in the
/// order met (the id of [`Place::Accrued`]).
#[derive(Debug, Default)]
pub struct GradRecords {
    records: Vec<Record>,
    ids: HashMap<Record, u16>,
}

impl GradRecords {
    /// The number of a record, numbering it if new; `None` once the numbers run out.
    fn intern(&mut self, r: Record) -> Option<u16> {
        if let Some(&id) = self.ids.get(&r) {
            return Some(id);
        }
        let id = u16::try_from(self.records.len()).ok()?;
        self.records.push(r.clone());
        self.ids.insert(r, id);
        Some(id)
    }
}

/// One rank's contribution to a block's gradient.
struct Contribution {
    block: Block,
    /// The gradient's shape (its keys dim: the part's).
    shape: Vec<usize>,
    /// The block's key positions.
    keys: Vec<usize>,
    /// Its (query, key) pairs, sorted.
    pairs: Vec<(usize, usize)>,
}

/// The placement on one mesh dim of node `i` of `g` where it extends (or starts) a record of
/// the ring backward's key or value gradient as the module documentation describes:
/// `Accrued(id)`. `place` gives a value's placement on the mesh dim, `shape` its local shape,
/// `coord` is the rank's coordinate on it. `None` for anything else.
pub(crate) fn accrue(
    g: &Graph,
    i: usize,
    place: &dyn Fn(ValueId) -> Place,
    shape: &dyn Fn(ValueId) -> Option<Vec<usize>>,
    table: &RowTable,
    records: &mut GradRecords,
    coord: usize,
) -> Option<Place> {
    let NodeKind::Call { op, args, .. } = &g.nodes[i].kind else {
        return None;
    };
    if op.namespace != "aten" {
        return None;
    }
    let end = ValueId::new(i, 0);
    let out_shape = shape(end)?;
    let (received, contribution, part) = match op.name.as_str() {
        "sum" | "view" => {
            let c = contribution(g, end, place, shape, table, coord)?;
            let whole = positions(table, c.block.base, c.block.owner)?.1;
            if c.keys != whole || c.shape != out_shape {
                return None;
            }
            return records
                .intern(Record {
                    block: c.block,
                    shape: c.shape,
                    pairs: c.pairs,
                })
                .map(Place::Accrued);
        }
        "add" => {
            let [x, y] = operands::<2>(g, end, "add")?;
            if shape(x)? != out_shape || shape(y)? != out_shape {
                return None;
            }
            // Either operand may be the received sum (both are records where the rank's
            // contribution alone starts one).
            let whole = (0, *out_shape.get(2)?);
            return [(x, y), (y, x)].into_iter().find_map(|(acc, c)| {
                extend(g, acc, c, whole, place, shape, table, records, coord)
            });
        }
        "cat" => {
            // `cat([add(slice(x, 2, 0, m), c), slice(x, 2, m, n)], 2)` or the contribution in
            // the second slice.
            let (Some(Arg::List(parts)), Some(Arg::Int(2))) = (args.first(), args.get(1)) else {
                return None;
            };
            if args.len() != 2 || parts.len() != 2 {
                return None;
            }
            let (p0, p1) = (parts[0].as_value()?, parts[1].as_value()?);
            let added = |p: ValueId| -> Option<(ValueId, ValueId)> {
                let [a, b] = operands::<2>(g, p, "add")?;
                [(a, b), (b, a)]
                    .into_iter()
                    .find(|&(s, _)| key_slice(g, s).is_some())
            };
            let (sliced, c, other, first) = match (added(p0), added(p1)) {
                (Some((s, c)), None) => (s, c, p1, true),
                (None, Some((s, c))) => (s, c, p0, false),
                _ => return None,
            };
            let (x, a, b) = key_slice(g, sliced)?;
            let (x2, a2, b2) = key_slice(g, other)?;
            let n = *out_shape.get(2)?;
            let covers = if first {
                a == 0 && b == a2 && b2 == n
            } else {
                a2 == 0 && b2 == a && b == n
            };
            if x != x2 || !covers || shape(x)? != out_shape || shape(c)? != shape(sliced)? {
                return None;
            }
            if !matches!(place(x), Place::Accrued(_)) {
                return None;
            }
            (x, c, (a, b))
        }
        _ => return None,
    };
    extend(
        g,
        received,
        contribution,
        part,
        place,
        shape,
        table,
        records,
        coord,
    )
}

/// The record of `received` (a record) plus the contribution `c` against its keys `part`.
#[allow(clippy::too_many_arguments)]
fn extend(
    g: &Graph,
    received: ValueId,
    c: ValueId,
    part: (usize, usize),
    place: &dyn Fn(ValueId) -> Place,
    shape: &dyn Fn(ValueId) -> Option<Vec<usize>>,
    table: &RowTable,
    records: &mut GradRecords,
    coord: usize,
) -> Option<Place> {
    let Place::Accrued(id) = place(received) else {
        return None;
    };
    let rec = records.records.get(id as usize)?.clone();
    let c = contribution(g, c, place, shape, table, coord)?;
    let whole = positions(table, rec.block.base, rec.block.owner)?.1;
    let same = c.block == rec.block
        && c.shape.len() == 4
        && c.shape[..2] == rec.shape[..2]
        && c.shape[3] == rec.shape[3]
        && whole.get(part.0..part.1) == Some(&c.keys[..]);
    if !same {
        return None;
    }
    let pairs = merge_disjoint(&rec.pairs, &c.pairs)?;
    records.intern(Record { pairs, ..rec }).map(Place::Accrued)
}

/// `slice(x, 2, a, b)` with step 1: `(x, a, b)`.
fn key_slice(g: &Graph, v: ValueId) -> Option<(ValueId, usize, usize)> {
    let args = super::aten(g, v, "slice")?;
    let int = |k: usize| match args.get(k) {
        Some(Arg::Int(x)) => usize::try_from(*x).ok(),
        _ => None,
    };
    let step = if args.len() == 5 { int(4)? } else { 1 };
    if !(4..=5).contains(&args.len()) || int(1)? != 2 || step != 1 {
        return None;
    }
    let (a, b) = (int(2)?, int(3)?);
    (a <= b).then_some((args[0].as_value()?, a, b))
}

/// The union of two sorted sets of pairs; `None` where they share one (a term counted twice).
fn merge_disjoint(a: &[(usize, usize)], b: &[(usize, usize)]) -> Option<Vec<(usize, usize)>> {
    let mut out: Vec<(usize, usize)> = a.iter().chain(b).copied().collect();
    out.sort_unstable();
    let n = out.len();
    out.dedup();
    (out.len() == n).then_some(out)
}

/// `view(x, shape)`: `(x, shape)`.
fn view_of(g: &Graph, v: ValueId) -> Option<(ValueId, Vec<usize>)> {
    let args = super::aten(g, v, "view")?;
    if args.len() != 2 {
        return None;
    }
    let dims = args[1].as_int_list()?;
    let dims: Option<Vec<usize>> = dims.iter().map(|&d| usize::try_from(d).ok()).collect();
    Some((args[0].as_value()?, dims?))
}

/// The contribution `v` (the module documentation's form), checked on the rank alone.
fn contribution(
    g: &Graph,
    v: ValueId,
    place: &dyn Fn(ValueId) -> Place,
    shape: &dyn Fn(ValueId) -> Option<Vec<usize>>,
    table: &RowTable,
    coord: usize,
) -> Option<Contribution> {
    // `repeat_kv_backward(view(product, [b, h, n, d]))`: the sum of each key head's copies.
    let (heads, rep) = match super::aten(g, v, "sum") {
        Some(args) => {
            let dims = args.get(1).and_then(Arg::as_int_list);
            if args.len() != 3 || dims.as_deref() != Some(&[2]) || args[2] != Arg::Bool(false) {
                return None;
            }
            let (x, split) = view_of(g, args[0].as_value()?)?;
            let (_, s4) = view_of(g, x)?;
            if s4.len() != 4
                || split.len() != 5
                || split[0] != s4[0]
                || split[1].checked_mul(split[2]) != Some(s4[1])
                || split[3..] != s4[2..]
                || split[2] < 2
            {
                return None;
            }
            (x, split[2])
        }
        None => (v, 1),
    };
    let (product, s4) = view_of(g, heads)?;
    let [lhs, rhs] = operands::<2>(g, product, "bmm")?;
    let pshape = shape(product)?;
    if s4.len() != 4 || Some(pshape) != s4[0].checked_mul(s4[1]).map(|bh| vec![bh, s4[2], s4[3]]) {
        return None;
    }
    let ta = super::aten(g, lhs, "transpose")?;
    if ta.len() != 3 || ta[1].as_int() != Some(1) || ta[2].as_int() != Some(2) {
        return None;
    }
    let t = ta[0].as_value()?;
    let mut w = Walk::new(g);
    let kind = if super::aten(g, t, "exp").is_some() {
        Kind::Values
    } else {
        Kind::Keys
    };
    let (bi, lse, go, out) = match kind {
        Kind::Keys => {
            let bi = w.grad_scores(t, place, table, coord)?;
            let grad = w.grad?;
            // `Q_b`: the block's rows of the queries its scores read.
            if w.rows_of(bi, rhs) != w.q3 {
                return None;
            }
            (bi, grad.lse, grad.go, Some(grad.out))
        }
        Kind::Values => {
            let (bi, lse) = w.probabilities(t, None, place, table, coord)?;
            let go = w.rows_of(bi, rhs)?;
            (bi, lse, go, None)
        }
    };
    let q3 = w.q3?;
    let got @ Place::Rows(1, qid) = place(q3) else {
        return None;
    };
    let (qroot, qpos) = positions(table, qid, coord)?;
    if qpos.len() != w.q_len || !reads_the_ring(&w, got, out, lse, go, place, table, coord) {
        return None;
    }
    let block = w.blocks.get(bi)?;
    let keys = block_keys(g, block, qroot, &qpos, place, table, coord)?;
    // Which block: the owner and its selection, through row slices and the recv.
    let Place::Rows(2, kid) = place(block.kt) else {
        return None;
    };
    let (owner, base) = origin(table, kid, coord)?;
    let mut pairs = Vec::new();
    for &q in qpos.get(block.rows.0..block.rows.1)? {
        for &k in &keys {
            if k <= q {
                pairs.push((q, k));
            } else if block.mask.is_none() {
                return None;
            }
        }
    }
    pairs.sort_unstable();
    let n = pairs.len();
    pairs.dedup();
    if pairs.len() != n {
        return None;
    }
    let grad_shape = shape(v)?;
    let expect = [s4[0], s4[1] / rep, s4[2], s4[3]];
    if grad_shape != expect || s4[2] != keys.len() {
        return None;
    }
    Some(Contribution {
        block: Block {
            kind,
            owner,
            base,
            qroot,
            scale: w.scale?,
            rep,
        },
        shape: grad_shape,
        keys,
        pairs,
    })
}

/// The coordinate that owns the keys of selection `kid` held at `coord`, and the owner's
/// selection: through row slices to a received selection (its sender's), or to the rank's own.
fn origin(table: &RowTable, kid: u16, coord: usize) -> Option<(usize, u16)> {
    let mut id = kid;
    for _ in 0..=u16::MAX {
        match table.key(id)? {
            RowKey::Slice {
                parent: Some(p), ..
            } => id = p,
            RowKey::Received { parent, from } => return Some((from, parent)),
            _ => return Some((coord, id)),
        }
    }
    None
}

/// What the recv at coordinate `rc` of a mesh dim of size `n` holds of record `id`: the
/// owner's rows of the gradient, `Rows(2, K)`, where `rc` owns the block and the record holds
/// every pair of its keys with every query position at or after them, each once; the record
/// otherwise.
pub(crate) fn arrived(
    records: &GradRecords,
    table: &RowTable,
    id: u16,
    rc: usize,
    n: usize,
) -> Place {
    let Some(rec) = records.records.get(id as usize) else {
        return Place::Varying;
    };
    let Block {
        owner, base, qroot, ..
    } = rec.block;
    if owner != rc {
        return Place::Accrued(id);
    }
    let complete = || -> Option<bool> {
        let (root, keys) = positions(table, base, owner)?;
        if root != qroot || rec.shape.get(2) != Some(&keys.len()) {
            return Some(false);
        }
        // Every query position of the sequence, each once.
        let mut queries = Vec::new();
        for c in 0..n {
            queries.extend(positions(table, qroot, c)?.1);
        }
        queries.sort_unstable();
        if queries.iter().enumerate().any(|(j, &q)| j != q) {
            return Some(false);
        }
        let mut want: Vec<(usize, usize)> = keys
            .iter()
            .flat_map(|&k| {
                queries
                    .iter()
                    .filter(move |&&q| q >= k)
                    .map(move |&q| (q, k))
            })
            .collect();
        want.sort_unstable();
        Some(want == rec.pairs)
    };
    if complete() == Some(true) {
        Place::Rows(2, base)
    } else {
        Place::Accrued(id)
    }
}
