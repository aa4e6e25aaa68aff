"""`make demo`: the whole trt-bridge story on two built-in sample models, in one command.

For a small conv net and a 2-layer transformer encoder (built in code, nothing downloaded):

1. save the float model, calibration feeds (seed 1) and held-out evaluation feeds (seed 2);
2. quantize it with onnxruntime's quantize_dynamic (DynamicQuantizeLinear, ConvInteger, MatMulInteger);
3. show that TensorRT's ONNX parser rejects that model, and what `trt-bridge check` says about it;
4. convert it with the trt-bridge CLI into INT8 QuantizeLinear/DequantizeLinear;
5. show that TensorRT parses the result and builds an engine (TensorRT-RTX: ahead of time for SM 8.9, no GPU);
6. compare the accuracy of both models against the float model on the held-out feeds.

Everything is written under demo-output/ (removed and created afresh). Exits non-zero if a step fails.
Without TensorRT installed, steps 3 and 5 are skipped with a note.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnxruntime.quantization import QuantType, quantize_dynamic

from trt_bridge import samples
from trt_bridge.errors import MissingDependencyError, TrtBridgeError
from trt_bridge.runtime.session import session
from trt_bridge.verification.metrics import snr_db

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "demo-output"
STEPS = 6
SEQ, HIDDEN = 16, 64  # samples.transformer_block's defaults, spelled out for its feeds
COMPUTE_CAPABILITY, COMPUTE_CAPABILITY_TEXT = "SM89", "SM 8.9"  # an Ada GPU (RTX 40xx, L4, L40)
DYNAMIC_OPS = {"DynamicQuantizeLinear", "ConvInteger", "MatMulInteger"}


class StepFailed(Exception):
    """A demo step did not do what it should (the message says what)."""


@dataclass(frozen=True)
class Sample:
    name: str
    description: str
    build: Callable[[], onnx.ModelProto]
    feeds: Callable[[int, int], np.ndarray]  # (count, seed) -> [count, 1, ...]: one feed per index
    calib: int
    held_out: int
    classify: bool


SAMPLES = [
    Sample("conv_net", "image classifier: 3 Conv+Relu, global average pool, MatMul to 10 classes",
           samples.conv_net, lambda n, seed: samples.image_feeds(n, seed), calib=32, held_out=64, classify=True),
    Sample("transformer", f"2-layer pre-LayerNorm transformer encoder (hidden {HIDDEN}, 4 heads, seq {SEQ})",
           lambda: samples.transformer_block(layers=2, hidden=HIDDEN, seq=SEQ),
           lambda n, seed: samples.sequence_feeds(n, seed, SEQ, HIDDEN), calib=32, held_out=32, classify=False),
]


@dataclass
class Result:
    name: str
    dynamic_parses: bool | None = None
    converted_parses: bool | None = None
    engine_kib: float | None = None
    build_s: float | None = None
    snr_dynamic: float | None = None
    snr_int8: float | None = None
    top1_dynamic: float | None = None
    top1_int8: float | None = None
    failures: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------- output helpers

def banner(text: str) -> None:
    print("\n" + "=" * 100 + f"\n  {text}\n" + "=" * 100, flush=True)


def step(number: int, text: str) -> None:
    print(f"\n--- [{number}/{STEPS}] {text} " + "-" * max(3, 88 - len(text)), flush=True)


def rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def op_counts(path: Path) -> str:
    counts: dict[str, int] = {}
    for node in onnx.load(str(path), load_external_data=False).graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return ", ".join(f"{op} x{n}" if n > 1 else op for op, n in sorted(counts.items()))


# ---------------------------------------------------------------------------------------------- TensorRT

@dataclass(frozen=True)
class TensorRT:
    module: str
    version: str
    rtx: bool
    parse: Callable
    build_engine: Callable


def find_tensorrt() -> TensorRT | None:
    """TensorRT-RTX if installed (it builds ahead of time without a GPU), else datacenter TensorRT, else None."""
    from trt_bridge.tensorrt import import_tensorrt, is_rtx

    try:
        try:
            trt = import_tensorrt("tensorrt_rtx")
        except MissingDependencyError:
            trt = import_tensorrt()
    except MissingDependencyError:
        return None
    from trt_bridge.tensorrt.build import build_engine
    from trt_bridge.tensorrt.parse import parse

    return TensorRT(trt.__name__, trt.__version__, is_rtx(trt), parse, build_engine)


def print_parse_errors(errors: list[str], limit: int = 4) -> None:
    for error in errors[:limit]:
        print(f"    {error}")
    if len(errors) > limit:
        print(f"    ... and {len(errors) - limit} more")


# ---------------------------------------------------------------------------------------------- the steps

def run_model(path: Path, feeds: np.ndarray) -> np.ndarray:
    """Outputs for every feed (one at a time, batch 1), stacked. Q/DQ runs as TensorRT computes it (float)."""
    sess = session(path)
    name = sess.get_inputs()[0].name
    return np.concatenate([sess.run(None, {name: feed})[0] for feed in feeds])


def prepare(sample: Sample, folder: Path) -> dict[str, Path]:
    paths = {k: folder / f for k, f in (("float", "float.onnx"), ("dynamic", "dynamic.onnx"),
                                        ("int8", "int8.onnx"), ("calib", "calib.npz"), ("eval", "eval.npz"),
                                        ("report", "report.json"), ("engine", "int8.engine"))}
    step(1, "the float model and its data")
    model = sample.build()
    params = sum(int(np.prod(i.dims)) for i in model.graph.initializer)
    onnx.save(model, str(paths["float"]))
    print(f"  {rel(paths['float'])}: {len(model.graph.node)} nodes, {params:,} parameters")
    calib, held_out = sample.feeds(sample.calib, 1), sample.feeds(sample.held_out, 2)
    np.savez(paths["calib"], x=calib)
    np.savez(paths["eval"], x=held_out)
    print(f"  {rel(paths['calib'])}: calibration feeds, 'x' {list(calib.shape)} (one feed per index, seed 1)")
    print(f"  {rel(paths['eval'])}: held-out evaluation feeds, 'x' {list(held_out.shape)} (seed 2)")

    step(2, "quantize with onnxruntime: quantize_dynamic(per_channel=False, weight_type=QUInt8)")
    quantize_dynamic(str(paths["float"]), str(paths["dynamic"]), per_channel=False, weight_type=QuantType.QUInt8)
    print(f"  {rel(paths['dynamic'])}: {op_counts(paths['dynamic'])}")
    print("  activations are quantized at run time (DynamicQuantizeLinear computes each scale per inference)")
    return paths


def parse_dynamic(trt: TensorRT | None, paths: dict[str, Path], result: Result) -> None:
    step(3, "TensorRT's ONNX parser and `trt-bridge check` on the dynamic model")
    args = ["check", rel(paths["dynamic"]), "--quiet"]
    print("  $ trt-bridge " + " ".join(args), flush=True)
    child = subprocess.run([sys.executable, "-m", "trt_bridge", *args], cwd=ROOT, capture_output=True, text=True)
    if child.returncode != 1:
        raise StepFailed(f"trt-bridge check exited with {child.returncode}, not 1 (not ready): {child.stderr}")
    print("  " + child.stdout.strip())
    if trt is None:
        print("  TensorRT's own parser: skipped, TensorRT is not installed (see the note at the top)")
        return
    parsed = trt.parse(paths["dynamic"], module=trt.module)
    result.dynamic_parses = parsed.ok
    if parsed.ok:
        print(f"  accepted ({parsed.layers} layers): this TensorRT imports the dynamic ops itself")
        return
    print(f"  REJECTED, as expected ({len(parsed.errors)} errors):")
    print_parse_errors(parsed.errors)


def convert_with_cli(paths: dict[str, Path]) -> None:
    step(4, "convert with the trt-bridge CLI")
    args = ["convert", rel(paths["dynamic"]), "--int8", "-o", rel(paths["int8"]),
            "--calib-data", rel(paths["calib"]), "--report", rel(paths["report"])]
    print("  $ trt-bridge " + " ".join(args), flush=True)
    child = subprocess.run([sys.executable, "-m", "trt_bridge", *args], cwd=ROOT)
    if child.returncode != 0:
        raise StepFailed(f"trt-bridge convert exited with status {child.returncode}")
    if not paths["int8"].is_file():
        raise StepFailed(f"trt-bridge convert wrote no {rel(paths['int8'])}")
    print(f"  {rel(paths['int8'])}: {op_counts(paths['int8'])}")
    left = DYNAMIC_OPS & {n.op_type for n in onnx.load(str(paths["int8"])).graph.node}
    if left:
        raise StepFailed(f"the converted model still has {', '.join(sorted(left))}")


def build(trt: TensorRT | None, paths: dict[str, Path], result: Result) -> None:
    target = f"ahead of time for {COMPUTE_CAPABILITY_TEXT}" if trt is None or trt.rtx else "for this machine's GPU"
    step(5, f"TensorRT parses the converted model and builds an INT8 engine {target}")
    if trt is None:
        print("  skipped: TensorRT is not installed (see the note at the top)")
        return
    parsed = trt.parse(paths["int8"], module=trt.module)
    result.converted_parses = parsed.ok
    if not parsed.ok:
        print(f"  REJECTED ({len(parsed.errors)} errors):")
        print_parse_errors(parsed.errors)
        raise StepFailed("TensorRT's parser rejected the converted model")
    print(f"  parser: accepted ({parsed.layers} layers)")
    start = time.perf_counter()
    engine = trt.build_engine(paths["int8"], compute_capability=COMPUTE_CAPABILITY if trt.rtx else None,
                              module=trt.module)
    result.build_s = time.perf_counter() - start
    paths["engine"].write_bytes(engine)
    result.engine_kib = len(engine) / 1024
    print(f"  engine: {result.engine_kib:,.0f} KiB, built in {result.build_s:.1f} s -> {rel(paths['engine'])}")


def accuracy(sample: Sample, paths: dict[str, Path], result: Result) -> None:
    held_out = np.load(paths["eval"])["x"]
    step(6, f"accuracy on {len(held_out)} held-out feeds, against the float model (onnxruntime)")
    reference = run_model(paths["float"], held_out)
    dynamic = run_model(paths["dynamic"], held_out)
    converted = run_model(paths["int8"], held_out)
    result.snr_dynamic, result.snr_int8 = snr_db(reference, dynamic), snr_db(reference, converted)
    if not np.isfinite(converted).all():
        raise StepFailed("the converted model computes non-finite values")
    print("  SNR, higher is better (every 6 dB is one more bit of agreement):")
    print(f"    onnxruntime dynamic model    {result.snr_dynamic:6.2f} dB")
    print(f"    trt-bridge INT8 Q/DQ model   {result.snr_int8:6.2f} dB")
    if sample.classify:
        labels = np.argmax(reference, axis=-1)
        result.top1_dynamic = float(np.mean(labels == np.argmax(dynamic, axis=-1)))
        result.top1_int8 = float(np.mean(labels == np.argmax(converted, axis=-1)))
        print("  top-1 agreement with the float model's class:")
        print(f"    onnxruntime dynamic model    {result.top1_dynamic:6.1%}")
        print(f"    trt-bridge INT8 Q/DQ model   {result.top1_int8:6.1%}")


def attempt(result: Result, what: str, action: Callable[[], None]) -> bool:
    """Run one step; on failure say so (with the traceback for unexpected errors) and record it."""
    try:
        action()
        return True
    except (StepFailed, TrtBridgeError) as exc:
        print(f"  FAILED ({what}): {exc}", flush=True)
    except Exception as exc:
        print(f"  FAILED ({what}): {type(exc).__name__}: {exc}", flush=True)
        print(traceback.format_exc(), flush=True)
    result.failures.append(what)
    return False


def demo(sample: Sample, trt: TensorRT | None) -> Result:
    banner(f"{sample.name}: {sample.description}")
    result = Result(sample.name)
    folder = OUT / sample.name
    folder.mkdir(parents=True)
    paths: dict[str, Path] = {}
    if not attempt(result, "float model and quantize_dynamic", lambda: paths.update(prepare(sample, folder))):
        return result
    attempt(result, "parse the dynamic model", lambda: parse_dynamic(trt, paths, result))
    if not attempt(result, "trt-bridge convert", lambda: convert_with_cli(paths)):
        return result
    attempt(result, "TensorRT parse and build", lambda: build(trt, paths, result))
    attempt(result, "accuracy", lambda: accuracy(sample, paths, result))
    return result


# ---------------------------------------------------------------------------------------------- summary

def summary(results: list[Result], trt: TensorRT | None) -> None:
    def yes_no(value: bool | None) -> str:
        return "-" if value is None else ("yes" if value else "no")

    def num(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    banner("summary")
    header = (f"  {'model':<13}{'TensorRT parses':^22}{'engine':>9}{'SNR vs float (dB)':^22}{'top-1 agreement':^20}\n"
              f"  {'':<13}{'dynamic':>10}{'converted':>12}{'KiB':>9}{'dynamic':>11}{'INT8':>11}"
              f"{'dynamic':>10}{'INT8':>10}")
    print("\n".join(line.rstrip() for line in header.splitlines()))
    for r in results:
        print(f"  {r.name:<13}{yes_no(r.dynamic_parses):>10}{yes_no(r.converted_parses):>12}"
              f"{num(r.engine_kib, ',.0f'):>9}{num(r.snr_dynamic, '.2f'):>11}{num(r.snr_int8, '.2f'):>11}"
              f"{num(r.top1_dynamic, '.1%'):>10}{num(r.top1_int8, '.1%'):>10}")
    if trt is None:
        print("\n  TensorRT steps were skipped. To see them: pip install 'trt-bridge[rtx]'")


def main() -> int:
    start = time.perf_counter()
    logging.getLogger().setLevel(logging.ERROR)  # quantize_dynamic's advice to pre-process, on the root logger
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir()
    print("trt-bridge demo: onnxruntime quantize_dynamic models -> TensorRT-ready INT8 Q/DQ")
    print(f"outputs go to {rel(OUT)}/")
    trt = find_tensorrt()
    if trt is None:
        print("\nNOTE: TensorRT is not installed, so the TensorRT steps (3 and 5) are skipped.\n"
              "      Install TensorRT-RTX (its parser and builder run without a GPU) to see them:\n"
              "          pip install 'trt-bridge[rtx]'")
    else:
        how = "ahead-of-time builds, no GPU needed" if trt.rtx else "builds for this machine's GPU"
        print(f"TensorRT: {trt.module} {trt.version} ({how})")

    results = [demo(sample, trt) for sample in SAMPLES]
    summary(results, trt)
    failed = [f"{r.name}: {what}" for r in results for what in r.failures]
    print()
    if failed:
        print(f"FAILED after {time.perf_counter() - start:.1f} s: " + "; ".join(failed))
        return 1
    print(f"done in {time.perf_counter() - start:.1f} s; every file is in {rel(OUT)}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
