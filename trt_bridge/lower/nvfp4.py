"""NVFP4 as TensorRT takes it (``--fp4``: W4A4, compute capability 10.0+). An FP4 activation becomes TensorRT's
dynamic FP4 quantization, its block scales computed per inference under one calibrated global scale::

    Before:  x ──────────────────────────────────────────────────────────────── MatMul(DQ(W fp4))
    After:   x ─ TRT_FP4DynamicQuantize(g; axis −1, block 16, FP8 scales) ─┬─ x4 ─ DQ(s, −1, 16) ─ MatMul
                                                                            └─ s8 ─ DQ(g) ─ s ─┘

``g`` = amax / (6 · 448) from the activation's calibrated range (:func:`trt_bridge.place.fp4.global_scale`), so a
block that reaches amax gets FP8's largest block scale. TensorRT builds this for SM 10.0 and 12.0 and refuses it for
older targets; onnxruntime runs its exact emulation (:mod:`trt_bridge.runtime.fp4_dynamic`). The ops need opset 23
(FP4 ``DequantizeLinear``) and the ``trt`` domain.

An FP4 weight's block scales go in the same two levels where they are NVFP4's (FP8 E4M3 block scales times one FP32
global scale, as :func:`trt_bridge.formats.nvfp4_scales` makes them)::

    Before:  W4 ─ DequantizeLinear(s: float32 per block of 16) ─ MatMul
    After:   W4 ─ DequantizeLinear(s8 ─ DequantizeLinear(g), per block of 16) ─ MatMul

TensorRT-RTX 1.7.1's SM 12.0 engine of a 4-layer transformer block (hidden 256) is 8.8 MiB with float32 block
scales, 6.1 MiB with the two levels.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.ir.tensor import LazyValues

from trt_bridge.formats import nvfp4_split
from trt_bridge.ir.names import NameAllocator
from trt_bridge.place.fp4 import BLOCK, global_scale
from trt_bridge.runtime.fp4_dynamic import DOMAIN, OP


def fp4_dynamic(graph: gs.Graph, names: NameAllocator, x: gs.Tensor, int8_scale: float,
                ftype: np.dtype) -> tuple[gs.Variable, gs.Constant]:
    """Append ``x``'s dynamic FP4 quantization to ``graph``; return the dequantized activation (``ftype``) and the
    global scale constant (in ``ftype``, as the scales and the output are)."""
    name = x.name
    g = gs.Constant(names(f"{name}_fp4_global_scale"), global_scale(int8_scale).astype(ftype))
    codes = gs.Variable(names(f"{name}_fp4"), dtype=onnx.TensorProto.FLOAT4E2M1)
    block_scales = gs.Variable(names(f"{name}_fp4_block_scales"), dtype=onnx.TensorProto.FLOAT8E4M3FN)
    scales = gs.Variable(names(f"{name}_fp4_scales"), dtype=ftype)
    out = gs.Variable(names(f"{name}_dequantized"), dtype=ftype)
    graph.nodes.append(gs.Node(OP, names(f"{name}_{OP}"), {"axis": -1, "block_size": BLOCK,
                                                           "scale_type": onnx.TensorProto.FLOAT8E4M3FN},
                               [x, g], [codes, block_scales], domain=DOMAIN))
    graph.nodes.append(gs.Node("DequantizeLinear", names(f"{name}_fp4_scales_DequantizeLinear"), {},
                               [block_scales, g], [scales]))
    graph.nodes.append(gs.Node("DequantizeLinear", names(f"{name}_fp4_DequantizeLinear"),
                               {"axis": -1, "block_size": BLOCK}, [codes, scales], [out]))
    return out, g


def two_level_scale(graph: gs.Graph, names: NameAllocator, name: str, scale: np.ndarray,
                    requantized: bool) -> gs.Variable | None:
    """The FP4 weight ``name``'s block ``scale`` (float32) as ``DequantizeLinear(FP8 block scales, global scale)``,
    appended to ``graph``; None where the scales are not NVFP4's: no FP8 × global pair gives them back, or a
    source's own scales are all powers of two (MXFP4's E8M0, written as they were). ``requantized``: trt-bridge
    quantized the blocks (:func:`trt_bridge.formats.nvfp4_scales`); else they are a source's (an NVFP4 export's two
    levels, multiplied out by the lift, come back)."""
    if scale.dtype != np.float32:
        return None
    if not requantized and np.all(scale > 0) and np.array_equal(np.exp2(np.round(np.log2(scale))), scale):
        return None
    split = nvfp4_split(scale)
    if split is None:
        return None
    s8, g = split
    out = gs.Variable(names(f"{name}_scale"), dtype=np.float32, shape=list(scale.shape))
    graph.nodes.append(gs.Node("DequantizeLinear", names(f"{name}_scale_DequantizeLinear"), {}, [
        gs.Constant(names(f"{name}_block_scales"), LazyValues(onnx.numpy_helper.from_array(s8, f"{name}_s8"))),
        gs.Constant(names(f"{name}_global_scale"), g)], [out]))
    return out
