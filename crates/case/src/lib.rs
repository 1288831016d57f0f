//! The case file of shardproof: a YAML description of a specification graph, a distributed
//! implementation (mesh, one graph per rank, process groups), how the spec's tensors are laid out
//! across the ranks, what is expected of the outputs, the meaning of custom operators, and the
//! assumptions the user accepts. The format is documented in `docs/formats/case-format.md`.
//!
//! [`parse_case`] reads the text into a [`CaseFile`] that keeps the position of every key and
//! value; [`load_case`] also reads the graphs and resolves the case into a [`Case`]; every
//! problem is a [`SourceError`](shardproof_ir::SourceError) with file, line, column and a hint.
//! [`rank_pieces`] tells which part of a spec tensor each rank holds.

#![warn(missing_docs)]

mod decomp;
mod expand;
mod expr;
mod layout;
mod lex;
mod placement;
mod resolve;
mod suggest;
mod syntax;
mod yaml;

pub use expr::{Expr, ExprKind};
pub use layout::{
    rank_pieces, simple_layouts, Block, Blocks, Held, Layout, LayoutError, PartialShare,
    PlacedLayout, RankPiece,
};
pub use placement::{Placement, Reduce};
pub use resolve::{
    load_case, load_case_with_scales, resolve_case, Assumptions, Case, DropoutAssumption,
    InputRelation, OutputExpectation, Override,
};
pub use suggest::did_you_mean;
pub use syntax::{
    parse_case, Assumption, AtDim, BlockSpec, BlocksSpec, CaseFile, GraphRef, GroupDecl,
    GroupTarget, ImplSpec, InputEntry, LayoutSpec, MeshDimDecl, OpDecl, OutputEntry, PlacementSpec,
    TensorEntry,
};

use shardproof_ir::OpName;

/// Resolves an operator name the way `ops:` decompositions do: a dotted name is a full name
/// (`namespace.name[.overload]`), a bare name is `aten.<name>.default`.
pub fn resolve_op_name(name: &str) -> Option<OpName> {
    decomp::resolve_op_name(name)
}
