//! Tests of the shape family, through the registry.

use crate::testing::{ar, call, call1, ints, t, v};
use crate::{Meta, Tensor};
use shardproof_ir::{Arg, DType};

#[test]
fn views_and_permutes() {
    let x = ar(&[2, 3]);
    let out = call1("aten.view.default", &[&x], &[v(0), ints(&[3, -1])], &[]);
    assert_eq!(out.shape(), &[3, 2]);
    assert!(call("aten.view.default", &[&x], &[v(0), ints(&[4, -1])], &[]).is_err());
    assert!(call("aten.view.default", &[&x], &[v(0), ints(&[-1, -1])], &[]).is_err());
    let out = call1(
        "aten.transpose.int",
        &[&x],
        &[v(0), Arg::Int(0), Arg::Int(-1)],
        &[],
    );
    assert_eq!(
        (out.shape(), out.data.to_vec()),
        (&[3usize, 2][..], vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0])
    );
    let y = ar(&[2, 3, 4]);
    let out = call1(
        "aten.permute.default",
        &[&y],
        &[v(0), ints(&[2, 0, 1])],
        &[],
    );
    assert_eq!(out.shape(), &[4, 2, 3]);
    assert_eq!(out.data[..4], [0.0, 4.0, 8.0, 12.0]);
    assert!(call(
        "aten.permute.default",
        &[&y],
        &[v(0), ints(&[0, 0, 1])],
        &[]
    )
    .is_err());
    assert!(call("aten.t.default", &[&y], &[v(0)], &[]).is_err());
    let out = call1(
        "aten.expand.default",
        &[&ar(&[3, 1])],
        &[v(0), ints(&[2, -1, 2])],
        &[],
    );
    assert_eq!(out.shape(), &[2, 3, 2]);
    assert_eq!(out.data[..6], [0.0, 0.0, 1.0, 1.0, 2.0, 2.0]);
    assert!(call(
        "aten.expand.default",
        &[&ar(&[3, 1])],
        &[v(0), ints(&[-1, 3, 2])],
        &[]
    )
    .is_err());
    assert!(call(
        "aten.expand.default",
        &[&ar(&[3, 1])],
        &[v(0), ints(&[2, 2])],
        &[]
    )
    .is_err());
    let out = call1(
        "aten.squeeze.dims",
        &[&ar(&[1, 3, 1])],
        &[v(0), ints(&[0, 1])],
        &[],
    );
    assert_eq!(out.shape(), &[3, 1]);
    let out = call1(
        "aten.unsqueeze.default",
        &[&ar(&[3])],
        &[v(0), Arg::Int(-1)],
        &[],
    );
    assert_eq!(out.shape(), &[3, 1]);
    let out = call1(
        "aten.flatten.using_ints",
        &[&ar(&[2, 3, 4])],
        &[v(0), Arg::Int(1)],
        &[],
    );
    assert_eq!(out.shape(), &[2, 12]);
    let out = call1(
        "aten.unflatten.int",
        &[&ar(&[2, 12])],
        &[v(0), Arg::Int(1), ints(&[3, -1])],
        &[],
    );
    assert_eq!(out.shape(), &[2, 3, 4]);
}

#[test]
fn slicing_clamps_like_torch() {
    let x = ar(&[10]);
    let sl = |start: Arg, end: Arg, step: i64| {
        call(
            "aten.slice.Tensor",
            &[&x],
            &[v(0), Arg::Int(0), start, end, Arg::Int(step)],
            &[],
        )
    };
    assert_eq!(
        *sl(Arg::Int(-3), Arg::Int(100), 1).unwrap()[0].data,
        vec![7.0, 8.0, 9.0]
    );
    assert_eq!(sl(Arg::Int(5), Arg::Int(2), 1).unwrap()[0].shape(), &[0]);
    assert_eq!(
        *sl(Arg::None, Arg::None, 3).unwrap()[0].data,
        vec![0.0, 3.0, 6.0, 9.0]
    );
    assert_eq!(
        *sl(Arg::Int(-100), Arg::Int(-8), 1).unwrap()[0].data,
        vec![0.0, 1.0]
    );
    assert!(sl(Arg::None, Arg::None, 0).is_err());
    let y = ar(&[2, 3]);
    let out = call1(
        "aten.slice.Tensor",
        &[&y],
        &[v(0), Arg::Int(1), Arg::Int(1)],
        &[],
    );
    assert_eq!(*out.data, vec![1.0, 2.0, 4.0, 5.0]);
    let out = call1(
        "aten.select.int",
        &[&y],
        &[v(0), Arg::Int(1), Arg::Int(-1)],
        &[],
    );
    assert_eq!(*out.data, vec![2.0, 5.0]);
    assert!(call(
        "aten.select.int",
        &[&y],
        &[v(0), Arg::Int(0), Arg::Int(2)],
        &[]
    )
    .is_err());
    let out = call1(
        "aten.narrow.default",
        &[&y],
        &[v(0), Arg::Int(1), Arg::Int(-2), Arg::Int(2)],
        &[],
    );
    assert_eq!(*out.data, vec![1.0, 2.0, 4.0, 5.0]);
    let src = t(DType::F32, &[2, 1], &[-1.0, -2.0]);
    let out = call1(
        "aten.slice_scatter.default",
        &[&y, &src],
        &[v(0), v(1), Arg::Int(1), Arg::Int(2)],
        &[],
    );
    assert_eq!(*out.data, vec![0.0, 1.0, -1.0, 3.0, 4.0, -2.0]);
    assert!(call(
        "aten.slice_scatter.default",
        &[&y, &src],
        &[v(0), v(1), Arg::Int(1)],
        &[]
    )
    .is_err());
    let src = t(DType::F32, &[3], &[7.0, 8.0, 9.0]);
    let out = call1(
        "aten.select_scatter.default",
        &[&y, &src],
        &[v(0), v(1), Arg::Int(0), Arg::Int(0)],
        &[],
    );
    assert_eq!(*out.data, vec![7.0, 8.0, 9.0, 3.0, 4.0, 5.0]);
    let out = call1(
        "aten.diagonal.default",
        &[&ar(&[3, 3])],
        &[v(0), Arg::Int(1)],
        &[],
    );
    assert_eq!(*out.data, vec![1.0, 5.0]);
    let out = call1(
        "aten.as_strided.default",
        &[&ar(&[6])],
        &[v(0), ints(&[2, 2]), ints(&[1, 2]), Arg::Int(1)],
        &[],
    );
    assert_eq!(*out.data, vec![1.0, 3.0, 2.0, 4.0]);
    assert!(call(
        "aten.as_strided.default",
        &[&ar(&[6])],
        &[v(0), ints(&[2, 2]), ints(&[3, 3])],
        &[]
    )
    .is_err());
}

#[test]
fn cat_stack_split() {
    let a = t(DType::I32, &[1, 2], &[1.0, 2.0]);
    let b = t(DType::F32, &[2, 2], &[3.0, 4.0, 5.0, 6.0]);
    let empty = t(DType::I64, &[0], &[]);
    let list = Arg::List(vec![v(0), v(1), v(2)]);
    let out = call1("aten.cat.default", &[&a, &empty, &b], &[list], &[]);
    assert_eq!(out.meta, Meta::new(DType::F32, vec![3, 2]));
    assert_eq!(*out.data, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let out = call1(
        "aten.cat.default",
        &[&a, &b, &empty],
        &[Arg::List(vec![v(0), v(1)]), Arg::Int(-2)],
        &[],
    );
    assert_eq!(out.shape(), &[3, 2]);
    assert!(call(
        "aten.cat.default",
        &[&a, &b],
        &[Arg::List(vec![v(0), v(1)]), Arg::Int(1)],
        &[]
    )
    .is_err());
    let out = call1(
        "aten.cat.default",
        &[&b, &b],
        &[Arg::List(vec![v(0), v(1)]), Arg::Int(1)],
        &[],
    );
    assert_eq!(*out.data, vec![3.0, 4.0, 3.0, 4.0, 5.0, 6.0, 5.0, 6.0]);
    let out = call1(
        "aten.stack.default",
        &[&b, &b],
        &[Arg::List(vec![v(0), v(1)]), Arg::Int(2)],
        &[],
    );
    assert_eq!(out.shape(), &[2, 2, 2]);
    assert_eq!(*out.data, vec![3.0, 3.0, 4.0, 4.0, 5.0, 5.0, 6.0, 6.0]);
    let x = ar(&[5]);
    let out = call("aten.chunk.default", &[&x], &[v(0), Arg::Int(3)], &[]).unwrap();
    let shapes: Vec<usize> = out.iter().map(|t| t.shape()[0]).collect();
    assert_eq!(shapes, vec![2, 2, 1]);
    let out = call(
        "aten.chunk.default",
        &[&ar(&[6])],
        &[v(0), Arg::Int(4)],
        &[],
    )
    .unwrap();
    assert_eq!(out.len(), 3);
    let out = call("aten.split.Tensor", &[&x], &[v(0), Arg::Int(2)], &[]).unwrap();
    assert_eq!(*out[2].data, vec![4.0]);
    let out = call(
        "aten.split_with_sizes.default",
        &[&ar(&[2, 3])],
        &[v(0), ints(&[1, 2]), Arg::Int(1)],
        &[],
    )
    .unwrap();
    assert_eq!(*out[1].data, vec![1.0, 2.0, 4.0, 5.0]);
    assert!(call(
        "aten.split_with_sizes.default",
        &[&x],
        &[v(0), ints(&[1, 2])],
        &[]
    )
    .is_err());
    let out = call(
        "aten.unbind.int",
        &[&ar(&[2, 3])],
        &[v(0), Arg::Int(1)],
        &[],
    )
    .unwrap();
    assert_eq!(out.len(), 3);
    assert_eq!(out[2].meta, Meta::new(DType::F32, vec![2]));
    assert_eq!(*out[2].data, vec![2.0, 5.0]);
}

#[test]
fn copies_and_rearrangements() {
    let x = t(DType::F32, &[3], &[1.7, -1.7, 2.0]);
    let out = call1(
        "aten._to_copy.default",
        &[&x],
        &[v(0)],
        &[("dtype", Arg::Dtype(DType::I64))],
    );
    assert_eq!(
        (out.dtype(), out.data.to_vec()),
        (DType::I64, vec![1.0, -1.0, 2.0])
    );
    let dst = t(DType::I32, &[2, 3], &[0.0; 6]);
    let out = call1("aten.copy.default", &[&dst, &x], &[v(0), v(1)], &[]);
    assert_eq!(
        (out.dtype(), out.data.to_vec()),
        (DType::I32, vec![1.0, -1.0, 2.0, 1.0, -1.0, 2.0])
    );
    assert!(call("aten.copy.default", &[&x, &dst], &[v(0), v(1)], &[]).is_err());
    let out = call1(
        "aten.repeat.default",
        &[&t(DType::F32, &[2], &[1.0, 2.0])],
        &[v(0), ints(&[2, 2])],
        &[],
    );
    assert_eq!(out.shape(), &[2, 4]);
    assert_eq!(*out.data, vec![1.0, 2.0, 1.0, 2.0, 1.0, 2.0, 1.0, 2.0]);
    let out = call1("aten.roll.default", &[&ar(&[5])], &[v(0), Arg::Int(2)], &[]);
    assert_eq!(*out.data, vec![3.0, 4.0, 0.0, 1.0, 2.0]);
    let out = call1(
        "aten.roll.default",
        &[&ar(&[2, 3])],
        &[v(0), ints(&[-1, 1]), ints(&[1, 0])],
        &[],
    );
    assert_eq!(*out.data, vec![4.0, 5.0, 3.0, 1.0, 2.0, 0.0]);
    let out = call1(
        "aten.roll.default",
        &[&ar(&[2, 2])],
        &[v(0), Arg::Int(1)],
        &[],
    );
    assert_eq!(*out.data, vec![3.0, 0.0, 1.0, 2.0]);
    let out = call1(
        "aten.flip.default",
        &[&ar(&[2, 3])],
        &[v(0), ints(&[-1])],
        &[],
    );
    assert_eq!(*out.data, vec![2.0, 1.0, 0.0, 5.0, 4.0, 3.0]);
    let out = call1("aten.tril.default", &[&ar(&[3, 3])], &[v(0)], &[]);
    assert_eq!(*out.data, vec![0.0, 0.0, 0.0, 3.0, 4.0, 0.0, 6.0, 7.0, 8.0]);
    let out = call1(
        "aten.triu.default",
        &[&ar(&[2, 3])],
        &[v(0), Arg::Int(1)],
        &[],
    );
    assert_eq!(*out.data, vec![0.0, 1.0, 2.0, 0.0, 0.0, 5.0]);
    assert!(call("aten.tril.default", &[&ar(&[3])], &[v(0)], &[]).is_err());
    let out = call1(
        "aten.constant_pad_nd.default",
        &[&ar(&[2, 3])],
        &[v(0), ints(&[1, -1]), Arg::Float(9.0)],
        &[],
    );
    assert_eq!(out.shape(), &[2, 3]);
    assert_eq!(*out.data, vec![9.0, 0.0, 1.0, 9.0, 3.0, 4.0]);
    let out = call1(
        "aten.constant_pad_nd.default",
        &[&ar(&[1, 1])],
        &[v(0), ints(&[0, 0, 1, 0])],
        &[],
    );
    assert_eq!(*out.data, vec![0.0, 0.0]);
    assert!(call(
        "aten.constant_pad_nd.default",
        &[&ar(&[2])],
        &[v(0), ints(&[-3, 0])],
        &[]
    )
    .is_err());
    let out = call1(
        "aten.unfold.default",
        &[&ar(&[5])],
        &[v(0), Arg::Int(0), Arg::Int(2), Arg::Int(2)],
        &[],
    );
    assert_eq!(out.shape(), &[2, 2]);
    assert_eq!(*out.data, vec![0.0, 1.0, 2.0, 3.0]);
}

/// `pad` in every mode, against values torch 2.15 printed for `arange(12).reshape(1, 3, 4)`.
#[test]
fn pad_modes_follow_torch() {
    let x = ar(&[1, 3, 4]);
    let pad = |p: &[i64], mode: &str| {
        call(
            "aten.pad.default",
            &[&x],
            &[v(0), ints(p), Arg::Str(mode.into())],
            &[],
        )
    };
    let row0 = |t: &Tensor| t.data[..t.shape()[2]].to_vec();
    let out = pad(&[2, 1], "reflect").unwrap().remove(0);
    assert_eq!(out.shape(), &[1, 3, 7]);
    assert_eq!(row0(&out), vec![2.0, 1.0, 0.0, 1.0, 2.0, 3.0, 2.0]);
    let out = pad(&[-1, 2], "reflect").unwrap().remove(0);
    assert_eq!(row0(&out), vec![1.0, 2.0, 3.0, 2.0, 1.0]);
    let out = pad(&[2, 2, 1, 0], "reflect").unwrap().remove(0);
    assert_eq!(out.shape(), &[1, 4, 8]);
    assert_eq!(row0(&out), vec![6.0, 5.0, 4.0, 5.0, 6.0, 7.0, 6.0, 5.0]);
    let out = pad(&[2, 1], "replicate").unwrap().remove(0);
    assert_eq!(row0(&out), vec![0.0, 0.0, 0.0, 1.0, 2.0, 3.0, 3.0]);
    let out = pad(&[-1, 2], "replicate").unwrap().remove(0);
    assert_eq!(row0(&out), vec![1.0, 2.0, 3.0, 3.0, 3.0]);
    let out = pad(&[2, 1], "circular").unwrap().remove(0);
    assert_eq!(row0(&out), vec![2.0, 3.0, 0.0, 1.0, 2.0, 3.0, 0.0]);
    // Circular padding wraps what is left after cropping the other side.
    let out = pad(&[-1, 2], "circular").unwrap().remove(0);
    assert_eq!(row0(&out), vec![1.0, 2.0, 3.0, 1.0, 2.0]);
    let out = pad(&[1, 1, 1, 1], "circular").unwrap().remove(0);
    assert_eq!(row0(&out), vec![11.0, 8.0, 9.0, 10.0, 11.0, 8.0]);
    let out = pad(&[0, -4], "circular").unwrap().remove(0);
    assert_eq!(out.shape(), &[1, 3, 0]);
    // Constant mode, the default, with its value (or zero).
    let out = call1("aten.pad.default", &[&x], &[v(0), ints(&[1, 0])], &[]);
    assert_eq!(row0(&out), vec![0.0, 0.0, 1.0, 2.0, 3.0]);
    let out = call1(
        "aten.pad.default",
        &[&x],
        &[
            v(0),
            ints(&[0, 1]),
            Arg::Str("constant".into()),
            Arg::Float(-2.0),
        ],
        &[],
    );
    assert_eq!(row0(&out), vec![0.0, 1.0, 2.0, 3.0, -2.0]);
    // What torch refuses.
    assert!(pad(&[4, 0], "reflect").is_err());
    assert!(pad(&[0, -4], "reflect").is_err());
    assert!(pad(&[5, 0], "circular").is_err());
    assert!(pad(&[-3, 2], "circular").is_err());
    assert!(pad(&[1, 1], "bogus").is_err());
    assert!(pad(&[1, 1, 1, 1, 1, 1], "replicate").is_err());
    assert!(call(
        "aten.pad.default",
        &[&ar(&[4])],
        &[v(0), ints(&[1, 1]), Arg::Str("replicate".into())],
        &[]
    )
    .is_err());
    assert!(call(
        "aten.pad.default",
        &[&x],
        &[
            v(0),
            ints(&[1, 1]),
            Arg::Str("reflect".into()),
            Arg::Float(1.0)
        ],
        &[]
    )
    .is_err());
}

#[test]
fn broadcast_tensors_and_metadata_asserts() {
    let a = ar(&[3, 1]);
    let b = t(DType::I64, &[2], &[7.0, 8.0]);
    let out = call(
        "aten.broadcast_tensors.default",
        &[&a, &b],
        &[Arg::List(vec![v(0), v(1)])],
        &[],
    )
    .unwrap();
    assert_eq!(out[0].meta, Meta::new(DType::F32, vec![3, 2]));
    assert_eq!(*out[0].data, vec![0.0, 0.0, 1.0, 1.0, 2.0, 2.0]);
    assert_eq!(out[1].meta, Meta::new(DType::I64, vec![3, 2]));
    assert_eq!(*out[1].data, vec![7.0, 8.0, 7.0, 8.0, 7.0, 8.0]);
    let c = ar(&[3]);
    assert!(call(
        "aten.broadcast_tensors.default",
        &[&a, &c, &b],
        &[Arg::List(vec![v(0), v(1), v(2)])],
        &[]
    )
    .is_err());

    let assert_meta =
        |kw: &[(&str, Arg)]| call("aten._assert_tensor_metadata.default", &[&a], &[v(0)], kw);
    let ok = assert_meta(&[
        ("dtype", Arg::Dtype(DType::F32)),
        ("size", ints(&[3, 1])),
        ("device", Arg::Device("device(type='cuda', index=0)".into())),
        ("layout", Arg::Layout("strided".into())),
    ]);
    assert_eq!(ok, Ok(vec![]));
    assert!(assert_meta(&[("dtype", Arg::Dtype(DType::F64))]).is_err());
    assert!(assert_meta(&[("size", ints(&[1, 3]))]).is_err());
    assert!(assert_meta(&[("layout", Arg::Layout("sparse_coo".into()))]).is_err());

    let out = call1("aten.detach_.default", &[&a], &[v(0)], &[]);
    assert_eq!(out, a);
}
