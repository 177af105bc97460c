"""Is the step waiting for data? The short-circuit test, the loader's own rate, the 20% rule.

Short circuit: run the same knobs with `data="cached"` (one batch kept on the
device). Clearly faster beyond run-to-run noise, confirmed in alternating rounds => the data
pipeline is the bottleneck; about the same => the step itself is. The loader's own maximum rate (iterating it with no model) shows how far the
pipeline is from feeding the step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pandas as pd

from ..core.knobs import Knobs
from ..core.measure import TrialResult
from ..core.step import BatchSource
from ..core.workload import Workload, batch_size_of
from ..deciding.rounds import compare
from ..launch.runner import trial_threaded
from ..results.stats import Comparison

# The seeds' checklist: data loading under 20% of iteration time. A trial waiting for data this share of its
# window is data-bound: diagnose says so, and tune() then races the worker counts first.
DATA_WAIT_LIMIT = 0.20
DATA_BOUND_SPEEDUP = 1.10  # cached batch this much faster (answer "faster", confirmed in rounds) => data-bound


def short_circuit_knobs(knobs: Knobs) -> Knobs:
    """The same step fed by one cached batch (no workers to start, nothing to load)."""
    return knobs.replace(data="cached", num_workers=0, persistent_workers=False, prefetch_factor=None,
                         pin_memory=False)


@trial_threaded
def loader_rate(workload: Workload, knobs: Knobs, *, batches: int = 20, max_s: float = 20.0) -> dict[str, float]:
    """The loader alone: samples/s after the first batch (worker start excluded), and start-up s.

    Batches are moved to the device too (that copy is part of feeding the step). Stops after
    `batches` batches or `max_s` seconds, whichever comes first.
    """
    k = knobs.replace(data="loader")
    with BatchSource(workload, k, timeout_s=120) as source:
        t0 = time.perf_counter()
        source.next()
        startup = time.perf_counter() - t0
        n = 0
        t1 = time.perf_counter()
        for _ in range(batches):
            n += batch_size_of(source.next())  # restarts the loader at an epoch end, as training would
            if time.perf_counter() - t1 > max_s:
                break
        wall = time.perf_counter() - t1
    return {"samples_per_s": n / wall if wall > 0 else float("inf"), "startup_s": startup}


@dataclass(frozen=True)
class DataCheck:
    """Baseline vs short-circuit trial, the loader's own rate, and the data-wait share."""

    baseline: TrialResult
    cached: TrialResult | None
    comparison: Comparison | None  # cached vs baseline
    loader_samples_per_s: float | None
    loader_startup_s: float | None

    @property
    def data_wait_share(self) -> float | None:
        return self.baseline.data_wait_share

    @property
    def cached_speedup(self) -> float | None:
        return self.comparison.speedup if self.comparison else None

    @property
    def copy_share(self) -> float | None:
        """The host->device copy's own share of the window (part of data_wait_share)."""
        return self.baseline.copy_share

    @property
    def data_bound(self) -> bool:
        """What one cached batch gains decides when it ran. After alternating rounds: data-bound when it
        runs DATA_BOUND_SPEEDUP faster and the rounds call it faster. From one pair of trials (no rounds): when
        it is DATA_BOUND_SPEEDUP faster and the data wait agrees (at or above the 20% rule). A cached batch
        not shown faster than the real loader is never data-bound, whatever the share reads: the step gains
        nothing without its data. Without the twin: the 20% rule alone."""
        by_wait = (self.data_wait_share or 0.0) >= DATA_WAIT_LIMIT
        c = self.comparison
        if c is None:
            return by_wait
        if c.rounds >= 1:
            return c.differs and c.speedup >= DATA_BOUND_SPEEDUP
        return by_wait and c.speedup >= DATA_BOUND_SPEEDUP

    @property
    def loader_headroom(self) -> float | None:
        """Loader-alone rate / the rate the step could consume (cached trial); < 1 = loader too slow."""
        demand = (self.cached or self.baseline).samples_per_s
        if not self.loader_samples_per_s or not demand:
            return None
        return self.loader_samples_per_s / demand

    def frame(self) -> pd.DataFrame:
        """One row per figure, with the rule it is judged by."""
        b, c = self.baseline, self.cached
        rows = [
            ("step with real loader", b.samples_per_s, "samples/s", f"trial #{b.trial_id}"),
            ("step with one cached batch", c.samples_per_s if c else None, "samples/s",
             f"trial #{c.trial_id}" if c else "not run"),
            ("cached / real", self.cached_speedup, "x",
             str(self.comparison) if self.comparison else ""),
            ("loader alone (no model)", self.loader_samples_per_s, "samples/s",
             "how fast the pipeline can deliver at most"),
            ("data-wait share", self.data_wait_share, "fraction",
             f"rule: under {DATA_WAIT_LIMIT:.0%} of the step; the loader (on CUDA: the GPU's idle time while it "
             "ran) + the copy's own cost"),
            ("of which the host->device copy", self.copy_share, "fraction",
             "device time of the copy (CUDA events); the queue it waits behind is compute"),
        ]
        return pd.DataFrame(rows, columns=["figure", "value", "unit", "note"])


def disagree(share: float | None, pair: Comparison | None) -> bool:
    """Whether the data-wait share and one cached-batch comparison point different ways (see DataCheck)."""
    if pair is None:
        return False
    by_wait = (share or 0.0) >= DATA_WAIT_LIMIT
    return by_wait != (pair.speedup >= DATA_BOUND_SPEEDUP)


def check_data(baseline: TrialResult, cached: TrialResult | None, rate: dict[str, float] | None,
               comparison: Comparison | None = None) -> DataCheck:
    """Assemble a DataCheck from the two trials (`comparison`: cached vs baseline in rounds, if run)."""
    comp = comparison
    if comp is None and cached is not None and cached.ok and baseline.ok and len(cached.step_times_s) >= 2:
        comp = compare(baseline, cached)
    return DataCheck(baseline, cached, comp,
                     rate["samples_per_s"] if rate else None, rate["startup_s"] if rate else None)
