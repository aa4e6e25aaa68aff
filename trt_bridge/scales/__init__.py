"""Scale tables with provenance, and the files they come from and go to.

* :mod:`.table`: :class:`ScaleEntry` / :class:`ScaleTable` (tensor → amax, axis, kind, source) and
  precedence merging (explicit ``--scales`` file > QAT > the model's own > calibration).
* :mod:`.formats`: a scale file of any format below, recognized by its content (``--scales FILE``);
  :mod:`.files`: reading and writing those files safely.
* one module per format: :mod:`.trt_cache` (TensorRT calibration caches), :mod:`.json_table`
  (trt-bridge JSON), :mod:`.ort_table` (onnxruntime calibration tables), :mod:`.aimet` (AIMET
  encodings), :mod:`.modelopt` (ModelOpt ``*_quantizer._amax`` buffers mapped onto ONNX tensors by
  node names), :mod:`.qat` (a QAT Q/DQ export matched onto the model; :mod:`.qat_graph` reads its graph).
* :mod:`.model_scales`: the scales of a converted model.
* :mod:`.fixed_point`: int32 multiplier + shift requantization factors of a converted model.
* :mod:`.apply`: imported scales laid over a conversion's annotations, and checked against data.
"""

from trt_bridge.scales.formats import read_scales
from trt_bridge.scales.json_table import read_json, write_json
from trt_bridge.scales.model_scales import scales_of_model
from trt_bridge.scales.ort_table import read_ort_table
from trt_bridge.scales.table import ScaleEntry, ScaleTable, merge_by_precedence
from trt_bridge.scales.trt_cache import read_trt_cache, write_trt_cache

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
