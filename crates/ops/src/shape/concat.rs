//! Tensor lists in and out: `cat`, `stack`, and the splits (`split`, `split_with_sizes`,
//! `chunk`, `unbind`).

use super::strided::{istrides, strided_read, usize_of};
use crate::elementwise::cast_to;
use crate::util::norm_dim;
use crate::{Args, Meta, OpError, Tensor};
use std::borrow::Cow;

/// The metas of a tensor-list argument, none of them `None`.
pub(super) fn list_metas(a: &Args, name: &str) -> Result<Vec<Meta>, OpError> {
    a.metas(name)?
        .into_iter()
        .map(|m| {
            m.ok_or_else(|| OpError::new(format!("{}: `{name}` holds a None", a.schema().name)))
        })
        .collect()
}

/// The tensors of a tensor-list argument, none of them `None`.
fn list_tensors<'t>(a: &Args<'t>, name: &str) -> Result<Vec<&'t Tensor>, OpError> {
    a.tensors(name)?
        .into_iter()
        .map(|m| {
            m.ok_or_else(|| OpError::new(format!("{}: `{name}` holds a None", a.schema().name)))
        })
        .collect()
}

/// torch's legacy rule: 1-d empty tensors are skipped by `cat`, whatever the other shapes.
fn cat_skipped(m: &Meta) -> bool {
    m.shape == [0]
}

/// The normalized dim and output meta of `cat`.
pub(super) fn cat_meta(a: &Args) -> Result<(usize, Meta), OpError> {
    let ms = list_metas(a, "tensors")?;
    if ms.is_empty() {
        return Err(OpError::new(
            "torch.cat(): expected a non-empty list of Tensors",
        ));
    }
    let dtype = ms
        .iter()
        .skip(1)
        .fold(ms[0].dtype, |d, m| d.promote(m.dtype));
    let kept: Vec<&Meta> = ms.iter().filter(|m| !cat_skipped(m)).collect();
    let Some(first) = kept.first() else {
        return Ok((0, Meta::new(dtype, vec![0])));
    };
    if first.rank() == 0 {
        return Err(OpError::new(
            "zero-dimensional tensor cannot be concatenated",
        ));
    }
    let dim = norm_dim(a.int("dim")?, first.rank())?;
    let mut shape = first.shape.clone();
    shape[dim] = 0;
    for m in &kept {
        if m.rank() != first.rank() {
            return Err(OpError::new(format!(
                "torch.cat(): tensors must have the same number of dimensions: got {} and {}",
                first.rank(),
                m.rank()
            )));
        }
        for d in 0..m.rank() {
            if d != dim && m.shape[d] != first.shape[d] {
                return Err(OpError::new(format!(
                    "torch.cat(): sizes of tensors must match except in dimension {dim}: expected size {} but got size {} at dimension {d}",
                    first.shape[d], m.shape[d]
                )));
            }
        }
        shape[dim] += m.shape[dim];
    }
    Ok((dim, Meta::new(dtype, shape)))
}

/// Concatenates tensors (converted to `out`'s dtype) along `dim`.
fn concat(ts: &[&Tensor], dim: usize, out: &Meta) -> Tensor {
    let outer: usize = out.shape[..dim].iter().product();
    let inner: usize = out.shape[dim + 1..].iter().product();
    let mut data = Vec::with_capacity(out.numel());
    let cast: Vec<Cow<Tensor>> = ts
        .iter()
        .map(|t| cast_to(Cow::Borrowed(*t), out.dtype))
        .collect();
    for o in 0..outer {
        for t in &cast {
            let chunk = t.shape()[dim] * inner;
            data.extend_from_slice(&t.data[o * chunk..(o + 1) * chunk]);
        }
    }
    Tensor::new(out.clone(), data)
}

pub(super) fn eval_cat(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    let (dim, _) = cat_meta(a)?;
    let ts: Vec<&Tensor> = list_tensors(a, "tensors")?
        .into_iter()
        .filter(|t| !cat_skipped(&t.meta))
        .collect();
    if ts.is_empty() {
        return Ok(vec![Tensor::new(m[0].clone(), vec![])]);
    }
    Ok(vec![concat(&ts, dim, &m[0])])
}

/// The normalized dim and output meta of `stack`.
pub(super) fn stack_meta(a: &Args) -> Result<(usize, Meta), OpError> {
    let ms = list_metas(a, "tensors")?;
    let Some(first) = ms.first() else {
        return Err(OpError::new("stack expects a non-empty TensorList"));
    };
    if let Some(m) = ms.iter().find(|m| m.shape != first.shape) {
        return Err(OpError::new(format!(
            "stack expects each tensor to be equal size, but got {:?} and {:?}",
            first.shape, m.shape
        )));
    }
    let dim = norm_dim(a.int("dim")?, first.rank() + 1)?;
    let dtype = ms
        .iter()
        .skip(1)
        .fold(first.dtype, |d, m| d.promote(m.dtype));
    let mut shape = first.shape.clone();
    shape.insert(dim, ms.len());
    Ok((dim, Meta::new(dtype, shape)))
}

pub(super) fn eval_stack(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    let (dim, _) = stack_meta(a)?;
    let ts = list_tensors(a, "tensors")?;
    let mut item = ts[0].shape().to_vec();
    item.insert(dim, 1);
    let unsq: Vec<Tensor> = ts.iter().map(|t| t.reshaped(item.clone())).collect();
    let refs: Vec<&Tensor> = unsq.iter().collect();
    Ok(vec![concat(&refs, dim, &m[0])])
}

/// The dim and the sizes of the pieces of a splitting op.
fn split_sizes(a: &Args, m: &Meta) -> Result<(usize, Vec<usize>), OpError> {
    if m.rank() == 0 {
        return Err(OpError::new(format!(
            "{} cannot be applied to a 0-dim tensor",
            a.schema().name
        )));
    }
    let base = a.schema().name.split('.').next().unwrap_or("");
    let dim = norm_dim(a.int("dim")?, m.rank())?;
    let n = m.shape[dim];
    let sizes = match base {
        "split" => {
            let s = a.int("split_size")?;
            if s < 0 || (s == 0 && n != 0) {
                return Err(OpError::new(format!(
                    "split expects split_size be non-negative (and positive for a non-empty dim), got {s}"
                )));
            }
            let s = s as usize;
            let pieces = if s == 0 { 1 } else { n.div_ceil(s).max(1) };
            (0..pieces)
                .map(|i| s.min(n.saturating_sub(i * s)))
                .collect()
        }
        "split_with_sizes" => {
            let sizes = a
                .int_list("split_sizes")?
                .into_iter()
                .map(|s| usize_of(s, "a split size"))
                .collect::<Result<Vec<_>, _>>()?;
            if sizes.iter().sum::<usize>() != n {
                return Err(OpError::new(format!(
                    "split_with_sizes expects split_sizes to sum exactly to {n}, got {sizes:?}"
                )));
            }
            sizes
        }
        "chunk" => {
            let c = a.int("chunks")?;
            if c <= 0 {
                return Err(OpError::new(format!(
                    "chunk expects `chunks` to be greater than 0, got {c}"
                )));
            }
            let c = c as usize;
            let s = n.div_ceil(c);
            if s == 0 {
                vec![0; c]
            } else {
                let pieces = n.div_ceil(s);
                (0..pieces).map(|i| s.min(n - i * s)).collect()
            }
        }
        _ => vec![1; n],
    };
    Ok((dim, sizes))
}

pub(super) fn infer_split(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let (dim, sizes) = split_sizes(a, &m)?;
    let unbind = a.schema().name.starts_with("unbind");
    Ok(sizes
        .into_iter()
        .map(|s| {
            let mut shape = m.shape.clone();
            if unbind {
                shape.remove(dim);
            } else {
                shape[dim] = s;
            }
            Meta::new(m.dtype, shape)
        })
        .collect())
}

pub(super) fn eval_split(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let (dim, sizes) = split_sizes(a, &t.meta)?;
    let st = istrides(t.shape());
    let mut start = 0;
    let mut out = Vec::with_capacity(sizes.len());
    for (s, meta) in sizes.into_iter().zip(m) {
        let mut shape = t.shape().to_vec();
        shape[dim] = s;
        let data = strided_read(&t.data, start * st[dim] as usize, &shape, &st);
        out.push(Tensor::new(meta.clone(), data));
        start += s;
    }
    Ok(out)
}
