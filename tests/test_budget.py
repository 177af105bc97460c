"""budget.py: a seconds budget that holds (estimates per configuration, a deadline that stops a trial,
the account of the seconds), and tune(budget_s=...) as a cap on a sleep-timed model."""

from __future__ import annotations

import math
import time

import pytest
from conftest import SleepNet

import workbench as wb
from workbench.core.measure import TrialResult
from workbench.deciding.budget import Allowance, Deadline, Spend, check_budget_s, estimate, takes_cancel
from workbench.search.tune import tune

STEP_S = 0.02  # the sleep model's forward


@pytest.mark.parametrize("bad", [0, -5, math.nan, math.inf, "60", True])
def test_a_budget_that_is_not_a_positive_finite_number_is_refused_naming_the_fix(bad):
    with pytest.raises(ValueError, match=r"budget_s must be a positive.*e\.g\. budget_s=120"):
        check_budget_s(bad)
    check_budget_s(None)
    check_budget_s(0.5)


def test_estimates_come_from_the_most_similar_measured_configuration():
    k = wb.Knobs(batch_size=8)
    assert estimate(k, []) is None
    measured = [(k, 2.0, True), (k, 3.0, True), (k.replace(num_workers=2), 5.0, True)]
    assert estimate(k, measured) == 3.0  # the same knobs: their longest trial
    assert estimate(k.replace(batch_size=32), measured) == pytest.approx(12.0)  # 4x the samples per step
    assert estimate(k.replace(num_workers=1), measured) == 5.0  # the workers' class, measured
    assert estimate(k.replace(compile="default"), measured) == pytest.approx(12 * 5.0)  # compile prior, costliest
    compiled = [*measured, (k.replace(compile="default"), 8.0, True)]
    assert estimate(k.replace(compile="default", cpu_threads=1), compiled) == 8.0  # the same graph: compiled before
    assert estimate(k.replace(compile="default", amp="bf16"), compiled) == pytest.approx(16.0)  # a graph of its own
    early = [(k, 2.0, True), (k.replace(amp="bf16"), 0.3, False)]  # stopped early: only for its own knobs
    assert estimate(k.replace(channels_last=True), early) == 2.0


def test_a_deadline_stops_a_trial_recorded_as_stopped_by_the_budget(make_bench):
    bench = make_bench(model=SleepNet(STEP_S), steps=200, warmup_steps=1)
    spent = Spend(budget_s=1.0)
    t = time.perf_counter()
    r = spent.run(bench.run, bench.defaults, purpose="race", deadline_in_s=0.5, stop_early=True,
                  clock=time.perf_counter)
    assert time.perf_counter() - t < 200 * STEP_S / 2  # far short of its window
    assert r.status == "interrupted" and r.message.startswith("stopped by the budget"), r.message
    assert spent.stopped == [r.trial_id] and not spent.measured and spent.seconds["race"] > 0
    assert "1 stopped at the deadline (not evidence)" in str(spent)
    d = Deadline(10.0, "why")
    d.set()  # Ctrl-C's set(): not the budget's stop
    assert not d.expired and d.reason == ""
    d.cancel()


def test_spend_records_a_finished_trial_as_evidence():
    spent = Spend(budget_s=None)
    k = wb.Knobs(batch_size=8)

    def run(knobs, **kwargs):
        assert kwargs == {"stop_early": False}
        return TrialResult(knobs=knobs, status="ok", trial_id=1)

    spent.run(run, k, purpose="confirm", deadline_in_s=None, stop_early=False, clock=time.perf_counter)
    assert spent.measured[0][0] == k and spent.measured[0][2] and "confirm" in str(spent)
    assert spent.fits(k, left_s=10.0) and not spent.fits(k, left_s=-1.0)


@pytest.mark.slow
def test_tune_budget_s_is_a_cap(make_bench):
    """tune(budget_s=...) ends within budget_s x 1.1 plus one trial, and says how the seconds went."""
    bench = make_bench(model=SleepNet(STEP_S), steps=10, warmup_steps=1)
    budget_s = 6.0
    t = time.perf_counter()
    res = tune(bench, budget_s=budget_s, stages=("data", "precision", "kernels"), explain=False)
    wall = time.perf_counter() - t
    longest = max(s for _k, s, _full in res.spent.measured)
    assert wall <= budget_s * 1.1 + longest, (wall, str(res))
    assert res.spent is not None and "budget:" in str(res) and sum(res.spent.seconds.values()) <= wall
    assert all(r.trial_id not in res.spent.stopped for r in [res.best])  # a stopped trial is never the answer


# ---- the same cap wherever a budget_s is taken (Allowance): compare, diagnose, fit_memory, scaling ----
class FakeClock:
    """A clock the fake trials advance: budgets decided without real time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_an_allowance_runs_the_first_trial_whole_and_keeps_out_what_does_not_fit():
    clock, calls = FakeClock(), []
    allow = Allowance(10.0, "fit_memory", clock=clock)
    k = wb.Knobs(batch_size=8)

    def run(knobs, **kwargs):
        calls.append(kwargs)
        clock.now += 6.0  # every trial takes 6 s
        return TrialResult(knobs=knobs, status="ok", trial_id=len(calls), samples_per_s=1.0)

    assert allow.trial(run, k, label="the start") is not None
    assert calls == [{}]  # the first trial runs whole: no deadline
    assert allow.trial(run, k.replace(amp="bf16"), label="amp") is None  # 6 s estimate, 4 s left
    assert len(calls) == 1 and allow.spent.not_started == 1
    assert "amp not run: its estimate 6.0 s did not fit the 4.0 s left of budget_s=10" in allow.notes[0]
    assert allow.trial(run, k, label="again", needed=True) is not None  # needed: runs whole even so
    assert allow.left() == pytest.approx(-2.0) and not allow.fits(0.5)


def test_an_allowance_stops_a_later_trial_at_the_deadline_and_says_so(make_bench):
    bench = make_bench(model=SleepNet(STEP_S), steps=3, warmup_steps=1)
    allow = Allowance(1.0, "scaling")
    first = allow.trial(bench.run, bench.defaults, label="first")
    assert first.ok and not allow.stopped(first)
    long = bench.knobs(batch_size=4)
    allow.spent.measured[:] = [(long, 0.01, True)]  # a wrong, short estimate: the deadline must catch it
    bench.steps = 500  # 500 x 20 ms: far past the budget
    t = time.perf_counter()
    r = allow.trial(bench.run, long, label="long")
    assert time.perf_counter() - t < 500 * STEP_S / 2
    assert allow.stopped(r) and r.status == "interrupted" and "scaling's budget_s" in r.message
    assert any("stopped by the budget at its deadline: not evidence" in n for n in allow.notes)


def test_takes_cancel_tells_bench_run_from_a_plain_run(make_bench):
    assert takes_cancel(make_bench().run) and takes_cancel(lambda k, **kw: None)
    assert not takes_cancel(lambda k: None)


@pytest.mark.parametrize("bad", [0, -1, math.nan, True])
def test_every_budget_s_is_checked_before_anything_runs(make_bench, bad):
    bench = make_bench()
    for call in (lambda: bench.diagnose(budget_s=bad, progress=False),
                 lambda: bench.fit_memory(10**9, 8, budget_s=bad, progress=False),
                 lambda: bench.scaling((1,), budget_s=bad, progress=False)):
        with pytest.raises(ValueError, match="budget_s must be a positive"):
            call()
    assert bench.trials == []


def test_fit_memory_with_a_budget_smaller_than_one_trial_runs_the_start_alone_and_says_why(make_bench):
    bench = make_bench(model=SleepNet(0.05), steps=3, warmup_steps=1)  # a trial takes >= 0.2 s
    res = bench.fit_memory(1, 8, budget_s=0.1, progress=False)  # 1 byte: nothing fits
    assert len(bench.trials) == 1 and not res.fits
    assert res.spent.not_started == 1 and "did not fit" in str(res) and "raise budget_s" in str(res)
    assert "budget: fit " in str(res)


def test_scaling_with_a_small_budget_runs_the_first_row_and_marks_the_rest(make_bench):
    bench = make_bench(model=SleepNet(0.05), steps=3, warmup_steps=1)
    frame = bench.scaling((1, 2), budget_s=0.1, progress=False).frame  # world_size=2 would start 2 processes
    assert len(bench.trials) == 1
    assert list(frame["status"]) == ["ok", "not run: over the budget"]
    notes = frame.attrs["notes"]
    assert frame.attrs["spent"].not_started == 1 and any(n.startswith("world_size=2") for n in notes)
    assert any(n.startswith("the first trial alone took") for n in notes)  # the budget smaller than one trial: why


def test_diagnose_with_a_small_budget_diagnoses_the_trial_and_says_what_it_left_out(make_bench):
    bench = make_bench(model=SleepNet(0.05), steps=3, warmup_steps=1)
    d = bench.diagnose(budget_s=0.1, progress=False)
    assert len(bench.trials) == 1 and d.data.cached is None  # the short-circuit twin did not fit
    assert d.spent.not_started == 1 and any("short-circuit twin not run" in n for n in d.budget_notes)
    assert any(n.startswith("profiler not run") for n in d.budget_notes)
    assert "== Budget (0.1 s) ==" in str(d)


def test_compare_rounds_stop_at_the_budget_and_a_stopped_round_is_not_evidence():
    """A round's trial runs under the deadline: one that would take 10 s ends at budget_s x 1.05."""
    from fake_trials import fake

    from workbench.deciding.rounds import compare

    a, b = fake([0.1] * 5, batch_size=8), fake([0.1] * 5, batch_size=16)
    ran = []

    def run(knobs, cancel=None, **kwargs):
        ran.append(knobs)
        stopped = cancel.wait(10.0)  # a trial that would take 10 s
        return TrialResult(knobs=knobs, status="interrupted" if stopped else "ok", trial_id=len(ran),
                           message=getattr(cancel, "reason", ""))

    t = time.perf_counter()
    c = compare(a, b, rounds="auto", run=run, budget_s=0.3)
    assert time.perf_counter() - t < 5.0
    assert c.rounds == 0 and len(ran) == 1 and "stopped by the budget" in c.note, c.note
    with pytest.raises(ValueError, match="budget_s must be a positive"):
        compare(a, b, rounds="auto", run=run, budget_s=math.nan)


def test_fit_memory_budget_s_is_a_cap(make_bench):
    """Nothing fits (1 byte), so fit_memory would try every rescue step: it ends within budget_s x 1.1
    plus one trial, and its steps hold no trial stopped at the deadline."""
    bench = make_bench(model=SleepNet(STEP_S), steps=5, warmup_steps=1)
    budget_s = 0.6
    t = time.perf_counter()
    res = bench.fit_memory(1, 8, budget_s=budget_s, progress=False)
    wall = time.perf_counter() - t
    longest = max(s for _k, s, _full in res.spent.measured)
    assert wall <= budget_s * 1.1 + longest, (wall, str(res))
    assert not set(res.steps["trial"]) & set(res.spent.stopped)  # a stopped trial is no evidence, no row
    assert res.spent.not_started + len(res.spent.stopped) >= 1 and "raise budget_s" in str(res)


def test_workbench_compare_checks_budget_s(make_bench):
    bench = make_bench()
    a = bench.run()
    with pytest.raises(ValueError, match="budget_s must be a positive"):
        bench.compare(a, a, rounds="auto", budget_s=True)
