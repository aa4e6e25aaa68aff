"""The files a conversion reads besides its model, and the checks that its output overwrites none of them."""

from __future__ import annotations

from pathlib import Path

from trt_bridge.calibrate.feed_sources import source_path
from trt_bridge.conversion.options import ConvertOptions
from trt_bridge.errors import TrtBridgeError
from trt_bridge.ir.files import check_writable, inside_folder, same_file


def input_files(options: ConvertOptions) -> list[Path]:
    """Every file a conversion reads besides the model itself: feeds, a loader script, scale files, a QAT file."""
    return [source_path(spec) for spec in (options.calibration.data, *options.scales.files, options.scales.qat)
            if spec is not None]


def check_paths(model_path: Path, output_path: Path, options: ConvertOptions) -> None:
    """The output must be writable, and neither the model nor (with its ``.data`` file) any file it reads."""
    check_writable(output_path, "output model")  # first: a link loop or a dangling link before it is resolved
    if output_path.resolve() == model_path.resolve():
        raise TrtBridgeError(f"the output path {output_path} is the input model; choose another with -o.")
    for target in (output_path, output_path.with_name(output_path.name + ".data")):
        for source in input_files(options):
            if same_file(target, source) or inside_folder(target, source):
                raise TrtBridgeError(f"the output model {output_path} would overwrite {source}, which this "
                                     "conversion reads; choose another output path with -o.")
