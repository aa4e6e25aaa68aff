"""The largest magnitude every float tensor reaches on the calibration feeds, for ``--high-precision fp16``.

:func:`trt_bridge.lower.precision.to_float16` keeps in float32 every node that reads or writes a tensor
beyond float16's safe range; this finds those ranges with one onnxruntime pass over the lifted float model.
"""

from __future__ import annotations

import onnx

from trt_bridge.calibrate.observers import CalibMethod, RangeObserver
from trt_bridge.calibrate.session import CalibrationSession
from trt_bridge.ir.types import FLOAT_TYPES


def observed_ranges(lifted: onnx.ModelProto, feeds, progress: bool) -> dict[str, float]:
    """The largest magnitude of every float tensor of ``lifted`` on ``feeds`` (one onnxruntime pass)."""
    floats = {v.name for v in lifted.graph.value_info if v.type.tensor_type.elem_type in FLOAT_TYPES}
    names = sorted({o for n in lifted.graph.node for o in n.output if o in floats})
    if not names:
        return {}
    observers = {t: RangeObserver(CalibMethod.MAX) for t in names}
    with CalibrationSession(lifted, names) as session:
        session.run(observers, feeds, progress, desc="ranges for float16")
    return {t: o.max for t, o in observers.items()}
