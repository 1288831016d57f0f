//! Sums over rows an all-gather concatenated ([`gathered_sums`]).

use super::RankPlacements;
use crate::place::Place;
use crate::rows;
use shardproof_ir::ValueId;

/// A sum on mesh dim `m` over rows that an all-gather over mesh dim `g` concatenated
/// (`rows::gathered_over`) counts each of the selection's rows once per coordinate of `g`
/// beside it, so it is the selection's sum only where `g`'s coordinates hold distinct pieces
/// and do not sum again: every input holding such rows on `m` holds, on `g`, the selection
/// whole along the same dim (a frame, [`Place::Selected`]: the pieces gathered were `g`'s rows
/// of one selection), and the output on `g` is a shard or replicated, not a sum. Elsewhere the
/// sum is `Varying`.
pub(super) fn gathered_sums(
    table: &crate::place::RowTable,
    inputs: &[ValueId],
    nout: usize,
    base: usize,
    nd: usize,
    rp: &mut RankPlacements,
) {
    let mut over: Vec<(usize, usize)> = Vec::new();
    for &v in inputs {
        for (m, p) in rp.of(v, nd).iter().enumerate() {
            if let Place::Rows(_, id) = *p {
                if let Some(g) = rows::gathered_over(table, id) {
                    over.push((m, g as usize));
                }
            }
        }
    }
    if over.is_empty() {
        return;
    }
    over.sort_unstable();
    over.dedup();
    for (m, g) in over {
        let framed_on_g = inputs.iter().all(|&v| {
            let places = rp.of(v, nd);
            match places.get(m) {
                Some(Place::Rows(e, id)) if rows::gathered_over(table, *id).is_some() => {
                    matches!(places.get(g), Some(Place::Selected(f, ..)) if f == e)
                }
                _ => true,
            }
        });
        for o in 0..nout {
            let at = (base + o) * nd;
            if !rp.places[at + m].is_partial() {
                continue;
            }
            let distinct = matches!(
                rp.places.get(at + g),
                Some(Place::Shard(_) | Place::Blocked(..) | Place::Replicate)
            );
            if !(framed_on_g && distinct) {
                rp.places[at + m] = Place::Varying;
            }
        }
    }
}
