//! Traces of the interpreter's runs of a case (item 6 of issue 46): the spec run is the
//! reference (plus perturbed reruns with inputs perturbed at the dtype's machine epsilon), the
//! ranks' run is the candidate, so `trace compare` judges a case with perturbation tolerances.
//!
//! What is recorded is what the case declares a layout for: its inputs (`forward_input`) and
//! its output expectations (`forward_output`; an output named `NAME_new` whose `NAME` is an
//! input is that parameter's `param_after_step`). Each rank's pieces come from the case's
//! layout ([`shardproof_case::rank_pieces`]): one piece per block. The module of an id is the
//! tensor's name: zoo graphs carry no module annotations, so module-level localization inside
//! a graph is not available here (the comparison localizes to the first divergent declared
//! tensor). Anything the emitter cannot represent soundly is refused, never approximated:
//! integer or `expr:` inputs, partial (unreduced) layouts, values the run did not compute.

use crate::error::TraceError;
use crate::format::{
    CanonicalId, Coords, Kind, Perturbation, Piece, Region, Role, RunDtype, TraceMeta,
};
use crate::writer::{Local, TraceWriter};
use shardproof_case::{rank_pieces, Case, Layout, RankPiece};
use shardproof_interp::{run_graph, run_program, Env, Precision, RunConfig};
use shardproof_ir::ValueId;
use shardproof_ops::{Meta, Tensor};
use std::collections::BTreeMap;
use std::path::Path;

/// Why a case cannot be emitted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EmitError {
    /// The case or the output directory is invalid (exit 2).
    Invalid(String),
    /// The emitter cannot represent the case soundly (exit 3).
    Unsupported(String),
}

impl std::fmt::Display for EmitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EmitError::Invalid(m) | EmitError::Unsupported(m) => f.write_str(m),
        }
    }
}

impl From<TraceError> for EmitError {
    fn from(e: TraceError) -> EmitError {
        EmitError::Invalid(format!("error: {e}"))
    }
}

/// Settings of an emission.
#[derive(Clone, Debug, PartialEq)]
pub struct EmitOptions {
    /// The runs' dtype: float32, bfloat16 or float64.
    pub dtype: RunDtype,
    /// The seed of the inputs.
    pub seed: u64,
    /// Perturbed reference runs.
    pub perturbed: u64,
}

impl Default for EmitOptions {
    fn default() -> EmitOptions {
        EmitOptions {
            dtype: RunDtype::Float32,
            seed: 0,
            perturbed: 2,
        }
    }
}

/// What was emitted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Emitted {
    /// Tensors recorded per run.
    pub tensors: usize,
    /// Ranks of the candidate.
    pub ranks: usize,
}

/// A recorded tensor: its id and the spec value and rank values it is.
struct Recorded {
    id: CanonicalId,
    spec_value: ValueId,
    layout: Layout,
    rank_values: Vec<(usize, ValueId)>,
}

/// splitmix64.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A value in [-1, 1) from a seed, a name and an element index.
fn uniform(seed: u64, name: &str, element: u64) -> f64 {
    let h = name.bytes().fold(mix(seed), |h, b| mix(h ^ u64::from(b)));
    (mix(h ^ mix(element)) >> 11) as f64 / (1u64 << 52) as f64 - 1.0
}

fn precision(dtype: RunDtype) -> Result<Precision, EmitError> {
    match dtype {
        RunDtype::Float32 => Ok(Precision::F32),
        RunDtype::Bfloat16 => Ok(Precision::Bf16),
        RunDtype::Float64 => Ok(Precision::F64),
        other => Err(EmitError::Unsupported(format!(
            "inconclusive: the interpreter does not run in {other}\n  hint: --dtype float32, bfloat16 or float64"
        ))),
    }
}

/// The pieces of a rank's tensor: one per block, concatenated along the layout's dim.
fn pieces(piece: &RankPiece) -> Vec<Piece> {
    let mut offset = 0u64;
    piece
        .blocks
        .iter()
        .map(|block| {
            let full = Region(
                block
                    .iter()
                    .map(|r| [r.start as u64, r.end as u64])
                    .collect(),
            );
            let mut local = Region(full.extents().iter().map(|&n| [0, n]).collect());
            if let Some(d) = local.0.get_mut(piece.dim) {
                *d = [offset, offset + d[1]];
                offset = d[1];
            }
            Piece { local, full }
        })
        .collect()
}

/// Emits the reference (with `options.perturbed` perturbed runs) in `dir/ref` and the
/// candidate in `dir/cand`.
pub fn emit_case(case: &Case, dir: &Path, options: &EmitOptions) -> Result<Emitted, EmitError> {
    // Stale runs (an earlier emission's perturbed-K/) would be read as this one's.
    for sub in ["ref", "cand"] {
        let d = dir.join(sub);
        if std::fs::read_dir(&d).is_ok_and(|mut e| e.next().is_some()) {
            return Err(EmitError::Invalid(format!(
                "error: `{}` exists and is not empty\n  hint: emit into a new directory (or delete it first)",
                d.display()
            )));
        }
    }
    let cfg = RunConfig {
        precision: precision(options.dtype)?,
        seed: options.seed,
        ..RunConfig::default()
    };
    let metas = shardproof_interp::infer_graph(&case.spec, &case.ops).metas;
    let meta_of = |v: ValueId, name: &str| {
        metas[v.node][v.output].clone().ok_or_else(|| {
            EmitError::Invalid(format!(
                "error: the shape of spec tensor `{name}` is unknown (symbolic or not inferable)"
            ))
        })
    };
    let input_names: Vec<&str> = case.inputs.iter().map(|i| i.spec_name.as_str()).collect();
    let mut recorded = Vec::new();
    for rel in &case.inputs {
        recorded.push(Recorded {
            id: CanonicalId::new(0, 0, Kind::ForwardInput, &rel.spec_name, 0),
            spec_value: rel.spec_value,
            layout: rel.layout.clone(),
            rank_values: rel.rank_values.clone(),
        });
    }
    for out in &case.outputs {
        let id = match out
            .spec_name
            .strip_suffix("_new")
            .filter(|p| input_names.contains(p))
        {
            Some(param) => CanonicalId::new(0, 0, Kind::ParamAfterStep, param, 0),
            None => CanonicalId::new(0, 0, Kind::ForwardOutput, &out.spec_name, 0),
        };
        recorded.push(Recorded {
            id,
            spec_value: out.spec_value,
            layout: out.layout.clone(),
            rank_values: out.rank_values.clone(),
        });
    }
    let mesh = &case.program.mesh;
    // Every recorded tensor's per-rank pieces, refusing what a trace cannot say.
    let mut laid_out: Vec<Vec<(usize, ValueId, RankPiece)>> = Vec::new();
    for (rec, name) in recorded.iter().zip(
        case.inputs
            .iter()
            .map(|i| &i.spec_name)
            .chain(case.outputs.iter().map(|o| &o.spec_name)),
    ) {
        if let Layout::Expr(_) = rec.layout {
            return Err(EmitError::Unsupported(format!(
                "inconclusive: `{name}` is laid out by an `expr:`, which has no per-rank pieces\n  hint: write its layout as a placement"
            )));
        }
        let meta = meta_of(rec.spec_value, name)?;
        let shape: Vec<i64> = meta.shape.iter().map(|&d| d as i64).collect();
        let mut ranks = Vec::new();
        for &(r, v) in &rec.rank_values {
            let piece = rank_pieces(&rec.layout, &shape, mesh, r)
                .map_err(|e| EmitError::Invalid(format!("error: `{name}`: {e}")))?;
            if piece.partial.is_some() {
                return Err(EmitError::Unsupported(format!(
                    "inconclusive: `{name}` is a partial (unreduced) value on rank {r}: a trace holds values, not shares\n  hint: trace the value after its reduction"
                )));
            }
            ranks.push((r, v, piece));
        }
        laid_out.push(ranks);
    }
    // The inputs: seeded uniform values, floats only.
    let mut spec_leaves = BTreeMap::new();
    for rel in &case.inputs {
        let meta = meta_of(rel.spec_value, &rel.spec_name)?;
        if !meta.dtype.is_float() {
            return Err(EmitError::Unsupported(format!(
                "inconclusive: input `{}` is {:?}; trace emit draws float inputs only",
                rel.spec_name, meta.dtype
            )));
        }
        let n = meta.numel() as u64;
        let data = (0..n)
            .map(|e| uniform(options.seed, &rel.spec_name, e))
            .collect();
        spec_leaves.insert(rel.spec_name.clone(), Tensor::new(meta, data));
    }
    let run_spec = |leaves: &BTreeMap<String, Tensor>| {
        run_graph(&case.spec, leaves, &cfg)
            .map_err(|e| EmitError::Invalid(format!("error: the spec run failed: {}", e.message)))
    };
    let spec_name = |k: usize| -> &str {
        let n = case.inputs.len();
        if k < n {
            &case.inputs[k].spec_name
        } else {
            &case.outputs[k - n].spec_name
        }
    };
    let value = |env: &Env, k: usize, v: ValueId, what: &str| -> Result<Tensor, EmitError> {
        env.get(v).cloned().ok_or_else(|| {
            EmitError::Unsupported(format!(
                "inconclusive: the {what} run did not compute `{}` (a value no input provides)",
                spec_name(k)
            ))
        })
    };
    let whole_piece = |t: &Tensor| {
        let shape: Vec<u64> = t.shape().iter().map(|&d| d as u64).collect();
        (
            shape.clone(),
            vec![Piece {
                local: Region::whole(&shape),
                full: Region::whole(&shape),
            }],
        )
    };
    // The reference and its perturbed runs: one rank holding every tensor whole.
    let write_single = |sub: &Path,
                        role: Role,
                        leaves: &BTreeMap<String, Tensor>,
                        perturbation: Option<Perturbation>|
     -> Result<(), EmitError> {
        let env = run_spec(leaves)?;
        let mut meta = TraceMeta::new(role, 1, options.dtype);
        meta.perturbation = perturbation;
        let w = TraceWriter::create(sub, meta)?;
        let mut rank = w.rank(0, Coords::default())?;
        for (k, rec) in recorded.iter().enumerate() {
            let t = value(&env, k, rec.spec_value, "spec")?;
            let (shape, pieces) = whole_piece(&t);
            rank.record(
                rec.id.clone(),
                None,
                &shape,
                Local {
                    shape: &shape,
                    pieces,
                },
                &t.data,
            )?;
        }
        rank.finish()?;
        Ok(())
    };
    let reference = dir.join("ref");
    write_single(&reference, Role::Reference, &spec_leaves, None)?;
    let eps = options.dtype.epsilon();
    for k in 0..options.perturbed {
        let seed = mix(options.seed ^ (k + 1));
        let perturbed: BTreeMap<String, Tensor> = spec_leaves
            .iter()
            .map(|(name, t)| {
                let data = t
                    .data
                    .iter()
                    .enumerate()
                    .map(|(e, x)| x * (1.0 + eps * uniform(seed, name, e as u64)))
                    .collect();
                (name.clone(), Tensor::new(t.meta.clone(), data))
            })
            .collect();
        let p = Some(Perturbation {
            seed,
            relative_scale: eps,
        });
        write_single(
            &reference.join(format!("perturbed-{k}")),
            Role::Perturbed,
            &perturbed,
            p,
        )?;
    }
    // The candidate: each rank's inputs cut from the same values, then the ranks' run.
    let world = case.program.ranks.len();
    let mut rank_leaves = vec![BTreeMap::new(); world];
    for (k, rel) in case.inputs.iter().enumerate() {
        let full = &spec_leaves[&rel.spec_name];
        let shape: Vec<u64> = full.shape().iter().map(|&d| d as u64).collect();
        for (r, v, piece) in &laid_out[k] {
            let graph = &case.program.ranks[*r];
            let dtype = graph.recorded_type(*v).map_or(full.dtype(), |t| t.dtype);
            let local_pieces = pieces(piece);
            let local_shape: Vec<usize> = piece.local_shape().iter().map(|&d| d as usize).collect();
            let mut data = vec![0.0; local_shape.iter().product()];
            let strides =
                crate::writer::strides(&local_shape.iter().map(|&d| d as u64).collect::<Vec<_>>());
            for p in &local_pieces {
                let values = crate::writer::extract(&full.data, &shape, &p.full);
                // Row-major walk of the local box.
                let ext = p.local.extents();
                for (i, x) in values.into_iter().enumerate() {
                    let (mut rem, mut offset) = (i as u64, 0u64);
                    for d in (0..ext.len()).rev() {
                        offset += (p.local.0[d][0] + rem % ext[d]) * strides[d];
                        rem /= ext[d];
                    }
                    data[offset as usize] = x;
                }
            }
            rank_leaves[*r].insert(
                graph.value_name(*v).to_string(),
                Tensor::new(Meta::new(dtype, local_shape), data),
            );
        }
    }
    let envs = run_program(&case.program, &rank_leaves, &cfg)
        .map_err(|e| EmitError::Invalid(format!("error: the ranks' run failed: {}", e.message)))?;
    let mut meta = TraceMeta::new(Role::Candidate, world as u64, options.dtype);
    // The mesh dims named as the trace's parallel degrees; others (e.g. `sp`) stay unnamed.
    let degree = |name: &str| mesh.dim_index(name).map(|d| (d, mesh.dims[d].1 as u64));
    let p = &mut meta.parallel;
    for (name, slot) in [
        ("tp", &mut p.tp),
        ("dp", &mut p.dp),
        ("pp", &mut p.pp),
        ("cp", &mut p.cp),
        ("ep", &mut p.ep),
    ] {
        if let Some((_, size)) = degree(name) {
            *slot = size;
        }
    }
    let coords = |r: usize| {
        let at = mesh.coords(r);
        let c = |name: &str| degree(name).map_or(0, |(d, _)| at[d] as u64);
        Coords {
            pp: c("pp"),
            dp: c("dp"),
            cp: c("cp"),
            tp: c("tp"),
            ep: c("ep"),
        }
    };
    let w = TraceWriter::create(&dir.join("cand"), meta)?;
    for (r, env) in envs.iter().enumerate() {
        let mut rank = w.rank(r as u64, coords(r))?;
        for (k, rec) in recorded.iter().enumerate() {
            let Some((_, v, piece)) = laid_out[k].iter().find(|(pr, _, _)| *pr == r) else {
                continue;
            };
            let t = value(env, k, *v, &format!("rank {r}"))?;
            let full_shape: Vec<u64> = meta_of(rec.spec_value, spec_name(k))?
                .shape
                .iter()
                .map(|&d| d as u64)
                .collect();
            let local_shape: Vec<u64> = t.shape().iter().map(|&d| d as u64).collect();
            let expected: Vec<u64> = piece.local_shape().iter().map(|&d| d as u64).collect();
            if local_shape != expected {
                return Err(EmitError::Invalid(format!(
                    "error: rank {r} holds `{}` with shape {local_shape:?}, but its layout gives {expected:?}",
                    spec_name(k)
                )));
            }
            rank.record(
                rec.id.clone(),
                None,
                &full_shape,
                Local {
                    shape: &local_shape,
                    pieces: pieces(piece),
                },
                &t.data,
            )?;
        }
        rank.finish()?;
    }
    Ok(Emitted {
        tensors: recorded.len(),
        ranks: world,
    })
}
