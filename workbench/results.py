"""ResultLog: every trial of a workbench, in order, on disk and as a pandas DataFrame.

The log is append-only JSONL (one record per line, flushed and fsynced), so a kernel restart or
a crash mid-trial loses nothing that finished. Nothing here ever unpickles: records are plain
JSON. `compare()` turns two trials' raw step times into a verdict that refuses to crown a winner
inside the noise.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .measure import TrialResult

MIN_EFFECT = 0.02  # differences under 2% are called noise even when the interval excludes 0
CONFIDENCE = 0.95

# The columns a reader wants first; knobs and details follow.
SUMMARY_COLUMNS = [
    "trial_id", "label", "status", "samples_per_s", "speedup", "verdict", "step_time_ms",
    "step_time_iqr_ms", "data_wait_share", "peak_memory_mb", "startup_s", "compile_s",
    "final_loss", "message",
]


@dataclass(frozen=True)
class Comparison:
    """B against A from per-sample step times: ratio of means with a bootstrap interval."""

    a: int | None  # trial ids
    b: int | None
    speedup: float  # A's time per sample / B's: 1.25 means B does 25% more samples per second
    low: float  # CONFIDENCE interval of the speedup
    high: float
    beyond_noise: bool

    @property
    def verdict(self) -> str:
        return "beyond noise" if self.beyond_noise else "within noise"

    def __str__(self) -> str:
        pct = (self.speedup - 1) * 100
        interval = f"{(self.low - 1) * 100:+.1f}% … {(self.high - 1) * 100:+.1f}%"
        if not self.beyond_noise:
            return (f"#{self.b} vs #{self.a}: within noise ({pct:+.1f}%, "
                    f"{CONFIDENCE:.0%} interval {interval}); no winner")
        word = "faster" if pct > 0 else "slower"
        return (f"#{self.b} is {abs(pct):.1f}% {word} than #{self.a} (beyond noise: "
                f"{CONFIDENCE:.0%} interval {interval})")

    __repr__ = __str__


def per_sample_times(r: TrialResult) -> np.ndarray:
    """Seconds per sample for each measured step (so different batch sizes compare fairly)."""
    return np.asarray(r.step_times_s, dtype=float) / max(1, r.samples_per_step or 1)


def compare(a: TrialResult, b: TrialResult, *, resamples: int = 2000, seed: int = 0) -> Comparison:
    """Is B faster than A beyond the step-to-step noise? Bootstrap of the ratio of mean times.

    Means, not medians: throughput is samples / total time, and a data pipeline that delivers
    batches in bursts has a fast median step but a slow mean.
    """
    for r in (a, b):
        if len(r.step_times_s) < 2:
            raise ValueError(f"trial #{r.trial_id} has no step-time samples (status {r.status}); compare ok trials")
    ta, tb = per_sample_times(a), per_sample_times(b)
    rng = np.random.default_rng(seed)
    ma = ta[rng.integers(0, len(ta), (resamples, len(ta)))].mean(axis=1)
    mb = tb[rng.integers(0, len(tb), (resamples, len(tb)))].mean(axis=1)
    tail = (1 - CONFIDENCE) / 2
    low, high = np.quantile(ma / mb, [tail, 1 - tail])
    speedup = float(ta.mean() / tb.mean())
    beyond = bool((low > 1 or high < 1) and abs(speedup - 1) >= MIN_EFFECT)
    return Comparison(a.trial_id, b.trial_id, speedup, float(low), float(high), beyond)


class ResultLog:
    """Trials in order, a baseline, observers, and an optional JSONL file they persist to."""

    def __init__(self, path: str | os.PathLike | None) -> None:
        self.path = Path(path) if path is not None else None
        self.trials: list[TrialResult] = []
        self._baseline_id: int | None = None
        self._observers: list[Callable[[TrialResult], None]] = []
        if self.path is not None and self.path.exists():
            self._load()

    # ---- persistence ------------------------------------------------------------------------
    def _load(self) -> None:
        assert self.path is not None
        text = self.path.read_text(encoding="utf-8")
        lines = text.splitlines()
        bad = 0
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                if rec.get("event") == "baseline":
                    self._baseline_id = rec["trial_id"]
                else:
                    self.trials.append(TrialResult.from_record(rec))
            except (ValueError, KeyError, TypeError) as e:
                bad += 1
                where = "last line (truncated by a crash?)" if i == len(lines) - 1 else f"line {i + 1}"
                warnings.warn(f"{self.path}: skipped unreadable {where}: {e}", stacklevel=3)
        if bad and lines and not text.endswith("\n"):
            # A crash mid-write left a partial last record: keep the fragment beside the log and
            # cut it from the log, so the next record starts on a line of its own.
            tail = lines[-1]
            with open(self.path.with_suffix(".broken"), "a", encoding="utf-8") as f:
                f.write(tail + "\n")
            with open(self.path, "r+", encoding="utf-8") as f:
                f.truncate(len(text.encode("utf-8")) - len(tail.encode("utf-8")))

    def _write(self, record: dict[str, Any]) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(record, default=_json_default, allow_nan=False)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())  # on disk before the trial counts as recorded

    # ---- trials -----------------------------------------------------------------------------
    def append(self, result: TrialResult) -> TrialResult:
        """Number the trial, persist it, tell the observers; returns the numbered result."""
        next_id = (self.trials[-1].trial_id or 0) + 1 if self.trials else 1
        result = replace(result, trial_id=next_id)
        self._write(_clean(result.to_record()))
        self.trials.append(result)
        for fn in list(self._observers):
            fn(result)
        return result

    def observe(self, fn: Callable[[TrialResult], None]) -> None:
        """Call `fn(result)` after every appended trial (charts, panels)."""
        self._observers.append(fn)

    def unobserve(self, fn: Callable[[TrialResult], None]) -> None:
        if fn in self._observers:
            self._observers.remove(fn)

    def get(self, trial_id: int) -> TrialResult:
        for r in self.trials:
            if r.trial_id == trial_id:
                return r
        raise ValueError(f"no trial #{trial_id}; known ids: {[r.trial_id for r in self.trials]}")

    # ---- baseline ---------------------------------------------------------------------------
    @property
    def baseline(self) -> TrialResult | None:
        """The explicit baseline, else the first ok trial."""
        if self._baseline_id is not None:
            return self.get(self._baseline_id)
        return next((r for r in self.trials if r.ok), None)

    def set_baseline(self, trial_id: int) -> None:
        r = self.get(trial_id)
        if not r.ok:
            raise ValueError(f"trial #{trial_id} has status {r.status!r}; only an ok trial can be the baseline")
        self._baseline_id = trial_id
        self._write({"event": "baseline", "trial_id": trial_id})
        for fn in list(self._observers):
            fn(r)

    # ---- the table --------------------------------------------------------------------------
    def frame(self) -> pd.DataFrame:
        """One row per trial: summary columns first, then every knob, notes and environment."""
        base = self.baseline
        rows = []
        for r in self.trials:
            rec = r.to_record()
            row = {
                "trial_id": r.trial_id,
                "label": r.knobs.label(base.knobs if base is not None else None),
                "status": r.status,
                "samples_per_s": r.samples_per_s,
                "speedup": None,
                "verdict": "",
                "step_time_ms": _ms(r.step_time_s),
                "step_time_iqr_ms": _ms(r.step_time_iqr_s),
                "data_wait_share": r.data_wait_share,
                "peak_memory_mb": r.peak_memory_bytes / 1e6 if r.peak_memory_bytes is not None else None,
                "startup_s": r.startup_s,
                "compile_s": r.compile_s,
                "final_loss": rec["final_loss"],
                "message": r.message,
            }
            if base is not None and r.samples_per_s and len(r.step_times_s) >= 2:
                row["speedup"] = r.samples_per_s / base.samples_per_s
                if r.trial_id == base.trial_id:
                    row["verdict"] = "baseline"
                else:
                    row["verdict"] = compare(base, r).verdict
            # throughput band from the step-time quartiles (the chart's noise band)
            if r.step_times_s and r.samples_per_step:
                q1, q3 = np.quantile(r.step_times_s, [0.25, 0.75])
                row["samples_per_s_low"] = r.samples_per_step / q3
                row["samples_per_s_high"] = r.samples_per_step / q1
            else:
                row["samples_per_s_low"] = row["samples_per_s_high"] = None
            row.update(r.knobs.to_dict())
            row["checkpoint"] = ",".join(r.knobs.checkpoint)
            row["notes"] = "; ".join(r.notes)
            row["device"] = r.env.get("device", "")
            row["started_at"] = r.started_at
            rows.append(row)
        df = pd.DataFrame(rows)
        if df.empty:
            df = pd.DataFrame(columns=SUMMARY_COLUMNS)
        return df.set_index("trial_id", drop=False).rename_axis(None)


def _ms(s: float | None) -> float | None:
    return None if s is None else s * 1e3


def _clean(obj: Any) -> Any:
    """Non-finite floats become None (JSON has no NaN)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    return str(obj)
