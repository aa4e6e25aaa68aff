"""ModelOpt's own FP8 exports as trt-bridge sources (issue 38): regenerate them, convert, verify, build.

    python scripts/modelopt_sources.py [--modelopt-python /work/venvs/modelopt/bin/python] [--work DIR]
        [--only bert cnn ppocr-det] [--json FILE]

ModelOpt is a benchmark-only tool with its own pins: its virtualenv (``pip install "nvidia-modelopt[onnx]"
torch==2.13.0``, CPU torch) is made by :mod:`venvs` on first use unless ``--modelopt-python`` names one. Its
python also exports the float models: a 2-layer BERT-like encoder (word and position embeddings, an additive
attention mask, GELU; seeded weights, ``torch.onnx.export``) and a small YOLO-like CNN (Conv-BN-SiLU, Concat,
nearest Resize); the third is the PP-OCRv4 text detector of the ``rapidocr-onnxruntime`` 1.4.4 wheel (pip
download; its input fixed to 1x3x320x320). Each goes through ``python -m modelopt.onnx.quantization
--quantize_mode fp8 --calibration_eps cpu`` on 16 calibration feeds (a copy: ModelOpt rewrites its input) as

- ``fp16``: ``--high_precision_dtype fp16`` (ModelOpt's default: float16 everywhere, float32 at the interface);
- ``fp16, fp32 MatMul/Conv``: ``--op_types_to_exclude_fp16`` the model's weighted op (float32 layers behind a
  Cast after each DequantizeLinear, float16 around them);
- ``fp32``: ``--high_precision_dtype fp32``.

then ``trt-bridge convert SOURCE`` (no flags). Cells: SNR in dB on 8 held-out feeds of the ModelOpt source and of
the conversion against the float model, and of the conversion against the source (onnxruntime, Q/DQ simulated in
float as TensorRT computes), the FP8 layers the conversion keeps (weights behind a DequantizeLinear / weighted
layers), and whether TensorRT-RTX builds it ahead of time for SM 8.9.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

#: the float models' exporter, run by ModelOpt's python (torch is there, not in trt-bridge's environment)
EXPORT = r'''
import sys, torch, torch.nn as nn, torch.nn.functional as F
out = sys.argv[1]
torch.manual_seed(0)
class Layer(nn.Module):
    def __init__(s, h, heads):
        super().__init__(); s.n = heads
        s.qkv, s.o = nn.Linear(h, 3 * h), nn.Linear(h, h)
        s.ln1, s.ln2, s.f1, s.f2 = nn.LayerNorm(h), nn.LayerNorm(h), nn.Linear(h, 4 * h), nn.Linear(4 * h, h)
    def forward(s, x, bias):
        B, T, H = x.shape
        q, k, v = (t.view(B, T, s.n, H // s.n).transpose(1, 2) for t in s.qkv(x).split(H, -1))
        a = ((q @ k.transpose(-1, -2)) / (H // s.n) ** 0.5 + bias).softmax(-1) @ v
        x = s.ln1(x + s.o(a.transpose(1, 2).reshape(B, T, H)))
        return s.ln2(x + s.f2(F.gelu(s.f1(x))))
class Bert(nn.Module):
    def __init__(s, vocab=1000, h=64, heads=4, layers=2, T=32):
        super().__init__()
        s.emb, s.pos, s.ln = nn.Embedding(vocab, h), nn.Embedding(T, h), nn.LayerNorm(h)
        s.layers, s.cls = nn.ModuleList(Layer(h, heads) for _ in range(layers)), nn.Linear(h, 2)
    def forward(s, ids, mask):
        x = s.ln(s.emb(ids) + s.pos(torch.arange(ids.shape[1]).unsqueeze(0)))
        bias = (1.0 - mask[:, None, None, :].float()) * -10000.0
        for layer in s.layers:
            x = layer(x, bias)
        return s.cls(x[:, 0])
class CNN(nn.Module):
    def __init__(s):
        super().__init__()
        c = lambda i, o, st=1: nn.Sequential(nn.Conv2d(i, o, 3, st, 1), nn.BatchNorm2d(o), nn.SiLU())
        s.a, s.b, s.c, s.d, s.head = c(3, 16, 2), c(16, 32, 2), c(32, 32), c(64, 32), nn.Conv2d(32, 8, 1)
    def forward(s, x):
        x = s.b(s.a(x))
        z = s.d(torch.cat([x, s.c(x)], 1))
        return s.head(F.interpolate(z, scale_factor=2.0, mode="nearest"))
bert, cnn = Bert().eval(), CNN().eval()
with torch.no_grad():
    for m in cnn.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2); m.running_var.uniform_(0.5, 1.5)
ids, mask = torch.randint(0, 1000, (1, 32)), torch.ones(1, 32, dtype=torch.int64)
torch.onnx.export(bert, (ids, mask), f"{out}/bert.onnx", input_names=["input_ids", "attention_mask"],
                  output_names=["logits"], opset_version=17, dynamo=False)
torch.onnx.export(cnn, (torch.randn(1, 3, 64, 64),), f"{out}/cnn.onnx", input_names=["images"],
                  output_names=["out"], opset_version=17, dynamo=False)
'''

#: name → (float file, weighted op ModelOpt's fp32 variant keeps float32, feeds(count, seed))
MODELS = {
    "bert": ("bert.onnx", "MatMul", lambda n, s: _bert_feeds(n, s)),
    "cnn": ("cnn.onnx", "Conv", lambda n, s: {"images": np.random.default_rng(s).standard_normal(
        (n, 1, 3, 64, 64)).astype(np.float32)}),
    "ppocr-det": ("ppocr-det.onnx", "Conv", lambda n, s: {"x": _pages(n, s)}),
}
VARIANTS = {"fp16": ["--high_precision_dtype", "fp16"],
            "fp16, fp32 {op}": ["--high_precision_dtype", "fp16", "--op_types_to_exclude_fp16", "{op}"],
            "fp32": ["--high_precision_dtype", "fp32"]}


def _bert_feeds(count: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    mask = np.ones((count, 1, 32), np.int64)
    for i, length in enumerate(rng.integers(8, 33, count)):
        mask[i, 0, length:] = 0
    return {"input_ids": rng.integers(0, 1000, (count, 1, 32)).astype(np.int64), "attention_mask": mask}


def _pages(count: int, seed: int) -> np.ndarray:
    from measure_real_models import pages

    return pages(count, seed, (1, 3, 320, 320)).astype(np.float32)


def modelopt_python(given: str | None) -> Path:
    if given:
        return Path(given)
    from venvs import venv_python

    folder = ROOT / ".corpus" / "venvs" / "modelopt"
    python = venv_python(folder, ["torch==2.13.0", "nvidia-modelopt[onnx]"], "modelopt")
    if python is None:
        raise SystemExit("ModelOpt did not install; give --modelopt-python")
    return python


def float_models(python: Path, work: Path) -> None:
    """bert.onnx and cnn.onnx exported by torch, ppocr-det.onnx from the rapidocr wheel (input 1x3x320x320)."""
    if not (work / "bert.onnx").is_file() or not (work / "cnn.onnx").is_file():
        script = work / "export.py"
        script.write_text(EXPORT)
        subprocess.run([str(python), str(script), str(work)], check=True, capture_output=True)
    if not (work / "ppocr-det.onnx").is_file():
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
                        "-d", str(work), "rapidocr-onnxruntime==1.4.4"], check=True)
        wheel = next(work.glob("rapidocr_onnxruntime-1.4.4-*.whl"))
        with zipfile.ZipFile(wheel) as whl:
            member = next(m for m in whl.namelist() if "/models/" in m and "det" in m and m.endswith(".onnx"))
            model = onnx.load_from_string(whl.read(member))
        for dim, size in zip(model.graph.input[0].type.tensor_type.shape.dim, (1, 3, 320, 320)):
            dim.Clear()
            dim.dim_value = size
        onnx.save(model, str(work / "ppocr-det.onnx"))


def modelopt_fp8(python: Path, float_path: Path, calib: Path, out: Path, extra: list[str]) -> str | None:
    """ModelOpt's FP8 export of a copy of ``float_path`` (it rewrites its input); None, or its last error line."""
    copy = out.with_suffix(".input.onnx")
    shutil.copy(float_path, copy)
    done = subprocess.run([str(python), "-m", "modelopt.onnx.quantization", "--onnx_path", str(copy),
                           "--quantize_mode", "fp8", "--calibration_data_path", str(calib), "--calibration_eps",
                           "cpu", "--output_path", str(out), *extra], capture_output=True, text=True)
    if done.returncode != 0 or not out.is_file():
        return (done.stderr.strip().splitlines() or ["no output"])[-1][:120]
    return None


def _outputs(path: Path, feeds: dict) -> np.ndarray:
    from trt_bridge.runtime.session import session

    sess = session(path, simulate_qdq=True)
    count = len(next(iter(feeds.values())))
    return np.concatenate([np.asarray(sess.run(None, {k: v[i] for k, v in feeds.items()})[0], np.float64).ravel()
                           for i in range(count)])


def fp8_layers(path: Path) -> str:
    """'kept/weighted': the Conv/MatMul/Gemm whose constant weight a DequantizeLinear gives, of those with one."""
    model = onnx.load(str(path))
    producers = {o: n for n in model.graph.node for o in n.output}
    constants = {i.name for i in model.graph.initializer} | {
        n.output[0] for n in model.graph.node if n.op_type == "Constant"}
    weighted = kept = 0
    for node in model.graph.node:
        if node.op_type not in ("Conv", "MatMul", "Gemm") or len(node.input) < 2:
            continue
        w = producers.get(node.input[1])
        while w is not None and w.op_type == "Cast":
            w = producers.get(w.input[0])
        if w is not None and w.op_type == "DequantizeLinear" and _constant_codes(w, producers, constants):
            weighted, kept = weighted + 1, kept + 1
        elif node.input[1] in constants or (w is not None and w.input and w.input[0] in constants):
            weighted += 1
    return f"{kept}/{weighted}"


def _constant_codes(dq, producers: dict, constants: set) -> bool:
    """Whether ``dq`` dequantizes a weight: constant codes, or a QuantizeLinear of a constant (ModelOpt's fp16)."""
    codes = dq.input[0]
    q = producers.get(codes)
    return codes in constants or (q is not None and q.op_type == "QuantizeLinear" and q.input[0] in constants)


def measure(name: str, python: Path, work: Path) -> list[dict]:
    from trt_bridge.conversion import convert
    from trt_bridge.conversion.options import ConvertOptions
    from trt_bridge.tensorrt.build import build_engine
    from trt_bridge.verification.metrics import snr_db

    file, op, feeds = MODELS[name]
    float_path = work / file
    calib = work / f"{name}.calib.npz"
    np.savez(calib, **{k: v.reshape(-1, *v.shape[2:]) for k, v in feeds(16, 1).items()})
    held = feeds(8, 2)
    reference = _outputs(float_path, held)
    rows = []
    for label, extra in VARIANTS.items():
        label, extra = label.format(op=op), [a.format(op=op) for a in extra]
        source = work / f"{name}.{label.replace(', ', '-').replace(' ', '-')}.fp8.onnx"
        row = {"model": name, "ModelOpt": label}
        failed = None if source.is_file() else modelopt_fp8(python, float_path, calib, source, extra)
        if failed:
            rows.append({**row, "error": f"ModelOpt: {failed}"})
            continue
        out = source.with_suffix(".trt.onnx")
        try:
            convert(source, out, ConvertOptions(check=False, progress=False))
        except Exception as exc:  # noqa: BLE001 - a row of the table, not the end of it
            rows.append({**row, "source layers": fp8_layers(source), "error": str(exc).splitlines()[0][:160]})
            continue
        by_source, converted = _outputs(source, held), _outputs(out, held)
        try:
            built = f"ok ({len(build_engine(out, compute_capability='SM89')) // 1024} KiB)"
        except Exception as exc:  # noqa: BLE001
            built = f"FAILED: {str(exc).splitlines()[0][:80]}"
        rows.append({**row, "source vs float": snr_db(reference, by_source),
                     "converted vs float": snr_db(reference, converted),
                     "converted vs source": snr_db(by_source, converted),
                     "source layers": fp8_layers(source), "converted layers": fp8_layers(out), "build SM 8.9": built})
    return rows


def table(rows: list[dict]) -> str:
    columns = ["model", "ModelOpt", "source vs float", "converted vs float", "converted vs source",
               "source layers", "converted layers", "build SM 8.9"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['model']} | {row['ModelOpt']} | {row['error']} |")
            continue
        cells = [f"{row[c]:.2f}" if isinstance(row[c], float) else str(row[c]) for c in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modelopt-python", help="python of a venv with nvidia-modelopt[onnx] (default: made)")
    parser.add_argument("--work", type=Path, help="folder for the models (default: a temporary one)")
    parser.add_argument("--only", nargs="+", choices=sorted(MODELS), default=list(MODELS))
    parser.add_argument("--json", type=Path, help="also write the rows as JSON")
    args = parser.parse_args()
    python = modelopt_python(args.modelopt_python)
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        float_models(python, work)
        rows = [row for name in args.only for row in measure(name, python, work)]
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
