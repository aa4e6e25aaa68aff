"""A decoder with a KV cache gets two default profiles, prefill and decode (trt_bridge/tensorrt/decoder_profiles.py),
in ``build`` and in ``check``'s costs build; a model that builds for one and not the other is a finding (an error of
``build``) naming the profile and its shapes; ``check`` takes ``build``'s shape flags."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from decoder_models import decoder
from helpers import save
from test_cli import cli

from trt_bridge.checks import CheckOptions, check_model
from trt_bridge.cli.common import profiles_from_args
from trt_bridge.errors import TrtBridgeError
from trt_bridge.ir.decoder import is_past
from trt_bridge.tensorrt.decoder_profiles import decoder_profiles, model_inputs_shapes, window_pasts

pytest.importorskip("tensorrt_rtx")

INPUTS = {"input_ids": (-1, -1), "attention_mask": (-1, -1), "past_key_values.0.key": (-1, 2, -1, 8),
          "past_key_values.0.value": (-1, 2, -1, 8)}
#: --shapes of one decode step with a past of 4 (the one_token_logits decoder builds it)
DECODE_STEP = ["input_ids:1x1,attention_mask:1x5", "past_key_values.0.key:1x1x4x8,past_key_values.0.value:1x1x4x8"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("decoder")
    return {"ok": save(decoder(), root / "decoder.onnx"),
            "decode-only": save(decoder(one_token_logits=True), root / "decode_only.onnx")}


def test_decoder_inputs_get_prefill_and_decode():
    prefill, decode = decoder_profiles(INPUTS)
    assert (prefill.name, decode.name) == ("prefill", "decode")
    assert prefill.shapes["input_ids"] == ((1, 1), (1, 16), (1, 128))
    assert prefill.shapes["past_key_values.0.key"] == ((1, 2, 0, 8),) * 3  # TensorRT-RTX takes a 0-length past
    assert prefill.shapes["attention_mask"] == ((1, 1), (1, 16), (1, 128))
    assert decode.shapes["input_ids"] == ((1, 1),) * 3
    assert decode.shapes["past_key_values.0.value"] == ((1, 2, 1, 8), (1, 2, 128, 8), (1, 2, 512, 8))
    assert decode.shapes["attention_mask"] == ((1, 2), (1, 129), (1, 513))
    assert is_past("past_key_3") and is_past("past_value_3") and not is_past("past")


def test_what_is_not_a_decoder_gets_no_default_profiles():
    assert decoder_profiles({"input_ids": (-1, -1), "attention_mask": (-1, -1)}) == ()  # no past: an encoder
    assert decoder_profiles({**INPUTS, "cache_position": (-1,)}) == ()  # a dynamic input it cannot place
    assert decoder_profiles({**INPUTS, "past_key_values.0.key": (-1, -1, -1, 8)}) == ()  # dynamic heads


def test_check_and_build_take_the_decoder_with_both_profiles(models, tmp_path):
    report = check_model(models["ok"], CheckOptions())
    assert report.costs is not None and report.costs.profiles == ("prefill", "decode"), report.summary()
    assert not [f for f in report.findings if f.rule.startswith("tensorrt-")]
    assert json.loads(report.to_json())["costs"]["profiles"] == ["prefill", "decode"]
    engine = tmp_path / "decoder.engine"
    result = cli("build", models["ok"], "-o", engine, "--compute-capability", "8.9", "-q")
    assert result.returncode == 0, result.stderr
    info = json.loads(engine.with_name("decoder.engine.json").read_text())
    assert info["profile_names"] == ["prefill", "decode"]
    assert info["profiles"][0]["past_key_values.0.key"]["max"] == [1, 1, 0, 8]
    assert info["profiles"][1]["attention_mask"] == {"min": [1, 2], "opt": [1, 129], "max": [1, 513]}


def test_a_profile_that_fails_alone_is_named(models, tmp_path):
    result = cli("check", models["decode-only"], "--json")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    found = [f for f in json.loads(result.stdout)["findings"] if f["rule"] == "tensorrt-profile"]
    assert len(found) == 1 and found[0]["severity"] == "blocker", found
    assert found[0]["why"].startswith("TensorRT's builder fails for the profile 'prefill' (input_ids 1x1..1x128 "
                                      "(opt 1x16), attention_mask 1x1..1x128 (opt 1x16), past_key_values.0.key "
                                      "1x1x0x8"), found[0]["why"]
    assert "builds 'decode'" in found[0]["why"] and "last_token_only" in found[0]["why"]
    engine = tmp_path / "decode_only.engine"
    result = cli("build", models["decode-only"], "-o", engine, "--compute-capability", "8.9", "-q")
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert "fails for the profile 'prefill' (input_ids 1x1..1x128" in lines[0] and "builds 'decode'" in lines[0]
    assert not engine.exists()


def test_check_takes_build_shape_flags(models):
    result = cli("check", models["decode-only"], "--json", "--shapes", *DECODE_STEP)
    assert result.returncode == 1, result.stderr  # not INT8, but it builds at these shapes
    report = json.loads(result.stdout)
    assert not [f for f in report["findings"] if f["rule"].startswith("tensorrt-")], report["findings"]
    assert report["costs"] is not None and report["costs"]["profiles"] == []
    with pytest.raises(TrtBridgeError, match="each profile needs all three"):  # build's rules, shared
        profiles_from_args(None, [["input_ids:1x1"]], [["input_ids:1x2"]], None)


def test_a_window_cache_holds_its_capacity_at_both_profiles():
    """onnxruntime-genai's Mistral (``past_sliding_length``): its pasts are never 0 rows and are no part of the mask."""
    prefill, decode = decoder_profiles(INPUTS, frozenset({"past_key_values.0.key", "past_key_values.0.value"}))
    assert prefill.shapes["past_key_values.0.key"] == ((1, 2, 1, 8), (1, 2, 128, 8), (1, 2, 512, 8))
    assert prefill.shapes["attention_mask"] == ((1, 1), (1, 16), (1, 128))
    assert decode.shapes["past_key_values.0.value"] == ((1, 2, 1, 8), (1, 2, 128, 8), (1, 2, 512, 8))
    assert decode.shapes["attention_mask"] == ((1, 2), (1, 129), (1, 513))
    mistral = Path(__file__).parent / "data" / "decoders" / "mistral-genai-cpu-int4" / "model.onnx"
    inputs = model_inputs_shapes(onnx.load(str(mistral), load_external_data=False))
    assert window_pasts(mistral, inputs) == {f"past_key_values.{i}.{kv}" for i in (0, 1) for kv in ("key", "value")}
    assert window_pasts(mistral, {"x": (-1, 3)}) == frozenset()  # no past: the model is not read


def test_profiles_that_build_only_apart_are_a_warning_not_a_blocker(tmp_path):
    """TensorRT-RTX 1.7.1 builds an Optimum merged decoder at prefill and at decode, each alone, but not both in
    one engine (Myelin: "the producer does not dominate the use"): check says so and the model stays ready."""
    from trt_bridge.cli import main as cli_main
    from trt_bridge.conversion import convert
    from trt_bridge.conversion.options import ConvertOptions

    source = Path(__file__).resolve().parent / "data" / "decoders" / "llama-optimum-merged-int4-b32" / \
        "decoder_model_merged.onnx"
    out = tmp_path / "decoder_model_merged.onnx"
    convert(source, out, ConvertOptions(progress=False, check=False))
    report = tmp_path / "check.json"
    assert cli_main(["check", str(out), "--json", str(report), "-q"]) == 0
    import json

    found = json.loads(report.read_text())
    apart = [f for f in found["findings"] if f["rule"] == "tensorrt-profiles-apart"]
    assert len(apart) == 1 and apart[0]["severity"] == "warning" and "'prefill', 'decode'" in apart[0]["why"]
    assert not [f for f in found["findings"] if f["severity"] == "blocker"]
