"""The pipeline manifest: which models, converted how, built for which targets, gated how.

```yaml
output: pipeline-output            # artifacts (relative to this file); default: <manifest name>-output
defaults:                          # merged into every model (a model's own keys win)
  calib_random: 8                  # or calib_data: data/calib.npz
  eval_random: 8                   # or eval_data: data/eval.npz
  gates: {min_snr: 25, min_cosine: 0.99}
  bench: {iterations: 50, warmup: 5}
models:
  - name: resnet8                  # unique; names the artifacts
    source: models/resnet8-int8.onnx
    reference: models/resnet8.onnx # what verify compares against (default: the source)
    convert: {scales: data, exclude_nodes: "head"}   # convert's options (CONVERT_KEYS), as its flags take them
    shapes: {input: [1, 3, 32, 32]}                  # fixed shapes for dynamic inputs (build and bench)
targets:
  - name: ada                      # TensorRT-RTX ahead of time: runs on a machine without a GPU
    compute_capabilities: ["8.9"]
  - name: this-gpu                 # this machine's GPU: build, then verify and bench the engine
    gpu: true
```
Every key is checked; an unknown or ill-typed one is an error that names it. Paths are relative to the
manifest's folder; ``output`` must stay inside it (``trt-bridge pipeline --output DIR`` puts the artifacts
elsewhere, explicitly) and must not be an existing file. YAML aliases may be used, but a manifest that expands
to more than :data:`MAX_VALUES` values (an alias bomb) is refused.
"""

from __future__ import annotations

import enum
import math
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path

from trt_bridge.bench.ort_runner import PROVIDERS
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions, option_key
from trt_bridge.errors import TrtBridgeError

#: ConvertOptions' sub-options by field name: a model's ``convert`` table fills them
CONVERT_SECTIONS = {name: kind for name, kind in typing.get_type_hints(ConvertOptions).items() if is_dataclass(kind)}
#: options a convert table does not take: calib_data and calib_random are the model's keys (a path relative to the
#: manifest, a count checked with it); scale files and QAT files are paths the manifest does not resolve (yet)
NOT_IN_CONVERT = {"calib_data", "calib_random", "scale_files", "qat"}
#: a convert table's key → (ConvertOptions field, the sub-options' field, its type)
CONVERT_FIELDS = {option_key(f): (section, f.name, typing.get_type_hints(kind)[f.name])
                  for section, kind in CONVERT_SECTIONS.items() for f in fields(kind)
                  if option_key(f) not in NOT_IN_CONVERT}
CONVERT_KEYS = set(CONVERT_FIELDS)
GATE_KEYS = {"min_snr", "min_cosine", "max_abs"}
BENCH_KEYS = {"iterations", "warmup", "duration", "provider", "threads"}
MODEL_KEYS = {"name", "source", "reference", "calib_data", "calib_random", "eval_data", "eval_random", "convert",
              "shapes", "gates", "bench"}
TARGET_KEYS = {"name", "compute_capabilities", "gpu"}
#: the most values (mappings, lists, scalars, counted each time an alias repeats them) a manifest may expand to
MAX_VALUES = 100_000


class ManifestError(TrtBridgeError):
    """The manifest is missing, not YAML, or has a key of the wrong name or type."""


@dataclass(frozen=True)
class Target:
    name: str
    compute_capabilities: tuple[str, ...] = ()  # ahead of time with TensorRT-RTX
    gpu: bool = False  # this machine's GPU: the engine is also verified and benchmarked


@dataclass(frozen=True)
class ModelEntry:
    name: str
    source: Path
    reference: Path
    calib_data: Path | None = None
    calib_random: int | None = None
    eval_data: Path | None = None
    eval_random: int | None = None
    convert: ConvertOptions = field(default_factory=ConvertOptions)  # with the model's calib_data/calib_random
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    gates: dict[str, float | dict[str, float]] = field(default_factory=dict)
    bench: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Manifest:
    path: Path
    output: Path
    models: tuple[ModelEntry, ...]
    targets: tuple[Target, ...]


def _unique_keys_loader(path: Path):
    """yaml's SafeLoader, refusing a key given twice in one mapping (``gates:`` twice: yaml keeps the last one and
    silently drops the first); a merge (``<<: *defaults``) may still override."""
    import yaml

    class UniqueKeys(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            if isinstance(node, yaml.MappingNode):
                seen: dict = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue
                    key = self.construct_object(key_node, deep=True)
                    try:
                        first = seen.get(key)
                    except TypeError:  # an unhashable key: yaml's own error names it
                        continue
                    seen.setdefault(key, key_node.start_mark.line + 1)
                    if first is not None:
                        raise ManifestError(f"{path}: line {key_node.start_mark.line + 1}: the key '{key}' is "
                                            f"given twice in one mapping (first on line {first}); yaml would "
                                            "silently drop the first. Keep one, merging what both say.")
            return super().construct_mapping(node, deep)

    return UniqueKeys


def load_manifest(path: str | Path, output: str | Path | None = None) -> Manifest:
    """Read and check the manifest at ``path``. ``output``: the artifacts' folder given on the command line
    (``--output``), which wins over the manifest's and may lie anywhere."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ManifestError(f"{path}: no such manifest file.")
    try:
        data = yaml.load(path.read_text(), Loader=_unique_keys_loader(path))  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as exc:
        raise ManifestError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from exc
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{path}: not a text file ({exc.reason}); a manifest is UTF-8 YAML.") from exc
    _check_expansion(data, path)
    where = str(path)
    data = _mapping(data, where, {"output", "defaults", "models", "targets"})
    base = path.parent
    defaults = _mapping(data.get("defaults") or {}, f"{where}: defaults", MODEL_KEYS - {"name", "source", "reference"})
    models_data = data.get("models")
    if not isinstance(models_data, list) or not models_data:
        raise ManifestError(f"{where}: 'models' must be a non-empty list of models (each with a name and a source).")
    models, names = [], set()
    for i, raw in enumerate(models_data):
        entry = {**defaults, **_mapping(raw, f"{where}: models[{i}]", MODEL_KEYS)}
        for nested in ("convert", "gates", "bench"):  # nested tables merge too
            if nested in defaults and nested in raw:
                low = _table(defaults[nested], f"{where}: defaults.{nested}")
                high = _table(raw[nested], f"{where}: models[{i}].{nested}")
                entry[nested] = {**low, **high}
        model = _model(entry, f"{where}: models[{i}]", base)
        if model.name in names:
            raise ManifestError(f"{where}: models[{i}]: the name '{model.name}' is used twice; names must be unique.")
        names.add(model.name)
        models.append(model)
    targets_data = data.get("targets") or []
    if not isinstance(targets_data, list):
        raise ManifestError(f"{where}: 'targets' must be a list (each with a name, and compute_capabilities or gpu).")
    targets = [_target(_mapping(raw, f"{where}: targets[{i}]", TARGET_KEYS), f"{where}: targets[{i}]")
               for i, raw in enumerate(targets_data)]
    if len({t.name for t in targets}) != len(targets):
        raise ManifestError(f"{where}: target names must be unique.")
    return Manifest(path, _output(data.get("output"), path, output), tuple(models), tuple(targets))


def _check_expansion(data, path: Path) -> None:
    """Refuse a manifest whose aliases expand beyond :data:`MAX_VALUES` values (YAML's "billion laughs"): the
    loader shares the repeated objects, but anything that walks or prints them would expand them."""
    count, stack = 0, [data]
    while stack:
        value = stack.pop()
        count += 1
        if count > MAX_VALUES:
            raise ManifestError(f"{path}: expands to more than {MAX_VALUES} values: YAML aliases (*name) repeat "
                                "something too often (an alias bomb?). Write the manifest without nested aliases.")
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)


def _output(value, path: Path, override) -> Path:
    """The artifacts' folder: ``override`` (``--output``) as given, else the manifest's ``output`` inside the
    manifest's folder (default ``<manifest name>-output``). An existing file is refused either way."""
    base = path.parent
    if override is not None:
        output = Path(override)
    else:
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ManifestError(f"{path}: 'output' must be a folder name (a string), got {type(value).__name__}.")
        output = base / (value or f"{path.stem}-output")
        inside = base.resolve()
        if output.resolve() != inside and inside not in output.resolve().parents:
            raise ManifestError(f"{path}: output '{value}' is outside the manifest's folder {base}; the pipeline "
                                "writes only below it. Give a folder inside it, or choose the folder explicitly with "
                                "`trt-bridge pipeline --output DIR`.")
    if output.exists() and not output.is_dir():
        raise ManifestError(f"{path}: the output folder {output} is an existing file; the pipeline would write its "
                            "artifacts into it. Name a folder.")
    return output


def _table(value, where: str) -> dict:
    """A nested table (convert, gates, bench): a mapping, or null for none."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ManifestError(f"{where}: expected a mapping of keys, got {type(value).__name__}.")
    return value


def _mapping(value, where: str, allowed: set[str]) -> dict:
    if not isinstance(value, dict):
        raise ManifestError(f"{where}: expected a mapping of keys, got {type(value).__name__}.")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise ManifestError(f"{where}: unknown key '{unknown[0]}'; the keys here are: {', '.join(sorted(allowed))}.")
    return value


def _model(entry: dict, where: str, base: Path) -> ModelEntry:
    for key in ("name", "source"):
        if not isinstance(entry.get(key), str) or not entry[key]:
            raise ManifestError(f"{where}: '{key}' is required (a string).")
    _check_name(entry["name"], where)
    for key in ("reference", "calib_data", "eval_data"):
        if entry.get(key) is not None and (not isinstance(entry[key], str) or not entry[key]):
            raise ManifestError(f"{where}: '{key}' must be a path (a string), got {type(entry[key]).__name__} "
                                f"{str(entry[key])[:40]}.")
    source = base / entry["source"]
    reference = base / entry["reference"] if entry.get("reference") else source
    for label, p in (("source", source), ("reference", reference)):
        if not p.is_file():
            raise ManifestError(f"{where}: {label} {p} does not exist.")
    calib_data = base / entry["calib_data"] if entry.get("calib_data") else None
    eval_data = base / entry["eval_data"] if entry.get("eval_data") else None
    for label, data in (("calib_data", calib_data), ("eval_data", eval_data)):  # checked before any step runs
        if data is not None and not Path(str(data).split(":", 1)[0] if ".py:" in str(data) else data).exists():
            raise ManifestError(f"{where}: {label} {data} does not exist.")
    for label, key in (("calib_random", "calib_random"), ("eval_random", "eval_random")):
        if key in entry and (isinstance(entry[key], bool) or not isinstance(entry[key], int) or entry[key] < 1):
            raise ManifestError(f"{where}: '{label}' must be a positive integer.")
    if calib_data is not None and entry.get("calib_random") is not None:
        raise ManifestError(f"{where}: give calib_data or calib_random, not both.")
    convert = _convert_options(_mapping(entry.get("convert") or {}, f"{where}: convert", CONVERT_KEYS),
                               f"{where}: convert", CalibrationOptions(
                                   data=str(calib_data) if calib_data else None, random=entry.get("calib_random")))
    gates = _mapping(entry.get("gates") or {}, f"{where}: gates", GATE_KEYS)
    for key, value in gates.items():
        values = value.values() if isinstance(value, dict) else [value]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            raise ManifestError(f"{where}: gates.{key} must be a number or a mapping of output name → number.")
    bench = _mapping(entry.get("bench") or {}, f"{where}: bench", BENCH_KEYS)
    _check_bench(bench, f"{where}: bench")
    shapes_raw = _mapping(entry.get("shapes") or {}, f"{where}: shapes", set(entry.get("shapes") or {}))
    shapes = {}
    for name, dims in shapes_raw.items():
        if not isinstance(dims, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0
                                                 for d in dims):
            raise ManifestError(f"{where}: shapes.{name} must be a list of positive integers, e.g. [1, 3, 224, 224].")
        shapes[name] = tuple(dims)
    return ModelEntry(entry["name"], source, reference, calib_data, entry.get("calib_random"), eval_data,
                      entry.get("eval_random"), convert, shapes, dict(gates), dict(bench))


def _check_bench(bench: dict, where: str) -> None:
    """The bench table's values, checked with the manifest (before any step runs), as bench's flags take them."""
    for key, value in bench.items():
        if key == "provider":
            if value not in PROVIDERS:
                raise ManifestError(f"{where}.provider: {value!r} is not one of {', '.join(PROVIDERS)}.")
            continue
        integer = key != "duration"
        number = not isinstance(value, bool) and (isinstance(value, int) if integer else
                                                  isinstance(value, (int, float)) and math.isfinite(value))
        low = 0 if key == "warmup" else 1 if integer else 0
        if not number or value < low or (key == "duration" and value <= 0):
            kind = "an integer" if integer else "a number of seconds"
            raise ManifestError(f"{where}.{key}: expected {kind} {'of at least ' + str(low) if integer else 'above 0'}"
                                f", got {value!r}.")


def _convert_options(table: dict, where: str, calibration: CalibrationOptions) -> ConvertOptions:
    """A model's ``convert`` table as ConvertOptions: each value of its field's type (checked here), each
    sub-options checking its own values (with the message `trt-bridge convert` gives for them)."""
    values: dict[str, dict] = {section: {} for section in CONVERT_SECTIONS}
    values["calibration"].update(data=calibration.data, random=calibration.random)
    for key, value in table.items():
        section, name, kind = CONVERT_FIELDS[key]
        values[section][name] = _option_value(value, kind, f"{where}.{key}")
    try:
        return ConvertOptions(**{section: CONVERT_SECTIONS[section](**kw) for section, kw in values.items()})
    except TrtBridgeError as exc:
        raise ManifestError(f"{where}: {exc}") from exc


def _option_value(value, kind, where: str):
    """``value`` as an options field of type ``kind`` takes it (an enum member for its value), or ManifestError."""
    choices = typing.get_args(kind)
    if type(None) in choices:  # X | None
        if value is None:
            return None
        kind = next(c for c in choices if c is not type(None))
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        allowed = [m.value for m in kind]
        if value not in allowed:
            raise ManifestError(f"{where}: {value!r} is not one of {', '.join(allowed)}.")
        return kind(value)
    if kind is bool and not isinstance(value, bool):
        raise ManifestError(f"{where}: expected true or false, got {value!r}.")
    if kind in (int, float) and (isinstance(value, bool) or not isinstance(value, (int, float))
                                 or not math.isfinite(value)):
        raise ManifestError(f"{where}: expected a number, got {value!r}.")
    if kind is str and not isinstance(value, str):
        raise ManifestError(f"{where}: expected a string, got {value!r}.")
    return value


def _check_name(name: str, where: str) -> None:
    """Names become file names under the output folder: letters, digits, '-', '_' and inner dots only."""
    if not all(c.isascii() and (c.isalnum() or c in "-_.") for c in name) or name.startswith(".") \
            or name.endswith("."):
        raise ManifestError(f"{where}: name '{name}' may hold letters, digits, '-', '_' and inner '.' only "
                            "(it names files under the output folder).")


def _target(raw: dict, where: str) -> Target:
    if not isinstance(raw.get("name"), str) or not raw["name"]:
        raise ManifestError(f"{where}: 'name' is required (a string).")
    _check_name(raw["name"], where)
    ccs = raw.get("compute_capabilities") or []
    if not isinstance(ccs, list) or not all(isinstance(c, (str, int, float)) for c in ccs):
        raise ManifestError(f"{where}: compute_capabilities must be a list such as ['8.9', '12.0'].")
    gpu = bool(raw.get("gpu", False))
    if not ccs and not gpu:
        raise ManifestError(f"{where}: give compute_capabilities (ahead of time) or gpu: true (this machine's GPU).")
    if ccs and gpu:
        raise ManifestError(f"{where}: a target is either ahead of time (compute_capabilities) or this machine's GPU "
                            "(gpu: true), not both.")
    return Target(raw["name"], tuple(str(c) for c in ccs), gpu)
