//! Traces of the interpreter's runs of a case (item 6 of issue 46): the spec run is the
//! reference (plus perturbed reruns with its float inputs perturbed at the dtype's machine
//! epsilon), the ranks' run is the candidate, so `trace compare` judges a case with
//! perturbation tolerances.
//!
//! Recorded: the case's float inputs (`forward_input`), the output of every module region
//! the graphs annotate (`forward_output`, or in a backward region `grad_input`; see
//! [`crate::modules`]), and the case's output expectations (`forward_output`; an output named
//! `NAME_new` whose `NAME` is an input is that parameter's `param_after_step`). The pieces of
//! declared tensors come from the case's layouts ([`shardproof_case::rank_pieces`]), those of
//! module outputs from [`crate::modules::place`]. Integer and boolean inputs (token ids,
//! labels) are drawn below the bound their consumers allow, fed identically to both runs and
//! not recorded (a trace stores floats). Anything the emitter cannot represent soundly is
//! refused, never approximated: `expr:` inputs, partial (unreduced) layouts, values the run
//! did not compute. A module output that cannot be placed on some rank is left out of every
//! run (and counted), so it can neither hide nor invent a divergence.

use crate::error::TraceError;
use crate::format::{
    CanonicalId, Coords, Kind, Perturbation, Piece, Region, Role, RunDtype, TraceMeta,
};
use crate::modules::{module_outputs, place, ModuleOutput};
use crate::perturb::{output_id, perturb, run_seed, uniform};
use crate::writer::{Local, TraceWriter};
use shardproof_case::{rank_pieces, Case, Layout, RankPiece};
use shardproof_interp::{run_graph, run_program, Env, InterpErrorKind, Precision, RunConfig};
use shardproof_ir::{DType, ValueId};
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
    /// The ranks' run cannot complete: their communication deadlocks or does not match up
    /// (exit 1, as `run` says).
    Violated(String),
}

impl std::fmt::Display for EmitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EmitError::Invalid(m) | EmitError::Unsupported(m) | EmitError::Violated(m) => {
                f.write_str(m)
            }
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
    /// Of them, module outputs (from the graphs' module annotations).
    pub modules: usize,
    /// Module outputs left out: some rank's copy fits no even split of the spec's tensor, the
    /// ranks run the module a different number of times than the spec (or not at all), or a
    /// backward region under data parallelism (the gradient of the rank's local loss).
    pub unplaced: usize,
    /// Ranks of the candidate.
    pub ranks: usize,
}

/// One occurrence of a recorded tensor on a rank: the value, its pieces (in the value's own
/// coordinates), and the local shape its layout requires (declared tensors only).
struct Occurrence {
    value: ValueId,
    pieces: Vec<Piece>,
    expected: Option<Vec<u64>>,
}

/// A recorded tensor: its id, the spec value it is, and what each rank holds of it.
struct Recorded {
    id: CanonicalId,
    name: String,
    spec_value: ValueId,
    ranks: Vec<(usize, Vec<Occurrence>)>,
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
            Piece::boxed(local, full)
        })
        .collect()
}

/// A tensor's shape as trace dims.
fn dims(t: &Tensor) -> Vec<u64> {
    t.shape().iter().map(|&d| d as u64).collect()
}

/// Seeded spec inputs: floats uniform in [-1, 1), integers uniform below the bound their
/// consumers allow (an embedding's rows, a loss's classes), booleans fair coins.
fn spec_inputs(
    case: &Case,
    metas: &[Vec<Option<Meta>>],
    seed: u64,
) -> Result<BTreeMap<String, Tensor>, EmitError> {
    let mut leaves = BTreeMap::new();
    for rel in &case.inputs {
        let v = rel.spec_value;
        let meta = metas[v.node][v.output].clone().ok_or_else(|| {
            EmitError::Invalid(format!(
                "error: the shape of spec tensor `{}` is unknown (symbolic or not inferable)",
                rel.spec_name
            ))
        })?;
        let n = meta.numel() as u64;
        let draw = |e: u64| uniform(seed, &rel.spec_name, e);
        let data: Vec<f64> = match meta.dtype {
            d if d.is_float() => (0..n).map(draw).collect(),
            DType::Bool => (0..n)
                .map(|e| f64::from(u8::from(draw(e) >= 0.0)))
                .collect(),
            _ => {
                let bound = shardproof_interp::index_bound(&case.spec, v, metas).max(1) as f64;
                (0..n)
                    .map(|e| ((draw(e) + 1.0) / 2.0 * bound).floor().min(bound - 1.0))
                    .collect()
            }
        };
        leaves.insert(rel.spec_name.clone(), Tensor::new(meta, data));
    }
    Ok(leaves)
}

/// The records of the graphs' module outputs, in the spec's order, and how many were left
/// out. The spec's `k`-th run of a module is microbatch `k` when every rank runs it as often;
/// a spec that runs it once takes every rank's runs as pieces of its one tensor (microbatches
/// and data-parallel ranks hold slices of the spec's batch).
fn module_records(
    case: &Case,
    spec_env: &Env,
    envs: &[Env],
) -> Result<(Vec<Recorded>, usize), EmitError> {
    let spec_modules =
        module_outputs(&case.spec).map_err(|e| EmitError::Invalid(format!("error: {e}")))?;
    let rank_modules = case
        .program
        .ranks
        .iter()
        .map(|g| module_outputs(g))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| EmitError::Invalid(format!("error: {e}")))?;
    let key = |m: &ModuleOutput| (m.module.clone(), m.backward);
    let mut order: Vec<(String, bool)> = Vec::new();
    for m in &spec_modules {
        if !order.contains(&key(m)) {
            order.push(key(m));
        }
    }
    // Under data parallelism a rank's backward starts from the gradient of its local loss,
    // which the gradients' averaging over the data group scales back only at the parameters:
    // its module input gradients are the spec's times that group's size (and the zoo's
    // loss-scaling conventions), so they are left out rather than guessed.
    let mesh = &case.program.mesh;
    let data_parallel = ["dp", "cp", "ep"]
        .iter()
        .any(|d| mesh.dim_index(d).is_some_and(|i| mesh.dims[i].1 > 1));
    let (mut records, mut unplaced) = (Vec::new(), 0);
    for k in order {
        let spec_runs: Vec<ValueId> = spec_modules
            .iter()
            .filter(|m| key(m) == k)
            .map(|m| m.value)
            .collect();
        let rank_runs: Vec<(usize, Vec<ValueId>)> = rank_modules
            .iter()
            .enumerate()
            .map(|(r, ms)| {
                (
                    r,
                    ms.iter()
                        .filter(|m| key(m) == k)
                        .map(|m| m.value)
                        .collect::<Vec<_>>(),
                )
            })
            .filter(|(_, vs)| !vs.is_empty())
            .collect();
        if rank_runs.is_empty() || (k.1 && data_parallel) {
            unplaced += spec_runs.len();
            continue;
        }
        // Per spec run: each rank's runs that are pieces of it.
        let groups: Vec<Vec<(usize, Vec<ValueId>)>> = if spec_runs.len() == 1 {
            vec![rank_runs]
        } else if rank_runs.iter().all(|(_, vs)| vs.len() == spec_runs.len()) {
            (0..spec_runs.len())
                .map(|j| rank_runs.iter().map(|(r, vs)| (*r, vec![vs[j]])).collect())
                .collect()
        } else {
            unplaced += spec_runs.len();
            continue;
        };
        'run: for (j, (spec_value, group)) in spec_runs.iter().zip(groups).enumerate() {
            let Some(full) = spec_env.get(*spec_value).filter(|t| t.dtype().is_float()) else {
                unplaced += 1;
                continue;
            };
            let mut ranks = Vec::new();
            for (r, values) in group {
                let mut occurrences = Vec::new();
                for v in values {
                    let Some(local) = envs[r].get(v) else {
                        unplaced += 1;
                        continue 'run;
                    };
                    let Some(pieces) = place(&local.data, &dims(local), &full.data, &dims(full))
                    else {
                        unplaced += 1;
                        continue 'run;
                    };
                    occurrences.push((
                        local.shape().to_vec(),
                        Occurrence {
                            value: v,
                            pieces,
                            expected: None,
                        },
                    ));
                }
                // Several runs on one rank are stacked along dim 0: they need one shape.
                if occurrences.len() > 1
                    && (occurrences[0].0.is_empty()
                        || occurrences.iter().any(|o| o.0 != occurrences[0].0))
                {
                    unplaced += 1;
                    continue 'run;
                }
                ranks.push((r, occurrences.into_iter().map(|o| o.1).collect()));
            }
            let kind = if k.1 {
                Kind::GradInput
            } else {
                Kind::ForwardOutput
            };
            records.push(Recorded {
                id: CanonicalId::new(0, j as u64, kind, &k.0, 0),
                name: k.0.clone(),
                spec_value: *spec_value,
                ranks,
            });
        }
    }
    Ok((records, unplaced))
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
        custom_ops: case.ops.clone(),
        ..RunConfig::default()
    };
    let metas = shardproof_interp::infer_graph(&case.spec, &case.ops).metas;
    let mesh = &case.program.mesh;
    // Every declared tensor's per-rank pieces, refusing what a trace cannot say.
    let declared = case
        .inputs
        .iter()
        .map(|i| (&i.spec_name, i.spec_value, &i.layout, &i.rank_values))
        .chain(
            case.outputs
                .iter()
                .map(|o| (&o.spec_name, o.spec_value, &o.layout, &o.rank_values)),
        );
    let mut laid_out: Vec<Vec<(usize, ValueId, RankPiece)>> = Vec::new();
    for (name, spec_value, layout, rank_values) in declared {
        if let Layout::Expr(_) = layout {
            return Err(EmitError::Unsupported(format!(
                "inconclusive: `{name}` is laid out by an `expr:`, which has no per-rank pieces\n  hint: write its layout as a placement"
            )));
        }
        let meta = metas[spec_value.node][spec_value.output]
            .clone()
            .ok_or_else(|| {
                EmitError::Invalid(format!(
                "error: the shape of spec tensor `{name}` is unknown (symbolic or not inferable)"
            ))
            })?;
        let shape: Vec<i64> = meta.shape.iter().map(|&d| d as i64).collect();
        let mut ranks = Vec::new();
        for &(r, v) in rank_values {
            let piece = rank_pieces(layout, &shape, mesh, r)
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
    let spec_leaves = spec_inputs(case, &metas, options.seed)?;
    let run_spec = |leaves: &BTreeMap<String, Tensor>| {
        run_graph(&case.spec, leaves, &cfg).map_err(|e| match e.kind {
            InterpErrorKind::Unsupported => {
                EmitError::Unsupported(format!("inconclusive: the spec run: {}", e.message))
            }
            _ => EmitError::Invalid(format!("error: the spec run failed: {}", e.message)),
        })
    };
    // The candidate's inputs: each rank's cut from the same values.
    let world = case.program.ranks.len();
    let mut rank_leaves = vec![BTreeMap::new(); world];
    for (k, rel) in case.inputs.iter().enumerate() {
        let full = &spec_leaves[&rel.spec_name];
        let shape = dims(full);
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
    let spec_env = run_spec(&spec_leaves)?;
    let envs = run_program(&case.program, &rank_leaves, &cfg).map_err(|e| match e.kind {
        InterpErrorKind::Deadlock => {
            EmitError::Violated(format!("violated: the ranks' run: {}", e.message))
        }
        InterpErrorKind::Unsupported => {
            EmitError::Unsupported(format!("inconclusive: the ranks' run: {}", e.message))
        }
        InterpErrorKind::Invalid => {
            EmitError::Invalid(format!("error: the ranks' run failed: {}", e.message))
        }
    })?;

    // What is recorded, in execution order: the float inputs, the module outputs, the outputs.
    let declared_record = |k: usize, id: CanonicalId, name: &str, spec_value: ValueId| Recorded {
        id,
        name: name.to_string(),
        spec_value,
        ranks: laid_out[k]
            .iter()
            .map(|(r, v, piece)| {
                let occurrence = Occurrence {
                    value: *v,
                    pieces: pieces(piece),
                    expected: Some(piece.local_shape().iter().map(|&d| d as u64).collect()),
                };
                (*r, vec![occurrence])
            })
            .collect(),
    };
    let mut recorded = Vec::new();
    for (k, rel) in case.inputs.iter().enumerate() {
        if spec_leaves[&rel.spec_name].dtype().is_float() {
            let id = CanonicalId::new(0, 0, Kind::ForwardInput, &rel.spec_name, 0);
            recorded.push(declared_record(k, id, &rel.spec_name, rel.spec_value));
        }
    }
    let (modules, unplaced) = module_records(case, &spec_env, &envs)?;
    let module_count = modules.len();
    recorded.extend(modules);
    for (k, out) in case.outputs.iter().enumerate() {
        let id = output_id(case, &out.spec_name);
        recorded.push(declared_record(
            case.inputs.len() + k,
            id,
            &out.spec_name,
            out.spec_value,
        ));
    }

    let value = |env: &Env, rec: &Recorded, v: ValueId, what: &str| -> Result<Tensor, EmitError> {
        env.get(v).cloned().ok_or_else(|| {
            EmitError::Unsupported(format!(
                "inconclusive: the {what} run did not compute `{}` (a value no input provides)",
                rec.name
            ))
        })
    };
    // The reference and its perturbed runs: one rank holding every tensor whole.
    let write_single = |sub: &Path,
                        role: Role,
                        env: &Env,
                        perturbation: Option<Perturbation>|
     -> Result<(), EmitError> {
        let mut meta = TraceMeta::new(role, 1, options.dtype);
        meta.perturbation = perturbation;
        let w = TraceWriter::create(sub, meta)?;
        let mut rank = w.rank(0, Coords::default())?;
        for rec in &recorded {
            let t = value(env, rec, rec.spec_value, "spec")?;
            let shape = dims(&t);
            let whole = vec![Piece::boxed(Region::whole(&shape), Region::whole(&shape))];
            rank.record(
                rec.id.clone(),
                None,
                &shape,
                Local {
                    shape: &shape,
                    pieces: whole,
                },
                &t.data,
            )?;
        }
        rank.finish()?;
        Ok(())
    };
    let reference = dir.join("ref");
    write_single(&reference, Role::Reference, &spec_env, None)?;
    let eps = options.dtype.precision();
    for k in 0..options.perturbed {
        let seed = run_seed(options.seed, k);
        // Only float inputs are perturbed: token ids and masks are exact in every run.
        let perturbed = perturb(&spec_leaves, eps, seed);
        let p = Some(Perturbation {
            seed,
            relative_scale: eps,
        });
        write_single(
            &reference.join(format!("perturbed-{k}")),
            Role::Perturbed,
            &run_spec(&perturbed)?,
            p,
        )?;
    }
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
        for rec in &recorded {
            let Some((_, occurrences)) = rec.ranks.iter().find(|(pr, _)| *pr == r) else {
                continue;
            };
            let full_shape = dims(&value(&spec_env, rec, rec.spec_value, "spec")?);
            // The rank's runs of the tensor, stacked along dim 0 (module_records checked that
            // several runs share one shape).
            let (mut data, mut all_pieces, mut local_shape) = (Vec::new(), Vec::new(), Vec::new());
            for o in occurrences {
                let t = value(env, rec, o.value, &format!("rank {r}"))?;
                let shape = dims(&t);
                if let Some(expected) = o.expected.as_ref().filter(|e| **e != shape) {
                    return Err(EmitError::Invalid(format!(
                        "error: rank {r} holds `{}` with shape {shape:?}, but its layout gives {expected:?}",
                        rec.name
                    )));
                }
                let offset = local_shape.first().copied().unwrap_or(0);
                for p in &o.pieces {
                    let mut local = p.local.clone();
                    if let Some(d0) = local.0.first_mut() {
                        *d0 = [d0[0] + offset, d0[1] + offset];
                    }
                    all_pieces.push(Piece::boxed(local, p.full.clone()));
                }
                match local_shape.first_mut() {
                    Some(rows) => *rows += shape[0],
                    None => local_shape = shape,
                }
                data.extend_from_slice(&t.data);
            }
            rank.record(
                rec.id.clone(),
                None,
                &full_shape,
                Local {
                    shape: &local_shape,
                    pieces: all_pieces,
                },
                &data,
            )?;
        }
        rank.finish()?;
    }
    Ok(Emitted {
        tensors: recorded.len(),
        modules: module_count,
        unplaced,
        ranks: world,
    })
}
