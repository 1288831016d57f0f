//! Placement propagation over every rank graph of a program, with the operator rules of
//! [`crate::rules`].

use crate::place::{Place, Red};
use crate::ring::{self, RingMode};
use crate::rows::{self, RowsMode};
use crate::rules::{self, Ctx, Exempt, Literals};
use shardproof_ir::{Arg, NodeKind, OpMeaning, OpName, ValueId};
use shardproof_ops::{Args, Meta, NoValues, OpClass, OpDef, Registry};
use std::collections::HashMap;

mod findings;
mod recv;
mod runs;
mod scaling;
mod shared;

pub(crate) use findings::group_reducing;
use findings::{constant_output, mixed_shards, plain_rename, raw_finding, zero_output, LossTerms};
use recv::{moves_partial, recv_read, resume_at};
use scaling::{partial_scaling, share_of_other_dim, Read, Scaling};
pub use shared::*;

/// No origin recorded.
pub(crate) const NONE: u32 = u32::MAX;

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

fn propagate_rank_from(
    sh: &Shared,
    r: usize,
    done: &[Option<std::sync::Arc<RankPlacements>>],
    resume: Option<(RankPlacements, usize)>,
) -> (RankPlacements, bool) {
    let program = sh.program;
    let g = &program.ranks[r];
    let mesh = &program.mesh;
    let nd = mesh.dims.len();
    let mesh_sizes: Vec<usize> = mesh.dims.iter().map(|d| d.1).collect();
    let reg = Registry::builtin();
    let coords = mesh.coords(r);
    // The mesh dims whose coordinate this run reads (kept from an earlier run resumed): a
    // rank whose run reads none of the dims where another rank's coordinates differ, and
    // whose other reads are the same, gets the same placements (`propagate`).
    let coord_read = std::cell::Cell::new(resume.as_ref().map_or(0, |(rp, _)| rp.coord_reads));
    let my_coord = |m: usize| {
        coord_read.set(coord_read.get() | 1u64.checked_shl(m as u32).unwrap_or(0));
        coords[m]
    };
    let mut offsets = Vec::with_capacity(g.nodes.len());
    let mut total = 0u32;
    for n in &g.nodes {
        offsets.push(total);
        total += n.outputs.len() as u32;
    }
    let (mut rp, start) = match resume {
        Some((mut rp, start)) if rp.offsets == offsets => {
            // Everything from `start` on is computed again from its initial state.
            let v0 = offsets.get(start).map_or(total as usize, |&o| o as usize);
            rp.places[v0 * nd..].fill(Place::Unknown);
            rp.origin[v0 * nd..].fill(NONE);
            rp.scaled[v0 * nd..].fill(false);
            rp.times_n[v0 * nd..].fill(false);
            rp.scale_unknown[v0 * nd..].fill(false);
            rp.share_of[v0 * nd..].fill(0);
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
                zero: vec![false; total as usize],
                constant: vec![0; total as usize],
                ..Default::default()
            },
            0,
        ),
    };
    let mut pending = false;
    let metas = &sh.metas[r];
    let meta_of = |v: ValueId| {
        metas
            .get(v.node)
            .and_then(|o| o.get(v.output))
            .cloned()
            .flatten()
    };
    let peer_list: Vec<Vec<usize>> = (0..nd).map(|m| peers(mesh, r, m)).collect();
    // Per mesh dim, the peers whose literals may differ from this rank's at a node (`varies`
    // below): a peer whose graph is of `r`'s class and shares `r`'s literal hashes has node
    // `i` with `r`'s literal, and peers of one class sharing one literal table give one
    // answer (`peer_node` is a function of the classes), so one of each is asked (issue 44:
    // asking all 16 dp replicas at every node was a tenth of the check).
    // With each, whether its graph is aligned with `r`'s (`Shared::aligned`): its node of
    // `i` is `i` or none, so an equal literal at `i` answers without looking the node up.
    let literal_peers: Vec<Vec<(usize, bool)>> = peer_list
        .iter()
        .map(|ps| {
            let key = |p: usize| (sh.graph_class[p], std::sync::Arc::as_ptr(&sh.literals[p]));
            let mut seen = vec![key(r)];
            ps.iter()
                .copied()
                .filter(|&p| {
                    let k = key(p);
                    let new = !seen.contains(&k);
                    if new {
                        seen.push(k);
                    }
                    new
                })
                .map(|p| (p, sh.aligned(r, p)))
                .collect()
        })
        .collect();
    let pipeline_dims = mesh
        .dims
        .iter()
        .enumerate()
        .filter(|&(k, _)| crate::is_pipeline_dim(mesh, k) && k < 64)
        .fold(0u64, |a, (k, _)| a | (1 << k));
    let loss_terms = LossTerms::of(g, metas);
    // Updates `index(X, I) ± W` that an `index_put(X, I, ..)` writes back: the read of a
    // vocabulary shard is checked at the write-back (`vocab::update_shard`), not at the update.
    let updates = crate::vocab::update_values(g);
    let mut dual_used: HashMap<String, usize> = HashMap::new();
    let mut rule_of: HashMap<&OpName, Option<&'static rules::Rule>> = HashMap::new();
    let mut def_of: HashMap<&OpName, Option<&OpDef>> = HashMap::new();
    let mut dual_lifts = std::mem::take(&mut rp.dual_lifts);
    for (_, group) in &dual_lifts {
        *dual_used.entry(group.clone()).or_insert(0) += 1;
    }
    // A graph that writes some buffer in place (`add_`, `copy_`) may fill a zero tensor
    // after it is made: no value of it is taken to be zero.
    let mutates = g.nodes.iter().any(|n| {
        n.op()
            .is_some_and(|op| op.name.ends_with('_') && !op.name.ends_with("__"))
    });
    for (i, node) in g.nodes.iter().enumerate().skip(start) {
        let base = rp.offsets[i] as usize;
        let nout = node.outputs.len();
        let set = |rp: &mut RankPlacements, o: usize, m: usize, p: Place| {
            rp.places[(base + o) * nd + m] = p;
        };
        let given = if matches!(node.kind, NodeKind::Input) {
            None
        } else {
            sh.inputs[r].get(&ValueId::new(i, 0))
        };
        if let Some(ps) = given {
            // A cut: the case gives this value, its producers are not checked.
            for (m, p) in ps.iter().enumerate() {
                set(&mut rp, 0, m, *p);
            }
            continue;
        }
        match &node.kind {
            NodeKind::Input => {
                match sh.inputs[r].get(&ValueId::new(i, 0)) {
                    Some(ps) => {
                        for (m, p) in ps.iter().enumerate() {
                            set(&mut rp, 0, m, *p);
                            if p.is_partial() {
                                rp.origin[base * nd + m] = i as u32;
                            }
                        }
                        if ps.contains(&Place::Unknown) {
                            rp.unknown_sources.push((i, "its layout is an expression over rank tensors, which the checker does not read".into()));
                        }
                    }
                    None => rp
                        .unknown_sources
                        .push((i, "the case gives this input no layout".into())),
                }
                rp.invariant[base] =
                    meta_of(ValueId::new(i, 0)).is_some_and(|m| !m.dtype.is_float());
                continue;
            }
            NodeKind::Constant { attr } => {
                // A value the case states holds on every rank: one literal in every element.
                let stated = sh.constants.get(attr).copied();
                for o in 0..nout {
                    for m in 0..nd {
                        set(&mut rp, o, m, Place::Replicate);
                    }
                    rp.invariant[base + o] = true;
                    if !mutates && stated.is_some() {
                        rp.zero[base + o] = stated == Some(0.0);
                        rp.constant[base + o] = u64::MAX;
                    }
                }
                continue;
            }
            NodeKind::Call { op, args, kwargs } => {
                let inputs = node.inputs();
                let inv = inputs
                    .iter()
                    .all(|v| rp.invariant[rp.offsets[v.node] as usize + v.output]);
                for o in 0..nout {
                    rp.invariant[base + o] =
                        inv || meta_of(ValueId::new(i, o)).is_some_and(|m| !m.dtype.is_float());
                }
                // Operator names resolve once per run: formatting them per node was a tenth
                // of the time.
                let meaning = if sh.custom.is_empty() {
                    None
                } else {
                    sh.custom
                        .get(&op.to_string())
                        .or_else(|| sh.custom.get(&op.base()))
                };
                // A declared operator that only renames a registered one (a plan's in-place
                // `add_` declared as `aten.add.Tensor($0, $1)`) takes that operator's rule.
                let renamed = meaning
                    .filter(|_| kwargs.is_empty())
                    .and_then(|m| plain_rename(m, args.len()));
                if let Some(meaning) = meaning.filter(|_| renamed.is_none()) {
                    match (meaning, inputs.first()) {
                        (OpMeaning::Identity, Some(&v)) => {
                            for m in 0..nd {
                                let p = rp.of(v, nd)[m];
                                for o in 0..nout {
                                    set(&mut rp, o, m, p);
                                }
                            }
                        }
                        _ => rp.unknown_sources.push((i, format!("`{op}` is declared by a decomposition, which the checker does not expand"))),
                    }
                    continue;
                }
                let op = renamed.unwrap_or(op);
                // Registry lookups format the operator's name: once per operator.
                let Some(def) = *def_of.entry(op).or_insert_with(|| reg.get(op)) else {
                    rp.unknown_sources
                        .push((i, format!("`{op}` is not a known operator")));
                    continue;
                };
                if def.class == OpClass::PointToPoint && op.name == "recv" {
                    match sh.messages.get(&(r, i)) {
                        Some(&(s, j)) => {
                            let sender = if s == r {
                                Some(&rp)
                            } else {
                                done.get(s).and_then(|d| d.as_deref())
                            };
                            let ps = recv_read(sh, r, s, j, sender);
                            if moves_partial(sh, r, s, j, sender) {
                                rp.unknown_sources.push((
                                    i,
                                    "the recv reads another coordinate's piece of a partial sum: \
                                     whether the receivers' pieces still sum to the tensor is not \
                                     recorded"
                                        .into(),
                                ));
                            }
                            for (m, q) in ps.into_iter().enumerate() {
                                if q == Place::Unknown {
                                    pending = true;
                                }
                                set(&mut rp, 0, m, q);
                            }
                        }
                        None => rp.unknown_sources.push((
                            i,
                            "the recv takes no message in the simulated schedule".into(),
                        )),
                    }
                    continue;
                }
                let rule = *rule_of.entry(op).or_insert_with(|| rules::rule(&op.base()));
                let Some(rule) = rule else {
                    rp.unknown_sources
                        .push((i, format!("no placement rule for `{}`", op.base())));
                    continue;
                };
                let bound = match Args::bind(&def.schema, args, kwargs, &NoValues) {
                    Ok(b) => b,
                    Err(e) => {
                        rp.unknown_sources
                            .push((i, format!("arguments do not bind: {e}")));
                        continue;
                    }
                };
                // A value n times the tensor (`times_n`, an all-reduce sum of pieces that
                // average to it): `Unknown` to every rule; a copy or view keeps the record,
                // a division by n that the spec does not make gives `Replicate()`.
                let mut consumed = false;
                if nd > 0 && inputs.len() == 1 {
                    let v = inputs[0];
                    for m in 0..nd {
                        if !rp.times_n[(rp.offsets[v.node] as usize + v.output) * nd + m] {
                            continue;
                        }
                        let stage_dim = m < 64 && crate::is_pipeline_dim(mesh, m);
                        // Several mesh dims n times it (an all-reduce over a group spanning
                        // them): only a division by the product of their sizes makes up for
                        // them (one mesh dim's size would leave it n times the tensor: was
                        // taken as `Replicate()` on each, a false holds).
                        let all_n: usize = (0..nd)
                            .filter(|&k| {
                                rp.times_n[(rp.offsets[v.node] as usize + v.output) * nd + k]
                                    && !crate::is_pipeline_dim(mesh, k)
                            })
                            .map(|k| mesh.dims[k].1)
                            .product();
                        let by_inverse = |n: usize| {
                            partial_scaling(
                                op.name.as_str(),
                                bound.get("other").and_then(|a| a.as_f64()),
                                n as f64,
                                sh.has_spec,
                                sh.spec_scalings.get(node.name.as_str()).copied(),
                                Read::TimesN,
                            ) == Scaling::ByInverseN
                        };
                        if rules::moves_values(rule.family) {
                            for o in 0..nout {
                                rp.times_n[(base + o) * nd + m] = true;
                            }
                        } else if !stage_dim
                            && matches!(op.name.as_str(), "mul" | "div")
                            && by_inverse(all_n)
                        {
                            for o in 0..nout {
                                set(&mut rp, o, m, Place::Replicate);
                            }
                            consumed = true;
                        } else {
                            rp.unknown_sources.push((
                                i,
                                format!(
                                    "`{}` on mesh dim `{}` reads a tensor that is n times its \
                                     value on every rank (an all-reduce sum of pieces that \
                                     average to it): only a division by n, or a copy or view, \
                                     is followed",
                                    op.base(),
                                    mesh.dims[m].0
                                ),
                            ));
                        }
                    }
                }
                // An input unknown on every mesh dim: every rule call below is skipped (the
                // outputs stay `Unknown`), and the zero and constant records of the outputs
                // are read only by calls that have them as inputs, skipped too. Only the
                // cross-mesh pairing check reads the known dims: run it, skip the rest.
                if nd > 0
                    && (0..nd).all(|m| inputs.iter().any(|&v| rp.of(v, nd)[m] == Place::Unknown))
                {
                    if rules::pairs_elements(rule.family) {
                        mixed_shards(sh, r, i, &inputs, nout, nd, &meta_of, &mut rp);
                    }
                    continue;
                }
                let outs: Vec<Option<Meta>> =
                    (0..nout).map(|o| meta_of(ValueId::new(i, o))).collect();
                if !mutates && zero_output(&op.name, rule.family, &bound, &inputs, &rp) {
                    rp.zero[base..base + nout].fill(true);
                }
                if !mutates {
                    let c = constant_output(
                        &op.name,
                        rule.family,
                        &bound,
                        &inputs,
                        &rp,
                        &meta_of,
                        outs.first().and_then(|m| m.as_ref()),
                    );
                    rp.constant[base..base + nout].fill(c);
                }
                let group_name = (def.class == OpClass::Collective)
                    .then(|| {
                        match bound
                            .schema()
                            .index_of("group_name")
                            .and_then(|_| bound.get("group_name"))
                        {
                            Some(Arg::Str(s)) => Some(s),
                            _ => None,
                        }
                    })
                    .flatten();
                let group = if def.class == OpClass::Collective {
                    let name = match bound
                        .schema()
                        .index_of("group_name")
                        .and_then(|_| bound.get("group_name"))
                    {
                        Some(Arg::Str(s)) => s,
                        _ => String::new(),
                    };
                    let dims = match sh.groups.get(&name) {
                        Some(Some(d)) => Some(d.clone()),
                        Some(None) => {
                            // Explicit rank lists: the dims along which the caller's group varies.
                            program
                                .group(&name)
                                .and_then(|pg| pg.group_of(r))
                                .map(|members| {
                                    (0..nd)
                                        .filter(|&m| {
                                            members.iter().any(|&x| mesh.coords(x)[m] != coords[m])
                                        })
                                        .collect()
                                })
                        }
                        None if nd <= 1 => Some((0..nd).collect()),
                        None => None,
                    };
                    let len = program
                        .group(&name)
                        .and_then(|pg| pg.group_of(r))
                        .map_or(program.ranks.len(), <[usize]>::len);
                    Some((dims.unwrap_or_default(), len))
                } else {
                    None
                };
                let my_lit = sh.literals[r][i];
                let name = node.name.as_str();
                // The same node on another rank: the same name calling the same operator on
                // inputs of the same names (graphs that differ per rank, as where a replicated
                // term is counted on some ranks only, shift the names of the nodes after it).
                let peer_node = |p: usize| sh.peer_node(r, p, i);
                // Only views read the spec's shapes.
                // Only views read the spec's shapes.
                let global_view = if rule.family == "view" {
                    sh.view_matches[r][i]
                        .and_then(|j| sh.spec_views.shapes.get(&(j as usize)))
                        .map(|(_, gi, go)| (gi.as_slice(), go.as_slice()))
                } else {
                    None
                };
                // Mesh dims whose all-reduce sum here lifted a replicated share (`scaled`).
                let mut lifted_shares = 0u64;
                for m in 0..nd {
                    // An input unknown on this mesh dim: the rule is not called (below, after
                    // the ring and rows readings, which keep `Unknown` as it is). Skipped
                    // first, before the peers' literals are compared, except where a ring
                    // placement meets it (its reading numbers the ring's root).
                    if inputs.iter().any(|&v| rp.of(v, nd)[m] == Place::Unknown)
                        && !inputs.iter().any(|&v| {
                            matches!(rp.of(v, nd)[m], Place::Rolled(..) | Place::Permuted(..))
                        })
                    {
                        continue;
                    }
                    // A pipeline dim's coordinates run other stages' programs: a node of the same
                    // name there is another tensor, never a piece of this one, so no rule reads a
                    // peer along it (literals, slice starts, range proofs, term structure). The
                    // peers of every other mesh dim run the same program.
                    let stage_dim = m < 64 && pipeline_dims & (1 << m) != 0;
                    let varies = mesh.dims[m].1 > 1
                        && !stage_dim
                        && literal_peers[m].iter().any(|&(p, aligned)| {
                            (!aligned || sh.literals[p][i] != my_lit)
                                && peer_node(p).is_some_and(|j| sh.literals[p][j] != my_lit)
                        });
                    let zero_of = |v: ValueId| rp.zero[rp.offsets[v.node] as usize + v.output];
                    let constant_of =
                        |v: ValueId| rp.constant[rp.offsets[v.node] as usize + v.output];
                    let scaled_of =
                        |v: ValueId| rp.scaled[(rp.offsets[v.node] as usize + v.output) * nd + m];
                    let blocked_ok = rules::takes_blocked(rule.family);
                    // Gathered pieces in another arrangement: only copies, views and
                    // permutes follow them; any other rule sees a tensor of no known layout.
                    let gathered_ok = matches!(
                        rule.family,
                        "linear-unary" | "view" | "transpose" | "permute"
                    );
                    // A partial sum with a split dim recorded: only views, permutes, copies
                    // and the reduce-scatter read the record; to the others it is a partial.
                    let split_ok = gathered_ok || rule.family == "reduce-scatter";
                    // Ring placements: the rule sees them as their base where the operator
                    // keeps or drops the ring's order, as `Varying` otherwise.
                    let ring_mode = if inputs.iter().any(|&v| {
                        matches!(rp.of(v, nd)[m], Place::Rolled(..) | Place::Permuted(..))
                    }) {
                        ring::ring_mode(
                            rule.family,
                            &op.name,
                            &bound,
                            mesh.dims[m].1,
                            |v| rp.of(v, nd)[m],
                            meta_of,
                            |v: ValueId| {
                                sh.ring_roots.borrow_mut().intern(
                                    &g.nodes[v.node].name,
                                    v.output,
                                    sh.structure[r][v.node],
                                    (r, v.node),
                                    |q, k| sh.same_expr(r, v.node, q, k),
                                )
                            },
                            outs.first()
                                .and_then(|mm| mm.as_ref())
                                .map_or(0, |mm| mm.shape.len()),
                        )
                    } else {
                        RingMode::None
                    };
                    let raw_place = |v: ValueId| match ring::seen(rp.of(v, nd)[m], ring_mode) {
                        Place::Blocked(..) if !blocked_ok => Place::Varying,
                        Place::Stacked(_) | Place::Gathered(..) if !gathered_ok => Place::Varying,
                        Place::PartialSplit(..) | Place::PartialStacked(_) if !split_ok => {
                            Place::Partial(Red::Sum)
                        }
                        p => p,
                    };
                    // Most calls meet no rows: skip reading their arguments again.
                    let rows_mode = if inputs
                        .iter()
                        .any(|&v| matches!(rp.of(v, nd)[m], Place::Rows(..)))
                    {
                        rows::rows_mode(rule.family, &bound, raw_place, meta_of, |id| {
                            sh.rows.borrow().key(id)
                        })
                    } else {
                        RowsMode::None
                    };
                    let place = |v: ValueId| match (raw_place(v), rows_mode) {
                        (Place::Rows(d, _), RowsMode::AsShard { blocks, .. }) => {
                            Place::blocked(d as usize, blocks as usize)
                        }
                        (Place::Rows(..), RowsMode::Own) => raw_place(v),
                        (Place::Rows(..), _) => Place::Varying,
                        (p, _) => p,
                    };
                    if inputs.iter().any(|&v| place(v) == Place::Unknown) {
                        continue;
                    }
                    // A pipeline stage's share of one spec sum (`rules::stage_shares`): the
                    // all-reduce over the stages sees it as the partial sum it is.
                    let share = stage_dim
                        && group.as_ref().is_some_and(|(d, _)| d.contains(&m))
                        && sh.stage_shares.get(&(r, i)).is_some();
                    let place = |v: ValueId| match place(v) {
                        Place::Varying if share && inputs.first() == Some(&v) => {
                            Place::Partial(Red::Sum)
                        }
                        p => p,
                    };
                    // Whether the collective's input had its dim 0 made by a view that
                    // regrouped dims (dim 0 a flattening: ZeRO's gradient relayout).
                    let regrouped = group.is_some()
                        && inputs.first().is_some_and(|&v| {
                            let NodeKind::Call { op: pop, .. } = &g.nodes[v.node].kind else {
                                return false;
                            };
                            let src = g.nodes[v.node].inputs().first().copied();
                            matches!(
                                pop.base().as_str(),
                                "aten.view" | "aten.reshape" | "aten._unsafe_view" | "aten.flatten"
                            ) && src.is_some_and(|s| {
                                let d0 =
                                    |x: ValueId| meta_of(x).and_then(|m| m.shape.first().copied());
                                d0(s) != d0(v)
                            })
                        });
                    // Rows on other mesh dims count there as shards (a view merging them with
                    // this mesh dim's shard reads no layout then); on this one, as the rule
                    // sees them.
                    let input_places: Vec<Place> = inputs.first().map_or_else(Vec::new, |&v| {
                        rp.of(v, nd)
                            .iter()
                            .enumerate()
                            .map(|(k, &p)| match p {
                                _ if k == m => place(v),
                                Place::Rows(d, _) => Place::Shard(d),
                                Place::Rolled(..) | Place::Permuted(..) => Place::Varying,
                                p => p,
                            })
                            .collect()
                    });
                    let group_dims: &[usize] = match &group {
                        Some((dims, _)) => dims,
                        None => &[],
                    };
                    // A peer's own call of this operator, its arguments bound (never along a
                    // pipeline dim, whose stages run other programs).
                    let peer_args = |p: usize| {
                        if stage_dim {
                            return None;
                        }
                        let j = if p == r { Some(i) } else { peer_node(p) }?;
                        let NodeKind::Call { args, kwargs, .. } = &program.ranks[p].nodes[j].kind
                        else {
                            return None;
                        };
                        let b = Args::bind(&def.schema, args, kwargs, &NoValues).ok()?;
                        Some(b)
                    };
                    let peer_ints = |arg: &str| -> Vec<Option<i64>> {
                        peer_list[m]
                            .iter()
                            .map(|&p| {
                                let b = peer_args(p)?;
                                b.schema().index_of(arg)?;
                                b.get(arg).and_then(|a| a.as_int())
                            })
                            .collect()
                    };
                    let peer_int_lists = |arg: &str| -> Vec<Option<Vec<i64>>> {
                        peer_list[m]
                            .iter()
                            .map(|&p| {
                                let b = peer_args(p)?;
                                b.schema().index_of(arg)?;
                                b.get(arg).and_then(|a| a.as_int_list())
                            })
                            .collect()
                    };
                    let (in_group, group_len) = match &group {
                        Some((dims, len)) => (dims.contains(&m), *len),
                        None => (false, 1),
                    };
                    let by_factors = std::cell::Cell::new(false);
                    let rows_dims = inputs.first().map_or(0u64, |&v| {
                        rp.of(v, nd)
                            .iter()
                            .enumerate()
                            .filter(|&(k, p)| {
                                matches!(p, Place::Rows(..))
                                    && k < 64
                                    && (k != m || matches!(rows_mode, RowsMode::AsShard { .. }))
                            })
                            .fold(0u64, |a, (k, _)| a | (1 << k))
                    });
                    let ctx = Ctx {
                        args: &bound,
                        rows_dims,
                        pipeline_dims,
                        by_factors: &by_factors,
                        rows_input: matches!(rows_mode, RowsMode::AsShard { .. })
                            && inputs
                                .first()
                                .is_some_and(|&v| matches!(raw_place(v), Place::Rows(..))),
                        outs: &outs,
                        varies,
                        in_group,
                        group_len,
                        input_places: &input_places,
                        group_dims,
                        regrouped,
                        coord: rules::MeshCoord::new(coords[m], mesh.dims[m].1, m, &coord_read),
                        mesh_dim: m,
                        mesh_sizes: &mesh_sizes,
                        peer_ints: &peer_ints,
                        peer_int_lists: &peer_int_lists,
                        place: &place,
                        meta: &meta_of,
                        zero: &zero_of,
                        constant: &constant_of,
                        runs: &|v| {
                            let given = |x: ValueId| {
                                !matches!(g.nodes[x.node].kind, NodeKind::Input)
                                    && sh.inputs[r].contains_key(&x)
                            };
                            runs::runs_of(g, &rp, &meta_of, &given, v)
                        },
                        scaled: &scaled_of,
                        global_view,
                        pipeline_dim: crate::is_pipeline_dim(mesh, m),
                        rows: &|k| sh.rows.borrow_mut().intern(k),
                        row_key: &|id| sh.rows.borrow().key(id),
                        value_name: &|v| format!("{}#{}", g.nodes[v.node].name, v.output),
                    };
                    let (mut result, mut violation) = match ring_mode {
                        RingMode::Result(p) => (vec![p; nout], None),
                        _ => match (rule.f)(&ctx) {
                            Ok(v) => (v, None),
                            Err(v) => (v.recover.clone(), Some(v)),
                        },
                    };
                    if matches!(ring_mode, RingMode::Rolled(..) | RingMode::Permuted { .. }) {
                        for p in &mut result {
                            *p = ring::ring_output(*p, ring_mode);
                        }
                    }
                    // An update of a vocabulary-shard lookup that is written back where it was
                    // read: `Unmasked` until the write-back, which decides.
                    if updates.contains(&i)
                        && violation.is_some()
                        && inputs.iter().any(|&v| place(v) == Place::Unmasked)
                    {
                        violation = None;
                        result = vec![Place::Unmasked; nout];
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
                    // own coordinate is not recorded (`coords[m]`, not `my_coord`), so the
                    // replicas of a stage that runs it may share one run (`Twins`). A proof
                    // of the rank's range alone (`range_proven`) records its read.
                    let peers_prove = |proof: &Proof| {
                        !stage_dim
                            && peer_list[m].iter().enumerate().all(|(k, &p)| {
                                if p == r {
                                    return true;
                                }
                                let Some(j) = peer_node(p) else {
                                    return false;
                                };
                                let (pg, pm) = (&program.ranks[p], &sh.metas[p]);
                                let replicated_here = |v: ValueId| {
                                    sh.names[r].get(pg.nodes[v.node].name.as_str()).is_some_and(
                                        |&q| {
                                            rp.of(ValueId::new(q as usize, v.output), nd)[m]
                                                == Place::Replicate
                                        },
                                    )
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
                            &|| coords[m],
                            |v| rp.of(v, nd)[m] == Place::Replicate,
                            meta_of,
                        )
                        && peers_prove(&|pg, j, k, rep, meta| {
                            crate::vocab::update_shard(pg, j, &|| k, rep, meta)
                        })
                    {
                        violation = None;
                        result = vec![Place::Shard(1); nout];
                    }
                    // A vocabulary-shard lookup zeroed outside a mask is a partial sum only
                    // where the mask is the rank's range (checked on the graph).
                    let mut vocab_unproven = None;
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
                            &|| coords[m],
                            |v| rp.of(v, nd)[m] == Place::Replicate,
                            meta_of,
                        );
                        if let Some(d) = d.filter(|&d| {
                            peers_prove(&|pg, j, k, rep, meta| {
                                let pin = pg.nodes[j].inputs();
                                pin.len() == 2
                                    && crate::vocab::one_hot_shard(
                                        pg,
                                        pin[0],
                                        pin[1],
                                        &|| k,
                                        rep,
                                        meta,
                                    ) == Some(d)
                            })
                        }) {
                            result = vec![Place::shard(d); nout];
                        }
                    }
                    if op.name == "embedding_dense_backward"
                        && violation.is_none()
                        && mesh.dims[m].1 > 1
                        && crate::vocab::embedding_grad_shard(
                            g,
                            i,
                            &|| coords[m],
                            |v| rp.of(v, nd)[m] == Place::Replicate,
                            meta_of,
                        )
                        && peers_prove(&|pg, j, k, rep, meta| {
                            crate::vocab::embedding_grad_shard(pg, j, &|| k, rep, meta)
                        })
                    {
                        result = vec![Place::Shard(0); nout];
                    }
                    if rule.family == "masked-fill"
                        && violation.is_none()
                        && result.iter().any(|p| p.is_partial())
                    {
                        let x = bound.get("self").and_then(|a| a.as_value());
                        let mask = bound.get("mask").and_then(|a| a.as_value());
                        if let (Some(x), Some(mask)) = (x, mask) {
                            if rp.of(x, nd)[m] == Place::Unmasked {
                                let proven = crate::vocab::range_proven(
                                    g,
                                    x,
                                    mask,
                                    false,
                                    &|| my_coord(m),
                                    |v| rp.of(v, nd)[m] == Place::Replicate,
                                    |v| rp.of(v, nd)[m].shard_dim(),
                                    meta_of,
                                );
                                if let Err(why) = proven {
                                    result.iter_mut().for_each(|p| *p = Place::Unknown);
                                    vocab_unproven = Some(format!(
                                        "`{op}` on mesh dim `{}`: {why}",
                                        mesh.dims[m].0
                                    ));
                                }
                            }
                        }
                    }
                    // The same for `index_put(x, [mask], 0)` (Megatron's
                    // `output_parallel[input_mask, :] = 0.0`): the mask must be the rank's range,
                    // the values proven zero, the write not accumulating. Before, any
                    // rank-dependent mask and any 0-d value made a partial sum (exit 0).
                    if op.name == "index_put"
                        && violation.is_none()
                        && result.iter().any(|p| p.is_partial())
                    {
                        if let Some(x) = bound.get("self").and_then(|a| a.as_value()) {
                            if rp.of(x, nd)[m] == Place::Unmasked {
                                let mask = match bound.get("indices") {
                                    Some(Arg::List(items)) if items.len() == 1 => {
                                        items[0].as_value()
                                    }
                                    _ => None,
                                };
                                let zero =
                                    bound.get("values").and_then(|a| a.as_value()).is_some_and(
                                        |v| rp.zero[rp.offsets[v.node] as usize + v.output],
                                    );
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
                                    Some(mask) => crate::vocab::range_proven(
                                        g,
                                        x,
                                        mask,
                                        true,
                                        &|| my_coord(m),
                                        |v| rp.of(v, nd)[m] == Place::Replicate,
                                        |v| rp.of(v, nd)[m].shard_dim(),
                                        meta_of,
                                    ),
                                };
                                if let Err(why) = proven {
                                    result.iter_mut().for_each(|p| *p = Place::Unknown);
                                    vocab_unproven = Some(format!(
                                        "`{op}` on mesh dim `{}`: {why}",
                                        mesh.dims[m].0
                                    ));
                                }
                            }
                        }
                    }
                    if let RowsMode::AsShard { id, v, d, .. } = rows_mode {
                        let in_size = meta_of(v).and_then(|mm| mm.shape.get(d as usize).copied());
                        let mut table = sh.rows.borrow_mut();
                        for (o, p) in result.iter_mut().enumerate() {
                            let shape = outs
                                .get(o)
                                .and_then(|mm| mm.as_ref())
                                .map(|mm| mm.shape.as_slice());
                            *p = rows::rows_output(*p, rule.family, in_size, shape, id, &mut table);
                        }
                    }
                    // A view whose input another mesh dim holds as rows: where the view merges
                    // them outside this mesh dim's shard, no reading (the rows' order is not
                    // known, so neither is where this mesh dim's pieces fall among them).
                    if rule.family == "view" && !by_factors.get() {
                        if let (Some(&v), Some(shape)) =
                            (inputs.first(), meta_of(inputs[0]).map(|mm| mm.shape))
                        {
                            let outs_shape = outs
                                .first()
                                .and_then(|mm| mm.as_ref())
                                .map(|mm| mm.shape.clone());
                            let mine = rp.of(v, nd)[m];
                            let my_dim = match mine {
                                Place::Rows(d, _) => Some(d as usize),
                                p => p.blocks().map(|(d, _)| d),
                            };
                            let crosses = rp.of(v, nd).iter().enumerate().any(|(k, p)| match p {
                                Place::Rows(e, _) if k != m => my_dim.is_some_and(|d| {
                                    (*e as usize) <= d
                                        && outs_shape.as_deref().is_none_or(|o| {
                                            !rules::reshaped_apart(&shape, o, d, *e as usize)
                                                && !global_view.is_some_and(|(gi, go)| {
                                                    rules::reshaped_apart_by_global(
                                                        &shape,
                                                        o,
                                                        gi,
                                                        go,
                                                        *e as usize,
                                                        d,
                                                    )
                                                })
                                        })
                                }),
                                _ => false,
                            });
                            if crosses {
                                result.iter_mut().for_each(|p| *p = Place::Varying);
                            }
                        }
                    }
                    let tensor_inputs_scaled = |rp: &RankPlacements| {
                        inputs.iter().all(|&v| {
                            let q = rp.of(v, nd)[m];
                            q.is_partial()
                                || rp.scaled[(rp.offsets[v.node] as usize + v.output) * nd + m]
                        })
                    };
                    // Whether a lift below reads a replicated input divided by n (`scaled`)
                    // as the rank's share of a sum: that use consumes the division.
                    let mut lift_reads_scaled = false;
                    // Why a partial plus a term some ranks add alone gets no claim.
                    let mut lone_term_why = None;
                    let lifted = match violation.as_ref().map(|v| v.exempt) {
                        Some(Exempt::ReduceReplicate) => {
                            let dual = group_name.as_deref().is_some_and(|gname| {
                                loss_terms.backward_dual(i, gname, &mut dual_used)
                            });
                            if dual {
                                dual_lifts.push((i, group_name.clone().unwrap_or_default()));
                            }
                            lift_reads_scaled =
                                !dual && inputs.first().is_some_and(|&v| scaled_of(v));
                            if lift_reads_scaled && rule.family == "all-reduce" && m < 64 {
                                lifted_shares |= 1 << m;
                            }
                            (dual || lift_reads_scaled).then(|| vec![Place::Replicate; nout])
                        }
                        Some(Exempt::PartialPlusReplicate(red)) => {
                            // The replicated terms computed differently on the ranks (added on
                            // some ranks only).
                            let differs = !stage_dim
                                && inputs
                                    .iter()
                                    .filter(|&&v| place(v) == Place::Replicate)
                                    .any(|&v| {
                                        let vname = g.nodes[v.node].name.as_str();
                                        peer_list[m].iter().any(|&p| {
                                            p != r
                                                && sh.names[p].get(vname).is_none_or(|&j| {
                                                    !sh.same_expr(r, v.node, p, j as usize)
                                                })
                                        })
                                    });
                            // Every rank's share `b / n` adds up to `b` in a sum of the
                            // pieces; their average gets `b / n` (a finding stays).
                            lift_reads_scaled =
                                !differs && red == Red::Sum && tensor_inputs_scaled(&rp);
                            if differs && red != Red::Sum {
                                // A term some ranks add alone counts once in the sum of the
                                // pieces but 1/n times in their average (and a max or min
                                // takes it or not): no claim, and no finding (every rank may
                                // add the same term under an expression the peer comparison
                                // cannot match, which an average counts once).
                                lone_term_why = Some(format!(
                                    "`{op}` on mesh dim `{}` adds to a `{}` a replicated term \
                                     computed otherwise on a peer rank (added on some ranks \
                                     only?): counted once only in a sum, not proven",
                                    mesh.dims[m].0,
                                    Place::Partial(red)
                                ));
                                Some(vec![Place::Unknown; nout])
                            } else {
                                (differs || lift_reads_scaled)
                                    .then(|| vec![Place::Partial(red); nout])
                            }
                        }
                        _ => None,
                    };
                    if let Some(l) = lifted {
                        result = l;
                        violation = None;
                    }
                    // A contraction summed over row chunks at rank-dependent offsets (TP comm
                    // overlap): the whole contraction's placement (`chunks::contraction`).
                    if op.name == "add"
                        && violation.is_none()
                        && !stage_dim
                        && result == [Place::Varying]
                    {
                        let at = |v: ValueId| (rp.offsets[v.node] as usize + v.output) * nd + m;
                        let plain = |v: ValueId| {
                            !rp.scaled[at(v)] && !rp.times_n[at(v)] && !rp.scale_unknown[at(v)]
                        };
                        let rows = |v: ValueId| {
                            meta_of(v).and_then(|mm| mm.shape.first().map(|&d| d as i64))
                        };
                        if let Some(p) = crate::chunks::contraction(g, i, &place, &plain, &rows) {
                            result = vec![p];
                        }
                    }
                    // The last merge of a ring attention's blocks (`attention::ring_output`).
                    if matches!(op.name.as_str(), "add" | "cat")
                        && violation.is_none()
                        && !stage_dim
                        && result == [Place::Varying]
                    {
                        let place = |v: ValueId| rp.of(v, nd)[m];
                        let coord = mesh.coords(r)[m];
                        let table = sh.rows.borrow();
                        if let Some(p) = crate::attention::ring_output(g, i, &place, &table, coord)
                        {
                            result = vec![p];
                        }
                    }
                    // Scaling by 1/n of a replicated value.
                    let n_m = mesh.dims[m].1 as f64;
                    let other = if bound.schema().index_of("other").is_some() {
                        bound.get("other")
                    } else {
                        None
                    };
                    let factor = other.and_then(|a| a.as_f64());
                    // The spec divides by the same number at this node: the rank's value is
                    // the spec's tensor, not 1/n of it (a later sum over the ranks would count
                    // it n times).
                    let spec_same = sh.has_spec
                        && factor.is_some_and(|x| {
                            sh.spec_scalings
                                .get(name)
                                .is_some_and(|&(sop, y, _)| sop == op && y == x)
                        });
                    let by_n = !spec_same
                        && match (op.name.as_str(), factor) {
                            ("div", Some(x)) => n_m > 1.0 && x == n_m,
                            ("mul", Some(x)) => n_m > 1.0 && (x * n_m - 1.0).abs() < 1e-12,
                            _ => false,
                        }
                        || (n_m > 1.0
                            && matches!(op.name.as_str(), "mul" | "div")
                            && factor.is_some_and(|x| {
                                sh.spec_scalings
                                    .get(name)
                                    .is_some_and(|&(sop, y, spec_numel)| {
                                        // A mean that autograd folded into the constant counts the
                                        // rank's local elements where other mesh dims shard the batch:
                                        // the spec's elements over the rank's multiply the factor.
                                        let local =
                                            match (spec_numel, outs.first().cloned().flatten()) {
                                                (Some(g), Some(l)) if l.numel() > 0 => {
                                                    g as f64 / l.numel() as f64
                                                }
                                                _ => 1.0,
                                            };
                                        // The rank's factor over the spec's is local/n.
                                        let ratio = if op.name == "mul" { x / y } else { y / x };
                                        sop == op
                                            && y != 0.0
                                            && (ratio * n_m / local - 1.0).abs() < 1e-9
                                    })
                            }));
                    // A partial scaled by a number (issue 44, soundness): pieces that average
                    // to the tensor, each divided by n, sum to it (and pieces that sum, each
                    // times n, average to it), where the spec does not scale the tensor so.
                    // Before, the reduction label was kept through every such product, so a
                    // rank that divided its local mean by n where the spec does not held
                    // pieces that sum labelled `Partial(avg)`, and an output declared so
                    // passed. The factor is read relative to the spec's own at this node
                    // (`spec_scalings`): the same factor keeps the label, 1/n or n of it
                    // turns one linear reduction into the other. Any other factor (one the
                    // spec lacks, whose meaning the number does not tell: a 1/2 may average
                    // two microbatches), or 1/n where another mesh dim has n coordinates too
                    // (which dim it makes up for is not known), keeps the label and records
                    // that the pieces' factor is not known (`scale_unknown`): every finding
                    // on a partial still applies, but no reduction of it is proven. A plan
                    // is its own spec: its scalings keep the label. A product with a
                    // replicated value divided by n (`scaled`) counts as a factor of 1/n.
                    let mut scaling_why = None;
                    let input_scale_unknown = inputs.iter().any(|&v| {
                        place(v).is_partial()
                            && rp.scale_unknown[(rp.offsets[v.node] as usize + v.output) * nd + m]
                    });
                    let mut now_scale_unknown = input_scale_unknown;
                    // `share_of` of the output on this mesh dim (k + 1; 0: none).
                    let mut share_dim = 0u8;
                    let share_in =
                        |v: ValueId| rp.share_of[(rp.offsets[v.node] as usize + v.output) * nd + m];
                    // Carried by a sum of partial terms that all wait on the same dim's sum,
                    // and by a collective over another mesh dim (which this dim's pieces pass).
                    if input_scale_unknown
                        && ((op.name == "add" && inputs.iter().all(|&v| place(v).is_partial()))
                            || (rule.family == "all-reduce" && !in_group))
                    {
                        let first = inputs.first().map_or(0, |&v| share_in(v));
                        if inputs.iter().all(|&v| share_in(v) == first) {
                            share_dim = first;
                        }
                    }
                    if n_m > 1.0 {
                        if let Some(Place::Partial(red)) = result.first().copied() {
                            if red.is_linear() {
                                let rel = partial_scaling(
                                    op.name.as_str(),
                                    factor,
                                    n_m,
                                    sh.has_spec,
                                    sh.spec_scalings.get(name).copied(),
                                    Read::Partial {
                                        scaled_from: [0, 1].map(|k| {
                                            inputs.iter().skip(k).any(|&v| {
                                                place(v) == Place::Replicate && scaled_of(v)
                                            })
                                        }),
                                    },
                                );
                                let ambiguous = rel != Scaling::Same
                                    && mesh
                                        .dims
                                        .iter()
                                        .enumerate()
                                        .any(|(k, d)| k != m && d.1 as f64 == n_m);
                                let relabel = match (rel, red) {
                                    _ if ambiguous => None,
                                    (Scaling::Same, r) => Some(r),
                                    (Scaling::ByInverseN, Red::Avg) => Some(Red::Sum),
                                    (Scaling::ByN, Red::Sum) => Some(Red::Avg),
                                    _ => None,
                                };
                                match relabel {
                                    Some(r) => {
                                        for p in result.iter_mut() {
                                            if matches!(p, Place::Partial(_)) {
                                                *p = Place::Partial(r);
                                            }
                                        }
                                    }
                                    None => {
                                        // The one other mesh dim whose size the division
                                        // is by, and on which the dividend is replicated (a
                                        // share there), where the spec lacks the factor.
                                        if !input_scale_unknown && rel == Scaling::Other {
                                            share_dim = share_of_other_dim(
                                                op.name.as_str(),
                                                factor,
                                                mesh,
                                                m,
                                                inputs.first().map(|&v| rp.of(v, nd)),
                                                sh.has_spec && sh.spec_scalings.contains_key(name),
                                            );
                                        }
                                        now_scale_unknown = true;
                                    }
                                }
                            }
                        }
                    }
                    now_scale_unknown &= result.iter().any(|p| p.is_partial());
                    // Gradient accumulation: K microbatch means each divided by K, added, are
                    // the mean over the rank's shard (`rows::microbatch_average` proves the
                    // terms are the K microbatches of one selection, each once).
                    if now_scale_unknown
                        && op.name == "add"
                        && result.first() == Some(&Place::Partial(Red::Avg))
                        && rows::microbatch_average(
                            g,
                            i,
                            &|v| rp.of(v, nd)[m],
                            &|v| {
                                rp.scale_unknown[(rp.offsets[v.node] as usize + v.output) * nd + m]
                            },
                            &sh.rows.borrow(),
                        )
                    {
                        now_scale_unknown = false;
                    }
                    // A reduction over the group of pieces whose factor is not known: what it
                    // gives is not proven (findings of the rule stand).
                    if input_scale_unknown
                        && in_group
                        && violation.is_none()
                        && matches!(rule.family, "all-reduce" | "reduce-scatter")
                    {
                        result.iter_mut().for_each(|p| *p = Place::Unknown);
                        now_scale_unknown = false;
                        scaling_why = Some(format!(
                            "`{op}` on mesh dim `{}` reduces a partial whose pieces were scaled \
                             by a number whose meaning is not known (a factor the spec lacks at \
                             that node, or 1/n where another mesh dim has n coordinates too): \
                             what the reduction gives is not proven",
                            mesh.dims[m].0
                        ));
                    }
                    let first_scaled = inputs.first().is_some_and(|&v| scaled_of(v));
                    let scaled_inputs = inputs
                        .iter()
                        .filter(|&&v| place(v) == Place::Replicate && scaled_of(v))
                        .count();
                    // Which uses carry the 1/n on: copies, views and sums of one scaled
                    // operand, a product with exactly one scaled factor (either side), a
                    // quotient of a scaled dividend by an unscaled divisor, a sum of scaled
                    // terms only, and a sum or mean over another mesh dim's group (each
                    // member's value is 1/n of one, so is their sum: a tp share summed over dp
                    // first, then over tp, was an all-reduce of a replicated tensor).
                    let over_other_dim = rule.family == "all-reduce"
                        && !in_group
                        && matches!(
                            bound.get("reduce_op"),
                            Some(Arg::Str(s)) if Red::parse(&s).is_some_and(|r| r.is_linear())
                        );
                    let keeps = (first_scaled
                        && (rules::moves_values(rule.family)
                            || over_other_dim
                            || (rule.family == "reduction"
                                && matches!(op.name.as_str(), "sum" | "mean"))
                            || (rule.family == "elementwise-div" && scaled_inputs == 1)))
                        || (rule.family == "elementwise-mul" && scaled_inputs == 1)
                        || (rule.family == "elementwise-add"
                            && !inputs.is_empty()
                            && inputs.iter().all(|&v| scaled_of(v)));
                    let now_scaled = result.first() == Some(&Place::Replicate)
                        && ((by_n
                            && inputs
                                .first()
                                .is_some_and(|&v| place(v) == Place::Replicate))
                            || keeps);
                    // A replicated value divided by n (`scaled`) read as a rank's share of a
                    // sum: an all-reduce sum of it, a partial plus it, a partial times or over
                    // it (the label follows, `partial_scaling`), a partial matrix product plus
                    // it as the bias. Any other use whose result is a partial (a partial matrix
                    // product with it, say) scales the pieces by 1/n where the spec may not:
                    // the label is kept and its factor is not known (`scale_unknown`), so no
                    // reduction of it is proven (was: the label as if unscaled). A use whose
                    // result is replicated or a shard keeps its placement: the record cannot
                    // tell a share from a value the spec divides too (a gradient averaged over
                    // the replicas, `all_reduce(g) / n`, is recorded so), and the placement
                    // holds either way. A plan is its own spec.
                    if sh.has_spec && scaled_inputs > 0 && !now_scaled && violation.is_none() {
                        let consumed = lift_reads_scaled
                            || matches!(rule.family, "elementwise-mul" | "elementwise-div")
                            || (matches!(rule.family, "matmul-bias" | "linear")
                                && scaled_inputs == 1
                                && ["bias", "self"]
                                    .iter()
                                    .filter(|a| bound.schema().index_of(a).is_some())
                                    .filter_map(|a| match bound.get(a) {
                                        Some(Arg::Value(v)) => Some(v),
                                        _ => None,
                                    })
                                    .any(scaled_of));
                        if !consumed
                            && result
                                .iter()
                                .any(|p| matches!(p, Place::Partial(r) if r.is_linear()))
                        {
                            now_scale_unknown = true;
                        }
                    }
                    // On a pipeline dim, `Replicate()` claims every stage holds this tensor;
                    // the rules assume one program on every coordinate, which stages do not
                    // run. Only a collective over the stages (its result is the same on every
                    // member), or the same computation on every other stage, keeps it.
                    let mut now_scaled = now_scaled;
                    if stage_dim && !in_group {
                        for (o, p) in result.iter_mut().enumerate() {
                            if matches!(
                                *p,
                                Place::Replicate | Place::Rolled(..) | Place::Permuted(..)
                            ) && !peer_list[m].iter().all(|&q| {
                                q == r
                                    || sh.stage_alike(r, q, i, o)
                                    || (!sh.stage_shares.is_empty()
                                        && rules::stage_alike_through_shares(sh, r, q, i, o))
                            }) {
                                *p = Place::Varying;
                                now_scaled = false;
                            }
                        }
                    }
                    if varies && rule.literals == Literals::Vary {
                        for p in &mut result {
                            if matches!(
                                *p,
                                Place::Replicate | Place::Rolled(..) | Place::Permuted(..)
                            ) {
                                *p = Place::Varying;
                            }
                        }
                    }
                    // An all-reduce sum of pieces that average to the tensor: n times it on
                    // every rank (`times_n`), `Unknown` to the rules.
                    let times_n = rule.family == "all-reduce"
                        && in_group
                        && !input_scale_unknown
                        && inputs
                            .first()
                            .is_some_and(|&v| place(v) == Place::Partial(Red::Avg))
                        && matches!(
                            bound.get("reduce_op"),
                            Some(Arg::Str(s)) if Red::parse(&s) == Some(Red::Sum)
                        )
                        && result.iter().all(|&p| p == Place::Unknown);
                    let inconclusive = violation.is_none()
                        && vocab_unproven.is_none()
                        && lone_term_why.is_none()
                        && !times_n
                        && result.contains(&Place::Unknown);
                    let finding = violation.map(|v| raw_finding(sh, r, i, m, &v, &rp, &inputs));
                    // Origin of partials: the first partial input's, or this node.
                    let first_partial_origin = inputs
                        .iter()
                        .find(|&&v| place(v).is_partial())
                        .map(|&v| rp.origin[(rp.offsets[v.node] as usize + v.output) * nd + m]);
                    rp.findings.extend(finding);
                    if let Some(why) = vocab_unproven {
                        rp.unknown_sources.push((i, why));
                    }
                    if let Some(why) = lone_term_why {
                        rp.unknown_sources.push((i, why));
                    }
                    if let Some(why) = scaling_why.filter(|_| inconclusive) {
                        rp.unknown_sources.push((i, why));
                    } else if inconclusive {
                        rp.unknown_sources.push((
                            i,
                            if matches!(
                                rule.family,
                                "norm" | "norm-backward" | "softmax" | "softmax-backward" | "sort"
                            ) {
                                format!(
                                    "`{op}` on mesh dim `{}` normalizes (or sorts) a tensor of \
                                     unknown layout (`Varying`): its normalized dims may be \
                                     sharded, not known",
                                    mesh.dims[m].0
                                )
                            } else if stage_dim
                                && (rule.family == "all-reduce" || rule.family == "reduce-scatter")
                            {
                                // The stages' own tensors are never a shard there: what is
                                // missing is the proof that they are shares of one sum.
                                format!(
                                    "`{op}` on mesh dim `{}` sums the pipeline stages' own tensors (`Varying`): \
                                     whether each is its stage's share of one sum (a tied \
                                     weight's gradient, a loss term) is not proven",
                                    mesh.dims[m].0
                                )
                            } else if rule.family == "all-reduce" || rule.family == "reduce-scatter"
                            {
                                format!(
                                    "`{op}` on mesh dim `{}` reduces a tensor of unknown layout \
                                     (`Varying`): a partial sum (completed) or a shard (different \
                                     slices added), not known which",
                                    mesh.dims[m].0
                                )
                            } else if rule.family == "all-gather" {
                                format!(
                                    "`{op}` on mesh dim `{}` gathers a tensor of unknown layout \
                                     (`Varying`): the same data on every rank, in an order not \
                                     known (a shard's rows in rank order not proven)",
                                    mesh.dims[m].0
                                )
                            } else {
                                format!(
                                    "`{op}` on mesh dim `{}` combines a partial sum with a tensor \
                                     of unknown layout (`Varying`): no placement, and no finding",
                                    mesh.dims[m].0
                                )
                            },
                        ));
                    }
                    for (o, p) in result.iter().enumerate().take(nout) {
                        rp.scaled[(base + o) * nd + m] = now_scaled;
                        rp.times_n[(base + o) * nd + m] = times_n;
                        rp.scale_unknown[(base + o) * nd + m] = now_scale_unknown && p.is_partial();
                        rp.share_of[(base + o) * nd + m] = if now_scale_unknown && p.is_partial() {
                            share_dim
                        } else {
                            0
                        };
                        set(&mut rp, o, m, *p);
                        if p.is_partial() {
                            rp.origin[(base + o) * nd + m] =
                                first_partial_origin.unwrap_or(i as u32);
                        }
                    }
                }
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
                                rp.scale_unknown[at] = false;
                            }
                        }
                    }
                }
                // The division by n made up for a `times_n` dim: no other mesh dim may take it
                // as its own 1/n as well (`scaled`), or one factor would count twice.
                if consumed {
                    for o in 0..nout {
                        rp.scaled[(base + o) * nd..(base + o + 1) * nd].fill(false);
                    }
                }
                if rules::pairs_elements(rule.family) {
                    mixed_shards(sh, r, i, &inputs, nout, nd, &meta_of, &mut rp);
                }
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
        }
    }
    rp.dual_lifts = dual_lifts;
    rp.coord_reads = coord_read.get();
    // Unknown values: count them.
    // A value n times the tensor (`times_n`) is counted only where a reader makes it unknown.
    rp.unknown_values = rp
        .places
        .chunks(nd.max(1))
        .zip(rp.times_n.chunks(nd.max(1)))
        .filter(|(c, t)| {
            c.iter()
                .zip(t.iter())
                .any(|(&p, &t)| p == Place::Unknown && !t)
        })
        .count();
    (rp, pending)
}
