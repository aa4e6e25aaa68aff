"""Placement policies: which tensors get Q/DQ in the output, and on which edges.

``tensorrt`` (the default) follows TensorRT's explicit-quantization fusion rules
(shared/docs/TENSORRT_QUANTIZATION.md):

- the data and weight inputs of weighted ops (Conv, ConvTranspose, MatMul, Gemm),
  weights per output channel; nothing on their outputs (TensorRT fuses the next Q
  into the op's epilogue);
- the skip input of a residual ``Add`` that follows a Conv, so the Add fuses into
  the conv's epilogue instead of running in higher precision;
- a Concat whose output is quantized gets its inputs quantized with one shared
  scale (its output's), so the DQ→Q pairs around it cancel;
- nothing on numerically fragile ops (Softmax, normalizations) nor on
  activation × activation MatMuls (attention scores), unless ``--include-ops`` asks;
- on a float source, nothing on layers too small for TensorRT's int8 tensor-core
  kernels to gain anything (``MIN_CHANNELS``): a MatMul/Gemm with fewer than 16 input
  or output features, a Conv with fewer than 16 channels on a side unless a side is a
  multiple of 8 and the other is wide or the layer reads the network input (the
  classic 3-channel stem), a grouped Conv whose channel count is not a multiple of 8.
  Quantizing them only adds Q/DQ and error; ``--include-ops`` forces them.

``preserve`` keeps every edge the source model quantized (TensorRT accepts Q/DQ on
any float tensor). On a float source, ``tensorrt`` decides everything; the sites
it adds need calibration. ``--exclude-nodes``/``--exclude-ops`` (regular expressions
on node names and op types) remove sites under either policy; ``--include-ops``
adds the inputs of more op types. Every edge dropped is reported with its reason.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import onnx_graphsurgeon as gs

from trt_bridge.annotations import ActivationSpec, Annotations, Site, WeightSpec
from trt_bridge.choices import PlacementOptions, PlacementPolicy
from trt_bridge.lift.weights import weight_axis

#: op type → input index of the weight
WEIGHTED = {"Conv": 1, "ConvTranspose": 1, "MatMul": 1, "Gemm": 1}
#: int8 tensor-core kernels want at least this many channels / features on a side
MIN_CHANNELS = 16


@dataclass(frozen=True)
class LeftInFloat:
    tensor: str
    node: str
    reason: str


@dataclass
class Placement:
    left_in_float: list[LeftInFloat] = field(default_factory=list)
    #: tensors that must share one scale (a Concat's inputs and output): the largest wins
    shared_scales: list[list[str]] = field(default_factory=list)
    added: int = 0  # sites added by the policy (they need calibration)


def _is_constant(t: gs.Tensor) -> bool:
    return isinstance(t, gs.Constant) or (len(t.inputs) == 1 and t.inputs[0].op == "Constant")


def excluder(options: PlacementOptions) -> Callable[[gs.Node], str | None]:
    """``excluded(node)``: why --exclude-nodes (searched in the node's name) or --exclude-ops (the whole op type)
    leaves ``node`` float, else None."""
    ops = re.compile(options.exclude_ops) if options.exclude_ops else None
    names = re.compile(options.exclude_nodes) if options.exclude_nodes else None

    def excluded(node: gs.Node) -> str | None:
        if names is not None and names.search(node.name):
            return "excluded by --exclude-nodes"
        if ops is not None and ops.fullmatch(node.op):
            return "excluded by --exclude-ops"
        return None

    return excluded


def place(graph: gs.Graph, annotations: Annotations, options: PlacementOptions = PlacementOptions(),
          can_calibrate: bool = True) -> Placement:
    """Restrict and extend the annotations to what ``options`` quantizes (in place)."""
    include = re.compile(options.include_ops) if options.include_ops else None
    excluded = excluder(options)
    nodes = {n.name: n for n in graph.nodes}
    result = Placement()
    float_source = not annotations.activations and not annotations.weights
    outputs = {t.name for t in graph.outputs}  # graph outputs are consumers too (multi-output models)

    def wanted(node: gs.Node, index: int) -> str | None:
        """None when the edge is quantized under the policy, else why not."""
        why = excluded(node)
        if why:
            return why
        if include is not None and include.fullmatch(node.op):
            return None
        if options.policy is PlacementPolicy.PRESERVE:
            return None
        if node.op in WEIGHTED and index in (0, 1):
            if node.op == "MatMul" and not any(_is_constant(t) for t in node.inputs[:2]):
                return "activation × activation MatMul (attention) stays in float; --include-ops MatMul quantizes it"
            return None
        if node.op == "Add" and _residual_skip(node, outputs) == index:
            return None
        if node.op == "Concat":
            return None  # decided below, with the Concat's output
        return f"input {index} of {node.op} is not quantized under the '{options.policy.value}' placement"

    # 1. the source's sites
    for table in (annotations.activations, annotations.weights):
        for name in sorted(table):
            spec = table[name]
            keep = []
            for site in spec.sites:
                node = nodes.get(site.node)
                why = "the node is gone" if node is None else wanted(node, site.index)
                if why is None:
                    keep.append(site)
                else:
                    result.left_in_float.append(LeftInFloat(name, site.node, why))
            spec.sites = keep
            if not keep:
                del table[name]

    # 2. what the policy adds: every weighted op of a float source, residual skips, more --include-ops
    if can_calibrate and options.policy is PlacementPolicy.TENSORRT:
        for node in graph.nodes:
            if excluded(node):
                continue
            if float_source and node.op in WEIGHTED:
                _annotate_weighted(node, annotations, result, wanted, include)
            elif node.op == "Add" and (skip := _residual_skip(node, outputs)) is not None and _conv_is_quantized(
                    node, skip, annotations) and (float_source or _quantized_in(node, annotations)):
                _annotate_input(node, skip, annotations, result)
            elif include is not None and include.fullmatch(node.op) and node.op != "Concat":
                for index, t in enumerate(node.inputs):
                    if not _is_constant(t) and (t.dtype is None or _is_float(t)):
                        _annotate_input(node, index, annotations, result)

    # 3. Concats whose output is quantized: inputs share the output's scale
    if options.policy is PlacementPolicy.TENSORRT:
        for node in graph.nodes:
            if node.op != "Concat" or excluded(node):
                continue
            out = node.outputs[0].name
            if out not in annotations.activations:
                continue
            inputs = [t for t in node.inputs if not _is_constant(t)]
            if not all(t.name in annotations.activations or can_calibrate for t in inputs):
                continue
            for index, t in enumerate(node.inputs):
                if not _is_constant(t):
                    _annotate_input(node, index, annotations, result)
            result.shared_scales.append(sorted({out, *(t.name for t in inputs)}))
    return result


def _is_float(t: gs.Tensor) -> bool:
    import numpy as np
    import onnx

    if isinstance(t.dtype, int):  # onnx-graphsurgeon keeps types numpy lacks as the ONNX enum
        return t.dtype in (onnx.TensorProto.BFLOAT16, onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT)
    return t.dtype is not None and np.issubdtype(np.dtype(t.dtype), np.floating)


def _conv_is_quantized(add: gs.Node, skip: int, annotations: Annotations) -> bool:
    """The Conv feeding the other input of a residual Add is quantized (else there is nothing to fuse into)."""
    conv = add.inputs[1 - skip].inputs[0]
    return len(conv.inputs) > 1 and conv.inputs[1].name in annotations.weights


def _quantized_in(node: gs.Node, annotations: Annotations) -> bool:
    """Whether a quantized tensor feeds ``node`` (a residual Add of a quantized source)."""
    return any(t.name in annotations.activations for t in node.inputs)


def _residual_skip(node: gs.Node, graph_outputs: set[str] = frozenset()) -> int | None:
    """For Add(conv_out, skip): the index of the skip input, if this Add can fuse into the Conv.

    The conv's output must have no reader but the Add: a conv output that is also a graph output
    (a multi-output model's hidden state) must be written out, so the Add cannot fuse into it."""
    if len(node.inputs) != 2:
        return None
    producers = [t.inputs[0] if len(t.inputs) == 1 else None for t in node.inputs]
    for i, p in enumerate(producers):
        other = node.inputs[1 - i]
        if p is not None and p.op in ("Conv", "ConvTranspose") and len(node.inputs[i].outputs) == 1 \
                and node.inputs[i].name not in graph_outputs \
                and not _is_constant(other) and node.inputs[i].shape == other.shape \
                and (producers[1 - i] is None or producers[1 - i].op not in ("Conv", "ConvTranspose")
                     or i == 0):
            return 1 - i
    return None


def _annotate_input(node: gs.Node, index: int, annotations: Annotations, result: Placement) -> None:
    t = node.inputs[index]
    spec = annotations.activations.get(t.name)
    site = Site(node.name, index)
    if spec is None:
        annotations.activations[t.name] = ActivationSpec(t.name, [site], node.name, placed=True)
        result.added += 1
    elif site not in spec.sites:
        spec.sites.append(site)


def _cast_from_integers(t: gs.Tensor) -> bool:
    """Whether ``t`` is a ``Cast`` of integers to float (through reshapes and transposes)."""
    import numpy as np

    while len(t.inputs) == 1:
        node = t.inputs[0]
        if node.op == "Cast":
            source = node.inputs[0].dtype
            return source is not None and not isinstance(source, int) and np.issubdtype(np.dtype(source), np.integer)
        if node.op not in ("Unsqueeze", "Squeeze", "Reshape", "Transpose", "Expand", "Flatten", "Identity"):
            return False
        t = node.inputs[0]
    return False


def _too_small(node: gs.Node, weight: gs.Tensor) -> str | None:
    """Why ``node`` is too small for TensorRT's int8 kernels to be worth its Q/DQ, or None."""
    shape = weight.shape
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    hint = "stays in float; --include-ops forces it"
    if node.op in ("Conv", "ConvTranspose") and len(shape) >= 3:
        c_out, c_in = (shape[0], shape[1]) if node.op == "Conv" else (shape[1], shape[0])
        group = int(node.attrs.get("group", 1))
        if group > 1:
            return None if c_out % 8 == 0 else f"grouped conv with {c_out} output channels (not a multiple of 8) {hint}"
        if min(c_in, c_out) >= MIN_CHANNELS:
            return None
        stem = any(not t.inputs for t in node.inputs[:1])  # reads a graph input
        if (c_in % 8 == 0 or c_out % 8 == 0) and (max(c_in, c_out) >= MIN_CHANNELS or stem):
            return None
        return f"conv with {c_in} → {c_out} channels is too small for int8 kernels; {hint}"
    if node.op in ("MatMul", "Gemm") and len(shape) >= 2:
        k, n = shape[-2], shape[-1]
        if node.op == "Gemm" and node.attrs.get("transB", 0):
            k, n = n, k
        if min(k, n) < MIN_CHANNELS:
            return f"{node.op} with K={k}, N={n} is too small for int8 kernels; {hint}"
    return None


def _annotate_weighted(node: gs.Node, annotations: Annotations, result: Placement, wanted, include) -> None:
    w_index = WEIGHTED[node.op]
    if len(node.inputs) <= w_index:
        return
    weight = node.inputs[w_index]
    if not _is_constant(weight):
        counted = next((t for t in node.inputs[:2] if _cast_from_integers(t)), None)
        if counted is not None:  # Llama's rotary inv_freq @ Cast(position_ids): int8 would round the positions
            result.left_in_float.append(LeftInFloat(counted.name, node.name, "it reads integers cast to float "
                                                    "(positions, counts), which int8 cannot hold"))
            return
        why = wanted(node, 0)
        if why is None:  # activation × activation, asked for with --include-ops
            for index in (0, 1):
                _annotate_input(node, index, annotations, result)
        else:
            result.left_in_float.append(LeftInFloat(node.inputs[0].name, node.name, why))
        return
    if node.op == "Gemm" and node.attrs.get("transA", 0):
        return
    small = _too_small(node, weight)
    if small and not (include is not None and include.fullmatch(node.op)):
        result.left_in_float.append(LeftInFloat(node.inputs[0].name, node.name, small))
        return
    if not _is_float(node.inputs[0]) and node.inputs[0].dtype is not None:
        return
    _annotate_input(node, 0, annotations, result)
    rank = len(weight.shape)
    spec = annotations.weights.get(weight.name)
    if spec is None:
        annotations.weights[weight.name] = WeightSpec(weight.name, [Site(node.name, w_index)],
                                                      weight_axis(node, rank), node.name, placed=True)
    elif Site(node.name, w_index) not in spec.sites:
        spec.sites.append(Site(node.name, w_index))
