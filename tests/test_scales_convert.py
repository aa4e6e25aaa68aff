"""Imported scales in `convert`: QAT scales beat scarce calibration, precedence of --scales over --qat over the
model over calibration, imported ranges flagged against data, and `trt-bridge scales export` round trips."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import onnx
import pytest
from helpers import assert_qdq_contract, assert_tensorrt_ready, quantize_dynamic, run_ort, save, snr_db
from onnx import TensorProto, helper
from test_cli import cli
from test_scales_qat import make_qat, renamed

from trt_bridge import samples
from trt_bridge.conversion import convert
from trt_bridge.conversion.options import (
    ActivationOptions,
    CalibrationOptions,
    ConvertOptions,
    RangeOptions,
    ScaleOptions,
)
from trt_bridge.runtime.session import session
from trt_bridge.scales.json_table import read_json
from trt_bridge.scales.model_scales import scales_of_model
from trt_bridge.scales.table import ScaleEntry, ScaleTable
from trt_bridge.scales.trt_cache import read_trt_cache, write_trt_cache

#: the static conversion these tests check (a dynamic source would otherwise get runtime ranges)
STATIC = ActivationOptions(runtime_ranges="off")


def _amax(model: onnx.ModelProto, tensors: list[str], feeds: np.ndarray) -> dict[str, float]:
    """max |t| of each tensor over ``feeds`` (what a long QAT run settles on, in this fixture)."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    exposed.graph.output.extend(helper.make_tensor_value_info(t, TensorProto.FLOAT, None) for t in tensors)
    sess = session(exposed)
    names = [o.name for o in sess.get_outputs()]
    amax = dict.fromkeys(tensors, 0.0)
    for feed in feeds:
        outs = dict(zip(names, sess.run(None, {"x": feed})))
        for t in tensors:
            amax[t] = max(amax[t], float(np.abs(outs[t]).max()))
    return amax


@pytest.fixture(scope="module")
def qat_setup(tmp_path_factory):
    """A float conv net, its QAT-style export (scales settled over 256 inputs), and the same network exported
    again under other names and quantized dynamically: the model a user has when the QAT scales are lost."""
    root = tmp_path_factory.mktemp("qat")
    model = samples.conv_net()
    fpath = save(model, root / "float.onnx")
    inits = {i.name for i in model.graph.initializer}
    acts = sorted({n.input[0] for n in model.graph.node if n.op_type in ("Conv", "MatMul") and n.input[1] in inits})
    qat = save(make_qat(model, _amax(model, acts, samples.image_feeds(256, 7))), root / "qat.onnx")
    other = save(renamed(model), root / "other_float.onnx")
    dyn = quantize_dynamic(other, root / "dynamic.onnx")
    np.savez(root / "scarce.npz", **{"exported/x": samples.image_feeds(1, 1)})  # one calibration input
    held_out = [{"x": f} for f in samples.image_feeds(32, 2)]
    return {"root": root, "float": fpath, "qat": qat, "dynamic": dyn, "held_out": held_out}


def _snr(setup, path) -> float:
    reference = [session(setup["float"]).run(None, f)[0] for f in setup["held_out"]]
    return snr_db(reference, [session(path).run(None, {"exported/x": f["x"]})[0] for f in setup["held_out"]])


def test_qat_scales_beat_scarce_calibration(qat_setup, tmp_path):
    scarce = tmp_path / "scarce.onnx"
    convert(qat_setup["dynamic"], scarce, ConvertOptions(
        calibration=CalibrationOptions(data=str(qat_setup["root"] / "scarce.npz")), progress=False))
    imported = tmp_path / "qat.onnx"
    report = convert(qat_setup["dynamic"], imported, ConvertOptions(
        calibration=CalibrationOptions(data=str(qat_setup["root"] / "scarce.npz")),
        scales=ScaleOptions(qat=str(qat_setup["qat"])), progress=False))
    assert_qdq_contract(imported)
    sources = {q["tensor"]: q["source"] for q in report.quantized}
    activations = {t: s for t, s in sources.items() if not t.endswith(("weight", "_quantized"))}
    assert report.imported_scales["match"]["matched"] == 8 and not report.imported_scales["match"]["unmatched"]
    assert sum(1 for s in sources.values() if s == "qat") >= 8  # 4 activations and 4 weights
    assert set(activations.values()) >= {"qat"}
    snr_scarce, snr_qat = _snr(qat_setup, scarce), _snr(qat_setup, imported)
    print(f"held-out SNR: one-input calibration {snr_scarce:.2f} dB, QAT scales {snr_qat:.2f} dB")
    assert snr_qat > snr_scarce + 3, (snr_scarce, snr_qat)
    # one calibration input under-estimates the ranges the QAT scales cover: the data check says so
    assert report.imported_scales["warnings"] == [] or all("imported amax" in w["message"]
                                                          for w in report.imported_scales["warnings"])
    assert_tensorrt_ready(imported)


def test_explicit_scales_win_over_qat_and_disagreement_is_flagged(qat_setup, tmp_path):
    """An explicit table (a TensorRT calibration cache) wins over the QAT scales for its tensors; an amax that
    clips most calibration values is flagged."""
    first = tmp_path / "first.onnx"
    convert(qat_setup["dynamic"], first, ConvertOptions(scales=ScaleOptions(qat=str(qat_setup["qat"])),
                                                        ranges=RangeOptions(recenter=False), progress=False))
    snr_first = _snr(qat_setup, first)
    assert snr_first > 31  # measured 34.7 dB
    assert_tensorrt_ready(first)
    qat_scales = scales_of_model(onnx.load(str(first)))
    name = "exported/r1"
    assert name in qat_scales
    cache = tmp_path / "override.cache"
    write_trt_cache(ScaleTable.of([ScaleEntry(name, qat_scales[name].amax / 50, source="test")]), cache)
    np.savez(tmp_path / "calib.npz", **{"exported/x": samples.image_feeds(8, 3)})
    out = tmp_path / "override.onnx"
    report = convert(qat_setup["dynamic"], out, ConvertOptions(
        calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")),
        scales=ScaleOptions(files=(str(cache),), qat=str(qat_setup["qat"])), ranges=RangeOptions(recenter=False),
        progress=False))
    sources = {q["tensor"]: (q["source"], q["scale"]) for q in report.quantized}
    assert sources[name][0] == "file"
    assert sources[name][1] == pytest.approx(qat_scales[name].amax / 50 / 127, rel=1e-6)
    assert all(s == "qat" for t, (s, _) in sources.items() if t != name)
    [warning] = [w for w in report.imported_scales["warnings"] if w["tensor"] == name]
    assert "clips" in warning["message"] and warning["clipped_fraction"] > 0.2  # half of a ReLU output is 0
    # the explicit amax / 50 is what computes: it clips r1 and wrecks the output (measured 1.5 dB against 34.7)
    assert _snr(qat_setup, out) < snr_first - 20
    assert_tensorrt_ready(out)


def test_scales_export_round_trip(qat_setup, tmp_path):
    """export → import gives identical scales: a TensorRT cache bit for bit, and convert given the exported
    JSON table writes the same scales again."""
    np.savez(tmp_path / "calib.npz", **{"exported/x": samples.image_feeds(8, 3)})
    first = tmp_path / "first.onnx"
    options = ConvertOptions(activations=STATIC, calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")),
                             ranges=RangeOptions(recenter=False), progress=False)
    convert(qat_setup["dynamic"], first, options)
    for fmt, name in (("trt-cache", "scales.cache"), ("json", "scales.json"), ("fixed-point", "fixed.json")):
        result = cli("scales", "export", first, "--format", fmt, "-o", tmp_path / name)
        assert result.returncode == 0, result.stderr
    original = scales_of_model(onnx.load(str(first)))
    cache = read_trt_cache(tmp_path / "scales.cache")
    for tensor in cache:
        assert np.float32(cache[tensor].scale) == np.float32(original[tensor].scale)
    again = tmp_path / "again.onnx"
    report = convert(qat_setup["dynamic"], again, replace(options, scales=ScaleOptions(
        files=(str(tmp_path / "scales.json"),))))
    assert {q["source"] for q in report.quantized if q["kind"] == "activation"} == {"file"}
    assert scales_of_model(onnx.load(str(again))).entries.keys() == original.entries.keys()
    for tensor, entry in scales_of_model(onnx.load(str(again))).entries.items():
        np.testing.assert_array_equal(np.float32(entry.scale), np.float32(original[tensor].scale))
    assert _snr(qat_setup, again) == pytest.approx(_snr(qat_setup, first), abs=1e-6)  # the same model, numerically
    assert_tensorrt_ready(again)
    table = read_json(tmp_path / "scales.json")
    assert len(table.weights()) == 4  # the dynamic source's exact per-tensor int8 weights, kept
    rows = json.loads((tmp_path / "fixed.json").read_text())["layers"]
    assert rows and all(2**30 <= r["multiplier"] < 2**31 for r in rows if isinstance(r["multiplier"], int))


def test_scales_cli_errors(qat_setup, tmp_path):
    result = cli("convert", qat_setup["dynamic"], "--scales", tmp_path / "missing.cache", "--calib-random", "1")
    assert result.returncode == 2 and "--scales" in result.stderr and "no such file" in result.stderr
    result = cli("convert", qat_setup["dynamic"], "--qat", tmp_path / "missing.onnx", "--calib-random", "1")
    assert result.returncode == 2 and "--qat" in result.stderr
    result = cli("scales", "export", qat_setup["float"], "--format", "json", "-o", tmp_path / "s.json")
    assert result.returncode == 2 and "is it a converted model?" in result.stderr


def test_imported_scales_survive_the_later_passes(qat_setup, tmp_path):
    """A float source with --qat and no calibration data is quantized from the QAT scales alone; smoothing
    leaves weights with imported scales alone; an explicit file's weight keyed by the float name wins over QAT."""
    out = tmp_path / "float_qat.onnx"
    report = convert(qat_setup["float"], out, ConvertOptions(scales=ScaleOptions(qat=str(qat_setup["qat"])),
                                                             progress=False))
    # the 32→10 classifier stays float on a float source (too small for int8 kernels): its entries are unused
    assert report.imported_scales["applied"] == 6 and report.imported_scales["unused"] == ["fc:weight", "flat"]
    assert {q["source"] for q in report.quantized} == {"qat"}
    reference = run_ort(qat_setup["float"], qat_setup["held_out"])
    assert snr_db(reference, run_ort(out, qat_setup["held_out"])) > 34  # measured 37.7 dB
    assert_tensorrt_ready(out)
    # explicit weight scale (by the float weight's name) on the dynamic source, beside the QAT scales
    table = tmp_path / "w.json"
    table.write_text(json.dumps({"format": "trt-bridge-scales", "version": 1, "tensors": {
        "exported/conv2.weight": {"amax": 1.5, "axis": None, "kind": "weight"}}}))
    np.savez(tmp_path / "calib.npz", **{"exported/x": samples.image_feeds(4, 3)})
    report = convert(qat_setup["dynamic"], tmp_path / "w.onnx", ConvertOptions(
        calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")),
        scales=ScaleOptions(files=(str(table),), qat=str(qat_setup["qat"])), progress=False))
    weights = {q["tensor"]: q for q in report.quantized if q["kind"] == "weight"}
    [conv2] = [q for t, q in weights.items() if "conv2" in t]
    assert conv2["source"] == "file" and conv2["scale"] == pytest.approx(1.5 / 127, rel=1e-6)
    assert all(q["source"] == "qat" for t, q in weights.items() if "conv2" not in t)
    assert _snr(qat_setup, tmp_path / "w.onnx") > 28  # measured 31.0 dB
    assert_tensorrt_ready(tmp_path / "w.onnx")


def test_smoothing_keeps_an_imported_weight_scale(tmp_path):
    model = samples.transformer_block()
    src = save(model, tmp_path / "tb.onnx")
    weight = "layer0.attn.q.weight"
    values = next(onnx.numpy_helper.to_array(i) for i in model.graph.initializer if i.name == weight)
    amax = float(np.abs(values).max() * 2)
    table = tmp_path / "w.json"
    table.write_text(json.dumps({"format": "trt-bridge-scales", "version": 1, "tensors": {
        weight: {"amax": amax, "axis": None, "kind": "weight"}}}))
    np.savez(tmp_path / "calib.npz", x=samples.sequence_feeds(16, 1, 16, 64))
    report = convert(src, tmp_path / "tb.int8.onnx", ConvertOptions(
        calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")), scales=ScaleOptions(files=(str(table),)),
        progress=False))
    [q] = [q for q in report.quantized if q["tensor"] == weight]
    assert q["source"] == "file" and q["scale"] == pytest.approx(amax / 127, rel=1e-6)
    assert report.smoothed  # the other LayerNorm outputs are still smoothed
    held_out = [{"x": f} for f in samples.sequence_feeds(8, 2, 16, 64)]
    reference = [session(src).run(None, f)[0] for f in held_out]
    # one weight quantized per tensor over twice its range costs about 1 dB (measured 38.8 against 40.1)
    assert snr_db(reference, [session(tmp_path / "tb.int8.onnx").run(None, f)[0] for f in held_out]) > 35
    assert_tensorrt_ready(tmp_path / "tb.int8.onnx")


def test_qat_wins_over_a_uint8_qdq_sources_own_scales(qat_setup, tmp_path):
    """onnxruntime's uint8 QDQ output: its ReLU-folding quantizers lift to '<x>_clipped' activations, which the
    QAT scales of '<x>' still reach; the QAT scale wins over the model's own."""
    from helpers import quantize_static
    from onnxruntime.quantization import QuantFormat, QuantType

    src = quantize_static(qat_setup["float"], tmp_path / "qdq.onnx", [{"x": f} for f in samples.image_feeds(8, 1)],
                          quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8, per_channel=True)
    report = convert(src, tmp_path / "out.onnx", ConvertOptions(scales=ScaleOptions(qat=str(qat_setup["qat"])),
                                                                progress=False))
    sources = {q["tensor"]: q["source"] for q in report.quantized if q["kind"] == "activation"}
    assert sources and set(sources.values()) == {"qat"}, sources
    assert not [u for u in report.imported_scales["unused"] if not u.startswith("fc") and u != "flat"]
    reference = [session(qat_setup["float"]).run(None, f)[0] for f in qat_setup["held_out"]]
    assert snr_db(reference, [session(tmp_path / "out.onnx").run(None, f)[0] for f in qat_setup["held_out"]]) > 25
    assert_tensorrt_ready(tmp_path / "out.onnx")


def test_modelopt_state_dict_onto_a_dynamic_model(tmp_path):
    """ModelOpt `_amax` buffers (saved with numpy: no torch needed) mapped through module names onto
    onnxruntime's quantize_dynamic output of the same network: the integer ops are found by their names."""
    model = samples.transformer_block()
    dyn = quantize_dynamic(save(model, tmp_path / "tb.onnx"), tmp_path / "dyn.onnx")
    state = {}
    for node in model.graph.node:
        if node.op_type == "MatMul" and node.name.count("/") == 1 and "attn" in node.name:
            module = node.name.split("/")[0]  # 'layer0.attn.q/MatMul' → module 'layer0.attn.q'
            state[f"{module}.input_quantizer._amax"] = np.array(4.0, np.float32)
            state[f"{module}.weight_quantizer._amax"] = np.array(0.5, np.float32)
    assert len(state) >= 6
    np.savez(tmp_path / "modelopt.npz", **state)
    report = convert(dyn, tmp_path / "out.onnx", ConvertOptions(calibration=CalibrationOptions(random=4),
                                                                scales=ScaleOptions(qat=str(tmp_path / "modelopt.npz")),
                                                                progress=False))
    qat = {q["tensor"]: q for q in report.quantized if q["source"] == "qat"}
    assert any(q["kind"] == "activation" and q["scale"] == pytest.approx(4.0 / 127) for q in qat.values())
    assert sum(1 for q in qat.values() if q["kind"] == "weight" and q["scale"] == pytest.approx(0.5 / 127)) >= 3
    held_out = [{"x": f} for f in samples.sequence_feeds(8, 2, 16, 64)]
    # the hand-set amax values and 4 random calibration feeds are rough (plain --calib-random 4 alone: 15.1 dB);
    # measured 16.6 dB
    assert snr_db(run_ort(tmp_path / "tb.onnx", held_out), run_ort(tmp_path / "out.onnx", held_out)) > 13
    assert_tensorrt_ready(tmp_path / "out.onnx")
