"""Activation→weight smoothing (SmoothQuant, Xiao et al. 2023) for MatMul inputs.

Transformer activations carry a few outlier channels; one static per-tensor scale
must cover them and loses resolution everywhere else. For ``X[.., K] · W[K, N]``,
per-channel factors ``s_k = max|X_k|^α / max|W_k|^(1−α)`` move the outliers into the
weights, which are quantized per output channel anyway::

    LayerNormalization(γ, β) ─ x ─┬─ MatMul(W)           LayerNormalization(γ/s, β/s) ─ x/s ─┬─ MatMul(diag(s)·W)
                                  └─ Add (residual)                                          └─ Mul(s) ─ Add
    Gelu ─ x ─ MatMul(W)                                 Gelu ─ Mul(1/s) ─ x/s ─ MatMul(diag(s)·W)

both exact in float. After a LayerNormalization, ``1/s`` folds into gamma and beta; a reader left
in float (BERT's residual Add) gets ``x`` back through one Mul. Any other token-sequence input
(the FFN's GELU output, the attention output) is divided by ``s`` in one Mul after the node that
computes it; TensorRT fuses such Muls into their neighbours. On a real-weight MiniLM-L6 (held-out
sentences) float → INT8 went 15.2 → 17.2 dB with the residual Mul and 19.4 dB with both (α 0.65, the
default; ``--smooth 0.75`` gives 21.9 dB there, but costs 1.5 dB on a synthetic QEmbedLayerNormalization model).

All MatMuls that read the same tensor (q, k, v projections) share one ``s``. Their
weights become new float constants, re-quantized per output channel at lowering
(the source's exact integers cannot survive the rescaling).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.annotations import Annotations, ScaleSource, Site, WeightSpec
from trt_bridge.formats import FP4, INT4
from trt_bridge.ir.graph_builder import redirect
from trt_bridge.ir.names import NameAllocator
from trt_bridge.ir.toposort import toposort
from trt_bridge.lift.weights import effective_weight

S_RANGE = (1e-4, 1e4)

#: Fewest rows (tokens, pixels, samples) per channel that calibration must have seen before a
#: channel's maximum decides its factor. With fewer, each channel's max is a poor estimate of its
#: tail, and smoothing (which spends each channel's headroom) clips held-out inputs: a ConvNeXt's
#: pooled [N, 256] features, 16 calibration rows, fell from 30.2 to 19.4 dB on held-out inputs
#: while gaining 0.5 dB on the calibration inputs themselves.
MIN_ROWS = 128

#: Smoothing that needs an extra Mul (no LayerNormalization to fold into, or a float reader such as a residual Add
#: that must read the tensor as it was) is applied only to a tensor with outlier channels: its largest channel
#: maximum at least this many times the median one. Measured: a real-weight MiniLM-L6's LayerNormalization outputs
#: 4.5-20, GELU outputs 5-35, attention outputs 2.6-5.3; random-weight encoders 1.3-3.5, where smoothing through a
#: Mul cost up to 1.7 dB (6 dB on a 78 dB YOLOS, 3 dB on a QEmbedLayerNormalization test model).
OUTLIER_RATIO = 4.0


@dataclass(frozen=True)
class Smoothed:
    tensor: str  # the LayerNormalization output whose channels were rescaled
    alpha: float
    folded_into: str  # the LayerNormalization that absorbed 1/s, or the Mul that applies it
    max_factor: float
    restored_for: tuple[str, ...] = ()  # float readers (a residual Add) that read x as it was, not x/s
    through: str = "LayerNormalization"  # what applies 1/s: the LayerNormalization (folded) or a Mul


class ChannelMaxObserver:
    """Running max of |x| per channel of the last axis."""

    def __init__(self) -> None:
        self.max: np.ndarray | None = None
        self.rows = 0  # how many values of each channel were seen

    def update(self, values: np.ndarray) -> None:
        v = np.abs(np.asarray(values, np.float32))
        self.rows += int(np.prod(v.shape[:-1])) if v.ndim > 1 else 1
        v = v.reshape(-1, v.shape[-1]).max(axis=0) if v.ndim > 1 else v
        if not np.isfinite(v).all():  # a masked row's NaN or Inf: the channel's max is its finite values'
            v = np.abs(np.asarray(values, np.float32))
            v = np.where(np.isfinite(v), v, 0.0)
            v = v.reshape(-1, v.shape[-1]).max(axis=0) if v.ndim > 1 else v
        self.max = v if self.max is None else np.maximum(self.max, v)


class Rescaled:
    """Feeds ``observer`` with ``x · factors`` (per channel of the last axis): how a range observer
    sees a tensor that smoothing has since divided by ``s``, without running the model again."""

    def __init__(self, observer, factors: np.ndarray):
        self.observer, self.factors = observer, np.asarray(factors, np.float32)

    def update(self, values: np.ndarray) -> None:
        self.observer.update(np.asarray(values, np.float32) * self.factors)


def candidates(graph: gs.Graph, annotations: Annotations) -> list[str]:
    """Activations (still to be calibrated) whose every quantized reader is MatMul(x, constant weight) and
    where 1/s can be applied (:func:`_smoothable`): after LayerNormalization it is free (2-layer encoder:
    34.9 → 36.3 dB); the attention output and the FFN's GELU output of a real-weight MiniLM-L6 need a Mul and
    win more (float → INT8 17.2 → 19.4 dB at α 0.65 on held-out sentences)."""
    nodes = {n.name: n for n in graph.nodes}
    tensors = graph.tensors()
    graph_outputs = {t.name for t in graph.outputs}
    found = []
    for name, spec in sorted(annotations.activations.items()):
        if spec.scale is not None or not spec.sites or spec.format is FP4:
            continue  # FP4 activations are scaled per block of 16 (--fp4): an outlier channel costs its blocks
        ok = True
        for site in spec.sites:
            node = nodes[site.node]
            weight = node.inputs[1] if len(node.inputs) > 1 else None
            if not (node.op == "MatMul" and site.index == 0 and isinstance(weight, gs.Constant)
                    and weight.name in annotations.weights and len(weight.shape) == 2
                    and annotations.weights[weight.name].source not in (ScaleSource.FILE, ScaleSource.QAT)
                    and annotations.weights[weight.name].format is not INT4):  # weight-only: x stays float
                ok = False
                break
        if ok and _smoothable(tensors[name], [nodes[s.node] for s in spec.sites], graph_outputs):
            found.append(name)
    return found


def smooth(graph: gs.Graph, annotations: Annotations, channel_max: dict[str, np.ndarray],
           alpha: float) -> tuple[list[Smoothed], dict[str, np.ndarray]]:
    """Apply smoothing to every tensor in ``channel_max`` (from :func:`candidates`), in place.

    Returns what was smoothed and, per tensor, the factors ``s`` it is now divided by.
    """
    names = NameAllocator(graph)
    nodes = {n.name: n for n in graph.nodes}
    tensors = graph.tensors()
    graph_outputs = {t.name for t in graph.outputs}
    done, factors = [], {}
    for name in sorted(channel_max):
        spec = annotations.activations[name]
        sites = [nodes[s.node] for s in spec.sites]
        weights = [effective_weight(annotations.weights[n.inputs[1].name], n.inputs[1]) for n in sites]
        act = channel_max[name].astype(np.float64)
        if act.shape[0] != weights[0].shape[0]:
            continue
        w_max = np.max([np.abs(w).max(axis=1) for w in weights], axis=0).astype(np.float64)
        ln = foldable_layer_norm(tensors[name], sites, graph_outputs)
        x = tensors[name]
        site_ids = {id(n) for n in sites}
        others = [n for n in x.outputs if id(n) not in site_ids]  # float readers: they must read x as it was
        if (ln is None or others) and act.max() < OUTLIER_RATIO * np.median(act):
            continue  # an extra Mul, and no outlier channels to move: it would only round x differently
        s = _factors(act, w_max, alpha)
        if ln is not None:
            ftype = divide_layer_norm(ln, s, names)
            applied_by = ln.name
            if others:  # the residual branch reads x as it was: x/s · s
                restored = gs.Variable(names(f"{name}_unsmoothed"), dtype=x.dtype, shape=x.shape)
                factor = gs.Constant(names(f"{name}_smooth_factors"), s.astype(ftype))
                graph.nodes.append(gs.Node("Mul", names(f"{ln.name}_unsmooth"), inputs=[x, factor],
                                           outputs=[restored]))
                redirect(others, x, restored)
        else:  # producer ─ x_unsmoothed ─ Mul(1/s) ─ x: x keeps its name (and its annotation)
            ftype = np.dtype(x.dtype) if x.dtype is not None else np.dtype(np.float32)
            producer = x.inputs[0]
            raw = gs.Variable(names(f"{name}_unsmoothed"), dtype=x.dtype, shape=x.shape)
            producer.outputs[[id(o) for o in producer.outputs].index(id(x))] = raw
            redirect(others, x, raw)
            factor = gs.Constant(names(f"{name}_smooth_divisors"), (1.0 / s).astype(ftype))
            applied_by = names(f"{name}_smooth")
            graph.nodes.append(gs.Node("Mul", applied_by, inputs=[raw, factor], outputs=[x]))
        rescale_weights(annotations, sites, weights, s, names, ftype)
        done.append(Smoothed(name, alpha, applied_by, float(s.max()), tuple(n.name for n in others),
                             "LayerNormalization" if ln is not None else "Mul"))
        factors[name] = s
    if done:
        toposort(graph.cleanup())
    return done, factors


def divide_layer_norm(ln: gs.Node, s: np.ndarray, names: NameAllocator) -> np.dtype:
    """``ln``'s output divided by ``s`` per channel: its gamma and beta become new constants ``γ/s``, ``β/s`` (in
    their own float type, which is returned: float16 models keep float16 parameters)."""
    gamma, beta = ln.inputs[1], ln.inputs[2] if len(ln.inputs) > 2 else None
    ftype = gamma.values.dtype
    ln.inputs[1] = gs.Constant(names(f"{gamma.name}_smoothed"), (gamma.values / s).astype(ftype))
    if beta is not None:
        ln.inputs[2] = gs.Constant(names(f"{beta.name}_smoothed"), (beta.values / s).astype(ftype))
    return ftype


def rescale_weights(annotations: Annotations, sites: list[gs.Node], weights: list[np.ndarray], s: np.ndarray,
                    names: NameAllocator, ftype, suffix: str = "smoothed") -> list[WeightSpec]:
    """Each site's 2-D weight (``weights``, as the site reads it) times ``s`` along its reduction axis (the one that
    is not its output-channel axis), as a new float constant annotated as the old one was, without codes. Returns
    the new annotations (one per site)."""
    made = []
    for node, w in zip(sites, weights, strict=True):
        old = node.inputs[1]
        old_spec = annotations.weights[old.name]
        factors = s[:, None] if old_spec.axis % 2 else s[None, :]
        new = gs.Constant(names(f"{old.name}_{suffix}"), (w * factors).astype(ftype))
        annotations.move_weight_site(old.name, Site(node.name, 1),
                                     WeightSpec(new.name, [], old_spec.axis, old_spec.origin,
                                                format=old_spec.format, block_size=old_spec.block_size))
        node.inputs[1] = new
        made.append(annotations.weights[new.name])
    return made


def _factors(act: np.ndarray, w_max: np.ndarray, alpha: float) -> np.ndarray:
    """SmoothQuant's ``s = max|X|^α / max|W|^(1−α)`` per input channel, 1 where undefined, clipped."""
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.power(act, alpha) / np.power(w_max, 1.0 - alpha)
    return np.clip(np.where(np.isfinite(s) & (act > 0) & (w_max > 0), s, 1.0), *S_RANGE)


def _smoothable(x: gs.Tensor, sites: list[gs.Node], graph_outputs: set[str]) -> bool:
    """1/s can be applied where ``x`` is made: folded into its LayerNormalization, or, for a token sequence
    (rank 3 or more: where transformers carry their outlier channels), a Mul after the one node that computes it.
    A CNN's [N, C] classifier input is left alone (MNIST's lost accuracy: 37.6 → 30.7 dB)."""
    if foldable_layer_norm(x, sites, graph_outputs) is not None:
        return True
    return len(x.inputs) == 1 and x.name not in graph_outputs and len(x.shape or ()) >= 3


def foldable_layer_norm(x: gs.Tensor, sites: list[gs.Node], graph_outputs: set[str]) -> gs.Node | None:
    """The LayerNormalization producing ``x`` (not a graph output) if the smoothed MatMuls are among its readers."""
    if len(x.inputs) != 1 or x.name in graph_outputs:
        return None
    ln = x.inputs[0]
    if ln.op != "LayerNormalization" or ln.attrs.get("axis", -1) not in (-1, len(x.shape or []) - 1):
        return None
    if not isinstance(ln.inputs[1], gs.Constant):
        return None
    if len(ln.inputs) > 2 and not isinstance(ln.inputs[2], gs.Constant):
        return None
    if len(ln.outputs) > 1 and any(o.outputs for o in ln.outputs[1:]):
        return None
    if not {id(n) for n in sites} <= {id(n) for n in x.outputs}:
        return None
    return ln
