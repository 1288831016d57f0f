//! Elementwise operators: arithmetic, comparisons, unary math, with broadcasting.

use crate::util::{broadcast_shapes, map, result_dtype, scalar_result_dtype, zip_broadcast};
use crate::{Args, Meta, OpError, Registry};

/// Registers the elementwise family.
pub(crate) fn register(r: &mut Registry) {
    r.pure(
        "aten.add.Tensor",
        "add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",
        infer_binary,
        |a, m, _| {
            let alpha = a.float("alpha")?;
            Ok(vec![zip_broadcast(a.tensor("self")?, a.tensor("other")?, &m[0], |x, y| x + alpha * y)])
        },
    );
    r.pure(
        "aten.mul.Tensor",
        "mul.Tensor(Tensor self, Tensor other) -> Tensor",
        infer_binary,
        |a, m, _| Ok(vec![zip_broadcast(a.tensor("self")?, a.tensor("other")?, &m[0], |x, y| x * y)]),
    );
    r.pure(
        "aten.mul.Scalar",
        "mul.Scalar(Tensor self, Scalar other) -> Tensor",
        infer_scalar_binary,
        |a, m, _| {
            let s = a.float("other")?;
            Ok(vec![map(a.tensor("self")?, &m[0], |x| x * s)])
        },
    );
    r.pure("aten.neg.default", "neg(Tensor self) -> Tensor", infer_same, |a, m, _| {
        Ok(vec![map(a.tensor("self")?, &m[0], |x| -x)])
    });
}

/// Output meta of a broadcasting binary op between two tensors.
pub(crate) fn infer_binary(a: &Args) -> Result<Vec<Meta>, OpError> {
    let (x, y) = (a.meta("self")?, a.meta("other")?);
    Ok(vec![Meta::new(result_dtype(&x, &y), broadcast_shapes(&x.shape, &y.shape)?)])
}

/// Output meta of a tensor-scalar op (`other` is the scalar).
pub(crate) fn infer_scalar_binary(a: &Args) -> Result<Vec<Meta>, OpError> {
    let x = a.meta("self")?;
    Ok(vec![Meta::new(scalar_result_dtype(x.dtype, a.scalar_is_float("other")), x.shape)])
}

/// Output meta equal to the input's.
pub(crate) fn infer_same(a: &Args) -> Result<Vec<Meta>, OpError> {
    Ok(vec![a.meta("self")?])
}

