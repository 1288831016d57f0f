//! A stage's rank graphs keyed by their dataflow and their schedule's pairing, not by the order
//! their nodes were written in (the memo key's node part, under [`super::renumber`]).
//!
//! On a 1F1B pipeline every pipeline stage interleaves its microbatches' forward and backward
//! passes differently (stage `s` runs `pp - s - 1` forwards before its first backward), so the
//! same layer's backward slice lists its nodes in another program order on every pipeline
//! stage; and a send or recv names its peer by its index in the `pp` group, which is another
//! number on every pipeline stage. Neither changes what the stage computes: a rank's values are
//! a function of its dataflow graph and of which calls its collectives meet and which send
//! each recv takes. So where the stage's own schedule completes and every meeting is
//! *diagonal* (each member's call is the same node of the canonical order), the key writes
//! each graph in a canonical order ([`NodeOrder`]: depth first from the outputs, arguments in
//! order, then the nodes not reached in program order), the peers of point-to-point calls
//! blank, and the messages (each recv's send) by holder position and canonical node. See
//! docs/prove/stages.md, "Memo up to node order", for the argument.

use shardproof_case::Case;
use shardproof_ir::{Graph, NodeKind};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

/// A graph's nodes in canonical order: depth first from its outputs (in output order, every
/// node after its arguments, in argument order), then depth first from every node not reached,
/// in program order.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct NodeOrder {
    /// The nodes, in canonical order.
    pub(super) order: Vec<usize>,
    /// Per node: its place in [`NodeOrder::order`].
    pub(super) place: Vec<usize>,
}

impl NodeOrder {
    /// The canonical order of `g`'s nodes (iterative: a deep model's slice has thousands of
    /// nodes in one chain).
    pub(super) fn of(g: &Graph) -> NodeOrder {
        let n = g.nodes.len();
        let mut place = vec![usize::MAX; n];
        let mut order = Vec::with_capacity(n);
        let roots = g
            .outputs
            .iter()
            .flatten()
            .map(|v| v.node)
            .chain(0..n)
            .collect::<Vec<_>>();
        // The stack holds (node, its inputs, the next input to visit).
        let mut stack: Vec<(usize, Vec<usize>, usize)> = Vec::new();
        let mut entered = vec![false; n];
        for root in roots {
            if root >= n || entered[root] {
                continue;
            }
            entered[root] = true;
            stack.push((root, inputs(g, root), 0));
            while let Some((node, ins, next)) = stack.last_mut() {
                if let Some(&arg) = ins.get(*next) {
                    *next += 1;
                    if arg < n && !entered[arg] {
                        entered[arg] = true;
                        let ins = inputs(g, arg);
                        stack.push((arg, ins, 0));
                    }
                } else {
                    place[*node] = order.len();
                    order.push(*node);
                    stack.pop();
                }
            }
        }
        NodeOrder { order, place }
    }
}

/// The nodes a node reads, in argument order.
fn inputs(g: &Graph, node: usize) -> Vec<usize> {
    g.nodes[node].inputs().iter().map(|v| v.node).collect()
}

/// The argument of a point-to-point call that names its peer (`dst` of a send, `src` of a
/// recv: `send(Tensor input, int dst, ...)`, `recv(SymInt[] size, ScalarType dtype, int src,
/// ...)`), as a position among the positional arguments or a keyword: the key writes it blank
/// where it writes the messages instead.
pub(super) fn peer_argument(op: &shardproof_ir::OpName) -> Option<(usize, &'static str)> {
    if op.namespace != shardproof_ops::P2P_NAMESPACE {
        return None;
    }
    match op.name.as_str() {
        "send" => Some((1, "dst")),
        "recv" => Some((2, "src")),
        _ => None,
    }
}

/// The canonical orders of a program's graphs, one per distinct graph (by address).
pub(super) struct Orders {
    by_graph: HashMap<*const Graph, Arc<NodeOrder>>,
    per_rank: Vec<Arc<NodeOrder>>,
}

impl Orders {
    /// Every rank's canonical order.
    pub(super) fn of(case: &Case) -> Orders {
        let mut by_graph: HashMap<*const Graph, Arc<NodeOrder>> = HashMap::new();
        let per_rank = case
            .program
            .ranks
            .iter()
            .map(|g| {
                by_graph
                    .entry(Arc::as_ptr(g))
                    .or_insert_with(|| Arc::new(NodeOrder::of(g)))
                    .clone()
            })
            .collect();
        Orders { by_graph, per_rank }
    }

    /// The canonical order of a graph of the program.
    pub(super) fn of_graph(&self, g: &Arc<Graph>) -> Option<&NodeOrder> {
        self.by_graph.get(&Arc::as_ptr(g)).map(|o| &**o)
    }

    /// A rank's node's place in its graph's canonical order.
    pub(super) fn place(&self, rank: usize, node: usize) -> usize {
        self.per_rank
            .get(rank)
            .and_then(|o| o.place.get(node).copied())
            .unwrap_or(usize::MAX)
    }
}

/// The pairing of a stage's schedule in canonical nodes, or `None` where the key must keep
/// program order: the schedule does not complete, or some meeting is not diagonal (its members'
/// calls are not one canonical node). `name` writes a rank as the key does (its holder
/// position). The pairing written is the messages, each recv's send, sorted; the meetings
/// need nothing written: diagonal, each is the calls at one canonical node of the members of
/// one group set, which the graphs and group sets in the key determine.
pub(super) fn pairing(
    case: &Case,
    orders: &Orders,
    name: &dyn Fn(usize) -> usize,
) -> Option<String> {
    let program = &case.program;
    let leaves: Vec<BTreeSet<String>> = (0..program.ranks.len())
        .map(|r| {
            if program.ranks[r].nodes.is_empty() {
                BTreeSet::new()
            } else {
                case.rank_leaves(r)
            }
        })
        .collect();
    let sched = shardproof_interp::schedule(program, &case.ops, Some(&leaves));
    if sched.problem.is_some() {
        return None;
    }
    for meet in &sched.meetings {
        let mut places = meet.calls.iter().map(|&(r, n)| orders.place(r, n));
        let first = places.next()?;
        if places.any(|p| p != first) {
            return None;
        }
    }
    let mut messages: Vec<((usize, usize), (usize, usize))> = sched
        .messages
        .iter()
        .map(|(&(rr, rn), &(sr, sn))| {
            (
                (name(rr), orders.place(rr, rn)),
                (name(sr), orders.place(sr, sn)),
            )
        })
        .collect();
    messages.sort_unstable();
    let mut out = String::from("messages");
    for ((rr, rn), (sr, sn)) in messages {
        out.push_str(&format!(" {rr}.{rn}<-{sr}.{sn}"));
    }
    out.push('\n');
    Some(out)
}

/// Whether a node is a point-to-point call.
pub(super) fn is_p2p(kind: &NodeKind) -> bool {
    matches!(kind, NodeKind::Call { op, .. } if op.namespace == shardproof_ops::P2P_NAMESPACE)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A two-rank case (mesh { tp: 2 }, group `tp`) whose rank graphs are `texts` (FX text), `x`
    /// and `y` replicated.
    fn case_of(texts: [&str; 2]) -> (tempfile::TempDir, Case) {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let spec = "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[2]\", y: \"f32[2]\"):\n        w: \"f32[2]\" = torch.ops.aten.relu.default(x)\n        return (w,)\n";
        std::fs::write(d.join("spec.py"), spec).unwrap();
        for (k, t) in texts.iter().enumerate() {
            std::fs::write(d.join(format!("r{k}.py")), t).unwrap();
        }
        let case = "version: 1\nname: orders\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r1.py]\n  groups:\n    \"tp\": tp\ninputs:\n  x: Replicate()\n  y: Replicate()\n";
        std::fs::write(d.join("case.yaml"), case).unwrap();
        let case = shardproof_case::load_case(&d.join("case.yaml")).unwrap();
        (dir, case)
    }

    /// A stage whose own schedule does not complete (rank 0 gathers over `tp`, rank 1 never
    /// does) has no pairing to write: its key keeps program order.
    #[test]
    fn a_schedule_that_hangs_has_no_canonical_pairing() {
        let gather = "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[2]\", y: \"f32[2]\"):\n        g: \"f32[4]\" = torch.ops._c10d_functional.all_gather_into_tensor.default(x, 2, 'tp')\n        w: \"f32[4]\" = torch.ops._c10d_functional.wait_tensor.default(g)\n        return (w,)\n";
        let alone = "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[2]\", y: \"f32[2]\"):\n        w: \"f32[2]\" = torch.ops.aten.relu.default(x)\n        return (w,)\n";
        let (_d, case) = case_of([gather, alone]);
        let orders = Orders::of(&case);
        assert!(pairing(&case, &orders, &|r| r).is_none());
        // Both ranks gathering, it completes (no messages to write).
        let (_d, case) = case_of([gather, gather]);
        let orders = Orders::of(&case);
        assert_eq!(
            pairing(&case, &orders, &|r| r).as_deref(),
            Some("messages\n")
        );
    }

    /// Two programs computing the same values with independent nodes written in another order
    /// get one canonical order (node for node), and every node is placed after its arguments.
    #[test]
    fn independent_nodes_in_another_order_get_one_canonical_order() {
        let (_d, case) = case_of([
            "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[2]\", y: \"f32[2]\"):\n        a: \"f32[2]\" = torch.ops.aten.neg.default(x)\n        b: \"f32[2]\" = torch.ops.aten.exp.default(y)\n        c: \"f32[2]\" = torch.ops.aten.add.Tensor(a, b)\n        return (c,)\n",
            "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[2]\", y: \"f32[2]\"):\n        b: \"f32[2]\" = torch.ops.aten.exp.default(y)\n        a: \"f32[2]\" = torch.ops.aten.neg.default(x)\n        c: \"f32[2]\" = torch.ops.aten.add.Tensor(a, b)\n        return (c,)\n",
        ]);
        let (first, second) = (&*case.program.ranks[0], &*case.program.ranks[1]);
        assert_ne!(first.nodes[2].name, second.nodes[2].name);
        let (o1, o2) = (NodeOrder::of(first), NodeOrder::of(second));
        let names = |g: &Graph, o: &NodeOrder| -> Vec<String> {
            o.order.iter().map(|&i| g.nodes[i].name.clone()).collect()
        };
        assert_eq!(names(first, &o1), names(second, &o2));
        for g in [first, second] {
            let o = NodeOrder::of(g);
            assert_eq!(o.order.len(), g.nodes.len());
            for (i, node) in g.nodes.iter().enumerate() {
                for v in node.inputs() {
                    assert!(o.place[v.node] < o.place[i]);
                }
            }
        }
    }
}
