"""Load-time repairs: models that onnxruntime runs but ``onnx.checker`` rejects, fixed as onnxruntime reads them.

Each repair runs before the checker (``model.validate_model``), changes the model in place, logs a warning that
names what it changed, and returns the names it touched (empty when the model was already valid).

- **Duplicate initializer names.** Intel Neural Compressor 1.0 names a quantized bias after the float bias it
  came from (``<bias>_quantized``, ``<bias>_scale``, ``<bias>_zero_point``); when onnxruntime's optimizer has
  merged identical float biases (zero biases, shared LayerNormalization terms) into one initializer, every node
  reading it gets its own copies under one name::

      initializers: b_quantized, b_scale#1, ..., b_quantized, b_scale#k      (k copies of each name)
      →  b_quantized, b_scale#k                                             (the last copy: what onnxruntime runs)

  onnxruntime keeps the last copy of each name ("the model will use the latest encountered initializer");
  so does this repair, so the converted model computes what the source computed.
- **A tensor with two value fields.** AIMET's QDQ export can write an initializer's values twice, in
  ``raw_data`` and in a typed field (``float_data``, ``int32_data``, ...); onnx requires one and only one.
  onnxruntime (and ``numpy_helper``) read ``raw_data`` when it is there, so the other field goes.
- **A per-axis DequantizeLinear whose scales fit another axis.** A weight's ``DequantizeLinear`` declares an
  axis whose length is not its scale's (6 scales on axis 0 of a [4, 6] Gemm weight). onnxruntime cannot run it
  as written; it runs the model only after fusing the DequantizeLinear into its integer Gemm/MatMul/Conv, which
  reads the scales per output channel. Where the scales fit the output-channel axis of every weighted op that
  reads the weight, the axis is set to that one (what onnxruntime computed); otherwise the model is refused
  with the defect named.
- **A blocked DequantizeLinear whose scales are blocked along another axis.** NNCF 3.4's grouped weight
  compression (``compress_weights(..., group_size=32)``, FP8 or INT8) writes ``axis=0`` for every weight, also where
  its blocks run along axis 1: an embedding table read by Gather ([30522, 384] codes, [30522, 12] scales) and a
  ``transB`` Gemm weight. Neither onnxruntime nor onnx's checker takes that; the scale's shape fits exactly one
  axis's blocks (``ceil(D_a / block_size)`` on that axis, the codes' length on the others), so the axis is set to
  it, the one reading of those scales there is. A scale whose shape fits no axis is refused, naming both shapes.
- **Domains used without an opset import.** INC's SmoothQuant path (with onnxruntime's optimizations off)
  writes com.microsoft ``QLinearAdd``/``QLinearMul`` into a model that imports only the default domain;
  onnxruntime assumes version 1 of such a domain, and so does this repair.
"""

from __future__ import annotations

import logging

import onnx

from trt_bridge.errors import ModelLoadError
from trt_bridge.ir.graphs import graphs
from trt_bridge.ir.tensorrt_ops import WEIGHTED, output_channel_axis

log = logging.getLogger("trt_bridge.ir.repair")


def dedupe_initializers(model: onnx.ModelProto, path="model", notes: list[str] | None = None) -> list[str]:
    """Keep the last initializer of each name (onnxruntime's rule), in every graph; return the names that had
    copies. ``notes`` receives one line per graph repaired (what the warning says, without the path)."""
    touched: list[str] = []
    for graph in graphs(model.graph):
        last = {t.name: i for i, t in enumerate(graph.initializer)}
        if len(last) == len(graph.initializer):
            continue
        dupes = sorted({t.name for i, t in enumerate(graph.initializer) if last[t.name] != i})
        differ = [n for n in dupes if len({t.SerializeToString() for t in graph.initializer if t.name == n}) > 1]
        kept = [t for i, t in enumerate(graph.initializer) if last[t.name] == i]
        copies = [onnx.TensorProto() for _ in kept]
        for copy, tensor in zip(copies, kept):
            copy.CopyFrom(tensor)
        del graph.initializer[:]
        graph.initializer.extend(copies)
        what = (f"{len(dupes)} initializer name(s) appear more than once ({', '.join(dupes[:3])}"
                f"{', ...' if len(dupes) > 3 else ''}); kept the last of each, as onnxruntime does"
                + (f" ({len(differ)} with differing values, e.g. '{differ[0]}')" if differ else
                   " (the copies are identical)"))
        log.warning("%s: %s", path, what)
        if notes is not None:
            notes.append(what)
        touched.extend(dupes)
    return touched


def drop_io_value_info(model: onnx.ModelProto, path="model") -> list[str]:
    """Drop ``value_info`` entries that name a graph input or output of the main graph; return their names.

    Their types live on the input or output itself; onnxruntime's 2019 quantizer wrote the outputs again
    in ``value_info`` without a shape (ddddocr's common_old.onnx), which onnx-graphsurgeon reads as the
    output's type, so the converted model's output lost its shape and failed onnx's checks."""
    io = {v.name for v in (*model.graph.input, *model.graph.output)}
    dropped = [v.name for v in model.graph.value_info if v.name in io]
    if dropped:
        kept = [v for v in model.graph.value_info if v.name not in io]
        del model.graph.value_info[:]
        model.graph.value_info.extend(kept)
        log.debug("%s: dropped value_info of graph inputs/outputs %s", path, ", ".join(dropped))
    return dropped


def import_used_domains(model: onnx.ModelProto, path="model", notes: list[str] | None = None) -> list[str]:
    """Import version 1 of every node domain the model uses but does not import (onnxruntime's assumption);
    return those domains. ``notes`` receives what the warning says."""
    imported = {i.domain for i in model.opset_import}
    used = {n.domain for g in graphs(model.graph) for n in g.node if n.domain not in ("", "ai.onnx")}
    missing = sorted(used - imported)
    for domain in missing:
        model.opset_import.append(onnx.helper.make_opsetid(domain, 1))
    if missing:
        what = (f"nodes of domain(s) {', '.join(missing)} without an opset import (onnx requires one); imported "
                "version 1, as onnxruntime assumes")
        log.warning("%s: %s", path, what)
        if notes is not None:
            notes.append(what)
    return missing


#: TensorProto's typed value fields (raw_data aside)
_TYPED_FIELDS = ("float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data")


def _tensors(model: onnx.ModelProto):
    """Every initializer and Constant value in every graph, with the node or graph it belongs to."""
    for graph in graphs(model.graph):
        yield from graph.initializer
        for node in graph.node:
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                yield from (a.t for a in node.attribute if a.name == "value")


def single_value_field(model: onnx.ModelProto, path="model", notes: list[str] | None = None) -> list[str]:
    """Keep one value field per tensor: ``raw_data`` where it is set (what onnxruntime reads), else the typed
    field of the tensor's data type; return the tensors repaired."""
    touched = []
    for tensor in _tensors(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            continue
        filled = [f for f in _TYPED_FIELDS if len(getattr(tensor, f))]
        if not filled or (len(filled) == 1 and not tensor.HasField("raw_data")):
            continue
        if tensor.HasField("raw_data"):
            keep = None
        else:
            keep = onnx.helper.tensor_dtype_to_field(tensor.data_type)
        for name in filled:
            if name != keep:
                tensor.ClearField(name)
        touched.append(tensor.name)
    if touched:
        what = (f"{len(touched)} tensor(s) hold their values in two fields ({', '.join(touched[:3])}"
                f"{', ...' if len(touched) > 3 else ''}); kept raw_data (or the field of the tensor's type), as "
                "onnxruntime reads them")
        log.warning("%s: %s", path, what)
        if notes is not None:
            notes.append(what)
    return touched


def _output_channel_axis(node: onnx.NodeProto, rank: int) -> int | None:
    """The axis of a weight (input 1 of ``node``) that indexes the op's output channels; None for other ops."""
    if node.op_type not in WEIGHTED:
        return None
    return output_channel_axis(node.op_type, next((a.i for a in node.attribute if a.name == "transB"), 0), rank)


def per_axis_scale_lengths(model: onnx.ModelProto, path="model", notes: list[str] | None = None) -> list[str]:
    """Set the axis of a main-graph weight DequantizeLinear whose scales fit its readers' output-channel axis and
    not the axis it declares (see the module docstring); refuse one whose scales fit neither. Returns the nodes
    repaired."""
    graph = model.graph
    dims = {t.name: list(t.dims) for t in graph.initializer}
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for position, name in enumerate(node.input):
            readers.setdefault(name, []).append((node, position))
    touched = []
    for index, node in enumerate(graph.node):
        if node.op_type != "DequantizeLinear" or len(node.input) < 2 or node.input[0] not in dims:
            continue
        shape, scale = dims[node.input[0]], dims.get(node.input[1])
        if scale is None or len(scale) != 1 or scale[0] <= 1 or not shape:
            continue
        axis_attr = next((a for a in node.attribute if a.name == "axis"), None)
        axis = axis_attr.i if axis_attr is not None else 1
        axis = axis + len(shape) if axis < 0 else axis
        if 0 <= axis < len(shape) and shape[axis] == scale[0]:
            continue
        name = node.name or f"{node.op_type}_{index}"
        reading = readers.get(node.output[0], [])
        if not reading or any(position != 1 or _output_channel_axis(r, len(shape)) is None
                              for r, position in reading):
            continue  # not a weight of a Gemm/MatMul/Conv (a bias, an activation): lifting reads it as it is
        fits = {_output_channel_axis(r, len(shape)) for r, _ in reading}
        if len(fits) != 1 or shape[next(iter(fits))] != scale[0]:
            raise ModelLoadError(
                f"{path}: DequantizeLinear '{name}' declares axis {axis} of '{node.input[0]}' {shape}, but its scale "
                f"'{node.input[1]}' has {scale[0]} values, which fit no output-channel axis of the ops reading it: "
                "onnxruntime runs such a model only after fusing the DequantizeLinear away. Re-export the model "
                "with the weight's per-channel axis set right.")
        right = next(iter(fits))
        _set_axis(node, right, path, notes, f"DequantizeLinear '{name}' declares axis {axis} of '{node.input[0]}' "
                  f"{shape}, but its {scale[0]} scales fit axis {right} (its readers' output channels), as "
                  f"onnxruntime's fused kernel reads them; set axis {right}")
        touched.append(name)
    return touched


def _set_axis(node: onnx.NodeProto, axis: int, path, notes: list[str] | None, what: str) -> None:
    """Give ``node`` the ``axis`` attribute ``axis`` and say ``what`` was repaired (a warning, and in ``notes``)."""
    attr = next((a for a in node.attribute if a.name == "axis"), None)
    if attr is None:
        node.attribute.append(onnx.helper.make_attribute("axis", axis))
    else:
        attr.i = axis
    log.warning("%s: %s", path, what)
    if notes is not None:
        notes.append(what)


def _fits_blocks(shape: list[int], scale: list[int], axis: int, block: int) -> bool:
    return len(scale) == len(shape) and all(
        s == (-(-d // block) if i == axis else d) for i, (d, s) in enumerate(zip(shape, scale)))


def block_scale_axis(model: onnx.ModelProto, path="model", notes: list[str] | None = None) -> list[str]:
    """Set the axis of a main-graph blocked DequantizeLinear (``block_size`` > 0, constant codes and scales) whose
    scale is blocked along another axis than the one it declares (see the module docstring); refuse one whose scale
    fits no axis. Returns the nodes repaired."""
    graph = model.graph
    dims = {t.name: list(t.dims) for t in graph.initializer}
    touched = []
    for index, node in enumerate(graph.node):
        block = next((a.i for a in node.attribute if a.name == "block_size"), 0)
        if node.op_type != "DequantizeLinear" or block <= 0 or len(node.input) < 2:
            continue
        shape, scale = dims.get(node.input[0]), dims.get(node.input[1])
        if not shape or scale is None:
            continue
        axis_attr = next((a for a in node.attribute if a.name == "axis"), None)
        axis = axis_attr.i if axis_attr is not None else 1
        axis = axis + len(shape) if axis < 0 else axis
        if _fits_blocks(shape, scale, axis, block):
            continue
        name = node.name or f"{node.op_type}_{index}"
        fits = [a for a in range(len(shape)) if _fits_blocks(shape, scale, a, block)]
        if len(fits) != 1:
            many = "no" if not fits else "more than one"
            raise ModelLoadError(
                f"{path}: DequantizeLinear '{name}' has blocks of {block} on axis {axis} of '{node.input[0]}' "
                f"{shape}, but its scale '{node.input[1]}' is {scale}, which fits {many} axis's blocks "
                f"(ceil(length / {block}) there, the codes' length elsewhere). Re-export the model with the scale of "
                "the blocks it computes.")
        _set_axis(node, fits[0], path, notes, f"DequantizeLinear '{name}' declares blocks of {block} on axis {axis} "
                  f"of '{node.input[0]}' {shape}, but its scale {scale} is blocked along axis {fits[0]} (NNCF's "
                  f"grouped weights of a Gather table or a transB Gemm); set axis {fits[0]}")
        touched.append(name)
    return touched
