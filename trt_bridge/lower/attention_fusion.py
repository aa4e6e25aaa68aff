"""Write the attention the lift rules leave decomposed as one ONNX ``Attention``-23 node where it computes in
float16 or bfloat16, so that TensorRT runs it with its dedicated (fused) attention kernels.

The lift rules write attention as MatMul → Softmax → MatMul (``lift/kv_attention.py: grouped_attention`` for
``GroupQueryAttention``, ``lift/ort_attention.py: write_heads`` for ``Attention``/``MultiHeadAttention``): standard
ONNX at any opset, which onnxruntime runs to compare and calibrate, and which TensorRT builds in every float type,
but as separate layers. TensorRT-RTX 1.7 builds a one-output ``Attention``-23 in float16 and bfloat16 (GQA as 4-D
query heads over fewer key/value heads, dynamic sequence and past lengths); float32 ``Attention`` fails to build
without ``TRT_decomposable``, so a float32 attention keeps the decomposed form. This rule runs once the types are
final (after ``--high-precision``), on the exported model (:mod:`trt_bridge.lower.attention_pass` offers it each
Softmax first, then :mod:`trt_bridge.lower.torch_attention_fusion`, torch's exported form)::

    Before (grouped, lift/kv_attention.py):
        q [B, N, S, H] ─ Reshape [B, Nkv, N/Nkv, S, H] ─────────────┐
        k [B, Nkv, T, H] ─ Unsqueeze(2) ─ Transpose(0,1,2,4,3) ──── MatMul ─ Mul(scale)
            ─ Where(mask [B, 1, 1, S, T], ·, lowest) [─ Cast(float32)] ─ Softmax [─ Cast] ─┐
        v [B, Nkv, T, H] ─ Unsqueeze(2) ──────────────────────────────────────────────── MatMul
            ─ Reshape [B, N, S, H] ─ y
    After:
        mask ─ Squeeze(1) ─ [B, 1, S, T] ─┐
        q, k, v ────────────────── Attention(scale) ─ y [B, N, S, H]

    Before (per head, lift/ort_attention.py):
        q4 = Transpose(0,2,1,3)(Reshape(q)) [B, N, S, H], kᵀ = Transpose(0,2,3,1)(Reshape(k) [B, T, N, H]),
        v4 [B, N, T, Hv]: MatMul(q4, kᵀ) ─ Mul(scale) [─ Add(additive mask [B, N|1, S|1, T])]
            [─ Cast(float32)] ─ Softmax [─ Cast] ─ MatMul(·, v4) ─ y [B, N, S, Hv]
    After:
        Reshape(k) ─ Transpose(0,2,1,3) ─┐  (the mask cast to q's type where it differs, and a mask of one
        q4, v4, mask ───────────── Attention(scale) ─ y   query row [.., 1, T] expanded to the S rows:
                                                           onnxruntime 1.32 does not broadcast it)

A Softmax that ``--high-precision`` kept in float32 (the Casts around it) becomes Attention's own softmax: TensorRT's
kernels accumulate it in float32 (its parser rejects ``softmax_precision``: "Setting softmax precision is not
supported in TensorRT Attention"). The model's default-domain opset becomes 23 (from 21 or later only the opset
number changes: no op between them changed meaning; earlier ones go through onnx's version converter).

Declined, with the reason: a float32 attention; a softcap (TensorRT-RTX 1.7's parser: "Setting softcap is not
supported in TensorRT Attention", so the Tanh stays decomposed); a mask both boolean and additive, a Where whose
fill is not the lowest float, an additive mask of unknown rank; a Softmax not over the keys; an intermediate tensor
read elsewhere; heads the reshapes do not spell.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from trt_bridge.ir.node_index import NodeIndex
from trt_bridge.ir.size import is_large

ATTENTION_OPSET = 23
LOW = {onnx.TensorProto.FLOAT16: "float16", onnx.TensorProto.BFLOAT16: "bfloat16"}
FLOAT32 = ("float32: TensorRT builds Attention only in float16/bfloat16 without TRT_decomposable; the decomposed "
           "MatMul/Softmax form stays")
#: a Where's fill at or below this masks a score out (float16's lowest is -65504)
LOWEST = -3.0e4
#: the decline of a Softmax that is no attention (not read by probabilities × values): not reported
NOT_ATTENTION = "the Softmax is not read by one MatMul (probabilities × values) alone"


@dataclass(frozen=True)
class AttentionBlock:
    """One decomposed attention, as :meth:`AttentionFusion.rewrite` replaces it."""

    softmax: str  # the Softmax node's name
    q: str  # [B, N, S, H]
    k: str  # [B, Nkv, T, H]; with ``k_heads_last``: [B, T, N, H], transposed on the way in
    v: str  # [B, Nkv, T, H]
    k_heads_last: bool
    mask: str | None
    mask_kind: str  # 'none', 'bool' (true: seen), 'not' (true: masked), 'additive'
    scale: float
    out: str  # [B, N, S, H]
    dtype: int  # the attention's element type
    nodes: tuple[int, ...]  # indices of the nodes it replaces; the last is where Attention goes
    mask_rank: int = 0
    mask_type: int = 0
    expand: bool = False  # a mask of one query row [.., 1, T], spread over the queries (onnxruntime needs S rows)


@dataclass
class FusionResult:
    """What :func:`trt_bridge.lower.attention_pass.fuse_attention` did: the Softmax nodes fused (by name) and the
    others with their reasons."""

    fused: list[str] = field(default_factory=list)
    declined: dict[str, str] = field(default_factory=dict)
    opset: tuple[int, int] | None = None  # (from, to) where the opset was raised
    by_rule: dict[str, list[str]] = field(default_factory=dict)  # rule name → the Softmax nodes it fused

    def to_dict(self) -> dict:
        return {"fused": list(self.fused), "declined": dict(self.declined),
                "opset": list(self.opset) if self.opset else None}


def node_attr(node: onnx.NodeProto, name: str, default=None):
    """The value of ``node``'s attribute ``name`` (``default`` where it has none)."""
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def softmax_probs(ix: NodeIndex, index: int) -> tuple[list[int], str, list[int]] | str:
    """From the Softmax at ``index`` through an optional Cast: (the chain's node indices, the probabilities' tensor,
    its readers); or why the Softmax is not over the keys."""
    softmax = ix.nodes[index]
    axis = int(node_attr(softmax, "axis", -1))
    if axis != -1 and axis != (ix.rank(softmax.output[0]) or 0) - 1:
        return f"Softmax over axis {axis}, not the keys (the last)"
    chain, probs = [index], softmax.output[0]
    readers = ix.readers.get(probs, [])
    if len(readers) == 1 and ix.nodes[readers[0]].op_type == "Cast":
        chain.append(readers[0])
        probs = ix.nodes[readers[0]].output[0]
        readers = ix.readers.get(probs, [])
    return chain, probs, readers


def value_product(ix: NodeIndex, probs: str, readers: list[int]) -> int | None:
    """The index of ``probs``' one reader where it is ``MatMul(probs, v)``, else None."""
    if len(readers) != 1 or ix.nodes[readers[0]].op_type != "MatMul" or ix.nodes[readers[0]].input[0] != probs:
        return None
    return readers[0]


def through_cast(ix: NodeIndex, tensor: str, chain: list[int]) -> str:
    """What ``tensor`` is a Cast of (the Cast's index added to ``chain``), or ``tensor`` itself."""
    cast = ix.node(tensor, "Cast")
    if cast is None:
        return tensor
    chain.append(cast[0])
    return cast[1].input[0]


class AttentionFusion:
    name = "attention-fusion"
    op_types = ("Softmax",)
    outcome = ("written as one ONNX Attention-23 node by rule 'attention-fusion' (float16/bfloat16: TensorRT's "
               "dedicated attention kernels)")

    def match(self, ix: NodeIndex, index: int) -> AttentionBlock | str:
        softmax = ix.nodes[index]
        found = softmax_probs(ix, index)  # forward: [Cast] ─ MatMul(probs, v)
        if isinstance(found, str):
            return found
        chain, probs, readers = found
        if (reader := value_product(ix, probs, readers)) is None:
            return NOT_ATTENTION
        chain.append(reader)
        context, v_in = ix.nodes[reader].output[0], ix.nodes[reader].input[1]
        x = through_cast(ix, softmax.input[0], chain)  # backward: [Cast] ─ [mask] ─ Mul(scale) ─ MatMul(q, kᵀ)
        mask, kind = None, "none"
        if (where := ix.node(x, "Where")) is not None:
            i, n = where
            fills = [ix.scalar(n.input[j]) for j in (1, 2)]
            if fills[1] is not None and fills[1] <= LOWEST:
                mask, kind, x = n.input[0], "bool", n.input[1]
            elif fills[0] is not None and fills[0] <= LOWEST:
                mask, kind, x = n.input[0], "not", n.input[2]
            else:
                return f"the Where '{n.name}' before the Softmax fills with {fills}, not the lowest float"
            chain.append(i)
        elif (add := ix.node(x, "Add")) is not None:
            i, n = add
            side = [j for j in (0, 1) if _scaled_scores(ix, n.input[j]) is not None]
            if not side:
                return f"the Add '{n.name}' before the Softmax adds no scaled scores (q·kᵀ·scale)"
            mask, kind, x = n.input[1 - side[0]], "additive", n.input[side[0]]
            chain.append(i)
        if ix.node(x, "Where") is not None or ix.node(x, "Add") is not None:
            return "the scores are masked twice (boolean and additive, or two additive masks); not fused"
        capped = ix.node(x, "Mul")
        if capped is not None and any(ix.node(t, "Tanh") for t in capped[1].input):
            return ("softcap: TensorRT-RTX 1.7's parser rejects Attention's softcap (\"Setting softcap is not "
                    "supported in TensorRT Attention\"); the decomposed form stays")
        scaled = _scaled_scores(ix, x)
        if scaled is None:
            return "the scores are not MatMul(queries, keys) × a constant scale"
        (i, _), scale, (j, product) = scaled
        chain += [i, j]
        q_in, k_in = product.input
        dtype = ix.types.get(q_in)
        if dtype not in LOW:
            return FLOAT32 if dtype == onnx.TensorProto.FLOAT else f"queries of element type {dtype}"
        heads = _grouped(ix, q_in, k_in, v_in, context) or _per_head(ix, q_in, k_in, v_in, context)
        if isinstance(heads, str) or heads is None:
            return heads or "the queries, keys and values are not the heads the lift rules write"
        fields, more = heads
        nodes = set(chain) | set(more)
        for n in nodes:  # what the block replaces is read by the block alone
            for o in ix.nodes[n].output:
                if o and o != fields[-1] and (o in ix.outputs or not set(ix.readers.get(o, [])) <= nodes):
                    return f"'{o}' (inside the attention) is read elsewhere"
        rank = ix.rank(mask) if mask is not None else None
        if kind == "additive" and rank != 4:
            return f"the additive mask '{mask}' has rank {rank}, not 4 ([B, N or 1, S or 1, T])"
        if kind in ("bool", "not"):
            if rank is None or rank > 5 or (rank == 5 and ix.dim(mask, 1) != 1):
                return f"the boolean mask '{mask}' is not [B, 1, 1, S, T] or of rank ≤ 4"
        q, k, v, heads_last, out = fields
        return AttentionBlock(softmax.name, q, k, v, heads_last, mask, kind, float(scale), out, dtype,
                              tuple(sorted(nodes)), rank or 0, ix.types.get(mask, 0) if mask else 0,
                              bool(mask) and ix.dim(mask, (rank or 2) - 2) == 1)

    def rewrite(self, g: onnx.GraphProto, block: AttentionBlock) -> None:
        base = block.softmax.rpartition("/")[0] or block.softmax
        new: list[onnx.NodeProto] = []

        def add(op: str, inputs: list[str], suffix: str, **attrs) -> str:
            out = f"{base}/attention_fusion/{suffix}"
            new.append(helper.make_node(op, inputs, [out], name=f"{base}/attention_fusion/{suffix}_node", **attrs))
            return out

        k = block.k
        if block.k_heads_last:
            k = add("Transpose", [k], "key_heads", perm=[0, 2, 1, 3])
        inputs = [block.q, k, block.v]
        if block.mask is not None:
            mask = block.mask
            if block.mask_rank != 4 and block.mask_kind != "additive":  # [B, 1, 1, S, T] or [S, T]: rank 4
                axes = f"{base}/attention_fusion/mask_axes"
                squeeze = block.mask_rank == 5
                values = [1] if squeeze else list(range(4 - block.mask_rank))
                g.initializer.append(numpy_helper.from_array(np.array(values, np.int64), axes))
                mask = add("Squeeze" if squeeze else "Unsqueeze", [mask, axes], "mask")
            if block.mask_kind.startswith("not"):
                mask = add("Not", [mask], "visible")
            if block.mask_kind == "additive" and block.mask_type != block.dtype:
                mask = add("Cast", [mask], "mask_cast", to=block.dtype)
            if block.expand:
                ones, one = f"{base}/attention_fusion/ones", f"{base}/attention_fusion/one"
                g.initializer.extend([numpy_helper.from_array(np.array([1, 1], np.int64), ones),
                                      numpy_helper.from_array(np.array([1], np.int64), one)])
                rows = add("Shape", [block.q], "query_rows", start=2, end=3)  # [B, 1, S, 1]
                mask = add("Expand", [mask, add("Concat", [ones, rows, one], "mask_shape", axis=0)], "mask_rows")
            inputs.append(mask)
        new.append(helper.make_node("Attention", inputs, [block.out], name=f"{base}/Attention", scale=block.scale))
        at = block.nodes[-1]
        nodes = list(g.node)
        replaced = set(block.nodes)
        kept = [n for i, n in enumerate(nodes[:at]) if i not in replaced] + new + \
            [n for i, n in enumerate(nodes[at:], start=at) if i not in replaced]
        del g.node[:]
        g.node.extend(kept)


def _scaled_scores(ix: NodeIndex, tensor: str):
    """``tensor`` as ``Mul(MatMul(q, k), scale)`` (either order): ((Mul index, node), scale, (MatMul index, node))."""
    scaled = ix.node(tensor, "Mul")
    if scaled is None:
        return None
    i, n = scaled
    for j in (0, 1):
        scale, product = ix.scalar(n.input[j]), ix.node(n.input[1 - j], "MatMul")
        if scale is not None and product is not None:
            return scaled, scale, product
    return None


def _grouped(ix: NodeIndex, q5: str, k5: str, v5: str, context: str):
    """The grouped form's heads: (q, k, v [B, heads, S or T, H], False, the output) and the nodes it replaces
    besides the chain, or None (another form), or why it is declined."""
    reshape, transpose, unsq_v = ix.node(q5, "Reshape"), ix.node(k5, "Transpose"), ix.node(v5, "Unsqueeze")
    if reshape is None or transpose is None or unsq_v is None:
        return None
    unsq_k = ix.node(transpose[1].input[0], "Unsqueeze")
    if list(node_attr(transpose[1], "perm", [])) != [0, 1, 2, 4, 3] or unsq_k is None:
        return None
    if any(ix.ints(n.input[1]) != [2] if len(n.input) > 1 else list(node_attr(n, "axes", [])) != [2]
           for _, n in (unsq_k, unsq_v)):
        return "the keys or values are not unsqueezed at axis 2"
    shape = ix.ints(reshape[1].input[1])
    readers = ix.readers.get(context, [])
    out = ix.node(ix.nodes[readers[0]].output[0], "Reshape") if len(readers) == 1 else None
    out_shape = ix.ints(out[1].input[1]) if out is not None and out[0] == readers[0] else None
    if shape is None or len(shape) != 5 or out_shape is None or len(out_shape) != 4:
        return "the grouped reshapes of the queries and of the context are not constants of rank 5 and 4"
    kv, group, size = shape[1], shape[2], shape[4]
    if shape[0] != 0 or shape[3] != -1 or out_shape[0] != 0 or out_shape[1] != kv * group or out_shape[2] != -1 \
            or out_shape[3] != size:
        return f"the grouped reshapes {shape} and {out_shape} do not spell heads [B, N, S, H]"
    fields = (reshape[1].input[0], unsq_k[1].input[0], unsq_v[1].input[0], False, out[1].output[0])
    return fields, [reshape[0], transpose[0], unsq_k[0], unsq_v[0], out[0]]


def _per_head(ix: NodeIndex, q4: str, kt: str, v4: str, context: str):
    """The per-head form's heads: (q, the keys [B, T, N, H] transposed on the way in, v, True, the output), or
    None (another form), or why it is declined."""
    tq, tk, tv = ix.node(q4, "Transpose"), ix.node(kt, "Transpose"), ix.node(v4, "Transpose")
    if tq is None or tk is None or tv is None:
        return None
    if [list(node_attr(n, "perm", [])) for _, n in (tq, tk, tv)] != [[0, 2, 1, 3], [0, 2, 3, 1], [0, 2, 1, 3]]:
        return None
    more = [tk[0]] if len(ix.readers.get(kt, [])) == 1 and kt not in ix.outputs else []
    return (q4, tk[1].input[0], v4, True, context), more


def raise_opset(model: onnx.ModelProto, source: int) -> onnx.ModelProto:
    """``model`` at opset 23: from 21 or 22 the number alone (23 only added types and ops), else by onnx's version
    converter (a model over 2 GB, which protobuf cannot hand it, also by the number alone)."""
    if source >= 21 or is_large(model):
        for imp in model.opset_import:
            if imp.domain in ("", "ai.onnx"):
                imp.version = ATTENTION_OPSET
        return model
    from onnx import version_converter

    return version_converter.convert_version(model, ATTENTION_OPSET)
