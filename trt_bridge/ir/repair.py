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
- **Domains used without an opset import.** INC's SmoothQuant path (with onnxruntime's optimizations off)
  writes com.microsoft ``QLinearAdd``/``QLinearMul`` into a model that imports only the default domain;
  onnxruntime assumes version 1 of such a domain, and so does this repair.
"""

from __future__ import annotations

import logging

import onnx

log = logging.getLogger("trt_bridge.ir.repair")


def _graphs(graph: onnx.GraphProto):
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                yield from _graphs(sub)


def dedupe_initializers(model: onnx.ModelProto, path="model", notes: list[str] | None = None) -> list[str]:
    """Keep the last initializer of each name (onnxruntime's rule), in every graph; return the names that had
    copies. ``notes`` receives one line per graph repaired (what the warning says, without the path)."""
    touched: list[str] = []
    for graph in _graphs(model.graph):
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
    used = {n.domain for g in _graphs(model.graph) for n in g.node if n.domain not in ("", "ai.onnx")}
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
