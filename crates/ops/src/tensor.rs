//! Dense tensors of the reference interpreter.
//!
//! Every element is stored as an `f64`, whatever the declared dtype: f64 is the exact reference,
//! narrower float types are emulated by rounding ([`round_to`]), integers up to 2^53 are exact.

use shardproof_ir::{DType, TensorType};
use std::sync::Arc;

/// Shape and dtype of a tensor with concrete sizes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Meta {
    /// Element type.
    pub dtype: DType,
    /// Sizes, outermost first.
    pub shape: Vec<usize>,
}

impl Meta {
    /// A meta with the given dtype and shape.
    pub fn new(dtype: DType, shape: Vec<usize>) -> Self {
        Meta { dtype, shape }
    }

    /// Number of elements, saturating at `usize::MAX` when the product of the sizes overflows
    /// (such a tensor can never be allocated; see [`Meta::checked_numel`]).
    pub fn numel(&self) -> usize {
        self.checked_numel().unwrap_or(usize::MAX)
    }

    /// Number of elements, or `None` when the product of the sizes overflows `usize`.
    pub fn checked_numel(&self) -> Option<usize> {
        checked_numel(&self.shape)
    }

    /// Bytes the interpreter needs to hold this tensor (every element is stored as an `f64`,
    /// 8 bytes, whatever the dtype), or `None` when that overflows `u64`.
    pub fn storage_bytes(&self) -> Option<u64> {
        (self.checked_numel()? as u64).checked_mul(8)
    }

    /// Bytes of this tensor at its declared dtype (what the captured program holds), or `None`
    /// when that overflows `u64`.
    pub fn dtype_bytes(&self) -> Option<u64> {
        (self.checked_numel()? as u64).checked_mul(self.dtype.size_bytes() as u64)
    }

    /// Number of dims.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Converts a recorded IR type; `None` when a dim is symbolic or negative.
    pub fn from_type(t: &TensorType) -> Option<Meta> {
        let shape = t.concrete_shape()?;
        if shape.iter().any(|&d| d < 0) {
            return None;
        }
        Some(Meta::new(
            t.dtype,
            shape.iter().map(|&d| d as usize).collect(),
        ))
    }

    /// The IR type of this meta.
    pub fn to_type(&self) -> TensorType {
        let shape: Vec<i64> = self.shape.iter().map(|&d| d as i64).collect();
        TensorType::new(self.dtype, &shape)
    }
}

/// The product of `shape`, or `None` when it overflows `usize`.
pub fn checked_numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

/// Row-major strides (in elements) for `shape`. Strides saturate at `usize::MAX` when the
/// shape's element count overflows (no tensor of such a shape can exist, so they are never used
/// to index one).
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1].saturating_mul(shape[i + 1]);
    }
    s
}

/// A dense, contiguous, row-major tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    /// Shape and declared dtype.
    pub meta: Meta,
    /// Elements in row-major order (shared so views and detaches are free).
    pub data: Arc<Vec<f64>>,
}

impl Tensor {
    /// A tensor from its meta and data; the data length must equal the element count.
    pub fn new(meta: Meta, data: Vec<f64>) -> Self {
        debug_assert_eq!(meta.numel(), data.len());
        Tensor {
            meta,
            data: Arc::new(data),
        }
    }

    /// A tensor of `dtype` and `shape` with every element `value`.
    pub fn full(dtype: DType, shape: Vec<usize>, value: f64) -> Self {
        let meta = Meta::new(dtype, shape);
        let n = meta.numel();
        Tensor::new(meta, vec![value; n])
    }

    /// A scalar (0-d) tensor.
    pub fn scalar(dtype: DType, value: f64) -> Self {
        Tensor::new(Meta::new(dtype, vec![]), vec![value])
    }

    /// The declared dtype.
    pub fn dtype(&self) -> DType {
        self.meta.dtype
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.meta.shape
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.data.len()
    }

    /// The same data with another shape (same element count).
    pub fn reshaped(&self, shape: Vec<usize>) -> Tensor {
        debug_assert_eq!(shape.iter().product::<usize>(), self.numel());
        Tensor {
            meta: Meta::new(self.meta.dtype, shape),
            data: self.data.clone(),
        }
    }

    /// The same values converted to `dtype` with torch's cast semantics (integers truncated
    /// toward zero and wrapped, bools as `x != 0`). Float targets are not rounded here: the
    /// interpreter rounds every output to the precision of the run, so an f64 reference run
    /// stays exact across `_to_copy(dtype=torch.float16)`.
    pub fn cast(&self, dtype: DType) -> Tensor {
        let data = self.data.iter().map(|&x| cast_value(x, dtype)).collect();
        Tensor::new(Meta::new(dtype, self.meta.shape.clone()), data)
    }

    /// The element at a multi-index.
    pub fn at(&self, index: &[usize]) -> f64 {
        let st = strides(self.shape());
        self.data[index.iter().zip(&st).map(|(i, s)| i * s).sum::<usize>()]
    }
}

/// Converts one value to `dtype` with torch's cast semantics; float targets keep the value
/// (see [`Tensor::cast`]).
pub fn cast_value(x: f64, dtype: DType) -> f64 {
    match dtype {
        DType::Bool => (x != 0.0) as i64 as f64,
        d if d.is_int() => {
            if !x.is_finite() {
                return 0.0;
            }
            let t = x.trunc();
            let bits = (d.size_bytes() * 8) as u32;
            if d == DType::U8 {
                (t as i64).rem_euclid(256) as f64
            } else if bits >= 53 {
                t
            } else {
                let m = 1i64 << bits;
                let v = (t as i64).rem_euclid(m);
                (if v >= m / 2 { v - m } else { v }) as f64
            }
        }
        _ => x,
    }
}

/// Rounds a value to the nearest representable value of a float dtype (round half to even).
/// Non-float dtypes return `x` unchanged.
pub fn round_to(x: f64, dtype: DType) -> f64 {
    match dtype {
        DType::F64 => x,
        DType::F32 => x as f32 as f64,
        DType::Bf16 => half::bf16::from_f64(x).to_f64(),
        DType::F16 => half::f16::from_f64(x).to_f64(),
        DType::F8e4m3 => round_fp8(x, 4, 3, 448.0, false),
        DType::F8e5m2 => round_fp8(x, 5, 2, 57344.0, true),
        _ => x,
    }
}

/// Rounds to an 8-bit float with `exp_bits` exponent and `man_bits` mantissa bits.
///
/// Written by hand because the `half` crate has no FP8 and the FP8 crates only cover the
/// conversions we need here with an extra dependency. Values above `max` become infinity when the
/// format has infinities (E5M2) and NaN otherwise (E4M3FN), as torch's casts do.
fn round_fp8(x: f64, exp_bits: i32, man_bits: i32, max: f64, has_inf: bool) -> f64 {
    if !x.is_finite() {
        return if x.is_nan() || !has_inf { f64::NAN } else { x };
    }
    if x == 0.0 {
        return x;
    }
    let bias = (1 << (exp_bits - 1)) - 1;
    let min_exp = 1 - bias;
    let a = x.abs();
    let e = (a.log2().floor() as i32).max(min_exp);
    let quantum = 2f64.powi(e - man_bits);
    let q = a / quantum;
    let mut r = q.round();
    if (q - q.trunc() - 0.5).abs() < f64::EPSILON && r % 2.0 != 0.0 {
        r -= 1.0;
    }
    let v = r * quantum;
    // Values past the largest finite number round to it up to half a quantum above, then overflow.
    let overflow = max + 2f64.powi((max.log2().floor() as i32) - man_bits) / 2.0;
    let out = if v > max {
        if a >= overflow {
            if has_inf {
                f64::INFINITY
            } else {
                f64::NAN
            }
        } else {
            max
        }
    } else {
        v
    };
    out.copysign(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_rounding_matches_known_values() {
        assert_eq!(round_to(1.0, DType::F8e4m3), 1.0);
        assert_eq!(round_to(448.0, DType::F8e4m3), 448.0);
        assert!(round_to(1000.0, DType::F8e4m3).is_nan());
        assert_eq!(round_to(1.0625, DType::F8e4m3), 1.0); // tie to even
        assert_eq!(round_to(1.1875, DType::F8e4m3), 1.25);
        assert_eq!(round_to(57344.0, DType::F8e5m2), 57344.0);
        assert_eq!(round_to(1e6, DType::F8e5m2), f64::INFINITY);
        assert_eq!(round_to(-0.3, DType::F8e5m2), -0.3125);
        // Smallest subnormal of E4M3 is 2^-9.
        assert_eq!(round_to(2f64.powi(-9), DType::F8e4m3), 2f64.powi(-9));
    }

    #[test]
    fn integer_casts_truncate_and_wrap() {
        assert_eq!(cast_value(-2.7, DType::I64), -2.0);
        assert_eq!(cast_value(300.0, DType::U8), 44.0);
        assert_eq!(cast_value(200.0, DType::I8), -56.0);
        assert_eq!(cast_value(0.5, DType::Bool), 1.0);
    }
}
