"""Argument groups shared between subcommands."""

from __future__ import annotations

import argparse


def add_output_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("output")
    group.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    group.add_argument("-q", "--quiet", action="store_true", help="only errors; no progress bars")
    group.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
