"""Shared test helpers: building, quantizing, running and TensorRT-checking small models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

SHARED_MODELS = Path(__file__).resolve().parents[1].parent / "shared" / "models"
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_script(name: str):
    """A script of ``scripts/`` as a module (``load_script("large_model").build(...)``)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, str(path))
    return path


def quantize_dynamic(float_path: Path, out_path: Path, **kwargs) -> Path:
    """onnxruntime's own quantize_dynamic (the producer of the models we convert)."""
    from onnxruntime.quantization import quantize_dynamic as ort_quantize_dynamic

    ort_quantize_dynamic(str(float_path), str(out_path), **kwargs)
    return out_path


def run_ort(model: Path | onnx.ModelProto, feeds: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    """Run every feed; return the first output of each, in order."""
    from trt_bridge.runtime.session import session

    sess = session(model)
    return [sess.run(None, feed)[0] for feed in feeds]


def run_exact(model: Path | onnx.ModelProto, feeds: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    """Run every feed in onnx's reference evaluator; return the first output of each.

    For the *source* (dynamically quantized) models: onnxruntime's integer kernels are
    exact on CPUs with VNNI and saturate 16-bit pair sums on those without, so the same
    dynamic model scores several dB apart from one CI machine to the next. The reference
    evaluator computes DynamicQuantizeLinear / MatMulInteger / ConvInteger exactly in
    numpy, the way TensorRT's int32 accumulation would.
    """
    from onnx.reference import ReferenceEvaluator

    evaluator = ReferenceEvaluator(str(model) if isinstance(model, Path) else model)
    return [evaluator.run(None, feed)[0] for feed in feeds]


def snr_db(reference: list[np.ndarray], test: list[np.ndarray]) -> float:
    from trt_bridge.verification.metrics import snr_db as snr

    return snr(np.concatenate([r.ravel() for r in reference]), np.concatenate([t.ravel() for t in test]))


def op_types(path: Path | onnx.ModelProto) -> set[str]:
    model = onnx.load(str(path)) if isinstance(path, Path) else path
    return {n.op_type for n in model.graph.node}


def assert_tensorrt_ready(path: Path) -> None:
    """The TensorRT-RTX parser accepts ``path`` and builds it ahead of time for SM 8.9."""
    from trt_bridge.tensorrt.build import build_engine
    from trt_bridge.tensorrt.parse import parse

    result = parse(path)
    assert result.ok, f"TensorRT parser rejected {path}: {result.errors}"
    engine = build_engine(path, compute_capability="SM89")
    assert len(engine) > 0


def assert_builds_at(path: Path, profiles: dict[str, dict[str, tuple]], compute_capability: str = "8.9") -> None:
    """TensorRT-RTX parses ``path`` and builds it ahead of time at each named profile (input → (min, opt, max)
    shapes), one engine per profile, so a failure names the profile (a decoder's prefill and decode)."""
    import tempfile

    from trt_bridge.tensorrt.build import build
    from trt_bridge.tensorrt.options import BuildOptions
    from trt_bridge.tensorrt.profiles import Profile

    for name, shapes in profiles.items():
        options = BuildOptions(profiles=(Profile({k: tuple(tuple(s) for s in v) for k, v in shapes.items()}),),
                               compute_capabilities=(compute_capability,), progress=False)
        with tempfile.TemporaryDirectory() as tmp:
            try:
                result = build(path, Path(tmp) / "model.engine", options)
            except Exception as error:  # noqa: BLE001 - the profile goes into the failure
                raise AssertionError(f"{path}: TensorRT-RTX does not build profile '{name}': {error}") from error
            assert result.info["engine"]["size"] > 0


def assert_qdq_contract(path: Path) -> onnx.ModelProto:
    """The output contract: symmetric Q/DQ in a format TensorRT builds (int8; float8 E4M3 from opset 19; int4 blocks
    of a weight from opset 21), float32 scales, opset >= 13, checker clean."""
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    opset = next(i.version for i in model.opset_import if i.domain in ("", "ai.onnx"))
    assert opset >= 13
    banned = {"DynamicQuantizeLinear", "MatMulInteger", "ConvInteger", "QLinearConv", "QLinearMatMul"}
    assert not (op_types(model) & banned)
    assert all((n.domain or "") in ("", "ai.onnx") for n in model.graph.node)
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            scale, zero = inits[node.input[1]], inits[node.input[2]]
            assert scale.dtype.name in ("float32", "float16", "bfloat16") and np.all(scale > 0), node.name
            assert scale.dtype == np.float32 or opset >= 19, node.name  # float16/bfloat16 Q/DQ need opset 19
            assert zero.dtype.name in ("int8", "float8_e4m3fn", "int4"), node.name
            assert not np.any(zero.astype(np.float32)), node.name
            assert zero.dtype == np.int8 or opset >= (19 if zero.dtype.name == "float8_e4m3fn" else 21), node.name
    return model


def assert_lift_is_exact(float_model, dpath, feeds):
    """The lifted float graph computes exactly the float model with the source's dequantized weights."""
    source = {i.name: onnx.numpy_helper.to_array(i) for i in onnx.load(str(dpath)).graph.initializer}
    reference = onnx.ModelProto()
    reference.CopyFrom(float_model)
    is_conv = {n.input[1]: n.op_type == "Conv" for n in float_model.graph.node if len(n.input) > 1}
    for init in reference.graph.initializer:
        # onnxruntime stores a Gemm(transB=1) weight transposed, as '<name>_Transposed'
        for stored, transposed in ((init.name, False), (f"{init.name}_Transposed", True)):
            if f"{stored}_quantized" not in source:
                continue
            q = source[f"{stored}_quantized"].astype(np.float64)
            zp, scale = source[f"{stored}_zero_point"], source[f"{stored}_scale"]
            shape = [-1] + [1] * (q.ndim - 1) if is_conv.get(init.name) else [1] * (q.ndim - 1) + [-1]
            deq = (q - zp.reshape(shape if zp.ndim else ())) * scale.reshape(shape if scale.ndim else ())
            deq = deq.T if transposed else deq
            init.CopyFrom(onnx.numpy_helper.from_array(deq.astype(np.float32), init.name))
    from trt_bridge.lift.pipeline import lift_model

    lifted, _ = lift_model(onnx.load(str(dpath)))
    for want, got in zip(run_ort(reference, feeds), run_ort(lifted, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def quantize_static(float_path: Path, out_path: Path, feeds: list[dict[str, np.ndarray]], **kwargs) -> Path:
    """onnxruntime's own quantize_static (QOperator or QDQ, per ``quant_format``) on ``feeds``."""
    from onnxruntime.quantization import CalibrationDataReader
    from onnxruntime.quantization import quantize_static as ort_quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self._feeds = iter(feeds)

        def get_next(self):
            return next(self._feeds, None)

    ort_quantize_static(str(float_path), str(out_path), Reader(), **kwargs)
    return out_path


def corpus_feeds(path: Path) -> list[dict[str, np.ndarray]]:
    """The feeds of a corpus ``.npz`` (keyed by input name, one feed per index of axis 0)."""
    data = dict(np.load(path))
    return [{k: v[i] for k, v in data.items()} for i in range(len(next(iter(data.values()))))]


def corpus_outputs(model: Path, feeds: list[dict[str, np.ndarray]], simulate: bool) -> np.ndarray:
    """The first output over every feed, flattened; ``simulate``: Q/DQ as TensorRT computes it."""
    from trt_bridge.runtime.session import session

    sess = session(model, simulate_qdq=simulate)
    names = {i.name for i in sess.get_inputs()}
    return np.concatenate([np.asarray(sess.run(None, {k: v for k, v in f.items() if k in names})[0]).ravel()
                           for f in feeds])


def corpus_scorer(float_dir: Path, arch: str):
    """``score(model, simulate)``: the SNR in dB of ``model`` against the corpus's float ``arch`` on its held-out
    feeds (``float_dir/arch.eval.npz``); ``simulate``: Q/DQ as TensorRT computes it."""
    held_out = corpus_feeds(float_dir / f"{arch}.eval.npz")
    reference = corpus_outputs(float_dir / f"{arch}.onnx", held_out, simulate=False)
    return lambda model, simulate: snr_db(reference, corpus_outputs(model, held_out, simulate))


def convert_calibrated(source: Path, out: Path, feeds: list[dict[str, np.ndarray]]):
    """Convert ``source`` into ``out``, calibrated on ``feeds`` (saved beside ``out`` as ``calib.npz``), and assert
    what every converted test model must be: no blocker left, the Q/DQ contract kept, parsed and built ahead of time
    by TensorRT-RTX. Returns the conversion report."""
    from trt_bridge.conversion import convert
    from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions

    calib = Path(out).parent / "calib.npz"
    np.savez(calib, **{k: np.stack([f[k] for f in feeds]) for k in feeds[0]})
    report = convert(source, out, ConvertOptions(calibration=CalibrationOptions(data=str(calib)), progress=False))
    assert not report.remaining_blockers
    assert_qdq_contract(out)
    assert_tensorrt_ready(out)
    return report
