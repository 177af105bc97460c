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
- `Budget`: THE one mechanism behind every `budget_s` (tune and its race, compare's rounds and
  turns, diagnose, fit_memory, scaling): made and validated once per verb call, passed down as the
  object to the verbs it calls (`Budget.of`, `part`); the first (needed) trial runs whole, a later
  one only when its estimate fits the seconds left, under a Deadline; `spent` (a `Spend`: seconds
  per purpose, the trials not started, named, and those stopped at the deadline) and `notes` are
  where the seconds went, read from it alone.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.knobs import Knobs, traits
from ..core.measure import TrialResult
from ..launch.cluster import QueueAccount, QueueWaits, work_clock

OVERRUN = 1.1  # the cap: tune()'s whole wall time stays within budget_s x OVERRUN
DEADLINE = 1.05  # a running trial is stopped at budget_s x DEADLINE (the rest is for recording and the result)
# A compiled trial not yet measured: this many times the costliest plain trial. On the held-out CNN
# (2-core AMD EPYC, warm inductor cache) 1 s plain trials took 8 s compiled (fp32) and 16 s (bf16).
COMPILE_PRIOR = 12.0
RECOMPILE_PRIOR = 2.0  # a compiled trial whose graph no measured compiled trial shares: a compile of its own
GRAPH_FREE = frozenset({"num_workers", "pin_memory", "persistent_workers", "prefetch_factor", "cpu_threads", "data"})
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
    the deadline on. `waits` (a cluster.QueueWaits, one explicit object) is what the trial's jobs report
    their queue waits to: the budget's `queue` account, and each wait, which the budget does not count,
    postpones the deadline by as much (`waits.waited` sums them). `seconds=None`: no deadline (a trial
    that runs whole), only the waits."""

    def __init__(self, seconds: float | None, reason: str, queue: QueueAccount | None = None) -> None:
        super().__init__()
        self.reason = ""
        self._why = reason
        self.waits = QueueWaits(queue, self.postpone)  # jobs.py reports here (cluster.waits_of), nothing else
        self._at = None if seconds is None else time.monotonic() + max(0.0, seconds)
        self._timer: threading.Timer | None = None
        self._arm()

    def _arm(self) -> None:
        if self._at is None:
            return
        self._timer = threading.Timer(max(0.0, self._at - time.monotonic()), self.expire)
        self._timer.daemon = True
        self._timer.start()

    def postpone(self, seconds: float) -> None:
        """Move the deadline `seconds` later, re-opening it if it expired meanwhile."""
        if self._at is None:
            return
        self.cancel()
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

    @property
    def timed(self) -> bool:
        """Whether a deadline is set (False: a whole trial's event, carrying only the queue account)."""
        return self._at is not None

    def cancel(self) -> None:
        """Stop the timer (the trial ended before the deadline)."""
        if self._timer is not None:
            self._timer.cancel()


@dataclass
class Spend:
    """The account of a seconds budget (a `Budget`'s, read from it alone): seconds per purpose, the
    trials the budget kept out (named) or stopped at the deadline; `measured` (knobs, seconds, full
    window) is the evidence of the estimates."""

    budget_s: float | None
    seconds: dict[str, float] = field(default_factory=dict)  # purpose (race, confirm, explain, ...) -> seconds
    not_started: int = 0  # trials whose estimate did not fit the seconds left
    stopped: list[int] = field(default_factory=list)  # trial ids stopped at the deadline
    measured: list[tuple[Knobs, float, bool]] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)  # the trials not started, by label
    queue: QueueAccount | None = field(default=None, repr=False, compare=False)  # the budget's queue account

    @property
    def queued_s(self) -> float:
        """Wall-clock seconds during which all of the budget's jobs only waited in a queue (not spent)."""
        return self.queue.total if self.queue is not None else 0.0

    def add(self, purpose: str, seconds: float) -> None:
        self.seconds[purpose] = self.seconds.get(purpose, 0.0) + seconds

    def __str__(self) -> str:
        parts = ", ".join(f"{p} {s:.1f} s" for p, s in self.seconds.items()) or "nothing run"
        extra = [f"{self.queued_s:.1f} s in a queue (not spent)"] if self.queued_s >= 0.05 else []
        if self.not_started:
            names = f" ({', '.join(self.left_out)})" if self.left_out else ""
            extra.append(f"{self.not_started} trial(s) not started: their estimate did not fit the seconds left{names}")
        if self.stopped:
            extra.append(f"{len(self.stopped)} stopped at the deadline (not evidence): "
                         + ", ".join(f"#{t}" for t in self.stopped))
        return "; ".join([parts, *extra])


def _label(knobs: Knobs, run: Callable[..., Any]) -> str:
    """`knobs` labelled as the results table labels them: against the defaults of the workbench whose
    `run` this is (a bound `bench.run`); against the default Knobs for any other callable."""
    defaults = getattr(getattr(run, "__self__", None), "defaults", None)
    return knobs.label(defaults if isinstance(defaults, Knobs) else None)


def takes_cancel(run: Callable[..., Any]) -> bool:
    """Whether `run` accepts a `cancel=` event (bench.run does; a caller's `run(knobs)` may not)."""
    try:
        params = inspect.signature(run).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: do not risk the keyword
        return False
    return any(p.name == "cancel" or p.kind is p.VAR_KEYWORD for p in params)


class Budget:
    """THE seconds budget of one verb call (tune and its race, compare's rounds and turns, diagnose,
    fit_memory, scaling): made once from `budget_s` (validated here, once) and passed down, as the
    object, to the verbs it calls. The first trial (and any `needed` one) runs whole, since the call
    means nothing without it; every other trial starts only when its estimate (`estimate`, from this
    account's measured trials) fits the seconds left, and runs under a `Deadline` at budget_s x
    DEADLINE, so the call's wall time stays within budget_s x OVERRUN plus the needed trials. A trial
    stopped there is in `spent.stopped` (status "interrupted": never evidence). `spent` (Spend) and
    `notes` are where the seconds went; `str()` says it in one line. `budget_s=None` runs every trial
    whole, and counts."""

    def __init__(self, budget_s: float | None, what: str, *, clock: Callable[[], float] = work_clock,
                 whole_first: bool = True) -> None:
        check_budget_s(budget_s)
        queue = QueueAccount(clock)
        self._open(budget_s, what, queue, Spend(budget_s, queue=queue), [], whole_first)

    def _open(self, budget_s: float | None, what: str, queue: QueueAccount, spent: Spend, notes: list[str],
              whole_first: bool) -> None:
        self.budget_s, self.what = budget_s, what
        self.queue = queue  # this budget's own account of the seconds its jobs only waited in a queue
        self.clock = queue.clock  # `clock` less those seconds: the budget never spends queue time
        self.whole_first = whole_first  # False where the needed trials already ran (compare's rounds)
        self.t0 = self.clock()
        self.spent = spent  # the account: seconds per purpose, trials not started, stopped, measured
        self.notes = notes  # what the budget left out, and why
        self.started = 0

    @classmethod
    def of(cls, budget_s: float | Budget | None, what: str, **kwargs: Any) -> Budget:
        """The Budget a calling verb passed down, as it is; else a new one from `budget_s` seconds."""
        return budget_s if isinstance(budget_s, Budget) else cls(budget_s, what, **kwargs)

    def part(self, seconds: float | None = None, what: str | None = None) -> Budget:
        """A slice of this budget for a verb it calls (compare's rounds or turns): at most `seconds`
        (None: all that is left) and never more than is left; its trials, seconds and notes land in
        this account. Its trials all run under its deadline (its caller's first trial already ran)."""
        part = object.__new__(Budget)
        part._open(self.cap(seconds), what or self.what, self.queue, self.spent, self.notes, False)
        return part

    def __str__(self) -> str:
        return str(self.spent)

    def elapsed(self) -> float:
        return self.clock() - self.t0

    def left(self) -> float | None:
        """Seconds left of the budget (None without one; negative once over)."""
        return None if self.budget_s is None else self.budget_s - self.elapsed()

    def cap(self, seconds: float | None, keep_s: float = 0.0) -> float | None:
        """`seconds` (None: no cap of its own), never more than the seconds left less `keep_s`."""
        left = self.left()
        if left is None:
            return seconds
        return left - keep_s if seconds is None else min(seconds, left - keep_s)

    def fits(self, seconds: float, label: str = "") -> bool:
        """Whether `seconds` of work (an analysis, a round, turns) fit the seconds left; when they do
        not and `label` names the work, a note says it was not run."""
        left = self.left()
        if left is None or seconds <= left:
            return True
        if label:
            self.notes.append(f"{label} not run: about {seconds:.1f} s, over the {max(0.0, left):.1f} s left "
                              f"of budget_s={self.budget_s:g}")
        return False

    def estimate(self, knobs: Knobs) -> float | None:
        """A trial of `knobs`'s seconds from this account's measured trials (`estimate`; None before any)."""
        return estimate(knobs, self.spent.measured)

    def fits_trial(self, knobs: Knobs, factor: float = 1.0) -> bool:
        """Whether a trial of `knobs` (its estimate x `factor`) fits the seconds left (True before any estimate)."""
        est = self.estimate(knobs)
        return est is None or self.fits(est * factor)

    def median_trial_s(self) -> float:
        """The median measured trial's seconds (0 before any)."""
        done = sorted(s for _k, s, _full in self.spent.measured)
        return done[len(done) // 2] if done else 0.0

    def trials_left(self) -> int | None:
        """How many median trials fit the seconds left (None without a budget or before any trial)."""
        left = self.left()
        if left is None or not self.spent.measured:
            return None
        return max(0, int(left / max(self.median_trial_s(), 1e-6)))

    @contextlib.contextmanager
    def charge(self, purpose: str) -> Iterator[None]:
        """The seconds of the work inside (not a trial: turns, analyses, an explanation) under `purpose`."""
        t = self.clock()
        try:
            yield
        finally:
            self.spent.add(purpose, self.clock() - t)

    def trial(self, run: Callable[..., TrialResult | None], knobs: Knobs, *, purpose: str = "trials",
              label: str = "", needed: bool = False, deadline: bool = True, starts: bool = False,
              stop_early: bool = True) -> TrialResult | None:
        """`run(knobs)` within the budget; None (and a note naming `label`) when its estimate does not
        fit the seconds left. `deadline=False` for a `run` that takes no `cancel=` (it then runs whole).
        `starts=True`: it starts whatever its estimate, but still under the deadline (compare's first round)."""
        first = not self.started and self.whole_first
        whole = first or needed
        left = self.left()
        est = None if left is None or whole or starts else self.estimate(knobs)  # once per trial
        if est is not None and not self.fits(est):
            self.spent.not_started += 1
            label = label or _label(knobs, run)
            self.spent.left_out.append(label)
            self.notes.append(f"{label} not run: its estimate {est:.1f} s did not fit the "
                              f"{max(0.0, left):.1f} s left of budget_s={self.budget_s:g}; raise budget_s to run it")  # type: ignore[arg-type]
            return None
        at = None if left is None or whole or not deadline else self.budget_s * DEADLINE - self.elapsed()  # type: ignore[operator]
        self.started += 1
        r = self._run(run, knobs, purpose, at, stop_early, cancels=deadline)
        if r is not None and r.trial_id in self.spent.stopped:
            self.notes.append(f"#{r.trial_id} ({label or _label(knobs, run)}) stopped by the budget at its deadline: not evidence")
        elif first and left is not None and self.elapsed() > self.budget_s:  # type: ignore[operator]
            self.notes.append(f"the first trial alone took {self.elapsed():.1f} s of budget_s={self.budget_s:g}: it ran "
                              "whole (nothing can be said without it); raise budget_s for the rest")
        return r

    def _run(self, run: Callable[..., TrialResult | None], knobs: Knobs, purpose: str, deadline_in_s: float | None,
             stop_early: bool, cancels: bool = True) -> TrialResult | None:
        """`run(knobs, ...)` (bench.run), stopped `deadline_in_s` seconds from now when given; its seconds
        land under `purpose`, the trial in `stopped` (stopped at the deadline) or `measured`. A `run`
        that takes `cancel=` (`cancels`) always gets a Deadline, so its jobs report their queue waits to
        this budget's account; a trial's evidence for the estimates leaves its own wait out."""
        kwargs: dict[str, Any] = {} if stop_early else {"stop_early": False}
        deadline = None
        if deadline_in_s is not None or (cancels and takes_cancel(run)):
            why = f"stopped by the budget ({self.what}'s budget_s) at its deadline"
            deadline = kwargs["cancel"] = Deadline(deadline_in_s, why, self.queue)
        t, wall = self.clock(), self.queue.wall()
        try:
            r = run(knobs, **kwargs)
        finally:
            if deadline is not None:
                deadline.cancel()
        seconds = self.clock() - t
        self.spent.add(purpose, seconds)
        if r is None:  # a caller's run that was stopped before it started (compare's `run` may say so)
            return r
        if deadline is not None and deadline.expired and not r.ok:
            self.spent.stopped.append(r.trial_id)  # type: ignore[arg-type]
        else:
            own = self.queue.wall() - wall - (deadline.waits.waited if deadline is not None else 0.0)
            self.spent.measured.append((knobs, max(0.0, min(seconds, own)), "stopped_early" not in r.extra))
        return r

    def stopped(self, r: TrialResult | None) -> bool:
        """Whether `r` was stopped by this budget's deadline (or never run): not evidence."""
        return r is None or r.trial_id in self.spent.stopped
