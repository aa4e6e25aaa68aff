"""Optimization profiles: the shapes syntax of ``--shapes`` and ``--min/--opt/--max-shapes`` (trtexec's and
Polygraphy's), :class:`Profile`, and the shapes each profile sets once checked against the network's inputs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trt_bridge.choices import MAX_DIMENSION, MAX_VOLUME
from trt_bridge.errors import TrtBridgeError

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Profile:
    """One optimization profile: input name → (min, opt, max) shapes. Dynamic inputs it does not name are an
    error (so a typo never builds a profile for shapes nobody asked for)."""

    shapes: dict[str, tuple[Shape, Shape, Shape]]
    name: str = ""  # what messages call it ('prefill', 'decode': decoder_profiles); '' → "profile N"

    @classmethod
    def fixed(cls, shapes: dict[str, Shape]) -> Profile:
        """min = opt = max (``--shapes``)."""
        return cls({name: (tuple(s), tuple(s), tuple(s)) for name, s in shapes.items()})

    def to_dict(self) -> dict:
        return {name: {"min": list(mn), "opt": list(opt), "max": list(mx)} for name, (mn, opt, mx) in
                self.shapes.items()}

    def text(self) -> str:
        """``input_ids 1x1..1x128 (opt 1x16), past 1x2x0x8``: its shapes on one line (a fixed one as one shape)."""
        def dims(shape):
            return "x".join(str(d) for d in shape) or "scalar"

        return ", ".join(f"{n} {dims(mn)}" if mn == opt == mx else f"{n} {dims(mn)}..{dims(mx)} (opt {dims(opt)})"
                         for n, (mn, opt, mx) in self.shapes.items())


def parse_shapes(text: list[str]) -> dict[str, Shape]:
    """``["x:1x3x224x224", "mask:[1,128],ids:1x128"]`` → ``{"x": (1, 3, 224, 224), ...}``.

    trtexec's and Polygraphy's syntax: NAME:DIMS with dimensions joined by ``x`` or written as a list;
    several inputs as separate items or comma-separated; a name may hold colons (the last one splits).
    """
    shapes: dict[str, Shape] = {}
    for item in text or []:
        for part in _split_top_level(item):
            name, sep, dims = part.rpartition(":")
            dims = dims.strip()
            shape = None
            try:
                if dims.startswith("[") and dims.endswith("]"):
                    shape = tuple(int(d) for d in dims[1:-1].split(",") if d.strip()) if dims[1:-1].strip() else ()
                elif dims:
                    shape = tuple(int(d) for d in dims.lower().split("x"))
            except ValueError:
                shape = None
            name = name.strip()
            if not sep or not name or shape is None or any(d < 0 for d in shape):
                raise TrtBridgeError(f"shape '{part}' is not NAME:DIMS (e.g. x:1x3x224x224 or x:[1,3,224,224]; "
                                     "several inputs as x:1x3x224x224,mask:1x128).")
            volume = 1
            for d in shape:
                volume *= d
            if any(d > MAX_DIMENSION for d in shape) or volume > MAX_VOLUME:
                raise TrtBridgeError(f"shape '{part}': TensorRT takes dimensions and element counts of at most "
                                     f"{MAX_DIMENSION} (2**31 - 1) per input; give a smaller shape.")
            if name in shapes and shapes[name] != shape:
                raise TrtBridgeError(f"input '{name}' is given two shapes ({_text(shapes[name])} and {_text(shape)}); "
                                     "give it once per profile.")
            shapes[name] = shape
    return shapes


def _split_top_level(item: str) -> list[str]:
    """Split at commas outside brackets: 'x:[1,3],y:2x4' → ['x:[1,3]', 'y:2x4']."""
    parts, depth, current = [], 0, ""
    for ch in item:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def _text(shape) -> str:
    return "[" + ", ".join("?" if d < 0 else str(d) for d in shape) + "]"


def network_inputs(network) -> dict[str, Shape]:
    """The network's inputs: name → shape (-1 for a dynamic dimension)."""
    return {t.name: tuple(t.shape) for t in map(network.get_input, range(network.num_inputs))}


def resolve_profiles(network, profiles: tuple[Profile, ...], path: Path, fill_unnamed: bool) -> list[dict]:
    """The shapes each profile sets, checked against the network's inputs (only dynamic inputs are set)."""
    inputs = {}
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        inputs[tensor.name] = tuple(tensor.shape)
        if tensor.is_shape_tensor and any(d < 0 for d in tensor.shape):
            raise TrtBridgeError(f"{path}: input '{tensor.name}' is a shape tensor; trt-bridge build sets no shape "
                                 "values for such inputs yet. Fix its value in the model, or build with trtexec.")
    dynamic = {n: s for n, s in inputs.items() if any(d < 0 for d in s)}
    listing = ", ".join(f"{n} {_text(s)}" for n, s in inputs.items())
    if not profiles:
        default = {n: tuple(1 if d < 0 else d for d in s) for n, s in dynamic.items()}
        return [{n: (s, s, s) for n, s in default.items()}] if default else []
    resolved = []
    for number, profile in enumerate(profiles, 1):
        label = f"profile '{profile.name}'" if profile.name else f"profile {number}"
        out = {}
        for name in profile.shapes:
            if name not in inputs:
                raise TrtBridgeError(f"{path}: {label} names '{name}', which is not an input of the model; its inputs "
                                     f"are: {listing}.")
        for name, shape in inputs.items():
            given = profile.shapes.get(name)
            if given is None:
                if name in dynamic and fill_unnamed:
                    fixed = tuple(1 if d < 0 else d for d in shape)
                    out[name] = (fixed, fixed, fixed)
                elif name in dynamic:
                    example = "x".join("1" if d < 0 else str(d) for d in shape)
                    raise TrtBridgeError(f"{path}: {label} gives no shape for the dynamic input '{name}' "
                                         f"{_text(shape)}; add {name}:{example} (or a range) to it.")
                continue
            trio = tuple(tuple(int(d) for d in s) for s in given)
            for which, s in zip(("min", "opt", "max"), trio):
                if len(s) != len(shape) or any(d < 0 for d in s):
                    raise TrtBridgeError(f"{path}: {label} gives input '{name}' the {which} shape {_text(s)}, but the "
                                         f"model's input is {_text(shape)} (rank {len(shape)}).")
                for axis, (want, got) in enumerate(zip(shape, s)):
                    if want >= 0 and want != got:
                        raise TrtBridgeError(f"{path}: {label} gives input '{name}' the {which} shape {_text(s)}, but "
                                             f"the model fixes dimension {axis} at {want} ({_text(shape)}).")
            if not all(a <= b <= c for a, b, c in zip(*trio)):
                mn, opt, mx = (_text(s) for s in trio)
                raise TrtBridgeError(f"{path}: {label} gives input '{name}' min {mn}, opt {opt}, max {mx}: every "
                                     "dimension needs min <= opt <= max.")
            if name in dynamic:
                out[name] = trio
        if out:
            resolved.append(out)
    return resolved
