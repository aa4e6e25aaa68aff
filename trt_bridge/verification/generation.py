"""``verify`` for decoders: a greedy generation loop in each model, compared step by step.

N prompts × T steps. Each model drives its own loop: prefill (the prompt, an empty cache of past length 0,
``use_cache_branch`` False for Optimum's merged decoder), then T−1 decode steps of one token, its own
``present`` outputs fed back as its pasts, the attention mask one longer each step and ``position_ids`` the
positions of the new tokens. The reference generates greedily; the candidate is teacher-forced on the
reference's tokens, so one early disagreement does not poison every later step. At each step the candidate's
argmax is compared with the reference's (the *teacher-forced agreement*) and their logits are compared (SNR
over all steps, and per step).

The *free-running prefix match* (how many tokens the candidate, driving itself on its own argmax, generates
before it first differs from the reference) needs no second loop: up to its first disagreement the free-running
candidate is fed exactly the reference's tokens, so it is the index of the first teacher-forced disagreement.

Optimum's ORTModelForCausalLM feeds a merged decoder an empty past (length 0) with ``use_cache_branch`` False at
the first step (its seq2seq models feed a dummy past of length 1): that branch does not read the past, and 0 is
what is fed here.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import onnx

from trt_bridge.choices import check_bound
from trt_bridge.errors import CalibrationDataError, TrtBridgeError
from trt_bridge.ir.model import read_model
from trt_bridge.runtime.session import session
from trt_bridge.verification.decoder import (
    ATTENTION_MASK,
    INPUT_IDS,
    POSITION_IDS,
    USE_CACHE_BRANCH,
    DecoderSignature,
    empty_cache_shapes,
)
from trt_bridge.verification.metrics import Accumulator, OutputMetrics, SnrAccumulator, snr_text

log = logging.getLogger("trt_bridge.verification")

DEFAULT_PROMPTS, DEFAULT_STEPS, DEFAULT_PROMPT_LENGTH = 4, 32, 16
#: random prompts avoid the first ids, special tokens (bos, eos, pad, unk) in most vocabularies
FIRST_IDS = 4
#: prompts of one length run together, at most this many at a time
MAX_BATCH = 16


@dataclass(frozen=True)
class GenerationOptions:
    prompts: int | None = None  # None: DEFAULT_PROMPTS random prompts, or every prompt of ``data``
    steps: int = DEFAULT_STEPS
    prompt_length: int = DEFAULT_PROMPT_LENGTH
    seed: int = 0
    data: str | None = None  # an .npz/.npy (or a folder of them) holding input_ids: the prompts
    min_token_agreement: float | None = None  # percent; None: no gate

    def __post_init__(self) -> None:  # the bounds the command line checks (trt_bridge.choices.BOUNDS)
        for name in ("prompts", "steps", "prompt_length", "seed", "min_token_agreement"):
            check_bound(name, getattr(self, name))


@dataclass(frozen=True)
class GenerationReport:
    prompts: int
    steps: int
    prompt_lengths: tuple[int, ...]
    source: str  # 'random (seed S)' or the --data path
    agreed: int  # teacher-forced steps whose argmax agrees, over all prompts
    compared: int  # prompts × steps
    prefix_match: tuple[int, ...]  # per prompt: free-running tokens generated before the first disagreement
    step_agreement: tuple[float, ...]  # per step: the fraction of prompts that agree
    logits_snr_db: float  # over all steps
    step_snr_db: tuple[float, ...]  # per step, over all prompts
    reference_tokens: tuple[tuple[int, ...], ...]  # per prompt: the reference's greedy tokens
    candidate_tokens: tuple[tuple[int, ...], ...]  # per prompt: the candidate's argmax, teacher-forced
    seconds: float
    min_token_agreement: float | None = None
    failures: tuple[str, ...] = ()

    @property
    def token_agreement(self) -> float:
        return self.agreed / self.compared if self.compared else 1.0

    @property
    def min_step_snr_db(self) -> float:
        return min(self.step_snr_db, key=lambda v: (not np.isnan(v), v)) if self.step_snr_db else float("inf")

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict:
        data = asdict(self)
        data.update(token_agreement=self.token_agreement, min_step_snr_db=self.min_step_snr_db,
                    passed=self.passed)
        return data

    def lines(self) -> list[str]:
        worst = min(range(len(self.step_snr_db)), key=lambda t: (not np.isnan(self.step_snr_db[t]),
                                                                  self.step_snr_db[t]), default=0)
        prefix = self.prefix_match
        verdict = "PASS" if self.passed else "FAIL (" + "; ".join(self.failures) + ")"
        return [f"greedy next-token agreement (teacher-forced): {100 * self.token_agreement:.1f}% "
                f"({self.agreed}/{self.compared}); free-running prefix match: mean {np.mean(prefix):.1f}, "
                f"min {min(prefix)} of {self.steps} steps: {verdict}",
                f"logits SNR over all steps {snr_text(self.logits_snr_db)} dB; lowest per step "
                f"{snr_text(self.min_step_snr_db)} dB (step {worst})"]


def prompts(options: GenerationOptions, vocab: int) -> list[np.ndarray]:
    """The prompts (1-D token ids): seeded random ids in [FIRST_IDS, vocab), or the input_ids of ``data``."""
    if options.data is None:
        count = DEFAULT_PROMPTS if options.prompts is None else options.prompts
        rng = np.random.default_rng(options.seed)
        return list(rng.integers(min(FIRST_IDS, vocab - 1), vocab, size=(count, options.prompt_length)))
    path = Path(options.data)
    files = sorted(p for p in path.iterdir() if p.suffix in (".npz", ".npy")) if path.is_dir() else [path]
    found = []
    for file in files:
        try:
            loaded = np.load(file)
            ids = loaded if isinstance(loaded, np.ndarray) else loaded[INPUT_IDS]
        except (OSError, ValueError, KeyError) as exc:
            raise CalibrationDataError(f"{file}: cannot read the prompts ({type(exc).__name__}: {exc}); give an "
                                       f".npz holding '{INPUT_IDS}' (one prompt per row), an .npy of token ids, "
                                       "or a folder of them.") from exc
        if ids.ndim not in (1, 2) or ids.dtype.kind not in "iu" or not ids.size:
            raise CalibrationDataError(f"{file}: '{INPUT_IDS}' must hold integer token ids shaped [length] or "
                                       f"[prompts, length], got {ids.dtype} {list(ids.shape)}.")
        if ids.min() < 0 or ids.max() >= vocab:
            raise CalibrationDataError(f"{file}: token ids must be in [0, {vocab}) (the vocabulary, the last "
                                       f"dimension of the logits), got {ids.min()}..{ids.max()}.")
        found += list(np.atleast_2d(ids).astype(np.int64))
    if not found:
        raise CalibrationDataError(f"{path}: no .npz/.npy prompts found.")
    return found[:options.prompts] if options.prompts else found


class Loop:
    """One model driving its own generation loop: its session, the cache it feeds back, the length so far."""

    def __init__(self, path: Path, signature: DecoderSignature, empty: dict[str, tuple[int, ...]]):
        self.path, self.signature, self.empty = path, signature, empty
        bad = sorted({c.dtype for c in signature.cache} - {"float32", "float16", "float64"})
        if bad:
            raise TrtBridgeError(f"{path}: a {bad[0]} key/value cache cannot be fed from numpy to onnxruntime; "
                                 "verify the float32 or float16 form of the model.")
        self.session = session(path, simulate_qdq=True)
        self.cache: dict[str, np.ndarray] = {}
        self.length = 0
        self.stripped = False  # the model runs without its declared intermediate shapes

    def session_without_shapes(self) -> bool:
        """Run the model again without its intermediate shapes (False), or say it already does (True).

        Some exports declare an intermediate shape with the wrong symbolic names (onnxruntime-genai's float16 CPU
        model names a [batch, total, 64] tensor [batch, sequence_length, 64]); onnxruntime's memory planner trusts
        them and fails at the first decode step ("Shape mismatch attempting to re-use buffer")."""
        if self.stripped:
            return True
        model = read_model(self.path)
        del model.graph.value_info[:]
        log.warning("%s declares intermediate shapes its decode steps do not have; running it without them",
                    self.path)
        self.session, self.stripped = session(model, simulate_qdq=True), True
        return False

    def start(self, ids: np.ndarray) -> np.ndarray:
        """Prefill: the prompts ``ids`` [batch, length] on an empty cache; their logits."""
        self.cache = {c.past: np.zeros((len(ids), *self.empty[c.past][1:]), c.dtype) for c in self.signature.cache}
        self.length = 0
        return self.step(ids)

    def step(self, ids: np.ndarray) -> np.ndarray:
        sig = self.signature
        batch, new = ids.shape
        feed = {INPUT_IDS: ids.astype(sig.input_ids_dtype),
                ATTENTION_MASK: np.ones((batch, self.length + new), sig.attention_mask_dtype), **self.cache}
        if sig.position_ids_dtype:
            positions = np.arange(self.length, self.length + new, dtype=sig.position_ids_dtype)
            feed[POSITION_IDS] = np.ascontiguousarray(np.broadcast_to(positions, (batch, new)))
        if sig.use_cache_branch:
            feed[USE_CACHE_BRANCH] = np.array([self.length > 0])
        try:
            try:
                logits, *presents = self.session.run(sig.outputs, feed)
            except Exception as exc:
                if "re-use buffer" not in str(exc) or self.session_without_shapes():
                    raise
                logits, *presents = self.session.run(sig.outputs, feed)
        except Exception as exc:  # onnxruntime rejecting the feed, or failing in a kernel
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise TrtBridgeError(f"{self.path}: onnxruntime failed at past length {self.length} with {new} new "
                                 f"token(s) in the generation loop: {text}") from exc
        self.cache = {c.past: p.astype(c.dtype, copy=False) for c, p in zip(sig.cache, presents)}
        self.length += new
        return logits


@dataclass
class _Tally:
    """What the steps add up to, batch by batch."""

    logits: Accumulator
    steps: list[SnrAccumulator]
    step_agreed: list[int]
    reference: dict[int, list[int]] = field(default_factory=dict)
    candidate: dict[int, list[int]] = field(default_factory=dict)


def compare_generation(reference: Path, candidate: Path, headers: tuple[onnx.ModelProto, onnx.ModelProto],
                       signatures: tuple[DecoderSignature, DecoderSignature], options: GenerationOptions,
                       top_k: int = 5) -> tuple[GenerationReport, OutputMetrics]:
    """The generation comparison, and the candidate's logits metrics over all its (teacher-forced) steps."""
    start = time.perf_counter()
    if options.steps < 1 or options.prompt_length < 1 or (options.prompts is not None and options.prompts < 1):
        raise TrtBridgeError("--prompts, --steps and --prompt-length must be at least 1.")
    ref_empty = empty_cache_shapes(headers[0], reference, signatures[0])
    cand_empty = empty_cache_shapes(headers[1], candidate, signatures[1], fallback=ref_empty)
    ref, cand = Loop(reference, signatures[0], ref_empty), Loop(candidate, signatures[1], cand_empty)
    vocab = signatures[0].vocab or signatures[1].vocab or ref.start(np.full((1, 1), 0)).shape[-1]
    given = prompts(options, vocab)
    tally = _Tally(Accumulator(top_k), [SnrAccumulator() for _ in range(options.steps)], [0] * options.steps)
    by_length = defaultdict(list)
    for i, prompt in enumerate(given):
        by_length[len(prompt)].append(i)
    size = min(b for b in (signatures[0].batch, signatures[1].batch, MAX_BATCH) if b)
    for indices in by_length.values():
        for first in range(0, len(indices), size):
            chunk = indices[first:first + size]
            _run_batch(ref, cand, np.stack([given[i] for i in chunk]), chunk, options.steps, tally)
    prefix = tuple(next((t for t, (r, c) in enumerate(zip(tally.reference[i], tally.candidate[i])) if r != c),
                        options.steps) for i in range(len(given)))
    report = GenerationReport(
        len(given), options.steps, tuple(len(p) for p in given),
        options.data or f"random (seed {options.seed})", sum(tally.step_agreed), len(given) * options.steps,
        prefix, tuple(a / len(given) for a in tally.step_agreed), tally.logits.snr_db(),
        tuple(s.snr_db() for s in tally.steps), tuple(tuple(tally.reference[i]) for i in range(len(given))),
        tuple(tuple(tally.candidate[i]) for i in range(len(given))), 0.0, options.min_token_agreement)
    failures = ()
    bound = options.min_token_agreement
    if bound is not None and not 100 * report.token_agreement >= bound:
        failures = (f"token agreement {100 * report.token_agreement:.1f}% < --min-token-agreement {bound:g}",)
    report = replace(report, failures=failures, seconds=time.perf_counter() - start)
    return report, tally.logits.result(signatures[1].logits, "candidate")


def _run_batch(ref: Loop, cand: Loop, ids: np.ndarray, rows: list[int], steps: int, tally: _Tally) -> None:
    ref_logits, cand_logits = ref.start(ids), cand.start(ids)
    for i in rows:
        tally.reference[i], tally.candidate[i] = [], []
    forced = None
    for t in range(steps):
        if forced is not None:  # both fed the reference's last token: the candidate is teacher-forced
            ref_logits, cand_logits = ref.step(forced), cand.step(forced)
        if ref_logits.shape != cand_logits.shape:
            raise TrtBridgeError(f"the logits differ in shape at step {t}: reference {list(ref_logits.shape)}, "
                                 f"candidate {list(cand_logits.shape)}; verify compares two forms of one model.")
        tally.logits.add(ref_logits.reshape(-1, ref_logits.shape[-1]), cand_logits.reshape(-1, ref_logits.shape[-1]))
        tally.steps[t].add(ref_logits, cand_logits)
        ref_tokens, cand_tokens = ref_logits[:, -1].argmax(-1), cand_logits[:, -1].argmax(-1)
        tally.step_agreed[t] += int(np.sum(ref_tokens == cand_tokens))
        for row, r, c in zip(rows, ref_tokens.tolist(), cand_tokens.tolist()):
            tally.reference[row].append(r)
            tally.candidate[row].append(c)
        forced = ref_tokens[:, None]
