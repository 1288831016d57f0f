//! Temporal checks on each rank's program order (missing wait, orphaned handle, data race,
//! buffer aliasing), and the cross-rank matching of collectives and messages through the
//! interpreter's simulated schedule.

use crate::report::{Check, RawFinding};
use shardproof_ir::{Graph, NodeKind, OpMeaning, ValueId};
use shardproof_ops::{OpClass, Registry};
use std::collections::BTreeMap;

/// View-like operators: their output aliases their first input's buffer.
const ALIASING: &[&str] = &[
    "view",
    "_unsafe_view",
    "reshape",
    "t",
    "transpose",
    "permute",
    "slice",
    "select",
    "unsqueeze",
    "squeeze",
    "expand",
    "alias",
    "as_strided",
    "detach",
    "narrow",
    "split",
    "chunk",
    "unbind",
    "diagonal",
    "unflatten",
    "flatten",
];

fn class_of(graph: &Graph, i: usize, custom: &BTreeMap<String, OpMeaning>) -> Option<OpClass> {
    let op = graph.nodes[i].op()?;
    if custom.contains_key(&op.to_string()) || custom.contains_key(&op.base()) {
        return None;
    }
    Registry::builtin().get(op).map(|d| d.class)
}

/// Whether a call writes its first argument in place (`add_`, `copy_`, `c10d.allreduce_`).
fn in_place(graph: &Graph, i: usize) -> bool {
    graph.nodes[i].op().is_some_and(|op| {
        op.name.ends_with('_') && !op.name.ends_with("__") && op.name != "detach_"
    })
}

/// The temporal findings of one rank graph.
pub fn temporal(
    graph: &Graph,
    rank: usize,
    custom: &BTreeMap<String, OpMeaning>,
) -> Vec<RawFinding> {
    let mut out = Vec::new();
    let n = graph.nodes.len();
    let consumers = graph.consumers();
    // Alias roots of every node's first output.
    let mut root: Vec<usize> = (0..n).collect();
    for (i, node) in graph.nodes.iter().enumerate() {
        if let Some(op) = node.op() {
            if ALIASING.contains(&op.name.as_str()) || in_place(graph, i) {
                if let Some(v) = node.inputs().first() {
                    root[i] = root[v.node];
                }
            }
        }
    }
    let is_wait = |i: usize| class_of(graph, i, custom) == Some(OpClass::Wait);
    // (collective node, index of its first wait, if any)
    let mut handles: Vec<(usize, Option<usize>)> = Vec::new();
    for (i, users) in consumers.iter().enumerate() {
        if class_of(graph, i, custom) != Some(OpClass::Collective) {
            continue;
        }
        let node = &graph.nodes[i];
        let waits: Vec<usize> = consumers[i]
            .iter()
            .copied()
            .filter(|&j| is_wait(j))
            .collect();
        let first_wait = waits.iter().min().copied();
        handles.push((i, first_wait));
        if waits.is_empty() {
            out.push(RawFinding {
                check: Check::OrphanedHandle,
                rank,
                node: i,
                message: format!(
                    "the result of the functional collective `{}` is never passed to wait_tensor: the collective may still be running when its buffer is read or freed",
                    node.name
                ),
                placements: Vec::new(),
                hint: format!("insert `wait_tensor({})` before the first read of it", node.name),
            });
        }
        for &j in users {
            if is_wait(j) {
                continue;
            }
            if first_wait.is_none_or(|w| w > j) {
                out.push(RawFinding {
                    check: Check::MissingWait,
                    rank,
                    node: j,
                    message: format!(
                        "reads `{}`, the result of an asynchronous collective, before its wait_tensor: a race on real hardware (the values are those of a finished collective only by chance)",
                        node.name
                    ),
                    placements: Vec::new(),
                    hint: format!(
                        "insert `wait_tensor({})` before `{}` and read the waited tensor",
                        node.name, graph.nodes[j].name
                    ),
                });
            }
        }
    }
    // In-place writes to buffers of unfinished collectives.
    for j in 0..n {
        if !in_place(graph, j) {
            continue;
        }
        let Some(target) = graph.nodes[j].inputs().first().copied() else {
            continue;
        };
        let t = root[target.node];
        for &(c, w) in &handles {
            if c >= j || w.is_some_and(|w| w < j) {
                continue;
            }
            let ins: Vec<ValueId> = graph.nodes[c].inputs();
            let reads = ins.iter().any(|v| root[v.node] == t);
            if reads || root[c] == t {
                out.push(RawFinding {
                    check: if class_of(graph, j, custom) == Some(OpClass::Collective) {
                        Check::BufferAliasing
                    } else {
                        Check::DataRace
                    },
                    rank,
                    node: j,
                    message: format!(
                        "writes in place to a buffer the collective `{}` {} before its wait_tensor",
                        graph.nodes[c].name,
                        if reads { "reads" } else { "writes" }
                    ),
                    placements: Vec::new(),
                    hint: format!(
                        "wait for `{}` before the write, or write a copy",
                        graph.nodes[c].name
                    ),
                });
            }
        }
    }
    let _ = NodeKind::Input;
    out
}
