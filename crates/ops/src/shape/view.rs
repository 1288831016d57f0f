//! Views that keep the element order (`view`/`reshape`, `squeeze`/`unsqueeze`,
//! `flatten`/`unflatten`), identities and copies, dtype conversions, `_assert_tensor_metadata`.

use super::strided::infer_size;
use crate::tensor::cast_value;
use crate::util::{broadcast_shapes, broadcast_to, norm_dim};
use crate::{Args, Meta, OpError, Tensor};

pub(super) fn infer_view(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let name = if a.schema().index_of("size").is_some() {
        "size"
    } else {
        "shape"
    };
    let shape = infer_size(&a.int_list(name)?, m.numel())?;
    Ok(vec![Meta::new(m.dtype, shape)])
}

pub(super) fn infer_squeeze(a: &Args) -> Result<Vec<Meta>, OpError> {
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

pub(super) fn infer_unsqueeze(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let d = norm_dim(a.int("dim")?, m.rank() + 1)?;
    let mut shape = m.shape.clone();
    shape.insert(d, 1);
    Ok(vec![Meta::new(m.dtype, shape)])
}

pub(super) fn infer_flatten(a: &Args) -> Result<Vec<Meta>, OpError> {
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

pub(super) fn infer_unflatten(a: &Args) -> Result<Vec<Meta>, OpError> {
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
pub(super) fn eval_reshape(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    Ok(vec![a.tensor("self")?.reshaped(m[0].shape.clone())])
}

pub(super) fn infer_identity(a: &Args) -> Result<Vec<Meta>, OpError> {
    Ok(vec![a.meta("self")?])
}

pub(super) fn eval_identity(a: &Args, _: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    Ok(vec![a.tensor("self")?.clone()])
}

pub(super) fn infer_to_copy(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    Ok(vec![Meta::new(
        a.dtype("dtype")?.unwrap_or(m.dtype),
        m.shape,
    )])
}

pub(super) fn eval_cast(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    Ok(vec![if t.dtype() == m[0].dtype {
        t.clone()
    } else {
        t.cast(m[0].dtype)
    }])
}

pub(super) fn infer_copy(a: &Args) -> Result<Vec<Meta>, OpError> {
    let (x, src) = (a.meta("self")?, a.meta("src")?);
    if broadcast_shapes(&x.shape, &src.shape)? != x.shape {
        return Err(OpError::new(format!(
            "copy: source of shape {:?} cannot be broadcast to {:?}",
            src.shape, x.shape
        )));
    }
    Ok(vec![x])
}

pub(super) fn eval_copy(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    let src = a.tensor("src")?;
    let data = broadcast_to(src, &m[0].shape);
    let d = m[0].dtype;
    Ok(vec![Tensor::new(
        m[0].clone(),
        data.into_iter().map(|x| cast_value(x, d)).collect(),
    )])
}

/// `_assert_tensor_metadata`, which torch.export puts before `to`: the tensor must have the
/// recorded dtype and size. Strides and devices are not checked (shardproof's tensors are dense
/// and have none), nor is the layout beyond being strided (the only one shardproof has).
pub(super) fn infer_assert_tensor_metadata(a: &Args) -> Result<Vec<Meta>, OpError> {
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
