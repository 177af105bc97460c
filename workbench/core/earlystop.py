"""Stop a trial early when its measured steps already show it is far slower than the baseline.

`StopRule` is handed down from `bench.run` (through `runner.run_trial`) to `phases.measure_window`,
which calls `observe(seconds, samples)` after every measured step and ends the window when it
answers True. Pure numbers: no torch, no clocks, no UI.

The rule (sequential, one-sided, distribution-free sign test on time per sample):

- threshold c = FACTOR x the baseline's median seconds per sample (its step times over its samples
  per step, so a trial with a larger batch is judged per sample, not per step);
- p0 = the share of the baseline's own steps above c (Laplace-smoothed, (k + 1) / (n + 2)), floored at
  P_FLOOR = 20% to allow for the machine's drift between the two trials;
- after each measured step n (from MIN_STEPS to one before the window's end), with k of the trial's
  n steps above c, stop when P(Binomial(n, p0) >= k) <= ALPHA / looks and the trial's median is at
  least FACTOR x the baseline's.

Error rate: if the trial is not slower than the baseline (its steps, taken as independent, exceed c
no more often than the baseline's do, at most p0), the chance that the rule stops it at any look of
the window is at most ALPHA = 1% (Bonferroni over the looks). A trial that might be faster is
therefore stopped with probability <= 1%, and only when at least half of its measured steps (its
median) took FACTOR x the baseline's time per sample. With a 30-step window the earliest stop is
after 5 steps, all above c (0.2^5 = 3.2e-4 <= 1% / 25 looks). A step that met an input shape for the
first time (shapes.py: its plans, autotune or recompile are a one-time cost, not speed) is never judged:
it counts as a step of the window, not as evidence. On CUDA the steps are timed on the host
(`perf_counter` at each step boundary), which runs ahead of the device: it can only under-state a
slow trial, never make a fast one look slow for long.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

FACTOR = 2.0  # stop only a trial at least this many times slower per sample than the baseline
MIN_STEPS = 5  # never stop before this many measured steps
ALPHA = 0.01  # the chance of stopping a trial that is no slower than the baseline, over the whole window
P_FLOOR = 0.2  # the least chance granted to a no-slower trial's step of landing above the threshold


def binomial_tail(n: int, k: int, p: float) -> float:
    """P(Binomial(n, p) >= k)."""
    if k <= 0:
        return 1.0
    return sum(math.comb(n, j) * p**j * (1 - p) ** (n - j) for j in range(k, n + 1))


class StopRule:
    """Per-step stop check of one trial against a baseline's per-sample step times (see the module).

    `observe(seconds, samples)` after each measured step returns True when the trial should stop.
    `stopped_at` is the number of measured steps when it stopped (None while it runs on).
    """

    def __init__(self, baseline_s_per_sample: Sequence[float], *, steps: int, baseline_id: int | None = None,
                 factor: float = FACTOR, min_steps: int = MIN_STEPS, alpha: float = ALPHA) -> None:
        base = [float(x) for x in baseline_s_per_sample if x > 0 and math.isfinite(x)]
        if len(base) < 2:
            raise ValueError(f"a stop rule needs at least 2 baseline step times, got {len(base)}: run the baseline "
                             "with steps >= 2, or pass stop_early=False")
        if factor <= 1 or min_steps < 1 or not 0 < alpha < 1:
            raise ValueError(f"need factor > 1, min_steps >= 1 and 0 < alpha < 1; got factor={factor}, "
                             f"min_steps={min_steps}, alpha={alpha}")
        self.steps, self.baseline_id, self.factor, self.min_steps = steps, baseline_id, factor, min_steps
        self.base_median = statistics.median(base)
        self.threshold = factor * self.base_median
        above = sum(x > self.threshold for x in base)
        self.p0 = max(P_FLOOR, (above + 1) / (len(base) + 2))
        looks = max(1, steps - min_steps)  # looks at n = min_steps .. steps - 1 (stopping at the end saves nothing)
        self.per_look = alpha / looks
        self.alpha = alpha
        self.times: list[float] = []  # the trial's seconds per sample, per measured step
        self.above = 0
        self.at_least = 0  # steps at or above the threshold (the median's gate)
        self.stopped_at: int | None = None
        self.unjudged = 0  # window steps that met an input shape first: counted, never judged

    @classmethod
    def against(cls, step_times_s: Sequence[float], samples_per_step: int | None, *, steps: int,
                baseline_id: int | None = None) -> StopRule | None:
        """The rule against a baseline trial's step times and samples per step; None when the baseline
        has too few steps (fewer than MIN_STEPS) or no sample count to judge by."""
        if not samples_per_step or len(step_times_s) < MIN_STEPS or steps <= MIN_STEPS:
            return None
        return cls([t / samples_per_step for t in step_times_s], steps=steps, baseline_id=baseline_id)

    def observe(self, seconds: float, samples: int, first_seen: bool = False) -> bool:
        """Take one measured step (its seconds and samples); True when the trial should stop now.
        `first_seen`: the step met an input shape for the first time; it is not judged."""
        if first_seen:
            self.unjudged += 1
            return False
        per = seconds / max(1, samples)
        self.times.append(per)
        self.above += per > self.threshold
        self.at_least += per >= self.threshold
        n = len(self.times)
        if n < self.min_steps or n + self.unjudged >= self.steps or self.stopped_at is not None:
            return False
        if 2 * self.at_least < n:  # fewer than half the steps at the threshold: the median is below it
            return False  # (the measured loop's usual case: O(1), no binomial sum or median per step)
        if binomial_tail(n, self.above, self.p0) <= self.per_look and self.slowdown >= self.factor:
            self.stopped_at = n
            return True
        return False

    def reset(self) -> None:
        """Forget the steps seen: the trial measures a new window (steady.py's re-measure)."""
        self.times, self.above, self.at_least, self.stopped_at, self.unjudged = [], 0, 0, None, 0

    @property
    def slowdown(self) -> float:
        """The trial's median seconds per sample over the baseline's (8.0: eight times slower)."""
        return statistics.median(self.times) / self.base_median if self.times else 1.0

    def note(self) -> str:
        """The trial's note when it stopped early, saying how to run the full window."""
        against = f"#{self.baseline_id}" if self.baseline_id is not None else "the baseline"
        return (f"stopped early after {self.stopped_at} of {self.steps} steps: ≈{self.slowdown:.1f}× slower "
                f"than {against} per sample (sign test, ≤{self.alpha:.0%} chance of stopping a trial that is "
                "not slower); run with stop_early=False for the full window")

    def outcome(self) -> dict[str, Any]:
        """What the log keeps (TrialResult.extra['stopped_early']) when the trial stopped early."""
        return {"steps": self.stopped_at, "of": self.steps, "slowdown": round(self.slowdown, 3),
                "baseline": self.baseline_id, "factor": self.factor, "alpha": self.alpha}
