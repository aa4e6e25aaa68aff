"""Quantize the corpus's float models with AMD Quark's ONNX quantizer (amd-quark 0.13), the usual ways.

    python scripts/corpus/quantize_quark.py OUT [--only NAME ...] [--modes MODE ...]
    python scripts/corpus/quantize_quark.py --tiny        # the suite's slice: tests/data/corpus/quark-<mode>/

Runs with the quark venv's python (``scripts/corpus/build.py`` makes it: amd-quark==0.13, onnx<=1.22,
onnxruntime). Reads ``OUT/float/<name>.onnx`` and its ``.calib.npz`` (a CalibrationDataReader over its 16
feeds); writes ``OUT/quantized/quark-<mode>/<name>.onnx`` with ``quark.onnx.ModelQuantizer``:

| mode | configuration |
|---|---|
| xint8 | ``XINT8_QCONFIG``: int8 symmetric, power-of-two scales (MinMSE), AMD NPU default; Sigmoid → HardSigmoid |
| a8w8 | ``A8W8_QCONFIG``: int8 symmetric activations and weights, float scales (percentile) |
| a16w8 | ``A16W8_QCONFIG``: int16 activations (com.microsoft QuantizeLinear/DequantizeLinear), int8 weights |
| bfp16 | ``BFP16_QCONFIG``: block floating point, com.amd.quark ``BFPQuantizeDequantize`` on activations and weights |
| mxint8 | ``MXInt8Spec()`` for both: OCP MX int8, com.amd.quark ``MXQuantizeDequantize`` (blocks of 32) |
| u8s8 | ``QConfig(QLayerConfig(activation=UInt8Spec(), weight=Int8Spec(per channel)))``: asymmetric uint8 activations |

The FP8 and 4-bit modes (``--modes fp8 mxfp8 ...``; not in the default run; the QConfig API has no FP8
spec, so fp8 uses the legacy configuration; MatMulNBits takes only a MatMul with a constant weight, not a Gemm):

| mode | configuration |
|---|---|
| fp8 | legacy ``QuantizationConfig``, both types ``QuantType.QFLOAT8E4M3FN``, symmetric: FLOAT8E4M3FN Q/DQ, opset 21 |
| mxfp8 | ``MXFP8E4M3Spec()`` for both: OCP MXFP8 E4M3, com.amd.quark ``MXQuantizeDequantize`` (blocks of 32) |
| mxfp4 | ``MXFP4E2M1Spec()`` for both: OCP MXFP4 E2M1, com.amd.quark ``MXQuantizeDequantize`` (blocks of 32) |
| mx4 | ``MX4Spec()`` for both: AMD MX4 (shared-microexponent block format), com.amd.quark ``BFPQuantizeDequantize`` |
| int4-nbits | legacy ``QuantizationConfig``, ``UseMatMulNBits`` (4 bits, blocks of 128): com.microsoft MatMulNBits |
| int4-hqq | the same with ``"Algorithm": "HQQ"`` |

Quark 0.13's ONNX quantizer has no INT4/UINT4 Q/DQ (``weight_type=QuantType.QInt4`` fails in
``get_qmin_qmax_for_qType``: "Only INT8, UINT8, INT16, and UINT16 are supported") and no FP8 E5M2 Q/DQ
(onnxruntime's ``QuantType`` has no ``QFLOAT8E5M2``).

Failures are recorded in ``OUT/quantized/quark-failed.json``; one failing model never stops the rest.
The source's own SNR for modes whose custom ops plain onnxruntime cannot run (bfp16, mxint8) is measured here,
with Quark's custom-op library, into ``OUT/quantized/quark-source-snr.json``.
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

ROOT = Path(__file__).resolve().parents[2]
#: the suite's slice (--tiny): SegFormer's quantized models are over the 300 KB a committed fixture may take
TINY = ("bert", "bert-dynamo", "t5-encoder")
MODES = ("xint8", "a8w8", "a16w8", "bfp16", "mxint8", "u8s8")
#: the FP8 and 4-bit modes (not run unless asked with --modes: see the docstring)
LOW_BIT_MODES = ("fp8", "mxfp8", "mxfp4", "mx4", "int4-nbits", "int4-hqq")


class _Reader:
    def __init__(self, calib: dict):
        names = list(calib)
        self._feeds = [{k: calib[k][i] for k in names} for i in range(len(calib[names[0]]))]
        self._it = iter(self._feeds)

    def get_next(self):
        return next(self._it, None)

    def rewind(self):  # Quark reads the data more than once for some methods
        self._it = iter(self._feeds)


def _reader(calib):
    from quark.onnx import CalibrationDataReader

    return type("Reader", (_Reader, CalibrationDataReader), {})(calib)


def config(mode: str):
    import quark.onnx as q

    if mode == "xint8":
        return q.XINT8_QCONFIG
    if mode == "a8w8":
        return q.A8W8_QCONFIG
    if mode == "a16w8":
        return q.A16W8_QCONFIG
    if mode == "bfp16":
        return q.BFP16_QCONFIG
    if mode == "mxint8":
        return q.QConfig(q.QLayerConfig(activation=q.MXInt8Spec(), weight=q.MXInt8Spec()))
    if mode == "u8s8":
        return q.QConfig(q.QLayerConfig(activation=q.UInt8Spec(),
                                        weight=q.Int8Spec(quant_granularity=q.QuantGranularity.Channel)),
                         extra_options={"ForceQuantizeNoInputCheck": True})
    if mode == "fp8":  # no FP8 spec in the QConfig API: the legacy configuration, with onnxruntime's FP8 type
        return q.Config(global_quant_config=q.QuantizationConfig(
            activation_type=q.QuantType.QFLOAT8E4M3FN, weight_type=q.QuantType.QFLOAT8E4M3FN,
            extra_options={"ActivationSymmetric": True, "WeightSymmetric": True}))
    if mode == "mxfp8":
        return q.QConfig(q.QLayerConfig(activation=q.MXFP8E4M3Spec(), weight=q.MXFP8E4M3Spec()))
    if mode == "mxfp4":
        return q.QConfig(q.QLayerConfig(activation=q.MXFP4E2M1Spec(), weight=q.MXFP4E2M1Spec()))
    if mode == "mx4":
        return q.QConfig(q.QLayerConfig(activation=q.MX4Spec(), weight=q.MX4Spec()))
    if mode in ("int4-nbits", "int4-hqq"):
        params = {"GroupSize": 128, "Symmetric": True, "Bits": 4, "AccuracyLevel": 1}
        if mode == "int4-hqq":
            params["Algorithm"] = "HQQ"
        # no graph optimization: Quark's pre-processing would first fuse MatMul + Add into Gemm, which
        # MatMulNBits does not take (nothing would be quantized)
        return q.Config(global_quant_config=q.QuantizationConfig(optimize_model=False, extra_options={
            "SkipPreprocess": True, "UseMatMulNBits": True, "MatMulNBitsParams": params}))
    raise ValueError(mode)


def quantize(mode: str, src: Path, dst: Path, calib: dict) -> None:
    import copy
    import os

    from quark.onnx import ModelQuantizer

    cwd = os.getcwd()
    os.chdir(src.parent)  # Quark writes a summary (quantized_info.csv) into the current directory
    try:
        ModelQuantizer(copy.deepcopy(config(mode))).quantize_model(str(src), str(dst.resolve()), _reader(calib))
    finally:
        os.chdir(cwd)


def source_snr(src: Path, dst: Path, eval_path: Path) -> float:
    """The quantized model's SNR (dB) against the float model on the held-out feeds, Quark's custom ops loaded."""
    import onnxruntime as ort
    from quark.onnx import get_library_path

    data = dict(np.load(eval_path))
    feeds = [{k: v[i] for k, v in data.items()} for i in range(len(next(iter(data.values()))))]
    outs = []
    for path in (src, dst):
        options = ort.SessionOptions()
        options.register_custom_ops_library(get_library_path())
        sess = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        names = {i.name for i in sess.get_inputs()}
        outs.append(np.concatenate([np.asarray(sess.run(None, {k: v for k, v in f.items() if k in names})[0],
                                               np.float64).ravel() for f in feeds]))
    ref, test = outs
    return float(10 * np.log10(np.sum(ref ** 2) / max(np.sum((ref - test) ** 2), 1e-30)))


def main() -> int:
    logging.disable(logging.WARNING)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, nargs="?")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--modes", nargs="*", default=list(MODES))
    ap.add_argument("--tiny", action="store_true", help="quantize the suite's slice into tests/data/corpus")
    ap.add_argument("-v", action="store_true", help="print the traceback of each failure")
    args = ap.parse_args()
    if args.tiny:
        float_dir, quantized = ROOT / "tests" / "data" / "corpus" / "float", ROOT / "tests" / "data" / "corpus"
    elif args.out is None:
        ap.error("OUT is required (or --tiny)")
    else:
        out = args.out.resolve()  # quantize() changes the working directory
        float_dir, quantized = out / "float", out / "quantized"
    floats = sorted(float_dir.glob("*.onnx"))
    if args.tiny:
        floats = [p for p in floats if p.stem in TINY]
    if args.only:
        floats = [p for p in floats if p.stem in args.only]
    failed, snrs = {}, {}
    for src in floats:
        calib = dict(np.load(src.with_suffix(".calib.npz")))
        for mode in args.modes:
            dst = quantized / f"quark-{mode}" / src.name
            dst.parent.mkdir(parents=True, exist_ok=True)
            key = f"quark-{mode}/{src.name}"
            with tempfile.TemporaryDirectory() as tmp:
                try:
                    work = Path(tmp) / src.name  # Quark writes temporary files beside its input
                    work.write_bytes(src.read_bytes())
                    quantize(mode, work, dst, calib)
                    onnx.load(str(dst), load_external_data=False)
                    if not args.tiny:
                        try:
                            snrs[key] = round(source_snr(src, dst, src.with_suffix(".eval.npz")), 2)
                        except Exception as exc:
                            snrs[key] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                    print(key, snrs.get(key, ""), flush=True)
                except Exception as exc:
                    failed[key] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                    dst.unlink(missing_ok=True)
                    print(f"FAILED {key}: {failed[key]}", file=sys.stderr, flush=True)
                    if args.v:
                        traceback.print_exc()
    if not args.tiny:
        (quantized / "quark-failed.json").write_text(json.dumps(failed, indent=1))
        known = quantized / "quark-source-snr.json"
        merged = {**(json.loads(known.read_text()) if known.is_file() else {}), **snrs}
        known.write_text(json.dumps(dict(sorted(merged.items())), indent=1))
    return 1 if failed and args.tiny else 0


if __name__ == "__main__":
    sys.exit(main())
