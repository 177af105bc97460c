"""LoaderMeter: what the loader's workers can deliver, measured inside them.

A trial's window must not read faster than the data pipeline can deliver (a buffer drained, not
the pipeline). With workers, the workbench times each worker's sample fetches and collate into
shared memory; `limit(batch_size)` turns that into the samples/s the workers can make at most,
which the runner holds the window's throughput against (steady.py, docs/steady_state.md).
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch.utils.data import Dataset, IterableDataset, default_collate, get_worker_info


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
