//! Neural-network operators: softmax, normalization (torch and apex layer norm, RMS norm),
//! activations and their backward functions, embedding, and losses.
//!
//! Dtypes follow torch on CUDA, where the captured programs ran: statistics of half-precision
//! normalizations (`mean`, `rstd`, apex's `invvar`) are f32, f64 inputs keep f64 statistics.

use crate::util::{broadcast_indices, broadcast_shapes, norm_dim, outer_dim_inner, result_dtype};
use crate::{Args, EvalCtx, Meta, OpError, Registry, Tensor};
use shardproof_ir::DType;

/// Registers the neural-network family.
pub(crate) fn register(r: &mut Registry) {
    register_softmax(r);
    register_norms(r);
    register_activations(r);
    register_embedding(r);
    register_losses(r);
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

// ---------------------------------------------------------------------------------------------
// Losses

/// torch's `Reduction` enum.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reduction {
    None,
    Mean,
    Sum,
}

fn reduction(a: &Args) -> Result<Reduction, OpError> {
    // The schema default `Mean` is not an int literal; an absent value means Mean.
    match a.opt_int("reduction")?.unwrap_or(1) {
        0 => Ok(Reduction::None),
        1 => Ok(Reduction::Mean),
        2 => Ok(Reduction::Sum),
        r => err(format!("invalid reduction {r} (expected 0, 1 or 2)")),
    }
}

/// Checked shapes of an nll_loss call: (batch size, classes, whether there is a batch dim).
fn nll_shapes(a: &Args) -> Result<(usize, usize, bool), OpError> {
    let op = "nll_loss";
    let (x, t) = (a.meta("self")?, a.meta("target")?);
    require_index(op, "target", &t)?;
    let (n, c, batched) = match (x.rank(), t.rank()) {
        (1, 0) => (1, x.shape[0], false),
        (2, 1) if x.shape[0] == t.shape[0] => (x.shape[0], x.shape[1], true),
        _ => {
            return err(format!(
                "{op}: input {:?} and target {:?} should be [N, C] and [N], or [C] and []",
                x.shape, t.shape
            ))
        }
    };
    if let Some(w) = a.opt_meta("weight")? {
        if w.rank() != 1 || w.shape[0] != c {
            return err(format!(
                "{op}: weight should have {c} elements, got shape {:?}",
                w.shape
            ));
        }
    }
    Ok((n, c, batched))
}

/// Per-sample (class, weight) pairs; `None` for ignored samples.
fn nll_targets(a: &Args, n: usize, c: usize) -> Result<Vec<Option<(usize, f64)>>, OpError> {
    let t = a.tensor("target")?;
    let w = a.opt_tensor("weight")?;
    let ignore = a.int("ignore_index")?;
    (0..n)
        .map(|i| {
            let ti = t.data[i];
            if ti == ignore as f64 {
                return Ok(None);
            }
            let cls = checked_index("nll_loss", ti, c)?;
            Ok(Some((cls, w.map_or(1.0, |w| w.data[cls]))))
        })
        .collect()
}

fn register_losses(r: &mut Registry) {
    r.pure(
        "aten.nll_loss_forward.default",
        "nll_loss_forward(Tensor self, Tensor target, Tensor? weight, int reduction, SymInt ignore_index) -> (Tensor output, Tensor total_weight)",
        |a| {
            let (n, _, batched) = nll_shapes(a)?;
            let x = a.meta("self")?;
            require_float("nll_loss", &x)?;
            let shape = if reduction(a)? == Reduction::None && batched {
                vec![n]
            } else {
                vec![]
            };
            Ok(vec![Meta::new(x.dtype, shape), Meta::new(x.dtype, vec![])])
        },
        |a, m, _| {
            let (n, c, batched) = nll_shapes(a)?;
            let x = a.tensor("self")?;
            let red = reduction(a)?;
            let targets = nll_targets(a, n, c)?;
            let terms: Vec<f64> = targets
                .iter()
                .enumerate()
                .map(|(i, t)| t.map_or(0.0, |(cls, w)| -w * x.data[i * c + cls]))
                .collect();
            let total: f64 = targets.iter().flatten().map(|&(_, w)| w).sum();
            if red == Reduction::None && batched {
                // torch leaves total_weight at 0 without reduction.
                return Ok(vec![
                    Tensor::new(m[0].clone(), terms),
                    Tensor::new(m[1].clone(), vec![0.0]),
                ]);
            }
            let sum: f64 = terms.iter().sum();
            let out = if red == Reduction::Mean { sum / total } else { sum };
            Ok(vec![
                Tensor::new(m[0].clone(), vec![out]),
                Tensor::new(m[1].clone(), vec![total]),
            ])
        },
    );
    r.pure(
        "aten.nll_loss_backward.default",
        "nll_loss_backward(Tensor grad_output, Tensor self, Tensor target, Tensor? weight, int reduction, SymInt ignore_index, Tensor total_weight) -> Tensor",
        |a| {
            let (n, _, batched) = nll_shapes(a)?;
            let g = a.meta("grad_output")?;
            let want = if reduction(a)? == Reduction::None && batched { n } else { 1 };
            if g.numel() != want || a.meta("total_weight")?.numel() != 1 {
                return err(format!(
                    "nll_loss_backward: grad_output should have {want} elements and total_weight one, got {:?}",
                    g.shape
                ));
            }
            Ok(vec![a.meta("self")?])
        },
        |a, m, _| {
            let (n, c, batched) = nll_shapes(a)?;
            let g = a.tensor("grad_output")?;
            let red = reduction(a)?;
            let tw = a.tensor("total_weight")?.data[0];
            let mut out = vec![0.0; m[0].numel()];
            for (i, t) in nll_targets(a, n, c)?.into_iter().enumerate() {
                if let Some((cls, w)) = t {
                    let gi = match red {
                        Reduction::None if batched => g.data[i],
                        Reduction::Mean => g.data[0] / tw,
                        _ => g.data[0],
                    };
                    out[i * c + cls] = -w * gi;
                }
            }
            Ok(vec![Tensor::new(m[0].clone(), out)])
        },
    );
    r.pure(
        "aten.mse_loss.default",
        "mse_loss(Tensor self, Tensor target, int reduction=Mean) -> Tensor",
        |a| {
            let (x, y) = (a.meta("self")?, a.meta("target")?);
            let shape = broadcast_shapes(&x.shape, &y.shape)?;
            let shape = if reduction(a)? == Reduction::None {
                shape
            } else {
                vec![]
            };
            Ok(vec![Meta::new(result_dtype(&x, &y), shape)])
        },
        |a, m, _| {
            let (x, y) = (a.tensor("self")?, a.tensor("target")?);
            let shape = broadcast_shapes(x.shape(), y.shape())?;
            let bm = Meta::new(m[0].dtype, shape);
            let sq = crate::util::zip_broadcast(x, y, &bm, |p, q| (p - q) * (p - q));
            Ok(vec![match reduction(a)? {
                Reduction::None => sq,
                red => {
                    let s: f64 = sq.data.iter().sum();
                    let v = if red == Reduction::Mean {
                        s / sq.numel() as f64
                    } else {
                        s
                    };
                    Tensor::new(m[0].clone(), vec![v])
                }
            }])
        },
    );
    r.pure(
        "aten.mse_loss_backward.default",
        "mse_loss_backward(Tensor grad_output, Tensor self, Tensor target, int reduction) -> Tensor",
        |a| {
            let x = a.meta("self")?;
            for other in ["grad_output", "target"] {
                let o = a.meta(other)?;
                if broadcast_shapes(&o.shape, &x.shape).ok().as_ref() != Some(&x.shape) {
                    return err(format!(
                        "mse_loss_backward: {other} of shape {:?} does not broadcast to self {:?}",
                        o.shape, x.shape
                    ));
                }
            }
            reduction(a)?;
            Ok(vec![x])
        },
        |a, m, _| {
            let (g, x, y) = (a.tensor("grad_output")?, a.tensor("self")?, a.tensor("target")?);
            let norm = if reduction(a)? == Reduction::Mean {
                2.0 / x.numel() as f64
            } else {
                2.0
            };
            let ig = broadcast_indices(g.shape(), x.shape());
            let iy = broadcast_indices(y.shape(), x.shape());
            let out = x
                .data
                .iter()
                .zip(ig.iter().zip(&iy))
                .map(|(&xv, (&i, &j))| norm * (xv - y.data[j]) * g.data[i])
                .collect();
            Ok(vec![Tensor::new(m[0].clone(), out)])
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{ints, v};
    use shardproof_ir::Arg;

    fn t(shape: &[usize], data: &[f64]) -> Tensor {
        Tensor::new(Meta::new(DType::F64, shape.to_vec()), data.to_vec())
    }

    fn ti(shape: &[usize], data: &[f64]) -> Tensor {
        Tensor::new(Meta::new(DType::I64, shape.to_vec()), data.to_vec())
    }

    fn call(op: &str, ts: &[Tensor], args: &[Arg]) -> Result<Vec<Tensor>, OpError> {
        Registry::builtin().call(op, ts, args, &[])
    }

    fn ramp(n: usize, scale: f64) -> Vec<f64> {
        (0..n)
            .map(|i| ((i * 7 % 11) as f64 - 5.0) * scale + 0.1 * i as f64)
            .collect()
    }

    fn close(a: &[f64], b: &[f64], tol: f64) {
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!(
                (x - y).abs() <= tol * (1.0 + y.abs()),
                "element {i}: {x} vs {y}"
            );
        }
    }

    /// Central finite differences of a scalar function at `x`.
    fn fd(x: &[f64], f: impl Fn(&[f64]) -> f64) -> Vec<f64> {
        let h = 1e-6;
        (0..x.len())
            .map(|i| {
                let mut p = x.to_vec();
                let mut q = x.to_vec();
                p[i] += h;
                q[i] -= h;
                (f(&p) - f(&q)) / (2.0 * h)
            })
            .collect()
    }

    fn dotp(a: &[f64], b: &[f64]) -> f64 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    #[test]
    fn softmax_rows_sum_to_one_and_log_softmax_agrees() {
        let x = t(&[2, 3, 4], &ramp(24, 0.7));
        for dim in [-1i64, 1, 0] {
            let s = call(
                "aten._softmax.default",
                std::slice::from_ref(&x),
                &[v(0), Arg::Int(dim), Arg::Bool(false)],
            )
            .unwrap();
            let (outer, size, inner) = lanes(x.shape(), dim).unwrap();
            for o in 0..outer {
                for i in 0..inner {
                    let sum: f64 = (0..size)
                        .map(|j| s[0].data[o * size * inner + j * inner + i])
                        .sum();
                    assert!((sum - 1.0).abs() < 1e-12);
                }
            }
            let l = call(
                "aten._log_softmax.default",
                std::slice::from_ref(&x),
                &[v(0), Arg::Int(dim), Arg::Bool(false)],
            )
            .unwrap();
            let exp: Vec<f64> = l[0].data.iter().map(|v| v.exp()).collect();
            close(&exp, &s[0].data, 1e-12);
        }
        // Hand value: softmax([0, ln 3]) = [1/4, 3/4].
        let s = call(
            "aten.softmax.int",
            &[t(&[2], &[0.0, 3f64.ln()])],
            &[v(0), Arg::Int(0)],
        )
        .unwrap();
        close(&s[0].data, &[0.25, 0.75], 1e-15);
        let half = Tensor::new(Meta::new(DType::F16, vec![2]), vec![0.0, 1.0]);
        let s = call(
            "aten._softmax.default",
            &[half],
            &[v(0), Arg::Int(0), Arg::Bool(true)],
        )
        .unwrap();
        assert_eq!(s[0].dtype(), DType::F32);
    }

    #[test]
    fn softmax_backward_matches_finite_differences() {
        let x = ramp(6, 0.3);
        let g = ramp(6, -0.2).iter().map(|v| v + 0.05).collect::<Vec<_>>();
        let softmax = |x: &[f64]| {
            call(
                "aten._softmax.default",
                &[t(&[2, 3], x)],
                &[v(0), Arg::Int(1), Arg::Bool(false)],
            )
            .unwrap()[0]
                .data
                .as_ref()
                .clone()
        };
        let y = softmax(&x);
        let dx = call(
            "aten._softmax_backward_data.default",
            &[t(&[2, 3], &g), t(&[2, 3], &y)],
            &[v(0), v(1), Arg::Int(1), Arg::Dtype(DType::F64)],
        )
        .unwrap();
        close(&dx[0].data, &fd(&x, |x| dotp(&softmax(x), &g)), 1e-7);
        let log_softmax = |x: &[f64]| {
            call(
                "aten._log_softmax.default",
                &[t(&[2, 3], x)],
                &[v(0), Arg::Int(-1), Arg::Bool(false)],
            )
            .unwrap()[0]
                .data
                .as_ref()
                .clone()
        };
        let ly = log_softmax(&x);
        let dx = call(
            "aten._log_softmax_backward_data.default",
            &[t(&[2, 3], &g), t(&[2, 3], &ly)],
            &[v(0), v(1), Arg::Int(-1), Arg::Dtype(DType::F64)],
        )
        .unwrap();
        close(&dx[0].data, &fd(&x, |x| dotp(&log_softmax(x), &g)), 1e-7);
    }

    #[test]
    fn native_layer_norm_forward_and_backward() {
        let shape = [2, 2, 3];
        let x = ramp(12, 0.4);
        let w = vec![1.5, -0.5, 2.0];
        let b = vec![0.1, 0.2, 0.3];
        let g = ramp(12, 0.25);
        let fwd = |x: &[f64], w: &[f64], b: &[f64]| {
            call(
                "aten.native_layer_norm.default",
                &[t(&shape, x), t(&[3], w), t(&[3], b)],
                &[v(0), ints(&[3]), v(1), v(2), Arg::Float(1e-5)],
            )
            .unwrap()
        };
        let out = fwd(&x, &w, &b);
        assert_eq!(out[1].shape(), &[2, 2, 1]);
        assert_eq!(out[2].shape(), &[2, 2, 1]);
        // Hand check of the first row.
        let row = &x[..3];
        let mu = row.iter().sum::<f64>() / 3.0;
        let var = row.iter().map(|v| (v - mu).powi(2)).sum::<f64>() / 3.0;
        let rs = 1.0 / (var + 1e-5).sqrt();
        close(
            &out[0].data[..1],
            &[(row[0] - mu) * rs * w[0] + b[0]],
            1e-14,
        );
        close(&[out[1].data[0], out[2].data[0]], &[mu, rs], 1e-14);
        let half = Tensor::new(Meta::new(DType::Bf16, vec![1, 3]), vec![1., 2., 4.]);
        let o = call(
            "aten.native_layer_norm.default",
            &[half],
            &[v(0), ints(&[3]), Arg::None, Arg::None, Arg::Float(1e-5)],
        )
        .unwrap();
        assert_eq!((o[0].dtype(), o[1].dtype()), (DType::Bf16, DType::F32));

        let bwd = call(
            "aten.native_layer_norm_backward.default",
            &[
                t(&shape, &g),
                t(&shape, &x),
                out[1].clone(),
                out[2].clone(),
                t(&[3], &w),
                t(&[3], &b),
            ],
            &[
                v(0),
                v(1),
                ints(&[3]),
                v(2),
                v(3),
                v(4),
                v(5),
                Arg::List(vec![Arg::Bool(true); 3]),
            ],
        )
        .unwrap();
        let loss = |x: &[f64], w: &[f64], b: &[f64]| dotp(&fwd(x, w, b)[0].data, &g);
        close(&bwd[0].data, &fd(&x, |x| loss(x, &w, &b)), 1e-6);
        close(&bwd[1].data, &fd(&w, |w| loss(&x, w, &b)), 1e-6);
        close(&bwd[2].data, &fd(&b, |b| loss(&x, &w, b)), 1e-6);
    }

    #[test]
    fn apex_layer_norm_forward_and_backward() {
        let shape = [4, 2, 3];
        let x = ramp(24, 0.3);
        let w = vec![0.5, 1.25, -1.0];
        let b = vec![0.0, -0.3, 0.7];
        let g = ramp(24, -0.15);
        let fwd = |x: &[f64], w: &[f64], b: &[f64]| {
            call(
                "apex.fused_layer_norm_affine_fwd.default",
                &[t(&shape, x), t(&[3], w), t(&[3], b)],
                &[v(0), v(1), v(2), ints(&[3]), Arg::Float(1e-5)],
            )
            .unwrap()
        };
        let out = fwd(&x, &w, &b);
        assert_eq!(out[1].shape(), &[8]);
        assert_eq!(out[2].shape(), &[8]);
        // Same numbers as torch's layer norm, flattened statistics.
        let tl = call(
            "aten.native_layer_norm.default",
            &[t(&shape, &x), t(&[3], &w), t(&[3], &b)],
            &[v(0), ints(&[3]), v(1), v(2), Arg::Float(1e-5)],
        )
        .unwrap();
        assert_eq!(out[0].data, tl[0].data);
        assert_eq!(out[2].data, tl[2].data);
        // Megatron's call form: (grad, mean, invvar, input, shape, weight, bias, eps).
        let args = [
            v(0),
            v(1),
            v(2),
            v(3),
            ints(&[3]),
            v(4),
            v(5),
            Arg::Float(1e-5),
        ];
        let ts = [
            t(&shape, &g),
            out[1].clone(),
            out[2].clone(),
            t(&shape, &x),
            t(&[3], &w),
            t(&[3], &b),
        ];
        let bwd = call("apex.fused_layer_norm_affine_bwd.default", &ts, &args).unwrap();
        let loss = |x: &[f64], w: &[f64], b: &[f64]| dotp(&fwd(x, w, b)[0].data, &g);
        close(&bwd[0].data, &fd(&x, |x| loss(x, &w, &b)), 1e-6);
        close(&bwd[1].data, &fd(&w, |w| loss(&x, w, &b)), 1e-6);
        close(&bwd[2].data, &fd(&b, |b| loss(&x, &w, b)), 1e-6);
        // The memory-efficient form reads the output instead of the input.
        let ts = [
            t(&shape, &g),
            out[1].clone(),
            out[2].clone(),
            out[0].clone(),
            t(&[3], &w),
            t(&[3], &b),
        ];
        let mut args = args.to_vec();
        args.push(Arg::Bool(true));
        let bwd2 = call("apex.fused_layer_norm_affine_bwd.default", &ts, &args).unwrap();
        close(&bwd2[0].data, &bwd[0].data, 1e-12);
        // f16 input: f32 statistics, as in the captured graphs.
        let h = |s: &[usize], d: &[f64]| Tensor::new(Meta::new(DType::F16, s.to_vec()), d.to_vec());
        let o = call(
            "apex.fused_layer_norm_affine_fwd.default",
            &[h(&shape, &x), h(&[3], &w), h(&[3], &b)],
            &[v(0), v(1), v(2), ints(&[3]), Arg::Float(1e-5)],
        )
        .unwrap();
        assert_eq!(
            (o[0].dtype(), o[1].dtype(), o[2].dtype()),
            (DType::F16, DType::F32, DType::F32)
        );
        assert!(call(
            "apex.fused_layer_norm_affine_fwd.default",
            &[t(&shape, &x), t(&[2], &[1., 1.]), t(&[3], &b)],
            &[v(0), v(1), v(2), ints(&[3]), Arg::Float(1e-5)],
        )
        .is_err());
    }

    #[test]
    fn rms_norm_and_its_backward() {
        let x = ramp(6, 0.5);
        let w = vec![2.0, 0.5, 1.0];
        let g = ramp(6, 0.3);
        let fwd = |x: &[f64], w: &[f64]| {
            call(
                "aten._fused_rms_norm.default",
                &[t(&[2, 3], x), t(&[3], w)],
                &[v(0), ints(&[3]), v(1), Arg::Float(1e-6)],
            )
            .unwrap()
        };
        let out = fwd(&x, &w);
        let r0 = 1.0 / ((x[0] * x[0] + x[1] * x[1] + x[2] * x[2]) / 3.0 + 1e-6).sqrt();
        close(
            &[out[0].data[0], out[1].data[0]],
            &[x[0] * r0 * 2.0, r0],
            1e-14,
        );
        assert_eq!(out[1].shape(), &[2, 1]);
        let plain = call(
            "aten.rms_norm.default",
            &[t(&[2, 3], &x), t(&[3], &w)],
            &[v(0), ints(&[3]), v(1), Arg::Float(1e-6)],
        )
        .unwrap();
        assert_eq!(plain[0].data, out[0].data);
        let bwd = call(
            "aten._fused_rms_norm_backward.default",
            &[t(&[2, 3], &g), t(&[2, 3], &x), out[1].clone(), t(&[3], &w)],
            &[
                v(0),
                v(1),
                ints(&[3]),
                v(2),
                v(3),
                Arg::List(vec![Arg::Bool(true); 2]),
            ],
        )
        .unwrap();
        let loss = |x: &[f64], w: &[f64]| dotp(&fwd(x, w)[0].data, &g);
        close(&bwd[0].data, &fd(&x, |x| loss(x, &w)), 1e-6);
        close(&bwd[1].data, &fd(&w, |w| loss(&x, w)), 1e-6);
    }

    #[test]
    fn gelu_and_friends_match_finite_differences() {
        let x = ramp(11, 0.45);
        let g = vec![1.0; 11];
        for approx in ["none", "tanh"] {
            let kw = [("approximate".to_string(), Arg::Str(approx.into()))];
            let r = Registry::builtin();
            let f = |x: &[f64]| {
                r.call("aten.gelu.default", &[t(&[11], x)], &[v(0)], &kw)
                    .unwrap()[0]
                    .data
                    .iter()
                    .sum::<f64>()
            };
            let dx = r
                .call(
                    "aten.gelu_backward.default",
                    &[t(&[11], &g), t(&[11], &x)],
                    &[v(0), v(1)],
                    &kw,
                )
                .unwrap();
            close(&dx[0].data, &fd(&x, f), 1e-7);
        }
        // gelu(1) = 0.5 * (1 + erf(1/sqrt 2)) = 0.8413447460685429.
        let y = call("aten.gelu.default", &[t(&[1], &[1.0])], &[v(0)]).unwrap();
        close(&y[0].data, &[0.841_344_746_068_542_9], 1e-15);
        let f = |x: &[f64]| {
            call("aten.silu.default", &[t(&[11], x)], &[v(0)]).unwrap()[0]
                .data
                .iter()
                .sum::<f64>()
        };
        let dx = call(
            "aten.silu_backward.default",
            &[t(&[11], &g), t(&[11], &x)],
            &[v(0), v(1)],
        )
        .unwrap();
        close(&dx[0].data, &fd(&x, f), 1e-7);
        let y = call(
            "aten.relu.default",
            &[t(&[3], &[-1.0, 2.0, f64::NAN])],
            &[v(0)],
        )
        .unwrap();
        assert_eq!(&y[0].data[..2], &[0.0, 2.0]);
        assert!(y[0].data[2].is_nan());
        let d = call(
            "aten.threshold_backward.default",
            &[t(&[3], &[5., 6., 7.]), t(&[3], &[-1., 0., 1.])],
            &[v(0), v(1), Arg::Int(0)],
        )
        .unwrap();
        assert_eq!(*d[0].data, vec![0., 0., 7.]);
        let d = call(
            "aten.sigmoid_backward.default",
            &[t(&[1], &[2.0]), t(&[1], &[0.25])],
            &[v(0), v(1)],
        )
        .unwrap();
        assert_eq!(d[0].data[0], 2.0 * 0.75 * 0.25);
        let d = call(
            "aten.tanh_backward.default",
            &[t(&[1], &[2.0]), t(&[1], &[0.5])],
            &[v(0), v(1)],
        )
        .unwrap();
        assert_eq!(d[0].data[0], 1.5);
    }

    #[test]
    fn embedding_forward_and_dense_backward() {
        let w = t(&[4, 2], &[0., 1., 10., 11., 20., 21., 30., 31.]);
        let idx = ti(&[2, 2], &[3., 0., 3., 1.]);
        let e = call(
            "aten.embedding.default",
            &[w.clone(), idx.clone()],
            &[v(0), v(1)],
        )
        .unwrap();
        assert_eq!(e[0].shape(), &[2, 2, 2]);
        assert_eq!(*e[0].data, vec![30., 31., 0., 1., 30., 31., 10., 11.]);
        assert!(call(
            "aten.embedding.default",
            &[w, ti(&[1], &[4.])],
            &[v(0), v(1)]
        )
        .is_err());
        let g = t(&[2, 2, 2], &[1., 2., 3., 4., 5., 6., 7., 8.]);
        let args = |pad: i64, freq: bool| [v(0), v(1), Arg::Int(4), Arg::Int(pad), Arg::Bool(freq)];
        let d = call(
            "aten.embedding_dense_backward.default",
            &[g.clone(), idx.clone()],
            &args(-1, false),
        )
        .unwrap();
        assert_eq!(d[0].shape(), &[4, 2]);
        assert_eq!(*d[0].data, vec![3., 4., 7., 8., 0., 0., 6., 8.]);
        let d = call(
            "aten.embedding_dense_backward.default",
            &[g.clone(), idx.clone()],
            &args(3, false),
        )
        .unwrap();
        assert_eq!(*d[0].data, vec![3., 4., 7., 8., 0., 0., 0., 0.]);
        let d = call(
            "aten.embedding_dense_backward.default",
            &[g, idx],
            &args(-1, true),
        )
        .unwrap();
        assert_eq!(*d[0].data, vec![3., 4., 7., 8., 0., 0., 3., 4.]);
    }

    #[test]
    fn nll_loss_with_ignore_index_and_weights() {
        let x = t(&[3, 3], &[-1., -2., -3., -4., -5., -6., -7., -8., -9.]);
        let tgt = ti(&[3], &[0., 2., -100.]);
        let fwd = |red: i64, w: Option<Tensor>| {
            let mut ts = vec![x.clone(), tgt.clone()];
            let wa = w.map_or(Arg::None, |w| {
                ts.push(w);
                v(2)
            });
            call(
                "aten.nll_loss_forward.default",
                &ts,
                &[v(0), v(1), wa, Arg::Int(red), Arg::Int(-100)],
            )
            .unwrap()
        };
        let o = fwd(1, None);
        assert_eq!((o[0].data[0], o[1].data[0]), ((1.0 + 6.0) / 2.0, 2.0));
        assert_eq!(o[0].shape(), &[] as &[usize]);
        let o = fwd(2, None);
        assert_eq!(o[0].data[0], 7.0);
        let o = fwd(0, None);
        assert_eq!(
            (o[0].data.as_slice(), o[1].data[0]),
            (&[1., 6., 0.][..], 0.0)
        );
        let w = t(&[3], &[0.5, 1.0, 2.0]);
        let o = fwd(1, Some(w.clone()));
        assert_eq!((o[0].data[0], o[1].data[0]), ((0.5 + 12.0) / 2.5, 2.5));
        // Backward of the weighted mean.
        let g = t(&[], &[1.0]);
        let d = call(
            "aten.nll_loss_backward.default",
            &[g, x.clone(), tgt.clone(), w, o[1].clone()],
            &[v(0), v(1), v(2), v(3), Arg::Int(1), Arg::Int(-100), v(4)],
        )
        .unwrap();
        assert_eq!(*d[0].data, vec![-0.2, 0., 0., 0., 0., -0.8, 0., 0., 0.]);
        // Every sample ignored: mean is 0/0 = NaN, as in torch.
        let all = ti(&[3], &[-100.; 3]);
        let o = call(
            "aten.nll_loss_forward.default",
            &[x.clone(), all],
            &[v(0), v(1), Arg::None, Arg::Int(1), Arg::Int(-100)],
        )
        .unwrap();
        assert!(o[0].data[0].is_nan());
        let bad = ti(&[3], &[0., 3., 1.]);
        assert!(call(
            "aten.nll_loss_forward.default",
            &[x, bad],
            &[v(0), v(1), Arg::None, Arg::Int(1), Arg::Int(-100)]
        )
        .is_err());
    }

    #[test]
    fn mse_loss_and_backward() {
        let x = t(&[2, 2], &[1., 2., 3., 4.]);
        let y = t(&[2, 2], &[0., 2., 5., 4.]);
        let o = call(
            "aten.mse_loss.default",
            &[x.clone(), y.clone()],
            &[v(0), v(1)],
        )
        .unwrap();
        assert_eq!(o[0].data[0], 5.0 / 4.0);
        let o = call(
            "aten.mse_loss.default",
            &[x.clone(), y.clone()],
            &[v(0), v(1), Arg::Int(0)],
        )
        .unwrap();
        assert_eq!(*o[0].data, vec![1., 0., 4., 0.]);
        let g = t(&[], &[1.0]);
        let d = call(
            "aten.mse_loss_backward.default",
            &[g, x, y],
            &[v(0), v(1), v(2), Arg::Int(1)],
        )
        .unwrap();
        assert_eq!(*d[0].data, vec![0.5, 0., -1., 0.]);
    }

    /// `scaled_dot_product_attention` on query `[1, 2, 3, 4]`, key `[1, 2, 5, 4]`, value
    /// `[1, 2, 5, 6]`, against the same computation spelled with other operators.
    #[test]
    fn scaled_dot_product_attention_matches_its_decomposition() {
        use crate::testing::call as call_kw;
        let q = t(&[1, 2, 3, 4], &ramp(24, 0.1));
        let k = t(&[1, 2, 5, 4], &ramp(40, 0.07));
        let vv = t(&[1, 2, 5, 6], &ramp(60, 0.3));
        let bias = t(&[3, 5], &ramp(15, 0.5));
        let sdpa = |ts: &[&Tensor], args: &[Arg], kw: &[(&str, Arg)]| {
            call_kw("aten.scaled_dot_product_attention.default", ts, args, kw)
        };
        // softmax(q kᵀ · scale + bias) v, through matmul, mul, add and softmax.
        let op = |name: &str, ts: &[&Tensor], args: &[Arg]| {
            call_kw(name, ts, args, &[]).unwrap()[0].clone()
        };
        let reference = |scale: f64, bias: Option<&Tensor>| {
            let kt = op(
                "aten.transpose.int",
                &[&k],
                &[v(0), Arg::Int(-2), Arg::Int(-1)],
            );
            let s = op("aten.matmul.default", &[&q, &kt], &[v(0), v(1)]);
            let mut s = op("aten.mul.Scalar", &[&s], &[v(0), Arg::Float(scale)]);
            if let Some(b) = bias {
                s = op("aten.add.Tensor", &[&s, b], &[v(0), v(1)]);
            }
            let p = op(
                "aten._softmax.default",
                &[&s],
                &[v(0), Arg::Int(-1), Arg::Bool(false)],
            );
            op("aten.matmul.default", &[&p, &vv], &[v(0), v(1)])
        };
        let out = sdpa(&[&q, &k, &vv], &[v(0), v(1), v(2)], &[]).unwrap();
        assert_eq!(out[0].shape(), &[1, 2, 3, 6]);
        close(&out[0].data, &reference(0.5, None).data, 1e-12);
        let out = sdpa(
            &[&q, &k, &vv, &bias],
            &[v(0), v(1), v(2), v(3)],
            &[("scale", Arg::Float(0.3))],
        )
        .unwrap();
        close(&out[0].data, &reference(0.3, Some(&bias)).data, 1e-12);

        // A causal mask is an additive -inf above the diagonal (aligned top left), and a bool
        // mask is -inf where false; a row that may attend to nothing gives zeros.
        let causal_bias = t(
            &[3, 5],
            &(0..15)
                .map(|i| {
                    if i % 5 > i / 5 {
                        f64::NEG_INFINITY
                    } else {
                        0.0
                    }
                })
                .collect::<Vec<_>>(),
        );
        let out = sdpa(
            &[&q, &k, &vv],
            &[
                v(0),
                v(1),
                v(2),
                Arg::None,
                Arg::Float(0.0),
                Arg::Bool(true),
            ],
            &[],
        )
        .unwrap();
        close(
            &out[0].data,
            &reference(0.5, Some(&causal_bias)).data,
            1e-12,
        );
        let keep: Vec<f64> = (0..15)
            .map(|i| ((i % 5 <= i / 5) && i / 5 != 1) as i64 as f64)
            .collect();
        let mask = Tensor::new(Meta::new(DType::Bool, vec![3, 5]), keep);
        let out = sdpa(&[&q, &k, &vv, &mask], &[v(0), v(1), v(2), v(3)], &[]).unwrap();
        let want = reference(0.5, Some(&causal_bias));
        for (i, (g, w)) in out[0].data.iter().zip(want.data.iter()).enumerate() {
            let row = (i / 6) % 3;
            let w = if row == 1 { 0.0 } else { *w };
            assert!((g - w).abs() < 1e-12, "element {i}: {g} vs {w}");
        }

        // Grouped-query attention: 4 query heads share the 2 key/value heads in pairs.
        let q4 = t(&[1, 4, 3, 4], &ramp(48, 0.1));
        let out = sdpa(
            &[&q4, &k, &vv],
            &[v(0), v(1), v(2)],
            &[("enable_gqa", Arg::Bool(true))],
        )
        .unwrap();
        assert_eq!(out[0].shape(), &[1, 4, 3, 6]);
        let repeat = |x: &Tensor| {
            let half = x.numel() / 2;
            let mut d = Vec::new();
            for h in 0..4 {
                d.extend_from_slice(&x.data[(h / 2) * half..(h / 2 + 1) * half]);
            }
            let mut shape = x.shape().to_vec();
            shape[1] = 4;
            t(&shape, &d)
        };
        let (k4, v4) = (repeat(&k), repeat(&vv));
        let want = sdpa(&[&q4, &k4, &v4], &[v(0), v(1), v(2)], &[]).unwrap();
        assert_eq!(out, want);
        assert!(sdpa(&[&q4, &k, &vv], &[v(0), v(1), v(2)], &[]).is_err());

        // What is refused: dropout (random), a mask with is_causal, mixed or integer dtypes.
        let with = |args: &[Arg], ts: &[&Tensor]| sdpa(ts, args, &[]).is_err();
        assert!(with(
            &[v(0), v(1), v(2), Arg::None, Arg::Float(0.1)],
            &[&q, &k, &vv]
        ));
        assert!(with(
            &[v(0), v(1), v(2), v(3), Arg::Float(0.0), Arg::Bool(true)],
            &[&q, &k, &vv, &mask]
        ));
        let k32 = Tensor::new(Meta::new(DType::F32, k.shape().to_vec()), k.data.to_vec());
        assert!(with(&[v(0), v(1), v(2)], &[&q, &k32, &vv]));
        let imask = ti(&[3, 5], &[1.0; 15]);
        assert!(with(&[v(0), v(1), v(2), v(3)], &[&q, &k, &vv, &imask]));
        assert!(with(&[v(0), v(1), v(2)], &[&q, &q, &vv]));
    }
}
