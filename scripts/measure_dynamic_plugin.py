"""How the DynamicInt8Gemm plugin (``convert --activations dynamic``) compares with its source and with static
INT8, on the corpus's dynamically quantized transformers (issue 18's measurements; a benchmark, not a test).

For each dynamic source (the corpus's onnxruntime and Intel Neural Compressor dynamic models, and
``quantize_dynamic`` int8 / uint8 / per-channel of the corpus's float models), it converts three ways:

- ``plugin-tensor``: ``--activations dynamic`` (the source's exact math): is the onnxruntime reference of the
  converted model bit-identical to the source, with onnxruntime's graph optimizations at the basic level (the
  ops' own semantics) and at its default level (which fuses the source and the converted model differently
  around normalizations)?
- ``plugin-token``: ``--activations dynamic --dynamic-granularity token``;
- ``static``: calibrated INT8 Q/DQ (``--calib-data`` the corpus's calibration feeds);

and scores each against the float model on the held-out feeds (SNR in dB), with how many of the source's
MatMulIntegers became plugin nodes, the conversion time, and whether TensorRT-RTX builds it for SM 8.9.

    python scripts/measure_dynamic_plugin.py [--json out.json] [--corpus tests/data/corpus]
    python scripts/measure_dynamic_plugin.py --corpus .corpus   # after `make corpus`: real-weight MiniLM
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]


def feeds_of(path: Path) -> list[dict]:
    data = dict(np.load(path))
    return [{k: v[i] for k, v in data.items()} for i in range(len(next(iter(data.values()))))]


def outputs(model, feeds, level=None) -> list[np.ndarray]:
    import onnxruntime as ort

    from trt_bridge.runtime.session import create_session

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if level is not None:
        options.graph_optimization_level = level
    sess = create_session(str(model), options)
    names = {i.name for i in sess.get_inputs()}
    return [np.asarray(sess.run(None, {k: v for k, v in f.items() if k in names})[0]) for f in feeds]


def snr(reference, test) -> float:
    from trt_bridge.verification.metrics import snr_db

    return float(snr_db(np.concatenate([r.ravel() for r in reference]), np.concatenate([t.ravel() for t in test])))


def sources(corpus: Path, work: Path) -> list[tuple[str, str, Path]]:
    """(name, arch, path) of every dynamic source: the corpus's, and quantize_dynamic's of its float models."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # the suite's slice keeps each quantizer's folder at the top, `make corpus` under quantized/
    found = [(f"{p.parent.name}/{p.stem}", p.stem, p)
             for p in sorted([*corpus.glob("*dynamic*/*.onnx"), *corpus.glob("quantized/*dynamic*/*.onnx")])]
    for float_model in sorted((corpus / "float").glob("*.onnx")):
        for tag, kwargs in (("int8", {}), ("uint8", {"weight_type": QuantType.QUInt8}),
                            ("per-channel", {"per_channel": True})):
            out = work / f"{float_model.stem}.{tag}.onnx"
            quantize_dynamic(str(float_model), str(out), **kwargs)
            found.append((f"quantize_dynamic-{tag}/{float_model.stem}", float_model.stem, out))
    return found


def measure(name: str, arch: str, source: Path, corpus: Path, work: Path) -> dict:
    import onnxruntime as ort

    from trt_bridge.conversion import convert
    from trt_bridge.conversion.options import ActivationOptions, CalibrationOptions, ConvertOptions
    from trt_bridge.errors import CalibrationDataError
    from trt_bridge.tensorrt.build import build_engine

    held_out = feeds_of(corpus / "float" / f"{arch}.eval.npz")
    reference = outputs(corpus / "float" / f"{arch}.onnx", held_out)
    integer_matmuls = sum(n.op_type == "MatMulInteger" for n in onnx.load(str(source)).graph.node)
    row = {"source": name, "matmul_integer": integer_matmuls, "snr_source": snr(reference, outputs(source, held_out))}
    calib = str(corpus / "float" / f"{arch}.calib.npz")
    # the plugin ways as a user runs them: without calibration data, unless what the plugin does not take
    # (ConvInteger, QAttention) needs it to become static INT8 (with data, TensorRT's placement also quantizes
    # what the source left in float, such as the attention's MatMuls)
    data = CalibrationOptions(data=calib)
    ways = {"plugin-tensor": ConvertOptions(activations=ActivationOptions("dynamic"), progress=False),
            "plugin-token": ConvertOptions(activations=ActivationOptions("dynamic", "token"), progress=False),
            "static": ConvertOptions(data, progress=False)}
    for way, options in ways.items():
        out = work / f"{name.replace('/', '.')}.{way}.onnx"
        start = time.perf_counter()
        try:
            try:
                report = convert(source, out, options)
            except CalibrationDataError:
                report = convert(source, out, replace(options, calibration=data))
        except Exception as exc:  # noqa: BLE001 - a measurement: record why and go on
            row[way] = {"error": str(exc).splitlines()[0]}
            continue
        cell = {"seconds": round(time.perf_counter() - start, 2), "snr": snr(reference, outputs(out, held_out))}
        if report.plugin is not None:
            cell["plugin_nodes"] = len(report.plugin["layers"])
            cell["calibrated"] = report.calibration is not None
        if way == "plugin-tensor":
            basic = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
            cell["bit_exact_basic"] = all(np.array_equal(a, b) for a, b in zip(outputs(source, held_out, basic),
                                                                                 outputs(out, held_out, basic)))
            got, want = outputs(out, held_out), outputs(source, held_out)
            cell["bit_exact_default"] = all(np.array_equal(a, b) for a, b in zip(want, got))
            cell["max_abs_default"] = max(float(np.abs(a - b).max()) for a, b in zip(want, got))
        try:
            build_engine(out, compute_capability="SM89")
            cell["tensorrt_rtx_sm89"] = True
        except Exception as exc:  # noqa: BLE001
            cell["tensorrt_rtx_sm89"] = str(exc).splitlines()[0]
        row[way] = cell
    return row


def table(rows: list[dict]) -> str:
    lines = ["| source | MatMulInteger | plugin nodes | bit-exact (basic / default) | SNR source | plugin tensor | "
             "plugin token | static | convert s (plugin / static) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        t, k, s = r["plugin-tensor"], r["plugin-token"], r["static"]

        def val(cell, key, fmt="{:.2f}"):
            return fmt.format(cell[key]) if key in cell else cell.get("error", "?")[:40]

        exact = f"{t.get('bit_exact_basic', '?')} / {t.get('bit_exact_default', '?')}" if "error" not in t else "-"
        calibrated = " (+ static, calibrated)" if t.get("calibrated") else ""
        lines.append(f"| {r['source']} | {r['matmul_integer']} | {t.get('plugin_nodes', '-')}{calibrated} | {exact} | "
                     f"{r['snr_source']:.2f} | {val(t, 'snr')} | {val(k, 'snr')} | {val(s, 'snr')} | "
                     f"{val(t, 'seconds')} / {val(s, 'seconds')} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=ROOT / "tests" / "data" / "corpus")
    parser.add_argument("--json", type=Path, help="write every measurement as JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        rows = [measure(name, arch, path, args.corpus, work) for name, arch, path in sources(args.corpus, work)
                if (args.corpus / "float" / f"{arch}.eval.npz").is_file()]
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
