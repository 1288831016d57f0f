//! The abstract placement of a tensor along one mesh dim, and its SPMD type.

use serde::Serialize;
use shardproof_case::{Placement, Reduce};
use std::fmt;

/// How a tensor is laid out along one mesh dim, as the checker infers it.
///
/// The first three are DTensor's placements; [`Place::Varying`] is the SPMD type V of a tensor
/// that differs across the ranks of the mesh dim in no layout the checker knows (a rank's own
/// token chunks, a routed expert's tokens); [`Place::Unmasked`] is the rows a rank looks up in
/// its vocabulary shard before the rows outside its range are zeroed (a partial sum once they
/// are); [`Place::Unknown`] is what an operator without a rule produces: never guessed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Place {
    /// Every coordinate holds the same tensor.
    Replicate,
    /// Split into equal contiguous pieces along this tensor dim, one per coordinate.
    Shard(u8),
    /// A blocked shard, `Blocked(d, k)` with k > 1: tensor dim `d` is split into `k` equal
    /// contiguous blocks, every block into one equal contiguous piece per coordinate, and a
    /// coordinate holds its piece of every block, concatenated in block order (DTensor's
    /// `_StridedShard(d, split_factor=k)`). `Shard(d)` is the one-block case. It arises where a
    /// sharded dim is flattened with unsharded dims outside it (Megatron's `[s, b, np, hn] ->
    /// [s, b*np, hn]` with the heads sharded), and where a collective over another mesh dim
    /// concatenates along it (ZeRO's all-gather over dp of a tp-sharded weight).
    Blocked(u8, u16),
    /// The pieces reduce (sum, avg, max, min) to the tensor.
    Partial(Red),
    /// `Rows(d, id)`: the pieces along tensor dim `d`, in coordinate order, are a shard of a
    /// tensor whose rows along `d` are a fixed selection of another's, in an order the
    /// checker does not prove (a microbatch slice of a batch shard holds rows `r*L + a ..
    /// r*L + b` of coordinate `r`: a shard of the microbatch's rows, which are no contiguous
    /// rows of the batch). Values of one `id` hold the same selection, so a row of one meets
    /// the same row of another; a sum or mean over `d` is a partial of the selected rows'
    /// sum, whatever their order, but nothing that reads the order (a gather, a declared
    /// shard, a replicated operand along `d`) takes it. See [`RowKey`].
    Rows(u8, u16),
    /// `Stacked(d)`: every coordinate holds the same tensor, the pieces of a shard of dim `d`
    /// concatenated along dim 0 in coordinate order (an all-gather of `Shard(d)`, d > 0): the
    /// tensor's elements in another order and shape, which the program must rearrange.
    Stacked(u8),
    /// `Gathered(a, o)`: every coordinate holds the same tensor, whose dim `a` indexes the
    /// coordinate and dim `o` the piece's part of the tensor's dim (a `Stacked` value with its
    /// dim 0 split into `[n, piece]`, then permuted); a view merging `a` just outside `o` is
    /// the tensor (`Replicate()`).
    Gathered(u8, u8),
    /// `PartialSplit(a, j)`: a `Partial(sum)` whose dim `j` a view split into `[n, piece]`
    /// (n the mesh dim's size) at dim `a`; the other dims are the tensor's, in order (`j`
    /// counts them). Every rule but views, permutes, copies and the reduce-scatter sees
    /// `Partial(sum)`.
    PartialSplit(u8, u8),
    /// `PartialStacked(j)`: a `Partial(sum)` whose dim 0 is `[n, d0]`, the `n` pieces of its
    /// dim `j` outermost (ZeRO's gradient moved to column-block-major order): a reduce-scatter
    /// over the mesh dim leaves coordinate `r` piece `r` of dim `j`, a `Shard(j)`.
    PartialStacked(u8),
    /// `Rolled(d, k, root)`, `0 <= k < n`: coordinate `r` holds piece `(r + k) mod n` of the
    /// value `root` (numbered in the check's table of ring roots: a node, by name, output and
    /// structure), which is `Shard(d)` (a shard passed along a ring: a recv of the piece
    /// coordinate `r + k` sent). Only copies, sends and a concatenation of every piece of one
    /// root ([`Place::Permuted`]) read it; every other rule sees `Varying`.
    Rolled(u8, u8, u16),
    /// `Permuted(p, code, base)`: dim `p` holds every piece of a shard of `p`, coordinate `r`
    /// holding at position `t` the piece `(r + k_t) mod n`, where `k` is the permutation of
    /// `0..n` numbered `code` ([`perm_offsets`]); with dim `p` put back in piece order, the
    /// tensor is `base` (`u8::MAX`: `Replicate()`, else `Shard(base)`, never `p`). It is what a
    /// ring that concatenates every coordinate's keys holds (the seed's ring attention). Rules
    /// that commute with a permutation of dim `p` (element-wise with operands of the same
    /// order, softmax, transposes) keep it, sums over `p` and products that contract `p` on
    /// both sides in the same order drop it; see `ring.rs`.
    Permuted(u8, u16, u8),
    /// `Accrued(id)`: a ring backward's gradient of one rank's key (or value) block, summed
    /// over the query rows of the ranks it has visited so far; record `id` of the check's
    /// table ([`crate::ring_grad`]) says which block and which (query, key) pairs. Every rule
    /// sees `Varying`; a recv keeps it, and the block owner's recv of a record that covers
    /// every pair holds the owner's rows of the gradient.
    Accrued(u16),
    /// `Selected(d, id, base)`: dim `d` of every coordinate holds the whole selection `id`
    /// (the pieces of `Rows(d, id)` of every coordinate, concatenated in coordinate order: an
    /// all-gather of them over this mesh dim alone), and in that frame the value is `base`
    /// (`u8::MAX`: `Replicate()`; [`SELECTED_PARTIAL`]: `Partial(sum)`; else `Shard(base)`,
    /// never `d`). The expert-parallel dispatcher's gathered tokens are `Selected(0, id, R)`;
    /// the experts' products `Selected(1, id, Shard(0))` beside experts sharded on dim 0; their
    /// weighted sum `Selected(0, id, Partial(sum))`, which a reduce-scatter over this mesh dim
    /// along `d = 0` makes `Rows(0, id)` again. Rules see `base` where every operand meeting
    /// dim `d` holds the same selection there (`frame.rs`); anything else sees `Varying`.
    Selected(u8, u16, u8),
    /// Differs across coordinates, in no known layout (SPMD type V): possibly a shard whose
    /// layout the checker lost, so a rule that needs a layout proven (a reduction over the
    /// group, a norm, a declared shard) makes no claim from it.
    Varying,
    /// Rows looked up in a vocabulary shard, not yet masked to the rank's range.
    Unmasked,
    /// No rule says.
    Unknown,
}

/// The `base` of a [`Place::Selected`] that stands for `Partial(sum)`.
pub const SELECTED_PARTIAL: u8 = u8::MAX - 1;

/// The reduction of a partial placement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Red {
    /// Sum of the pieces.
    Sum,
    /// Mean of the pieces.
    Avg,
    /// Element-wise maximum.
    Max,
    /// Element-wise minimum.
    Min,
}

impl Red {
    /// The c10d name (`sum`, `avg`, `max`, `min`).
    pub fn name(self) -> &'static str {
        match self {
            Red::Sum => "sum",
            Red::Avg => "avg",
            Red::Max => "max",
            Red::Min => "min",
        }
    }

    /// Parses a c10d reduce op name.
    pub fn parse(s: &str) -> Option<Red> {
        Some(match s.to_ascii_lowercase().as_str() {
            "sum" => Red::Sum,
            "avg" | "mean" => Red::Avg,
            "max" => Red::Max,
            "min" => Red::Min,
            _ => return None,
        })
    }

    /// Sum and avg are linear: a linear operator maps pieces to pieces.
    pub fn is_linear(self) -> bool {
        matches!(self, Red::Sum | Red::Avg)
    }
}

/// The SPMD type of a local tensor (the seed's R / I / V / P).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum SpmdType {
    /// Replicate: the same data on every rank (its gradient is partial).
    R,
    /// Invariant: the same data, and no gradient flows through it (indices, masks, constants).
    I,
    /// Varying: different data per rank (shards included).
    V,
    /// Partial: a pending reduction across ranks (its gradient is replicated).
    P,
}

impl SpmdType {
    /// The type of the gradient of a tensor of this type (the seed's duality).
    pub fn gradient_dual(self) -> SpmdType {
        match self {
            SpmdType::R => SpmdType::P,
            SpmdType::P => SpmdType::R,
            t => t,
        }
    }
}

/// How the rows of a [`Place::Rows`] value are selected: the identity of its selection, so
/// that two values can be shown to hold the same rows in the same order.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum RowKey {
    /// `slice(x, d, start, end, step)` (normalized: `0 <= start <= end <= size`, step >= 1)
    /// of `x` whose dim `d` has local size `size`, `x` a plain shard of `d` (`parent` none)
    /// or rows of selection `parent`: coordinate `r` holds the rows `start, start + step, ..`
    /// of its piece.
    Slice {
        /// The selection sliced, none for a plain shard.
        parent: Option<u16>,
        /// The local size of the sliced dim.
        size: usize,
        /// First row.
        start: usize,
        /// End (exclusive).
        end: usize,
        /// Step.
        step: usize,
    },
    /// Rows of selection `parent` merged with the `factor` elements of the dims inside it by
    /// a view (`[mb, s, h] -> [mb * s, h]`): row `i` of the parent is rows `i * factor ..
    /// (i + 1) * factor`.
    Merge {
        /// The selection merged.
        parent: u16,
        /// The elements of each of its rows.
        factor: usize,
    },
    /// Rows of selection `parent` merged with `blocks` unselected dims outside them by a view
    /// (`[b, s] -> [b * s]`, the sequence `s` context-parallel rows): the merged dim is
    /// `Blocked(_, blocks)` of the selected tensor, each coordinate holding, block after
    /// block, its rows of the parent. Rules that take blocked shards see it as such; a view
    /// that splits the blocks off again gives back `parent`.
    Blocks {
        /// The selection merged.
        parent: u16,
        /// The number of blocks (the product of the merged outer dims), at least 2.
        blocks: usize,
    },
    /// Rows of a tensor every coordinate holds whole, picked at rank-dependent bounds:
    /// coordinate `k` holds, in order, the rows `a..b` of every segment `(a, b)` of
    /// `segs[k]` (Megatron's load-balanced context-parallel chunks: coordinate `r` holds chunks
    /// `r` and `2n-1-r` of the sequence). `base` is the size of the dim the rows are picked
    /// from; `None` for positions made by `arange` at those bounds, whose values are the row
    /// numbers themselves (the rows of `arange(0, N)` for any `N` past them). Built only by
    /// `rows::spread`: adjacent segments merged, every coordinate the same count of rows; a
    /// concatenation of one tensor's pieces (or of positions) drops `src`, and makes a `None`
    /// base whose segments tile `0..M` `Some(M)`, so that positions and a tensor picked at
    /// the same bounds get one key.
    Spread {
        /// The picked dim's size (`None`: positions of no tensor).
        base: Option<usize>,
        /// Per coordinate, its segments in the order it holds them.
        segs: Vec<Vec<(usize, usize)>>,
        /// The tensor a slice picked from (its value's name, the same on every rank), so that
        /// only pieces of one tensor are joined; `None` for positions and for pieces joined.
        src: Option<String>,
    },
    /// The rows that coordinate `from` holds of selection `parent`, received from it (a ring's
    /// key block): every rank that holds them holds that coordinate's rows, so the pieces are
    /// no shard of anything. Only ring attention's form reads them (`attention.rs`, on the
    /// sender's concrete positions); a sum over them is no partial of the selection.
    Received {
        /// The selection the sender held.
        parent: u16,
        /// The sender's coordinate on the mesh dim.
        from: usize,
    },
    /// On one mesh dim, the rows of selection `parent` that an all-gather over another mesh dim
    /// `over` (alone, `n` coordinates, along the rows' dim 0) concatenated: a coordinate holds
    /// the pieces of `parent` of every coordinate of `over` beside it, in their order (the
    /// expert-parallel dispatcher's tokens on `dp`). A reduce-scatter over `over` along dim 0
    /// gives each coordinate its own rows of `parent` back.
    Gathered {
        /// The selection gathered.
        parent: u16,
        /// The mesh dim gathered over.
        over: u8,
        /// Its coordinates.
        n: usize,
    },
}

/// The row selections met in one check, numbered in the order first met ([`Place::Rows`]).
#[derive(Debug, Default)]
pub struct RowTable {
    keys: Vec<RowKey>,
    ids: std::collections::HashMap<RowKey, u16>,
}

impl RowTable {
    /// The number of `key`, numbering it if new; `None` once the numbers run out (the caller
    /// claims no rows then).
    pub fn intern(&mut self, key: RowKey) -> Option<u16> {
        if let Some(&id) = self.ids.get(&key) {
            return Some(id);
        }
        let id = u16::try_from(self.keys.len()).ok()?;
        self.keys.push(key.clone());
        self.ids.insert(key, id);
        Some(id)
    }

    /// The selection numbered `id`.
    pub fn key(&self, id: u16) -> Option<RowKey> {
        self.keys.get(id as usize).cloned()
    }
}

impl Place {
    /// The case's placement as a checker placement.
    pub fn from_case(p: Placement) -> Place {
        match p {
            Placement::Replicate => Place::Replicate,
            Placement::Shard(d) => u8::try_from(d).map_or(Place::Unknown, Place::Shard),
            Placement::Partial(r) => Place::Partial(match r {
                Reduce::Sum => Red::Sum,
                Reduce::Avg => Red::Avg,
                Reduce::Max => Red::Max,
                Reduce::Min => Red::Min,
            }),
        }
    }

    /// The SPMD type (`invariant` marks a replicated value no gradient flows through).
    pub fn spmd_type(self, invariant: bool) -> Option<SpmdType> {
        Some(match self {
            Place::Replicate if invariant => SpmdType::I,
            Place::Replicate | Place::Stacked(_) | Place::Gathered(..) => SpmdType::R,
            Place::Shard(_)
            | Place::Blocked(..)
            | Place::Rows(..)
            | Place::Rolled(..)
            | Place::Permuted(..)
            | Place::Accrued(_)
            | Place::Varying => SpmdType::V,
            Place::Selected(_, _, base) if base == u8::MAX => SpmdType::R,
            Place::Selected(_, _, base) if base == SELECTED_PARTIAL => SpmdType::P,
            Place::Selected(..) => SpmdType::V,
            Place::Partial(_)
            | Place::Unmasked
            | Place::PartialSplit(..)
            | Place::PartialStacked(_) => SpmdType::P,
            Place::Unknown => return None,
        })
    }

    /// True for a pending reduction (a partial, or unmasked vocabulary rows).
    pub fn is_partial(self) -> bool {
        matches!(
            self,
            Place::Partial(_)
                | Place::Unmasked
                | Place::PartialSplit(..)
                | Place::PartialStacked(_)
        )
    }

    /// The tensor dim this placement shards, if any.
    pub fn shard_dim(self) -> Option<usize> {
        match self {
            Place::Shard(d) => Some(d as usize),
            _ => None,
        }
    }

    /// The (dim, blocks) of a shard or a blocked shard (`Shard(d)` is one block).
    pub fn blocks(self) -> Option<(usize, usize)> {
        match self {
            Place::Shard(d) => Some((d as usize, 1)),
            Place::Blocked(d, k) => Some((d as usize, k as usize)),
            _ => None,
        }
    }

    /// Dim `d` sharded in `k` blocks: `Shard(d)` for one block, `Blocked(d, k)` for more;
    /// `Varying` where the numbers do not fit the representation (never a guess).
    pub fn blocked(d: usize, k: usize) -> Place {
        match (u8::try_from(d), u16::try_from(k)) {
            (Ok(d), Ok(1)) => Place::Shard(d),
            (Ok(d), Ok(k)) if k > 1 => Place::Blocked(d, k),
            _ => Place::Varying,
        }
    }

    /// `Shard(d)` for a usize dim (dims past 255 are unknown).
    pub fn shard(d: usize) -> Place {
        u8::try_from(d).map_or(Place::Unknown, Place::Shard)
    }
}

/// The Lehmer number of `offsets`, a permutation of `0..n` (`n <= 8`, so the number fits a
/// `u16`); `None` for anything else. See [`Place::Permuted`].
pub fn perm_code(offsets: &[usize]) -> Option<u16> {
    let n = offsets.len();
    if n == 0 || n > 8 {
        return None;
    }
    let mut seen = [false; 8];
    let mut code = 0usize;
    for (i, &k) in offsets.iter().enumerate() {
        if k >= n || seen[k] {
            return None;
        }
        seen[k] = true;
        let smaller = (0..k).filter(|&j| !seen[j]).count();
        code = code * (n - i) + smaller;
    }
    u16::try_from(code).ok()
}

/// The permutation of `0..n` numbered `code` by [`perm_code`]: position `t` of a
/// [`Place::Permuted`] dim on coordinate `r` holds the piece `(r + offsets[t]) mod n`.
pub fn perm_offsets(code: u16, n: usize) -> Option<Vec<usize>> {
    if n == 0 || n > 8 {
        return None;
    }
    // Digits of the mixed-radix number, most significant first (radix n, n - 1, ..., 1).
    let mut digits = vec![0usize; n];
    let mut c = code as usize;
    for i in (0..n).rev() {
        let radix = n - i;
        digits[i] = c % radix;
        c /= radix;
    }
    if c != 0 {
        return None;
    }
    let mut free: Vec<usize> = (0..n).collect();
    Some(digits.into_iter().map(|d| free.remove(d)).collect())
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Place::Replicate => f.write_str("Replicate()"),
            Place::Shard(d) => write!(f, "Shard({d})"),
            Place::Blocked(d, k) => write!(f, "Shard({d}, blocks={k})"),
            Place::Partial(r) => write!(f, "Partial({})", r.name()),
            Place::Rows(d, id) => write!(f, "Rows({d}, #{id})"),
            Place::Stacked(d) => write!(f, "Stacked({d})"),
            Place::Rolled(d, k, _) => write!(f, "Shard({d}) of coordinate + {k}"),
            Place::Permuted(p, code, base) => {
                write!(f, "Permuted(dim={p}, order=#{code}, ")?;
                match *base {
                    u8::MAX => f.write_str("Replicate())"),
                    b => write!(f, "Shard({b}))"),
                }
            }
            Place::Gathered(a, o) => write!(f, "Gathered(axis={a}, of={o})"),
            Place::Selected(d, id, base) => {
                write!(f, "Selected(dim={d}, #{id}, ")?;
                match *base {
                    u8::MAX => f.write_str("Replicate())"),
                    SELECTED_PARTIAL => f.write_str("Partial(sum))"),
                    b => write!(f, "Shard({b}))"),
                }
            }
            Place::PartialSplit(a, j) => write!(f, "Partial(sum, dim {j} split at {a})"),
            Place::PartialStacked(j) => write!(f, "Partial(sum, pieces of dim {j} in dim 0)"),
            Place::Accrued(id) => write!(f, "Accrued(#{id})"),
            Place::Varying => f.write_str("Varying"),
            Place::Unmasked => f.write_str("Unmasked(vocab)"),
            Place::Unknown => f.write_str("Unknown"),
        }
    }
}

impl Serialize for Place {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spmd_types_and_duality() {
        assert_eq!(Place::Shard(1).spmd_type(false), Some(SpmdType::V));
        assert_eq!(Place::Replicate.spmd_type(true), Some(SpmdType::I));
        assert_eq!(Place::Partial(Red::Sum).spmd_type(false), Some(SpmdType::P));
        assert_eq!(Place::Unknown.spmd_type(false), None);
        assert_eq!(SpmdType::R.gradient_dual(), SpmdType::P);
        assert_eq!(SpmdType::P.gradient_dual(), SpmdType::R);
        assert_eq!(SpmdType::I.gradient_dual(), SpmdType::I);
        assert_eq!(SpmdType::V.gradient_dual(), SpmdType::V);
        assert_eq!(Place::Partial(Red::Max).to_string(), "Partial(max)");
        assert_eq!(Place::from_case(Placement::Shard(2)), Place::Shard(2));
    }

    #[test]
    fn permutation_numbers_round_trip() {
        for n in 1..=5usize {
            let mut seen = std::collections::BTreeSet::new();
            // Every permutation of 0..n, by Heap's algorithm.
            let mut a: Vec<usize> = (0..n).collect();
            let mut c = vec![0usize; n];
            let mut perms = vec![a.clone()];
            let mut i = 0;
            while i < n {
                if c[i] < i {
                    if i % 2 == 0 {
                        a.swap(0, i);
                    } else {
                        a.swap(c[i], i);
                    }
                    perms.push(a.clone());
                    c[i] += 1;
                    i = 0;
                } else {
                    c[i] = 0;
                    i += 1;
                }
            }
            for p in perms {
                let code = perm_code(&p).unwrap();
                assert!(seen.insert(code), "{p:?}");
                assert_eq!(perm_offsets(code, n).unwrap(), p);
            }
        }
        assert_eq!(perm_code(&[0, 0]), None);
        assert_eq!(perm_code(&[0, 2]), None);
        assert_eq!(perm_offsets(2, 2), None);
    }
}
