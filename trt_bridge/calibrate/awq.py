"""Activation-aware INT4 weight rounding (AWQ: Lin et al. 2023, "AWQ: Activation-aware Weight Quantization for LLM
Compression and Acceleration", arXiv:2306.00978) for ``--int4`` weights when calibration data is given.

INT4 weight-only layers compute ``x · Q(W)`` with ``x`` in float. Rounding every block of ``W`` to the nearest of 15
levels (RTN) treats each input channel alike, yet a few channels of ``x`` carry most of the output (transformers'
outlier channels). AWQ scales those rows of ``W`` up before quantizing, so they get finer steps, and divides ``x`` by
the same factors, exact in float::

    LayerNormalization(γ, β) ─ x ─┬─ MatMul(Q(Wq))        LayerNormalization(γ/s, β/s) ─ x/s ─┬─ MatMul(Q(diag(s)·Wq))
                                  └─ MatMul(Q(Wk))                                          └─ MatMul(Q(diag(s)·Wk))
    Gelu ─ x ─┬─ MatMul(Q(W))                             Gelu ─ x ─┬─ Mul(1/s) ─ x/s ─ MatMul(Q(diag(s)·W))
              └─ Add (residual)                                     └─ Add (residual)

with ``s = mean|x_k|^α`` per input channel ``k``, one ``s`` for all the INT4 layers that read ``x`` (q, k, v), and
``α`` searched on a grid per input to minimise the calibration output error ``Σ ||x·W − x·diag(1/s)·Q(diag(s)·W)||²``.
Then AWQ's clip search: each block's range is shrunk by the factor (1 down to 0.5) that minimises the same error of
the block's own share of the output. Both errors are read off the inputs' Gram matrix ``XᵀX``, accumulated over every
calibration row, so no activations are kept. ``1/s`` is folded into the LayerNormalization that makes ``x`` when the
INT4 layers are its only readers (:func:`trt_bridge.calibrate.smooth.divide_layer_norm`, as SmoothQuant does), else
applied by one Mul before them; other readers keep ``x`` as it was. The float graph computes what it did; the chosen
codes and block scales go into the weight annotations, which lowering writes as they are.

Each layer's error is only a proxy for the model's: on a real DINOv2 ViT-S both steps lowered every layer's
calibration error (2.4 dB on average) and together still cost 0.5 dB on held-out photographs, each alone gaining
0.3-0.6 dB. So the whole model, rounded six ways (:data:`VARIANTS`) on all calibration feeds but the last few, is
judged on those; the best is fitted again on every feed and written (a real MiniLM-L3 encoder: 14.5 dB plain, 17.3 dB
AWQ; ModelOpt's int4 awq_clip 15.1 dB).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from trt_bridge.annotations import Annotations, WeightSpec
from trt_bridge.calibrate.feeds import FeedSource
from trt_bridge.calibrate.gptq import gptq_round
from trt_bridge.calibrate.gram import GramObserver
from trt_bridge.calibrate.session import CalibrationSession, HeldOut, bad_feed
from trt_bridge.calibrate.smooth import MIN_ROWS, S_RANGE, divide_layer_norm, foldable_layer_norm, rescale_weights
from trt_bridge.formats import FP4, INT4
from trt_bridge.ir.names import NameAllocator
from trt_bridge.ir.store import store_of
from trt_bridge.ir.toposort import toposort
from trt_bridge.ir.values import FLOAT32_TINY
from trt_bridge.lift.weights import block_axis, dequantize, float_type, quantize_blocks, representable_scale

log = logging.getLogger("trt_bridge.calibrate")

#: the exponents searched: 0 is plain rounding (s = 1), so the chosen one never does worse on the calibration data
ALPHAS = tuple(round(0.1 * i, 1) for i in range(11))
#: the factors a block's range is shrunk by (AWQ's clip search: 1 down to 0.5)
CLIPS = tuple(round(1.0 - 0.05 * i, 2) for i in range(11))
#: inputs wider than this are left to plain rounding (their Gram matrix would take over 512 MB)
MAX_CHANNELS = 8192
#: what the held-out feeds choose among: scaling and clipping (AWQ), either alone, plain rounding, GPTQ's error-
#: compensating rounding (:mod:`trt_bridge.calibrate.gptq`) alone and after AWQ's scaling; the first on ties
VARIANTS = ("awq", "clip", "scale", "rtn", "gptq", "scale-gptq")
#: FP4 weights (--fp4: their activations are quantized too, so AWQ's scaling of x is not tried): plain rounding first
FP4_VARIANTS = ("rtn", "gptq")
#: how much better on the held-out feeds another variant must be than AWQ (or the one before it) to be chosen
MARGIN_DB = 0.1
#: the Gram matrices gathered in one pass over the feeds, in bytes (more inputs: more passes)
GRAM_BYTES = 1 << 30


@dataclass(frozen=True)
class Scaled:
    """What AWQ did to the INT4 layers reading one input."""

    tensor: str  # the input the layers read
    layers: tuple[str, ...]
    alpha: float  # the chosen exponent (0: no scaling, clip search only)
    through: str  # what applies 1/s: "LayerNormalization" (folded), "Mul", or "" (α 0: nothing)
    applied_by: str
    max_factor: float  # the largest s / the smallest s
    clip: float  # the mean factor the blocks' ranges were shrunk by
    rtn_error: float  # calibration output error Σ||x·W − x·Q(W)||² with plain rounding
    error: float  # the same as written
    variant: str = "awq"  # of VARIANTS: what the held-out feeds chose for the whole model
    held_out_db: dict | None = None  # variant → the model's SNR on the held-out feeds ({}: none held out)
    format: str = "INT4"  # the weights' format: INT4, or FP4 (rounded plainly or by GPTQ only)


@dataclass
class _Layer:
    node: gs.Node
    spec: WeightSpec
    weight: np.ndarray  # [K, N] float32: the reduction axis first
    transposed: bool  # the stored weight is [N, K] (Gemm with transB)
    ftype: type


def groups(graph: gs.Graph, annotations: Annotations) -> dict[str, list[_Layer]]:
    """INT4 weights still to be quantized from float (no source codes), each read by one MatMul/Gemm as its
    input 1, grouped by the input ``x`` their layers multiply."""
    readers: dict[str, int] = {}
    for node in graph.nodes:
        for t in node.inputs:
            readers[t.name] = readers.get(t.name, 0) + 1
    found: dict[str, list[_Layer]] = {}
    for node in graph.nodes:
        if node.op not in ("MatMul", "Gemm") or len(node.inputs) < 2 or node.attrs.get("transA", 0):
            continue
        x, w = node.inputs[0], node.inputs[1]
        spec = annotations.weights.get(w.name)
        if (spec is None or spec.format not in (INT4, FP4) or spec.codes is not None or not spec.block_size
                or not isinstance(w, gs.Constant) or len(w.shape) != 2 or readers.get(w.name) != 1
                or isinstance(x, gs.Constant) or len(spec.sites) != 1):
            continue
        transposed = block_axis(spec.axis, 2) == 1
        values = np.asarray(w.values, np.float32)
        layer = _Layer(node, spec, values.T if transposed else values, transposed, float_type(w, "weight"))
        found.setdefault(x.name, []).append(layer)
    return {x: layers for x, layers in found.items()
            if len({layer.weight.shape[0] for layer in layers}) == 1 and layers[0].weight.shape[0] <= MAX_CHANNELS}


def apply_awq(graph: gs.Graph, annotations: Annotations, lifted: onnx.ModelProto, feeds: FeedSource,
              progress: bool = True) -> list[Scaled]:
    """Choose ``s`` and the clip factors of every INT4 weight group (:func:`groups`) on ``feeds`` run through the
    float model ``lifted`` (whose graph is ``graph``), and apply them in place: ``1/s`` in the graph, ``diag(s)·W`` as
    the float weights, the chosen codes and scales in their annotations. Inputs seen on fewer than ``MIN_ROWS``
    rows keep plain rounding; the last feeds (``HeldOut.size_for``) judge the variants (:func:`_judge`)."""
    found = groups(graph, annotations)
    known = {o for n in lifted.graph.node for o in n.output} | {i.name for i in lifted.graph.input}
    fmt = INT4 if any(layer.spec.format is INT4 for layers in found.values() for layer in layers) else FP4
    found = {x: layers for x, layers in found.items() if x in known and all(lr.spec.format is fmt for lr in layers)}
    if not found:
        return []
    variants = VARIANTS if fmt is INT4 else FP4_VARIANTS
    total = feeds.total
    # a model over 2 GB (its weights in a store) is not copied to be judged
    hold = HeldOut.size_for(total) if total is not None and total >= 8 and store_of(lifted) is None else 0
    outputs = [o.name for o in lifted.graph.output]
    kept: list[tuple[dict, dict]] = []  # held-out feeds and the float model's outputs on them
    options: dict[str, dict[str, tuple]] = {}
    merged: dict[str, GramObserver] = {}  # every feed's statistics, held-out ones too: the final fit's
    with CalibrationSession(lifted, sorted(found)) as session:
        for number, chunk in enumerate(_passes(found)):
            observers = {x: GramObserver() for x in chunk}
            held = {x: GramObserver() for x in chunk}
            names = [x for x in chunk if x not in session.graph_inputs] + [o for o in outputs if o not in chunk]
            for index, (feed, values) in enumerate(session.outputs(names, feeds)):
                got = {**{x: feed[x] for x in chunk if x in session.graph_inputs}, **dict(zip(names, values))}
                if bad_feed(feed, {o: got[o] for o in outputs}, index) is not None:
                    continue
                is_held = hold and index >= total - hold
                if is_held and number == 0:  # the first pass keeps them
                    kept.append((feed, {o: got[o] for o in outputs}))
                for x in chunk:
                    (held if is_held else observers)[x].update(got[x])
            for x in chunk:
                obs = observers.pop(x)
                if obs.rows < MIN_ROWS or obs.gram is None or obs.gram.shape[0] != found[x][0].weight.shape[0]:
                    log.info("AWQ leaves %r to plain rounding: %d calibration row(s), fewer than %d", x, obs.rows,
                             MIN_ROWS)
                    continue
                options[x], merged[x] = _variants(found[x], obs, variants), obs.joined(held[x])
    if not options:
        return []
    scores = {v: _judge(graph, found, options, v, kept) for v in variants} if kept else {}
    chosen = variants[0]
    for variant in variants[1:] if scores else ():  # the first unless another variant is clearly better
        if scores[variant] > scores[chosen] + MARGIN_DB:
            chosen = variant
    log.info("AWQ: held-out SNR by variant %s; chose %s", {k: round(v, 2) for k, v in scores.items()}, chosen)
    if kept:  # the chosen variant fitted again on every feed
        options = {x: {**by_variant, chosen: _variants(found[x], merged[x], (chosen,))[chosen]}
                   for x, by_variant in options.items()}
    names_ = NameAllocator(graph)
    tensors = graph.tensors()
    graph_outputs = {t.name for t in graph.outputs}
    done = [_commit(graph, annotations, tensors[x], found[x], options[x], chosen, names_, graph_outputs,
                    scores) for x in sorted(options)]
    if any(d.through for d in done):
        toposort(graph.cleanup())
    return done


def _passes(found: dict[str, list[_Layer]]) -> list[list[str]]:
    """The inputs in passes whose Gram matrices take at most ``GRAM_BYTES`` together (one input at least)."""
    passes: list[list[str]] = [[]]
    size = 0
    for x in sorted(found):
        k = found[x][0].weight.shape[0]
        if passes[-1] and size + 8 * k * k > GRAM_BYTES:
            passes.append([])
            size = 0
        passes[-1].append(x)
        size += 8 * k * k
    return passes


def search_alpha(gram: np.ndarray, mean_abs: np.ndarray, layers: list[_Layer]) -> tuple[float, np.ndarray, float,
                                                                                      float]:
    """(α, s, RTN's error, the chosen s's error): the grid's α whose ``s`` gives the least output error summed over
    ``layers`` (each ``x · (W − diag(1/s)·Q(diag(s)·W))``'s squared norm, from the Gram matrix)."""
    best = None
    rtn = 0.0
    for alpha in ALPHAS:
        s = factors(mean_abs, alpha)
        err = _error(gram, np.concatenate([layer.weight - _quantized(layer.weight * s[:, None], layer.spec.block_size,
                                                                     layer.ftype) / s[:, None].astype(np.float32)
                                           for layer in layers], axis=1))
        if alpha == 0:
            rtn = err
        if best is None or err < best[2]:
            best = (alpha, s, err)
    return best[0], best[1], rtn, best[2]


def factors(mean_abs: np.ndarray, alpha: float) -> np.ndarray:
    """AWQ's ``s = mean|x|^α`` per input channel, normalised to a geometric mean of max and min of 1, clipped
    (channels never seen non-zero take the smallest)."""
    a = np.maximum(np.asarray(mean_abs, np.float64), 0.0)
    floor = a[a > 0].min() if np.any(a > 0) else 1.0
    s = np.power(np.maximum(a, floor), alpha)
    s = s / np.sqrt(s.max() * s.min())
    return np.clip(s, *S_RANGE)


def search_clip(gram: np.ndarray, scaled: np.ndarray, block: int, ftype) -> np.ndarray:
    """Per block of ``block`` rows and per column of ``scaled`` (``diag(s)·W``, [K, N]), the factor of
    :data:`CLIPS` for its range whose rounding error ``x_b · (W_b − Q(W_b))`` is least (``gram``: of ``x/s``).
    Returns the factors, [blocks, N]."""
    k, n = scaled.shape
    blocks = -(-k // block)
    chosen = np.ones((blocks, n))
    for b in range(blocks):
        rows = slice(b * block, min(k, (b + 1) * block))
        w, g = scaled[rows], gram[rows, rows]
        amax = np.abs(w).max(axis=0)
        d = np.concatenate([w - _quantized(np.clip(w, -c * amax, c * amax), block, ftype) for c in CLIPS], axis=1)
        err = np.sum((g @ d) * d, axis=0).reshape(len(CLIPS), n)  # one product for every factor
        chosen[b] = np.asarray(CLIPS)[np.argmin(err, axis=0)]  # the first (largest) factor on ties
    return chosen


def _variants(layers: list[_Layer], obs: GramObserver, variants: tuple[str, ...] = VARIANTS) -> dict[str, tuple]:
    """Per variant of :data:`VARIANTS`: (α, s, [(codes, scales) per layer as stored], mean clip factor, error, plain
    rounding's error)."""
    fmt = layers[0].spec.format
    if fmt is INT4:
        alpha, s_best, rtn, _ = search_alpha(obs.gram.astype(np.float32), obs.mean_abs, layers)
    else:  # FP4: x keeps its values (its FP4 quantization takes them as they are)
        alpha, s_best, rtn = 0.0, np.ones(obs.gram.shape[0]), None
        variants = tuple(dict.fromkeys(("rtn", *variants)))  # its error is the record's rtn_error
    found = {}
    for variant in variants:
        scaled_too, clipped_too = variant in ("awq", "scale", "scale-gptq"), variant in ("awq", "clip")
        a, s = (alpha, s_best) if scaled_too and alpha else (0.0, np.ones_like(s_best))
        gram = (obs.gram / np.outer(s, s)).astype(np.float32)  # of x/s
        quantized, clips, error = [], [], 0.0
        for layer in layers:
            scaled = np.asarray((layer.weight * s[:, None]).astype(layer.ftype), np.float32)  # as rescaled, [K, N]
            block = layer.spec.block_size
            chosen = search_clip(gram, scaled, block, layer.ftype) if clipped_too else np.ones((1, 1))
            limit = np.repeat(chosen * np.abs(_blocks(scaled, block)).max(axis=1), block, axis=0)[:scaled.shape[0]]
            clipped = np.clip(scaled, -limit, limit)
            got = gptq_round(scaled, gram, block, layer.ftype, fmt) if variant.endswith("gptq") else None
            if got is not None:  # GPTQ rounds [K, N]
                codes, scale = (got[0].T, got[1].T) if layer.transposed else got
            else:
                codes, scale = quantize_blocks(clipped.T if layer.transposed else clipped,  # clipped: ranged already
                                               block_axis(layer.spec.axis, 2), block, layer.ftype, fmt,
                                               search=not clipped_too)
            deq = dequantize(codes, scale, block_axis(layer.spec.axis, 2), block)
            error += _error(gram, scaled - (deq.T if layer.transposed else deq))
            quantized.append((codes, scale))
            clips.append(float(chosen.mean()))
        found[variant] = (a, s, quantized, float(np.mean(clips)), error, rtn)
    if rtn is None:  # FP4: plain rounding's error is its variant's
        found = {v: (*got[:5], found["rtn"][4]) for v, got in found.items()}
    return found


def _judge(graph: gs.Graph, found: dict[str, list[_Layer]], options: dict[str, dict[str, tuple]], variant: str,
           kept: list[tuple[dict, dict]]) -> float:
    """The worst output's SNR (dB) on the held-out feeds of the float graph with every INT4 weight as ``variant``
    writes it (``diag(1/s)·Q(diag(s)·W)``, dequantized)."""
    candidate = graph.copy()
    nodes = {n.name: n for n in candidate.nodes}
    for x, by_variant in options.items():
        s, quantized = by_variant[variant][1:3]
        for layer, (codes, scale) in zip(found[x], quantized, strict=True):
            deq = dequantize(codes, scale, block_axis(layer.spec.axis, 2), layer.spec.block_size)
            deq = deq / (s[None, :] if layer.transposed else s[:, None])
            node = nodes[layer.node.name]
            node.inputs[1] = gs.Constant(f"{node.inputs[1].name}_{variant}", deq.astype(layer.ftype))
    names = list(kept[0][1])
    worst = np.inf
    with CalibrationSession(gs.export_onnx(candidate), [], what="an AWQ candidate") as session:
        got = [values for _, values in session.outputs(names, [feed for feed, _ in kept])]
    for i, name in enumerate(names):
        ref = np.concatenate([np.asarray(out[name], np.float64).ravel() for _, out in kept])
        if not np.issubdtype(ref.dtype, np.floating):
            continue
        test = np.concatenate([np.asarray(g[i], np.float64).ravel() for g in got])
        finite = np.isfinite(ref) & np.isfinite(test)
        noise = np.sum((ref[finite] - test[finite]) ** 2)
        worst = min(worst, 10 * np.log10(np.sum(ref[finite] ** 2) / noise) if noise > 0 else np.inf)
    return float(worst)


def _commit(graph: gs.Graph, annotations: Annotations, x: gs.Tensor, layers: list[_Layer],
            by_variant: dict[str, tuple], variant: str, names: NameAllocator, graph_outputs: set[str],
            scores: dict[str, float]) -> Scaled:
    """Apply ``variant`` of one input's layers: 1/s in the graph, diag(s)·W, the codes and scales."""
    alpha, s, quantized, clip, error, rtn = by_variant[variant]
    nodes = [layer.node for layer in layers]
    through = applied_by = ""
    if alpha:
        ln = foldable_layer_norm(x, nodes, graph_outputs)
        ftype = np.dtype(x.dtype) if x.dtype is not None else np.dtype(np.float32)
        if ln is not None and {id(n) for n in x.outputs} == {id(n) for n in nodes}:  # every reader takes 1/s
            divide_layer_norm(ln, s, names)
            through, applied_by = "LayerNormalization", ln.name
        else:  # x ─ Mul(1/s) ─ x/s ─ the INT4 layers; the other readers keep x
            divided = gs.Variable(names(f"{x.name}_awq"), dtype=x.dtype, shape=x.shape)
            applied_by = names(f"{x.name}_awq_scale")
            graph.nodes.append(gs.Node("Mul", applied_by, inputs=[x, gs.Constant(
                names(f"{x.name}_awq_divisors"), (1.0 / s).astype(ftype))], outputs=[divided]))
            for node in nodes:
                node.inputs[0] = divided
            through = "Mul"
        stored = [(layer.weight.T if layer.transposed else layer.weight) for layer in layers]
        specs = rescale_weights(annotations, nodes, stored, s, names, layers[0].ftype, "awq")
    else:
        specs = [layer.spec for layer in layers]
    for spec, (codes, scale) in zip(specs, quantized, strict=True):
        spec.codes, spec.scale = codes, scale
    return Scaled(x.name, tuple(n.name for n in nodes), alpha, through, applied_by, float(s.max() / s.min()),
                  round(clip, 3), float(rtn), float(error), variant,
                  {k: round(v, 2) for k, v in scores.items()}, layers[0].spec.format.label)


def _blocks(w: np.ndarray, block: int) -> np.ndarray:
    """``w`` [K, N] as [blocks, block, N], the last block padded with zeros."""
    k = w.shape[0]
    blocks = -(-k // block)
    padded = np.concatenate([w, np.zeros((blocks * block - k, w.shape[1]), w.dtype)]) if blocks * block != k else w
    return padded.reshape(blocks, block, w.shape[1])


def _quantized(w: np.ndarray, block: int, ftype) -> np.ndarray:
    """``w`` [K, N] through the INT4 block quantizer (blocks along K) and back, in float32: the values
    :func:`~trt_bridge.lift.weights.quantize_blocks` gives, without its int4 codes (a search's inner loop)."""
    w = np.asarray(w.astype(ftype), np.float32)
    blocked = _blocks(w, block)
    amax = np.abs(blocked).max(axis=1, keepdims=True)
    scale = representable_scale(np.where(amax > 0, np.maximum(amax / INT4.qmax, FLOAT32_TINY), 1.0 / INT4.qmax),
                                ftype).astype(np.float32)
    q = np.clip(np.rint(blocked / scale), -INT4.qmax, INT4.qmax) * scale
    return q.reshape(-1, w.shape[1])[:w.shape[0]]


def _error(gram: np.ndarray, delta: np.ndarray) -> float:
    """``||X · delta||²`` from ``gram = XᵀX``."""
    return float(np.sum((gram @ delta) * delta, dtype=np.float64))
