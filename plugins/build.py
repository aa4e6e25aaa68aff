"""Compile the dynamic INT8 GEMM kernels ahead of time with NVRTC (no GPU needed)::

    python -m trt_bridge.plugins.build --out DIR [--arch 89 90 ...] [--target cubin|ptx]

writes ``DIR/dynamic_gemm.sm_XX.cubin`` (or ``.ptx``) for each architecture (default: all of
``kernels.ARCHITECTURES``), each file atomically, and prints one line per architecture: the file, its size and,
for cubins, the registers each kernel uses. Exit status 1, with one line on stderr, when a compilation fails.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from trt_bridge.plugins.kernels import ARCHITECTURES, TARGETS, compile_with_log

from trt_bridge.errors import TrtBridgeError
from trt_bridge.ir.files import write_bytes_atomic

REGISTERS = re.compile(r"Function properties for (\w+).*?Used (\d+) registers", re.S)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m trt_bridge.plugins.build",
                                     description="Compile the dynamic INT8 GEMM plugin's CUDA kernels with NVRTC.")
    parser.add_argument("--out", required=True, type=Path, help="the folder to write the compiled kernels into")
    parser.add_argument("--arch", nargs="+", type=int, default=list(ARCHITECTURES), metavar="SM",
                        help="compute capabilities as 89 for 8.9 (default: %(default)s)")
    parser.add_argument("--target", choices=TARGETS, default="cubin", help="cubin (SASS) or ptx (default: cubin)")
    return parser.parse_args(argv)


def registers(log: str) -> str:
    """'kernel=N ...' from ptxas's verbose log."""
    found = REGISTERS.findall(log)
    return " ".join(f"{name.removeprefix('dq_')}={count}" for name, count in sorted(found))


def build(out: Path, archs: list[int], target: str) -> list[str]:
    """Compile and write every architecture; one summary line each."""
    lines = []
    for arch in archs:
        image, log = compile_with_log(arch, target, verbose=target == "cubin")
        image = image.rstrip(b"\x00") if target == "ptx" else image  # NVRTC counts the PTX text's terminator
        path = write_bytes_atomic(out / f"dynamic_gemm.sm_{arch}.{target}", image, f"sm_{arch} {target}")
        detail = f", registers: {registers(log)}" if target == "cubin" and registers(log) else ""
        lines.append(f"sm_{arch}: {path} ({len(image)} bytes{detail})")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        for line in build(args.out, args.arch, args.target):
            print(line, flush=True)
    except TrtBridgeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
