"""The subcommands of ``trt-bridge``, in the order ``--help`` lists them: name → (module, one-line help).

A subcommand's module is imported only when that command runs or its own ``--help`` is asked for (Polygraphy's
tool registry does the same), so ``trt-bridge --help`` imports none of them: no onnx, numpy or onnxruntime.
"""

from __future__ import annotations

COMMANDS: dict[str, tuple[str, str]] = {
    "convert": ("trt_bridge.cli.convert", "rewrite a quantized model into TensorRT-ready INT8 Q/DQ"),
    "check": ("trt_bridge.cli.check", "say why TensorRT would reject a model and what convert will do"),
    "verify": ("trt_bridge.cli.verify", "compare a converted model (and engine) against a reference"),
    "build": ("trt_bridge.cli.build", "build a TensorRT engine (and its sidecar JSON) from an ONNX model"),
    "bench": ("trt_bridge.cli.bench", "time engines and ONNX models side by side"),
    "pipeline": ("trt_bridge.cli.pipeline", "convert, check, build, verify and bench every model of a manifest"),
    "scales": ("trt_bridge.cli.scales", "export a converted model's scales (TensorRT cache, JSON, fixed point)"),
}


def help_of(name: str) -> str:
    """The one-line help of subcommand ``name`` (what each module's parser and ``--help`` say)."""
    return COMMANDS[name][1]
