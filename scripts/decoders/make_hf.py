"""Write tiny seeded random-weight decoder checkpoints (run inside a corpus venv that has torch + transformers).

    python scripts/decoders/make_hf.py OUT --size tiny|small [--only ARCH ...]

Writes ``OUT/<size>/<arch>/hf/`` for each architecture: ``config.json``, ``model.safetensors``,
``generation_config.json`` and a local word-level tokenizer (``tokenizer.json`` and its configs, made
with the ``tokenizers`` library from a fixed word list: nothing is downloaded from a model hub).

Weights: ``torch.manual_seed(0)``, then every linear weight is redrawn N(0, 1/fan_in), the embeddings
N(0, 1) and the RMSNorm gains 1 + N(0, 0.1), so activations keep unit scale through the layers and
the logits are far from uniform (greedy decoding is not degenerate; quantization error is visible).
The redraw uses its own seeded generator, so the weights do not depend on the transformers version's
own init.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

#: dimensions per size: hidden, query heads, KV heads, layers, intermediate, vocab.
#: The vocabulary must differ from every Linear's out_features (q/k/v/o, gate/up/down, Phi3's packed
#: qkv_proj = hidden + 2 * kv_heads * head_dim and gate_up_proj = 2 * intermediate): onnxruntime-genai 0.18's
#: builder takes *any* nn.Linear with out_features == vocab_size for the LM head (``has_lm_head``), so with
#: vocab 128 = intermediate 128 it wired the logits MatMul to layer 0's post-attention norm (and with
#: vocab 512 = intermediate 512 the same would happen in the small size).
SIZES = {
    "tiny": dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                 intermediate_size=128, vocab_size=192),
    "small": dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                  intermediate_size=512, vocab_size=768),
}
ARCHS = ("llama", "qwen2", "phi3", "mistral")
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]  # ids 0..3: unk, bos, eos, pad


def _config(arch: str, size: str):
    import transformers as tf

    dims = dict(SIZES[size])
    common = dict(max_position_embeddings=2048, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
                  pad_token_id=3, tie_word_embeddings=False, hidden_act="silu")
    if arch == "llama":
        return tf.LlamaConfig(**dims, **common, rope_theta=10000.0, attention_bias=False, mlp_bias=False)
    if arch == "qwen2":  # q/k/v biases (Qwen2 always has them), no sliding window
        return tf.Qwen2Config(**dims, **common, rope_theta=1000000.0, use_sliding_window=False)
    if arch == "phi3":  # packed qkv_proj and gate_up_proj; pad id must be inside the tiny vocab
        return tf.Phi3Config(**dims, **common, rope_theta=10000.0, original_max_position_embeddings=2048,
                             resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0)
    if arch == "mistral":
        # A sliding window shorter than the 16-token test prompt, so it changes the logits. onnxruntime-genai
        # only gives GroupQueryAttention a local_window_size on layers that config.layer_types marks
        # "sliding_attention" (Mistral's config has no layer_types of its own; torch's Mistral applies
        # sliding_window to every layer either way).
        layers = dims["num_hidden_layers"]
        return tf.MistralConfig(**dims, **common, rope_theta=10000.0, sliding_window=8,
                                layer_types=["sliding_attention"] * layers,
                                head_dim=dims["hidden_size"] // dims["num_attention_heads"])
    raise ValueError(arch)


def _model(arch: str, config):
    import transformers as tf

    cls = {"llama": tf.LlamaForCausalLM, "qwen2": tf.Qwen2ForCausalLM, "phi3": tf.Phi3ForCausalLM,
           "mistral": tf.MistralForCausalLM}[arch]
    torch.manual_seed(0)
    model = cls(config).eval()
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if p.dim() == 2 and "embed" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
            elif p.dim() == 2:  # Linear [out, in]; lm_head a bit sharper so logits spread
                std = (2.0 if "lm_head" in name else 1.0) / math.sqrt(p.shape[1])
                p.copy_(torch.randn(p.shape, generator=gen) * std)
            elif "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:  # biases (qwen2 q/k/v)
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    return model


def _tokenizer(folder: Path, vocab: int) -> None:
    """A word-level tokenizer over SPECIALS + 'w4' .. 'w{vocab-1}' (whitespace split), saved locally."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = SPECIALS + [f"w{i}" for i in range(len(SPECIALS), vocab)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", model_max_length=2048)
    fast.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                          "{% if add_generation_prompt %}assistant: {% endif %}")
    fast.save_pretrained(folder)


def _legacy_rope(path: Path) -> None:
    """transformers 5 writes ``rope_parameters`` only; add the 4.x top-level ``rope_theta`` too so the
    optimum venv's transformers 4.57 reads the same rotary base (5.x accepts both)."""
    cfg = json.loads(path.read_text())
    rope = cfg.get("rope_parameters") or {}
    if "rope_theta" in rope and "rope_theta" not in cfg:
        cfg["rope_theta"] = rope["rope_theta"]
        path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _reference(model) -> dict:
    """torch's last-position logits for the 16-token prompt and for prompt + its greedy token
    (``hf/reference.json``, what describe.py compares every export with)."""
    ids = list(range(4, 20))
    with torch.no_grad():
        first = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
        nxt = int(first.argmax())
        second = model(input_ids=torch.tensor([ids + [nxt]])).logits[0, -1].float()
    return {"prompt": ids, "prefill_last_logits": [round(float(x), 6) for x in first],
            "prefill_argmax": nxt, "prefill_logits_std": float(first.std()),
            "prefill_top_prob": float(first.softmax(-1).max()),
            "decode_last_logits": [round(float(x), 6) for x in second], "decode_argmax": int(second.argmax())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--size", choices=sorted(SIZES), required=True)
    ap.add_argument("--only", nargs="*", default=list(ARCHS))
    args = ap.parse_args()
    import transformers

    for arch in args.only:
        folder = args.out / args.size / arch / "hf"
        folder.mkdir(parents=True, exist_ok=True)
        config = _config(arch, args.size)
        model = _model(arch, config)
        model.save_pretrained(folder, safe_serialization=True)
        _tokenizer(folder, config.vocab_size)
        _legacy_rope(folder / "config.json")
        ref = _reference(model) | {"transformers": transformers.__version__, "torch": torch.__version__}
        (folder / "reference.json").write_text(json.dumps(ref) + "\n")
        print(f"[decoders] {folder}: {sum(p.numel() for p in model.parameters())} parameters, "
              f"logits std {ref['prefill_logits_std']:.2f}, top prob {ref['prefill_top_prob']:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
