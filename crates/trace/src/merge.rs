//! Rebuilding a logical full tensor from its ranks' pieces (seed 002, section 4.4): the pieces
//! are grouped by the full box they map (pieces of one box are replicas), the boxes are checked
//! for partial overlap and omission (a part of the full tensor nobody holds), and replicas are
//! checked to agree. Nothing is copied: a [`Layout`] names the pieces, and [`crate::sums`]
//! streams over them.

use crate::format::Region;
use crate::reader::{Holder, Logical, Trace};
use crate::sums::{piece_data, sums, unequal, Pair, PieceData, Sums};

/// Cells of the coordinate-compressed grid above which omission is judged by volume only.
const MAX_CELLS: u64 = 1 << 20;

/// One piece of a rank's entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PieceRef {
    /// The rank and entry.
    pub holder: Holder,
    /// The piece's index in the entry.
    pub piece: usize,
}

/// The pieces that map one full box: replicas of each other, the lowest rank first.
#[derive(Clone, Debug)]
pub struct Group {
    /// The full box.
    pub full: Region,
    /// Its pieces.
    pub replicas: Vec<PieceRef>,
}

/// How a logical tensor lies across a trace's ranks.
#[derive(Debug)]
pub struct Layout<'t> {
    trace: &'t Trace,
    /// The full tensor's shape.
    pub full_shape: Vec<u64>,
    /// The distinct full boxes, in box order.
    pub groups: Vec<Group>,
    /// Whether a rank declares the replicas bit-identical (`exact_replicas`): then any
    /// difference between them is a disagreement.
    pub exact: bool,
}

/// A shard map that does not rebuild the full tensor.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Inconsistency {
    /// Two pieces of different boxes overlap partially.
    Overlap {
        /// One box and the ranks holding it.
        first: Region,
        /// Those ranks.
        first_ranks: Vec<u64>,
        /// The other box.
        second: Region,
        /// Its ranks.
        second_ranks: Vec<u64>,
        /// Their common part.
        common: Region,
    },
    /// A part of the full tensor no rank holds.
    Omission {
        /// One uncovered box (the first in row-major order of the compressed grid).
        region: Region,
        /// Elements no rank holds in all.
        missing: u64,
    },
}

impl std::fmt::Display for Inconsistency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Inconsistency::Overlap { first, first_ranks, second, second_ranks, common } => write!(
                f,
                "pieces overlap partially: {first} on rank {} and {second} on rank {} share {common}",
                ranks_text(first_ranks),
                ranks_text(second_ranks)
            ),
            Inconsistency::Omission { region, missing } => write!(
                f,
                "{missing} elements are held by no rank, among them {region}"
            ),
        }
    }
}

/// `0, 2, 5`.
pub fn ranks_text(ranks: &[u64]) -> String {
    ranks
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The worst disagreement among a logical tensor's replicas.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ReplicaSpread {
    /// The box the replicas hold.
    pub region: Region,
    /// The replica compared (its rank).
    pub rank: u64,
    /// The replica it is compared with (the lowest rank holding the box).
    pub against: u64,
    /// rel_err(first replica, this replica).
    pub relative_error: f64,
    /// For replicas declared bit-identical: how many elements differ (`None`: judged by the
    /// tolerance).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unequal: Option<u64>,
}

impl ReplicaSpread {
    /// Whether the replicas disagree: any difference where they are declared bit-identical,
    /// else a relative error beyond `tolerance` (NaN is within none).
    pub fn disagrees(&self, tolerance: f64) -> bool {
        match self.unequal {
            Some(n) => n > 0,
            None => self.relative_error > tolerance || self.relative_error.is_nan(),
        }
    }
}

/// A trace's recomputation of a tensor (`recompute_input` / `recompute_output`) against the
/// same trace's forward value: rank by rank, the same pieces, every element equal.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RecomputeCheck {
    /// Elements compared, over every rank.
    pub elements: u64,
    /// Of those, elements that differ.
    pub unequal: u64,
    /// The rank with the largest relative error (the first rank when none differs).
    pub rank: u64,
    /// rel_err(forward, recomputed) on that rank.
    pub relative_error: f64,
    /// Why the values could not be compared (a rank without the forward value, or pieces that
    /// differ from the forward's): not judged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    /// Bytes of stored data read.
    #[serde(skip)]
    pub bytes: u64,
}

impl RecomputeCheck {
    /// Compares `recomputed` (a recomputation kind's holders in `trace`) with `forward` (the
    /// holders of the forward kind it repeats, when recorded).
    pub fn new(trace: &Trace, recomputed: &Logical, forward: Option<&Logical>) -> RecomputeCheck {
        let mut check = RecomputeCheck {
            elements: 0,
            unequal: 0,
            rank: u64::MAX,
            relative_error: 0.0,
            problem: None,
            bytes: 0,
        };
        for &holder in &recomputed.holders {
            let rank = trace.ranks[holder.rank].index.rank;
            let entry = &trace.ranks[holder.rank].index.tensors[holder.entry];
            let Some(f) = forward.and_then(|f| f.holders.iter().find(|h| h.rank == holder.rank))
            else {
                check.problem = Some(format!(
                    "rank {rank} recorded no forward value to compare with"
                ));
                return check;
            };
            let fentry = &trace.ranks[f.rank].index.tensors[f.entry];
            let boxes = |e: &crate::format::TensorEntry| -> Vec<Region> {
                e.pieces.iter().map(|p| p.full.clone()).collect()
            };
            if boxes(entry) != boxes(fentry) || entry.full_shape != fentry.full_shape {
                check.problem = Some(format!(
                    "rank {rank} holds other pieces of it than of the forward value"
                ));
                return check;
            }
            let pairs: Vec<Pair<'_>> = (0..entry.pieces.len())
                .map(|p| Pair {
                    a: data_of(trace, PieceRef { holder, piece: p }),
                    b: data_of(
                        trace,
                        PieceRef {
                            holder: *f,
                            piece: p,
                        },
                    ),
                    region: entry.pieces[p].full.clone(),
                })
                .collect();
            let differing = unequal(&pairs);
            let error = if differing > 0 {
                sums(&pairs).relative_error()
            } else {
                0.0
            };
            let elements = entry.pieces.iter().map(|p| p.full.volume()).sum::<u64>();
            let sizes = trace.ranks[holder.rank].stored[holder.entry].dtype.size()
                + trace.ranks[f.rank].stored[f.entry].dtype.size();
            check.bytes += elements * sizes as u64;
            check.elements += elements;
            check.unequal += differing;
            if check.rank == u64::MAX || error > check.relative_error || error.is_nan() {
                check.rank = rank;
                check.relative_error = error;
            }
        }
        check
    }
}

/// The mapped data of a piece of `trace`.
fn data_of(trace: &Trace, r: PieceRef) -> PieceData<'_> {
    let rank = &trace.ranks[r.holder.rank];
    let stored = &rank.stored[r.holder.entry];
    let piece = &rank.index.tensors[r.holder.entry].pieces[r.piece];
    match piece.flat_start {
        // A flat piece is a box-shaped view of the stored elements from its start on.
        Some(start) => piece_data(
            Some(rank),
            rank.bytes(),
            stored.dtype,
            stored.offset + start as usize * stored.dtype.size(),
            &piece.full.extents(),
            piece.local.clone(),
            piece.full.clone(),
        ),
        None => piece_data(
            Some(rank),
            rank.bytes(),
            stored.dtype,
            stored.offset,
            &stored.shape,
            piece.local.clone(),
            piece.full.clone(),
        ),
    }
}

impl<'t> Layout<'t> {
    /// The layout of `logical` in `trace`.
    pub fn new(trace: &'t Trace, logical: &Logical) -> Layout<'t> {
        let mut groups: Vec<Group> = Vec::new();
        let mut exact = false;
        for &holder in &logical.holders {
            let entry = &trace.ranks[holder.rank].index.tensors[holder.entry];
            exact |= entry.exact_replicas;
            for (p, piece) in entry.pieces.iter().enumerate() {
                let r = PieceRef { holder, piece: p };
                match groups.iter_mut().find(|g| g.full == piece.full) {
                    Some(g) => g.replicas.push(r),
                    None => groups.push(Group {
                        full: piece.full.clone(),
                        replicas: vec![r],
                    }),
                }
            }
        }
        groups.sort_by(|a, b| a.full.cmp(&b.full));
        Layout {
            trace,
            full_shape: logical.full_shape.clone(),
            groups,
            exact,
        }
    }

    /// The rank number of a piece.
    fn rank_of(&self, r: PieceRef) -> u64 {
        self.trace.ranks[r.holder.rank].index.rank
    }

    /// The mapped data of a piece.
    pub fn data(&self, r: PieceRef) -> PieceData<'t> {
        data_of(self.trace, r)
    }

    /// Partial overlaps and omissions: empty when the distinct boxes tile the full tensor.
    pub fn inconsistencies(&self) -> Vec<Inconsistency> {
        let mut found = Vec::new();
        let ranks = |g: &Group| {
            let mut r: Vec<u64> = g.replicas.iter().map(|p| self.rank_of(*p)).collect();
            r.dedup();
            r
        };
        for (i, a) in self.groups.iter().enumerate() {
            for b in &self.groups[i + 1..] {
                if let Some(common) = a.full.intersect(&b.full) {
                    found.push(Inconsistency::Overlap {
                        first: a.full.clone(),
                        first_ranks: ranks(a),
                        second: b.full.clone(),
                        second_ranks: ranks(b),
                        common,
                    });
                }
            }
        }
        if let Some(omission) = self.omission(!found.is_empty()) {
            found.push(omission);
        }
        found
    }

    /// The part of the full tensor no box covers, by a grid of every box boundary.
    fn omission(&self, overlapping: bool) -> Option<Inconsistency> {
        let whole = Region::whole(&self.full_shape);
        let covered = self
            .groups
            .iter()
            .fold(0u64, |n, g| n.saturating_add(g.full.volume()));
        if !overlapping && covered == whole.volume() {
            return None;
        }
        let cuts: Vec<Vec<u64>> = (0..self.full_shape.len())
            .map(|d| {
                let mut c: Vec<u64> = vec![0, self.full_shape[d]];
                for g in &self.groups {
                    c.extend(g.full.0[d]);
                }
                c.sort_unstable();
                c.dedup();
                c
            })
            .collect();
        let cells = cuts
            .iter()
            .try_fold(1u64, |n, c| n.checked_mul(c.len() as u64 - 1))
            .unwrap_or(u64::MAX);
        if cells > MAX_CELLS {
            // Too fine a grid: only a tiling short of volume is reported (overlaps already are).
            let missing = whole.volume().saturating_sub(covered);
            return (!overlapping && missing > 0).then_some(Inconsistency::Omission {
                region: whole,
                missing,
            });
        }
        let mut missing = 0u64;
        let mut first = None;
        let mut index = vec![0usize; cuts.len()];
        for _ in 0..cells {
            let cell = Region(
                index
                    .iter()
                    .zip(&cuts)
                    .map(|(&i, c)| [c[i], c[i + 1]])
                    .collect(),
            );
            if cell.volume() > 0
                && !self
                    .groups
                    .iter()
                    .any(|g| g.full.intersect(&cell).is_some())
            {
                missing += cell.volume();
                first.get_or_insert(cell);
            }
            for d in (0..index.len()).rev() {
                index[d] += 1;
                if index[d] + 1 < cuts[d].len() {
                    break;
                }
                index[d] = 0;
            }
        }
        first.map(|region| Inconsistency::Omission { region, missing })
    }

    /// The worst replica disagreement (largest relative error against the box's first
    /// replica), or `None` when no box has two replicas. Replicas declared bit-identical
    /// ([`Layout::exact`]) are compared element by element first: the worst is then one with
    /// differing elements, if any.
    pub fn replica_spread(&self) -> Option<ReplicaSpread> {
        let mut worst: Option<ReplicaSpread> = None;
        for g in &self.groups {
            let first = g.replicas[0];
            for &other in &g.replicas[1..] {
                let pair = [Pair {
                    a: self.data(other),
                    b: self.data(first),
                    region: g.full.clone(),
                }];
                let differing = self.exact.then(|| unequal(&pair));
                let relative_error = if differing == Some(0) {
                    0.0
                } else {
                    sums(&pair).relative_error()
                };
                let spread = ReplicaSpread {
                    region: g.full.clone(),
                    rank: self.rank_of(other),
                    against: self.rank_of(first),
                    relative_error,
                    unequal: differing,
                };
                // Replicas with differing elements first, then the largest relative error.
                let key =
                    |s: &ReplicaSpread| (u8::from(s.unequal.unwrap_or(0) > 0), s.relative_error);
                if worst.as_ref().is_none_or(|w| {
                    let (a, b) = (key(&spread), key(w));
                    a.0 > b.0 || (a.0 == b.0 && a.1 > b.1)
                }) {
                    worst = Some(spread);
                }
            }
        }
        worst
    }

    /// `||self - reference||^2` and `||reference||^2` over the full tensor, each box read from
    /// its first replica. Both layouts must tile the full tensor ([`Layout::inconsistencies`]
    /// empty) and have the same full shape.
    pub fn compare(&self, reference: &Layout<'_>) -> Sums {
        let mut pairs = Vec::new();
        for a in &self.groups {
            for b in &reference.groups {
                if let Some(region) = a.full.intersect(&b.full) {
                    pairs.push(Pair {
                        a: self.data(a.replicas[0]),
                        b: reference.data(b.replicas[0]),
                        region,
                    });
                }
            }
        }
        sums(&pairs)
    }

    /// Bytes of stored data one read of the full tensor takes (each box from one replica).
    pub fn bytes(&self) -> u64 {
        self.groups
            .iter()
            .map(|g| {
                let r = g.replicas[0];
                let dtype = self.trace.ranks[r.holder.rank].stored[r.holder.entry].dtype;
                g.full.volume() * dtype.size() as u64
            })
            .sum()
    }

    /// Drops the mapped pages of every piece from memory (see [`crate::reader::Rank::release`]).
    pub fn release(&self) {
        for g in &self.groups {
            for r in &g.replicas {
                let rank = &self.trace.ranks[r.holder.rank];
                let s = &rank.stored[r.holder.entry];
                let len = s.shape.iter().product::<u64>() as usize * s.dtype.size();
                rank.release(s.offset, s.offset + len);
            }
        }
    }
}
