"""Open `verify --html`'s page in headless Chromium and check from the screenshot that the plot shows.

    python scripts/verify_html_screenshot.py [--out DIR] [--chromium /usr/bin/chromium]

Builds the sample conv net, converts its quantize_dynamic form, breaks one activation scale (so the
per-layer plot has something to show), runs `trt-bridge verify --per-layer --html`, takes a
screenshot with Chromium (Debian's `chromium` package: `apt-get install chromium`) and checks the
PNG: the plot's line (blue) and its quantized-layer markers (orange) must be on screen. Exits 1
when they are not, 2 when Chromium is missing. The PNG is kept in --out for a look.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

LINE, MARKER = (0x4A, 0x78, 0xB5), (0xE0, 0x7B, 0x00)  # the colours trt_bridge/verification/html.py draws with


def pixels_near(image: np.ndarray, rgb: tuple[int, int, int], tolerance: int = 40) -> int:
    target = np.array(rgb, np.float64) / 255.0
    distance = np.abs(image[..., :3].astype(np.float64) - target).max(axis=-1)
    return int(np.sum(distance <= tolerance / 255.0))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "demo-output" / "verify-html")
    parser.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser"))
    args = parser.parse_args()
    if not args.chromium:
        print("Chromium is not installed (Debian: apt-get install chromium)", file=sys.stderr)
        return 2
    from helpers import quantize_dynamic, save
    from test_verify import _break_one_scale

    from trt_bridge import samples
    from trt_bridge.conversion import convert
    from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        fpath = save(samples.conv_net(), tmp / "float.onnx")
        dyn = quantize_dynamic(fpath, tmp / "dynamic.onnx")
        np.savez(tmp / "calib.npz", x=samples.image_feeds(16, 1))
        np.savez(tmp / "eval.npz", x=samples.image_feeds(12, 2))
        convert(dyn, tmp / "int8.onnx", ConvertOptions(calibration=CalibrationOptions(data=str(tmp / "calib.npz")),
                                                       progress=False))
        _break_one_scale(tmp / "int8.onnx", tmp / "broken.onnx", "conv2_quant/float", 25.0)
        page = args.out / "report.html"
        subprocess.run([sys.executable, "-m", "trt_bridge", "verify", str(fpath), str(tmp / "broken.onnx"),
                        "--data", str(tmp / "eval.npz"), "--per-layer", "--html", str(page), "-q"], check=False)
    shot = args.out / "report.png"
    shot.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([args.chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                        "--no-first-run", "--disable-background-networking", "--disable-component-update",
                        "--disable-sync", f"--user-data-dir={profile}", "--hide-scrollbars",
                        "--window-size=1200,1300", f"--screenshot={shot}", page.resolve().as_uri()],
                       check=True, capture_output=True, timeout=120)
    import matplotlib.image

    image = matplotlib.image.imread(str(shot))
    line, markers = pixels_near(image, LINE), pixels_near(image, MARKER)
    print(f"{shot}: {image.shape[1]}x{image.shape[0]}, plot line pixels {line}, marker pixels {markers}")
    if line < 200 or markers < 50:
        print("the plot is not visible in the screenshot", file=sys.stderr)
        return 1
    print("the plot is visible")
    return 0


if __name__ == "__main__":
    sys.exit(main())
