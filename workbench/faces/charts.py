"""Charts: pure functions from the `bench.results` DataFrame to altair charts.

    comparison_chart(bench.results)      throughput per trial with its noise band, the baseline
                                         marked, failures visible; linked peak-memory and
                                         data-wait views underneath
    chart.save("runs.html")              a standalone page; chart.save("runs.png") via vl-convert

Nothing here runs trials or touches widgets: the panel and `bench.chart()` both call these, so the
live chart and the exported one are the same picture. altair is imported only by this module.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

import altair as alt
import pandas as pd

from ..core.knobs import knob_names
from .display import BASELINE_COLOR, STATUS_COLORS

# Every status gets a fixed colour (display.STATUS_COLORS, the panel's and the cards' too) and shape.
KINDS = ["baseline", "ok", "nan", "interrupted", "error", "oom"]
KIND_COLORS = [BASELINE_COLOR, *(STATUS_COLORS[k] for k in KINDS[1:])]
UNSTEADY_COLOR = "#b279a2"  # the "not steady" mark under a throughput point
KIND_SHAPES = ["diamond", "circle", "triangle-up", "cross", "cross", "cross"]
FAILED = ("interrupted", "error", "oom")  # no throughput: drawn as a cross on the zero line

# The legend of the marks that colour and shape do not name (docs/results.md, "The chart", explains each).
MARKS_LEGEND = ["point: one trial's samples/s · band: where a repeat of it would land (95%, this machine's noise)",
                "dashed line: the baseline · cross on zero: a failed trial, its status above it · "
                "'not steady': see docs/results.md"]

LAST_N = 30  # the default chart: the baseline, the last LAST_N trials and the best of each configuration
DATASET = "trials"  # the chart's one dataset, by a fixed name so a data update can replace it
PICK = "trial_pick"  # the click selection; a JupyterChart reports it as chart.selections.trial_pick
TITLE = "wb_title"  # the title's text, a parameter: a data update sets it in the page without a re-embed
WIDTH = 560  # px; the three views share it so their columns line up
EMPTY_TEXT = "No trials yet: change a knob in the panel, or call bench.run()"


def chart_frame(results: pd.DataFrame) -> pd.DataFrame:
    """The rows the chart draws: one per trial, with plot-ready columns added.

    `trial` is the x label ("#3 num_workers=2"), `kind` is baseline/ok/<failure status> and
    `throughput` is samples/s with failed trials at 0 so they still get a mark; tokens/s when every
    finished trial counted tokens (token batches: padding and packing make samples/s lie), and then
    the frame has a `tokens_per_s` column (the chart's axis says which).
    """
    if results.empty:
        return pd.DataFrame(columns=["trial_id", "trial", "kind", "throughput"])
    df = results.reset_index(drop=True).copy()
    df["trial"] = "#" + df["trial_id"].astype(str) + " " + df["label"].astype(str)
    if "window" in df.columns:  # a trial stopped early (earlystop.py) says so on its axis label
        window = df["window"].fillna("").astype(str)
        df["trial"] = df["trial"] + window.map(lambda w: f" (stopped early {w})" if w else "")
    is_base = df["baseline"].fillna(False).astype(bool) if "baseline" in df.columns else df["verdict"] == "baseline"
    df["kind"] = df["status"].astype(str).where(~is_base, "baseline")  # status is categorical
    samples = pd.to_numeric(df["samples_per_s"], errors="coerce")
    df["throughput"] = samples.fillna(0.0)
    ratio = pd.Series(1.0, index=df.index)
    ok = df["status"].astype(str) == "ok"
    if "tokens_per_s" in df.columns and ok.any() and df.loc[ok, "tokens_per_s"].notna().all():
        tokens = pd.to_numeric(df["tokens_per_s"], errors="coerce")
        df["throughput"] = tokens.fillna(0.0)
        ratio = (tokens / samples).fillna(1.0)
    else:
        df = df.drop(columns=[c for c in ("tokens_per_s", "padding_share") if c in df.columns])
    for end in ("low", "high"):
        if f"samples_per_s_{end}" in df.columns:
            df[f"throughput_{end}"] = pd.to_numeric(df[f"samples_per_s_{end}"], errors="coerce") * ratio
    df["speedup_pct"] = (pd.to_numeric(df["speedup"], errors="coerce") - 1.0) * 100.0
    keep = ["trial_id", "trial", "kind", "baseline", "throughput", "samples_per_s", "samples_per_s_low",
            "samples_per_s_high", "throughput_low", "throughput_high", "tokens_per_s", "padding_share", "speedup",
            "speedup_pct", "verdict", "steady", "window", "status", "label",
            "step_time_ms", "step_time_iqr_ms", "peak_memory_mb", "data_wait_share", "final_loss",
            "message", "decided_speedup", "decided_by", *knob_names()]
    return df[[c for c in keep if c in df.columns]]


def chart_view(results: pd.DataFrame, last: int | None = LAST_N) -> pd.DataFrame:
    """The trials a person compares: the baseline, the last `last` trials, and the fastest trial of
    each configuration (label), in trial order. `last=None`: every trial (the full history).
    `view.attrs["total"]` is how many trials the results hold."""
    total = len(results)
    if last is None or total <= last or results.empty:
        view = results
    else:
        if last < 0:
            raise ValueError(f"last must be >= 0 trials (or None for all), got {last}")
        keep = pd.Series(False, index=results.index)
        keep.iloc[total - last:] = True
        keep |= results["baseline"] if "baseline" in results.columns else results["verdict"] == "baseline"
        rate = pd.to_numeric(results["samples_per_s"], errors="coerce")
        best = rate.groupby(results["label"].astype(str)).idxmax().dropna()
        keep.loc[best.to_numpy()] = True
        view = results[keep]
    view = view.copy() if view is not results else view.copy(deep=False)
    view.attrs["total"] = total
    return view


def view_title(shown: int, total: int) -> str:
    """The chart's title: how many of the trials it draws, and how to see them all."""
    if shown >= total:
        return f"{total:,} trial{'s' if total != 1 else ''}"
    return (f"{shown:,} of {total:,} trials: the baseline, the last {LAST_N} and the best of each configuration "
            "(bench.chart(last=None) draws all)")


def comparison_chart(results: pd.DataFrame, *, width: int = WIDTH, last: int | None = LAST_N) -> alt.TopLevelMixin:
    """Throughput per trial (noise band, baseline, failures) over linked memory and data-wait views.

    Draws `chart_view(results, last)`: the baseline, the last `last` trials and the best of each
    configuration, with the total stated in the title; `last=None` draws every trial. Click a trial
    to highlight it in all three views (double-click clears). Hover for the full knob set, the
    speedup against the baseline and the verdict.
    """
    data = chart_frame(chart_view(results, last))
    if data.empty:
        return (alt.Chart(pd.DataFrame({"text": [EMPTY_TEXT]}))
                .mark_text(size=14, color="gray").encode(text="text:N")
                .properties(width=width, height=60, title="Throughput per trial"))
    kinds = tuple(k for k in KINDS if k in set(data["kind"]))
    chart = _chart_shape(tuple(data.columns), width, kinds).copy(deep=False)  # the views are built once
    chart.usermeta = {"workbench": _shape_key(data)}  # update_chart swaps data only while this holds
    chart = chart.add_params(alt.param(name=TITLE, value=view_title(len(data), len(results))))
    chart.title = alt.Title(alt.ExprRef(TITLE), anchor="start", fontSize=12, fontWeight="normal")
    chart.datasets = {DATASET: _records(data)}
    return chart


def chart_title(spec: dict[str, Any]) -> str:
    """The title text a chart's spec shows (the TITLE parameter's value, or a literal title)."""
    title = (spec.get("title") or {}).get("text")
    if isinstance(title, str):
        return title
    return next((p.get("value", "") for p in spec.get("params", []) if p.get("name") == TITLE), "")


def _shape_key(data: pd.DataFrame) -> dict[str, list[str]]:
    """What the chart's shape depends on: the columns and the kinds of trial present (the legend)."""
    return {"columns": [str(c) for c in data.columns], "kinds": [k for k in KINDS if k in set(data["kind"])]}


@functools.lru_cache(maxsize=16)
def _chart_shape(columns: tuple[str, ...], width: int, kinds: tuple[str, ...]) -> alt.VConcatChart:
    """The comparison chart without its data: three linked views over the named dataset.

    Nothing in it depends on the rows, only on which columns exist and which kinds of trial the
    legend lists, so it is built once per such shape and copied per call; altair's chart
    construction is the slow part (~0.2 s here)."""
    data = pd.DataFrame(columns=list(columns))
    picked = alt.selection_point(name=PICK, fields=["trial_id"], on="click", clear="dblclick")
    highlight = alt.condition(picked, alt.value(1.0), alt.value(0.25))
    # Sorted by a field, not by a list of this data's labels: the spec stays the same as trials
    # arrive, so the panel replaces only the data (see update_chart).
    x = alt.X("trial:N", sort=alt.EncodingSortField(field="trial_id", op="min"), title=None,
              axis=alt.Axis(labelAngle=-25, labelLimit=180))
    # The legend names what a mark's colour and shape say, and only the kinds these trials have.
    seen = list(kinds)
    legend = alt.Legend(title="trial (baseline or status)", symbolOpacity=1)  # not faded by the band's or bars' opacity
    color = alt.Color("kind:N", scale=alt.Scale(domain=seen, range=[KIND_COLORS[KINDS.index(k)] for k in seen]),
                      legend=legend)
    shape = alt.Shape("kind:N", scale=alt.Scale(domain=seen, range=[KIND_SHAPES[KINDS.index(k)] for k in seen]),
                      legend=legend)
    # Views carry no data of their own: the rows sit once at the top (smaller spec, faster to build).
    base = alt.Chart().encode(x=x)
    below = alt.Chart().encode(x=x.axis(labels=False, ticks=False))  # the top view names the trials
    tooltip = _tooltip(data)

    # ---- throughput: interquartile band (from step-time quartiles), median point, baseline line
    band = base.transform_filter("isValid(datum.throughput_low)").mark_rule(
        strokeWidth=7, opacity=0.35
    ).encode(y=alt.Y("throughput_low:Q"), y2="throughput_high:Q", color=color)
    unit = "tokens / s" if "tokens_per_s" in columns else "samples / s"  # chart_frame's choice
    points = base.mark_point(filled=True, size=110).encode(
        y=alt.Y("throughput:Q", title=unit), color=color, shape=shape, opacity=highlight,
        tooltip=tooltip,
    ).add_params(picked)
    failed_text = base.transform_filter(alt.FieldOneOfPredicate("kind", list(FAILED))).mark_text(
        dy=-12, fontSize=11, color=KIND_COLORS[KINDS.index("error")]
    ).encode(y="throughput:Q", text="status:N")
    unsteady_text = base.transform_filter("datum.steady === false").mark_text(  # steady.py's flag
        dy=16, fontSize=10, color=UNSTEADY_COLOR
    ).encode(y="throughput:Q", text=alt.value("not steady"))
    baseline_rule = base.transform_filter(alt.datum.kind == "baseline").mark_rule(
        strokeDash=[5, 4], color=KIND_COLORS[0]
    ).encode(y="throughput:Q", x=alt.value(0), x2=alt.value(width))
    throughput = alt.layer(band, baseline_rule, points, failed_text, unsteady_text).properties(
        width=width, height=220, title=alt.Title("Throughput per trial", subtitle=MARKS_LEGEND, subtitleFontSize=10,
                                                 anchor="start")
    )

    # ---- linked views: same trials on x, highlighted together ------------------------------
    memory = below.mark_bar().encode(
        y=alt.Y("peak_memory_mb:Q", title="peak MB"), color=color, opacity=highlight,
        tooltip=["trial:N", alt.Tooltip("peak_memory_mb:Q", title="peak MB", format=",.1f")],
    ).properties(width=width, height=90, title="Peak memory")
    wait = below.mark_bar().encode(
        y=alt.Y("data_wait_share:Q", title="data wait", axis=alt.Axis(format="%"),
                scale=alt.Scale(domain=[0, 1])),
        color=color, opacity=highlight,
        tooltip=["trial:N", alt.Tooltip("data_wait_share:Q", title="data wait", format=".0%")],
    ).properties(width=width, height=90, title="Share of time waiting for data (target < 20%)")
    return (alt.vconcat(throughput, memory, wait, data=alt.NamedData(DATASET), spacing=8)
            .resolve_scale(color="shared", shape="shared"))


def _records(data: pd.DataFrame) -> list[dict[str, Any]]:
    """The rows as the JSON a Vega-Lite dataset holds (NaN -> null, times -> ISO text)."""
    from altair.utils.data import sanitize_pandas_dataframe

    return sanitize_pandas_dataframe(data.reset_index(drop=True)).to_dict(orient="records")


def update_chart(jupyter_chart: Any, results: pd.DataFrame, *, last: int | None = LAST_N) -> bool:
    """Show `results` in `jupyter_chart` (an altair JupyterChart of `comparison_chart`).

    When the chart already draws trials of the same shape, only its rows and title change, and the page
    is sent only those: the rows through the widget's data channel (`_py_to_js_updates`, which the page
    applies to the running Vega view) and the title through its parameter. A new `spec` would make the
    page re-embed the whole chart (compile, parse, lay out three views: 0.3-2 s of browser CPU per trial
    on a 2-core machine; benchmarks/README.md "Panel latency"). The kernel's `spec` still gets the new
    rows (without sending them again), so `chart.spec` always holds what the page draws. Otherwise (the
    first trial, an empty log, a new kind of trial for the legend) it gets a new chart. Returns True when
    it was a data update.
    """
    spec = getattr(jupyter_chart, "spec", None) or {}
    data = chart_frame(chart_view(results, last))
    same_shape = (spec.get("usermeta") or {}).get("workbench") == (None if data.empty else _shape_key(data))
    titled = any(p.get("name") == TITLE for p in spec.get("params", []))
    if data.empty or DATASET not in (spec.get("datasets") or {}) or not same_shape or not titled:
        jupyter_chart.chart = comparison_chart(results, last=last)
        return False
    rows, title = _records(data), view_title(len(data), len(results))
    params = [{**p, "value": title} if p.get("name") == TITLE else p for p in spec.get("params", [])]
    new = {**spec, "datasets": {DATASET: rows}, "params": params}
    with jupyter_chart._lock_property(spec=json.loads(json.dumps(new))):  # kept here, not re-sent: no re-embed
        jupyter_chart.spec = new
    jupyter_chart._py_to_js_updates = [{"namespace": "data", "name": DATASET, "scope": [], "value": rows}]
    if TITLE in getattr(jupyter_chart.params, "trait_names", lambda: [])():
        setattr(jupyter_chart.params, TITLE, title)  # the page's signal (the chart's param channel)
    return True


def _tooltip(data: pd.DataFrame) -> list[alt.Tooltip]:
    """Headline numbers first, then every knob (so a point says exactly what was run)."""
    tips = [
        alt.Tooltip("trial_id:O", title="trial"),
        alt.Tooltip("status:N"),
        alt.Tooltip("samples_per_s:Q", title="samples/s", format=",.1f"),
        *([alt.Tooltip("tokens_per_s:Q", title="tokens/s", format=",.0f"),
           alt.Tooltip("padding_share:Q", title="padding", format=".0%")] if "tokens_per_s" in data.columns else []),
        alt.Tooltip("speedup:Q", title="speedup vs baseline", format=".2f"),
        alt.Tooltip("verdict:N"),
        *([alt.Tooltip("steady:N", title="steady state")] if "steady" in data.columns else []),
        alt.Tooltip("step_time_ms:Q", title="median step ms", format=".2f"),
        alt.Tooltip("peak_memory_mb:Q", title="peak MB", format=",.1f"),
        alt.Tooltip("data_wait_share:Q", title="data wait", format=".0%"),
        alt.Tooltip("final_loss:Q", title="final loss", format=".4f"),
        alt.Tooltip("message:N"),
    ]
    if "decided_speedup" in data.columns:  # a logged rounds="auto" comparison decided this trial's knobs
        tips[4:4] = [alt.Tooltip("decided_speedup:Q", title="decided ratio vs baseline", format=".3f"),
                     alt.Tooltip("decided_by:N", title="decided by")]
    tips += [alt.Tooltip(f"{k}:N") for k in knob_names() if k in data.columns]
    return tips


def chart_data(chart: Any) -> pd.DataFrame:
    """The trial rows inside a chart (an altair chart, a JupyterChart, or a spec dict).

    For tests and notebooks: `chart_data(bench.chart())` has one row per trial drawn.
    """
    spec = chart
    if hasattr(chart, "spec") and isinstance(chart.spec, dict):  # JupyterChart: the synced spec
        spec = chart.spec
    elif hasattr(chart, "to_dict"):
        spec = chart.to_dict()
    if not isinstance(spec, dict):
        raise TypeError(f"chart_data takes an altair chart, JupyterChart or spec dict, got {type(chart).__name__}")
    for rows in (spec.get("datasets") or {}).values():
        if rows and "trial_id" in rows[0]:
            return pd.DataFrame(rows)
    return pd.DataFrame(columns=["trial_id"])


def picked_trial(selection: Any) -> int | None:
    """The trial id a click picked: from a JupyterChart PointSelection (or its `.value` list of
    {"trial_id": n} dicts); None when the pick was cleared."""
    value = getattr(selection, "value", selection) or []
    ids = [v["trial_id"] for v in value if isinstance(v, dict) and v.get("trial_id") is not None]
    return int(ids[-1]) if ids else None


def on_trial_pick(jupyter_chart: Any, fn: Callable[[int | None], None]) -> Callable[[], None]:
    """Call `fn(trial_id or None)` whenever a click in `jupyter_chart` picks (or clears) a trial.

    Survives redraws: assigning a new `.chart` gives the JupyterChart a new `selections` object,
    so the handler is attached again after each one. Returns a function that detaches it.
    """
    def on_pick(change: Any) -> None:
        fn(picked_trial(change["new"]))

    def attach(_: Any = None) -> None:
        selections = jupyter_chart.selections
        if PICK in selections.trait_names():  # the empty placeholder chart has no selection
            selections.observe(on_pick, names=[PICK])

    jupyter_chart.observe(attach, names=["chart"])  # runs after the JupyterChart rebuilt its selections
    attach()

    def detach() -> None:
        jupyter_chart.unobserve(attach, names=["chart"])
        try:
            jupyter_chart.selections.unobserve(on_pick, names=[PICK])
        except ValueError:  # not attached to the current selections
            pass

    return detach
def scaling_chart(scaling: pd.DataFrame, *, width: int = 360) -> alt.TopLevelMixin:
    """Global samples/s per world size (bars) against ideal linear scaling from the first row
    (dashed line), each bar labelled with its efficiency: `bench.scaling(...).chart()` (faces/scaling.py)."""
    df = scaling.copy()
    base = df.iloc[0]
    df["ideal"] = df["world_size"] / base["world_size"] * (base["samples_per_s"] or 0.0)
    df["label"] = df["efficiency"].map(lambda e: "" if e is None or e != e else f"{e:.0%}")
    x = (alt.X("setup:O", sort=None, title="processes x strategy") if "setup" in df.columns
         else alt.X("world_size:O", title="processes (world_size)"))
    bars = alt.Chart(df).mark_bar(color=STATUS_COLORS["ok"]).encode(
        x=x, y=alt.Y("samples_per_s:Q", title="global samples/s"),
        tooltip=["world_size", alt.Tooltip("samples_per_s:Q", format=",.0f"),
                 alt.Tooltip("per_rank_samples_per_s:Q", format=",.0f"), alt.Tooltip("efficiency:Q", format=".0%"),
                 "threads_per_rank", *[c for c in ("peak_memory_mb", "model_state_mb") if c in df.columns], "status"])
    ideal = alt.Chart(df).mark_line(strokeDash=[4, 4], color=BASELINE_COLOR, point=True).encode(x=x, y="ideal:Q")
    text = alt.Chart(df).mark_text(dy=-8).encode(x=x, y="samples_per_s:Q", text="label:N")
    return (bars + ideal + text).properties(width=width, title="Scaling: measured (bars) vs linear (dashed)")
