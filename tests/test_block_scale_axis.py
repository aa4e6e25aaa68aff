"""NNCF 3.4's grouped FP8 weight compression (issue 38, item 5): ``compress_weights(mode=FP8_E4M3, group_size=32)``
writes ``axis=0`` on every blocked DequantizeLinear, also on an embedding table read by Gather and on a ``transB``
Gemm weight whose blocks run along axis 1 (codes [30522, 384], scales [30522, 12] on a BERT). trt-bridge stopped
with an internal error ("operands could not be broadcast together with shapes (30522,384) (30522,12)"); the load
repair sets the axis the scale's shape fits, and the model converts to what NNCF meant.
"""

from __future__ import annotations

import logging

import ml_dtypes
import numpy as np
import onnx
import pytest
from helpers import assert_tensorrt_ready, run_ort, save, snr_db
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from trt_bridge.conversion import convert
from trt_bridge.conversion.options import ConvertOptions
from trt_bridge.errors import ModelLoadError

RNG = np.random.default_rng(5)
BLOCK = 32


def _blocked(name, w, axis):
    """FP8 codes, float32 block scales (blocks of 32 along ``axis``) and the float weight they give."""
    moved = np.moveaxis(w, axis, -1)
    blocks = moved.reshape(*moved.shape[:-1], -1, BLOCK)
    scale = (np.abs(blocks).max(-1) / 448).astype(np.float32)
    codes = (blocks / scale[..., None]).astype(ml_dtypes.float8_e4m3fn)
    value = np.moveaxis((codes.astype(np.float32) * scale[..., None]).reshape(moved.shape), -1, axis)
    codes = np.moveaxis(codes.reshape(moved.shape), -1, axis)
    scale = np.moveaxis(scale, -1, axis)
    tensor = numpy_helper.from_array(np.ascontiguousarray(codes).view(np.uint8), f"{name}_q")
    tensor.data_type = T.FLOAT8E4M3FN
    return [tensor, numpy_helper.from_array(np.ascontiguousarray(scale), f"{name}_s")], value


def nncf_encoder(written_axis: int = 0, table_scale=None):
    """NNCF's grouped FP8 BERT slice (the axis it writes, 0, on every DQ)::

        table:fp8[128, 64] ─ DQ(s[128, 2], axis 0!) ─ Gather(ids) ─ MatMul ─ Gemm(transB) ─ y
                             w1:fp8[64, 64] ─ DQ(s[2, 64], axis 0) ─┘          │
                             w2:fp8[16, 64] ─ DQ(s[16, 2], axis 0!) ─────────────┘
    """
    rng = np.random.default_rng(5)  # the same weights on every call
    table, table_f = _blocked("table", rng.standard_normal((128, 64)).astype(np.float32), 1)
    w1, w1_f = _blocked("w1", (rng.standard_normal((64, 64)) * 0.2).astype(np.float32), 0)
    w2, w2_f = _blocked("w2", (rng.standard_normal((16, 64)) * 0.2).astype(np.float32), 1)
    if table_scale is not None:
        table[1] = numpy_helper.from_array(table_scale, "table_s")
    nodes = [
        helper.make_node("DequantizeLinear", ["table_q", "table_s"], ["table"], axis=written_axis, block_size=BLOCK),
        helper.make_node("Gather", ["table", "ids"], ["e"]),
        helper.make_node("DequantizeLinear", ["w1_q", "w1_s"], ["w1"], axis=0, block_size=BLOCK),
        helper.make_node("MatMul", ["e", "w1"], ["h"]),
        helper.make_node("DequantizeLinear", ["w2_q", "w2_s"], ["w2"], axis=written_axis, block_size=BLOCK),
        helper.make_node("Gemm", ["h", "w2"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "nncf_fp8", [helper.make_tensor_value_info("ids", T.INT64, [8])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [8, 16])], table + w1 + w2)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model, (table_f, w1_f, w2_f)


def _feeds(count=4):
    return [{"ids": RNG.integers(0, 128, 8).astype(np.int64)} for _ in range(count)]


def test_blocks_declared_on_the_wrong_axis_convert_as_their_scales_say(tmp_path, caplog):
    source, (table, w1, w2) = nncf_encoder()
    intended, _ = nncf_encoder(written_axis=1)  # what NNCF meant: onnxruntime runs this one
    onnx.checker.check_model(intended, full_check=True)
    path, out = save(source, tmp_path / "nncf.onnx"), tmp_path / "out.onnx"
    with caplog.at_level(logging.WARNING, logger="trt_bridge.ir.repair"):
        convert(path, out, ConvertOptions(check=False, progress=False))
    assert "'table_q' [128, 64], but its scale [128, 2] is blocked along axis 1" in caplog.text
    assert "'w2_q' [16, 64], but its scale [16, 2] is blocked along axis 1" in caplog.text
    converted = onnx.load(str(out))
    ops = [n.op_type for n in converted.graph.node]
    assert {"Gather", "MatMul", "Gemm"} <= set(ops) and "DequantizeLinear" in ops
    feeds = _feeds()
    # onnxruntime on the source as NNCF meant it, and on numpy's reading of its codes
    by_source = run_ort(save(intended, tmp_path / "intended.onnx"), feeds)
    by_numpy = [(table[f["ids"]] @ w1) @ w2.T for f in feeds]
    assert snr_db(by_numpy, by_source) > 100.0
    # the MatMul/Gemm weights become INT8 per channel (TensorRT has no blocked FP8 weight): about 40 dB here
    assert snr_db(by_source, run_ort(out, feeds)) > 30.0
    assert_tensorrt_ready(out)


def test_a_block_scale_that_fits_no_axis_is_refused_naming_it(tmp_path):
    source, _ = nncf_encoder(table_scale=np.full((64, 2), 0.01, np.float32))
    with pytest.raises(ModelLoadError, match=r"DequantizeLinear '.*' has blocks of 32 on axis 0 of 'table_q' "
                                             r"\[128, 64\], but its scale 'table_s' is \[64, 2\], which fits no"):
        convert(save(source, tmp_path / "bad.onnx"), tmp_path / "out.onnx", ConvertOptions(check=False,
                                                                                          progress=False))
