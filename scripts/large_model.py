"""Build a BERT-style encoder over 2 GB (random weights, onnx.helper only, no torch), convert it to INT8 and
measure the conversion's peak memory (issue 16: models over 2 GB).

    input_ids[1,S] ─ Gather(word embeddings) ─ Add(positions) ─ LayerNorm ─┐
      ┌─────────────────────────────────────────────────────────────────────┘
      └┬ MatMul+Add (q,k,v) ─ heads ─ MatMul(qkᵀ)/√d ─ Softmax ─ MatMul(v) ─ merge ─ MatMul+Add ─┐
       └──────────────────────────────────────────────────────────────────────────────────── Add ─ LayerNorm ─┐
        ┌─────────────────────────────────────────────────────────────────────────────────────────────────────┘
        └┬ MatMul+Add ─ Gelu ─ MatMul+Add ─┐
         └─────────────────────────── Add ─ LayerNorm ─ ... (× layers) ─ hidden_states[1,S,D]

The weights are streamed into ``model.onnx.data`` as they are drawn, so building never holds the model in
memory. Conversion runs in a child process (``trt-bridge convert``), whose peak resident set size is read
from ``getrusage(RUSAGE_CHILDREN)``. Defaults (hidden 1536, 20 layers, vocabulary 30522): 613 M parameters,
2.45 GB of float32.

    python scripts/large_model.py OUT_DIR [--hidden 1536] [--layers 20] [--feeds 8] [--build]

``--build`` also builds the output with TensorRT-RTX ahead of time for SM 8.9.

Measured here (2 cores; ``--hidden 1408 --layers 22``: 566 M parameters, 2.27 GB of float32, 8 feeds of
128 tokens): convert exits 0 in about a minute and writes a 0.70 GB TensorRT-ready INT8 model (TensorRT-RTX's
parser accepts it and builds a 713 MB SM 8.9 engine). Peak RSS 3.54 GB: 1.56× the float model (about 0.3 GB of it
is the process itself: Python, onnxruntime, TensorRT). The lifted weights live in a private file the graph and
onnxruntime's calibration session both map (``trt_bridge.ir.store``); the peak is the source model while it is
lifted, or the mapped weights plus the int8 output while lowering. Before: 4.80 GB (2.12×: the calibration session
held its own copy), and 10.5 GB (4.6×) before issue 16's first fixes.

``--hidden 1536 --layers 24`` (2.91 GB of float32; issue 28): peak RSS 4.76 GB, 1.64× (it was 7.36 GB, 2.53×:
onnxruntime's MatMul prepacking copied every weight into the calibration session, the weights smoothing read
were mapped a second time beside the session's map, and the float32 output and the check's copy of it were still
held while TensorRT built its engine for the costs). The peak is now that build, in the check.

Small sizes (``--hidden 64 --layers 2 --vocab 1000``) with ``--threshold BYTES`` exercise the same
external-data path on a model of a few MB (what tests/test_large_model.py does).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from trt_bridge.samples import attention, gelu


class ExternalWeights:
    """Initializers written to one external-data file as they are made (offsets aligned to 4 KiB)."""

    def __init__(self, folder: Path, location: str, rng: np.random.Generator):
        self.folder, self.location, self.rng = folder, location, rng
        self.file = open(folder / location, "wb")  # noqa: SIM115 - closed by close()
        self.inits: list[TensorProto] = []
        self.bytes = 0

    def add(self, name: str, values: np.ndarray) -> str:
        values = np.ascontiguousarray(values)
        if values.nbytes < 1024:
            self.inits.append(onnx.numpy_helper.from_array(values, name))
            return name
        offset = self.file.tell()
        pad = -offset % 4096
        if pad:
            self.file.write(b"\0" * pad)
            offset += pad
        self.file.write(values.tobytes())
        tensor = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(values.dtype),
                             dims=list(values.shape), data_location=TensorProto.EXTERNAL)
        for key, value in (("location", self.location), ("offset", str(offset)), ("length", str(values.nbytes))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        self.inits.append(tensor)
        self.bytes += values.nbytes
        return name

    def normal(self, name: str, shape, std: float, mean: float = 0.0) -> str:
        return self.add(name, (self.rng.standard_normal(shape, dtype=np.float32) * std + mean).astype(np.float32))

    def close(self) -> None:
        self.file.close()


def build(folder: Path, hidden: int, layers: int, vocab: int, seq: int, heads: int, seed: int = 0) -> Path:
    """Write ``folder/model.onnx`` (+ ``model.onnx.data``); return its path."""
    folder.mkdir(parents=True, exist_ok=True)
    w = ExternalWeights(folder, "model.onnx.data", np.random.default_rng(seed))
    ffn, head_dim = 4 * hidden, hidden // heads
    w.add("heads_shape", np.array([0, 0, heads, head_dim], np.int64))
    w.add("merge_shape", np.array([0, 0, hidden], np.int64))
    for name, value in (("sqrt_d", np.sqrt(head_dim)), ("half", 0.5), ("one", 1.0), ("inv_sqrt2", 1 / np.sqrt(2))):
        w.add(name, np.array(value, np.float32))
    nodes = []

    def linear(name: str, x: str, d_in: int, d_out: int) -> str:
        w.normal(f"{name}.weight", (d_in, d_out), 1 / np.sqrt(d_in))
        w.normal(f"{name}.bias", (d_out,), 0.02)
        nodes.append(helper.make_node("MatMul", [x, f"{name}.weight"], [f"{name}.mm"], f"{name}/MatMul"))
        nodes.append(helper.make_node("Add", [f"{name}.mm", f"{name}.bias"], [f"{name}.out"], f"{name}/Add"))
        return f"{name}.out"

    def layer_norm(name: str, x: str) -> str:
        w.normal(f"{name}.gamma", (hidden,), 0.1, 1.0)
        w.normal(f"{name}.beta", (hidden,), 0.1)
        nodes.append(helper.make_node("LayerNormalization", [x, f"{name}.gamma", f"{name}.beta"], [f"{name}.out"],
                                      name, axis=-1, epsilon=1e-5))
        return f"{name}.out"

    w.normal("embeddings.word_embeddings.weight", (vocab, hidden), 0.5)
    w.normal("embeddings.position_embeddings", (1, seq, hidden), 0.1)
    nodes += [helper.make_node("Gather", ["embeddings.word_embeddings.weight", "input_ids"], ["emb.words"],
                               "embeddings/Gather", axis=0),
              helper.make_node("Add", ["emb.words", "embeddings.position_embeddings"], ["emb.sum"],
                               "embeddings/Add")]
    x = layer_norm("embeddings.ln", "emb.sum")
    for i in range(layers):
        p = f"layer{i}"
        attn = attention(nodes, linear, p, x, hidden)
        nodes.append(helper.make_node("Add", [x, attn], [f"{p}.res1"], f"{p}/residual1"))
        ln1 = layer_norm(f"{p}.ln1", f"{p}.res1")
        down = linear(f"{p}.ffn.down", gelu(nodes, p, linear(f"{p}.ffn.up", ln1, hidden, ffn)), ffn, hidden)
        nodes.append(helper.make_node("Add", [ln1, down], [f"{p}.res2"], f"{p}/residual2"))
        x = layer_norm(f"{p}.ln2", f"{p}.res2")
    nodes.append(helper.make_node("Identity", [x], ["hidden_states"], "output"))
    w.close()
    graph = helper.make_graph(nodes, "bert_style_encoder",
                              [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, seq])],
                              [helper.make_tensor_value_info("hidden_states", TensorProto.FLOAT, [1, seq, hidden])],
                              w.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="large_model.py")
    model.ir_version = 8
    path = folder / "model.onnx"
    onnx.save(model, str(path))
    onnx.checker.check_model(str(path))  # by path: the checker reads the external data itself
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--hidden", type=int, default=1536)
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=30522)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--feeds", type=int, default=8)
    parser.add_argument("--threshold", type=int, help="treat models over this many bytes as large (testing)")
    parser.add_argument("--build", action="store_true", help="also build the output with TensorRT-RTX (SM 8.9)")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    src = build(args.out / "float", args.hidden, args.layers, args.vocab, args.seq, args.heads)
    float_bytes = (args.out / "float" / "model.onnx.data").stat().st_size
    built = time.perf_counter() - t0
    rng = np.random.default_rng(1)
    np.savez(args.out / "calib.npz", input_ids=rng.integers(0, args.vocab, (args.feeds, 1, args.seq), np.int64))
    out = args.out / "int8" / "model.int8.onnx"
    prelude = ("import sys, trt_bridge.ir.size as m\n"
               + (f"m.EXTERNAL_DATA_THRESHOLD = {args.threshold}\n" if args.threshold else "")
               + "from trt_bridge.cli import main\nsys.exit(main(sys.argv[1:]))\n")
    t0 = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", prelude, "convert", str(src), "-o", str(out), "--calib-data",
                             str(args.out / "calib.npz"), "-q", "--report", str(args.out / "convert.json")],
                            env={**os.environ}, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    summary = {"parameters_bytes": float_bytes, "build_seconds": round(built, 1), "convert_seconds": round(seconds, 1),
               "convert_exit": result.returncode, "convert_stderr": result.stderr.strip().splitlines()[-3:],
               "peak_rss_bytes": peak, "peak_over_model": round(peak / float_bytes, 2),
               "output_files": sorted(p.name for p in out.parent.iterdir()) if out.parent.exists() else []}
    if result.returncode == 0 and args.build:
        t0 = time.perf_counter()
        built = subprocess.run([sys.executable, "-m", "trt_bridge", "build", str(out), "-o",
                                str(args.out / "int8" / "model.engine"), "--compute-capability", "8.9", "-q"],
                               capture_output=True, text=True)
        summary.update(build_exit=built.returncode, build_seconds=round(time.perf_counter() - t0, 1),
                       build_stderr=built.stderr.strip().splitlines()[-3:])
    print(json.dumps(summary, indent=2))
    return 0 if result.returncode == 0 and summary.get("build_exit", 0) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
