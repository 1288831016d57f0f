//! Helpers shared by the unit tests of the operator families.

use crate::{Meta, OpError, Registry, Tensor};
use shardproof_ir::{Arg, DType, ValueId};

/// A tensor from a dtype, a shape and values.
pub(crate) fn t(dtype: DType, shape: &[usize], data: &[f64]) -> Tensor {
    Tensor::new(Meta::new(dtype, shape.to_vec()), data.to_vec())
}

/// An f32 tensor of the given shape holding `0, 1, 2, ...`.
pub(crate) fn ar(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    t(
        DType::F32,
        shape,
        &(0..n).map(|i| i as f64).collect::<Vec<_>>(),
    )
}

/// The i-th tensor of a call.
pub(crate) fn v(i: usize) -> Arg {
    Arg::Value(ValueId::new(i, 0))
}

/// A list of ints argument.
pub(crate) fn ints(xs: &[i64]) -> Arg {
    Arg::List(xs.iter().map(|&x| Arg::Int(x)).collect())
}

/// Calls a built-in op.
pub(crate) fn call(
    op: &str,
    tensors: &[&Tensor],
    args: &[Arg],
    kwargs: &[(&str, Arg)],
) -> Result<Vec<Tensor>, OpError> {
    let kw: Vec<(String, Arg)> = kwargs
        .iter()
        .map(|(k, a)| (k.to_string(), a.clone()))
        .collect();
    let owned: Vec<Tensor> = tensors.iter().map(|t| (*t).clone()).collect();
    Registry::builtin().call(op, &owned, args, &kw)
}

/// Calls a built-in op with one output.
pub(crate) fn call1(op: &str, tensors: &[&Tensor], args: &[Arg], kwargs: &[(&str, Arg)]) -> Tensor {
    let mut out = call(op, tensors, args, kwargs).unwrap();
    assert_eq!(out.len(), 1);
    out.remove(0)
}
