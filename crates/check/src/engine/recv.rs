//! What a recv reads: the sender's placements of the sent tensor as the receiver sees them,
//! where a rank's propagation must resume when those reads change, and the state a resumed
//! (or fresh) run starts from.

use super::{RankPlacements, Shared, NONE};
use crate::place::Place;
use crate::ring;
use shardproof_ir::{Graph, ValueId};

/// A recv (node `i` of rank `r`, its output at value index `base`) takes the message the
/// simulated schedule gives it: the sender's placements as the receiver reads them
/// ([`recv_read`]) and the sender's records where the recv keeps its placement
/// ([`sent_records`]: one microbatch's sum, or a reduce-scatter's shard `f` times the spec's,
/// stays one on this stage). Returns whether a placement is `Unknown` (the sender may not be
/// propagated yet: the receiver runs again).
pub(super) fn take_message(
    sh: &Shared,
    (r, i): (usize, usize),
    base: usize,
    done: &[Option<std::sync::Arc<RankPlacements>>],
    rp: &mut RankPlacements,
) -> bool {
    let Some(&(s, j)) = sh.messages.get(&(r, i)) else {
        rp.unknown_sources.push((
            i,
            "the recv takes no message in the simulated schedule".into(),
        ));
        return false;
    };
    let sender = if s == r {
        Some(&*rp)
    } else {
        done.get(s).and_then(|d| d.as_deref())
    };
    let ps = recv_read(sh, r, s, j, sender);
    let records = sent_records(sh, s, j, sender, &ps);
    let moves = moves_partial(sh, r, s, j, sender);
    if moves {
        rp.unknown_sources.push((
            i,
            "the recv reads another coordinate's piece of a partial sum: whether the \
             receivers' pieces still sum to the tensor is not recorded"
                .into(),
        ));
    }
    records.write(rp, base);
    let nd = sh.program.mesh.dims.len();
    let mut pending = false;
    for (m, q) in ps.into_iter().enumerate() {
        if q == Place::Unknown {
            pending = true;
        }
        rp.places[base * nd + m] = q;
    }
    pending
}

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
            let sender = done.get(s).and_then(|d| d.as_deref());
            let now = recv_read(sh, r, s, j, sender);
            // The records too: a sender run again may keep a placement and change its records.
            prev.offsets.get(i).is_none_or(|&at| {
                prev.of(ValueId::new(i, 0), nd) != now
                    || SentRecords::of(prev, at as usize, nd, &vec![true; nd])
                        != sent_records(sh, s, j, sender, &now)
            })
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
            rp.local_means.retain(|&at, _| at < v0);
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

/// The per-value records (see [`RankPlacements`]) a recv takes from the sent value: on each
/// mesh dim where the recv keeps the sender's placement, the sender's records there (the
/// received tensor is the sender's, so what they say of its pieces holds of the recv's);
/// nothing where the placement changed (a moved shard or partial reads as another
/// placement, which its own rules describe). A record left behind would read the pieces of
/// one microbatch's sum, or a shard `f` times the spec's, as the tensor's.
#[derive(Debug, Clone, PartialEq, Default)]
pub(super) struct SentRecords {
    scaled: Vec<bool>,
    times_n: Vec<bool>,
    times_factor: Vec<Option<u64>>,
    scale_unknown: Vec<bool>,
    share_of: Vec<u8>,
    part_rows: Vec<bool>,
    folded_pending: Vec<u64>,
    folded_summed: Vec<u64>,
    /// The lifted-means marker, on the mesh dims kept only (bit `m`).
    lifted_means: u64,
    /// A reduce-scatter's factor: the received values are the sender's, `f` times the spec's
    /// whatever placement they are read in, so it crosses on every mesh dim.
    scattered_factor: Option<u64>,
    /// The local-means walk's answer for the sent value (`RankPlacements::local_means`): the
    /// received values are the sender's, so it crosses on every mesh dim.
    local_means: Option<super::LocalMeanDims>,
}

impl SentRecords {
    /// The records of value index `at` (`offsets[node] + output`) in `rp` (`nd` mesh dims),
    /// on the mesh dims `kept` only.
    fn of(rp: &RankPlacements, at: usize, nd: usize, kept: &[bool]) -> Self {
        let per_dim = |m: usize| kept.get(m) == Some(&true) && (at + 1) * nd <= rp.places.len();
        let dims = 0..nd;
        // One record's values on the kept mesh dims, its default (no record) elsewhere.
        fn pick<T: Copy + Default>(
            v: &[T],
            at: usize,
            nd: usize,
            per_dim: impl Fn(usize) -> bool,
        ) -> Vec<T> {
            (0..nd)
                .map(|m| {
                    if per_dim(m) {
                        v[at * nd + m]
                    } else {
                        T::default()
                    }
                })
                .collect()
        }
        SentRecords {
            scaled: pick(&rp.scaled, at, nd, per_dim),
            times_n: pick(&rp.times_n, at, nd, per_dim),
            times_factor: dims
                .clone()
                .map(|m| {
                    per_dim(m)
                        .then(|| rp.times_factor.get(&(at * nd + m)).copied())
                        .flatten()
                })
                .collect(),
            scale_unknown: pick(&rp.scale_unknown, at, nd, per_dim),
            share_of: pick(&rp.share_of, at, nd, per_dim),
            part_rows: pick(&rp.part_rows, at, nd, per_dim),
            folded_pending: pick(&rp.folded_pending, at, nd, per_dim),
            folded_summed: pick(&rp.folded_summed, at, nd, per_dim),
            lifted_means: rp.lifted_means.get(at).map_or(0, |&bits| {
                dims.filter(|&m| m < 64 && per_dim(m))
                    .fold(0, |a, m| a | (bits & (1 << m)))
            }),
            scattered_factor: rp.scattered_factor.get(&at).copied(),
            local_means: rp.local_means.get(&at).copied(),
        }
    }

    /// Writes the records onto value index `at` of `rp`.
    pub(super) fn write(&self, rp: &mut RankPlacements, at: usize) {
        let nd = self.scaled.len();
        for m in 0..nd {
            let i = at * nd + m;
            rp.scaled[i] = self.scaled[m];
            rp.times_n[i] = self.times_n[m];
            match self.times_factor[m] {
                Some(f) => rp.times_factor.insert(i, f),
                None => rp.times_factor.remove(&i),
            };
            rp.scale_unknown[i] = self.scale_unknown[m];
            rp.share_of[i] = self.share_of[m];
            rp.part_rows[i] = self.part_rows[m];
            rp.folded_pending[i] = self.folded_pending[m];
            rp.folded_summed[i] = self.folded_summed[m];
        }
        rp.lifted_means[at] = self.lifted_means;
        match self.scattered_factor {
            Some(f) => rp.scattered_factor.insert(at, f),
            None => rp.scattered_factor.remove(&at),
        };
        match self.local_means {
            Some(d) => rp.local_means.insert(at, d),
            None => rp.local_means.remove(&at),
        };
    }
}

/// The records the recv of rank `r` takes from the send at node `j` of rank `s` (placements
/// `sender`), given what it reads there (`read`, from [`recv_read`]): those of the mesh dims
/// where `read` is the sender's placement. None from a sender not reached.
pub(super) fn sent_records(
    sh: &Shared,
    s: usize,
    j: usize,
    sender: Option<&RankPlacements>,
    read: &[Place],
) -> SentRecords {
    let program = sh.program;
    let nd = program.mesh.dims.len();
    let sent = program.ranks[s].nodes[j].inputs().first().copied();
    match (sender, sent) {
        (Some(sp), Some(v)) if sp.offsets.len() == program.ranks[s].nodes.len() => {
            let kept: Vec<bool> = sp
                .of(v, nd)
                .iter()
                .zip(read)
                .map(|(p, q)| p == q && *q != Place::Unknown)
                .collect();
            SentRecords::of(sp, sp.offsets[v.node] as usize + v.output, nd, &kept)
        }
        _ => SentRecords::of(&RankPlacements::default(), 0, nd, &vec![false; nd]),
    }
}

/// Whether recvs `x` and `y` of rank `r` take one expression of one tensor up to the rows
/// they select: both messages come from one sender, whose sent values are the same expression
/// except for pairs of slices, each pair of one input (so each selects from the same tensor),
/// all with the same bounds (so each picks the same two selections; the receiver's rows
/// records say which microbatch each is). Two messages of equal rows records may be slices
/// of two tensors (rows 0..4 of `a`, 4..8 of `b`), whose sums cover neither.
pub(super) fn received_alike(sh: &Shared, r: usize, x: usize, y: usize) -> bool {
    received_alike_within(sh, r, x, y, 0)
}

/// How many messages back [`received_alike`] follows a sent value's own recvs (a chain of
/// pipeline stages, a backward pass's gradients); deeper pairs are not alike.
const ALIKE_DEPTH: usize = 16;

/// [`received_alike`] at `depth` messages back: a pair of recvs in the senders' values is
/// alike where their own messages are.
fn received_alike_within(sh: &Shared, r: usize, x: usize, y: usize, depth: usize) -> bool {
    if x == y {
        return true;
    }
    if depth > ALIKE_DEPTH {
        return false;
    }
    let (Some(&(s, jx)), Some(&(sy, jy))) = (sh.messages.get(&(r, x)), sh.messages.get(&(r, y)))
    else {
        return false;
    };
    let g = &sh.program.ranks[s];
    let (Some(vx), Some(vy)) = (
        g.nodes[jx].inputs().first().copied(),
        g.nodes[jy].inputs().first().copied(),
    ) else {
        return false;
    };
    if s != sy || vx.output != vy.output {
        return false;
    }
    let slice_args = |n: usize| match &g.nodes[n].kind {
        shardproof_ir::NodeKind::Call { op, args, kwargs } if op.name == "slice" => {
            Some((args, kwargs))
        }
        _ => None,
    };
    // The bounds of the first pair of slices that differ: every other such pair must match.
    let selection = std::cell::RefCell::new(None);
    let is_recv = |n: usize| g.nodes[n].op().is_some_and(|o| o.name == "recv");
    let leaf = |a: usize, b: usize| match (slice_args(a), slice_args(b)) {
        _ if is_recv(a) && is_recv(b) => Some(received_alike_within(sh, s, a, b, depth + 1)),
        (Some((aa, ka)), Some((ab, kb))) if aa.get(1..) != ab.get(1..) || ka != kb => {
            let bounds = (
                aa.get(1..).map(<[_]>::to_vec),
                ab.get(1..).map(<[_]>::to_vec),
            );
            let mut first = selection.borrow_mut();
            let same_bounds = match &*first {
                None => {
                    *first = Some(bounds);
                    true
                }
                Some(seen) => *seen == bounds,
            };
            Some(
                same_bounds
                    && g.nodes[a].inputs() == g.nodes[b].inputs()
                    && ka.is_empty()
                    && kb.is_empty(),
            )
        }
        _ => None,
    };
    let mut memo = super::ExprMemo::default();
    super::same_expression_upto(
        g,
        None,
        vx.node,
        g,
        None,
        vy.node,
        &mut memo,
        &leaf,
        &|_, _| false,
    )
}
