"""Quantize the corpus's float models with Qualcomm AIMET (aimet-onnx), and export them the ways AIMET users do.

    python scripts/corpus/quantize_aimet.py OUT [--only NAME ...] [--modes ...]
    python scripts/corpus/quantize_aimet.py --tiny            # the suite's slice: tests/data/corpus/aimet-*

``--tiny`` quantizes ``tests/data/corpus/float`` in the modes ``encodings``, ``encodings-legacy``,
``encodings-v2`` and ``qdq`` for ``tests/corpus/test_aimet_slice.py``: ``aimet-encodings*/<name>.encodings``
alone where AIMET's float export is the float model itself (same nodes, names and weights: checked here),
with its model where it is not (``encodings-v2`` duplicates shared initializers), and
``aimet-qdq/<name>.onnx``; a file over the fixtures' 300 KB is not kept.

Runs in its own virtualenv (``OUT/venvs/aimet``: torch 2.13 CPU, aimet-onnx 2.42; see ``build.py``).
Reads ``OUT/float/<name>.onnx`` and its ``.calib.npz``. Each model goes through AIMET's usual recipe:
batch norms folded into the weights (``fold_all_batch_norms_to_weight``), a
``QuantizationSimModel`` (int8 weights and activations, min-max ranges, AIMET's default config:
per-channel weights for Conv/ConvTranspose/Gemm/MatMul, symmetric weights, asymmetric activations,
output of every op quantized), ``compute_encodings`` on the 16 calibration feeds, then:

- ``encodings``: ``sim.export(dir, name)``, the float model AIMET prepared + its encodings JSON (1.0.0
  layout): ``OUT/quantized/aimet-encodings/<name>.onnx``, ``<name>.encodings`` and ``<name>.sim.onnx``;
- ``encodings-legacy``: ``sim.export(..., encoding_version="0.6.1")``, the older layout keyed by tensor
  name: ``OUT/quantized/aimet-encodings-legacy/...``;
- ``encodings-v2``: ``sim.export(..., encoding_version="2.0.0")``: one ONNX-style list with axes, int32
  biases and the data-movement outputs' encodings (shared initializers duplicated first, as AIMET asks
  for int32 biases): ``OUT/quantized/aimet-encodings-v2/...``;
- ``qdq``: ``sim.to_onnx_qdq()``, ONNX Q/DQ with float weights quantized at run time (Q → DQ) and uint8
  activations: ``OUT/quantized/aimet-qdq/<name>.onnx``;
- ``qdq-a16``: as ``qdq`` with 16-bit activations (``activation_type="int16"``, AIMET's W8A16):
  ``OUT/quantized/aimet-qdq-a16/<name>.onnx``;
- ``qdq-int``: ``sim.to_onnx_qdq(prequantize_constants=True, export_int32_bias=True)``: int8 weight
  initializers → DQ and int32 biases → DQ (shared initializers duplicated first):
  ``OUT/quantized/aimet-qdq-int/<name>.onnx``.

The 4-bit and FP8 modes (``--modes qdq-w4 ...``; not in the default run), each ``sim.to_onnx_qdq()`` of a
simulation whose weights AIMET quantizes otherwise (the activations as above):

| mode | simulation | export |
|---|---|---|
| qdq-w4 | ``param_type="int4"`` (W4A8) | INT4 per-channel weight Q/DQ, uint8 activations, opset 21 |
| qdq-w4a16 | ``param_type="int4", activation_type="int16"`` | INT4 per-channel weight Q/DQ, uint16 activations |
| qdq-w4-block | ``set_blockwise_quantization_for_weights`` (4 bits, symmetric, 32) | INT4 Q/DQ, ``block_size=32`` |
| qdq-w4-lpbq | ``set_lpbq_for_params(sim, 4, 32)`` on Gemm/MatMul | INT4 DQ, ``block_size=32``, scale from a uint8 DQ |
| qdq-fp8 | ``param_type=activation_type="float8e4m3fn"`` | FLOAT8E4M3FN Q/DQ (per-channel weights), opset 19 |
| encodings-w4 | as ``qdq-w4``, ``sim.export`` (1.0.0 layout) | the float model + encodings, ``bw: 4`` weights |

Blocks run along the weights' input channels, on Gemm, MatMul and Conv; a layer whose input channels 32 does not
divide keeps its int8 per-channel quantizer (``strict=False``). AIMET writes a k×k Conv's block scale as
``[O, I/32, 1, 1]``, which onnxruntime refuses ("x_scale and x must have the same shape despite the quantize
axis"): such a source is kept (trt-bridge reads it) though onnxruntime cannot run it. LPBQ (low-power blockwise:
the 4-bit blocks' scales are int8 multiples of a per-channel scale) leaves Conv out: ``to_onnx_qdq`` refuses a 4-D
weight ("LPBQ can be only applied to tensors with at most two non-singleton dimensions"), so a convolutional model
keeps int8 weights there.
FP8 encodings have no 1.0.0 layout (AIMET: "use the 2.0.0 format or onnx QDQ export instead").

``<name>.sim.onnx`` beside an encodings export is the same simulation as Q/DQ (``to_onnx_qdq``): the
matrix measures the source's SNR on it, since the float model alone is not what AIMET simulates.
Every model is written as one file (AIMET writes weights as external data; they are loaded back in).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import traceback
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "corpus"
MODES = ("encodings", "encodings-legacy", "encodings-v2", "qdq", "qdq-a16", "qdq-int")
#: the 4-bit and FP8 modes (not run unless asked with --modes: see the docstring)
LOW_BIT_MODES = ("qdq-w4", "qdq-w4a16", "qdq-w4-block", "qdq-w4-lpbq", "qdq-fp8", "encodings-w4")
#: each mode's simulation: (param type, activation type, weight blocks), int8 per-channel weights where not named
SIMS = {"qdq-a16": ("int8", "int16", None), "qdq-w4": ("int4", "int8", None), "qdq-w4a16": ("int4", "int16", None),
        "qdq-w4-block": ("int8", "int8", "block"), "qdq-w4-lpbq": ("int8", "int8", "lpbq"),
        "qdq-fp8": ("float8e4m3fn", "float8e4m3fn", None), "encodings-w4": ("int4", "int8", None)}
#: the weights the block-wise modes quantize in 4-bit blocks of 32 input channels (LPBQ: to_onnx_qdq takes no Conv)
BLOCK = 32
BLOCK_OPS = {"block": ("Gemm", "MatMul", "Conv"), "lpbq": ("Gemm", "MatMul")}
#: the exports with int32 biases, which AIMET computes per bias: shared initializers are duplicated first, as it asks
SHARED_DUPLICATED = ("encodings-v2", "qdq-int")


def _feeds(path: Path) -> list[dict]:
    data = dict(np.load(path))
    return [{k: v[i] for k, v in data.items()} for i in range(len(next(iter(data.values()))))]


def _inline_identity_constants(model: onnx.ModelProto) -> None:
    """TorchScript shares equal constants as ``Identity(initializer)``: give each Identity its own copy (what
    onnx-simplifier does), so AIMET's ``duplicate_shared_initializers`` can separate the biases it sees."""
    inits = {t.name: t for t in model.graph.initializer}
    keep = []
    for node in model.graph.node:
        if node.op_type == "Identity" and node.input[0] in inits and node.output[0] not in inits:
            copy = onnx.TensorProto()
            copy.CopyFrom(inits[node.input[0]])
            copy.name = node.output[0]
            model.graph.initializer.append(copy)
            inits[copy.name] = copy
        else:
            keep.append(node)
    del model.graph.node[:]
    model.graph.node.extend(keep)


def _sim(src: Path, calib: list[dict], activation_type: str, duplicate: bool = False, param_type: str = "int8",
         blocks: str | None = None):
    from aimet_onnx import QuantizationSimModel
    from aimet_onnx.batch_norm_fold import fold_all_batch_norms_to_weight
    from aimet_onnx.quantsim import set_blockwise_quantization_for_weights, set_lpbq_for_params
    from aimet_onnx.utils import duplicate_shared_initializers

    model = onnx.load(str(src))
    fold_all_batch_norms_to_weight(model)
    if duplicate:  # after folding, which writes the Conv biases
        _inline_identity_constants(model)
        duplicate_shared_initializers(model.graph)
    sim = QuantizationSimModel(model, param_type=param_type, activation_type=activation_type,
                               quant_scheme="min_max", config_file="default",
                               session_options_kwargs={"intra_op_num_threads": 1})
    if blocks == "block":  # strict=False: a layer whose input channels BLOCK does not divide keeps its quantizer
        set_blockwise_quantization_for_weights(sim, BLOCK_OPS[blocks], bitwidth=4, symmetric=True, block_size=BLOCK)
    elif blocks == "lpbq":
        set_lpbq_for_params(sim, 4, BLOCK, op_types=set(BLOCK_OPS[blocks]))
    sim.compute_encodings(calib)
    return sim


def _save_one_file(model: onnx.ModelProto, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(dst))


def export(sim, mode: str, src: Path, dst: Path) -> list[Path]:
    """Write ``sim`` the way ``mode`` exports it; returns the files written (``dst`` first)."""
    if mode.startswith("qdq"):
        int_export = mode == "qdq-int"
        _save_one_file(sim.to_onnx_qdq(prequantize_constants=int_export, export_int32_bias=int_export), dst)
        return [dst]
    version = {"encodings-legacy": "0.6.1", "encodings-v2": "2.0.0"}.get(mode, "1.0.0")
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        sim.export(tmp, src.stem, encoding_version=version)
        exported = onnx.load(os.path.join(tmp, f"{src.stem}.onnx"))  # loads AIMET's external data file
        _save_one_file(exported, dst)
        encodings = dst.with_suffix(".encodings")
        shutil.copyfile(os.path.join(tmp, f"{src.stem}.encodings"), encodings)
    sim_path = dst.with_suffix(".sim.onnx")
    _save_one_file(sim.to_onnx_qdq(), sim_path)
    return [dst, encodings, sim_path]


def _same_graph(a: onnx.ModelProto, b: onnx.ModelProto) -> bool:
    def key(m):
        return ([(n.op_type, list(n.input), list(n.output)) for n in m.graph.node],
                {t.name: onnx.numpy_helper.to_array(t).tobytes() for t in m.graph.initializer})

    return key(a) == key(b)


def tiny(sim, mode: str, src: Path, dst: Path) -> None:
    """The suite's fixtures: the encodings alone where AIMET's export is the float model, small models."""
    with tempfile.TemporaryDirectory() as tmp:
        written = export(sim, mode, src, Path(tmp) / src.name)
        model_needed = mode == "qdq" or not _same_graph(onnx.load(str(written[0])), onnx.load(str(src)))
        kept = [written[0]] * model_needed + written[1:2] * (mode != "qdq")
        too_big = [p for p in kept if p.stat().st_size >= 300_000]
        if too_big:
            print(f"{mode}/{too_big[0].name}: {too_big[0].stat().st_size} bytes, over the fixtures' 300 KB; not kept")
            return
        dst.parent.mkdir(parents=True, exist_ok=True)
        if model_needed:
            shutil.copyfile(written[0], dst)
        if mode != "qdq":
            shutil.copyfile(written[1], dst.with_suffix(".encodings"))


def run(floats: list[Path], modes: list[str], out_dir, failed_path: Path | None, verbose: bool,
        write=None) -> dict:
    failed = {}
    for src in floats:
        calib = _feeds(src.with_suffix(".calib.npz"))
        sims = {}  # one simulation per activation type serves every export of it
        for mode in modes:
            dst = out_dir(mode) / src.name
            key = f"aimet-{mode}/{src.name}"
            param, activation, blocks = SIMS.get(mode, ("int8", "int8", None))
            kind = (activation, mode in SHARED_DUPLICATED, param, blocks)
            try:
                if kind not in sims:
                    sims.clear()
                    sims[kind] = _sim(src, calib, *kind)
                (write or export)(sims[kind], mode, src, dst)
                if write is None:
                    onnx.load(str(dst), load_external_data=False)
                print(key, flush=True)
            except Exception as exc:
                failed[key] = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:300]}"
                for suffix in (".onnx", ".encodings", ".sim.onnx"):
                    dst.with_suffix(suffix).unlink(missing_ok=True)
                print(f"FAILED {key}: {failed[key]}", file=sys.stderr, flush=True)
                if verbose:
                    traceback.print_exc()
    if failed_path is not None:  # kept for the models not run this time (--only)
        failed_path.parent.mkdir(parents=True, exist_ok=True)
        ran = {f"aimet-{mode}/{src.name}" for src in floats for mode in modes}
        old = json.loads(failed_path.read_text()) if failed_path.is_file() else {}
        failed = {**{k: v for k, v in old.items() if k not in ran}, **failed}
        failed_path.write_text(json.dumps(dict(sorted(failed.items())), indent=1))
    return failed


def main() -> int:
    logging.disable(logging.WARNING)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, nargs="?")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--modes", nargs="*", default=list(MODES), choices=[*MODES, *LOW_BIT_MODES])
    ap.add_argument("--tiny", action="store_true", help="quantize the suite's slice into tests/data/corpus")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    if args.tiny:
        folder = TINY / "float"
        modes = [m for m in args.modes if m in ("encodings", "encodings-legacy", "encodings-v2", "qdq")]
    elif args.out is None:
        ap.error("give OUT (the corpus folder) or --tiny")
    else:
        folder = args.out / "float"
        modes = args.modes
    floats = sorted(folder.glob("*.onnx"))
    if args.only:
        floats = [p for p in floats if p.stem in args.only]
    if args.tiny:
        run(floats, modes, lambda mode: TINY / f"aimet-{mode}", None, args.verbose, write=tiny)
    else:
        run(floats, modes, lambda mode: args.out / "quantized" / f"aimet-{mode}",
            args.out / "quantized" / "aimet-failed.json", args.verbose)
    return 0


if __name__ == "__main__":
    sys.exit(main())
