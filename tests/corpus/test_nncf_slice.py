"""NNCF's outputs on the suite's slice of the real-export corpus (``tests/data/corpus/float``).

``tests/data/corpus/nncf-<mode>/<arch>.onnx`` are what ``nncf.quantize`` (NNCF 3.4.0, ONNX backend) wrote
for the tiny BERT (TorchScript and dynamo exporters) and T5 encoder, in three modes: ``default`` (the
performance preset: symmetric int8), ``mixed`` (``QuantizationPreset.MIXED``: activations with non-zero
zero points) and ``transformer`` (``ModelType.TRANSFORMER``: SmoothQuant Muls, fewer quantizers). They
carry NNCF's patterns: int8 weight initializers read by a DequantizeLinear alone with ``axis=-1``, Q/DQ
pairs in front of Reshape/Transpose, an attention mask's Q/DQ whose scale overflowed to inf. (SegFormer,
where NNCF also writes per-axis activation pairs, is over the size limit for committed fixtures; its
pattern is tested in ``tests/lift/test_qdq_pair_nncf.py``.) Regenerate them, in NNCF's own virtualenv
(``scripts/corpus/build.py`` makes it), with::

    python scripts/corpus/quantize_nncf.py --tiny --only bert bert-dynamo t5-encoder --modes default mixed transformer

Each is converted with its own scales, checked for the Q/DQ contract, parsed and built ahead of time by
TensorRT-RTX, and compared with its source against the float model on the held-out feeds.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers import assert_qdq_contract, assert_tensorrt_ready, corpus_scorer  # noqa: E402

from trt_bridge.conversion import convert  # noqa: E402
from trt_bridge.conversion.options import ConvertOptions  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "corpus"
CELLS = sorted((p.parent.name, p.stem) for p in DATA.glob("nncf-*/*.onnx"))


def _untranslatable(path: Path) -> set[str]:
    """The source's activation QuantizeLinears with no TensorRT equivalent: per-axis or non-finite scales."""
    model = onnx.load(str(path))
    consts = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    return {n.name for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] not in consts
            and (consts[n.input[1]].size > 1 or not np.isfinite(consts[n.input[1]]).all())}


def test_the_slice_is_there():
    assert {mode for mode, _ in CELLS} == {"nncf-default", "nncf-mixed", "nncf-transformer"}
    assert {arch for _, arch in CELLS} == {"bert", "bert-dynamo", "t5-encoder"}


@pytest.mark.parametrize(("mode", "arch"), CELLS)
def test_nncf_output_converts_builds_and_keeps_its_accuracy(tmp_path, mode, arch):
    source = DATA / mode / f"{arch}.onnx"
    out = tmp_path / "converted.onnx"
    report = convert(source, out, ConvertOptions(progress=False))  # the source's own scales
    assert not report.remaining_blockers
    assert {a["node"] for a in report.approximated} == _untranslatable(source)
    assert_qdq_contract(out)
    assert_tensorrt_ready(out)
    score = corpus_scorer(DATA / "float", arch)
    converted_snr = score(out, simulate=True)
    source_snr = score(source, simulate=False)
    # the bar: within 1 dB of the source's own SNR against the float model, or better
    assert converted_snr >= source_snr - 1.0, f"{mode} {arch}: {converted_snr:.1f} dB vs source {source_snr:.1f} dB"
