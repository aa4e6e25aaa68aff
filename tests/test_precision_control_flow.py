"""``--high-precision fp16|bf16`` inside control flow (trt_bridge/lower/body_precision.py): each If branch retyped
as a model of its own, whose interface is the outer values it reads and its outputs, in their types::

    x ─┬─ If(cond)                            x ─┬─ If(cond)
       ├ then: MatMul(x, W) ── Softmax ── y      ├ then: Cast(x), Cast(W) ── MatMul ── Cast(fp32) ── Softmax ── y
       └ else: MatMul(x, V) ── Add(b) ── y       └ else: Cast(x) ── MatMul(·, V:fp16) ── Add ── Cast(fp32) ── y

(W an initializer of the main graph, V and b the else branch's own; the Softmax kept float32 as in the main
graph), and Optimum's merged decoders (an If on ``use_cache_branch``, both branches a whole decoder) converted
with ``--high-precision fp16`` and ``bf16``: strict onnx checks, the interface kept, a generation loop against the
source, TensorRT-RTX builds at the prefill and decode profiles."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import assert_builds_at, assert_tensorrt_ready, run_ort, save
from onnx import TensorProto, helper, numpy_helper

from trt_bridge.cli import main
from trt_bridge.lower.precision import to_low_precision
from trt_bridge.tensorrt.decoder_profiles import decoder_profiles, model_inputs_shapes
from trt_bridge.verification import VerifyOptions, verify
from trt_bridge.verification.generation import GenerationOptions

DATA = Path(__file__).parent / "data" / "decoders"


def assert_parses(path: Path) -> None:
    from trt_bridge.tensorrt.parse import parse

    result = parse(path)
    assert result.ok, f"TensorRT parser rejected {path}: {result.errors}"


def _if_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)

    def const(name, *shape):
        return numpy_helper.from_array(rng.normal(0, 0.5, shape).astype(np.float32), name)

    then = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["t_mm"], "then_mm"),
                              helper.make_node("Softmax", ["t_mm"], ["t_y"], "then_softmax", axis=-1)], "then",
                             [], [helper.make_tensor_value_info("t_y", TensorProto.FLOAT, [2, 4])])
    other = helper.make_graph([helper.make_node("MatMul", ["x", "V"], ["e_mm"], "else_mm"),
                               helper.make_node("Add", ["e_mm", "b"], ["e_y"], "else_add")], "else",
                              [], [helper.make_tensor_value_info("e_y", TensorProto.FLOAT, [2, 4])],
                              [const("V", 8, 4), const("b", 4)])
    graph = helper.make_graph([helper.make_node("If", ["cond"], ["y"], "the_if", then_branch=then,
                                                else_branch=other)], "if_model",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8]),
                               helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [const("W", 8, 4)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


def _input_types(graph: onnx.GraphProto) -> dict[str, int]:
    """Each MatMul/Softmax/Add of ``graph`` → the element types it reads (the branch's value_info, inferred)."""
    types = {v.name: v.type.tensor_type.elem_type for v in (*graph.value_info, *graph.output)}
    types.update({i.name: i.data_type for i in graph.initializer})
    return {n.op_type: {types.get(i) for i in n.input} for n in graph.node if n.op_type != "Cast"}


def test_both_branches_compute_in_float16_and_match_onnxruntime(tmp_path):
    source = _if_model()
    converted, kept = to_low_precision(source, "fp16")
    onnx.checker.check_model(converted, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(converted, check_type=True, strict_mode=True)
    then, other = (next(a.g for a in inferred.graph.node[0].attribute if a.name == n)
                   for n in ("then_branch", "else_branch"))
    assert [n.op_type for n in inferred.graph.node] == ["If"]
    assert _input_types(then) == {"MatMul": {TensorProto.FLOAT16}, "Softmax": {TensorProto.FLOAT}}
    assert _input_types(other) == {"MatMul": {TensorProto.FLOAT16}, "Add": {TensorProto.FLOAT16}}
    entry = [n.input[0] for n in then.node if n.op_type == "Cast" and n.attribute[0].i == TensorProto.FLOAT16]
    assert sorted(entry) == ["W", "x"]  # the outer values, cast at the branch's entry
    assert {i.name: i.data_type for i in other.initializer} == {"V": TensorProto.FLOAT16, "b": TensorProto.FLOAT16}
    assert [(k.node, k.op) for k in kept] == [("the_if/then_branch: then_softmax", "Softmax")]
    assert [v.type.tensor_type.elem_type for v in (*converted.graph.input, *converted.graph.output)] == \
        [TensorProto.FLOAT, TensorProto.BOOL, TensorProto.FLOAT]
    src, out = save(source, tmp_path / "src.onnx"), save(converted, tmp_path / "out.onnx")
    x = np.random.default_rng(1).normal(size=(2, 8)).astype(np.float32)
    for cond in (True, False):
        feeds = [{"x": x, "cond": np.array(cond)}]
        np.testing.assert_allclose(run_ort(out, feeds), run_ort(src, feeds), rtol=1e-2, atol=2e-3)
    assert_tensorrt_ready(out)


#: (folder, convert flags, least token agreement, least logits SNR in dB, built here: measured 100 % / 62.78,
#: 96.9 % / 33.00, 59.4 % / 15.76 (int4 from float, against the float source), 100 % / 39.37; TensorRT-RTX builds
#: all four at both profiles (6 s a model): the test builds one per low-precision type, within its time budget)
MERGED = [("llama-optimum-merged-int4-b32", ["--high-precision", "fp16"], 1.0, 60, True),
          ("llama-optimum-merged-qdyn-u8", ["--high-precision", "fp16"], 0.9, 30, False),
          ("llama-optimum-merged-fp32", ["--int4", "--block-size", "32", "--high-precision", "fp16"], 0.5, 14, False),
          ("llama-optimum-merged-int4-b32", ["--high-precision", "bf16"], 1.0, 36, True)]


@pytest.mark.parametrize(("folder", "flags", "agreement", "snr", "builds"), MERGED,
                         ids=["int4-fp16", "qdyn-fp16", "float-int4-fp16", "int4-bf16"])
def test_a_merged_decoder_converts_in_low_precision(tmp_path, folder, flags, agreement, snr, builds):
    src = DATA / folder / "decoder_model_merged.onnx"
    out = tmp_path / "decoder_model_merged.onnx"
    assert main(["convert", str(src), "-o", str(out), "--skip-check", "-q", *flags]) == 0
    converted = onnx.load(str(out))
    onnx.checker.check_model(converted, full_check=True)
    onnx.shape_inference.infer_shapes(converted, check_type=True, strict_mode=True)
    header = onnx.load(str(src), load_external_data=False)

    def interface(model):
        return [(v.name, v.type.tensor_type.elem_type) for v in (*model.graph.input, *model.graph.output)]
    assert interface(converted) == interface(header)
    low = TensorProto.FLOAT16 if "fp16" in flags else TensorProto.BFLOAT16
    branches = [a.g for n in converted.graph.node if n.op_type == "If" for a in n.attribute]
    assert len(branches) == 2 and all(any(i.data_type == low for i in b.initializer) for b in branches)
    report = verify(src, out, VerifyOptions(generation=GenerationOptions(prompts=2, steps=16), costs=None,
                                            progress=False)).generation
    assert report.token_agreement >= agreement and report.logits_snr_db > snr, (report.token_agreement,
                                                                               report.logits_snr_db)
    profiles = decoder_profiles(model_inputs_shapes(converted))
    assert [p.name for p in profiles] == ["prefill", "decode"]
    if builds:
        assert_builds_at(out, {p.name: p.shapes for p in profiles})
    else:
        assert_parses(out)
