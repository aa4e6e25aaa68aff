"""Write the attention torch's ONNX export decomposes (``scaled_dot_product_attention``: Optimum's
``text-generation-with-past`` exports, and the models quantized from them) as one ONNX ``Attention``-23 node where
it computes in float16 or bfloat16, so that TensorRT runs it with its dedicated (fused) attention kernels.

torch.onnx writes the scale as its square root on both sides, the additive mask as ``Where(mask, 0, -inf)``, and
zeroes a row of NaN probabilities (a query that sees no key) after the Softmax; transformers' ``repeat_kv`` spreads
the grouped key/value heads over the query heads::

    Before:
        q [B, N, S, H] ─ Mul(√s) ─────────────────────────────────────────────────────────┐
        k [B, Nkv, T, H] ─ Unsqueeze(2) ─ Expand [B, Nkv, N/Nkv, T, H] ─ Reshape [B, N, T, H]
            ─ Transpose(0,1,3,2) [─ Cast] ─ Mul(√s) ──────────────────────────────────── MatMul
            ─ Add(mask [B, 1|N, S, T]) [─ Cast(float32)] ─ Softmax [─ Cast] [─ Where(IsNaN(·), 0, ·)] ─┐
        v [B, Nkv, T, H] ─ Unsqueeze(2) ─ Expand ─ Reshape [B, N, T, H] [─ Cast] ───────────────────── MatMul
            ─ y [B, N, S, H]
    After:
        k, v [B, Nkv, T, H] [─ Cast] ─┐
        q, mask ─────────────── Attention(scale = √s·√s) ─ y [B, N, S, H]

Grouped heads go in ungrouped (the Attention op groups the N query heads over the Nkv key/value heads itself,
query head h reading key/value head h // (N/Nkv), as ``repeat_kv``'s Reshape lays them out) where the Expand's shape
spells ``repeat_kv`` (N/Nkv at axis 2, the keys' own dims or 1 elsewhere) and the Reshape keeps the keys' batch and
length; a ``Shape`` of the repeated keys (torch reads the key length off it for the mask) then reads the keys
themselves where it is only indexed at the axes both share. Otherwise the repeated keys and values go in as they
are (exact as well). A Cast to the attention's type goes where the keys or values arrive in another one (a
float32 cache). The mask's ``-inf`` fill becomes the type's lowest finite value: a query row that sees no key is
then finite in any kernel (onnxruntime 1.32's float16 ``Attention`` gives zeros for such a row with either fill,
what the source's NaN guard gives), and the NaN guard goes.

Declined, with the reason: a float32 attention (:data:`trt_bridge.lower.attention_fusion.FLOAT32`); scores or
heads that are not 4-D; a mask of rank other than 4; an intermediate tensor read elsewhere. (A scale that is no
constant leaves scores this rule does not recognize: the Softmax is not its form.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from trt_bridge.ir.node_index import NodeIndex
from trt_bridge.lower.attention_fusion import (
    FLOAT32,
    LOW,
    NOT_ATTENTION,
    node_attr,
    softmax_probs,
    through_cast,
    value_product,
)

#: the decline of scores that are not torch's MatMul(q, Transpose(k)) form (the other rule's reason stands)
OTHER_FORM = "not torch's scaled_dot_product_attention form"
#: the lowest finite value of float16 and bfloat16 (float32's otherwise)
LOWEST_FINITE = {onnx.TensorProto.FLOAT16: -65504.0, onnx.TensorProto.BFLOAT16: -3.3895313892515355e38}


@dataclass(frozen=True)
class TorchAttentionBlock:
    """One decomposed attention, as :meth:`TorchAttentionFusion.rewrite` replaces it."""

    softmax: str
    q: str  # [B, N, S, H]
    k: str  # [B, Nkv, T, H] (or the repeated [B, N, T, H])
    v: str
    mask: str | None  # additive, [B, 1|N, S, T]
    scale: float
    out: str
    dtype: int
    nodes: tuple[int, ...]  # the nodes it replaces; the last is where Attention goes
    cast_k: bool = False
    cast_v: bool = False
    cast_mask: bool = False
    fill: tuple[str, int, tuple[int, ...]] | None = None  # the mask's -inf fill: its Where's constant, type, dims
    shapes: tuple[int, ...] = ()  # Shape nodes of the repeated keys that read the keys themselves now


class TorchAttentionFusion:
    name = "torch-attention-fusion"
    op_types = ("Softmax",)
    outcome = ("written as one ONNX Attention-23 node by rule 'torch-attention-fusion' (float16/bfloat16: "
               "TensorRT's dedicated attention kernels)")

    def match(self, ix: NodeIndex, index: int) -> TorchAttentionBlock | str:
        softmax = ix.nodes[index]
        found = softmax_probs(ix, index)  # forward: [Cast] [─ Where(IsNaN(p), 0, p)] ─ MatMul(p, v)
        if isinstance(found, str):
            return found
        chain, probs, readers = found
        guard = _nan_guard(ix, probs, readers)
        if guard is not None:
            chain += guard
            probs = ix.nodes[guard[-1]].output[0]
            readers = ix.readers.get(probs, [])
        if (reader := value_product(ix, probs, readers)) is None:
            return NOT_ATTENTION
        chain.append(reader)
        out, v_in = ix.nodes[reader].output[0], ix.nodes[reader].input[1]
        # backward: [Cast] ─ [Add(mask)] ─ [Mul|Div(scale)] ─ MatMul(q [· √s], kᵀ [· √s])
        x = through_cast(ix, softmax.input[0], chain)
        mask = None
        if (add := ix.node(x, "Add")) is not None:
            side = [j for j in (0, 1) if _scores(ix, add[1].input[j]) is not None]
            if not side:
                return OTHER_FORM
            mask, x = add[1].input[1 - side[0]], add[1].input[side[0]]
            chain.append(add[0])
        scores = _scores(ix, x)
        if scores is None:
            return OTHER_FORM
        nodes, scale, (i, product) = scores
        chain += nodes + [i]
        q, scale_q = _scaled(ix, product.input[0], chain)
        kt, scale_k = _scaled(ix, product.input[1], chain)
        kt = through_cast(ix, kt, chain)
        transpose = ix.node(kt, "Transpose")
        if transpose is None or list(node_attr(transpose[1], "perm", [])) != [0, 1, 3, 2]:
            return OTHER_FORM
        chain.append(transpose[0])
        k = through_cast(ix, transpose[1].input[0], chain)
        v = through_cast(ix, v_in, chain)
        dtype = ix.types.get(product.output[0])
        if dtype not in LOW:
            return FLOAT32 if dtype == onnx.TensorProto.FLOAT else f"scores of element type {dtype}"
        if any(ix.rank(t) != 4 for t in (q, k, v, out)):
            return f"the queries, keys, values and context are not all 4-D heads ({q}, {k}, {v}, {out})"
        if mask is not None and ix.rank(mask) != 4:
            return f"the additive mask '{mask}' has rank {ix.rank(mask)}, not 4 ([B, N or 1, S, T])"
        grouped, shapes = _ungrouped(ix, k, v, chain)
        if grouped is not None:
            (k, v), more = grouped
            chain += more
        nodes = set(chain)
        for n in nodes:  # what the block replaces is read by the block alone (and the Shapes rewired)
            for o in ix.nodes[n].output:
                if o and o != out and (o in ix.outputs or not set(ix.readers.get(o, [])) <= nodes | set(shapes)):
                    return f"'{o}' (inside the attention) is read elsewhere"
        fill = _fill(ix, mask, nodes) if mask is not None else None
        return TorchAttentionBlock(
            softmax.name, q, k, v, mask, float(np.float32(scale * scale_q * scale_k)), out, dtype,
            tuple(sorted(nodes)), ix.types.get(k) != dtype, ix.types.get(v) != dtype,
            mask is not None and ix.types.get(mask) != dtype, fill, tuple(shapes))

    def rewrite(self, g: onnx.GraphProto, block: TorchAttentionBlock) -> None:
        base = block.softmax.rpartition("/")[0] or block.softmax
        new: list[onnx.NodeProto] = []

        def cast(tensor: str, suffix: str) -> str:
            out = f"{base}/attention_fusion/{suffix}"
            new.append(helper.make_node("Cast", [tensor], [out], name=f"{out}_node", to=block.dtype))
            return out

        nodes = list(g.node)
        for i in block.shapes:  # torch's key length, off the keys themselves
            nodes[i].input[0] = block.k
        if block.fill is not None:  # the type's lowest finite value for -inf
            lowest, (name, dtype, dims) = f"{base}/attention_fusion/lowest", block.fill
            value = LOWEST_FINITE.get(dtype, -3.4028234663852886e38)
            g.initializer.append(helper.make_tensor(lowest, dtype, dims, [value] * int(np.prod(dims))))
            for n in nodes:
                if n.op_type == "Where" and block.mask in n.output:
                    n.input[list(n.input).index(name)] = lowest
        inputs = [cast(block.k, "keys") if block.cast_k else block.k,
                  cast(block.v, "values") if block.cast_v else block.v]
        if block.mask is not None:
            inputs.append(cast(block.mask, "mask") if block.cast_mask else block.mask)
        new.append(helper.make_node("Attention", [block.q, *inputs], [block.out], name=f"{base}/Attention",
                                    scale=block.scale))
        at, replaced = block.nodes[-1], set(block.nodes)
        kept = [n for i, n in enumerate(nodes[:at]) if i not in replaced] + new + \
            [n for i, n in enumerate(nodes[at:], start=at) if i not in replaced]
        del g.node[:]
        g.node.extend(kept)


def _nan_guard(ix: NodeIndex, probs: str, readers: list[int]) -> list[int] | None:
    """torch's ``Where(IsNaN(p), 0, p)`` after the Softmax: [IsNaN, Where] indices, or None."""
    ops = sorted((ix.nodes[r].op_type, r) for r in readers)
    if [op for op, _ in ops] != ["IsNaN", "Where"]:
        return None
    isnan, where = ops[0][1], ops[1][1]
    w = ix.nodes[where]
    if list(w.input) != [ix.nodes[isnan].output[0], w.input[1], probs] or ix.scalar(w.input[1]) != 0.0 \
            or ix.readers.get(ix.nodes[isnan].output[0]) != [where]:
        return None
    return [isnan, where]


def _scores(ix: NodeIndex, tensor: str):
    """``tensor`` as ``MatMul(·, ·) [× or ÷ a constant]``: (the scale's node indices, the scale, (MatMul index,
    node)), or None."""
    for op in ("Mul", "Div"):
        if (n := ix.node(tensor, op)) is not None:
            for j in ((0, 1) if op == "Mul" else (1,)):
                c, product = ix.scalar(n[1].input[j]), ix.node(n[1].input[1 - j], "MatMul")
                if c is not None and product is not None and c != 0:
                    return [n[0]], (c if op == "Mul" else 1.0 / c), product
            return None
    product = ix.node(tensor, "MatMul")
    return None if product is None else ([], 1.0, product)


def _scaled(ix: NodeIndex, tensor: str, chain: list[int]) -> tuple[str, float]:
    """``tensor`` as ``Mul(x, constant)``: (x, the constant), its node added to ``chain``; else (tensor, 1.0)."""
    mul = ix.node(tensor, "Mul")
    for j in (0, 1) if mul is not None else ():
        c = ix.scalar(mul[1].input[j])
        if c is not None:
            chain.append(mul[0])
            return mul[1].input[1 - j], c
    return tensor, 1.0


def _same_dim(ix: NodeIndex, a: str, i: int, b: str, j: int) -> bool:
    da, db = ix.shapes.get(a), ix.shapes.get(b)
    if da is None or db is None or len(da.dim) <= i or len(db.dim) <= j:
        return False
    x, y = da.dim[i], db.dim[j]
    return (x.HasField("dim_value") and x.dim_value == y.dim_value) or (
        x.HasField("dim_param") and bool(x.dim_param) and x.dim_param == y.dim_param)


def _pieces(ix: NodeIndex, tensor: str) -> list | None:
    """A shape tensor as its elements: an int, or (tensor, axis) for ``Shape(tensor)[axis]``; None if unread.
    torch's ``Where(shape == -1, 1, shape)`` and ``Reshape(shape, [-1])`` are seen through (their ones keep a dim)."""
    if (values := ix.ints(tensor)) is not None:
        return values
    if (where := ix.node(tensor, "Where")) is not None and set(ix.ints(where[1].input[1]) or [0]) == {1}:
        return _pieces(ix, where[1].input[2])
    if (reshape := ix.node(tensor, "Reshape")) is not None and ix.ints(reshape[1].input[1]) == [-1]:
        return _pieces(ix, reshape[1].input[0])
    concat = ix.node(tensor, "Concat")
    if concat is None:
        return None
    out = []
    for part in concat[1].input:
        if (values := ix.ints(part)) is not None:
            out += values
            continue
        unsq = ix.node(part, "Unsqueeze")
        gather = ix.node(unsq[1].input[0], "Gather") if unsq is not None else None
        shape = ix.node(gather[1].input[0], "Shape") if gather is not None else None
        index = ix.ints(gather[1].input[1]) if gather is not None else None
        if shape is None or index is None or len(index) != 1 or len(shape[1].attribute):
            return None
        out.append((shape[1].input[0], index[0]))
    return out


def _repeat(ix: NodeIndex, rep: str):
    """``rep`` [B, N, T, H] as transformers' ``repeat_kv`` of x [B, Nkv, T, H]: (x, its node indices), or None."""
    reshape = ix.node(rep, "Reshape")
    expand = ix.node(reshape[1].input[0], "Expand") if reshape is not None else None
    unsq = ix.node(expand[1].input[0], "Unsqueeze") if expand is not None else None
    if unsq is None:
        return None
    axes = ix.ints(unsq[1].input[1]) if len(unsq[1].input) > 1 else list(node_attr(unsq[1], "axes", []))
    x = unsq[1].input[0]
    kv, heads, pieces = ix.dim(x, 1), ix.dim(rep, 1), _pieces(ix, expand[1].input[1])
    if axes != [2] or not kv or not heads or heads % kv or pieces is None or len(pieces) != 5 \
            or pieces[2] != heads // kv or not all(_same_dim(ix, rep, a, x, a) for a in (0, 2, 3)):
        return None
    for piece, axis in zip(pieces[:2] + pieces[3:], (0, 1, 2, 3)):
        if piece != 1 and piece != (x, axis) and not (isinstance(piece, int) and piece == ix.dim(x, axis)):
            return None
    return x, [reshape[0], expand[0], unsq[0]]


def _ungrouped(ix: NodeIndex, k: str, v: str, chain: list[int]):
    """The keys and values before ``repeat_kv`` ((k, v), the nodes), and the Shape nodes of the repeated ones to
    rewire; (None, []) where the repetition is not spelled out or something else reads it."""
    found = _repeat(ix, k), _repeat(ix, v)
    if None in found or ix.dim(found[0][0], 1) != ix.dim(found[1][0], 1):
        return None, []
    more = found[0][1] + found[1][1]
    shapes, inside = [], set(chain) | set(more)
    for n in more:
        for o in ix.nodes[n].output:
            for r in ix.readers.get(o, []):
                if r in inside:
                    continue
                if o != k or not _key_dims_only(ix, r):
                    return None, []
                shapes.append(r)
    return ((found[0][0], found[1][0]), more), shapes


def _key_dims_only(ix: NodeIndex, index: int) -> bool:
    """Whether node ``index`` is a whole ``Shape`` read only by Gathers at axes 0, 2 and 3 (which the repeated keys
    share with the keys)."""
    node = ix.nodes[index]
    if node.op_type != "Shape" or len(node.attribute) or node.output[0] in ix.outputs:
        return False
    for r in ix.readers.get(node.output[0], []):
        gather = ix.nodes[r]
        axes = ix.ints(gather.input[1]) if gather.op_type == "Gather" and gather.input[0] == node.output[0] else None
        if axes is None or not set(a % 4 for a in axes) <= {0, 2, 3}:
            return False
    return True


def _fill(ix: NodeIndex, mask: str, nodes: set[int]) -> tuple[str, int, tuple[int, ...]] | None:
    """An additive mask's ``Where`` fill of -inf (the constant's name, type and dims), where only the block reads
    the mask."""
    where = ix.node(mask, "Where")
    if where is None or not set(ix.readers.get(mask, [])) <= nodes or mask in ix.outputs:
        return None
    for j in (1, 2):
        c = ix.scalar(where[1].input[j])
        if c is not None and c == -np.inf:
            proto = ix.constants[where[1].input[j]]
            return where[1].input[j], proto.data_type, tuple(proto.dims)
    return None
