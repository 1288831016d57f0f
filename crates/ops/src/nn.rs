//! Neural-network operators: softmax, normalization (torch and apex layer norm, RMS norm),
//! activations and their backward functions, embedding, and losses.
//!
//! Dtypes follow torch on CUDA, where the captured programs ran: statistics of half-precision
//! normalizations (`mean`, `rstd`, apex's `invvar`) are f32, f64 inputs keep f64 statistics.

use crate::util::{broadcast_shapes, norm_dim, outer_dim_inner, result_dtype};
use crate::{Args, EvalCtx, Meta, OpError, Registry, Tensor};
use shardproof_ir::DType;

mod losses;

/// Registers the neural-network family.
pub(crate) fn register(r: &mut Registry) {
    register_softmax(r);
    register_norms(r);
    register_activations(r);
    register_embedding(r);
    losses::register_losses(r);
    crate::attention::register_attention(r);
}

pub(crate) fn err<T>(msg: String) -> Result<T, OpError> {
    Err(OpError::new(msg))
}

pub(crate) fn require_float(op: &str, m: &Meta) -> Result<(), OpError> {
    if !m.dtype.is_float() {
        return err(format!(
            "{op}: expected a floating-point tensor, got {}",
            m.dtype.torch_name()
        ));
    }
    Ok(())
}

fn require_same_shape(op: &str, what: &str, a: &Meta, b: &Meta) -> Result<(), OpError> {
    if a.shape != b.shape {
        return err(format!(
            "{op}: {what} have different shapes {:?} and {:?}",
            a.shape, b.shape
        ));
    }
    Ok(())
}

/// The dtype torch's CUDA kernels accumulate and store normalization statistics in.
pub(crate) fn acc_dtype(op: &str, d: DType) -> Result<DType, OpError> {
    if !d.is_float() {
        return err(format!(
            "{op}: expected a floating-point input, got {}",
            d.torch_name()
        ));
    }
    Ok(if d == DType::F64 {
        DType::F64
    } else {
        DType::F32
    })
}

// ---------------------------------------------------------------------------------------------
// Softmax

/// `(outer, size, inner)` of a softmax-like op along `dim`; a 0-d tensor is one lane of one.
fn lanes(shape: &[usize], dim: i64) -> Result<(usize, usize, usize), OpError> {
    let d = norm_dim(dim, shape.len())?;
    if shape.is_empty() {
        return Ok((1, 1, 1));
    }
    Ok(outer_dim_inner(shape, d))
}

/// Applies `f` to every lane along `dim` of each input (all of the same shape), writing `out`.
fn per_lane(
    shape: &[usize],
    dim: i64,
    inputs: &[&[f64]],
    mut f: impl FnMut(&[&[f64]], &mut [f64]),
) -> Result<Vec<f64>, OpError> {
    let (outer, size, inner) = lanes(shape, dim)?;
    let mut out = vec![0.0; outer * size * inner];
    if inner == 1 {
        // Lanes are contiguous (the usual last-dim case): no gathering needed.
        for o in 0..outer {
            let r = o * size..(o + 1) * size;
            let views: Vec<&[f64]> = inputs.iter().map(|x| &x[r.clone()]).collect();
            f(&views, &mut out[r]);
        }
        return Ok(out);
    }
    let mut lane_in: Vec<Vec<f64>> = vec![vec![0.0; size]; inputs.len()];
    let mut lane_out = vec![0.0; size];
    for o in 0..outer {
        for i in 0..inner {
            let base = o * size * inner + i;
            for (buf, src) in lane_in.iter_mut().zip(inputs) {
                for (j, b) in buf.iter_mut().enumerate() {
                    *b = src[base + j * inner];
                }
            }
            let views: Vec<&[f64]> = lane_in.iter().map(Vec::as_slice).collect();
            f(&views, &mut lane_out);
            for (j, &v) in lane_out.iter().enumerate() {
                out[base + j * inner] = v;
            }
        }
    }
    Ok(out)
}

pub(crate) fn softmax_lane(x: &[f64], out: &mut [f64], log: bool) {
    let max = x.iter().copied().fold(f64::NEG_INFINITY, |m, v| {
        if v.is_nan() || m.is_nan() {
            f64::NAN
        } else {
            m.max(v)
        }
    });
    // An all -inf lane has no finite max; torch's kernels then produce NaN, as does this.
    let sum: f64 = x.iter().map(|&v| (v - max).exp()).sum();
    if log {
        let lse = sum.ln();
        for (o, &v) in out.iter_mut().zip(x) {
            *o = v - max - lse;
        }
    } else {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = (v - max).exp() / sum;
        }
    }
}

/// (Log-)softmax of `self` along `dim`.
fn softmax_eval(a: &Args, out: &Meta, log: bool) -> Result<Vec<Tensor>, OpError> {
    let x = a.tensor("self")?;
    let data = per_lane(x.shape(), a.int("dim")?, &[&x.data], |ins, o| {
        softmax_lane(ins[0], o, log)
    })?;
    Ok(vec![Tensor::new(out.clone(), data)])
}

fn infer_internal_softmax(a: &Args) -> Result<Vec<Meta>, OpError> {
    let x = a.meta("self")?;
    require_float("softmax", &x)?;
    norm_dim(a.int("dim")?, x.rank())?;
    let half = matches!(x.dtype, DType::F16 | DType::Bf16);
    let dtype = if a.bool("half_to_float")? && half {
        DType::F32
    } else {
        x.dtype
    };
    Ok(vec![Meta::new(dtype, x.shape)])
}

fn infer_public_softmax(a: &Args) -> Result<Vec<Meta>, OpError> {
    let x = a.meta("self")?;
    norm_dim(a.int("dim")?, x.rank())?;
    let out = Meta::new(a.dtype("dtype")?.unwrap_or(x.dtype), x.shape);
    require_float("softmax", &out)?;
    Ok(vec![out])
}

fn infer_softmax_backward(a: &Args) -> Result<Vec<Meta>, OpError> {
    let (g, y) = (a.meta("grad_output")?, a.meta("output")?);
    require_same_shape("softmax backward", "grad_output and output", &g, &y)?;
    norm_dim(a.int("dim")?, g.rank())?;
    let dtype = a
        .dtype("input_dtype")?
        .ok_or_else(|| OpError::new("softmax backward: input_dtype is required"))?;
    Ok(vec![Meta::new(dtype, g.shape)])
}

fn register_softmax(r: &mut Registry) {
    r.pure(
        "aten._softmax.default",
        "_softmax(Tensor self, int dim, bool half_to_float) -> Tensor",
        infer_internal_softmax,
        |a, m, _| softmax_eval(a, &m[0], false),
    );
    r.pure(
        "aten._log_softmax.default",
        "_log_softmax(Tensor self, int dim, bool half_to_float) -> Tensor",
        infer_internal_softmax,
        |a, m, _| softmax_eval(a, &m[0], true),
    );
    r.pure(
        "aten.softmax.int",
        "softmax.int(Tensor self, int dim, ScalarType? dtype=None) -> Tensor",
        infer_public_softmax,
        |a, m, _| softmax_eval(a, &m[0], false),
    );
    r.pure(
        "aten.log_softmax.int",
        "log_softmax.int(Tensor self, int dim, ScalarType? dtype=None) -> Tensor",
        infer_public_softmax,
        |a, m, _| softmax_eval(a, &m[0], true),
    );
    r.pure(
        "aten._softmax_backward_data.default",
        "_softmax_backward_data(Tensor grad_output, Tensor output, int dim, ScalarType input_dtype) -> Tensor",
        infer_softmax_backward,
        |a, m, _| {
            let (g, y) = (a.tensor("grad_output")?, a.tensor("output")?);
            // dx = y * (g - sum(g * y)).
            let data = per_lane(g.shape(), a.int("dim")?, &[&g.data, &y.data], |ins, o| {
                let (g, y) = (ins[0], ins[1]);
                let s: f64 = g.iter().zip(y).map(|(p, q)| p * q).sum();
                for ((o, &gv), &yv) in o.iter_mut().zip(g).zip(y) {
                    *o = gv * yv - yv * s;
                }
            })?;
            Ok(vec![Tensor::new(m[0].clone(), data)])
        },
    );
    r.pure(
        "aten._log_softmax_backward_data.default",
        "_log_softmax_backward_data(Tensor grad_output, Tensor output, int dim, ScalarType input_dtype) -> Tensor",
        infer_softmax_backward,
        |a, m, _| {
            let (g, y) = (a.tensor("grad_output")?, a.tensor("output")?);
            // dx = g - exp(y) * sum(g).
            let data = per_lane(g.shape(), a.int("dim")?, &[&g.data, &y.data], |ins, o| {
                let (g, y) = (ins[0], ins[1]);
                let s: f64 = g.iter().sum();
                for ((o, &gv), &yv) in o.iter_mut().zip(g).zip(y) {
                    *o = gv - yv.exp() * s;
                }
            })?;
            Ok(vec![Tensor::new(m[0].clone(), data)])
        },
    );
}

// ---------------------------------------------------------------------------------------------
// Normalization

/// Rows `M` and row length `N` of a normalization over the trailing `normalized_shape`.
fn norm_split(op: &str, input: &Meta, normalized: &[i64]) -> Result<(usize, usize), OpError> {
    let nd = normalized.len();
    let trailing_ok = nd >= 1
        && input.rank() >= nd
        && input.shape[input.rank() - nd..]
            .iter()
            .zip(normalized)
            .all(|(&d, &n)| d as i64 == n);
    if !trailing_ok {
        return err(format!(
            "{op}: normalized_shape {normalized:?} does not match the trailing dims of input {:?}",
            input.shape
        ));
    }
    let axis = input.rank() - nd;
    Ok((
        input.shape[..axis].iter().product(),
        input.shape[axis..].iter().product(),
    ))
}

fn check_param(op: &str, what: &str, p: &Option<Meta>, normalized: &[i64]) -> Result<(), OpError> {
    if let Some(p) = p {
        if p.shape.len() != normalized.len()
            || p.shape.iter().zip(normalized).any(|(&d, &n)| d as i64 != n)
        {
            return err(format!(
                "{op}: {what} of shape {:?} does not match normalized_shape {normalized:?}",
                p.shape
            ));
        }
    }
    Ok(())
}

/// Shape of torch's per-row statistics: leading dims kept, normalized dims as 1.
fn stat_shape(input: &Meta, nd: usize) -> Vec<usize> {
    let axis = input.rank() - nd;
    let mut s = input.shape[..axis].to_vec();
    s.extend(std::iter::repeat_n(1, nd));
    s
}

/// Per-row mean and 1/sqrt(biased variance + eps) of `rows` rows of length `n`, two-pass for
/// accuracy. Empty rows give NaN statistics (0/0), never a short result.
fn row_stats(x: &[f64], rows: usize, n: usize, eps: f64) -> (Vec<f64>, Vec<f64>) {
    let mut mean = Vec::with_capacity(rows);
    let mut rstd = Vec::with_capacity(rows);
    for r in 0..rows {
        let row = &x[r * n..(r + 1) * n];
        let mu = row.iter().sum::<f64>() / n as f64;
        let var = row.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>() / n as f64;
        mean.push(mu);
        rstd.push(1.0 / (var + eps).sqrt());
    }
    (mean, rstd)
}

/// `(x - mean) * rstd * w + b`, row by row.
fn normalize_affine(
    x: &[f64],
    n: usize,
    mean: &[f64],
    rstd: &[f64],
    w: Option<&[f64]>,
    b: Option<&[f64]>,
) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    for (r, row) in x.chunks_exact(n.max(1)).enumerate().take(mean.len()) {
        for (j, &v) in row.iter().enumerate() {
            let mut y = (v - mean[r]) * rstd[r];
            if let Some(w) = w {
                y *= w[j];
            }
            if let Some(b) = b {
                y += b[j];
            }
            out.push(y);
        }
    }
    out
}

/// Gradients of `y = x_hat * w + b` with `x_hat = (x - mean) * rstd` per row of length `n`,
/// given `x_hat` directly: (grad_input, grad_weight, grad_bias).
fn layer_norm_grads(
    g: &[f64],
    x_hat: &[f64],
    rstd: &[f64],
    n: usize,
    w: Option<&[f64]>,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let mut dx = vec![0.0; g.len()];
    let mut dw = vec![0.0; n];
    let mut db = vec![0.0; n];
    let nf = n as f64;
    for r in 0..rstd.len() {
        let gr = &g[r * n..(r + 1) * n];
        let xr = &x_hat[r * n..(r + 1) * n];
        let gh = |j: usize| w.map_or(gr[j], |w| gr[j] * w[j]);
        let (mut s1, mut s2) = (0.0, 0.0);
        for (j, &xh) in xr.iter().enumerate() {
            s1 += gh(j);
            s2 += gh(j) * xh;
        }
        for j in 0..n {
            dx[r * n + j] = rstd[r] / nf * (nf * gh(j) - s1 - xr[j] * s2);
            dw[j] += gr[j] * xr[j];
            db[j] += gr[j];
        }
    }
    (dx, dw, db)
}

fn x_hat_from_stats(x: &[f64], n: usize, mean: &[f64], rstd: &[f64]) -> Vec<f64> {
    normalize_affine(x, n, mean, rstd, None, None)
}

fn data_of(t: Option<&Tensor>) -> Option<&[f64]> {
    t.map(|t| t.data.as_slice())
}

fn infer_native_layer_norm(a: &Args) -> Result<Vec<Meta>, OpError> {
    let op = "native_layer_norm";
    let x = a.meta("input")?;
    let ns = a.int_list("normalized_shape")?;
    norm_split(op, &x, &ns)?;
    check_param(op, "weight", &a.opt_meta("weight")?, &ns)?;
    check_param(op, "bias", &a.opt_meta("bias")?, &ns)?;
    let stats = Meta::new(acc_dtype(op, x.dtype)?, stat_shape(&x, ns.len()));
    Ok(vec![x, stats.clone(), stats])
}

fn eval_native_layer_norm(a: &Args, m: &[Meta], _: &mut EvalCtx) -> Result<Vec<Tensor>, OpError> {
    let x = a.tensor("input")?;
    let (rows, n) = norm_split(
        "native_layer_norm",
        &x.meta,
        &a.int_list("normalized_shape")?,
    )?;
    let (mean, rstd) = row_stats(&x.data, rows, n, a.float("eps")?);
    let w = a.opt_tensor("weight")?;
    let b = a.opt_tensor("bias")?;
    let y = normalize_affine(&x.data, n, &mean, &rstd, data_of(w), data_of(b));
    Ok(vec![
        Tensor::new(m[0].clone(), y),
        Tensor::new(m[1].clone(), mean),
        Tensor::new(m[2].clone(), rstd),
    ])
}

fn infer_native_layer_norm_backward(a: &Args) -> Result<Vec<Meta>, OpError> {
    let op = "native_layer_norm_backward";
    let (g, x) = (a.meta("grad_out")?, a.meta("input")?);
    require_same_shape(op, "grad_out and input", &g, &x)?;
    let ns = a.int_list("normalized_shape")?;
    let (rows, _) = norm_split(op, &x, &ns)?;
    for s in ["mean", "rstd"] {
        if a.meta(s)?.numel() != rows {
            return err(format!("{op}: {s} should have {rows} elements"));
        }
    }
    let (w, b) = (a.opt_meta("weight")?, a.opt_meta("bias")?);
    check_param(op, "weight", &w, &ns)?;
    check_param(op, "bias", &b, &ns)?;
    // Outputs torch leaves undefined (masked off, or no weight) are still produced, with the
    // parameter shape: nothing reads them, and a fixed arity keeps `getitem` indices valid.
    let pshape: Vec<usize> = x.shape[x.rank() - ns.len()..].to_vec();
    let wdt = w.as_ref().map_or(x.dtype, |w| w.dtype);
    let bdt = b.as_ref().map_or(wdt, |b| b.dtype);
    Ok(vec![
        Meta::new(x.dtype, x.shape.clone()),
        Meta::new(wdt, pshape.clone()),
        Meta::new(bdt, pshape),
    ])
}

fn eval_native_layer_norm_backward(
    a: &Args,
    m: &[Meta],
    _: &mut EvalCtx,
) -> Result<Vec<Tensor>, OpError> {
    let (g, x) = (a.tensor("grad_out")?, a.tensor("input")?);
    let (_, n) = norm_split(
        "native_layer_norm_backward",
        &x.meta,
        &a.int_list("normalized_shape")?,
    )?;
    let (mean, rstd) = (a.tensor("mean")?, a.tensor("rstd")?);
    let x_hat = x_hat_from_stats(&x.data, n, &mean.data, &rstd.data);
    let w = a.opt_tensor("weight")?;
    let (dx, dw, db) = layer_norm_grads(&g.data, &x_hat, &rstd.data, n, data_of(w));
    Ok(vec![
        Tensor::new(m[0].clone(), dx),
        Tensor::new(m[1].clone(), dw),
        Tensor::new(m[2].clone(), db),
    ])
}

fn infer_apex_fwd(a: &Args) -> Result<Vec<Meta>, OpError> {
    let op = "fused_layer_norm_affine_fwd";
    let x = a.meta("input")?;
    let ns = a.int_list("normalized_shape")?;
    let (rows, _) = norm_split(op, &x, &ns)?;
    check_param(op, "weight", &Some(a.meta("weight")?), &ns)?;
    check_param(op, "bias", &Some(a.meta("bias")?), &ns)?;
    // apex flattens the statistics to one value per row.
    let stats = Meta::new(acc_dtype(op, x.dtype)?, vec![rows]);
    Ok(vec![x, stats.clone(), stats])
}

fn eval_apex_fwd(a: &Args, m: &[Meta], _: &mut EvalCtx) -> Result<Vec<Tensor>, OpError> {
    let x = a.tensor("input")?;
    let (rows, n) = norm_split(
        "fused_layer_norm_affine_fwd",
        &x.meta,
        &a.int_list("normalized_shape")?,
    )?;
    let (mean, invvar) = row_stats(&x.data, rows, n, a.float("eps")?);
    let (w, b) = (a.tensor("weight")?, a.tensor("bias")?);
    let y = normalize_affine(&x.data, n, &mean, &invvar, Some(&w.data), Some(&b.data));
    Ok(vec![
        Tensor::new(m[0].clone(), y),
        Tensor::new(m[1].clone(), mean),
        Tensor::new(m[2].clone(), invvar),
    ])
}

fn infer_apex_bwd(a: &Args) -> Result<Vec<Meta>, OpError> {
    let op = "fused_layer_norm_affine_bwd";
    let (g, x) = (a.meta("grad_output")?, a.meta("input_or_output")?);
    require_same_shape(op, "grad_output and input_or_output", &g, &x)?;
    let ns = a.int_list("normalized_shape")?;
    let (rows, _) = norm_split(op, &x, &ns)?;
    let (w, b) = (a.meta("weight")?, a.meta("bias")?);
    check_param(op, "weight", &Some(w.clone()), &ns)?;
    check_param(op, "bias", &Some(b.clone()), &ns)?;
    for s in ["mean", "invvar"] {
        if a.meta(s)?.numel() != rows {
            return err(format!("{op}: {s} should have {rows} elements"));
        }
    }
    Ok(vec![x, w, b])
}

fn eval_apex_bwd(a: &Args, m: &[Meta], _: &mut EvalCtx) -> Result<Vec<Tensor>, OpError> {
    let (g, x) = (a.tensor("grad_output")?, a.tensor("input_or_output")?);
    let (_, n) = norm_split(
        "fused_layer_norm_affine_bwd",
        &x.meta,
        &a.int_list("normalized_shape")?,
    )?;
    let (w, b) = (a.tensor("weight")?, a.tensor("bias")?);
    let invvar = a.tensor("invvar")?;
    let x_hat = if a.bool("memory_efficient")? {
        // The saved tensor is the output: x_hat = (y - b) / w, as apex reconstructs it.
        x.data
            .chunks_exact(n.max(1))
            .flat_map(|row| {
                row.iter()
                    .enumerate()
                    .map(|(j, &y)| (y - b.data[j]) / w.data[j])
            })
            .collect()
    } else {
        x_hat_from_stats(&x.data, n, &a.tensor("mean")?.data, &invvar.data)
    };
    let (dx, dw, db) = layer_norm_grads(&g.data, &x_hat, &invvar.data, n, Some(&w.data));
    Ok(vec![
        Tensor::new(m[0].clone(), dx),
        Tensor::new(m[1].clone(), dw),
        Tensor::new(m[2].clone(), db),
    ])
}

/// RMS-norm `eps` when none is given: the machine epsilon of torch's op-math type.
fn rms_eps(a: &Args, dtype: DType) -> Result<f64, OpError> {
    Ok(a.opt_float("eps")?.unwrap_or(if dtype == DType::F64 {
        f64::EPSILON
    } else {
        f32::EPSILON as f64
    }))
}

fn infer_rms_norm(a: &Args) -> Result<Vec<Meta>, OpError> {
    let op = "rms_norm";
    let x = a.meta("input")?;
    let ns = a.int_list("normalized_shape")?;
    norm_split(op, &x, &ns)?;
    let w = a.opt_meta("weight")?;
    check_param(op, "weight", &w, &ns)?;
    // torch computes `(x * rstd).type_as(x) * weight`: the weight promotes the result.
    let dtype = w.as_ref().map_or(x.dtype, |w| result_dtype(&x, w));
    let stats = Meta::new(acc_dtype(op, x.dtype)?, stat_shape(&x, ns.len()));
    Ok(vec![Meta::new(dtype, x.shape), stats])
}

fn eval_rms_norm(a: &Args) -> Result<(Vec<f64>, Vec<f64>), OpError> {
    let x = a.tensor("input")?;
    let (rows, n) = norm_split("rms_norm", &x.meta, &a.int_list("normalized_shape")?)?;
    let eps = rms_eps(a, x.dtype())?;
    let w = a.opt_tensor("weight")?;
    let mut out = Vec::with_capacity(x.numel());
    let mut rstd = Vec::with_capacity(rows);
    for r in 0..rows {
        let row = &x.data[r * n..(r + 1) * n];
        let ms = row.iter().map(|v| v * v).sum::<f64>() / n as f64;
        let r = 1.0 / (ms + eps).sqrt();
        rstd.push(r);
        for (j, &v) in row.iter().enumerate() {
            out.push(w.map_or(v * r, |w| v * r * w.data[j]));
        }
    }
    Ok((out, rstd))
}

fn register_norms(r: &mut Registry) {
    r.pure(
        "aten.native_layer_norm.default",
        "native_layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight, Tensor? bias, float eps) -> (Tensor, Tensor, Tensor)",
        infer_native_layer_norm,
        eval_native_layer_norm,
    );
    r.pure(
        "aten.native_layer_norm_backward.default",
        "native_layer_norm_backward(Tensor grad_out, Tensor input, SymInt[] normalized_shape, Tensor mean, Tensor rstd, Tensor? weight, Tensor? bias, bool[3] output_mask) -> (Tensor, Tensor, Tensor)",
        infer_native_layer_norm_backward,
        eval_native_layer_norm_backward,
    );
    r.pure(
        "aten.layer_norm.default",
        "layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, Tensor? bias=None, float eps=1e-05, bool cudnn_enable=True) -> Tensor",
        |a| Ok(vec![infer_native_layer_norm(a)?.swap_remove(0)]),
        |a, _, c| {
            let full = infer_native_layer_norm(a)?;
            Ok(vec![eval_native_layer_norm(a, &full, c)?.swap_remove(0)])
        },
    );
    // apex's torch.library custom ops (apex/normalization/fused_layer_norm.py): the argument
    // order is the one the captured Megatron graphs call them with.
    r.pure(
        "apex.fused_layer_norm_affine_fwd.default",
        "fused_layer_norm_affine_fwd(Tensor input, Tensor weight, Tensor bias, SymInt[] normalized_shape, float eps, bool memory_efficient=False) -> (Tensor, Tensor, Tensor)",
        infer_apex_fwd,
        eval_apex_fwd,
    );
    r.pure(
        "apex.fused_layer_norm_affine_bwd.default",
        "fused_layer_norm_affine_bwd(Tensor grad_output, Tensor mean, Tensor invvar, Tensor input_or_output, SymInt[] normalized_shape, Tensor weight, Tensor bias, float eps, bool memory_efficient=False) -> (Tensor, Tensor, Tensor)",
        infer_apex_bwd,
        eval_apex_bwd,
    );
    r.pure(
        "aten.rms_norm.default",
        "rms_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, float? eps=None) -> Tensor",
        |a| Ok(vec![infer_rms_norm(a)?.swap_remove(0)]),
        |a, m, _| Ok(vec![Tensor::new(m[0].clone(), eval_rms_norm(a)?.0)]),
    );
    r.pure(
        "aten._fused_rms_norm.default",
        "_fused_rms_norm(Tensor input, int[] normalized_shape, Tensor? weight, float? eps) -> (Tensor, Tensor)",
        infer_rms_norm,
        |a, m, _| {
            let (out, rstd) = eval_rms_norm(a)?;
            Ok(vec![Tensor::new(m[0].clone(), out), Tensor::new(m[1].clone(), rstd)])
        },
    );
    r.pure(
        "aten._fused_rms_norm_backward.default",
        "_fused_rms_norm_backward(Tensor grad_out, Tensor input, int[] normalized_shape, Tensor rstd, Tensor? weight, bool[2] output_mask) -> (Tensor, Tensor)",
        |a| {
            let op = "_fused_rms_norm_backward";
            let (g, x) = (a.meta("grad_out")?, a.meta("input")?);
            require_same_shape(op, "grad_out and input", &g, &x)?;
            let ns = a.int_list("normalized_shape")?;
            let (rows, _) = norm_split(op, &x, &ns)?;
            if a.meta("rstd")?.numel() != rows {
                return err(format!("{op}: rstd should have {rows} elements"));
            }
            check_param(op, "weight", &a.opt_meta("weight")?, &ns)?;
            // torch's decomposition casts both gradients to the input dtype.
            let pshape = x.shape[x.rank() - ns.len()..].to_vec();
            Ok(vec![x.clone(), Meta::new(x.dtype, pshape)])
        },
        |a, m, _| {
            let (g, x) = (a.tensor("grad_out")?, a.tensor("input")?);
            let (_, n) = norm_split(
                "_fused_rms_norm_backward",
                &x.meta,
                &a.int_list("normalized_shape")?,
            )?;
            let rstd = a.tensor("rstd")?;
            let w = a.opt_tensor("weight")?;
            let mut dx = vec![0.0; x.numel()];
            let mut dw = vec![0.0; n];
            let nf = n as f64;
            for (r, &rs) in rstd.data.iter().enumerate() {
                let xr = &x.data[r * n..(r + 1) * n];
                let gr = &g.data[r * n..(r + 1) * n];
                let gh = |j: usize| w.map_or(gr[j], |w| gr[j] * w.data[j]);
                let s: f64 = (0..n).map(|j| xr[j] * rs * gh(j)).sum();
                for j in 0..n {
                    let xh = xr[j] * rs;
                    dx[r * n + j] = (gh(j) - xh / nf * s) * rs;
                    dw[j] += gr[j] * xh;
                }
            }
            Ok(vec![Tensor::new(m[0].clone(), dx), Tensor::new(m[1].clone(), dw)])
        },
    );
}

// ---------------------------------------------------------------------------------------------
// Activations

const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
const GELU_KAPPA: f64 = 0.044715;

fn gelu_tanh(a: &Args) -> Result<bool, OpError> {
    match a.str("approximate")?.as_str() {
        "none" => Ok(false),
        "tanh" => Ok(true),
        other => err(format!(
            "gelu: approximate must be 'none' or 'tanh', got '{other}'"
        )),
    }
}

fn gelu(x: f64, tanh: bool) -> f64 {
    if tanh {
        0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + GELU_KAPPA * x * x * x)).tanh())
    } else {
        0.5 * x * (1.0 + libm::erf(x * std::f64::consts::FRAC_1_SQRT_2))
    }
}

fn gelu_grad(x: f64, tanh: bool) -> f64 {
    if tanh {
        let inner = SQRT_2_OVER_PI * (x + GELU_KAPPA * x * x * x);
        let t = inner.tanh();
        let d_inner = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_KAPPA * x * x);
        0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * d_inner
    } else {
        let cdf = 0.5 * (1.0 + libm::erf(x * std::f64::consts::FRAC_1_SQRT_2));
        let pdf = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
        cdf + x * pdf
    }
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn infer_unary_float(a: &Args) -> Result<Vec<Meta>, OpError> {
    let x = a.meta("self")?;
    require_float("activation", &x)?;
    Ok(vec![x])
}

/// A backward op `f(grad_output, other)` broadcasting like torch's TensorIterator.
fn infer_grad_binary(a: &Args, other: &str) -> Result<Vec<Meta>, OpError> {
    let (g, x) = (a.meta("grad_output")?, a.meta(other)?);
    Ok(vec![Meta::new(
        result_dtype(&g, &x),
        broadcast_shapes(&g.shape, &x.shape)?,
    )])
}

fn grad_binary(
    a: &Args,
    other: &str,
    out: &Meta,
    f: impl Fn(f64, f64) -> f64,
) -> Result<Vec<Tensor>, OpError> {
    let (g, x) = (a.tensor("grad_output")?, a.tensor(other)?);
    Ok(vec![crate::util::zip_broadcast(g, x, out, f)])
}

fn register_activations(r: &mut Registry) {
    r.pure(
        "aten.gelu.default",
        "gelu(Tensor self, *, str approximate='none') -> Tensor",
        |a| {
            gelu_tanh(a)?;
            infer_unary_float(a)
        },
        |a, m, _| {
            let t = gelu_tanh(a)?;
            Ok(vec![crate::util::map(a.tensor("self")?, &m[0], |x| {
                gelu(x, t)
            })])
        },
    );
    r.pure(
        "aten.gelu_backward.default",
        "gelu_backward(Tensor grad_output, Tensor self, *, str approximate='none') -> Tensor",
        |a| {
            gelu_tanh(a)?;
            infer_grad_binary(a, "self")
        },
        |a, m, _| {
            let t = gelu_tanh(a)?;
            grad_binary(a, "self", &m[0], |g, x| g * gelu_grad(x, t))
        },
    );
    r.pure(
        "aten.silu.default",
        "silu(Tensor self) -> Tensor",
        infer_unary_float,
        |a, m, _| {
            Ok(vec![crate::util::map(a.tensor("self")?, &m[0], |x| {
                x * sigmoid(x)
            })])
        },
    );
    r.pure(
        "aten.silu_backward.default",
        "silu_backward(Tensor grad_output, Tensor self) -> Tensor",
        |a| infer_grad_binary(a, "self"),
        |a, m, _| {
            grad_binary(a, "self", &m[0], |g, x| {
                let s = sigmoid(x);
                g * s * (1.0 + x * (1.0 - s))
            })
        },
    );
    r.pure(
        "aten.relu.default",
        "relu(Tensor self) -> Tensor",
        |a| {
            let x = a.meta("self")?;
            if x.dtype == DType::Bool {
                return err("relu: not implemented for bool tensors".into());
            }
            Ok(vec![x])
        },
        // `x > 0 || NaN`: relu propagates NaN like torch's clamp_min.
        |a, m, _| {
            let f = |x: f64| if x > 0.0 || x.is_nan() { x } else { 0.0 };
            Ok(vec![crate::util::map(a.tensor("self")?, &m[0], f)])
        },
    );
    r.pure(
        "aten.threshold_backward.default",
        "threshold_backward(Tensor grad_output, Tensor self, Scalar threshold) -> Tensor",
        |a| infer_grad_binary(a, "self"),
        |a, m, _| {
            let t = a.float("threshold")?;
            grad_binary(a, "self", &m[0], |g, x| if x <= t { 0.0 } else { g })
        },
    );
    r.pure(
        "aten.sigmoid_backward.default",
        "sigmoid_backward(Tensor grad_output, Tensor output) -> Tensor",
        |a| infer_grad_binary(a, "output"),
        |a, m, _| grad_binary(a, "output", &m[0], |g, y| g * (1.0 - y) * y),
    );
    r.pure(
        "aten.tanh_backward.default",
        "tanh_backward(Tensor grad_output, Tensor output) -> Tensor",
        |a| infer_grad_binary(a, "output"),
        |a, m, _| grad_binary(a, "output", &m[0], |g, y| g * (1.0 - y * y)),
    );
}

// ---------------------------------------------------------------------------------------------
// Embedding

fn require_index(op: &str, what: &str, m: &Meta) -> Result<(), OpError> {
    if !m.dtype.is_int() {
        return err(format!(
            "{op}: {what} must be an integer tensor, got {}",
            m.dtype.torch_name()
        ));
    }
    Ok(())
}

/// An index into `0..n` or an error (torch raises or asserts on out-of-range indices).
fn checked_index(op: &str, v: f64, n: usize) -> Result<usize, OpError> {
    if !(v >= 0.0 && v < n as f64) {
        return err(format!("{op}: index {v} out of range for size {n}"));
    }
    Ok(v as usize)
}

fn register_embedding(r: &mut Registry) {
    r.pure(
        "aten.embedding.default",
        "embedding(Tensor weight, Tensor indices, SymInt padding_idx=-1, bool scale_grad_by_freq=False, bool sparse=False) -> Tensor",
        |a| {
            let (w, i) = (a.meta("weight")?, a.meta("indices")?);
            if w.rank() != 2 {
                return err(format!("embedding: weight must be 2-D, got shape {:?}", w.shape));
            }
            require_index("embedding", "indices", &i)?;
            let mut shape = i.shape.clone();
            shape.push(w.shape[1]);
            Ok(vec![Meta::new(w.dtype, shape)])
        },
        // padding_idx only affects the backward pass.
        |a, m, _| {
            let (w, idx) = (a.tensor("weight")?, a.tensor("indices")?);
            let (rows, d) = (w.shape()[0], w.shape()[1]);
            let mut out = Vec::with_capacity(m[0].numel());
            for &i in idx.data.iter() {
                let i = checked_index("embedding", i, rows)?;
                out.extend_from_slice(&w.data[i * d..(i + 1) * d]);
            }
            Ok(vec![Tensor::new(m[0].clone(), out)])
        },
    );
    r.pure(
        "aten.embedding_dense_backward.default",
        "embedding_dense_backward(Tensor grad_output, Tensor indices, SymInt num_weights, SymInt padding_idx, bool scale_grad_by_freq) -> Tensor",
        |a| {
            let op = "embedding_dense_backward";
            let (g, i) = (a.meta("grad_output")?, a.meta("indices")?);
            require_index(op, "indices", &i)?;
            let nw = a.int("num_weights")?;
            if nw < 0 || g.rank() < i.rank() || g.shape[..i.rank()] != i.shape[..] {
                return err(format!(
                    "{op}: grad_output {:?} does not start with the indices' shape {:?} (num_weights {nw})",
                    g.shape, i.shape
                ));
            }
            let mut shape = vec![nw as usize];
            shape.extend_from_slice(&g.shape[i.rank()..]);
            Ok(vec![Meta::new(g.dtype, shape)])
        },
        |a, m, _| {
            let (g, idx) = (a.tensor("grad_output")?, a.tensor("indices")?);
            let nw = m[0].shape[0];
            let d: usize = m[0].shape[1..].iter().product();
            let pad = a.int("padding_idx")?;
            let mut counts = vec![0usize; nw];
            let rows: Vec<usize> = idx
                .data
                .iter()
                .map(|&i| checked_index("embedding_dense_backward", i, nw))
                .collect::<Result<_, _>>()?;
            if a.bool("scale_grad_by_freq")? {
                rows.iter().for_each(|&i| counts[i] += 1);
            }
            let mut out = vec![0.0; m[0].numel()];
            for (k, &i) in rows.iter().enumerate() {
                if i as i64 == pad {
                    continue;
                }
                let scale = if counts[i] > 0 { 1.0 / counts[i] as f64 } else { 1.0 };
                for (o, &gv) in out[i * d..(i + 1) * d].iter_mut().zip(&g.data[k * d..(k + 1) * d]) {
                    *o += gv * scale;
                }
            }
            Ok(vec![Tensor::new(m[0].clone(), out)])
        },
    );
}

#[cfg(test)]
mod tests;
