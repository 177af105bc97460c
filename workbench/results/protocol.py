"""The small surface the faces need from a workbench: `Bench`, a Protocol below them all.

tune, fit, scaling, the panel and diagnose take "a workbench"; they type it as `Bench`, so they
depend on this surface (and the core types it names), not on `bench.Workbench`. A test double, or
a workbench of another kind (a remote one), works with every face that way.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import pandas as pd
import torch

from ..core.devicefacts import DeviceFacts
from ..core.knobs import Knobs
from ..core.measure import TrialResult
from ..core.workload import Workload
from .log import ResultLog
from .stats import MARGIN, Comparison, Noise


@runtime_checkable
class Bench(Protocol):
    """What a face may use: the workload, its default knobs, one trial, the trials so far and their log,
    the baseline, comparisons (interleaved ones too) and explanations."""

    workload: Workload
    defaults: Knobs
    steps: int
    warmup_steps: int
    name: str  # names the log file and traces
    log: ResultLog  # every trial, persisted; faces observe it, look trials up, read its path

    @property
    def device(self) -> torch.device: ...

    @property
    def _facts(self) -> DeviceFacts: ...  # the device the trials run on (the node's with an executor)

    @property
    def trials(self) -> list[TrialResult]: ...

    @property
    def results(self) -> pd.DataFrame: ...

    @property
    def baseline(self) -> TrialResult | None: ...

    @baseline.setter
    def baseline(self, trial: int | TrialResult) -> None: ...

    @property
    def noise(self) -> Noise: ...

    @property
    def blocks(self) -> dict[str, int]: ...

    def knobs(self, base: Knobs | None = None, **changes: Any) -> Knobs: ...

    def run(self, knobs: Knobs | None = None, /, **kwargs: Any) -> TrialResult: ...

    def compare(self, a: int | TrialResult, b: int | TrialResult, rounds: int | str = 0, *, max_rounds: int = 8,
                margin: float = MARGIN, budget_s: float | None = None,
                run: Callable[[Knobs], TrialResult | None] | None = None,
                method: str = "auto", cancel: threading.Event | None = None) -> Comparison: ...

    def _interleave(self, a: TrialResult, b: TrialResult, *, margin: float = MARGIN, budget_s: float | None = None,
                   cancel: threading.Event | None = None) -> Comparison: ...

    def explain(self, a: int | TrialResult | Knobs | None = None, b: int | TrialResult | Knobs | None = None, *,
                progress: bool | None = None) -> Any: ...
