//! Shared helpers for kernels: dim normalization, broadcasting, index iteration.

use crate::tensor::{strides, Meta, Tensor};
use crate::OpError;
use shardproof_ir::DType;

/// Normalizes a possibly negative dim for a tensor of `rank` dims (rank 0 accepts -1 and 0).
pub fn norm_dim(dim: i64, rank: usize) -> Result<usize, OpError> {
    let r = rank.max(1) as i64;
    let d = if dim < 0 { dim + r } else { dim };
    if d < 0 || d >= r {
        return Err(OpError::new(format!(
            "dim {dim} out of range for a tensor of {rank} dims"
        )));
    }
    Ok(d as usize)
}

/// The broadcast shape of two shapes (numpy rules), or an error naming both.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Result<Vec<usize>, OpError> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let da = if i + a.len() >= n {
            a[i + a.len() - n]
        } else {
            1
        };
        let db = if i + b.len() >= n {
            b[i + b.len() - n]
        } else {
            1
        };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(OpError::new(format!(
                    "shapes {a:?} and {b:?} cannot be broadcast together"
                )))
            }
        };
    }
    Ok(out)
}

/// For each element of `out_shape` in row-major order, the flat index into a tensor of shape
/// `src` broadcast to `out_shape`.
pub fn broadcast_indices(src: &[usize], out_shape: &[usize]) -> Vec<usize> {
    let n: usize = out_shape.iter().product();
    let offset = out_shape.len() - src.len();
    let src_strides = strides(src);
    // Stride 0 on broadcast dims, the source stride elsewhere.
    let eff: Vec<usize> = (0..out_shape.len())
        .map(|i| {
            if i < offset || src[i - offset] == 1 {
                0
            } else {
                src_strides[i - offset]
            }
        })
        .collect();
    let mut idx = vec![0usize; out_shape.len()];
    let mut out = Vec::with_capacity(n);
    let mut flat = 0usize;
    for _ in 0..n {
        out.push(flat);
        for d in (0..out_shape.len()).rev() {
            idx[d] += 1;
            flat += eff[d];
            if idx[d] < out_shape[d] {
                break;
            }
            flat -= eff[d] * idx[d];
            idx[d] = 0;
        }
    }
    out
}

/// Materializes `t` broadcast to `shape`.
pub fn broadcast_to(t: &Tensor, shape: &[usize]) -> Vec<f64> {
    if t.shape() == shape {
        return t.data.as_ref().clone();
    }
    broadcast_indices(t.shape(), shape)
        .into_iter()
        .map(|i| t.data[i])
        .collect()
}

/// Applies `f` elementwise to two broadcast tensors, producing data for `out`.
pub fn zip_broadcast(a: &Tensor, b: &Tensor, out: &Meta, f: impl Fn(f64, f64) -> f64) -> Tensor {
    let data = if a.shape() == out.shape.as_slice() && b.shape() == out.shape.as_slice() {
        a.data
            .iter()
            .zip(b.data.iter())
            .map(|(&x, &y)| f(x, y))
            .collect()
    } else {
        let ia = broadcast_indices(a.shape(), &out.shape);
        let ib = broadcast_indices(b.shape(), &out.shape);
        ia.into_iter()
            .zip(ib)
            .map(|(i, j)| f(a.data[i], b.data[j]))
            .collect()
    };
    Tensor::new(out.clone(), data)
}

/// Applies `f` to every element of `t`, producing a tensor of meta `out`.
pub fn map(t: &Tensor, out: &Meta, f: impl Fn(f64) -> f64) -> Tensor {
    Tensor::new(out.clone(), t.data.iter().map(|&x| f(x)).collect())
}

/// Splits `shape` around `dim` into (outer, size, inner) element counts, for kernels that work
/// along one dim of a row-major tensor.
pub fn outer_dim_inner(shape: &[usize], dim: usize) -> (usize, usize, usize) {
    let outer = shape[..dim].iter().product();
    let inner = shape[dim + 1..].iter().product();
    (outer, shape[dim], inner)
}

/// The result dtype of arithmetic between two tensors, with torch's rule that a 0-d tensor
/// does not raise the category-internal width of a dimensioned operand.
pub fn result_dtype(a: &Meta, b: &Meta) -> DType {
    let cat = |d: DType| {
        if d.is_float() {
            2
        } else if d.is_int() {
            1
        } else {
            0
        }
    };
    match (a.rank() == 0, b.rank() == 0) {
        (true, false) if cat(a.dtype) <= cat(b.dtype) => b.dtype,
        (false, true) if cat(b.dtype) <= cat(a.dtype) => a.dtype,
        _ => a.dtype.promote(b.dtype),
    }
}

/// The result dtype of arithmetic between a tensor and a Python scalar.
pub fn scalar_result_dtype(t: DType, scalar_is_float: bool) -> DType {
    if scalar_is_float && !t.is_float() {
        DType::F32
    } else if t == DType::Bool && !scalar_is_float {
        DType::I64
    } else {
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting() {
        assert_eq!(broadcast_shapes(&[3, 1], &[4]).unwrap(), vec![3, 4]);
        assert!(broadcast_shapes(&[3], &[4]).is_err());
        assert_eq!(broadcast_indices(&[3, 1], &[3, 2]), vec![0, 0, 1, 1, 2, 2]);
        assert_eq!(broadcast_indices(&[2], &[2, 2]), vec![0, 1, 0, 1]);
        assert_eq!(broadcast_indices(&[], &[3]), vec![0, 0, 0]);
    }

    #[test]
    fn dims() {
        assert_eq!(norm_dim(-1, 3).unwrap(), 2);
        assert!(norm_dim(3, 3).is_err());
        assert_eq!(norm_dim(-1, 0).unwrap(), 0);
    }
}
