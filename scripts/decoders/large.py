"""Measure trt-bridge on a ~1 B parameter Llama exported by onnxruntime-genai 0.18's model builder in int4.

    .venv/bin/python scripts/decoders/large.py [--root .corpus/decoders/1b]
        [--steps hf export level0 skip check verify table] [--intermediate 5632] [--max-gb 18] [--check-max-gb 20]
        [--check-max-s 900]

Steps (each records into ``ROOT/results.json``, so they can be run one at a time and resumed):

``hf``      (genai venv) ``ROOT/llama/hf/``: a LlamaConfig (hidden 2048, 16 layers (``--layers``), 32 query heads
            over 8 KV heads, head 64, intermediate 5632, vocab 32000, max_position_embeddings 2048: 0.85 B parameters
            with 16 layers, 1.1 B with 22), weights
            ``torch.manual_seed(0)`` then redrawn exactly as ``make_hf.py`` does (its ``_model``), rounded to float16
            and saved in float16; ``make_hf.py``'s local word-level tokenizer; ``reference.json`` (torch logits of
            the float16-rounded weights, computed in float32). Nothing from a model hub.
``export``  (genai venv) ``python -m onnxruntime_genai.models.builder -i hf -o genai-cpu-int4 -p int4 -e cpu -c CACHE``.
``level0``  ``genai-cpu-int4-level0/``: the export with every MatMulNBits ``accuracy_level`` set to 0 (onnxruntime's
            level 4 rounds activations to int8; level 0 is what the weights mean), external data, genai_config.json.
``skip``    ``/usr/bin/time -v trt-bridge convert SRC -o trt-skip/model.onnx --skip-check`` (the conversion alone).
``check``   the same with the default check (TensorRT-RTX parser + ahead-of-time build for costs), into ``trt/``;
            stopped past ``--check-max-s`` seconds or ``--check-max-gb`` GB.
``verify``  ``trt-bridge verify REF trt-skip/model.onnx --prompts 2 --steps 32 --costs off`` against the level-0 copy
            and against the source as is.
``table``   a markdown table of the numbers.

Every heavy command runs in its own process group, its whole process tree's resident memory sampled every 0.5 s
(``tree_peak_gb``; GNU time's "Maximum resident set size" is the largest single process) and stopped past its limit.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
GENAI_PY = ROOT / ".corpus" / "venvs" / "genai" / "bin" / "python"
TRT_BRIDGE = ROOT / ".venv" / "bin" / "trt-bridge"
OWN_PY = ROOT / ".venv" / "bin" / "python"
ENV = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1",
           PYTHONHASHSEED="0", GIT_DIR="/nonexistent-git-dir")
DIMS = dict(hidden_size=2048, num_attention_heads=32, num_key_value_heads=8, num_hidden_layers=16,
            intermediate_size=5632, vocab_size=32000)
STEPS = ("hf", "export", "level0", "skip", "check", "verify", "table")
PAGE = os.sysconf("SC_PAGE_SIZE")


# ---------------------------------------------------------------------------------------------- measuring
def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            kids.setdefault(ppid, []).append(int(d))
    return kids


def _tree_rss(pid: int, per: dict | None = None) -> int:
    """The summed RSS of PID and its descendants; PER (pid -> [args, peak RSS]) updated with each process's peak."""
    kids, todo, total = _children(), [pid], 0
    while todo:
        p = todo.pop()
        try:
            rss = int(Path(f"/proc/{p}/statm").read_text().split()[1]) * PAGE
            total += rss
            if per is not None:
                if p not in per:
                    args = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    per[p] = [args.strip()[:160], 0]
                per[p][1] = max(per[p][1], rss)
        except OSError:
            pass
        todo += kids.get(p, [])
    return total


def measure(cmd: list[str], log: Path, *, limit_s: float, limit_gb: float, env=None) -> dict:
    """Run CMD under /usr/bin/time -v, its output to LOG; the tree's RSS sampled; stopped past its limits."""
    log.parent.mkdir(parents=True, exist_ok=True)
    tfile = log.with_suffix(".time")
    full = ["/usr/bin/time", "-v", "-o", str(tfile), *cmd]
    print(f"[large] $ {' '.join(_rel(c) for c in cmd)}  (log {_rel(str(log))})", flush=True)
    t0 = time.time()
    with open(log, "w") as out:
        proc = subprocess.Popen(full, stdout=out, stderr=subprocess.STDOUT, env=env or ENV, cwd=ROOT,
                                start_new_session=True)
        peak, killed, last, per = 0, None, 0.0, {}
        while proc.poll() is None:
            rss = _tree_rss(proc.pid, per)
            peak = max(peak, rss)
            el = time.time() - t0
            if rss > limit_gb * 1e9:
                killed = f"tree RSS {rss / 1e9:.1f} GB over {limit_gb} GB after {el:.0f} s"
            elif el > limit_s:
                killed = f"over {limit_s:.0f} s (tree RSS {rss / 1e9:.1f} GB)"
            if killed:
                os.killpg(proc.pid, signal.SIGKILL)  # our own process group only
                proc.wait()
                break
            if el - last >= 30:
                last = el
                print(f"[large]   ... {el:.0f} s, tree RSS {rss / 1e9:.2f} GB (peak {peak / 1e9:.2f})", flush=True)
            time.sleep(0.5)
    wall = time.time() - t0
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    res = {"command": " ".join(_rel(c) for c in cmd), "rc": proc.returncode,
           "trt_bridge_head": head.stdout.strip(), "wall_s": round(wall, 1),
           "tree_peak_gb": round(peak / 1e9, 3), "killed": killed, "log": _rel(str(log)),
           "process_peaks_gb": {f"{p} {a}": round(r / 1e9, 3) for p, (a, r) in per.items() if r > 2e8}}
    if tfile.is_file():
        t = tfile.read_text()
        m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", t)
        w = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", t)
        if m:
            res["time_maxrss_gb"] = round(int(m.group(1)) * 1024 / 1e9, 3)
        if w:
            parts = [float(x) for x in w.group(1).split(":")]
            res["time_wall_s"] = round(sum(p * 60 ** i for i, p in enumerate(reversed(parts))), 1)
        for key, pat in (("user_s", r"User time \(seconds\): ([\d.]+)"),
                         ("sys_s", r"System time \(seconds\): ([\d.]+)")):
            mm = re.search(pat, t)
            if mm:
                res[key] = float(mm.group(1))
    tail = log.read_text(errors="replace").strip().splitlines()
    res["tail"] = tail[-25:]
    status = "ok" if proc.returncode == 0 else f"FAILED rc={proc.returncode}" + (f" ({killed})" if killed else "")
    print(f"[large]   {status}: {wall:.1f} s, GNU time max RSS {res.get('time_maxrss_gb')} GB, "
          f"tree peak {res['tree_peak_gb']} GB", flush=True)
    if proc.returncode != 0:
        print("\n".join("[large]   | " + ln for ln in tail[-10:]), flush=True)
    return res


def _rel(arg: str) -> str:
    try:
        return str(Path(arg).resolve().relative_to(ROOT)) if arg.startswith(("/", ".")) else arg
    except ValueError:
        return arg


def _bytes(folder: Path, stem: str = "model.onnx") -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.name == stem or p.name.startswith(stem + "."))


# ---------------------------------------------------------------------------------------------- hf (genai venv)
def make_hf(folder: Path, intermediate: int, layers: int) -> None:
    """Runs inside the genai venv: config, make_hf.py's seeded weights rounded to float16, tokenizer, reference."""
    import torch
    import transformers as tf

    sys.path.insert(0, str(HERE))
    import make_hf  # the colleague's builder: its _model (seed + rescaling), _tokenizer, _legacy_rope, _reference

    dims = dict(DIMS, intermediate_size=intermediate, num_hidden_layers=layers)
    config = tf.LlamaConfig(**dims, max_position_embeddings=2048, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
                            pad_token_id=3, tie_word_embeddings=False, hidden_act="silu", rope_theta=10000.0,
                            attention_bias=False, mlp_bias=False)
    folder.mkdir(parents=True, exist_ok=True)
    t = time.time()
    model = make_hf._model("llama", config)  # torch.manual_seed(0), then the N(0, 1/fan_in) / 1 + N(0, 0.1) redraw
    print(f"[large] hf: weights drawn in {time.time() - t:.0f} s", flush=True)
    with torch.no_grad():  # round to float16 in place: the saved checkpoint is exactly what the reference ran
        for p in model.parameters():
            p.copy_(p.half().float())
    ref = make_hf._reference(model) | {"transformers": tf.__version__, "torch": torch.__version__,
                                       "weights": "float16-rounded, run in float32"}
    model = model.to(torch.float16)
    model.config.dtype = torch.float16
    model.save_pretrained(folder, safe_serialization=True)
    make_hf._tokenizer(folder, config.vocab_size)
    make_hf._legacy_rope(folder / "config.json")
    (folder / "reference.json").write_text(json.dumps(ref) + "\n")
    n = sum(p.numel() for p in model.parameters())
    print(f"[large] {folder}: {n} parameters, logits std {ref['prefill_logits_std']:.2f}, "
          f"top prob {ref['prefill_top_prob']:.2f} ({time.time() - t:.0f} s)", flush=True)
    (folder / "params.json").write_text(json.dumps({"parameters": n, "dims": dims}) + "\n")


# ---------------------------------------------------------------------------------------------- level 0 copy
def level0(src: Path, dst: Path) -> dict:
    import onnx
    from onnx import helper

    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    model = onnx.load(str(src / "model.onnx"), load_external_data=True)
    changed, levels = 0, {}
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            attrs = [a for a in node.attribute if a.name == "accuracy_level"]
            old = attrs[0].i if attrs else None
            levels[str(old)] = levels.get(str(old), 0) + 1
            for a in attrs:
                node.attribute.remove(a)
            node.attribute.append(helper.make_attribute("accuracy_level", 0))
            changed += 1
    onnx.save(model, str(dst / "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="model.onnx.data", size_threshold=1024)
    for f in ("genai_config.json",):
        shutil.copy(src / f, dst / f)
    return {"matmulnbits": changed, "accuracy_levels_before": levels, "bytes": _bytes(dst)}


# ---------------------------------------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=ROOT / ".corpus" / "decoders" / "1b")
    ap.add_argument("--steps", nargs="*", default=list(STEPS), choices=STEPS)
    ap.add_argument("--intermediate", type=int, default=DIMS["intermediate_size"])
    ap.add_argument("--layers", type=int, default=DIMS["num_hidden_layers"],
                    help="16 (the brief's) gives 0.85 B parameters; 22 (TinyLlama's) gives 1.1 B")
    ap.add_argument("--max-gb", type=float, default=18.0, help="stop a step whose process tree passes this")
    ap.add_argument("--check-max-gb", type=float, default=20.0)
    ap.add_argument("--check-max-s", type=float, default=900.0)
    ap.add_argument("--_hf", type=Path, help=argparse.SUPPRESS)  # internal: run make_hf in this (genai) python
    args = ap.parse_args()
    if args._hf:
        make_hf(args._hf, args.intermediate, args.layers)
        return 0

    root = args.root.resolve()
    arch = root / "llama"
    hf, src, l0 = arch / "hf", arch / "genai-cpu-int4", arch / "genai-cpu-int4-level0"
    skip_dir, check_dir = arch / "trt-skip", arch / "trt"
    logs = root / "logs"
    rfile = root / "results.json"
    results = json.loads(rfile.read_text()) if rfile.is_file() else {}

    def save():
        root.mkdir(parents=True, exist_ok=True)
        rfile.write_text(json.dumps(results, indent=1) + "\n")

    if "hf" in args.steps:
        shutil.rmtree(hf, ignore_errors=True)
        results["hf"] = measure([str(GENAI_PY), str(Path(__file__).resolve()), "--_hf", str(hf),
                                 "--intermediate", str(args.intermediate), "--layers", str(args.layers)],
                                logs / "hf.log",
                                limit_s=3600, limit_gb=args.max_gb)
        if (hf / "params.json").is_file():
            results["hf"] |= json.loads((hf / "params.json").read_text())
        results["hf"]["bytes"] = sum(p.stat().st_size for p in hf.iterdir())
        save()
    if "export" in args.steps:
        shutil.rmtree(src, ignore_errors=True)
        results["export"] = measure([str(GENAI_PY), "-m", "onnxruntime_genai.models.builder", "-i", str(hf),
                                     "-o", str(src), "-p", "int4", "-e", "cpu", "-c", str(root / ".cache" / "genai")],
                                    logs / "export.log", limit_s=3600, limit_gb=args.max_gb)
        if (src / "model.onnx").is_file():
            results["export"]["bytes"] = _bytes(src)
            results["export"]["files"] = {p.name: p.stat().st_size for p in sorted(src.iterdir())}
        save()
    if "level0" in args.steps:
        t = time.time()
        results["level0"] = level0(src, l0) | {"seconds": round(time.time() - t, 1)}
        print(f"[large] level0: {results['level0']}", flush=True)
        save()
    if "skip" in args.steps:
        shutil.rmtree(skip_dir, ignore_errors=True)
        skip_dir.mkdir(parents=True)
        results["skip"] = measure([str(TRT_BRIDGE), "convert", str(src / "model.onnx"), "-o",
                                   str(skip_dir / "model.onnx"),
                                   "--skip-check", "--json", str(skip_dir / "report.json")],
                                  logs / "convert-skip.log", limit_s=3600, limit_gb=args.max_gb)
        if (skip_dir / "model.onnx").is_file():
            results["skip"]["out_bytes"] = _bytes(skip_dir)
        save()
    if "check" in args.steps:
        shutil.rmtree(check_dir, ignore_errors=True)
        check_dir.mkdir(parents=True)
        results["check"] = measure([str(TRT_BRIDGE), "convert", str(src / "model.onnx"), "-o",
                                    str(check_dir / "model.onnx"), "--json", str(check_dir / "report.json")],
                                   logs / "convert-check.log", limit_s=args.check_max_s, limit_gb=args.check_max_gb)
        save()
    if "verify" in args.steps:
        for name, ref in (("verify_level0", l0), ("verify_source", src)):
            out = arch / f"{name}.json"
            results[name] = measure([str(TRT_BRIDGE), "verify", str(ref / "model.onnx"), str(skip_dir / "model.onnx"),
                                     "--prompts", "2", "--steps", "32", "--costs", "off", "--json", str(out)],
                                    logs / f"{name}.log", limit_s=3600, limit_gb=args.max_gb)
            if out.is_file():
                g = json.loads(out.read_text()).get("generation") or {}
                results[name] |= {k: g.get(k) for k in ("token_agreement", "agreed", "compared", "logits_snr_db",
                                                        "min_step_snr_db", "prefix_match")}
            save()
    if "table" in args.steps:
        print(table(results))
    return 0


def table(r: dict) -> str:
    src_bytes = (r.get("export") or {}).get("bytes")

    def gb(x):
        return "-" if x is None else f"{x:.2f} GB"

    def ratio(x):
        return "-" if x is None or not src_bytes else f"{x * 1e9 / src_bytes:.2f}x"

    lines = [f"parameters: {(r.get('hf') or {}).get('parameters')}, dims {(r.get('hf') or {}).get('dims')}",
             f"source (genai-cpu-int4) bytes on disk: {src_bytes} ({src_bytes / 1e9:.3f} GB)" if src_bytes else "",
             "",
             "| run | wall s | CPU user + sys s | GNU time max RSS "
             "| tree peak RSS | max RSS / source bytes | rc | note |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for key in ("hf", "export", "skip", "check", "verify_level0", "verify_source"):
        x = r.get(key)
        if not x:
            continue
        note = x.get("killed") or ""
        cpu = "-" if x.get("user_s") is None else f"{x['user_s']:.0f} + {x['sys_s']:.0f}"
        lines.append(f"| {key} | {x.get('wall_s')} | {cpu} "
            f"| {gb(x.get('time_maxrss_gb'))} | {gb(x.get('tree_peak_gb'))} | "
                     f"{ratio(x.get('time_maxrss_gb') or x.get('tree_peak_gb'))} | {x.get('rc')} | {note} |")
    lines += ["", "| reference | token agreement | logits SNR (all steps) | lowest step SNR | prefix match |",
              "|---|---:|---:|---:|---|"]
    for key, label in (("verify_level0", "source, accuracy_level 0"), ("verify_source", "source as is (level 4)")):
        x = r.get(key)
        if x and x.get("token_agreement") is not None:
            lines.append(f"| {label} | {100 * x['token_agreement']:.1f}% ({x['agreed']}/{x['compared']}) | "
                         f"{x['logits_snr_db']:.2f} dB | {x['min_step_snr_db']:.2f} dB | {x['prefix_match']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
