"""`convert --high-precision fp16` on decoder-shaped models (issue items 3 and 38): float arithmetic on integers cast
to float (Llama's rotary ``inv_freq @ Cast(position_ids)``, T5's position buckets and ``(1 - mask) · -1e9``) and
ModelOpt's mixed float16/float32 layers convert with exit 0 into models that pass ONNX's strict checks (every input
bound to one type parameter has one type), keep their interface, stay as accurate as the float32 conversion and build
in TensorRT-RTX. The arithmetic on positions stays float32 (and out of INT8).

SNR bars: the float16 conversion against the float32 one (same INT8 layers) ≥ 40 dB (what's left is float16's
11-bit rounding, 2^-11 per op, plus the INT8 codes it flips, one step each); against the source, within 0.5 dB of the
float32 conversion. The lowering alone (no INT8) on the float rotary at positions near 3000: ≥ 55 dB, where float16
positions would cost it 30 dB.
"""

from __future__ import annotations

import json

import fp16_type_models as models
import numpy as np
import onnx
import pytest
from helpers import assert_qdq_contract, assert_tensorrt_ready, quantize_static, save, snr_db

from trt_bridge.cli import main
from trt_bridge.lower.float16_types import assign_float16
from trt_bridge.lower.precision import to_float16
from trt_bridge.runtime.session import session

CASES = {"rotary": (models.rotary, models.rotary_feeds), "t5": (models.t5_bias, models.t5_feeds),
         "modelopt": (models.modelopt_mixed, models.dense_feeds)}


def _held_out(name: str) -> list[dict[str, np.ndarray]]:
    feeds = CASES[name][1]
    return feeds(6, 7, start=2500) if name == "rotary" else feeds(6, 7)


def _convert(*args) -> None:
    assert main(["convert", *map(str, args), "--skip-check", "-q"]) == 0


def _outputs(path, feeds) -> list[np.ndarray]:
    sess = session(path)
    return [sess.run(None, f)[0].astype(np.float32) for f in feeds]


def _interface(path) -> list[tuple[str, int]]:
    g = (path if isinstance(path, onnx.ModelProto) else onnx.load(str(path))).graph
    return [(v.name, v.type.tensor_type.elem_type) for v in (*g.input, *g.output)]


@pytest.fixture(scope="module", params=sorted(CASES))
def converted(request, tmp_path_factory):
    """(name, source, {fp32, fp16: output}, fp16 report) of ``--int8 --calib-data``."""
    name, root = request.param, tmp_path_factory.mktemp(f"fp16-types-{request.param}")
    build, feeds = CASES[name]
    src = save(build(), root / f"{name}.onnx")
    calib = feeds(16, 1)
    np.savez(root / "calib.npz", **{k: np.stack([f[k] for f in calib]) for k in calib[0]})
    outs = {}
    for hp in ("fp32", "fp16"):
        outs[hp] = root / f"{name}.{hp}.onnx"
        _convert(src, "--int8", "--calib-data", root / "calib.npz", "--high-precision", hp, "-o", outs[hp],
                 "--report", root / f"{hp}.json")
    return name, src, outs, json.loads((root / "fp16.json").read_text())


def test_fp16_conversion_is_strictly_typed_and_keeps_the_interface(converted):
    name, src, outs, _ = converted
    model = assert_qdq_contract(outs["fp16"])  # checker full check and strict shape inference
    assert _interface(outs["fp16"]) == _interface(src)
    dequantized = {n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    assert dequantized and not any(n.op_type == "Cast" and n.input[0] in dequantized for n in model.graph.node)


def test_fp16_conversion_is_as_accurate_as_fp32(converted):
    name, src, outs, _ = converted
    feeds = _held_out(name)
    reference = [o.astype(np.float32) for o in _outputs(src, feeds)]
    fp32, fp16 = _outputs(outs["fp32"], feeds), _outputs(outs["fp16"], feeds)
    snr32, snr16, between = snr_db(reference, fp32), snr_db(reference, fp16), snr_db(fp32, fp16)
    assert between >= 40.0 and snr16 >= snr32 - 0.5, (snr32, snr16, between)


def test_fp16_conversion_builds_in_tensorrt(converted):
    assert_tensorrt_ready(converted[2]["fp16"])


def _types(model: onnx.ModelProto) -> dict[str, int]:
    from trt_bridge.ir.types import elem_types

    return {**elem_types(onnx.shape_inference.infer_shapes(model)), **{i.name: i.data_type
                                                                       for i in model.graph.initializer}}


def test_position_arithmetic_stays_float32_and_out_of_int8(converted):
    name, _, outs, report = converted
    model = onnx.load(str(outs["fp16"]))
    types = _types(model)
    kept = {k["node"] for k in report["precision"]["kept_in_float32"] if "integers (positions" in k["reason"]}
    if name == "modelopt":  # no arithmetic on positions: nothing is kept float32 for that reason
        assert not kept
        return
    if name == "rotary":
        assert {"/model/rotary_emb/Cast", "/model/rotary_emb/MatMul"} <= kept
        assert types["pos_f"] == types["freqs"] == types["emb"] == onnx.TensorProto.FLOAT
        assert types["q"] == onnx.TensorProto.FLOAT16  # the projections around it are float16
        assert not any(n.op_type == "QuantizeLinear" and n.input[0] in ("pos_f", "inv_freq") for n in model.graph.node)
    else:
        assert {"/Cast", "/Div", "/Log", "/Div_1", "/Mul", "/Cast_mask", "/Sub", "/Mul_mask"} <= kept
        assert types["rel_f"] == types["rel_log"] == types["mask_bias_2d"] == onnx.TensorProto.FLOAT
        assert types["v"] == onnx.TensorProto.FLOAT16


@pytest.mark.parametrize("name", ["rotary", "t5"])
def test_a_quantized_source_converts_without_calibration(name, tmp_path):
    """onnxruntime's own QDQ of the model: its scales, no data; the -1e9 mask is clipped where float16 reads it."""
    from onnxruntime.quantization import QuantFormat

    build, feeds = CASES[name]
    src = save(build(), tmp_path / f"{name}.onnx")
    qdq = quantize_static(src, tmp_path / "qdq.onnx", feeds(8, 1), quant_format=QuantFormat.QDQ,
                          op_types_to_quantize=["MatMul"])
    outs = {hp: tmp_path / f"{hp}.onnx" for hp in ("fp32", "fp16")}
    for hp, out in outs.items():
        _convert(qdq, "--high-precision", hp, "-o", out)
    model = assert_qdq_contract(outs["fp16"])
    assert _interface(outs["fp16"]) == _interface(src)
    held = _held_out(name)
    between = snr_db(_outputs(outs["fp32"], held), _outputs(outs["fp16"], held))
    assert between >= 38.0
    if name == "t5":  # no calibrated range says the mask is loud: it is clipped to float16's range, not made -inf
        assert any(n.op_type == "Clip" and n.input[0] == "position_bias" for n in model.graph.node)
        assert np.isfinite(np.concatenate([o.ravel() for o in _outputs(outs["fp16"], held)])).all()


def test_the_lowering_keeps_positions_float32(tmp_path):
    """The float16 pass alone on the float rotary: positions near 3000 stay exact in float32; in float16 (spacing 2
    there) the angles would be off by up to a radian."""
    src = models.rotary()
    feeds = _held_out("rotary")
    reference = _outputs(src, feeds)
    lowered, kept = to_float16(src)
    onnx.checker.check_model(lowered, full_check=True)
    onnx.shape_inference.infer_shapes(lowered, check_type=True, strict_mode=True)
    assert {k.node for k in kept} == {"/model/rotary_emb/Cast", "/model/rotary_emb/MatMul",
                                      "/model/rotary_emb/Transpose", "/model/rotary_emb/Concat",
                                      "/model/rotary_emb/Cos", "/model/rotary_emb/Sin", "/model/rotary_emb/Expand"}
    good = snr_db(reference, _outputs(lowered, feeds))
    naive = src.__deepcopy__()
    assign_float16(naive, set())  # every float computation in float16, positions too
    onnx.checker.check_model(naive, full_check=True)
    bad = snr_db(reference, _outputs(naive, feeds))
    assert good >= 55.0 and bad < good - 30.0, (good, bad)


def test_type_groups_on_the_awkward_nodes():
    """One pass over what a per-tensor rewrite gets wrong: a float constant read by a float16 and a float32 node (a
    copy each), a Shape of a float constant (left alone), a ConstantOfShape with its default float32 zero, an
    integer → float Cast read by float16 (it casts straight to float16), a graph output computed in float16.

    ```
    ids:int64 ─Cast(float)─┐         c (constant) ──┬─ Shape ─ ConstantOfShape ─┐
    x ─────────────────────Mul(c)── Add ────────────┼───────────────────────────Add ─ Exp(kept float32) ─ y
                                                    └─ Softmax(kept float32) ─ z
    ```
    """
    from onnx import TensorProto, helper, numpy_helper

    c = numpy_helper.from_array(np.linspace(-1, 1, 8).astype(np.float32).reshape(1, 8), "c")
    graph = helper.make_graph([
        helper.make_node("Cast", ["ids"], ["ids_f"], "cast", to=TensorProto.FLOAT),
        helper.make_node("Mul", ["x", "c"], ["xc"], "mul"),
        helper.make_node("Add", ["xc", "ids_f"], ["h"], "add"),
        helper.make_node("Shape", ["c"], ["c_shape"], "shape"),
        helper.make_node("ConstantOfShape", ["c_shape"], ["zeros"], "zeros"),
        helper.make_node("Add", ["h", "zeros"], ["h2"], "add2"),
        helper.make_node("Exp", ["h2"], ["y"], "exp"),
        helper.make_node("Softmax", ["c"], ["z"], "softmax"),
    ], "awkward", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8]),
                   helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 8])], [c])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    feeds = [{"x": np.linspace(-2, 2, 8, dtype=np.float32).reshape(1, 8), "ids": np.arange(8).reshape(1, 8)}]
    reference = session(model).run(None, feeds[0])
    lowered = model.__deepcopy__()
    assign_float16(lowered, {"exp", "softmax"})
    onnx.checker.check_model(lowered, full_check=True)
    onnx.shape_inference.infer_shapes(lowered, check_type=True, strict_mode=True)
    assert _interface(lowered) == _interface(model)
    types = _types(lowered)
    assert types["xc"] == types["ids_f"] == types["zeros"] == types["h2"] == onnx.TensorProto.FLOAT16
    cast = next(n for n in lowered.graph.node if n.name == "cast")
    assert cast.attribute[0].i == onnx.TensorProto.FLOAT16  # no float32 detour
    readers = {n.name: list(n.input) for n in lowered.graph.node}
    assert readers["shape"] == ["c"] and readers["softmax"] == ["c"] and readers["mul"][1] != "c"
    assert types[readers["mul"][1]] == onnx.TensorProto.FLOAT16 and types["c"] == onnx.TensorProto.FLOAT
    for want, got in zip(reference, session(lowered).run(None, feeds[0])):
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=1e-3)
