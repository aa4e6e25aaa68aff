"""The real Silero VAD (tests/data/silero_vad: the silero-vad 6.2.3 wheel's model, MIT): an If on the sample rate
whose branches read the outer audio and state, hold nested Ifs (the decoder's shape tests, torch's unbatched-RNN
checks, one on a constant) and an LSTM whose state outputs are read.

```
 input [1, 576 | 288] ─┐   state [2, 1, 128] ─┐
 sr ─ Equal(16000) ─▶ If_0 ─ then: STFT (Pad, Conv) → 4× Conv/Relu → If(dim == 1: Squeeze) → If(rank 3?) → LSTM
                          │        → If(...) → Conv → Sigmoid → ReduceMean ─▶ output [1, 1], stateN [2, 1, 128]
                          └ else: the same at 8 kHz, other weights
```

Lifting used to leave names no node produced (onnx-graphsurgeon's flattening of the constant nested If: "... is not
output of any previous nodes", then an internal error on If_0); TensorRT-RTX builds no conditional nested in another,
nor an LSTM's state outputs inside one, so convert holds the sample rate (``--constant-inputs sr=16000``): one model
per rate, which builds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from control_flow_models import constants_as_initializers
from helpers import assert_builds_at, quantize_dynamic, run_ort, save, snr_db
from opset9_models import save_feeds

from trt_bridge.cli import main
from trt_bridge.ir.graphs import graphs
from trt_bridge.ir.model import load_model
from trt_bridge.lift.pipeline import lift_model
from trt_bridge.runtime.session import session

VAD = Path(__file__).parent / "data" / "silero_vad" / "silero_vad.onnx"
SAMPLES = {16000: 576, 8000: 288}  # the wheel's OnnxWrapper: 512 / 256 new samples and 64 / 32 of context


def _feeds(rate: int, count: int, seed: int, with_rate: bool = True) -> list[dict[str, np.ndarray]]:
    """Speech-like chunks (two tones and noise) and small LSTM states at ``rate``."""
    rng = np.random.default_rng(seed)
    n = SAMPLES[rate]
    t = np.arange(n) / rate
    feeds = []
    for _ in range(count):
        x = sum(rng.uniform(0.05, 0.4) * np.sin(2 * np.pi * rng.uniform(80, 2000) * t + rng.uniform(0, 6))
                for _ in range(2)) + rng.normal(0, 0.02, n)
        feed = {"input": x.astype(np.float32)[None], "state": rng.normal(0, 0.1, (2, 1, 128)).astype(np.float32)}
        if with_rate:
            feed["sr"] = np.array(rate, np.int64)
        feeds.append(feed)
    return feeds


def _ifs(model: onnx.ModelProto) -> int:
    return sum(n.op_type == "If" for g in graphs(model.graph) for n in g.node)


def _outputs(model, feeds):
    sess = session(model)
    return [sess.run(None, f) for f in feeds]


def test_the_real_vad_lifts_to_itself_at_both_rates():
    """The float model lifted: the nested If on a constant inlined (no dangling name), the rest kept, and every output
    bit for bit the source's at 16 and 8 kHz."""
    lifted, ctx = lift_model(load_model(VAD), VAD)
    assert [c.pass_name for c in ctx.prepared] == ["constant-if", "constant-if"]
    # 25 Ifs: If_0 and 12 in each branch; the constant one in each (decoder/If_1) goes with the 5 of its branch
    # not taken, its 5 others move up a level
    assert (_ifs(onnx.load(str(VAD))), _ifs(lifted)) == (25, 15)
    for rate in SAMPLES:
        feeds = _feeds(rate, 2, seed=9)
        for want, got in zip(_outputs(VAD, feeds), _outputs(lifted, feeds)):
            for a, b in zip(want, got):
                np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("rate", [16000, 8000])
def test_the_float_vad_converts_per_rate_follows_the_source_and_builds(rate, tmp_path, capsys):
    """float → convert --constant-inputs sr=RATE: exit 0, ready with the builder's word for it, no If left, INT8
    Convs, the source's outputs within 15 dB (probability) and 20 dB (state) on held-out chunks, and TensorRT-RTX
    builds it at the rate's chunk."""
    calib = save_feeds(tmp_path / "calib", _feeds(rate, 6, seed=1, with_rate=False))
    out = tmp_path / f"vad{rate}.onnx"
    assert main(["convert", str(VAD), "-o", str(out), "--calib-data", str(calib),
                 "--constant-inputs", f"sr={rate}"]) == 0
    text = capsys.readouterr().out
    assert "TensorRT-ready INT8 (0 blocker(s)" in text and "builder: builds for SM 8.9" in text
    assert "constant-input 1" in text
    model = onnx.load(str(out))
    assert _ifs(model) == 0 and [i.name for i in model.graph.input] == ["input", "state"]
    assert {"QuantizeLinear", "DequantizeLinear", "Conv", "LSTM"} <= {n.op_type for n in model.graph.node}
    held = _feeds(rate, 4, seed=5)
    want, got = _outputs(VAD, held), _outputs(out, [{k: v for k, v in f.items() if k != "sr"} for f in held])
    assert snr_db([w[0] for w in want], [g[0] for g in got]) > 15
    assert snr_db([w[1] for w in want], [g[1] for g in got]) > 20
    assert_builds_at(out, {"chunk": {"input": ((1, SAMPLES[rate]),) * 3, "state": ((2, 1, 128),) * 3}})


def test_the_dynamic_vad_converts_and_without_a_rate_says_the_builder_fails(tmp_path, capsys):
    """onnxruntime's quantize_dynamic (its branches too): with the rate held it converts (exit 0), follows the source
    and builds; without, it converts to a model equal in kind but TensorRT's builder refuses the If, which the
    headline says (exit 1), naming the fix."""
    prepared = save(constants_as_initializers(onnx.load(str(VAD))), tmp_path / "vad.prepared.onnx")  # its optimizer's
    dynamic = quantize_dynamic(prepared, tmp_path / "vad.dynamic.onnx", extra_options={"EnableSubgraph": True})
    assert "DynamicQuantizeLinear" in {n.op_type for g in graphs(onnx.load(str(dynamic)).graph) for n in g.node}
    calib = save_feeds(tmp_path / "calib", _feeds(16000, 6, seed=1, with_rate=False))
    out = tmp_path / "vad16.onnx"
    assert main(["convert", str(dynamic), "-o", str(out), "--calib-data", str(calib),
                 "--constant-inputs", "sr=16000"]) == 0
    assert "TensorRT-ready INT8" in capsys.readouterr().out
    held = _feeds(16000, 4, seed=5)
    want = run_ort(dynamic, held)
    assert snr_db(want, run_ort(out, [{k: v for k, v in f.items() if k != "sr"} for f in held])) > 15
    both = save_feeds(tmp_path / "both", _feeds(16000, 3, seed=1) + _feeds(8000, 3, seed=2))
    kept = tmp_path / "vad.onnx"
    assert main(["convert", str(dynamic), "-o", str(kept), "--calib-data", str(both)]) == 1
    captured = capsys.readouterr()
    assert "not TensorRT-ready (1 blocker(s)" in captured.out and "builder: fails" in captured.out
    assert "--constant-inputs" in captured.out
    assert _ifs(onnx.load(str(kept))) == 1  # the sample-rate If, its nested shape tests decided by the feeds
    feeds = _feeds(8000, 2, seed=6)
    assert snr_db(run_ort(dynamic, feeds), run_ort(kept, feeds)) > 15
