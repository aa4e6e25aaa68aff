"""The ``trt-bridge`` command line. Subcommands live in one module each."""

from __future__ import annotations

import argparse
import logging
import sys

from trt_bridge import __version__
from trt_bridge.errors import TrtBridgeError

EXIT_OK, EXIT_FAIL, EXIT_ERROR = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    from trt_bridge.cli import bench, build, check, convert, pipeline, scales, verify

    parser = argparse.ArgumentParser(
        prog="trt-bridge",
        description="Get quantized ONNX models onto NVIDIA TensorRT as real INT8 engines.",
    )
    parser.add_argument("--version", action="version", version=f"trt-bridge {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in (convert, check, verify, build, bench, pipeline, scales):
        module.add_parser(sub)
    return parser


def _configure_logging(verbose: int, quiet: bool) -> None:
    level = logging.ERROR if quiet else (logging.DEBUG if verbose > 1 else
                                          logging.INFO if verbose == 1 else logging.WARNING)
    logging.basicConfig(level=level, format="[%(levelname)s] %(message)s", stream=sys.stderr)
    logging.getLogger("trt_bridge").setLevel(level)


def _quiet_graphsurgeon(verbose: int) -> None:
    """onnx-graphsurgeon prints its warnings (a type numpy lacks, a missing colour module) on stdout, where
    they would corrupt `--json` output: keep them to errors unless -vv is given."""
    from onnx_graphsurgeon.logger import G_LOGGER

    G_LOGGER.colors = False
    if verbose < 2:
        G_LOGGER.severity = G_LOGGER.ERROR


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _configure_logging(getattr(args, "verbose", 0), getattr(args, "quiet", False))
    _quiet_graphsurgeon(getattr(args, "verbose", 0))
    try:
        return args.run(args)
    except TrtBridgeError as exc:
        print(f"trt-bridge {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
