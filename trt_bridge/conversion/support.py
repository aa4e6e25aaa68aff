"""What a conversion refuses up front, before any work: what the installed onnxruntime cannot run, and Q/DQ
code types trt-bridge does not convert yet."""

from __future__ import annotations

from pathlib import Path

import onnx

from trt_bridge.errors import TrtBridgeError, UnsupportedPatternError
from trt_bridge.ir.model import default_opset
from trt_bridge.ir.types import float_code_nodes
from trt_bridge.runtime.fp4_dynamic import OP as FP4_DYNAMIC
from trt_bridge.runtime.session import opset_problem


def check_supported(model: onnx.ModelProto, path: Path) -> None:
    """Refuse a model at an opset onnxruntime cannot load (it could be neither calibrated nor verified, and the
    output would keep that opset), and FP4 Q/DQ of a computed tensor (lift takes FP4 weights and TensorRT's dynamic
    FP4 activations)."""
    opset = default_opset(model)
    problem = opset_problem(opset)
    if problem:
        raise TrtBridgeError(f"{path}: the model is at ONNX opset {opset}, and {problem}: it could be neither "
                             "calibrated nor verified, and the output would keep that opset. Export the model at a "
                             "supported opset, or upgrade onnxruntime.")
    constants = {i.name for i in model.graph.initializer} | {o for n in model.graph.node if n.op_type == "Constant"
                                                              for o in n.output}
    by_name = {n.name or (n.output[0] if n.output else ""): n for n in model.graph.node}
    dynamic = {o for n in model.graph.node if n.op_type == FP4_DYNAMIC for o in n.output}
    fp4 = [(node, code) for node, code in float_code_nodes(model) if code.startswith("FLOAT4")
           and not _fp4_weight(by_name.get(node), constants)
           and not set(getattr(by_name.get(node), "input", ())) & dynamic]
    if fp4:  # FP4 Q/DQ of a computed tensor (TensorRT's dynamic FP4 quantization is lifted: lift/fp4_dynamic.py)
        node, code = fp4[0]
        raise UnsupportedPatternError(f"{path}: node '{node}' quantizes activations to {code} with a Q/DQ pair, and "
                                      f"{len(fp4)} node(s) in all do; trt-bridge converts FP4 weights and TensorRT's "
                                      f"dynamic FP4 activations ({FP4_DYNAMIC}) but not FP4 Q/DQ of activations "
                                      "yet. Give the FP4 model to TensorRT as it is (it builds FP4 for compute "
                                      "capability 10.0 and later), or convert the float model (--fp4).")


def _fp4_weight(node: onnx.NodeProto | None, constants: set[str]) -> bool:
    """An FP4 DequantizeLinear of constant codes: a weight, which the lift keeps (or approximates as INT4)."""
    return node is not None and node.op_type == "DequantizeLinear" and bool(node.input) \
        and node.input[0] in constants
