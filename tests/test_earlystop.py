"""Early stop: a trial whose measured steps already show it far slower than the baseline ends its window
early, keeps status ok, its steps and a note; the rule never stops a trial that is not slower."""

from __future__ import annotations

import contextlib
import random
import time

import pytest
from conftest import SleepNet

import workbench as wb
from workbench.core.earlystop import ALPHA, MIN_STEPS, StopRule, binomial_tail

BASE_S = 0.02  # the sleep model's forward, per step
SLOW = 8  # the user knob makes the forward this many times slower


def test_binomial_tail():
    assert binomial_tail(5, 5, 0.2) == pytest.approx(0.2**5)
    assert binomial_tail(5, 0, 0.2) == 1.0
    assert binomial_tail(4, 2, 0.5) == pytest.approx(11 / 16)


def test_rule_stops_a_clearly_slower_trial_after_the_minimum_and_says_how_much():
    rule = StopRule([0.010, 0.011, 0.0105, 0.0098, 0.0102, 0.0101], steps=30, baseline_id=1)
    stops = [rule.observe(0.08, 1) for _ in range(10)]
    assert stops.index(True) == MIN_STEPS - 1 and rule.stopped_at == MIN_STEPS
    assert rule.slowdown == pytest.approx(0.08 / 0.01015, rel=0.01)
    assert rule.note().startswith("stopped early after 5 of 30 steps: ≈7.9× slower than #1")
    assert "stop_early=False" in rule.note() and rule.outcome()["steps"] == 5


def test_rule_never_stops_a_trial_that_is_not_slower():
    """Same distribution as the baseline, heavy-tailed: false stops stay under ALPHA over many windows."""
    rng = random.Random(0)
    draw = lambda: 0.01 * (1 + rng.expovariate(1.0) * 0.5)  # noqa: E731  (a long right tail)
    false = 0
    for _ in range(400):
        rule = StopRule([draw() for _ in range(30)], steps=30)
        false += any(rule.observe(draw(), 1) for _ in range(30))
    assert false / 400 <= ALPHA
    # a 1.8x slower trial is slower, but not by the wide factor: it runs its whole window
    rule = StopRule([0.01] * 30, steps=30)
    assert not any(rule.observe(0.018, 1) for _ in range(30))


def test_rule_judges_time_per_sample_not_per_step():
    """A batch 4x the baseline's takes 4x as long per step and is not slower: no stop."""
    rule = StopRule.against([0.04] * 30, 8, steps=30)
    assert not any(rule.observe(0.16, 32) for _ in range(30))
    assert StopRule.against([0.01] * 3, 8, steps=30) is None  # too few baseline steps to judge by
    with pytest.raises(ValueError, match="stop_early=False"):
        StopRule([0.01], steps=30)


@pytest.mark.fixed_warmup
def test_a_user_knob_8x_slower_stops_early_keeps_its_steps_and_compare_calls_it_slower(make_bench):
    """Held out (issue 35): a forward about 8x slower ends well before a full window (<= 40% of 8x the
    baseline's wall), says so in its notes, and compare calls it slower."""

    @wb.knob(default=False, where="forward", help="sleeps in every forward: 8x slower")
    def crawl(value):
        return _sleeping((SLOW - 1) * BASE_S) if value else contextlib.nullcontext()

    try:
        bench = make_bench(model=SleepNet(BASE_S), steps=30, warmup_steps=1)
        t = time.perf_counter()
        base = bench.run()
        base_wall = time.perf_counter() - t
        t = time.perf_counter()
        slow = bench.run(crawl=True)
        slow_wall = time.perf_counter() - t
        assert slow.ok and "stopped_early" not in base.extra
        assert slow_wall <= 0.4 * SLOW * base_wall, (slow_wall, base_wall)
        assert "stopped_early" in slow.extra, (slow.notes, len(slow.step_times_s), bench.baseline, base_wall)
        stopped = slow.extra["stopped_early"]
        assert MIN_STEPS <= stopped["steps"] < 30 and len(slow.step_times_s) == stopped["steps"]
        assert len(slow.losses) == stopped["steps"] and slow.samples_per_s
        assert any(n.startswith(f"stopped early after {stopped['steps']} of 30 steps") for n in slow.notes)
        assert bench.compare(base, slow).answer == "slower"
        row = bench.results.set_index("trial_id").loc[slow.trial_id]
        assert row["window"] == f"{stopped['steps']}/30"
        bench.steps = 8  # shorter windows from here on: the full slow window costs 8x
        full = bench.run(crawl=True, stop_early=False)
        assert len(full.step_times_s) == 8 and "stopped_early" not in full.extra
        bench.baseline = full  # against the slow baseline, the fast trial is never stopped
        assert len(bench.run().step_times_s) == 8
    finally:
        wb.forget_knob("crawl")


@contextlib.contextmanager
def _sleeping(seconds: float):
    time.sleep(seconds)
    yield
