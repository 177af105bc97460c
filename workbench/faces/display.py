"""Tables as a reader should see them: rounded figures, units in the headers, a scroll box, not a wrap.

    from workbench.faces.display import tidy
    tidy(bench.results, ["label", "samples_per_s", "speedup", "verdict"])   # a pandas Styler

`FORMATS` is the one place a column's unit and rounding are written; the panel's table uses it too,
so a cell and the panel show the same figure the same way. pandas only (no widgets, no altair).
"""

from __future__ import annotations

from typing import Any

import pandas as pd


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
    """`df[columns]` as a Styler: figures rounded, units in the headers, missing values as "–",
    the cached batch's loss marked, and a box that scrolls sideways instead of wrapping the table.

    `tidy(bench.results, ["label", "samples_per_s", "final_loss"])`: the `data` knob of the full
    frame still marks the cached batch's loss.
    """
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"tidy takes a pandas DataFrame, got {type(df).__name__}")
    missing = [c for c in columns or [] if c not in df.columns]
    if missing:
        raise ValueError(f"tidy: no column(s) {missing} in the frame; it has {list(df.columns)}")
    view = df[list(columns)].copy() if columns is not None else df.copy()
    if "final_loss" in view.columns:
        view["final_loss"] = loss_cells(df)
    floats = {c: "{:,.3g}" for c in view.columns if pd.api.types.is_float_dtype(view[c])}
    formats = floats | {c: f for c, (_, f) in FORMATS.items() if c in view.columns and c != "final_loss"}
    styler = view.style.format(formats, na_rep="–")
    styler = styler.relabel_index([FORMATS.get(c, (c,))[0] for c in view.columns], axis="columns")
    if not index:
        styler = styler.hide(axis="index")
    return (styler.set_table_styles([{"selector": "th, td", "props": "white-space: nowrap; padding: 2px 8px"}])
            .set_table_attributes(f'style="{SCROLL}"'))
