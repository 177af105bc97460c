"""Fake trials for the results tests: TrialResults with given step times, no model run."""

from __future__ import annotations

import numpy as np

import workbench as wb
from workbench.core.measure import TrialResult


def fake(times, status: str = "ok", batch: int = 10, **knobs) -> TrialResult:
    """An ok trial (or `status`) of `knobs` whose measured steps took `times` seconds."""
    times = tuple(float(t) for t in times)
    return TrialResult(knobs=wb.Knobs(**knobs), status=status, samples_per_s=batch * len(times) / sum(times),
                       step_time_s=float(np.median(times)), step_time_iqr_s=0.0, step_times_s=times,
                       data_wait_s=tuple(0.0 for _ in times), data_wait_share=0.0, samples_per_step=batch,
                       losses=tuple(1.0 / (i + 1) for i in range(len(times))))


def noisy(mean: float, rel: float, n: int = 30, seed: int = 0) -> np.ndarray:
    """n step times around `mean` with relative sd `rel` (seeded)."""
    return mean * (1 + rel * np.random.default_rng(seed).standard_normal(n))
