"""The subcommands of ``trt-bridge``, in the order ``--help`` lists them: name → (module, one-line help).

Each subcommand has two modules: ``<module>_args`` adds its flags (``add_parser``) and imports nothing heavy;
``<module>`` runs it (``run``) and imports onnx, numpy and what else the work needs. The arguments' module is
imported only for the subcommand named on the command line (Polygraphy's tool registry does the same), the
command's only once its arguments are parsed: ``trt-bridge --help`` imports neither, ``trt-bridge convert
--help`` only ``trt_bridge.cli.convert_args`` (no onnx, numpy or onnxruntime).
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


def arguments_module(name: str) -> str:
    """The module whose ``add_parser`` adds subcommand ``name``'s flags (light: what its ``--help`` needs)."""
    return COMMANDS[name][0] + "_args"
