"""What a conversion refuses up front, before any work: what the installed onnxruntime cannot run, and Q/DQ
code types trt-bridge does not convert yet."""

from __future__ import annotations

from pathlib import Path

import onnx

from trt_bridge.errors import TrtBridgeError, UnsupportedPatternError
from trt_bridge.ir.model import default_opset
from trt_bridge.ir.types import float_code_nodes
from trt_bridge.runtime.session import opset_problem


def check_supported(model: onnx.ModelProto, path: Path) -> None:
    """Refuse a model at an opset onnxruntime cannot load (it could be neither calibrated nor verified, and the
    output would keep that opset), and FP8/FP4 Q/DQ (lift reads integer codes only, for now)."""
    opset = default_opset(model)
    problem = opset_problem(opset)
    if problem:
        raise TrtBridgeError(f"{path}: the model is at ONNX opset {opset}, and {problem}: it could be neither "
                             "calibrated nor verified, and the output would keep that opset. Export the model at a "
                             "supported opset, or upgrade onnxruntime.")
    float_codes = float_code_nodes(model)
    if float_codes:
        node, code = float_codes[0]
        raise UnsupportedPatternError(f"{path}: node '{node}' quantizes to {code}, and {len(float_codes)} Q/DQ "
                                      "node(s) in all have floating-point (FP8/FP4) codes; trt-bridge converts "
                                      "integer (INT8) Q/DQ only and does not convert FP8 yet. Convert the float model "
                                      "instead (trt-bridge convert FLOAT.onnx --calib-data ...), or give the FP8 "
                                      "model to TensorRT as it is.")
