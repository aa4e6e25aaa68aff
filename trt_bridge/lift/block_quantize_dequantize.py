"""Lift AMD Quark's float-emulated block formats (``com.amd.quark`` BFP16, MX) to float + int8 annotations.

    Before:  x ─ BFPQuantizeDequantize(block_size, bit_width) ─ y ─┬ MatMul
                                                                   └ Add
             W (constant) ─ BFPQuantizeDequantize ─ W' ─ MatMul (weight input)
    After:   x ─┬ MatMul       annotation: x → activation at MatMul:0 and Add:k, scale from calibration
                └ Add
             W ─ MatMul        annotation: W → weight, re-quantized symmetric int8 per output channel

``BFPQuantizeDequantize`` and ``MXQuantizeDequantize`` round a float tensor to a block format (a shared
exponent per block of ``block_size`` values along ``axis``) and back to float, in one node; TensorRT has
no such format. The nearest thing it builds is int8: activations are calibrated per tensor on the
calibration data (the block format carries no per-tensor scale to keep), weights are the float values,
quantized symmetric per output channel. Every node lifted this way is listed in the conversion report's
``approximated`` entries, and a warning says how many.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.annotations import ScaleSource, Site, WeightSpec
from trt_bridge.lift.base import LiftContext
from trt_bridge.lift.scale_algebra import constant_values
from trt_bridge.lift.weights import WEIGHT_INPUT, weight_axis

#: the domains AMD's quantizers write their custom ops in (Quark; Vitis AI's quantizer before it)
QUARK_DOMAINS = ("com.amd.quark", "com.vai.quantize")


@dataclass(frozen=True)
class BlockFormatMatch:
    node: gs.Node
    values: np.ndarray | None  # the input's values where it is a constant


class BlockQuantizeDequantize:
    name = "block-quantize-dequantize"
    op_types = ("BFPQuantizeDequantize", "MXQuantizeDequantize")
    outcome = ("lifted by rule 'block-quantize-dequantize': TensorRT has no block floating point, so the "
               "tensor becomes int8 (activations calibrated: needs --calib-data; weights per output channel)")

    def match(self, ctx: LiftContext, node: gs.Node) -> BlockFormatMatch | str:
        if (node.domain or "") not in QUARK_DOMAINS:
            return f"{node.op} of domain '{node.domain}' is not AMD Quark's (expected one of {QUARK_DOMAINS})"
        if len(node.inputs) != 1 or len(node.outputs) != 1:
            return f"expected one input and one output, found {len(node.inputs)} and {len(node.outputs)}"
        x = node.inputs[0]
        if getattr(x.dtype, "kind", "f") != "f":
            return f"the input '{x.name}' is {x.dtype}, not float"
        return BlockFormatMatch(node, constant_values(x))

    def rewrite(self, ctx: LiftContext, match: BlockFormatMatch) -> None:
        node, values = match.node, match.values
        x, y = node.inputs[0], node.outputs[0]
        graph_outputs = any(t is y for t in ctx.graph.outputs)
        what = "activation, int8 scale from calibration" if values is None else "constant, kept float"
        for consumer in list(y.outputs):
            for index, tensor in enumerate(consumer.inputs):
                if tensor is not y:
                    continue
                consumer.inputs[index] = x
                site = Site(consumer.name, index)
                if values is None:
                    ctx.annotations.add_activation(x.name, site, node.name)
                elif WEIGHT_INPUT.get(consumer.op) == index and values.ndim >= 2 and isinstance(x, gs.Constant):
                    ctx.annotations.add_weight(WeightSpec(x.name, [site], weight_axis(consumer, values.ndim),
                                                          node.name, source=ScaleSource.REQUANTIZED))
                    what = "weight, re-quantized int8 per output channel"
        if graph_outputs:  # keep the output's name: Identity from the float tensor
            y.inputs.clear()
            ctx.graph.nodes.append(gs.Node("Identity", ctx.names(f"{node.name}/float"), {}, [x], [y]))
        ctx.approximate(self.name, node.name, f"{node.op} (block format, block_size="
                        f"{node.attrs.get('block_size', '?')}) has no TensorRT equivalent: {what}")
