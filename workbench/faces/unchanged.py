"""What the Workbench says before it measures: a knob that changes nothing in this step (core/knobs/inert.py),
said at `run` before the trial and answered by `compare` without measuring; warnings attributed to the caller.
"""

from __future__ import annotations

import os
import sys
import warnings
from dataclasses import replace
from typing import Any

from ..core.knobs import Knobs
from ..core.knobs.inert import differing, inert_changes, same_step, sentence
from ..core.measure import TrialResult
from ..results.stats import Comparison

UNCHANGED = "unchanged"  # Comparison.method of two configurations that run the same step (nothing measured)


def warn_at_caller(message: str) -> None:
    """A UserWarning attributed to the first frame outside this package (the user's cell or script),
    so the notebook shows the user's call, not the trial thread's internals."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # workbench/
    frame, level = sys._getframe(1), 2
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, UserWarning, stacklevel=level)


def inert_note(bench: Any, knobs: Knobs) -> str | None:
    """The sentence for the knobs set away from the workbench's defaults that change nothing in this step
    (None: every change may act). `run` warns with it before the trial and adds it to the trial's notes.
    The rules read the device facts of where the trials run (`bench._facts`: the node's with an executor),
    asked only when a knob differs from the defaults (with an executor, the first ask is a probe job)."""
    if not differing(bench.defaults, knobs):
        return None
    changes = inert_changes(bench.defaults, knobs, bench._facts.device, **bench.workload.context_kwargs())
    if not changes:
        return None
    return f"{sentence(changes, knobs)}: this trial runs the same step as without {'it' if len(changes) == 1 else 'them'}"


def with_note(result: TrialResult, note: str | None) -> TrialResult:
    """The trial with `note` among its notes (once)."""
    return replace(result, notes=(*result.notes, note)) if note and note not in result.notes else result


def unchanged(bench: Any, ra: TrialResult, rb: TrialResult, margin: float) -> Comparison | None:
    """"same", decided without measuring, when the two trials' knobs differ only in knobs that change nothing in
    this step (they run the same step; their figures differ by noise alone). None otherwise, or when a side
    failed (compare says why). The rules read `bench._facts` (the node's device with an executor)."""
    if not (ra.ok and rb.ok and ra.samples_per_s and rb.samples_per_s) or not differing(ra.knobs, rb.knobs):
        return None
    changes = same_step(ra.knobs, rb.knobs, bench._facts.device, **bench.workload.context_kwargs())
    if changes is None:
        return None
    gap = rb.samples_per_s / ra.samples_per_s - 1
    note = f"{sentence(changes, rb.knobs)}; the two trials' {gap:+.1%} is this machine's noise."
    return Comparison(ra.trial_id, rb.trial_id, 1.0, 1.0, 1.0, False, (ra.trial_id,), (rb.trial_id,),
                      (float(ra.samples_per_s),), (float(rb.samples_per_s),), 0, bench.noise, None, note, margin,
                      0.0, method=UNCHANGED)
