"""Summarize the decoder corpus into ``inventory.md`` (any python; reads the JSON build.py and describe.py wrote).

    python scripts/decoders/inventory.py DECODERS   # DECODERS = .corpus/decoders

For every ``<size>/<arch>/<export>/`` folder: the command that made it (``export.json``) or its exact error,
and for each model in it (``<stem>.report.json``): size, node count, the op histogram, whether onnxruntime ran
the 16-token prefill and one decode step (and how close it came to torch), and the attributes and input
wiring of GroupQueryAttention, MultiHeadAttention, RotaryEmbedding, (Skip)SimplifiedLayerNormalization and
MatMulNBits, and whether MatMulNBits / DequantizeLinear scales are negative.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

GQA_KEYS = ("num_heads", "kv_num_heads", "do_rotary", "rotary_interleaved", "local_window_size", "softcap", "scale")
GQA_INPUTS = ("query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos_cache",
              "sin_cache", "position_ids", "attention_bias", "head_sink")
MHA_INPUTS = ("query", "key", "value", "bias", "key_padding_mask", "attention_bias", "past_key", "past_value",
              "past_sequence_length", "cache_indirection")
ROT_INPUTS = ("input", "position_ids", "cos_cache", "sin_cache")


#: findings that are not in any single report (how the corpus had to be made)
NOTES = [
    "onnxruntime-genai 0.18.0's builder treats *any* `nn.Linear` whose `out_features == vocab_size` as the LM head "
    "(`Model.has_lm_head`). With the first tiny config (vocabulary 128 = intermediate 128) it wired `/lm_head/MatMul` "
    "to "
    "layer 0's post-attention norm output, left the final norm dangling, and the fp32 export's logits correlated 0.83 "
    "with torch's. The vocabularies are 192 (tiny) and 768 (small) so that no projection width equals them; "
    "with that every genai fp32 export matches torch (correlation 1.0000).",
    "The builder stamps `producer_version` as `0.18.0+<git rev-parse HEAD>` run five folders above its package: "
    "for a venv inside this checkout that is trt-bridge's own HEAD. build.py sets `GIT_DIR` to a missing folder so "
    "the wheel's own commit (`+00d66ef`) is used and the models do not change with every trt-bridge commit.",
    "optimum-onnx 0.1.0 no longer writes `decoder_model_merged.onnx` for `text-generation-with-past`: it writes one "
    "`model.onnx` that takes a past (possibly empty). The legacy layout (`optimum-merged-*`) is rebuilt with its own "
    "tools (a decoder exported with `use_past_in_inputs=False`, the with-past export, `optimum.onnx.merge_decoders`).",
    "Mistral has a real sliding window (`sliding_window=8`, shorter than the 16-token prompt) and `layer_types` "
    "all `sliding_attention`: onnxruntime-genai only sets GroupQueryAttention `local_window_size` on layers "
    "`config.layer_types` marks sliding (with `sliding_window=1024` and no `layer_types` it wrote -1). For cpu "
    "(and cuda) it also sets `sliding_window_cache=1` and names the past dim `past_sliding_length`: the KV cache is "
    "then a fixed-capacity buffer (onnxruntime refuses a capacity below `local_window_size`: 'sliding_window_cache: "
    "KV cache capacity (1) must be at least local_window_size (8)'), so describe.py feeds the prefill a zero past "
    "of `local_window_size` rows. Both forms match torch's windowed attention (correlation 1.0000). "
    "transformers 4.57 reads that config as `ministral`, which optimum-onnx 0.1.0 does not export (error below).",
    "`genai-cpu-fp16` (the only MultiHeadAttention + RotaryEmbedding form) runs its prefill on onnxruntime 1.32's CPU "
    "EP but the decode step in the same session fails ('Shape mismatch attempting to re-use buffer. {1,1,H} != "
    "{1,17,H}' at an inserted Cast of `v_proj/repeat_kv/Reshape_4`); with graph optimizations and memory reuse off "
    "both steps run and match torch.",
    "`genai-NvTensorRtRtx-bf16` has no CPU kernels (bfloat16 Mul): it is there for its structure only.",
    "`optimum-merged-int4-b32-qdq*` (int4 DequantizeLinear inside the If branches, weights in the outer scope) do "
    "not load with default optimizations (the QDQ -> MatMulNBits fusion looks for the weight in the branch); with "
    "optimizations off they run.",
    "`quantize_dynamic` run on `decoder_model_merged.onnx` itself (`*-direct`) quantizes nothing: the MatMuls sit in "
    "the `If` branches and their weights are outer-scope initializers, so the output is the float model plus "
    "unused copies (correlation with torch 1.0000, larger file). Quantizing the two decoders and merging them "
    "(`optimum-merged-qdyn-*`) gives the real quantized merged model.",
]


def _run_cell(run: dict) -> str:
    if "error" in run:
        cell = ("does not load: " if not run.get("loads") else "FAILS: ") + run["error"].replace("\n", " ")[:220]
        retry = run.get("retry_without_optimizations")
        if retry is not None:
            cell += (" — without graph optimizations / memory reuse: " +
                     (("fails too: " + retry["error"].replace("\n", " ")[:160]) if "error" in retry
                      else f"prefill {retry.get('prefill')}, decode {retry.get('decode')}"
                      f"{_close(retry)}"))
        return cell
    return f"prefill {run.get('prefill')}, decode {run.get('decode')}{_close(run)}"


def _close(r: dict) -> str:
    bits = []
    if "prefill_vs_torch_corr" in r:
        bits.append(f"corr vs torch {r['prefill_vs_torch_corr']:.4f}/{r.get('decode_vs_torch_corr', float('nan')):.4f}")
        bits.append(f"argmax {'=' if r.get('prefill_argmax_matches_torch') else '≠'}"
                    f"{'=' if r.get('decode_argmax_matches_torch') else '≠'}")
    if "decode_vs_prefill17_max_abs" in r:
        bits.append(f"decode vs 17-token prefill {r['decode_vs_prefill17_max_abs']:.1e}")
    return f" ({'; '.join(bits)})" if bits else ""


def _ops(ops: dict) -> str:
    return ", ".join(f"{k.replace('ai.onnx::', '').replace('com.microsoft::', 'ms:')} {v}"
                     for k, v in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0])))


def _attrs(entry: dict) -> str:
    return "; ".join(f"{json.dumps(s['attributes'], sort_keys=True)} ×{s['count']}" for s in entry["attribute_sets"])


def _wiring(entry: dict, names) -> list[str]:
    out = []
    for w in entry.get("wiring", [])[:1]:
        given = ", ".join(f"{i} {names[i] if i < len(names) else '?'}" for i in w["given_input_indices"])
        out.append(f"  - given inputs: {given}")
        for i, chain in w["inputs"].items():
            nm = names[int(i)] if int(i) < len(names) else "?"
            out.append(f"    - `{i}` {nm}: `{chain}`")
    return out


def _sig(chain: str) -> str:
    """The op types (and the source) of a wiring chain, without tensor names: what groups patterns."""
    parts = chain.split(" <- ")
    return " <- ".join(p.split(" [")[0] for p in parts[1::2]) + (f" <- {parts[-1]}" if len(parts) % 2 == 0 else "")


def collect(root: Path) -> list[dict]:
    rows = []
    for export in sorted(root.glob("*/*/*/export.json")):
        folder = export.parent
        size, arch, name = folder.parts[-3:]
        info = json.loads(export.read_text())
        reports = [json.loads(p.read_text()) for p in sorted(folder.glob("*.report.json"))]
        rows.append({"size": size, "arch": arch, "export": name, "folder": folder, "info": info, "reports": reports})
    return rows


def render(root: Path, rows: list[dict]) -> str:
    lines = ["# Decoder (LLM) export corpus", "",
             "Built by `scripts/decoders/build.py` (see its docstring): tiny seeded random-weight Llama / Qwen2 /",
             "Phi3 / Mistral checkpoints (`<size>/<arch>/hf`), exported by onnxruntime-genai's model builder and by",
             "optimum-onnx, quantized by onnxruntime; every model described and run by `scripts/decoders/describe.py`",
             "with onnxruntime's CPU EP (16-token prefill with an empty past, then one decode step fed the presents;",
             "`corr vs torch` is the correlation of the last-position logits with the torch model's,",
             "prefill/decode, and `argmax ==` whether the greedy token agrees).", ""]
    lines += ["## Notes", ""] + [f"- {n}" for n in NOTES] + [""]
    sizes = sorted({r["size"] for r in rows}, key=lambda s: ("tiny", "small").index(s) if s in ("tiny", "small") else 9)
    failed = [r for r in rows if r["info"]["rc"] != 0]
    lines += ["## Summary", ""]
    for size in sizes:
        lines += [f"### {size}", "", "| arch | export | model | MB | nodes | onnxruntime (CPU) |",
                  "|---|---|---|---:|---:|---|"]
        for r in rows:
            if r["size"] != size:
                continue
            if r["info"]["rc"] != 0:
                err = r["info"].get("error", "").strip().splitlines()
                lines.append(f"| {r['arch']} | {r['export']} | export FAILED | | | {(err[-1] if err else '?')[:200]} |")
                continue
            for rep in r["reports"]:
                lines.append(f"| {r['arch']} | {r['export']} | {rep['model']} | {rep['bytes'] / 1e6:.2f} | "
                             f"{rep['nodes']} | "
                             f"{_run_cell(rep['run'])} |")
        lines.append("")
    if failed:
        lines += ["## Export errors (exact)", ""]
        for r in failed:
            lines += [f"### {r['size']}/{r['arch']}/{r['export']}", "", f"`{r['info']['command']}`", "", "```text",
                      r["info"].get("error", "").strip(), "```", ""]
    lines += ["## Attention, rotary, norm and quantization attributes", "",
              "For each distinct pattern, the models that show it. Wiring lists the inputs given (index, the op's",
              "name for it) and what produces each (`<-` follows the first non-constant input back).", ""]
    patterns: dict = {}
    for r in rows:
        for rep in r["reports"]:
            tag = f"{r['size']}/{r['arch']}/{r['export']}/{rep['model']}"
            for kind, entry in rep["attention"].items():
                key = (kind, _attrs(entry).split(" ×")[0] if kind == "MatMulNBits" else _attrs(entry),
                       tuple(tuple(w["given_input_indices"]) for w in entry.get("wiring", [])),
                       tuple((i, _sig(c)) for w in entry.get("wiring", []) for i, c in sorted(w["inputs"].items())))
                p = patterns.setdefault(key, {"kind": kind, "entry": entry, "models": []})
                p["models"].append(tag)
    for kind in ("GroupQueryAttention", "MultiHeadAttention", "Attention", "RotaryEmbedding",
                 "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization",
                 "LayerNormalization", "RMSNormalization", "MatMulNBits", "DequantizeLinear", "QuantizeLinear",
                 "DynamicQuantizeLinear", "MatMulInteger", "GatherBlockQuantized"):
        ps = [p for k, p in patterns.items() if k[0] == kind]
        if not ps:
            continue
        lines += [f"### {kind}", ""]
        names = {"GroupQueryAttention": GQA_INPUTS, "MultiHeadAttention": MHA_INPUTS,
                 "RotaryEmbedding": ROT_INPUTS}.get(kind, ())
        for p in ps:
            models = p["models"]
            more = f" and {len(models) - 12} more" if len(models) > 12 else ""
            shown = ", ".join(f"`{m}`" for m in models[:12]) + more
            lines.append(f"- {len(models)} model(s): {shown}")
            if kind in ("DequantizeLinear", "QuantizeLinear", "DynamicQuantizeLinear", "MatMulInteger"):
                lines.append(f"  - attributes: {_attrs(p['entry'])} (first model's counts)")
            else:
                lines.append(f"  - attributes: {_attrs(p['entry'])} (first model's counts)")
                lines += _wiring(p["entry"], names)
        lines.append("")
    lines += ["### Negative scales (MatMulNBits / DequantizeLinear scale initializers)", "",
              "| model | op (weight type) | nodes | with a negative scale | min scale |", "|---|---|---:|---:|---:|"]
    for r in rows:
        for rep in r["reports"]:
            for key, d in rep.get("negative_scales", {}).items():
                lines.append(f"| {r['size']}/{r['arch']}/{r['export']}/{rep['model']} | {key} | {d['nodes']} | "
                             f"{d['with_negative']} | {d['min']:.4g} |")
    lines += ["", "## Inputs, outputs and op histograms", ""]
    for r in rows:
        if r["info"]["rc"] != 0:
            continue
        for rep in r["reports"]:
            lines += [f"### {r['size']}/{r['arch']}/{r['export']}/{rep['model']}", "",
                      f"made by: `{r['info']['command']}`", "",
                      f"opsets {rep['opsets']}, producer {rep['producer']}, {rep['bytes']} bytes", ""]
            ins = ", ".join(f"`{i['name']}` {i['type']} {i['shape']}" for i in rep["inputs"][:4])
            more = f" (+{len(rep['inputs']) - 4} more past inputs)" if len(rep["inputs"]) > 4 else ""
            outs = ", ".join(f"`{o['name']}` {o['type']} {o['shape']}" for o in rep["outputs"][:2])
            lines += [f"- inputs: {ins}{more}", f"- outputs: {outs}" + (f" (+{len(rep['outputs']) - 2} more)"
                                                                       if len(rep["outputs"]) > 2 else ""),
                      f"- ops ({rep['nodes']}): {_ops(rep['ops'])}", f"- onnxruntime: {_run_cell(rep['run'])}", ""]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", type=Path)
    args = ap.parse_args()
    rows = collect(args.root)
    (args.root / "inventory.md").write_text(render(args.root, rows))
    print(f"[inventory] {args.root / 'inventory.md'}: {len(rows)} export folders", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
