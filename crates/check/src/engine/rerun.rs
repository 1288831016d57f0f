//! A rank's run, and its run again from the first recv whose read changed (the entry points
//! of propagation; the run itself is [`super::propagate_rank_from`]).

use super::recv::resume_at;
use super::{propagate_rank_from, RankPlacements, Shared};

/// Propagates placements through rank `r`'s graph. `done` holds the other ranks' placements
/// of an earlier pass (for recvs); returns whether some recv read a pending sender.
pub fn propagate_rank(
    sh: &Shared,
    r: usize,
    done: &[Option<std::sync::Arc<RankPlacements>>],
) -> (RankPlacements, bool) {
    propagate_rank_from(sh, r, done, None)
}

/// [`propagate_rank`] again, with `prev` the rank's placements of an earlier run: from the
/// first recv whose read changed ([`resume_at`]), keeping everything before it; `prev`
/// itself where no read changed. Exactly what a full run gives. Returns, with the
/// placements, whether they differ from `prev`'s (its receivers read them again then).
pub fn propagate_rank_again(
    sh: &Shared,
    r: usize,
    done: &[Option<std::sync::Arc<RankPlacements>>],
    prev: RankPlacements,
) -> (RankPlacements, bool) {
    #[cfg(test)]
    if FULL_RERUNS.with(std::cell::Cell::get) {
        let before = prev.places.clone();
        let rp = propagate_rank_from(sh, r, done, None).0;
        let changed = rp.places != before;
        return (rp, changed);
    }
    let Some(start) = resume_at(sh, r, done, &prev) else {
        return (prev, false);
    };
    // A resumed run keeps the placements before `start` as they are (the layout is the
    // graph's, as `prev`'s: `propagate_rank_from` resumes only then), so only the values
    // from `start` on are kept to compare (issue 44: a copy of all of them per run again).
    let g = &sh.program.ranks[r];
    let nd = sh.program.mesh.dims.len();
    let mut total = 0u32;
    let same_layout = prev.offsets.len() == g.nodes.len()
        && g.nodes.iter().zip(&prev.offsets).all(|(n, &o)| {
            let at = o == total;
            total += n.outputs.len() as u32;
            at
        })
        && prev.places.len() == total as usize * nd;
    let from = if same_layout {
        prev.offsets
            .get(start)
            .map_or(prev.places.len(), |&o| o as usize * nd)
    } else {
        0
    };
    let before = prev.places[from..].to_vec();
    let rp = propagate_rank_from(sh, r, done, Some((prev, start))).0;
    let changed = rp.places.len() != from + before.len() || rp.places[from..] != before[..];
    (rp, changed)
}

#[cfg(test)]
thread_local! {
    /// Tests: propagate again from the start (no resume), to compare with resuming.
    pub(crate) static FULL_RERUNS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

thread_local! {
    /// Tests: propagate every rank on its own (no twins), to compare with sharing. Off
    /// outside tests (a constant `false`).
    pub(crate) static NO_TWINS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}
