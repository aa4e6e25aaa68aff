"""``convert --accuracy-target DB``: give quantized layers back to higher precision until the model is accurate
enough.

Convert, measure against the source with ``verify`` (the worst output's SNR on the evaluation feeds, or with
``metric="cosine"`` its cosine similarity), and if that misses the target, rank the quantized layers two ways:

- ``added``: by the error each adds along the graph (``verify --per-layer``): its output's noise less the noise
  it inherits. A layer whose output is cleaner than its input (a convolution averaging inherited noise) adds
  "none" there, though it still quantizes; those follow, in the order below.
- ``isolated``: by the error each makes on its own: its output against a copy that reads its activations
  before their Q/DQ (:func:`trt_bridge.verification.layers.isolated_errors`), which ranks every layer.

For each ranking, find the fewest of its worst layers whose exclusion (``--exclude-nodes``: their inputs stay
in float) meets the target, by bisection over how many to exclude, not one layer at a time: each probe is one
conversion and one measurement (a set already measured is not measured again). The ranking that keeps more
layers INT8 wins (then the higher SNR). A ranking is an estimate and errors interact, so the chosen layers
are then tried in INT8 again one at a time, least harmful first (at most ``REFINE_PROBES``), each kept INT8
if the target still holds. If even excluding every ranked layer misses the target, the most accurate model
seen is written and the result says so.

The reference is the source's float meaning, as for give-back and ``auto``: a float source itself; a quantized
source (QOperator, QDQ, dynamic) in its lifted float form (the source with its activation quantization removed and
its weights dequantized, as ``verify --per-layer`` measures its layers), written beside the probes. Against the
quantized source's own outputs no layer given back could help: each moves the output towards that float meaning
and away from the source's rounding (a QOperator net at 23.2 dB against its source with every layer INT8 fell to
16.4 with every layer in float, the float meaning's own distance from the source). ``verify`` still compares with
the source as given.

The plain conversion is the user's, give-back included (``conversion/give_back.py``, with ``--calib-method auto``);
the layers it gave back stay excluded in every later probe, which runs with give-back off (judged again with more
layers excluded, it could quantize one it gave back).
"""

from __future__ import annotations

import logging
import math
import re
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from trt_bridge.conversion.pipeline import convert
from trt_bridge.ir.save import save_model
from trt_bridge.verification import DEFAULT_RANDOM_FEEDS, QuietPolygraphy, VerifyOptions, checked_feeds, verify
from trt_bridge.verification.layers import float_reference, isolated_errors

log = logging.getLogger("trt_bridge.conversion.accuracy")


REFINE_PROBES = 16  # at most this many layers of the bisection's choice are tried in INT8 again


@dataclass(frozen=True)
class Probe:
    excluded: tuple[str, ...]  # the quantized layers kept in higher precision in this probe
    snr_db: float  # the worst output's SNR against the source
    quantized_layers: int  # layers still reading int8 inputs
    ranking: str = ""  # the ranking whose bisection made it ("" for plain INT8)
    cosine: float = math.nan  # the worst output's cosine similarity to the source
    score: float = math.nan  # what the target is compared with: snr_db or cosine, by the metric
    tier: str = ""  # where the excluded layers go: "" float; "fp8" FP8 (under --fp4, tried before float)


@dataclass
class TargetResult:
    target_db: float  # the target: an SNR in dB, or a cosine similarity when metric is "cosine"
    met: bool
    ranking: list[str] = field(default_factory=list)  # the chosen ranking: quantized layers, most harmful first
    probes: list[Probe] = field(default_factory=list)
    chosen: Probe | None = None
    rankings: dict[str, list[str]] = field(default_factory=dict)  # every ranking tried, by name
    metric: str = "snr"  # "snr" (dB) or "cosine"
    reference: str = "source"  # what the probes are measured against: "source", or "lifted source" (a quantized one)
    given_back: list[str] = field(default_factory=list)  # the plain conversion's give-back: in float in every probe

    def summary(self) -> str:
        chosen = self.chosen
        if chosen is None:
            return "accuracy target: not measured"
        state = "met" if self.met else "MISSED"
        kept = f"{len(chosen.excluded)} layer(s) kept in {'FP8' if chosen.tier else 'higher precision'}" \
            if chosen.excluded else (
            f"{len(self.given_back)} layer(s) given back" if self.given_back else "all layers INT8")
        by = f", ranked by {chosen.ranking} error" if chosen.ranking else ""
        if self.metric == "cosine":
            target, reached = f"cosine {self.target_db:g}", f"cosine {chosen.cosine:.6f} ({chosen.snr_db:.2f} dB)"
        else:
            target, reached = f"{self.target_db:g} dB", f"{chosen.snr_db:.2f} dB"
        against = " against the source's lifted float form" if self.reference == "lifted source" else ""
        return (f"accuracy target {target}{against} {state}: {reached} with {kept}{by}, "
                f"{chosen.quantized_layers} quantized layer(s) left ({len(self.probes)} probe(s))")


def convert_to_target(model_path: str | Path, output_path: str | Path, options, target_db: float,
                      eval_data: str | None = None, eval_random: int | None = None, metric: str = "snr",
                      outputs=None):
    """``convert`` with the fewest quantized layers given back that reaches ``target_db`` (an SNR in dB, or a
    cosine similarity with ``metric="cosine"``; see the module doc). Returns ``(ConversionReport,
    TargetResult)``; the report is the written model's (committed with ``outputs`` when given, as
    :func:`~trt_bridge.conversion.pipeline.convert` does)."""

    model_path, output_path = Path(model_path), Path(output_path)
    measure = VerifyOptions(data=eval_data, random=None if eval_data else (eval_random or DEFAULT_RANDOM_FEEDS),
                            progress=False)
    if metric not in ("snr", "cosine"):
        raise ValueError(f"metric must be 'snr' or 'cosine', not {metric!r}")
    result = TargetResult(target_db, False, metric=metric)
    measured: dict[frozenset, Probe] = {}
    given_back = result.given_back  # what the plain conversion's give-back left in float: excluded in every later probe

    # under --fp4 the layers go to FP8 first, to float only where FP8 cannot meet the target
    tiers = ("fp8", "") if options.formats.activations == "fp4" else ("",)

    def probe_options(excluded: tuple[str, ...], tier: str = ""):
        """The plain conversion as the user asked; every other probe with give-back's layers excluded and
        give-back itself off (it would judge the rest again, and could quantize a layer it gave back); the
        ``excluded`` layers in float, or in FP8 for the tier "fp8" (give-back's stay float)."""
        if not excluded:
            return options
        formats, placement = options.formats, _excluding(options.placement, (*given_back, *excluded))
        if tier == "fp8":
            formats = replace(formats, fp8_nodes=_regex(formats.fp8_nodes, excluded))
            placement = _excluding(options.placement, tuple(given_back))
        return replace(options, calibration=replace(options.calibration, give_back=False), placement=placement,
                       formats=formats)

    with tempfile.TemporaryDirectory(prefix="trt-bridge-target-") as tmp:
        reference = _reference(model_path, Path(tmp), result)
        def probe(excluded: tuple[str, ...], ranking: str = "", tier: str = "") -> Probe:
            key = (tier if excluded else "", frozenset(excluded))
            if key in measured:
                return measured[key]
            path = Path(tmp) / f"probe{len(result.probes)}.onnx"
            report = convert(model_path, path, replace(probe_options(excluded, tier), check=False))
            first = not result.probes
            if first:
                given_back.extend((report.given_back or {}).get("layers") or ())
            # the first probe keeps the feeds and the source's outputs; the others load them instead of reading
            # the feeds and running the source again (verify --save-inputs/--save-outputs, --load-*)
            saved = dict(load_inputs=str(Path(tmp) / "inputs.json"), load_outputs=str(Path(tmp) / "source.json"))
            checked = verify(reference, path, replace(
                measure, per_layer=True, save_inputs=saved["load_inputs"], save_outputs=saved["load_outputs"])
                if first else replace(measure, data=None, random=None, **saved))
            snr = min((m.snr_db for m in checked.outputs), default=math.inf)
            cosine = min((m.cosine for m in checked.outputs), default=1.0)
            if first and checked.per_layer is not None:
                result.rankings = _rankings(reference, path, checked, replace(measure, data=None, random=None,
                                                                              **saved))
            layers = len({c for q in report.quantized if q["kind"] == "weight" for c in q["consumers"]})
            snr = snr if not math.isnan(snr) else -math.inf
            cosine = cosine if not math.isnan(cosine) else -1.0
            found = Probe(excluded, snr, layers, ranking, cosine, cosine if metric == "cosine" else snr, key[0])
            result.probes.append(found)
            measured[key] = found
            log.info("accuracy probe: %d layer(s) excluded → %.2f dB, cosine %.6f", len(excluded), found.snr_db,
                     found.cosine)
            return found

        best = probe(())
        if best.score < target_db:
            for tier in tiers:
                best, name = search(result.rankings, lambda ex, r, t=tier: probe(ex, r, t), target_db)
                if name is not None:
                    break
            if name is None:
                best = max(result.probes, key=lambda p: p.score)
                name = best.ranking if best.ranking in result.rankings else next(iter(result.rankings), None)
            result.ranking = result.rankings.get(name, [])
        result.met, result.chosen = best.score >= target_db, best
    # the chosen probe, written where the user asked, the way convert writes (atomically, external data, check)
    report = convert(model_path, output_path, probe_options(best.excluded, best.tier), outputs)
    return report, result


def _reference(model_path: Path, tmp: Path, result: TargetResult) -> Path:
    """What the probes are measured against (see the module doc): the source, or a quantized one's lifted float
    form written into ``tmp`` (``result.reference`` says which)."""
    model, lifted = float_reference(model_path)
    if not lifted:
        return model_path
    result.reference = "lifted source"
    return save_model(model, tmp / "reference.onnx", protect=(model_path,))


def search(rankings: dict[str, list[str]], probe, target_db: float) -> tuple[Probe | None, str | None]:
    """The bisection and refinement of the module doc over ``rankings``; ``probe(excluded, ranking_name)``
    measures one set. Returns the chosen probe and its ranking's name, or ``(None, None)`` when excluding
    every ranked layer misses the target under every ranking."""
    meeting = []
    for name, ranking in rankings.items():
        if not ranking or probe(tuple(ranking), name).score < target_db:
            continue
        lo, hi = 0, len(ranking)  # lo misses, hi meets
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if probe(tuple(ranking[:mid]), name).score >= target_db:
                hi = mid
            else:
                lo = mid
        meeting.append((probe(tuple(ranking[:hi]), name), name))
    if not meeting:
        return None, None
    best, name = min(meeting, key=lambda item: (len(item[0].excluded), -item[0].score))
    # the bisection gives back a prefix of the ranking; quantize again, one at a time from the least harmful,
    # each layer of it the target can spare (a ranking is an estimate, and errors interact)
    for layer in list(reversed(best.excluded))[:REFINE_PROBES]:
        fewer = probe(tuple(x for x in best.excluded if x != layer), "refined")
        if fewer.score >= target_db:
            best = fewer
    return best, name


def _rankings(model_path: Path, candidate: Path, checked, measure) -> dict[str, list[str]]:
    """The two rankings of the module doc, most harmful first."""

    with QuietPolygraphy():  # it would print "Loading input data" where --json goes
        feeds = checked_feeds(model_path, candidate, measure)[:measure.layer_feeds]
    isolated = isolated_errors(candidate, feeds, measure.layer_batch)
    by_isolated = sorted((n for n, v in isolated.items() if v is not None), key=lambda n: (isolated[n], n))
    added = [layer.node for layer in sorted((la for la in checked.per_layer.layers if la.added_db is not None),
                                            key=lambda la: (la.added_db, la.index))]
    return {"added": added + [n for n in by_isolated if n not in added], "isolated": by_isolated}


def _excluding(placement, nodes: tuple[str, ...]):
    """``placement`` (PlacementOptions) with ``nodes`` excluded too."""
    return replace(placement, exclude_nodes=_regex(placement.exclude_nodes, nodes))


def _regex(user: str | None, nodes: tuple[str, ...]) -> str | None:
    """The user's ``--exclude-nodes`` and the exact names of ``nodes``, as one regular expression."""
    parts = [f"(?:{user})"] if user else []
    if nodes:
        parts.append("^(?:" + "|".join(re.escape(n) for n in nodes) + ")$")
    return "|".join(parts) or None
