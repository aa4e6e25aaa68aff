"""Loading and saving: external data (the >2 GB path), atomic writes, the input never touched."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import assert_tensorrt_ready, quantize_dynamic, run_ort, save, snr_db

import trt_bridge.ir.model as model_io
import trt_bridge.ir.save as model_save
import trt_bridge.ir.size as model_size
from trt_bridge import samples
from trt_bridge.conversion import convert
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions
from trt_bridge.errors import ModelLoadError, TrtBridgeError


@pytest.fixture
def dynamic_conv_net(tmp_path):
    fpath = save(samples.conv_net(), tmp_path / "float.onnx")
    return fpath, quantize_dynamic(fpath, tmp_path / "dynamic.onnx")


def test_large_model_path_uses_external_data_end_to_end(tmp_path, monkeypatch, dynamic_conv_net):
    """With the size limit lowered, the >2 GB code path runs for real on a small model: the input is
    read with external data, calibration gets the model by path, the output is written with a
    '<name>.data' file beside it and checked from disk."""
    fpath, dpath = dynamic_conv_net
    external = tmp_path / "ext" / "dynamic.onnx"
    external.parent.mkdir()
    onnx.save(onnx.load(str(dpath)), str(external), save_as_external_data=True, all_tensors_to_one_file=True,
              location="dynamic.onnx.data", size_threshold=0)
    monkeypatch.setattr(model_size, "EXTERNAL_DATA_THRESHOLD", 1024)
    np.savez(tmp_path / "calib.npz", x=samples.image_feeds(8, seed=1))
    out = tmp_path / "out" / "converted.onnx"
    convert(external, out, ConvertOptions(calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")),
                                          progress=False))
    assert (out.parent / "converted.onnx.data").is_file()
    assert out.stat().st_size < (out.parent / "converted.onnx.data").stat().st_size
    assert sorted(p.name for p in out.parent.iterdir()) == ["converted.onnx", "converted.onnx.data"]
    onnx.checker.check_model(str(out), full_check=True)
    feeds = [{"x": f} for f in samples.image_feeds(4, seed=2)]
    assert snr_db(run_ort(fpath, feeds), run_ort(out, feeds)) > 25
    assert_tensorrt_ready(out)


def test_missing_external_data_is_a_clear_error(tmp_path, dynamic_conv_net):
    _, dpath = dynamic_conv_net
    path = tmp_path / "ext.onnx"
    onnx.save(onnx.load(str(dpath)), str(path), save_as_external_data=True, location="weights.bin",
              size_threshold=0)
    (tmp_path / "weights.bin").unlink()
    with pytest.raises(ModelLoadError, match=r"ext.onnx: external data file\(s\) missing.*'weights.bin'"):
        model_io.load_model(path)


def test_save_is_atomic_and_refuses_to_overwrite_the_input(tmp_path, dynamic_conv_net):
    _, dpath = dynamic_conv_net
    model = onnx.load(str(dpath))
    with pytest.raises(TrtBridgeError, match="refusing to overwrite the input model"):
        model_save.save_model(model, dpath, protect=(dpath,))
    target = tmp_path / "copy.onnx"
    model_save.save_model(model, target)
    assert onnx.load(str(target)) == model
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".trt-bridge-")] == []


def test_not_onnx_and_empty_graph(tmp_path):
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00\xffnot a model at all")
    with pytest.raises(ModelLoadError, match="junk.onnx: not a readable ONNX model"):
        model_io.load_model(junk)
    with pytest.raises(ModelLoadError, match="no such file"):
        model_io.load_model(tmp_path / "absent.onnx")


def test_output_never_overwrites_the_inputs_external_data(tmp_path, monkeypatch, dynamic_conv_net):
    """Input 'm.onnx' keeps its weights in 'out.onnx.data'; writing 'out.onnx' beside it with external
    data would replace that file: refused, and the input's data is untouched."""
    _, dpath = dynamic_conv_net
    src = tmp_path / "m.onnx"
    onnx.save(onnx.load(str(dpath)), str(src), save_as_external_data=True, location="out.onnx.data",
              size_threshold=0)
    data_before = (tmp_path / "out.onnx.data").read_bytes()
    monkeypatch.setattr(model_size, "EXTERNAL_DATA_THRESHOLD", 1024)
    with pytest.raises(TrtBridgeError, match="would overwrite the input model's external data"):
        convert(src, tmp_path / "out.onnx", ConvertOptions(calibration=CalibrationOptions(random=2), progress=False))
    assert (tmp_path / "out.onnx.data").read_bytes() == data_before
    assert not (tmp_path / "out.onnx").exists()


def test_calibration_feeds_are_checked_before_any_work(tmp_path, monkeypatch, dynamic_conv_net):
    """A wrong-shape feed (the UNet-timestep kind of mistake) fails at once, naming the input and both
    shapes, before the model is lifted or onnxruntime runs."""
    import trt_bridge.conversion.stages as convert_module
    from trt_bridge.errors import CalibrationDataError

    _, dpath = dynamic_conv_net
    (tmp_path / "feeds").mkdir()
    np.save(tmp_path / "feeds" / "000.npy", np.zeros((1, 3, 16, 16), np.float32))

    def must_not_run(*args, **kwargs):
        raise AssertionError("lifting started before the feeds were checked")

    monkeypatch.setattr(convert_module, "lift_model", must_not_run)
    with pytest.raises(CalibrationDataError, match=r"input 'x' expects shape \[N, 3, 32, 32\].*\[1, 3, 16, 16\]"):
        convert(dpath, tmp_path / "out.onnx", ConvertOptions(
            calibration=CalibrationOptions(data=str(tmp_path / "feeds")), progress=False))


def test_a_tensor_no_node_produces_is_named_with_its_reader(tmp_path):
    # Intel Neural Compressor's QOperator EfficientNet reads a DequantizeLinear output it never wrote; onnxruntime
    # refuses it too. No ordering can fix it: the error names the node and the tensor, not "not sorted".
    model = samples.conv_net()
    model.graph.node[1].input[0] = "lost_DequantizeLinear"
    path = save(model, tmp_path / "broken.onnx")
    with pytest.raises(ModelLoadError, match=r"node '.+' \(\w+\) reads 'lost_DequantizeLinear', which no node"):
        model_io.load_model(path)
