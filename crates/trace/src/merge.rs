//! Rebuilding a logical full tensor from its ranks' pieces (seed 002, section 4.4): the pieces
//! are grouped by the full box they map (pieces of one box are replicas), the boxes are checked
//! for partial overlap and omission (a part of the full tensor nobody holds), and replicas are
//! checked to agree. Nothing is copied: a [`Layout`] names the pieces, and [`crate::sums`]
//! streams over them.

use crate::format::Region;
use crate::reader::{Holder, Logical, Trace};
use crate::sums::{piece_data, sums, Pair, PieceData, Sums};

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
}

impl<'t> Layout<'t> {
    /// The layout of `logical` in `trace`.
    pub fn new(trace: &'t Trace, logical: &Logical) -> Layout<'t> {
        let mut groups: Vec<Group> = Vec::new();
        for &holder in &logical.holders {
            let entry = &trace.ranks[holder.rank].index.tensors[holder.entry];
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
        }
    }

    /// The rank number of a piece.
    fn rank_of(&self, r: PieceRef) -> u64 {
        self.trace.ranks[r.holder.rank].index.rank
    }

    /// The mapped data of a piece.
    pub fn data(&self, r: PieceRef) -> PieceData<'t> {
        let rank = &self.trace.ranks[r.holder.rank];
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
    /// replica), or `None` when no box has two replicas.
    pub fn replica_spread(&self) -> Option<ReplicaSpread> {
        let mut worst: Option<ReplicaSpread> = None;
        for g in &self.groups {
            let first = g.replicas[0];
            for &other in &g.replicas[1..] {
                let s = sums(&[Pair {
                    a: self.data(other),
                    b: self.data(first),
                    region: g.full.clone(),
                }]);
                let spread = ReplicaSpread {
                    region: g.full.clone(),
                    rank: self.rank_of(other),
                    against: self.rank_of(first),
                    relative_error: s.relative_error(),
                };
                if worst
                    .as_ref()
                    .is_none_or(|w| spread.relative_error > w.relative_error)
                {
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
