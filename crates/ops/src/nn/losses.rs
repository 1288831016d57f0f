//! Losses: `nll_loss` forward and backward and the other criteria the captured programs use,
//! with torch's `Reduction` semantics.

use super::{checked_index, err, require_float, require_index};
use crate::util::{broadcast_indices, broadcast_shapes, result_dtype};
use crate::{Args, Meta, OpError, Registry, Tensor};

/// torch's `Reduction` enum.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reduction {
    None,
    Mean,
    Sum,
}

fn reduction(a: &Args) -> Result<Reduction, OpError> {
    // The schema default `Mean` is not an int literal; an absent value means Mean.
    match a.opt_int("reduction")?.unwrap_or(1) {
        0 => Ok(Reduction::None),
        1 => Ok(Reduction::Mean),
        2 => Ok(Reduction::Sum),
        r => err(format!("invalid reduction {r} (expected 0, 1 or 2)")),
    }
}

/// Checked shapes of an nll_loss call: (batch size, classes, whether there is a batch dim).
fn nll_shapes(a: &Args) -> Result<(usize, usize, bool), OpError> {
    let op = "nll_loss";
    let (x, t) = (a.meta("self")?, a.meta("target")?);
    require_index(op, "target", &t)?;
    let (n, c, batched) = match (x.rank(), t.rank()) {
        (1, 0) => (1, x.shape[0], false),
        (2, 1) if x.shape[0] == t.shape[0] => (x.shape[0], x.shape[1], true),
        _ => {
            return err(format!(
                "{op}: input {:?} and target {:?} should be [N, C] and [N], or [C] and []",
                x.shape, t.shape
            ))
        }
    };
    if let Some(w) = a.opt_meta("weight")? {
        if w.rank() != 1 || w.shape[0] != c {
            return err(format!(
                "{op}: weight should have {c} elements, got shape {:?}",
                w.shape
            ));
        }
    }
    Ok((n, c, batched))
}

/// Per-sample (class, weight) pairs; `None` for ignored samples.
fn nll_targets(a: &Args, n: usize, c: usize) -> Result<Vec<Option<(usize, f64)>>, OpError> {
    let t = a.tensor("target")?;
    let w = a.opt_tensor("weight")?;
    let ignore = a.int("ignore_index")?;
    (0..n)
        .map(|i| {
            let ti = t.data[i];
            if ti == ignore as f64 {
                return Ok(None);
            }
            let cls = checked_index("nll_loss", ti, c)?;
            Ok(Some((cls, w.map_or(1.0, |w| w.data[cls]))))
        })
        .collect()
}

pub(super) fn register_losses(r: &mut Registry) {
    r.pure(
        "aten.nll_loss_forward.default",
        "nll_loss_forward(Tensor self, Tensor target, Tensor? weight, int reduction, SymInt ignore_index) -> (Tensor output, Tensor total_weight)",
        |a| {
            let (n, _, batched) = nll_shapes(a)?;
            let x = a.meta("self")?;
            require_float("nll_loss", &x)?;
            let shape = if reduction(a)? == Reduction::None && batched {
                vec![n]
            } else {
                vec![]
            };
            Ok(vec![Meta::new(x.dtype, shape), Meta::new(x.dtype, vec![])])
        },
        |a, m, _| {
            let (n, c, batched) = nll_shapes(a)?;
            let x = a.tensor("self")?;
            let red = reduction(a)?;
            let targets = nll_targets(a, n, c)?;
            let terms: Vec<f64> = targets
                .iter()
                .enumerate()
                .map(|(i, t)| t.map_or(0.0, |(cls, w)| -w * x.data[i * c + cls]))
                .collect();
            let total: f64 = targets.iter().flatten().map(|&(_, w)| w).sum();
            if red == Reduction::None && batched {
                // torch leaves total_weight at 0 without reduction.
                return Ok(vec![
                    Tensor::new(m[0].clone(), terms),
                    Tensor::new(m[1].clone(), vec![0.0]),
                ]);
            }
            let sum: f64 = terms.iter().sum();
            let out = if red == Reduction::Mean { sum / total } else { sum };
            Ok(vec![
                Tensor::new(m[0].clone(), vec![out]),
                Tensor::new(m[1].clone(), vec![total]),
            ])
        },
    );
    r.pure(
        "aten.nll_loss_backward.default",
        "nll_loss_backward(Tensor grad_output, Tensor self, Tensor target, Tensor? weight, int reduction, SymInt ignore_index, Tensor total_weight) -> Tensor",
        |a| {
            let (n, _, batched) = nll_shapes(a)?;
            let g = a.meta("grad_output")?;
            let want = if reduction(a)? == Reduction::None && batched { n } else { 1 };
            if g.numel() != want || a.meta("total_weight")?.numel() != 1 {
                return err(format!(
                    "nll_loss_backward: grad_output should have {want} elements and total_weight one, got {:?}",
                    g.shape
                ));
            }
            Ok(vec![a.meta("self")?])
        },
        |a, m, _| {
            let (n, c, batched) = nll_shapes(a)?;
            let g = a.tensor("grad_output")?;
            let red = reduction(a)?;
            let tw = a.tensor("total_weight")?.data[0];
            let mut out = vec![0.0; m[0].numel()];
            for (i, t) in nll_targets(a, n, c)?.into_iter().enumerate() {
                if let Some((cls, w)) = t {
                    let gi = match red {
                        Reduction::None if batched => g.data[i],
                        Reduction::Mean => g.data[0] / tw,
                        _ => g.data[0],
                    };
                    out[i * c + cls] = -w * gi;
                }
            }
            Ok(vec![Tensor::new(m[0].clone(), out)])
        },
    );
    r.pure(
        "aten.mse_loss.default",
        "mse_loss(Tensor self, Tensor target, int reduction=Mean) -> Tensor",
        |a| {
            let (x, y) = (a.meta("self")?, a.meta("target")?);
            let shape = broadcast_shapes(&x.shape, &y.shape)?;
            let shape = if reduction(a)? == Reduction::None {
                shape
            } else {
                vec![]
            };
            Ok(vec![Meta::new(result_dtype(&x, &y), shape)])
        },
        |a, m, _| {
            let (x, y) = (a.tensor("self")?, a.tensor("target")?);
            let shape = broadcast_shapes(x.shape(), y.shape())?;
            let bm = Meta::new(m[0].dtype, shape);
            let sq = crate::util::zip_broadcast(x, y, &bm, |p, q| (p - q) * (p - q));
            Ok(vec![match reduction(a)? {
                Reduction::None => sq,
                red => {
                    let s: f64 = sq.data.iter().sum();
                    let v = if red == Reduction::Mean {
                        s / sq.numel() as f64
                    } else {
                        s
                    };
                    Tensor::new(m[0].clone(), vec![v])
                }
            }])
        },
    );
    r.pure(
        "aten.mse_loss_backward.default",
        "mse_loss_backward(Tensor grad_output, Tensor self, Tensor target, int reduction) -> Tensor",
        |a| {
            let x = a.meta("self")?;
            for other in ["grad_output", "target"] {
                let o = a.meta(other)?;
                if broadcast_shapes(&o.shape, &x.shape).ok().as_ref() != Some(&x.shape) {
                    return err(format!(
                        "mse_loss_backward: {other} of shape {:?} does not broadcast to self {:?}",
                        o.shape, x.shape
                    ));
                }
            }
            reduction(a)?;
            Ok(vec![x])
        },
        |a, m, _| {
            let (g, x, y) = (a.tensor("grad_output")?, a.tensor("self")?, a.tensor("target")?);
            let norm = if reduction(a)? == Reduction::Mean {
                2.0 / x.numel() as f64
            } else {
                2.0
            };
            let ig = broadcast_indices(g.shape(), x.shape());
            let iy = broadcast_indices(y.shape(), x.shape());
            let out = x
                .data
                .iter()
                .zip(ig.iter().zip(&iy))
                .map(|(&xv, (&i, &j))| norm * (xv - y.data[j]) * g.data[i])
                .collect();
            Ok(vec![Tensor::new(m[0].clone(), out)])
        },
    );
}
