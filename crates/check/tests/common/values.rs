//! Random tensors and value comparisons for the property tests against the interpreter.

#![allow(dead_code)]

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use shardproof_ir::DType;
use shardproof_ops::{Meta, Tensor};

/// The fx type annotation of a float64 tensor of `shape`.
pub fn ty(shape: &[usize]) -> String {
    format!("\"f64{shape:?}\"")
}

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

/// How the pieces along one mesh dim make up the tensor.
#[derive(Clone, Copy, Debug)]
pub enum Make {
    /// Every coordinate holds the same piece.
    Same,
    /// Dim d in k blocks, each the concatenation of the coordinates' pieces.
    Cat(usize, usize),
    /// The pieces sum to the tensor.
    Sum,
}

/// Assembles the ranks' values (row-major mesh, `mesh` sizes) into one tensor, mesh dims
/// applied in mesh order (the first the outermost: DTensor's); `Err` when a `Same` mesh dim's
/// pieces differ.
pub fn assemble(
    values: &[Vec<f64>],
    shape: &[usize],
    mesh: &[usize],
    makes: &[Make],
) -> Result<(Vec<f64>, Vec<usize>), String> {
    let mut cur: Vec<(Vec<f64>, Vec<usize>)> =
        values.iter().map(|v| (v.clone(), shape.to_vec())).collect();
    // Innermost mesh dim first: consecutive groups of `n` entries differ only in it.
    for m in (0..mesh.len()).rev() {
        let n = mesh[m];
        let mut next = Vec::new();
        for group in cur.chunks(n) {
            let (first, sh) = &group[0];
            next.push(match makes[m] {
                Make::Same => {
                    if group.iter().any(|(v, _)| !close(v, first)) {
                        return Err(format!("the pieces along mesh dim {m} differ"));
                    }
                    (first.clone(), sh.clone())
                }
                Make::Sum => (
                    (0..first.len())
                        .map(|k| group.iter().map(|(v, _)| v[k]).sum())
                        .collect(),
                    sh.clone(),
                ),
                Make::Cat(d, k) => {
                    let mut split = sh.clone();
                    if split[d] % k != 0 {
                        return Err(format!("dim {d} of {sh:?} is not {k} blocks"));
                    }
                    split[d] /= k;
                    split.insert(d, k);
                    let parts: Vec<Vec<f64>> = group.iter().map(|(v, _)| v.clone()).collect();
                    let mut out = sh.clone();
                    out[d] *= n;
                    (concat(&parts, &split, d + 1), out)
                }
            });
        }
        cur = next;
    }
    Ok(cur.swap_remove(0))
}
