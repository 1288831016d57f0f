//! The element-level prover of shardproof (work in progress; documented below once complete).

#![warn(missing_docs)]

pub mod decide;
pub mod eval;
pub mod expr;
pub mod smt;
