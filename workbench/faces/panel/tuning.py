"""The panel's "Tune" button: `tune(budget_s=...)` on the panel's worker thread, its trials on the
panel's bar, its Stop button and its seconds budget (widgets-free parts; the panel owns the widgets).

`PanelBench` is the workbench as tune() sees it from the panel: every trial reports into the panel's
TrialProgress (so the bar, the status and "stopping early: clearly slower" show there), and stops
at the next step when Stop is pressed, as well as at the budget's deadline (budget.Deadline).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ...core.progress import TrialProgress, budget_left
from ...launch.cluster import QueueWaits, waits_of
from ...results.protocol import Bench

DEFAULT_BUDGET_S = 60.0  # the budget box's first value, in seconds


class TuneStopped(Exception):
    """Stop was pressed during a tune: the trials so far stay in the log; no result is returned."""


class Either(threading.Event):
    """A trial's cancel event set when either the budget's deadline (`first`, a budget.Deadline) or
    the panel's Stop (`second`) is; `reason` is the deadline's, so Stop reads as the user's stop.
    The runner only asks `is_set()` at each step boundary."""

    def __init__(self, first: threading.Event | None, second: threading.Event) -> None:
        super().__init__()
        self.first, self.second = first, second

    def is_set(self) -> bool:
        return super().is_set() or self.second.is_set() or (self.first is not None and self.first.is_set())

    @property
    def reason(self) -> str:
        return getattr(self.first, "reason", "") if self.first is not None else ""

    @property
    def expired(self) -> bool:
        """Set by the budget's deadline alone (not Stop): a job still queued then waits (cluster.watch)."""
        return (bool(getattr(self.first, "expired", False)) and not self.second.is_set()
                and not super().is_set())

    @property
    def waits(self) -> QueueWaits | None:
        """The deadline's QueueWaits (None without a deadline): a job's queue wait reaches the budget
        through the panel's Stop as it does without it."""
        return waits_of(self.first)


class PanelBench:
    """`bench` for tune() in the panel: `run` adds the panel's progress and Stop; all else is bench's."""

    def __init__(self, bench: Bench, progress: TrialProgress, stop: threading.Event) -> None:
        self.bench, self.progress, self.stop = bench, progress, stop

    def __getattr__(self, name: str) -> Any:
        return getattr(self.bench, name)

    def run(self, knobs: Any = None, /, **kwargs: Any) -> Any:
        """bench.run with the panel's TrialProgress, stopped by Stop or the deadline; TuneStopped once
        Stop was pressed (the tune ends before its next trial)."""
        if self.stop.is_set():
            raise TuneStopped("stopped by the user")
        kwargs["cancel"] = Either(kwargs.get("cancel"), self.stop)
        if kwargs.get("progress") is None:
            kwargs["progress"] = self.progress
        return self.bench.run(knobs, **kwargs)


class Countdown:
    """The seconds left of a running tune, for the panel's labels ("" when no tune runs)."""

    def __init__(self) -> None:
        self.budget_s: float | None = None
        self.t0 = 0.0

    def start(self, budget_s: float) -> None:
        self.budget_s, self.t0 = budget_s, time.monotonic()

    def stop(self) -> None:
        self.budget_s = None

    def suffix(self) -> str:
        """" · 23 s of 60 s left" while a tune runs, else ""."""
        left = budget_left(self.budget_s, self.t0, time.monotonic())
        return f" · {left}" if left else ""


def tune_summary(result: Any) -> str:
    """One line for the status when a tune ends: the best knobs, the speedup, how the seconds went."""
    sp = f"{result.speedup:.2f}x" if result.speedup else "n/a"
    spent = f"; budget: {result.spent}" if result.spent is not None else ""
    return (f"tuned in {result.trials_used} trials, {result.seconds:.0f} s of {result.budget_s:g} s: "
            f"{sp} vs the start ({result.answer}){spent}")
