"""A small streaming voice-activity detector with control flow, shaped like Silero VAD: the sample rate picks one of
two ``If`` branches, each a Conv → Relu → LSTM → MatMul stack whose weights are ``Constant`` nodes inside the
branch, reading the audio and the LSTM state from the outer graph.

```
 x [1,1,64] ──Conv──Mul(gain)──▶ xs ─────────────────┐   (outer-scope names the branches read: xs, h0, c0)
 sr ──Equal(16000)──▶ cond ──▶ If ─────────────┤
                then (16 kHz): Conv(k5) → Relu → Conv → Relu → Transpose → LSTM(h0, c0) → Squeeze → MatMul → Relu
                                 → MatMul
                else  (8 kHz): Conv(k3) → ... (the same layers, other weights)
                               If ──▶ logits ──Sigmoid──▶ prob [64,1,4]
```
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

CHANNELS, HIDDEN, CLASSES, SAMPLES = 16, 16, 4, 64


def _constant(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], name=f"{name}/const",
                            value=numpy_helper.from_array(
                                value if value.dtype == np.int64 else value.astype(np.float32), name))


def _branch(tag: str, kernel: int, rng: np.random.Generator) -> onnx.GraphProto:
    """Conv → Relu → Conv → Relu → Transpose → LSTM → Squeeze → MatMul → Relu → MatMul, weights as Constant nodes,
    reading xs, h0 and c0 from the outer graph."""
    def weight(*shape, scale=1.0):
        return rng.normal(0.0, scale / np.sqrt(np.prod(shape[1:])), shape).astype(np.float32)

    p = f"{tag}/"
    nodes = [
        _constant(p + "conv_w", weight(CHANNELS, 1, kernel)),
        _constant(p + "conv_b", rng.normal(0.0, 0.1, CHANNELS)),
        helper.make_node("Conv", ["xs", p + "conv_w", p + "conv_b"], [p + "conv"], p + "conv",
                         pads=[kernel // 2, kernel // 2]),
        helper.make_node("Relu", [p + "conv"], [p + "relu"], p + "relu"),
        _constant(p + "conv2_w", weight(CHANNELS, CHANNELS, 3, scale=1.5)),
        _constant(p + "conv2_b", rng.normal(0.0, 0.1, CHANNELS)),
        helper.make_node("Conv", [p + "relu", p + "conv2_w", p + "conv2_b"], [p + "conv2"], p + "conv2", pads=[1, 1]),
        helper.make_node("Relu", [p + "conv2"], [p + "relu2"], p + "relu2"),
        helper.make_node("Transpose", [p + "relu2"], [p + "seq"], p + "transpose", perm=[2, 0, 1]),
        _constant(p + "lstm_w", weight(1, 4 * HIDDEN, CHANNELS, scale=1.5)),
        _constant(p + "lstm_r", weight(1, 4 * HIDDEN, HIDDEN, scale=1.5)),
        _constant(p + "lstm_b", rng.normal(0.0, 0.1, (1, 8 * HIDDEN))),
        helper.make_node("LSTM", [p + "seq", p + "lstm_w", p + "lstm_r", p + "lstm_b", "", "h0", "c0"],
                         [p + "lstm_y"], p + "lstm", hidden_size=HIDDEN),
        _constant(p + "axes", np.array([1], np.int64)),
        helper.make_node("Squeeze", [p + "lstm_y", p + "axes"], [p + "hidden"], p + "squeeze"),
        _constant(p + "fc_w", weight(HIDDEN, HIDDEN, scale=1.5)),
        helper.make_node("MatMul", [p + "hidden", p + "fc_w"], [p + "fc"], p + "fc"),
        helper.make_node("Relu", [p + "fc"], [p + "fc_relu"], p + "fc_relu"),
        _constant(p + "head_w", weight(HIDDEN, CLASSES, scale=2.0)),
        helper.make_node("MatMul", [p + "fc_relu", p + "head_w"], [p + "logits"], p + "head"),
    ]
    return helper.make_graph(nodes, tag, [], [helper.make_tensor_value_info(
        p + "logits", TensorProto.FLOAT, [SAMPLES, 1, CLASSES])])


def vad_model(seed: int = 0) -> onnx.ModelProto:
    """The float control-flow VAD (see the module's drawing); opset 17, checked by onnx."""
    rng = np.random.default_rng(seed)
    then, other = _branch("sr16k", 5, rng), _branch("sr8k", 3, rng)
    nodes = [
        helper.make_node("Conv", ["x", "front_w"], ["front"], "front", pads=[1, 1]),
        helper.make_node("Mul", ["front", "gain"], ["xs"], "gain"),
        helper.make_node("Equal", ["sr", "sr16k_rate"], ["cond"], "is16k"),
        helper.make_node("If", ["cond"], ["logits"], "If_0", then_branch=then, else_branch=other),
        helper.make_node("Sigmoid", ["logits"], ["prob"], "prob"),
    ]
    inits = [numpy_helper.from_array(np.array([[[0.25, 1.0, -0.25]]], np.float32), "front_w"),
             numpy_helper.from_array(np.array(2.0, np.float32), "gain"),
             numpy_helper.from_array(np.array(16000, np.int64), "sr16k_rate")]
    graph = helper.make_graph(
        nodes, "vad",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, SAMPLES]),
         helper.make_tensor_value_info("sr", TensorProto.INT64, []),
         helper.make_tensor_value_info("h0", TensorProto.FLOAT, [1, 1, HIDDEN]),
         helper.make_tensor_value_info("c0", TensorProto.FLOAT, [1, 1, HIDDEN])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [SAMPLES, 1, CLASSES])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def constants_as_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose subgraphs hold their ``Constant`` nodes' values as their own initializers, as
    onnxruntime's optimizer (``quant_pre_process``) leaves them: ``quantize_dynamic`` quantizes weights only when
    they are initializers."""
    out = onnx.ModelProto()
    out.CopyFrom(model)

    def visit(graph: onnx.GraphProto, inner: bool) -> None:
        kept = []
        for node in graph.node:
            if inner and node.op_type == "Constant":
                graph.initializer.append(numpy_helper.from_array(numpy_helper.to_array(node.attribute[0].t),
                                                                 node.output[0]))
                continue
            kept.append(node)
            for attr in node.attribute:
                for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                    visit(sub, True)
        del graph.node[:]
        graph.node.extend(kept)

    visit(out.graph, False)
    return out


def vad_feeds(count: int, seed: int = 1, rate: int = 16000) -> list[dict[str, np.ndarray]]:
    """``count`` feeds at sample rate ``rate``: audio-like chunks and small LSTM states."""
    rng = np.random.default_rng(seed)
    t = np.arange(SAMPLES, dtype=np.float32)
    feeds = []
    for _ in range(count):
        tone = np.sin(2 * np.pi * rng.uniform(0.02, 0.2) * t + rng.uniform(0, 6.28)) * rng.uniform(0.2, 1.0)
        x = (tone + rng.normal(0, 0.1, SAMPLES)).astype(np.float32).reshape(1, 1, SAMPLES)
        feeds.append({"x": x, "sr": np.array(rate, np.int64),
                      "h0": rng.normal(0, 0.3, (1, 1, HIDDEN)).astype(np.float32),
                      "c0": rng.normal(0, 0.3, (1, 1, HIDDEN)).astype(np.float32)})
    return feeds
