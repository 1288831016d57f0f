//! Reorderings of the elements: `permute`, `transpose`/`t`, `roll`, `flip`.

use super::strided::{istrides, norm_dims, permute_data, strided_read};
use crate::util::norm_dim;
use crate::{Args, Meta, OpError, Tensor};

pub(super) fn infer_permute(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let perm = permutation(a, &m)?;
    Ok(vec![Meta::new(
        m.dtype,
        perm.iter().map(|&p| m.shape[p]).collect(),
    )])
}

/// The permutation of `permute` or `transpose`/`t` as input dims of each output dim.
fn permutation(a: &Args, m: &Meta) -> Result<Vec<usize>, OpError> {
    let r = m.rank();
    let name = a.schema().name.split('.').next().unwrap_or("");
    match name {
        "permute" | "permute_copy" => {
            let dims = a.int_list("dims")?;
            if dims.len() != r {
                return Err(OpError::new(format!(
                    "permute: number of dims {} does not match the tensor's {r}",
                    dims.len()
                )));
            }
            norm_dims(&dims, r)
        }
        "t" | "t_copy" => {
            if r > 2 {
                return Err(OpError::new(format!(
                    "t() expects a tensor with <= 2 dims, got {r}"
                )));
            }
            Ok((0..r).rev().collect())
        }
        _ => {
            let d0 = norm_dim(a.int("dim0")?, r)?;
            let d1 = norm_dim(a.int("dim1")?, r)?;
            let mut p: Vec<usize> = (0..r).collect();
            if r > 0 {
                p.swap(d0, d1);
            }
            Ok(p)
        }
    }
}

pub(super) fn eval_permute(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let perm = permutation(a, &t.meta)?;
    Ok(vec![Tensor::new(m[0].clone(), permute_data(t, &perm))])
}

/// `(dim, shift)` pairs of `roll`, or `None` for a roll of the flattened tensor.
pub(super) fn roll_args(a: &Args, m: &Meta) -> Result<Option<Vec<(usize, i64)>>, OpError> {
    let shifts = a.int_list("shifts")?;
    let dims = a.int_list("dims")?;
    if dims.is_empty() {
        if shifts.len() != 1 {
            return Err(OpError::new(
                "roll: shifts must have one entry when dims is empty",
            ));
        }
        return Ok(None);
    }
    if dims.len() != shifts.len() {
        return Err(OpError::new(format!(
            "roll: shifts and dimensions must align, got {} shifts and {} dims",
            shifts.len(),
            dims.len()
        )));
    }
    let mut out = Vec::new();
    for (&d, &s) in dims.iter().zip(&shifts) {
        out.push((norm_dim(d, m.rank())?, s));
    }
    Ok(Some(out))
}

/// Rolls `data` of `shape` by `shift` along `dim`.
fn roll_dim(data: &[f64], shape: &[usize], dim: usize, shift: i64) -> Vec<f64> {
    let n = shape.get(dim).copied().unwrap_or(1);
    if n == 0 || data.is_empty() {
        return data.to_vec();
    }
    let outer: usize = shape[..dim.min(shape.len())].iter().product();
    let inner: usize = shape.get(dim + 1..).map_or(1, |s| s.iter().product());
    let s = shift.rem_euclid(n as i64) as usize;
    let mut out = vec![0.0; data.len()];
    for o in 0..outer {
        for i in 0..n {
            let src = (o * n + i) * inner;
            let dst = (o * n + (i + s) % n) * inner;
            out[dst..dst + inner].copy_from_slice(&data[src..src + inner]);
        }
    }
    out
}

pub(super) fn eval_roll(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let data = match roll_args(a, &t.meta)? {
        None => roll_dim(&t.data, &[t.numel()], 0, a.int_list("shifts")?[0]),
        Some(pairs) => {
            let mut d = t.data.as_ref().clone();
            for (dim, s) in pairs {
                d = roll_dim(&d, t.shape(), dim, s);
            }
            d
        }
    };
    Ok(vec![Tensor::new(m[0].clone(), data)])
}

pub(super) fn eval_flip(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let dims = norm_dims(&a.int_list("dims")?, t.meta.rank())?;
    let mut st = istrides(t.shape());
    let mut off = 0usize;
    if t.meta.rank() > 0 && t.numel() > 0 {
        for d in dims {
            off += (t.shape()[d] - 1) * st[d] as usize;
            st[d] = -st[d];
        }
    }
    Ok(vec![Tensor::new(
        m[0].clone(),
        strided_read(&t.data, off, t.shape(), &st),
    )])
}

pub(super) fn infer_flip(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    norm_dims(&a.int_list("dims")?, m.rank())?;
    Ok(vec![m])
}
