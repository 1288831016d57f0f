//! What a collective makes of its operands beyond its rule: the group it runs over (its
//! mesh dims and size), and the lifting of a rule's violation that the other ranks' terms
//! make legal: a replicated gradient that is one term of a sum (the backward dual of a
//! forward all-reduce, or a share divided by n), and a partial plus a replicated term that
//! some ranks add alone (the lone-term logic).

use super::{same_arg, CallOnDim, RankPlacements, Shared};
use crate::place::{Place, Red};
use crate::rules::{Exempt, Violation};
use shardproof_ir::{Arg, Graph, NodeKind, ValueId};
use shardproof_ops::{Args, OpClass, OpDef};
use std::collections::HashMap;

/// The collective's group name as bound, and the mesh dims along which the caller's group
/// varies with the group's size; both `None` for an operator that is not a collective.
pub(super) fn collective_group(
    sh: &Shared,
    r: usize,
    def: &OpDef,
    bound: &Args,
    coords: &[usize],
) -> (Option<String>, Option<(Vec<usize>, usize)>) {
    let program = sh.program;
    let mesh = &program.mesh;
    let nd = mesh.dims.len();
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
                            .filter(|&m| members.iter().any(|&x| mesh.coords(x)[m] != coords[m]))
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

    (group_name, group)
}

/// Lifts the rule's `violation` at the call `s` where its exemption holds (`Exempt`): the
/// result becomes the lifted placements. Returns whether the lift read a replicated input
/// divided by n (`scaled`) as the rank's share of a sum, and why a partial plus a term some
/// ranks add alone gets no claim.
pub(super) fn lift_exempt(
    s: &CallOnDim,
    dual_used: &mut HashMap<String, usize>,
    dual_lifts: &mut Vec<(usize, String)>,
    lifted_shares: &mut u64,
    result: &mut Vec<Place>,
    violation: &mut Option<Violation>,
) -> (bool, Option<String>) {
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
        inputs,
        rp,
        place,
        loss_terms,
        group_name,
        ..
    } = *s;
    let g = &sh.program.ranks[r];
    let mesh = &sh.program.mesh;
    let scaled_of = |v: ValueId| s.scaled_of(v);
    let tensor_inputs_scaled = |rp: &RankPlacements| {
        inputs.iter().all(|&v| {
            let q = rp.of(v, nd)[m];
            q.is_partial() || rp.scaled[(rp.offsets[v.node] as usize + v.output) * nd + m]
        })
    };
    // Whether a lift below reads a replicated input divided by n (`scaled`)
    // as the rank's share of a sum: that use consumes the division.
    let mut lift_reads_scaled = false;
    // Why a partial plus a term some ranks add alone gets no claim.
    let mut lone_term_why = None;
    let lifted = match violation.as_ref().map(|v| v.exempt) {
        Some(Exempt::ReduceReplicate) => {
            let dual = group_name
                .as_deref()
                .is_some_and(|gname| loss_terms.backward_dual(i, gname, dual_used));
            if dual {
                dual_lifts.push((i, group_name.clone().unwrap_or_default()));
            }
            lift_reads_scaled = !dual && inputs.first().is_some_and(|&v| scaled_of(v));
            if lift_reads_scaled && family == "all-reduce" && m < 64 {
                *lifted_shares |= 1 << m;
            }
            (dual || lift_reads_scaled).then(|| vec![Place::Replicate; nout])
        }
        Some(Exempt::PartialPlusReplicate(red)) => {
            // Whether a replicated input is computed otherwise on a peer rank, by
            // `same(peer, peer's node)`, or missing there.
            let replicated_input_differs = |same: &dyn Fn(usize, usize, usize) -> bool| {
                !stage_dim
                    && inputs
                        .iter()
                        .filter(|&&v| place(v) == Place::Replicate)
                        .any(|&v| {
                            let vname = g.nodes[v.node].name.as_str();
                            peers.iter().any(|&p| {
                                p != r
                                    && sh.names[p]
                                        .get(vname)
                                        .is_none_or(|&j| !same(v.node, p, j as usize))
                            })
                        })
            };
            // The replicated terms computed differently on the ranks (added on
            // some ranks only).
            let differs = replicated_input_differs(&|a, p, b| sh.same_expr(r, a, p, b));
            // Every rank's share `b / n` adds up to `b` in a sum of the
            // pieces; their average gets `b / n` (a finding stays).
            lift_reads_scaled = !differs && red == Red::Sum && tensor_inputs_scaled(rp);
            // The same replicated term added by every rank (no peer computes it
            // otherwise, up to the results of collectives, which every member of their
            // group shares: DeepSeek's aux loss on cp, whose all-reduced router counts
            // sum pieces computed across the ring) to an average: the pieces average to
            // the average plus the term. Not a share `b / n` (the average gets `b / n`),
            // and not on `pp`, where the stages' pieces are their own tensors. That every
            // member adds it, alike, and that each collective met is a shared leaf (its
            // region's replicated operands alike), is the output comparison's check
            // (`region::Operands::every_member`).
            // The peer comparison last: it walks both graphs.
            let avg_of_shared_term = red == Red::Avg
                && !stage_dim
                && !inputs
                    .iter()
                    .any(|&v| place(v) == Place::Replicate && scaled_of(v))
                && !replicated_input_differs(&|a, p, b| {
                    same_above_collectives(g, a, &sh.program.ranks[p], b)
                });
            if avg_of_shared_term {
                Some(vec![Place::Partial(red); nout])
            } else if differs && red != Red::Sum {
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
                (differs || lift_reads_scaled).then(|| vec![Place::Partial(red); nout])
            }
        }
        _ => None,
    };
    if let Some(l) = lifted {
        *result = l;
        *violation = None;
    }

    (lift_reads_scaled, lone_term_why)
}

/// Whether node `a` of `g` and node `b` of `h` compute the same expression (operators and
/// literals), taking the results of two collectives of the same operator and literal
/// arguments (group, reduction) as one leaf: every member of the group holds the same result,
/// whatever pieces its members reduce. Only a first reading: the output comparison checks
/// each such pair's region (`outputs.rs`).
fn same_above_collectives(g: &Graph, a: usize, h: &Graph, b: usize) -> bool {
    type Call<'g> = (
        &'g shardproof_ir::OpName,
        Vec<&'g Arg>,
        &'g Vec<(String, Arg)>,
    );
    fn collective(gr: &Graph, w: usize) -> Option<Call<'_>> {
        let n = &gr.nodes[w];
        let NodeKind::Call { op, .. } = &n.kind else {
            return None;
        };
        if op.namespace != "_c10d_functional" || op.name != "wait_tensor" {
            return None;
        }
        let c = n.inputs().first()?.node;
        match &gr.nodes[c].kind {
            NodeKind::Call { op, args, kwargs } if op.namespace == "_c10d_functional" => {
                Some((op, args.iter().skip(1).collect::<Vec<_>>(), kwargs))
            }
            _ => None,
        }
    }
    let leaf = |x: usize, y: usize| match (collective(g, x), collective(h, y)) {
        (Some((o1, a1, k1)), Some((o2, a2, k2))) => Some(
            o1 == o2
                && a1.len() == a2.len()
                && a1.iter().zip(&a2).all(|(u, v)| same_arg(u, v))
                && k1.len() == k2.len()
                && k1
                    .iter()
                    .zip(k2)
                    .all(|((n1, u), (n2, v))| n1 == n2 && same_arg(u, v)),
        ),
        _ => None,
    };
    super::same_expression_upto(
        g,
        None,
        a,
        h,
        None,
        b,
        &mut Default::default(),
        &leaf,
        &|_, _| false,
    )
}
