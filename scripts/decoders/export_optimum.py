"""Export one tiny decoder with optimum-onnx and quantize it with onnxruntime (run inside the optimum venv).

    python scripts/decoders/export_optimum.py ARCH_DIR   # ARCH_DIR = .corpus/decoders/<size>/<arch>, holds hf/

Writes, beside ``ARCH_DIR/hf``:

* ``optimum-fp32/model.onnx``: ``optimum-cli export onnx --task text-generation-with-past`` (optimum-onnx 0.1
  writes one decoder that takes the past, possibly empty; it no longer writes decoder_model_merged.onnx);
* ``optimum-merged-fp32/``: the legacy three-file layout rebuilt with optimum-onnx's own tools:
  ``decoder_model.onnx`` (``--task text-generation``, no past), ``decoder_with_past_model.onnx`` (the
  with-past export) and ``decoder_model_merged.onnx`` (``optimum.onnx.merge_decoders``: one ``If`` on
  ``use_cache_branch``);
* for each of the two float forms (``optimum`` = model.onnx, ``optimum-merged`` = decoder_model_merged.onnx;
  for the merged one both the quantized pair merged again and, ``-direct``, the quantizer run on the merged file),
  onnxruntime's quantizations: ``-qdyn-u8`` (``quantize_dynamic`` defaults: uint8 weights, per tensor),
  ``-qdyn-s8-perchannel`` (``weight_type=QInt8, per_channel=True``), ``-int4-b32``
  (``MatMulNBitsQuantizer`` 4-bit, block 32, symmetric: MatMulNBits) and ``-int4-b32-qdq`` (the same in
  the QDQ format: int4 DequantizeLinear + MatMul).

Each output folder gets ``export.json``: the command or call that made it, its exit status and, on
failure, the last lines of the error. A step that fails is recorded and the rest goes on.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
BIN = Path(sys.executable).parent


def _record(folder: Path, what: str, rc: int, seconds: float, log: str = "") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    info = {"exporter": "optimum", "command": what, "rc": rc, "seconds": round(seconds, 1)}
    if rc != 0:
        info["error"] = "\n".join(log.strip().splitlines()[-25:])
    (folder / "export.json").write_text(json.dumps(info, indent=1) + "\n")
    print(f"[optimum] {folder.name}: {'ok' if rc == 0 else 'FAILED'} ({seconds:.0f} s)", flush=True)


def _cli(hf: Path, task: str, out: Path) -> tuple[list[str], int, str]:
    cmd = [str(BIN / "optimum-cli"), "export", "onnx", "-m", str(hf), "--task", task, str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    return cmd, done.returncode, done.stdout + done.stderr


def _display(cmd: list[str], arch_dir: Path) -> str:
    return " ".join(c.replace(str(BIN) + "/", "").replace(str(arch_dir), "ARCH_DIR") for c in cmd)


def _legacy_export(hf: Path, out: Path, with_past: Path) -> None:
    """The pre-optimum-onnx layout: a decoder without past inputs (but with presents), one with them, merged."""
    from optimum.exporters.onnx import main_export
    from optimum.exporters.tasks import TasksManager
    from optimum.onnx import merge_decoders
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(hf)
    ctor = TasksManager.get_exporter_config_constructor("onnx", model_type=config.model_type,
                                                        task="text-generation-with-past", library_name="transformers")
    base = ctor(config)
    cls = base.__class__
    kw = dict(task="text-generation", int_dtype=base.int_dtype, float_dtype=base.float_dtype)
    nopast = out / ".nopast"
    main_export(str(hf), output=str(nopast), task="text-generation-with-past",
                custom_onnx_configs={"model": cls(config, use_past=True, use_past_in_inputs=False, **kw)})
    shutil.move(nopast / "model.onnx", out / "decoder_model.onnx")
    for f in nopast.iterdir():  # config.json, generation_config.json
        shutil.move(f, out / f.name)
    shutil.rmtree(nopast)
    shutil.copy(with_past, out / "decoder_with_past_model.onnx")
    merge_decoders(out / "decoder_model.onnx", out / "decoder_with_past_model.onnx",
                   save_path=out / "decoder_model_merged.onnx", strict=False)


def export_float(arch_dir: Path) -> dict[str, Path]:
    hf = arch_dir / "hf"
    made = {}
    out = arch_dir / "optimum-fp32"
    shutil.rmtree(out, ignore_errors=True)
    t = time.time()
    cmd, rc, log = _cli(hf, "text-generation-with-past", out)
    _record(out, _display(cmd, arch_dir), rc, time.time() - t, log)
    if rc == 0:
        made["optimum"] = out / "model.onnx"
    merged = arch_dir / "optimum-merged-fp32"
    shutil.rmtree(merged, ignore_errors=True)
    t = time.time()
    what = ("optimum.exporters.onnx.main_export(hf, tmp, task='text-generation-with-past', custom_onnx_configs="
            "{'model': <arch OnnxConfig>(config, task='text-generation', use_past=True, use_past_in_inputs=False)}) "
            "-> decoder_model.onnx; optimum-fp32/model.onnx -> decoder_with_past_model.onnx; "
            "optimum.onnx.merge_decoders(decoder_model.onnx, "
            "decoder_with_past_model.onnx, strict=False) -> decoder_model_merged.onnx")
    try:
        if "optimum" not in made:
            raise RuntimeError("the with-past export (optimum-fp32) failed")
        _legacy_export(hf, merged, made["optimum"])
        made["optimum-merged"] = merged / "decoder_model_merged.onnx"
        rc, log = 0, ""
    except Exception:  # noqa: BLE001 -- recorded
        rc, log = 1, traceback.format_exc()
    _record(merged, what, rc, time.time() - t, log)
    return made


STEPS = {  # name -> (how it is called, kwargs for _quantize_file)
    "qdyn-u8": ("onnxruntime.quantization.quantize_dynamic(src, dst)", {"kind": "dynamic"}),
    "qdyn-s8-perchannel": ("quantize_dynamic(src, dst, weight_type=QuantType.QInt8, per_channel=True)",
                           {"kind": "dynamic", "weight_type": "QInt8", "per_channel": True}),
    "int4-b32": ("MatMulNBitsQuantizer(model, bits=4, block_size=32, is_symmetric=True).process()",
                 {"kind": "nbits", "fmt": "QOperator"}),
    "int4-b32-qdq": ("MatMulNBitsQuantizer(model, bits=4, block_size=32, is_symmetric=True, "
                     "quant_format=QuantFormat.QDQ).process()", {"kind": "nbits", "fmt": "QDQ"}),
}


def _quantize_file(src: Path, dst: Path, kind: str, **kw) -> None:
    import onnx
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    if kind == "dynamic":
        if "weight_type" in kw:
            kw["weight_type"] = getattr(QuantType, kw["weight_type"])
        quantize_dynamic(str(src), str(dst), **kw)
    else:
        q = MatMulNBitsQuantizer(onnx.load(str(src)), bits=4, block_size=32, is_symmetric=True,
                                 quant_format=getattr(QuantFormat, kw["fmt"]))
        q.process()
        q.model.save_model_to_file(str(dst), use_external_data_format=False)


def quantize(arch_dir: Path, prefix: str, src: Path) -> None:
    """Each STEPS quantization of ``src``. For the merged model two forms: ``<prefix>-<step>`` quantizes
    decoder_model.onnx and decoder_with_past_model.onnx and merges the pair (merge_decoders, strict=False), and
    ``<prefix>-<step>-direct`` runs the quantizer on decoder_model_merged.onnx itself (its MatMuls sit in the
    If branches with outer-scope weights: see inventory.md for what each quantizer does with that)."""
    merged = src.name == "decoder_model_merged.onnx"
    for name, (what, kw) in STEPS.items():
        forms = [(f"{prefix}-{name}", "pair"), (f"{prefix}-{name}-direct", "direct")] if merged else [
            (f"{prefix}-{name}", "direct")]
        for folder_name, form in forms:
            folder = arch_dir / folder_name
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            for f in ("config.json", "generation_config.json"):
                if (src.parent / f).is_file():
                    shutil.copy(src.parent / f, folder / f)
            t = time.time()
            try:
                if form == "direct":
                    _quantize_file(src, folder / src.name, **dict(kw))
                    how = f"{what}  [src = {src.parent.name}/{src.name}]"
                else:
                    from optimum.onnx import merge_decoders

                    for part in ("decoder_model.onnx", "decoder_with_past_model.onnx"):
                        _quantize_file(src.parent / part, folder / part, **dict(kw))
                    merge_decoders(folder / "decoder_model.onnx", folder / "decoder_with_past_model.onnx",
                                   save_path=folder / "decoder_model_merged.onnx", strict=False)
                    for part in ("decoder_model.onnx", "decoder_with_past_model.onnx"):
                        (folder / part).unlink()
                    how = (f"{what} on {src.parent.name}/decoder_model.onnx and on decoder_with_past_model.onnx, "
                           "then optimum.onnx.merge_decoders(q_decoder, q_decoder_with_past, strict=False)")
                rc, log = 0, ""
            except Exception:  # noqa: BLE001 -- recorded
                how = what
                rc, log = 1, traceback.format_exc()
            _record(folder, how, rc, time.time() - t, log)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("arch_dir", type=Path)
    args = ap.parse_args()
    for old in args.arch_dir.glob("optimum-*"):  # a failed export must not leave an earlier run's models
        shutil.rmtree(old)
    made = export_float(args.arch_dir)
    for prefix, src in made.items():
        quantize(args.arch_dir, prefix, src)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
