//! Symbolic execution of graphs and distributed programs: every value a [`SymTensor`].
//!
//! Operators run by family: pure data movement through the registry's own f64 kernel on
//! tensors of element indices ([`movement`]); arithmetic by one symbolic rule per family
//! ([`rules`], [`nn`]); operators whose tensor inputs are all constant through their kernel.
//! Collectives and point-to-point messages run across ranks in the order the interpreter's
//! [`schedule`](shardproof_interp::schedule) pairs them. An operator none of these covers
//! stops the execution with [`ExecErrorKind::Unsupported`], naming it: nothing is guessed.

pub(crate) mod movement;
pub(crate) mod nn;
pub(crate) mod range;
pub(crate) mod rules;

use crate::expr::{Arena, BudgetError, ExprId};
use crate::tensor::SymTensor;
use shardproof_ir::{Arg, Graph, Node, NodeKind, OpMeaning, Program, ValueId};
use shardproof_ops::{Args, Meta, OpClass, OpDef, Registry, Tensor, Values};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Why symbolic execution stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExecErrorKind {
    /// An operator (or a use of one) has no symbolic rule.
    Unsupported,
    /// An expression or the program grew past a budget.
    Budget,
    /// The program is wrong (a shape the kernel refuses, ranks that cannot communicate).
    Invalid,
}

/// An error of symbolic execution, with the graph, node and operator it arose at.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ExecError {
    /// What kind of failure.
    pub kind: ExecErrorKind,
    /// The operator, when one is to blame.
    pub op: Option<String>,
    /// What happened, where.
    pub message: String,
}

impl ExecError {
    pub(crate) fn unsupported(op: &str, message: impl Into<String>) -> Self {
        ExecError {
            kind: ExecErrorKind::Unsupported,
            op: Some(op.to_string()),
            message: message.into(),
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        ExecError {
            kind: ExecErrorKind::Invalid,
            op: None,
            message: message.into(),
        }
    }
}

impl From<BudgetError> for ExecError {
    fn from(e: BudgetError) -> Self {
        ExecError {
            kind: ExecErrorKind::Budget,
            op: None,
            message: if e.what == crate::expr::TIME_LIMIT {
                format!("the time limit of {} s ran out", e.limit as f64 / 1e3)
            } else {
                e.to_string()
            },
        }
    }
}

/// Per node, per output: the symbolic value, when computed.
pub type SymEnv = Vec<Vec<Option<SymTensor>>>;

/// Metas known to shape inference, as the registry's [`Values`].
pub(crate) struct MetaValues<'a>(pub &'a [Vec<Option<Meta>>]);

impl Values for MetaValues<'_> {
    fn meta(&self, v: ValueId) -> Option<Meta> {
        self.0.get(v.node)?.get(v.output)?.clone()
    }
    fn tensor(&self, _: ValueId) -> Option<&Tensor> {
        None
    }
}

/// What a rule sees of one call.
pub(crate) struct NodeCtx<'a> {
    pub arena: &'a mut Arena,
    pub graph: &'a Graph,
    pub node: &'a Node,
    pub def: &'a OpDef,
    pub args: Args<'a>,
    pub env: &'a SymEnv,
    pub metas: &'a [Vec<Option<Meta>>],
    pub index: usize,
}

/// A tensor or a scalar operand of an elementwise operator.
#[derive(Clone)]
pub(crate) enum Operand {
    Tensor(SymTensor),
    Scalar(ExprId),
}

impl NodeCtx<'_> {
    /// Whether the operator's schema has an argument `name`.
    pub fn has(&self, name: &str) -> bool {
        self.def.schema.index_of(name).is_some()
    }

    /// Argument `name` as given or defaulted; `None` when absent, `None`, or not in the
    /// schema (the registry's accessors would panic on a name the schema lacks).
    pub fn arg(&self, name: &str) -> Option<Arg> {
        if self.has(name) {
            self.args.get(name)
        } else {
            None
        }
    }

    /// An optional float argument.
    pub fn opt_float(&self, name: &str) -> Option<f64> {
        self.arg(name).and_then(|a| a.as_f64())
    }

    /// An optional string argument.
    pub fn opt_str(&self, name: &str) -> Option<String> {
        match self.arg(name) {
            Some(Arg::Str(s)) => Some(s),
            _ => None,
        }
    }
    /// The operator's full name.
    pub fn op(&self) -> String {
        self.def.name.to_string()
    }

    /// An error naming this node and operator.
    pub fn unsupported(&self, why: impl std::fmt::Display) -> ExecError {
        ExecError::unsupported(&self.op(), format!("{}: {why}", self.location()))
    }

    /// `graph:line: node` for messages.
    pub fn location(&self) -> String {
        let file = self
            .graph
            .path
            .as_ref()
            .map_or(self.graph.name.clone(), |p| p.display().to_string());
        match self.node.line {
            Some(l) => format!("{file}:{l}: `{}` ({})", self.node.name, self.def.name),
            None => format!("{file}: `{}` ({})", self.node.name, self.def.name),
        }
    }

    fn value(&self, v: ValueId) -> Result<SymTensor, ExecError> {
        self.env
            .get(v.node)
            .and_then(|o| o.get(v.output))
            .cloned()
            .flatten()
            .ok_or_else(|| {
                self.unsupported(format!("input `{}` has no value", self.graph.value_name(v)))
            })
    }

    /// A required tensor argument.
    pub fn tensor(&self, name: &str) -> Result<SymTensor, ExecError> {
        self.opt_tensor(name)?
            .ok_or_else(|| self.unsupported(format!("argument `{name}` is not a tensor")))
    }

    /// An optional tensor argument.
    pub fn opt_tensor(&self, name: &str) -> Result<Option<SymTensor>, ExecError> {
        match self.arg(name) {
            None => Ok(None),
            Some(Arg::Value(v)) => self.value(v).map(Some),
            Some(other) => {
                Err(self.unsupported(format!("argument `{name}` is {other:?}, not a tensor")))
            }
        }
    }

    /// A tensor or scalar argument (a missing one is `default`).
    pub fn operand(&mut self, name: &str, default: Option<f64>) -> Result<Operand, ExecError> {
        match self.arg(name) {
            Some(Arg::Value(v)) => Ok(Operand::Tensor(self.value(v)?)),
            Some(a) => match a.as_f64() {
                Some(x) => Ok(Operand::Scalar(self.arena.float(x)?)),
                None => Err(self.unsupported(format!("argument `{name}` is {a:?}"))),
            },
            None => match default {
                Some(x) => Ok(Operand::Scalar(self.arena.float(x)?)),
                None => Err(self.unsupported(format!("argument `{name}` is missing"))),
            },
        }
    }

    /// A scalar argument as an expression (missing: `default`).
    pub fn scalar(&mut self, name: &str, default: f64) -> Result<ExprId, ExecError> {
        let x = self.opt_float(name).unwrap_or(default);
        Ok(self.arena.float(x)?)
    }

    /// The inferred meta of output `i`.
    pub fn out_meta(&self, i: usize) -> Result<Meta, ExecError> {
        self.metas
            .get(self.index)
            .and_then(|m| m.get(i))
            .cloned()
            .flatten()
            .ok_or_else(|| self.unsupported(format!("the shape of output {i} is unknown")))
    }

    /// An integer argument.
    pub fn int(&self, name: &str) -> Result<i64, ExecError> {
        self.opt_int(name)?
            .ok_or_else(|| self.unsupported(format!("argument `{name}` is not an int")))
    }

    /// An optional integer argument.
    pub fn opt_int(&self, name: &str) -> Result<Option<i64>, ExecError> {
        if !self.has(name) {
            return Ok(None);
        }
        self.args.opt_int(name).map_err(|e| self.unsupported(e))
    }

    /// An optional list of ints.
    pub fn opt_int_list(&self, name: &str) -> Result<Option<Vec<i64>>, ExecError> {
        if !self.has(name) {
            return Ok(None);
        }
        self.args
            .opt_int_list(name)
            .map_err(|e| self.unsupported(e))
    }

    /// An optional bool (missing: `default`).
    pub fn bool_or(&self, name: &str, default: bool) -> Result<bool, ExecError> {
        match self.arg(name) {
            None => Ok(default),
            Some(a) => a
                .as_bool()
                .ok_or_else(|| self.unsupported(format!("`{name}` is {a:?}, not a bool"))),
        }
    }
}

/// The constant value of every element, when all are constant.
pub(crate) fn constant_values(arena: &Arena, t: &SymTensor) -> Option<Vec<f64>> {
    t.elems.iter().map(|&e| arena.as_f64_const(e)).collect()
}

/// A symbolic tensor of constants.
pub(crate) fn constant_tensor(arena: &mut Arena, t: &Tensor) -> Result<SymTensor, ExecError> {
    let elems = t
        .data
        .iter()
        .map(|&x| arena.float(x))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(SymTensor::new(t.dtype(), t.shape().to_vec(), elems))
}

/// Limits on what symbolic execution holds, and where it counts its nodes.
#[derive(Clone, Debug)]
pub struct ExecLimits {
    /// Elements of one tensor.
    pub elements_per_tensor: usize,
    /// When to give up (checked before every node).
    pub deadline: Option<std::time::Instant>,
    /// Where every executed node is counted and named, for another thread to show.
    pub progress: Option<std::sync::Arc<shardproof_ir::Progress>>,
}

impl Default for ExecLimits {
    fn default() -> Self {
        ExecLimits {
            elements_per_tensor: 1 << 20,
            deadline: None,
            progress: None,
        }
    }
}

/// One graph being executed: its environment and how far it got.
struct GraphState<'g> {
    graph: &'g Graph,
    metas: Vec<Vec<Option<Meta>>>,
    env: SymEnv,
    next: usize,
}

/// Runs one call node that is neither a collective nor a point-to-point operator.
fn run_call(
    arena: &mut Arena,
    st: &GraphState,
    index: usize,
    custom_ops: &BTreeMap<String, OpMeaning>,
) -> Result<Vec<Option<SymTensor>>, ExecError> {
    let node = &st.graph.nodes[index];
    let NodeKind::Call { op, args, kwargs } = &node.kind else {
        unreachable!("only calls run");
    };
    let custom = custom_ops
        .get(&op.to_string())
        .or_else(|| custom_ops.get(&op.base()));
    if let Some(meaning) = custom {
        return match meaning {
            OpMeaning::Identity => {
                let first = node.inputs().first().copied();
                let v = first.and_then(|v| st.env[v.node][v.output].clone());
                Ok(vec![v])
            }
            OpMeaning::Decompose(_) => Err(ExecError::unsupported(
                &op.to_string(),
                format!(
                    "{}: `{}`: decompositions of custom operators have no symbolic execution yet",
                    st.graph.name, node.name
                ),
            )),
        };
    }
    let reg = Registry::builtin();
    let def = reg.get(op).ok_or_else(|| {
        ExecError::unsupported(
            &op.to_string(),
            format!("`{}`: unknown operator {op}", node.name),
        )
    })?;
    let values = MetaValues(&st.metas);
    let bound = Args::bind(&def.schema, args, kwargs, &values)
        .map_err(|e| ExecError::invalid(format!("`{}`: {e}", node.name)))?;
    let mut ctx = NodeCtx {
        arena,
        graph: st.graph,
        node,
        def,
        args: bound,
        env: &st.env,
        metas: &st.metas,
        index,
    };
    let outs = match def.class {
        OpClass::Wait => vec![ctx.tensor("tensor")?],
        OpClass::Random => rules::random(&mut ctx)?,
        OpClass::Pure => rules::widened_operands_exact(&ctx)
            .and_then(|()| rules::apply(&mut ctx))
            .map_err(|mut e| {
                // A budget names where it ran out.
                if e.kind == ExecErrorKind::Budget {
                    e.message = format!("{}: {}", ctx.location(), e.message);
                    e.op = Some(def.name.to_string());
                }
                e
            })?,
        OpClass::Collective | OpClass::PointToPoint => {
            unreachable!("communication runs across ranks")
        }
    };
    Ok(outs.into_iter().map(Some).collect())
}

/// What one step of a rank did.
enum Step {
    /// The rank waits for a collective's other members or a message.
    Blocked,
    /// A collective (meeting number) ran: every member's outputs, in member order.
    Met(usize, Vec<Vec<SymTensor>>),
    /// The node's outputs.
    Store(Vec<Option<SymTensor>>),
}

fn check_size(node: &Node, outs: &[SymTensor], limits: &ExecLimits) -> Result<(), ExecError> {
    for t in outs {
        if t.numel() > limits.elements_per_tensor {
            return Err(ExecError {
                kind: ExecErrorKind::Budget,
                op: None,
                message: format!(
                    "`{}` has {} elements, over the limit of {} per tensor",
                    node.name,
                    t.numel(),
                    limits.elements_per_tensor
                ),
            });
        }
    }
    Ok(())
}

/// Runs the next node of rank `r`, or says it must wait.
fn step(
    arena: &mut Arena,
    states: &[GraphState],
    r: usize,
    sched: &shardproof_interp::Schedule,
    meeting_of: &HashMap<(usize, usize), (usize, usize)>,
    leaves: &[BTreeMap<String, SymTensor>],
    custom_ops: &BTreeMap<String, OpMeaning>,
) -> Result<Step, ExecError> {
    let st = &states[r];
    let i = st.next;
    let node = &st.graph.nodes[i];
    let given: Vec<Option<SymTensor>> = node
        .outputs
        .iter()
        .map(|o| leaves[r].get(&o.name).cloned())
        .collect();
    let NodeKind::Call { op, .. } = &node.kind else {
        return Ok(Step::Store(given));
    };
    if given.iter().all(Option::is_some) {
        return Ok(Step::Store(given));
    }
    let custom = custom_ops.contains_key(&op.to_string()) || custom_ops.contains_key(&op.base());
    let class = if custom {
        None
    } else {
        Registry::builtin().get(op).map(|d| d.class)
    };
    match class {
        Some(OpClass::Collective) => match meeting_of.get(&(r, i)) {
            // Not issued: its inputs are not all computed (the interpreter skips it too).
            None => Ok(Step::Store(vec![None; node.outputs.len()])),
            Some(&(m, _)) => {
                let meet = &sched.meetings[m];
                if !meet.calls.iter().all(|&(mr, mn)| states[mr].next == mn) {
                    return Ok(Step::Blocked);
                }
                let results = comm::collective(arena, states, meet)?;
                Ok(Step::Met(m, results))
            }
        },
        Some(OpClass::PointToPoint) => match comm::point_to_point(states, &sched.messages, r, i)? {
            comm::P2p::Blocked => Ok(Step::Blocked),
            comm::P2p::Done(v) => Ok(Step::Store(vec![v])),
        },
        _ => {
            let ready = node
                .inputs()
                .iter()
                .all(|v| st.env[v.node][v.output].is_some());
            if ready {
                run_call(arena, st, i, custom_ops).map(Step::Store)
            } else {
                Ok(Step::Store(vec![None; node.outputs.len()]))
            }
        }
    }
}

/// Symbolic execution of one graph on the given leaves (inputs and constants by name):
/// every value the leaves reach. Collectives act on one-member groups (identities), as the
/// interpreter runs a single graph.
pub fn run_graph(
    arena: &mut Arena,
    graph: &Graph,
    leaves: &BTreeMap<String, SymTensor>,
    custom_ops: &BTreeMap<String, OpMeaning>,
    limits: &ExecLimits,
) -> Result<SymEnv, ExecError> {
    let program = Program {
        mesh: shardproof_ir::Mesh::new(Vec::new()),
        groups: Vec::new(),
        ranks: vec![std::sync::Arc::new(graph.clone())],
    };
    let mut envs = run_program(
        arena,
        &program,
        std::slice::from_ref(leaves),
        custom_ops,
        limits,
    )?;
    Ok(envs.pop().expect("one rank"))
}

/// Symbolic execution of every rank of `program` on its leaves, collectives and messages
/// paired as the interpreter's schedule pairs them.
pub fn run_program(
    arena: &mut Arena,
    program: &Program,
    leaves: &[BTreeMap<String, SymTensor>],
    custom_ops: &BTreeMap<String, OpMeaning>,
    limits: &ExecLimits,
) -> Result<Vec<SymEnv>, ExecError> {
    let names: Vec<BTreeSet<String>> = leaves.iter().map(|l| l.keys().cloned().collect()).collect();
    let sched = shardproof_interp::schedule(program, custom_ops, Some(&names));
    if let Some(p) = &sched.problem {
        return Err(ExecError::invalid(p.message().to_string()));
    }
    // Which meeting each (rank, node) call belongs to, and its position among the members.
    let mut meeting_of: HashMap<(usize, usize), (usize, usize)> = HashMap::new();
    for (m, meet) in sched.meetings.iter().enumerate() {
        for (pos, &(r, n)) in meet.calls.iter().enumerate() {
            meeting_of.insert((r, n), (m, pos));
        }
    }
    let mut states: Vec<GraphState> = program
        .ranks
        .iter()
        .zip(leaves)
        .map(|(g, _)| {
            let metas = shardproof_interp::infer_graph(g, custom_ops).metas;
            GraphState {
                graph: g,
                metas,
                env: g
                    .nodes
                    .iter()
                    .map(|n| vec![None; n.outputs.len()])
                    .collect(),
                next: 0,
            }
        })
        .collect();
    loop {
        let mut progressed = false;
        for r in 0..states.len() {
            while let Some(node) = states[r].graph.nodes.get(states[r].next) {
                if limits
                    .deadline
                    .is_some_and(|d| std::time::Instant::now() > d)
                {
                    return Err(ExecError {
                        kind: ExecErrorKind::Budget,
                        op: None,
                        message: format!(
                            "the time limit ran out while executing rank {r} at `{}`",
                            node.name
                        ),
                    });
                }
                if let Some(p) = &limits.progress {
                    p.enter(&node.name);
                }
                let i = states[r].next;
                match step(arena, &states, r, &sched, &meeting_of, leaves, custom_ops)? {
                    Step::Blocked => break,
                    Step::Met(m, results) => {
                        for (&(mr, mn), out) in sched.meetings[m].calls.iter().zip(results) {
                            check_size(&states[mr].graph.nodes[mn], &out, limits)?;
                            let st = &mut states[mr];
                            st.env[mn] = out.into_iter().map(Some).collect();
                            st.next = mn + 1;
                        }
                    }
                    Step::Store(outs) => {
                        if tracing::enabled!(tracing::Level::DEBUG) {
                            let terms = outs
                                .iter()
                                .flatten()
                                .flat_map(|t| t.elems.iter())
                                .map(|&e| arena.poly(e).terms.len())
                                .max()
                                .unwrap_or(0);
                            tracing::debug!(rank = r, node = %node.name, terms, "executed");
                        }
                        let flat: Vec<SymTensor> = outs.iter().flatten().cloned().collect();
                        check_size(node, &flat, limits)?;
                        let st = &mut states[r];
                        st.env[i] = outs;
                        st.next = i + 1;
                        if let Some(p) = &limits.progress {
                            p.leave();
                        }
                    }
                }
                progressed = true;
            }
        }
        if states.iter().all(|s| s.next >= s.graph.nodes.len()) {
            break;
        }
        if !progressed {
            let waiting: Vec<String> = states
                .iter()
                .enumerate()
                .filter(|(_, s)| s.next < s.graph.nodes.len())
                .map(|(r, s)| format!("rank {r} at `{}`", s.graph.nodes[s.next].name))
                .collect();
            return Err(ExecError::invalid(format!(
                "the ranks wait on each other: {}",
                waiting.join(", ")
            )));
        }
    }
    Ok(states.into_iter().map(|s| s.env).collect())
}

mod comm;
