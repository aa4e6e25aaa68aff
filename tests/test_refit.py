"""conversion/refit.py: auto's candidates after the first are the first one's lowered graph with new values wherever
the ranges keep its structure. Each re-fitted candidate must be, byte for byte, the model a fresh build of the same
ranges gives (conversion/range_choice.candidate_model), and the conversion's output must not change. Every output is
built by TensorRT-RTX and follows its float model in onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
from helpers import assert_tensorrt_ready, quantize_dynamic, run_ort, save, snr_db
from onnx import TensorProto, helper, numpy_helper

from trt_bridge.annotations import Annotations
from trt_bridge.conversion import convert
from trt_bridge.conversion.options import ActivationOptions, CalibrationOptions, ConvertOptions, PrecisionOptions
from trt_bridge.conversion.range_choice import candidate_model
from trt_bridge.conversion.refit import Refittable
from trt_bridge.samples import conv_net, image_feeds, sequence_feeds, transformer_block


def _gemm_net(with_c: bool, seed: int = 0) -> onnx.ModelProto:
    """x[1024, 32] ─ Gemm(W, [C], transB, alpha, beta) ─ y: re-centring into C, or into a C it adds."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal((24, 32)) / 6).astype(np.float32), "W")]
    inputs = ["x", "W"]
    if with_c:
        inits.append(numpy_helper.from_array(rng.standard_normal(24).astype(np.float32), "C"))
        inputs.append("C")
    graph = helper.make_graph([helper.make_node("Gemm", inputs, ["y"], "gemm", transB=1, alpha=0.9, beta=1.1)],
                              "gemm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1024, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1024, 24])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _cases(root):
    images = np.stack(image_feeds(16, seed=2))
    conv = save(conv_net(channels=(8, 16)), root / "conv.onnx")
    yield "conv float", conv, conv, {"x": images}, {}
    yield "conv float16", conv, conv, {"x": images}, {"precision": PrecisionOptions(high_precision="fp16")}
    yield "conv dynamic", quantize_dynamic(conv, root / "dynamic.onnx"), conv, {"x": images}, {
        "activations": ActivationOptions(runtime_ranges="off")}
    rng = np.random.default_rng(5)
    one_sided = (np.abs(rng.standard_normal((16, 1024, 32))) * np.geomspace(0.5, 4, 16)[:, None, None]
                 ).astype(np.float32)
    gemm, gemm_no_c = save(_gemm_net(True), root / "gemm.onnx"), save(_gemm_net(False), root / "gemm-no-c.onnx")
    yield "gemm", gemm, gemm, {"x": one_sided}, {}
    yield "gemm without C", gemm_no_c, gemm_no_c, {"x": one_sided}, {}
    block = transformer_block(hidden=64, heads=4, seq=128)
    block_path = save(block, root / "block.onnx")
    yield "transformer", block_path, block_path, {
        block.graph.input[0].name: np.stack(sequence_feeds(32, seed=3, seq=128, hidden=64))}, {}


def test_a_refit_candidate_is_the_fresh_build(tmp_path, monkeypatch):
    checked, built = [], []
    refit, init = Refittable.refit, Refittable.__init__

    def checking_refit(self, fitted):
        got = refit(self, fitted)
        if got is not None:
            fresh = candidate_model(self.graph, Annotations(activations=self.pristine, weights=self.weights),
                                    self.weights, self.needed, fitted, self.lowering)
            assert got.SerializeToString() == fresh.SerializeToString(), (case, fitted.method, fitted.percentile)
            checked.append((case, fitted.method.value))
        return got

    def counting_init(self, *args, **kwargs):
        built.append(case)
        init(self, *args, **kwargs)

    monkeypatch.setattr(Refittable, "refit", checking_refit)
    monkeypatch.setattr(Refittable, "__init__", counting_init)
    for case, path, float_path, feeds, extra in _cases(tmp_path):
        data = tmp_path / f"{case.replace(' ', '-')}.npz"
        np.savez(data, **feeds)
        out = tmp_path / f"{case.replace(' ', '-')}.out.onnx"
        convert(path, out, ConvertOptions(calibration=CalibrationOptions(data=str(data)), progress=False, check=False,
                                          **extra))
        assert_tensorrt_ready(out)
        held = [{name: values[i] for name, values in feeds.items()} for i in range(4)]
        assert snr_db(run_ort(float_path, held), run_ort(out, held)) > 25, case  # Q/DQ simulated as TensorRT runs it
    cases = {case for case, _ in checked}
    assert {"conv float", "conv float16", "conv dynamic", "gemm", "gemm without C"} <= cases, (checked, built)
    assert len(checked) >= 8


def test_the_output_does_not_depend_on_refitting(tmp_path, monkeypatch):
    """The conversion with every candidate built afresh writes the same bytes."""
    src = save(conv_net(channels=(8, 16)), tmp_path / "conv.onnx")
    np.savez(tmp_path / "calib.npz", x=np.stack(image_feeds(16, seed=4)))
    options = ConvertOptions(calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")), progress=False,
                             check=False)
    convert(src, tmp_path / "refit.onnx", options)
    monkeypatch.setattr(Refittable, "refit", lambda self, fitted: None)
    convert(src, tmp_path / "fresh.onnx", options)
    assert (tmp_path / "refit.onnx").read_bytes() == (tmp_path / "fresh.onnx").read_bytes()


def test_a_refit_refuses_another_structure(monkeypatch):
    """Ranges that re-centre other tensors than the built candidate's give None (a fresh build follows)."""
    from trt_bridge.conversion import refit as refit_module

    class Lowering:
        shared, recentre, center_type = [], True, None

    built = object.__new__(Refittable)  # only what refit reads before it compares the structure
    built.graph, built.needed, built.lowering = None, [], Lowering()
    built.pristine, built.weights, built.recipes = {}, {}, {"the built one's tensor": []}
    monkeypatch.setattr(refit_module, "decisions", lambda *args: [("another tensor", np.float32(1.0), 1.0)])
    assert built.refit(None) is None
