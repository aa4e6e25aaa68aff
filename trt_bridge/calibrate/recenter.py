"""Re-centre one-sided activations, so symmetric int8 spends its 8 bits on the range.

TensorRT quantizes activations symmetrically (zero point 0). A tensor that lives in
[0, 6] (after ReLU, an image in [0, 255]) then uses only the 128 non-negative levels:
one bit is lost, which an asymmetric uint8 source (dynamic or static QOperator) did
not lose. Subtracting the centre c of the range before quantizing, and adding the
constant it removed back after the linear op, is exact in float and halves the scale::

    Before:  x ∈ [0, 6] ─ Q/DQ(6/127) ─ MatMul(W) ─ y
    After:   x ─ Sub(c=3) ─ Q/DQ(3/127) ─ MatMul(W) ─ Add(c·Σₖ W[k, :]) ─ y

    Conv:    x ─ Sub(c) [─ Pad(value −c)] ─ Q/DQ ─ Conv(W, b + c·Σ W[k]) ─ y
    Gemm:    x ─ Sub(c) ─ Q/DQ ─ Gemm(B, C + alpha·c·Σₖ B'[k, :]/beta) ─ y
             (zero padding of x is −c after the shift, so padding becomes an explicit
             Pad before the Q; the compensation folds into the conv bias.)

TensorRT fuses the Sub into the producer's epilogue (or runs it as one pointwise
op on a graph input) and the Add into the MatMul's. The shift is applied only
where the range shrinks by at least ``MIN_GAIN`` and every quantized consumer can
be compensated exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.annotations import QMAX, ActivationSpec, Annotations, ScaleSource, Site
from trt_bridge.calibrate.session import CalibrationResult
from trt_bridge.ir.names import NameAllocator
from trt_bridge.ir.toposort import toposort
from trt_bridge.lift.weights import effective_weight

MIN_GAIN = 0.75  # re-centre when the shifted range is below 75 % of the symmetric one


@dataclass(frozen=True)
class Recentered:
    tensor: str
    center: float
    amax_symmetric: float
    amax_centered: float
    compensated: tuple[str, ...] = ()  # the quantized layers whose bias carries c·ΣW (and their added bias Adds)


def recenter(graph: gs.Graph, annotations: Annotations, calibration: CalibrationResult | None,
             skip: set[str] = frozenset(), center_type: str | None = None, sort: bool = True,
             recipes: dict[str, list] | None = None) -> list[Recentered]:
    """Re-centre every one-sided or asymmetric activation that can be compensated exactly (not those in
    ``skip``, which must keep a scale shared with other tensors). ``center_type`` ("fp16" or "bf16"): the
    centre is rounded to that type first, so the Sub and Pad that carry it there are exact and the
    compensation, computed from the same value, still cancels it.

    A calibrated tensor is centred on its observed range; a tensor whose scale is the source model's
    on the range [lo, hi] its (scale, zero point) covered: an asymmetric uint8 source then keeps its
    full resolution, (hi − lo)/254 instead of max(|lo|, |hi|)/127. ``sort``: clean up and sort the graph after
    (else its new nodes are appended, unsorted). ``recipes``: filled with, per re-centred tensor, how each value it
    wrote follows from its centre and range (:class:`Recipe`), for a caller that re-fits the same structure.
    """
    names = NameAllocator(graph)
    tensors = graph.tensors()
    done = []
    # lazily: each decision is made after the previous tensor's rewrite, as the walk reaches it
    for name, center, a0, a1, sites in _plan(graph, annotations, calibration, skip, center_type, tensors):
        recipe = None if recipes is None else recipes.setdefault(name, [])
        compensated = _apply(graph, names, annotations, tensors, annotations.activations[name], sites,
                             np.float32(center), a1, recipe)
        done.append(Recentered(name, float(np.float32(center)), a0, a1, compensated))
    if done and sort:
        toposort(graph.cleanup())
    return done


def decisions(graph: gs.Graph, annotations: Annotations, calibration: CalibrationResult | None,
              skip: set[str] = frozenset(), center_type: str | None = None) -> list[tuple[str, np.float32, float]]:
    """(tensor, centre, centred range) of each activation :func:`recenter` would re-centre, in its order; nothing is
    changed."""
    return [(name, np.float32(center), a1)
            for name, center, _, a1, _ in _plan(graph, annotations, calibration, skip, center_type)]


def _plan(graph, annotations: Annotations, calibration, skip, center_type, tensors=None):
    """(tensor, centre, symmetric range, centred range, sites) of each activation to re-centre, in name order; a
    generator, so a caller that rewrites as it goes has each decision made after the rewrites before it."""
    nodes, tensors = {n.name: n for n in graph.nodes}, graph.tensors() if tensors is None else tensors
    for name in sorted(annotations.activations):
        found = None if name in skip else _decide(annotations, calibration, center_type, nodes, tensors, name)
        if found is not None:
            yield (name, *found)


@dataclass(frozen=True)
class Recipe:
    """One value :func:`_apply` wrote for a re-centred tensor, as a function of its centre (float32) and centred
    range: a constant's values, or the scale of an activation it added."""

    target: gs.Constant | str  # the constant, or the name of the added activation
    value: Callable[[np.float32, float], Any]


def _decide(annotations: Annotations, calibration, center_type, nodes, tensors, name: str):
    """(centre, symmetric range, centred range, sites) if ``name`` is to be re-centred, else None."""
    spec = annotations.activations[name]
    if spec.format.is_float:  # FP8 keeps relative precision across its range: a shift gains it nothing
        return None
    if spec.source is ScaleSource.CALIBRATION and calibration is not None and name in calibration.observers:
        obs = calibration.observers[name]
        a0 = calibration.amax(name)
        if a0 <= 0.0:
            return None
        lo = obs.lo
        center = (max(obs.lo, -a0) + min(obs.hi, a0)) / 2.0
        a1 = calibration.amax(name, center)
    elif spec.source is ScaleSource.MODEL and spec.model_range is not None and spec.scale:
        lo, hi = spec.model_range
        a0, center, a1 = spec.scale * QMAX, (lo + hi) / 2.0, (hi - lo) / 2.0
    else:
        return None
    if center_type is not None and lo >= 0.0 and a0 > 0.0:
        # Non-negative (ReLU): 0, the most common value, must stay exactly on the grid once the scale and
        # the centre are rounded to float16/bfloat16. With the scale s representable there and c = 128·s
        # (exact in any binary float), 0 − c is code −128 and the range [0, 255·s] is covered.
        step = _representable(a0 / 255.0, center_type, up=True)
        center, a1 = 128.0 * step, 127.0 * step
    if abs(center) < 1e-6 * a0:
        return None
    if not a1 < MIN_GAIN * a0:
        return None
    sites = [(nodes[s.node], s.index) for s in spec.sites]
    if not all(_compensable(node, index, annotations, tensors[name]) for node, index in sites):
        return None
    return _representable(center, center_type), a0, a1, sites  # a no-op for the 128·step centre above


def _representable(value: float, center_type: str | None, up: bool = False) -> float:
    """``value`` rounded to float16 or bfloat16 (to nearest, or ``up`` to the next one at or above it)."""
    if center_type is None:
        return value
    if center_type == "fp16":
        dtype = np.float16
    else:
        import ml_dtypes

        dtype = ml_dtypes.bfloat16
    rounded = np.float32(value).astype(dtype)
    if up and float(rounded) < value:
        rounded = np.nextafter(rounded, np.array(np.inf, dtype))
    return float(rounded)


def conv_pads(node: gs.Node, x: gs.Tensor) -> list[int] | None:
    """Explicit [begin..., end...] pads of a Conv (resolving auto_pad), or None if unknown."""
    auto = node.attrs.get("auto_pad", "NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    weight = node.inputs[1]
    spatial = len(weight.shape) - 2
    if auto in ("NOTSET", ""):
        return list(node.attrs.get("pads", [0] * (2 * spatial)))
    if auto == "VALID":
        return [0] * (2 * spatial)
    shape = x.shape
    if shape is None or len(shape) != spatial + 2 or not all(isinstance(d, int) for d in shape[2:]):
        return None
    strides = node.attrs.get("strides", [1] * spatial)
    dilations = node.attrs.get("dilations", [1] * spatial)
    begin, end = [], []
    for size, k, s, d in zip(shape[2:], weight.shape[2:], strides, dilations):
        total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
        small = total // 2
        begin.append(small if auto == "SAME_UPPER" else total - small)
        end.append(total - begin[-1])
    return begin + end


def _compensable(node: gs.Node, index: int, annotations: Annotations, x: gs.Tensor) -> bool:
    if index != 0 or len(node.inputs) < 2 or node.inputs[1].name not in annotations.weights:
        return False
    if not isinstance(node.inputs[1], gs.Constant):
        return False
    if node.op == "MatMul":
        # c·Σₖ W[..., k, :] must broadcast against the output: a 1-D weight drops the axis it sums,
        # and a batched weight needs an activation of known rank ≥ 2 (x[K] @ W[B, K, N] is [B, N])
        w_rank = len(node.inputs[1].shape)
        return w_rank == 2 or (w_rank > 2 and x.shape is not None and len(x.shape) >= 2)
    if node.op == "Conv":
        bias_ok = len(node.inputs) < 3 or isinstance(node.inputs[2], gs.Constant)
        return bias_ok and conv_pads(node, x) is not None
    if node.op == "Gemm":  # Linear layers as torch exports them (and as optimizers fuse MatMul + Add)
        has_c = len(node.inputs) > 2 and node.inputs[2].name
        return len(node.inputs[1].shape) == 2 and (not has_c or (isinstance(node.inputs[2], gs.Constant)
                                                                 and float(node.attrs.get("beta", 1.0)) != 0.0))
    return False


def _apply(graph, names, annotations, tensors, spec: ActivationSpec, sites, center: np.float32, amax: float,
           recipe: list | None = None):
    x = tensors[spec.tensor]
    ftype = np.float16 if x.dtype is not None and not isinstance(x.dtype, int) and np.dtype(x.dtype) == np.float16 \
        else np.float32  # a float16 model's compensation constants are float16

    def constant(name: str, value) -> gs.Constant:
        """A constant of ``value(center, amax)``, and its recipe for a re-fit."""
        const = gs.Constant(name, value(center, amax))
        if recipe is not None:
            recipe.append(Recipe(const, value))
        return const

    def scale(name: str, value) -> float:
        """The scale ``value(center, amax)`` of the activation ``name`` adds, and its recipe for a re-fit."""
        if recipe is not None:
            recipe.append(Recipe(name, value))
        return value(center, amax)

    shifted = gs.Variable(names(f"{spec.tensor}_centered"), dtype=ftype, shape=x.shape)
    center_const = constant(names(f"{spec.tensor}_center"), lambda c, a: np.array(c, ftype))
    graph.nodes.append(gs.Node("Sub", names(f"{spec.tensor}_recenter"), {}, [x, center_const], [shifted]))
    del annotations.activations[spec.tensor]
    plain_sites = []
    compensated = []
    for node, index in sites:
        weight = node.inputs[1]
        w = effective_weight(annotations.weights[weight.name], weight).astype(np.float64)
        compensated.append(node.name)
        if node.op == "MatMul":
            plain_sites.append(Site(node.name, index))
            node.inputs[index] = shifted
            # batched weights [..., K, N] keep the row axis so the sum broadcasts over each batch's rows
            sums = w.sum(axis=-2, keepdims=w.ndim > 2)
            compensated.append(_add_after(graph, names, node, constant, lambda c, a, sums=sums: (float(c) * sums
                                                                                                ).astype(ftype)))
            continue
        if node.op == "Gemm":
            _compensate_gemm(names, node, w, constant, ftype)
            plain_sites.append(Site(node.name, index))
            node.inputs[index] = shifted
            continue
        sums = w.reshape(w.shape[0], -1).sum(axis=1)
        bias = np.asarray(node.inputs[2].values, np.float64) if len(node.inputs) > 2 else 0.0
        new_bias = constant(names(f"{node.name}_bias_recentered"),
                            lambda c, a, bias=bias, sums=sums: (bias + float(c) * sums).astype(ftype))
        if len(node.inputs) > 2:
            node.inputs[2] = new_bias
        else:
            node.inputs.append(new_bias)
        pads = conv_pads(node, x)
        if not any(pads):
            plain_sites.append(Site(node.name, index))
            node.inputs[index] = shifted
            continue
        # Padding of x with 0 is padding of x − c with −c: make it explicit, before the Q.
        half = len(pads) // 2
        padded = gs.Variable(names(f"{spec.tensor}_padded"), dtype=ftype)
        pad_values = np.array([0, 0, *pads[:half], 0, 0, *pads[half:]], np.int64)
        pad = names(f"{node.name}_pad")
        pads_const = gs.Constant(names(f"{node.name}_pads"), pad_values)
        pad_value = constant(names(f"{node.name}_pad_value"), lambda c, a: np.array(-c, ftype))
        graph.nodes.append(gs.Node("Pad", pad, {"mode": "constant"}, [shifted, pads_const, pad_value], [padded]))
        node.attrs["pads"] = [0] * len(pads)
        node.attrs.pop("auto_pad", None)
        node.inputs[index] = padded
        annotations.activations[padded.name] = ActivationSpec(
            padded.name, [Site(node.name, index)], spec.origin, scale(padded.name, _pad_scale), spec.source,
            format=spec.format)
    if plain_sites:
        annotations.activations[shifted.name] = ActivationSpec(
            shifted.name, plain_sites, spec.origin, scale(shifted.name, lambda c, a: a / QMAX), spec.source,
            format=spec.format)
    return tuple(compensated)


def _pad_scale(center: np.float32, amax: float) -> float:
    """The scale of a padded re-centred tensor: the pad value −c must stay representable, so never clip below it
    (−128 steps is the int8 minimum)."""
    within = abs(float(center)) <= (QMAX + 1) * amax / QMAX * (1 + 1e-6)
    return (amax if within else max(amax, abs(float(center)))) / QMAX


def _compensate_gemm(names, node: gs.Node, w: np.ndarray, constant, ftype) -> None:
    """Gemm: alpha·(A + c)·B' + beta·C = alpha·A·B' + beta·(C + alpha·c·Σₖ B'[k, :] / beta): into C."""
    b = w.T if node.attrs.get("transB", 0) else w
    alpha, beta = float(node.attrs.get("alpha", 1.0)), float(node.attrs.get("beta", 1.0))
    sums = b.sum(axis=0)
    if len(node.inputs) > 2 and node.inputs[2].name:
        old_c = np.asarray(node.inputs[2].values, np.float64)
        node.inputs[2] = constant(names(f"{node.name}_bias_recentered"),
                                  lambda c, a: (old_c + alpha * float(c) * sums / beta).astype(ftype))
        return
    node.attrs["beta"] = 1.0
    while len(node.inputs) > 2:  # an empty optional C
        node.inputs.pop()
    node.inputs.append(constant(names(f"{node.name}_bias_recentered"),
                                lambda c, a: (alpha * float(c) * sums).astype(ftype)))


def _add_after(graph, names, node: gs.Node, constant, bias) -> str:
    out = node.outputs[0]
    raw = gs.Variable(names(f"{out.name}_before_recenter"), dtype=out.dtype, shape=out.shape)
    node.outputs[0] = raw
    add = names(f"{node.name}_recenter_bias")
    graph.nodes.append(gs.Node("Add", add, {}, [raw, constant(names(f"{node.name}_recenter_bias"), bias)], [out]))
    return add
