"""trt-bridge vs NVIDIA ModelOpt ONNX INT8 PTQ on float models: accuracy and conversion time.

    python scripts/compare_modelopt.py --modelopt-python /path/to/modelopt-venv/bin/python
        [--ocr-models DIR]   # also the PP-OCR models of the rapidocr-onnxruntime 1.4.4 wheel

ModelOpt is a benchmark-only dependency with its own pins (onnxruntime-gpu, onnx, cupy,
torch): install it in a separate virtualenv, e.g.
    python -m venv mo && mo/bin/pip install torch==2.13.0 'nvidia-modelopt[onnx]'

For each float model both tools get the same calibration feeds (for ModelOpt stacked on
the batch axis in one .npz, as it expects) and are run as command-line tools in child
processes (wall time includes start-up for both):
    trt-bridge convert float.onnx --int8 --calib-data calib.npz
    python -m modelopt.onnx.quantization --onnx_path float.onnx --quantize_mode int8
        --calibration_data_path calib.npz --calibration_eps cpu --high_precision_dtype fp32
Both outputs are evaluated in onnxruntime on the same held-out feeds with Q/DQ simulated
in float (session.disable_quant_qdq: TensorRT's int32 arithmetic), as SNR in dB against
the float model, and parsed and built ahead of time by TensorRT-RTX for SM 8.9.
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnx.version_converter

from trt_bridge import samples
from trt_bridge.runtime.session import session
from trt_bridge.verification.metrics import snr_db

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "models"


def _models(ocr_dir: Path | None):
    """(name, float model path or ModelProto, input name, calibration feeds, held-out feeds)."""
    yield ("sample conv net", samples.conv_net(), "x", samples.image_feeds(32, 1), samples.image_feeds(32, 2))
    yield ("2-layer encoder (hidden 64)", samples.transformer_block(layers=2), "x",
           samples.sequence_feeds(32, 1, 16, 64), samples.sequence_feeds(16, 2, 16, 64))
    yield ("4-layer encoder (hidden 128)", samples.transformer_block(layers=4, hidden=128, heads=4), "x",
           samples.sequence_feeds(32, 1, 16, 128), samples.sequence_feeds(16, 2, 16, 128))
    if (SHARED / "mnist-12.onnx").is_file():
        yield ("ONNX zoo MNIST (float)", SHARED / "mnist-12.onnx", "Input3", samples.digit_feeds(32, 1),
               samples.digit_feeds(64, 2))
    if ocr_dir is not None:
        sys.path.insert(0, str(Path(__file__).parent))
        from measure_real_models import pages

        for file, shape in (("ch_ppocr_mobile_v2.0_cls_infer.onnx", (1, 3, 48, 192)),
                            ("ch_PP-OCRv4_rec_infer.onnx", (1, 3, 48, 320)),
                            ("ch_PP-OCRv4_det_infer.onnx", (1, 3, 320, 320))):
            path = ocr_dir / file
            if path.is_file():
                model = onnx.load(str(path))
                yield (file.removesuffix("_infer.onnx"), model, model.graph.input[0].name,
                       pages(16, 1, shape), pages(16, 2, shape))


def _fix_batch(model: onnx.ModelProto, shape: tuple[int, ...]) -> onnx.ModelProto:
    """Give the input fixed dims (both tools then calibrate and run the same shapes)."""
    import onnx_graphsurgeon as gs

    graph = gs.import_onnx(model)
    graph.inputs[0].shape = list(shape)
    graph.fold_constants().cleanup()
    fixed = gs.export_onnx(graph)
    if next(i.version for i in fixed.opset_import if i.domain in ("", "ai.onnx")) < 13:
        fixed = onnx.version_converter.convert_version(fixed, 13)
    return onnx.shape_inference.infer_shapes(fixed)


def _outputs(path: Path, name: str, feeds: np.ndarray) -> np.ndarray:
    sess = session(path)
    return np.concatenate([sess.run(None, {name: f})[0].ravel() for f in feeds])


def _run(cmd: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    return seconds, ("" if done.returncode == 0 else (done.stderr or done.stdout)[-600:])


def _builds(path: Path) -> str:
    from trt_bridge.tensorrt.build import build_engine
    from trt_bridge.tensorrt.parse import parse

    result = parse(path)
    if not result.ok:
        return "parse fails"
    try:
        build_engine(path, compute_capability="SM89")
        return "yes"
    except Exception as exc:  # noqa: BLE001 - report, don't stop the table
        return f"build fails ({str(exc)[:60]})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modelopt-python", required=True, help="python of a virtualenv with nvidia-modelopt[onnx]")
    parser.add_argument("--ocr-models", type=Path, help="folder with the PP-OCR float models")
    args = parser.parse_args()
    logging.getLogger().setLevel(logging.ERROR)
    trt_bridge_cli = [sys.executable, "-m", "trt_bridge"]
    print("| model | trt-bridge SNR dB | ModelOpt SNR dB | trt-bridge s | ModelOpt s "
          "| TRT-RTX builds (trt-bridge / ModelOpt) |")
    print("|---|---|---|---|---|---|")
    for name, model, input_name, calib, held_out in _models(args.ocr_models):
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            model = onnx.load(str(model)) if isinstance(model, Path) else model
            model = _fix_batch(model, calib.shape[1:])
            float_path = work / "float.onnx"
            onnx.save(model, str(float_path))
            np.savez(work / "calib.npz", **{input_name: calib})  # one feed per index of axis 0
            np.savez(work / "calib_stacked.npz", **{input_name: calib.reshape(-1, *calib.shape[2:])})
            ours, theirs = work / "trt_bridge.onnx", work / "modelopt.onnx"
            t_ours, err_ours = _run([*trt_bridge_cli, "convert", str(float_path), "--int8", "-o", str(ours),
                                     "--calib-data", str(work / "calib.npz"), "-q"])
            t_theirs, err_theirs = _run([args.modelopt_python, "-m", "modelopt.onnx.quantization", "--onnx_path",
                                         str(float_path), "--quantize_mode", "int8", "--calibration_data_path",
                                         str(work / "calib_stacked.npz"), "--calibration_eps", "cpu",
                                         "--high_precision_dtype", "fp32", "--output_path", str(theirs)])
            reference = _outputs(float_path, input_name, held_out)
            snr_ours = f"{snr_db(reference, _outputs(ours, input_name, held_out)):.2f}" if not err_ours else "failed"
            snr_theirs = (f"{snr_db(reference, _outputs(theirs, input_name, held_out)):.2f}" if not err_theirs
                          else "failed")
            builds = f"{_builds(ours) if not err_ours else '-'} / {_builds(theirs) if not err_theirs else '-'}"
            print(f"| {name} | {snr_ours} | {snr_theirs} | {t_ours:.1f} | {t_theirs:.1f} | {builds} |", flush=True)
            for who, err in (("trt-bridge", err_ours), ("ModelOpt", err_theirs)):
                if err:
                    print(f"<!-- {who} failed on {name}: {err.strip()} -->", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
