"""budget.py: a seconds budget that holds (estimates per configuration, a deadline that stops a trial,
the account of the seconds), and tune(budget_s=...) as a cap on a sleep-timed model."""

from __future__ import annotations

import math
import time

import pytest
from conftest import SleepNet

import workbench as wb
from workbench.core.measure import TrialResult
from workbench.deciding.budget import Budget, Deadline, check_budget_s, estimate, takes_cancel
from workbench.search.tune import tune

STEP_S = 0.02  # the sleep model's forward


class FakeClock:
    """A clock the fake trials advance: budgets decided without real time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


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
    budget = Budget(0.5 / 1.05, "tune", whole_first=False)  # its deadline: 0.5 s from now
    t = time.perf_counter()
    r = budget.trial(bench.run, bench.defaults, purpose="race", starts=True)
    assert time.perf_counter() - t < 200 * STEP_S / 2  # far short of its window
    assert r.status == "interrupted" and r.message.startswith("stopped by the budget (tune's"), r.message
    spent = budget.spent
    assert spent.stopped == [r.trial_id] and not spent.measured and spent.seconds["race"] > 0
    assert "1 stopped at the deadline (not evidence)" in str(budget)
    d = Deadline(10.0, "why")
    d.set()  # Ctrl-C's set(): not the budget's stop
    assert not d.expired and d.reason == ""
    d.cancel()


def test_a_budget_records_a_finished_trial_as_evidence():
    clock = FakeClock()
    budget = Budget(None, "tune", clock=clock)
    k = wb.Knobs(batch_size=8)

    def run(knobs, **kwargs):
        assert kwargs.keys() == {"stop_early", "cancel"} and kwargs["stop_early"] is False
        assert kwargs["cancel"].waits.account is budget.queue and not kwargs["cancel"].timed  # whole: no deadline
        clock.now += 3.0
        return TrialResult(knobs=knobs, status="ok", trial_id=1)

    budget.trial(run, k, purpose="confirm", stop_early=False)
    spent = budget.spent
    assert spent.measured == [(k, 3.0, True)] and str(budget) == "confirm 3.0 s"
    assert budget.fits_trial(k) and budget.left() is None  # no budget: everything fits
    capped = Budget(10.0, "tune", clock=clock)
    capped.spent.measured[:] = spent.measured
    assert capped.fits_trial(k) and not capped.fits_trial(k, factor=4.0)  # 3 s fits 10 s; 12 s does not


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


# ---- the same cap wherever a budget_s is taken (one Budget): compare, diagnose, fit_memory, scaling ----
def test_a_budget_runs_the_first_trial_whole_and_keeps_out_what_does_not_fit():
    clock, calls = FakeClock(), []
    allow = Budget(10.0, "fit_memory", clock=clock)
    k = wb.Knobs(batch_size=8)

    def run(knobs, **kwargs):
        calls.append(kwargs)
        clock.now += 6.0  # every trial takes 6 s
        return TrialResult(knobs=knobs, status="ok", trial_id=len(calls), samples_per_s=1.0)

    assert allow.trial(run, k, label="the start") is not None
    assert [(set(c), c["cancel"].timed) for c in calls] == [({"cancel"}, False)]  # the first runs whole: no deadline
    assert allow.trial(run, k.replace(amp="bf16"), label="amp") is None  # 6 s estimate, 4 s left
    assert len(calls) == 1 and allow.spent.not_started == 1
    assert "amp not run: its estimate 6.0 s did not fit the 4.0 s left of budget_s=10" in allow.notes[0]
    assert allow.trial(run, k, label="again", needed=True) is not None  # needed: runs whole even so
    assert allow.left() == pytest.approx(-2.0) and not allow.fits(0.5)


def test_a_budget_stops_a_later_trial_at_the_deadline_and_says_so(make_bench):
    bench = make_bench(model=SleepNet(STEP_S), steps=3, warmup_steps=1)
    allow = Budget(3.0, "scaling")  # the first trial (~1 s on a loaded machine) leaves room for the next to start
    first = allow.trial(bench.run, bench.defaults, label="first")
    assert first.ok and not allow.stopped(first)
    long = bench.knobs(batch_size=4)
    allow.spent.measured[:] = [(long, 0.01, True)]  # a wrong, short estimate: the deadline must catch it
    bench.steps = 2000  # 2000 x 20 ms: far past the budget
    t = time.perf_counter()
    r = allow.trial(bench.run, long, label="long")
    assert time.perf_counter() - t < 2000 * STEP_S / 4
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
    """Nothing fits (1 byte), so fit_memory would try every rescue step: on the budget's clock it ends
    within budget_s x 1.1 plus one trial, a later step whose estimate does not fit is not started, and
    its steps hold no trial stopped at the deadline. The clock is the budget's own (each trial advances
    it 2.5 s after it ran, against a budget_s of 6 s), so a busy machine cannot move the answer."""
    bench = make_bench(model=SleepNet(STEP_S), steps=5, warmup_steps=1)
    clock, real_run = FakeClock(), bench.run

    def run(knobs, **kwargs):
        r = real_run(knobs, **kwargs)
        clock.now += 2.5  # seconds: every trial, on the budget's clock
        return r

    bench.run = run
    budget = Budget(6.0, "fit_memory", clock=clock)
    res = bench.fit_memory(1, 8, budget_s=budget, progress=False)
    assert res.spent is budget.spent  # the start and one rescue step fit (the rescue stopped only past 3.8 s real)
    assert len(res.steps) == 2 or (len(res.steps) == 1 and res.spent.stopped), str(res)
    assert clock.now <= 6.0 * 1.1 + 2.5, (clock.now, str(res))
    assert not set(res.steps["trial"]) & set(res.spent.stopped)  # a stopped trial is no evidence, no row
    assert res.spent.not_started + len(res.spent.stopped) >= 1 and "raise budget_s" in str(res)


def test_workbench_compare_checks_budget_s(make_bench):
    bench = make_bench()
    a = bench.run()
    with pytest.raises(ValueError, match="budget_s must be a positive"):
        bench.compare(a, a, rounds="auto", budget_s=True)


# ---- one Budget per verb call: validated once, passed down, its account is the verb's --------------
@pytest.fixture
def budgets(monkeypatch):
    """Every Budget made (each validates its budget_s, once) and every budget_s validated, in order."""
    import workbench.deciding.budget as budget_mod

    made, checked = [], []
    real_init, real_check = Budget.__init__, budget_mod.check_budget_s

    def init(self, *args, **kwargs):
        made.append(self)
        real_init(self, *args, **kwargs)

    def check(budget_s):
        checked.append(budget_s)
        real_check(budget_s)

    monkeypatch.setattr(Budget, "__init__", init)
    monkeypatch.setattr(budget_mod, "check_budget_s", check)
    return made, checked


@pytest.mark.slow
def test_a_compare_call_validates_budget_s_once_and_a_bad_one_before_any_trial(make_bench, budgets):
    """bench.compare -> its rounds (rounds.compare) -> their trials: one Budget, one validation; a bad
    budget_s raises once, before the pinned trials, the turns or any round."""
    made, checked = budgets
    bench = make_bench(steps=2, warmup_steps=1)
    a, _between, b = bench.run(), bench.run(batch_size=4), bench.run()  # not back to back: rounds run
    c = bench.compare(a, b, rounds="auto", max_rounds=2, budget_s=60, method="trials")  # compare -> rounds
    assert c.method == "trials" and c.rounds >= 1 and len(made) == 1 and checked == [60], (c.rounds, c.note, made, checked)
    turns = bench.compare(a, bench.run(cpu_threads=1), rounds="auto", budget_s=2)  # compare -> interleaved turns
    assert turns.method == "interleaved" and len(made) == 2 and checked == [60, 2]
    n = len(bench.trials)
    with pytest.raises(ValueError, match="budget_s must be a positive") as err:
        bench.compare(a, b, rounds="auto", budget_s=-1)
    assert checked == [60, 2, -1] and len(bench.trials) == n and "-1" in str(err.value)


def test_a_later_trial_that_does_not_fit_is_not_started_and_named_in_the_account():
    clock, ran = FakeClock(), []
    budget = Budget(10.0, "scaling", clock=clock)

    def run(knobs, **kwargs):
        ran.append(knobs)
        clock.now += 7.0
        return TrialResult(knobs=knobs, status="ok", trial_id=len(ran), samples_per_s=1.0)

    k = wb.Knobs(batch_size=8)
    assert budget.trial(run, k, label="world_size=1") is not None
    assert budget.trial(run, k.replace(world_size=2), label="world_size=2 (ddp)") is None  # 14 s est., 3 s left
    assert len(ran) == 1 and budget.spent.left_out == ["world_size=2 (ddp)"]
    assert "1 trial(s) not started: their estimate did not fit the seconds left (world_size=2 (ddp))" in str(budget)


def test_a_called_verb_spends_the_callers_budget_and_its_stopped_trial_is_in_the_callers_account():
    """compare's rounds given a part of diagnose's Budget (as diagnose passes it down): the round's
    trial runs under that budget's deadline, is stopped by it, and lands in the caller's account."""
    from fake_trials import fake

    from workbench.deciding.rounds import compare

    caller, reasons = Budget(0.3, "diagnose", whole_first=False), []

    def run(knobs, cancel=None, **kwargs):
        stopped = cancel.wait(10.0)  # a trial that would take 10 s
        reasons.append(cancel.reason)
        return TrialResult(knobs=knobs, status="interrupted" if stopped else "ok", trial_id=99,
                           message=getattr(cancel, "reason", ""))

    t = time.perf_counter()
    c = compare(fake([0.1] * 3, batch_size=8), fake([0.1] * 3, batch_size=16), rounds="auto", run=run,
                budget_s=caller.part())
    assert time.perf_counter() - t < 5.0 and c.rounds == 0
    assert caller.spent.stopped == [99] and caller.spent.seconds["rounds"] > 0  # the caller's account: one object
    assert reasons == ["stopped by the budget (diagnose's budget_s) at its deadline"] and "stopped by the budget" in c.note
    assert "#99 (" in caller.notes[-1] and "stopped by the budget at its deadline" in caller.notes[-1]


def test_each_verb_reports_the_account_of_its_one_budget(make_bench, budgets):
    """fit_memory, scaling and diagnose each make one Budget (validating budget_s once) and report its
    account and notes as theirs; a Budget passed in is spent as it is, not made again."""
    made, checked = budgets
    bench = make_bench(model=SleepNet(0.05), steps=3, warmup_steps=1)
    fit = bench.fit_memory(1, 8, budget_s=0.1, progress=False)
    assert len(made) == 1 and fit.spent is made[0].spent and checked == [0.1]
    frame = bench.scaling((1, 2), budget_s=0.1, progress=False)
    assert len(made) == 2 and frame.spent is made[1].spent and frame.notes is made[1].notes
    d = bench.diagnose(budget_s=0.1, progress=False)
    assert len(made) == 3 and d.spent is made[2].spent and d.budget_notes is made[2].notes
    assert checked == [0.1, 0.1, 0.1]  # once per call
    mine = Budget(30.0, "mine")
    res = bench.fit_memory(1, 8, budget_s=mine, progress=False, max_trials=1)
    assert res.spent is mine.spent and len(made) == 4  # passed down as the object: not made again


def test_tune_spends_one_budget_through_its_race_and_reports_its_account(budgets, fake_clock):
    from test_tune import FakeBench, speed_model

    made, checked = budgets
    bench = fake_clock(FakeBench(speed_model, lambda k: 1000 * k.batch_size))
    res = tune(bench, budget_s=8, stages=("data",), explain=False)
    assert len(made) == 1 and checked == [8] and res.spent is made[0].spent
    assert sum(res.spent.seconds.values()) == pytest.approx(len(bench.trials))  # each fake trial: 1 s, all counted
    assert res.spent.not_started == len(res.spent.left_out)
