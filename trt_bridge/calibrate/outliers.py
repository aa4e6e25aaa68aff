"""Split a MatMul input's few massive channels off into a float side path (LLM.int8()'s decomposition,
Dettmers et al. 2022), so one static int8 scale covers the rest.

Transformers put "massive activations" (Sun et al. 2024) on one or two channels of a few tokens: in a real
all-MiniLM-L6-v2 the layer-0 FFN's GELU output reaches 24.3 on channel 856 of the [CLS] token, while no other
of its 1536 channels passes 5.6 and 99 % of its values stay under 0.8. A per-tensor scale that covers 24.3
leaves the rest a few codes; smoothing moves the channel into the weights instead (SmoothQuant), where its
row then dominates every output channel's weight scale. Whatever the smoothing factor, the error lands on the
tokens that attend to that one: on MiniLM the output swung between 11.6 and 20.2 dB for SmoothQuant α between
0.65 and 0.8, 94 % of the error on padding positions. Computing those channels in float removes the swing::

    Before:  x ─ Q/DQ ─ MatMul(W) ─ y

    After:   x ─ Q/DQ ─ MatMul(W, rows o zeroed) ─────────────────────────── Add ─ y
             └─ Gather(o, axis −1) ─ [Unsqueeze(−1)] ─ Mul(W[o, :]) ─ [ReduceSum(−2)] ─┘

exact in float; the side path is an elementwise outer product (no float MatMul: one channel is one Mul,
``m`` channels a Mul and a ReduceSum over ``m``), a fraction ``m / K`` of the MatMul's work. The int8 path still
reads channels ``o``, but their weight rows are zero, so calibration leaves them out of the range (they may
clip at no cost) and smoothing gives them factor 1.

A channel is massive when its calibrated maximum is over ``RATIO`` times the ``MAX_CHANNELS + 1``-th largest
channel maximum (the bulk's top), at most ``MAX_CHANNELS`` of them, in an input of ``MIN_CHANNELS`` or more.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.annotations import Annotations, ScaleSource, Site, WeightSpec
from trt_bridge.ir.graph_builder import GraphBuilder
from trt_bridge.ir.names import NameAllocator
from trt_bridge.ir.toposort import toposort

RATIO = 3.0
MAX_CHANNELS = 8
MIN_CHANNELS = 64


@dataclass(frozen=True)
class Split:
    tensor: str  # the MatMul input whose channels were split off
    channels: tuple[int, ...]  # the massive channels, now computed in float
    channel_max: tuple[float, ...]  # their calibrated maxima
    bulk_max: float  # the largest maximum of the channels left in int8
    layers: tuple[str, ...]  # the MatMuls whose weight rows were zeroed (each with its side path)


def massive_channels(channel_max: np.ndarray) -> np.ndarray:
    """The channels (sorted indices) whose maximum is over ``RATIO`` times the bulk's top; empty if none."""
    cmax = np.asarray(channel_max, np.float64)
    if cmax.ndim != 1 or cmax.size < MIN_CHANNELS:
        return np.zeros(0, np.int64)
    bulk = float(np.sort(cmax)[::-1][MAX_CHANNELS])
    if not bulk > 0.0:
        return np.zeros(0, np.int64)
    return np.flatnonzero(cmax > RATIO * bulk)


def split_outliers(graph: gs.Graph, annotations: Annotations, channel_max: dict[str, np.ndarray]
                   ) -> list[Split]:
    """Split the massive channels off every tensor of ``channel_max`` (smoothing candidates: each quantized
    reader a MatMul with a constant 2-D weight), in place. Each split tensor's maxima are zeroed for those
    channels in ``channel_max``, so smoothing, which runs next, leaves them alone."""
    names = NameAllocator(graph)
    nodes = {n.name: n for n in graph.nodes}
    tensors = graph.tensors()
    done = []
    for name in sorted(channel_max):
        spec = annotations.activations[name]
        channels = massive_channels(channel_max[name])
        sites = [nodes[s.node] for s in spec.sites]
        if not channels.size or any(node.inputs[1].shape[0] != channel_max[name].shape[0] for node in sites):
            continue
        x = tensors[name]
        ftype = np.dtype(x.dtype) if x.dtype is not None and not isinstance(x.dtype, int) else np.dtype(np.float32)
        build = GraphBuilder(graph, names, f"{name}_outliers", ftype)
        picked = build.op("Gather", [x, gs.Constant(names(f"{name}_outlier_channels"), channels.astype(np.int64))],
                          {"axis": -1})
        if channels.size > 1:
            picked = build.unsqueeze(picked, [-1], ftype)
        bulk_weights: dict[str, gs.Constant] = {}  # a weight two readers share is zeroed once
        for node in sites:
            _split_site(graph, names, annotations, node, channels, picked, ftype, bulk_weights)
        bulk = np.delete(channel_max[name], channels)
        done.append(Split(name, tuple(int(c) for c in channels),
                          tuple(float(channel_max[name][c]) for c in channels), float(bulk.max()),
                          tuple(node.name for node in sites)))
        channel_max[name] = channel_max[name].copy()
        channel_max[name][channels] = 0.0
    if done:
        toposort(graph.cleanup())
    return done


def _split_site(graph: gs.Graph, names: NameAllocator, annotations: Annotations, node: gs.Node,
                channels: np.ndarray, picked: gs.Tensor, ftype, bulk_weights: dict[str, gs.Constant]) -> None:
    """Zero rows ``channels`` of ``node``'s weight (once per weight: ``bulk_weights``) and add
    ``picked · W[channels, :]`` after it."""
    old = node.inputs[1]
    w = np.asarray(old.values)
    # one channel: its row as a vector, so [..., 1] · [N] broadcasts to the output's rank (a rank-1 input too)
    rows = (w[channels[0], :] if channels.size == 1 else w[channels, :]).astype(ftype)
    old_spec = annotations.weights[old.name]
    new = bulk_weights.get(old.name)
    spec = WeightSpec("", [], old_spec.axis, old_spec.origin, format=old_spec.format, block_size=old_spec.block_size)
    if new is None:
        kept = w.copy()
        kept[channels, :] = 0
        new = bulk_weights[old.name] = gs.Constant(names(f"{old.name}_bulk"), kept)
        if old_spec.codes is not None and old_spec.scale is not None and not old_spec.block_size:  # exact stay exact
            spec.codes = old_spec.codes.copy()
            spec.codes[channels, :] = 0
            spec.scale, spec.source = old_spec.scale, ScaleSource.EXACT_WEIGHTS
    spec.tensor = new.name
    annotations.move_weight_site(old.name, Site(node.name, 1), spec)
    node.inputs[1] = new
    build = GraphBuilder(graph, names, f"{node.name}_outliers", ftype)
    side = build.op("Mul", [picked, gs.Constant(names(f"{node.name}_outlier_rows"), rows)])
    if channels.size > 1:
        side = build.reduce("ReduceSum", side, [-2], 0, ftype)
    out = node.outputs[0]
    bulk = gs.Variable(names(f"{out.name}_bulk"), dtype=out.dtype, shape=out.shape)
    node.outputs[0] = bulk
    build.op("Add", [bulk, side], out=out)
