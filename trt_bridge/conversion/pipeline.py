"""The conversion's stages in order (``STAGES``) and ``convert``, which runs them over one shared state and builds the
report from what each returned.

    load ─ lift ─ place ─ calibrate ─ lower ─ save ─ check
"""

from __future__ import annotations

from pathlib import Path

from trt_bridge.conversion.options import ConvertOptions
from trt_bridge.conversion.output import check, save
from trt_bridge.conversion.report import ConversionReport
from trt_bridge.conversion.stages import Conversion, calibrate, lift, load, lower_model, place_quantizers
from trt_bridge.ir.commit import Outputs
from trt_bridge.stage import Stage, merged_records, run_stages

#: the conversion, in order (see :mod:`trt_bridge.conversion.stages`)
STAGES: tuple[Stage, ...] = (
    Stage("load", load),  # load and check the source, open the calibration data and scale files
    Stage("lift", lift),  # the source to a float graph plus quantization annotations
    Stage("place", place_quantizers),  # which tensors get Q/DQ (TensorRT's fusion rules or the source's)
    Stage("calibrate", calibrate),  # scales for what has none; smoothing, re-centring, shared scales
    Stage("lower", lower_model),  # int8 Q/DQ and weights; the float layers in --high-precision
    Stage("save", save),  # refuse non-finite values, write atomically
    Stage("check", check, when=lambda state: state.options.check),  # trt-bridge check on the output
)


def convert(model_path: str | Path, output_path: str | Path, options: ConvertOptions = ConvertOptions(),
            outputs: Outputs | None = None) -> ConversionReport:
    """Convert the model at ``model_path`` and write the TensorRT-ready model to ``output_path``: once every stage
    has succeeded (the check and costs included), and, given ``outputs``, only when the caller commits them (with
    its report files: :class:`~trt_bridge.ir.commit.Outputs`). A failure or a signal before then leaves nothing."""
    if outputs is not None:
        state = Conversion(Path(model_path), Path(output_path), options, outputs=outputs)
        return ConversionReport(**merged_records(run_stages(STAGES, state)))
    with Outputs() as own:
        report = convert(model_path, output_path, options, own)
        own.commit()
    return report
