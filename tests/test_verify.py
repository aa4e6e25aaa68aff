"""``trt-bridge verify``: metrics against an independent onnxruntime computation, gates and exit status,
saved and loaded outputs, per-layer localization of a deliberately broken scale, the HTML report."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from helpers import assert_tensorrt_ready, quantize_dynamic, run_ort, save, snr_db
from onnx import numpy_helper
from test_cli import cli

from trt_bridge import samples
from trt_bridge.conversion import convert
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions
from trt_bridge.runtime.session import session
from trt_bridge.verification import VerifyOptions, verify
from trt_bridge.verification.gates import Gate

FEEDS = 12


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A float conv net, its dynamic quantization converted by trt-bridge, and evaluation feeds."""
    root = tmp_path_factory.mktemp("verify")
    fpath = save(samples.conv_net(), root / "float.onnx")
    dyn = quantize_dynamic(fpath, root / "dynamic.onnx")
    np.savez(root / "calib.npz", x=samples.image_feeds(16, 1))
    np.savez(root / "eval.npz", x=samples.image_feeds(FEEDS, 2))
    out = root / "int8.onnx"
    convert(dyn, out, ConvertOptions(calibration=CalibrationOptions(data=str(root / "calib.npz")), progress=False,
                                     check=False))
    assert_tensorrt_ready(out)
    return {"root": root, "float": fpath, "dynamic": dyn, "int8": out, "eval": root / "eval.npz"}


def _independent(reference, candidate, feeds):
    ref = [session(reference, simulate_qdq=True).run(None, {"x": f})[0] for f in feeds]
    cand = [session(candidate, simulate_qdq=True).run(None, {"x": f})[0] for f in feeds]
    return ref, cand


def test_metrics_match_an_independent_onnxruntime_computation(pair):
    report = verify(pair["float"], pair["int8"], VerifyOptions(data=str(pair["eval"]), progress=False))
    [m] = report.outputs
    ref, cand = _independent(pair["float"], pair["int8"], samples.image_feeds(FEEDS, 2))
    r = np.concatenate([a.ravel() for a in ref]).astype(np.float64)
    c = np.concatenate([a.ravel() for a in cand]).astype(np.float64)
    assert m.output == "logits" and m.runner == "candidate" and report.feeds == FEEDS
    assert m.snr_db == pytest.approx(snr_db(ref, cand), abs=1e-9)
    assert m.cosine == pytest.approx(float(r @ c / np.linalg.norm(r) / np.linalg.norm(c)), abs=1e-9)
    assert m.max_abs == pytest.approx(float(np.max(np.abs(r - c))), rel=1e-9)
    assert m.mean_abs == pytest.approx(float(np.mean(np.abs(r - c))), rel=1e-9)
    assert m.rel_error == pytest.approx(float(np.linalg.norm(r - c) / np.linalg.norm(r)), rel=1e-9)
    agree = np.mean([a.argmax() == b.argmax() for a, b in zip(ref, cand)])
    assert m.top1 == pytest.approx(agree) and m.k == 5 and m.topk >= m.top1
    assert 30 < m.snr_db < 50 and report.passed


def test_identical_models_have_infinite_snr(pair):
    report = verify(pair["float"], pair["float"], VerifyOptions(random=3, seed=7, progress=False,
                                                                gates=(Gate("snr_db", 200.0),)))
    [m] = report.outputs
    assert m.snr_db == float("inf") and m.max_abs == 0.0 and m.cosine == pytest.approx(1.0) and report.passed
    assert json.loads(report.to_json())["outputs"][0]["snr_db"] == "inf"  # strict JSON has no Infinity


def test_cli_gates_and_exit_status(pair):
    args = ("verify", pair["float"], pair["int8"], "--data", pair["eval"])
    passing = cli(*args, "--min-snr", "25", "--min-cosine", "0.99")
    assert passing.returncode == 0, passing.stderr
    assert "candidate 'logits': SNR " in passing.stdout and passing.stdout.rstrip().splitlines()[-1].startswith(
        "  PASS")
    failing = cli(*args, "--min-snr", "25", "--min-snr", "logits=80", "--max-abs", "1e-9", "-q")
    assert failing.returncode == 1
    [line] = failing.stdout.splitlines()
    assert line.startswith("candidate 'logits': SNR ") and "FAIL (snr_db " in line and "< --min-snr 80" in line
    assert "max_abs " in line and "> --max-abs 1e-09" in line
    unknown = cli(*args, "--min-snr", "probs=30")
    assert unknown.returncode == 2 and "a gate names output 'probs', which the model does not have" in unknown.stderr
    bad = cli(*args, "--min-cosine", "high")
    assert bad.returncode == 2 and "--min-cosine 'high': expected VALUE or OUTPUT=VALUE" in bad.stderr
    as_json = cli(*args, "--json")
    assert as_json.returncode == 0
    data = json.loads(as_json.stdout)  # nothing but the report on stdout (Polygraphy's log is kept quiet)
    assert data["passed"] is True and data["outputs"][0]["output"] == "logits"


def test_saved_outputs_and_inputs_round_trip(pair, tmp_path):
    outputs, inputs = tmp_path / "outputs.json", tmp_path / "inputs.json"
    first = verify(pair["float"], pair["int8"], VerifyOptions(random=5, seed=3, save_outputs=str(outputs),
                                                              save_inputs=str(inputs), progress=False))
    from polygraphy.comparator import RunResults

    saved = RunResults.load(str(outputs))
    assert list(saved.keys()) == ["reference", "candidate"] and len(saved["reference"]) == 5
    # On another machine: the reference's outputs and the inputs loaded; the candidate runs again
    again = verify(pair["float"], pair["int8"], VerifyOptions(load_outputs=str(outputs), load_inputs=str(inputs),
                                                              progress=False))
    assert again.outputs[0].snr_db == pytest.approx(first.outputs[0].snr_db, abs=1e-9)
    assert again.feeds == 5
    # A rebuilt candidate is measured anew, not taken from the file: the float model against itself is exact
    itself = verify(pair["float"], pair["float"], VerifyOptions(load_outputs=str(outputs), load_inputs=str(inputs),
                                                                progress=False))
    assert itself.outputs[0].snr_db == float("inf")
    mismatch = cli("verify", pair["float"], pair["int8"], "--load-outputs", outputs, "--random", "2")
    assert mismatch.returncode == 2
    assert "holds outputs of 5 feed(s) but 2 feed(s) are given: load the inputs they were made from" in \
        mismatch.stderr


def _break_one_scale(src, dst, consumer: str, factor: float) -> str:
    """Divide the scale of the activation Q/DQ that feeds ``consumer`` by ``factor``: it clips."""
    model = onnx.load(str(src))
    producer = {o: n for n in model.graph.node for o in n.output}
    node = next(n for n in model.graph.node if n.name == consumer)
    dq = next(producer[i] for i in node.input if i in producer and producer[i].op_type == "DequantizeLinear"
              and producer.get(producer[i].input[0]) is not None
              and producer[producer[i].input[0]].op_type == "QuantizeLinear")
    q = producer[dq.input[0]]
    inits = {i.name: i for i in model.graph.initializer}
    for name in {q.input[1], dq.input[1]}:
        scale = numpy_helper.to_array(inits[name]) / factor
        inits[name].CopyFrom(numpy_helper.from_array(scale.astype(np.float32), name))
    onnx.save(model, str(dst))
    return node.name


def test_per_layer_puts_a_broken_scale_first(pair, tmp_path):
    broken = tmp_path / "broken.onnx"
    name = _break_one_scale(pair["int8"], broken, "conv2_quant/float", 25.0)
    options = VerifyOptions(data=str(pair["eval"]), per_layer=True, progress=False)
    report = verify(pair["float"], broken, options)
    loc = report.per_layer
    assert loc.layers[0].node == name, [(la.node, la.isolated_db, la.added_db) for la in loc.layers]
    assert loc.layers[0].isolated_db < loc.layers[1].isolated_db - 10  # ranked by the error it makes on its own
    others = [la.added_db for la in loc.layers[1:] if la.added_db is not None]
    assert loc.layers[0].added_db < min(others) - 10  # and by the error it adds
    assert loc.suggestion == [name] and loc.exclude_nodes() == r"^(conv2_quant/float)$"
    healthy = verify(pair["float"], pair["int8"], options).per_layer
    assert {la.node for la in healthy.layers} == {la.node for la in loc.layers}
    assert report.outputs[0].snr_db < healthy.layers[0].snr_out_db  # the break shows in the output too
    # bounded batches: two tensors per session give the same numbers as one batch for all
    small = verify(pair["float"], broken, VerifyOptions(data=str(pair["eval"]), per_layer=True, layer_batch=2,
                                                        progress=False)).per_layer
    assert small.batches >= len(loc.tensors) // 2 and loc.batches == 1
    assert [t.tensor for t in small.tensors] == [t.tensor for t in loc.tensors]
    assert [t.snr_db for t in small.tensors] == pytest.approx([t.snr_db for t in loc.tensors])


def test_per_layer_against_the_original_dynamic_model(pair):
    """The reference may be the source quantized model: tensors are aligned by name all the same."""
    report = verify(pair["dynamic"], pair["int8"], VerifyOptions(data=str(pair["eval"]), per_layer=True,
                                                                 progress=False))
    assert len(report.per_layer.layers) == 4 and len(report.per_layer.tensors) >= 8


def test_html_report_has_the_table_and_the_plot(pair, tmp_path):
    html_path, json_path = tmp_path / "report.html", tmp_path / "report.json"
    result = cli("verify", pair["float"], pair["int8"], "--data", pair["eval"], "--per-layer", "--html", html_path,
                 "--json", json_path, "-q")
    assert result.returncode == 0, result.stderr
    page = html_path.read_text()
    assert page.startswith("<!DOCTYPE html>") and "<table id=outputs>" in page and "<table id=layers>" in page
    assert "<figure id=plot><svg" in page and "SNR per layer along the graph" in page
    assert "<script" not in page and "<link" not in page and "src=" not in page  # self-contained: nothing fetched
    assert "--exclude-nodes" in page
    again = tmp_path / "again.html"
    cli("verify", pair["float"], pair["int8"], "--data", pair["eval"], "--per-layer", "--html", again, "-q")
    assert again.read_text() == page  # same inputs, same page
    assert json.loads(json_path.read_text())["per_layer"]["exclude_nodes"].startswith("^(")


def test_engine_without_a_gpu_is_a_clear_error(pair, tmp_path):
    engine = tmp_path / "model.engine"
    engine.write_bytes(b"not an engine")
    result = cli("verify", pair["float"], pair["int8"], "--engine", engine, "--random", "2")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "needs an NVIDIA GPU" in result.stderr and "--save-outputs" in result.stderr


def test_feeds_are_validated_against_the_model(pair, tmp_path):
    np.savez(tmp_path / "bad.npz", x=np.zeros((2, 1, 3, 16, 16), np.float32))
    result = cli("verify", pair["float"], pair["int8"], "--data", tmp_path / "bad.npz")
    assert result.returncode == 2
    assert "input 'x' expects shape" in result.stderr and "dimension 2 is 16" in result.stderr


def test_the_suggestion_is_what_convert_exclude_nodes_takes(pair, tmp_path):
    """The regex verify prints keeps exactly those nodes' inputs in float when given back to convert."""
    loc = verify(pair["float"], pair["int8"], VerifyOptions(data=str(pair["eval"]), per_layer=True,
                                                            progress=False)).per_layer
    assert loc.suggestion
    out = tmp_path / "kept.onnx"
    result = cli("convert", pair["dynamic"], "-o", out, "--calib-data", pair["root"] / "calib.npz",
                 "--exclude-nodes", loc.exclude_nodes(), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    excluded = {x["node"] for x in report["left_in_float"] if "--exclude-nodes" in x["reason"]}
    assert excluded == set(loc.suggestion)
    quantized_consumers = {c for q in report["quantized"] for c in q["consumers"]}
    assert not quantized_consumers & set(loc.suggestion)
    held_out = [{"x": f} for f in samples.image_feeds(8, 3)]
    assert snr_db(run_ort(pair["float"], held_out), run_ort(out, held_out)) > 35  # measured 38.3 dB
    assert_tensorrt_ready(out)


def _model(nodes, inputs, outputs, inits=()):
    from onnx import helper

    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_non_finite_outputs_give_strict_json_and_fail_gates(tmp_path):
    """A zero reference (SNR -inf) and a NaN-producing log: valid JSON, NaN metrics fail every gate, the HTML
    plot still renders."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])
    zero = save(_model([helper.make_node("Mul", ["x", "z"], ["y"], "mul")], [x], [y],
                       [numpy_helper.from_array(np.zeros((), np.float32), "z")]), tmp_path / "zero.onnx")
    ident = save(_model([helper.make_node("Identity", ["x"], ["y"], "id")], [x], [y]), tmp_path / "ident.onnx")
    log = save(_model([helper.make_node("Log", ["x"], ["y"], "log")], [x], [y]), tmp_path / "log.onnx")
    log2 = save(_model([helper.make_node("Log", ["x"], ["l"], "log"),
                        helper.make_node("Mul", ["l", "k"], ["y"], "mul")], [x], [y],
                       [numpy_helper.from_array(np.array(1.1, np.float32), "k")]), tmp_path / "log2.onnx")
    result = cli("verify", zero, ident, "--random", "2", "--json", "--per-layer", "--html", tmp_path / "z.html")
    data = json.loads(result.stdout, parse_constant=lambda c: pytest.fail(f"non-standard JSON token {c}"))
    assert data["outputs"][0]["snr_db"] == "-inf" and data["outputs"][0]["rel_error"] == "inf"
    assert "<svg" in (tmp_path / "z.html").read_text()
    nan = cli("verify", log, log2, "--random", "2", "--max-abs", "0.5", "-q")
    assert nan.returncode == 1 and "max |err| nan" in nan.stdout and "FAIL" in nan.stdout


def test_unreadable_inputs_are_errors_not_tracebacks(pair, tmp_path):
    garbage = tmp_path / "garbage.onnx"
    garbage.write_text("not a model")
    for args, expected in (
            ((garbage, pair["int8"]), "not a readable ONNX model"),
            ((pair["float"], pair["int8"], "--load-outputs", tmp_path / "missing.json"), "cannot read saved outputs"),
            ((pair["float"], pair["int8"], "--load-inputs", garbage), "cannot read saved inputs"),
            ((pair["float"], pair["int8"], "--data", pair["eval"], "--random", "2"), "give one source of feeds"),
            ((pair["float"], pair["int8"], "--min-snr", "nan"), "with a finite number")):
        result = cli("verify", *args)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert expected in result.stderr, result.stderr


def test_per_layer_without_value_info_and_with_odd_names(tmp_path):
    """A float model with no value_info and an intermediate named like a glob pattern ('h[0]'): aligned and
    ranked all the same."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    model = _model(
        [helper.make_node("MatMul", ["x", "W1"], ["h[0]"], "fc1"), helper.make_node("Relu", ["h[0]"], ["r"], "relu"),
         helper.make_node("MatMul", ["r", "W2"], ["y"], "fc2")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])],
        [numpy_helper.from_array(rng.standard_normal((32, 32)).astype(np.float32), "W1"),
         numpy_helper.from_array(rng.standard_normal((32, 16)).astype(np.float32), "W2")])
    src = save(model, tmp_path / "mlp.onnx")
    out = tmp_path / "mlp.int8.onnx"
    convert(src, out, ConvertOptions(calibration=CalibrationOptions(random=8, give_back=False), progress=False,
                                     check=False))  # every layer quantized: the per-layer report names both
    assert_tensorrt_ready(out)
    held_out = [{"x": f} for f in np.random.default_rng(1).standard_normal((8, 4, 32)).astype(np.float32)]
    assert snr_db(run_ort(src, held_out), run_ort(out, held_out)) > 34  # measured 37.9 dB
    stripped = onnx.load(str(out))
    del stripped.graph.value_info[:]
    save(stripped, out)
    result = cli("verify", src, out, "--random", "4", "--per-layer", "--json")
    assert result.returncode == 0, result.stderr
    per_layer = json.loads(result.stdout)["per_layer"]
    assert {t["tensor"] for t in per_layer["tensors"]} >= {"h[0]", "r", "y"}
    assert {la["node"] for la in per_layer["layers"]} == {"fc1", "fc2"}


#   x ─ stem ─ Relu ─┬─ branch_a ─ a ─┐
#                    └─ branch_b ─ b ─┴─ Concat 'neck_concat' ─ head0 ─ Relu ─ ... ─ head4 ─ y
#   (every Conv 32 channels, 3×3; the scale of the Q/DQ on 'a', an input of the Concat, is broken ×40)
def _detector() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    nodes, inits = [], []

    def conv(name, cin, inp, out):
        w = (rng.standard_normal((32, cin, 3, 3)) * (2.0 / (cin * 9)) ** 0.5).astype(np.float32)
        inits.extend([numpy_helper.from_array(w, f"{name}.w"),
                      numpy_helper.from_array((rng.standard_normal(32) * 0.05).astype(np.float32), f"{name}.b")])
        nodes.append(onnx.helper.make_node("Conv", [inp, f"{name}.w", f"{name}.b"], [out], name=name, pads=[1] * 4))

    conv("stem", 3, "x", "s")
    nodes.append(onnx.helper.make_node("Relu", ["s"], ["s_r"], name="stem_relu"))
    conv("branch_a", 32, "s_r", "a")
    conv("branch_b", 32, "s_r", "b")
    nodes.append(onnx.helper.make_node("Concat", ["a", "b"], ["cat"], name="neck_concat", axis=1))
    prev, cin = "cat", 64
    for i in range(5):
        conv(f"head{i}", cin, prev, f"h{i}")
        prev, cin = f"h{i}", 32
        if i < 4:
            nodes.append(onnx.helper.make_node("Relu", [prev], [f"{prev}_r"], name=f"head{i}_relu"))
            prev = f"{prev}_r"
    return _model(nodes, [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 32, 32])],
                  [onnx.helper.make_tensor_value_info(prev, onnx.TensorProto.FLOAT, [1, 32, 32, 32])], inits)


def test_per_layer_names_the_broken_point_before_the_layers_that_amplify_it(tmp_path):
    """Issue 16: ranked by the error each layer makes on its own, the Concat whose input scale is broken comes
    first, far ahead of the head convolutions downstream that only carry (and amplify) its error."""
    src = save(_detector(), tmp_path / "det.onnx")
    np.savez(tmp_path / "calib.npz", x=np.random.default_rng(1).standard_normal((8, 1, 3, 32, 32)).astype(np.float32))
    convert(src, tmp_path / "det.int8.onnx", ConvertOptions(
        calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")), progress=False, check=False))
    model = onnx.load(str(tmp_path / "det.int8.onnx"))
    inits = {i.name: i for i in model.graph.initializer}
    q = next(n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "a")
    inits[q.input[1]].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(inits[q.input[1]]) * 40, q.input[1]))
    onnx.save(model, str(tmp_path / "broken.onnx"))
    report = verify(src, tmp_path / "broken.onnx", VerifyOptions(data=str(tmp_path / "calib.npz"), per_layer=True,
                                                                 progress=False))
    loc = report.per_layer
    ranked = [(la.node, la.isolated_db, la.added_db) for la in loc.layers]
    assert loc.layers[0].node == "neck_concat", ranked
    # measured: the Concat makes 10.5 dB on its own, every other layer 40 dB or more; the bar is 20 dB apart
    assert loc.layers[0].isolated_db < min(la.isolated_db for la in loc.layers[1:] if la.isolated_db) - 20, ranked
    assert loc.suggestion == ["neck_concat"]
    text = report.summary()
    assert "Concat 'neck_concat': makes error at" in text and "on its own; adds error at" in text


@pytest.mark.parametrize("value", [np.inf, -np.inf, np.nan])
def test_a_candidate_with_non_finite_outputs_fails_without_gates(tmp_path, value):
    """A candidate whose outputs are Inf or NaN where the reference's are finite fails (exit 1), gates or none: an
    all-Inf one ended in an internal error ("math domain error"), a NaN one passed with exit 0."""
    from onnx import TensorProto, helper

    def model(scale, name):
        graph = helper.make_graph([helper.make_node("Mul", ["x", "c"], ["y"])], "g",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                                  [numpy_helper.from_array(np.array(scale, np.float32), "c")])
        return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / name)

    reference, candidate = model(2.0, "ref.onnx"), model(value, "cand.onnx")
    report = verify(reference, candidate, VerifyOptions(random=2, seed=0, progress=False, costs=None))
    [m] = report.outputs
    assert not report.passed and m.failures == [
        "the candidate's outputs are non-finite: 8 of 8 value(s) NaN or Inf where the reference's are finite"]
    assert (m.snr_db == -np.inf) if np.isinf(value) else np.isnan(m.snr_db)
    done = cli("verify", reference, candidate, "--random", "2", "--costs", "off")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "FAIL (the candidate's outputs are non-finite" in done.stdout


def test_random_feeds_a_model_cannot_run_name_the_flags_that_give_real_ones(tmp_path):
    """A Conv over a dynamic time axis cannot run on random feeds' length 1 (openWakeWord's melspectrogram, in
    scripts/realmodels: convert --accuracy-target without --eval-data stopped on onnxruntime's message alone): the
    error says the feeds were random, and which flags give real ones; with real feeds the same pair compares."""
    from onnx import TensorProto, helper

    from trt_bridge.errors import TrtBridgeError

    weight = numpy_helper.from_array(np.ones((2, 1, 5), np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"])], "t",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, "samples"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [weight])
    model = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "conv.onnx")
    with pytest.raises(TrtBridgeError, match=r"on random feeds .*verify --data, convert --eval-data, or --shapes"):
        verify(model, model, VerifyOptions(random=2, progress=False))
    np.savez(tmp_path / "feed.npz", x=np.ones((1, 1, 16), np.float32))
    assert verify(model, model, VerifyOptions(data=str(tmp_path / "feed.npz"), progress=False)).outputs[0].snr_db \
        == float("inf")
