"""The decoder benchmark: every export of the decoder corpus (``scripts/decoders/build.py``) converted as a user would,
then measured where users run it (``docs/decoders.md`` shows the table).

    python scripts/decoder_table.py [CORPUS] [--sizes tiny small] [--only ARCH ...] [--exports EXPORT ...]
                                    [--markdown F] [--json F [--append]]

For each ``CORPUS/decoders/<size>/<arch>/<export>/`` model (``model.onnx``, or Optimum's ``decoder_model_merged.onnx``):

1. convert it in its own process (``/usr/bin/time`` gives the wall time and the peak resident memory), as it is for a
   quantized source; a float source twice, ``--int4 --block-size 32`` and ``--int8`` calibrated on decoder feeds
   (prompts run through the float model's own loop, so prefill and decode feeds with their caches); a dynamically
   quantized one also with those feeds;
2. ``trt-bridge verify`` (a greedy generation loop, 4 prompts × 32 steps, the converted model teacher-forced on the
   reference's tokens) against the source, where the source at MatMulNBits ``accuracy_level`` 0 is the reference when
   the weights are kept exactly (level 4 rounds activations to int8), and against the float export of the same
   exporter: token agreement and logits SNR;
   (float16 sources: ``--int4`` only);
3. TensorRT-RTX builds it ahead of time for SM 8.9 at a prefill profile (1-128 tokens, no past) and a decode profile
   (1 token, a past of 1-512), the profiles check and build give a decoder, each alone, so a failure names its profile.

Nothing here is a timed test: the numbers go to ``--markdown`` / ``--json``.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import trt_bridge  # noqa: E402
from trt_bridge.ir.decoder import config_dims, is_past  # noqa: E402
from trt_bridge.tensorrt.build import build  # noqa: E402
from trt_bridge.tensorrt.decoder_profiles import decoder_profiles, model_inputs_shapes, window_pasts  # noqa: E402
from trt_bridge.tensorrt.options import BuildOptions  # noqa: E402

PROMPTS, STEPS = 4, 32
FLOAT = re.compile(r"-(fp32|fp16|bf16)$")


def sources(corpus: Path, sizes: list[str], only: list[str] | None, exports: list[str] | None
            ) -> list[tuple[str, str, str, Path]]:
    found = []
    for size in sizes:
        for arch_dir in sorted(p for p in (corpus / "decoders" / size).glob("*") if p.is_dir()):
            if only and arch_dir.name not in only:
                continue
            for export in sorted(p for p in arch_dir.iterdir() if p.is_dir() and p.name != "hf"):
                if exports and export.name not in exports:
                    continue
                if export.name.endswith("-direct"):
                    continue  # quantize_dynamic run on a merged model: nothing quantized (corpus inventory)
                model = next((p for p in (export / "model.onnx", export / "decoder_model_merged.onnx") if p.is_file()),
                             None)
                if model is not None:
                    found.append((size, arch_dir.name, export.name, model))
    return found


def float_of(model: Path) -> Path | None:
    """The float32 export of the same exporter (genai-cpu-fp32, optimum-fp32)."""
    exporter = "genai-cpu-fp32" if model.parent.name.startswith("genai") else "optimum-fp32"
    path = model.parent.parent / exporter / "model.onnx"
    return path if path.is_file() else None


def exact_reference(source: Path, folder: Path) -> Path:
    """``source`` with every MatMulNBits at accuracy_level 0, beside a copy of its config (``source`` itself when it
    has no MatMulNBits)."""
    model = onnx.load(str(source))
    changed = False
    for node in model.graph.node:
        for attr in node.attribute:
            if node.op_type == "MatMulNBits" and attr.name == "accuracy_level" and attr.i:
                attr.i, changed = 0, True
    if not changed:
        return source
    path = folder / "reference" / source.name
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path), save_as_external_data=True, location=source.name + ".data")
    for config in ("genai_config.json", "config.json"):
        if (source.parent / config).is_file():
            shutil.copy(source.parent / config, path.parent / config)
    return path


def decoder_feeds(float_model: Path, folder: Path, prompts: int = 8, steps: int = 8, merged: bool = False) -> Path:
    """A folder of calibration feeds: each prompt's prefill and decode steps through ``float_model``'s own loop
    (``merged``: for a merged decoder, with its ``use_cache_branch``)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(float_model), options, providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = [o.name for o in session.get_outputs()]
    dims = config_dims(float_model.parent)
    rng = np.random.default_rng(7)
    vocab = session.get_outputs()[outputs.index("logits")].shape[-1]
    if not isinstance(vocab, int):
        genai = float_model.parent / "genai_config.json"
        vocab = int(json.loads(genai.read_text())["model"]["vocab_size"]) if genai.is_file() else 128
    folder.mkdir(parents=True, exist_ok=True)
    count = 0
    for _ in range(prompts):
        ids = rng.integers(4, vocab, size=(1, int(rng.integers(4, 32)))).astype(np.int64)
        mask = np.ones_like(ids)
        past = {}
        for name, meta in inputs.items():
            if is_past(name):
                shape = meta.shape
                heads = shape[1] if isinstance(shape[1], int) else dims["heads"]
                head = shape[3] if isinstance(shape[3], int) else dims["head"]
                past[name] = np.zeros((1, heads, 0, head), np.float16 if "float16" in meta.type else np.float32)
        for step in range(steps):
            feed = {"input_ids": ids, "attention_mask": mask, **past}
            if "position_ids" in inputs:
                feed["position_ids"] = np.arange(mask.shape[1] - ids.shape[1], mask.shape[1])[None].astype(np.int64)
            saved = {**feed, "use_cache_branch": np.array([step > 0])} if merged else feed
            np.savez(folder / f"feed_{count:04d}.npz", **saved)
            count += 1
            result = dict(zip(outputs, session.run(None, feed)))
            ids = result["logits"][:, -1:].argmax(-1).astype(np.int64)
            past = {n: result[n.replace("past_key_values", "present")] for n in past}
            mask = np.concatenate([mask, np.ones((1, 1), np.int64)], axis=1)
    return folder


def convert_timed(source: Path, out: Path, flags: list[str]) -> dict:
    out.parent.mkdir(parents=True, exist_ok=True)
    for config in ("genai_config.json", "config.json"):  # the converted model is a drop-in: its configs go along
        if (source.parent / config).is_file():
            shutil.copy(source.parent / config, out.parent / config)
    command = ["/usr/bin/time", "-f", "TIME %e %M", sys.executable, "-m", "trt_bridge", "convert", str(source), "-o",
               str(out), "--skip-check", "-q", *flags]
    done = subprocess.run(command, capture_output=True, text=True)
    timing = re.findall(r"TIME ([\d.]+) (\d+)", done.stderr)
    seconds, kib = (float(timing[-1][0]), int(timing[-1][1])) if timing else (None, None)
    error = None if done.returncode == 0 else (done.stderr.strip().splitlines() or ["?"])[-2 if timing else -1]
    return {"flags": " ".join(flags) or "(none)", "exit": done.returncode, "seconds": seconds,
            "peak_mib": None if kib is None else round(kib / 1024, 1), "error": error}


def generation(reference: Path, candidate: Path) -> dict:
    try:
        result = trt_bridge.verify(reference, candidate, prompts=PROMPTS, steps=STEPS, costs="off",
                                   quiet=True).generation
        snr = result.logits_snr_db
        return {"agreement": round(100 * result.token_agreement, 1),
                "snr_db": round(snr, 2) if np.isfinite(snr) else "inf"}  # strict JSON: no Infinity
    except Exception as exc:  # noqa: BLE001 - a benchmark records the failure and goes on
        return {"error": str(exc).splitlines()[0][:200]}


def builds(model: Path) -> dict:
    found = {}
    inputs = model_inputs_shapes(onnx.load(str(model), load_external_data=False))
    for profile in decoder_profiles(inputs, window_pasts(model, inputs)):
        name = profile.name
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            try:
                build(model, Path(tmp) / "m.engine", BuildOptions(profiles=(profile,), compute_capabilities=("8.9",),
                                                                   progress=False))
                found[name] = f"ok ({time.perf_counter() - start:.1f} s)"
            except Exception as exc:  # noqa: BLE001 - recorded, the rest goes on
                found[name] = "fails: " + str(exc).splitlines()[0][:160]
    return found


def runs(source: Path, work: Path) -> list[tuple[str, list[str]]]:
    """(label, convert flags) for a source."""
    name = source.parent.name
    if FLOAT.search(name):
        if name.endswith("bf16"):
            return []  # onnxruntime's CPU provider cannot run it (no bfloat16 Mul): no reference to compare with
        if name.endswith("fp16"):  # genai's CPU fp16 export declares shapes onnxruntime's planner trips on
            return [("int4", ["--int4", "--block-size", "32"])]
        merged = source.name == "decoder_model_merged.onnx"
        feeds = decoder_feeds(float_of(source) or source, work / "feeds", merged=merged)
        return [("int4", ["--int4", "--block-size", "32"]), ("int8+data", ["--calib-data", str(feeds)])]
    if "qdyn" in name:
        reference = float_of(source)
        merged = source.name == "decoder_model_merged.onnx"
        feeds = decoder_feeds(reference, work / "feeds", merged=merged) if reference else None
        with_data = [("with data", ["--calib-data", str(feeds)])] if feeds else []
        return [("as is", []), *with_data]
    return [("as is", [])]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("corpus", type=Path, nargs="?", default=ROOT / ".corpus")
    ap.add_argument("--sizes", nargs="*", default=["tiny"])
    ap.add_argument("--only", nargs="*", help="architectures")
    ap.add_argument("--exports", nargs="*", help="export folders (genai-cpu-int4, optimum-qdyn-u8, ...)")
    ap.add_argument("--append", action="store_true", help="add to the --json file's rows (one table, several runs)")
    ap.add_argument("--markdown", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size, arch, export, source in sources(args.corpus, args.sizes, args.only, args.exports):
            work = Path(tmp) / size / arch / export
            reference = exact_reference(source, work)
            flt = float_of(source)
            for label, flags in runs(source, work):
                out = work / label.replace(" ", "-").replace("+", "-") / source.name
                row = {"size": size, "arch": arch, "export": export, "run": label,
                       "source_mib": round(sum(p.stat().st_size for p in source.parent.glob(source.name + "*"))
                                           / 2**20, 2), **convert_timed(source, out, flags)}
                if row["exit"] == 0:
                    row["vs_source"] = generation(reference, out)
                    row["source_vs_float"] = generation(flt, source) if flt and flt != source else None
                    row["vs_float"] = generation(flt, out) if flt and flt != source else None
                    row["builds"] = builds(out)
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.append and args.json and args.json.is_file():
        rows = json.loads(args.json.read_text()) + rows
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    if args.markdown:
        args.markdown.write_text(markdown(rows))
    return 0


def _gen(cell) -> str:
    if not cell:
        return "–"
    return cell["error"] if "error" in cell else f"{cell['agreement']} % / {cell['snr_db']} dB"


def markdown(rows: list[dict]) -> str:
    lines = ["| size | arch | export | run | convert | peak MiB (source MiB) | vs source (agreement / logits SNR) | "
             "source vs float | converted vs float | TensorRT-RTX SM 8.9 prefill / decode |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        convert = f"{r['seconds']} s" if r["exit"] == 0 else f"exit {r['exit']}: {r['error']}"
        built = " / ".join(r.get("builds", {}).values()) or "–"
        lines.append(f"| {r['size']} | {r['arch']} | {r['export']} | {r['run']} | {convert} | {r['peak_mib']} "
                     f"({r['source_mib']}) | {_gen(r.get('vs_source'))} | {_gen(r.get('source_vs_float'))} | "
                     f"{_gen(r.get('vs_float'))} | {built} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
