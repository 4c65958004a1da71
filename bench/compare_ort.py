#!/usr/bin/env python3
"""mlopt vs ONNX Runtime (and OpenVINO when installed), side by side in one run, on the same machine.

For each model and thread count: `mlopt bench --json` (median of N runs of the compiled library) and ORT with
all graph optimisations, intra-op threads = inter-op threads = N, median of N runs after warm-up, on the same
random inputs' shapes. Prints a markdown table: mlopt ms, ORT ms, ratio (mlopt / ORT; < 1 means mlopt is
faster).

usage: bench/compare_ort.py [--mlopt target/release/mlopt] [--iters 200] [--threads 1,2] MODEL.onnx...
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
    rng = np.random.default_rng(0)
    feeds = {}
    for i in s.get_inputs():
        symbolic = not all(isinstance(d, int) for d in i.shape)
        shape = shapes.get(i.name) if symbolic and i.name in shapes else [d if isinstance(d, int) else 1 for d in i.shape]
        feeds[i.name] = rng.standard_normal(shape).astype(DTYPES.get(i.type, np.float32))
    for _ in range(10):
        s.run(None, feeds)
    t = []
    for _ in range(iters):
        a = time.perf_counter()
        s.run(None, feeds)
        t.append((time.perf_counter() - a) * 1e3)
    t.sort()
    return t[len(t) // 2]


def mlopt_ms(mlopt, model, threads, iters, shape_args):
    cmd = [mlopt, "bench", model, "--threads", str(threads), "--iters", str(iters), "--json"] + shape_args
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--mlopt", default="target/release/mlopt")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--input-shape", action="append", default=[], help="NAME=1x3x224x224, for symbolic dims")
    a = ap.parse_args()
    shapes = {s.split("=")[0]: [int(d) for d in s.split("=")[1].split("x")] for s in a.input_shape}
    print("| model | threads | mlopt ms | ORT ms | mlopt / ORT | compile s |")
    print("|---|---|---|---|---|---|")
    for m in a.models:
        # Only pin the inputs that have symbolic dimensions in this model.
        symbolic = {i.name for i in ort.InferenceSession(m, providers=["CPUExecutionProvider"]).get_inputs() if not all(isinstance(d, int) for d in i.shape)}
        shape_args = sum((["--input-shape", f"{k}={'x'.join(map(str, v))}"] for k, v in shapes.items() if k in symbolic), [])
        for th in [int(t) for t in a.threads.split(",")]:
            r = mlopt_ms(a.mlopt, m, th, a.iters, shape_args)
            o = ort_ms(m, th, a.iters, shapes)
            name = os.path.basename(os.path.dirname(m)) if os.path.basename(m) == "model.onnx" else os.path.splitext(os.path.basename(m))[0]
            print(f"| {name} | {th} | {r['median_ms']:.4f} | {o:.4f} | {r['median_ms'] / o:.2f} | {r['compile_s']:.2f} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
