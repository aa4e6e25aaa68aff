"""``trt-bridge verify`` on decoders: the greedy generation loop against independent computations (the whole
sequence at once, without a cache), teacher forcing, the free-running prefix match, Optimum's merged If, a
symbolic head size, prompts from --data, the gate and its exit status through the real CLI, the reports; and
real tiny exports (tests/data/decoders)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from generation_models import DIM, VOCAB, decoder, full_sequence_logits, perturbed
from test_cli import cli

from trt_bridge import samples
from trt_bridge.api import verify as api_verify
from trt_bridge.errors import TrtBridgeError
from trt_bridge.verification import VerifyOptions, verify
from trt_bridge.verification.decoder import decoder_signature, empty_cache_shapes
from trt_bridge.verification.generation import FIRST_IDS, GenerationOptions, Loop, prompts
from trt_bridge.verification.html import render

DATA = Path(__file__).parent / "data" / "decoders"
OFF = {"costs": None, "progress": False}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("decoders")
    built = {"decoder": decoder(), "perturbed": perturbed(amount=0.3), "merged": decoder(merged=True),
             "no_positions": decoder(position_ids=False), "symbolic": decoder(head_dim="kv_cache_dim")}
    paths = {}
    for name, model in built.items():
        paths[name] = root / name / "model.onnx"
        paths[name].parent.mkdir()
        onnx.save(model, paths[name])
    return paths


def _verify(reference, candidate, **generation):
    return verify(reference, candidate, VerifyOptions(generation=GenerationOptions(**generation) if generation
                                                      else None, **OFF))


def test_a_decoder_is_detected_from_its_inputs(models):
    sig = decoder_signature(onnx.load(models["merged"]))
    assert [(c.past, c.present, c.past_axis) for c in sig.cache] == [
        ("past_key_values.0.key", "present.0.key", 2), ("past_key_values.0.value", "present.0.value", 2)]
    assert sig.logits == "logits" and sig.vocab == VOCAB and sig.use_cache_branch and sig.position_ids_dtype
    assert decoder_signature(onnx.load(models["no_positions"])).position_ids_dtype is None
    assert decoder_signature(samples.conv_net()) is None


@pytest.mark.parametrize("name", ["decoder", "merged", "no_positions"])
def test_the_loop_computes_what_the_whole_sequence_computes(models, name):
    """Each step's logits equal those of the whole sequence run at once on an empty cache: the cache, the mask,
    the positions and use_cache_branch are fed as the model means them."""
    path = models[name]
    header = onnx.load(path)
    sig = decoder_signature(header)
    loop = Loop(path, sig, empty_cache_shapes(header, path, sig))
    ids = np.random.default_rng(1).integers(FIRST_IDS, VOCAB, (3, 5))
    steps = [loop.start(ids)]
    tokens = [ids]
    for _ in range(6):
        tokens.append(steps[-1][:, -1:].argmax(-1))
        steps.append(loop.step(tokens[-1]))
    whole = full_sequence_logits(models["decoder"], np.concatenate(tokens, axis=1))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), whole, atol=1e-5)


def test_a_model_against_itself_agrees_on_every_token(models):
    report = _verify(models["decoder"], models["merged"])
    gen = report.generation
    assert (gen.prompts, gen.steps, gen.prompt_lengths) == (4, 32, (16,) * 4) and report.feeds == 4
    assert gen.token_agreement == 1.0 and gen.prefix_match == (32,) * 4
    assert gen.logits_snr_db == math.inf and gen.min_step_snr_db == math.inf and report.passed
    assert report.outputs[0].output == "logits" and report.outputs[0].snr_db == math.inf
    assert all(FIRST_IDS <= t < VOCAB for row in prompts(GenerationOptions(), VOCAB) for t in row)


def test_the_candidate_is_teacher_forced_and_its_disagreement_is_measured(models):
    """The candidate's tokens at each step are its argmax given the reference's tokens (checked on the whole
    sequence without a cache); agreement, prefix match and SNR follow from them."""
    report = _verify(models["decoder"], models["perturbed"], prompts=3, steps=12, prompt_length=6)
    gen = report.generation
    assert 0 < gen.token_agreement < 1 and gen.logits_snr_db < 30
    given = np.random.default_rng(0).integers(FIRST_IDS, VOCAB, (3, 6))  # the seeded prompts, independently
    ref = np.array(gen.reference_tokens)
    sequence = np.concatenate([given, ref[:, :-1]], axis=1)
    ref_whole = full_sequence_logits(models["decoder"], sequence)[:, 5:].argmax(-1)
    cand_whole = full_sequence_logits(models["perturbed"], sequence)
    np.testing.assert_array_equal(ref_whole, ref)  # the reference generated greedily
    np.testing.assert_array_equal(cand_whole[:, 5:].argmax(-1), np.array(gen.candidate_tokens))
    agree = ref == np.array(gen.candidate_tokens)
    assert gen.agreed == agree.sum() and gen.step_agreement == tuple(agree.mean(axis=0))
    assert gen.prefix_match == tuple(int(np.argmin(row)) if not row.all() else 12 for row in agree)
    ref_logits = full_sequence_logits(models["decoder"], sequence)
    err = np.sum((ref_logits.astype(np.float64) - cand_whole) ** 2)
    assert gen.logits_snr_db == pytest.approx(10 * np.log10(np.sum(ref_logits.astype(np.float64) ** 2) / err),
                                              abs=1e-3)
    assert min(gen.step_snr_db) == gen.min_step_snr_db


def test_a_symbolic_head_size_comes_from_the_config_or_the_other_model(models, tmp_path):
    symbolic = models["symbolic"]
    assert _verify(models["decoder"], symbolic).generation.token_agreement == 1.0  # the reference's shapes
    with pytest.raises(Exception, match="dimension 3 \\('kv_cache_dim'\\).*genai_config.json"):
        _verify(symbolic, symbolic)
    (symbolic.parent / "genai_config.json").write_text(json.dumps(
        {"model": {"decoder": {"num_key_value_heads": 1, "head_size": DIM}}}))
    assert _verify(symbolic, symbolic).generation.prefix_match == (32,) * 4


def test_prompts_from_data(models, tmp_path):
    folder = tmp_path / "prompts"
    folder.mkdir()
    np.savez(folder / "a.npz", input_ids=np.array([[5, 6, 7], [8, 9, 10]]))
    np.save(folder / "b.npy", np.array([11, 12, 13, 14, 15]))
    report = verify(models["decoder"], models["decoder"], VerifyOptions(data=str(folder), **OFF))
    assert report.generation.prompt_lengths == (3, 3, 5) and report.generation.source == str(folder)
    np.save(tmp_path / "bad.npy", np.array([1, VOCAB]))
    with pytest.raises(Exception, match=f"token ids must be in \\[0, {VOCAB}\\)"):
        verify(models["decoder"], models["decoder"], VerifyOptions(data=str(tmp_path / "bad.npy"), **OFF))


def test_cli_gate_exit_status_and_reports(models, tmp_path):
    ref, cand = models["decoder"], models["perturbed"]
    common = [ref, cand, "--prompts", 2, "--steps", 6, "--prompt-length", 4, "--costs", "off"]
    passed = cli("verify", *common, "--json", tmp_path / "ok.json", "--min-token-agreement", 0)
    assert passed.returncode == 0, passed.stderr
    assert "greedy next-token agreement (teacher-forced): " in passed.stdout
    assert json.loads((tmp_path / "ok.json").read_text())["generation"]["min_token_agreement"] == 0
    failed = cli("verify", *common, "--json", "--min-token-agreement", 100, "--html", tmp_path / "r.html")
    assert failed.returncode == 1, failed.stderr
    data = json.loads(failed.stdout)
    gen = data["generation"]
    assert data["passed"] is False and gen["passed"] is False and gen["failures"][0].startswith("token agreement")
    assert (gen["prompts"], gen["steps"], len(gen["step_snr_db"]), len(gen["prefix_match"])) == (2, 6, 6, 2)
    assert 0 <= gen["token_agreement"] < 1 and isinstance(gen["logits_snr_db"], float)
    page = (tmp_path / "r.html").read_text()
    assert "id=generation" in page and page.count("<svg") == 2


def test_errors_are_one_line(models, tmp_path):
    ref = models["decoder"]
    result = cli("verify", ref, ref, "--per-layer", "--costs", "off")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    [line] = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith("[")]
    assert line.startswith("trt-bridge verify: error: ") and "--per-layer does not apply" in line
    net = tmp_path / "net.onnx"
    onnx.save(samples.conv_net(), net)
    cases = [((ref, ref), {"min_token_agreement": 101}, "percentage from 0 to 100"),
             ((net, net), {"steps": 4}, "apply to decoders"), ((ref, net), {}, "is a decoder with a key/value cache")]
    for args, options, message in cases:
        with pytest.raises(TrtBridgeError, match=message):
            api_verify(*args, costs="off", quiet=True, **options)


def test_json_of_identical_logits_is_strict(models):
    data = json.loads(_verify(models["decoder"], models["decoder"], steps=3).to_json())
    assert data["generation"]["logits_snr_db"] == "inf" and data["generation"]["step_snr_db"] == ["inf"] * 3


def test_html_report_of_a_decoder(models):
    page = render(_verify(models["decoder"], models["perturbed"], steps=4, min_token_agreement=100))
    assert "Generation loop (decoder)" in page and '<span class="fail">FAIL</span> token agreement' in page


REAL = {"fp32": DATA / "llama-optimum-fp32" / "model.onnx",
        "merged-int4": DATA / "llama-optimum-merged-int4-b32" / "decoder_model_merged.onnx"}


def test_real_exports(tmp_path):
    """Optimum's tiny Llama: float against itself agrees on every token; its merged (If on use_cache_branch)
    int4 block QDQ export is measured (73.4 %, 15.5 dB at 4 x 32 on these prompts)."""
    same = _verify(REAL["fp32"], REAL["fp32"], steps=8)
    assert same.generation.token_agreement == 1.0 and same.generation.logits_snr_db == math.inf
    int4 = _verify(REAL["fp32"], REAL["merged-int4"], steps=8).generation
    assert 0.5 < int4.token_agreement < 1 and 10 < int4.logits_snr_db < 25
    shutil.copy(REAL["fp32"], tmp_path / "m.onnx")  # no config beside it: the shapes are declared
    assert _verify(tmp_path / "m.onnx", REAL["merged-int4"], steps=2).generation.steps == 2


def test_a_window_cache_is_fed_its_capacity(tmp_path):
    """onnxruntime-genai's Mistral (``sliding_window_cache``, past length ``past_sliding_length``): onnxruntime
    refuses a window cache of fewer rows than the window (8), so both loops feed 8 rows from the prefill on (the
    converted model, with no attention node left and no config beside it, takes the source's)."""
    from trt_bridge.api import convert

    source = DATA / "mistral-genai-cpu-int4" / "model.onnx"
    header = onnx.load(str(source), load_external_data=False)
    shapes = empty_cache_shapes(header, source, decoder_signature(header))
    assert shapes["past_key_values.1.value"] == (1, 2, 8, 16)
    out = tmp_path / "converted" / "model.onnx"
    convert(source, out, quiet=True, skip_check=True)
    converted = onnx.load(str(out), load_external_data=False)
    assert empty_cache_shapes(converted, out, decoder_signature(converted), fallback=shapes) == shapes
    result = _verify(source, out, prompts=2, steps=12).generation  # prompts of 16: past the window
    assert result.token_agreement == 1.0 and result.logits_snr_db > 30  # 38.6 dB: the source rounds to int8
