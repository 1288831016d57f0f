//! Unit tests of the element-wise family: kernels, promotion and broadcasting against hand-computed values.

use super::*;
use crate::testing::{call, call1, t, v};

#[test]
fn promotion_follows_torch_tiers() {
    let i32v = t(DType::I32, &[2], &[1.0, 2.0]);
    let out = call1("aten.add.Tensor", &[&i32v], &[v(0), Arg::Float(2.5)], &[]);
    assert_eq!(out.dtype(), DType::F32);
    assert_eq!(*out.data, vec![3.5, 4.5]);
    let zero_i64 = t(DType::I64, &[], &[3.0]);
    let out = call1("aten.add.Tensor", &[&i32v, &zero_i64], &[v(0), v(1)], &[]);
    assert_eq!(out.dtype(), DType::I32);
    let zero_f64 = t(DType::F64, &[], &[0.5]);
    let out = call1("aten.mul.Tensor", &[&i32v, &zero_f64], &[v(0), v(1)], &[]);
    assert_eq!(out.dtype(), DType::F64);
    assert_eq!(*out.data, vec![0.5, 1.0]);
    let b = t(DType::Bool, &[2], &[1.0, 0.0]);
    let out = call1("aten.add.Tensor", &[&b, &b], &[v(0), v(1)], &[]);
    assert_eq!(
        (out.dtype(), out.data.to_vec()),
        (DType::Bool, vec![1.0, 0.0])
    );
    let out = call1("aten.add.Scalar", &[&b], &[v(0), Arg::Int(2)], &[]);
    assert_eq!(
        (out.dtype(), out.data.to_vec()),
        (DType::I64, vec![3.0, 2.0])
    );
    let out = call1("aten.mul.Tensor", &[&b], &[v(0), Arg::Bool(true)], &[]);
    assert_eq!(out.dtype(), DType::Bool);
    // i8 overflow wraps.
    let i8v = t(DType::I8, &[1], &[100.0]);
    let out = call1("aten.add.Tensor", &[&i8v, &i8v], &[v(0), v(1)], &[]);
    assert_eq!(*out.data, vec![-56.0]);
    // Integer alpha only for integer results; bool subtraction refused.
    assert!(call(
        "aten.add.Tensor",
        &[&i32v, &i32v],
        &[v(0), v(1)],
        &[("alpha", Arg::Float(0.5))]
    )
    .is_err());
    assert!(call("aten.sub.Tensor", &[&b, &b], &[v(0), v(1)], &[]).is_err());
}

#[test]
fn division_modes() {
    let x = t(DType::I64, &[4], &[-7.0, 7.0, -7.0, 6.0]);
    let y = t(DType::I64, &[4], &[2.0, -2.0, -2.0, 4.0]);
    let out = call1("aten.div.Tensor", &[&x, &y], &[v(0), v(1)], &[]);
    assert_eq!(
        (out.dtype(), out.data.to_vec()),
        (DType::F32, vec![-3.5, -3.5, 3.5, 1.5])
    );
    let floor = [("rounding_mode", Arg::Str("floor".into()))];
    let out = call1("aten.div.Tensor_mode", &[&x, &y], &[v(0), v(1)], &floor);
    assert_eq!(
        (out.dtype(), out.data.to_vec()),
        (DType::I64, vec![-4.0, -4.0, 3.0, 1.0])
    );
    let trunc = [("rounding_mode", Arg::Str("trunc".into()))];
    let out = call1("aten.div.Tensor_mode", &[&x, &y], &[v(0), v(1)], &trunc);
    assert_eq!(*out.data, vec![-3.0, -3.0, 3.0, 1.0]);
    let none = [("rounding_mode", Arg::None)];
    let out = call1("aten.div.Tensor_mode", &[&x, &y], &[v(0), v(1)], &none);
    assert_eq!(out.dtype(), DType::F32);
    let zero = t(DType::I64, &[1], &[0.0]);
    assert!(call("aten.div.Tensor_mode", &[&x, &zero], &[v(0), v(1)], &floor).is_err());
    assert!(call("aten.remainder.Tensor", &[&x, &zero], &[v(0), v(1)], &[]).is_err());
    let out = call1("aten.remainder.Tensor", &[&x, &y], &[v(0), v(1)], &[]);
    assert_eq!(*out.data, vec![1.0, -1.0, -1.0, 2.0]);
    let out = call1("aten.fmod.Tensor", &[&x, &y], &[v(0), v(1)], &[]);
    assert_eq!(*out.data, vec![-1.0, 1.0, -1.0, 2.0]);
    let f = t(DType::F64, &[2], &[1.0, -1.5]);
    let out = call1(
        "aten.floor_divide.Scalar",
        &[&f],
        &[v(0), Arg::Float(0.1)],
        &[],
    );
    assert_eq!(*out.data, vec![9.0, -15.0]);
    let out = call1("aten.remainder.Scalar", &[&f], &[v(0), Arg::Int(1)], &[]);
    assert_eq!(*out.data, vec![0.0, 0.5]);
}

#[test]
fn powers() {
    let x = t(DType::I64, &[3], &[2.0, -1.0, 3.0]);
    assert!(call("aten.pow.Tensor_Scalar", &[&x], &[v(0), Arg::Int(-1)], &[]).is_err());
    let out = call1("aten.pow.Tensor_Scalar", &[&x], &[v(0), Arg::Int(3)], &[]);
    assert_eq!(
        (out.dtype(), out.data.to_vec()),
        (DType::I64, vec![8.0, -1.0, 27.0])
    );
    let out = call1(
        "aten.pow.Tensor_Scalar",
        &[&x],
        &[v(0), Arg::Float(0.5)],
        &[],
    );
    assert_eq!(out.dtype(), DType::F32);
    let e = t(DType::I64, &[3], &[-1.0, -3.0, 2.0]);
    let out = call1("aten.pow.Tensor_Tensor", &[&x, &e], &[v(0), v(1)], &[]);
    assert_eq!(*out.data, vec![0.0, -1.0, 9.0]);
    let out = call1("aten.pow.Scalar", &[&x], &[Arg::Int(2), v(0)], &[]);
    assert_eq!(
        (out.dtype(), out.data.to_vec()),
        (DType::I64, vec![4.0, 0.0, 8.0])
    );
}

#[test]
fn comparisons_and_bitwise() {
    let x = t(DType::F16, &[2], &[0.25, 0.5]);
    let out = call1("aten.eq.Scalar", &[&x], &[v(0), Arg::Float(0.25)], &[]);
    assert_eq!(
        (out.dtype(), out.data.to_vec()),
        (DType::Bool, vec![1.0, 0.0])
    );
    let i = t(DType::I64, &[3], &[0.0, 1.0, 2.0]);
    let out = call1("aten.lt.Scalar", &[&i], &[v(0), Arg::Float(1.5)], &[]);
    assert_eq!(*out.data, vec![1.0, 1.0, 0.0]);
    let n = t(DType::F32, &[2], &[f64::NAN, 1.0]);
    let out = call1("aten.ne.Tensor", &[&n, &n], &[v(0), v(1)], &[]);
    assert_eq!(*out.data, vec![1.0, 0.0]);
    let b = t(DType::Bool, &[2], &[1.0, 0.0]);
    let out = call1("aten.bitwise_or.Tensor", &[&b, &b], &[v(0), v(1)], &[]);
    assert_eq!(
        (out.dtype(), out.data.to_vec()),
        (DType::Bool, vec![1.0, 0.0])
    );
    let out = call1("aten.bitwise_not.default", &[&i], &[v(0)], &[]);
    assert_eq!(*out.data, vec![-1.0, -2.0, -3.0]);
    let f = t(DType::F32, &[1], &[1.0]);
    assert!(call("aten.bitwise_and.Tensor", &[&f, &f], &[v(0), v(1)], &[]).is_err());
    // The Python operators `|`, `&`, `^` are the bitwise ops under other names.
    let j = t(DType::I64, &[3], &[5.0, -6.0, 3.0]);
    let out = call1("aten.__or__.Tensor", &[&i, &j], &[v(0), v(1)], &[]);
    assert_eq!(*out.data, vec![5.0, -5.0, 3.0]);
    let out = call1("aten.__and__.Scalar", &[&j], &[v(0), Arg::Int(6)], &[]);
    assert_eq!(*out.data, vec![4.0, 2.0, 2.0]);
    let out = call1("aten.__xor__.Scalar", &[&b], &[v(0), Arg::Bool(true)], &[]);
    assert_eq!(
        (out.dtype(), out.data.to_vec()),
        (DType::Bool, vec![0.0, 1.0])
    );
    assert!(call("aten.__or__.Tensor", &[&f, &f], &[v(0), v(1)], &[]).is_err());
}

#[test]
fn selection_ops() {
    let i = t(DType::I64, &[3], &[0.0, 1.0, 2.0]);
    let out = call1("aten.clamp.default", &[&i], &[v(0), Arg::Float(0.5)], &[]);
    assert_eq!(
        (out.dtype(), out.data.to_vec()),
        (DType::F32, vec![0.5, 1.0, 2.0])
    );
    let out = call1(
        "aten.clamp.default",
        &[&i],
        &[v(0), Arg::Int(2), Arg::Int(1)],
        &[],
    );
    assert_eq!(*out.data, vec![1.0, 1.0, 1.0]);
    assert!(call("aten.clamp.default", &[&i], &[v(0)], &[]).is_err());
    let x = t(DType::F32, &[3], &[f64::NAN, -3.0, 3.0]);
    let out = call1(
        "aten.clamp_min.default",
        &[&x],
        &[v(0), Arg::Float(-1.0)],
        &[],
    );
    assert!(out.data[0].is_nan());
    assert_eq!(&out.data[1..], &[-1.0, 3.0]);
    let c = t(DType::Bool, &[2, 1], &[1.0, 0.0]);
    let out = call1(
        "aten.where.ScalarOther",
        &[&c, &i],
        &[v(0), v(1), Arg::Float(9.0)],
        &[],
    );
    assert_eq!(out.meta, Meta::new(DType::F32, vec![2, 3]));
    assert_eq!(*out.data, vec![0.0, 1.0, 2.0, 9.0, 9.0, 9.0]);
    let out = call1(
        "aten.masked_fill.Scalar",
        &[&i, &c],
        &[v(0), v(1), Arg::Int(-1)],
        &[],
    );
    assert_eq!(out.meta, Meta::new(DType::I64, vec![2, 3]));
    assert_eq!(*out.data, vec![-1.0, -1.0, -1.0, 0.0, 1.0, 2.0]);
    assert!(call("aten.where.self", &[&i, &i, &i], &[v(0), v(1), v(2)], &[]).is_err());
}

#[test]
fn unary_math() {
    let x = t(DType::F64, &[4], &[0.5, 1.0, 2.5, -0.3]);
    let out = call1("aten.erf.default", &[&x], &[v(0)], &[]);
    let want = [
        0.5204998778130465,
        0.8427007929497149,
        0.999593047982555,
        -0.3286267594591274,
    ];
    for (g, w) in out.data.iter().zip(want) {
        assert!((g - w).abs() < 1e-14, "{g} vs {w}");
    }
    let out = call1(
        "aten.erfc.default",
        &[&t(DType::F64, &[2], &[3.0, 6.0])],
        &[v(0)],
        &[],
    );
    assert!((out.data[0] - 2.209049699858544e-05).abs() < 1e-18);
    assert!((out.data[1] - 2.151973671249892e-17).abs() < 1e-29);
    assert!((erfinv(0.5) - 0.4769362762044699).abs() < 1e-14);
    assert!((erfinv(-0.999) + 2.326753765513525).abs() < 1e-12);
    let i = t(DType::I64, &[2], &[0.0, 1.0]);
    let out = call1("aten.exp.default", &[&i], &[v(0)], &[]);
    assert_eq!(out.dtype(), DType::F32);
    let out = call1(
        "aten.round.default",
        &[&t(DType::F32, &[3], &[0.5, 1.5, -2.5])],
        &[v(0)],
        &[],
    );
    assert_eq!(*out.data, vec![0.0, 2.0, -2.0]);
    assert!(call(
        "aten.neg.default",
        &[&t(DType::Bool, &[1], &[1.0])],
        &[v(0)],
        &[]
    )
    .is_err());
    let out = call1(
        "aten.nan_to_num.default",
        &[&t(
            DType::F16,
            &[3],
            &[f64::NAN, f64::INFINITY, f64::NEG_INFINITY],
        )],
        &[v(0)],
        &[],
    );
    assert_eq!(*out.data, vec![0.0, 65504.0, -65504.0]);
}
