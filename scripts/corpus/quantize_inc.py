"""Quantize the corpus's float models with Intel Neural Compressor (``onnx-neural-compressor`` 1.0).

    python scripts/corpus/quantize_inc.py OUT [--only NAME ...] [--modes MODE ...]   (weight-only: see below)
    python scripts/corpus/quantize_inc.py --tiny [--only NAME ...]

Runs in its own virtualenv (``OUT/venvs/inc``: ``scripts/corpus/build.py``'s pins), never trt-bridge's.
Reads ``OUT/float/<name>.onnx`` and its ``.calib.npz`` (16 feeds, the calibration data reader);
writes ``OUT/quantized/inc-<mode>/<name>.onnx``, failures in ``OUT/quantized/inc-failed.json`` (a run of some
models or modes updates their entries only).
``--tiny`` does the same for the suite's slice: ``tests/data/corpus/float`` → ``tests/data/corpus/inc-<mode>``
(``tests/corpus/test_inc_slice.py``).

All through ``onnx_neural_compressor.quantization.quantize(float, q, config)``, the package's
onnxruntime-like API, which first runs onnxruntime's basic graph optimizations on the model:

- ``static-qop``: ``StaticQuantConfig(reader, quant_format=QOperator, per_channel=True)``: uint8 activations
  (INC's default), int8 per-channel weights;
- ``static-qdq``: the same in the QDQ format;
- ``dynamic``: ``DynamicQuantConfig()`` (int8 weights per tensor, uint8 activations at run time). INC 1.0 fails
  on every Conv with a bias (its ``DynamicQuantizer`` has no ``_dynamic_quantize_bias``), so such a model is
  quantized again without Conv in ``op_types_to_quantize``; one left with nothing quantized is a failure;
- ``sq``: ``extra_options={"SmoothQuant": True}`` (alpha 0.5, the scales folded into their producers), then
  static QOperator as above; with ``optimization_level=ORT_DISABLE_ALL``, because onnxruntime 1.32 refuses the
  model INC's smoother builds from an optimized one ("Attempt to replace the existing tensor").

Weight-only 4-bit modes (not run by default: ``--modes rtn-b32-sym ...``), through the algorithms' entries
(``algorithm_entry.rtn_quantize_entry`` / ``gptq_quantize_entry`` / ``awq_quantize_entry`` with ``RTNConfig`` /
``GPTQConfig`` / ``AWQConfig``, ``weight_bits=4``; ``quantize()`` takes static and dynamic configs only). Each
MatMul with a constant 2-D weight becomes com.microsoft ``MatMulNBits`` (bits 4, ``block_size`` the group size,
scales ``[N, K/b]``, no ``g_idx``, no com.microsoft opset import); the asymmetric modes write uint4 zero points, two
per byte over the whole ``[N · K/b]`` run, not padded per row of N as the op specifies: where K/b is odd onnxruntime
1.32 refuses the model ("zero_points initializer shape ... does not match attribute-derived shape"), and so does
trt-bridge. ``weight_sym=True`` writes no zero points (8). The float model is read as it is: onnxruntime's basic
optimizations (the API's default) fuse MatMul + Add into Gemm, which these quantizers leave in float. GPTQ and AWQ
calibrate on the ``.calib.npz`` feeds:

==========================  =========================================================================================
mode                        config
==========================  =========================================================================================
``rtn-b32-sym``             ``RTNConfig(weight_group_size=32, weight_sym=True)`` (INC's default)
``rtn-b32-asym``            ``RTNConfig(weight_group_size=32, weight_sym=False)``: uint4 zero points
``rtn-b128-sym``            ``RTNConfig(weight_group_size=128, weight_sym=True)``
``rtn-b128-asym``           ``RTNConfig(weight_group_size=128, weight_sym=False)`` (K/b odd: refused, above)
``rtn-b32-sym-acc4``        ``RTNConfig(weight_group_size=32, accuracy_level=4)``: ``accuracy_level=4`` (int8 A)
``gptq-b32-sym``            ``GPTQConfig(weight_group_size=32, weight_sym=True)``
``gptq-b32-asym``           ``GPTQConfig(weight_group_size=32, weight_sym=False)``
``gptq-b128-sym``           ``GPTQConfig(weight_group_size=128, weight_sym=True)``
``gptq-b128-asym``          ``GPTQConfig(weight_group_size=128, weight_sym=False)``
``gptq-b32-asym-actorder``  ``GPTQConfig(..., actorder=True)`` (b32, asym): rows restored to their order, no ``g_idx``
``awq-b32-sym``             ``AWQConfig(weight_group_size=32, weight_sym=True)`` (auto scale and MSE clip search)
``awq-b32-asym``            ``AWQConfig(weight_group_size=32, weight_sym=False)``
``awq-b128-sym``            ``AWQConfig(weight_group_size=128, weight_sym=True)``
``awq-b128-asym``           ``AWQConfig(weight_group_size=128, weight_sym=False)``
==========================  =========================================================================================

(``weight_bits=8`` writes no MatMulNBits: INC 1.0 packs 4-bit codes only and rounds 8-bit weights in float, asymmetric
ones far off: 1–4 dB SNR on MiniLM-L3 and SVTRv2. Not a mode.)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import traceback
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "corpus"
TINY_LIMIT = 300_000  # bytes: the suite commits its slice
MODES = ("static-qop", "static-qdq", "dynamic", "sq")
#: INC's dynamic CPU op list (constants.DYNAMIC_CPU_OP_LIST) less Conv and FusedConv
DYNAMIC_WITHOUT_CONV = ["EmbedLayerNormalization", "MatMul", "Gather", "Attention", "LSTM"]
#: weight-only mode → (algorithm, its config's arguments); weight_bits 4 in each
WEIGHT_ONLY = {
    **{f"{algo}-b{block}-{kind}": (algo, {"weight_group_size": block, "weight_sym": kind == "sym"})
       for algo in ("rtn", "gptq", "awq") for block in (32, 128) for kind in ("sym", "asym")},
    "rtn-b32-sym-acc4": ("rtn", {"weight_group_size": 32, "weight_sym": True, "accuracy_level": 4}),
    "gptq-b32-asym-actorder": ("gptq", {"weight_group_size": 32, "weight_sym": False, "actorder": True}),
}


def _feeds(calib: dict) -> list[dict]:
    return [{k: v[i] for k, v in calib.items()} for i in range(len(next(iter(calib.values()))))]


def _reader(calib: dict):
    from onnx_neural_compressor.data_reader import CalibrationDataReader

    class Reader(CalibrationDataReader):
        def __init__(self, feeds):
            self.feeds, self.at = feeds, 0

        def get_next(self):
            self.at += 1
            return self.feeds[self.at - 1] if self.at <= len(self.feeds) else None

        def rewind(self):
            self.at = 0

    return Reader(_feeds(calib))


def quantize(mode: str, src: Path, dst: Path, calib: dict, op_types: list[str] | None = None) -> None:
    import onnxruntime as ort
    from onnx_neural_compressor.quantization import QuantFormat, config, quantize

    cpu = "CPUExecutionProvider"
    level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC  # the API's default
    if mode in WEIGHT_ONLY:
        _weight_only(mode, src, dst, calib)
        return
    if mode == "dynamic":
        cfg = config.DynamicQuantConfig(execution_provider=cpu, op_types_to_quantize=op_types)
    elif mode in ("static-qop", "static-qdq", "sq"):
        fmt = QuantFormat.QDQ if mode == "static-qdq" else QuantFormat.QOperator
        extra = {"SmoothQuant": True, "SmoothQuantAlpha": 0.5} if mode == "sq" else None
        cfg = config.StaticQuantConfig(_reader(calib), quant_format=fmt, per_channel=True, extra_options=extra,
                                       calibration_sampling_size=len(next(iter(calib.values()))),
                                       execution_provider=cpu)
        if mode == "sq":
            level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    else:
        raise ValueError(mode)
    with tempfile.TemporaryDirectory(prefix="inc.") as tmp:
        out = Path(tmp) / dst.name  # INC may write config.json / external data beside its output
        quantize(str(src), str(out), cfg, optimization_level=level)
        model = onnx.load(str(out))  # external data, if any, pulled in: one self-contained file
    dst.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(dst))


def _weight_only(mode: str, src: Path, dst: Path, calib: dict) -> None:
    """INC's weight-only algorithm of ``mode`` on the float model as it is (no graph optimization first)."""
    from onnx_neural_compressor.quantization import algorithm_entry, config

    algo, kwargs = WEIGHT_ONLY[mode]
    cfg = {"rtn": config.RTNConfig, "gptq": config.GPTQConfig, "awq": config.AWQConfig}[algo](weight_bits=4,
                                                                                           **kwargs)
    if algo == "rtn":
        model = algorithm_entry.rtn_quantize_entry(str(src), cfg)
    else:
        entry = algorithm_entry.gptq_quantize_entry if algo == "gptq" else algorithm_entry.awq_quantize_entry
        model = entry(str(src), cfg, _reader(calib))
    model = model if isinstance(model, onnx.ModelProto) else model.model  # an ONNXModel from some entries
    if not any(n.op_type == "MatMulNBits" for n in model.graph.node):
        raise RuntimeError(f"INC {algo}: no MatMul with a constant 2-D weight quantized")
    dst.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(dst))


def _quantize_one(mode: str, src: Path, dst: Path, calib: dict, key: str) -> None:
    try:
        quantize(mode, src, dst, calib)
    except AttributeError as exc:
        if "_dynamic_quantize_bias" not in str(exc):
            raise
        # INC 1.0's dynamic Conv quantizer calls a method its DynamicQuantizer lacks on every Conv with a bias:
        # quantize the rest, as a user of INC would have to
        print(f"{key}: INC 1.0 fails on Convs with a bias ({exc}); Convs left in float", flush=True)
        quantize(mode, src, dst, calib, op_types=DYNAMIC_WITHOUT_CONV)
        ops = {n.op_type for n in onnx.load(str(dst), load_external_data=False).graph.node}
        if not ops & {"MatMulInteger", "DynamicQuantizeLinear", "DynamicQuantizeLSTM"}:
            raise RuntimeError("INC 1.0 dynamic: nothing quantized once the Convs are left out") from exc
    onnx.load(str(dst), load_external_data=False)


def main() -> int:
    logging.disable(logging.WARNING)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, nargs="?")
    ap.add_argument("--tiny", action="store_true", help="the suite's slice: tests/data/corpus")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--modes", nargs="*", default=list(MODES), choices=[*MODES, *WEIGHT_ONLY],
                    help="default: the four int8 modes; the weight-only 4-bit ones are named (see above)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print each failure's traceback")
    args = ap.parse_args()
    if args.tiny == (args.out is not None):
        ap.error("give OUT or --tiny")
    out = None if args.tiny else args.out.resolve()  # the work runs in a temporary directory
    floats_dir, quantized = (TINY / "float", TINY) if args.tiny else (out / "float", out / "quantized")
    floats = sorted(floats_dir.glob("*.onnx"))
    if args.only:
        floats = [p for p in floats if p.stem in args.only]
    failed = {}
    with tempfile.TemporaryDirectory(prefix="inc-cwd.") as cwd:  # INC's default workspace is ./nc_workspace
        os.chdir(cwd)
        for src in floats:
            calib = dict(np.load(src.with_suffix(".calib.npz")))
            for mode in args.modes:
                key = f"inc-{mode}/{src.name}"
                dst = quantized / f"inc-{mode}" / src.name
                try:
                    _quantize_one(mode, src, dst, calib, key)
                    if args.tiny and dst.stat().st_size > TINY_LIMIT:
                        dst.unlink()
                        print(f"{key}: over {TINY_LIMIT // 1000} kB, left out of the suite's slice", flush=True)
                        continue
                    print(key, flush=True)
                except Exception as exc:  # noqa: BLE001 - one failing model never stops the rest
                    failed[key] = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:300]}"
                    dst.unlink(missing_ok=True)
                    print(f"FAILED {key}: {failed[key]}", file=sys.stderr, flush=True)
                    if args.verbose:
                        traceback.print_exc()
        os.chdir(ROOT)
    if not args.tiny:  # the cells not run this time keep their record
        record = quantized / "inc-failed.json"
        ran = {f"inc-{mode}/{src.name}" for src in floats for mode in args.modes}
        kept = {k: v for k, v in (json.loads(record.read_text()) if record.is_file() else {}).items() if k not in ran}
        quantized.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps(dict(sorted({**kept, **failed}.items())), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
