//! Trace testing (seed 002, TTrace): a distributed run and a trusted reference run record the
//! same logical tensors (module inputs and outputs, their gradients, parameter and main
//! gradients, parameters around the optimizer step) by canonical id, each rank with the map of
//! the pieces it holds; this crate compares them.
//!
//! - [`format`], [`reader`], [`writer`]: the trace format, version 1 (docs/formats/trace.md):
//!   a directory with `trace.json` and per rank `index.json` plus `tensors.safetensors`, read
//!   memory-mapped and checked strictly; every malformed input is a [`TraceError`] naming the
//!   file and the JSON path or tensor key.
//! - [`merge`]: rebuilds each logical full tensor from its ranks' pieces, finding partial
//!   overlaps, omissions and replicas that disagree, without copying ([`sums`] streams the
//!   mapped data).
//! - [`tolerance`]: each tensor's tolerance from the reference's perturbed runs, with the
//!   seed's growth model across layers; a dtype default, said so, when there is none.
//! - [`compare`]: aligns by canonical id, judges every tensor, and reports the first divergence
//!   in execution order (forward, backward, optimizer) and a per-module table.
//! - [`emit`]: traces of a case's interpreter runs (spec as the reference, with perturbed
//!   reruns; ranks as the candidate), pieces from the case's layouts.
//! - [`synthetic`]: synthetic traces of a layered model with planted bugs (tests, benchmark).
//!
//! ```
//! use shardproof_trace::*;
//!
//! let dir = tempfile::tempdir().unwrap();
//! let id = CanonicalId::new(0, 0, Kind::ForwardOutput, "layers.0.mlp", 0);
//! let full: Vec<f64> = (0..8).map(|x| x as f64).collect(); // shape [2, 4]
//! let whole = Region::whole(&[2, 4]);
//! // The reference: one rank with the whole tensor.
//! let r = TraceWriter::create(&dir.path().join("ref"), TraceMeta::new(Role::Reference, 1, RunDtype::Float32)).unwrap();
//! let mut w = r.rank(0, Coords::default()).unwrap();
//! let pieces = vec![Piece::boxed(whole.clone(), whole.clone())];
//! w.record(id.clone(), None, &[2, 4], Local { shape: &[2, 4], pieces }, &full).unwrap();
//! w.finish().unwrap();
//! // The candidate: two tensor-parallel ranks, each with two columns.
//! let mut meta = TraceMeta::new(Role::Candidate, 2, RunDtype::Float32);
//! meta.parallel.tp = 2;
//! let c = TraceWriter::create(&dir.path().join("cand"), meta).unwrap();
//! for tp in 0..2u64 {
//!     let cols = Region(vec![[0, 2], [2 * tp, 2 * tp + 2]]);
//!     let mut w = c.rank(tp, Coords { tp, ..Coords::default() }).unwrap();
//!     let pieces = vec![Piece::boxed(Region::whole(&[2, 2]), cols.clone())];
//!     let local = extract(&full, &[2, 4], &cols);
//!     w.record(id.clone(), None, &[2, 4], Local { shape: &[2, 2], pieces }, &local).unwrap();
//!     w.finish().unwrap();
//! }
//! let reference = Trace::open(&dir.path().join("ref")).unwrap();
//! let candidate = Trace::open(&dir.path().join("cand")).unwrap();
//! let result = compare(&reference, &[], &candidate);
//! assert_eq!(result.verdict, Verdict::Holds);
//! assert_eq!(result.tensors[0].relative_error, Some(0.0));
//! // No perturbed run: the report says the tolerances are the dtype's default.
//! assert!(result.tolerances.note.is_some());
//! ```

#![warn(missing_docs)]

pub mod compare;
pub mod emit;
pub mod error;
pub mod format;
pub mod merge;
pub mod modules;
pub mod perturb;
pub mod reader;
pub mod sums;
pub mod synthetic;
pub mod tolerance;
pub mod writer;

pub use compare::{compare, compare_counted, Comparison, Status, TensorResult, Verdict};
pub use error::TraceError;
pub use format::{
    CanonicalId, Coords, Kind, Parallel, Perturbation, Piece, Region, Role, RunDtype, TraceMeta,
};
pub use reader::Trace;
pub use writer::{extract, Local, RankWriter, TraceWriter};

/// Opens a reference trace with its perturbed runs and a candidate trace, and compares them.
pub fn compare_dirs(
    reference: &std::path::Path,
    candidate: &std::path::Path,
) -> Result<Comparison, TraceError> {
    compare_dirs_counted(reference, candidate, &shardproof_ir::Progress::default())
}

/// [`compare_dirs`], counting the logical tensors compared in `progress`.
pub fn compare_dirs_counted(
    reference: &std::path::Path,
    candidate: &std::path::Path,
    progress: &shardproof_ir::Progress,
) -> Result<Comparison, TraceError> {
    let r = Trace::open(reference)?;
    if r.meta.role != Role::Reference {
        return Err(TraceError::new(
            &reference.join("trace.json"),
            Some("$.role".into()),
            format!(
                "expected a reference trace, found role {:?}",
                r.meta.role.name()
            ),
        )
        .with_hint("the first directory is the reference run, the second the candidate"));
    }
    let perturbed = r.open_perturbed()?;
    let c = Trace::open(candidate)?;
    if c.meta.role == Role::Perturbed {
        return Err(TraceError::new(
            &candidate.join("trace.json"),
            Some("$.role".into()),
            "expected a candidate (or reference) trace, found role \"perturbed\"",
        )
        .with_hint("perturbed runs live in the reference's perturbed-K/ directories"));
    }
    Ok(compare::compare_counted(&r, &perturbed, &c, progress))
}
