//! Elementwise operators: arithmetic, comparisons, unary math, with broadcasting and torch's
//! type promotion.
//!
//! Tensor-tensor overloads also accept a Python number in a tensor slot (`add.Tensor(x, 1)` is
//! common in traced graphs); it then takes part in promotion as a wrapped number, as in torch.
//! Operands are converted to the computation dtype before the kernel runs ([`cast_value`]: exact
//! integers and bools; float values are left for the interpreter to round).

use crate::tensor::cast_value;
use crate::util::{broadcast_indices, broadcast_shapes, map, zip_broadcast};
use crate::{Args, Meta, OpError, Registry, Tensor};
use shardproof_ir::{Arg, DType};
use std::borrow::Cow;
use std::cell::Cell;

/// Where an operand sits in torch's type promotion: dimensioned tensors take precedence over
/// 0-d tensors, which take precedence over Python numbers, unless a lower tier holds a higher
/// category (float over int over bool).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Tier {
    /// A tensor with at least one dim.
    Dim,
    /// A 0-d tensor.
    Zero,
    /// A Python number (bool, int or float).
    Wrapped,
}

/// The promotion-relevant type of one operand.
#[derive(Clone, Debug)]
pub(crate) struct Operand {
    /// Shape and dtype; a wrapped number is 0-d with dtype bool, i64 or f32 (the default dtype).
    pub meta: Meta,
    /// Promotion tier.
    pub tier: Tier,
}

/// torch's `combine_categories`: the higher tier wins unless the lower one is of a higher
/// category.
fn combine(higher: Option<DType>, lower: Option<DType>) -> Option<DType> {
    match (higher, lower) {
        (None, l) => l,
        (Some(h), None) => Some(h),
        (Some(h), Some(l)) => Some(if h.is_float() {
            h
        } else if h == DType::Bool || l.is_float() {
            h.promote(l)
        } else {
            h
        }),
    }
}

/// torch's `result_type` over several operands.
pub(crate) fn promote_operands(ops: &[&Operand]) -> DType {
    let mut state: [Option<DType>; 3] = [None; 3];
    for o in ops {
        let i = match o.tier {
            Tier::Dim => 0,
            Tier::Zero => 1,
            Tier::Wrapped => 2,
        };
        state[i] = Some(state[i].map_or(o.meta.dtype, |d| d.promote(o.meta.dtype)));
    }
    combine(state[0], combine(state[1], state[2])).unwrap_or(DType::F32)
}

/// The operand bound to `name`: a tensor, or a number taking part as a wrapped scalar.
pub(crate) fn operand(a: &Args, name: &str) -> Result<Operand, OpError> {
    let wrapped = |d| Operand {
        meta: Meta::new(d, vec![]),
        tier: Tier::Wrapped,
    };
    match a.get(name) {
        Some(Arg::Value(_)) => {
            let meta = a.meta(name)?;
            let tier = if meta.rank() == 0 {
                Tier::Zero
            } else {
                Tier::Dim
            };
            Ok(Operand { meta, tier })
        }
        Some(Arg::Bool(_)) => Ok(wrapped(DType::Bool)),
        Some(Arg::Int(_)) => Ok(wrapped(DType::I64)),
        Some(Arg::Float(_)) => Ok(wrapped(DType::F32)),
        other => Err(OpError::new(format!(
            "{}: argument `{name}` should be a tensor or a number, got {other:?}",
            a.schema().name
        ))),
    }
}

/// The data of the operand bound to `name`; a number becomes a 0-d tensor holding its exact
/// value (f64 for floats, so that the conversion to the computation dtype rounds only once).
pub(crate) fn operand_tensor<'t>(a: &Args<'t>, name: &str) -> Result<Cow<'t, Tensor>, OpError> {
    match a.get(name) {
        Some(Arg::Value(_)) => Ok(Cow::Borrowed(a.tensor(name)?)),
        Some(Arg::Bool(b)) => Ok(Cow::Owned(Tensor::scalar(DType::Bool, b as i64 as f64))),
        Some(Arg::Int(i)) => Ok(Cow::Owned(Tensor::scalar(DType::I64, i as f64))),
        Some(Arg::Float(f)) => Ok(Cow::Owned(Tensor::scalar(DType::F64, f))),
        other => Err(OpError::new(format!(
            "{}: argument `{name}` should be a tensor or a number, got {other:?}",
            a.schema().name
        ))),
    }
}

/// The promoted dtype and broadcast shape of the named operands.
pub(crate) fn promote_names(a: &Args, names: &[&str]) -> Result<(DType, Vec<usize>), OpError> {
    let ops = names
        .iter()
        .map(|n| operand(a, n))
        .collect::<Result<Vec<_>, _>>()?;
    let mut shape: Vec<usize> = vec![];
    for o in &ops {
        shape = broadcast_shapes(&shape, &o.meta.shape)?;
    }
    let refs: Vec<&Operand> = ops.iter().collect();
    Ok((promote_operands(&refs), shape))
}

/// `t` converted to `dtype` (borrowed when already of that dtype).
pub(crate) fn cast_to(t: Cow<'_, Tensor>, dtype: DType) -> Cow<'_, Tensor> {
    if t.dtype() == dtype {
        t
    } else {
        Cow::Owned(t.cast(dtype))
    }
}

/// Makes the values of a non-float result exact members of its dtype (integer wrap-around, bools
/// as 0/1); float results are left for the interpreter to round.
pub(crate) fn finish(t: Tensor) -> Tensor {
    if t.dtype().is_float() {
        t
    } else {
        let d = t.dtype();
        let data = t.data.iter().map(|&x| cast_value(x, d)).collect();
        Tensor::new(t.meta.clone(), data)
    }
}

/// Applies `f` to broadcast operands, producing data for `out`.
pub(crate) fn apply_n(ins: &[&Tensor], out: &Meta, f: impl Fn(&[f64]) -> f64) -> Tensor {
    let idx: Vec<Option<Vec<usize>>> = ins
        .iter()
        .map(|t| {
            (t.shape() != out.shape.as_slice()).then(|| broadcast_indices(t.shape(), &out.shape))
        })
        .collect();
    let n = out.numel();
    let mut buf = vec![0.0; ins.len()];
    let mut data = Vec::with_capacity(n);
    for k in 0..n {
        for (j, t) in ins.iter().enumerate() {
            buf[j] = t.data[idx[j].as_ref().map_or(k, |v| v[k])];
        }
        data.push(f(&buf));
    }
    Tensor::new(out.clone(), data)
}

/// Evaluates a broadcasting binary op over operands `x` and `y` converted to `compute`.
fn binary(
    a: &Args,
    x: &str,
    y: &str,
    compute: DType,
    out: &Meta,
    f: impl Fn(f64, f64) -> f64,
) -> Result<Tensor, OpError> {
    let xt = cast_to(operand_tensor(a, x)?, compute);
    let yt = cast_to(operand_tensor(a, y)?, compute);
    Ok(finish(zip_broadcast(&xt, &yt, out, f)))
}

/// Like [`binary`] for kernels that can fail on some element (integer division by zero).
fn binary_checked(
    a: &Args,
    x: &str,
    y: &str,
    compute: DType,
    out: &Meta,
    f: impl Fn(f64, f64) -> Option<f64>,
    what: &str,
) -> Result<Tensor, OpError> {
    let failed = Cell::new(false);
    let t = binary(a, x, y, compute, out, |p, q| {
        f(p, q).unwrap_or_else(|| {
            failed.set(true);
            0.0
        })
    })?;
    if failed.get() {
        return Err(OpError::new(format!("{}: {what}", a.schema().name)));
    }
    Ok(t)
}

// ---------------------------------------------------------------------------------------------
// Inference.

/// Output meta of a broadcasting binary op between `self` and `other` (tensors or numbers).
pub(crate) fn infer_binary(a: &Args) -> Result<Vec<Meta>, OpError> {
    let (d, s) = promote_names(a, &["self", "other"])?;
    Ok(vec![Meta::new(d, s)])
}

/// Output meta equal to the input's.
pub(crate) fn infer_same(a: &Args) -> Result<Vec<Meta>, OpError> {
    Ok(vec![a.meta("self")?])
}

/// Output meta of a float-valued unary op: integer and bool inputs give the default dtype.
pub(crate) fn infer_float_unary(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    Ok(vec![Meta::new(float_or_default(m.dtype), m.shape)])
}

/// Output meta of a predicate (bool result, same shape).
fn infer_bool_unary(a: &Args) -> Result<Vec<Meta>, OpError> {
    Ok(vec![Meta::new(DType::Bool, a.meta("self")?.shape)])
}

/// Output meta of a comparison or logical binary op.
fn infer_compare(a: &Args) -> Result<Vec<Meta>, OpError> {
    let (_, s) = promote_names(a, &["self", "other"])?;
    Ok(vec![Meta::new(DType::Bool, s)])
}

/// Output meta of true division: integer results become the default float dtype.
fn infer_true_div(a: &Args) -> Result<Vec<Meta>, OpError> {
    let (d, s) = promote_names(a, &["self", "other"])?;
    Ok(vec![Meta::new(float_or_default(d), s)])
}

/// `div` with an optional rounding mode: true division without one, the promoted dtype with one.
fn infer_div_mode(a: &Args) -> Result<Vec<Meta>, OpError> {
    match rounding_mode(a)? {
        None => infer_true_div(a),
        Some(_) => infer_binary(a),
    }
}

/// Output meta of a binary op that promotes integers to float (`atan2`).
fn infer_float_binary(a: &Args) -> Result<Vec<Meta>, OpError> {
    infer_true_div(a)
}

/// Output meta of `pow`, whose operands are `self` and `exponent`.
fn infer_pow(a: &Args) -> Result<Vec<Meta>, OpError> {
    let (d, s) = promote_names(a, &["self", "exponent"])?;
    Ok(vec![Meta::new(d, s)])
}

/// Output meta of a bitwise op: integer or bool operands only.
fn infer_bitwise(a: &Args) -> Result<Vec<Meta>, OpError> {
    let (d, s) = promote_names(a, &["self", "other"])?;
    if d.is_float() {
        return Err(OpError::new(format!(
            "{}: bitwise operations need integer or bool operands, got {d}",
            a.schema().name
        )));
    }
    Ok(vec![Meta::new(d, s)])
}

/// The dtype itself when float, else the default dtype (f32).
pub(crate) fn float_or_default(d: DType) -> DType {
    if d.is_float() {
        d
    } else {
        DType::F32
    }
}

// ---------------------------------------------------------------------------------------------
// Scalar math helpers matching torch's kernels.

/// torch's `div_floor_floating`: exact floor division of floats (e.g. `1.0 // 0.1 == 9`).
fn floor_div_f(a: f64, b: f64) -> f64 {
    if b == 0.0 {
        return a / b;
    }
    let m = a % b;
    let mut div = (a - m) / b;
    if m != 0.0 && ((b < 0.0) != (m < 0.0)) {
        div -= 1.0;
    }
    if div != 0.0 {
        let mut fd = div.floor();
        if div - fd > 0.5 {
            fd += 1.0;
        }
        fd
    } else {
        0f64.copysign(a / b)
    }
}

/// Integer floor division; `None` on division by zero.
fn floor_div_i(a: i64, b: i64) -> Option<i64> {
    if b == 0 {
        return None;
    }
    let q = a.wrapping_div(b);
    Some(if a.wrapping_rem(b) != 0 && ((a < 0) != (b < 0)) {
        q - 1
    } else {
        q
    })
}

/// Python-style remainder (sign of the divisor) of floats.
fn rem_f(a: f64, b: f64) -> f64 {
    let m = a % b;
    if m != 0.0 && ((b < 0.0) != (m < 0.0)) {
        m + b
    } else {
        m
    }
}

/// Python-style remainder of integers; `None` on division by zero.
fn rem_i(a: i64, b: i64) -> Option<i64> {
    if b == 0 {
        return None;
    }
    let r = a.wrapping_rem(b);
    Some(if r != 0 && ((r < 0) != (b < 0)) {
        r + b
    } else {
        r
    })
}

/// torch's `powi`: integer power with wrap-around; negative exponents give 0 except for bases
/// 1 and -1.
fn pow_i(mut base: i64, mut exp: i64) -> i64 {
    if exp < 0 {
        return match base {
            1 => 1,
            -1 if exp % 2 != 0 => -1,
            -1 => 1,
            _ => 0,
        };
    }
    let mut r: i64 = 1;
    while exp > 0 {
        if exp & 1 == 1 {
            r = r.wrapping_mul(base);
        }
        exp >>= 1;
        base = base.wrapping_mul(base);
    }
    r
}

/// Float power with the special cases torch's kernels compute directly.
fn pow_f(x: f64, e: f64) -> f64 {
    match e {
        _ if e == 2.0 => x * x,
        _ if e == 3.0 => x * x * x,
        _ if e == 0.5 => x.sqrt(),
        _ if e == -0.5 => 1.0 / x.sqrt(),
        _ if e == -1.0 => 1.0 / x,
        _ if e == -2.0 => 1.0 / (x * x),
        _ => x.powf(e),
    }
}

/// The inverse error function: Giles' approximation refined by two Newton steps.
pub fn erfinv(y: f64) -> f64 {
    if y.is_nan() || !(-1.0..=1.0).contains(&y) {
        return f64::NAN;
    }
    if y == 1.0 {
        return f64::INFINITY;
    }
    if y == -1.0 {
        return f64::NEG_INFINITY;
    }
    let w = -((1.0 - y) * (1.0 + y)).ln();
    let mut x = if w < 5.0 {
        let w = w - 2.5;
        let mut p = 2.810_226_36e-08;
        for c in [
            3.432_739_39e-07,
            -3.523_387_7e-06,
            -4.391_506_54e-06,
            0.000_218_580_87,
            -0.001_253_725_03,
            -0.004_177_681_64,
            0.246_640_727,
            1.501_409_41,
        ] {
            p = c + p * w;
        }
        p * y
    } else {
        let w = w.sqrt() - 3.0;
        let mut p = -0.000_200_214_257;
        for c in [
            0.000_100_950_558,
            0.001_349_343_22,
            -0.003_673_428_44,
            0.005_739_507_73,
            -0.007_622_461_3,
            0.009_438_870_47,
            1.001_674_06,
            2.832_976_82,
        ] {
            p = c + p * w;
        }
        p * y
    };
    for _ in 0..2 {
        let err = libm::erf(x) - y;
        x -= err / (std::f64::consts::FRAC_2_SQRT_PI * (-x * x).exp());
    }
    x
}

/// The largest finite value of a float dtype (for `nan_to_num`).
fn max_finite(d: DType) -> f64 {
    match d {
        DType::F64 => f64::MAX,
        DType::F32 => f32::MAX as f64,
        DType::Bf16 => half::bf16::MAX.to_f64(),
        DType::F16 => half::f16::MAX.to_f64(),
        DType::F8e4m3 => 448.0,
        DType::F8e5m2 => 57344.0,
        _ => f64::MAX,
    }
}

// ---------------------------------------------------------------------------------------------
// Kernels shared by several overloads.

/// `self + alpha * other` (and `sub`, `rsub` through the sign and operand order).
fn add_kernel(a: &Args, m: &Meta, x: &str, y: &str, sign: f64) -> Result<Tensor, OpError> {
    let alpha = a.float("alpha")?;
    if !m.dtype.is_float() && a.scalar_is_float("alpha") {
        return Err(OpError::new(format!(
            "{}: for integral input tensors, argument alpha must not be a floating point number",
            a.schema().name
        )));
    }
    let s = sign * alpha;
    binary(a, x, y, m.dtype, m, |p, q| p + s * q)
}

/// Torch refuses subtraction involving bool tensors.
fn check_no_bool_sub(a: &Args, names: &[&str]) -> Result<(), OpError> {
    for n in names {
        if operand(a, n)?.meta.dtype == DType::Bool {
            return Err(OpError::new(format!(
                "{}: subtraction with a bool tensor is not supported; use `~` or logical_not()",
                a.schema().name
            )));
        }
    }
    Ok(())
}

/// Infers the output of `sub`/`rsub`, rejecting bools.
fn infer_sub(a: &Args) -> Result<Vec<Meta>, OpError> {
    check_no_bool_sub(a, &["self", "other"])?;
    infer_binary(a)
}

/// The optional rounding mode of `div`: `None`, `trunc` or `floor`.
fn rounding_mode(a: &Args) -> Result<Option<String>, OpError> {
    match a.get("rounding_mode") {
        None => Ok(None),
        Some(Arg::Str(s)) if s == "trunc" || s == "floor" => Ok(Some(s)),
        Some(other) => Err(OpError::new(format!(
            "{}: rounding_mode must be None, 'trunc' or 'floor', got {other:?}",
            a.schema().name
        ))),
    }
}

/// Division with an optional rounding mode.
fn div_kernel(a: &Args, m: &Meta, mode: Option<&str>) -> Result<Tensor, OpError> {
    let d = m.dtype;
    match mode {
        None => binary(a, "self", "other", d, m, |x, y| x / y),
        Some(mode) if !d.is_float() => {
            let floor = mode == "floor";
            binary_checked(
                a,
                "self",
                "other",
                d,
                m,
                |x, y| {
                    let (x, y) = (x as i64, y as i64);
                    if floor {
                        floor_div_i(x, y).map(|q| q as f64)
                    } else {
                        (y != 0).then(|| x.wrapping_div(y) as f64)
                    }
                },
                "integer division by zero",
            )
        }
        Some("floor") => binary(a, "self", "other", d, m, floor_div_f),
        Some(_) => binary(a, "self", "other", d, m, |x, y| (x / y).trunc()),
    }
}

/// Python-style remainder.
fn remainder_kernel(a: &Args, m: &Meta) -> Result<Tensor, OpError> {
    if m.dtype.is_float() {
        binary(a, "self", "other", m.dtype, m, rem_f)
    } else {
        binary_checked(
            a,
            "self",
            "other",
            m.dtype,
            m,
            |x, y| rem_i(x as i64, y as i64).map(|r| r as f64),
            "integer division by zero in remainder",
        )
    }
}

/// C-style remainder (sign of the dividend).
fn fmod_kernel(a: &Args, m: &Meta) -> Result<Tensor, OpError> {
    if m.dtype.is_float() {
        binary(a, "self", "other", m.dtype, m, |x, y| x % y)
    } else {
        binary_checked(
            a,
            "self",
            "other",
            m.dtype,
            m,
            |x, y| {
                let (x, y) = (x as i64, y as i64);
                (y != 0).then(|| x.wrapping_rem(y) as f64)
            },
            "integer division by zero in fmod",
        )
    }
}

/// `self ** exponent` in the output dtype.
fn pow_kernel(a: &Args, m: &Meta) -> Result<Tensor, OpError> {
    if m.dtype.is_float() {
        binary(a, "self", "exponent", m.dtype, m, pow_f)
    } else {
        binary(a, "self", "exponent", m.dtype, m, |x, e| {
            pow_i(x as i64, e as i64) as f64
        })
    }
}

/// A comparison: operands converted to their promoted dtype, then compared.
fn compare(a: &Args, m: &Meta, f: fn(f64, f64) -> bool) -> Result<Vec<Tensor>, OpError> {
    let (d, _) = promote_names(a, &["self", "other"])?;
    let xt = cast_to(operand_tensor(a, "self")?, d);
    let yt = cast_to(operand_tensor(a, "other")?, d);
    Ok(vec![zip_broadcast(&xt, &yt, m, |x, y| {
        f(x, y) as i64 as f64
    })])
}

/// A logical binary op on truthiness.
fn logical(a: &Args, m: &Meta, f: fn(bool, bool) -> bool) -> Result<Vec<Tensor>, OpError> {
    let xt = operand_tensor(a, "self")?;
    let yt = operand_tensor(a, "other")?;
    Ok(vec![zip_broadcast(&xt, &yt, m, |x, y| {
        f(x != 0.0, y != 0.0) as i64 as f64
    })])
}

/// A bitwise binary op on the integer values.
fn bitwise(a: &Args, m: &Meta, f: fn(i64, i64) -> i64) -> Result<Vec<Tensor>, OpError> {
    Ok(vec![binary(a, "self", "other", m.dtype, m, |x, y| {
        f(x as i64, y as i64) as f64
    })?])
}

/// A float-valued unary op, computed on the input converted to the output dtype.
fn float_unary(a: &Args, m: &Meta, f: fn(f64) -> f64) -> Result<Vec<Tensor>, OpError> {
    let x = cast_to(Cow::Borrowed(a.tensor("self")?), m.dtype);
    Ok(vec![map(&x, m, f)])
}

/// A dtype-preserving unary op.
fn same_unary(a: &Args, m: &Meta, f: fn(f64) -> f64) -> Result<Vec<Tensor>, OpError> {
    Ok(vec![finish(map(a.tensor("self")?, m, f))])
}

/// Output meta of a dtype-preserving op that torch does not define on bools (`neg`, `abs`).
fn infer_same_no_bool(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    if m.dtype == DType::Bool {
        return Err(OpError::new(format!(
            "{} is not defined on bool tensors",
            a.schema().name
        )));
    }
    Ok(vec![m])
}

/// Output meta of an op defined on floats only (`frac`, `round.decimals`).
fn infer_same_float_only(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    if !m.dtype.is_float() {
        return Err(OpError::new(format!(
            "{} is only defined on float tensors, got {}",
            a.schema().name,
            m.dtype
        )));
    }
    Ok(vec![m])
}

/// `min(max(x, lo), hi)`; a NaN input or bound gives NaN, as torch's (vectorized) clamp.
fn clamp_value(x: f64, lo: Option<f64>, hi: Option<f64>) -> f64 {
    if x.is_nan() || lo.is_some_and(f64::is_nan) || hi.is_some_and(f64::is_nan) {
        return f64::NAN;
    }
    let mut v = x;
    if let Some(l) = lo {
        v = v.max(l);
    }
    if let Some(h) = hi {
        v = v.min(h);
    }
    v
}

/// Output meta of the scalar clamps: the bounds take part in promotion of integer inputs.
fn infer_clamp_scalar(a: &Args) -> Result<Vec<Meta>, OpError> {
    let names = clamp_names(a);
    if names.len() == 1 {
        return Err(OpError::new(
            "torch.clamp: at least one of 'min' or 'max' must not be None",
        ));
    }
    let (d, s) = promote_names(a, &names)?;
    Ok(vec![Meta::new(d, s)])
}

/// `self` and the bounds given to a clamp.
fn clamp_names(a: &Args) -> Vec<&'static str> {
    let mut names = vec!["self"];
    for n in ["min", "max"] {
        if a.schema().index_of(n).is_some() && a.get(n).is_some() {
            names.push(n);
        }
    }
    names
}

/// Clamp with tensor or scalar bounds, broadcast together and converted to the output dtype.
fn clamp_kernel(a: &Args, m: &Meta) -> Result<Vec<Tensor>, OpError> {
    let names = clamp_names(a);
    let ts = names
        .iter()
        .map(|n| operand_tensor(a, n).map(|t| cast_to(t, m.dtype)))
        .collect::<Result<Vec<_>, _>>()?;
    let refs: Vec<&Tensor> = ts.iter().map(|t| t.as_ref()).collect();
    let has_min = names.contains(&"min");
    let has_max = names.contains(&"max");
    let hi_at = if has_min { 2 } else { 1 };
    let t = apply_n(&refs, m, |v| {
        let lo = has_min.then(|| v[1]);
        let hi = has_max.then(|| v[hi_at]);
        clamp_value(v[0], lo, hi)
    });
    Ok(vec![finish(t)])
}

/// Output meta of `where`: promoted branches, broadcast with the condition.
fn infer_where(a: &Args) -> Result<Vec<Meta>, OpError> {
    let c = a.meta("condition")?;
    if c.dtype != DType::Bool {
        return Err(OpError::new(format!(
            "where expected condition to be a boolean tensor, got {}",
            c.dtype
        )));
    }
    let (d, s) = promote_names(a, &["self", "other"])?;
    Ok(vec![Meta::new(d, broadcast_shapes(&c.shape, &s)?)])
}

/// `condition ? self : other`.
fn where_kernel(a: &Args, m: &Meta) -> Result<Vec<Tensor>, OpError> {
    let c = a.tensor("condition")?;
    let x = cast_to(operand_tensor(a, "self")?, m.dtype);
    let y = cast_to(operand_tensor(a, "other")?, m.dtype);
    Ok(vec![apply_n(&[c, &x, &y], m, |v| {
        if v[0] != 0.0 {
            v[1]
        } else {
            v[2]
        }
    })])
}

/// Output meta of `masked_fill`: `self`'s dtype, broadcast with the mask.
fn infer_masked_fill(a: &Args) -> Result<Vec<Meta>, OpError> {
    let (x, mask) = (a.meta("self")?, a.meta("mask")?);
    if mask.dtype != DType::Bool {
        return Err(OpError::new(format!(
            "masked_fill only supports boolean masks, got {}",
            mask.dtype
        )));
    }
    if let Some(v) = a.opt_meta_if_tensor("value")? {
        if v.rank() != 0 {
            return Err(OpError::new(format!(
                "masked_fill only supports a 0-dimensional value tensor, got {} dims",
                v.rank()
            )));
        }
    }
    Ok(vec![Meta::new(
        x.dtype,
        broadcast_shapes(&x.shape, &mask.shape)?,
    )])
}

/// Fills `self` where `mask` holds with `value` (a number or a 0-d tensor).
fn masked_fill_kernel(a: &Args, m: &Meta) -> Result<Vec<Tensor>, OpError> {
    let x = a.tensor("self")?;
    let mask = a.tensor("mask")?;
    let v = cast_value(operand_tensor(a, "value")?.data[0], m.dtype);
    Ok(vec![apply_n(&[x, mask], m, |e| {
        if e[1] != 0.0 {
            v
        } else {
            e[0]
        }
    })])
}

/// Extension of [`Args`] for arguments that may be a tensor or a number.
trait OptMetaIfTensor {
    /// The meta of the argument when it is a tensor, `None` when it is a number or absent.
    fn opt_meta_if_tensor(&self, name: &str) -> Result<Option<Meta>, OpError>;
}

impl OptMetaIfTensor for Args<'_> {
    fn opt_meta_if_tensor(&self, name: &str) -> Result<Option<Meta>, OpError> {
        match self.get(name) {
            Some(Arg::Value(_)) => self.opt_meta(name),
            _ => Ok(None),
        }
    }
}

/// Output meta of the ternary arithmetic ops (`addcmul`, `addcdiv`, `lerp`).
fn infer_ternary(a: &Args, names: &[&str]) -> Result<Vec<Meta>, OpError> {
    let (d, s) = promote_names(a, names)?;
    Ok(vec![Meta::new(d, s)])
}

/// Evaluates a ternary op over the named operands converted to the output dtype.
fn ternary(
    a: &Args,
    m: &Meta,
    names: [&str; 3],
    f: impl Fn(f64, f64, f64) -> f64,
) -> Result<Vec<Tensor>, OpError> {
    let ts = names
        .iter()
        .map(|n| operand_tensor(a, n).map(|t| cast_to(t, m.dtype)))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(vec![finish(apply_n(&[&ts[0], &ts[1], &ts[2]], m, |v| {
        f(v[0], v[1], v[2])
    }))])
}

/// torch's `lerp`, written to be exact at both ends.
fn lerp(s: f64, e: f64, w: f64) -> f64 {
    if w.abs() < 0.5 {
        s + w * (e - s)
    } else {
        e - (e - s) * (1.0 - w)
    }
}

macro_rules! float_unary {
    ($r:expr, $name:literal, $f:expr) => {
        $r.pure(
            concat!("aten.", $name, ".default"),
            concat!($name, "(Tensor self) -> Tensor"),
            infer_float_unary,
            |a, m, _| float_unary(a, &m[0], $f),
        )
    };
}

macro_rules! same_unary {
    ($r:expr, $name:literal, $infer:expr, $f:expr) => {
        $r.pure(
            concat!("aten.", $name, ".default"),
            concat!($name, "(Tensor self) -> Tensor"),
            $infer,
            |a, m, _| same_unary(a, &m[0], $f),
        )
    };
}

/// Registers a broadcasting binary op over `self` and `other`, computed in the promoted dtype.
macro_rules! binary_op {
    ($r:expr, $name:literal, $schema:literal, $f:expr) => {
        $r.pure($name, $schema, infer_binary, |a, m, _| {
            Ok(vec![binary(a, "self", "other", m[0].dtype, &m[0], $f)?])
        })
    };
}

/// -1, 0 or 1 by the sign of `x`; 0 for NaN, as torch.
fn sign(x: f64) -> f64 {
    if x > 0.0 {
        1.0
    } else if x < 0.0 {
        -1.0
    } else {
        0.0
    }
}

/// `maximum`: NaN if either operand is NaN (unlike `fmax`).
fn max_nan(x: f64, y: f64) -> f64 {
    if x.is_nan() || y.is_nan() {
        f64::NAN
    } else {
        x.max(y)
    }
}

/// `minimum`: NaN if either operand is NaN (unlike `fmin`).
fn min_nan(x: f64, y: f64) -> f64 {
    if x.is_nan() || y.is_nan() {
        f64::NAN
    } else {
        x.min(y)
    }
}

/// Registers an elementwise predicate: a bool tensor of the input's shape.
macro_rules! predicate {
    ($r:expr, $name:literal, $f:expr) => {
        $r.pure(
            concat!("aten.", $name, ".default"),
            concat!($name, "(Tensor self) -> Tensor"),
            infer_bool_unary,
            |a, m, _| {
                let f: fn(f64) -> bool = $f;
                Ok(vec![map(a.tensor("self")?, &m[0], |x| f(x) as i64 as f64)])
            },
        )
    };
}

macro_rules! compare {
    ($r:expr, $name:literal, $f:expr) => {
        $r.pure(
            concat!("aten.", $name, ".Tensor"),
            concat!($name, ".Tensor(Tensor self, Tensor other) -> Tensor"),
            infer_compare,
            |a, m, _| compare(a, &m[0], $f),
        );
        $r.pure(
            concat!("aten.", $name, ".Scalar"),
            concat!($name, ".Scalar(Tensor self, Scalar other) -> Tensor"),
            infer_compare,
            |a, m, _| compare(a, &m[0], $f),
        );
    };
}

macro_rules! bitwise {
    ($r:expr, $name:literal, $f:expr) => {
        $r.pure(
            concat!("aten.", $name, ".Tensor"),
            concat!($name, ".Tensor(Tensor self, Tensor other) -> Tensor"),
            infer_bitwise,
            |a, m, _| bitwise(a, &m[0], $f),
        );
        $r.pure(
            concat!("aten.", $name, ".Scalar"),
            concat!($name, ".Scalar(Tensor self, Scalar other) -> Tensor"),
            infer_bitwise,
            |a, m, _| bitwise(a, &m[0], $f),
        );
    };
}

/// Registers the elementwise family.
pub(crate) fn register(r: &mut Registry) {
    register_arith(r);
    register_unary(r);
    register_compare(r);
    register_select(r);
}

/// Arithmetic: add, sub, mul, div, remainder, pow and friends.
fn register_arith(r: &mut Registry) {
    r.pure(
        "aten.add.Tensor",
        "add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",
        infer_binary,
        |a, m, _| Ok(vec![add_kernel(a, &m[0], "self", "other", 1.0)?]),
    );
    r.pure(
        "aten.add.Scalar",
        "add.Scalar(Tensor self, Scalar other, Scalar alpha=1) -> Tensor",
        infer_binary,
        |a, m, _| Ok(vec![add_kernel(a, &m[0], "self", "other", 1.0)?]),
    );
    r.pure(
        "aten.sub.Tensor",
        "sub.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",
        infer_sub,
        |a, m, _| Ok(vec![add_kernel(a, &m[0], "self", "other", -1.0)?]),
    );
    r.pure(
        "aten.sub.Scalar",
        "sub.Scalar(Tensor self, Scalar other, Scalar alpha=1) -> Tensor",
        infer_sub,
        |a, m, _| Ok(vec![add_kernel(a, &m[0], "self", "other", -1.0)?]),
    );
    r.pure(
        "aten.rsub.Tensor",
        "rsub.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",
        infer_sub,
        |a, m, _| Ok(vec![add_kernel(a, &m[0], "other", "self", -1.0)?]),
    );
    r.pure(
        "aten.rsub.Scalar",
        "rsub.Scalar(Tensor self, Scalar other, Scalar alpha=1) -> Tensor",
        infer_sub,
        |a, m, _| Ok(vec![add_kernel(a, &m[0], "other", "self", -1.0)?]),
    );
    binary_op!(
        r,
        "aten.mul.Tensor",
        "mul.Tensor(Tensor self, Tensor other) -> Tensor",
        |x, y| x * y
    );
    binary_op!(
        r,
        "aten.mul.Scalar",
        "mul.Scalar(Tensor self, Scalar other) -> Tensor",
        |x, y| x * y
    );
    r.pure(
        "aten.div.Tensor",
        "div.Tensor(Tensor self, Tensor other) -> Tensor",
        infer_true_div,
        |a, m, _| Ok(vec![div_kernel(a, &m[0], None)?]),
    );
    r.pure(
        "aten.div.Scalar",
        "div.Scalar(Tensor self, Scalar other) -> Tensor",
        infer_true_div,
        |a, m, _| Ok(vec![div_kernel(a, &m[0], None)?]),
    );
    r.pure(
        "aten.div.Tensor_mode",
        "div.Tensor_mode(Tensor self, Tensor other, *, str? rounding_mode) -> Tensor",
        infer_div_mode,
        |a, m, _| Ok(vec![div_kernel(a, &m[0], rounding_mode(a)?.as_deref())?]),
    );
    r.pure(
        "aten.div.Scalar_mode",
        "div.Scalar_mode(Tensor self, Scalar other, *, str? rounding_mode) -> Tensor",
        infer_div_mode,
        |a, m, _| Ok(vec![div_kernel(a, &m[0], rounding_mode(a)?.as_deref())?]),
    );
    r.pure(
        "aten.floor_divide.default",
        "floor_divide(Tensor self, Tensor other) -> Tensor",
        infer_binary,
        |a, m, _| Ok(vec![div_kernel(a, &m[0], Some("floor"))?]),
    );
    r.pure(
        "aten.floor_divide.Scalar",
        "floor_divide.Scalar(Tensor self, Scalar other) -> Tensor",
        infer_binary,
        |a, m, _| Ok(vec![div_kernel(a, &m[0], Some("floor"))?]),
    );
    r.pure(
        "aten.remainder.Tensor",
        "remainder.Tensor(Tensor self, Tensor other) -> Tensor",
        infer_binary,
        |a, m, _| Ok(vec![remainder_kernel(a, &m[0])?]),
    );
    r.pure(
        "aten.remainder.Scalar",
        "remainder.Scalar(Tensor self, Scalar other) -> Tensor",
        infer_binary,
        |a, m, _| Ok(vec![remainder_kernel(a, &m[0])?]),
    );
    r.pure(
        "aten.remainder.Scalar_Tensor",
        "remainder.Scalar_Tensor(Scalar self, Tensor other) -> Tensor",
        infer_binary,
        |a, m, _| Ok(vec![remainder_kernel(a, &m[0])?]),
    );
    r.pure(
        "aten.fmod.Tensor",
        "fmod.Tensor(Tensor self, Tensor other) -> Tensor",
        infer_binary,
        |a, m, _| Ok(vec![fmod_kernel(a, &m[0])?]),
    );
    r.pure(
        "aten.fmod.Scalar",
        "fmod.Scalar(Tensor self, Scalar other) -> Tensor",
        infer_binary,
        |a, m, _| Ok(vec![fmod_kernel(a, &m[0])?]),
    );
    r.pure(
        "aten.pow.Tensor_Tensor",
        "pow.Tensor_Tensor(Tensor self, Tensor exponent) -> Tensor",
        infer_pow,
        |a, m, _| Ok(vec![pow_kernel(a, &m[0])?]),
    );
    r.pure(
        "aten.pow.Tensor_Scalar",
        "pow.Tensor_Scalar(Tensor self, Scalar exponent) -> Tensor",
        |a| {
            let x = a.meta("self")?;
            if !x.dtype.is_float() && matches!(a.get("exponent"), Some(Arg::Int(e)) if e < 0) {
                return Err(OpError::new(
                    "Integers to negative integer powers are not allowed.",
                ));
            }
            infer_pow(a)
        },
        |a, m, _| Ok(vec![pow_kernel(a, &m[0])?]),
    );
    r.pure(
        "aten.pow.Scalar",
        "pow.Scalar(Scalar self, Tensor exponent) -> Tensor",
        infer_pow,
        |a, m, _| Ok(vec![pow_kernel(a, &m[0])?]),
    );
    r.pure(
        "aten.atan2.default",
        "atan2(Tensor self, Tensor other) -> Tensor",
        infer_float_binary,
        |a, m, _| {
            Ok(vec![binary(
                a,
                "self",
                "other",
                m[0].dtype,
                &m[0],
                f64::atan2,
            )?])
        },
    );
    binary_op!(
        r,
        "aten.maximum.default",
        "maximum(Tensor self, Tensor other) -> Tensor",
        max_nan
    );
    binary_op!(
        r,
        "aten.max.other",
        "max.other(Tensor self, Tensor other) -> Tensor",
        max_nan
    );
    binary_op!(
        r,
        "aten.minimum.default",
        "minimum(Tensor self, Tensor other) -> Tensor",
        min_nan
    );
    binary_op!(
        r,
        "aten.min.other",
        "min.other(Tensor self, Tensor other) -> Tensor",
        min_nan
    );
    binary_op!(
        r,
        "aten.fmax.default",
        "fmax(Tensor self, Tensor other) -> Tensor",
        f64::max
    );
    binary_op!(
        r,
        "aten.fmin.default",
        "fmin(Tensor self, Tensor other) -> Tensor",
        f64::min
    );
    r.pure(
        "aten.addcmul.default",
        "addcmul(Tensor self, Tensor tensor1, Tensor tensor2, *, Scalar value=1) -> Tensor",
        |a| infer_ternary(a, &["self", "tensor1", "tensor2"]),
        |a, m, _| {
            let v = a.float("value")?;
            ternary(a, &m[0], ["self", "tensor1", "tensor2"], |s, x, y| {
                s + v * x * y
            })
        },
    );
    r.pure(
        "aten.addcdiv.default",
        "addcdiv(Tensor self, Tensor tensor1, Tensor tensor2, *, Scalar value=1) -> Tensor",
        |a| {
            let out = infer_ternary(a, &["self", "tensor1", "tensor2"])?;
            if !out[0].dtype.is_float() {
                return Err(OpError::new(
                    "addcdiv: integer division of tensors is not supported; use a float tensor",
                ));
            }
            Ok(out)
        },
        |a, m, _| {
            let v = a.float("value")?;
            ternary(a, &m[0], ["self", "tensor1", "tensor2"], |s, x, y| {
                s + v * x / y
            })
        },
    );
    r.pure(
        "aten.lerp.Scalar",
        "lerp.Scalar(Tensor self, Tensor end, Scalar weight) -> Tensor",
        |a| infer_ternary(a, &["self", "end"]),
        |a, m, _| {
            let w = a.float("weight")?;
            let s = cast_to(operand_tensor(a, "self")?, m[0].dtype);
            let e = cast_to(operand_tensor(a, "end")?, m[0].dtype);
            Ok(vec![zip_broadcast(&s, &e, &m[0], |s, e| lerp(s, e, w))])
        },
    );
    r.pure(
        "aten.lerp.Tensor",
        "lerp.Tensor(Tensor self, Tensor end, Tensor weight) -> Tensor",
        |a| infer_ternary(a, &["self", "end", "weight"]),
        |a, m, _| ternary(a, &m[0], ["self", "end", "weight"], lerp),
    );
}

/// Unary math, predicates and fills.
fn register_unary(r: &mut Registry) {
    same_unary!(r, "neg", infer_same_no_bool, |x| -x);
    same_unary!(r, "abs", infer_same_no_bool, f64::abs);
    same_unary!(r, "sign", infer_same, sign);
    same_unary!(r, "sgn", infer_same, sign);
    same_unary!(r, "floor", infer_same, f64::floor);
    same_unary!(r, "ceil", infer_same, f64::ceil);
    same_unary!(r, "round", infer_same, f64::round_ties_even);
    same_unary!(r, "trunc", infer_same, f64::trunc);
    same_unary!(r, "fix", infer_same, f64::trunc);
    same_unary!(r, "frac", infer_same_float_only, |x| x - x.trunc());
    r.pure(
        "aten.round.decimals",
        "round.decimals(Tensor self, *, int decimals) -> Tensor",
        infer_same_float_only,
        |a, m, _| {
            let d = a.int("decimals")?;
            let p = 10f64.powi(d.unsigned_abs().min(400) as i32);
            let f = move |x: f64| {
                if d >= 0 {
                    (x * p).round_ties_even() / p
                } else {
                    (x / p).round_ties_even() * p
                }
            };
            Ok(vec![map(a.tensor("self")?, &m[0], f)])
        },
    );
    float_unary!(r, "exp", f64::exp);
    float_unary!(r, "exp2", f64::exp2);
    float_unary!(r, "expm1", f64::exp_m1);
    float_unary!(r, "log", f64::ln);
    float_unary!(r, "log2", f64::log2);
    float_unary!(r, "log10", f64::log10);
    float_unary!(r, "log1p", f64::ln_1p);
    float_unary!(r, "sqrt", f64::sqrt);
    float_unary!(r, "rsqrt", |x| 1.0 / x.sqrt());
    float_unary!(r, "reciprocal", |x| 1.0 / x);
    float_unary!(r, "sin", f64::sin);
    float_unary!(r, "cos", f64::cos);
    float_unary!(r, "tan", f64::tan);
    float_unary!(r, "asin", f64::asin);
    float_unary!(r, "acos", f64::acos);
    float_unary!(r, "atan", f64::atan);
    float_unary!(r, "sinh", f64::sinh);
    float_unary!(r, "cosh", f64::cosh);
    float_unary!(r, "tanh", f64::tanh);
    float_unary!(r, "asinh", f64::asinh);
    float_unary!(r, "acosh", f64::acosh);
    float_unary!(r, "atanh", f64::atanh);
    float_unary!(r, "sigmoid", |x| 1.0 / (1.0 + (-x).exp()));
    float_unary!(r, "erf", libm::erf);
    float_unary!(r, "erfc", libm::erfc);
    float_unary!(r, "erfinv", erfinv);
    predicate!(r, "isnan", f64::is_nan);
    predicate!(r, "isinf", f64::is_infinite);
    predicate!(r, "isfinite", f64::is_finite);
    predicate!(r, "isposinf", |x| x == f64::INFINITY);
    predicate!(r, "isneginf", |x| x == f64::NEG_INFINITY);
    predicate!(r, "logical_not", |x| x == 0.0);
    r.pure(
        "aten.bitwise_not.default",
        "bitwise_not(Tensor self) -> Tensor",
        |a| {
            let m = a.meta("self")?;
            if m.dtype.is_float() {
                return Err(OpError::new(format!(
                    "bitwise_not needs an integer or bool tensor, got {}",
                    m.dtype
                )));
            }
            Ok(vec![m])
        },
        |a, m, _| {
            let t = a.tensor("self")?;
            Ok(vec![if m[0].dtype == DType::Bool {
                map(t, &m[0], |x| (x == 0.0) as i64 as f64)
            } else {
                finish(map(t, &m[0], |x| !(x as i64) as f64))
            }])
        },
    );
    r.pure(
        "aten.nan_to_num.default",
        "nan_to_num(Tensor self, float? nan=None, float? posinf=None, float? neginf=None) -> Tensor",
        infer_same,
        |a, m, _| {
            let t = a.tensor("self")?;
            if !m[0].dtype.is_float() {
                return Ok(vec![t.clone()]);
            }
            let big = max_finite(m[0].dtype);
            let nan = a.opt_float("nan")?.unwrap_or(0.0);
            let pos = a.opt_float("posinf")?.unwrap_or(big);
            let neg = a.opt_float("neginf")?.unwrap_or(-big);
            Ok(vec![map(t, &m[0], |x| {
                if x.is_nan() {
                    nan
                } else if x == f64::INFINITY {
                    pos
                } else if x == f64::NEG_INFINITY {
                    neg
                } else {
                    x
                }
            })])
        },
    );
    r.pure(
        "aten.fill.Scalar",
        "fill.Scalar(Tensor self, Scalar value) -> Tensor",
        infer_same,
        |a, m, _| {
            let v = cast_value(a.float("value")?, m[0].dtype);
            Ok(vec![Tensor::full(m[0].dtype, m[0].shape.clone(), v)])
        },
    );
    r.pure(
        "aten.fill.Tensor",
        "fill.Tensor(Tensor self, Tensor value) -> Tensor",
        |a| {
            let v = a.meta("value")?;
            if v.rank() != 0 {
                return Err(OpError::new(format!(
                    "fill only supports a 0-dimensional value tensor, got {} dims",
                    v.rank()
                )));
            }
            infer_same(a)
        },
        |a, m, _| {
            let v = cast_value(a.tensor("value")?.data[0], m[0].dtype);
            Ok(vec![Tensor::full(m[0].dtype, m[0].shape.clone(), v)])
        },
    );
}

/// Comparisons, logical and bitwise ops.
fn register_compare(r: &mut Registry) {
    compare!(r, "eq", |x, y| x == y);
    compare!(r, "ne", |x, y| x != y);
    compare!(r, "lt", |x, y| x < y);
    compare!(r, "le", |x, y| x <= y);
    compare!(r, "gt", |x, y| x > y);
    compare!(r, "ge", |x, y| x >= y);
    r.pure(
        "aten.logical_and.default",
        "logical_and(Tensor self, Tensor other) -> Tensor",
        infer_compare,
        |a, m, _| logical(a, &m[0], |x, y| x && y),
    );
    r.pure(
        "aten.logical_or.default",
        "logical_or(Tensor self, Tensor other) -> Tensor",
        infer_compare,
        |a, m, _| logical(a, &m[0], |x, y| x || y),
    );
    r.pure(
        "aten.logical_xor.default",
        "logical_xor(Tensor self, Tensor other) -> Tensor",
        infer_compare,
        |a, m, _| logical(a, &m[0], |x, y| x != y),
    );
    bitwise!(r, "bitwise_and", |x, y| x & y);
    bitwise!(r, "bitwise_or", |x, y| x | y);
    bitwise!(r, "bitwise_xor", |x, y| x ^ y);
    // `a | b`, `a & b`, `a ^ b` on tensors: the same operators under their Python names.
    bitwise!(r, "__or__", |x, y| x | y);
    bitwise!(r, "__and__", |x, y| x & y);
    bitwise!(r, "__xor__", |x, y| x ^ y);
}

/// Selection: clamp, where, masked_fill.
fn register_select(r: &mut Registry) {
    r.pure(
        "aten.clamp.default",
        "clamp(Tensor self, Scalar? min=None, Scalar? max=None) -> Tensor",
        infer_clamp_scalar,
        |a, m, _| clamp_kernel(a, &m[0]),
    );
    r.pure(
        "aten.clamp.Tensor",
        "clamp.Tensor(Tensor self, Tensor? min=None, Tensor? max=None) -> Tensor",
        infer_clamp_scalar,
        |a, m, _| clamp_kernel(a, &m[0]),
    );
    r.pure(
        "aten.clamp_min.default",
        "clamp_min(Tensor self, Scalar min) -> Tensor",
        infer_clamp_scalar,
        |a, m, _| clamp_kernel(a, &m[0]),
    );
    r.pure(
        "aten.clamp_min.Tensor",
        "clamp_min.Tensor(Tensor self, Tensor min) -> Tensor",
        infer_clamp_scalar,
        |a, m, _| clamp_kernel(a, &m[0]),
    );
    r.pure(
        "aten.clamp_max.default",
        "clamp_max(Tensor self, Scalar max) -> Tensor",
        infer_clamp_scalar,
        |a, m, _| clamp_kernel(a, &m[0]),
    );
    r.pure(
        "aten.clamp_max.Tensor",
        "clamp_max.Tensor(Tensor self, Tensor max) -> Tensor",
        infer_clamp_scalar,
        |a, m, _| clamp_kernel(a, &m[0]),
    );
    for (name, schema) in [
        (
            "aten.where.self",
            "where.self(Tensor condition, Tensor self, Tensor other) -> Tensor",
        ),
        (
            "aten.where.ScalarSelf",
            "where.ScalarSelf(Tensor condition, Scalar self, Tensor other) -> Tensor",
        ),
        (
            "aten.where.ScalarOther",
            "where.ScalarOther(Tensor condition, Tensor self, Scalar other) -> Tensor",
        ),
        (
            "aten.where.Scalar",
            "where.Scalar(Tensor condition, Scalar self, Scalar other) -> Tensor",
        ),
    ] {
        r.pure(name, schema, infer_where, |a, m, _| where_kernel(a, &m[0]));
    }
    r.pure(
        "aten.masked_fill.Scalar",
        "masked_fill.Scalar(Tensor self, Tensor mask, Scalar value) -> Tensor",
        infer_masked_fill,
        |a, m, _| masked_fill_kernel(a, &m[0]),
    );
    r.pure(
        "aten.masked_fill.Tensor",
        "masked_fill.Tensor(Tensor self, Tensor mask, Tensor value) -> Tensor",
        infer_masked_fill,
        |a, m, _| masked_fill_kernel(a, &m[0]),
    );
}

#[cfg(test)]
mod tests;
