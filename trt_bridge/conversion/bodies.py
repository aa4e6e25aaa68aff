"""Quantize inside control-flow bodies: place, calibrate and lower each If branch and Loop/Scan body as a graph of
its own.

Before (lifted; the stages place, calibrate and lower the main graph)::

    xs ─▶ If ─ then: Conv(xs, W1) → Relu → LSTM → MatMul(h, W2) ─▶ logits
             └ else: Conv(xs, W3) → Relu → LSTM → MatMul(h, W4)

After::

    xs ─▶ If ─ then: Q/DQ(xs) → Conv(·, DQ(W1:int8)) → Relu → LSTM → Q/DQ(h) → MatMul(·, DQ(W2:int8)) ─▶ logits
             └ else: Q/DQ(xs) → Conv(·, DQ(W3:int8)) → ...

- **place**: each body under the conversion's placement options (``place.policies.place``): the sites lifting
  annotated there (``LiftContext.body_annotations``: a dynamic source's), or, in a float body, the policy's own;
- **ranges**: a dynamic source's activations in bodies keep a range per inference, as the source computed them
  (``lower/runtime_ranges``, unless ``--runtime-ranges off``; in bodies ``auto`` does not judge them against
  static scales);
- **calibrate** the others: one onnxruntime pass over the calibration feeds on a copy of the float model whose
  control-flow nodes pass the wanted body tensors out as extra outputs (:func:`expose`: an If's branch not taken
  passes an empty tensor, which the observers skip; a Loop/Scan body passes its values of every iteration as a scan
  output). The range method is the conversion's (``auto`` takes the one it chose for the main graph, else max); no
  give-back, bias correction, smoothing or re-centring in bodies;
- **lower**: each body's Q/DQ written inside it (``lower.qdq.lower``), an outer-scope tensor quantized in each body
  that reads it.

Anything without calibration data to give it a scale stays float, and so do the bodies of ops other than If, Loop
and Scan.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import helper, numpy_helper

from trt_bridge.annotations import Annotations, ScaleSource, drop_layers
from trt_bridge.calibrate.feeds import FeedSource
from trt_bridge.calibrate.observers import CalibMethod
from trt_bridge.calibrate.session import CalibrationResult, calibrate
from trt_bridge.conversion import runtime_choice
from trt_bridge.conversion.builder_forms import builder_forms
from trt_bridge.conversion.options import ConvertOptions
from trt_bridge.ir.export import export_model
from trt_bridge.ir.graphs import graphs
from trt_bridge.ir.names import NameAllocator
from trt_bridge.lower.qdq import QuantizedTensor, lower
from trt_bridge.place.formats import assign_formats
from trt_bridge.place.policies import LeftInFloat, place
from trt_bridge.place.shared import share_scales


@dataclass
class BodyQuantization:
    """What :func:`quantize_bodies` did: the tensors it quantized inside bodies and the sites it left float."""

    quantized: list[QuantizedTensor] = field(default_factory=list)
    left_in_float: list[LeftInFloat] = field(default_factory=list)
    bodies: int = 0  # If branches and Loop/Scan bodies placed
    floating: list[str] = field(default_factory=list)  # nodes of other ops whose bodies stay float

    def to_dict(self) -> dict | None:
        """The report's ``control_flow`` (None for a model without control flow)."""
        if not (self.bodies or self.floating):
            return None
        return {"bodies": self.bodies, "float_bodies": self.floating,
                "left_in_float": [asdict(x) for x in self.left_in_float]}


#: control-flow op → the attributes holding its bodies (what :func:`expose` can pass values out of)
BODIES = {"If": ("then_branch", "else_branch"), "Loop": ("body",), "Scan": ("body",)}


def bodies(graph: gs.Graph) -> list[gs.Graph]:
    """Every If branch and Loop/Scan body under ``graph`` (reached through those ops only), outer ones first."""
    found = []
    for node in graph.nodes:
        for key in BODIES.get(node.op, ()):
            body = node.attrs.get(key)
            if isinstance(body, gs.Graph):
                found.append(body)
                found.extend(bodies(body))
    return found


def _others(graph: gs.Graph) -> list[str]:
    """The nodes of other ops that hold a graph (a custom domain's), whose bodies stay float."""
    found = []
    for g in [graph, *bodies(graph)]:
        found.extend(n.name for n in g.nodes if n.op not in BODIES and any(
            isinstance(v, gs.Graph) or (isinstance(v, list) and any(isinstance(x, gs.Graph) for x in v))
            for v in n.attrs.values()))
    return found


def _restricted(annotations: Annotations, nodes: set[str]) -> Annotations:
    """Copies of the specs of ``annotations`` with only the sites on ``nodes`` (specs without one left out)."""
    mine = Annotations()
    for name, spec in annotations.activations.items():
        sites = [s for s in spec.sites if s.node in nodes]
        if sites:
            mine.activations[name] = replace(spec, sites=sites)
    for name, spec in annotations.weights.items():
        sites = [s for s in spec.sites if s.node in nodes]
        if sites:
            mine.weights[name] = replace(spec, sites=sites)
    return mine


def quantize_bodies(graph: gs.Graph, annotations: Annotations, options: ConvertOptions, feeds: FeedSource | None,
                    calibration: CalibrationResult | None = None) -> BodyQuantization:
    """Place, calibrate and lower every If branch and Loop/Scan body of the float ``graph`` (in place);
    ``annotations``: what lifting annotated inside bodies; ``calibration``: the main graph's (its range method is
    the bodies'; max where it has none). Call before the main graph is lowered (calibration runs the float model)."""
    method = calibration.method if calibration is not None else (
        CalibMethod.MAX if options.calibration.method is CalibMethod.AUTO else options.calibration.method)
    percentile = (calibration.percentile if calibration is not None else None) or options.calibration.percentile
    runtime = options.activations.runtime_ranges
    result = BodyQuantization(floating=_others(graph))
    found = bodies(graph)
    if not found:
        return result
    placed = []
    for body in found:
        mine = _restricted(annotations, {n.name for n in body.nodes})
        placement = place(body, mine, options.placement, feeds is not None)
        # --fp8 quantizes the bodies in FP8 too; --int4 their MatMul weights (a branch without one refuses nothing)
        assign_formats(body, mine, options.formats, placement=options.placement, body=True)
        forms = builder_forms(body, mine, options.formats.trt_module, options.formats.compute_capability, body=True)
        result.left_in_float.extend(LeftInFloat("", c.tensor, c.reason) for c in forms if c.format == "float")
        result.left_in_float.extend(placement.left_in_float)
        placed.append((body, mine, placement))
    result.bodies = len(placed)
    if runtime != "off":  # the dynamic source's activations keep a range per inference, as in the source
        for body, mine, placement in placed:
            shared = {t: "it shares one scale with other tensors" for group in placement.shared_scales for t in group}
            found, _, _ = runtime_choice.eligible(body, mine, mine.needing_calibration(), runtime == "on", shared)
            runtime_choice.mark(mine, found)
    needed = sorted({t for _, mine, _ in placed for t in mine.needing_calibration()})
    scales = {} if not needed or feeds is None else _calibrated(graph, needed, feeds, method, percentile,
                                                                 options.progress)
    names = NameAllocator(graph)
    for body, mine, placement in placed:
        missing = [t for t in mine.needing_calibration() if t not in scales]
        for name in missing:
            why = "no calibration data gives it a scale" if feeds is None else "no calibration feed reached it"
            result.left_in_float.extend(LeftInFloat(name, s.node, why) for s in mine.activations[name].sites)
        drop_layers(mine, {s.node for t in missing for s in mine.activations[t].sites})
        for name, spec in mine.activations.items():
            if spec.scale is None and not spec.runtime:
                spec.scale, spec.source = scales[name], ScaleSource.CALIBRATION
        share_scales(mine, placement.shared_scales)
        result.quantized.extend(lower(body, mine, names=names))
    return result


def _calibrated(graph: gs.Graph, needed: list[str], feeds: FeedSource, method: CalibMethod, percentile: float,
                progress: bool) -> dict[str, float]:
    """The calibrated scale of each of ``needed`` that some feed reached (a branch no feed takes gives none)."""
    model = export_model(graph)
    types = {}
    for body in [graph, *bodies(graph)]:
        for name, tensor in body.tensors().items():
            if name in needed and tensor.dtype is not None and not isinstance(tensor.dtype, int):
                types[name] = helper.np_dtype_to_tensor_dtype(np.dtype(tensor.dtype))
    exposed = expose(model, set(needed), types)
    found = [t for t in needed if t in exposed]
    calibration = calibrate(model, [exposed[t] for t in found], feeds, method, percentile, progress)
    return {t: calibration.scale(exposed[t]) for t in found if calibration.observers[exposed[t]].count}


def expose(model: onnx.ModelProto, wanted: set[str], types: dict[str, int]) -> dict[str, str]:
    """Route each of ``wanted`` that a body (or the main graph) computes out to the main graph, in place. Every
    control-flow node on the way gets one more output: an ``If``'s branch that computes the tensor gives it (through
    an Identity), the other an empty tensor; a ``Loop``/``Scan`` body gives it as one more scan output (its value on
    every iteration, stacked). Returns wanted name → its name in the main graph; ``types``: element types (float32
    where missing)."""
    taken = _all_names(model.graph)
    counter = itertools.count()

    def fresh(base: str) -> str:
        name = f"{base}/calib"
        while name in taken:
            name = f"{base}/calib_{next(counter)}"
        taken.add(name)
        return name

    def give(body: onnx.GraphProto, name: str | None, t: str, elem: int) -> None:
        """``body`` outputs ``name`` (None: an empty tensor) as one more output."""
        out = fresh(t)
        if name is not None:
            body.node.append(helper.make_node("Identity", [name], [out], fresh(f"{t}/expose")))
        else:
            empty = numpy_helper.from_array(np.zeros(0, helper.tensor_dtype_to_np_dtype(elem)))
            body.node.append(helper.make_node("Constant", [], [out], fresh(f"{t}/absent"), value=empty))
        body.output.append(helper.make_tensor_value_info(out, elem, None))

    def visit(graph: onnx.GraphProto) -> dict[str, str]:
        here = {o for n in graph.node for o in n.output} | {i.name for i in (*graph.initializer, *graph.input)}
        found = {t: t for t in wanted if t in here}
        for node in list(graph.node):
            keys = BODIES.get(node.op_type, ()) if node.domain in ("", "ai.onnx") else ()
            held = [a for key in keys for a in node.attribute if a.name == key]
            inner = [visit(a.g) for a in held]
            for t in sorted(set().union(*inner) - set(found)):
                elem = types.get(t, onnx.TensorProto.FLOAT)
                for attr, gives in zip(held, inner):
                    give(attr.g, gives.get(t), t, elem)
                for attr in node.attribute:  # a Scan's per-output lists grow with its scan outputs
                    if node.op_type == "Scan" and attr.name in ("scan_output_axes", "scan_output_directions"):
                        attr.ints.append(0)
                found[t] = fresh(t)
                node.output.append(found[t])
                graph.value_info.append(helper.make_tensor_value_info(found[t], elem, None))
        return found

    return visit(model.graph)


def _all_names(graph: onnx.GraphProto) -> set[str]:
    names: set[str] = set()
    for g in graphs(graph):
        names |= {i.name for i in (*g.input, *g.initializer, *g.output)}
        names |= {n.name for n in g.node} | {o for n in g.node for o in n.output}
    return names
