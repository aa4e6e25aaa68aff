"""Old-opset recurrent models as torch's opset-9 exporter writes them: ``x.squeeze()`` as a Squeeze without axes,
``unsqueeze`` with its axes attribute, a bidirectional GRU with a state input, a dynamic length.

```
 x [1, 1, T] ─ Conv(k3) ─ Relu ─ Squeeze() ─ [8, T] ─ Transpose ─ Unsqueeze(axes=[1]) ─ [T, 1, 8]
   state [2, 1, 16] ─────────────────────────────────────────────────────┐
                                                  GRU(bidirectional, hidden 16) ─ y [T, 2, 1, 16] ── state_out
   y ─ Transpose(0, 2, 1, 3) ─ Squeeze() ─ [T, 2, 16] ─ Reshape [T, 32] ─ MatMul ─ Sigmoid ─ score [T, 1]
```

TensorRT fixes ranks when it builds: it refuses both Squeezes ("ISqueezeLayer without an axes input requires
dimension 2 to not be 1 at runtime") although its parser takes the model.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HIDDEN, CHANNELS = 16, 8
#: the dynamic length's range the tests build and compare at
MIN_T, MAX_T = 16, 64


def gru_model(seed: int = 0, opset: int = 9) -> onnx.ModelProto:
    """The echo-canceller-like scorer drawn above (opset 9 unless ``opset``; checked by onnx)."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(value.astype(value.dtype), name) for name, value in (
        ("conv_w", rng.normal(0, 0.5, (CHANNELS, 1, 3)).astype(np.float32)),
        ("conv_b", rng.normal(0, 0.1, CHANNELS).astype(np.float32)),
        ("gru_w", rng.normal(0, 0.3, (2, 3 * HIDDEN, CHANNELS)).astype(np.float32)),
        ("gru_r", rng.normal(0, 0.3, (2, 3 * HIDDEN, HIDDEN)).astype(np.float32)),
        ("gru_b", rng.normal(0, 0.1, (2, 6 * HIDDEN)).astype(np.float32)),
        ("head_w", rng.normal(0, 0.3, (2 * HIDDEN, 1)).astype(np.float32)),
        ("shape", np.array([0, 2 * HIDDEN], np.int64)))]
    unsqueeze = (helper.make_node("Unsqueeze", ["seq2"], ["seq"], "unsqueeze_batch", axes=[1]) if opset < 13 else
                 helper.make_node("Unsqueeze", ["seq2", "one"], ["seq"], "unsqueeze_batch"))
    if opset >= 13:
        inits.append(numpy_helper.from_array(np.array([1], np.int64), "one"))
    nodes = [
        helper.make_node("Conv", ["x", "conv_w", "conv_b"], ["conv"], "conv", pads=[1, 1]),
        helper.make_node("Relu", ["conv"], ["relu"], "relu"),
        helper.make_node("Squeeze", ["relu"], ["feat"], "squeeze_batch"),
        helper.make_node("Transpose", ["feat"], ["seq2"], "transpose", perm=[1, 0]),
        unsqueeze,
        helper.make_node("GRU", ["seq", "gru_w", "gru_r", "gru_b", "", "state"], ["y", "state_out"], "gru",
                         hidden_size=HIDDEN, direction="bidirectional", linear_before_reset=1),
        helper.make_node("Transpose", ["y"], ["yt"], "yt", perm=[0, 2, 1, 3]),
        helper.make_node("Squeeze", ["yt"], ["ys"], "squeeze_y"),
        helper.make_node("Reshape", ["ys", "shape"], ["yr"], "reshape"),
        helper.make_node("MatMul", ["yr", "head_w"], ["logit"], "head"),
        helper.make_node("Sigmoid", ["logit"], ["score"], "score"),
    ]
    graph = helper.make_graph(nodes, "aec", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, "T"]),
        helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, 1, HIDDEN])],
        [helper.make_tensor_value_info("score", TensorProto.FLOAT, ["T", 1]),
         helper.make_tensor_value_info("state_out", TensorProto.FLOAT, [2, 1, HIDDEN])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 4 if opset < 13 else 7
    onnx.checker.check_model(model, full_check=True)
    return model


def gru_feeds(count: int, seed: int = 1, lengths: tuple[int, ...] = (MIN_T, MAX_T)) -> list[dict[str, np.ndarray]]:
    """``count`` feeds whose lengths cycle through ``lengths``: a noisy tone and a small state."""
    rng = np.random.default_rng(seed)
    feeds = []
    for i in range(count):
        t = lengths[i % len(lengths)]
        tone = np.sin(np.arange(t) * rng.uniform(0.1, 0.8)) * rng.uniform(0.3, 1.0) + rng.normal(0, 0.1, t)
        feeds.append({"x": tone.astype(np.float32).reshape(1, 1, t),
                      "state": rng.normal(0, 0.3, (2, 1, HIDDEN)).astype(np.float32)})
    return feeds


def save_feeds(folder, feeds: list[dict[str, np.ndarray]]):
    """``feeds`` as a folder of .npz files (lengths differ: they cannot stack into one)."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, feed in enumerate(feeds):
        np.savez(folder / f"feed{i:03d}.npz", **feed)
    return folder


def branch_squeeze_model(seed: int = 0) -> onnx.ModelProto:
    """A Squeeze without axes that no rule rewrites (inside an If branch: sanitizing passes leave bodies alone), so
    TensorRT's builder still refuses the converted model::

        x [1, 1, T] ─ Conv ─ Relu ─ r ─▶ If(flag) ─ then: Squeeze(r) ─┐
                                                 └ else: Neg(r) ─ Squeeze ─┴─ [8, T] ─ Transpose ─ MatMul ─ y [T, 4]
    """
    rng = np.random.default_rng(seed)

    def branch(name: str, negate: bool) -> onnx.GraphProto:
        nodes = [helper.make_node("Neg", ["r"], [f"{name}/neg"], f"{name}/neg")] if negate else []
        nodes.append(helper.make_node("Squeeze", [f"{name}/neg" if negate else "r"], [f"{name}/sq"], f"{name}/sq"))
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(f"{name}/sq", TensorProto.FLOAT,
                                                                                 None)])

    inits = [numpy_helper.from_array(rng.normal(0, 0.5, (CHANNELS, 1, 3)).astype(np.float32), "conv_w"),
             numpy_helper.from_array(rng.normal(0, 0.3, (CHANNELS, 4)).astype(np.float32), "head_w")]
    nodes = [
        helper.make_node("Conv", ["x", "conv_w"], ["conv"], "conv", pads=[1, 1]),
        helper.make_node("Relu", ["conv"], ["r"], "relu"),
        helper.make_node("If", ["flag"], ["feat"], "pick", then_branch=branch("then", False),
                         else_branch=branch("else", True)),
        helper.make_node("Transpose", ["feat"], ["seq"], "transpose", perm=[1, 0]),
        helper.make_node("MatMul", ["seq", "head_w"], ["y"], "head"),
    ]
    graph = helper.make_graph(nodes, "branch_squeeze", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, "T"]),
        helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T", 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    onnx.checker.check_model(model, full_check=True)
    return model
