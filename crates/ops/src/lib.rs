//! The operator registry of shardproof: every operator's schema, shape and dtype inference and
//! reference kernel, over dense [`Tensor`]s.
//!
//! Kernels compute in f64 and never round to narrower float types themselves: the interpreter
//! rounds every output to the precision of the run, so one kernel serves f64, f32, bf16 and fp8.

#![warn(missing_docs)]

mod args;
mod registry;
mod schema;
mod tensor;

pub mod util;

#[cfg(test)]
mod testing;

// Operator families, one module each.
mod attention;
mod collective;
mod create;
mod elementwise;
mod index;
mod linalg;
mod nn;
mod p2p;
mod random;
mod reduce;
mod shape;

pub use args::{normalize_args, Args, NoValues, TensorList, Values};
pub use collective::apply_collective;
pub use p2p::{
    p2p_call, p2p_node_call, program_members, GroupMembers, P2pCall, P2pEnd, P2P_NAMESPACE,
};
pub use registry::{
    check_inputs, check_outputs, check_tensor, EvalCtx, EvalFn, InferFn, Meta0, OpClass, OpDef,
    Registry,
};
pub use schema::{ArgType, Schema, SchemaArg};
pub use tensor::{cast_value, checked_numel, round_to, strides, Meta, Tensor};

/// An error in a call: wrong arguments, incompatible shapes, an unsupported variant.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct OpError(pub String);

impl OpError {
    /// An error with the given message.
    pub fn new(msg: impl Into<String>) -> Self {
        OpError(msg.into())
    }
}

/// Registers every built-in operator family.
fn register_all(r: &mut Registry) {
    collective::register(r);
    create::register(r);
    elementwise::register(r);
    index::register(r);
    linalg::register(r);
    nn::register(r);
    p2p::register(r);
    random::register(r);
    reduce::register(r);
    shape::register(r);
}
