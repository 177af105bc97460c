"""run_trial: one honest measured run of the user's training step under one set of Knobs.

    fresh model copy + seeded loader  ->  warm-up steps (not measured; the last one is profiled
    for peak memory on CPU)  ->  sync  ->  N measured optimizer steps  ->  sync  ->  TrialResult

Every failure (OOM, an exception in user code, NaN loss, a stop request) ends the trial with a
status and a message instead of propagating; KeyboardInterrupt is recorded, then re-raised as
TrialInterrupted so the notebook cell still stops.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import gc
import math
import os
import random
import statistics
import threading
import time
import traceback
import typing
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.profiler import record_function

from . import apply
from . import trace as tracing
from .knobs import Knobs, device_notes
from .measure import (
    FOREIGN_LOAD_LIMIT,
    CpuLoad,
    StepClock,
    TrialResult,
    environment,
    live_tensor_bytes,
    now_iso,
    profile_peak_bytes,
    release_free_memory,
    summarize,
    sync,
)
from .workload import Workload, batch_size_of, move_to

Progress = Callable[[str, int, int], None]  # (phase, steps done, steps total)
NOISY = 0.10  # IQR / median above this gets a "noisy" note
TRACE_STEPS = 3  # optimizer steps in a trace (after one profiler warm-up step)
_NO_RANGE = contextlib.nullcontext()  # stands in for record_function outside traced steps


class TrialInterrupted(KeyboardInterrupt):
    """A KeyboardInterrupt that carries the recorded (interrupted) TrialResult."""

    def __init__(self, result: TrialResult) -> None:
        super().__init__("trial interrupted")
        self.result = result


class _Stopped(Exception):
    """Raised at a step boundary when the caller's cancel event is set."""


class _Stage:
    """Where the trial is, so a failure can say which part of the user's code raised, and when."""

    name = "setup"  # setup | data | model | loss | step_fn | backward | optimizer
    phase = "setup"  # setup | warm-up | measured
    step = 0  # 1-based step within the phase

    def when(self) -> str:
        return "while setting up" if self.phase == "setup" else f"at {self.phase} step {self.step}"


def run_trial(
    workload: Workload,
    knobs: Knobs,
    *,
    warmup_steps: int = 5,
    steps: int = 30,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
    measure_memory: bool = True,
    loader_timeout_s: float = 120.0,
    trace: bool = False,
    trace_dir: str | os.PathLike | None = None,
) -> TrialResult:
    """Run warm-up + `steps` measured optimizer steps; never raises for a failing trial.

    `trace=True` then profiles TRACE_STEPS more steps (after the window, never inside it) into a
    Chrome-trace JSON in `trace_dir` (default: the temp dir) and sets `result.trace_path`.

    Raises ValueError for knobs that cannot apply to this workload (unknown block, batch larger
    than the dataset) and TrialInterrupted on KeyboardInterrupt (after recording the result).
    """
    if steps < 1 or warmup_steps < 0:
        raise ValueError(f"steps must be >= 1 and warmup_steps >= 0, got steps={steps}, warmup_steps={warmup_steps}")
    check_knobs(workload, knobs)
    device = workload.device
    notes = device_notes(knobs, device.type, has_conv=workload.has_conv)
    for note in notes:
        if note.startswith("amp='fp16' on CPU"):
            warnings.warn(note, stacklevel=3)  # a trap worth more than a quiet note
    started = now_iso()
    stage = _Stage()
    state: dict[str, Any] = {}  # every object that holds memory or processes, freed in `finally`
    report = progress or (lambda phase, done, total: None)
    total = warmup_steps + steps
    try:
        with apply.process_settings(knobs), _seeded(workload.seed):
            env = environment(device)
            trace_to = tracing.trace_file(trace_dir, type(workload.pristine).__name__) if trace else None
            result = _measure(workload, knobs, warmup_steps, steps, report, cancel, measure_memory,
                              loader_timeout_s, stage, state, notes, trace_to)
            return TrialResult(knobs=knobs, env=env, started_at=started, **result)
    except KeyboardInterrupt as e:
        state["failed"] = True
        res = _failure(knobs, "interrupted", f"interrupted by the user {stage.when()}", stage, e, notes, started, device)
        raise TrialInterrupted(res) from None
    except _Stopped:
        state["failed"] = True
        return _failure(knobs, "interrupted", f"stopped by the user {stage.when()}", stage, None, notes, started, device)
    except Exception as e:  # a failing trial is a result, whatever raised
        state["failed"] = True
        if "DataLoader worker" in str(e) or "DataLoader timed out" in str(e):
            stage.name = "data"  # raised asynchronously (SIGCHLD handler / timeout), wherever we were
        status = "oom" if _is_oom(e) else "error"
        return _failure(knobs, status, _message(status, e, stage, knobs), stage, e, notes, started, device)
    finally:
        apply.shutdown_loader(state.get("loader"), state.get("iterator"))
        apply.remove_checkpointing(state.get("model"), knobs.checkpoint)  # breaks a reference cycle
        failed = state.get("failed", False)
        state.clear()
        if failed or knobs.compile != "off":
            gc.collect()  # tracebacks and compiled graphs hold cycles; plain trials free by refcount
        release_free_memory()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        report("done", total, total)


_TRIAL_THREAD: concurrent.futures.ThreadPoolExecutor | None = None


def trial_thread() -> concurrent.futures.ThreadPoolExecutor:
    """The single thread every Workbench runs its trials on (one at a time, one OpenMP pool)."""
    global _TRIAL_THREAD
    if _TRIAL_THREAD is None:
        _TRIAL_THREAD = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="workbench-trial")
    return _TRIAL_THREAD


def check_knobs(workload: Workload, knobs: Knobs) -> None:
    """Knob checks that need the workload: block names exist, the dataset holds one batch."""
    if not isinstance(knobs, Knobs):
        raise TypeError(f"expected Knobs, got {type(knobs).__name__}")
    for name in knobs.checkpoint:
        if name not in workload.blocks:
            raise ValueError(
                f"checkpoint names unknown block {name!r}; choose from bench.blocks: "
                f"{', '.join(workload.blocks) or '(none found)'}"
            )
    if not workload.spec.iterable and len(workload.spec) < knobs.batch_size:
        raise ValueError(
            f"the dataset has {len(workload.spec)} samples, fewer than batch_size={knobs.batch_size}: "
            f"lower batch_size to at most {len(workload.spec)} (or add data)"
        )


def _measure(workload, knobs, warmup_steps, steps, report, cancel, measure_memory, loader_timeout_s,
             stage, state, notes, trace_to=None) -> dict[str, Any]:
    device = workload.device
    non_blocking = knobs.pin_memory and device.type == "cuda"
    total = warmup_steps + steps

    # ---- build: fresh model, wrappers, optimizer, loader -----------------------------------
    stage.name = "setup"
    model = workload.fresh_model()
    if knobs.channels_last:
        model = model.to(memory_format=torch.channels_last)
    apply.apply_checkpointing(model, knobs.checkpoint, workload.blocks)
    stage.name = "optimizer"
    optimizer = workload.check_optimizer(model)
    model.train()
    step_model = apply.compile_model(model, knobs, device)
    scaler = apply.grad_scaler(knobs, device)
    state.update(model=model, optimizer=optimizer, step_model=step_model)

    report("starting workers" if knobs.num_workers else "loading data", 0, total)
    loader = apply.build_loader(workload.spec, knobs, seed=workload.seed, device=device,
                                timeout_s=loader_timeout_s if knobs.num_workers else 0)
    state["loader"] = loader
    epochs = 0
    cached: list[Any] = []

    def next_batch() -> Any:
        nonlocal epochs
        if cached:
            return cached[0]
        stage.name = "data"
        try:
            batch = next(state["iterator"])
        except StopIteration:
            epochs += 1  # an epoch boundary: non-persistent workers are re-forked here
            state["iterator"] = apply.start_iterator(loader)
            try:
                batch = next(state["iterator"])
            except StopIteration:
                raise ValueError("the data loader yields no batches: the dataset is empty or shorter than one batch with drop_last") from None
        batch = move_to(batch, device, non_blocking=non_blocking, channels_last=knobs.channels_last)
        if knobs.data == "cached":
            cached.append(batch)  # the short-circuit test: one batch, already on the device
        return batch

    t0 = time.perf_counter()
    state["iterator"] = apply.start_iterator(loader)
    first = next_batch()
    sync(device)
    startup_s = time.perf_counter() - t0
    pending = [first]  # the first batch is consumed by the first step

    def get_batch() -> Any:
        return pending.pop() if pending else next_batch()

    # record_function ranges name the phases in a trace; only the traced steps after the window
    # open them (the measured steps pay one `if` per phase)
    traced = False

    def phase(name: str) -> Any:
        return record_function(name) if traced else _NO_RANGE

    def one_step(losses: list[torch.Tensor] | None, waits: list[float] | None) -> None:
        """One optimizer step = accum_steps micro-batches; appends its loss and data wait."""
        wait = 0.0
        step_loss = None
        for _ in range(knobs.accum_steps):
            tw = time.perf_counter()
            with phase("data"):
                batch = get_batch()
            wait += time.perf_counter() - tw  # host time blocked on data (includes the H2D copy)
            state["samples"] = state.get("samples", 0) + batch_size_of(batch)
            with phase("forward"), apply.autocast(knobs, device):
                loss = workload.compute_loss(step_model, batch, stage)
            _check_loss(loss, stage)
            stage.name = "backward"
            scaled = loss / knobs.accum_steps if knobs.accum_steps > 1 else loss  # no extra op at k=1
            with phase("backward"):
                (scaler.scale(scaled) if scaler is not None else scaled).backward()
            step_loss = loss.detach() if step_loss is None else step_loss + loss.detach()
        stage.name = "optimizer"
        with phase("optimizer"):
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if losses is not None:
            losses.append(step_loss)  # stays on the device: no sync; averaged once at the end
        if waits is not None:
            waits.append(wait)
        if cancel is not None and cancel.is_set():
            raise _Stopped

    # ---- warm-up: compile, allocator growth, worker pipelines fill; not measured -----------
    peak_bytes = None
    probe_s = 0.0
    warm_times: list[float] = []
    watch = _compile_watch(knobs)  # graph breaks, recompiles, fallbacks of a compiled trial
    watch.__enter__()
    t_warm = time.perf_counter()
    for i in range(warmup_steps):
        stage.phase, stage.step = "warm-up", i + 1
        report("compiling" if knobs.compile != "off" and i == 0 else "warming up", i, total)
        probe = measure_memory and device.type == "cpu" and i == warmup_steps - 1
        tw = time.perf_counter()
        if probe:
            before = live_tensor_bytes(list(model.parameters()), [p.grad for p in model.parameters()],
                                       optimizer.state, cached)
            peak_bytes = before + profile_peak_bytes(lambda: one_step(None, None), device)
            probe_s = time.perf_counter() - tw
        else:
            one_step(None, None)
            sync(device)
            warm_times.append(time.perf_counter() - tw)

    warmup_wall_s = time.perf_counter() - t_warm

    # ---- the measured window, bracketed by device syncs ------------------------------------
    report("measuring", warmup_steps, total)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    sync(device)
    state["samples"] = 0
    losses: list[torch.Tensor] = []
    waits: list[float] = []
    clock = StepClock(device)
    load = CpuLoad()
    t_start = time.perf_counter()
    clock.mark()
    for i in range(steps):
        stage.phase, stage.step = "measured", i + 1
        one_step(losses, waits)
        clock.mark()  # CUDA: an event after the optimizer step; CPU: perf_counter
        report("measuring", warmup_steps + i + 1, total)
    sync(device)
    wall = time.perf_counter() - t_start
    foreign = load.foreign_cores()
    step_times = clock.durations_s()
    # the one device->host read of the losses (each summed over its micro-batches)
    loss_values = (torch.stack(losses).float() / knobs.accum_steps).cpu().tolist()
    if device.type == "cuda" and measure_memory:
        peak_bytes = torch.cuda.max_memory_allocated(device)
    samples = state["samples"]
    watch.__exit__(None, None, None)  # only on success: a failed trial reports its exception instead

    # ---- trace: a few more steps under the profiler, after the window (never measured) -----
    trace_info: dict[str, Any] = {}
    if trace_to is not None:
        report("tracing", total, total)
        stage.phase = "trace"
        traced = True
        window_epochs = epochs  # the notes below are about the window, not the traced steps
        try:
            files = tracing.capture(lambda: one_step(None, None), trace_to, device=device, steps=TRACE_STEPS)
            trace_info = {"trace_path": str(files.path), "steps": files.steps,
                          "memory_snapshot": str(files.memory_snapshot) if files.memory_snapshot else None,
                          "memory_html": str(files.memory_html) if files.memory_html else None}
            notes.extend(files.notes)
        except _Stopped:
            notes.append("no trace: stopped by the user after the measured window")
        except Exception as e:  # the measured result stands; only the trace is missing
            notes.append(f"no trace: {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}")
        finally:
            traced = False
            epochs = window_epochs

    # ---- derive statistics from the raw samples --------------------------------------------
    median, iqr = summarize(step_times)
    noise = iqr / median if median else 0.0
    if noise > NOISY:
        notes.append(f"noisy: step times spread {noise:.0%} (IQR/median); repeat before trusting a small difference")
    if foreign is not None and foreign > FOREIGN_LOAD_LIMIT:
        notes.append(f"disturbed: other processes kept {foreign:.2f} cores busy during the measurement")
    if epochs and not knobs.persistent_workers and knobs.num_workers:
        which = "an epoch boundary" if epochs == 1 else f"{epochs} epoch boundaries"
        notes.append(f"{which} in the window re-forked the workers (persistent_workers=True avoids it)")
    steady = statistics.median(step_times)  # compile_s = warm-up time beyond steady-state steps
    compile_s = max(0.0, sum(warm_times) - steady * len(warm_times)) if warm_times else 0.0
    status, message = "ok", ""
    bad = [i for i, x in enumerate(loss_values) if not math.isfinite(x)]
    if bad:
        status = "nan"
        message = (f"loss became {loss_values[bad[0]]} at measured step {bad[0] + 1}: lower the learning "
                   "rate, clip gradients, check input normalisation"
                   + ("; with fp16 keep the GradScaler (it is on)" if knobs.amp == "fp16" else ""))
    extra = {"epochs": epochs, "warmup_steps": warmup_steps, "wall_s": wall, "foreign_cores": foreign,
             "warmup_wall_s": warmup_wall_s, "memory_probe_s": probe_s}
    if trace_info:
        extra["trace"] = trace_info
    if watch.info:
        extra["compile"] = watch.info
        if watch.info.get("graph_breaks"):
            notes.append(f"torch.compile: {watch.info['graph_breaks']} graph break(s); see bench.diagnose()")
        if watch.info.get("recompiles"):
            notes.append(f"torch.compile: {watch.info['recompiles']} recompile(s) (dynamic shapes?)")
    return dict(
        status=status,
        message=message,
        samples_per_s=samples / wall,
        step_time_s=median,
        step_time_iqr_s=iqr,
        step_times_s=tuple(step_times),
        data_wait_s=tuple(waits),
        data_wait_share=min(1.0, sum(waits) / wall),
        peak_memory_bytes=peak_bytes,
        startup_s=startup_s,
        compile_s=compile_s,
        samples_per_step=round(samples / steps),
        losses=tuple(loss_values),
        notes=tuple(notes),
        extra=extra,
        trace_path=trace_info.get("trace_path"),
    )


def _compile_watch(knobs: Knobs) -> Any:
    """CompileWatch for compiled trials (imported lazily: plain trials never load dynamo)."""
    if knobs.compile == "off":
        return _NoWatch()
    from .diagnose.compile import CompileWatch

    return CompileWatch(enabled=True)


class _NoWatch:
    """Stands in for CompileWatch when nothing is compiled."""

    info: typing.ClassVar[dict] = {}

    def __enter__(self) -> _NoWatch:
        return self

    def __exit__(self, *exc: object) -> bool:
        return False


def _check_loss(loss: Any, stage: _Stage) -> None:
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise TypeError(
            f"the loss must be a scalar tensor, got {shape}: reduce it (loss_fn with reduction='mean', "
            "or return loss.mean() from step_fn)"
        )
    if not loss.requires_grad:
        raise TypeError("the loss does not require grad: it is not computed from the model's trainable parameters")


_OOM_TEXT = ("out of memory", "can't allocate memory", "DefaultCPUAllocator", "not enough memory")


def _is_oom(e: BaseException) -> bool:
    if isinstance(e, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(e, RuntimeError) and any(t in str(e) for t in _OOM_TEXT)


_WHERE = {
    "setup": "while building the trial (model copy, wrappers)",
    "optimizer": "in the optimizer",
    "data": "in the data pipeline (Dataset.__getitem__, collate or a worker)",
    "model": "in the model's forward",
    "loss": "in the loss function",
    "step_fn": "in step_fn",
    "backward": "in backward",
}


def _message(status: str, e: BaseException, stage: _Stage, knobs: Knobs) -> str:
    where = _WHERE.get(stage.name, f"in {stage.name}")
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    if status == "oom":
        hint = "try amp='bf16', a smaller batch_size with accum_steps, or checkpoint the largest blocks"
        return f"out of memory {where} {stage.when()}: {hint}"
    hints = {
        "data": "run with num_workers=0 to see the dataset's own traceback; check __getitem__ and collate_fn",
        "model": "check the batch's shapes and dtypes against the model's inputs",
        "loss": "check the model's output shape against the target",
        "step_fn": "call step_fn(model, batch) on one batch yourself to debug it",
        "backward": "an in-place op on a tensor autograd needs is the usual cause",
    }
    if stage.name in ("model", "step_fn") and knobs.compile != "off" and "torch._dynamo" in traceback.format_exc():
        hints[stage.name] = "torch.compile failed: run with compile='off' to confirm, then see the traceback"
    hint = hints.get(stage.name, "see result.traceback")
    return f"{type(e).__name__} {where} {stage.when()}: {text} ({hint})"


def _failure(knobs, status, message, stage, exc, notes, started, device) -> TrialResult:
    tb = "".join(traceback.format_exception(exc)) if exc is not None else ""
    return TrialResult(knobs=knobs, status=status, message=message, notes=tuple(notes),
                       env=environment(device), started_at=started, where=stage.name, traceback=tb)


class _seeded:
    """Seed torch/random/numpy for the trial and restore the caller's RNG states afterwards."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def __enter__(self) -> None:
        self._torch = torch.random.get_rng_state()
        self._cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        self._py = random.getstate()
        try:
            import numpy as np

            self._np = np.random.get_state()
            np.random.seed(self.seed)
        except ImportError:
            self._np = None
        random.seed(self.seed)
        torch.manual_seed(self.seed)

    def __exit__(self, *exc: object) -> None:
        torch.random.set_rng_state(self._torch)
        if self._cuda is not None:
            torch.cuda.set_rng_state_all(self._cuda)
        random.setstate(self._py)
        if self._np is not None:
            import numpy as np

            np.random.set_state(self._np)
