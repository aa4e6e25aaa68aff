"""onnxruntime's com.microsoft ``GroupQueryAttention`` written back as standard ONNX
(``lift/group_query_attention.py``), against onnxruntime running the fused node: a first prompt with right
padding, decode steps with a past, a subsequent prompt, packed Q/K/V, interleaved and partial rotary, a sliding
window, softcap; the cache outputs keep their names and values; TensorRT-RTX parses and builds the result at a
prefill and a decode profile; each decline names its reason. A window cache (``sliding_window_cache=1``) over
generation loops past its window and capacity, and onnxruntime-genai's real Mistral export with it.

The model is wired as onnxruntime-genai's builder wires it: ``seqlens_k = ReduceSum(attention_mask) − 1`` and
``total_sequence_length = Shape(attention_mask)[1]``, both int32::

    q [B, S, N·H], k, v [B, S, Nkv·H], past_key, past_value [B, Nkv, P, H], attention_mask [B, T]
      ─ GroupQueryAttention(seqlens_k, total_sequence_length, cos_cache, sin_cache) ─ y, present_key, present_value
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from apply_rule import declined, lifted, ops_left, run_outputs  # noqa: E402
from helpers import assert_builds_at, save  # noqa: E402

from trt_bridge.lift.group_query_attention import GroupQueryAttention  # noqa: E402

N, NKV, H = 4, 2, 32  # onnxruntime: head sizes multiple of 16, rotary halves multiple of 8
MAX_POS = 64
RNG = np.random.default_rng(0)


def _caches(rotary_dim: int) -> dict[str, np.ndarray]:
    inv = 1.0 / (10000 ** (np.arange(0, rotary_dim, 2) / rotary_dim))
    angles = np.arange(MAX_POS)[:, None] * inv[None, :]
    return {"cos_cache": np.cos(angles).astype(np.float32), "sin_cache": np.sin(angles).astype(np.float32)}


def gqa_model(packed=False, rotary=True, rotary_dim=H, past=True, dtype=TensorProto.FLOAT, **attrs):
    """The node as onnxruntime-genai writes it (see the module docstring), with ``attrs`` on it."""
    inputs, inits = [], {}
    if packed:
        inputs.append(helper.make_tensor_value_info("qkv", dtype, ["B", "S", (N + 2 * NKV) * H]))
        names = ["qkv", "", ""]
    else:
        inputs += [helper.make_tensor_value_info("q", dtype, ["B", "S", N * H]),
                   helper.make_tensor_value_info("k", dtype, ["B", "S", NKV * H]),
                   helper.make_tensor_value_info("v", dtype, ["B", "S", NKV * H])]
        names = ["q", "k", "v"]
    if past:
        inputs += [helper.make_tensor_value_info(n, dtype, ["B", NKV, "P", H]) for n in ("past_key", "past_value")]
        names += ["past_key", "past_value"]
    else:
        names += ["", ""]
    inputs.append(helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["B", "T"]))
    names += ["seqlens_k", "total_seq"]
    if rotary:
        inits |= _caches(rotary_dim)
        names += ["cos_cache", "sin_cache"]
    nodes = [
        helper.make_node("ReduceSum", ["attention_mask", "axis1"], ["mask_sum"], "sum", keepdims=0),
        helper.make_node("Sub", ["mask_sum", "one"], ["seqlens_64"], "sub"),
        helper.make_node("Cast", ["seqlens_64"], ["seqlens_k"], "cast_seqlens", to=TensorProto.INT32),
        helper.make_node("Shape", ["attention_mask"], ["mask_shape"], "shape"),
        helper.make_node("Gather", ["mask_shape", "one"], ["total_64"], "gather", axis=0),
        helper.make_node("Cast", ["total_64"], ["total_seq"], "cast_total", to=TensorProto.INT32),
        helper.make_node("GroupQueryAttention", names, ["y", "present_key", "present_value"], "gqa",
                         domain="com.microsoft", num_heads=N, kv_num_heads=NKV, do_rotary=int(rotary), **attrs),
    ]
    inits["one"] = np.array(1, np.int64)
    inits["axis1"] = np.array([1], np.int64)
    outputs = [helper.make_tensor_value_info("y", dtype, ["B", "S", N * H])] + [
        helper.make_tensor_value_info(n, dtype, ["B", NKV, "Tp", H]) for n in ("present_key", "present_value")]
    graph = helper.make_graph(nodes, "gqa", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)])


def _feed(batch, new, past, mask, packed=False, dtype=np.float32):
    feed = {"attention_mask": np.asarray(mask, np.int64)}
    if packed:
        feed["qkv"] = RNG.normal(size=(batch, new, (N + 2 * NKV) * H)).astype(dtype)
    else:
        feed |= {"q": RNG.normal(size=(batch, new, N * H)).astype(dtype),
                 "k": RNG.normal(size=(batch, new, NKV * H)).astype(dtype),
                 "v": RNG.normal(size=(batch, new, NKV * H)).astype(dtype)}
    if past is not None:
        feed |= {"past_key": RNG.normal(size=(batch, NKV, past, H)).astype(dtype),
                 "past_value": RNG.normal(size=(batch, NKV, past, H)).astype(dtype)}
    return feed


#: (batch, new tokens, past length, attention mask): a first prompt (right padding in entry 1), a decode step
#: whose entry 1 has a shorter history (its new token is written over a padded slot), a subsequent prompt
CASES = {
    "prompt": (2, 5, 0, [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]),
    "decode": (2, 1, 5, [[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 1]]),
    "decode-long": (1, 1, 20, [[1] * 21]),
    "subsequent-prompt": (1, 3, 4, [[1] * 7]),
}


def _valid_rows(feed, case):
    """Which query rows onnxruntime defines: a right-padded first prompt leaves the padded rows undefined."""
    batch, new, past, mask = CASES[case]
    rows = np.ones((batch, new), bool)
    if past == 0:
        rows = np.asarray(mask, bool)[:, :new]
    return rows


def _assert_equivalent(model, case, packed=False, rtol=1e-4, atol=1e-5):
    out, _ = lifted(model, (GroupQueryAttention(), "gqa"))
    assert "GroupQueryAttention" not in ops_left(out)
    onnx.checker.check_model(out, full_check=True)
    assert [o.name for o in out.graph.output] == [o.name for o in model.graph.output]
    assert [i.name for i in out.graph.input] == [i.name for i in model.graph.input]
    batch, new, past, mask = CASES[case]
    has_past = any(i.name == "past_key" for i in model.graph.input)
    feeds = [_feed(batch, new, past if has_past else None, mask, packed) for _ in range(2)]
    for feed, want, got in zip(feeds, run_outputs(model, feeds), run_outputs(out, feeds)):
        rows = _valid_rows(feed, case)
        np.testing.assert_allclose(got[0][rows], want[0][rows], rtol=rtol, atol=atol)
        for w, g in zip(want[1:], got[1:]):  # the caches, every slot
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_group_query_attention_is_written_back_exactly(case):
    _assert_equivalent(gqa_model(), case)


@pytest.mark.parametrize("variant", [
    {"packed": True}, {"rotary_interleaved": 1}, {"rotary_dim": H // 2}, {"local_window_size": 2},
    {"softcap": 2.0}, {"scale": 0.2}, {"rotary": False}])
@pytest.mark.parametrize("case", ["prompt", "decode"])
def test_group_query_attention_variants(case, variant):
    packed = variant.pop("packed", False)
    model_args = {k: variant.pop(k) for k in ("rotary", "rotary_dim") if k in variant}
    _assert_equivalent(gqa_model(packed=packed, **model_args, **variant), case, packed=packed)


def test_a_first_prompt_without_past_inputs():
    _assert_equivalent(gqa_model(past=False), "prompt")


def test_a_generation_loop_feeds_each_present_back_as_past():
    """Prefill 6 tokens, then 5 decode steps with the present fed back: the lifted model's tokens track the source's."""
    model = gqa_model()
    out, _ = lifted(model, (GroupQueryAttention(), "gqa"))
    states = {}
    for name, graph in (("source", model), ("lifted", out)):
        from trt_bridge.runtime.session import session

        sess, rng = session(graph), np.random.default_rng(3)
        past_k = past_v = np.zeros((1, NKV, 0, H), np.float32)
        ys = []
        for step in range(6):
            new = 6 if step == 0 else 1
            length = past_k.shape[2] + new
            feed = {"q": rng.normal(size=(1, new, N * H)).astype(np.float32),
                    "k": rng.normal(size=(1, new, NKV * H)).astype(np.float32),
                    "v": rng.normal(size=(1, new, NKV * H)).astype(np.float32),
                    "past_key": past_k, "past_value": past_v, "attention_mask": np.ones((1, length), np.int64)}
            y, past_k, past_v = sess.run(None, feed)
            ys.append(y)
        states[name] = (np.concatenate(ys, axis=1), past_k)
    np.testing.assert_allclose(states["lifted"][0], states["source"][0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(states["lifted"][1], states["source"][1], rtol=1e-4, atol=1e-5)


def test_lifted_attention_builds_in_tensorrt_at_prefill_and_decode(tmp_path):
    out, _ = lifted(gqa_model(), (GroupQueryAttention(), "gqa"))
    path = save(out, tmp_path / "gqa.onnx")
    assert_builds_at(path, {
        "prefill": {"q": ((1, 1, N * H), (1, 16, N * H), (2, 128, N * H)),
                    "k": ((1, 1, NKV * H), (1, 16, NKV * H), (2, 128, NKV * H)),
                    "v": ((1, 1, NKV * H), (1, 16, NKV * H), (2, 128, NKV * H)),
                    "past_key": ((1, NKV, 0, H), (1, NKV, 0, H), (2, NKV, 0, H)),
                    "past_value": ((1, NKV, 0, H), (1, NKV, 0, H), (2, NKV, 0, H)),
                    "attention_mask": ((1, 1), (1, 16), (2, 128))},
        "decode": {"q": ((1, 1, N * H), (1, 1, N * H), (2, 1, N * H)),
                   "k": ((1, 1, NKV * H), (1, 1, NKV * H), (2, 1, NKV * H)),
                   "v": ((1, 1, NKV * H), (1, 1, NKV * H), (2, 1, NKV * H)),
                   "past_key": ((1, NKV, 1, H), (1, NKV, 32, H), (2, NKV, 63, H)),
                   "past_value": ((1, NKV, 1, H), (1, NKV, 32, H), (2, NKV, 63, H)),
                   "attention_mask": ((1, 2), (1, 33), (2, 64))},
    })


def _with(model, **changes):
    node = next(n for n in model.graph.node if n.op_type == "GroupQueryAttention")
    for key, value in changes.items():
        for attr in node.attribute:
            if attr.name == key:
                node.attribute.remove(attr)
                break
        node.attribute.append(helper.make_attribute(key, value))
    return model


@pytest.mark.parametrize("changes, reason", [
    ({"kv_num_heads": 3}, "kv_num_heads=3 does not divide num_heads=4"),
    ({"smooth_softmax": 1}, "smooth_softmax=1 is not written back"),
    ({"num_heads": 3, "kv_num_heads": 3}, "does not split into 3 query heads"),
])
def test_declines_name_their_reason(changes, reason):
    assert reason in declined(_with(gqa_model(), **changes), GroupQueryAttention(), "gqa")


def test_a_missing_rotary_cache_is_declined():
    model = gqa_model()
    node = next(n for n in model.graph.node if n.op_type == "GroupQueryAttention")
    node.input[8] = ""
    assert "cos_cache or sin_cache is missing" in declined(model, GroupQueryAttention(), "gqa")


def test_a_past_whose_heads_disagree_is_declined():
    model = gqa_model()
    past = next(i for i in model.graph.input if i.name == "past_key")
    past.type.tensor_type.shape.dim[1].dim_value = NKV + 1
    assert "past 'past_key' has shape" in declined(model, GroupQueryAttention(), "gqa")


# --- sliding_window_cache=1: the past and present hold a window of keys (onnxruntime-genai's Mistral) -------------

def resident(count: int, capacity: int, window: int) -> int:
    """L(count): the positions a window cache of ``capacity`` rows holds (onnxruntime's operator description)."""
    step = capacity - window + 1
    return count if count <= capacity else count - step * -(-(count - capacity) // step)


def _window_loop(model, out, capacity, window, masks, seed):
    """Both models driven over ``masks`` (one a step, each as long as all positions so far), each fed its own
    present back; every step's output and the resident rows [0, L) of the presents agree; the rows beyond are zeros
    in the lifted model (onnxruntime leaves them unspecified)."""
    from trt_bridge.runtime.session import session

    rng = np.random.default_rng(seed)
    sessions = session(model), session(out)
    batch = len(masks[0])
    start = rng.normal(size=(batch, NKV, capacity, H)).astype(np.float32)  # what the rows held before: never read
    caches = [(start, start), (start, start)]
    seen = 0
    for mask in masks:
        mask = np.asarray(mask, np.int64)
        new, seen = mask.shape[1] - seen, mask.shape[1]
        feed = {"q": rng.normal(size=(batch, new, N * H)).astype(np.float32),
                "k": rng.normal(size=(batch, new, NKV * H)).astype(np.float32),
                "v": rng.normal(size=(batch, new, NKV * H)).astype(np.float32), "attention_mask": mask}
        (y, *want), (got_y, *got) = (s.run(None, {**feed, "past_key": c[0], "past_value": c[1]})
                                     for s, c in zip(sessions, caches))
        np.testing.assert_allclose(got_y, y, rtol=1e-4, atol=1e-5)
        for b, total in enumerate(mask.sum(axis=1)):
            kept = resident(int(total), capacity, window)
            for w, g in zip(want, got):
                np.testing.assert_allclose(g[b, :, :kept], w[b, :, :kept], rtol=1e-4, atol=1e-5)
                assert not g[b, :, kept:].any()
        caches = [tuple(want), tuple(got)]


def _masks(batch, prompt, steps):
    masks = [[[1] * prompt] * batch]
    for new in steps:
        masks.append([row + [1] * new for row in masks[-1]])
    return masks


@pytest.mark.parametrize(("capacity", "steps"), [(4, [1] * 9), (6, [1] * 9), (7, [4, 1, 1, 6, 1, 9, 1])],
                         ids=["capacity-window", "slack", "multi-token"])
def test_a_window_cache_over_a_generation_loop(capacity, steps):
    """Prefill then steps past the window (4) and past the capacity: evictions of C − W + 1 rows at once."""
    model = gqa_model(local_window_size=4, sliding_window_cache=1)
    out, _ = lifted(model, (GroupQueryAttention(), "gqa"))
    # the cache is Concat and GatherElements (no Pad: it never grows), the resident counts integer Div/Mul
    assert set(ops_left(out)) == {
        "Add", "And", "Cast", "Concat", "Div", "Equal", "Expand", "Gather", "GatherElements", "Greater", "Less",
        "LessOrEqual", "MatMul", "Max", "Min", "Mul", "Not", "Or", "Range", "ReduceSum", "Reshape", "Shape", "Slice",
        "Softmax", "Split", "Sub", "Transpose", "Unsqueeze", "Where"}
    assert [o.name for o in out.graph.output] == [o.name for o in model.graph.output]
    _window_loop(model, out, capacity, 4, _masks(1, 3, steps), seed=capacity)


def test_a_window_cache_with_a_ragged_batch():
    """Two entries whose totals differ (entry 1 re-runs a position, as a rollback does): each its own layout."""
    model = gqa_model(local_window_size=4, sliding_window_cache=1)
    out, _ = lifted(model, (GroupQueryAttention(), "gqa"))
    masks = [[[1] * 5] * 2, [[1] * 6, [1] * 5 + [0]]]
    for _ in range(8):
        masks.append([row + [1] for row in masks[-1]])
    _window_loop(model, out, 6, 4, masks, seed=11)


def test_resident_rows_follow_onnxruntimes_formula():
    assert [resident(t, 6, 4) for t in range(1, 13)] == [1, 2, 3, 4, 5, 6, 4, 5, 6, 4, 5, 6]
    assert [resident(t, 4, 4) for t in (3, 4, 5, 9)] == [3, 4, 4, 4]


@pytest.mark.parametrize(("changes", "reason"), [
    ({"sliding_window_cache": 1}, "sliding_window_cache=1 without a local_window_size > 0"),
    ({"sliding_window_cache": 2, "local_window_size": 4}, "sliding_window_cache=2 is not 0 or 1"),
])
def test_window_cache_declines_name_their_reason(changes, reason):
    assert reason in declined(_with(gqa_model(), **changes), GroupQueryAttention(), "gqa")


def test_a_window_cache_without_a_past_is_declined():
    model = gqa_model(past=False, local_window_size=4, sliding_window_cache=1)
    assert "without past_key and past_value" in declined(model, GroupQueryAttention(), "gqa")


def test_lifted_window_cache_builds_in_tensorrt_at_prefill_and_decode(tmp_path):
    out, _ = lifted(gqa_model(local_window_size=4, sliding_window_cache=1), (GroupQueryAttention(), "gqa"))
    path = save(out, tmp_path / "gqa_window.onnx")
    cache = ((1, NKV, 4, H), (1, NKV, 8, H), (2, NKV, 64, H))  # the capacity: the window or more, at every step
    assert_builds_at(path, {
        "prefill": {"q": ((1, 1, N * H), (1, 16, N * H), (2, 128, N * H)),
                    "k": ((1, 1, NKV * H), (1, 16, NKV * H), (2, 128, NKV * H)),
                    "v": ((1, 1, NKV * H), (1, 16, NKV * H), (2, 128, NKV * H)),
                    "past_key": cache, "past_value": cache, "attention_mask": ((1, 1), (1, 16), (2, 128))},
        "decode": {"q": ((1, 1, N * H),) * 2 + ((2, 1, N * H),), "k": ((1, 1, NKV * H),) * 2 + ((2, 1, NKV * H),),
                   "v": ((1, 1, NKV * H),) * 2 + ((2, 1, NKV * H),),
                   "past_key": cache, "past_value": cache, "attention_mask": ((1, 2), (1, 33), (2, 513))},
    })


MISTRAL = Path(__file__).resolve().parents[1] / "data" / "decoders" / "mistral-genai-cpu-int4" / "model.onnx"
MISTRAL_WINDOW, MISTRAL_HEADS, MISTRAL_HEAD = 8, 2, 16  # its genai_config.json


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    """onnxruntime-genai 0.18's Mistral CPU int4 export (window 8) at MatMulNBits accuracy_level 0 (level 4 rounds
    activations to int8: the weights are kept exactly, so that is the reference), and its conversion."""
    from trt_bridge.api import convert

    root = tmp_path_factory.mktemp("mistral")
    source = onnx.load(str(MISTRAL))
    for node in source.graph.node:
        for attr in node.attribute:
            if node.op_type == "MatMulNBits" and attr.name == "accuracy_level":
                attr.i = 0
    source_path = save(source, root / "source.onnx")
    out = root / "converted" / "model.onnx"
    report = convert(MISTRAL, out, quiet=True, skip_check=True)
    fired = {r["rule"]: len(r["nodes"]) for r in report.to_dict()["rules"]}
    assert fired["group-query-attention"] == 2, report.summary()
    return source_path, out


def test_the_real_mistral_window_cache_generates_like_its_source(mistral):
    """Prefill 6 tokens, then 18 greedy steps (positions to 24: three times the window) with the window cache of 8
    rows (onnxruntime-genai's NvTensorRtRtx size; the CPU one is max_length) and of 12 (evictions of 5 rows): the
    converted model's logits and the resident rows of every present track the source's."""
    from trt_bridge.runtime.session import session

    source, converted = mistral
    model = onnx.load(str(converted))
    assert not [n.op_type for n in model.graph.node if n.domain not in ("", "ai.onnx")]
    assert [i.name for i in model.graph.input] == [i.name for i in onnx.load(str(source)).graph.input]
    sessions = session(source), session(converted)
    names = [o.name for o in sessions[0].get_outputs()]
    assert names == [o.name for o in sessions[1].get_outputs()]
    worst = np.inf
    for capacity in (MISTRAL_WINDOW, 12):
        empty = np.zeros((1, MISTRAL_HEADS, capacity, MISTRAL_HEAD), np.float32)
        caches = [dict.fromkeys([n for n in names if n.startswith("present")], empty) for _ in sessions]
        ids = np.array([[5, 17, 42, 99, 7, 150]], np.int64)
        total = 0
        for _ in range(19):
            total += ids.shape[1]
            runs = []
            for sess, cache in zip(sessions, caches):
                feed = {"input_ids": ids, "attention_mask": np.ones((1, total), np.int64),
                        **{n.replace("present", "past_key_values"): v for n, v in cache.items()}}
                runs.append(dict(zip(names, sess.run(None, feed))))
            want, got = runs
            error = got["logits"] - want["logits"]
            worst = min(worst, 10 * np.log10(np.sum(want["logits"] ** 2) / max(np.sum(error ** 2), 1e-30)))
            kept = resident(total, capacity, MISTRAL_WINDOW)
            for name in caches[0]:
                np.testing.assert_allclose(got[name][:, :, :kept], want[name][:, :, :kept], rtol=1e-4, atol=1e-5)
            caches = [{n: r[n] for n in caches[0]} for r in runs]
            ids = want["logits"][:, -1:].argmax(-1)
            assert got["logits"][0, -1].argmax() == ids[0, 0]
    assert worst > 100  # measured 125.2 dB at the lowest step (the INT4 weights kept exactly)


def test_the_converted_mistral_builds_at_prefill_and_decode(mistral):
    cache = ((1, MISTRAL_HEADS, MISTRAL_WINDOW, MISTRAL_HEAD),) * 2 + ((1, MISTRAL_HEADS, 64, MISTRAL_HEAD),)
    caches = {f"past_key_values.{layer}.{kv}": cache for layer in (0, 1) for kv in ("key", "value")}
    assert_builds_at(mistral[1], {
        "prefill": {"input_ids": ((1, 1), (1, 16), (1, 128)), "attention_mask": ((1, 1), (1, 16), (1, 128)),
                    **caches},
        "decode": {"input_ids": ((1, 1),) * 3, "attention_mask": ((1, 2), (1, 129), (1, 513)), **caches},
    })
