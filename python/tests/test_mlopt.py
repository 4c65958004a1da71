"""The Python package against ONNX Runtime on the repository's fixtures: every fixture compiles and its
outputs match ORT's on the fixture's inputs (the stored reference outputs where ORT lacks an op); bad calls raise mlopt.Error with the compiler's or the
compiled code's message; two models live in one process; save() and profile() work.

Run by `cargo xtask test` (MLOPT set to the mlopt it built); by hand:
    pip install ./python pytest && MLOPT=target/debug/mlopt python -m pytest python/tests
"""

import glob
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import mlopt

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures")
FIXTURES = sorted(
    os.path.dirname(p)
    for p in glob.glob(os.path.join(ROOT, "**", "model.onnx"), recursive=True)
)


def inputs_of(folder):
    """The fixture's inputs in order: arrays, and lists of arrays for sequence inputs."""
    m = onnx.load(os.path.join(folder, "model.onnx"))
    inits = {i.name for i in m.graph.initializer}
    out = []
    for k, vi in enumerate(i for i in m.graph.input if i.name not in inits):
        p = os.path.join(folder, "test_data_set_0", f"input_{k}.pb")
        if not os.path.exists(p):
            break
        with open(p, "rb") as f:
            data = f.read()
        if vi.type.HasField("sequence_type"):
            s = onnx.SequenceProto()
            s.ParseFromString(data)
            out.append(numpy_helper.to_list(s))
        else:
            t = onnx.TensorProto()
            t.ParseFromString(data)
            out.append(numpy_helper.to_array(t))
    return out


def flat(values):
    """Values as a compiled model takes and gives them: a sequence as its elements in turn."""
    return [x for v in values for x in (v if isinstance(v, list) else [v])]


def shapes_of(model, xs):
    """input_shapes for the inputs xs: a list of shapes for a sequence."""
    return {name: [e.shape for e in x] if isinstance(x, list) else x.shape
            for (name, _, _), x in zip(_declared(model), xs)}


def ort_outputs(model, xs):
    s = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return s.run(None, {i.name: x for i, x in zip(s.get_inputs(), xs)})


def reference_outputs(folder, xs):
    """ONNX Runtime's outputs; where ORT lacks an op (DeformConv) the fixture's stored ones, which
    make_fixtures.py took from onnx's reference evaluator."""
    try:
        return ort_outputs(os.path.join(folder, "model.onnx"), xs)
    except ort.capi.onnxruntime_pybind11_state.NotImplemented:
        ts = sorted(glob.glob(os.path.join(folder, "test_data_set_0", "output_*.pb")))
        return [numpy_helper.to_array(onnx.load_tensor(p)) for p in ts]


@pytest.mark.parametrize("folder", FIXTURES, ids=lambda f: os.path.relpath(f, ROOT))
def test_fixture_matches_onnxruntime(folder):
    model = os.path.join(folder, "model.onnx")
    xs = inputs_of(folder)
    m = mlopt.compile(model, input_shapes=shapes_of(model, xs))
    got = m(*xs)
    want = reference_outputs(folder, xs)
    # Sequences are lists, as ONNX Runtime gives them.
    assert [isinstance(g, list) for g in got] == [isinstance(w, list) for w in want]
    got, want = flat(got), flat(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=1e-4, atol=1e-5)
    # By name too, and a second call on the same context.
    again = flat(m(**{name: x for (name, _, _), x in zip(m.inputs, flat(xs))}))
    for a, g in zip(again, got):
        np.testing.assert_array_equal(a, g)


def _declared(model):
    m = onnx.load(model)
    inits = {i.name for i in m.graph.initializer}
    return [(i.name, None, None) for i in m.graph.input if i.name not in inits]


def fixture(name):
    return os.path.join(ROOT, name, "model.onnx")


def test_errors_are_mlopt_errors_with_the_compilers_message():
    with pytest.raises(mlopt.Error, match="no-such.onnx"):
        mlopt.compile("no-such.onnx")
    with pytest.raises(mlopt.Error, match="dynamic; pin it with --input-shape"):
        mlopt.compile(fixture("dynamic"))
    with pytest.raises(mlopt.Error, match="not a C identifier"):
        mlopt.compile(fixture("mlp"), name="my-model")
    m = mlopt.compile(fixture("mlp"))
    with pytest.raises(mlopt.Error, match=r"input 'x' has shape \[2, 64\], the model was compiled for f32\[8, 64\]"):
        m(np.zeros((2, 64), np.float32))
    with pytest.raises(mlopt.Error, match="has no input 'y'"):
        m(y=np.zeros((8, 64), np.float32))
    with pytest.raises(mlopt.Error, match="input 'x': no value given"):
        m()


def test_two_models_save_and_profile(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a = mlopt.compile(fixture("mlp"), name="alpha", threads=2)
    b = mlopt.compile(fixture("cnn"), name="beta")
    xa, xb = inputs_of(os.path.dirname(fixture("mlp")))[0], inputs_of(os.path.dirname(fixture("cnn")))[0]
    (ya,), (yb,) = a(xa), b(xb)
    np.testing.assert_allclose(ya, ort_outputs(fixture("mlp"), [xa])[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(yb, ort_outputs(fixture("cnn"), [xb])[0], rtol=1e-4, atol=1e-5)
    assert "alpha" in repr(a) and a.outputs[0][2] == (8, 10)
    a.save(tmp_path)
    for f in ["libalpha.a", "alpha.h", "alpha.rs", "alpha.report.json"]:
        assert (tmp_path / f).exists(), f
    p = b.profile(iters=5)
    assert p["median_ms"] > 0 and p["kernels"], p
    assert all(k["measured_ms"] >= 0 and k["estimate_ms"] > 0 for k in p["kernels"]), p
    assert not (tmp_path / "out").exists(), "profile() wrote into the working folder"


@pytest.mark.parametrize("spec", [("batch", None), ("N", {"x": ("N", 3, 8, 8)})])
def test_dynamic_batch_matches_onnxruntime_at_every_size(spec):
    sym, shapes = spec
    model = fixture("dynamic")
    m = mlopt.compile(model, input_shapes=shapes, max_batch=(sym, 11))
    assert m.max_batch == 11 and m.inputs[0][2] == (1, 3, 8, 8)
    s = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    for n in [1, 2, 3, 5, 8, 11]:
        x = rng.standard_normal((n, 3, 8, 8)).astype(np.float32)
        (got,) = m(x)
        (want,) = s.run(None, {"x": x})
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    with pytest.raises(mlopt.Error, match="holds 12 items"):
        m(np.zeros((12, 3, 8, 8), np.float32))


def test_a_model_that_mixes_items_gets_no_dynamic_batch(tmp_path):
    from onnx import TensorProto, helper
    # y = x - mean over the batch: items are not independent.
    g = helper.make_graph(
        [helper.make_node("ReduceMean", ["x"], ["m"], axes=[0], keepdims=1),
         helper.make_node("Sub", ["x", "m"], ["y"])],
        "mix", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])
    path = str(tmp_path / "mix.onnx")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    with pytest.raises(mlopt.Error, match="mixes the items of a batch"):
        mlopt.compile(path, max_batch=("batch", 8))


def test_a_data_sized_output_gets_no_dynamic_batch(tmp_path):
    from onnx import TensorProto, helper
    g = helper.make_graph(
        [helper.make_node("NonZero", ["x"], ["nz"]), helper.make_node("Transpose", ["nz"], ["y"], perm=[1, 0])],
        "nz", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, None)])
    path = str(tmp_path / "nz.onnx")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    with pytest.raises(mlopt.Error, match="output 'y' has a size that depends on the data"):
        mlopt.compile(path, max_batch=("batch", 8))


def test_sequences_are_lists_as_in_onnxruntime():
    folder = os.path.join(ROOT, "control", "10")
    model = os.path.join(folder, "model.onnx")
    x, flag, parts = inputs_of(folder)
    m = mlopt.compile(model, input_shapes={"parts": [p.shape for p in parts]})
    assert [i[0] for i in m.inputs] == ["x", "flag", "parts.0", "parts.1", "parts.2"]
    y, grown, n = m(x=x, flag=flag, parts=parts)
    want = ort_outputs(model, [x, flag, parts])
    np.testing.assert_allclose(y, want[0], rtol=1e-5, atol=1e-6)
    assert len(grown) == len(want[1]) == 4 and int(n) == 3
    for g, w in zip(grown, want[1]):
        np.testing.assert_array_equal(g, w)
    with pytest.raises(mlopt.Error, match="a sequence of 3 arrays here: 2 given"):
        m(x, flag, parts[:2])
    with pytest.raises(mlopt.Error, match="given twice"):
        m(x, flag, parts, **{"parts.0": parts[0]})
