"""``convert --fp4`` (issue 39, item 1): NVFP4 W4A4 from a float model for compute capability 10.0 and newer.
MatMul/Gemm activations become TensorRT's dynamic FP4 quantization (``TRT_FP4DynamicQuantize`` → DequantizeLinear
→ DequantizeLinear, a calibrated global scale), their weights FP4 E2M1 blocks of 16 with NVFP4's two-level scales
(FP8 E4M3 block scales under an FP32 global scale); the other quantized layers FP8. onnxruntime runs the output
through the exact emulation (runtime/fp4_dynamic.py); TensorRT-RTX builds it for SM 12.0 and refuses it for 8.9."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from helpers import save, snr_db
from onnx import TensorProto, numpy_helper

from trt_bridge import samples
from trt_bridge.choices import FormatOptions
from trt_bridge.conversion import convert
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions
from trt_bridge.errors import OptionError
from trt_bridge.formats import nvfp4_scales, nvfp4_split
from trt_bridge.lower.layer_precisions import layer_precisions
from trt_bridge.runtime.fp4_dynamic import OP, dequantized
from trt_bridge.runtime.session import session


def _convert(src, out, calib, precision="fp4", target="12.0", **options):
    return convert(src, out, ConvertOptions(calibration=CalibrationOptions(data=str(calib)), progress=False,
                                            formats=FormatOptions(activations=precision, compute_capability=target),
                                            **options))


def _run(path, feeds):
    s = session(path)
    return [s.run(None, f)[0] for f in feeds]


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    """samples.transformer_block (hidden 128, 2 layers, 32 tokens), its calibration feeds, and its --fp4 and --fp8
    conversions for SM 12.0."""
    root = tmp_path_factory.mktemp("w4a4")
    src = save(samples.transformer_block(seed=0, hidden=128, heads=4, seq=32, layers=2), root / "float.onnx")
    np.savez(root / "calib.npz", x=samples.sequence_feeds(12, 0, 32, 128))
    fp4 = _convert(src, root / "fp4.onnx", root / "calib.npz")
    fp8 = _convert(src, root / "fp8.onnx", root / "calib.npz", precision="fp8")
    return root, src, fp4, fp8


def test_gemm_activations_are_tensorrts_dynamic_fp4_and_weights_nvfp4(encoder):
    root, src, report, _ = encoder
    model = onnx.load(str(root / "fp4.onnx"))
    assert {(o.domain, o.version) for o in model.opset_import} == {("", 23), ("trt", 1)}
    onnx.checker.check_model(model, full_check=True)
    producers = {o: n for n in model.graph.node for o in n.output}
    inits = {i.name: i for i in model.graph.initializer}
    dynamic = [n for n in model.graph.node if n.op_type == OP]
    assert dynamic and all(n.domain == "trt" for n in dynamic)
    for n in dynamic:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        assert attrs == {"axis": -1, "block_size": 16, "scale_type": TensorProto.FLOAT8E4M3FN}
        g = numpy_helper.to_array(inits[n.input[1]])
        assert g.shape == () and np.isfinite(g) and g > 0
    weighted = 0
    for node in (n for n in model.graph.node if n.op_type == "MatMul"):
        weight = producers.get(node.input[1])
        if weight is None or weight.op_type != "DequantizeLinear" or weight.input[0] not in inits:
            continue
        weighted += 1
        data = producers[node.input[0]]  # DQ(codes of TRT_FP4DynamicQuantize, DQ(block scales, g))
        assert data.op_type == "DequantizeLinear" and producers[data.input[0]].op_type == OP
        assert inits[weight.input[0]].data_type == TensorProto.FLOAT4E2M1
        two_level = producers[weight.input[1]]  # the weight's scales: DQ(FP8 block scales, global)
        assert two_level.op_type == "DequantizeLinear"
        assert inits[two_level.input[0]].data_type == TensorProto.FLOAT8E4M3FN
        assert {a.name: a.i for a in weight.attribute} == {"axis": 0, "block_size": 16}
    # every weighted MatMul; q, k and v read one quantized activation
    assert weighted == layer_precisions(model)["counts"]["fp4"] == 12 and len(dynamic) == 8
    assert report.check["ready"] and "TensorRT-ready FP4" in report.check["headline"]  # built for SM 12.0
    assert not report.remaining_blockers


def test_fp4_conversion_follows_the_float_model_through_the_emulation(encoder):
    root, src, report, fp8 = encoder
    held_out = [{"x": f} for f in samples.sequence_feeds(8, 5, 32, 128)]
    reference = _run(src, held_out)
    fp4_db, fp8_db = snr_db(reference, _run(root / "fp4.onnx", held_out)), snr_db(reference,
                                                                                    _run(root / "fp8.onnx", held_out))
    # two E2M1 roundings a layer (activation and weight, ~20 dB each alone), four GEMMs deep
    assert 12 < fp4_db < fp8_db, (fp4_db, fp8_db)
    # the first GEMM's input, quantized by the emulation exactly as TensorRT defines it
    model = onnx.load(str(root / "fp4.onnx"))
    first = next(n for n in model.graph.node if n.op_type == OP)
    g = float(numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == first.input[1])))
    probe = onnx.helper.make_tensor_value_info(first.output[0].replace("_fp4", "_dequantized"), TensorProto.FLOAT,
                                               None)
    model.graph.output.append(probe)
    x_in = onnx.helper.make_tensor_value_info(first.input[0], TensorProto.FLOAT, None)
    model.graph.output.append(x_in)
    path = save(model, root / "probe.onnx")
    outs = session(path).run([probe.name, x_in.name], held_out[0])
    assert outs[0].tobytes() == dequantized(outs[1], g).tobytes()


def test_fp4_is_deterministic(encoder, tmp_path):
    root, src, _, _ = encoder
    _convert(src, tmp_path / "again.onnx", root / "calib.npz")
    assert (tmp_path / "again.onnx").read_bytes() == (root / "fp4.onnx").read_bytes()


def test_convolutions_get_fp8_and_the_gemm_fp4(tmp_path):
    """A CNN: its convolutions are not FP4 GEMMs, so FP8 (or float where placement says FP8 does not pay); its
    64-class classifier GEMM W4A4. TensorRT-RTX builds it for SM 12.0 and refuses it for SM 8.9."""
    from trt_bridge.tensorrt.build import EngineBuildError, build_engine

    src = save(samples.conv_net(classes=64), tmp_path / "float.onnx")
    np.savez(tmp_path / "calib.npz", x=samples.image_feeds(12, 0))
    report = _convert(src, tmp_path / "fp4.onnx", tmp_path / "calib.npz")
    reasons = {c["tensor"]: (c["format"], c["reason"]) for c in report.formats if c["kind"] == "activation"}
    assert ("fp8", "--fp4 is for GEMMs: Conv input 0 is not a GEMM's activation") in reasons.values()
    assert [f for f, _ in reasons.values()].count("fp4") == 1
    counts = layer_precisions(onnx.load(str(tmp_path / "fp4.onnx")))["counts"]
    assert counts["fp4"] == 1 and counts.get("fp8", 0) >= 1
    held_out = [{"x": f} for f in samples.image_feeds(8, 3)]
    assert snr_db(_run(src, held_out), _run(tmp_path / "fp4.onnx", held_out)) > 15
    assert report.check["ready"]
    with pytest.raises(EngineBuildError):
        build_engine(tmp_path / "fp4.onnx", compute_capability="SM89")


@pytest.mark.parametrize("target", [None, "8.9"])
def test_fp4_for_an_older_or_no_target_is_one_line_and_writes_nothing(tmp_path, target):
    src = save(samples.conv_net(), tmp_path / "float.onnx")
    np.savez(tmp_path / "calib.npz", x=samples.image_feeds(4, 0))
    with pytest.raises(OptionError) as error:
        _convert(src, tmp_path / "out.onnx", tmp_path / "calib.npz", target=target)
    message = str(error.value)
    assert "\n" not in message and message.startswith("--fp4 (NVFP4 W4A4) runs on compute capability 10.0")
    assert "--fp8" in message and "--int4" in message and "--compute-capability 10.0 or 12.0" in message
    assert not (tmp_path / "out.onnx").exists()


def test_nvfp4_scales_split_back_exactly():
    rng = np.random.default_rng(0)
    scale = rng.uniform(1e-4, 2.0, size=(8, 32)).astype(np.float32)
    scale[0, 0] = 1e-12  # below FP8's range under the global scale: its smallest subnormal, never 0
    rounded = nvfp4_scales(scale)
    assert rounded.dtype == np.float32 and np.all(rounded > 0)
    assert np.max(np.abs(rounded[1:] - scale[1:]) / scale[1:]) <= 2.0 ** -4  # FP8 E4M3: 3 mantissa bits
    s8, g = nvfp4_split(rounded)
    assert s8.dtype == ml_dtypes.float8_e4m3fn and g.shape == ()
    assert (s8.astype(np.float32) * g).tobytes() == rounded.tobytes()
    assert nvfp4_split(scale) is None  # a source's own float32 scales stay single-level


@pytest.mark.parametrize("fmt", ["json", "trt-cache", "fixed-point"])
def test_scales_export_refuses_dynamic_fp4_by_name(encoder, tmp_path, capsys, fmt):
    from trt_bridge.cli import main

    root, *_ = encoder
    out = tmp_path / f"scales.{fmt}"
    assert main(["scales", "export", str(root / "fp4.onnx"), "--format", fmt, "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "TRT_FP4DynamicQuantize 'layer0.ln1.out_TRT_FP4DynamicQuantize'" in err
    assert "--int8 or --fp8 conversion" in err and not out.exists()


def test_scales_export_refuses_fp4_weights_by_name(tmp_path, capsys):
    """An FP4 weight-only model (two-level NVFP4 scales): refused by name, not an internal error."""
    from trt_bridge.cli import main

    rng = np.random.default_rng(1)
    w = rng.normal(size=(64, 32)).astype(np.float32)
    from trt_bridge.lift.weights import quantize_blocks

    codes, scale = quantize_blocks(w, 0, 16, np.float32, __import__("trt_bridge.formats").formats.FP4)
    s8, g = nvfp4_split(scale)
    h = onnx.helper
    nodes = [h.make_node("DequantizeLinear", ["s8", "g"], ["s"], "w_scale_dq"),
             h.make_node("DequantizeLinear", ["w4", "s"], ["w"], "w_dq", axis=0, block_size=16),
             h.make_node("MatMul", ["x", "w"], ["y"], "fc")]
    inits = [numpy_helper.from_array(codes, "w4"), numpy_helper.from_array(s8, "s8"), numpy_helper.from_array(g, "g")]
    graph = h.make_graph(nodes, "w4", [h.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, [2, 32])], inits)
    path = save(h.make_model(graph, opset_imports=[h.make_opsetid("", 23)]), tmp_path / "w4.onnx")
    assert main(["scales", "export", str(path), "--format", "json", "-o", str(tmp_path / "s.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert "DequantizeLinear 'w_dq' dequantizes FP4 E2M1 blocks of 'w4'" in err and "\n" not in err


def test_check_names_the_fp4_activations_and_where_they_run(encoder):
    import json

    from trt_bridge.checks import CheckOptions, TrtProbe, check_model

    root, *_ = encoder
    report = check_model(root / "fp4.onnx", CheckOptions(TrtProbe.OFF, costs=None, compute_capability="12.0"))
    note = report.fp4_activations
    assert note["count"] == 8 and note["nodes"][0].endswith("_TRT_FP4DynamicQuantize")
    assert "compute capability 10.0 and newer" in note["line"] and "TensorRT 10.8" in note["line"]
    assert f"  {note['line']}" in report.summary().splitlines()
    assert json.loads(report.to_json())["fp4_activations"]["count"] == 8
    older = check_model(root / "fp4.onnx", CheckOptions(TrtProbe.OFF, costs=None, compute_capability="8.9"))
    assert [f.rule for f in older.blockers] == ["precision-target"]  # FP4 on 8.9: a blocker naming the target
    assert check_model(root / "fp8.onnx", CheckOptions(TrtProbe.OFF, costs=None)).fp4_activations is None


def test_fp8_nodes_and_the_accuracy_target_move_fp4_layers_to_fp8_first(encoder, tmp_path):
    """--fp8-nodes writes the named GEMMs' activations (and weights) in FP8; under --fp4 the accuracy target moves
    its ranked layers to FP8 before any goes to float, and meets a target between W4A4's SNR and FP8's."""
    from trt_bridge.conversion.accuracy import convert_to_target

    root, src, fp4, _ = encoder
    named = _convert(src, tmp_path / "named.onnx", root / "calib.npz")  # the plain conversion, for its names
    first = sorted({c for q in named.quantized if q["kind"] == "weight" for c in q["consumers"]})[0]
    report = convert(src, tmp_path / "fp8nodes.onnx", ConvertOptions(
        calibration=CalibrationOptions(data=str(root / "calib.npz")), progress=False,
        formats=FormatOptions(activations="fp4", compute_capability="12.0", fp8_nodes=f"^{first}$")))
    moved = {c["tensor"]: c for c in report.formats if c["kind"] == "activation" and c["format"] == "fp8"}
    assert any(c["reason"] == "--fp4 is for GEMMs: --fp8-nodes names its reader" for c in moved.values())
    counts = layer_precisions(onnx.load(str(tmp_path / "fp8nodes.onnx")))["counts"]
    assert counts["fp8"] >= 1 and counts["fp4"] < 12
    assert report.check["ready"]  # built for SM 12.0 by convert's check
    with pytest.raises(OptionError, match="--fp8-nodes names the layers --fp4 writes in FP8"):
        FormatOptions(activations="fp8", fp8_nodes="x")
    eval_feeds = root / "eval.npz"
    np.savez(eval_feeds, x=samples.sequence_feeds(6, 11, 32, 128))
    held = [{"x": f} for f in samples.sequence_feeds(6, 11, 32, 128)]
    plain = snr_db(_run(src, held), _run(root / "fp4.onnx", held))
    target = plain + 3.0
    out = tmp_path / "target.onnx"
    _, result = convert_to_target(src, out, ConvertOptions(
        calibration=CalibrationOptions(data=str(root / "calib.npz")), progress=False, check=False,
        formats=FormatOptions(activations="fp4", compute_capability="12.0")), target, eval_data=str(eval_feeds))
    assert result.met and result.chosen.tier == "fp8", result.summary()
    assert "kept in FP8" in result.summary()
    counts = layer_precisions(onnx.load(str(out)))["counts"]
    assert counts["fp8"] >= 1 and counts["fp4"] >= 1  # some W4A4 kept, none of the moved layers in float
    assert snr_db(_run(src, held), _run(out, held)) >= target - 0.01
    from trt_bridge.tensorrt.build import build_engine

    assert len(build_engine(out, compute_capability="SM120")) > 0  # the probes ran without convert's check


def test_fp4_weight_blocks_take_the_scale_that_fits_them_best():
    """Each FP4 block's NVFP4 scale is the candidate (amax / 6, / 6.5, ... / 8, / 5.5, FP8-rounded under one global
    scale) whose codes dequantize nearest: never worse than amax / 6 on any block, better in all on Gaussian
    weights, and still two exact levels."""
    from trt_bridge.formats import FP4 as FMT
    from trt_bridge.lift.weights import dequantize, quantize_blocks

    w = np.random.default_rng(0).normal(size=(256, 64)).astype(np.float32)
    plain_codes, plain = quantize_blocks(w, 0, 16, np.float32, FMT, search=False)
    codes, scale = quantize_blocks(w, 0, 16, np.float32, FMT)
    blocks = lambda a: a.reshape(16, 16, 64)  # noqa: E731 - (blocks, 16, columns)

    def error(c, s):
        return ((blocks(dequantize(c, s, 0, 16).astype(np.float64)) - blocks(w.astype(np.float64))) ** 2).sum(axis=1)

    searched, base = error(codes, scale), error(plain_codes, plain)
    assert np.all(searched <= base + 1e-12) and searched.sum() < 0.9 * base.sum()
    assert nvfp4_split(scale) is not None  # FP8 block scales under one FP32 global scale, exactly


def test_fp4_activations_are_not_smoothed(encoder):
    """SmoothQuant moves an activation's outlier channels into its weights; under --fp4 TensorRT scales the
    activation per block of 16, so an outlier costs its blocks only, and FP4 weights lose more than they gain."""
    _, _, fp4, fp8 = encoder
    assert not fp4.smoothed and fp8.smoothed


def test_fp4_in_float16(encoder, tmp_path):
    """--fp4 --high-precision fp16: the NVFP4 chains compute in float16 (a DequantizeLinear of opset 23 without
    output_dtype writes its scale's type: the two-level weight scales become float16 with no Cast between the two
    DequantizeLinear nodes), TensorRT-RTX builds it for SM 12.0, and it follows the float32 conversion."""
    from trt_bridge.conversion.options import PrecisionOptions

    root, src, _, _ = encoder
    out = tmp_path / "fp16.onnx"
    report = convert(src, out, ConvertOptions(
        calibration=CalibrationOptions(data=str(root / "calib.npz")), progress=False,
        formats=FormatOptions(activations="fp4", compute_capability="12.0"),
        precision=PrecisionOptions(high_precision="fp16")))
    assert report.check["ready"] and not report.remaining_blockers, report.summary()
    model = onnx.load(str(out))
    producers = {o: n for n in model.graph.node for o in n.output}
    two_level = [n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[1] in producers]
    assert two_level and all(producers[n.input[1]].op_type == "DequantizeLinear" for n in two_level)
    held = [{"x": f} for f in samples.sequence_feeds(6, 5, 32, 128)]
    reference = _run(src, held)  # float16 rounding moves some FP4 codes across their midpoints: as accurate
    assert snr_db(reference, _run(out, held)) > snr_db(reference, _run(root / "fp4.onnx", held)) - 1.0


def test_fp4_weights_are_rounded_plainly_or_by_gptq_as_the_held_out_feeds_choose(encoder):
    """With calibration data the FP4 weights are rounded two ways (calibrate/awq.py, calibrate/gptq.py): plainly
    and by GPTQ, never with AWQ's scaling of their input (the input is quantized to FP4 too); the held-out feeds
    choose. Measured by scripts/fp4_w4a4.py: the 4 × 256 block 15.97 → 17.11 dB, BERT 52.99 → 55.74 dB."""
    root, _, report, _ = encoder
    assert report.awq and all(x["format"] == "FP4" and x["alpha"] == 0 and not x["through"] for x in report.awq)
    judged, chosen = report.awq[0]["held_out_db"], report.awq[0]["variant"]
    assert set(judged) == {"rtn", "gptq"} and chosen == "gptq" and judged["gptq"] > judged["rtn"], judged
    assert all(x["error"] < x["rtn_error"] for x in report.awq)
    assert "AWQ: the FP4 weights of 12 layer(s)" in report.summary()
