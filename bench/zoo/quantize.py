"""int8 copies of the zoo's models, made by ONNX Runtime's quantizers the way its documentation tells a
deployer to. `bench/compare.py --precision int8 [--int8-format F]` runs mlopt, ONNX Runtime and OpenVINO
on these same files. Three formats (`--format`):

- `qdq` (the default): `quantize_static` after shape pre-processing, QuantizeLinear/DequantizeLinear pairs
  around every quantizable op, per-channel symmetric int8 weights, asymmetric uint8 activations
  calibrated (MinMax) on a few inputs;
- `qoperator`: the same calibration written as QOperator ops, QLinearConv and QLinearMatMul (only Conv
  and MatMul are quantized: ONNX Runtime writes its other QOperator ops, QLinearAdd and the like, in its
  own `com.microsoft` domain, which is not ONNX);
- `dynamic`: `quantize_dynamic`, what its documentation recommends for transformers: int8 weights, each
  activation quantized at run time (DynamicQuantizeLinear -> MatMulInteger).

    ~/.cache/mlopt/zoo/venv/bin/python bench/zoo/quantize.py [--format qdq] [--only resnet50,bert_base] [--force]

Each copy is quantized from the TorchScript export (one file, a symbolic batch, so batch 8 runs too; the
dynamo export where there is none) and lands in $ZOO/models/<name>/<format>/model.onnx; the manifest gains
a `<name>/<format>` entry with the float export's inputs (the same .npy files) and GFLOP. Calibration uses
the zoo's saved inputs and three perturbed copies of them (token ids are kept as they are): fixed seeds,
so a rebuild makes the same file.
"""
import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, quantize_static
from onnxruntime.quantization.shape_inference import quant_pre_process

ZOO = Path(os.environ.get("MLOPT_ZOO", Path.home() / ".cache/mlopt/zoo"))
CALIBRATION_SETS = 4
FORMATS = ("qdq", "qoperator", "dynamic")


class Inputs(CalibrationDataReader):
    """The zoo's inputs, then copies with Gaussian noise (a tenth of each float input's spread) added."""

    def __init__(self, inputs):
        saved = {i["name"]: np.load(i["npy"]) for i in inputs}
        rng = np.random.default_rng(0)
        sets = [saved]
        for _ in range(CALIBRATION_SETS - 1):
            sets.append({
                k: (a + 0.1 * (a.std() or 1.0) * rng.standard_normal(a.shape)).astype(a.dtype) if a.dtype.kind == "f" else a
                for k, a in saved.items()
            })
        self.sets = iter(sets)

    def get_next(self):
        return next(self.sets, None)


def quantize(entry, out, fmt):
    """Writes the `fmt` copy of the export `entry` to `out`."""
    with tempfile.TemporaryDirectory() as tmp:
        # A dynamo export keeps its weights beside it as external data, which the pre-processing cannot
        # follow from its own scratch copy: one file first (these models are far below protobuf's 2 GB).
        whole = Path(tmp) / "whole.onnx"
        onnx.save(onnx.load(entry["file"]), str(whole))
        pre = Path(tmp) / "pre.onnx"
        # Symbolic shape inference stumbles on some transformer exports; ONNX's own is enough for QDQ.
        quant_pre_process(str(whole), str(pre), skip_symbolic_shape=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        if fmt == "dynamic":
            quantize_dynamic(str(pre), str(out), weight_type=QuantType.QInt8)
            return
        quantize_static(
            str(pre), str(out), Inputs(entry["inputs"]),
            quant_format=QuantFormat.QDQ if fmt == "qdq" else QuantFormat.QOperator, per_channel=True,
            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
            op_types_to_quantize=None if fmt == "qdq" else ["Conv", "MatMul"],
        )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="comma-separated zoo names (default: all)")
    ap.add_argument("--force", action="store_true", help="quantize again where a copy exists")
    ap.add_argument("--format", default="qdq", choices=FORMATS)
    args = ap.parse_args()
    path = ZOO / "manifest.json"
    manifest = json.loads(path.read_text())
    only = [m for m in args.only.split(",") if m]
    fmt = args.format
    names = sorted({e["name"] for k, e in manifest.items() if k.split("/")[-1] not in FORMATS})
    for name in names:
        if only and name not in only:
            continue
        src = next((manifest[f"{name}/{x}"] for x in ("torchscript", "dynamo") if manifest.get(f"{name}/{x}", {}).get("file")), None)
        if src is None:
            continue
        out = ZOO / "models" / name / fmt / "model.onnx"
        entry = {**src, "exporter": fmt, "file": str(out)}
        if out.exists() and not args.force:
            manifest[f"{name}/{fmt}"] = entry
            continue
        t = time.time()
        try:
            quantize(src, out, fmt)
            manifest[f"{name}/{fmt}"] = entry
            print(f"{name}: quantized in {time.time() - t:.1f} s -> {out}", file=sys.stderr)
        except Exception as e:  # noqa: BLE001
            manifest[f"{name}/{fmt}"] = {"name": name, "exporter": fmt, "error": str(e).splitlines()[0][:300]}
            print(f"{name}: not quantized: {e}", file=sys.stderr)
        path.write_text(json.dumps(manifest, indent=1))
    path.write_text(json.dumps(manifest, indent=1))


if __name__ == "__main__":
    main()
