"""What every lift rule shares: the context it writes to, how it declines, and the two steps it takes
(``match``, then ``rewrite``)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.annotations import Annotations, Site
from trt_bridge.ir.derived import DerivedValues
from trt_bridge.ir.names import NameAllocator

#: What ``match`` returns for a node outside its pattern (a float MaxPool for the integer
#: pass-through rule): neither fired nor declined, and not reported.
NOT_MINE = ""

#: the match object of a rule: what its ``match`` found and its ``rewrite`` needs
M = TypeVar("M")


@dataclass(frozen=True)
class Decline:
    """A rule looked at ``node`` and did not rewrite it, for ``reason``."""

    rule: str
    node: str
    op: str
    reason: str


@dataclass(frozen=True)
class Approximation:
    """A rule lifted ``node`` to the nearest thing TensorRT builds, not to what it computed."""

    rule: str
    node: str
    what: str


@dataclass
class LiftContext:
    graph: gs.Graph
    annotations: Annotations = field(default_factory=Annotations)
    fired: dict[str, list[str]] = field(default_factory=dict)  # rule -> nodes rewritten
    declined: list[Decline] = field(default_factory=list)
    constants: dict[tuple, gs.Constant] = field(default_factory=dict)  # dedup of lifted weights
    names: NameAllocator | None = None
    prepared: list = field(default_factory=list)  # prepare.change.Change records of the steps before lifting
    approximated: list[Approximation] = field(default_factory=list)  # lifted to the nearest TensorRT form
    in_bodies: list[str] = field(default_factory=list)  # nodes lifted inside control-flow bodies
    body_annotations: Annotations = field(default_factory=Annotations)  # what lifting annotated inside bodies

    def __post_init__(self) -> None:
        if self.names is None:
            self.names = NameAllocator(self.graph)

    def approximate(self, rule: str, node: str, what: str) -> None:
        """Record that ``rule`` lifted ``node`` to an approximation (reported, and warned about once per rule)."""
        self.approximated.append(Approximation(rule, node, what))

    def constant(self, base: str, values: np.ndarray | Callable[[], np.ndarray], key: tuple,
                 shape: tuple[int, ...] | None = None, dtype=None) -> gs.Constant:
        """A float constant, shared between rules that derive the same values from the same source (``values`` may
        be a function that computes them, called only for a key not seen before). A function with its ``shape`` and
        ``dtype`` is called only when something reads the values (:class:`trt_bridge.ir.derived.DerivedValues`: a
        weight whose annotation keeps its codes, which lowering writes instead)."""
        const = self.constants.get(key)
        if const is None and callable(values) and shape is not None and dtype is not None:
            const = gs.Constant(self.names(base), DerivedValues(values, shape, dtype))
            self.constants[key] = const
        elif const is None:
            values = values() if callable(values) else values
            # (np.ascontiguousarray would make a 0-d array 1-d: a scalar must stay a scalar, or the Reshape
            # shapes built from it change rank — AIMET quantizes MobileViT's shape arithmetic)
            const = gs.Constant(self.names(base), np.ascontiguousarray(values).reshape(np.shape(values)))
            self.constants[key] = const
        return const


def detach(node: gs.Node) -> None:
    """Disconnect ``node`` (rewritten: nothing reads it) from its inputs, and let go of the loaded values of the
    constants only it read. onnx-graphsurgeon's tensors and their input/output lists refer to each other, so a dead
    constant is cyclic garbage, freed only when Python's cyclic collector runs: its values (a loaded copy of the
    source's bytes) stayed while a rule rewrote every other weight (0.49 GB of a 0.85 B int4 decoder)."""
    read = [t for t in node.inputs if isinstance(t, gs.Constant)]
    node.inputs.clear()
    for const in read:
        if not const.outputs and isinstance(const.values, np.ndarray):
            const.values = np.zeros((0,) * const.values.ndim, const.values.dtype)


def digest(values: np.ndarray) -> str:
    """A short fingerprint of an array's values (its bytes, without a copy), for :meth:`LiftContext.constant`'s keys
    where the scales alone do not tell two weights apart."""
    array = np.ascontiguousarray(values)
    return f"{array.dtype.str}{array.shape}" + hashlib.blake2b(array.view(np.uint8).reshape(-1), digest_size=16
                                                                ).hexdigest()


@dataclass(frozen=True)
class PendingConstant:
    """A float constant that a ``match`` worked out and its ``rewrite`` adds (:meth:`LiftContext.constant`):
    ``match`` changes nothing, not even the names taken."""

    base: str
    values: np.ndarray
    key: tuple

    def make(self, ctx: LiftContext) -> gs.Constant:
        return ctx.constant(self.base, self.values, self.key)


class LiftRule(Protocol[M]):
    """One source pattern lifted to float graph + annotations, in two steps.

    ``match`` looks at ``node`` and returns what ``rewrite`` needs (the rule's match object, never a
    string), or the reason it declines (:data:`NOT_MINE` for a node outside its pattern); it changes
    nothing, neither the graph nor the context. ``rewrite`` rewires the edges around the match and
    records annotations; it does not decline. Dead nodes are removed by a separate cleanup step.
    ``outcome`` is what ``check`` says the rule makes of the nodes it rewrites (None: ``check`` names
    the rule).
    """

    name: str
    op_types: tuple[str, ...]
    outcome: str | None

    def match(self, ctx: LiftContext, node: gs.Node) -> M | str: ...

    def rewrite(self, ctx: LiftContext, match: M) -> None: ...


def read_float(ctx: LiftContext, dqs: list[gs.Node], x: gs.Tensor) -> list[Site]:
    """Rewire every reader of the ``dqs``' outputs to the float ``x``; the edges rewired."""
    graph_outputs = {id(t) for t in ctx.graph.outputs}
    sites = []
    for dq in dqs:
        out = dq.outputs[0]
        for consumer in list(out.outputs):
            for index, tensor in enumerate(consumer.inputs):
                if tensor is out:
                    consumer.inputs[index] = x
                    sites.append(Site(consumer.name, index))
        if id(out) in graph_outputs:  # keep the output's name: Identity from the float tensor
            out.inputs.clear()
            ctx.graph.nodes.append(gs.Node("Identity", ctx.names(f"{dq.name}/float"), {}, [x], [out]))
    return sites
