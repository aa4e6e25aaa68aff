"""The hostile-input cases of issue 37 ("hostile input, round three"), one row each, run by ``test_hostile.py`` as
``cases.py``'s rows are (same :class:`Case`, same assertions). ``VALUE_CASES``: bad values that got past the
loaders (G3) and internal errors where a one-line refusal belongs (G5): each is refused before any work, by
``convert`` and ``check`` alike, with the node or tensor that holds it. The model builders are shared with
``tests/test_source_values.py``, which converts what is converted (INT4 activations, K not a multiple of the block).
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.hostile.cases import Case
from tests.hostile.conftest import float_net

FLOAT32_TINY = float(np.finfo(np.float32).tiny)


def _raw(name: str, code: int, values, dtype) -> onnx.TensorProto:
    values = np.asarray(values, np.float32).astype(dtype)
    return helper.make_tensor(name, code, values.shape, values.view(np.uint8 if values.itemsize == 1 else np.uint16)
                              .tobytes(), raw=True)


def fp8_weight_model(bad_code: int | None = None, code: int = TensorProto.FLOAT8E4M3FN,
                     dtype=ml_dtypes.float8_e4m3fn) -> onnx.ModelProto:
    """x[8,32] ─ MatMul(DQ(W: float8 codes per column)) ─ y[8,32]; ``bad_code``: the raw byte put at W's 6th code
    (0x7F: float8e4m3fn's NaN; 0x7C: float8e5m2's +Inf)."""
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((32, 32)) / 8).astype(np.float32)
    w_scale = (np.abs(w).max(axis=0) / float(ml_dtypes.finfo(dtype).max)).astype(np.float32)
    codes = _raw("wq", code, w / w_scale, dtype)
    if bad_code is not None:
        data = bytearray(codes.raw_data)
        data[5] = bad_code
        codes.raw_data = bytes(data)
    nodes = [helper.make_node("DequantizeLinear", ["wq", "w_scale", "w_zp"], ["wd"], "w_dq", axis=1),
             helper.make_node("MatMul", ["x", "wd"], ["y"], "mm")]
    inits = [codes, numpy_helper.from_array(w_scale, "w_scale"), _raw("w_zp", code, np.zeros(32), dtype)]
    graph = helper.make_graph(nodes, "fp8", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 32])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    return model


def activation_qdq_model(scale, scale_type: int = TensorProto.BFLOAT16, code: int = TensorProto.FLOAT8E4M3FN,
                         opset: int = 19, output_dtype: int | None = None, zero_point: int = 0) -> onnx.ModelProto:
    """The hostile float net with x ─ [Cast to ``scale_type``] ─ Q(scale, zero point of ``code``) ─ DQ ─ [Cast
    back] ─ conv1. ``output_dtype``: the Q names its codes' type that way (opset 21) instead of a zero point."""
    model = float_net()
    model.opset_import[0].version = opset
    model.ir_version = 9 if opset < 21 else 10
    dtype = {TensorProto.BFLOAT16: ml_dtypes.bfloat16, TensorProto.FLOAT16: np.float16}.get(scale_type, np.float32)
    model.graph.initializer.append(numpy_helper.from_array(np.array(scale, np.float32).astype(dtype), "x_scale")
                                   if dtype is not ml_dtypes.bfloat16 else _raw("x_scale", scale_type, [scale], dtype))
    if dtype is ml_dtypes.bfloat16:
        del model.graph.initializer[-1].dims[:]
    qin = ["x_cast", "x_scale"] if scale_type != TensorProto.FLOAT else ["x", "x_scale"]
    attrs = {}
    if output_dtype is None:
        model.graph.initializer.append(helper.make_tensor("x_zp", code, [], [zero_point]))
        qin.append("x_zp")
    else:
        attrs["output_dtype"] = output_dtype
    nodes = [helper.make_node("QuantizeLinear", qin, ["x_q"], name="q_x", **attrs),
             helper.make_node("DequantizeLinear", ["x_q", *qin[1:]], ["x_dqc"], name="dq_x")]
    if scale_type != TensorProto.FLOAT:
        nodes = [helper.make_node("Cast", ["x"], ["x_cast"], "cast_in", to=scale_type), *nodes,
                 helper.make_node("Cast", ["x_dqc"], ["x_dq"], "cast_out", to=TensorProto.FLOAT)]
    else:
        nodes[-1].output[0] = "x_dq"
    model.graph.node[0].input[0] = "x_dq"
    ordered = [*nodes, *model.graph.node]
    del model.graph.node[:]
    model.graph.node.extend(ordered)
    onnx.checker.check_model(model)
    return model


def _pack(values: np.ndarray) -> np.ndarray:
    pairs = values.reshape(*values.shape[:-1], -1, 2).astype(np.uint8)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).astype(np.uint8)


def nbits_model(k: int = 64, n: int = 24, block: int = 32, zero_points: bool = True, g_idx=None, bias: int | None = 0,
                scale_at_3: float | None = None, seed: int = 5) -> onnx.ModelProto:
    """x[2,5,k] ─ MatMulNBits(4 bits, blocks of ``block``: K = ``k`` need not be a multiple) ─ y[2,5,n]: random
    codes (the last block's padding 0), signed scales, packed zero points, a ``g_idx``, a bias of N + ``bias``
    values (None: none); ``scale_at_3`` replaces the 4th scale."""
    rng = np.random.default_rng(seed)
    blocks = -(-k // block)
    q = rng.integers(0, 16, (n, blocks * block))
    q[:, k:] = 0
    scales = (rng.uniform(0.01, 0.03, (n, blocks)) * rng.choice([-1, 1], (n, blocks))).astype(np.float32)
    if scale_at_3 is not None:
        scales.flat[3] = scale_at_3
    packed = _pack(q.reshape(n, blocks, block)) if block % 2 == 0 else np.zeros((n, blocks, 1), np.uint8)
    inits = {"B": packed, "scales": scales}
    inputs = ["x", "B", "scales", "", "", ""]
    if zero_points:
        inits["zp"], inputs[3] = _pack(rng.integers(0, 16, (n, blocks + blocks % 2))), "zp"
    if g_idx is not None:
        inits["g"], inputs[4] = np.asarray(g_idx, np.int32), "g"
    if bias is not None:
        inits["bias"], inputs[5] = rng.normal(size=n + bias).astype(np.float32), "bias"
    while inputs[-1] == "":
        inputs.pop()
    node = helper.make_node("MatMulNBits", inputs, ["y"], "nbits", domain="com.microsoft", K=k, N=n, bits=4,
                            block_size=block)
    graph = helper.make_graph([node], "nbits", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, n])],
                              [numpy_helper.from_array(np.asarray(v), name) for name, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                   helper.make_opsetid("com.microsoft", 1)])


def saved(build, name: str = "bad.onnx"):
    def make(d: Path) -> None:
        onnx.save(build(), str(d / name))
    return make


def truncated_external(length: int | None = None):
    """``ext/m.onnx``: the float net plus a tensor 'big' declaring 640,000,000 floats (2.56 GB) read by a ReduceSum,
    stored in ``ext/big.bin`` of 1 MB (``length``: the tensor's length entry)."""
    def make(d: Path) -> None:
        (d / "ext").mkdir()
        model = _summed_external("big", 640_000_000, (("location", "big.bin"), ("offset", "0"),
                                                      *((("length", str(length)),) if length else ())))
        (d / "ext" / "big.bin").write_bytes(bytes(1 << 20))
        onnx.save(model, str(d / "ext" / "m.onnx"))
    return make


def _summed_external(name: str, size: int, fields) -> onnx.ModelProto:
    """``float_net`` with a float tensor ``name`` [size] in external data (its ``fields``) summed into its output."""
    model = float_net()
    tensor = onnx.TensorProto(name=name, data_type=TensorProto.FLOAT, dims=[size], data_location=TensorProto.EXTERNAL)
    for key, value in fields:
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    model.graph.initializer.append(tensor)
    model.graph.node[-1].output[0] = "y0"
    model.graph.node.extend([helper.make_node("ReduceSum", [name], ["s"], "sum", keepdims=0),
                             helper.make_node("Add", ["y0", "s"], ["y"], "add")])
    return model


def short_length(d: Path) -> None:
    """``ext/m.onnx``: a 64-float tensor whose file holds 256 bytes but whose length entry says 100."""
    (d / "ext").mkdir()
    model = _summed_external("c64", 64, (("location", "c.bin"), ("offset", "0"), ("length", "100")))
    (d / "ext" / "c.bin").write_bytes(np.ones(64, np.float32).tobytes())
    onnx.save(model, str(d / "ext" / "m.onnx"))


def candidate_with(value: float):
    """``cand.onnx``: the float net whose output gets ``value`` added (Inf: every output value Inf)."""
    def build() -> onnx.ModelProto:
        model = float_net()
        model.graph.node[-1].output[0] = "y0"
        model.graph.initializer.append(numpy_helper.from_array(np.array(value, np.float32), "c"))
        model.graph.node.append(helper.make_node("Add", ["y0", "c"], ["y"], "add_c"))
        return model
    return saved(build, "cand.onnx")


def fp8_amax(d: Path) -> None:
    """``sub.json`` (onnxruntime's table form): x's range 200·tiny, whose INT8 scale (/127) is normal and whose FP8
    scale (/448) is subnormal."""
    (d / "sub.json").write_text(json.dumps({"x": [-200 * FLOAT32_TINY, 200 * FLOAT32_TINY], "r1": [0.0, 1.0]}))


def _convert(name: str = "bad.onnx", *extra: str) -> list[str]:
    return ["convert", f"{{d}}/{name}", "-o", "{d}/out.onnx", *extra]


def _check(name: str = "bad.onnx") -> list[str]:
    return ["check", f"{{d}}/{name}", "--trt", "off"]


_FP8_NAN = saved(lambda: fp8_weight_model(0x7F))
_NBITS_SUB = saved(lambda: nbits_model(scale_at_3=1e-40))

VALUE_CASES = [
    # ---- values that got past the loaders (G3): refused where they enter, convert and check alike
    Case("fp8-weight-nan-code", "G3", _FP8_NAN, _convert(), 2, "non-finite code", absent=("out.onnx",)),
    Case("fp8-weight-nan-code-check", "G3", _FP8_NAN, _check(), 1, "0x7F = nan"),
    Case("fp8-weight-negative-nan-code", "G3", saved(lambda: fp8_weight_model(0xFF)), _convert(), 2, "0xFF",
         absent=("out.onnx",)),
    Case("fp8-e5m2-weight-inf-code", "G3",
         saved(lambda: fp8_weight_model(0x7C, TensorProto.FLOAT8E5M2, ml_dtypes.float8_e5m2)), _convert(), 2,
         "0x7C = inf", absent=("out.onnx",)),
    Case("bf16-fp8-scale-zero", "G3", saved(lambda: activation_qdq_model(0.0)),
         _convert("bad.onnx", "--calib-data", "{d}/calib.npz"), 2, "scale 'x_scale' = 0", absent=("out.onnx",)),
    Case("bf16-fp8-scale-negative", "G3", saved(lambda: activation_qdq_model(-0.02)), _check(), 1,
         "scale 'x_scale' = -0.02"),
    Case("bf16-int8-scale-zero", "G3", saved(lambda: activation_qdq_model(0.0, code=TensorProto.INT8)),
         _convert("bad.onnx", "--calib-data", "{d}/calib.npz"), 2, "finite and positive", absent=("out.onnx",)),
    Case("float16-int8-scale-negative", "G3",
         saved(lambda: activation_qdq_model(-0.05, TensorProto.FLOAT16, TensorProto.INT8)),
         _convert("bad.onnx", "--calib-data", "{d}/calib.npz"), 2, "'q_x' has scale 'x_scale' = -0.04",
         absent=("out.onnx",)),
    Case("nbits-scale-subnormal", "G3", _NBITS_SUB, _convert(), 2, "block scale 'scales' = 9.99995e-41",
         absent=("out.onnx",)),
    Case("nbits-scale-subnormal-check", "G3", _NBITS_SUB, _check(), 1, "block scale 'scales' = 9.99995e-41"),
    Case("nbits-scale-nan", "G3", saved(lambda: nbits_model(scale_at_3=float("nan"))), _convert(), 2,
         "block scale 'scales' = nan", absent=("out.onnx",)),
    Case("nbits-scale-inf", "G3", saved(lambda: nbits_model(scale_at_3=float("-inf"))), _convert(), 2,
         "block scale 'scales' = -inf", absent=("out.onnx",)),
    Case("fp8-scales-file-subnormal-scale", "G3", fp8_amax,
         ["convert", "{d}/float.onnx", "-o", "{d}/out.onnx", "--calib-data", "{d}/calib.npz", "--fp8", "--scales",
          "{d}/sub.json"], 2, "amax / 448", absent=("out.onnx",)),
    # ---- internal errors where a one-line refusal belongs (G5)
    Case("nbits-block-size-3", "G5", saved(lambda: nbits_model(k=64, block=3, zero_points=False, bias=None)),
         _convert(), 2, "block_size=3; onnxruntime requires a power of two of at least 16", absent=("out.onnx",)),
    Case("nbits-block-size-48-check", "G5", saved(lambda: nbits_model(k=96, block=48, zero_points=False)),
         _check(), 1, "block_size=48"),
    Case("nbits-bias-n-plus-1", "G5", saved(lambda: nbits_model(bias=1)), _convert(), 2,
         "bias 'bias' of shape [25], but N=24", absent=("out.onnx",)),
    Case("external-data-shorter-than-tensor", "G5", truncated_external(),
         ["convert", "{d}/ext/m.onnx", "-o", "{d}/out.onnx", "--calib-random", "2"], 2,
         "external data file is shorter than the tensor's declared size", absent=("out.onnx",)),
    Case("external-data-shorter-check", "G5", truncated_external(1 << 20), ["check", "{d}/ext/m.onnx", "--trt", "off"],
         2, "'big' (float [640000000]) declares 2.56 GB"),
    Case("external-data-length-short", "G5", short_length,
         ["verify", "{d}/ext/m.onnx", "{d}/ext/m.onnx", "--random", "1"], 2, "length 100"),
    Case("verify-candidate-all-inf", "G5", candidate_with(float("inf")),
         ["verify", "{d}/float.onnx", "{d}/cand.onnx", "--data", "{d}/calib.npz"], 1,
         "the candidate's outputs are non-finite"),
    Case("verify-candidate-nan-passes-no-gate", "G5", candidate_with(float("nan")),
         ["verify", "{d}/float.onnx", "{d}/cand.onnx", "--data", "{d}/calib.npz"], 1, "40 of 40 value(s)"),
]
