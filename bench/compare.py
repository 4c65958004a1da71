#!/usr/bin/env python3
"""mlopt against ONNX Runtime and OpenVINO, measured interleaved, each engine in its own process, on the
zoo's inputs.

For each model and thread count, mlopt compiles the model (`mlopt compile --threads N`), its static
library is linked into a shared one and loaded with ctypes in a worker process; ONNX Runtime (all graph
optimisations, N intra-op threads) and OpenVINO's CPU plugin (latency hint, N threads, f32 and its bf16
hint) get a worker each too. One process per engine: OpenVINO in the same process pinned and kept
threads that slowed the mlopt library loaded beside it (ResNet-50 bf16 on Sapphire Rapids: 32-36 ms with
OpenVINO loaded, 20 ms without). Then `--rounds` rounds ask every worker in turn for `--iters` timed runs,
so that a noisy neighbour slows all of them alike; the figure is the median of every timed run. All engines run on the
same input arrays (the manifest's .npy files), and every output is compared with ONNX Runtime's fp32.

    bench/zoo/build.sh                                     # once: the zoo and its venv
    ~/.cache/mlopt/zoo/venv/bin/python bench/compare.py [--models resnet50,vit_b_16] [--threads 1,2]
        [--batch 1,8] [--precision fp32,bf16] [--rounds 5] [--iters 10] [--jsonl results.jsonl] [MODEL.onnx ...]

For each batch size (above 1: the TorchScript exports, whose batch is symbolic, on the zoo's inputs
repeated; OpenVINO reshaped to the same static shapes), model and thread count, mlopt is compiled at
every precision listed and all of them are timed in the same rounds as ORT and OpenVINO. Prints one
markdown table per batch and precision (ratios are mlopt / other: below 1 mlopt is faster; beside
fp32, mlopt/own fp32 is the same run's mlopt fp32), the geomean of each ratio per thread count, and
writes one JSON line per model, thread count, batch and precision. Each output's max error against
ORT's fp32 (the mean over 8 input sets, see `mean_errors`) is in the table, OpenVINO's in the JSON. Build `target/release/mlopt` first (`cargo build --release -p
mlopt-cli`).
"""
import argparse
import ctypes
import json
import math
import multiprocessing as mp
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

ROOT = Path(__file__).resolve().parent.parent
ZOO = Path(os.environ.get("MLOPT_ZOO", Path.home() / ".cache/mlopt/zoo"))


class Mlopt:
    """A model compiled by mlopt, loaded into this process."""

    def __init__(self, exe, model, threads, precision, work, feeds, extra=()):
        out = Path(work) / f"t{threads}"
        t = time.perf_counter()
        pins = [f"--input-shape={n}={'x'.join(str(d) for d in a.shape)}" for n, a in feeds.items()]
        r = subprocess.run([exe, "compile", str(model), "--threads", str(threads), "--precision", precision, "-o", str(out)] + pins + list(extra), capture_output=True, text=True, cwd=Path(model).parent)
        self.compile_s = time.perf_counter() - t
        if r.returncode != 0:
            raise RuntimeError((r.stderr.strip().splitlines() or ["mlopt compile failed"])[-1])
        header = next(out.glob("*.h"))
        name = re.search(r"mlopt_(\w+)_run\s*\(", header.read_text()).group(1)
        lib = next(out.glob("lib*.a"))
        so = out / "model.so"
        subprocess.run(["cc", "-shared", "-o", str(so), "-Wl,--whole-archive", str(lib), "-Wl,--no-whole-archive", "-lm", "-lpthread"], check=True)
        self.lib = ctypes.CDLL(str(so))
        # Loaded: the dumps, the archive and the library's name go (the mapping stays); a full zoo run
        # at two precisions with a baseline otherwise filled the disk.
        shutil.rmtree(out, ignore_errors=True)
        self.run_fn = getattr(self.lib, f"mlopt_{name}_run")
        self.run_fn.restype = ctypes.c_int
        self.run_fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        self.error_fn = getattr(self.lib, f"mlopt_{name}_error")
        self.error_fn.restype = ctypes.c_char_p
        self.error_fn.argtypes = [ctypes.c_void_p]
        create = getattr(self.lib, f"mlopt_{name}_create")
        create.restype = ctypes.c_void_p
        self.arena = create()
        self.lib.mlopt_set_num_threads(ctypes.c_int(threads))

    def bind(self, inputs, outputs):
        """Pointer arrays for `inputs` (in graph order) and preallocated `outputs`."""
        self.ins = [np.ascontiguousarray(a) for a in inputs]
        self.outs = outputs
        self.in_ptrs = (ctypes.c_void_p * len(self.ins))(*[a.ctypes.data for a in self.ins])
        self.out_ptrs = (ctypes.c_void_p * len(self.outs))(*[a.ctypes.data for a in self.outs])

    def __call__(self):
        status = self.run_fn(self.arena, self.in_ptrs, self.out_ptrs)
        if status != 0:
            raise RuntimeError(f"mlopt run: {self.error_fn(self.arena).decode()} (status {status})")
        return self.outs


def ort_session(model, threads):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])


def ov_runner(model, threads, precision, feeds):
    import openvino as ov

    core = ov.Core()
    m = core.read_model(str(model))
    # Static shapes, as mlopt compiles them (a symbolic batch would leave OpenVINO's kernels dynamic).
    m.reshape({i.get_any_name(): list(feeds[i.get_any_name()].shape) for i in m.inputs})
    c = core.compile_model(m, "CPU", {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": precision, "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1})
    r = c.create_infer_request()
    by_name = {i.get_any_name(): feeds[i.get_any_name()] for i in m.inputs}

    def run():
        res = r.infer(by_name)
        return [res[o] for o in c.outputs]

    return run


def engine_main(conn, kind, spec):
    """A worker process: builds one engine (`kind`: ort, ov or mlopt) on `spec`'s feeds, then answers
    the parent: ("time", n) -> n run times in ms; ("run", feeds) -> the outputs on those inputs (the
    bound input arrays are overwritten in place); ("quit", None) ends it. Errors come back as
    ("error", text)."""
    try:
        feeds = spec["feeds"]
        if kind == "ort":
            sess = ort_session(spec["file"], spec["threads"])
            names = [i.name for i in sess.get_inputs()]
            f = lambda: sess.run(None, {k: feeds[k] for k in names})  # noqa: E731
            info = {}
        elif kind == "ov":
            f = ov_runner(spec["file"], spec["threads"], spec["hint"], feeds)
            info = {}
        else:
            m = Mlopt(spec["exe"], spec["file"], spec["threads"], spec["precision"], spec["work"], feeds, spec.get("extra", ()))
            m.bind([feeds[k] for k in spec["names"]], [np.empty(s, dtype=d) for s, d in spec["outs"]])
            m()  # a run that fails is this precision's error, before any timing
            f = m
            info = {"compile_s": m.compile_s}
        conn.send(("ok", info))
    except Exception as e:  # noqa: BLE001
        conn.send(("error", str(e)))
        return
    while True:
        cmd, arg = conn.recv()
        try:
            if cmd == "quit":
                return
            if cmd == "time":
                ms = []
                for _ in range(arg):
                    t = time.perf_counter()
                    f()
                    ms.append((time.perf_counter() - t) * 1e3)
                conn.send(("ok", ms))
            elif cmd == "run":
                for k, a in arg.items():
                    np.copyto(feeds[k], a)
                conn.send(("ok", [np.array(o) for o in f()]))
        except Exception as e:  # noqa: BLE001
            conn.send(("error", str(e)))


class Worker:
    """The parent's handle on an `engine_main` process."""

    def __init__(self, kind, spec):
        ctx = mp.get_context("spawn")  # nothing of this process's libraries or threads in the worker
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=engine_main, args=(child, kind, spec), daemon=True)
        self.proc.start()
        child.close()
        self.info = self._reply()

    def _reply(self):
        try:
            status, value = self.conn.recv()
        except EOFError:
            raise RuntimeError(f"engine process died (exit {self.proc.join(5) or self.proc.exitcode})") from None
        if status != "ok":
            raise RuntimeError(value)
        return value

    def time(self, n):
        self.conn.send(("time", n))
        return self._reply()

    def run(self, feeds):
        self.conn.send(("run", feeds))
        return self._reply()

    def close(self):
        try:
            self.conn.send(("quit", None))
        except (BrokenPipeError, OSError):
            pass
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()


def max_err(got, want):
    """Largest |got - want| relative to want's largest magnitude, over every output."""
    e = 0.0
    for g, w in zip(got, want):
        g, w = np.asarray(g, dtype=np.float64), np.asarray(w, dtype=np.float64)
        if g.shape != w.shape:
            return float("inf")
        scale = max(np.abs(w).max(initial=0.0), 1e-30)
        e = max(e, float(np.abs(g - w).max(initial=0.0) / scale))
    return e


def variants(a, k):
    """The k-th input set of the error check: the zoo's input, then the same shifted along its last
    axis (floats: and along the one before, and mirrored every other set): the same statistics,
    different values."""
    if k == 0:
        return a
    if a.dtype.kind != "f":
        return np.roll(a, k, axis=-1)
    b = np.roll(a, k * (a.shape[-1] // 8 + 1), axis=-1)
    if a.ndim >= 2:
        b = np.roll(b, k * (a.shape[-2] // 8 + 1), axis=-2)
    return b[..., ::-1] if k % 2 else b


def mean_errors(engines, feeds, reference, sets=8):
    """Each engine's error against ONNX Runtime fp32 (`max_err`), the mean over `sets` input sets: one
    input's error is mostly which logits its rounding happens to move (ResNet-50 in bf16: 0.10 to 0.16
    for the same build), so engines are compared on several. Each worker gets the set's inputs in its
    bound arrays (after the timing: none needs the zoo's input back; the workers end here)."""
    errs = {k: [] for k in engines}
    for i in range(sets):
        fs = {k: variants(a, i) for k, a in feeds.items()}
        ref = reference.run(fs)
        for k, w in engines.items():
            errs[k].append(max_err(w.run(fs), ref))
    return {k: float(np.mean(v)) for k, v in errs.items()}


def models_from(args, batch):
    if args.paths:
        for p in args.paths:
            yield {"name": Path(p).stem if Path(p).stem != "model" else Path(p).parent.name, "file": p, "inputs": None, "gflop": None}
        return
    manifest = json.loads((Path(args.manifest)).read_text())
    only = [m for m in args.models.split(",") if m]
    names = sorted({e["name"] for e in manifest.values()}, key=lambda n: list(manifest).index(f"{n}/dynamo") if f"{n}/dynamo" in manifest else 0)
    for name in names:
        if only and name not in only:
            continue
        # A batch above 1 needs a symbolic batch dimension: the TorchScript exports have one.
        order = ["torchscript"] if batch > 1 else ["dynamo", "torchscript"]
        for exporter in ([args.exporter] if args.exporter != "prefer-dynamo" else order):
            e = manifest.get(f"{name}/{exporter}")
            if e and e.get("file"):
                # (--int8-format mlopt: the runtimes run the qdq copy, or the dynamic one where there is none.)
                formats = ["qdq", "dynamic"] if args.int8_format == "mlopt" else [args.int8_format]
                qdq = next((f for f in (manifest.get(f"{name}/{x}", {}).get("file") for x in formats) if f), None)
                yield {**e, "name": f"{name}" if args.exporter == "prefer-dynamo" else f"{name}/{exporter}", "qdq": qdq}
                break


def calibration_dir(entry, names, batch, work):
    """`--int8-format mlopt`: the calibration inputs bench/zoo/quantize.py gives ONNX Runtime's
    quantizer, each repeated `batch` times along the first axis, as test_data_set_K/input_J.pb."""
    sys.path.insert(0, str(ROOT / "bench/zoo"))
    import quantize  # noqa: PLC0415
    from onnx import numpy_helper  # noqa: PLC0415
    root = Path(work) / f"calibration.{entry['name'].replace('/', '_')}.b{batch}"
    reader = quantize.Inputs(entry["inputs"])
    k = 0
    while (s := reader.get_next()) is not None:
        d = root / f"test_data_set_{k}"
        d.mkdir(parents=True, exist_ok=True)
        for j, n in enumerate(names):
            a = np.concatenate([s[n]] * batch, axis=0) if batch > 1 else s[n]
            (d / f"input_{j}.pb").write_bytes(numpy_helper.from_array(a, n).SerializeToString())
        k += 1
    return str(root)


def feeds_for(entry, sess, batch=1):
    """The model's inputs: the zoo's saved ones (batch 1), repeated `batch` times along the first axis."""
    if entry["inputs"]:
        feeds = {i["name"]: np.load(i["npy"]) for i in entry["inputs"]}
    else:
        rng = np.random.default_rng(0)
        types = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(int32)": np.int32}
        feeds = {i.name: rng.standard_normal([d if isinstance(d, int) else 1 for d in i.shape]).astype(types.get(i.type, np.float32)) for i in sess.get_inputs()}
    return {k: np.concatenate([a] * batch, axis=0) if batch > 1 else a for k, a in feeds.items()}


def measure(engines, rounds, iters, budget_s=0.5):
    """Interleaved rounds: each engine's worker runs up to `iters` times per round (fewer when one run
    takes more than `budget_s / iters`, at least once); returns each engine's median ms over every
    timed run."""
    times = {k: [] for k in engines}
    per_round = {}
    for k, w in engines.items():
        once = w.time(2)[-1] / 1e3
        per_round[k] = max(1, min(iters, int(budget_s / max(once, 1e-9))))
        # At least three timed runs in all, so the median is not the mean of two: one run stalled by
        # the host (a 14.8 s GPT-2 run among 0.65 s ones, on a shared Zen 1) otherwise doubled a figure.
        per_round[k] = max(per_round[k], -(-3 // max(rounds, 1)))
    keys = list(engines)
    for r in range(rounds):
        # Rotated each round: at 2 threads the engine right after ONNX Runtime ran ~10% slower (its
        # spinning workers), so a fixed order favoured whichever mlopt build came later.
        for k in keys[r % len(keys):] + keys[: r % len(keys)]:
            # Let the last engine's spinning workers go to sleep before timing the next one: 20 ms was
            # not enough after ONNX Runtime at 2 threads (mlopt's next ResNet-50 run took 35 ms, not
            # 11); after 100 ms the first run is as fast as the rest.
            time.sleep(0.1)
            times[k].extend(engines[k].time(per_round[k]))
    return {k: float(np.median(v)) for k, v in times.items()}


def geomean(xs):
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def fmt(v, spec=".2f"):
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, spec)


def run_model(args, entry, n, batch, precisions, work):
    """One model at `n` threads and `batch`: ORT, OpenVINO (f32 and bf16 hints) and mlopt (and the
    baseline) at each precision, all timed in the same interleaved rounds; one row per precision, each
    with the same ORT and OpenVINO figures and (beside fp32) mlopt's own fp32 time."""
    rows = []
    common = {"model": entry["name"], "file": entry["file"], "threads": n, "batch": batch, "gflop": entry["gflop"] * batch if entry.get("gflop") else None}
    notes = {p: {} for p in precisions}
    engines = {}
    try:
        sess = ort_session(entry["file"], n)
        feeds = feeds_for(entry, sess, batch)
        names = [i.name for i in sess.get_inputs()]
        outs = [(r.shape, r.dtype) for r in sess.run(None, {k: feeds[k] for k in names})]
        del sess
        base = {"file": str(Path(entry["file"]).resolve()), "threads": n, "feeds": feeds}
        engines["ort"] = Worker("ort", base)
        if not args.no_openvino:
            try:
                for hint in ("f32", "bf16"):
                    engines[f"ov_{hint}"] = Worker("ov", {**base, "hint": hint})
            except Exception as e:  # noqa: BLE001
                common["openvino_error"] = str(e).splitlines()[0][:200]
        # int8: every engine runs the same int8 copy (bench/zoo/quantize.py); OpenVINO executes its
        # quantized ops in int8 whatever the hint, which stays f32 for everything else.
        qdq = entry.get("qdq") if "int8" in precisions else None
        if "int8" in precisions and not qdq:
            notes["int8"]["mlopt_error"] = "no int8 copy of this model in that format: run bench/zoo/quantize.py --format F"
        if qdq:
            engines["ort_int8"] = Worker("ort", {**base, "file": qdq})
            if not args.no_openvino:
                try:
                    engines["ov_int8"] = Worker("ov", {**base, "file": qdq, "hint": "f32"})
                except Exception as e:  # noqa: BLE001
                    common["openvino_int8_error"] = str(e).splitlines()[0][:200]
        slug = entry["name"].replace("/", "_") + f".b{batch}.t{n}"
        for p in precisions:
            for who, exe in (("mlopt", args.mlopt), ("base", args.baseline)):
                if not exe or (p == "int8" and not qdq):
                    continue
                try:
                    # int8 is the int8 copy compiled as it is: its quantization is in the file; or, with
                    # --int8-format mlopt, the float model quantized by mlopt on the same calibration inputs.
                    if p == "int8" and args.int8_format == "mlopt":
                        model = {"precision": "int8", "extra": ["--calibration", calibration_dir(entry, names, batch, work)]}
                    elif p == "int8":
                        model = {"file": str(Path(qdq).resolve()), "precision": "fp32"}
                    else:
                        model = {"precision": p}
                    spec = {**base, "exe": exe, **model, "work": str(Path(work) / f"{slug}.{p}.{who}"), "names": names, "outs": outs}
                    engines[f"{who}_{p}"] = w = Worker("mlopt", spec)
                    if who == "mlopt":
                        notes[p]["compile_s"] = round(w.info["compile_s"], 2)
                except Exception as e:  # noqa: BLE001
                    notes[p][f"{who}_error"] = str(e)[:300]
        ms = measure(engines, args.rounds, args.iters)
        for k, e in mean_errors(engines, feeds, engines["ort"]).items():
            if k.startswith(("mlopt_", "base_")):
                who, p = k.split("_", 1)
                notes[p][f"{who}_err"] = e
            elif k != "ort":
                common[f"{k}_err"] = e
        if "mlopt_int8" in engines and "ort_int8" in engines:
            # Beside the error against ORT's fp32: against ORT on the same quantized file.
            same = mean_errors({"mlopt_int8": engines["mlopt_int8"]}, feeds, engines["ort_int8"])
            notes["int8"]["mlopt_err_same_file"] = same["mlopt_int8"]
    except Exception as e:  # noqa: BLE001
        common["error"] = str(e)[:300]
        ms = {}
    finally:
        for w in engines.values():
            w.close()
    for p in precisions:
        row = {**common, "precision": p, **notes[p]}
        row.update({f"{k}_ms": round(v, 4) for k, v in ms.items() if not k.startswith(("mlopt_", "base_"))})
        for who in ("mlopt", "base"):
            if f"{who}_{p}" in ms:
                row[f"{who}_ms"] = round(ms[f"{who}_{p}"], 4)
        if p != "fp32" and "mlopt_fp32" in ms:
            row["mlopt_fp32_ms"] = round(ms["mlopt_fp32"], 4)
        others = ("ort_int8", "ov_int8", "base", "mlopt_fp32") if p == "int8" else ("ort", "ov_f32", "ov_bf16", "base", "mlopt_fp32")
        for k in others:
            if row.get("mlopt_ms") and row.get(f"{k}_ms"):
                row[f"mlopt_over_{k.removeprefix('mlopt_')}"] = round(row["mlopt_ms"] / row[f"{k}_ms"], 3)
        rows.append(row)
    return rows


def report_int8(rows, threads, batch, fmt_name):
    """The int8 table: every engine on the same int8 file, errors against ORT's fp32 on the float model
    (and mlopt's against ORT on the same file)."""
    print(f"\n## batch {batch}, precision int8 (the {fmt_name} copies of bench/zoo/quantize.py)")
    print("\n| model | threads | mlopt ms | ORT int8 ms | OV int8 ms | mlopt/ORT int8 | mlopt/OV int8 | mlopt/own fp32 | mlopt err | ORT int8 err | OV int8 err | mlopt vs ORT int8 | compile s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        note = r.get("mlopt_error") or r.get("error")
        print(
            f"| {r['model']} | {r['threads']} | {fmt(r.get('mlopt_ms'), '.2f') if not note else 'error: ' + note[:60]} | {fmt(r.get('ort_int8_ms'))} | {fmt(r.get('ov_int8_ms'))} "
            f"| {fmt(r.get('mlopt_over_ort_int8'))} | {fmt(r.get('mlopt_over_ov_int8'))} | {fmt(r.get('mlopt_over_fp32'))} | {fmt(r.get('mlopt_err'), '.1e')} | {fmt(r.get('ort_int8_err'), '.1e')} "
            f"| {fmt(r.get('ov_int8_err'), '.1e')} | {fmt(r.get('mlopt_err_same_file'), '.1e')} | {fmt(r.get('compile_s'), '.1f')} |"
        )
    for n in threads:
        sel = [r for r in rows if r["threads"] == n]
        print(f"\ngeomean at {n} thread(s) over {sum(1 for r in sel if r.get('mlopt_over_ort_int8'))} models: mlopt/ORT int8 {fmt(geomean([r.get('mlopt_over_ort_int8') for r in sel]))}, "
              f"mlopt/OV int8 {fmt(geomean([r.get('mlopt_over_ov_int8') for r in sel]))}, mlopt/own fp32 {fmt(geomean([r.get('mlopt_over_fp32') for r in sel]))}")


def report(args, rows, threads, batch, precision):
    """The table, the baseline's, the geomeans and the runs off ORT for one batch and precision."""
    if precision == "int8":
        return report_int8(rows, threads, batch, args.int8_format)
    print(f"\n## batch {batch}, precision {precision}")
    print(f"\n| model | threads | GFLOP | mlopt ms | ORT ms | OV f32 ms | OV bf16 ms | mlopt/ORT | mlopt/OV f32 | mlopt/OV bf16 | mlopt/own fp32 | mlopt GFLOP/s | mlopt err | compile s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        gfs = r["gflop"] / (r["mlopt_ms"] / 1e3) if r.get("gflop") and r.get("mlopt_ms") else None
        note = r.get("mlopt_error") or r.get("error")
        print(
            f"| {r['model']} | {r['threads']} | {fmt(r.get('gflop'))} | {fmt(r.get('mlopt_ms'), '.2f') if not note else 'error: ' + note[:60]} | {fmt(r.get('ort_ms'))} | {fmt(r.get('ov_f32_ms'))} | {fmt(r.get('ov_bf16_ms'))} "
            f"| {fmt(r.get('mlopt_over_ort'))} | {fmt(r.get('mlopt_over_ov_f32'))} | {fmt(r.get('mlopt_over_ov_bf16'))} | {fmt(r.get('mlopt_over_fp32'))} | {fmt(gfs, '.1f')} | {fmt(r.get('mlopt_err'), '.1e')} | {fmt(r.get('compile_s'), '.1f')} |"
        )
    if args.baseline:
        print(f"\n| model | threads | mlopt ms | baseline ms | mlopt/baseline |")
        print("|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['model']} | {r['threads']} | {fmt(r.get('mlopt_ms'), '.2f')} | {fmt(r.get('base_ms'), '.2f')} | {fmt(r.get('mlopt_over_base'))} |")
    for n in threads:
        sel = [r for r in rows if r["threads"] == n]
        if args.baseline:
            print(f"\ngeomean at {n} thread(s): mlopt/baseline {fmt(geomean([r.get('mlopt_over_base') for r in sel]))}")
        own = f", mlopt/own fp32 {fmt(geomean([r.get('mlopt_over_fp32') for r in sel]))}" if precision != "fp32" else ""
        print(f"\ngeomean at {n} thread(s) over {sum(1 for r in sel if r.get('mlopt_over_ort'))} models: mlopt/ORT {fmt(geomean([r.get('mlopt_over_ort') for r in sel]))}, mlopt/OV f32 {fmt(geomean([r.get('mlopt_over_ov_f32') for r in sel]))}, mlopt/OV bf16 {fmt(geomean([r.get('mlopt_over_ov_bf16') for r in sel]))}{own}")
    # A timing is worth nothing if the answer is wrong: name every run off ORT (fp32 by more than 1e-3 of
    # the largest output, low precision by more than 5e-2), the baseline's too.
    bound = 1e-3 if precision == "fp32" else 5e-2
    for who in ("mlopt", "base"):
        off = [f"{r['model']} x{r['threads']} ({r[who + '_err']:.1e})" for r in rows if (r.get(who + "_err") or 0) > bound]
        if off:
            print(f"\n{'mlopt' if who == 'mlopt' else 'baseline'} is off ORT by more than {bound:g}: " + ", ".join(off))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="*", help="ONNX files instead of the manifest's models")
    ap.add_argument("--manifest", default=str(ZOO / "manifest.json"))
    ap.add_argument("--models", default="", help="comma-separated zoo names (default: all)")
    ap.add_argument("--exporter", default="prefer-dynamo", choices=["prefer-dynamo", "dynamo", "torchscript"])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--precision", default="fp32", help="comma-separated: fp32, bf16, auto, int8 (the int8 copies of bench/zoo/quantize.py, format --int8-format; with fp32 beside it, mlopt/own fp32); all timed in the same rounds")
    ap.add_argument("--int8-format", default="qdq", choices=["qdq", "qoperator", "dynamic", "mlopt"], help="which int8 copy --precision int8 runs (bench/zoo/quantize.py --format); mlopt: ORT and OpenVINO run the qdq copy, mlopt quantizes the float model itself (--precision int8) on the same calibration inputs")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", default="1", help="comma-separated batch sizes (above 1: the TorchScript exports, whose batch dimension is symbolic)")
    ap.add_argument("--iters", type=int, default=10, help="most timed runs per engine per round (fewer for slow engines: about 0.5 s each)")
    ap.add_argument("--mlopt", default=str(ROOT / "target/release/mlopt"))
    ap.add_argument("--baseline", help="another mlopt binary (an earlier commit's), measured in the same run: the table adds its ms and mlopt/baseline")
    # (Results are appended under target/, which git ignores: measurements belong in notes and READMEs.)
    ap.add_argument("--jsonl", default="target/bench/compare.jsonl")
    ap.add_argument("--no-openvino", action="store_true")
    args = ap.parse_args()
    # The workers run in their own directories: a binary given relative to here is found there too.
    args.mlopt = str(Path(args.mlopt).resolve())
    if args.baseline:
        args.baseline = str(Path(args.baseline).resolve())
    threads = [int(t) for t in args.threads.split(",")]
    batches = [int(b) for b in args.batch.split(",")]
    precisions = [p for p in args.precision.split(",") if p]
    bad = [p for p in precisions if p not in ("fp32", "bf16", "auto", "int8")]
    if bad or not precisions or any(b < 1 for b in batches):
        ap.error(f"--precision takes fp32, bf16, auto or int8 and --batch positive sizes (got {args.precision!r}, {args.batch!r})")
    rows = []
    os.makedirs(os.path.dirname(os.path.abspath(args.jsonl)), exist_ok=True)
    out = open(args.jsonl, "a")
    with tempfile.TemporaryDirectory() as work:
        for batch in batches:
            for entry in models_from(args, batch):
                for n in threads:
                    for row in run_model(args, entry, n, batch, precisions, work):
                        rows.append(row)
                        out.write(json.dumps(row) + "\n")
                        out.flush()
                        print(f"{row['model']} b{batch} x{n} {row['precision']}: " + ", ".join(f"{k} {row[k]}" for k in row if k.endswith("_ms") or k.endswith("error")), file=sys.stderr)
    for batch in batches:
        for p in precisions:
            report(args, [r for r in rows if r["batch"] == batch and r["precision"] == p], threads, batch, p)
    print(f"\nwrote {args.jsonl}", file=sys.stderr)


if __name__ == "__main__":
    main()
