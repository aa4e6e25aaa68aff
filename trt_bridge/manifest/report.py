"""The pipeline's report: a result per model × step × target, and its forms for CI: JSON, JUnit XML (one test case
per step) and a markdown summary."""

from __future__ import annotations

import enum
import json
import math
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field

from trt_bridge.verification.metrics import json_safe


class Status(str, enum.Enum):
    PASSED = "passed"
    FAILED = "failed"  # a gate or a check did not pass
    ERROR = "error"  # the step could not run (the model, the data, the tool)
    SKIPPED = "skipped"  # this machine cannot do it, or a step it needs did not pass


@dataclass
class StepResult:
    model: str
    target: str | None
    step: str  # convert | check | verify | bench | build | verify-engine | bench-engine
    status: Status
    seconds: float = 0.0
    message: str = ""  # one line: what happened, or why it was skipped or failed
    details: dict = field(default_factory=dict)  # the step's own report, as JSON data
    artifacts: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.step if self.target is None else f"{self.step} [{self.target}]"


@dataclass
class PipelineReport:
    manifest: str
    output: str
    steps: list[StepResult] = field(default_factory=list)
    machine: dict = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return not any(s.status in (Status.FAILED, Status.ERROR) for s in self.steps)

    def __bool__(self) -> bool:
        return self.passed

    def counts(self) -> dict[str, int]:
        return {status.value: sum(1 for s in self.steps if s.status is status) for status in Status}

    def to_json(self) -> str:
        data = json_safe(asdict(self))
        data["passed"], data["counts"] = self.passed, self.counts()
        return json.dumps(data, indent=2, default=str, allow_nan=False)

    def summary(self) -> str:
        counts = self.counts()
        lines = [f"pipeline {self.manifest}: {'PASS' if self.passed else 'FAIL'} "
                 f"({', '.join(f'{v} {k}' for k, v in counts.items() if v)}; {self.seconds:.1f} s)"]
        for s in self.steps:
            lines.append(f"  {s.model:<24} {s.label:<28} {s.status.value:<8} {s.seconds:7.2f} s  {s.message}")
        lines.append(f"  reports: {self.output}/pipeline.junit.xml, pipeline.json, pipeline.md")
        return "\n".join(lines)

    def markdown(self) -> str:
        return markdown(self)

    def junit_xml(self) -> str:
        return junit_xml(self)


def _xml_text(text: str) -> str:
    """``text`` without the characters XML 1.0 cannot hold (control characters from tool output)."""
    return "".join(c for c in str(text) if c in "\t\n\r" or (" " <= c <= "\ud7ff") or ("\ue000" <= c <= "\ufffd")
                   or c >= "\U00010000")


def junit_xml(report: PipelineReport) -> str:
    """JUnit XML as CI systems read it: a testsuite per model, a testcase per step (and target)."""
    counts = report.counts()
    root = ET.Element("testsuites", name="trt-bridge pipeline", tests=str(len(report.steps)),
                      failures=str(counts["failed"]), errors=str(counts["error"]), skipped=str(counts["skipped"]),
                      time=f"{report.seconds:.3f}")
    models: dict[str, list] = {}
    for step in report.steps:
        models.setdefault(step.model, []).append(step)
    for model, steps in models.items():
        suite = ET.SubElement(root, "testsuite", name=_xml_text(model), tests=str(len(steps)),
                              failures=str(sum(s.status is Status.FAILED for s in steps)),
                              errors=str(sum(s.status is Status.ERROR for s in steps)),
                              skipped=str(sum(s.status is Status.SKIPPED for s in steps)),
                              time=f"{sum(s.seconds for s in steps):.3f}")
        for step in steps:
            case = ET.SubElement(suite, "testcase", classname=_xml_text(f"trt-bridge.{model}"),
                                 name=_xml_text(step.label), time=f"{step.seconds:.3f}")
            message = _xml_text(step.message)
            if step.status is Status.FAILED:
                ET.SubElement(case, "failure", message=message, type="gate").text = message
            elif step.status is Status.ERROR:
                ET.SubElement(case, "error", message=message,
                              type="error").text = _xml_text(step.details.get("error", step.message))
            elif step.status is Status.SKIPPED:
                ET.SubElement(case, "skipped", message=message)
            if step.artifacts:
                ET.SubElement(case, "system-out").text = _xml_text("\n".join(step.artifacts))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


ICONS = {Status.PASSED: "✅ passed", Status.FAILED: "❌ failed", Status.ERROR: "💥 error", Status.SKIPPED: "⏭ skipped"}


def _cell(text: str) -> str:
    """Text for a markdown table cell: pipes escaped, on one line, no raw HTML."""
    return (str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")
            .replace("\r", " ").replace("\n", " "))


def _num(value, fmt: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):  # "inf" / "-inf" / "nan" from the JSON form
        return value
    return format(value, fmt) if math.isfinite(value) else str(value)


def markdown(report: PipelineReport) -> str:
    counts = report.counts()
    lines = [f"## trt-bridge pipeline: {'PASS' if report.passed else 'FAIL'}", "",
             f"`{report.manifest}`: " + ", ".join(f"{v} {k}" for k, v in counts.items() if v)
             + f" in {report.seconds:.1f} s. TensorRT: "
             + (f"{report.machine['tensorrt']['module']} {report.machine['tensorrt']['version']}"
                if report.machine.get("tensorrt") else "none")
             + f"; GPU: {'yes' if report.machine.get('gpu') else 'none'}.", "",
             "| model | step | status | seconds | note |", "|---|---|---|---:|---|"]
    for s in report.steps:
        lines.append(f"| {_cell(s.model)} | {_cell(s.label)} | {ICONS[s.status]} | {s.seconds:.2f} | "
                     f"{_cell(s.message)} |")
    accuracy = [s for s in report.steps if s.step in ("verify", "verify-engine") and s.details.get("outputs")]
    if accuracy:
        lines += ["", "### Accuracy", "", "| model | runner | output | SNR (dB) | cosine | top-1 | gates |",
                  "|---|---|---|---:|---:|---:|---|"]
        for s in accuracy:
            for m in s.details["outputs"]:
                top1 = "" if m.get("top1") is None else f"{100 * m['top1']:.1f}%"
                gates = "pass" if not m["failures"] else "FAIL: " + "; ".join(m["failures"])
                lines.append(f"| {_cell(s.model)} | {_cell(m['runner'])} | {_cell(m['output'])} | "
                             f"{_num(m['snr_db'], '.2f')} | {_num(m['cosine'], '.5f')} | {top1} | {_cell(gates)} |")
    latency = [s for s in report.steps if s.step in ("bench", "bench-engine") and s.details.get("rows")]
    if latency:
        lines += ["", "### Latency", "", "| model | file | backend | median (ms) | p99 (ms) | throughput (/s) | "
                  "speed-up |", "|---|---|---|---:|---:|---:|---:|"]
        for s in latency:
            for r in s.details["rows"]:
                st = r["stats"]
                lines.append(f"| {_cell(s.model)} | {_cell(r['path'].rsplit('/', 1)[-1])} | {_cell(r['backend'])} | "
                             f"{_num(st['median'], '.3f')} | {_num(st['p99'], '.3f')} | "
                             f"{_num(st['throughput'], '.1f')} | {_num(r['ratio'], '.2f')} |")
    return "\n".join(lines) + "\n"
