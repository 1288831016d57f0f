//! The symbolic rules of pure operators: one entry per operator family, looked up by
//! `namespace.name`; the overload and arguments are read inside the rule.

use super::movement;
use super::{ExecError, NodeCtx, Operand};
use crate::expr::{Arena, Built, Coeff, ExprId, Func};
use crate::tensor::{broadcast_index, norm_dim, reduce_groups, SymTensor};
use shardproof_ir::DType;

/// A rule: the outputs of one call.
pub(crate) type RuleFn = fn(&mut NodeCtx) -> Result<Vec<SymTensor>, ExecError>;

/// The rule of a pure operator, by `namespace.name`.
pub(crate) fn rule_of(base: &str) -> Option<RuleFn> {
    Some(match base {
        "aten.add"
        | "aten.sub"
        | "aten.rsub"
        | "aten.mul"
        | "aten.div"
        | "aten.maximum"
        | "aten.minimum"
        | "aten.fmax"
        | "aten.fmin"
        | "aten.eq"
        | "aten.ne"
        | "aten.gt"
        | "aten.ge"
        | "aten.lt"
        | "aten.le"
        | "aten.logical_and"
        | "aten.logical_or"
        | "aten.pow"
        | "aten.threshold_backward"
        | "aten.tanh_backward"
        | "aten.sigmoid_backward"
        | "aten.silu_backward"
        | "aten.bitwise_and"
        | "aten.bitwise_or"
        | "aten.__and__"
        | "aten.__or__" => binary,
        "aten.neg" | "aten.relu" | "aten.abs" | "aten.exp" | "aten.log" | "aten.sqrt"
        | "aten.rsqrt" | "aten.reciprocal" | "aten.tanh" | "aten.sigmoid" | "aten.silu"
        | "aten.erf" | "aten.gelu" | "aten.logical_not" | "aten.bitwise_not" | "aten.sin"
        | "aten.cos" | "aten.floor" | "aten.ceil" | "aten.round" | "aten.trunc" | "aten.sign"
        | "aten.log2" | "aten.exp2" | "aten.log1p" | "aten.expm1" | "aten.erfc" | "aten.square" => {
            unary
        }
        "aten.gelu_backward" => gelu_backward,
        "aten.clamp" | "aten.clamp_min" | "aten.clamp_max" => clamp,
        "aten.where" => where_,
        "aten.masked_fill" => masked_fill,
        "aten.lerp" => lerp,
        "aten.addcmul" | "aten.addcdiv" => addc,
        "aten.sum" | "aten.mean" | "aten.amax" | "aten.amin" | "aten.prod" => reduction,
        "aten.max" | "aten.min" => max_min,
        "aten.argmax" | "aten.argmin" => arg_extreme,
        "aten.topk" => topk,
        "aten.scatter" => scatter,
        "aten.var" | "aten.std" => variance,
        "aten.logsumexp" => logsumexp,
        "aten.linalg_vector_norm" => vector_norm,
        "aten._to_copy" | "aten.to" => convert,
        "aten.zeros_like" | "aten.ones_like" | "aten.full_like" | "aten.new_zeros"
        | "aten.new_ones" | "aten.new_full" | "aten.fill" | "aten.zero" => movement::run_shape_only,
        "aten.constant_pad_nd" | "aten.pad" => movement::run_with_fill,
        "aten.mm" | "aten.bmm" | "aten.matmul" | "aten.addmm" | "aten.linear" | "aten.dot"
        | "aten.mv" | "aten.baddbmm" => super::nn::matmul_family,
        "aten._softmax" | "aten.softmax" | "aten._log_softmax" | "aten.log_softmax" => {
            super::nn::softmax
        }
        "aten._softmax_backward_data" | "aten._log_softmax_backward_data" => {
            super::nn::softmax_backward
        }
        "aten.native_layer_norm" | "aten.layer_norm" => super::nn::layer_norm,
        "aten.native_layer_norm_backward" => super::nn::layer_norm_backward,
        "aten.rms_norm" | "aten._fused_rms_norm" => super::nn::rms_norm,
        "aten.nll_loss_forward" => super::nn::nll_loss_forward,
        "aten.nll_loss_backward" => super::nn::nll_loss_backward,
        "aten.mse_loss" => super::nn::mse_loss,
        "aten.embedding_dense_backward" => super::nn::embedding_backward,
        _ => return None,
    })
}

/// Runs a pure operator: constants fold through the kernel, data movement runs on encoded
/// indices, arithmetic by its rule; anything else is unsupported.
pub(crate) fn apply(ctx: &mut NodeCtx) -> Result<Vec<SymTensor>, ExecError> {
    let base = ctx.def.name.base();
    if base == "aten.embedding" && !super::nn::constant_arg(ctx, "indices")? {
        return super::nn::embedding(ctx);
    }
    if let Some(index_args) = movement::movement_index_args(&base) {
        return movement::run(ctx, index_args);
    }
    if let Some(outs) = movement::run_constant(ctx)? {
        return Ok(outs);
    }
    match rule_of(&base) {
        Some(rule) => rule(ctx),
        None => Err(ctx.unsupported("no symbolic rule for this operator")),
    }
}

/// Random operators: dropout that draws nothing (p = 0 or not training) is the identity;
/// anything that draws is unsupported (the spec and the ranks draw different numbers).
pub(crate) fn random(ctx: &mut NodeCtx) -> Result<Vec<SymTensor>, ExecError> {
    let name = ctx.def.name.name.clone();
    if matches!(name.as_str(), "dropout" | "native_dropout") {
        let p = ctx.opt_float("p").unwrap_or(0.5);
        let train = ctx.bool_or("train", true)?;
        if p == 0.0 || !train {
            let x = ctx.tensor("input")?;
            if name == "dropout" {
                return Ok(vec![x]);
            }
            let one = ctx.arena.int(1)?;
            let mask = SymTensor::new(DType::Bool, x.shape.clone(), vec![one; x.numel()]);
            return Ok(vec![x, mask]);
        }
    }
    Err(ctx.unsupported("draws random numbers; the prover compares deterministic programs"))
}

/// Elementwise map over broadcast operands into output 0's shape.
pub(crate) fn map_elementwise(
    ctx: &mut NodeCtx,
    operands: &[Operand],
    f: &mut dyn FnMut(&mut Arena, &[ExprId]) -> Built,
) -> Result<SymTensor, ExecError> {
    let meta = ctx.out_meta(0)?;
    let n = meta.numel();
    let maps: Vec<Option<Vec<usize>>> = operands
        .iter()
        .map(|o| match o {
            Operand::Tensor(t) => Some(broadcast_index(&t.shape, &meta.shape)),
            Operand::Scalar(_) => None,
        })
        .collect();
    let mut out = Vec::with_capacity(n);
    let mut xs = vec![ExprId(0); operands.len()];
    for e in 0..n {
        for (k, o) in operands.iter().enumerate() {
            xs[k] = match (o, &maps[k]) {
                (Operand::Tensor(t), Some(m)) => t.elems[m[e]],
                (Operand::Scalar(s), _) => *s,
                _ => unreachable!(),
            };
        }
        out.push(f(ctx.arena, &xs)?);
    }
    Ok(SymTensor::new(meta.dtype, meta.shape, out))
}

fn sigmoid(a: &mut Arena, x: ExprId) -> Built {
    let nx = a.neg(x)?;
    let e = a.app(Func::Exp, vec![nx])?;
    let one = a.int(1)?;
    let d = a.add(one, e)?;
    a.recip(d)
}

/// Whether an operand holds only 0 and 1: a bool tensor, or the scalar 0 or 1 (`True`).
fn zero_or_one(arena: &Arena, o: &Operand) -> bool {
    match o {
        Operand::Tensor(t) => t.dtype == DType::Bool,
        Operand::Scalar(e) => arena
            .as_const(*e)
            .is_some_and(|c| c.is_zero() || c.is_one()),
    }
}

fn truthy(a: &mut Arena, x: ExprId) -> Built {
    let z = a.app(Func::IsZero, vec![x])?;
    a.not(z)
}

fn binary(ctx: &mut NodeCtx) -> Result<Vec<SymTensor>, ExecError> {
    let name = ctx.def.name.name.clone();
    let overload = ctx.def.name.overload.clone();
    let (first, second) = match name.as_str() {
        "threshold_backward" => ("grad_output", "self"),
        "tanh_backward" | "sigmoid_backward" => ("grad_output", "output"),
        "silu_backward" => ("grad_output", "self"),
        "pow" if overload == "Scalar" => ("self", "exponent"),
        "pow" => ("self", "exponent"),
        _ => ("self", "other"),
    };
    let a = ctx.operand(first, None)?;
    let b = ctx.operand(second, None)?;
    if matches!(
        name.as_str(),
        "bitwise_and" | "bitwise_or" | "__and__" | "__or__"
    ) && !(zero_or_one(ctx.arena, &a) && zero_or_one(ctx.arena, &b))
    {
        // The rule below is the logical one; on integers these act bit by bit
        // (`2 & 1 = 0`, `2 | 1 = 3`).
        return Err(ctx.unsupported("a bitwise and/or of integers has no symbolic rule"));
    }
    if !matches!(name.as_str(), "add" | "sub" | "rsub" | "mul") {
        exact_in_its_type(ctx, &a)?;
        exact_in_its_type(ctx, &b)?;
        scalar_within_its_partner(ctx, &a, &b)?;
        scalar_within_its_partner(ctx, &b, &a)?;
    }
    let alpha = if matches!(name.as_str(), "add" | "sub" | "rsub") {
        Some(ctx.scalar("alpha", 1.0)?)
    } else {
        None
    };
    let threshold = if name == "threshold_backward" {
        Some(ctx.scalar("threshold", 0.0)?)
    } else {
        None
    };
    let rounding = if name == "div" {
        ctx.arg("rounding_mode").and_then(|a| match a {
            shardproof_ir::Arg::Str(s) => Some(s),
            _ => None,
        })
    } else {
        None
    };
    if name == "pow" {
        // Only a constant exponent has a rule: x^n expands, other powers are a function.
        let Operand::Scalar(e) = b else {
            return Err(ctx.unsupported("a tensor exponent has no symbolic rule"));
        };
        let Some(exp) = ctx.arena.as_f64_const(e) else {
            return Err(ctx.unsupported("a non-constant exponent has no symbolic rule"));
        };
        if matches!(a, Operand::Scalar(_)) {
            return Err(ctx.unsupported("a scalar base has no symbolic rule"));
        }
        return Ok(vec![map_elementwise(ctx, &[a], &mut |ar, x| {
            ar.pow_const(x[0], exp)
        })?]);
    }
    // A `bool` sum is cast back to `bool` (`True + True` is `True`).
    let bool_out = ctx.out_meta(0)?.dtype == DType::Bool;
    let out = map_elementwise(ctx, &[a, b], &mut |ar, x| {
        let (x, y) = (x[0], x[1]);
        match name.as_str() {
            "add" if bool_out => {
                let s = ar.mul(alpha.expect("set"), y)?;
                let s = ar.add(x, s)?;
                truthy(ar, s)
            }
            "add" => {
                let s = ar.mul(alpha.expect("set"), y)?;
                ar.add(x, s)
            }
            "sub" => {
                let s = ar.mul(alpha.expect("set"), y)?;
                ar.sub(x, s)
            }
            "rsub" => {
                let s = ar.mul(alpha.expect("set"), x)?;
                ar.sub(y, s)
            }
            "mul" => ar.mul(x, y),
            "logical_and" | "bitwise_and" | "__and__" => {
                let (tx, ty) = (truthy(ar, x)?, truthy(ar, y)?);
                ar.mul(tx, ty)
            }
            "logical_or" | "bitwise_or" | "__or__" => {
                // a or b = a + b - ab on 0/1 values.
                let (tx, ty) = (truthy(ar, x)?, truthy(ar, y)?);
                let s = ar.add(tx, ty)?;
                let p = ar.mul(tx, ty)?;
                ar.sub(s, p)
            }
            "div" => {
                let q = ar.div(x, y)?;
                match rounding.as_deref() {
                    None => Ok(q),
                    Some("floor") => ar.app(Func::Named("floor".into()), vec![q]),
                    Some(_) => ar.app(Func::Named("trunc".into()), vec![q]),
                }
            }
            "maximum" | "fmax" => ar.max(x, y),
            "minimum" | "fmin" => ar.min(x, y),
            "eq" => ar.eq(x, y),
            "ne" => {
                let e = ar.eq(x, y)?;
                ar.not(e)
            }
            "gt" => ar.gt(x, y),
            "ge" => ar.ge(x, y),
            "lt" => ar.gt(y, x),
            "le" => ar.ge(y, x),
            "threshold_backward" => {
                // grad where self > threshold, else 0.
                let c = ar.gt(y, threshold.expect("set"))?;
                let zero = ar.int(0)?;
                ar.select(c, x, zero)
            }
            "tanh_backward" => {
                let one = ar.int(1)?;
                let y2 = ar.mul(y, y)?;
                let d = ar.sub(one, y2)?;
                ar.mul(x, d)
            }
            "sigmoid_backward" => {
                let one = ar.int(1)?;
                let d = ar.sub(one, y)?;
                let p = ar.mul(y, d)?;
                ar.mul(x, p)
            }
            "silu_backward" => {
                // grad * s * (1 + x (1 - s)), s = sigmoid(x).
                let s = sigmoid(ar, y)?;
                let one = ar.int(1)?;
                let oms = ar.sub(one, s)?;
                let xo = ar.mul(y, oms)?;
                let f = ar.add(one, xo)?;
                let sf = ar.mul(s, f)?;
                ar.mul(x, sf)
            }
            _ => unreachable!("binary rule for {name}"),
        }
    })?;
    Ok(vec![out])
}

fn unary(ctx: &mut NodeCtx) -> Result<Vec<SymTensor>, ExecError> {
    let name = ctx.def.name.name.clone();
    let x = ctx.operand("self", None)?;
    if !matches!(name.as_str(), "neg" | "square") {
        exact_in_its_type(ctx, &x)?;
    }
    let int_operand = matches!(&x, Operand::Tensor(t) if t.dtype.is_int());
    let approximate = if name == "gelu" {
        ctx.opt_str("approximate").unwrap_or_else(|| "none".into())
    } else {
        String::new()
    };
    let out = map_elementwise(ctx, &[x], &mut |ar, xs| {
        let x = xs[0];
        match name.as_str() {
            "neg" => ar.neg(x),
            "relu" => {
                let z = ar.int(0)?;
                ar.max(x, z)
            }
            "abs" => {
                let n = ar.neg(x)?;
                ar.max(x, n)
            }
            "square" => ar.mul(x, x),
            "exp" => ar.app(Func::Exp, vec![x]),
            "log" => ar.app(Func::Log, vec![x]),
            "sqrt" => ar.app(Func::Sqrt, vec![x]),
            "rsqrt" => {
                let s = ar.app(Func::Sqrt, vec![x])?;
                ar.recip(s)
            }
            "reciprocal" => ar.recip(x),
            "tanh" => ar.app(Func::Tanh, vec![x]),
            "erf" => ar.app(Func::Erf, vec![x]),
            "sigmoid" => sigmoid(ar, x),
            "silu" => {
                let s = sigmoid(ar, x)?;
                ar.mul(x, s)
            }
            "gelu" => gelu(ar, x, &approximate),
            // On integers `~x` is `-x - 1`; on bools (and `logical_not` of anything) the
            // negation.
            "bitwise_not" if int_operand => {
                let n = ar.neg(x)?;
                let one = ar.int(1)?;
                ar.sub(n, one)
            }
            "logical_not" | "bitwise_not" => ar.app(Func::IsZero, vec![x]),
            other => ar.app(Func::Named(other.to_string()), vec![x]),
        }
    })?;
    Ok(vec![out])
}

/// gelu(x) = x/2 (1 + erf(x/sqrt 2)), or the tanh approximation; constants as the kernel's f64.
fn gelu(ar: &mut Arena, x: ExprId, approximate: &str) -> Built {
    let half = ar.constant(Coeff::new(1, 2))?;
    let one = ar.int(1)?;
    let inner = if approximate == "tanh" {
        let k = ar.float((2.0 / std::f64::consts::PI).sqrt())?;
        let c = ar.float(0.044715)?;
        let x3 = ar.pow_int(x, 3)?;
        let cx3 = ar.mul(c, x3)?;
        let s = ar.add(x, cx3)?;
        let arg = ar.mul(k, s)?;
        ar.app(Func::Tanh, vec![arg])?
    } else {
        let k = ar.float(std::f64::consts::FRAC_1_SQRT_2)?;
        let arg = ar.mul(x, k)?;
        ar.app(Func::Erf, vec![arg])?
    };
    let s = ar.add(one, inner)?;
    let hx = ar.mul(half, x)?;
    ar.mul(hx, s)
}

fn gelu_backward(ctx: &mut NodeCtx) -> Result<Vec<SymTensor>, ExecError> {
    let g = ctx.operand("grad_output", None)?;
    let x = ctx.operand("self", None)?;
    let approximate = ctx.opt_str("approximate").unwrap_or_else(|| "none".into());
    if approximate != "none" {
        return Err(ctx.unsupported("the tanh approximation's gradient has no symbolic rule"));
    }
    let out = map_elementwise(ctx, &[g, x], &mut |ar, v| {
        // d/dx gelu = cdf(x) + x pdf(x), cdf = (1 + erf(x/sqrt2))/2, pdf = exp(-x^2/2)/sqrt(2 pi).
        let (g, x) = (v[0], v[1]);
        let half = ar.constant(Coeff::new(1, 2))?;
        let one = ar.int(1)?;
        let k = ar.float(std::f64::consts::FRAC_1_SQRT_2)?;
        let xk = ar.mul(x, k)?;
        let erf = ar.app(Func::Erf, vec![xk])?;
        let s = ar.add(one, erf)?;
        let cdf = ar.mul(half, s)?;
        let x2 = ar.mul(x, x)?;
        let mhx2 = ar.scale(x2, &Coeff::new(-1, 2))?;
        let e = ar.app(Func::Exp, vec![mhx2])?;
        let c = ar.float(1.0 / (2.0 * std::f64::consts::PI).sqrt())?;
        let pdf = ar.mul(c, e)?;
        let xpdf = ar.mul(x, pdf)?;
        let d = ar.add(cdf, xpdf)?;
        ar.mul(g, d)
    })?;
    Ok(vec![out])
}

fn clamp(ctx: &mut NodeCtx) -> Result<Vec<SymTensor>, ExecError> {
    let name = ctx.def.name.name.clone();
    let x = ctx.operand("self", None)?;
    exact_in_its_type(ctx, &x)?;
    let lo = if name == "clamp_max" {
        None
    } else {
        match ctx.arg("min") {
            None => None,
            Some(_) => Some(ctx.operand("min", None)?),
        }
    };
    let hi = if name == "clamp_min" {
        None
    } else {
        match ctx.arg("max") {
            None => None,
            Some(_) => Some(ctx.operand("max", None)?),
        }
    };
    // The bounds are compared with the elements: a wrapped bound is read by its order too.
    // A scalar bound is cast to `self`'s type by the kernel (`uint8` clamp to 510 is a clamp
    // to 254), so it must lie within that type.
    for bound in lo.iter().chain(hi.iter()) {
        exact_in_its_type(ctx, bound)?;
        scalar_within_its_partner(ctx, &x, bound)?;
    }
    let mut ops = vec![x];
    let has_lo = lo.is_some();
    ops.extend(lo);
    ops.extend(hi);
    let out = map_elementwise(ctx, &ops, &mut |ar, v| {
        let mut y = v[0];
        let mut k = 1;
        if has_lo {
            y = ar.max(y, v[k])?;
            k += 1;
        }
        if k < v.len() {
            y = ar.min(y, v[k])?;
        }
        Ok(y)
    })?;
    Ok(vec![out])
}

fn where_(ctx: &mut NodeCtx) -> Result<Vec<SymTensor>, ExecError> {
    let c = ctx.operand("condition", None)?;
    let a = ctx.operand("self", None)?;
    let b = ctx.operand("other", None)?;
    Ok(vec![map_elementwise(ctx, &[c, a, b], &mut |ar, v| {
        ar.select(v[0], v[1], v[2])
    })?])
}

fn masked_fill(ctx: &mut NodeCtx) -> Result<Vec<SymTensor>, ExecError> {
    let x = ctx.operand("self", None)?;
    let m = ctx.operand("mask", None)?;
    let v = ctx.operand("value", None)?;
    let v = fill_in_type(ctx, v)?;
    Ok(vec![map_elementwise(ctx, &[m, v, x], &mut |ar, v| {
        ar.select(v[0], v[1], v[2])
    })?])
}

/// A fill as the kernel stores it: cast to the output's type (`2.5` into an `int64` is 2, `2`
/// into a `bool` is `True`). A constant is cast; a fill tensor of another type than an integer
/// or `bool` output has no rule.
fn fill_in_type(ctx: &mut NodeCtx, v: Operand) -> Result<Operand, ExecError> {
    let dtype = ctx.out_meta(0)?.dtype;
    if dtype.is_float() {
        return Ok(v);
    }
    match v {
        Operand::Scalar(e) => Ok(Operand::Scalar(scalar_fill_in_type(ctx, e)?)),
        Operand::Tensor(t) if t.dtype == dtype => Ok(Operand::Tensor(t)),
        Operand::Tensor(t) => {
            Err(ctx.unsupported(format!("a {:?} fill cast into {dtype:?}", t.dtype)))
        }
    }
}

/// A number fill as the kernel stores it in the output's type (see [`fill_in_type`]).
fn scalar_fill_in_type(ctx: &mut NodeCtx, e: ExprId) -> Result<ExprId, ExecError> {
    let dtype = ctx.out_meta(0)?.dtype;
    if dtype.is_float() {
        return Ok(e);
    }
    match ctx.arena.as_f64_const(e) {
        Some(c) => Ok(ctx.arena.float(shardproof_ops::cast_value(c, dtype))?),
        None => Err(ctx.unsupported("a fill not shown to be a constant of its type")),
    }
}

fn lerp(ctx: &mut NodeCtx) -> Result<Vec<SymTensor>, ExecError> {
    let a = ctx.operand("self", None)?;
    let b = ctx.operand("end", None)?;
    let w = ctx.operand("weight", None)?;
    Ok(vec![map_elementwise(ctx, &[a, b, w], &mut |ar, v| {
        let d = ar.sub(v[1], v[0])?;
        let s = ar.mul(v[2], d)?;
        ar.add(v[0], s)
    })?])
}

fn addc(ctx: &mut NodeCtx) -> Result<Vec<SymTensor>, ExecError> {
    let div = ctx.def.name.name == "addcdiv";
    let s = ctx.operand("self", None)?;
    let t1 = ctx.operand("tensor1", None)?;
    let t2 = ctx.operand("tensor2", None)?;
    let value = ctx.scalar("value", 1.0)?;
    Ok(vec![map_elementwise(ctx, &[s, t1, t2], &mut |ar, v| {
        let p = if div {
            ar.div(v[1], v[2])?
        } else {
            ar.mul(v[1], v[2])?
        };
        let q = ar.mul(value, p)?;
        ar.add(v[0], q)
    })?])
}

/// The dims a reduction's `dim` argument names (all dims when absent or empty).
pub(crate) fn reduction_dims(
    ctx: &NodeCtx,
    rank: usize,
    key: &str,
) -> Result<Vec<usize>, ExecError> {
    let dims = ctx.opt_int_list(key)?.unwrap_or_default();
    if dims.is_empty() {
        return Ok((0..rank).collect());
    }
    dims.iter()
        .map(|&d| norm_dim(d, rank).ok_or_else(|| ctx.unsupported(format!("dim {d} out of range"))))
        .collect()
}

/// Reduces groups of elements of `x` into a tensor of output 0's meta.
pub(crate) fn reduce_by(
    ctx: &mut NodeCtx,
    x: &SymTensor,
    dims: &[usize],
    keepdim: bool,
    f: &mut dyn FnMut(&mut Arena, &[ExprId]) -> Built,
) -> Result<SymTensor, ExecError> {
    let (shape, groups) = reduce_groups(&x.shape, dims, keepdim);
    let mut out = Vec::with_capacity(groups.len());
    let mut xs = Vec::new();
    for g in &groups {
        xs.clear();
        xs.extend(g.iter().map(|&i| x.elems[i]));
        out.push(f(ctx.arena, &xs)?);
    }
    let dtype = ctx.out_meta(0).map(|m| m.dtype).unwrap_or(x.dtype);
    Ok(SymTensor::new(dtype, shape, out))
}

fn reduction(ctx: &mut NodeCtx) -> Result<Vec<SymTensor>, ExecError> {
    let name = ctx.def.name.name.clone();
    let x = ctx.tensor("self")?;
    // A sum or product kept in the elements' own type wraps as they do (a ring operation);
    // into a wider type (torch sums `uint8` into `int64`), or a mean or max, it reads the
    // wrapped elements.
    let same_type = ctx.out_meta(0).is_ok_and(|m| m.dtype == x.dtype);
    if !(matches!(name.as_str(), "sum" | "prod") && same_type) {
        exact_in_its_type(ctx, &Operand::Tensor(x.clone()))?;
    }
    let key = if ctx.def.schema.index_of("dim").is_some() {
        "dim"
    } else {
        ""
    };
    let dims =
        if key.is_empty() {
            (0..x.shape.len()).collect()
        } else if name == "prod" {
            match ctx.opt_int("dim")? {
                Some(d) => vec![norm_dim(d, x.shape.len())
                    .ok_or_else(|| ctx.unsupported("dim out of range"))?],
                None => (0..x.shape.len()).collect(),
            }
        } else {
            reduction_dims(ctx, x.shape.len(), key)?
        };
    let keepdim = if ctx.def.schema.index_of("keepdim").is_some() {
        ctx.bool_or("keepdim", false)?
    } else {
        false
    };
    let out = reduce_by(ctx, &x, &dims, keepdim, &mut |ar, xs| match name.as_str() {
        "sum" => ar.sum(xs),
        "mean" => {
            let s = ar.sum(xs)?;
            ar.scale(s, &Coeff::new(1, xs.len().max(1) as i64))
        }
        "amax" => ar.app(Func::Max, xs.to_vec()),
        "amin" => ar.app(Func::Min, xs.to_vec()),
        _ => ar.product(xs),
    })?;
    Ok(vec![out])
}

/// `max` / `min`: of all elements, elementwise of two tensors, or along a dim (values and the
/// position of the first extreme, as the interpreter's kernel picks it).
fn max_min(ctx: &mut NodeCtx) -> Result<Vec<SymTensor>, ExecError> {
    let is_max = ctx.def.name.name == "max";
    let func = if is_max { Func::Max } else { Func::Min };
    match ctx.def.name.overload.as_str() {
        "default" => {
            let x = ctx.tensor("self")?;
            // The extreme keeps the elements' type, so it is read here.
            exact_in_its_type(ctx, &Operand::Tensor(x.clone()))?;
            let dims: Vec<usize> = (0..x.shape.len()).collect();
            Ok(vec![reduce_by(ctx, &x, &dims, false, &mut |ar, xs| {
                ar.app(func.clone(), xs.to_vec())
            })?])
        }
        "other" => {
            let a = ctx.operand("self", None)?;
            let b = ctx.operand("other", None)?;
            exact_in_its_type(ctx, &a)?;
            exact_in_its_type(ctx, &b)?;
            Ok(vec![map_elementwise(ctx, &[a, b], &mut |ar, v| {
                ar.app(func.clone(), v.to_vec())
            })?])
        }
        "dim" => {
            // The indices are `int64`: a wrapped `self` is refused before the rule
            // ([`widened_operands_exact`]).
            let x = ctx.tensor("self")?;
            let d = ctx.int("dim")?;
            let rank = x.shape.len().max(1);
            let d = norm_dim(d, rank).ok_or_else(|| ctx.unsupported("dim out of range"))?;
            let keepdim = ctx.bool_or("keepdim", false)?;
            // A rank-0 tensor is one lane of one element.
            let dims: Vec<usize> = if x.shape.is_empty() { vec![] } else { vec![d] };
            let values = reduce_by(ctx, &x, &dims, keepdim, &mut |ar, xs| {
                ar.app(func.clone(), xs.to_vec())
            })?;
            let at = if is_max { Func::ArgMax } else { Func::ArgMin };
            let indices = lane_positions(ctx, &x, &dims, keepdim, at)?;
            Ok(vec![values, indices])
        }
        other => Err(ctx.unsupported(format!("max/min overload `{other}` has no symbolic rule"))),
    }
}

/// Per lane of `x` over `dims`, the position of its first extreme (`func` is ArgMax or
/// ArgMin), as an i64 tensor.
fn lane_positions(
    ctx: &mut NodeCtx,
    x: &SymTensor,
    dims: &[usize],
    keepdim: bool,
    func: Func,
) -> Result<SymTensor, ExecError> {
    let mut t = reduce_by(ctx, x, dims, keepdim, &mut |ar, xs| {
        ar.app(func.clone(), xs.to_vec())
    })?;
    t.dtype = shardproof_ir::DType::I64;
    Ok(t)
}

/// `argmax` / `argmin`: along `dim`, or over the flattened tensor when `dim` is None.
fn arg_extreme(ctx: &mut NodeCtx) -> Result<Vec<SymTensor>, ExecError> {
    let func = if ctx.def.name.name == "argmax" {
        Func::ArgMax
    } else {
        Func::ArgMin
    };
    // The positions are `int64`: a wrapped `self` is refused before the rule
    // ([`widened_operands_exact`]).
    let x = ctx.tensor("self")?;
    let keepdim = ctx.bool_or("keepdim", false)?;
    let dims: Vec<usize> = match ctx.opt_int("dim")? {
        None => (0..x.shape.len()).collect(),
        Some(_) if x.shape.is_empty() => vec![],
        Some(d) => {
            vec![norm_dim(d, x.shape.len()).ok_or_else(|| ctx.unsupported("dim out of range"))?]
        }
    };
    Ok(vec![lane_positions(ctx, &x, &dims, keepdim, func)?])
}

/// `topk`: per lane along `dim`, the `k` first values of a stable sort and their positions
/// (ties in index order, as the interpreter's kernel); `sorted=False` leaves the order to
/// the backend, so it has no rule.
fn topk(ctx: &mut NodeCtx) -> Result<Vec<SymTensor>, ExecError> {
    // The indices are `int64`: a wrapped `self` is refused before the rule
    // ([`widened_operands_exact`]).
    let x = ctx.tensor("self")?;
    let k = usize::try_from(ctx.int("k")?).map_err(|_| ctx.unsupported("negative k"))?;
    let largest = ctx.bool_or("largest", true)?;
    if !ctx.bool_or("sorted", true)? {
        return Err(ctx.unsupported("topk with sorted=False has no fixed order"));
    }
    let int = shardproof_ir::DType::I64;
    if x.shape.is_empty() {
        if k != 1 {
            return Err(ctx.unsupported(format!("topk k={k} of a 0-d tensor")));
        }
        let zero = ctx.arena.int(0)?;
        return Ok(vec![x.clone(), SymTensor::new(int, vec![], vec![zero])]);
    }
    let d = norm_dim(ctx.opt_int("dim")?.unwrap_or(-1), x.shape.len())
        .ok_or_else(|| ctx.unsupported("dim out of range"))?;
    let n = x.shape[d];
    if k > n {
        return Err(ctx.unsupported(format!("topk k={k} over a dim of {n}")));
    }
    let inner: usize = x.shape[d + 1..].iter().product();
    let (_, lanes) = reduce_groups(&x.shape, &[d], true);
    let mut shape = x.shape.clone();
    shape[d] = k;
    let total: usize = shape.iter().product();
    let (mut values, mut indices) = (vec![None; total], vec![None; total]);
    for (g, lane) in lanes.iter().enumerate() {
        let xs: Vec<ExprId> = lane.iter().map(|&i| x.elems[i]).collect();
        let (o, i) = (g / inner, g % inner);
        for j in 0..k {
            let rank = u32::try_from(j).map_err(|_| ctx.unsupported("k too large"))?;
            let at = (o * k + j) * inner + i;
            values[at] = Some(
                ctx.arena
                    .app(Func::SortedValue { rank, largest }, xs.clone())?,
            );
            indices[at] = Some(
                ctx.arena
                    .app(Func::SortedIndex { rank, largest }, xs.clone())?,
            );
        }
    }
    let dtype = ctx.out_meta(0).map(|m| m.dtype).unwrap_or(x.dtype);
    let collect = |v: Vec<Option<ExprId>>| v.into_iter().map(|e| e.expect("every slot")).collect();
    Ok(vec![
        SymTensor::new(dtype, shape.clone(), collect(values)),
        SymTensor::new(int, shape, collect(indices)),
    ])
}

/// Whether index expression `e` is provably in `[0, n)`: a constant there, a position among
/// at most `n` arguments (argmax/argmin, a sorted index), or an integer expression whose
/// interval lies there (a label shifted by a rank's offset and masked outside its range:
/// [`super::range::within`]). Anything else could fall outside the target, where the kernel
/// fails instead of computing.
fn index_within(arena: &Arena, e: ExprId, n: usize) -> bool {
    if let Some(c) = arena.as_const(e) {
        return c.to_usize().is_some_and(|i| i < n);
    }
    matches!(
        arena.single_app(e),
        Some((Func::ArgMax | Func::ArgMin | Func::SortedIndex { .. }, args)) if args.len() <= n
    ) || super::range::within(arena, e, n)
}

/// `scatter.src` / `scatter.value` (no reduction): `out[q] = src[p]` for every index
/// position `p` that agrees with `q` off `dim` and whose index value is `q[dim]`, the last
/// such `p` winning (the interpreter's order); `self[q]` where none does. With symbolic
/// index values each element is a chain of `where(index[p] == q[dim], src[p], ...)`.
fn scatter(ctx: &mut NodeCtx) -> Result<Vec<SymTensor>, ExecError> {
    let overload = ctx.def.name.overload.clone();
    if overload != "src" && overload != "value" {
        return Err(ctx.unsupported(format!(
            "scatter overload `{overload}` has no symbolic rule"
        )));
    }
    let x = ctx.tensor("self")?;
    let index = ctx.tensor("index")?;
    let rank = x.shape.len();
    if rank == 0 || index.shape.len() != rank {
        return Err(ctx.unsupported("scatter of a 0-d tensor or with an index of another rank"));
    }
    let d = norm_dim(ctx.int("dim")?, rank).ok_or_else(|| ctx.unsupported("dim out of range"))?;
    let src = if overload == "src" {
        Some(ctx.tensor("src")?)
    } else {
        None
    };
    let value = match &src {
        Some(_) => None,
        None => Some(match ctx.operand("value", None)? {
            Operand::Scalar(e) => scalar_fill_in_type(ctx, e)?,
            Operand::Tensor(_) => return Err(ctx.unsupported("scatter value is a tensor")),
        }),
    };
    for k in 0..rank {
        let fits = index.shape[k] <= src.as_ref().map_or(usize::MAX, |s| s.shape[k])
            && (k == d || index.shape[k] <= x.shape[k]);
        if !fits {
            return Err(ctx.unsupported("scatter index larger than its source or target"));
        }
    }
    let n = x.shape[d];
    if index.elems.iter().any(|&e| !index_within(ctx.arena, e, n)) {
        return Err(ctx.unsupported(format!(
            "scatter index values not provably within the target's dim of {n}"
        )));
    }
    let xst = crate::tensor::strides(&x.shape);
    let ist = crate::tensor::strides(&index.shape);
    let sst = src.as_ref().map(|s| crate::tensor::strides(&s.shape));
    let mut out: Vec<ExprId> = x.elems.to_vec();
    for (q, slot) in out.iter_mut().enumerate() {
        let coords: Vec<usize> = (0..rank).map(|k| q / xst[k] % x.shape[k]).collect();
        if (0..rank).any(|k| k != d && coords[k] >= index.shape[k]) {
            continue;
        }
        let target = ctx.arena.int(coords[d] as i64)?;
        let mut acc = *slot;
        for j in 0..index.shape[d] {
            let at = |st: &[usize]| -> usize {
                (0..rank)
                    .map(|k| if k == d { j } else { coords[k] } * st[k])
                    .sum()
            };
            let idx = index.elems[at(&ist)];
            let v = match (&src, &sst) {
                (Some(s), Some(st)) => s.elems[at(st)],
                _ => value.expect("a value when there is no src"),
            };
            let hit = ctx.arena.eq(idx, target)?;
            acc = ctx.arena.select(hit, v, acc)?;
        }
        *slot = acc;
    }
    let dtype = ctx.out_meta(0).map(|m| m.dtype).unwrap_or(x.dtype);
    Ok(vec![SymTensor::new(dtype, x.shape.clone(), out)])
}

/// `gather` with symbolic index values: `out[p] = lookup(index[p], self[p with dim = 0..n])`,
/// only for indices provably in range (see [`index_within`]).
pub(crate) fn symbolic_gather(ctx: &mut NodeCtx) -> Result<Vec<SymTensor>, ExecError> {
    let x = ctx.tensor("self")?;
    let index = ctx.tensor("index")?;
    let rank = x.shape.len();
    if rank == 0 || index.shape.len() != rank {
        return Err(ctx.unsupported("gather of a 0-d tensor or with an index of another rank"));
    }
    let d = norm_dim(ctx.int("dim")?, rank).ok_or_else(|| ctx.unsupported("dim out of range"))?;
    if (0..rank).any(|k| k != d && index.shape[k] > x.shape[k]) {
        return Err(ctx.unsupported("gather index larger than its source"));
    }
    let n = x.shape[d];
    if index.elems.iter().any(|&e| !index_within(ctx.arena, e, n)) {
        return Err(ctx.unsupported(format!(
            "gather index values not provably within the source's dim of {n}"
        )));
    }
    let xst = crate::tensor::strides(&x.shape);
    let ist = crate::tensor::strides(&index.shape);
    let mut out = Vec::with_capacity(index.numel());
    for p in 0..index.numel() {
        let coords: Vec<usize> = (0..rank).map(|k| p / ist[k] % index.shape[k]).collect();
        let mut table = Vec::with_capacity(n);
        for j in 0..n {
            let at: usize = (0..rank)
                .map(|k| if k == d { j } else { coords[k] } * xst[k])
                .sum();
            table.push(x.elems[at]);
        }
        // In range (checked above): a term every entry shares (a max subtracted from the
        // row) comes out of the lookup, as it does from the spec's nll row.
        out.push(ctx.arena.lookup_in_range(index.elems[p], &table)?);
    }
    let dtype = ctx.out_meta(0).map(|m| m.dtype).unwrap_or(x.dtype);
    Ok(vec![SymTensor::new(dtype, index.shape.clone(), out)])
}

fn variance(ctx: &mut NodeCtx) -> Result<Vec<SymTensor>, ExecError> {
    let is_std = ctx.def.name.name == "std";
    let x = ctx.tensor("self")?;
    let dims = reduction_dims(ctx, x.shape.len(), "dim")?;
    let keepdim = ctx.bool_or("keepdim", false)?;
    let correction = match ctx.def.name.overload.as_str() {
        "correction" => ctx.opt_float("correction").unwrap_or(1.0),
        _ => {
            if ctx.bool_or("unbiased", true)? {
                1.0
            } else {
                0.0
            }
        }
    };
    let out = reduce_by(ctx, &x, &dims, keepdim, &mut |ar, xs| {
        let n = xs.len() as i64;
        let s = ar.sum(xs)?;
        let mean = ar.scale(s, &Coeff::new(1, n))?;
        let mut sq = Vec::with_capacity(xs.len());
        for &x in xs {
            let d = ar.sub(x, mean)?;
            sq.push(ar.mul(d, d)?);
        }
        let ss = ar.sum(&sq)?;
        let denom = ar.float(n as f64 - correction)?;
        let var = ar.div(ss, denom)?;
        if is_std {
            ar.app(Func::Sqrt, vec![var])
        } else {
            Ok(var)
        }
    })?;
    Ok(vec![out])
}

fn vector_norm(ctx: &mut NodeCtx) -> Result<Vec<SymTensor>, ExecError> {
    let x = ctx.tensor("self")?;
    let ord = ctx.opt_float("ord").unwrap_or(2.0);
    let dims = reduction_dims(ctx, x.shape.len(), "dim")?;
    let keepdim = ctx.bool_or("keepdim", false)?;
    if ord != 2.0 && ord != 1.0 && ord != f64::INFINITY {
        return Err(ctx.unsupported(format!("ord {ord} has no symbolic rule")));
    }
    let out = reduce_by(ctx, &x, &dims, keepdim, &mut |ar, xs| {
        let mut abs = Vec::with_capacity(xs.len());
        for &x in xs {
            abs.push(if ord == 2.0 {
                ar.mul(x, x)?
            } else {
                let n = ar.neg(x)?;
                ar.max(x, n)?
            });
        }
        if ord == 2.0 {
            let s = ar.sum(&abs)?;
            ar.app(Func::Sqrt, vec![s])
        } else if ord == 1.0 {
            ar.sum(&abs)
        } else {
            ar.app(Func::Max, abs)
        }
    })?;
    Ok(vec![out])
}

/// dtype conversions: over the reals a float-to-float or int-to-float cast is the identity
/// (rounding is outside the prover's semantics, as in TrainVerify); casts to bool test for
/// non-zero; casts from float to int truncate.
fn convert(ctx: &mut NodeCtx) -> Result<Vec<SymTensor>, ExecError> {
    let x = ctx.tensor("self")?;
    let meta = ctx.out_meta(0)?;
    let from = x.dtype;
    let to = meta.dtype;
    // The prover's integers are exact; a type narrower than `int64` wraps. Arithmetic in it
    // (add, sub, mul) agrees with the exact value modulo its width, so only a cast shows the
    // difference: out of a narrow type (`uint8` 255 + 1 is 0, not 256) or into one (`300` as
    // `uint8` is 44). Such a cast is the value only where every element is shown within both
    // types' ranges; an input's own value (a bare symbol) lies in its type's range already.
    let (tlo, thi) = if to.is_int() {
        int_range(to)
    } else {
        (i64::MIN, i64::MAX)
    };
    let (flo, fhi) = if from.is_int() {
        int_range(from)
    } else {
        (i64::MIN, i64::MAX)
    };
    let (lo, hi) = (tlo.max(flo), thi.min(fhi));
    let source_fits = from.is_int() && tlo <= flo && fhi <= thi;
    if from != to && from != DType::Bool && (lo, hi) != (i64::MIN, i64::MAX) {
        let kept = |e: ExprId| -> bool {
            (source_fits && bare_symbol(ctx.arena, e))
                || super::range::within_interval(ctx.arena, e, lo, hi)
        };
        if !x.elems.iter().all(|&e| kept(e)) {
            return Err(ctx.unsupported(format!(
                "a cast from {from:?} to {to:?} of values not shown within [{lo}, {hi}], where \
                 {} wraps",
                if source_fits { from } else { to }
            )));
        }
    }
    if from == to || to.is_float() || (from == DType::Bool) || (from.is_int() && to.is_int()) {
        return Ok(vec![SymTensor::new(to, x.shape.clone(), x.elems.to_vec())]);
    }
    let elems = if to == DType::Bool {
        x.elems
            .iter()
            .map(|&e| truthy(ctx.arena, e))
            .collect::<Result<Vec<_>, _>>()?
    } else {
        x.elems
            .iter()
            .map(|&e| ctx.arena.app(Func::Named("trunc".into()), vec![e]))
            .collect::<Result<Vec<_>, _>>()?
    };
    Ok(vec![SymTensor::new(to, x.shape.clone(), elems)])
}

/// Whether `e` is one symbol (an input's element as it is, no arithmetic on it).
fn bare_symbol(arena: &Arena, e: ExprId) -> bool {
    match arena.poly(e).terms.as_slice() {
        [(m, c)] if c.is_one() => {
            matches!(m.as_slice(), [(a, 1)] if matches!(arena.atom(*a), crate::expr::Atom::Symbol(_)))
        }
        _ => false,
    }
}

/// Refuses an operand of an integer type narrower than `int64` whose elements are not shown
/// within its range: the prover's sum is exact where the type's wraps (`uint8` 255 + 1 is 0).
/// A ring operation (add, sub, mul, neg) agrees with the exact value modulo the width, so its
/// result may wrap; an operation that is not one (a comparison, a division, a max) reads the
/// wrapped value and must see the exact one. Every rule that reads an operand's order or zero
/// test into a result of the operand's own type calls it (the comparisons, `max`/`min` of all
/// elements or of two tensors, `clamp` and its bounds); a result of another type (`argmax`'s
/// or `topk`'s positions) is refused before the rule by [`widened_operands_exact`].
fn exact_in_its_type(ctx: &NodeCtx, o: &Operand) -> Result<(), ExecError> {
    let Operand::Tensor(t) = o else {
        return Ok(());
    };
    match wrapped_range(ctx.arena, t) {
        None => Ok(()),
        Some((lo, hi)) => Err(ctx.unsupported(format!(
            "{:?} values not shown within [{lo}, {hi}], where the type wraps",
            t.dtype
        ))),
    }
}

/// Refuses a call that reads a narrow integer operand into an output of another type (an
/// implicit promotion: `uint8 + int64` is an `int64`, `where` or `cat` of a `uint8` and an
/// `int64` too) unless the operand's elements are shown within its type: the output holds
/// the wrapped value, which the prover's exact one is not. Within the operand's own type a
/// ring operation's result wraps as the kernel's does, so only a change of type shows it.
pub(crate) fn widened_operands_exact(ctx: &NodeCtx) -> Result<(), ExecError> {
    let outputs: Vec<DType> = (0..ctx.node.outputs.len())
        .filter_map(|i| ctx.out_meta(i).ok().map(|m| m.dtype))
        .collect();
    for v in ctx.node.inputs() {
        let Some(t) = ctx.env[v.node][v.output].as_ref() else {
            continue;
        };
        if outputs.iter().all(|&d| d == t.dtype) {
            continue;
        }
        if let Some((lo, hi)) = wrapped_range(ctx.arena, t) {
            return Err(ctx.unsupported(format!(
                "`{}` ({:?}) values not shown within [{lo}, {hi}] are read into another type, \
                 where {:?} wraps",
                ctx.graph.value_name(v),
                t.dtype,
                t.dtype
            )));
        }
    }
    Ok(())
}

/// Refuses a scalar read against a narrow integer tensor (a comparison's or a clamp's bound)
/// unless it is a constant within the tensor's type: the kernel casts it to that type first
/// (`uint8 > 510` compares with 254), where the prover reads it as it is.
fn scalar_within_its_partner(
    ctx: &NodeCtx,
    partner: &Operand,
    scalar: &Operand,
) -> Result<(), ExecError> {
    let (Operand::Tensor(t), Operand::Scalar(e)) = (partner, scalar) else {
        return Ok(());
    };
    let (lo, hi) = int_range(t.dtype);
    if !t.dtype.is_int() || (lo, hi) == (i64::MIN, i64::MAX) {
        return Ok(());
    }
    let fits = ctx
        .arena
        .as_const(*e)
        .is_some_and(|c| c >= Coeff::from_integer(lo) && c <= Coeff::from_integer(hi));
    if fits {
        return Ok(());
    }
    Err(ctx.unsupported(format!(
        "a scalar not shown within [{lo}, {hi}] read against {:?}, where the kernel casts it \
         to that type",
        t.dtype
    )))
}

/// The range of `t`'s integer type where `t` is narrower than `int64` and some element is not
/// shown within it (neither an input's own element nor of a known interval inside); `None`
/// where every element is its exact value.
pub(crate) fn wrapped_range(arena: &Arena, t: &SymTensor) -> Option<(i64, i64)> {
    let (lo, hi) = int_range(t.dtype);
    if !t.dtype.is_int() || (lo, hi) == (i64::MIN, i64::MAX) {
        return None;
    }
    let exact =
        |e: ExprId| bare_symbol(arena, e) || super::range::within_interval(arena, e, lo, hi);
    if t.elems.iter().all(|&e| exact(e)) {
        None
    } else {
        Some((lo, hi))
    }
}

/// The values an integer type holds (`int64`'s as wide as an `i64`).
fn int_range(d: DType) -> (i64, i64) {
    match d {
        DType::U8 => (0, 255),
        DType::I8 => (-128, 127),
        DType::I16 => (-32_768, 32_767),
        DType::I32 => (i64::from(i32::MIN), i64::from(i32::MAX)),
        _ => (i64::MIN, i64::MAX),
    }
}

/// logsumexp(x) over dims = m + log(sum exp(x - m)), m = max over the same dims (as the
/// kernel computes it, stable).
fn logsumexp(ctx: &mut NodeCtx) -> Result<Vec<SymTensor>, ExecError> {
    let x = ctx.tensor("self")?;
    let dims = reduction_dims(ctx, x.shape.len(), "dim")?;
    let keepdim = ctx.bool_or("keepdim", false)?;
    let out = reduce_by(ctx, &x, &dims, keepdim, &mut |ar, xs| {
        let m = ar.app(Func::Max, xs.to_vec())?;
        let mut exps = Vec::with_capacity(xs.len());
        for &v in xs {
            let d = ar.sub(v, m)?;
            exps.push(ar.app(Func::Exp, vec![d])?);
        }
        let s = ar.sum(&exps)?;
        let l = ar.app(Func::Log, vec![s])?;
        ar.add(m, l)
    })?;
    Ok(vec![out])
}
