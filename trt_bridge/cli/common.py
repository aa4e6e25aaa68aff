"""What every subcommand shares: exit statuses, the output flags, the output-path check and ``--json``."""

from __future__ import annotations

import argparse
from pathlib import Path

from trt_bridge.choices import BOUNDS, check_bound
from trt_bridge.errors import TrtBridgeError
from trt_bridge.ir.files import (
    check_regular_input,
    check_writable,
    external_data_files,
    inside_folder,
    same_file,
    write_text_atomic,
)
from trt_bridge.tensorrt.costs import COST_TARGET
from trt_bridge.tensorrt.profiles import Profile, parse_shapes

EXIT_OK, EXIT_FAIL, EXIT_ERROR = 0, 1, 2


def add_output_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("output")
    group.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    group.add_argument("-q", "--quiet", action="store_true", help="only errors; no progress bars")
    group.add_argument("--json", nargs="?", const="-", metavar="FILE",
                       help="write the report as JSON to FILE, or to stdout without FILE")


def add_plugins_flag(parser) -> None:
    """``--plugins PATH ...``: TensorRT plugin libraries or Python files registering plugin creators."""
    parser.add_argument("--plugins", nargs="+", action="extend", default=[], metavar="PATH",
                        help="TensorRT plugins to register first: plugin libraries (.so) or Python files that "
                             "register plugin creators (.py); trt-bridge's own plugins need no flag")


SHAPES_HELP = """\
shapes (trtexec/Polygraphy syntax): NAME:DIMS, e.g. x:1x3x224x224 or x:[1,3,224,224]; several inputs as
separate arguments or comma-separated. --shapes fixes shapes (min = opt = max). A range is
--min-shapes/--opt-shapes/--max-shapes; repeating the trio adds optimization profiles (the i-th
--min-shapes, --opt-shapes and --max-shapes form profile i); --shapes entries then join every profile for
the inputs it does not name. Without any, a decoder (input_ids or inputs_embeds, past_key_values.N.key/value,
attention_mask, position_ids) gets two profiles, prefill (sequence 1..128, opt 16, past 0) and decode
(sequence 1, past 1..512, opt 128), and any other model 1 for each dynamic dimension; with them, every
dynamic input must be named."""


def add_shapes_flags(parser, what: str) -> None:
    """The ``shapes`` group: ``--shapes`` and the ``--min/--opt/--max-shapes`` trios of ``what`` (the engine ``build``
    writes, the one ``check`` builds for its costs); :func:`profiles_from_args` reads them."""
    shapes = parser.add_argument_group("shapes", f"input shapes of {what}: see 'shapes' above")
    shapes.add_argument("--shapes", nargs="+", action="append", metavar="NAME:DIMS",
                        help="fixed input shapes (min = opt = max)")
    for which in ("min", "opt", "max"):
        shapes.add_argument(f"--{which}-shapes", nargs="+", action="append", metavar="NAME:DIMS",
                            help=f"{which} shapes of a profile (repeat the trio for several profiles)")


def profiles_from_args(shapes, mins, opts, maxs) -> tuple[Profile, ...]:
    """The profiles of ``--shapes`` and the ``--min/--opt/--max-shapes`` trios (each a list of argument lists)."""
    fixed = parse_shapes([s for group in shapes or [] for s in group])
    counts = {"--min-shapes": len(mins or []), "--opt-shapes": len(opts or []), "--max-shapes": len(maxs or [])}
    if len(set(counts.values())) > 1:
        given = ", ".join(f"{flag} {n} time(s)" for flag, n in counts.items())
        raise TrtBridgeError(f"{given}: each profile needs all three (the i-th of each form profile i).")
    profiles = []
    for number, trio in enumerate(zip(mins or [], opts or [], maxs or []), 1):
        mn, opt, mx = (parse_shapes(group) for group in trio)
        if not set(mn) == set(opt) == set(mx):
            raise TrtBridgeError(f"profile {number}: --min-shapes names {sorted(mn)}, --opt-shapes {sorted(opt)}, "
                                 f"--max-shapes {sorted(mx)}; name the same inputs in all three.")
        both = sorted(set(mn) & set(fixed))
        if both:
            raise TrtBridgeError(f"profile {number}: {', '.join(both)} given by --shapes and by --min/--opt/"
                                 "--max-shapes; give each input once.")
        ranges = {name: (mn[name], opt[name], mx[name]) for name in mn}
        profiles.append(Profile({**Profile.fixed(fixed).shapes, **ranges}))
    if not profiles and fixed:
        profiles.append(Profile.fixed(fixed))
    return tuple(profiles)


def add_costs_flag(parser, what: str) -> None:
    """``--costs CC|off``: build ahead of time with TensorRT-RTX for compute capability CC and show ``what``'s
    engine size and activation memory (:func:`costs_target` reads it)."""
    parser.add_argument("--costs", default=COST_TARGET, metavar="CC|off",
                        help=f"build {what} ahead of time with TensorRT-RTX for this compute capability and report "
                             f"the engine's size and activation memory (default: {COST_TARGET}; off: skip the build)")


def costs_target(args: argparse.Namespace) -> str | None:
    """The compute capability ``--costs`` names, None for ``off``."""
    return None if args.costs == "off" else args.costs


#: the arguments (of any subcommand) that name files a command writes
OUTPUT_ARGS = ("output", "report", "json", "html", "markdown", "save_outputs", "save_inputs", "timing_cache")


def absolute_paths(args: argparse.Namespace, cwd: str | None = None, inputs: bool = False) -> None:
    """Make every output path absolute (in place), before any user code runs: a data loader or plugin file that
    changes the working folder cannot redirect an output into another folder. (Inputs keep the names the user
    gave, which messages and summaries repeat, and so does a default output beside its input:
    :func:`trt_bridge.user_code.user_code` puts the working folder back after each call into user code.)
    ``inputs``: the inputs too, and ``cwd`` the folder to join them to (the Python API, which reads the working
    folder once at entry and never uses a relative path after)."""
    import os

    if cwd is None:
        try:
            cwd = os.getcwd()
        except OSError:  # the working folder was removed: relative paths name nothing anyway (their errors say so)
            return

    def absolute(value, words):  # joined to the working folder, not normalized: 'link/..' keeps meaning what it meant
        if isinstance(value, (list, tuple)):
            return type(value)(absolute(v, words) for v in value)
        if isinstance(value, Path):
            return Path(cwd, value)
        if isinstance(value, str) and value not in ("", "-", *words):
            return os.path.join(cwd, value)
        return value

    for name in OUTPUT_ARGS + (INPUT_ARGS if inputs else ()):
        if getattr(args, name, None) is not None:  # --scales model|data name no file
            setattr(args, name, absolute(getattr(args, name), ("model", "data") if name == "scales" else ()))


#: the arguments that name files a command reads (never a device or a pipe: see :func:`check_input_files`)
INPUT_ARGS = ("model", "reference", "candidate", "paths", "data", "calib_data", "eval_data", "qat", "scales",
              "load_inputs", "load_outputs", "plugins", "manifest", "engine", "timing_cache")


def check_input_files(args: argparse.Namespace) -> None:
    """Refuse an input that is a named pipe, a socket or a device before anything opens it: reading a pipe blocks
    until a writer comes (maybe never), reading /dev/zero never ends. (Outputs may be devices: --json /dev/stdout.)"""
    for name in INPUT_ARGS:
        value = getattr(args, name, None)
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if item is None or str(item) in ("-", "model", "data"):
                continue
            text = str(item)
            path = text.split(":", 1)[0] if ".py:" in text else text  # loader.py:function
            positional = name in ("model", "paths", "manifest", "reference", "candidate")
            check_regular_input(path, "input" if positional else f"--{name.replace('_', '-')} file")


def check_output_path(path, protected, what: str) -> None:
    """Fail before any work if the file ``path`` (a report, an export, a model) would overwrite one of
    ``protected`` (every file the command reads: models, their external data, feeds, scale files, loader
    scripts, and its other outputs), or cannot be written."""
    if path is None or str(path) == "-":
        return
    protected = [p for p in protected if p is not None and str(p) != "-"]
    for model in list(protected):  # a model's external data is as much an input as the model
        if str(model).endswith(".onnx") and Path(model).is_file():
            protected += external_data_files(model)  # refuses links, pipes and devices before any work
    for other in protected:
        if same_file(path, other):
            raise TrtBridgeError(f"the {what} {path} is also {other}, which this command reads or writes; it would "
                                 f"be overwritten. Choose another file name for the {what}.")
        if inside_folder(path, other):
            raise TrtBridgeError(f"the {what} {path} lies inside {other}, a folder this command reads (feeds); "
                                 f"writing there would replace or add one of its files. Write the {what} elsewhere.")
    check_writable(path, what)


def check_bounds(args: argparse.Namespace) -> None:
    """Every numeric option ``args`` holds within its bound (:data:`trt_bridge.choices.BOUNDS`), before any work:
    the command line's entry and the Python API's call this."""
    for dest in BOUNDS:
        if dest in vars(args):
            check_bound(dest, getattr(args, dest))


def check_seed(seed: int) -> None:
    """``--seed``: numpy's generators take 0 up to 2**128 - 1."""
    check_bound("seed", seed)


def emit_report(json_target: str | None, json_text: str, text: str | None) -> None:
    """What ``--json`` asks for: ``-`` prints the JSON report instead of ``text``; a FILE gets it written
    (atomically) and ``text`` is printed too. ``text`` None prints nothing (``--quiet``)."""
    if json_target == "-":
        print(json_text)
        return
    if json_target:
        write_text_atomic(json_target, json_text + "\n")
    if text is not None:
        print(text)
