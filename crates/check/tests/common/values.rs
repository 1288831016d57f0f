//! Random tensors and value comparisons for the property tests against the interpreter.

#![allow(dead_code)]

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use shardproof_ir::DType;
use shardproof_ops::{Meta, Tensor};

/// A float64 tensor of `shape` with entries drawn uniformly from [-1, 1).
pub fn random(shape: &[usize], rng: &mut ChaCha8Rng) -> Tensor {
    let n = shape.iter().product();
    Tensor::new(
        Meta::new(DType::F64, shape.to_vec()),
        (0..n).map(|_| rng.random_range(-1.0..1.0)).collect(),
    )
}

/// Concatenates row-major tensors of `shape` along `d`.
pub fn concat(parts: &[Vec<f64>], shape: &[usize], d: usize) -> Vec<f64> {
    let outer: usize = shape[..d].iter().product();
    let inner: usize = shape[d..].iter().product();
    let mut out = Vec::with_capacity(parts.len() * outer * inner);
    for o in 0..outer {
        for p in parts {
            out.extend_from_slice(&p[o * inner..(o + 1) * inner]);
        }
    }
    out
}

/// Equal lengths and every pair within 1e-9, relative to the expected value.
pub fn close(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| (x - y).abs() <= 1e-9 * (1.0 + y.abs()))
}
