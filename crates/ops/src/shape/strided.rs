//! Shared helpers of the shape family: strided views over row-major data, permutations,
//! dim lists, `view` sizes and `slice` ranges.

use crate::tensor::strides;
use crate::util::norm_dim;
use crate::{OpError, Tensor};

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
pub(super) fn usize_of(v: i64, what: &str) -> Result<usize, OpError> {
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
