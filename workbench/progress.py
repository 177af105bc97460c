"""Progress of a running trial as plain numbers: the trial thread stores them, readers poll.

Nothing inside the measured window calls into a UI. The runner only assigns three attributes per
step (no locks, no callbacks, no I/O); a panel, a tqdm bar or a terminal line reads them from its
own thread, at most `HZ` times a second, through a `Poller`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

HZ = 4.0  # readers look at most this often (the panel, terminal bars)

Snapshot = tuple[str, int, int]  # (phase, steps done, steps total)
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
