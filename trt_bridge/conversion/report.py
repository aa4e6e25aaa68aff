"""The conversion report: typed, JSON-serialisable, with a short human summary."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from trt_bridge.lower.layer_precisions import precision_line
from trt_bridge.verification.metrics import json_safe  # strict JSON: inf/nan as strings


@dataclass(frozen=True)
class RuleHits:
    rule: str
    nodes: list[str]


@dataclass(frozen=True)
class FloatLeftover:
    node: str
    op: str
    reason: str


@dataclass
class ConversionReport:
    input: str
    output: str
    source_opset: int
    output_opset: int
    rules: list[RuleHits] = field(default_factory=list)
    quantized: list[dict] = field(default_factory=list)  # QuantizedTensor as dicts
    left_in_float: list[FloatLeftover] = field(default_factory=list)
    calibration: dict | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    remaining_blockers: list[str] = field(default_factory=list)
    recentered: list[dict] = field(default_factory=list)  # recenter.Recentered as dicts
    smoothed: list[dict] = field(default_factory=list)  # smooth.Smoothed as dicts
    awq: list[dict] = field(default_factory=list)  # calibrate.awq.Scaled as dicts: INT4/FP4 weights' rounding
    split_outliers: list[dict] = field(default_factory=list)  # outliers.Split as dicts
    given_back: dict | None = None  # give_back.GiveBack as a dict (auto only): the layers left in float, and why
    bias_corrected: dict | None = None  # bias_correction.BiasCorrection as a dict (auto only): how many, and why
    #: runtime_choice.RuntimeChoice as a dict: the activations quantized on their per-inference range, and why
    runtime_ranges: dict | None = None
    placement: str = "tensorrt"
    scales: str = "model"  # where the source model's activation scales were taken from (model | data)
    sanitized: list[dict] = field(default_factory=list)  # prepare.Change as dicts: casts, Dropout, Identity, ...
    check: dict | None = None  # checks.CheckReport of the output model, as a dict (None: not run)
    #: the output's engine costs against the float model's (stages._costs; None: not measured)
    costs: dict | None = None
    formats: list[dict] = field(default_factory=list)  # place/formats.FormatChange: a format other than the lifted one
    imported_scales: dict | None = None  # --scales FILE / --qat: files, matching, applied, unused, warnings, notes
    accuracy: dict | None = None  # --accuracy-target: the ranking, every probe, the chosen tradeoff
    #: nodes lifted to the nearest form TensorRT builds rather than to what they computed (int16 activations
    #: narrowed to int8, block floating point calibrated as int8, per-axis activation scales made per tensor,
    #: non-finite source scales left in float): lift.Approximation as dicts
    approximated: list[dict] = field(default_factory=list)
    precision: dict | None = None  # layers by the precision TensorRT runs them in; --high-precision's fp32 keeps
    #: --activations dynamic: the MatMuls now trt-bridge's DynamicInt8Gemm plugin (name, version, granularity, layers)
    plugin: dict | None = None
    #: --activations dynamic for 10.0+: the plugin or TensorRT's dynamic FP4, both scores (dynamic_form.DynamicForm)
    dynamic_form: dict | None = None
    #: If branches and Loop/Scan bodies quantized as graphs of their own (convert.bodies): how many, the nodes of
    #: other ops whose bodies stay float, and the body sites left float with their reasons (None: no control flow)
    control_flow: dict | None = None
    #: lower/attention_fusion.FusionResult as a dict: the Softmax nodes whose attention became one Attention-23
    #: node (float16/bfloat16), the others with the reason they stay decomposed (None: no attention)
    attention: dict | None = None
    #: the layers as each builder runs them (the check's, checks.targets.builder_views: datacenter TensorRT, and
    #: TensorRT-RTX unless datacenter TensorRT is the one here; None: not checked, or the layers not read)
    builders: list[dict] | None = None

    def __bool__(self) -> bool:
        return not self.remaining_blockers

    def to_dict(self) -> dict:
        return asdict(self)

    def cost_line(self) -> str:
        """The engine's costs against the float model's and what adds to them (the summary's costs line)."""
        runtime = len((self.runtime_ranges or {}).get("tensors") or ())
        given = len((self.given_back or {}).get("layers") or ()) + sum(  # and those --trt-module gave back
            1 for c in self.formats if c["kind"] == "layer" and c["format"] == "float")
        float_note = f" (float: {self.costs['float_missing']})" if self.costs.get("float_missing") else ""
        return (f"costs ({self.costs['target']}): {self.costs['summary']}{float_note}; {runtime} activation(s) "
                f"ranged in each inference, {given} layer(s) given back to float")

    def to_json(self) -> str:

        return json.dumps(json_safe(self.to_dict()), indent=2, sort_keys=False, allow_nan=False)

    def summary(self) -> str:
        acts = [q for q in self.quantized if q["kind"] in ("activation", "runtime")]
        weights = [q for q in self.quantized if q["kind"] == "weight"]
        lines = [f"converted {self.input} -> {self.output} (opset {self.source_opset} -> {self.output_opset})"]
        for hit in self.rules:
            lines.append(f"  rule {hit.rule}: {len(hit.nodes)} node(s)")
        sources: dict[str, int] = {}
        for q in self.quantized:
            sources[q["source"]] = sources.get(q["source"], 0) + 1
        blocked = sum(1 for w in weights if w.get("block_size"))
        per_channel = sum(1 for w in weights if w["axis"] is not None) - blocked
        in_formats: dict[str, int] = {}
        for q in self.quantized:
            in_formats[q.get("format", "int8").upper()] = in_formats.get(q.get("format", "int8").upper(), 0) + 1
        lines.append(f"  quantized: {len(acts)} activation(s), {len(weights)} weight(s) ({per_channel} per-channel"
                     + (f", {blocked} in blocks" if blocked else "") + "; "
                     + ", ".join(f"{k} {v}" for k, v in sorted(in_formats.items())) + "); scale sources: "
                     + (", ".join(f"{k} {v}" for k, v in sorted(sources.items())) or "none"))
        lines.append(f"  placement {self.placement}; source activation scales from the {self.scales}")
        if self.plugin:
            lines.append(f"  plugin {self.plugin['name']}: {len(self.plugin['layers'])} MatMul(s) with activation "
                         f"scales computed per inference ({self.plugin['granularity']} granularity); engines need "
                         "the plugin registered where they run")
        if self.calibration:
            c = self.calibration
            method = c.get("auto") or c["method"]
            lines.append(f"  calibration: {c['feeds']} feed(s), method {method}, {c['seconds']:.2f} s")
            if c.get("nonfinite_values"):  # masked or padded rows: ranges from the finite values
                lines.append(f"  non-finite values left out of the ranges of {len(c['nonfinite_values'])} tensor(s) "
                             f"({sum(c['nonfinite_values'].values())} in all); kept in float for their ±Inf: "
                             f"{len(c.get('infinite_left_in_float') or [])}")
        if self.smoothed:
            by_mul = sum(1 for x in self.smoothed if x["through"] == "Mul")
            lines.append(f"  smoothed {len(self.smoothed)} MatMul input(s) into their weights "
                         f"(alpha {self.smoothed[0]['alpha']}; {len(self.smoothed) - by_mul} folded into "
                         f"LayerNormalization, {by_mul} through a Mul)")
        if self.awq:
            alphas = ", ".join(f"{a:.1f}" for a in sorted({x["alpha"] for x in self.awq}))
            layers, fmt = sum(len(x['layers']) for x in self.awq), self.awq[0].get('format', 'INT4')
            lines.append(f"  AWQ: the {fmt} weights of {layers} layer(s) reading "
                         f"{len(self.awq)} input(s) rounded '{self.awq[0]['variant']}' (held-out SNR by variant: "
                         f"{self.awq[0]['held_out_db'] or 'none held out'}; alpha {alphas}; "
                         f"{sum(1 for x in self.awq if x['through'] == 'Mul')} through a Mul)")
        if self.runtime_ranges and self.runtime_ranges["tensors"]:
            r = self.runtime_ranges
            lines.append(f"  runtime ranges: {len(r['tensors'])} activation(s) quantized on their range in each "
                         f"inference ({r['reason']})")
        if self.given_back and self.given_back["layers"]:
            g = self.given_back
            worst = ", ".join(f"{n} ({g['isolated_db'][n]:.1f} dB)" for n in g["layers"])
            what = " the source quantized with its own scales" if g.get("own_scales") else ""
            lines.append(f"  gave {len(g['layers'])} layer(s){what} back to float, their isolated INT8 SNR far below "
                         f"the median layer's {g['median_db']:.1f} dB: {worst}; cost: {g.get('weight_elements', 0):,} "
                         "weight(s) kept in the high precision instead of int8")
        elif self.given_back and self.given_back.get("own_scales"):  # a quantized source: why its layers stay INT8
            lines.append(f"  gave no layer back to float: {self.given_back['reason']}")
        if self.bias_corrected and self.bias_corrected["layers"]:
            b = self.bias_corrected
            lines.append(f"  corrected the biases of {b['channels']} output channel(s) of {b['layers']} convolution(s) "
                         f"for the mean shift of their INT8 activations (held-out SNR {b['scores']['before']:.1f} → "
                         f"{b['scores']['after']:.1f} dB)")
        if self.split_outliers:
            channels = sum(len(x["channels"]) for x in self.split_outliers)
            lines.append(f"  split {channels} massive channel(s) of {len(self.split_outliers)} MatMul input(s) into "
                         "float side paths, so int8 covers the rest")
        if self.recentered:
            lines.append(f"  re-centred {len(self.recentered)} one-sided activation(s) "
                         "so symmetric int8 keeps all 8 bits")
        if self.imported_scales:
            imp = self.imported_scales
            lines.append(f"  imported scales: {imp['applied']} tensor(s) from "
                         + ", ".join([*imp["files"], *([imp["qat"]] if imp["qat"] else [])])
                         + (f"; {len(imp['unused'])} entr(ies) unused" if imp["unused"] else "")
                         + (f"; {len(imp['warnings'])} disagree with the calibration data" if imp["warnings"] else ""))
            lines += [f"    brought to the nearest form TensorRT builds: {note}" for note in imp.get("notes") or []]
        if self.formats:
            kinds: dict[tuple, int] = {}
            for c in self.formats:
                key = (c["kind"], c["was"], c["format"], c["reason"])
                kinds[key] = kinds.get(key, 0) + 1
            lines.append("  formats: " + "; ".join(f"{n} {kind}(s) {was} → {new} ({why})"
                                                   for (kind, was, new, why), n in sorted(kinds.items())))
        if self.approximated:
            first = self.approximated[0]
            lines.append(f"  approximated: {len(self.approximated)} node(s) with no TensorRT equivalent, converted to "
                         f"the nearest form it builds (e.g. '{first['node']}': {first['what']})")
        if self.sanitized:
            kinds: dict[str, int] = {}
            for change in self.sanitized:
                kinds[change["pass_name"]] = kinds.get(change["pass_name"], 0) + 1
            lines.append("  sanitized: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
        if self.left_in_float:
            lines.append(f"  left in float: {len(self.left_in_float)} edge(s) (see the JSON report)")
        if self.control_flow:
            flow = self.control_flow
            lines.append(f"  control flow: {flow['bodies']} If branch(es) and Loop/Scan body(ies) placed"
                         + (f"; the bodies of {len(flow['float_bodies'])} other node(s) left float (e.g. "
                            f"'{flow['float_bodies'][0]}')" if flow["float_bodies"] else ""))
        if self.attention is not None:
            fused, declined = self.attention["fused"], self.attention["declined"]
            reasons = sorted(set(declined.values()))
            lines.append(f"  attention: {len(fused)} block(s) fused into Attention-23 (TensorRT's dedicated kernels)"
                         + (f"; {len(declined)} kept decomposed ({reasons[0]}"
                            + (f"; and {len(reasons) - 1} other reason(s)" if len(reasons) > 1 else "") + ")"
                            if declined else ""))
        if self.precision is not None:
            lines.append("  " + precision_line(self.precision))
            kept = self.precision.get("kept_in_float32")
            if kept:
                lines.append(f"  kept in float32 under --high-precision {self.precision['high_precision']}: "
                             f"{len(kept)} node(s) (see the JSON report for why)")
        for view in [v for v in self.builders or () if v["quantized_layers"]]:
            lines.append(f"  {view['line']}")
            if view["alternatives"]:  # TensorRT-RTX runs W8A8 INT8 in float or weight-only: a warning, not a refusal
                lines.append(f"  warning: {view['alternatives']}")
        if self.dynamic_form is not None:
            lines.append(f"  dynamic activations: {self.dynamic_form['chosen']} ({self.dynamic_form['reason']})")
        if self.accuracy is not None:
            lines.append(f"  {self.accuracy['summary']}")
            for probe in self.accuracy["probes"]:
                kept = ", ".join(probe["excluded"]) or "none"
                by = f" [{probe['ranking']} ranking]" if probe.get("ranking") else ""
                where = "FP8" if probe.get("tier") else "higher precision"
                lines.append(f"    probe{by}: {probe['snr_db']:.2f} dB (cosine {probe['cosine']:.6f}) with "
                             f"{len(probe['excluded'])} layer(s) in {where} ({kept})")
        if self.check is not None:
            lines.append(f"  check: {self.check['headline']}")
            for finding in self.check["findings"]:
                where = f"{finding['op']} '{finding['node']}'" if finding["node"] else "model"
                lines.append(f"    [{finding['rule']}] {where}: {finding['why']}")
                if finding["severity"] == "blocker" and not finding["fixable"] and finding["fix"]:
                    lines.append(f"      what to do: {finding['fix']}")  # convert could not: the user can
        if self.costs is not None:
            lines.append(f"  {self.cost_line()}")
            if self.costs.get("larger_than_float"):
                lines.append(f"  warning: {self.costs['larger_than_float']}")
        lines.append(f"  total {sum(self.seconds.values()):.2f} s")
        return "\n".join(lines)
