"""A detector's post-processing, the data-sized ops in the form deployed models carry them: scores through
a sigmoid, NonMaxSuppression over every class (at most 100 boxes each, IoU 0.45, score 0.25, YOLO's
defaults), the chosen boxes gathered. mlopt (through its Python package), ONNX Runtime and OpenVINO on the
same model and inputs, in one process, interleaved, 1 thread; the outputs must agree exactly.

    ~/.cache/mlopt/zoo/venv/bin/python bench/postprocess.py --mlopt target/release/mlopt \
        [--boxes 8400] [--classes 80] [--rounds 5] [--iters 10]
"""
import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))


def model(n, c):
    F, I = TensorProto.FLOAT, TensorProto.INT64
    T = numpy_helper.from_array
    nodes = [
        helper.make_node("Sigmoid", ["logits"], ["scores"]),
        helper.make_node("NonMaxSuppression", ["boxes", "scores", "most", "iou", "floor"], ["selected"]),
        helper.make_node("Gather", ["selected", "two"], ["idx"], axis=1),
        helper.make_node("Squeeze", ["boxes", "zero"], ["flat"]),
        helper.make_node("Gather", ["flat", "idx"], ["picked"], axis=0),
    ]
    inits = [T(np.array([100], np.int64), "most"), T(np.array([0.45], np.float32), "iou"),
             T(np.array([0.25], np.float32), "floor"), T(np.array(2, np.int64), "two"),
             T(np.array([0], np.int64), "zero")]
    g = helper.make_graph(nodes, "postprocess",
                          [helper.make_tensor_value_info("boxes", F, [1, n, 4]),
                           helper.make_tensor_value_info("logits", F, [1, c, n])],
                          [helper.make_tensor_value_info("selected", I, ["k", 3]),
                           helper.make_tensor_value_info("picked", F, ["k", 4])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def inputs(n, c, seed=5):
    """Boxes in a 640 x 640 image; logits mostly low, so about 1% of (class, box) pairs score above 0.25."""
    r = np.random.default_rng(seed)
    xy = r.uniform(0, 600, (1, n, 2)).astype(np.float32)
    wh = r.uniform(8, 120, (1, n, 2)).astype(np.float32)
    boxes = np.concatenate([xy, xy + wh], axis=2)[..., [1, 0, 3, 2]]  # (y1, x1, y2, x2)
    logits = (r.standard_normal((1, c, n)) * 1.2 - 4.0).astype(np.float32)
    return {"boxes": boxes, "logits": logits}


def timed(fn, iters):
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t) / iters * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mlopt", required=True)
    ap.add_argument("--boxes", type=int, default=8400)
    ap.add_argument("--classes", type=int, default=80)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=10)
    a = ap.parse_args()
    os.environ["MLOPT"] = a.mlopt
    import mlopt

    feeds = inputs(a.boxes, a.classes)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "postprocess.onnx")
        onnx.save(model(a.boxes, a.classes), path)
        t = time.perf_counter()
        m = mlopt.compile(path, input_shapes={k: v.shape for k, v in feeds.items()})
        compile_s = time.perf_counter() - t
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        runners = {"mlopt": lambda: m(feeds["boxes"], feeds["logits"]),
                   "ORT": lambda: sess.run(None, feeds)}
        try:
            import openvino as ov
            core = ov.Core()
            ovm = core.compile_model(path, "CPU", {"INFERENCE_NUM_THREADS": "1",
                                                   "INFERENCE_PRECISION_HINT": "f32"})
            req = ovm.create_infer_request()
            runners["OpenVINO"] = lambda: [req.infer(feeds)[o] for o in ovm.outputs]
        except Exception as e:  # noqa: BLE001 - OpenVINO is optional here
            print(f"OpenVINO: {e}")
        outs = {k: [np.asarray(x) for x in f()] for k, f in runners.items()}
        for k, o in outs.items():
            for got, want in zip(o, outs["ORT"]):
                assert got.shape == want.shape and np.array_equal(got, want), f"{k} differs from ORT"
        times = {k: [] for k in runners}
        for _ in range(a.rounds):
            for k, f in runners.items():
                times[k].append(timed(f, a.iters))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{a.classes} classes x {a.boxes} boxes: {outs['ORT'][0].shape[0]} boxes chosen; "
          f"mlopt compile {compile_s:.2f} s; outputs agree exactly")
    for k, v in med.items():
        print(f"  {k:9s} {v:8.2f} ms  (x{v / med['ORT']:.2f} ORT)")


if __name__ == "__main__":
    main()
