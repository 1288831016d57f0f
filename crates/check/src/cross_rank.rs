//! The checks across ranks that read the simulated schedule and the pipeline orders: the
//! schedule's hang and mismatched collectives or messages, each pipeline's completeness and
//! gradient sync, the point-to-point routes the duality check compares, and the merging of
//! the ranks' raw findings into the report's.

use super::*;

/// What decides a rank's gradient duality besides its placements: its graph and local metas
/// (by allocation) and its point-to-point routes ([`p2p_routes`]).
pub(crate) type DualityKey = (*const Graph, *const RankMetas, Vec<P2pRoute>);

/// Where a point-to-point call goes: whether it sends, and its peer's coordinates minus the
/// rank's (`None`: the route does not resolve).
pub(crate) type P2pRoute = Option<(bool, Vec<i64>)>;

/// Per point-to-point node of rank `r`'s graph (`nodes`), where the call goes as the duality
/// check reads it: whether it sends, and its peer's coordinates minus `r`'s (`None` where the
/// route does not resolve). `None` where some peer is no rank of the program (no offset
/// stands for it: such a rank is checked on its own).
pub(crate) fn p2p_routes(
    program: &shardproof_ir::Program,
    r: usize,
    nodes: &[usize],
) -> Option<Vec<P2pRoute>> {
    let members = shardproof_ops::program_members(program, r);
    let mine = program.mesh.coords(r);
    let mut out = Vec::with_capacity(nodes.len());
    for &i in nodes {
        let NodeKind::Call { op, args, kwargs } = &program.ranks[r].nodes[i].kind else {
            out.push(None);
            continue;
        };
        let route = match shardproof_ops::p2p_node_call(op, args, kwargs, &members) {
            Some(Ok(c)) if c.peer >= program.ranks.len() => return None,
            Some(Ok(c)) => Some((
                c.end == shardproof_ops::P2pEnd::Send,
                program
                    .mesh
                    .coords(c.peer)
                    .iter()
                    .zip(&mine)
                    .map(|(&a, &b)| a as i64 - b as i64)
                    .collect(),
            )),
            _ => None,
        };
        out.push(route);
    }
    Some(out)
}

/// The pipeline order of each pipeline along the `pp` mesh dim: completeness and gradient
/// sync (its deadlocks are the schedule's hang, reported as such).
pub(crate) fn pipeline_findings(
    program: &shardproof_ir::Program,
    prop: &Propagation,
) -> Vec<RawFinding> {
    let Some(pp) = program
        .mesh
        .dim_index("pp")
        .filter(|&d| program.mesh.dims[d].1 > 1)
    else {
        return Vec::new();
    };
    let hang = matches!(prop.schedule.problem, Some(ScheduleProblem::Hang(_)));
    let mut out = Vec::new();
    let dp_groups = pipeline::dp_group_names(program);
    for first in (0..program.ranks.len()).filter(|&r| program.mesh.coords(r)[pp] == 0) {
        let Some(order) = pipeline::order_with_dp_groups(program, pp, first, &dp_groups) else {
            continue;
        };
        for problem in pipeline::check_order(&order) {
            let device = match &problem {
                pipeline::PipelineProblem::Deadlock(_)
                | pipeline::PipelineProblem::NeverSent { .. }
                    if hang =>
                {
                    continue
                }
                pipeline::PipelineProblem::Deadlock(c) => c.first().map_or(0, |x| x.0),
                pipeline::PipelineProblem::NeverSent { device, .. }
                | pipeline::PipelineProblem::Missing { device, .. }
                | pipeline::PipelineProblem::Duplicate { device, .. }
                | pipeline::PipelineProblem::BackwardBeforeForward { device, .. }
                | pipeline::PipelineProblem::GradSync { device, .. } => *device,
            };
            let mut coords = program.mesh.coords(first);
            coords[pp] = device;
            let rank = program.mesh.rank(&coords);
            let g = &program.ranks[rank];
            // The stage's first point-to-point call locates it.
            let node = g
                .nodes
                .iter()
                .position(|n| n.op().is_some_and(|o| o.namespace == "shardproof_p2p"))
                .unwrap_or(0);
            out.push(RawFinding {
                check: Check::PipelineSchedule,
                rank,
                node,
                message: format!("pipeline stage {device} (messages tagged by microbatch): {}", problem.describe(&order)),
                placements: Vec::new(),
                hint: "every stage runs the forward and the backward of every microbatch once, and synchronizes its gradients after the last backward".into(),
            });
        }
    }
    out
}

pub(crate) fn group_name_for(
    prop: &Propagation,
    program: &shardproof_ir::Program,
    m: usize,
) -> String {
    engine::group_reducing(&prop.groups, &program.mesh, m)
}

pub(crate) fn located(g: &Graph, i: usize) -> String {
    let file = g
        .path
        .as_ref()
        .map_or_else(|| g.name.clone(), |p| p.display().to_string());
    match g.nodes[i].line {
        Some(l) => format!("{file}:{l}: `{}`", g.nodes[i].name),
        None => format!("{file}: `{}`", g.nodes[i].name),
    }
}

/// Findings of the same check, node name and message on several ranks become one.
pub(crate) fn merge_findings(
    program: &shardproof_ir::Program,
    raw: Vec<RawFinding>,
) -> Vec<Finding> {
    let mut order: Vec<(Check, String, String)> = Vec::new();
    let mut by: HashMap<(Check, String, String), Finding> = HashMap::new();
    for f in raw {
        let g = &program.ranks[f.rank];
        let node = &g.nodes[f.node];
        let key = (f.check, node.name.clone(), f.message.clone());
        match by.get_mut(&key) {
            Some(e) => {
                if !e.ranks.contains(&f.rank) {
                    e.ranks.push(f.rank);
                }
            }
            None => {
                order.push(key.clone());
                by.insert(
                    key,
                    Finding {
                        check: f.check,
                        ranks: vec![f.rank],
                        node: node.name.clone(),
                        op: node.op().map(|o| o.to_string()),
                        file: g
                            .path
                            .as_ref()
                            .map_or_else(|| g.name.clone(), |p| p.display().to_string()),
                        line: node.line,
                        source: node.loc.as_ref().map(|l| format!("{}:{}", l.file, l.line)),
                        message: f.message,
                        placements: f.placements,
                        hint: f.hint,
                    },
                );
            }
        }
    }
    order
        .into_iter()
        .filter_map(|k| by.remove(&k))
        .map(|mut f| {
            f.ranks.sort_unstable();
            f
        })
        .collect()
}

/// The schedule's hang (with each rank's pending call), and collectives or messages that meet
/// with incompatible types or sizes.
pub(crate) fn schedule_findings(case: &Case, prop: &Propagation) -> Vec<RawFinding> {
    let program = &case.program;
    let sched = &prop.schedule;
    let reg = Registry::builtin();
    let mut out = Vec::new();
    let meta = |r: usize, v: ValueId| {
        prop.metas[r]
            .get(v.node)
            .and_then(|o| o.get(v.output))
            .cloned()
            .flatten()
    };
    if let Some(ScheduleProblem::Hang(message)) = &sched.problem {
        let mut completed: BTreeSet<(usize, usize)> = BTreeSet::new();
        for m in &sched.meetings {
            completed.extend(m.calls.iter().copied());
        }
        completed.extend(sched.messages.keys().copied());
        let leaves: Vec<BTreeSet<String>> = (0..program.ranks.len())
            .map(|r| case.rank_leaves(r))
            .collect();
        let mut pending: Vec<(usize, usize, bool)> = Vec::new();
        for (r, g) in program.ranks.iter().enumerate() {
            let live = live_values(g, &leaves[r]);
            for (i, node) in g.nodes.iter().enumerate() {
                let Some(op) = node.op() else { continue };
                if case.op_meaning(op).is_some() {
                    continue;
                }
                let Some(def) = reg.get(op) else { continue };
                let collective = def.class == OpClass::Collective;
                let recv = def.class == OpClass::PointToPoint && op.name == "recv";
                if !(collective || recv) || completed.contains(&(r, i)) {
                    continue;
                }
                if collective
                    && !node.inputs().iter().all(|v| {
                        live.get(v.node)
                            .and_then(|l| l.get(v.output))
                            .copied()
                            .unwrap_or(false)
                    })
                {
                    continue;
                }
                pending.push((r, i, collective));
                break;
            }
        }
        let any_collective = pending.iter().any(|p| p.2);
        let check = if any_collective {
            Check::CollectiveMismatch
        } else {
            Check::DependencyViolation
        };
        let placements: Vec<String> = pending
            .iter()
            .map(|&(r, i, _)| {
                let g = &program.ranks[r];
                format!("rank {r} waits at {}", located(g, i))
            })
            .collect();
        for &(r, i, _) in &pending {
            out.push(RawFinding {
                check,
                rank: r,
                node: i,
                message: message.clone(),
                placements: placements.clone(),
                hint: if any_collective {
                    "every member of a group must issue the same collectives on the same group name, in the same order".into()
                } else {
                    "every recv needs a send from its source with its tag, issued before the sender waits on the receiver".into()
                },
            });
        }
        if pending.is_empty() {
            // A message nobody receives: the schedule names its send.
            out.push(RawFinding {
                check: Check::DependencyViolation,
                rank: 0,
                node: 0,
                message: message.clone(),
                placements: Vec::new(),
                hint: "every send needs a recv on its destination from its rank with the same tag"
                    .into(),
            });
        }
    }
    for m in &sched.meetings {
        let input = |r: usize, i: usize| program.ranks[r].nodes[i].inputs().first().copied();
        let types: Vec<Option<shardproof_ops::Meta>> = m
            .calls
            .iter()
            .map(|&(r, i)| input(r, i).and_then(|v| meta(r, v)))
            .collect();
        let all_to_all = m.op.name == "all_to_all_single";
        let first = &types[0];
        let differs = types.iter().any(|t| {
            if all_to_all {
                t.as_ref()
                    .map(|t| (t.dtype, t.shape.get(1..).map(<[usize]>::to_vec)))
                    != first
                        .as_ref()
                        .map(|f| (f.dtype, f.shape.get(1..).map(<[usize]>::to_vec)))
            } else {
                t != first
            }
        });
        let (r0, i0) = m.calls[0];
        if differs {
            let placements: Vec<String> = m
                .calls
                .iter()
                .zip(&types)
                .map(|(&(r, i), t)| {
                    let ty = t
                        .as_ref()
                        .map_or("?".into(), |t| format!("{}{:?}", t.dtype, t.shape));
                    format!("rank {r}: {} reads {ty}", located(&program.ranks[r], i))
                })
                .collect();
            for &(r, i) in &m.calls {
                out.push(RawFinding {
                    check: Check::CollectiveMismatch,
                    rank: r,
                    node: i,
                    message: format!("the members of `{}` on group `{}` pass tensors of different types or sizes", m.op, m.group),
                    placements: placements.clone(),
                    hint: "every member of a collective must pass a tensor of the same shape and dtype".into(),
                });
            }
        }
        // group_size against the group.
        if matches!(
            m.op.name.as_str(),
            "all_gather_into_tensor" | "reduce_scatter_tensor"
        ) {
            let node = &program.ranks[r0].nodes[i0];
            let NodeKind::Call { args, kwargs, .. } = &node.kind else {
                continue;
            };
            let Some(def) = reg.get(&m.op) else { continue };
            let Ok(b) =
                shardproof_ops::Args::bind(&def.schema, args, kwargs, &shardproof_ops::NoValues)
            else {
                continue;
            };
            let n = b.int("group_size").unwrap_or(0);
            if n != m.calls.len() as i64 {
                out.push(RawFinding {
                    check: Check::ShapeDivisibility,
                    rank: r0,
                    node: i0,
                    message: format!(
                        "`{}` says group_size {n}, but group `{}` has {} members",
                        m.op,
                        m.group,
                        m.calls.len()
                    ),
                    placements: Vec::new(),
                    hint: format!("pass group_size {}", m.calls.len()),
                });
            }
        }
    }
    for (&(rr, ri), &(sr, si)) in &sched.messages {
        let sent = program.ranks[sr].nodes[si]
            .inputs()
            .first()
            .and_then(|&v| meta(sr, v));
        let got = meta(rr, ValueId::new(ri, 0));
        if sent.is_some() && got.is_some() && sent != got {
            out.push(RawFinding {
                check: Check::DependencyViolation,
                rank: rr,
                node: ri,
                message: format!(
                    "receives a message of type {} sent by rank {sr} ({}), but declares {}",
                    sent.as_ref()
                        .map_or("?".into(), |t| format!("{}{:?}", t.dtype, t.shape)),
                    located(&program.ranks[sr], si),
                    got.as_ref()
                        .map_or("?".into(), |t| format!("{}{:?}", t.dtype, t.shape)),
                ),
                placements: Vec::new(),
                hint: "the recv's size and dtype must be those of the tensor its send passes"
                    .into(),
            });
        }
    }
    out
}
