//! Symbolic tensors: a shape, a dtype and one hash-consed expression per element (row-major).

use crate::expr::ExprId;
use shardproof_ir::DType;
use std::sync::Arc;

/// A tensor whose elements are expressions.
#[derive(Clone, Debug, PartialEq)]
pub struct SymTensor {
    /// The element type of the concrete tensor it stands for.
    pub dtype: DType,
    /// The shape, outermost first.
    pub shape: Vec<usize>,
    /// The elements, row-major (shared: data movement copies no expression).
    pub elems: Arc<Vec<ExprId>>,
}

impl SymTensor {
    /// A tensor from its parts; `elems` must hold the product of `shape` elements.
    pub fn new(dtype: DType, shape: Vec<usize>, elems: Vec<ExprId>) -> Self {
        debug_assert_eq!(shape.iter().product::<usize>(), elems.len());
        SymTensor {
            dtype,
            shape,
            elems: Arc::new(elems),
        }
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.elems.len()
    }
}

/// Row-major strides of `shape`.
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// For every element of a tensor of shape `out`, the element of a tensor of shape `input`
/// that broadcasting reads (numpy rules: trailing dims aligned, size-1 dims repeated).
pub fn broadcast_index(input: &[usize], out: &[usize]) -> Vec<usize> {
    let n: usize = out.iter().product();
    let offset = out.len() - input.len().min(out.len());
    let in_strides = strides(input);
    let mut idx = vec![0usize; out.len()];
    let mut result = Vec::with_capacity(n);
    for _ in 0..n {
        let mut flat = 0;
        for (id, &i) in idx[offset..].iter().enumerate() {
            if input[id] != 1 {
                flat += i * in_strides[id];
            }
        }
        result.push(flat);
        for d in (0..out.len()).rev() {
            idx[d] += 1;
            if idx[d] < out[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    result
}

/// Reduction of a tensor of shape `shape` over `dims` (all dims when empty and `all` is
/// set): the output shape, and per output element the input elements it reduces, in order.
pub fn reduce_groups(
    shape: &[usize],
    dims: &[usize],
    keepdim: bool,
) -> (Vec<usize>, Vec<Vec<usize>>) {
    let reduced = |d: usize| dims.contains(&d);
    let kept: Vec<usize> = (0..shape.len()).filter(|&d| !reduced(d)).collect();
    let out_shape: Vec<usize> = if keepdim {
        (0..shape.len())
            .map(|d| if reduced(d) { 1 } else { shape[d] })
            .collect()
    } else {
        kept.iter().map(|&d| shape[d]).collect()
    };
    let kept_shape: Vec<usize> = kept.iter().map(|&d| shape[d]).collect();
    let kept_strides = strides(&kept_shape);
    let n_out: usize = kept_shape.iter().product();
    let mut groups = vec![Vec::new(); n_out];
    let in_strides = strides(shape);
    let total: usize = shape.iter().product();
    for flat in 0..total {
        let mut out = 0;
        for (k, &d) in kept.iter().enumerate() {
            out += (flat / in_strides[d]) % shape[d] * kept_strides[k];
        }
        groups[out].push(flat);
    }
    (out_shape, groups)
}

/// Normalizes a possibly negative dim against a rank.
pub fn norm_dim(d: i64, rank: usize) -> Option<usize> {
    let r = rank.max(1) as i64;
    let d = if d < 0 { d + r } else { d };
    (0..r).contains(&d).then_some(d as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting_repeats_size_one_dims() {
        assert_eq!(broadcast_index(&[3], &[2, 3]), vec![0, 1, 2, 0, 1, 2]);
        assert_eq!(broadcast_index(&[2, 1], &[2, 3]), vec![0, 0, 0, 1, 1, 1]);
        assert_eq!(broadcast_index(&[], &[2]), vec![0, 0]);
    }

    #[test]
    fn reductions_group_elements() {
        let (shape, groups) = reduce_groups(&[2, 3], &[1], false);
        assert_eq!(shape, vec![2]);
        assert_eq!(groups, vec![vec![0, 1, 2], vec![3, 4, 5]]);
        let (shape, groups) = reduce_groups(&[2, 3], &[0], true);
        assert_eq!(shape, vec![1, 3]);
        assert_eq!(groups, vec![vec![0, 3], vec![1, 4], vec![2, 5]]);
        let (shape, groups) = reduce_groups(&[2, 2], &[0, 1], false);
        assert!(shape.is_empty());
        assert_eq!(groups, vec![vec![0, 1, 2, 3]]);
    }
}
