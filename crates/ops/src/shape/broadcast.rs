//! Broadcasting and tiling: `expand`, `repeat`, `broadcast_tensors`.

use super::concat::list_metas;
use super::strided::{istrides, strided_read, usize_of};
use crate::util::{broadcast_shapes, broadcast_to};
use crate::{Args, Meta, OpError, Tensor};

pub(super) fn infer_expand(a: &Args) -> Result<Vec<Meta>, OpError> {
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

pub(super) fn eval_expand(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    Ok(vec![Tensor::new(
        m[0].clone(),
        broadcast_to(a.tensor("self")?, &m[0].shape),
    )])
}

pub(super) fn infer_repeat(a: &Args) -> Result<Vec<Meta>, OpError> {
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

pub(super) fn eval_repeat(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
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

/// `broadcast_tensors`: every tensor expanded to the common broadcast shape.
pub(super) fn infer_broadcast_tensors(a: &Args) -> Result<Vec<Meta>, OpError> {
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

pub(super) fn eval_broadcast_tensors(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
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
