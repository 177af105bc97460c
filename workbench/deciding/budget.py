"""A seconds budget that holds: per-configuration trial estimates, a deadline that stops a trial, and
the account of where the seconds went (`tune(budget_s=...)`).

- `estimate(knobs, measured)`: a trial's seconds from the measured trials of the most similar
  configuration: the same knobs when measured (the longest of their trials), else the trials of the
  same cost class (compiles or not, workers or not, world size), scaled by samples per step; a class
  not measured yet gets the start's figure times a prior factor (compile 12x, workers 1.5x, ranks),
  and a compiled trial whose graph differs from every measured compiled one (precision, layout, batch)
  twice its class's figure: it compiles anew.
- `Deadline`: the cancel Event the runner checks at every step, set by a timer at the deadline with
  a reason, so the stopped trial is recorded as stopped by the budget (status "interrupted", never
  evidence), not by the user.
- `Spend`: seconds per purpose (race, confirm, explain), the trials not started because their
  estimate did not fit, the trials stopped at the deadline; `str()` says it in one line.
- `Allowance`: the same rules for every other call that takes a `budget_s` (diagnose, fit_memory,
  scaling, compare's rounds): the first (needed) trial runs whole, a later one only when its
  estimate fits the seconds left, under a Deadline; `notes` say what the budget left out and why.
"""

from __future__ import annotations

import inspect
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.knobs import Knobs, traits
from ..core.measure import TrialResult
from ..launch.cluster import QUEUED, work_clock  # noqa: F401  (QUEUED re-exported: budgets leave queue time out)

OVERRUN = 1.1  # the cap: tune()'s whole wall time stays within budget_s x OVERRUN
DEADLINE = 1.05  # a running trial is stopped at budget_s x DEADLINE (the rest is for recording and the result)
# A compiled trial not yet measured: this many times the costliest plain trial. On the held-out CNN
# (2-core AMD EPYC, warm inductor cache) 1 s plain trials took 8 s compiled (fp32) and 16 s (bf16).
COMPILE_PRIOR = 12.0
RECOMPILE_PRIOR = 2.0  # a compiled trial whose graph no measured compiled trial shares: a compile of its own
GRAPH_FREE = frozenset({"num_workers", "pin_memory", "persistent_workers", "prefetch_factor", "cpu_threads", "data"})
WORKERS_PRIOR = 1.5  # a trial with workers not yet measured (worker start-up, buffers)
EXPLAIN_PRIOR = 1.5  # a traced repeat (the profiler's steps after the window) over its trial's seconds
TUNE_REASON = "stopped by the budget (tune's budget_s) at its deadline"


def check_budget_s(budget_s: object) -> None:
    """ValueError (naming the fix) unless `budget_s` is None or a positive, finite number of seconds."""
    if budget_s is None:
        return
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)):
        raise ValueError(f"budget_s must be a positive number of seconds (e.g. budget_s=120), got {budget_s!r}")
    if not math.isfinite(budget_s) or budget_s <= 0:
        raise ValueError(f"budget_s must be a positive, finite number of seconds (e.g. budget_s=120), got {budget_s!r}; "
                         "pass n_trials=N to cap the number of trials instead")


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
    elif cost_class(knobs)[0] and not any(set(knobs.diff(k)) <= GRAPH_FREE for k, _s in similar):
        est *= RECOMPILE_PRIOR  # other precision, layout or batch: torch.compile traces and compiles anew
    return est


class Deadline(threading.Event):
    """A trial's cancel Event that a timer sets at the deadline, with `reason` for the trial's message.
    Ctrl-C (bench.run's own `set()`) leaves `reason` empty: that stop is the user's. `postpone(s)` moves
    the deadline on (a job's queue time, which the budget does not count)."""

    def __init__(self, seconds: float, reason: str) -> None:
        super().__init__()
        self.reason = ""
        self._why = reason
        self._at = time.monotonic() + max(0.0, seconds)
        self._arm()

    def _arm(self) -> None:
        self._timer = threading.Timer(max(0.0, self._at - time.monotonic()), self.expire)
        self._timer.daemon = True
        self._timer.start()

    def postpone(self, seconds: float) -> None:
        """Move the deadline `seconds` later, re-opening it if it expired meanwhile."""
        self._timer.cancel()
        self._at += max(0.0, seconds)
        if self.expired and self._at > time.monotonic():
            self.reason = ""
            self.clear()
        if not self.is_set():
            self._arm()

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
            stop_early: bool, clock: Callable[[], float], reason: str = TUNE_REASON) -> TrialResult:
        """`run(knobs, ...)` (bench.run), stopped `deadline_in_s` seconds from now when given (the
        trial's message is `reason`); the seconds land under `purpose`, the trial in `stopped`
        (stopped at the deadline) or `measured`."""
        kwargs: dict[str, Any] = {} if stop_early else {"stop_early": False}
        deadline = None
        if deadline_in_s is not None:
            deadline = kwargs["cancel"] = Deadline(deadline_in_s, reason)
        t = clock()
        try:
            r = run(knobs, **kwargs)
        finally:
            if deadline is not None:
                deadline.cancel()
        seconds = clock() - t
        self.add(purpose, seconds)
        if r is None:  # a caller's run that was stopped before it started (compare's `run` may say so)
            return r
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


def takes_cancel(run: Callable[..., Any]) -> bool:
    """Whether `run` accepts a `cancel=` event (bench.run does; a caller's `run(knobs)` may not)."""
    try:
        params = inspect.signature(run).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: do not risk the keyword
        return False
    return any(p.name == "cancel" or p.kind is p.VAR_KEYWORD for p in params)


class Allowance:
    """A seconds budget over one call that runs trials (diagnose, fit_memory, scaling, compare's
    rounds), with tune()'s rules: the first trial (and any `needed` one) runs whole, since the call
    means nothing without it; every other trial starts only when its estimate (`estimate`) fits the
    seconds left and runs under a `Deadline` at budget_s x DEADLINE, so the call's wall time stays
    within budget_s x OVERRUN plus the needed trials. A trial stopped there is in `spent.stopped`
    (status "interrupted": never evidence). `budget_s=None` runs every trial whole, and counts."""

    def __init__(self, budget_s: float | None, what: str, *, clock: Callable[[], float] = work_clock,
                 whole_first: bool = True) -> None:
        check_budget_s(budget_s)
        self.budget_s, self.what, self.clock = budget_s, what, clock
        self.whole_first = whole_first  # False where the needed trials already ran (compare's rounds)
        self.t0 = clock()
        self.spent = Spend(budget_s)
        self.notes: list[str] = []  # what the budget left out, and why
        self.started = 0

    def elapsed(self) -> float:
        return self.clock() - self.t0

    def left(self) -> float | None:
        """Seconds left of the budget (None without one; negative once over)."""
        return None if self.budget_s is None else self.budget_s - self.elapsed()

    def fits(self, seconds: float) -> bool:
        """Whether `seconds` of work (an analysis, not a trial) fit the seconds left."""
        left = self.left()
        return left is None or seconds <= left

    def trial(self, run: Callable[..., TrialResult | None], knobs: Knobs, *, purpose: str = "trials",
              label: str = "", needed: bool = False, deadline: bool = True,
              starts: bool = False) -> TrialResult | None:
        """`run(knobs)` within the budget; None (and a note naming `label`) when its estimate does not
        fit the seconds left. `deadline=False` for a `run` that takes no `cancel=` (it then runs whole).
        `starts=True`: it starts whatever its estimate, but still under the deadline (compare's first round)."""
        first, left = not self.started and self.whole_first, self.left()
        if left is not None and not (first or needed or starts) and not self.spent.fits(knobs, left):
            self.spent.not_started += 1
            est = estimate(knobs, self.spent.measured) or 0.0
            self.notes.append(f"{label or knobs.label()} not run: its estimate {est:.1f} s did not fit the "
                              f"{max(0.0, left):.1f} s left of budget_s={self.budget_s:g}; raise budget_s to run it")
            return None
        at = None if left is None or first or needed or not deadline else self.budget_s * DEADLINE - self.elapsed()
        self.started += 1
        r = self.spent.run(run, knobs, purpose=purpose, deadline_in_s=at, stop_early=True, clock=self.clock,  # type: ignore[arg-type]
                           reason=f"stopped by the budget ({self.what}'s budget_s) at its deadline")
        if r is not None and r.trial_id in self.spent.stopped:
            self.notes.append(f"#{r.trial_id} ({label or knobs.label()}) stopped by the budget at its deadline: not evidence")
        elif first and self.budget_s is not None and self.elapsed() > self.budget_s:
            self.notes.append(f"the first trial alone took {self.elapsed():.1f} s of budget_s={self.budget_s:g}: it ran "
                              "whole (nothing can be said without it); raise budget_s for the rest")
        return r

    def stopped(self, r: TrialResult | None) -> bool:
        """Whether `r` was stopped by this budget's deadline (or never run): not evidence."""
        return r is None or r.trial_id in self.spent.stopped
