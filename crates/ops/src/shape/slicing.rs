//! Strided sub-views and scatters into them: `slice`, `select`, `narrow`, `slice_scatter`,
//! `select_scatter`, `as_strided`(`_scatter`), `diagonal`, `unfold`.

use super::strided::{
    for_each_strided, istrides, slice_range, strided_bounds, strided_read, usize_of,
};
use crate::tensor::cast_value;
use crate::util::norm_dim;
use crate::{Args, Meta, OpError, Tensor};
use shardproof_ir::DType;

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

pub(super) fn infer_slice(a: &Args) -> Result<Vec<Meta>, OpError> {
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

pub(super) fn eval_slice(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
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

pub(super) fn infer_select(a: &Args) -> Result<Vec<Meta>, OpError> {
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

pub(super) fn eval_select(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let (off, shape, st) = select_view(a, &t.meta)?;
    Ok(vec![Tensor::new(
        m[0].clone(),
        strided_read(&t.data, off, &shape, &st),
    )])
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

pub(super) fn infer_narrow(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let (dim, _, len) = narrow_args(a, &m)?;
    let mut shape = m.shape.clone();
    shape[dim] = len;
    Ok(vec![Meta::new(m.dtype, shape)])
}

pub(super) fn eval_narrow(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let (dim, s, _) = narrow_args(a, &t.meta)?;
    let st = istrides(t.shape());
    let data = strided_read(&t.data, s * st[dim] as usize, &m[0].shape, &st);
    Ok(vec![Tensor::new(m[0].clone(), data)])
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

pub(super) fn infer_slice_scatter(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let (_, shape, _) = slice_view(a, &m)?;
    check_src(a, &shape)?;
    Ok(vec![m])
}

pub(super) fn eval_slice_scatter(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let (off, shape, st) = slice_view(a, &t.meta)?;
    let mut data = t.data.as_ref().clone();
    scatter_view(&mut data, off, &shape, &st, a.tensor("src")?, m[0].dtype);
    Ok(vec![Tensor::new(m[0].clone(), data)])
}

pub(super) fn infer_select_scatter(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let (_, shape, _) = select_view(a, &m)?;
    check_src(a, &shape)?;
    Ok(vec![m])
}

pub(super) fn eval_select_scatter(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
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

pub(super) fn infer_as_strided(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let (_, shape, _) = as_strided_view(a, &m)?;
    Ok(vec![Meta::new(m.dtype, shape)])
}

pub(super) fn eval_as_strided(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let (off, shape, st) = as_strided_view(a, &t.meta)?;
    Ok(vec![Tensor::new(
        m[0].clone(),
        strided_read(&t.data, off, &shape, &st),
    )])
}

pub(super) fn infer_as_strided_scatter(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let (_, shape, _) = as_strided_view(a, &m)?;
    check_src(a, &shape)?;
    Ok(vec![m])
}

pub(super) fn eval_as_strided_scatter(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
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

pub(super) fn infer_diagonal(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let (_, shape, _) = diagonal_view(a, &m)?;
    Ok(vec![Meta::new(m.dtype, shape)])
}

pub(super) fn eval_diagonal(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
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

pub(super) fn infer_unfold(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let (_, shape, _) = unfold_view(a, &m)?;
    Ok(vec![Meta::new(m.dtype, shape)])
}

pub(super) fn eval_unfold(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let (off, shape, st) = unfold_view(a, &t.meta)?;
    Ok(vec![Tensor::new(
        m[0].clone(),
        strided_read(&t.data, off, &shape, &st),
    )])
}
