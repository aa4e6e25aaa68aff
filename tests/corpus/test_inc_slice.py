"""The suite's slice of the real-export corpus, quantized by Intel Neural Compressor (``onnx-neural-compressor`` 1.0).

``tests/data/corpus/inc-<mode>/<arch>.onnx`` are the tiny float models of ``tests/data/corpus/float`` (BERT by
the TorchScript and the dynamo exporter, a T5 encoder, SegFormer; hidden size 32) as INC quantized them, committed
because INC is not a dependency of the suite. Regenerate them (same bytes) in INC's own virtualenv
(``scripts/corpus/build.py`` makes it)::

    .corpus/venvs/inc/bin/python scripts/corpus/quantize_inc.py --tiny

Modes: ``static-qop`` (QOperator: com.microsoft ``QLinearAdd``/``QLinearMul``, ``QGemm``, quantized ``Gather``
tables, one name for several copies of a shared bias), ``static-qdq`` (per-channel weights, int32 bias
``DequantizeLinear``), ``dynamic`` (``MatMulInteger``, quantized embedding ``Gather``), ``sq`` (SmoothQuant then
QOperator, com.microsoft ops without the domain's opset import). INC 1.0 cannot quantize the SegFormer slice
dynamically (its dynamic Conv quantizer fails on a Conv with a bias and nothing else is left) nor with SmoothQuant
(its smoother fails on the model), and its QDQ SegFormer is over the suite's 300 kB limit.

Each model is converted (dynamic ones calibrated on the calibration feeds, static ones with their own scales),
checked for blockers and the Q/DQ contract, parsed and built ahead of time by TensorRT-RTX, and compared with its
source against the float model on the held-out feeds: within 1 dB of the source's SNR, or better.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers import assert_qdq_contract, assert_tensorrt_ready, corpus_scorer  # noqa: E402

from trt_bridge.conversion import convert  # noqa: E402
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "corpus"
CELLS = sorted((p.parent.name.removeprefix("inc-"), p.stem) for p in DATA.glob("inc-*/*.onnx"))


def test_the_slice_is_there():
    assert {m for m, _ in CELLS} == {"static-qop", "static-qdq", "dynamic", "sq"}
    assert ("static-qop", "segformer") in CELLS and len(CELLS) == 13
    assert all(p.stat().st_size < 300_000 for p in DATA.glob("inc-*/*.onnx"))


@pytest.mark.parametrize(("mode", "arch"), CELLS)
def test_inc_model_converts_builds_and_keeps_its_accuracy(tmp_path, mode, arch):
    source = DATA / f"inc-{mode}" / f"{arch}.onnx"
    calib = DATA / "float" / f"{arch}.calib.npz"
    out = tmp_path / "converted.onnx"
    report = convert(source, out, ConvertOptions(
        calibration=CalibrationOptions(data=str(calib) if mode == "dynamic" else None), progress=False))
    assert not report.remaining_blockers
    assert_qdq_contract(out)
    assert_tensorrt_ready(out)
    score = corpus_scorer(DATA / "float", arch)
    converted_snr = score(out, simulate=True)
    source_snr = score(source, simulate=False)  # onnxruntime runs every one
    # the bar: within 1 dB of the source's own SNR against the float model, or better
    assert converted_snr >= source_snr - 1.0, f"{arch} {mode}: {converted_snr:.1f} dB vs source {source_snr:.1f} dB"
