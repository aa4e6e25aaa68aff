"""Small float models and inputs built in code, for ``make demo``, tests and benchmarks.

Nothing here is downloaded: the models are written with ``onnx.helper`` and
seeded random weights, the inputs are seeded synthetic data.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from trt_bridge.ir.model import validate_model

OPSET = 17


def _init(name: str, values: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.ascontiguousarray(values), name)


def conv_net(seed: int = 0, channels: tuple[int, int] = (16, 32), classes: int = 10) -> onnx.ModelProto:
    """A small image classifier::

        x[N,3,32,32] ─ Conv3x3 ─ Relu ─ Conv3x3/2 ─ Relu ─ Conv3x3 (grouped) ─ Relu ─ GlobalAvgPool
                     ─ Flatten ─ MatMul ─ Add ─ logits[N,10]
    """
    rng = np.random.default_rng(seed)
    c1, c2 = channels

    def w(*shape):
        fan_in = int(np.prod(shape[1:]))
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)

    inits = [
        _init("conv1.weight", w(c1, 3, 3, 3)), _init("conv1.bias", rng.normal(0, 0.1, c1).astype(np.float32)),
        _init("conv2.weight", w(c2, c1, 3, 3)), _init("conv2.bias", rng.normal(0, 0.1, c2).astype(np.float32)),
        _init("conv3.weight", w(c2, c2 // 4, 3, 3)), _init("conv3.bias", rng.normal(0, 0.1, c2).astype(np.float32)),
        _init("fc.weight", (rng.standard_normal((c2, classes)) / np.sqrt(c2)).astype(np.float32)),
        _init("fc.bias", rng.normal(0, 0.1, classes).astype(np.float32)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "conv1.weight", "conv1.bias"], ["c1"], "conv1", pads=[1, 1, 1, 1],
                         kernel_shape=[3, 3]),  # exporters (PyTorch, paddle2onnx) always write kernel_shape
        helper.make_node("Relu", ["c1"], ["r1"], "relu1"),
        helper.make_node("Conv", ["r1", "conv2.weight", "conv2.bias"], ["c2"], "conv2", pads=[1, 1, 1, 1],
                         strides=[2, 2], kernel_shape=[3, 3]),
        helper.make_node("Relu", ["c2"], ["r2"], "relu2"),
        helper.make_node("Conv", ["r2", "conv3.weight", "conv3.bias"], ["c3"], "conv3", pads=[1, 1, 1, 1],
                         group=4, kernel_shape=[3, 3]),
        helper.make_node("Relu", ["c3"], ["r3"], "relu3"),
        helper.make_node("GlobalAveragePool", ["r3"], ["gap"], "gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], "flatten"),
        helper.make_node("MatMul", ["flat", "fc.weight"], ["fc"], "fc"),
        helper.make_node("Add", ["fc", "fc.bias"], ["logits"], "fc_bias"),
    ]
    graph = helper.make_graph(
        nodes, "conv_net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 32, 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", classes])], inits)
    return _finish(graph)


def attention(nodes: list, linear, p: str, x: str, hidden: int) -> str:
    """Append multi-head self-attention over ``x`` to ``nodes`` (q, k, v projections made by ``linear``, split into
    heads, scaled dot products, Softmax, merged, output projection); return its output's name. The graph provides
    the constants ``heads_shape``, ``sqrt_d`` and ``merge_shape``. Shared with scripts/large_model.py."""
    split = {}
    for part in ("q", "k", "v"):
        out = linear(f"{p}.attn.{part}", x, hidden, hidden)
        nodes.append(helper.make_node("Reshape", [out, "heads_shape"], [f"{p}.{part}.h"], f"{p}/{part}/Reshape"))
        perm = [0, 2, 3, 1] if part == "k" else [0, 2, 1, 3]
        nodes.append(helper.make_node("Transpose", [f"{p}.{part}.h"], [f"{p}.{part}.t"], f"{p}/{part}/Transpose",
                                      perm=perm))
        split[part] = f"{p}.{part}.t"
    nodes += [
        helper.make_node("MatMul", [split["q"], split["k"]], [f"{p}.scores"], f"{p}/scores"),
        helper.make_node("Div", [f"{p}.scores", "sqrt_d"], [f"{p}.scaled"], f"{p}/scale"),
        helper.make_node("Softmax", [f"{p}.scaled"], [f"{p}.probs"], f"{p}/softmax", axis=-1),
        helper.make_node("MatMul", [f"{p}.probs", split["v"]], [f"{p}.ctx"], f"{p}/context"),
        helper.make_node("Transpose", [f"{p}.ctx"], [f"{p}.ctx.t"], f"{p}/ctx/Transpose", perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", [f"{p}.ctx.t", "merge_shape"], [f"{p}.ctx.m"], f"{p}/ctx/Reshape"),
    ]
    return linear(f"{p}.attn.out", f"{p}.ctx.m", hidden, hidden)


def gelu(nodes: list, p: str, x: str) -> str:
    """Append the exact Gelu, 0.5·x·(1 + erf(x/√2)), of ``x`` to ``nodes`` (constants ``inv_sqrt2``, ``one``,
    ``half``); return its output's name."""
    nodes += [
        helper.make_node("Mul", [x, "inv_sqrt2"], [f"{p}.g0"], f"{p}/gelu/div"),
        helper.make_node("Erf", [f"{p}.g0"], [f"{p}.g1"], f"{p}/gelu/erf"),
        helper.make_node("Add", [f"{p}.g1", "one"], [f"{p}.g2"], f"{p}/gelu/add"),
        helper.make_node("Mul", [x, f"{p}.g2"], [f"{p}.g3"], f"{p}/gelu/mul"),
        helper.make_node("Mul", [f"{p}.g3", "half"], [f"{p}.gelu"], f"{p}/gelu/half"),
    ]
    return f"{p}.gelu"


def transformer_block(seed: int = 0, hidden: int = 64, heads: int = 4, seq: int = 16, layers: int = 1,
                      ffn: int | None = None) -> onnx.ModelProto:
    """A pre-LayerNorm encoder, ``layers`` blocks deep::

        x[N,S,D] ─┬ LayerNorm ─ MatMul+Add (q,k,v) ─ heads ─ MatMul(qkᵀ)/√d ─ Softmax ─ MatMul(v)
                  │            ─ merge heads ─ MatMul+Add (out) ─┐
                  └──────────────────────────────────────────── Add ─┬ LayerNorm ─ MatMul+Add ─ Gelu
                                                                     │            ─ MatMul+Add ─┐
                                                                     └──────────────────────── Add ─ y
    """
    if hidden % heads:
        raise ValueError(f"hidden size {hidden} is not a multiple of heads {heads}")
    rng = np.random.default_rng(seed)
    ffn = ffn or 4 * hidden
    head_dim = hidden // heads
    nodes, inits = [], [
        _init("heads_shape", np.array([0, 0, heads, head_dim], np.int64)),
        _init("merge_shape", np.array([0, 0, hidden], np.int64)),
        _init("sqrt_d", np.array(np.sqrt(head_dim), np.float32)),
        _init("half", np.array(0.5, np.float32)), _init("one", np.array(1.0, np.float32)),
        _init("inv_sqrt2", np.array(1 / np.sqrt(2), np.float32)),
    ]

    def linear(name: str, x: str, d_in: int, d_out: int) -> str:
        inits.append(_init(f"{name}.weight", (rng.standard_normal((d_in, d_out)) / np.sqrt(d_in)).astype(np.float32)))
        inits.append(_init(f"{name}.bias", rng.normal(0, 0.02, d_out).astype(np.float32)))
        nodes.append(helper.make_node("MatMul", [x, f"{name}.weight"], [f"{name}.mm"], f"{name}/MatMul"))
        nodes.append(helper.make_node("Add", [f"{name}.mm", f"{name}.bias"], [f"{name}.out"], f"{name}/Add"))
        return f"{name}.out"

    def layer_norm(name: str, x: str) -> str:
        inits.append(_init(f"{name}.gamma", (1 + rng.normal(0, 0.1, hidden)).astype(np.float32)))
        inits.append(_init(f"{name}.beta", rng.normal(0, 0.1, hidden).astype(np.float32)))
        nodes.append(helper.make_node("LayerNormalization", [x, f"{name}.gamma", f"{name}.beta"], [f"{name}.out"],
                                      name, axis=-1, epsilon=1e-5))
        return f"{name}.out"

    x = "x"
    for i in range(layers):
        p = f"layer{i}"
        ln1 = layer_norm(f"{p}.ln1", x)
        attn = attention(nodes, linear, p, ln1, hidden)
        nodes.append(helper.make_node("Add", [x, attn], [f"{p}.res1"], f"{p}/residual1"))
        ln2 = layer_norm(f"{p}.ln2", f"{p}.res1")
        down = linear(f"{p}.ffn.down", gelu(nodes, p, linear(f"{p}.ffn.up", ln2, hidden, ffn)), ffn, hidden)
        out = "y" if i == layers - 1 else f"{p}.out"
        nodes.append(helper.make_node("Add", [f"{p}.res1", down], [out], f"{p}/residual2"))
        x = out
    graph = helper.make_graph(
        nodes, "transformer_block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", seq, hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", seq, hidden])], inits)
    return _finish(graph)


def _finish(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="trt-bridge")
    model.ir_version = 8
    # the checker and strict shape inference, on a weight-free skeleton (BERT-sized samples are 340 MB)

    return validate_model(model, "sample model", strict=True)


def image_feeds(count: int, seed: int, shape=(1, 3, 32, 32)) -> np.ndarray:
    """Smooth, correlated images (not white noise): ``count`` feeds of ``shape``, stacked on axis 0."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((count, *shape)).astype(np.float32)
    kernel = np.ones(5, np.float32) / 5
    for axis in (-1, -2):
        base = np.apply_along_axis(lambda v: np.convolve(v, kernel, mode="same"), axis, base)
    return (base * 2.0).astype(np.float32)


def sequence_feeds(count: int, seed: int, seq: int, hidden: int) -> np.ndarray:
    """Embedding-like sequences with a few outlier channels (as real transformer activations have).

    The outlier channels are a property of the "model", the same for every seed."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((count, 1, seq, hidden)).astype(np.float32)
    outliers = np.random.default_rng(hidden).choice(hidden, size=max(1, hidden // 32), replace=False)
    x[..., outliers] *= 6.0
    return x


def digit_feeds(count: int, seed: int) -> np.ndarray:
    """MNIST-like inputs: ``count`` feeds of [1,1,28,28], pixel values 0-255.

    Each image is a few thick random pen strokes (lines and arcs) on black,
    blurred: the statistics (mostly 0, bright strokes) of handwritten digits.
    """
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:28, 0:28].astype(np.float32)
    images = np.zeros((count, 1, 1, 28, 28), np.float32)
    for i in range(count):
        img = np.zeros((28, 28), np.float32)
        for _ in range(rng.integers(2, 5)):
            t = np.linspace(0, 1, 40)[:, None, None]
            if rng.random() < 0.5:  # a line
                p0, p1 = rng.uniform(5, 23, 2), rng.uniform(5, 23, 2)
                cy, cx = p0[0] + t * (p1[0] - p0[0]), p0[1] + t * (p1[1] - p0[1])
            else:  # an arc
                c, r = rng.uniform(9, 19, 2), rng.uniform(3, 8)
                a0 = rng.uniform(0, 2 * np.pi)
                ang = a0 + t * rng.uniform(np.pi / 2, 2 * np.pi)
                cy, cx = c[0] + r * np.sin(ang), c[1] + r * np.cos(ang)
            d2 = (yy[None] - cy) ** 2 + (xx[None] - cx) ** 2
            img = np.maximum(img, np.exp(-d2 / 2.0).max(axis=0))
        images[i, 0, 0] = np.clip(img * 255.0 * 1.2, 0, 255)
    return images
