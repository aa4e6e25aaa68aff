"""On a GPU runner (TRT_BRIDGE_GPU=1): `trt-bridge build` for this machine's GPU, with TensorRT or TensorRT-RTX
(whichever the shim picks): the engine deserializes with the profiles asked for, runs (Polygraphy's TrtRunner)
close to onnxruntime, its sidecar names this GPU; datacenter TensorRT's timing cache and builder flags."""

from __future__ import annotations

import os

import numpy as np
import pytest
from helpers import quantize_dynamic, run_ort, save, snr_db

from trt_bridge import samples
from trt_bridge.conversion import convert
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions
from trt_bridge.errors import TrtBridgeError
from trt_bridge.tensorrt import import_tensorrt, is_rtx
from trt_bridge.tensorrt.build import build
from trt_bridge.tensorrt.options import BuildOptions
from trt_bridge.tensorrt.profiles import Profile
from trt_bridge.tensorrt.sidecar import read_sidecar

pytestmark = pytest.mark.gpu

RANGES = (Profile({"x": ((1, 3, 32, 32), (4, 3, 32, 32), (8, 3, 32, 32))}),
          Profile({"x": ((16, 3, 32, 32), (16, 3, 32, 32), (32, 3, 32, 32))}))


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("build-gpu")
    fpath = save(samples.conv_net(channels=(8, 16)), root / "float.onnx")
    dpath = quantize_dynamic(fpath, root / "dynamic.onnx")
    np.savez(root / "calib.npz", x=samples.image_feeds(16, 1))
    out = root / "converted.onnx"
    convert(dpath, out, ConvertOptions(calibration=CalibrationOptions(data=str(root / "calib.npz")), progress=False,
                                       check=False))
    return fpath, out


def _engine(trt, path):
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    engine = runtime.deserialize_cuda_engine(path.read_bytes())
    assert engine is not None, f"{path} does not deserialize with {trt.__name__} {trt.__version__}"
    return engine


def test_engine_for_this_gpu_has_its_profiles_and_runs(converted, tmp_path):
    fpath, model = converted
    trt = import_tensorrt()
    result = build(model, tmp_path / "gpu.engine", BuildOptions(profiles=RANGES, progress=False))
    info = read_sidecar(result.engine)
    assert info["tensorrt"] == {"module": trt.__name__, "version": trt.__version__}
    device = info["target"]["device"]
    assert device is not None and device["name"] and device["compute_capability"]
    if not is_rtx(trt):
        assert info["target"]["compute_capabilities"] == [device["compute_capability"]]

    engine = _engine(trt, tmp_path / "gpu.engine")
    assert engine.num_optimization_profiles == 2
    for index, profile in enumerate(RANGES):
        got = tuple(tuple(dims) for dims in engine.get_tensor_profile_shape("x", index))
        assert got == profile.shapes["x"]

    if is_rtx(trt):
        os.environ["POLYGRAPHY_USE_TENSORRT_RTX"] = "1"
    from polygraphy.backend.trt import EngineFromBytes, TrtRunner

    feeds = [{"x": np.concatenate(samples.image_feeds(4, 2))}]  # batch 4: profile 0's opt shape
    with TrtRunner(EngineFromBytes((tmp_path / "gpu.engine").read_bytes())) as runner:
        gpu = [next(iter(runner.infer(feed).values())) for feed in feeds]
    assert gpu[0].shape == (4, 10)
    assert snr_db(run_ort(model, feeds), gpu) > 30
    assert snr_db(run_ort(fpath, feeds), gpu) > 20


def test_datacenter_timing_cache_grows_and_is_reused(converted, tmp_path):
    trt = import_tensorrt()
    if is_rtx(trt):
        pytest.skip("TensorRT-RTX's timing cache is a no-op (tests/test_build.py covers it)")
    cache = tmp_path / "timing.cache"
    options = BuildOptions(timing_cache=str(cache), progress=False)
    first = build(converted[1], tmp_path / "a.engine", options).info["timing_cache"]
    assert first["loaded_bytes"] == 0 and first["effective"] is True
    size = cache.stat().st_size
    assert first["saved_bytes"] == size > 200  # more than an empty cache's header: kernels were timed
    second = build(converted[1], tmp_path / "b.engine", options).info["timing_cache"]
    assert second["loaded_bytes"] == size and cache.stat().st_size >= size


def test_datacenter_builder_flags(converted, tmp_path):
    trt = import_tensorrt()
    if is_rtx(trt):
        pytest.skip("datacenter TensorRT only")
    options = BuildOptions(hardware_compatibility="ampere+", version_compatible=True, optimization_level=2,
                           workspace=1 << 30, progress=False)
    flags = build(converted[1], tmp_path / "compat.engine", options).info["flags"]
    assert flags["hardware_compatibility"] == "ampere+" and flags["version_compatible"] is True
    assert flags["builder_optimization_level"] == 2 and flags["workspace"] == 1 << 30

    weak = BuildOptions(weakly_typed=True, progress=False)
    if "INT8" in trt.BuilderFlag.__members__:  # TensorRT 10.x
        info = build(converted[1], tmp_path / "weak.engine", weak).info
        assert info["flags"]["strongly_typed"] is False and "int8" in info["flags"]["precision_flags"]
    else:  # TensorRT 11: strong typing only
        with pytest.raises(TrtBridgeError, match="builds strongly typed networks only"):
            build(converted[1], tmp_path / "weak.engine", weak)

    with pytest.raises(TrtBridgeError, match="builds ahead of time, which needs TensorRT-RTX"):
        build(converted[1], tmp_path / "aot.engine", BuildOptions(compute_capabilities=("8.9",), module=trt.__name__))
