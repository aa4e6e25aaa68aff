"""SmoothQuant (smooth.py): exact in float, folded into LayerNormalization, and a real accuracy gain."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from helpers import (
    assert_qdq_contract,
    assert_tensorrt_ready,
    load_script,
    op_types,
    quantize_dynamic,
    run_exact,
    run_ort,
    save,
    snr_db,
)
from onnx import numpy_helper

from trt_bridge import samples
from trt_bridge.annotations import Annotations, Site, WeightSpec
from trt_bridge.calibrate.smooth import candidates, smooth
from trt_bridge.conversion import convert
from trt_bridge.conversion.options import ActivationOptions, CalibrationOptions, ConvertOptions, RangeOptions
from trt_bridge.lift.weights import effective_weight
from trt_bridge.runtime.session import session

#: the static conversion these tests check (a dynamic source would otherwise get runtime ranges)
STATIC = ActivationOptions(runtime_ranges="off")


#   x[2,4,8] ─ LayerNormalization(gamma, beta) ─ ln ─┬─ MatMul(Wq) ─ q
#                                                    └─ MatMul(Wk) ─ k
def _graph(rng):
    x = gs.Variable("x", np.float32, [2, 4, 8])
    ln = gs.Variable("ln", np.float32, [2, 4, 8])
    q, k = gs.Variable("q", np.float32, [2, 4, 6]), gs.Variable("k", np.float32, [2, 4, 6])
    gamma = gs.Constant("gamma", (1 + rng.normal(0, 0.2, 8)).astype(np.float32))
    beta = gs.Constant("beta", rng.normal(0, 0.2, 8).astype(np.float32))
    wq = gs.Constant("Wq", rng.normal(0, 0.3, (8, 6)).astype(np.float32))
    wk = gs.Constant("Wk", rng.normal(0, 0.3, (8, 6)).astype(np.float32))
    nodes = [gs.Node("LayerNormalization", "ln_node", {"axis": -1}, [x, gamma, beta], [ln]),
             gs.Node("MatMul", "mm_q", {}, [ln, wq], [q]), gs.Node("MatMul", "mm_k", {}, [ln, wk], [k])]
    graph = gs.Graph(nodes, [x], [q, k], opset=17)
    ann = Annotations()
    for node in ("mm_q", "mm_k"):
        ann.add_activation("ln", Site(node, 0), node)
    ann.add_weight(WeightSpec("Wq", [Site("mm_q", 1)], 1, "mm_q"))
    ann.add_weight(WeightSpec("Wk", [Site("mm_k", 1)], 1, "mm_k"))
    return graph, ann


def test_smoothing_is_exact_in_float_and_folds_into_layer_norm():
    rng = np.random.default_rng(0)
    graph, ann = _graph(rng)
    # the reference computes with the weights as lowering will emit them (int8 × scale)
    ref_graph, ref_ann = _graph(np.random.default_rng(0))
    for node in ref_graph.nodes[1:]:
        node.inputs[1] = gs.Constant(node.inputs[1].name + "_eff",
                                     effective_weight(ref_ann.weights[node.inputs[1].name], node.inputs[1]))
    assert candidates(graph, ann) == ["ln"]
    channel_max = {"ln": np.array([0.5, 8.0, 0.4, 0.6, 0.5, 12.0, 0.7, 0.5])}
    done, factors = smooth(graph, ann, channel_max, alpha=0.65)
    assert set(factors) == {"ln"} and factors["ln"].shape == (8,)
    assert [d.folded_into for d in done] == ["ln_node"]
    assert [n.op for n in graph.nodes] == ["LayerNormalization", "MatMul", "MatMul"]  # no Mul added
    assert set(ann.weights) == {"Wq_smoothed", "Wk_smoothed"} and ann.weights["Wq_smoothed"].codes is None
    feeds = [{"x": rng.standard_normal((2, 4, 8)).astype(np.float32)} for _ in range(3)]
    got, want = run_ort(gs.export_onnx(graph), feeds), run_ort(gs.export_onnx(ref_graph), feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_not_smoothed_when_the_layer_norm_output_has_other_readers():
    graph, ann = _graph(np.random.default_rng(1))
    graph.outputs.append(graph.nodes[0].outputs[0])  # ln is also a graph output
    assert candidates(graph, ann) == []


#   x[2,4,8] ─ LayerNormalization ─ ln ─┬─ MatMul(Wq) ─ q
#                                      ├─ MatMul(Wk) ─ k
#                                      └─ Add(x) ─ r          (the residual branch of a post-LN encoder)
def test_a_residual_reader_gets_the_layer_norm_output_back_through_one_mul():
    """BERT's LayerNormalization output feeds its q/k/v projections and the next residual Add. Smoothing still
    folds 1/s into the LayerNormalization; the Add reads ``ln/s · s`` through one Mul (which TensorRT fuses into
    the Add), so the float model computes what it did. On a real-weight MiniLM-L6 this is what lets smoothing
    act at all: float → INT8 went from 15.2 to 17.2 dB on held-out sentences (the corpus's ``minilm-real``)."""
    def build(rng):
        graph, ann = _graph(rng)
        x, ln = graph.inputs[0], graph.nodes[0].outputs[0]
        r = gs.Variable("r", np.float32, [2, 4, 8])
        graph.nodes.append(gs.Node("Add", "residual", {}, [ln, x], [r]))
        graph.outputs.append(r)
        return graph, ann

    rng = np.random.default_rng(3)
    graph, ann = build(rng)
    ref_graph, ref_ann = build(np.random.default_rng(3))
    for node in ref_graph.nodes[1:3]:
        node.inputs[1] = gs.Constant(node.inputs[1].name + "_eff",
                                     effective_weight(ref_ann.weights[node.inputs[1].name], node.inputs[1]))
    assert candidates(graph, ann) == ["ln"]
    done, _ = smooth(graph, ann, {"ln": np.array([0.5, 8.0, 0.4, 0.6, 0.5, 12.0, 0.7, 0.5])}, alpha=0.65)
    assert [d.folded_into for d in done] == ["ln_node"]
    assert sorted(n.op for n in graph.nodes) == ["Add", "LayerNormalization", "MatMul", "MatMul", "Mul"]
    add = next(n for n in graph.nodes if n.op == "Add")
    assert add.inputs[0].inputs[0].op == "Mul" and add.inputs[0].inputs[0].inputs[0].name == "ln"
    assert {s.node for s in ann.activations["ln"].sites} == {"mm_q", "mm_k"}  # the Add's input stays float
    feeds = [{"x": rng.standard_normal((2, 4, 8)).astype(np.float32)} for _ in range(3)]
    got, want = session(gs.export_onnx(graph)), session(gs.export_onnx(ref_graph))
    for feed in feeds:
        for g, w in zip(got.run(None, feed), want.run(None, feed), strict=True):  # q, k and the residual r
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


#   x[2,4,8] ─ Gelu ─ g ─┬─ MatMul(Wq) ─ q
#                        └─ Add(x) ─ r        (a float reader besides the quantized MatMul)
def _gelu_graph(rng):
    x = gs.Variable("x", np.float32, [2, 4, 8])
    g, q, r = (gs.Variable(n, np.float32, shape) for n, shape in (("g", [2, 4, 8]), ("q", [2, 4, 6]), ("r", [2, 4, 8])))
    wq = gs.Constant("Wq", rng.normal(0, 0.3, (8, 6)).astype(np.float32))
    nodes = [gs.Node("Gelu", "gelu", {}, [x], [g]), gs.Node("MatMul", "mm_q", {}, [g, wq], [q]),
             gs.Node("Add", "residual", {}, [g, x], [r])]
    graph = gs.Graph(nodes, [x], [q, r], opset=20)
    ann = Annotations()
    ann.add_activation("g", Site("mm_q", 0), "mm_q")
    ann.add_weight(WeightSpec("Wq", [Site("mm_q", 1)], 1, "mm_q"))
    return graph, ann


def test_a_token_sequence_with_outlier_channels_is_divided_by_s_in_one_mul():
    """No LayerNormalization to fold into (a GELU output, an attention output): ``g`` is divided by ``s`` in a Mul
    after the node that computes it and keeps its name (and its annotation); the float reader reads the
    undivided output; exact in float. Only with outlier channels: a flat tensor is left alone."""
    rng = np.random.default_rng(4)
    graph, ann = _gelu_graph(rng)
    ref_graph, ref_ann = _gelu_graph(np.random.default_rng(4))
    ref_mm = ref_graph.nodes[1]
    ref_mm.inputs[1] = gs.Constant("Wq_eff", effective_weight(ref_ann.weights["Wq"], ref_mm.inputs[1]))
    assert candidates(graph, ann) == ["g"]
    flat = {"g": np.array([1.0, 1.2, 0.9, 1.1, 1.0, 1.3, 0.8, 1.0])}
    assert smooth(graph, ann, flat, alpha=0.65) == ([], {})  # largest/median 1.3 < OUTLIER_RATIO
    done, factors = smooth(graph, ann, {"g": np.array([0.5, 8.0, 0.4, 0.6, 0.5, 12.0, 0.7, 0.5])}, alpha=0.65)
    assert [(d.folded_into, d.through) for d in done] == [("g_smooth", "Mul")] and done[0].restored_for == ("residual",)
    mul = next(n for n in graph.nodes if n.op == "Mul")
    assert mul.outputs[0].name == "g" and mul.inputs[0].inputs[0].op == "Gelu"
    add = next(n for n in graph.nodes if n.op == "Add")
    assert add.inputs[0] is mul.inputs[0]  # the residual reads the Gelu output itself
    np.testing.assert_allclose(mul.inputs[1].values * factors["g"], 1.0, rtol=1e-6)
    got, want = session(gs.export_onnx(graph)), session(gs.export_onnx(ref_graph))
    for _ in range(3):
        feed = {"x": rng.standard_normal((2, 4, 8)).astype(np.float32)}
        for g, w in zip(got.run(None, feed), want.run(None, feed), strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_a_classifier_input_is_not_a_candidate_for_a_mul():
    """A CNN's [N, C] classifier input has no token axis; smoothing it through a Mul lost accuracy (MNIST:
    37.6 → 30.7 dB), so only token sequences (rank 3 or more) get one."""
    graph, ann = _gelu_graph(np.random.default_rng(5))
    for tensor in graph.tensors().values():
        if isinstance(tensor, gs.Variable):
            tensor.shape = [8, tensor.shape[-1]]
    assert candidates(graph, ann) == []


def test_a_post_layer_norm_encoder_converts_smoothed_and_builds(tmp_path):
    """End to end on a BERT-style (post-LN) encoder whose LayerNormalization outputs also feed residual Adds and
    carry outlier channels: every such output is smoothed, the model stays close to the float one, and
    TensorRT-RTX builds it."""
    built = load_script("large_model").build(tmp_path / "float", hidden=64, layers=2, vocab=500, seq=32, heads=4)
    # real encoders carry a few outlier channels out of each LayerNormalization (MiniLM-L6: the largest channel
    # 4.5-20x the median); plant two, 25x, in every gamma and beta (random weights have none: nothing is smoothed)
    model = onnx.load(str(built))
    for tensor in model.graph.initializer:
        if tensor.name.endswith((".gamma", ".beta")):
            values = numpy_helper.to_array(tensor).copy()
            values[[5, 40]] *= 25.0
            tensor.CopyFrom(numpy_helper.from_array(values, tensor.name))
    src = save(model, tmp_path / "outliers.onnx")
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "calib.npz", input_ids=rng.integers(0, 500, (8, 1, 32), np.int64))  # 256 rows
    held_out = [{"input_ids": rng.integers(0, 500, (1, 32), np.int64)} for _ in range(8)]
    out = tmp_path / "int8.onnx"
    # the planted channels are massive (25x every other): by default they are split off into float side paths
    # (calibrate/outliers.py) and nothing is left to smooth; without the split, smoothing takes them
    report = convert(src, out, ConvertOptions(calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")),
                                              progress=False))
    assert {x["channels"] for x in report.split_outliers} == {(5, 40)} and len(report.split_outliers) == 4
    assert snr_db(run_ort(src, held_out), run_ort(out, held_out)) > 37.0  # measured 40.3 dB (smoothed: 33.2)
    assert_qdq_contract(out)
    assert_tensorrt_ready(out)
    report = convert(src, out, ConvertOptions(calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")),
                                              ranges=RangeOptions(split_outliers=False), progress=False))
    # embeddings.ln feeds layer 0's projections and its residual; each ln1 feeds the FFN and the residual
    assert {(x["folded_into"], x["through"]) for x in report.smoothed} == {
        ("embeddings.ln", "LayerNormalization"), ("layer0.ln1", "LayerNormalization"),
        ("layer1.ln1", "LayerNormalization"), ("layer0.ln2", "LayerNormalization")}
    assert "Mul" in op_types(out)  # the residuals read the LayerNormalization outputs back through one
    assert snr_db(run_ort(src, held_out), run_ort(out, held_out)) > 31.0  # measured 33.2 dB
    assert_qdq_contract(out)
    assert_tensorrt_ready(out)


def test_smoothing_wins_accuracy_on_an_encoder_with_outlier_channels(tmp_path):
    fpath = save(samples.transformer_block(layers=2), tmp_path / "float.onnx")
    dpath = quantize_dynamic(fpath, tmp_path / "dynamic.onnx")
    np.savez(tmp_path / "calib.npz", x=samples.sequence_feeds(32, 1, 16, 64)[:, 0])
    held_out = [{"x": f} for f in samples.sequence_feeds(16, 2, 16, 64)]
    reference = run_ort(fpath, held_out)
    results = {}
    for alpha in (None, 0.65):
        out = tmp_path / f"converted-{alpha}.onnx"
        report = convert(dpath, out, ConvertOptions(calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")),
                                                    activations=STATIC,
                                                    ranges=RangeOptions(smooth=alpha), progress=False))
        results[alpha] = (snr_db(reference, run_ort(out, held_out)), report, out)
    plain, smoothed = results[None][0], results[0.65][0]
    report, out = results[0.65][1], results[0.65][2]
    assert {s["folded_into"] for s in report.smoothed} == {"layer0.ln1", "layer0.ln2", "layer1.ln1", "layer1.ln2"}
    assert op_types(out) - op_types(results[None][2]) == set()  # smoothing adds no op type
    assert smoothed > plain + 1.0, (plain, smoothed)
    assert smoothed >= snr_db(reference, run_exact(dpath, held_out)) - 1.0  # the dynamic source's accuracy
    assert_qdq_contract(out)
    assert_tensorrt_ready(out)


def test_too_few_calibration_rows_leave_the_tensor_unsmoothed_and_calibrated(tmp_path):
    # a pooled head sees one row per feed: each channel's max from a handful of rows says little about
    # its tail, and smoothing would spend the headroom held-out inputs need (ConvNeXt's pooled
    # classifier input: 30.2 dB unsmoothed, 19.4 dB smoothed on held-out inputs, 16 calibration rows)
    fpath = save(samples.transformer_block(layers=1), tmp_path / "float.onnx")
    dpath = quantize_dynamic(fpath, tmp_path / "dynamic.onnx")
    held_out = [{"x": f} for f in samples.sequence_feeds(8, 2, 16, 64)]
    reference = run_ort(fpath, held_out)
    reports = {}
    for feeds in (4, 16):  # 64 and 256 rows of 16 tokens
        np.savez(tmp_path / "calib.npz", x=samples.sequence_feeds(feeds, 1, 16, 64)[:, 0])
        out = tmp_path / f"converted-{feeds}.onnx"
        reports[feeds] = convert(dpath, out, ConvertOptions(
            calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")), progress=False))
        # the unsmoothed candidates are still calibrated (pass 2 observes them as they are)
        assert not reports[feeds].remaining_blockers
        assert snr_db(reference, run_ort(out, held_out)) > 34.0  # measured 37.0 (64 rows) and 38.7 (256 rows)
    assert reports[4].smoothed == []
    assert {s["folded_into"] for s in reports[16].smoothed} == {"layer0.ln1", "layer0.ln2"}
    assert_qdq_contract(tmp_path / "converted-4.onnx")
    assert_tensorrt_ready(tmp_path / "converted-4.onnx")
