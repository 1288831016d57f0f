//! The reference interpreter: executes a graph (or every rank of a distributed program, with its
//! collectives) on concrete tensors, in f64 as the exact reference or emulating narrower floats.

use shardproof_ir::{Graph, OpMeaning, Program, ValueId};
use shardproof_ops::Tensor;
use std::collections::BTreeMap;

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

/// Settings of a run.
#[derive(Clone, Debug, Default)]
pub struct RunConfig {
    /// Compute precision.
    pub precision: Precision,
    /// Seed of random operators.
    pub seed: u64,
    /// Meanings of custom operators, by full or base name (`tg.log_tensor`).
    pub custom_ops: BTreeMap<String, OpMeaning>,
}

/// The values computed by a run of one graph.
#[derive(Clone, Debug, Default)]
pub struct Env {
    /// Per node, per output: the value, or `None` when it was not needed or not computed.
    pub values: Vec<Vec<Option<Tensor>>>,
}

impl Env {
    /// The value `v`, if computed.
    pub fn get(&self, v: ValueId) -> Option<&Tensor> {
        self.values.get(v.node)?.get(v.output)?.as_ref()
    }
}

/// An error while running: the node (name, graph line) and what went wrong.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{message}")]
pub struct InterpError {
    /// Human-readable description including the node and graph.
    pub message: String,
}

/// Runs `graph` with the given leaf values (graph inputs, constants, or cut tensors by name).
pub fn run_graph(
    graph: &Graph,
    leaves: &BTreeMap<String, Tensor>,
    cfg: &RunConfig,
) -> Result<Env, InterpError> {
    let _ = (graph, leaves, cfg);
    todo!("lead")
}

/// Runs every rank of `program` with per-rank leaf values, executing collectives across ranks.
pub fn run_program(
    program: &Program,
    leaves: &[BTreeMap<String, Tensor>],
    cfg: &RunConfig,
) -> Result<Vec<Env>, InterpError> {
    let _ = (program, leaves, cfg);
    todo!("lead")
}
