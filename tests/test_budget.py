"""budget.py: a seconds budget that holds (estimates per configuration, a deadline that stops a trial,
the account of the seconds), and tune(budget_s=...) as a cap on a sleep-timed model."""

from __future__ import annotations

import math
import time

import pytest
from conftest import SleepNet

import workbench as wb
from workbench.budget import Deadline, Spend, check_budget_s, estimate
from workbench.measure import TrialResult
from workbench.tune import tune

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
    assert estimate(k.replace(compile="default"), measured) == pytest.approx(4 * 5.0)  # compile prior, costliest
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
