"""``trt-bridge check`` agrees with TensorRT-RTX's ONNX parser on real inputs and on what convert makes of them.

The corpus, one test per model:

- every model in ../shared/models (float MNIST; dynamic, QOperator zoo models);
- onnxruntime's own outputs for two float samples (``samples.conv_net``, ``samples.transformer_block``):
  ``quantize_dynamic`` (int8 and uint8 weights) and ``quantize_static`` in QOperator and QDQ format
  (uint8 activations; the conv net per tensor and per channel, and once with int8 activations);
- the floats themselves, and the converted form of every model above.

For each: the static rules (``--trt off``) find a blocker on every node the parser names (no missed
blocker); ``ready`` means TensorRT-RTX parses the model and builds an engine (no false "ready"); a
model the parser rejects is never ``ready``; with ``--trt auto`` the parser's messages land on the
static findings and the parser finds nothing the rules did not.

The rules are stricter than TensorRT-RTX 1.x in two places (false blockers, never a false "ready"):
it parses and builds an *activation* QuantizeLinear/DequantizeLinear with uint8 codes and zero point 0,
and a per-channel activation quantizer. `check` calls both blockers: TensorRT quantizes activations to
int8 per tensor, and datacenter TensorRT takes uint8 only on DLA behind a parser flag
(shared/docs/TENSORRT_QUANTIZATION.md); convert fixes both. In this corpus it shows in mnist-12-int8:
its uint8 zero-point-0 quantizers are static blockers that TensorRT-RTX does not name. (A uint8
*constant*, such as a DequantizeLinear of uint8 weights, RTX rejects too.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import onnx
import pytest
from helpers import SHARED_MODELS, quantize_dynamic, quantize_static, run_ort, save, snr_db

from trt_bridge import samples
from trt_bridge.checks import CheckOptions, Severity, TrtProbe, check_model
from trt_bridge.conversion import convert
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions
from trt_bridge.ir.names import name_nodes
from trt_bridge.tensorrt.build import build_engine
from trt_bridge.tensorrt.parse import ParserError, ParseResult, parse

pytest.importorskip("tensorrt_rtx")

RTX = "tensorrt_rtx"
CONVERTED = ">converted"

#: ../shared/models, pinned by its SHA256SUMS (test_corpus_lists_every_shared_model keeps this complete)
ZOO = {  # name: needs calibration to convert (nothing in it carries activation scales)
    "mnist-12.onnx": True, "mnist-12-uint8.onnx": True, "mnist-12-int8.onnx": False,
    "mobilenetv2-12-int8.onnx": False, "mlperf-tiny-resnet8-int8.onnx": False,
    "mlperf-tiny-dscnn-kws-int8.onnx": False, "mlperf-tiny-autoencoder-int8.onnx": False,
}


@dataclass(frozen=True)
class Sample:
    """A model built here: a float sample, or onnxruntime's quantization of one."""

    base: str  # 'conv' or 'transformer'
    quantize: str | None = None  # None (the float), 'dynamic', 'QOperator', 'QDQ'
    options: tuple[tuple[str, object], ...] = ()  # quantize_* keywords; QuantType members by name

    @property
    def calibrate(self) -> bool:
        return self.quantize in (None, "dynamic")


def _u8(**extra) -> tuple[tuple[str, object], ...]:
    """onnxruntime's default static types: uint8 activations (asymmetric), int8 weights."""
    return tuple({"activation_type": "QUInt8", "weight_type": "QInt8", **extra}.items())


SAMPLES = {
    "conv/float": Sample("conv"),
    "conv/dynamic": Sample("conv", "dynamic"),
    "conv/dynamic-uint8-weights": Sample("conv", "dynamic", (("weight_type", "QUInt8"),)),
    "conv/qoperator": Sample("conv", "QOperator", _u8(per_channel=False)),
    "conv/qoperator-per-channel": Sample("conv", "QOperator", _u8(per_channel=True)),
    "conv/qdq": Sample("conv", "QDQ", _u8(per_channel=False)),
    "conv/qdq-per-channel": Sample("conv", "QDQ", _u8(per_channel=True)),
    "conv/qdq-int8-activations": Sample("conv", "QDQ", (("activation_type", "QInt8"), ("per_channel", True))),
    "transformer/float": Sample("transformer"),
    "transformer/dynamic": Sample("transformer", "dynamic"),
    "transformer/qoperator": Sample("transformer", "QOperator", _u8(per_channel=True)),
    "transformer/qdq": Sample("transformer", "QDQ", _u8(per_channel=True)),
}
SOURCES = [f"zoo/{name}" for name in ZOO] + list(SAMPLES)

#: the converted samples against their float model on held-out inputs (seed 2): measured dB. The float and
#: dynamic transformers are calibrated on 8 random feeds, far from its inputs' outlier channels.
MEASURED_SNR_DB = {
    "conv/float": 45.6, "conv/dynamic": 36.4, "conv/dynamic-uint8-weights": 37.9, "conv/qoperator": 32.5,
    "conv/qoperator-per-channel": 33.4, "conv/qdq": 32.5, "conv/qdq-per-channel": 33.4,
    "conv/qdq-int8-activations": 33.4, "transformer/float": 16.0, "transformer/dynamic": 16.0,
    "transformer/qoperator": 38.0, "transformer/qdq": 37.9,
}
MODELS = SOURCES + [f"{name}{CONVERTED}" for name in SOURCES]


class Corpus:
    """Builds each model on first use, once per module (and per xdist worker: all of it takes seconds)."""

    def __init__(self, root: Path, shared: Callable[[], Path]):
        self.root, self.shared = root, shared
        self.paths: dict[str, Path] = {}

    def path(self, name: str) -> Path:
        if name not in self.paths:
            self.paths[name] = self._build(name)
        return self.paths[name]

    def calibrate(self, name: str) -> bool:
        return ZOO[name[4:]] if name.startswith("zoo/") else SAMPLES[name].calibrate

    def _file(self, name: str) -> Path:
        return self.root / (name.replace("/", "__").replace(">", "__") + ".onnx")

    def _build(self, name: str) -> Path:
        if name.endswith(CONVERTED):
            source = name[: -len(CONVERTED)]
            out = self._file(name)
            convert(self.path(source), out, ConvertOptions(
                calibration=CalibrationOptions(random=8 if self.calibrate(source) else None), progress=False,
                check=False))
            return out
        if name.startswith("zoo/"):
            return self.shared() / name[4:]
        sample = SAMPLES[name]
        if sample.quantize is None:
            model = samples.conv_net(channels=(8, 16)) if sample.base == "conv" else samples.transformer_block()
            return save(model, self._file(name))
        float_path = self.path(f"{sample.base}/float")
        options = dict(sample.options)
        if sample.quantize == "dynamic":
            return quantize_dynamic(float_path, self._file(name), **_quant_types(options))
        from onnxruntime.quantization import QuantFormat

        feeds = ([{"x": f} for f in samples.image_feeds(8, seed=1)] if sample.base == "conv"
                 else [{"x": f} for f in samples.sequence_feeds(8, 1, 16, 64)])
        return quantize_static(float_path, self._file(name), feeds, quant_format=getattr(QuantFormat,
                               sample.quantize), **_quant_types(options))


def _quant_types(options: dict) -> dict:
    from onnxruntime.quantization import QuantType

    return {k: getattr(QuantType, v) if k.endswith("_type") else v for k, v in options.items()}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Corpus:
    def shared() -> Path:
        if not SHARED_MODELS.is_dir():
            pytest.skip(f"the shared model corpus is not at {SHARED_MODELS}")
        return SHARED_MODELS

    return Corpus(tmp_path_factory.mktemp("agreement"), shared)


def _named_nodes(path: Path, parsed: ParseResult) -> dict[str, ParserError]:
    """The node each parser error names, under the names `check` uses (it names unnamed nodes by index,
    the way convert does)."""
    model = onnx.load(str(path), load_external_data=False)
    name_nodes(model)
    names = [n.name for n in model.graph.node]
    named = {}
    for error in parsed.details:
        node = error.node or (names[error.index] if 0 <= error.index < len(names) else "")
        assert node, f"{path}: the parser names no node: {error}"
        named.setdefault(node, error)
    return named


def test_corpus_lists_every_shared_model(shared_models):
    assert sorted(p.name for p in shared_models.glob("*.onnx")) == sorted(ZOO)


@pytest.mark.parametrize("name", MODELS)
def test_check_agrees_with_tensorrt_rtx(corpus, name):
    path = corpus.path(name)
    report = check_model(path, CheckOptions(TrtProbe.OFF))
    parsed = parse(path, RTX)
    named = _named_nodes(path, parsed)
    summary = f"{report.summary()}\nTensorRT-RTX: {parsed.errors}"

    # (1) no missed blocker: every node the parser rejects has a static blocker
    blocked = {f.node for f in report.blockers}
    assert set(named) <= blocked, f"missed: {sorted(set(named) - blocked)}\n{summary}"
    # (2) no false "ready": TensorRT-RTX parses it and builds an engine (ahead of time, SM 8.9)
    if report.ready:
        assert parsed.ok, summary
        assert len(build_engine(path, module=RTX)) > 0
    # (3) what the parser rejects is never "ready", and the parser says where
    if not parsed.ok:
        assert not report.ready and named, summary

    # what each family must come to (so that the implications above are never vacuous)
    if name.endswith(CONVERTED):
        assert report.ready and not report.findings, summary
        source = name[: -len(CONVERTED)]
        if source in SAMPLES:  # and computes the float sample's function (the zoo's: tests/corpus/test_shared_models)
            base = SAMPLES[source].base
            feeds = ([{"x": f} for f in samples.image_feeds(8, seed=2)] if base == "conv"
                     else [{"x": f} for f in samples.sequence_feeds(8, 2, 16, 64)])
            snr = snr_db(run_ort(corpus.path(f"{base}/float"), feeds), run_ort(path, feeds))
            assert snr > MEASURED_SNR_DB[source] - 3, (snr, MEASURED_SNR_DB[source])
    elif name in ("zoo/mnist-12.onnx", "conv/float", "transformer/float"):
        assert parsed.ok and [(f.rule, f.severity) for f in report.findings] == [("not-int8", Severity.BLOCKER)]
    else:  # no quantized source here parses as shipped (shared/models/README.md, TENSORRT_QUANTIZATION.md)
        assert not parsed.ok and not report.ready, summary

    # (5) with the parser: its message lands on the static finding of each node it names, nothing else changes
    probed = check_model(path, CheckOptions(TrtProbe.AUTO))
    assert probed.parser is not None
    if probed.parser.module != RTX:  # a GPU machine with datacenter TensorRT: compare with that parser
        parsed = parse(path, probed.parser.module)
        named = _named_nodes(path, parsed)
    assert probed.parser.ok == parsed.ok
    assert not [f.node for f in probed.findings if f.rule == "tensorrt-parser"], probed.summary()
    assert [(f.rule, f.node) for f in probed.findings] == [(f.rule, f.node) for f in report.findings]
    for node, error in named.items():
        messages = [f.tensorrt for f in probed.findings if f.node == node and f.tensorrt]
        assert any(error.message in m for m in messages), f"{node}: {error}\n{probed.summary()}"
    assert all(f.tensorrt is None for f in probed.findings if f.node not in named)
