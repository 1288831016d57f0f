//! Sharing work between ranks (issue 44): a rank whose propagation would read exactly what an
//! earlier rank's read takes that rank's placements ([`Twins`]), and a receiving rank whose
//! recvs now read what another rank's run again read takes its placements ([`Again`]).

use super::*;

/// Ranks whose propagation would read exactly what an earlier rank's read, so that its
/// placements are that rank's (issue 44: dp replicas checked once, never assumed).
///
/// `propagate_rank` reads, for rank `r`: its graph, names and hashes (equal graph classes:
/// equal node for node, names, operators, arguments and inputs; or equal up to
/// point-to-point peers, compared as offsets from the own rank: [`relative_classes`]), its
/// local metas (compared, by pointer first: ranks that load one file share them); the case's
/// input placements of `r` (compared); per mesh dim, its peers' graphs (their classes in
/// coordinate order: compared), which decide the rank-dependent literals, the peers' literal
/// arguments and structure hashes; `r`'s coordinates (recorded per mesh dim as read,
/// [`rules::MeshCoord`]: a twin may differ only on dims the earlier run did not read); its
/// recvs' messages and senders (per recv: the same sender node, the sender's coordinates
/// where they differ from the receiver's, equal on both sides, and the sender's placements
/// of the sent value, equal: what `recv_read` reads); its groups (explicit rank lists read
/// `r`'s coordinates: a program with one is never shared; mesh-dim groups have the same
/// dims and length on every rank); and names `r` in findings (an earlier rank with findings
/// is never a twin's source). The row selections and ring roots it numbers are keyed by
/// graph content, so a twin of an equal graph would number nothing new; graphs equal only
/// up to peers may differ in a ring root's expression (a recv's `src`), so such a twin is
/// taken only from a run that read no ring root at all.
///
/// Graphs equal up to peers read the same everywhere else: their literal arguments differ
/// only in the peers of `send` (whose rule reads no literal) and `recv` (placed from its
/// message), and a comparison of two ranks' expressions (`same_expression`) sees the peers
/// shifted by one rank offset on both sides: a twin and its representative differ only on
/// mesh dims other than the one the comparison runs along, so the two ranks compared there
/// differ by that same offset, and an equality of absolute peers holds for both or neither.
pub(crate) struct Twins {
    /// Whether any sharing is possible (every group spans mesh dims).
    enabled: bool,
    /// Candidate earlier ranks by (relative class, peer classes per mesh dim), with whether
    /// their run read a ring root.
    firsts: HashMap<TwinKey, Vec<(usize, bool)>>,
}

/// A rank's relative class and its peers' per mesh dim, in coordinate order.
pub(crate) type TwinKey = (usize, Vec<Vec<usize>>);

impl Twins {
    pub(crate) fn new(sh: &Shared) -> Twins {
        Twins {
            enabled: sh.groups.values().all(Option::is_some)
                && !engine::NO_TWINS.with(std::cell::Cell::get),
            firsts: HashMap::new(),
        }
    }

    pub(crate) fn key(sh: &Shared, r: usize) -> TwinKey {
        let mesh = &sh.program.mesh;
        let classes = (0..mesh.dims.len())
            .map(|m| {
                engine::peers(mesh, r, m)
                    .into_iter()
                    .map(|p| sh.rel_class[p])
                    .collect()
            })
            .collect();
        (sh.rel_class[r], classes)
    }

    /// Whether every recv of `q` (a later rank, propagated now) reads what the same recv of
    /// `r` read when `r` was propagated (in this first pass, in rank order): the same sender
    /// node; the sender's
    /// coordinates on every mesh dim where they differ from the receiver's (and on the same
    /// dims); a sender not yet propagated then (a later rank: `Unknown`, propagated again
    /// once it is) on both sides, or else the sender's placements of the sent value equal
    /// (the earlier ranks' results do not change during the pass). Where `r`'s run read a
    /// ring root, the senders' graphs must be equal too (a root is keyed by content).
    pub(crate) fn recvs_alike(
        sh: &Shared,
        r: usize,
        q: usize,
        roots_read: bool,
        done: &[Option<std::sync::Arc<RankPlacements>>],
    ) -> bool {
        let mesh = &sh.program.mesh;
        let mine = sh.messages.range((r, 0)..(r + 1, 0));
        let theirs = sh.messages.range((q, 0)..(q + 1, 0));
        if mine.clone().count() != theirs.clone().count() {
            return false;
        }
        mine.zip(theirs)
            .all(|((&(_, i), &(s, j)), (&(_, i2), &(s2, j2)))| {
                if i != i2 || j != j2 || (s == r) != (s2 == q) {
                    return false;
                }
                if s == r {
                    return true;
                }
                let coords = senders_sit_alike(mesh, (r, s), (q, s2));
                let classes = sh.rel_class[s] == sh.rel_class[s2]
                    && (!roots_read || sh.graph_class[s] == sh.graph_class[s2]);
                if !coords || !classes || (s > r) != (s2 > q) {
                    return false;
                }
                if s > r {
                    return true;
                }
                let a = sent_placements(sh, s, j, done);
                a.is_some() && a == sent_placements(sh, s2, j, done)
            })
    }

    /// An earlier rank whose placements are `r`'s, checked against `done` (the earlier
    /// ranks' results); `r` becomes a candidate for later ranks otherwise.
    pub(crate) fn of(
        &self,
        sh: &Shared,
        r: usize,
        done: &[Option<std::sync::Arc<RankPlacements>>],
    ) -> Option<usize> {
        if !self.enabled {
            return None;
        }
        let key = Twins::key(sh, r);
        let mesh = &sh.program.mesh;
        let mine = mesh.coords(r);
        let found = self.firsts.get(&key).and_then(|cands| {
            cands.iter().copied().find(|&(q, roots_read)| {
                let Some(Some(rq)) = done.get(q) else {
                    return false;
                };
                let theirs = mesh.coords(q);
                let coords_unread = (0..mesh.dims.len())
                    .all(|m| mine[m] == theirs[m] || (m < 64 && rq.coord_reads & (1 << m) == 0));
                // Equal graphs (names, operators, arguments, inputs), or equal up to peers
                // with no ring root read, with equal local types.
                (sh.graph_class[q] == sh.graph_class[r]
                    || (sh.rel_class[q] == sh.rel_class[r] && !roots_read))
                    && (std::sync::Arc::ptr_eq(&sh.metas[q], &sh.metas[r])
                        || sh.metas[q] == sh.metas[r])
                    && sh.inputs[q] == sh.inputs[r]
                    && coords_unread
                    && rq.findings.is_empty()
                    && Twins::recvs_alike(sh, q, r, roots_read, done)
            })
        });
        found.map(|(q, _)| q)
    }

    /// Records `r` (propagated on its own; `roots_read`: its run read a ring root) as a
    /// candidate for later ranks.
    pub(crate) fn note(&mut self, sh: &Shared, r: usize, roots_read: bool) {
        if self.enabled {
            self.firsts
                .entry(Twins::key(sh, r))
                .or_default()
                .push((r, roots_read));
        }
    }
}

/// Whether sender `s` of a message to `r` and sender `s2` of the same message to `q` sit
/// alike: on every mesh dim both senders share their receiver's coordinate, or both differ
/// from it where the receivers agree and the senders agree.
pub(crate) fn senders_sit_alike(
    mesh: &shardproof_ir::Mesh,
    (r, s): (usize, usize),
    (q, s2): (usize, usize),
) -> bool {
    let (rc, sc, qc, s2c) = (
        mesh.coords(r),
        mesh.coords(s),
        mesh.coords(q),
        mesh.coords(s2),
    );
    (0..rc.len()).all(|m| {
        (sc[m] == rc[m]) == (s2c[m] == qc[m])
            && (sc[m] == rc[m] || (sc[m] == s2c[m] && rc[m] == qc[m]))
    })
}

/// Sender `s`'s placements of the value its send node `j` sends, with its local-means record,
/// once `s` is propagated.
pub(crate) fn sent_placements(
    sh: &Shared,
    s: usize,
    j: usize,
    done: &[Option<std::sync::Arc<RankPlacements>>],
) -> Option<SentPlacements> {
    let sent = sh.program.ranks[s].nodes[j].inputs().first().copied()?;
    let sp = done.get(s)?.as_ref()?;
    (sp.offsets.len() == sh.program.ranks[s].nodes.len()).then(|| {
        let at = sp.offsets[sent.node] as usize + sent.output;
        (
            sp.of(sent, sh.program.mesh.dims.len()).to_vec(),
            sp.local_means.get(&at).copied(),
        )
    })
}

/// The sender's placements of a sent value, with its local-means record (the recv takes it:
/// `RankPlacements::local_means`).
pub(crate) type SentPlacements = (Vec<Place>, Option<engine::LocalMeanDims>);

/// What a recv of a rank read in its latest run: per message, (recv node, sender rank,
/// send node, the sender's placements of the sent value then; `None`: not yet propagated).
pub(crate) type RecvReads = Vec<(usize, usize, usize, Option<SentPlacements>)>;

/// Ranks propagated again whose run would read exactly what an earlier rank's latest run
/// read, so that its placements are that run's result (issue 44: the pipeline's receivers
/// are propagated again once a later stage's gradients are known, every dp replica alike).
///
/// A run again gives exactly what a full run gives (`propagate_rank_again`), and a full run
/// reads what [`Twins`] lists; here the candidate `q`'s reads are recorded when it ran (its
/// placements in `done` are that run's: a later run replaces both), and `r` takes them only
/// where: the graphs are equal (graph class, not only up to peers) with equal local metas
/// and input placements; `q`'s run read no mesh coordinate where `r`'s differs (its
/// `coord_reads`, kept across resumed runs, cover every run of it); `q` has no finding (a
/// finding names its rank); and every recv reads alike: the same recv and send nodes, a
/// sender that is the rank itself on both sides or else senders with equal graphs whose
/// coordinates differ from the receiver's on the same mesh dims and are equal there
/// (`Twins::recvs_alike`'s rule), and the sender's placements of the sent value `r` reads
/// now equal to what `q` read. Row selections and ring roots are keyed by graph content and
/// the senders' graphs are equal, so `r`'s run would number nothing new.
pub(crate) struct Again {
    /// Whether any sharing is possible (as [`Twins`]).
    enabled: bool,
    /// Per rank: what its latest run again read (`None`: not run again yet).
    reads: Vec<Option<RecvReads>>,
    /// Ranks propagated again, by [`Twins::key`], in the order first met.
    firsts: HashMap<TwinKey, Vec<usize>>,
}

impl Again {
    pub(crate) fn new(sh: &Shared, n: usize) -> Again {
        Again {
            enabled: sh.groups.values().all(Option::is_some)
                && !engine::NO_TWINS.with(std::cell::Cell::get),
            reads: vec![None; n],
            firsts: HashMap::new(),
        }
    }

    /// What rank `r`'s recvs read from `done` now.
    pub(crate) fn reads(
        sh: &Shared,
        r: usize,
        done: &[Option<std::sync::Arc<RankPlacements>>],
    ) -> RecvReads {
        sh.messages
            .range((r, 0)..(r + 1, 0))
            .map(|(&(_, i), &(s, j))| {
                let placed = (s != r).then(|| sent_placements(sh, s, j, done)).flatten();
                (i, s, j, placed)
            })
            .collect()
    }

    /// An earlier rank whose latest run read what `r` reads now (`reads`), with every other
    /// read equal: its placements are `r`'s.
    pub(crate) fn of(
        &self,
        sh: &Shared,
        r: usize,
        reads: &RecvReads,
        done: &[Option<std::sync::Arc<RankPlacements>>],
    ) -> Option<usize> {
        if !self.enabled {
            return None;
        }
        let mesh = &sh.program.mesh;
        let nd = mesh.dims.len();
        let mine = mesh.coords(r);
        let cands = self.firsts.get(&Twins::key(sh, r))?;
        cands.iter().copied().find(|&q| {
            let (Some(Some(rq)), Some(Some(theirs))) = (done.get(q), self.reads.get(q)) else {
                return false;
            };
            let qc = mesh.coords(q);
            let coords_unread =
                (0..nd).all(|m| mine[m] == qc[m] || (m < 64 && rq.coord_reads & (1 << m) == 0));
            let recvs = theirs.len() == reads.len()
                && theirs.iter().zip(reads).all(|(a, b)| {
                    let ((i, s, j, pa), (i2, s2, j2, pb)) = (a, b);
                    if i != i2 || j != j2 || (*s == q) != (*s2 == r) {
                        return false;
                    }
                    if *s == q {
                        return true;
                    }
                    senders_sit_alike(mesh, (q, *s), (r, *s2))
                        && sh.graph_class[*s] == sh.graph_class[*s2]
                        && pa == pb
                });
            q != r
                && sh.graph_class[q] == sh.graph_class[r]
                && (std::sync::Arc::ptr_eq(&sh.metas[q], &sh.metas[r])
                    || sh.metas[q] == sh.metas[r])
                && sh.inputs[q] == sh.inputs[r]
                && coords_unread
                && rq.findings.is_empty()
                && recvs
        })
    }

    /// Records what `r`'s placements in `done` were computed from (its own run again, or a
    /// twin's that read the same).
    pub(crate) fn note(&mut self, sh: &Shared, r: usize, reads: RecvReads) {
        if self.enabled {
            if self.reads[r].is_none() {
                self.firsts.entry(Twins::key(sh, r)).or_default().push(r);
            }
            self.reads[r] = Some(reads);
        }
    }
}
