#!/usr/bin/env python3
"""mlopt vs ONNX Runtime (and OpenVINO when installed), side by side in one run, on the same machine.

For each model and thread count: `mlopt bench --json` (median of N runs of the compiled library, at
`--precision`) and ORT with all graph optimisations, intra-op threads = N, median of N runs after warm-up,
on the same random inputs' shapes. With the `openvino` package installed, also OpenVINO's CPU plugin
(latency hint, N threads) at f32 and at bf16 (its default on CPUs with AMX/AVX512-BF16). Prints a markdown
table; ratios are mlopt / other, < 1 means mlopt is faster. Compare an fp32 mlopt with ORT and OV f32, a
`--precision bf16` mlopt with OV bf16.

usage: bench/compare_ort.py [--mlopt target/release/mlopt] [--iters 200] [--threads 1,2] [--precision fp32] MODEL.onnx...
"""
import argparse, json, os, subprocess, sys, time
import numpy as np
import onnxruntime as ort

DTYPES = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(bool)": np.bool_}


def ort_ms(model, threads, iters, shapes):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    s = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    feeds = feeds_for([(i.name, i.shape, DTYPES.get(i.type, np.float32)) for i in s.get_inputs()], shapes)
    for _ in range(10):
        s.run(None, feeds)
    t = []
    for _ in range(iters):
        a = time.perf_counter()
        s.run(None, feeds)
        t.append((time.perf_counter() - a) * 1e3)
    t.sort()
    return t[len(t) // 2]


def feeds_for(inputs, shapes):
    rng = np.random.default_rng(0)
    feeds = {}
    for name, dims, dtype in inputs:
        symbolic = not all(isinstance(d, int) for d in dims)
        shape = shapes.get(name) if symbolic and name in shapes else [d if isinstance(d, int) else 1 for d in dims]
        feeds[name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def ov_ms(model, threads, iters, shapes, precision):
    """OpenVINO CPU at `precision` ("f32" or "bf16"), or None when openvino is not installed."""
    try:
        import openvino as ov
    except ImportError:
        return None
    core = ov.Core()
    m = core.read_model(model)
    cfg = {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": precision, "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1}
    c = core.compile_model(m, "CPU", cfg)
    ins = [(i.get_any_name(), [d.get_length() if d.is_static else None for d in i.get_partial_shape()], np.float32) for i in m.inputs]
    feeds = feeds_for(ins, shapes)
    r = c.create_infer_request()
    for _ in range(10):
        r.infer(feeds)
    t = []
    for _ in range(iters):
        a = time.perf_counter()
        r.infer(feeds)
        t.append((time.perf_counter() - a) * 1e3)
    t.sort()
    return t[len(t) // 2]


def mlopt_ms(mlopt, model, threads, iters, shape_args, precision):
    cmd = [mlopt, "bench", model, "--threads", str(threads), "--iters", str(iters), "--precision", precision, "--json"] + shape_args
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--mlopt", default="target/release/mlopt")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--input-shape", action="append", default=[], help="NAME=1x3x224x224, for symbolic dims")
    ap.add_argument("--precision", default="fp32", help="mlopt's --precision (fp32, bf16, auto)")
    a = ap.parse_args()
    shapes = {s.split("=")[0]: [int(d) for d in s.split("=")[1].split("x")] for s in a.input_shape}
    print(f"| model | threads | mlopt {a.precision} ms | ORT ms | mlopt / ORT | OV f32 ms | OV bf16 ms | mlopt / OV f32 | mlopt / OV bf16 | compile s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for m in a.models:
        # Only pin the inputs that have symbolic dimensions in this model.
        symbolic = {i.name for i in ort.InferenceSession(m, providers=["CPUExecutionProvider"]).get_inputs() if not all(isinstance(d, int) for d in i.shape)}
        shape_args = sum((["--input-shape", f"{k}={'x'.join(map(str, v))}"] for k, v in shapes.items() if k in symbolic), [])
        for th in [int(t) for t in a.threads.split(",")]:
            r = mlopt_ms(a.mlopt, m, th, a.iters, shape_args, a.precision)
            o = ort_ms(m, th, a.iters, shapes)
            v32, v16 = ov_ms(m, th, a.iters, shapes, "f32"), ov_ms(m, th, a.iters, shapes, "bf16")
            name = os.path.basename(os.path.dirname(m)) if os.path.basename(m) == "model.onnx" else os.path.splitext(os.path.basename(m))[0]
            ms = r["median_ms"]
            fmt = lambda v: "-" if v is None else f"{v:.4f}"
            ratio = lambda v: "-" if v is None else f"{ms / v:.2f}"
            print(f"| {name} | {th} | {ms:.4f} | {o:.4f} | {ms / o:.2f} | {fmt(v32)} | {fmt(v16)} | {ratio(v32)} | {ratio(v16)} | {r['compile_s']:.2f} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
