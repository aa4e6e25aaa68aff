"""The self-contained HTML page of ``verify --html``: the per-output table and, with ``--per-layer``,
the SNR of every aligned tensor along the graph (matplotlib, inlined as SVG: no files, no scripts,
nothing fetched when the page opens)."""

from __future__ import annotations

import html
import io
import math

from trt_bridge.errors import MissingDependencyError
from trt_bridge.verification.layers import EXACT_DB
from trt_bridge.verification.metrics import snr_text

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 4px 10px; text-align: right; }
th { background: #f3f3f3; } td.name { text-align: left; font-family: monospace; }
.pass { color: #17692d; font-weight: bold; } .fail { color: #b00020; font-weight: bold; }
code { background: #f3f3f3; padding: 2px 4px; }
"""


def _plotted(values: list) -> list[float]:
    """SNRs the plot can draw: exact (None, inf) at the top of the scale, -inf and NaN below the lowest."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    floor = (min(finite) if finite else 0.0) - 10.0
    return [EXACT_DB if v is None or v == math.inf else (v if math.isfinite(v) else floor) for v in values]


def _figure():
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise MissingDependencyError("the HTML report draws its plot with matplotlib: pip install matplotlib "
                                     "(or 'trt-bridge[html]').") from exc
    return Figure(figsize=(10, 4.2))  # no pyplot: no global figure manager, no backend switch


def _svg(fig) -> str:
    import matplotlib

    fig.tight_layout()
    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": "trt-bridge"}):  # stable element ids: same report, same page
        fig.savefig(buffer, format="svg", metadata={"Date": None})
    svg = buffer.getvalue()
    return svg[svg.index("<svg"):]


def _generation_svg(gen) -> str:
    """The logits SNR and the share of prompts whose next token agrees, per step of the generation loop."""
    fig = _figure()
    ax = fig.subplots()
    steps = list(range(gen.steps))
    ax.plot(steps, _plotted(list(gen.step_snr_db)), "o-", color="#4a78b5", markersize=3, label="logits SNR")
    ax.set_xlabel("generation step (0: prefill)")
    ax.set_ylabel("logits SNR vs reference (dB)")
    ax.grid(True, alpha=0.3)
    share = ax.twinx()
    share.step(steps, [100 * a for a in gen.step_agreement], where="mid", color="#e07b00",
               label="next-token agreement")
    share.set_ylim(-5, 105)
    share.set_ylabel("next-token agreement, teacher-forced (%)")
    ax.set_title("Generation loop, per step")
    fig.legend(loc="lower left", fontsize=8)
    return _svg(fig)


def _generation_html(gen) -> list[str]:
    verdict = '<span class="pass">PASS</span>' if gen.passed else \
        f'<span class="fail">FAIL</span> {html.escape("; ".join(gen.failures))}'
    rows = [("prompts x steps", f"{gen.prompts} x {gen.steps} ({html.escape(gen.source)})"),
            ("next-token agreement (teacher-forced)", f"{100 * gen.token_agreement:.1f}% ({gen.agreed}/"
                                                      f"{gen.compared})"),
            ("free-running prefix match (mean, min)", f"{sum(gen.prefix_match) / len(gen.prefix_match):.1f}, "
                                                      f"{min(gen.prefix_match)} of {gen.steps}"),
            ("logits SNR over all steps (dB)", snr_text(gen.logits_snr_db)),
            ("lowest logits SNR of a step (dB)", snr_text(gen.min_step_snr_db)), ("gate", verdict)]
    return ["<h2>Generation loop (decoder)</h2><table id=generation>",
            *(f"<tr><td class=name>{name}</td><td>{value}</td></tr>" for name, value in rows), "</table>",
            f"<figure id=generation-plot>{_generation_svg(gen)}</figure>"]


def _plot_svg(report) -> str:
    fig = _figure()
    ax = fig.subplots()
    loc = report.per_layer
    if loc is not None and loc.tensors:
        xs = [t.index for t in loc.tensors]
        ys = _plotted([t.snr_db for t in loc.tensors])
        ax.plot(xs, ys, "-", color="#4a78b5", linewidth=1.2, label="every aligned tensor")
        layers = [layer for layer in loc.layers if layer.snr_out_db is not None]
        marks = _plotted([layer.snr_out_db for layer in layers])
        ax.plot([layer.output_index for layer in layers], marks, "o", color="#e07b00", markersize=4,
                label="outputs of quantized layers")
        for layer, y in list(zip(layers, marks))[:3]:
            ax.annotate(f"{layer.node}\nadds {snr_text(layer.added_db)} dB", (layer.output_index, y),
                        textcoords="offset points", xytext=(6, -18), fontsize=8, color="#b00020")
        ax.set_xlabel("position along the graph (node index)")
        ax.set_ylabel("SNR vs reference (dB)")
        ax.set_ylim(bottom=min(min(ys) - 5, 0), top=min(max(ys) + 5, EXACT_DB))
        ax.set_title("SNR per layer along the graph")
        ax.legend(loc="lower left", fontsize=8)
    else:
        names = [f"{m.runner}:{m.output}" for m in report.outputs]
        values = _plotted([m.snr_db for m in report.outputs])
        ax.bar(range(len(values)), values, color=["#17692d" if m.passed else "#b00020" for m in report.outputs])
        ax.set_xticks(range(len(values)), names, rotation=20, ha="right", fontsize=8)
        ax.set_ylabel("SNR vs reference (dB)")
        ax.set_title("SNR per output")
    ax.grid(True, alpha=0.3)
    return _svg(fig)


def render(report) -> str:
    """The HTML page for a :class:`trt_bridge.verification.VerifyReport`."""
    esc = html.escape
    rows = []
    for m in report.outputs:
        top = "" if m.top1 is None else f"{100 * m.top1:.1f}% / {100 * m.topk:.1f}% (k={m.k})"
        verdict = '<span class="pass">PASS</span>' if m.passed else \
            f'<span class="fail">FAIL</span> {esc("; ".join(m.failures))}'
        rows.append(f"<tr><td class=name>{esc(m.runner)}</td><td class=name>{esc(m.output)}</td>"
                    f"<td>{snr_text(m.snr_db)}</td><td>{m.cosine:.6f}</td><td>{m.max_abs:.4g}</td>"
                    f"<td>{m.mean_abs:.4g}</td><td>{m.rel_error:.4g}</td><td>{top}</td><td>{verdict}</td></tr>")
    parts = [
        "<!DOCTYPE html>", "<html lang=en><head><meta charset=utf-8>",
        f"<title>trt-bridge verify: {esc(report.candidate)}</title><style>{STYLE}</style></head><body>",
        f"<h1>trt-bridge verify: {'<span class=pass>PASS</span>' if report.passed else '<span class=fail>FAIL</span>'}"
        "</h1>",
        f"<p>candidate <code>{esc(report.candidate)}</code> against reference <code>{esc(report.reference)}</code>"
        + (f" and engine <code>{esc(report.engine)}</code>" if report.engine else "")
        + f", {report.feeds} feed(s).</p>",
        "<h2>Outputs</h2><table id=outputs><tr><th>runner</th><th>output</th><th>SNR (dB)</th><th>cosine</th>"
        "<th>max |err|</th><th>mean |err|</th><th>relative</th><th>top-1 / top-k</th><th>gates</th></tr>",
        *rows, "</table>",
        "<h2>SNR along the graph</h2>" if report.per_layer is not None else "<h2>SNR per output</h2>",
        f'<figure id=plot>{_plot_svg(report)}</figure>',
    ]
    if report.generation is not None:
        parts += _generation_html(report.generation)
    loc = report.per_layer
    if loc is not None:
        parts.append("<h2>Quantized layers by the error they make (on their own, then added)</h2><table id=layers>"
                     "<tr><th>node</th><th>op</th><th>error made on its own (SNR, dB)</th><th>SNR in (dB)</th>"
                     "<th>SNR out (dB)</th><th>error added (SNR, dB)</th></tr>")
        for layer in loc.layers[:25]:
            parts.append(f"<tr><td class=name>{esc(layer.node)}</td><td class=name>{esc(layer.op)}</td>"
                         f"<td>{'none' if layer.isolated_db is None else snr_text(layer.isolated_db)}</td>"
                         f"<td>{snr_text(layer.snr_in_db)}</td><td>{snr_text(layer.snr_out_db)}</td>"
                         f"<td>{'none' if layer.added_db is None else snr_text(layer.added_db)}</td></tr>")
        parts.append("</table>")
        suggestion = loc.exclude_nodes()
        parts.append(f"<p>Keep in higher precision: <code>trt-bridge convert ... --exclude-nodes "
                     f"'{esc(suggestion)}'</code></p>" if suggestion else
                     "<p>No quantized layer adds error.</p>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
