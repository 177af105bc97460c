"""ResultLog: every trial of a workbench, in order, on disk and as a pandas DataFrame.

The log is append-only JSONL (one record per line, flushed and fsynced), so a kernel restart or
a crash mid-trial loses nothing that finished. Nothing here ever unpickles: records are plain
JSON. `compare()` judges two configurations from their per-trial throughputs against the
between-trial noise learnt from the log's repeats (the model lives in stats.py), optionally after
running alternating confirmation rounds.
"""

from __future__ import annotations

import contextlib
import getpass
import itertools
import json
import math
import os
import platform
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .knobs import KNOBS, Knobs
from .measure import STATUSES, TrialResult
from .stats import MARGIN, Comparison, Noise, adjacent_noise, critical, decide, decide_sequential, estimate_noise

try:  # POSIX: appends from several processes are serialised by an OS file lock
    import fcntl

    _LOCKS = True
except ImportError:  # Windows: no lock; one file per process (see ResultLog)
    fcntl = None  # type: ignore[assignment]
    _LOCKS = False

# The columns a reader wants first; knobs and details follow.
SUMMARY_COLUMNS = [
    "trial_id", "label", "status", "samples_per_s", "speedup", "verdict", "step_time_ms",
    "step_time_iqr_ms", "data_wait_share", "peak_memory_mb", "startup_s", "compile_s",
    "final_loss", "message",
]
# None = torch's default: nullable Int64 columns (every optional int knob in the registry)
OPTIONAL_INT_KNOBS = tuple(n for n, s in KNOBS.items() if s.kind == "int" and s.optional)

Trials = TrialResult | Sequence[TrialResult]


def _usable(r: TrialResult) -> bool:
    return r.ok and bool(r.samples_per_s) and len(r.step_times_s) >= 2


def _side(x: Trials) -> list[TrialResult]:
    runs = [x] if isinstance(x, TrialResult) else list(x)
    if not runs or not all(isinstance(r, TrialResult) for r in runs):
        raise TypeError("compare takes TrialResults (or lists of trials of the same knobs); "
                        "bench.compare also takes trial ids")
    for r in runs:
        if not _usable(r):
            raise ValueError(f"trial #{r.trial_id} has no step-time samples (status {r.status}); compare ok trials")
    if len({r.knobs for r in runs}) > 1:
        raise ValueError("a list passed to compare must hold trials of identical knobs (repeats of one configuration)")
    return runs


def noise_of(trials: Iterable[TrialResult]) -> Noise:
    """The between-trial noise these trials show: repeats of identical knobs, pooled (see stats.py),
    and how far back-to-back identical trials land apart (consecutive trial ids, same knobs)."""
    groups: dict[Knobs, list[float]] = {}
    usable = [r for r in trials if _usable(r)]
    for r in usable:
        groups.setdefault(r.knobs, []).append(float(r.samples_per_s or 0.0))
    ordered = sorted((r for r in usable if r.trial_id is not None), key=lambda r: r.trial_id or 0)
    pairs = [(float(x.samples_per_s or 0.0), float(y.samples_per_s or 0.0)) for x, y in itertools.pairwise(ordered)
             if y.trial_id == (x.trial_id or 0) + 1 and x.knobs == y.knobs]
    noise = estimate_noise(list(groups.values()))
    return replace(noise, adjacent=adjacent_noise(pairs), adjacent_pairs=len(pairs))


def compare(a: Trials, b: Trials, *, rounds: int | str = 0,
            run: Callable[[Knobs], TrialResult | None] | None = None, log: ResultLog | None = None,
            noise: Noise | None = None, max_rounds: int = 8, margin: float = MARGIN,
            budget_s: float | None = None) -> Comparison:
    """Is configuration B faster than A, slower, the same speed, or is it undecided? From per-trial samples/s.

    `a`, `b`: a trial each (or lists of repeats). `rounds="auto"` runs alternating rounds (B A, A B,
    ...) through `run(knobs)` until the answer is faster/slower (beyond noise) or the same speed
    (interval within ±`margin`), or `max_rounds` (or `budget_s` seconds) run out; each round's B is
    judged against its back-to-back A, with an interval that stays valid however many rounds it
    looks at (see stats.decide_sequential). `rounds=N` runs exactly N rounds and decides once from
    all trials against the noise of `noise`, else `log`'s repeats (re-read after the rounds), else
    these trials alone; until repeats exist it is a conservative prior. The one comparison behind
    the results table's verdicts, `bench.compare`, the panel's "repeat to confirm", `tune()` and `diagnose()`.
    """
    runs_a, runs_b = _side(a), _side(b)
    if not isinstance(margin, (int, float)) or isinstance(margin, bool) or not 0 < margin < 1:
        raise ValueError(f"margin must be a fraction between 0 and 1 (0.05 = ±5%), got {margin!r}")
    if rounds == "auto":
        return _compare_auto(runs_a, runs_b, run=run, log=log, max_rounds=max_rounds, margin=margin,
                             budget_s=budget_s)
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
        raise ValueError(f"rounds must be 'auto' or an int >= 0 (extra trials of each configuration), got {rounds!r}")
    if rounds and run is None:
        raise ValueError("rounds need a way to run trials: call bench.compare(a, b, rounds=N), or pass run=bench.run")
    note, done, t0 = "", 0, time.perf_counter()
    for i in range(rounds):
        pair, note = _one_round(run, runs_a, runs_b, i, done)  # type: ignore[arg-type]
        if note:
            break
        for side, r in pair:
            side.append(r)
        done += 1
    if log is not None and (noise is None or done):
        noise = log.noise
    elif noise is None:
        noise = noise_of([*runs_a, *runs_b])
    return decide([r.samples_per_s or 0.0 for r in runs_a], [r.samples_per_s or 0.0 for r in runs_b], noise,
                  a_trials=[r.trial_id for r in runs_a], b_trials=[r.trial_id for r in runs_b], rounds=done,
                  note=note, margin=margin, seconds=time.perf_counter() - t0 if rounds else None)


def _one_round(run: Callable[[Knobs], TrialResult | None], runs_a: list[TrialResult], runs_b: list[TrialResult],
               i: int, done: int, knobs: tuple[Knobs, Knobs] | None = None,
               ) -> tuple[list[tuple[list[TrialResult], TrialResult]], str]:
    """Round i (0-based) after a and b ran A B: B A, then A B, ... ([(side, trial)], a note if it failed).

    `knobs`: (A's, B's) when a side holds no trial yet."""
    ka, kb = knobs or (runs_a[0].knobs, runs_b[0].knobs)
    order = [(runs_a, ka), (runs_b, kb)]
    pair: list[tuple[list[TrialResult], TrialResult]] = []
    for side, knobs in order[::-1] if i % 2 == 0 else order:
        r = run(knobs)
        if r is None or not _usable(r):
            what = "was stopped" if r is None else f"#{r.trial_id} ended {r.status}"
            return pair, f"Round {i + 1} {what}; decided on {done} complete round{'s' if done != 1 else ''}."
        pair.append((side, r))
    return pair, ""


def _compare_auto(runs_a: list[TrialResult], runs_b: list[TrialResult], *,
                  run: Callable[[Knobs], TrialResult | None] | None, log: ResultLog | None, max_rounds: int,
                  margin: float, budget_s: float | None) -> Comparison:
    """rounds="auto": alternating rounds until decided, judged on back-to-back pairs (decide_sequential)."""
    if isinstance(max_rounds, bool) or not isinstance(max_rounds, int) or max_rounds < 1:
        raise ValueError(f"max_rounds must be an int >= 1, got {max_rounds!r}")
    if budget_s is not None and not budget_s > 0:
        raise ValueError(f"budget_s must be a number of seconds > 0 (or None for no limit), got {budget_s!r}")
    if run is None:
        raise ValueError("rounds='auto' needs a way to run trials: call bench.compare(a, b, rounds='auto'), "
                         "or pass run=bench.run")
    first_a, first_b = runs_a[-1], runs_b[-1]
    # The given pair counts as the first round only when the two trials ran back to back.
    paired = first_a.trial_id is not None and first_b.trial_id is not None and \
        abs(first_a.trial_id - first_b.trial_id) == 1
    pa, pb = ([first_a], [first_b]) if paired else ([], [])
    looks = max_rounds + len(pa)
    note, done, t0, c = "", 0, time.perf_counter(), None

    def judge() -> Comparison:
        return decide_sequential([r.samples_per_s or 0.0 for r in pa], [r.samples_per_s or 0.0 for r in pb],
                                 log.noise if log is not None else noise_of([*pa, *pb]), looks=looks,
                                 margin=margin, a_trials=[r.trial_id for r in pa],
                                 b_trials=[r.trial_id for r in pb], rounds=done, note=note,
                                 seconds=time.perf_counter() - t0, max_rounds=max_rounds)

    if pa:
        c = judge()
    while (c is None or c.answer == "undecided") and done < max_rounds:
        spent = time.perf_counter() - t0
        if budget_s is not None and done and spent + spent / done > budget_s:
            note = f"Stopped after {done} rounds: another round would pass budget_s={budget_s:g} s."
            break
        pair, note = _one_round(run, pa, pb, done + (0 if paired else 1), done, (first_a.knobs, first_b.knobs))
        if note:
            break
        for side, r in pair:
            side.append(r)
        done += 1
        c = judge()
    if not pa:  # not one complete back-to-back pair: judge what exists once, unpaired
        return replace(compare(runs_a, runs_b, log=log, margin=margin), note=note)
    if not paired:
        note = (f"{note} #{first_a.trial_id} and #{first_b.trial_id} did not run back to back, so the answer rests "
                "on the new rounds.").strip()
    return judge()


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
        trials, baseline_id, bad = read_records(lines)
        self.trials += trials
        if baseline_id is not None:
            self._baseline_id = baseline_id
        for i, e in bad:
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

    # ---- the noise and the tables --------------------------------------------------------------
    @property
    def noise(self) -> Noise:
        """Between-trial noise learnt from this log's repeats of identical knobs (prior until then)."""
        return noise_of(self.trials)

    def frame(self) -> pd.DataFrame:
        """One row per trial: summary columns first, then every knob, notes and environment.

        `trial_id` is a column (the index is a plain 0..n-1 range): `df.set_index("trial_id")`
        looks trials up by id. `speedup` is samples/s over the baseline's; `verdict` is exactly
        `compare(a, b)` of every ok trial so far with the baseline's knobs against every ok trial so far
        with this trial's knobs (just the two trials until repeats exist): "beyond noise", "same speed"
        or "within noise". `samples_per_s_low/high` bound where a repeat of the trial
        would land (95%, from the between-trial noise); `df.attrs["noise"]` holds that noise.
        """
        base = self.baseline
        noise = self.noise
        band = math.exp(critical(noise.df) * noise.sigma)
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
                "samples_per_s_low": r.samples_per_s / band if r.samples_per_s else None,
                "samples_per_s_high": r.samples_per_s * band if r.samples_per_s else None,
            }
            if base is not None and _usable(r) and _usable(base):
                if r.trial_id == base.trial_id:
                    row["speedup"], row["verdict"] = 1.0, "baseline"
                else:
                    c = compare(*_sides(self.trials, base, r), noise=noise)
                    row["speedup"], row["verdict"] = c.speedup, c.verdict
            row.update(r.knobs.to_dict())
            row["checkpoint"] = ",".join(r.knobs.checkpoint)
            row["notes"] = "; ".join(r.notes)
            row["device"] = r.env.get("device", "")
            row["participant"] = r.participant
            row["trace_path"] = r.trace_path
            row["started_at"] = r.started_at
            rows.append(row)
        df = pd.DataFrame(rows) if rows else pd.DataFrame(columns=SUMMARY_COLUMNS)
        for col in ("speedup", "samples_per_s_low", "samples_per_s_high"):
            if col in df:
                df[col] = pd.to_numeric(df[col])
        for col in OPTIONAL_INT_KNOBS:
            if col in df:
                df[col] = df[col].astype("Int64")
        df["status"] = pd.Categorical(df["status"], categories=list(STATUSES))
        if "started_at" in df:
            df["started_at"] = pd.to_datetime(df["started_at"].replace("", None), errors="coerce")
        df.attrs["noise"] = noise
        return df

    def steps_frame(self) -> pd.DataFrame:
        """One row per measured step of every trial: trial_id, step, step_time_s, data_wait_s, loss."""
        parts = []
        for r in self.trials:
            n = len(r.step_times_s)
            if not n:
                continue
            parts.append(pd.DataFrame({
                "trial_id": r.trial_id,
                "step": np.arange(1, n + 1),
                "step_time_s": r.step_times_s,
                "data_wait_s": _padded(r.data_wait_s, n),
                "loss": _padded(r.losses, n),
            }))
        if not parts:
            return pd.DataFrame({"trial_id": pd.Series(dtype="int64"), "step": pd.Series(dtype="int64"),
                                 "step_time_s": pd.Series(dtype=float), "data_wait_s": pd.Series(dtype=float),
                                 "loss": pd.Series(dtype=float)})
        return pd.concat(parts, ignore_index=True)


def _sides(trials: Sequence[TrialResult], base: TrialResult, r: TrialResult) -> tuple[Trials, Trials]:
    """The table's evidence for trial r: the baseline's repeats and r's repeats up to r (r alone when it
    repeats the baseline's knobs: a repeat is judged as one more identical trial)."""
    if r.knobs == base.knobs:
        return base, r
    upto = [t for t in trials if _usable(t) and (t.trial_id or 0) <= max(r.trial_id or 0, base.trial_id or 0)]
    return ([t for t in upto if t.knobs == base.knobs] or [base],
            [t for t in upto if t.knobs == r.knobs and (t.trial_id or 0) <= (r.trial_id or 0)] or [r])


def _padded(values: Sequence[float], n: int) -> list[float]:
    """`values` cut or NaN-padded to n entries (a failed trial may have fewer losses than step times)."""
    out = [float(v) for v in values[:n]]
    return out + [float("nan")] * (n - len(out))


def parse_record(line: str) -> tuple[str, Any]:
    """One JSONL line of a log: ("baseline", trial id) or ("trial", TrialResult).

    Raises ValueError/KeyError/TypeError for anything else (a truncated line, another program's
    record), so readers can skip it with a warning.
    """
    rec = json.loads(line)
    if not isinstance(rec, dict):
        raise TypeError(f"a JSON {type(rec).__name__}, not a trial record")
    if rec.get("event") == "baseline":
        return "baseline", int(rec["trial_id"])
    if "status" not in rec or "trial_id" not in rec:
        raise KeyError("no status/trial_id: not a workbench trial")
    return "trial", TrialResult.from_record(rec)


def read_records(lines: list[str]) -> tuple[list[TrialResult], int | None, list[tuple[int, Exception]]]:
    """(trials, the last explicit baseline id, [(line index, error) of unreadable lines]) of log lines."""
    trials: list[TrialResult] = []
    baseline_id: int | None = None
    bad: list[tuple[int, Exception]] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            kind, value = parse_record(line)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            bad.append((i, e))
            continue
        if kind == "baseline":
            baseline_id = value
        else:
            trials.append(value)
    return trials, baseline_id, bad


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
