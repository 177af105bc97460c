"""Progress that behaves: tqdm bars polled from their own thread at <= 4 Hz, off with
progress=False, absent when stderr is not a terminal; search bars count trials."""

import threading
import time

import pytest

from workbench import progress as P


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


def test_search_bar_counts_trials_and_note_shows_the_analysis(make_bench, monkeypatch):
    made = []
    real_init = P.SearchBar.__init__

    def spy(self, desc, total):
        real_init(self, desc, total)
        made.append(self)

    monkeypatch.setattr(P.SearchBar, "__init__", spy)
    bench = make_bench()
    bench.tune(budget=2, progress=True, stages=("data",))
    (bar,) = made
    assert bar.bar.n == len(bench.trials) == len(bar.seen)
    assert bar.bar.total == bar.bar.n  # a search that used less than its budget ends complete, not red
    assert P._context.search is None  # the thread's search bar is gone after the call


def test_search_off_silences_its_trials(make_bench, monkeypatch, capfd):
    monkeypatch.setattr(P, "_stderr_is_terminal", lambda: True)  # auto would show bars
    bench = make_bench()
    bench.tune(budget=2, progress=False, stages=("data",))
    assert capfd.readouterr().err == ""
    assert P._context.off is False


def test_note_without_a_search_is_a_no_op():
    P.note("profiler")  # nothing to update, nothing raised


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
    from workbench.progress import TrialBar

    ok, failed = TrialBar("ok"), TrialBar("failed")
    for bar, end in ((ok, None), (failed, "error")):
        bar("measuring", 6, 8)
        bar("done", 8, 8)  # the runner's final report, after a failure too
        if end:
            bar(end, 8, 8)  # bench.run's end state
        bar.close()
    assert ok.bar.n == 8 and not ok.failed
    assert failed.bar.n == 6 and failed.failed  # never a full bar for a failed trial
