"""ResultLog and compare: append-only JSONL that survives restarts, honest verdicts."""

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import workbench as wb
from workbench.measure import TrialResult
from workbench.results import ResultLog, _sides, compare


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


def test_compare_says_when_the_sides_ran_with_different_malloc_settings():
    """A trial before wb.keep_freed_memory() against one after differs in page faults, not only in knobs."""
    a = replace(fake(noisy(0.010, 0.03)), env={"malloc": "glibc default"})
    b = replace(fake(noisy(0.008, 0.03, seed=1), num_workers=1), env={"malloc": "kept (keep_freed_memory)"})
    c = compare(a, b)
    assert "different malloc settings (glibc default, kept (keep_freed_memory))" in str(c) and "page faults" in str(c)
    same = compare(a, replace(b, env={"malloc": "glibc default"}))
    old_log = compare(replace(a, env={}), b)  # a record from before the environment had the key
    assert "malloc" not in str(same) and "malloc" not in str(old_log)


def test_compare_says_when_a_side_was_not_steady():
    """A "beyond noise" on a figure that drained the loader's buffer says so (issue 30)."""
    a = replace(fake(noisy(0.010, 0.03)), trial_id=1, extra={"steady": True})
    b = replace(fake(noisy(0.005, 0.03, seed=1), num_workers=1), trial_id=2, extra={"steady": False})
    c = compare(a, b)
    assert c.beyond_noise and "Not steady: #2" in str(c) and "repeat" in str(c)
    assert "steady" not in compare(a, replace(b, extra={})).note  # records from before the check: no claim
    log = ResultLog(None)
    log.append(a)
    log.append(b)
    assert list(log.frame()["steady"]) == [True, False]


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


# ---- untrusted content: every bad line skipped with one warning, never its content ---------------
SECRET = "TOPSECRET-do-not-echo"


def hostile_lines(good: dict) -> list[bytes]:
    """One line of each kind a reader must survive (good records between them)."""
    inf = {**good, "samples_per_s": 1e400, "message": SECRET}
    negative = {**good, "batch_size": -5, "message": SECRET}
    neg_rate = {**good, "samples_per_s": -3.0, "message": SECRET}
    wrong = {**good, "step_times_s": SECRET}
    return [
        b"[" * 100_000 + SECRET.encode(),  # deep nesting (RecursionError in json before)
        b'{"x": "' + SECRET.encode() * 100_000 + b'"}',  # a huge line
        json.dumps(inf).replace("Infinity", "1e400").encode(),
        json.dumps({**good, "samples_per_s": float("nan"), "message": SECRET}).encode(),  # NaN literal
        json.dumps(negative).encode(),
        json.dumps(neg_rate).encode(),
        json.dumps(wrong).encode(),
        bytes(range(256)) + SECRET.encode(),  # binary garbage
        json.dumps([SECRET]).encode(),
        json.dumps({**good, "trial_id": True}).encode(),
        json.dumps({**good, "amp": SECRET}).encode(),  # a knob failing validation
    ]


def test_hostile_log_lines_are_skipped_with_one_warning_naming_the_lines(tmp_path):
    good = ResultLog(None).append(fake([0.01, 0.011, 0.012]))
    rec = json.loads(json.dumps(good.to_record()))
    path = tmp_path / "log.jsonl"
    lines = [json.dumps(rec).encode(), *hostile_lines(rec), json.dumps({**rec, "trial_id": 2}).encode()]
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.warns(UserWarning) as caught:
        log = ResultLog(path)
    assert [r.trial_id for r in log.trials] == [1, 2]
    text = " ".join(str(w.message) for w in caught)
    assert len(caught) == 1 and "log.jsonl" in text and "line 2 (" in text and "12 unreadable" in text  # the garbage holds a newline: two lines
    assert SECRET not in text and "\\x" not in text
    assert log.append(fake([0.01, 0.01])).trial_id == 3  # the log stays usable


def test_parse_record_rejects_deep_nesting_before_parsing():
    from workbench.results import BadRecord, parse_record

    with pytest.raises(BadRecord, match="nested deeper"):
        parse_record("[" * 200 + "]" * 200)
    with pytest.raises(BadRecord, match="longer than"):
        parse_record("1" * (2 << 20))
    assert parse_record('{"event": "baseline", "trial_id": 3}') == ("baseline", 3)
    with pytest.raises(BadRecord):  # brackets inside strings do not count, but the record is foreign
        parse_record(json.dumps({"message": "[" * 100}))


# ---- a measured trial survives any write failure ----------------------------------------------
@pytest.mark.parametrize("err", ["ENOSPC", "EROFS", "EACCES", "EIO"])
def test_a_failed_write_keeps_the_trial_warns_once_and_cuts_the_partial_line(tmp_path, monkeypatch, err):
    import errno
    import os

    log = ResultLog(tmp_path / "log.jsonl")
    log.append(fake([0.01, 0.011]))
    first = log.path.read_bytes()
    real_fsync = os.fsync

    def full(fd):  # the bytes went to the page cache, the disk refuses them
        raise OSError(getattr(errno, err), os.strerror(getattr(errno, err)))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.warns(RuntimeWarning, match=r"could not write.*bench\.log\.save") as caught:
        second = log.append(fake([0.012, 0.013], num_workers=1))
        third = log.append(fake([0.014, 0.013], num_workers=2))
    assert len(caught) == 1  # once, not per trial
    assert os.strerror(getattr(errno, err)) in str(caught[0].message)
    assert (second.trial_id, third.trial_id) == (2, 3) and log.unsaved == 2
    assert [r.trial_id for r in log.trials] == [1, 2, 3]
    assert len(log.frame()) == 3
    assert log.path.read_bytes() == first  # earlier lines intact, no partial line left behind
    monkeypatch.setattr(os, "fsync", real_fsync)
    with pytest.warns(RuntimeWarning, match="works again"):
        log.append(fake([0.01, 0.01], num_workers=3))
    assert [r.trial_id for r in ResultLog(log.path).trials] == [1, 2, 3, 4] and log.unsaved == 0


def test_a_vanished_or_unwritable_folder_keeps_the_trial_and_save_moves_the_log(tmp_path, monkeypatch):
    import builtins
    import errno

    log = ResultLog(tmp_path / "share" / "log.jsonl")
    log.append(fake([0.01, 0.011]))
    real_open = builtins.open

    def refuse(file, mode="r", *a, **k):
        if "share" in str(file) and any(c in mode for c in "aw+"):
            raise PermissionError(errno.EACCES, "Permission denied", str(file))
        return real_open(file, mode, *a, **k)

    monkeypatch.setattr(builtins, "open", refuse)
    with pytest.warns(RuntimeWarning, match="Permission denied"):
        kept = log.append(fake([0.012, 0.013], num_workers=1))
    log.set_baseline(kept.trial_id)  # a baseline change is kept in memory too
    assert kept.trial_id == 2 and log.unsaved == 2
    monkeypatch.undo()
    moved = log.save(tmp_path / "elsewhere")
    assert moved == tmp_path / "elsewhere" / "log.jsonl" and log.path == moved and log.unsaved == 0
    again = ResultLog(moved)
    assert [r.trial_id for r in again.trials] == [1, 2] and again.baseline.trial_id == 2
    assert log.append(fake([0.01, 0.01], num_workers=2)).trial_id == 3
    assert len(ResultLog(moved).trials) == 3


def test_an_interrupted_write_leaves_no_partial_line(tmp_path, monkeypatch):
    import errno

    log = ResultLog(tmp_path / "log.jsonl")
    log.append(fake([0.01, 0.011]))
    first = log.path.read_bytes()

    import os

    real_write = os.write
    calls = []

    def half(fd, data):  # the first write lands half, the next finds the disk full
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", half)
    with pytest.warns(RuntimeWarning, match="No space left"):
        log.append(fake([0.012, 0.013], num_workers=1))
    assert log.path.read_bytes() == first
    monkeypatch.undo()
    with pytest.warns(RuntimeWarning, match="works again"):
        log.append(fake([0.012, 0.013], num_workers=2))
    assert [r.trial_id for r in ResultLog(log.path).trials] == [1, 2, 3]


def test_a_full_filesystem_for_real(tmp_path):
    """A 64 KiB tmpfs filled to the brim: every trial comes back and stays; earlier lines read back."""
    import os
    import subprocess

    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a small tmpfs is not permitted here")
    try:
        log = ResultLog(mnt / "log.jsonl")
        log.append(fake([0.01] * 30))
        (mnt / "filler").write_bytes(b"\0" * (64 * 1024 - log.path.stat().st_size - 4096 - 100))
        with pytest.warns(RuntimeWarning, match="No space left"):
            for i in range(40):  # ~1.4 KB each: the disk fills up on the way
                log.append(fake([0.01 + i * 1e-4] * 30, num_workers=i % 3))
        assert len(log.trials) == 41 and log.unsaved > 0 and len(log.frame()) == 41
        written = ResultLog(log.path).trials  # every line on disk is whole
        assert [r.trial_id for r in written] == list(range(1, len(written) + 1))
        assert written[0] == log.trials[0]
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, check=False)


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
    assert {"beyond noise", "within noise"} <= verdicts  # both sides of the threshold were exercised
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


# ---- property tests: arbitrary bytes and arbitrary JSON never raise from the readers -------------

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
                    max_leaves=30)
FIELDS = ["status", "trial_id", "samples_per_s", "step_times_s", "batch_size", "amp", "losses", "env", "notes",
          "peak_memory_bytes", "checkpoint", "event", "participant"]
RECORDS = st.dictionaries(st.sampled_from(FIELDS), JSON, max_size=8)  # near-misses of a real record


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.binary(max_size=300) | RECORDS.map(lambda d: json.dumps(d).encode()), max_size=6))
def test_reading_arbitrary_lines_never_raises(tmp_path, chunks):
    import warnings as w

    from workbench.results import read_records

    trials, _, _ = read_records(b"\n".join(chunks).split(b"\n"))
    assert all(isinstance(r.samples_per_s, (float, int, type(None))) for r in trials)
    path = tmp_path / "fuzz.jsonl"
    path.write_bytes(b"\n".join(chunks))
    with w.catch_warnings(record=True) as caught:
        w.simplefilter("always")
        log = ResultLog(path)
    assert all(issubclass(c.category, UserWarning) for c in caught)  # the documented warning only
    log.frame()  # whatever was accepted can be tabled


@settings(max_examples=150, deadline=None)
@given(JSON)
def test_parse_record_of_arbitrary_json_raises_only_bad_record(value):
    from workbench.results import BadRecord, parse_record

    try:
        kind, _ = parse_record(json.dumps(value))
    except BadRecord:
        return
    assert kind in ("trial", "baseline")
