//! Random operators: dropout, `rand`, `randn`, `bernoulli`.
//!
//! Draws are deterministic functions of [`EvalCtx::call_seed`], so a replay of a run gives the
//! same masks. They cannot equal torch's own draws (Philox on CUDA); verification relates
//! random ops across programs by their seeds, not by their values.

use crate::{Args, EvalCtx, Meta, OpClass, OpError, Registry, Tensor};
use shardproof_ir::DType;

/// Registers the random family.
pub(crate) fn register(r: &mut Registry) {
    r.add(
        "aten.native_dropout.default",
        "native_dropout(Tensor input, float p, bool? train) -> (Tensor, Tensor)",
        OpClass::Random,
        |a| {
            let x = a.meta("input")?;
            dropout_p(a)?;
            Ok(vec![x.clone(), Meta::new(DType::Bool, x.shape)])
        },
        Some(|a, m, ctx| {
            let x = a.tensor("input")?;
            let (out, mask) = dropout(x, dropout_p(a)?, train(a)?, ctx);
            Ok(vec![
                Tensor::new(m[0].clone(), out),
                Tensor::new(m[1].clone(), mask),
            ])
        }),
    );
    r.add(
        "aten.dropout.default",
        "dropout(Tensor input, float p, bool train) -> Tensor",
        OpClass::Random,
        |a| {
            dropout_p(a)?;
            Ok(vec![a.meta("input")?])
        },
        Some(|a, m, ctx| {
            let x = a.tensor("input")?;
            let (out, _) = dropout(x, dropout_p(a)?, train(a)?, ctx);
            Ok(vec![Tensor::new(m[0].clone(), out)])
        }),
    );
    r.pure(
        "aten.native_dropout_backward.default",
        "native_dropout_backward(Tensor grad_output, Tensor mask, float scale) -> Tensor",
        |a| {
            let (g, mask) = (a.meta("grad_output")?, a.meta("mask")?);
            if g.shape != mask.shape {
                return Err(OpError::new(format!(
                    "native_dropout_backward: grad_output {:?} and mask {:?} differ in shape",
                    g.shape, mask.shape
                )));
            }
            Ok(vec![g])
        },
        |a, m, _| {
            let (g, mask) = (a.tensor("grad_output")?, a.tensor("mask")?);
            let scale = a.float("scale")?;
            let out = g
                .data
                .iter()
                .zip(mask.data.iter())
                .map(|(&gv, &mv)| gv * mv * scale)
                .collect();
            Ok(vec![Tensor::new(m[0].clone(), out)])
        },
    );
    r.add(
        "aten.rand.default",
        "rand(SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor",
        OpClass::Random,
        infer_sized,
        Some(eval_uniform),
    );
    r.add(
        "aten.randn.default",
        "randn(SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor",
        OpClass::Random,
        infer_sized,
        Some(eval_normal),
    );
    r.add(
        "aten.rand_like.default",
        "rand_like(Tensor self, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None, MemoryFormat? memory_format=None) -> Tensor",
        OpClass::Random,
        infer_like,
        Some(eval_uniform),
    );
    r.add(
        "aten.randn_like.default",
        "randn_like(Tensor self, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None, MemoryFormat? memory_format=None) -> Tensor",
        OpClass::Random,
        infer_like,
        Some(eval_normal),
    );
    r.add(
        "aten.bernoulli.p",
        "bernoulli.p(Tensor self, float p, *, Generator? generator=None) -> Tensor",
        OpClass::Random,
        |a| {
            let p = a.float("p")?;
            if !(0.0..=1.0).contains(&p) {
                return Err(OpError::new(format!(
                    "bernoulli: p must be in [0, 1], got {p}"
                )));
            }
            Ok(vec![a.meta("self")?])
        },
        Some(|a, m, ctx| {
            let p = a.float("p")?;
            let mut rng = Rng::new(ctx.call_seed());
            Ok(vec![fill(&m[0], || (rng.uniform() < p) as i64 as f64)])
        }),
    );
}

fn dropout_p(a: &Args) -> Result<f64, OpError> {
    let p = a.float("p")?;
    if !(0.0..=1.0).contains(&p) {
        return Err(OpError::new(format!(
            "dropout probability has to be between 0 and 1, but got {p}"
        )));
    }
    Ok(p)
}

/// `train=None` means training, as in torch's `native_dropout`.
fn train(a: &Args) -> Result<bool, OpError> {
    match a.get("train") {
        None => Ok(true),
        Some(_) => a.bool("train"),
    }
}

/// torch's dropout: outside training the input and an all-true mask; in training a mask drawn
/// with keep probability `1 - p` and `input * mask * (1 / (1 - p))` (scale 0 when `p == 1`, so
/// NaN inputs stay NaN, as in torch).
fn dropout(x: &Tensor, p: f64, train: bool, ctx: &EvalCtx) -> (Vec<f64>, Vec<f64>) {
    if !train {
        return (x.data.as_ref().clone(), vec![1.0; x.numel()]);
    }
    let keep = 1.0 - p;
    let scale = if keep == 0.0 { 0.0 } else { 1.0 / keep };
    let mut rng = Rng::new(ctx.call_seed());
    let mask: Vec<f64> = (0..x.numel())
        .map(|_| (rng.uniform() < keep) as i64 as f64)
        .collect();
    let out = x
        .data
        .iter()
        .zip(&mask)
        .map(|(&v, &m)| v * m * scale)
        .collect();
    (out, mask)
}

fn float_dtype(op: &str, d: Option<DType>, default: DType) -> Result<DType, OpError> {
    let d = d.unwrap_or(default);
    if !d.is_float() {
        return Err(OpError::new(format!(
            "{op}: expected a floating-point dtype, got {}",
            d.torch_name()
        )));
    }
    Ok(d)
}

fn infer_sized(a: &Args) -> Result<Vec<Meta>, OpError> {
    let size = a.int_list("size")?;
    if size.iter().any(|&d| d < 0) {
        return Err(OpError::new(format!("rand: negative size {size:?}")));
    }
    // torch's default dtype.
    let dtype = float_dtype("rand", a.dtype("dtype")?, DType::F32)?;
    Ok(vec![Meta::new(
        dtype,
        size.iter().map(|&d| d as usize).collect(),
    )])
}

fn infer_like(a: &Args) -> Result<Vec<Meta>, OpError> {
    let x = a.meta("self")?;
    let dtype = float_dtype("rand_like", a.dtype("dtype")?, x.dtype)?;
    Ok(vec![Meta::new(dtype, x.shape)])
}

fn fill(meta: &Meta, mut f: impl FnMut() -> f64) -> Tensor {
    Tensor::new(meta.clone(), (0..meta.numel()).map(|_| f()).collect())
}

/// `rand`, `rand_like`: uniform on [0, 1), seeded by the call.
fn eval_uniform(_: &Args, m: &[Meta], ctx: &mut EvalCtx) -> Result<Vec<Tensor>, OpError> {
    let mut rng = Rng::new(ctx.call_seed());
    Ok(vec![fill(&m[0], || rng.uniform())])
}

/// `randn`, `randn_like`: standard normal, seeded by the call.
fn eval_normal(_: &Args, m: &[Meta], ctx: &mut EvalCtx) -> Result<Vec<Tensor>, OpError> {
    let mut rng = Rng::new(ctx.call_seed());
    Ok(vec![fill(&m[0], || rng.normal())])
}

/// SplitMix64: tiny, fast and the same on every platform and Rust version, which is all the
/// interpreter needs (statistical quality beyond that is irrelevant for masks).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1) with 53 random bits.
    fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Standard normal by Box-Muller (one draw per pair of uniforms keeps it stateless).
    fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform(); // in (0, 1]: ln stays finite
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::v;
    use shardproof_ir::Arg;

    fn eval(op: &str, ts: &[Tensor], args: &[Arg], seed: u64, key: &str) -> Vec<Tensor> {
        let r = Registry::builtin();
        let def = r.get(&shardproof_ir::OpName::parse(op).unwrap()).unwrap();
        let mut ctx = EvalCtx {
            seed,
            call_key: key.to_string(),
        };
        r.eval(def, args, &[], &crate::TensorList(ts), &mut ctx)
            .unwrap()
    }

    fn input(n: usize) -> Tensor {
        Tensor::new(
            Meta::new(DType::F32, vec![n]),
            (0..n).map(|i| i as f64 + 1.0).collect(),
        )
    }

    #[test]
    fn dropout_is_deterministic_per_seed_and_scales() {
        let x = input(4000);
        let args = [v(0), Arg::Float(0.25), Arg::Bool(true)];
        let a = eval(
            "aten.native_dropout.default",
            std::slice::from_ref(&x),
            &args,
            7,
            "n1",
        );
        let b = eval(
            "aten.native_dropout.default",
            std::slice::from_ref(&x),
            &args,
            7,
            "n1",
        );
        let c = eval(
            "aten.native_dropout.default",
            std::slice::from_ref(&x),
            &args,
            8,
            "n1",
        );
        let d = eval(
            "aten.native_dropout.default",
            std::slice::from_ref(&x),
            &args,
            7,
            "n2",
        );
        assert_eq!(a, b);
        assert_ne!(a[1], c[1]);
        assert_ne!(a[1], d[1]);
        assert_eq!(a[1].dtype(), DType::Bool);
        let kept = a[1].data.iter().filter(|&&m| m == 1.0).count() as f64 / 4000.0;
        assert!((kept - 0.75).abs() < 0.03, "kept fraction {kept}");
        for ((&o, &m), &xv) in a[0].data.iter().zip(a[1].data.iter()).zip(x.data.iter()) {
            assert_eq!(o, if m == 1.0 { xv * (1.0 / 0.75) } else { 0.0 });
        }
        // The composite op draws the same mask for the same call.
        let e = eval(
            "aten.dropout.default",
            std::slice::from_ref(&x),
            &args,
            7,
            "n1",
        );
        assert_eq!(e[0], a[0]);
        // Backward applies the mask and scale.
        let g = eval(
            "aten.native_dropout_backward.default",
            &[x.clone(), a[1].clone()],
            &[v(0), v(1), Arg::Float(1.0 / 0.75)],
            0,
            "b",
        );
        assert_eq!(g[0], a[0]);
    }

    #[test]
    fn dropout_outside_training_or_with_p_zero_is_identity() {
        let x = input(50);
        for args in [
            [v(0), Arg::Float(0.5), Arg::Bool(false)],
            [v(0), Arg::Float(0.0), Arg::Bool(true)],
        ] {
            let o = eval(
                "aten.native_dropout.default",
                std::slice::from_ref(&x),
                &args,
                1,
                "k",
            );
            assert_eq!(o[0].data, x.data);
            assert!(o[1].data.iter().all(|&m| m == 1.0));
        }
        let o = eval(
            "aten.native_dropout.default",
            std::slice::from_ref(&x),
            &[v(0), Arg::Float(1.0), Arg::None],
            1,
            "k",
        );
        assert!(o[0].data.iter().all(|&v| v == 0.0));
        assert!(o[1].data.iter().all(|&m| m == 0.0));
        let r = Registry::builtin();
        assert!(r
            .call(
                "aten.native_dropout.default",
                &[x],
                &[v(0), Arg::Float(1.5), Arg::Bool(true)],
                &[]
            )
            .is_err());
    }

    #[test]
    fn rand_randn_bernoulli() {
        let size = Arg::List(vec![Arg::Int(100), Arg::Int(50)]);
        let u = eval(
            "aten.rand.default",
            &[],
            std::slice::from_ref(&size),
            3,
            "r",
        );
        assert_eq!((u[0].shape(), u[0].dtype()), (&[100, 50][..], DType::F32));
        assert!(u[0].data.iter().all(|&x| (0.0..1.0).contains(&x)));
        let n = eval("aten.randn.default", &[], &[size], 3, "r");
        let mean = n[0].data.iter().sum::<f64>() / 5000.0;
        let var = n[0].data.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 5000.0;
        assert!(mean.abs() < 0.05 && (var - 1.0).abs() < 0.1, "{mean} {var}");
        let x = input(1000);
        let l = eval(
            "aten.randn_like.default",
            std::slice::from_ref(&x),
            &[v(0)],
            3,
            "r",
        );
        assert_eq!(l[0].meta, x.meta);
        let l = eval(
            "aten.rand_like.default",
            std::slice::from_ref(&x),
            &[v(0)],
            3,
            "r",
        );
        assert_eq!(l[0].meta, x.meta);
        let b = eval("aten.bernoulli.p", &[x], &[v(0), Arg::Float(0.3)], 3, "r");
        let ones = b[0].data.iter().filter(|&&v| v == 1.0).count();
        assert!((250..350).contains(&ones), "{ones}");
        assert!(b[0].data.iter().all(|&v| v == 0.0 || v == 1.0));
    }
}
