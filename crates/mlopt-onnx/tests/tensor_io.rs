//! Tensor files written by numpy and onnx (fixtures/tensors, made by fixtures/make_fixtures.py) read back
//! as the same tensors for every dtype, and mlopt's own writes round-trip.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use mlopt_ir::{DType, Tensor, TensorType};
use mlopt_onnx::{read_npy, read_pb, write_npy, write_pb};
use std::path::PathBuf;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tensors")
}

/// `arange(6).reshape(2, 3)` in `dtype` (bool: odd entries are true).
fn expected(dtype: DType) -> Tensor {
    let base = Tensor::from_vec(&[2, 3], (0..6i64).collect()).unwrap();
    if dtype == DType::Bool {
        Tensor::from_vec(&[2, 3], (0..6).map(|i| i % 2 == 1).collect()).unwrap()
    } else {
        base.cast(dtype)
    }
}

/// Whether numpy names the type in a `.npy` header (not bf16, float8, float4, int4 or uint4: ml_dtypes
/// saves those as voids of their size).
fn numpy_names(d: DType) -> bool {
    d != DType::BF16 && !d.is_narrow()
}

#[test]
fn numpy_and_onnx_files_read_for_every_dtype() {
    for d in DType::ALL {
        let want = expected(d);
        if numpy_names(d) {
            assert_eq!(
                read_npy(&dir().join(format!("{d}.npy"))).unwrap(),
                want,
                "{d}.npy"
            );
        }
        if d != DType::BF16 {
            assert_eq!(
                read_pb(&dir().join(format!("{d}_raw.pb"))).unwrap().1,
                want,
                "{d}_raw.pb"
            );
        }
        let (name, t) = read_pb(&dir().join(format!("{d}_typed.pb"))).unwrap();
        assert_eq!((name.as_str(), t), (d.name(), want), "{d}_typed.pb");
    }
}

#[test]
fn writes_round_trip_for_every_dtype() {
    let tmp = tempfile::tempdir().unwrap();
    for d in DType::ALL {
        for t in [
            expected(d),
            Tensor::zeros(&TensorType::new(d, vec![])),
            Tensor::zeros(&TensorType::new(d, vec![0, 4])),
        ] {
            let (npy, pb) = (tmp.path().join("t.npy"), tmp.path().join("t.pb"));
            write_npy(&npy, &t).unwrap();
            write_pb(&pb, "t", &t).unwrap();
            if !numpy_names(d) && d != DType::BF16 {
                // Written as one-byte voids, which say nothing of the format: not read back.
                assert!(read_npy(&npy).is_err(), "{d} npy");
            } else {
                assert_eq!(read_npy(&npy).unwrap(), t, "{d} npy");
            }
            assert_eq!(
                read_pb(&pb).unwrap(),
                ("t".to_string(), t.clone()),
                "{d} pb"
            );
        }
    }
}

#[test]
fn bad_tensor_files_are_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("bad.npy");
    let good = std::fs::read(dir().join("f32.npy")).unwrap();
    for (bytes, msg) in [
        (b"nope".to_vec(), "missing magic"),
        (good[..good.len() - 3].to_vec(), "does not match the shape"),
        (good[..20].to_vec(), "truncated header"),
    ] {
        std::fs::write(&p, bytes).unwrap();
        let e = read_npy(&p).unwrap_err().to_string();
        assert!(e.contains(msg), "{e}");
    }
    let p = tmp.path().join("bad.pb");
    let good = std::fs::read(dir().join("f32_raw.pb")).unwrap();
    std::fs::write(&p, &good[..good.len() - 5]).unwrap();
    assert!(read_pb(&p).is_err());
    // Packed 4-bit values one byte short of the shape (3 values need 2 bytes).
    let short = mlopt_onnx::proto::TensorProto {
        dims: vec![3],
        data_type: mlopt_onnx::proto::data_type::INT4,
        raw_data: vec![0x21],
        name: "w".into(),
        ..Default::default()
    };
    let e = mlopt_onnx::tensor_io::tensor_from_proto(&short, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("1 bytes of packed 4-bit values"), "{e}");
}

/// int4 and uint4 are packed two to a byte in ONNX files, the first in the low bits; an odd count leaves
/// the last high half unused; mlopt holds one per byte, int4 sign-extended.
#[test]
fn four_bit_values_unpack_low_half_first() {
    let packed = mlopt_onnx::proto::TensorProto {
        dims: vec![3],
        data_type: mlopt_onnx::proto::data_type::INT4,
        raw_data: vec![0x8f, 0x07],
        ..Default::default()
    };
    let t = mlopt_onnx::tensor_io::tensor_from_proto(&packed, None).unwrap();
    assert_eq!(t.to_i64_vec(), [-1, -8, 7]);
    let back = mlopt_onnx::tensor_io::tensor_to_proto(&t, "w");
    assert_eq!(back.raw_data, [0x8f, 0x07]);
}
