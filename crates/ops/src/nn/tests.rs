//! Unit tests of the neural-network family against hand-computed values.

use super::*;
use crate::testing::{ints, v};
use shardproof_ir::Arg;

fn t(shape: &[usize], data: &[f64]) -> Tensor {
    Tensor::new(Meta::new(DType::F64, shape.to_vec()), data.to_vec())
}

fn ti(shape: &[usize], data: &[f64]) -> Tensor {
    Tensor::new(Meta::new(DType::I64, shape.to_vec()), data.to_vec())
}

fn call(op: &str, ts: &[Tensor], args: &[Arg]) -> Result<Vec<Tensor>, OpError> {
    Registry::builtin().call(op, ts, args, &[])
}

fn ramp(n: usize, scale: f64) -> Vec<f64> {
    (0..n)
        .map(|i| ((i * 7 % 11) as f64 - 5.0) * scale + 0.1 * i as f64)
        .collect()
}

fn close(a: &[f64], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= tol * (1.0 + y.abs()),
            "element {i}: {x} vs {y}"
        );
    }
}

/// Central finite differences of a scalar function at `x`.
fn fd(x: &[f64], f: impl Fn(&[f64]) -> f64) -> Vec<f64> {
    let h = 1e-6;
    (0..x.len())
        .map(|i| {
            let mut p = x.to_vec();
            let mut q = x.to_vec();
            p[i] += h;
            q[i] -= h;
            (f(&p) - f(&q)) / (2.0 * h)
        })
        .collect()
}

fn dotp(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[test]
fn softmax_rows_sum_to_one_and_log_softmax_agrees() {
    let x = t(&[2, 3, 4], &ramp(24, 0.7));
    for dim in [-1i64, 1, 0] {
        let s = call(
            "aten._softmax.default",
            std::slice::from_ref(&x),
            &[v(0), Arg::Int(dim), Arg::Bool(false)],
        )
        .unwrap();
        let (outer, size, inner) = lanes(x.shape(), dim).unwrap();
        for o in 0..outer {
            for i in 0..inner {
                let sum: f64 = (0..size)
                    .map(|j| s[0].data[o * size * inner + j * inner + i])
                    .sum();
                assert!((sum - 1.0).abs() < 1e-12);
            }
        }
        let l = call(
            "aten._log_softmax.default",
            std::slice::from_ref(&x),
            &[v(0), Arg::Int(dim), Arg::Bool(false)],
        )
        .unwrap();
        let exp: Vec<f64> = l[0].data.iter().map(|v| v.exp()).collect();
        close(&exp, &s[0].data, 1e-12);
    }
    // Hand value: softmax([0, ln 3]) = [1/4, 3/4].
    let s = call(
        "aten.softmax.int",
        &[t(&[2], &[0.0, 3f64.ln()])],
        &[v(0), Arg::Int(0)],
    )
    .unwrap();
    close(&s[0].data, &[0.25, 0.75], 1e-15);
    let half = Tensor::new(Meta::new(DType::F16, vec![2]), vec![0.0, 1.0]);
    let s = call(
        "aten._softmax.default",
        &[half],
        &[v(0), Arg::Int(0), Arg::Bool(true)],
    )
    .unwrap();
    assert_eq!(s[0].dtype(), DType::F32);
}

#[test]
fn softmax_backward_matches_finite_differences() {
    let x = ramp(6, 0.3);
    let g = ramp(6, -0.2).iter().map(|v| v + 0.05).collect::<Vec<_>>();
    let softmax = |x: &[f64]| {
        call(
            "aten._softmax.default",
            &[t(&[2, 3], x)],
            &[v(0), Arg::Int(1), Arg::Bool(false)],
        )
        .unwrap()[0]
            .data
            .as_ref()
            .clone()
    };
    let y = softmax(&x);
    let dx = call(
        "aten._softmax_backward_data.default",
        &[t(&[2, 3], &g), t(&[2, 3], &y)],
        &[v(0), v(1), Arg::Int(1), Arg::Dtype(DType::F64)],
    )
    .unwrap();
    close(&dx[0].data, &fd(&x, |x| dotp(&softmax(x), &g)), 1e-7);
    let log_softmax = |x: &[f64]| {
        call(
            "aten._log_softmax.default",
            &[t(&[2, 3], x)],
            &[v(0), Arg::Int(-1), Arg::Bool(false)],
        )
        .unwrap()[0]
            .data
            .as_ref()
            .clone()
    };
    let ly = log_softmax(&x);
    let dx = call(
        "aten._log_softmax_backward_data.default",
        &[t(&[2, 3], &g), t(&[2, 3], &ly)],
        &[v(0), v(1), Arg::Int(-1), Arg::Dtype(DType::F64)],
    )
    .unwrap();
    close(&dx[0].data, &fd(&x, |x| dotp(&log_softmax(x), &g)), 1e-7);
}

#[test]
fn native_layer_norm_forward_and_backward() {
    let shape = [2, 2, 3];
    let x = ramp(12, 0.4);
    let w = vec![1.5, -0.5, 2.0];
    let b = vec![0.1, 0.2, 0.3];
    let g = ramp(12, 0.25);
    let fwd = |x: &[f64], w: &[f64], b: &[f64]| {
        call(
            "aten.native_layer_norm.default",
            &[t(&shape, x), t(&[3], w), t(&[3], b)],
            &[v(0), ints(&[3]), v(1), v(2), Arg::Float(1e-5)],
        )
        .unwrap()
    };
    let out = fwd(&x, &w, &b);
    assert_eq!(out[1].shape(), &[2, 2, 1]);
    assert_eq!(out[2].shape(), &[2, 2, 1]);
    // Hand check of the first row.
    let row = &x[..3];
    let mu = row.iter().sum::<f64>() / 3.0;
    let var = row.iter().map(|v| (v - mu).powi(2)).sum::<f64>() / 3.0;
    let rs = 1.0 / (var + 1e-5).sqrt();
    close(
        &out[0].data[..1],
        &[(row[0] - mu) * rs * w[0] + b[0]],
        1e-14,
    );
    close(&[out[1].data[0], out[2].data[0]], &[mu, rs], 1e-14);
    let half = Tensor::new(Meta::new(DType::Bf16, vec![1, 3]), vec![1., 2., 4.]);
    let o = call(
        "aten.native_layer_norm.default",
        &[half],
        &[v(0), ints(&[3]), Arg::None, Arg::None, Arg::Float(1e-5)],
    )
    .unwrap();
    assert_eq!((o[0].dtype(), o[1].dtype()), (DType::Bf16, DType::F32));

    let bwd = call(
        "aten.native_layer_norm_backward.default",
        &[
            t(&shape, &g),
            t(&shape, &x),
            out[1].clone(),
            out[2].clone(),
            t(&[3], &w),
            t(&[3], &b),
        ],
        &[
            v(0),
            v(1),
            ints(&[3]),
            v(2),
            v(3),
            v(4),
            v(5),
            Arg::List(vec![Arg::Bool(true); 3]),
        ],
    )
    .unwrap();
    let loss = |x: &[f64], w: &[f64], b: &[f64]| dotp(&fwd(x, w, b)[0].data, &g);
    close(&bwd[0].data, &fd(&x, |x| loss(x, &w, &b)), 1e-6);
    close(&bwd[1].data, &fd(&w, |w| loss(&x, w, &b)), 1e-6);
    close(&bwd[2].data, &fd(&b, |b| loss(&x, &w, b)), 1e-6);
}

#[test]
fn apex_layer_norm_forward_and_backward() {
    let shape = [4, 2, 3];
    let x = ramp(24, 0.3);
    let w = vec![0.5, 1.25, -1.0];
    let b = vec![0.0, -0.3, 0.7];
    let g = ramp(24, -0.15);
    let fwd = |x: &[f64], w: &[f64], b: &[f64]| {
        call(
            "apex.fused_layer_norm_affine_fwd.default",
            &[t(&shape, x), t(&[3], w), t(&[3], b)],
            &[v(0), v(1), v(2), ints(&[3]), Arg::Float(1e-5)],
        )
        .unwrap()
    };
    let out = fwd(&x, &w, &b);
    assert_eq!(out[1].shape(), &[8]);
    assert_eq!(out[2].shape(), &[8]);
    // Same numbers as torch's layer norm, flattened statistics.
    let tl = call(
        "aten.native_layer_norm.default",
        &[t(&shape, &x), t(&[3], &w), t(&[3], &b)],
        &[v(0), ints(&[3]), v(1), v(2), Arg::Float(1e-5)],
    )
    .unwrap();
    assert_eq!(out[0].data, tl[0].data);
    assert_eq!(out[2].data, tl[2].data);
    // Megatron's call form: (grad, mean, invvar, input, shape, weight, bias, eps).
    let args = [
        v(0),
        v(1),
        v(2),
        v(3),
        ints(&[3]),
        v(4),
        v(5),
        Arg::Float(1e-5),
    ];
    let ts = [
        t(&shape, &g),
        out[1].clone(),
        out[2].clone(),
        t(&shape, &x),
        t(&[3], &w),
        t(&[3], &b),
    ];
    let bwd = call("apex.fused_layer_norm_affine_bwd.default", &ts, &args).unwrap();
    let loss = |x: &[f64], w: &[f64], b: &[f64]| dotp(&fwd(x, w, b)[0].data, &g);
    close(&bwd[0].data, &fd(&x, |x| loss(x, &w, &b)), 1e-6);
    close(&bwd[1].data, &fd(&w, |w| loss(&x, w, &b)), 1e-6);
    close(&bwd[2].data, &fd(&b, |b| loss(&x, &w, b)), 1e-6);
    // The memory-efficient form reads the output instead of the input.
    let ts = [
        t(&shape, &g),
        out[1].clone(),
        out[2].clone(),
        out[0].clone(),
        t(&[3], &w),
        t(&[3], &b),
    ];
    let mut args = args.to_vec();
    args.push(Arg::Bool(true));
    let bwd2 = call("apex.fused_layer_norm_affine_bwd.default", &ts, &args).unwrap();
    close(&bwd2[0].data, &bwd[0].data, 1e-12);
    // f16 input: f32 statistics, as in the captured graphs.
    let h = |s: &[usize], d: &[f64]| Tensor::new(Meta::new(DType::F16, s.to_vec()), d.to_vec());
    let o = call(
        "apex.fused_layer_norm_affine_fwd.default",
        &[h(&shape, &x), h(&[3], &w), h(&[3], &b)],
        &[v(0), v(1), v(2), ints(&[3]), Arg::Float(1e-5)],
    )
    .unwrap();
    assert_eq!(
        (o[0].dtype(), o[1].dtype(), o[2].dtype()),
        (DType::F16, DType::F32, DType::F32)
    );
    assert!(call(
        "apex.fused_layer_norm_affine_fwd.default",
        &[t(&shape, &x), t(&[2], &[1., 1.]), t(&[3], &b)],
        &[v(0), v(1), v(2), ints(&[3]), Arg::Float(1e-5)],
    )
    .is_err());
}

#[test]
fn rms_norm_and_its_backward() {
    let x = ramp(6, 0.5);
    let w = vec![2.0, 0.5, 1.0];
    let g = ramp(6, 0.3);
    let fwd = |x: &[f64], w: &[f64]| {
        call(
            "aten._fused_rms_norm.default",
            &[t(&[2, 3], x), t(&[3], w)],
            &[v(0), ints(&[3]), v(1), Arg::Float(1e-6)],
        )
        .unwrap()
    };
    let out = fwd(&x, &w);
    let r0 = 1.0 / ((x[0] * x[0] + x[1] * x[1] + x[2] * x[2]) / 3.0 + 1e-6).sqrt();
    close(
        &[out[0].data[0], out[1].data[0]],
        &[x[0] * r0 * 2.0, r0],
        1e-14,
    );
    assert_eq!(out[1].shape(), &[2, 1]);
    let plain = call(
        "aten.rms_norm.default",
        &[t(&[2, 3], &x), t(&[3], &w)],
        &[v(0), ints(&[3]), v(1), Arg::Float(1e-6)],
    )
    .unwrap();
    assert_eq!(plain[0].data, out[0].data);
    let bwd = call(
        "aten._fused_rms_norm_backward.default",
        &[t(&[2, 3], &g), t(&[2, 3], &x), out[1].clone(), t(&[3], &w)],
        &[
            v(0),
            v(1),
            ints(&[3]),
            v(2),
            v(3),
            Arg::List(vec![Arg::Bool(true); 2]),
        ],
    )
    .unwrap();
    let loss = |x: &[f64], w: &[f64]| dotp(&fwd(x, w)[0].data, &g);
    close(&bwd[0].data, &fd(&x, |x| loss(x, &w)), 1e-6);
    close(&bwd[1].data, &fd(&w, |w| loss(&x, w)), 1e-6);
}

#[test]
fn gelu_and_friends_match_finite_differences() {
    let x = ramp(11, 0.45);
    let g = vec![1.0; 11];
    for approx in ["none", "tanh"] {
        let kw = [("approximate".to_string(), Arg::Str(approx.into()))];
        let r = Registry::builtin();
        let f = |x: &[f64]| {
            r.call("aten.gelu.default", &[t(&[11], x)], &[v(0)], &kw)
                .unwrap()[0]
                .data
                .iter()
                .sum::<f64>()
        };
        let dx = r
            .call(
                "aten.gelu_backward.default",
                &[t(&[11], &g), t(&[11], &x)],
                &[v(0), v(1)],
                &kw,
            )
            .unwrap();
        close(&dx[0].data, &fd(&x, f), 1e-7);
    }
    // gelu(1) = 0.5 * (1 + erf(1/sqrt 2)) = 0.8413447460685429.
    let y = call("aten.gelu.default", &[t(&[1], &[1.0])], &[v(0)]).unwrap();
    close(&y[0].data, &[0.841_344_746_068_542_9], 1e-15);
    let f = |x: &[f64]| {
        call("aten.silu.default", &[t(&[11], x)], &[v(0)]).unwrap()[0]
            .data
            .iter()
            .sum::<f64>()
    };
    let dx = call(
        "aten.silu_backward.default",
        &[t(&[11], &g), t(&[11], &x)],
        &[v(0), v(1)],
    )
    .unwrap();
    close(&dx[0].data, &fd(&x, f), 1e-7);
    let y = call(
        "aten.relu.default",
        &[t(&[3], &[-1.0, 2.0, f64::NAN])],
        &[v(0)],
    )
    .unwrap();
    assert_eq!(&y[0].data[..2], &[0.0, 2.0]);
    assert!(y[0].data[2].is_nan());
    let d = call(
        "aten.threshold_backward.default",
        &[t(&[3], &[5., 6., 7.]), t(&[3], &[-1., 0., 1.])],
        &[v(0), v(1), Arg::Int(0)],
    )
    .unwrap();
    assert_eq!(*d[0].data, vec![0., 0., 7.]);
    let d = call(
        "aten.sigmoid_backward.default",
        &[t(&[1], &[2.0]), t(&[1], &[0.25])],
        &[v(0), v(1)],
    )
    .unwrap();
    assert_eq!(d[0].data[0], 2.0 * 0.75 * 0.25);
    let d = call(
        "aten.tanh_backward.default",
        &[t(&[1], &[2.0]), t(&[1], &[0.5])],
        &[v(0), v(1)],
    )
    .unwrap();
    assert_eq!(d[0].data[0], 1.5);
}

#[test]
fn embedding_forward_and_dense_backward() {
    let w = t(&[4, 2], &[0., 1., 10., 11., 20., 21., 30., 31.]);
    let idx = ti(&[2, 2], &[3., 0., 3., 1.]);
    let e = call(
        "aten.embedding.default",
        &[w.clone(), idx.clone()],
        &[v(0), v(1)],
    )
    .unwrap();
    assert_eq!(e[0].shape(), &[2, 2, 2]);
    assert_eq!(*e[0].data, vec![30., 31., 0., 1., 30., 31., 10., 11.]);
    assert!(call(
        "aten.embedding.default",
        &[w, ti(&[1], &[4.])],
        &[v(0), v(1)]
    )
    .is_err());
    let g = t(&[2, 2, 2], &[1., 2., 3., 4., 5., 6., 7., 8.]);
    let args = |pad: i64, freq: bool| [v(0), v(1), Arg::Int(4), Arg::Int(pad), Arg::Bool(freq)];
    let d = call(
        "aten.embedding_dense_backward.default",
        &[g.clone(), idx.clone()],
        &args(-1, false),
    )
    .unwrap();
    assert_eq!(d[0].shape(), &[4, 2]);
    assert_eq!(*d[0].data, vec![3., 4., 7., 8., 0., 0., 6., 8.]);
    let d = call(
        "aten.embedding_dense_backward.default",
        &[g.clone(), idx.clone()],
        &args(3, false),
    )
    .unwrap();
    assert_eq!(*d[0].data, vec![3., 4., 7., 8., 0., 0., 0., 0.]);
    let d = call(
        "aten.embedding_dense_backward.default",
        &[g, idx],
        &args(-1, true),
    )
    .unwrap();
    assert_eq!(*d[0].data, vec![3., 4., 7., 8., 0., 0., 3., 4.]);
}

#[test]
fn nll_loss_with_ignore_index_and_weights() {
    let x = t(&[3, 3], &[-1., -2., -3., -4., -5., -6., -7., -8., -9.]);
    let tgt = ti(&[3], &[0., 2., -100.]);
    let fwd = |red: i64, w: Option<Tensor>| {
        let mut ts = vec![x.clone(), tgt.clone()];
        let wa = w.map_or(Arg::None, |w| {
            ts.push(w);
            v(2)
        });
        call(
            "aten.nll_loss_forward.default",
            &ts,
            &[v(0), v(1), wa, Arg::Int(red), Arg::Int(-100)],
        )
        .unwrap()
    };
    let o = fwd(1, None);
    assert_eq!((o[0].data[0], o[1].data[0]), ((1.0 + 6.0) / 2.0, 2.0));
    assert_eq!(o[0].shape(), &[] as &[usize]);
    let o = fwd(2, None);
    assert_eq!(o[0].data[0], 7.0);
    let o = fwd(0, None);
    assert_eq!(
        (o[0].data.as_slice(), o[1].data[0]),
        (&[1., 6., 0.][..], 0.0)
    );
    let w = t(&[3], &[0.5, 1.0, 2.0]);
    let o = fwd(1, Some(w.clone()));
    assert_eq!((o[0].data[0], o[1].data[0]), ((0.5 + 12.0) / 2.5, 2.5));
    // Backward of the weighted mean.
    let g = t(&[], &[1.0]);
    let d = call(
        "aten.nll_loss_backward.default",
        &[g, x.clone(), tgt.clone(), w, o[1].clone()],
        &[v(0), v(1), v(2), v(3), Arg::Int(1), Arg::Int(-100), v(4)],
    )
    .unwrap();
    assert_eq!(*d[0].data, vec![-0.2, 0., 0., 0., 0., -0.8, 0., 0., 0.]);
    // Every sample ignored: mean is 0/0 = NaN, as in torch.
    let all = ti(&[3], &[-100.; 3]);
    let o = call(
        "aten.nll_loss_forward.default",
        &[x.clone(), all],
        &[v(0), v(1), Arg::None, Arg::Int(1), Arg::Int(-100)],
    )
    .unwrap();
    assert!(o[0].data[0].is_nan());
    let bad = ti(&[3], &[0., 3., 1.]);
    assert!(call(
        "aten.nll_loss_forward.default",
        &[x, bad],
        &[v(0), v(1), Arg::None, Arg::Int(1), Arg::Int(-100)]
    )
    .is_err());
}

#[test]
fn mse_loss_and_backward() {
    let x = t(&[2, 2], &[1., 2., 3., 4.]);
    let y = t(&[2, 2], &[0., 2., 5., 4.]);
    let o = call(
        "aten.mse_loss.default",
        &[x.clone(), y.clone()],
        &[v(0), v(1)],
    )
    .unwrap();
    assert_eq!(o[0].data[0], 5.0 / 4.0);
    let o = call(
        "aten.mse_loss.default",
        &[x.clone(), y.clone()],
        &[v(0), v(1), Arg::Int(0)],
    )
    .unwrap();
    assert_eq!(*o[0].data, vec![1., 0., 4., 0.]);
    let g = t(&[], &[1.0]);
    let d = call(
        "aten.mse_loss_backward.default",
        &[g, x, y],
        &[v(0), v(1), v(2), Arg::Int(1)],
    )
    .unwrap();
    assert_eq!(*d[0].data, vec![0.5, 0., -1., 0.]);
}

/// `scaled_dot_product_attention` on query `[1, 2, 3, 4]`, key `[1, 2, 5, 4]`, value
/// `[1, 2, 5, 6]`, against the same computation spelled with other operators.
#[test]
fn scaled_dot_product_attention_matches_its_decomposition() {
    use crate::testing::call as call_kw;
    let q = t(&[1, 2, 3, 4], &ramp(24, 0.1));
    let k = t(&[1, 2, 5, 4], &ramp(40, 0.07));
    let vv = t(&[1, 2, 5, 6], &ramp(60, 0.3));
    let bias = t(&[3, 5], &ramp(15, 0.5));
    let sdpa = |ts: &[&Tensor], args: &[Arg], kw: &[(&str, Arg)]| {
        call_kw("aten.scaled_dot_product_attention.default", ts, args, kw)
    };
    // softmax(q kᵀ · scale + bias) v, through matmul, mul, add and softmax.
    let op =
        |name: &str, ts: &[&Tensor], args: &[Arg]| call_kw(name, ts, args, &[]).unwrap()[0].clone();
    let reference = |scale: f64, bias: Option<&Tensor>| {
        let kt = op(
            "aten.transpose.int",
            &[&k],
            &[v(0), Arg::Int(-2), Arg::Int(-1)],
        );
        let s = op("aten.matmul.default", &[&q, &kt], &[v(0), v(1)]);
        let mut s = op("aten.mul.Scalar", &[&s], &[v(0), Arg::Float(scale)]);
        if let Some(b) = bias {
            s = op("aten.add.Tensor", &[&s, b], &[v(0), v(1)]);
        }
        let p = op(
            "aten._softmax.default",
            &[&s],
            &[v(0), Arg::Int(-1), Arg::Bool(false)],
        );
        op("aten.matmul.default", &[&p, &vv], &[v(0), v(1)])
    };
    let out = sdpa(&[&q, &k, &vv], &[v(0), v(1), v(2)], &[]).unwrap();
    assert_eq!(out[0].shape(), &[1, 2, 3, 6]);
    close(&out[0].data, &reference(0.5, None).data, 1e-12);
    let out = sdpa(
        &[&q, &k, &vv, &bias],
        &[v(0), v(1), v(2), v(3)],
        &[("scale", Arg::Float(0.3))],
    )
    .unwrap();
    close(&out[0].data, &reference(0.3, Some(&bias)).data, 1e-12);

    // A causal mask is an additive -inf above the diagonal (aligned top left), and a bool
    // mask is -inf where false; a row that may attend to nothing gives zeros.
    let causal_bias = t(
        &[3, 5],
        &(0..15)
            .map(|i| {
                if i % 5 > i / 5 {
                    f64::NEG_INFINITY
                } else {
                    0.0
                }
            })
            .collect::<Vec<_>>(),
    );
    let out = sdpa(
        &[&q, &k, &vv],
        &[
            v(0),
            v(1),
            v(2),
            Arg::None,
            Arg::Float(0.0),
            Arg::Bool(true),
        ],
        &[],
    )
    .unwrap();
    close(
        &out[0].data,
        &reference(0.5, Some(&causal_bias)).data,
        1e-12,
    );
    let keep: Vec<f64> = (0..15)
        .map(|i| ((i % 5 <= i / 5) && i / 5 != 1) as i64 as f64)
        .collect();
    let mask = Tensor::new(Meta::new(DType::Bool, vec![3, 5]), keep);
    let out = sdpa(&[&q, &k, &vv, &mask], &[v(0), v(1), v(2), v(3)], &[]).unwrap();
    let want = reference(0.5, Some(&causal_bias));
    for (i, (g, w)) in out[0].data.iter().zip(want.data.iter()).enumerate() {
        let row = (i / 6) % 3;
        let w = if row == 1 { 0.0 } else { *w };
        assert!((g - w).abs() < 1e-12, "element {i}: {g} vs {w}");
    }

    // Grouped-query attention: 4 query heads share the 2 key/value heads in pairs.
    let q4 = t(&[1, 4, 3, 4], &ramp(48, 0.1));
    let out = sdpa(
        &[&q4, &k, &vv],
        &[v(0), v(1), v(2)],
        &[("enable_gqa", Arg::Bool(true))],
    )
    .unwrap();
    assert_eq!(out[0].shape(), &[1, 4, 3, 6]);
    let repeat = |x: &Tensor| {
        let half = x.numel() / 2;
        let mut d = Vec::new();
        for h in 0..4 {
            d.extend_from_slice(&x.data[(h / 2) * half..(h / 2 + 1) * half]);
        }
        let mut shape = x.shape().to_vec();
        shape[1] = 4;
        t(&shape, &d)
    };
    let (k4, v4) = (repeat(&k), repeat(&vv));
    let want = sdpa(&[&q4, &k4, &v4], &[v(0), v(1), v(2)], &[]).unwrap();
    assert_eq!(out, want);
    assert!(sdpa(&[&q4, &k, &vv], &[v(0), v(1), v(2)], &[]).is_err());

    // What is refused: dropout (random), a mask with is_causal, mixed or integer dtypes.
    let with = |args: &[Arg], ts: &[&Tensor]| sdpa(ts, args, &[]).is_err();
    assert!(with(
        &[v(0), v(1), v(2), Arg::None, Arg::Float(0.1)],
        &[&q, &k, &vv]
    ));
    assert!(with(
        &[v(0), v(1), v(2), v(3), Arg::Float(0.0), Arg::Bool(true)],
        &[&q, &k, &vv, &mask]
    ));
    let k32 = Tensor::new(Meta::new(DType::F32, k.shape().to_vec()), k.data.to_vec());
    assert!(with(&[v(0), v(1), v(2)], &[&q, &k32, &vv]));
    let imask = ti(&[3, 5], &[1.0; 15]);
    assert!(with(&[v(0), v(1), v(2), v(3)], &[&q, &k, &vv, &imask]));
    assert!(with(&[v(0), v(1), v(2)], &[&q, &q, &vv]));
}
