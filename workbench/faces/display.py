"""Results as a reader should see them: tables rounded with units in the headers, one palette, the cards.

    from workbench.faces.display import tidy
    tidy(bench.results, ["label", "samples_per_s", "speedup", "verdict"])   # a pandas Styler

`FORMATS` is the one place a column's unit and rounding are written; the panel's table uses it too,
so a cell and the panel show the same figure the same way. `STATUS_COLORS` is the one palette of trial
statuses (the chart's points, the panel's status line and table, a trial's card). `trial_html` and
`comparison_html` draw a `TrialResult` and a `Comparison`, which are plain data: importing this module
registers them in `core/views.py`, so their `_repr_html_` (what Jupyter calls) draws these. pandas only
(no widgets, no altair).
"""

from __future__ import annotations

import html
import math
import statistics
from typing import Any

import pandas as pd

from ..core.measure import TrialResult, fmt_bytes
from ..core.views import HTML
from ..results.stats import Comparison

# One colour per trial status (core/measure.py's STATUSES) and one for the baseline: the chart's marks, the
# panel's status line and results table, and a trial's card all take theirs from here.
STATUS_COLORS = {"ok": "#4c78a8", "nan": "#f58518", "interrupted": "#9d755d", "error": "#e45756", "oom": "#b22222"}
BASELINE_COLOR = "#222222"
# One colour per comparison answer: a Comparison's sentence and the workshop's chart.
VERDICT_COLORS = {"faster": "#2e7d32", "slower": "#c62828", "same": "#1565c0", "undecided": "#616161"}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.2f}"


# Columns that share a format, listed together: {format: {column: header with its unit}}.
_BY_FORMAT: dict[Any, dict[str, str]] = {
    "{:,.1f}": {"samples_per_s": "samples/s", "samples_per_s_low": "samples/s low",
                "samples_per_s_high": "samples/s high", "per_rank_samples_per_s": "samples/s per rank",
                "peak_memory_mb": "peak MB", "model_state_mb": "model state MB"},
    "{:.2f}×": {"speedup": "speedup ×", "speedup_low": "95% low ×", "speedup_high": "95% high ×",
                "median_speedup": "median speedup ×"},
    "{:.0%}": {"efficiency": "efficiency", "data_wait_share": "data wait %", "exposed_comm_share": "exposed comm %"},
    "{:,.2f}": {"step_time_ms": "step ms", "step_time_iqr_ms": "step IQR ms"},
    _ms: {"step_time_s": "step ms", "no_comm_step_s": "no-comm step ms"},
    "{:.2f}": {"startup_s": "first batch s"},
    "{:.1f}": {"compile_s": "compile s"},
    "{:.4f}": {"final_loss": "final loss"},
    (lambda b: f"{b / 1e6:,.2f}"): {"allreduce_bytes": "all-reduce MB"},
    "{:.0f}": {"allreduce_per_step": "all-reduces / step"},
}
# column -> (header with its unit, format). Columns not listed keep their name and pandas' format.
FORMATS: dict[str, tuple[str, Any]] = {col: (head, fmt) for fmt, cols in _BY_FORMAT.items() for col, head in cols.items()}
CACHED_LOSS = "{:.4f} (1 batch: not comparable)"  # data="cached" trains on one batch over and over
SCROLL = "display:block;max-width:100%;overflow-x:auto"  # a wide table scrolls inside its box


def loss_cells(df: pd.DataFrame) -> pd.Series:
    """`final_loss` as text, marked where the trial trained on one cached batch (a loss that
    cannot be compared with the real loader's)."""
    loss = pd.to_numeric(df["final_loss"], errors="coerce")
    cached = df["data"].astype(str).eq("cached") if "data" in df.columns else pd.Series(False, index=df.index)
    return pd.Series([("–" if pd.isna(v) else (CACHED_LOSS if c else "{:.4f}").format(v))
                      for v, c in zip(loss, cached)], index=df.index, dtype=object)


def tidy(df: pd.DataFrame, columns: list[str] | None = None, *, index: bool = False) -> Any:
    """`df[columns]` as a Styler: figures rounded, units in the headers, missing values as "–", text
    escaped (a message's `<class ...>` shows as written), the cached batch's loss marked, and a box that
    scrolls sideways instead of wrapping the table.

    `tidy(bench.results, ["label", "samples_per_s", "final_loss"])`: the `data` knob of the full
    frame still marks the cached batch's loss.
    """
    if not isinstance(df, pd.DataFrame):
        hint = " (pass its .frame)" if isinstance(getattr(df, "frame", None), pd.DataFrame) else ""
        raise TypeError(f"tidy takes a pandas DataFrame, got {type(df).__name__}{hint}")
    missing = [c for c in columns or [] if c not in df.columns]
    if missing:
        raise ValueError(f"tidy: no column(s) {missing} in the frame; it has {list(df.columns)}")
    view = df[list(columns)].copy() if columns is not None else df.copy()
    if "final_loss" in view.columns:
        view["final_loss"] = loss_cells(df)
    floats = {c: "{:,.3g}" for c in view.columns if pd.api.types.is_float_dtype(view[c])}
    formats = floats | {c: f for c, (_, f) in FORMATS.items() if c in view.columns and c != "final_loss"}
    styler = view.style.format(formats, na_rep="–")
    text = [c for c in view.columns if c not in formats]  # labels, messages, knobs: shown as text, never as HTML
    if text:
        styler = styler.format(na_rep="–", escape="html", subset=text)
    styler = styler.relabel_index([html.escape(str(FORMATS.get(c, (c,))[0])) for c in view.columns], axis="columns")
    if not index:
        styler = styler.hide(axis="index")
    return (styler.set_table_styles([{"selector": "th, td", "props": "white-space: nowrap; padding: 2px 8px"}])
            .set_table_attributes(f'style="{SCROLL}"'))


def trial_label(r: TrialResult) -> str:
    """The trial's label as the results table writes it: its knobs against its workbench's defaults
    (stamped when the trial was logged); a trial from elsewhere against the default Knobs."""
    label = r.extra.get("label")
    return label if isinstance(label, str) and label else r.knobs.label()


def trial_html(r: TrialResult) -> str:
    """A trial as a compact card: headline figures, the status in its colour, the message and the notes."""
    esc = html.escape
    head = f"Trial #{r.trial_id}" if r.trial_id is not None else "Trial"
    colour = STATUS_COLORS.get(r.status, STATUS_COLORS["error"])
    badge = (f'<span style="background:{colour};color:white;border-radius:3px;padding:0 6px">'
             f"{esc(r.status)}</span>")
    figures = []
    if r.samples_per_s is not None:
        noise = r.relative_noise
        figures.append(("throughput", f"{r.samples_per_s:,.1f} samples/s"
                        + (f" ±{noise * 100:.0f}%" if noise is not None else "")))
    if r.step_time_s is not None:
        figures.append(("median step", f"{r.step_time_s * 1e3:.2f} ms"))
    if r.data_wait_share is not None:
        figures.append(("data wait", f"{r.data_wait_share:.0%}"))
    figures.append(("peak memory", fmt_bytes(r.peak_memory_bytes)))
    figures.append(("model state", fmt_bytes(r.model_state_bytes)))
    final = next((x for x in reversed(r.losses) if math.isfinite(x)), None)
    if final is not None:
        figures.append(("final loss", f"{final:.4g}"))
    if r.trace_path:
        figures.append(("trace", r.trace_path))
    cells = "".join(f'<tr><td style="color:#666;padding-right:1em">{esc(k)}</td><td>{esc(v)}</td></tr>'
                    for k, v in figures)
    parts = [f'<div class="wb-trial" style="border-left:4px solid {colour};padding:4px 10px;margin:4px 0">',
             f"<b>{esc(head)}</b> {badge} <code>{esc(trial_label(r))}</code>",
             f'<table style="margin-top:4px">{cells}</table>']
    if r.message:
        parts.append(f'<div style="color:{colour}">{esc(r.message)}</div>')
    if r.notes:
        parts.append('<ul style="margin:2px 0;color:#555">' + "".join(f"<li>{esc(n)}</li>" for n in r.notes)
                     + "</ul>")
    parts.append("</div>")
    return "".join(parts)


def comparison_html(c: Comparison) -> str:
    """A comparison: its sentence in the answer's colour, each side's trials (or turns) and rates, the noise."""
    if c.method == "interleaved":  # hundreds of turns: each side's median turn, not every one
        rows = "".join(f"<tr><td>{side}</td><td>#{t}</td><td>{len(r)} turns, median "
                       f"{statistics.median(r) if r else float('nan'):,.1f}</td></tr>"
                       for side, t, r in (("A", c.a, c.a_rates), ("B", c.b, c.b_rates)))
    else:
        rows = "".join(f"<tr><td>{side}</td><td>{', '.join(f'#{t}' for t in ids)}</td>"
                       f"<td>{', '.join(f'{r:,.1f}' for r in rates)}</td></tr>"
                       for side, ids, rates in (("A", c.a_trials, c.a_rates), ("B", c.b_trials, c.b_rates)))
    color = VERDICT_COLORS[c.answer]
    return (f'<p style="color:{color}">{html.escape(str(c))}</p>'  # the sentence says the verdict once
            f'<table class="wb-comparison"><tr><th></th><th>trials</th><th>samples/s</th></tr>{rows}</table>'
            f"<p><small>{html.escape(str(c.noise))}</small></p>")


HTML.update({TrialResult: trial_html, Comparison: comparison_html})  # what their _repr_html_ draws
