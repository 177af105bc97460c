"""Held jobs: several trials inside one job on a node, so each trial does not pay a job's start-up.

`held(ex)` wraps a submitit executor (or any executor of the seam, docs/cluster.md) and keeps the same
seam: `submit(fn, *args) -> task`, a task with `result()`, `done()`, `cancel()` and `job_id` (its
worker's). A submitted call goes to an idle worker job's private inbox (a folder made with
folders.owned_private_folder); when no worker is idle, a new one starts through `ex`. The worker
(`held_worker`, inside the job) imports torch once, unpickles each distinct workload once, runs one
task at a time (a trial copies its model from the workload's snapshot, as every trial does), writes
its value beside the task, and exits after `idle_s` without work, so nothing is left running.

The one watcher (watcher.watch) reads a task's progress file as any job's; a task's scheduler state is
its worker's (`scheduler_state`), so its queue wait is the worker job's wait (zero on a worker that
already runs) and its start-up is from then to its first progress. Cancelling a task ends its worker
job (scancel): a trial stopped mid-step may hold its process in any state, and a fresh worker is the
sure way back. `close()` (also at exit) stops every worker.

Opt-in, not the default for SLURM executors: a held worker keeps its allocation (a node, a GPU) up
to `idle_s` after its last trial, which a shared cluster's users pay for; the user chooses it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import time
import traceback
import uuid
import weakref
from pathlib import Path
from typing import Any

from .folders import owned_private_folder, static_prefix, write_atomic
from .watcher import BOARD, TERMINAL, SchedulerState, is_slurm, job_id_of, listed, stop_job

IDLE_S = 60.0  # a worker with no task this long exits (its job ends)
PICK_S = 0.05  # how often an idle worker looks at its inbox
NODE_WORKLOADS = 4  # unpickled workloads a worker keeps (the most recent ones)
_LOCK = threading.Lock()  # the pools' workers (every with_env view of one held executor)


class _Ref:
    """A task's workload, by the key of the file it was written to once per worker (`workload-<key>.pkl`)."""

    def __init__(self, key: str) -> None:
        self.key = key


def _dump(obj: Any) -> bytes:
    import cloudpickle

    return cloudpickle.dumps(obj)


def held_worker(inbox: str, idle_s: float = IDLE_S) -> dict[str, int]:
    """Inside the held job: run the tasks written to `inbox` one at a time until none came for `idle_s`
    seconds (or a `stop` file appears); {"tasks", "workload_loads"}. A task is claimed by renaming it
    (the notebook withdraws one the same way), its value or error written as `<task>.out`."""
    import pickle

    folder = Path(inbox)
    cache: dict[str, Any] = {}
    tasks = loads = 0
    last = time.monotonic()
    closing = False
    while True:
        pending = sorted(folder.glob("task-*.pkl"))
        if not pending:
            if closing or (folder / "stop").exists():
                break
            if time.monotonic() - last >= idle_s:
                (folder / "closed").touch()  # no task is given to this worker from now on; one more look
                closing = True
                continue
            time.sleep(PICK_S)
            continue
        task = pending[0]
        run = task.with_suffix(".run")
        try:
            os.rename(task, run)
        except OSError:  # withdrawn by the notebook
            continue
        try:  # unpickling too: a node that cannot import a module of the call says so in the task's error
            with open(run, "rb") as f:
                fn, args, kwargs = pickle.load(f)
            if args and isinstance(args[0], dict) and isinstance(args[0].get("workload"), _Ref):
                key = args[0]["workload"].key
                if key not in cache:
                    with open(folder / f"workload-{key}.pkl", "rb") as f:
                        loaded = pickle.load(f)
                    while len(cache) >= NODE_WORKLOADS:  # the oldest goes: a notebook may send many models
                        cache.pop(next(iter(cache)))
                    cache[key] = loaded
                    loads += 1
                args = ({**args[0], "workload": cache[key]}, *args[1:])
            out: Any = ("ok", fn(*args, **kwargs))
        except Exception:  # the task's own error, returned as text (the watcher's failed trial says it)
            out = ("error", traceback.format_exc())
        tasks += 1
        info = {"task": tasks, "workload_loads": loads}
        try:
            data = _dump((*out, info))
        except Exception as e:  # a value that cannot be pickled: the task fails, the worker goes on
            data = _dump(("error", f"the task's value cannot be pickled: {type(e).__name__}: {e}", info))
        write_atomic(run.with_suffix(".out"), data)
        run.unlink(missing_ok=True)
        last = time.monotonic()
    return {"tasks": tasks, "workload_loads": loads}


class _Worker:
    def __init__(self, job: Any, inbox: Path) -> None:
        self.job, self.inbox = job, inbox
        self.busy = False
        self.workloads: set[str] = set()


class HeldTask:
    """One call on a held worker: the seam's job (result, done, cancel, job_id), its scheduler state its worker's."""

    def __init__(self, pool: HeldExecutor, worker: _Worker, path: Path) -> None:
        self.pool, self.worker, self.path = pool, worker, path
        self.out = path.with_suffix(".out")
        self.paths = getattr(worker.job, "paths", None)  # the worker's stderr: slurmstepd's kill line (watcher)
        self._value: Any = None
        self._read = False
        self._listed_at = -float("inf")  # when the inbox was last listed for the value (monotonic)
        self.held_info: dict[str, int] = {}  # the worker's count: this task's number, workloads it unpickled

    @property
    def job_id(self) -> str:
        return job_id_of(self.worker.job)

    def done(self) -> bool:
        """Whether the task's value is there: its `.out` file, asked of the inbox's listing once a second
        too (a network filesystem may cache the failed lookups of the polls before it was written)."""
        if self._read or self.out.exists():
            return True
        if time.monotonic() - self._listed_at < 1.0:
            return False
        self._listed_at = time.monotonic()
        return listed(self.out)

    def scheduler_state(self) -> SchedulerState:
        """The worker job's state (SLURM: from the one batched squeue); without a scheduler, RUNNING
        until the worker's job ends, then COMPLETED (a task with no value then fails after the grace)."""
        if is_slurm(self.worker.job):
            return BOARD.state(self.job_id)
        try:
            ended = bool(self.worker.job.done())
        except Exception:  # a job that cannot say: treated as running; the watcher's grace covers the rest
            ended = False
        return SchedulerState("COMPLETED" if ended else "RUNNING")

    def result(self) -> Any:
        import pickle

        if not self._read:
            with open(self.out, "rb") as f:
                kind, value, self.held_info = pickle.load(f)
            self._value, self._read = (kind, value), True
            self.out.unlink(missing_ok=True)
            self.pool._released(self.worker)
        kind, value = self._value
        if kind == "error":
            raise RuntimeError(value)
        return value

    def cancel(self, check: bool = False) -> bool:
        """End the task by ending its worker's job (scancel for SLURM)."""
        self.pool._drop(self.worker)
        return True


class HeldExecutor:
    """An executor of the seam whose calls run on held worker jobs started through `executor` (`held`)."""

    def __init__(self, executor: Any, idle_s: float = IDLE_S, *, _pool: dict[str, list[_Worker]] | None = None,
                 _key: str = "", _root: Path | None = None,
                 _workloads: dict[int, tuple[str, weakref.ref]] | None = None) -> None:
        if not callable(getattr(executor, "submit", None)):
            raise TypeError(f"held(executor): executor must have submit(fn, *args), got {type(executor).__name__}")
        if not idle_s > 0:
            raise ValueError(f"held(executor, idle_s=...) must be > 0 seconds, got {idle_s!r}")
        self.executor, self.idle_s = executor, float(idle_s)
        self.folder = getattr(executor, "folder", None)  # cluster.check_executor checks it as the executor's
        self._pool = _pool if _pool is not None else {}
        self._workloads: dict[int, tuple[str, weakref.ref]] = _workloads if _workloads is not None else {}
        self._key = _key
        base = static_prefix(self.folder) if self.folder is not None else Path.home() / ".cache" / "workbench"
        self._root = _root or owned_private_folder(base / "held")  # the nodes see it where they see the job folder
        if _pool is None:
            ref = weakref.ref(self)
            atexit.register(lambda: (lambda s: s.close() if s is not None else None)(ref()))

    def with_env(self, env: dict[str, str | None]) -> HeldExecutor:
        """Workers whose process starts with `env` (remote.executor_for): a pool of their own."""
        from .remote import executor_for

        key = repr(sorted(env.items()))
        return HeldExecutor(executor_for(self.executor, env), self.idle_s, _pool=self._pool, _key=key,
                            _root=self._root, _workloads=self._workloads)

    def workers(self) -> list[Any]:
        """The worker jobs this executor started that it still holds."""
        return [w.job for ws in self._pool.values() for w in ws]

    def submit(self, fn: Any, *args: Any, **kwargs: Any) -> HeldTask:
        """Write the call to an idle worker's inbox (starting a worker job when none is idle)."""
        for _ in range(3):  # a worker that closed as the task arrived: withdraw it, try the next
            worker = self._idle() or self._start()
            try:
                task = self._give(worker, fn, args, kwargs)
            except BaseException:  # the call cannot be written (pickling): the worker stays free for the next
                self._released(worker)
                raise
            if task is not None:
                return task
            self._forget(worker)
        raise RuntimeError("held(executor): three workers closed as a task arrived; raise idle_s")

    def _give(self, worker: _Worker, fn: Any, args: tuple, kwargs: dict[str, Any]) -> HeldTask | None:
        """Write the call into `worker`'s inbox: its task, or None when the worker closed first (withdrawn)."""
        args_ = args
        if args and isinstance(args[0], dict) and "workload" in args[0]:
            key = self._key_of(args[0]["workload"])
            if key not in worker.workloads:  # pickled inside the caller's by_value: its modules travel too
                write_atomic(worker.inbox / f"workload-{key}.pkl", _dump(args[0]["workload"]))
                worker.workloads.add(key)
            args_ = ({**args[0], "workload": _Ref(key)}, *args[1:])
        path = worker.inbox / f"task-{time.time_ns()}-{uuid.uuid4().hex[:6]}.pkl"
        write_atomic(path, _dump((fn, args_, kwargs)))
        if not (worker.inbox / "closed").exists():
            return HeldTask(self, worker, path)
        try:
            os.rename(path, path.with_suffix(".withdrawn"))
        except OSError:  # the worker claimed it in its last look: it runs it
            return HeldTask(self, worker, path)
        return None

    def _key_of(self, workload: Any) -> str:
        """The workload's key: one per live workload object, as a local trial uses the same object for every
        trial. Held by a weak reference: the executor never keeps a model the notebook has let go."""
        with _LOCK:
            for gone in [i for i, (_k, ref) in self._workloads.items() if ref() is None]:
                del self._workloads[gone]
            hit = self._workloads.get(id(workload))
            if hit is None or hit[1]() is not workload:  # new, or another object at a dead one's address
                try:
                    ref = weakref.ref(workload)
                except TypeError:  # an object without weak references: a key of its own each time
                    return uuid.uuid4().hex[:16]
                hit = self._workloads[id(workload)] = (uuid.uuid4().hex[:16], ref)
            return hit[0]

    def _idle(self) -> _Worker | None:
        """A free worker of this pool, claimed; None when none is. The scheduler is asked whether a worker
        still runs outside the module's lock (squeue may take its 10 s timeout), so no submit waits on it."""
        with _LOCK:
            free = [w for w in self._pool.get(self._key, []) if not w.busy]
        for w in free:
            if (w.inbox / "closed").exists() or _ended(w.job):
                self._forget(w)
                continue
            with _LOCK:
                if not w.busy and w in self._pool.get(self._key, []):
                    w.busy = True
                    return w
        return None

    def _start(self) -> _Worker:
        inbox = owned_private_folder(self._root / f"worker-{uuid.uuid4().hex[:12]}")
        job = self.executor.submit(held_worker, str(inbox), self.idle_s)
        w = _Worker(job, inbox)
        w.busy = True
        with _LOCK:
            self._pool.setdefault(self._key, []).append(w)
        if is_slurm(job):  # on the one batched squeue while held: every task's state comes from one query
            BOARD.add(job_id_of(job))
        return w

    def _released(self, worker: _Worker) -> None:
        worker.busy = False

    def _forget(self, worker: _Worker) -> None:
        """No task goes to `worker` from now on (it closed, ended or was stopped); off the squeue board."""
        held_ = False
        with _LOCK:
            for ws in self._pool.values():
                if worker in ws:
                    ws.remove(worker)
                    held_ = True
        if held_ and is_slurm(worker.job):
            BOARD.remove(job_id_of(worker.job))

    def _drop(self, worker: _Worker) -> str:
        self._forget(worker)
        with contextlib.suppress(OSError):
            (worker.inbox / "stop").touch()
        return stop_job(worker.job)

    def close(self) -> None:
        """Stop every held worker (scancel for SLURM): nothing is left running."""
        for ws in list(self._pool.values()):
            for w in list(ws):
                self._drop(w)


def _ended(job: Any) -> bool:
    if is_slurm(job):
        state = BOARD.state(job_id_of(job))
        return state.answered and (not state.known or state.state in TERMINAL or state.state == "COMPLETING")
    try:
        return bool(job.done())
    except Exception:  # a job that cannot say: not given new tasks
        return True


def held(executor: Any, idle_s: float = IDLE_S) -> HeldExecutor:
    """`executor` with held jobs: each worker job runs trial after trial (torch imported, the workload
    unpickled once per worker) and exits after `idle_s` seconds without one. Use it as the executor:
    `Workbench(..., executor=held(submitit.AutoExecutor(folder, cluster="slurm")))`."""
    return HeldExecutor(executor, idle_s)
