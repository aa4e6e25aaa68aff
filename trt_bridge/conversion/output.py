"""The last two stages of a conversion: the output staged beside its target (:func:`save`) and checked there
(:func:`check`); :func:`trt_bridge.conversion.pipeline.convert` commits it (and the command's report files) once
every stage has succeeded (:class:`~trt_bridge.ir.commit.Outputs`), so a failed check or a signal leaves nothing."""

from __future__ import annotations

import onnx

from trt_bridge.checks import CheckOptions, check_model
from trt_bridge.conversion import costs
from trt_bridge.conversion.stages import Conversion
from trt_bridge.ir.files import external_data_files
from trt_bridge.ir.save import stage_model
from trt_bridge.ir.size import RELEASE_BYTES, is_large, release_memory
from trt_bridge.ir.values import check_output_finite
from trt_bridge.stage import StageResult


def save(state: Conversion) -> StageResult:
    """Refuse non-finite values the source did not have, then stage the output beside its target (never over an
    input): it is renamed into place with the command's other outputs once the check has passed
    (:class:`~trt_bridge.ir.commit.Outputs`); a model over 2 GB is checked from disk."""
    check_output_finite(state.out_model, state.source_nonfinite, state.model_path)
    written = state.staged = stage_model(state.out_model, state.output_path, state.outputs,
                                         protect=(state.model_path, *external_data_files(state.model_path)))
    if is_large(state.out_model):
        onnx.checker.check_model(str(written), full_check=True)
    state.out_model = None  # written: the check reads it from disk, and TensorRT's builder holds it again
    if state.weight_bytes >= RELEASE_BYTES:
        release_memory()
    return StageResult(changed=1)


def check(state: Conversion) -> StageResult:
    """``trt-bridge check`` on the written (staged) output, with TensorRT's parser where installed, for the
    target."""
    checked = check_model(state.staged, CheckOptions.for_target(state.options.formats.compute_capability))
    checked.rename(state.staged, state.output_path)  # the report names the output, not where it was staged
    return StageResult(changed=0, records={
        "check": {**checked.to_dict(), "headline": checked.headline()}, "costs": costs.against_float(
            checked.costs, state.float_copy, state.store is not None, state.options.formats.compute_capability),
        "remaining_blockers": [f"{f.where}: {f.why}" for f in checked.blockers]})
