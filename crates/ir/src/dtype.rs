//! Element types of tensors.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The element type of a tensor.
///
/// Names follow the short forms torch.fx prints in type annotations (`f32`, `bf16`, `b8`, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DType {
    /// IEEE double; the exact reference of the interpreter.
    F64,
    /// IEEE single.
    F32,
    /// bfloat16 (8 exponent bits, 7 mantissa bits).
    Bf16,
    /// IEEE half.
    F16,
    /// FP8 E4M3 ("fn" variant: no infinities, max 448).
    F8e4m3,
    /// FP8 E5M2 (IEEE-like, max 57344).
    F8e5m2,
    /// 64-bit signed integer.
    I64,
    /// 32-bit signed integer.
    I32,
    /// 16-bit signed integer.
    I16,
    /// 8-bit signed integer.
    I8,
    /// 8-bit unsigned integer.
    U8,
    /// Boolean.
    Bool,
}

impl DType {
    /// Every dtype, in declaration order.
    pub const ALL: [DType; 12] = [
        DType::F64,
        DType::F32,
        DType::Bf16,
        DType::F16,
        DType::F8e4m3,
        DType::F8e5m2,
        DType::I64,
        DType::I32,
        DType::I16,
        DType::I8,
        DType::U8,
        DType::Bool,
    ];

    /// The short name used in torch.fx annotations (`f32[8, 16]`).
    pub fn short_name(self) -> &'static str {
        match self {
            DType::F64 => "f64",
            DType::F32 => "f32",
            DType::Bf16 => "bf16",
            DType::F16 => "f16",
            DType::F8e4m3 => "f8e4m3fn",
            DType::F8e5m2 => "f8e5m2",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::I16 => "i16",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::Bool => "b8",
        }
    }

    /// Parses a short annotation name (`f32`, `b8`, `f8e4m3fn`, ...).
    pub fn from_short_name(s: &str) -> Option<DType> {
        Some(match s {
            "f64" => DType::F64,
            "f32" => DType::F32,
            "bf16" => DType::Bf16,
            "f16" => DType::F16,
            "f8e4m3fn" | "f8e4m3" => DType::F8e4m3,
            "f8e5m2" => DType::F8e5m2,
            "i64" => DType::I64,
            "i32" => DType::I32,
            "i16" => DType::I16,
            "i8" => DType::I8,
            "u8" => DType::U8,
            "b8" | "bool" => DType::Bool,
            _ => return None,
        })
    }

    /// Parses a torch dtype name without the `torch.` prefix (`float16`, `half`, `long`, ...).
    pub fn from_torch_name(s: &str) -> Option<DType> {
        Some(match s {
            "float64" | "double" => DType::F64,
            "float32" | "float" => DType::F32,
            "bfloat16" => DType::Bf16,
            "float16" | "half" => DType::F16,
            "float8_e4m3fn" => DType::F8e4m3,
            "float8_e5m2" => DType::F8e5m2,
            "int64" | "long" => DType::I64,
            "int32" | "int" => DType::I32,
            "int16" | "short" => DType::I16,
            "int8" => DType::I8,
            "uint8" => DType::U8,
            "bool" => DType::Bool,
            _ => return None,
        })
    }

    /// The torch name (`float16`), as printed after `torch.`.
    pub fn torch_name(self) -> &'static str {
        match self {
            DType::F64 => "float64",
            DType::F32 => "float32",
            DType::Bf16 => "bfloat16",
            DType::F16 => "float16",
            DType::F8e4m3 => "float8_e4m3fn",
            DType::F8e5m2 => "float8_e5m2",
            DType::I64 => "int64",
            DType::I32 => "int32",
            DType::I16 => "int16",
            DType::I8 => "int8",
            DType::U8 => "uint8",
            DType::Bool => "bool",
        }
    }

    /// True for floating-point types.
    pub fn is_float(self) -> bool {
        matches!(
            self,
            DType::F64 | DType::F32 | DType::Bf16 | DType::F16 | DType::F8e4m3 | DType::F8e5m2
        )
    }

    /// True for integer types (not bool).
    pub fn is_int(self) -> bool {
        matches!(
            self,
            DType::I64 | DType::I32 | DType::I16 | DType::I8 | DType::U8
        )
    }

    /// Size of one element in bytes.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::Bf16 | DType::F16 | DType::I16 => 2,
            DType::F8e4m3 | DType::F8e5m2 | DType::I8 | DType::U8 | DType::Bool => 1,
        }
    }

    /// The result type of a binary arithmetic op between tensors of these types, following
    /// torch's promotion for tensors of the same category (float beats int beats bool, wider
    /// beats narrower; bf16 with f16 gives f32).
    pub fn promote(self, other: DType) -> DType {
        if self == other {
            return self;
        }
        let rank = |d: DType| -> u8 {
            match d {
                DType::Bool => 0,
                DType::U8 => 1,
                DType::I8 => 2,
                DType::I16 => 3,
                DType::I32 => 4,
                DType::I64 => 5,
                DType::F8e4m3 | DType::F8e5m2 => 6,
                DType::Bf16 | DType::F16 => 7,
                DType::F32 => 8,
                DType::F64 => 9,
            }
        };
        match (self, other) {
            (DType::Bf16, DType::F16) | (DType::F16, DType::Bf16) => DType::F32,
            (DType::U8, DType::I8) | (DType::I8, DType::U8) => DType::I16,
            (DType::F8e4m3, DType::F8e5m2) | (DType::F8e5m2, DType::F8e4m3) => DType::F32,
            _ if rank(self) >= rank(other) => self,
            _ => other,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.short_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_short_name(d.short_name()), Some(d));
            assert_eq!(DType::from_torch_name(d.torch_name()), Some(d));
        }
    }

    #[test]
    fn promotion_matches_torch() {
        assert_eq!(DType::F16.promote(DType::F32), DType::F32);
        assert_eq!(DType::Bf16.promote(DType::F16), DType::F32);
        assert_eq!(DType::I64.promote(DType::F16), DType::F16);
        assert_eq!(DType::Bool.promote(DType::I32), DType::I32);
    }
}
