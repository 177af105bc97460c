"""display.py: tables rounded, with units in the headers, the cached batch's loss marked; the one status
palette; the HTML of a TrialResult and a Comparison (plain data, drawn here)."""

from __future__ import annotations

import html
import re

import numpy as np
import pandas as pd
import pytest
from IPython.core.formatters import DisplayFormatter

import workbench as wb
from workbench.core import views
from workbench.core.measure import STATUSES, TrialResult
from workbench.faces.display import BASELINE_COLOR, STATUS_COLORS, comparison_html, tidy, trial_html
from workbench.results.stats import Comparison, estimate_noise


def cells(styler) -> list[str]:
    return re.findall(r">([^<>]+)</t[dh]>", styler.to_html())


def test_tidy_rounds_names_units_and_marks_the_cached_loss():
    df = pd.DataFrame({"label": ["baseline", "data=cached"], "samples_per_s": [4842.835992, 10000.1],
                       "speedup": [1.0, 2.0625], "final_loss": [0.85, 0.0612], "data": ["loader", "cached"],
                       "compile_s": [np.nan, None], "other": [1.123456, 2.0]})
    text = cells(tidy(df, ["label", "samples_per_s", "speedup", "final_loss", "compile_s", "other"]))
    assert text[:6] == ["label", "samples/s", "speedup ×", "final loss", "compile s", "other"]
    assert "4,842.8" in text and "2.06×" in text and "1.12" in text
    assert "0.8500" in text and "0.0612 (1 batch: not comparable)" in text  # from the full frame's data knob
    assert "–" in text and not any("4842.835992" in t or "nan" in t for t in text)


def test_tidy_refuses_what_it_cannot_show():
    with pytest.raises(TypeError, match="DataFrame"):
        tidy([1, 2])
    with pytest.raises(ValueError, match="no column"):
        tidy(pd.DataFrame({"a": [1]}), ["b"])


# ---- TrialResult and Comparison: plain data, drawn by display.py ----------------------------------------------
OK = TrialResult(knobs=wb.Knobs(num_workers=2), status="ok", samples_per_s=1234.5, step_time_s=0.0123,
                 step_time_iqr_s=0.001, data_wait_share=0.04, peak_memory_bytes=12_300_000,
                 losses=(2.0, 1.5), notes=("a <note>",), trial_id=3, trace_path="/tmp/t.pt.trace.json")
FAILED = TrialResult(knobs=wb.Knobs(), status="oom", message="out of memory in the model's forward")
# The cards as TrialResult._repr_html_ drew them before the HTML left core/measure.py (main cfcc669).
OK_CARD = '<div class="wb-trial" style="border-left:4px solid #4c78a8;padding:4px 10px;margin:4px 0"><b>Trial #3</b> <span style="background:#4c78a8;color:white;border-radius:3px;padding:0 6px">ok</span> <code>num_workers=2</code><table style="margin-top:4px"><tr><td style="color:#666;padding-right:1em">throughput</td><td>1,234.5 samples/s ±8%</td></tr><tr><td style="color:#666;padding-right:1em">median step</td><td>12.30 ms</td></tr><tr><td style="color:#666;padding-right:1em">data wait</td><td>4%</td></tr><tr><td style="color:#666;padding-right:1em">peak memory</td><td>12.3 MB</td></tr><tr><td style="color:#666;padding-right:1em">model state</td><td>n/a</td></tr><tr><td style="color:#666;padding-right:1em">final loss</td><td>1.5</td></tr><tr><td style="color:#666;padding-right:1em">trace</td><td>/tmp/t.pt.trace.json</td></tr></table><ul style="margin:2px 0;color:#555"><li>a &lt;note&gt;</li></ul></div>'
FAILED_CARD = '<div class="wb-trial" style="border-left:4px solid #b22222;padding:4px 10px;margin:4px 0"><b>Trial</b> <span style="background:#b22222;color:white;border-radius:3px;padding:0 6px">oom</span> <code>defaults</code><table style="margin-top:4px"><tr><td style="color:#666;padding-right:1em">peak memory</td><td>n/a</td></tr><tr><td style="color:#666;padding-right:1em">model state</td><td>n/a</td></tr></table><div style="color:#b22222">out of memory in the model&#x27;s forward</div></div>'
NOISE = estimate_noise([[100.0, 104.0], [200.0, 196.0]])
BY_TRIALS = Comparison(a=1, b=2, speedup=1.25, low=1.1, high=1.4, differs=True, a_trials=(1, 3), b_trials=(2, 4),
                       a_rates=(100.0, 101.5), b_rates=(125.0, 126.25), noise=NOISE)
INTERLEAVED = Comparison(a=1, b=2, speedup=1.01, low=0.97, high=1.06, differs=False,
                         a_rates=(100.0, 99.0, 101.0), b_rates=(101.0, 100.0), method="interleaved", turns=3,
                         turn_steps=2, seconds=4.0)


def notebook_html(obj) -> str | None:
    """What a Jupyter kernel sends for `obj` as a cell's value: IPython's formatter, text/html."""
    data, _ = DisplayFormatter().format(obj)
    return data.get("text/html")


def test_a_trial_renders_the_same_card_as_before_in_a_notebook():
    assert notebook_html(OK) == OK._repr_html_() == trial_html(OK) == OK_CARD
    assert notebook_html(FAILED) == FAILED_CARD
    assert "a &lt;note&gt;" in OK_CARD and "<note>" not in OK_CARD  # escaped
    assert STATUS_COLORS["ok"] in OK_CARD and STATUS_COLORS["oom"] in FAILED_CARD


def test_a_comparison_renders_the_same_html_as_before_in_a_notebook():
    """The layout of main cfcc669's Comparison._repr_html_, around the comparison's own sentences."""
    def before(c: Comparison, colour: str, rows: str) -> str:
        return (f'<p style="color:{colour}">{html.escape(str(c))}</p><table class="wb-comparison"><tr><th></th>'
                f"<th>trials</th><th>samples/s</th></tr>{rows}</table><p><small>{html.escape(str(c.noise))}</small></p>")

    trials = ("<tr><td>A</td><td>#1, #3</td><td>100.0, 101.5</td></tr>"
              "<tr><td>B</td><td>#2, #4</td><td>125.0, 126.2</td></tr>")
    turns = ("<tr><td>A</td><td>#1</td><td>3 turns, median 100.0</td></tr>"
             "<tr><td>B</td><td>#2</td><td>2 turns, median 100.5</td></tr>")
    assert BY_TRIALS.answer == "faster" and INTERLEAVED.answer == "undecided"
    assert notebook_html(BY_TRIALS) == comparison_html(BY_TRIALS) == before(BY_TRIALS, "#2e7d32", trials)
    assert notebook_html(INTERLEAVED) == INTERLEAVED._repr_html_() == before(INTERLEAVED, "#616161", turns)


def test_without_the_faces_the_data_shows_its_plain_text(monkeypatch):
    """core/ and results/ do not import the faces: with no view registered, Jupyter falls back to the repr."""
    monkeypatch.setattr(views, "HTML", {})
    assert OK._repr_html_() is None and BY_TRIALS._repr_html_() is None
    data, _ = DisplayFormatter().format(OK)
    assert "text/html" not in data and data["text/plain"] == repr(OK)
    assert repr(OK).startswith("<TrialResult#3 1,234.5 samples/s ±8% | step 12.3 ms")
    assert str(BY_TRIALS).startswith("#2 is 25.0% faster than #1")
    assert "oom" in repr(FAILED).lower() and "out of memory" in repr(FAILED)


def test_a_subclass_is_drawn_by_its_base_class_view():
    class Mine(TrialResult):
        pass

    assert views.html_view(Mine(knobs=wb.Knobs(), status="ok")) == trial_html(Mine(knobs=wb.Knobs(), status="ok"))
    assert views.html_view(object()) is None


# ---- one palette: the chart, the panel and the cards --------------------------------------------------------
def test_panel_chart_and_card_use_one_colour_per_status():
    from workbench.faces.charts import KIND_COLORS, KINDS, comparison_chart
    from workbench.faces.panel.view import status_html, table_html

    assert set(STATUS_COLORS) == set(STATUSES)
    assert len(set(STATUS_COLORS.values())) == len(STATUSES) and BASELINE_COLOR not in STATUS_COLORS.values()
    results = pd.DataFrame({"trial_id": range(1, 6), "label": list("abcde"), "status": ["ok", "oom", "error", "nan",
                            "interrupted"], "samples_per_s": [10.0, None, None, 9.0, None], "speedup": [1.0] * 5,
                            "verdict": [""] * 5, "baseline": [False] * 5})
    spec = comparison_chart(results).to_dict()
    scale = spec["vconcat"][0]["layer"][2]["encoding"]["color"]["scale"]
    chart = dict(zip(scale["domain"], scale["range"]))
    table = table_html(results)
    for status in STATUSES:
        colour = STATUS_COLORS[status]
        assert chart[status] == KIND_COLORS[KINDS.index(status)] == colour
        assert f"color:{colour}" in status_html(status, "x")
        assert f"color: {colour}" in table or f"color:{colour}" in table
        card = trial_html(TrialResult(knobs=wb.Knobs(), status=status, message="m"))
        assert f"border-left:4px solid {colour}" in card
    assert KIND_COLORS[KINDS.index("baseline")] == BASELINE_COLOR


def test_text_cells_are_escaped_in_the_panel_table_and_tidy():
    """A message such as "<class 'torch.Tensor'>" or a label with markup shows as text: never taken as HTML."""
    from workbench.faces.panel.view import table_html

    results = pd.DataFrame({"trial_id": [1, 2], "label": ["<b>bold</b> & co", "defaults"], "status": ["error", "ok"],
                            "samples_per_s": [None, 10.0], "speedup": [None, 1.0], "verdict": ["", "baseline"],
                            "message": ["expected <class 'torch.Tensor'>, got <script>x</script>", ""],
                            "baseline": [False, True]})
    for out in (table_html(results), tidy(results, ["label", "message", "samples_per_s"]).to_html()):
        assert "&lt;class &#39;torch.Tensor&#39;&gt;" in out
        assert "&lt;b&gt;bold&lt;/b&gt; &amp; co" in out and "<script>" not in out and "<b>bold" not in out
    assert "10.0" in tidy(results, ["samples_per_s"]).to_html()  # figures keep their format


def test_the_card_the_budget_notes_and_the_table_label_a_trial_alike(make_bench):
    """One label rule (issue 50): knobs against the workbench's defaults, on the trial's card, in the budget's
    notes and in the results table (Knobs() would say `batch_size=8` where the table says `defaults`)."""
    from workbench.deciding.budget import _label

    bench = make_bench()  # defaults: batch_size=8
    r = bench.run(progress=False)
    table = bench.results.set_index("trial_id").loc[r.trial_id, "label"]
    assert table == "defaults" and f"<code>{table}</code>" in trial_html(r)
    assert _label(bench.defaults, bench.run) == "defaults"
    assert _label(bench.knobs(channels_last=True), bench.run) == "channels_last"
    assert _label(bench.defaults, lambda k: None) == "batch_size=8"  # a bare callable: against Knobs()
