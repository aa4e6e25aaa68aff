"""``trt-bridge scales``: export a converted model's scales (TensorRT calibration cache, JSON, fixed point)."""

from __future__ import annotations

import argparse

from trt_bridge.cli.common import EXIT_OK, check_output_path
from trt_bridge.cli.scales_args import add_parser  # noqa: F401 - the command's parser, as trt_bridge.api builds it
from trt_bridge.errors import TrtBridgeError
from trt_bridge.ir.model import load_model
from trt_bridge.lower.runtime_ranges import grid_tensors
from trt_bridge.scales.fixed_point import requantization_table, write_fixed_point
from trt_bridge.scales.json_table import write_json
from trt_bridge.scales.model_scales import scales_of_model, uncentered
from trt_bridge.scales.table import ScaleTable
from trt_bridge.scales.trt_cache import write_trt_cache


def run(args: argparse.Namespace) -> int:
    check_output_path(args.output, [args.model], "output")
    model = load_model(args.model)
    runtime = grid_tensors(model)  # activations convert gave runtime ranges: no static scale to export
    none_static = (f"; the {len(runtime)} tensor(s) it quantizes with runtime ranges have no static scale (each "
                   "inference computes theirs): convert with --runtime-ranges off for scales to export") \
        if runtime else "; is it a converted model?"
    if args.format == "fixed-point":
        on_grid = _grid_readers(model, runtime)
        rows = [row for row in requantization_table(model) if row.node not in on_grid and row.output not in runtime]
        if not rows:
            raise TrtBridgeError(f"{args.model}: no quantized layer whose output is requantized (a weighted op with "
                                 f"Q/DQ inputs and a QuantizeLinear after it){none_static}")
        write_fixed_point(rows, args.output)
        what = f"{len(rows)} requantization(s)"
    else:
        table = scales_of_model(model, source=f"model:{args.model.name}")
        table = ScaleTable({k: e for k, e in table.entries.items() if k not in runtime})
        if not len(table.activations()) and runtime:
            raise TrtBridgeError(f"{args.model}: no activation scale to export{none_static}.")
        if not len(table):
            raise TrtBridgeError(f"{args.model}: no QuantizeLinear/DequantizeLinear scales{none_static}")
        table, _ = uncentered(table, model)  # re-centred tensors: the original tensor's range, as readers expect
        if args.format == "trt-cache":
            write_trt_cache(table, args.output)
            what = f"{len(table.activations())} activation scale(s)"
        else:
            table, left_out = _portable(table, model)
            write_json(table, args.output)
            what = f"{len(table.activations())} activation and {len(table.weights())} weight scale(s)"
            if left_out:
                what += (f"; {len(left_out)} scale(s) of tensors convert re-centred or smoothed left out, since they "
                         f"describe the converted model's own transformed tensors ({', '.join(left_out[:3])}"
                         f"{', ...' if len(left_out) > 3 else ''})")
    if runtime:
        what += f"; {len(runtime)} tensor(s) quantized with runtime ranges have no static scale and are left out"
    if not args.quiet:
        print(f"wrote {what} of {args.model} to {args.output} ({args.format})")
    return EXIT_OK


def _grid_readers(model, grids: set[str]) -> set[str]:
    """The layers that read a runtime-range grid (through its Q/DQ): their input scale is the grid's 1, not a range."""
    producers = {o: n for n in model.graph.node for o in n.output}
    found = set()
    for node in model.graph.node:
        dq = producers.get(node.input[0]) if node.input else None
        q = producers.get(dq.input[0]) if dq is not None and dq.op_type == "DequantizeLinear" else None
        if q is not None and q.op_type == "QuantizeLinear" and q.input[0] in grids:
            found.add(node.name)
    return found


def _portable(table, model):
    """The entries `convert --scales` can take back: activations convert re-centred ('<x>_centered',
    '<x>_padded') or smoothed (a LayerNormalization output whose gamma convert divided) hold the range of
    the transformed tensor, not of the network's own, and smoothed weights likewise."""
    producers = {o: n for n in model.graph.node for o in n.output}
    keep, left_out = {}, []
    for name, entry in table.entries.items():
        node = producers.get(name)
        smoothed = node is not None and node.op_type == "LayerNormalization" and any(
            i.endswith("_smoothed") for i in node.input[1:])
        if name.endswith(("_centered", "_padded", "_smoothed")) or smoothed:
            left_out.append(name)
        else:
            keep[name] = entry
    return ScaleTable(keep), left_out
