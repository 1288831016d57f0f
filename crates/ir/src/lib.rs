//! The graph IR shared by every importer, the interpreter and every engine of shardproof.
//!
//! A [`Graph`] is a topologically ordered list of [`Node`]s; each node produces one or more
//! values addressed by [`ValueId`] (node index, output index), the way `getitem` addresses the
//! outputs of a multi-output torch.fx node. A [`Program`] is a device mesh, its process groups and
//! one graph per rank.

mod custom;
mod diag;
mod dtype;
mod graph;
mod program;
mod progress;

pub use custom::{DecompExpr, OpMeaning, Signature};
pub use diag::{Located, SourceError, Span};
pub use dtype::DType;
pub use graph::{Arg, Dim, Graph, Node, NodeKind, OpName, Output, SourceLoc, TensorType, ValueId};
pub use program::{MemberIndex, Mesh, ProcessGroup, Program};
pub use progress::Progress;
