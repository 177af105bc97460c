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

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..core.measure import TrialResult, environment
from ..core.progress import TrialProgress
from ..core.workload import Workload, resolve_device
from .folders import owned_private_folder

INSTALL = 'pip install "tuning-workbench[cluster]"'
WRITE_EVERY_S = 0.5  # how often the job writes its progress file


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

    def __getstate__(self) -> dict[str, Any]:  # a result holding its budget's account pickles (no lock)
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

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
    if folder is not None:  # result pickles load from there: this user's all the way down ("logs/%j": "logs")
        owned_private_folder(folder)
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
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="workbench-progress-file", daemon=True)

    def write(self) -> None:
        """One snapshot, never raising (watcher.write_progress): a full disk or a vanished folder at the
        job's end must not throw away a result already computed."""
        from .watcher import write_progress

        write_progress(self.path, *self.progress.snapshot())

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


def new_progress_file(jobs_dir: Path) -> Path:
    """A fresh progress file path inside the private jobs folder (folders.owned_private_folder: made if
    missing, this user's all the way down, 0700)."""
    return owned_private_folder(jobs_dir) / f"progress-{uuid.uuid4().hex[:12]}.json"


from .watcher import (  # noqa: E402  (the one job watcher, re-exported: jobs.py and tests read it here)
    ASK_EVERY_S,
    POLL_S,
    RESULT_GRACE_S,
    TERMINAL,
    WHY,
    JobFailed,
    QueueWaits,
    SchedulerState,
    Watch,
    failed_trial,
    is_slurm,
    job_error,
    job_id_of,
    slurm_state,
    stop_job,
    waits_of,
    watch,
    write_progress,
)

__all__ = ["ASK_EVERY_S", "POLL_S", "RESULT_GRACE_S", "TERMINAL", "WHY", "JobFailed", "QueueWaits", "SchedulerState",
           "Watch", "failed_trial", "is_slurm", "job_error", "job_id_of", "slurm_state", "stop_job", "waits_of", "watch",
           "write_progress"]
