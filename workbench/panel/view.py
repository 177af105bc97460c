"""The results side of the panel: status line, result sentence, results table, repeat verdicts.

Pure functions of TrialResults and DataFrames (no widgets), so they are tested without a browser.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import pandas as pd

from ..measure import TrialResult
from ..results import Comparison, compare

if TYPE_CHECKING:
    from ..bench import Workbench

STATUS_COLORS = {"ok": "#2e7d32", "nan": "#ef6c00", "interrupted": "#6d4c41", "error": "#c62828", "oom": "#b71c1c"}
TABLE_COLUMNS = ["trial_id", "label", "status", "samples_per_s", "speedup", "verdict", "step_time_ms",
                 "data_wait_share", "peak_memory_mb", "final_loss", "message"]


def status_html(phase: str, text: str) -> str:
    """The status line; `data-phase` lets browser tests see what the panel is doing."""
    color = STATUS_COLORS.get(phase, "#455a64")
    safe = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return f'<span class="wb-status" data-phase="{phase}" style="color:{color}">{safe}</span>'


def result_line(r: TrialResult, bench: Workbench) -> str:
    """One line about a finished trial: throughput and verdict, or the failure's message."""
    head = f"#{r.trial_id} {r.knobs.label(bench.baseline.knobs if bench.baseline else None)}"
    if not r.ok:
        return f"{head}: {r.status.upper()}: {r.message}"
    line = f"{head}: {r.samples_per_s:,.1f} samples/s"
    base = bench.baseline
    if base is not None and base.trial_id != r.trial_id and len(r.step_times_s) >= 2:
        line += f", {r.samples_per_s / base.samples_per_s:.2f}× baseline ({compare(base, r).verdict})"
    if r.notes:
        line += " · " + "; ".join(r.notes)
    return line


def table_html(df: pd.DataFrame) -> str:
    """The results table, newest first, status coloured (pandas Styler → HTML)."""
    if df.empty:
        return "<i>No trials yet.</i>"
    view = df[[c for c in TABLE_COLUMNS if c in df.columns]].iloc[::-1]
    styler = (view.style
              .format({"samples_per_s": "{:,.1f}", "speedup": "{:.2f}×", "step_time_ms": "{:.2f}",
                       "data_wait_share": "{:.0%}", "peak_memory_mb": "{:,.1f}", "final_loss": "{:.4f}"},
                      na_rep="–")
              .map(lambda s: f"color:{STATUS_COLORS.get(s, '#000')};font-weight:bold", subset=["status"])
              .hide(axis="index")
              .set_table_styles([{"selector": "th, td", "props": "white-space: nowrap; padding: 1px 8px; font-size: 12px"}])
              .set_table_attributes('class="wb-results"'))
    return f'<div style="max-height:320px;overflow:auto">{styler.to_html()}</div>'


def pooled(results: list[TrialResult], trial_id: int | None) -> TrialResult:
    """Several runs of the same knobs as one, their step times pooled (for one overall verdict)."""
    times = tuple(t for r in results for t in r.step_times_s)
    return dataclasses.replace(results[0], step_times_s=times, trial_id=trial_id)


def confirmed(rounds: list[Comparison], pooled: Comparison) -> str:
    """A paired verdict: every round beyond noise in the same direction as the pooled result."""
    if pooled.beyond_noise and all(c.beyond_noise and (c.speedup > 1) == (pooled.speedup > 1) for c in rounds):
        return f"confirmed {'faster' if pooled.speedup > 1 else 'slower'} ({(pooled.speedup - 1) * 100:+.1f}%)"
    return f"not confirmed: the difference does not hold up beyond noise in every round ({(pooled.speedup - 1) * 100:+.1f}% pooled)"


def repeat_html(rep: dict[str, Any]) -> str:
    rows = "".join(f"<li>round {i + 1}: {c}</li>" for i, c in enumerate(rep["rounds"]))
    return (f"<b>Repeat to confirm #{rep['trial_id']} against baseline #{rep['baseline_id']}:</b> "
            f"{rep['confirmed']}<ul>{rows}<li>pooled: {rep['pooled']}</li></ul>")
