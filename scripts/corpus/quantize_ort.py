"""Quantize the corpus's float models with onnxruntime's quantizers, the usual ways.

    python scripts/corpus/quantize_ort.py OUT [--only NAME ...]

Reads ``OUT/float/<name>.onnx`` and its ``.calib.npz``; writes ``OUT/quantized/ort-<mode>/<name>.onnx``:

| mode | call |
|---|---|
| dynamic | ``quantize_dynamic(float, q)`` (defaults: int8 weights per tensor) |
| dynamic-u8 | ``quantize_dynamic(..., weight_type=QUInt8)`` (what older tutorials use) |
| dynamic-pc | ``quantize_dynamic(..., per_channel=True)`` |
| dynamic-opt | ``onnxruntime.transformers.optimizer`` (fused com.microsoft ops), then ``quantize_dynamic`` |
| static-qop | ``quantize_static`` QOperator, uint8 activations, int8 per-channel weights |
| static-qdq | ``quantize_static`` QDQ, uint8 activations, int8 per-channel weights |
| static-qdq-s8 | ``quantize_static`` QDQ, int8 symmetric activations, int8 per-tensor weights |
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import traceback
from pathlib import Path

import numpy as np
import onnx

TRANSFORMERS = {"bert": ("bert", 4, 128), "distilbert": ("bert", 4, 128), "roberta": ("bert", 4, 128),
                "vit": ("vit", 4, 128), "minilm-real": ("bert", 12, 384), "bart-encoder": ("bart", 4, 128)}


class _Reader:
    def __init__(self, calib: dict):
        names = list(calib)
        self._it = iter([{k: calib[k][i] for k in names} for i in range(len(calib[names[0]]))])

    def get_next(self):
        return next(self._it, None)

    def rewind(self):  # older onnxruntime versions call it
        pass


def _reader(calib):
    from onnxruntime.quantization import CalibrationDataReader

    return type("Reader", (_Reader, CalibrationDataReader), {})(calib)


def _preprocessed(src: Path, tmp: Path) -> Path:
    """onnxruntime's recommended pre-processing (shape inference, optimization) before static quantization."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    out = tmp / f"{src.stem}.pre.onnx"
    try:
        quant_pre_process(str(src), str(out), skip_symbolic_shape=False)
    except Exception:
        quant_pre_process(str(src), str(out), skip_symbolic_shape=True)
    return out


def _optimized(src: Path, tmp: Path, arch: str) -> Path | None:
    from onnxruntime.transformers.optimizer import optimize_model

    kind, heads, hidden = TRANSFORMERS[arch.removesuffix("-dynamo")]
    out = tmp / f"{src.stem}.opt.onnx"
    optimize_model(str(src), model_type=kind, num_heads=heads, hidden_size=hidden, opt_level=1).save_model_to_file(
        str(out))
    return out


def quantize(mode: str, src: Path, dst: Path, calib: dict, tmp: Path) -> None:
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static

    if mode == "dynamic":
        quantize_dynamic(str(src), str(dst))
    elif mode == "dynamic-u8":
        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QUInt8)
    elif mode == "dynamic-pc":
        quantize_dynamic(str(src), str(dst), per_channel=True)
    elif mode == "dynamic-opt":
        # the fused com.microsoft ops have no shape inference in onnx: tell the quantizer their type
        quantize_dynamic(str(_optimized(src, tmp, src.stem)), str(dst),
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    elif mode.startswith("static"):
        pre = _preprocessed(src, tmp)
        fmt = QuantFormat.QOperator if mode == "static-qop" else QuantFormat.QDQ
        s8 = mode == "static-qdq-s8"
        quantize_static(str(pre), str(dst), _reader(calib), quant_format=fmt, per_channel=not s8,
                        activation_type=QuantType.QInt8 if s8 else QuantType.QUInt8, weight_type=QuantType.QInt8,
                        extra_options={"ActivationSymmetric": True} if s8 else None)
    else:
        raise ValueError(mode)


MODES = ("dynamic", "dynamic-u8", "dynamic-pc", "dynamic-opt", "static-qop", "static-qdq", "static-qdq-s8")


def main() -> int:
    logging.disable(logging.WARNING)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--modes", nargs="*", default=list(MODES))
    args = ap.parse_args()
    floats = sorted(p for p in (args.out / "float").glob("*.onnx"))
    if args.only:
        floats = [p for p in floats if p.stem in args.only]
    failed = {}
    for src in floats:
        calib = dict(np.load(src.with_suffix(".calib.npz")))
        for mode in args.modes:
            if mode == "dynamic-opt" and src.stem.removesuffix("-dynamo") not in TRANSFORMERS:
                continue
            dst = args.out / "quantized" / f"ort-{mode}" / src.name
            dst.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory() as tmp:
                try:
                    quantize(mode, src, dst, calib, Path(tmp))
                    onnx.load(str(dst), load_external_data=False)
                    print(f"ort-{mode}/{src.name}", flush=True)
                except Exception as exc:
                    failed[f"ort-{mode}/{src.name}"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                    dst.unlink(missing_ok=True)
                    print(f"FAILED ort-{mode}/{src.name}: {failed[f'ort-{mode}/{src.name}']}", file=sys.stderr)
                    if "-v" in sys.argv:
                        traceback.print_exc()
    (args.out / "quantized" / "ort-failed.json").write_text(json.dumps(failed, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
