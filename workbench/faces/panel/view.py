"""The results side of the panel: status line, result sentence, results table, repeat verdicts.

Pure functions of TrialResults and DataFrames (no widgets), so they are tested without a browser.
"""

from __future__ import annotations

import html
import re
from typing import Any

import pandas as pd

from ...core.measure import TrialResult
from ...results.protocol import Bench
from ..display import STATUS_COLORS, tidy

TABLE_COLUMNS = ["trial_id", "label", "status", "samples_per_s", "speedup", "verdict", "step_time_ms",
                 "data_wait_share", "peak_memory_mb", "model_state_mb", "final_loss", "message"]


def status_html(phase: str, text: str) -> str:
    """The status line; `data-phase` lets browser tests see what the panel is doing. A trial's status
    (ok, oom, ...) takes its colour from display.STATUS_COLORS, a phase (starting, measuring, ...) grey."""
    color = STATUS_COLORS.get(phase, "#455a64")
    safe = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return f'<span class="wb-status" data-phase="{phase}" style="color:{color}">{safe}</span>'


def result_line(r: TrialResult, bench: Bench) -> str:
    """One line about a finished trial: throughput and verdict, or the failure's message.

    The speedup and verdict are the results table's for this trial (its row), so the line and the
    table never disagree: both pool every repeat so far of each side's knobs."""
    head = f"#{r.trial_id} {r.knobs.label(bench.defaults)}"
    if not r.ok:
        return f"{head}: {r.status.upper()}: {r.message}"
    line = f"{head}: {r.samples_per_s:,.1f} samples/s"
    df = bench.results
    row = df[df["trial_id"] == r.trial_id]
    if len(row) and bool(row["baseline"].iloc[0]):
        line += " (the baseline)"
    elif len(row) and pd.notna(row["speedup"].iloc[0]):
        speedup = float(row["speedup"].iloc[0])
        on = " on tokens/s" if "judged_on" in row and row["judged_on"].iloc[0] == "tokens/s" else ""
        line += f", {speedup:.2f}× baseline{on} ({row['verdict'].iloc[0]})"
    if r.notes:
        line += " · " + "; ".join(r.notes)
    return line


def table_html(df: pd.DataFrame, noise: Any = None) -> str:
    """The results table, newest first, status coloured, figures as `display.tidy` shows them; a box
    that scrolls both ways, so every column stays reachable in a narrow notebook. On a machine too
    noisy to decide (`df.attrs["noise"].too_noisy`) its caption says so above the rows."""
    if df.empty:
        return "<i>No trials yet.</i>"
    noise = noise if noise is not None else df.attrs.get("noise")
    caption = ('<p class="wb-table-warning" style="font-size:12px;color:#c62828;margin:0">Verdicts below: this '
               "machine is too noisy to decide small differences (see the line under the table).</p>"
               if getattr(noise, "too_noisy", False) else "")
    styler = (tidy(df.iloc[::-1], [c for c in TABLE_COLUMNS if c in df.columns])
              .map(lambda s: f"color:{STATUS_COLORS.get(s, '#000')};font-weight:bold", subset=["status"])
              .set_table_styles([{"selector": "th, td", "props": "white-space: nowrap; padding: 1px 8px; font-size: 12px"}])
              .set_table_attributes('class="wb-results"'))
    if "message" in df.columns:  # a long failure message wraps instead of widening every row
        styler = styler.set_properties(subset=["message"], **{"white-space": "normal", "min-width": "16em"})
    # The widget's content box is a flex item that would grow to the table's width; let it shrink, so the box scrolls.
    shrink = ("<style>.wb-table{min-width:0;max-width:100%}"
              ".wb-table .widget-html-content{min-width:0;flex:1 1 auto}</style>")
    return (f'{shrink}{caption}<div class="wb-table-box" style="max-height:320px;max-width:100%;overflow:auto">'
            f"{styler.to_html()}</div>")


DISTURBED = re.compile(r"disturbed: other processes kept ([0-9.]+) cores busy")


def busy_cores(trials: list[TrialResult], last: int = 5) -> float | None:
    """The most cores other processes kept busy during the last `last` trials (their "disturbed" notes)."""
    seen = [float(m.group(1)) for r in trials[-last:] for n in r.notes if (m := DISTURBED.search(n))]
    return max(seen) if seen else None


def noise_html(noise: Any, trials: list[TrialResult] | None = None) -> str:
    """The workbench's current belief about run-to-run noise, under the table (bench.noise). On a machine
    too noisy to decide, it says so, who took the CPU and what to do, instead of an interval."""
    if noise is None:
        return ""
    if getattr(noise, "too_noisy", False):
        text = (f"Too noisy to decide small differences here: {noise.advice(busy_cores(trials or []))}. "
                "Until then, verdicts stay undecided unless a gap is large.")
        return f'<p class="wb-noise wb-too-noisy" style="font-size:12px;color:#c62828">{html.escape(text)}</p>'
    return f'<p class="wb-noise" style="font-size:12px;color:#455a64">{html.escape(str(noise))}</p>'


def trace_html(trials: list[TrialResult]) -> str:
    """Where the latest trace is (bench.run(trace=True)), and what opens it."""
    r = next((t for t in reversed(trials) if t.trace_path), None)
    if r is None:
        return ""
    return (f'<span class="wb-trace" style="font-size:12px">trace of #{r.trial_id}: '
            f"<code>{html.escape(str(r.trace_path))}</code> (open in ui.perfetto.dev or chrome://tracing)</span>")


def explanation_html(explanation: Any, message: str = "") -> str:
    """The picked trial explained against the baseline (bench.explain), or why it is not."""
    if explanation is None:
        return f'<p class="wb-explanation" style="font-size:12px;color:#455a64">{html.escape(message)}</p>'
    return (f"<details open><summary><b>#{explanation.b} explained against baseline #{explanation.a}</b>"
            f"</summary>{explanation._repr_html_()}</details>")
