"""On a GPU runner (TRT_BRIDGE_GPU=1): the converted model's engine computes what onnxruntime does.

Runs the engine with Polygraphy's TrtRunner (which brings its own CUDA bindings), on
TensorRT or TensorRT-RTX, whichever is installed.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from helpers import quantize_dynamic, run_ort, save, snr_db

from trt_bridge import samples
from trt_bridge.conversion import convert
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions
from trt_bridge.tensorrt import import_tensorrt, is_rtx
from trt_bridge.tensorrt.build import build_engine

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("sample", ["conv_net", "transformer_block"])
def test_int8_engine_matches_onnxruntime(tmp_path, sample):
    trt = import_tensorrt()
    if is_rtx(trt):
        os.environ["POLYGRAPHY_USE_TENSORRT_RTX"] = "1"
    from polygraphy.backend.trt import EngineFromBytes, TrtRunner

    model = getattr(samples, sample)()
    fpath = save(model, tmp_path / "float.onnx")
    dpath = quantize_dynamic(fpath, tmp_path / "dynamic.onnx")
    if sample == "conv_net":
        calib, held_out = samples.image_feeds(16, 1), samples.image_feeds(8, 2)
    else:
        calib, held_out = samples.sequence_feeds(16, 1, 16, 64), samples.sequence_feeds(8, 2, 16, 64)
    np.savez(tmp_path / "calib.npz", x=calib)
    out = tmp_path / "converted.onnx"
    convert(dpath, out, ConvertOptions(
        calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")), progress=False))

    engine = build_engine(out, compute_capability=None)
    feeds = [{"x": f} for f in held_out]
    with TrtRunner(EngineFromBytes(engine)) as runner:
        gpu = [next(iter(runner.infer(feed).values())) for feed in feeds]
    simulated = run_ort(out, feeds)
    reference = run_ort(fpath, feeds)
    # int8 kernels vs float simulation of the same Q/DQ: close, never bit-exact
    assert snr_db(simulated, gpu) > 30
    assert snr_db(reference, gpu) > snr_db(reference, simulated) - 3


def test_verify_with_engine_and_loaded_reference(tmp_path):
    """The CPU/GPU split of `verify`: the reference and candidate outputs saved (as on a CPU machine), then the
    engine run on the GPU against them, with gates, through the real CLI entry point."""
    import subprocess
    import sys

    fpath = save(samples.conv_net(), tmp_path / "float.onnx")
    dpath = quantize_dynamic(fpath, tmp_path / "dynamic.onnx")
    np.savez(tmp_path / "calib.npz", x=samples.image_feeds(16, 1))
    np.savez(tmp_path / "eval.npz", x=samples.image_feeds(8, 2))
    out = tmp_path / "converted.onnx"
    convert(dpath, out, ConvertOptions(
        calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")), progress=False))
    (tmp_path / "model.engine").write_bytes(build_engine(out, compute_capability=None))

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "trt_bridge", "verify", fpath, out, *map(str, args)],
                              capture_output=True, text=True, timeout=300)

    saved = cli("--data", tmp_path / "eval.npz", "--save-outputs", tmp_path / "outputs.json",
                "--save-inputs", tmp_path / "inputs.json")
    assert saved.returncode == 0, saved.stderr
    result = cli("--engine", tmp_path / "model.engine", "--load-outputs", tmp_path / "outputs.json",
                 "--load-inputs", tmp_path / "inputs.json", "--min-snr", "25", "--json")
    assert result.returncode == 0, result.stderr
    import json

    outputs = {m["runner"]: m for m in json.loads(result.stdout)["outputs"]}
    assert set(outputs) == {"candidate", "engine"}
    assert outputs["engine"]["snr_db"] > outputs["candidate"]["snr_db"] - 3
