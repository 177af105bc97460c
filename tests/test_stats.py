"""The noise model, calibrated on synthetic seeded step-time series.

Each synthetic trial is 30 step times with what real trials show here: autocorrelated jitter
(AR(1)), a per-trial level shift of up to ±10% (load, thread placement, allocator state), and in
the bursty pattern a data pipeline that delivers batches in bursts (every k-th step waits).
The checks are the issue's: identical configurations raise at most 5% false alarms, a real 1.3x
effect is found with >= 90% power in 3 alternating rounds. Identical trials here also drift: the
"walk" pattern adds a random walk to the level from trial to trial, "steps" sudden level shifts;
`rounds="auto"` (paired, sequential) must keep its error rates under them and under peeking.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from fake_trials import fake

import workbench as wb
from workbench.core.measure import TrialResult
from workbench.deciding.rounds import compare
from workbench.results import ResultLog
from workbench.results.stats import (
    PAIRED_PRIOR_DF,
    PAIRED_PRIOR_MAX_DF,
    PAIRED_PRIOR_SD,
    PRIOR,
    PRIOR_NOISE,
    Noise,
    decide,
    decide_sequential,
    estimate_noise,
    look_alpha,
    paired_prior,
    t_cdf,
    t_quantile,
)

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
        self.level = 0.0  # log of the machine's drifting speed level ("walk", "steps")

    def drift(self) -> float:
        """The machine's level for the next trial: a random walk, or rare sudden steps of 5-15%."""
        if self.pattern == "walk":
            self.level += self.rng.normal(0, 0.03)
        elif self.pattern == "steps" and self.rng.random() < 0.15:
            self.level += self.rng.choice([-1, 1]) * self.rng.uniform(0.05, 0.15)
        return math.exp(self.level)

    def run(self, knobs: wb.Knobs) -> TrialResult:
        step_s = self.step_s[knobs.batch_size] * self.drift()
        t = tuple(float(x) for x in step_times(self.rng, step_s, self.pattern))
        r = TrialResult(knobs=knobs, status="ok", samples_per_s=BATCH * len(t) / sum(t), step_times_s=t, data_wait_share=0.0,
                        samples_per_step=BATCH)
        return self.log.append(r)


A, B = wb.Knobs(batch_size=16), wb.Knobs(batch_size=17)
PATTERNS = ["jitter", "bursty"]
DRIFTS = ["jitter", "bursty", "walk", "steps"]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_identical_trials_false_alarms_at_most_5_percent(pattern):
    """The held-out check, many times over: 8 identical trials, 7 adjacent pairs and 7 table verdicts."""
    alarms = verdicts = pairs = 0
    for seed in range(60):
        sim = SimBench(seed, pattern)
        trials = [sim.run(A) for _ in range(8)]
        alarms += sum(compare(x, y, log=sim.log).differs for x, y in itertools.pairwise(trials))
        verdicts += sim.log.frame()["verdict"].isin(["faster", "slower"]).sum()
        pairs += 7
    assert alarms / pairs <= 0.05, f"{alarms}/{pairs} false alarms"
    assert verdicts / pairs <= 0.05, f"{verdicts}/{pairs} false alarms in the verdict column"


@pytest.mark.parametrize("pattern", PATTERNS)
def test_rounds_false_alarms_and_power(pattern):
    """compare(a, b, rounds=3) from a fresh log: identical => undecided; 1.3x => faster."""
    sims = 100
    alarms = hits = 0
    for seed in range(sims):
        same = SimBench(seed, pattern)
        c = compare(same.run(A), same.run(B), rounds=3, run=same.run, log=same.log)
        alarms += c.differs
        real = SimBench(10_000 + seed, pattern, speedup=1.3)
        c = compare(real.run(A), real.run(B), rounds=3, run=real.run, log=real.log)
        hits += c.differs and c.speedup > 1
        assert c.rounds == 3 and len(c.a_rates) == len(c.b_rates) == 4
    assert alarms / sims <= 0.05, f"{alarms}/{sims} false alarms with rounds=3"
    assert hits / sims >= 0.90, f"power {hits}/{sims} for a real 1.3x effect with rounds=3"


def test_rounds_2_separates_identical_from_a_1_4x_effect():
    same, real = SimBench(1, "jitter"), SimBench(2, "jitter", speedup=1.4)
    assert not compare(same.run(A), same.run(B), rounds=2, run=same.run, log=same.log).differs
    c = compare(real.run(A), real.run(B), rounds=2, run=real.run, log=real.log)
    assert c.differs and "faster" in str(c) and "2 alternating rounds" in str(c)


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
    assert not c.differs and c.rounds_needed is not None and c.rounds_needed >= 1
    assert f"bench.compare(1, 2, rounds={c.rounds_needed})" in str(c)
    tiny = decide([100.0], [101.0], PRIOR, a_trials=[1], b_trials=[2])
    assert not tiny.differs and "under 2%" in str(tiny)
    assert "undecided" in tiny._repr_html_() and "#2" in tiny._repr_html_()


def test_speedup_is_the_ratio_of_samples_per_s():
    c = decide([100.0, 110.0], [200.0], PRIOR)
    assert c.speedup == pytest.approx(200 / math.sqrt(100 * 110))  # geometric mean of each side


def test_t_quantile_matches_tables():
    for df, t in ((3, 3.182), (4, 2.776), (10, 2.228), (30, 2.042)):
        assert t_quantile(0.975, df) == pytest.approx(t, rel=3e-3)


def test_compare_rejects_bad_input():
    sim = SimBench(0, "jitter")
    a, b = sim.run(A), sim.run(B)
    with pytest.raises(ValueError, match=r"rounds must be .auto. or an int"):
        compare(a, b, rounds=-1, run=sim.run)
    with pytest.raises(ValueError, match=r"pass run=bench\.run"):
        compare(a, b, rounds=2)
    with pytest.raises(ValueError, match="identical knobs"):
        compare([a, b], b)


def auto(sim: SimBench, warm: int = 0, **kwargs) -> wb.Comparison:
    """compare(rounds="auto") after `warm` identical trials (0: a fresh log): one A B pair, then rounds."""
    for _ in range(warm):
        sim.run(A)
    return compare(sim.run(A), sim.run(B), rounds="auto", run=sim.run, log=sim.log, **kwargs)


@pytest.mark.parametrize("pattern", DRIFTS)
def test_auto_false_alarms_under_peeking_and_drift(pattern):
    """Identical knobs, a look after every round up to 8: at most 5% say faster or slower."""
    sims = 150
    answers = [auto(SimBench(20_000 + seed, pattern), max_rounds=8).answer for seed in range(sims)]
    alarms = sum(a in ("faster", "slower") for a in answers)
    assert alarms / sims <= 0.05, f"{alarms}/{sims} false alarms with rounds='auto' ({pattern})"


@pytest.mark.parametrize("pattern", DRIFTS)
def test_auto_power_for_1_3x_within_8_rounds(pattern):
    sims = 100
    found = [auto(SimBench(30_000 + seed, pattern, speedup=1.3), max_rounds=8) for seed in range(sims)]
    hits = sum(c.answer == "faster" for c in found)
    assert hits / sims >= 0.90, f"power {hits}/{sims} for 1.3x within 8 rounds ({pattern})"
    assert max(c.rounds for c in found) <= 8 and min(c.rounds for c in found) < 8  # it stops when decided


def test_auto_says_same_speed_for_identical_knobs_on_a_quiet_machine():
    """Little noise: identical knobs settle as "same speed within ±10%" well before max_rounds."""
    rng = np.random.default_rng(5)
    log = ResultLog(None)

    def run(k):
        t = tuple(0.010 * math.exp(rng.normal(0, 0.01)) for _ in range(30))
        return log.append(TrialResult(knobs=k, status="ok", samples_per_s=BATCH * 30 / sum(t), step_times_s=t,
                                      data_wait_share=0.0, samples_per_step=BATCH))

    c = compare(run(A), run(B), rounds="auto", run=run, log=log, margin=0.10)
    assert c.answer == "same" and c.verdict == "same" and c.rounds < 8
    assert "same speed within ±10%" in str(c) and c.seconds is not None and "rounds" in str(c)
    assert "back-to-back trials of identical knobs" in str(log.noise)  # the rounds hold adjacent repeats


def test_paired_sequential_error_rates_in_pure_numbers():
    """The rule on log-ratios directly, 9 looks: false alarms and false "same" claims stay under 5%,
    while testing at 95% after every look (the rule it replaces) would not."""
    rng = np.random.default_rng(0)
    looks, sims = 9, 400
    alarms = naive = false_same = 0
    for _ in range(sims):
        d = rng.normal(0, 0.08, looks)
        e = rng.normal(math.log(1.15), 0.08, looks)  # a real 15% gap: never "same within ±10%"
        for n in range(1, looks + 1):
            c = decide_sequential(np.ones(n), np.exp(d[:n]), looks=looks, margin=0.10)
            if c.answer != "undecided":
                alarms += c.differs
                break
        false_same += any(decide_sequential(np.ones(n), np.exp(e[:n]), looks=looks, margin=0.10).answer == "same"
                          for n in range(1, looks + 1))
        x = d[:2]
        naive += any(abs(d[:n].mean()) > t_quantile(0.975, n - 1) * d[:n].std(ddof=1) / math.sqrt(n)
                     for n in range(2, looks + 1)) if len(x) else 0
    assert alarms / sims <= 0.05 and false_same / sims <= 0.05
    assert naive / sims > 0.10  # peeking with a fixed 95% test over-claims: the test above can fail


def test_look_alpha_spends_exactly_five_percent():
    assert sum(look_alpha(k, 9) for k in range(1, 10)) == pytest.approx(0.05)
    assert look_alpha(9, 9) > look_alpha(1, 9)
    with pytest.raises(ValueError, match="look must be between"):
        look_alpha(10, 9)


def test_auto_undecided_says_what_would_settle_it_and_respects_budget():
    sim = SimBench(3, "walk", speedup=1.04)
    c = auto(sim, max_rounds=2)
    assert c.answer == "undecided" and c.rounds == 2 and "max_rounds=" in str(c) and "undecided" in str(c)
    sim = SimBench(4, "jitter", speedup=1.04)
    c = auto(sim, max_rounds=8, budget_s=1e-9)  # the first round always runs; no time for a second
    assert c.rounds == 1 and "budget_s" in c.note


def test_auto_rejects_bad_input():
    sim = SimBench(0, "jitter")
    a, b = sim.run(A), sim.run(B)
    with pytest.raises(ValueError, match="max_rounds"):
        compare(a, b, rounds="auto", max_rounds=0, run=sim.run)
    with pytest.raises(ValueError, match="margin"):
        compare(a, b, rounds="auto", margin=5, run=sim.run)
    with pytest.raises(ValueError, match=r"pass run=bench\.run"):
        compare(a, b, rounds="auto")


def test_auto_pairs_only_back_to_back_trials():
    sim = SimBench(0, "jitter")
    a, _, b = sim.run(A), sim.run(A), sim.run(B)  # a and b did not run back to back
    c = compare(a, b, rounds="auto", max_rounds=2, run=sim.run, log=sim.log)
    assert a.trial_id not in c.a_trials and "did not run back to back" in c.note


def test_t_distribution_tails():
    assert t_quantile(0.9995, 5) == pytest.approx(6.869, rel=1e-3)
    assert t_cdf(t_quantile(0.99, 3.5), 3.5) == pytest.approx(0.99, abs=1e-9)


def test_paired_prior_is_learnt_from_the_logs_back_to_back_repeats():
    assert paired_prior(None) == paired_prior(PRIOR) == (PAIRED_PRIOR_SD, PAIRED_PRIOR_DF)
    few = Noise(0.05, 6.0, 2, 1, 0.05, adjacent=0.03, adjacent_pairs=2)
    assert paired_prior(few) == (PAIRED_PRIOR_SD, PAIRED_PRIOR_DF)  # 2 pairs: not enough to trust
    many = Noise(0.05, 40.0, 36, 3, 0.05, adjacent=0.03, adjacent_pairs=100)
    sd, df = paired_prior(many)
    assert sd == pytest.approx(0.03 * math.sqrt(2)) and df == PAIRED_PRIOR_MAX_DF  # capped: own pairs still count


@pytest.mark.parametrize("pattern", ["jitter", "walk"])
def test_auto_with_a_learnt_prior_keeps_false_alarms_and_decides_sooner(pattern):
    """8 identical trials in the log first: the paired sd starts from their back-to-back spread.
    False alarms stay at most 5% under peeking; a real 1.3x effect is found in fewer rounds."""
    sims = 150
    alarms = sum(auto(SimBench(40_000 + seed, pattern), warm=8, max_rounds=8).answer in ("faster", "slower")
                 for seed in range(sims))
    assert alarms / sims <= 0.05, f"{alarms}/{sims} false alarms with a learnt prior ({pattern})"
    cold = [auto(SimBench(41_000 + seed, pattern, 1.3), max_rounds=8) for seed in range(60)]
    warm = [auto(SimBench(41_000 + seed, pattern, 1.3), warm=8, max_rounds=8) for seed in range(60)]
    assert sum(c.answer == "faster" for c in warm) >= 0.9 * len(warm)
    assert np.mean([c.rounds for c in warm]) < np.mean([c.rounds for c in cold])


def test_same_speed_is_an_equivalence_test_with_its_own_interval():
    """ "Same speed" is two one-sided tests: the interval it shows is the narrower equivalence one,
    and it lies within ±margin; a real 12% gap is never called the same within ±10%."""
    rng = np.random.default_rng(3)
    d = rng.normal(0, 0.03, 8)
    c = decide_sequential(np.ones(8), np.exp(d), looks=8, margin=0.10)
    two_sided = decide_sequential(np.ones(8), np.exp(d), looks=8, margin=0.001)  # undecided: two-sided interval
    assert c.answer == "same" and c.same and 1 / 1.10 <= c.low and c.high <= 1.10
    assert two_sided.answer == "undecided" and two_sided.high - two_sided.low > c.high - c.low
    learnt = Noise(0.05, 40.0, 36, 3, 0.05, adjacent=0.08 / math.sqrt(2), adjacent_pairs=50)
    false_same = 0
    for _ in range(300):
        e = rng.normal(math.log(1.12), 0.08, 9)
        false_same += any(decide_sequential(np.ones(n), np.exp(e[:n]), learnt, looks=9, margin=0.10).answer == "same"
                          for n in range(1, 10))
    assert false_same / 300 <= 0.05


# ---- one_look: the one verdict rule, which decide() and the results table both call ---------------
def test_one_look_by_hand():
    """Four comparisons at once, each worked out by hand from the rule's definition."""
    from workbench.results.stats import one_look

    quiet = Noise(sigma=0.01, df=100.0, repeats=96, configs=4)
    ln = math.log
    look = one_look([1, 1, 10, 3], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1, 1, 10, 3],
                    [ln(1.3), ln(1.6), ln(1.01), ln(1.3)], [0.0, 0.0, 0.0, 0.5], PRIOR)
    prior_half = t_quantile(0.975, 4) * PRIOR_NOISE * math.sqrt(2)  # 2.776 · 10% · √2 = 0.393
    assert look.half[0] == pytest.approx(prior_half) and look.half[0] == pytest.approx(0.3926, abs=1e-3)
    assert look.verdicts[:2] == ["undecided", "faster"]  # log 1.3 = 0.262 < 0.393 < log 1.6 = 0.470
    local = math.sqrt(0.5 / 4)  # 3 + 3 trials: the sides' own spread (0.354) beats the prior's 10%
    assert look.sigma[3] == pytest.approx(local) and look.verdicts[3] == "undecided"
    q = one_look([10], [0.0], [0.0], [10], [ln(1.01)], [0.0], quiet)
    assert q.half[0] == pytest.approx(t_quantile(0.975, 100) * 0.01 * math.sqrt(0.2))
    assert not q.beyond[0] and q.same[0] and q.verdicts == ["same"]  # 1% < MIN_EFFECT; within ±5%
    assert one_look([10], [0.0], [0.0], [10], [ln(1.01)], [0.0], quiet, margin=0.005).verdicts == ["undecided"]


def test_decide_and_the_table_call_one_look(monkeypatch):
    """No second copy of the rule: decide and the table both go through stats.one_look (a spy sees each)."""
    import workbench.results.stats as stats
    import workbench.results.table as table

    calls = []

    def spy(*args, **kwargs):
        calls.append(len(args[0]))
        return real(*args, **kwargs)

    real = stats.one_look
    monkeypatch.setattr(stats, "one_look", spy)
    monkeypatch.setattr(table, "one_look", spy)
    decide([100.0, 101.0], [130.0], PRIOR)
    assert calls == [1]
    log = ResultLog(None)
    for i in range(4):
        log.append(fake([0.01 * (1 + 0.3 * (i % 2))] * 2, num_workers=i % 2))
    assert list(log.frame()["verdict"])[1:] and calls[1:] == [3]  # the 3 rows after the baseline, at once


@pytest.mark.parametrize("seed", range(5))
def test_decide_answers_what_one_look_says(seed):
    from workbench.results.stats import one_look

    rng = np.random.default_rng(seed)
    for _ in range(40):
        a = 100 * np.exp(rng.normal(0, 0.05, rng.integers(1, 6)))
        b = 100 * np.exp(rng.normal(rng.choice([0.0, 0.01, 0.05, 0.3]), 0.05, rng.integers(1, 6)))
        c = decide(a, b, PRIOR)
        xa, xb = np.log(a), np.log(b)
        look = one_look([len(a)], [xa.mean()], [((xa - xa.mean()) ** 2).sum()], [len(b)], [xb.mean()],
                        [((xb - xb.mean()) ** 2).sum()], PRIOR)
        assert c.verdict == look.verdicts[0] and c.low == pytest.approx(math.exp(look.log_ratio[0] - look.half[0]))


def test_a_machine_too_noisy_to_decide_says_so_and_what_to_do():
    """Issue 40: never "±103%": past ±25% between identical trials the noise says it cannot decide small
    differences, and what to do (close other programs, or rounds="auto")."""
    from workbench.results.stats import Noise

    loud = Noise(sigma=0.3, df=20, repeats=10, configs=2, measured=0.4, adjacent=0.37, adjacent_pairs=3)
    assert loud.too_noisy and "too noisy to decide" in str(loud) and 'rounds="auto"' in str(loud)
    assert "%" not in str(loud).split("apart")[0] and "up to" in str(loud)  # a factor, not ±103%
    assert "kept 1.5 cores busy" in loud.advice(1.5)
    quiet = Noise(sigma=0.03, df=20, repeats=10, configs=2, measured=0.03, adjacent=0.02, adjacent_pairs=3)
    assert not quiet.too_noisy and "±6%" in str(quiet)
    assert not Noise(sigma=0.2, df=5, repeats=0, configs=0).too_noisy  # the prior alone is not evidence


def test_beyond_noise_is_a_deprecated_alias_of_differs():
    """The retired word stays readable for old code, with a warning naming what to read instead."""
    c = decide([100.0] * 3, [150.0] * 3)
    with pytest.warns(DeprecationWarning, match=r"\.answer"):
        assert c.beyond_noise is c.differs is True
