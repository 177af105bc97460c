"""ResultLog: every trial of a workbench, in order, on disk and as a pandas DataFrame.

The log is append-only JSONL (one record per line, flushed and fsynced), so a kernel restart or
a crash mid-trial loses nothing that finished. Nothing here ever unpickles: records are plain
JSON. `compare()` turns two trials' raw step times into a verdict that refuses to crown a winner
inside the noise.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import math
import os
import platform
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .measure import TrialResult

try:  # POSIX: appends from several processes are serialised by an OS file lock
    import fcntl

    _LOCKS = True
except ImportError:  # Windows: no lock; one file per process (see ResultLog)
    fcntl = None  # type: ignore[assignment]
    _LOCKS = False

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
    """Trials in order, a baseline, observers, and an optional JSONL file they persist to.

    Several processes may append to one file (two kernels, a learner's tabs): every append takes
    an exclusive OS lock on the file, reads the records the others appended since, and numbers
    the new trial after all of them, so trial ids stay unique. The lock is `fcntl.flock` on
    POSIX; where fcntl is missing (Windows) appends are not locked, so give each process its own
    file there (a workshop does: one file per participant, see `Workbench(participant=...)`).
    """

    def __init__(self, path: str | os.PathLike | None, *, participant: str | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self.participant = participant if participant is not None else default_participant()
        self.trials: list[TrialResult] = []
        self._baseline_id: int | None = None
        self._observers: list[Callable[[TrialResult], None]] = []
        self._offset = 0  # bytes of the file already read into `trials`
        if self.path is not None and self.path.exists():
            self._load()

    # ---- persistence ------------------------------------------------------------------------
    def _load(self) -> None:
        """Read the records appended since the last read (by this process or any other)."""
        with _locked(self.path) as f:
            self._read_new(f)

    def _read_new(self, f: Any) -> None:
        """Parse complete lines after `_offset` of the locked, open file `f` (binary, a+)."""
        f.seek(self._offset)
        data = f.read()
        if not data:
            return
        complete = data[: data.rfind(b"\n") + 1]
        tail = data[len(complete):]
        lines = complete.decode("utf-8", errors="replace").splitlines()
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                if rec.get("event") == "baseline":
                    self._baseline_id = rec["trial_id"]
                else:
                    self.trials.append(TrialResult.from_record(rec))
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                warnings.warn(f"{self.path}: skipped unreadable line {self._line_no(i)}: {e}", stacklevel=4)
        self._offset += len(complete)
        if tail:
            # Writers hold the lock until their line ends, so an unterminated last line under the
            # lock is what a crash mid-write left behind. Keep the fragment beside the log and cut
            # it from the log, so the next record starts on a line of its own.
            warnings.warn(f"{self.path}: skipped unreadable last line (truncated by a crash?): "
                          f"{tail[:60].decode('utf-8', errors='replace')!r}", stacklevel=4)
            if _LOCKS:
                with open(self.path.with_suffix(".broken"), "ab") as b:
                    b.write(tail + b"\n")
                f.truncate(self._offset)
            else:  # unlocked: it may be another process's line in progress; leave it, skip it
                self._offset += len(tail)

    def _line_no(self, i: int) -> str:
        return f"{i + 1} after byte {self._offset}" if self._offset else f"{i + 1}"

    def _write(self, record: dict[str, Any]) -> None:
        if self.path is None:
            return
        with _locked(self.path) as f:
            self._read_new(f)
            self._append_line(f, record)

    def _append_line(self, f: Any, record: dict[str, Any]) -> None:
        line = (json.dumps(record, default=_json_default, allow_nan=False) + "\n").encode("utf-8")
        end = f.seek(0, os.SEEK_END)
        if end:
            f.seek(end - 1)
            if f.read(1) != b"\n":  # an unterminated line (unlocked writers): start a new one
                line = b"\n" + line
        f.write(line)
        f.flush()
        os.fsync(f.fileno())  # on disk before the trial counts as recorded
        self._offset = f.tell()

    # ---- trials -----------------------------------------------------------------------------
    def append(self, result: TrialResult) -> TrialResult:
        """Number the trial after every trial in the file, persist it, tell the observers.

        Returns the numbered result. Trials that other processes appended to the same file since
        the last read join `trials` first (they are not sent to the observers).
        """
        participant = result.participant or self.participant
        if self.path is None:
            result = replace(result, trial_id=self._next_id(), participant=participant)
        else:
            with _locked(self.path) as f:
                self._read_new(f)
                result = replace(result, trial_id=self._next_id(), participant=participant)
                self._append_line(f, _clean(result.to_record()))
        self.trials.append(result)
        for fn in list(self._observers):
            fn(result)
        return result

    def refresh(self) -> int:
        """Read trials other processes appended to the file; returns how many arrived."""
        if self.path is None or not self.path.exists():
            return 0
        before = len(self.trials)
        self._load()
        return len(self.trials) - before

    def _next_id(self) -> int:
        return max((r.trial_id or 0 for r in self.trials), default=0) + 1

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


def default_participant() -> str:
    """Who is running this: $JUPYTERHUB_USER on a JupyterHub, else user@host."""
    hub = os.environ.get("JUPYTERHUB_USER")
    if hub:
        return hub
    try:
        user = getpass.getuser()
    except Exception:  # no login name in some containers
        user = "user"
    return f"{user}@{platform.node() or 'localhost'}"


# One lock per file within this process (threads), plus the OS lock between processes.
_THREAD_LOCKS: dict[str, threading.Lock] = {}
_THREAD_LOCKS_GUARD = threading.Lock()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[Any]:
    """The log file opened for reading and appending (binary), held under an exclusive lock."""
    path.parent.mkdir(parents=True, exist_ok=True)
    key = os.path.abspath(path)
    with _THREAD_LOCKS_GUARD:
        thread_lock = _THREAD_LOCKS.setdefault(key, threading.Lock())
    with thread_lock, open(path, "a+b") as f:
        if _LOCKS:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)  # blocks while another process appends
        try:
            yield f
        finally:
            if _LOCKS:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)


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
