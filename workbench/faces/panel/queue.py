"""TrialQueue: one worker thread serving a one-slot, debounced, latest-wins job queue.

Plain threading, no widgets: the panel puts a job whenever a control changes; the worker waits
out the debounce, then calls `handler(job)` (which runs a trial through `bench.run`, holding the
workbench's lock). A job put while another waits replaces it; a job put while one runs waits for
it. `stop()` drops the queued job and sets `cancel`, which the running trial checks at every step.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

DEBOUNCE_S = 0.2  # a burst of changes (typing "128" in a box) closer than this runs once


class TrialQueue:
    """`put(job)`, `stop()`, `wait()`, `busy`, `close()`; `cancel` is the running job's stop event."""

    def __init__(self, handler: Callable[[Any], None], *, debounce_s: float = DEBOUNCE_S,
                 on_error: Callable[[BaseException], None] | None = None, name: str = "workbench-panel") -> None:
        if debounce_s < 0:
            raise ValueError(f"debounce_s must be >= 0, got {debounce_s}")
        self.handler = handler
        self.on_error = on_error
        self.debounce_s = debounce_s
        self.cancel = threading.Event()
        self._cv = threading.Condition()
        self._job: Any = None
        self._queued = False
        self._due = 0.0  # monotonic time the queued job may start
        self._busy = False
        self._closed = False
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.thread.start()

    def put(self, job: Any, *, debounce: bool = True) -> None:
        """Queue `job`, replacing any queued one (latest wins); it starts after the debounce."""
        with self._cv:
            self._job, self._queued = job, True
            self._due = time.monotonic() + (self.debounce_s if debounce else 0.0)
            self._cv.notify_all()

    def stop(self) -> bool:
        """Drop the queued job and cancel the running one at its next step; True if one was running."""
        with self._cv:
            self._job, self._queued = None, False
            if self._busy:
                self.cancel.set()
            self._cv.notify_all()
            return self._busy

    def wait(self, timeout: float | None = None) -> bool:
        """Block until nothing is queued or running; False if `timeout` seconds passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while self._queued or self._busy:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cv.wait(left)
        return True

    @property
    def busy(self) -> bool:
        """True while a job runs or waits."""
        return self._busy or self._queued

    @property
    def running(self) -> bool:
        """True while a job runs (not merely queued)."""
        return self._busy

    def close(self) -> None:
        """Stop the worker thread (after the running job, which is cancelled)."""
        with self._cv:
            self._closed = True
            self._job, self._queued = None, False
            self.cancel.set()
            self._cv.notify_all()

    def _serve(self) -> None:
        while True:
            with self._cv:
                while not self._closed and (not self._queued or time.monotonic() < self._due):
                    self._cv.wait(None if not self._queued else max(0.0, self._due - time.monotonic()))
                if self._closed:
                    return
                job, self._job, self._queued = self._job, None, False
                self.cancel.clear()
                self._busy = True
            try:
                self.handler(job)
            except Exception as e:  # the queue must survive anything the handler does
                if self.on_error is not None:
                    self.on_error(e)
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()
