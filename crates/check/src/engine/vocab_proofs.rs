//! Vocabulary-parallel proofs at one call on one mesh dim: a lookup's update written back
//! to its shard, a one-hot over the rank's vocabulary range, an embedding gradient's shard,
//! and the masks that make a shard lookup a partial sum, each proven on every peer of the
//! mesh dim (`crate::vocab` reads the graphs).

use super::CallOnDim;
use crate::place::Place;
use crate::rules::Violation;
use shardproof_ir::{Arg, ValueId};
use shardproof_ops::Meta;

/// Applies the vocabulary proofs to the rule's `result` and `violation` at the call `s`;
/// returns why a partial sum of a shard lookup is not proven (its outputs then `Unknown`).
pub(super) fn vocab_proofs(
    s: &CallOnDim,
    result: &mut Vec<Place>,
    violation: &mut Option<Violation>,
) -> Option<String> {
    let CallOnDim {
        sh,
        r,
        i,
        m,
        nd,
        nout,
        stage_dim,
        peers,
        op,
        family,
        bound,
        inputs,
        rp,
        place,
        meta_of,
        my_coord,
        ..
    } = *s;
    let program = sh.program;
    let mesh = &program.mesh;
    let g = &program.ranks[r];
    let coord = s.coord;
    // An update of a vocabulary-shard lookup that is written back where it was
    // read: `Unmasked` until the write-back, which decides.
    if s.is_update && violation.is_some() && inputs.iter().any(|&v| place(v) == Place::Unmasked) {
        *violation = None;
        *result = vec![Place::Unmasked; nout];
    }
    // A vocabulary-range proof's shard is a claim about every coordinate along
    // the mesh dim: each peer must run the same node and prove it with its own
    // coordinate (`proof(peer graph, node, coordinate, replicated, meta)`).
    // Checking this rank alone let a pipeline stage whose tp range happened to
    // be its pp coordinate's block claim `Shard(1)` on `pp` (a false
    // `shape-divisibility` finding on llama3-70b-tiny). A peer's value is
    // replicated on the mesh dim where this rank's value of that name is (a
    // placement on a mesh dim is the group's, the same on every peer).
    type Proof<'p> = dyn Fn(
            &shardproof_ir::Graph,
            usize,
            usize,
            &dyn Fn(ValueId) -> bool,
            &dyn Fn(ValueId) -> Option<Meta>,
        ) -> bool
        + 'p;
    // A proof taken with `peers_prove` is a claim about every coordinate of
    // the group along this mesh dim (each member's graph at its own
    // coordinate), the same whichever member makes it: its read of the rank's
    // own coordinate is not recorded (`coord`, not `my_coord`), so the
    // replicas of a stage that runs it may share one run (`Twins`). A proof
    // of the rank's range alone (`range_proven`) records its read.
    let peers_prove = |proof: &Proof| {
        !stage_dim
            && peers.iter().enumerate().all(|(k, &p)| {
                if p == r {
                    return true;
                }
                let Some(j) = sh.peer_node(r, p, i) else {
                    return false;
                };
                let (pg, pm) = (&program.ranks[p], &sh.metas[p]);
                let replicated_here = |v: ValueId| {
                    sh.names[r]
                        .get(pg.nodes[v.node].name.as_str())
                        .is_some_and(|&q| {
                            rp.of(ValueId::new(q as usize, v.output), nd)[m] == Place::Replicate
                        })
                };
                let peer_meta = |v: ValueId| {
                    pm.get(v.node)
                        .and_then(|o| o.get(v.output))
                        .cloned()
                        .flatten()
                };
                proof(pg, j, k, &replicated_here, &peer_meta)
            })
    };
    if op.name == "index_put"
        && mesh.dims[m].1 > 1
        && inputs.first().is_some_and(|&x| place(x) == Place::Shard(1))
        && crate::vocab::update_shard(
            g,
            i,
            &|| coord,
            |v| rp.of(v, nd)[m] == Place::Replicate,
            meta_of,
        )
        && peers_prove(&|pg, j, k, rep, meta| crate::vocab::update_shard(pg, j, &|| k, rep, meta))
    {
        *violation = None;
        *result = vec![Place::Shard(1); nout];
    }
    // A vocabulary-shard lookup zeroed outside a mask is a partial sum only
    // where the mask is the rank's range (checked on the graph).
    let mut vocab_unproven = None;
    // Whether `mask` is the rank's vocabulary range over `x`'s rows (`indexes`: the mask
    // indexes the rows, `index_put`, rather than selecting them elementwise).
    let range_on_rank = |x: ValueId, mask: ValueId, indexes: bool| {
        crate::vocab::range_proven(
            g,
            x,
            mask,
            indexes,
            &|| my_coord(m),
            |v| rp.of(v, nd)[m] == Place::Replicate,
            |v| rp.of(v, nd)[m].shard_dim(),
            meta_of,
        )
    };
    // The one-hot of ids over the rank's vocabulary range is the rank's columns
    // of the one-hot over the whole vocabulary.
    if matches!(op.name.as_str(), "bitwise_and" | "logical_and")
        && op.namespace == "aten"
        && violation.is_none()
        && inputs.len() == 2
        && mesh.dims[m].1 > 1
    {
        let d = crate::vocab::one_hot_shard(
            g,
            inputs[0],
            inputs[1],
            &|| coord,
            |v| rp.of(v, nd)[m] == Place::Replicate,
            meta_of,
        );
        if let Some(d) = d.filter(|&d| {
            peers_prove(&|pg, j, k, rep, meta| {
                let pin = pg.nodes[j].inputs();
                pin.len() == 2
                    && crate::vocab::one_hot_shard(pg, pin[0], pin[1], &|| k, rep, meta) == Some(d)
            })
        }) {
            *result = vec![Place::shard(d); nout];
        }
    }
    if op.name == "embedding_dense_backward"
        && violation.is_none()
        && mesh.dims[m].1 > 1
        && crate::vocab::embedding_grad_shard(
            g,
            i,
            &|| coord,
            |v| rp.of(v, nd)[m] == Place::Replicate,
            meta_of,
        )
        && peers_prove(&|pg, j, k, rep, meta| {
            crate::vocab::embedding_grad_shard(pg, j, &|| k, rep, meta)
        })
    {
        *result = vec![Place::Shard(0); nout];
    }
    if family == "masked-fill" && violation.is_none() && result.iter().any(|p| p.is_partial()) {
        let x = bound.get("self").and_then(|a| a.as_value());
        let mask = bound.get("mask").and_then(|a| a.as_value());
        if let (Some(x), Some(mask)) = (x, mask) {
            if rp.of(x, nd)[m] == Place::Unmasked {
                let proven = range_on_rank(x, mask, false);
                if let Err(why) = proven {
                    result.iter_mut().for_each(|p| *p = Place::Unknown);
                    vocab_unproven =
                        Some(format!("`{op}` on mesh dim `{}`: {why}", mesh.dims[m].0));
                }
            }
        }
    }
    // The same for `index_put(x, [mask], 0)` (Megatron's
    // `output_parallel[input_mask, :] = 0.0`): the mask must be the rank's range,
    // the values proven zero, the write not accumulating. Before, any
    // rank-dependent mask and any 0-d value made a partial sum (exit 0).
    if op.name == "index_put" && violation.is_none() && result.iter().any(|p| p.is_partial()) {
        if let Some(x) = bound.get("self").and_then(|a| a.as_value()) {
            if rp.of(x, nd)[m] == Place::Unmasked {
                let mask = match bound.get("indices") {
                    Some(Arg::List(items)) if items.len() == 1 => items[0].as_value(),
                    _ => None,
                };
                let zero = bound
                    .get("values")
                    .and_then(|a| a.as_value())
                    .is_some_and(|v| rp.zero[rp.offsets[v.node] as usize + v.output]);
                let accumulates = bound
                    .get("accumulate")
                    .is_some_and(|a| a.as_bool() != Some(false));
                let proven = match mask {
                    _ if !zero => Err("the values written are not proven zero (a \
                                       module constant's value is not in the \
                                       graph)"),
                    _ if accumulates => Err("the write accumulates: the masked \
                                             rows are not zeroed"),
                    None => Err("the rows are not picked by one mask"),
                    Some(mask) => range_on_rank(x, mask, true),
                };
                if let Err(why) = proven {
                    result.iter_mut().for_each(|p| *p = Place::Unknown);
                    vocab_unproven =
                        Some(format!("`{op}` on mesh dim `{}`: {why}", mesh.dims[m].0));
                }
            }
        }
    }

    vocab_unproven
}
