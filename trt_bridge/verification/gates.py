"""Pass/fail gates on output metrics: ``--min-snr 30``, ``--min-snr logits=35``, ``--min-cosine``, ``--max-abs``.

A bare value applies to every output; ``NAME=VALUE`` to that output only, and wins over the
bare value for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trt_bridge.errors import TrtBridgeError
from trt_bridge.verification.metrics import OutputMetrics

#: metric → (flag, whether the bound is a minimum)
METRICS = {"snr_db": ("--min-snr", True), "cosine": ("--min-cosine", True), "max_abs": ("--max-abs", False)}


@dataclass(frozen=True)
class Gate:
    metric: str  # 'snr_db' | 'cosine' | 'max_abs'
    bound: float
    output: str | None = None  # None: every output

    def check(self, m: OutputMetrics) -> str | None:
        """None when ``m`` passes, else what failed."""
        flag, minimum = METRICS[self.metric]
        value = getattr(m, self.metric)
        ok = value >= self.bound if minimum else value <= self.bound  # NaN fails every gate
        if ok:
            return None
        shown = f"{value:.2f} dB" if self.metric == "snr_db" and math.isfinite(value) else f"{value:.6g}"
        return f"{self.metric} {shown} {'<' if minimum else '>'} {flag} {self.bound:g}"


#: the values each gate takes: an SNR of -1000 to 1000 dB, a cosine similarity of -1 to 1, an error of 0 or more
GATE_RANGES = {"snr_db": (-1000.0, 1000.0, "an SNR gate is -1000 to 1000 dB"),
               "cosine": (-1.0, 1.0, "a cosine similarity is -1 to 1"),
               "max_abs": (0.0, math.inf, "a largest absolute error is 0 or more")}


def parse_gates(min_snr: list[str] = (), min_cosine: list[str] = (), max_abs: list[str] = ()) -> list[Gate]:
    """Gates from the CLI's repeated ``[NAME=]VALUE`` flags."""
    gates = []
    for metric, values in (("snr_db", min_snr), ("cosine", min_cosine), ("max_abs", max_abs)):
        for text in values or ():
            name, _, value = text.rpartition("=")
            try:
                bound = float(value)
            except ValueError:
                bound = math.nan
            if not math.isfinite(bound):
                raise TrtBridgeError(f"{METRICS[metric][0]} '{text}': expected VALUE or OUTPUT=VALUE with a finite "
                                     "number, e.g. 30 or logits=30")
            low, high, why = GATE_RANGES[metric]
            if not low <= bound <= high:
                raise TrtBridgeError(f"{METRICS[metric][0]} '{text}': {why}, so no output could pass (or every "
                                     "output would); give a value in that range.")
            gates.append(Gate(metric, bound, name or None))
    return gates


def apply_gates(gates: list[Gate], metrics: list[OutputMetrics]) -> None:
    """Fill in each output's failures (in place). A per-output gate replaces the global one of its metric."""
    outputs = {m.output for m in metrics}
    unknown = sorted({g.output for g in gates if g.output is not None} - outputs)
    if unknown:
        raise TrtBridgeError(f"a gate names output '{unknown[0]}', which the model does not have; its outputs are: "
                             f"{', '.join(sorted(outputs))}.")
    for m in metrics:
        for metric in METRICS:
            own = [g for g in gates if g.metric == metric and g.output == m.output]
            for gate in own or [g for g in gates if g.metric == metric and g.output is None]:
                failure = gate.check(m)
                if failure:
                    m.failures.append(failure)
