"""docs/real-models-table.md (included into docs/real-models.md) from run.py's rows: the corpus (what each model is,
where it comes from) and one row per (model, form)."""

from __future__ import annotations

import re


def _snr(value) -> str:
    if value is None:
        return "-"
    return "inf" if value == float("inf") else f"{value:.1f}"


def markdown(rows: list[dict], models) -> str:
    by_name = {m.name: m for m in models}
    lines = ["<!-- written by scripts/realmodels/run.py; do not edit -->", "", "### The models", "",
             "| model | kind | wheel | member | licence |", "|---|---|---|---|---|"]
    for m in models:
        lines.append(f"| {m.name} | {m.kind} | `{m.wheel.spec}` | `{m.member.rsplit('/', 1)[-1]}` | {m.licence} |")
    lines += ["", "### Results", "",
              "| model | form | source | vs float | vs source | top-1 | ready | builds | convert s | note |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    float_built = {r["model"]: r.get("built") for r in rows if r["form"] == "float"}
    float_mib = {r["model"]: r.get("engine_mib") for r in rows if r["form"] == "float"}
    rows = [r for r in rows if r["form"] != "float"]
    for r in rows:
        if r["model"] not in by_name:
            continue
        worst = (r.get("snr_vs_float") or {}).get("worst")
        ready = {True: "yes", False: "no", None: "-"}[r.get("ready")]
        note = r.get("error") or "; ".join(r.get("blockers") or [])
        if r.get("engine_mib") is not None:
            versus = f" (float {float_mib[r['model']]} MiB)" if float_mib.get(r["model"]) else ""
            note = f"engine {r['engine_mib']} MiB{versus}" + (f"; {note}" if note else "")
        if float_built.get(r["model"]) is False and not r.get("built"):
            note = f"the float model does not build either; {note}"
        note = re.sub(r"\S*/work/[^/\s]+/", "", note).replace("|", "\\|").replace("\n", " ")[:240]
        top1 = (r.get("snr_vs_float") or {}).get("top1") if "classifier" in by_name[r["model"]].kind else None
        top1 = "-" if top1 is None else f"{100 * top1:.0f} %"
        lines.append(f"| {r['model']} | {r['form']} | {_snr(r.get('source_snr'))} | {_snr(worst)} "
                     f"| {_snr(r.get('snr_vs_source'))} | {top1} | {ready} | {'yes' if r.get('built') else 'no'} "
                     f"| {r.get('convert_seconds', '-')} | {note} |")
    built = sum(bool(r.get("built")) for r in rows)
    converted = sum("snr_vs_float" in r for r in rows)
    lines += ["", f"{len(rows)} rows: {converted} converted and verified, {built} built for SM 8.9.", ""]
    return "\n".join(lines)


def changes(rows: list[dict], baseline: list[dict], tolerance_db: float = 1.0) -> list[str]:
    """What differs from ``baseline`` (an earlier run's rows): a row that built and no longer does (or the reverse),
    an error gained or lost, a worst SNR against the float model that moved by more than ``tolerance_db``."""
    before = {(r["model"], r["form"]): r for r in baseline}
    out = []
    for r in rows:
        old = before.get((r["model"], r["form"]))
        if old is None:
            continue
        where = f"{r['model']} {r['form']}"
        if bool(old.get("built")) != bool(r.get("built")):
            out.append(f"{where}: {'now builds' if r.get('built') else 'no longer builds'}")
        if bool(old.get("error")) != bool(r.get("error")):
            out.append(f"{where}: {'error: ' + r['error'][:160] if r.get('error') else 'error gone'}")
        a, b = ((x.get("snr_vs_float") or {}).get("worst") for x in (old, r))
        if a is not None and b is not None and abs(b - a) > tolerance_db and not (a == b == float("inf")):
            out.append(f"{where}: {a:.1f} → {b:.1f} dB against the float model")
    return out
