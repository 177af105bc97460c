"""ResultLog and compare: append-only JSONL that survives restarts, honest verdicts."""

import json

import numpy as np
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


def test_compare_beyond_noise():
    c = compare(fake(noisy(0.010, 0.03)), fake(noisy(0.007, 0.03, seed=1)))
    assert c.beyond_noise and c.speedup == pytest.approx(10 / 7, rel=0.05)
    assert "faster" in str(c) and "beyond noise" in str(c)


def test_compare_refuses_to_crown_a_winner_inside_the_noise():
    c = compare(fake(noisy(0.010, 0.15)), fake(noisy(0.0099, 0.15, seed=1)))
    assert not c.beyond_noise and "within noise" in str(c) and "no winner" in str(c)


def test_compare_small_but_consistent_difference_is_still_noise():
    # a 1% difference with almost no noise: the interval excludes 1, but it is under MIN_EFFECT
    c = compare(fake(noisy(0.0100, 0.001)), fake(noisy(0.0099, 0.001, seed=1)))
    assert not c.beyond_noise


def test_compare_uses_time_per_sample():
    # B takes twice as long per step but does four times the samples: B is 2x faster
    c = compare(fake(noisy(0.01, 0.01), batch=10), fake(noisy(0.02, 0.01, seed=1), batch=40))
    assert c.beyond_noise and c.speedup == pytest.approx(2, rel=0.05)


def test_compare_needs_samples():
    with pytest.raises(ValueError, match="ok trials"):
        compare(fake([0.1, 0.1]), TrialResult(knobs=wb.Knobs(), status="error"))


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
    assert df.loc[2, "verdict"] == "baseline" and df.loc[2, "speedup"] == 1.0
    assert df.loc[1, "label"] == "num_workers=0"  # what differs from the baseline
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
