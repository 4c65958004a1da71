//! Element types and static tensor types (`f32[8,256]`).
//!
//! The IR only has static shapes: every dimension is a concrete `usize`. Symbolic dimensions are resolved
//! by the importer (from `--input-shape`) before a graph is built.

use std::fmt;

/// The element types the IR, the interpreter and the code generators know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F16,
    BF16,
    F64,
    I8,
    U8,
    I16,
    U16,
    I32,
    U32,
    I64,
    U64,
    Bool,
    /// The narrow types (`narrow.rs`): stored one per byte, the floats computed in f32.
    F8E4M3FN,
    F8E4M3FNUZ,
    F8E5M2,
    F8E5M2FNUZ,
    F4E2M1,
    I4,
    U4,
    I2,
    U2,
}

impl DType {
    pub const ALL: [DType; 22] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F64,
        DType::I8,
        DType::U8,
        DType::I16,
        DType::U16,
        DType::I32,
        DType::U32,
        DType::I64,
        DType::U64,
        DType::Bool,
        DType::F8E4M3FN,
        DType::F8E4M3FNUZ,
        DType::F8E5M2,
        DType::F8E5M2FNUZ,
        DType::F4E2M1,
        DType::I4,
        DType::U4,
        DType::I2,
        DType::U2,
    ];

    /// The spelling used in the text IR.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F64 => "f64",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I16 => "i16",
            DType::U16 => "u16",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::I64 => "i64",
            DType::U64 => "u64",
            DType::Bool => "bool",
            DType::F8E4M3FN => "f8e4m3fn",
            DType::F8E4M3FNUZ => "f8e4m3fnuz",
            DType::F8E5M2 => "f8e5m2",
            DType::F8E5M2FNUZ => "f8e5m2fnuz",
            DType::F4E2M1 => "f4e2m1",
            DType::I4 => "i4",
            DType::U4 => "u4",
            DType::I2 => "i2",
            DType::U2 => "u2",
        }
    }

    pub fn from_name(s: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == s)
    }

    /// Size of one element in bytes.
    pub fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 | DType::U64 => 8,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::I8 | DType::U8 | DType::Bool => 1,
            DType::F8E4M3FN
            | DType::F8E4M3FNUZ
            | DType::F8E5M2
            | DType::F8E5M2FNUZ
            | DType::F4E2M1
            | DType::I4
            | DType::U4
            | DType::I2
            | DType::U2 => 1,
        }
    }

    /// The (smallest, largest) value of the narrow integer types quantization uses (8, 16, 4 and 2
    /// bits), exact in f64.
    pub fn int_range(self) -> Option<(f64, f64)> {
        match self {
            DType::U8 => Some((0.0, 255.0)),
            DType::I8 => Some((-128.0, 127.0)),
            DType::U16 => Some((0.0, 65535.0)),
            DType::I16 => Some((-32768.0, 32767.0)),
            DType::U4 => Some((0.0, 15.0)),
            DType::I4 => Some((-8.0, 7.0)),
            DType::U2 => Some((0.0, 3.0)),
            DType::I2 => Some((-2.0, 1.0)),
            _ => None,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16 | DType::F64)
            || self.minifloat().is_some()
    }

    /// The format of a float8 or float4 type.
    pub fn minifloat(self) -> Option<mlopt_minifloat::Format> {
        use mlopt_minifloat::Format;
        Some(match self {
            DType::F8E4M3FN => Format::E4M3FN,
            DType::F8E4M3FNUZ => Format::E4M3FNUZ,
            DType::F8E5M2 => Format::E5M2,
            DType::F8E5M2FNUZ => Format::E5M2FNUZ,
            DType::F4E2M1 => Format::E2M1,
            _ => return None,
        })
    }

    /// The floats narrower than f32 (f16, bf16, float8, float4): stored narrow, computed in f32.
    pub fn computes_in_f32(self) -> bool {
        self.is_half() || self.minifloat().is_some()
    }

    /// float8, float4, int4 and uint4 (`narrow.rs`): one per byte, types numpy has no name for.
    pub fn is_narrow(self) -> bool {
        self.minifloat().is_some() || self.is_nibble()
    }

    /// int4, uint4, int2 and uint2: stored one per byte, packed in ONNX files.
    pub fn is_nibble(self) -> bool {
        self.sub_byte_bits().is_some()
    }

    /// The width of the integers narrower than a byte (4 or 2), which wrap to it.
    pub fn sub_byte_bits(self) -> Option<u32> {
        match self {
            DType::I4 | DType::U4 => Some(4),
            DType::I2 | DType::U2 => Some(2),
            _ => None,
        }
    }

    /// bf16 or f16: the 16-bit floats, stored narrow and computed in f32.
    pub fn is_half(self) -> bool {
        matches!(self, DType::F16 | DType::BF16)
    }

    pub fn is_int(self) -> bool {
        !self.is_float() && self != DType::Bool
    }

    pub fn is_signed(self) -> bool {
        self.is_float()
            || matches!(
                self,
                DType::I8 | DType::I16 | DType::I32 | DType::I64 | DType::I4 | DType::I2
            )
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A static tensor type: element type and dimensions. `f32[]` is a scalar.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl TensorType {
    pub fn new(dtype: DType, shape: impl Into<Vec<usize>>) -> Self {
        TensorType {
            dtype,
            shape: shape.into(),
        }
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn bytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }

    /// The element count, or `None` if it overflows (a shape read from a file, before anything of that
    /// size exists).
    pub fn checked_numel(&self) -> Option<usize> {
        self.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))
    }

    /// The size in bytes, or `None` if it overflows (shapes from user input can be absurd). Zero dimensions
    /// count as 1 for the overflow check: code multiplies sub-ranges of a shape (Flatten's two halves), and
    /// `[0, 2^40, 2^40]` is as absurd as `[1, 2^40, 2^40]`.
    pub fn checked_bytes(&self) -> Option<usize> {
        self.shape
            .iter()
            .try_fold(self.dtype.size(), |a, &d| a.checked_mul(d.max(1)))?;
        Some(self.numel() * self.dtype.size())
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype)?;
        for (i, d) in self.shape.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// The number of elements of `dims`, or `None` if it (or the product of any of its sub-ranges) overflows:
/// zero dimensions count as 1 for the check. For shapes that come from user data (attributes, constants).
pub fn checked_numel(dims: &[usize]) -> Option<usize> {
    dims.iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d.max(1)))?;
    Some(dims.iter().product())
}

/// Numpy/ONNX multidirectional broadcasting of two shapes.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for (i, o) in out.iter_mut().enumerate() {
        let da = if i + a.len() >= rank {
            a[i + a.len() - rank]
        } else {
            1
        };
        let db = if i + b.len() >= rank {
            b[i + b.len() - rank]
        } else {
            1
        };
        *o = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(out)
}

/// Resolves a possibly negative ONNX axis against `rank`.
pub fn normalize_axis(axis: i64, rank: usize) -> Option<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    (0..r).contains(&a).then_some(a as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting_follows_numpy() {
        assert_eq!(broadcast_shapes(&[2, 3], &[3]), Some(vec![2, 3]));
        assert_eq!(broadcast_shapes(&[2, 1, 4], &[5, 1]), Some(vec![2, 5, 4]));
        assert_eq!(broadcast_shapes(&[], &[4]), Some(vec![4]));
        assert_eq!(broadcast_shapes(&[0], &[1]), Some(vec![0]));
        assert_eq!(broadcast_shapes(&[2], &[3]), None);
    }

    #[test]
    fn axes_normalise() {
        assert_eq!(normalize_axis(-1, 4), Some(3));
        assert_eq!(normalize_axis(3, 4), Some(3));
        assert_eq!(normalize_axis(4, 4), None);
        assert_eq!(normalize_axis(-5, 4), None);
    }

    #[test]
    fn dtype_names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()), Some(d));
        }
    }
}
