//! The communication schedule of a distributed program, simulated without values: which calls
//! of a collective meet, which send each recv takes, and where the ranks would wait forever.
//!
//! The simulation follows [`run_program`](crate::run_program)'s rules exactly, so every engine
//! pairs collectives the way the interpreter runs them: a rank runs its graph in program order
//! and stops at its next collective, send or recv; a collective runs once every member of its
//! group stops at a collective of the *same group name and operator* (ranks that name two
//! groups covering the same ranks still wait on two communicators); a send never blocks; a recv
//! takes the oldest message from its source with its tag. Two ranks can therefore only pair
//! collectives they issue in one consistent order, and a program whose calls cannot meet is a
//! hang, never a sum over whatever calls happen to share a rank set.

use crate::exec::located;
use crate::live_values;
use shardproof_ir::{Arg, Graph, NodeKind, OpMeaning, OpName, Program};
use shardproof_ops::{
    p2p_call, program_members, Args, GroupMembers, NoValues, OpClass, OpDef, P2pEnd, Registry,
};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::rc::Rc;
use std::sync::Arc;

/// One collective as it runs: the calls of every member of its group, in member order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Meeting {
    /// The process group's name, as every member names it.
    pub group: String,
    /// The collective operator (namespace, name and overload).
    pub op: OpName,
    /// Per member of the group, in member order: (rank, node index of its call).
    pub calls: Vec<(usize, usize)>,
}

/// Why the ranks' communication cannot run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScheduleProblem {
    /// A call the case cannot give a meaning to: a group the case does not define (on a mesh of
    /// more than one dim), a rank outside its group, a peer outside the mesh, arguments that
    /// do not bind. The message names the graph file, line and node.
    Invalid(String),
    /// The ranks wait on each other forever (or a message is never received): a bug in the
    /// distributed program. The message says where each rank waits.
    Hang(String),
}

impl ScheduleProblem {
    /// The message, with the file, line and node where it arises.
    pub fn message(&self) -> &str {
        match self {
            ScheduleProblem::Invalid(m) | ScheduleProblem::Hang(m) => m,
        }
    }
}

/// The simulated schedule of a program.
#[derive(Clone, Debug, Default)]
pub struct Schedule {
    /// The collectives that run, in the order they complete.
    pub meetings: Vec<Meeting>,
    /// Per recv (rank, node): the send (rank, node) whose message it takes.
    pub messages: BTreeMap<(usize, usize), (usize, usize)>,
    /// The first reason the schedule cannot complete; `None` when every call meets.
    pub problem: Option<ScheduleProblem>,
}

/// Ranks whose liveness is the same: a shared graph (by address) and the leaves given.
type LiveKey<'a> = (*const Graph, &'a BTreeSet<String>);

/// Ranks whose calls are the same up to their peers: a shared graph and the leaves given.
type CallsKey<'a> = (*const Graph, Option<&'a BTreeSet<String>>);

/// A rank's call that needs the other ranks.
#[derive(Clone, Debug)]
enum Call {
    Collective { group: String, op: OpName },
    Send { peer: usize, tag: i64 },
    Recv { peer: usize, tag: i64 },
}

fn kwargs_of(kind: &NodeKind) -> &[(String, Arg)] {
    match kind {
        NodeKind::Call { kwargs, .. } => kwargs,
        _ => &[],
    }
}

/// A call of a graph that needs other ranks, as far as it is the same on every rank that
/// runs the graph: a collective is resolved; a send or recv names its peer by the rank's
/// groups, so it is bound per rank ([`rank_calls`]); a collective that does not bind is the
/// problem every such rank meets there.
#[derive(Clone)]
enum GraphCall {
    Ready(Call),
    PointToPoint(&'static OpDef),
    Invalid(ScheduleProblem),
}

/// The calls of `graph` that need other ranks, in program order, as (node index, call). With
/// `leaves`, the names of the values the rank is given, a collective is issued only where the
/// interpreter runs it: its inputs are computed and its outputs are not all given. Sends and
/// recvs are always issued: their partners must learn of them either way. Nothing here reads
/// the rank, so ranks that share a graph and leaves share the list (a preset's thousands of
/// ranks hold a few graphs; looking each node's operator up per rank was most of a 405b
/// schedule).
fn graph_calls(
    graph: &Graph,
    custom_ops: &BTreeMap<String, OpMeaning>,
    leaves: Option<(&BTreeSet<String>, &[Vec<bool>])>,
) -> Vec<(usize, GraphCall)> {
    let reg = Registry::builtin();
    let (live, leaves) = (leaves.map(|(_, live)| live), leaves.map(|(l, _)| l));
    let issued = |i: usize| {
        let Some(live) = live else { return true };
        let node = &graph.nodes[i];
        let given = node
            .outputs
            .iter()
            .all(|o| leaves.is_some_and(|l| l.contains(&o.name)));
        !given
            && node.inputs().iter().all(|v| {
                live.get(v.node)
                    .and_then(|l| l.get(v.output))
                    .copied()
                    .unwrap_or(false)
            })
    };
    let mut out = Vec::new();
    for (i, node) in graph.nodes.iter().enumerate() {
        let NodeKind::Call { op, .. } = &node.kind else {
            continue;
        };
        // A declared meaning replaces the registry's, as in the interpreter.
        if !custom_ops.is_empty()
            && (custom_ops.contains_key(&op.to_string()) || custom_ops.contains_key(&op.base()))
        {
            continue;
        }
        let Some(def) = reg.get(op) else { continue };
        match def.class {
            OpClass::PointToPoint => out.push((i, GraphCall::PointToPoint(def))),
            OpClass::Collective if issued(i) => {
                let invalid = |e: &dyn std::fmt::Display| {
                    GraphCall::Invalid(ScheduleProblem::Invalid(located(
                        graph,
                        node,
                        e.to_string(),
                    )))
                };
                let call =
                    match Args::bind(&def.schema, node.args(), kwargs_of(&node.kind), &NoValues)
                        .and_then(|bound| bound.str("group_name"))
                    {
                        Ok(group) => GraphCall::Ready(Call::Collective {
                            group,
                            op: OpName::new(&op.namespace, &op.name, &def.name.overload),
                        }),
                        Err(e) => invalid(&e),
                    };
                let stop = matches!(call, GraphCall::Invalid(_));
                out.push((i, call));
                if stop {
                    break;
                }
            }
            _ => {}
        }
    }
    out
}

/// Rank's calls from its graph's ([`graph_calls`]), its sends and recvs bound to its peers
/// through `members`; the first problem in program order.
fn rank_calls(
    graph: &Graph,
    calls: &[(usize, GraphCall)],
    members: GroupMembers,
) -> Result<Vec<(usize, Call)>, ScheduleProblem> {
    let mut out = Vec::with_capacity(calls.len());
    for (i, call) in calls {
        let call = match call {
            GraphCall::Ready(c) => c.clone(),
            GraphCall::Invalid(p) => return Err(p.clone()),
            GraphCall::PointToPoint(def) => {
                let node = &graph.nodes[*i];
                let invalid = |e: &dyn std::fmt::Display| {
                    ScheduleProblem::Invalid(located(graph, node, e.to_string()))
                };
                let bound = Args::bind(&def.schema, node.args(), kwargs_of(&node.kind), &NoValues)
                    .map_err(|e| invalid(&e))?;
                let c = p2p_call(def, &bound, members).map_err(|e| invalid(&e))?;
                match c.end {
                    P2pEnd::Send => Call::Send {
                        peer: c.peer,
                        tag: c.tag,
                    },
                    P2pEnd::Recv => Call::Recv {
                        peer: c.peer,
                        tag: c.tag,
                    },
                }
            }
        };
        out.push((*i, call));
    }
    Ok(out)
}

/// The members of `group` as rank `rank` sees it, by the interpreter's rule: a group the case
/// does not define means every rank on a one-dim mesh and is an error otherwise.
fn members_of(
    program: &Program,
    group: &str,
    rank: usize,
    graph: &Graph,
    node: usize,
) -> Result<Vec<usize>, ScheduleProblem> {
    let node = &graph.nodes[node];
    // One rule for group names, shared with the point-to-point peers (`program_members`).
    program_members(program, rank)(group).ok_or_else(|| {
        let why = if program.group(group).is_some() {
            format!(
                "rank {rank} is not a member of process group `{group}`; hint: check the \
                 case's `groups:` and the mesh"
            )
        } else {
            format!(
                "process group `{group}` is not defined by the case's `groups:`; hint: map the \
                 group name to mesh dims under `impl.groups`"
            )
        };
        ScheduleProblem::Invalid(located(graph, node, why))
    })
}

/// Simulates the communication of `program` (see the module docs). Custom operators declared
/// in `custom_ops` have their declared meaning and never communicate. `leaves`, per rank, names
/// the values a run gives that rank (see [`calls`]'s rule; a case's `Case::rank_leaves`);
/// `None` issues every collective.
///
/// ```
/// use shardproof_import::parse_fx;
/// use shardproof_interp::schedule;
/// use shardproof_ir::{Mesh, ProcessGroup, Program};
/// use std::collections::BTreeMap;
/// use std::path::Path;
///
/// let rank = |group: &str| {
///     let text = format!(
///         "def forward(self, x: \"f32[4]\"):\n    \
///          r: \"f32[4]\" = torch.ops._c10d_functional.all_reduce.default(x, 'sum', '{group}')\n    \
///          w: \"f32[4]\" = torch.ops._c10d_functional.wait_tensor.default(r)\n    \
///          return (w,)\n"
///     );
///     parse_fx(&text, Path::new("rank.py")).unwrap().graph
/// };
/// let mesh = Mesh::new(vec![("tp".into(), 2)]);
/// let group = |name: &str| ProcessGroup { name: name.into(), members: mesh.groups_along(&[0]) };
/// let (tp, world) = (group("tp"), group("world"));
/// let program = |names: [&str; 2]| Program {
///     mesh: mesh.clone(),
///     groups: vec![tp.clone(), world.clone()],
///     ranks: names.iter().map(|g| std::sync::Arc::new(rank(g))).collect(),
/// };
/// // Both ranks on `tp`: the all-reduce runs.
/// let ok = schedule(&program(["tp", "tp"]), &BTreeMap::new(), None);
/// assert!(ok.problem.is_none());
/// assert_eq!(ok.meetings.len(), 1);
/// // `world` covers the same ranks, but it is another communicator: the ranks hang.
/// let split = schedule(&program(["world", "tp"]), &BTreeMap::new(), None);
/// assert!(matches!(split.problem, Some(shardproof_interp::ScheduleProblem::Hang(_))));
/// ```
pub fn schedule(
    program: &Program,
    custom_ops: &BTreeMap<String, OpMeaning>,
    leaves: Option<&[BTreeSet<String>]>,
) -> Schedule {
    let mut out = Schedule::default();
    let mut per_rank = Vec::with_capacity(program.ranks.len());
    // Ranks that share a graph and are given the same leaves compute the same values: their
    // liveness is computed once (a preset's thousands of ranks hold a few graphs).
    let mut live_of: HashMap<LiveKey, Rc<Vec<Vec<bool>>>> = HashMap::new();
    let mut calls_of: HashMap<CallsKey, Rc<Vec<(usize, GraphCall)>>> = HashMap::new();
    for (r, g) in program.ranks.iter().enumerate() {
        let rank_leaves = leaves.and_then(|l| l.get(r));
        let graph_calls = calls_of
            .entry((Arc::as_ptr(g), rank_leaves))
            .or_insert_with(|| {
                let live = rank_leaves.map(|l| {
                    live_of
                        .entry((Arc::as_ptr(g), l))
                        .or_insert_with(|| Rc::new(live_values(g, l)))
                        .clone()
                });
                Rc::new(graph_calls(
                    g,
                    custom_ops,
                    rank_leaves.zip(live.as_deref().map(Vec::as_slice)),
                ))
            })
            .clone();
        match rank_calls(
            g,
            &graph_calls,
            &shardproof_ops::program_members(program, r),
        ) {
            Ok(c) => per_rank.push(c),
            Err(p) => {
                out.problem = Some(p);
                return out;
            }
        }
    }
    let n = per_rank.len();
    let mut next = vec![0usize; n];
    // (source, destination, tag) -> the sends in flight (rank, node), oldest first.
    let mut mailbox: BTreeMap<(usize, usize, i64), VecDeque<(usize, usize)>> = BTreeMap::new();
    loop {
        let mut progressed = false;
        // Point-to-point first: sends never block, recvs take what has arrived.
        for r in 0..n {
            while let Some((node, call)) = per_rank[r].get(next[r]) {
                match *call {
                    Call::Send { peer, tag } => {
                        if peer >= n {
                            out.problem = Some(peer_outside(program, r, *node, peer, "sends to"));
                            return out;
                        }
                        mailbox
                            .entry((r, peer, tag))
                            .or_default()
                            .push_back((r, *node));
                    }
                    Call::Recv { peer, tag } => {
                        if peer >= n {
                            out.problem =
                                Some(peer_outside(program, r, *node, peer, "receives from"));
                            return out;
                        }
                        let Some(send) = mailbox
                            .get_mut(&(peer, r, tag))
                            .and_then(VecDeque::pop_front)
                        else {
                            break;
                        };
                        out.messages.insert((r, *node), send);
                    }
                    Call::Collective { .. } => break,
                }
                next[r] += 1;
                progressed = true;
            }
        }
        for r in 0..n {
            let Some((node, Call::Collective { group, op })) = per_rank[r].get(next[r]) else {
                continue;
            };
            let members = match members_of(program, group, r, &program.ranks[r], *node) {
                Ok(m) => m,
                Err(p) => {
                    out.problem = Some(p);
                    return out;
                }
            };
            let member_calls: Option<Vec<(usize, usize)>> = members
                .iter()
                .map(|&m| match per_rank.get(m).and_then(|c| c.get(next[m])) {
                    Some((ni, Call::Collective { group: g, op: o })) if g == group && o == op => {
                        Some((m, *ni))
                    }
                    _ => None,
                })
                .collect();
            let Some(member_calls) = member_calls else {
                continue;
            };
            for &(m, _) in &member_calls {
                next[m] += 1;
            }
            out.meetings.push(Meeting {
                group: group.clone(),
                op: op.clone(),
                calls: member_calls,
            });
            progressed = true;
        }
        if (0..n).all(|r| next[r] >= per_rank[r].len()) {
            break;
        }
        if !progressed {
            out.problem = Some(ScheduleProblem::Hang(describe_hang(
                program, &per_rank, &next,
            )));
            return out;
        }
    }
    if let Some((&(src, dst, tag), queue)) = mailbox.iter().find(|(_, q)| !q.is_empty()) {
        let (r, ni) = queue[0];
        let g = &program.ranks[r];
        out.problem = Some(ScheduleProblem::Hang(located(
            g,
            &g.nodes[ni],
            format!(
                "sends a message to rank {dst} with tag {tag} that rank {dst} never receives \
                 (from rank {src}); hint: every send needs a recv on its destination from its \
                 rank with the same tag"
            ),
        )));
    }
    out
}

fn peer_outside(
    program: &Program,
    r: usize,
    node: usize,
    peer: usize,
    what: &str,
) -> ScheduleProblem {
    let g = &program.ranks[r];
    ScheduleProblem::Invalid(located(
        g,
        &g.nodes[node],
        format!(
            "{what} rank {peer}, but the program has {} rank(s); hint: ranks are global ranks \
             of the mesh, row-major",
            program.ranks.len()
        ),
    ))
}

/// Where each rank waits when no call can complete.
fn describe_hang(program: &Program, per_rank: &[Vec<(usize, Call)>], next: &[usize]) -> String {
    let mut lines = Vec::new();
    for (r, calls) in per_rank.iter().enumerate() {
        let g = &program.ranks[r];
        match calls.get(next[r]) {
            None => lines.push(format!("rank {r} has finished its graph")),
            Some((ni, call)) => {
                let what = match call {
                    Call::Collective { group, op } => {
                        format!("waits in {op} on process group `{group}`")
                    }
                    Call::Recv { peer, tag } => format!(
                        "waits for a message from rank {peer} with tag {tag} that never comes"
                    ),
                    Call::Send { .. } => unreachable!("sends never block"),
                };
                lines.push(located(g, &g.nodes[*ni], what));
            }
        }
    }
    format!(
        "the ranks' communication cannot complete (a hang): {}; hint: a collective runs only \
         when every member of its group calls the same collective on the same group name, in \
         the same order (two group names over the same ranks are two communicators); a recv \
         takes the sends from its source with its tag, in order",
        lines.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardproof_import::parse_fx;
    use shardproof_ir::{Mesh, ProcessGroup};
    use std::path::Path;

    fn graph(body: &str) -> Graph {
        let text = format!("def forward(self, x: \"f32[4]\"):\n{body}    return (x,)\n");
        parse_fx(&text, Path::new("rank.py")).unwrap().graph
    }

    fn all_reduce(name: &str, group: &str) -> String {
        format!(
            "    {name}: \"f32[4]\" = torch.ops._c10d_functional.all_reduce.default(x, 'sum', '{group}')\n"
        )
    }

    fn all_gather(name: &str, group: &str) -> String {
        format!(
            "    {name}: \"f32[8]\" = torch.ops._c10d_functional.all_gather_into_tensor.default(x, 2, '{group}')\n"
        )
    }

    fn program(mesh: Mesh, groups: Vec<ProcessGroup>, ranks: Vec<String>) -> Program {
        Program {
            mesh,
            groups,
            ranks: ranks
                .iter()
                .map(|b| std::sync::Arc::new(graph(b)))
                .collect(),
        }
    }

    fn group(mesh: &Mesh, name: &str, dims: &[usize]) -> ProcessGroup {
        ProcessGroup {
            name: name.into(),
            members: mesh.groups_along(dims),
        }
    }

    fn tp2() -> (Mesh, Vec<ProcessGroup>) {
        let mesh = Mesh::new(vec![("tp".into(), 2)]);
        let groups = vec![group(&mesh, "tp", &[0]), group(&mesh, "world", &[0])];
        (mesh, groups)
    }

    #[test]
    fn calls_in_one_order_meet() {
        let (mesh, groups) = tp2();
        let body = all_reduce("a", "tp") + &all_gather("b", "tp");
        let s = schedule(
            &program(mesh, groups, vec![body.clone(), body]),
            &BTreeMap::new(),
            None,
        );
        assert_eq!(s.problem, None);
        assert_eq!(s.meetings.len(), 2);
        assert_eq!(s.meetings[0].calls, vec![(0, 1), (1, 1)]);
    }

    #[test]
    fn aliased_groups_do_not_meet() {
        let (mesh, groups) = tp2();
        let s = schedule(
            &program(
                mesh,
                groups,
                vec![all_reduce("a", "world"), all_reduce("a", "tp")],
            ),
            &BTreeMap::new(),
            None,
        );
        let Some(ScheduleProblem::Hang(m)) = s.problem else {
            panic!("{:?}", s.problem)
        };
        assert!(m.contains("rank.py:2"), "{m}");
    }

    #[test]
    fn different_collectives_do_not_meet() {
        let (mesh, groups) = tp2();
        let s = schedule(
            &program(
                mesh,
                groups,
                vec![all_reduce("a", "tp"), all_gather("a", "tp")],
            ),
            &BTreeMap::new(),
            None,
        );
        assert!(matches!(s.problem, Some(ScheduleProblem::Hang(_))));
    }

    #[test]
    fn crossed_orders_hang() {
        let mesh2 = Mesh::new(vec![("dp".into(), 1), ("tp".into(), 2)]);
        let groups = vec![group(&mesh2, "tp", &[1]), group(&mesh2, "dp_tp", &[0, 1])];
        let r0 = all_reduce("a", "tp") + &all_reduce("b", "dp_tp");
        let r1 = all_reduce("a", "dp_tp") + &all_reduce("b", "tp");
        let s = schedule(
            &program(mesh2, groups, vec![r0, r1]),
            &BTreeMap::new(),
            None,
        );
        assert!(matches!(s.problem, Some(ScheduleProblem::Hang(_))), "{s:?}");
    }

    #[test]
    fn a_missing_call_hangs() {
        let (mesh, groups) = tp2();
        let s = schedule(
            &program(mesh, groups, vec![all_reduce("a", "tp"), String::new()]),
            &BTreeMap::new(),
            None,
        );
        assert!(matches!(s.problem, Some(ScheduleProblem::Hang(_))));
    }

    #[test]
    fn an_undefined_group_is_invalid_on_a_2d_mesh() {
        let mesh = Mesh::new(vec![("dp".into(), 1), ("tp".into(), 2)]);
        let groups = vec![group(&mesh, "tp", &[1])];
        let s = schedule(
            &program(
                mesh,
                groups,
                vec![all_reduce("a", "nope"), all_reduce("a", "nope")],
            ),
            &BTreeMap::new(),
            None,
        );
        assert!(matches!(s.problem, Some(ScheduleProblem::Invalid(_))));
    }
}
