"""Writes a corpus of hostile models and inputs: what a model file from someone else, or a caller's data,
can hold that mlopt must turn into a clean error (or a correct answer), never a panic, a hang or an
unbounded allocation.

Each case is OUT/<case>/model.onnx (plus files it names) and OUT/<case>/case.txt, lines of
`key value`:
  expect reject   every stage (inspect, compile, run, run --interpret, check --compiled) exits 2 and
                  its message contains the `needle` line's text (the node, op or input at fault);
  expect data     the model compiles; run, run --interpret and check --compiled succeed on the inputs of
                  the `good` lines and all fail (exit 2, message with the needle) on the `bad` ones;
  expect ok       every stage succeeds on the `good` inputs (hostile-looking but valid), and run and
                  run --interpret print the same outputs.
  good NAME=FILE / bad NAME=FILE: an input as .npy in the case's folder. The same inputs are also in
  good/ and bad/ in ONNX's test-data layout (input_K.pb, and output_K.pb from ONNX Runtime for good/).
  pin NAME=VALUE  (reject cases) inspect and compile with --input-value NAME=VALUE must succeed.

Usage: python gen_hostile.py OUT
"""
import os
import shutil
import sys

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

I64_MAX = 2**63 - 1
I64_MIN = -(2**63)
OPSET = 18


def model(nodes, inputs, outputs, inits=(), opset=OPSET):
    g = h.make_graph(nodes, "hostile", inputs, outputs, list(inits))
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def vi(name, dtype, shape):
    return h.make_tensor_value_info(name, dtype, shape)


def f32(name, shape):
    return vi(name, T.FLOAT, shape)


def const(name, array):
    return nh.from_array(np.asarray(array), name)


CASES = {}


def case(name, expect="reject", needle="bad", **extra):
    def register(make):
        CASES[name] = (make, dict(expect=expect, needle=needle, **extra))
        return make

    return register


# --- Arithmetic overflow in shape inference (issue 19, item 2) ---------------------------------------


# (ONNX Runtime returns one element here, where the spec's clamping (start 0, end 3, going down) gives
# none: it negates the step, which overflows. So no reference outputs; mlopt's two engines must agree.)
@case("slice_step_min", expect="ok", good={"x": np.arange(4, dtype=np.float32)}, reference=False)
def _():
    return model(
        [h.make_node("Slice", ["x", "s", "e", "a", "st"], ["y"], name="bad")],
        [f32("x", [4])],
        [f32("y", None)],
        [const("s", np.array([0], np.int64)), const("e", np.array([I64_MAX], np.int64)), const("a", np.array([0], np.int64)), const("st", np.array([I64_MIN], np.int64))],
    )


@case("slice_step_max", expect="ok", good={"x": np.arange(4, dtype=np.float32)})
def _():
    return model(
        [h.make_node("Slice", ["x", "s", "e", "a", "st"], ["y"], name="fine")],
        [f32("x", [4])],
        [f32("y", None)],
        [const("s", np.array([I64_MIN], np.int64)), const("e", np.array([I64_MAX], np.int64)), const("a", np.array([0], np.int64)), const("st", np.array([I64_MAX], np.int64))],
    )


@case("maxpool_pads_huge")
def _():
    return model([h.make_node("MaxPool", ["x"], ["y"], name="bad", kernel_shape=[2, 2], pads=[0, 0, I64_MAX, I64_MAX])], [f32("x", [1, 1, 4, 4])], [f32("y", None)])


@case("pad_huge")
def _():
    return model(
        [h.make_node("Pad", ["x", "p"], ["y"], name="bad")],
        [f32("x", [2, 2])],
        [f32("y", None)],
        [const("p", np.array([0, 0, I64_MAX, I64_MAX], np.int64))],
    )


@case("depth_to_space_block_huge")
def _():
    return model([h.make_node("DepthToSpace", ["x"], ["y"], name="bad", blocksize=2**32)], [f32("x", [1, 4, 2, 2])], [f32("y", None)])


@case("reshape_product_overflow")
def _():
    return model(
        [h.make_node("Reshape", ["x", "s"], ["y"], name="bad")],
        [f32("x", [4])],
        [f32("y", None)],
        [const("s", np.array([2**40, 2**40, 4], np.int64))],
    )


@case("conv_stride_zero")
def _():
    w = const("w", np.ones((1, 1, 3, 3), np.float32))
    return model([h.make_node("Conv", ["x", "w"], ["y"], name="bad", strides=[0, 0])], [f32("x", [1, 1, 8, 8])], [f32("y", None)], [w])


@case("conv_dilation_huge")
def _():
    w = const("w", np.ones((1, 1, 3, 3), np.float32))
    return model([h.make_node("Conv", ["x", "w"], ["y"], name="bad", dilations=[I64_MAX, I64_MAX])], [f32("x", [1, 1, 8, 8])], [f32("y", None)], [w])


@case("resize_scale_nan")
def _():
    return model(
        [h.make_node("Resize", ["x", "", "s"], ["y"], name="bad")],
        [f32("x", [1, 1, 2, 2])],
        [f32("y", None)],
        [const("s", np.array([1, 1, np.nan, 1], np.float32))],
    )


@case("axes_at_the_integer_limits")
def _():
    # Axes and permutations at i64::MIN / i64::MAX: normalising them (axis + rank) must not overflow.
    return model(
        [
            h.make_node("Concat", ["x", "x"], ["c"], name="bad", axis=I64_MIN),
            h.make_node("Transpose", ["c"], ["y"], name="bad2", perm=[I64_MAX, 0]),
        ],
        [f32("x", [2, 3])],
        [f32("y", None)],
    )


@case("conv_group_huge")
def _():
    return model([h.make_node("Conv", ["x", "w"], ["y"], name="bad", group=2**62)], [f32("x", [1, 4, 4, 4])], [f32("y", None)], [const("w", np.ones((4, 1, 1, 1), np.float32))])


@case("topk_k_huge")
def _():
    return model(
        [h.make_node("TopK", ["x", "k"], ["y", "i"], name="bad")],
        [f32("x", [4])],
        [f32("y", None), vi("i", T.INT64, None)],
        [const("k", np.array([2**62], np.int64))],
    )


@case("conv_transpose_output_padding_huge")
def _():
    w = const("w", np.ones((1, 1, 3, 3), np.float32))
    return model([h.make_node("ConvTranspose", ["x", "w"], ["y"], name="bad", output_padding=[2**62, 2**62])], [f32("x", [1, 1, 2, 2])], [f32("y", None)], [w])


@case("unsqueeze_rank_101")
def _():
    return model([h.make_node("Unsqueeze", ["x", "a"], ["y"], name="bad")], [f32("x", [3])], [f32("y", None)], [const("a", np.arange(100, dtype=np.int64))])


# --- Sizes that would allocate without bound (item 3) ------------------------------------------------


@case("onehot_depth_huge")
def _():
    return model(
        [h.make_node("OneHot", ["i", "d", "v"], ["y"], name="bad")],
        [vi("i", T.INT64, [4])],
        [f32("y", None)],
        [const("d", np.array(2**40, np.int64)), const("v", np.array([0, 1], np.float32))],
    )


# Within the per-value limit (16 GiB of output), but the ids 0..depth it builds as a constant were
# allocated before any check (an abort under a 4 GiB limit).
@case("onehot_depth_2_31")
def _():
    return model(
        [h.make_node("OneHot", ["i", "d", "v"], ["y"], name="bad")],
        [vi("i", T.INT64, [2])],
        [f32("y", None)],
        [const("d", np.array(2**31, np.int64)), const("v", np.array([0, 1], np.float32))],
    )


# A window's values are a constant built at import: 2^40 of them aborted on the allocation.
@case("hann_window_huge")
def _():
    return model([h.make_node("HannWindow", ["n"], ["y"], name="bad")], [], [f32("y", None)], [const("n", np.array(2**40, np.int64))])


@case("split_num_outputs_huge")
def _():
    return model([h.make_node("Split", ["x"], ["y"], name="bad", axis=0, num_outputs=2**31)], [f32("x", [4])], [f32("y", None)])


@case("maxpool_kernel_huge")
def _():
    return model([h.make_node("MaxPool", ["x"], ["y"], name="bad", kernel_shape=[2**40, 2**40])], [f32("x", [1, 1, 4, 4])], [f32("y", None)])


@case("lrn_size_wide", expect="ok", good={"x": np.arange(64, dtype=np.float32).reshape(1, 4, 4, 4)})
def _():
    return model([h.make_node("LRN", ["x"], ["y"], name="wide", size=1001)], [f32("x", [1, 4, 4, 4])], [f32("y", None)])


# (ONNX Runtime cannot run this one: it allocates for the whole window. mlopt cuts it to the channels.)
@case("lrn_size_huge", expect="ok", good={"x": np.arange(64, dtype=np.float32).reshape(1, 4, 4, 4)}, reference=False)
def _():
    return model([h.make_node("LRN", ["x"], ["y"], name="huge", size=2**62 + 1)], [f32("x", [1, 4, 4, 4])], [f32("y", None)])


@case("input_dims_huge", needle="x")
def _():
    return model([h.make_node("Relu", ["x"], ["y"], name="relu")], [f32("x", [2**31, 2**31])], [f32("y", None)])


@case("constant_of_shape_huge")
def _():
    return model(
        [h.make_node("ConstantOfShape", ["s"], ["y"], name="bad")],
        [],
        [f32("y", None)],
        [const("s", np.array([2**30, 2**30], np.int64))],
    )


@case("expand_huge")
def _():
    return model(
        [h.make_node("Expand", ["x", "s"], ["y"], name="bad")],
        [f32("x", [1])],
        [f32("y", None)],
        [const("s", np.array([2**35, 2**35], np.int64))],
    )


@case("tile_huge")
def _():
    return model(
        [h.make_node("Tile", ["x", "r"], ["y"], name="bad")],
        [f32("x", [2])],
        [f32("y", None)],
        [const("r", np.array([2**62], np.int64))],
    )


@case("range_huge")
def _():
    return model(
        [h.make_node("Range", ["a", "b", "d"], ["y"], name="bad")],
        [],
        [vi("y", T.INT64, None)],
        [const("a", np.array(0, np.int64)), const("b", np.array(I64_MAX, np.int64)), const("d", np.array(1, np.int64))],
    )


# (ONNX Runtime's shape inference gets this range's length wrong and rejects the Add: no reference.)
@case("range_int_extremes", expect="ok", good={"x": np.zeros(4, np.int64)}, reference=False)
def _():
    # start + i * delta leaves i64 on the way (3 * 2^62) though every value lies in range.
    return model(
        [h.make_node("Range", ["a", "b", "d"], ["r"], name="range"), h.make_node("Add", ["x", "r"], ["y"], name="add")],
        [vi("x", T.INT64, [4])],
        [vi("y", T.INT64, None)],
        [const("a", np.array(I64_MIN, np.int64)), const("b", np.array(I64_MAX, np.int64)), const("d", np.array(2**62, np.int64))],
    )


# --- Invalid models the interpreter or ONNX Runtime reject (item 5) ----------------------------------


@case("maxpool_kernel_zero")
def _():
    return model([h.make_node("MaxPool", ["x"], ["y"], name="bad", kernel_shape=[0, 0])], [f32("x", [1, 1, 4, 4])], [f32("y", None)])


@case("lrn_size_zero")
def _():
    return model([h.make_node("LRN", ["x"], ["y"], name="bad", size=0)], [f32("x", [1, 4, 4, 4])], [f32("y", None)])


@case("lstm_hidden_zero")
def _():
    w = const("w", np.ones((1, 0, 3), np.float32))
    r = const("r", np.ones((1, 0, 0), np.float32))
    return model([h.make_node("LSTM", ["x", "w", "r"], ["y"], name="bad", hidden_size=0)], [f32("x", [2, 1, 3])], [f32("y", None)], [w, r])


@case("split_num_outputs_zero")
def _():
    return model([h.make_node("Split", ["x"], ["y"], name="bad", axis=0, num_outputs=0)], [f32("x", [4])], [f32("y", None)])


@case("too_many_inputs")
def _():
    return model([h.make_node("Relu", ["x", "x"], ["y"], name="bad")], [f32("x", [4])], [f32("y", None)])


@case("duplicate_input_names", needle="x")
def _():
    return model([h.make_node("Add", ["x", "x"], ["y"], name="add")], [f32("x", [4]), f32("x", [4])], [f32("y", None)])


@case("gather_constant_index_out_of_range")
def _():
    return model(
        [h.make_node("Gather", ["x", "i"], ["y"], name="bad")],
        [f32("x", [4, 3])],
        [f32("y", None)],
        [const("i", np.array([0, 4], np.int64))],
    )


@case("unknown_op")
def _():
    return model([h.make_node("NoSuchOp", ["x"], ["y"], name="bad")], [f32("x", [4])], [f32("y", None)])


@case("undefined_input", needle="nowhere")
def _():
    return model([h.make_node("Relu", ["nowhere"], ["y"], name="relu")], [f32("x", [4])], [f32("y", None)])


@case("cycle")
def _():
    return model(
        [h.make_node("Relu", ["b"], ["a"], name="bad"), h.make_node("Relu", ["a"], ["b"], name="bad2")],
        [f32("x", [4])],
        [f32("a", None)],
    )


@case("output_never_produced", needle="ghost")
def _():
    return model([h.make_node("Relu", ["x"], ["y"], name="relu")], [f32("x", [4])], [f32("ghost", [4])])


HOSTILE = ["x */ int a; /*", "line break", "q\"uote\\", "\u00e9\U0001F600", "int"]


@case("hostile_names", expect="ok", good={n: np.arange(2, dtype=np.float32) for n in HOSTILE})
def _():
    names = HOSTILE
    nodes = [h.make_node("Neg", [n], [n + ".out"], name=n + ".node") for n in names]
    return model(nodes, [f32(n, [2]) for n in names], [f32(n + ".out", None) for n in names])


# --- Data errors at run time (item 5: compiled code and the interpreter give the same error) ---------


def data_case(name, needle, make, good, bad):
    CASES[name] = (make, dict(expect="data", needle=needle, good=good, bad=bad))


data_case(
    "gather_index_out_of_range",
    "out of range",
    lambda: model(
        [h.make_node("Gather", ["t", "i"], ["y"], name="gather0")],
        [vi("i", T.INT64, [5])],
        [f32("y", None)],
        [const("t", np.arange(12, dtype=np.float32).reshape(4, 3))],
    ),
    {"i": np.array([0, 1, -4, 3, 2], np.int64)},
    {"i": np.array([0, 1, 4, 3, 2], np.int64)},
)
data_case(
    "gather_index_computed_out_of_range",
    "out of range",
    lambda: model(
        [h.make_node("Add", ["i", "one"], ["j"], name="add0"), h.make_node("Gather", ["t", "j"], ["y"], name="gather0", axis=1)],
        [vi("i", T.INT32, [2, 3])],
        [f32("y", None)],
        [const("t", np.arange(12, dtype=np.float32).reshape(3, 4)), const("one", np.array(1, np.int32))],
    ),
    {"i": np.array([[0, 1, 2], [-5, 2, 0]], np.int32)},
    {"i": np.array([[0, 1, 2], [3, 2, 0]], np.int32)},
)
data_case(
    "gather_elements_out_of_range",
    "out of range",
    lambda: model(
        [h.make_node("GatherElements", ["x", "i"], ["y"], name="gather0", axis=1)],
        [f32("x", [2, 3]), vi("i", T.INT64, [2, 2])],
        [f32("y", None)],
    ),
    {"x": np.ones((2, 3), np.float32), "i": np.array([[0, 2], [-3, 1]], np.int64)},
    {"x": np.ones((2, 3), np.float32), "i": np.array([[0, 2], [-4, 1]], np.int64)},
)
data_case(
    "gather_nd_out_of_range",
    "out of range",
    lambda: model(
        [h.make_node("GatherND", ["x", "i"], ["y"], name="gather0")],
        [f32("x", [2, 3]), vi("i", T.INT64, [2, 2])],
        [f32("y", None)],
    ),
    {"x": np.ones((2, 3), np.float32), "i": np.array([[1, 2], [0, 0]], np.int64)},
    {"x": np.ones((2, 3), np.float32), "i": np.array([[1, 3], [0, 0]], np.int64)},
)
data_case(
    "scatter_nd_out_of_range",
    "out of range",
    lambda: model(
        [h.make_node("ScatterND", ["x", "i", "u"], ["y"], name="scatter0")],
        [f32("x", [4, 2]), vi("i", T.INT64, [2, 1]), f32("u", [2, 2])],
        [f32("y", None)],
    ),
    {"x": np.zeros((4, 2), np.float32), "i": np.array([[3], [1]], np.int64), "u": np.ones((2, 2), np.float32)},
    {"x": np.zeros((4, 2), np.float32), "i": np.array([[4], [1]], np.int64), "u": np.ones((2, 2), np.float32)},
)
data_case(
    "scatter_elements_out_of_range",
    "out of range",
    lambda: model(
        [h.make_node("ScatterElements", ["x", "i", "u"], ["y"], name="scatter0", axis=0)],
        [f32("x", [3, 2]), vi("i", T.INT64, [1, 2]), f32("u", [1, 2])],
        [f32("y", None)],
    ),
    {"x": np.zeros((3, 2), np.float32), "i": np.array([[2, -3]], np.int64), "u": np.ones((1, 2), np.float32)},
    {"x": np.zeros((3, 2), np.float32), "i": np.array([[2, 3]], np.int64), "u": np.ones((1, 2), np.float32)},
)
for op in ["Div", "Mod"]:
    data_case(
        f"{op.lower()}_by_zero",
        "division by zero",
        (lambda op: lambda: model([h.make_node(op, ["a", "b"], ["y"], name=f"{op.lower()}0")], [vi("a", T.INT32, [40]), vi("b", T.INT32, [40])], [vi("y", T.INT32, None)]))(op),
        {"a": np.arange(40, dtype=np.int32), "b": np.full(40, 3, np.int32)},
        {"a": np.arange(40, dtype=np.int32), "b": np.where(np.arange(40) == 33, 0, 3).astype(np.int32)},
    )


# --- Issue 30, item 8: names and declarations from the file --------------------------------------

# An initializer that is also a graph input must be of the input's declared type (ONNX Runtime refuses).
@case("initializer_input_shape_mismatch", needle="input 'w' is declared")
def _():
    w = const("w", np.ones(4, np.float32))
    return model([h.make_node("Add", ["x", "w"], ["y"], name="add")], [f32("x", [4]), f32("w", [7])], [f32("y", None)], [w])


@case("initializer_input_type_mismatch", needle="input 'w' is declared")
def _():
    w = const("w", np.ones(4, np.float32))
    return model([h.make_node("Add", ["x", "w"], ["y"], name="add")], [f32("x", [4]), vi("w", T.INT64, [4])], [f32("y", None)], [w])


# Terminal escape sequences (colour, window title, bell) in every name: valid, and printed escaped.
ESC = "\x1b[31m\x1b]0;owned\x07"


@case("escape_sequences_in_names", expect="ok", good={"x" + ESC: np.arange(4, dtype=np.float32)})
def _():
    m = model([h.make_node("Neg", ["x" + ESC], ["y" + ESC], name="neg" + ESC)], [f32("x" + ESC, [4])], [f32("y" + ESC, None)])
    m.graph.name = "graph" + ESC
    return m


# --- Issue 30, item 1: deep and wide graphs from small files ------------------------------------------


@case("elementwise_chain_4000", expect="ok", good={"x": np.linspace(-1, 1, 4, dtype=np.float32)})
def _():
    nodes, v = [], "x"
    for i in range(4000):
        nodes.append(h.make_node("Mul" if i % 2 == 0 else "Add", [v, "c"], [f"t{i}"], name=f"op{i}"))
        v = f"t{i}"
    return model(nodes, [f32("x", [4])], [f32(v, None)], [const("c", np.full(4, 1.0001, np.float32))])


@case("concat_10000_inputs", expect="ok", good={"x": np.ones(1, np.float32)})
def _():
    return model([h.make_node("Concat", ["x"] * 10000, ["y"], name="cat", axis=0)], [f32("x", [1])], [f32("y", None)])


@case("sum_10000_inputs", expect="ok", good={"x": np.ones(2, np.float32)})
def _():
    nodes = [h.make_node("Neg", ["x"], [f"n{i}"], name=f"neg{i}") if i % 2 else h.make_node("Abs", ["x"], [f"n{i}"], name=f"abs{i}") for i in range(10000)]
    nodes.append(h.make_node("Sum", [f"n{i}" for i in range(10000)], ["y"], name="sum"))
    return model(nodes, [f32("x", [2])], [f32("y", None)])


@case("shape_from_20000_node_chain", expect="ok", good={"x": np.arange(4, dtype=np.float32)})
def _():
    nodes, s = [], "s0"
    for i in range(20000):
        nodes.append(h.make_node("Add", [s, "z"], [f"s{i + 1}"], name=f"add{i}"))
        s = f"s{i + 1}"
    nodes.append(h.make_node("Reshape", ["x", s], ["y"], name="reshape"))
    return model(nodes, [f32("x", [4])], [f32("y", None)], [const("s0", np.array([2, 2], np.int64)), const("z", np.array([0, 0], np.int64))])


# --- Issue 30, item 2: time and memory that grow with the graph, within the limits ----------------------


# An e-graph of 60,000 classes: extraction's exact DAG costs are quadratic (80,000 needed 800 MB and 8 s),
# so a graph this large is priced as a tree (linear).
@case("mixed_chain_60000", expect="ok", good={"x": np.linspace(-1, 1, 4, dtype=np.float32)})
def _():
    nodes, v = [], "x"
    for i in range(60000):
        op = ["Add", "Neg", "Max", "Abs"][i % 4]  # (exact in both engines: no contraction into FMAs)
        nodes.append(h.make_node(op, [v, "x"] if op in ("Add", "Max") else [v], [f"t{i}"], name=f"op{i}"))
        v = f"t{i}"
    return model(nodes, [f32("x", [4])], [f32(v, None)])


# 5,000 outputs: the entry point loaded every output pointer up front, and LLVM's register allocator
# took 2.6 GB and 38 s over 5,000 live values.
@case("outputs_5000", expect="ok", good={"x": np.array([-1, 2, -3, 4], np.float32)})
def _():
    nodes = [h.make_node("Neg" if i % 2 else "Abs", ["x"], [f"y{i}"], name=f"n{i}") for i in range(5000)]
    return model(nodes, [f32("x", [4])], [f32(f"y{i}", None) for i in range(5000)])


# --- What the newest onnx writes: IR version 14, opset 28 --------------------------------------------


# Opset 28 defines BitShift on signed types: a shift by the width or more (or a negative one) leaves the
# sign fill, -1 for a negative value shifted right. (ONNX Runtime does not read opset 28 yet.)
@case("bitshift_opset28_out_of_range", expect="ok", reference=False,
      good={"x": np.array([-8, 8, -1, 5, -3, 7], np.int32), "s": np.array([40, 40, -1, 2, 31, 32], np.int32)})
def _():
    m = model([h.make_node("BitShift", ["x", "s"], ["y"], name="shift", direction="RIGHT")],
              [vi("x", T.INT32, [6]), vi("s", T.INT32, [6])], [vi("y", T.INT32, None)], opset=28)
    m.ir_version = 14
    return m


# An opset below 7 is read where every op is defined as at opset 7 (Not is unchanged since opset 1); an op
# that was defined otherwise then (Add's legacy broadcast attributes before opset 7) is refused by name.
@case("opset1_not", expect="ok", good={"x": np.array([True, False, True], np.bool_)})
def _():
    return model([h.make_node("Not", ["x"], ["y"], name="not")], [vi("x", T.BOOL, [3])],
                 [vi("y", T.BOOL, None)], opset=1)


@case("opset5_add_legacy", needle="node 'add' (Add) is defined otherwise at opset 7")
def _():
    return model([h.make_node("Add", ["x", "x"], ["y"], name="add")], [f32("x", [3])], [f32("y", None)],
                 opset=5)


# Det pivots: a zero in the corner (rows swap), a singular matrix (two equal rows: 0), a general one.
def det_input():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 5, 5)).astype(np.float32)
    x[0, 0, 0] = 0.0
    x[1, 3] = x[1, 1]
    return x


@case("det_pivots_and_singular", expect="ok", good={"x": det_input()})
def _():
    return model([h.make_node("Det", ["x"], ["y"], name="det")], [f32("x", [3, 5, 5])], [f32("y", None)],
                 opset=22)


# Einsum's repeated labels: an implicit trace ("ii" sums the diagonal) and a diagonal inside a product.
@case("einsum_trace_implicit", expect="ok", good={"x": np.arange(16, dtype=np.float32).reshape(4, 4)})
def _():
    return model([h.make_node("Einsum", ["x"], ["y"], name="trace", equation="ii")], [f32("x", [4, 4])],
                 [f32("y", None)], opset=12)


@case("einsum_diagonal_product", expect="ok",
      good={"a": np.arange(27, dtype=np.float32).reshape(3, 3, 3) / 9, "b": np.ones((3, 2), np.float32)})
def _():
    return model([h.make_node("Einsum", ["a", "b"], ["y"], name="diag", equation="ijj,jk->ik")],
                 [f32("a", [3, 3, 3]), f32("b", [3, 2])], [f32("y", None)], opset=12)


# MaxPool's indices count over the whole tensor (batch and channels too): MaxUnpool puts each value back
# there. Col2Im adds overlapping blocks (stride 1, dilation 2, pads) back into a 2-channel image.
@case("maxpool_unpool_batch_channels", expect="ok",
      good={"x": np.random.default_rng(3).standard_normal((2, 3, 6, 6)).astype(np.float32)})
def _():
    nodes = [h.make_node("MaxPool", ["x"], ["p", "i"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
             h.make_node("MaxUnpool", ["p", "i"], ["y"], name="unpool", kernel_shape=[2, 2], strides=[2, 2])]
    return model(nodes, [f32("x", [2, 3, 6, 6])], [f32("y", None)], opset=22)


@case("col2im_overlapping", expect="ok",
      good={"x": np.random.default_rng(4).standard_normal((1, 8, 20)).astype(np.float32)})
def _():
    node = h.make_node("Col2Im", ["x", "image", "block"], ["y"], name="col2im", dilations=[2, 1],
                       pads=[1, 0, 1, 1], strides=[1, 1])
    inits = [const("image", np.array([4, 5], np.int64)), const("block", np.array([2, 2], np.int64))]
    return model([node], [f32("x", [1, 8, 20])], [f32("y", None)], inits, opset=18)


# --- Spectral ops: sizes from the file checked before their matrices are built; values against ORT ----


@case("dft_huge_length", needle="bad")
def _():
    node = h.make_node("DFT", ["x", "n"], ["y"], name="bad", onesided=1)
    return model([node], [f32("x", [1, 8, 1])], [f32("y", None)], [const("n", np.array(2**31, np.int64))], opset=17)


@case("bitcast_sizes_differ", needle="bad")
def _():
    node = h.make_node("BitCast", ["x"], ["y"], name="bad", to=T.INT64)
    return model([node], [f32("x", [4])], [vi("y", T.INT64, None)], opset=26)


# mlopt holds int4 one per byte: its bits are not the file's, so a bit cast of it is refused.
@case("bitcast_sub_byte", needle="bad")
def _():
    node = h.make_node("BitCast", ["x"], ["y"], name="bad", to=T.UINT4)
    return model([node], [vi("x", T.INT4, [4])], [vi("y", T.UINT4, None)], opset=26)


# --- Data-sized outputs (NonZero, Compress, NonMaxSuppression): computed at a bound with a count; a use
# the bound cannot stand in for is refused, naming the node ----------------------------------------------


# A size read from a data-sized value would be the bound.
@case("nonzero_shape_read", needle="bad")
def _():
    nodes = [h.make_node("NonZero", ["x"], ["nz"]), h.make_node("Shape", ["nz"], ["y"], name="bad")]
    return model(nodes, [f32("x", [4])], [vi("y", T.INT64, None)])


# A sum over the data-sized axis would add the padding's rows.
@case("nonzero_summed_over", needle="bad")
def _():
    nodes = [h.make_node("NonZero", ["x"], ["nz"]),
             h.make_node("ReduceSum", ["nz", "axes"], ["y"], name="bad", keepdims=0)]
    return model(nodes, [f32("x", [4])], [vi("y", T.INT64, None)], [const("axes", np.array([1], np.int64))])


@case("compress_of_nonzero", needle="bad")
def _():
    nodes = [h.make_node("NonZero", ["x"], ["nz"]),
             h.make_node("Compress", ["nz", "c"], ["y"], name="bad", axis=1)]
    return model(nodes, [f32("x", [4]), vi("c", T.BOOL, [4])], [vi("y", T.INT64, None)])


# Boxes chosen at run time, then gathered: what a detector's post-processing does. Every box scores the
# same (ties go to the lower index), two overlap completely, one has no area.
@case("nms_then_gather", expect="ok", good={
    "boxes": np.array([[[0, 0, 1, 1], [0, 0, 1, 1], [0, 0, 0, 0], [2, 2, 3, 3]]], np.float32),
    "scores": np.ones((1, 2, 4), np.float32), "most": np.array([3], np.int64)})
def _():
    nodes = [h.make_node("NonMaxSuppression", ["boxes", "scores", "most", "iou"], ["sel"], name="nms"),
             h.make_node("Gather", ["sel", "two"], ["idx"], axis=1),
             h.make_node("Squeeze", ["boxes", "zero"], ["flat"]),
             h.make_node("Gather", ["flat", "idx"], ["y"], axis=0)]
    inits = [const("iou", np.array([0.5], np.float32)), const("two", np.array(2, np.int64)),
             const("zero", np.array([0], np.int64))]
    return model(nodes, [f32("boxes", [1, 4, 4]), f32("scores", [1, 2, 4]), vi("most", T.INT64, [1])],
                 [f32("y", None)], inits)


@case("stft_frame_past_signal", needle="bad")
def _():
    node = h.make_node("STFT", ["x", "step", "", "len"], ["y"], name="bad")
    inits = [const("step", np.array(2, np.int64)), const("len", np.array(64, np.int64))]
    return model([node], [f32("x", [1, 16, 1])], [f32("y", None)], inits, opset=17)


# --- Narrow element types: packed 4-bit data, float8 rounding and saturation against ORT -------------


# Three int4 values need two packed bytes; the initializer has one.
@case("int4_initializer_short", needle="bad")
def _():
    w = T()
    w.name, w.data_type, w.raw_data = "bad", T.INT4, bytes([0x21])
    w.dims.extend([3])
    node = h.make_node("DequantizeLinear", ["bad", "s"], ["y"], name="dq")
    return model([node], [], [f32("y", None)], [w, const("s", np.array(0.5, np.float32))], opset=21)


# Past E4M3FN's largest value (448), NaN and infinities, with saturate (the default) and without; read
# back as f32. ONNX Runtime gives the same codes.
@case("cast_float8_saturation", expect="ok",
      good={"x": np.array([0.3, -470, 464, 1e9, -np.inf, np.nan, 1e-9, -3.1], np.float32)})
def _():
    nodes = [h.make_node("Cast", ["x"], ["s8"], name="sat", to=T.FLOAT8E4M3FN),
             h.make_node("Cast", ["x"], ["n8"], name="nosat", to=T.FLOAT8E4M3FN, saturate=0),
             h.make_node("Cast", ["s8"], ["s"], name="s32", to=T.FLOAT),
             h.make_node("Cast", ["n8"], ["n"], name="n32", to=T.FLOAT)]
    return model(nodes, [f32("x", [8])], [f32("s", None), f32("n", None)], opset=21)


# --- Control flow: an If whose condition is known at compile time is its branch ------------------------


def branch(name, nodes, outputs, inits=(), inputs=()):
    return h.make_graph(nodes, name, list(inputs), outputs, list(inits))


def if_model(cond_nodes, cond_inits, inputs, then_b, else_b):
    node = h.make_node("If", ["cond"], ["y"], name="if", then_branch=then_b, else_branch=else_b)
    return model(cond_nodes + [node], inputs, [f32("y", None)], cond_inits)


# A constant condition; the branch taken has an initializer of its own and reads the outer x.
@case("if_constant_condition", expect="ok", good={"x": np.array([1, -2, 3, -4], np.float32)})
def _():
    then_b = branch("then", [h.make_node("Add", ["x", "c_then"], ["t"], name="add_then")], [f32("t", [4])], [const("c_then", np.full(4, 10, np.float32))])
    else_b = branch("else", [h.make_node("Mul", ["x", "x"], ["e"], name="mul_else")], [f32("e", [4])])
    return if_model([], [const("cond", np.array(True))], [f32("x", [4])], then_b, else_b)


# A condition of static shapes (x's first dimension is 4), folded at import; the else branch nests
# another If.
@case("if_shape_condition_nested", expect="ok", good={"x": np.array([[1, -2], [3, -4], [5, 6], [7, -8]], np.float32)})
def _():
    cond = [
        h.make_node("Shape", ["x"], ["s"], name="shape"),
        h.make_node("Gather", ["s", "zero"], ["d0"], name="dim0", axis=0),
        h.make_node("Equal", ["d0", "four"], ["cond"], name="is4"),
    ]
    inner = h.make_node("If", ["never"], ["n"], name="inner",
                        then_branch=branch("t2", [h.make_node("Neg", ["x"], ["n1"], name="neg")], [f32("n1", [4, 2])]),
                        else_branch=branch("e2", [h.make_node("Abs", ["x"], ["n2"], name="abs")], [f32("n2", [4, 2])]))
    then_b = branch("then", [h.make_node("Relu", ["x"], ["r"], name="relu")], [f32("r", [4, 2])])
    else_b = branch("else", [inner], [f32("n", [4, 2])], [const("never", np.array(False))])
    return if_model(cond, [const("zero", np.array(0, np.int64)), const("four", np.array(4, np.int64))], [f32("x", [4, 2])], then_b, else_b)


# A condition known only at run time (a graph input): both branches run and each output is selected.
@case("if_runtime_condition", expect="ok", good={"x": np.array([1, -2, 3, -4], np.float32), "flag": np.array(False)})
def _():
    then_b = branch("then", [h.make_node("Neg", ["x"], ["t"], name="neg")], [f32("t", [4])])
    else_b = branch("else", [h.make_node("Abs", ["x"], ["e"], name="abs")], [f32("e", [4])])
    node = h.make_node("If", ["flag"], ["y"], name="if", then_branch=then_b, else_branch=else_b)
    return model([node], [f32("x", [4]), vi("flag", T.BOOL, [])], [f32("y", None)])


# Branches whose outputs differ in shape cannot be selected between at run time: refused, naming the
# node; given a value (--input-value flag=true), the input is a constant and the If its branch.
@case("if_runtime_condition_shapes_differ", needle="bad", pin="flag=true")
def _():
    then_b = branch("then", [h.make_node("Neg", ["x"], ["t"], name="neg")], [f32("t", [4])])
    else_b = branch("else", [h.make_node("Slice", ["x", "s", "e"], ["h"], name="half")], [f32("h", [2])],
                    [const("s", np.array([0], np.int64)), const("e", np.array([2], np.int64))])
    node = h.make_node("If", ["flag"], ["y"], name="bad", then_branch=then_b, else_branch=else_b)
    return model([node], [f32("x", [4]), vi("flag", T.BOOL, [])], [f32("y", None)])


# Loop and Scan are unrolled at import when their trip counts are known. A Loop whose condition depends
# on data (here: while the sum of y is below 10) is refused, naming the node.
@case("loop_data_condition", needle="bad")
def _():
    body = branch("body", [h.make_node("Add", ["y_in", "x"], ["y_out"], name="step"),
                           h.make_node("ReduceSum", ["y_out"], ["s"], name="sum", keepdims=0),
                           h.make_node("Less", ["s", "ten"], ["cond_out"], name="below")],
                  [vi("cond_out", T.BOOL, []), f32("y_out", [4])], [const("ten", np.array(10, np.float32))],
                  inputs=[vi("iter", T.INT64, []), vi("cond_in", T.BOOL, []), f32("y_in", [4])])
    node = h.make_node("Loop", ["", "", "y0"], ["y"], name="bad", body=body)
    return model([node], [f32("x", [4]), f32("y0", [4])], [f32("y", None)])


# A Loop with neither a trip count nor a condition that ever turns false: refused at the unroll limit
# (an error naming the node, not a hang).
@case("loop_unbounded", needle="bad")
def _():
    body = branch("body", [h.make_node("Identity", ["cond_in"], ["cond_out"], name="keep"),
                           h.make_node("Neg", ["y_in"], ["y_out"], name="neg")],
                  [vi("cond_out", T.BOOL, []), f32("y_out", [4])],
                  inputs=[vi("iter", T.INT64, []), vi("cond_in", T.BOOL, []), f32("y_in", [4])])
    node = h.make_node("Loop", ["", "", "y0"], ["y"], name="bad", body=body)
    return model([node], [f32("y0", [4])], [f32("y", None)])


# Loops nested three deep, 100 iterations each: every level is small, together a million body nodes.
# Refused at the model's unroll budget, naming a node, in well under a second.
@case("loop_nested_budget", needle="inner")
def _():
    def level(name, inner_nodes):
        return branch(name, inner_nodes + [h.make_node("Identity", ["cond_in"], ["cond_out"], name=f"{name}_keep")],
                      [vi("cond_out", T.BOOL, []), f32("y_out", [4])], [const("m", np.array(100, np.int64))],
                      inputs=[vi("iter", T.INT64, []), vi("cond_in", T.BOOL, []), f32("y_in", [4])])
    leaf = level("leaf", [h.make_node("Neg", ["y_in"], ["y_out"], name="neg")])
    mid = level("mid", [h.make_node("Loop", ["m", "", "y_in"], ["y_out"], name="inner", body=leaf)])
    top = level("top", [h.make_node("Loop", ["m", "", "y_in"], ["y_out"], name="inner2", body=mid)])
    node = h.make_node("Loop", ["mm", "", "y0"], ["y"], name="outer", body=top)
    return model([node], [f32("y0", [4])], [f32("y", None)], [const("mm", np.array(100, np.int64))])


# A Scan-8 whose body gives back fewer outputs than it has states: refused, naming the node (it
# indexed past the body's outputs).
@case("scan8_body_too_few_outputs", needle="bad")
def _():
    body = branch("body", [h.make_node("Add", ["s", "a"], ["o"], name="add")], [f32("o", [3])],
                  inputs=[f32("s", [3]), f32("s2", [3]), f32("a", [3])])
    node = h.make_node("Scan", ["", "s0", "s1", "x"], ["y0", "y1"], name="bad", body=body, num_scan_inputs=1)
    return model([node], [f32("s0", [2, 3]), f32("s1", [2, 3]), f32("x", [2, 5, 3])], [f32("y0", None), f32("y1", None)], opset=8)


# Scan inputs of different lengths (5 and 4 steps): refused, naming the input.
@case("scan_unequal_lengths", needle="bad")
def _():
    body = branch("body", [h.make_node("Add", ["a", "b"], ["o"], name="add")], [f32("o", [3])],
                  inputs=[f32("a", [3]), f32("b", [3])])
    node = h.make_node("Scan", ["x", "z"], ["out"], name="bad", body=body, num_scan_inputs=2)
    return model([node], [f32("x", [5, 3]), f32("z", [4, 3])], [f32("out", None)])


# --- Sequences are static: positions, lengths and element types fixed at import; the rest refused -------


def seq_vi(name, shape):
    return h.make_tensor_sequence_value_info(name, T.FLOAT, shape)


# A position past the end of a sequence of two: refused, naming the node.
@case("sequence_at_out_of_range", needle="bad")
def _():
    nodes = [h.make_node("SequenceConstruct", ["x", "x"], ["s"], name="make"),
             h.make_node("SequenceAt", ["s", "p"], ["y"], name="bad")]
    return model(nodes, [f32("x", [4])], [f32("y", None)], [const("p", np.array(5, np.int64))])


# Each element of a sequence is a value of the graph: one split into 5000 pieces is refused before any
# is made.
@case("split_to_sequence_too_long", needle="bad")
def _():
    nodes = [h.make_node("SplitToSequence", ["x"], ["s"], name="bad", axis=1),
             h.make_node("ConcatFromSequence", ["s"], ["y"], name="join", axis=1)]
    return model(nodes, [f32("x", [1, 5000])], [f32("y", None)])


# Erasing from an empty sequence.
@case("sequence_erase_empty", needle="bad")
def _():
    nodes = [h.make_node("SequenceEmpty", [], ["s"], name="empty"),
             h.make_node("SequenceErase", ["s"], ["e"], name="bad"),
             h.make_node("SequenceLength", ["e"], ["y"], name="len")]
    return model(nodes, [], [vi("y", T.INT64, None)], opset=OPSET)


# A sequence of sequences (here an input) is not static data mlopt compiles: refused, naming it.
@case("sequence_of_sequences_input", needle="nested sequences")
def _():
    nested = h.make_sequence_type_proto(h.make_sequence_type_proto(h.make_tensor_type_proto(T.FLOAT, [2])))
    x = h.make_value_info("x", nested)
    node = h.make_node("SequenceLength", ["x"], ["y"], name="len")
    return model([node], [x], [vi("y", T.INT64, None)])


# An If on an input whose branches give sequences of different lengths cannot choose at run time:
# refused, naming the node; with the condition pinned, the If is its branch.
@case("if_runtime_sequences_differ_in_length", needle="bad", pin="flag=true")
def _():
    two = branch("then", [h.make_node("SplitToSequence", ["x", "two"], ["t"], name="halves")], [seq_vi("t", None)],
                 [const("two", np.array([2, 2], np.int64))])
    three = branch("else", [h.make_node("SplitToSequence", ["x", "three"], ["e"], name="thirds")], [seq_vi("e", None)],
                   [const("three", np.array([1, 1, 2], np.int64))])
    nodes = [h.make_node("If", ["flag"], ["s"], name="bad", then_branch=two, else_branch=three),
             h.make_node("ConcatFromSequence", ["s"], ["y"], name="join", axis=0, new_axis=1)]
    return model(nodes, [f32("x", [4]), vi("flag", T.BOOL, [])], [f32("y", None)])


# --- Issue 30, item 6: one NaN and infinity semantics, compiled and interpreted -------------------------
# NaN counts as the largest value (the ONNX reference's numpy: argmax and argmin pick the first NaN, max
# pools and reductions propagate it). ONNX Runtime differs there (it skips a NaN after the first
# element), so those cases check compiled against interpreted only.
for _op, _x in [("ArgMax", [np.nan, np.inf, -np.inf, -0.0]), ("ArgMax", [1, np.nan, 3, 0]), ("ArgMin", [1, np.nan, -3, 0]), ("ArgMin", [np.inf, 2, np.nan, np.nan])]:
    case(f"{_op.lower()}_nan_{len([c for c in CASES if c.startswith(_op.lower())])}", expect="ok", good={"x": np.array(_x, np.float32)}, reference=False)(
        (lambda op: lambda: model([h.make_node(op, ["x"], ["y"], name="arg", axis=0, keepdims=0)], [f32("x", [4])], [vi("y", T.INT64, None)]))(_op)
    )


@case("max_pool_nan", expect="ok", good={"x": np.array([[[np.nan, 1, 2, np.nan, 3, 4, np.nan, np.nan]]], np.float32)}, reference=False)
def _():
    return model([h.make_node("MaxPool", ["x"], ["y"], name="pool", kernel_shape=[2])], [f32("x", [1, 1, 8])], [f32("y", None)])


# Infinite largest elements: +inf, -inf where all are (x - max would be inf - inf); ONNX Runtime agrees.
@case("reduce_log_sum_exp_infinities", expect="ok", good={"x": np.array([[np.inf, np.inf], [np.inf, 1], [-np.inf, -np.inf], [np.nan, 1]], np.float32)})
def _():
    return model([h.make_node("ReduceLogSumExp", ["x", "a"], ["y"], name="lse", keepdims=0)], [f32("x", [4, 2])], [f32("y", None)], [const("a", np.array([1], np.int64))])


def external_fifo(out):
    """A weight whose external data is a FIFO inside the model's folder: reading it would block."""
    t = onnx.TensorProto()
    t.name = "w"
    t.data_type = T.FLOAT
    t.dims.extend([4])
    t.data_location = onnx.TensorProto.EXTERNAL
    for k, v in [("location", "weights.fifo"), ("offset", "0"), ("length", "16")]:
        e = t.external_data.add()
        e.key, e.value = k, v
    m = model([h.make_node("Add", ["x", "w"], ["y"], name="add")], [f32("x", [4])], [f32("y", None)], [t])
    os.mkfifo(os.path.join(out, "weights.fifo"))
    return m


def write_data(d, key, m, inputs, reference):
    """inputs as d/key_K.npy and d/key/input_K.pb; for good inputs, ONNX Runtime's outputs too (unless
    `reference` is False: then no good/ folder, and the runner skips check on it)."""
    files = {}
    data = os.path.join(d, key if reference else f"{key}.unchecked")
    os.makedirs(data)
    names = [i.name for i in m.graph.input]
    for k, name in enumerate(names):
        arr = inputs[name]
        f = f"{key}_{k}.npy"
        np.save(os.path.join(d, f), arr)
        files[name] = f
        with open(os.path.join(data, f"input_{k}.pb"), "wb") as out:
            out.write(nh.from_array(arr, name).SerializeToString())
    if key == "good" and reference:
        import onnxruntime as ort

        sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        for k, (o, v) in enumerate(zip(m.graph.output, sess.run(None, inputs))):
            with open(os.path.join(data, f"output_{k}.pb"), "wb") as out:
                out.write(nh.from_array(v, o.name).SerializeToString())
    return files


def write_case(d, m, spec):
    onnx.save(m, os.path.join(d, "model.onnx"))
    lines = [f"expect {spec['expect']}", f"needle {spec['needle']}"]
    for key in ["good", "bad"]:
        if key in spec:
            for name, f in write_data(d, key, m, spec[key], spec.get("reference", True)).items():
                # (Names are written as input indices: a hostile name may hold anything.)
                lines.append(f"{key} {[i.name for i in m.graph.input].index(name)}={f}")
    if "pin" in spec:
        lines.append(f"pin {spec['pin']}")
    with open(os.path.join(d, "case.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main(out):
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    for name, (make, spec) in sorted(CASES.items()):
        d = os.path.join(out, name)
        os.makedirs(d)
        write_case(d, make(), spec)
    d = os.path.join(out, "external_data_fifo")
    os.makedirs(d)
    write_case(d, external_fifo(d), {"expect": "reject", "needle": "weights.fifo"})
    print(f"{len(CASES) + 1} cases in {out}")


if __name__ == "__main__":
    main(sys.argv[1])
