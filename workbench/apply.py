"""Turn Knobs into the concrete objects of one trial: DataLoader, autocast, GradScaler, compiled
model, checkpointed blocks, thread and matmul settings. Each function does one knob's job."""

from __future__ import annotations

import contextlib
import functools
import time
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, Dataset, IterableDataset, default_collate, get_worker_info

from .knobs import Knobs
from .knobs import settings as knob_settings
from .workload import LoaderSpec

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class LoaderMeter:
    """Seconds the loader's workers spend making batches (fetching samples + collate), counted in
    each worker into shared memory: what the workers can deliver, whatever the loop consumed.

    `limit(batch_size)` is samples/s at most: num_workers / (busy seconds per batch) x batch_size.
    It leaves out the workers' own overhead (pickling into shared memory, the queue), so the
    pipeline delivers at most this, never more.
    """

    def __init__(self, num_workers: int) -> None:
        if num_workers < 1:
            raise ValueError(f"a LoaderMeter needs worker processes, got num_workers={num_workers}")
        self.num_workers = num_workers
        self.slots = torch.zeros(num_workers, 2, dtype=torch.float64).share_memory_()  # busy s, batches

    def add(self, seconds: float, batches: int = 0) -> None:
        """Count `seconds` of work (and `batches` finished) for the worker calling it."""
        info = get_worker_info()
        row = self.slots[info.id if info is not None else 0]
        row[0] += seconds
        row[1] += batches

    def read(self) -> tuple[float, int]:
        """(busy seconds, batches made) over all workers so far."""
        busy, batches = self.slots.sum(0).tolist()
        return busy, int(batches)

    def limit(self, batch_size: int, since: tuple[float, int] | None = None) -> float | None:
        """Samples/s the workers can deliver at most (None before a batch was made): from the
        batches made after `since` (an earlier `read()`) when there were a round of them, else all."""
        busy, batches = self.read()
        if since is not None and batches - since[1] >= self.num_workers:
            busy, batches = busy - since[0], batches - since[1]
        if batches < 1 or busy <= 0:
            return None
        return self.num_workers / (busy / batches) * batch_size

    def collate(self, collate_fn: Any) -> Any:
        """`collate_fn` timed: its seconds and one finished batch counted."""
        return _TimedCollate(collate_fn or default_collate, self)

    def dataset(self, dataset: Any) -> Any:
        """`dataset` with its sample fetches timed (map-style or iterable)."""
        return _TimedIterable(dataset, self) if isinstance(dataset, IterableDataset) else _TimedDataset(dataset, self)


class _TimedCollate:
    def __init__(self, fn: Any, meter: LoaderMeter) -> None:
        self.fn, self.meter = fn, meter

    def __call__(self, batch: Any) -> Any:
        t0 = time.perf_counter()
        out = self.fn(batch)
        self.meter.add(time.perf_counter() - t0, 1)
        return out


class _TimedDataset(Dataset):
    """A map-style dataset whose batch fetch (one `__getitems__` call) is timed."""

    def __init__(self, inner: Any, meter: LoaderMeter) -> None:
        self.inner, self.meter = inner, meter

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: Any) -> Any:
        t0 = time.perf_counter()
        item = self.inner[i]
        self.meter.add(time.perf_counter() - t0)
        return item

    def __getitems__(self, indices: list) -> list:
        t0 = time.perf_counter()
        many = getattr(self.inner, "__getitems__", None)
        items = many(indices) if many else [self.inner[i] for i in indices]
        self.meter.add(time.perf_counter() - t0)
        return items


class _TimedIterable(IterableDataset):
    """An iterable dataset whose every `next()` is timed (in the worker that iterates it)."""

    def __init__(self, inner: Any, meter: LoaderMeter) -> None:
        self.inner, self.meter = inner, meter

    def __iter__(self) -> Any:
        it = iter(self.inner)
        while True:
            t0 = time.perf_counter()
            try:
                item = next(it)
            except StopIteration:
                return
            self.meter.add(time.perf_counter() - t0)
            yield item


def build_loader(spec: LoaderSpec, knobs: Knobs, *, seed: int, device: torch.device, timeout_s: float = 0,
                 sampler: Any = None, meter: LoaderMeter | None = None) -> DataLoader:
    """A DataLoader over the user's dataset with the knobs' settings and a seeded data order.

    The generator fixes both the shuffle order and the workers' base seeds, so every trial with
    the same seed sees the same batches in the same order. `sampler` replaces the spec's sampler
    and shuffle (a DistributedSampler: each rank reads its own shard). `meter` (with workers)
    times what the workers do, for the loader-limit check.
    """
    generator = torch.Generator().manual_seed(seed)
    timed = meter is not None and knobs.num_workers > 0
    kwargs: dict[str, Any] = dict(
        batch_size=knobs.batch_size,
        num_workers=knobs.num_workers,
        collate_fn=meter.collate(spec.collate_fn) if timed else spec.collate_fn,
        drop_last=spec.drop_last,
        generator=generator,
        # pin_memory only means something when there is a device to copy to.
        pin_memory=knobs.pin_memory and device.type in ("cuda", "xpu"),
    )
    if not spec.iterable:
        if sampler is not None:
            kwargs["sampler"] = sampler
        elif spec.sampler is not None:
            kwargs["sampler"] = spec.sampler
        else:
            kwargs["shuffle"] = spec.shuffle
    if knobs.num_workers > 0:
        kwargs["persistent_workers"] = knobs.persistent_workers
        if knobs.prefetch_factor is not None:
            kwargs["prefetch_factor"] = knobs.prefetch_factor
        if timeout_s:
            kwargs["timeout"] = timeout_s  # a hung worker becomes an error, not a frozen notebook
    return DataLoader(meter.dataset(spec.dataset) if timed else spec.dataset, **kwargs)


def autocast(knobs: Knobs, device: torch.device) -> contextlib.AbstractContextManager:
    """The autocast context for the forward pass and loss (a null context when amp='off')."""
    if knobs.amp == "off":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=AMP_DTYPES[knobs.amp])


def grad_scaler(knobs: Knobs, device: torch.device) -> torch.amp.GradScaler | None:
    """A GradScaler for fp16 (its small range underflows gradients); bf16 and fp32 need none."""
    if knobs.amp != "fp16":
        return None
    return torch.amp.GradScaler(device.type)


def apply_checkpointing(model: nn.Module, names: tuple[str, ...], available: dict[str, int],
                        **options: Any) -> None:
    """Wrap exactly the named blocks' forward in torch.utils.checkpoint (use_reentrant=False).

    Their activations are dropped after forward and recomputed during backward: less memory,
    more compute. The module tree and parameter names stay unchanged. `options` are further
    keywords for checkpoint (e.g. a context_fn for selective checkpointing).
    """
    for name in names:
        if name not in available:
            raise ValueError(
                f"checkpoint names unknown block {name!r}; choose from bench.blocks: "
                f"{', '.join(available) or '(none found)'}"
            )
        block = model.get_submodule(name)
        original = block.forward

        @functools.wraps(original)
        def forward(*args: Any, __original=original, **kwargs: Any) -> Any:
            if not torch.is_grad_enabled():
                return __original(*args, **kwargs)
            return checkpoint(__original, *args, use_reentrant=False, **options, **kwargs)

        block.forward = forward  # instance attribute shadows the class method


def remove_checkpointing(model: nn.Module | None, names: tuple[str, ...]) -> None:
    """Undo `apply_checkpointing` (the wrapper refers back to its block: a reference cycle)."""
    if model is None:
        return
    for name in names:
        model.get_submodule(name).__dict__.pop("forward", None)


def compile_model(model: nn.Module, knobs: Knobs, device: torch.device) -> nn.Module:
    """torch.compile with the knob's mode; reduce-overhead (CUDA graphs) falls back to default off CUDA."""
    if knobs.compile == "off":
        return model
    mode = knobs.compile
    if mode == "reduce-overhead" and device.type != "cuda":
        mode = "default"
    return torch.compile(model, mode=None if mode == "default" else mode)


def process_settings(knobs: Knobs) -> contextlib.AbstractContextManager:
    """Hold the knobs' process-wide settings (threads, matmul precision...) for the trial,
    restoring the caller's afterwards; each knob declares its own in knobs.py."""
    return knob_settings(knobs)
