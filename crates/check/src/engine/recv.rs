//! What a recv reads: the sender's placements of the sent tensor as the receiver sees them,
//! where a rank's propagation must resume when those reads change, and the state a resumed
//! (or fresh) run starts from.

use super::{RankPlacements, Shared, NONE};
use crate::place::Place;
use crate::ring;
use shardproof_ir::{Graph, ValueId};

/// What the recv of rank `r` reads from the send at node `j` of rank `s`, whose placements
/// are `sender` (`None`, or not yet reached: `Unknown`): per mesh dim, the sender's placement
/// of the sent tensor; a shard that moved along the mesh dim is the sender's piece
/// ([`Place::Rolled`]), a blocked shard or rows that moved `Varying`, a partial `Unknown`.
pub(super) fn recv_read(
    sh: &Shared,
    r: usize,
    s: usize,
    j: usize,
    sender: Option<&RankPlacements>,
) -> Vec<Place> {
    let program = sh.program;
    let mesh = &program.mesh;
    let nd = mesh.dims.len();
    let sent = program.ranks[s].nodes[j].inputs().first().copied();
    match (sender, sent) {
        (Some(sp), Some(v)) if sp.offsets.len() == program.ranks[s].nodes.len() => {
            let (sc, rc) = (mesh.coords(s), mesh.coords(r));
            let sender = &program.ranks[s];
            sp.of(v, nd)
                .iter()
                .enumerate()
                .map(|(m, &p)| match p {
                    Place::Shard(_) | Place::Rolled(..) | Place::Permuted(..) if sc[m] != rc[m] => {
                        let root = sh.ring_roots.borrow_mut().intern(
                            &sender.nodes[v.node].name,
                            v.output,
                            sh.structure[s][v.node],
                            (s, v.node),
                            |q, k| sh.same_expr(s, v.node, q, k),
                        );
                        ring::moved(p, sc[m], rc[m], mesh.dims[m].1, root)
                    }
                    // The sender's own rows (the attention form reads them by its coordinate).
                    Place::Rows(d, id) if sc[m] != rc[m] => {
                        let mut table = sh.rows.borrow_mut();
                        match table.key(id) {
                            Some(crate::place::RowKey::Received { .. }) => Place::Rows(d, id),
                            Some(_) => table
                                .intern(crate::place::RowKey::Received {
                                    parent: id,
                                    from: sc[m],
                                })
                                .map_or(Place::Varying, |id| Place::Rows(d, id)),
                            None => Place::Varying,
                        }
                    }
                    Place::Accrued(id) if sc[m] != rc[m] => crate::attention::key_grads::arrived(
                        &sh.ring_roots.borrow().grads,
                        &sh.rows.borrow(),
                        id,
                        rc[m],
                        mesh.dims[m].1,
                    ),
                    Place::Blocked(..) if sc[m] != rc[m] => Place::Varying,
                    // Another coordinate's piece of a pending sum: whether the receivers'
                    // pieces still sum to the tensor depends on who sends to whom, which no
                    // placement records; `Varying` would let a gather or an all-reduce pass.
                    Place::Partial(_) | Place::Unmasked if sc[m] != rc[m] => Place::Unknown,
                    // Another coordinate's value in a selection's frame: the frame is not
                    // followed through messages.
                    Place::Selected(..) if sc[m] != rc[m] => Place::Varying,
                    p => p,
                })
                .collect()
        }
        _ => vec![Place::Unknown; nd],
    }
}

/// Whether the message rank `r` receives from node `j` of rank `s` is a partial sum's piece
/// that moves along some mesh dim (the recv reads it as `Unknown`).
pub(super) fn moves_partial(
    sh: &Shared<'_>,
    r: usize,
    s: usize,
    j: usize,
    sender: Option<&RankPlacements>,
) -> bool {
    let program = sh.program;
    let nd = program.mesh.dims.len();
    let (Some(sp), Some(v)) = (sender, program.ranks[s].nodes[j].inputs().first().copied()) else {
        return false;
    };
    if sp.offsets.len() != program.ranks[s].nodes.len() {
        return false;
    }
    let (sc, rc) = (program.mesh.coords(s), program.mesh.coords(r));
    sp.of(v, nd)
        .iter()
        .enumerate()
        .any(|(m, p)| p.is_partial() && sc[m] != rc[m])
}

/// Where propagating rank `r` again must start, given its placements `prev` of an earlier
/// run: the first recv from another rank that now reads other placements than it did
/// (everything before it reads the same, so it comes out the same). `None`: nothing changed.
pub(super) fn resume_at(
    sh: &Shared,
    r: usize,
    done: &[Option<std::sync::Arc<RankPlacements>>],
    prev: &RankPlacements,
) -> Option<usize> {
    let nd = sh.program.mesh.dims.len();
    sh.messages
        .range((r, 0)..(r + 1, 0))
        .filter(|(_, &(s, _))| s != r)
        .find(|(&(_, i), &(s, j))| {
            let now = recv_read(sh, r, s, j, done.get(s).and_then(|d| d.as_deref()));
            prev.offsets
                .get(i)
                .is_none_or(|_| prev.of(ValueId::new(i, 0), nd) != now)
        })
        .map(|(&(_, i), _)| i)
}

/// The placements a run of graph `g` (`nd` mesh dims) starts from, and the node it starts
/// at: `resume`'s (an earlier run's placements, and the first node to compute again) with
/// everything from that node on reset to its initial state, where the layout is the graph's;
/// fresh placements from node 0 otherwise.
pub(super) fn start_state(
    g: &Graph,
    nd: usize,
    resume: Option<(RankPlacements, usize)>,
) -> (RankPlacements, usize) {
    let mut offsets = Vec::with_capacity(g.nodes.len());
    let mut total = 0u32;
    for n in &g.nodes {
        offsets.push(total);
        total += n.outputs.len() as u32;
    }
    match resume {
        Some((mut rp, start)) if rp.offsets == offsets => {
            // Everything from `start` on is computed again from its initial state.
            let v0 = offsets.get(start).map_or(total as usize, |&o| o as usize);
            rp.places[v0 * nd..].fill(Place::Unknown);
            rp.origin[v0 * nd..].fill(NONE);
            rp.scaled[v0 * nd..].fill(false);
            rp.times_n[v0 * nd..].fill(false);
            rp.times_factor.retain(|&at, _| at < v0 * nd);
            rp.scale_unknown[v0 * nd..].fill(false);
            rp.share_of[v0 * nd..].fill(0);
            rp.part_rows[v0 * nd..].fill(false);
            rp.folded_pending[v0 * nd..].fill(0);
            rp.folded_summed[v0 * nd..].fill(0);
            rp.lifted_means[v0..].fill(0);
            rp.scattered_factor.retain(|&at, _| at < v0);
            rp.invariant[v0..].fill(false);
            rp.zero[v0..].fill(false);
            rp.constant[v0..].fill(0);
            rp.findings.retain(|f| f.node < start);
            rp.unknown_sources.retain(|&(n, _)| n < start);
            rp.dual_lifts.retain(|&(n, _)| n < start);
            (rp, start)
        }
        _ => (
            RankPlacements {
                offsets,
                places: vec![Place::Unknown; total as usize * nd],
                origin: vec![NONE; total as usize * nd],
                invariant: vec![false; total as usize],
                scaled: vec![false; total as usize * nd],
                times_n: vec![false; total as usize * nd],
                scale_unknown: vec![false; total as usize * nd],
                share_of: vec![0; total as usize * nd],
                part_rows: vec![false; total as usize * nd],
                folded_pending: vec![0; total as usize * nd],
                folded_summed: vec![0; total as usize * nd],
                lifted_means: vec![0; total as usize],
                zero: vec![false; total as usize],
                constant: vec![0; total as usize],
                ..Default::default()
            },
            0,
        ),
    }
}
