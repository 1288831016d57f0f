//! Graph execution: single graphs, and lock-step execution of rank graphs with collectives and
//! point-to-point messages.

use crate::{Env, InterpError, InterpErrorKind, RunConfig};
use shardproof_ir::{Arg, DecompExpr, Graph, Node, NodeKind, OpMeaning, OpName, Program, ValueId};
use shardproof_ops::{
    p2p_call, program_members, Args, EvalCtx, GroupMembers, Meta, OpClass, OpDef, OpError, P2pEnd,
    Registry, Tensor, TensorList, Values,
};
use std::collections::{BTreeMap, VecDeque};

/// Reads values out of an environment, for binding a call's arguments.
struct EnvValues<'a>(&'a Env);

impl Values for EnvValues<'_> {
    fn meta(&self, v: ValueId) -> Option<Meta> {
        self.0.get(v).map(|t| t.meta.clone())
    }
    fn tensor(&self, v: ValueId) -> Option<&Tensor> {
        self.0.get(v)
    }
}

/// The state of one graph being executed.
struct GraphRun<'g> {
    graph: &'g Graph,
    env: Env,
    /// Values fixed by the caller; their producers are never run.
    is_leaf: Vec<Vec<bool>>,
    next: usize,
    cfg: &'g RunConfig,
}

pub(crate) fn located(graph: &Graph, node: &Node, msg: impl std::fmt::Display) -> String {
    let op = node.op().map(|o| format!(" ({o})")).unwrap_or_default();
    let file = graph
        .path
        .as_ref()
        .map_or_else(|| graph.name.clone(), |p| p.display().to_string());
    match node.line {
        Some(l) => format!("{file}:{l}: node `{}`{op}: {msg}", node.name),
        None => format!("{file}: node `{}`{op}: {msg}", node.name),
    }
}

impl<'g> GraphRun<'g> {
    fn new(
        graph: &'g Graph,
        leaves: &BTreeMap<String, Tensor>,
        cfg: &'g RunConfig,
    ) -> Result<Self, InterpError> {
        graph.check_structure().map_err(|e| {
            InterpError::new(
                InterpErrorKind::Invalid,
                format!("graph `{}` is malformed: {e}", graph.name),
            )
        })?;
        let mut env = Env {
            values: graph
                .nodes
                .iter()
                .map(|n| vec![None; n.outputs.len()])
                .collect(),
        };
        let mut is_leaf: Vec<Vec<bool>> = graph
            .nodes
            .iter()
            .map(|n| vec![false; n.outputs.len()])
            .collect();
        let index = graph.name_index();
        for (name, t) in leaves {
            if t.meta.checked_numel() != Some(t.data.len()) {
                return Err(InterpError::new(
                    InterpErrorKind::Invalid,
                    format!(
                        "value `{name}` of graph `{}` was given a tensor of shape {:?} holding {} elements{}",
                        graph.name,
                        t.meta.shape,
                        t.data.len(),
                        match t.meta.checked_numel() {
                            Some(n) => format!(" instead of {n}"),
                            None => ": the shape's element count overflows 64-bit arithmetic".into(),
                        }
                    ),
                ));
            }
            let v = *index.get(name.as_str()).ok_or_else(|| {
                InterpError::new(
                    InterpErrorKind::Invalid,
                    format!("graph `{}` has no value named `{name}`", graph.name),
                )
            })?;
            if let Some(ty) = graph.recorded_type(v) {
                let expected = Meta::from_type(ty);
                if expected.as_ref().is_some_and(|m| m.shape != t.meta.shape) {
                    return Err(InterpError::new(
                        InterpErrorKind::Invalid,
                        format!(
                            "value `{name}` of graph `{}` is declared {ty} but was given {}",
                            graph.name,
                            t.meta.to_type()
                        ),
                    ));
                }
            }
            env.values[v.node][v.output] = Some(cfg.precision.round(t.clone()));
            is_leaf[v.node][v.output] = true;
        }
        Ok(GraphRun {
            graph,
            env,
            is_leaf,
            next: 0,
            cfg,
        })
    }

    fn done(&self) -> bool {
        self.next >= self.graph.nodes.len()
    }

    /// Runs nodes until the end of the graph (`None`), or until a node that needs the other
    /// ranks: a collective (with `alone`, collectives act on one-member groups and never
    /// pause) or a point-to-point operator. A send or recv always pauses, even when it cannot
    /// run or a leaf replaces it: its partner on the other rank must learn of it either way.
    fn advance(&mut self, alone: bool) -> Result<Option<Pause>, InterpError> {
        while self.next < self.graph.nodes.len() {
            let i = self.next;
            let node = &self.graph.nodes[i];
            let class = match &node.kind {
                NodeKind::Call { op, .. } if self.custom(op).is_none() => {
                    Registry::builtin().get(op).map(|d| d.class)
                }
                _ => None,
            };
            if class == Some(OpClass::PointToPoint) {
                return Ok(Some(Pause::PointToPoint(i)));
            }
            if self.is_leaf[i].iter().all(|&l| l) || !self.ready(node) {
                self.pass_to(i + 1);
                continue;
            }
            if !alone && class == Some(OpClass::Collective) {
                return Ok(Some(Pause::Collective(i)));
            }
            if let Some(p) = &self.cfg.progress {
                p.enter(&node.name);
            }
            let outs = self.eval_node(node).map_err(|e| match e {
                NodeError::Op(e) => {
                    InterpError::new(InterpErrorKind::Invalid, located(self.graph, node, e))
                }
                NodeError::Unsupported(msg) => {
                    InterpError::new(InterpErrorKind::Unsupported, located(self.graph, node, msg))
                }
            })?;
            self.store(i, outs)?;
            self.pass_to(i + 1);
        }
        Ok(None)
    }

    /// Moves past the nodes before `next`, counting each in the run's progress.
    fn pass_to(&mut self, next: usize) {
        if let Some(p) = &self.cfg.progress {
            for _ in self.next..next {
                p.leave();
            }
        }
        self.next = next;
    }

    /// Whether every value the node reads is available (inputs and constants need a leaf).
    fn ready(&self, node: &Node) -> bool {
        match node.kind {
            NodeKind::Input | NodeKind::Constant { .. } => false,
            NodeKind::Call { .. } => node.inputs().iter().all(|&v| self.env.get(v).is_some()),
        }
    }

    fn custom(&self, op: &OpName) -> Option<&'g OpMeaning> {
        self.cfg
            .custom_ops
            .get(&op.to_string())
            .or_else(|| self.cfg.custom_ops.get(&op.base()))
    }

    fn store(&mut self, i: usize, outs: Vec<Tensor>) -> Result<(), InterpError> {
        let node = &self.graph.nodes[i];
        if !outs.is_empty() && outs.len() < node.outputs.len() {
            return Err(InterpError::new(
                InterpErrorKind::Invalid,
                located(
                    self.graph,
                    node,
                    format!(
                        "the graph uses {} outputs but the operator produces {}",
                        node.outputs.len(),
                        outs.len()
                    ),
                ),
            ));
        }
        for (o, t) in outs.into_iter().take(node.outputs.len()).enumerate() {
            if !self.is_leaf[i][o] {
                self.env.values[i][o] = Some(self.cfg.precision.round(t));
            }
        }
        Ok(())
    }

    fn ctx(&self, node: &Node) -> EvalCtx {
        EvalCtx {
            seed: self.cfg.seed,
            call_key: node.name.clone(),
        }
    }

    fn eval_node(&self, node: &Node) -> Result<Vec<Tensor>, NodeError> {
        let NodeKind::Call { op, args, kwargs } = &node.kind else {
            unreachable!("only call nodes are evaluated")
        };
        let values = EnvValues(&self.env);
        if let Some(meaning) = self.custom(op) {
            return self.eval_custom(meaning, args, &values, node);
        }
        if op.namespace == "higher_order" && op.name == "auto_functionalized_v2" {
            return self.eval_auto_functionalized(args, kwargs, &values);
        }
        if op.namespace == "higher_order" && op.name == "auto_functionalized" {
            // Calls that fit their declaration were inlined when the case was loaded.
            return Err(NodeError::Unsupported(match args.first() {
                Some(Arg::Op(inner)) => format!(
                    "in-place operator `{inner}` (in `auto_functionalized`) has no declaration its call fits; declare it in the case's `ops:` with `args` and `writes`"
                ),
                _ => "auto_functionalized without an operator".into(),
            }));
        }
        let reg = Registry::builtin();
        let def = reg.get(op).ok_or_else(|| {
            NodeError::Unsupported(format!(
                "operator `{op}` is not in the registry; declare its meaning in the case's `ops:` section"
            ))
        })?;
        if def.class == OpClass::Collective {
            let bound = Args::bind(&def.schema, args, kwargs, &values)?;
            return Ok(collective(def, &[bound], 0)?);
        }
        Ok(reg.eval(def, args, kwargs, &values, &mut self.ctx(node))?)
    }

    fn eval_custom(
        &self,
        meaning: &OpMeaning,
        args: &[Arg],
        values: &EnvValues,
        node: &Node,
    ) -> Result<Vec<Tensor>, NodeError> {
        match meaning {
            OpMeaning::Identity => {
                let first = node.inputs().first().copied().ok_or_else(|| {
                    NodeError::Op(OpError::new(
                        "an `identity` operator needs a tensor argument",
                    ))
                })?;
                let t = values
                    .tensor(first)
                    .expect("ready node has its inputs")
                    .clone();
                Ok(vec![t; node.outputs.len().max(1)])
            }
            OpMeaning::Decompose(DecompExpr::Signature(sig)) => {
                let Some(ret) = &sig.returns else {
                    return Err(NodeError::Unsupported(format!(
                        "`{}` is declared to return nothing and write its arguments in place; only its functionalized form (`auto_functionalized`) has a value",
                        node.name
                    )));
                };
                let bound = sig
                    .bind(args, node_kwargs(node))
                    .map_err(|e| NodeError::Op(OpError::new(e)))?;
                match eval_decomp(ret, &bound, values, &self.ctx(node))? {
                    DVal::Tensor(t) => Ok(vec![t]),
                    DVal::Lit(a) => Err(NodeError::Op(OpError::new(format!(
                        "the declared result evaluates to {a:?}, not a tensor"
                    )))),
                }
            }
            OpMeaning::Decompose(expr) => match eval_decomp(expr, args, values, &self.ctx(node))? {
                DVal::Tensor(t) => Ok(vec![t]),
                DVal::Lit(a) => Err(NodeError::Op(OpError::new(format!(
                    "the decomposition evaluates to {a:?}, not a tensor"
                )))),
            },
        }
    }

    /// `auto_functionalized_v2(op, ..., _all_bases=[...])`: outputs are the op's result followed
    /// by the bases after the op's in-place updates. Only operators whose meaning is known can run:
    /// declared identities leave the bases unchanged.
    fn eval_auto_functionalized(
        &self,
        args: &[Arg],
        kwargs: &[(String, Arg)],
        values: &EnvValues,
    ) -> Result<Vec<Tensor>, NodeError> {
        let inner = match args.first() {
            Some(Arg::Op(op)) => op,
            _ => {
                return Err(NodeError::Op(OpError::new(
                    "auto_functionalized_v2 expects an operator as its first argument",
                )))
            }
        };
        let bases: Vec<Tensor> = match kwargs.iter().find(|(k, _)| k == "_all_bases") {
            Some((_, Arg::List(items))) => items
                .iter()
                .map(|a| match a {
                    Arg::Value(v) => Ok(values.tensor(*v).expect("ready").clone()),
                    other => Err(NodeError::Op(OpError::new(format!(
                        "`_all_bases` holds {other:?}, expected tensors"
                    )))),
                })
                .collect::<Result<_, _>>()?,
            _ => {
                return Err(NodeError::Op(OpError::new(
                    "auto_functionalized_v2 without `_all_bases`",
                )))
            }
        };
        match self.custom(inner) {
            Some(OpMeaning::Identity) => {
                let first = bases.first().cloned().ok_or_else(|| {
                    NodeError::Op(OpError::new("auto_functionalized_v2 with no bases"))
                })?;
                let mut out = vec![first];
                out.extend(bases);
                Ok(out)
            }
            Some(OpMeaning::Decompose(_)) => Err(NodeError::Unsupported(format!(
                "in-place custom operator `{inner}` is declared by a decomposition; only `identity` is supported for in-place operators"
            ))),
            None => Err(NodeError::Unsupported(format!(
                "in-place operator `{inner}` has no declared meaning; declare it in the case's `ops:` section"
            ))),
        }
    }
}

enum NodeError {
    Op(OpError),
    Unsupported(String),
}

impl From<OpError> for NodeError {
    fn from(e: OpError) -> Self {
        NodeError::Op(e)
    }
}

/// An intermediate of a decomposition: a tensor or a literal argument.
fn node_kwargs(node: &Node) -> &[(String, Arg)] {
    match &node.kind {
        NodeKind::Call { kwargs, .. } => kwargs,
        _ => &[],
    }
}

enum DVal {
    Tensor(Tensor),
    Lit(Arg),
}

fn eval_decomp(
    expr: &DecompExpr,
    call_args: &[Arg],
    values: &EnvValues,
    ctx: &EvalCtx,
) -> Result<DVal, NodeError> {
    Ok(match expr {
        DecompExpr::Arg(i) => match call_args.get(*i) {
            Some(Arg::Value(v)) => DVal::Tensor(values.tensor(*v).expect("ready").clone()),
            Some(a) => DVal::Lit(a.clone()),
            None => {
                return Err(NodeError::Op(OpError::new(format!(
                    "the decomposition reads `${i}` but the call has {} arguments",
                    call_args.len()
                ))))
            }
        },
        DecompExpr::Int(i) => DVal::Lit(Arg::Int(*i)),
        DecompExpr::Float(f) => DVal::Lit(Arg::Float(*f)),
        DecompExpr::Bool(b) => DVal::Lit(Arg::Bool(*b)),
        DecompExpr::Str(t) => DVal::Lit(Arg::Str(t.clone())),
        DecompExpr::Signature(_) => {
            return Err(NodeError::Op(OpError::new(
                "a declaration's mapping form can only be a whole meaning",
            )))
        }
        DecompExpr::List(items) => {
            let mut out = Vec::new();
            for it in items {
                match eval_decomp(it, call_args, values, ctx)? {
                    DVal::Lit(a) => out.push(a),
                    DVal::Tensor(_) => {
                        return Err(NodeError::Op(OpError::new(
                            "lists of tensors are not supported in decompositions",
                        )))
                    }
                }
            }
            DVal::Lit(Arg::List(out))
        }
        DecompExpr::Call { op, args } => {
            let reg = Registry::builtin();
            let def = reg.get(op).ok_or_else(|| {
                NodeError::Unsupported(format!("the decomposition calls unknown operator `{op}`"))
            })?;
            let mut tensors = Vec::new();
            let mut bound = Vec::new();
            for a in args {
                match eval_decomp(a, call_args, values, ctx)? {
                    DVal::Tensor(t) => {
                        bound.push(Arg::Value(ValueId::new(tensors.len(), 0)));
                        tensors.push(t);
                    }
                    DVal::Lit(l) => bound.push(l),
                }
            }
            let mut ctx = ctx.clone();
            let mut out = reg.eval(def, &bound, &[], &TensorList(&tensors), &mut ctx)?;
            if out.is_empty() {
                return Err(NodeError::Op(OpError::new(format!(
                    "`{op}` returned nothing"
                ))));
            }
            DVal::Tensor(out.swap_remove(0))
        }
    })
}

/// Computes member `index`'s output of a collective, given every member's bound arguments in
/// group order.
fn collective(def: &OpDef, members: &[Args], index: usize) -> Result<Vec<Tensor>, OpError> {
    let refs: Vec<&Args> = members.iter().collect();
    shardproof_ops::apply_collective(def, &refs, index)
}

/// Runs `graph` with the given leaf values (graph inputs, constants, or cut tensors by name).
/// Collectives act on one-member groups (a single-device program): they are identities.
/// Point-to-point operators see a world of one rank: rank 0 may only send to itself.
pub fn run_graph(
    graph: &Graph,
    leaves: &BTreeMap<String, Tensor>,
    cfg: &RunConfig,
) -> Result<Env, InterpError> {
    let mut runs = vec![GraphRun::new(graph, leaves, cfg)?];
    let mut mailbox = Mailbox::default();
    while let Some(pause) = runs[0].advance(true)? {
        let Pause::PointToPoint(i) = pause else {
            unreachable!("a run alone never pauses at a collective")
        };
        if !point_to_point(&mut runs, 0, i, &mut mailbox, None)? {
            return Err(p2p_mismatch(&runs, &[Some(pause)], &mailbox, None));
        }
    }
    mailbox.check_drained(&runs)?;
    Ok(runs.swap_remove(0).env)
}

/// Runs every rank of `program` with per-rank leaf values, executing collectives across ranks
/// in lock step (a collective runs once every member of its group has reached it) and moving
/// point-to-point messages between them (a send never blocks; a recv waits for the next
/// message from its source with its tag). Ranks that can no longer all progress are reported,
/// never waited on: every round either runs a node or ends the run.
pub fn run_program(
    program: &Program,
    leaves: &[BTreeMap<String, Tensor>],
    cfg: &RunConfig,
) -> Result<Vec<Env>, InterpError> {
    if leaves.len() != program.ranks.len() {
        return Err(InterpError::new(
            InterpErrorKind::Invalid,
            format!(
                "{} rank graphs but leaves for {} ranks",
                program.ranks.len(),
                leaves.len()
            ),
        ));
    }
    let mut runs = program
        .ranks
        .iter()
        .zip(leaves)
        .map(|(g, l)| GraphRun::new(g, l, cfg))
        .collect::<Result<Vec<_>, _>>()?;
    let n = runs.len();
    let mut blocked: Vec<Option<Pause>> = vec![None; n];
    let mut mailbox = Mailbox::default();
    loop {
        for r in 0..n {
            if blocked[r].is_none() && !runs[r].done() {
                blocked[r] = runs[r].advance(false)?;
            }
        }
        if blocked.iter().all(Option::is_none) {
            break;
        }
        let mut progressed = false;
        for (r, pause) in blocked.iter_mut().enumerate() {
            if let Some(Pause::PointToPoint(i)) = *pause {
                if point_to_point(&mut runs, r, i, &mut mailbox, Some(program))? {
                    *pause = None;
                    progressed = true;
                }
            }
        }
        for r in 0..n {
            let Some(Pause::Collective(node_idx)) = blocked[r] else {
                continue;
            };
            let (group_name, op) = collective_key(&runs[r], node_idx)?;
            let members = group_members(program, &group_name, r, &runs[r], node_idx)?;
            let all_there = members.iter().all(|&m| match blocked[m] {
                Some(Pause::Collective(ni)) => {
                    collective_key(&runs[m], ni).is_ok_and(|(g, o)| g == group_name && o == op)
                }
                _ => false,
            });
            if !all_there {
                continue;
            }
            let def = Registry::builtin()
                .get(&op)
                .expect("blocked on a registered collective");
            let member_nodes: Vec<usize> = members
                .iter()
                .map(|&m| match blocked[m] {
                    Some(Pause::Collective(ni)) => ni,
                    _ => unreachable!("every member waits at the collective"),
                })
                .collect();
            let outputs: Vec<Vec<Tensor>> = {
                let member_values: Vec<EnvValues> =
                    members.iter().map(|&m| EnvValues(&runs[m].env)).collect();
                let bound = members
                    .iter()
                    .zip(&member_nodes)
                    .zip(&member_values)
                    .map(|((&m, &ni), vals)| {
                        let node = &runs[m].graph.nodes[ni];
                        Args::bind(&def.schema, node.args(), call_kwargs(node), vals).map_err(|e| {
                            InterpError::new(
                                InterpErrorKind::Invalid,
                                located(runs[m].graph, node, e),
                            )
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                (0..members.len())
                    .map(|i| {
                        collective(def, &bound, i).map_err(|e| {
                            let node = &runs[members[i]].graph.nodes[member_nodes[i]];
                            InterpError::new(
                                InterpErrorKind::Invalid,
                                located(runs[members[i]].graph, node, e),
                            )
                        })
                    })
                    .collect::<Result<_, _>>()?
            };
            for ((&m, &ni), t) in members.iter().zip(&member_nodes).zip(outputs) {
                blocked[m] = None;
                runs[m].store(ni, t)?;
                runs[m].pass_to(ni + 1);
            }
            progressed = true;
        }
        if !progressed {
            return Err(
                if blocked
                    .iter()
                    .any(|b| matches!(b, Some(Pause::PointToPoint(_))))
                {
                    p2p_mismatch(&runs, &blocked, &mailbox, Some(program))
                } else {
                    deadlock(&runs, &blocked)
                },
            );
        }
    }
    mailbox.check_drained(&runs)?;
    Ok(runs.into_iter().map(|r| r.env).collect())
}

/// Why a rank stopped before the end of its graph: a node that needs the other ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pause {
    /// A collective (node index), run once every member of its group reaches one.
    Collective(usize),
    /// A send or recv (node index), run against the messages in flight.
    PointToPoint(usize),
}

/// A message in flight from a send to its recv.
struct Message {
    /// The sent tensor; `None` when the send could not run (its input depends on a value
    /// nobody provided), so the recv that takes it is skipped too.
    tensor: Option<Tensor>,
    /// The sending rank and its send node, for diagnostics.
    from: (usize, usize),
}

/// The messages sent and not yet received, per (source, destination, tag), oldest first.
#[derive(Default)]
struct Mailbox {
    queues: BTreeMap<(usize, usize, i64), VecDeque<Message>>,
}

impl Mailbox {
    /// Fails on the first message nobody received (a send without its recv).
    fn check_drained(&self, runs: &[GraphRun]) -> Result<(), InterpError> {
        let Some(((src, dst, tag), queue)) = self.queues.iter().find(|(_, q)| !q.is_empty()) else {
            return Ok(());
        };
        let (r, ni) = queue[0].from;
        let node = &runs[r].graph.nodes[ni];
        Err(InterpError::new(
            InterpErrorKind::Deadlock,
            located(
                runs[r].graph,
                node,
                format!(
                    "rank {src} sends a message to rank {dst} with tag {tag} that no recv \
                     takes ({} such message(s) left when rank {dst} finished its graph); \
                     hint: every send needs a recv on its destination naming src={src} and \
                     tag={tag}, in the same order: a duplicated send, or a recv missing from \
                     the destination's schedule, leaves a send unmatched",
                    queue.len()
                ),
            ),
        ))
    }
}

/// The members of rank `r`'s process groups, for a point-to-point call's `group`: `program`'s
/// (see [`program_members`]), or in a single-device run (`None`) a world of one rank, where
/// every group is rank 0 alone.
fn members_of(program: Option<&Program>, r: usize) -> impl Fn(&str) -> Option<Vec<usize>> + '_ {
    move |g: &str| match program {
        Some(p) => program_members(p, r)(g),
        None => Some(vec![0]),
    }
}

/// Runs the send or recv at node `i` of rank `r`. Returns whether it ran: a send always
/// does (it is buffered, as `isend`); a recv only once its message has arrived.
fn point_to_point(
    runs: &mut [GraphRun],
    r: usize,
    i: usize,
    mailbox: &mut Mailbox,
    program: Option<&Program>,
) -> Result<bool, InterpError> {
    let world = runs.len();
    let run = &runs[r];
    let node = &run.graph.nodes[i];
    let invalid = |e: &dyn std::fmt::Display| {
        InterpError::new(InterpErrorKind::Invalid, located(run.graph, node, e))
    };
    let op = node.op().expect("a point-to-point node is a call");
    let def = Registry::builtin().get(op).expect("registered");
    let values = EnvValues(&run.env);
    let bound = Args::bind(&def.schema, node.args(), call_kwargs(node), &values)
        .map_err(|e| invalid(&e))?;
    let call = p2p_call(def, &bound, &members_of(program, r)).map_err(|e| invalid(&e))?;
    if call.peer >= world {
        let what = match call.end {
            P2pEnd::Send => "sends to",
            P2pEnd::Recv => "receives from",
        };
        return Err(invalid(&format!(
            "{what} rank {}, but the program has {world} rank(s) (0..{}); ranks are global \
             ranks of the mesh, row-major",
            call.peer,
            world - 1
        )));
    }
    match call.end {
        P2pEnd::Send => {
            let input = node.inputs().first().and_then(|&v| run.env.get(v)).cloned();
            mailbox
                .queues
                .entry((r, call.peer, call.tag))
                .or_default()
                .push_back(Message {
                    tensor: input.clone(),
                    from: (r, i),
                });
            // The result is the sent tensor itself: the handle `wait_tensor` waits on.
            if let Some(t) = input {
                runs[r].store(i, vec![t])?;
            }
        }
        P2pEnd::Recv => {
            let want = (def.infer)(&bound).map_err(|e| invalid(&e))?;
            let key = (call.peer, r, call.tag);
            let Some(msg) = mailbox.queues.get_mut(&key).and_then(VecDeque::pop_front) else {
                return Ok(false);
            };
            if let Some(t) = msg.tensor {
                if t.meta != want[0] {
                    let (sr, sn) = msg.from;
                    let sender = &runs[sr].graph.nodes[sn];
                    return Err(InterpError::new(
                        InterpErrorKind::Deadlock,
                        located(
                            run.graph,
                            node,
                            format!(
                                "receives {} from rank {} with tag {}, but declares {}: the \
                                 matching send is {}; hint: a recv takes the sends from its \
                                 source with its tag in order, so a skipped or reordered send \
                                 pairs this recv with the wrong message",
                                t.meta.to_type(),
                                call.peer,
                                call.tag,
                                want[0].to_type(),
                                located(runs[sr].graph, sender, "here"),
                            ),
                        ),
                    ));
                }
                runs[r].store(i, vec![t])?;
            }
        }
    }
    runs[r].pass_to(i + 1);
    Ok(true)
}

/// The report of ranks that cannot progress while some wait for a point-to-point message. The
/// recv it leads with is one whose source will never send its message (nothing left in the
/// source's graph matches it): the root of the deadlock, not a rank merely waiting behind it.
fn p2p_mismatch(
    runs: &[GraphRun],
    blocked: &[Option<Pause>],
    mailbox: &Mailbox,
    program: Option<&Program>,
) -> InterpError {
    // Per waiting recv: (rank, node index, description, whether its message can never come).
    let mut waits = Vec::new();
    let mut lines = Vec::new();
    for (r, b) in blocked.iter().enumerate() {
        match b {
            Some(Pause::PointToPoint(ni)) => {
                let (what, never) = match recv_route(&runs[r], *ni, &members_of(program, r)) {
                    Err(e) => (e.message, false),
                    Ok((src, tag, meta)) => {
                        let members = members_of(program, src);
                        let later = later_send(&runs[src], blocked[src], r, tag, &members);
                        (
                            describe_wait(runs, mailbox, r, src, tag, &meta, later),
                            later.is_none(),
                        )
                    }
                };
                waits.push((r, *ni, what, never));
            }
            Some(Pause::Collective(ni)) => lines.push(waiting_in_collective(runs, r, *ni)),
            None => lines.push(format!("rank {r} has finished its graph")),
        }
    }
    let lead = waits.iter().position(|w| w.3).unwrap_or(0);
    let (r, ni, what, _) = waits.remove(lead);
    let first = located(runs[r].graph, &runs[r].graph.nodes[ni], &what);
    lines.extend(
        waits.into_iter().map(|(r, ni, what, _)| {
            format!("rank {r} in `{}` {what}", runs[r].graph.nodes[ni].name)
        }),
    );
    InterpError::new(
        InterpErrorKind::Deadlock,
        format!(
            "a recv is never matched by a send (deadlock): {first}; the other ranks: {}; hint: \
             every recv needs a send from its source to its rank with the same tag, posted in \
             the same order; a pipeline schedule that skips or reorders a send leaves its recv \
             waiting",
            lines.join("; ")
        ),
    )
}

/// What rank `r`, waiting for a message from `src` with `tag` of type `meta`, waits for, given
/// the send to it still ahead in `src`'s graph (`later`, a node index), if any.
fn describe_wait(
    runs: &[GraphRun],
    mailbox: &Mailbox,
    r: usize,
    src: usize,
    tag: i64,
    meta: &Meta,
    later: Option<usize>,
) -> String {
    let other_tags: Vec<String> = mailbox
        .queues
        .iter()
        .filter(|((s, d, _), q)| *s == src && *d == r && !q.is_empty())
        .map(|((_, _, t), q)| format!("{} with tag {t}", q.len()))
        .collect();
    let sent = if other_tags.is_empty() {
        String::new()
    } else {
        format!(
            "; rank {src} sent it only messages with other tags ({})",
            other_tags.join(", ")
        )
    };
    let head = format!(
        "waits for a message from rank {src} with tag {tag} ({})",
        meta.to_type()
    );
    match later {
        None => format!(
            "{head} that rank {src} never sends (no send to rank {r} with tag {tag} is left in \
             its graph{}){sent}",
            if runs[src].done() {
                ", which it has finished"
            } else {
                ""
            }
        ),
        Some(ni) => format!(
            "{head} that rank {src} would send only later (`{}`), after its own wait{sent}",
            runs[src].graph.nodes[ni].name
        ),
    }
}

/// The first send to rank `dst` with `tag` in the part of `run`'s graph it has not run yet
/// (from the node it waits at, `paused`), if any; `members` resolves its group peers.
fn later_send(
    run: &GraphRun,
    paused: Option<Pause>,
    dst: usize,
    tag: i64,
    members: GroupMembers,
) -> Option<usize> {
    let from = match paused {
        Some(Pause::Collective(ni) | Pause::PointToPoint(ni)) => ni,
        None => run.graph.nodes.len(),
    };
    let reg = Registry::builtin();
    (from..run.graph.nodes.len()).find(|&ni| {
        let node = &run.graph.nodes[ni];
        let Some(def) = node.op().and_then(|op| reg.get(op)) else {
            return false;
        };
        if def.class != OpClass::PointToPoint {
            return false;
        }
        let values = EnvValues(&run.env);
        Args::bind(&def.schema, node.args(), call_kwargs(node), &values)
            .ok()
            .and_then(|a| p2p_call(def, &a, members).ok())
            .is_some_and(|c| c.end == P2pEnd::Send && c.peer == dst && c.tag == tag)
    })
}

/// The source, tag and declared type of the recv at node `ni` of `run`, or why they cannot
/// be read; `members` resolves its group peers.
fn recv_route(
    run: &GraphRun,
    ni: usize,
    members: GroupMembers,
) -> Result<(usize, i64, Meta), InterpError> {
    let node = &run.graph.nodes[ni];
    let op = node.op().expect("a point-to-point node is a call");
    let def = Registry::builtin().get(op).expect("registered");
    let values = EnvValues(&run.env);
    let err = |e: OpError| InterpError::new(InterpErrorKind::Invalid, located(run.graph, node, e));
    let bound = Args::bind(&def.schema, node.args(), call_kwargs(node), &values).map_err(err)?;
    let call = p2p_call(def, &bound, members).map_err(err)?;
    let meta = (def.infer)(&bound).map_err(err)?.remove(0);
    Ok((call.peer, call.tag, meta))
}

fn call_kwargs(node: &Node) -> &[(String, Arg)] {
    match &node.kind {
        NodeKind::Call { kwargs, .. } => kwargs,
        _ => &[],
    }
}

/// The group name and operator of a blocked collective node.
fn collective_key(run: &GraphRun, node_idx: usize) -> Result<(String, OpName), InterpError> {
    let node = &run.graph.nodes[node_idx];
    let op = node.op().expect("collective is a call").clone();
    let def = Registry::builtin().get(&op).expect("registered");
    let values = EnvValues(&run.env);
    let bound = Args::bind(&def.schema, node.args(), call_kwargs(node), &values)
        .map_err(|e| InterpError::new(InterpErrorKind::Invalid, located(run.graph, node, e)))?;
    let group = bound
        .str("group_name")
        .map_err(|e| InterpError::new(InterpErrorKind::Invalid, located(run.graph, node, e)))?;
    Ok((
        group,
        OpName::new(&op.namespace, &op.name, &def.name.overload),
    ))
}

fn group_members(
    program: &Program,
    group: &str,
    rank: usize,
    run: &GraphRun,
    node_idx: usize,
) -> Result<Vec<usize>, InterpError> {
    let node = &run.graph.nodes[node_idx];
    // One rule for group names, shared with the point-to-point peers (`program_members`).
    program_members(program, rank)(group).ok_or_else(|| {
        let why = if program.group(group).is_some() {
            format!("rank {rank} is not a member of process group `{group}`")
        } else {
            format!("process group `{group}` is not defined by the case's `groups:`")
        };
        InterpError::new(InterpErrorKind::Invalid, located(run.graph, node, why))
    })
}

/// `rank r waits in `node` (op) on group `g``: rank `r` paused at the collective node `ni`.
fn waiting_in_collective(runs: &[GraphRun], r: usize, ni: usize) -> String {
    let node = &runs[r].graph.nodes[ni];
    let group = collective_key(&runs[r], ni)
        .map(|(g, _)| g)
        .unwrap_or_else(|_| "?".into());
    format!(
        "rank {r} waits in `{}` ({}) on group `{group}`",
        node.name,
        node.op().map(|o| o.to_string()).unwrap_or_default()
    )
}

/// The report of ranks that cannot progress, all paused at collectives.
fn deadlock(runs: &[GraphRun], blocked: &[Option<Pause>]) -> InterpError {
    let mut lines = Vec::new();
    for (r, b) in blocked.iter().enumerate() {
        match b {
            Some(Pause::Collective(ni) | Pause::PointToPoint(ni)) => {
                lines.push(waiting_in_collective(runs, r, *ni))
            }
            None => lines.push(format!("rank {r} has finished its graph")),
        }
    }
    InterpError::new(
        InterpErrorKind::Deadlock,
        format!(
            "the ranks' collectives do not match up: {}",
            lines.join("; ")
        ),
    )
}
