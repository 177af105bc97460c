"""The phases of one measured trial, below both the single-process runner and each DDP/FSDP rank.

    build (TrainStep + BatchSource)  ->  first batch  ->  warm-up until steady state (steady.py)
    ->  measured window of N optimizer steps  ->  RawTrial  ->  derive (pure)  ->  TrialResult fields

`runner.run_trial` routes a trial here in this process, or to forked ranks (launch/ranks.py, launch/worker.py),
which call the same `run_phases`; the parent calls the same `derive` (launch/result.py's `assemble`). Failures are sorted here
(`sort_failure`: oom or error, where, what to try), so a rank and a trial say the same thing.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .compat import CompileWatch
from .earlystop import StopRule
from .knobs import Knobs, traits
from .measure import (
    FOREIGN_LOAD_LIMIT,
    CpuLoad,
    KernelTime,
    StepClock,
    TrialResult,
    live_tensor_bytes,
    memory_meter,
    profile_peak_bytes,
    ran_in,
    summarize,
    sync,
)
from .progress import TrialProgress
from .shapes import ShapeWatch, shape_costs
from .steady import WarmupRule, cycle_steps, is_steady
from .step import BatchSource, LossBuffer, Stage, TrainStep
from .system import KEEP_MMAP_BYTES, KEEP_TRIM_BYTES, MALLOC_ENV, keeps_freed_memory, malloc_settled
from .tokens import window_figures
from .workload import Workload

NOISY = 0.10  # IQR / median above this gets a "noisy" note


MAX_REMEASURE = 2  # windows measured again, at most, when one read more than its loader delivers
LOADER_NOTE = "not steady: faster than the loader"  # a window that drained a buffer: measured again
WINDOW_CHECK_STEPS = 8  # shorter windows are not tested for a trend (halves of 3 steps say little)
LOADER_OVER = 1.05  # a window above this share of the workers' limit drained a buffer
SHAPES_NOTE = "not steady: first calls on new input shapes"  # a window that met shapes first: measured again
SHAPES_SHARE = 0.10  # first calls on new shapes above this share of the window: the window is not steady


KERNEL_SHARE = 0.05  # kernel share of CPU time above this gets a "page faults" note (quiet steps: < 1%)


class TrialInterrupted(KeyboardInterrupt):
    """A KeyboardInterrupt that carries the recorded (interrupted) TrialResult."""

    def __init__(self, result: TrialResult) -> None:
        super().__init__("trial interrupted")
        self.result = result


class Stopped(Exception):
    """Raised at a step boundary when the caller's cancel event is set."""


@dataclass
class RawTrial:
    """Everything a trial measured, before any statistic: the input of `derive`."""

    warmup_steps: int
    steps: int
    startup_s: float  # loader start until the first batch is on the device
    warm_times_s: list[float]  # per warm-up step (the memory-probe step excluded)
    warmup_wall_s: float
    probe_s: float  # the profiled warm-up step (CPU memory probe), 0 if none
    step_times_s: list[float]  # measured window, per optimizer step
    waits_s: list[float]  # data wait per step: the loader's (device idle on CUDA, host seconds elsewhere) + the copies'
    losses: list[float]  # per step, mean over its micro-batches
    samples: int  # samples consumed in the window
    wall_s: float  # window wall time, bracketed by device syncs
    epochs: int  # loader restarts (epoch boundaries) inside the measured window
    foreign_cores: float | None  # cores busy with other processes during the window
    peak_bytes: int | None
    compile_info: dict[str, Any] = field(default_factory=dict)
    state_bytes: int | None = None  # parameters + gradients + optimizer state held (local shards)
    page_faults: int | None = None  # this process's page faults during the window
    kernel_share: float | None = None  # kernel share of this process's CPU seconds during the window
    warmup_rule: dict[str, Any] = field(default_factory=dict)  # WarmupRule.outcome(): steps taken, why it ended
    warmup_note: str | None = None  # WarmupRule.note(): set when warm-up did not reach steady state
    loader_limit: float | None = None  # samples/s the workers can deliver at most (LoaderMeter), None without
    tokens: dict[str, Any] | None = None  # token batches: the window's tokens, slots, tokens/s (tokens.window_figures)
    copies_s: list[float] = field(default_factory=list)  # per step: the host->device copies' own cost (in waits_s)
    loader_host_s: list[float] = field(default_factory=list)  # per step: host seconds in the loader
    # per step, device events only (None on the host clock): the device's idle seconds while the host was in
    # the loader (in waits_s), and from the step before's end to the loader (host work between steps, not data)
    loader_idle_s: list[float] | None = None
    host_idle_s: list[float] | None = None
    # input shapes (shapes.py): "warm" [(s, shape ids, first seen)] of warm-up steps timed apart from start-up,
    # "window" [shape ids] and "window_new" [first seen] per measured step, "distinct", "pass_batches"
    shapes: dict[str, Any] = field(default_factory=dict)


# ---- the phases: one runner for the single-process trial and for each rank ----------------------
def run_phases(step: TrainStep, source: BatchSource, stage: Stage, progress: TrialProgress, warmup_steps: int,
               steps: int, cancel: threading.Event | None, *, measure_memory: bool,
               before_window: Callable[[], None] | None = None,
               agree: Callable[[bool], bool] | None = None, stop: StopRule | None = None) -> RawTrial:
    """First batch, warm-up to steady state, (`before_window`: a rank's barrier), the measured
    window, under a CompileWatch; the RawTrial with start-up, warm-up and compile figures filled in.
    `agree(done)` makes ranks end warm-up together (each rank's answer in, everyone's out).
    `stop` (earlystop.StopRule) may end the window early: `raw.steps` is then the steps measured."""
    total = warmup_steps + steps
    shapes = ShapeWatch(source)  # the steps read through it: each batch's input shape is recorded
    rule = WarmupRule.for_loader(source.loader, warmup_steps, accum_steps=step.knobs.accum_steps,
                                 cached=step.knobs.data == "cached", sample_batches=shapes.sample_batches)
    told = traits(step.knobs)  # what the knobs' hooks say the phases must know (compile, workers)
    with CompileWatch(enabled=told["compiles"]) as watch:
        progress.set("starting workers" if told["workers"] else "loading data", 0, total)
        startup_s = first_batch(source)
        warm = warm_up(step, shapes, rule, stage, progress, total, cancel, measure_memory=measure_memory,
                       agree=agree)
        source = shapes
        if before_window is not None:
            before_window()
        raw = measure_window(step, source, warmup_steps, steps, stage, progress, cancel,
                             measure_memory=measure_memory, stop=stop)
        redone: list[str] = []  # a window that drained a buffer is measured again (its steps become warm-up)
        while rule.ended != "fixed" and len(redone) < MAX_REMEASURE:  # a trend alone is only flagged (cost)
            if stop is not None and stop.stopped_at is not None:  # stopped early: clearly slower, nothing to redo
                break
            problems = [p for p in window_problems(raw, step.knobs) if p.startswith(LOADER_NOTE)]
            if rule.sample_batches and any(raw.shapes.get("window_new", ())):  # the repeated sample: once is enough
                problems.append(f"{SHAPES_NOTE}: {sum(raw.shapes['window_new'])} in the window")
                warm[4].extend(zip(raw.step_times_s, raw.shapes["window"], raw.shapes["window_new"]))
            if (agree(not problems) if agree is not None else not problems):
                break
            redone.append(problems[0] if problems else "another rank's window was not steady")
            if before_window is not None:
                before_window()
            if stop is not None:
                stop.reset()  # a new window: the stop rule looks at its steps afresh
            raw = measure_window(step, source, warmup_steps, steps, stage, progress, cancel,
                                 measure_memory=measure_memory, stop=stop)
    raw.startup_s = startup_s
    raw.warm_times_s, raw.warmup_wall_s, raw.probe_s = warm[0], warm[1], warm[2]
    if raw.peak_bytes is None:
        raw.peak_bytes = warm[3]
    raw.compile_info = watch.info
    raw.warmup_steps = rule.steps + steps * len(redone)
    raw.warmup_rule = {**rule.outcome(), "remeasured": redone} if redone else rule.outcome()
    raw.warmup_note = rule.note()
    raw.shapes = {**raw.shapes, "warm": warm[4], "distinct": shapes.distinct, "pass_batches": shapes.sample_batches}
    return raw


def sort_failure(e: BaseException, stage: Stage, knobs: Knobs) -> tuple[str, str]:
    """(status, message) of an exception that ended a trial or a rank: oom or error, and where."""
    if "DataLoader worker" in str(e) or "DataLoader timed out" in str(e):
        stage.name = "data"  # raised asynchronously (SIGCHLD handler / timeout), wherever we were
    status = "oom" if is_oom(e) else "error"
    return status, failure_message(status, e, stage, knobs)


# ---- the four phases ----------------------------------------------------------------------------
def build(workload: Workload, knobs: Knobs, stack: contextlib.ExitStack, *, stage: Stage, loader_timeout_s: float,
          wrap: Callable[[Any, Any], Any] | None = None, sampler: Any = None,
          window_steps: int | None = None) -> tuple[TrainStep, BatchSource]:
    """A fresh TrainStep and BatchSource, registered on `stack` for cleanup (workers, wrappers): the
    single-process trial's, or (with `wrap`, the strategy, and `sampler`, its shard) a rank's.
    `window_steps`: the measured window's steps (token data cycles through a stratified sample)."""
    step = stack.enter_context(TrainStep(workload, knobs, stage=stage, wrap=wrap))
    source = stack.enter_context(BatchSource(workload, knobs, timeout_s=loader_timeout_s, stage=stage,
                                             sampler=sampler, window_steps=window_steps))
    return step, source


def first_batch(source: BatchSource) -> float:
    """Start the loader and fetch the first batch (kept for the first step); seconds it took."""
    t0 = time.perf_counter()
    first = source.next()
    sync(source.device)
    startup_s = time.perf_counter() - t0
    source.push_back(first)  # the first batch is consumed by the first step
    return startup_s


def warm_up(step: TrainStep, source: BatchSource, rule: WarmupRule, stage: Stage, progress: TrialProgress,
            total: int, cancel: threading.Event | None, *, measure_memory: bool,
            agree: Callable[[bool], bool] | None = None) -> tuple[list[float], float, float, int | None, list[Any]]:
    """Unmeasured steps (compile, allocator growth, worker pipelines fill, first calls on new input
    shapes) until `rule` says steady.

    Returns (per-step seconds, wall seconds, probe seconds, peak bytes, shape steps): on CPU one warm-up
    step runs under the profiler's memory events to find the step's peak tensor memory: the second
    (early, so the buffer it lets fill is drained before the window), or the last of a fixed count.
    `source` is a shapes.ShapeWatch: shape steps are (seconds, shape ids, shapes first seen) of the
    steps timed apart from start-up (not the first step, not the probe), for shapes.shape_costs.
    """
    device = step.device
    compiles = traits(step.knobs)["compiles"]
    n = rule.min_steps
    probe_at = n - 1 if rule.fixed else min(1, n - 1)
    probe = measure_memory and memory_meter(device.type) == "profiler"
    peak_bytes = None
    probe_s = 0.0
    times: list[float] = []
    shape_steps: list[Any] = []
    t_warm = time.perf_counter()
    i = 0
    while not (agree(rule.done()) if agree is not None else rule.done()):
        stage.phase, stage.step = "warm-up", i + 1
        phase = "compiling" if compiles and i == 0 else "warming up"
        progress.set(phase if i < n else "warming up to steady state", min(i, n), total)
        epochs = source.epochs
        read = source.read
        tw = time.perf_counter()
        if probe and i == probe_at:
            params = list(step.model.parameters())
            before = live_tensor_bytes(params, [p.grad for p in params], step.optimizer.state, source.cached)
            peak_bytes = before + profile_peak_bytes(lambda: step(source), device)
            probe_s = time.perf_counter() - tw
            key, new = source.since(read)
            rule.observe(probe_s, 0.0, "memory probe", shapes=source.distinct, batches=source.read, new_shapes=new)
        else:
            out = step(source)
            sync(device)
            times.append(time.perf_counter() - tw)
            key, new = source.since(read)
            if i > 0:
                shape_steps.append((times[-1], key, new))
            rule.observe(times[-1], out.wait_s, "epoch start" if source.epochs != epochs else None,
                         shapes=source.distinct, batches=source.read, new_shapes=new)
        check_cancel(cancel)
        i += 1
    return times, time.perf_counter() - t_warm, probe_s, peak_bytes, shape_steps


def measure_window(step: TrainStep, source: BatchSource, warmup_steps: int, steps: int, stage: Stage,
                   progress: TrialProgress, cancel: threading.Event | None, *, measure_memory: bool,
                   stop: StopRule | None = None) -> RawTrial:
    """The measured window: `steps` optimizer steps bracketed by device syncs; raw samples only.
    `stop.observe(seconds, samples)` after each step may end it sooner (the steps measured are kept)."""
    device = step.device
    total = warmup_steps + steps
    progress.set("measuring", warmup_steps, total)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    losses = LossBuffer(steps, device)  # device memory the step does not own (CUDA graphs)
    waits: list[float] = []
    samples = 0
    clock = StepClock(device)
    sync(device)
    load = CpuLoad()
    kernel = KernelTime()
    epochs = source.epochs
    meter = getattr(source, "meter", None)
    made = meter.read() if meter is not None else None
    counted = source.tokens.snapshot() if hasattr(source, "tokens") else None
    copies = getattr(source, "copies", None)  # the copies' own cost: CUDA events, read after the window
    if copies is not None:
        copies.arm()
    watched = isinstance(source, ShapeWatch)
    keys: list[Any] = []
    fresh: list[int] = []  # per step: input shapes it met first (their one-time cost is in its time)
    t_start = last = time.perf_counter()
    clock.mark()
    measured = steps
    for i in range(steps):
        stage.phase, stage.step = "measured", i + 1
        read = source.read if watched else 0
        out = step(source, losses, i)
        clock.mark()  # CUDA: an event after the optimizer step; CPU: perf_counter
        key, new = source.since(read) if watched else ((), 0)
        keys.append(key)
        fresh.append(new)
        samples += out.samples
        waits.append(out.wait_s)
        progress.set("measuring", warmup_steps + i + 1, total)
        check_cancel(cancel)
        if stop is not None:  # host time per step (CUDA: runs ahead of the device, so it under-states)
            now = time.perf_counter()
            if stop.observe(now - last, out.samples, first_seen=new > 0):
                measured = i + 1
                progress.set("stopping early: clearly slower", warmup_steps + measured, total)
                break
            last = now
    sync(device)
    wall = time.perf_counter() - t_start
    copy_s = copies.per_step_s() if copies is not None else [0.0] * len(waits)
    # on device events: how long the device sat idle while the host was in the loader (a loader hidden
    # under the kernels queued before it reads 0); on the host clock the loader's host seconds are the wait
    idle = copies.loader_idle_per_step_s() if copies is not None else None
    between = copies.host_idle_per_step_s(clock) if idle is not None else None
    if copies is not None:
        copies.disarm()
    loader_host = waits
    waits = [w + c for w, c in zip(idle if idle is not None else loader_host, copy_s)]  # the loader's + the copy's
    faults = kernel.since()  # before foreign_cores: psutil's reads fault too, and belong outside
    foreign = load.foreign_cores()
    peak = (torch.cuda.max_memory_allocated(device)
            if measure_memory and memory_meter(device.type) == "allocator" else None)
    limit = meter.limit(step.knobs.batch_size, since=made) if meter is not None else None
    tokens = (window_figures(counted, source.tokens.snapshot(), wall, source.tokens.counted_from)
              if counted is not None else None)
    return RawTrial(warmup_steps=warmup_steps, steps=measured, startup_s=0.0, warm_times_s=[], warmup_wall_s=0.0,
                    probe_s=0.0, step_times_s=clock.durations_s(), waits_s=waits,
                    losses=losses.values(divide_by=step.knobs.accum_steps),  # the one device->host read
                    samples=samples, wall_s=wall, epochs=source.epochs - epochs, foreign_cores=foreign, peak_bytes=peak,
                    page_faults=faults[0] if faults else None, kernel_share=faults[1] if faults else None,
                    loader_limit=limit, tokens=tokens, copies_s=copy_s, loader_host_s=loader_host,
                    loader_idle_s=idle, host_idle_s=between, shapes={"window": keys, "window_new": fresh})


def derive(raw: RawTrial, knobs: Knobs) -> tuple[dict[str, Any], list[str]]:
    """TrialResult fields and notes from the raw samples: a pure function (no clocks, no torch)."""
    notes: list[str] = []
    median, iqr = summarize(raw.step_times_s)
    noise = iqr / median if median else 0.0
    if noise > NOISY:
        notes.append(f"noisy: step times spread {noise:.0%} (IQR/median); repeat before trusting a small difference")
    if raw.foreign_cores is not None and raw.foreign_cores > FOREIGN_LOAD_LIMIT:
        notes.append(f"disturbed: other processes kept {raw.foreign_cores:.2f} cores busy during the measurement")
    if raw.kernel_share is not None and raw.kernel_share > KERNEL_SHARE and raw.page_faults:
        notes.append(page_fault_note(raw.kernel_share, raw.page_faults / raw.steps, knobs))
    told = traits(knobs)
    if raw.epochs and not told["persistent_workers"] and told["workers"]:
        which = "an epoch boundary" if raw.epochs == 1 else f"{raw.epochs} epoch boundaries"
        notes.append(f"{which} in the window re-forked the workers (persistent_workers=True avoids it)")
    problems = window_problems(raw, knobs)
    shapes = shape_figures(raw)
    first_calls = shapes["in_window"] * shapes["per_shape_s"] if shapes and shapes["per_shape_s"] else 0.0
    if first_calls > SHAPES_SHARE * raw.wall_s:  # seconds of the window spent in first calls on new shapes
        problems.append(f"{SHAPES_NOTE}: {shapes['in_window']} of the window's steps met an input shape for the first "
                        f"time, at ≈{shapes['per_shape_s'] * 1e3:,.0f} ms each (plans, autotune, recompiles): "
                        f"{first_calls / raw.wall_s:.0%} of the window; pad_to_multiple_of (or bucketing) leaves fewer")
    notes += [raw.warmup_note] if raw.warmup_note else []
    notes += problems
    if raw.warmup_rule.get("remeasured") and problems:
        notes.append(f"not steady after {len(raw.warmup_rule['remeasured'])} more window(s): the trial kept the last")
    window_steady = not problems
    compile_s = compile_cost(raw.warm_times_s, raw.step_times_s, compiles=told["compiles"])
    status, message = "ok", ""
    bad = [i for i, x in enumerate(raw.losses) if not math.isfinite(x)]
    if bad:
        status = "nan"
        message = (f"loss became {raw.losses[bad[0]]} at measured step {bad[0] + 1}: lower the learning "
                   "rate, clip gradients, check input normalisation"
                   + ("; with fp16 keep the GradScaler (it is on)" if told["loss_scaling"] else ""))
    extra: dict[str, Any] = {"epochs": raw.epochs, "warmup_steps": raw.warmup_steps, "wall_s": raw.wall_s,
                             "foreign_cores": raw.foreign_cores, "warmup_wall_s": raw.warmup_wall_s,
                             "memory_probe_s": raw.probe_s,
                             "page_faults_per_step": (None if raw.page_faults is None
                                                      else round(raw.page_faults / raw.steps, 1)),
                             "kernel_share": raw.kernel_share,
                             "warmup_rule": raw.warmup_rule,
                             "loader_limit_samples_per_s": raw.loader_limit,
                             "steady": window_steady and not raw.warmup_note}
    if raw.loader_host_s:
        extra["data_wait"] = data_wait_figures(raw)
    if raw.tokens:
        extra["tokens"] = {k: v for k, v in raw.tokens.items() if k not in ("tokens_per_s", "padding_share")}
    if shapes:
        extra["shapes"] = shapes
    if raw.compile_info:
        extra["compile"] = raw.compile_info
        notes += compile_notes(raw.compile_info)
    fields_ = dict(
        status=status,
        message=message,
        samples_per_s=raw.samples / raw.wall_s,
        step_time_s=median,
        step_time_iqr_s=iqr,
        step_times_s=tuple(raw.step_times_s),
        data_wait_s=tuple(raw.waits_s),
        data_wait_share=min(1.0, sum(raw.waits_s) / raw.wall_s),
        copy_share=min(1.0, sum(raw.copies_s) / raw.wall_s) if raw.copies_s else None,
        peak_memory_bytes=raw.peak_bytes,
        model_state_bytes=raw.state_bytes,
        startup_s=raw.startup_s,
        compile_s=compile_s,
        samples_per_step=round(raw.samples / raw.steps),
        losses=tuple(raw.losses),
        tokens_per_s=raw.tokens["tokens_per_s"] if raw.tokens else None,
        padding_share=raw.tokens["padding_share"] if raw.tokens else None,
        shapes=shapes["distinct"] if shapes else None,
        shape_warmup_s=shapes["warmup_s"] if shapes else None,
        extra=extra,
    )
    return fields_, notes


def compile_cost(warm_times_s: list[float], window_times_s: list[float], *, compiles: bool) -> float | None:
    """`compile_s`: the warm-up's seconds beyond as many steady-state steps (the window's median step), the
    one-time cost of compiling (and of the first calls' plans and autotuning); None when the knobs compile
    nothing (empty, not a small number). A real run's row reads it the same way (faces/realrun.py)."""
    if not compiles:
        return None
    if not warm_times_s or not window_times_s:
        return 0.0
    return max(0.0, sum(warm_times_s) - statistics.median(window_times_s) * len(warm_times_s))


def data_wait_figures(raw: RawTrial) -> dict[str, Any]:
    """Where the data wait comes from, in seconds per measured step (means): `clock` 'device events'
    (CUDA: the wait is the device's idle time while the host was in the loader, `loader_idle_s`, plus the
    copy's own device time) or 'host' (the loader's host seconds plus the move's); `loader_host_s` the
    host's seconds in the loader either way (on CUDA the part above `loader_idle_s` ran under queued
    kernels: no wait); `host_idle_s` the device's idle time between a step's end and the loader (host work
    between steps, not data; None on the host clock)."""

    def mean(xs: list[float] | None) -> float | None:
        return sum(xs) / len(xs) if xs else (None if xs is None else 0.0)

    return {"clock": "host" if raw.loader_idle_s is None else "device events",
            "loader_host_s": mean(raw.loader_host_s), "loader_idle_s": mean(raw.loader_idle_s),
            "copy_s": mean(raw.copies_s), "host_idle_s": mean(raw.host_idle_s)}


def compile_notes(info: dict[str, Any]) -> list[str]:
    """The trial's notes on torch.compile's graph breaks and recompiles."""
    notes = []
    if info.get("graph_breaks"):
        notes.append(f"torch.compile: {info['graph_breaks']} graph break(s); see bench.diagnose()")
    if info.get("recompiles"):
        notes.append(f"torch.compile: {info['recompiles']} recompile(s) (dynamic shapes?)")
    return notes


def shape_figures(raw: RawTrial) -> dict[str, Any] | None:
    """The trial's input shapes and their first calls' cost (shapes.shape_costs), None when none was watched."""
    sh = raw.shapes or {}
    if not sh.get("distinct"):
        return None
    fresh = list(sh.get("window_new") or [0] * len(raw.step_times_s))
    keys = [tuple(k) for k in sh.get("window") or [()] * len(raw.step_times_s)]
    window = [(t, k) for t, k, new in zip(raw.step_times_s, keys, fresh) if not new]  # the references: seen shapes
    warm = [(t, tuple(k), new) for t, k, new in sh.get("warm") or ()]
    warm += [(t, k, new) for t, k, new in zip(raw.step_times_s, keys, fresh) if new]  # first calls in the window too
    return shape_costs(warm, window, int(sh["distinct"]), in_window=sum(fresh),
                       pass_batches=int(sh.get("pass_batches") or 0))


def window_problems(raw: RawTrial, knobs: Knobs) -> list[str]:
    """Why the measured window is not steady (empty when it is), as notes: its two halves (whole
    loader cycles) differ in step time or data-wait share, or it read more samples/s than the
    workers can deliver (it drained batches buffered before it; one loader cycle, a batch per
    worker, may be ready when a window starts, so that much over is allowed). A window under
    WINDOW_CHECK_STEPS steps is not tested for a trend."""
    problems = []
    workers = traits(knobs)["workers"]
    cycle = cycle_steps(workers, knobs.accum_steps)
    if len(raw.step_times_s) >= WINDOW_CHECK_STEPS and len(raw.waits_s) == len(raw.step_times_s):
        steady, why = is_steady(raw.step_times_s, raw.waits_s, cycle=cycle)
        if not steady:
            problems.append(f"not steady: in the measured window {why}; repeat, or measure more steps")
    if raw.loader_limit is not None and raw.wall_s > 0:
        rate = raw.samples / raw.wall_s
        if rate > raw.loader_limit * LOADER_OVER * raw.steps / max(1, raw.steps - cycle):
            problems.append(f"{LOADER_NOTE}: the window read {rate:,.0f} samples/s, but "
                            f"{workers} workers deliver at most {raw.loader_limit:,.0f} (measured in them): "
                            "it drained batches buffered before it; not a clean figure, measure more steps")
    return problems


def page_fault_note(share: float, per_step: float, knobs: Knobs) -> str:
    """The note for a window whose process spent `share` of its CPU time in the kernel."""
    head = (f"page faults: the kernel took {share:.0%} of this process's CPU time ({per_step:,.0f} page faults "
            "per step)")
    if traits(knobs)["workers"]:  # worker batches arrive in shared memory, mapped afresh each time
        return head + "; with workers part of it is each batch's shared memory being mapped in"
    if knobs.world_size > 1:  # gloo's sockets are kernel time too
        return head + "; with several ranks part of it is the gradient exchange between the processes"
    if keeps_freed_memory():  # what still faults: allocations above glibc's mmap ceiling, mapped fresh each time
        return (head + f" although malloc keeps freed memory here: allocations above {KEEP_MMAP_BYTES >> 20} MiB "
                "are still mapped afresh every step; a smaller batch, or bench.run(allocator='tcmalloc') (a fresh process), "
                "avoids it (docs/measurement.md 'Page faults')")
    if malloc_settled():  # glibc's thresholds at their ceiling: what still faults is above them
        return (head + f": blocks above {KEEP_MMAP_BYTES >> 20} MiB are mapped afresh every step, and free memory "
                f"above {2 * KEEP_MMAP_BYTES >> 20} MiB at the heap's top goes back to the OS (glibc's ceilings, where "
                "the trial fixed its thresholds); measure allocator='glibc-kept' (keeps up to "
                f"{KEEP_TRIM_BYTES >> 30} GiB) or 'tcmalloc', each in a process started in it (docs/measurement.md "
                "'Page faults')")
    if ran_in() == "worker":  # the workbench's worker process: the kernel's mallopt does not reach it
        return (head + ": freed memory went back to the OS and each step faulted it in again. Whether that "
                "happens depends on what ran before in the process, so the same knobs can read faster in "
                "another trial or in your own loop; measure the allocator modes, each in a process started "
                "in it: bench.run(allocator='glibc-kept') or 'tcmalloc' (docs/measurement.md 'Page faults')")
    return (head + ": freed memory went back to the OS and each step faulted it in again. Whether that "
            "happens depends on what ran before in this process, so the same knobs can read faster in "
            "another trial or in your own loop; to avoid it from now on in this process, call "
            "wb.keep_freed_memory(), or start Python (or Jupyter) with "
            f"{MALLOC_ENV} (glibc); or measure the allocator modes, each in a fresh process: "
            "bench.run(allocator='glibc-kept') or 'tcmalloc' (docs/measurement.md 'Page faults')")


def check_cancel(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise Stopped


_OOM_TEXT = ("out of memory", "can't allocate memory", "DefaultCPUAllocator", "not enough memory")


def is_oom(e: BaseException) -> bool:
    if isinstance(e, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(e, RuntimeError) and any(t in str(e) for t in _OOM_TEXT)


WHERE = {
    "setup": "while building the trial (model copy, wrappers)",
    "optimizer": "in the optimizer",
    "data": "in the data pipeline (Dataset.__getitem__, collate or a worker)",
    "model": "in the model's forward",
    "loss": "in the loss function",
    "step_fn": "in step_fn",
    "backward": "in backward",
    "comm": "in DDP set-up or a collective (all-reduce, barrier)",
}


_SHAPE_TEXT = ("shape", "size mismatch", "sizes", "dtype", "dimension", "mat1", "mat2", "expected scalar type",
               "must match the size", "expected input")


def looks_like_shape_error(e: BaseException) -> bool:
    """Whether the exception is plausibly about tensor shapes or dtypes (torch's own wording), so
    "check the shapes" helps; a user's own exception (RuntimeError("rank 1 only")) is not."""
    text = str(e).lower()
    return isinstance(e, (RuntimeError, ValueError, TypeError, IndexError)) and any(t in text for t in _SHAPE_TEXT)


def failure_message(status: str, e: BaseException, stage: Stage, knobs: Knobs) -> str:
    """One line: what failed, where (stage), when (phase and step), and what to try."""
    where = WHERE.get(stage.name, f"in {stage.name}")
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    if stage.name == "data" and traits(knobs)["workers"] and isinstance(e, (ConnectionError, EOFError)):
        # a worker killed mid-send: the pipe breaks before torch notices the dead process
        text = f"a DataLoader worker exited while sending a batch ({text or type(e).__name__})"
    if status == "oom":
        hint = "try amp='bf16', a smaller batch_size with accum_steps, or checkpoint the largest blocks"
        return f"out of memory {where} {stage.when()}: {hint}"
    hints = {
        "data": "run with num_workers=0 to see the dataset's own traceback; check __getitem__ and collate_fn",
        "step_fn": "call step_fn(model, batch) on one batch yourself to debug it",
    }
    if looks_like_shape_error(e):  # a guess only where the error itself is about shapes or dtypes
        hints["model"] = "check the batch's shapes and dtypes against the model's inputs"
        hints["loss"] = "check the model's output shape against the target"
    if isinstance(e, RuntimeError) and "modified by an inplace operation" in text:
        hints["backward"] = "an in-place op on a tensor autograd needs is the usual cause"
    if stage.name in ("model", "step_fn") and traits(knobs)["compiles"] and "torch._dynamo" in traceback.format_exc():
        hints[stage.name] = "torch.compile failed: run with compile='off' to confirm, then see the traceback"
    hint = hints.get(stage.name, "see result.traceback")
    return f"{type(e).__name__} {where} {stage.when()}: {text} ({hint})"
