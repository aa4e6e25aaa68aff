"""Guards on the numbers a model carries: quantization scales must be finite, positive and normal, weights that
get quantized must be finite, and what convert writes must hold no non-finite value its source did not.

Scales enter through the source model (``QuantizeLinear``/``DequantizeLinear`` and the QOperator ops), scale
files and QAT imports (:mod:`trt_bridge.scales.table` checks those) and calibration (non-finite feeds are skipped
in :mod:`trt_bridge.calibrate.session`); weights through the source model. A bad value is refused with the
node or tensor that holds it, before anything is written.
"""

from __future__ import annotations

import numpy as np
import onnx

from trt_bridge.errors import UnsupportedPatternError
from trt_bridge.ir.deferred import tensor_array
from trt_bridge.ir.model import constant_protos
from trt_bridge.ir.types import FLOAT_TYPES

#: float32's smallest normal number: no scale may be smaller (a subnormal or 0 scale is refused by TensorRT
#: and onnx.checker); the one definition, for source checks, scale tables, calibration and lowering
FLOAT32_TINY = float(np.finfo(np.float32).tiny)

#: (domain, op type) → the input indices that are quantization scales
SCALE_INPUTS: dict[tuple[str, str], tuple[int, ...]] = {
    ("", "QuantizeLinear"): (1,), ("", "DequantizeLinear"): (1,),
    ("com.microsoft", "QuantizeLinear"): (1,), ("com.microsoft", "DequantizeLinear"): (1,),
    ("", "QLinearConv"): (1, 4, 6), ("", "QLinearMatMul"): (1, 4, 6),
    ("com.microsoft", "QGemm"): (1, 4, 7), ("com.microsoft", "QLinearAdd"): (1, 4, 6),
    ("com.microsoft", "QLinearMul"): (1, 4, 6), ("com.microsoft", "QLinearSigmoid"): (1, 3),
    ("com.microsoft", "QLinearLeakyRelu"): (1, 3), ("com.microsoft", "QLinearSoftmax"): (1, 3),
    ("com.microsoft", "QLinearAveragePool"): (1, 3), ("com.microsoft", "QLinearGlobalAveragePool"): (1, 3),
    ("com.microsoft", "QLinearWhere"): (2, 5, 7), ("com.microsoft", "MatMulIntegerToFloat"): (2, 3),
    ("com.microsoft", "DynamicQuantizeMatMul"): (2,),
}


def _scale_inputs(node: onnx.NodeProto) -> list[str]:
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    if (domain, node.op_type) == ("com.microsoft", "QLinearConcat"):
        return [x for i, x in enumerate(node.input) if i == 0 or (i >= 2 and (i - 2) % 3 == 1)]
    return [node.input[i] for i in SCALE_INPUTS.get((domain, node.op_type), ()) if i < len(node.input)]


def check_source_scales(model: onnx.ModelProto, where) -> None:
    """Refuse a source model with a constant quantization scale that is NaN, negative, or (per tensor) 0 or
    subnormal: a 0 would become a subnormal scale, a negative one its absolute value. An Inf scale is what
    quantizers write for a tensor that holds -Inf (an attention mask): it is logged here, and refused later
    only if the conversion would keep it (:func:`check_output_finite`, and lowering). A per-channel 0 (an
    all-zero channel) is logged too."""
    import logging

    log = logging.getLogger("trt_bridge.ir.values")
    constants = constant_protos(model)
    for node in model.graph.node:
        for name in _scale_inputs(node):
            tensor = constants.get(name)
            if tensor is None or tensor.data_type not in FLOAT_TYPES:  # bfloat16 too (ModelOpt's FP8 scales)
                continue
            values = tensor_array(tensor).astype(np.float64).ravel()
            # an int32 bias's scale is x_scale·w_scale, legitimately below float32's normal range for small
            # scales (onnxruntime's QDQ EfficientNet, MobileViT): lifting folds it into a float bias, so only a
            # NaN, negative or zero one is broken
            data = constants.get(node.input[0]) if node.op_type == "DequantizeLinear" else None
            smallest = 0.0 if data is not None and data.data_type == onnx.TensorProto.INT32 else FLOAT32_TINY
            # a constant weight's negative scales are legitimate (onnxruntime's symmetric INT4 blocks, NNCF's
            # symmetric int8 per channel: amax / −128): onnxruntime runs them, and the lift turns their sign
            weight = data is not None and data.data_type != onnx.TensorProto.INT32
            broken = values[np.isnan(values) | ((values < 0) & (not weight))]
            if values.size == 1:
                size = np.abs(values) if weight else values
                broken = values[np.isnan(values) | ~(size > 0) | ~(size >= smallest) & ~np.isinf(values)]
            if broken.size:
                raise UnsupportedPatternError(
                    f"{where}: {node.op_type} '{node.name}' has scale '{name}' = {broken[0]:g}"
                    f"{f' (and {broken.size - 1} more)' if broken.size > 1 else ''}; a quantization scale must be "
                    "finite and positive. The quantizer wrote a broken model: re-quantize it (or convert its float "
                    "model with --calib-data).")
            size = np.abs(values) if weight else values
            odd = values[~(np.isfinite(size) & (size >= smallest) & (size > 0))]
            if odd.size:
                log.warning("%s: %s '%s' has scale '%s' = %g%s; conversion refuses it if the output would keep it",
                            where, node.op_type, node.name, name, odd[0],
                            f" (and {odd.size - 1} more)" if odd.size > 1 else "")


#: op types whose constant inputs are weights (their values must be finite). Not Gather: a table read by Gather
#: (or a constant read by Add, Where, ...) may hold -Inf on purpose, a mask or a relative-position bias kept in an
#: embedding table; it stays float, and a model is refused for it only where its outputs are non-finite
#: (calibration: :func:`trt_bridge.calibrate.session.bad_feed`)
WEIGHTED_OPS = {"Conv": (1, 2), "ConvTranspose": (1, 2), "Gemm": (1, 2), "MatMul": (0, 1),
                "LayerNormalization": (1, 2), "BatchNormalization": (1, 2, 3, 4), "InstanceNormalization": (1, 2)}


def check_source_weights(model: onnx.ModelProto, where) -> None:
    """Refuse a source model whose weights (the constant inputs of Conv, Gemm, MatMul and normalizations) hold
    NaN or Inf: every value such a layer computes from them is NaN or ±Inf, and a NaN would quantize to int8 0.
    (Other constants may hold -Inf on purpose, as attention masks and bias tables do.) One tensor at a time."""
    constants = constant_protos(model)
    seen = set()
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        for i in WEIGHTED_OPS.get(node.op_type, ()):
            name = node.input[i] if i < len(node.input) else ""
            tensor = constants.get(name)
            if tensor is None or name in seen or tensor.data_type not in FLOAT_TYPES:
                continue
            seen.add(name)
            values = tensor_array(tensor)
            if node.op_type == "BatchNormalization" and i == 4 and _infinite_variance(values, name, node, where):
                continue
            try:
                check_finite_weight(name, values)
            except UnsupportedPatternError as exc:
                raise UnsupportedPatternError(f"{where}: {node.op_type} '{node.name}' reads {exc}") from None


def _infinite_variance(values: np.ndarray, name: str, node: onnx.NodeProto, where) -> bool:
    """True for a BatchNormalization variance whose non-finite values are all +Inf: those channels compute
    ``scale · (x - mean) / sqrt(Inf) + bias = bias``, finite (onnxruntime and TensorRT alike), and nothing of a
    normalization is quantized. A float16 export writes +Inf for a variance above 65504 (ModelOpt's FP8 export of
    the PP-OCRv4 text detector: 24 channels of 1e7 to 1e8); logged, since the float model computed more there."""
    import logging

    bad = ~np.isfinite(values)
    if not bad.any() or not np.all(np.isposinf(values[bad])):
        return False
    logging.getLogger("trt_bridge.ir.values").warning(
        "%s: BatchNormalization '%s' has variance '%s' = +inf in %d of %d channel(s): those channels output their "
        "bias alone, as the model computes them (a float16 export of a variance above 65504? keep the layer in "
        "float32 there, e.g. ModelOpt's --op_types_to_exclude_fp16 BatchNormalization)",
        where, node.name, name, int(bad.sum()), values.size)
    return True


def check_source_values(model: onnx.ModelProto, where) -> None:
    """Every check of the numbers a source model carries, in the order a user fixes them: quantization scales
    (:func:`check_source_scales`), MatMulNBits' block scales, float codes (:func:`check_source_codes`) and weights
    (:func:`check_source_weights`). ``convert`` and ``check`` both call it, so they agree on what is refused."""
    check_source_scales(model, where)
    check_matmul_nbits(model, where)
    check_source_codes(model, where)
    check_source_weights(model, where)


def check_matmul_nbits(model: onnx.ModelProto, where) -> None:
    """Refuse a com.microsoft MatMulNBits onnxruntime would not run, or whose numbers are broken: a block size
    that is not a power of two of at least 16, a K or N that is not positive, a bias that does not hold N values,
    and block scales holding NaN, ±Inf or a subnormal value (every weight of such a block is NaN, infinite or below
    float32's normal range: TensorRT refuses a subnormal scale and flushes such weights to 0). A negative scale
    (onnxruntime's symmetric quantizer writes them) and a 0 (a block of zeros, converted exactly) are legitimate."""
    constants = constant_protos(model)
    for node in model.graph.node:
        if node.op_type != "MatMulNBits" or node.domain != "com.microsoft" or len(node.input) < 3:
            continue
        attrs = {a.name: a.i for a in node.attribute if a.type == onnx.AttributeProto.INT}
        k, n, block = attrs.get("K", 0), attrs.get("N", 0), attrs.get("block_size", 0)
        label = f"{where}: MatMulNBits '{node.name}'"
        if block < 16 or block & (block - 1):
            raise UnsupportedPatternError(
                f"{label} has block_size={block}; onnxruntime requires a power of two of at least 16 (16, 32, 64, "
                "128, ...), so the model runs nowhere. Re-quantize it with a valid block size.")
        if k <= 0 or n <= 0:
            raise UnsupportedPatternError(f"{label} has K={k}, N={n}; both must be positive (the weight is [K, N]). "
                                          "Fix the exporter's attributes.")
        bias = constants.get(node.input[5]) if len(node.input) > 5 and node.input[5] else None
        if bias is not None and int(np.prod(bias.dims, dtype=np.int64)) != n:
            raise UnsupportedPatternError(
                f"{label} has bias '{node.input[5]}' of shape {list(bias.dims)}, but N={n}: a bias holds one value "
                "per output column ([N]). Fix the exporter (or the bias tensor).")
        tensor = constants.get(node.input[2])
        if tensor is None or tensor.data_type not in FLOAT_TYPES:
            continue
        values = tensor_array(tensor).astype(np.float64).ravel()
        size = np.abs(values)
        broken = values[~np.isfinite(values) | ((size < FLOAT32_TINY) & (size > 0))]
        if broken.size:
            raise UnsupportedPatternError(
                f"{label} has block scale '{node.input[2]}' = {broken[0]:g}"
                f"{f' (and {broken.size - 1} more)' if broken.size > 1 else ''}; a block scale must be finite and 0 "
                f"or at least float32's smallest normal ({FLOAT32_TINY:.4g}) in magnitude. The quantizer wrote a "
                "broken model: re-quantize it (or convert its float model).")


#: float code types that have NaN (and, for E5M2, ±Inf) bit patterns: float8e4m3fn's 0x7F/0xFF, the FNUZ
#: types' 0x80, E5M2's exponent all ones
_FLOAT_CODES = (onnx.TensorProto.FLOAT8E4M3FN, onnx.TensorProto.FLOAT8E4M3FNUZ, onnx.TensorProto.FLOAT8E5M2,
                onnx.TensorProto.FLOAT8E5M2FNUZ)


def check_source_codes(model: onnx.ModelProto, where) -> None:
    """Refuse a DequantizeLinear of constant float8 codes (a weight, or its zero point) holding a NaN or ±Inf bit
    pattern: that weight is NaN or infinite, and every value its layer computes too (onnxruntime runs it and
    outputs NaN; TensorRT's FP8 has no NaN code to keep)."""
    constants = constant_protos(model)
    for node in model.graph.node:
        if node.op_type != "DequantizeLinear":
            continue
        for name in (node.input[0], node.input[2] if len(node.input) > 2 else ""):
            tensor = constants.get(name)
            if tensor is None or tensor.data_type not in _FLOAT_CODES:
                continue
            values = tensor_array(tensor).astype(np.float32)
            bad = ~np.isfinite(values)
            if bad.any():
                index = int(np.argmax(bad.ravel()))
                code = values.reshape(-1)[index:index + 1]
                raw = tensor_array(tensor).reshape(-1)[index:index + 1].view(np.uint8)[0]
                raise UnsupportedPatternError(
                    f"{where}: DequantizeLinear '{node.name}' reads {onnx.TensorProto.DataType.Name(tensor.data_type)}"
                    f" codes '{name}' holding {int(bad.sum())} non-finite code(s) (e.g. 0x{raw:02X} = {code[0]}); "
                    "a quantized weight must be finite. The quantizer wrote a broken model: re-quantize it (or "
                    "convert its float model).")


def check_finite_weight(name: str, values: np.ndarray) -> None:
    """Refuse a weight with NaN or Inf before it is quantized (a NaN would become int8 0, an Inf a NaN scale)."""
    finite = np.isfinite(values)
    if not finite.all():
        count = int(values.size - np.count_nonzero(finite))
        first = values.ravel()[int(np.argmin(finite.ravel()))]
        raise UnsupportedPatternError(
            f"weight '{name}' holds {count} non-finite value(s) (e.g. {first}); it cannot be quantized. Fix the "
            "model's weights (a diverged training run or a broken export), or keep its layer in float with "
            "--exclude-nodes.")


def check_output_finite(model: onnx.ModelProto, source_nonfinite: int, where) -> None:
    """Refuse to write a converted model with a non-finite or non-positive Q/DQ scale, or with more non-finite
    constant values than its source had (an overflow made while converting: a bias folded from a huge range)."""
    constants = constant_protos(model)
    for node in model.graph.node:
        for name in _scale_inputs(node):
            tensor = constants.get(name)
            if tensor is not None and tensor.data_type in FLOAT_TYPES:
                values = tensor_array(tensor).astype(np.float64)
                if not (np.isfinite(values) & (values > 0)).all():
                    raise UnsupportedPatternError(
                        f"{where}: the converted {node.op_type} '{node.name}' would get scale '{name}' = "
                        f"{values.ravel()[0]:g}, not finite and positive; nothing is written. An input range is "
                        "beyond float32 (check the calibration data for huge values).")
    found = _nonfinite(model)
    if sum(found.values()) > source_nonfinite:
        name = next(iter(found))
        raise UnsupportedPatternError(
            f"{where}: the converted model would hold {sum(found.values()) - source_nonfinite} non-finite constant "
            f"value(s) that the source does not (first in '{name}'): an overflow from an activation range near "
            "float32's limit, or a bias dequantized with a source scale of Inf. Nothing is written. Check the "
            "calibration data for huge values and the source's scales.")


def nonfinite_count(model: onnx.ModelProto) -> int:
    """How many NaN/Inf values the model's float constants hold (attention masks and bias tables legitimately
    hold -Inf), quantization scales left out: an Inf scale never reaches the output (lifting leaves its tensor in
    float, and :func:`check_output_finite` refuses any that would), so it allows no non-finite value there."""
    scales = {name for node in model.graph.node for name in _scale_inputs(node)}
    return sum(count for name, count in _nonfinite(model).items() if name not in scales)


def _nonfinite(model: onnx.ModelProto) -> dict[str, int]:
    """Constant name → its count of NaN/Inf values, for the float constants that hold any."""
    found = {}
    for name, tensor in constant_protos(model).items():
        if tensor.data_type in FLOAT_TYPES and \
                tensor.data_location != onnx.TensorProto.EXTERNAL:
            values = tensor_array(tensor)
            count = int(values.size - np.count_nonzero(np.isfinite(values)))
            if count:
                found[name] = count
    return found
