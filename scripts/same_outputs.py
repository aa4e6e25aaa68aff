"""Do two revisions convert to the same bytes? For refactors that must not change any output.

    python scripts/same_outputs.py REV [--shared ../shared/models] [--keep DIR]

Checks out ``REV`` into a temporary git worktree and runs ``trt-bridge convert`` from it and from this checkout
(each with its own tree first on ``PYTHONPATH``, the same virtual environment) on:

- every model in the shared folder, with ``--calib-random 8`` (static and dynamic sources alike), and the float
  ones also with ``--high-precision fp16``;
- the demo's two samples (a conv net and a transformer encoder) after onnxruntime's ``quantize_dynamic``, with
  calibration feeds of seed 1 (as ``make demo`` builds them).

Prints one line per case and exits 1 if any output (model, and its external data if any) differs in a byte, or a
conversion succeeds on one side only.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnxruntime.quantization import QuantType, quantize_dynamic

from trt_bridge import samples

ROOT = Path(__file__).resolve().parents[1]


def cases(shared: Path, work: Path) -> list[tuple[str, Path, list[str]]]:
    found = []
    for model in sorted(shared.glob("*.onnx")):
        found.append((model.stem, model, ["--calib-random", "8"]))
        if "int8" not in model.stem and "uint8" not in model.stem:
            found.append((f"{model.stem}-fp16", model, ["--calib-random", "8", "--high-precision", "fp16"]))
    for name, build, feeds in (("convnet", samples.conv_net, lambda n, s: samples.image_feeds(n, s)),
                               ("transformer", samples.transformer_block,
                                lambda n, s: samples.sequence_feeds(n, s, 16, 64))):
        float_path, dynamic_path = work / f"{name}.onnx", work / f"{name}.dynamic.onnx"
        onnx.save(build(), float_path)
        quantize_dynamic(str(float_path), str(dynamic_path), weight_type=QuantType.QInt8)
        model = onnx.load(str(float_path))
        np.savez(work / f"{name}.npz", **{model.graph.input[0].name: feeds(16, 1)})
        found.append((f"{name}-dynamic", dynamic_path, ["--calib-data", str(work / f"{name}.npz")]))
        found.append((f"{name}-float", float_path, ["--calib-data", str(work / f"{name}.npz")]))
    return found


def digest(path: Path) -> str | None:
    if not path.exists():
        return None
    h = hashlib.sha256(path.read_bytes())
    data = path.with_name(path.name + ".data")
    if data.exists():
        h.update(data.read_bytes())
    return h.hexdigest()[:16]


def run(tree: Path, model: Path, args: list[str], out: Path) -> str | None:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    result = subprocess.run([sys.executable, "-m", "trt_bridge", "convert", str(model), "-o", str(out), "-q",
                             *args], env=env, capture_output=True, text=True)
    return digest(out) if result.returncode == 0 else f"exit {result.returncode}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rev")
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "models")
    parser.add_argument("--keep", type=Path, help="write the outputs here (default: a temporary folder)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="same-outputs-") as tmp:
        tmp = Path(tmp)
        old_tree = tmp / "old"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old_tree), args.rev],
                       check=True, capture_output=True)
        try:
            work = args.keep or tmp / "work"
            work.mkdir(parents=True, exist_ok=True)
            differ = 0
            for name, model, extra in cases(args.shared, work):
                old = run(old_tree, model, extra, work / "old" / f"{name}.onnx")
                new = run(ROOT, model, extra, work / "new" / f"{name}.onnx")
                same = old == new and not str(old).startswith("exit")
                differ += not same
                print(f"{'same  ' if same else 'DIFFER'} {name:40s} {old}  {new}")
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old_tree)],
                           capture_output=True)
    print(f"{differ} case(s) differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
