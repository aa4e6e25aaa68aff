"""`make demo`: the whole story on two embedded samples, in one command.

For a small conv net and a 2-layer transformer encoder (built in code, no download):
quantize with onnxruntime's quantize_dynamic, show that TensorRT's parser rejects the
result, convert it with the trt-bridge CLI, show that TensorRT-RTX parses it and builds
an engine ahead of time (no GPU needed), and compare accuracy against the float model.
Everything is written under demo-output/.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnxruntime.quantization import QuantType, quantize_dynamic

from trt_bridge import samples
from trt_bridge.convert import snr_db
from trt_bridge.errors import MissingDependencyError
from trt_bridge.runtime import session

OUT = Path(__file__).resolve().parents[1] / "demo-output"


def heading(text: str) -> None:
    print(f"\n=== {text} " + "=" * max(0, 72 - len(text)), flush=True)


def run_model(path: Path, feeds: np.ndarray) -> np.ndarray:
    sess = session(path)
    name = sess.get_inputs()[0].name
    return np.concatenate([sess.run(None, {name: f})[0] for f in feeds])


def tensorrt_tools():
    try:
        from trt_bridge.tensorrt import import_tensorrt
        from trt_bridge.tensorrt.build import build_engine, parse

        trt = import_tensorrt()
        return trt, parse, build_engine
    except MissingDependencyError as exc:
        print(f"note: TensorRT steps skipped: {exc}")
        return None, None, None


def demo(name: str, model: onnx.ModelProto, calib: np.ndarray, held_out: np.ndarray, classify: bool) -> bool:
    heading(f"{name}: float model → onnxruntime quantize_dynamic")
    folder = OUT / name
    folder.mkdir(parents=True)
    float_path, dynamic_path = folder / "float.onnx", folder / "dynamic.onnx"
    converted_path, calib_path = folder / "int8.onnx", folder / "calib.npz"
    onnx.save(model, str(float_path))
    logging.getLogger().setLevel(logging.ERROR)  # quantize_dynamic's advice to pre-process, on the root logger
    quantize_dynamic(str(float_path), str(dynamic_path), weight_type=QuantType.QUInt8)
    ops = sorted({n.op_type for n in onnx.load(str(dynamic_path)).graph.node})
    print(f"{dynamic_path.relative_to(OUT.parent)}: {', '.join(ops)}")
    np.savez(calib_path, x=calib)

    trt, parse, build_engine = tensorrt_tools()
    if trt is not None:
        heading(f"{name}: TensorRT ({trt.__name__} {trt.__version__}) parses the dynamic model")
        result = parse(dynamic_path)
        print("accepted" if result.ok else "REJECTED:")
        for error in result.errors[:3]:
            print(f"  {error}")
        if len(result.errors) > 3:
            print(f"  ... {len(result.errors) - 3} more")

    heading(f"{name}: trt-bridge convert")
    command = [sys.executable, "-m", "trt_bridge", "convert", str(dynamic_path), "--int8", "-o", str(converted_path),
               "--calib-data", str(calib_path), "--report", str(folder / "report.json")]
    print("$ trt-bridge " + " ".join(str(Path(c).relative_to(OUT.parent)) if c.startswith(str(OUT)) else c
                                     for c in command[3:]))
    if subprocess.run(command).returncode != 0:
        print("conversion failed")
        return False

    ok = True
    if trt is not None:
        heading(f"{name}: TensorRT parses the converted model and builds an INT8 engine (SM 8.9, ahead of time)")
        result = parse(converted_path)
        print(f"parser: {'accepted' if result.ok else 'REJECTED'} ({result.layers} layers)")
        for error in result.errors[:3]:
            print(f"  {error}")
        ok = result.ok
        if ok:
            start = time.perf_counter()
            engine = build_engine(converted_path, compute_capability="SM89")
            (folder / "int8.engine").write_bytes(engine)
            print(f"engine: {len(engine) / 1024:.0f} KiB in {time.perf_counter() - start:.1f} s "
                  f"-> {(folder / 'int8.engine').relative_to(OUT.parent)}")

    heading(f"{name}: accuracy on {len(held_out)} held-out inputs (SNR against the float model, higher is better)")
    reference = run_model(float_path, held_out)
    dynamic, converted = run_model(dynamic_path, held_out), run_model(converted_path, held_out)
    print(f"onnxruntime dynamic model : {snr_db(reference, dynamic):6.2f} dB")
    print(f"trt-bridge INT8 model     : {snr_db(reference, converted):6.2f} dB")
    if classify:
        for label, out in (("dynamic", dynamic), ("INT8", converted)):
            agree = np.mean(np.argmax(reference, axis=-1) == np.argmax(out, axis=-1))
            print(f"top-1 agreement with float ({label}): {agree:.1%}")
    return ok


def main() -> int:
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir()
    ok = demo("conv_net", samples.conv_net(), samples.image_feeds(32, seed=1), samples.image_feeds(64, seed=2),
              classify=True)
    ok &= demo("transformer", samples.transformer_block(layers=2), samples.sequence_feeds(32, 1, 16, 64)[:, 0],
               samples.sequence_feeds(32, 2, 16, 64), classify=False)
    heading("done" if ok else "FAILED")
    print(f"outputs in {OUT}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
