"""The small surface the faces need from a workbench: `Bench`, a Protocol below them all.

tune, fit, scaling, the panel and diagnose take "a workbench"; they type it as `Bench`, so they
depend on this surface (and the core types it names), not on `bench.Workbench`. A test double, or
a workbench of another kind (a remote one), works with every face that way.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from .knobs import Knobs
from .measure import TrialResult
from .workload import Workload


@runtime_checkable
class Bench(Protocol):
    """What a face may use: the workload, its default knobs, one trial, the trials so far."""

    workload: Workload
    defaults: Knobs
    steps: int
    warmup_steps: int

    @property
    def device(self) -> torch.device: ...

    @property
    def trials(self) -> list[TrialResult]: ...

    def knobs(self, base: Knobs | None = None, **changes: Any) -> Knobs: ...

    def run(self, knobs: Knobs | None = None, /, **kwargs: Any) -> TrialResult: ...
