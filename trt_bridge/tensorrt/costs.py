"""What an engine costs: its size and the activation memory TensorRT's builder reports for it, measured by an
ahead-of-time build (:func:`trt_bridge.tensorrt.build.engine_costs`), and how two engines compare."""

from __future__ import annotations

from dataclasses import asdict, dataclass

#: the compute capability engine costs are measured for unless told otherwise (an ahead-of-time TensorRT-RTX build:
#: Ada, the oldest target that runs every precision trt-bridge writes but FP4)
COST_TARGET = "8.9"


def mib(count: int | None) -> str:
    return "?" if count is None else f"{count / (1 << 20):.1f} MiB"


@dataclass(frozen=True)
class EngineCosts:
    engine_bytes: int  # the serialized engine
    activation_bytes: int | None  # TensorRT's "Total Activation Memory" (None: the builder did not say)
    weights_bytes: int | None  # TensorRT's "Total Weights Memory"
    target: str  # "SM 8.9, tensorrt_rtx 1.7.1.116"
    #: the named profiles the engine was built with ('prefill', 'decode': a decoder's defaults); () for others
    profiles: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return asdict(self)

    def text(self) -> str:
        built = f" (profiles {', '.join(self.profiles)})" if self.profiles else ""
        return f"engine {mib(self.engine_bytes)}, activation memory {mib(self.activation_bytes)}{built}"

    def against(self, other: EngineCosts) -> str:
        """This engine's costs beside ``other``'s (the float model's): "engine 12.9 MiB (float 15.8 MiB, -18 %)"."""
        def part(name, mine, theirs):
            change = "" if not mine or not theirs else f", {100 * (mine - theirs) / theirs:+.0f} %"
            return f"{name} {mib(mine)} (float {mib(theirs)}{change})"

        return ", ".join((part("engine", self.engine_bytes, other.engine_bytes),
                          part("activation memory", self.activation_bytes, other.activation_bytes)))
