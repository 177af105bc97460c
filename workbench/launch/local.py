"""The worker process: where one workbench's trials, interleaved turns and analyses run.

Why a process of its own. torch's CPU ops run in OpenMP parallel regions, and torch's Linux wheel
ships GNU OpenMP (libgomp), which gives every host thread that enters a parallel region a team of
worker threads of its own. Once two teams exist in one process (the notebook's main thread and a
panel or analysis thread, say), libgomp manages more threads than there are CPUs and stops letting
idle workers spin: every parallel region then pays a wake-up, and a model of small ops runs at about
half speed for the rest of the process's life (docs/measurement.md, "Where a trial runs"). A plain
script has one team. So a trial measured in the kernel reads what the kernel did before, while the
user's script reads something else.

The worker is a fresh Python process per workbench (pyperf's design): started once (in the background,
when the workbench is made; in a rank of a distributed run, at the first trial), the workload sent once,
then each call is a message. It runs every call on its main thread, one at a time, so it holds one
OpenMP team, as a script does. The kernel's own torch work (a cell's forward pass, another workbench's
trials) cannot reach its figures.

How it talks: two pipes (`multiprocessing.connection.Connection`, length-framed bytes), cloudpickle
payloads. To the worker: ("workload", key, blob) once per workload, ("call", id, blob), ("stop", id),
("exit",). From it: ("ready", info), ("loaded", key, seconds), ("done", id, blob). Progress goes
through the job seam's progress file (remote.trial_job), read by the one watcher (watcher.watch), as
for every executor: a `LocalWorker` is an executor of the seam (`submit(fn, *args) -> job`).

What can go wrong stays one trial's: a crash, an OOM kill or an exception in the user's code ends that
call with a status and a message (the worker's last output included); the next call starts a new
worker. A stop (the panel's Stop, Ctrl-C, a budget's deadline) asks the running call to stop at its
next step; a call that does not stop within STOP_GRACE_S ends its worker. The worker ends with the
kernel (fresh.py's watchdog on the caller's pid) and when the workbench is garbage-collected.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ..core.measure import RAN_IN_ENV as PROCESS_ENV  # "worker" inside a worker process (measure.ran_in)
from .workerside import Ref

TRIALS_ENV = "WORKBENCH_TRIALS"  # "kernel": trials run in the calling process (what Workbench(trials_in=) defaults to)
TRIALS_IN = ("worker", "kernel")
STOP_GRACE_S = 10.0  # a stopped call that has not ended by then ends its worker (a fresh one starts next time)
READY_TIMEOUT_S = 120.0  # a worker that has not imported torch by then is ended, saying so
LOG = "worker.log"  # the worker's stdout and stderr (its last lines go into a failed call's message)

def default_trials_in() -> str:
    """Where trials run when a workbench does not say: WORKBENCH_TRIALS, else "worker"."""
    value = os.environ.get(TRIALS_ENV, "").strip().lower() or "worker"
    return value if value in TRIALS_IN else "worker"


def check_trials_in(value: str | None) -> str:
    """`Workbench(trials_in=...)`: "worker" (a process of the workbench's own), "kernel" (this process) or
    None (the default: WORKBENCH_TRIALS, else "worker"). ValueError naming the choices."""
    if value is None:
        return default_trials_in()
    if value not in TRIALS_IN:
        raise ValueError(f"trials_in={value!r}: choose 'worker' (each trial in a process of the workbench's own, "
                         "as a plain script runs) or 'kernel' (in this process)")
    return value


_LIVE: weakref.WeakSet = weakref.WeakSet()  # every LocalWorker of this process (close_all)


def close_all() -> int:
    """Close every worker this process started (each workbench's, and their with_env ones); how many ran.
    A test suite calls it after a test, so no worker outlives the test that made it."""
    ran = [w for w in list(_LIVE) if w.alive()]
    for w in list(_LIVE):
        w.close()
    return len(ran)


class WorkerDied(RuntimeError):
    """The worker process ended while a call ran or waited (crashed, killed, out of memory)."""


class LocalTask:
    """One call on the worker: the seam's job (`done()`, `result()`, `cancel()`, `job_id`, `state`)."""

    def __init__(self, worker: LocalWorker, tid: int) -> None:
        self.worker, self.tid = worker, tid
        self.pid: int | None = None
        self._event = threading.Event()
        self._outcome: tuple | None = None
        self.cancelled = False

    @property
    def job_id(self) -> str:
        return f"worker {self.pid}" if self.pid else "worker"

    @property
    def state(self) -> str:
        if not self._event.is_set():
            return "RUNNING"
        if self.cancelled:
            return "CANCELLED"
        return "COMPLETED" if self._outcome and self._outcome[0] == "ok" else "FAILED"

    def done(self) -> bool:
        return self._event.is_set()

    def _finish(self, outcome: tuple) -> None:
        if not self._event.is_set():
            self._outcome = outcome
            self._event.set()

    def result(self, timeout: float | None = None) -> Any:
        """The call's value (waits for it); WorkerDied when the worker ended first, RuntimeError with the
        call's own traceback text when it raised."""
        if not self._event.wait(timeout):
            raise TimeoutError(f"the worker's call still runs after {timeout} s")
        assert self._outcome is not None
        kind, value = self._outcome[0], self._outcome[1]
        if kind == "ok":
            return value
        if kind == "died":
            raise WorkerDied(value)
        raise RuntimeError(value)

    def cancel(self) -> bool:
        """Ask the call to stop at its next step; its worker is ended if it has not stopped in STOP_GRACE_S."""
        self.cancelled = True
        if not self._event.is_set():
            self.worker._stop(self)
        return True

    def __repr__(self) -> str:
        return f"<LocalTask {self.tid} {self.state} on {self.job_id}>"


class LocalWorker:
    """A workbench's worker process (see the module's doc), an executor of the job seam.

    `env` is what its process starts with on top of this one's (None unsets a variable): the
    `allocator` knob's trials get a worker of their own through `with_env`. `start()` begins its start-up
    without waiting (a workbench calls it when made, or at its first trial in a rank); the first call waits for it.
    """

    ran_in = "worker"  # a trial's `ran_in`, also when it failed before the worker said so (remote.run_elsewhere)
    deferred = False  # made but not started: in a distributed rank, the first trial starts it (start_deferred)

    def __init__(self, env: Mapping[str, str | None] | None = None, *, python: str | None = None,
                 _pool: dict[str, LocalWorker] | None = None) -> None:
        self.env = dict(env or {})
        self.python = python or sys.executable
        self.folder: Path | None = None  # the private folder: the worker's log, progress files
        self._proc: subprocess.Popen | None = None
        self._out: queue.Queue | None = None  # bytes to the worker, written by its sender thread
        self._lock = threading.RLock()  # start, send, the task table
        self._tasks: dict[int, LocalTask] = {}
        self._ids = itertools.count(1)
        self._loaded: dict[int, tuple[str, Any]] = {}  # id(workload) -> (key, weakref to it)
        self._ready = threading.Event()
        self._pool = _pool if _pool is not None else {}
        self._owns_pool = _pool is None  # made by with_env: another worker's pool, not its own
        self.startups: list[dict[str, Any]] = []  # each start: spawn to ready, torch's import, workloads loaded
        self.reported = 0  # how many of `startups` a workbench has said
        _LIVE.add(self)
        if _pool is None:
            ref = weakref.ref(self)
            atexit.register(lambda: (lambda w: w.close() if w is not None else None)(ref()))

    # ---- the process ---------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        """Start the worker process unless it runs; returns at once (it imports torch in the background)."""
        with self._lock:
            if self.alive():
                return
            self._reset()
            if self.folder is None or not self.folder.is_dir():
                self.folder = Path(tempfile.mkdtemp(prefix="workbench-worker-"))  # mode 0700
            to_r, to_w = os.pipe()
            from_r, from_w = os.pipe()
            from .fresh import child_env
            from .owners import owner

            # the kernel's import path too (a notebook's sys.path.insert): what it imports, the worker imports
            paths = [p for p in sys.path if p and isinstance(p, str) and os.path.isdir(p)]
            env = child_env({PROCESS_ENV: "worker", TRIALS_ENV: "kernel", **self.env}, paths)

            started = owner()["started"]  # the kernel's start time: a reused pid is not the kernel
            argv = [self.python, "-m", "workbench.launch.workerside", str(to_r), str(from_w), str(os.getpid()),
                    str(self.folder), "-" if started is None else repr(started)]
            t0 = time.monotonic()
            try:
                with open(self.folder / LOG, "ab") as log:
                    self._proc = subprocess.Popen(argv, env=env, pass_fds=(to_r, from_w), stdin=subprocess.DEVNULL,
                                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            finally:
                os.close(to_r)
                os.close(from_w)
            self._out = queue.Queue()  # what the sender thread writes: a big workload never blocks the caller
            threading.Thread(target=_send_loop, args=(Connection(to_w, readable=False), self._out),
                             name="workbench-worker-sender", daemon=True).start()
            self._ready.clear()
            info: dict[str, Any] = {"pid": self._proc.pid, "started": t0, "loads": []}
            self.startups.append(info)
            threading.Thread(target=self._read, args=(Connection(from_r, writable=False), self._proc, info),
                             name="workbench-worker-reader", daemon=True).start()

    def _reset(self) -> None:
        self._loaded.clear()
        if self._out is not None:
            self._out.put(None)  # the sender thread ends (and closes its pipe)
        self._out = None

    def _send(self, msg: tuple) -> None:
        """Queue `msg` for the sender thread (in order); WorkerDied when no worker runs."""
        import pickle

        with self._lock:
            if self._out is None:
                raise WorkerDied("the worker process is not running")
            self._out.put(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))

    def _read(self, conn: Connection, proc: subprocess.Popen, info: dict[str, Any]) -> None:
        """The kernel's reader thread: the worker's messages to their tasks; at EOF, fail what is left."""
        import pickle

        import cloudpickle

        try:
            while True:
                msg = pickle.loads(conn.recv_bytes())
                kind = msg[0]
                if kind == "ready":
                    info.update(msg[1], ready_s=time.monotonic() - info["started"])
                    self._ready.set()
                elif kind == "loaded":
                    info["loads"].append({"key": msg[1], "load_s": msg[2], "bytes": msg[3]})
                elif kind == "done":
                    with self._lock:
                        task = self._tasks.pop(msg[1], None)
                    if task is not None:
                        try:
                            task._finish(cloudpickle.loads(msg[2]))
                        except Exception as e:  # a value this process cannot unpickle
                            task._finish(("error", f"the worker's result cannot be read here: {type(e).__name__}: {e}"))
        except (EOFError, OSError):
            pass
        finally:
            conn.close()
            code = _wait(proc)
            why = f"the worker process {_exit_words(code)}"
            tail = self.log_tail()
            with self._lock:
                tasks = [t for t in self._tasks.values() if t.pid == proc.pid]
                for t in tasks:
                    self._tasks.pop(t.tid, None)
                if self._proc is proc:
                    self._reset()
            for t in tasks:
                t._finish(("died", f"{why}{f'; its last output: {tail}' if tail else ''}"))
            self._ready.set()  # a caller waiting for start-up sees the death at once

    def log_tail(self, lines: int = 6) -> str:
        """The worker's last printed lines (its stdout and stderr), for a failure's message."""
        try:
            text = (self.folder / LOG).read_text(errors="replace").strip().splitlines() if self.folder else []
        except OSError:
            return ""
        return " | ".join(text[-lines:])

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> dict[str, Any]:
        """Wait for the worker's start-up (torch imported there); its start-up record. WorkerDied when it
        ends first or does not get ready in `timeout` seconds (then it is ended)."""
        self.start()
        if not self._ready.wait(timeout):
            self.kill()
            raise WorkerDied(f"the worker process did not start in {timeout:.0f} s; its last output: {self.log_tail()}")
        if not self.alive():
            raise WorkerDied(f"the worker process {_exit_words(self._proc.returncode if self._proc else None)} while "
                             f"starting; its last output: {self.log_tail()}")
        return self.startups[-1]

    # ---- calls ------------------------------------------------------------------------------------
    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> LocalTask:
        """Send `fn(*args, **kwargs)` to the worker (starting it when it does not run); its task.

        A Workload among the arguments (or in a first-argument dict, as remote.trial_job's payload) is sent
        once per worker and named by key after that. Pickling errors propagate (nothing is sent)."""
        import cloudpickle

        from ..core.workload import Workload

        self.wait_ready()
        with self._lock:

            def ref(value: Any) -> Any:
                return self._ref(value) if isinstance(value, Workload) else value

            args = tuple(ref(a) for a in args)
            if args and isinstance(args[0], dict):
                args = ({k: ref(v) for k, v in args[0].items()}, *args[1:])
            blob = cloudpickle.dumps((fn, args, kwargs))
            task = LocalTask(self, next(self._ids))
            task.pid = self.pid
            self._tasks[task.tid] = task
            try:
                self._send(("call", task.tid, blob))
            except WorkerDied:
                self._tasks.pop(task.tid, None)
                raise
        return task

    def _ref(self, workload: Any) -> Ref:
        """The workload's key in this worker, sending it the first time (pickled here, under remote.by_value)."""
        import cloudpickle

        hit = self._loaded.get(id(workload))
        if hit is not None and hit[1]() is workload:
            return Ref(hit[0])
        key = f"w{len(self._loaded) + 1}-{id(workload):x}"
        from .remote import by_value

        with by_value(workload):
            blob = cloudpickle.dumps(workload)
        self._send(("workload", key, blob))
        self._loaded[id(workload)] = (key, weakref.ref(workload))
        return Ref(key)

    def preload(self, workload: Any) -> None:
        """Start the worker and send it `workload` now, so the first trial pays neither (a workbench calls it
        when made). Raises what pickling raises: the workload cannot leave this process."""
        self.start()
        with self._lock:
            self._ref(workload)

    def _stop(self, task: LocalTask) -> None:
        with contextlib.suppress(WorkerDied):
            self._send(("stop", task.tid))
        proc = self._proc

        def end_if_stuck() -> None:
            if not task._event.wait(STOP_GRACE_S) and self._proc is proc:
                self.kill()

        threading.Thread(target=end_if_stuck, name="workbench-worker-stop", daemon=True).start()

    def cancel_all(self) -> None:
        """Stop every call in flight (Ctrl-C in tune(parallel=N): race._halt)."""
        with self._lock:
            tasks = list(self._tasks.values())
        for t in tasks:
            t.cancel()

    def resume(self) -> None:
        """After `cancel_all`: nothing to undo (each call is stopped on its own)."""

    def with_env(self, env: Mapping[str, str | None]) -> LocalWorker:
        """A worker whose process starts with `env` too (a process knob's, remote.executor_for): one per env."""
        merged = {**self.env, **env}
        key = repr(sorted(merged.items()))
        with self._lock:
            w = self._pool.get(key)
            if w is None:
                w = self._pool[key] = LocalWorker(merged, python=self.python, _pool=self._pool)
        return w

    # ---- the workbench's three seams: a trial, a call (an analysis), a call with where it ran ----------
    def run_trial(self, workload: Any, knobs: Any, *, progress: Any = None, cancel: threading.Event | None = None,
                  **run: Any) -> Any:
        """runner.run_trial's signature, run in the worker: the same phases on its main thread."""
        from .runner import run_trial

        started = len(self.startups)
        result = run_trial(workload, knobs, progress=progress, cancel=cancel, executor=self, **run)
        if self.reported < started and self.startups[started - 1].get("ready_s") is not None:
            self.reported = started  # a start-up is said once, apart from the trial's own figures
            info = self.startups[started - 1]
            result.extra["worker_startup"] = {"pid": info.get("pid"), "ready_s": info.get("ready_s"),
                                              "loads": list(info.get("loads", [])), "text": startup_text(info)}
        return result

    def call(self, fn: Callable[..., Any], workload: Any, *args: Any, **kwargs: Any) -> Any:
        """`fn(workload, *args, **kwargs)` (an analysis, runner.trial_threaded) in the worker; its value.
        RuntimeError naming the analysis when the worker ends without one."""
        from .watcher import JobFailed

        try:
            return self.call_where(fn, workload, *args, **kwargs)[0]
        except JobFailed as e:
            raise RuntimeError(f"{getattr(fn, '__name__', 'analysis')}: {e.message}") from None

    def call_where(self, fn: Callable[..., Any], workload: Any, *args: Any, cancel: threading.Event | None = None,
                   **kwargs: Any) -> tuple[Any, dict[str, Any], dict[str, Any]]:
        """`fn(workload, *args, **kwargs)` in the worker: (its value, the worker's environment, {"id", "where"}).
        watcher.JobFailed when the worker ends without a value or `cancel` is set."""
        from ..core.progress import TrialProgress
        from .cluster import job_call
        from .watcher import JobFailed, Watch, watch

        self.start()
        folder = Path(tempfile.mkdtemp(prefix="call-", dir=self.folder))
        pf = folder / "progress.json"
        w = Watch(None, pf, time.monotonic())
        try:
            try:
                w.job = self.submit(job_call, fn, workload, None, args, kwargs, str(pf))
            except WorkerDied as e:
                raise JobFailed("error", str(e)) from None
            value, env = watch(w.job, w, TrialProgress(), cancel)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return value, env, {"id": w.job.job_id, "where": "worker"}

    # ---- the end ------------------------------------------------------------------------------------
    def kill(self) -> None:
        """End the worker's process group now (its DataLoader and compile workers too); its calls fail."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            _wait(proc)

    def close(self) -> None:
        """Ask the worker (and every with_env worker) to exit, end it if it does not within 2 s; remove its folder."""
        if self._owns_pool:  # its with_env workers close with it; one of them closes alone, leaving the pool
            others = list(self._pool.values())
            self._pool.clear()
            for w in others:
                w.close()
        else:
            for key in [k for k, w in list(self._pool.items()) if w is self]:
                self._pool.pop(key, None)
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(WorkerDied):
                self._send(("exit",))
            try:
                proc.wait(2.0)
            except subprocess.TimeoutExpired:
                self.kill()
        self._reset()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.alive() else "not running"
        return f"LocalWorker({state})"


def worker_of(owner: Any, workload: Any, trials_in: str | None, executor: Any) -> tuple[str, LocalWorker | None, str]:
    """For `Workbench(trials_in=..., executor=...)`: (where its trials run, its worker, why not in one). Without an
    executor and unless "kernel" is asked, a worker is started now and sent the workload (the first trial waits for
    less), and closed with `owner`; a workload that cannot be pickled runs in this process, saying why. In a rank of
    a distributed run (in_rank) the worker is made but left for the first trial that needs it (start_deferred)."""
    trials_in = check_trials_in(trials_in)
    if executor is not None or trials_in == "kernel":
        return trials_in, None, ""
    if in_rank():
        worker: LocalWorker | None = routed(workload, LocalWorker())
        worker.deferred = True
    else:
        worker, why = worker_for(workload)
        if worker is None:
            return "kernel", None, why
    weakref.finalize(owner, worker.close)
    return "worker", worker, ""


def in_rank() -> bool:
    """Whether this process is one rank of a distributed run: torchrun's environment (LOCAL_RANK,
    TORCHELASTIC_RUN_ID, WORLD_SIZE > 1) or an initialized process group. A workbench made there mostly records
    the real run (wb.TrainerCallback, the Lightning callback): a worker started with it would be one idle
    process per rank, the model and data pickled on every rank, and two threads in the run."""
    env = os.environ
    if "LOCAL_RANK" in env or "TORCHELASTIC_RUN_ID" in env or env.get("WORLD_SIZE", "1").strip() not in ("", "0", "1"):
        return True
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def start_deferred(worker: LocalWorker, workload: Any) -> tuple[str, LocalWorker | None, str]:
    """A worker that worker_of left for the first trial (`worker.deferred`), started and sent `workload` now: (where
    trials run from now on, the worker or None, why not in it), as worker_of says them for a started one."""
    worker.deferred = False
    started, why = worker_for(workload, worker)
    return ("worker" if started is not None else "kernel"), started, why


def worker_for(workload: Any, worker: LocalWorker | None = None) -> tuple[LocalWorker | None, str]:
    """A started worker (`worker`, or a new one) already sent `workload` (the workbench's: `Workbench(trials_in=
    "worker")`), and ""; or (None, why its trials stay in this process) when the workload cannot be pickled."""
    worker = LocalWorker() if worker is None else worker
    try:
        worker.preload(workload)
    except Exception as e:  # pickling: a generator, an open file, a lock in the data or the model
        worker.close()
        from .runner import ROUTES

        if ROUTES.get(workload) is worker:
            del ROUTES[workload]
        return None, (f"trials run in this kernel, not in a worker process: the workload cannot be sent to one "
                      f"({type(e).__name__}: {str(e).strip()[:200]}). A figure measured here can depend on what "
                      "this kernel ran before (other threads' torch work); make the data and the model picklable "
                      "(cloudpickle) to measure as a fresh script would")
    return routed(workload, worker), ""


def routed(workload: Any, worker: LocalWorker | None) -> LocalWorker | None:
    """`worker`, made the route of `workload`'s analyses (runner.ROUTES: diagnose's, the tuner's halt)."""
    if worker is not None:
        from .runner import ROUTES

        ROUTES[workload] = worker
    return worker


def _send_loop(conn: Connection, out: queue.Queue) -> None:
    """The kernel's sender thread: writes queued messages to the worker until None (or the pipe breaks:
    the reader thread then fails what was in flight)."""
    try:
        while (data := out.get()) is not None:
            conn.send_bytes(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            conn.close()


def _wait(proc: subprocess.Popen) -> int | None:
    try:
        return proc.wait(5.0)
    except subprocess.TimeoutExpired:
        return None


def _exit_words(code: int | None) -> str:
    from .ranks import exit_text

    if code is None:
        return "did not end"
    text = exit_text(code)
    if code == -signal.SIGKILL:
        text += " (out of memory? the kernel's OOM killer sends it; or its stop did not take)"
    return f"was {text}" if code < 0 else text


def startup_text(info: Mapping[str, Any]) -> str:
    """One start-up record in words: "worker process 1234 ready in 2.1 s (Python and torch 1.9 s; your
    workload 0.2 s, 3.4 MB)"."""
    loads = info.get("loads") or []
    load_s = sum(x.get("load_s", 0.0) for x in loads)
    size = sum(x.get("bytes", 0) for x in loads)
    ready = info.get("ready_s")
    head = f"worker process {info.get('pid', '?')}"
    if ready is None:
        return f"{head} starting"
    parts = f"Python, torch and the workbench {ready:.1f} s"
    if loads:
        parts += f"; your workload {load_s:.1f} s, {size / 1e6:.1f} MB"
    return f"{head} ready in {ready + load_s:.1f} s ({parts})"


def started_text(startup: Mapping[str, Any] | None) -> str | None:
    """What a workbench says once when a trial brought its worker's start-up (`extra["worker_startup"]`)."""
    if not startup:
        return None
    return (f"Trials run in this workbench's {startup.get('text', 'worker process')}, apart from the kernel: "
            "its start-up is not part of any trial's figure.")
