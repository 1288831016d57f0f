//! Static shape and dtype inference over a whole graph, with the same operator meanings as the
//! interpreter (registry, declared custom operators, `auto_functionalized_v2`).

use shardproof_ir::{Arg, DecompExpr, Graph, NodeKind, OpMeaning, OpName, ValueId};
use shardproof_ops::{Meta, OpError, Registry, Tensor, Values};
use std::collections::BTreeMap;

/// What inference found for one node.
#[derive(Clone, Debug, PartialEq)]
pub enum NodeInference {
    /// Inferred output metas.
    Inferred(Vec<Meta>),
    /// The operator has no known meaning.
    Opaque(OpName),
    /// The operator is known but rejected its arguments.
    Error(String),
    /// A graph input or constant: its type is what the graph records.
    Leaf,
}

/// The result of inference over a graph.
#[derive(Clone, Debug)]
pub struct Inference {
    /// Per node, what inference found.
    pub nodes: Vec<NodeInference>,
    /// Per node, per output: the meta used downstream (inferred, or the recorded one where
    /// inference could not say).
    pub metas: Vec<Vec<Option<Meta>>>,
}

struct MetaValues<'a>(&'a [Vec<Option<Meta>>]);

impl Values for MetaValues<'_> {
    fn meta(&self, v: ValueId) -> Option<Meta> {
        self.0.get(v.node)?.get(v.output)?.clone()
    }
    fn tensor(&self, _: ValueId) -> Option<&Tensor> {
        None
    }
}

struct ListValues(Vec<Meta>);

impl Values for ListValues {
    fn meta(&self, v: ValueId) -> Option<Meta> {
        self.0.get(v.node).cloned()
    }
    fn tensor(&self, _: ValueId) -> Option<&Tensor> {
        None
    }
}

/// Infers every node's output metas. Where inference cannot say (opaque operator, error, or a
/// symbolic shape), the recorded type stands in so the values downstream can still be checked.
pub fn infer_graph(graph: &Graph, custom_ops: &BTreeMap<String, OpMeaning>) -> Inference {
    let reg = Registry::builtin();
    let mut metas: Vec<Vec<Option<Meta>>> = Vec::with_capacity(graph.nodes.len());
    let mut nodes = Vec::with_capacity(graph.nodes.len());
    let consumers = consumers(graph);
    for (i, node) in graph.nodes.iter().enumerate() {
        let mut recorded: Vec<Option<Meta>> = node
            .outputs
            .iter()
            .map(|o| o.ty.as_ref().and_then(Meta::from_type))
            .collect();
        if matches!(node.kind, NodeKind::Constant { .. }) {
            if let Some(r @ None) = recorded.first_mut() {
                *r = constant_type_from_copy(graph, &consumers[i]);
            }
        }
        let result = match &node.kind {
            NodeKind::Input | NodeKind::Constant { .. } => NodeInference::Leaf,
            NodeKind::Call { op, args, kwargs } => {
                let values = MetaValues(&metas);
                let meaning = custom_ops
                    .get(&op.to_string())
                    .or_else(|| custom_ops.get(&op.base()));
                let first_input = || node.inputs().first().and_then(|&v| values.meta(v));
                match meaning {
                    Some(OpMeaning::Identity) => match first_input() {
                        Some(m) => NodeInference::Inferred(vec![m; node.outputs.len().max(1)]),
                        None => NodeInference::Error("identity operator without a tensor".into()),
                    },
                    Some(OpMeaning::Decompose(DecompExpr::Signature(sig))) => {
                        match (&sig.returns, sig.bind(args, kwargs)) {
                            (Some(ret), Ok(bound)) => match infer_decomp(ret, &bound, &values) {
                                Ok(m) => NodeInference::Inferred(vec![m]),
                                Err(e) => NodeInference::Error(e.0),
                            },
                            (None, _) => NodeInference::Opaque(op.clone()),
                            (_, Err(e)) => NodeInference::Error(e),
                        }
                    }
                    Some(OpMeaning::Decompose(e)) => match infer_decomp(e, args, &values) {
                        Ok(m) => NodeInference::Inferred(vec![m]),
                        Err(e) => NodeInference::Error(e.0),
                    },
                    None if op.namespace == "higher_order"
                        && op.name == "auto_functionalized_v2" =>
                    {
                        infer_auto_functionalized(args, kwargs, &values, custom_ops)
                    }
                    // Calls that fit their declaration were inlined when the case was loaded.
                    None if op.namespace == "higher_order" && op.name == "auto_functionalized" => {
                        match args.first() {
                            Some(Arg::Op(inner)) => NodeInference::Opaque(inner.clone()),
                            _ => NodeInference::Error(
                                "auto_functionalized expects an operator first".into(),
                            ),
                        }
                    }
                    None => match reg.get(op) {
                        None => NodeInference::Opaque(op.clone()),
                        Some(def) => match reg.infer(def, args, kwargs, &values) {
                            Ok(m) => NodeInference::Inferred(m),
                            Err(e) => NodeInference::Error(e.0),
                        },
                    },
                }
            }
        };
        let mut used = recorded.clone();
        if let NodeInference::Inferred(ms) = &result {
            for (o, m) in ms.iter().enumerate().take(used.len()) {
                used[o] = Some(m.clone());
            }
        }
        metas.push(used);
        nodes.push(result);
    }
    Inference { nodes, metas }
}

/// For every node, the later nodes that read one of its values ([`Graph::consumers`], ignoring
/// references to nodes that do not exist, which a malformed graph may hold).
fn consumers(graph: &Graph) -> Vec<Vec<usize>> {
    let mut users = vec![Vec::new(); graph.nodes.len()];
    for (i, n) in graph.nodes.iter().enumerate() {
        for v in n.inputs() {
            if let Some(u) = users.get_mut(v.node) {
                if u.last() != Some(&i) {
                    u.push(i);
                }
            }
        }
    }
    users
}

/// Captures sometimes print a module constant without a type annotation; its value-preserving
/// copy (`lift_fresh_copy` and the like) then records the type the constant must have.
fn constant_type_from_copy(graph: &Graph, consumers: &[usize]) -> Option<Meta> {
    consumers.iter().find_map(|&c| {
        let node = &graph.nodes[c];
        let op = node.op()?;
        let copies = op.namespace == "aten"
            && matches!(
                op.name.as_str(),
                "lift_fresh_copy" | "lift_fresh" | "clone" | "detach" | "alias"
            );
        if !copies {
            return None;
        }
        node.outputs.first()?.ty.as_ref().and_then(Meta::from_type)
    })
}

fn infer_auto_functionalized(
    args: &[Arg],
    kwargs: &[(String, Arg)],
    values: &MetaValues,
    custom_ops: &BTreeMap<String, OpMeaning>,
) -> NodeInference {
    let Some(Arg::Op(inner)) = args.first() else {
        return NodeInference::Error("auto_functionalized_v2 expects an operator first".into());
    };
    let known = matches!(
        custom_ops
            .get(&inner.to_string())
            .or_else(|| custom_ops.get(&inner.base())),
        Some(OpMeaning::Identity)
    );
    if !known {
        return NodeInference::Opaque(inner.clone());
    }
    let bases: Option<Vec<Meta>> = match kwargs.iter().find(|(k, _)| k == "_all_bases") {
        Some((_, Arg::List(items))) => items
            .iter()
            .map(|a| a.as_value().and_then(|v| values.meta(v)))
            .collect(),
        _ => None,
    };
    match bases {
        Some(b) if !b.is_empty() => {
            let mut out = vec![b[0].clone()];
            out.extend(b);
            NodeInference::Inferred(out)
        }
        _ => NodeInference::Error("auto_functionalized_v2 without tensor `_all_bases`".into()),
    }
}

/// Infers the meta of a decomposition, mirroring the interpreter's evaluation.
fn infer_decomp(
    expr: &DecompExpr,
    call_args: &[Arg],
    values: &dyn Values,
) -> Result<Meta, OpError> {
    match expr {
        DecompExpr::Arg(i) => match call_args.get(*i) {
            Some(Arg::Value(v)) => values
                .meta(*v)
                .ok_or_else(|| OpError::new(format!("unknown shape of `${i}`"))),
            _ => Err(OpError::new(format!("`${i}` is not a tensor argument"))),
        },
        DecompExpr::Call { op, args } => {
            let reg = Registry::builtin();
            let def = reg
                .get(op)
                .ok_or_else(|| OpError::new(format!("unknown operator `{op}` in decomposition")))?;
            let mut metas = Vec::new();
            let mut bound = Vec::new();
            for a in args {
                match a {
                    DecompExpr::Int(i) => bound.push(Arg::Int(*i)),
                    DecompExpr::Float(f) => bound.push(Arg::Float(*f)),
                    DecompExpr::Bool(b) => bound.push(Arg::Bool(*b)),
                    DecompExpr::Str(t) => bound.push(Arg::Str(t.clone())),
                    DecompExpr::List(items) => bound.push(Arg::List(
                        items
                            .iter()
                            .map(|i| match i {
                                DecompExpr::Int(v) => Ok(Arg::Int(*v)),
                                DecompExpr::Float(v) => Ok(Arg::Float(*v)),
                                DecompExpr::Bool(v) => Ok(Arg::Bool(*v)),
                                _ => Err(OpError::new("only literal lists in decompositions")),
                            })
                            .collect::<Result<_, _>>()?,
                    )),
                    DecompExpr::Arg(i) if !matches!(call_args.get(*i), Some(Arg::Value(_))) => {
                        bound.push(call_args.get(*i).cloned().ok_or_else(|| {
                            OpError::new(format!("the decomposition reads missing `${i}`"))
                        })?)
                    }
                    _ => {
                        bound.push(Arg::Value(ValueId::new(metas.len(), 0)));
                        metas.push(infer_decomp(a, call_args, values)?);
                    }
                }
            }
            reg.infer(def, &bound, &[], &ListValues(metas))?
                .into_iter()
                .next()
                .ok_or_else(|| OpError::new(format!("`{op}` returns nothing")))
        }
        _ => Err(OpError::new("a decomposition must evaluate to a tensor")),
    }
}

/// Which values a run would compute when exactly the named values are given as leaves: the
/// interpreter's rule (a node runs when every value it reads is available) without running.
pub fn live_values(graph: &Graph, leaves: &std::collections::BTreeSet<String>) -> Vec<Vec<bool>> {
    let mut live: Vec<Vec<bool>> = Vec::with_capacity(graph.nodes.len());
    for node in &graph.nodes {
        let given: Vec<bool> = node
            .outputs
            .iter()
            .map(|o| leaves.contains(&o.name))
            .collect();
        let runs = matches!(node.kind, NodeKind::Call { .. })
            && node.inputs().iter().all(|v| {
                live.get(v.node)
                    .and_then(|l| l.get(v.output))
                    .copied()
                    .unwrap_or(false)
            });
        live.push(given.into_iter().map(|g| g || runs).collect());
    }
    live
}
