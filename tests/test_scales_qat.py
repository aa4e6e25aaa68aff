"""Importing a QAT Q/DQ export's scales onto the model being converted (trt_bridge.scales.qat).

The "QAT export" is written by hand from a float sample: before every weighted op::

    x ─ Q(s_x, 0) ─ DQ(s_x, 0) ─┐                     s_x = amax(x)/127, amax observed on random feeds
    W_q:int8 ─ DQ(s_w, axis) ───┴ Conv|MatMul ─ …     s_w = max|W| per output channel / 127

and the target is the float model itself, or a renamed copy run through onnxruntime's
``quantize_dynamic``, whose names the QAT export does not share.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import quantize_dynamic, save
from onnx import TensorProto, helper, numpy_helper

from trt_bridge.samples import conv_net, transformer_block
from trt_bridge.scales.qat import MatchReport, import_qat, weight_key, weight_node

QMAX = 127


def _weighted(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    inits = {i.name for i in model.graph.initializer}
    return [n for n in model.graph.node if n.op_type in ("Conv", "MatMul", "Gemm") and n.input[1] in inits]


def observed_amax(model: onnx.ModelProto, tensors: list[str], feeds: int = 16, seed: int = 0) -> dict[str, float]:
    """max |t| of each tensor over ``feeds`` random inputs (onnxruntime, the tensors exposed as outputs)."""
    import onnxruntime as ort

    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    known = {o.name for o in exposed.graph.output}
    exposed.graph.output.extend(helper.make_tensor_value_info(t, TensorProto.FLOAT, None)
                                for t in tensors if t not in known)
    sess = ort.InferenceSession(exposed.SerializeToString(), providers=["CPUExecutionProvider"])
    inp = model.graph.input[0]
    shape = [d.dim_value or 2 for d in inp.type.tensor_type.shape.dim]
    rng = np.random.default_rng(seed)
    amax = dict.fromkeys(tensors, 0.0)
    names = [o.name for o in sess.get_outputs()]
    for _ in range(feeds):
        outs = dict(zip(names, sess.run(None, {inp.name: rng.standard_normal(shape).astype(np.float32)})))
        for t in tensors:
            amax[t] = max(amax[t], float(np.abs(outs[t]).max()))
    return amax


def make_qat(model: onnx.ModelProto, act_amax: dict[str, float], *, uint8: dict[str, tuple[float, int]] | None = None,
             fake_quant_weights: bool = False, gemm: bool = False) -> onnx.ModelProto:
    """A QAT-style Q/DQ export of float ``model``: a Q/DQ pair on every weighted op's input (int8, zero point 0,
    scale amax/127; or uint8 ``(scale, zero point)`` from ``uint8``), int8 weights per output channel
    (``fake_quant_weights``: float weight → Q → DQ instead). ``gemm``: 2-D MatMuls become Gemm(transB=1)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    inits = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    new_inits, nodes, done = [], [], {}
    uint8 = uint8 or {}
    for node in g.node:
        if node.op_type in ("Conv", "MatMul") and node.input[1] in inits:
            x, w = node.input[0], node.input[1]
            if x not in done:
                if x in uint8:
                    scale, zp = np.float32(uint8[x][0]), np.array(uint8[x][1], np.uint8)
                else:
                    scale, zp = np.float32(act_amax[x] / QMAX), np.array(0, np.int8)
                new_inits += [numpy_helper.from_array(np.array(scale), f"{x}_qat_scale"),
                              numpy_helper.from_array(zp, f"{x}_qat_zp")]
                nodes += [helper.make_node("QuantizeLinear", [x, f"{x}_qat_scale", f"{x}_qat_zp"], [f"{x}_q"],
                                           f"{x}/input_quantizer/QuantizeLinear"),
                          helper.make_node("DequantizeLinear", [f"{x}_q", f"{x}_qat_scale", f"{x}_qat_zp"],
                                           [f"{x}_dq"], f"{x}/input_quantizer/DequantizeLinear")]
                done[x] = f"{x}_dq"
            values = inits[w]
            as_gemm = gemm and node.op_type == "MatMul" and values.ndim == 2
            if as_gemm:
                values = np.ascontiguousarray(values.T)  # [out, in]
            axis = 0 if node.op_type == "Conv" or as_gemm else values.ndim - 1
            reduce = tuple(i for i in range(values.ndim) if i != axis)
            scale = (np.abs(values).max(axis=reduce) / QMAX).astype(np.float32)
            shape = [1] * values.ndim
            shape[axis] = -1
            zp = np.zeros(scale.shape, np.int8)
            new_inits += [numpy_helper.from_array(scale, f"{w}_qat_scale"), numpy_helper.from_array(zp, f"{w}_qat_zp")]
            if fake_quant_weights:
                new_inits.append(numpy_helper.from_array(values, f"{w}_qat"))
                nodes.append(helper.make_node("QuantizeLinear", [f"{w}_qat", f"{w}_qat_scale", f"{w}_qat_zp"],
                                              [f"{w}_q"], f"{w}/weight_quantizer/QuantizeLinear", axis=axis))
                dq_in = f"{w}_q"
            else:
                q = np.clip(np.rint(values / scale.reshape(shape)), -QMAX, QMAX).astype(np.int8)
                new_inits.append(numpy_helper.from_array(q, f"{w}_quantized"))
                dq_in = f"{w}_quantized"
            nodes.append(helper.make_node("DequantizeLinear", [dq_in, f"{w}_qat_scale", f"{w}_qat_zp"], [f"{w}_dq"],
                                          f"{w}/weight_quantizer/DequantizeLinear", axis=axis))
            if as_gemm:
                nodes.append(helper.make_node("Gemm", [done[x], f"{w}_dq"], list(node.output), node.name, transB=1))
                continue
            node.input[0], node.input[1] = done[x], f"{w}_dq"
        nodes.append(node)
    g.ClearField("node")
    g.node.extend(nodes)
    g.initializer.extend(new_inits)
    onnx.checker.check_model(out)
    return out


def qat_of(model: onnx.ModelProto, **kwargs) -> tuple[onnx.ModelProto, dict[str, float]]:
    amax = observed_amax(model, sorted({n.input[0] for n in _weighted(model)}))
    return make_qat(model, amax, **kwargs), amax


def renamed(model: onnx.ModelProto, prefix: str = "exported/") -> onnx.ModelProto:
    """Every tensor and node renamed (another exporter's names)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph

    def r(name: str) -> str:
        return prefix + name if name else name

    for node in g.node:
        node.name = r(node.name)
        node.input[:] = [r(n) for n in node.input]
        node.output[:] = [r(n) for n in node.output]
    for value in (*g.input, *g.output, *g.value_info, *g.initializer):
        value.name = r(value.name)
    return out


def dynamic(model: onnx.ModelProto, tmp_path: Path, name: str) -> onnx.ModelProto:
    float_path = save(model, tmp_path / f"{name}.onnx")
    return onnx.load(str(quantize_dynamic(float_path, tmp_path / f"{name}_dynamic.onnx")))


def weight_amax(qat: onnx.ModelProto) -> dict[str, tuple[float, ...]]:
    """QAT weight name (as DQ input, ``_quantized`` stripped) → its per-channel amax."""
    inits = {i.name: numpy_helper.to_array(i) for i in qat.graph.initializer}
    return {n.input[0].removesuffix("_quantized").removesuffix("_q"): tuple((inits[n.input[1]] * QMAX).tolist())
            for n in qat.graph.node if n.op_type == "DequantizeLinear" and inits[n.input[1]].size > 1}


@pytest.mark.parametrize("sample", [conv_net, transformer_block])
def test_names_match_the_float_model_itself(sample):
    #   QAT:    x ─ Q ─ DQ ─ conv1 ─ …          target (the float model):  x ─ conv1 ─ …
    #           conv1.weight_quantized ─ DQ ─┘                             conv1.weight ─┘
    #   every activation and weight matches by name; amax are the QAT's
    model = sample()
    qat, amax = qat_of(model)
    before = model.SerializeToString()
    table, report = import_qat(qat, model)
    assert model.SerializeToString() == before  # the target is read, not changed
    assert report and not report.unmatched and not report.ambiguous
    assert {how for _, _, how in report.matched} == {"name"}
    weighted = _weighted(model)
    assert {k for k in table if table[k].kind == "activation"} == set(amax)
    for x, value in amax.items():
        assert table[x].amax == pytest.approx(value, rel=1e-6)
        assert table[x].source.startswith("qat:")
    weights = weight_amax(qat)
    for node in weighted:
        entry = table[weight_key(node.name)]
        assert weight_node(entry.tensor) == node.name and entry.kind == "weight"
        assert entry.axis == (0 if node.op_type == "Conv" else 1)
        np.testing.assert_allclose(entry.amax, weights[node.input[1]], rtol=1e-6)
    assert len(table) == len(amax) + len(weighted)
    assert "0 unmatched" in report.summary()


@pytest.mark.parametrize("sample", [conv_net, transformer_block])
def test_structure_matches_a_renamed_dynamic_export(sample, tmp_path):
    #   QAT:    x ─ Q ─ DQ ─ conv1 ─ …   (the float export's names)
    #   target: exported/x ─ DynamicQuantizeLinear ─ ConvInteger 'exported/conv1_quant' ─ …
    #           exported/conv1.weight_quantized ────────┘
    #   no name is shared: the i-th op of each (family, weight shape) matches the i-th; the activation key is the
    #   DynamicQuantizeLinear's float input, the weight key the ConvInteger/MatMulInteger node; lifting keeps both.
    from trt_bridge.lift.pipeline import lift_model

    model = sample()
    qat, amax = qat_of(model)
    target = dynamic(renamed(model), tmp_path, sample.__name__)
    table, report = import_qat(qat, target)
    assert report, report.summary()
    assert {how for _, _, how in report.matched} == {"structure"}
    for x, value in amax.items():
        assert table[f"exported/{x}"].amax == pytest.approx(value, rel=1e-6)
    integer_ops = [n for n in target.graph.node if n.op_type in ("ConvInteger", "MatMulInteger")]
    weights = weight_amax(qat)
    for float_node, node in zip(_weighted(model), integer_ops):  # quantize_dynamic keeps the order
        entry = table[weight_key(node.name)]
        np.testing.assert_allclose(entry.amax, weights[float_node.input[1]], rtol=1e-6)
    assert len(table) == len(amax) + len(integer_ops)

    lifted_copy = onnx.ModelProto()
    lifted_copy.CopyFrom(target)
    _, ctx = lift_model(lifted_copy)
    origins = {spec.origin: spec for spec in ctx.annotations.weights.values()}
    for key, entry in table.entries.items():
        if entry.kind == "activation":
            assert key in ctx.annotations.activations
        else:
            spec = origins[weight_node(key)]
            assert len(entry.amax) == spec.codes.shape[spec.axis] and entry.axis == spec.axis


def test_extra_layer_of_the_same_shape_is_ambiguous_and_missing_layer_unmatched(tmp_path):
    #   QAT: 1 encoder block (q, k, v, out: four 64×64 MatMuls; up 64×256; down 256×64)
    #   target (renamed): 2 blocks: eight 64×64 MatMuls, two of each other shape → order cannot decide
    model = transformer_block(layers=1)
    qat, amax = qat_of(model)
    table, report = import_qat(qat, renamed(transformer_block(layers=2)))
    assert not report and not report.matched and not report.unmatched
    assert len(table) == 0  # nothing ambiguous is applied
    ambiguous = dict(report.ambiguous)
    assert sorted(ambiguous["layer0.attn.q.weight_quantized"]) == sorted(
        weight_key(f"exported/layer{i}.attn.{p}/MatMul") for i in (0, 1) for p in ("q", "k", "v", "out"))
    assert ambiguous["layer0.ln1.out"] == [f"exported/layer{i}.{t}" for i in (0, 1) for t in ("ctx.m", "ln1.out")]
    assert set(ambiguous) == set(amax) | {f"{w}_quantized" for w in weight_amax(qat)}
    assert "ambiguous: layer0.attn.q.weight_quantized" in report.summary()

    #   QAT: fc 32×10; target (renamed): fc 32×12 → the fc weight and its input have no counterpart
    qat, _ = qat_of(conv_net())
    table, report = import_qat(qat, renamed(conv_net(classes=12)))
    assert sorted(report.unmatched) == ["fc.weight_quantized", "flat"]
    assert not report.ambiguous and len(report.matched) == 6
    assert "exported/flat" not in table and weight_key("exported/fc") not in table
    assert weight_key("exported/conv3") in table


def test_uint8_zero_point_gives_the_covering_amax():
    #   x ─ Q(s, z:uint8) ─ DQ ─ conv1   codes cover [(0 − z)·s, (255 − z)·s] → amax = max(z, 255 − z)·s
    model = conv_net()
    uint8 = {"x": (0.02, 100), "r1": (0.01, 0)}
    qat, amax = qat_of(model, uint8=uint8)
    table, report = import_qat(qat, model)
    assert report, report.summary()
    for x, (s, z) in uint8.items():
        assert table[x].amax == pytest.approx(max(z, 255 - z) * np.float32(s), rel=1e-6)
    assert table["r2"].amax == pytest.approx(amax["r2"], rel=1e-6)
    assert any("uint8 zero point 100" in note for note in report.notes)


def test_gemm_and_fake_quantized_weights_match_a_matmul_target(tmp_path):
    #   QAT:  flat ─ Q ─ DQ ─ Gemm(transB=1) ─ …        target: exported/flat ─ MatMul 'exported/fc'
    #         fc.weight[10,32]:float ─ Q ─ DQ(axis 0) ─┘        exported/fc.weight[32,10] ─┘
    #   the weight shapes compare as [in, out]; per-channel amax lands on the MatMul's axis 1
    model = conv_net()
    qat, _ = qat_of(model, gemm=True, fake_quant_weights=True)
    assert "Gemm" in {n.op_type for n in qat.graph.node}
    table, report = import_qat(qat, renamed(model))
    assert report and {how for _, _, how in report.matched} == {"structure"}
    entry = table[weight_key("exported/fc")]
    w = numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "fc.weight"))
    assert entry.axis == 1
    np.testing.assert_allclose(entry.amax, np.abs(w).max(axis=0), rtol=1e-6)


def test_unnamed_target_nodes_are_keyed_as_convert_names_them():
    #   target nodes without names: the weight keys use the names convert.prepare gives them (<op>_<index>)
    from trt_bridge.prepare.model import prepare

    model = conv_net()
    qat, _ = qat_of(model)
    target = renamed(model)
    for node in target.graph.node:
        node.name = ""
    table, report = import_qat(qat, target)
    assert report, report.summary()
    prepare(target)
    expected = {weight_key(n.name) for n in _weighted(target)}
    assert {k for k in table if table[k].kind == "weight"} == expected == {weight_key(n) for n in
                                                                           ("Conv_0", "Conv_2", "Conv_4", "MatMul_8")}


def test_qat_path_and_errors(tmp_path):
    model = conv_net()
    qat, _ = qat_of(model)
    path = save(qat, tmp_path / "qat.onnx")
    table, report = import_qat(path, model)
    assert isinstance(report, MatchReport) and report.to_dict()["unmatched"] == []
    assert table["x"].source == f"qat:{path}#x"
    from trt_bridge.errors import TrtBridgeError

    with pytest.raises(TrtBridgeError, match="not a QAT Q/DQ export"):
        import_qat(model, model)
