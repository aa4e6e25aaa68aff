"""Runtime ranges: an INT8 activation quantized on the range it has in each inference, in standard ONNX ops.

A dynamically quantized source (onnxruntime's ``DynamicQuantizeLinear``) computes every activation's scale and
zero point from the tensor itself, per inference. TensorRT's INT8 Q/DQ take a build-time scale only, so a static
conversion replaces that by one calibrated range, which costs accuracy where ranges vary from input to input
(ddddocr's CRNN: 30.5 dB as its source, 26.9 converted static). Linearity moves the range out of the Q/DQ: the
activation is normalized to a fixed integer grid before a Q/DQ of scale 1, and the layer's output is scaled back::

    Before:  x ─ Q/DQ(s_x) ─ Conv(W, b, pads) ─ y

    After:   hi = max(ReduceMax(x), 0)   lo = min(ReduceMin(x), 0)        per sample (per row: MatMul, Gemm)
             s = max((hi − lo)/254, 2⁻²⁴)  k = round((hi + lo)/2s)
             x ─ Pad(0) ─ Div(s) ─ Sub(k) ─ Q/DQ(1) ─ Conv(W, pads 0) ─ Add(k·ΣW) ─ Mul(s) ─ Add(b) ─ y

    MatMul:  x ─ Div(s) ─ Sub(k) ─ Q/DQ(1) ─ MatMul(W) ─ Add(k·Σₖ W[k, :]) ─ Mul(s) ─ y
    Gemm:    x ─ Div(s) ─ Sub(k) ─ Q/DQ(1) ─ Gemm(B, alpha) ─ Add(alpha·k·Σₖ B'[k, :]) ─ Mul(s) [─ Add(beta·C)] ─ y

x = s·(x̂ + k) exactly in real numbers, so Conv(x) = s·(Conv(x̂) + k·ΣW) for every output channel, and the only
error is x̂'s rounding to the integer grid: 255 levels over [lo, hi] of this input, as onnxruntime's uint8
(the range holds 0; k is an integer, so 0, and the padding, stay exact on the grid). The padding moves before the
normalization (a Conv pads x with 0, which is −k after it). TensorRT builds the Q/DQ(1) and Conv into an INT8
convolution; the statistics and the scaling are float ops around it (two reductions and two pointwise passes per
activation). Per sample, not per tensor as onnxruntime: a sample's result does not depend on its batch (the same
at batch 1). A MatMul's range is per row (per token), which onnxruntime's per-tensor range is a coarser case of.

Declined (the tensor keeps a calibrated scale), with the reason: a tensor that shares one scale with others, a
reader that is not input 0 of a Conv, MatMul or Gemm (transA 0) with a constant INT8 weight, a Conv whose padding
is unknown or whose bias is computed, a Gemm whose C is computed, a MatMul with a batched weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from trt_bridge.annotations import ActivationSpec, Annotations, Site
from trt_bridge.calibrate.recenter import conv_pads
from trt_bridge.ir.names import NameAllocator
from trt_bridge.lift.weights import effective_weight, float_type

#: the smallest scale: a range under 254 × 2⁻²⁴ (all but constant 0) is quantized on this step; float16 holds it
TINY = 2.0 ** -24
#: levels of the grid: x̂ ∈ [−127, 127] around the integer k
LEVELS = 254.0
OPS = ("Conv", "MatMul", "Gemm")


@dataclass(frozen=True)
class Match:
    tensor: str
    x: gs.Variable
    sites: tuple[tuple[gs.Node, int], ...]
    axes: tuple[int, ...]  # the axes the range is taken over (per sample, or per row)


def match(nodes: dict[str, gs.Node], tensors: dict[str, gs.Tensor], annotations: Annotations, spec: ActivationSpec,
          excluded: dict[str, str]) -> Match | str:
    """The rewrite of ``spec``'s tensor, or why it cannot have a runtime range (one line). ``nodes`` and ``tensors``:
    the graph's, by name (made once for all the activations matched); ``excluded``: tensors the conversion keeps
    static, with the reason (shared scales, split-off channels)."""
    if spec.tensor in excluded:
        return excluded[spec.tensor]
    if spec.format.name != "int8":
        return f"it is quantized in {spec.format.label}: runtime ranges are INT8's"
    x = tensors.get(spec.tensor)
    if x is None or isinstance(x, gs.Constant):
        return "it is not an activation of the graph"
    sites = []
    for site in spec.sites:
        node = nodes.get(site.node)
        why = _site_problem(node, site, annotations, x)
        if why:
            return why
        sites.append((node, site.index))
    if all(node.op in ("MatMul", "Gemm") for node, _ in sites):
        axes = (-1,)
    else:
        rank = len(next(node.inputs[1].shape for node, _ in sites if node.op == "Conv"))
        axes = tuple(range(1, rank))
        if any(node.op != "Conv" and (x.shape is None or len(x.shape) != rank) for node, _ in sites):
            return "a Conv and a MatMul/Gemm read it at ranks that differ (or unknown)"
    return Match(spec.tensor, x, tuple(sites), axes)


def _site_problem(node: gs.Node | None, site: Site, annotations: Annotations, x: gs.Tensor) -> str:
    if node is None:
        return f"its reader '{site.node}' is not in the graph"
    where = f"{node.op} '{node.name}'"
    if node.op not in OPS or site.index != 0:
        return f"{where} reads it as input {site.index}: only input 0 of Conv, MatMul and Gemm has a runtime range"
    weight = node.inputs[1] if len(node.inputs) > 1 else None
    if not isinstance(weight, gs.Constant) or weight.name not in annotations.weights:
        return f"{where} has no constant INT8 weight to compensate with"
    if node.op == "Conv":
        if conv_pads(node, x) is None:
            return f"{where} pads by auto_pad on an input of unknown shape"
        if len(node.inputs) > 2 and node.inputs[2].name and not isinstance(node.inputs[2], gs.Constant):
            return f"{where} has a computed bias"
    elif node.op == "Gemm":
        if node.attrs.get("transA", 0):
            return f"{where} transposes its input (transA)"
        if len(node.inputs) > 2 and node.inputs[2].name and not isinstance(node.inputs[2], gs.Constant):
            return f"{where} has a computed C"
    elif len(weight.shape) != 2:
        return f"{where} has a batched weight of rank {len(weight.shape)}"
    return ""


def grid_tensors(model: onnx.ModelProto) -> set[str]:
    """The tensors of a written model that :func:`rewrite` put on an integer grid (``x/s − k``, quantized with scale
    1): their QuantizeLinear's scale says nothing of the activation's range, which each inference computes."""
    producers = {o: n for n in model.graph.node for o in n.output}
    found = set()
    for node in model.graph.node:
        grid = producers.get(node.input[0]) if node.op_type == "QuantizeLinear" and node.input else None
        if grid is None or grid.op_type != "Sub" or len(grid.input) != 2:
            continue
        steps, code = producers.get(grid.input[0]), producers.get(grid.input[1])
        if steps is not None and steps.op_type == "Div" and code is not None and code.op_type == "Round":
            found.add(node.input[0])
    return found


def rewrite(graph: gs.Graph, names: NameAllocator, annotations: Annotations, found: Match) -> list[str]:
    """Write ``found`` (in place) and drop its annotation; returns the names of the nodes it added and of the layers
    it rewired (``--high-precision`` keeps them float32: the compensation k·ΣW cancels against the grid)."""
    x = found.x
    ftype = float_type(x, "activation")
    added: list[str] = []

    def node(op: str, inputs: list, label: str, attrs: dict | None = None, dtype=ftype, out=None) -> gs.Variable:
        out = out if out is not None else gs.Variable(names(f"{found.tensor}_{label}"), dtype=dtype)
        added.append(names(f"{found.tensor}_{label}_{op}"))
        graph.nodes.append(gs.Node(op, added[-1], attrs or {}, inputs, [out]))
        return out

    def const(label: str, value, dtype=ftype) -> gs.Constant:
        return gs.Constant(names(f"{found.tensor}_{label}"), np.asarray(value, dtype))

    axes = list(found.axes)
    if graph.opset >= 18:
        reduce = {"inputs": [const("range_axes", axes, np.int64)], "attrs": {"keepdims": 1}}
    else:
        reduce = {"inputs": [], "attrs": {"keepdims": 1, "axes": axes}}
    top = node("ReduceMax", [x, *reduce["inputs"]], "max", reduce["attrs"])
    bottom = node("ReduceMin", [x, *reduce["inputs"]], "min", reduce["attrs"])
    zero = const("zero", 0.0)
    hi = node("Max", [top, zero], "hi")
    lo = node("Min", [bottom, zero], "lo")
    step = node("Div", [node("Sub", [hi, lo], "span"), const("levels", LEVELS)], "span_step")
    step = node("Max", [step, const("tiny", TINY)], "step")
    middle = node("Div", [node("Add", [hi, lo], "twice_middle"), node("Add", [step, step], "twice_step")],
                  "middle_steps")
    k = node("Round", [middle], "middle_code")
    one, zero8 = const("one", 1.0), const("zero_point", 0, np.int8)

    def grid(value: gs.Tensor) -> gs.Variable:
        """value/s − k, through Q/DQ(1): the integer grid TensorRT's INT8 layer reads."""
        centred = node("Sub", [node("Div", [value, step], "steps"), k], "grid")
        quantized = node("QuantizeLinear", [centred, one, zero8], "quantized", dtype=np.int8)
        return node("DequantizeLinear", [quantized, one, zero8], "dequantized")

    plain = None
    for layer, index in found.sites:
        weight = layer.inputs[1]
        w = effective_weight(annotations.weights[weight.name], weight).astype(np.float64)
        value = x
        if layer.op == "Conv":
            pads = conv_pads(layer, x)
            if any(pads):
                half = len(pads) // 2
                full = [0, 0, *pads[:half], 0, 0, *pads[half:]]
                if graph.opset >= 11:
                    value = node("Pad", [x, const("pads", full, np.int64)], "padded", {"mode": "constant"})
                else:
                    value = node("Pad", [x], "padded", {"mode": "constant", "pads": full})
            layer.attrs["pads"] = [0] * len(pads)
            layer.attrs.pop("auto_pad", None)
        if value is x:
            plain = plain if plain is not None else grid(x)
            layer.inputs[index] = plain
        else:
            layer.inputs[index] = grid(value)
        added.append(layer.name)
        # a Conv's bias or a Gemm's C is added after the range is restored
        bias = layer.inputs[2] if len(layer.inputs) > 2 and layer.inputs[2].name else None
        while len(layer.inputs) > 2:  # (a synchronized list: one at a time)
            layer.inputs.pop()
        if layer.op == "Conv":
            spatial = w.ndim - 2
            sums = w.reshape(w.shape[0], -1).sum(axis=1).reshape(1, -1, *([1] * spatial))
            if bias is not None:
                bias = const("bias", np.asarray(bias.values, np.float64).reshape(1, -1, *([1] * spatial)))
        elif layer.op == "Gemm":
            b = w.T if layer.attrs.get("transB", 0) else w
            sums = float(layer.attrs.get("alpha", 1.0)) * b.sum(axis=0)
            beta = float(layer.attrs.get("beta", 1.0))
            bias = None if bias is None or beta == 0.0 else const("bias", beta * np.asarray(bias.values, np.float64))
        else:
            sums = w.sum(axis=0)
        out = layer.outputs[0]
        raw = gs.Variable(names(f"{out.name}_on_grid"), dtype=out.dtype, shape=out.shape)
        layer.outputs[0] = raw
        offset = node("Mul", [k, const("weight_sums", sums)], "offset")
        scaled = node("Mul", [node("Add", [raw, offset], "restored"), step], "scaled",
                      out=out if bias is None else None)
        if bias is not None:
            node("Add", [scaled, bias], "bias_added", out=out)
    del annotations.activations[found.tensor]
    return added
