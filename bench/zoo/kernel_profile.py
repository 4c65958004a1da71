"""Profiles every zoo model (`mlopt bench --profile --json`) and prints, per model, what holds it back: the
run's time, how much of it the kernels account for, the share spent in scalar kernels, the share whose
estimate is within 2x of the measurement, and the slowest kernels with their schedule class and rate.
Each model's roofline.svg and JSON land in --out/<model>/.

    ~/.cache/mlopt/zoo/venv/bin/python bench/zoo/kernel_profile.py [--only resnet50,...] [--threads 1] [--iters 5]
"""

# (Not named profile.py: the scripts here run with this folder first on sys.path, where a profile.py
# hides the standard library module torch imports.)

import argparse
import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
ZOO = Path(os.environ.get("MLOPT_ZOO", Path.home() / ".cache/mlopt/zoo"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mlopt", default=str(ROOT / "target/release/mlopt"))
    ap.add_argument("--only", default="")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--top", type=int, default=3)
    ap.add_argument("--out", default=str(ZOO / "profiles"))
    a = ap.parse_args()
    only = [s for s in a.only.split(",") if s]
    manifest = json.loads((ZOO / "manifest.json").read_text())
    names = []
    for e in manifest.values():
        if e["name"] not in names and (not only or e["name"] in only):
            names.append(e["name"])
    rows = []
    for name in names:
        e = next((manifest.get(f"{name}/{x}") for x in ("dynamo", "torchscript") if manifest.get(f"{name}/{x}", {}).get("file")), None)
        if e is None:
            continue
        out = Path(a.out) / name
        out.mkdir(parents=True, exist_ok=True)
        pins = [f"--input-shape={i['name']}={'x'.join(str(d) for d in i['shape'])}" for i in e["inputs"]]
        r = subprocess.run([a.mlopt, "bench", "model.onnx", "--profile", "--json", "--iters", str(a.iters), "--threads", str(a.threads), "-o", str(out)] + pins, cwd=Path(e["file"]).parent, capture_output=True, text=True)
        if r.returncode != 0:
            rows.append(f"| {name} | error: {(r.stderr.strip().splitlines() or [''])[-1][:150]} |")
            print(rows[-1], flush=True)
            continue
        p = json.loads(r.stdout)
        (out / "profile.json").write_text(r.stdout)
        ks = p["kernels"]
        total = p["kernel_sum_ms"]
        scalar = sum(k["measured_ms"] for k in ks if k["schedule"] == "scalar") / total
        top = "; ".join(f"{k['id']} {'+'.join(k['ops'][:3])} -> {k.get('output', '')} [{k['schedule']}{'/' + k['matrix'] if k.get('matrix') else ''}] {100 * k['measured_ms'] / total:.0f}% {k['gflops']:.1f} GF/s" for k in ks[: a.top])
        rows.append(f"| {name} | {p['median_ms']:.1f} | {100 * total / p['mean_ms']:.1f}% | {len(ks)} | {100 * scalar:.0f}% | {100 * p['estimate_within_2x_share']:.0f}% | {top} |")
        print(rows[-1], flush=True)
    print(f"\n| model | median ms ({a.threads} thread) | kernels / run | kernels | time in scalar kernels | estimate within 2x | slowest kernels (share, achieved GFLOP/s) |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
