"""Checks every zoo model's compiled code against ONNX Runtime's outputs (`mlopt check --compiled`, rtol
1e-3, atol 1e-4) at each thread count of --threads (1 and 2: a parallel loop's bug shows only at 2), run
in the model's own folder with its bare file name (as a user would), and prints a markdown table: model,
exporter, threads, result, the worst output's error, the outputs' largest magnitude (an
output near zero would pass any tolerance: such a check is marked weak), compile-and-check seconds, and
the reason of a failure. The QDQ copies `quantize.py` adds are left to `compare.py --precision int8`.

    ~/.cache/mlopt/zoo/venv/bin/python bench/zoo/check.py [--mlopt target/release/mlopt] [--only NAME,...]
"""

import argparse
import json
import os
import re
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
ZOO = Path(os.environ.get("MLOPT_ZOO", Path.home() / ".cache/mlopt/zoo"))


def scale(data):
    """The largest magnitude of the expected outputs in a test-data folder."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    m = 0.0
    for f in sorted(Path(data).glob("output_*.pb")):
        a = numpy_helper.to_array(onnx.load_tensor(str(f)))
        if a.size and np.issubdtype(a.dtype, np.number):
            m = max(m, float(np.abs(a.astype(np.float64)).max()))
    return m


def check(a, e, n):
    """One export at `n` threads: its row of the table."""
    folder = Path(e["file"]).parent
    t = time.time()
    try:
        r = subprocess.run([a.mlopt, "check", "model.onnx", "--data", "test_data_set_0", "--compiled", "--threads", n, "--rtol", "1e-3", "--atol", "1e-4"], cwd=folder, capture_output=True, text=True, timeout=a.timeout)
    except subprocess.TimeoutExpired:
        return (e["name"], e["exporter"], n, "timeout", "", "", str(a.timeout), "")
    secs = f"{time.time() - t:.1f}"
    errs = [float(x) for x in re.findall(r"max abs err ([0-9.eE+-]+)", r.stdout)]
    worst = f"{max(errs):.1e}" if errs else ""
    big = scale(folder / "test_data_set_0")
    weak = " (weak: outputs near 0)" if big < 1e-3 else ""
    if r.returncode == 0:
        return (e["name"], e["exporter"], n, "match" + weak, worst, f"{big:.2g}", secs, "")
    if r.returncode == 1:
        return (e["name"], e["exporter"], n, "MISMATCH", worst, f"{big:.2g}", secs, " ".join(r.stdout.split())[:200])
    return (e["name"], e["exporter"], n, "error", worst, f"{big:.2g}", secs, (r.stderr.strip().splitlines() or [""])[-1][:240])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mlopt", default=str(ROOT / "target/release/mlopt"))
    ap.add_argument("--only", default="")
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--threads", default="1,2")
    a = ap.parse_args()
    only = [s for s in a.only.split(",") if s]
    threads = [t for t in a.threads.split(",") if t]
    manifest = json.loads((ZOO / "manifest.json").read_text())
    rows = []
    for key, e in manifest.items():
        if only and e["name"] not in only:
            continue
        # The QDQ int8 copies (quantize.py) carry no ONNX Runtime outputs of their own: compare.py
        # --precision int8 checks them against ORT on the same file and against the float model.
        if e.get("exporter") == "qdq":
            continue
        if not e.get("file"):
            rows.append((e["name"], e["exporter"], "", "not exported", "", "", "", e.get("error", "")))
            print(" | ".join(rows[-1]), flush=True)
            continue
        for n in threads:
            rows.append(check(a, e, n))
            print(" | ".join(rows[-1]), flush=True)
    print("\n| model | exporter | threads | compiled vs ORT | max abs error | max abs output | seconds | reason |\n|---|---|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(x.replace("|", "/") for x in r) + " |")
    ok = sum(1 for r in rows if r[3].startswith("match"))
    weak = sum(1 for r in rows if "weak" in r[3])
    print(f"\n{ok} of {len(rows)} checks (exports x threads) match ONNX Runtime ({weak} of them with outputs near 0)")


if __name__ == "__main__":
    main()
