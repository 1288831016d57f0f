//! Placement propagation over every rank graph of a program, with the operator rules of
//! [`crate::rules`]. This file is the driver: a rank's run over its nodes, each call's rule
//! on each mesh dim, and the records it writes. What the driver asks besides the rules lives
//! beside it: `collectives` (a collective's group and the lifting of its operands),
//! `vocab_proofs` (vocabulary-parallel proofs), `scaling` (scalings by a number and the
//! records they leave), `findings` (findings and the words of unknown sources), `recv`
//! (recvs and resuming), `rerun` (a rank's run and its run again), `call_on_dim` (a call as
//! the checks after its rule read it), `local_means` (local means and their factor),
//! `gathered_sums` (sums over gathered rows), `view_shapes` (the global shapes a view reads),
//! `runs` (equal runs), `shared` (the state ranks share), `run_context` (what a rank's run
//! knows before its first node) and `call_records` (what a call leaves once every mesh dim's
//! rule ran).

use crate::place::{Place, Red, RowKey};
use crate::ring::{self, RingMode};
use crate::rows::{self, RowsMode};
use crate::rules::{self, Ctx, Literals};
use shardproof_ir::{Arg, NodeKind, OpMeaning, OpName, ValueId};
use shardproof_ops::{Args, Meta, NoValues, OpClass, OpDef};
use std::collections::HashMap;

mod call_on_dim;
mod call_records;
mod collectives;
mod findings;
mod frame;
mod gathered_sums;
mod local_means;
mod recv;
mod rerun;
mod run_context;
mod runs;
mod scaling;
mod shared;
mod view_shapes;
mod vocab_proofs;

use call_on_dim::CallOnDim;
use collectives::{collective_group, lift_exempt};
pub(crate) use findings::group_reducing;
use findings::{
    constant_output, inconclusive_reason, mixed_shards, plain_rename, raw_finding, zero_output,
};
use frame::FrameMode;
use local_means::LiftedReduction;
pub use local_means::{LocalMeanDims, PieceFactor};
use recv::start_state;
#[cfg(test)]
pub(crate) use rerun::FULL_RERUNS;
pub(crate) use rerun::NO_TWINS;
pub use rerun::{propagate_rank, propagate_rank_again};
use run_context::RunContext;
use scaling::{consumed_folded, folded_share, read_times_n, scale_records, ScaleRecord};
pub use scaling::{spec_scaling_positions, SpecScaling};
pub use shared::*;
use view_shapes::{implied_global, view_beside_varying};
use vocab_proofs::vocab_proofs;

/// No origin recorded.
pub(crate) const NONE: u32 = u32::MAX;

/// Propagates rank `r` from node 0, or, with `resume` (an earlier run's placements and a
/// node), from that node on ([`propagate_rank_again`]).
fn propagate_rank_from(
    sh: &Shared,
    r: usize,
    done: &[Option<std::sync::Arc<RankPlacements>>],
    resume: Option<(RankPlacements, usize)>,
) -> (RankPlacements, bool) {
    let cx = RunContext::new(sh, r);
    let RunContext {
        g,
        nd,
        ref mesh_sizes,
        reg,
        ref coords,
        ref peer_list,
        ref literal_peers,
        pipeline_dims,
        ref loss_terms,
        ref updates,
        mutates,
        ..
    } = cx;
    let program = sh.program;
    let mesh = &program.mesh;
    // The mesh dims whose coordinate this run reads (kept from an earlier run resumed): a
    // rank whose run reads none of the dims where another rank's coordinates differ, and
    // whose other reads are the same, gets the same placements (`propagate`).
    let coord_read = std::cell::Cell::new(resume.as_ref().map_or(0, |(rp, _)| rp.coord_reads));
    let my_coord = |m: usize| {
        coord_read.set(coord_read.get() | 1u64.checked_shl(m as u32).unwrap_or(0));
        coords[m]
    };
    let (mut rp, start) = start_state(g, nd, resume);
    let mut pending = false;
    let meta_of = |v: ValueId| cx.meta_of(v);
    let mut dual_used: HashMap<String, usize> = HashMap::new();
    // Per mesh dim, the local-means walk's answers so far (`local_means`): the values it
    // reads come before the call or from other ranks' finished runs, so they hold for the run.
    let mut local_means_memo = local_means::Memo::default();
    // The walks behind the claims' factors (`RankPlacements::local_means`): the loss
    // backwards' local means only.
    let mut piece_memo = local_means::Memo::facts();
    let mut rule_of: HashMap<&OpName, Option<&'static rules::Rule>> = HashMap::new();
    let mut def_of: HashMap<&OpName, Option<&OpDef>> = HashMap::new();
    let mut dual_lifts = std::mem::take(&mut rp.dual_lifts);
    for (_, group) in &dual_lifts {
        *dual_used.entry(group.clone()).or_insert(0) += 1;
    }
    // In-place writes of a value still carrying a reduce-scatter's factor
    // (`scattered_factor`): made `Unknown` once the run is done.
    let mut scattered_writes: Vec<usize> = Vec::new();
    // The values whose local-means answer is recorded (`RankPlacements::local_means`): a
    // resumed run keeps those before `start`.
    let first_value = rp
        .offsets
        .get(start)
        .map_or(rp.invariant.len(), |&o| o as usize);
    let mut means_recorded = local_means::MeansRecorded::new(rp.invariant.len(), first_value);
    for (i, node) in g.nodes.iter().enumerate().skip(start) {
        let base = rp.offsets[i] as usize;
        let nout = node.outputs.len();
        let node_inputs = node.inputs();
        if let NodeKind::Call { op, .. } = &node.kind {
            // The inputs' answers before the rule runs (a finding names their factor); the
            // outputs marked where they may carry one.
            local_means::record_local_means(
                sh,
                r,
                node_inputs.iter().copied(),
                (done, &mut piece_memo),
                &mut means_recorded,
                &mut rp,
            );
            local_means::mark_local_means(op, &node_inputs, (base, nout), &rp, &mut means_recorded);
        }
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
                cx.input_node(sh, (r, i, base), &mut rp);
                continue;
            }
            NodeKind::Constant { attr } => {
                cx.constant_node(sh, attr, (base, nout), &mut rp);
                continue;
            }
            NodeKind::Call { op, args, kwargs } => {
                let inputs = node_inputs;
                // Derived from a lift whose pieces were local means (`lifted_means`): the
                // record passes to every output, whatever the call.
                let lifted_below = inputs.iter().fold(0u64, |a, v| {
                    a | rp.lifted_means[rp.offsets[v.node] as usize + v.output]
                });
                rp.lifted_means[base..base + nout].fill(lifted_below);
                // A shard a reduce-scatter of local means left `f` times the spec's
                // (`scattered_factor`): every output carries it until a division clears it.
                if local_means::carry_scattered_factor(op, &inputs, base, nout, &mut rp) {
                    scattered_writes.push(i);
                }
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
                    pending |= recv::take_message(sh, (r, i), base, done, &mut rp);
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
                let consumed = nd > 0
                    && inputs.len() == 1
                    && read_times_n(
                        sh,
                        r,
                        i,
                        node.name.as_str(),
                        op,
                        rule.family,
                        &bound,
                        inputs[0],
                        nout,
                        &mut rp,
                    );
                // A division by exactly the factor a reduce-scatter of local means left on
                // the value (`scattered_factor`) makes it the spec's shard.
                if let [v] = inputs[..] {
                    let at = rp.offsets[v.node] as usize + v.output;
                    if rp.scattered_factor.get(&at).is_some_and(|&f| {
                        scaling::divides_by_inverse(sh, r, i, node.name.as_str(), op, &bound, f)
                    }) {
                        for o in 0..nout {
                            rp.scattered_factor.remove(&(base + o));
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
                let (group_name, group) = collective_group(sh, r, def, &bound, coords);
                let my_lit = sh.literals[r][i];
                // The same node on another rank: the same name calling the same operator on
                // inputs of the same names (graphs that differ per rank, as where a replicated
                // term is counted on some ranks only, shift the names of the nodes after it).
                let peer_node = |p: usize| sh.peer_node(r, p, i);
                // Only views read the spec's shapes.
                // A view beside a `Varying` mesh dim: the spec's shapes with the varying
                // dim's factors left out (`view_beside_varying`), owned here.
                let mut beside_varying: Option<(Vec<i64>, Vec<i64>)> = None;
                let global_view = if rule.family == "view" {
                    let matched =
                        sh.view_matches[r][i].and_then(|j| sh.spec_views.shapes.get(&(j as usize)));
                    let v = inputs.first().copied();
                    let local_in = v.and_then(meta_of);
                    let local_out = outs.first().and_then(|o| o.as_ref());
                    let implied = v
                        .zip(local_in.as_ref())
                        .and_then(|(v, mi)| implied_global(&mi.shape, rp.of(v, nd), mesh_sizes));
                    if let (Some(v), Some(mi), Some(mo), None) =
                        (v, local_in.as_ref(), local_out, implied.as_ref())
                    {
                        // The spec's matched view alone where there is one, else every view
                        // of the operator.
                        let candidates: Vec<&shared::SpecView> = match matched {
                            Some(sv) => vec![sv],
                            None => sh.spec_views.shapes.values().collect(),
                        };
                        beside_varying = view_beside_varying(
                            &candidates,
                            &op.name,
                            &mi.shape,
                            &mo.shape,
                            rp.of(v, nd),
                            mesh_sizes,
                        );
                    }
                    match (&beside_varying, matched) {
                        (Some((gi, go)), _) => Some((gi.as_slice(), go.as_slice())),
                        (None, Some((_, gi, go))) => Some((gi.as_slice(), go.as_slice())),
                        (None, None) => implied.and_then(|global_in| {
                            sh.spec_views
                                .by_global_input(&op.name, &global_in, &local_out?.shape)
                        }),
                    }
                } else {
                    None
                };
                // Mesh dims whose all-reduce sum here lifted a replicated share (`scaled`).
                let mut lifted_shares = 0u64;
                // Per mesh dim whose folded shares this call reads as shares, the other mesh
                // dims still pending there (`folded_pending`), and whether the call is the
                // all-reduce that sums the shares (`commit_folded`).
                let mut folded_reads: Vec<(usize, u64, bool)> = Vec::new();
                // Mesh dims on which a division the microbatch average read as the 1/K made a
                // term a share (`ScaleRecord::divisions_read_as_k`).
                let mut microbatch_divisions = 0u64;
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
                    // A selection's frame (`frame.rs`): the rule sees the framed inputs' own
                    // placements in the frame; a shadow lane below follows their rows.
                    let frame_mode = if inputs
                        .iter()
                        .any(|&v| matches!(rp.of(v, nd)[m], Place::Selected(..)))
                    {
                        frame::frame_mode(inputs.iter().map(|&v| rp.of(v, nd)[m]))
                    } else {
                        FrameMode::None
                    };
                    let raw_place = |v: ValueId| match ring::seen(rp.of(v, nd)[m], ring_mode) {
                        p @ Place::Selected(..) => frame::ordinary(p, frame_mode),
                        Place::Blocked(..) if !blocked_ok => Place::Varying,
                        Place::Stacked(_) | Place::Gathered(..) if !gathered_ok => Place::Varying,
                        Place::PartialSplit(..) | Place::PartialStacked(_) if !split_ok => {
                            Place::Partial(Red::Sum)
                        }
                        p => p,
                    };
                    let given = |x: ValueId| {
                        !matches!(g.nodes[x.node].kind, NodeKind::Input)
                            && sh.inputs[r].contains_key(&x)
                    };
                    // Runs pair alike only where the spec's construction has as many
                    // (`runs::runs_of`).
                    let spec_input = |node: usize| {
                        sh.view_matches[r][node]
                            .and_then(|j| sh.spec_views.shapes.get(&(j as usize)))
                            .map(|(_, gi, _)| gi.clone())
                    };
                    let runs_of =
                        |v: ValueId| runs::runs_of(g, &rp, &meta_of, &given, &spec_input, v);
                    // Most calls meet no rows: skip reading their arguments again.
                    let rows_mode = if inputs
                        .iter()
                        .any(|&v| matches!(rp.of(v, nd)[m], Place::Rows(..)))
                    {
                        let whole_elsewhere = |v: ValueId| {
                            rp.of(v, nd).iter().enumerate().all(|(k, p)| {
                                k == m || matches!(p, Place::Replicate | Place::Partial(_))
                            })
                        };
                        rows::rows_mode(
                            rule.family,
                            &bound,
                            raw_place,
                            meta_of,
                            |id| sh.rows.borrow().key(id),
                            runs_of,
                            whole_elsewhere,
                        )
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
                    // Its reading through an all-reduce over other mesh dims (a tp sum of the
                    // stage's shares) counted that sum as n equal copies: each input must be
                    // `Replicate`, with a known factor, on every mesh dim of its group.
                    let share = stage_dim
                        && group.as_ref().is_some_and(|(d, _)| d.contains(&m))
                        && sh.stage_shares.get(&(r, i)).is_some()
                        && sh.stage_shares.through(&(r, i)).iter().all(|(k, dims)| {
                            g.nodes[*k].inputs().first().is_some_and(|&v| {
                                dims.iter().all(|&d| {
                                    rp.of(v, nd)[d] == Place::Replicate
                                        && !rp.scale_unknown
                                            [(rp.offsets[v.node] as usize + v.output) * nd + d]
                                })
                            })
                        });
                    let place = |v: ValueId| match place(v) {
                        Place::Varying if share && inputs.first() == Some(&v) => {
                            Place::Partial(Red::Sum)
                        }
                        p => p,
                    };
                    // A partial sum over this mesh dim derived from a share lifted while the
                    // dim sharded it (`lifted_means`): its reduction reads the pieces by their
                    // factor over the spec's (`local_means::lifted_reduction`).
                    let lifted_input = inputs
                        .first()
                        .copied()
                        .filter(|&v| place(v) == Place::Partial(Red::Sum));
                    let lifted_read = local_means::lifted_reduction(
                        sh,
                        (r, m),
                        rule.family,
                        match (rule.family, lifted_input) {
                            ("all-reduce" | "reduce-scatter", Some(_)) => {
                                match bound.get("reduce_op") {
                                    Some(Arg::Str(s)) => Red::parse(&s),
                                    _ => None,
                                }
                            }
                            _ => None,
                        },
                        group.as_ref().map_or(&[][..], |(d, _)| &d[..]),
                        lifted_input,
                        (&rp, done, &mut local_means_memo),
                    );
                    let place = |v: ValueId| match (place(v), lifted_read) {
                        (
                            Place::Partial(Red::Sum),
                            LiftedReduction::Unread | LiftedReduction::AverageOff { .. },
                        ) if lifted_input == Some(v) => Place::Unknown,
                        (
                            Place::Partial(Red::Sum),
                            LiftedReduction::Sum { .. } | LiftedReduction::Average,
                        ) if lifted_input == Some(v) => Place::Partial(Red::Avg),
                        (p, _) => p,
                    };
                    // A reduce-scatter's shard of local means carries their factor on
                    // (`scattered_factor`); a reduction that reads the factor settles it.
                    let scattered_factor = match lifted_read {
                        LiftedReduction::Scattered { factor } if factor > 1 => Some(Some(factor)),
                        LiftedReduction::Sum { .. } | LiftedReduction::Average => Some(None),
                        _ => None,
                    };
                    let lifted_why = lifted_read.why(op, &mesh.dims[m].0);
                    let lifted_factor = match lifted_read {
                        LiftedReduction::Sum { factor } => Some(factor),
                        _ => None,
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
                    let places_on_mesh = |v: ValueId| -> Vec<Place> {
                        rp.of(v, nd)
                            .iter()
                            .enumerate()
                            .map(|(k, &p)| match p {
                                _ if k == m => place(v),
                                // Rows merged with outer dims hold the selection block after
                                // block (`RowKey::Blocks`), as `rows_mode` shows them to rules.
                                Place::Rows(d, id) => match sh.rows.borrow().key(id) {
                                    Some(RowKey::Blocks { blocks, .. }) => {
                                        Place::blocked(d as usize, blocks)
                                    }
                                    _ => Place::Shard(d),
                                },
                                Place::Rolled(..) | Place::Permuted(..) | Place::Selected(..) => {
                                    Place::Varying
                                }
                                p => p,
                            })
                            .collect()
                    };
                    let input_places: Vec<Place> =
                        inputs.first().map_or_else(Vec::new, |&v| places_on_mesh(v));
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
                        places_on_mesh: &places_on_mesh,
                        group_dims,
                        regrouped,
                        coord: rules::MeshCoord::new(coords[m], mesh.dims[m].1, m, &coord_read),
                        mesh_dim: m,
                        mesh_sizes,
                        peer_ints: &peer_ints,
                        peer_int_lists: &peer_int_lists,
                        place: &place,
                        meta: &meta_of,
                        zero: &zero_of,
                        constant: &constant_of,
                        runs: &runs_of,
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
                    // In a frame: a finding stands as the rule gives it (no exemption reads a
                    // frame), and the shadow lane says where the rows went.
                    let shadow_rows = if let FrameMode::Frame { .. } = frame_mode {
                        if let Some(v) = violation.as_mut() {
                            v.exempt = rules::Exempt::No;
                        }
                        frame::shadow_lane(
                            &ctx,
                            rule,
                            &bound,
                            &|v| rp.of(v, nd)[m],
                            &meta_of,
                            &sh.rows,
                            (m, inputs.first().copied()),
                        )
                    } else {
                        None
                    };
                    let site = CallOnDim {
                        sh,
                        r,
                        i,
                        m,
                        nd,
                        nout,
                        stage_dim,
                        peers: &peer_list[m],
                        op,
                        family: rule.family,
                        bound: &bound,
                        inputs: &inputs,
                        rp: &rp,
                        place: &place,
                        meta_of: &meta_of,
                        my_coord: &my_coord,
                        coord: coords[m],
                        is_update: updates.contains(&i),
                        loss_terms,
                        group_name: &group_name,
                    };
                    let vocab_unproven = vocab_proofs(&site, &mut result, &mut violation);
                    // Outputs that sum over part of each rank's rows (`rows::part_of_rows`).
                    let mut part_sums = vec![false; result.len()];
                    if let RowsMode::AsShard { id, v, d, .. } = rows_mode {
                        let in_size = meta_of(v).and_then(|mm| mm.shape.get(d as usize).copied());
                        let mut table = sh.rows.borrow_mut();
                        // A plan is its own spec: its selection's sum is what it computes.
                        let part = sh.has_spec && rows::part_of_rows(&table, id);
                        for (o, p) in result.iter_mut().enumerate() {
                            let shape = outs
                                .get(o)
                                .and_then(|mm| mm.as_ref())
                                .map(|mm| mm.shape.as_slice());
                            let out0 = shape.and_then(|s| s.first().copied());
                            *p = match frame::gathered_rows(
                                rule.family,
                                (id, d, in_size),
                                (*p, out0),
                                &mut table,
                                (m, in_group, group_dims, group_len),
                            ) {
                                Some(q) => q,
                                None => rows::rows_output(
                                    *p,
                                    rule.family,
                                    in_size,
                                    shape,
                                    id,
                                    &mut table,
                                    by_factors.get(),
                                ),
                            };
                            part_sums[o] = part
                                && matches!(
                                    *p,
                                    Place::Partial(Red::Sum) | Place::Partial(Red::Avg)
                                );
                            // A max or min over part of the rows: its pieces' max is the
                            // selected rows' only, never the tensor's, and no record carries
                            // it (`part_rows` is for sums and means): not proven.
                            if part
                                && matches!(*p, Place::Partial(Red::Max) | Place::Partial(Red::Min))
                            {
                                *p = Place::Unknown;
                            }
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
                    let (lift_reads_scaled, lone_term_why) = lift_exempt(
                        &site,
                        &mut dual_used,
                        &mut dual_lifts,
                        &mut lifted_shares,
                        &mut result,
                        &mut violation,
                    );
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
                    // The ring backward's key and value gradients in transit
                    // (`attention::key_grads`).
                    if matches!(op.name.as_str(), "add" | "cat" | "sum" | "view")
                        && violation.is_none()
                        && !stage_dim
                        && result == [Place::Varying]
                    {
                        let place = |v: ValueId| rp.of(v, nd)[m];
                        let shape = |v: ValueId| meta_of(v).map(|mm| mm.shape);
                        let coord = mesh.coords(r)[m];
                        let table = sh.rows.borrow();
                        let mut roots = sh.ring_roots.borrow_mut();
                        if let Some(p) = crate::attention::key_grads::accrue(
                            g,
                            i,
                            &place,
                            &shape,
                            &table,
                            &mut roots.grads,
                            coord,
                        ) {
                            result = vec![p];
                        }
                    }
                    let ScaleRecord {
                        scaled: now_scaled,
                        scale_unknown: now_scale_unknown,
                        share_dim,
                        input_scale_unknown,
                        why: scaling_why,
                        folded,
                        divisions_read_as_k,
                        keeps_part,
                    } = scale_records(&site, in_group, lift_reads_scaled, &violation, &mut result);
                    microbatch_divisions |= divisions_read_as_k;
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
                    if let FrameMode::Frame { id: frame_id } = frame_mode {
                        let in0 = inputs.first().copied();
                        let exits: Vec<Option<Place>> = result
                            .iter()
                            .enumerate()
                            .map(|(o, p)| {
                                let combined = frame::combined(
                                    rule.family,
                                    in0.map(|v| rp.of(v, nd)[m]),
                                    (
                                        in0.and_then(&meta_of)
                                            .and_then(|mm| mm.shape.first().copied()),
                                        outs.get(o)
                                            .and_then(|mm| mm.as_ref())
                                            .and_then(|mm| mm.shape.first().copied()),
                                    ),
                                    (m, in_group, group_dims, group_len),
                                    *p,
                                    (coords, mesh_sizes),
                                    &mut sh.rows.borrow_mut(),
                                );
                                combined.or_else(|| {
                                    let table = sh.rows.borrow();
                                    frame::gathered_elsewhere(
                                        rule.family,
                                        in0.map(|v| rp.of(v, nd)[m]),
                                        *p,
                                        (m, in_group, group_dims, group_len),
                                        mesh_sizes[m],
                                        &|g| match in0.map(|v| rp.of(v, nd)[g]) {
                                            Some(Place::Rows(0, k)) => table.key(k),
                                            _ => None,
                                        },
                                    )
                                })
                            })
                            .collect();
                        let table = sh.rows.borrow();
                        let key = |id| table.key(id);
                        for ((o, p), exit) in result.iter_mut().enumerate().zip(exits) {
                            *p = match exit {
                                Some(q) => q,
                                None if now_scale_unknown => Place::Varying,
                                None => {
                                    let rows = shadow_rows
                                        .as_ref()
                                        .and_then(|s| s.get(o).copied())
                                        .unwrap_or(Place::Varying);
                                    rows::frame_summed(*p, rows, frame_id, &table)
                                        .unwrap_or_else(|| frame::framed(*p, rows, key))
                                }
                            };
                        }
                        now_scaled = false;
                    }
                    // A share by a folded mean's reading (issue 44): the other mesh dims'
                    // pieces it counted must be averaged. Read as a share where some were
                    // summed instead (the local means of dp summed, or a global mean that
                    // forgot the 1/tp), it is not proven; the still pending ones are the
                    // post-pass's (`commit_folded`).
                    let folded_rec = folded_share(
                        &site,
                        folded,
                        now_scaled,
                        in_group,
                        group.as_ref().map(|(dims, _)| &dims[..]),
                    );
                    let read_share = consumed_folded(&site, lift_reads_scaled, &result);
                    let mut folded_why = None;
                    if read_share.summed != 0 && violation.is_none() {
                        result.iter_mut().for_each(|p| *p = Place::Unknown);
                        folded_why = Some(format!(
                            "`{op}` on mesh dim `{}` reads as a share a value divided by its size \
                             only by a folded mean's reading (a local mean over other mesh dims \
                             over n), whose local means were then summed over mesh dim(s) {}, \
                             not averaged: the share is not proven",
                            mesh.dims[m].0,
                            (0..nd.min(64))
                                .filter(|&k| read_share.summed & (1 << k) != 0)
                                .map(|k| format!("`{}`", mesh.dims[k].0))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ));
                    } else if read_share.pending != 0 {
                        folded_reads.push((m, read_share.pending, rule.family == "all-reduce"));
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
                    if let Some(why) = lifted_why.filter(|_| inconclusive) {
                        rp.unknown_sources.push((i, why));
                    } else if let Some(why) = folded_why.filter(|_| inconclusive) {
                        rp.unknown_sources.push((i, why));
                    } else if let Some(why) = scaling_why.filter(|_| inconclusive) {
                        rp.unknown_sources.push((i, why));
                    } else if inconclusive {
                        rp.unknown_sources.push((
                            i,
                            inconclusive_reason(op, rule.family, stage_dim, &mesh.dims[m].0),
                        ));
                    }
                    for (o, p) in result.iter().enumerate().take(nout) {
                        rp.folded_pending[(base + o) * nd + m] = folded_rec.pending;
                        rp.folded_summed[(base + o) * nd + m] = folded_rec.summed;
                        rp.scaled[(base + o) * nd + m] = now_scaled;
                        rp.times_n[(base + o) * nd + m] = times_n;
                        match scattered_factor {
                            Some(Some(f)) => rp.scattered_factor.insert(base + o, f),
                            Some(None) => rp.scattered_factor.remove(&(base + o)),
                            None => None,
                        };
                        match lifted_factor.filter(|_| times_n) {
                            Some(f) => rp.times_factor.insert((base + o) * nd + m, f),
                            None => rp.times_factor.remove(&((base + o) * nd + m)),
                        };
                        // A sum over part of the rows (or a copy or view of one): its pieces
                        // sum to the selected rows' sum only, no factor of the tensor's.
                        let part = part_sums.get(o) == Some(&true) || keeps_part;
                        rp.part_rows[(base + o) * nd + m] = part
                            && p.is_partial()
                            && (part_sums.get(o) != Some(&true) || !now_scale_unknown);
                        rp.scale_unknown[(base + o) * nd + m] =
                            (now_scale_unknown || part) && p.is_partial();
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
                call_records::after_rules(
                    sh,
                    (r, &cx),
                    &call_records::CallRecords {
                        i,
                        base,
                        nout,
                        inputs: &inputs,
                        pairs_elements: rules::pairs_elements(rule.family),
                        lifted_shares,
                        microbatch_divisions,
                        consumed,
                        folded_reads: &folded_reads,
                    },
                    (done, &mut local_means_memo),
                    &mut rp,
                );
            }
        }
    }
    rp.dual_lifts = dual_lifts;
    rp.coord_reads = coord_read.get();
    local_means::unsettled_scattered_factors(g, start, nd, &scattered_writes, &mut rp);
    let values = (start..g.nodes.len())
        .flat_map(|i| (0..g.nodes[i].outputs.len()).map(move |o| ValueId::new(i, o)));
    local_means::record_local_means(
        sh,
        r,
        values,
        (done, &mut piece_memo),
        &mut means_recorded,
        &mut rp,
    );
    rp.unknown_values = call_records::unknown_values(&rp, nd);
    (rp, pending)
}
