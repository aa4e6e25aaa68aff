"""Scale tables and their files (trt_bridge/scales): TensorRT calibration caches, trt-bridge JSON,
onnxruntime calibration tables, a converted model's own scales, ModelOpt ``_amax`` state dicts,
and the fixed-point requantization table.

The converted model used throughout is ``samples.conv_net`` calibrated on random feeds::

    x ─ Q/DQ ─ conv1 ─ Relu ─ Sub(centre) ─ Pad ─ Q/DQ(r1_padded) ─ conv2 ─ Relu ─ ... ─ Q/DQ(r2_padded) ─ conv3
        ─ Relu ─ GlobalAveragePool ─ Flatten ─ fc (float) ─ logits
"""

from __future__ import annotations

import csv
import json
import struct

import numpy as np
import onnx
import pytest
from helpers import assert_tensorrt_ready, run_ort, save, snr_db
from onnx import numpy_helper

from trt_bridge import samples
from trt_bridge.conversion import convert
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions
from trt_bridge.errors import MissingDependencyError, TrtBridgeError
from trt_bridge.scales import (
    ScaleEntry,
    ScaleTable,
    merge_by_precedence,
    read_json,
    read_ort_table,
    read_scales,
    read_trt_cache,
    scales_of_model,
    write_json,
    write_trt_cache,
)
from trt_bridge.scales.fixed_point import (
    multiplier_value,
    quantize_multiplier,
    requantization_table,
    requantize,
    write_fixed_point,
)
from trt_bridge.scales.modelopt import read_modelopt_amax


def _bits(value: float) -> str:
    return struct.pack(">f", np.float32(value)).hex()


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(converted conv_net ModelProto, its ConversionReport)."""
    tmp = tmp_path_factory.mktemp("converted")
    src = save(samples.conv_net(), tmp / "float.onnx")
    report = convert(src, tmp / "int8.onnx", ConvertOptions(calibration=CalibrationOptions(random=4), progress=False,
                                                            check=False))
    held_out = [{"x": f} for f in samples.image_feeds(8, 2)]
    assert snr_db(run_ort(src, held_out), run_ort(tmp / "int8.onnx", held_out)) > 33  # measured 37.5 dB
    assert_tensorrt_ready(tmp / "int8.onnx")
    return onnx.load(str(tmp / "int8.onnx")), report


def _initializers(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


# ---------------------------------------------------------------- the table


def test_entry_validation_and_scale():
    e = ScaleEntry("x", np.float32(2.54))
    assert isinstance(e.amax, float) and e.scale == e.amax / 127 and e.axis is None and e.kind == "activation"
    w = ScaleEntry("w", [1.27, 2.54], axis=0, kind="weight")
    assert w.amax == (1.27, 2.54) and w.per_channel and w.scale == (1.27 / 127, 2.54 / 127)
    # issue 16: 0 (it would zero the tensor or become a subnormal scale), subnormal and negative amax are refused
    for bad, match in [(dict(tensor="x", amax=-1.0), "finite positive"),
                       (dict(tensor="x", amax=float("nan")), "finite"),
                       (dict(tensor="z", amax=0.0), "finite positive"),
                       (dict(tensor="z", amax=1e-40), "smallest normal"),
                       (dict(tensor="w", amax=[1.0, 0.0], axis=0, kind="weight"), "finite positive"),
                       (dict(tensor="x", amax="1"), "not a number"), (dict(tensor="x", amax=[1.0, 2.0], axis=0),
                                                                      "per tensor"),
                       (dict(tensor="w", amax=[1.0, 2.0], kind="weight"), "no axis"),
                       (dict(tensor="x", amax=1.0, kind="bias"), "kind"), (dict(tensor="", amax=1.0), "name")]:
        with pytest.raises(TrtBridgeError, match=match):
            ScaleEntry(**bad)


def test_precedence_merging():
    explicit = ScaleTable.of([ScaleEntry("a", 1.0, source="json:s.json")])
    qat = ScaleTable.of([ScaleEntry("a", 2.0, source="qat:q.onnx"), ScaleEntry("b", 2.0, source="qat:q.onnx")])
    model = ScaleTable.of([ScaleEntry("b", 3.0, source="model"), ScaleEntry("c", 3.0, source="model")])
    calib = ScaleTable.of([ScaleEntry("c", 4.0, source="calibration"), ScaleEntry("d", 4.0, source="calibration"),
                           ScaleEntry("w", (1.0, 2.0), 0, "weight", "calibration")])
    merged = merge_by_precedence(explicit, qat, None, model, calib)
    assert merged == explicit.merged_over(qat).merged_over(model).merged_over(calib)
    assert merged.sources() == {"a": "json:s.json", "b": "qat:q.onnx", "c": "model", "d": "calibration",
                                "w": "calibration"}
    assert [merged[t].amax for t in "abcd"] == [1.0, 2.0, 3.0, 4.0]
    assert len(merged) == 5 and "w" in merged and "zz" not in merged and merged.get("zz") is None
    assert list(merged.weights()) == ["w"] and "w" not in merged.activations()
    assert len(qat) == 2  # merging leaves the inputs alone
    with pytest.raises(TrtBridgeError, match="two scale entries"):
        ScaleTable.of([ScaleEntry("a", 1.0), ScaleEntry("a", 2.0)])


# ---------------------------------------------------------------- TensorRT calibration cache

#: float32 scales that are awkward to carry through text: tiny (subnormal), near 1, with all mantissa bits set,
#: a value not representable in decimal, huge
# float32's smallest normal and its successor (subnormal and zero scales are refused, issue 16)
TINY = np.finfo(np.float32).tiny
AWKWARD = [TINY, np.nextafter(TINY, np.float32(1)), np.nextafter(np.float32(1), np.float32(2)),
           np.float32(1 / 3), np.float32(np.pi), np.float32(0.1), np.float32(3.0e36),
           np.frombuffer(bytes.fromhex("3fffffff"), ">f4")[0]]


def test_trt_cache_round_trip_is_bit_exact(tmp_path):
    table = ScaleTable.of([ScaleEntry(f"t{i}", float(s) * 127, source="calibration") for i, s in enumerate(AWKWARD)]
                          + [ScaleEntry("not_float32", 0.1),  # amax / 127 is rounded to float32 once
                             ScaleEntry("w", (1.0, 2.0), 0, "weight")])  # weights have no place in a cache
    path = write_trt_cache(table, tmp_path / "calib.cache")
    lines = path.read_text().splitlines()
    assert lines[0] == "TRT-100300-EntropyCalibration2" and len(lines) == len(AWKWARD) + 2
    for i, s in enumerate(AWKWARD):
        assert lines[i + 1] == f"t{i}: {_bits(s)}"
    assert lines[-1] == f"not_float32: {_bits(0.1 / 127)}"

    back = read_trt_cache(path)
    assert list(back) == [f"t{i}" for i in range(len(AWKWARD))] + ["not_float32"]
    for i, s in enumerate(AWKWARD):
        assert np.float32(back[f"t{i}"].scale) == s and back[f"t{i}"].amax == float(s) * 127
        assert back[f"t{i}"].source == "trt-cache:calib.cache" and back[f"t{i}"].kind == "activation"
    again = write_trt_cache(back, tmp_path / "again.cache")
    assert again.read_bytes() == path.read_bytes()


def test_written_cache_parses_the_way_its_readers_parse_it(tmp_path):
    """ModelOpt's importer splits each line after the header at ': ' and reads the hex with bytes.fromhex;
    onnxruntime's TensorRT EP splits at the first ':' and takes range = scale * 127."""
    table = ScaleTable.of([ScaleEntry("input", 2.5), ScaleEntry("(Unnamed Layer* 3) [Convolution]_output", 1e-3)])
    path = write_trt_cache(table, tmp_path / "c.cache", version=8601, algorithm="MinMaxCalibration")
    lines = path.read_text().split("\n")
    assert lines[0] == "TRT-8601-MinMaxCalibration" and lines[-1] == ""  # newline-terminated, no blank lines
    for line, entry in zip(lines[1:-1], table.entries.values()):
        name, hex_value = line.split(": ")
        assert name == entry.tensor and len(hex_value) == 8
        scale = struct.unpack("!f", bytes.fromhex(hex_value))[0]
        assert scale == np.float32(entry.scale)
        ort_name, ort_hex = line.split(":", 1)
        assert ort_name == entry.tensor and int(ort_hex, 16) == int(hex_value, 16)


@pytest.mark.parametrize("header", ["TRT-8601-EntropyCalibration2", "TRT-100300-EntropyCalibration2",
                                    "TRT-7134-LegacyCalibration"])
def test_read_hand_written_cache(tmp_path, header):
    path = tmp_path / "model.calib"
    path.write_text(f"{header}\ninput: 3c010a14\n(Unnamed Layer* 5) [Shuffle]_output: 3d4ccccd\n"
                    "conv1/relu:0: 3e800000\nsmall: 800000\n\n")
    table = read_scales(path)
    assert list(table) == ["input", "(Unnamed Layer* 5) [Shuffle]_output", "conv1/relu:0", "small"]
    assert np.float32(table["input"].scale) == struct.unpack(">f", bytes.fromhex("3c010a14"))[0]
    assert table["conv1/relu:0"].amax == 0.25 * 127 and table["(Unnamed Layer* 5) [Shuffle]_output"].amax == \
        float(np.float32(0.05)) * 127
    assert table["small"].amax == struct.unpack(">f", bytes.fromhex("00800000"))[0] * 127  # the smallest normal
    assert read_trt_cache(path) == table


@pytest.mark.parametrize("text, line, match", [
    ("TRT-8601\ninput: 3c010a14\n", 1, "header"),
    ("# a comment\ninput: 3c010a14\n", 1, "not a scale file|header"),
    ("TRT-8601-EntropyCalibration2\ninput: 3c010a14\nconv_out 3d4ccccd\n", 3, "<tensor name>: <8 hex digits>"),
    ("TRT-8601-EntropyCalibration2\ninput: 0x3c010a14\n", 2, "<tensor name>: <8 hex digits>"),
    ("TRT-8601-EntropyCalibration2\ninput: 3c010a14ff\n", 2, "<tensor name>: <8 hex digits>"),
    ("TRT-8601-EntropyCalibration2\ninput: 7fc00000\n", 2, "finite and positive"),
    ("TRT-8601-EntropyCalibration2\ninput: bc010a14\n", 2, "finite and positive"),
    ("TRT-8601-EntropyCalibration2\ninput: 00000000\n", 2, "finite and positive"),  # issue 16: zero,
    ("TRT-8601-EntropyCalibration2\ninput: 1\n", 2, "finite and positive"),  # subnormal
    ("TRT-8601-EntropyCalibration2\ninput: 80000000\n", 2, "finite and positive"),  # and negative zero
    ("TRT-8601-EntropyCalibration2\na: 3c010a14\nb: 3c010a14\na: 3c010a14\n", 4, "listed twice"),
])
def test_malformed_cache_names_file_and_line(tmp_path, text, line, match):
    path = tmp_path / "bad.cache"
    path.write_text(text)
    reader = read_trt_cache if text.startswith("TRT-") else read_scales
    with pytest.raises(TrtBridgeError, match=match) as err:
        reader(path)
    if text.startswith("TRT-"):
        assert f"{path}:{line}:" in str(err.value)
    else:
        assert str(path) in str(err.value)


def test_cache_writer_refuses_what_readers_would_misparse(tmp_path):
    with pytest.raises(TrtBridgeError, match="': '"):
        write_trt_cache(ScaleTable.of([ScaleEntry("a: b", 1.0)]), tmp_path / "c.cache")
    with pytest.raises(TrtBridgeError, match="line break"):
        write_trt_cache(ScaleTable.of([ScaleEntry("a\nb", 1.0)]), tmp_path / "c.cache")
    with pytest.raises(TrtBridgeError, match="version"):
        write_trt_cache(ScaleTable(), tmp_path / "c.cache", version="10.3")
    with pytest.raises(TrtBridgeError, match="algorithm"):
        write_trt_cache(ScaleTable(), tmp_path / "c.cache", algorithm="Entropy Calibration")
    with pytest.raises(TrtBridgeError, match="beyond float32.s range"):  # refused as soon as it is read
        write_trt_cache(ScaleTable.of([ScaleEntry("big", 1e300)]), tmp_path / "c.cache")
    assert not (tmp_path / "c.cache").exists()


# ---------------------------------------------------------------- trt-bridge JSON


def test_json_round_trip_with_per_channel(tmp_path):
    table = ScaleTable.of([
        ScaleEntry("x", float(AWKWARD[3]) * 127, source="calibration"),
        ScaleEntry("conv.weight", tuple(float(s) * 127 for s in AWKWARD[:4]), 0, "weight", "model"),
        ScaleEntry("fc.weight", (0.1, 1e-30, 12345.678), 1, "weight"), ScaleEntry("gemm.weight", 0.7, kind="weight"),
    ])
    path = write_json(table, tmp_path / "scales.json")
    doc = json.loads(path.read_text())
    assert doc["format"] == "trt-bridge-scales" and doc["version"] == 1
    assert doc["tensors"]["conv.weight"] == {"amax": [float(s) * 127 for s in AWKWARD[:4]], "axis": 0,
                                             "kind": "weight", "source": "model"}
    assert doc["tensors"]["x"]["axis"] is None
    back = read_json(path)
    assert read_scales(path) == back and list(back) == list(table)
    for name, entry in table.entries.items():
        got = back[name]
        assert (got.amax, got.axis, got.kind) == (entry.amax, entry.axis, entry.kind)
        assert got.source == "json:scales.json"
    write_json(back, tmp_path / "again.json")
    assert read_json(tmp_path / "again.json") == ScaleTable(
        {k: ScaleEntry(k, e.amax, e.axis, e.kind, "json:again.json") for k, e in back.entries.items()})


def test_json_minimal_entries_and_errors(tmp_path):
    path = tmp_path / "s.json"
    path.write_text('{"format": "trt-bridge-scales", "version": 1, "tensors": {"x": {"amax": 2}}}')
    assert read_scales(path)["x"] == ScaleEntry("x", 2.0, None, "activation", "json:s.json")
    for doc, match in [
        ({"format": "trt-bridge-scales", "version": 2, "tensors": {}}, "version 2"),
        ({"format": "other", "version": 1, "tensors": {}}, "not a trt-bridge scale file"),
        ({"format": "trt-bridge-scales", "version": 1, "tensors": []}, "must be an object"),
        ({"format": "trt-bridge-scales", "version": 1, "tensors": {"x": {"scale": 1}}}, "\"amax\""),
        ({"format": "trt-bridge-scales", "version": 1, "tensors": {"x": {"amax": 1, "axs": 0}}}, "unknown field"),
        ({"format": "trt-bridge-scales", "version": 1, "tensors": {"x": {"amax": [1, 2]}}}, "per tensor"),
        ({"format": "trt-bridge-scales", "version": 1, "tensors": {"x": {"amax": -1}}}, "'x'.*finite positive"),
            ({"format": "trt-bridge-scales", "version": 1, "tensors": {"x": {"amax": 0}}}, "'x'.*finite positive"),
    ]:
        path.write_text(json.dumps(doc))
        with pytest.raises(TrtBridgeError, match=match) as err:
            read_json(path)
        assert str(path) in str(err.value)
    path.write_text('{"format": "trt-bridge-scales",\n "version": 1,\n "tensors": {,}}')
    with pytest.raises(TrtBridgeError, match=f"{path}:3: not valid JSON"):
        read_scales(path)


def test_unknown_and_missing_files(tmp_path):
    with pytest.raises(TrtBridgeError, match="no such file"):
        read_scales(tmp_path / "nope.cache")
    (tmp_path / "empty.cache").write_text("\n")
    with pytest.raises(TrtBridgeError, match="empty"):
        read_scales(tmp_path / "empty.cache")
    (tmp_path / "x.txt").write_text("hello world, this is no scale file\n")
    with pytest.raises(TrtBridgeError, match="not a scale file"):
        read_scales(tmp_path / "x.txt")
    (tmp_path / "junk.bin").write_bytes(bytes(range(200, 256)) * 3)
    with pytest.raises(TrtBridgeError, match="junk.bin"):
        read_scales(tmp_path / "junk.bin")


# ---------------------------------------------------------------- onnxruntime calibration tables


class _Reader:
    def __init__(self, feeds):
        self._feeds = iter(feeds)

    def get_next(self):
        return next(self._feeds, None)


def test_onnxruntime_calibration_table(tmp_path):
    from onnxruntime.quantization.calibrate import CalibrationMethod, create_calibrator
    from onnxruntime.quantization.quant_utils import write_calibration_table

    src = save(samples.conv_net(), tmp_path / "float.onnx")
    calibrator = create_calibrator(src, augmented_model_path=str(tmp_path / "augmented.onnx"),
                                   calibrate_method=CalibrationMethod.MinMax)
    calibrator.collect_data(_Reader({"x": f} for f in samples.image_feeds(4, seed=1)))
    ranges = calibrator.compute_data()
    write_calibration_table(ranges, dir=str(tmp_path))

    expected = {name: tuple(np.asarray(v, np.float64).item() for v in ranges[name].range_value) for name in ranges}
    assert {"x", "c1", "r1", "logits"} <= set(expected)
    table = read_ort_table(tmp_path / "calibration.json")
    assert read_scales(tmp_path / "calibration.json") == table and set(table) == set(expected)
    for name, (lo, hi) in expected.items():
        assert table[name].amax == max(abs(lo), abs(hi)) and table[name].source == "ort-table:calibration.json"
    assert any(abs(lo) > abs(hi) for lo, hi in expected.values())  # the symmetric range is not just the max
    # the text and flatbuffers tables hold max(highest, lowest): the range onnxruntime's TensorRT EP uses
    for name in ("calibration.cache", "calibration.flatbuffers"):
        other = read_scales(tmp_path / name)
        assert read_ort_table(tmp_path / name) == other and set(other) == set(expected)
        for tensor, (lo, hi) in expected.items():
            assert other[tensor].amax == abs(max(lo, hi)), (name, tensor)


def test_onnxruntime_older_and_saved_layouts(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"x": [-3.5, 2.0], "y": [0.0, 1.25]}))
    table = read_scales(path)
    assert table["x"].amax == 3.5 and table["y"].amax == 1.25 and table["x"].source == "ort-table:old.json"
    path.write_text(json.dumps({"CLS": "TensorsData", "calibration_method": {"CLS": "CalibrationMethod"},
                                "smooth_quant": False, "data": {"x": {"CLS": "TensorData", "lowest": -1.5,
                                                                       "highest": {"CLS": "numpy.array",
                                                                                   "data": 0.5,
                                                                                   "dtype": "float32"}}}}))
    assert read_ort_table(path)["x"].amax == 1.5
    path.write_text(json.dumps({"x": {"avg": 1.0, "std": 0.5}}))
    with pytest.raises(TrtBridgeError, match="lowest"):
        read_scales(path)
    path.write_text(json.dumps({"x": {"lowest": [-1.0, -2.0], "highest": [1.0, 2.0]}}))
    with pytest.raises(TrtBridgeError, match="per-channel"):
        read_scales(path)
    text = tmp_path / "calibration.cache"
    text.write_text("x 2.5\ny -0.5\nbad line here\n")
    with pytest.raises(TrtBridgeError, match=f"{text}:3:"):
        read_scales(text)


# ---------------------------------------------------------------- a converted model's scales


def test_scales_of_converted_model(tmp_path, converted):
    model, report = converted
    inits = _initializers(model)
    table = scales_of_model(model)
    quantized = {q["tensor"]: q for q in report.quantized}
    assert set(table) == set(quantized) == {"x", "r1_padded", "r2_padded", "conv1.weight", "conv2.weight",
                                            "conv3.weight"}
    for name, q in quantized.items():
        entry = table[name]
        assert entry.kind == q["kind"] and entry.axis == q["axis"] and entry.source == "model"
        stored = inits[f"{name}_scale"]
        assert np.array_equal(np.asarray(entry.scale, np.float32), stored)  # amax / 127 gives the stored bits
    assert len(table["conv2.weight"].amax) == 32

    cache = write_trt_cache(table, tmp_path / "model.cache")
    lines = dict(line.split(": ") for line in cache.read_text().splitlines()[1:])
    assert set(lines) == {"x", "r1_padded", "r2_padded"}
    for name, bits in lines.items():
        assert bits == inits[f"{name}_scale"].astype(">f4").tobytes().hex()
    back = read_trt_cache(cache)
    assert {k: e.amax for k, e in back.entries.items()} == {k: e.amax for k, e in table.activations().entries.items()}
    write_json(table, tmp_path / "model.json")
    assert {k: (e.amax, e.axis, e.kind) for k, e in read_json(tmp_path / "model.json").entries.items()} == \
        {k: (e.amax, e.axis, e.kind) for k, e in table.entries.items()}


def test_scales_of_model_rejects_asymmetric():
    model = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[4] x) => (float[4] y) <float s = {0.5}, uint8 z = {128}> {
            q = QuantizeLinear(x, s, z)
            y = DequantizeLinear(q, s, z)
        }""")
    with pytest.raises(TrtBridgeError, match="not symmetric int8"):
        scales_of_model(model)


# ---------------------------------------------------------------- fixed point


def test_quantize_multiplier_bounds_and_error():
    rng = np.random.default_rng(0)
    values = list(10.0 ** rng.uniform(-9, 5, 2000)) + [1.0, 0.5, 2.0, 1 - 2 ** -40, 2 ** -40, 3.0e9, 0.99999999999]
    for m in values:
        m0, n = quantize_multiplier(m)
        assert isinstance(m0, int) and isinstance(n, int) and 2 ** 30 <= m0 < 2 ** 31
        assert abs(multiplier_value(m0, n) - m) / m < 2 ** -30
        assert (n < 0) == (m >= 1) or multiplier_value(m0, n) == 1.0
    assert quantize_multiplier(0.5) == (2 ** 30, 0) and quantize_multiplier(1.0) == (2 ** 30, -1)
    assert quantize_multiplier(1 - 2 ** -40) == (2 ** 30, -1)  # rounds up to 1.0: M0 renormalised
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(TrtBridgeError, match="positive and finite"):
            quantize_multiplier(bad)


def test_requantize_matches_float_rounding():
    rng = np.random.default_rng(1)
    acc = rng.integers(-2 ** 31, 2 ** 31, 5000, dtype=np.int64).astype(np.int32)
    for real in (1e-6, 3.7e-4, 0.0123, 0.5, 0.999, 1.0, 1.7, 300.0):
        m0, n = quantize_multiplier(real)
        got = requantize(acc, m0, n).astype(np.float64)
        want = np.rint(acc.astype(np.float64) * real)
        assert np.max(np.abs(got - want)) <= 1, real
        # the exact reference: (acc * M0) >> (31 + n) with rounding, in Python integers
        exact = [(int(a) * m0 + (1 << (30 + n))) >> (31 + n) if 31 + n > 0 else (int(a) * m0) << -(31 + n)
                 for a in acc[:50]]
        assert got[:50].tolist() == exact


def test_requantization_table_of_converted_model(tmp_path, converted):
    model, _ = converted
    inits = _initializers(model)
    rows = {r.node: r for r in requantization_table(model)}
    # conv3 feeds GlobalAveragePool and fc is left in float: neither is requantized
    assert set(rows) == {"conv1", "conv2"}
    conv1, conv2 = rows["conv1"], rows["conv2"]
    assert conv1.output == "r1_padded" and conv2.output == "r2_padded" and conv1.op == "Conv"
    assert conv1.s_in == float(inits["x_scale"]) and conv1.s_out == float(inits["r1_padded_scale"])
    assert conv1.s_w == tuple(float(s) for s in inits["conv1.weight_scale"]) and len(conv2.multiplier) == 32
    for row in rows.values():
        assert row.error < 2 ** -30
        for s_w, real, m0, n in zip(row.s_w, row.real, row.multiplier, row.shift):
            assert real == row.s_in * s_w / row.s_out and 2 ** 30 <= m0 < 2 ** 31
            assert abs(multiplier_value(m0, n) - real) / real <= row.error

    # float computation on random data: the int8 layer's accumulators requantized in integers agree with
    # round(acc · s_in · s_w / s_out) computed in float, to 1 LSB
    rng = np.random.default_rng(2)
    w_q = inits["conv2.weight_int8"].reshape(32, -1).astype(np.int64)
    x_q = rng.integers(-127, 128, (w_q.shape[1], 64))
    acc = w_q @ x_q  # [out channels, positions]
    for c in range(32):
        got = requantize(acc[c], conv2.multiplier[c], conv2.shift[c]).astype(np.float64)
        want = np.rint(acc[c] * (conv2.s_in * conv2.s_w[c]) / conv2.s_out)
        assert np.max(np.abs(got - want)) <= 1

    path = write_fixed_point(list(rows.values()), tmp_path / "fp.json")
    doc = json.loads(path.read_text())
    assert doc["format"] == "trt-bridge-fixed-point" and "31 + shift" in doc["convention"]
    assert [layer["node"] for layer in doc["layers"]] == list(rows)
    assert doc["layers"][1]["multiplier"] == list(conv2.multiplier) and doc["layers"][1]["error"] == conv2.error
    lines = list(csv.DictReader(write_fixed_point(list(rows.values()), tmp_path / "fp.csv").open()))
    assert len(lines) == 16 + 32 and lines[0]["node"] == "conv1" and lines[0]["channel"] == "0"
    assert int(lines[16]["multiplier"]) == conv2.multiplier[0] and float(lines[16]["real"]) == conv2.real[0]


def test_requantization_per_tensor_and_gemm_alpha():
    """A Gemm with per-tensor weights, a bias, a Relu, then the next Q."""
    model = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2, 16] x) => (float[2, 8] y)
          <float sx = {0.02}, int8 z = {0}, int8[16, 8] wq = {""" + ", ".join(["3"] * 128) + """},
           float sw = {0.004}, float[8] b = {1, 1, 1, 1, 1, 1, 1, 1}, float so = {0.05}> {
            xq = QuantizeLinear(x, sx, z)
            xd = DequantizeLinear(xq, sx, z)
            wd = DequantizeLinear(wq, sw, z)
            g = Gemm<alpha: float = 0.5>(xd, wd, b)
            r = Relu(g)
            yq = QuantizeLinear(r, so, z)
            y = DequantizeLinear(yq, so, z)
        }""")
    (row,) = requantization_table(model)
    s = [float(np.float32(v)) for v in (0.02, 0.004, 0.05)]
    assert row.op == "Gemm" and row.s_w == s[1]
    assert isinstance(row.multiplier, int) and row.real == s[0] * s[1] * 0.5 / s[2] and row.output == "r"
    assert scales_of_model(model)["wq"].kind == "weight"  # no _int8 suffix: the initializer's own name


# ---------------------------------------------------------------- ModelOpt _amax state dicts


def test_modelopt_amax_npz_on_transformer_block(tmp_path):
    model = samples.transformer_block()  # nodes 'layer0.attn.q/MatMul', ..., 'layer0/scores', 'layer0/context'
    hidden, ffn = 64, 256
    rng = np.random.default_rng(0)
    q_w = rng.uniform(0.1, 1.0, (hidden, 1)).astype(np.float32)  # a Linear's [out, in] weight: amax [out, 1]
    state = {
        "layer0.attn.q.input_quantizer._amax": np.array(2.5, np.float32),
        "layer0.attn.k.input_quantizer._amax": np.array(3.0, np.float32),  # same tensor as q's: the larger wins
        "layer0.attn.q.weight_quantizer._amax": q_w,
        "layer0.ffn.up.weight_quantizer._amax": np.full((ffn, 1), 0.5, np.float32),
        "layer0.ffn.down.weight_quantizer._amax": np.array(0.75, np.float32),
        "model.layer0.attn.out.input_quantizer._amax": np.array([4.0], np.float32),  # an extra wrapper prefix
        "layer0.input_quantizer._amax": np.array(1.0, np.float32),  # scores and context: different inputs
        "layer0.attn.q.output_quantizer._amax": np.array(1.0, np.float32),
        "layer0.attn.nope.input_quantizer._amax": np.array(1.0, np.float32),
        "layer0.attn.v.weight_quantizer._amax": np.ones((32, 1), np.float32),  # 64 output channels
        "layer0.attn.q.weight": rng.standard_normal((hidden, hidden)).astype(np.float32),
        "layer0.attn.q.input_quantizer._pre_quant_scale": np.ones(hidden, np.float32),
    }
    np.savez(tmp_path / "amax.npz", **state)
    table, report = read_modelopt_amax(tmp_path / "amax.npz", model)

    matched = {m["key"]: m for m in report["matched"]}
    assert matched["layer0.attn.q.input_quantizer._amax"]["tensor"] == "layer0.ln1.out"
    assert matched["layer0.attn.q.input_quantizer._amax"]["nodes"] == ["layer0.attn.q/MatMul"]
    assert matched["model.layer0.attn.out.input_quantizer._amax"]["tensor"] == "layer0.ctx.m"
    assert matched["layer0.ffn.down.weight_quantizer._amax"]["tensor"] == "layer0.ffn.down.weight"
    assert len(matched) == 6
    assert [a["key"] for a in report["ambiguous"]] == ["layer0.input_quantizer._amax"]
    assert set(report["ambiguous"][0]["candidates"]) == {"layer0/scores", "layer0/context"}
    unmatched = {u["key"]: u["reason"] for u in report["unmatched"]}
    assert set(unmatched) == {"layer0.attn.q.output_quantizer._amax", "layer0.attn.nope.input_quantizer._amax",
                              "layer0.attn.v.weight_quantizer._amax"}
    assert "output_quantizer" in unmatched["layer0.attn.q.output_quantizer._amax"]
    assert "layer0.attn.nope" in unmatched["layer0.attn.nope.input_quantizer._amax"]
    assert "axis 1" in unmatched["layer0.attn.v.weight_quantizer._amax"]
    assert report["shared"] == [{"tensor": "layer0.ln1.out", "keys": ["layer0.attn.k.input_quantizer._amax",
                                                                      "layer0.attn.q.input_quantizer._amax"]}]
    assert report["ignored"] == 2

    assert table["layer0.ln1.out"] == ScaleEntry("layer0.ln1.out", 3.0, None, "activation", "modelopt:amax.npz")
    q = table["layer0.attn.q.weight"]
    assert q.kind == "weight" and q.axis == 1 and q.amax == tuple(float(v) for v in q_w.ravel())
    assert table["layer0.ffn.up.weight"].axis == 1 and len(table["layer0.ffn.up.weight"].amax) == ffn
    assert table["layer0.ffn.down.weight"].amax == 0.75 and table["layer0.ffn.down.weight"].axis is None
    assert table["layer0.ctx.m"].amax == 4.0
    assert set(table) == {"layer0.ln1.out", "layer0.attn.q.weight", "layer0.ffn.up.weight",
                          "layer0.ffn.down.weight", "layer0.ctx.m"}


def test_modelopt_amax_on_converted_model_goes_through_qdq(tmp_path, converted):
    model, _ = converted
    np.savez(tmp_path / "ckpt.npz", **{"conv2.input_quantizer._amax": np.array(5.0, np.float32),
                                       "conv1.weight_quantizer._amax": np.full((16, 1, 1, 1), 0.3, np.float32)})
    table, report = read_modelopt_amax(tmp_path / "ckpt.npz", model)
    assert not report["unmatched"] and not report["ambiguous"]
    assert table["r1_padded"].amax == 5.0 and table["conv1.weight"].axis == 0
    assert table["conv1.weight"].amax == (float(np.float32(0.3)),) * 16


def _write_safetensors(path, tensors: dict[str, np.ndarray]) -> None:
    """The safetensors layout: u64 header size, JSON header {name: dtype, shape, data_offsets}, raw data."""
    header, blobs, offset = {}, [], 0
    for name, arr in tensors.items():
        data = np.ascontiguousarray(arr, "<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def test_modelopt_safetensors_and_torch_checkpoints(tmp_path):
    model = samples.conv_net()
    path = tmp_path / "amax.safetensors"
    _write_safetensors(path, {"conv2.input_quantizer._amax": np.array(2.0, np.float32)})
    try:
        import safetensors  # noqa: F401
    except ImportError:
        with pytest.raises(MissingDependencyError, match="pip install safetensors"):
            read_modelopt_amax(path, model)
    else:
        table, report = read_modelopt_amax(path, model)
        assert table["r1"].amax == 2.0 and report["matched"][0]["tensor"] == "r1"
    try:
        import torch  # noqa: F401
    except ImportError:
        (tmp_path / "ckpt.pth").write_bytes(b"not used")
        with pytest.raises(MissingDependencyError, match="np.savez"):
            read_modelopt_amax(tmp_path / "ckpt.pth", model)
    (tmp_path / "x.onnx").write_bytes(b"x")
    with pytest.raises(TrtBridgeError, match="unknown checkpoint type"):
        read_modelopt_amax(tmp_path / "x.onnx", model)
    with pytest.raises(TrtBridgeError, match="no such file"):
        read_modelopt_amax(tmp_path / "missing.npz", model)
