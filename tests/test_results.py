"""ResultLog and compare: append-only JSONL that survives restarts, honest verdicts."""

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

import workbench as wb
from workbench.measure import TrialResult
from workbench.results import ResultLog, compare


def fake(times, status="ok", batch=10, **knobs) -> TrialResult:
    times = tuple(float(t) for t in times)
    return TrialResult(knobs=wb.Knobs(**knobs), status=status, samples_per_s=batch * len(times) / sum(times),
                       step_time_s=float(np.median(times)), step_time_iqr_s=0.0, step_times_s=times,
                       data_wait_s=tuple(0.0 for _ in times), data_wait_share=0.0, samples_per_step=batch,
                       losses=tuple(1.0 / (i + 1) for i in range(len(times))))


def noisy(mean, rel, n=30, seed=0):
    return mean * (1 + rel * np.random.default_rng(seed).standard_normal(n))


def test_compare_a_large_gap_is_beyond_noise_even_on_the_prior():
    c = compare(fake(noisy(0.010, 0.03)), fake(noisy(0.005, 0.03, seed=1), num_workers=1))
    assert c.noise.repeats == 0  # no repeats yet: the conservative prior
    assert c.beyond_noise and c.speedup == pytest.approx(2, rel=0.05)
    assert "faster" in str(c) and "beyond noise" in str(c) and "1 trial each" in str(c)


def test_compare_steady_steps_are_no_evidence_between_trials():
    # 30 very steady steps each and a 25% gap: the old within-run bootstrap called this beyond
    # noise; one pair of trials cannot rule out a 20% run-to-run difference.
    c = compare(fake(noisy(0.010, 0.01)), fake(noisy(0.008, 0.01, seed=1), num_workers=1))
    assert not c.beyond_noise and "within noise" in str(c) and "no winner" in str(c)
    assert c.rounds_needed is not None and "rounds=" in str(c)


def test_compare_learns_the_noise_from_repeats_in_the_log():
    log = ResultLog(None)
    for i in range(6):  # a quiet machine: six repeats of the baseline within ~1% of each other
        log.append(fake(noisy(0.010 * (1 + 0.005 * (i % 3 - 1)), 0.01, seed=i)))
    b = log.append(fake(noisy(0.008, 0.01, seed=9), num_workers=2))
    c = compare(log.trials[0], b, log=log)
    assert c.noise.repeats == 5 and c.beyond_noise and c.speedup == pytest.approx(1.25, rel=0.03)
    assert "from 5 repeats of 1 configuration" in str(log.noise)


def test_compare_small_but_consistent_difference_is_still_noise():
    # a 1% difference with almost no noise anywhere: under MIN_EFFECT, so no winner
    log = ResultLog(None)
    for i in range(8):
        log.append(fake(noisy(0.0100, 0.001, seed=i)))
    b = log.append(fake(noisy(0.0099, 0.001, seed=20), num_workers=1))
    assert not compare(log.trials[0], b, log=log).beyond_noise


def test_compare_uses_samples_per_s():
    # B takes twice as long per step but does four times the samples: B is 2x faster
    c = compare(fake(noisy(0.01, 0.01), batch=10), fake(noisy(0.02, 0.01, seed=1), batch=40, batch_size=40))
    assert c.beyond_noise and c.speedup == pytest.approx(2, rel=0.05)


def test_compare_needs_samples():
    with pytest.raises(ValueError, match="ok trials"):
        compare(fake([0.1, 0.1]), TrialResult(knobs=wb.Knobs(), status="error"))


def test_median_and_iqr_are_derived_from_the_raw_samples():
    r = fake([0.1, 0.2, 0.3, 0.4, 0.5])
    pooled = replace(r, step_times_s=(*r.step_times_s, 1.0, 1.1, 1.2, 1.3))  # a pooled repeat
    assert r.step_time_s == pytest.approx(0.3) and pooled.step_time_s == pytest.approx(0.5)
    assert pooled.step_time_iqr_s > r.step_time_iqr_s
    stale = TrialResult(knobs=wb.Knobs(), status="ok", step_time_s=9.0, step_times_s=(0.1, 0.3))
    assert stale.step_time_s == pytest.approx(0.2)


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


def test_steps_frame_is_long_per_step():
    log = ResultLog(None)
    log.append(fake([0.1, 0.2, 0.3]))
    log.append(TrialResult(knobs=wb.Knobs(), status="error", message="x"))
    log.append(fake([0.4, 0.5]))
    st = log.steps_frame()
    assert list(st.columns) == ["trial_id", "step", "step_time_s", "data_wait_s", "loss"]
    assert list(st["trial_id"]) == [1, 1, 1, 3, 3] and list(st["step"]) == [1, 2, 3, 1, 2]
    assert st["step_time_s"].tolist() == [0.1, 0.2, 0.3, 0.4, 0.5]
    assert ResultLog(None).steps_frame().empty


def test_log_round_trip_and_reload(tmp_path):
    path = tmp_path / "runs.jsonl"
    log = ResultLog(path)
    a = log.append(fake(noisy(0.01, 0.02)))
    b = log.append(fake(noisy(0.008, 0.02, seed=2), num_workers=2))
    log.append(TrialResult(knobs=wb.Knobs(amp="fp16"), status="nan", message="loss became nan",
                           losses=(1.0, float("nan"))))
    log.set_baseline(b.trial_id)
    again = ResultLog(path)
    assert [r.trial_id for r in again.trials] == [1, 2, 3]
    assert again.trials[1] == b and again.trials[0] == a
    assert again.baseline.trial_id == 2
    assert np.isnan(again.trials[2].losses[1])
    df = again.frame()
    assert list(df["status"]) == ["ok", "ok", "nan"]
    by_id = df.set_index("trial_id")
    assert by_id.loc[2, "verdict"] == "baseline" and by_id.loc[2, "speedup"] == 1.0
    assert by_id.loc[1, "label"] == "num_workers=0"  # what differs from the baseline
    for line in path.read_text().splitlines():
        json.loads(line)  # plain JSON, no NaN tokens


def test_truncated_last_line_loads_every_complete_record(tmp_path):
    path = tmp_path / "runs.jsonl"
    log = ResultLog(path)
    for i in range(3):
        log.append(fake(noisy(0.01, 0.02, seed=i)))
    text = path.read_text()
    path.write_text(text + text.splitlines()[0][:40])  # a crash mid-write
    with pytest.warns(UserWarning, match="last line"):
        again = ResultLog(path)
    assert len(again.trials) == 3
    again.append(fake(noisy(0.01, 0.02)))
    assert [r.trial_id for r in ResultLog(path).trials] == [1, 2, 3, 4]  # and no warning now
    assert path.with_suffix(".broken").read_text().startswith(text[:40])  # the fragment is kept


def test_baseline_must_be_ok(tmp_path):
    log = ResultLog(None)
    log.append(TrialResult(knobs=wb.Knobs(), status="error", message="x"))
    assert log.baseline is None
    with pytest.raises(ValueError, match="only an ok trial"):
        log.set_baseline(1)
    with pytest.raises(ValueError, match="no trial #7"):
        log.get(7)


def test_observers_see_every_append():
    log, seen = ResultLog(None), []
    log.observe(seen.append)
    log.append(fake([0.1, 0.1]))
    assert [r.trial_id for r in seen] == [1]


def test_empty_frame_has_the_summary_columns():
    df = ResultLog(None).frame()
    assert df.empty and "samples_per_s" in df.columns


def test_verdict_column_has_three_answers():
    """A quiet log: a 25% gap is beyond noise, a 1% gap is the same speed (within ±5%), and the
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
    assert verdicts[same.trial_id] == "within noise" and verdicts[len(log.trials)] == "same speed"
    assert verdicts[same.trial_id + 1] == "beyond noise"
    words = str(log.noise)
    assert "back-to-back trials of identical knobs typically land within" in words and "pairs" in words
    assert "minutes apart" in words
