"""Trials as jobs: `Workbench(..., executor=ex)` sends every trial (and every interleaved comparison)
to `ex` and watches it from the notebook, which trains nothing itself and stays the log's one writer.

`ex` is a submitit executor (`submitit.AutoExecutor(folder, cluster="slurm")`, or its local
executor) or any object with `submit(fn, *args, **kwargs) -> job`, where `job` has `result()`,
`done()` and `cancel()` (and optionally `job_id` and `state`): a Dask or Ray adapter is ten lines
(docs/cluster.md). What travels is the workload by value (cloudpickle) and this package by
reference, so the job's node must see the same Python environment (a shared filesystem).

Inside the job the seam's entry (remote.trial_job with `here_on_node`) runs the same phases as a
local trial on the node's device ("auto" is resolved there); an analysis or an interleaved
comparison goes through `job_call`. Progress goes to a small JSON file in a private (0700) folder
beside the log. The notebook side (`watch`) reads it, asks the scheduler for the job's
state (SLURM: `squeue`, then `scontrol` once the job left the queue; no accounting needed), cancels
the job on Stop, a budget's deadline or Ctrl-C, and turns a job that ended without a result
(cancelled, timeout, preempted, node failure, out of memory, lost) into a failed trial with the
scheduler's reason. Waiting in the queue is measured apart (`extra["job"]["queue_s"]`).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..core.measure import TrialResult, environment, now_iso
from ..core.progress import TrialProgress
from ..core.workload import Workload, resolve_device

INSTALL = 'pip install "tuning-workbench[cluster]"'
POLL_S = 0.25  # how often the notebook looks at the job (progress file, result)
ASK_EVERY_S = 1.0  # how often it asks the scheduler (squeue is one cheap RPC)
RESULT_GRACE_S = 15.0  # after the scheduler says the job ended, how long its result may take to appear
WRITE_EVERY_S = 0.5  # how often the job writes its progress file
CANCEL_WAIT_S = 10.0  # after a cancel, how long to wait for the job to leave the node
TERMINAL = {  # SLURM job states that end a job, and the trial status a job without a result gets
    "CANCELLED": "interrupted", "PREEMPTED": "interrupted", "DEADLINE": "interrupted",
    "TIMEOUT": "error", "NODE_FAIL": "error", "BOOT_FAIL": "error", "FAILED": "error",
    "OUT_OF_MEMORY": "oom", "COMPLETED": "error", "SPECIAL_EXIT": "error", "REVOKED": "error",
}
WHY = {
    "CANCELLED": "was cancelled on the scheduler (scancel, an administrator, or its dependency)",
    "PREEMPTED": "was preempted by a higher-priority job",
    "DEADLINE": "reached its deadline before it could finish",
    "TIMEOUT": "hit its time limit: raise the executor's timeout_min",
    "NODE_FAIL": "lost its node (the node failed or stopped answering)",
    "BOOT_FAIL": "could not start its node",
    "FAILED": "exited with an error before returning a result (see the job's stderr)",
    "OUT_OF_MEMORY": "ran out of host memory on its node: raise the executor's mem_gb (or lower batch_size)",
    "COMPLETED": "ended without writing its result",
}


class QueueAccount:
    """The wall-clock seconds during which one budget's work was only queued: at least one of its jobs
    in flight and none of them running (jobs.py reports each job's waiting, running and end). Owned by
    one budget (deciding/budget.py), under its own lock: waits of jobs queued side by side count once,
    a job waiting while another of the budget's jobs runs counts as the budget's time (its work goes
    on), and another budget in the kernel is never touched. `clock()` is the budget's clock: `base`
    less those seconds, so it never runs backwards and a trial's seconds on it are never negative."""

    def __init__(self, base: Callable[[], float] = time.perf_counter) -> None:
        self._lock = threading.Lock()
        self._base = base
        self._waiting: set[object] = set()
        self._running: set[object] = set()
        self._since: float | None = None  # the start of the open stretch where all work waits
        self._closed = 0.0  # seconds of the stretches already closed

    def _settle(self, now: float) -> None:
        only_queued = bool(self._waiting) and not self._running
        if only_queued and self._since is None:
            self._since = now
        elif not only_queued and self._since is not None:
            self._closed += max(0.0, now - self._since)
            self._since = None

    def waiting(self, key: object) -> None:
        """A job of this budget was submitted and waits in the queue."""
        with self._lock:
            self._waiting.add(key)
            self._settle(self._base())

    def running(self, key: object) -> None:
        """The scheduler runs `key`'s job (or it wrote its first progress)."""
        with self._lock:
            self._waiting.discard(key)
            self._running.add(key)
            self._settle(self._base())

    def ended(self, key: object) -> None:
        """`key`'s job ended (or was given up), however it ended."""
        with self._lock:
            self._waiting.discard(key)
            self._running.discard(key)
            self._settle(self._base())

    def wall(self) -> float:
        """The base clock (wall time), queue waits included."""
        return self._base()

    def _read(self) -> tuple[float, float]:
        with self._lock:
            now = self._base()
            return now, self._closed + (max(0.0, now - self._since) if self._since is not None else 0.0)

    @property
    def total(self) -> float:
        """Seconds so far during which all of this budget's work was queued."""
        return self._read()[1]

    def clock(self) -> float:
        """The budget's clock: `base()` less the seconds all of its work was only queued."""
        now, queued = self._read()
        return now - queued


def work_clock() -> float:
    """The clock of a seconds budget without jobs in flight (perf_counter); a Budget runs on its own
    QueueAccount's clock, which leaves out the seconds its jobs only waited in a queue."""
    return time.perf_counter()


# ---- the executor ----------------------------------------------------------------------------
def check_executor(executor: Any) -> Any:
    """The executor as given, or TypeError naming what an executor needs."""
    if executor is None:
        return None
    if not callable(getattr(executor, "submit", None)):
        raise TypeError(f"executor must have submit(fn, *args) returning a job with result(), done() and cancel() "
                        f"(e.g. submitit.AutoExecutor(folder, cluster='slurm'); {INSTALL}), got {type(executor).__name__}")
    folder = getattr(executor, "folder", None)
    if folder is not None:
        private_folder(Path(folder))
    return executor


def local_device(device: str | torch.device) -> str | torch.device:
    """The device for this machine's one-step check when trials run elsewhere: a CUDA device asked for
    from a machine without CUDA (a login node) checks on the CPU; the job resolves it on its node."""
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        return "cpu"
    return device


def where_note(c: Any, a: TrialResult, b: TrialResult) -> Any:
    """`c` (a Comparison) with a note when trials A and B ran on different nodes or devices, since the
    difference then includes the machines (an interleaved comparison runs both inside one job)."""
    if getattr(c, "method", "") == "interleaved":
        return c
    ea, eb = a.env or {}, b.env or {}
    parts = []
    for key, what in (("host", "nodes"), ("device_name", "devices"), ("gpu_name", "GPUs")):
        if ea.get(key) and eb.get(key) and ea[key] != eb[key]:
            parts.append(f"{what} ({ea[key]} vs {eb[key]})")
    if not parts:
        return c
    from dataclasses import replace

    note = (f"A and B ran on different {' and '.join(parts)}: this difference includes the machines; "
            "compare(a, b, rounds='auto') runs both inside one job on one node.")
    return replace(c, note=f"{c.note} {note}".strip())


def is_slurm(job: Any) -> bool:
    """Whether `job` is a SLURM job (submitit's SlurmJob): its state then comes from squeue/scontrol."""
    return type(job).__name__ == "SlurmJob" and shutil.which("squeue") is not None


def private_folder(path: Path) -> Path:
    """`path` created if missing and made private (0700), or ValueError when another user owns it: a job
    loads only what this workbench wrote there."""
    path.mkdir(parents=True, exist_ok=True)
    st = path.stat()
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise ValueError(f"the job folder {path} belongs to another user: a job would load files it did not "
                         "write; give the executor a folder of your own")
    if st.st_mode & 0o077:
        path.chmod(0o700)
    return path


def quiet_sacct() -> None:
    """submitit asks `sacct` for states and logs a warning each time it fails (SLURM without
    accounting); the watcher asks squeue/scontrol instead, so those warnings say nothing here."""
    log = logging.getLogger("submitit")
    if not any(isinstance(f, _NoSacct) for f in log.filters):
        log.addFilter(_NoSacct())


class _NoSacct(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Bypassing sacct error" not in record.getMessage()


# ---- what travels ----------------------------------------------------------------------------
def check_travels(workload: Workload) -> int:
    """Bytes the workload takes pickled by value (cloudpickle), or ValueError naming the part that
    cannot travel to a job (an open file, a lock, a generator, a CUDA tensor made in the notebook)
    and the fix, before anything is submitted."""
    try:
        import cloudpickle
    except ImportError as e:
        raise ModuleNotFoundError(f"trials on an executor need cloudpickle: {INSTALL}", name="cloudpickle") from e
    spec = workload.spec
    parts = {"model": workload.pristine, "dataset": spec.dataset, "collate_fn": spec.collate_fn,
             "sampler": spec.sampler, "loss_fn": workload.loss_fn, "optimizer": workload.optimizer_factory,
             "step_fn": workload.step_fn}
    total = 0
    for name, obj in parts.items():
        cuda = _cuda_tensor(obj, name)
        if cuda:
            raise ValueError(f"{cuda} is a CUDA tensor made in the notebook: it cannot travel to a job (its node "
                             "may have no GPU, or another one). Keep it on the CPU: each trial moves its batches "
                             "to the node's device")
        try:
            total += len(cloudpickle.dumps(obj))
        except Exception as e:
            where, culprit = _culprit(obj, name, cloudpickle)
            raise ValueError(f"the {name} cannot travel to a job: {where} ({_kind(culprit, e)}) cannot be pickled. "
                             f"{_fix(culprit)}") from e
    return total


def _children(obj: Any) -> list[tuple[str, Any]]:
    """The parts of `obj` worth naming when it does not pickle: attributes, closure cells, items."""
    out: list[tuple[str, Any]] = []
    if callable(obj) and getattr(obj, "__closure__", None):
        names = obj.__code__.co_freevars
        out += [(f"<closure {n}>", c.cell_contents) for n, c in zip(names, obj.__closure__) if _filled(c)]
    if isinstance(obj, (list, tuple)):
        out += [(f"[{i}]", v) for i, v in enumerate(obj[:50])]
    elif isinstance(obj, dict):
        out += [(f"[{k!r}]", v) for k, v in list(obj.items())[:50]]
    d = getattr(obj, "__dict__", None)
    if isinstance(d, dict):
        out += [(f".{k}", v) for k, v in d.items()]
    return out


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018
        return True
    except ValueError:  # an empty cell
        return False


def _culprit(obj: Any, name: str, pickler: Any, depth: int = 4) -> tuple[str, Any]:
    """The deepest part of `obj` (with its path) that does not pickle."""
    if depth:
        for key, child in _children(obj):
            try:
                pickler.dumps(child)
            except Exception:
                return _culprit(child, name + key if key.startswith(("[", ".")) else f"{name} {key}", pickler,
                                depth - 1)
    return name, obj


def _kind(obj: Any, e: BaseException) -> str:
    import io

    if isinstance(obj, io.IOBase):
        return f"an open file {getattr(obj, 'name', '')!r}".replace(" ''", "")
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    return f"{type(obj).__name__}: {text}"


def _fix(obj: Any) -> str:
    import io

    if isinstance(obj, io.IOBase):
        return "Open the file inside the dataset's __getitem__ (or keep its path and open it lazily), not in the notebook"
    if callable(obj):
        return "Define the function so that everything it uses can be pickled (no locks, files or generators in its closure)"
    return ("Build it inside the job instead (keep a path or a factory in the object), or run the workbench from an "
            "importable factory (python -m workbench run --model pkg.module:factory)")


def _cuda_tensor(obj: Any, name: str, depth: int = 3) -> str | None:
    """The path of a CUDA tensor inside `obj` (a few levels of attributes and items), else None."""
    if isinstance(obj, torch.Tensor):
        return name if obj.is_cuda else None
    if isinstance(obj, torch.nn.Module):
        for key, t in [*obj.named_parameters(), *obj.named_buffers()]:
            if t.is_cuda:
                return f"{name}.{key}"
        return None
    if depth and not callable(obj):
        for key, child in _children(obj):
            found = _cuda_tensor(child, name + key, depth - 1)
            if found:
                return found
    return None


# ---- inside the job --------------------------------------------------------------------------
def node_environment(device: torch.device) -> dict[str, Any]:
    """The node's environment: `measure.environment` (with its host name) plus CUDA and driver versions
    and the scheduler's job id."""
    env = environment(device)
    if device.type == "cuda":
        env["cuda"] = torch.version.cuda or ""
        env["driver"] = gpu_driver()
    for var in ("SLURM_JOB_ID", "SLURM_JOB_PARTITION", "SUBMITIT_LOCAL_JOB_ID"):
        if os.environ.get(var):
            env[var.lower()] = os.environ[var]
    return env


def gpu_driver() -> str:
    """The NVIDIA driver version on this node ("" when it has none)."""
    try:
        with open("/proc/driver/nvidia/version") as f:
            first = f.readline()
        return next((w for w in first.split() if w[:1].isdigit() and "." in w), first.strip())
    except OSError:
        return ""


class ProgressFile:
    """Writes a TrialProgress (and this node's name) to a JSON file every WRITE_EVERY_S, from its own
    thread, atomically (write then rename), so the notebook reads whole snapshots."""

    def __init__(self, progress: TrialProgress, path: str | os.PathLike) -> None:
        self.progress, self.path = progress, Path(path)
        self.host = platform.node().split(".")[0]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="workbench-progress-file", daemon=True)

    def write(self) -> None:
        phase, done, total = self.progress.snapshot()
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"phase": phase, "done": done, "total": total, "host": self.host,
                                   "pid": os.getpid(), "t": time.time()}))
        os.replace(tmp, self.path)

    def _loop(self) -> None:
        while not self._stop.wait(WRITE_EVERY_S):
            self.write()

    def __enter__(self) -> ProgressFile:
        self.write()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.write()


def on_node(workload: Workload, device: str | None) -> Workload:
    """The workload with its device resolved on this node (the notebook's "auto" may have meant its CPU)."""
    if device is not None:
        workload.device = resolve_device(device)
    return workload


def here_on_node(workload: Workload, knobs: Any, *, device: str | None, **run: Any) -> TrialResult:
    """In the job (remote.trial_job's `here`): runner.run_here on this node's device ("auto" resolved
    here), the result's environment completed with the node's (driver, CUDA, the scheduler's job id)."""
    from .runner import run_here

    wl = on_node(workload, device)
    r = run_here(wl, knobs, **run)
    r.env.update(node_environment(wl.device))
    return r


def job_call(fn: Callable[..., Any], workload: Workload, device: str | None, args: tuple, kwargs: dict[str, Any],
             progress_file: str) -> tuple[Any, dict[str, Any]]:
    """A job's body for an analysis (`fn(workload, *args, **kwargs)`, e.g. diagnose's profile): its
    value and the node's environment."""
    wl = on_node(workload, device)
    state = TrialProgress()
    state.set(getattr(fn, "__name__", "analysis").replace("_", " "), 0, 1)
    with ProgressFile(state, progress_file):
        value = fn(wl, *args, **kwargs)
        state.set("done", 1, 1)
    return value, node_environment(wl.device)


# ---- the notebook's side -----------------------------------------------------------------------
@dataclass
class SchedulerState:
    """What the scheduler says about a job: its state word, why it waits or ended, and its node."""

    state: str = ""  # PENDING, RUNNING, COMPLETED, CANCELLED, TIMEOUT, ... ("" when unknown)
    reason: str = ""  # Resources, Priority, ... or the end's reason
    node: str = ""
    known: bool = True  # False once the scheduler no longer lists the job


def slurm_state(job_id: str) -> SchedulerState:
    """The job's state from `squeue` (pending/running), else `scontrol show job` (ended, kept by
    slurmctld for MinJobAge seconds), else unknown. Accounting (sacct) is not needed."""
    try:
        out = subprocess.run(["squeue", "-h", "-j", str(job_id), "-o", "%T|%r|%N"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
        if out:
            state, reason, node = [*out.splitlines()[0].split("|"), "", "", ""][:3]
            return SchedulerState(state, "" if reason in ("None", "(null)") else reason, node)
        out = subprocess.run(["scontrol", "-o", "show", "job", str(job_id)], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return SchedulerState(known=False)
    fields = dict(w.split("=", 1) for w in out.split() if "=" in w)
    if not fields.get("JobState"):
        return SchedulerState(known=False)
    reason = fields.get("Reason", "")
    return SchedulerState(fields["JobState"], "" if reason == "None" else reason, fields.get("NodeList", ""))


def job_id_of(job: Any) -> str:
    """The scheduler's id of `job` ("" for an executor that has none)."""
    jid = getattr(job, "job_id", None)
    return "" if jid is None else str(jid)


class JobFailed(Exception):
    """A job ended without a result: `status` (a trial status) and `message` say why."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


@dataclass
class Watch:
    """One job watched from the notebook: submitted at `t_submit`, started when its progress file
    first appears; `queue_s` is the wait in between (never measurement)."""

    job: Any
    progress_file: Path
    t_submit: float
    t_start: float | None = None  # the job's first progress (its Python, imports and workload loaded)
    t_running: float | None = None  # the scheduler first said RUNNING (SLURM), else t_start
    sched: SchedulerState | None = None
    asked_at: float = 0.0
    ended_at: float | None = None  # when the scheduler first said the job ended without a result
    host: str = ""

    @property
    def job_id(self) -> str:
        return job_id_of(self.job)

    @property
    def queue_s(self) -> float | None:
        """Seconds from submission until the scheduler ran the job (never measurement); None where no
        scheduler says when (a local process, a Future): their wait is all start-up (`start_s`)."""
        return None if self.t_running is None else max(0.0, self.t_running - self.t_submit)

    @property
    def start_s(self) -> float | None:
        """Seconds from the job running (or, without a scheduler, its submission) until its trial began:
        its Python, imports, unpickling the workload."""
        if self.t_start is None:
            return None
        return max(0.0, self.t_start - (self.t_running if self.t_running is not None else self.t_submit))

    def info(self) -> dict[str, Any]:
        """What the trial records about its job (`extra["job"]`)."""
        d: dict[str, Any] = {"id": self.job_id, "executor": type(self.job).__name__, "queue_s": self.queue_s,
                             "start_s": self.start_s}
        if self.sched is not None and self.sched.node:
            d["node"] = self.sched.node
        if self.host:
            d.setdefault("node", self.host)
        return d

    def finished(self) -> bool:
        """Whether the job's result is there to read (without asking the scheduler for it)."""
        paths = getattr(self.job, "paths", None)
        if paths is not None and is_slurm(self.job):
            return Path(paths.result_pickle).exists()
        return bool(self.job.done())

    def read_progress(self) -> dict[str, Any] | None:
        try:
            snap = json.loads(self.progress_file.read_text())
        except (OSError, ValueError):
            return None
        if isinstance(snap, list) and len(snap) == 3:  # remote.trial_job writes [phase, done, total]
            snap = {"phase": snap[0], "done": snap[1], "total": snap[2]}
        if not isinstance(snap, dict):
            return None
        if self.t_start is None:
            self.t_start = time.monotonic()
        self.host = snap.get("host", self.host)
        return snap

    def ask(self, now: float) -> SchedulerState | None:
        """The scheduler's state (SLURM: at most once per ASK_EVERY_S); None for other executors."""
        if not is_slurm(self.job):
            return None
        if self.sched is None or now - self.asked_at >= ASK_EVERY_S:
            self.sched, self.asked_at = slurm_state(self.job_id), now
            if self.t_running is None and self.sched.state in ("RUNNING", "COMPLETING", "COMPLETED"):
                self.t_running = now
        return self.sched

    def phase(self, snap: dict[str, Any] | None, sched: SchedulerState | None) -> str:
        """The progress phase to show: the scheduler's wait (with its reason), else the job's own phase."""
        if snap is not None:
            return str(snap.get("phase", "running"))
        if sched is not None and sched.state == "PENDING":
            return f"pending ({sched.reason})" if sched.reason else "pending"
        if sched is not None and sched.state in ("RUNNING", "CONFIGURING"):
            return f"starting on {sched.node}" if sched.node else "starting"
        return f"submitted (job {self.job_id})" if self.job_id else "submitted"

    def check_alive(self, sched: SchedulerState | None, now: float) -> None:
        """JobFailed when the scheduler says the job ended (or forgot it) and no result came within
        RESULT_GRACE_S: its state and reason become the trial's status and message."""
        if sched is None or (sched.known and sched.state not in TERMINAL):
            return
        if self.ended_at is None:
            self.ended_at = now
        if now - self.ended_at < (RESULT_GRACE_S if sched.state in ("COMPLETED", "") else 2.0):
            return
        if not sched.known:
            raise JobFailed("error", f"job {self.job_id} is lost: the scheduler no longer knows it and it left no "
                                     f"result in {getattr(getattr(self.job, 'paths', None), 'folder', 'its folder')}")
        why = WHY.get(sched.state, f"ended in state {sched.state}")
        where = f" on {sched.node}" if sched.node else ""
        reason = f" (reason: {sched.reason})" if sched.reason else ""
        raise JobFailed(TERMINAL[sched.state], f"job {self.job_id}{where} {why}{reason}")


def new_progress_file(jobs_dir: Path) -> Path:
    """A fresh progress file path inside the private jobs folder."""
    return private_folder(jobs_dir) / f"progress-{uuid.uuid4().hex[:12]}.json"


def watch(job: Any, w: Watch, progress: TrialProgress, cancel: threading.Event | None,
          on_queue: Callable[[float], None] | None = None, queue_counts: bool = True,
          on_running: Callable[[], None] | None = None) -> Any:
    """Wait for `job`'s value, showing its state in `progress`; JobFailed when it ends without one
    (cancelled by `cancel`, a fault, the scheduler's reason). Ctrl-C cancels the job, then propagates.
    `on_running()` is called once the scheduler runs the job (or it wrote progress), `on_queue(seconds)`
    once the job started (its queue time). A budget's deadline (an event whose `expired` is true and
    with `postpone`) that expires while the job still waits in the queue does not cancel it unless
    `queue_counts`: `on_queue` moves that deadline on by the wait. Any other set (Stop, Ctrl-C) cancels."""
    reported = ran = False
    try:
        while True:
            now = time.monotonic()
            if w.finished():
                break
            snap = w.read_progress()
            sched = w.ask(now)
            progress.set(w.phase(snap, sched), int((snap or {}).get("done", 0)), int((snap or {}).get("total", 0)))
            if not ran and (snap is not None or w.t_running is not None or not is_slurm(job)):
                ran = True
                if w.t_running is None and is_slurm(job):  # progress before squeue said RUNNING
                    w.t_running = now
                if on_running is not None:
                    on_running()
                if on_queue is not None:
                    reported = True
                    on_queue(w.queue_s or 0.0)  # a deadline moves on by the queue's wait only
            waiting_deadline = (not queue_counts and not ran and bool(getattr(cancel, "expired", False))
                                and callable(getattr(cancel, "postpone", None)))
            if cancel is not None and cancel.is_set() and not waiting_deadline:
                why = getattr(cancel, "reason", "") or "stopped by the user"
                stop_job(job)
                raise JobFailed("interrupted", f"{why}: job {w.job_id} cancelled (its process was ended)"
                                .replace("job  cancelled", "the job cancelled"))
            w.check_alive(sched, now)
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        stop_job(job)
        raise
    w.read_progress()
    if not reported and on_queue is not None:
        on_queue(w.queue_s or 0.0)
    try:
        return job.result()
    except Exception as e:  # the job's own exception, or submitit's UncompletedJobError
        raise JobFailed("error", job_error(w.job_id, e)) from e


def job_error(job_id: str, e: BaseException) -> str:
    """A job's failure in one line (its first line, and its last error line when they differ), with the
    fix when the node could not load the workload or the job hit its time limit."""
    text = str(e)
    if "ModuleNotFoundError" in text or "No module named" in text:
        return (f"job {job_id} could not load the workload on its node ({_last_line(text, 'No module named')}): the "
                "node must see the same Python environment and your modules (a shared filesystem; docs/cluster.md)")
    if "timed-out" in text or "TIMEOUT" in text:
        return (f"job {job_id} hit its time limit (submitit signals the job 90 s before timeout_min): raise the "
                "executor's timeout_min")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    head = lines[0] if lines else type(e).__name__
    last = _last_line(text, "Error")
    detail = head if last in ("", head) else f"{head} … {last}"
    return f"job {job_id} ended without a result: {detail}".replace("job  ended", "the job ended")


def _last_line(text: str, word: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    hits = [ln for ln in lines if word in ln]
    return (hits or lines or [""])[-1][:300]


def stop_job(job: Any) -> None:
    """Cancel `job` (scancel for SLURM, SIGINT for submitit's local executor), never raising."""
    try:
        if is_slurm(job):
            job.cancel(check=False)
        else:
            job.cancel()
    except Exception:  # an already finished job, or a scheduler that is gone
        pass


def failed_trial(knobs: Any, status: str, message: str, w: Watch, started: str, where: str = "process") -> TrialResult:
    """The trial of a job that ended without a result (`where`: the stage, "process" as for the seam)."""
    return TrialResult(knobs=knobs, status=status, message=message, started_at=started, where=where,
                       env={"host": w.host} if w.host else {}, extra={"job": w.info()})


def now() -> str:
    return now_iso()
