"""Lift rules for patterns that real exporters and quantizers write (seen on the corpus of
``scripts/corpus``): quantized embedding tables, dynamically quantized codes moved by Transpose,
DynamicQuantizeLSTM, a run-time quantized bias reshaped onto the accumulator, and onnxruntime's fused
com.microsoft transformer ops. Each test checks the op types the rule leaves, numerical equivalence
against onnxruntime, and that TensorRT-RTX parses and builds the converted model."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers import assert_qdq_contract, assert_tensorrt_ready, op_types, quantize_dynamic, run_ort, save, snr_db  # noqa: E402

from trt_bridge.conversion import convert  # noqa: E402
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions  # noqa: E402
from trt_bridge.ir.model import load_model  # noqa: E402
from trt_bridge.lift.pipeline import lift_model

RNG = np.random.default_rng(0)


def _model(nodes, inputs, outputs, inits, opset=17, ms=False):
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("com.microsoft", 1)] if ms else [])
    graph = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=imports)


def _convert(source: Path, tmp_path: Path, calib: dict, name="converted.onnx"):
    np.savez(tmp_path / "calib.npz", **calib)
    out = tmp_path / name
    report = convert(source, out, ConvertOptions(calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")),
                                                 progress=False))
    assert_qdq_contract(out)
    assert_tensorrt_ready(out)
    return out, report


# --- quantized embedding tables (quantize_dynamic on every transformer) -------------------------------------------

def _embedding_model():
    """ids ─ Gather(table [64, 32]) ─ Add(positions) ─ MatMul(W [32, 48]) ─ y: a token embedding, as in BERT."""
    inits = {"table": RNG.normal(size=(64, 32)).astype(np.float32),
             "pos": RNG.normal(size=(16, 32)).astype(np.float32),
             "W": (RNG.normal(size=(32, 48)) / 6).astype(np.float32)}
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], "embed"),
             helper.make_node("Add", ["e", "pos"], ["ep"], "add_pos"),
             helper.make_node("MatMul", ["ep", "W"], ["y"], "proj")]
    return _model(nodes, [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 16])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 48])], inits)


def _ids(count, seed):
    rng = np.random.default_rng(seed)
    return [{"ids": rng.integers(0, 64, (1, 16)).astype(np.int64)} for _ in range(count)]


@pytest.mark.parametrize("kwargs", [{}, {"per_channel": True}], ids=["per-tensor", "per-channel"])
def test_quantized_embedding_table_is_dequantized_once(tmp_path, kwargs):
    fpath = save(_embedding_model(), tmp_path / "float.onnx")
    dyn = quantize_dynamic(fpath, tmp_path / "dynamic.onnx", **kwargs)
    source = onnx.load(str(dyn))
    gather = next(n for n in source.graph.node if n.op_type == "Gather")
    assert gather.input[0].endswith("_quantized")  # onnxruntime quantized the table: Gather → DequantizeLinear
    lifted, ctx = lift_model(load_model(dyn), dyn)
    assert ctx.fired["dequantize-gathered"]
    assert not op_types(lifted) & {"DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger"}
    # exact: the gathered rows are the source's dequantized table rows
    inits = {i.name: numpy_helper.to_array(i) for i in source.graph.initializer}
    table = (inits[gather.input[0]].astype(np.float64) - inits["table_zero_point"]) * inits["table_scale"]
    probe = onnx.ModelProto()
    probe.CopyFrom(lifted)
    gathered = next(n for n in probe.graph.node if n.op_type == "Gather").output[0]
    probe.graph.output.append(helper.make_tensor_value_info(gathered, TensorProto.FLOAT, None))
    for feed in _ids(3, 5):
        got = run_ort(probe, [feed])  # first output: y; the gathered rows checked below
        from trt_bridge.runtime.session import session

        rows = session(probe).run([gathered], feed)[0]
        np.testing.assert_array_equal(rows, table[feed["ids"]].astype(np.float32))
        assert np.all(np.isfinite(got[0]))
    out, _ = _convert(dyn, tmp_path, {"ids": np.stack([f["ids"] for f in _ids(8, 1)])})
    held = _ids(6, 2)
    assert snr_db(run_ort(dyn, held), run_ort(out, held)) > 30


def test_per_axis_dequantize_after_gather_maps_to_the_table_axis(tmp_path):
    """NNCF/INC style: the DQ after the Gather is per column (axis -1); the table's axis 1."""
    q = RNG.integers(-127, 128, (64, 32)).astype(np.int8)
    scale = RNG.uniform(0.01, 0.05, 32).astype(np.float32)
    nodes = [helper.make_node("Gather", ["table_q", "ids"], ["e_q"], "embed"),
             helper.make_node("DequantizeLinear", ["e_q", "s", "z"], ["e"], "dq", axis=-1),
             helper.make_node("MatMul", ["e", "W"], ["y"], "proj")]
    model = _model(nodes, [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 16])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 48])],
                   {"table_q": q, "s": scale, "z": np.zeros(32, np.int8),
                    "W": (RNG.normal(size=(32, 48)) / 6).astype(np.float32)}, opset=19)
    src = save(model, tmp_path / "source.onnx")
    lifted, ctx = lift_model(load_model(src), src)
    assert ctx.fired["dequantize-gathered"] and "DequantizeLinear" not in op_types(lifted)
    feeds = _ids(4, 3)
    for want, got in zip(run_ort(src, feeds), run_ort(lifted, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


# --- dynamically quantized codes moved by a Transpose, then dequantized (SegFormer) -----------------------------

def test_transposed_dynamic_codes_lift_to_a_float_transpose(tmp_path):
    """x ─ DynamicQuantizeLinear ─┬ MatMulInteger(W) ─ … ─ y1
                                  └ Transpose ─ DQ(x_scale, x_zp) ─ Reshape ─ y2   (as quantize_dynamic wrote it)"""
    w = RNG.integers(-127, 128, (32, 24)).astype(np.int8)
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"], "dql"),
        helper.make_node("MatMulInteger", ["xq", "wq", "xz", "wz"], ["acc"], "mmi"),
        helper.make_node("Cast", ["acc"], ["accf"], "cast", to=TensorProto.FLOAT),
        helper.make_node("Mul", ["xs", "ws"], ["s"], "scales"),
        helper.make_node("Mul", ["accf", "s"], ["y1"], "rescale"),
        helper.make_node("Transpose", ["xq"], ["xq_t"], "transpose", perm=[0, 2, 1]),
        helper.make_node("DequantizeLinear", ["xq_t", "xs", "xz"], ["x_t"], "dq"),
        helper.make_node("Reshape", ["x_t", "shape"], ["y2"], "reshape"),
    ]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 32])],
                   [helper.make_tensor_value_info("y1", TensorProto.FLOAT, [1, 16, 24]),
                    helper.make_tensor_value_info("y2", TensorProto.FLOAT, [1, 512])],
                   {"wq": w, "wz": np.zeros((), np.int8), "ws": np.array(0.02, np.float32),
                    "shape": np.array([1, 512], np.int64)})
    src = save(model, tmp_path / "source.onnx")
    lifted, ctx = lift_model(load_model(src), src)
    assert ctx.fired["dynamic-pass-through"] == ["dq"]
    assert not op_types(lifted) & {"DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger"}
    feeds = [{"x": RNG.normal(size=(1, 16, 32)).astype(np.float32)} for _ in range(3)]
    from trt_bridge.runtime.session import session

    for feed in feeds:
        y2 = session(lifted).run(["y2"], feed)[0]
        np.testing.assert_array_equal(y2, feed["x"].transpose(0, 2, 1).reshape(1, 512))  # exact float meaning
        src_y2 = session(src, simulate_qdq=False).run(["y2"], feed)[0]
        step = np.abs(feed["x"]).max() * 2 / 255
        assert np.abs(src_y2 - y2).max() <= step  # the source only rounded it to its run-time grid
    out, _ = _convert(src, tmp_path, {"x": np.stack([f["x"] for f in feeds])})
    assert snr_db(run_ort(src, feeds), run_ort(out, feeds)) > 30


# --- com.microsoft DynamicQuantizeLSTM ------------------------------------------------------------------------------

def _lstm_model():
    hidden, inp = 16, 12
    inits = {"W": (RNG.normal(size=(2, 4 * hidden, inp)) / 4).astype(np.float32),
             "R": (RNG.normal(size=(2, 4 * hidden, hidden)) / 4).astype(np.float32),
             "B": (RNG.normal(size=(2, 8 * hidden)) / 4).astype(np.float32)}
    nodes = [helper.make_node("LSTM", ["x", "W", "R", "B"], ["y", "y_h"], "lstm", hidden_size=hidden,
                              direction="bidirectional")]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [10, 1, inp])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [10, 2, 1, hidden]),
                   helper.make_tensor_value_info("y_h", TensorProto.FLOAT, [2, 1, hidden])], inits)


@pytest.mark.parametrize("kwargs", [{}, {"per_channel": True}], ids=["per-tensor", "per-channel"])
def test_dynamic_quantize_lstm_lifts_to_a_float_lstm(tmp_path, kwargs):
    fpath = save(_lstm_model(), tmp_path / "float.onnx")
    dyn = quantize_dynamic(fpath, tmp_path / "dynamic.onnx", **kwargs)
    assert "DynamicQuantizeLSTM" in op_types(dyn)
    lifted, ctx = lift_model(load_model(dyn), dyn)
    assert ctx.fired["dynamic-lstm"] and op_types(lifted) == {"LSTM"}
    # exact: a float LSTM with the source's dequantized weights (computed here independently)
    source = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(dyn)).graph.initializer}
    node = next(n for n in onnx.load(str(dyn)).graph.node if n.op_type == "DynamicQuantizeLSTM")
    reference = onnx.load(str(fpath))  # its bias B is the source's, unquantized
    for name, q, s, z in (("W", *node.input[1:2], *node.input[8:10]), ("R", node.input[2], *node.input[10:12])):
        values, scale, zp = source[q].astype(np.float64), source[s], source[z]
        shape = (2, 1, -1) if scale.size > 2 else (2, 1, 1)
        deq = ((values - zp.reshape(shape)) * scale.reshape(shape)).transpose(0, 2, 1).astype(np.float32)
        init = next(i for i in reference.graph.initializer if i.name == name)
        init.CopyFrom(numpy_helper.from_array(deq, name))
    feeds = [{"x": RNG.normal(size=(10, 1, 12)).astype(np.float32)} for _ in range(3)]
    for want, got in zip(run_ort(reference, feeds), run_ort(lifted, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    out, _ = _convert(dyn, tmp_path, {"x": np.stack([f["x"] for f in feeds])})
    assert "LSTM" in op_types(out)
    assert snr_db(run_ort(fpath, feeds), run_ort(out, feeds)) > 25


# --- a bias quantized at run time and reshaped onto the accumulator (onnx.quantize 0.1.0) ------------------------

def test_runtime_quantized_bias_through_reshape(tmp_path):
    """bias / (x_scale·w_scale) ─ Floor ─ Cast(int32) ─ Reshape([1, C, 1, 1]) ─ Add onto the ConvInteger accumulator."""
    wq = RNG.integers(-127, 128, (8, 3, 3, 3)).astype(np.int8)
    bias = RNG.normal(size=8).astype(np.float32)
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"], "dql"),
        helper.make_node("ConvInteger", ["xq", "wq", "xz"], ["acc"], "conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Mul", ["xs", "ws"], ["s"], "scales"),
        helper.make_node("Div", ["bias", "s"], ["b_acc"], "bias_div"),
        helper.make_node("Floor", ["b_acc"], ["b_floor"], "bias_floor"),
        helper.make_node("Cast", ["b_floor"], ["b_int"], "bias_cast", to=TensorProto.INT32),
        helper.make_node("Reshape", ["b_int", "bshape"], ["b_reshape"], "bias_reshape"),
        helper.make_node("Add", ["acc", "b_reshape"], ["acc_b"], "bias_add"),
        helper.make_node("Cast", ["acc_b"], ["accf"], "cast", to=TensorProto.FLOAT),
        helper.make_node("Mul", ["accf", "s"], ["y"], "rescale"),
    ]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])],
                   {"wq": wq, "ws": np.array(0.01, np.float32), "bias": bias,
                    "bshape": np.array([1, 8, 1, 1], np.int64)}, opset=11)
    model.producer_name, model.producer_version = "onnx.quantize", "0.1.0"
    src = save(model, tmp_path / "source.onnx")
    lifted, ctx = lift_model(load_model(src), src)
    assert ctx.fired["dynamic-integer-op"] == ["conv"]
    assert not op_types(lifted) & {"ConvInteger", "DynamicQuantizeLinear", "Floor"}
    reference = _model([helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])],
                       {"w": (wq.astype(np.float32) * np.float32(0.01)), "b": bias}, opset=13)
    feeds = [{"x": RNG.normal(size=(1, 3, 16, 16)).astype(np.float32)} for _ in range(3)]
    for want, got in zip(run_ort(reference, feeds), run_ort(lifted, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    out, _ = _convert(src, tmp_path, {"x": np.stack([f["x"] for f in feeds])})
    assert snr_db(run_ort(reference, feeds), run_ort(out, feeds)) > 30


# --- onnxruntime's fused transformer ops -----------------------------------------------------------------------

def _fused_model(opset):
    h = 32
    v = lambda *s: RNG.normal(size=s).astype(np.float32)  # noqa: E731
    inits = {"skip_w": (v(h, h) / 5), "gamma": 1 + v(h) / 10, "beta": v(h) / 10, "bias": v(h) / 10,
             "w1": v(h, h) / 5, "b1": v(h) / 10, "w2": v(h, h) / 5}
    ms = "com.microsoft"
    nodes = [
        helper.make_node("MatMul", ["x", "skip_w"], ["m"], "proj"),
        helper.make_node("SkipLayerNormalization", ["m", "x", "gamma", "beta", "bias"], ["ln", "", "", "sum"],
                         "skip_ln", domain=ms, epsilon=1e-5),
        helper.make_node("MatMul", ["ln", "w1"], ["f1"], "fc1"),
        helper.make_node("BiasGelu", ["f1", "b1"], ["g1"], "bias_gelu", domain=ms),
        helper.make_node("FastGelu", ["g1", "b1"], ["g2"], "fast_gelu", domain=ms),
        helper.make_node("Gelu", ["g2"], ["g3"], "gelu", domain=ms),
        helper.make_node("QuickGelu", ["g3"], ["g4"], "quick_gelu", domain=ms, alpha=1.5),
        helper.make_node("MatMul", ["g4", "w2"], ["f2"], "fc2"),
        helper.make_node("Add", ["f2", "sum"], ["res"], "residual"),
        helper.make_node("SkipSimplifiedLayerNormalization", ["res", "ln", "gamma"], ["y"], "skip_rms",
                         domain=ms, epsilon=1e-6),
    ]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, h])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, h])], inits, opset=opset, ms=True)


@pytest.mark.parametrize("opset", [13, 17])
def test_ort_fused_transformer_ops_become_standard_onnx(tmp_path, opset):
    src = save(_fused_model(opset), tmp_path / "fused.onnx")
    lifted, ctx = lift_model(load_model(src), src)
    assert all(n.domain in ("", "ai.onnx") for n in lifted.graph.node)
    assert ("LayerNormalization" in op_types(lifted)) == (opset >= 17)
    defused = {c.node for c in ctx.prepared if c.pass_name == "defuse-ort-ops"}
    assert defused == {"skip_ln", "bias_gelu", "fast_gelu", "gelu", "quick_gelu", "skip_rms"}
    feeds = [{"x": RNG.normal(size=(1, 8, 32)).astype(np.float32)} for _ in range(3)]
    for want, got in zip(run_ort(src, feeds), run_ort(lifted, feeds)):  # onnxruntime runs the fused ops natively
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # as users do after onnxruntime's transformer optimizer (it cannot infer the fused ops' types)
    dyn = quantize_dynamic(src, tmp_path / "dynamic.onnx", extra_options={"DefaultTensorType": TensorProto.FLOAT})
    out, _ = _convert(dyn, tmp_path, {"x": np.stack([f["x"] for f in feeds])})
    assert snr_db(run_ort(src, feeds), run_ort(out, feeds)) > 25


def test_bias_add_becomes_two_adds(tmp_path):
    """com.microsoft BiasAdd (diffusion models; onnxruntime runs it on CUDA only): x + bias + skip."""
    nodes = [helper.make_node("BiasAdd", ["x", "b", "skip"], ["y"], "bias_add", domain="com.microsoft")]
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4, 8]) for n in ("x", "skip")]
    model = _model(nodes, io, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8])],
                   {"b": RNG.normal(size=8).astype(np.float32)}, ms=True)
    src = save(model, tmp_path / "bias_add.onnx")
    lifted, ctx = lift_model(load_model(src), src)
    assert [n.op_type for n in lifted.graph.node] == ["Add", "Add"]
    feed = {"x": RNG.normal(size=(1, 4, 8)).astype(np.float32), "skip": RNG.normal(size=(1, 4, 8)).astype(np.float32)}
    b = numpy_helper.to_array(model.graph.initializer[0])
    np.testing.assert_allclose(run_ort(lifted, [feed])[0], feed["x"] + b + feed["skip"], rtol=1e-6)
    out = tmp_path / "bias_add.trt.onnx"
    onnx.save(lifted, str(out))
    assert_tensorrt_ready(out)


# --- graphs whose nodes are out of topological order (AMD Quark writes them; onnxruntime runs them) ---------------

def test_nodes_out_of_order_are_sorted(tmp_path, caplog):
    fpath = save(_embedding_model(), tmp_path / "float.onnx")
    qdq = tmp_path / "qdq.onnx"
    from helpers import quantize_static
    from onnxruntime.quantization import QuantFormat

    quantize_static(fpath, qdq, _ids(4, 1), quant_format=QuantFormat.QDQ, per_channel=True)
    model = onnx.load(str(qdq))
    nodes = list(model.graph.node)[::-1]  # every node before its producers
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    unsorted = save(model, tmp_path / "unsorted.onnx")
    with pytest.raises(onnx.checker.ValidationError, match="topologically sorted"):
        onnx.checker.check_model(model)
    out, _ = _convert(unsorted, tmp_path, {"ids": np.stack([f["ids"] for f in _ids(8, 1)])})
    assert "not in topological order" in caplog.text
    held = _ids(6, 2)
    assert snr_db(run_ort(unsorted, held), run_ort(out, held)) > 25  # onnxruntime runs the unsorted source
