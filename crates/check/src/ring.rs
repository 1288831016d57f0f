//! Ring placements ([`Place::Rolled`], [`Place::Permuted`]): shards passed along a ring of
//! sends and recvs, and the whole tensor a ring collects in a rank-dependent order.
//!
//! A recv of a `Shard(d)` piece from the coordinate `k` steps ahead holds that coordinate's
//! piece: `Rolled(d, k, root)`, where `root` names the sent value (the piece of which tensor).
//! A concatenation along `d` of the pieces of one root at offsets that are every residue mod
//! n once holds the whole tensor with its pieces in an order that depends on the coordinate:
//! `Permuted(d, code, Replicate)`. The seed's ring attention then computes with it: scores
//! `q @ keys^T` have the keys' order in their columns, a softmax over the keys is the same in
//! any order, and the product with the values, whose rows are in the same order, sums over
//! every key, so the order drops out. Each rule here is that of the base placement (the
//! tensor with dim `p` put back in piece order), plus where dim `p` goes: a permutation of
//! dim `p` commutes with the operator, or the operator is invariant under it.

use crate::place::{perm_code, perm_offsets, Place};
use crate::rules::norm_dim;
use shardproof_ir::ValueId;
use shardproof_ops::{Args, Meta};
use std::collections::HashMap;

/// The base byte of a [`Place::Permuted`] that is replicated with its dim in piece order.
pub(crate) const REPLICATED: u8 = u8::MAX;

/// The values whose pieces travel along rings (a node's name, output and structure hash,
/// confirmed on the structure), numbered in the order met: the `root` of [`Place::Rolled`].
#[derive(Debug, Default)]
pub struct RingRoots {
    /// Per key, the roots numbered under it.
    ids: HashMap<(String, usize, u64), Vec<Root>>,
    count: usize,
    /// Calls of [`RingRoots::intern`] so far: a run that made none read no root number (a
    /// twin of a graph equal only up to its point-to-point peers may share it).
    pub calls: usize,
    /// The ring backward's key and value gradients in transit ([`Place::Accrued`]).
    pub grads: crate::attention::key_grads::GradRecords,
}

impl RingRoots {
    /// The number of a root, numbering it if new; `None` once the numbers run out. Node
    /// `node` of rank `rank` is the value; `same(q, j)` says whether node `j` of rank `q`
    /// computes the same expression (an equal structure hash could be a collision, which
    /// would take two tensors' pieces as one's).
    pub fn intern(
        &mut self,
        name: &str,
        output: usize,
        structure: u64,
        (rank, node): (usize, usize),
        same: impl Fn(usize, usize) -> bool,
    ) -> Option<u16> {
        self.calls += 1;
        let roots = self
            .ids
            .entry((name.to_string(), output, structure))
            .or_default();
        if let Some(&(id, _, _)) = roots.iter().find(|&&(_, q, j)| same(q, j)) {
            return Some(id);
        }
        let id = u16::try_from(self.count).ok()?;
        self.count += 1;
        roots.push((id, rank, node));
        Some(id)
    }
}

/// A numbered ring root: (number, a rank and node that computes it).
type Root = (u16, usize, usize);

/// `Rolled(d, k, root)`, `Varying` where the numbers do not fit.
fn rolled(d: u8, k: usize, root: u16) -> Place {
    u8::try_from(k).map_or(Place::Varying, |k| Place::Rolled(d, k, root))
}

/// What a recv at coordinate `rc` reads along a mesh dim of size `n` where the sender, at
/// coordinate `sc != rc`, holds the sent value as `p` (`root`: the sent value's number, for
/// a plain shard). The receiver holds the sender's piece: `(sc + k') mod n` for a sender
/// holding piece `sc + k'`, which is `rc + (sc - rc + k')`.
pub(crate) fn moved(p: Place, sc: usize, rc: usize, n: usize, root: Option<u16>) -> Place {
    let shift = (sc + n - rc % n) % n;
    match p {
        // Back at the root's own coordinate (offset 0), the piece is the receiver's own piece
        // of the root, but this value is another node: it stays `Rolled`, never `Shard`.
        Place::Shard(d) => root.map_or(Place::Varying, |id| rolled(d, shift, id)),
        Place::Rolled(d, k, id) => rolled(d, (k as usize + shift) % n, id),
        // Every position moves by the same shift; a shard of another dim would be the
        // sender's piece, so only a replicated base moves.
        Place::Permuted(dim, code, REPLICATED) => perm_offsets(code, n)
            .and_then(|ks| {
                let ks: Vec<usize> = ks.iter().map(|&k| (k + shift) % n).collect();
                perm_code(&ks)
            })
            .map_or(Place::Varying, |c| Place::Permuted(dim, c, REPLICATED)),
        _ => Place::Varying,
    }
}

/// How a call takes its ring inputs on one mesh dim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RingMode {
    /// No input holds a ring placement.
    None,
    /// The rule sees ring placements as `Varying`.
    Varying,
    /// The outputs' placement, without the rule (a concatenation of every piece).
    Result(Place),
    /// The rule sees `Rolled(d, k, root)` as `Shard(d)`; its `Shard(d)` outputs are rolled.
    Rolled(u8, u16),
    /// The rule sees `Permuted` inputs as their base; output dim `dim` holds the same order
    /// (`None`: the order dropped out).
    Permuted {
        /// The order's number.
        code: u16,
        /// The output dim in that order.
        dim: Option<u8>,
    },
}

/// A tensor argument's value, placement and rank.
struct Operand {
    v: ValueId,
    p: Place,
    rank: usize,
}

/// How the call (`family`, operator `op` such as `mm` or `sum`, bound `args`) takes its ring
/// inputs on one mesh dim of size `n`; `root_of` gives the ring root a plain shard would
/// have (the value itself).
#[allow(clippy::too_many_arguments)]
pub(crate) fn ring_mode(
    family: &str,
    op: &str,
    args: &Args,
    n: usize,
    place: impl Fn(ValueId) -> Place,
    meta: impl Fn(ValueId) -> Option<Meta>,
    root_of: impl Fn(ValueId) -> Option<u16>,
    out_rank: usize,
) -> RingMode {
    let ops: Vec<Operand> = crate::rows::tensors(args)
        .into_iter()
        .map(|(_, v)| Operand {
            v,
            p: place(v),
            rank: meta(v).map_or(usize::MAX, |m| m.shape.len()),
        })
        .collect();
    let rolled = ops.iter().any(|o| matches!(o.p, Place::Rolled(..)));
    let permuted: Vec<(u8, u16, u8)> = ops
        .iter()
        .filter_map(|o| match o.p {
            Place::Permuted(p, c, b) => Some((p, c, b)),
            _ => None,
        })
        .collect();
    if !rolled && permuted.is_empty() {
        return RingMode::None;
    }
    if ops.iter().any(|o| o.rank == usize::MAX) || (rolled && !permuted.is_empty()) {
        return RingMode::Varying;
    }
    let unary = matches!(family, "linear-unary" | "nonlinear-unary") && ops.len() == 1;
    if rolled {
        if family == "cat" {
            return cat(args, n, &ops, &meta, &root_of);
        }
        return match ops[0].p {
            Place::Rolled(_, k, id) if unary => RingMode::Rolled(k, id),
            _ => RingMode::Varying,
        };
    }
    let code = permuted[0].1;
    if permuted.iter().any(|&(_, c, _)| c != code) {
        return RingMode::Varying;
    }
    let keep = |dim: Option<usize>| match dim.map(u8::try_from) {
        None => RingMode::Permuted { code, dim: None },
        Some(Ok(d)) => RingMode::Permuted { code, dim: Some(d) },
        Some(Err(_)) => RingMode::Varying,
    };
    let pdim = |o: &Operand| match o.p {
        Place::Permuted(p, ..) => Some(p as usize),
        _ => None,
    };
    let int = |name: &str| {
        args.schema()
            .index_of(name)
            .and_then(|_| args.get(name))
            .and_then(|a| a.as_int())
    };
    match family {
        _ if unary => keep(pdim(&ops[0])),
        // Element-wise, after right-aligned broadcasting: every operand with the permuted
        // dim holds it in the same order at the same output dim; any other operand is
        // constant along it (absent or of size 1).
        "elementwise-add" | "elementwise-mul" | "elementwise-div" | "nonlinear-binary" => {
            let mut at: Option<usize> = None;
            for o in &ops {
                if let Some(p) = pdim(o) {
                    let a = p + out_rank - o.rank.min(out_rank);
                    if o.rank > out_rank || at.is_some_and(|x| x != a) {
                        return RingMode::Varying;
                    }
                    at = Some(a);
                }
            }
            let Some(a) = at else {
                return RingMode::Varying;
            };
            let flat = ops.iter().filter(|o| pdim(o).is_none()).all(|o| {
                let shift = out_rank as i64 - o.rank as i64;
                let j = a as i64 - shift;
                j < 0 || meta(o.v).is_some_and(|m| m.shape.get(j as usize) == Some(&1))
            });
            if flat {
                keep(Some(a))
            } else {
                RingMode::Varying
            }
        }
        // A softmax over any dim commutes with a permutation of any dim.
        "softmax" if ops.len() == 1 => keep(pdim(&ops[0])),
        "reduction"
            if ops.len() == 1 && matches!(op, "sum" | "mean" | "amax" | "amin" | "logsumexp") =>
        {
            let (p, rank) = (pdim(&ops[0]).unwrap_or(0), ops[0].rank);
            let dims: Option<Vec<i64>> = args
                .schema()
                .index_of("dim")
                .and_then(|_| args.get("dim"))
                .and_then(|a| a.as_int_list().or_else(|| a.as_int().map(|d| vec![d])));
            let dims: Vec<usize> = match dims {
                Some(ds) if !ds.is_empty() => {
                    let Some(ds) = ds.iter().map(|&d| norm_dim(d, rank)).collect() else {
                        return RingMode::Varying;
                    };
                    ds
                }
                // No dims: every dim is reduced.
                _ => (0..rank).collect(),
            };
            let keepdim = args
                .schema()
                .index_of("keepdim")
                .and_then(|_| args.get("keepdim"))
                .and_then(|a| a.as_bool())
                .unwrap_or(false);
            if dims.contains(&p) {
                // A sum, mean, maximum or log-sum-exp over every piece, in any order.
                keep(None)
            } else if keepdim {
                keep(Some(p))
            } else {
                keep(Some(p - dims.iter().filter(|&&d| d < p).count()))
            }
        }
        "transpose" if ops.len() == 1 => {
            let (p, rank) = (pdim(&ops[0]).unwrap_or(0), ops[0].rank);
            let (a, b) = if op == "t" {
                (0, if rank >= 2 { 1 } else { 0 })
            } else {
                match (
                    int("dim0").and_then(|d| norm_dim(d, rank)),
                    int("dim1").and_then(|d| norm_dim(d, rank)),
                ) {
                    (Some(a), Some(b)) => (a, b),
                    _ => return RingMode::Varying,
                }
            };
            keep(Some(if p == a {
                b
            } else if p == b {
                a
            } else {
                p
            }))
        }
        "permute" if ops.len() == 1 => {
            let (p, rank) = (pdim(&ops[0]).unwrap_or(0), ops[0].rank);
            let dims: Option<Vec<usize>> = args
                .schema()
                .index_of("dims")
                .and_then(|_| args.get("dims"))
                .and_then(|a| a.as_int_list())
                .and_then(|ds| ds.iter().map(|&d| norm_dim(d, rank)).collect());
            match dims.and_then(|ds| ds.iter().position(|&d| d == p)) {
                Some(j) => keep(Some(j)),
                None => RingMode::Varying,
            }
        }
        "matmul" if matches!(op, "mm" | "bmm") && ops.len() == 2 => {
            product(op, &ops[0], &ops[1], code).map_or(RingMode::Varying, keep)
        }
        _ => RingMode::Varying,
    }
}

/// The output dim of a product `a @ b` (`mm`: `[m, k] @ [k, n]`, `bmm`: `[b, m, k] @ [b, k,
/// n]`) that holds the order `code`, `Some(None)` where the order dropped out (both operands
/// hold it in the contracted dim), `None` where the product pairs elements of different
/// orders.
fn product(op: &str, a: &Operand, b: &Operand, code: u16) -> Option<Option<usize>> {
    let batch = usize::from(op == "bmm");
    if a.rank != 2 + batch || b.rank != 2 + batch {
        return None;
    }
    let pa = match a.p {
        Place::Permuted(p, c, _) if c == code => Some(p as usize),
        _ => None,
    };
    let pb = match b.p {
        Place::Permuted(p, c, _) if c == code => Some(p as usize),
        _ => None,
    };
    // Dims of `a`: batch, row, contracted; of `b`: batch, contracted, column.
    let (a_row, a_k) = (batch, batch + 1);
    let (b_k, b_col) = (batch, batch + 1);
    match (pa, pb) {
        (Some(x), Some(y)) if x == a_k && y == b_k => Some(None),
        (Some(0), Some(0)) if batch == 1 => Some(Some(0)),
        (Some(x), None) if x == a_row => Some(Some(a_row)),
        (None, Some(y)) if y == b_col => Some(Some(b_col)),
        _ => None,
    }
}

/// A concatenation of ring pieces: along their shard dim, every offset mod `n` once, all
/// pieces of one root and of one shape (a plain shard counts as offset 0 where it is the
/// root itself) -> `Permuted(d, code, Replicate)`.
fn cat(
    args: &Args,
    n: usize,
    ops: &[Operand],
    meta: &impl Fn(ValueId) -> Option<Meta>,
    root_of: &impl Fn(ValueId) -> Option<u16>,
) -> RingMode {
    let Some(rank) = ops.first().map(|o| o.rank) else {
        return RingMode::Varying;
    };
    let dim = args
        .schema()
        .index_of("dim")
        .and_then(|_| args.get("dim"))
        .and_then(|a| a.as_int())
        .unwrap_or(0);
    let Some(dim) = norm_dim(dim, rank) else {
        return RingMode::Varying;
    };
    let root = ops.iter().find_map(|o| match o.p {
        Place::Rolled(_, _, id) => Some(id),
        _ => None,
    });
    let shape = meta(ops[0].v).map(|m| m.shape);
    let mut offsets = Vec::with_capacity(ops.len());
    for o in ops {
        let k = match o.p {
            Place::Rolled(d, k, id) if d as usize == dim && Some(id) == root => k as usize,
            Place::Shard(d)
                if d as usize == dim && root_of(o.v).is_some() && root_of(o.v) == root =>
            {
                0
            }
            _ => return RingMode::Varying,
        };
        if meta(o.v).map(|m| m.shape) != shape {
            return RingMode::Varying;
        }
        offsets.push(k);
    }
    match (offsets.len() == n, perm_code(&offsets), u8::try_from(dim)) {
        (true, Some(code), Ok(d)) => RingMode::Result(Place::Permuted(d, code, REPLICATED)),
        _ => RingMode::Varying,
    }
}

/// The placement of an output where the rule ran in `mode` and gave `p`.
pub(crate) fn ring_output(p: Place, mode: RingMode) -> Place {
    match (mode, p) {
        (_, Place::Unknown) => p,
        (RingMode::Rolled(k, root), Place::Shard(d)) => Place::Rolled(d, k, root),
        (RingMode::Permuted { dim: None, .. }, p) => p,
        (RingMode::Permuted { code, dim: Some(q) }, Place::Replicate) => {
            Place::Permuted(q, code, REPLICATED)
        }
        (RingMode::Permuted { code, dim: Some(q) }, Place::Shard(b)) if b != q => {
            Place::Permuted(q, code, b)
        }
        _ => Place::Varying,
    }
}

/// What a rule in `mode` sees of input placement `p`.
pub(crate) fn seen(p: Place, mode: RingMode) -> Place {
    match (p, mode) {
        (Place::Rolled(d, ..), RingMode::Rolled(..)) => Place::Shard(d),
        (Place::Permuted(_, _, REPLICATED), RingMode::Permuted { .. }) => Place::Replicate,
        (Place::Permuted(_, _, b), RingMode::Permuted { .. }) => Place::Shard(b),
        (Place::Rolled(..) | Place::Permuted(..) | Place::Accrued(_), _) => Place::Varying,
        (p, _) => p,
    }
}

/// Whether a value's ring placement on one mesh dim is consistent with its placements on the
/// others: no other mesh dim splits the dim whose pieces the ring moved or reordered (the
/// piece of which tensor, and in what order, would depend on both coordinates).
pub(crate) fn crosses(places: &[Place], m: usize) -> bool {
    let dim = match places[m] {
        Place::Rolled(d, ..) | Place::Permuted(d, ..) => d,
        _ => return false,
    };
    places.iter().enumerate().any(|(k, q)| {
        k != m
            && match *q {
                Place::Shard(d)
                | Place::Blocked(d, _)
                | Place::Rows(d, _)
                | Place::Rolled(d, ..)
                | Place::Stacked(d) => d == dim,
                Place::Permuted(d, _, b) => d == dim || b == dim,
                Place::Gathered(..) | Place::Varying | Place::Unknown => true,
                _ => false,
            }
    })
}

#[cfg(test)]
mod tests {
    use super::RingRoots;

    #[test]
    fn a_root_key_collision_unconfirmed_on_the_structure_is_another_root() {
        let mut roots = RingRoots::default();
        let a = roots.intern("k", 0, 7, (0, 3), |_, _| false);
        // Same name, output and hash: the same root only where the structure is the same.
        assert_eq!(roots.intern("k", 0, 7, (1, 3), |q, j| (q, j) == (0, 3)), a);
        let b = roots.intern("k", 0, 7, (1, 4), |_, _| false);
        assert!(a.is_some() && b.is_some() && a != b);
        assert_eq!(roots.intern("k", 0, 7, (2, 4), |q, j| (q, j) == (1, 4)), b);
    }
}
