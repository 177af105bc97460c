"""Knobs that change nothing in this workload's step, known before any trial runs.

A knob declares `inert(value, ctx) -> str | None` with its other hooks (spec.py): why its value changes
nothing in the step this workload runs (the model's and batches' tensors, the device, the other knobs),
or None when it may. `channels_last` on a model and batches without a 4-D tensor, `cudnn_benchmark` or
`pin_memory` off an accelerator, `prefetch_factor` without workers, the DDP knobs at world_size=1: two
configurations that differ only in such knobs run the very same step, so their speeds differ by noise
alone. `bench.run` says so before the trial; `bench.compare` answers "same" without measuring.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from .spec import KNOBS, Context
from .value import Knobs


def why_inert(name: str, knobs: Knobs, ctx: Context) -> str | None:
    """Why `knobs`' value of knob `name` changes nothing in this step (None: it may, or nothing is declared)."""
    spec = KNOBS.get(name)
    if spec is None or spec.inert is None:
        return None
    ctx.knobs = knobs
    return spec.inert(getattr(knobs, name), ctx)


def differing(a: Knobs, b: Knobs) -> list[str]:
    """The knobs whose values differ between `a` and `b`, in declaration order (built-in and yours)."""
    names = [f.name for f in fields(a)] + [n for n in KNOBS if n not in {f.name for f in fields(a)}]
    return [n for n in names if getattr(a, n, None) != getattr(b, n, None)]


def inert_changes(a: Knobs, b: Knobs, device: Any = None, **workload: Any) -> dict[str, str]:
    """{knob: why} for the knobs that differ between `a` and `b` and change nothing in this step on
    either side (`workload`: Context fields, e.g. `Workload.context_kwargs()`)."""
    out = {}
    for name in differing(a, b):
        why_a = why_inert(name, a, Context(knobs=a, device=device, **workload))
        why_b = why_inert(name, b, Context(knobs=b, device=device, **workload))
        if why_a and why_b:
            out[name] = why_b
    return out


def same_step(a: Knobs, b: Knobs, device: Any = None, **workload: Any) -> dict[str, str] | None:
    """{knob: why} when `a` and `b` differ, and only in knobs that change nothing in this step: the two run
    the same step. None when they are equal or a knob that differs may change the step."""
    names = differing(a, b)
    inert = inert_changes(a, b, device, **workload)
    return inert if names and len(inert) == len(names) else None


def sentence(changes: dict[str, str], knobs: Knobs) -> str:
    """The inert knobs' values in `knobs` and why, in one sentence: "channels_last=True changes nothing in this
    step: the model and its batches hold no 4-D tensor ..."."""
    named = [f"{name}={getattr(knobs, name)!r}" for name in changes]
    if len(named) == 1:
        return f"{named[0]} changes nothing in this step: {next(iter(changes.values()))}"
    whys = "; ".join(f"{name}: {why}" for name, why in changes.items())
    return f"{', '.join(named)} change nothing in this step ({whys})"
