"""AIMET encodings files (``sim.export``'s ``<name>.encodings``) as ``convert --scales`` tables: the legacy
(0.6.1), 1.0.0 and 2.x layouts, per-channel weight axes, data-movement outputs, what TensorRT has no
equivalent for, bad scales, and a conversion that takes every scale from the file."""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import onnx
import pytest
from helpers import assert_qdq_contract, assert_tensorrt_ready, op_types, save, snr_db
from onnx import TensorProto, helper, numpy_helper
from test_cli import cli

from trt_bridge.conversion import convert
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions, ScaleOptions
from trt_bridge.errors import TrtBridgeError
from trt_bridge.runtime.session import session
from trt_bridge.scales.formats import read_scales

RNG = np.random.default_rng(3)


def _model() -> onnx.ModelProto:
    """x[N,3,8,8] ─ Conv(Wc[16,3,3,3], pad 1) ─ c ─ Relu ─ r ─ Flatten ─ f[N,1024]
                 ─ Gemm(Wg[24,1024], transB) ─ g[N,24] ─ MatMul(Wm[24,24]) ─ y[N,24]

    Wc's and Wg's channel axes follow from their shapes (one dimension is 16, one is 24); Wm is square, so
    its axis comes from the op that reads it (MatMul: the last)."""
    inits = [numpy_helper.from_array((RNG.standard_normal((16, 3, 3, 3)) * 0.3).astype(np.float32), "Wc"),
             numpy_helper.from_array((RNG.standard_normal((24, 1024)) * 0.03).astype(np.float32), "Wg"),
             numpy_helper.from_array((RNG.standard_normal((24, 24)) * 0.2).astype(np.float32), "Wm")]
    nodes = [helper.make_node("Conv", ["x", "Wc"], ["c"], "conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], "relu"),
             helper.make_node("Flatten", ["r"], ["f"], "flatten"),
             helper.make_node("Gemm", ["f", "Wg"], ["g"], "gemm", transB=1),
             helper.make_node("MatMul", ["g", "Wm"], ["y"], "matmul")]
    graph = helper.make_graph(nodes, "aimet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 24])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count, 1, 3, 8, 8)).astype(np.float32)


def _ranges(model: onnx.ModelProto, tensors: list[str], feeds: np.ndarray) -> dict[str, tuple[float, float]]:
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    exposed.graph.output.extend(helper.make_tensor_value_info(t, TensorProto.FLOAT, None) for t in tensors)
    sess = session(exposed)
    names = [o.name for o in sess.get_outputs()]
    lo, hi = dict.fromkeys(tensors, 0.0), dict.fromkeys(tensors, 0.0)
    for feed in feeds:
        outs = dict(zip(names, sess.run(None, {"x": feed})))
        for t in tensors:
            lo[t], hi[t] = min(lo[t], float(outs[t].min())), max(hi[t], float(outs[t].max()))
    return {t: (lo[t], hi[t]) for t in tensors}


def _asymmetric(lo: float, hi: float, bits: int = 8) -> tuple[float, float]:
    """AIMET's asymmetric encoding of [lo, hi]: scale and the (rounded, unsigned-style) offset."""
    scale = (hi - lo) / (2 ** bits - 1)
    return scale, float(round(lo / scale))


def _weight_scales(w: np.ndarray, axis: int) -> list[float]:
    other = tuple(i for i in range(w.ndim) if i != axis)
    return (np.abs(w).max(axis=other) / 127).astype(np.float64).tolist()


def _encodings(model: onnx.ModelProto, feeds: np.ndarray) -> dict:
    """What AIMET's default config would write for this model, in the 1.0.0 layout: asymmetric activations
    (the model input and every op output except Conv's, fused with its Relu, and Flatten's, data movement),
    symmetric per-channel weights."""
    ranges = _ranges(model, ["x", "r", "g", "y"], feeds)
    acts = []
    for name, (lo, hi) in ranges.items():
        scale, offset = _asymmetric(lo, hi)
        acts.append({"name": name, "dtype": "INT", "enc_type": "PER_TENSOR", "bw": 8, "is_sym": False,
                     "scale": [scale], "offset": [offset]})
    weights = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    params = [{"name": name, "dtype": "INT", "enc_type": "PER_CHANNEL", "bw": 8, "is_sym": True,
               "scale": _weight_scales(weights[name], axis), "offset": [-128.0] * weights[name].shape[axis]}
              for name, axis in (("Wc", 0), ("Wg", 0), ("Wm", 1))]
    return {"version": "1.0.0", "activation_encodings": acts, "param_encodings": params,
            "quantizer_args": {"activation_bitwidth": 8, "param_bitwidth": 8}}


def _legacy(doc: dict) -> dict:
    """The same encodings in the 0.6.1 layout (sections keyed by name, one object per channel, min/max)."""
    def entries(e):
        bits = e["bw"]
        return [{"bitwidth": bits, "dtype": "int", "is_symmetric": str(e["is_sym"]), "scale": s, "offset": o,
                 "min": o * s, "max": (o + 2 ** bits - 1) * s} for s, o in zip(e["scale"], e["offset"])]

    return {"version": "0.6.1", "activation_encodings": {e["name"]: entries(e) for e in doc["activation_encodings"]},
            "param_encodings": {e["name"]: entries(e) for e in doc["param_encodings"]}}


def _v2(doc: dict) -> dict:
    """The same encodings in the 2.0.0 layout (ONNX-style entries, signed weights with their axis)."""
    out = []
    for e in doc["activation_encodings"]:
        out.append({"name": e["name"], "output_dtype": "uint8", "y_scale": e["scale"][0],
                    "y_zero_point": int(-e["offset"][0])})
    for e, axis in zip(doc["param_encodings"], (0, 0, 1)):
        out.append({"name": e["name"], "output_dtype": "int8", "y_scale": e["scale"], "axis": axis})
    return {"version": "2.0.0", "encodings": out}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("aimet")
    model = _model()
    path = save(model, root / "model.onnx")
    doc = _encodings(model, _feeds(16, 1))
    files = {}
    for layout, content in (("1.0.0", doc), ("0.6.1", _legacy(doc)), ("2.0.0", _v2(doc))):
        files[layout] = root / f"model-{layout}.encodings"
        files[layout].write_text(json.dumps(content, indent=1))
    return {"root": root, "model": model, "path": path, "doc": doc, "files": files}


@pytest.mark.parametrize("layout", ["1.0.0", "0.6.1", "2.0.0"])
def test_reads_each_layout(setup, layout):
    table = read_scales(setup["files"][layout], setup["model"])
    doc = {e["name"]: e for e in setup["doc"]["activation_encodings"] + setup["doc"]["param_encodings"]}
    # symmetric weights keep AIMET's grid: amax = 127 · scale, per channel on the right axis
    for name, axis in (("Wc", 0), ("Wg", 0), ("Wm", 1)):
        entry = table[name]
        assert entry.kind == "weight" and entry.axis == axis
        np.testing.assert_allclose(entry.amax, np.array(doc[name]["scale"]) * 127, rtol=1e-12)
    # asymmetric activations: the symmetric range covering AIMET's [min, max]
    for name in ("x", "r", "g", "y"):
        scale, offset = doc[name]["scale"][0], doc[name]["offset"][0]
        covering = max(abs(offset * scale), abs((offset + 255) * scale))
        assert table[name].kind == "activation" and table[name].axis is None
        assert math.isclose(table[name].amax, covering, rel_tol=1e-12)
    # Flatten's output (no encoding: AIMET leaves data movement unquantized) takes its input's
    assert table["f"].amax == table["r"].amax and table["f"].source.startswith("aimet-derived:")
    assert table["x"].source == f"aimet:{setup['files'][layout].name}" and not table.notes


def test_square_weight_axis_needs_the_model(setup, caplog):
    # with the model, Wm's axis comes from the MatMul reading it; without it, Wm is left out and noted
    with caplog.at_level(logging.WARNING, logger="trt_bridge.scales"):
        table = read_scales(setup["files"]["1.0.0"])
    assert "Wm" not in table and "Wc" not in table  # no shapes without the model
    assert any("channel axis is unknown" in note and "'Wm'" in note for note in table.notes)
    assert "channel axis is unknown" in caplog.text
    # the 2.x layout stores the axis: no model needed
    assert read_scales(setup["files"]["2.0.0"])["Wm"].axis == 1


def test_what_tensorrt_lacks_is_brought_to_int8_and_noted(setup, tmp_path, caplog):
    doc = json.loads(json.dumps(setup["doc"]))
    acts = {e["name"]: e for e in doc["activation_encodings"]}
    acts["g"].update(bw=16, scale=[acts["g"]["scale"][0] / 257], offset=[acts["g"]["offset"][0] * 257])  # W8A16
    acts["y"].clear()
    acts["y"].update(name="y", dtype="FLOAT", enc_type="PER_TENSOR", bw=16, is_sym=False)  # kept in float16
    doc["param_encodings"][1].update(enc_type="PER_BLOCK", block_size=64,
                                     scale=doc["param_encodings"][1]["scale"] * 4)  # block-wise Gemm weight
    path = tmp_path / "mixed.encodings"
    path.write_text(json.dumps(doc))
    with caplog.at_level(logging.WARNING, logger="trt_bridge.scales"):
        table = read_scales(path, setup["model"])
    lo, hi = acts["g"]["offset"][0] * acts["g"]["scale"][0], (acts["g"]["offset"][0] + 65535) * acts["g"]["scale"][0]
    assert math.isclose(table["g"].amax, max(abs(lo), abs(hi)), rel_tol=1e-12)  # int8 over the 16-bit range
    assert "y" not in table and "Wg" not in table
    assert len(table.notes) == 3 and caplog.text.count("AIMET encodings") == 3
    out = tmp_path / "out.onnx"
    report = convert(setup["path"], out, ConvertOptions(calibration=CalibrationOptions(data=None, random=4),
                                                        scales=ScaleOptions(files=(str(path),)), progress=False))
    assert report.imported_scales["notes"] == table.notes
    assert report.summary().count("brought to the nearest form TensorRT builds: mixed.encodings: ") == 3
    sources = {q["tensor"]: q["source"] for q in report.quantized}
    assert sources["g"] == "file" and sources["Wg"] == "requantized-weights"  # Wg per channel from its values
    assert_qdq_contract(out)


@pytest.mark.parametrize("bad", [0.0, -0.01, float("nan"), float("inf")])
def test_bad_scales_are_refused_with_file_and_tensor(setup, tmp_path, bad):
    doc = json.loads(json.dumps(setup["doc"]))
    doc["param_encodings"][2]["scale"][3] = bad
    path = tmp_path / "bad.encodings"
    path.write_text(json.dumps(doc))  # Python's json writes NaN/Infinity, as AIMET's exporter does
    with pytest.raises(TrtBridgeError, match=r"bad\.encodings: AIMET encoding of tensor 'Wm': scale .* not a finite "
                                             r"positive number") as err:
        read_scales(path, setup["model"])
    assert "\n" not in str(err.value)


def test_unreadable_entries_are_refused(setup, tmp_path):
    doc = json.loads(json.dumps(setup["doc"]))
    del doc["activation_encodings"][0]["offset"]
    path = tmp_path / "broken.encodings"
    path.write_text(json.dumps(doc))
    with pytest.raises(TrtBridgeError, match=r"broken\.encodings: AIMET encoding of tensor 'x': cannot read"):
        read_scales(path, setup["model"])
    path.write_text(json.dumps({"version": "3.0.0", "encodings": []}))
    with pytest.raises(TrtBridgeError, match="version '3.0.0' is not one trt-bridge reads"):
        read_scales(path, setup["model"])


@pytest.mark.parametrize("layout", ["1.0.0", "0.6.1"])
def test_convert_takes_every_scale_from_the_encodings(setup, tmp_path, layout):
    out = tmp_path / "model.trt.onnx"
    done = cli("convert", setup["path"], "--int8", "-o", out, "--scales", setup["files"][layout], "--json", "-q")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    quantized = {q["tensor"]: q for q in report["quantized"]}
    assert {q["source"] for q in quantized.values()} == {"file"}  # no calibration data: nothing else to take
    assert set(quantized) == {"x", "f", "g", "Wc", "Wg", "Wm"}  # Conv, Gemm and MatMul inputs and weights
    doc = {e["name"]: e for e in setup["doc"]["param_encodings"]}
    for name, axis in (("Wc", 0), ("Wg", 0), ("Wm", 1)):  # AIMET's per-channel weight scales, bit for bit
        assert quantized[name]["axis"] == axis
        np.testing.assert_array_equal(np.float32(quantized[name]["scale"]), np.float32(doc[name]["scale"]))
    assert op_types(out) >= {"QuantizeLinear", "DequantizeLinear", "Conv", "Gemm", "MatMul"}
    assert_qdq_contract(out)
    assert_tensorrt_ready(out)
    held_out = _feeds(16, 2)
    reference = [session(setup["path"]).run(None, {"x": f})[0] for f in held_out]
    converted = [session(out, simulate_qdq=True).run(None, {"x": f})[0] for f in held_out]
    # measured 34.4 dB against the float model on these held-out inputs (every range from the calibration
    # feeds the encodings were computed on); bar 3 dB under
    assert snr_db(reference, converted) > 31.4


def test_a_tied_asymmetric_range_is_narrowed_to_the_data(setup, tmp_path):
    # AIMET ties ranges (an RNN's hidden states, a Concat's inputs): g's encoding reaches 4x past what g holds
    doc = json.loads(json.dumps(setup["doc"]))
    g = next(e for e in doc["activation_encodings"] if e["name"] == "g")
    lo, hi = g["offset"][0] * g["scale"][0], (g["offset"][0] + 255) * g["scale"][0]
    g["scale"], g["offset"] = _asymmetric(lo, 4 * hi)
    g["scale"], g["offset"] = [g["scale"]], [g["offset"]]
    cover = max(abs(g["offset"][0] * g["scale"][0]), abs((g["offset"][0] + 255) * g["scale"][0]))
    path = tmp_path / "tied.encodings"
    path.write_text(json.dumps(doc))
    np.savez(tmp_path / "calib.npz", x=_feeds(16, 1))  # the feeds the encodings were computed on
    held_out = _feeds(16, 2)
    reference = [session(setup["path"]).run(None, {"x": f})[0] for f in held_out]
    snrs = {}
    for calib in (None, str(tmp_path / "calib.npz")):
        out = tmp_path / f"{'data' if calib else 'file'}.onnx"
        report = convert(setup["path"], out, ConvertOptions(  # g's layer stays quantized (give-back would take it)
            calibration=CalibrationOptions(data=calib, give_back=False), scales=ScaleOptions(files=(str(path),)),
            progress=False))
        scale = {q["tensor"]: q["scale"] for q in report.quantized}["g"]
        snrs[calib is not None] = snr_db(reference, [session(out, simulate_qdq=True).run(None, {"x": f})[0]
                                                     for f in held_out])
        if calib is None:  # the file alone: the symmetric cover of AIMET's range
            assert math.isclose(scale * 127, cover, rel_tol=1e-6)
            assert not report.imported_scales["narrowed"]
            continue
        narrowed = {n["tensor"]: n for n in report.imported_scales["narrowed"]}
        assert set(narrowed) == {"g"}  # the other ranges were computed on these feeds: nothing to narrow
        observed = _ranges(setup["model"], ["g"], _feeds(16, 1))["g"]
        expected = max(max(abs(v) for v in observed), 127 * g["scale"][0])
        assert math.isclose(narrowed["g"]["narrowed"], expected, rel_tol=1e-5)
        assert math.isclose(scale * 127, expected, rel_tol=1e-5)
        assert_qdq_contract(out)
        assert_tensorrt_ready(out)
    # measured: 30.7 dB with the tied range as it is, 32.9 dB narrowed (to 127 of AIMET's own steps, which are
    # coarser than g needs: the untied encodings give 34.4 dB); bar 3 dB under, and better than the file alone
    assert snrs[True] > 29.9 and snrs[True] > snrs[False] + 1.5, snrs


def test_fp8_encodings_are_kept_fp8(setup, tmp_path):
    """AIMET 2.x FP8 encodings (``output_dtype: float8e4m3fn``, symmetric, zero point 0): read as the range
    y_scale·448, kept FP8 without --fp8 (they were dropped as "float" encodings, and convert without data then
    failed: no scale for the activations), every Q/DQ FP8 with AIMET's own scales, built for SM 8.9."""
    ranges = _ranges(setup["model"], ["x", "r", "g", "y"], _feeds(16, 1))
    weights = {i.name: numpy_helper.to_array(i) for i in setup["model"].graph.initializer}
    entries = [{"name": n, "output_dtype": "float8e4m3fn", "y_scale": max(abs(lo), abs(hi)) / 448,
                "y_zero_point": 0.0} for n, (lo, hi) in ranges.items()]
    entries += [{"name": n, "output_dtype": "float8e4m3fn", "axis": axis,
                 "y_scale": (np.array(_weight_scales(weights[n], axis)) * 127 / 448).tolist()}
                for n, axis in (("Wc", 0), ("Wg", 0), ("Wm", 1))]
    path = tmp_path / "fp8.encodings"
    path.write_text(json.dumps({"version": "2.0.0", "encodings": entries}))
    table = read_scales(path, setup["model"])
    assert {table[e["name"]].format for e in entries} == {"fp8"} and not table.notes
    assert math.isclose(table["x"].amax, entries[0]["y_scale"] * 448, rel_tol=1e-12)
    out = tmp_path / "model.trt.onnx"
    report = convert(setup["path"], out, ConvertOptions(scales=ScaleOptions(files=(str(path),)), progress=False))
    quantized = {q["tensor"]: q for q in report.quantized}
    # the Conv (3 input channels) stays in the high precision, as every FP8 conversion leaves it (place/formats)
    assert set(quantized) == {"f", "g", "Wg", "Wm"} and {q["source"] for q in quantized.values()} == {"file"}
    model = assert_qdq_contract(out)
    inits = {i.name: i for i in model.graph.initializer}
    q_scales, dq_codes = {}, set()
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear":
            assert inits[node.input[2]].data_type == TensorProto.FLOAT8E4M3FN
            q_scales[node.input[0]] = float(numpy_helper.to_array(inits[node.input[1]]))
        elif node.op_type == "DequantizeLinear" and node.input[0] in inits:
            dq_codes.add(inits[node.input[0]].data_type)
            scale = numpy_helper.to_array(inits[node.input[1]])
            name = next(w for w in ("Wg", "Wm") if node.input[0].startswith(w))
            want = next(e["y_scale"] for e in entries if e["name"] == name)
            np.testing.assert_array_equal(scale, np.float32(want), err_msg=name)  # AIMET's, bit for bit
    assert dq_codes == {TensorProto.FLOAT8E4M3FN} and set(q_scales) == {"f", "g"}
    # AIMET's activation scales, bit for bit ('f', the Flatten's output, takes its input 'r''s)
    for tensor, entry in (("f", "r"), ("g", "g")):
        assert q_scales[tensor] == np.float32(next(e["y_scale"] for e in entries if e["name"] == entry))
    assert_tensorrt_ready(out)
    held_out = _feeds(16, 2)
    reference = [session(setup["path"]).run(None, {"x": f})[0] for f in held_out]
    converted = [session(out, simulate_qdq=True).run(None, {"x": f})[0] for f in held_out]
    assert snr_db(reference, converted) > 25.0


def test_fp8_encodings_e5m2_is_noted_and_a_zero_point_refused(setup, tmp_path):
    """E5M2 encodings become E4M3 over the same range (noted); an FP8 encoding with a non-zero zero point is an
    error naming the file and tensor (FP8 encodings are symmetric)."""
    doc = {"version": "2.0.0", "encodings": [{"name": "x", "output_dtype": "float8e5m2", "y_scale": 0.001}]}
    path = tmp_path / "e5m2.encodings"
    path.write_text(json.dumps(doc))
    table = read_scales(path, setup["model"])
    assert table["x"].format == "fp8" and math.isclose(table["x"].amax, 0.001 * 57344, rel_tol=1e-12)
    assert len(table.notes) == 1 and "float8e5m2 encodings imported as FP8 E4M3" in table.notes[0]
    doc["encodings"][0].update(output_dtype="float8e4m3fn", y_zero_point=1.0)
    path.write_text(json.dumps(doc))
    with pytest.raises(TrtBridgeError, match=r"e5m2\.encodings: AIMET encoding of tensor 'x': float8e4m3fn with a "
                                             r"non-zero zero point") as err:
        read_scales(path, setup["model"])
    assert "\n" not in str(err.value)
