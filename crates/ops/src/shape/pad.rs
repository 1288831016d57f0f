//! Ops that fill part of a tensor: `constant_pad_nd`/`pad` (all modes) and `tril`/`triu`.

use crate::tensor::{cast_value, strides};
use crate::{Args, Meta, OpError, Tensor};

pub(super) fn infer_tri(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    if m.rank() < 2 {
        return Err(OpError::new(format!(
            "{}: input tensor must have at least 2 dimensions",
            a.schema().name
        )));
    }
    Ok(vec![m])
}

/// Keeps the elements of the last two dims with `keep(col - row)`, zeroing the others.
pub(super) fn eval_tri(
    a: &Args,
    m: &[Meta],
    keep: fn(i64, i64) -> bool,
) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let k = a.int("diagonal")?;
    let r = t.meta.rank();
    let (rows, cols) = (t.shape()[r - 2], t.shape()[r - 1]);
    let data = t
        .data
        .iter()
        .enumerate()
        .map(|(i, &x)| {
            let (row, col) = ((i / cols) % rows.max(1), i % cols.max(1));
            if keep(col as i64 - row as i64, k) {
                x
            } else {
                0.0
            }
        })
        .collect();
    Ok(vec![Tensor::new(m[0].clone(), data)])
}

/// How `pad` fills the border: with a value, or from the input itself (torch's
/// `reflect`, `replicate` and `circular` modes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PadMode {
    Constant,
    Reflect,
    Replicate,
    Circular,
}

/// A checked padding: the mode, the value of constant padding, and the (left, right) padding
/// of every dim (negative amounts crop).
struct Padding {
    mode: PadMode,
    value: f64,
    pads: Vec<(i64, i64)>,
}

impl Padding {
    /// The padding of a `constant_pad_nd` or `pad` call on a tensor of meta `m`, with torch's
    /// checks.
    fn of(a: &Args, m: &Meta) -> Result<Padding, OpError> {
        let op = &a.schema().name;
        let mode = match a.schema().index_of("mode") {
            None => PadMode::Constant,
            Some(_) => match a.str("mode")?.as_str() {
                "constant" => PadMode::Constant,
                "reflect" => PadMode::Reflect,
                "replicate" => PadMode::Replicate,
                "circular" => PadMode::Circular,
                other => {
                    return Err(OpError::new(format!(
                        "{op}: unrecognised padding mode {other}"
                    )))
                }
            },
        };
        let value = a.opt_float("value")?;
        let pad = a.int_list("pad")?;
        let r = m.rank();
        if pad.len() % 2 != 0 || pad.len() / 2 > r {
            return Err(OpError::new(format!(
                "{op}: padding length must be even and at most twice the rank {r}, got {}",
                pad.len()
            )));
        }
        let k = pad.len() / 2;
        if mode != PadMode::Constant {
            if value.is_some_and(|v| v != 0.0) {
                return Err(OpError::new(format!(
                    "{op}: padding mode {mode:?} doesn't take in value argument"
                )));
            }
            // torch pads the last 1, 2 or 3 dims of a batched or unbatched input only.
            if !(1..=3).contains(&k) || !(k + 1..=k + 2).contains(&r) {
                return Err(OpError::new(format!(
                    "{op}: padding size {} is not supported for {r}D input tensor in mode {mode:?}",
                    pad.len()
                )));
            }
        }
        let mut pads = vec![(0, 0); r];
        for i in 0..k {
            pads[r - 1 - i] = (pad[2 * i], pad[2 * i + 1]);
        }
        for (d, &(lo, hi)) in pads.iter().enumerate().skip(r - k) {
            let n = i64::try_from(m.shape[d]).unwrap_or(i64::MAX);
            let Some(out) = n.checked_add(lo).and_then(|x| x.checked_add(hi)) else {
                return Err(OpError::new(format!(
                    "{op}: padding ({lo}, {hi}) of dim {d} of size {n} overflows"
                )));
            };
            let bad = match mode {
                PadMode::Constant => (out < 0).then_some("resulted in a negative output size"),
                PadMode::Reflect if lo >= n || hi >= n => {
                    Some("should be less than the corresponding input dimension")
                }
                PadMode::Circular if lo > n || hi > n => {
                    Some("causes wrapping around more than once")
                }
                // Wrapping reads the input left after cropping the other side.
                PadMode::Circular
                    if lo.max(hi) > n.saturating_add(lo.min(0)).saturating_add(hi.min(0)) =>
                {
                    Some("wraps around a cropped dimension more than once")
                }
                PadMode::Circular => (out < 0).then_some("resulted in a negative output size"),
                PadMode::Reflect | PadMode::Replicate if n == 0 => {
                    Some("cannot pad an empty dimension")
                }
                PadMode::Reflect | PadMode::Replicate => (out < 1).then_some("leaves no element"),
            };
            if let Some(why) = bad {
                return Err(OpError::new(format!(
                    "{op}: padding ({lo}, {hi}) of dim {d} of size {n} in mode {mode:?} {why}"
                )));
            }
        }
        Ok(Padding {
            mode,
            value: value.unwrap_or(0.0),
            pads,
        })
    }

    /// The output shape for an input of shape `shape`.
    fn shape(&self, shape: &[usize]) -> Vec<usize> {
        shape
            .iter()
            .zip(&self.pads)
            .map(|(&n, &(lo, hi))| (n as i64 + lo + hi) as usize)
            .collect()
    }

    /// The input index that output index `i` of dim `d` (of input size `n`) reads, or `None`
    /// for the value of constant padding.
    fn source(&self, d: usize, i: usize, n: usize) -> Option<usize> {
        let (lo, hi) = self.pads[d];
        let (i, n) = (i as i64, n as i64);
        let j = i - lo;
        let j = match self.mode {
            PadMode::Constant => return (0..n).contains(&j).then_some(j as usize),
            PadMode::Replicate => j.clamp(0, n - 1),
            PadMode::Reflect if j < 0 => -j,
            PadMode::Reflect if j >= n => 2 * (n - 1) - j,
            PadMode::Reflect => j,
            PadMode::Circular => {
                let crop = (-lo).max(0);
                let kept = n - crop - (-hi).max(0);
                crop + (i - lo.max(0)).rem_euclid(kept)
            }
        };
        Some(j as usize)
    }
}

pub(super) fn infer_pad(a: &Args) -> Result<Vec<Meta>, OpError> {
    let m = a.meta("self")?;
    let shape = Padding::of(a, &m)?.shape(&m.shape);
    Ok(vec![Meta::new(m.dtype, shape)])
}

pub(super) fn eval_pad(a: &Args, m: &[Meta]) -> Result<Vec<Tensor>, OpError> {
    let t = a.tensor("self")?;
    let padding = Padding::of(a, &t.meta)?;
    let v = cast_value(padding.value, m[0].dtype);
    let out_shape = &m[0].shape;
    let ist = strides(t.shape());
    let mut data = Vec::with_capacity(m[0].numel());
    let mut idx = vec![0usize; out_shape.len()];
    for _ in 0..m[0].numel() {
        let mut src = Some(0usize);
        for (d, &i) in idx.iter().enumerate() {
            match padding.source(d, i, t.shape()[d]) {
                Some(j) => src = src.map(|s| s + j * ist[d]),
                None => {
                    src = None;
                    break;
                }
            }
        }
        data.push(src.map_or(v, |s| t.data[s]));
        for d in (0..out_shape.len()).rev() {
            idx[d] += 1;
            if idx[d] < out_shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    Ok(vec![Tensor::new(m[0].clone(), data)])
}
