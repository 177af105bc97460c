"""Workshops: learners share one folder (no trial lost or duplicated); the instructor gathers it."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import textwrap
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, TinyNet, tiny_data
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import workbench as wb
from workbench.core.measure import TrialResult
from workbench.faces.workshop import RESULT_COLUMNS, SUMMARY_COLUMNS, Workshop, gather
from workbench.results import ResultLog, default_participant


def fake(mean: float, *, rel: float = 0.01, seed: int = 0, cpu: str = "Test CPU", cores: int = 2,
         gpu: str = "", **knobs) -> TrialResult:
    """An ok trial of 30 steps around `mean` seconds (10 samples per step) on a named machine."""
    times = tuple(float(t) for t in mean * (1 + rel * np.random.default_rng(seed).standard_normal(30)))
    env = {"torch": torch.__version__, "device": "cpu", "device_name": cpu, "cpu_model": cpu,
           "cpu_count": cores, "gpu_name": gpu}
    return TrialResult(knobs=wb.Knobs(**knobs), status="ok", samples_per_s=10 * len(times) / sum(times),
                       step_time_s=float(np.median(times)), step_time_iqr_s=0.0, step_times_s=times,
                       samples_per_step=10, losses=(1.0,) * len(times), env=env)


def learner_log(folder: Path, who: str, trials: list[TrialResult], name: str = "demo-cnn") -> Path:
    log = ResultLog(folder / who / f"{name}.jsonl", participant=who)
    for r in trials:
        log.append(r)
    return log.path


# ---- the learner side: participant and file layout ------------------------------------------
def test_participant_names_the_file_and_every_record(tmp_path):
    bench = wb.Workbench(TinyNet(), tiny_data(), loss_fn=torch.nn.CrossEntropyLoss(), log=tmp_path,
                         name="tiny", participant="ana", steps=2, warmup_steps=0)
    r = bench.run()
    assert bench.log.path == tmp_path / "ana" / "tiny.jsonl"
    assert r.participant == "ana"
    assert json.loads(bench.log.path.read_text().splitlines()[0])["participant"] == "ana"
    assert {"cpu_model", "cpu_count", "gpu_name", "torch"} <= set(r.env)
    # the default participant (no workshop): the file stays <log>/<name>.jsonl, the record says who
    solo = wb.Workbench(TinyNet(), tiny_data(), loss_fn=torch.nn.CrossEntropyLoss(), log=tmp_path,
                        name="solo", steps=2, warmup_steps=0)
    assert solo.log.path == tmp_path / "solo.jsonl"
    assert solo.run().participant == default_participant()


def test_default_participant_is_user_at_host_or_the_hub_user(monkeypatch):
    monkeypatch.delenv("JUPYTERHUB_USER", raising=False)
    assert "@" in default_participant()
    monkeypatch.setenv("JUPYTERHUB_USER", "ana")
    assert default_participant() == "ana"


def test_bad_participant_names_the_fix():
    with pytest.raises(TypeError, match="participant must be a name"):
        wb.Workbench(TinyNet(), tiny_data(), loss_fn=torch.nn.CrossEntropyLoss(), log=None, participant=7)
    with pytest.raises(ValueError, match="participant='ana'"):
        wb.Workbench(TinyNet(), tiny_data(), loss_fn=torch.nn.CrossEntropyLoss(), log=None, participant=" ")


# ---- one shared log file: locked appends, ids numbered after everyone's ---------------------
def test_two_logs_on_one_file_number_after_each_other(tmp_path):
    path = tmp_path / "shared.jsonl"
    a, b = ResultLog(path, participant="a"), ResultLog(path, participant="b")  # two kernels, both empty
    assert a.append(fake(0.01)).trial_id == 1
    assert b.append(fake(0.01)).trial_id == 2  # the bug was 1: b numbered from its own list
    assert a.append(fake(0.01)).trial_id == 3
    assert [r.trial_id for r in a.trials] == [1, 2, 3]  # a read b's trial before numbering
    assert [r.participant for r in ResultLog(path).trials] == ["a", "b", "a"]


def test_without_os_locks_a_partial_line_is_skipped_not_cut(tmp_path, monkeypatch):
    """Off POSIX (no fcntl) an unterminated last line may be another process mid-write: leave it."""
    import workbench.results.log as resultlog

    monkeypatch.setattr(resultlog, "_LOCKS", False)
    path = tmp_path / "shared.jsonl"
    ResultLog(path).append(fake(0.01))
    fragment = path.read_text().splitlines()[0][:40]
    with open(path, "a") as f:
        f.write(fragment)
    with pytest.warns(UserWarning, match="last line"):
        log = ResultLog(path)
    assert log.append(fake(0.01)).trial_id == 2
    lines = path.read_text().splitlines()
    assert lines[1] == fragment and json.loads(lines[2])["trial_id"] == 2  # kept, and ours on a line of its own
    assert not path.with_suffix(".broken").exists()


def _append_many(path: str, who: str, n: int) -> None:
    log = ResultLog(path, participant=who)  # opened before the others write: the old failure mode
    for i in range(n):
        log.append(fake(0.01, seed=i))


@pytest.mark.skipif(os.name != "posix", reason="appends are locked with fcntl on POSIX only")
def test_two_processes_appending_to_one_log_lose_and_duplicate_nothing(tmp_path):
    path = str(tmp_path / "shared.jsonl")
    ctx = multiprocessing.get_context("fork")  # no torch work in the children, only file appends
    procs = [ctx.Process(target=_append_many, args=(path, who, 25)) for who in ("p1", "p2")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    records = [json.loads(line) for line in Path(path).read_text().splitlines()]  # every line whole
    ids = [r["trial_id"] for r in records]
    assert sorted(ids) == list(range(1, 51))  # 50 trials, none lost, no id twice
    assert sorted(r["participant"] for r in records).count("p1") == 25


# ---- the instructor side: gather ------------------------------------------------------------
def alternating(base_s: float, change_s: float, rounds: int = 3, **machine) -> list[TrialResult]:
    """Baseline and `num_workers=2` trials in alternating rounds (the way bench.compare runs them)."""
    out = []
    for i in range(rounds):
        out += [fake(base_s, seed=2 * i, **machine), fake(change_s, seed=2 * i + 1, num_workers=2, **machine)]
    return out


def three_learners(folder: Path) -> None:
    """ana: workers help; ben: a 1% gap (same or undecided); cho (a GPU machine): workers hurt. Each ran 3 rounds."""
    learner_log(folder, "ana", alternating(0.010, 0.007))
    learner_log(folder, "ben", alternating(0.010, 0.0099, cores=8, cpu="Other CPU"))
    learner_log(folder, "cho", alternating(0.010, 0.013, gpu="Some GPU"))


def test_a_single_trial_each_is_undecided_and_the_summary_never_calls_it_same(tmp_path):
    """One trial a side cannot beat run-to-run noise (±20% between identical trials): undecided, and the
    summary counts it under `undecided`, not under `same` (undecided is not "no change")."""
    learner_log(tmp_path, "solo", [fake(0.010), fake(0.009, seed=1, num_workers=2)])
    ws = gather(tmp_path)
    assert list(ws.results["verdict"]) == ["baseline", "undecided"]
    row = ws.summary().iloc[0]
    assert (row["faster"], row["same"], row["slower"], row["undecided"]) == (0, 0, 0, 1)
    assert "no_change" not in ws.summary().columns


def test_gather_summary_counts_machines_by_answer(tmp_path):
    three_learners(tmp_path)
    ws = gather(tmp_path)
    df = ws.results
    assert len(df) == 18 and ws.participants == ["ana", "ben", "cho"]
    assert set(RESULT_COLUMNS) <= set(df.columns) and df["uid"].is_unique
    assert set(df.loc[df["participant"] == "cho", "machine"]) == {"Test CPU ×2 + Some GPU"}
    assert (df.loc[df["verdict"] == "baseline", "speedup"] - 1.0).abs().max() < 0.01  # repeats of the baseline
    s = ws.summary()
    assert list(s.columns) == SUMMARY_COLUMNS and len(s) == 1
    row = s.iloc[0]
    assert row["knob"] == "num_workers=2" and row["machines"] == 3
    assert (row["faster"], row["slower"], row["failed"]) == (1, 1, 0)
    assert row["same"] + row["undecided"] == 1  # ben's 1% gap: one of the two, each in its own column
    said = df.loc[df["participant"] == "ben"].sort_values("trial_id")["verdict"].iloc[-1]
    assert row[said] == 1  # the column is ben's own answer
    assert row["min_speedup"] < 1 < row["max_speedup"]


def test_participants_sharing_one_file_each_get_their_own_baseline(tmp_path):
    path = tmp_path / "class.jsonl"  # everyone passed log="class.jsonl": one locked file
    a, b = ResultLog(path, participant="ana"), ResultLog(path, participant="ben")
    a.append(fake(0.010))
    b.append(fake(0.020, seed=1))
    a.append(fake(0.005, seed=2, num_workers=2))
    b.append(fake(0.010, seed=3, num_workers=2))
    df = gather(tmp_path).results.set_index("uid")
    assert list(df["participant"]) == ["ana", "ben", "ana", "ben"]
    assert list(df["verdict"].iloc[:2]) == ["baseline", "baseline"]
    assert df["speedup"].iloc[2:].round(1).tolist() == [2.0, 2.0]  # vs their own first trial


def test_gather_chart_puts_every_machine_side_by_side(tmp_path):
    three_learners(tmp_path)
    chart = gather(tmp_path).chart()
    spec = chart.to_dict()
    assert spec["facet"]["column"]["field"] == "knob"
    assert sorted(chart.data["participant"]) == ["ana", "ben", "cho"]
    assert {"speedup_low", "speedup_high"} <= set(chart.data.columns)  # the noise interval is drawn
    only_baselines = tmp_path / "later"
    learner_log(only_baselines, "dan", [fake(0.010)])
    assert "No compared trials" in json.dumps(gather(only_baselines).chart().to_dict())


def test_gather_skips_truncated_and_foreign_files_with_a_warning(tmp_path):
    three_learners(tmp_path)
    (tmp_path / "dan").mkdir()
    (tmp_path / "dan" / "notes.jsonl").write_text("participant,score\nana,3\n")  # not JSON lines
    (tmp_path / "eve").mkdir()
    (tmp_path / "eve" / "other.jsonl").write_text('{"loss": 0.3, "epoch": 1}\n')  # another program's JSONL
    cut = tmp_path / "ana" / "demo-cnn.jsonl"
    text = cut.read_text()
    cut.write_text(text + text.splitlines()[0][:50])  # ana's machine crashed mid-write
    with pytest.warns(UserWarning) as caught:
        ws = gather(tmp_path)
    messages = " ".join(str(w.message) for w in caught)
    assert "notes.jsonl" in messages and "other.jsonl" in messages and "last line" in messages
    assert set(ws.skipped) == {"dan/notes.jsonl", "eve/other.jsonl"}
    assert len(ws.results) == 18  # ana's six complete trials still count
    assert cut.read_text().endswith(text.splitlines()[0][:50])  # gathering never edits a learner's file


def test_gather_refreshes_and_watch_calls_back(tmp_path):
    learner_log(tmp_path, "ana", [fake(0.010)])
    ws = gather(tmp_path)
    assert len(ws.results) == 1 and not ws.refresh()
    seen = threading.Event()
    watch = ws.watch(every_s=0.05, callback=lambda w: seen.set(), show=False)
    try:
        ResultLog(tmp_path / "ben" / "demo-cnn.jsonl", participant="ben").append(fake(0.01))
        assert seen.wait(10), "watch did not notice the new trial"
    finally:
        watch.stop()
    assert not watch.running and watch.error is None
    assert ws.participants == ["ana", "ben"]
    with pytest.raises(ValueError, match="every_s"):
        ws.watch(every_s=0)
    with pytest.raises(ValueError, match="shared folder"):
        Workshop(tmp_path / "missing")


def test_gather_needs_no_altair_until_chart(tmp_path):
    code = ("import sys; sys.modules['altair'] = None; sys.modules['ipywidgets'] = None\n"
            "import workbench as wb\n"
            f"ws = wb.gather({str(tmp_path)!r}); print(len(ws.results), len(ws.summary()))")
    learner_log(tmp_path, "ana", [fake(0.010), fake(0.008, seed=1, num_workers=2)])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2", "1"]


# ---- the held-out check: 3 learner processes, 4 trials each, one folder, at the same time ----
LEARNER = textwrap.dedent("""
    import sys, torch
    import workbench as wb
    folder, who = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 4, (64,)))
    bench = wb.Workbench(model, data, loss_fn=torch.nn.CrossEntropyLoss(), log=folder, name="mlp",
                         participant=who, steps=4, warmup_steps=1, knobs=wb.Knobs(batch_size=16))
    for knobs in ({}, {"cpu_threads": 1}, {"batch_size": 32}, {"data": "cached"}):
        r = bench.run(**knobs)
        assert r.ok, r.message
    print(wb.__file__)
""")


@pytest.mark.slow
def test_three_learner_processes_write_one_folder_concurrently(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", LEARNER, str(tmp_path), f"learner{i}"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(3)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
        assert out.strip() == str(ROOT / "workbench" / "__init__.py")  # the workbench under test
    ws = wb.gather(tmp_path)
    df = ws.results
    assert len(df) == 12 and ws.participants == ["learner0", "learner1", "learner2"]
    assert df["uid"].is_unique and (df["status"] == "ok").all()
    for _, g in df.groupby("participant"):
        assert sorted(g["trial_id"]) == [1, 2, 3, 4]
    assert len(ws.summary()) == 3  # three changes, each seen on three machines
    assert (ws.summary()["machines"] == 3).all()
    chart = ws.chart()
    assert len(chart.data) == 9 and chart.to_dict()["facet"]  # 3 learners x 3 changes



# ---- the shared folder is a boundary: hostile files never take the instructor down ---------------
SECRET = "TOPSECRET-do-not-echo"


def hostile_folder(tmp_path: Path) -> tuple[Path, Path, int]:
    """A class folder with two honest learners and one file of every hostile kind; (folder, outside
    file, number of valid rows)."""
    folder = tmp_path / "class"
    learner_log(folder, "ana", [fake(0.010), fake(0.008, seed=1, num_workers=2)])
    learner_log(folder, "ben", [fake(0.011), fake(0.012, seed=2, num_workers=2), fake(0.012, seed=3, amp="bf16")])
    good = json.loads((folder / "ana" / "demo-cnn.jsonl").read_text().splitlines()[0])
    bad = folder / "mallory"
    bad.mkdir()
    (bad / "deep.jsonl").write_bytes(b"[" * 100_000)
    (bad / "huge.jsonl").write_bytes(b'{"a": "' + b"x" * (2 << 20) + b'"}\n')
    (bad / "inf.jsonl").write_text(json.dumps({**good, "samples_per_s": 1e300}).replace("1e+300", "1e400") + "\n")
    (bad / "negative.jsonl").write_text(json.dumps({**good, "batch_size": -5}) + "\n")
    (bad / "negrate.jsonl").write_text(json.dumps({**good, "samples_per_s": -1.0}) + "\n")
    (bad / "knobs.jsonl").write_text(json.dumps({**good, "amp": "fp8", "message": SECRET}) + "\n")
    (bad / "garbage.jsonl").write_bytes(bytes(range(256)) * 10 + SECRET.encode())
    (bad / "empty.jsonl").write_bytes(b"")
    (bad / "dir.jsonl").mkdir()
    outside = tmp_path / "outside.jsonl"
    outside.write_text(json.dumps({**good, "message": SECRET}) + "\n")  # a valid log: must not be read
    (bad / "link.jsonl").symlink_to(outside)
    (folder / "linkdir").symlink_to(tmp_path, target_is_directory=True)  # a way out, not followed
    os.mkfifo(bad / "fifo.jsonl")
    (bad / "dotdot.jsonl").symlink_to(Path("..") / ".." / "outside.jsonl")
    return folder, outside, 5


def test_a_hostile_shared_folder_gathers_exactly_the_valid_rows(tmp_path):
    folder, outside, n = hostile_folder(tmp_path)
    with pytest.warns(UserWarning) as caught:
        ws = gather(folder)  # the FIFO would block a plain open(); the deep line would recurse
    assert len(ws.results) == n and sorted(ws.participants) == ["ana", "ben"]
    text = [str(w.message) for w in caught]
    assert SECRET not in " ".join(text)
    bad = ["deep", "huge", "inf", "negative", "negrate", "knobs", "garbage", "empty", "dir", "link", "fifo", "dotdot"]
    for name in bad:
        assert sum(f"mallory/{name}.jsonl" in t for t in text) == 1, name
    assert set(ws.skipped) == {f"mallory/{name}.jsonl" for name in bad}
    assert "symbolic link" in ws.skipped["mallory/link.jsonl"] and "FIFO" in ws.skipped["mallory/fifo.jsonl"]
    assert str(outside) not in " ".join(ws.results["uid"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same bad files are not reported again
        assert not ws.refresh()
        (folder / "mallory" / "empty.jsonl").unlink()
        ws.refresh()
    assert "mallory/empty.jsonl" not in ws.skipped  # a removed file is no longer listed


def test_gather_warns_per_bad_line_and_keeps_the_rest(tmp_path):
    path = learner_log(tmp_path, "ana", [fake(0.010), fake(0.008, seed=1, num_workers=2)])
    with open(path, "ab") as f:
        f.write(b"[" * 5000 + b"\n" + b'{"status": "ok", "trial_id": "' + SECRET.encode() + b'"}\n')
    with pytest.warns(UserWarning, match=r"line 3 \(nested deeper.*line 4 \(trial_id") as caught:
        ws = gather(tmp_path)
    assert len(ws.results) == 2 and SECRET not in str(caught[0].message)


def test_gather_rereads_only_appended_bytes_and_new_files(tmp_path, monkeypatch):
    for who in ("ana", "ben", "cho"):
        learner_log(tmp_path, who, [fake(0.010), fake(0.008, seed=1, num_workers=2)])
    ws = gather(tmp_path)
    real_read = os.read
    read = []

    def counting(fd, n):
        data = real_read(fd, n)
        read.append(len(data))
        return data

    log = ResultLog(tmp_path / "ana" / "demo-cnn.jsonl", participant="ana")  # the learner's own reads: not counted
    before = log.path.stat().st_size
    monkeypatch.setattr(os, "read", counting)
    assert not ws.refresh() and read == []  # nothing changed: nothing read
    monkeypatch.setattr(os, "read", real_read)
    log.append(fake(0.009, seed=4, num_workers=1))
    added = log.path.stat().st_size - before
    monkeypatch.setattr(os, "read", counting)
    assert ws.refresh() and sum(read) == added and len(ws.results) == 7
    read.clear()
    monkeypatch.setattr(os, "read", real_read)
    new = learner_log(tmp_path, "dan", [fake(0.010)])
    monkeypatch.setattr(os, "read", counting)
    assert ws.refresh() and sum(read) == new.stat().st_size and len(ws.results) == 8
    # a replaced file (same name, new content) is read again from the start
    monkeypatch.setattr(os, "read", real_read)
    new.unlink()
    learner_log(tmp_path, "dan", [fake(0.010), fake(0.01, seed=5, num_workers=2)])
    assert ws.refresh() and len(ws.results) == 9


def test_long_and_odd_participant_names_get_a_short_stable_file_name(tmp_path):
    from workbench.results import FILE_NAME_CHARS, safe_file_name

    long = "Ana " + "de la Cruz " * 27  # 300 characters
    assert len(long) >= 300
    bench = wb.Workbench(TinyNet(), tiny_data(), loss_fn=torch.nn.CrossEntropyLoss(), log=tmp_path,
                         name="tiny", participant=long, steps=2, warmup_steps=0)
    r = bench.run()
    assert r.ok and r.participant == long  # the full name is kept in the rows
    assert len(bench.log.path.parent.name) <= FILE_NAME_CHARS
    assert bench.log.path.parent.name == safe_file_name(long)  # stable
    assert gather(tmp_path).participants == [long]
    odd = {"../../etc", "..", "日本語", "a/b", "a\x00b", "ana", "x" * 200, "x" * 201}
    names = {safe_file_name(n) for n in odd}
    assert len(names) == len(odd)  # distinct names, distinct files
    assert all(n and len(n) <= FILE_NAME_CHARS and "/" not in n and "\x00" not in n and n not in (".", "..")
               for n in names)
    with pytest.raises(ValueError, match="limit is 1,000"):
        safe_file_name("x" * 1001)


def test_watch_view_updates_one_summary_and_one_chart_in_place(tmp_path):
    from workbench.faces.workshop import WatchView

    learner_log(tmp_path, "ana", [fake(0.010), fake(0.008, seed=1, num_workers=2)])
    ws = gather(tmp_path)
    view = WatchView()
    view.update(ws)
    chart = view.chart
    learner_log(tmp_path, "ben", [fake(0.011), fake(0.009, seed=1, num_workers=2)])
    ws.refresh()
    view.update(ws)
    view.update(ws)
    assert len(view.widget.children) == 2 and view.widget.children[1] is chart  # no stale copies
    assert "<table" in view.summary.value and view.draws == 3
    assert sorted(chart.chart.data["participant"]) == ["ana", "ben"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=2000))
def test_gathering_arbitrary_bytes_never_raises(tmp_path, data):
    import shutil

    folder = tmp_path / "fuzz"
    shutil.rmtree(folder, ignore_errors=True)
    learner_log(folder, "ana", [fake(0.010)])
    (folder / "eve").mkdir()
    (folder / "eve" / "x.jsonl").write_bytes(data)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ws = gather(folder)
    assert all(issubclass(c.category, UserWarning) for c in caught)
    assert "ana" in ws.participants
    ws.summary()
