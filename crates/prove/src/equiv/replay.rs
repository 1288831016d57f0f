//! The PyTorch replay of a counterexample: `replay.json` (the spec graph, the ranks' graphs,
//! the communication schedule the interpreter runs and, per spec element of the failing
//! output, the rank elements the output placement rebuilds it from) and `replay.py`, which
//! evaluates the graphs with `torch.ops` on the counterexample's inputs, independently of the
//! reference interpreter.

use super::layout::rebuild;
use serde_json::{json, Value};
use shardproof_case::{Case, Layout, Reduce};
use shardproof_ir::{Arg, Graph, NodeKind, ValueId};
use shardproof_ops::Tensor;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The replay script; it reads `replay.json` and `inputs.safetensors` next to it.
pub const SCRIPT: &str = include_str!("replay.py");

fn arg_json(a: &Arg) -> Value {
    match a {
        Arg::None => Value::Null,
        Arg::Bool(b) => json!(b),
        Arg::Int(i) => json!(i),
        // Tagged so that 1.0 stays a float and inf/nan survive JSON.
        Arg::Float(f) => json!({ "float": f.to_string() }),
        Arg::Str(s) => json!(s),
        Arg::Value(v) => json!({ "value": [v.node, v.output] }),
        Arg::List(items) => Value::Array(items.iter().map(arg_json).collect()),
        Arg::Dtype(d) => json!({ "dtype": d.to_string() }),
        Arg::Device(d) => json!({ "device": d }),
        Arg::Layout(l) => json!({ "layout": l }),
        Arg::MemoryFormat(m) => json!({ "memory_format": m }),
        Arg::Op(op) => json!({ "op": op.to_string() }),
    }
}

fn graph_json(g: &Graph) -> Value {
    let nodes: Vec<Value> = g
        .nodes
        .iter()
        .map(|n| {
            let outputs: Vec<&str> = n.outputs.iter().map(|o| o.name.as_str()).collect();
            let mut v = json!({ "name": n.name, "outputs": outputs, "line": n.line });
            match &n.kind {
                NodeKind::Input => v["kind"] = json!("input"),
                NodeKind::Constant { attr } => {
                    v["kind"] = json!("constant");
                    v["attr"] = json!(attr);
                }
                NodeKind::Call { op, args, kwargs } => {
                    v["kind"] = json!("call");
                    v["op"] = json!([op.namespace, op.name, op.overload]);
                    v["args"] = Value::Array(args.iter().map(arg_json).collect());
                    v["kwargs"] = Value::Object(
                        kwargs
                            .iter()
                            .map(|(k, a)| (k.clone(), arg_json(a)))
                            .collect(),
                    );
                }
            }
            v
        })
        .collect();
    json!({
        "name": g.name,
        "file": g.path.as_ref().map(|p| p.display().to_string()),
        "nodes": nodes,
    })
}

fn dtypes(inputs: &BTreeMap<String, Tensor>) -> Value {
    Value::Object(
        inputs
            .iter()
            .map(|(n, t)| (n.clone(), json!(t.meta.dtype.to_string())))
            .collect(),
    )
}

/// Builds `replay.json` for the failing output `spec_value` of `case`, held by `holders`
/// (rank, value) and laid out by `layout`.
#[allow(clippy::too_many_arguments)]
pub fn plan(
    case: &Case,
    name: &str,
    spec_value: ValueId,
    spec_shape: &[usize],
    holders: &[(usize, ValueId)],
    layout: &Layout,
    spec_inputs: &BTreeMap<String, Tensor>,
    rank_inputs: &[BTreeMap<String, Tensor>],
    rank_shape: &dyn Fn(usize) -> Option<Vec<usize>>,
) -> Result<Value, String> {
    // Ranks that share a graph share one copy in the plan.
    let mut graphs: Vec<Value> = Vec::new();
    let mut seen: Vec<*const Graph> = Vec::new();
    let mut rank_graph = Vec::new();
    for g in &case.program.ranks {
        let p = Arc::as_ptr(g);
        let i = match seen.iter().position(|&q| q == p) {
            Some(i) => i,
            None => {
                seen.push(p);
                graphs.push(graph_json(g));
                seen.len() - 1
            }
        };
        rank_graph.push(i);
    }
    let sched = shardproof_interp::schedule(&case.program, &case.ops, None);
    if let Some(p) = &sched.problem {
        return Err(format!("the ranks' schedule: {}", p.message()));
    }
    let meetings: Vec<Value> = sched
        .meetings
        .iter()
        .map(|m| json!({ "group": m.group, "op": m.op.name, "calls": m.calls }))
        .collect();
    let messages: Vec<Value> = sched
        .messages
        .iter()
        .map(|(recv, send)| json!({ "recv": [recv.0, recv.1], "send": [send.0, send.1] }))
        .collect();
    let holder_ranks: Vec<usize> = holders.iter().map(|&(r, _)| r).collect();
    let pieces = rebuild(
        layout,
        spec_shape,
        &case.program.mesh,
        &holder_ranks,
        rank_shape,
        &mut |r, i| json!([r, i]),
        &mut |red, xs: Vec<Value>| {
            let op = match red {
                Reduce::Sum => "sum",
                Reduce::Avg => "avg",
                Reduce::Max => "max",
                Reduce::Min => "min",
            };
            Ok(json!({ "reduce": op, "of": xs }))
        },
    )
    .map_err(|m| m.0)?;
    let mut sources = vec![Value::Null; spec_shape.iter().product()];
    for p in pieces {
        sources[p.spec_index] = p.value;
    }
    Ok(json!({
        "output": name,
        "spec_value": [spec_value.node, spec_value.output],
        "shape": spec_shape,
        "holders": holders.iter().map(|(r, v)| json!([r, [v.node, v.output]])).collect::<Vec<_>>(),
        "layout": layout.to_string(),
        "sources": sources,
        "spec": graph_json(&case.spec),
        "graphs": graphs,
        "rank_graph": rank_graph,
        "meetings": meetings,
        "messages": messages,
        "spec_dtypes": dtypes(spec_inputs),
        "rank_dtypes": rank_inputs.iter().map(dtypes).collect::<Vec<_>>(),
    }))
}
