"""What ``check`` asks TensorRT itself: its ONNX parser (in a child process, :func:`probe`: its errors and crashes
attached to the findings of the same node, or findings of their own) and its builder (:func:`measure_costs`: the
engine's costs, or the findings of a build that fails)."""

from __future__ import annotations

import logging
from pathlib import Path

from trt_bridge.checks.findings import CheckReport, Finding, ParserRun, Severity
from trt_bridge.errors import MissingDependencyError
from trt_bridge.ir.model import load_model
from trt_bridge.ir.save import save_model
from trt_bridge.lift.pipeline import lift_model
from trt_bridge.plugins.registry import PluginFileError
from trt_bridge.tensorrt.build import EngineBuildError, ProfileBuildError, ProfilesApartError, engine_costs
from trt_bridge.tensorrt.costs import EngineCosts
from trt_bridge.tensorrt.parse import CRASH, parse
from trt_bridge.tensorrt.profiles import Profile
from trt_bridge.tensorrt.target import UnbuildableTargetError

log = logging.getLogger("trt_bridge.checks")


def probe(path: Path, report: CheckReport, node_names: list[str], nodes: dict, plugins: tuple[str, ...] = ()
           ) -> ParserRun | None:
    """Run TensorRT's parser, attach its messages to the findings; None when no TensorRT is installed. ``nodes``:
    each node's op type and inputs, by name."""
    try:
        result = parse(path, plugins=plugins, isolated=True)
    except MissingDependencyError:
        log.info("no TensorRT parser installed: static rules only")
        return None
    except PluginFileError:  # the user's --plugins file: an error, not a reason to fall back to the static rules
        raise
    except Exception as exc:  # noqa: BLE001 - e.g. datacenter TensorRT on a machine without a GPU
        log.warning("TensorRT's parser could not run (%s: %s); the findings come from the static rules alone",
                    type(exc).__name__, str(exc).strip().splitlines()[0] if str(exc).strip() else "")
        return None
    by_node = {f.node: f for f in report.findings if f.node}
    for error in result.details:
        name = error.node or (node_names[error.index] if 0 <= error.index < len(node_names) else "")
        message = error.text
        finding = by_node.get(name) if name else next((f for f in report.findings if f.rule == "invalid-onnx"), None)
        if error.code == CRASH and (finding is None or finding.rule != "tensorrt-crash"):
            finding = None  # a crash is a finding of its own unless the static rule predicted it
        if finding is not None:
            finding.tensorrt = message if not finding.tensorrt else f"{finding.tensorrt}; {message}"
            continue
        op, inputs = nodes.get(name, ("", []))
        if error.code == CRASH:
            finding = Finding("tensorrt-crash", Severity.BLOCKER, name, error.op or op, inputs,
                              f"{message} (check runs the parser in a child process)",
                              "no trt-bridge rule covers this; please report it with `trt-bridge check --json`",
                              False)
        else:
            finding = Finding("tensorrt-parser", Severity.BLOCKER, name, error.op or op, inputs,
                              "TensorRT's parser rejects it (no static rule of trt-bridge predicted this)",
                              "no trt-bridge rule covers this; please report it with `trt-bridge check --json`",
                              False, message)
        report.findings.append(finding)
        by_node[name] = finding
    unexplained = [f for f in report.findings if f.rule in ("tensorrt-parser", "tensorrt-crash") and not f.fixable]
    if unexplained and _lifted_model_parses(path):
        for finding in unexplained:
            finding.fixable = True
            finding.fix = ("no static rule names it, but convert's lifted model parses past it (checked with "
                           "TensorRT's parser)")
    crash = None
    if result.crash is not None:
        crash = f"{result.crash.signal_name} on {result.crash.op or 'node'} '{result.crash.node}'" \
            if result.crash.node else result.crash.signal_name
    return ParserRun(result.module, result.version, result.ok, len(result.details), result.layers, crash)


def measure_costs(path: Path, compute_capability: str, report: CheckReport, plugins: tuple[str, ...] = (),
                  profiles: tuple[Profile, ...] = ()) -> EngineCosts | None:
    """The engine's costs on the target; a builder failure becomes a ``tensorrt-build`` finding of ``report``
    (TensorRT's parser took the model, its builder did not), or a ``tensorrt-profile`` blocker where it fails for
    some profiles only (naming them and their shapes); None when no builder can run here. (Reports that only show
    costs beside what they measure use :func:`~trt_bridge.tensorrt.build.costs_or_none`.)"""
    try:
        return engine_costs(path, compute_capability, plugins=plugins, profiles=profiles)
    except MissingDependencyError:
        return None
    except UnbuildableTargetError as exc:  # the target runs the model; only this machine cannot build for it
        report.findings.append(Finding(
            "target-not-built", Severity.WARNING, "", "", [],
            f"the installed builder ({exc.builder}) cannot build for compute capability {exc.target} (it builds "
            f"for {', '.join(exc.builds)}): the engine's costs were not measured, and `trt-bridge build` here "
            "cannot make its engine", f"nothing to change: build the engine on the target (datacenter TensorRT on "
            f"a {exc.target} GPU: `trt-bridge build MODEL -o ENGINE` there)", True))
        return None
    except ProfilesApartError as exc:  # every profile builds: one engine each
        report.findings.append(Finding(
            "tensorrt-profiles-apart", Severity.WARNING, "", "", [],
            f"TensorRT's builder builds the profiles {', '.join(repr(n) for n in exc.built)} each alone for compute "
            f"capability {compute_capability}, not together in one engine (the engine's costs were not measured): "
            f"{str(exc).split(' alone but not together in one engine ', 1)[-1].split('; build one engine', 1)[0]}",
            "nothing to change in the model: build one engine per profile (`trt-bridge build MODEL -o ENGINE "
            "--min-shapes/--opt-shapes/--max-shapes` for each)", True))
        return None
    except ProfileBuildError as exc:
        for failed in exc.failed:
            shapes = Profile({n: (tuple(s["min"]), tuple(s["opt"]), tuple(s["max"])) for n, s in
                              failed["shapes"].items()}).text()
            report.findings.append(Finding(
                "tensorrt-profile", Severity.BLOCKER, "", "", [],
                f"TensorRT's builder fails for the profile '{failed['name']}' ({shapes}) for compute capability "
                f"{compute_capability}, and builds {', '.join(repr(n) for n in exc.built)}: {failed['error']}",
                "convert does not change shapes: give the shapes the engine must take (--shapes, --min-shapes/"
                "--opt-shapes/--max-shapes, as `trt-bridge build` takes them), or change the model for that range",
                False))
        return None
    except EngineBuildError as exc:  # ModelRejectedError too: the parser refused what it took in the probe
        message = str(exc).splitlines()[0]
        named = _finding_named_in(message, report.findings)
        if named is not None:  # a static rule predicted it (quantized-constant): the builder's words go there
            text = message.split(" failed: ", 1)[-1]
            named.tensorrt = text if not named.tensorrt else f"{named.tensorrt}; {text}"
            return None
        report.findings.append(Finding(  # a model TensorRT does not build is not ready, whatever else holds
            "tensorrt-build", Severity.BLOCKER, "", "", [], f"TensorRT's parser takes the model, but its builder "
            f"fails for compute capability {compute_capability}: {str(exc).splitlines()[0]}",
            "no rule rewrites what the builder refused: give the shapes the engine must take (--shapes); for an If "
            "TensorRT cannot build (an If or an LSTM's state inside a branch), hold the input it branches on "
            "(convert --constant-inputs NAME=VALUE); else change the model there and report it (`trt-bridge build "
            "-v`)", False))
        return None


def _finding_named_in(message: str, findings: list[Finding]) -> Finding | None:
    """The static finding whose node or one of whose tensors the builder's ``message`` names, in parentheses
    ("Quantized constant (NAME) is only allowed before DQ"), quotes, or as its constant layer's output ("Tensor
    NAME_output has datatype FP8 but is not consumed by ... IDequantizeLayer")."""
    for finding in findings:
        if not finding.node:
            continue
        names = [finding.node, *(t.name for t in finding.tensors)]
        if any(f"({name})" in message or f"'{name}'" in message or f"Tensor {name}_output " in message
               for name in names if name):
            return finding
    return None


def _lifted_model_parses(path: Path) -> bool:
    """Whether TensorRT's parser takes the float model convert lifts ``path`` to (its Q/DQ come after)."""
    import tempfile


    try:
        declared: dict[str, int] = {}
        lifted, _ = lift_model(load_model(path, declared), path, declared=declared)
        with tempfile.TemporaryDirectory(prefix="trt-bridge-check-") as tmp:
            return parse(save_model(lifted, Path(tmp) / "lifted.onnx"), isolated=True).ok
    except Exception:  # noqa: BLE001 - convert cannot lift it: the finding stays "cannot fix"
        return False
