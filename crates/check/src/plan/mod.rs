//! Plans: distributed programs written by hand (docs/formats/plan.md).
//!
//! A plan names a mesh, its inputs with their global shapes and placements, the operators
//! each rank runs (blocks `on pp=0 { ... }` restrict statements to some ranks), collectives
//! (synchronous, or asynchronous with a later `wait`), point-to-point sends and recvs, and the
//! placements its outputs must have. [`load_plan`] lowers it to the shared IR, as a
//! [`Case`] without a spec: the mesh, a process group per mesh dim (and the declared ones),
//! one graph per rank with local shapes, the input placements and the output expectations.
//! Every check runs on it unchanged.
//!
//! ```
//! use shardproof_check::{check_case, plan::parse_plan, Verdict};
//! let text = "mesh tp=2\n\
//!     input x: f32[8, 16] tp=Shard(1)\n\
//!     input w: f32[16, 32] tp=Shard(0)\n\
//!     y_partial = mm(x, w)\n\
//!     output y_partial tp=Replicate()\n";
//! let case = parse_plan(std::path::Path::new("tp_linear.plan"), text).unwrap();
//! let report = check_case(&case).unwrap();
//! assert_eq!(report.verdict, Verdict::Violated);
//! assert_eq!(report.findings[0].line, Some(4));
//! assert!(report.findings[0].hint.contains("insert all_reduce(sum) over tp after `y_partial`"));
//! ```

mod lower;
mod syntax;

use shardproof_case::Case;
use shardproof_ir::SourceError;
use std::path::Path;

/// The extension that marks a plan file (`shardproof check` reads any other file as a case).
pub const PLAN_EXTENSION: &str = "plan";

/// Whether `path` names a plan (its extension is `.plan`).
pub fn is_plan_path(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == PLAN_EXTENSION)
}

/// Reads and lowers the plan at `path`.
pub fn load_plan(path: &Path) -> Result<Case, SourceError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        SourceError::new(path, None, format!("cannot read the plan: {e}"))
            .with_hint("check the path")
    })?;
    parse_plan(path, &text)
}

/// Parses and lowers a plan's text; `path` names it in errors and findings.
pub fn parse_plan(path: &Path, text: &str) -> Result<Case, SourceError> {
    let ast = syntax::parse(path, text)?;
    lower::lower(path, &ast)
}
