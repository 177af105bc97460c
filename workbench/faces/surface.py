"""What the Workbench class leans on outside itself: the names that left its public surface,
the notebook extra's check, and where a workbench's log goes."""

from __future__ import annotations

import concurrent.futures
import os
from pathlib import Path
from typing import Any

from ..launch.runner import TrialInterrupted
from ..results import safe_file_name
from ..results.comparison import real_run
from ..results.models import of_model

# Removed from the public surface (issue 42): old name -> (private name, what to use instead).
DEPRECATED = {
    "log_to": ("_log_to", "pass log=... to Workbench(...)"),
    "block_params": ("blocks", "use bench.blocks (a dict of block name -> parameter count)"),
    "expect_slow": ("_expect_slow", "run() warns by itself before a trial known to be far slower"),
    "came_from": ("_came_from", "the CLI and wb.demo() record where a workbench can be rebuilt"),
    "set_baseline": ("_set_baseline", "assign bench.baseline = trial"),
    "interleave": ("_interleave", "use bench.compare(a, b, method='interleave')"),
    "steps_frame": ("_steps_frame", "use bench.log.steps_frame()"),
    "scaling_chart": ("_scaling_chart", "use bench.scaling(...).chart()"),
}


NOTEBOOK_INSTALL = 'pip install "tuning-workbench[notebook]"'
NOTEBOOK_MODULES = ("ipywidgets", "anywidget", "altair", "vl_convert")


def require_notebook(what: str, modules: tuple[str, ...] = NOTEBOOK_MODULES) -> None:
    """Raise ModuleNotFoundError naming the install command when the notebook extra is missing."""
    import importlib.util

    for name in modules:
        try:
            missing = importlib.util.find_spec(name) is None
        except (ImportError, ValueError):  # a None entry in sys.modules, or a broken install
            missing = True
        if missing:
            raise ModuleNotFoundError(f"{what} needs {name}, part of the notebook extra: {NOTEBOOK_INSTALL}",
                                      name=name)


def log_path(log: str | os.PathLike | None, name: str, participant: str | None = None) -> Path | None:
    """A directory gets one `<name>.jsonl` per workbench name, inside `<participant>/` when a
    participant is named (a workshop's shared folder); a path ending in .jsonl is used as is."""
    if log is None:
        return None
    p = Path(log)
    if p.suffix == ".jsonl":
        return p
    if participant is not None:
        p = p / safe_file_name(participant)
    return p / (safe_file_name(name, what="workbench") + ".jsonl")


def fastest_trial(log: Any) -> Any:
    """The fastest ok trial of the log's model (`log.model`; every trial's when None), what `to_code()`,
    `to_lightning()` and `to_training_arguments()` export when given no trial; None when there is none.
    A real run's row is never taken (it is the user's run, not a trial), nor another model's trial."""
    done = [t for t in of_model(log.trials, log.model) if t.ok and t.samples_per_s and not real_run(t)]
    return max(done, key=lambda t: t.samples_per_s) if done else None


def knobs_of(log: Any, trial: Any, verb: str) -> Any:
    """The Knobs of a trial id, a TrialResult or a Knobs value; None takes `fastest_trial` (else None)."""
    from ..core.knobs import Knobs
    from ..core.measure import TrialResult

    if trial is None:
        trial = fastest_trial(log)
        if trial is None:
            return None
    knobs = log.get(trial).knobs if isinstance(trial, int) and not isinstance(trial, bool) else trial
    knobs = knobs.knobs if isinstance(knobs, TrialResult) else knobs
    if not isinstance(knobs, Knobs):
        raise TypeError(f"{verb} takes a trial id, a TrialResult or Knobs, got {type(trial).__name__}")
    return knobs


def wait_for(future: concurrent.futures.Future) -> Any:
    """future.result(), waking every 0.1 s: a Ctrl-C (SIGINT) that the kernel delivered to another
    thread only raises in the main thread when it runs Python code, not while it blocks on a lock."""
    while True:
        try:
            return future.result(timeout=0.1)
        except concurrent.futures.TimeoutError:
            continue


def outcome_of(future: Any) -> Any:
    """The TrialResult a finished trial future holds, interrupted or not."""
    try:
        return future.result()
    except TrialInterrupted as e:
        return e.result
