"""FreshProcess (fresh.py) and a trial in another process (remote.py): the call travels by value,
the job reads back how its process runs, progress moves, a cancel ends the process, and a process
that cannot start or dies ends only its own trial."""

from __future__ import annotations

import os
import signal
import stat
import threading
import time
from pathlib import Path

import pytest
import torch

import workbench as wb
from workbench.launch import remote
from workbench.launch.fresh import FreshProcess, FreshProcessError

PARENT = os.getpid()


class LocalNet(torch.nn.Module):
    """Defined in this test module: a job's process must get it by value."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


class DiesAway(LocalNet):
    """Killed by SIGKILL in any process but the test's own (a crash the job cannot report)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if os.getpid() != PARENT:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().forward(x)


class SlowNet(LocalNet):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.05)
        return super().forward(x)


def where_am_i(x: int) -> tuple[int, int, str | None, str | None]:
    return os.getpid(), x * 2, os.environ.get("WB_TEST_SET"), os.environ.get("WB_TEST_GONE")


def boom() -> None:
    raise ValueError("the job's own error")


@pytest.mark.slow
def test_submit_runs_the_call_in_another_process_with_its_env(monkeypatch):
    monkeypatch.setenv("WB_TEST_GONE", "inherited")
    job = FreshProcess(env={"WB_TEST_SET": "yes", "WB_TEST_GONE": None}, keep=True).submit(where_am_i, 21)
    try:
        assert stat.S_IMODE(job.folder.stat().st_mode) == 0o700  # private: only we read the call
        pid, doubled, set_, gone = job.result(timeout=120)
        assert pid != os.getpid() and pid == int(job.job_id)
        assert (doubled, set_, gone) == (42, "yes", None)
        assert job.done() and job.state == "COMPLETED"
    finally:
        job.keep = False
        job._cleanup()
    assert not job.folder.exists()


@pytest.mark.slow
def test_the_job_s_exception_comes_back_with_its_text():
    job = FreshProcess().submit(boom)
    with pytest.raises(FreshProcessError, match="the job's own error"):
        job.result(timeout=120)
    assert job.state == "FAILED"


def test_cancel_ends_the_process_group():
    job = FreshProcess().submit(time.sleep, 60)
    job.cancel()
    assert job.done() and job.state == "CANCELLED"
    with pytest.raises(FreshProcessError):
        job.result()


def test_bad_env_is_a_type_error():
    with pytest.raises(TypeError, match="env maps variable names"):
        FreshProcess(env={"X": 1})
    with pytest.raises(TypeError, match="executor must have submit"):
        wb.Workbench(LocalNet(), torch.utils.data.TensorDataset(torch.randn(16, 8), torch.randint(0, 4, (16,))),
                     loss_fn=torch.nn.CrossEntropyLoss(), log=None, executor=object())


def test_user_modules_travel_by_value():
    import cloudpickle

    mods = remote.local_modules(LocalNet(), torch.nn.CrossEntropyLoss())
    assert [m.__name__ for m in mods] == [__name__]  # this module; not torch's, not workbench's
    bench = wb.Workbench(LocalNet(), torch.utils.data.TensorDataset(torch.randn(16, 8), torch.randint(0, 4, (16,))),
                         loss_fn=torch.nn.CrossEntropyLoss(), log=None)
    by_ref = cloudpickle.dumps(bench.workload.pristine)
    with remote.by_value(bench.workload):
        by_val = cloudpickle.dumps(bench.workload.pristine)
    assert b"_make_skeleton_class" in by_val  # the class itself travels ...
    assert b"_make_skeleton_class" not in by_ref  # ... where otherwise only its import path would
    assert cloudpickle.dumps(bench.workload.pristine) == by_ref  # registration undone afterwards


def _bench(make_bench, model, **kw):
    return make_bench(model=model, steps=3, warmup_steps=1, **kw)


@pytest.mark.slow
def test_a_trial_through_fresh_process_reads_back_where_it_ran(make_bench):
    bench = _bench(make_bench, SlowNet(), executor=wb.FreshProcess())
    bench.steps = 12  # 50 ms a step: long enough for the job's progress file to be read
    seen = []
    r = bench.run(progress=lambda phase, done, total: seen.append(phase))
    assert r.ok, r.message
    assert r.samples_per_s > 0 and len(r.step_times_s) == 12 and r.trial_id is not None
    info = r.env["process"]
    assert info["pid"] != os.getpid() and info["allocator"] == r.env["allocator"]
    assert r.env["executor"] == "FreshProcess" and info["torch"] == torch.__version__
    assert "measuring" in seen or "warming up" in seen  # the job's progress reached the caller
    assert bench.results.iloc[-1]["status"] == "ok"


@pytest.mark.slow
def test_a_process_that_cannot_start_or_dies_ends_only_its_trial(make_bench):
    bench = _bench(make_bench, LocalNet(), executor=wb.FreshProcess(python="/nonexistent/python"))
    r = bench.run()
    assert r.status == "error" and "could not start" in r.message and r.where == "process"
    bench.executor = None
    assert bench.run().ok  # the workbench goes on, in this process
    dies = _bench(make_bench, DiesAway(), executor=wb.FreshProcess())
    r = dies.run()
    assert r.status == "error" and "SIGKILL" in r.message
    assert len(dies.trials) == 1


@pytest.mark.slow
def test_cancel_ends_the_trial_s_process(make_bench):
    bench = _bench(make_bench, SlowNet(), executor=wb.FreshProcess())
    bench.steps = 400
    stop = threading.Event()
    seen = []

    def watch(phase, done, total):
        seen.append(phase)
        if phase == "measuring":
            stop.set()

    t0 = time.monotonic()
    r = bench.run(progress=watch, cancel=stop)
    assert r.status == "interrupted" and "process was ended" in r.message
    assert time.monotonic() - t0 < 120  # 400 steps of 50 ms would be 20 s more at least


KERNEL = r"""
import sys, time, torch, workbench as wb

class Slow(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 4)

    def forward(self, x):
        time.sleep(0.05)
        return self.a(x)

data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 4, (64,)))
bench = wb.Workbench(Slow(), data, loss_fn=torch.nn.CrossEntropyLoss(), log=None, steps=100_000, warmup_steps=1,
                     knobs=wb.Knobs(batch_size=8))

def progress(phase, done, total):
    if phase == "measuring":
        print("measuring", flush=True)

bench.run(allocator=sys.argv[1], progress=progress)
"""


@pytest.mark.slow
def test_a_killed_kernel_leaves_no_training_process_behind(tmp_path):
    """A kernel killed (SIGKILL) during an allocator trial, which runs in a fresh process in its own session:
    within 10 s no process of that trial is left, and its job folder is gone."""
    import contextlib
    import subprocess
    import sys

    import psutil

    from workbench.core import system

    mode = "tcmalloc" if system.allocator_library("tcmalloc") is not None else "glibc-kept"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])),
           "TMPDIR": str(tmp_path)}
    kernel = subprocess.Popen([sys.executable, "-c", KERNEL, mode], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert kernel.stdout.readline().strip() == "measuring"  # the trial's process is training
        trial = [p for p in psutil.Process(kernel.pid).children(recursive=True)
                 if "workbench.launch.fresh" in " ".join(p.cmdline())]
        assert len(trial) == 1
        left = [trial[0], *trial[0].children(recursive=True)]
        args = trial[0].cmdline()
        folder = Path(args[args.index("workbench.launch.fresh") + 1])
        assert folder.is_dir() and folder.name.startswith("workbench-job-")
    finally:
        kernel.kill()
        kernel.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_running(p) for p in left):
        time.sleep(0.2)
    outlived = [p.pid for p in left if _running(p)]
    for p in left:  # never leave one behind, even when the test fails
        with contextlib.suppress(psutil.Error):
            p.kill()
    assert not outlived, "a training process outlived its kernel by 10 s"
    assert not folder.exists()


def _running(p) -> bool:
    import psutil

    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_fresh_job_and_the_jobs_registry_read_an_owner_alive_by_one_rule():
    """The fresh job's watchdog and a restarted kernel's registry agree: a live caller runs; a caller killed
    but not yet reaped (a zombie) is gone; a pid whose process started at another time is not the caller."""
    import signal
    import subprocess
    import sys

    import psutil

    from workbench.launch import fresh, owners

    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = owners.started_at(p.pid)
        who = {**owners.owner(), "pid": p.pid, "started": started}
        assert not fresh.caller_gone(p.pid, started) and owners.owner_alive(who, time.time())
        assert fresh.caller_gone(p.pid, started - 100) and not owners.owner_alive({**who, "started": started - 100},
                                                                                   time.time())
        p.send_signal(signal.SIGKILL)
        t = time.monotonic()
        while psutil.Process(p.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() - t < 10:
            time.sleep(0.05)
        assert fresh.caller_gone(p.pid, started) and not owners.owner_alive(who, time.time())
    finally:
        p.kill()
        p.wait()
