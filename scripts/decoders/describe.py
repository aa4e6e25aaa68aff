"""Describe and run every exported decoder (run with trt-bridge's venv: its onnx and onnxruntime).

    python scripts/decoders/describe.py ROOT [MODEL.onnx ...]

For each ``*.onnx`` under ``ROOT`` (or the ones named) writes ``<stem>.report.json`` beside it:

* ``inputs`` / ``outputs``: name, element type, shape (symbolic dims as their names);
* ``ops``: the op-type histogram keyed ``domain::OpType`` (``ai.onnx`` for the default domain);
* ``attention``: for every GroupQueryAttention, MultiHeadAttention, RotaryEmbedding,
  (Skip)SimplifiedLayerNormalization, MatMulNBits, DequantizeLinear... node kind: its attributes (each
  distinct set once, with a count) and its input wiring: which input indices are given, and for each the
  producing chain (e.g. ``seqlens_k <- Cast <- Sub <- ReduceSum <- attention_mask``);
* ``negative_scales``: whether any MatMulNBits / DequantizeLinear scale initializer has negative entries;
* ``run``: onnxruntime (CPUExecutionProvider) on a 16-token prompt (prefill, empty past) then one decode
  step fed the prefill's presents; the decode logits are compared with a 17-token prefill of the same
  model and, where ``hf/reference.json`` exists, both are compared with the torch model's logits.

A model that onnxruntime cannot load or run gets the exact error in ``run.error``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

KINDS = ("GroupQueryAttention", "MultiHeadAttention", "Attention", "RotaryEmbedding",
         "SkipSimplifiedLayerNormalization",
         "SimplifiedLayerNormalization", "SkipLayerNormalization", "LayerNormalization", "RMSNormalization",
         "MatMulNBits", "DequantizeLinear", "QuantizeLinear", "DynamicQuantizeLinear", "MatMulInteger",
         "GatherBlockQuantized", "QMoE", "PackedMultiHeadAttention", "SparseAttention")
PROMPT = list(range(4, 20))  # 16 tokens; the same prompt make_hf.py's reference logits use


def _type(t) -> str:
    return onnx.TensorProto.DataType.Name(t).lower()


def _shape(tt) -> list:
    return [d.dim_param if d.HasField("dim_param") else (d.dim_value if d.HasField("dim_value") else None)
            for d in tt.shape.dim] if tt.HasField("shape") else None


def _io(values) -> list:
    return [{"name": v.name, "type": _type(v.type.tensor_type.elem_type), "shape": _shape(v.type.tensor_type)}
            for v in values]


def _attrs(node) -> dict:
    out = {}
    for a in node.attribute:
        v = onnx.helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode(errors="replace")
        elif isinstance(v, onnx.TensorProto):
            v = f"tensor {_type(v.data_type)} {list(v.dims)}"
        elif isinstance(v, onnx.GraphProto):
            v = f"graph {v.name} ({len(v.node)} nodes)"
        elif isinstance(v, (list, tuple)):
            v = [x.decode() if isinstance(x, bytes) else x for x in v]
        out[a.name] = v
    return out


def _all_nodes(graph):
    for n in graph.node:
        yield n
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _all_nodes(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    yield from _all_nodes(g)


def _chain(name: str, producers: dict, inits: dict, inputs: set, depth: int = 6) -> str:
    """'name <- Op <- Op <- source' following each producer's first non-constant input."""
    parts = [name]
    cur = name
    for _ in range(depth):
        if cur in inputs:
            parts.append("graph input")
            break
        if cur in inits:
            t = inits[cur]
            parts.append(f"initializer {_type(t.data_type)} {list(t.dims)}")
            break
        node = producers.get(cur)
        if node is None:
            parts.append("?")
            break
        parts.append(f"{node.op_type}({node.name})" if node.op_type in ("Constant",) else node.op_type)
        if node.op_type == "Constant":
            break
        nxt = [i for i in node.input if i and i not in inits and (producers.get(i) is None
                                                                   or producers[i].op_type != "Constant")]
        if not nxt:
            parts.append("constants")
            break
        cur = nxt[0]
        parts.append(cur)
    return " <- ".join(parts)


def describe_graph(model: onnx.ModelProto) -> dict:
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    producers = {o: n for n in g.node for o in n.output}
    inputs = {i.name for i in g.input}
    ops = Counter(f"{n.domain or 'ai.onnx'}::{n.op_type}" for n in _all_nodes(g))
    kinds: dict = {}
    negative = {}
    for n in _all_nodes(g):
        if n.op_type not in KINDS:
            continue
        entry = kinds.setdefault(n.op_type, {"count": 0, "attribute_sets": [], "wiring": []})
        entry["count"] += 1
        attrs = _attrs(n)
        for s in entry["attribute_sets"]:
            if s["attributes"] == attrs:
                s["count"] += 1
                break
        else:
            entry["attribute_sets"].append({"attributes": attrs, "count": 1, "first": n.name})
        if n.op_type in ("GroupQueryAttention", "MultiHeadAttention", "Attention", "RotaryEmbedding",
                         "SparseAttention", "PackedMultiHeadAttention") and len(entry["wiring"]) < 1:
            entry["wiring"].append({
                "node": n.name,
                "given_input_indices": [i for i, x in enumerate(n.input) if x],
                "inputs": {str(i): _chain(x, producers, inits, inputs) for i, x in enumerate(n.input) if x},
                "outputs": list(n.output)})
        if n.op_type in ("MatMulNBits", "DequantizeLinear") and len(n.input) > 1:
            scale = inits.get(n.input[1] if n.op_type == "DequantizeLinear" else n.input[2])
            if scale is None:
                continue
            arr = numpy_helper.to_array(scale).astype(np.float32)
            w = inits.get(n.input[1] if n.op_type == "MatMulNBits" else n.input[0])
            key = f"{n.op_type} ({_type(w.data_type) if w is not None else 'activation'})"
            d = negative.setdefault(key, {"nodes": 0, "with_negative": 0, "min": float("inf")})
            d["nodes"] += 1
            d["with_negative"] += int((arr < 0).any())
            d["min"] = min(d["min"], float(arr.min()))
    opsets = {(o.domain or "ai.onnx"): o.version for o in model.opset_import}
    return {"opsets": opsets, "ir_version": model.ir_version, "producer": f"{model.producer_name} "
            f"{model.producer_version}".strip(), "nodes": sum(ops.values()), "inputs": _io(g.input),
            "outputs": _io(g.output), "ops": dict(sorted(ops.items())), "attention": kinds,
            "negative_scales": negative}


_NP = {"int64": np.int64, "int32": np.int32, "float": np.float32, "float16": np.float16, "bool": np.bool_,
       "bfloat16": None}


def _feeds(sess, ids: list[int], past: dict | None, past_len: int, past_dummy_len: int = 0,
           kv_shape: tuple[int, int] | None = None, capacity: int = 0) -> dict:
    feeds = {}
    s = len(ids)
    for i in sess.get_inputs():
        t = i.type[len("tensor("):-1]
        dt = _NP.get(t)
        n = i.name
        if n == "input_ids":
            feeds[n] = np.array([ids], dt)
        elif n == "attention_mask":
            feeds[n] = np.ones((1, past_len + s), dt)
        elif n == "position_ids":
            feeds[n] = np.arange(past_len, past_len + s, dtype=dt)[None]
        elif n == "use_cache_branch":
            feeds[n] = np.array([past is not None], np.bool_)
        elif n == "seqlens_k":
            feeds[n] = np.array([past_len + s - 1], dt)
        elif n == "total_sequence_length":
            feeds[n] = np.array(past_len + s, dt)
        elif "past" in n:
            if past is not None:
                feeds[n] = past[n]
            else:
                shape = [d if isinstance(d, int) else None for d in i.shape]
                kv, hd = kv_shape or (None, None)
                dims = [1, shape[1] or kv or 1, max(past_dummy_len, capacity), shape[3] or hd or 1] if len(
                    shape) == 4 else None
                if dims is None:
                    raise ValueError(f"past input {n} with shape {i.shape}")
                feeds[n] = np.zeros(dims, dt)
        else:
            raise ValueError(f"no feed rule for input {n} {i.type} {i.shape}")
    return feeds


def _presents(sess, outs, past_names) -> dict:
    names = [o.name for o in sess.get_outputs()]
    got = dict(zip(names, outs))
    past = {}
    for p in past_names:
        q = p.replace("past_key_values", "present").replace("past_key", "present_key").replace("past_value",
                                                                                             "present_value")
        if q not in got:
            raise ValueError(f"no present output for {p} (outputs {names})")
        past[p] = got[q]
    return past


def _kv_shape(path: Path) -> tuple[int, int] | None:
    """(KV heads, head size) from genai_config.json or an HF config.json beside the model or in ../hf."""
    for f in (path.parent / "genai_config.json", path.parent / "config.json",
              path.parent.parent / "hf" / "config.json"):
        if not f.is_file():
            continue
        cfg = json.loads(f.read_text())
        dec = cfg.get("model", {}).get("decoder")
        if dec:
            return dec["num_key_value_heads"], dec["head_size"]
        if "hidden_size" in cfg:
            heads = cfg["num_attention_heads"]
            return cfg.get("num_key_value_heads", heads), cfg.get("head_dim") or cfg["hidden_size"] // heads
    return None


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(a.astype(np.float64), b.astype(np.float64))[0, 1])


def _exercise(sess, kv, reference: dict | None, capacity: int = 0) -> dict:
    """Prefill the 16-token prompt (empty past), decode one token with its presents, compare.

    ``capacity``: for GroupQueryAttention with ``sliding_window_cache=1`` the past is a fixed-capacity ring
    buffer (at least local_window_size long; attention_mask gives the real length), so the "empty" past of
    the prefill is that many zero rows."""
    res: dict = {"past_capacity": capacity} if capacity else {}
    in_names = [i.name for i in sess.get_inputs()]
    past_names = [n for n in in_names if "past" in n]
    out_names = [o.name for o in sess.get_outputs()]
    li = out_names.index("logits" if "logits" in out_names else out_names[0])
    try:
        dummy = 0
        try:
            outs = sess.run(None, _feeds(sess, PROMPT, None, 0, dummy, kv, capacity))
        except Exception as e:  # noqa: BLE001 -- some merged models want a 1-long dummy past
            if not past_names:
                raise
            res["prefill_error_with_empty_past"] = f"{type(e).__name__}: {e}"[:600]
            dummy = 1
            outs = sess.run(None, _feeds(sess, PROMPT, None, 0, dummy, kv, capacity))
        res["prefill"] = "ok" if dummy == 0 else "ok (past of length 1, use_cache_branch false)"
        logits = outs[li].astype(np.float32)
        res["logits_shape"] = list(logits.shape)
        last = logits[0, -1]
        res["prefill_argmax"] = int(last.argmax())
        res["prefill_finite"] = bool(np.isfinite(logits).all())
        nxt = res["prefill_argmax"]
        if reference is not None:  # decode the token torch chose, so the decode logits compare too
            ref = np.array(reference["prefill_last_logits"], np.float32)
            res["prefill_vs_torch_max_abs"] = float(np.abs(last - ref).max())
            res["prefill_vs_torch_corr"] = _corr(last, ref)
            res["prefill_argmax_matches_torch"] = nxt == reference["prefill_argmax"]
            nxt = reference["prefill_argmax"]
        if not past_names:
            res["decode"] = "no past inputs (a no-cache model): decode step not applicable"
            return res
        past = _presents(sess, outs, past_names)
        res["present_shapes"] = {k: list(v.shape) for k, v in list(past.items())[:2]}
        step = sess.run(None, _feeds(sess, [nxt], past, len(PROMPT), 0, kv, capacity))[li].astype(np.float32)[0, -1]
        res["decode"] = "ok"
        res["decode_finite"] = bool(np.isfinite(step).all())
        res["decode_argmax"] = int(step.argmax())
        if reference is not None:
            ref2 = np.array(reference["decode_last_logits"], np.float32)
            res["decode_vs_torch_max_abs"] = float(np.abs(step - ref2).max())
            res["decode_vs_torch_corr"] = _corr(step, ref2)
            res["decode_argmax_matches_torch"] = int(step.argmax()) == reference["decode_argmax"]
        full = sess.run(None, _feeds(sess, PROMPT + [nxt], None, 0, dummy, kv, capacity))[li].astype(np.float32)[0, -1]
        res["decode_vs_prefill17_max_abs"] = float(np.abs(step - full).max())
    except Exception as e:  # noqa: BLE001 -- recorded, not raised
        res["error"] = f"{type(e).__name__}: {e}"[:2000]
    return res


def _ring_capacity(path: Path) -> int:
    """local_window_size of GroupQueryAttention nodes with sliding_window_cache=1 (0 if none)."""
    model = onnx.load(str(path), load_external_data=False)
    cap = 0
    for n in _all_nodes(model.graph):
        if n.op_type == "GroupQueryAttention":
            a = _attrs(n)
            if a.get("sliding_window_cache", 0):
                cap = max(cap, int(a.get("local_window_size", 0)))
    return cap


def run(path: Path, reference: dict | None) -> dict:
    """The model on onnxruntime's CPU EP with default session options; if that fails, once more with
    graph optimizations and the memory pattern off (recorded under ``retry_without_optimizations``)."""
    import onnxruntime as ort

    ort.set_default_logger_severity(3)
    kv = _kv_shape(path)
    cap = _ring_capacity(path)
    res: dict = {"onnxruntime": ort.__version__, "provider": "CPUExecutionProvider"}
    try:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        res["loads"] = True
        res.update(_exercise(sess, kv, reference, cap))
    except Exception as e:  # noqa: BLE001 -- recorded, not raised
        res["loads"] = False
        res["error"] = f"{type(e).__name__}: {e}"[:2000]
    if "error" in res:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.enable_mem_pattern = False
        so.enable_mem_reuse = False
        try:
            sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
            res["retry_without_optimizations"] = {"loads": True} | _exercise(sess, kv, reference, cap)
        except Exception as e:  # noqa: BLE001 -- recorded, not raised
            res["retry_without_optimizations"] = {"loads": False, "error": f"{type(e).__name__}: {e}"[:2000]}
    return res


def _reference(path: Path) -> dict | None:
    for parent in path.parents:
        ref = parent / "hf" / "reference.json"
        if ref.is_file():
            return json.loads(ref.read_text())
        if parent.name in ("decoders", ""):
            break
    return None


def _size(path: Path) -> int:
    total = path.stat().st_size
    model = onnx.load(str(path), load_external_data=False)
    locs = {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"}
    for loc in locs:
        f = path.parent / loc
        if f.is_file():
            total += f.stat().st_size
    return total


def describe(path: Path) -> dict:
    model = onnx.load(str(path))
    info = {"model": path.name, "bytes": _size(path)} | describe_graph(model)
    del model
    info["run"] = run(path, _reference(path))
    out = path.with_name(path.stem + ".report.json")
    out.write_text(json.dumps(info, indent=1) + "\n")
    r = info["run"]
    status = r.get("error") or f"prefill {r.get('prefill')}, decode {r.get('decode')}"
    if "retry_without_optimizations" in r:
        rr = r["retry_without_optimizations"]
        status += f" | without optimizations: {rr.get('error') or 'decode ' + str(rr.get('decode'))}"
    print(f"[describe] {path}: {info['nodes']} nodes; {status[:200]}", flush=True)
    return info


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", type=Path)
    ap.add_argument("models", nargs="*", type=Path)
    args = ap.parse_args()
    paths = args.models or sorted(p for p in args.root.rglob("*.onnx") if "/hf/" not in str(p)
                                  and "/venvs/" not in str(p))
    for p in paths:
        try:
            describe(p)
        except Exception as e:  # noqa: BLE001 -- one bad model does not stop the rest
            print(f"[describe] {p}: FAILED {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
