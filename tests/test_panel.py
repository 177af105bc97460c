"""panel.py driven from Python the way a user drives it in the browser: set a widget, wait, look.

Tiny trials (3 measured steps, 1 warm-up) on a tiny model; a "sleepy" dataset makes trials long
enough to stop or to change knobs during. No assertion depends on timing.
"""

from __future__ import annotations

import dataclasses
import html
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

import workbench as wb
from workbench.core.knobs import knob_names
from workbench.faces import panel as panel_module
from workbench.faces.charts import chart_data, chart_title
from workbench.faces.panel import GROUPS, Panel, mixed_threads_html
from workbench.results.stats import ANSWER_WORDS, MIN_EFFECT

ROOT = Path(__file__).resolve().parents[1]
WAIT_S = 120  # generous: other work shares the 2 cores; only a hang fails


class Blocks(nn.Module):
    """Linear in, two blocks in a ModuleList (checkpointing candidates), linear out."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16)) for _ in range(2))
        self.out = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 7:
            raise RuntimeError("batches of seven are not supported")  # a user bug the panel must report
        h = self.inp(x)
        for b in self.blocks:
            h = h + b(h)
        return self.out(h)


class Sleepy(Dataset):
    """1 ms per sample: a trial of 8-sample batches takes ~10 ms a step, long enough to interrupt."""

    def __init__(self, n: int = 256) -> None:
        self.x, self.y = torch.randn(n, 8), torch.randint(0, 3, (n,))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        time.sleep(0.001)
        return self.x[i], self.y[i]


def make_bench(data=None, *, log=None, steps: int = 3) -> wb.Workbench:
    data = data if data is not None else TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))
    return wb.Workbench(Blocks(), data, loss_fn=nn.CrossEntropyLoss(), optimizer=lambda p: torch.optim.SGD(p, lr=0.05),
                        log=log, steps=steps, warmup_steps=1, knobs=wb.Knobs(batch_size=8), name="blocks")


@pytest.fixture
def bench() -> wb.Workbench:
    return make_bench()


@pytest.fixture
def panel(bench: wb.Workbench):
    p = Panel(bench, debounce_s=0.05)
    yield p
    p.close()


def phase(p: Panel) -> str:
    return p.status.value.split('data-phase="')[1].split('"')[0]


def test_controls_cover_every_knob_grouped_with_blocks(panel: Panel, bench: wb.Workbench) -> None:
    grouped = [name for names in GROUPS.values() for name in names]
    assert sorted(grouped) == sorted(knob_names())
    assert list(GROUPS) == ["Data pipeline", "Precision & compile", "Memory", "CPU", "Distributed"]
    for name, widget in panel.controls.items():
        assert widget.description == name
    assert set(panel.controls) == set(knob_names()) - {"checkpoint"}
    assert list(panel.block_boxes) == list(bench.blocks) == ["blocks.0", "blocks.1"]
    n = bench.blocks["blocks.0"]
    assert f"{n:,} params" in panel.block_boxes["blocks.0"].description
    assert panel.knobs() == bench.defaults


def test_your_own_knob_gets_a_control_in_its_own_group(bench: wb.Workbench) -> None:
    @wb.knob(choices=["naive", "sdpa"], default="naive", help="attention implementation")
    def attention(model, value):
        model.attention = value

    try:
        p = Panel(bench, debounce_s=0.05)
        try:
            assert p.knob_controls.groups["Your knobs"] == ["attention"]
            w = p.controls["attention"]
            assert w.description == "attention" and w.tooltip == "attention implementation"
            assert [v for _, v in w.options] == ["naive", "sdpa"]
            w.value = "sdpa"
            assert p.knobs() == bench.defaults.replace(attention="sdpa")
        finally:
            p.close()
    finally:
        wb.forget_knob("attention")


def test_noop_knobs_are_disabled_with_the_reason(bench: wb.Workbench) -> None:
    panel = Panel(bench, debounce_s=3600)  # changes queue but never start: this test only reads widgets
    pin = panel.controls["pin_memory"]
    assert pin.disabled and "no-op" in pin.tooltip  # CPU: nothing is copied to a device
    assert panel.controls["channels_last"].disabled  # no Conv2d in this model
    persistent = panel.controls["persistent_workers"]
    assert persistent.disabled and "num_workers" in persistent.tooltip
    panel.controls["num_workers"].value = 1
    assert not persistent.disabled and not panel.controls["prefetch_factor"].disabled
    threads = panel.controls["cpu_threads"]
    assert threads.label == "default" and panel.knobs().cpu_threads is None  # None shows as "default"
    threads.value = 1
    assert panel.knobs().cpu_threads == 1
    panel.controls["data"].value = "cached"  # one batch on the device: workers have nothing to do
    assert panel.controls["num_workers"].disabled
    assert panel.knobs().num_workers == 0 and panel.knobs().data == "cached"
    panel.close()
    assert bench.trials == []


@pytest.mark.worker  # as users run it: the DataLoader's worker forks from the worker process's main thread
def test_widget_change_runs_a_trial_and_grows_chart_and_table(panel: Panel, bench: wb.Workbench) -> None:
    assert chart_data(panel.chart).empty and "No trials yet" in panel.table.value
    panel.controls["num_workers"].value = 1
    assert panel.wait(WAIT_S)
    (result,) = bench.trials
    assert result.ok and result.knobs.num_workers == 1
    assert list(chart_data(panel.chart)["trial_id"]) == [1]
    assert "wb-results" in panel.table.value and "samples/s" in panel.table.value  # display.FORMATS' header
    assert phase(panel) == "ok" and "#1" in panel.status.value
    assert panel.progress.value == panel.progress.max == 4  # 1 warm-up + 3 measured steps
    assert panel.rate.value == "4/4 steps" and panel.stop_button.button_style == ""  # finished, nothing to stop
    panel.block_boxes["blocks.1"].value = True
    assert panel.wait(WAIT_S)
    assert bench.trials[-1].knobs.checkpoint == ("blocks.1",)
    assert list(chart_data(panel.chart)["trial_id"]) == [1, 2]
    assert [v for _, v in panel.trial_pick.options] == [2, 1]  # newest first


@pytest.mark.worker  # as users run it: the DataLoader's worker forks from the worker process's main thread
def test_three_rapid_changes_coalesce_and_measure_the_last_config(bench: wb.Workbench) -> None:
    p = Panel(bench, debounce_s=0.3)
    try:
        p.controls["batch_size"].value = 16
        p.controls["num_workers"].value = 1
        p.controls["batch_size"].value = 12
        assert p.wait(WAIT_S)
        assert 1 <= len(bench.trials) <= 2
        assert bench.trials[-1].knobs == wb.Knobs(batch_size=12, num_workers=1)
    finally:
        p.close()


def test_changes_during_a_run_coalesce_latest_wins() -> None:
    bench = make_bench(Sleepy(), steps=30)
    p = Panel(bench, debounce_s=0.0)
    try:
        p.run_button.click()
        _wait_for(lambda: phase(p) == "measuring")
        for bs in (10, 12, 16):  # all while trial #1 runs
            p.controls["batch_size"].value = bs
        assert p.wait(WAIT_S)
        assert [t.knobs.batch_size for t in bench.trials] == [8, 16]
        assert all(t.ok for t in bench.trials)
    finally:
        p.close()


def test_stop_interrupts_the_running_trial_and_panel_stays_usable() -> None:
    bench = make_bench(Sleepy(), steps=200)
    p = Panel(bench, debounce_s=0.0)
    try:
        p.run_button.click()
        _wait_for(lambda: phase(p) == "measuring")
        p.stop_button.click()
        assert p.wait(WAIT_S)
        (r,) = bench.trials
        assert r.status == "interrupted" and "stopped" in r.message
        assert phase(p) == "interrupted" and "INTERRUPTED" in p.status.value
        assert chart_data(p.chart)["kind"].tolist() == ["interrupted"]
        bench.steps = 3  # the next trial runs normally
        p.controls["batch_size"].value = 16
        assert p.wait(WAIT_S) and bench.trials[-1].ok
    finally:
        p.close()


def test_failure_shows_status_and_message_never_a_traceback(panel: Panel, bench: wb.Workbench) -> None:
    panel.controls["batch_size"].value = 7
    assert panel.wait(WAIT_S)
    (r,) = bench.trials
    assert r.status == "error" and "Traceback" in r.traceback
    assert phase(panel) == "error" and "batches of seven" in panel.status.value
    assert "Traceback" not in panel.status.value and "Traceback" not in panel.table.value
    assert chart_data(panel.chart)["kind"].tolist() == ["error"]


def test_programmatic_runs_land_in_the_same_chart_and_table(panel: Panel, bench: wb.Workbench) -> None:
    bench.run()
    bench.run(batch_size=16)
    assert list(chart_data(panel.chart)["label"]) == ["defaults", "batch_size=16"]
    assert "batch_size=16" in panel.table.value
    assert not panel.busy  # a run from code does not queue a panel trial
    assert "wb-mixed-threads" not in panel.table.value  # every trial from a cell: nothing mixed
    panel.controls["batch_size"].value = 12  # a trial on the panel's thread
    assert panel.wait(WAIT_S)
    assert panel.started_here == {bench.trials[-1].trial_id}
    assert "wb-mixed-threads" in panel.table.value and "ten percent" in panel.table.value
    assert mixed_threads_html(bench.results, panel.started_here, "cuda") == ""  # the OpenMP and arena effect: CPU


@pytest.mark.slow
def test_set_baseline_and_repeat_to_confirm(panel: Panel, bench: wb.Workbench) -> None:
    bench.run()
    bench.run(batch_size=32)
    panel.trial_pick.value = 2
    panel.repeat_rounds = 2  # rounds="auto", at most 2 rounds here (8 by default)
    panel.repeat_button.click()
    assert panel.wait(WAIT_S)
    rep = panel.last_repeat
    assert rep is not None and rep["trial_id"] == 2 and rep["baseline_id"] == 1
    c = rep["comparison"]  # what the panel keeps and shows is the comparison's own answer, and it is coherent
    if c.method == "interleaved":  # batch_size can take turns in one process: no new trials, blocks instead
        assert c.turns >= 2 and len(bench.trials) == 2 and "interleaved turns" in panel.status.value
    else:
        n = rep["rounds"]
        assert 1 <= n <= 2 and len(c.a_rates) == len(c.b_rates) == 1 + n
        # alternating rounds after the original A B (back to back, so it is the first pair): B A, then A B
        assert [t.knobs.batch_size for t in bench.trials[2:]] == [32, 8, 8, 32][: 2 * n]
        assert n == 2 or rep["answer"] != "undecided"  # it stops early only when decided
    assert (rep["confirmed"], rep["answer"]) == (c.verdict, c.answer)
    assert {"faster": c.low > 1, "slower": c.high < 1, "same": c.same, "undecided": c.low <= 1 <= c.high or abs(c.speedup - 1) < MIN_EFFECT}[c.answer], c
    assert html.escape(str(c)) in panel.verdict.value and ANSWER_WORDS[c.answer] in panel.status.value
    assert "Repeat to confirm #2" in panel.verdict.value
    panel.trial_pick.value = 2
    panel.baseline_button.click()
    assert bench.baseline.trial_id == 2
    assert chart_data(panel.chart).set_index("trial_id").loc[2, "kind"] == "baseline"


def test_restart_safe_a_new_panel_shows_the_logged_trials(tmp_path) -> None:
    first = make_bench(log=tmp_path)
    first.run()
    first.run(batch_size=16)
    again = make_bench(log=tmp_path)  # a "restarted kernel": same log file
    p = Panel(again)
    try:
        assert list(chart_data(p.chart)["trial_id"]) == [1, 2]
        assert "batch_size=16" in p.table.value
    finally:
        p.close()


def test_a_new_panel_replaces_the_old_one_on_the_same_bench(bench: wb.Workbench) -> None:
    old = Panel(bench)
    new = Panel(bench)
    try:
        _wait_for(lambda: not old.queue.thread.is_alive())
        bench.run()
        assert chart_data(old.chart).empty and len(chart_data(new.chart)) == 1
    finally:
        new.close()


def test_terminal_fallback_explains_itself(bench: wb.Workbench, capsys) -> None:
    assert bench.panel() is None  # pytest has no IPython kernel
    out = capsys.readouterr().out
    assert "bench.run(" in out and "bench.results" in out


@pytest.mark.slow
def test_core_imports_and_runs_without_ipywidgets_or_altair() -> None:
    code = textwrap.dedent("""
        import sys
        sys.modules["ipywidgets"] = None
        sys.modules["altair"] = None
        import torch, workbench as wb
        from workbench.faces import panel
        b = wb.Workbench(torch.nn.Linear(4, 2), torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,))),
                         loss_fn=torch.nn.CrossEntropyLoss(), optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
                         log=None, steps=2, warmup_steps=0, knobs=wb.Knobs(batch_size=4))
        assert b.run().ok
        panel.has_frontend = lambda: True  # pretend a notebook: the missing widgets name the install
        try:
            b.panel()
        except ModuleNotFoundError as e:
            print(e)
        assert "ipywidgets" not in sys.modules or sys.modules["ipywidgets"] is None
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert 'pip install "tuning-workbench[notebook]"' in out.stdout


def test_has_frontend_is_false_outside_a_kernel() -> None:
    assert panel_module.has_frontend() is False


def _wait_for(cond, timeout: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)
    return True


def test_a_chart_click_explains_the_trial_against_the_baseline(panel: Panel, bench: wb.Workbench) -> None:
    bench.run(trace=True, progress=False)
    bench.run(batch_size=16, progress=False)  # no trace: a click reads traces only, it runs nothing
    panel._on_chart_pick(2)
    assert panel.trial_pick.value == 2 and "no trace" in panel.explanation.value and len(bench.trials) == 2
    panel.explain_button.click()  # the button may trace a repeat of #2
    assert panel.wait(WAIT_S)
    assert len(bench.trials) == 3 and bench.trials[-1].trace_path
    assert "#2 explained against baseline #1" in panel.explanation.value
    assert "backward" in panel.explanation.value and "aten::" in panel.explanation.value
    panel._on_chart_pick(3)  # both traced now: explained on the spot
    assert "#3 explained against baseline #1" in panel.explanation.value and len(bench.trials) == 3


def test_a_long_log_updates_the_chart_data_and_shows_the_default_view(bench):
    """200 trials: each new one reaches the chart as new data in the same chart; the chart, table
    and picker hold the baseline, the recent trials and the best of each configuration."""
    from workbench.faces.charts import LAST_N

    first = bench.trials[0] if bench.trials else bench.run()
    for i in range(200):
        bench.log.append(dataclasses.replace(first, samples_per_s=(first.samples_per_s or 1.0) * (1 + 0.001 * i),
                                             knobs=first.knobs.replace(batch_size=8 + i % 5)))
    p = Panel(bench)
    try:
        redraws = []
        p.chart.observe(lambda change: redraws.append(change), names="chart")
        last = bench.log.append(dataclasses.replace(first, knobs=first.knobs.replace(batch_size=9)))
        drawn = chart_data(p.chart)
        assert last.trial_id in set(drawn["trial_id"]) and redraws == []  # a data update, not a new chart
        assert LAST_N <= len(drawn) < len(bench.trials)
        assert f"of {len(bench.trials)} trials" in chart_title(p.chart.spec)
        assert len(p.trial_pick.options) == len(drawn)
        assert p.table.value.count("<tr") == len(drawn) + 1  # a header row and one per trial drawn
    finally:
        p.close()


@pytest.mark.worker  # the tuner races num_workers: its DataLoader forks from the worker's main thread, as users run
def test_tune_button_tunes_within_the_budget_and_says_the_seconds_left(panel: Panel, bench: wb.Workbench,
                                                                       monkeypatch) -> None:
    shown = []
    real = panel._set_status
    monkeypatch.setattr(panel, "_set_status", lambda phase_, text: (shown.append(text), real(phase_, text)))
    panel.budget_box.value = 4
    panel.tune_button.click()
    assert panel.wait(WAIT_S)
    t = panel.last_tune
    assert t is not None and t.budget_s == 4 and t.spent is not None and bench.trials
    assert phase(panel) == "ok" and "tuned in" in panel.status.value and "budget:" in panel.status.value
    assert any(" s of 4 s left" in text for text in shown)  # the labels counted the budget down
    assert "<pre>" in panel.verdict.value  # the TuneResult, shown under the chart


def test_stop_ends_a_tune_and_the_panel_says_so() -> None:
    bench = make_bench(Sleepy(), steps=200)
    p = Panel(bench, debounce_s=0.0)
    try:
        p.tune(60)
        _wait_for(lambda: phase(p) == "measuring")
        p.stop_button.click()
        assert p.wait(WAIT_S)
        assert bench.trials[-1].status == "interrupted" and "stopped by the user" in bench.trials[-1].message
        assert phase(p) == "interrupted" and "tune stopped by the user" in p.status.value and p.last_tune is None
    finally:
        p.close()


def test_a_trial_stopping_early_says_so_with_the_seconds_left(panel: Panel) -> None:
    panel._countdown.start(60.0)
    panel._progress("stopping early: clearly slower", 5, 10)
    assert "stopping early: clearly slower" in panel.status.value and "s of 60 s left" in panel.status.value
    panel._countdown.stop()
    panel._progress("measuring", 6, 10)
    assert "left" not in panel.status.value


def test_a_tune_trial_stops_at_the_deadline_or_at_stop() -> None:
    import threading

    from workbench.deciding.budget import Deadline
    from workbench.faces.panel.tuning import Either

    stop = threading.Event()
    deadline = Deadline(60.0, "stopped by the budget")
    either = Either(deadline, stop)
    assert not either.is_set() and either.reason == ""
    stop.set()
    assert either.is_set() and either.reason == ""  # the user's stop
    deadline.expire()
    assert Either(deadline, threading.Event()).reason == "stopped by the budget"
    deadline.cancel()


def test_distributed_options_fold_away_at_one_process(bench: wb.Workbench) -> None:
    """Issue 40: at world_size=1 the DDP/FSDP2 options sit in a collapsed accordion (world_size stays in view);
    raising world_size opens it, lowering it folds it again."""
    p = Panel(bench, debounce_s=3600)  # changes queue but never start
    try:
        acc = p.knob_controls.distributed
        assert acc.selected_index is None and p.knob_controls.boxes["world_size"] not in acc.children[0].children
        assert p.knob_controls.boxes["ddp_static_graph"] in acc.children[0].children
        pin = p.knob_controls.boxes["pin_memory"]  # the page's title attribute: the reason shows on hover
        assert pin.tooltip.startswith("disabled:") and pin.tooltip == p.controls["pin_memory"].tooltip
        p.controls["world_size"].value = 2
        assert acc.selected_index == 0
        p.controls["world_size"].value = 1
        assert acc.selected_index is None
        assert "warm-up until steady" in p.widget.children[0].value and "5 warm-up" not in p.widget.children[0].value
    finally:
        p.close()


def test_the_result_line_and_the_table_agree_on_a_trial(bench: wb.Workbench) -> None:
    """Issue 40 (docs/panel.png said 0.83x in the line, 0.97x in the table): the line reads the trial's row,
    which pools every repeat of each side's knobs, so both show one speedup and one verdict."""
    from workbench.faces.panel.view import noise_html, result_line

    bench.run(progress=False)
    bench.run(progress=False, batch_size=16)
    bench.run(progress=False)
    r = bench.run(progress=False, batch_size=16)
    row = bench.results.set_index("trial_id").loc[r.trial_id]
    line = result_line(r, bench)
    assert f"{row['speedup']:.2f}× baseline ({row['verdict']})" in line and row["label"] in line
    assert "(the baseline)" in result_line(bench.trials[0], bench)
    loud = dataclasses.replace(bench.noise, adjacent=0.5, adjacent_pairs=2)
    assert "Too noisy" in noise_html(loud, []) and "±" not in noise_html(loud, [])


@pytest.mark.worker
def test_in_the_worker_process_stop_stops_the_kernel_stays_free_and_nothing_mixes() -> None:
    """The default place of trials: the panel's trial and a cell's both run in the worker, on one thread
    (no mixed-threads line); Stop ends the panel's trial, and the kernel runs its own code meanwhile."""
    bench = make_bench(Sleepy(), steps=200)
    p = Panel(bench, debounce_s=0.0)
    try:
        assert bench.trials_in == "worker"
        p.run_button.click()
        _wait_for(lambda: phase(p) == "measuring")
        t0 = time.monotonic()
        x = sum(i * i for i in range(200_000))  # the kernel's main thread is free while the trial runs
        assert x > 0 and time.monotonic() - t0 < 5 and p.busy
        p.stop_button.click()
        assert p.wait(WAIT_S)
        (r,) = bench.trials
        assert r.status == "interrupted" and "stopped" in r.message
        bench.steps = 3
        p.controls["batch_size"].value = 16
        assert p.wait(WAIT_S) and bench.trials[-1].ok
        bench.run(progress=False)
        assert set(bench.results["ran_in"]) == {"worker"} and "wb-mixed-threads" not in p.table.value
    finally:
        p.close()
