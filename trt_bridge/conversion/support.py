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
    output would keep that opset), and FP4 Q/DQ (lift reads integer and FP8 codes only, for now)."""
    opset = default_opset(model)
    problem = opset_problem(opset)
    if problem:
        raise TrtBridgeError(f"{path}: the model is at ONNX opset {opset}, and {problem}: it could be neither "
                             "calibrated nor verified, and the output would keep that opset. Export the model at a "
                             "supported opset, or upgrade onnxruntime.")
    fp4 = [(node, code) for node, code in float_code_nodes(model) if code.startswith("FLOAT4")]
    if fp4:
        node, code = fp4[0]
        raise UnsupportedPatternError(f"{path}: node '{node}' quantizes to {code}, and {len(fp4)} Q/DQ node(s) in "
                                      "all have FP4 codes; trt-bridge converts INT8, FP8 and INT4 Q/DQ and does not "
                                      "convert FP4 yet. Give the FP4 model to TensorRT as it is (it builds FP4 for "
                                      "compute capability 10.0 and later), or convert the float model.")
