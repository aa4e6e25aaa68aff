"""What ``bench`` measured: one row per model, and the plain, markdown and JSON forms of the table."""

from __future__ import annotations

import json
import os
import platform
from dataclasses import asdict, dataclass, field
from typing import Any

from trt_bridge.bench.stats import LatencyStats
from trt_bridge.tensorrt.costs import EngineCosts

#: (header, LatencyStats field) of the latency columns, in milliseconds
LATENCY = (("median", "median"), ("mean", "mean"), ("min", "min"), ("max", "max"), ("p90", "p90"),
           ("p95", "p95"), ("p99", "p99"))
#: under the table when a quantized ONNX model ran on onnxruntime's CPU provider
CPU_CAVEAT = ("onnxruntime's CPU provider runs quantized (Q/DQ) models as simulated integer math on the CPU, so their "
              "latency here is no estimate of a TensorRT engine's (INT8, FP8: FP8 Q/DQ run unfused in float): build an "
              "engine (trt-bridge build) and bench it on the GPU")
RATIO_MEANING = "speed-up = the first row's median latency / this row's (above 1: faster than the first row)"


@dataclass
class BenchRow:
    path: str
    kind: str  # "engine" | "onnx"
    backend: str  # "onnxruntime CPU", "TensorRT 10.13.0 (cuda graph)", ...
    stats: LatencyStats
    #: speed-up versus the first row: first row's median / this row's median (1.0 for the first row;
    #: above 1 means faster than the first row). None when this row's median is 0.
    ratio: float | None = 1.0
    inputs: dict[str, list[int]] = field(default_factory=dict)  # the shapes that ran
    feed: str = ""  # where the input data came from
    cuda_graph: bool | None = None  # engines: whether the timed runs launched a CUDA graph
    note: str | None = None  # e.g. why no CUDA graph was used
    simulated: bool = False  # a quantized ONNX model on onnxruntime's CPU provider (see CPU_CAVEAT)
    costs: EngineCosts | None = None  # ONNX rows: the engine an ahead-of-time build makes of the model


@dataclass
class Machine:
    cpu: str
    cores: int | None
    gpu: str | None = None
    onnxruntime: str | None = None
    tensorrt: str | None = None  # "TensorRT 10.13.0" / "TensorRT-RTX 1.7.1" when an engine ran
    python: str = field(default_factory=platform.python_version)

    @classmethod
    def here(cls, gpu: str | None = None, tensorrt: str | None = None) -> Machine:
        return cls(cpu=cpu_name(), cores=os.cpu_count(), gpu=gpu, onnxruntime=_version("onnxruntime",
                                                                                      "onnxruntime-gpu"),
                   tensorrt=tensorrt)

    def line(self) -> str:
        parts = [f"CPU {self.cpu} ({self.cores} cores)" if self.cores else f"CPU {self.cpu}"]
        if self.gpu:
            parts.append(f"GPU {self.gpu}")
        if self.onnxruntime:
            parts.append(f"onnxruntime {self.onnxruntime}")
        if self.tensorrt:
            parts.append(self.tensorrt)
        return ", ".join(parts)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _version(*distributions: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    for name in distributions:
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


@dataclass
class BenchReport:
    rows: list[BenchRow]
    options: Any  # BenchOptions
    machine: Machine

    def __bool__(self) -> bool:
        return bool(self.rows)

    @property
    def notes(self) -> list[str]:
        """What the numbers do not mean, printed under the table."""
        return [CPU_CAVEAT] if any(r.simulated for r in self.rows) else []

    def to_dict(self) -> dict:
        return {"rows": [asdict(r) for r in self.rows], "options": asdict(self.options),
                "machine": asdict(self.machine), "ratio": RATIO_MEANING, "notes": self.notes}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=False)

    def _header(self) -> str:
        o = self.options
        runs = f"at least {o.iterations} iterations" + (f" and {o.duration:g} s" if o.duration else "")
        feeds = f"first feed of {o.data}" if o.data else f"random inputs (seed {o.seed})"
        text = f"{runs} after {o.warmup} warm-up, {feeds}; "
        if any(r.kind == "engine" for r in self.rows) or o.provider != "cpu":
            text += f"host↔device copies {'included' if o.transfers == 'include' else 'excluded'}; "
        return text + self.machine.line()

    def _cells(self, row: BenchRow, number) -> list[str]:
        s = row.stats
        ratio = "n/a" if row.ratio is None else f"{row.ratio:.2f}x"
        return [*(number(getattr(s, attr)) for _, attr in LATENCY), f"{s.throughput:.1f}", str(s.iterations), ratio]

    def summary(self) -> str:
        """A plain-text table for the terminal, with where the inputs came from and any fallback below it."""
        headers = ["model", "backend", *(f"{h} ms" for h, _ in LATENCY), "inf/s", "runs", "speed-up"]
        body = [[r.path, r.backend, *self._cells(r, _ms)] for r in self.rows]
        widths = [max(len(x) for x in column) for column in zip(headers, *body)]

        def line(cells):
            return "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

        lines = [f"bench: {self._header()}", line(headers).rstrip()]
        lines += [line(cells).rstrip() for cells in body]
        for r in self.rows:
            shapes = ", ".join(f"{name}{shape}" for name, shape in r.inputs.items()) or "no inputs"
            lines.append(f"  {r.path}: {shapes} from {r.feed}" + (f"; {r.note}" if r.note else "")
                         + (f"; TensorRT {r.costs.text()} ({r.costs.target})" if r.costs else ""))
        lines.append(f"  ({RATIO_MEANING})")
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)

    def table(self) -> str:
        """Only the table of :meth:`summary` (for ``--quiet``)."""
        return "\n".join(self.summary().splitlines()[1:2 + len(self.rows)])

    def markdown(self) -> str:
        """A GitHub-flavoured markdown table (CI job summaries), with one line of context under it."""
        headers = ["model", "kind", "backend", "inputs", *(f"{h} (ms)" for h, _ in LATENCY),
                   "throughput (inf/s)", "iterations", "speed-up vs first"]
        lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" if i < 4 else "---:"
                                                                    for i in range(len(headers))) + "|"]
        for r in self.rows:
            inputs = "<br>".join(f"{name} {'x'.join(map(str, shape))}" for name, shape in r.inputs.items())
            cells = [f"`{r.path}`", r.kind, r.backend, inputs or "-", *self._cells(r, _ms)]
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        lines += ["", f"{self._header()}. {RATIO_MEANING}."]
        lines += [f"Note: {note}." for note in self.notes]
        return "\n".join(lines) + "\n"


def _ms(value: float) -> str:
    return f"{value:.3f}" if value < 100 else f"{value:.1f}"
