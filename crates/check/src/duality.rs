//! Gradient duality (the seed's table): when a rank's program has a backward, every forward
//! communication has its dual in the backward. all-gather <-> reduce-scatter (or an
//! all-reduce, which the rank then slices; none where only replicated computation reads the
//! gathered tensor: its gradient is replicated and the dual is a local slice), all-to-all <->
//! all-to-all, send <-> recv (reversed; a message along a mesh dim other than the pipeline's,
//! a ring's, pairs with any backward message along that dim: a ring's gradients may travel on
//! around it to their owner; a send of a forward value, an activation, answers none); an
//! all-reduce's dual is the identity (nothing), and the identity's all-reduce is what the placement rules check (a gradient that stays partial).
//!
//! Forward and backward of one rank graph: the forward is everything the loss (a 0-d float
//! output of the graph) depends on; the backward is every other call that depends on the
//! forward; it is run only where some of it reaches a value the graph returns besides the loss
//! or sends a value the forward did not make (work a forward-only program keeps for a backward
//! it does not run, as a ring attention's merged log-sum-exp, is no backward). A rank without a loss (an early pipeline stage) has a backward when it both sends
//! and receives floating-point messages along the pipeline (`pp`); there the forward sends to
//! a peer pair with the recvs from it, one for one (messages along other mesh dims, a ring's,
//! are no stage boundary). A rank with neither has no backward, and the check does not apply.
//! Only floating-point tensors carry gradients: integer and boolean traffic (token ids,
//! masks) needs no dual.

use crate::report::{Check, RawFinding};
use shardproof_ir::{Arg, Graph, Mesh, NodeKind, OpName, ValueId};
use shardproof_ops::{p2p_node_call, GroupMembers, Meta, P2pEnd};
use std::collections::BTreeMap;

/// Operators that take a rank's piece of a tensor.
const SLICING: &[&str] = &[
    "slice",
    "narrow",
    "select",
    "split",
    "split_with_sizes",
    "chunk",
    "unbind",
    "index_select",
];

/// What a communication operator is, for pairing.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Comm {
    AllGather(String),
    ReduceScatter(String),
    AllToAll(String),
    AllReduce(String),
    Send(usize),
    Recv(usize),
}

impl Comm {
    /// The communication of a call; a send's or recv's peer is global, resolved through
    /// `members` (a call whose peer does not resolve pairs with nothing here: the schedule
    /// reports it).
    fn of(
        op: &OpName,
        args: &[Arg],
        kwargs: &[(String, Arg)],
        members: GroupMembers,
    ) -> Option<Comm> {
        let text = |k: usize, key: &str| -> Option<String> {
            args.get(k)
                .or_else(|| kwargs.iter().find(|(n, _)| n == key).map(|(_, a)| a))
                .and_then(|a| match a {
                    Arg::Str(s) => Some(s.clone()),
                    _ => None,
                })
        };
        match (op.namespace.as_str(), op.name.as_str()) {
            ("_c10d_functional", "all_gather_into_tensor") => {
                text(2, "group_name").map(Comm::AllGather)
            }
            ("_c10d_functional", "reduce_scatter_tensor") => {
                text(3, "group_name").map(Comm::ReduceScatter)
            }
            ("_c10d_functional", "all_to_all_single") => text(3, "group_name").map(Comm::AllToAll),
            ("_c10d_functional", "all_reduce") => text(2, "group_name").map(Comm::AllReduce),
            (shardproof_ops::P2P_NAMESPACE, _) => {
                let c = p2p_node_call(op, args, kwargs, members)?.ok()?;
                Some(match c.end {
                    P2pEnd::Send => Comm::Send(c.peer),
                    P2pEnd::Recv => Comm::Recv(c.peer),
                })
            }
            _ => None,
        }
    }

    /// The backward operator a forward one needs, if any.
    fn dual(&self) -> Option<Comm> {
        match self {
            Comm::AllGather(g) => Some(Comm::ReduceScatter(g.clone())),
            Comm::ReduceScatter(g) => Some(Comm::AllGather(g.clone())),
            Comm::AllToAll(g) => Some(Comm::AllToAll(g.clone())),
            Comm::Send(p) => Some(Comm::Recv(*p)),
            Comm::Recv(p) => Some(Comm::Send(*p)),
            Comm::AllReduce(_) => None,
        }
    }

    fn describe(&self, mesh: &Mesh) -> String {
        let rank = |r: &usize| {
            let c: Vec<String> = mesh
                .dims
                .iter()
                .zip(mesh.coords(*r))
                .map(|((d, _), c)| format!("{d}={c}"))
                .collect();
            format!("rank {r} ({})", c.join(" "))
        };
        match self {
            Comm::AllGather(g) => format!("an all-gather over `{g}`"),
            Comm::ReduceScatter(g) => format!("a reduce-scatter over `{g}`"),
            Comm::AllToAll(g) => format!("an all-to-all over `{g}`"),
            Comm::AllReduce(g) => format!("an all-reduce over `{g}`"),
            Comm::Send(p) => format!("a send to {}", rank(p)),
            Comm::Recv(p) => format!("a recv from {}", rank(p)),
        }
    }
}

/// The gradient-duality findings of rank `rank` (`metas`: the local type of every value;
/// `varies_over(v, group)`: whether value `v` is placed other than `Replicate()` on a mesh dim
/// the group spans; `members`: the rank's process groups, for group-relative peers).
pub fn duality(
    graph: &Graph,
    rank: usize,
    mesh: &Mesh,
    members: GroupMembers,
    metas: &[Vec<Option<Meta>>],
    varies_over: &dyn Fn(ValueId, &str) -> bool,
) -> Vec<RawFinding> {
    let n = graph.nodes.len();
    let meta = |v: ValueId| {
        metas
            .get(v.node)
            .and_then(|o| o.get(v.output))
            .cloned()
            .flatten()
    };
    let is_float = |v: ValueId| meta(v).is_some_and(|m| m.dtype.is_float());
    // The communication of every call, with whether it carries a gradient-bearing tensor.
    let comms: Vec<Option<Comm>> = graph
        .nodes
        .iter()
        .enumerate()
        .map(|(i, node)| {
            let NodeKind::Call { op, args, kwargs } = &node.kind else {
                return None;
            };
            let c = Comm::of(op, args, kwargs, members)?;
            let carried = match c {
                Comm::Recv(_) => ValueId::new(i, 0),
                _ => *node.inputs().first()?,
            };
            is_float(carried).then_some(c)
        })
        .collect();
    let losses: Vec<ValueId> = graph
        .outputs
        .iter()
        .flatten()
        .copied()
        .filter(|&v| meta(v).is_some_and(|m| m.shape.is_empty() && m.dtype.is_float()))
        .collect();
    let mut forward = vec![false; n];
    let mut backward = vec![false; n];
    if let Some(&loss) = losses.first() {
        // Ancestors of the loss.
        forward[loss.node] = true;
        for i in (0..n).rev() {
            if forward[i] {
                for v in graph.nodes[i].inputs() {
                    forward[v.node] = true;
                }
            }
        }
        let mut reaches = forward.clone();
        for (i, node) in graph.nodes.iter().enumerate() {
            if forward[i] || !matches!(node.kind, NodeKind::Call { .. }) {
                continue;
            }
            if node.inputs().iter().any(|v| reaches[v.node]) {
                reaches[i] = true;
                backward[i] = true;
            }
        }
        // A backward is run only where some of it reaches what the program returns besides
        // the loss (gradients, updated parameters) or sends a value the forward did not make
        // (a gradient to the previous stage). Work the forward keeps for a backward it does
        // not run (a forward-only ring attention's merged log-sum-exp, its sends of
        // activations) is no backward: it asked a forward-only program for duals.
        let mut returned = vec![false; n];
        for v in graph.outputs.iter().flatten() {
            if *v != loss {
                returned[v.node] = true;
            }
        }
        for i in (0..n).rev() {
            if returned[i] {
                for v in graph.nodes[i].inputs() {
                    returned[v.node] = true;
                }
            }
        }
        let sends_a_gradient = |i: usize| {
            matches!(comms[i], Some(Comm::Send(_)))
                && graph.nodes[i]
                    .inputs()
                    .first()
                    .is_some_and(|v| !forward[v.node])
        };
        if !(0..n).any(|i| backward[i] && (returned[i] || sends_a_gradient(i))) {
            return Vec::new();
        }
    } else {
        // No loss here: a pipeline stage has a backward when it both sends and receives
        // along the pipeline (`pp`). Messages along other mesh dims are no stage boundary (a
        // context-parallel ring passes chunks forward to one peer and takes them from
        // another), so they pair with nothing here.
        let pp = (0..mesh.dims.len()).find(|&m| crate::is_pipeline_dim(mesh, m));
        let along_pp = |peer: usize| {
            let (a, b) = (mesh.coords(rank), mesh.coords(peer));
            pp.is_some_and(|d| a[d] != b[d]) && (0..a.len()).all(|k| Some(k) == pp || a[k] == b[k])
        };
        let comms: Vec<Option<Comm>> = comms
            .into_iter()
            .map(|c| match c {
                Some(Comm::Send(p) | Comm::Recv(p)) if !along_pp(p) => None,
                c => c,
            })
            .collect();
        let sends = comms.iter().any(|c| matches!(c, Some(Comm::Send(_))));
        let recvs = comms.iter().any(|c| matches!(c, Some(Comm::Recv(_))));
        if !(sends && recvs) {
            return Vec::new();
        }
        // Forward: the first message to or from each peer in each direction is the forward
        // one, the reversed message that follows is its dual; pair them in program order.
        return pair_messages(graph, rank, mesh, &comms);
    }
    // Pair forward communication with backward duals, in program order, per kind.
    // A send of a forward value carries no gradient: the forward's own sends (no ancestors of
    // the loss, so counted as backward above) and a backward's second trip of activations
    // round a ring answer no forward message (they answered every ring's forward recvs, the
    // backward sending nothing: `tests/review_ring_backward.rs`).
    let carries_activation = |i: usize| {
        matches!(comms[i], Some(Comm::Send(_)))
            && graph.nodes[i]
                .inputs()
                .first()
                .is_some_and(|v| forward[v.node])
    };
    let mut pool: BTreeMap<Comm, Vec<usize>> = BTreeMap::new();
    for (i, c) in comms.iter().enumerate() {
        if let Some(c) = c.as_ref().filter(|_| backward[i] && !carries_activation(i)) {
            pool.entry(c.clone()).or_default().push(i);
        }
    }
    let consumers = graph.consumers();
    let mut out = Vec::new();
    let mut unmatched = Vec::new();
    for (i, c) in comms.iter().enumerate() {
        let Some(c) = c.as_ref().filter(|_| forward[i]) else {
            continue;
        };
        let Some(dual) = c.dual() else { continue };
        // An all-gather whose result only feeds replicated computation has a replicated
        // gradient: its dual is a local slice, no communication (Megatron's gather before a
        // replicated head). It needs a reduce-scatter where sharded computation reads it.
        if let Comm::AllGather(group) = c {
            if !feeds_sharded(graph, i, group, &consumers, &forward, varies_over) {
                continue;
            }
        }
        // An all-reduce then the rank's slice is a reduce-scatter too (Megatron's backward of
        // a gather from the sequence-parallel region when the gradient is all-reduced).
        let mut candidates = vec![dual.clone()];
        if let Comm::AllGather(g) = c {
            candidates.push(Comm::AllReduce(g.clone()));
        }
        // A ring's message (along a mesh dim other than the pipeline's) may have its gradient
        // travel on around the ring, in the forward's direction, back to its owner (a
        // context-parallel ring backward with more than two ranks): any backward message
        // along the same mesh dim pairs with it. Whether the gradient arrives is the ring
        // reading's question (a key block's record is only its owner's rows when complete).
        if let Comm::Send(p) | Comm::Recv(p) = c {
            if let Some(d) = ring_dim(mesh, rank, *p) {
                candidates.extend(
                    pool.iter()
                        .filter(|(k, v)| {
                            !v.is_empty()
                                && matches!(k, Comm::Send(q) | Comm::Recv(q)
                                    if ring_dim(mesh, rank, *q) == Some(d))
                        })
                        .map(|(k, _)| k.clone()),
                );
            }
        }
        let found = candidates
            .iter()
            .find(|k| pool.get(*k).is_some_and(|v| !v.is_empty()))
            .cloned();
        match found {
            Some(k) => {
                if let Some(v) = pool.get_mut(&k) {
                    v.remove(0);
                }
            }
            None => unmatched.push((i, c, dual)),
        }
    }
    // Reported once every pairing is made, so that "instead" names a backward operator
    // that is itself left without a forward partner.
    for (i, c, dual) in unmatched {
        out.push(missing(graph, rank, mesh, i, c, &dual, &pool, &comms));
    }
    out
}

/// The mesh dim a message between `rank` and `peer` travels along, where it is one dim and
/// not the pipeline's (a ring's, a context-parallel exchange's).
fn ring_dim(mesh: &Mesh, rank: usize, peer: usize) -> Option<usize> {
    let (a, b) = (mesh.coords(rank), mesh.coords(peer));
    if a.len() != b.len() {
        return None;
    }
    let mut differing = (0..a.len()).filter(|&k| a[k] != b[k]);
    let d = differing.next()?;
    (differing.next().is_none() && !crate::is_pipeline_dim(mesh, d)).then_some(d)
}

/// Whether the value of node `start` reaches, through forward operators whose results stay
/// replicated over `group`, an operator whose result is not replicated over it.
fn feeds_sharded(
    graph: &Graph,
    start: usize,
    group: &str,
    consumers: &[Vec<usize>],
    forward: &[bool],
    varies_over: &dyn Fn(ValueId, &str) -> bool,
) -> bool {
    let mut stack = vec![start];
    let mut seen = vec![false; consumers.len()];
    while let Some(i) = stack.pop() {
        for &j in &consumers[i] {
            if seen[j] || !forward[j] {
                continue;
            }
            seen[j] = true;
            // A rank taking its own piece of a replicated tensor (the scatter into a
            // sequence-parallel region) has an all-gather as its backward: the gradient that
            // reaches the gathered tensor through it is replicated.
            if graph.nodes[j]
                .op()
                .is_some_and(|op| SLICING.contains(&op.name.as_str()))
            {
                continue;
            }
            if varies_over(ValueId::new(j, 0), group) {
                return true;
            }
            stack.push(j);
        }
    }
    false
}

/// A forward operator without its backward dual; names a backward operator over the same
/// group or peer that is there instead, if any.
#[allow(clippy::too_many_arguments)]
fn missing(
    graph: &Graph,
    rank: usize,
    mesh: &Mesh,
    i: usize,
    c: &Comm,
    dual: &Comm,
    pool: &BTreeMap<Comm, Vec<usize>>,
    comms: &[Option<Comm>],
) -> RawFinding {
    let same_target = |x: &Comm| match (x, dual) {
        (
            Comm::AllGather(a) | Comm::ReduceScatter(a) | Comm::AllToAll(a) | Comm::AllReduce(a),
            Comm::AllGather(b) | Comm::ReduceScatter(b) | Comm::AllToAll(b),
        ) => a == b,
        (Comm::Send(a) | Comm::Recv(a), Comm::Send(b) | Comm::Recv(b)) => a == b,
        _ => false,
    };
    let instead = pool
        .iter()
        .filter(|(k, _)| same_target(k))
        .flat_map(|(_, v)| v.iter().copied())
        .min();
    let node = &graph.nodes[i];
    let mut message = format!(
        "the forward `{}` ({}) has no dual in the backward: its gradient needs {}",
        node.name,
        c.describe(mesh),
        dual.describe(mesh)
    );
    let mut placements = vec![format!("forward `{}`: {}", node.name, c.describe(mesh))];
    if let Some(j) = instead {
        let other = comms[j]
            .as_ref()
            .map_or(String::new(), |o| o.describe(mesh));
        message.push_str(&format!(
            ", but the backward has `{}` ({other}) instead",
            graph.nodes[j].name
        ));
        placements.push(format!("backward `{}`: {other}", graph.nodes[j].name));
    }
    RawFinding {
        check: Check::GradientDuality,
        rank,
        node: i,
        message,
        placements,
        hint: format!(
            "the gradient of `{}` must go through {} in the backward",
            node.name,
            dual.describe(mesh)
        ),
    }
}

/// On a stage without a loss: per peer, the messages sent to it and received from it pair
/// up one for one (activations forward, their gradients back).
fn pair_messages(
    graph: &Graph,
    rank: usize,
    mesh: &Mesh,
    comms: &[Option<Comm>],
) -> Vec<RawFinding> {
    let mut per_peer: BTreeMap<usize, (Vec<usize>, Vec<usize>)> = BTreeMap::new();
    for (i, c) in comms.iter().enumerate() {
        match c {
            Some(Comm::Send(p)) => per_peer.entry(*p).or_default().0.push(i),
            Some(Comm::Recv(p)) => per_peer.entry(*p).or_default().1.push(i),
            _ => {}
        }
    }
    let mut out = Vec::new();
    for (_, (sends, recvs)) in per_peer {
        let (extra, first_kind) = if sends.len() > recvs.len() {
            (&sends[recvs.len()..], true)
        } else {
            (&recvs[sends.len()..], false)
        };
        for &i in extra {
            let c = comms[i].clone().unwrap_or(Comm::Send(0));
            let dual = c.dual().unwrap_or(Comm::Recv(0));
            let node = &graph.nodes[i];
            out.push(RawFinding {
                check: Check::GradientDuality,
                rank,
                node: i,
                message: format!(
                    "`{}` ({}) has no reversed message: this stage {} its peer more often than it {} it, so a gradient (or an activation) never travels back",
                    node.name,
                    c.describe(mesh),
                    if first_kind { "sends to" } else { "receives from" },
                    if first_kind { "receives from" } else { "sends to" },
                ),
                placements: vec![format!("`{}`: {}", node.name, c.describe(mesh))],
                hint: format!("add {} for the gradient of `{}`", dual.describe(mesh), node.name),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::{check_case_without_fixes, plan::parse_plan, Check};
    use std::path::Path;

    fn duality_findings(text: &str) -> Vec<(String, String)> {
        let case = parse_plan(Path::new("d.plan"), text).unwrap();
        let report = check_case_without_fixes(&case).unwrap();
        report
            .findings
            .iter()
            .filter(|f| f.check == Check::GradientDuality)
            .map(|f| (f.node.clone(), f.message.clone()))
            .collect()
    }

    const MOE: &str = "mesh ep=2\n\
        input x: f32[4, 8] ep=Shard(0)\n\
        input w: f32[8, 8]\n\
        sent = _c10d_functional.all_to_all_single(x, [1, 1], [1, 1], \"ep\")\n\
        routed = _c10d_functional.wait_tensor(sent)\n\
        h = mm(routed, w)\n\
        s = sum(h)\n\
        loss = all_reduce(s, sum, ep)\n\
        output loss\n\
        g = ones_like(h)\n\
        wt = t(w)\n\
        gx = mm(g, wt)\n\
        output gx ep=Shard(0)\n";

    #[test]
    fn an_all_to_all_needs_an_all_to_all_in_the_backward() {
        let found = duality_findings(MOE);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, "sent");
        assert!(
            found[0].1.contains("needs an all-to-all over `ep`"),
            "{found:?}"
        );
        let fixed = format!(
            "{MOE}back = _c10d_functional.all_to_all_single(gx, [1, 1], [1, 1], \"ep\")\n\
             gxr = _c10d_functional.wait_tensor(back)\noutput gxr ep=Shard(0)\n"
        );
        assert!(duality_findings(&fixed).is_empty());
    }

    #[test]
    fn forward_only_programs_and_integer_traffic_need_no_dual() {
        // No backward: the all-gather's dual is not asked for.
        let text = "mesh tp=2\ninput x: f32[4, 8] tp=Shard(0)\ninput w: f32[8, 8] tp=Shard(1)\n\
                    xf = all_gather(x, tp)\nh = mm(xf, w)\noutput h tp=Shard(1)\n";
        assert!(duality_findings(text).is_empty());
        // Work the forward keeps for a backward it does not run (returned by nothing) is no
        // backward: a forward-only program with such work was asked for the all-gather's dual.
        let text = "mesh tp=2\ninput x: f32[4, 8] tp=Shard(0)\ninput w: f32[8, 8] tp=Shard(1)\n\
                    xf = all_gather(x, tp)\nh = mm(xf, w)\nkept = exp(h)\nl = sum(h)\n\
                    output l\n";
        assert!(duality_findings(text).is_empty());
        // Token ids gathered in the forward carry no gradient.
        let text = "mesh tp=2\ninput ids: i64[4] tp=Shard(0)\ninput emb: f32[16, 8]\n\
                    idsf = all_gather(ids, tp)\nrows = embedding(emb, idsf)\nl = sum(rows)\n\
                    output l\ng = ones_like(rows)\n";
        assert!(duality_findings(text).is_empty());
    }
}
