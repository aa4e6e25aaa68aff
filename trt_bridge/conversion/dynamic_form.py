"""``--activations dynamic`` on a Blackwell target (``--compute-capability`` 10.0 or newer): trt-bridge's
DynamicInt8Gemm plugin or TensorRT's own dynamic FP4 quantization, whichever measures more accurate.

Both compute the activations' scales per inference. The plugin (:mod:`trt_bridge.lift.dynamic_gemm_plugin`) does
what a dynamically quantized source did, one INT8 scale per tensor (or per row), with its INT8 weights; an engine
needs the plugin library where it runs. TensorRT's ``TRT_FP4DynamicQuantize`` (10.0+, no plugin) takes one FP8
scale per block of 16 under a calibrated global scale, with FP4 weights (``--fp4``'s W4A4). Both conversions are
made and measured against the source's float meaning (its lifted form, as the accuracy target measures) on the
evaluation feeds (``--calib-data``'s, else random ones); TensorRT's form is written only where it is at least as
accurate, and the report's ``dynamic_form`` names the one chosen with both scores::

    Before:  x ─ DynamicQuantizeLinear ─ MatMulInteger(W int8) ─ …          (or a float MatMul)
    After:   x ─ DynamicInt8Gemm(W int8)                                   plugin: per-inference INT8 scale
       or:   x ─ TRT_FP4DynamicQuantize ─ DQ ─ DQ ─ MatMul(W FP4 blocks)   TensorRT: per-inference FP4 blocks

FP4's 4-bit blocks round far more coarsely than 8-bit codes (one E2M1 rounding of a Gaussian block measures about
21 dB), so on the models measured here the plugin stays; ``TRT_MXFP8DynamicQuantize`` (8-bit elements) would be the
closer rival, but its E8M0 rounding is not pinned down offline and trt-bridge writes nothing in that form.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from trt_bridge.choices import compute_capability
from trt_bridge.conversion.options import ConvertOptions
from trt_bridge.conversion.pipeline import convert
from trt_bridge.conversion.report import ConversionReport
from trt_bridge.ir.commit import Outputs
from trt_bridge.ir.save import save_model
from trt_bridge.verification import DEFAULT_RANDOM_FEEDS, VerifyOptions, verify
from trt_bridge.verification.layers import float_reference

PLUGIN, FP4 = "plugin", "fp4"


@dataclass(frozen=True)
class DynamicForm:
    """What ``--activations dynamic`` chose on a 10.0+ target (the report's ``dynamic_form``)."""

    chosen: str  # PLUGIN or FP4
    scores: dict[str, float] = field(default_factory=dict)  # form → the worst output's SNR (dB) against the source
    feeds: str = ""  # what they were measured on
    reason: str = ""

    def to_dict(self) -> dict:
        return {**asdict(self), "scores": {k: round(v, 2) for k, v in self.scores.items()}}


def applies(options: ConvertOptions) -> bool:
    """``--activations dynamic`` with a target that runs TensorRT's dynamic FP4 quantization."""
    target = options.formats.compute_capability
    return options.activations.mode == "dynamic" and target is not None and compute_capability(target) >= 10.0


def fp4_options(options: ConvertOptions) -> ConvertOptions:
    """The W4A4 conversion beside the plugin's: static activations in FP4 with a calibrated global scale
    (``--calib-data``'s feeds, else random ones)."""
    calibration = options.calibration if options.calibration.data or options.calibration.random else replace(
        options.calibration, random=DEFAULT_RANDOM_FEEDS)
    return replace(options, calibration=calibration, activations=replace(options.activations, mode="static"),
                   formats=replace(options.formats, activations=FP4))


def score(reference: Path, candidate: Path, measure: VerifyOptions) -> float:
    """The worst output's SNR (dB) of ``candidate`` against ``reference`` (NaN: −inf)."""
    snr = min((m.snr_db for m in verify(reference, candidate, measure).outputs), default=math.inf)
    return -math.inf if math.isnan(snr) else snr


def convert_dynamic(model_path: str | Path, output_path: str | Path, options: ConvertOptions,
                    outputs: Outputs | None = None) -> ConversionReport:
    """Convert with ``--activations dynamic`` for a 10.0+ target (see the module doc): the plugin's conversion or
    TensorRT's dynamic FP4 one, whichever measures at least as accurate, written to ``output_path``."""
    model_path = Path(model_path)
    candidates = {PLUGIN: options, FP4: fp4_options(options)}
    data = options.calibration.data
    measure = VerifyOptions(data=data, random=None if data else DEFAULT_RANDOM_FEEDS, progress=False)
    scores: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="trt-bridge-dynamic-") as tmp:
        reference, lifted = float_reference(model_path)
        reference = save_model(reference, Path(tmp) / "reference.onnx", protect=(model_path,)) if lifted \
            else model_path
        saved = dict(save_inputs=str(Path(tmp) / "inputs.json"), save_outputs=str(Path(tmp) / "source.json"))
        for name, candidate in candidates.items():
            path = Path(tmp) / f"{name}.onnx"
            convert(model_path, path, replace(candidate, check=False, progress=False))
            # the first measurement keeps the feeds and the source's outputs, the second loads them
            scores[name] = score(reference, path, replace(measure, **saved) if not scores else replace(
                measure, data=None, random=None, load_inputs=saved["save_inputs"],
                load_outputs=saved["save_outputs"]))
    chosen = FP4 if scores[FP4] >= scores[PLUGIN] else PLUGIN
    reason = (f"TensorRT's dynamic FP4 measured {scores[FP4]:.2f} dB against the plugin's {scores[PLUGIN]:.2f} dB: "
              f"{'at least as accurate, no plugin needed' if chosen == FP4 else 'less accurate, the plugin stays'}")
    report = convert(model_path, output_path, candidates[chosen], outputs)
    report.dynamic_form = DynamicForm(chosen, scores, f"calibration data {data}" if data else
                                      f"{DEFAULT_RANDOM_FEEDS} random feeds", reason).to_dict()
    return report


def convert_as_asked(model_path: str | Path, output_path: str | Path, options: ConvertOptions,
                     outputs: Outputs | None = None) -> ConversionReport:
    """:func:`convert_dynamic` where it :func:`applies`, else the plain conversion (``convert`` and ``pipeline``)."""
    return (convert_dynamic if applies(options) else convert)(model_path, output_path, options, outputs)
