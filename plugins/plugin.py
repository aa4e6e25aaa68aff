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

from trt_bridge.ir.dynamic_gemm import OP_TYPE, PLUGIN_NAMESPACE, PLUGIN_VERSION, InvalidGemmNode, gemm_weights

log = logging.getLogger("trt_bridge.plugins")

#: the plugin's fields: name -> numpy type (the granularity is a NUL-terminated string of CHARs)
FIELDS = {"weight": np.int8, "out_features": np.int32, "weight_zero_point": np.int32, "weight_scale": np.float32,
          "bias": np.float32, "granularity": np.int8}


class PluginFieldError(ValueError):
    """A DynamicInt8Gemm node's attributes do not describe a GEMM (raised inside TensorRT's callbacks)."""


#: what plugins found wrong while TensorRT built an engine (TensorRT-RTX's callbacks must not raise: an
#: exception in configure_plugin corrupts its heap); the builder takes them with :func:`take_build_problems`
_BUILD_PROBLEMS: list[str] = []


def take_build_problems() -> list[str]:
    """What the plugins found wrong since the last call (and forget it)."""
    found = list(_BUILD_PROBLEMS)
    _BUILD_PROBLEMS.clear()
    return found


def weights_from_fields(fields) -> dict:
    """The plugin's weights from TensorRT's plugin fields (a PluginFieldCollection or (name, array) pairs),
    checked as the ONNX node's are (:func:`trt_bridge.ir.dynamic_gemm.gemm_weights`)."""
    got = {}
    for f in fields:
        name, data = (f.name, f.data) if hasattr(f, "name") else f
        if name in FIELDS:
            got[name] = np.array(data, dtype=FIELDS[name]).reshape(-1)
    if "granularity" in got:
        got["granularity"] = bytes(got["granularity"].astype(np.uint8)).split(b"\0")[0].decode(errors="replace")
    try:
        return gemm_weights(got)
    except InvalidGemmNode as exc:
        raise PluginFieldError(str(exc)) from None


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
            if k >= 0 and k != self.weights["k"]:  # not raised: see _BUILD_PROBLEMS
                _BUILD_PROBLEMS.append(f"a {OP_TYPE} node's input has {k} features, its weight {self.weights['k']} "
                                       "rows (`trt-bridge check` names the node)")

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
                for name, dtype in FIELDS.items()])

        def create_plugin(self, name, fields, phase):
            try:
                return DynamicInt8GemmPlugin(weights_from_fields(fields), phase)
            except PluginFieldError as exc:
                log.error("%s '%s': %s", OP_TYPE, name, exc)  # TensorRT reports the node as not created
                return None

    return DynamicInt8GemmPlugin, DynamicInt8GemmCreator
