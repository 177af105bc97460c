"""comparison.judge: one look at trials already run (the core of compare; it runs nothing)."""

from dataclasses import replace

import pytest
from fake_trials import fake, noisy

import workbench as wb
from workbench.core.measure import TrialResult
from workbench.results import ResultLog
from workbench.results.comparison import judge, noise_of


def test_compare_a_large_gap_is_faster_even_on_the_prior():
    c = judge(fake(noisy(0.010, 0.03)), fake(noisy(0.005, 0.03, seed=1), num_workers=1))
    assert c.noise.repeats == 0  # no repeats yet: the conservative prior
    assert c.differs and c.speedup == pytest.approx(2, rel=0.05)
    assert "faster" in str(c) and "95% interval" in str(c) and "1 trial each" in str(c)


def test_compare_says_when_the_sides_ran_with_different_malloc_settings():
    """A trial before wb.keep_freed_memory() against one after differs in page faults, not only in knobs."""
    a = replace(fake(noisy(0.010, 0.03)), env={"malloc": "glibc default"})
    b = replace(fake(noisy(0.008, 0.03, seed=1), num_workers=1), env={"malloc": "kept (keep_freed_memory)"})
    c = judge(a, b)
    assert "different malloc settings (glibc default, kept (keep_freed_memory))" in str(c) and "page faults" in str(c)
    same = judge(a, replace(b, env={"malloc": "glibc default"}))
    old_log = judge(replace(a, env={}), b)  # a record from before the environment had the key
    assert "malloc" not in str(same) and "malloc" not in str(old_log)


def test_compare_says_when_a_side_was_not_steady():
    """A "faster" on a figure that drained the loader's buffer says so (issue 30)."""
    a = replace(fake(noisy(0.010, 0.03)), trial_id=1, extra={"steady": True})
    b = replace(fake(noisy(0.005, 0.03, seed=1), num_workers=1), trial_id=2, extra={"steady": False})
    c = judge(a, b)
    assert c.differs and "Not steady: #2" in str(c) and "repeat" in str(c)
    assert "steady" not in judge(a, replace(b, extra={})).note  # records from before the check: no claim
    log = ResultLog(None)
    log.append(a)
    log.append(b)
    assert list(log.frame()["steady"]) == [True, False]


def test_compare_steady_steps_are_no_evidence_between_trials():
    # 30 very steady steps each and a 25% gap: the old within-run bootstrap called this beyond
    # noise; one pair of trials cannot rule out a 20% run-to-run difference.
    c = judge(fake(noisy(0.010, 0.01)), fake(noisy(0.008, 0.01, seed=1), num_workers=1))
    assert not c.differs and "undecided" in str(c) and "no winner" in str(c)
    assert c.rounds_needed is not None and "rounds=" in str(c)


def test_compare_learns_the_noise_from_repeats_in_the_log():
    log = ResultLog(None)
    for i in range(6):  # a quiet machine: six repeats of the baseline within ~1% of each other
        log.append(fake(noisy(0.010 * (1 + 0.005 * (i % 3 - 1)), 0.01, seed=i)))
    b = log.append(fake(noisy(0.008, 0.01, seed=9), num_workers=2))
    c = judge(log.trials[0], b, log=log)
    assert c.noise.repeats == 5 and c.differs and c.speedup == pytest.approx(1.25, rel=0.03)
    assert "from 5 repeats of 1 configuration" in str(log.noise)


def test_compare_small_but_consistent_difference_is_still_noise():
    # a 1% difference with almost no noise anywhere: under MIN_EFFECT, so no winner
    log = ResultLog(None)
    for i in range(8):
        log.append(fake(noisy(0.0100, 0.001, seed=i)))
    b = log.append(fake(noisy(0.0099, 0.001, seed=20), num_workers=1))
    assert not judge(log.trials[0], b, log=log).differs


def test_compare_uses_samples_per_s():
    # B takes twice as long per step but does four times the samples: B is 2x faster
    c = judge(fake(noisy(0.01, 0.01), batch=10), fake(noisy(0.02, 0.01, seed=1), batch=40, batch_size=40))
    assert c.differs and c.speedup == pytest.approx(2, rel=0.05)


def test_compare_needs_samples():
    with pytest.raises(ValueError, match="ok trials"):
        judge(fake([0.1, 0.1]), TrialResult(knobs=wb.Knobs(), status="error"))


def _logged_trials(n: int = 40, seed: int = 0) -> list[TrialResult]:
    """n numbered ok trials over three configurations, repeats and back-to-back pairs among them, one failure."""
    import numpy as np

    rng = np.random.default_rng(seed)
    knobs = [{}, {"num_workers": 1}, {"num_workers": 2}]
    out = []
    for i in range(n):
        k = knobs[min(2, int(rng.integers(0, 4)))]  # runs of the last knobs: back-to-back pairs
        r = fake(noisy(0.01 * (1 + 0.1 * len(k)), 0.02, n=8, seed=i), **k)
        out.append(replace(r, trial_id=i + 1, samples_per_s=r.samples_per_s * (1 + 0.05 * rng.standard_normal())))
    out[5] = replace(out[5], status="error", samples_per_s=None)  # no evidence, and it breaks a pair
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_noise_tracker_one_at_a_time_equals_the_batch_formulas(seed):
    """The incremental estimator (Welford per configuration, a running sum over back-to-back pairs) gives the
    figure estimate_noise and adjacent_noise give from the same trials at once, whatever their arrival order."""
    import itertools

    import numpy as np

    from workbench.results.comparison import NoiseTracker, usable
    from workbench.results.stats import adjacent_noise, estimate_noise

    trials = _logged_trials(seed=seed)
    ok = [r for r in trials if usable(r)]
    groups = {}
    for r in ok:
        groups.setdefault(r.knobs, []).append(r.samples_per_s)
    pairs = [(x.samples_per_s, y.samples_per_s) for x, y in itertools.pairwise(ok)
             if y.trial_id == x.trial_id + 1 and x.knobs == y.knobs]
    batch = estimate_noise(list(groups.values()))
    assert batch.repeats > 10 and len(pairs) > 5  # the case has evidence of both kinds
    tracker = NoiseTracker()
    for i in np.random.default_rng(seed).permutation(len(trials)):  # any order: trials read back from several files
        tracker.add(trials[i])
    got = tracker.noise()
    assert (got.repeats, got.configs, got.df, got.adjacent_pairs) == (batch.repeats, batch.configs, batch.df, len(pairs))
    assert got.sigma == pytest.approx(batch.sigma, rel=1e-12) and got.measured == pytest.approx(batch.measured, rel=1e-12)
    assert got.adjacent == pytest.approx(adjacent_noise(pairs), rel=1e-12)
    in_order = noise_of(trials)  # noise_of is the same estimator, fed in log order
    assert (in_order.sigma, in_order.adjacent) == (pytest.approx(got.sigma, rel=1e-12), pytest.approx(got.adjacent))


def test_judge_and_the_log_use_one_noise_estimator():
    """judge without a log learns the noise of its trials with noise_of, the same estimator the log's table keeps."""
    log = ResultLog(None)
    for r in _logged_trials(12):
        log.append(replace(r, trial_id=None))
    assert log.noise == noise_of(log.trials)
    a = [r for r in log.trials if r.ok and r.knobs == log.trials[0].knobs]
    b = [r for r in log.trials if r.ok and r.knobs != log.trials[0].knobs][:1]
    assert judge(a, b).noise == noise_of([*a, *b])
