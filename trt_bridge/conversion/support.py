"""What a conversion refuses up front, before any work: what the installed onnxruntime cannot run, and FP4
Q/DQ that TensorRT has no form of."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from trt_bridge.errors import TrtBridgeError, UnsupportedPatternError
from trt_bridge.ir.model import default_opset
from trt_bridge.ir.types import float_code_nodes
from trt_bridge.lift.fp4_activation_qdq import fp4_qdq_problem
from trt_bridge.runtime.fp4_dynamic import OP as FP4_DYNAMIC
from trt_bridge.runtime.session import opset_problem


def check_supported(model: onnx.ModelProto, path: Path) -> None:
    """Refuse a model at an opset onnxruntime cannot load (it could be neither calibrated nor verified, and the
    output would keep that opset), and FP4 Q/DQ of a computed tensor that TensorRT has no FP4 form of (a scale that
    is not constant, finite and positive, a zero point that is not 0, a per-axis or block layout it cannot take),
    naming the node: lift takes FP4 weights, TensorRT's dynamic FP4 activations and FP4 Q/DQ pairs of activations."""
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
    fp4 = [(by_name.get(node), node, code) for node, code in float_code_nodes(model) if code.startswith("FLOAT4")
           and not _fp4_weight(by_name.get(node), constants)
           and not set(getattr(by_name.get(node), "input", ())) & dynamic]
    quantized = {n.output[0] for n, _, _ in fp4 if n is not None and n.op_type == "QuantizeLinear" and n.output}
    for node, name, code in fp4:  # FP4 Q/DQ of a computed tensor: lift/fp4_activation_qdq.py, where TensorRT has it
        if node is not None and node.op_type == "QuantizeLinear" and node.input and node.input[0] not in constants:
            problem = fp4_qdq_problem(*_qdq_params(model, node))
        elif node is not None and node.op_type == "DequantizeLinear" and node.input[0] in quantized:
            problem = None  # the other half of a pair: the lift checks it reads the Q's codes with its scale
        else:
            problem = "its codes are not those of a Q/DQ pair of a computed tensor"
        if problem:
            raise UnsupportedPatternError(f"{path}: node '{name}' ({code} Q/DQ of an activation): {problem}. Fix the "
                                          "export, or convert the float model (--fp4).")


def _qdq_params(model: onnx.ModelProto, node: onnx.NodeProto) -> tuple:
    """A QuantizeLinear's (scale, zero point, axis, block size); a scale or zero point that is not a constant: None."""
    values = {i.name: i for i in model.graph.initializer}
    values.update({n.output[0]: a.t for n in model.graph.node if n.op_type == "Constant" and n.output
                   for a in n.attribute if a.name == "value"})

    def read(index: int):
        name = node.input[index] if len(node.input) > index else ""
        return onnx.numpy_helper.to_array(values[name]) if name in values else None

    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    zero = read(2) if len(node.input) > 2 and node.input[2] else np.zeros(())
    return read(1), zero, int(attrs.get("axis", 1)), int(attrs.get("block_size", 0))


def _fp4_weight(node: onnx.NodeProto | None, constants: set[str]) -> bool:
    """An FP4 DequantizeLinear of constant codes: a weight, which the lift keeps (or approximates as INT4)."""
    return node is not None and node.op_type == "DequantizeLinear" and bool(node.input) \
        and node.input[0] in constants
