//! Shape operators: views, reshapes, permutations, slicing, concatenation and splitting, copies
//! and dtype conversions, scatters into slices, padding.
//!
//! Tensors are dense and row-major, so every view is materialized; views that keep the order of
//! the elements (`view`, `reshape`, `squeeze`...) share the data instead.

use crate::elementwise::cast_to;
use crate::tensor::{cast_value, strides};
use crate::util::{broadcast_shapes, broadcast_to, norm_dim};
use crate::{Args, Meta, OpError, Registry, Tensor};
use shardproof_ir::DType;
use std::borrow::Cow;

/// Calls `f` with the flat offset of every element of the strided view
/// (`offset + sum(idx[i] * strides[i])`), in row-major order of `shape`. The caller checks that
/// every offset is in bounds (see [`strided_bounds`]).
pub(crate) fn for_each_strided(
    offset: usize,
    shape: &[usize],
    st: &[isize],
    mut f: impl FnMut(usize),
) {
    if shape.contains(&0) {
        return;
    }
    let r = shape.len();
    if r == 0 {
        f(offset);
        return;
    }
    let mut idx = vec![0usize; r];
    let mut pos = offset as isize;
    let (ls, lst) = (shape[r - 1], st[r - 1]);
    loop {
        let mut p = pos;
        for _ in 0..ls {
            f(p as usize);
            p += lst;
        }
        let mut d = r - 1;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            pos += st[d];
            if idx[d] < shape[d] {
                break;
            }
            pos -= st[d] * shape[d] as isize;
            idx[d] = 0;
        }
    }
}

/// The smallest and largest flat offsets of a non-empty strided view.
pub(crate) fn strided_bounds(offset: usize, shape: &[usize], st: &[isize]) -> (isize, isize) {
    let mut lo = offset as isize;
    let mut hi = offset as isize;
    for (&n, &s) in shape.iter().zip(st) {
        let span = s * (n as isize - 1);
        if span < 0 {
            lo += span;
        } else {
            hi += span;
        }
    }
    (lo, hi)
}

/// The elements of a strided view of `data`.
pub(crate) fn strided_read(data: &[f64], offset: usize, shape: &[usize], st: &[isize]) -> Vec<f64> {
    let mut out = Vec::with_capacity(shape.iter().product());
    for_each_strided(offset, shape, st, |i| out.push(data[i]));
    out
}

/// Row-major strides of `shape` as signed numbers.
pub(crate) fn istrides(shape: &[usize]) -> Vec<isize> {
    strides(shape).into_iter().map(|s| s as isize).collect()
}

/// The data of `t` with its dims permuted (`perm[i]` is the input dim of output dim `i`).
pub(crate) fn permute_data(t: &Tensor, perm: &[usize]) -> Vec<f64> {
    let st = istrides(t.shape());
    let shape: Vec<usize> = perm.iter().map(|&p| t.shape()[p]).collect();
    let pst: Vec<isize> = perm.iter().map(|&p| st[p]).collect();
    strided_read(&t.data, 0, &shape, &pst)
}

/// Normalizes a list of dims, rejecting repeats.
pub(crate) fn norm_dims(dims: &[i64], rank: usize) -> Result<Vec<usize>, OpError> {
    let mut out = Vec::with_capacity(dims.len());
    for &d in dims {
        let n = norm_dim(d, rank)?;
        if out.contains(&n) {
            return Err(OpError::new(format!(
                "dim {d} appears multiple times in the list of dims"
            )));
        }
        out.push(n);
    }
    Ok(out)
}

/// A non-negative size from a schema integer.
fn usize_of(v: i64, what: &str) -> Result<usize, OpError> {
    usize::try_from(v).map_err(|_| OpError::new(format!("{what} must be non-negative, got {v}")))
}

/// The shape requested by `view`/`reshape` for `numel` elements, with at most one -1.
pub(crate) fn infer_size(size: &[i64], numel: usize) -> Result<Vec<usize>, OpError> {
    let mut infer_at = None;
    let mut known: usize = 1;
    for (i, &s) in size.iter().enumerate() {
        if s == -1 {
            if infer_at.replace(i).is_some() {
                return Err(OpError::new("only one dimension can be inferred"));
            }
        } else {
            known = known
                .checked_mul(usize_of(s, "a view size")?)
                .ok_or_else(|| OpError::new("view size overflows"))?;
        }
    }
    let mut out: Vec<usize> = size.iter().map(|&s| s.max(0) as usize).collect();
    match infer_at {
        Some(i) => {
            if numel.checked_rem(known) != Some(0) {
                return Err(OpError::new(format!(
                    "shape {size:?} is invalid for input of size {numel}"
                )));
            }
            out[i] = numel / known;
        }
        None if known != numel => {
            return Err(OpError::new(format!(
                "shape {size:?} is invalid for input of size {numel}"
            )))
        }
        None => {}
    }
    Ok(out)
}

/// `(start, length)` of `slice(start, end, step)` on a dim of `size`, clamped as torch does,
/// with `length` counted in steps.
pub(crate) fn slice_range(
    size: usize,
    start: Option<i64>,
    end: Option<i64>,
    step: i64,
) -> Result<(usize, usize), OpError> {
    if step <= 0 {
        return Err(OpError::new(format!(
            "slice step must be positive, got {step}"
        )));
    }
    let n = size as i64;
    let mut s = start.unwrap_or(0);
    let mut e = end.unwrap_or(i64::MAX);
    if s < 0 {
        s = s.saturating_add(n);
    }
    if e < 0 {
        e = e.saturating_add(n);
    }
    s = s.clamp(0, n);
    e = e.clamp(s, n);
    let len = (e - s + step - 1) / step;
    Ok((s as usize, len as usize))
}

// ---------------------------------------------------------------------------------------------
// Inference.

fn infer_view(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let name = if a.schema().index_of("size").is_some() {
        "size"
    } else {
        "shape"
    };
    let shape = infer_size(&a.int_list(name)?, m.numel())?;
    Ok(vec![Meta::new(m.dtype, shape)])
}

fn infer_permute(a: &Args) -> Result<Vec<Meta>, OpError> {
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

fn eval_permute(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let perm = permutation(a, &t.meta)?;
    Ok(vec![Tensor::new(m[0].clone(), permute_data(t, &perm))])
}

fn infer_expand(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let size = a.int_list("size")?;
    if size.len() < m.rank() {
        return Err(OpError::new(format!(
            "expand: the number of sizes provided ({}) must be greater or equal to the number of dims ({})",
            size.len(),
            m.rank()
        )));
    }
    let lead = size.len() - m.rank();
    let mut out = Vec::with_capacity(size.len());
    for (i, &s) in size.iter().enumerate() {
        if i < lead {
            out.push(usize_of(s, "a new leading expanded size")?);
        } else {
            let cur = m.shape[i - lead];
            let want = if s == -1 {
                cur
            } else {
                usize_of(s, "an expanded size")?
            };
            if cur != want && cur != 1 {
                return Err(OpError::new(format!(
                    "expand: size {want} must match the existing size {cur} at dim {i}"
                )));
            }
            out.push(want);
        }
    }
    Ok(vec![Meta::new(m.dtype, out)])
}

fn eval_expand(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    Ok(vec![Tensor::new(
        m[0].clone(),
        broadcast_to(a.tensor("self")?, &m[0].shape),
    )])
}

/// The dim, start and length (in steps) and step of `slice` on `m`.
fn slice_args(a: &Args, m: &Meta) -> Result<(usize, usize, usize, usize), OpError> {
    if m.rank() == 0 {
        return Err(OpError::new("slice() cannot be applied to a 0-dim tensor"));
    }
    let dim = norm_dim(a.int("dim")?, m.rank())?;
    let step = a.int("step")?;
    let (s, len) = slice_range(m.shape[dim], a.opt_int("start")?, a.opt_int("end")?, step)?;
    Ok((dim, s, len, step as usize))
}

fn infer_slice(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let (dim, _, len, _) = slice_args(a, &m)?;
    let mut shape = m.shape.clone();
    shape[dim] = len;
    Ok(vec![Meta::new(m.dtype, shape)])
}

/// Offset, shape and strides of `slice` as a strided view of `m`.
fn slice_view(a: &Args, m: &Meta) -> Result<(usize, Vec<usize>, Vec<isize>), OpError> {
    let (dim, s, len, step) = slice_args(a, m)?;
    let mut st = istrides(&m.shape);
    let offset = s * st[dim] as usize;
    st[dim] *= step as isize;
    let mut shape = m.shape.clone();
    shape[dim] = len;
    Ok((offset, shape, st))
}

fn eval_slice(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let (off, shape, st) = slice_view(a, &t.meta)?;
    Ok(vec![Tensor::new(
        m[0].clone(),
        strided_read(&t.data, off, &shape, &st),
    )])
}

/// The dim and index of `select` on `m`.
fn select_args(a: &Args, m: &Meta) -> Result<(usize, usize), OpError> {
    if m.rank() == 0 {
        return Err(OpError::new("select() cannot be applied to a 0-dim tensor"));
    }
    let dim = norm_dim(a.int("dim")?, m.rank())?;
    let n = m.shape[dim] as i64;
    let i = a.int("index")?;
    if i < -n || i >= n {
        return Err(OpError::new(format!(
            "select(): index {i} out of range for tensor of size {} at dimension {dim}",
            n
        )));
    }
    Ok((dim, if i < 0 { i + n } else { i } as usize))
}

fn infer_select(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let (dim, _) = select_args(a, &m)?;
    let mut shape = m.shape.clone();
    shape.remove(dim);
    Ok(vec![Meta::new(m.dtype, shape)])
}

/// Offset, shape and strides of `select` as a strided view of `m`.
fn select_view(a: &Args, m: &Meta) -> Result<(usize, Vec<usize>, Vec<isize>), OpError> {
    let (dim, i) = select_args(a, m)?;
    let mut st = istrides(&m.shape);
    let offset = i * st[dim] as usize;
    st.remove(dim);
    let mut shape = m.shape.clone();
    shape.remove(dim);
    Ok((offset, shape, st))
}

fn eval_select(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let (off, shape, st) = select_view(a, &t.meta)?;
    Ok(vec![Tensor::new(
        m[0].clone(),
        strided_read(&t.data, off, &shape, &st),
    )])
}

fn infer_squeeze(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let r = m.rank();
    let dims: Vec<usize> = if a.schema().index_of("dim").is_none() {
        (0..r).collect()
    } else {
        let dims = a.int_list("dim")?;
        let mut out = Vec::new();
        for d in dims {
            out.push(norm_dim(d, r)?);
        }
        out
    };
    let shape = m
        .shape
        .iter()
        .enumerate()
        .filter(|&(i, &s)| !(s == 1 && dims.contains(&i)))
        .map(|(_, &s)| s)
        .collect();
    Ok(vec![Meta::new(m.dtype, shape)])
}

fn infer_unsqueeze(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let d = norm_dim(a.int("dim")?, m.rank() + 1)?;
    let mut shape = m.shape.clone();
    shape.insert(d, 1);
    Ok(vec![Meta::new(m.dtype, shape)])
}

fn infer_flatten(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    if m.rank() == 0 {
        return Ok(vec![Meta::new(m.dtype, vec![1])]);
    }
    let s = norm_dim(a.int("start_dim")?, m.rank())?;
    let e = norm_dim(a.int("end_dim")?, m.rank())?;
    if s > e {
        return Err(OpError::new(
            "flatten() has invalid args: start_dim cannot come after end_dim",
        ));
    }
    let mut shape = m.shape[..s].to_vec();
    shape.push(m.shape[s..=e].iter().product());
    shape.extend_from_slice(&m.shape[e + 1..]);
    Ok(vec![Meta::new(m.dtype, shape)])
}

fn infer_unflatten(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    if m.rank() == 0 {
        return Err(OpError::new(
            "unflatten() cannot be applied to a 0-dim tensor",
        ));
    }
    let d = norm_dim(a.int("dim")?, m.rank())?;
    let sizes = a.int_list("sizes")?;
    if sizes.is_empty() {
        return Err(OpError::new("unflatten: sizes must be non-empty"));
    }
    let inner = infer_size(&sizes, m.shape[d])?;
    let mut shape = m.shape[..d].to_vec();
    shape.extend(inner);
    shape.extend_from_slice(&m.shape[d + 1..]);
    Ok(vec![Meta::new(m.dtype, shape)])
}

/// Output metas of view-like ops that keep the element order share the input's data.
fn eval_reshape(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    Ok(vec![a.tensor("self")?.reshaped(m[0].shape.clone())])
}

fn infer_identity(a: &Args) -> Result<Vec<Meta>, OpError> {
    Ok(vec![a.meta("self")?])
}

fn eval_identity(a: &Args, _: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    Ok(vec![a.tensor("self")?.clone()])
}

/// The metas of a tensor-list argument, none of them `None`.
fn list_metas(a: &Args, name: &str) -> Result<Vec<Meta>, OpError> {
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
fn cat_meta(a: &Args) -> Result<(usize, Meta), OpError> {
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

fn eval_cat(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
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
fn stack_meta(a: &Args) -> Result<(usize, Meta), OpError> {
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

fn eval_stack(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
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

fn infer_split(a: &Args) -> Result<Vec<Meta>, OpError> {
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

fn eval_split(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
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

/// The dim, start and length of `narrow`.
fn narrow_args(a: &Args, m: &Meta) -> Result<(usize, usize, usize), OpError> {
    if m.rank() == 0 {
        return Err(OpError::new("narrow() cannot be applied to a 0-dim tensor"));
    }
    let dim = norm_dim(a.int("dim")?, m.rank())?;
    let n = m.shape[dim] as i64;
    let mut s = a.int("start")?;
    let len = a.int("length")?;
    if s < -n || s > n {
        return Err(OpError::new(format!(
            "narrow(): start {s} out of range for a dim of size {n}"
        )));
    }
    if s < 0 {
        s += n;
    }
    if len < 0 || s + len > n {
        return Err(OpError::new(format!(
            "narrow(): start ({s}) + length ({len}) exceeds dimension size ({n})"
        )));
    }
    Ok((dim, s as usize, len as usize))
}

fn infer_narrow(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let (dim, _, len) = narrow_args(a, &m)?;
    let mut shape = m.shape.clone();
    shape[dim] = len;
    Ok(vec![Meta::new(m.dtype, shape)])
}

fn eval_narrow(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let (dim, s, _) = narrow_args(a, &t.meta)?;
    let st = istrides(t.shape());
    let data = strided_read(&t.data, s * st[dim] as usize, &m[0].shape, &st);
    Ok(vec![Tensor::new(m[0].clone(), data)])
}

fn infer_to_copy(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    Ok(vec![Meta::new(
        a.dtype("dtype")?.unwrap_or(m.dtype),
        m.shape,
    )])
}

fn eval_cast(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    Ok(vec![if t.dtype() == m[0].dtype {
        t.clone()
    } else {
        t.cast(m[0].dtype)
    }])
}

fn infer_copy(a: &Args) -> Result<Vec<Meta>, OpError> {
    let (x, src) = (a.meta("self")?, a.meta("src")?);
    if broadcast_shapes(&x.shape, &src.shape)? != x.shape {
        return Err(OpError::new(format!(
            "copy: source of shape {:?} cannot be broadcast to {:?}",
            src.shape, x.shape
        )));
    }
    Ok(vec![x])
}

fn eval_copy(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    let src = a.tensor("src")?;
    let data = broadcast_to(src, &m[0].shape);
    let d = m[0].dtype;
    Ok(vec![Tensor::new(
        m[0].clone(),
        data.into_iter().map(|x| cast_value(x, d)).collect(),
    )])
}

/// Writes `src` (converted to `dtype`) into the strided view of `dst`.
fn scatter_view(
    dst: &mut [f64],
    off: usize,
    shape: &[usize],
    st: &[isize],
    src: &Tensor,
    dtype: DType,
) {
    let mut it = src.data.iter();
    for_each_strided(off, shape, st, |i| {
        if let Some(&v) = it.next() {
            dst[i] = cast_value(v, dtype);
        }
    });
}

/// Checks that the `src` of a scatter into a view has the view's shape.
fn check_src(a: &Args, shape: &[usize]) -> Result<(), OpError> {
    let src = a.meta("src")?;
    if src.shape != shape {
        return Err(OpError::new(format!(
            "{}: expected src to have a size equal to the slice of self: {:?}, got {:?}",
            a.schema().name,
            shape,
            src.shape
        )));
    }
    Ok(())
}

fn infer_slice_scatter(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let (_, shape, _) = slice_view(a, &m)?;
    check_src(a, &shape)?;
    Ok(vec![m])
}

fn eval_slice_scatter(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let (off, shape, st) = slice_view(a, &t.meta)?;
    let mut data = t.data.as_ref().clone();
    scatter_view(&mut data, off, &shape, &st, a.tensor("src")?, m[0].dtype);
    Ok(vec![Tensor::new(m[0].clone(), data)])
}

fn infer_select_scatter(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let (_, shape, _) = select_view(a, &m)?;
    check_src(a, &shape)?;
    Ok(vec![m])
}

fn eval_select_scatter(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let (off, shape, st) = select_view(a, &t.meta)?;
    let mut data = t.data.as_ref().clone();
    scatter_view(&mut data, off, &shape, &st, a.tensor("src")?, m[0].dtype);
    Ok(vec![Tensor::new(m[0].clone(), data)])
}

/// Offset, shape and strides of `as_strided` on `m`, checked against its storage. The storage
/// is the row-major data of the input: exact when the input is contiguous in torch, as the
/// bases that functionalized graphs pass to `as_strided` are.
fn as_strided_view(a: &Args, m: &Meta) -> Result<(usize, Vec<usize>, Vec<isize>), OpError> {
    let shape = a
        .int_list("size")?
        .into_iter()
        .map(|s| usize_of(s, "an as_strided size"))
        .collect::<Result<Vec<_>, _>>()?;
    let st = a
        .int_list("stride")?
        .into_iter()
        .map(|s| usize_of(s, "an as_strided stride").map(|s| s as isize))
        .collect::<Result<Vec<_>, _>>()?;
    if st.len() != shape.len() {
        return Err(OpError::new(
            "as_strided: mismatch in length of strides and shape",
        ));
    }
    let off = usize_of(a.opt_int("storage_offset")?.unwrap_or(0), "storage_offset")?;
    if !shape.contains(&0) {
        let (_, hi) = strided_bounds(off, &shape, &st);
        if hi as usize >= m.numel() {
            return Err(OpError::new(format!(
                "as_strided: size {shape:?}, stride {st:?} and offset {off} reach element {hi} of a tensor of {} elements",
                m.numel()
            )));
        }
    }
    Ok((off, shape, st))
}

fn infer_as_strided(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let (_, shape, _) = as_strided_view(a, &m)?;
    Ok(vec![Meta::new(m.dtype, shape)])
}

fn eval_as_strided(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let (off, shape, st) = as_strided_view(a, &t.meta)?;
    Ok(vec![Tensor::new(
        m[0].clone(),
        strided_read(&t.data, off, &shape, &st),
    )])
}

fn infer_as_strided_scatter(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let (_, shape, _) = as_strided_view(a, &m)?;
    check_src(a, &shape)?;
    Ok(vec![m])
}

fn eval_as_strided_scatter(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let (off, shape, st) = as_strided_view(a, &t.meta)?;
    let mut data = t.data.as_ref().clone();
    scatter_view(&mut data, off, &shape, &st, a.tensor("src")?, m[0].dtype);
    Ok(vec![Tensor::new(m[0].clone(), data)])
}

/// Offset, shape and strides of `diagonal` on `m`.
fn diagonal_view(a: &Args, m: &Meta) -> Result<(usize, Vec<usize>, Vec<isize>), OpError> {
    let r = m.rank();
    if r < 2 {
        return Err(OpError::new(format!(
            "diagonal requires a tensor of at least 2 dims, got {r}"
        )));
    }
    let d1 = norm_dim(a.int("dim1")?, r)?;
    let d2 = norm_dim(a.int("dim2")?, r)?;
    if d1 == d2 {
        return Err(OpError::new("diagonal dimensions cannot be identical"));
    }
    let off = a.int("offset")?;
    let st = istrides(&m.shape);
    let (n1, n2) = (m.shape[d1] as i64, m.shape[d2] as i64);
    let len = if off >= 0 {
        n1.min(n2 - off)
    } else {
        (n1 + off).min(n2)
    }
    .max(0) as usize;
    let start = if len == 0 {
        0
    } else if off >= 0 {
        off as usize * st[d2] as usize
    } else {
        (-off) as usize * st[d1] as usize
    };
    let mut shape = Vec::new();
    let mut ost = Vec::new();
    for (d, (&n, &s)) in m.shape.iter().zip(&st).enumerate() {
        if d != d1 && d != d2 {
            shape.push(n);
            ost.push(s);
        }
    }
    shape.push(len);
    ost.push(st[d1] + st[d2]);
    Ok((start, shape, ost))
}

fn infer_diagonal(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let (_, shape, _) = diagonal_view(a, &m)?;
    Ok(vec![Meta::new(m.dtype, shape)])
}

fn eval_diagonal(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let (off, shape, st) = diagonal_view(a, &t.meta)?;
    Ok(vec![Tensor::new(
        m[0].clone(),
        strided_read(&t.data, off, &shape, &st),
    )])
}

/// Offset, shape and strides of `unfold` on `m`.
fn unfold_view(a: &Args, m: &Meta) -> Result<(usize, Vec<usize>, Vec<isize>), OpError> {
    let r = m.rank();
    let d = norm_dim(a.int("dimension")?, r)?;
    let size = usize_of(a.int("size")?, "unfold size")?;
    let step = a.int("step")?;
    if step <= 0 {
        return Err(OpError::new(format!(
            "unfold: step must be positive, got {step}"
        )));
    }
    let n = if r == 0 { 1 } else { m.shape[d] };
    if size > n {
        return Err(OpError::new(format!(
            "unfold: maximum size for tensor at dimension {d} is {n} but size is {size}"
        )));
    }
    let mut shape = m.shape.clone();
    let mut st = istrides(&m.shape);
    if r == 0 {
        return Ok((0, vec![size], vec![1]));
    }
    shape[d] = (n - size) / step as usize + 1;
    let s = st[d];
    st[d] *= step as isize;
    shape.push(size);
    st.push(s);
    Ok((0, shape, st))
}

fn infer_unfold(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let (_, shape, _) = unfold_view(a, &m)?;
    Ok(vec![Meta::new(m.dtype, shape)])
}

fn eval_unfold(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let (off, shape, st) = unfold_view(a, &t.meta)?;
    Ok(vec![Tensor::new(
        m[0].clone(),
        strided_read(&t.data, off, &shape, &st),
    )])
}

fn infer_repeat(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let reps = a.int_list("repeats")?;
    if reps.len() < m.rank() {
        return Err(OpError::new(
            "Number of dimensions of repeat dims can not be smaller than number of dimensions of tensor",
        ));
    }
    let lead = reps.len() - m.rank();
    let mut shape = Vec::with_capacity(reps.len());
    for (i, &r) in reps.iter().enumerate() {
        let s = if i < lead { 1 } else { m.shape[i - lead] };
        shape.push(s * usize_of(r, "a repeat count")?);
    }
    Ok(vec![Meta::new(m.dtype, shape)])
}

fn eval_repeat(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let reps = a.int_list("repeats")?;
    let lead = reps.len() - t.meta.rank();
    let mut padded = vec![1; lead];
    padded.extend_from_slice(t.shape());
    let pst = istrides(&padded);
    // View the source as [r0, p0, r1, p1, ...] with stride 0 on the repeat dims.
    let mut shape = Vec::new();
    let mut st = Vec::new();
    for i in 0..padded.len() {
        shape.push(reps[i] as usize);
        st.push(0);
        shape.push(padded[i]);
        st.push(pst[i]);
    }
    Ok(vec![Tensor::new(
        m[0].clone(),
        strided_read(&t.data, 0, &shape, &st),
    )])
}

/// `(dim, shift)` pairs of `roll`, or `None` for a roll of the flattened tensor.
fn roll_args(a: &Args, m: &Meta) -> Result<Option<Vec<(usize, i64)>>, OpError> {
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

fn eval_roll(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
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

fn eval_flip(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
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

fn infer_flip(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    norm_dims(&a.int_list("dims")?, m.rank())?;
    Ok(vec![m])
}

fn infer_tri(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    if m.rank() < 2 {
        return Err(OpError::new(format!(
            "{}: input tensor must have at least 2 dimensions",
            a.schema().name
        )));
    }
    Ok(vec![m])
}

/// Keeps the elements of the last two dims with `keep(col - row)`, zeroing the others.
fn eval_tri(a: &Args, m: &[Meta], keep: fn(i64, i64) -> bool) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let k = a.int("diagonal")?;
    let r = t.meta.rank();
    let (rows, cols) = (t.shape()[r - 2], t.shape()[r - 1]);
    let data = t
        .data
        .iter()
        .enumerate()
        .map(|(i, &x)| {
            let (row, col) = ((i / cols) % rows.max(1), i % cols.max(1));
            if keep(col as i64 - row as i64, k) {
                x
            } else {
                0.0
            }
        })
        .collect();
    Ok(vec![Tensor::new(m[0].clone(), data)])
}

/// How `pad` fills the border: with a value, or from the input itself (torch's
/// `reflect`, `replicate` and `circular` modes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PadMode {
    Constant,
    Reflect,
    Replicate,
    Circular,
}

/// A checked padding: the mode, the value of constant padding, and the (left, right) padding
/// of every dim (negative amounts crop).
struct Padding {
    mode: PadMode,
    value: f64,
    pads: Vec<(i64, i64)>,
}

impl Padding {
    /// The padding of a `constant_pad_nd` or `pad` call on a tensor of meta `m`, with torch's
    /// checks.
    fn of(a: &Args, m: &Meta) -> Result<Padding, OpError> {
        let op = &a.schema().name;
        let mode = match a.schema().index_of("mode") {
            None => PadMode::Constant,
            Some(_) => match a.str("mode")?.as_str() {
                "constant" => PadMode::Constant,
                "reflect" => PadMode::Reflect,
                "replicate" => PadMode::Replicate,
                "circular" => PadMode::Circular,
                other => {
                    return Err(OpError::new(format!(
                        "{op}: unrecognised padding mode {other}"
                    )))
                }
            },
        };
        let value = a.opt_float("value")?;
        let pad = a.int_list("pad")?;
        let r = m.rank();
        if pad.len() % 2 != 0 || pad.len() / 2 > r {
            return Err(OpError::new(format!(
                "{op}: padding length must be even and at most twice the rank {r}, got {}",
                pad.len()
            )));
        }
        let k = pad.len() / 2;
        if mode != PadMode::Constant {
            if value.is_some_and(|v| v != 0.0) {
                return Err(OpError::new(format!(
                    "{op}: padding mode {mode:?} doesn't take in value argument"
                )));
            }
            // torch pads the last 1, 2 or 3 dims of a batched or unbatched input only.
            if !(1..=3).contains(&k) || !(k + 1..=k + 2).contains(&r) {
                return Err(OpError::new(format!(
                    "{op}: padding size {} is not supported for {r}D input tensor in mode {mode:?}",
                    pad.len()
                )));
            }
        }
        let mut pads = vec![(0, 0); r];
        for i in 0..k {
            pads[r - 1 - i] = (pad[2 * i], pad[2 * i + 1]);
        }
        for (d, &(lo, hi)) in pads.iter().enumerate().skip(r - k) {
            let n = i64::try_from(m.shape[d]).unwrap_or(i64::MAX);
            let Some(out) = n.checked_add(lo).and_then(|x| x.checked_add(hi)) else {
                return Err(OpError::new(format!(
                    "{op}: padding ({lo}, {hi}) of dim {d} of size {n} overflows"
                )));
            };
            let bad = match mode {
                PadMode::Constant => (out < 0).then_some("resulted in a negative output size"),
                PadMode::Reflect if lo >= n || hi >= n => {
                    Some("should be less than the corresponding input dimension")
                }
                PadMode::Circular if lo > n || hi > n => {
                    Some("causes wrapping around more than once")
                }
                // Wrapping reads the input left after cropping the other side.
                PadMode::Circular
                    if lo.max(hi) > n.saturating_add(lo.min(0)).saturating_add(hi.min(0)) =>
                {
                    Some("wraps around a cropped dimension more than once")
                }
                PadMode::Circular => (out < 0).then_some("resulted in a negative output size"),
                PadMode::Reflect | PadMode::Replicate if n == 0 => {
                    Some("cannot pad an empty dimension")
                }
                PadMode::Reflect | PadMode::Replicate => (out < 1).then_some("leaves no element"),
            };
            if let Some(why) = bad {
                return Err(OpError::new(format!(
                    "{op}: padding ({lo}, {hi}) of dim {d} of size {n} in mode {mode:?} {why}"
                )));
            }
        }
        Ok(Padding {
            mode,
            value: value.unwrap_or(0.0),
            pads,
        })
    }

    /// The output shape for an input of shape `shape`.
    fn shape(&self, shape: &[usize]) -> Vec<usize> {
        shape
            .iter()
            .zip(&self.pads)
            .map(|(&n, &(lo, hi))| (n as i64 + lo + hi) as usize)
            .collect()
    }

    /// The input index that output index `i` of dim `d` (of input size `n`) reads, or `None`
    /// for the value of constant padding.
    fn source(&self, d: usize, i: usize, n: usize) -> Option<usize> {
        let (lo, hi) = self.pads[d];
        let (i, n) = (i as i64, n as i64);
        let j = i - lo;
        let j = match self.mode {
            PadMode::Constant => return (0..n).contains(&j).then_some(j as usize),
            PadMode::Replicate => j.clamp(0, n - 1),
            PadMode::Reflect if j < 0 => -j,
            PadMode::Reflect if j >= n => 2 * (n - 1) - j,
            PadMode::Reflect => j,
            PadMode::Circular => {
                let crop = (-lo).max(0);
                let kept = n - crop - (-hi).max(0);
                crop + (i - lo.max(0)).rem_euclid(kept)
            }
        };
        Some(j as usize)
    }
}

fn infer_pad(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let shape = Padding::of(a, &m)?.shape(&m.shape);
    Ok(vec![Meta::new(m.dtype, shape)])
}

fn eval_pad(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let padding = Padding::of(a, &t.meta)?;
    let v = cast_value(padding.value, m[0].dtype);
    let out_shape = &m[0].shape;
    let ist = strides(t.shape());
    let mut data = Vec::with_capacity(m[0].numel());
    let mut idx = vec![0usize; out_shape.len()];
    for _ in 0..m[0].numel() {
        let mut src = Some(0usize);
        for (d, &i) in idx.iter().enumerate() {
            match padding.source(d, i, t.shape()[d]) {
                Some(j) => src = src.map(|s| s + j * ist[d]),
                None => {
                    src = None;
                    break;
                }
            }
        }
        data.push(src.map_or(v, |s| t.data[s]));
        for d in (0..out_shape.len()).rev() {
            idx[d] += 1;
            if idx[d] < out_shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    Ok(vec![Tensor::new(m[0].clone(), data)])
}

/// `broadcast_tensors`: every tensor expanded to the common broadcast shape.
fn infer_broadcast_tensors(a: &Args) -> Result<Vec<Meta>, OpError> {
    let metas = list_metas(a, "tensors")?;
    let mut shape = Vec::new();
    for m in &metas {
        shape = broadcast_shapes(&shape, &m.shape)?;
    }
    Ok(metas
        .into_iter()
        .map(|m| Meta::new(m.dtype, shape.clone()))
        .collect())
}

fn eval_broadcast_tensors(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    a.tensors("tensors")?
        .into_iter()
        .zip(m)
        .map(|(t, m)| {
            let t = t.ok_or_else(|| OpError::new("broadcast_tensors: `tensors` holds a None"))?;
            Ok(if t.meta == *m {
                t.clone()
            } else {
                Tensor::new(m.clone(), broadcast_to(t, &m.shape))
            })
        })
        .collect()
}

/// `_assert_tensor_metadata`, which torch.export puts before `to`: the tensor must have the
/// recorded dtype and size. Strides and devices are not checked (shardproof's tensors are dense
/// and have none), nor is the layout beyond being strided (the only one shardproof has).
fn infer_assert_tensor_metadata(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("a")?;
    let op = &a.schema().name;
    if let Some(d) = a.dtype("dtype")? {
        if d != m.dtype {
            return Err(OpError::new(format!(
                "{op}: tensor dtype mismatch: expected {d}, got {}",
                m.dtype
            )));
        }
    }
    if let Some(size) = a.opt_int_list("size")? {
        if !size.iter().map(|&s| s as usize).eq(m.shape.iter().copied())
            || size.iter().any(|&s| s < 0)
        {
            return Err(OpError::new(format!(
                "{op}: tensor size mismatch: expected {size:?}, got {:?}",
                m.shape
            )));
        }
    }
    match a.get("layout") {
        None => {}
        Some(shardproof_ir::Arg::Layout(l)) if l == "strided" => {}
        Some(other) => {
            return Err(OpError::new(format!(
                "{op}: only strided (dense) tensors are supported, got layout {other:?}"
            )))
        }
    }
    Ok(vec![])
}

/// Registers the shape family.
pub(crate) fn register(r: &mut Registry) {
    for (name, schema) in [
        (
            "aten.view.default",
            "view(Tensor self, SymInt[] size) -> Tensor",
        ),
        (
            "aten.view_copy.default",
            "view_copy(Tensor self, SymInt[] size) -> Tensor",
        ),
        (
            "aten._unsafe_view.default",
            "_unsafe_view(Tensor self, SymInt[] size) -> Tensor",
        ),
        (
            "aten.reshape.default",
            "reshape(Tensor self, SymInt[] shape) -> Tensor",
        ),
    ] {
        r.pure(name, schema, infer_view, |a, m, _| eval_reshape(a, m));
    }
    for (name, schema) in [
        (
            "aten.permute.default",
            "permute(Tensor self, int[] dims) -> Tensor",
        ),
        (
            "aten.permute_copy.default",
            "permute_copy(Tensor self, int[] dims) -> Tensor",
        ),
        (
            "aten.transpose.int",
            "transpose.int(Tensor self, int dim0, int dim1) -> Tensor",
        ),
        (
            "aten.transpose_copy.int",
            "transpose_copy.int(Tensor self, int dim0, int dim1) -> Tensor",
        ),
        ("aten.t.default", "t(Tensor self) -> Tensor"),
        ("aten.t_copy.default", "t_copy(Tensor self) -> Tensor"),
    ] {
        r.pure(name, schema, infer_permute, |a, m, _| eval_permute(a, m));
    }
    for (name, schema) in [
        (
            "aten.expand.default",
            "expand(Tensor self, SymInt[] size, *, bool implicit=False) -> Tensor",
        ),
        (
            "aten.expand_copy.default",
            "expand_copy(Tensor self, SymInt[] size, *, bool implicit=False) -> Tensor",
        ),
    ] {
        r.pure(name, schema, infer_expand, |a, m, _| eval_expand(a, m));
    }
    for (name, schema) in [
        (
            "aten.slice.Tensor",
            "slice.Tensor(Tensor self, int dim=0, SymInt? start=None, SymInt? end=None, SymInt step=1) -> Tensor",
        ),
        (
            "aten.slice_copy.Tensor",
            "slice_copy.Tensor(Tensor self, int dim=0, SymInt? start=None, SymInt? end=None, SymInt step=1) -> Tensor",
        ),
    ] {
        r.pure(name, schema, infer_slice, |a, m, _| eval_slice(a, m));
    }
    for (name, schema) in [
        (
            "aten.select.int",
            "select.int(Tensor self, int dim, SymInt index) -> Tensor",
        ),
        (
            "aten.select_copy.int",
            "select_copy.int(Tensor self, int dim, SymInt index) -> Tensor",
        ),
    ] {
        r.pure(name, schema, infer_select, |a, m, _| eval_select(a, m));
    }
    for (name, schema) in [
        ("aten.squeeze.default", "squeeze(Tensor self) -> Tensor"),
        (
            "aten.squeeze.dim",
            "squeeze.dim(Tensor self, int dim) -> Tensor",
        ),
        (
            "aten.squeeze.dims",
            "squeeze.dims(Tensor self, int[] dim) -> Tensor",
        ),
        (
            "aten.squeeze_copy.default",
            "squeeze_copy(Tensor self) -> Tensor",
        ),
        (
            "aten.squeeze_copy.dim",
            "squeeze_copy.dim(Tensor self, int dim) -> Tensor",
        ),
        (
            "aten.squeeze_copy.dims",
            "squeeze_copy.dims(Tensor self, int[] dim) -> Tensor",
        ),
    ] {
        r.pure(name, schema, infer_squeeze, |a, m, _| eval_reshape(a, m));
    }
    for (name, schema) in [
        (
            "aten.unsqueeze.default",
            "unsqueeze(Tensor self, int dim) -> Tensor",
        ),
        (
            "aten.unsqueeze_copy.default",
            "unsqueeze_copy(Tensor self, int dim) -> Tensor",
        ),
    ] {
        r.pure(name, schema, infer_unsqueeze, |a, m, _| eval_reshape(a, m));
    }
    r.pure(
        "aten.flatten.using_ints",
        "flatten.using_ints(Tensor self, int start_dim=0, int end_dim=-1) -> Tensor",
        infer_flatten,
        |a, m, _| eval_reshape(a, m),
    );
    r.pure(
        "aten.unflatten.int",
        "unflatten.int(Tensor self, int dim, SymInt[] sizes) -> Tensor",
        infer_unflatten,
        |a, m, _| eval_reshape(a, m),
    );
    r.pure(
        "aten.cat.default",
        "cat(Tensor[] tensors, int dim=0) -> Tensor",
        |a| Ok(vec![cat_meta(a)?.1]),
        |a, m, _| eval_cat(a, m),
    );
    r.pure(
        "aten.stack.default",
        "stack(Tensor[] tensors, int dim=0) -> Tensor",
        |a| Ok(vec![stack_meta(a)?.1]),
        |a, m, _| eval_stack(a, m),
    );
    for (name, schema) in [
        (
            "aten.split.Tensor",
            "split.Tensor(Tensor self, SymInt split_size, int dim=0) -> Tensor[]",
        ),
        (
            "aten.split_with_sizes.default",
            "split_with_sizes(Tensor self, SymInt[] split_sizes, int dim=0) -> Tensor[]",
        ),
        (
            "aten.chunk.default",
            "chunk(Tensor self, int chunks, int dim=0) -> Tensor[]",
        ),
        (
            "aten.unbind.int",
            "unbind.int(Tensor self, int dim=0) -> Tensor[]",
        ),
    ] {
        r.pure(name, schema, infer_split, |a, m, _| eval_split(a, m));
    }
    r.pure(
        "aten.narrow.default",
        "narrow(Tensor self, int dim, SymInt start, SymInt length) -> Tensor",
        infer_narrow,
        |a, m, _| eval_narrow(a, m),
    );
    for (name, schema) in [
        (
            "aten.clone.default",
            "clone(Tensor self, *, MemoryFormat? memory_format=None) -> Tensor",
        ),
        ("aten.detach.default", "detach(Tensor self) -> Tensor"),
        (
            "aten.detach_copy.default",
            "detach_copy(Tensor self) -> Tensor",
        ),
        ("aten.alias.default", "alias(Tensor self) -> Tensor"),
        (
            "aten.alias_copy.default",
            "alias_copy(Tensor self) -> Tensor",
        ),
        (
            "aten.lift_fresh_copy.default",
            "lift_fresh_copy(Tensor self) -> Tensor",
        ),
        (
            "aten.lift_fresh.default",
            "lift_fresh(Tensor self) -> Tensor",
        ),
        ("aten.lift.default", "lift(Tensor self) -> Tensor"),
        (
            "aten.contiguous.default",
            "contiguous(Tensor self, *, MemoryFormat memory_format=contiguous_format) -> Tensor",
        ),
        // In place, but on a functional value detaching changes nothing.
        (
            "aten.detach_.default",
            "detach_(Tensor(a!) self) -> Tensor(a!)",
        ),
    ] {
        r.pure(name, schema, infer_identity, |a, m, _| eval_identity(a, m));
    }
    for (name, schema) in [
        (
            "aten._to_copy.default",
            "_to_copy(Tensor self, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None, bool non_blocking=False, MemoryFormat? memory_format=None) -> Tensor",
        ),
        (
            "aten.to.dtype",
            "to.dtype(Tensor self, ScalarType dtype, bool non_blocking=False, bool copy=False, MemoryFormat? memory_format=None) -> Tensor",
        ),
        (
            "aten.to.dtype_layout",
            "to.dtype_layout(Tensor self, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None, bool non_blocking=False, bool copy=False, MemoryFormat? memory_format=None) -> Tensor",
        ),
        (
            "aten.to.device",
            "to.device(Tensor self, Device device, ScalarType dtype, bool non_blocking=False, bool copy=False, MemoryFormat? memory_format=None) -> Tensor",
        ),
    ] {
        r.pure(name, schema, infer_to_copy, |a, m, _| eval_cast(a, m));
    }
    r.pure(
        "aten.copy.default",
        "copy(Tensor self, Tensor src, bool non_blocking=False) -> Tensor",
        infer_copy,
        |a, m, _| eval_copy(a, m),
    );
    r.pure(
        "aten.slice_scatter.default",
        "slice_scatter(Tensor self, Tensor src, int dim=0, SymInt? start=None, SymInt? end=None, SymInt step=1) -> Tensor",
        infer_slice_scatter,
        |a, m, _| eval_slice_scatter(a, m),
    );
    r.pure(
        "aten.select_scatter.default",
        "select_scatter(Tensor self, Tensor src, int dim, SymInt index) -> Tensor",
        infer_select_scatter,
        |a, m, _| eval_select_scatter(a, m),
    );
    r.pure(
        "aten.as_strided.default",
        "as_strided(Tensor self, SymInt[] size, SymInt[] stride, SymInt? storage_offset=None) -> Tensor",
        infer_as_strided,
        |a, m, _| eval_as_strided(a, m),
    );
    r.pure(
        "aten.as_strided_scatter.default",
        "as_strided_scatter(Tensor self, Tensor src, SymInt[] size, SymInt[] stride, SymInt? storage_offset=None) -> Tensor",
        infer_as_strided_scatter,
        |a, m, _| eval_as_strided_scatter(a, m),
    );
    r.pure(
        "aten.diagonal.default",
        "diagonal(Tensor self, int offset=0, int dim1=0, int dim2=1) -> Tensor",
        infer_diagonal,
        |a, m, _| eval_diagonal(a, m),
    );
    r.pure(
        "aten.unfold.default",
        "unfold(Tensor self, int dimension, int size, int step) -> Tensor",
        infer_unfold,
        |a, m, _| eval_unfold(a, m),
    );
    r.pure(
        "aten.repeat.default",
        "repeat(Tensor self, SymInt[] repeats) -> Tensor",
        infer_repeat,
        |a, m, _| eval_repeat(a, m),
    );
    r.pure(
        "aten.roll.default",
        "roll(Tensor self, SymInt[1] shifts, int[1] dims=[]) -> Tensor",
        |a| {
            let m = a.meta("self")?;
            roll_args(a, &m)?;
            Ok(vec![m])
        },
        |a, m, _| eval_roll(a, m),
    );
    r.pure(
        "aten.flip.default",
        "flip(Tensor self, int[] dims) -> Tensor",
        infer_flip,
        |a, m, _| eval_flip(a, m),
    );
    r.pure(
        "aten.tril.default",
        "tril(Tensor self, int diagonal=0) -> Tensor",
        infer_tri,
        |a, m, _| eval_tri(a, m, |d, k| d <= k),
    );
    r.pure(
        "aten.triu.default",
        "triu(Tensor self, int diagonal=0) -> Tensor",
        infer_tri,
        |a, m, _| eval_tri(a, m, |d, k| d >= k),
    );
    r.pure(
        "aten.constant_pad_nd.default",
        "constant_pad_nd(Tensor self, SymInt[] pad, Scalar value=0) -> Tensor",
        infer_pad,
        |a, m, _| eval_pad(a, m),
    );
    r.pure(
        "aten.pad.default",
        r#"pad(Tensor self, SymInt[] pad, str mode="constant", float? value=None) -> Tensor"#,
        infer_pad,
        |a, m, _| eval_pad(a, m),
    );
    r.pure(
        "aten.broadcast_tensors.default",
        "broadcast_tensors(Tensor[] tensors) -> Tensor[]",
        infer_broadcast_tensors,
        |a, m, _| eval_broadcast_tensors(a, m),
    );
    r.pure(
        "aten._assert_tensor_metadata.default",
        "_assert_tensor_metadata(Tensor a, SymInt[]? size=None, SymInt[]? stride=None, ScalarType? dtype=None, *, Device? device=None, Layout? layout=None) -> ()",
        infer_assert_tensor_metadata,
        |_, _, _| Ok(vec![]),
    );
}

#[cfg(test)]
mod tests {
    use crate::testing::{ar, call, call1, ints, t, v};
    use crate::{Meta, Tensor};
    use shardproof_ir::{Arg, DType};

    #[test]
    fn views_and_permutes() {
        let x = ar(&[2, 3]);
        let out = call1("aten.view.default", &[&x], &[v(0), ints(&[3, -1])], &[]);
        assert_eq!(out.shape(), &[3, 2]);
        assert!(call("aten.view.default", &[&x], &[v(0), ints(&[4, -1])], &[]).is_err());
        assert!(call("aten.view.default", &[&x], &[v(0), ints(&[-1, -1])], &[]).is_err());
        let out = call1(
            "aten.transpose.int",
            &[&x],
            &[v(0), Arg::Int(0), Arg::Int(-1)],
            &[],
        );
        assert_eq!(
            (out.shape(), out.data.to_vec()),
            (&[3usize, 2][..], vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0])
        );
        let y = ar(&[2, 3, 4]);
        let out = call1(
            "aten.permute.default",
            &[&y],
            &[v(0), ints(&[2, 0, 1])],
            &[],
        );
        assert_eq!(out.shape(), &[4, 2, 3]);
        assert_eq!(out.data[..4], [0.0, 4.0, 8.0, 12.0]);
        assert!(call(
            "aten.permute.default",
            &[&y],
            &[v(0), ints(&[0, 0, 1])],
            &[]
        )
        .is_err());
        assert!(call("aten.t.default", &[&y], &[v(0)], &[]).is_err());
        let out = call1(
            "aten.expand.default",
            &[&ar(&[3, 1])],
            &[v(0), ints(&[2, -1, 2])],
            &[],
        );
        assert_eq!(out.shape(), &[2, 3, 2]);
        assert_eq!(out.data[..6], [0.0, 0.0, 1.0, 1.0, 2.0, 2.0]);
        assert!(call(
            "aten.expand.default",
            &[&ar(&[3, 1])],
            &[v(0), ints(&[-1, 3, 2])],
            &[]
        )
        .is_err());
        assert!(call(
            "aten.expand.default",
            &[&ar(&[3, 1])],
            &[v(0), ints(&[2, 2])],
            &[]
        )
        .is_err());
        let out = call1(
            "aten.squeeze.dims",
            &[&ar(&[1, 3, 1])],
            &[v(0), ints(&[0, 1])],
            &[],
        );
        assert_eq!(out.shape(), &[3, 1]);
        let out = call1(
            "aten.unsqueeze.default",
            &[&ar(&[3])],
            &[v(0), Arg::Int(-1)],
            &[],
        );
        assert_eq!(out.shape(), &[3, 1]);
        let out = call1(
            "aten.flatten.using_ints",
            &[&ar(&[2, 3, 4])],
            &[v(0), Arg::Int(1)],
            &[],
        );
        assert_eq!(out.shape(), &[2, 12]);
        let out = call1(
            "aten.unflatten.int",
            &[&ar(&[2, 12])],
            &[v(0), Arg::Int(1), ints(&[3, -1])],
            &[],
        );
        assert_eq!(out.shape(), &[2, 3, 4]);
    }

    #[test]
    fn slicing_clamps_like_torch() {
        let x = ar(&[10]);
        let sl = |start: Arg, end: Arg, step: i64| {
            call(
                "aten.slice.Tensor",
                &[&x],
                &[v(0), Arg::Int(0), start, end, Arg::Int(step)],
                &[],
            )
        };
        assert_eq!(
            *sl(Arg::Int(-3), Arg::Int(100), 1).unwrap()[0].data,
            vec![7.0, 8.0, 9.0]
        );
        assert_eq!(sl(Arg::Int(5), Arg::Int(2), 1).unwrap()[0].shape(), &[0]);
        assert_eq!(
            *sl(Arg::None, Arg::None, 3).unwrap()[0].data,
            vec![0.0, 3.0, 6.0, 9.0]
        );
        assert_eq!(
            *sl(Arg::Int(-100), Arg::Int(-8), 1).unwrap()[0].data,
            vec![0.0, 1.0]
        );
        assert!(sl(Arg::None, Arg::None, 0).is_err());
        let y = ar(&[2, 3]);
        let out = call1(
            "aten.slice.Tensor",
            &[&y],
            &[v(0), Arg::Int(1), Arg::Int(1)],
            &[],
        );
        assert_eq!(*out.data, vec![1.0, 2.0, 4.0, 5.0]);
        let out = call1(
            "aten.select.int",
            &[&y],
            &[v(0), Arg::Int(1), Arg::Int(-1)],
            &[],
        );
        assert_eq!(*out.data, vec![2.0, 5.0]);
        assert!(call(
            "aten.select.int",
            &[&y],
            &[v(0), Arg::Int(0), Arg::Int(2)],
            &[]
        )
        .is_err());
        let out = call1(
            "aten.narrow.default",
            &[&y],
            &[v(0), Arg::Int(1), Arg::Int(-2), Arg::Int(2)],
            &[],
        );
        assert_eq!(*out.data, vec![1.0, 2.0, 4.0, 5.0]);
        let src = t(DType::F32, &[2, 1], &[-1.0, -2.0]);
        let out = call1(
            "aten.slice_scatter.default",
            &[&y, &src],
            &[v(0), v(1), Arg::Int(1), Arg::Int(2)],
            &[],
        );
        assert_eq!(*out.data, vec![0.0, 1.0, -1.0, 3.0, 4.0, -2.0]);
        assert!(call(
            "aten.slice_scatter.default",
            &[&y, &src],
            &[v(0), v(1), Arg::Int(1)],
            &[]
        )
        .is_err());
        let src = t(DType::F32, &[3], &[7.0, 8.0, 9.0]);
        let out = call1(
            "aten.select_scatter.default",
            &[&y, &src],
            &[v(0), v(1), Arg::Int(0), Arg::Int(0)],
            &[],
        );
        assert_eq!(*out.data, vec![7.0, 8.0, 9.0, 3.0, 4.0, 5.0]);
        let out = call1(
            "aten.diagonal.default",
            &[&ar(&[3, 3])],
            &[v(0), Arg::Int(1)],
            &[],
        );
        assert_eq!(*out.data, vec![1.0, 5.0]);
        let out = call1(
            "aten.as_strided.default",
            &[&ar(&[6])],
            &[v(0), ints(&[2, 2]), ints(&[1, 2]), Arg::Int(1)],
            &[],
        );
        assert_eq!(*out.data, vec![1.0, 3.0, 2.0, 4.0]);
        assert!(call(
            "aten.as_strided.default",
            &[&ar(&[6])],
            &[v(0), ints(&[2, 2]), ints(&[3, 3])],
            &[]
        )
        .is_err());
    }

    #[test]
    fn cat_stack_split() {
        let a = t(DType::I32, &[1, 2], &[1.0, 2.0]);
        let b = t(DType::F32, &[2, 2], &[3.0, 4.0, 5.0, 6.0]);
        let empty = t(DType::I64, &[0], &[]);
        let list = Arg::List(vec![v(0), v(1), v(2)]);
        let out = call1("aten.cat.default", &[&a, &empty, &b], &[list], &[]);
        assert_eq!(out.meta, Meta::new(DType::F32, vec![3, 2]));
        assert_eq!(*out.data, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let out = call1(
            "aten.cat.default",
            &[&a, &b, &empty],
            &[Arg::List(vec![v(0), v(1)]), Arg::Int(-2)],
            &[],
        );
        assert_eq!(out.shape(), &[3, 2]);
        assert!(call(
            "aten.cat.default",
            &[&a, &b],
            &[Arg::List(vec![v(0), v(1)]), Arg::Int(1)],
            &[]
        )
        .is_err());
        let out = call1(
            "aten.cat.default",
            &[&b, &b],
            &[Arg::List(vec![v(0), v(1)]), Arg::Int(1)],
            &[],
        );
        assert_eq!(*out.data, vec![3.0, 4.0, 3.0, 4.0, 5.0, 6.0, 5.0, 6.0]);
        let out = call1(
            "aten.stack.default",
            &[&b, &b],
            &[Arg::List(vec![v(0), v(1)]), Arg::Int(2)],
            &[],
        );
        assert_eq!(out.shape(), &[2, 2, 2]);
        assert_eq!(*out.data, vec![3.0, 3.0, 4.0, 4.0, 5.0, 5.0, 6.0, 6.0]);
        let x = ar(&[5]);
        let out = call("aten.chunk.default", &[&x], &[v(0), Arg::Int(3)], &[]).unwrap();
        let shapes: Vec<usize> = out.iter().map(|t| t.shape()[0]).collect();
        assert_eq!(shapes, vec![2, 2, 1]);
        let out = call(
            "aten.chunk.default",
            &[&ar(&[6])],
            &[v(0), Arg::Int(4)],
            &[],
        )
        .unwrap();
        assert_eq!(out.len(), 3);
        let out = call("aten.split.Tensor", &[&x], &[v(0), Arg::Int(2)], &[]).unwrap();
        assert_eq!(*out[2].data, vec![4.0]);
        let out = call(
            "aten.split_with_sizes.default",
            &[&ar(&[2, 3])],
            &[v(0), ints(&[1, 2]), Arg::Int(1)],
            &[],
        )
        .unwrap();
        assert_eq!(*out[1].data, vec![1.0, 2.0, 4.0, 5.0]);
        assert!(call(
            "aten.split_with_sizes.default",
            &[&x],
            &[v(0), ints(&[1, 2])],
            &[]
        )
        .is_err());
        let out = call(
            "aten.unbind.int",
            &[&ar(&[2, 3])],
            &[v(0), Arg::Int(1)],
            &[],
        )
        .unwrap();
        assert_eq!(out.len(), 3);
        assert_eq!(out[2].meta, Meta::new(DType::F32, vec![2]));
        assert_eq!(*out[2].data, vec![2.0, 5.0]);
    }

    #[test]
    fn copies_and_rearrangements() {
        let x = t(DType::F32, &[3], &[1.7, -1.7, 2.0]);
        let out = call1(
            "aten._to_copy.default",
            &[&x],
            &[v(0)],
            &[("dtype", Arg::Dtype(DType::I64))],
        );
        assert_eq!(
            (out.dtype(), out.data.to_vec()),
            (DType::I64, vec![1.0, -1.0, 2.0])
        );
        let dst = t(DType::I32, &[2, 3], &[0.0; 6]);
        let out = call1("aten.copy.default", &[&dst, &x], &[v(0), v(1)], &[]);
        assert_eq!(
            (out.dtype(), out.data.to_vec()),
            (DType::I32, vec![1.0, -1.0, 2.0, 1.0, -1.0, 2.0])
        );
        assert!(call("aten.copy.default", &[&x, &dst], &[v(0), v(1)], &[]).is_err());
        let out = call1(
            "aten.repeat.default",
            &[&t(DType::F32, &[2], &[1.0, 2.0])],
            &[v(0), ints(&[2, 2])],
            &[],
        );
        assert_eq!(out.shape(), &[2, 4]);
        assert_eq!(*out.data, vec![1.0, 2.0, 1.0, 2.0, 1.0, 2.0, 1.0, 2.0]);
        let out = call1("aten.roll.default", &[&ar(&[5])], &[v(0), Arg::Int(2)], &[]);
        assert_eq!(*out.data, vec![3.0, 4.0, 0.0, 1.0, 2.0]);
        let out = call1(
            "aten.roll.default",
            &[&ar(&[2, 3])],
            &[v(0), ints(&[-1, 1]), ints(&[1, 0])],
            &[],
        );
        assert_eq!(*out.data, vec![4.0, 5.0, 3.0, 1.0, 2.0, 0.0]);
        let out = call1(
            "aten.roll.default",
            &[&ar(&[2, 2])],
            &[v(0), Arg::Int(1)],
            &[],
        );
        assert_eq!(*out.data, vec![3.0, 0.0, 1.0, 2.0]);
        let out = call1(
            "aten.flip.default",
            &[&ar(&[2, 3])],
            &[v(0), ints(&[-1])],
            &[],
        );
        assert_eq!(*out.data, vec![2.0, 1.0, 0.0, 5.0, 4.0, 3.0]);
        let out = call1("aten.tril.default", &[&ar(&[3, 3])], &[v(0)], &[]);
        assert_eq!(*out.data, vec![0.0, 0.0, 0.0, 3.0, 4.0, 0.0, 6.0, 7.0, 8.0]);
        let out = call1(
            "aten.triu.default",
            &[&ar(&[2, 3])],
            &[v(0), Arg::Int(1)],
            &[],
        );
        assert_eq!(*out.data, vec![0.0, 1.0, 2.0, 0.0, 0.0, 5.0]);
        assert!(call("aten.tril.default", &[&ar(&[3])], &[v(0)], &[]).is_err());
        let out = call1(
            "aten.constant_pad_nd.default",
            &[&ar(&[2, 3])],
            &[v(0), ints(&[1, -1]), Arg::Float(9.0)],
            &[],
        );
        assert_eq!(out.shape(), &[2, 3]);
        assert_eq!(*out.data, vec![9.0, 0.0, 1.0, 9.0, 3.0, 4.0]);
        let out = call1(
            "aten.constant_pad_nd.default",
            &[&ar(&[1, 1])],
            &[v(0), ints(&[0, 0, 1, 0])],
            &[],
        );
        assert_eq!(*out.data, vec![0.0, 0.0]);
        assert!(call(
            "aten.constant_pad_nd.default",
            &[&ar(&[2])],
            &[v(0), ints(&[-3, 0])],
            &[]
        )
        .is_err());
        let out = call1(
            "aten.unfold.default",
            &[&ar(&[5])],
            &[v(0), Arg::Int(0), Arg::Int(2), Arg::Int(2)],
            &[],
        );
        assert_eq!(out.shape(), &[2, 2]);
        assert_eq!(*out.data, vec![0.0, 1.0, 2.0, 3.0]);
    }

    /// `pad` in every mode, against values torch 2.15 printed for `arange(12).reshape(1, 3, 4)`.
    #[test]
    fn pad_modes_follow_torch() {
        let x = ar(&[1, 3, 4]);
        let pad = |p: &[i64], mode: &str| {
            call(
                "aten.pad.default",
                &[&x],
                &[v(0), ints(p), Arg::Str(mode.into())],
                &[],
            )
        };
        let row0 = |t: &Tensor| t.data[..t.shape()[2]].to_vec();
        let out = pad(&[2, 1], "reflect").unwrap().remove(0);
        assert_eq!(out.shape(), &[1, 3, 7]);
        assert_eq!(row0(&out), vec![2.0, 1.0, 0.0, 1.0, 2.0, 3.0, 2.0]);
        let out = pad(&[-1, 2], "reflect").unwrap().remove(0);
        assert_eq!(row0(&out), vec![1.0, 2.0, 3.0, 2.0, 1.0]);
        let out = pad(&[2, 2, 1, 0], "reflect").unwrap().remove(0);
        assert_eq!(out.shape(), &[1, 4, 8]);
        assert_eq!(row0(&out), vec![6.0, 5.0, 4.0, 5.0, 6.0, 7.0, 6.0, 5.0]);
        let out = pad(&[2, 1], "replicate").unwrap().remove(0);
        assert_eq!(row0(&out), vec![0.0, 0.0, 0.0, 1.0, 2.0, 3.0, 3.0]);
        let out = pad(&[-1, 2], "replicate").unwrap().remove(0);
        assert_eq!(row0(&out), vec![1.0, 2.0, 3.0, 3.0, 3.0]);
        let out = pad(&[2, 1], "circular").unwrap().remove(0);
        assert_eq!(row0(&out), vec![2.0, 3.0, 0.0, 1.0, 2.0, 3.0, 0.0]);
        // Circular padding wraps what is left after cropping the other side.
        let out = pad(&[-1, 2], "circular").unwrap().remove(0);
        assert_eq!(row0(&out), vec![1.0, 2.0, 3.0, 1.0, 2.0]);
        let out = pad(&[1, 1, 1, 1], "circular").unwrap().remove(0);
        assert_eq!(row0(&out), vec![11.0, 8.0, 9.0, 10.0, 11.0, 8.0]);
        let out = pad(&[0, -4], "circular").unwrap().remove(0);
        assert_eq!(out.shape(), &[1, 3, 0]);
        // Constant mode, the default, with its value (or zero).
        let out = call1("aten.pad.default", &[&x], &[v(0), ints(&[1, 0])], &[]);
        assert_eq!(row0(&out), vec![0.0, 0.0, 1.0, 2.0, 3.0]);
        let out = call1(
            "aten.pad.default",
            &[&x],
            &[
                v(0),
                ints(&[0, 1]),
                Arg::Str("constant".into()),
                Arg::Float(-2.0),
            ],
            &[],
        );
        assert_eq!(row0(&out), vec![0.0, 1.0, 2.0, 3.0, -2.0]);
        // What torch refuses.
        assert!(pad(&[4, 0], "reflect").is_err());
        assert!(pad(&[0, -4], "reflect").is_err());
        assert!(pad(&[5, 0], "circular").is_err());
        assert!(pad(&[-3, 2], "circular").is_err());
        assert!(pad(&[1, 1], "bogus").is_err());
        assert!(pad(&[1, 1, 1, 1, 1, 1], "replicate").is_err());
        assert!(call(
            "aten.pad.default",
            &[&ar(&[4])],
            &[v(0), ints(&[1, 1]), Arg::Str("replicate".into())],
            &[]
        )
        .is_err());
        assert!(call(
            "aten.pad.default",
            &[&x],
            &[
                v(0),
                ints(&[1, 1]),
                Arg::Str("reflect".into()),
                Arg::Float(1.0)
            ],
            &[]
        )
        .is_err());
    }

    #[test]
    fn broadcast_tensors_and_metadata_asserts() {
        let a = ar(&[3, 1]);
        let b = t(DType::I64, &[2], &[7.0, 8.0]);
        let out = call(
            "aten.broadcast_tensors.default",
            &[&a, &b],
            &[Arg::List(vec![v(0), v(1)])],
            &[],
        )
        .unwrap();
        assert_eq!(out[0].meta, Meta::new(DType::F32, vec![3, 2]));
        assert_eq!(*out[0].data, vec![0.0, 0.0, 1.0, 1.0, 2.0, 2.0]);
        assert_eq!(out[1].meta, Meta::new(DType::I64, vec![3, 2]));
        assert_eq!(*out[1].data, vec![7.0, 8.0, 7.0, 8.0, 7.0, 8.0]);
        let c = ar(&[3]);
        assert!(call(
            "aten.broadcast_tensors.default",
            &[&a, &c, &b],
            &[Arg::List(vec![v(0), v(1), v(2)])],
            &[]
        )
        .is_err());

        let assert_meta =
            |kw: &[(&str, Arg)]| call("aten._assert_tensor_metadata.default", &[&a], &[v(0)], kw);
        let ok = assert_meta(&[
            ("dtype", Arg::Dtype(DType::F32)),
            ("size", ints(&[3, 1])),
            ("device", Arg::Device("device(type='cuda', index=0)".into())),
            ("layout", Arg::Layout("strided".into())),
        ]);
        assert_eq!(ok, Ok(vec![]));
        assert!(assert_meta(&[("dtype", Arg::Dtype(DType::F64))]).is_err());
        assert!(assert_meta(&[("size", ints(&[1, 3]))]).is_err());
        assert!(assert_meta(&[("layout", Arg::Layout("sparse_coo".into()))]).is_err());

        let out = call1("aten.detach_.default", &[&a], &[v(0)], &[]);
        assert_eq!(out, a);
    }
}
