"""``convert --trt-module tensorrt_rtx`` (issue 38, "INT8 can cost more than float"): the quantized forms TensorRT-RTX
runs and nothing else. Its support matrix lists INT8 only as weight-only GEMMs and no quantized convolution, and an
INT8 Q/DQ it runs in float costs engine size (MobileNetV2-12 converted: 18.2 MiB against the float model's 13.7 for
SM 8.9). For that builder the convolutions go back to float, the INT8 GEMMs become weight-only, FP8 GEMMs stay FP8;
the default (datacenter TensorRT's W8A8 form) warns when its engine is larger than float's and names the flag."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from helpers import SHARED_MODELS, assert_qdq_contract, quantize_dynamic, run_ort, save, snr_db

from trt_bridge import samples
from trt_bridge.annotations import Annotations, Site, WeightSpec
from trt_bridge.choices import FormatOptions
from trt_bridge.conversion import convert
from trt_bridge.conversion.builder_forms import asked_precision, builder_forms
from trt_bridge.conversion.costs import larger_than_float
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions
from trt_bridge.errors import TrtBridgeError
from trt_bridge.lower.layer_precisions import layer_precisions

MOBILENET = SHARED_MODELS / "mobilenetv2-12-int8.onnx"


def _options(calib, **formats) -> ConvertOptions:
    return ConvertOptions(calibration=CalibrationOptions(data=str(calib)), formats=FormatOptions(**formats),
                          progress=False)


def _producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {o: n for n in model.graph.node for o in n.output}


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """samples.conv_net (3 Conv, 1 MatMul) quantized dynamically by onnxruntime, its calibration data, and both
    conversions: the default W8A8 form and TensorRT-RTX's."""
    root = tmp_path_factory.mktemp("forms")
    src = save(samples.conv_net(classes=200), root / "float.onnx")  # a 32 × 200 GEMM weight
    dynamic = quantize_dynamic(src, root / "dynamic.onnx")
    np.savez(root / "calib.npz", x=samples.image_feeds(8, 0))
    default = convert(dynamic, root / "w8a8.onnx", _options(root / "calib.npz"))
    rtx = convert(dynamic, root / "rtx.onnx", _options(root / "calib.npz", trt_module="tensorrt_rtx"))
    return root, src, dynamic, default, rtx


def test_tensorrt_rtx_forms_give_back_what_it_runs_in_float(classifier):
    """The classifier's 3 INT8 convolutions run in float on TensorRT-RTX: they go back to float, each reported, its
    GEMM becomes INT8 weight-only, and the engine is no larger than float's (the W8A8 form's is larger)."""
    root, src, dynamic, default, report = classifier
    model = assert_qdq_contract(root / "rtx.onnx")
    producers = _producers(model)
    assert "QuantizeLinear" not in {n.op_type for n in model.graph.node}
    for node in model.graph.node:
        if node.op_type == "Conv":  # float activations, float weights
            assert node.input[0] not in producers or producers[node.input[0]].op_type != "DequantizeLinear"
            assert node.input[1] not in producers or producers[node.input[1]].op_type != "DequantizeLinear"
        if node.op_type in ("MatMul", "Gemm"):  # the activation float, the weight int8 per channel
            assert producers[node.input[1]].op_type == "DequantizeLinear"
    assert layer_precisions(model)["counts"]["int8-w"] == 1
    layers = sorted((c["tensor"], c["format"], c["reason"]) for c in report.formats if c["kind"] == "layer")
    convs = sorted(n.name for n in onnx.load(str(dynamic)).graph.node if n.op_type == "ConvInteger")
    assert [(t, f) for t, f, _ in layers] == [(f"{c}/float", "float") for c in convs] + [("fc_quant/float", "int8-w")]
    assert {r for *_, r in layers[:-1]} == {"INT8 convolutions: not in TensorRT-RTX's support matrix"}
    # the source's weights (dequantized), no activation rounded: nearer the float model than the W8A8 form
    held_out = [{"x": f} for f in samples.image_feeds(8, 2)]
    forms_db = snr_db(run_ort(src, held_out), run_ort(root / "rtx.onnx", held_out))
    assert forms_db > 35 and forms_db > snr_db(run_ort(src, held_out), run_ort(root / "w8a8.onnx", held_out))
    assert report.check["ready"] and report.check["parser"]["module"] == "tensorrt_rtx"
    summary = report.summary()
    assert "3 layer(s) int8 → float (INT8 convolutions: not in TensorRT-RTX's support matrix)" in summary
    assert "3 layer(s) given back to float" in summary
    assert "TensorRT-ready INT8 weight-only" in report.check["headline"]
    w8a8, forms = default.costs, report.costs
    assert w8a8["output"]["engine_bytes"] > w8a8["float"]["engine_bytes"]  # the W8A8 form: larger than float
    view = default.builders[1]
    in_float = sum(g["count"] for g in view["groups"] if not g["quantized"])
    assert in_float and f"runs {in_float} of its {view['quantized_layers']} quantized layer(s) in float" in \
        w8a8["larger_than_float"] and "--trt-module tensorrt_rtx" in w8a8["larger_than_float"]
    assert f"  warning: {w8a8['larger_than_float']}" in default.summary().splitlines()
    assert forms["output"]["engine_bytes"] <= forms["float"]["engine_bytes"] and forms["larger_than_float"] is None
    assert json.loads(report.to_json())["costs"]["larger_than_float"] is None


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    """samples.transformer_block (hidden 128, 2 layers) and its INT8 conversion for TensorRT-RTX."""
    root = tmp_path_factory.mktemp("encoder")
    src = save(samples.transformer_block(seed=0, hidden=128, heads=4, seq=16, layers=2), root / "float.onnx")
    np.savez(root / "calib.npz", x=samples.sequence_feeds(8, 0, 16, 128))
    report = convert(src, root / "rtx.onnx", _options(root / "calib.npz", trt_module="tensorrt_rtx"))
    return root, src, report


def test_tensorrt_rtx_forms_make_weighted_gemms_weight_only(encoder):
    """Its projections (128 × 128 and wider weights) become INT8 weight-only: no Q/DQ on their activations, the int8
    weight dequantized per channel; the attention's activation × activation MatMuls have no weight: float."""
    root, src, report = encoder
    model = assert_qdq_contract(root / "rtx.onnx")
    producers = _producers(model)
    inits = {i.name: i for i in model.graph.initializer}
    weighted = 0
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gemm"):
            continue
        data, weight = producers.get(node.input[0]), producers.get(node.input[1])
        assert data is None or data.op_type != "DequantizeLinear", node.name  # the activation float
        if weight is not None and weight.op_type == "DequantizeLinear":
            weighted += 1
            assert onnx.numpy_helper.to_array(inits[weight.input[0]]).dtype == np.int8
    assert "QuantizeLinear" not in {n.op_type for n in model.graph.node}
    counts = layer_precisions(model)["counts"]
    assert weighted == counts["int8-w"] > 0 and "int8" not in counts
    reasons = {c["format"]: c["reason"] for c in report.formats if c["kind"] == "layer"}
    assert reasons["int8-w"] == "INT8 GEMMs: TensorRT-RTX's INT8 WoQ GEMM, the activation read in float"
    held_out = [{"x": f} for f in samples.sequence_feeds(8, 3, 16, 128)]
    assert snr_db(run_ort(src, held_out), run_ort(root / "rtx.onnx", held_out)) > 35  # weights alone rounded
    assert report.check["ready"] and "TensorRT-ready INT8 weight-only" in report.check["headline"]
    assert report.builders[1]["run_as_asked"] == report.builders[1]["quantized_layers"] == weighted
    assert report.costs["output"]["engine_bytes"] < report.costs["float"]["engine_bytes"]


def test_datacenter_tensorrt_keeps_w8a8_and_fp8_gemms_stay_for_rtx():
    """tensorrt (or no --trt-module) changes nothing; for TensorRT-RTX an FP8 GEMM stays FP8 on 8.9 and goes back to
    float for an 8.6 target, which runs no FP8; an INT8 GEMM with a 128 × 128 weight becomes weight-only."""
    import onnx_graphsurgeon as gs

    from trt_bridge.formats import FORMATS

    x, y4 = gs.Variable("x", np.float32, (4, 128)), gs.Variable("y4", np.float32, (1, 4, 8, 8))
    w = gs.Constant("w", np.ones((128, 128), np.float32))
    k = gs.Constant("k", np.ones((8, 4, 3, 3), np.float32))
    nodes = [gs.Node("MatMul", "mm", inputs=[x, w], outputs=[gs.Variable("y", np.float32)]),
             gs.Node("Conv", "conv", inputs=[y4, k], outputs=[gs.Variable("z", np.float32)])]
    graph = gs.Graph(nodes=nodes, inputs=[x, y4], outputs=[nodes[0].outputs[0], nodes[1].outputs[0]])

    def annotated(fmt):
        notes = Annotations()
        notes.add_activation("x", Site("mm", 0), "mm")
        notes.add_activation("y4", Site("conv", 0), "conv")
        notes.add_weight(WeightSpec("w", [Site("mm", 1)], 1, "mm"))
        notes.add_weight(WeightSpec("k", [Site("conv", 1)], 0, "conv"))
        for table in (notes.activations, notes.weights):
            for spec in table.values():
                spec.format = FORMATS[fmt]
        return notes

    for module in (None, "tensorrt"):
        notes = annotated("int8")
        assert builder_forms(graph, notes, module) == [] and set(notes.activations) == {"x", "y4"}
    notes = annotated("fp8")
    changes = builder_forms(graph, notes, "tensorrt_rtx", "8.9")
    assert [(c.tensor, c.format) for c in changes] == [("conv", "float")]
    assert set(notes.activations) == {"x"} and set(notes.weights) == {"w"} and asked_precision("mm", notes) == "fp8"
    notes = annotated("fp8")
    changes = builder_forms(graph, notes, "tensorrt_rtx", "8.6", body=True)  # a body may end up float
    assert sorted((c.tensor, c.format, c.reason) for c in changes) == [
        ("conv", "float", "FP8 convolutions: not in TensorRT-RTX's support matrix"),
        ("mm", "float", "FP8 GEMMs: FP8 needs compute capability 8.9+")]
    assert not notes.activations and not notes.weights
    with pytest.raises(TrtBridgeError, match="runs none of its 2 quantized layer"):
        builder_forms(graph, annotated("fp8"), "tensorrt_rtx", "8.6")  # a main graph may not
    notes = annotated("int8")
    changes = builder_forms(graph, notes, "tensorrt_rtx", "8.9")
    assert sorted((c.tensor, c.format) for c in changes) == [("conv", "float"), ("mm", "int8-w")]
    assert not notes.activations and set(notes.weights) == {"w"} and asked_precision("mm", notes) == "int8-w"


def test_a_model_tensorrt_rtx_runs_nothing_of_is_refused_in_one_line(tmp_path):
    """samples.conv_net's 3 INT8 convolutions (placement keeps its classifier GEMM float) run in float on TensorRT-RTX:
    nothing would stay quantized. One line naming the file and the fix, nothing written."""
    src = save(samples.conv_net(), tmp_path / "float.onnx")
    np.savez(tmp_path / "calib.npz", x=samples.image_feeds(4, 0))
    with pytest.raises(TrtBridgeError) as error:
        convert(src, tmp_path / "out.onnx", _options(tmp_path / "calib.npz", trt_module="tensorrt_rtx"))
    message = str(error.value)
    assert message.startswith(f"{src}: --trt-module tensorrt_rtx: TensorRT-RTX runs none of its 3 quantized "
                              "layer(s) quantized (3 INT8 convolutions: not in TensorRT-RTX's support matrix)") \
        and "\n" not in message
    assert "--high-precision fp16" in message and "drop --trt-module" in message
    assert not (tmp_path / "out.onnx").exists()


def test_a_bad_trt_module_is_one_line():
    with pytest.raises(TrtBridgeError, match="--trt-module tensorrt_lean: choose tensorrt or tensorrt_rtx"):
        FormatOptions(trt_module="tensorrt_lean")


def test_larger_than_float_says_nothing_when_not_larger_or_not_measured():
    small = {"output": {"engine_bytes": 10}, "float": {"engine_bytes": 12}}
    assert larger_than_float(small, [], None) is None
    assert larger_than_float({"output": {"engine_bytes": 10}, "float": None}, [], None) is None
    view = {"used": True, "module": "tensorrt", "builder": "datacenter TensorRT", "quantized_layers": 2,
            "groups": [{"count": 2, "quantized": True}]}
    text = larger_than_float({"output": {"engine_bytes": 15}, "float": {"engine_bytes": 10}}, [view], None)
    assert text == "the engine is 50 % larger than the float model's"


@pytest.mark.skipif(not MOBILENET.exists(), reason="../shared/models is absent")
def test_real_mobilenet_for_tensorrt_rtx_is_smaller_than_float(tmp_path):
    """The real MobileNetV2-12 QOperator model: its 52 INT8 convolutions go back to float, its classifier GEMM is INT8
    weight-only; the SM 8.9 engine is smaller than the float model's (it was 33 % larger in the W8A8 form)."""
    out = tmp_path / "rtx.onnx"
    report = convert(MOBILENET, out, ConvertOptions(formats=FormatOptions(trt_module="tensorrt_rtx"),
                                                    progress=False))
    layers = [c for c in report.formats if c["kind"] == "layer"]
    assert sum(1 for c in layers if c["format"] == "float" and "convolution" in c["reason"]) == 52
    assert [c["format"] for c in layers].count("int8-w") == 1
    assert report.check["ready"]
    assert report.costs["output"]["engine_bytes"] < report.costs["float"]["engine_bytes"]
    feeds = [{"input": f} for f in np.random.default_rng(0).normal(0, 1, (4, 1, 3, 224, 224)).astype(np.float32)]
    # against the source: the convolutions in float with its own dequantized weights, the activations unrounded
    assert snr_db(run_ort(MOBILENET, feeds), run_ort(out, feeds)) > 5


def test_tensorrt_rtx_forms_inside_if_branches(tmp_path):
    """The Silero-like VAD's If branches (Conv → Conv → LSTM → MatMul): their convolutions and small GEMMs go back to
    float inside the branches too, reported among the body sites left float; nothing TensorRT-RTX would run
    quantized is left, and the check says so (a blocker: convert exits 1)."""
    from control_flow_models import vad_feeds, vad_model

    src = save(vad_model(), tmp_path / "vad.onnx")
    feeds = vad_feeds(8, seed=1) + vad_feeds(8, seed=3, rate=8000)
    np.savez(tmp_path / "calib.npz", **{k: np.stack([f[k] for f in feeds]) for k in feeds[0]})
    out = tmp_path / "vad.rtx.onnx"
    report = convert(src, out, _options(tmp_path / "calib.npz", trt_module="tensorrt_rtx"))
    model = onnx.load(str(out))
    for node in model.graph.node:
        for attr in node.attribute:
            for body in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                made = {o: n for n in body.node for o in n.output}
                for conv in (n for n in body.node if n.op_type == "Conv"):
                    assert made.get(conv.input[0]) is None or made[conv.input[0]].op_type != "DequantizeLinear"
    reasons = {(x["node"], x["reason"]) for x in report.control_flow["left_in_float"]}
    for branch in ("sr16k", "sr8k"):
        assert (f"{branch}/conv", "INT8 convolutions: not in TensorRT-RTX's support matrix") in reasons
        assert (f"{branch}/fc", "INT8 GEMMs: a weight under 4096 elements saves less than its dequantization "
                "costs") in reasons
    held_out = vad_feeds(6, seed=5)
    assert snr_db(run_ort(src, held_out), run_ort(out, held_out)) > 60  # float throughout
    assert [f["rule"] for f in report.check["findings"]] == ["not-int8"] and report.remaining_blockers


def test_a_small_weight_is_not_made_weight_only():
    import onnx_graphsurgeon as gs

    x = gs.Variable("x", np.float32, (4, 16))
    node = gs.Node("MatMul", "mm", inputs=[x, gs.Constant("w", np.ones((16, 16), np.float32))],
                   outputs=[gs.Variable("y", np.float32)])
    graph = gs.Graph(nodes=[node], inputs=[x], outputs=node.outputs)
    notes = Annotations()
    notes.add_activation("x", Site("mm", 0), "mm")
    notes.add_weight(WeightSpec("w", [Site("mm", 1)], 1, "mm"))
    changes = builder_forms(graph, notes, "tensorrt_rtx", "8.9", body=True)
    assert [(c.format, c.reason) for c in changes] == [
        ("float", "INT8 GEMMs: a weight under 4096 elements saves less than its dequantization costs")]
    assert not notes.activations and not notes.weights
