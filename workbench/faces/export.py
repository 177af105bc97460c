"""Export trials to TensorBoard: one run per trial, knobs as hparams, per-step series as scalars.

    bench.to_tensorboard("runs")          # then: tensorboard --logdir runs
    runs/<workbench name>/trial-0003/     one event file per trial

Each run carries the hparams plugin's records (every knob and the status as hyperparameters; the
headline figures as its metrics, so the HPARAMS tab lists and sorts the trials) and the raw
series: step time, data wait and loss per measured step. Exporting again rewrites each trial's
run instead of adding a second one, so the command can be repeated after more trials.

Sits above the core; needs the optional `tensorboard` package (`pip install "tuning-workbench[tensorboard]"`).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..core.measure import TrialResult

TENSORBOARD_INSTALL = 'pip install "tuning-workbench[tensorboard]"'
EVENTS_GLOB = "events.out.tfevents.*"


def headline(r: TrialResult) -> dict[str, float]:
    """The figures the HPARAMS tab sorts by (missing ones left out: a failed trial has none)."""
    final = next((x for x in reversed(r.losses) if math.isfinite(x)), None)
    figures = {
        "hparam/samples_per_s": r.samples_per_s,
        "hparam/step_time_ms": r.step_time_s * 1e3 if r.step_time_s is not None else None,
        "hparam/step_time_iqr_ms": r.step_time_iqr_s * 1e3 if r.step_time_iqr_s is not None else None,
        "hparam/data_wait_share": r.data_wait_share,
        "hparam/peak_memory_mb": r.peak_memory_bytes / 1e6 if r.peak_memory_bytes is not None else None,
        "hparam/final_loss": final,
    }
    return {k: float(v) for k, v in figures.items() if v is not None}


def hparams_of(trials: list[TrialResult]) -> list[dict[str, Any]]:
    """Each trial's knobs as hparams values. A knob keeps one type across all runs (the hparams
    plugin needs that): numeric only when every trial has a number, else text ("None" included)."""
    knob_dicts = [{**r.knobs.to_dict(), "checkpoint": ",".join(r.knobs.checkpoint) or "none"} for r in trials]
    keys = list(knob_dicts[0]) if knob_dicts else []
    numeric = {k: all(isinstance(d[k], (int, float)) and not isinstance(d[k], bool) for d in knob_dicts) for k in keys}
    boolean = {k: all(isinstance(d[k], bool) for d in knob_dicts) for k in keys}
    out = []
    for r, d in zip(trials, knob_dicts):
        h: dict[str, Any] = {k: (v if numeric[k] or boolean[k] else str(v)) for k, v in d.items()}
        h["status"] = r.status
        h["trial_id"] = r.trial_id if r.trial_id is not None else -1
        out.append(h)
    return out


def to_tensorboard(trials: Iterable[TrialResult], logdir: str | os.PathLike = "runs", *, name: str = "workbench") -> list[Path]:
    """Write one TensorBoard run per trial under `logdir/<name>/trial-NNNN`; returns the run folders.

    Re-running replaces each trial's earlier event files (no duplicate runs).
    """
    try:
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams
    except ImportError as e:
        raise ModuleNotFoundError(f"to_tensorboard needs the tensorboard package: {TENSORBOARD_INSTALL}",
                                  name="tensorboard") from e
    trials = list(trials)
    for r in trials:
        if not isinstance(r, TrialResult):
            raise TypeError(f"to_tensorboard takes TrialResults (bench.trials), got {type(r).__name__}")
    folder = Path(logdir) / (re.sub(r"[^A-Za-z0-9_.-]+", "_", name) or "workbench")
    written: list[Path] = []
    for i, (r, hp) in enumerate(zip(trials, hparams_of(trials))):
        run_dir = folder / (f"trial-{r.trial_id:04d}" if r.trial_id is not None else f"trial-unnumbered-{i}")
        try:
            _write_run(SummaryWriter, hparams, r, hp, run_dir)
        except OSError as e:  # a full disk, read-only or vanished folder: say so once, keep what was written
            for partial in run_dir.glob(EVENTS_GLOB):
                with contextlib.suppress(OSError):
                    partial.unlink()
            warnings.warn(f"could not write TensorBoard runs to {folder} ({e.strerror or type(e).__name__}); "
                          f"{len(written)} of {len(trials)} trials exported. The trials are unchanged "
                          "(bench.trials): export again with another folder, bench.to_tensorboard('elsewhere')",
                          RuntimeWarning, stacklevel=2)
            break
        written.append(run_dir)
    return written


def _write_run(writer_cls: Any, hparams: Any, r: TrialResult, hp: dict[str, Any], run_dir: Path) -> None:
    """One trial's run: hparams records, headline scalars, per-step series, notes."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for old in run_dir.glob(EVENTS_GLOB):  # a repeated export replaces this trial's run
        old.unlink()
    metrics = headline(r)
    with writer_cls(log_dir=str(run_dir)) as w:
        for summary in hparams(hp, metrics):  # experiment, session start, session end
            w.file_writer.add_summary(summary)
        for tag, value in metrics.items():
            w.add_scalar(tag, value, 0)
        for step, t in enumerate(r.step_times_s, start=1):
            w.add_scalar("step/time_ms", t * 1e3, step)
        for step, t in enumerate(r.data_wait_s, start=1):
            w.add_scalar("step/data_wait_ms", t * 1e3, step)
        for step, loss in enumerate(r.losses, start=1):
            if math.isfinite(loss):
                w.add_scalar("step/loss", loss, step)
        if r.message or r.notes:
            w.add_text("notes", "\n\n".join([r.message, *r.notes]).strip(), 0)
