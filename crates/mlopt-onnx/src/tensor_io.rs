//! Tensors in and out of ONNX: `TensorProto` (raw_data, typed fields, external data files next to the
//! model) and the two file formats tools exchange, `.pb` (a serialised `TensorProto`, the layout of ONNX's
//! test data) and `.npy` (numpy, format versions 1-3).

use crate::error::{io_err, OnnxError, Result};
use crate::proto::{data_type as dt, tensor_proto, TensorProto};
use mlopt_ir::{DType, Tensor, TensorType};
use prost::Message;
use std::path::{Component, Path};

/// The IR dtype of an ONNX data type, if the IR has it.
pub fn dtype_from_onnx(t: i32) -> Option<DType> {
    Some(match t {
        dt::FLOAT => DType::F32,
        dt::FLOAT16 => DType::F16,
        dt::BFLOAT16 => DType::BF16,
        dt::DOUBLE => DType::F64,
        dt::INT8 => DType::I8,
        dt::UINT8 => DType::U8,
        dt::INT16 => DType::I16,
        dt::UINT16 => DType::U16,
        dt::INT32 => DType::I32,
        dt::UINT32 => DType::U32,
        dt::INT64 => DType::I64,
        dt::UINT64 => DType::U64,
        dt::BOOL => DType::Bool,
        dt::FLOAT8E4M3FN => DType::F8E4M3FN,
        dt::FLOAT8E4M3FNUZ => DType::F8E4M3FNUZ,
        dt::FLOAT8E5M2 => DType::F8E5M2,
        dt::FLOAT8E5M2FNUZ => DType::F8E5M2FNUZ,
        dt::FLOAT4E2M1 => DType::F4E2M1,
        dt::INT4 => DType::I4,
        dt::UINT4 => DType::U4,
        dt::INT2 => DType::I2,
        dt::UINT2 => DType::U2,
        _ => return None,
    })
}

pub fn dtype_to_onnx(d: DType) -> i32 {
    match d {
        DType::F32 => dt::FLOAT,
        DType::F16 => dt::FLOAT16,
        DType::BF16 => dt::BFLOAT16,
        DType::F64 => dt::DOUBLE,
        DType::I8 => dt::INT8,
        DType::U8 => dt::UINT8,
        DType::I16 => dt::INT16,
        DType::U16 => dt::UINT16,
        DType::I32 => dt::INT32,
        DType::U32 => dt::UINT32,
        DType::I64 => dt::INT64,
        DType::U64 => dt::UINT64,
        DType::Bool => dt::BOOL,
        DType::F8E4M3FN => dt::FLOAT8E4M3FN,
        DType::F8E4M3FNUZ => dt::FLOAT8E4M3FNUZ,
        DType::F8E5M2 => dt::FLOAT8E5M2,
        DType::F8E5M2FNUZ => dt::FLOAT8E5M2FNUZ,
        DType::F4E2M1 => dt::FLOAT4E2M1,
        DType::I4 => dt::INT4,
        DType::U4 => dt::UINT4,
        DType::I2 => dt::INT2,
        DType::U2 => dt::UINT2,
    }
}

/// The folder a file's external data is looked up in: its parent, or `.` for a bare file name (whose
/// parent is the empty path, which names no folder).
pub fn folder_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Reads a whole file that must be a regular file: a FIFO would block forever and a device such as
/// `/dev/zero` never ends, where a regular file's size bounds what is read.
pub(crate) fn read_regular(path: &std::path::Path) -> Result<Vec<u8>> {
    let meta = std::fs::metadata(path).map_err(io_err(path))?;
    if !meta.is_file() {
        return Err(io_err(path)(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        )));
    }
    std::fs::read(path).map_err(io_err(path))
}

/// Resolves an external data `location` inside `base`; absolute paths and paths that leave `base` (by
/// `..` or through a symlink) are errors, and so is anything but a regular file (a FIFO would block the
/// read forever, a device would never end).
fn external_path(base: &Path, location: &str, name: &str) -> Result<std::path::PathBuf> {
    let err = |msg: String| OnnxError::Tensor {
        name: name.into(),
        msg,
    };
    let rel = Path::new(location);
    if rel.is_absolute()
        || rel
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(err(format!(
            "external data location '{location}' escapes the model's folder"
        )));
    }
    let full = base.join(rel);
    let (cb, cf) = (
        base.canonicalize().map_err(io_err(base))?,
        full.canonicalize().map_err(io_err(&full))?,
    );
    if !cf.starts_with(&cb) {
        return Err(err(format!(
            "external data location '{location}' escapes the model's folder"
        )));
    }
    if !std::fs::metadata(&cf).map_err(io_err(&cf))?.is_file() {
        return Err(err(format!(
            "external data location '{location}' is not a regular file"
        )));
    }
    Ok(cf)
}

/// A tensor's external data: its range of the file the model names (inside the model's folder and the
/// file, checked), read straight into the tensor.
fn read_external(
    t: &TensorProto,
    base: Option<&Path>,
    ty: &TensorType,
    nbytes: usize,
) -> Result<Tensor> {
    let err = |msg: String| OnnxError::Tensor {
        name: t.name.clone(),
        msg,
    };
    let base = base.ok_or_else(|| err("external data needs the model's folder".into()))?;
    let (mut location, mut offset, mut length) = (None, 0u64, None);
    for kv in &t.external_data {
        let num = || {
            kv.value
                .parse::<u64>()
                .map_err(|_| err(format!("bad external data {} '{}'", kv.key, kv.value)))
        };
        match kv.key.as_str() {
            "location" => location = Some(kv.value.clone()),
            "offset" => offset = num()?,
            "length" => length = Some(num()?),
            _ => {}
        }
    }
    let location = location.ok_or_else(|| err("external data has no location".into()))?;
    let path = external_path(base, &location, &t.name)?;
    // Only this tensor's range is read (a model's weights share one file: reading it whole for each
    // tensor made importing BERT-base take 25 s), after checking it lies inside the file.
    use std::io::{Seek, SeekFrom};
    let mut file = std::fs::File::open(&path).map_err(io_err(&path))?;
    let size = file.metadata().map_err(io_err(&path))?.len();
    let len = length.unwrap_or(nbytes as u64);
    if offset.checked_add(len).is_none_or(|end| end > size) {
        return Err(err(format!(
            "external data range {offset}+{len} is outside '{location}' ({size} bytes)"
        )));
    }
    if len != nbytes as u64 {
        return Err(err(format!(
            "external data length {len} does not match the shape ({nbytes} bytes)"
        )));
    }
    file.seek(SeekFrom::Start(offset)).map_err(io_err(&path))?;
    Tensor::from_le_reader(ty, &mut file)
        .map_err(io_err(&path))?
        .ok_or_else(|| err("too many elements".into()))
}

/// Converts a `TensorProto`; `base` is the model's folder, for external data.
pub fn tensor_from_proto(t: &TensorProto, base: Option<&Path>) -> Result<Tensor> {
    let err = |msg: String| OnnxError::Tensor {
        name: t.name.clone(),
        msg,
    };
    let dtype = dtype_from_onnx(t.data_type).ok_or_else(|| {
        err(format!(
            "data type {} is not supported",
            dt::name(t.data_type)
        ))
    })?;
    if t.segment.is_some() {
        return Err(err("segmented tensors are not supported".into()));
    }
    if t.dims.len() > mlopt_ir::graph::MAX_RANK {
        return Err(err(format!(
            "rank {} exceeds mlopt's limit of {}",
            t.dims.len(),
            mlopt_ir::graph::MAX_RANK
        )));
    }
    let shape: Vec<usize> = t
        .dims
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| err(format!("negative dimension {d}"))))
        .collect::<Result<_>>()?;
    let ty = TensorType::new(dtype, shape);
    let numel = ty
        .checked_numel()
        .ok_or_else(|| err("too many elements".into()))?;
    if let Some(bits) = packed_bits(dtype) {
        return unpack_from_proto(t, base, &ty, numel, bits);
    }
    let nbytes = numel
        .checked_mul(dtype.size())
        .ok_or_else(|| err("too many elements".into()))?;
    let bad_len = |n: usize| {
        err(format!(
            "{n} values for shape {:?} ({numel} expected)",
            ty.shape
        ))
    };
    if t.data_location == tensor_proto::DATA_LOCATION_EXTERNAL {
        return read_external(t, base, &ty, nbytes);
    }
    if !t.raw_data.is_empty() || numel == 0 {
        return Tensor::from_le_bytes(&ty, &t.raw_data)
            .ok_or_else(|| bad_len(t.raw_data.len() / dtype.size().max(1)));
    }
    let s = &ty.shape;
    let out = match dtype {
        DType::F32 => {
            Tensor::from_vec(s, t.float_data.clone()).ok_or_else(|| bad_len(t.float_data.len()))
        }
        DType::F64 => {
            Tensor::from_vec(s, t.double_data.clone()).ok_or_else(|| bad_len(t.double_data.len()))
        }
        DType::I64 => {
            Tensor::from_vec(s, t.int64_data.clone()).ok_or_else(|| bad_len(t.int64_data.len()))
        }
        DType::F16 | DType::BF16 => {
            // Half floats are stored as their bit patterns in int32_data.
            let bytes: Vec<u8> = t
                .int32_data
                .iter()
                .flat_map(|&v| (v as u16).to_le_bytes())
                .collect();
            Tensor::from_le_bytes(&ty, &bytes).ok_or_else(|| bad_len(t.int32_data.len()))
        }
        DType::U32 | DType::U64 => {
            let v = Tensor::from_vec(s, t.uint64_data.clone())
                .ok_or_else(|| bad_len(t.uint64_data.len()))?;
            Ok(v.cast(dtype))
        }
        DType::I32 | DType::I16 | DType::U16 | DType::I8 | DType::U8 | DType::Bool => {
            let v = Tensor::from_vec(s, t.int32_data.clone())
                .ok_or_else(|| bad_len(t.int32_data.len()))?;
            Ok(v.cast(dtype))
        }
        // float8: each int32 holds one code.
        _ => {
            let bytes: Vec<u8> = t.int32_data.iter().map(|&v| v as u8).collect();
            Tensor::from_le_bytes(&ty, &bytes).ok_or_else(|| bad_len(t.int32_data.len()))
        }
    }?;
    Ok(out)
}

/// A tensor of a type narrower than a byte (int4, uint4, float4 E2M1: two to a byte; int2, uint2: four):
/// ONNX packs them from the low bits up, the first element lowest (in `raw_data`, in external data, and in
/// `int32_data`, one byte's worth per int32); mlopt holds one per byte.
fn unpack_from_proto(
    t: &TensorProto,
    base: Option<&Path>,
    ty: &TensorType,
    numel: usize,
    bits: usize,
) -> Result<Tensor> {
    let per_byte = 8 / bits;
    let packed_len = numel.div_ceil(per_byte);
    let packed: Vec<u8> = if t.data_location == tensor_proto::DATA_LOCATION_EXTERNAL {
        let bytes = TensorType::new(DType::U8, vec![packed_len]);
        read_external(t, base, &bytes, packed_len)?.to_le_bytes()
    } else if !t.raw_data.is_empty() || numel == 0 {
        t.raw_data.clone()
    } else {
        t.int32_data.iter().map(|&v| v as u8).collect()
    };
    if packed.len() != packed_len {
        return Err(OnnxError::Tensor {
            name: t.name.clone(),
            msg: format!(
                "{} bytes of packed {bits}-bit values for shape {:?} ({packed_len} expected)",
                packed.len(),
                ty.shape
            ),
        });
    }
    let mask = (1u8 << bits) - 1;
    let bytes: Vec<u8> = packed
        .iter()
        .flat_map(|b| (0..per_byte).map(move |k| (b >> (k * bits)) & mask))
        .take(numel)
        .collect();
    Tensor::from_le_bytes(ty, &bytes).ok_or_else(|| OnnxError::Tensor {
        name: t.name.clone(),
        msg: "too many elements".into(),
    })
}

/// The bits a type takes in ONNX files where they pack it (several to a byte).
fn packed_bits(d: DType) -> Option<usize> {
    match d {
        DType::F4E2M1 => Some(4),
        d => d.sub_byte_bits().map(|b| b as usize),
    }
}

/// The bytes of `raw_data` for `t`: its values' little-endian bytes, the sub-byte types packed from
/// the low bits up (first element lowest).
fn raw_bytes(t: &Tensor) -> Vec<u8> {
    let bytes = t.to_le_bytes();
    match packed_bits(t.dtype()) {
        Some(bits) => {
            let mask = (1u8 << bits) - 1;
            bytes
                .chunks(8 / bits)
                .map(|p| {
                    p.iter()
                        .enumerate()
                        .fold(0u8, |acc, (k, v)| acc | ((v & mask) << (k * bits)))
                })
                .collect()
        }
        None => bytes,
    }
}

/// Converts a tensor to a `TensorProto` with `raw_data`.
pub fn tensor_to_proto(t: &Tensor, name: &str) -> TensorProto {
    TensorProto {
        dims: t.shape().iter().map(|&d| d as i64).collect(),
        data_type: dtype_to_onnx(t.dtype()),
        name: name.to_string(),
        raw_data: raw_bytes(t),
        ..Default::default()
    }
}

/// Reads a serialised `TensorProto` (`.pb`), returning its name and value.
pub fn read_pb(path: &Path) -> Result<(String, Tensor)> {
    let bytes = read_regular(path)?;
    let p = TensorProto::decode(bytes.as_slice()).map_err(|e| OnnxError::Decode {
        what: path.display().to_string(),
        msg: e.to_string(),
    })?;
    let t = tensor_from_proto(&p, Some(folder_of(path)))?;
    Ok((p.name, t))
}

pub fn write_pb(path: &Path, name: &str, t: &Tensor) -> Result<()> {
    std::fs::write(path, pb_bytes(t, name)).map_err(io_err(path))
}

/// `t` named `name` as the bytes of a serialized `TensorProto` (a `.pb` file).
pub fn pb_bytes(t: &Tensor, name: &str) -> Vec<u8> {
    tensor_to_proto(t, name).encode_to_vec()
}

fn npy_descr(d: DType) -> &'static str {
    match d {
        DType::F32 => "<f4",
        DType::F16 => "<f2",
        DType::BF16 => "<V2",
        DType::F64 => "<f8",
        DType::I8 => "|i1",
        DType::U8 => "|u1",
        DType::I16 => "<i2",
        DType::U16 => "<u2",
        DType::I32 => "<i4",
        DType::U32 => "<u4",
        DType::I64 => "<i8",
        DType::U64 => "<u8",
        DType::Bool => "|b1",
        // numpy has no name for these: ml_dtypes' arrays save as one-byte voids, which say nothing of
        // the format, so they are written that way and not read back (`.pb` files keep their type).
        DType::F8E4M3FN
        | DType::F8E4M3FNUZ
        | DType::F8E5M2
        | DType::F8E5M2FNUZ
        | DType::F4E2M1
        | DType::I4
        | DType::U4
        | DType::I2
        | DType::U2 => "|V1",
    }
}

/// Reads a `.npy` file (little-endian, C order). bf16 is read from the raw 2-byte `<V2` numpy writes for
/// ml_dtypes' bfloat16.
pub fn read_npy(path: &Path) -> Result<Tensor> {
    let bytes = read_regular(path)?;
    let err = |msg: &str| OnnxError::Tensor {
        name: path.display().to_string(),
        msg: format!("bad .npy file: {msg}"),
    };
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err(err("missing magic"));
    }
    let (hlen, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        _ => return Err(err("unsupported version")),
    };
    let header = bytes
        .get(start..start + hlen)
        .ok_or_else(|| err("truncated header"))?;
    let header = std::str::from_utf8(header).map_err(|_| err("header is not text"))?;
    let field = |key: &str| -> Option<&str> {
        let at = header.find(&format!("'{key}'"))? + key.len() + 2;
        Some(header[at..].trim_start().strip_prefix(':')?.trim_start())
    };
    let descr = field("descr")
        .and_then(|s| s.strip_prefix('\''))
        .and_then(|s| s.split('\'').next())
        .ok_or_else(|| err("no descr"))?;
    let dtype = DType::ALL
        .into_iter()
        .filter(|d| npy_descr(*d) != "|V1")
        .find(|&d| {
            npy_descr(d) == descr
                || (npy_descr(d).get(1..) == descr.get(1..) && descr.starts_with('='))
        })
        .ok_or_else(|| err(&format!("unsupported dtype '{descr}'")))?;
    if field("fortran_order").is_some_and(|s| s.starts_with("True")) {
        return Err(err("Fortran order is not supported"));
    }
    let shape_s = field("shape")
        .and_then(|s| s.strip_prefix('('))
        .and_then(|s| s.split(')').next())
        .ok_or_else(|| err("no shape"))?;
    let shape: Vec<usize> = shape_s
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().map_err(|_| err("bad shape")))
        .collect::<Result<_>>()?;
    if shape.len() > mlopt_ir::graph::MAX_RANK {
        return Err(err(&format!(
            "rank {} exceeds mlopt's limit of {}",
            shape.len(),
            mlopt_ir::graph::MAX_RANK
        )));
    }
    let ty = TensorType::new(dtype, shape);
    Tensor::from_le_bytes(&ty, &bytes[start + hlen..])
        .ok_or_else(|| err("data size does not match the shape"))
}

pub fn write_npy(path: &Path, t: &Tensor) -> Result<()> {
    std::fs::write(path, npy_bytes(t)).map_err(io_err(path))
}

/// `t` as the bytes of a `.npy` file (version 1, C order, the data 64-byte aligned).
pub fn npy_bytes(t: &Tensor) -> Vec<u8> {
    let shape: Vec<String> = t.shape().iter().map(|d| d.to_string()).collect();
    let shape = if shape.len() == 1 {
        format!("({},)", shape[0])
    } else {
        format!("({})", shape.join(", "))
    };
    let mut header = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {shape}, }}",
        npy_descr(t.dtype())
    );
    // Pad so that the data starts on a 64-byte boundary, ending the header with a newline.
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&t.to_le_bytes());
    out
}

/// Reads a tensor file by extension: `.npy`, or anything else as a `.pb` `TensorProto`.
pub fn read_tensor_file(path: &Path) -> Result<Tensor> {
    if path.extension().is_some_and(|e| e == "npy") {
        read_npy(path)
    } else {
        Ok(read_pb(path)?.1)
    }
}
