//! Reductions (sum, mean, prod, max/min, var/std, norms, any/all), scans (cumsum, cummax) and
//! orderings (sort, topk).
//!
//! Reductions first gather the reduced elements of each output next to each other (permuting
//! the reduced dims innermost), so every kernel is a function of one contiguous slice.

use crate::elementwise::{cast_to, float_or_default};
use crate::shape::permute_data;
use crate::tensor::cast_value;
use crate::util::{norm_dim, outer_dim_inner};
use crate::{Args, Meta, OpError, Registry, Tensor};
use shardproof_ir::DType;
use std::borrow::Cow;
use std::cmp::Ordering;

/// Which dims of a tensor of rank `rank` a `dim` argument reduces: `None` and `[]` mean all.
fn reduce_mask(dims: Option<Vec<i64>>, rank: usize) -> Result<Vec<bool>, OpError> {
    let mut mask = vec![false; rank];
    match dims {
        None => mask.iter_mut().for_each(|m| *m = true),
        Some(d) if d.is_empty() => mask.iter_mut().for_each(|m| *m = true),
        Some(d) => {
            for x in d {
                let n = norm_dim(x, rank)?;
                if rank > 0 {
                    if mask[n] {
                        return Err(OpError::new(format!(
                            "dim {n} appears multiple times in the list of dims"
                        )));
                    }
                    mask[n] = true;
                }
            }
        }
    }
    Ok(mask)
}

/// The output shape of a reduction over `mask`.
fn reduced_shape(shape: &[usize], mask: &[bool], keepdim: bool) -> Vec<usize> {
    shape
        .iter()
        .zip(mask)
        .filter_map(|(&s, &m)| match (m, keepdim) {
            (false, _) => Some(s),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect()
}

/// Number of elements reduced into each output.
fn group_len(shape: &[usize], mask: &[bool]) -> usize {
    shape
        .iter()
        .zip(mask)
        .filter(|(_, &m)| m)
        .map(|(&s, _)| s)
        .product()
}

/// Applies `f` to the reduced elements of every output, in output order.
fn reduce_groups(t: &Tensor, mask: &[bool], mut f: impl FnMut(&[f64]) -> f64) -> Vec<f64> {
    let shape = t.shape();
    let g = group_len(shape, mask);
    let n_out: usize = shape
        .iter()
        .zip(mask)
        .filter(|(_, &m)| !m)
        .map(|(&s, _)| s)
        .product();
    if g == 0 {
        return (0..n_out).map(|_| f(&[])).collect();
    }
    // Reduced dims already innermost (in order) need no permutation.
    let first_reduced = mask.iter().position(|&m| m).unwrap_or(mask.len());
    let data: Cow<[f64]> = if mask[first_reduced..].iter().all(|&m| m) {
        Cow::Borrowed(&t.data[..])
    } else {
        let perm: Vec<usize> = (0..mask.len())
            .filter(|&d| !mask[d])
            .chain((0..mask.len()).filter(|&d| mask[d]))
            .collect();
        Cow::Owned(permute_data(t, &perm))
    };
    data.chunks(g).map(f).collect()
}

/// The `dim` (list) and `keepdim` arguments of a reduction, as a mask and a flag.
fn dims_arg(a: &Args, rank: usize) -> Result<(Vec<bool>, bool), OpError> {
    let s = a.schema();
    let dims = if s.index_of("dim").is_some() {
        a.opt_int_list("dim")?
    } else {
        None
    };
    let keep = s.index_of("keepdim").is_some() && a.bool("keepdim")?;
    Ok((reduce_mask(dims, rank)?, keep))
}

/// The dtype of `sum`/`prod`/`cumsum`: the `dtype` argument, else i64 for integers and bools.
fn accumulate_dtype(a: &Args, d: DType) -> Result<DType, OpError> {
    Ok(match a.dtype("dtype")? {
        Some(d) => d,
        None if !d.is_float() => DType::I64,
        None => d,
    })
}

/// Output meta of `sum` and `prod`.
fn infer_sum(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let (mask, keep) = dims_arg(a, m.rank())?;
    Ok(vec![Meta::new(
        accumulate_dtype(a, m.dtype)?,
        reduced_shape(&m.shape, &mask, keep),
    )])
}

/// Evaluates a reduction whose input is first converted to the output dtype.
fn eval_reduce(a: &Args, m: &[Meta], f: fn(&[f64]) -> f64) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let (mask, _) = dims_arg(a, t.meta.rank())?;
    let x = cast_to(Cow::Borrowed(t), m[0].dtype);
    let d = m[0].dtype;
    let data = reduce_groups(&x, &mask, f)
        .into_iter()
        .map(|v| cast_value(v, d))
        .collect();
    Ok(vec![Tensor::new(m[0].clone(), data)])
}

/// Output meta of `mean`: float only.
fn infer_mean(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let d = a.dtype("dtype")?.unwrap_or(m.dtype);
    if !d.is_float() {
        return Err(OpError::new(format!(
            "mean(): could not infer output dtype. Input dtype must be either a floating point or complex dtype. Got: {d}"
        )));
    }
    let (mask, keep) = dims_arg(a, m.rank())?;
    Ok(vec![Meta::new(d, reduced_shape(&m.shape, &mask, keep))])
}

fn sum(v: &[f64]) -> f64 {
    v.iter().sum()
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

fn prod(v: &[f64]) -> f64 {
    v.iter().product()
}

/// NaN-propagating maximum.
fn max_of(v: &[f64]) -> f64 {
    let mut m = f64::NEG_INFINITY;
    for &x in v {
        if x.is_nan() {
            return x;
        }
        if x > m {
            m = x;
        }
    }
    m
}

/// NaN-propagating minimum.
fn min_of(v: &[f64]) -> f64 {
    let mut m = f64::INFINITY;
    for &x in v {
        if x.is_nan() {
            return x;
        }
        if x < m {
            m = x;
        }
    }
    m
}

/// Output meta of `amax`/`amin`/`max`/`min` (all-dims), refusing empty reductions.
fn infer_extreme(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let (mask, keep) = dims_arg(a, m.rank())?;
    if m.shape.iter().zip(&mask).any(|(&s, &k)| k && s == 0) {
        return Err(OpError::new(format!(
            "{}: expected a non-empty reduction (reducing over a zero-size dimension)",
            a.schema().name
        )));
    }
    Ok(vec![Meta::new(
        m.dtype,
        reduced_shape(&m.shape, &mask, keep),
    )])
}

/// The dim of a dim-wise op (`max.dim`, `sort`, `cumsum`...), with rank-0 tensors as one lane.
fn lane_dim(a: &Args, name: &str, m: &Meta) -> Result<usize, OpError> {
    norm_dim(a.int(name)?, m.rank())
}

/// (outer, size, inner) of the lanes along `dim` (a rank-0 tensor is one lane of one element).
fn lanes(shape: &[usize], dim: usize) -> (usize, usize, usize) {
    if shape.is_empty() {
        (1, 1, 1)
    } else {
        outer_dim_inner(shape, dim)
    }
}

/// The values of lane `(o, i)` along a dim of size `n` with `inner` elements after it.
fn lane(data: &[f64], o: usize, i: usize, n: usize, inner: usize) -> Vec<f64> {
    (0..n).map(|k| data[(o * n + k) * inner + i]).collect()
}

/// Output metas of `max.dim`/`min.dim`: values and i64 indices.
fn infer_max_dim(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let d = lane_dim(a, "dim", &m)?;
    if m.rank() > 0 && m.shape[d] == 0 {
        return Err(OpError::new(format!(
            "{}: expected reduction dim {d} to have non-zero size",
            a.schema().name
        )));
    }
    let keep = a.bool("keepdim")?;
    let mut mask = vec![false; m.rank()];
    if m.rank() > 0 {
        mask[d] = true;
    }
    let shape = reduced_shape(&m.shape, &mask, keep);
    Ok(vec![
        Meta::new(m.dtype, shape.clone()),
        Meta::new(DType::I64, shape),
    ])
}

/// Index of the first maximum (`greater`) or minimum of a lane; a NaN wins at its first
/// occurrence, as torch's CPU kernels do.
fn arg_extreme(v: &[f64], greater: bool) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate().skip(1) {
        let b = v[best];
        if b.is_nan() {
            break;
        }
        if x.is_nan() || (greater && x > b) || (!greater && x < b) {
            best = i;
        }
    }
    best
}

fn eval_max_dim(a: &Args, m: &[Meta], greater: bool) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let d = lane_dim(a, "dim", &t.meta)?;
    let (outer, n, inner) = lanes(t.shape(), d);
    let mut vals = Vec::with_capacity(outer * inner);
    let mut idx = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for i in 0..inner {
            let l = lane(&t.data, o, i, n, inner);
            let k = arg_extreme(&l, greater);
            vals.push(l[k]);
            idx.push(k as f64);
        }
    }
    Ok(vec![
        Tensor::new(m[0].clone(), vals),
        Tensor::new(m[1].clone(), idx),
    ])
}

/// Output meta of `argmax`/`argmin`: `dim` None flattens (and `keepdim` gives all-ones dims).
fn infer_argmax(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let keep = a.bool("keepdim")?;
    let shape = match a.opt_int("dim")? {
        None => {
            if m.numel() == 0 {
                return Err(OpError::new(format!(
                    "{}: expected a non-empty tensor",
                    a.schema().name
                )));
            }
            if keep {
                vec![1; m.rank()]
            } else {
                vec![]
            }
        }
        Some(_) => infer_max_dim(a)?.remove(1).shape,
    };
    Ok(vec![Meta::new(DType::I64, shape)])
}

fn eval_argmax(a: &Args, m: &[Meta], greater: bool) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let data = match a.opt_int("dim")? {
        None => vec![arg_extreme(&t.data, greater) as f64],
        Some(_) => {
            let d = lane_dim(a, "dim", &t.meta)?;
            let (outer, n, inner) = lanes(t.shape(), d);
            let mut idx = Vec::with_capacity(outer * inner);
            for o in 0..outer {
                for i in 0..inner {
                    idx.push(arg_extreme(&lane(&t.data, o, i, n, inner), greater) as f64);
                }
            }
            idx
        }
    };
    Ok(vec![Tensor::new(m[0].clone(), data)])
}

/// The correction of `var`/`std`: `correction` (default 1) or `unbiased`.
fn correction(a: &Args) -> Result<f64, OpError> {
    let s = a.schema();
    if s.index_of("correction").is_some() {
        Ok(a.opt_float("correction")?.unwrap_or(1.0))
    } else if s.index_of("unbiased").is_some() {
        Ok(if a.bool("unbiased")? { 1.0 } else { 0.0 })
    } else {
        Ok(1.0)
    }
}

/// Output metas of `var`/`std` (and of their `_mean` variants when `with_mean`).
fn infer_var(a: &Args, with_mean: bool) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    if !m.dtype.is_float() {
        return Err(OpError::new(format!(
            "{}: only floating point types are supported, got {}",
            a.schema().name,
            m.dtype
        )));
    }
    correction(a)?;
    let (mask, keep) = dims_arg(a, m.rank())?;
    let out = Meta::new(m.dtype, reduced_shape(&m.shape, &mask, keep));
    Ok(if with_mean {
        vec![out.clone(), out]
    } else {
        vec![out]
    })
}

/// Variance with a correction, by two passes (mean first) for accuracy.
fn variance(v: &[f64], corr: f64) -> f64 {
    let n = v.len() as f64;
    let mu = mean(v);
    let ss: f64 = v.iter().map(|x| (x - mu) * (x - mu)).sum();
    ss / (n - corr).max(0.0)
}

fn eval_var(a: &Args, m: &[Meta], sqrt: bool, with_mean: bool) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let (mask, _) = dims_arg(a, t.meta.rank())?;
    let corr = correction(a)?;
    let v = reduce_groups(t, &mask, |g| {
        let v = variance(g, corr);
        if sqrt {
            v.sqrt()
        } else {
            v
        }
    });
    let mut out = vec![Tensor::new(m[0].clone(), v)];
    if with_mean {
        out.push(Tensor::new(m[1].clone(), reduce_groups(t, &mask, mean)));
    }
    Ok(out)
}

/// Output meta of `any`/`all`: bool, except uint8 inputs which stay uint8.
fn infer_any(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let (mask, keep) = dims_arg(a, m.rank())?;
    let d = if m.dtype == DType::U8 {
        DType::U8
    } else {
        DType::Bool
    };
    Ok(vec![Meta::new(d, reduced_shape(&m.shape, &mask, keep))])
}

fn eval_any(a: &Args, m: &[Meta], all: bool) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let (mask, _) = dims_arg(a, t.meta.rank())?;
    let data = reduce_groups(t, &mask, |g| {
        (if all {
            g.iter().all(|&x| x != 0.0)
        } else {
            g.iter().any(|&x| x != 0.0)
        }) as i64 as f64
    });
    Ok(vec![Tensor::new(m[0].clone(), data)])
}

/// The order of `sort` and `topk`: NaN counts as larger than every number; ties keep index
/// order (a stable sort).
fn nan_last_cmp(x: f64, y: f64) -> Ordering {
    match (x.is_nan(), y.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        _ => x.partial_cmp(&y).unwrap_or(Ordering::Equal),
    }
}

/// Indices of a lane in sorted order (stable).
fn sorted_indices(l: &[f64], descending: bool) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..l.len()).collect();
    if descending {
        idx.sort_by(|&i, &j| nan_last_cmp(l[j], l[i]));
    } else {
        idx.sort_by(|&i, &j| nan_last_cmp(l[i], l[j]));
    }
    idx
}

/// Runs `f` on every lane along `dim` and writes the `k` values and indices it returns into
/// outputs whose `dim` has size `k`.
fn eval_lanes(
    t: &Tensor,
    dim: usize,
    k: usize,
    mut f: impl FnMut(&[f64]) -> Vec<usize>,
) -> (Vec<f64>, Vec<f64>) {
    let (outer, n, inner) = lanes(t.shape(), dim);
    let mut vals = vec![0.0; outer * k * inner];
    let mut idx = vec![0.0; outer * k * inner];
    for o in 0..outer {
        for i in 0..inner {
            let l = lane(&t.data, o, i, n, inner);
            for (j, &s) in f(&l).iter().take(k).enumerate() {
                vals[(o * k + j) * inner + i] = l[s];
                idx[(o * k + j) * inner + i] = s as f64;
            }
        }
    }
    (vals, idx)
}

fn infer_sort(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    lane_dim(a, "dim", &m)?;
    Ok(vec![m.clone(), Meta::new(DType::I64, m.shape)])
}

fn eval_sort(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let d = lane_dim(a, "dim", &t.meta)?;
    let desc = a.bool("descending")?;
    let k = if t.meta.rank() == 0 { 1 } else { t.shape()[d] };
    let (vals, idx) = eval_lanes(t, d, k, |l| sorted_indices(l, desc));
    let idx_meta = m
        .last()
        .cloned()
        .unwrap_or_else(|| Meta::new(DType::I64, t.shape().to_vec()));
    let mut out = Vec::new();
    if m.len() == 2 {
        out.push(Tensor::new(m[0].clone(), vals));
    }
    out.push(Tensor::new(idx_meta, idx));
    Ok(out)
}

/// The `k` of `topk`, checked against the dim.
fn topk_k(a: &Args, m: &Meta) -> Result<(usize, usize), OpError> {
    let d = lane_dim(a, "dim", m)?;
    let n = if m.rank() == 0 { 1 } else { m.shape[d] };
    let k = a.int("k")?;
    // A 0-d result always holds one element, so a 0-d input needs k = 1.
    if k < 0 || k as usize > n || (m.rank() == 0 && k != 1) {
        return Err(OpError::new(format!(
            "topk: selected index k={k} out of range for a dim of size {n}"
        )));
    }
    Ok((d, k as usize))
}

fn infer_topk(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let (d, k) = topk_k(a, &m)?;
    let mut shape = m.shape.clone();
    if m.rank() > 0 {
        shape[d] = k;
    }
    Ok(vec![
        Meta::new(m.dtype, shape.clone()),
        Meta::new(DType::I64, shape),
    ])
}

fn eval_topk(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let (d, k) = topk_k(a, &t.meta)?;
    let largest = a.bool("largest")?;
    let (vals, idx) = eval_lanes(t, d, k, |l| sorted_indices(l, largest));
    Ok(vec![
        Tensor::new(m[0].clone(), vals),
        Tensor::new(m[1].clone(), idx),
    ])
}

fn infer_cumsum(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    lane_dim(a, "dim", &m)?;
    Ok(vec![Meta::new(accumulate_dtype(a, m.dtype)?, m.shape)])
}

/// A scan along `dim`: `step(acc, x)` folds each element into the running value.
fn eval_scan(
    a: &Args,
    m: &[Meta],
    init: f64,
    step: fn(f64, f64) -> f64,
) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let d = lane_dim(a, "dim", &t.meta)?;
    let x = cast_to(Cow::Borrowed(t), m[0].dtype);
    let (outer, n, inner) = lanes(t.shape(), d);
    let dt = m[0].dtype;
    let mut out = vec![0.0; x.numel()];
    for o in 0..outer {
        for i in 0..inner {
            let mut acc = init;
            for k in 0..n {
                let p = (o * n + k) * inner + i;
                acc = cast_value(step(acc, x.data[p]), dt);
                out[p] = acc;
            }
        }
    }
    Ok(vec![Tensor::new(m[0].clone(), out)])
}

fn infer_cummax(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    lane_dim(a, "dim", &m)?;
    Ok(vec![m.clone(), Meta::new(DType::I64, m.shape)])
}

/// Running maximum (`greater`) or minimum with its index; later ties and NaNs take over, as in
/// torch's `cummax`.
fn eval_cummax(a: &Args, m: &[Meta], greater: bool) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let d = lane_dim(a, "dim", &t.meta)?;
    let (outer, n, inner) = lanes(t.shape(), d);
    let mut vals = vec![0.0; t.numel()];
    let mut idx = vec![0.0; t.numel()];
    for o in 0..outer {
        for i in 0..inner {
            let mut best = f64::NAN;
            let mut at = 0usize;
            for k in 0..n {
                let p = (o * n + k) * inner + i;
                let x = t.data[p];
                let better = if greater { x >= best } else { x <= best };
                if k == 0 || x.is_nan() || (!best.is_nan() && better) {
                    best = x;
                    at = k;
                }
                vals[p] = best;
                idx[p] = at as f64;
            }
        }
    }
    Ok(vec![
        Tensor::new(m[0].clone(), vals),
        Tensor::new(m[1].clone(), idx),
    ])
}

/// The order of a vector norm.
fn norm_ord(a: &Args) -> Result<f64, OpError> {
    let name = if a.schema().index_of("ord").is_some() {
        "ord"
    } else {
        "p"
    };
    Ok(a.opt_float(name)?.unwrap_or(2.0))
}

fn infer_norm(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    if !m.dtype.is_float() {
        return Err(OpError::new(format!(
            "{}: expected a floating point input, got {}",
            a.schema().name,
            m.dtype
        )));
    }
    let p = norm_ord(a)?;
    let (mask, keep) = dims_arg(a, m.rank())?;
    if p.is_infinite() && m.shape.iter().zip(&mask).any(|(&s, &k)| k && s == 0) {
        return Err(OpError::new(format!(
            "{}: cannot compute the infinity norm of an empty reduction",
            a.schema().name
        )));
    }
    let d = if a.schema().index_of("dtype").is_some() {
        a.dtype("dtype")?.unwrap_or(m.dtype)
    } else {
        m.dtype
    };
    Ok(vec![Meta::new(d, reduced_shape(&m.shape, &mask, keep))])
}

fn eval_norm(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let p = norm_ord(a)?;
    let (mask, _) = dims_arg(a, t.meta.rank())?;
    let data = reduce_groups(t, &mask, |g| vector_norm(g, p));
    Ok(vec![Tensor::new(m[0].clone(), data)])
}

/// The `p`-norm of a vector (`inf`: max |x|, `-inf`: min |x|, 0: number of non-zeros).
fn vector_norm(g: &[f64], p: f64) -> f64 {
    if p == f64::INFINITY {
        g.iter().fold(0.0, |m: f64, &x| {
            if x.is_nan() || m.is_nan() {
                f64::NAN
            } else {
                m.max(x.abs())
            }
        })
    } else if p == f64::NEG_INFINITY {
        g.iter().fold(f64::INFINITY, |m: f64, &x| {
            if x.is_nan() || m.is_nan() {
                f64::NAN
            } else {
                m.min(x.abs())
            }
        })
    } else if p == 0.0 {
        g.iter().filter(|&&x| x != 0.0).count() as f64
    } else if p == 1.0 {
        g.iter().map(|x| x.abs()).sum()
    } else if p == 2.0 {
        g.iter().map(|x| x * x).sum::<f64>().sqrt()
    } else {
        g.iter().map(|x| x.abs().powf(p)).sum::<f64>().powf(1.0 / p)
    }
}

fn infer_logsumexp(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let (mask, keep) = dims_arg(a, m.rank())?;
    Ok(vec![Meta::new(
        float_or_default(m.dtype),
        reduced_shape(&m.shape, &mask, keep),
    )])
}

/// torch's `logsumexp`: shifted by the maximum, except that infinite maxima are not subtracted.
fn logsumexp(g: &[f64]) -> f64 {
    let mut mx = max_of(g);
    if mx.is_infinite() || g.is_empty() {
        mx = 0.0;
    }
    g.iter().map(|x| (x - mx).exp()).sum::<f64>().ln() + mx
}

fn infer_count_nonzero(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let (mask, _) = dims_arg(a, m.rank())?;
    Ok(vec![Meta::new(
        DType::I64,
        reduced_shape(&m.shape, &mask, false),
    )])
}

/// Registers the reduction family.
pub(crate) fn register(r: &mut Registry) {
    register_sums(r);
    register_extremes(r);
    register_orders(r);
}

fn register_sums(r: &mut Registry) {
    r.pure(
        "aten.sum.default",
        "sum(Tensor self, *, ScalarType? dtype=None) -> Tensor",
        infer_sum,
        |a, m, _| eval_reduce(a, m, sum),
    );
    r.pure(
        "aten.sum.dim_IntList",
        "sum.dim_IntList(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor",
        infer_sum,
        |a, m, _| eval_reduce(a, m, sum),
    );
    r.pure(
        "aten.prod.default",
        "prod(Tensor self, *, ScalarType? dtype=None) -> Tensor",
        infer_sum,
        |a, m, _| eval_reduce(a, m, prod),
    );
    r.pure(
        "aten.prod.dim_int",
        "prod.dim_int(Tensor self, int dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor",
        infer_sum,
        |a, m, _| eval_reduce(a, m, prod),
    );
    r.pure(
        "aten.mean.default",
        "mean(Tensor self, *, ScalarType? dtype=None) -> Tensor",
        infer_mean,
        |a, m, _| eval_reduce(a, m, mean),
    );
    r.pure(
        "aten.mean.dim",
        "mean.dim(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor",
        infer_mean,
        |a, m, _| eval_reduce(a, m, mean),
    );
    for (name, schema) in [
        (
            "aten.var.correction",
            "var.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> Tensor",
        ),
        ("aten.var.default", "var(Tensor self, bool unbiased=True) -> Tensor"),
        (
            "aten.var.dim",
            "var.dim(Tensor self, int[1]? dim, bool unbiased=True, bool keepdim=False) -> Tensor",
        ),
    ] {
        r.pure(name, schema, |a| infer_var(a, false), |a, m, _| eval_var(a, m, false, false));
    }
    for (name, schema) in [
        (
            "aten.std.correction",
            "std.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> Tensor",
        ),
        ("aten.std.default", "std(Tensor self, bool unbiased=True) -> Tensor"),
        (
            "aten.std.dim",
            "std.dim(Tensor self, int[1]? dim, bool unbiased=True, bool keepdim=False) -> Tensor",
        ),
    ] {
        r.pure(name, schema, |a| infer_var(a, false), |a, m, _| eval_var(a, m, true, false));
    }
    r.pure(
        "aten.var_mean.correction",
        "var_mean.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> (Tensor, Tensor)",
        |a| infer_var(a, true),
        |a, m, _| eval_var(a, m, false, true),
    );
    r.pure(
        "aten.std_mean.correction",
        "std_mean.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> (Tensor, Tensor)",
        |a| infer_var(a, true),
        |a, m, _| eval_var(a, m, true, true),
    );
    r.pure(
        "aten.linalg_vector_norm.default",
        "linalg_vector_norm(Tensor self, Scalar ord=2, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor",
        infer_norm,
        |a, m, _| eval_norm(a, m),
    );
    r.pure(
        "aten.norm.Scalar",
        "norm.Scalar(Tensor self, Scalar p=2) -> Tensor",
        infer_norm,
        |a, m, _| eval_norm(a, m),
    );
    r.pure(
        "aten.norm.ScalarOpt_dim",
        "norm.ScalarOpt_dim(Tensor self, Scalar? p, int[1] dim, bool keepdim=False) -> Tensor",
        infer_norm,
        |a, m, _| eval_norm(a, m),
    );
    r.pure(
        "aten.logsumexp.default",
        "logsumexp(Tensor self, int[1] dim, bool keepdim=False) -> Tensor",
        infer_logsumexp,
        |a, m, _| {
            let t = a.tensor("self")?;
            let (mask, _) = dims_arg(a, t.meta.rank())?;
            Ok(vec![Tensor::new(
                m[0].clone(),
                reduce_groups(t, &mask, logsumexp),
            )])
        },
    );
    for (name, schema) in [
        ("aten.any.default", "any(Tensor self) -> Tensor"),
        (
            "aten.any.dim",
            "any.dim(Tensor self, int dim, bool keepdim=False) -> Tensor",
        ),
        (
            "aten.any.dims",
            "any.dims(Tensor self, int[1]? dim=None, bool keepdim=False) -> Tensor",
        ),
    ] {
        r.pure(name, schema, infer_any, |a, m, _| eval_any(a, m, false));
    }
    for (name, schema) in [
        ("aten.all.default", "all(Tensor self) -> Tensor"),
        (
            "aten.all.dim",
            "all.dim(Tensor self, int dim, bool keepdim=False) -> Tensor",
        ),
        (
            "aten.all.dims",
            "all.dims(Tensor self, int[1]? dim=None, bool keepdim=False) -> Tensor",
        ),
    ] {
        r.pure(name, schema, infer_any, |a, m, _| eval_any(a, m, true));
    }
    for (name, schema) in [
        (
            "aten.count_nonzero.default",
            "count_nonzero(Tensor self, int? dim=None) -> Tensor",
        ),
        (
            "aten.count_nonzero.dim_IntList",
            "count_nonzero.dim_IntList(Tensor self, int[] dim) -> Tensor",
        ),
    ] {
        r.pure(name, schema, infer_count_nonzero, |a, m, _| {
            let t = a.tensor("self")?;
            let (mask, _) = dims_arg(a, t.meta.rank())?;
            let data = reduce_groups(t, &mask, |g| g.iter().filter(|&&x| x != 0.0).count() as f64);
            Ok(vec![Tensor::new(m[0].clone(), data)])
        });
    }
    r.pure(
        "aten.cumsum.default",
        "cumsum(Tensor self, int dim, *, ScalarType? dtype=None) -> Tensor",
        infer_cumsum,
        |a, m, _| eval_scan(a, m, 0.0, |acc, x| acc + x),
    );
    r.pure(
        "aten.cumprod.default",
        "cumprod(Tensor self, int dim, *, ScalarType? dtype=None) -> Tensor",
        infer_cumsum,
        |a, m, _| eval_scan(a, m, 1.0, |acc, x| acc * x),
    );
}

fn register_extremes(r: &mut Registry) {
    r.pure(
        "aten.amax.default",
        "amax(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor",
        infer_extreme,
        |a, m, _| eval_reduce(a, m, max_of),
    );
    r.pure(
        "aten.amin.default",
        "amin(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor",
        infer_extreme,
        |a, m, _| eval_reduce(a, m, min_of),
    );
    r.pure(
        "aten.max.default",
        "max(Tensor self) -> Tensor",
        infer_extreme,
        |a, m, _| eval_reduce(a, m, max_of),
    );
    r.pure(
        "aten.min.default",
        "min(Tensor self) -> Tensor",
        infer_extreme,
        |a, m, _| eval_reduce(a, m, min_of),
    );
    r.pure(
        "aten.max.dim",
        "max.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)",
        infer_max_dim,
        |a, m, _| eval_max_dim(a, m, true),
    );
    r.pure(
        "aten.min.dim",
        "min.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)",
        infer_max_dim,
        |a, m, _| eval_max_dim(a, m, false),
    );
    r.pure(
        "aten.argmax.default",
        "argmax(Tensor self, int? dim=None, bool keepdim=False) -> Tensor",
        infer_argmax,
        |a, m, _| eval_argmax(a, m, true),
    );
    r.pure(
        "aten.argmin.default",
        "argmin(Tensor self, int? dim=None, bool keepdim=False) -> Tensor",
        infer_argmax,
        |a, m, _| eval_argmax(a, m, false),
    );
    r.pure(
        "aten.cummax.default",
        "cummax(Tensor self, int dim) -> (Tensor values, Tensor indices)",
        infer_cummax,
        |a, m, _| eval_cummax(a, m, true),
    );
    r.pure(
        "aten.cummin.default",
        "cummin(Tensor self, int dim) -> (Tensor values, Tensor indices)",
        infer_cummax,
        |a, m, _| eval_cummax(a, m, false),
    );
}

fn register_orders(r: &mut Registry) {
    r.pure(
        "aten.sort.default",
        "sort(Tensor self, int dim=-1, bool descending=False) -> (Tensor values, Tensor indices)",
        infer_sort,
        |a, m, _| eval_sort(a, m),
    );
    r.pure(
        "aten.sort.stable",
        "sort.stable(Tensor self, *, bool? stable, int dim=-1, bool descending=False) -> (Tensor values, Tensor indices)",
        infer_sort,
        |a, m, _| eval_sort(a, m),
    );
    let infer_argsort: fn(&Args) -> Result<Vec<Meta>, OpError> =
        |a| Ok(vec![infer_sort(a)?.remove(1)]);
    r.pure(
        "aten.argsort.default",
        "argsort(Tensor self, int dim=-1, bool descending=False) -> Tensor",
        infer_argsort,
        |a, m, _| eval_sort(a, m),
    );
    r.pure(
        "aten.argsort.stable",
        "argsort.stable(Tensor self, *, bool stable, int dim=-1, bool descending=False) -> Tensor",
        infer_argsort,
        |a, m, _| eval_sort(a, m),
    );
    r.pure(
        "aten.topk.default",
        "topk(Tensor self, SymInt k, int dim=-1, bool largest=True, bool sorted=True) -> (Tensor values, Tensor indices)",
        infer_topk,
        |a, m, _| eval_topk(a, m),
    );
}

#[cfg(test)]
mod tests {
    use crate::testing::{ar, call, call1, ints, t, v};
    use crate::Meta;
    use shardproof_ir::{Arg, DType};

    #[test]
    fn sums_and_means() {
        let x = ar(&[2, 3, 4]);
        let out = call1("aten.sum.dim_IntList", &[&x], &[v(0), ints(&[0, -1])], &[]);
        assert_eq!(
            (out.shape(), out.data.to_vec()),
            (&[3usize][..], vec![60.0, 92.0, 124.0])
        );
        let out = call1(
            "aten.sum.dim_IntList",
            &[&x],
            &[v(0), ints(&[1]), Arg::Bool(true)],
            &[],
        );
        assert_eq!(out.shape(), &[2, 1, 4]);
        assert_eq!(out.data[..2], [12.0, 15.0]);
        let out = call1("aten.sum.dim_IntList", &[&x], &[v(0), ints(&[])], &[]);
        assert_eq!((out.shape(), out.data[0]), (&[][..], 276.0));
        let out = call1("aten.sum.dim_IntList", &[&x], &[v(0), Arg::None], &[]);
        assert_eq!(out.data[0], 276.0);
        let b = t(DType::Bool, &[3], &[1.0, 1.0, 0.0]);
        let out = call1("aten.sum.default", &[&b], &[v(0)], &[]);
        assert_eq!((out.dtype(), out.data[0]), (DType::I64, 2.0));
        let out = call1(
            "aten.sum.default",
            &[&x],
            &[v(0)],
            &[("dtype", Arg::Dtype(DType::F64))],
        );
        assert_eq!(out.dtype(), DType::F64);
        assert!(call("aten.mean.default", &[&b], &[v(0)], &[]).is_err());
        let out = call1("aten.mean.dim", &[&ar(&[2, 2])], &[v(0), ints(&[1])], &[]);
        assert_eq!(*out.data, vec![0.5, 2.5]);
        let out = call1(
            "aten.mean.default",
            &[&b],
            &[v(0)],
            &[("dtype", Arg::Dtype(DType::F32))],
        );
        assert!((out.data[0] - 2.0 / 3.0).abs() < 1e-12);
        let out = call1(
            "aten.prod.dim_int",
            &[&t(DType::I32, &[2, 2], &[2.0, 3.0, 4.0, 5.0])],
            &[v(0), Arg::Int(0)],
            &[],
        );
        assert_eq!(
            (out.dtype(), out.data.to_vec()),
            (DType::I64, vec![8.0, 15.0])
        );
        assert!(call("aten.sum.dim_IntList", &[&x], &[v(0), ints(&[3])], &[]).is_err());
        assert!(call("aten.sum.dim_IntList", &[&x], &[v(0), ints(&[1, -2])], &[]).is_err());
        let e = t(DType::F32, &[0, 2], &[]);
        let out = call1("aten.sum.dim_IntList", &[&e], &[v(0), ints(&[0])], &[]);
        assert_eq!(*out.data, vec![0.0, 0.0]);
        assert!(call("aten.amax.default", &[&e], &[v(0), ints(&[0])], &[]).is_err());
        let out = call1("aten.amax.default", &[&e], &[v(0), ints(&[1])], &[]);
        assert_eq!(out.shape(), &[0]);
    }

    #[test]
    fn extremes_pick_first_occurrence() {
        let x = t(
            DType::F32,
            &[2, 4],
            &[1.0, 3.0, 3.0, 2.0, 0.0, f64::NAN, 5.0, f64::NAN],
        );
        let out = call("aten.max.dim", &[&x], &[v(0), Arg::Int(1)], &[]).unwrap();
        assert_eq!(out[0].data[0], 3.0);
        assert!(out[0].data[1].is_nan());
        assert_eq!(
            (out[1].dtype(), out[1].data.to_vec()),
            (DType::I64, vec![1.0, 1.0])
        );
        let out = call(
            "aten.min.dim",
            &[&x],
            &[v(0), Arg::Int(-1), Arg::Bool(true)],
            &[],
        )
        .unwrap();
        assert_eq!(out[1].shape(), &[2, 1]);
        assert_eq!(*out[1].data, vec![0.0, 1.0]);
        let y = t(DType::I64, &[2, 2], &[4.0, 1.0, 4.0, 0.0]);
        let out = call1(
            "aten.argmax.default",
            &[&y],
            &[v(0)],
            &[("keepdim", Arg::Bool(true))],
        );
        assert_eq!(
            (out.shape(), out.data.to_vec()),
            (&[1usize, 1][..], vec![0.0])
        );
        let out = call1("aten.argmin.default", &[&y], &[v(0), Arg::Int(0)], &[]);
        assert_eq!(*out.data, vec![0.0, 1.0]);
        let out = call1("aten.amax.default", &[&y], &[v(0), ints(&[0])], &[]);
        assert_eq!(
            (out.dtype(), out.data.to_vec()),
            (DType::I64, vec![4.0, 1.0])
        );
        let out = call1("aten.max.default", &[&y], &[v(0)], &[]);
        assert_eq!(out.data[0], 4.0);
        assert!(call(
            "aten.max.default",
            &[&t(DType::F32, &[0], &[])],
            &[v(0)],
            &[]
        )
        .is_err());
        let out = call(
            "aten.cummax.default",
            &[&t(DType::F32, &[4], &[1.0, 3.0, 3.0, 2.0])],
            &[v(0), Arg::Int(0)],
            &[],
        )
        .unwrap();
        assert_eq!(*out[0].data, vec![1.0, 3.0, 3.0, 3.0]);
        assert_eq!(*out[1].data, vec![0.0, 1.0, 2.0, 2.0]);
    }

    #[test]
    fn sort_and_topk_are_stable() {
        let x = t(DType::F32, &[4], &[2.0, 1.0, 2.0, f64::NAN]);
        let out = call(
            "aten.sort.default",
            &[&x],
            &[v(0)],
            &[("descending", Arg::Bool(true))],
        )
        .unwrap();
        assert!(out[0].data[0].is_nan());
        assert_eq!(out[0].data[1..], [2.0, 2.0, 1.0]);
        assert_eq!(*out[1].data, vec![3.0, 0.0, 2.0, 1.0]);
        let out = call(
            "aten.sort.stable",
            &[&x],
            &[v(0)],
            &[("stable", Arg::Bool(true))],
        )
        .unwrap();
        assert_eq!(out[0].data[..3], [1.0, 2.0, 2.0]);
        assert_eq!(*out[1].data, vec![1.0, 0.0, 2.0, 3.0]);
        let y = t(
            DType::F32,
            &[2, 4],
            &[1.0, 3.0, 3.0, 2.0, 5.0, 6.0, 7.0, 8.0],
        );
        let out = call("aten.topk.default", &[&y], &[v(0), Arg::Int(2)], &[]).unwrap();
        assert_eq!(out[0].shape(), &[2, 2]);
        assert_eq!(*out[0].data, vec![3.0, 3.0, 8.0, 7.0]);
        assert_eq!(*out[1].data, vec![1.0, 2.0, 3.0, 2.0]);
        let out = call(
            "aten.topk.default",
            &[&y],
            &[v(0), Arg::Int(1), Arg::Int(0), Arg::Bool(false)],
            &[],
        )
        .unwrap();
        assert_eq!(*out[0].data, vec![1.0, 3.0, 3.0, 2.0]);
        assert_eq!(*out[1].data, vec![0.0; 4]);
        assert!(call("aten.topk.default", &[&y], &[v(0), Arg::Int(5)], &[]).is_err());
        let out = call1(
            "aten.argsort.default",
            &[&y],
            &[v(0), Arg::Int(1), Arg::Bool(true)],
            &[],
        );
        assert_eq!(out.data[..4], [1.0, 2.0, 3.0, 0.0]);
    }

    #[test]
    fn statistics_and_scans() {
        let x = t(DType::F64, &[4], &[1.0, 2.0, 3.0, 4.0]);
        let out = call1("aten.var.correction", &[&x], &[v(0)], &[]);
        assert!((out.data[0] - 5.0 / 3.0).abs() < 1e-12);
        let out = call1(
            "aten.var.correction",
            &[&x],
            &[v(0), Arg::None],
            &[("correction", Arg::Int(0))],
        );
        assert!((out.data[0] - 1.25).abs() < 1e-12);
        let out = call(
            "aten.std_mean.correction",
            &[&x],
            &[v(0), ints(&[0])],
            &[("keepdim", Arg::Bool(true))],
        )
        .unwrap();
        assert_eq!(out[0].shape(), &[1]);
        assert!((out[0].data[0] - (5.0f64 / 3.0).sqrt()).abs() < 1e-12);
        assert_eq!(out[1].data[0], 2.5);
        assert!(call(
            "aten.var.correction",
            &[&t(DType::I64, &[2], &[1.0, 2.0])],
            &[v(0)],
            &[]
        )
        .is_err());
        let out = call1("aten.linalg_vector_norm.default", &[&x], &[v(0)], &[]);
        assert!((out.data[0] - 30f64.sqrt()).abs() < 1e-12);
        let out = call1(
            "aten.linalg_vector_norm.default",
            &[&x],
            &[v(0), Arg::Float(f64::INFINITY)],
            &[],
        );
        assert_eq!(out.data[0], 4.0);
        let out = call1(
            "aten.linalg_vector_norm.default",
            &[&x],
            &[v(0), Arg::Int(1)],
            &[],
        );
        assert_eq!(out.data[0], 10.0);
        let ninf = t(DType::F32, &[2], &[f64::NEG_INFINITY, f64::NEG_INFINITY]);
        let out = call1("aten.logsumexp.default", &[&ninf], &[v(0), ints(&[0])], &[]);
        assert_eq!(out.data[0], f64::NEG_INFINITY);
        let out = call1("aten.logsumexp.default", &[&x], &[v(0), ints(&[0])], &[]);
        assert!((out.data[0] - 4.440189698561196).abs() < 1e-12);
        let i = t(DType::I32, &[2, 2], &[1.0, 2.0, 3.0, 4.0]);
        let out = call1("aten.cumsum.default", &[&i], &[v(0), Arg::Int(0)], &[]);
        assert_eq!(
            (out.dtype(), out.data.to_vec()),
            (DType::I64, vec![1.0, 2.0, 4.0, 6.0])
        );
        let out = call1(
            "aten.cumsum.default",
            &[&i],
            &[v(0), Arg::Int(-1)],
            &[("dtype", Arg::Dtype(DType::F32))],
        );
        assert_eq!(
            (out.dtype(), out.data.to_vec()),
            (DType::F32, vec![1.0, 3.0, 3.0, 7.0])
        );
        let e = t(DType::F32, &[0], &[]);
        let out = call1("aten.any.default", &[&e], &[v(0)], &[]);
        assert_eq!(
            (out.meta.clone(), out.data[0]),
            (Meta::new(DType::Bool, vec![]), 0.0)
        );
        let out = call1("aten.all.default", &[&e], &[v(0)], &[]);
        assert_eq!(out.data[0], 1.0);
        let m = t(DType::F32, &[2, 2], &[0.0, 1.0, 0.0, 0.0]);
        let out = call1("aten.any.dim", &[&m], &[v(0), Arg::Int(1)], &[]);
        assert_eq!(*out.data, vec![1.0, 0.0]);
        let out = call1("aten.count_nonzero.default", &[&m], &[v(0)], &[]);
        assert_eq!((out.dtype(), out.data[0]), (DType::I64, 1.0));
    }
}

/// Calls many operators on degenerate inputs (0-d, empty, mixed dtypes, odd dims) and checks
/// that each returns a result or an error, never a panic (nor a kernel/inference mismatch,
/// which debug builds assert).
#[cfg(test)]
mod robustness {
    use crate::testing::{call, ints, t, v};
    use crate::Tensor;
    use shardproof_ir::{Arg, DType};

    fn inputs() -> Vec<Tensor> {
        let mut out = Vec::new();
        for d in [DType::F32, DType::I64, DType::Bool] {
            for shape in [&[][..], &[0], &[2, 0], &[3, 2], &[1, 3, 1]] {
                let n: usize = shape.iter().product();
                let data: Vec<f64> = (0..n)
                    .map(|i| {
                        if d == DType::Bool {
                            (i % 2) as f64
                        } else {
                            i as f64 - 1.0
                        }
                    })
                    .collect();
                out.push(t(d, shape, &data));
            }
        }
        out
    }

    #[test]
    fn degenerate_inputs_never_panic() {
        let unary = [
            "neg",
            "abs",
            "sign",
            "floor",
            "round",
            "frac",
            "exp",
            "log",
            "sqrt",
            "rsqrt",
            "sigmoid",
            "erf",
            "erfinv",
            "isnan",
            "logical_not",
            "bitwise_not",
            "nan_to_num",
            "clone",
            "detach",
            "detach_",
            "_assert_tensor_metadata",
            "t",
            "squeeze",
            "sum",
            "mean",
            "prod",
            "max",
            "min",
            "argmax",
            "any",
            "all",
            "var",
            "std",
            "count_nonzero",
            "nonzero",
            "zeros_like",
            "empty_like",
            "zero",
        ];
        let with_args: Vec<(&str, Vec<Arg>)> = vec![
            ("aten.sum.dim_IntList", vec![ints(&[0])]),
            ("aten.sum.dim_IntList", vec![ints(&[-1]), Arg::Bool(true)]),
            ("aten.sum.dim_IntList", vec![Arg::None]),
            ("aten.mean.dim", vec![ints(&[1])]),
            ("aten.amax.default", vec![ints(&[0])]),
            ("aten.amin.default", vec![]),
            ("aten.max.dim", vec![Arg::Int(0)]),
            ("aten.min.dim", vec![Arg::Int(-1), Arg::Bool(true)]),
            ("aten.argmin.default", vec![Arg::Int(0), Arg::Bool(true)]),
            ("aten.var.correction", vec![ints(&[0])]),
            ("aten.any.dims", vec![ints(&[0])]),
            ("aten.cumsum.default", vec![Arg::Int(0)]),
            ("aten.cummax.default", vec![Arg::Int(-1)]),
            ("aten.sort.default", vec![Arg::Int(0)]),
            ("aten.topk.default", vec![Arg::Int(1)]),
            ("aten.topk.default", vec![Arg::Int(0), Arg::Int(0)]),
            ("aten.logsumexp.default", vec![ints(&[0])]),
            (
                "aten.linalg_vector_norm.default",
                vec![Arg::Float(f64::INFINITY)],
            ),
            ("aten.view.default", vec![ints(&[-1])]),
            ("aten.reshape.default", vec![ints(&[0, -1])]),
            ("aten.permute.default", vec![ints(&[1, 0])]),
            ("aten.transpose.int", vec![Arg::Int(0), Arg::Int(-1)]),
            ("aten.expand.default", vec![ints(&[2, -1, -1])]),
            ("aten.slice.Tensor", vec![Arg::Int(0), Arg::Int(1)]),
            (
                "aten.slice.Tensor",
                vec![Arg::Int(-1), Arg::None, Arg::None, Arg::Int(2)],
            ),
            ("aten.select.int", vec![Arg::Int(0), Arg::Int(0)]),
            ("aten.squeeze.dims", vec![ints(&[0, 2])]),
            ("aten.unsqueeze.default", vec![Arg::Int(-1)]),
            ("aten.flatten.using_ints", vec![Arg::Int(1)]),
            ("aten.unflatten.int", vec![Arg::Int(0), ints(&[1, -1])]),
            ("aten.split.Tensor", vec![Arg::Int(1)]),
            ("aten.split.Tensor", vec![Arg::Int(0)]),
            ("aten.chunk.default", vec![Arg::Int(2), Arg::Int(-1)]),
            ("aten.unbind.int", vec![Arg::Int(1)]),
            (
                "aten.narrow.default",
                vec![Arg::Int(0), Arg::Int(0), Arg::Int(1)],
            ),
            ("aten.roll.default", vec![Arg::Int(1), Arg::Int(0)]),
            ("aten.flip.default", vec![ints(&[0, -1])]),
            ("aten.repeat.default", vec![ints(&[2, 1, 2])]),
            ("aten.constant_pad_nd.default", vec![ints(&[1, -1])]),
            (
                "aten.pad.default",
                vec![ints(&[1, 1]), Arg::Str("reflect".into())],
            ),
            (
                "aten.pad.default",
                vec![ints(&[2, 0]), Arg::Str("replicate".into())],
            ),
            (
                "aten.pad.default",
                vec![ints(&[1, -1]), Arg::Str("circular".into())],
            ),
            (
                "aten.pad.default",
                vec![ints(&[-1, 0, 1, 1]), Arg::Str("circular".into())],
            ),
            ("aten.broadcast_tensors.default", vec![]),
            (
                "aten.scaled_dot_product_attention.default",
                vec![v(1), v(1)],
            ),
            (
                "aten.scaled_dot_product_attention.default",
                vec![v(0), v(0), v(1), Arg::Float(0.0), Arg::Bool(false)],
            ),
            ("aten.tril.default", vec![Arg::Int(-1)]),
            ("aten.diagonal.default", vec![Arg::Int(1)]),
            (
                "aten.unfold.default",
                vec![Arg::Int(0), Arg::Int(1), Arg::Int(1)],
            ),
            ("aten.as_strided.default", vec![ints(&[2]), ints(&[1])]),
            ("aten._to_copy.default", vec![]),
            ("aten.pow.Tensor_Scalar", vec![Arg::Int(-2)]),
            ("aten.div.Scalar_mode", vec![Arg::Int(0), Arg::None]),
            ("aten.clamp.default", vec![Arg::Float(0.5), Arg::Int(1)]),
            ("aten.round.decimals", vec![]),
            ("aten.new_full.default", vec![ints(&[2]), Arg::Float(1.5)]),
            ("aten.full_like.default", vec![Arg::Bool(true)]),
            ("aten.index_select.default", vec![Arg::Int(0), v(1)]),
            ("aten.gather.default", vec![Arg::Int(0), v(1)]),
            ("aten.index.Tensor", vec![Arg::List(vec![v(1)])]),
            ("aten.index.Tensor", vec![Arg::List(vec![Arg::None, v(1)])]),
            (
                "aten.index_put.default",
                vec![Arg::List(vec![v(1)]), v(0), Arg::Bool(true)],
            ),
            ("aten.masked_fill.Scalar", vec![v(1), Arg::Int(3)]),
            ("aten.where.self", vec![v(0), v(1)]),
            ("aten.masked_select.default", vec![v(1)]),
            ("aten.scatter.value", vec![Arg::Int(0), v(1), Arg::Int(1)]),
            (
                "aten.index_fill.int_Scalar",
                vec![Arg::Int(0), v(1), Arg::Int(1)],
            ),
        ];
        let binary = [
            "aten.add.Tensor",
            "aten.sub.Tensor",
            "aten.mul.Tensor",
            "aten.div.Tensor",
            "aten.remainder.Tensor",
            "aten.pow.Tensor_Tensor",
            "aten.eq.Tensor",
            "aten.maximum.default",
            "aten.bitwise_and.Tensor",
            "aten.__xor__.Tensor",
            "aten.logical_xor.default",
            "aten.copy.default",
            "aten.atan2.default",
        ];
        let xs = inputs();
        let mut failures = Vec::new();
        let mut run = |op: &str, ts: &[&Tensor], args: &[Arg]| {
            let r = std::panic::catch_unwind(|| call(op, ts, args, &[]));
            if r.is_err() {
                failures.push(format!(
                    "{op} on {:?} with {args:?}",
                    ts.iter().map(|t| &t.meta).collect::<Vec<_>>()
                ));
            }
        };
        for x in &xs {
            for u in unary {
                let name = format!("aten.{u}.default");
                run(&name, &[x], &[v(0)]);
            }
            for (op, extra) in &with_args {
                for y in &xs {
                    let mut args = vec![v(0)];
                    args.extend(extra.iter().cloned());
                    run(op, &[x, y], &args);
                }
            }
            for op in binary {
                for y in &xs {
                    run(op, &[x, y], &[v(0), v(1)]);
                }
                run(op, &[x], &[v(0), Arg::Float(2.0)]);
            }
            for y in &xs {
                run(
                    "aten.cat.default",
                    &[x, y],
                    &[Arg::List(vec![v(0), v(1)]), Arg::Int(-1)],
                );
                run(
                    "aten.stack.default",
                    &[x, y],
                    &[Arg::List(vec![v(0), v(1)])],
                );
            }
        }
        assert!(
            failures.is_empty(),
            "{} panics:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }
}
