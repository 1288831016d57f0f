//! Indexing operators: advanced indexing (`index`, `index_put` with integer and boolean
//! indices), `index_select`, `gather`, the scatters, `index_add`/`index_copy`/`index_fill`,
//! and the data-dependent `nonzero`, `masked_select` and `masked_scatter`.
//!
//! Boolean masks make output shapes depend on values: their inference needs the data, and
//! fails with an explanation during shape-only inference.

use crate::shape::for_each_strided;
use crate::tensor::{cast_value, strides};
use crate::util::{broadcast_shapes, broadcast_to, norm_dim};
use crate::{Args, Meta, OpError, Registry, Tensor};
use shardproof_ir::{Arg, DType};
use std::borrow::Cow;

/// Whether a dtype indexes as a mask.
fn is_mask(d: DType) -> bool {
    matches!(d, DType::Bool | DType::U8)
}

/// Checks the dtype of one advanced index.
fn check_index_dtype(d: DType) -> Result<(), OpError> {
    if is_mask(d) || matches!(d, DType::I64 | DType::I32) {
        Ok(())
    } else {
        Err(OpError::new(format!(
            "tensors used as indices must be long, int, byte or bool tensors, got {d}"
        )))
    }
}

/// The advanced indices with every boolean mask replaced by one i64 index per masked dim
/// (the coordinates of its true elements, as `nonzero` gives them).
fn expand_masks<'t>(
    self_shape: &[usize],
    idx: &[Option<&'t Tensor>],
) -> Result<Vec<Option<Cow<'t, Tensor>>>, OpError> {
    let mut out: Vec<Option<Cow<Tensor>>> = Vec::new();
    for i in idx {
        match i {
            None => out.push(None),
            Some(t) if is_mask(t.dtype()) => {
                let k = t.meta.rank();
                if k == 0 {
                    return Err(OpError::new(
                        "indexing with a 0-dim boolean mask is not supported",
                    ));
                }
                let pos = out.len();
                if pos + k > self_shape.len() {
                    return Err(OpError::new(format!(
                        "too many indices for tensor of dimension {}",
                        self_shape.len()
                    )));
                }
                for j in 0..k {
                    if t.shape()[j] != self_shape[pos + j] {
                        return Err(OpError::new(format!(
                            "The shape of the mask {:?} at index {j} does not match the shape of the indexed tensor {self_shape:?} at index {}",
                            t.shape(),
                            pos + j
                        )));
                    }
                }
                let st = strides(t.shape());
                let nz: Vec<usize> = (0..t.numel()).filter(|&p| t.data[p] != 0.0).collect();
                for (&sj, &nj) in st.iter().zip(t.shape()) {
                    let coords = nz.iter().map(|&p| ((p / sj) % nj) as f64).collect();
                    out.push(Some(Cow::Owned(Tensor::new(
                        Meta::new(DType::I64, vec![nz.len()]),
                        coords,
                    ))));
                }
            }
            Some(t) => {
                check_index_dtype(t.dtype())?;
                out.push(Some(Cow::Borrowed(*t)));
            }
        }
    }
    if out.len() > self_shape.len() {
        return Err(OpError::new(format!(
            "too many indices for tensor of dimension {} (got {})",
            self_shape.len(),
            out.len()
        )));
    }
    Ok(out)
}

/// Where the indexed dims go in the result of advanced indexing.
struct Layout {
    /// Result shape.
    out_shape: Vec<usize>,
    /// Broadcast shape of the index tensors.
    b_shape: Vec<usize>,
    /// Whether the indexed dims are adjacent: then the broadcast dims replace them in place;
    /// otherwise they come first, as in numpy.
    adjacent: bool,
}

/// The layout of advanced indexing of `self_shape` by indices of the given (expanded) shapes.
fn layout(self_shape: &[usize], shapes: &[Option<Vec<usize>>]) -> Result<Layout, OpError> {
    let pos: Vec<usize> = (0..shapes.len()).filter(|&i| shapes[i].is_some()).collect();
    let (Some(&first), Some(&last)) = (pos.first(), pos.last()) else {
        return Err(OpError::new(
            "advanced indexing needs at least one index tensor",
        ));
    };
    let mut b_shape = Vec::new();
    for s in shapes.iter().flatten() {
        b_shape = broadcast_shapes(&b_shape, s).map_err(|_| {
            OpError::new(format!(
                "shape mismatch: indexing tensors could not be broadcast together with shapes {:?}",
                shapes.iter().flatten().collect::<Vec<_>>()
            ))
        })?;
    }
    let adjacent = last - first + 1 == pos.len();
    let indexed = |d: usize| shapes.get(d).is_some_and(|s| s.is_some());
    let mut out_shape = Vec::new();
    if adjacent {
        out_shape.extend_from_slice(&self_shape[..first]);
        out_shape.extend_from_slice(&b_shape);
        out_shape.extend((last + 1..self_shape.len()).map(|d| self_shape[d]));
    } else {
        out_shape.extend_from_slice(&b_shape);
        out_shape.extend(
            (0..self_shape.len())
                .filter(|&d| !indexed(d))
                .map(|d| self_shape[d]),
        );
    }
    Ok(Layout {
        out_shape,
        b_shape,
        adjacent,
    })
}

/// Flat offsets of the elements of `dims` of a row-major tensor of `shape`, in row-major order
/// of those dims.
fn dim_offsets(shape: &[usize], dims: &[usize]) -> Vec<usize> {
    let st = strides(shape);
    let sub: Vec<usize> = dims.iter().map(|&d| shape[d]).collect();
    let sst: Vec<isize> = dims.iter().map(|&d| st[d] as isize).collect();
    let mut out = Vec::with_capacity(sub.iter().product());
    for_each_strided(0, &sub, &sst, |o| out.push(o));
    out
}

/// For every element of the result of advanced indexing, the flat offset in `self` it reads
/// (or, for `index_put`, writes).
fn index_offsets(
    self_shape: &[usize],
    idx: &[Option<Cow<Tensor>>],
    lay: &Layout,
) -> Result<Vec<usize>, OpError> {
    let st = strides(self_shape);
    let nb: usize = lay.b_shape.iter().product();
    let mut base = vec![0usize; nb];
    for (d, ix) in idx.iter().enumerate() {
        let Some(t) = ix else { continue };
        let n = self_shape[d] as i64;
        for (b, &v) in broadcast_to(t, &lay.b_shape).iter().enumerate() {
            let i = v as i64;
            if i < -n || i >= n {
                return Err(OpError::new(format!(
                    "index {i} is out of bounds for dimension {d} with size {n}"
                )));
            }
            base[b] += (if i < 0 { i + n } else { i }) as usize * st[d];
        }
    }
    let plain: Vec<usize> = (0..self_shape.len())
        .filter(|&d| idx.get(d).is_none_or(|i| i.is_none()))
        .collect();
    let first = idx.iter().position(|i| i.is_some()).unwrap_or(0);
    let (pre, post): (Vec<usize>, Vec<usize>) = if lay.adjacent {
        plain.iter().partition(|&&d| d < first)
    } else {
        (vec![], plain)
    };
    let pre_offs = dim_offsets(self_shape, &pre);
    let post_offs = dim_offsets(self_shape, &post);
    let mut out = Vec::with_capacity(pre_offs.len() * nb * post_offs.len());
    for &p in &pre_offs {
        for &b in &base {
            for &q in &post_offs {
                out.push(p + b + q);
            }
        }
    }
    Ok(out)
}

/// The shapes of the expanded indices, from metas alone when there is no mask, else from data.
fn index_shapes(a: &Args, self_shape: &[usize]) -> Result<Vec<Option<Vec<usize>>>, OpError> {
    let metas = a.metas("indices")?;
    if metas.iter().flatten().any(|m| is_mask(m.dtype)) {
        let ts = a.tensors("indices").map_err(|_| {
            OpError::new(format!(
                "{}: indexing with a boolean mask has a data-dependent shape; the mask's values are needed",
                a.schema().name
            ))
        })?;
        let exp = expand_masks(self_shape, &ts)?;
        return Ok(exp
            .iter()
            .map(|o| o.as_ref().map(|t| t.shape().to_vec()))
            .collect());
    }
    for m in metas.iter().flatten() {
        check_index_dtype(m.dtype)?;
    }
    if metas.len() > self_shape.len() {
        return Err(OpError::new(format!(
            "too many indices for tensor of dimension {} (got {})",
            self_shape.len(),
            metas.len()
        )));
    }
    Ok(metas.into_iter().map(|m| m.map(|m| m.shape)).collect())
}

fn infer_index(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let lay = layout(&m.shape, &index_shapes(a, &m.shape)?)?;
    Ok(vec![Meta::new(m.dtype, lay.out_shape)])
}

/// The offsets of an advanced-indexing call on `self`, with its layout.
fn offsets_of(a: &Args, t: &Tensor) -> Result<(Layout, Vec<usize>), OpError> {
    let ts = a.tensors("indices")?;
    let exp = expand_masks(t.shape(), &ts)?;
    let shapes: Vec<Option<Vec<usize>>> = exp
        .iter()
        .map(|o| o.as_ref().map(|t| t.shape().to_vec()))
        .collect();
    let lay = layout(t.shape(), &shapes)?;
    let offs = index_offsets(t.shape(), &exp, &lay)?;
    Ok((lay, offs))
}

fn eval_index(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let (_, offs) = offsets_of(a, t)?;
    Ok(vec![Tensor::new(
        m[0].clone(),
        offs.into_iter().map(|o| t.data[o]).collect(),
    )])
}

/// Whether torch runs an `index_put` as `masked_fill` (one mask index, a one-element value, no
/// accumulation), a path that converts the value to `self`'s dtype instead of requiring it.
fn is_masked_fill(a: &Args, values: &Meta) -> Result<bool, OpError> {
    let idx = a.metas("indices")?;
    let given: Vec<&Meta> = idx.iter().flatten().collect();
    Ok(
        !a.bool("accumulate")?
            && values.numel() == 1
            && given.len() == 1
            && is_mask(given[0].dtype),
    )
}

fn infer_index_put(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let v = a.meta("values")?;
    if v.dtype != m.dtype && !is_masked_fill(a, &v)? {
        return Err(OpError::new(format!(
            "Index put requires the source and destination dtypes match, got {} for the destination and {} for the source",
            m.dtype, v.dtype
        )));
    }
    let metas = a.metas("indices")?;
    if !a.has_data() && metas.iter().flatten().any(|i| is_mask(i.dtype)) {
        // A mask leaves the indexed shape unknown without data; the output shape is still
        // `self`'s, and the kernel checks the values.
        return Ok(vec![m]);
    }
    let shapes = index_shapes(a, &m.shape)?;
    let lay = layout(&m.shape, &shapes)?;
    check_values(&v.shape, &lay.out_shape)?;
    Ok(vec![m])
}

/// Checks that `values` broadcast to the indexed shape.
fn check_values(values: &[usize], indexed: &[usize]) -> Result<(), OpError> {
    match broadcast_shapes(values, indexed) {
        Ok(s) if s == indexed => Ok(()),
        _ => Err(OpError::new(format!(
            "shape mismatch: value tensor of shape {values:?} cannot be broadcast to indexing result of shape {indexed:?}"
        ))),
    }
}

fn eval_index_put(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let v = a.tensor("values")?;
    let acc = a.bool("accumulate")?;
    let (lay, offs) = offsets_of(a, t)?;
    check_values(v.shape(), &lay.out_shape)?;
    let vals = broadcast_to(v, &lay.out_shape);
    let mut data = t.data.as_ref().clone();
    let d = m[0].dtype;
    for (o, x) in offs.into_iter().zip(vals) {
        data[o] = cast_value(if acc { data[o] + x } else { x }, d);
    }
    Ok(vec![Tensor::new(m[0].clone(), data)])
}

/// Checks an index tensor of `index_select`/`index_add`-like ops: 0-d or 1-d, integer.
fn check_index_vector(a: &Args, name: &str) -> Result<Meta, OpError> {
    let i = a.meta(name)?;
    if i.rank() > 1 {
        return Err(OpError::new(format!(
            "{}: index should have at most 1 dimension, got {}",
            a.schema().name,
            i.rank()
        )));
    }
    if !matches!(i.dtype, DType::I64 | DType::I32) {
        return Err(OpError::new(format!(
            "{}: expected an int64 or int32 index, got {}",
            a.schema().name,
            i.dtype
        )));
    }
    Ok(i)
}

/// The normalized dim of a dim-wise indexing op (a 0-d `self` counts as 1-d).
fn index_dim(a: &Args, m: &Meta) -> Result<usize, OpError> {
    norm_dim(a.int("dim")?, m.rank())
}

/// The shape of `m` as a row-major tensor with at least one dim.
fn shape1(m: &Meta) -> Vec<usize> {
    if m.rank() == 0 {
        vec![1]
    } else {
        m.shape.clone()
    }
}

/// An index value checked against `[0, n)` (or `[-n, n)` with wrap-around when `wrap`).
fn checked_index(v: f64, n: usize, wrap: bool, op: &str) -> Result<usize, OpError> {
    let i = v as i64;
    let n = n as i64;
    let lo = if wrap { -n } else { 0 };
    if i < lo || i >= n {
        return Err(OpError::new(format!(
            "{op}: index {i} is out of bounds for a dim of size {n}"
        )));
    }
    Ok(if i < 0 { i + n } else { i } as usize)
}

fn infer_index_select(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let i = check_index_vector(a, "index")?;
    let d = index_dim(a, &m)?;
    if m.rank() == 0 {
        if i.numel() != 1 {
            return Err(OpError::new(
                "index_select(): index of a 0-dim tensor must have one element",
            ));
        }
        return Ok(vec![m]);
    }
    let mut shape = m.shape.clone();
    shape[d] = i.numel();
    Ok(vec![Meta::new(m.dtype, shape)])
}

fn eval_index_select(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let idx = a.tensor("index")?;
    let d = index_dim(a, &t.meta)?;
    let sh = shape1(&t.meta);
    let outer: usize = sh[..d].iter().product();
    let n = sh[d];
    let inner: usize = sh[d + 1..].iter().product();
    let rows = idx
        .data
        .iter()
        .map(|&v| checked_index(v, n, false, "index_select"))
        .collect::<Result<Vec<_>, _>>()?;
    let mut data = Vec::with_capacity(m[0].numel());
    for o in 0..outer {
        for &r in &rows {
            let s = (o * n + r) * inner;
            data.extend_from_slice(&t.data[s..s + inner]);
        }
    }
    Ok(vec![Tensor::new(m[0].clone(), data)])
}

/// For every element of `index` (in row-major order), the offset in a tensor of `target`
/// shape with `dim` replaced by the index value, and the offset of the same position in a
/// tensor of `other` shape (the source of a scatter).
fn scatter_offsets(
    target: &[usize],
    index: &Tensor,
    dim: usize,
    other: &[usize],
    op: &str,
) -> Result<Vec<(usize, usize)>, OpError> {
    let ist = strides(&shape1(&index.meta));
    let tst = strides(target);
    let ost = strides(other);
    let ish = shape1(&index.meta);
    let mut out = Vec::with_capacity(index.numel());
    for (p, &v) in index.data.iter().enumerate() {
        let mut t = 0;
        let mut o = 0;
        for d in 0..ish.len() {
            let c = (p / ist[d]) % ish[d];
            o += c * ost[d];
            t += if d == dim {
                checked_index(v, target[d], false, op)?
            } else {
                c
            } * tst[d];
        }
        out.push((t, o));
    }
    Ok(out)
}

/// Checks the shapes of `gather`/`scatter`: same rank, index no larger than `src` anywhere and
/// than `self` outside `dim`.
fn check_scatter_shapes(
    a: &Args,
    m: &Meta,
    i: &Meta,
    src: Option<&Meta>,
    d: usize,
) -> Result<(), OpError> {
    let op = &a.schema().name;
    if i.dtype != DType::I64 {
        return Err(OpError::new(format!(
            "{op}: expected dtype int64 for index, got {}",
            i.dtype
        )));
    }
    let (ms, is) = (shape1(m), shape1(i));
    if i.numel() == 0 {
        return Ok(());
    }
    if ms.len() != is.len() {
        return Err(OpError::new(format!(
            "{op}: index tensor must have the same number of dimensions as the input tensor"
        )));
    }
    for k in 0..is.len() {
        if k != d && is[k] > ms[k] {
            return Err(OpError::new(format!(
                "{op}: size of index {:?} exceeds the size of self {:?} at dim {k}",
                i.shape, m.shape
            )));
        }
    }
    if let Some(s) = src {
        let ss = shape1(s);
        if ss.len() != is.len() || is.iter().zip(&ss).any(|(a, b)| a > b) {
            return Err(OpError::new(format!(
                "{op}: expected index {:?} to be no larger than src {:?}",
                i.shape, s.shape
            )));
        }
        if s.dtype != m.dtype {
            return Err(OpError::new(format!(
                "{op}: expected self.dtype to be equal to src.dtype, got {} and {}",
                m.dtype, s.dtype
            )));
        }
    }
    Ok(())
}

fn infer_gather(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let i = a.meta("index")?;
    let d = index_dim(a, &m)?;
    check_scatter_shapes(a, &m, &i, None, d)?;
    Ok(vec![Meta::new(m.dtype, i.shape)])
}

fn eval_gather(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let idx = a.tensor("index")?;
    let d = index_dim(a, &t.meta)?;
    let offs = scatter_offsets(&shape1(&t.meta), idx, d, &shape1(&idx.meta), "gather")?;
    Ok(vec![Tensor::new(
        m[0].clone(),
        offs.into_iter().map(|(s, _)| t.data[s]).collect(),
    )])
}

/// The combining rule of a scatter.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reduce {
    Assign,
    Sum,
    Prod,
    Mean,
    Max,
    Min,
}

impl Reduce {
    fn parse(s: &str, op: &str) -> Result<Reduce, OpError> {
        Ok(match s {
            "add" | "sum" => Reduce::Sum,
            "multiply" | "prod" => Reduce::Prod,
            "mean" => Reduce::Mean,
            "amax" => Reduce::Max,
            "amin" => Reduce::Min,
            _ => return Err(OpError::new(format!("{op}: unknown reduce `{s}`"))),
        })
    }

    fn combine(self, acc: f64, x: f64) -> f64 {
        match self {
            Reduce::Assign => x,
            Reduce::Sum | Reduce::Mean => acc + x,
            Reduce::Prod => acc * x,
            Reduce::Max => {
                if acc.is_nan() || x.is_nan() {
                    f64::NAN
                } else {
                    acc.max(x)
                }
            }
            Reduce::Min => {
                if acc.is_nan() || x.is_nan() {
                    f64::NAN
                } else {
                    acc.min(x)
                }
            }
        }
    }
}

/// The reduction of a scatter overload: from its name or its `reduce` argument.
fn scatter_reduce_of(a: &Args) -> Result<Reduce, OpError> {
    let s = a.schema();
    if s.name.starts_with("scatter_add") {
        return Ok(Reduce::Sum);
    }
    if s.index_of("reduce").is_none() {
        return Ok(Reduce::Assign);
    }
    let r = Reduce::parse(&a.str("reduce")?, &s.name)?;
    if s.name.starts_with("scatter.") && !matches!(r, Reduce::Sum | Reduce::Prod) {
        return Err(OpError::new(format!(
            "{}: reduce must be 'add' or 'multiply'",
            s.name
        )));
    }
    Ok(r)
}

fn infer_scatter(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let i = a.meta("index")?;
    let d = index_dim(a, &m)?;
    let src = match a.schema().index_of("src") {
        Some(_) => Some(a.meta("src")?),
        None => None,
    };
    check_scatter_shapes(a, &m, &i, src.as_ref(), d)?;
    scatter_reduce_of(a)?;
    Ok(vec![m])
}

fn eval_scatter(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let idx = a.tensor("index")?;
    let d = index_dim(a, &t.meta)?;
    let red = scatter_reduce_of(a)?;
    let include_self = a.schema().index_of("include_self").is_none() || a.bool("include_self")?;
    let (src, value): (Option<&Tensor>, f64) = if a.schema().index_of("src").is_some() {
        (Some(a.tensor("src")?), 0.0)
    } else {
        (None, a.float("value")?)
    };
    let other = src.map_or_else(|| shape1(&idx.meta), |s| shape1(&s.meta));
    let offs = scatter_offsets(&shape1(&t.meta), idx, d, &other, &a.schema().name)?;
    let dt = m[0].dtype;
    let mut data = t.data.as_ref().clone();
    let mut count = vec![0usize; data.len()];
    for (to, so) in offs {
        let x = src.map_or(value, |s| s.data[so]);
        let x = cast_value(x, dt);
        data[to] = if count[to] == 0 && (!include_self || red == Reduce::Assign) {
            x
        } else {
            red.combine(data[to], x)
        };
        count[to] += 1;
    }
    if red == Reduce::Mean {
        for (v, &c) in data.iter_mut().zip(&count) {
            let n = (c + include_self as usize) as f64;
            if c > 0 {
                *v = if dt.is_float() {
                    *v / n
                } else {
                    (*v / n).floor()
                };
            }
        }
    }
    let data = data.into_iter().map(|v| cast_value(v, dt)).collect();
    Ok(vec![Tensor::new(m[0].clone(), data)])
}

/// Checks `index_add`/`index_copy`: a vector index as long as `source`'s `dim`, `source` shaped
/// like `self` elsewhere.
fn infer_index_add(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let i = check_index_vector(a, "index")?;
    let s = a.meta("source")?;
    let d = index_dim(a, &m)?;
    let (ms, ss) = (shape1(&m), shape1(&s));
    let ok = ms.len() == ss.len()
        && (0..ms.len()).all(|k| k == d || ms[k] == ss[k])
        && ss[d] == i.numel();
    if !ok {
        return Err(OpError::new(format!(
            "{}: source {:?} must have the shape of self {:?} outside dim {d} and {} entries along it",
            a.schema().name,
            s.shape,
            m.shape,
            i.numel()
        )));
    }
    if s.dtype != m.dtype {
        return Err(OpError::new(format!(
            "{}: self ({}) and source ({}) must have the same scalar type",
            a.schema().name,
            m.dtype,
            s.dtype
        )));
    }
    Ok(vec![m])
}

/// `index_add` (`alpha` given) or `index_copy`: row `i` of `source` along `dim` goes to row
/// `index[i]` of the result.
fn eval_index_add(a: &Args, m: &[Meta], add: bool) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let idx = a.tensor("index")?;
    let src = a.tensor("source")?;
    let d = index_dim(a, &t.meta)?;
    let alpha = if add { a.float("alpha")? } else { 1.0 };
    let sh = shape1(&t.meta);
    let outer: usize = sh[..d].iter().product();
    let n = sh[d];
    let inner: usize = sh[d + 1..].iter().product();
    let k = idx.numel();
    let dt = m[0].dtype;
    let mut data = t.data.as_ref().clone();
    let op = &a.schema().name;
    let rows = idx
        .data
        .iter()
        .map(|&v| checked_index(v, n, false, op))
        .collect::<Result<Vec<_>, _>>()?;
    for o in 0..outer {
        for (j, &r) in rows.iter().enumerate() {
            for i in 0..inner {
                let dst = (o * n + r) * inner + i;
                let x = src.data[(o * k + j) * inner + i];
                data[dst] = if add {
                    cast_value(data[dst] + alpha * x, dt)
                } else {
                    x
                };
            }
        }
    }
    Ok(vec![Tensor::new(m[0].clone(), data)])
}

fn infer_index_fill(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    check_index_vector(a, "index")?;
    index_dim(a, &m)?;
    if let Some(Arg::Value(_)) = a.get("value") {
        if a.meta("value")?.rank() != 0 {
            return Err(OpError::new(
                "index_fill only supports a 0-dimensional value tensor",
            ));
        }
    }
    Ok(vec![m])
}

fn eval_index_fill(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let idx = a.tensor("index")?;
    let d = index_dim(a, &t.meta)?;
    let v = match a.get("value") {
        Some(Arg::Value(_)) => a.tensor("value")?.data[0],
        _ => a.float("value")?,
    };
    let v = cast_value(v, m[0].dtype);
    let sh = shape1(&t.meta);
    let outer: usize = sh[..d].iter().product();
    let n = sh[d];
    let inner: usize = sh[d + 1..].iter().product();
    let mut data = t.data.as_ref().clone();
    for &x in idx.data.iter() {
        let r = checked_index(x, n, true, "index_fill")?;
        for o in 0..outer {
            let s = (o * n + r) * inner;
            data[s..s + inner].iter_mut().for_each(|e| *e = v);
        }
    }
    Ok(vec![Tensor::new(m[0].clone(), data)])
}

/// The data of a data-dependent op's input, or an error explaining that inference needs it.
fn needs_data<'t>(a: &Args<'t>, name: &str) -> Result<&'t Tensor, OpError> {
    a.tensor(name).map_err(|_| {
        OpError::new(format!(
            "{} has a data-dependent output shape; the values of `{name}` are needed",
            a.schema().name
        ))
    })
}

fn infer_nonzero(a: &Args) -> Result<Vec<Meta>, OpError> {
    let t = needs_data(a, "self")?;
    let nnz = t.data.iter().filter(|&&x| x != 0.0).count();
    Ok(vec![Meta::new(DType::I64, vec![nnz, t.meta.rank()])])
}

fn eval_nonzero(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let st = strides(t.shape());
    let mut data = Vec::with_capacity(m[0].numel());
    for (p, &x) in t.data.iter().enumerate() {
        if x != 0.0 {
            for (&s, &n) in st.iter().zip(t.shape()) {
                data.push(((p / s) % n) as f64);
            }
        }
    }
    Ok(vec![Tensor::new(m[0].clone(), data)])
}

/// `self` and `mask` broadcast together, as `masked_select` and `masked_scatter` see them.
fn masked_pair(a: &Args) -> Result<(Vec<usize>, Meta, Meta), OpError> {
    let (x, mask) = (a.meta("self")?, a.meta("mask")?);
    if mask.dtype != DType::Bool {
        return Err(OpError::new(format!(
            "{}: expected a boolean mask, got {}",
            a.schema().name,
            mask.dtype
        )));
    }
    Ok((broadcast_shapes(&x.shape, &mask.shape)?, x, mask))
}

fn infer_masked_select(a: &Args) -> Result<Vec<Meta>, OpError> {
    let (shape, x, _) = masked_pair(a)?;
    let mask = needs_data(a, "mask")?;
    let nnz = broadcast_to(mask, &shape)
        .iter()
        .filter(|&&b| b != 0.0)
        .count();
    Ok(vec![Meta::new(x.dtype, vec![nnz])])
}

fn eval_masked_select(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    let (shape, _, _) = masked_pair(a)?;
    let x = broadcast_to(a.tensor("self")?, &shape);
    let mask = broadcast_to(a.tensor("mask")?, &shape);
    let data = x
        .into_iter()
        .zip(mask)
        .filter(|(_, b)| *b != 0.0)
        .map(|(v, _)| v)
        .collect();
    Ok(vec![Tensor::new(m[0].clone(), data)])
}

fn infer_masked_scatter(a: &Args) -> Result<Vec<Meta>, OpError> {
    let (shape, x, _) = masked_pair(a)?;
    let s = a.meta("source")?;
    if s.dtype != x.dtype {
        return Err(OpError::new(format!(
            "masked_scatter: expected self and source to have the same dtype, got {} and {}",
            x.dtype, s.dtype
        )));
    }
    Ok(vec![Meta::new(x.dtype, shape)])
}

fn eval_masked_scatter(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    let shape = &m[0].shape;
    let mut x = broadcast_to(a.tensor("self")?, shape);
    let mask = broadcast_to(a.tensor("mask")?, shape);
    let src = a.tensor("source")?;
    let mut k = 0;
    for (v, b) in x.iter_mut().zip(mask) {
        if b != 0.0 {
            *v = *src.data.get(k).ok_or_else(|| {
                OpError::new(
                    "masked_scatter: the number of true elements exceeds the source's size",
                )
            })?;
            k += 1;
        }
    }
    Ok(vec![Tensor::new(m[0].clone(), x)])
}

/// Registers the indexing family.
pub(crate) fn register(r: &mut Registry) {
    for (name, schema) in [
        (
            "aten.index.Tensor",
            "index.Tensor(Tensor self, Tensor?[] indices) -> Tensor",
        ),
        (
            "aten._unsafe_index.Tensor",
            "_unsafe_index.Tensor(Tensor self, Tensor?[] indices) -> Tensor",
        ),
    ] {
        r.pure(name, schema, infer_index, |a, m, _| eval_index(a, m));
    }
    for (name, schema) in [
        (
            "aten.index_put.default",
            "index_put(Tensor self, Tensor?[] indices, Tensor values, bool accumulate=False) -> Tensor",
        ),
        (
            "aten._unsafe_index_put.default",
            "_unsafe_index_put(Tensor self, Tensor?[] indices, Tensor values, bool accumulate=False) -> Tensor",
        ),
    ] {
        r.pure(name, schema, infer_index_put, |a, m, _| eval_index_put(a, m));
    }
    r.pure(
        "aten.index_select.default",
        "index_select(Tensor self, int dim, Tensor index) -> Tensor",
        infer_index_select,
        |a, m, _| eval_index_select(a, m),
    );
    r.pure(
        "aten.gather.default",
        "gather(Tensor self, int dim, Tensor index, *, bool sparse_grad=False) -> Tensor",
        infer_gather,
        |a, m, _| eval_gather(a, m),
    );
    for (name, schema) in [
        ("aten.scatter.src", "scatter.src(Tensor self, int dim, Tensor index, Tensor src) -> Tensor"),
        ("aten.scatter.value", "scatter.value(Tensor self, int dim, Tensor index, Scalar value) -> Tensor"),
        (
            "aten.scatter.reduce",
            "scatter.reduce(Tensor self, int dim, Tensor index, Tensor src, *, str reduce) -> Tensor",
        ),
        (
            "aten.scatter.value_reduce",
            "scatter.value_reduce(Tensor self, int dim, Tensor index, Scalar value, *, str reduce) -> Tensor",
        ),
        (
            "aten.scatter_add.default",
            "scatter_add(Tensor self, int dim, Tensor index, Tensor src) -> Tensor",
        ),
        (
            "aten.scatter_reduce.two",
            "scatter_reduce.two(Tensor self, int dim, Tensor index, Tensor src, str reduce, *, bool include_self=True) -> Tensor",
        ),
    ] {
        r.pure(name, schema, infer_scatter, |a, m, _| eval_scatter(a, m));
    }
    r.pure(
        "aten.index_add.default",
        "index_add(Tensor self, int dim, Tensor index, Tensor source, *, Scalar alpha=1) -> Tensor",
        infer_index_add,
        |a, m, _| eval_index_add(a, m, true),
    );
    r.pure(
        "aten.index_copy.default",
        "index_copy(Tensor self, int dim, Tensor index, Tensor source) -> Tensor",
        infer_index_add,
        |a, m, _| eval_index_add(a, m, false),
    );
    for (name, schema) in [
        (
            "aten.index_fill.int_Scalar",
            "index_fill.int_Scalar(Tensor self, int dim, Tensor index, Scalar value) -> Tensor",
        ),
        (
            "aten.index_fill.int_Tensor",
            "index_fill.int_Tensor(Tensor self, int dim, Tensor index, Tensor value) -> Tensor",
        ),
    ] {
        r.pure(name, schema, infer_index_fill, |a, m, _| {
            eval_index_fill(a, m)
        });
    }
    r.pure(
        "aten.nonzero.default",
        "nonzero(Tensor self) -> Tensor",
        infer_nonzero,
        |a, m, _| eval_nonzero(a, m),
    );
    r.pure(
        "aten.masked_select.default",
        "masked_select(Tensor self, Tensor mask) -> Tensor",
        infer_masked_select,
        |a, m, _| eval_masked_select(a, m),
    );
    r.pure(
        "aten.masked_scatter.default",
        "masked_scatter(Tensor self, Tensor mask, Tensor source) -> Tensor",
        infer_masked_scatter,
        |a, m, _| eval_masked_scatter(a, m),
    );
}

#[cfg(test)]
mod tests {
    use crate::testing::{ar, call, call1, t, v};
    use crate::{Meta, Tensor};
    use shardproof_ir::{Arg, DType};

    fn long(shape: &[usize], xs: &[f64]) -> Tensor {
        t(DType::I64, shape, xs)
    }

    fn list(items: Vec<Arg>) -> Arg {
        Arg::List(items)
    }

    #[test]
    fn advanced_indexing_layouts() {
        let x = ar(&[3, 4]);
        let out = call1(
            "aten.index.Tensor",
            &[&x, &long(&[2], &[2.0, -3.0])],
            &[v(0), list(vec![v(1)])],
            &[],
        );
        assert_eq!(out.shape(), &[2, 4]);
        assert_eq!(*out.data, vec![8.0, 9.0, 10.0, 11.0, 0.0, 1.0, 2.0, 3.0]);
        let out = call1(
            "aten.index.Tensor",
            &[&x, &long(&[2], &[3.0, 0.0])],
            &[v(0), list(vec![Arg::None, v(1)])],
            &[],
        );
        assert_eq!(
            (out.shape(), out.data.to_vec()),
            (&[3usize, 2][..], vec![3.0, 0.0, 7.0, 4.0, 11.0, 8.0])
        );
        assert!(call(
            "aten.index.Tensor",
            &[&x, &long(&[1], &[3.0])],
            &[v(0), list(vec![v(1)])],
            &[]
        )
        .is_err());
        assert!(call(
            "aten.index.Tensor",
            &[&x, &t(DType::F32, &[1], &[0.0])],
            &[v(0), list(vec![v(1)])],
            &[]
        )
        .is_err());
        // Non-adjacent indexed dims: the broadcast dims come first.
        let y = ar(&[2, 3, 4]);
        let out = call1(
            "aten.index.Tensor",
            &[&y, &long(&[2], &[0.0, 1.0]), &long(&[2], &[3.0, 0.0])],
            &[v(0), list(vec![v(1), Arg::None, v(2)])],
            &[],
        );
        assert_eq!(out.shape(), &[2, 3]);
        assert_eq!(*out.data, vec![3.0, 7.0, 11.0, 12.0, 16.0, 20.0]);
        // Adjacent dims after a None stay in place, with broadcasting of the indices.
        let out = call1(
            "aten.index.Tensor",
            &[&y, &long(&[2, 1], &[0.0, 2.0]), &long(&[2], &[1.0, 3.0])],
            &[v(0), list(vec![Arg::None, v(1), v(2)])],
            &[],
        );
        assert_eq!(out.shape(), &[2, 2, 2]);
        assert_eq!(*out.data, vec![1.0, 3.0, 9.0, 11.0, 13.0, 15.0, 21.0, 23.0]);
    }

    #[test]
    fn boolean_masks() {
        let x = ar(&[2, 3]);
        let mask = t(DType::Bool, &[2, 3], &[1.0, 0.0, 1.0, 0.0, 0.0, 1.0]);
        let out = call1(
            "aten.index.Tensor",
            &[&x, &mask],
            &[v(0), list(vec![v(1)])],
            &[],
        );
        assert_eq!(
            (out.shape(), out.data.to_vec()),
            (&[3usize][..], vec![0.0, 2.0, 5.0])
        );
        let m1 = t(DType::Bool, &[3], &[0.0, 1.0, 1.0]);
        let out = call1(
            "aten.index.Tensor",
            &[&x, &m1],
            &[v(0), list(vec![Arg::None, v(1)])],
            &[],
        );
        assert_eq!(
            (out.shape(), out.data.to_vec()),
            (&[2usize, 2][..], vec![1.0, 2.0, 4.0, 5.0])
        );
        assert!(call(
            "aten.index.Tensor",
            &[&x, &m1],
            &[v(0), list(vec![v(1)])],
            &[]
        )
        .is_err());
        // The pattern of vocab-parallel embeddings: zero the masked entries with a 0-d value.
        let ids = long(&[2, 2], &[5.0, 1.0, 7.0, 2.0]);
        let oob = t(DType::Bool, &[2, 2], &[1.0, 0.0, 1.0, 0.0]);
        let zero = long(&[], &[0.0]);
        let out = call1(
            "aten.index_put.default",
            &[&ids, &oob, &zero],
            &[v(0), list(vec![v(1)]), v(2)],
            &[],
        );
        assert_eq!(
            (out.dtype(), out.data.to_vec()),
            (DType::I64, vec![0.0, 1.0, 0.0, 2.0])
        );
        let vals = t(DType::F32, &[3], &[-1.0, -2.0, -3.0]);
        let out = call1(
            "aten.index_put.default",
            &[&x, &mask, &vals],
            &[v(0), list(vec![v(1)]), v(2)],
            &[],
        );
        assert_eq!(*out.data, vec![-1.0, 1.0, -2.0, 3.0, 4.0, -3.0]);
        let bad = t(DType::F32, &[2], &[0.0, 0.0]);
        assert!(call(
            "aten.index_put.default",
            &[&x, &mask, &bad],
            &[v(0), list(vec![v(1)]), v(2)],
            &[]
        )
        .is_err());
        let f64v = t(DType::F64, &[], &[-7.0]);
        let out = call1(
            "aten.index_put.default",
            &[&x, &mask, &f64v],
            &[v(0), list(vec![v(1)]), v(2)],
            &[],
        );
        assert_eq!(
            (out.dtype(), out.data.to_vec()),
            (DType::F32, vec![-7.0, 1.0, -7.0, 3.0, 4.0, -7.0])
        );
        let idx = long(&[1], &[0.0]);
        assert!(call(
            "aten.index_put.default",
            &[&x, &idx, &f64v],
            &[v(0), list(vec![v(1)]), v(2)],
            &[]
        )
        .is_err());
        let out = call1("aten.nonzero.default", &[&m1], &[v(0)], &[]);
        assert_eq!(
            (out.shape(), out.data.to_vec()),
            (&[2usize, 1][..], vec![1.0, 2.0])
        );
        let out = call1("aten.masked_select.default", &[&x, &m1], &[v(0), v(1)], &[]);
        assert_eq!(*out.data, vec![1.0, 2.0, 4.0, 5.0]);
    }

    #[test]
    fn index_put_accumulates_duplicates() {
        let z = t(DType::F32, &[3], &[0.0; 3]);
        let idx = long(&[3], &[0.0, 0.0, 2.0]);
        let vals = t(DType::F32, &[3], &[1.0, 2.0, 3.0]);
        let args = [v(0), list(vec![v(1)]), v(2)];
        let out = call1("aten.index_put.default", &[&z, &idx, &vals], &args, &[]);
        assert_eq!(*out.data, vec![2.0, 0.0, 3.0]);
        let out = call1(
            "aten.index_put.default",
            &[&z, &idx, &vals],
            &args,
            &[("accumulate", Arg::Bool(true))],
        );
        assert_eq!(*out.data, vec![3.0, 0.0, 3.0]);
    }

    #[test]
    fn gathers_and_scatters() {
        let x = t(DType::F32, &[2, 2], &[1.0, 2.0, 3.0, 4.0]);
        let idx = long(&[2, 2], &[0.0, 0.0, 1.0, 0.0]);
        let out = call1(
            "aten.gather.default",
            &[&x, &idx],
            &[v(0), Arg::Int(1), v(1)],
            &[],
        );
        assert_eq!(*out.data, vec![1.0, 1.0, 4.0, 3.0]);
        assert!(call(
            "aten.gather.default",
            &[&x, &long(&[1, 1], &[2.0])],
            &[v(0), Arg::Int(1), v(1)],
            &[]
        )
        .is_err());
        let z = t(DType::F32, &[2, 2], &[0.0; 4]);
        let out = call1(
            "aten.scatter_add.default",
            &[&z, &idx, &x],
            &[v(0), Arg::Int(1), v(1), v(2)],
            &[],
        );
        assert_eq!(*out.data, vec![3.0, 0.0, 4.0, 3.0]);
        let out = call1(
            "aten.scatter.src",
            &[&z, &idx, &x],
            &[v(0), Arg::Int(1), v(1), v(2)],
            &[],
        );
        assert_eq!(*out.data, vec![2.0, 0.0, 4.0, 3.0]);
        let out = call1(
            "aten.scatter.value",
            &[&z, &idx],
            &[v(0), Arg::Int(0), v(1), Arg::Float(7.0)],
            &[],
        );
        assert_eq!(*out.data, vec![7.0, 7.0, 7.0, 0.0]);
        let base = t(DType::F32, &[2, 2], &[10.0, -10.0, 0.0, 0.0]);
        let out = call1(
            "aten.scatter_reduce.two",
            &[&base, &idx, &x],
            &[v(0), Arg::Int(1), v(1), v(2), Arg::Str("amax".into())],
            &[("include_self", Arg::Bool(false))],
        );
        assert_eq!(*out.data, vec![2.0, -10.0, 4.0, 3.0]);
        let out = call1(
            "aten.scatter_reduce.two",
            &[&base, &idx, &x],
            &[v(0), Arg::Int(1), v(1), v(2), Arg::Str("mean".into())],
            &[],
        );
        assert_eq!(*out.data, vec![13.0 / 3.0, -10.0, 2.0, 1.5]);
        let sel = long(&[3], &[1.0, 1.0, 0.0]);
        let out = call1(
            "aten.index_select.default",
            &[&x, &sel],
            &[v(0), Arg::Int(0), v(1)],
            &[],
        );
        assert_eq!(
            (out.shape(), out.data.to_vec()),
            (&[3usize, 2][..], vec![3.0, 4.0, 3.0, 4.0, 1.0, 2.0])
        );
        assert!(call(
            "aten.index_select.default",
            &[&x, &long(&[1], &[-1.0])],
            &[v(0), Arg::Int(0), v(1)],
            &[]
        )
        .is_err());
        let src = t(DType::F32, &[2, 3], &[1.0; 6]);
        let out = call1(
            "aten.index_add.default",
            &[&x, &sel, &src],
            &[v(0), Arg::Int(1), v(1), v(2)],
            &[("alpha", Arg::Int(2))],
        );
        assert_eq!(*out.data, vec![3.0, 6.0, 5.0, 8.0]);
        let out = call1(
            "aten.index_fill.int_Scalar",
            &[&x, &long(&[1], &[-1.0])],
            &[v(0), Arg::Int(1), v(1), Arg::Int(0)],
            &[],
        );
        assert_eq!(out.meta, Meta::new(DType::F32, vec![2, 2]));
        assert_eq!(*out.data, vec![1.0, 0.0, 3.0, 0.0]);
    }
}
