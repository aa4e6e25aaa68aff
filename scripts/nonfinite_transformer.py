"""Export the suite's transformer with legitimate non-finite values, and quantize it with onnxruntime.

    python scripts/nonfinite_transformer.py tests/data/nonfinite      # needs torch (a test-time tool only)

One pre-norm transformer block (hidden 32, 2 heads, 16 tokens) as real exports carry it:

* a relative-position bias read by ``Gather`` from an embedding table (17 distances × 2 heads) whose 8 rows
  for keys after the query are ``-inf`` (16 non-finite values: a causal mask kept in the table, as T5-style
  bias tables are), indexed at run time by positions computed from ``attention_mask`` (``CumSum``), and added
  to the attention scores;
* a padding mask written as ``masked_fill(-inf)`` over query *and* key: a padded query's scores are all
  ``-inf``, its softmax row is NaN, and so are its rows of the attention output, the out-projection and the
  residual sum, until ``Where`` zeroes the padded rows before the feed-forward block. The outputs are finite.

Writes, in OUT: ``float.onnx`` (``torch.onnx.export``, TorchScript exporter, opset 17); ``qdq.onnx`` and
``qop.onnx`` (onnxruntime ``quantize_static`` QDQ and QOperator with its default op types, after
``quant_pre_process``: uint8 activations, int8 per-channel weights, on ``calib.npz``) and ``qdq-linear.onnx``
(QDQ of the MatMul and Gemm layers only, the usual transformer recipe); ``calib.npz`` (16 feeds) and
``eval.npz`` (8 held-out feeds, another seed), keyed by input name with one feed per index of axis 0 (what
``trt-bridge convert --calib-data`` reads). Seeded throughout: the same files every run (up to the exporter's
and quantizer's versions: torch 2.13, onnxruntime 1.32).

What onnxruntime writes with its default op types: the bias table, the gathered bias and the scores (each
holding -Inf) quantized with scale Inf, every code 0 (``-inf / inf`` is NaN); the source dequantizes them to NaN
(0·Inf), its Softmax outputs NaN everywhere, and only the uint8 quantization of that NaN to 0 keeps its outputs
finite: the attention adds nothing (14.1 dB against the float model on ``eval.npz``).
"""

from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path

import numpy as np

HIDDEN, HEADS, SEQ, DISTANCE = 32, 2, 16, 8
CALIB, EVAL = 16, 8


def feeds(count: int, seed: int) -> dict[str, np.ndarray]:
    """Hidden states and padding masks: each feed keeps 6 to 16 of its 16 tokens (the rest are padding)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(count, 1, SEQ, HIDDEN)).astype(np.float32)
    mask = np.ones((count, 1, SEQ), np.int64)
    for i, n in enumerate(rng.integers(6, SEQ + 1, size=count)):
        mask[i, 0, n:] = 0
    mask[0, 0, :] = 1  # one feed without padding
    return {"x": x, "attention_mask": mask}


def block():
    import torch

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = torch.nn.LayerNorm(HIDDEN), torch.nn.LayerNorm(HIDDEN)
            self.qkv, self.proj = torch.nn.Linear(HIDDEN, 3 * HIDDEN), torch.nn.Linear(HIDDEN, HIDDEN)
            self.fc1, self.fc2 = torch.nn.Linear(HIDDEN, 4 * HIDDEN), torch.nn.Linear(4 * HIDDEN, HIDDEN)
            self.bias = torch.nn.Embedding(2 * DISTANCE + 1, HEADS)  # distance -8..8 -> row 0..16
            with torch.no_grad():
                self.bias.weight[DISTANCE + 1:] = -math.inf  # keys after the query: masked in the table itself

        def forward(self, x, attention_mask):
            b, s, d = x.shape
            valid = attention_mask.bool()  # [b, s]
            positions = torch.cumsum(attention_mask, -1) - 1  # run-time positions, as RoBERTa computes them
            distance = (positions[:, None, :] - positions[:, :, None]).clamp(-DISTANCE, DISTANCE) + DISTANCE
            bias = self.bias(distance).permute(0, 3, 1, 2)  # Gather -> [b, heads, s, s]
            q, k, v = self.qkv(self.norm1(x)).reshape(b, s, 3, HEADS, d // HEADS).permute(2, 0, 3, 1, 4)
            scores = q @ k.transpose(-1, -2) / math.sqrt(d // HEADS) + bias
            keep = (valid[:, :, None] & valid[:, None, :])[:, None]  # padded queries: a row of -inf
            probs = scores.masked_fill(~keep, -math.inf).softmax(-1)  # ... whose softmax is NaN
            attended = (probs @ v).transpose(1, 2).reshape(b, s, d)
            x = torch.where(valid[..., None], x + self.proj(attended), 0.0)  # the NaN rows end here
            return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm2(x))))

    torch.manual_seed(0)
    return Block().eval()


class _Reader:
    def __init__(self, calib: dict):
        self._it = iter([{k: v[i] for k, v in calib.items()} for i in range(len(calib["x"]))])

    def get_next(self):
        return next(self._it, None)

    def rewind(self):
        pass


def main() -> None:
    import torch
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    calib, held_out = feeds(CALIB, 0), feeds(EVAL, 1)
    np.savez(out / "calib.npz", **calib)
    np.savez(out / "eval.npz", **held_out)
    model = block()
    example = (torch.from_numpy(calib["x"][1]), torch.from_numpy(calib["attention_mask"][1]))
    torch.onnx.export(model, example, str(out / "float.onnx"), input_names=["x", "attention_mask"],
                      output_names=["y"], opset_version=17, dynamo=False)
    reader = type("Reader", (_Reader, CalibrationDataReader), {})
    with tempfile.TemporaryDirectory() as tmp:
        pre = Path(tmp) / "pre.onnx"
        quant_pre_process(str(out / "float.onnx"), str(pre))
        for name, fmt, ops in (("qdq", QuantFormat.QDQ, None), ("qop", QuantFormat.QOperator, None),
                               ("qdq-linear", QuantFormat.QDQ, ["MatMul", "Gemm"])):
            # QOperator: without ForceQuantizeNoInputCheck, onnxruntime 1.32's QLinearWhere keeps each Where as it
            # is, reading the float outputs that its quantized producers (QLinearAdd) no longer write, and the
            # quantizer refuses its own model ("unknown initializers/tensors")
            extra = {"ForceQuantizeNoInputCheck": True} if fmt == QuantFormat.QOperator else None
            quantize_static(str(pre), str(out / f"{name}.onnx"), reader(calib), quant_format=fmt, per_channel=True,
                            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, extra_options=extra,
                            op_types_to_quantize=ops)


if __name__ == "__main__":
    main()
