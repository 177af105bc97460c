"""The worker process (launch/local.py): a workbench's trials, analyses and turns run there, on one thread."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest
import torch
from conftest import TinyNet, tiny_data

import workbench as wb
from workbench.launch.local import LocalWorker, WorkerDied, check_trials_in, in_rank, startup_text
from workbench.launch.runner import trial_threaded

pytestmark = pytest.mark.worker


class Recorder(torch.nn.Module):
    """TinyNet that appends (pid, thread id, thread name) of each forward to a file: where torch ran."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.net = TinyNet()
        self.path = path

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with open(self.path, "a") as f:
            f.write(json.dumps([os.getpid(), threading.get_ident(), threading.current_thread().name]) + "\n")
        return self.net(x)


def seen(path) -> set[tuple]:
    return {tuple(json.loads(line)) for line in open(path)}


def bench_of(model, tmp_path, **kw):
    kw.setdefault("steps", 3)
    kw.setdefault("warmup_steps", 1)
    return wb.Workbench(model, kw.pop("data", tiny_data()), loss_fn=torch.nn.CrossEntropyLoss(),
                        optimizer=lambda p: torch.optim.SGD(p, lr=0.05), log=tmp_path / "runs",
                        knobs=wb.Knobs(batch_size=8), **kw)


def test_trials_analyses_and_turns_run_on_one_thread_of_the_worker_process(tmp_path):
    """One torch thread per measuring process: every forward of a trial, of diagnose's analyses and of
    compare's interleaved turns ran in the worker's main thread, none in this process."""
    path = tmp_path / "where.jsonl"
    bench = bench_of(Recorder(str(path)), tmp_path)
    path.write_text("")  # the constructor's one-step check runs here, by design
    assert bench.trials_in == "worker"
    a = bench.run(progress=False)
    b = bench.run(batch_size=16, progress=False)
    assert a.ok and b.ok and a.env["ran_in"] == "worker" and bench.results["ran_in"].tolist() == ["worker"] * 2
    bench.compare(a, b, rounds="auto", max_rounds=1, budget_s=20)
    from workbench.diagnose.memory import memory_breakdown  # an analysis (runner.trial_threaded)

    memory_breakdown(bench.workload, bench.defaults)
    where = seen(path)
    pids = {p for p, _, _ in where}
    assert pids == {bench._worker.pid} and os.getpid() not in pids
    assert {name for _, _, name in where} == {"MainThread"} and len({t for _, t, _ in where}) == 1


def test_a_figure_is_measured_apart_from_the_kernels_other_threads(tmp_path):
    """The kernel's torch work on a second thread (what made the second OpenMP team) happens in another
    process than the trial: the worker's threads do not grow with it."""
    bench = bench_of(TinyNet(), tmp_path)
    bench.run(progress=False)
    before = len(os.listdir(f"/proc/{bench._worker.pid}/task"))
    t = threading.Thread(target=lambda: [torch.randn(256, 256) @ torch.randn(256, 256) for _ in range(20)])
    t.start()
    t.join()
    r = bench.run(progress=False)
    assert r.ok and len(os.listdir(f"/proc/{bench._worker.pid}/task")) == before


def test_a_crash_inside_a_trial_ends_that_trial_and_the_next_starts_a_new_worker(tmp_path):
    def step(model, batch):
        if os.environ.get("WORKBENCH_PROCESS") == "worker" and not os.path.exists(flag):
            open(flag, "w").close()
            os.kill(os.getpid(), 9)  # what the kernel's OOM killer does
        x, y = batch
        return torch.nn.functional.cross_entropy(model(x), y)

    flag = str(tmp_path / "crashed")
    bench = bench_of(TinyNet(), tmp_path, step_fn=step)
    first = bench._worker.pid
    r = bench.run(progress=False)
    assert r.status == "error" and "SIGKILL" in r.message and "out of memory" in r.message
    again = bench.run(progress=False)
    assert again.ok and again.env["ran_in"] == "worker" and bench._worker.pid != first
    assert len(bench.results) == 2  # the failed trial is kept, nothing lost


def test_stop_ends_the_trial_and_keeps_the_worker(tmp_path):
    def slow(model, batch):
        time.sleep(0.2)
        x, y = batch
        return torch.nn.functional.cross_entropy(model(x), y)

    bench = bench_of(TinyNet(), tmp_path, step_fn=slow, steps=200)
    pid = bench._worker.pid
    stop = threading.Event()
    threading.Timer(2.0, stop.set).start()
    t0 = time.monotonic()
    r = bench.run(progress=False, cancel=stop)
    assert r.status == "interrupted" and time.monotonic() - t0 < 15
    bench.steps = 3
    assert bench.run(progress=False).ok and bench._worker.pid == pid  # stopped at a step: the worker lives on


def test_an_error_in_the_users_code_is_one_failed_trial(tmp_path):
    def bad(model, batch):
        raise RuntimeError("my bug")

    with pytest.raises(ValueError, match="my bug"):  # the one-step check in this process says it first
        bench_of(TinyNet(), tmp_path, step_fn=bad)


def test_your_own_knob_applies_in_the_worker(tmp_path):
    mark = tmp_path / "knob.txt"

    @wb.knob(choices=["a", "b"])
    def flavour(model, value):
        """a knob of the notebook's: recorded where it ran"""
        with open(mark, "a") as f:
            f.write(f"{value} {os.environ.get('WORKBENCH_PROCESS', '')}\n")

    try:
        bench = bench_of(TinyNet(), tmp_path)
        assert bench.run(flavour="b", progress=False).ok
        assert "b worker" in mark.read_text()
    finally:
        wb.forget_knob("flavour")


def test_a_workload_that_cannot_be_pickled_runs_here_saying_why(tmp_path):
    class Locked(torch.utils.data.Dataset):
        def __init__(self) -> None:
            self.data, self.lock = tiny_data(), threading.Lock()

        def __len__(self) -> int:
            return len(self.data)

        def __getitem__(self, i):
            return self.data[i]

    with pytest.warns(UserWarning, match="cannot be sent"):
        bench = bench_of(TinyNet(), tmp_path, data=Locked())
    assert bench.trials_in == "kernel" and bench._worker is None
    assert bench.run(progress=False).env["ran_in"] == "kernel"


def test_kernel_mode_and_its_check(tmp_path):
    bench = bench_of(TinyNet(), tmp_path, trials_in="kernel")
    assert bench._worker is None and bench.run(progress=False).env["ran_in"] == "kernel"
    with pytest.raises(ValueError, match="'worker'"):
        check_trials_in("process")


def test_a_trial_from_another_thread_runs_in_the_worker_and_start_up_is_said_once(tmp_path, capsys):
    bench = bench_of(TinyNet(), tmp_path)
    out = {}
    t = threading.Thread(target=lambda: out.update(r=bench.run(progress=False)))  # the panel's thread
    t.start()
    t.join()
    assert out["r"].env["ran_in"] == "worker"
    start = out["r"].extra["worker_startup"]
    assert start["ready_s"] > 0 and start["loads"] and "ready in" in start["text"]
    assert "worker_startup" not in bench.run(progress=False).extra  # said once
    said = capsys.readouterr()
    assert (said.out + said.err).count("apart from the kernel") == 1


def test_worker_seam_alone(tmp_path):
    w = LocalWorker()
    try:
        assert w.submit(pow, 2, 10).result(60) == 1024
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            w.submit(divmod, 1, 0).result(60)
        pid = w.pid
        task = w.submit(time.sleep, 30)
        w.kill()
        with pytest.raises(WorkerDied, match="SIGKILL"):
            task.result(30)
        assert w.submit(pow, 3, 2).result(60) == 9 and w.pid != pid  # a new worker starts
        assert "ready in" in startup_text(w.startups[-1])
    finally:
        w.close()
    assert not w.alive()


def in_a_torchrun_rank(monkeypatch) -> None:
    """What torchrun sets in each rank's environment (the variables in_rank reads)."""
    for k, v in {"LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "none"}.items():
        monkeypatch.setenv(k, v)


@pytest.mark.parametrize("env", [{"LOCAL_RANK": "1"}, {"TORCHELASTIC_RUN_ID": "none"}, {"WORLD_SIZE": "2"}])
def test_a_rank_is_known_by_torchrun_s_environment(monkeypatch, env):
    for k in ("LOCAL_RANK", "TORCHELASTIC_RUN_ID", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    assert not in_rank()
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert not in_rank()
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert in_rank()


def test_in_a_rank_the_worker_starts_at_the_first_trial_and_says_so_once(tmp_path, monkeypatch, capsys):
    """A torchrun rank that only records its real run (wb.TrainerCallback) holds no worker process, no pickled
    workload and no sender or reader thread; its first trial starts the worker and runs there."""
    in_a_torchrun_rank(monkeypatch)
    threads = {t.name for t in threading.enumerate()}
    bench = bench_of(TinyNet(), tmp_path)
    assert bench.trials_in == "worker" and not bench._worker.alive() and not bench._worker.startups
    assert {t.name for t in threading.enumerate()} == threads  # no workbench-worker-sender/-reader
    r = bench.run(progress=False)
    assert r.ok and r.env["ran_in"] == "worker" and bench._worker.alive()
    assert "ready in" in r.extra["worker_startup"]["text"]
    again = bench.run(batch_size=16, progress=False)
    assert again.env["ran_in"] == "worker" and "worker_startup" not in again.extra
    assert bench.results["ran_in"].tolist() == ["worker"] * 2 and bench.trials_in == "worker"
    said = capsys.readouterr()
    assert (said.out + said.err).count("apart from the kernel") == 1


def test_in_a_rank_a_workload_that_cannot_travel_says_so_at_its_first_trial(tmp_path, monkeypatch):
    in_a_torchrun_rank(monkeypatch)
    data = tiny_data()
    data.lock = threading.Lock()  # cannot be pickled
    bench = bench_of(TinyNet(), tmp_path, data=data)
    assert bench.trials_in == "worker"  # nothing pickled yet
    with pytest.warns(UserWarning, match="cannot be sent"):
        r = bench.run(progress=False)
    assert r.ok and r.env["ran_in"] == "kernel" and bench.trials_in == "kernel" and bench._worker is None


@trial_threaded
def _pid_of(workload) -> int:
    """An analysis: runs wherever the workload's analyses are routed."""
    return os.getpid()


def test_in_a_rank_an_analysis_before_any_trial_runs_here_and_starts_no_worker(tmp_path, monkeypatch):
    """diagnose() before the first trial, in a rank: its analyses run in this process (nothing pickled, so an
    unpicklable workload fails nothing); the first trial still decides where trials run."""
    in_a_torchrun_rank(monkeypatch)
    data = tiny_data()
    data.lock = threading.Lock()  # cannot be pickled
    bench = bench_of(TinyNet(), tmp_path, data=data)
    assert _pid_of(bench.workload) == os.getpid() and not bench._worker.alive()


def test_with_env_workers_close_with_their_worker_and_one_closes_alone():
    """A worker's with_env workers (an allocator trial's process) share its pool: closing the worker closes them,
    once each; closing one of them ends only that one and takes it out of the pool."""
    w = LocalWorker()
    a, b = w.with_env({"WORKBENCH_TEST_A": "1"}), w.with_env({"WORKBENCH_TEST_B": "1"})
    try:
        assert w.with_env({"WORKBENCH_TEST_A": "1"}) is a
        assert a.submit(os.getenv, "WORKBENCH_TEST_A").result(60) == "1"
        assert b.submit(pow, 2, 3).result(60) == 8
        a.close()
        assert not a.alive() and b.alive() and w.with_env({"WORKBENCH_TEST_A": "1"}) is not a
        w.close()
        assert not b.alive() and not w.alive() and not w._pool
    finally:
        w.close()
