"""The one training step: where batches come from (BatchSource) and what one optimizer step does
(TrainStep). `run_trial`, every analysis in `diagnose/` and `tune` build their steps from here, so
a knob that changes the step is applied in exactly one place.

    source = BatchSource(workload, knobs)            # loader, epochs, timeout, cached, device move
    step = TrainStep(workload, knobs)                # model copy, wrappers, optimizer, autocast, scaler
    out = step(source)                               # one optimizer step = accum_steps micro-batches

Nothing here times anything or reports progress: the runner does that around `step(...)`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.profiler import record_function
from torch.utils.data import DataLoader

from . import compat
from .knobs import (
    Knobs,
    adjust_optimizer,
    context,
    forward_hooks,
    loader_kwargs,
    make_scaler,
    move_kwargs,
    release_model,
    settings,
    step_hooks,
    traits,
    transform_model,
    wrap_model,
)
from .loadmeter import LoaderMeter
from .measure import CopyClock
from .tokens import Count, TokenMeter, count, token_window
from .workload import LoaderSpec, Workload, batch_size_of, move_to

NoSync = Callable[[], contextlib.AbstractContextManager]  # e.g. DistributedDataParallel.no_sync
_NO_CONTEXT = contextlib.nullcontext()  # reusable: the measured step allocates no context objects


class Stage:
    """Where the step is, so a failure can say which part of the user's code raised, and when."""

    name = "setup"  # setup | data | model | loss | step_fn | backward | optimizer
    phase = "setup"  # setup | warm-up | measured
    step = 0  # 1-based step within the phase

    def when(self) -> str:
        return "while setting up" if self.phase == "setup" else f"at {self.phase} step {self.step}"


def check_loss(loss: Any, stage: Stage | None = None) -> None:
    """Raise TypeError naming the fix unless `loss` is a scalar tensor that requires grad."""
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise TypeError(
            f"the loss must be a scalar tensor, got {shape}: reduce it (loss_fn with reduction='mean', "
            "or return loss.mean() from step_fn)"
        )
    if not loss.requires_grad:
        raise TypeError("the loss does not require grad: it is not computed from the model's trainable parameters")


def build_loader(spec: LoaderSpec, knobs: Knobs, *, seed: int, device: torch.device, timeout_s: float = 0,
                 sampler: Any = None, meter: LoaderMeter | None = None, workload: Workload | None = None,
                 window_steps: int | None = None) -> DataLoader:
    """A DataLoader over the user's dataset with the knobs' keywords and a seeded data order.

    The generator fixes both the shuffle order and the workers' base seeds, so every trial with
    the same seed sees the same batches in the same order. `sampler` replaces the spec's sampler
    and shuffle (a DistributedSampler: each rank reads its own shard). Workers, pinning,
    persistence, prefetch, the worker timeout and the length knobs' sampler and collate come from
    the data knobs' hooks (knobs/data.py). `meter` (with workers) times what the workers do, for
    the loader-limit check. `window_steps` (a measured trial on token data whose lengths vary):
    the loader cycles through a length-stratified sample of batches (tokens.TokenWindow).
    """
    kwargs: dict[str, Any] = dict(batch_size=knobs.batch_size, collate_fn=spec.collate_fn, drop_last=spec.drop_last,
                                  generator=torch.Generator().manual_seed(seed))
    about = workload.context_kwargs() if workload is not None else {"spec": spec}
    window = None
    if window_steps and about.get("token_data") and sampler is None and spec.sampler is None and not spec.iterable:
        window = token_window(spec.dataset, batch_size=knobs.batch_size, accum_steps=knobs.accum_steps,
                              steps=window_steps, seed=seed)
    kwargs.update(loader_kwargs(knobs, context(knobs, device, loader_timeout_s=timeout_s, window=window, **about)))
    if window is not None and "batch_sampler" not in kwargs:
        kwargs["batch_sampler"] = window.sampler(grouped=False)
    timed = meter is not None and kwargs.get("num_workers", 0) > 0
    if timed:
        kwargs["collate_fn"] = meter.collate(kwargs["collate_fn"])
    if "batch_sampler" in kwargs:  # exclusive with batch_size, drop_last, shuffle and sampler
        kwargs.pop("batch_size")
        kwargs.pop("drop_last")
    elif not spec.iterable and "sampler" not in kwargs:
        if sampler is not None or spec.sampler is not None:
            kwargs["sampler"] = sampler if sampler is not None else spec.sampler
        else:
            kwargs["shuffle"] = spec.shuffle
    return DataLoader(meter.dataset(spec.dataset) if timed else spec.dataset, **kwargs)


class BatchSource:
    """Batches on the device, forever: the user's data through a DataLoader built from the knobs,
    restarted at each epoch end; with data='cached', the first batch again and again.

    `epochs` counts the restarts (non-persistent workers are re-forked at each one). `sampler`
    replaces the workload's sampler (a DistributedSampler); a sampler with `set_epoch` is told
    the epoch at every (re)start, so each epoch is shuffled differently and alike on every rank.
    """

    def __init__(self, workload: Workload, knobs: Knobs, *, timeout_s: float = 120.0,
                 stage: Stage | None = None, sampler: Any = None, window_steps: int | None = None) -> None:
        self.device = workload.device
        self.knobs = knobs
        self.stage = stage or Stage()
        # the device move's keywords (pinned memory -> non_blocking, channels_last) from the knobs' hooks
        self.move = move_kwargs(knobs, context(knobs, self.device))
        # with workers, what they can deliver is measured (the loader-limit check of a trial)
        workers = traits(knobs)["workers"]
        self.meter = LoaderMeter(workers) if workers and knobs.data != "cached" else None
        self.loader = build_loader(workload.spec, knobs, seed=workload.seed, device=self.device, timeout_s=timeout_s,
                                   sampler=sampler, meter=self.meter, workload=workload, window_steps=window_steps)
        self.tokens = TokenMeter()  # token batches: tokens, slots and sequences of every batch delivered
        self.last: Count | None = None  # the figures of the batch next() returned last
        self.wait_s = 0.0  # host seconds the last next() spent in the loader (the device copy apart)
        # in an armed (measured) window: each copy's own cost, and on CUDA the device's idle time in the loader
        self.copies = CopyClock(self.device)
        self.iterator: Iterator | None = None
        self.epochs = 0
        self.notes: list[str] = []  # fallbacks taken (see compat)
        self._cached: Any = None
        self._pending: list[Any] = []

    def _start(self) -> None:
        sampler = getattr(self.loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(self.epochs)  # DistributedSampler: a new shuffle per epoch, same on every rank
        self.iterator = iter(self.loader)
        note = compat.unregister_workers(self.iterator)
        if note and note not in self.notes:
            self.notes.append(note)

    def next(self) -> Any:
        """The next batch, moved to the device (channels_last applied to 4-D float tensors); its token
        figures (read on the host before the move) go into `self.tokens` and `self.last`."""
        self.wait_s = 0.0
        if self._pending:
            batch, self.last = self._pending.pop()
            self.tokens.add(self.last)
            return batch
        if self._cached is not None:
            self.tokens.add(self.last)
            return self._cached
        self.stage.name = "data"
        self.copies.begin()  # CUDA: an event as the host enters the loader (the device's idle is timed from it)
        t0 = time.perf_counter()
        if self.iterator is None:
            self._start()
        try:
            batch = next(self.iterator)
        except StopIteration:
            self.epochs += 1  # an epoch boundary: non-persistent workers are re-forked here
            self._start()
            try:
                batch = next(self.iterator)
            except StopIteration:
                raise ValueError("the data loader yields no batches: the dataset is empty or shorter "
                                 "than one batch with drop_last") from None
        self.last = count(batch)
        self.tokens.add(self.last)
        self.wait_s = time.perf_counter() - t0  # the loader: next() on the iterator (a restart included)
        # The copy is timed apart (CopyClock): on CUDA a pageable copy blocks the host until every
        # kernel queued before it ran (sync point); that drain is compute, only the copy's device time is data.
        # On CUDA the loader's data wait is the device's idle time from begin() to the copy, not wait_s.
        with self.copies.timed():
            batch = move_to(batch, self.device, **self.move)
        if self.knobs.data == "cached":
            self._cached = batch  # the short-circuit test: one batch, already on the device
        return batch

    def push_back(self, batch: Any) -> None:
        """Return a batch to the source: the next `next()` gives it again (the startup batch)."""
        self._pending.append((batch, self.last))

    @property
    def cached(self) -> list[Any]:
        """The cached batch as a list (empty in loader mode), for memory accounting."""
        return [] if self._cached is None else [self._cached]

    def close(self) -> None:
        """Stop the worker processes now (not at garbage collection)."""
        compat.shutdown_workers(self.loader, self.iterator)
        self.iterator = None
        self._cached = None

    def __enter__(self) -> BatchSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LossBuffer:
    """Per-step losses kept on the device, in storage this buffer owns.

    With compile='reduce-overhead' (CUDA graphs) the tensor behind `loss.detach()` belongs to the
    graph's memory pool and is overwritten by the next replay, so keeping that tensor would report
    the last step's loss for every step. Adding it into a preallocated buffer copies the value out
    (one tiny device op, no host sync); `values()` is the one device->host read, at the end.
    """

    def __init__(self, steps: int, device: torch.device) -> None:
        self.sums = torch.zeros(steps, dtype=torch.float32, device=device)  # sum of micro-batch losses
        self.count = 0

    def add(self, step: int, loss: torch.Tensor) -> None:
        """Add one micro-batch's loss into step `step` (0-based)."""
        self.sums[step].add_(loss.detach())
        self.count = max(self.count, step + 1)

    def values(self, divide_by: int = 1) -> list[float]:
        """Host floats of the filled steps (each sum divided by `divide_by`, e.g. accum_steps)."""
        return (self.sums[: self.count] / divide_by).cpu().tolist()


@dataclass
class StepOutput:
    """What one optimizer step reports: its samples and the host seconds spent in the loader (the device
    copies' own cost, and on CUDA the device's idle time in the loader, are read at the end of the window
    from source.copies)."""

    samples: int
    wait_s: float


class TrainStep:
    """One optimizer step of the user's model under the knobs: a fresh model copy with
    channels_last, checkpointing, torch.compile, autocast, GradScaler and gradient accumulation.

    `label_phases=True` wraps data / forward / backward / optimizer in `record_function` ranges
    (for traces and the profiler; keep it off in a measured window). `no_sync`, if given, is a
    factory for a context manager entered on every micro-batch but the last of an optimizer step
    (DistributedDataParallel.no_sync: skip the gradient all-reduce until the last one). `wrap`,
    if given, is `(model, ctx) -> module`: a rank's strategy around the model copy, applied after the
    knobs' model hooks and before the optimizer and torch.compile (launch/strategy.py).
    """

    def __init__(self, workload: Workload, knobs: Knobs, *, stage: Stage | None = None, compile: bool = True,
                 label_phases: bool = False, no_sync: NoSync | None = None,
                 wrap: Callable[[torch.nn.Module, Any], torch.nn.Module] | None = None) -> None:
        self.workload = workload
        self.knobs = knobs
        self.device = workload.device
        self.stage = stage or Stage()
        self.label_phases = label_phases
        self.no_sync = no_sync
        self.notes: list[str] = []
        self.stage.name = "setup"
        # what every knob hook sees: the device, the blocks, where notes go
        self.ctx = context(knobs, self.device, blocks=workload.blocks, notes=self.notes, has_conv=workload.has_conv)
        # the knobs' on_model hooks on a fresh copy: channels_last, checkpoint wrappers, your @wb.knob functions
        model = self.model = transform_model(workload.fresh_model(), knobs, self.ctx)
        if wrap is not None:  # a rank's data-parallel strategy (DDP, FSDP2's fully_shard) around the copy
            self.stage.name = "comm"
            model = wrap(model, self.ctx)
        self.stage.name = "optimizer"  # built on the wrapped module: FSDP2 replaced the parameters by shards
        self.optimizer = adjust_optimizer(workload.check_optimizer(model), knobs, self.notes, self.ctx)
        model.train()
        # instrumenting a compiled step measures the compiler, so analyses pass compile=False
        self.step_model = wrap_model(model, knobs, self.ctx) if compile else model
        self.scaler = make_scaler(knobs, self.ctx)  # fp16's GradScaler, or None
        self.forward_hooks = forward_hooks(knobs, self.ctx)  # contexts around each forward + loss (autocast...)
        self.step_hooks = step_hooks(knobs, self.ctx)  # after backward, before optimizer.step

    def _forward_context(self) -> contextlib.AbstractContextManager:
        if not self.forward_hooks:
            return _NO_CONTEXT
        stack = contextlib.ExitStack()
        for make in self.forward_hooks:
            stack.enter_context(make())
        return stack

    def _label(self, name: str) -> contextlib.AbstractContextManager:
        return record_function(name) if self.label_phases else _NO_CONTEXT

    def forward_backward(self, batch: Any) -> torch.Tensor:
        """Forward + loss + backward of one micro-batch (loss / accum_steps); returns the loss."""
        k = self.knobs
        with self._label("forward"), self._forward_context():
            loss = self.workload.compute_loss(self.step_model, batch, self.stage)
        check_loss(loss, self.stage)
        self.stage.name = "backward"
        with self._label("backward"):
            scaled = loss / k.accum_steps if k.accum_steps > 1 else loss  # no extra op at k=1
            (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
        return loss

    def optimizer_step(self) -> None:
        """optimizer.step (through the GradScaler for fp16), then zero_grad(set_to_none=True)."""
        self.stage.name = "optimizer"
        with self._label("optimizer"):
            if self.step_hooks:
                if self.scaler is not None:
                    self.scaler.unscale_(self.optimizer)  # the hooks see the true gradients
                for hook in self.step_hooks:
                    hook(self.model, self.optimizer)
            if self.scaler is not None:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)

    def __call__(self, source: BatchSource, losses: LossBuffer | None = None, index: int = 0) -> StepOutput:
        """One optimizer step = accum_steps micro-batches from `source`; each micro-batch's loss
        is added into `losses[index]` when a buffer is given (it stays on the device: no sync)."""
        wait = 0.0
        samples = 0
        k = self.knobs.accum_steps
        for micro in range(k):
            tw = time.perf_counter()
            with self._label("data"):
                batch = source.next()
            # the loader's host seconds (BatchSource.wait_s: the copy is timed apart, by source.copies);
            # a source without that figure: the host seconds in next()
            wait += getattr(source, "wait_s", time.perf_counter() - tw)
            told = getattr(source, "last", None)  # a packed row holds several samples
            samples += told.sequences if told is not None else batch_size_of(batch)
            skip_sync = self.no_sync is not None and micro < k - 1
            with self.no_sync() if skip_sync else _NO_CONTEXT:
                loss = self.forward_backward(batch)
            if losses is not None:
                losses.add(index, loss)
        copies = getattr(source, "copies", None)
        if copies is not None:
            copies.end_step()
        self.optimizer_step()
        return StepOutput(samples=samples, wait_s=wait)

    def close(self) -> None:
        """Undo the checkpoint wrappers (each refers back to its block: a reference cycle)."""
        release_model(self.model, self.knobs, self.ctx)  # checkpoint wrappers refer back to their blocks

    def __enter__(self) -> TrainStep:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Seed torch (CPU and every CUDA/MPS device present), `random` and numpy for the block, then
    restore the caller's generator states (torch.random.fork_rng does the torch part)."""
    import random

    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.random.fork_rng(devices=[], device_type="cpu"))
        if torch.cuda.is_available():
            stack.enter_context(torch.random.fork_rng(devices=range(torch.cuda.device_count()), device_type="cuda"))
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            stack.enter_context(torch.random.fork_rng(device_type="mps"))
        py_state = random.getstate()
        stack.callback(random.setstate, py_state)
        try:
            import numpy as np

            np_state = np.random.get_state()
            stack.callback(np.random.set_state, np_state)
            np.random.seed(seed)
        except ImportError:
            pass
        random.seed(seed)
        torch.manual_seed(seed)
        yield


@contextlib.contextmanager
def built(workload: Workload, knobs: Knobs, *, timeout_s: float = 120.0, compile: bool = False,
          label_phases: bool = True) -> Iterator[tuple[TrainStep, BatchSource]]:
    """A TrainStep and its BatchSource under the knobs' process settings and the workload's seed,
    cleaned up after: what the analyses in diagnose/ instrument (eager, phases labelled)."""
    stage = Stage()
    with contextlib.ExitStack() as stack:
        stack.enter_context(settings(knobs))
        stack.enter_context(seeded(workload.seed))
        step = stack.enter_context(TrainStep(workload, knobs, stage=stage, compile=compile, label_phases=label_phases))
        source = stack.enter_context(BatchSource(workload, knobs.replace(data="loader"), timeout_s=timeout_s,
                                                 stage=stage))
        yield step, source
