"""The last two stages of a conversion: the output staged beside its target (:func:`save`) and checked there
(:func:`check`); :func:`trt_bridge.conversion.pipeline.convert` commits it (and the command's report files) once
every stage has succeeded (:class:`~trt_bridge.ir.commit.Outputs`), so a failed check or a signal leaves nothing."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx

from trt_bridge.checks import CheckOptions, check_model
from trt_bridge.conversion import costs
from trt_bridge.conversion.stages import Conversion
from trt_bridge.ir.files import external_data_files
from trt_bridge.ir.save import stage_model
from trt_bridge.ir.size import RELEASE_BYTES, is_large, release_memory
from trt_bridge.ir.values import check_output_finite
from trt_bridge.stage import StageResult
from trt_bridge.tensorrt.decoder_profiles import decoder_profiles, model_inputs_shapes
from trt_bridge.tensorrt.profiles import Profile


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
    options = CheckOptions.for_target(state.options.formats.compute_capability)
    profiles = feed_profiles(state)
    checked = check_model(state.staged, replace(options, profiles=profiles))
    checked.rename(state.staged, state.output_path)  # the report names the output, not where it was staged
    formats = state.options.formats
    against = costs.against_float(checked.costs, state.float_copy, state.store is not None,
                                  formats.compute_capability, profiles)
    if against is not None:
        against["larger_than_float"] = costs.larger_than_float(against, checked.builders, formats.trt_module)
    return StageResult(changed=0, records={
        "check": {**checked.to_dict(), "headline": checked.headline()}, "costs": against,
        "remaining_blockers": [f"{f.where}: {f.why}" for f in checked.blockers], "builders": checked.builders})


def feed_profiles(state: Conversion) -> tuple[Profile, ...]:
    """The check's build profile from the calibration data: each dynamic input from the smallest to the largest shape
    the feeds give it (opt: the largest), so "ready" means TensorRT builds the shapes the model was calibrated on (a
    model whose dynamic dimensions cannot be 1, Silero VAD's audio chunk, fails TensorRT's default of 1). () without
    calibration data, for random feeds, for a decoder (its prefill and decode profiles), or without dynamic
    inputs."""
    if state.feeds is None or state.options.calibration.data is None:
        return ()
    inputs = model_inputs_shapes(onnx.load(str(state.staged), load_external_data=False))
    dynamic = {name for name, shape in inputs.items() if any(d < 0 for d in shape)}
    if not dynamic or decoder_profiles(inputs):
        return ()
    low: dict[str, np.ndarray] = {}
    high: dict[str, np.ndarray] = {}
    for feed in state.feeds:
        for name in dynamic:
            shape = np.asarray(np.shape(feed.get(name, ())))
            if name not in low:
                low[name], high[name] = shape, shape
            elif len(shape) != len(low[name]):
                return ()  # feeds of different ranks: no one profile
            else:
                low[name], high[name] = np.minimum(low[name], shape), np.maximum(high[name], shape)
    if set(low) != dynamic or any(len(low[n]) != len(inputs[n]) for n in dynamic):
        return ()
    if all(high[n][i] == 1 for n in dynamic for i, d in enumerate(inputs[n]) if d < 0):
        return ()  # TensorRT's default: 1 for every dynamic dimension
    return (Profile({n: (tuple(int(d) for d in low[n]), tuple(int(d) for d in high[n]),
                         tuple(int(d) for d in high[n])) for n in sorted(dynamic)}, "calibration shapes"),)
