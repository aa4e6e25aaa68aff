"""Static compatibility rules: what TensorRT's ONNX parser and builder reject, found without TensorRT.

Each rule looks at one node at a time and says why TensorRT rejects it; what ``convert``
does about it is filled in afterwards from a dry run of convert's own passes
(:mod:`trt_bridge.checks`), so the two can never disagree. Facts and parser messages:
shared/docs/TENSORRT_QUANTIZATION.md.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import onnx_graphsurgeon as gs
from onnx import TensorProto

from trt_bridge.checks.findings import Finding, Severity, TensorInfo
from trt_bridge.checks.nvfp4 import FP4_DYNAMIC, in_fp4_dynamic, two_level_values
from trt_bridge.errors import MissingDependencyError
from trt_bridge.ir.dynamic_gemm import InvalidGemmNode, is_plugin_node, node_arrays
from trt_bridge.ir.tensorrt_ops import (
    MHA_SINGLE_OUTPUT,
    NO_IMPORTER,
    rotary_crashes_parser,
    rtx_imports_contrib,
)
from trt_bridge.lift import leftover_blockers
from trt_bridge.lift.scale_algebra import constant_values, is_constant, quantizer_zero_point
from trt_bridge.plugins.registry import plugin_problem
from trt_bridge.prepare.types import type_name
from trt_bridge.runtime.fp4_dynamic import DOMAIN as TRT_DOMAIN
from trt_bridge.tensorrt import import_tensorrt

QDQ = ("QuantizeLinear", "DequantizeLinear")
#: ONNX code types of a byte or less (fp8, 4-bit), as gs reports them where numpy has no such type
_NARROW_CODES = frozenset({TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ, TensorProto.FLOAT8E5M2,
                           TensorProto.FLOAT8E5M2FNUZ, TensorProto.INT4, TensorProto.UINT4, TensorProto.FLOAT4E2M1})
#: integer code types TensorRT's Q/DQ take (besides the fp8/fp4 float formats)
TRT_CODE_TYPES = frozenset({np.dtype(np.int8)})


def tensor_info(t: gs.Tensor) -> TensorInfo:

    if t.dtype is None:
        dtype = "?"
    elif isinstance(t.dtype, int):  # gs keeps types numpy lacks (bfloat16) as the ONNX enum
        dtype = type_name(t.dtype)
    else:
        dtype = np.dtype(t.dtype).name
    shape = None if t.shape is None else [d if isinstance(d, int) else (d or "?") for d in t.shape]
    return TensorInfo(t.name, dtype, shape)


def _io(node: gs.Node) -> list[TensorInfo]:
    """The node's activations in and out (scales, zero points and weights are named in the reason)."""
    return [tensor_info(t) for t in (*node.inputs, *node.outputs) if t.name and not isinstance(t, gs.Constant)]


def _finding(rule: str, node: gs.Node, why: str, severity: Severity = Severity.BLOCKER,
             tensors: list[TensorInfo] | None = None) -> Finding:
    return Finding(rule, severity, node.name, node.op, _io(node) if tensors is None else tensors, why, "", False)


class CheckRule(Protocol):
    name: str

    def find(self, node: gs.Node, graph: gs.Graph, opset: int) -> Finding | None: ...


class PluginNode:
    """trt-bridge's own plugin nodes (DynamicInt8Gemm): ready where the plugin can be built and run."""

    name = "plugin"

    def find(self, node, graph, opset):
        if not is_plugin_node(node):
            return None
        problem = plugin_problem(_installed_tensorrt())
        what = f"trt-bridge's plugin ({node.attrs.get('granularity', 'tensor')} activation scales per inference)"
        if problem is not None:
            return _finding(self.name, node, f"{what} cannot be built here: {problem}")
        try:
            k = node_arrays(node)["k"]
        except InvalidGemmNode as exc:
            return _finding(self.name, node, f"{getattr(exc, 'reason', exc)}: TensorRT cannot create the plugin")
        x = node.inputs[0].shape if node.inputs else None
        if x and isinstance(x[-1], int) and x[-1] != k:
            return _finding(self.name, node, f"its input '{node.inputs[0].name}' has {x[-1]} features, its weight "
                                             f"{k} rows: the node is inconsistent (edited by hand?)")
        return Finding(self.name, Severity.WARNING, node.name, node.op, _io(node),
                       f"{what}: engines need it registered where they run (trt-bridge's build, bench, verify and "
                       "pipeline do)", "", False)


def _installed_tensorrt():
    try:
        return import_tensorrt()
    except MissingDependencyError:
        return None


def _outputs(node: gs.Node) -> int:
    return sum(1 for t in node.outputs if t.name)


def _rotary_crash(node: gs.Node) -> bool:
    x = node.inputs[0] if node.inputs else None
    rank = None if x is None or x.shape is None else len(x.shape)
    return rotary_crashes_parser(node.op, node.domain or "", int(node.attrs.get("num_heads", 0)), rank)


class ParserCrash:
    """A node TensorRT-RTX 1.7.1's parser dies on (the process, by a signal): a com.microsoft RotaryEmbedding with
    num_heads 0 on a 3-D input (SIGFPE). ``check`` runs its parser in a child process and confirms it."""

    name = "tensorrt-crash"

    def find(self, node, graph, opset):
        if not _rotary_crash(node):
            return None
        return _finding(self.name, node, "TensorRT-RTX 1.7.1's parser crashes on a com.microsoft RotaryEmbedding with "
                                         "num_heads 0 on a 3-D input (SIGFPE: the process dies); set its num_heads "
                                         "attribute, or give it a 4-D input [batch, heads, sequence, head size]: both "
                                         "parse")


class ContribOp:
    """An onnxruntime (com.microsoft) op that TensorRT-RTX 1.7.1's parser imports (ir/tensorrt_ops.py): not a
    blocker; other TensorRT versions may send it to the plugin registry instead."""

    name = "contrib-op"

    def find(self, node, graph, opset):
        if node.domain != "com.microsoft" or not rtx_imports_contrib(node.op, _outputs(node)) or _rotary_crash(node):
            return None
        return _finding(self.name, node, f"com.microsoft.{node.op} is onnxruntime's op, not ONNX's: TensorRT-RTX "
                                         "1.7.1's parser imports it; other TensorRT versions may look for a plugin "
                                         "of that name", Severity.WARNING)


class NoImporter:
    """Integer ops and other domains' ops: the parser has no importer (custom domains go to the plugin
    registry: "Plugin not found"), except the com.microsoft ops TensorRT-RTX imports (:class:`ContribOp`)."""

    name = "no-importer"

    def find(self, node, graph, opset):
        if node.op in NO_IMPORTER:
            return _finding(self.name, node, f"TensorRT's ONNX parser has no importer for {node.op}")
        if node.domain == TRT_DOMAIN and node.op == FP4_DYNAMIC:  # TensorRT's own op: an FP4 activation (targets')
            return None
        if (node.domain or "") not in ("", "ai.onnx") and not is_plugin_node(node):
            if node.domain == "com.microsoft" and (rtx_imports_contrib(node.op, _outputs(node))
                                                   or _rotary_crash(node)):
                return None  # contrib-op's or tensorrt-crash's
            if node.domain == "com.microsoft" and node.op == "MultiHeadAttention":
                return _finding(self.name, node, f"com.microsoft.MultiHeadAttention with {_outputs(node)} outputs "
                                                 f"(past/present): TensorRT's parser rejects it (\"{MHA_SINGLE_OUTPUT}"
                                                 "\")")
            return _finding(self.name, node, f"{node.domain}.{node.op} is not an ONNX op: TensorRT looks for a "
                                             "plugin of that name and finds none")
        return None


class QDQZeroPoint:
    """Asymmetric or unsigned Q/DQ: TensorRT takes int8 codes with zero point 0 only."""

    name = "qdq-zero-point"

    def find(self, node, graph, opset):
        if node.op not in QDQ or in_fp4_dynamic(node):
            return None
        zp = quantizer_zero_point(node)
        codes = _code_type(node, zp)
        four = (codes is not None and codes.name in ("int4", "uint4")) or node.attrs.get("output_dtype") in (
            TensorProto.INT4, TensorProto.UINT4)
        if four and not _is_weight(node):  # convert makes them INT8 (reported)
            return _finding(self.name, node, "4-bit activation codes: TensorRT quantizes INT4 weights only")
        if codes is None or codes.kind not in "iu" or codes == np.int32:
            return None
        if codes not in TRT_CODE_TYPES:
            return _finding(self.name, node, f"{codes.name} codes: TensorRT quantizes to int8 only "
                                             "(\"unsupported input type of UINT8\")")
        if zp is None:
            return _finding(self.name, node, "the zero point is not a constant; TensorRT needs zero point 0")
        if np.any(zp != 0):
            return _finding(self.name, node, f"zero point {_values_text(zp)}: TensorRT takes zero point 0 only "
                                             "(\"Non-zero zero point is not supported\")")
        return None


class QDQInt32:
    """An int32 DequantizeLinear (onnxruntime's bias): TensorRT rejects int32 DQ input."""

    name = "qdq-int32"

    def find(self, node, graph, opset):
        if node.op == "DequantizeLinear" and node.inputs[0].dtype is not None \
                and not isinstance(node.inputs[0].dtype, int) and np.dtype(node.inputs[0].dtype) == np.int32:
            return _finding(self.name, node, "DequantizeLinear of int32 (a quantized bias): TensorRT's Q/DQ take "
                                             "int8, fp8, int4 or fp4 codes only")
        return None


class QDQScales:
    """Scales must be build-time constants; activations per tensor; no block quantization of activations."""

    name = "qdq-scale"

    def find(self, node, graph, opset):
        if node.op not in QDQ or in_fp4_dynamic(node):
            return None
        scale = two_level_values(node.inputs[1])
        if scale is None:
            return _finding(self.name, node, "the scale is computed at run time; TensorRT needs a constant scale")
        if not np.all(np.isfinite(scale)) or np.any(scale <= 0):
            bad = scale.reshape(-1)[~(np.isfinite(scale.reshape(-1)) & (scale.reshape(-1) > 0))]
            return _finding(self.name, node, f"scale {float(bad[0]):g} is not positive and finite: TensorRT rejects "
                                             "it (\"Scale coefficients must all be positive\")")
        blocked = bool(node.attrs.get("block_size", 0))
        if not blocked:
            for what, tensor in (("scale", node.inputs[1]), ("zero point", _input(node, 2))):
                values = None if tensor is None else constant_values(tensor)
                if values is not None and values.ndim > 1:
                    return _finding(self.name, node, f"{what} '{tensor.name}' has shape {list(values.shape)} (rank "
                                                     f"{values.ndim}) without block_size: TensorRT takes a scalar or "
                                                     "1-D (per-axis) one only (\"Invalid rank for the scale tensor\")")
        activation = not _is_weight(node)
        if blocked and activation:
            return _finding(self.name, node, "block quantization of an activation: TensorRT blocks weights only")
        if activation and node.op == "QuantizeLinear" and scale.size > 1:
            return _finding(self.name, node, f"per-axis scales ({scale.size}) on an activation: TensorRT quantizes "
                                             "activations per tensor only")
        return None


class QuantizedConstant:
    """TensorRT's builder takes a constant of int8/fp8/4-bit codes only as a DequantizeLinear's input ("Quantized
    constant (...) is only allowed before DQ"; the parser takes the model): such a constant feeding anything else
    (Cast, Transpose, Reshape, Gather), or a DequantizeLinear of a scalar (rank-0) one (AMD Quark's FP8 exports
    quantize the attention's 1/sqrt(d) so; a rank-1 constant builds, and so does a QuantizeLinear of a float
    constant). Ops without an importer are no-importer's."""

    name = "quantized-constant"

    def find(self, node, graph, opset):
        if node.op == "QuantizeLinear" or node.op in NO_IMPORTER or is_plugin_node(node) \
                or (node.domain or "") not in ("", "ai.onnx"):
            return None
        if node.op != "DequantizeLinear":
            if any(_integer_flow(t) for t in node.inputs):  # an op on codes (a QOperator model's uint8 Pad): the
                return None  # Q/DQ rules name what is wrong there, and its constant is a value of the codes' type
            for tensor in node.inputs:
                code_type = _constant_codes(tensor)
                if code_type is not None:
                    tensors = [TensorInfo(tensor.name, code_type, None if tensor.shape is None else list(
                        tensor.shape)), *(t for t in _io(node) if t.name != tensor.name)]
                    return _finding(self.name, node, f"constant '{tensor.name}' holds {code_type} codes and feeds "
                                                     f"{node.op}: TensorRT's builder takes a quantized constant only "
                                                     "as a DequantizeLinear's input", tensors=tensors)
            return None
        codes = node.inputs[0]
        values = constant_values(codes)
        if values is None or values.ndim != 0:
            return None
        if isinstance(codes.dtype, int):  # gs keeps types numpy lacks as the ONNX enum (its values cast)
            code_type = type_name(codes.dtype)
            if codes.dtype not in _NARROW_CODES:
                return None
        elif values.dtype.itemsize > 1:  # (an int32 bias: qdq-int32)
            return None
        else:
            code_type = values.dtype.name
        tensors = [TensorInfo(codes.name, code_type, []), *(t for t in _io(node) if t.name != codes.name)]
        return _finding(self.name, node, f"scalar quantized constant '{codes.name}' ({code_type} code, rank "
                                         "0): TensorRT's builder rejects it (\"Quantized constant (...) is only "
                                         "allowed before DQ\")", tensors=tensors)


class TrainingDropout:
    name = "training-dropout"

    def find(self, node, graph, opset):
        if node.op != "Dropout":
            return None
        if len(node.inputs) > 2 and node.inputs[2].name:
            mode = constant_values(node.inputs[2])
            if mode is None or bool(np.asarray(mode).reshape(-1)[0]):
                what = "a run-time" if mode is None else "true"
                return _finding(self.name, node, f"training_mode is {what}: TensorRT does not support Dropout in "
                                                 "training mode")
        return None


class ControlFlow:
    """Inside If/Loop/Scan bodies: ops TensorRT cannot import (integer or non-ONNX ops convert did not lift) and
    Q/DQ that break the Q/DQ rules above (a symmetric int8 Q/DQ, as convert writes in a body, is fine)."""

    name = "control-flow"

    def find(self, node, graph, opset):
        inner = []
        for value in node.attrs.values():
            for sub in value if isinstance(value, list) else [value]:
                if isinstance(sub, gs.Graph):  # what convert's lifting leaves in a subgraph
                    inner.extend(n for n, _ in leftover_blockers(sub) if n.op not in QDQ)
                    inner.extend(n for n in _walk(sub) if n.op in QDQ and any(
                        rule.find(n, graph, opset) is not None for rule in _QDQ_RULES))
        if not inner:
            return None
        names = ", ".join(f"{n.op} '{n.name}'" for n in inner[:5]) + (" ..." if len(inner) > 5 else "")
        return _finding(self.name, node, f"its subgraph holds ops TensorRT cannot import or Q/DQ it rejects "
                                         f"({names})", tensors=[])


def _walk(graph: gs.Graph):
    for n in graph.nodes:
        yield n
        for value in n.attrs.values():
            for sub in value if isinstance(value, list) else [value]:
                if isinstance(sub, gs.Graph):
                    yield from _walk(sub)


def _integer_flow(tensor: gs.Tensor) -> bool:
    """A computed tensor of 8-bit integer codes (what a QuantizeLinear or a QOperator op outputs)."""
    if isinstance(tensor, gs.Constant) or not tensor.inputs or tensor.dtype is None or isinstance(tensor.dtype, int):
        return False
    return np.dtype(tensor.dtype) in (np.dtype(np.int8), np.dtype(np.uint8))


def _constant_codes(tensor: gs.Tensor) -> str | None:
    """The code type of a constant holding quantized codes (int8, fp8, int4, fp4), else None; read from its type,
    not its values."""
    if not isinstance(tensor, gs.Constant) and not (len(tensor.inputs) == 1 and tensor.inputs[0].op == "Constant"):
        return None
    dtype = tensor.dtype
    if dtype is None:
        return None
    if isinstance(dtype, int):
        return type_name(dtype) if dtype in _NARROW_CODES or dtype == TensorProto.INT8 else None
    dtype = np.dtype(dtype)
    if dtype == np.int8 or dtype.name.startswith(("float8", "float4", "int4", "uint4")):
        return dtype.name
    return None


def _input(node: gs.Node, index: int) -> gs.Tensor | None:
    return node.inputs[index] if len(node.inputs) > index and node.inputs[index].name else None


def _is_weight(node: gs.Node) -> bool:
    """The Q/DQ quantizes a constant: its input is one, or (a DequantizeLinear) the output of a QuantizeLinear of
    one (AIMET's weight Q → DQ pairs)."""
    x = node.inputs[0]
    if is_constant(x):
        return True
    producer = x.inputs[0] if len(x.inputs) == 1 else None
    return node.op == "DequantizeLinear" and producer is not None and producer.op == "QuantizeLinear" \
        and bool(producer.inputs) and is_constant(producer.inputs[0])


def _code_type(node: gs.Node, zp: np.ndarray | None) -> np.dtype | None:
    if zp is not None:
        return zp.dtype
    if node.op == "DequantizeLinear" and node.inputs[0].dtype is not None and not isinstance(node.inputs[0].dtype,
                                                                                               int):
        return np.dtype(node.inputs[0].dtype)
    if node.outputs and node.outputs[0].dtype is not None and not isinstance(node.outputs[0].dtype, int):
        return np.dtype(node.outputs[0].dtype)
    return None


def _values_text(values: np.ndarray) -> str:
    flat = np.asarray(values).reshape(-1)
    if flat.size == 1:
        return str(int(flat[0]))
    return f"[{', '.join(str(int(v)) for v in flat[:4])}{', ...' if flat.size > 4 else ''}]"


#: the rules a Q/DQ node inside a control-flow body is held to
_QDQ_RULES = (QDQZeroPoint(), QDQInt32(), QDQScales())

#: every static rule, in the order findings are listed for one node
CHECK_RULES: tuple[CheckRule, ...] = (PluginNode(), ParserCrash(), ContribOp(), NoImporter(), QDQZeroPoint(),
                                      QDQInt32(), QDQScales(), QuantizedConstant(), TrainingDropout(), ControlFlow())


def is_int8(graph: gs.Graph) -> bool:
    """The model carries integer quantization of some kind (what convert turns into TensorRT's int8 Q/DQ)."""
    return any(is_plugin_node(n) or n.op in QDQ or n.op in NO_IMPORTER or n.op.startswith("QLinear") or n.op in (
        "QGemm", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QAttention", "QEmbedLayerNormalization",
        "MatMulNBits", "MatMulBnb4", "BFPQuantizeDequantize", "MXQuantizeDequantize")  # and Quark's block formats
        for n in _walk(graph))
