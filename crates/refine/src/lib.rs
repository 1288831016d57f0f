//! The refinement engine (`shardproof verify`): infers, operator by operator, how every tensor
//! of the specification is rebuilt from the implementation's tensors by clean expressions
//! (slices, concatenations, layout changes, sums over ranks), following the Entangle paper's
//! iterative relation inference with e-graphs (egg). A spec operator whose output has no clean
//! relation localizes a bug.

pub mod engine;
pub mod eval;
pub mod kinds;
pub mod lemmas;
pub mod lower;
pub mod term;

pub use engine::{verify, Certificate, Failure, Options, Outcome, TraceStep, Verdict};
pub use shardproof_ir::Progress;
