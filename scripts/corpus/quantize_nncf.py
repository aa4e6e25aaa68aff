"""Quantize the corpus's float models with NNCF's post-training quantization (ONNX backend), the usual ways.

    python scripts/corpus/quantize_nncf.py OUT [--only NAME ...] [--modes MODE ...]
    python scripts/corpus/quantize_nncf.py --tiny        # the suite's slice: tests/data/corpus/nncf-<mode>/

Run it with NNCF's own virtualenv (``scripts/corpus/build.py``: ``nncf==3.4.0``, onnx, onnxruntime), never
trt-bridge's. Reads ``OUT/float/<name>.onnx`` and its ``.calib.npz`` (16 feeds, all of them calibrate);
writes ``OUT/quantized/nncf-<mode>/<name>.onnx``, failures in ``OUT/quantized/nncf-failed.json``:

| mode | call |
|---|---|
| default | ``nncf.quantize(model, nncf.Dataset(feeds))``: performance preset, symmetric int8 activations and weights |
| mixed | ``preset=QuantizationPreset.MIXED``: asymmetric activations (non-zero zero points), symmetric weights |
| transformer | ``model_type=ModelType.TRANSFORMER`` (transformer architectures only): mixed preset, SmoothQuant |
| accurate | ``fast_bias_correction=False`` (the slower, full bias correction), performance preset |
| fp8 | ``mode=QuantizationMode.FP8_E4M3`` on the model upgraded to opset 21: FP8 E4M3 Q/DQ, activations and weights |
| fp8-e5m2 | ``mode=QuantizationMode.FP8_E5M2``, opset 21: FP8 E5M2 Q/DQ |
| wc-int8 | ``nncf.compress_weights(model)`` (``INT8_ASYM``, data-free): uint8 per-channel weights with zero points |
| wc-int8-sym | ``mode=CompressWeightsMode.INT8_SYM``: int8 per-channel weights |
| wc-int4 | ``mode=INT4_SYM, group_size=128, ratio=1``, source opset (< 21): ``com.microsoft`` ``MatMulNBits`` |
| wc-int4-asym | ``mode=INT4_ASYM``, as ``wc-int4``: ``MatMulNBits`` with zero points |
| wc-int4-dq | ``mode=INT4_SYM, group_size=128``, opset 21: int4 ``DequantizeLinear`` with ``block_size`` |
| wc-int4-asym-dq | ``mode=INT4_ASYM``, as ``wc-int4-dq``: uint4 blocked ``DequantizeLinear`` with zero points |
| wc-int4-awq | ``wc-int4-dq`` with ``ratio=0.8, dataset, awq=True, scale_estimation=True``: int4 and int8 backup |
| wc-fp8 | ``mode=CompressWeightsMode.FP8_E4M3``, opset 21: FP8 E4M3 weights read by ``DequantizeLinear`` |

NNCF writes per-channel weights as int8 initializers read by ``DequantizeLinear`` alone (no
QuantizeLinear), with ``axis`` as it finds it (negative for MatMul weights), and puts Q/DQ pairs on
both sides of ops that TensorRT re-places. FP8 and blocked ``DequantizeLinear`` need opset 21, so those
modes upgrade the float model first (``onnx.version_converter``). ``compress_weights`` leaves activations
float; its int4 modes write MatMul/Gemm weights in 4 bits and the rest (Gather embeddings, the last layer,
every Conv: YOLOv8 gets no int4 at all) in the int8 backup (``INT8_ASYM``). What NNCF 3.4 writes that
onnxruntime refuses: asymmetric ``MatMulNBits`` zero points unpacked (uint8 ``[N, blocks]``), and a Conv
with one output channel given a scale of shape ``[1, 1, 1]`` (YOLOv8's DFL conv); ``INT8_SYM`` (and
``INT4_SYM`` blocks) have negative scales (``max|w| / -128``). gptq, lora_correction and the NF4, MXFP4,
MXFP8, FP4, NVFP4 and codebook modes are not supported by NNCF's ONNX backend.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import traceback
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "corpus"
#: architectures ``model_type=TRANSFORMER`` is meant for (the float export's stem, less '-dynamo')
TRANSFORMERS = {"bert", "distilbert", "roberta", "bart-encoder", "t5-encoder", "vit", "yolos", "wav2vec2",
                "whisper-encoder", "minilm-real", "segformer"}
MODES = ("default", "mixed", "transformer", "accurate", "fp8", "fp8-e5m2", "wc-int8", "wc-int8-sym", "wc-int4",
         "wc-int4-asym", "wc-int4-dq", "wc-int4-asym-dq", "wc-int4-awq", "wc-fp8")
#: the modes that need opset 21 (FP8 Q/DQ, ``block_size``)
OPSET21 = ("fp8", "fp8-e5m2", "wc-int4-dq", "wc-int4-asym-dq", "wc-int4-awq", "wc-fp8")


def _feeds(calib: dict) -> list[dict]:
    count = len(next(iter(calib.values())))
    return [{k: v[i] for k, v in calib.items()} for i in range(count)]


def _opset21(model: onnx.ModelProto) -> onnx.ModelProto:
    from onnx import version_converter

    if next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 21:
        return model
    return version_converter.convert_version(model, 21)


def compress(mode: str, model: onnx.ModelProto, dataset) -> onnx.ModelProto:
    import nncf
    from nncf import CompressWeightsMode as Mode

    if mode == "wc-int8":
        return nncf.compress_weights(model)
    if mode == "wc-int8-sym":
        return nncf.compress_weights(model, mode=Mode.INT8_SYM)
    if mode == "wc-fp8":
        return nncf.compress_weights(model, mode=Mode.FP8_E4M3, ratio=1.0, group_size=-1)
    kind = Mode.INT4_ASYM if "asym" in mode else Mode.INT4_SYM
    if mode == "wc-int4-awq":
        return nncf.compress_weights(model, mode=kind, group_size=128, ratio=0.8, dataset=dataset, awq=True,
                                     scale_estimation=True)
    return nncf.compress_weights(model, mode=kind, group_size=128, ratio=1.0)


def quantize(mode: str, src: Path, dst: Path, calib: dict) -> None:
    import nncf

    model = onnx.load(str(src))
    if mode in OPSET21:
        model = _opset21(model)
    feeds = _feeds(calib)
    dataset = nncf.Dataset(feeds)
    if mode.startswith("wc-"):
        onnx.save(compress(mode, model, dataset), str(dst))
        return
    kwargs = {"subset_size": len(feeds)}
    if mode == "default":
        pass
    elif mode == "mixed":
        kwargs["preset"] = nncf.QuantizationPreset.MIXED
    elif mode == "transformer":
        kwargs["model_type"] = nncf.ModelType.TRANSFORMER
    elif mode == "accurate":
        kwargs["fast_bias_correction"] = False
    elif mode == "fp8":
        kwargs["mode"] = nncf.QuantizationMode.FP8_E4M3
    elif mode == "fp8-e5m2":
        kwargs["mode"] = nncf.QuantizationMode.FP8_E5M2
    else:
        raise ValueError(mode)
    quantized = nncf.quantize(model, dataset, **kwargs)
    onnx.save(quantized, str(dst))


def applies(mode: str, name: str) -> bool:
    return mode != "transformer" or name.removesuffix("-dynamo") in TRANSFORMERS


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, nargs="?")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--modes", nargs="*", default=list(MODES))
    ap.add_argument("--tiny", action="store_true",
                    help="quantize the suite's slice (tests/data/corpus/float) into tests/data/corpus/nncf-<mode>")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    if args.tiny:
        args.out = TINY
    if args.out is None:
        ap.error("OUT is required (or --tiny)")
    if not args.verbose:
        logging.disable(logging.WARNING)
        import nncf

        nncf.set_log_level(logging.ERROR)
    floats = sorted(p for p in (args.out / "float").glob("*.onnx"))
    if args.only:
        floats = [p for p in floats if p.stem in args.only]
    record = args.out / "quantized" / "nncf-failed.json"
    # a run over some models or modes updates the failures it re-tried and keeps the others
    failed = {} if args.tiny or not record.is_file() else json.loads(record.read_text())
    for src in floats:
        calib = dict(np.load(src.with_suffix(".calib.npz")))
        for mode in args.modes:
            if not applies(mode, src.stem):
                continue
            folder = args.out / f"nncf-{mode}" if args.tiny else args.out / "quantized" / f"nncf-{mode}"
            dst = folder / src.name
            dst.parent.mkdir(parents=True, exist_ok=True)
            key = f"nncf-{mode}/{src.name}"
            failed.pop(key, None)
            try:
                quantize(mode, src, dst, calib)
                onnx.load(str(dst), load_external_data=False)
                print(key, flush=True)
            except Exception as exc:  # one model failing must not stop the rest
                failed[key] = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:300]}"
                dst.unlink(missing_ok=True)
                print(f"FAILED {key}: {failed[key]}", file=sys.stderr)
                if args.verbose:
                    traceback.print_exc()
    if not args.tiny:
        record.write_text(json.dumps(dict(sorted(failed.items())), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
