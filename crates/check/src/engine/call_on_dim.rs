//! One call on one mesh dim, as the checks after its rule read it ([`CallOnDim`]).

use super::findings::LossTerms;
use super::{RankPlacements, Shared};
use crate::place::Place;
use shardproof_ir::{OpName, ValueId};
use shardproof_ops::{Args, Meta};

/// One call on one mesh dim, as the checks after its rule read it (`vocab_proofs`,
/// `collectives`): the rank's run, the call, and how the rule saw its inputs.
#[derive(Clone, Copy)]
pub(super) struct CallOnDim<'s, 'a> {
    /// What the ranks share.
    pub(super) sh: &'s Shared<'a>,
    /// The rank.
    pub(super) r: usize,
    /// The call's node.
    pub(super) i: usize,
    /// The mesh dim.
    pub(super) m: usize,
    /// The mesh's rank (number of dims).
    pub(super) nd: usize,
    /// The call's number of outputs.
    pub(super) nout: usize,
    /// Whether the mesh dim is a pipeline dim (its coordinates run other stages).
    pub(super) stage_dim: bool,
    /// The rank's peers along the mesh dim (itself among them).
    pub(super) peers: &'s [usize],
    /// The operator.
    pub(super) op: &'s OpName,
    /// The operator's rule family.
    pub(super) family: &'static str,
    /// The call's arguments, bound.
    pub(super) bound: &'s Args<'s>,
    /// The call's tensor inputs.
    pub(super) inputs: &'s [ValueId],
    /// The rank's placements so far.
    pub(super) rp: &'s RankPlacements,
    /// An input's placement on the mesh dim, as the rule saw it.
    pub(super) place: &'s dyn Fn(ValueId) -> Place,
    /// A value's local meta.
    pub(super) meta_of: &'s dyn Fn(ValueId) -> Option<Meta>,
    /// The rank's coordinate on a mesh dim, its read recorded (`coord_reads`).
    pub(super) my_coord: &'s dyn Fn(usize) -> usize,
    /// The rank's coordinate on the mesh dim, unrecorded (a claim about every peer).
    pub(super) coord: usize,
    /// Whether the call is an update a vocabulary shard's write-back reads.
    pub(super) is_update: bool,
    /// The loss's terms (a backward all-reduce's license).
    pub(super) loss_terms: &'s LossTerms,
    /// The collective's group name, if any.
    pub(super) group_name: &'s Option<String>,
}

impl CallOnDim<'_, '_> {
    /// Whether the value is a replicated value divided by n on the mesh dim (`scaled`).
    pub(super) fn scaled_of(&self, v: ValueId) -> bool {
        let rp = self.rp;
        rp.scaled[(rp.offsets[v.node] as usize + v.output) * self.nd + self.m]
    }
}
