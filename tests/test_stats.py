"""The noise model, calibrated on synthetic seeded step-time series.

Each synthetic trial is 30 step times with what real trials show here: autocorrelated jitter
(AR(1)), a per-trial level shift of up to ±10% (load, thread placement, allocator state), and in
the bursty pattern a data pipeline that delivers batches in bursts (every k-th step waits).
The checks are the issue's: identical configurations raise at most 5% false alarms, a real 1.3x
effect is found with >= 90% power in 3 alternating rounds.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import workbench as wb
from workbench.measure import TrialResult
from workbench.results import ResultLog, compare
from workbench.stats import PRIOR, PRIOR_NOISE, decide, estimate_noise, t_quantile

BATCH = 32


def step_times(rng: np.random.Generator, step_s: float, pattern: str, n: int = 30) -> np.ndarray:
    """One trial's measured step times (seconds) under a noise pattern."""
    level = 1 + rng.uniform(-0.10, 0.10)  # the whole trial runs faster or slower
    phi, jitter = 0.7, 0.05
    e = np.empty(n)
    prev = rng.normal(0, jitter / math.sqrt(1 - phi**2))
    for i in range(n):
        prev = phi * prev + rng.normal(0, jitter)
        e[i] = prev
    t = step_s * level * np.exp(e)
    if pattern == "bursty":  # batches arrive in bursts: every k-th step waits for the pipeline
        k, phase = int(rng.integers(3, 6)), int(rng.integers(0, 6))
        waits = np.zeros(n)
        waits[phase % k::k] = step_s * rng.uniform(0.5, 2.0, size=len(waits[phase % k::k]))
        t = t * 0.7 + waits
    return t


class SimBench:
    """Trials of configurations whose true speed is `speed[knobs.batch_size]` (a stand-in key)."""

    def __init__(self, seed: int, pattern: str, speedup: float = 1.0) -> None:
        self.rng = np.random.default_rng(seed)
        self.pattern, self.log = pattern, ResultLog(None)
        self.step_s = {16: 0.010, 17: 0.010 / speedup}  # batch_size 16 = A, 17 = B (same samples/step)

    def run(self, knobs: wb.Knobs) -> TrialResult:
        t = tuple(float(x) for x in step_times(self.rng, self.step_s[knobs.batch_size], self.pattern))
        r = TrialResult(knobs=knobs, status="ok", samples_per_s=BATCH * len(t) / sum(t), step_times_s=t, data_wait_share=0.0,
                        samples_per_step=BATCH)
        return self.log.append(r)


A, B = wb.Knobs(batch_size=16), wb.Knobs(batch_size=17)
PATTERNS = ["jitter", "bursty"]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_identical_trials_false_alarms_at_most_5_percent(pattern):
    """The held-out check, many times over: 8 identical trials, 7 adjacent pairs and 7 table verdicts."""
    alarms = verdicts = pairs = 0
    for seed in range(60):
        sim = SimBench(seed, pattern)
        trials = [sim.run(A) for _ in range(8)]
        alarms += sum(compare(x, y, log=sim.log).beyond_noise for x, y in itertools.pairwise(trials))
        verdicts += (sim.log.frame()["verdict"] == "beyond noise").sum()
        pairs += 7
    assert alarms / pairs <= 0.05, f"{alarms}/{pairs} false alarms"
    assert verdicts / pairs <= 0.05, f"{verdicts}/{pairs} false alarms in the verdict column"


@pytest.mark.parametrize("pattern", PATTERNS)
def test_rounds_false_alarms_and_power(pattern):
    """compare(a, b, rounds=3) from a fresh log: identical => within noise; 1.3x => beyond noise."""
    sims = 100
    alarms = hits = 0
    for seed in range(sims):
        same = SimBench(seed, pattern)
        c = compare(same.run(A), same.run(B), rounds=3, run=same.run, log=same.log)
        alarms += c.beyond_noise
        real = SimBench(10_000 + seed, pattern, speedup=1.3)
        c = compare(real.run(A), real.run(B), rounds=3, run=real.run, log=real.log)
        hits += c.beyond_noise and c.speedup > 1
        assert c.rounds == 3 and len(c.a_rates) == len(c.b_rates) == 4
    assert alarms / sims <= 0.05, f"{alarms}/{sims} false alarms with rounds=3"
    assert hits / sims >= 0.90, f"power {hits}/{sims} for a real 1.3x effect with rounds=3"


def test_rounds_2_separates_identical_from_a_1_4x_effect():
    same, real = SimBench(1, "jitter"), SimBench(2, "jitter", speedup=1.4)
    assert not compare(same.run(A), same.run(B), rounds=2, run=same.run, log=same.log).beyond_noise
    c = compare(real.run(A), real.run(B), rounds=2, run=real.run, log=real.log)
    assert c.beyond_noise and "faster" in str(c) and "2 alternating rounds" in str(c)


def test_rounds_alternate_and_land_in_the_log():
    sim = SimBench(0, "jitter")
    order: list[int] = []

    def run(k):
        order.append(k.batch_size)
        return sim.run(k)

    c = compare(sim.run(A), sim.run(B), rounds=3, run=run, log=sim.log)
    assert order == [17, 16, 16, 17, 17, 16]  # after A B: B A, A B, B A (a slow drift cancels)
    assert len(sim.log.trials) == 8 and c.a_trials == (1, 4, 5, 8) and c.b_trials == (2, 3, 6, 7)
    assert sim.log.noise.repeats == 6  # the rounds taught the noise model


def test_a_failed_round_stops_and_says_so():
    sim = SimBench(0, "jitter")
    a, b = sim.run(A), sim.run(B)
    calls = []

    def run(k):
        calls.append(k)
        if len(calls) == 3:
            return sim.log.append(TrialResult(knobs=k, status="oom", message="out of memory"))
        return sim.run(k)

    c = compare(a, b, rounds=3, run=run, log=sim.log)
    assert c.rounds == 1 and "Round 2 #5 ended oom" in str(c)


def test_noise_prior_until_repeats_then_learnt():
    assert PRIOR.repeats == 0 and PRIOR.sigma == pytest.approx(PRIOR_NOISE)
    assert "conservative prior" in str(PRIOR)
    learnt = estimate_noise([[100, 101, 99, 100.5], [50, 50.5], [70]])
    assert learnt.repeats == 4 and learnt.configs == 2 and learnt.sigma < PRIOR.sigma
    assert "from 4 repeats of 2 configurations" in str(learnt)
    noisy = estimate_noise([[100, 140, 70, 120]])
    assert noisy.sigma > PRIOR.sigma  # evidence can raise it too


def test_within_noise_says_how_many_rounds_would_settle_it():
    c = decide([100.0], [112.0], PRIOR, a_trials=[1], b_trials=[2])
    assert not c.beyond_noise and c.rounds_needed is not None and c.rounds_needed >= 1
    assert f"bench.compare(1, 2, rounds={c.rounds_needed})" in str(c)
    tiny = decide([100.0], [101.0], PRIOR, a_trials=[1], b_trials=[2])
    assert not tiny.beyond_noise and "under 2%" in str(tiny)
    assert "within noise" in tiny._repr_html_() and "#2" in tiny._repr_html_()


def test_speedup_is_the_ratio_of_samples_per_s():
    c = decide([100.0, 110.0], [200.0], PRIOR)
    assert c.speedup == pytest.approx(200 / math.sqrt(100 * 110))  # geometric mean of each side


def test_t_quantile_matches_tables():
    for df, t in ((3, 3.182), (4, 2.776), (10, 2.228), (30, 2.042)):
        assert t_quantile(0.975, df) == pytest.approx(t, rel=3e-3)


def test_compare_rejects_bad_input():
    sim = SimBench(0, "jitter")
    a, b = sim.run(A), sim.run(B)
    with pytest.raises(ValueError, match="rounds must be an int"):
        compare(a, b, rounds=-1, run=sim.run)
    with pytest.raises(ValueError, match=r"pass run=bench\.run"):
        compare(a, b, rounds=2)
    with pytest.raises(ValueError, match="identical knobs"):
        compare([a, b], b)
