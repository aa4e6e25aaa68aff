"""Rebuild the decoder (LLM) export corpus: tiny seeded Llama / Qwen2 / Phi3 / Mistral checkpoints exported by
onnxruntime-genai's model builder and by optimum-onnx, quantized by onnxruntime, described and run.

    python scripts/decoders/build.py [OUT] [--sizes tiny small] [--only ARCH ...] [--skip-genai] [--skip-optimum]
    python scripts/decoders/build.py --tiny-slice     # tiny size only, then refresh tests/data/decoders/
    python scripts/decoders/build.py --slice-only     # only re-copy tests/data/decoders/ from OUT

OUT defaults to ``.corpus``; models go to ``OUT/decoders/<size>/<arch>/<exporter>-<precision>/``.

1. Two virtualenvs, never trt-bridge's own dependencies (pins in ``VENVS``):
   ``OUT/venvs/genai`` (onnxruntime-genai 0.18.0, transformers 5, torch CPU) and ``OUT/venvs/optimum``
   (optimum-onnx 0.1.0, transformers 4.57, torch CPU, onnxruntime for its quantizers).
2. ``make_hf.py`` (genai venv) writes ``<size>/<arch>/hf/``: config, seeded random weights
   (``torch.manual_seed(0)``, then rescaled: see its docstring), a local word-level tokenizer and the torch
   reference logits ``hf/reference.json``. Nothing is downloaded from a model hub
   (``HF_HUB_OFFLINE=1``, ``TRANSFORMERS_OFFLINE=1``).
3. ``python -m onnxruntime_genai.models.builder -i hf -o genai-<ep>-<precision> -p .. -e ..`` for every entry of
   ``GENAI`` (genai venv; ``genai_batch.py`` runs these exact commands in one process, sparing an import of
   torch per export), and ``export_optimum.py`` (optimum venv) for the optimum exports and their
   ``quantize_dynamic`` / ``MatMulNBitsQuantizer`` forms. Each output folder gets ``export.json`` (the exact
   command, exit status, and the error's last lines when it failed); a failure is recorded and the rest goes on.
4. ``describe.py`` (trt-bridge's ``.venv``: its onnx and onnxruntime) writes ``<stem>.report.json`` beside every
   model (inputs/outputs, op histogram, attention/norm/quantization attributes and wiring, negative scales,
   onnxruntime prefill + one decode step against the torch logits); ``inventory.py`` writes
   ``OUT/decoders/inventory.md``.
5. ``--tiny-slice``: copies the small tiny-size exports named in ``SLICE`` to ``tests/data/decoders/<arch>-<exporter>-
   <precision>/`` (model files, external data, genai_config.json, the report) and writes its README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from venvs import venv_python  # noqa: E402

SLICE_DIR = ROOT / "tests" / "data" / "decoders"

#: what each exporter's virtualenv gets (its own pins; nothing here is trt-bridge's dependency)
VENVS = {
    "genai": ["onnxruntime-genai==0.18.0", "transformers>=5", "torch==2.13.0", "onnx", "onnxruntime", "onnx-ir"],
    "optimum": ["optimum-onnx==0.1.0", "transformers==4.57.*", "torch==2.13.0", "onnx", "onnxruntime", "onnx-ir",
                "accelerate"],
}

#: onnxruntime-genai builder runs: folder suffix -> (execution provider, precision, extra options)
GENAI = {
    "cpu-fp32": ("cpu", "fp32", []),
    "cpu-fp16": ("cpu", "fp16", []),
    "cpu-int8": ("cpu", "int8", []),
    "cpu-int4": ("cpu", "int4", []),
    "cpu-int4-qdq": ("cpu", "int4", ["use_qdq=true"]),
    "cpu-int4-asym": ("cpu", "int4", ["is_symmetric=false"]),
    "cuda-fp16": ("cuda", "fp16", []),
    "cuda-int4": ("cuda", "int4", []),
    "NvTensorRtRtx-fp16": ("NvTensorRtRtx", "fp16", []),
    "NvTensorRtRtx-int4": ("NvTensorRtRtx", "int4", []),
    "NvTensorRtRtx-bf16": ("NvTensorRtRtx", "bf16", []),
}
ARCHS = ("llama", "qwen2", "phi3", "mistral")

#: the suite's slice: (arch, export folder, model files); copied when every file is under SLICE_MAX_BYTES
SLICE = [
    ("llama", "genai-cpu-fp32", ["model.onnx"]),
    ("llama", "genai-cpu-fp16", ["model.onnx"]),
    ("llama", "genai-cpu-int8", ["model.onnx"]),
    ("llama", "genai-cpu-int4", ["model.onnx"]),
    ("llama", "genai-cpu-int4-qdq", ["model.onnx"]),
    ("llama", "genai-cpu-int4-asym", ["model.onnx"]),
    ("llama", "genai-cuda-fp16", ["model.onnx"]),
    ("llama", "genai-NvTensorRtRtx-int4", ["model.onnx"]),
    ("llama", "genai-NvTensorRtRtx-fp16", ["model.onnx"]),
    ("qwen2", "genai-cpu-int4", ["model.onnx"]),
    ("phi3", "genai-cpu-int4", ["model.onnx"]),
    ("mistral", "genai-cpu-int4", ["model.onnx"]),
    ("llama", "optimum-fp32", ["model.onnx"]),
    ("llama", "optimum-qdyn-u8", ["model.onnx"]),
    ("llama", "optimum-int4-b32-qdq", ["model.onnx"]),
    ("llama", "optimum-merged-fp32", ["decoder_model_merged.onnx"]),
    ("llama", "optimum-merged-qdyn-u8", ["decoder_model_merged.onnx"]),
    ("llama", "optimum-merged-int4-b32", ["decoder_model_merged.onnx"]),
]
SLICE_MAX_BYTES = 1_500_000

#: GIT_DIR: the genai builder stamps producer_version with `git rev-parse HEAD` run five folders above its
#: package, which for a venv inside this checkout is trt-bridge's own HEAD (so every commit changed the models);
#: with no git there it uses the wheel's own commit, as a pip install elsewhere would. PYTHONHASHSEED: optimum's
#: merge_decoders names and orders the merged graph's initializers through sets, so without a fixed hash seed
#: decoder_model_merged.onnx differs byte-wise from run to run (with it the whole slice is byte-identical).
ENV = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1",
           PYTHONHASHSEED="0", GIT_DIR="/nonexistent-git-dir")


def _python(out: Path, name: str) -> Path | None:
    """The venv's python, made and filled on first use; None if its packages do not install."""
    return venv_python(out / "venvs" / name, VENVS[name], "decoders")


def _describe_python() -> str:
    """trt-bridge's own venv (its onnx / onnxruntime) when present, else this interpreter."""
    own = ROOT / ".venv" / "bin" / "python"
    return str(own) if own.is_file() else sys.executable


def _rel(arg: str) -> str:
    """A path argument relative to the repository root (as the README shows commands), others as they are."""
    try:
        return str(Path(arg).resolve().relative_to(ROOT)) if arg.startswith(("/", ".")) else arg
    except ValueError:
        return arg


def genai_command(arch_dir: Path, suffix: str, python: str = "python") -> list[str]:
    ep, precision, extra = GENAI[suffix]
    cmd = [python, "-m", "onnxruntime_genai.models.builder", "-i", str(arch_dir / "hf"),
           "-o", str(arch_dir / f"genai-{suffix}"), "-p", precision, "-e", ep,
           "-c", str(arch_dir.parents[1] / ".cache" / "genai")]
    if extra:
        cmd += ["--extra_options", *extra]
    return cmd


def export_genai(python: Path, arch_dirs: list[Path], suffixes: list[str]) -> None:
    """Every (arch, GENAI suffix) builder command, run by genai_batch.py in one genai-venv process."""
    jobs = []
    for arch_dir in arch_dirs:
        for suffix in suffixes:
            out = arch_dir / f"genai-{suffix}"
            shutil.rmtree(out, ignore_errors=True)
            cmd = genai_command(arch_dir, suffix)
            jobs.append({"argv": cmd[3:], "out": str(out), "command": " ".join(_rel(c) for c in cmd)})
    job_file = arch_dirs[0].parent / ".genai-jobs.json"
    job_file.write_text(json.dumps(jobs, indent=1))
    subprocess.run([str(python), str(HERE / "genai_batch.py"), str(job_file)], env=ENV)


def write_slice(decoders: Path) -> None:
    """Copy the SLICE exports of the tiny size into tests/data/decoders/ and write its README.md."""
    shutil.rmtree(SLICE_DIR, ignore_errors=True)
    SLICE_DIR.mkdir(parents=True)
    rows = []
    for arch, folder, files in SLICE:
        src = decoders / "tiny" / arch / folder
        export = json.loads((src / "export.json").read_text()) if (src / "export.json").is_file() else None
        if export is None or export["rc"] != 0 or not all((src / f).is_file() for f in files):
            print(f"[decoders] slice: {arch}/{folder} missing or failed; skipped", flush=True)
            continue
        wanted = []
        for f in files:  # the model, its external data (model.onnx.data, model.onnx_data), its report
            wanted.append(f)
            wanted += sorted(p.name for p in src.iterdir() if p.name.startswith((f + ".", f + "_")))
            rep = Path(f).stem + ".report.json"
            if (src / rep).is_file():
                wanted.append(rep)
        for extra in ("genai_config.json",):
            if (src / extra).is_file():
                wanted.append(extra)
        big = [w for w in wanted if (src / w).stat().st_size > SLICE_MAX_BYTES]
        if big:
            print(f"[decoders] slice: {arch}/{folder}: {big} over {SLICE_MAX_BYTES} bytes; skipped", flush=True)
            continue
        dst = SLICE_DIR / f"{arch}-{folder}"
        dst.mkdir()
        for w in wanted:
            shutil.copy(src / w, dst / w)
        rows.append((dst.name, wanted, export["command"], sum((src / w).stat().st_size for w in wanted), src))
    _slice_readme(rows)


def _slice_readme(rows) -> None:
    total = sum(r[3] for r in rows)
    lines = [
        "# Tiny decoder (LLM) exports",
        "",
        "Made locally by `python scripts/decoders/build.py --tiny-slice` (which regenerates this folder): seeded",
        "random-weight checkpoints from configs (`scripts/decoders/make_hf.py`, tiny size: hidden 64, 4 query heads",
        "over 2 KV heads, head size 16, 2 layers, intermediate 128, vocabulary 192 (not 128: onnxruntime-genai",
        "0.18's builder takes any Linear as wide as the vocabulary for the LM head, see make_hf.py),",
        "max_position_embeddings 2048; weights `torch.manual_seed(0)` then redrawn N(0, 1/fan_in) by a seeded",
        "generator, RMSNorm gains 1 + N(0, 0.1); Mistral with a sliding window of 8),",
        "exported by onnxruntime-genai 0.18.0's model builder (venv `.corpus/venvs/genai`: transformers 5, torch 2.13",
        "CPU) or optimum-onnx 0.1.0 (venv `.corpus/venvs/optimum`: transformers 4.57, torch 2.13 CPU) and quantized",
        "by onnxruntime 1.32 (in the optimum venv). Nothing came from a model hub.",
        "",
        "Each folder holds the model, its external data if the exporter wrote one, `genai_config.json` for the genai",
        "builder's exports, and `<stem>.report.json` (`scripts/decoders/describe.py`: inputs/outputs, op histogram,",
        "GroupQueryAttention / MultiHeadAttention / RotaryEmbedding / norm / MatMulNBits attributes and input wiring,",
        "negative scales, and onnxruntime's prefill (16 tokens, empty past) + one decode step against the torch",
        "logits).",
        "The whole corpus and its inventory (all sizes, all exports, the errors) is `.corpus/decoders/inventory.md`.",
        "",
        "The genai commands ran in `.corpus/venvs/genai` with `HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1` (and",
        "`GIT_DIR` pointing nowhere, so `producer_version` carries the wheel's commit, not this checkout's); `-c` is",
        "the builder's scratch folder. The optimum ones ran in `.corpus/venvs/optimum`",
        "(`scripts/decoders/export_optimum.py`), with",
        "`ARCH_DIR` = `.corpus/decoders/tiny/<arch>`, `src` the float model named, `dst` the file in the",
        "folder.",
        "",
        f"Total: {total / 1e6:.2f} MB.",
        "",
        "| folder | files | bytes | made by |",
        "|---|---|---:|---|",
    ]
    for name, files, cmd, size, _ in rows:
        lines.append(f"| `{name}` | {', '.join(f'`{f}`' for f in files)} | {size} | `{cmd}` |")
    lines.append("")
    (SLICE_DIR / "README.md").write_text("\n".join(lines))
    print(f"[decoders] slice: {len(rows)} exports, {total / 1e6:.2f} MB in {SLICE_DIR}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, nargs="?", default=ROOT / ".corpus")
    ap.add_argument("--sizes", nargs="*", default=["tiny", "small"])
    ap.add_argument("--only", nargs="*", default=list(ARCHS), help="architectures")
    ap.add_argument("--genai", nargs="*", default=list(GENAI), help="genai builder runs (GENAI keys)")
    ap.add_argument("--skip-genai", action="store_true")
    ap.add_argument("--skip-optimum", action="store_true")
    ap.add_argument("--tiny-slice", action="store_true", help="tiny size only, then refresh tests/data/decoders")
    ap.add_argument("--slice-only", action="store_true", help="only refresh tests/data/decoders from OUT (no export)")
    args = ap.parse_args()
    sizes = ["tiny"] if args.tiny_slice else args.sizes
    decoders = args.out / "decoders"
    if args.slice_only:
        write_slice(decoders)
        return 0
    genai = _python(args.out, "genai")
    if genai is None:
        return 1
    optimum = None if args.skip_optimum else _python(args.out, "optimum")
    for size in sizes:
        subprocess.run([str(genai), str(HERE / "make_hf.py"), str(decoders), "--size", size, "--only", *args.only],
                       check=True, env=ENV)
        if not args.skip_genai:
            export_genai(genai, [decoders / size / arch for arch in args.only], args.genai)
        for arch in args.only:
            arch_dir = decoders / size / arch
            if optimum is not None:
                subprocess.run([str(optimum), str(HERE / "export_optimum.py"), str(arch_dir)], env=ENV)
        subprocess.run([_describe_python(), str(HERE / "describe.py"), str(decoders / size)], env=ENV)
    subprocess.run([_describe_python(), str(HERE / "inventory.py"), str(decoders)], env=ENV)
    if args.tiny_slice:
        write_slice(decoders)
    return 0


if __name__ == "__main__":
    sys.exit(main())
