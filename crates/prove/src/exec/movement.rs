//! Pure data movement by the registry's own kernels: each moved input becomes an f64 tensor
//! whose values are element indices (input k's element i holds `base_k + i`, exact in f64 far
//! below 2^53); the kernel's output says, element by element, which input element it is. So
//! views, slices, concatenations, permutations and gathers with constant indices follow the
//! reference semantics exactly, with no second implementation to drift from it.

use super::{constant_values, ExecError, MetaValues, NodeCtx};
use crate::expr::ExprId;
use crate::tensor::SymTensor;
use shardproof_ir::{Arg, DType, ValueId};
use shardproof_ops::{EvalCtx, Meta, Registry, Tensor, Values};
use std::collections::HashMap;

/// Operators that only move data, and the names of their arguments that are indices (which
/// must be constant) rather than data.
pub(crate) fn movement_index_args(base: &str) -> Option<&'static [&'static str]> {
    Some(match base {
        "aten.view"
        | "aten._unsafe_view"
        | "aten.reshape"
        | "aten.view_copy"
        | "aten.permute"
        | "aten.permute_copy"
        | "aten.transpose"
        | "aten.transpose_copy"
        | "aten.t"
        | "aten.t_copy"
        | "aten.slice"
        | "aten.slice_copy"
        | "aten.select"
        | "aten.select_copy"
        | "aten.expand"
        | "aten.expand_copy"
        | "aten.squeeze"
        | "aten.squeeze_copy"
        | "aten.unsqueeze"
        | "aten.unsqueeze_copy"
        | "aten.flatten"
        | "aten.unflatten"
        | "aten.clone"
        | "aten.contiguous"
        | "aten.alias"
        | "aten.alias_copy"
        | "aten.detach"
        | "aten.detach_copy"
        | "aten.detach_"
        | "aten.lift"
        | "aten.lift_fresh"
        | "aten.lift_fresh_copy"
        | "aten.split"
        | "aten.split_with_sizes"
        | "aten.chunk"
        | "aten.unbind"
        | "aten.narrow"
        | "aten.repeat"
        | "aten.flip"
        | "aten.roll"
        | "aten.diagonal"
        | "aten.cat"
        | "aten.stack"
        | "aten.as_strided"
        | "aten.unfold"
        | "aten.broadcast_tensors"
        | "aten.copy" => &[],
        "aten.index_select" | "aten.gather" => &["index"],
        "aten.index" | "aten._unsafe_index" => &["indices"],
        "aten.embedding" => &["indices"],
        _ => return None,
    })
}

/// Concrete tensors by value: what the kernel reads.
struct Concrete<'a> {
    metas: MetaValues<'a>,
    tensors: HashMap<ValueId, Tensor>,
}

impl Values for Concrete<'_> {
    fn meta(&self, v: ValueId) -> Option<Meta> {
        self.tensors
            .get(&v)
            .map(|t| t.meta.clone())
            .or_else(|| self.metas.meta(v))
    }
    fn tensor(&self, v: ValueId) -> Option<&Tensor> {
        self.tensors.get(&v)
    }
}

/// Where the encoded elements come from.
pub(crate) struct Encoding {
    /// (base, elements) per encoded input, in increasing base order.
    sources: Vec<(usize, std::sync::Arc<Vec<ExprId>>)>,
    next: usize,
}

impl Encoding {
    pub(crate) fn new() -> Self {
        Encoding {
            sources: Vec::new(),
            next: 0,
        }
    }

    /// `t` as an f64 tensor of element indices.
    pub(crate) fn encode(&mut self, t: &SymTensor) -> Tensor {
        let base = self.next;
        self.next += t.numel();
        self.sources.push((base, t.elems.clone()));
        let data = (base..base + t.numel()).map(|i| i as f64).collect();
        Tensor::new(Meta::new(DType::F64, t.shape.clone()), data)
    }

    /// The expressions a kernel output of encoded indices stands for.
    pub(crate) fn decode(&self, out: &Tensor) -> Result<Vec<ExprId>, String> {
        out.data.iter().map(|&x| self.decode_one(x)).collect()
    }

    /// The expression the encoded index `x` stands for.
    fn decode_one(&self, x: f64) -> Result<ExprId, String> {
        if x < 0.0 || x.fract() != 0.0 || x >= self.next as f64 {
            return Err(format!(
                "the kernel produced {x}, which is no input element"
            ));
        }
        let i = x as usize;
        let k = self.sources.partition_point(|(b, _)| *b <= i) - 1;
        let (b, elems) = &self.sources[k];
        Ok(elems[i - b])
    }
}

/// Runs a data-movement operator through its kernel on encoded inputs.
pub(crate) fn run(ctx: &mut NodeCtx, index_args: &[&str]) -> Result<Vec<SymTensor>, ExecError> {
    // `copy` casts `src` to `self`'s type; the kernel below runs on `f64` indices and would
    // keep `src`'s elements as they are (0.5 copied into an `int64` is 0).
    if ctx.def.name.base() == "aten.copy" {
        let out = ctx.out_meta(0)?.dtype;
        let src = ctx.tensor("src")?;
        if src.dtype != out && !out.is_float() {
            return Err(ctx.unsupported(format!(
                "a copy of {:?} into {out:?} casts its elements",
                src.dtype
            )));
        }
    }
    let mut index_values = Vec::new();
    for name in index_args {
        if let Some(a) = ctx.arg(name) {
            a.values(&mut index_values);
        }
    }
    let mut enc = Encoding::new();
    let mut concrete = HashMap::new();
    for v in ctx.node.inputs() {
        if concrete.contains_key(&v) {
            continue;
        }
        let t = ctx.env[v.node][v.output]
            .clone()
            .ok_or_else(|| ctx.unsupported("an input has no value"))?;
        let tensor = if index_values.contains(&v) {
            if ctx.def.name.name == "gather" && constant_values(ctx.arena, &t).is_none() {
                return super::rules::symbolic_gather(ctx);
            }
            let values = constant_values(ctx.arena, &t).ok_or_else(|| {
                ctx.unsupported(format!(
                    "index tensor `{}` is not constant (symbolic indices have no rule here)",
                    ctx.graph.value_name(v)
                ))
            })?;
            Tensor::new(Meta::new(t.dtype, t.shape.clone()), values)
        } else {
            enc.encode(&t)
        };
        concrete.insert(v, tensor);
    }
    let values = Concrete {
        metas: MetaValues(ctx.metas),
        tensors: concrete,
    };
    let mut ectx = EvalCtx {
        seed: 0,
        call_key: ctx.node.name.clone(),
    };
    let outs = Registry::builtin()
        .eval(ctx.def, ctx.node.args(), kwargs(ctx), &values, &mut ectx)
        .map_err(|e| ExecError::invalid(format!("{}: {e}", ctx.location())))?;
    outs.iter()
        .enumerate()
        .map(|(i, t)| {
            let elems = enc.decode(t).map_err(|e| ctx.unsupported(e))?;
            let dtype = ctx.out_meta(i).map(|m| m.dtype).unwrap_or(t.dtype());
            Ok(SymTensor::new(dtype, t.shape().to_vec(), elems))
        })
        .collect()
}

/// Runs the operator's kernel on the given concrete inputs.
fn eval_kernel(ctx: &NodeCtx, tensors: HashMap<ValueId, Tensor>) -> Result<Vec<Tensor>, ExecError> {
    let values = Concrete {
        metas: MetaValues(ctx.metas),
        tensors,
    };
    let mut ectx = EvalCtx {
        seed: 0,
        call_key: ctx.node.name.clone(),
    };
    Registry::builtin()
        .eval(ctx.def, ctx.node.args(), kwargs(ctx), &values, &mut ectx)
        .map_err(|e| ExecError::invalid(format!("{}: {e}", ctx.location())))
}

/// Data movement that also fills with a constant (`constant_pad_nd`, `pad` in any mode): the
/// kernel runs twice, on the inputs' element indices and on the same indices plus one. An
/// output element the kernel took from an input differs by exactly one between the runs; one
/// it filled holds the same fill value in both, and becomes that constant. Anything else (a
/// NaN fill compares unequal to itself) is unsupported, never guessed.
pub(crate) fn run_with_fill(ctx: &mut NodeCtx) -> Result<Vec<SymTensor>, ExecError> {
    let mut enc = Encoding::new();
    let (mut first, mut second) = (HashMap::new(), HashMap::new());
    for v in ctx.node.inputs() {
        if first.contains_key(&v) {
            continue;
        }
        let t = ctx.env[v.node][v.output]
            .clone()
            .ok_or_else(|| ctx.unsupported("an input has no value"))?;
        let a = enc.encode(&t);
        let b = Tensor::new(a.meta.clone(), a.data.iter().map(|x| x + 1.0).collect());
        first.insert(v, a);
        second.insert(v, b);
    }
    let (outs, shifted) = (eval_kernel(ctx, first)?, eval_kernel(ctx, second)?);
    let mut result = Vec::with_capacity(outs.len());
    for (i, (a, b)) in outs.iter().zip(&shifted).enumerate() {
        let mut elems = Vec::with_capacity(a.data.len());
        // The kernel ran on `f64` indices; on the real type it casts its fill (2.5 padding an
        // `int64` is 2).
        let real = ctx.out_meta(i).map(|m| m.dtype).unwrap_or(a.dtype());
        for (&x, &y) in a.data.iter().zip(b.data.iter()) {
            let e = if x == y {
                ctx.arena.float(shardproof_ops::cast_value(x, real))?
            } else if y == x + 1.0 {
                enc.decode_one(x).map_err(|e| ctx.unsupported(e))?
            } else {
                return Err(ctx.unsupported(format!(
                    "the kernel produced {x} and {y}, neither a fill nor an input element"
                )));
            };
            elems.push(e);
        }
        let dtype = ctx.out_meta(i).map(|m| m.dtype).unwrap_or(a.dtype());
        result.push(SymTensor::new(dtype, a.shape().to_vec(), elems));
    }
    Ok(result)
}

/// Runs any pure operator whose tensor inputs are all constant through its kernel; `None`
/// when some input is not constant.
pub(crate) fn run_constant(ctx: &mut NodeCtx) -> Result<Option<Vec<SymTensor>>, ExecError> {
    let mut concrete = HashMap::new();
    for v in ctx.node.inputs() {
        let Some(t) = ctx.env[v.node][v.output].as_ref() else {
            return Ok(None);
        };
        let Some(values) = constant_values(ctx.arena, t) else {
            return Ok(None);
        };
        concrete.insert(v, Tensor::new(Meta::new(t.dtype, t.shape.clone()), values));
    }
    let values = Concrete {
        metas: MetaValues(ctx.metas),
        tensors: concrete,
    };
    let mut ectx = EvalCtx {
        seed: 0,
        call_key: ctx.node.name.clone(),
    };
    let outs = Registry::builtin()
        .eval(ctx.def, ctx.node.args(), kwargs(ctx), &values, &mut ectx)
        .map_err(|e| ExecError::invalid(format!("{}: {e}", ctx.location())))?;
    outs.iter()
        .map(|t| super::constant_tensor(ctx.arena, t))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// Runs an operator whose outputs depend only on the shapes of its tensor inputs
/// (`zeros_like`, `new_full`, `fill`): its kernel on zero tensors of those shapes.
pub(crate) fn run_shape_only(ctx: &mut NodeCtx) -> Result<Vec<SymTensor>, ExecError> {
    let mut concrete = HashMap::new();
    for v in ctx.node.inputs() {
        let t = ctx.env[v.node][v.output]
            .as_ref()
            .ok_or_else(|| ctx.unsupported("an input has no value"))?;
        concrete.insert(v, Tensor::full(t.dtype, t.shape.clone(), 0.0));
    }
    let values = Concrete {
        metas: MetaValues(ctx.metas),
        tensors: concrete,
    };
    let mut ectx = EvalCtx {
        seed: 0,
        call_key: ctx.node.name.clone(),
    };
    let outs = Registry::builtin()
        .eval(ctx.def, ctx.node.args(), kwargs(ctx), &values, &mut ectx)
        .map_err(|e| ExecError::invalid(format!("{}: {e}", ctx.location())))?;
    outs.iter()
        .map(|t| super::constant_tensor(ctx.arena, t))
        .collect()
}

fn kwargs<'a>(ctx: &NodeCtx<'a>) -> &'a [(String, Arg)] {
    match &ctx.node.kind {
        shardproof_ir::NodeKind::Call { kwargs, .. } => kwargs,
        _ => &[],
    }
}
