"""What ``trt-bridge check`` reports: typed findings, one per node, and the report around them."""

from __future__ import annotations

import enum
import json
from dataclasses import asdict, dataclass, field

from trt_bridge.lower.layer_precisions import precision_line, quantized_precision
from trt_bridge.tensorrt.costs import EngineCosts
from trt_bridge.tensorrt.parse import ParserError
from trt_bridge.tensorrt.target import headline_note

#: what convert does about the parser's errors on a model ``trt-bridge build`` is given (by their rule)
PARSER_FIXES = {"no-importer": "lifted by `trt-bridge convert` (`trt-bridge check` says how)",
                "tensorrt-parser": "`trt-bridge check` says whether convert fixes it",
                "tensorrt-crash": "`trt-bridge check` says whether convert fixes it"}

#: the findings that say TensorRT's builder refused the model (every one a blocker)
BUILD_RULES = ("tensorrt-build", "tensorrt-profile")

#: in a fix that only works with calibration data (an activation whose source carries no scale TensorRT can use)
NEEDS_DATA = "needs --calib-data"


class Severity(str, enum.Enum):
    BLOCKER = "blocker"  # TensorRT does not build the model as INT8 while this stays
    WARNING = "warning"  # TensorRT builds it, but not everywhere or not as the user may expect


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str  # 'float32', 'uint8', ... ('?' when unknown)
    shape: list[int | str] | None  # None: unknown rank; str: a symbolic or unknown dimension

    def text(self) -> str:
        shape = "?" if self.shape is None else "[" + ", ".join(str(d) for d in self.shape) + "]"
        return f"'{self.name}' {self.dtype} {shape}"


@dataclass
class Finding:
    rule: str  # stable id, e.g. 'no-importer', 'qdq-zero-point', 'type-mismatch'
    severity: Severity
    node: str  # '' for a finding about the whole model
    op: str
    tensors: list[TensorInfo]
    why: str  # why TensorRT rejects it
    fix: str  # what `trt-bridge convert` does about it ('' when it cannot)
    fixable: bool
    tensorrt: str | None = None  # TensorRT's own parser message for this node, when a parser ran

    @property
    def where(self) -> str:
        """``Op 'node'``, or ``model`` for a finding about the whole model (never an empty name)."""
        if self.node:
            return f"{self.op} '{self.node}'" if self.op else f"'{self.node}'"
        return f"{self.op} (unnamed)" if self.op else "model"

    def lines(self) -> list[str]:
        out = [f"[{self.rule}] {self.where}: {self.why}"]
        if self.tensors:
            out.append("    tensors: " + ", ".join(t.text() for t in self.tensors))
        if self.tensorrt:
            out.append(f"    TensorRT: {self.tensorrt}")
        out.append(f"    convert: {self.fix}" if self.fixable else f"    convert cannot fix this: {self.fix}")
        return out


@dataclass(frozen=True)
class ParserRun:
    """What TensorRT's ONNX parser said about the model."""

    module: str  # 'tensorrt' or 'tensorrt_rtx'
    version: str
    ok: bool
    errors: int
    layers: int
    crash: str | None = None  # the parser killed its process: "SIGFPE on RotaryEmbedding 'rope_q'" (None: it did not)


@dataclass
class CheckReport:
    model: str
    opset: int
    int8: bool  # the model carries TensorRT-style INT8 quantization (Q/DQ or integer ops)
    findings: list[Finding] = field(default_factory=list)
    parser: ParserRun | None = None  # None: no TensorRT parser ran (--trt off, or none installed)
    seconds: float = 0.0
    precisions: dict | None = None  # layers by the precision TensorRT runs them in (precision.layer_precisions)
    #: what the engine costs on the target (an ahead-of-time build, tensorrt.costs.EngineCosts); None: not measured
    costs: EngineCosts | None = None
    #: the layers as each builder runs them (checks.targets.builder_views: datacenter TensorRT, and TensorRT-RTX
    #: unless datacenter TensorRT is the one here; each marked ``used`` when its parser ran); None: not read
    builders: list[dict] | None = None
    #: TensorRT's dynamic FP4 activations (checks.nvfp4.fp4_activations: how many, the first nodes, where they run);
    #: None: the model has none
    fp4_activations: dict | None = None

    @property
    def blockers(self) -> list[Finding]:
        return [f for f in self.findings if f.severity is Severity.BLOCKER]

    @property
    def ready(self) -> bool:
        """TensorRT builds this model as INT8: no blocker, and something is quantized."""
        return self.int8 and not self.blockers

    def __bool__(self) -> bool:
        return self.ready

    def to_dict(self) -> dict:
        data = asdict(self)
        data["ready"] = self.ready
        return data

    def rename(self, old, new) -> None:
        """Name ``new`` wherever the report names the file ``old`` (convert checks its output where it is staged,
        before renaming it into place)."""
        old, new = str(old), str(new)
        self.model = self.model.replace(old, new)
        for finding in self.findings:
            finding.why, finding.fix = finding.why.replace(old, new), finding.fix.replace(old, new)
            if finding.tensorrt:
                finding.tensorrt = finding.tensorrt.replace(old, new)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=_json_default)

    def headline(self) -> str:
        blockers, warnings = len(self.blockers), len(self.findings) - len(self.blockers)
        counts = f"{blockers} blocker(s), {warnings} warning(s)"
        if self.ready:
            state = f"TensorRT-ready {quantized_precision(self.precisions)}"
        elif not self.int8 and blockers == 1:
            state = "not INT8"
        else:
            state = "not TensorRT-ready"
        parser = "static rules only"
        if self.parser is not None:
            said = "ok" if self.parser.ok else f"crashed ({self.parser.crash})" if self.parser.crash else "rejects it"
            parser = f"{self.parser.module} {self.parser.version} parser: {said}"
            failed = [f for f in self.findings if f.rule in BUILD_RULES]
            if failed:  # the headline says what the builder said, not only the parser
                parser += f", builder: {'fails' if failed[0].rule == 'tensorrt-build' else 'fails for a profile'}"
            elif self.costs is not None:
                parser += f", builder: builds for {self.costs.target.split(',')[0]}"
            elif any(f.rule == "tensorrt-profiles-apart" for f in self.findings):
                parser += ", builder: builds each profile alone"
        notes = [note for view in self.builders or () if view["used"] and (note := headline_note(view))]
        return f"{self.model}: {state} ({counts}; {parser})" + "".join(f"; {note}" for note in notes)

    def summary(self) -> str:
        lines = [self.headline()]
        for finding in self.findings:
            lines.extend("  " + line for line in finding.lines())
        unfixable = [f for f in self.blockers if not f.fixable]
        if self.blockers and not unfixable:
            data = any(NEEDS_DATA in f.fix for f in self.blockers)
            lines.append("  every blocker is fixed by `trt-bridge convert`" + (" with --calib-data" if data else ""))
        elif unfixable:
            lines.append(f"  {len(unfixable)} blocker(s) `trt-bridge convert` cannot fix (see above)")
        if self.precisions is not None:
            lines.append("  " + precision_line(self.precisions))
        if self.fp4_activations:
            lines.append("  " + self.fp4_activations["line"])
        for view in [v for v in self.builders or () if v["quantized_layers"]]:  # float layers: as the model asks
            lines.append("  " + view["line"])
            if view["alternatives"]:
                lines.append("  warning: " + view["alternatives"])
        if self.costs is not None:
            lines.append(f"  costs ({self.costs.target}): {self.costs.text()}")
        return "\n".join(lines)


def parser_findings(errors: list[ParserError]) -> list[Finding]:
    """``check``'s findings for the errors of TensorRT's parser on a model it rejects (one per node), as
    :class:`~trt_bridge.tensorrt.build.ModelRejectedError` carries them: the ops convert lifts are fixable."""
    return [Finding(e.rule, Severity.BLOCKER, e.node, e.op, [], e.text, PARSER_FIXES[e.rule], e.rule == "no-importer",
                    e.text) for e in errors]


def findings_json(findings: list[Finding]) -> list[dict]:
    """``check``'s JSON form of ``findings``."""
    return json.loads(json.dumps([asdict(f) for f in findings], default=_json_default))


def _json_default(obj):  # asdict turned nested dataclasses into dicts already: enums remain
    return obj.value if isinstance(obj, enum.Enum) else str(obj)
