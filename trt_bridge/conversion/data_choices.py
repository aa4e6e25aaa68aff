"""What a conversion that needs activation scales and was given none says: the ways to give them.

A float model (or a quantized one whose activations carry no scale TensorRT can use) converted with ``--int8``
and no ``--calib-data``, ``--calib-random``, ``--scales FILE`` or ``--qat`` would otherwise be written in float
under the name the user asked for. It is refused once lifted (lifting is what tells a float model from a
quantized one, whatever quantizer wrote it), before placement, calibration or any write, with the model's
inputs (what the data must hold) and the MatMuls ``--activations dynamic`` would take without data.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto

from trt_bridge.calibrate.feeds import model_inputs

#: a dynamic source's MatMuls the plugin takes (DynamicGemmPlugin, FusedDynamicGemmPlugin)
DYNAMIC_MATMULS = ("MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat")
FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16)


def plugin_matmuls(model: onnx.ModelProto) -> int:
    """How many MatMuls ``--activations dynamic`` would quantize per inference: float ones with a constant 2-D
    float weight (:class:`trt_bridge.lift.float_gemm_plugin.FloatGemmPlugin`) and a dynamic source's integer
    MatMuls with a constant weight (a source has one kind or the other)."""
    constants = {i.name: (i.data_type, len(i.dims)) for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    constants[node.output[0]] = (attr.t.data_type, len(attr.t.dims))
    count = 0
    for node in model.graph.node:
        if len(node.input) < 2 or node.input[1] not in constants:
            continue
        dtype, rank = constants[node.input[1]]
        if node.op_type in DYNAMIC_MATMULS:
            count += 1
        elif node.op_type == "MatMul" and rank == 2 and dtype in FLOAT_TYPES:
            count += 1
    return count


def input_text(model: onnx.ModelProto) -> str:
    """The model's inputs as the calibration data must hold them: "'x' float32 [N, 3, 224, 224], ..."."""
    specs = model_inputs(model)
    return ", ".join(f"'{s.name}' {s.dtype} {s.shape_text()}" for s in specs) or "none (the model takes no input)"


def choices(model: onnx.ModelProto, offer_dynamic: bool = True) -> str:
    """The ways to give activation scales, for the end of an error message (``offer_dynamic``: name
    ``--activations dynamic`` where it would take MatMuls; False where it is the mode already)."""
    matmuls = plugin_matmuls(model) if offer_dynamic else 0
    dynamic = (f"; or --activations dynamic, which quantizes its {matmuls} MatMul(s) with a constant weight on "
               "their range in each inference, without data (the rest stays float)") if matmuls else ""
    return ("Pass --calib-data with representative inputs (an .npz keyed by input name, a folder of .npz/.npy "
            f"feeds, or loader.py:function; the model's inputs: {input_text(model)}); or --scales FILE (a TensorRT "
            f"calibration cache, a trt-bridge JSON table or an onnxruntime calibration table){dynamic}. "
            "--calib-random N calibrates on noise: a smoke test only, its scales are poor.")


def float_model_message(path: str | Path, choices_text: str) -> str:
    """A float model with no scale source: refused before calibration, placement or anything is written."""
    return (f"{path}: nothing in this model is quantized, so --int8 needs activation scales, and no calibration "
            f"data or scale file was given; nothing was written. {choices_text}")


def missing_scales_message(path: str | Path, needed: list[str], choices_text: str, dynamic_mode: bool,
                           runtime_off: bool, any_dynamic: bool, declined: dict[str, str], scale_files: bool) -> str:
    """The error of activations that need a scale where no calibration data was given: ``needed`` (the
    activations), ``declined`` (why a runtime range could not take one), ``scale_files``: scale files were given
    (and named none of them)."""
    dynamic = (" --activations dynamic puts only MatMuls into its plugin (onnxruntime's dynamically "
               "quantized ones, or a float model's); these stay static INT8.") if dynamic_mode else ""
    if runtime_off and any_dynamic:
        dynamic += " Without --runtime-ranges off, the dynamic ones could keep a range per inference."
    elif needed[0] in declined:
        dynamic += f" '{needed[0]}' cannot have a runtime range: {declined[needed[0]]}."
    return (f"{path}: {len(needed)} activation(s) (e.g. '{needed[0]}') have no static scale in the model (dynamic "
            "quantization computes them at run time; block floating point has none TensorRT can use), "
            + ("and the scale file(s) give them none" if scale_files else
               "and no calibration data or scale file was given")
            + f"; nothing was written.{dynamic} " + choices_text)
