"""Lift AMD Quark's float-emulated block formats (``com.amd.quark`` BFP16, MX) to float + int8, FP8 or FP4
annotations.

    Before:  x ─ BFPQuantizeDequantize(block_size, bit_width) ─ y ─┬ MatMul
                                                                   └ Add
             W (constant) ─ BFPQuantizeDequantize ─ W' ─ MatMul (weight input)
    After:   x ─┬ MatMul       annotation: x → activation at MatMul:0 and Add:k, scale from calibration
                └ Add
             W ─ MatMul        annotation: W → weight, re-quantized symmetric int8 per output channel

    Before:  x ─ MXQuantizeDequantize(element_dtype fp8_e4m3) ─ MatMul ─ …      (MXFP8)
             W ─ MXQuantizeDequantize(element_dtype fp8_e4m3) ─ MatMul (weight input)
    After:   x ─ MatMul    annotation: x → FP8 activation, scale from calibration
             W ─ MatMul    annotation: W → FP8 weight, re-quantized per output channel

    Before:  W [K, N] ─ MXQuantizeDequantize(element_dtype fp4_e2m1, axis 0, block_size 32) ─ MatMul   (MXFP4)
    After:   W' = Quark's MX rounding of W ─ MatMul
             annotation: W' → FP4 blocks of 16 along K: Quark's E2M1 codes, each block's power-of-two scale

``BFPQuantizeDequantize`` and ``MXQuantizeDequantize`` round a float tensor to a block format (a shared
exponent per block of ``block_size`` values along ``axis``) and back to float, in one node; TensorRT has
no such format for activations. The nearest thing it builds is a per-tensor format, calibrated on the
calibration data (the block format carries no per-tensor scale to keep): FP8 E4M3 for MXFP8
(``element_dtype`` ``fp8_e4m3``: the same element type), int8 for everything else (BFP16, MXFP6, MXINT8). MXFP4
activations are annotated FP4: TensorRT's dynamic FP4 blocks (NVFP4, blocks of 16 with FP8 scales under a
calibrated global scale, finer than MX's 32 with powers of two) where the target runs FP4, else the nearest format
placement picks (:mod:`trt_bridge.place.formats`)::

    Before:  x ─ MXQuantizeDequantize(element_dtype fp4_e2m1, axis 1, block 32) ─ MatMul(W fp4)   (MXFP4 W4A4)
    After:   x ─ MatMul    annotation: x → FP4 (12.0: TRT_FP4DynamicQuantize; no target: INT8, its W INT4-W)
Weights are the float values (before Quark's rounding), quantized symmetric per output channel in the
same format (FP8 or int8).

MXFP4 weights of a 2-D MatMul/Gemm blocked along the reduction axis are TensorRT's FP4 weights exactly: MX
rounding (:func:`mx_quantize`: an E8M0 scale 2^(⌊log2 amax⌋ − 2) per block, the elements cast to E2M1 with
saturation at ±6) gives E2M1 codes and one power-of-two scale per block, which a blocked FP4 DequantizeLinear
computes bit for bit. Blocks of 32 are written as blocks of 16 (FP4's block in TensorRT), each scale repeated:
the same values. They are annotated as :mod:`trt_bridge.lift.dequantize_constant` annotates a FLOAT4E2M1
DequantizeLinear source, so placement keeps them FP4 for ``--compute-capability`` 10.0 and newer and makes them
INT4 blocks otherwise (:mod:`trt_bridge.place.formats`). A block whose scale would be subnormal in float32
(|values| below 2^-124: zero to float32 arithmetic) is written as zeros with scale 1 (TensorRT takes no
subnormal scale).

Every node lifted to a calibrated or re-quantized approximation is listed in the conversion report's
``approximated`` entries, and a warning says how many; an MXFP4 weight kept as FP4 blocks is exact and is not.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.annotations import ScaleSource, Site, WeightSpec
from trt_bridge.formats import FP4, FP8, INT8, QuantFormat
from trt_bridge.ir.values import FLOAT32_TINY
from trt_bridge.lift.base import LiftContext
from trt_bridge.lift.scale_algebra import constant_values
from trt_bridge.lift.weights import WEIGHT_INPUT, block_axis, lift_fp4_block_weight, weight_axis

#: the largest block taken (Quark's are 8 to 32 values): a corrupt huge one would have its padding allocated
MAX_BLOCK = 1 << 16
#: the domains AMD's quantizers write their custom ops in (Quark; Vitis AI's quantizer before it)
QUARK_DOMAINS = ("com.amd.quark", "com.vai.quantize")


@dataclass(frozen=True)
class MXElement:
    """One MX element type Quark's ``MXQuantizeDequantize`` rounds to (its ``ParseElementDataTypeString``)."""

    emax: int  # the element type's largest exponent: a block's scale is 2^(its largest exponent − emax)
    max_norm: float  # the largest element: what saturates
    dtype: np.dtype  # the ml_dtypes type whose cast rounds as Quark does (to nearest, ties to even)


#: the MX element types emulated here (``element_dtype`` → what rounds it)
MX_ELEMENTS = {
    "fp8_e4m3": MXElement(8, 448.0, np.dtype(ml_dtypes.float8_e4m3fn)),
    "fp4_e2m1": MXElement(2, 6.0, np.dtype(ml_dtypes.float4_e2m1fn)),
}

#: the format each MX element type becomes (activations, and weights that are not FP4 blocks); int8 for the rest
MX_FORMATS: dict[str, QuantFormat] = {"fp8_e4m3": FP8}


def mx_quantize(values: np.ndarray, element: str, axis: int, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Quark's MX rounding of ``values`` (``MXQuantizeDequantize``'s CPU kernel) as codes and scales: per block of
    ``block_size`` values along ``axis`` (the last block padded with zeros), the shared scale is
    2^(e − 127 − emax), e the largest biased float32 exponent in the block (that of its amax; Inf/NaN count as 0),
    and each element ``x / scale`` is cast to ``element`` (to nearest, ties to even) after clamping to its largest
    value. ``values`` has at least one axis. Returns (codes of the element's ml_dtypes type, shaped as ``values``;
    float32 power-of-two scales, shaped as ``values`` with ``axis`` divided in blocks). Inf/NaN elements, which
    Quark passes through, have no code: the caller keeps them apart (:func:`mx_round`).

    Checked bit for bit against Quark 0.13's custom-op library (MXFP4 and MXFP8; ties, zeros, float32 subnormals,
    Inf/NaN, short last blocks, 1-D and 4-D tensors): the values agree up to the sign of zero."""
    spec = MX_ELEMENTS[element]
    values = np.asarray(values, np.float32)
    axis %= values.ndim
    moved = np.moveaxis(values, axis, -1)
    length = moved.shape[-1]
    blocks = -(-length // block_size)
    padded = np.zeros((*moved.shape[:-1], blocks * block_size), np.float32)
    padded[..., :length] = moved
    exponent = (padded.view(np.uint32) >> np.uint32(23)) & np.uint32(0xFF)
    exponent = np.where(exponent == 0xFF, 0, exponent).astype(np.int32)
    shared = exponent.reshape(*moved.shape[:-1], blocks, block_size).max(axis=-1)
    scale = np.ldexp(np.float32(1.0), shared - 127 - spec.emax).astype(np.float32)
    full = np.repeat(scale, block_size, axis=-1)[..., :length]
    with np.errstate(invalid="ignore", over="ignore"):
        scaled = np.clip(moved / full, -spec.max_norm, spec.max_norm)
    codes = np.where(np.isfinite(scaled), scaled, 0).astype(spec.dtype)
    codes = np.moveaxis(codes, -1, axis).reshape(values.shape)
    return codes, np.moveaxis(scale, -1, axis).reshape(values.shape[:axis] + (blocks,) + values.shape[axis + 1:])


def mx_round(values: np.ndarray, element: str, axis: int, block_size: int) -> np.ndarray:
    """What Quark's ``MXQuantizeDequantize`` computes of float32 ``values``: :func:`mx_quantize`'s codes times
    their block's scale (exact: a power of two), Inf and NaN passed through as they are."""
    values = np.asarray(values, np.float32)
    if values.size <= 1:  # Quark's kernel returns a single value as it is
        return values
    if values.ndim == 1:  # (a 1-D tensor is blocked along its only axis, whatever ``axis`` says)
        axis = 0
    codes, scale = mx_quantize(values, element, axis, block_size)
    axis %= values.ndim
    full = np.repeat(scale, block_size, axis=axis).take(range(values.shape[axis]), axis=axis)
    rounded = (codes.astype(np.float32) * full).astype(np.float32)
    return np.where(np.isfinite(values), rounded, values)


@dataclass(frozen=True)
class BlockFormatMatch:
    node: gs.Node
    values: np.ndarray | None  # the input's values where it is a constant
    element: str  # MX element type (``element_dtype``: fp8_e4m3, fp4_e2m1, ...); "" for BFP
    axis: int  # the blocks' axis (as written: may be negative)
    block: int  # block_size


class BlockQuantizeDequantize:
    name = "block-quantize-dequantize"
    op_types = ("BFPQuantizeDequantize", "MXQuantizeDequantize")
    outcome = ("lifted by rule 'block-quantize-dequantize': TensorRT has no block floating point, so the "
               "tensor becomes FP8 (MXFP8) or int8 (activations calibrated: needs --calib-data; weights per output "
               "channel); MXFP4 weights of MatMul/Gemm blocked along the reduction axis become FP4 blocks, MXFP4 "
               "activations TensorRT's dynamic FP4 for --compute-capability 10.0+")

    def match(self, ctx: LiftContext, node: gs.Node) -> BlockFormatMatch | str:
        if (node.domain or "") not in QUARK_DOMAINS:
            return f"{node.op} of domain '{node.domain}' is not AMD Quark's (expected one of {QUARK_DOMAINS})"
        if len(node.inputs) != 1 or len(node.outputs) != 1:
            return f"expected one input and one output, found {len(node.inputs)} and {len(node.outputs)}"
        x = node.inputs[0]
        if getattr(x.dtype, "kind", "f") != "f":
            return f"the input '{x.name}' is {x.dtype}, not float"
        element = node.attrs.get("element_dtype", b"") if node.op == "MXQuantizeDequantize" else b""
        element = element.decode() if isinstance(element, bytes) else str(element)
        block = int(node.attrs.get("block_size", 32 if node.op == "MXQuantizeDequantize" else 8))
        if block <= 0 or block > MAX_BLOCK:
            return f"block_size {block} is not a block format's (1 to {MAX_BLOCK}; Quark writes 32 for MX, 8 for BFP)"
        return BlockFormatMatch(node, constant_values(x), element, int(node.attrs.get("axis", 1)), block)

    def rewrite(self, ctx: LiftContext, match: BlockFormatMatch) -> None:
        node, values = match.node, match.values
        x, y = node.inputs[0], node.outputs[0]
        fmt = MX_FORMATS.get(match.element, INT8)
        graph_outputs = any(t is y for t in ctx.graph.outputs)
        kind = f"MX {match.element}" if match.element else "block format"
        what = (f"activation, {fmt.label} scale from calibration" if values is None
                else "constant, kept float (before the block rounding)")
        if values is None and match.element == "fp4_e2m1":  # TensorRT's dynamic FP4 blocks where the target runs FP4
            fmt, what = FP4, ("activation, TensorRT's dynamic FP4 blocks of 16 (NVFP4: FP8 block scales under a "
                              "global scale from calibration) where the target runs FP4, else its nearest format")
        exact = approximated = False
        for consumer in list(y.outputs):
            for index, tensor in enumerate(consumer.inputs):
                if tensor is not y:
                    continue
                site = Site(consumer.name, index)
                if values is None:
                    consumer.inputs[index] = x
                    ctx.annotations.add_activation(x.name, site, node.name)
                    spec = ctx.annotations.activations[x.name]
                    if spec.origin == node.name:
                        spec.format = fmt
                    approximated = True
                    continue
                weighted = WEIGHT_INPUT.get(consumer.op) == index and values.ndim >= 2 and isinstance(x, gs.Constant)
                if weighted and match.element == "fp4_e2m1":
                    blocked = _fp4_blocks(consumer, values, match)
                    if not isinstance(blocked, str):
                        codes, scale = blocked
                        consumer.inputs[index] = lift_fp4_block_weight(
                            ctx, x, codes, np.zeros((), np.float32), scale, weight_axis(consumer, 2), FP4.block_size,
                            site, node.name)
                        exact = True
                        continue
                    what = f"weight, re-quantized int8 per output channel ({blocked})"
                elif weighted:
                    what = f"weight, re-quantized {fmt.label} per output channel"
                consumer.inputs[index] = x
                approximated = True
                if weighted:
                    ctx.annotations.add_weight(WeightSpec(x.name, [site], weight_axis(consumer, values.ndim),
                                                          node.name, source=ScaleSource.REQUANTIZED, format=fmt))
        if graph_outputs:  # keep the output's name: Identity from the float tensor
            y.inputs.clear()
            ctx.graph.nodes.append(gs.Node("Identity", ctx.names(f"{node.name}/float"), {}, [x], [y]))
            approximated = True
        if approximated or not exact:
            ctx.approximate(self.name, node.name, f"{node.op} ({kind}, block_size={match.block}) has no TensorRT "
                            f"equivalent: {what}")


def _fp4_blocks(consumer: gs.Node, values: np.ndarray, match: BlockFormatMatch) -> tuple[np.ndarray, np.ndarray] | str:
    """Quark's MXFP4 rounding of a MatMul/Gemm weight as FP4 codes and float32 scales in blocks of 16 along the
    reduction axis (each MX block's scale repeated), or why TensorRT's FP4 cannot take it."""
    if consumer.op not in ("MatMul", "Gemm") or values.ndim != 2:
        return f"TensorRT takes FP4 weights only of a 2-D MatMul/Gemm weight, not of {consumer.op}"
    along = block_axis(weight_axis(consumer, 2), 2)
    if match.axis % 2 != along:
        return f"the MX blocks run along axis {match.axis}, not the reduction axis {along}"
    if match.block % FP4.block_size:
        return f"blocks of {match.block} are no multiple of FP4's {FP4.block_size}"
    if values.dtype != np.float32:  # (the lifted FP4 weight is float32, as for a FLOAT4E2M1 DequantizeLinear)
        return f"the weight is {values.dtype}, and FP4 blocks are lifted from float32 weights"
    if not np.all(np.isfinite(values)):
        return "the weight is not finite"
    codes, scale = mx_quantize(values, "fp4_e2m1", along, match.block)
    tiny = scale < FLOAT32_TINY  # (below 2^-124: zero to float32 arithmetic) TensorRT takes no subnormal scale
    if np.any(tiny):
        full = np.repeat(tiny, match.block, axis=along).take(range(values.shape[along]), axis=along)
        codes = np.where(full, 0, codes.astype(np.float32)).astype(FP4.dtype)
        scale = np.where(tiny, np.float32(1), scale)
    blocks = -(-values.shape[along] // FP4.block_size)
    scale = np.repeat(scale, match.block // FP4.block_size, axis=along).take(range(blocks), axis=along)
    return codes, np.ascontiguousarray(scale, np.float32)
