"""Scale tables with provenance, and the files they come from and go to.

* :mod:`.table`: :class:`ScaleEntry` / :class:`ScaleTable` (tensor → amax, axis, kind, source) and
  precedence merging (explicit ``--scales`` file > QAT > the model's own > calibration).
* :mod:`.formats`: TensorRT calibration caches, trt-bridge JSON, onnxruntime calibration tables,
  and the scales of a converted model.
* :mod:`.modelopt`: ModelOpt ``*_quantizer._amax`` buffers mapped onto ONNX tensors by node names.
* :mod:`.fixed_point`: int32 multiplier + shift requantization factors of a converted model.
"""

from trt_bridge.scales.formats import (
    read_json,
    read_ort_table,
    read_scales,
    read_trt_cache,
    scales_of_model,
    write_json,
    write_trt_cache,
)
from trt_bridge.scales.table import ScaleEntry, ScaleTable, merge_by_precedence

__all__ = [
    "ScaleEntry",
    "ScaleTable",
    "merge_by_precedence",
    "read_json",
    "read_ort_table",
    "read_scales",
    "read_trt_cache",
    "scales_of_model",
    "write_json",
    "write_trt_cache",
]
