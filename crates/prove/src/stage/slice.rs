//! Cutting a program into one stage: the backward slice of the stage's targets in the spec and
//! in every rank, stopping at tensors whose relation is known, closed under the collectives and
//! messages that pair ranks, and rebuilt as standalone graphs whose cut tensors are inputs.

use shardproof_interp::Schedule;
use shardproof_ir::{Arg, Graph, Node, NodeKind, Output, TensorType, ValueId};
use shardproof_ops::Meta;
use std::collections::HashSet;
use std::sync::Arc;

/// What a node of the full graph becomes in a stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Mark {
    /// Not part of the stage.
    Out,
    /// Computed by the stage, as in the full graph.
    Computed,
    /// A tensor whose relation is known: an input of the stage.
    Boundary,
}

/// The slice of one graph: a mark per node of the full graph.
pub(crate) struct Marks {
    pub(crate) marks: Vec<Mark>,
}

impl Marks {
    pub(crate) fn new(graph: &Graph) -> Marks {
        Marks {
            marks: vec![Mark::Out; graph.nodes.len()],
        }
    }

    /// Adds to the slice the nodes `starts` read, transitively, stopping at `stops`. The
    /// starting nodes are computed even where they are stops themselves (a cut is the target
    /// of its own stage). Returns whether anything was added.
    pub(crate) fn close(
        &mut self,
        graph: &Graph,
        starts: &[usize],
        stops: &HashSet<ValueId>,
    ) -> Result<bool, String> {
        let mut computed = Vec::new();
        self.close_noting(graph, starts, stops, &mut computed)
    }

    /// [`Marks::close`], noting in `computed` every node it marks computed (that was not).
    pub(crate) fn close_noting(
        &mut self,
        graph: &Graph,
        starts: &[usize],
        stops: &HashSet<ValueId>,
        computed: &mut Vec<usize>,
    ) -> Result<bool, String> {
        let mut added = false;
        let mut stack: Vec<(usize, bool)> = starts.iter().map(|&n| (n, true)).collect();
        while let Some((n, start)) = stack.pop() {
            let node = &graph.nodes[n];
            let stop =
                !start && (0..node.outputs.len()).any(|k| stops.contains(&ValueId::new(n, k)));
            let want = if stop { Mark::Boundary } else { Mark::Computed };
            match (self.marks[n], want) {
                (Mark::Computed, _) | (Mark::Boundary, Mark::Boundary) => continue,
                _ => {}
            }
            if stop && node.outputs.len() != 1 {
                // A node with several outputs cannot become one input; a cut there would
                // need the stage to split the node.
                return Err(format!(
                    "a cut in graph `{}` is an output of `{}`, a node with {} outputs; a stage can only begin at a single-output node",
                    graph.name,
                    node.name,
                    node.outputs.len()
                ));
            }
            self.marks[n] = want;
            added = true;
            if want == Mark::Computed {
                computed.push(n);
                for v in node.inputs() {
                    stack.push((v.node, false));
                }
            }
        }
        Ok(added)
    }

    #[cfg(test)]
    pub(crate) fn computed(&self, n: usize) -> bool {
        self.marks[n] == Mark::Computed
    }
}

/// The slices of the ranks of a stage: `None` for a rank that holds nothing of it (most ranks
/// of a pipeline plan hold nothing of a given layer), so that a stage's marks cost what the
/// ranks holding part of it cost, not a mark per node of every rank's whole graph.
pub(crate) type RankMarks = Vec<Option<Marks>>;

/// Rank `r`'s marks, created (nothing marked) where it had none.
pub(crate) fn marks_of<'a>(
    marks: &'a mut RankMarks,
    ranks: &[Arc<Graph>],
    r: usize,
) -> &'a mut Marks {
    marks[r].get_or_insert_with(|| Marks::new(&ranks[r]))
}

/// [`Marks::close`] on rank `r` from `start`, noting every node it computes in `work`.
fn close_rank(
    ranks: &[Arc<Graph>],
    marks: &mut RankMarks,
    stops: &[HashSet<ValueId>],
    (r, start): (usize, usize),
    work: &mut Vec<(usize, usize)>,
) -> Result<(), String> {
    let mut computed = Vec::new();
    marks_of(marks, ranks, r).close_noting(&ranks[r], &[start], &stops[r], &mut computed)?;
    work.extend(computed.into_iter().map(|n| (r, n)));
    Ok(())
}

/// What pairs a call of the whole run with other ranks.
#[derive(Clone, Copy, Debug)]
enum Partner {
    /// The call is one of this meeting's (an index into the schedule's meetings).
    Meeting(usize),
    /// The call is a message's send or receive, and this (rank, node) its other end.
    Message(usize, usize),
}

/// The whole run's pairing indexed by call, built once per plan: every rank's calls that pair
/// it with others (a collective's meeting, a message's other end), sorted by node. A stage
/// finds the partners of the calls it computes here instead of scanning every meeting of the
/// run (about 1,600 times per stage on an 8192-rank plan, round after round).
pub(crate) struct PairingIndex<'a> {
    sched: &'a Schedule,
    /// Per rank: (node, partner), sorted by node.
    calls: Vec<Vec<(usize, Partner)>>,
}

impl<'a> PairingIndex<'a> {
    /// Indexes `sched`, the schedule of a program of `nranks` ranks.
    pub(crate) fn new(sched: &'a Schedule, nranks: usize) -> PairingIndex<'a> {
        let mut calls: Vec<Vec<(usize, Partner)>> = vec![Vec::new(); nranks];
        let mut add = |r: usize, n: usize, p: Partner| {
            if let Some(c) = calls.get_mut(r) {
                c.push((n, p));
            }
        };
        for (m, meet) in sched.meetings.iter().enumerate() {
            for &(r, n) in &meet.calls {
                add(r, n, Partner::Meeting(m));
            }
        }
        for (&(rr, rn), &(sr, sn)) in &sched.messages {
            add(rr, rn, Partner::Message(sr, sn));
            add(sr, sn, Partner::Message(rr, rn));
        }
        for c in &mut calls {
            c.sort_by_key(|&(n, _)| n);
        }
        PairingIndex { sched, calls }
    }

    /// What pairs node `n` of rank `r`.
    fn partners(&self, r: usize, n: usize) -> &[(usize, Partner)] {
        let Some(c) = self.calls.get(r) else {
            return &[];
        };
        let from = c.partition_point(|&(x, _)| x < n);
        let to = from + c[from..].partition_point(|&(x, _)| x == n);
        &c[from..to]
    }

    /// Whether the whole run has a meeting of exactly `calls` (its members' calls in order).
    fn has_meeting(&self, calls: &[(usize, usize)]) -> bool {
        let Some(&(r, n)) = calls.first() else {
            return self.sched.meetings.iter().any(|m| m.calls.is_empty());
        };
        self.partners(r, n).iter().any(|&(_, p)| match p {
            Partner::Meeting(m) => self.sched.meetings[m].calls == calls,
            Partner::Message(..) => false,
        })
    }
}

/// Closes the ranks' slices under the full program's pairing: a collective computed on one
/// member is computed on all, and a message's send and receive go together. The stage's
/// collectives are then whole meetings of the full run, so they pair as they do there.
///
/// `work` holds the calls computed so far (rank, node), as [`Marks::close_noting`] noted them:
/// each computed node's partners are closed once, and the nodes that closing computes join
/// the work. The rules only ever add marks and each fires on a node being computed, so this
/// reaches the same least closed marks as rescanning every meeting and message until nothing
/// changes, in time proportional to the stage.
pub(crate) fn close_under_pairing(
    ranks: &[Arc<Graph>],
    marks: &mut RankMarks,
    stops: &[HashSet<ValueId>],
    index: &PairingIndex,
    mut work: Vec<(usize, usize)>,
) -> Result<(), String> {
    let mut met: HashSet<usize> = HashSet::new();
    while let Some((r, n)) = work.pop() {
        for &(_, p) in index.partners(r, n) {
            match p {
                Partner::Meeting(m) => {
                    if met.insert(m) {
                        for &call in &index.sched.meetings[m].calls {
                            close_rank(ranks, marks, stops, call, &mut work)?;
                        }
                    }
                }
                Partner::Message(pr, pn) => close_rank(ranks, marks, stops, (pr, pn), &mut work)?,
            }
        }
    }
    Ok(())
}

/// The closure by rescanning every meeting and message of the run until nothing changes, on
/// dense marks: the plan's code before [`close_under_pairing`], kept to check it against.
#[cfg(test)]
pub(crate) fn close_under_pairing_by_rescan(
    ranks: &[Arc<Graph>],
    marks: &mut [Marks],
    stops: &[HashSet<ValueId>],
    sched: &Schedule,
) -> Result<(), String> {
    loop {
        let mut changed = false;
        for meet in &sched.meetings {
            if meet.calls.iter().any(|&(r, n)| marks[r].computed(n)) {
                for &(r, n) in &meet.calls {
                    changed |= marks[r].close(&ranks[r], &[n], &stops[r])?;
                }
            }
        }
        for (&(rr, rn), &(sr, sn)) in &sched.messages {
            if marks[rr].computed(rn) || marks[sr].computed(sn) {
                changed |= marks[rr].close(&ranks[rr], &[rn], &stops[rr])?;
                changed |= marks[sr].close(&ranks[sr], &[sn], &stops[sr])?;
            }
        }
        if !changed {
            return Ok(());
        }
    }
}

/// A stage graph and where its nodes came from.
pub(crate) struct Sliced {
    pub(crate) graph: Graph,
    /// The stage node of every full-graph node in the slice.
    pub(crate) map: Vec<Option<usize>>,
    /// The full-graph node of every stage node.
    pub(crate) origin: Vec<usize>,
}

impl Sliced {
    /// The stage value of a full-graph value, if the slice holds it.
    pub(crate) fn value(&self, v: ValueId) -> Option<ValueId> {
        self.map[v.node].map(|n| ValueId::new(n, v.output))
    }
}

fn remap(arg: &Arg, map: &[Option<usize>]) -> Arg {
    match arg {
        Arg::Value(v) => Arg::Value(ValueId::new(
            map[v.node].expect("a computed node's inputs are in the slice"),
            v.output,
        )),
        Arg::List(items) => Arg::List(items.iter().map(|a| remap(a, map)).collect()),
        other => other.clone(),
    }
}

/// The slice's nodes in an order that renaming does not change: the leaves (inputs, cut
/// tensors, constants) by their first use, unused ones after them, then the computed nodes in
/// the graph's order. Two layers emitted alike then give equal stage graphs, although the
/// whole graph declares all layers' weights before any layer's first node.
fn canonical_order(graph: &Graph, marks: &Marks) -> Vec<usize> {
    let leaf = |i: usize| {
        marks.marks[i] == Mark::Boundary
            || (marks.marks[i] == Mark::Computed
                && matches!(
                    graph.nodes[i].kind,
                    NodeKind::Input | NodeKind::Constant { .. }
                ))
    };
    let mut order = Vec::new();
    let mut placed = vec![false; graph.nodes.len()];
    for (i, node) in graph.nodes.iter().enumerate() {
        if marks.marks[i] != Mark::Computed || leaf(i) {
            continue;
        }
        for v in node.inputs() {
            if leaf(v.node) && !placed[v.node] {
                placed[v.node] = true;
                order.push(v.node);
            }
        }
    }
    order.extend((0..graph.nodes.len()).filter(|&i| leaf(i) && !placed[i]));
    order.extend((0..graph.nodes.len()).filter(|&i| marks.marks[i] == Mark::Computed && !leaf(i)));
    order
}

/// The standalone graph of a slice: its nodes in the full graph's order, boundary nodes as
/// inputs typed by `metas`, inference on the full graph.
pub(crate) fn build(
    graph: &Graph,
    marks: &Marks,
    metas: &[Vec<Option<Meta>>],
) -> Result<Sliced, String> {
    let mut out = Graph::new(graph.name.clone());
    out.path = graph.path.clone();
    let mut map = vec![None; graph.nodes.len()];
    let mut origin = Vec::new();
    for i in canonical_order(graph, marks) {
        let node = &graph.nodes[i];
        let new = match marks.marks[i] {
            Mark::Out => continue,
            Mark::Boundary if !matches!(node.kind, NodeKind::Input) => {
                let meta = metas[i][0].as_ref().ok_or_else(|| {
                    format!(
                        "the shape of `{}` in graph `{}` is unknown",
                        node.name, graph.name
                    )
                })?;
                let shape: Vec<i64> = meta.shape.iter().map(|&d| d as i64).collect();
                Node {
                    name: node.name.clone(),
                    kind: NodeKind::Input,
                    outputs: vec![Output {
                        name: node.outputs[0].name.clone(),
                        ty: Some(TensorType::new(meta.dtype, &shape)),
                    }],
                    loc: None,
                    line: node.line,
                }
            }
            _ => {
                let mut n = node.clone();
                if let NodeKind::Call { args, kwargs, .. } = &mut n.kind {
                    for a in args.iter_mut() {
                        *a = remap(a, &map);
                    }
                    for (_, a) in kwargs.iter_mut() {
                        *a = remap(a, &map);
                    }
                }
                n
            }
        };
        let is_input = matches!(new.kind, NodeKind::Input);
        let at = out.push(new);
        map[i] = Some(at);
        origin.push(i);
        if is_input {
            out.inputs.push(ValueId::new(at, 0));
        }
    }
    Ok(Sliced {
        graph: out,
        map,
        origin,
    })
}

/// Checks that every collective and message of the stage program is one of the full run's,
/// with the same members: otherwise the stage would pair calls differently and prove something
/// of another program.
pub(crate) fn same_pairing(
    stage: &Schedule,
    full: &PairingIndex,
    maps: &[&Sliced],
) -> Result<(), String> {
    let back = |r: usize, n: usize| -> Option<usize> { maps[r].origin.get(n).copied() };
    for meet in &stage.meetings {
        let calls: Option<Vec<(usize, usize)>> = meet
            .calls
            .iter()
            .map(|&(r, n)| back(r, n).map(|o| (r, o)))
            .collect();
        if !calls.is_some_and(|c| full.has_meeting(&c)) {
            return Err(format!(
                "the stage's `{}` on group `{}` does not pair its ranks as the whole program does",
                meet.op, meet.group
            ));
        }
    }
    for (&(rr, rn), &(sr, sn)) in &stage.messages {
        let (Some(ro), Some(so)) = (back(rr, rn), back(sr, sn)) else {
            return Err("a message of the stage is not one of the whole program's".into());
        };
        if full.sched.messages.get(&(rr, ro)) != Some(&(sr, so)) {
            return Err(format!(
                "the stage's receive on rank {rr} takes another message than in the whole program"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardproof_zoo::{EmitOptions, LlamaConfig, Mesh, MlpConfig, PipelineOptions};

    /// The worklist closure marks exactly what rescanning every meeting and message until
    /// nothing changes marks, from single starting nodes all over a pipeline full iteration's
    /// ranks (collectives on tp and dp, messages between pipeline stages).
    #[test]
    fn the_worklist_closes_as_rescanning_does() {
        let dir = tempfile::tempdir().unwrap();
        let opts = EmitOptions {
            model: "llama".into(),
            mlp: MlpConfig::default(),
            llama: LlamaConfig {
                hidden: 4,
                heads: 2,
                kv_heads: 2,
                ffn: 4,
                layers: 2,
                seq: 2,
                batch: 8,
                vocab: 8,
                ..LlamaConfig::default()
            },
            mesh: Mesh::parse("dp=2,pp=2,tp=2").unwrap(),
            bug: None,
            forward_only: false,
            vocab_parallel: false,
        };
        let pipeline = PipelineOptions {
            microbatches: 2,
            ..PipelineOptions::default()
        };
        shardproof_zoo::emit_to_dir(
            &opts,
            &Default::default(),
            &shardproof_zoo::TrainOptions::default(),
            &pipeline,
            dir.path(),
        )
        .unwrap();
        let case = shardproof_case::load_case(&dir.path().join("case.yaml")).unwrap();
        let ranks = &case.program.ranks;
        let n = ranks.len();
        let leaves: Vec<_> = (0..n).map(|r| case.rank_leaves(r)).collect();
        let sched = shardproof_interp::schedule(&case.program, &case.ops, Some(&leaves));
        assert!(sched.problem.is_none());
        assert!(!sched.meetings.is_empty() && !sched.messages.is_empty());
        let mut stops: Vec<HashSet<ValueId>> = vec![HashSet::new(); n];
        for rel in &case.inputs {
            for &(r, v) in &rel.rank_values {
                stops[r].insert(v);
            }
        }
        let index = PairingIndex::new(&sched, n);
        let mut compared = 0;
        for r in 0..n {
            for start in (0..ranks[r].nodes.len()).step_by(5) {
                let mut dense: Vec<Marks> = ranks.iter().map(|g| Marks::new(g)).collect();
                let dense_result = dense[r]
                    .close(&ranks[r], &[start], &stops[r])
                    .and_then(|_| close_under_pairing_by_rescan(ranks, &mut dense, &stops, &sched));
                let mut sparse: RankMarks = (0..n).map(|_| None).collect();
                let mut work = Vec::new();
                let sparse_result = close_rank(ranks, &mut sparse, &stops, (r, start), &mut work)
                    .and_then(|_| close_under_pairing(ranks, &mut sparse, &stops, &index, work));
                assert_eq!(dense_result.is_ok(), sparse_result.is_ok());
                for (d, s) in dense.iter().zip(&sparse) {
                    match s {
                        Some(s) => assert!(d.marks == s.marks),
                        None => assert!(d.marks.iter().all(|&m| m == Mark::Out)),
                    }
                }
                compared += 1;
            }
        }
        assert!(compared > 100, "{compared}");
    }
}
