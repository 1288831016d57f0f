//! Synthetic traces of a layered model, for tests, examples and the benchmark: a reference on
//! one rank, its perturbed runs, and a candidate on a tensor x data parallel mesh, with
//! rounding-like noise that grows with depth as the seed's model says, and bugs planted on
//! request (a divergent module, divergent DP replicas, a missing module, a missing piece).
//!
//! Values are drawn from a hash of the canonical id (the seed's consistent tensor generator,
//! section 4.2), so the reference and every rank of the candidate agree on each logical tensor
//! without sharing memory, and a tensor of any size is written as a stream.

use crate::error::TraceError;
use crate::format::{CanonicalId, Coords, Kind, Piece, Region, Role, RunDtype, TraceMeta};
use crate::writer::{Local, TraceWriter};
use std::path::Path;

/// What to generate.
#[derive(Clone, Debug, PartialEq)]
pub struct Spec {
    /// Transformer-like layers.
    pub layers: u64,
    /// Rows of each activation (tokens of a microbatch).
    pub tokens: u64,
    /// Columns of each activation and the side of each square weight.
    pub hidden: u64,
    /// The run's dtype.
    pub dtype: RunDtype,
    /// Tensor parallel degree of the candidate (divides `hidden`).
    pub tp: u64,
    /// Data parallel degree of the candidate (one microbatch per DP rank).
    pub dp: u64,
    /// Noise of the candidate and of each perturbed run, relative, in machine epsilons at
    /// layer 1 (it grows as sqrt of the layer).
    pub noise: f64,
    /// A bug to plant in the candidate.
    pub bug: Option<Bug>,
}

impl Default for Spec {
    fn default() -> Spec {
        Spec {
            layers: 4,
            tokens: 8,
            hidden: 16,
            dtype: RunDtype::Float32,
            tp: 2,
            dp: 2,
            noise: 1.0,
            bug: None,
        }
    }
}

/// A bug planted in the candidate.
#[derive(Clone, Debug, PartialEq)]
pub enum Bug {
    /// Every tensor of this module (and, as errors cascade, of later layers' forward outputs)
    /// is off by `relative` of its norm.
    Diverge {
        /// The module (`layers.2.mlp`).
        module: String,
        /// The relative error planted.
        relative: f64,
    },
    /// DP rank 1's main gradient of this parameter is its local gradient (a missing
    /// all-reduce).
    DivergentReplica {
        /// The parameter (`layers.1.mlp.weight`).
        parameter: String,
    },
    /// The candidate does not record this module.
    MissingModule {
        /// The module.
        module: String,
    },
    /// TP rank 1 does not record its piece of this module's output (a part no rank holds).
    MissingPiece {
        /// The module.
        module: String,
    },
}

/// A generated tensor: its id and how its full value is drawn.
struct Tensor {
    id: CanonicalId,
    class: &'static str,
    shape: Vec<u64>,
    /// Sharded over TP along this dimension (`None`: replicated on every TP rank).
    tp_dim: Option<usize>,
    /// Layer for the noise's growth (1-based).
    layer: u64,
}

/// Every tensor of the spec, in execution order.
fn tensors(spec: &Spec) -> Vec<Tensor> {
    let mut out = Vec::new();
    let act = vec![spec.tokens, spec.hidden];
    for mb in 0..spec.dp {
        out.push(Tensor {
            id: CanonicalId::new(0, mb, Kind::ForwardOutput, "embedding", 0),
            class: "VocabParallelEmbedding",
            shape: act.clone(),
            tp_dim: None,
            layer: 1,
        });
        for l in 0..spec.layers {
            let m = format!("layers.{l}.mlp");
            out.push(Tensor {
                id: CanonicalId::new(0, mb, Kind::ForwardOutput, &m, 0),
                class: "ColumnParallelLinear",
                shape: act.clone(),
                tp_dim: Some(1),
                layer: l + 1,
            });
        }
        out.push(Tensor {
            id: CanonicalId::new(0, mb, Kind::ForwardOutput, "loss", 0),
            class: "CrossEntropy",
            shape: vec![],
            tp_dim: None,
            layer: spec.layers + 1,
        });
        for l in (0..spec.layers).rev() {
            let m = format!("layers.{l}.mlp");
            out.push(Tensor {
                id: CanonicalId::new(0, mb, Kind::GradInput, &m, 0),
                class: "ColumnParallelLinear",
                shape: act.clone(),
                tp_dim: None,
                layer: spec.layers - l,
            });
        }
    }
    for l in 0..spec.layers {
        let w = format!("layers.{l}.mlp.weight");
        out.push(Tensor {
            id: CanonicalId::new(0, 0, Kind::MainGrad, &w, 0),
            class: "Parameter",
            shape: vec![spec.hidden, spec.hidden],
            tp_dim: Some(0),
            layer: spec.layers - l,
        });
    }
    out
}

/// splitmix64: a fast, well-mixed hash of a counter.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A value in [-1, 1) from a seed and an element index.
fn uniform(seed: u64, element: u64) -> f64 {
    (mix(seed ^ mix(element)) >> 11) as f64 / (1u64 << 52) as f64 - 1.0
}

/// The seed of an id (FNV-1a of its string form).
fn id_seed(id: &CanonicalId) -> u64 {
    id.to_string().bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// How a run's values differ from the exact ones.
#[derive(Clone, Copy)]
struct Noise {
    /// Relative size (uniform in [-1, 1), so its root mean square is size / sqrt 3).
    size: f64,
    seed: u64,
    /// A planted error, relative.
    bug: f64,
}

fn value(base: u64, element: u64, noise: Noise) -> f64 {
    let x = uniform(base, element);
    let mut v = x * (1.0 + noise.size * uniform(base ^ noise.seed, element));
    if noise.bug != 0.0 {
        v += noise.bug * uniform(base ^ 0xB06, element);
    }
    v
}

/// Writes a single-rank run (the reference, or a perturbed run with `seed`).
fn write_single(dir: &Path, spec: &Spec, role: Role, seed: u64) -> Result<(), TraceError> {
    let mut meta = TraceMeta::new(role, 1, spec.dtype);
    if role == Role::Perturbed {
        meta.perturbation = Some(crate::format::Perturbation {
            seed,
            relative_scale: spec.dtype.precision(),
        });
    }
    let w = TraceWriter::create(dir, meta)?;
    let mut r = w.rank(0, Coords::default())?;
    let eps = spec.dtype.precision();
    for t in tensors(spec) {
        let base = id_seed(&t.id);
        let noise = match role {
            Role::Perturbed => Noise {
                size: spec.noise * eps * (t.layer as f64).sqrt(),
                seed: mix(seed + 1),
                bug: 0.0,
            },
            _ => Noise {
                size: 0.0,
                seed: 0,
                bug: 0.0,
            },
        };
        let whole = Region::whole(&t.shape);
        let n = whole.volume();
        let local = Local {
            shape: &t.shape,
            pieces: vec![Piece::boxed(whole.clone(), whole)],
        };
        r.record_iter(
            t.id.clone(),
            Some(t.class),
            &t.shape,
            local,
            (0..n).map(|e| value(base, e, noise)),
        )?;
    }
    r.finish()
}

/// Writes the reference in `dir` with `perturbed` perturbed runs in `dir/perturbed-K/`.
pub fn write_reference(dir: &Path, spec: &Spec, perturbed: u64) -> Result<(), TraceError> {
    write_single(dir, spec, Role::Reference, 0)?;
    for k in 0..perturbed {
        write_single(
            &dir.join(format!("perturbed-{k}")),
            spec,
            Role::Perturbed,
            1000 + k,
        )?;
    }
    Ok(())
}

/// Writes the candidate in `dir`: rank `d * tp + t` is DP rank `d`, TP rank `t`; DP rank `d`
/// runs microbatch `d`, and every rank holds the main gradients (DP replicas).
pub fn write_candidate(dir: &Path, spec: &Spec) -> Result<(), TraceError> {
    let mut meta = TraceMeta::new(Role::Candidate, spec.tp * spec.dp, spec.dtype);
    meta.parallel.tp = spec.tp;
    meta.parallel.dp = spec.dp;
    let w = TraceWriter::create(dir, meta)?;
    let eps = spec.dtype.precision();
    let all = tensors(spec);
    let bug_layer = match &spec.bug {
        Some(Bug::Diverge { module, .. }) => crate::tolerance::layer_of(module),
        _ => None,
    };
    for d in 0..spec.dp {
        for t in 0..spec.tp {
            let mut r = w.rank(
                d * spec.tp + t,
                Coords {
                    dp: d,
                    tp: t,
                    ..Coords::default()
                },
            )?;
            for x in &all {
                let is_param = x.id.kind == Kind::MainGrad;
                if !is_param && x.id.microbatch != d {
                    continue;
                }
                let module_of =
                    |m: &str| x.id.module == m || x.id.module.starts_with(&format!("{m}."));
                let mut noise = Noise {
                    size: spec.noise * eps * (x.layer as f64).sqrt(),
                    seed: 7,
                    bug: 0.0,
                };
                match &spec.bug {
                    Some(Bug::MissingModule { module }) if module_of(module) => continue,
                    Some(Bug::MissingPiece { module }) if x.id.module == *module && t == 1 => {
                        continue
                    }
                    Some(Bug::Diverge { module, relative }) => {
                        // The planted module diverges, and its error cascades into later
                        // layers' forward outputs (not into what ran before it).
                        let later = x.id.kind == Kind::ForwardOutput
                            && matches!((bug_layer, crate::tolerance::layer_of(&x.id.module)), (Some(b), Some(l)) if l > b);
                        if module_of(module) || later || (x.id.module == "loss") {
                            noise.bug = *relative;
                        }
                    }
                    Some(Bug::DivergentReplica { parameter })
                        if x.id.module == *parameter && d == 1 =>
                    {
                        noise.bug = 0.5;
                    }
                    _ => {}
                }
                let whole = Region::whole(&x.shape);
                let full_box = match x.tp_dim {
                    Some(dim) => {
                        let part = x.shape[dim] / spec.tp;
                        let mut b = whole.clone();
                        b.0[dim] = [t * part, (t + 1) * part];
                        b
                    }
                    None => whole,
                };
                let local_shape = full_box.extents();
                let strides = crate::writer::strides(&x.shape);
                let base = id_seed(&x.id);
                let fb = full_box.clone();
                let count = fb.volume();
                let ext = fb.extents();
                // Row-major walk of the box, yielding the full tensor's values.
                let values = (0..count).map(move |k| {
                    let mut rem = k;
                    let mut offset = 0;
                    for dim in (0..ext.len()).rev() {
                        offset += (fb.0[dim][0] + rem % ext[dim]) * strides[dim];
                        rem /= ext[dim];
                    }
                    value(base, offset, noise)
                });
                let local = Local {
                    shape: &local_shape,
                    pieces: vec![Piece::boxed(Region::whole(&local_shape), full_box)],
                };
                r.record_iter(x.id.clone(), Some(x.class), &x.shape, local, values)?;
            }
            r.finish()?;
        }
    }
    Ok(())
}

/// Bytes of tensor data of one reference run of `spec` (the candidate's, less its replicas).
pub fn reference_bytes(spec: &Spec) -> u64 {
    let size = spec.dtype.storage()[0].size() as u64;
    tensors(spec)
        .iter()
        .map(|t| t.shape.iter().product::<u64>() * size)
        .sum()
}

/// Bytes of tensor data of the candidate of `spec` (every rank's pieces, replicas included).
pub fn candidate_bytes(spec: &Spec) -> u64 {
    let size = spec.dtype.storage()[0].size() as u64;
    tensors(spec)
        .iter()
        .map(|t| {
            let elements: u64 = t.shape.iter().product();
            // Sharded tensors are split over TP, replicated ones copied on every TP rank; main
            // gradients are on every DP rank, activations on their microbatch's.
            let per_dp = if t.tp_dim.is_some() {
                elements
            } else {
                elements * spec.tp
            };
            let dp_copies = if t.id.kind == Kind::MainGrad {
                spec.dp
            } else {
                1
            };
            per_dp * dp_copies * size
        })
        .sum()
}

/// Elements of the largest logical tensor of `spec`.
pub fn largest_tensor(spec: &Spec) -> u64 {
    tensors(spec)
        .iter()
        .map(|t| t.shape.iter().product::<u64>())
        .max()
        .unwrap_or(0)
}
