"""mlopt from Python: compile an ONNX model and call it on numpy arrays.

    import mlopt
    model = mlopt.compile("resnet50.onnx", input_shapes={"x": (1, 3, 224, 224)})
    (logits,) = model(x)                      # numpy in, numpy out (a list, in output order)
A sequence input or output (ONNX's seq(tensor); mlopt compiles it at a fixed length) is a list of
arrays, as in ONNX Runtime: pin its elements' shapes with input_shapes={"NAME": [dims0, dims1, ..]}
(or {"NAME.0": dims0, ..}). The compiled library takes and gives the elements as inputs and outputs of
their own, NAME.0, NAME.1, .. (model.inputs and model.outputs list those).
    model.profile()                           # per-kernel times against the cost model (a dict)
    model.save("out/")                        # the library, C header, Rust binding and report

The package is a thin ctypes layer, not an extension module: `compile` runs the `mlopt` binary (the
`MLOPT` environment variable, else `mlopt` on PATH), links the static library it writes into a shared
library with the system C compiler, and calls the model's C API (`mlopt_<name>_create/run/error/destroy`)
through ctypes. So the package is pure Python (no wheel per Python version, no Rust or LLVM at install
time), and Python runs exactly the library C and Rust programs link. Errors are `mlopt.Error` with the
compiler's own message, or the compiled code's (the same statuses and messages as the C API).
"""

import ctypes
import json
import os
import shutil
import subprocess
import tempfile
import threading

import numpy as np

__all__ = ["Error", "Model", "compile"]


class Error(Exception):
    """What the mlopt compiler or a compiled model rejected: its message names the node, op or input."""


# The C API's element types as numpy dtypes (bf16 has none: its values are passed as their uint16 bits;
# float8 and float4 as their one-byte codes, int4, uint4, int2 and uint2 one value per byte).
_DTYPES = {
    "f32": np.float32,
    "f64": np.float64,
    "f16": np.float16,
    "bf16": np.uint16,
    "i8": np.int8,
    "u8": np.uint8,
    "i16": np.int16,
    "u16": np.uint16,
    "i32": np.int32,
    "u32": np.uint32,
    "i64": np.int64,
    "u64": np.uint64,
    "bool": np.bool_,
    "f8e4m3fn": np.uint8,
    "f8e4m3fnuz": np.uint8,
    "f8e5m2": np.uint8,
    "f8e5m2fnuz": np.uint8,
    "f4e2m1": np.uint8,
    "i4": np.int8,
    "u4": np.uint8,
    "i2": np.int8,
    "u2": np.uint8,
}


def _binary():
    path = os.environ.get("MLOPT") or shutil.which("mlopt")
    if not path:
        raise Error("no mlopt binary: set MLOPT to its path, or put it on PATH "
                    "(cargo install --path crates/mlopt-cli)")
    return path


def _mlopt(args):
    """Runs the mlopt binary; its stdout, or an Error with its message."""
    r = subprocess.run([_binary(), *args], capture_output=True, text=True)
    if r.returncode != 0:
        msg = r.stderr.strip()
        raise Error(msg[len("error: "):] if msg.startswith("error: ") else msg)
    return r.stdout


def _options(target, input_shapes, input_values, precision, threads, options):
    args = ["--target", target, "--precision", precision, "--threads", str(int(threads))]
    for k, dims in (input_shapes or {}).items():
        # A list of shapes is a sequence's: one per element, NAME.0, NAME.1, ..
        seq = len(dims) > 0 and all(isinstance(d, (list, tuple)) for d in dims)
        for name, ds in ([(f"{k}.{i}", d) for i, d in enumerate(dims)] if seq else [(k, dims)]):
            args += ["--input-shape", f"{name}={'x'.join(str(d) for d in ds)}"]
    for k, v in (input_values or {}).items():
        vals = np.asarray(v).reshape(-1)
        args += ["--input-value", f"{k}={','.join(str(x) for x in vals.tolist())}"]
    return args + [str(o) for o in options]


def compile(model, target="host", input_shapes=None, input_values=None, precision="fp32",
            threads=1, name=None, max_batch=None, options=()):
    """Compiles the ONNX file `model` and returns a callable `Model`.

    target: host (this CPU), x86-64-v3, x86-64-v4, znver4, sapphirerapids (sm_80.. compile, but run only
    from C on a machine with CUDA); input_shapes: {input: dims} for symbolic dimensions; input_values:
    {input: value} fixes inputs to constants; precision: fp32, bf16, fp16 or auto; threads: threads of
    the parallel loops; name: the library's name (default: the file's); max_batch: (SYMBOL, BOUND) for a
    dynamic batch, SYMBOL the inputs' first dimension (a name in input_shapes, or the model's own), the
    model then takes 1 to BOUND items per call; options: further `mlopt compile` flags.
    """
    common = _options(target, input_shapes, input_values, precision, threads, options)
    folder = tempfile.mkdtemp(prefix="mlopt-")
    try:
        args = ["compile", os.fspath(model), "-o", folder, *common]
        if name is not None:
            args += ["--name", name]
        if max_batch is not None:
            args += ["--max", f"{max_batch[0]}={int(max_batch[1])}"]
        _mlopt(args)
        return Model(folder, os.fspath(model), common, owns=True)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


def _ports(ios):
    """ONNX's ports over a compiled model's inputs or outputs (report.json's entries): (name, indices,
    is_sequence). A sequence's elements (their "sequence") are consecutive entries and one port."""
    ports = []
    for k, io in enumerate(ios):
        seq = io.get("sequence")
        if seq is not None and ports and ports[-1][2] and ports[-1][0] == seq:
            ports[-1][1].append(k)
        else:
            ports.append((io["name"] if seq is None else seq, [k], seq is not None))
    return ports


class Model:
    """A compiled model: call it with numpy arrays (positionally, in input order, or by input name)."""

    def __init__(self, folder, source, options, owns=False):
        self._folder, self._source, self._options, self._owns = folder, source, options, owns
        self._ctx = None
        reports = [f for f in os.listdir(folder) if f.endswith(".report.json")]
        if len(reports) != 1:
            raise Error(f"{folder} holds {len(reports)} reports: expected one compiled model")
        with open(os.path.join(folder, reports[0])) as f:
            self.report = json.load(f)
        self.name = self.report["name"]
        self.inputs = [(io["name"], io["dtype"], tuple(io["shape"])) for io in self.report["inputs"]]
        self.outputs = [(io["name"], io["dtype"], tuple(io["shape"])) for io in self.report["outputs"]]
        self._in_ports = _ports(self.report["inputs"])
        # A dynamic batch (`max_batch`): the shapes are one item's, and a call takes 1 to max_batch items.
        batch = self.report.get("batch")
        self.max_batch = batch["max"] if batch else None
        self._batched = batch["inputs_batched"] if batch else [False] * len(self.inputs)
        self._lock = threading.Lock()
        self._lib = None
        if not self.report["target"].startswith("sm_"):
            self._load()

    def _load(self):
        n = self.name
        so = os.path.join(self._folder, f"lib{n}.so")
        r = subprocess.run([os.environ.get("CC", "cc"), "-shared", "-o", so, "-Wl,--whole-archive",
                            os.path.join(self._folder, f"lib{n}.a"), "-Wl,--no-whole-archive",
                            "-lm", "-lpthread"], capture_output=True, text=True)
        if r.returncode != 0:
            raise Error(f"linking lib{n}.a into a shared library failed: {r.stderr.strip()}")
        lib = ctypes.CDLL(so)
        vp = ctypes.c_void_p
        self._create = getattr(lib, f"mlopt_{n}_create")
        self._create.restype, self._create.argtypes = vp, []
        self._run = getattr(lib, f"mlopt_{n}_run")
        self._run.restype = ctypes.c_int
        self._run.argtypes = [vp, ctypes.POINTER(vp), ctypes.POINTER(vp)]
        if self.max_batch is not None:
            self._run.argtypes = [vp, ctypes.c_int64, ctypes.POINTER(vp), ctypes.POINTER(vp)]
        self._error = getattr(lib, f"mlopt_{n}_error")
        self._error.restype, self._error.argtypes = ctypes.c_char_p, [vp]
        self._destroy = getattr(lib, f"mlopt_{n}_destroy")
        self._destroy.restype, self._destroy.argtypes = None, [vp]
        self._ctx = self._create()
        if not self._ctx:
            raise Error(f"out of memory for the context of {n}")
        self._lib = lib

    def __call__(self, *args, **kwargs):
        """Runs the model; returns its outputs as numpy arrays, a list in output order (an output whose
        size depends on the data, cut to its size)."""
        if self._lib is None:
            raise Error(f"{self.name} was compiled for {self.report['target']}: a GPU library runs "
                        "from C on a machine with CUDA (save() it), not from this package")
        ports = self._in_ports
        if len(args) > len(ports):
            raise Error(f"{self.name} takes {len(ports)} inputs, {len(args)} were given")
        given = {}

        def put(port, v):
            name, idx, is_seq = port
            if not is_seq:
                given[self.inputs[idx[0]][0]] = v
                return
            if not isinstance(v, (list, tuple)) or len(v) != len(idx):
                got = f"{len(v)} given" if isinstance(v, (list, tuple)) else "not a list"
                raise Error(f"input '{name}' is a sequence of {len(idx)} arrays here: {got}")
            for k, x in zip(idx, v):
                given[self.inputs[k][0]] = x

        for port, v in zip(ports, args):
            put(port, v)
        by_name = {p[0]: p for p in ports}
        by_name.update({i[0]: (i[0], [k], False) for k, i in enumerate(self.inputs)})
        for k, v in kwargs.items():
            if k not in by_name:
                raise Error(f"{self.name} has no input '{k}' (inputs: "
                            f"{', '.join(p[0] for p in ports)})")
            if any(self.inputs[i][0] in given for i in by_name[k][1]):
                raise Error(f"input '{k}' is given twice")
            put(by_name[k], v)
        ins = []
        n = None  # the items of a dynamic batch, from the first batched input
        for (name, dtype, shape), batched in zip(self.inputs, self._batched):
            if name not in given:
                raise Error(f"input '{name}': no value given")
            x = np.asarray(given[name], order="C")  # (ascontiguousarray makes a scalar 1-D)
            want = shape
            if batched and x.ndim == len(shape) and shape[0] > 0 and x.shape[0] % shape[0] == 0:
                k = x.shape[0] // shape[0]
                n = k if n is None else n
                want = (shape[0] * n,) + shape[1:]
                if not 1 <= n <= self.max_batch:
                    raise Error(f"input '{name}' holds {n} items: {self.name} runs 1 to "
                                f"{self.max_batch}")
            if x.shape != want:
                per = " per item" if batched else ""
                raise Error(f"input '{name}' has shape {list(x.shape)}, the model was compiled for "
                            f"{dtype}{list(shape)}{per}")
            if x.dtype != _DTYPES[dtype]:
                if not np.can_cast(x.dtype, _DTYPES[dtype], casting="same_kind"):
                    raise Error(f"input '{name}' is {x.dtype}, the model takes {dtype}")
                x = x.astype(_DTYPES[dtype])
            ins.append(x)
        scale = 1 if n is None else n
        outs = [np.empty((shape[0] * scale,) + shape[1:] if self.max_batch else shape,
                         dtype=_DTYPES[dtype]) for _, dtype, shape in self.outputs]
        vp = ctypes.c_void_p
        in_ptrs = (vp * max(len(ins), 1))(*[x.ctypes.data for x in ins])
        out_ptrs = (vp * max(len(outs), 1))(*[y.ctypes.data for y in outs])
        with self._lock:  # one run at a time per context (the C API's rule)
            if self.max_batch is None:
                status = self._run(self._ctx, in_ptrs, out_ptrs)
            else:
                status = self._run(self._ctx, scale, in_ptrs, out_ptrs)
            if status != 0:
                msg = self._error(self._ctx).decode("utf-8", "replace")
                raise Error(f"{msg} (status {status})")
        return self._exact(outs)

    def _exact(self, outs):
        """The outputs as ONNX defines them, as ONNX Runtime returns them: one whose size depends on the
        data (report.json's "counted") cut to its count, the counts left out, a sequence's elements a
        list."""
        ios = self.report["outputs"]
        counts = {io["counted"]["count_output"] for io in ios if io.get("counted")}
        kept, arrays = [], []
        for k, (y, io) in enumerate(zip(outs, ios)):
            if k in counts:
                continue
            c = io.get("counted")
            if c:
                y = np.take(y, np.arange(int(outs[c["count_output"]].reshape(-1)[0])), axis=c["axis"])
            kept.append(io)
            arrays.append(y)
        return [[arrays[i] for i in idx] if is_seq else arrays[idx[0]]
                for _, idx, is_seq in _ports(kept)]

    def profile(self, iters=50):
        """Builds the model with a clock around each kernel and runs it (`mlopt bench --profile --json`):
        per kernel, its measured time, the cost model's estimate, GFLOP/s and fraction of the roofline
        (the plot, roofline.svg, is written beside the library and kept by save())."""
        out = _mlopt(["bench", self._source, "--profile", "--json", "--iters", str(int(iters)),
                      "-o", self._folder, *self._options])
        return json.loads(out)

    def save(self, folder):
        """Copies the library, its C header, Rust binding, report and stage dumps into `folder`."""
        os.makedirs(folder, exist_ok=True)
        for f in os.listdir(self._folder):
            if not f.startswith(".") and not f.endswith(".so"):
                shutil.copy2(os.path.join(self._folder, f), os.path.join(folder, f))

    def __repr__(self):
        ins = ", ".join(f"{n}: {d}{list(s)}" for n, d, s in self.inputs)
        outs = ", ".join(f"{n}: {d}{list(s)}" for n, d, s in self.outputs)
        return f"<mlopt.Model {self.name} ({ins}) -> ({outs}) for {self.report['target']}>"

    def __del__(self):
        if getattr(self, "_ctx", None):
            self._destroy(self._ctx)
            self._ctx = None
        if getattr(self, "_owns", False):
            shutil.rmtree(self._folder, ignore_errors=True)
