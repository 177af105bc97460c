"""Input shapes: the first call on each new (batch, length) shape is a one-time cost, not speed.

On CUDA a step's first call on a shape it has not run before picks cuBLAS/cuDNN plans, autotunes
under `cudnn.benchmark`, captures a CUDA graph (`compile="reduce-overhead"`); `torch.compile`
recompiles for it on every device. Those caches live in the process, so the cost is paid once per
distinct shape per process: a GPT-2 under bf16 on skewed lengths took 176 ms per step on an H200
over new lengths and 20 ms over the same lengths again (docs/steady_state.md, "New input shapes").
A window that meets shapes for the first time measures that cost, and two trials of the same knobs
disagree by whatever the process had seen before.

So a trial watches the shapes its batches carry (`ShapeWatch`, around its BatchSource) and:

- when its loader repeats a fixed sample of batches (the length-stratified window of token data,
  tokens.CycleBatches: `sample_batches`), warm-up covers one full pass over that sample once the
  shapes seen vary (steady.py's `WarmupRule`), so the window meets no shape for the first time;
- records how many distinct shapes it saw and what their first calls cost (`shape_costs`), apart
  from the window: `TrialResult.shapes`, `TrialResult.shape_warmup_s`, `extra["shapes"]`;
- never lets the early stop judge it on a step that met a shape for the first time (earlystop.py).

A shape is the tuple of every tensor's shape in the batch (dict keys, tuple positions), read on the
host: reading `.shape` never waits for the device. Pure bookkeeping otherwise: no clocks.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from .tokens import CycleBatches

MAX_DEPTH = 4  # nesting levels of a batch read for its shape (dicts of tuples of tensors ...)
COSTLY_STEPS = 2.0  # a first call costing more than this many steady steps per shape is "large" (tune, notes)


def signature(batch: Any, depth: int = 0) -> Any:
    """The shapes of every tensor in `batch` as a hashable tuple (None for a batch without tensors)."""
    shape = getattr(batch, "shape", None)
    if shape is not None and hasattr(batch, "dtype"):
        return tuple(shape)
    if depth >= MAX_DEPTH:
        return None
    if isinstance(batch, Mapping):
        return tuple((str(k), signature(v, depth + 1)) for k, v in batch.items())
    if isinstance(batch, (list, tuple)):
        return tuple(signature(v, depth + 1) for v in batch)
    return None


def sample_batches(loader: Any) -> int:
    """Batches in the fixed sample the loader repeats (a token window's CycleBatches); 0 when it repeats none."""
    sampler = getattr(loader, "batch_sampler", None)
    return len(sampler.batches) if isinstance(sampler, CycleBatches) else 0


class ShapeWatch:
    """A BatchSource seen through its batches' shapes: every attribute is the source's, and `next()`
    records the shape of the batch it hands out (the step that asked for it is the one that meets it).

        watch = ShapeWatch(source)
        before = watch.read
        step(watch)
        key, new = watch.since(before)   # the step's shapes (ids) and how many it met first
    """

    def __init__(self, source: Any) -> None:
        self.source = source
        self.ids: dict[Any, int] = {}  # shape -> id, in the order first seen
        self.shape_ids: list[int] = []  # per batch handed out
        self.first_at: list[int] = []  # per shape id: the batch that first had it
        self.sample_batches = sample_batches(getattr(source, "loader", None))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.source, name)

    def next(self) -> Any:
        """The source's next batch; its shape recorded."""
        batch = self.source.next()
        sig = signature(batch)
        if sig not in self.ids:
            self.ids[sig] = len(self.ids)
            self.first_at.append(len(self.shape_ids))
        self.shape_ids.append(self.ids[sig])
        return batch

    @property
    def read(self) -> int:
        """Batches handed out so far."""
        return len(self.shape_ids)

    @property
    def distinct(self) -> int:
        """Distinct shapes seen so far."""
        return len(self.ids)

    def since(self, before: int) -> tuple[tuple[int, ...], int]:
        """(the shape ids of the batches handed out since `before`, how many of them were first seen there)."""
        key = tuple(self.shape_ids[before:])
        return key, sum(1 for i in set(key) if self.first_at[i] >= before)


def shape_costs(warm: Sequence[tuple[float, tuple[int, ...], int]], window: Sequence[tuple[float, tuple[int, ...]]],
                distinct: int, *, in_window: int = 0, pass_batches: int = 0) -> dict[str, Any]:
    """What the trial's shapes cost on their first calls, from its steps (a pure function).

    `warm`: (seconds, shape ids, shapes first seen) of each warm-up step timed apart from start-up
    (the first step and the memory probe are left out: their time holds more than a shape);
    `window`: (seconds, shape ids) of each measured step. A first-seen step's cost is its time over
    the median measured step of the same shapes (of any measured step when none has them), never
    below 0; the cost per shape is their sum over the shapes they met, and `warmup_s` that per-shape
    cost times every distinct shape (the first step's shapes included). None where nothing measures it.
    """
    out: dict[str, Any] = {"distinct": distinct, "in_window": in_window, "pass_batches": pass_batches,
                           "measured": 0, "per_shape_s": None, "warmup_s": None}
    if distinct < 2 or not window:
        return out
    by_key: dict[tuple[int, ...], list[float]] = {}
    for t, key in window:
        by_key.setdefault(key, []).append(t)
    overall = statistics.median(t for t, _ in window)
    extra, met = 0.0, 0
    for t, key, new in warm:
        if new:
            ref = statistics.median(by_key[key]) if key in by_key else overall
            extra += max(0.0, t - ref)
            met += new
    if met:
        per = extra / met
        out.update(measured=met, per_shape_s=per, warmup_s=per * distinct, step_s=overall)
    return out


def costly(info: dict[str, Any] | None, step_s: float | None) -> bool:
    """Whether a trial's shapes cost more than COSTLY_STEPS steady steps each on their first calls."""
    if not isinstance(info, dict) or not step_s:
        return False
    per = info.get("per_shape_s")
    return isinstance(per, (int, float)) and (info.get("distinct") or 0) > 1 and per >= COSTLY_STEPS * step_s
