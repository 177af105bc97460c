"""Trials as jobs (cluster.py, jobs.py): any submit/result/done/cancel executor, submitit's local
executor, and a real one-node SLURM (scripts/slurm_up.sh; those tests skip, saying why, without one)."""

from __future__ import annotations

import concurrent.futures
import functools
import json
import platform
import shutil
import statistics
import subprocess
import threading
import time

import pytest
import torch
from conftest import TinyNet, tiny_data

import workbench as wb
from workbench.core.measure import TrialResult
from workbench.deciding.budget import Budget, Deadline
from workbench.launch import cluster

HOST = platform.node().split(".")[0]


def slurm_reason() -> str | None:
    """Why the SLURM tests cannot run here (None when a node is idle)."""
    if shutil.which("sinfo") is None:
        return "no SLURM here (sinfo not found): apt-get install slurm-wlm munge, then sudo scripts/slurm_up.sh"
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as e:
        return f"sinfo failed ({e}): run sudo scripts/slurm_up.sh"
    if not any(s in out.stdout for s in ("idle", "mixed", "allocated")):
        return f"no SLURM node up (sinfo: {out.stdout.strip() or out.stderr.strip()}): run sudo scripts/slurm_up.sh"
    return None


needs_slurm = pytest.mark.skipif(slurm_reason() is not None, reason=str(slurm_reason()))


@pytest.fixture
def node_path(monkeypatch):
    """A job's node imports TinyNet from tests/conftest.py by reference: it must see that folder (as a
    cluster's nodes see the user's modules on a shared filesystem)."""
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([root, here, os.environ.get("PYTHONPATH", "")]))


def bench_on(executor, tmp_path, **kw):
    kw.setdefault("steps", 4)
    kw.setdefault("warmup_steps", 1)
    return wb.Workbench(TinyNet(), tiny_data(256), loss_fn=torch.nn.CrossEntropyLoss(),
                        optimizer=lambda p: torch.optim.SGD(p, lr=0.05), knobs=wb.Knobs(batch_size=16),
                        log=tmp_path / "runs", executor=executor, **kw)


# ---- the seam: any object with submit(fn, *args) -> job (result, done, cancel) ------------------
def test_any_submit_executor_runs_trials_and_records_where(tmp_path):
    with concurrent.futures.ThreadPoolExecutor(1) as ex:  # submit() -> Future: result, done, cancel
        bench = bench_on(ex, tmp_path)
        r = bench.run(progress=False)
    assert r.ok, r.message
    assert r.env["host"] == HOST and r.extra["job"]["executor"] == "Future"
    row = bench.results.iloc[-1]
    assert row["node"] == HOST and row["job"] == ""  # a Future has no scheduler id
    assert (tmp_path / "runs" / "TinyNet.jobs").stat().st_mode & 0o777 == 0o700


def test_a_job_that_raises_is_one_failed_trial(tmp_path):
    class Broken:
        def submit(self, fn, *args, **kwargs):
            f = concurrent.futures.Future()
            f.set_exception(RuntimeError("node exploded"))
            return f

    bench = bench_on(Broken(), tmp_path)
    r = bench.run(progress=False)
    assert r.status == "error" and "node exploded" in r.message
    assert len(bench.trials) == 1  # recorded; the notebook goes on


def test_a_stop_cancels_the_job(tmp_path):
    cancelled = []

    class Never:  # a job that never ends unless cancelled
        def submit(self, fn, *args, **kwargs):
            f = concurrent.futures.Future()
            f.cancel = lambda: cancelled.append(True) or True
            return f

    bench = bench_on(Never(), tmp_path)
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    r = bench.run(progress=False, cancel=stop)
    assert r.status == "interrupted" and "stopped by the user" in r.message and cancelled


def test_an_executor_without_submit_is_refused(tmp_path):
    with pytest.raises(TypeError, match="submit"):
        bench_on(object(), tmp_path)


def test_a_process_knob_reaches_a_slurm_job_through_its_setup_lines_or_is_refused(tmp_path):
    submitit = pytest.importorskip("submitit")
    from workbench.launch import remote

    ex = submitit.AutoExecutor(tmp_path / "jobs", cluster="slurm")
    ex.update_parameters(slurm_setup=["module load cuda"])
    env = {"LD_PRELOAD": "/usr/lib/libtcmalloc_minimal.so.4", "MALLOC_ARENA_MAX": None, "X": "a b"}
    got = remote.executor_for(ex, env)
    assert got is not ex and ex._executor.parameters["setup"] == ["module load cuda"]  # the user's is untouched
    assert got._executor.parameters["setup"] == ["module load cuda", "export LD_PRELOAD=/usr/lib/libtcmalloc_minimal.so.4",
                                                 "unset MALLOC_ARENA_MAX", "export X='a b'"]
    with pytest.raises(ValueError, match=r"LD_PRELOAD.*cannot set a job's environment.*with_env"):
        remote.executor_for(concurrent.futures.ThreadPoolExecutor(1), env)  # refused, not silently dropped
    assert remote.executor_for(ex, {}) is ex


# ---- what cannot travel is said before anything is submitted -----------------------------------
class FileDataset(torch.utils.data.Dataset):
    def __init__(self, fh):
        self.fh = fh
        self.x = torch.randn(64, 8)

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return self.x[i], 0


def test_an_open_file_cannot_travel(tmp_path):
    with open(tmp_path / "data.txt", "w") as fh, concurrent.futures.ThreadPoolExecutor(1) as ex:
        with pytest.raises(ValueError, match=r"dataset\.fh.*open file.*__getitem__"):
            wb.Workbench(TinyNet(), FileDataset(fh), loss_fn=torch.nn.CrossEntropyLoss(), log=None, executor=ex)


def test_an_unpicklable_closure_cannot_travel():
    lock = threading.Lock()

    def step(model, batch):
        with lock:
            return model(batch[0]).sum()

    with pytest.raises(ValueError, match=r"step_fn <closure lock>.*lock"):
        cluster.check_travels(wb.Workbench(TinyNet(), tiny_data(), step_fn=step, log=None).workload)


def test_a_cuda_tensor_is_named(monkeypatch):
    t = torch.zeros(2)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: self is t))
    assert cluster._cuda_tensor(torch.utils.data.TensorDataset(torch.ones(2), t), "dataset") == "dataset.tensors[1]"


def test_the_workload_travels_by_value():
    bench = wb.Workbench(TinyNet(), tiny_data(), loss_fn=torch.nn.CrossEntropyLoss(), log=None)
    assert cluster.check_travels(bench.workload) > 0


# ---- the scheduler's states and faults --------------------------------------------------------
@pytest.mark.parametrize("state,status,words", [
    ("CANCELLED", "interrupted", "cancelled"), ("TIMEOUT", "error", "time limit"), ("PREEMPTED", "interrupted", "preempted"),
    ("NODE_FAIL", "error", "lost its node"), ("OUT_OF_MEMORY", "oom", "mem_gb"),
])
def test_a_job_ended_by_the_scheduler_fails_with_its_reason(state, status, words):
    w = cluster.Watch(None, None, 0.0)  # type: ignore[arg-type]
    w.job = type("SlurmJob", (), {"job_id": "42"})()
    sched = cluster.SchedulerState(state, "None", "node7")
    w.check_alive(sched, 100.0)  # the first look starts a short grace for the result file
    with pytest.raises(cluster.JobFailed) as e:
        w.check_alive(sched, 103.0)
    assert e.value.status == status and words in e.value.message and "job 42 on node7" in e.value.message


def test_a_job_the_scheduler_forgot_is_lost():
    w = cluster.Watch(type("SlurmJob", (), {"job_id": "7"})(), None, 0.0)  # type: ignore[arg-type]
    w.check_alive(cluster.SchedulerState(known=False), 0.0)
    with pytest.raises(cluster.JobFailed, match="job 7 is lost"):
        w.check_alive(cluster.SchedulerState(known=False), cluster.RESULT_GRACE_S + 1)


def test_a_scheduler_that_answers_again_resets_the_grace():
    w = cluster.Watch(type("SlurmJob", (), {"job_id": "7"})(), None, 0.0)  # type: ignore[arg-type]
    w.check_alive(cluster.SchedulerState(known=False), 0.0)  # a blip: the scheduler did not list it
    w.check_alive(cluster.SchedulerState("RUNNING"), 5.0)  # it answers again: the job lives
    w.check_alive(cluster.SchedulerState(known=False), 3600.0)  # another blip, an hour later
    w.check_alive(cluster.SchedulerState(known=False), 3600.0 + cluster.RESULT_GRACE_S - 1)  # a fresh grace


def test_a_scheduler_that_does_not_answer_never_loses_the_job():
    from workbench.launch import watcher

    w = cluster.Watch(type("SlurmJob", (), {"job_id": "7"})(), None, 0.0)  # type: ignore[arg-type]
    silent = cluster.SchedulerState(known=False, answered=False)  # squeue timed out, slurmctld restarting
    for t in (0.0, 60.0, watcher.UNANSWERED_S - 1):
        w.check_alive(silent, t)  # still watched: the job may well be running
    assert "does not answer" in w.phase(None, silent) and "still watching job 7" in w.phase(None, silent)
    w.check_alive(cluster.SchedulerState("RUNNING"), watcher.UNANSWERED_S)  # it answers: the count starts over
    w.check_alive(silent, watcher.UNANSWERED_S + 1)
    with pytest.raises(cluster.JobFailed, match=r"has not answered for \d+ s: job 7 is left as it is.*scancel 7"):
        w.check_alive(silent, 2 * watcher.UNANSWERED_S + 2)


def test_one_squeue_answers_for_every_job_in_flight(monkeypatch):
    from workbench.launch import watcher

    asked = []

    def ask(cmd):
        asked.append(cmd)
        return True, "11|RUNNING|None|n1\n12|PENDING|Priority|\n"

    monkeypatch.setattr(watcher, "_ask", ask)
    board = watcher.SlurmBoard()
    for jid in ("11", "12"):
        board.add(jid)
    assert board.state("11").state == "RUNNING" and board.state("12").reason == "Priority"
    assert [c[0] for c in asked] == ["squeue"] and "11,12" in asked[0]  # one query for both
    for jid in range(40):
        board.add(str(jid))
    assert board.interval() == watcher.ASK_MAX_S > watcher.SlurmBoard().interval()  # 42 jobs: asked less often


def test_a_scancel_ends_the_trial_when_slurm_writes_it_not_when_the_job_is_gone(tmp_path):
    err = tmp_path / "7_0_log.err"
    err.write_text("slurmstepd-vm: error: *** JOB 7 ON vm CANCELLED AT 2026-12-04T16:04:14 ***\n")
    job = type("SlurmJob", (), {"job_id": "7", "paths": type("P", (), {"stderr": err})()})()
    w = cluster.Watch(job, None, 0.0)  # type: ignore[arg-type]
    with pytest.raises(cluster.JobFailed) as e:  # COMPLETING can last KillWait (30 s): the kill is already said
        w.check_alive(cluster.SchedulerState("COMPLETING", "", "vm"), 0.0)
    assert e.value.status == "interrupted" and "was cancelled" in e.value.message
    err.write_text("slurmstepd: error: *** JOB 7 ON vm CANCELLED AT 2026-12-04T16:04:14 DUE TO TIME LIMIT ***\n")
    with pytest.raises(cluster.JobFailed, match="time limit"):
        cluster.Watch(job, None, 0.0).check_alive(cluster.SchedulerState("COMPLETING"), 0.0)  # type: ignore[arg-type]
    err.write_text("")
    cluster.Watch(job, None, 0.0).check_alive(cluster.SchedulerState("COMPLETING"), 0.0)  # type: ignore[arg-type]


def test_a_progress_file_that_cannot_be_written_never_loses_the_result(tmp_path):
    from workbench.core.progress import TrialProgress

    state = TrialProgress()
    with cluster.ProgressFile(state, tmp_path / "gone" / "progress.json") as pf:  # its folder vanished
        state.set("measuring", 1, 2)
        pf.write()  # an OSError at the job's end must not throw away the computed result
    assert not (tmp_path / "gone").exists()


def test_stop_job_says_what_really_happened():
    class Refuses:
        job_id = "42"

        def cancel(self):
            raise RuntimeError("scheduler gone")

    said = cluster.stop_job(Refuses())
    assert said.startswith("not cancelled: the cancel failed (RuntimeError: scheduler gone)") and "scancel 42" in said
    running = concurrent.futures.Future()
    running.set_running_or_notify_cancel()  # a Future already running cannot be cancelled
    assert cluster.stop_job(running).startswith("not cancelled: its executor cannot stop a running job")
    assert cluster.stop_job(concurrent.futures.Future()) == "cancelled (it has ended)"  # no process to speak of


def test_pending_shows_the_reason():
    w = cluster.Watch(type("SlurmJob", (), {"job_id": "7"})(), None, 0.0)  # type: ignore[arg-type]
    assert w.phase(None, cluster.SchedulerState("PENDING", "Resources")) == "pending (Resources)"
    assert w.phase({"phase": "measuring"}, cluster.SchedulerState("RUNNING")) == "measuring"


# ---- queue time is not spent ----------------------------------------------------------------
class SlurmJob:
    """A job that looks like SLURM's to the watcher (its state from the patched slurm_state): it waits
    `queue_s` in a fake queue, then writes progress and returns a made-up trial record after `run_s`."""

    run_s = 0.3  # how long it runs once out of the queue

    def __init__(self, fn, args, queue_s, states):
        self.job_id = str(len(states) + 9000)
        self.cancelled = False
        self.t_run = time.monotonic() + queue_s
        self.future = concurrent.futures.Future()
        states[self.job_id] = self
        threading.Thread(target=self._body, args=(fn, args), daemon=True).start()

    def _body(self, fn, args):
        while time.monotonic() < self.t_run and not self.cancelled:
            time.sleep(0.02)
        if self.cancelled:
            self.future.set_exception(RuntimeError("cancelled"))
            return
        payload = args[0]  # remote.trial_job's: a measured trial is made up here (no training in threads)
        time.sleep(self.run_s)  # the job's start-up: RUNNING, no progress yet
        with open(payload["progress_path"], "w") as f:
            json.dump(["measuring", 1, 4], f)
        time.sleep(self.run_s)
        r = TrialResult(knobs=payload["knobs"], status="ok", samples_per_s=100.0, step_times_s=(0.1,) * 4,
                        samples_per_step=16, env={"host": "fake"})
        self.future.set_result({"record": r.to_record(), "process": {}})

    def state(self):
        if self.cancelled:
            return cluster.SchedulerState("CANCELLED", "", "fake")
        if self.future.done():
            return cluster.SchedulerState("COMPLETED", "", "fake")
        return cluster.SchedulerState("PENDING" if time.monotonic() < self.t_run else "RUNNING", "", "fake")

    def done(self):
        return self.future.done()

    def result(self):
        return self.future.result()

    def cancel(self, check=True):
        self.cancelled = True


@pytest.fixture
def fake_slurm(monkeypatch):
    """An executor of fake SLURM jobs that each wait `queue_s` seconds in a queue (set on the executor)."""
    states: dict = {}
    from workbench.launch import jobs, watcher

    for module in (watcher, jobs):
        monkeypatch.setattr(module, "is_slurm", lambda job: isinstance(job, SlurmJob))
    monkeypatch.setattr(watcher, "slurm_states", lambda ids: {str(j): states[str(j)].state() for j in ids})
    monkeypatch.setattr(watcher, "ASK_EVERY_S", 0.1)  # the scheduler sees RUNNING before the job's progress
    monkeypatch.setattr(watcher, "POLL_S", 0.05)

    class Executor:
        def __init__(self):
            self.queue_s = 1.0
            self.waits: list = []  # the next jobs' queue waits, before queue_s
            self.submitted: list = []

        def submit(self, fn, *args, **kwargs):
            job = SlurmJob(fn, args, self.waits.pop(0) if self.waits else self.queue_s, states)
            self.submitted.append(job)
            return job

    return Executor()


def test_parallel_queue_waits_count_once_in_the_budget_that_owns_them(fake_slurm, tmp_path):
    from workbench.launch.runner import PARALLEL_THREAD_NAME

    bench = bench_on(fake_slurm, tmp_path)
    run = functools.partial(bench.run, progress=False)
    other, budget = Budget(None, "another verb"), Budget(None, "tune")
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix=PARALLEL_THREAD_NAME) as pool:
        rs = list(pool.map(lambda k: budget.trial(run, k, purpose="race"), [wb.Knobs(batch_size=16),
                                                                             wb.Knobs(batch_size=32)]))
    wall = time.perf_counter() - t0
    assert all(r.ok for r in rs), [r.message for r in rs]
    assert budget.spent.seconds["race"] >= 0 and all(s >= 0 for _k, s, _ in budget.spent.measured)
    assert budget.elapsed() >= 0
    assert 0 < budget.queue.total <= wall  # two waits side by side: one stretch of queue, counted once
    assert other.elapsed() >= wall  # another budget in the kernel never sees this one's queue


def test_a_queue_wait_while_another_job_runs_is_the_budgets_time():
    from workbench.launch.cluster import QueueAccount

    now = [0.0]
    acct = QueueAccount(lambda: now[0])
    acct.waiting("a")
    acct.waiting("b")
    now[0] = 10.0
    acct.running("a")  # a ran after 10 s: both waited side by side (10 s of queue, not 20)
    now[0] = 15.0
    assert acct.total == 10.0 and acct.clock() == 5.0
    acct.ended("a")  # b still waits, nothing of this budget runs: queue again
    now[0] = 18.0
    acct.running("b")
    acct.ended("b")
    now[0] = 20.0
    assert acct.total == 13.0 and acct.clock() == 7.0


def test_a_panel_deadline_expiring_in_the_queue_waits_for_the_job(fake_slurm, tmp_path):
    from workbench.faces.panel.tuning import Either

    bench = bench_on(fake_slurm, tmp_path)
    fake_slurm.queue_s = 2.5  # the job runs 0.6 s once out of the queue
    deadline = Deadline(1.2, "stopped by the budget")  # expires while the job waits in the queue
    r = bench.run(progress=False, cancel=Either(deadline, threading.Event()))
    deadline.cancel()
    assert r.ok, r.message  # queue time is not spent: the deadline moved on by the wait
    assert deadline.waits.waited > 0 and not fake_slurm.submitted[-1].cancelled
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    r = bench.run(progress=False, cancel=Either(Deadline(60.0, "budget"), stop))
    assert r.status == "interrupted" and "stopped by the user" in r.message  # Stop still cancels a queued job
    assert fake_slurm.submitted[-1].cancelled


def test_ctrl_c_during_a_parallel_tune_cancels_every_job_and_returns(fake_slurm, tmp_path):
    import os
    import signal

    bench = bench_on(fake_slurm, tmp_path)
    fake_slurm.waits, fake_slurm.queue_s = [0.0], 3600.0  # the first trial runs; the rest wait in the queue

    def interrupt_once_two_wait():
        while len(fake_slurm.submitted) < 3:
            time.sleep(0.05)
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, as the kernel delivers it: KeyboardInterrupt in the main thread

    # a shell's background job inherits SIGINT ignored; a kernel (and this test) wants Ctrl-C
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Thread(target=interrupt_once_two_wait, daemon=True).start()
    t = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            bench.tune(n_trials=6, parallel=2, axes=("batch",), confirm=False, explain=False, progress=False)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - t < 30  # not hung on the watchers
    waiting = fake_slurm.submitted[1:]
    assert len(waiting) >= 2 and all(j.cancelled for j in waiting)
    by_job = {t.extra["job"]["id"]: t for t in bench.trials}
    assert all(by_job[j.job_id].status == "interrupted" for j in waiting)  # recorded, not lost
    assert "interrupted by the user" in by_job[waiting[0].job_id].message
    assert not bench._jobs.halted.is_set() and not bench._jobs.in_flight


def test_the_deadline_moves_on_by_a_queue_wait():
    d = Deadline(0.05, "budget")
    time.sleep(0.15)
    assert d.expired
    d.waits.queued(10.0)  # the job waited in the queue: the budget's deadline moves on
    assert not d.is_set() and not d.expired and d.waits.waited == 10.0
    d.cancel()


def test_only_a_budget_s_explicit_account_hears_of_queue_waits(fake_slurm, tmp_path):
    """A budget's trial gives its jobs one explicit object for their queue waits (`Deadline.waits`); a
    cancel event of the user's own, whatever its attributes, is a cancel and nothing more."""
    heard = []

    class MyStop(threading.Event):  # the user's own Stop, with attributes of its own
        queue = ("a tuple of the user's",)

        def postpone(self, seconds):
            heard.append(seconds)

    bench = bench_on(fake_slurm, tmp_path)
    fake_slurm.queue_s = 0.5
    r = bench.run(progress=False, cancel=MyStop())
    assert r.ok and r.extra["job"]["queue_s"] > 0 and heard == [], (r.message, heard)
    budget = Budget(None, "tune")
    r = budget.trial(functools.partial(bench.run, progress=False), wb.Knobs(batch_size=16))
    assert r.ok and budget.queue.total > 0  # the budget's own account heard the wait
    from workbench.launch.cluster import QueueWaits

    d = Deadline(None, "budget", budget.queue)
    assert isinstance(d.waits, QueueWaits) and d.waits.account is budget.queue


def test_trials_on_different_nodes_say_so():
    from workbench.results.stats import Comparison

    k = wb.Knobs()
    a = TrialResult(knobs=k, status="ok", env={"host": "n1", "device_name": "A100"})
    b = TrialResult(knobs=k, status="ok", env={"host": "n2", "device_name": "A100"})
    c = Comparison(1, 2, 1.1, 1.0, 1.2, True)
    assert "different nodes (n1 vs n2)" in cluster.where_note(c, a, b).note
    assert cluster.where_note(c, a, a).note == ""


# ---- a restarted kernel --------------------------------------------------------------------
def test_jobs_left_behind_are_recorded_or_marked_lost(tmp_path):
    submitit = pytest.importorskip("submitit")
    from submitit.core import utils

    bench = bench_on(concurrent.futures.ThreadPoolExecutor(1), tmp_path)
    jobs_dir = tmp_path / "runs" / "TinyNet.jobs"
    folder = tmp_path / "submitit"
    folder.mkdir()
    done = TrialResult(knobs=wb.Knobs(batch_size=16), status="ok", samples_per_s=100.0, step_times_s=(0.1, 0.1),
                       samples_per_step=16, env={"host": "n9"})
    utils.cloudpickle_dump(("success", done), submitit.LocalJob(folder=folder, job_id="111").paths.result_pickle)
    for jid in ("111", "222"):
        (jobs_dir / f"job-{jid}.json").write_text(
            json.dumps({"kind": "trial", "job_id": jid, "executor": "LocalJob", "folder": str(folder),
                        "knobs": {"batch_size": 16}, "started_at": "", "progress_file": None}))
    with pytest.warns(UserWarning, match="earlier kernel"):
        again = bench_on(concurrent.futures.ThreadPoolExecutor(1), tmp_path)
    by_job = {t.extra["job"]["id"]: t for t in again.trials}
    assert by_job["111"].ok and by_job["111"].extra["job"]["reattached"]
    assert by_job["222"].status == "error" and "lost" in by_job["222"].message
    assert not list(jobs_dir.glob("job-*.json"))
    assert len(bench.trials) == 0


def test_a_killed_kernel_not_yet_reaped_is_not_an_owner():
    """A SIGKILLed kernel stays a zombie until its parent (the Jupyter server) reaps it: same pid, same start
    time, but it runs nothing, so its jobs are an earlier kernel's to re-attach."""
    import signal
    import sys

    import psutil

    from workbench.launch import owners as jobs

    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        who = {"host": jobs.owner()["host"], "pid": p.pid, "started": jobs.started_at(p.pid)}
        assert jobs.owner_alive(who, time.time())
        p.send_signal(signal.SIGKILL)
        t = time.monotonic()
        while psutil.Process(p.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() - t < 10:
            time.sleep(0.05)
        assert not jobs.owner_alive(who, time.time())  # killed, not yet reaped
    finally:
        p.kill()
        p.wait()


def test_a_left_behind_job_in_a_folder_others_can_write_is_not_loaded(tmp_path):
    """The registry is a file on disk: a job whose folder sits under a folder others can write to is recorded
    as lost, naming the folder, and its result pickle is never loaded."""
    submitit = pytest.importorskip("submitit")
    from submitit.core import utils

    bench_on(concurrent.futures.ThreadPoolExecutor(1), tmp_path)
    jobs_dir = tmp_path / "runs" / "TinyNet.jobs"
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # anyone may write here (no sticky bit): a pickle could have been swapped
    folder = shared / "submitit"
    folder.mkdir()
    done = TrialResult(knobs=wb.Knobs(batch_size=16), status="ok", samples_per_s=100.0, step_times_s=(0.1, 0.1),
                       samples_per_step=16, env={"host": "n9"})
    utils.cloudpickle_dump(("success", done), submitit.LocalJob(folder=folder, job_id="111").paths.result_pickle)
    (jobs_dir / "job-111.json").write_text(
        json.dumps({"kind": "trial", "job_id": "111", "executor": "LocalJob", "folder": str(folder),
                    "knobs": {"batch_size": 16}, "started_at": "", "progress_file": None}))
    with pytest.warns(UserWarning, match="earlier kernel"):
        again = bench_on(concurrent.futures.ThreadPoolExecutor(1), tmp_path)
    (t,) = again.trials
    assert t.status == "error" and "lost" in t.message and str(shared) in t.message
    assert t.samples_per_s is None  # the pickle's figures never reached the log


def test_a_second_kernel_on_the_folder_leaves_the_first_ones_live_jobs_alone(fake_slurm, tmp_path):
    from workbench.launch import owners as jobs

    fake_slurm.queue_s = 3600.0
    first = bench_on(fake_slurm, tmp_path)
    stop = threading.Event()
    ran = concurrent.futures.ThreadPoolExecutor(1).submit(first.run, progress=False, cancel=stop)
    jobs_dir = tmp_path / "runs" / "TinyNet.jobs"
    while not list(jobs_dir.glob("job-*.json")):
        time.sleep(0.05)
    second = bench_on(fake_slurm, tmp_path)  # another kernel on the same folder (its owner: a live process)
    assert second.trials == [] and len(list(jobs_dir.glob("job-*.json"))) == 1  # not recorded, not cancelled
    assert not fake_slurm.submitted[0].cancelled
    stop.set()
    assert ran.result(timeout=30).status == "interrupted" and len(first.trials) == 1
    assert not jobs.owner_alive({"host": jobs.owner()["host"], "pid": 2 ** 22 + 7, "started": 1.0}, time.time())
    assert not jobs.owner_alive({"host": "elsewhere", "pid": 1}, time.time() - jobs.LEASE_S - 1)  # no heartbeat
    assert jobs.owner_alive({"host": "elsewhere", "pid": 1}, time.time())


# ---- submitit's local executor (a fresh process per job) ----------------------------------------
@pytest.mark.slow
def test_submitit_local_executor_runs_a_trial_and_a_new_workbench_reads_it_back(tmp_path, node_path):
    submitit = pytest.importorskip("submitit")
    ex = submitit.AutoExecutor(tmp_path / "jobs", cluster="local")
    ex.update_parameters(timeout_min=5)
    bench = bench_on(ex, tmp_path)
    r = bench.run(progress=False)
    assert r.ok, r.message
    assert r.extra["job"]["id"] and r.extra["job"]["executor"] == "LocalJob"
    assert (tmp_path / "jobs").stat().st_mode & 0o777 == 0o700
    again = bench_on(None, tmp_path)
    assert again.results["job"].tolist() == [r.extra["job"]["id"]]


# ---- a real one-node SLURM ------------------------------------------------------------------
@pytest.fixture
def slurm(tmp_path, node_path):
    submitit = pytest.importorskip("submitit")
    ex = submitit.AutoExecutor(tmp_path / "jobs", cluster="slurm")
    ex.update_parameters(timeout_min=5, slurm_cpus_per_task=1)
    return ex


@pytest.mark.slow
@needs_slurm
def test_slurm_trials_compare_and_read_back(slurm, tmp_path):
    bench = bench_on(slurm, tmp_path)
    cpu0 = time.process_time()
    a = bench.run(progress=False)
    b = bench.run(progress=False, batch_size=32)
    assert a.ok and b.ok, (a.message, b.message)
    assert a.extra["job"]["id"] != b.extra["job"]["id"] and a.env["slurm_job_id"] == a.extra["job"]["id"]
    assert a.extra["job"]["queue_s"] is not None
    c = bench.compare(1, 2, rounds="auto", budget_s=10)
    assert c.method == "interleaved" and "inside job" in c.note
    assert time.process_time() - cpu0 < 10  # the notebook trains nothing itself
    again = bench_on(None, tmp_path)
    assert again.results["job"].tolist() == [a.extra["job"]["id"], b.extra["job"]["id"]]


@pytest.mark.slow
@needs_slurm
def test_slurm_cancel_mid_trial_ends_it_and_the_next_runs(slurm, tmp_path):
    bench = bench_on(slurm, tmp_path, steps=100000)
    seen = []

    cancelled_at = []

    def progress(phase, done, total):
        seen.append(phase)
        if phase == "measuring" and len(seen) < 1000 and not any(s == "scancel" for s in seen):
            seen.append("scancel")
            subprocess.run(["scancel", bench._jobs.in_flight and next(iter(bench._jobs.in_flight.values())).job_id])
            cancelled_at.append(time.monotonic())

    r = bench.run(progress=progress, stop_early=False)
    assert r.status == "interrupted" and "cancelled" in r.message, r.message
    # the trial ends when SLURM writes the cancel, not when the job has left COMPLETING (KillWait, ~25 s here)
    assert time.monotonic() - cancelled_at[0] < 20
    bench.steps = 4
    assert bench.run(progress=False).ok


@pytest.mark.slow
@needs_slurm
def test_slurm_pending_job_shows_its_reason_and_a_stop_cancels_it(slurm, tmp_path):
    slurm.update_parameters(slurm_additional_parameters={"begin": "now+1hour"})
    bench = bench_on(slurm, tmp_path)
    phases, stop = [], threading.Event()

    def progress(phase, done, total):
        phases.append(phase)
        if phase.startswith("pending ("):
            stop.set()

    r = bench.run(progress=progress, cancel=stop)
    assert "pending (BeginTime)" in phases
    assert r.status == "interrupted" and "cancelled" in r.message
    assert r.extra["job"]["queue_s"] is None  # it never left the queue


def test_parallel_needs_an_executor(make_bench):
    with pytest.raises(ValueError, match="needs an executor"):
        make_bench().tune(n_trials=3, parallel=2, progress=False)


@pytest.mark.slow
@needs_slurm
def test_slurm_tune_keeps_jobs_in_flight(slurm, tmp_path):
    bench = bench_on(slurm, tmp_path)
    most, done = [0], threading.Event()

    def count():  # how many jobs this workbench had in flight at once
        while not done.wait(0.05):
            most[0] = max(most[0], len(bench._jobs.in_flight))

    threading.Thread(target=count, daemon=True).start()
    try:
        res = bench.tune(n_trials=3, parallel=2, axes=("batch",), confirm=False, explain=False, progress=False)
    finally:
        done.set()
    assert all(t.extra.get("job", {}).get("id") for t in bench.trials)  # every trial a job
    assert most[0] == 2  # two jobs in flight at once: the trials overlapped
    ran = res.steps[res.steps["trial"].notna()]
    assert len(bench.trials) >= 3 and len(ran) >= 3 and ran["node"].eq(HOST).all()  # each row names its node


# ---- the cluster fault matrix (docs/reliability.md), on the real one-node SLURM ---------------------
def slow_bench(executor, tmp_path, steps=200, **kw):
    """Trials of `steps` x 50 ms (SleepNet: the clock, not the loaded CPU, sets their length)."""
    from conftest import SleepNet

    return wb.Workbench(SleepNet(0.05), tiny_data(256), loss_fn=torch.nn.CrossEntropyLoss(), knobs=wb.Knobs(batch_size=16),
                        log=tmp_path / "runs", executor=executor, steps=steps, warmup_steps=1, **kw)


def scheduler_down_for(tmp_path, monkeypatch):
    """squeue and scontrol on PATH that answer "Unable to contact slurm controller" until the time
    written to the returned file (the real slurmctld keeps running for everyone else)."""
    shim = tmp_path / "shim"
    shim.mkdir()
    down = shim / "down_until"
    for tool in ("squeue", "scontrol"):
        real = shutil.which(tool)
        (shim / tool).write_text(f"""#!/bin/bash
if [ -e {down} ] && [ "$(date +%s)" -lt "$(cat {down})" ]; then
  echo "slurm_load_jobs error: Unable to contact slurm controller (connect failure)" >&2; exit 1
fi
exec {real} "$@"
""")
        (shim / tool).chmod(0o755)
    import os

    monkeypatch.setenv("PATH", f"{shim}{os.pathsep}{os.environ['PATH']}")
    return down


@pytest.mark.slow
@needs_slurm
@pytest.mark.parametrize("outage_s", [5, 60])
def test_slurm_a_scheduler_that_does_not_answer_keeps_the_trial(outage_s, slurm, tmp_path, monkeypatch):
    down = scheduler_down_for(tmp_path, monkeypatch)
    # ~15 s measured for the long outage (longer than the 15 s grace a lost job had), ~7 s for the short one
    bench = slow_bench(slurm, tmp_path, steps=300 if outage_s > 15 else 150)
    seen = []

    def progress(phase, done, total):
        seen.append(phase)
        if phase == "measuring" and not down.exists():
            down.write_text(str(int(time.time()) + outage_s))

    r = bench.run(progress=progress, stop_early=False)
    assert down.exists() and r.ok, r.message  # the job ran to its end: its trial is ok, never "lost"
    assert any("does not answer" in p for p in seen)  # and the bar said why it waited


@pytest.mark.slow
@needs_slurm
def test_slurm_two_kernels_on_one_folder_record_a_job_once(slurm, tmp_path):
    first = slow_bench(slurm, tmp_path, steps=60)
    ran = concurrent.futures.ThreadPoolExecutor(1).submit(first.run, progress=False)
    jobs_dir = tmp_path / "runs" / "SleepNet.jobs"
    while not list(jobs_dir.glob("job-*.json")) and not ran.done():
        time.sleep(0.1)
    second = slow_bench(slurm, tmp_path, steps=60)  # the same folder, the first still watching its job
    r = ran.result(timeout=300)
    assert r.ok, r.message
    assert second.trials == [] and len(first.trials) == 1
    assert slow_bench(None, tmp_path).results["job"].tolist() == [r.extra["job"]["id"]]  # logged once


CTRL_C_SCRIPT = """
import signal, sys, torch, submitit, workbench as wb
signal.signal(signal.SIGINT, signal.default_int_handler)  # a shell's background job inherits SIGINT ignored
from conftest import SleepNet, tiny_data
ex = submitit.AutoExecutor(sys.argv[1], cluster="slurm")
ex.update_parameters(timeout_min=5, slurm_cpus_per_task=1, name=sys.argv[2])
bench = wb.Workbench(SleepNet(0.05), tiny_data(256), loss_fn=torch.nn.CrossEntropyLoss(), knobs=wb.Knobs(batch_size=16),
                     log=sys.argv[3], executor=ex, steps=120, warmup_steps=1)
bench.tune(n_trials=4, parallel=2, axes=("batch",), confirm=False, explain=False, progress=False)
"""


def named_jobs(name):
    out = subprocess.run(["squeue", "-h", "-n", name, "-o", "%i|%T"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line.strip()]


@pytest.mark.slow
@needs_slurm
def test_slurm_ctrl_c_during_a_parallel_tune_returns_and_leaves_no_job(tmp_path, node_path):
    import signal
    import sys
    import uuid

    pytest.importorskip("submitit")
    name = f"wb-ctrl-c-{uuid.uuid4().hex[:8]}"
    (tmp_path / "tune.py").write_text(CTRL_C_SCRIPT)
    p = subprocess.Popen([sys.executable, str(tmp_path / "tune.py"), str(tmp_path / "jobs"), name, str(tmp_path / "runs")])
    try:
        t = time.monotonic()
        while len(named_jobs(name)) < 2 and time.monotonic() - t < 240 and p.poll() is None:
            time.sleep(0.5)  # the first trial runs alone; then two jobs in flight
        assert len(named_jobs(name)) >= 2
        p.send_signal(signal.SIGINT)
        t = time.monotonic()
        p.wait(timeout=30)  # returns within 30 s
        assert p.returncode != 0 and time.monotonic() - t < 30
        while named_jobs(name) and time.monotonic() - t < 60:
            time.sleep(0.5)
        assert named_jobs(name) == []  # nothing left running
        trials = slow_bench(None, tmp_path).trials
        assert [t.status for t in trials].count("interrupted") >= 2  # the cancelled jobs' trials are recorded
    finally:
        if p.poll() is None:
            p.kill()
        for line in named_jobs(name):
            subprocess.run(["scancel", line.split("|")[0]])


RESTART_SCRIPT = """
import sys, torch, submitit, workbench as wb
from conftest import SleepNet, tiny_data
ex = submitit.AutoExecutor(sys.argv[1], cluster="slurm")
ex.update_parameters(timeout_min=5, slurm_cpus_per_task=1, name=sys.argv[2])
bench = wb.Workbench(SleepNet(0.05), tiny_data(256), loss_fn=torch.nn.CrossEntropyLoss(), knobs=wb.Knobs(batch_size=16),
                     log=sys.argv[3], executor=ex, steps=int(sys.argv[4]), warmup_steps=1)
bench.run(progress=False, stop_early=False)
"""


@pytest.mark.slow
@needs_slurm
def test_slurm_a_restarted_kernel_reattaches_its_job_in_flight(slurm, tmp_path):
    """A kernel SIGKILLed while its trial's job runs: a new Workbench on the folder says so, watches the job
    again, and records its trial once, ok with its figures, when the job ends; nothing is left behind."""
    import signal
    import sys
    import uuid

    name = f"wb-restart-{uuid.uuid4().hex[:8]}"
    (tmp_path / "kernel.py").write_text(RESTART_SCRIPT)
    # 150 steps x 50 ms: the job still runs ~8 s after the kernel dies (SleepNet: the clock sets it)
    p = subprocess.Popen([sys.executable, str(tmp_path / "kernel.py"), str(tmp_path / "jobs"), name,
                          str(tmp_path / "runs"), "150"])
    jobs_dir = tmp_path / "runs" / "SleepNet.jobs"
    try:
        t = time.monotonic()
        while not any(j.endswith("|RUNNING") for j in named_jobs(name)) and time.monotonic() - t < 120:
            assert p.poll() is None, "the kernel ended before its job ran"
            time.sleep(0.2)
        (job,) = named_jobs(name)
        assert job.endswith("|RUNNING") and len(list(jobs_dir.glob("job-*.json"))) == 1
        p.send_signal(signal.SIGKILL)  # the kernel dies with no chance to clean up
        p.wait(timeout=10)
        with pytest.warns(UserWarning, match=r"earlier kernel: job \d+: re-attached \(running\)"):
            again = slow_bench(slurm, tmp_path, steps=150)
        t = time.monotonic()
        while not again.trials and time.monotonic() - t < 120:
            time.sleep(0.2)
        (r,) = again.trials
        assert r.ok, r.message
        assert r.extra["job"]["reattached"] and r.extra["job"]["id"] == job.split("|")[0] == r.env["slurm_job_id"]
        assert r.samples_per_s > 0 and len(r.step_times_s) > 0  # the job's own figures, not a stand-in
        t = time.monotonic()
        while list(jobs_dir.iterdir()) and time.monotonic() - t < 10:  # the watcher forgets the job once it recorded it
            time.sleep(0.1)
        assert list(jobs_dir.iterdir()) == []  # its registry entry and progress file are gone with the trial recorded
        t = time.monotonic()
        while named_jobs(name) and time.monotonic() - t < 30:
            time.sleep(0.5)  # the job wrote its result; SLURM ends it (COMPLETING) a moment later
        assert named_jobs(name) == [] and len(again.trials) == 1  # nothing left running, the trial once
        assert [t.extra["job"]["id"] for t in slow_bench(None, tmp_path).trials] == [r.extra["job"]["id"]]  # logged once
    finally:
        if p.poll() is None:
            p.kill()
        for line in named_jobs(name):
            subprocess.run(["scancel", line.split("|")[0]])


# ---- held jobs: several trials inside one job (held.py) ---------------------------------------
def test_a_held_worker_runs_two_trials_in_one_job_and_unpickles_the_workload_once(tmp_path):
    from workbench.launch.held import held

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        ex = held(pool, idle_s=5)
        bench = bench_on(ex, tmp_path)
        a = bench.run(progress=False)
        b = bench.run(wb.Knobs(batch_size=32), progress=False)
        assert a.ok and b.ok, (a.message, b.message)
        assert len(ex.workers()) == 1  # the second trial went to the first trial's worker
        assert a.extra["job"]["held"] == {"task": 1, "workload_loads": 1}
        assert b.extra["job"]["held"] == {"task": 2, "workload_loads": 1}  # no second unpickling
        assert b.extra["job"]["queue_s"] is not None and b.extra["job"]["start_s"] is not None  # reported apart
        assert b.samples_per_step == 32  # its own knobs: the trial is its own, the worker is shared
        ex.close()
        assert pool.submit(lambda: None).result() is None  # the worker's thread left the pool: it ended


def test_a_held_worker_ends_after_its_idle_timeout(tmp_path):
    from workbench.launch.held import held

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        ex = held(pool, idle_s=0.3)
        r = bench_on(ex, tmp_path).run(progress=False)
        assert r.ok, r.message
        job = ex.workers()[0]
        assert job.result(timeout=10) == {"tasks": 1, "workload_loads": 1}  # it returned: nothing runs
        r2 = bench_on(ex, tmp_path).run(progress=False)  # a closed worker takes no task: a new one starts
        assert r2.ok and r2.extra["job"]["held"]["task"] == 1, r2.message


def test_a_held_task_whose_worker_died_is_one_failed_trial(tmp_path, monkeypatch):
    from workbench.launch import watcher
    from workbench.launch.held import held

    monkeypatch.setattr(watcher, "RESULT_GRACE_S", 0.5)

    class Dies:  # a worker job that ends at once without running its inbox
        folder = None

        def submit(self, fn, *args, **kwargs):
            f = concurrent.futures.Future()
            f.set_result({"tasks": 0, "workload_loads": 0})
            return f

    ex = held(Dies(), idle_s=5)
    monkeypatch.setattr(ex, "_idle", lambda: None)  # every task goes to a fresh (dead) worker
    r = bench_on(ex, tmp_path).run(progress=False)
    assert r.status == "error" and "without writing its result" in r.message, r.message


@pytest.mark.slow
@needs_slurm
def test_slurm_held_job_runs_two_trials_then_a_cancel_leaves_nothing_running(slurm, tmp_path):
    from workbench.launch.held import held

    ex = held(slurm, idle_s=30)
    bench = bench_on(ex, tmp_path)
    a = bench.run(progress=False)
    b = bench.run(progress=False, batch_size=32)
    assert a.ok and b.ok, (a.message, b.message)
    assert a.extra["job"]["id"] == b.extra["job"]["id"] == a.env["slurm_job_id"]  # one job, two trials
    assert b.extra["job"]["held"] == {"task": 2, "workload_loads": 1}  # torch and the workload loaded once
    stop = threading.Event()
    bench.steps = 100000
    threading.Timer(2.0, stop.set).start()
    c = bench.run(progress=False, cancel=stop, stop_early=False)
    assert c.status == "interrupted" and "cancelled" in c.message, c.message
    ex.close()
    jobs = {str(j.job_id) for j in [*ex.workers()]} | {a.extra["job"]["id"], c.extra["job"]["id"]}
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        out = subprocess.run(["squeue", "-h", "-t", "PENDING,RUNNING", "-j", ",".join(jobs), "-o", "%i"],
                             capture_output=True, text=True).stdout.split()
        if not out:
            break
        time.sleep(0.5)
    assert not out, f"jobs still pending or running: {out}"


def test_tune_on_an_executor_says_the_wall_time_to_expect_from_what_it_measured(fake_slurm, tmp_path, capsys):
    from workbench.search.jobtime import expect_line

    fake_slurm.queue_s = 0.2
    bench = bench_on(fake_slurm, tmp_path)
    first = expect_line(bench.trials, 40, 2)
    assert "unknown until the first job starts" in first  # no figure before any job ran
    res = bench.tune(n_trials=2, budget_s=40, parallel=2, confirm=False, explain=False)
    said = capsys.readouterr().out
    assert first in said and res.jobs[0] == first
    assert "in the queue" in res.jobs[1] and "of job start-up" in res.jobs[1] and "jobs:" in str(res)
    queue = statistics.median(t.extra["job"]["queue_s"] for t in bench.trials)
    again = expect_line(bench.trials, 40, 2)
    assert f"queue ≈ {queue:.1f} s" in again and "start-up ≈" in again  # measured, medians of this workbench's jobs


def test_a_stopped_held_trial_ends_its_worker_job(tmp_path):
    from workbench.launch.held import held

    class ThreadJobs:  # worker jobs in threads, whose cancel is recorded (scancel's stand-in)
        folder = None

        def __init__(self):
            self.cancelled, self.threads = [], []

        def submit(self, fn, *args):
            f = concurrent.futures.Future()
            t = threading.Thread(target=lambda: f.set_result(fn(*args)), daemon=True)
            t.start()
            self.threads.append(t)
            f.cancel = lambda: self.cancelled.append(True) or True
            return f

    jobs = ThreadJobs()
    ex = held(jobs, idle_s=30)
    bench = bench_on(ex, tmp_path, steps=2000)
    stop = threading.Event()
    threading.Timer(1.0, stop.set).start()
    r = bench.run(progress=False, cancel=stop, stop_early=False)
    assert r.status == "interrupted", r.message
    assert jobs.cancelled and ex.workers() == []  # its worker job was cancelled and is not given more trials
    jobs.threads[0].join(timeout=30)
    assert not jobs.threads[0].is_alive()  # the worker honoured its stop file once the trial returned


# ---- a restarted kernel keeps what its jobs ran (the model, the process) -------------------------
def edited_bench(executor, tmp_path):
    """The workbench of a kernel restarted after the model was edited (a wider TinyNet), on the same log."""
    return wb.Workbench(TinyNet(d=32), tiny_data(256), loss_fn=torch.nn.CrossEntropyLoss(),
                        optimizer=lambda p: torch.optim.SGD(p, lr=0.05), knobs=wb.Knobs(batch_size=16),
                        log=tmp_path / "runs", executor=executor, steps=4, warmup_steps=1)


def test_a_job_in_flight_names_the_model_it_runs_in_its_registry_entry(fake_slurm, tmp_path):
    fake_slurm.queue_s = 3600.0
    bench = bench_on(fake_slurm, tmp_path)
    stop = threading.Event()
    ran = concurrent.futures.ThreadPoolExecutor(1).submit(bench.run, progress=False, cancel=stop)
    jobs_dir = tmp_path / "runs" / "TinyNet.jobs"
    t = time.monotonic()
    while not list(jobs_dir.glob("job-*.json")) and time.monotonic() - t < 30:
        time.sleep(0.05)
    (entry,) = [json.loads(p.read_text()) for p in jobs_dir.glob("job-*.json")]
    stop.set()
    assert ran.result(timeout=30).status == "interrupted"
    assert entry["model"] == bench.fingerprint  # what a restarted kernel records the trial as


def test_a_reattached_job_keeps_the_fingerprint_of_the_model_it_ran(tmp_path):
    """A kernel restarted after the model was edited: the old model's trial keeps the old model's
    fingerprint, is never compared with the new model's trials and never becomes their baseline."""
    submitit = pytest.importorskip("submitit")
    from submitit.core import utils

    old = bench_on(concurrent.futures.ThreadPoolExecutor(1), tmp_path)
    jobs_dir = tmp_path / "runs" / "TinyNet.jobs"
    folder = tmp_path / "submitit"
    folder.mkdir()
    for jid, model in (("111", old.fingerprint), ("222", None)):  # 222: an entry written without a model
        done = TrialResult(knobs=wb.Knobs(batch_size=16), status="ok", samples_per_s=100.0,
                           step_times_s=(0.1, 0.1), samples_per_step=16, env={"host": "n9"})
        utils.cloudpickle_dump(("success", done), submitit.LocalJob(folder=folder, job_id=jid).paths.result_pickle)
        entry = {"kind": "trial", "job_id": jid, "executor": "LocalJob", "folder": str(folder),
                 "knobs": {"batch_size": 16}, "started_at": "", "progress_file": None}
        (jobs_dir / f"job-{jid}.json").write_text(json.dumps({**entry, "model": model} if model else entry))
    with pytest.warns(UserWarning, match="earlier kernel"):
        new = edited_bench(concurrent.futures.ThreadPoolExecutor(1), tmp_path)
    assert new.fingerprint != old.fingerprint
    by_job = {t.extra["job"]["id"]: t for t in new.trials}
    assert by_job["111"].ok and by_job["111"].extra["model"] == old.fingerprint
    assert by_job["222"].extra["model"] == "unknown"  # which model it ran is not known: never this one's
    assert new.log.baseline is None  # the edited model has no trial yet


def start_local_sleeper(tmp_path):
    """A submitit local job that sleeps two minutes, once its task runs (the controller and its child)."""
    import psutil

    submitit = pytest.importorskip("submitit")
    ex = submitit.LocalExecutor(tmp_path / "sub")
    ex.update_parameters(timeout_min=5)
    job = ex.submit(time.sleep, 120)
    t = time.monotonic()
    while not psutil.Process(job._process.pid).children() and time.monotonic() - t < 30:
        time.sleep(0.05)
    return job


def ended(job, within=20.0):
    t = time.monotonic()
    while job._process.poll() is None and time.monotonic() - t < within:
        time.sleep(0.05)
    return job._process.poll() is not None


def test_a_left_behind_local_job_is_stopped_by_its_pid(tmp_path):
    """A LocalJob rebuilt from its folder and id (a new kernel's) has no process handle; its cancel
    ends the job's processes (its controller's pid is the job id), and says so only when they ended."""
    import sys

    submitit = pytest.importorskip("submitit")
    job = start_local_sleeper(tmp_path)
    try:
        orphan = submitit.LocalJob(folder=job.paths.folder, job_id=job.job_id)
        assert orphan._process is None
        said = cluster.stop_job(orphan)
        assert ended(job), f"the job still runs after: {said}"
        assert said == "cancelled (its process was ended)"
    finally:
        job.cancel()
        job._process.wait()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # a pid not a submitit job's
    try:
        said = cluster.stop_job(submitit.LocalJob(folder=job.paths.folder, job_id=str(other.pid)))
        assert other.poll() is None and said.startswith("not cancelled"), said  # never signalled
    finally:
        other.kill()
        other.wait()


def test_a_restarted_kernel_stops_a_left_behind_local_job_and_says_so(tmp_path):
    """A local job cannot be watched from another kernel: left running, it would train beside this kernel's
    trials. It is stopped, and its trial is recorded as stopped (never evidence), saying why."""
    job = start_local_sleeper(tmp_path)
    try:
        bench_on(concurrent.futures.ThreadPoolExecutor(1), tmp_path)
        jobs_dir = tmp_path / "runs" / "TinyNet.jobs"
        (jobs_dir / f"job-{job.job_id}.json").write_text(
            json.dumps({"kind": "trial", "job_id": job.job_id, "executor": "LocalJob", "folder": str(job.paths.folder),
                        "knobs": {"batch_size": 16}, "started_at": "", "progress_file": None}))
        with pytest.warns(UserWarning, match="earlier kernel"):
            again = bench_on(concurrent.futures.ThreadPoolExecutor(1), tmp_path)
        assert ended(job), "the left-behind job still trains"
        (t,) = again.trials
        assert t.status == "interrupted" and "its process was ended" in t.message, t.message
    finally:
        job.cancel()
        job._process.wait()


# ---- held jobs: the scheduler asked once, a node's import error said --------------------------------
class HeldSlurm:
    """Worker jobs that look like SLURM's to the watcher; they never run their inbox (states are patched)."""

    folder = None

    def __init__(self):
        self.n = 0

    def submit(self, fn, *args, **kwargs):
        self.n += 1
        return type("SlurmJob", (), {"job_id": str(7000 + self.n), "done": lambda s: False,
                                     "cancel": lambda s, check=False: None})()


@pytest.fixture
def held_slurm(monkeypatch):
    import importlib

    from workbench.launch import watcher

    heldmod = importlib.import_module("workbench.launch.held")  # the package's `held` is the function
    calls: list = []
    gate = threading.Event()
    gate.set()

    def states(ids):
        calls.append(sorted(ids))
        gate.wait()
        return {str(j): cluster.SchedulerState("RUNNING", "", "n1") for j in ids}

    board = watcher.SlurmBoard()
    for module in (watcher, heldmod):
        monkeypatch.setattr(module, "is_slurm", lambda job: type(job).__name__ == "SlurmJob")
        monkeypatch.setattr(module, "BOARD", board, raising=False)
    monkeypatch.setattr(watcher, "slurm_states", states)
    return calls, gate


def test_held_tasks_are_asked_about_in_one_squeue(held_slurm):
    from workbench.launch.held import held

    calls, _gate = held_slurm
    ex = held(HeldSlurm(), idle_s=30)
    a, b = ex.submit(len, [1]), ex.submit(len, [2])  # the first worker is busy: a second one starts
    assert a.job_id != b.job_id
    calls.clear()
    for _ in range(3):
        assert a.scheduler_state().state == b.scheduler_state().state == "RUNNING"
    assert calls and all(c == sorted([a.job_id, b.job_id]) for c in calls) and len(calls) <= 1, calls


def test_a_slow_scheduler_does_not_stall_another_executor_s_submit(held_slurm):
    from workbench.launch.held import held

    _calls, gate = held_slurm
    slow = held(HeldSlurm(), idle_s=30)
    slow.submit(len, [1])  # its worker: the next submit asks the scheduler whether it still runs
    gate.clear()  # squeue hangs (its 10 s timeout on a busy slurmctld)
    asking = threading.Thread(target=slow.submit, args=(len, [2]), daemon=True)
    asking.start()
    time.sleep(0.2)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        other = held(pool, idle_s=5)
        try:
            task = concurrent.futures.ThreadPoolExecutor(1).submit(other.submit, len, [3]).result(timeout=10)
            assert task is not None  # given to its worker while the other executor's squeue hangs
        finally:
            gate.set()
            asking.join(timeout=10)
            other.close()


def test_a_held_task_the_node_cannot_unpickle_says_why_and_the_worker_goes_on(tmp_path):
    """The node cannot import a module of the call (not on its filesystem): the task fails with the
    ModuleNotFoundError and its fix, leaves no `.run` file, and the worker runs the next task."""
    import sys
    import types

    from workbench.launch.held import held

    mod = types.ModuleType("wb_only_in_the_notebook")

    def hello():
        return "hi"

    hello.__module__, hello.__qualname__ = mod.__name__, "hello"
    mod.hello = hello
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        ex = held(pool, idle_s=5)
        sys.modules[mod.__name__] = mod
        try:
            task = ex.submit(hello)  # pickled by reference to a module the worker cannot import
        finally:
            del sys.modules[mod.__name__]
        t = time.monotonic()
        while not task.done() and time.monotonic() - t < 20:
            time.sleep(0.05)
        assert task.done(), "the worker died on the task's unpickling"
        with pytest.raises(RuntimeError, match="No module named 'wb_only_in_the_notebook'") as e:
            task.result()
        assert "same Python environment" in cluster.job_error("7", e.value)  # the fix, as for any job
        assert not list(task.worker.inbox.glob("*.run"))
        nxt = ex.submit(len, [1, 2])
        t = time.monotonic()
        while not nxt.done() and time.monotonic() - t < 20:
            time.sleep(0.05)
        assert nxt.result() == 2 and nxt.worker is task.worker
        ex.close()


def test_a_held_executor_does_not_keep_the_workloads_it_ran_alive():
    import gc
    import weakref

    from workbench.launch.held import held

    class Work:  # a workload: the held executor writes it to its worker once
        pass

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        ex = held(pool, idle_s=5)
        refs = []
        for _ in range(3):
            w = Work()
            refs.append(weakref.ref(w))
            task = ex.submit(lambda payload: 1, {"workload": w})
            t = time.monotonic()
            while not task.done() and time.monotonic() - t < 20:
                time.sleep(0.05)
            assert task.result() == 1
            del w, task
        gc.collect()
        assert all(r() is None for r in refs)  # the user's old models are not held by the executor
        ex.close()


# ---- a finished job's result on a network filesystem ---------------------------------------------
def test_a_result_hidden_by_a_cached_lookup_is_read_from_the_folder_s_listing(tmp_path, monkeypatch):
    """NFS caches a failed lookup: `exists()` says no while the folder's listing has the file."""
    from pathlib import Path
    from types import SimpleNamespace

    from workbench.launch import watcher

    monkeypatch.setattr(watcher, "is_slurm", lambda job: True)
    result = tmp_path / "5_0_result.pkl"
    job = SimpleNamespace(job_id="5", paths=SimpleNamespace(folder=tmp_path, result_pickle=result,
                                                            stderr=tmp_path / "5_0_log.err"))
    w = cluster.Watch(job, tmp_path / "progress.json", 0.0)
    result.write_bytes(b"written on the node")
    real = Path.exists
    monkeypatch.setattr(Path, "exists", lambda p: False if p.name == result.name else real(p))
    w.check_alive(cluster.SchedulerState("COMPLETED"), 10.0)  # the scheduler says it ended: its grace begins
    assert w.finished()


def test_a_finished_job_s_result_gets_an_honest_grace_and_the_message_says_what_to_raise(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from workbench.launch import watcher

    monkeypatch.delenv("WORKBENCH_RESULT_GRACE_S", raising=False)
    job = SimpleNamespace(job_id="5", paths=SimpleNamespace(folder=tmp_path, result_pickle=tmp_path / "r.pkl",
                                                            stderr=tmp_path / "e.err"))
    done = cluster.SchedulerState("COMPLETED")
    w = cluster.Watch(job, tmp_path / "progress.json", 0.0)
    w.check_alive(done, 100.0)
    w.check_alive(done, 140.0)  # 40 s after the end: NFS attribute caching (acdirmax 60 s) may still hide it
    with pytest.raises(cluster.JobFailed) as e:
        w.check_alive(done, 100.0 + watcher.result_grace_s() + 1)
    assert "WORKBENCH_RESULT_GRACE_S" in e.value.message and str(tmp_path) in e.value.message, e.value.message
    monkeypatch.setenv("WORKBENCH_RESULT_GRACE_S", "300")
    w = cluster.Watch(job, tmp_path / "progress.json", 0.0)
    w.check_alive(done, 100.0)
    w.check_alive(done, 350.0)  # the user's longer bound holds
    monkeypatch.setenv("WORKBENCH_RESULT_GRACE_S", "soon")
    with pytest.raises(ValueError, match="WORKBENCH_RESULT_GRACE_S"):
        watcher.result_grace_s()
