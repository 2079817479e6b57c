//! Element types and reduction operators, named the way NCCL names them.
//!
//! Buffers are plain bytes; the element type is chosen at run time and only
//! the kernels ([`crate::kernels`]) interpret the bytes, in the host's native
//! byte order (every rank of a communicator must share it).

use std::fmt;
use std::str::FromStr;

/// The element type of a collective's buffers (NCCL's `ncclDataType_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DataType {
    /// `int8`: signed 8-bit integer, wrapping arithmetic.
    Int8,
    /// `uint8`: unsigned 8-bit integer, wrapping arithmetic.
    Uint8,
    /// `int32`: signed 32-bit integer, wrapping arithmetic.
    Int32,
    /// `uint32`: unsigned 32-bit integer, wrapping arithmetic.
    Uint32,
    /// `int64`: signed 64-bit integer, wrapping arithmetic.
    Int64,
    /// `uint64`: unsigned 64-bit integer, wrapping arithmetic.
    Uint64,
    /// `half`: IEEE 754 binary16, computed in f32 and rounded back.
    Float16,
    /// `float`: IEEE 754 binary32.
    Float32,
    /// `double`: IEEE 754 binary64.
    Float64,
    /// `bfloat16`: the upper half of a binary32, computed in f32 and rounded back.
    Bfloat16,
}

impl DataType {
    /// Every type, in nccl-tests' order (the order `-d all` runs them).
    pub const ALL: [Self; 10] = [
        Self::Int8,
        Self::Uint8,
        Self::Int32,
        Self::Uint32,
        Self::Int64,
        Self::Uint64,
        Self::Float16,
        Self::Float32,
        Self::Float64,
        Self::Bfloat16,
    ];

    /// Bytes per element.
    pub const fn size_bytes(self) -> usize {
        match self {
            Self::Int8 | Self::Uint8 => 1,
            Self::Float16 | Self::Bfloat16 => 2,
            Self::Int32 | Self::Uint32 | Self::Float32 => 4,
            Self::Int64 | Self::Uint64 | Self::Float64 => 8,
        }
    }

    /// NCCL's and nccl-tests' name for the type (`float`, `half`, `bfloat16`, ...).
    pub const fn nccl_name(self) -> &'static str {
        match self {
            Self::Int8 => "int8",
            Self::Uint8 => "uint8",
            Self::Int32 => "int32",
            Self::Uint32 => "uint32",
            Self::Int64 => "int64",
            Self::Uint64 => "uint64",
            Self::Float16 => "half",
            Self::Float32 => "float",
            Self::Float64 => "double",
            Self::Bfloat16 => "bfloat16",
        }
    }

    /// True for the four floating-point types.
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            Self::Float16 | Self::Float32 | Self::Float64 | Self::Bfloat16
        )
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.nccl_name())
    }
}

/// A name that is neither an NCCL type name nor one of its aliases.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown data type {0:?} (expected int8, uint8, int32, uint32, int64, uint64, half, float, double or bfloat16)"
)]
pub struct UnknownDataType(pub String);

impl FromStr for DataType {
    type Err = UnknownDataType;

    /// Accepts nccl-tests' names and NCCL's enum aliases (`char`, `int`,
    /// `float16`, `float32`, `float64`, `f32`, `bf16`, ...).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "int8" | "char" | "i8" => Self::Int8,
            "uint8" | "u8" => Self::Uint8,
            "int32" | "int" | "i32" => Self::Int32,
            "uint32" | "u32" => Self::Uint32,
            "int64" | "i64" => Self::Int64,
            "uint64" | "u64" => Self::Uint64,
            "half" | "float16" | "f16" => Self::Float16,
            "float" | "float32" | "f32" => Self::Float32,
            "double" | "float64" | "f64" => Self::Float64,
            "bfloat16" | "bf16" => Self::Bfloat16,
            _ => return Err(UnknownDataType(s.to_owned())),
        })
    }
}

/// A reduction operator (NCCL's `ncclRedOp_t`, without user-defined ones).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ReduceOp {
    /// Sum (wrapping for integers).
    Sum,
    /// Product (wrapping for integers).
    Prod,
    /// Maximum (IEEE maxNum for floats: a NaN operand loses to a number).
    Max,
    /// Minimum (IEEE minNum for floats).
    Min,
    /// Average over the ranks, the way NCCL's `ncclAvg` computes it: integer
    /// types sum (wrapping) and divide the sum by the world size once at the
    /// end, truncating toward zero; floating-point types multiply every
    /// rank's input by `1/world` (rounded to the element type) and sum the
    /// products. See [`crate::kernels`].
    Avg,
}

impl ReduceOp {
    /// Every operator, in nccl-tests' order (the order `-o all` runs them).
    pub const ALL: [Self; 5] = [Self::Sum, Self::Prod, Self::Max, Self::Min, Self::Avg];

    /// NCCL's and nccl-tests' name for the operator.
    pub const fn nccl_name(self) -> &'static str {
        match self {
            Self::Sum => "sum",
            Self::Prod => "prod",
            Self::Max => "max",
            Self::Min => "min",
            Self::Avg => "avg",
        }
    }

    /// The pairwise operator that combines two partial results: `Avg`
    /// combines by summing (its scaling happens before or after).
    pub const fn combiner(self) -> Self {
        match self {
            Self::Avg => Self::Sum,
            other => other,
        }
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.nccl_name())
    }
}

/// A name that is not one of NCCL's operators.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown reduction operator {0:?} (expected sum, prod, max, min or avg)")]
pub struct UnknownReduceOp(pub String);

impl FromStr for ReduceOp {
    type Err = UnknownReduceOp;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "sum" => Self::Sum,
            "prod" => Self::Prod,
            "max" => Self::Max,
            "min" => Self::Min,
            "avg" => Self::Avg,
            _ => return Err(UnknownReduceOp(s.to_owned())),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for t in DataType::ALL {
            assert_eq!(t.nccl_name().parse::<DataType>(), Ok(t));
        }
        for op in ReduceOp::ALL {
            assert_eq!(op.nccl_name().parse::<ReduceOp>(), Ok(op));
        }
        assert!("float8".parse::<DataType>().is_err());
        assert!("mulsum".parse::<ReduceOp>().is_err());
    }

    #[test]
    fn sizes() {
        let sizes: Vec<usize> = DataType::ALL.iter().map(|t| t.size_bytes()).collect();
        assert_eq!(sizes, [1, 1, 4, 4, 8, 8, 2, 4, 8, 2]);
    }
}
