"""Quantize the corpus's float models with onnxruntime's quantizers, the usual ways.

    python scripts/corpus/quantize_ort.py OUT [--only NAME ...] [--modes MODE ...]
    python scripts/corpus/quantize_ort.py tests/data/corpus --tiny --modes dynamic-attn static-qop-attn

Reads ``OUT/float/<name>.onnx`` and its ``.calib.npz``; writes ``OUT/quantized/ort-<mode>/<name>.onnx``
(``--tiny``: the suite's slice, written to ``OUT/ort-<mode>/<name>.onnx``):

| mode | call |
|---|---|
| dynamic | ``quantize_dynamic(float, q)`` (defaults: int8 weights per tensor) |
| dynamic-u8 | ``quantize_dynamic(..., weight_type=QUInt8)`` (what older tutorials use) |
| dynamic-pc | ``quantize_dynamic(..., per_channel=True)`` |
| dynamic-opt | ``optimize_model`` (opt_level 1) on the export as it is, then ``quantize_dynamic`` (see below) |
| static-qop | ``quantize_static`` QOperator, uint8 activations, int8 per-channel weights |
| static-qdq | ``quantize_static`` QDQ, uint8 activations, int8 per-channel weights |
| static-qdq-s8 | ``quantize_static`` QDQ, int8 symmetric activations, int8 per-tensor weights |
| dynamic-attn | the attention-fused model (below), ``quantize_dynamic``: ``QAttention``, ``QEmbedLayerNormalization`` |
| static-qop-attn | the attention-fused model, ``quantize_static`` QOperator (uint8 activations, int8 per channel) |
| static-qdq-attn | the attention-fused model, ``quantize_static`` QDQ (``Attention`` stays float: no QDQ rule) |
| dynamic-mha-attn | as dynamic-attn, ``use_multi_head_attention``: float ``MultiHeadAttention``, int8 projections |

The attention-fused model: the architecture re-exported as onnxruntime's BERT tutorials export it (eager
attention, dynamic batch and sequence axes), then ``optimize_model`` (com.microsoft ``Attention``,
``EmbedLayerNormalization``, ``SkipLayerNormalization``, ``BiasGelu``).

On the corpus's own exports (fixed shapes, transformers' default SDPA attention), ``dynamic-opt``'s optimizer
fuses SkipLayerNormalization and Gelu (for T5: SkipSimplifiedLayerNormalization, and SimplifiedLayerNormalization
in the ONNX domain), never Attention, whatever ``opt_level`` or ``use_gpu``: its EmbedLayerNormalization fusion
needs the position ids computed from the sequence length (dynamic axes), its Attention fusion the eager
attention pattern (MatMul, Div|Mul by the scale, Add of the mask, Softmax); hence the re-export.
The re-export builds each architecture from the same seeded config (``export.py``), so it computes the same
function as ``OUT/float/<name>.onnx``; the ``-attn`` modes apply to bert, distilbert, roberta and minilm-real
(ViT and BART encoders keep their attention unfused there as well).
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

HERE = Path(__file__).resolve().parent
TRANSFORMERS = {"bert": ("bert", 4, 128), "distilbert": ("bert", 4, 128), "roberta": ("bert", 4, 128),
                "vit": ("vit", 4, 128), "minilm-real": ("bert", 12, 384), "bart-encoder": ("bart", 4, 128),
                "t5-encoder": ("t5", 4, 128)}
#: the suite's slice (``export.py --tiny``): hidden size 32, 2 heads
TINY = {"bert": ("bert", 2, 32), "t5-encoder": ("t5", 2, 32)}
#: where onnxruntime's optimizer fuses Attention (and EmbedLayerNormalization) on a re-export (``-attn`` modes)
ATTENTION_FUSED = ("bert", "distilbert", "roberta", "minilm-real")
TINY_ATTENTION_FUSED = ("bert",)


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


def _optimized(src: Path, tmp: Path, arch: str, tiny: bool) -> Path | None:
    from onnxruntime.transformers.optimizer import optimize_model

    kind, heads, hidden = (TINY if tiny else TRANSFORMERS)[arch.removesuffix("-dynamo")]
    out = tmp / f"{src.stem}.opt.onnx"
    optimize_model(str(src), model_type=kind, num_heads=heads, hidden_size=hidden, opt_level=1).save_model_to_file(
        str(out))
    return out


def _reexported(arch: str, tmp: Path, tiny: bool) -> Path:
    """``arch`` exported as onnxruntime's BERT tutorials do: eager attention, dynamic batch and sequence axes."""
    import torch

    sys.path.insert(0, str(HERE))
    import export

    build, feed_fn = export.architectures(tiny)[arch]
    module, names = build()
    inner = module.model
    if hasattr(inner, "set_attn_implementation"):
        inner.set_attn_implementation("eager")
    else:
        inner.config._attn_implementation = "eager"
    calib = feed_fn(1, 1)
    example = tuple(torch.from_numpy(calib[k][0]) for k in names)
    axes = {k: {0: "batch", 1: "sequence"} for k in [*names, "output"]}
    out = tmp / f"{arch}.eager.onnx"
    with torch.no_grad():
        torch.onnx.export(module, example, str(out), input_names=names, output_names=["output"], dynamo=False,
                          opset_version=17, do_constant_folding=True, dynamic_axes=axes)
    return out


def _attention_fused(src: Path, tmp: Path, tiny: bool, multi_head: bool = False) -> Path:
    """The re-export of ``src``'s architecture, through onnxruntime's transformer optimizer (CPU, opt_level 1);
    ``multi_head``: with ``FusionOptions.use_multi_head_attention`` (MultiHeadAttention, separate projections)."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    kind, heads, hidden = (TINY if tiny else TRANSFORMERS)[src.stem]
    options = FusionOptions(kind)
    options.use_multi_head_attention = multi_head
    out = tmp / f"{src.stem}.attn.onnx"
    model = optimize_model(str(_reexported(src.stem, tmp, tiny)), model_type=kind, num_heads=heads,
                           hidden_size=hidden, opt_level=1, optimization_options=options)
    fused = "MultiHeadAttention" if multi_head else "Attention"
    if not model.get_fused_operator_statistics().get(fused):
        raise RuntimeError(f"onnxruntime's optimizer fused no {fused} in {src.stem}")
    model.save_model_to_file(str(out))
    return out


def quantize(mode: str, src: Path, dst: Path, calib: dict, tmp: Path, tiny: bool = False) -> None:
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static

    if mode == "dynamic":
        quantize_dynamic(str(src), str(dst))
    elif mode == "dynamic-u8":
        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QUInt8)
    elif mode == "dynamic-pc":
        quantize_dynamic(str(src), str(dst), per_channel=True)
    elif mode == "dynamic-opt":
        # the fused com.microsoft ops have no shape inference in onnx: tell the quantizer their type
        quantize_dynamic(str(_optimized(src, tmp, src.stem, tiny)), str(dst),
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    elif mode in ("dynamic-attn", "dynamic-mha-attn"):
        quantize_dynamic(str(_attention_fused(src, tmp, tiny, multi_head=mode == "dynamic-mha-attn")), str(dst),
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    elif mode in ("static-qop-attn", "static-qdq-attn"):
        fmt = QuantFormat.QOperator if mode == "static-qop-attn" else QuantFormat.QDQ
        # the fused ops' outputs need types for the calibrator to observe them: symbolic shape inference knows them
        from onnxruntime.quantization.shape_inference import quant_pre_process

        pre = tmp / f"{src.stem}.attn.pre.onnx"
        quant_pre_process(str(_attention_fused(src, tmp, tiny)), str(pre), skip_optimization=True)
        quantize_static(str(pre), str(dst), _reader(calib), quant_format=fmt,
                        per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
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


MODES = ("dynamic", "dynamic-u8", "dynamic-pc", "dynamic-opt", "static-qop", "static-qdq", "static-qdq-s8",
         "dynamic-attn", "static-qop-attn", "static-qdq-attn", "dynamic-mha-attn")


def main() -> int:
    logging.disable(logging.WARNING)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--modes", nargs="*", default=list(MODES))
    ap.add_argument("--tiny", action="store_true", help="OUT is the suite's slice (tests/data/corpus)")
    ap.add_argument("-v", action="store_true", help="print the traceback of each failure")
    args = ap.parse_args()
    floats = sorted(p for p in (args.out / "float").glob("*.onnx"))
    if args.only:
        floats = [p for p in floats if p.stem in args.only]
    failed = {}
    for src in floats:
        calib = dict(np.load(src.with_suffix(".calib.npz")))
        for mode in args.modes:
            if mode == "dynamic-opt" and src.stem.removesuffix("-dynamo") not in (TINY if args.tiny else TRANSFORMERS):
                continue
            if mode.endswith("-attn") and src.stem not in (TINY_ATTENTION_FUSED if args.tiny else ATTENTION_FUSED):
                continue
            dst = args.out / ("" if args.tiny else "quantized") / f"ort-{mode}" / src.name
            dst.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory() as tmp:
                try:
                    quantize(mode, src, dst, calib, Path(tmp), args.tiny)
                    onnx.load(str(dst), load_external_data=False)
                    print(f"ort-{mode}/{src.name}", flush=True)
                except Exception as exc:
                    failed[f"ort-{mode}/{src.name}"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                    dst.unlink(missing_ok=True)
                    print(f"FAILED ort-{mode}/{src.name}: {failed[f'ort-{mode}/{src.name}']}", file=sys.stderr)
                    if args.v:
                        traceback.print_exc()
    if not args.tiny:  # this run's cells replace their earlier entries; the others' stay
        record = args.out / "quantized" / "ort-failed.json"
        earlier = json.loads(record.read_text()) if record.is_file() else {}
        done = {f"ort-{m}/{p.name}" for p in floats for m in args.modes}
        record.write_text(json.dumps({**{k: v for k, v in earlier.items() if k not in done}, **failed}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
