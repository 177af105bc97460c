"""The one shape every demo's `build(size)` returns: a seeded model and the Workbench's parts."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..core.knobs import Knobs


def workbench_parts(make_model: Callable[[], nn.Module], data: Any, *, loss_fn: Any, lr: float, batch_size: int,
                    step_fn: Any = None) -> dict[str, Any]:
    """{model, data, loss_fn, optimizer, step_fn, knobs}: the model built under seed 0 (the
    caller's generator untouched), AdamW at `lr` as a picklable factory, the demo's batch size."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = make_model()
    return dict(model=model, data=data, loss_fn=loss_fn,
                optimizer=functools.partial(torch.optim.AdamW, lr=lr),  # picklable factory
                step_fn=step_fn, knobs=Knobs(batch_size=batch_size))
