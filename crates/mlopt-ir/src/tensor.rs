//! Tensors: an ndarray per element type behind one closed enum.
//!
//! The reference interpreter computes on these, constants in graphs hold them, and the ONNX crate reads and
//! writes them. `Elem` ties each Rust element type to its `DType`; `dispatch!` runs one generic expression on
//! whichever variant a tensor holds.

use crate::dtype::{DType, TensorType};
use crate::narrow::{F4E2M1, F8E4M3FN, F8E4M3FNUZ, F8E5M2, F8E5M2FNUZ, I2, I4, U2, U4};
use half::{bf16, f16};
use ndarray::{ArrayD, IxDyn};
use std::fmt;

/// A dense tensor in standard (row-major) layout.
#[derive(Debug, Clone, PartialEq)]
pub enum Tensor {
    F32(ArrayD<f32>),
    F16(ArrayD<f16>),
    BF16(ArrayD<bf16>),
    F64(ArrayD<f64>),
    I8(ArrayD<i8>),
    U8(ArrayD<u8>),
    I16(ArrayD<i16>),
    U16(ArrayD<u16>),
    I32(ArrayD<i32>),
    U32(ArrayD<u32>),
    I64(ArrayD<i64>),
    U64(ArrayD<u64>),
    Bool(ArrayD<bool>),
    F8E4M3FN(ArrayD<F8E4M3FN>),
    F8E4M3FNUZ(ArrayD<F8E4M3FNUZ>),
    F8E5M2(ArrayD<F8E5M2>),
    F8E5M2FNUZ(ArrayD<F8E5M2FNUZ>),
    F4E2M1(ArrayD<F4E2M1>),
    I4(ArrayD<I4>),
    U4(ArrayD<U4>),
    I2(ArrayD<I2>),
    U2(ArrayD<U2>),
}

/// Runs `$body` with `$a` bound to the array inside `$t`, whatever its element type.
#[macro_export]
macro_rules! dispatch {
    ($t:expr, $a:ident => $body:expr) => {
        match $t {
            $crate::Tensor::F32($a) => $body,
            $crate::Tensor::F16($a) => $body,
            $crate::Tensor::BF16($a) => $body,
            $crate::Tensor::F64($a) => $body,
            $crate::Tensor::I8($a) => $body,
            $crate::Tensor::U8($a) => $body,
            $crate::Tensor::I16($a) => $body,
            $crate::Tensor::U16($a) => $body,
            $crate::Tensor::I32($a) => $body,
            $crate::Tensor::U32($a) => $body,
            $crate::Tensor::I64($a) => $body,
            $crate::Tensor::U64($a) => $body,
            $crate::Tensor::Bool($a) => $body,
            $crate::Tensor::F8E4M3FN($a) => $body,
            $crate::Tensor::F8E4M3FNUZ($a) => $body,
            $crate::Tensor::F8E5M2($a) => $body,
            $crate::Tensor::F8E5M2FNUZ($a) => $body,
            $crate::Tensor::F4E2M1($a) => $body,
            $crate::Tensor::I4($a) => $body,
            $crate::Tensor::U4($a) => $body,
            $crate::Tensor::I2($a) => $body,
            $crate::Tensor::U2($a) => $body,
        }
    };
}

/// A Rust element type that a `Tensor` can hold.
pub trait Elem:
    Copy + Default + PartialEq + PartialOrd + fmt::Debug + Send + Sync + 'static
{
    const DTYPE: DType;
    fn to_f64(self) -> f64;
    fn from_f64(v: f64) -> Self;
    fn to_i64(self) -> i64;
    fn from_i64(v: i64) -> Self;
    fn wrap(a: ArrayD<Self>) -> Tensor;
    fn view(t: &Tensor) -> Option<&ArrayD<Self>>;
    fn write_le(self, out: &mut Vec<u8>);
    fn read_le(b: &[u8]) -> Self;

    /// Converts with ONNX `Cast` semantics: floats truncate toward zero into integers (saturating, NaN to
    /// 0), integers wrap, anything non-zero (and NaN) is `true`.
    fn cast_from<S: Elem>(v: S) -> Self {
        // (u64 past i64::MAX into a float goes through f64, its only unsigned path.)
        if S::DTYPE.is_float() || (S::DTYPE == DType::U64 && Self::DTYPE.is_float()) {
            Self::from_f64(v.to_f64())
        } else {
            Self::from_i64(v.to_i64())
        }
    }
}

macro_rules! impl_elem_num {
    ($t:ty, $variant:ident, $conv_f:expr, $conv_i:expr) => {
        impl Elem for $t {
            const DTYPE: DType = DType::$variant;
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn from_f64(v: f64) -> Self {
                $conv_f(v)
            }
            fn to_i64(self) -> i64 {
                self as i64
            }
            fn from_i64(v: i64) -> Self {
                $conv_i(v)
            }
            fn wrap(a: ArrayD<Self>) -> Tensor {
                Tensor::$variant(a)
            }
            fn view(t: &Tensor) -> Option<&ArrayD<Self>> {
                match t {
                    Tensor::$variant(a) => Some(a),
                    _ => None,
                }
            }
            fn write_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn read_le(b: &[u8]) -> Self {
                let mut buf = [0u8; std::mem::size_of::<$t>()];
                buf.copy_from_slice(&b[..std::mem::size_of::<$t>()]);
                <$t>::from_le_bytes(buf)
            }
        }
    };
}

impl_elem_num!(f32, F32, |v: f64| v as f32, |v: i64| v as f32);
impl_elem_num!(f64, F64, |v: f64| v, |v: i64| v as f64);
impl_elem_num!(i8, I8, |v: f64| v as i8, |v: i64| v as i8);
impl_elem_num!(u8, U8, |v: f64| v as u8, |v: i64| v as u8);
impl_elem_num!(i16, I16, |v: f64| v as i16, |v: i64| v as i16);
impl_elem_num!(u16, U16, |v: f64| v as u16, |v: i64| v as u16);
impl_elem_num!(i32, I32, |v: f64| v as i32, |v: i64| v as i32);
impl_elem_num!(u32, U32, |v: f64| v as u32, |v: i64| v as u32);
impl_elem_num!(i64, I64, |v: f64| v as i64, |v: i64| v);
// u64 is held as i64 bits in `to_i64`/`from_i64` (integer casts wrap), so a value past i64::MAX
// converts between the integer types correctly; its f64 conversions are unsigned.
impl_elem_num!(u64, U64, |v: f64| v as u64, |v: i64| v as u64);

/// f64 -> f32 rounded to odd (towards zero, with the last bit set when inexact). f32 keeps more than two
/// bits beyond f16 and bf16, so rounding this result again gives the correctly rounded 16-bit value;
/// `half`'s own f64 conversions drop the low 32 bits of the mantissa first and round 1 + 2^-8 + 2^-23
/// down to bf16 1.0. (The kernel IR interpreter has the same function: the two IRs share no crate.)
pub fn f32_odd(x: f64) -> f32 {
    let r = x as f32;
    if x.is_nan() || r as f64 == x {
        return r;
    }
    let toward_zero = if (r as f64).abs() > x.abs() {
        f32::from_bits(r.to_bits() - 1)
    } else {
        r
    };
    f32::from_bits(toward_zero.to_bits() | 1)
}

/// f32 -> bf16 as mlopt defines it everywhere (this interpreter, the kernel IR's, and generated code):
/// rounded to nearest even, NaNs kept quiet with their sign, and f32 subnormals (below 2^-126 in
/// magnitude) flushed to a zero of their sign, as AVX512-BF16's `vcvtneps2bf16` does. Keeping
/// subnormals would cost generated code about eight integer instructions per vector instead of that
/// one instruction, for a difference below 1.2e-38. (The kernel IR interpreter has the same function.)
pub fn bf16_from_f32(x: f32) -> bf16 {
    if x.is_subnormal() {
        bf16::from_bits((x.to_bits() >> 16) as u16 & 0x8000)
    } else {
        bf16::from_f32(x)
    }
}

macro_rules! impl_elem_half {
    ($t:ty, $variant:ident, $from_f32:expr) => {
        impl Elem for $t {
            const DTYPE: DType = DType::$variant;
            fn to_f64(self) -> f64 {
                self.to_f64()
            }
            fn from_f64(v: f64) -> Self {
                $from_f32(f32_odd(v))
            }
            fn to_i64(self) -> i64 {
                self.to_f64() as i64
            }
            fn from_i64(v: i64) -> Self {
                $from_f32(f32_odd(v as f64))
            }
            fn wrap(a: ArrayD<Self>) -> Tensor {
                Tensor::$variant(a)
            }
            fn view(t: &Tensor) -> Option<&ArrayD<Self>> {
                match t {
                    Tensor::$variant(a) => Some(a),
                    _ => None,
                }
            }
            fn write_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_bits().to_le_bytes());
            }
            fn read_le(b: &[u8]) -> Self {
                <$t>::from_bits(u16::from_le_bytes([b[0], b[1]]))
            }
        }
    };
}

impl_elem_half!(f16, F16, f16::from_f32);
impl_elem_half!(bf16, BF16, bf16_from_f32);

impl Elem for bool {
    const DTYPE: DType = DType::Bool;
    fn to_f64(self) -> f64 {
        if self {
            1.0
        } else {
            0.0
        }
    }
    fn from_f64(v: f64) -> Self {
        v != 0.0
    }
    fn to_i64(self) -> i64 {
        self as i64
    }
    fn from_i64(v: i64) -> Self {
        v != 0
    }
    fn wrap(a: ArrayD<Self>) -> Tensor {
        Tensor::Bool(a)
    }
    fn view(t: &Tensor) -> Option<&ArrayD<Self>> {
        match t {
            Tensor::Bool(a) => Some(a),
            _ => None,
        }
    }
    fn write_le(self, out: &mut Vec<u8>) {
        out.push(self as u8);
    }
    fn read_le(b: &[u8]) -> Self {
        b[0] != 0
    }
}

/// Runs `$body` with `$T` bound to the Rust element type of `$dtype`.
#[macro_export]
macro_rules! with_dtype {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::DType::F16 => {
                type $T = $crate::half::f16;
                $body
            }
            $crate::DType::BF16 => {
                type $T = $crate::half::bf16;
                $body
            }
            $crate::DType::F64 => {
                type $T = f64;
                $body
            }
            $crate::DType::I8 => {
                type $T = i8;
                $body
            }
            $crate::DType::U8 => {
                type $T = u8;
                $body
            }
            $crate::DType::I16 => {
                type $T = i16;
                $body
            }
            $crate::DType::U16 => {
                type $T = u16;
                $body
            }
            $crate::DType::I32 => {
                type $T = i32;
                $body
            }
            $crate::DType::U32 => {
                type $T = u32;
                $body
            }
            $crate::DType::I64 => {
                type $T = i64;
                $body
            }
            $crate::DType::U64 => {
                type $T = u64;
                $body
            }
            $crate::DType::Bool => {
                type $T = bool;
                $body
            }
            $crate::DType::F8E4M3FN => {
                type $T = $crate::narrow::F8E4M3FN;
                $body
            }
            $crate::DType::F8E4M3FNUZ => {
                type $T = $crate::narrow::F8E4M3FNUZ;
                $body
            }
            $crate::DType::F8E5M2 => {
                type $T = $crate::narrow::F8E5M2;
                $body
            }
            $crate::DType::F8E5M2FNUZ => {
                type $T = $crate::narrow::F8E5M2FNUZ;
                $body
            }
            $crate::DType::F4E2M1 => {
                type $T = $crate::narrow::F4E2M1;
                $body
            }
            $crate::DType::I4 => {
                type $T = $crate::narrow::I4;
                $body
            }
            $crate::DType::U4 => {
                type $T = $crate::narrow::U4;
                $body
            }
            $crate::DType::I2 => {
                type $T = $crate::narrow::I2;
                $body
            }
            $crate::DType::U2 => {
                type $T = $crate::narrow::U2;
                $body
            }
        }
    };
}

/// The bytes `Tensor::le_chunks` hands over at a time.
const LE_CHUNK: usize = 64 * 1024;

fn standard<T: Clone>(a: ArrayD<T>) -> ArrayD<T> {
    if a.is_standard_layout() {
        a
    } else {
        a.as_standard_layout().into_owned()
    }
}

impl Tensor {
    pub fn dtype(&self) -> DType {
        match self {
            Tensor::F32(_) => DType::F32,
            Tensor::F16(_) => DType::F16,
            Tensor::BF16(_) => DType::BF16,
            Tensor::F64(_) => DType::F64,
            Tensor::I8(_) => DType::I8,
            Tensor::U8(_) => DType::U8,
            Tensor::I16(_) => DType::I16,
            Tensor::U16(_) => DType::U16,
            Tensor::I32(_) => DType::I32,
            Tensor::U32(_) => DType::U32,
            Tensor::I64(_) => DType::I64,
            Tensor::U64(_) => DType::U64,
            Tensor::Bool(_) => DType::Bool,
            Tensor::F8E4M3FN(_) => DType::F8E4M3FN,
            Tensor::F8E4M3FNUZ(_) => DType::F8E4M3FNUZ,
            Tensor::F8E5M2(_) => DType::F8E5M2,
            Tensor::F8E5M2FNUZ(_) => DType::F8E5M2FNUZ,
            Tensor::F4E2M1(_) => DType::F4E2M1,
            Tensor::I4(_) => DType::I4,
            Tensor::U4(_) => DType::U4,
            Tensor::I2(_) => DType::I2,
            Tensor::U2(_) => DType::U2,
        }
    }

    pub fn shape(&self) -> &[usize] {
        dispatch!(self, a => a.shape())
    }

    pub fn ty(&self) -> TensorType {
        TensorType::new(self.dtype(), self.shape())
    }

    pub fn numel(&self) -> usize {
        dispatch!(self, a => a.len())
    }

    /// Wraps an array, forcing standard layout so that byte views and printing see row-major order.
    pub fn from_array<T: Elem>(a: ArrayD<T>) -> Tensor {
        T::wrap(standard(a))
    }

    /// Builds a tensor from row-major values; `None` when the value count does not match the shape.
    pub fn from_vec<T: Elem>(shape: &[usize], v: Vec<T>) -> Option<Tensor> {
        ArrayD::from_shape_vec(IxDyn(shape), v).ok().map(T::wrap)
    }

    pub fn scalar<T: Elem>(v: T) -> Tensor {
        T::wrap(ArrayD::from_elem(IxDyn(&[]), v))
    }

    pub fn zeros(ty: &TensorType) -> Tensor {
        with_dtype!(ty.dtype, T => T::wrap(ArrayD::from_elem(IxDyn(&ty.shape), T::default())))
    }

    /// A tensor of `ty` filled with `v` (converted with `Cast` semantics).
    pub fn full(ty: &TensorType, v: f64) -> Tensor {
        with_dtype!(ty.dtype, T => T::wrap(ArrayD::from_elem(IxDyn(&ty.shape), T::from_f64(v))))
    }

    /// The array, if this tensor holds element type `T`.
    pub fn view<T: Elem>(&self) -> Option<&ArrayD<T>> {
        T::view(self)
    }

    /// Converts to another element type with ONNX `Cast` semantics.
    pub fn cast(&self, to: DType) -> Tensor {
        if self.dtype() == to {
            return self.clone();
        }
        dispatch!(self, a => with_dtype!(to, T => T::wrap(a.mapv(T::cast_from))))
    }

    /// All values converted to f64 (row-major).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        dispatch!(self, a => a.iter().map(|v| v.to_f64()).collect())
    }

    /// The value every element has (compared bit for bit as f64), or None: stops at the first element
    /// that differs, so a large weight is not converted whole to be found not to be a splat.
    pub fn splat_f64(&self) -> Option<f64> {
        dispatch!(self, a => {
            let mut it = a.iter().map(|v| v.to_f64());
            let first = it.next()?;
            it.all(|x| x.to_bits() == first.to_bits()).then_some(first)
        })
    }

    /// All values converted to i64 (row-major; floats truncate).
    pub fn to_i64_vec(&self) -> Vec<i64> {
        dispatch!(self, a => a.iter().map(|v| v.to_i64()).collect())
    }

    /// Little-endian bytes of the values in row-major order (the layout of ONNX `raw_data` and `.npy`).
    pub fn to_le_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.numel() * self.dtype().size());
        // A standard-layout array is one slice: a plain loop over it (the array iterator's per-element
        // index bookkeeping made this a tenth of compiling BERT-base, for its 440 MB of weights).
        dispatch!(self, a => match a.as_slice() {
            Some(values) => values.iter().for_each(|v| v.write_le(&mut out)),
            None => a.iter().for_each(|v| v.write_le(&mut out)),
        });
        out
    }

    /// Calls `f` on the row-major little-endian bytes of the values, 64 KiB at a time: what `to_le_bytes`
    /// returns, without a copy of the whole tensor (a transformer's weights are hundreds of MB, and fresh
    /// pages cost more than the bytes).
    pub fn le_chunks(&self, mut f: impl FnMut(&[u8])) {
        let mut buf = Vec::with_capacity(LE_CHUNK);
        dispatch!(self, a => {
            let values = a.as_standard_layout();
            for part in values.as_slice().unwrap_or_default().chunks(LE_CHUNK / self.dtype().size()) {
                buf.clear();
                part.iter().for_each(|v| v.write_le(&mut buf));
                f(&buf);
            }
        })
    }

    /// A hash of the type and the values' bits (FxHash's mix over 8-byte words: fast, not keyed).
    pub fn content_hash(&self) -> u64 {
        let mix = |h: u64, w: u64| (h.rotate_left(5) ^ w).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        let mut h = mix(self.dtype() as u64, self.numel() as u64);
        for d in self.shape() {
            h = mix(h, *d as u64);
        }
        self.le_chunks(|bytes| {
            let mut words = bytes.chunks_exact(8);
            for w in &mut words {
                h = mix(
                    h,
                    u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]),
                );
            }
            for b in words.remainder() {
                h = mix(h, *b as u64);
            }
        });
        h
    }

    /// Whether both have the same type and the same bits in every value (NaNs and signed zeros included).
    pub fn same_bits(&self, other: &Tensor) -> bool {
        fn same<T: Elem>(a: &ArrayD<T>, other: &Tensor) -> bool {
            let Some(b) = T::view(other) else {
                return false;
            };
            let (a, b) = (a.as_standard_layout(), b.as_standard_layout());
            let (mut x, mut y) = (Vec::new(), Vec::new());
            a.shape() == b.shape()
                && a.as_slice()
                    .unwrap_or_default()
                    .chunks(4096)
                    .zip(b.as_slice().unwrap_or_default().chunks(4096))
                    .all(|(p, q)| {
                        x.clear();
                        y.clear();
                        p.iter().for_each(|v| v.write_le(&mut x));
                        q.iter().for_each(|v| v.write_le(&mut y));
                        x == y
                    })
        }
        dispatch!(self, a => same(a, other))
    }

    /// Reads row-major little-endian values; `None` when the byte count does not match the type.
    pub fn from_le_bytes(ty: &TensorType, bytes: &[u8]) -> Option<Tensor> {
        let size = ty.dtype.size();
        // (The shape may come from a file: its product is checked, not assumed to fit.)
        let numel = ty.checked_numel()?;
        if bytes.len() != numel.checked_mul(size)? {
            return None;
        }
        with_dtype!(ty.dtype, T => {
            let v: Vec<T> = bytes.chunks_exact(size).map(T::read_le).collect();
            Tensor::from_vec(&ty.shape, v)
        })
    }

    /// Reads a tensor of type `ty` as little-endian bytes from `r`, a block at a time straight into its
    /// element vector (a model's weights are hundreds of MB: no second copy of them as bytes). `None`
    /// when the shape's element count overflows.
    pub fn from_le_reader(
        ty: &TensorType,
        r: &mut impl std::io::Read,
    ) -> std::io::Result<Option<Tensor>> {
        let size = ty.dtype.size();
        let Some(numel) = ty.checked_numel() else {
            return Ok(None);
        };
        let mut block = vec![0u8; (1 << 20) / size * size];
        with_dtype!(ty.dtype, T => {
            let mut v: Vec<T> = Vec::with_capacity(numel);
            while v.len() < numel {
                let n = (numel - v.len()).min(block.len() / size);
                r.read_exact(&mut block[..n * size])?;
                v.extend(block[..n * size].chunks_exact(size).map(T::read_le));
            }
            Ok(Tensor::from_vec(&ty.shape, v))
        })
    }

    /// Returns the same values with a new shape of equal element count.
    pub fn reshape(&self, shape: &[usize]) -> Option<Tensor> {
        dispatch!(self, a => {
            let v: Vec<_> = a.iter().copied().collect();
            Tensor::from_vec(shape, v)
        })
    }
}

impl fmt::Display for Tensor {
    /// A short summary: type and the first few values.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} [", self.ty())?;
        let n = self.numel();
        dispatch!(self, a => {
            for (i, v) in a.iter().take(8).enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "{v:?}")?;
            }
        });
        if n > 8 {
            write!(f, ", ... ({n} values)")?;
        }
        f.write_str("]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_for_every_dtype() {
        for d in DType::ALL {
            let ty = TensorType::new(d, vec![2, 3]);
            let t = Tensor::full(&ty, 1.0).cast(d);
            let back = Tensor::from_le_bytes(&ty, &t.to_le_bytes());
            assert_eq!(back, Some(t), "{d}");
        }
        assert_eq!(
            Tensor::from_le_bytes(&TensorType::new(DType::F32, vec![2]), &[0; 7]),
            None
        );
        // A shape whose element count overflows (from a file's header) is a mismatch, not a panic.
        assert_eq!(
            Tensor::from_le_bytes(&TensorType::new(DType::F32, vec![usize::MAX, 3]), &[0; 12]),
            None
        );
        assert_eq!(
            Tensor::from_le_bytes(&TensorType::new(DType::F64, vec![usize::MAX / 4]), &[0; 8]),
            None
        );
    }

    /// `le_chunks` is `to_le_bytes` in pieces; `same_bits` and `content_hash` see bits, shapes and types.
    #[test]
    fn contents_compare_by_bits() {
        let big =
            Tensor::from_vec(&[3, 40_000], (0..120_000).map(|i| i as f32 * 0.5).collect()).unwrap();
        let mut chunks = Vec::new();
        big.le_chunks(|b| chunks.extend_from_slice(b));
        assert_eq!(chunks, big.to_le_bytes());
        let f = |v: Vec<f32>| Tensor::from_vec(&[v.len()], v).unwrap();
        let (zero, minus_zero, nan) = (
            f(vec![0.0, 1.0]),
            f(vec![-0.0, 1.0]),
            f(vec![f32::NAN, 1.0]),
        );
        assert!(nan.same_bits(&nan.clone()) && nan.content_hash() == nan.clone().content_hash());
        assert!(!zero.same_bits(&minus_zero) && zero.content_hash() != minus_zero.content_hash());
        let reshaped = zero.reshape(&[1, 2]).unwrap();
        assert!(!zero.same_bits(&reshaped) && zero.content_hash() != reshaped.content_hash());
        assert!(!zero.same_bits(&zero.cast(DType::F64)));
        assert!(big.same_bits(&big.reshape(&[3, 40_000]).unwrap()));
    }

    #[test]
    fn cast_follows_onnx() {
        let t = Tensor::from_vec(&[4], vec![-1.7f32, 2.9, f32::NAN, 300.0]).unwrap();
        assert_eq!(t.cast(DType::I32).to_i64_vec(), vec![-1, 2, 0, 300]);
        assert_eq!(
            t.cast(DType::Bool),
            Tensor::from_vec(&[4], vec![true, true, true, true]).unwrap()
        );
        let i = Tensor::from_vec(&[2], vec![257i64, -1]).unwrap();
        assert_eq!(i.cast(DType::U8).to_i64_vec(), vec![1, 255]);
    }

    #[test]
    fn casts_to_16_bit_floats_round_correctly() {
        // (f32 bits, bf16 bits, f16 bits): just above ties, whose deciding bit is in the low 32 bits of
        // the f64 mantissa, round up.
        let cases: [(u32, u16, u16); 5] = [
            (0x3f80_8001, 0x3f81, 0x3c04), // 1 + 2^-8 + 2^-23
            (0x3f80_8000, 0x3f80, 0x3c04), // a bf16 tie: to even
            (0x3f80_1001, 0x3f80, 0x3c01), // 1 + 2^-11 + 2^-23: above an f16 tie
            (0x3f80_1000, 0x3f80, 0x3c00), // the f16 tie: to even
            (0x807f_ffff, 0x8000, 0x8000), // a negative f32 subnormal: flushed in bf16
        ];
        for (x, bf, h) in cases {
            let t = Tensor::from_vec(&[1], vec![f32::from_bits(x)]).unwrap();
            assert_eq!(
                t.cast(DType::BF16).to_le_bytes(),
                bf.to_le_bytes(),
                "{x:#x} to bf16"
            );
            assert_eq!(
                t.cast(DType::F16).to_le_bytes(),
                h.to_le_bytes(),
                "{x:#x} to f16"
            );
        }
    }
}
