"""run_trial: one honest measured run of the user's training step under one set of Knobs.

    build (fresh model copy, wrappers, seeded loader)  ->  warm-up until steady state (not measured;
    at least `warmup_steps`, see steady.py; on CPU one early step is profiled for peak memory)  ->
    sync  ->  measured window of N optimizer steps  ->  sync  ->  derive (a pure function of the
    raw samples)  ->  TrialResult

The phases live in core/phases.py (shared with each DDP/FSDP rank, launch/worker.py), the step
in core/step.py (BatchSource + TrainStep); this module routes a trial and runs it in this process. Progress
is three attribute stores per step into a TrialProgress; UIs read it from their own thread.
Every failure (OOM, an exception in user code, NaN loss, a stop request) ends the trial with a
status and a message instead of propagating; KeyboardInterrupt is recorded, then re-raised as
TrialInterrupted so the notebook cell still stops.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import gc
import os
import threading
import traceback
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from ..core import trace as tracing
from ..core.earlystop import StopRule
from ..core.knobs import BLOCK_KNOBS, Knobs, check_run, context, device_notes, process_env, settings, traits
from ..core.measure import TrialResult, environment, memory_meter, model_state_bytes, now_iso
from ..core.phases import (
    Stopped,
    TrialInterrupted,
    build,
    check_cancel,
    derive,
    run_phases,
    sort_failure,
)
from ..core.progress import Poller, TrialProgress
from ..core.step import BatchSource, Stage, TrainStep, seeded
from ..core.system import release_free_memory
from ..core.workload import Workload

Progress = Callable[[str, int, int], None]  # (phase, steps done, steps total), called by a Poller
T = TypeVar("T")
TRACE_STEPS = 3  # optimizer steps in a trace (after one profiler warm-up step)


def run_trial(
    workload: Workload,
    knobs: Knobs,
    *,
    warmup_steps: int = 5,
    steps: int = 30,
    progress: TrialProgress | Progress | None = None,
    cancel: threading.Event | None = None,
    measure_memory: bool = True,
    loader_timeout_s: float = 120.0,
    trace: bool = False,
    trace_dir: str | os.PathLike | None = None,
    collective_timeout_s: float = 120.0,
    stop: StopRule | None = None,
    executor: Any = None,
) -> TrialResult:
    """Run warm-up + `steps` measured optimizer steps; never raises for a failing trial.

    Warm-up takes at least `warmup_steps` and goes on to steady state (steady.py: the loader's
    buffer drained, no trend; `WORKBENCH_FIXED_WARMUP=1`: exactly `warmup_steps`); the result's
    `extra["warmup_rule"]` says what it took and why, `extra["steady"]` whether the window was.

    `progress` is a TrialProgress (stored into, three attributes per step) or a callable
    `(phase, done, total)`, which a Poller calls from its own thread at most 4 times a second.
    `trace=True` then profiles TRACE_STEPS more steps (after the window, never inside it) into a
    Chrome-trace JSON in `trace_dir` (default: the temp dir) and sets `result.trace_path`.
    Raises ValueError for knobs that cannot apply to this workload (unknown block, batch larger
    than the dataset) and TrialInterrupted on KeyboardInterrupt (after recording the result).
    With `knobs.world_size > 1` the trial runs on that many DDP ranks (launch/ranks.py), each
    collective bounded by `collective_timeout_s`; inside a torchrun job it joins the job instead.
    `stop` (earlystop.StopRule, one per trial) ends the window once its steps show the trial is far
    slower than the baseline: the trial keeps status ok, its steps, a note and `extra['stopped_early']`
    (one process only: a `world_size > 1` trial runs its whole window).
    `executor` (an object with `submit(fn, *args) -> job`, see remote.py) runs the trial in its own
    process; a trial whose knobs ask for a process this one is not (the `allocator` knob) runs in a
    fresh local process (fresh.FreshProcess) even without one. Either way it reads back the same.
    """
    if steps < 1 or warmup_steps < 0:
        raise ValueError(f"steps must be >= 1 and warmup_steps >= 0, got steps={steps}, warmup_steps={warmup_steps}")
    check_knobs(workload, knobs)
    if knobs.world_size > 1 and trace:
        raise ValueError("trace=True profiles one process: trace with world_size=1, or add torch.profiler to "
                         "the torchrun script from knobs.to_code() to trace every rank")
    run = dict(warmup_steps=warmup_steps, steps=steps, measure_memory=measure_memory, loader_timeout_s=loader_timeout_s,
               trace=trace, trace_dir=trace_dir, collective_timeout_s=collective_timeout_s, stop=stop)
    if executor is not None or elsewhere(workload, knobs):
        from .remote import run_elsewhere

        state = progress if isinstance(progress, TrialProgress) else TrialProgress()
        with Poller(state, progress) if callable(progress) else contextlib.nullcontext():
            return run_elsewhere(executor, workload, knobs, progress=state, cancel=cancel, run=run, here=run_here)
    return run_here(workload, knobs, progress=progress, cancel=cancel, **run)


def elsewhere(workload: Workload, knobs: Knobs) -> bool:
    """Whether the trial must run in a process of its own: a knob asks for how its process starts
    (knob `process_env` hooks: the allocator), and this is not already a torchrun rank."""
    if not process_env(knobs, context(knobs, workload.device)):
        return False
    from .join import in_launched_job

    return not in_launched_job()


def run_here(workload: Workload, knobs: Knobs, *, warmup_steps: int = 5, steps: int = 30,
             progress: TrialProgress | Progress | None = None, cancel: threading.Event | None = None,
             measure_memory: bool = True, loader_timeout_s: float = 120.0, trace: bool = False,
             trace_dir: str | os.PathLike | None = None, collective_timeout_s: float = 120.0,
             stop: StopRule | None = None) -> TrialResult:
    """`run_trial` in this process (its ranks forked from here when world_size > 1), checks done."""
    if knobs.world_size > 1:
        from .join import in_launched_job, run_joined

        if in_launched_job():
            return run_joined(workload, knobs, warmup_steps=warmup_steps, steps=steps, measure_memory=measure_memory,
                              loader_timeout_s=loader_timeout_s, collective_timeout_s=collective_timeout_s)
        from .ranks import run_distributed

        dist_args = dict(warmup_steps=warmup_steps, steps=steps, cancel=cancel, measure_memory=measure_memory,
                         loader_timeout_s=loader_timeout_s, collective_timeout_s=collective_timeout_s)
        if progress is None or isinstance(progress, TrialProgress):
            return run_distributed(workload, knobs, progress=progress or TrialProgress(), **dist_args)
        state = TrialProgress()
        with Poller(state, progress):
            return run_distributed(workload, knobs, progress=state, **dist_args)
    if progress is None or isinstance(progress, TrialProgress):
        return _run(workload, knobs, warmup_steps, steps, progress or TrialProgress(), cancel, measure_memory,
                    loader_timeout_s, trace, trace_dir, stop)
    state = TrialProgress()
    with Poller(state, progress):
        return _run(workload, knobs, warmup_steps, steps, state, cancel, measure_memory, loader_timeout_s,
                    trace, trace_dir, stop)


def _run(workload: Workload, knobs: Knobs, warmup_steps: int, steps: int, progress: TrialProgress,
         cancel: threading.Event | None, measure_memory: bool, loader_timeout_s: float,
         trace: bool = False, trace_dir: str | os.PathLike | None = None,
         stop: StopRule | None = None) -> TrialResult:
    device = workload.device
    notes = device_notes(knobs, device.type, has_conv=workload.has_conv, token_data=workload.token_data)
    started = now_iso()
    stage = Stage()
    total = warmup_steps + steps
    failed = False
    try:
        with contextlib.ExitStack() as stack:  # every object that holds memory or processes
            stack.enter_context(settings(knobs))
            stack.enter_context(seeded(workload.seed))
            env = environment(device)
            trace_to = tracing.trace_file(trace_dir, type(workload.pristine).__name__) if trace else None
            step, source = build(workload, knobs, stack, stage=stage, loader_timeout_s=loader_timeout_s,
                                 window_steps=steps)
            raw = run_phases(step, source, stage, progress, warmup_steps, steps, cancel, measure_memory=measure_memory,
                             stop=stop)
            if stop is not None and stop.stopped_at is not None:
                notes.append(stop.note())
            raw.state_bytes = model_state_bytes(step.model, step.optimizer)
            trace_info = trace_after(step, source, trace_to, stage, progress, total, cancel, notes) if trace_to else {}
            notes += [n for n in source.notes + step.notes if n not in notes]
            if measure_memory and memory_meter(device.type) is None:
                notes.append(f"peak memory is not measured on {device.type} (no peak counter there)")
        fields_, more_notes = derive(raw, knobs)
        if stop is not None and stop.stopped_at is not None:
            fields_["extra"]["stopped_early"] = stop.outcome()
        if trace_info:
            fields_["extra"]["trace"] = trace_info
            fields_["trace_path"] = trace_info["trace_path"]
        return TrialResult(knobs=knobs, env=env, started_at=started, notes=tuple(notes + more_notes), **fields_)
    except KeyboardInterrupt as e:
        failed = True
        res = _failure(knobs, "interrupted", f"interrupted by the user {stage.when()}", stage, e, notes, started, device)
        raise TrialInterrupted(res) from None
    except Stopped:
        failed = True
        why = getattr(cancel, "reason", "") or "stopped by the user"  # a deadline's cancel says whose stop it was
        return _failure(knobs, "interrupted", f"{why} {stage.when()}", stage, None, notes, started, device)
    except Exception as e:  # a failing trial is a result, whatever raised
        failed = True
        status, message = sort_failure(e, stage, knobs)
        return _failure(knobs, status, message, stage, e, notes, started, device)
    finally:
        if failed or traits(knobs)["compiles"]:
            gc.collect()  # tracebacks and compiled graphs hold cycles; plain trials free by refcount
        release_free_memory()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        progress.set("done", total, total)



def trace_after(step: TrainStep, source: BatchSource, path: Any, stage: Stage, progress: TrialProgress,
                total: int, cancel: threading.Event | None, notes: list[str]) -> dict[str, Any]:
    """TRACE_STEPS more steps under the profiler, after the window (never measured), phases
    labelled with record_function; a failed trace is a note, the measured result stands."""
    progress.set("tracing", total, total)
    stage.phase = "trace"
    step.label_phases = True

    def one() -> None:
        step(source)
        check_cancel(cancel)

    try:
        files = tracing.capture(one, path, device=step.device, steps=TRACE_STEPS)
        notes.extend(files.notes)
        return {"trace_path": str(files.path), "steps": files.steps,
                "memory_snapshot": str(files.memory_snapshot) if files.memory_snapshot else None,
                "memory_html": str(files.memory_html) if files.memory_html else None}
    except Stopped:
        notes.append("no trace: stopped by the user after the measured window")
    except Exception as e:  # the measured result stands; only the trace is missing
        text = str(e).strip().splitlines()[0] if str(e).strip() else ""
        notes.append(f"no trace: {type(e).__name__}: {text}")
    finally:
        step.label_phases = False
    return {}


_TRIAL_THREAD: concurrent.futures.ThreadPoolExecutor | None = None
TRIAL_THREAD_NAME = "workbench-trial"
# tune(parallel=N) with an executor: each of these threads watches one job (no trial runs in this
# process), so several wait side by side instead of queueing on the one trial thread.
PARALLEL_THREAD_NAME = "workbench-parallel"


def in_parallel_slot() -> bool:
    """Whether this thread is one of tune(parallel=N)'s job watchers."""
    return threading.current_thread().name.startswith(PARALLEL_THREAD_NAME)


def trial_thread() -> concurrent.futures.ThreadPoolExecutor:
    """The one thread for trials and analyses started off the main thread (the panel, in this process)."""
    global _TRIAL_THREAD
    if _TRIAL_THREAD is None:
        _TRIAL_THREAD = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=TRIAL_THREAD_NAME)
    return _TRIAL_THREAD


def submit_trial(fn: Callable[..., T], *args: Any, **kwargs: Any) -> concurrent.futures.Future[T]:
    """Start a measured trial: on the caller's thread when that is the main thread (a cell, a
    script, the CLI), else on the trial thread; a Future either way (done at once when inline).

    A user's plain loop runs on the main thread, and a thread's figure is tied to it: glibc gives
    every other thread its own malloc arena, whose heaps are unmapped when free and faulted in
    again at the next step (~4,600 page faults per step for a bf16 + channels_last CNN on a second
    thread, none on the main thread), and its own OpenMP team. A workbench's trials run in its worker
    process (launch/local.py), where this is called on the main thread; in a kernel, the panel, which
    must not block it, keeps the trial thread.
    """
    if threading.current_thread() is not threading.main_thread() and not in_parallel_slot():
        return trial_thread().submit(fn, *args, **kwargs)
    future: concurrent.futures.Future[T] = concurrent.futures.Future()
    try:
        future.set_result(fn(*args, **kwargs))
    except (Exception, TrialInterrupted) as e:  # what a trial-thread future would hold; Ctrl-C elsewhere propagates
        future.set_exception(e)
    return future


def on_trial_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call `fn` where this process's trials run and return its result: inline on the main thread (a
    cell, a script, a worker process: where `submit_trial` runs a trial), else on the trial thread.

    Every thread that calls into torch gets its own OpenMP team, and a second team slows every later
    parallel region of the process (launch/local.py); analyses that run training steps go through here
    so that they share the trials' thread instead of adding one.
    """
    here = threading.current_thread()
    if here is threading.main_thread() or here.name.startswith(TRIAL_THREAD_NAME):
        return fn(*args, **kwargs)
    future = trial_thread().submit(fn, *args, **kwargs)
    while True:  # wake every 0.1 s so a Ctrl-C in the caller's thread is seen
        try:
            return future.result(timeout=0.1)
        except concurrent.futures.TimeoutError:
            continue


# Workloads whose trials run as jobs (Workbench(executor=...)): workload -> its jobs.Jobs. An analysis
# (diagnose's profile, loader rate, memory, FLOPs) of such a workload runs inside a job too.
ROUTES: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def trial_threaded(fn: Callable[..., T]) -> Callable[..., T]:
    """Decorator: the function always runs on the trial thread (see `on_trial_thread`), or, for a
    workload (first argument) whose trials run as jobs, inside a job on the executor's node."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        jobs = ROUTES.get(args[0]) if args else None
        if jobs is not None and not getattr(jobs, "deferred", False):  # a rank's worker not yet started: here
            return jobs.call(wrapper, *args, **kwargs)
        return on_trial_thread(fn, *args, **kwargs)

    return wrapper


def check_knobs(workload: Workload, knobs: Knobs) -> None:
    """Knob checks that need the workload: block names exist, the dataset holds one batch."""
    if not isinstance(knobs, Knobs):
        raise TypeError(f"expected Knobs, got {type(knobs).__name__}")
    for knob in BLOCK_KNOBS:
        for name in getattr(knobs, knob):
            if name not in workload.blocks:
                raise ValueError(
                    f"{knob} names unknown block {name!r}; choose from bench.blocks: "
                    f"{', '.join(workload.blocks) or '(none found)'}"
                )
    check_run(knobs, context(knobs, workload.device, **workload.context_kwargs()))  # device and data refusals
    if knobs.world_size > 1:
        from .ranks import check_launch

        check_launch(workload, knobs)
    if not workload.spec.iterable and len(workload.spec) < knobs.batch_size:
        raise ValueError(
            f"the dataset has {len(workload.spec)} samples, fewer than batch_size={knobs.batch_size}: "
            f"lower batch_size to at most {len(workload.spec)} (or add data)"
        )


def _failure(knobs, status, message, stage, exc, notes, started, device) -> TrialResult:
    tb = "".join(traceback.format_exception(exc)) if exc is not None else ""
    return TrialResult(knobs=knobs, status=status, message=message, notes=tuple(notes),
                       env=environment(device), started_at=started, where=stage.name, traceback=tb)


