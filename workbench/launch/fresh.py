"""FreshProcess: the local executor. Each job runs in a new Python process started for it.

An executor is any object with `submit(fn, *args, **kwargs) -> job`, where the job has `result()`,
`done()` and `cancel()` (and optionally `job_id` and `state`): submitit's executors are one, this is
the local one. A trial whose process must start differently (the `allocator` knob: `LD_PRELOAD`,
`MALLOC_*`, read by the C library only at start-up) runs through it, and so can any trial:
`Workbench(..., executor=wb.FreshProcess())`.

How a job travels: `submit` writes the call `(fn, args, kwargs)` with cloudpickle into a private job
folder (mode 0700, under the temp dir), then starts `python -m workbench.launch.fresh FOLDER` with the
executor's environment. The job loads only what was written there, runs the call and writes its
outcome back into the folder; `result()` reads it. `cancel()` ends the job's whole process group
(its DataLoader workers too). Nothing in the caller's process changes.

The job's folder is one only this user could have written (folders.py: private, and every folder above
it this user's or root's, not writable by others), since its outcome is a pickle. The job ends with the
caller: a watchdog thread in the job watches the caller's process (its pid and start time, by the one
rule of owners.py; a process, not a thread: a caller's trial thread may end first), and when it is gone
(a kernel killed, crashed or restarted) it removes the job folder and kills the job's process group
within PARENT_POLL_S, so no training process is left beside the next kernel's trials.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .folders import check_parents, owned_private_folder, write_atomic
from .owners import owner, process_alive
from .ranks import exit_text

CALL = "call.pkl"  # (fn, args, kwargs), cloudpickled by the caller
OUTCOME = "outcome.pkl"  # ("ok", value) or ("error", text, traceback), written by the job
PATH = "sys_path.json"  # the caller's import path, so the job imports what the caller imports
LOG = "job.log"  # the job's stdout and stderr
KILL_GRACE_S = 2.0
PARENT_POLL_S = 0.5  # how often the job looks whether its caller still lives


class FreshProcessError(RuntimeError):
    """The job's process ended without an outcome (killed, crashed), or its call raised."""


def package_root() -> str:
    """The folder holding this `workbench` package (the job must import the same one)."""
    return str(Path(__file__).resolve().parents[2])


def child_env(changes: Mapping[str, str | None], paths: list[str] | None = None) -> dict[str, str]:
    """This process's environment with `changes` (None unsets a variable), and a PYTHONPATH that imports
    this `workbench` package first, then `paths` (the caller's import path), then what it already held."""
    env = {**os.environ}
    for k, v in changes.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    env["PYTHONPATH"] = os.pathsep.join([package_root(), *(paths or []), *filter(None, [env.get("PYTHONPATH")])])
    return env


class FreshJob:
    """One job running in its own process: `done()`, `result()`, `cancel()`, `job_id`, `state`."""

    def __init__(self, folder: Path, proc: subprocess.Popen, *, keep: bool = False) -> None:
        self.folder = folder
        self.proc = proc
        self.keep = keep
        self.cancelled = False
        self._outcome: tuple | None = None

    @property
    def job_id(self) -> str:
        return str(self.proc.pid)

    @property
    def state(self) -> str:
        """RUNNING, COMPLETED, FAILED or CANCELLED (submitit's words)."""
        code = self.proc.poll()
        if code is None:
            return "RUNNING"
        if self.cancelled:
            return "CANCELLED"
        return "COMPLETED" if code == 0 else "FAILED"

    def done(self) -> bool:
        return self.proc.poll() is not None

    def cancel(self) -> None:
        """End the job's process group: SIGTERM, then SIGKILL after KILL_GRACE_S; reaped, no orphans."""
        self.cancelled = True
        if self.proc.poll() is None:
            _signal_group(self.proc, signal.SIGTERM)
            try:
                self.proc.wait(KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                _signal_group(self.proc, signal.SIGKILL)
                self.proc.wait()
        self._cleanup()

    def result(self, timeout: float | None = None) -> Any:
        """The call's return value (waits for it); raises FreshProcessError when the process died
        or the call raised (the job's exception text and traceback are in the message)."""
        if self._outcome is None:
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                raise TimeoutError(f"job {self.job_id} still runs after {timeout} s") from None
            self._outcome = self._read()
            self._cleanup()
        if self._outcome[0] == "ok":
            return self._outcome[1]
        raise FreshProcessError(self._outcome[1])

    def _read(self) -> tuple:
        code = self.proc.returncode
        try:
            import cloudpickle

            with open(self.folder / OUTCOME, "rb") as f:
                outcome = cloudpickle.load(f)
        except (OSError, EOFError, ImportError, Exception) as e:  # no outcome: the process died on its way
            if self.cancelled:
                return ("error", "cancelled", "")
            tail = self.log_tail()
            why = _exit_text(code)
            detail = f"; its last output: {tail}" if tail else ""
            return ("error", f"the fresh process {why} without a result ({type(e).__name__}){detail}", "")
        if outcome[0] != "ok":
            text, tb = outcome[1], outcome[2] if len(outcome) > 2 else ""
            return ("error", f"{text}\n{tb}".strip(), tb)
        return outcome

    def log_tail(self, lines: int = 6) -> str:
        """The last lines the job printed (stdout and stderr), for a failure's message."""
        try:
            text = (self.folder / LOG).read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(text[-lines:])

    def _cleanup(self) -> None:
        if not self.keep:
            shutil.rmtree(self.folder, ignore_errors=True)

    def __repr__(self) -> str:
        return f"<FreshJob {self.job_id} {self.state} in {self.folder}>"


class FreshProcess:
    """The local executor: every `submit` runs in a new Python process (`sys.executable`).

    `env` is what the job's process starts with on top of this process's environment: a value of
    None removes that variable (a glibc trial must not inherit a notebook's `LD_PRELOAD`). `folder`
    holds the private job folders (default: the temp dir); `keep=True` leaves them for inspection.
    """

    def __init__(self, env: Mapping[str, str | None] | None = None, *, folder: str | os.PathLike | None = None,
                 python: str | None = None, keep: bool = False) -> None:
        env = dict(env or {})
        for k, v in env.items():
            if not isinstance(k, str) or not (v is None or isinstance(v, str)):
                raise TypeError(f"env maps variable names to strings (or None to unset), got {k!r}: {v!r}")
        self.env = env
        self.folder = Path(folder) if folder is not None else None
        self.python = python or sys.executable
        self.keep = keep

    def with_env(self, env: Mapping[str, str | None]) -> FreshProcess:
        """The same executor with more variables (a process knob's: the allocator's LD_PRELOAD)."""
        return FreshProcess({**self.env, **env}, folder=self.folder, python=self.python, keep=self.keep)

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> FreshJob:
        """Write the call into a new private job folder and start its process; the job handle.

        Raises OSError when the process cannot start (a missing interpreter) and pickling errors when
        the call cannot travel by value; the folder is removed then.
        """
        import cloudpickle

        if self.folder is not None:
            owned_private_folder(self.folder)  # ValueError naming the folder when others could write there
        folder = Path(tempfile.mkdtemp(prefix="workbench-job-", dir=self.folder))  # mode 0700
        try:
            check_parents(folder)  # the temp dir's folders too: the outcome is a pickle
            with open(folder / CALL, "wb") as f:
                cloudpickle.dump((fn, args, kwargs), f)
            (folder / PATH).write_text(json.dumps([p for p in sys.path if isinstance(p, str)]))
            env = child_env(self.env)
            with open(folder / LOG, "wb") as log:
                started = owner()["started"]  # the caller's start time: a reused pid is not the caller
                proc = subprocess.Popen([self.python, "-m", "workbench.launch.fresh", str(folder), str(os.getpid()),
                                         "-" if started is None else repr(started)],
                                        env=env,
                                        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True)  # its own group: cancel ends its workers too
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        return FreshJob(folder, proc, keep=self.keep)

    def __repr__(self) -> str:
        env = " ".join(f"{k}={v}" if v is not None else f"-{k}" for k, v in self.env.items())
        return f"FreshProcess({env})" if env else "FreshProcess()"


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)  # the job's session: its DataLoader workers and compile workers too


def _exit_text(code: int | None) -> str:
    """How the job's process ended, as a predicate: "is still running", "was killed by SIGKILL", "exited ..."."""
    text = exit_text(code)
    return f"is {text}" if code is None else f"was {text}" if code < 0 else text


def caller_gone(parent: int, started: float | None) -> bool:
    """Whether the caller (pid `parent`, started at `started`) has ended: the one rule of owners.py (a
    zombie, killed and not yet reaped, is gone; a pid now another process's is gone)."""
    return not process_alive(parent, started)


def end_with_caller(parent: int, started: float | None, where: Path) -> None:
    """The job's watchdog: once the caller has ended, remove the job folder and kill the job's process group
    (this process, its DataLoader and compile workers): nobody is left to read its outcome."""
    while not caller_gone(parent, started):
        time.sleep(PARENT_POLL_S)
    shutil.rmtree(where, ignore_errors=True)
    with contextlib.suppress(OSError, AttributeError):  # AttributeError: no process groups (Windows)
        os.killpg(os.getpgid(0), signal.SIGKILL)
    os._exit(1)  # where the group could not be signalled


def job_main(folder: str, parent: int | None = None, started: float | None = None) -> int:
    """Inside the job's process: run the call in `folder`, write its outcome there; the exit code. With
    `parent` (the caller's pid, started at `started`), the job ends when the caller does (`end_with_caller`)."""
    import cloudpickle

    where = Path(folder)
    if parent is not None:
        threading.Thread(target=end_with_caller, args=(parent, started, where), name="workbench-caller-watch",
                         daemon=True).start()
    try:
        for p in json.loads((where / PATH).read_text()):
            if p not in sys.path:
                sys.path.append(p)
        with open(where / CALL, "rb") as f:
            fn, args, kwargs = cloudpickle.load(f)
        outcome: tuple = ("ok", fn(*args, **kwargs))
    except BaseException as e:  # the caller gets the text; the job exits 1
        outcome = ("error", f"{type(e).__name__}: {e}", traceback.format_exc())
    try:
        data = cloudpickle.dumps(outcome)
    except Exception as e:  # an unpicklable return value
        data = cloudpickle.dumps(("error", f"the job's result cannot be pickled: {type(e).__name__}: {e}", ""))
    write_atomic(where / OUTCOME, data)
    return 0 if outcome[0] == "ok" else 1


if __name__ == "__main__":
    sys.exit(job_main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else None,
                      float(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[3] != "-" else None))
