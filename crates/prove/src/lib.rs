//! The element-level prover of shardproof (work in progress; documented below once complete).

#![warn(missing_docs)]

pub mod decide;
pub mod equiv;
pub mod eval;
pub mod exec;
pub mod expr;
pub mod smt;
pub mod tensor;

pub use equiv::{prove_case, Proof, ProveConfig, Verdict};
