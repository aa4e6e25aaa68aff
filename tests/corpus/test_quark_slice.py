"""AMD Quark's real output on the suite's slice of the corpus (``tests/data/corpus/quark-<mode>/``).

The fixtures are the tiny float models of ``tests/data/corpus/float`` (BERT by both exporters, a T5
encoder; hidden size 32) quantized by amd-quark 0.13's ``ModelQuantizer`` in six modes: ``xint8``
(power-of-two scales; its T5 encoder's nodes are out of topological order), ``a8w8``, ``a16w8`` (int16
activations, com.microsoft Q/DQ), ``bfp16`` and ``mxint8`` (com.amd.quark BFPQuantizeDequantize /
MXQuantizeDequantize), ``u8s8`` (asymmetric uint8 activations). Regenerate them with Quark's own venv
(``scripts/corpus/build.py`` makes it):

    .corpus/venvs/quark/bin/python scripts/corpus/quantize_quark.py --tiny

Each is converted (static sources with their own scales; the block formats, which carry none, calibrated
on the calibration feeds), checked for blockers and the Q/DQ contract, parsed and built ahead of time by
TensorRT-RTX, and compared with its source against the float model on the held-out feeds.
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
FLOAT = DATA / "float"
MODES = ("xint8", "a8w8", "a16w8", "bfp16", "mxint8", "u8s8")
ARCHS = ("bert", "bert-dynamo", "t5-encoder")

#: Where the source cannot be the bar (onnxruntime cannot run com.amd.quark ops here), the converted model's
#: measured SNR (dB), barred 3 dB under. With Quark's custom-op library the sources measured: BFP16 37.1 (bert,
#: bert-dynamo) and 17.8 dB (t5-encoder), MXINT8 35.9 and 32.7 dB: the int8 conversions are better.
MEASURED = {(mode, arch): snr for mode in ("bfp16", "mxint8")
            for arch, snr in (("bert", 76.2), ("bert-dynamo", 76.2), ("t5-encoder", 39.7))}
BLOCK_FORMATS = ("bfp16", "mxint8")


def test_the_slice_is_there():
    assert sorted(p.relative_to(DATA).as_posix() for p in DATA.glob("quark-*/*.onnx")) == sorted(
        f"quark-{m}/{a}.onnx" for m in MODES for a in ARCHS)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("arch", ARCHS)
def test_quark_output_converts_builds_and_keeps_its_accuracy(tmp_path, arch, mode):
    source = DATA / f"quark-{mode}" / f"{arch}.onnx"
    out = tmp_path / "converted.onnx"
    calib = str(FLOAT / f"{arch}.calib.npz") if mode in BLOCK_FORMATS else None  # no scales to keep
    report = convert(source, out, ConvertOptions(calibration=CalibrationOptions(data=calib), progress=False))
    assert not report.remaining_blockers
    assert_qdq_contract(out)
    assert_tensorrt_ready(out)
    approximated = {a["rule"] for a in report.approximated}
    assert approximated == ({"block-quantize-dequantize"} if mode in BLOCK_FORMATS else
                            {"qdq-pair"} if mode == "a16w8" else set())
    score = corpus_scorer(FLOAT, arch)
    converted = score(out, simulate=True)
    if (mode, arch) in MEASURED:
        assert converted >= MEASURED[mode, arch] - 3.0, f"{arch} {mode}: {converted:.1f} dB"
        return
    source_snr = score(source, simulate=False)
    # the bar: within 1 dB of the source's own SNR against the float model, or better
    assert converted >= source_snr - 1.0, f"{arch} {mode}: {converted:.1f} dB vs source {source_snr:.1f} dB"
