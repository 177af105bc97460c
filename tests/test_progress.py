"""Progress that behaves: tqdm bars polled from their own thread at <= 4 Hz, off with
progress=False, absent when stderr is not a terminal; search bars count trials."""

import threading
import time

import pytest

from workbench.core import progress as P


def test_auto_means_a_terminal_or_a_notebook(monkeypatch):
    monkeypatch.setattr(P, "_in_notebook", lambda: False)
    monkeypatch.setattr(P, "_stderr_is_terminal", lambda: False)
    assert P.wanted(None) is False and P.wanted(True) is True and P.wanted(False) is False
    monkeypatch.setattr(P, "_stderr_is_terminal", lambda: True)
    assert P.wanted(None) is True


def test_bar_is_fed_by_the_poller_thread_at_most_4_hz(make_bench, monkeypatch):
    calls: list[tuple[str, float, str]] = []
    real_call = P.TrialBar.__call__

    def spy(self, phase, done, total):
        calls.append((threading.current_thread().name, time.monotonic(), phase))
        real_call(self, phase, done, total)

    monkeypatch.setattr(P.TrialBar, "__call__", spy)
    bench = make_bench(steps=60)
    t0 = time.monotonic()
    r = bench.run(progress=True)
    wall = time.monotonic() - t0
    assert r.ok
    # never the trial thread: the poller's, plus the final report from the caller when it stops
    assert {name for name, _, _ in calls} <= {"workbench-progress", threading.current_thread().name}
    assert not any(name.startswith("workbench-trial") for name, _, _ in calls)
    assert len(calls) <= wall * P.HZ + 2, (len(calls), wall)  # throttled, not one write per step
    assert calls[-1][2] == "done"


def test_progress_false_writes_nothing(make_bench, capfd):
    bench = make_bench()
    bench.run(progress=False)
    assert capfd.readouterr().err == ""


def test_a_callable_is_polled_off_the_trial_thread_and_sees_the_end(make_bench):
    import threading

    seen = []
    make_bench().run(progress=lambda phase, done, total: seen.append((phase, done, total, threading.current_thread().name)))
    assert seen[-1][:1] == ("done",) and seen[-1][1] == seen[-1][2]
    assert not any(name.startswith("workbench-trial") for *_, name in seen)  # never the measured loop's thread


@pytest.fixture
def search_bars(monkeypatch):
    """Every SearchBar made during the test, in order."""
    made = []
    real_init = P.SearchBar.__init__

    def spy(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(P.SearchBar, "__init__", spy)
    return made


def test_search_bar_counts_trials_and_note_shows_the_analysis(make_bench, search_bars):
    made = search_bars
    bench = make_bench()
    bench.tune(n_trials=2, progress=True, stages=("data",))
    (bar,) = made
    assert bar.bar.n == len(bench.trials) == len(bar.seen)
    assert bar.bar.total == bar.bar.n  # a search that used less than its budget ends complete, not red
    assert P._context.search is None  # the thread's search bar is gone after the call


def test_search_off_silences_its_trials(make_bench, monkeypatch, capfd):
    monkeypatch.setattr(P, "_stderr_is_terminal", lambda: True)  # auto would show bars
    bench = make_bench()
    bench.tune(n_trials=2, progress=False, stages=("data",))
    assert capfd.readouterr().err == ""
    assert P._context.off is False


def test_note_reaches_the_search_bar_and_is_a_no_op_without_one(monkeypatch):
    seen = []

    class Bar:
        def note(self, text):
            seen.append(text)

    monkeypatch.setattr(P._context, "search", Bar(), raising=False)
    P.note("profiler")
    assert seen == ["profiler"]
    monkeypatch.setattr(P._context, "search", None)
    P.note("profiler")  # no bar: nothing made, nothing raised
    assert seen == ["profiler"] and P._context.search is None


@pytest.mark.parametrize("hz", [0, -1])
def test_poller_rejects_bad_rates(hz):
    with pytest.raises(ValueError, match="hz must be > 0"):
        P.Poller(P.TrialProgress(), print, hz=hz)


def test_a_notebook_without_ipywidgets_gets_a_text_bar(monkeypatch):
    """tqdm.notebook raises ImportError ("IProgress not found") without ipywidgets: fall back to text."""
    import io

    import tqdm.auto
    import tqdm.std

    def no_widgets(*args, **kwargs):
        raise ImportError("IProgress not found. Please update jupyter and ipywidgets.")

    monkeypatch.setattr(tqdm.auto, "tqdm", no_widgets)
    bar = P.make_bar(total=3, file=io.StringIO())
    assert type(bar) is tqdm.std.tqdm
    bar.close()


def test_trial_bar_ends_full_when_ok_and_where_it_stopped_when_failed():
    from workbench.core.progress import TrialBar

    ok, failed = TrialBar("ok"), TrialBar("failed")
    for bar, end in ((ok, None), (failed, "error")):
        bar("measuring", 6, 8)
        bar("done", 8, 8)  # the runner's final report, after a failure too
        if end:
            bar(end, 8, 8)  # bench.run's end state
        bar.close()
    assert ok.bar.n == 8 and not ok.failed
    assert failed.bar.n == 6 and failed.failed  # never a full bar for a failed trial


def test_search_bar_says_the_seconds_left_of_a_budget():
    """With budget_s the postfix says how many seconds are left (an injected clock), and a trial that
    stopped early says "stopping early: clearly slower"; without one, only the trial."""
    import types

    now = [100.0]
    bar = P.SearchBar("tune", None, 60.0, clock=lambda: now[0])
    now[0] = 137.4  # 37.4 s in
    bar.on_trial(types.SimpleNamespace(trial_id=7, samples_per_s=812.0, status="ok", extra={}))
    assert bar.bar.postfix == "#7 812 samples/s · 23 s of 60 s left"
    bar.on_trial(types.SimpleNamespace(trial_id=8, samples_per_s=90.0, status="ok",
                                       extra={"stopped_early": {"steps": 4, "of": 30}}))
    assert bar.bar.postfix.startswith("#8 stopping early: clearly slower · 23 s of 60 s left")
    now[0] = 200.0  # over the budget: never a negative count
    bar.note("profiler")
    assert bar.bar.postfix == "profiler · 0 s of 60 s left"
    bar.close(True)
    plain = P.SearchBar("tune", None)
    plain.note("profiler")
    assert plain.bar.postfix == "profiler"
    plain.close(True)


def test_search_passes_a_usable_budget_to_its_bar(make_bench, search_bars):
    made = search_bars
    bench = make_bench()
    with P.search(True, "tune", log=bench.log, budget_s=30):
        pass
    with P.search(True, "tune", log=bench.log, budget_s="30"):  # the search itself refuses it; the bar ignores it
        pass
    assert [b.budget_s for b in made] == [30.0, None]
