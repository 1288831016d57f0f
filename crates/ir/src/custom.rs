//! Meanings of custom operators declared in a case file (`ops:`), so no Rust is needed to teach
//! shardproof an operator.

use crate::OpName;

/// What a declared custom operator computes.
#[derive(Clone, Debug, PartialEq)]
pub enum OpMeaning {
    /// The output is the first tensor argument (logging, marking and similar no-op operators).
    Identity,
    /// The output is this expression over the call's arguments.
    Decompose(DecompExpr),
}

/// An expression over a custom operator's arguments, e.g. `gelu(add($0, $1))`.
#[derive(Clone, Debug, PartialEq)]
pub enum DecompExpr {
    /// `$i`: the i-th positional argument of the call.
    Arg(usize),
    /// An integer literal argument.
    Int(i64),
    /// A float literal argument.
    Float(f64),
    /// A bool literal argument.
    Bool(bool),
    /// A list literal argument (e.g. dims `[0, 1]`).
    List(Vec<DecompExpr>),
    /// A call of a registered operator (full name, e.g. `aten.gelu.default`).
    Call {
        /// The operator.
        op: OpName,
        /// Its positional arguments.
        args: Vec<DecompExpr>,
    },
}
