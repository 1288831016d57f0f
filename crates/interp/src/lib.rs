//! The reference interpreter: executes a graph (or every rank of a distributed program, with its
//! collectives) on concrete tensors, in f64 as the exact reference or emulating narrower floats.
//!
//! A node runs when all the values it reads are available: graph inputs and constants come from
//! the caller's leaves, and a leaf may also replace any intermediate value (a *cut*). Nodes that
//! depend on a value nobody provided are skipped, so a cut graph only computes what lies
//! downstream of the cut.
//!
//! Point-to-point messages (`shardproof_p2p.send` / `recv`) travel between ranks: a send is
//! buffered and never blocks, a recv takes the oldest message from its source with its tag.

#![warn(missing_docs)]

mod bounds;
mod exec;
mod infer;
mod schedule;
mod typecheck;

pub use bounds::{index_bound, index_bound_known, index_uses, IndexUse, IndexWalk};
pub use exec::{run_graph, run_program};
pub use infer::{infer_graph, live_values, Inference, NodeInference};
pub use schedule::{schedule, Meeting, Schedule, ScheduleProblem};
pub use typecheck::{
    storage_bytes, type_errors, typecheck, TypeError, TypeErrorKind, MAX_TENSOR_SIZE,
};

use shardproof_ir::{Graph, OpMeaning, ValueId};
use shardproof_ops::Tensor;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The floating-point precision a run computes in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Precision {
    /// Every float tensor computed and kept in f64: the exact reference.
    #[default]
    F64,
    /// Every float tensor rounded to f32 after each operator.
    F32,
    /// Every float tensor rounded to bf16 after each operator.
    Bf16,
    /// Every tensor rounded to its declared dtype after each operator (f16 stays f16, ...).
    Native,
}

impl Precision {
    /// Rounds the float elements of `t` to this precision (integer tensors are unchanged).
    pub fn round(self, t: Tensor) -> Tensor {
        let target = match self {
            Precision::F64 => return t,
            _ if !t.dtype().is_float() => return t,
            Precision::F32 => shardproof_ir::DType::F32,
            Precision::Bf16 => shardproof_ir::DType::Bf16,
            Precision::Native => t.dtype(),
        };
        if target == shardproof_ir::DType::F64 {
            return t;
        }
        let data = t
            .data
            .iter()
            .map(|&x| shardproof_ops::round_to(x, target))
            .collect();
        Tensor::new(t.meta, data)
    }
}

/// Settings of a run.
#[derive(Clone, Debug, Default)]
pub struct RunConfig {
    /// Compute precision.
    pub precision: Precision,
    /// Seed of random operators.
    pub seed: u64,
    /// Meanings of custom operators, by `namespace.name` (`tg.log_tensor`) or full name.
    pub custom_ops: BTreeMap<String, OpMeaning>,
    /// Where the run counts the nodes it has passed (one unit per node of every graph run) and
    /// names the one it evaluates, for another thread to show; the caller sets the total.
    pub progress: Option<std::sync::Arc<shardproof_ir::Progress>>,
}

/// The values computed by a run of one graph.
#[derive(Clone, Debug, Default)]
pub struct Env {
    /// Per node, per output: the value, or `None` when it was not computed (it depends on a
    /// value no leaf provided) or the output holds no tensor.
    pub values: Vec<Vec<Option<Tensor>>>,
}

impl Env {
    /// The value `v`, if computed.
    pub fn get(&self, v: ValueId) -> Option<&Tensor> {
        self.values.get(v.node)?.get(v.output)?.as_ref()
    }
}

/// Why a run failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InterpErrorKind {
    /// The graph or its inputs are wrong (shape mismatch, bad argument, missing group).
    Invalid,
    /// An operator has no meaning: not in the registry and not declared by the case.
    Unsupported,
    /// The ranks' communication does not match up: a deadlock, mismatched collectives, or a
    /// point-to-point message without its partner (a recv never sent, a send never received)
    /// or of another type than its recv declares.
    Deadlock,
}

/// An error while running: the node (graph, name, line) and what went wrong.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[error("{message}")]
pub struct InterpError {
    /// What kind of failure.
    pub kind: InterpErrorKind,
    /// Human-readable description including the node and graph.
    pub message: String,
}

impl InterpError {
    fn new(kind: InterpErrorKind, message: impl Into<String>) -> Self {
        InterpError {
            kind,
            message: message.into(),
        }
    }
}

/// For every graph of `graphs`, the index of the first graph equal to it (itself when none
/// before is): what is inferred or type-checked of one graph holds for its copies, and the
/// zoo's presets give thousands of ranks a few distinct programs.
///
/// ```
/// use shardproof_ir::Graph;
/// use std::sync::Arc;
/// let (a, b) = (Arc::new(Graph::new("a")), Arc::new(Graph::new("b")));
/// let copy = Arc::new(Graph::new("a"));
/// let graphs = [a.clone(), b.clone(), a, b, copy];
/// assert_eq!(shardproof_interp::first_equal(&graphs), vec![0, 1, 0, 1, 0]);
/// ```
pub fn first_equal(graphs: &[Arc<Graph>]) -> Vec<usize> {
    // Buckets by a cheap key, so that only graphs that may be equal are compared in full (and
    // shared graphs not even then).
    type Key<'a> = (Option<&'a std::path::Path>, &'a str, usize, usize);
    let mut buckets: BTreeMap<Key, Vec<usize>> = BTreeMap::new();
    let mut first = Vec::with_capacity(graphs.len());
    for (i, g) in graphs.iter().enumerate() {
        let key = (
            g.path.as_deref(),
            g.name.as_str(),
            g.nodes.len(),
            g.inputs.len(),
        );
        let bucket = buckets.entry(key).or_default();
        match bucket
            .iter()
            .find(|&&j| Arc::ptr_eq(&graphs[j], g) || graphs[j] == *g)
        {
            Some(&j) => first.push(j),
            None => {
                bucket.push(i);
                first.push(i);
            }
        }
    }
    first
}
