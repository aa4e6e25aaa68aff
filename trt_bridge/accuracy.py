"""``convert --accuracy-target DB``: give quantized layers back to higher precision until the model is accurate
enough.

Convert, measure against the source with ``verify`` (the worst output's SNR on the evaluation feeds), and if
that misses the target, rank the quantized layers by the error each adds (``verify --per-layer``). Then find
the fewest of the worst-ranked layers whose exclusion (``--exclude-nodes``: their inputs stay in float)
meets the target, by bisection over how many of the ranking to exclude, not one layer at a time: each probe
is one conversion and one measurement. If even excluding every ranked layer misses the target, the most
accurate model seen is written and the result says so.
"""

from __future__ import annotations

import logging
import math
import re
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

log = logging.getLogger("trt_bridge.accuracy")


@dataclass(frozen=True)
class Probe:
    excluded: tuple[str, ...]  # the quantized layers kept in higher precision in this probe
    snr_db: float  # the worst output's SNR against the source
    quantized_layers: int  # layers still reading int8 inputs


@dataclass
class TargetResult:
    target_db: float
    met: bool
    ranking: list[str] = field(default_factory=list)  # quantized layers, most harmful first
    probes: list[Probe] = field(default_factory=list)
    chosen: Probe | None = None

    def summary(self) -> str:
        chosen = self.chosen
        if chosen is None:
            return "accuracy target: not measured"
        state = "met" if self.met else "MISSED"
        kept = f"{len(chosen.excluded)} layer(s) kept in higher precision" if chosen.excluded else "all layers INT8"
        return (f"accuracy target {self.target_db:g} dB {state}: {chosen.snr_db:.2f} dB with {kept}, "
                f"{chosen.quantized_layers} quantized layer(s) left ({len(self.probes)} probe(s))")


def convert_to_target(model_path: str | Path, output_path: str | Path, options, target_db: float,
                      eval_data: str | None = None, eval_random: int | None = None):
    """``convert`` with the fewest quantized layers given back that reaches ``target_db`` (see the module doc).
    Returns ``(ConversionReport, TargetResult)``; the report is the written model's."""
    from trt_bridge.convert import convert
    from trt_bridge.verify import VerifyOptions, verify

    model_path, output_path = Path(model_path), Path(output_path)
    measure = VerifyOptions(data=eval_data, random=None if eval_data else (eval_random or 8), progress=False)
    result = TargetResult(target_db, False)
    with tempfile.TemporaryDirectory(prefix="trt-bridge-target-") as tmp:
        def probe(count: int) -> Probe:
            excluded = tuple(result.ranking[:count])
            path = Path(tmp) / f"probe{count}.onnx"
            report = convert(model_path, path, replace(options, exclude_nodes=_regex(options.exclude_nodes, excluded),
                                                       check=False))
            checked = verify(model_path, path, replace(measure, per_layer=count == 0 and not result.ranking))
            snr = min((m.snr_db for m in checked.outputs), default=math.inf)
            if count == 0 and checked.per_layer is not None:
                result.ranking = [layer.node for layer in checked.per_layer.layers if layer.added_db is not None]
            layers = len({c for q in report.quantized if q["kind"] == "weight" for c in q["consumers"]})
            found = Probe(excluded, snr if not math.isnan(snr) else -math.inf, layers)
            result.probes.append(found)
            log.info("accuracy probe: %d layer(s) excluded → %.2f dB", count, found.snr_db)
            return found

        best = probe(0)
        if best.snr_db < target_db and result.ranking:
            everything = probe(len(result.ranking))
            if everything.snr_db >= target_db:
                lo, hi = 0, len(result.ranking)  # lo misses, hi meets
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    if probe(mid).snr_db >= target_db:
                        hi = mid
                    else:
                        lo = mid
                best = next(p for p in result.probes if len(p.excluded) == hi)
            else:
                best = max(result.probes, key=lambda p: p.snr_db)
        result.met, result.chosen = best.snr_db >= target_db, best
    # the chosen probe, written where the user asked, the way convert writes (atomically, external data, check)
    report = convert(model_path, output_path, replace(options, exclude_nodes=_regex(options.exclude_nodes,
                                                                                    best.excluded)))
    return report, result


def _regex(user: str | None, nodes: tuple[str, ...]) -> str | None:
    """The user's ``--exclude-nodes`` and the exact names of ``nodes``, as one regular expression."""
    parts = [f"(?:{user})"] if user else []
    if nodes:
        parts.append("^(?:" + "|".join(re.escape(n) for n in nodes) + ")$")
    return "|".join(parts) or None
