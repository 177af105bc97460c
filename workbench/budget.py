"""A seconds budget that holds: per-configuration trial estimates, a deadline that stops a trial, and
the account of where the seconds went (`tune(budget_s=...)`).

- `estimate(knobs, measured)`: a trial's seconds from the measured trials of the most similar
  configuration: the same knobs when measured (the longest of their trials), else the trials of the
  same cost class (compiles or not, workers or not, world size), scaled by samples per step; a class
  not measured yet gets the start's figure times a prior factor (compile 4x, workers 1.5x, ranks).
- `Deadline`: the cancel Event the runner checks at every step, set by a timer at the deadline with
  a reason, so the stopped trial is recorded as stopped by the budget (status "interrupted", never
  evidence), not by the user.
- `Spend`: seconds per purpose (race, confirm, explain), the trials not started because their
  estimate did not fit, the trials stopped at the deadline; `str()` says it in one line.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .knobs import Knobs, traits
from .measure import TrialResult

OVERRUN = 1.1  # the cap: tune()'s whole wall time stays within budget_s x OVERRUN
DEADLINE = 1.05  # a running trial is stopped at budget_s x DEADLINE (the rest is for recording and the result)
COMPILE_PRIOR = 4.0  # a compiled trial not yet measured: this many times the start's seconds
WORKERS_PRIOR = 1.5  # a trial with workers not yet measured (worker start-up, buffers)
EXPLAIN_PRIOR = 1.5  # a traced repeat (the profiler's steps after the window) over its trial's seconds


def check_budget_s(budget_s: object) -> None:
    """ValueError (naming the fix) unless `budget_s` is None or a positive, finite number of seconds."""
    if budget_s is None:
        return
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)):
        raise ValueError(f"budget_s must be a positive number of seconds (e.g. budget_s=120), got {budget_s!r}")
    if not math.isfinite(budget_s) or budget_s <= 0:
        raise ValueError(f"budget_s must be a positive, finite number of seconds (e.g. budget_s=120), got {budget_s!r}; "
                         "pass budget=N to cap the number of trials instead")


def cost_class(knobs: Knobs) -> tuple[bool, bool, int]:
    """What makes a trial cost more than its steps: it compiles, it starts workers, its ranks."""
    told = traits(knobs)
    return bool(told["compiles"]), bool(told["workers"]), knobs.world_size


def _per_step(knobs: Knobs) -> int:
    return knobs.batch_size * knobs.accum_steps


def estimate(knobs: Knobs, measured: Sequence[tuple[Knobs, float, bool]]) -> float | None:
    """Seconds a trial of `knobs` should take, from `measured` (knobs, seconds, full window) trials of
    this search; None before any. Early-stopped trials count only for their own knobs."""
    if not measured:
        return None
    same = [s for k, s, _full in measured if k == knobs]
    if same:
        return max(same)
    full = [(k, s) for k, s, whole in measured if whole] or [(k, s) for k, s, _ in measured]
    similar = [(k, s) for k, s in full if cost_class(k) == cost_class(knobs)]
    ref_knobs, ref_s = max(similar or full, key=lambda p: p[1])  # the costliest of the reference trials
    est = ref_s * max(0.5, _per_step(knobs) / _per_step(ref_knobs))
    if not similar:
        compiles, workers, ranks = cost_class(knobs)
        ref_compiles, ref_workers, ref_ranks = cost_class(ref_knobs)
        est *= COMPILE_PRIOR if compiles and not ref_compiles else 1.0
        est *= WORKERS_PRIOR if workers and not ref_workers else 1.0
        est *= max(1.0, ranks / ref_ranks)
    return est


class Deadline(threading.Event):
    """A trial's cancel Event that a timer sets at the deadline, with `reason` for the trial's message.
    Ctrl-C (bench.run's own `set()`) leaves `reason` empty: that stop is the user's."""

    def __init__(self, seconds: float, reason: str) -> None:
        super().__init__()
        self.reason = ""
        self._why = reason
        self._timer = threading.Timer(max(0.0, seconds), self.expire)
        self._timer.daemon = True
        self._timer.start()

    def expire(self) -> None:
        self.reason = self._why
        self.set()

    @property
    def expired(self) -> bool:
        return bool(self.reason)

    def cancel(self) -> None:
        """Stop the timer (the trial ended before the deadline)."""
        self._timer.cancel()


@dataclass
class Spend:
    """How a seconds budget was spent: seconds per purpose, and trials the budget kept out or stopped;
    `measured` (knobs, seconds, full window) is the evidence of the estimates."""

    budget_s: float | None
    seconds: dict[str, float] = field(default_factory=dict)  # purpose (race, confirm, explain) -> seconds
    not_started: int = 0  # trials whose estimate did not fit the seconds left
    stopped: list[int] = field(default_factory=list)  # trial ids stopped at the deadline
    measured: list[tuple[Knobs, float, bool]] = field(default_factory=list)

    def add(self, purpose: str, seconds: float) -> None:
        self.seconds[purpose] = self.seconds.get(purpose, 0.0) + seconds

    def fits(self, knobs: Knobs, left_s: float, factor: float = 1.0) -> bool:
        """Whether a trial of `knobs` (its estimate x `factor`) fits `left_s` seconds (True before any estimate)."""
        est = estimate(knobs, self.measured)
        return est is None or est * factor <= left_s

    def run(self, run: Callable[..., TrialResult], knobs: Knobs, *, purpose: str, deadline_in_s: float | None,
            stop_early: bool, clock: Callable[[], float]) -> TrialResult:
        """`run(knobs, ...)` (bench.run), stopped `deadline_in_s` seconds from now when given; the
        seconds land under `purpose`, the trial in `stopped` (stopped at the deadline) or `measured`."""
        kwargs: dict[str, Any] = {} if stop_early else {"stop_early": False}
        deadline = None
        if deadline_in_s is not None:
            deadline = kwargs["cancel"] = Deadline(deadline_in_s, "stopped by the budget (tune's budget_s) at its deadline")
        t = clock()
        try:
            r = run(knobs, **kwargs)
        finally:
            if deadline is not None:
                deadline.cancel()
        seconds = clock() - t
        self.add(purpose, seconds)
        if deadline is not None and deadline.expired and not r.ok:
            self.stopped.append(r.trial_id)
        else:
            self.measured.append((knobs, seconds, "stopped_early" not in r.extra))
        return r

    def __str__(self) -> str:
        parts = ", ".join(f"{p} {s:.1f} s" for p, s in self.seconds.items()) or "nothing run"
        extra = []
        if self.not_started:
            extra.append(f"{self.not_started} trial(s) not started: their estimate did not fit the seconds left")
        if self.stopped:
            extra.append(f"{len(self.stopped)} stopped at the deadline (not evidence): "
                         + ", ".join(f"#{t}" for t in self.stopped))
        return "; ".join([parts, *extra])
