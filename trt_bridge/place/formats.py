"""Which format each quantized tensor is written in: the source's where TensorRT runs it, or the one asked for.

    --int8 / --fp8   every quantized activation, and the weights of the layers they feed, in that format
    --int4           2-D MatMul/Gemm weights in INT4 blocks along their reduction axis (weight-only: those layers'
                     activations stay in the high precision, which is the form TensorRT builds)
    (none)           what the source (or a --scales file) quantizes: FP8 stays FP8, INT4 blocks stay INT4, everything
                     else INT8; a float model's layers INT8
    --compute-capability X.Y   the target GPU: a source's FP4 (NVFP4/MXFP4) weight blocks stay FP4 for 10.0 and newer;
                     without a target, or an older one, they are approximated as INT4 blocks of the same size
                     (reported in ``approximated``, with a warning naming --compute-capability 12.0)

A weight runs in its layer's activation format (TensorRT's FP8 and INT8 layers take both inputs in one format); a
block-wise INT4 weight takes none. Codes the lift kept exact stay exact where the format does not change; a weight
whose format changes is re-quantized from its float values when lowered (:func:`trt_bridge.lift.weights.weight_values`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.annotations import QMAX, Annotations, ScaleSource, Site, WeightSpec
from trt_bridge.choices import FormatOptions, PlacementOptions, PlacementPolicy, compute_capability
from trt_bridge.errors import UnsupportedPatternError
from trt_bridge.formats import FORMATS, FP4, FP8, INT4, INT8, QuantFormat
from trt_bridge.lift.fp4_activation_qdq import RULE as FP4_QDQ
from trt_bridge.lift.weights import block_axis, weight_axis
from trt_bridge.place.fp4 import fp4_activations
from trt_bridge.place.policies import excluder

log = logging.getLogger("trt_bridge.place")


@dataclass(frozen=True)
class FormatChange:
    tensor: str
    kind: str  # "activation" | "weight"
    format: str
    was: str
    reason: str


def _holds_bodies(graph: gs.Graph) -> bool:
    """Whether a node of ``graph`` holds a control-flow body (If, Loop, Scan)."""
    return any(isinstance(v, gs.Graph) or (isinstance(v, list) and any(isinstance(g, gs.Graph) for g in v))
               for node in graph.nodes for v in node.attrs.values())


def assign_formats(graph: gs.Graph, annotations: Annotations, options: FormatOptions,
                   approximate: Callable[[str, str, str], None] | None = None,
                   placement: PlacementOptions | None = None, body: bool = False) -> list[FormatChange]:
    """Set each annotation's format (in place) as ``options`` ask; return what changed from the lifted one.
    ``approximate(rule, node, what)`` records a source format the target cannot run (FP4 below 10.0); ``placement``:
    its --exclude-nodes/--exclude-ops keep --int4 off those layers too; ``body``: ``graph`` is a control-flow body
    (an If branch without a MatMul is no reason to refuse --int4, nor is a main graph whose MatMuls are all in its
    bodies: Optimum's merged decoders)."""
    changes: list[FormatChange] = []
    act = None if options.activations is None else FORMATS[options.activations]
    # the source's formats, and those of an imported scale file's entries (AIMET's FP8 encodings)
    lifted = {spec.format for spec in annotations.activations.values()
              if not spec.placed or spec.source in (ScaleSource.FILE, ScaleSource.QAT)}
    if act is None and lifted == {FP8}:  # an FP8 source (or scale file): what placement adds is FP8 too
        for spec in annotations.activations.values():
            spec.format = FP8
    if act is None and FP4 in lifted:  # an NVFP4 source: FP4 where the target runs it, else its nearest form
        act = _fp4_source(annotations, options.compute_capability, approximate)
    if act is FP4:  # NVFP4 where TensorRT's FP4 GEMMs take the activation, FP8 elsewhere
        was = {name: spec.format for name, spec in annotations.activations.items()}
        fp8 = fp4_activations(graph, annotations, options.fp8_nodes)
        if not options.activations:
            _report_static_fp4(annotations, fp8, approximate)
        asked = "--fp4" if options.activations else "the source's FP4"
        changes += [FormatChange(name, "activation", spec.format.name, was[name].name,
                                 f"{asked} is for GEMMs: {fp8[name]}" if name in fp8 else asked)
                    for name, spec in annotations.activations.items() if spec.format is not was[name]]
    elif act is not None:
        for spec in annotations.activations.values():
            if spec.format is not act:
                changes.append(FormatChange(spec.tensor, "activation", act.name, spec.format.name,
                                            f"--{act.name}" if options.activations else "the target runs no FP4"))
                spec.format = act
    nodes = {n.name: n for n in graph.nodes}
    tensors = graph.tensors()
    preserve = placement is not None and placement.policy is PlacementPolicy.PRESERVE
    changes += _fp8_conv_kernels(nodes, annotations, act, preserve)
    weight_only = None if options.weights is None else FORMATS[options.weights]
    if weight_only is INT4:
        _annotate_float_weights(graph, annotations, placement or PlacementOptions())
        if not annotations.weights and not annotations.activations and not body and not _holds_bodies(graph):
            raise UnsupportedPatternError("--int4 quantizes the constant 2-D weights of MatMul and Gemm, and this "
                                          "model has none (its weighted layers are convolutions, or their weights are "
                                          "computed): use --int8 or --fp8 with --calib-data instead.")
    reads = _activation_formats(annotations)
    fp4_to_int4 = []
    for spec in annotations.weights.values():
        wanted = _weight_format(spec, nodes, tensors, reads, weight_only, options.compute_capability)
        if spec.format is FP4 and wanted is INT4 and weight_only is None:  # FP4 for a target that cannot run it
            fp4_to_int4.append(_approximate_fp4(spec, options.compute_capability, approximate))
            changes.append(FormatChange(spec.tensor, "weight", INT4.name, FP4.name, "the target runs no FP4"))
            spec.format, spec.codes, spec.scale, spec.source = INT4, None, None, ScaleSource.REQUANTIZED
            continue  # the same blocks: FP4 values re-quantized as INT4 block by block
        if wanted is spec.format:
            if wanted is INT4 and not spec.block_size:
                spec.block_size = options.block_size
            continue
        if wanted is INT4 and spec.format is INT8 and _int4_codes_as_blocks(spec, options.block_size):
            changes.append(FormatChange(spec.tensor, "weight", INT4.name, INT8.name, "--int4 (the source's int4 "
                                        "codes kept, each channel's scale repeated per block)"))
            continue
        reason = "--int4" if wanted is INT4 else f"its layer's activations are {wanted.label}"
        changes.append(FormatChange(spec.tensor, "weight", wanted.name, spec.format.name, reason))
        spec.format, spec.codes, spec.scale, spec.source = wanted, None, None, ScaleSource.REQUANTIZED
        spec.block_size = options.block_size if wanted is INT4 else FP4.block_size if wanted is FP4 else 0
    if weight_only is INT4 and act is None:  # --int4 alone is weight-only: nothing placement added besides
        for table in (annotations.activations, annotations.weights):
            for name in [n for n, spec in table.items() if spec.placed and spec.format is not INT4]:
                del table[name]
    if fp4_to_int4:  # once, not per weight
        log.warning("%d FP4 weight(s) approximated as INT4 blocks, e.g. %s", len(fp4_to_int4), fp4_to_int4[0])
    # INT4 layers are weight-only: TensorRT-RTX builds no FP8 × INT4 layer for compute capability 8.9, and INT8 × INT4
    # only for some shapes (an AIMET W4A8 export with blocks of 16 failed: "CHECK(is_constant()) failed")
    blocked = {s.node for spec in annotations.weights.values() if spec.format in (INT4, FP4) for s in spec.sites
               if reads.get(s.node) is not FP4}  # NVFP4 W4A4 (--fp4) keeps its FP4 activations
    for name in list(annotations.activations):
        spec = annotations.activations[name]
        kept = [s for s in spec.sites if s.node not in blocked]
        if len(kept) == len(spec.sites):
            continue
        if not spec.placed:
            changes.append(FormatChange(name, "activation", "none", spec.format.name, "it feeds INT4 weight-only "
                                        "layers only" if not kept else "INT4 weight-only layers read it in float"))
        spec.sites = kept
        if not kept:
            del annotations.activations[name]
    return changes


def _fp4_source(annotations: Annotations, target: str | None, approximate) -> QuantFormat:
    """The format an FP4 source's activations are written in: FP4 for a target that runs it (10.0+), else FP8 (8.9+)
    or INT8, each of its FP4 activations reported as approximated (their layers' FP4 weights become INT4 blocks,
    weight-only: :func:`assign_formats`)."""
    compute = None if target is None else compute_capability(target)
    if compute is not None and FP4.runs_on(compute):
        return FP4
    nearest = FP8 if compute is not None and FP8.runs_on(compute) else INT8
    why = "no --compute-capability was given" if target is None else f"compute capability {target} runs no FP4"
    for spec in annotations.activations.values():
        if spec.format is FP4 and approximate is not None:
            approximate(spec.lifted_by or "fp4-dynamic-activation", spec.origin,
                        f"FP4 activation '{spec.tensor}' written in {nearest.label} ({why}; --compute-capability 10.0 "
                        "or 12.0 keeps it FP4)")
    return nearest


def _report_static_fp4(annotations: Annotations, fp8: dict[str, str], approximate) -> None:
    """Report each FP4 Q/DQ activation with a static scale (:mod:`trt_bridge.lift.fp4_activation_qdq`) that an FP4
    target writes otherwise: TensorRT's dynamic FP4 (per-inference block scales under the global scale of the
    source's range), or FP8 where the reader is not an FP4 GEMM."""
    for spec in annotations.activations.values():
        if spec.lifted_by != FP4_QDQ or approximate is None:
            continue
        amax = float(spec.scale or 0.0) * QMAX
        what = (f"FP4 activation '{spec.tensor}' (static scale) written in FP8 over its range ±{amax:.4g}: "
                f"{fp8[spec.tensor]}" if spec.tensor in fp8 else
                f"FP4 activation '{spec.tensor}' (static scale) written as TensorRT's dynamic FP4: blocks of "
                f"{FP4.block_size} scaled in every inference under the global scale of its range ±{amax:.4g} "
                "(more accurate than the source's static scale)")
        approximate(FP4_QDQ, spec.origin, what)


def _int4_codes_as_blocks(spec: WeightSpec, block_size: int) -> bool:
    """A source's exact per-channel codes that int4 holds (AIMET's W4 export: int4 DequantizeLinear per channel) made
    INT4 blocks of ``block_size`` along the reduction axis, in place: the codes kept, each channel's scale repeated
    in every block (exact). False, and ``spec`` untouched, where the codes are not exact int4 or the blocks do not
    divide the reduction axis."""
    codes, scale = spec.codes, spec.scale
    if codes is None or scale is None or codes.ndim != 2 or spec.block_size or codes.dtype.kind != "i":
        return False
    axis = block_axis(spec.axis, 2)
    if codes.shape[axis] % block_size or codes.min() < INT4.qmin - 1 or codes.max() > INT4.qmax:
        return False
    channels = np.broadcast_to(np.asarray(scale).reshape(-1), (codes.shape[spec.axis],))
    blocked = np.repeat(np.expand_dims(channels, axis), codes.shape[axis] // block_size, axis=axis)
    spec.codes, spec.scale = codes.astype(INT4.dtype), np.ascontiguousarray(blocked, dtype=np.asarray(scale).dtype)
    spec.format, spec.block_size = INT4, block_size
    return True


def _annotate_float_weights(graph: gs.Graph, annotations: Annotations, placement: PlacementOptions) -> None:
    """--int4: every 2-D float constant weight of a MatMul/Gemm that placement left unannotated (a float model
    without calibration data has none) becomes a weight annotation, but on the layers --exclude-nodes/--exclude-ops
    name; the loop above makes it INT4."""
    excluded = excluder(placement)
    for node in graph.nodes:
        if node.op not in ("MatMul", "Gemm") or len(node.inputs) < 2 or node.attrs.get("transA", 0) or excluded(node):
            continue
        weight = node.inputs[1]
        if not isinstance(weight, gs.Constant) or len(weight.shape) != 2 or getattr(weight.dtype, "kind", "") != "f":
            continue
        site = Site(node.name, 1)
        spec = annotations.weights.get(weight.name)
        if spec is None:
            annotations.weights[weight.name] = WeightSpec(weight.name, [site], weight_axis(node, 2), node.name,
                                                          placed=True)
        elif site not in spec.sites:
            spec.sites.append(site)


#: TensorRT's FP8 convolution kernels: more than this many channels on each side, at most this many filter taps
#: (smaller layers gain nothing over float16 and lose accuracy; NVIDIA ModelOpt's FP8 mode leaves them out alike)
FP8_CONV_MIN_CHANNELS, FP8_CONV_MAX_TAPS = 16, 32


def _fp8_conv_problem(node: gs.Node) -> str | None:
    weight = node.inputs[1] if len(node.inputs) > 1 else None
    shape = getattr(weight, "shape", None)
    if node.op != "Conv" or not shape or len(shape) < 3 or not all(isinstance(d, int) for d in shape):
        return None
    out_c, in_c, taps = shape[0], shape[1] * node.attrs.get("group", 1), int(np.prod(shape[2:]))
    if min(out_c, in_c) <= FP8_CONV_MIN_CHANNELS:
        return (f"an FP8 convolution with {in_c} input and {out_c} output channels (TensorRT's FP8 kernels want more "
                f"than {FP8_CONV_MIN_CHANNELS} a side)")
    if taps > FP8_CONV_MAX_TAPS:
        return f"an FP8 convolution with a {taps}-tap filter (TensorRT's FP8 kernels take at most {FP8_CONV_MAX_TAPS})"
    return None


def _fp8_conv_kernels(nodes: dict, annotations: Annotations, act: QuantFormat | None,
                      preserve: bool = False) -> list[FormatChange]:
    """Convolutions TensorRT has no FP8 kernel worth running for stay in the high precision, a source's own FP8
    ones too (TensorRT's placement drops them: they cost accuracy and win no speed; 22.8 → 24.5 dB on Quark's FP8
    YOLOv8n, 25.1 → 29.9 dB on NNCF's), unless ``preserve`` (--placement preserve) keeps what the source quantized
    and --fp8 does not ask for FP8 everywhere, or they are all the FP8 layers the source has."""
    problems = {name: why for name, node in nodes.items() if (why := _fp8_conv_problem(node))}
    fp8_sites = [s.node for spec in annotations.activations.values() if spec.format is FP8 for s in spec.sites]
    # a source whose FP8 layers are all such convolutions keeps them (it would be left with nothing quantized)
    preserve = preserve or (act is not FP8 and all(node in problems for node in fp8_sites))
    changes, dropped = [], set()
    for name in list(annotations.activations):
        spec = annotations.activations[name]
        if spec.format is not FP8 or (preserve and not spec.placed and act is not FP8):
            continue
        layers = [s.node for s in spec.sites if s.node in problems]
        if layers:
            changes.append(FormatChange(name, "activation", "none", spec.format.name, problems[layers[0]]))
            dropped.update(layers)
            spec.sites = [s for s in spec.sites if s.node not in problems]
            if not spec.sites:
                del annotations.activations[name]
    for name in list(annotations.weights):  # those layers' weights stay float with them
        spec = annotations.weights[name]
        if any(s.node in dropped for s in spec.sites):
            changes.append(FormatChange(name, "weight", "none", spec.format.name, problems[spec.sites[0].node]))
            spec.sites = [s for s in spec.sites if s.node not in dropped]
            if not spec.sites:
                del annotations.weights[name]
    return changes


def _activation_formats(annotations: Annotations) -> dict[str, QuantFormat]:
    """node → the format of the activations it reads quantized (FP8 where any is)."""
    found: dict[str, QuantFormat] = {}
    for spec in annotations.activations.values():
        for site in spec.sites:
            if found.get(site.node) is not FP8:
                found[site.node] = spec.format
    return found


def _approximate_fp4(spec: WeightSpec, target: str | None, approximate) -> str:
    """Report that FP4 weights become INT4 blocks (no target, or one below FP4's 10.0); return the report."""
    why = ("no --compute-capability was given" if target is None else
           f"--compute-capability {target} runs no FP4 (TensorRT runs FP4 on {FP4.min_compute:.1f} and newer)")
    what = (f"FP4 weights of '{spec.origin}' re-quantized as INT4 blocks of {spec.block_size} (TensorRT's 4-bit "
            f"form for older GPUs): {why}; convert with --compute-capability 12.0 (a Blackwell target) to keep FP4")
    if approximate is not None:
        approximate("fp4-target", spec.origin, what)
    return what


def _weight_format(spec, nodes, tensors, reads, weight_only: QuantFormat | None,
                   target: str | None = None) -> QuantFormat:
    """INT4 for a 2-D MatMul/Gemm weight that --int4 asks for or the source wrote in INT4 blocks; FP4 for the
    source's FP4 blocks where the target runs FP4 (else INT4); else its layers' activation format (FP8 where any
    is, INT8 otherwise)."""
    layers = [nodes[s.node] for s in spec.sites if s.node in nodes]
    tensor = tensors.get(spec.tensor)
    blockable = bool(tensor is not None and len(tensor.shape or ()) == 2 and layers
                     and all(n.op in ("MatMul", "Gemm") for n in layers))
    if blockable and (weight_only is INT4 or (spec.format is INT4 and weight_only is None)):
        return INT4
    if blockable and spec.format is FP4:
        return FP4 if target is not None and FP4.runs_on(compute_capability(target)) else INT4
    formats = {reads[n.name] for n in layers if n.name in reads}
    if blockable and formats == {FP4}:  # NVFP4 W4A4: the weight in FP4 blocks too
        return FP4
    if FP8 in formats or FP4 in formats:
        return FP8
    if formats:
        return INT8
    return spec.format if spec.format not in (INT4, FP4) else INT8
