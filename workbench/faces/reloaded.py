"""Which model a trial measured, and what a new Workbench found in its log.

A Workbench stamps each trial with its model's fingerprint (core/fingerprint.py: a hash of the module classes,
the parameter and buffer names, shapes and dtypes, and the parameter count), so a log that outlives an edit
of the model never compares the edited model against the old one: results/models.py keeps the old trials in
the table, marked by their `model` column, and the new model's first ok trial becomes its baseline.
When the Workbench is created on a log that already holds trials, `announce` says once what was reloaded, from
where, and which trial is the baseline.
"""

from __future__ import annotations

import sys
from typing import Any

from ..core.fingerprint import fingerprint  # noqa: F401  (re-exported: the Workbench stamps with it)
from ..results import ResultLog
from ..results.models import model_of


def reload_text(log: ResultLog, model: str) -> str | None:
    """One paragraph on what `log` held before this workbench's first trial: how many trials, how many of
    another model (kept, never compared), and the baseline (None when the log held no trial)."""
    trials = log.trials
    if not trials:
        return None
    where = log.path if log.path is not None else "memory"
    text = f"Reloaded {len(trials)} trial{'s' if len(trials) != 1 else ''} from {where}"
    others = [r for r in trials if model_of(r) != model]
    if others:
        unstamped = sum(1 for r in others if not model_of(r))
        why = "an older workbench wrote them without a model fingerprint" if unstamped == len(others) else (
            "the model changed since they ran")
        text += (f"; {len(others)} of them measured another model ({why}): they stay in the log and in "
                 "bench.results (column `model`), never compared with this one")
    base = log.baseline
    if base is None:
        text += ". This model has no trial yet: its first ok trial becomes the baseline."
    else:
        rate = f", {base.samples_per_s:,.1f} samples/s" if base.samples_per_s else ""
        text += f". The baseline is trial #{base.trial_id} ({base.knobs.label(log.defaults)}{rate})."
    return text + " A new log: Workbench(..., log='another-folder') or log=None (memory only)."


def announce(text: str | None) -> None:
    """Say `text` once where the user looks: the cell's output in a notebook, stderr in a script (its
    stdout may be JSON: the CLI's --json)."""
    if not text:
        return
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    print(text, file=sys.stdout if shell is not None and hasattr(shell, "kernel") else sys.stderr)


def stamp(result: Any, model: str) -> None:
    """Write the model's fingerprint into a trial about to be logged (a trial a job brought back keeps its own)."""
    result.extra.setdefault("model", model)
