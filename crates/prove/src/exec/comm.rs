//! Collectives and point-to-point messages on symbolic tensors, across ranks.
//!
//! Reducing collectives (`all_reduce`, `reduce_scatter_tensor`) combine the members' elements
//! symbolically (sum, average, max, min, product); the others only move data and run through
//! the registry's collective semantics on index-encoded tensors, like [`super::movement`].

use super::movement::Encoding;
use super::{ExecError, GraphState, MetaValues};
use crate::expr::{Arena, Coeff, ExprId, Func};
use crate::tensor::SymTensor;
use shardproof_interp::Meeting;
use shardproof_ir::{Arg, NodeKind, ValueId};
use shardproof_ops::{apply_collective, Args, Meta, Registry, Tensor, Values};
use std::collections::{BTreeMap, HashMap};

struct Encoded<'a> {
    metas: MetaValues<'a>,
    tensors: HashMap<ValueId, Tensor>,
}

impl Values for Encoded<'_> {
    fn meta(&self, v: ValueId) -> Option<Meta> {
        self.tensors
            .get(&v)
            .map(|t| t.meta.clone())
            .or_else(|| self.metas.meta(v))
    }
    fn tensor(&self, v: ValueId) -> Option<&Tensor> {
        self.tensors.get(&v)
    }
}

fn kwargs_of(kind: &NodeKind) -> &[(String, Arg)] {
    match kind {
        NodeKind::Call { kwargs, .. } => kwargs,
        _ => &[],
    }
}

/// Combines elements across members by a c10d reduce op.
fn reduce(arena: &mut Arena, op: &str, xs: &[ExprId]) -> Result<ExprId, ExecError> {
    Ok(match op {
        "sum" => arena.sum(xs)?,
        "avg" => {
            let s = arena.sum(xs)?;
            arena.scale(s, &Coeff::new(1, xs.len() as i64))?
        }
        "product" => arena.product(xs)?,
        "max" => arena.app(Func::Max, xs.to_vec())?,
        "min" => arena.app(Func::Min, xs.to_vec())?,
        other => {
            return Err(ExecError::unsupported(
                "_c10d_functional",
                format!("reduce_op `{other}` has no symbolic rule"),
            ))
        }
    })
}

/// Runs one collective: every member's outputs, in member order.
pub(super) fn collective(
    arena: &mut Arena,
    states: &[GraphState],
    meet: &Meeting,
) -> Result<Vec<Vec<SymTensor>>, ExecError> {
    let reg = Registry::builtin();
    let def = reg
        .get(&meet.op)
        .ok_or_else(|| ExecError::unsupported(&meet.op.to_string(), "unknown collective"))?;
    let name = def.name.name.as_str();
    let where_ = |r: usize, n: usize| {
        format!(
            "rank {r}: `{}` ({})",
            states[r].graph.nodes[n].name, def.name
        )
    };
    // Each member's input tensor and reduce op.
    let mut inputs = Vec::new();
    let mut reduce_ops = Vec::new();
    for &(r, n) in &meet.calls {
        let st = &states[r];
        let node = &st.graph.nodes[n];
        let values = MetaValues(&st.metas);
        let bound = Args::bind(&def.schema, node.args(), kwargs_of(&node.kind), &values)
            .map_err(|e| ExecError::invalid(format!("{}: {e}", where_(r, n))))?;
        if matches!(name, "all_reduce" | "reduce_scatter_tensor") {
            reduce_ops.push(
                bound
                    .str("reduce_op")
                    .map_err(|e| ExecError::invalid(e.to_string()))?,
            );
            let Some(Arg::Value(v)) = bound.get("input") else {
                return Err(ExecError::invalid(format!(
                    "{}: no input tensor",
                    where_(r, n)
                )));
            };
            let t = st.env[v.node][v.output].clone().ok_or_else(|| {
                ExecError::invalid(format!("{}: input not computed", where_(r, n)))
            })?;
            inputs.push(t);
        }
    }
    match name {
        "all_reduce" | "reduce_scatter_tensor" => {
            let op = reduce_ops[0].clone();
            if reduce_ops.iter().any(|o| *o != op) {
                return Err(ExecError::invalid(format!(
                    "{}: members disagree on reduce_op",
                    where_(meet.calls[0].0, meet.calls[0].1)
                )));
            }
            let shape = inputs[0].shape.clone();
            if inputs.iter().any(|t| t.shape != shape) {
                return Err(ExecError::invalid(format!(
                    "{}: members' inputs differ in shape",
                    where_(meet.calls[0].0, meet.calls[0].1)
                )));
            }
            // A sum or product wraps as the members' elements do (a ring operation); a max,
            // min or average reads the wrapped values, which a narrow integer type's exact
            // elements are not unless shown within its range.
            if matches!(op.as_str(), "max" | "min" | "avg") {
                if let Some((lo, hi)) = inputs
                    .iter()
                    .find_map(|t| super::rules::wrapped_range(arena, t))
                {
                    return Err(ExecError::unsupported(
                        &def.name.to_string(),
                        format!(
                            "{}: reduce_op `{op}` of {:?} values not shown within [{lo}, {hi}], \
                             where the type wraps",
                            where_(meet.calls[0].0, meet.calls[0].1),
                            inputs[0].dtype
                        ),
                    ));
                }
            }
            let n = inputs[0].numel();
            let mut reduced = Vec::with_capacity(n);
            for e in 0..n {
                let xs: Vec<ExprId> = inputs.iter().map(|t| t.elems[e]).collect();
                reduced.push(reduce(arena, &op, &xs)?);
            }
            let full = SymTensor::new(inputs[0].dtype, shape.clone(), reduced);
            if name == "all_reduce" {
                return Ok(vec![vec![full]; meet.calls.len()]);
            }
            let members = meet.calls.len();
            let rows = shape.first().copied().unwrap_or(0);
            if rows % members != 0 {
                return Err(ExecError::invalid(format!(
                    "{}: dim 0 of size {rows} does not split among {members} members",
                    where_(meet.calls[0].0, meet.calls[0].1)
                )));
            }
            let chunk = n / members;
            let mut out_shape = shape.clone();
            out_shape[0] = rows / members;
            Ok((0..members)
                .map(|k| {
                    vec![SymTensor::new(
                        full.dtype,
                        out_shape.clone(),
                        full.elems[k * chunk..(k + 1) * chunk].to_vec(),
                    )]
                })
                .collect())
        }
        "all_gather_into_tensor" | "broadcast" | "all_to_all_single" => {
            // Data movement: the registry's semantics on encoded tensors.
            let mut enc = Encoding::new();
            let mut bound_values = Vec::new();
            for &(r, n) in &meet.calls {
                let st = &states[r];
                let node = &st.graph.nodes[n];
                let mut tensors = HashMap::new();
                for v in node.inputs() {
                    let t = st.env[v.node][v.output].as_ref().ok_or_else(|| {
                        ExecError::invalid(format!("{}: input not computed", where_(r, n)))
                    })?;
                    tensors.insert(v, enc.encode(t));
                }
                bound_values.push(Encoded {
                    metas: MetaValues(&st.metas),
                    tensors,
                });
            }
            let bound: Vec<Args> = meet
                .calls
                .iter()
                .zip(&bound_values)
                .map(|(&(r, n), vals)| {
                    let node = &states[r].graph.nodes[n];
                    Args::bind(&def.schema, node.args(), kwargs_of(&node.kind), vals)
                        .map_err(|e| ExecError::invalid(format!("{}: {e}", where_(r, n))))
                })
                .collect::<Result<_, _>>()?;
            let refs: Vec<&Args> = bound.iter().collect();
            (0..refs.len())
                .map(|k| {
                    let (r, n) = meet.calls[k];
                    let outs = apply_collective(def, &refs, k)
                        .map_err(|e| ExecError::invalid(format!("{}: {e}", where_(r, n))))?;
                    let dtype = states[r].metas[n]
                        .first()
                        .cloned()
                        .flatten()
                        .map(|m| m.dtype);
                    outs.iter()
                        .map(|t| {
                            let elems = enc.decode(t).map_err(|e| {
                                ExecError::unsupported(
                                    &def.name.to_string(),
                                    format!("{}: {e}", where_(r, n)),
                                )
                            })?;
                            Ok(SymTensor::new(
                                dtype.unwrap_or(t.dtype()),
                                t.shape().to_vec(),
                                elems,
                            ))
                        })
                        .collect()
                })
                .collect()
        }
        _ => Err(ExecError::unsupported(
            &def.name.to_string(),
            format!(
                "{}: this collective has no symbolic rule",
                where_(meet.calls[0].0, meet.calls[0].1)
            ),
        )),
    }
}

/// The outcome of a point-to-point call.
pub(super) enum P2p {
    /// A recv whose message is not sent yet.
    Blocked,
    /// The call's output (a send returns what it sends; a recv what it receives).
    Done(Option<SymTensor>),
}

/// Runs rank `r`'s send or recv at node `i`.
pub(super) fn point_to_point(
    states: &[GraphState],
    messages: &BTreeMap<(usize, usize), (usize, usize)>,
    r: usize,
    i: usize,
) -> Result<P2p, ExecError> {
    let node = &states[r].graph.nodes[i];
    let op = node.op().expect("a call");
    if op.name == "send" {
        let input = node
            .inputs()
            .first()
            .and_then(|v| states[r].env[v.node][v.output].clone());
        return Ok(P2p::Done(input));
    }
    let Some(&(sr, sn)) = messages.get(&(r, i)) else {
        return Err(ExecError::invalid(format!(
            "rank {r}: `{}` receives a message no rank sends",
            node.name
        )));
    };
    if states[sr].next <= sn {
        return Ok(P2p::Blocked);
    }
    let sent = &states[sr].graph.nodes[sn];
    let value = sent
        .inputs()
        .first()
        .and_then(|v| states[sr].env[v.node][v.output].clone());
    // The recv's buffer has the type it declares: a message of another shape or dtype has no
    // meaning (the interpreter refuses to run it), and passing it on would let the receiver
    // compute on a tensor its own graph does not describe.
    if let (Some(t), Some(ty)) = (&value, node.outputs.first().and_then(|o| o.ty.as_ref())) {
        let declared: Option<Vec<usize>> = ty
            .concrete_shape()
            .map(|s| s.iter().map(|&d| d as usize).collect());
        if declared.as_ref() != Some(&t.shape) || ty.dtype != t.dtype {
            return Err(ExecError::invalid(format!(
                "rank {r}: `{}` declares {:?} {:?} but receives {:?} {:?} from rank {sr}'s `{}`",
                node.name, ty.dtype, declared, t.dtype, t.shape, sent.name
            )));
        }
    }
    Ok(P2p::Done(value))
}
