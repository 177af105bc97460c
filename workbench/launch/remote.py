"""A trial in another process: the caller's side (`run_elsewhere`) and the job's (`trial_job`).

The seam every executor shares (the local `FreshProcess`, a cluster's submitit executor): an
executor is any object with `submit(fn, *args, **kwargs) -> job`, the job has `result()`, `done()`
and `cancel()` (optionally `job_id`, `state`). The trial travels by value with cloudpickle (the
workload, the knobs, the run's settings; classes of the user's own modules too, see `by_value`), so
the job needs the same Python environment but not the notebook's files.

In the job, `trial_job` checks the process runs as the knobs ask (the allocator mapped, glibc's
settings read back), runs the same phases as a local trial and returns the TrialResult as a plain
dict, with where and how it ran. Its progress goes to a small JSON file the caller polls, so a
panel's bar moves; the caller's cancel ends the job. A job that cannot start, crashes, or whose
mode did not take ends that trial with a status and a message; nothing else is lost.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..core.knobs import Knobs, context, process_differs, process_env
from ..core.measure import TrialResult, environment, now_iso
from ..core.progress import Poller, TrialProgress
from ..core.workload import Workload

PROGRESS_FILE = "progress.json"


def process_info() -> dict[str, Any]:
    """Where and how this process runs: pid, host, allocator mode read back from inside, torch, python."""
    import torch

    from ..core.system import malloc_policy, mapped_allocator, process_allocator

    return {"pid": os.getpid(), "hostname": socket.gethostname(), "allocator": process_allocator(),
            "mapped": mapped_allocator() or "", "malloc": malloc_policy(), "torch": torch.__version__,
            "python": sys.executable, "ld_preload": os.environ.get("LD_PRELOAD", "")}


def trial_job(payload: dict[str, Any]) -> dict[str, Any]:
    """Inside the job's process: run one trial as `payload` describes; {"record", "process"}.

    The record is `TrialResult.to_record()`; a mode that did not take is a failed record (status
    "error", where "process") before any step runs.
    """
    from ..core.knobs import adopt_user_knobs
    from ..core.measure import RAN_IN_ENV
    from .workerside import current_cancel

    adopt_user_knobs(payload.get("user_knobs") or {})  # the caller's @wb.knob declarations
    workload: Workload = payload["workload"]
    knobs: Knobs = payload["knobs"]
    info = process_info()
    info["device"] = str(workload.device)
    differs = process_differs(knobs, context(knobs, workload.device))
    if differs:
        why = "; ".join(differs)
        result = TrialResult(knobs=knobs, status="error", where="process", env=environment(workload.device),
                             started_at=now_iso(),
                             message=f"the trial's process did not start as asked: {why} (the platform "
                                     "may ignore LD_PRELOAD or MALLOC_* variables: macOS, Windows, musl)")
        return {"record": _where(result.to_record(), RAN_IN_ENV), "process": info}
    progress = TrialProgress()
    path = payload.get("progress_path")
    writer = _progress_writer(Path(path)) if path else None
    with Poller(progress, writer) if writer else contextlib.nullcontext():
        stop = current_cancel()  # a worker's stop event; None in a one-call job
        run = {**payload["run"], **({"cancel": stop} if stop is not None else {})}
        result = payload["here"](workload, knobs, progress=progress, **run)  # runner.run_here
    return {"record": _where(result.to_record(), RAN_IN_ENV), "process": info}


def _where(record: dict[str, Any], var: str) -> dict[str, Any]:
    """The record's `ran_in`: "worker" in a workbench's worker process (its environment says so), else "job"."""
    env = record.get("env")
    if isinstance(env, dict):
        record["env"] = {**env, "ran_in": os.environ.get(var) or "job"}
    return record


def _progress_writer(path: Path) -> Any:
    from .watcher import write_progress  # the one progress format every watcher reads

    def write(phase: str, done: int, total: int) -> None:
        write_progress(path, phase, done, total)

    return write


def local_modules(*objects: Any) -> list[Any]:
    """The modules of the user's objects that a job could not import (not installed, not stdlib, not
    this package): their classes and functions must travel by value. Walks a model's sub-modules too."""
    skip = [p for p in {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")} if p]
    skip.append(str(Path(__file__).resolve().parents[1]))  # this package
    seen: dict[str, Any] = {}

    def add(obj: Any) -> None:
        for target in (obj, type(obj)):
            name = getattr(target, "__module__", None)
            mod = sys.modules.get(name) if isinstance(name, str) else None
            file = getattr(mod, "__file__", None) if mod is not None else None
            if mod is None or name in seen or name == "__main__" or not file:
                continue
            path = str(Path(file).resolve())
            if not any(path.startswith(str(Path(s).resolve())) for s in skip):
                seen[name] = mod

    import torch

    for obj in objects:
        add(obj)
        if isinstance(obj, torch.nn.Module):
            for sub in obj.modules():
                add(sub)
    return list(seen.values())


@contextlib.contextmanager
def by_value(workload: Workload) -> Iterator[None]:
    """While pickling: the user's own modules (a test module, a file next to the notebook) travel by
    value with cloudpickle, as `__main__` does, so the job needs none of the caller's files."""
    import cloudpickle

    spec = workload.spec
    mods = local_modules(workload.pristine, spec.dataset, spec.collate_fn, spec.sampler, workload.loss_fn,
                         workload.step_fn, workload.optimizer_factory)
    done = []
    try:
        for m in mods:
            with contextlib.suppress(ValueError):
                cloudpickle.register_pickle_by_value(m)
                done.append(m)
        yield
    finally:
        for m in done:
            with contextlib.suppress(ValueError):
                cloudpickle.unregister_pickle_by_value(m)


def executor_for(executor: Any, env: dict[str, str | None]) -> Any:
    """The executor that starts the trial's process with `env`: the workbench's own (given the env
    through its `with_env` when it has one; a submitit SLURM executor through a copy whose job script
    sets it, `slurm_setup`), else a local FreshProcess. ValueError, before anything is submitted, for
    an executor that cannot set a job's environment: the knob would be dropped silently."""
    if executor is None:
        from .fresh import FreshProcess

        return FreshProcess(env)
    if not env:
        return executor
    if hasattr(executor, "with_env"):
        return executor.with_env(env)
    ex = with_setup(executor, env)
    if ex is None:
        names = ", ".join(sorted(env))
        raise ValueError(f"these knobs start the trial's process with {names} set, and {type(executor).__name__} "
                         "cannot set a job's environment (no with_env(env), not a submitit SLURM executor): run "
                         "the knob without the executor (a fresh local process), or give the executor a "
                         "with_env(env) method returning one that starts its jobs with env")
    return ex


def with_setup(executor: Any, env: dict[str, str | None]) -> Any:
    """A copy of a submitit SLURM executor (AutoExecutor(cluster="slurm") or SlurmExecutor) whose job
    script exports `env` before the job's Python starts (submitit's `setup` lines, quoted), else None.
    A path in `env` (the allocator's library) was found on this machine: the node must have it at the
    same path (a shared image); the job checks the mode took and fails the trial saying so if not."""
    import copy
    import shlex

    inner = getattr(executor, "_executor", executor)
    if type(inner).__name__ != "SlurmExecutor" or not isinstance(getattr(inner, "parameters", None), dict):
        return None
    ex = copy.deepcopy(executor)
    target = getattr(ex, "_executor", ex)
    lines = [f"export {k}={shlex.quote(v)}" if v is not None else f"unset {k}" for k, v in sorted(env.items())]
    target.parameters["setup"] = [*target.parameters.get("setup", []), *lines]
    return ex


def run_elsewhere(executor: Any, workload: Workload, knobs: Knobs, *, progress: TrialProgress,
                  cancel: threading.Event | None, run: dict[str, Any], here: Callable[..., TrialResult]) -> TrialResult:
    """Run one trial through `executor` (None: a FreshProcess started with the knobs' process
    environment); never raises for a failing trial (a job that cannot start or dies is a status).
    `here` is what the job calls in its process (runner.run_here, passed in: no import circle).
    The job is watched by the one watcher (watcher.watch), as a cluster's jobs are."""
    from ..core.phases import TrialInterrupted
    from .watcher import JobFailed, Watch, watch

    env = process_env(knobs, context(knobs, workload.device))
    ex = executor_for(executor, env)
    started = now_iso()
    total = run.get("warmup_steps", 0) + run.get("steps", 0)
    base = getattr(ex, "folder", None)
    folder = Path(tempfile.mkdtemp(prefix="workbench-progress-", dir=base if base and Path(base).is_dir() else None))
    from ..core.knobs import user_knob_specs

    payload = {"workload": workload, "knobs": knobs, "run": run, "here": here,
               "progress_path": str(folder / PROGRESS_FILE), "user_knobs": user_knob_specs()}
    where = type(ex).__name__

    def failed(status: str, message: str, tb: str = "") -> TrialResult:
        env_ = {**environment(workload.device), "executor": where, "ran_in": getattr(ex, "ran_in", "job")}
        return TrialResult(knobs=knobs, status=status, message=message, env=env_, started_at=started,
                           where="process", traceback=tb)

    progress.set("starting a process", 0, total)
    w = Watch(None, folder / PROGRESS_FILE, time.monotonic())
    try:
        try:
            with by_value(workload):
                w.job = ex.submit(trial_job, payload)
        except Exception as e:  # cannot start, cannot pickle: this trial fails, nothing else
            return failed("error", f"the trial's process could not start ({where}): {type(e).__name__}: {e}")
        try:
            out = watch(w.job, w, progress, cancel)
        except KeyboardInterrupt:
            raise TrialInterrupted(failed("interrupted", f"interrupted by the user: {w.stopped or 'cancelled'}")) from None
        except JobFailed as e:  # crashed, killed, raised, cancelled: the job's text is the message
            cause = e.__cause__
            return failed(e.status, f"{e.message} ({where})", str(cause).strip() if cause is not None else "")
        return received(out, knobs, where, getattr(w.job, "job_id", None))
    finally:
        progress.set("done", total, total)
        shutil.rmtree(folder, ignore_errors=True)


def received(out: dict[str, Any], knobs: Knobs, where: str, job_id: Any) -> TrialResult:
    """The TrialResult a job returned, with where it ran in its environment record."""
    result = TrialResult.from_record(out["record"], knobs=knobs)
    info = dict(out.get("process") or {})
    env = {**result.env, "executor": where, "process": info}
    if job_id is not None:
        env["job_id"] = str(job_id)
    if info.get("allocator") is not None:
        env["allocator"] = info["allocator"]
    object.__setattr__(result, "env", env)
    return result
