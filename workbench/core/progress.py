"""Progress of a running trial as plain numbers: the trial thread stores them, readers poll.

Nothing inside the measured window calls into a UI. The runner only assigns three attributes per
step (no locks, no callbacks, no I/O); a panel, a tqdm bar or a terminal line reads them from its
own thread, at most `HZ` times a second, through a `Poller`.
"""

from __future__ import annotations

import contextlib
import math
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

HZ = 4.0  # readers look at most this often (the panel, terminal bars)

Snapshot = tuple[str, int, int]  # (phase, steps done, steps total)
FAILED_PHASES = ("error", "oom", "nan", "interrupted")  # a trial's end state when it did not finish ok
Callback = Callable[[str, int, int], None]


class TrialProgress:
    """Where the current trial is. Written by the trial thread only; read by anyone.

    Each attribute store is atomic under the GIL; a reader may see `done` from one step and
    `phase` from the next, which is harmless for a progress display.
    """

    __slots__ = ("done", "phase", "total")

    def __init__(self) -> None:
        self.phase = "idle"  # idle | loading data | starting workers | compiling | warming up | measuring | done
        self.done = 0  # optimizer steps finished (warm-up + measured)
        self.total = 0

    def set(self, phase: str, done: int, total: int) -> None:
        """Three attribute stores: cheap enough for the measured loop."""
        self.phase, self.done, self.total = phase, done, total

    def snapshot(self) -> Snapshot:
        return self.phase, self.done, self.total

    def __repr__(self) -> str:
        return f"<TrialProgress {self.phase} {self.done}/{self.total}>"


class Poller:
    """Calls `fn(phase, done, total)` from its own thread whenever the progress changed, at most
    `hz` times a second, and once more with the final state when stopped.

    >>> with Poller(progress, print): bench_thread_runs_trial()
    """

    def __init__(self, progress: TrialProgress, fn: Callback, *, hz: float = HZ) -> None:
        if hz <= 0:
            raise ValueError(f"hz must be > 0, got {hz}")
        self.progress = progress
        self.fn = fn
        self.period = 1.0 / hz
        self._stop = threading.Event()
        self._last: Snapshot | None = None
        self._thread = threading.Thread(target=self._loop, name="workbench-progress", daemon=True)

    def _emit(self) -> None:
        snap = self.progress.snapshot()
        if snap != self._last:
            self._last = snap
            self.fn(*snap)

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            self._emit()

    def start(self) -> Poller:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop polling and report the final state (from the caller's thread)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        self._emit()

    def __enter__(self) -> Poller:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ---- tqdm: a bar per trial, and one for a search (tune, diagnose, fit_memory) ------------------
# `progress` arguments mean: None = auto (a bar in Jupyter, or when stderr is a terminal; nothing
# in CI logs and pipes), True = always, False = never, a callable = fn(phase, done, total) at <= HZ.
_context = threading.local()  # the search bar of this thread, and whether it turned bars off


def wanted(progress: object) -> bool:
    """Whether `progress` (None | bool) asks for a bar here and now."""
    if progress is None:
        if getattr(_context, "off", False):
            return False  # inside tune(progress=False): its trials stay quiet too
        return _in_notebook() or _stderr_is_terminal()
    return bool(progress)


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stream
        return False


def _in_notebook() -> bool:
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    return shell is not None and getattr(shell, "kernel", None) is not None


def make_bar(**kwargs: Any) -> Any:
    """A `tqdm.auto` bar (a widget in Jupyter, text on stderr elsewhere); text if ipywidgets is missing."""
    kwargs.setdefault("mininterval", 1.0 / HZ)
    kwargs.setdefault("dynamic_ncols", True)
    try:
        from tqdm.auto import tqdm

        return tqdm(**kwargs)
    except ImportError:  # tqdm.notebook without ipywidgets: "IProgress not found"
        from tqdm.std import tqdm

        return tqdm(**kwargs)


class TrialBar:
    """One trial's bar: steps done of warm-up + measured, the phase as postfix. Called by a Poller."""

    def __init__(self, desc: str = "trial", *, leave: bool = True) -> None:
        self.bar = make_bar(desc=desc, total=1, unit="step", leave=leave)
        self.steps = 0  # the last step count seen before the trial's end state
        self.failed = False

    def __call__(self, phase: str, done: int, total: int) -> None:
        self.bar.total = max(1, total)
        self.failed = phase in FAILED_PHASES
        if phase != "done" and not self.failed:
            self.steps = done
        # "done" is the runner's final report (also after a failure); a failed end keeps the bar where it stopped
        self.bar.n = self.steps if self.failed else done
        self.bar.set_postfix_str(phase, refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()
        if self.failed and hasattr(self.bar, "container"):  # tqdm.notebook: red, never a green 100%
            self.bar.disp(bar_style="danger", check_delay=False)


@contextlib.contextmanager
def shown(progress: object, desc: str = "trial") -> Iterator[TrialProgress]:
    """The TrialProgress to hand the runner while the block runs, and the display that reads it.

    The runner only stores numbers into it. A callable `(phase, done, total)` and the tqdm bar
    (None: wanted in Jupyter or on a terminal; True/False force it) are fed by a Poller at <= HZ
    from its own thread; a TrialProgress passed in is used as is.
    """
    if isinstance(progress, TrialProgress):
        yield progress
        return
    trial = TrialProgress()
    if callable(progress):
        with Poller(trial, progress):
            yield trial
        return
    if not wanted(progress):
        yield trial
        return
    bar = TrialBar(desc, leave=getattr(_context, "search", None) is None)  # inside a search: transient
    try:
        with Poller(trial, bar):
            yield trial
    finally:
        bar.close()


def budget_left(budget_s: float | None, t0: float, now: float) -> str:
    """"23 s of 60 s left" for a search with a seconds budget that started at `t0` ("" without one)."""
    if budget_s is None:
        return ""
    return f"{max(0.0, budget_s - (now - t0)):.0f} s of {budget_s:g} s left"


def trial_word(result: Any) -> str:
    """A finished trial in a few words: its rate, "stopped early: clearly slower", or its status."""
    extra = getattr(result, "extra", None) or {}
    if extra.get("stopped_early"):
        return "stopping early: clearly slower"
    return f"{result.samples_per_s:,.0f} samples/s" if getattr(result, "samples_per_s", None) else str(result.status)


class SearchBar:
    """Counts the trials of a search as they land in the log; analyses say what runs via `note()`.
    With a seconds budget (`budget_s`), the postfix also says how many seconds are left."""

    def __init__(self, desc: str, total: int | None, budget_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.bar = make_bar(desc=desc, total=total, unit="trial", position=0)
        self.seen: set[int] = set()
        self.budget_s, self.clock = budget_s, clock
        self.t0 = clock()

    def _postfix(self, text: str) -> str:
        left = budget_left(self.budget_s, self.t0, self.clock())
        return f"{text} · {left}" if left else text

    def on_trial(self, result: Any) -> None:
        """ResultLog observer: one tick per new trial (a baseline change is not a trial)."""
        tid = getattr(result, "trial_id", None)
        if tid is None or tid in self.seen:
            return
        self.seen.add(tid)
        self.bar.set_postfix_str(self._postfix(f"#{tid} {trial_word(result)}"), refresh=False)
        self.bar.update(1)

    def note(self, text: str) -> None:
        self.bar.set_postfix_str(self._postfix(text))

    def close(self, finished: bool) -> None:
        if finished and self.bar.total is not None and self.bar.n < self.bar.total:
            self.bar.total = self.bar.n  # stopped early on purpose (budget left over): not a failure
            self.bar.refresh()
        self.bar.close()


def _seconds(budget_s: object) -> float | None:
    """`budget_s` when it is a usable number of seconds, else None (the search itself refuses bad ones)."""
    ok = isinstance(budget_s, (int, float)) and not isinstance(budget_s, bool) and math.isfinite(budget_s) and budget_s > 0
    return float(budget_s) if ok else None  # type: ignore[arg-type]


@contextlib.contextmanager
def search(progress: object, desc: str, *, log: Any, total: int | None = None,
           budget_s: object = None) -> Iterator[None]:
    """A bar over a whole search (tune, diagnose, fit_memory, scaling), ticked by `log`'s observer;
    with `budget_s` (seconds) its postfix says how many are left ("#7 812 samples/s · 23 s of 60 s left").

    Its trials' own bars become transient; `progress=False` silences them as well.
    """
    outer = (getattr(_context, "search", None), getattr(_context, "off", False))
    if outer[0] is not None or not wanted(progress):
        _context.off = outer[1] or progress is False
        try:
            yield
        finally:
            _context.off = outer[1]
        return
    bar = SearchBar(desc, total, _seconds(budget_s))
    log.observe(bar.on_trial)
    _context.search = bar
    finished = False
    try:
        yield
        finished = True
    finally:
        _context.search = None
        log.unobserve(bar.on_trial)
        bar.close(finished)


def note(text: str) -> None:
    """Say what the current search is doing (e.g. "profiler"); a no-op without a search bar."""
    bar = getattr(_context, "search", None)
    if bar is not None:
        bar.note(text)
