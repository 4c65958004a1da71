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

#[test]
fn numpy_and_onnx_files_read_for_every_dtype() {
    for d in DType::ALL {
        let want = expected(d);
        if d != DType::BF16 {
            assert_eq!(
                read_npy(&dir().join(format!("{d}.npy"))).unwrap(),
                want,
                "{d}.npy"
            );
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
            assert_eq!(read_npy(&npy).unwrap(), t, "{d} npy");
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
}
