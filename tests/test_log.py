"""ResultLog: append-only JSONL that survives restarts, crashes and any write failure."""

import json

import numpy as np
import pytest
from fake_trials import fake, noisy

import workbench as wb
from workbench.core.measure import TrialResult
from workbench.results.log import ResultLog


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
    assert (by_id.loc[1, "label"], by_id.loc[2, "label"]) == ("defaults", "num_workers=2")  # vs the defaults
    assert list(by_id["baseline"]) == [False, True, False]  # the baseline is its own column, not a label
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


# ---- the one reader of JSONL logs (the log's own reads and the workshop's gather) ---------------
def _three_lines(tmp_path):
    path = tmp_path / "runs.jsonl"
    log = ResultLog(path)
    for i in range(3):
        log.append(fake(noisy(0.01, 0.02, seed=i), num_workers=i))
    return path, path.read_bytes().splitlines(keepends=True)


def test_read_appended_takes_finished_lines_and_leaves_a_half_written_one(tmp_path):
    from workbench.results.log import read_appended

    path, lines = _three_lines(tmp_path)
    path.write_bytes(lines[0] + b"not json\n" + lines[1] + lines[2][:50])  # a bad line; a write in progress
    got = read_appended(path)
    assert [r.trial_id for r in got.trials] == [1, 2] and [i for i, _ in got.bad] == [1]
    assert "not JSON" in str(got.bad[0][1]) and got.tail == lines[2][:50] and got.lines == 3
    assert got.end == len(lines[0]) + len(b"not json\n") + len(lines[1])  # the half line is read again later
    with open(path, "ab") as f:
        f.write(lines[2][50:].rstrip(b"\n"))  # the record is whole now, its newline not yet written
    more = read_appended(path, got.end, got.ident)
    assert [r.trial_id for r in more.trials] == [3] and not more.bad and not more.tail and not more.restarted
    assert more.end == path.stat().st_size
    path.unlink()
    path.write_bytes(lines[0])  # replaced by another file: read again from its start
    again = read_appended(path, more.end, more.ident)
    assert again.restarted and [r.trial_id for r in again.trials] == [1]


def test_read_appended_caps_and_refuses(tmp_path):
    import os

    from workbench.results.log import Unreadable, read_appended

    path, lines = _three_lines(tmp_path)
    cap = len(lines[0]) + len(lines[1]) + 10  # the cap falls inside the third line
    got = read_appended(path, max_bytes=cap)
    assert got.capped and [r.trial_id for r in got.trials] == [1, 2] and not got.tail and not got.bad
    with pytest.raises(Unreadable, match="larger than"):
        read_appended(path, max_bytes=cap, refuse_larger=True)
    link = tmp_path / "link.jsonl"
    link.symlink_to(path)
    with pytest.raises(Unreadable, match="symbolic link"):
        read_appended(link)
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(Unreadable, match="FIFO"):  # a plain open() would block here
        read_appended(fifo)
    assert isinstance(Unreadable("x"), ValueError) and isinstance(Unreadable("x"), OSError)


def test_a_log_path_that_is_a_symlink_or_fifo_is_neither_followed_nor_blocking(tmp_path):
    """The log's own file is opened without following a link (a planted link in a shared folder would
    send a learner's appends elsewhere): the trial stays in memory, with the usual warning and way out."""
    import os

    path, _ = _three_lines(tmp_path)
    before = path.read_bytes()
    link = tmp_path / "link.jsonl"
    link.symlink_to(path)
    with pytest.warns(RuntimeWarning, match="could not read the result log .*symbolic link"):
        log = ResultLog(link)
    assert log.trials == []
    with pytest.warns(RuntimeWarning, match="could not write the result log .*symbolic link"):
        kept = log.append(fake([0.01, 0.011]))
    assert kept.trial_id == 1 and log.unsaved == 1 and path.read_bytes() == before  # the target is untouched
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    with pytest.warns(RuntimeWarning, match="not a regular file"):
        assert ResultLog(fifo).trials == []


def test_the_log_and_gather_read_a_file_alike(tmp_path):
    """One reader: the same damaged file gives the same trials to the log and to the workshop's read_log."""
    from workbench.faces.workshop import read_log

    path, lines = _three_lines(tmp_path)
    damaged = lines[0] + b'{"status": "ok", "trial_id": -1}\n' + lines[1] + lines[2]
    path.write_bytes(damaged)
    with pytest.warns(UserWarning, match=r"line 2 \(trial_id"):
        gathered, _ = read_log(path)
    with pytest.warns(UserWarning, match=r"line 2 \(trial_id"):
        own = ResultLog(path).trials
    assert own == gathered and [r.trial_id for r in own] == [1, 2, 3]


# ---- files the log writes beside itself, numpy figures, long trials (issue 49) ------------------------
def test_the_broken_side_file_and_save_s_temporary_file_never_follow_a_planted_link(tmp_path):
    """`<log>.broken` and save()'s temporary file are opened without following a link: a link planted
    there (a shared folder) must not send the fragment, or a truncating write, to another file."""
    import os

    path, lines = _three_lines(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"keep me\n")
    path.write_bytes(b"".join(lines) + lines[0][:40])  # a crash mid-write: the fragment goes to .broken
    path.with_suffix(".broken").symlink_to(victim)
    with pytest.warns(UserWarning, match="last line"):
        log = ResultLog(path)
    assert victim.read_bytes() == b"keep me\n" and [r.trial_id for r in log.trials] == [1, 2, 3]
    assert path.read_bytes() == b"".join(lines)  # the log still heals
    out = tmp_path / "out"
    out.mkdir()
    for pid in {os.getpid(), *range(os.getpid() - 2, os.getpid() + 3)}:  # a temporary name guessed ahead
        (out / f".log.jsonl.{pid}.tmp").symlink_to(victim)
    saved = log.save(out / "log.jsonl")
    assert victim.read_bytes() == b"keep me\n"
    assert [r.trial_id for r in ResultLog(saved).trials] == [1, 2, 3]
    assert not saved.is_symlink() and stat_mode(saved) & 0o022 == 0


def stat_mode(p):
    import os

    return os.lstat(p).st_mode


def test_numpy_figures_of_any_kind_are_logged_not_lost(tmp_path):
    """A NaN held as np.float32 (or any numpy scalar, in any field) is cleaned like a float: the trial is
    appended and reloads, never lost to a ValueError."""
    log = ResultLog(tmp_path / "log.jsonl")
    r = fake([0.01, 0.011])
    odd = TrialResult(knobs=r.knobs, status="ok", samples_per_s=np.float32(123.5), step_times_s=r.step_times_s,
                      data_wait_s=r.data_wait_s, data_wait_share=np.float32("nan"), samples_per_step=np.int64(10),
                      peak_memory_bytes=np.int64(1 << 20), losses=(np.float32("nan"), np.float64(0.5)),
                      extra={"flag": np.bool_(True), "inf": np.float64("inf"), "ints": [np.int32(3)],
                             "arr": np.arange(3, dtype=np.int16), "half": np.float16(0.25)})
    got = log.append(odd)
    assert got.trial_id == 1 and log.unsaved == 0 and log.write_error is None
    back = ResultLog(log.path).trials[0]
    assert back.samples_per_s == 123.5 and back.data_wait_share is None and back.samples_per_step == 10
    assert back.peak_memory_bytes == 1 << 20 and np.isnan(back.losses[0]) and back.losses[1] == 0.5
    assert back.extra["flag"] is True and back.extra["inf"] is None and back.extra["ints"] == [3]
    assert back.extra["arr"] == [0, 1, 2] and back.extra["half"] == 0.25
    assert ResultLog(None).append(odd).trial_id == 1  # the memory-only log cleans the same way


def test_a_200_000_step_trial_round_trips_through_the_reader_with_every_figure(tmp_path):
    """The writer stores what the reader reads: a trial of 200,000 steps (a JSONL line of several MB inline)
    is written within the reader's line cap and reloads in a fresh reader with its whole series."""
    from workbench.results.log import read_appended
    from workbench.results.records import MAX_LINE_BYTES

    n = 200_000
    rng = np.random.default_rng(0)
    times = tuple(float(x) for x in 0.01 * (1 + 0.1 * rng.standard_normal(n)).clip(0.5))
    waits = tuple(float(x) for x in 0.001 * rng.random(n))
    losses = tuple(float(x) for x in 2.0 / np.arange(1, n + 1))
    r = TrialResult(knobs=wb.Knobs(), status="ok", samples_per_s=10 * n / sum(times), step_times_s=times,
                    data_wait_s=waits, data_wait_share=sum(waits) / sum(times), samples_per_step=10,
                    losses=(*losses[:-1], float("nan")))
    path = tmp_path / "log.jsonl"
    log = ResultLog(path)
    log.append(r)
    log.append(fake([0.01, 0.011]))
    assert all(len(line) <= MAX_LINE_BYTES for line in path.read_bytes().splitlines(keepends=True))
    got = read_appended(path)
    assert not got.bad and [t.trial_id for t in got.trials] == [1, 2]  # the raw reader takes both lines
    back = ResultLog(path).trials[0]  # a fresh reader, as after a restart
    assert back.step_times_s == times and back.data_wait_s == waits
    assert back.losses[:-1] == losses[:-1] and np.isnan(back.losses[-1])
    for name in ("samples_per_s", "step_time_s", "step_time_iqr_s", "data_wait_share"):
        assert getattr(back, name) == getattr(r, name), name
    row = ResultLog(path).frame().iloc[0]
    assert row["final_loss"] == losses[-2] and row["step_time_ms"] == r.step_time_s * 1e3
    moved = ResultLog(path).save(tmp_path / "moved")  # the way out writes the same bounded lines
    assert all(len(line) <= MAX_LINE_BYTES for line in moved.read_bytes().splitlines(keepends=True))
    assert ResultLog(moved).trials[0].step_times_s == times
    import shutil

    shutil.rmtree(path.with_suffix(".series"))  # the side file lost: the trial stays, with its first steps, said
    with pytest.warns(UserWarning, match=r"full step series of #1 .*first 1,000 steps"):
        short = ResultLog(path).trials[0]
    assert short.step_times_s == times[:1000] and short.samples_per_s == r.samples_per_s


def test_a_record_with_huge_text_or_diagnostics_still_fits_the_reader(tmp_path):
    from workbench.results.records import MAX_LINE_BYTES

    log = ResultLog(tmp_path / "log.jsonl")
    r = TrialResult(knobs=wb.Knobs(), status="error", message="m" * 2_000_000, traceback="t" * 2_000_000,
                    extra={"blob": "x" * 2_000_000})
    log.append(r)
    assert len(log.path.read_bytes()) <= MAX_LINE_BYTES
    back = ResultLog(log.path).trials[0]
    assert back.status == "error" and back.message.startswith("m" * 1000) and back.traceback.endswith("t" * 1000)
    assert "blob" not in back.extra and any("extra diagnostics dropped" in n for n in back.notes)
