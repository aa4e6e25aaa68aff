"""TensorRT's side of ``DynamicInt8Gemm`` (:mod:`trt_bridge.ir.dynamic_gemm`): an ``IPluginV3`` with the core,
build and runtime capabilities, and its ``IPluginCreatorV3One``.

The classes are made per TensorRT module (:func:`plugin_classes`), since their bases come from it: the same
code serves ``tensorrt`` and ``tensorrt_rtx``. Building needs no GPU: shapes, types, formats, the workspace
and the serialized fields are plain Python. Running (``enqueue``) launches the kernels of
:mod:`trt_bridge.plugins.kernels` (compiled by NVRTC for the GPU at hand) on TensorRT's stream, with the
weights copied to the GPU once per execution context.

The weights travel as plugin fields: TensorRT's ONNX parser hands the node's tensor attributes to
``create_plugin`` (an int8 tensor as an INT8 field), and the engine keeps what
``get_fields_to_serialize`` returns.
"""

from __future__ import annotations

import functools
import logging
from types import ModuleType

import numpy as np
from trt_bridge.plugins import kernels

from trt_bridge.ir.dynamic_gemm import GRANULARITIES, OP_TYPE, PLUGIN_NAMESPACE, PLUGIN_VERSION

log = logging.getLogger("trt_bridge.plugins")

#: the plugin's fields: name -> (numpy type, required)
FIELDS = {"weight": (np.int8, True), "out_features": (np.int32, True), "weight_zero_point": (np.int32, True),
          "weight_scale": (np.float32, True), "bias": (np.float32, False), "granularity": (np.int8, True)}


class PluginFieldError(ValueError):
    """A DynamicInt8Gemm node's attributes do not describe a GEMM (raised inside TensorRT's callbacks)."""


def weights_from_fields(fields) -> dict:
    """The plugin's weights from TensorRT's plugin fields (a PluginFieldCollection or (name, array) pairs),
    checked: weight int8 [K·N], zero point and scale [1] or [N], bias [N], granularity tensor|token."""
    got = {}
    for f in fields:
        name, data = (f.name, f.data) if hasattr(f, "name") else f
        if name in FIELDS:
            got[name] = np.array(data, dtype=FIELDS[name][0]).reshape(-1)
    missing = [name for name, (_, required) in FIELDS.items() if required and name not in got]
    if missing:
        raise PluginFieldError(f"{OP_TYPE}: missing attribute(s) {', '.join(missing)}")
    granularity = bytes(got.pop("granularity").astype(np.uint8)).split(b"\0")[0].decode()
    if granularity not in GRANULARITIES:
        raise PluginFieldError(f"{OP_TYPE}: granularity {granularity!r} is not one of {', '.join(GRANULARITIES)}")
    scale, zero_point, bias = got["weight_scale"], got["weight_zero_point"], got.get("bias")
    n = int(got["out_features"][0]) if got["out_features"].size == 1 else 0
    if n <= 0 or got["weight"].size % n or any(v.size not in (1, n) for v in (scale, zero_point)) \
            or (bias is not None and bias.size != n):
        raise PluginFieldError(f"{OP_TYPE}: a weight of {got['weight'].size} values, out_features {n}, scale "
                               f"[{scale.size}], zero point [{zero_point.size}] and bias do not describe one [K, N] "
                               "matrix")
    if not np.all(np.isfinite(scale)) or np.any(scale <= 0) or (bias is not None and not np.all(np.isfinite(bias))):
        raise PluginFieldError(f"{OP_TYPE}: weight scales must be finite and positive, the bias finite")
    if zero_point.min() < -128 or zero_point.max() > 127:
        raise PluginFieldError(f"{OP_TYPE}: weight zero points must be int8 values")
    k = got["weight"].size // n
    return {"weight": got["weight"].reshape(k, n), "weight_zero_point": zero_point, "weight_scale": scale,
            "bias": bias, "granularity": granularity, "k": k, "n": n}


@functools.cache
def plugin_classes(trt: ModuleType) -> tuple[type, type]:
    """``(DynamicInt8GemmPlugin, DynamicInt8GemmCreator)`` for the TensorRT module ``trt``."""

    class DynamicInt8GemmPlugin(trt.IPluginV3, trt.IPluginV3OneCore, trt.IPluginV3OneBuild,
                                trt.IPluginV3OneRuntime):
        def __init__(self, weights: dict, phase=None):
            trt.IPluginV3.__init__(self)
            trt.IPluginV3OneCore.__init__(self)
            trt.IPluginV3OneBuild.__init__(self)
            trt.IPluginV3OneRuntime.__init__(self)
            self.plugin_name, self.plugin_namespace, self.plugin_version = OP_TYPE, PLUGIN_NAMESPACE, PLUGIN_VERSION
            self.num_outputs = 1
            self.timing_cache_id = ""
            self.weights, self.phase = weights, phase
            self.rows = 0
            self._device = None  # the weights on the GPU (kernels.DeviceWeights), made at the first enqueue
            self._kernels = None

        # core and build capabilities: no GPU needed
        def get_capability_interface(self, kind):
            return self

        def clone(self):
            return DynamicInt8GemmPlugin(self.weights, self.phase)

        def get_output_data_types(self, input_types):
            return [input_types[0]]

        def get_output_shapes(self, inputs, shape_inputs, expr_builder):
            dims = trt.DimsExprs(inputs[0])
            dims[len(dims) - 1] = expr_builder.constant(self.weights["n"])
            return [dims]

        def supports_format_combination(self, pos, in_out, num_inputs):
            desc = in_out[pos].desc
            if desc.format != trt.TensorFormat.LINEAR:
                return False
            if pos == 0:
                return desc.type in (trt.DataType.FLOAT, trt.DataType.HALF)
            return desc.type == in_out[0].desc.type

        def configure_plugin(self, inputs, outputs):
            k = inputs[0].desc.dims[len(inputs[0].desc.dims) - 1]
            if k >= 0 and k != self.weights["k"]:  # logged, not raised: an exception here corrupts TensorRT-RTX
                log.error("%s: the input's last dimension is %d, the weight has K = %d (`trt-bridge check` "
                          "names the node)", OP_TYPE, k, self.weights["k"])

        def get_workspace_size(self, inputs, outputs):
            dims = inputs[0].max
            rows = int(np.prod([max(int(d), 1) for d in list(dims)[:-1]], dtype=np.int64))
            return kernels.workspace_size(rows, self.weights["k"], self.weights["granularity"])

        def get_valid_tactics(self):
            return []

        def set_tactic(self, tactic):
            pass

        def get_fields_to_serialize(self):
            w = self.weights
            fields = [trt.PluginField("weight", w["weight"].reshape(-1), trt.PluginFieldType.INT8),
                      trt.PluginField("out_features", np.array([w["n"]], np.int32), trt.PluginFieldType.INT32),
                      trt.PluginField("weight_zero_point", w["weight_zero_point"], trt.PluginFieldType.INT32),
                      trt.PluginField("weight_scale", w["weight_scale"], trt.PluginFieldType.FLOAT32),
                      trt.PluginField("granularity", np.frombuffer(w["granularity"].encode() + b"\0", np.int8),
                                      trt.PluginFieldType.CHAR)]
            if w["bias"] is not None:
                fields.append(trt.PluginField("bias", w["bias"], trt.PluginFieldType.FLOAT32))
            return trt.PluginFieldCollection(fields)

        # runtime capability: the kernels
        def on_shape_change(self, inputs, outputs):
            dims = list(inputs[0].dims)
            self.rows = int(np.prod(dims[:-1], dtype=np.int64))

        def attach_to_context(self, context):
            return self.clone()

        def enqueue(self, input_desc, output_desc, inputs, outputs, workspace, stream):
            if self._device is None:
                w = self.weights
                self._kernels = kernels.GemmKernels()
                n = w["n"]
                packed = kernels.pack_weights(w["weight"], np.broadcast_to(w["weight_zero_point"], (n,)).copy())
                self._device = self._kernels.upload(packed, np.broadcast_to(w["weight_scale"], (n,)).copy(),
                                                    w["bias"])
            half = input_desc[0].type == trt.DataType.HALF
            self._kernels.run(int(stream), int(inputs[0]), half, self.rows, self._device,
                              self.weights["granularity"], int(outputs[0]), int(workspace))

        def destroy(self):
            if self._device is not None:
                self._device.close()
                self._device = None

    class DynamicInt8GemmCreator(trt.IPluginCreatorV3One):
        def __init__(self):
            trt.IPluginCreatorV3One.__init__(self)
            self.name, self.plugin_namespace, self.plugin_version = OP_TYPE, PLUGIN_NAMESPACE, PLUGIN_VERSION
            types = {np.int8: trt.PluginFieldType.INT8, np.int32: trt.PluginFieldType.INT32,
                     np.float32: trt.PluginFieldType.FLOAT32}
            self.field_names = trt.PluginFieldCollection([
                trt.PluginField(name, np.array([]),
                                trt.PluginFieldType.CHAR if name == "granularity" else types[dtype])
                for name, (dtype, _) in FIELDS.items()])

        def create_plugin(self, name, fields, phase):
            try:
                return DynamicInt8GemmPlugin(weights_from_fields(fields), phase)
            except PluginFieldError as exc:
                log.error("%s '%s': %s", OP_TYPE, name, exc)  # TensorRT reports the node as not created
                return None

    return DynamicInt8GemmPlugin, DynamicInt8GemmCreator
