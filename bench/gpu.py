#!/usr/bin/env python3
"""mlopt's GPU libraries run on a real NVIDIA GPU, against PyTorch (cuDNN and cuBLAS) on the same models.

For each zoo architecture (bench/zoo/build.py's, random weights, BatchNorm settled) at each batch size:
the model is exported to ONNX here (TorchScript exporter, or dynamo where that is gone), compiled by
`mlopt compile --target sm_XX` at each precision, linked into a C program that runs the library once on
the same inputs as PyTorch (outputs compared) and then times `mlopt_<name>_run_device` on device buffers
(CUDA driver through dlopen, as the library's own launcher). PyTorch runs the same module on the GPU in
strict fp32 (TF32 off: the reference output), in bf16 autocast, eagerly and replayed from a CUDA graph
(the fairer figure at batch 1, where eager PyTorch is launch-bound). Each figure is the median of
`--rounds` rounds of `--iters` back-to-back runs timed by the wall clock around a stream synchronise.
`--baseline` compiles every model with an earlier mlopt too and times both libraries in the same run,
alternating (`baseline_ms`).

    python3 bench/gpu.py --mlopt PATH/mlopt [--baseline OLD/mlopt] [--target sm_90]
        [--models resnet50,bert_base] [--batch 1,8] [--precision fp32,bf16] [--jobs 8] [--ncu resnet50] --out DIR

Preparation (export, compile) runs on `--jobs` processes first; the GPU runs are serial. Writes
DIR/gpu.jsonl (one line per model, batch and precision) and prints a markdown table; `--ncu MODEL`
also times each of that model's kernels under Nsight Compute (DIR/<model>.ncu.csv) beside the cost
model's roofline per kernel. Needs a machine with an NVIDIA GPU, PyTorch with CUDA, ptxas and a C
compiler; the model code comes from bench/zoo/build.py (torchvision, transformers).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "zoo"))

RUNNER = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "NAME.h"
/* The inputs' and outputs' byte sizes, from the report. */
static const size_t in_bytes[] = {IN_BYTES}, out_bytes[] = {OUT_BYTES};
enum { NIN = sizeof in_bytes / sizeof *in_bytes, NOUT = sizeof out_bytes / sizeof *out_bytes };
typedef int (*alloc_fn)(uint64_t *, size_t);
typedef int (*copy_fn)(uint64_t, const void *, size_t);
typedef int (*stream_fn)(void **, unsigned);
typedef int (*sync_fn)(void *);
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
static void *read_file(const char *path, size_t n) {
    void *p = malloc(n ? n : 1); FILE *f = fopen(path, "rb");
    if (!p || !f || (n && fread(p, n, 1, f) != 1)) { fprintf(stderr, "cannot read %s\n", path); exit(5); }
    fclose(f); return p;
}
int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 5, iters = argc > 2 ? atoi(argv[2]) : 20;
    void *m = mlopt_NAME_create(0);
    if (!m) { fprintf(stderr, "create: %s\n", mlopt_NAME_last_error()); return 3; }
    const void *in[NIN + 1]; void *out[NOUT + 1]; char path[64];
    for (int i = 0; i < NIN; i++) { snprintf(path, sizeof path, "in%d.bin", i); in[i] = read_file(path, in_bytes[i]); }
    for (int i = 0; i < NOUT; i++) out[i] = malloc(out_bytes[i] ? out_bytes[i] : 1);
    if (mlopt_NAME_run(m, in, out)) { fprintf(stderr, "run: %s\n", mlopt_NAME_last_error()); return 4; }
    for (int i = 0; i < NOUT; i++) {
        snprintf(path, sizeof path, "out%d.bin", i); FILE *f = fopen(path, "wb");
        fwrite(out[i], out_bytes[i], 1, f); fclose(f);
    }
    if (rounds == 0) return 0;
    void *cu = dlopen("libcuda.so.1", RTLD_NOW);
    alloc_fn alloc = (alloc_fn)dlsym(cu, "cuMemAlloc_v2");
    copy_fn copy = (copy_fn)dlsym(cu, "cuMemcpyHtoD_v2");
    stream_fn mkstream = (stream_fn)dlsym(cu, "cuStreamCreate");
    sync_fn sync = (sync_fn)dlsym(cu, "cuStreamSynchronize");
    uint64_t din[NIN + 1], dout[NOUT + 1]; void *s;
    for (int i = 0; i < NIN; i++) if (alloc(&din[i], in_bytes[i] + 16) || copy(din[i], in[i], in_bytes[i])) return 6;
    for (int i = 0; i < NOUT; i++) if (alloc(&dout[i], out_bytes[i] + 16)) return 6;
    if (mkstream(&s, 0)) return 6;
    for (int i = 0; i < 10; i++) if (mlopt_NAME_run_device(m, din, dout, s)) { fprintf(stderr, "%s\n", mlopt_NAME_last_error()); return 4; }
    sync(s);
    printf("{\"ms\": [");
    for (int r = 0; r < rounds; r++) {
        double t = now();
        for (int i = 0; i < iters; i++) mlopt_NAME_run_device(m, din, dout, s);
        if (sync(s)) return 7;
        printf("%s%.5f", r ? ", " : "", (now() - t) * 1e3 / iters);
    }
    printf("]}\n");
    mlopt_NAME_destroy(m);
    return 0;
}
"""


def error(want, got):
    """The largest difference over all outputs, relative to each output's largest magnitude (compare.py's)."""
    e = 0.0
    for w, g in zip(want, got):
        w, g = np.asarray(w, np.float64), np.asarray(g, np.float64).reshape(np.shape(w))
        scale = max(np.abs(w).max(initial=0.0), 1e-30)
        e = max(e, float(np.abs(g - w).max(initial=0.0) / scale))
    return e


def prepare(job):
    """In a worker: builds the module, exports it, compiles it at each precision. Returns what the GPU
    phase needs, or the error."""
    name, batch, precisions, target, exes, work = job
    import torch

    import build as zoo

    torch.set_num_threads(2)
    torch.manual_seed(zoo.SEED)
    d = Path(work) / f"{name}_b{batch}"
    d.mkdir(parents=True, exist_ok=True)
    m, inputs = zoo.MODELS[name]()
    zoo.no_zero_weights(m)
    zoo.settle_batchnorm(m, inputs)
    m.eval()
    names = list(inputs)
    gen = torch.Generator().manual_seed(zoo.SEED + 3)
    feeds = {k: (torch.randn((batch,) + tuple(v.shape[1:]), generator=gen) if v.is_floating_point() else v.repeat(batch, *[1] * (v.dim() - 1))) for k, v in inputs.items()}
    wrapped = zoo.Wrapped(m, names).eval()
    args = tuple(feeds[n] for n in names)
    t = time.perf_counter()
    try:
        f = zoo.export(wrapped, args, names, d / "onnx", "torchscript")
    except Exception:  # the TorchScript exporter is gone from newer PyTorch
        f = zoo.export(wrapped, args, names, d / "onnx", "dynamo")
    export_s = time.perf_counter() - t
    for i, a in enumerate(args):
        a.numpy().tofile(d / f"in{i}.bin")
    # The weights and inputs, not the module: some architectures are local classes, which do not pickle.
    torch.save({"state": wrapped.state_dict(), "names": names, "args": args}, d / "torch.pt")
    out = {"name": name, "batch": batch, "dir": str(d), "export_s": export_s, "compiled": {}, "baseline": {}}
    pins = [f"--input-shape={n}={'x'.join(str(x) for x in a.shape)}" for n, a in zip(names, args)]
    for (build, exe), p in [(b, p) for b in exes.items() for p in precisions]:
        o = d / (p if build == "compiled" else f"{p}-{build}")
        t = time.perf_counter()
        r = subprocess.run([exe, "compile", str(f), "--target", target, "--precision", p, "--name", name, "-o", str(o)] + pins, capture_output=True, text=True)
        compile_s = time.perf_counter() - t
        if r.returncode != 0:
            out[build][p] = {"error": (r.stderr.strip().splitlines() or ["compile failed"])[-1]}
            continue
        rep = json.loads((o / f"{name}.report.json").read_text())
        size = {"f32": 4, "bf16": 2, "f16": 2, "i64": 8, "i32": 4, "u8": 1, "i8": 1, "bool": 1, "f64": 8}
        nbytes = lambda io: int(np.prod(io["shape"], dtype=np.int64)) * size[io["dtype"]]
        src = RUNNER.replace("NAME", name).replace("IN_BYTES", ", ".join(str(nbytes(i)) for i in rep["inputs"])).replace("OUT_BYTES", ", ".join(str(nbytes(i)) for i in rep["outputs"]))
        (o / "main.c").write_text(src)
        cc = subprocess.run(["cc", "-O2", "main.c", "-I.", "-L.", f"-l{name}", "-ldl", "-o", "main"], cwd=o, capture_output=True, text=True)
        if cc.returncode != 0:
            out[build][p] = {"error": cc.stderr[-500:]}
            continue
        for i in range(len(args)):
            os.link(d / f"in{i}.bin", o / f"in{i}.bin")
        roof = sum(k["roofline_s"] for k in rep["gpu_kernels"])
        out[build][p] = {"dir": str(o), "compile_s": compile_s, "kernels": len(rep["gpu_kernels"]), "roofline_ms": roof * 1e3, "outputs": rep["outputs"]}
    return out


def torch_times(module, args, rounds, iters, bf16):
    """Median ms of eager runs and of CUDA-graph replays (None where capture fails), and the output."""
    import torch

    def fwd():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            return module(*args)

    def timed(fn):
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(rounds):
            t = time.perf_counter()
            for _ in range(iters):
                fn()
            torch.cuda.synchronize()
            ts.append((time.perf_counter() - t) * 1e3 / iters)
        return statistics.median(ts)

    with torch.no_grad():
        out = fwd()
        eager = timed(fwd)
        graph = None
        try:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    fwd()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fwd()
            graph = timed(g.replay)
        except Exception:
            pass
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return eager, graph, [o.float().cpu().numpy() for o in outs]


def ncu_kernels(run_dir, name):
    """Each kernel of one run under Nsight Compute: (kernel name, ms), in launch order."""
    import csv
    import io

    r = subprocess.run(["ncu", "--clock-control", "none", "--metrics", "gpu__time_duration.sum", "--csv", "--print-units", "base", "./main", "0"], cwd=run_dir, capture_output=True, text=True, timeout=120)
    rows = [x for x in csv.DictReader(io.StringIO(r.stdout[r.stdout.find('"ID"'):])) if x.get("Metric Name") == "gpu__time_duration.sum"]
    return [(x["Kernel Name"], float(x["Metric Value"].replace(",", "")) * 1e-6) for x in rows]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mlopt", required=True)
    ap.add_argument("--baseline", default="", help="an earlier mlopt, compiled and timed in the same run (baseline_ms)")
    ap.add_argument("--target", default="sm_90")
    ap.add_argument("--models", default="resnet50,mobilenet_v2,efficientnet_b0,bert_base")
    ap.add_argument("--batch", default="1")
    ap.add_argument("--precision", default="fp32,bf16")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--ncu", default="")
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/mlopt-gpu", help="exports, libraries and programs")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(a.work)
    precisions = a.precision.split(",")
    exes = {"compiled": os.path.abspath(a.mlopt)} | ({"baseline": os.path.abspath(a.baseline)} if a.baseline else {})
    jobs = [(n, int(b), precisions, a.target, exes, str(work)) for b in a.batch.split(",") for n in a.models.split(",")]
    t = time.perf_counter()
    prepared = []
    with ProcessPoolExecutor(a.jobs) as pool:
        futures = [pool.submit(prepare, j) for j in jobs]
        for j, fut in zip(jobs, futures):
            try:
                prepared.append(fut.result())
            except Exception as e:  # one model's export failing does not stop the others
                print(f"{j[0]} b{j[1]}: preparation failed: {e!r}", flush=True)
    print(f"prepared {len(prepared)} of {len(jobs)} in {time.perf_counter() - t:.0f} s", flush=True)

    import torch

    import build as zoo

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    print(f"GPU: {torch.cuda.get_device_name(0)}; PyTorch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}", flush=True)
    rows = []
    jsonl = (out / "gpu.jsonl").open("w")
    for p in prepared:
        saved = torch.load(Path(p["dir"]) / "torch.pt", weights_only=False)
        module = zoo.Wrapped(zoo.MODELS[p["name"]]()[0], saved["names"])
        module.load_state_dict(saved["state"])
        module = module.cuda().eval()
        args = tuple(x.cuda() for x in saved["args"])
        ref_eager, ref_graph, ref = torch_times(module, args, a.rounds, a.iters, False)
        bf_eager, bf_graph, bf_out = torch_times(module, args, a.rounds, a.iters, True)
        torch_bf16_err = error(ref, bf_out)
        for prec, c in p["compiled"].items():
            row = {"model": p["name"], "batch": p["batch"], "precision": prec, "target": a.target}
            torch_ms = (ref_eager, ref_graph) if prec == "fp32" else (bf_eager, bf_graph)
            row.update(torch_eager_ms=torch_ms[0], torch_graph_ms=torch_ms[1], torch_bf16_err=torch_bf16_err)
            base = p["baseline"].get(prec)
            if "error" in c:
                row["error"] = c["error"]
            else:
                # The build and the baseline alternate, twice each; each figure is the median of all its rounds.
                times = {"mlopt": [], "baseline": []}
                runs = [("mlopt", c), ("baseline", base)] * 2 if base and "error" not in base else [("mlopt", c)]
                for who, cc in runs:
                    r = subprocess.run(["./main", str(a.rounds), str(a.iters)], cwd=cc["dir"], capture_output=True, text=True, timeout=120)
                    if r.returncode != 0:
                        row[f"{who}_error"] = f"exit {r.returncode}: {r.stderr.strip()[-300:]}"
                        continue
                    times[who] += json.loads(r.stdout.strip().splitlines()[-1])["ms"]
                    got = [np.fromfile(Path(cc["dir"]) / f"out{i}.bin", dtype=np.float32) for i in range(len(cc["outputs"]))]
                    row[f"{who}_err" if who == "baseline" else "err"] = error(ref, got)
                if times["mlopt"]:
                    row.update(mlopt_ms=statistics.median(times["mlopt"]), compile_s=c["compile_s"], kernels=c["kernels"], roofline_ms=c["roofline_ms"])
                else:
                    row["error"] = row.get("mlopt_error", "no run")
                if times["baseline"]:
                    row.update(baseline_ms=statistics.median(times["baseline"]), baseline_kernels=base["kernels"])
                elif base:
                    row["baseline_error"] = base.get("error", row.get("baseline_error"))
                if p["name"] in a.ncu.split(",") and "error" not in row:
                    try:
                        ks = ncu_kernels(c["dir"], p["name"])
                    except Exception as e:
                        print(f"ncu: {e!r}", flush=True)
                        ks = []
                    roof = {k["name"]: k for k in json.loads((Path(c["dir"]) / f"{p['name']}.report.json").read_text())["gpu_kernels"]}
                    with (out / f"{p['name']}_b{p['batch']}_{prec}.ncu.csv").open("w") as f:
                        f.write("kernel,ms,roofline_ms,schedule\n")
                        for k, ms_k in ks:
                            rk = roof.get(k, {"roofline_s": float("nan"), "schedule": "?"})
                            f.write(f"{k},{ms_k:.5f},{rk['roofline_s'] * 1e3:.5f},\"{rk['schedule']}\"\n")
                    row["ncu_sum_ms"] = sum(x[1] for x in ks)
            rows.append(row)
            jsonl.write(json.dumps(row) + "\n")
            jsonl.flush()
            print(json.dumps(row), flush=True)
        del module, args
        torch.cuda.empty_cache()
    print(f"\n| model | batch | precision | mlopt ms | baseline ms | mlopt/baseline | torch eager ms | torch graph ms | mlopt/graph | roofline ms | err vs torch fp32 | torch bf16 err | compile s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['model']} | {r['batch']} | {r['precision']} | {r['error']} |")
            continue
        g = r["torch_graph_ms"]
        ratio = f"{r['mlopt_ms'] / g:.2f}" if g else "-"
        gs = f"{g:.3f}" if g else "-"
        b = r.get("baseline_ms")
        bs, br = (f"{b:.3f}", f"{r['mlopt_ms'] / b:.2f}") if b else ("-", "-")
        print(f"| {r['model']} | {r['batch']} | {r['precision']} | {r['mlopt_ms']:.3f} | {bs} | {br} | {r['torch_eager_ms']:.3f} | {gs} | {ratio} | {r['roofline_ms']:.3f} | {r['err']:.1e} | {r['torch_bf16_err']:.1e} | {r['compile_s']:.1f} |")


if __name__ == "__main__":
    main()
