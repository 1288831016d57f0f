//! Matrix products: `mm`, `bmm`, `baddbmm`, `addmm`, `addbmm`, `matmul`, `linear`, `dot`, `mv`.
//!
//! Products accumulate in f64 with a tiled i-k-j loop: the inner loop runs over contiguous rows
//! of both the right operand and the output, which matters for the 1000s-wide matrices of real
//! models.

use crate::util::{broadcast_indices, broadcast_shapes};
use crate::{Args, Meta, OpError, Registry, Tensor};
use shardproof_ir::DType;

/// Registers the linear-algebra family.
pub(crate) fn register(r: &mut Registry) {
    r.pure(
        "aten.mm.default",
        "mm(Tensor self, Tensor mat2) -> Tensor",
        infer_mm,
        |a, m, _| {
            let prod = matrix_product(a.tensor("self")?, a.tensor("mat2")?);
            Ok(vec![Tensor::new(m[0].clone(), prod)])
        },
    );
    r.pure(
        "aten.bmm.default",
        "bmm(Tensor self, Tensor mat2) -> Tensor",
        infer_bmm,
        |a, m, _| {
            let (x, y) = (a.tensor("self")?, a.tensor("mat2")?);
            Ok(vec![Tensor::new(m[0].clone(), batched_product(x, y))])
        },
    );
    r.pure(
        "aten.baddbmm.default",
        "baddbmm(Tensor self, Tensor batch1, Tensor batch2, *, Scalar beta=1, Scalar alpha=1) -> Tensor",
        infer_baddbmm,
        |a, m, _| {
            let prod = batched_product(a.tensor("batch1")?, a.tensor("batch2")?);
            Ok(vec![add_scaled(a, &m[0], prod)?])
        },
    );
    r.pure(
        "aten.addmm.default",
        "addmm(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1, Scalar alpha=1) -> Tensor",
        infer_addmm,
        |a, m, _| {
            let prod = matrix_product(a.tensor("mat1")?, a.tensor("mat2")?);
            Ok(vec![add_scaled(a, &m[0], prod)?])
        },
    );
    r.pure(
        "aten.addbmm.default",
        "addbmm(Tensor self, Tensor batch1, Tensor batch2, *, Scalar beta=1, Scalar alpha=1) -> Tensor",
        infer_addbmm,
        |a, m, _| {
            let (x, y) = (a.tensor("batch1")?, a.tensor("batch2")?);
            let (b, n, k, p) = (x.shape()[0], x.shape()[1], x.shape()[2], y.shape()[2]);
            let mut prod = vec![0.0; n * p];
            for i in 0..b {
                gemm_acc(
                    &x.data[i * n * k..(i + 1) * n * k],
                    &y.data[i * k * p..(i + 1) * k * p],
                    &mut prod,
                    n,
                    k,
                    p,
                );
            }
            Ok(vec![add_scaled(a, &m[0], prod)?])
        },
    );
    r.pure(
        "aten.matmul.default",
        "matmul(Tensor self, Tensor other) -> Tensor",
        |a| {
            let plan = MatmulPlan::new(&a.meta("self")?, &a.meta("other")?)?;
            Ok(vec![plan.out])
        },
        |a, _, _| {
            let (x, y) = (a.tensor("self")?, a.tensor("other")?);
            let plan = MatmulPlan::new(&x.meta, &y.meta)?;
            Ok(vec![plan.run(&x.data, &y.data)])
        },
    );
    r.pure(
        "aten.linear.default",
        "linear(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor",
        infer_linear,
        eval_linear,
    );
    r.pure(
        "aten.dot.default",
        "dot(Tensor self, Tensor tensor) -> Tensor",
        |a| {
            let (x, y) = (a.meta("self")?, a.meta("tensor")?);
            if x.rank() != 1 || y.rank() != 1 || x.shape != y.shape {
                return Err(OpError::new(format!(
                    "dot: expected two 1-D tensors of the same size, got {:?} and {:?}",
                    x.shape, y.shape
                )));
            }
            Ok(vec![Meta::new(same_dtype("dot", &x, &y)?, vec![])])
        },
        |a, m, _| {
            let (x, y) = (a.tensor("self")?, a.tensor("tensor")?);
            let s = x.data.iter().zip(y.data.iter()).map(|(p, q)| p * q).sum();
            Ok(vec![Tensor::new(m[0].clone(), vec![s])])
        },
    );
    r.pure(
        "aten.mv.default",
        "mv(Tensor self, Tensor vec) -> Tensor",
        |a| {
            let (x, v) = (a.meta("self")?, a.meta("vec")?);
            if x.rank() != 2 || v.rank() != 1 || x.shape[1] != v.shape[0] {
                return Err(OpError::new(format!(
                    "mv: expected a matrix and a vector of matching size, got {:?} and {:?}",
                    x.shape, v.shape
                )));
            }
            Ok(vec![Meta::new(same_dtype("mv", &x, &v)?, vec![x.shape[0]])])
        },
        |a, m, _| {
            let (x, v) = (a.tensor("self")?, a.tensor("vec")?);
            let (n, k) = (x.shape()[0], x.shape()[1]);
            let mut out = vec![0.0; n];
            gemm_acc(&x.data, &v.data, &mut out, n, k, 1);
            Ok(vec![Tensor::new(m[0].clone(), out)])
        },
    );
}

/// `out[n×p] += a[n×k] · b[k×p]`, all row-major.
///
/// Tiled over `k` and `p` so a tile of `b` stays in cache while every row of `a` passes over
/// it (about twice as fast as the plain i-k-j loop on 1000s-wide matrices); each output still
/// sums its terms in increasing `k`, so results do not depend on the tiling. Zeros of `a` are
/// not skipped: `0 · NaN` must stay NaN, as in BLAS.
pub(crate) fn gemm_acc(a: &[f64], b: &[f64], out: &mut [f64], n: usize, k: usize, p: usize) {
    const K_TILE: usize = 128;
    const P_TILE: usize = 256;
    for j0 in (0..p).step_by(P_TILE) {
        let j1 = (j0 + P_TILE).min(p);
        for k0 in (0..k).step_by(K_TILE) {
            let k1 = (k0 + K_TILE).min(k);
            for i in 0..n {
                let orow = &mut out[i * p + j0..i * p + j1];
                for (l, &av) in a[i * k + k0..i * k + k1].iter().enumerate() {
                    let brow = &b[(k0 + l) * p + j0..(k0 + l) * p + j1];
                    for (o, &bv) in orow.iter_mut().zip(brow) {
                        *o += av * bv;
                    }
                }
            }
        }
    }
}

/// The dtype shared by both operands of a product; torch refuses mixed dtypes there.
fn same_dtype(op: &str, x: &Meta, y: &Meta) -> Result<DType, OpError> {
    if x.dtype != y.dtype {
        return Err(OpError::new(format!(
            "{op}: expected both operands to have the same dtype, got {} and {}",
            x.dtype.torch_name(),
            y.dtype.torch_name()
        )));
    }
    Ok(x.dtype)
}

fn check_rank(op: &str, what: &str, m: &Meta, rank: usize) -> Result<(), OpError> {
    if m.rank() != rank {
        return Err(OpError::new(format!(
            "{op}: {what} must be a {rank}-D tensor, got shape {:?}",
            m.shape
        )));
    }
    Ok(())
}

fn mm_meta(op: &str, x: &Meta, y: &Meta) -> Result<Meta, OpError> {
    check_rank(op, "the first matrix", x, 2)?;
    check_rank(op, "the second matrix", y, 2)?;
    if x.shape[1] != y.shape[0] {
        return Err(OpError::new(format!(
            "{op}: shapes {:?} and {:?} cannot be multiplied",
            x.shape, y.shape
        )));
    }
    Ok(Meta::new(
        same_dtype(op, x, y)?,
        vec![x.shape[0], y.shape[1]],
    ))
}

fn bmm_meta(op: &str, x: &Meta, y: &Meta) -> Result<Meta, OpError> {
    check_rank(op, "batch1", x, 3)?;
    check_rank(op, "batch2", y, 3)?;
    if x.shape[0] != y.shape[0] || x.shape[2] != y.shape[1] {
        return Err(OpError::new(format!(
            "{op}: batches of shapes {:?} and {:?} cannot be multiplied",
            x.shape, y.shape
        )));
    }
    Ok(Meta::new(
        same_dtype(op, x, y)?,
        vec![x.shape[0], x.shape[1], y.shape[2]],
    ))
}

fn infer_mm(a: &Args) -> Result<Vec<Meta>, OpError> {
    Ok(vec![mm_meta("mm", &a.meta("self")?, &a.meta("mat2")?)?])
}

fn infer_bmm(a: &Args) -> Result<Vec<Meta>, OpError> {
    Ok(vec![bmm_meta("bmm", &a.meta("self")?, &a.meta("mat2")?)?])
}

/// `self` of the `add*` products must broadcast to the product's shape without enlarging it.
fn check_addend(op: &str, s: &Meta, out: &Meta) -> Result<(), OpError> {
    match broadcast_shapes(&s.shape, &out.shape) {
        Ok(b) if b == out.shape => Ok(()),
        _ => Err(OpError::new(format!(
            "{op}: self of shape {:?} does not broadcast to the product's shape {:?}",
            s.shape, out.shape
        ))),
    }
}

fn infer_baddbmm(a: &Args) -> Result<Vec<Meta>, OpError> {
    let out = bmm_meta("baddbmm", &a.meta("batch1")?, &a.meta("batch2")?)?;
    check_addend("baddbmm", &a.meta("self")?, &out)?;
    Ok(vec![out])
}

fn infer_addmm(a: &Args) -> Result<Vec<Meta>, OpError> {
    let out = mm_meta("addmm", &a.meta("mat1")?, &a.meta("mat2")?)?;
    check_addend("addmm", &a.meta("self")?, &out)?;
    Ok(vec![out])
}

fn infer_addbmm(a: &Args) -> Result<Vec<Meta>, OpError> {
    let prod = bmm_meta("addbmm", &a.meta("batch1")?, &a.meta("batch2")?)?;
    let out = Meta::new(prod.dtype, prod.shape[1..].to_vec());
    check_addend("addbmm", &a.meta("self")?, &out)?;
    Ok(vec![out])
}

/// The product of two matrices of compatible shapes (checked by inference).
fn matrix_product(x: &Tensor, y: &Tensor) -> Vec<f64> {
    let (n, k, p) = (x.shape()[0], x.shape()[1], y.shape()[1]);
    let mut out = vec![0.0; n * p];
    gemm_acc(&x.data, &y.data, &mut out, n, k, p);
    out
}

/// The product of two 3-D tensors of compatible shapes (checked by inference).
fn batched_product(x: &Tensor, y: &Tensor) -> Vec<f64> {
    let (b, n, k, p) = (x.shape()[0], x.shape()[1], x.shape()[2], y.shape()[2]);
    let mut out = vec![0.0; b * n * p];
    for i in 0..b {
        gemm_acc(
            &x.data[i * n * k..(i + 1) * n * k],
            &y.data[i * k * p..(i + 1) * k * p],
            &mut out[i * n * p..(i + 1) * n * p],
            n,
            k,
            p,
        );
    }
    out
}

/// `beta * self + alpha * prod`. With `beta == 0` torch does not read `self` at all, so NaNs in
/// an uninitialized buffer (Megatron passes `aten.empty` there) do not leak into the result.
fn add_scaled(a: &Args, out: &Meta, mut prod: Vec<f64>) -> Result<Tensor, OpError> {
    let beta = a.float("beta")?;
    let alpha = a.float("alpha")?;
    if alpha != 1.0 {
        prod.iter_mut().for_each(|v| *v *= alpha);
    }
    if beta != 0.0 {
        let s = a.tensor("self")?;
        for (v, i) in prod
            .iter_mut()
            .zip(broadcast_indices(s.shape(), &out.shape))
        {
            *v += beta * s.data[i];
        }
    }
    Ok(Tensor::new(out.clone(), prod))
}

/// How `matmul` maps its operands onto a batched product: `[batch..., n, k] · [batch..., k, p]`
/// after promoting 1-D operands to matrices, with the batch dims broadcast.
struct MatmulPlan {
    out: Meta,
    batch: Vec<usize>,
    a_batch: Vec<usize>,
    b_batch: Vec<usize>,
    n: usize,
    k: usize,
    p: usize,
}

impl MatmulPlan {
    fn new(x: &Meta, y: &Meta) -> Result<MatmulPlan, OpError> {
        let dtype = same_dtype("matmul", x, y)?;
        if x.rank() == 0 || y.rank() == 0 {
            return Err(OpError::new(format!(
                "matmul: both arguments need at least 1 dim, got shapes {:?} and {:?}",
                x.shape, y.shape
            )));
        }
        // A 1-D left operand is a row vector, a 1-D right operand a column vector; the added
        // dim is dropped from the result.
        let xs = if x.rank() == 1 {
            vec![1, x.shape[0]]
        } else {
            x.shape.clone()
        };
        let ys = if y.rank() == 1 {
            vec![y.shape[0], 1]
        } else {
            y.shape.clone()
        };
        let (xr, yr) = (xs.len(), ys.len());
        let (n, k, k2, p) = (xs[xr - 2], xs[xr - 1], ys[yr - 2], ys[yr - 1]);
        if k != k2 {
            return Err(OpError::new(format!(
                "matmul: shapes {:?} and {:?} cannot be multiplied",
                x.shape, y.shape
            )));
        }
        let a_batch = xs[..xr - 2].to_vec();
        let b_batch = ys[..yr - 2].to_vec();
        let batch = broadcast_shapes(&a_batch, &b_batch)
            .map_err(|e| OpError::new(format!("matmul: batch dims: {e}")))?;
        let mut shape = batch.clone();
        if x.rank() > 1 {
            shape.push(n);
        }
        if y.rank() > 1 {
            shape.push(p);
        }
        Ok(MatmulPlan {
            out: Meta::new(dtype, shape),
            batch,
            a_batch,
            b_batch,
            n,
            k,
            p,
        })
    }

    fn run(&self, a: &[f64], b: &[f64]) -> Tensor {
        let (n, k, p) = (self.n, self.k, self.p);
        let ia = broadcast_indices(&self.a_batch, &self.batch);
        let ib = broadcast_indices(&self.b_batch, &self.batch);
        let mut out = vec![0.0; ia.len() * n * p];
        for (j, (&i, &l)) in ia.iter().zip(&ib).enumerate() {
            gemm_acc(
                &a[i * n * k..(i + 1) * n * k],
                &b[l * k * p..(l + 1) * k * p],
                &mut out[j * n * p..(j + 1) * n * p],
                n,
                k,
                p,
            );
        }
        Tensor::new(self.out.clone(), out)
    }
}

/// `linear` is `input · weightᵀ (+ bias)`: the plan of `matmul(input, weight.t())`.
fn linear_plan(input: &Meta, weight: &Meta) -> Result<MatmulPlan, OpError> {
    let wt = match weight.rank() {
        1 => weight.clone(),
        2 => Meta::new(weight.dtype, vec![weight.shape[1], weight.shape[0]]),
        _ => {
            return Err(OpError::new(format!(
                "linear: weight must be 1-D or 2-D, got shape {:?}",
                weight.shape
            )))
        }
    };
    MatmulPlan::new(input, &wt).map_err(|e| OpError::new(e.0.replacen("matmul", "linear", 1)))
}

fn infer_linear(a: &Args) -> Result<Vec<Meta>, OpError> {
    let plan = linear_plan(&a.meta("input")?, &a.meta("weight")?)?;
    if let Some(b) = a.opt_meta("bias")? {
        check_addend("linear", &b, &plan.out)?;
    }
    Ok(vec![plan.out])
}

fn eval_linear(a: &Args, _: &[Meta], _: &mut crate::EvalCtx) -> Result<Vec<Tensor>, OpError> {
    let (x, w) = (a.tensor("input")?, a.tensor("weight")?);
    let plan = linear_plan(&x.meta, &w.meta)?;
    let wt: Vec<f64> = if w.meta.rank() == 2 {
        let (o, i) = (w.shape()[0], w.shape()[1]);
        let mut t = vec![0.0; o * i];
        for r in 0..o {
            for c in 0..i {
                t[c * o + r] = w.data[r * i + c];
            }
        }
        t
    } else {
        w.data.as_ref().clone()
    };
    let mut out = plan.run(&x.data, &wt);
    if let Some(b) = a.opt_tensor("bias")? {
        let data = std::sync::Arc::make_mut(&mut out.data);
        for (v, i) in data
            .iter_mut()
            .zip(broadcast_indices(b.shape(), &plan.out.shape))
        {
            *v += b.data[i];
        }
    }
    Ok(vec![out])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::v;
    use shardproof_ir::Arg;

    fn t(shape: &[usize], data: &[f64]) -> Tensor {
        Tensor::new(Meta::new(DType::F32, shape.to_vec()), data.to_vec())
    }

    fn call(op: &str, ts: &[Tensor], kw: &[(&str, Arg)]) -> Result<Vec<Tensor>, OpError> {
        let args: Vec<Arg> = (0..ts.len()).map(v).collect();
        let kw: Vec<(String, Arg)> = kw.iter().map(|(k, a)| (k.to_string(), a.clone())).collect();
        Registry::builtin().call(op, ts, &args, &kw)
    }

    /// A naive triple loop, the reference for the fast kernels.
    fn naive(a: &[f64], b: &[f64], n: usize, k: usize, p: usize) -> Vec<f64> {
        let mut out = vec![0.0; n * p];
        for i in 0..n {
            for j in 0..p {
                out[i * p + j] = (0..k).map(|l| a[i * k + l] * b[l * p + j]).sum();
            }
        }
        out
    }

    fn ramp(n: usize, scale: f64) -> Vec<f64> {
        (0..n)
            .map(|i| ((i * 7 % 11) as f64 - 5.0) * scale)
            .collect()
    }

    #[test]
    fn mm_matches_hand_values() {
        let a = t(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
        let b = t(&[3, 2], &[7., 8., 9., 10., 11., 12.]);
        let out = call("aten.mm.default", &[a, b], &[]).unwrap();
        assert_eq!(out[0].shape(), &[2, 2]);
        assert_eq!(*out[0].data, vec![58., 64., 139., 154.]);
    }

    #[test]
    fn mm_rejects_bad_shapes_and_dtypes() {
        let a = t(&[2, 3], &[0.; 6]);
        assert!(call("aten.mm.default", &[a.clone(), a.clone()], &[]).is_err());
        let b = Tensor::new(Meta::new(DType::F64, vec![3, 2]), vec![0.; 6]);
        assert!(call("aten.mm.default", &[a, b], &[]).is_err());
    }

    #[test]
    fn bmm_and_baddbmm() {
        let x = t(&[2, 2, 3], &ramp(12, 1.0));
        let y = t(&[2, 3, 4], &ramp(24, 0.5));
        let out = call("aten.bmm.default", &[x.clone(), y.clone()], &[]).unwrap();
        assert_eq!(out[0].shape(), &[2, 2, 4]);
        for b in 0..2 {
            let want = naive(
                &x.data[b * 6..b * 6 + 6],
                &y.data[b * 12..b * 12 + 12],
                2,
                3,
                4,
            );
            assert_eq!(&out[0].data[b * 8..b * 8 + 8], want.as_slice());
        }
        // beta = 0: the NaN buffer must not be read.
        let nan = t(&[2, 2, 4], &[f64::NAN; 16]);
        let kw = [("beta", Arg::Float(0.0)), ("alpha", Arg::Float(0.5))];
        let out2 = call("aten.baddbmm.default", &[nan, x.clone(), y.clone()], &kw).unwrap();
        for (p, q) in out2[0].data.iter().zip(out[0].data.iter()) {
            assert_eq!(*p, 0.5 * q);
        }
        // beta != 0 with a broadcast self.
        let s = t(&[4], &[1., 2., 3., 4.]);
        let kw = [("beta", Arg::Int(2)), ("alpha", Arg::Int(1))];
        let out3 = call("aten.baddbmm.default", &[s, x, y], &kw).unwrap();
        for (i, (p, q)) in out3[0].data.iter().zip(out[0].data.iter()).enumerate() {
            assert_eq!(*p, q + 2.0 * (i % 4 + 1) as f64);
        }
    }

    #[test]
    fn addmm_beta_zero_ignores_nan_and_addbmm_sums_batches() {
        let a = t(&[2, 2], &[1., 2., 3., 4.]);
        let nan = t(&[2, 2], &[f64::NAN; 4]);
        let out = call(
            "aten.addmm.default",
            &[nan, a.clone(), a.clone()],
            &[("beta", Arg::Float(0.0))],
        )
        .unwrap();
        assert_eq!(*out[0].data, vec![7., 10., 15., 22.]);
        let bias = t(&[2], &[1., -1.]);
        let out = call("aten.addmm.default", &[bias, a.clone(), a.clone()], &[]).unwrap();
        assert_eq!(*out[0].data, vec![8., 9., 16., 21.]);
        let batch = t(&[2, 2, 2], &[1., 2., 3., 4., 1., 2., 3., 4.]);
        let zero = t(&[2, 2], &[0.; 4]);
        let out = call("aten.addbmm.default", &[zero, batch.clone(), batch], &[]).unwrap();
        assert_eq!(*out[0].data, vec![14., 20., 30., 44.]);
    }

    #[test]
    fn matmul_rank_cases() {
        let v3 = t(&[3], &[1., 2., 3.]);
        let m23 = t(&[2, 3], &[1., 0., 1., 0., 1., 0.]);
        let m32 = t(&[3, 2], &[1., 2., 3., 4., 5., 6.]);
        let mm = |x: &Tensor, y: &Tensor| call("aten.matmul.default", &[x.clone(), y.clone()], &[]);
        let o = mm(&v3, &v3).unwrap();
        assert_eq!((o[0].shape(), o[0].data[0]), (&[][..], 14.0));
        let o = mm(&m23, &v3).unwrap();
        assert_eq!(
            (o[0].shape(), o[0].data.as_slice()),
            (&[2][..], &[4., 2.][..])
        );
        let o = mm(&v3, &m32).unwrap();
        assert_eq!(
            (o[0].shape(), o[0].data.as_slice()),
            (&[2][..], &[22., 28.][..])
        );
        let o = mm(&m23, &m32).unwrap();
        assert_eq!(*o[0].data, vec![6., 8., 3., 4.]);
        // Broadcast batch dims: [2,1,2,3] · [3,3,2] -> [2,3,2,2].
        let a = t(&[2, 1, 2, 3], &ramp(12, 1.0));
        let b = t(&[3, 3, 2], &ramp(18, 0.25));
        let o = mm(&a, &b).unwrap();
        assert_eq!(o[0].shape(), &[2, 3, 2, 2]);
        for i in 0..2 {
            for j in 0..3 {
                let want = naive(
                    &a.data[i * 6..i * 6 + 6],
                    &b.data[j * 6..j * 6 + 6],
                    2,
                    3,
                    2,
                );
                let at = (i * 3 + j) * 4;
                assert_eq!(&o[0].data[at..at + 4], want.as_slice());
            }
        }
        // Batched matrix times 1-D vector, and 1-D vector times batched matrix.
        let o = mm(&a, &v3).unwrap();
        assert_eq!(o[0].shape(), &[2, 1, 2]);
        let o = mm(&t(&[3], &[1., 1., 1.]), &b).unwrap();
        assert_eq!(o[0].shape(), &[3, 2]);
        assert_eq!(
            &o[0].data[..2],
            &[
                b.data[0] + b.data[2] + b.data[4],
                b.data[1] + b.data[3] + b.data[5]
            ]
        );
        assert!(mm(&m23, &m23).is_err());
        assert!(mm(&t(&[2, 2, 3], &[0.; 12]), &t(&[3, 3, 2], &[0.; 18])).is_err());
    }

    #[test]
    fn linear_with_and_without_bias() {
        let x = t(&[2, 1, 3], &[1., 2., 3., 4., 5., 6.]);
        let w = t(&[2, 3], &[1., 0., 0., 0., 1., 1.]);
        let b = t(&[2], &[10., 20.]);
        let o = call("aten.linear.default", &[x.clone(), w.clone(), b], &[]).unwrap();
        assert_eq!(o[0].shape(), &[2, 1, 2]);
        assert_eq!(*o[0].data, vec![11., 25., 14., 31.]);
        let o = call("aten.linear.default", &[x, w], &[]).unwrap();
        assert_eq!(*o[0].data, vec![1., 5., 4., 11.]);
    }

    #[test]
    fn dot_and_mv() {
        let a = t(&[3], &[1., 2., 3.]);
        let m = t(&[2, 3], &[1., 1., 1., 0., 1., 0.]);
        let o = call("aten.dot.default", &[a.clone(), a.clone()], &[]).unwrap();
        assert_eq!(o[0].data[0], 14.0);
        let o = call("aten.mv.default", &[m, a], &[]).unwrap();
        assert_eq!(*o[0].data, vec![6., 2.]);
    }

    #[test]
    fn tiled_product_matches_naive_past_tile_edges() {
        let (n, k, p) = (3, 300, 517);
        let a = ramp(n * k, 0.5);
        let b = ramp(k * p, 0.25);
        let mut out = vec![0.0; n * p];
        gemm_acc(&a, &b, &mut out, n, k, p);
        assert_eq!(out, naive(&a, &b, n, k, p));
    }

    #[test]
    fn nan_in_operand_propagates_through_zero() {
        let a = t(&[1, 2], &[0., 1.]);
        let b = t(&[2, 1], &[f64::NAN, 1.]);
        let o = call("aten.mm.default", &[a, b], &[]).unwrap();
        assert!(o[0].data[0].is_nan());
    }
}
