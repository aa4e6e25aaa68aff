"""Multi-output models: intermediate graph outputs (hidden states) are ordinary consumers.

A tensor that is both a graph output and read by more layers must stay a float output with its
own name and value, the layers downstream keep their per-channel int8 weights, and names that
lowering would generate (``<tensor>_quantized``, ``<tensor>_dequantized``, ``<tensor>_1``) never
clash with the model's own. Each model is converted from its float form (with calibration data),
from onnxruntime's ``quantize_dynamic`` and from its ``quantize_static`` QDQ output, and the
result is checked against the Q/DQ contract and built ahead of time with TensorRT-RTX.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import (
    assert_qdq_contract,
    assert_tensorrt_ready,
    quantize_dynamic,
    quantize_static,
    save,
    snr_db,
)
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantFormat, QuantType

from trt_bridge import samples
from trt_bridge.conversion import convert
from trt_bridge.conversion.options import ActivationOptions, CalibrationOptions, ConvertOptions
from trt_bridge.place.policies import PlacementOptions
from trt_bridge.runtime.session import session

#: the static conversion these tests check (a dynamic source would otherwise get runtime ranges)
STATIC = ActivationOptions(runtime_ranges="off")

#: converted outputs against the float model; measured 36-44 dB (encoder), 35-40 dB (convs)
MIN_SNR_DB = 30.0
#: with the hidden states themselves quantized (--include-ops LayerNormalization): measured 30-37 dB
MIN_SNR_DB_HIDDEN_QUANTIZED = 25.0


def _rename(model: onnx.ModelProto, names: dict[str, str]) -> onnx.ModelProto:
    for node in model.graph.node:
        node.input[:] = [names.get(t, t) for t in node.input]
        node.output[:] = [names.get(t, t) for t in node.output]
    for value in model.graph.output:
        value.name = names.get(value.name, value.name)
    return model


def _expose(model: onnx.ModelProto, order: list[str]) -> onnx.ModelProto:
    """Make ``order`` the graph outputs, in that order (shapes from shape inference)."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True).graph
    known = {v.name: v for v in (*inferred.value_info, *inferred.output, *inferred.input)}
    outputs = [known[name] for name in order]
    del model.graph.output[:]
    model.graph.output.extend(outputs)
    onnx.checker.check_model(model, full_check=True)
    return model


def _source(kind: str, fpath: Path, tmp_path: Path, calib: list[dict[str, np.ndarray]]) -> Path:
    if kind == "float":
        return fpath
    if kind == "dynamic":
        return quantize_dynamic(fpath, tmp_path / "dynamic.onnx", per_channel=True)
    return quantize_static(fpath, tmp_path / "static.onnx", calib, quant_format=QuantFormat.QDQ, per_channel=True,
                           activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)


def _convert(src: Path, tmp_path: Path, calib: list[dict[str, np.ndarray]], **placement):
    np.savez(tmp_path / "calib.npz", **{k: np.stack([feed[k] for feed in calib]) for k in calib[0]})
    out = tmp_path / "converted.onnx"
    report = convert(src, out, ConvertOptions(calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")),
                                              activations=STATIC,
                                              placement=PlacementOptions(**placement), progress=False))
    return out, report


def _converted(model: onnx.ModelProto, kind: str, tmp_path: Path, calib: list[dict[str, np.ndarray]], **placement):
    """``model`` saved as float.onnx, quantized as ``kind`` and converted; the output passes the Q/DQ contract
    and keeps the source's outputs. Returns (float path, source path, output path, output model, report)."""
    fpath = save(model, tmp_path / "float.onnx")
    src = _source(kind, fpath, tmp_path, calib)
    out, report = _convert(src, tmp_path, calib, **placement)
    converted = assert_qdq_contract(out)
    _assert_same_outputs(src, converted)
    return fpath, src, out, converted, report


def _dims(value: onnx.ValueInfoProto) -> list:
    return [d.dim_value if d.HasField("dim_value") else d.dim_param or None
            for d in value.type.tensor_type.shape.dim]


def _assert_same_outputs(source: Path, converted: onnx.ModelProto) -> None:
    """Names, order, float type and declared shapes of the outputs are exactly the source's."""
    want = onnx.load(str(source)).graph.output
    assert [o.name for o in converted.graph.output] == [o.name for o in want]
    for got, ref in zip(converted.graph.output, want, strict=True):
        assert got.type.tensor_type.elem_type == TensorProto.FLOAT, got.name
        assert _dims(got) == _dims(ref), got.name
    producers = {t: n.op_type for n in converted.graph.node for t in n.output}
    for o in converted.graph.output:  # never int8 codes, never a Q/DQ's output standing in for the float
        assert producers.get(o.name) not in ("QuantizeLinear", "DequantizeLinear"), o.name


def _per_channel_weights(converted: onnx.ModelProto, op: str, axis: int) -> int:
    """How many ``op`` nodes read an int8 weight through a per-channel DequantizeLinear on ``axis``
    (fails on a per-tensor one)."""
    inits = {i.name: numpy_helper.to_array(i) for i in converted.graph.initializer}
    dqs = {n.output[0]: n for n in converted.graph.node if n.op_type == "DequantizeLinear"}
    count = 0
    for node in converted.graph.node:
        dq = dqs.get(node.input[1]) if node.op_type == op and len(node.input) > 1 else None
        if dq is None or dq.input[0] not in inits:
            continue
        weight, scale = inits[dq.input[0]], inits[dq.input[1]]
        assert weight.dtype == np.int8, node.name
        attr = {a.name: helper.get_attribute_value(a) for a in dq.attribute}
        assert scale.ndim == 1 and attr.get("axis") == axis and scale.size == weight.shape[axis], \
            f"{op} '{node.name}' reads a per-tensor weight"
        count += 1
    return count


def _outputs(path: Path, feeds: list[dict[str, np.ndarray]]) -> list[list[np.ndarray]]:
    """Every output of every feed: ``[output][feed]``."""
    sess = session(path)
    runs = [sess.run(None, feed) for feed in feeds]
    return [list(values) for values in zip(*runs, strict=True)]


def _assert_close_to_float(fpath: Path, out: Path, feeds, names: list[str] | None = None,
                           bar: float = MIN_SNR_DB) -> dict[str, float]:
    """Every output is float32 and of the float model's shape; each (of those in ``names``) is
    more than ``bar`` dB above its error against the float model. Returns the SNRs."""
    outputs = [o.name for o in onnx.load(str(fpath)).graph.output]
    reference, got = _outputs(fpath, feeds), _outputs(out, feeds)
    snrs = {}
    for name, ref, values in zip(outputs, reference, got, strict=True):
        assert all(v.dtype == np.float32 and v.shape == r.shape for v, r in zip(values, ref, strict=True)), name
        if names is None or name in names:
            snrs[name] = snr_db(ref, values)
    assert min(snrs.values()) > bar, snrs
    return snrs


# --- 1. an encoder exposing its hidden states ---------------------------------------------------------------

HIDDEN = {"layer0.out": "hidden_output", "layer1.out": "hidden_output_1",  # each layer's hidden state
          "layer0.res1": "hidden_output_quantized", "layer1.res1": "hidden_output_dequantized"}  # mid-layer
ENCODER_OUTPUTS = ["hidden_output", "y", "hidden_output_1", "hidden_output_quantized", "hidden_output_dequantized"]


#  x[N,16,64] ─ layer0 ─┬─ hidden_output ─ layer1 ─┬─ hidden_output_1 ─ layer2 ─ y
#                       │                          │
#   (inside layer i:  in ─┬ LN ─ q,k,v ─ attention ─ out ─ Add ─┬ res1 ─ LN ─ up ─ Gelu ─ down ─ Add ─ out)
#                        └──────────────────────────────┘     └──────────────────────────────┘
#   graph outputs, in this order: hidden_output, y, hidden_output_1, hidden_output_quantized (layer0's res1),
#   hidden_output_dequantized (layer1's res1): the last two are the names lowering would write for
#   'hidden_output' itself.
def encoder_with_hidden_outputs() -> onnx.ModelProto:
    return _expose(_rename(samples.transformer_block(layers=3), HIDDEN), ENCODER_OUTPUTS)


@pytest.mark.parametrize("kind, include_ops", [
    ("float", None),
    ("float", "LayerNormalization"),  # the hidden states themselves get Q/DQ: lowering's names clash with outputs
    ("dynamic", None),
    ("static", None),
])
def test_encoder_hidden_outputs_keep_names_values_and_per_channel(tmp_path, kind, include_ops):
    """Every projection of every layer (all downstream of a hidden output) keeps per-channel int8
    weights; the hidden outputs stay float, with the source's names, order and shapes.

    onnxruntime 1.32's own quantize_static(per_channel=True) keeps per-channel weights on this model
    too (older releases lost them on layers behind an intermediate graph output); only trt-bridge's
    output is asserted here. Measured SNRs against the float model: 36.0-43.8 dB for every output
    from each source (onnxruntime's own static and dynamic models: 23-31 dB); 30.2-37.1 dB with the
    hidden states quantized too.
    """
    calib = [{"x": f} for f in samples.sequence_feeds(16, 1, 16, 64)]
    fpath, src, out, converted, report = _converted(encoder_with_hidden_outputs(), kind, tmp_path, calib,
                                                    include_ops=include_ops)

    projections = [n for n in onnx.load(str(fpath)).graph.node
                   if n.op_type == "MatMul" and n.input[1].endswith(".weight")]
    assert len(projections) == 18  # q, k, v, out, up, down × 3 layers
    assert _per_channel_weights(converted, "MatMul", axis=1) == len(projections)
    weights = [q for q in report.quantized if q["kind"] == "weight"]
    assert len(weights) == len(projections)
    assert all(q["axis"] == 1 and isinstance(q["scale"], list) and len(q["scale"]) in (64, 256) for q in weights)
    quantized = {q["tensor"] for q in report.quantized if q["kind"] == "activation"}
    if include_ops:  # the hidden states are quantized for their LayerNorms, and still float outputs
        assert {"hidden_output", "hidden_output_1", "hidden_output_quantized"} <= quantized
        codes = {n.input[0]: n.output[0] for n in converted.graph.node if n.op_type == "QuantizeLinear"}
        assert codes["hidden_output"] == "hidden_output_quantized_1"  # the output holds 'hidden_output_quantized'
    tensors = {t for n in converted.graph.node for t in n.output}
    assert len(tensors) == sum(len(n.output) for n in converted.graph.node)  # SSA: no name written twice

    held_out = [{"x": f} for f in samples.sequence_feeds(4, 2, 16, 64)]
    _assert_close_to_float(fpath, out, held_out, bar=MIN_SNR_DB_HIDDEN_QUANTIZED if include_ops else MIN_SNR_DB)
    assert_tensorrt_ready(out)


# --- 2. a conv net whose intermediate outputs carry names lowering generates ------------------------------

#  x[N,3,32,32] ─ conv1 ─ relu1 ─┬─ x_quantized ─ conv2/2 ─ relu2 ─┬─ x_quantized_1 ─ conv3 (grouped) ─┐
#                                └ (graph output)                  └ (graph output)                   │
#  ┌──────────────────────────────────────────────────────────────────────────────────────────────────┘
#  └ x_quantized_1_padded ─┬─ relu3 ─ GlobalAvgPool ─ Flatten ─ MatMul ─ Add ─ logits
#                          └ (graph output)
#  'x_quantized' is what lowering names the Q output of the graph input x, 'x_quantized_1' its
#  NameAllocator fallback, 'x_quantized_1_padded' what re-centring names the padded input of conv3.
CONV_NAMES = {"r1": "x_quantized", "r2": "x_quantized_1", "c3": "x_quantized_1_padded"}
CONV_OUTPUTS = ["logits", "x_quantized", "x_quantized_1", "x_quantized_1_padded"]


def conv_net_with_clashing_outputs() -> onnx.ModelProto:
    return _expose(_rename(samples.conv_net(), CONV_NAMES), CONV_OUTPUTS)


@pytest.mark.parametrize("kind", ["float", "static"])
def test_conv_outputs_named_like_generated_tensors(tmp_path, kind):
    """Outputs named like the tensors lowering and re-centring create keep their names and values.

    onnxruntime 1.32's quantize_dynamic cannot take this model: it names the DynamicQuantizeLinear
    output of x 'x_quantized' too and writes an invalid (non-SSA) model. Its quantize_static writes
    the clamp of relu3 into the Q/DQ of conv3's output although relu3 stays: the source's own
    'x_quantized_1_padded' output is cut at 0 (1.6 dB against the float model). trt-bridge keeps
    what the source computes there, so that output is compared with the source, not the float model.
    Measured SNRs against the float model: 35-40 dB (float source); 37.6-39.8 dB for the hidden
    outputs and 30.0 dB for the logits (the source's: 28.8 dB) from the static source.
    """
    calib = [{"x": f} for f in samples.image_feeds(16, 1)]
    fpath, src, out, converted, report = _converted(conv_net_with_clashing_outputs(), kind, tmp_path, calib)

    assert _per_channel_weights(converted, "Conv", axis=0) == 3
    assert sum(1 for q in report.quantized if q["kind"] == "weight" and q["axis"] == 0
               and isinstance(q["scale"], list)) == 3
    held_out = [{"x": f} for f in samples.image_feeds(4, 2)]
    if kind == "float":
        _assert_close_to_float(fpath, out, held_out)
        return assert_tensorrt_ready(out)
    _assert_close_to_float(fpath, out, held_out, ["x_quantized", "x_quantized_1"])
    reference, source, got = (_outputs(p, held_out) for p in (fpath, src, out))
    assert snr_db(reference[0], got[0]) >= snr_db(reference[0], source[0]) - 1.0  # logits: measured 30.0 vs 28.8
    assert snr_db(source[3], got[3]) > MIN_SNR_DB  # x_quantized_1_padded, cut at 0 as in the source
    assert_tensorrt_ready(out)


# --- 3. one graph output read by a quantized conv and a residual Add --------------------------------------

#  x[1,16,16,16] ─┬─ conv1 ─ relu1 ─ r ─┬─ conv2 ─ c2 ─ Add ─ relu2 ─ y
#                 │                     ├──────────────┘
#                 │                     └─ (graph output r)
#                 └─ (graph output x: the input passed through, where the source allows it)
#  with ``c2_out``, conv2's output c2 is a graph output too.
def residual_net(passthrough: bool = False, c2_out: bool = False) -> onnx.ModelProto:
    rng = np.random.default_rng(0)

    def init(name, shape, scale):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    node = helper.make_node
    graph = helper.make_graph(
        [node("Conv", ["x", "W1", "b1"], ["c1"], "conv1", pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
         node("Relu", ["c1"], ["r"], "relu1"),
         node("Conv", ["r", "W2", "b2"], ["c2"], "conv2", pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
         node("Add", ["c2", "r"], ["s"], "residual"),
         node("Relu", ["s"], ["y"], "relu2")],
        "residual_net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 16, 16])], [],
        [init("W1", (32, 16, 3, 3), 0.12), init("b1", (32,), 0.1), init("W2", (32, 32, 3, 3), 0.08),
         init("b2", (32,), 0.1)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return _expose(model, ["y", "r"] + (["x"] if passthrough else []) + (["c2"] if c2_out else []))


def _feeds(count: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((1, 16, 16, 16)).astype(np.float32)} for _ in range(count)]


def _readers(converted: onnx.ModelProto, node_name: str) -> list[str]:
    """The op types producing each input of ``node_name`` in the converted model."""
    producers = {t: n.op_type for n in converted.graph.node for t in n.output}
    node = next(n for n in converted.graph.node if n.name == node_name)
    return [producers.get(t, "input") for t in node.input]


@pytest.mark.parametrize("kind", ["float", "static"])
def test_graph_output_read_by_conv_and_residual_add(tmp_path, kind):
    """r is a graph output, conv2's input and the residual skip: one Q/DQ feeds both readers (so the
    Add fuses into conv2), and the output r stays the float tensor. Measured: 36-38 dB."""
    calib = _feeds(16, 1)
    fpath, src, out, converted, report = _converted(residual_net(), kind, tmp_path, calib)

    assert _per_channel_weights(converted, "Conv", axis=0) == 2
    skip = [q for q in report.quantized if q["kind"] == "activation" and "residual" in q["consumers"]]
    assert len(skip) == 1 and set(skip[0]["consumers"]) == {"conv2", "residual"}, report.quantized
    assert _readers(converted, "residual") == ["Conv", "DequantizeLinear"]
    conv2 = next(n for n in converted.graph.node if n.name == "conv2")
    add = next(n for n in converted.graph.node if n.name == "residual")
    assert conv2.input[0] == add.input[1]  # the same DQ output
    _assert_close_to_float(fpath, out, _feeds(4, 2), ["y", "r"])
    assert_tensorrt_ready(out)


@pytest.mark.parametrize("kind", ["float", "static"])
def test_conv_output_that_is_a_graph_output_keeps_the_skip_float(tmp_path, kind):
    """When conv2's output c2 is a graph output too, the Add cannot fuse into conv2 (c2 must be
    written out): a graph output is a consumer like any other, so the skip r gets no Q/DQ for the
    Add, whatever the source (the static source's graph-output Identity made it so already)."""
    calib = _feeds(16, 1)
    fpath, src, out, converted, report = _converted(residual_net(c2_out=True), kind, tmp_path, calib)

    assert _per_channel_weights(converted, "Conv", axis=0) == 2
    assert not any("residual" in q["consumers"] for q in report.quantized)
    assert "DequantizeLinear" not in _readers(converted, "residual")
    _assert_close_to_float(fpath, out, _feeds(4, 2), ["y", "r", "c2"])
    assert_tensorrt_ready(out)


@pytest.mark.parametrize("kind", ["float", "dynamic"])
def test_graph_input_passed_through_as_output(tmp_path, kind):
    """The input x is also a graph output: it comes out bit-exact and float, while conv1 still reads
    it through a Q/DQ. (onnxruntime 1.32's quantize_static fails on such a model: "Graph is not a
    DAG". Its quantize_dynamic quantizes ConvInteger weights per tensor whatever per_channel says;
    trt-bridge keeps those exact integers.)"""
    calib = _feeds(16, 1)
    fpath, src, out, converted, report = _converted(residual_net(passthrough=True), kind, tmp_path, calib)

    assert "x" in {q["tensor"] for q in report.quantized if q["kind"] == "activation"}
    weights = [q for q in report.quantized if q["kind"] == "weight"]
    assert len(weights) == 2
    if kind == "float":
        assert _per_channel_weights(converted, "Conv", axis=0) == 2
    else:
        assert all(q["source"] == "exact-weights" for q in weights)
    feeds = _feeds(4, 2)
    for feed, passed in zip(feeds, _outputs(out, feeds)[2], strict=True):
        np.testing.assert_array_equal(passed, feed["x"])
    _assert_close_to_float(fpath, out, feeds, ["y", "r", "x"])
    assert_tensorrt_ready(out)
