"""Builds mlopt's public model zoo: real architectures with random weights (no download), exported to ONNX
twice where both exporters work, with fixed-seed inputs, ONNX Runtime's outputs as test data, and a
manifest.

    bench/zoo/build.sh [--only NAME,NAME] [--force]        # creates the venv, then runs this script

Each model lands in $ZOO/models/<name>/<exporter>/ (exporter: `dynamo`, opset 18 with weights as external
data and static shapes; `torchscript`, opset 17, one file, with a symbolic batch dimension) as model.onnx plus test_data_set_0/{input,output}_K.pb. The
manifest ($ZOO/manifest.json) lists, per model and exporter, the file, its inputs (name, shape, dtype,
.npy), GFLOP (torch's flop counter: 2 per multiply-add) and, where an export failed, why.
"""

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

ZOO = Path(os.environ.get("MLOPT_ZOO", Path.home() / ".cache/mlopt/zoo"))
SEED = 0


class YoloStyle(nn.Module):
    """A YOLOv5s-style detector written here (no hub download): CSP backbone, SPPF, PAN neck and a
    3-scale detection head, outputs before any decoding or NMS (what a deployed graph computes)."""

    def __init__(self, classes=80, anchors=3, w=32):
        super().__init__()

        def conv(c1, c2, k=1, s=1, p=None):
            p = k // 2 if p is None else p
            return nn.Sequential(nn.Conv2d(c1, c2, k, s, p, bias=False), nn.BatchNorm2d(c2), nn.SiLU())

        class C3(nn.Module):
            def __init__(self, c1, c2, n=1, shortcut=True):
                super().__init__()
                h = c2 // 2
                self.cv1, self.cv2, self.cv3 = conv(c1, h), conv(c1, h), conv(2 * h, c2)
                self.m = nn.ModuleList(nn.Sequential(conv(h, h), conv(h, h, 3)) for _ in range(n))
                self.shortcut = shortcut

            def forward(self, x):
                y = self.cv1(x)
                for b in self.m:
                    y = y + b(y) if self.shortcut else b(y)
                return self.cv3(torch.cat([y, self.cv2(x)], 1))

        class SPPF(nn.Module):
            def __init__(self, c1, c2):
                super().__init__()
                self.cv1, self.cv2, self.pool = conv(c1, c1 // 2), conv(c1 * 2, c2), nn.MaxPool2d(5, 1, 2)

            def forward(self, x):
                x = self.cv1(x)
                y1 = self.pool(x)
                y2 = self.pool(y1)
                return self.cv2(torch.cat([x, y1, y2, self.pool(y2)], 1))

        self.stem = conv(3, w, 6, 2, 2)
        self.d1, self.c1 = conv(w, 2 * w, 3, 2), C3(2 * w, 2 * w, 1)
        self.d2, self.c2 = conv(2 * w, 4 * w, 3, 2), C3(4 * w, 4 * w, 2)
        self.d3, self.c3 = conv(4 * w, 8 * w, 3, 2), C3(8 * w, 8 * w, 3)
        self.d4, self.c4 = conv(8 * w, 16 * w, 3, 2), C3(16 * w, 16 * w, 1)
        self.sppf = SPPF(16 * w, 16 * w)
        self.l1, self.u1 = conv(16 * w, 8 * w), C3(16 * w, 8 * w, 1, False)
        self.l2, self.u2 = conv(8 * w, 4 * w), C3(8 * w, 4 * w, 1, False)
        self.e1, self.n1 = conv(4 * w, 4 * w, 3, 2), C3(8 * w, 8 * w, 1, False)
        self.e2, self.n2 = conv(8 * w, 8 * w, 3, 2), C3(16 * w, 16 * w, 1, False)
        out = anchors * (classes + 5)
        self.heads = nn.ModuleList(nn.Conv2d(c, out, 1) for c in (4 * w, 8 * w, 16 * w))
        self.up = nn.Upsample(scale_factor=2, mode="nearest")

    def forward(self, x):
        x = self.c1(self.d1(self.stem(x)))
        p3 = self.c2(self.d2(x))
        p4 = self.c3(self.d3(p3))
        p5 = self.sppf(self.c4(self.d4(p4)))
        h5 = self.l1(p5)
        t4 = self.u1(torch.cat([self.up(h5), p4], 1))
        h4 = self.l2(t4)
        o3 = self.u2(torch.cat([self.up(h4), p3], 1))
        o4 = self.n1(torch.cat([self.e1(o3), h4], 1))
        o5 = self.n2(torch.cat([self.e2(o4), h5], 1))
        return tuple(h(o) for h, o in zip(self.heads, (o3, o4, o5)))


def vision(name, **kw):
    def make():
        import torchvision

        m = getattr(torchvision.models, name)(weights=None, **kw)
        return m, {"x": torch.randn(1, 3, 224, 224)}

    return make


def bert():
    from transformers import BertConfig, BertModel

    m = BertModel(BertConfig(), add_pooling_layer=False)
    ids = torch.randint(0, 30522, (1, 128))
    mask = torch.ones(1, 128, dtype=torch.int64)
    mask[:, 100:] = 0
    return m, {"input_ids": ids, "attention_mask": mask}


def distilbert():
    from transformers import DistilBertConfig, DistilBertModel

    m = DistilBertModel(DistilBertConfig())
    ids = torch.randint(0, 30522, (1, 128))
    mask = torch.ones(1, 128, dtype=torch.int64)
    mask[:, 100:] = 0
    return m, {"input_ids": ids, "attention_mask": mask}


def gpt2():
    from transformers import GPT2Config, GPT2Model

    m = GPT2Model(GPT2Config(use_cache=False))
    return m, {"input_ids": torch.randint(0, 50257, (1, 128))}


def whisper_tiny_encoder():
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    cfg = WhisperConfig(d_model=384, encoder_layers=4, encoder_attention_heads=6, decoder_layers=4, decoder_attention_heads=6, encoder_ffn_dim=1536, decoder_ffn_dim=1536, num_mel_bins=80)
    return WhisperEncoder(cfg), {"input_features": torch.randn(1, 80, 3000)}


def yolo():
    return YoloStyle(), {"x": torch.randn(1, 3, 640, 640)}


def vit():
    from torchvision.models import vit_b_16

    return vit_b_16(weights=None), {"x": torch.randn(1, 3, 224, 224)}


MODELS = {
    "resnet50": vision("resnet50"),
    "mobilenet_v2": vision("mobilenet_v2"),
    "mobilenet_v3_large": vision("mobilenet_v3_large"),
    "efficientnet_b0": vision("efficientnet_b0"),
    "regnet_y_400mf": vision("regnet_y_400mf"),
    "densenet121": vision("densenet121"),
    "squeezenet1_1": vision("squeezenet1_1"),
    "shufflenet_v2_x1_0": vision("shufflenet_v2_x1_0"),
    "googlenet": vision("googlenet", aux_logits=False, init_weights=True),
    "convnext_tiny": vision("convnext_tiny"),
    "vit_b_16": vit,
    "swin_t": vision("swin_t"),
    "bert_base": bert,
    "distilbert": distilbert,
    "gpt2": gpt2,
    "whisper_tiny_encoder": whisper_tiny_encoder,
    "yolo_style": yolo,
}


def no_zero_weights(m):
    """Some architectures start a layer at zero (torchvision's ViT head): its output would be all zeros,
    which any compiler matches. Such weight matrices get small random values instead."""
    gen = torch.Generator().manual_seed(SEED + 2)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() >= 2 and not p.any():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)


def settle_batchnorm(m, inputs):
    """Random weights with BatchNorm's initial statistics (mean 0, variance 1) shrink activations layer by
    layer: torchvision's MobileNet and EfficientNet end at outputs near 1e-15, where any answer passes a
    1e-4 tolerance. A few training-mode passes over random batches give every BatchNorm the statistics of
    the activations it sees, so outputs keep a real scale and a wrong kernel shows."""
    bns = [x for x in m.modules() if isinstance(x, nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None  # a cumulative average over the passes
    m.train()
    gen = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for _ in range(4):
            batch = {k: torch.randn((8,) + tuple(v.shape[1:]), generator=gen) if v.is_floating_point() else v.repeat(8, *[1] * (v.dim() - 1)) for k, v in inputs.items()}
            m(**batch)
    m.eval()


class Wrapped(nn.Module):
    """Keyword inputs in a fixed order, tensor outputs only (transformers return ModelOutput objects)."""

    def __init__(self, m, names):
        super().__init__()
        self.m, self.names = m, names

    def forward(self, *args):
        out = self.m(**dict(zip(self.names, args)))
        if hasattr(out, "last_hidden_state"):
            return out.last_hidden_state
        return out


def gflop(m, args):
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as fc:
        m(*args)
    return fc.get_total_flops() / 1e9


def export(m, args, names, out, exporter):
    out.mkdir(parents=True, exist_ok=True)
    f = out / "model.onnx"
    for old in out.glob("model.onnx*"):
        old.unlink()
    if exporter == "dynamo":
        torch.onnx.export(m, args, str(f), input_names=names, dynamo=True, opset_version=18, external_data=True)
    else:
        # The leading (batch) dimension of every input symbolic, as deployed models are exported, so
        # that `mlopt bench --batch` can vary it; mlopt pins it with --input-shape or from the inputs.
        axes = {n: {0: "batch"} for n in names}
        torch.onnx.export(m, args, str(f), input_names=names, dynamo=False, opset_version=17, dynamic_axes=axes)
    return f


def test_data(f, feeds, out):
    """ONNX Runtime's outputs on the inputs, as ONNX test data (input_K.pb, output_K.pb)."""
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    sess = ort.InferenceSession(str(f), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    outs = sess.run(None, {n: feeds[n] for n in names})
    d = out / "test_data_set_0"
    d.mkdir(exist_ok=True)
    for k, n in enumerate(names):
        onnx.save_tensor(numpy_helper.from_array(feeds[n], n), str(d / f"input_{k}.pb"))
    for k, (o, v) in enumerate(zip(sess.get_outputs(), outs)):
        onnx.save_tensor(numpy_helper.from_array(v, o.name), str(d / f"output_{k}.pb"))
    return [{"name": n, "shape": list(feeds[n].shape), "dtype": str(feeds[n].dtype), "npy": str(out / f"{n}.npy")} for n in names]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="", help="comma-separated model names")
    ap.add_argument("--force", action="store_true", help="export again even where the model exists")
    a = ap.parse_args()
    only = [s for s in a.only.split(",") if s]
    for n in only:
        if n not in MODELS:
            sys.exit(f"unknown model {n}; known: {', '.join(MODELS)}")
    manifest_path = ZOO / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    for name, make in MODELS.items():
        if only and name not in only:
            continue
        torch.manual_seed(SEED)
        np.random.seed(SEED)
        m, inputs = make()
        no_zero_weights(m)
        settle_batchnorm(m, inputs)
        m.eval()
        names = list(inputs)
        args = tuple(inputs.values())
        w = Wrapped(m, names).eval()
        feeds = {n: t.numpy() for n, t in inputs.items()}
        with torch.no_grad():
            flop = gflop(w, args)
        for exporter in ("dynamo", "torchscript"):
            key = f"{name}/{exporter}"
            out = ZOO / "models" / name / exporter
            if not a.force and key in manifest and manifest[key].get("file") and Path(manifest[key]["file"]).exists():
                print(f"{key}: present")
                continue
            t = time.time()
            entry = {"name": name, "exporter": exporter, "gflop": round(flop, 4)}
            try:
                with torch.no_grad():
                    f = export(w, args, names, out, exporter)
                for n, v in feeds.items():
                    np.save(out / f"{n}.npy", v)
                entry["inputs"] = test_data(f, feeds, out)
                entry["file"] = str(f)
                entry["data"] = str(out / "test_data_set_0")
                print(f"{key}: exported in {time.time() - t:.1f} s, {flop:.2f} GFLOP")
            except Exception as e:  # noqa: BLE001 - record why, go on with the next
                entry["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
                print(f"{key}: FAILED: {entry['error']}")
                traceback.print_exc(limit=2)
            manifest[key] = entry
            manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    print(f"wrote {manifest_path}")


if __name__ == "__main__":
    main()
