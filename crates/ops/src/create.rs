//! Factories: `arange`, `linspace`, `eye`, `zeros`/`ones`/`full`/`empty` and their `new_*` and
//! `*_like` forms, `scalar_tensor`.
//!
//! Layout, device, pin-memory and memory-format arguments are accepted and ignored: tensors here
//! are dense and row-major, on no device.
//!
//! `empty*` tensors are filled with a sentinel so that reading uninitialized memory shows in the
//! results: NaN for float dtypes, the most negative value for signed integers, 255 for uint8 and
//! `true` for bool ([`uninit_value`]).

use crate::tensor::cast_value;
use crate::{Args, Meta, OpError, Registry, Tensor};
use shardproof_ir::{Arg, DType};

/// The sentinel value of uninitialized (`empty`) memory of `dtype`.
pub fn uninit_value(dtype: DType) -> f64 {
    match dtype {
        d if d.is_float() => f64::NAN,
        DType::U8 => 255.0,
        DType::Bool => 1.0,
        d => -(2f64.powi(d.size_bytes() as i32 * 8 - 1)),
    }
}

/// The `size` argument as a shape.
pub(crate) fn size_arg(a: &Args) -> Result<Vec<usize>, OpError> {
    a.int_list("size")?
        .into_iter()
        .map(|s| {
            usize::try_from(s).map_err(|_| {
                OpError::new(format!(
                    "{}: trying to create a tensor with negative dimension {s}",
                    a.schema().name
                ))
            })
        })
        .collect()
}

/// The dtype a factory produces: its `dtype` argument, else `default`.
fn dtype_or(a: &Args, default: DType) -> Result<DType, OpError> {
    Ok(a.dtype("dtype")?.unwrap_or(default))
}

/// The dtype torch infers for a fill value: bool, i64 or the default float dtype.
fn scalar_dtype(a: &Args, name: &str) -> DType {
    match a.get(name) {
        Some(Arg::Bool(_)) => DType::Bool,
        Some(Arg::Int(_)) => DType::I64,
        _ => DType::F32,
    }
}

/// Output meta of `zeros`/`ones`/`empty` (default f32) and `full` (dtype from the value).
fn infer_factory(a: &Args) -> Result<Vec<Meta>, OpError> {
    let default = if a.schema().index_of("fill_value").is_some() {
        scalar_dtype(a, "fill_value")
    } else {
        DType::F32
    };
    Ok(vec![Meta::new(dtype_or(a, default)?, size_arg(a)?)])
}

/// Output meta of `new_*`: the given size, `self`'s dtype by default.
fn infer_new(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    Ok(vec![Meta::new(dtype_or(a, m.dtype)?, size_arg(a)?)])
}

/// Output meta of `*_like`: `self`'s shape and, by default, dtype.
fn infer_like(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    Ok(vec![Meta::new(dtype_or(a, m.dtype)?, m.shape)])
}

/// A tensor of the inferred meta filled with `v` converted to its dtype.
fn filled(m: &Meta, v: f64) -> Vec<Tensor> {
    vec![Tensor::full(
        m.dtype,
        m.shape.clone(),
        cast_value(v, m.dtype),
    )]
}

/// Checks the strides of `empty_strided`-like factories (values are irrelevant to a dense
/// result, but torch rejects negative ones and a count that differs from the sizes').
fn check_strides(a: &Args) -> Result<(), OpError> {
    let st = a.int_list("stride")?;
    let n = a.int_list("size")?.len();
    if st.len() != n || st.iter().any(|&s| s < 0) {
        return Err(OpError::new(format!(
            "{}: expected {n} non-negative strides, got {st:?}",
            a.schema().name
        )));
    }
    Ok(())
}

/// `start`, `end` and `step` of an `arange` overload.
fn arange_bounds(a: &Args) -> Result<(Arg, Arg, Arg), OpError> {
    let s = a.schema();
    let get = |n: &str| {
        a.get(n)
            .ok_or_else(|| OpError::new(format!("arange: missing `{n}`")))
    };
    let start = if s.index_of("start").is_some() {
        get("start")?
    } else {
        Arg::Int(0)
    };
    let step = if s.index_of("step").is_some() {
        get("step")?
    } else {
        Arg::Int(1)
    };
    Ok((start, get("end")?, step))
}

/// The dtype and values of an `arange` call, computed as torch's CPU kernel does (integer
/// dtypes truncate the bounds first; int64 counts with integer arithmetic).
fn arange_values(a: &Args) -> Result<(DType, Vec<f64>), OpError> {
    let (dtype, n, xs, xst) = arange_count(a)?;
    let data = (0..n)
        .map(|i| cast_value(xs + xst * i as f64, dtype))
        .collect();
    Ok((dtype, data))
}

/// The dtype, element count, start and step of an `arange` call (without building its values,
/// so that shape inference never allocates).
fn arange_count(a: &Args) -> Result<(DType, usize, f64, f64), OpError> {
    let (start, end, step) = arange_bounds(a)?;
    let num = |x: &Arg| {
        x.as_f64()
            .ok_or_else(|| OpError::new(format!("arange: expected a number, got {x:?}")))
    };
    let (s, e, st) = (num(&start)?, num(&end)?, num(&step)?);
    let any_float = [&start, &end, &step]
        .iter()
        .any(|x| matches!(x, Arg::Float(_)));
    let dtype = dtype_or(a, if any_float { DType::F32 } else { DType::I64 })?;
    if dtype == DType::Bool {
        return Err(OpError::new("arange is not implemented for bool"));
    }
    let int = !dtype.is_float();
    let (xs, xe, xst) = if int {
        (s.trunc(), e.trunc(), st.trunc())
    } else {
        (s, e, st)
    };
    if xst == 0.0 || xst.is_nan() {
        return Err(OpError::new("arange: step must be nonzero"));
    }
    if !xs.is_finite() || !xe.is_finite() {
        return Err(OpError::new(format!(
            "arange: unsupported range: {xs} -> {xe}"
        )));
    }
    if !((xst > 0.0 && xe >= xs) || (xst < 0.0 && xe <= xs)) {
        return Err(OpError::new(
            "arange: upper bound and larger bound inconsistent with step sign",
        ));
    }
    let n = if dtype == DType::I64 {
        // i128: the bounds may be near the ends of i64.
        let (xs, xe, xst) = (xs as i64 as i128, xe as i64 as i128, xst as i64 as i128);
        let sgn = xst.signum();
        ((xe - xs + xst - sgn) / xst) as f64
    } else {
        ((e - s) / st).ceil()
    };
    if !(0.0..=(1u64 << 40) as f64).contains(&n) {
        return Err(OpError::new(format!(
            "arange: invalid number of elements {n}"
        )));
    }
    Ok((dtype, n as usize, xs, xst))
}

fn infer_arange(a: &Args) -> Result<Vec<Meta>, OpError> {
    let (d, n, _, _) = arange_count(a)?;
    Ok(vec![Meta::new(d, vec![n])])
}

/// `linspace` as torch's CPU kernel computes it: from both ends towards the middle.
fn linspace_values(a: &Args, dtype: DType) -> Result<Vec<f64>, OpError> {
    let (s, e) = (a.float("start")?, a.float("end")?);
    let steps = a.int("steps")?;
    if steps < 0 {
        return Err(OpError::new(
            "linspace: number of steps must be non-negative",
        ));
    }
    let n = steps as usize;
    if n == 1 {
        return Ok(vec![cast_value(s, dtype)]);
    }
    let step = (e - s) / (steps - 1) as f64;
    let half = n / 2;
    Ok((0..n)
        .map(|i| {
            let v = if i < half {
                s + step * i as f64
            } else {
                e - step * (n - i - 1) as f64
            };
            cast_value(v, dtype)
        })
        .collect())
}

fn infer_linspace(a: &Args) -> Result<Vec<Meta>, OpError> {
    let steps = a.int("steps")?;
    if steps < 0 {
        return Err(OpError::new(
            "linspace: number of steps must be non-negative",
        ));
    }
    Ok(vec![Meta::new(
        dtype_or(a, DType::F32)?,
        vec![steps as usize],
    )])
}

fn infer_eye(a: &Args) -> Result<Vec<Meta>, OpError> {
    let n = a.int("n")?;
    let m = if a.schema().index_of("m").is_some() {
        a.int("m")?
    } else {
        n
    };
    if n < 0 || m < 0 {
        return Err(OpError::new(format!(
            "eye: n and m must be non-negative, got {n} and {m}"
        )));
    }
    Ok(vec![Meta::new(
        dtype_or(a, DType::F32)?,
        vec![n as usize, m as usize],
    )])
}

const FACTORY_KW: &str =
    "ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None";

/// Registers the factory family.
pub(crate) fn register(r: &mut Registry) {
    let reg = |r: &mut Registry,
               name: &str,
               head: &str,
               tail: &str,
               infer: crate::InferFn,
               eval: crate::EvalFn| {
        r.pure(
            name,
            &format!("{head}, *, {FACTORY_KW}{tail}) -> Tensor"),
            infer,
            eval,
        );
    };
    reg(
        r,
        "aten.arange.default",
        "arange(Scalar end",
        "",
        infer_arange,
        |a, m, _| Ok(vec![Tensor::new(m[0].clone(), arange_values(a)?.1)]),
    );
    reg(
        r,
        "aten.arange.start",
        "arange.start(Scalar start, Scalar end",
        "",
        infer_arange,
        |a, m, _| Ok(vec![Tensor::new(m[0].clone(), arange_values(a)?.1)]),
    );
    reg(
        r,
        "aten.arange.start_step",
        "arange.start_step(Scalar start, Scalar end, Scalar step=1",
        "",
        infer_arange,
        |a, m, _| Ok(vec![Tensor::new(m[0].clone(), arange_values(a)?.1)]),
    );
    reg(
        r,
        "aten.linspace.default",
        "linspace(Scalar start, Scalar end, int steps",
        "",
        infer_linspace,
        |a, m, _| {
            Ok(vec![Tensor::new(
                m[0].clone(),
                linspace_values(a, m[0].dtype)?,
            )])
        },
    );
    let eye: crate::EvalFn = |_, m, _| {
        let (n, k) = (m[0].shape[0], m[0].shape[1]);
        let data = (0..n * k).map(|i| (i / k == i % k) as i64 as f64).collect();
        Ok(vec![Tensor::new(m[0].clone(), data)])
    };
    reg(r, "aten.eye.default", "eye(SymInt n", "", infer_eye, eye);
    reg(
        r,
        "aten.eye.m",
        "eye.m(SymInt n, SymInt m",
        "",
        infer_eye,
        eye,
    );
    reg(
        r,
        "aten.zeros.default",
        "zeros(SymInt[] size",
        "",
        infer_factory,
        |_, m, _| Ok(filled(&m[0], 0.0)),
    );
    reg(
        r,
        "aten.ones.default",
        "ones(SymInt[] size",
        "",
        infer_factory,
        |_, m, _| Ok(filled(&m[0], 1.0)),
    );
    reg(
        r,
        "aten.full.default",
        "full(SymInt[] size, Scalar fill_value",
        "",
        infer_factory,
        |a, m, _| Ok(filled(&m[0], a.float("fill_value")?)),
    );
    reg(
        r,
        "aten.empty.memory_format",
        "empty.memory_format(SymInt[] size",
        ", MemoryFormat? memory_format=None",
        infer_factory,
        |_, m, _| Ok(filled(&m[0], uninit_value(m[0].dtype))),
    );
    reg(
        r,
        "aten.empty_strided.default",
        "empty_strided(SymInt[] size, SymInt[] stride",
        "",
        |a| {
            check_strides(a)?;
            infer_factory(a)
        },
        |_, m, _| Ok(filled(&m[0], uninit_value(m[0].dtype))),
    );
    reg(
        r,
        "aten.scalar_tensor.default",
        "scalar_tensor(Scalar s",
        "",
        |a| Ok(vec![Meta::new(dtype_or(a, DType::F32)?, vec![])]),
        |a, m, _| Ok(filled(&m[0], a.float("s")?)),
    );
    reg(
        r,
        "aten.new_zeros.default",
        "new_zeros(Tensor self, SymInt[] size",
        "",
        infer_new,
        |_, m, _| Ok(filled(&m[0], 0.0)),
    );
    reg(
        r,
        "aten.new_ones.default",
        "new_ones(Tensor self, SymInt[] size",
        "",
        infer_new,
        |_, m, _| Ok(filled(&m[0], 1.0)),
    );
    reg(
        r,
        "aten.new_full.default",
        "new_full(Tensor self, SymInt[] size, Scalar fill_value",
        "",
        infer_new,
        |a, m, _| Ok(filled(&m[0], a.float("fill_value")?)),
    );
    reg(
        r,
        "aten.new_empty.default",
        "new_empty(Tensor self, SymInt[] size",
        "",
        infer_new,
        |_, m, _| Ok(filled(&m[0], uninit_value(m[0].dtype))),
    );
    reg(
        r,
        "aten.new_empty_strided.default",
        "new_empty_strided(Tensor self, SymInt[] size, SymInt[] stride",
        "",
        |a| {
            check_strides(a)?;
            infer_new(a)
        },
        |_, m, _| Ok(filled(&m[0], uninit_value(m[0].dtype))),
    );
    let mf = ", MemoryFormat? memory_format=None";
    reg(
        r,
        "aten.zeros_like.default",
        "zeros_like(Tensor self",
        mf,
        infer_like,
        |_, m, _| Ok(filled(&m[0], 0.0)),
    );
    reg(
        r,
        "aten.ones_like.default",
        "ones_like(Tensor self",
        mf,
        infer_like,
        |_, m, _| Ok(filled(&m[0], 1.0)),
    );
    reg(
        r,
        "aten.empty_like.default",
        "empty_like(Tensor self",
        mf,
        infer_like,
        |_, m, _| Ok(filled(&m[0], uninit_value(m[0].dtype))),
    );
    reg(
        r,
        "aten.full_like.default",
        "full_like(Tensor self, Scalar fill_value",
        mf,
        infer_like,
        |a, m, _| Ok(filled(&m[0], a.float("fill_value")?)),
    );
    r.pure(
        "aten.zero.default",
        "zero(Tensor self) -> Tensor",
        infer_like_plain,
        |_, m, _| Ok(filled(&m[0], 0.0)),
    );
}

/// Output meta equal to `self`'s (for `zero`, which has no `dtype` argument).
fn infer_like_plain(a: &Args) -> Result<Vec<Meta>, OpError> {
    Ok(vec![a.meta("self")?])
}

#[cfg(test)]
mod tests {
    use crate::testing::{call, call1, ints, t, v};
    use crate::Meta;
    use shardproof_ir::{Arg, DType};

    #[test]
    fn arange_infers_dtype_and_length() {
        let out = call1("aten.arange.start", &[], &[Arg::Int(0), Arg::Int(5)], &[]);
        assert_eq!(
            (out.dtype(), out.data.to_vec()),
            (DType::I64, vec![0.0, 1.0, 2.0, 3.0, 4.0])
        );
        let out = call1("aten.arange.default", &[], &[Arg::Float(2.5)], &[]);
        assert_eq!(
            (out.dtype(), out.data.to_vec()),
            (DType::F32, vec![0.0, 1.0, 2.0])
        );
        let out = call1(
            "aten.arange.start_step",
            &[],
            &[Arg::Int(10), Arg::Int(0), Arg::Int(-3)],
            &[],
        );
        assert_eq!(*out.data, vec![10.0, 7.0, 4.0, 1.0]);
        let out = call1(
            "aten.arange.start_step",
            &[],
            &[Arg::Float(0.0), Arg::Float(1.0), Arg::Float(0.25)],
            &[],
        );
        assert_eq!(*out.data, vec![0.0, 0.25, 0.5, 0.75]);
        let out = call1(
            "aten.arange.default",
            &[],
            &[Arg::Float(2.5)],
            &[("dtype", Arg::Dtype(DType::I64))],
        );
        assert_eq!(*out.data, vec![0.0, 1.0]);
        let out = call1(
            "aten.arange.default",
            &[],
            &[Arg::Float(2.5)],
            &[("dtype", Arg::Dtype(DType::I32))],
        );
        assert_eq!(*out.data, vec![0.0, 1.0, 2.0]);
        assert!(call(
            "aten.arange.start_step",
            &[],
            &[Arg::Int(0), Arg::Int(5), Arg::Int(0)],
            &[]
        )
        .is_err());
        assert!(call(
            "aten.arange.start_step",
            &[],
            &[Arg::Int(0), Arg::Int(5), Arg::Int(-1)],
            &[]
        )
        .is_err());
        let out = call1(
            "aten.linspace.default",
            &[],
            &[Arg::Int(0), Arg::Int(1), Arg::Int(5)],
            &[],
        );
        assert_eq!(*out.data, vec![0.0, 0.25, 0.5, 0.75, 1.0]);
        let out = call1("aten.eye.m", &[], &[Arg::Int(2), Arg::Int(3)], &[]);
        assert_eq!(*out.data, vec![1.0, 0.0, 0.0, 0.0, 1.0, 0.0]);
    }

    #[test]
    fn fills_and_likes() {
        let out = call1("aten.zeros.default", &[], &[ints(&[2, 3])], &[]);
        assert_eq!(out.meta, Meta::new(DType::F32, vec![2, 3]));
        let out = call1("aten.full.default", &[], &[ints(&[2]), Arg::Int(7)], &[]);
        assert_eq!(
            (out.dtype(), out.data.to_vec()),
            (DType::I64, vec![7.0, 7.0])
        );
        let out = call1(
            "aten.full.default",
            &[],
            &[ints(&[1]), Arg::Bool(true)],
            &[],
        );
        assert_eq!(out.dtype(), DType::Bool);
        let out = call1(
            "aten.full.default",
            &[],
            &[ints(&[1]), Arg::Float(2.7)],
            &[("dtype", Arg::Dtype(DType::I32))],
        );
        assert_eq!(*out.data, vec![2.0]);
        assert!(call("aten.zeros.default", &[], &[ints(&[-1])], &[]).is_err());
        let out = call1(
            "aten.empty.memory_format",
            &[],
            &[ints(&[2])],
            &[("dtype", Arg::Dtype(DType::F16))],
        );
        assert!(out.data.iter().all(|x| x.is_nan()));
        let out = call1(
            "aten.empty.memory_format",
            &[],
            &[ints(&[1])],
            &[("dtype", Arg::Dtype(DType::I32))],
        );
        assert_eq!(out.data[0], i32::MIN as f64);
        let x = t(DType::I32, &[2, 2], &[0.0; 4]);
        let out = call1("aten.ones_like.default", &[&x], &[v(0)], &[]);
        assert_eq!(
            (out.meta.clone(), out.data.to_vec()),
            (Meta::new(DType::I32, vec![2, 2]), vec![1.0; 4])
        );
        let out = call1(
            "aten.new_full.default",
            &[&x],
            &[v(0), ints(&[3]), Arg::Float(1.5)],
            &[],
        );
        assert_eq!((out.dtype(), out.data.to_vec()), (DType::I32, vec![1.0; 3]));
        let out = call1(
            "aten.new_empty_strided.default",
            &[&x],
            &[v(0), ints(&[2, 3]), ints(&[3, 1])],
            &[("dtype", Arg::Dtype(DType::F32))],
        );
        assert_eq!(out.meta, Meta::new(DType::F32, vec![2, 3]));
        let out = call1(
            "aten.full_like.default",
            &[&x],
            &[v(0), Arg::Int(3)],
            &[("dtype", Arg::Dtype(DType::F64))],
        );
        assert_eq!((out.dtype(), out.data[0]), (DType::F64, 3.0));
        let out = call1("aten.scalar_tensor.default", &[], &[Arg::Int(3)], &[]);
        assert_eq!(
            (out.meta.clone(), out.data[0]),
            (Meta::new(DType::F32, vec![]), 3.0)
        );
    }
}
