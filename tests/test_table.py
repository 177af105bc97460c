"""The results table (ResultLog.frame): typed columns, and verdicts exactly compare's, kept up to date."""


import numpy as np
import pandas as pd
import pytest
from fake_trials import fake, noisy

import workbench as wb
from workbench.core.measure import TrialResult
from workbench.deciding.rounds import compare
from workbench.results import ResultLog
from workbench.results.table import _sides


def test_frame_types_verdicts_and_noise():
    log = ResultLog(None)
    log.append(fake(noisy(0.010, 0.02)))
    log.append(fake(noisy(0.010, 0.02, seed=1)))  # a repeat of the baseline
    log.append(fake(noisy(0.004, 0.02, seed=2), prefetch_factor=4, num_workers=1))
    log.append(TrialResult(knobs=wb.Knobs(cpu_threads=1), status="oom", message="out of memory",
                           started_at="2026-11-30T12:00:00"))
    df = log.frame()
    assert list(df["trial_id"]) == [1, 2, 3, 4] and list(df.index) == [0, 1, 2, 3]  # trial_id once, a column
    assert str(df["prefetch_factor"].dtype) == "Int64" and str(df["cpu_threads"].dtype) == "Int64"
    assert df["prefetch_factor"].isna().sum() == 3 and df["cpu_threads"].iloc[3] == 1
    assert isinstance(df["status"].dtype, pd.CategoricalDtype) and "interrupted" in df["status"].cat.categories
    assert pd.api.types.is_datetime64_any_dtype(df["started_at"]) and df["started_at"].iloc[3].hour == 12
    base = log.trials[0]
    for r, verdict, speedup in zip(log.trials[1:3], df["verdict"].iloc[1:3], df["speedup"].iloc[1:3]):
        c = compare(base if r.knobs == base.knobs else log.trials[:2], r, log=log)  # the baseline's repeats
        assert (verdict, speedup) == (c.verdict, pytest.approx(c.speedup))  # the cell is exactly compare()
    assert df["verdict"].iloc[3] == "" and pd.isna(df["speedup"].iloc[3])
    assert df.attrs["noise"].repeats == 1
    assert (df["samples_per_s_low"] < df["samples_per_s"]).iloc[:3].all()


def test_empty_frame_has_the_summary_columns():
    df = ResultLog(None).frame()
    assert df.empty and "samples_per_s" in df.columns


def test_verdict_column_has_three_answers():
    """A quiet log: a 25% gap is faster, a 1% gap is the same speed (within ±5%), and the
    noise says how far apart back-to-back identical trials and trials minutes apart land."""
    log = ResultLog(None)
    for i in range(16):
        log.append(fake(noisy(0.0100, 0.001, seed=i)))
    same = log.append(fake(noisy(0.0099, 0.001, seed=20), num_workers=1))
    log.append(fake(noisy(0.008, 0.001, seed=21), num_workers=2))
    for i in range(15):  # repeats of the 1% slower configuration: now both sides have 16 trials
        log.append(fake(noisy(0.0099, 0.001, seed=30 + i), num_workers=1))
    c = compare(log.trials[:16], [t for t in log.trials if t.knobs == same.knobs], log=log)
    assert c.answer == "same" and "same speed within ±5%" in str(c)
    verdicts = log.frame().set_index("trial_id")["verdict"]
    assert verdicts[same.trial_id] == "undecided" and verdicts[len(log.trials)] == "same"
    assert verdicts[same.trial_id + 1] in ("faster", "slower")
    words = str(log.noise)
    assert "back-to-back trials of identical knobs typically land within" in words and "pairs" in words
    assert "minutes apart" in words


# ---- incremental results: the same frame, the same verdicts as compare ----------------------------
def test_incremental_verdicts_equal_compare_after_appends_and_noise_changes():
    rng = np.random.default_rng(1)
    log = ResultLog(None)
    for i in range(120):
        workers = int(rng.integers(0, 6))  # repeats of identical knobs: the noise changes as they come
        step = 0.01 * (1 + 0.04 * workers) * (1 + 0.05 * rng.standard_normal())
        log.append(fake([step, step * 1.01], num_workers=workers))
        if i % 17 == 0 or i > 110:
            df = log.frame()
            base, noise = log.baseline, log.noise
            for r, speedup, verdict in zip(log.trials, df["speedup"], df["verdict"]):
                if r.trial_id == base.trial_id:
                    assert verdict == "baseline"
                    continue
                c = compare(*_sides(log.trials, base, r), noise=noise)  # the table pools each side's repeats
                assert verdict == c.verdict and speedup == pytest.approx(c.speedup, rel=1e-9), r.trial_id
    verdicts = set(log.frame()["verdict"])
    assert {"undecided"} <= verdicts and verdicts & {"faster", "slower"}  # both sides of the threshold were exercised
    log.set_baseline(5)
    df = log.frame()
    assert df.loc[df["trial_id"] == 5, "verdict"].item() == "baseline"
    assert all(v == compare(*_sides(log.trials, log.baseline, r), noise=log.noise).verdict
               for r, v in zip(log.trials, df["verdict"]) if r.trial_id != 5)


def test_the_frame_is_a_copy_and_follows_replaced_trials():
    log = ResultLog(None)
    for w in range(4):
        log.append(fake([0.01, 0.011], num_workers=w))
    df = log.frame()
    df.loc[0, "verdict"] = "edited"
    assert log.frame().loc[0, "verdict"] == "baseline"
    log.trials = log.trials[:2]  # someone replaced the list: the table starts over
    assert list(log.frame()["trial_id"]) == [1, 2]


def test_the_tables_noise_is_updated_per_trial_not_recounted(monkeypatch):
    """Each appended trial enters the noise estimator once (no recount of the whole log per trial), and the
    figure after every append equals the batch estimate from all the trials so far."""
    from workbench.results.comparison import NoiseTracker, noise_of

    added = []
    real_add = NoiseTracker.add
    monkeypatch.setattr(NoiseTracker, "add", lambda self, r: (added.append(r.trial_id), real_add(self, r))[1])
    log = ResultLog(None)
    for i in range(12):
        log.append(fake(noisy(0.01, 0.02, n=8, seed=i), num_workers=i % 3 // 2))
        noise = log.noise
        assert added == [i + 1]  # only the new trial entered
        assert noise == noise_of(log.trials)  # equal to the estimate from scratch
        added.clear()
    assert log.noise.repeats == 10 and log.noise.adjacent_pairs > 0


def test_token_trials_verdict_is_judged_on_the_figure_compare_uses():
    """Token batches padded differently (group_by_length): samples/s says slower, tokens/s faster. The
    table's verdict, speedup and figure are compare's, both judged on tokens/s by one rule."""
    from dataclasses import replace

    from workbench.results.comparison import judged_on

    def tokens(seed: int, padding: float, grouped: bool) -> TrialResult:
        step = 0.010 if not grouped else 0.0125  # grouped: fewer samples/s (0.8×) ...
        r = fake(noisy(step, 0.01, seed=seed), group_by_length=grouped)
        real = (1 - padding) * 64 * r.samples_per_s  # ... but real tokens/s 2.4× (64 slots a sample)
        return replace(r, tokens_per_s=real, padding_share=padding)

    log = ResultLog(None)
    for i in range(4):  # alternating A B, four rounds
        log.append(tokens(2 * i, 0.70, False))
        log.append(tokens(2 * i + 1, 0.10, True))
    plain = [t for t in log.trials if not t.knobs.group_by_length]
    grouped = [t for t in log.trials if t.knobs.group_by_length]
    assert judged_on(plain, grouped).rate == "tokens/s"
    by_samples = compare(plain, [replace(t, tokens_per_s=None) for t in grouped], log=log)
    assert by_samples.answer == "slower"  # the figure matters: samples/s alone would say slower
    df = log.frame().set_index("trial_id")
    for r in grouped:
        c = compare(*_sides(log.trials, log.baseline, r), noise=log.noise)
        assert c.rate == "tokens/s" and c.answer == "faster"
        assert df.loc[r.trial_id, "verdict"] == c.verdict
        assert df.loc[r.trial_id, "speedup"] == pytest.approx(c.speedup, rel=1e-9)
    c = compare(plain, grouped, log=log)  # what notebook 11's reader types: the last row agrees with it
    assert (df.loc[grouped[-1].trial_id, "verdict"], c.answer) == ("faster", "faster")
