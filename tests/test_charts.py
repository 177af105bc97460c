"""charts.py: DataFrame -> altair, checked on a synthetic log (fast, deterministic) and one real bench."""

from __future__ import annotations

import json

import altair as alt
import numpy as np
import pytest
import torch

import workbench as wb
from workbench.core.knobs import knob_names
from workbench.faces.charts import (
    EMPTY_TEXT,
    PICK,
    chart_data,
    chart_frame,
    chart_title,
    comparison_chart,
    on_trial_pick,
    picked_trial,
)
from workbench.results import ResultLog


def fake(knobs: wb.Knobs, status: str = "ok", step_ms: float = 10.0, spread: float = 0.02) -> wb.TrialResult:
    """A TrialResult with 30 step times around `step_ms` (no torch run needed)."""
    if status in ("error", "oom", "interrupted"):
        return wb.TrialResult(knobs=knobs, status=status, message=f"{status} in the model's forward")
    rng = np.random.default_rng(int(step_ms * 100))
    times = tuple(float(t) for t in step_ms / 1e3 * (1 + spread * rng.standard_normal(30)))
    bs = knobs.batch_size
    return wb.TrialResult(
        knobs=knobs, status=status, samples_per_s=bs / float(np.mean(times)), step_time_s=float(np.median(times)),
        step_time_iqr_s=float(np.subtract(*np.quantile(times, [0.75, 0.25]))), step_times_s=times,
        data_wait_s=tuple(0.1 * t for t in times), data_wait_share=0.1, peak_memory_bytes=5_000_000,
        samples_per_step=bs, losses=(1.0,) * 30, message="" if status == "ok" else "loss became nan",
    )


@pytest.fixture
def log() -> ResultLog:
    log = ResultLog(None)
    log.append(fake(wb.Knobs(), step_ms=10))
    log.append(fake(wb.Knobs(num_workers=2), step_ms=6))
    log.append(fake(wb.Knobs(amp="fp16"), status="nan", step_ms=12))
    log.append(fake(wb.Knobs(batch_size=4096), status="oom"))
    log.append(fake(wb.Knobs(compile="default"), status="interrupted"))
    return log


def test_chart_frame_marks_baseline_failures_and_order(log: ResultLog) -> None:
    df = chart_frame(log.frame())
    assert list(df["trial_id"]) == [1, 2, 3, 4, 5]
    assert list(df["kind"]) == ["baseline", "ok", "nan", "oom", "interrupted"]
    assert df["trial"].iloc[1] == "#2 num_workers=2"  # labelled by what differs from the defaults
    assert df.loc[df["kind"] == "oom", "throughput"].item() == 0.0  # a failure still gets a mark, on zero
    assert df["throughput"].iloc[1] > df["throughput"].iloc[0]


def test_comparison_chart_has_band_baseline_linked_views_and_full_tooltip(log: ResultLog) -> None:
    spec = comparison_chart(log.frame()).to_dict()
    assert len(spec["vconcat"]) == 3  # throughput, peak memory, data wait
    throughput = spec["vconcat"][0]["layer"]
    marks = [layer["mark"]["type"] for layer in throughput]
    assert marks == ["rule", "rule", "point", "text", "text"]  # band, baseline, trials, failure and "not steady" labels
    band = throughput[0]["encoding"]
    # the band is the throughput's (samples/s here; tokens/s for token batches: tests/test_hf.py)
    assert band["y"]["field"] == "throughput_low" and band["y2"]["field"] == "throughput_high"
    assert "baseline" in json.dumps(throughput[1]["transform"])
    # one click selection, used by all three views (linked)
    (pick,) = [p for p in spec["params"] if "select" in p]  # hoisted to the top, bound to the points view
    assert [p["name"] for p in spec["params"] if "select" not in p] == ["wb_title"]  # the title, a parameter
    assert pick["name"] == "trial_pick" and pick["views"] == [throughput[2]["name"]]
    for view in (throughput[2], spec["vconcat"][1], spec["vconcat"][2]):
        assert "trial_pick" in json.dumps(view["encoding"]["opacity"])
    tooltip = {t["field"] for t in throughput[2]["encoding"]["tooltip"]}
    assert set(knob_names()) <= tooltip
    assert {"speedup", "verdict", "status", "samples_per_s"} <= tooltip


def test_chart_data_has_one_row_per_trial(log: ResultLog) -> None:
    chart = comparison_chart(log.frame())
    rows = chart_data(chart)
    assert list(rows["trial_id"]) == [1, 2, 3, 4, 5]
    assert list(chart_data(chart.to_dict())["trial_id"]) == [1, 2, 3, 4, 5]
    with pytest.raises(TypeError, match="altair chart"):
        chart_data(42)


def test_empty_results_give_a_placeholder_not_an_error() -> None:
    chart = comparison_chart(ResultLog(None).frame())
    spec = chart.to_dict()
    assert spec["mark"]["type"] == "text" and EMPTY_TEXT in json.dumps(spec)
    assert chart_data(chart).empty


def test_chart_exports_html_and_png(log: ResultLog, tmp_path) -> None:
    chart = comparison_chart(log.frame())
    chart.save(tmp_path / "runs.html")
    html = (tmp_path / "runs.html").read_text()
    assert "vega" in html and "#2 num_workers=2" in html
    chart.save(tmp_path / "runs.png")  # rendered by vl-convert, no browser
    assert (tmp_path / "runs.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_chart_is_the_comparison_chart_of_its_results(tmp_path) -> None:
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))
    bench = wb.Workbench(torch.nn.Linear(8, 3), data, loss_fn=torch.nn.CrossEntropyLoss(),
                         optimizer=lambda p: torch.optim.SGD(p, lr=0.1), log=None, steps=3, warmup_steps=1,
                         knobs=wb.Knobs(batch_size=8))
    bench.run()
    bench.run(batch_size=16)
    chart = bench.chart()
    assert isinstance(chart, alt.VConcatChart)
    assert chart.to_dict() == comparison_chart(bench.results).to_dict()
    assert list(chart_data(chart)["label"]) == ["defaults", "batch_size=16"]
    assert list(chart_data(chart)["baseline"]) == [True, False]


def _click(jchart, trial_id):
    """What the JupyterChart front-end sends when a point is clicked (None: double-click clears)."""
    value = None if trial_id is None else {"vlPoint": {"or": [{"trial_id": trial_id}]}}
    jchart._vl_selections = {PICK: {"value": value, "store": []}}


def test_clicking_a_point_reports_its_trial_id_across_redraws(log: ResultLog) -> None:
    jchart = alt.JupyterChart(comparison_chart(log.frame()))
    picked = []
    detach = on_trial_pick(jchart, picked.append)
    _click(jchart, 2)
    jchart.chart = comparison_chart(log.frame())  # a redraw (the panel does this after every trial)
    _click(jchart, 3)
    _click(jchart, None)
    assert picked == [2, 3, None]
    detach()
    _click(jchart, 1)
    assert picked == [2, 3, None]


def test_picked_trial_reads_point_selections() -> None:
    assert picked_trial([{"trial_id": 4}]) == 4
    assert picked_trial([]) is None and picked_trial(None) is None


# ---- a long log: the default view, the stated total, data updates --------------------------------
def long_results(n: int = 120) -> ResultLog:
    log = ResultLog(None)
    for i in range(n):
        log.append(fake(wb.Knobs(batch_size=8 * (1 + i % 4)), step_ms=10.0 + (i % 7)))
    return log


def test_the_default_view_is_baseline_recent_and_best_of_each_configuration():
    from workbench.faces.charts import LAST_N, chart_view

    df = long_results().frame()
    view = chart_view(df)
    ids = set(view["trial_id"])
    assert 1 in ids  # the baseline
    assert set(df["trial_id"].iloc[-LAST_N:]) <= ids  # the last N
    for _, g in df.groupby("label"):  # the best of each configuration
        assert g.loc[g["samples_per_s"].idxmax(), "trial_id"] in ids
    assert len(view) < len(df) and view.attrs["total"] == len(df)
    assert list(view["trial_id"]) == sorted(ids)
    assert len(chart_view(df, last=None)) == len(df)
    with pytest.raises(ValueError, match="last"):
        chart_view(df, last=-1)


def test_the_chart_states_the_total_and_draws_all_on_request():
    df = long_results().frame()
    spec = comparison_chart(df).to_dict()
    drawn = chart_data(spec)
    assert len(drawn) < len(df) and f"{len(drawn)} of {len(df)} trials" in chart_title(spec)
    assert "last=None" in chart_title(spec)
    everything = comparison_chart(df, last=None).to_dict()
    assert len(chart_data(everything)) == len(df) and chart_title(everything) == f"{len(df)} trials"


def test_update_chart_replaces_only_the_data_and_the_title():
    from workbench.faces.charts import update_chart

    log = long_results(10)
    jc = alt.JupyterChart(comparison_chart(ResultLog(None).frame()))
    sent = []  # what the kernel sends the page: never the whole spec (a re-embed) on a data update
    send = jc.send_state
    jc.send_state = lambda key=None: (sent.append(key), send(key))[1]
    assert not update_chart(jc, log.frame())  # from the empty placeholder: a new chart
    charts = []
    jc.observe(lambda change: charts.append(change), names="chart")
    before = jc.spec
    for _ in range(3):
        log.append(fake(wb.Knobs(batch_size=24), step_ms=9.0))
        assert update_chart(jc, log.frame())
    assert charts == []  # no new altair chart per trial
    assert len(chart_data(jc)) == 13 and "13 trials" in chart_title(jc.spec)
    assert "spec" not in sent[-6:] and sent[-2:] == ["_py_to_js_updates", "_params"]
    assert len(jc._py_to_js_updates[0]["value"]) == 13 and jc.params.wb_title == chart_title(jc.spec)
    strip = ("datasets", "params")
    assert {k: v for k, v in jc.spec.items() if k not in strip} == {k: v for k, v in before.items() if k not in strip}
    fresh = comparison_chart(log.frame()).to_dict()  # the same picture a new chart would give
    assert chart_data(fresh).equals(chart_data(jc))


def test_legend_is_titled_for_what_it_shows_and_lists_only_kinds_that_occurred() -> None:
    log = ResultLog(None)
    log.append(fake(wb.Knobs(), step_ms=10))
    log.append(fake(wb.Knobs(num_workers=2), step_ms=6))
    log.append(fake(wb.Knobs(amp="fp16"), status="nan", step_ms=12))
    spec = comparison_chart(log.frame()).to_dict()
    top = spec["vconcat"][0]["layer"]
    scales = [e["scale"] for layer in top for key, e in layer.get("encoding", {}).items() if key in ("color", "shape")]
    assert scales and all(s["domain"] == ["baseline", "ok", "nan"] for s in scales)  # no error/oom/interrupted
    legends = [e["legend"]["title"] for layer in top for key, e in layer.get("encoding", {}).items()
               if key == "color" and e.get("legend")]
    assert legends and set(legends) == {"trial (baseline or status)"}
    title = spec["vconcat"][0]["title"]  # the marks colour and shape do not name: the subtitle says what they are
    assert title["text"] == "Throughput per trial" and any("band" in line and "repeat" in line for line in title["subtitle"])
    assert any("dashed line: the baseline" in line and "cross on zero" in line for line in title["subtitle"])


def test_a_new_kind_of_trial_rebuilds_the_legend_instead_of_swapping_data():
    from workbench.faces.charts import update_chart

    log = long_results(5)
    jc = alt.JupyterChart(comparison_chart(log.frame()))
    log.append(fake(wb.Knobs(batch_size=24), step_ms=9.0))
    assert update_chart(jc, log.frame())  # same kinds: a data update
    log.append(fake(wb.Knobs(amp="fp16"), status="nan", step_ms=12))
    assert not update_chart(jc, log.frame())  # a nan trial: the legend must list it, so a new chart
    domains = [e["scale"]["domain"] for layer in jc.spec["vconcat"][0]["layer"]
               for key, e in layer.get("encoding", {}).items() if key == "color"]
    assert domains and all("nan" in d for d in domains)


def test_a_trial_that_was_not_steady_is_marked_on_the_chart():
    from dataclasses import replace

    log = ResultLog(None)
    log.append(fake(wb.Knobs(), step_ms=10))
    log.append(replace(fake(wb.Knobs(num_workers=2), step_ms=5), extra={"steady": False}))
    data = chart_frame(log.frame())
    assert list(data["steady"]) == [None, False]
    spec = json.dumps(comparison_chart(log.frame()).to_dict())
    assert "datum.steady === false" in spec and "not steady" in spec
