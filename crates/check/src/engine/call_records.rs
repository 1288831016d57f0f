//! What a call leaves on its outputs once every mesh dim's rule ran: the records one mesh
//! dim's lift settles on the others (shares, folded means, the microbatches' 1/K, a
//! `times_n` division), the cross-mesh pairing check, sums over gathered rows and rings
//! crossing another mesh dim's split; and the run's count of unknown values.

use super::findings::mixed_shards;
use super::gathered_sums::gathered_sums;
use super::run_context::RunContext;
use super::{local_means, RankPlacements, Shared};
use crate::place::Place;
use crate::ring;
use shardproof_ir::ValueId;

/// The call whose records are written, as its rules left it.
pub(super) struct CallRecords<'c> {
    /// The node.
    pub i: usize,
    /// The index of its first output among the rank's values.
    pub base: usize,
    /// Its number of outputs.
    pub nout: usize,
    /// Its tensor inputs.
    pub inputs: &'c [ValueId],
    /// Whether its rule pairs its operands' elements ([`crate::rules::pairs_elements`]).
    pub pairs_elements: bool,
    /// Mesh dims whose all-reduce sum here lifted a replicated share (`scaled`).
    pub lifted_shares: u64,
    /// Mesh dims on which a division the microbatch average read as the 1/K made a term a
    /// share.
    pub microbatch_divisions: u64,
    /// Whether the call is the division by n that made up for a `times_n` dim.
    pub consumed: bool,
    /// Per mesh dim whose folded shares the call reads as shares: the mesh dims still
    /// pending there, and whether the call is the all-reduce that sums them.
    pub folded_reads: &'c [(usize, u64, bool)],
}

/// Writes the records of `call` on rank `r` that read more than one mesh dim's rule.
pub(super) fn after_rules(
    sh: &Shared,
    (r, cx): (usize, &RunContext),
    call: &CallRecords,
    (done, memo): (
        &[Option<std::sync::Arc<RankPlacements>>],
        &mut local_means::Memo,
    ),
    rp: &mut RankPlacements,
) {
    let CallRecords {
        i,
        base,
        nout,
        inputs,
        pairs_elements,
        lifted_shares,
        microbatch_divisions,
        consumed,
        folded_reads,
    } = *call;
    let nd = cx.nd;
    // An all-reduce sum over mesh dim k of a share (`scaled` on k) made up for the
    // division by k's size that left other mesh dims' factor unknown (`share_of`):
    // their pieces are as before the division.
    for k in 0..nd {
        if lifted_shares & (1 << k) == 0 {
            continue;
        }
        for o in 0..nout {
            for m in 0..nd {
                let at = (base + o) * nd + m;
                if m != k && rp.share_of[at] as usize == k + 1 {
                    rp.share_of[at] = 0;
                    // A reduction over part of the rows stays one.
                    rp.scale_unknown[at] = rp.part_rows[at];
                }
            }
        }
    }
    local_means::commit_folded(sh, (r, i), nout, base, (done, memo), folded_reads, rp);
    // One division is the microbatches' 1/K or a share of another mesh dim, not both.
    for k in (0..nd.min(64)).filter(|&k| microbatch_divisions & (1 << k) != 0) {
        for o in 0..nout {
            rp.scaled[(base + o) * nd + k] = false;
            rp.folded_pending[(base + o) * nd + k] = 0;
            rp.folded_summed[(base + o) * nd + k] = 0;
        }
    }
    // The division by n made up for a `times_n` dim: no other mesh dim may take it
    // as its own 1/n as well (`scaled`), or one factor would count twice.
    if consumed {
        for o in 0..nout {
            rp.scaled[(base + o) * nd..(base + o + 1) * nd].fill(false);
            rp.folded_pending[(base + o) * nd..(base + o + 1) * nd].fill(0);
            rp.folded_summed[(base + o) * nd..(base + o + 1) * nd].fill(0);
        }
    }
    if pairs_elements {
        mixed_shards(sh, r, i, inputs, nout, nd, &|v| cx.meta_of(v), rp);
    }
    gathered_sums(&sh.rows.borrow(), inputs, nout, base, nd, rp);
    // A ring's pieces or order on one mesh dim where another splits the same
    // tensor dim: which piece, in which order, would depend on both coordinates.
    for o in 0..nout {
        let at = (base + o) * nd;
        for m in 0..nd {
            if ring::crosses(&rp.places[at..at + nd], m) {
                rp.places[at + m] = Place::Varying;
            }
        }
    }
}

/// The values of `rp` unknown on some mesh dim; a value n times the tensor (`times_n`) is
/// counted only where a reader makes it unknown.
pub(super) fn unknown_values(rp: &RankPlacements, nd: usize) -> usize {
    rp.places
        .chunks(nd.max(1))
        .zip(rp.times_n.chunks(nd.max(1)))
        .filter(|(c, t)| {
            c.iter()
                .zip(t.iter())
                .any(|(&p, &t)| p == Place::Unknown && !t)
        })
        .count()
}
