"""The one feed a benchmark runs on: concrete input shapes and the data to put in them.

An input's dynamic dimensions take ``--shapes`` (or the runner's default: 1 for ONNX
models, the optimization profile's opt shape for engines). The feed is the first feed
of ``--data`` (any source calibration takes), else seeded random data of those shapes
(:class:`~trt_bridge.calibrate.feed_sources.RandomFeeds`).
"""

from __future__ import annotations

import logging
from dataclasses import replace

from trt_bridge.calibrate.feed_sources import RandomFeeds, open_feeds
from trt_bridge.calibrate.feeds import Feed, InputSpec
from trt_bridge.errors import TrtBridgeError
from trt_bridge.tensorrt.profiles import parse_shapes as parse_shape_items

log = logging.getLogger("trt_bridge.bench")

Shapes = dict[str, tuple[int, ...]]


def parse_shapes(items: list[str] | None) -> Shapes | None:
    """``["x:1x3x224x224", "mask:1x128,ids:1x128"]`` → ``{"x": (1, 3, 224, 224), ...}``, None without
    items: the syntax of ``trt-bridge build`` (trtexec's and Polygraphy's), parsed by the same code."""
    if not items:
        return None
    return parse_shape_items(list(items))


def _text(shape) -> str:
    """``[1, 3, N, ?]``: symbolic dimensions by name, unknown ones (None, -1) as ``?``."""
    return "[" + ", ".join(_dim(d) for d in shape) + "]"


def _dim(d) -> str:
    if isinstance(d, str) and d:
        return d
    return str(int(d)) if d is not None and int(d) >= 0 else "?"


def concrete_specs(specs: list[InputSpec], shapes: Shapes | None, where: str,
                   defaults: Shapes | None = None) -> list[InputSpec]:
    """``specs`` with every dimension fixed: ``shapes[name]``, else ``defaults[name]``, else 1 per dynamic dim.

    ``shapes`` must name inputs of the model, with their rank, and keep their fixed dimensions.
    """
    names = [s.name for s in specs]
    for name in shapes or {}:
        if name not in names:
            raise TrtBridgeError(f"{where}: --shapes names '{name}', which is not an input of the model. "
                                 f"Its inputs are: {', '.join(names) or 'none'}.")
    out = []
    for spec in specs:
        given = (shapes or {}).get(spec.name)
        if given is not None:
            if len(given) != spec.rank:
                raise TrtBridgeError(f"{where}: --shapes gives input '{spec.name}' rank {len(given)} "
                                     f"({_text(given)}), but the model's input is {_text(spec.shape)} "
                                     f"(rank {spec.rank}).")
            for axis, (want, got) in enumerate(zip(spec.shape, given)):
                if _fixed(want) and want != got:
                    raise TrtBridgeError(f"{where}: --shapes gives input '{spec.name}' {_text(given)}, but the model "
                                         f"fixes dimension {axis} at {want} ({_text(spec.shape)}).")
            shape = tuple(given)
        elif defaults and spec.name in defaults:
            shape = tuple(defaults[spec.name])
        else:
            shape = tuple(d if _fixed(d) else 1 for d in spec.shape)
            if shape != spec.shape:
                log.info("%s: input '%s' %s runs as %s (give --shapes for other dynamic dimensions)", where,
                         spec.name, _text(spec.shape), _text(shape))
        out.append(replace(spec, shape=shape))
    return out


def _fixed(d) -> bool:
    return isinstance(d, int) and d > 0


def first_feed(specs: list[InputSpec], concrete: list[InputSpec], data: str | None, seed: int, where: str,
               shapes: Shapes | None = None) -> tuple[Feed, str]:
    """The feed to run and where it came from.

    ``specs``: the model's declared inputs (dynamic dimensions free); ``concrete``: the same with
    the shapes to run. With ``data`` the first feed of that source is used (its shapes must agree
    with ``shapes``, where those are given); else a seeded random feed of ``concrete``'s shapes.
    """
    if data is None:
        return next(iter(RandomFeeds(1, concrete, seed))), f"random (seed {seed})"
    source = open_feeds(data, None, specs)
    feed = next(iter(source))
    for name, shape in (shapes or {}).items():
        if name in feed and tuple(feed[name].shape) != tuple(shape):
            raise TrtBridgeError(f"{where}: --shapes gives input '{name}' {_text(shape)}, but the first feed of "
                                 f"{data} has {_text(feed[name].shape)}; drop --shapes or give matching data.")
    return feed, f"{source.description} (first feed)"
