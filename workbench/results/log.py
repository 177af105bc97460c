"""ResultLog: every trial of a workbench, in order, on disk and as a pandas DataFrame.

The log is append-only JSONL (one record per line, flushed and fsynced), so a kernel restart or
a crash mid-trial loses nothing that finished. Nothing here ever unpickles: records are plain
JSON, read as untrusted input (records.py) by `read_appended`, the one reader of logs (the workshop's
gather uses it too): no symbolic link followed, nothing but a regular file, a size cap, malformed lines
skipped and counted, a half-written last line left for later. Appends from several processes are
serialised by an OS file lock. The table (`frame()`) lives in table.py; comparing configurations in comparison.py
(deciding) and rounds.py (running alternating rounds).
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import stat
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..core.knobs import Knobs
from ..core.measure import TrialResult
from ..launch.folders import write_atomic
from . import series
from .comparison import real_run
from .models import MODEL_KEY, model_of, of_model, same_model, with_others
from .records import MAX_LINE_BYTES, LoggedComparison, bad_lines_text, default_participant, read_records
from .stats import Comparison, Noise
from .table import Table

try:  # POSIX: appends from several processes are serialised by an OS file lock
    import fcntl

    _LOCKS = True
except ImportError:  # Windows: no lock; one file per process (see ResultLog)
    fcntl = None  # type: ignore[assignment]
    _LOCKS = False

MAX_FILE_BYTES = 1 << 30  # a log beyond 1 GiB is read up to there (with a warning)
NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0)  # a log path that is a symbolic link is not opened through it
_READ_FLAGS = os.O_RDONLY | NO_FOLLOW | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


class Unreadable(OSError, ValueError):
    """A log file that is not read: a symbolic link, a FIFO or device, over a size cap. The message says
    why, never the file's content (an OSError to the log's own reads and writes, a ValueError to callers)."""


@dataclass
class Appended:
    """What one read of a JSONL log found after an offset (`read_appended`)."""

    trials: list[TrialResult] = field(default_factory=list)
    baseline_id: int | None = None  # the last "baseline" line's trial id, if any
    comparisons: list[LoggedComparison] = field(default_factory=list)
    bad: list[tuple[int, Exception]] = field(default_factory=list)  # (line index from `start`, why): skipped
    start: int = 0  # where this read began (0 after a restart)
    end: int = 0  # the offset after every line taken: the next read starts here
    lines: int = 0  # lines taken (records and bad ones)
    tail: bytes = b""  # a half-written last line (no newline, not yet a record): left for the next read
    ident: tuple[int, int] = (0, 0)  # the file's (device, inode)
    restarted: bool = False  # the file was replaced or shrank since `ident`: read again from its start
    capped: bool = False  # the file goes on past max_bytes: nothing after that point was read


def read_appended(source: str | os.PathLike | int, offset: int = 0, ident: tuple[int, int] | None = None, *,
                  max_bytes: int = MAX_FILE_BYTES, refuse_larger: bool = False) -> Appended:
    """The records of a JSONL log after byte `offset`, read as untrusted input: the one reader of logs.

    `source` is a path (opened without following a symbolic link, without blocking) or a descriptor
    the caller opened. Anything but a regular file raises `Unreadable`, and so does one over
    `max_bytes` when `refuse_larger` (else its lines up to `max_bytes` are read, `capped` says so).
    Malformed lines are skipped, each in `bad` with a reason that never quotes it (records.py). A last
    line without its newline counts when it parses (a finished record); otherwise it is half-written,
    left in `tail` for a later read. With `ident` (the (device, inode) of an earlier read), a file
    replaced or shrunk since is read again from byte 0 (`restarted`).
    """
    if isinstance(source, int):
        return _read_fd(source, offset, ident, max_bytes, refuse_larger)
    try:
        fd = os.open(source, _READ_FLAGS)
    except OSError as e:
        raise _why_not(e) from None
    try:
        return _read_fd(fd, offset, ident, max_bytes, refuse_larger)
    finally:
        os.close(fd)


def _why_not(e: OSError) -> OSError:
    """An open's failure in words: a symbolic link is Unreadable (never followed); else the OSError."""
    if e.errno in (errno.ELOOP, errno.EMLINK):
        return Unreadable("a symbolic link: not followed (a log is read and written only as a file of its own)")
    return e


def _read_fd(fd: int, offset: int, ident: tuple[int, int] | None, max_bytes: int, refuse_larger: bool) -> Appended:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise Unreadable("not a regular file (a FIFO, socket or device)")
    if refuse_larger and st.st_size > max_bytes:
        raise Unreadable(f"larger than {max_bytes:,} bytes: not one workbench's log")
    got = Appended(ident=(st.st_dev, st.st_ino))
    got.restarted = ident is not None and (got.ident != ident or st.st_size < offset)
    got.start = 0 if got.restarted else offset
    got.capped = st.st_size > max_bytes
    os.lseek(fd, got.start, os.SEEK_SET)
    chunks, left = [], max(0, min(st.st_size, max_bytes) - got.start)
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    data = b"".join(chunks)
    complete = data[: data.rfind(b"\n") + 1]
    lines = complete.split(b"\n")[:-1]
    tail = b"" if got.capped else data[len(complete):]  # at the cap a line is cut by the cap, not half-written
    got.trials, got.baseline_id, got.bad = read_records([*lines, tail] if tail else lines, comparisons=got.comparisons)
    if tail and got.bad and got.bad[-1][0] == len(lines):  # not a record yet: a write in progress, or cut short
        got.bad.pop()
        got.tail, tail = tail, b""
    got.end = got.start + len(complete) + len(tail)
    got.lines = len(lines) + (1 if tail else 0)
    return got


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
        self.comparisons: list[LoggedComparison] = []  # comparisons that measured, in the order they ended
        self._baseline_id: int | None = None
        self.defaults: Knobs | None = None  # a workbench's default knobs: labels name what differs from them
        self.model: str | None = None  # a workbench's model fingerprint: only its trials are compared (models.py)
        self._observers: list[Callable[[TrialResult], None]] = []
        self._offset = 0  # bytes of the file already read into `trials`
        self._unsaved: list[bytes] = []  # records a failed write kept in memory (written with the next append)
        self.write_error: OSError | None = None  # the last write failure, None once writes work again
        self._warned: set[str] = set()
        self._table = Table()
        if self.path is not None and self.path.exists():
            try:
                self._load()
            except OSError as e:  # unreadable (permissions, a vanished share): start empty, say so
                self._write_failed(e, "read")
        self._table.sync(self.trials)  # rows, speedups and verdicts once, so `results` after a trial is cheap

    # ---- persistence ------------------------------------------------------------------------
    def _load(self) -> None:
        """Read the records appended since the last read (by this process or any other)."""
        with _locked(self.path) as f:
            self._read_new(f)

    def _read_new(self, f: Any) -> None:
        """Take in the lines after `_offset` of the locked, open file `f` (binary, a+), read by `read_appended`."""
        got = read_appended(f.fileno(), self._offset)
        if got.capped:
            self._warn_once("size", f"{self.path}: the log is over {MAX_FILE_BYTES:,} bytes; trials after that "
                                    "point are not read (start a new log: Workbench(log=...))")
        self.trials += self._joined(got.trials)
        self.comparisons += got.comparisons
        if got.baseline_id is not None:
            self._baseline_id = got.baseline_id
        if got.bad:
            where = f" (after byte {self._offset})" if self._offset else ""
            warnings.warn(f"{self.path}: skipped {len(got.bad)} unreadable line(s){where}: {bad_lines_text(got.bad)}",
                          stacklevel=4)
        self._offset = got.end
        if got.tail:
            self._cut_tail(f, got.tail)

    def _joined(self, trials: list[TrialResult]) -> list[TrialResult]:
        """`trials` with the series a long trial keeps beside the log put back (series.py); one warning
        per read names the trials whose side file is missing or damaged (they keep their first steps)."""
        out, missing = [], []
        for r in trials:
            whole, why = series.join(r, self.path)
            out.append(whole)
            if why is not None:
                missing.append(f"#{r.trial_id} ({why})")
        if missing:
            warnings.warn(f"{self.path}: the full step series of {', '.join(missing)} could not be read back; "
                          f"those trials keep their first {series.KEPT_STEPS:,} steps", stacklevel=5)
        return out

    def _trial_line(self, record: dict[str, Any], log: Path | None) -> bytes:
        """A trial's JSONL line (`record` as to_record() gives it), never longer than the reader takes: a long
        trial's series go to a side file beside `log` (series.py); then, were it still too long, the message
        and traceback are cut, then `extra` is dropped (a note says so)."""
        if sum(len(record.get(k) or ()) for k in series.SERIES) > series.INLINE_VALUES:
            record = series.split(record, log)
        line = _line(_clean(record))
        if len(line) > MAX_LINE_BYTES:  # not the series: a huge message or traceback
            keep = 16 << 10
            record = {**record, "message": str(record.get("message", ""))[:keep],
                      "traceback": str(record.get("traceback", ""))[-keep:]}
            line = _line(_clean(record))
        if len(line) > MAX_LINE_BYTES:  # diagnostics too large for one line: the figures are kept
            extra = record.get("extra") or {}
            record = {**record, "extra": {k: v for k, v in extra.items() if k == "series"},
                      "notes": [*record.get("notes", ()), "extra diagnostics dropped: the record was over 1 MiB"]}
            line = _line(_clean(record))
        return line

    def _cut_tail(self, f: Any, tail: bytes) -> None:
        """An unterminated last line: cut it off (locked), keeping it in `<log>.broken` when that works."""
        # Writers hold the lock until their line ends, so an unterminated last line under the lock
        # is what a crash or a full disk mid-write left behind. Cut it so the next record starts on
        # a line of its own; unlocked (no fcntl), it may be another process's line: skip it.
        warnings.warn(f"{self.path}: skipped an unterminated last line of {len(tail):,} bytes "
                      "(a write cut short by a crash or a full disk)", stacklevel=5)
        if not _LOCKS:
            self._offset += len(tail)
            return
        broken = self.path.with_suffix(".broken")
        try:  # like the log itself: never through a symbolic link, never blocking on a FIFO
            fd = os.open(broken, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | NO_FOLLOW, 0o666)
            with open(fd, "ab", buffering=0) as b:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise Unreadable("not a regular file")
                b.write(tail + b"\n")
        except OSError:  # no room, or not a file of its own: the fragment is dropped, the log still heals
            with contextlib.suppress(OSError):
                st = os.lstat(broken)
                if stat.S_ISREG(st.st_mode) and st.st_size == 0:
                    broken.unlink()
        try:
            f.truncate(self._offset)
        except OSError:  # read-only: leave it; the next append starts on a new line anyway
            self._offset += len(tail)

    def _write(self, record: dict[str, Any]) -> None:
        if self.path is not None:
            self._persist(lambda: _line(record))

    def _persist(self, make_line: Callable[[], bytes]) -> None:
        """Append the line `make_line()` builds under the lock (after reading the others' appends),
        behind any lines earlier failures kept; on OSError keep it in memory and warn once."""
        line = None
        try:
            with _locked(self.path) as f:
                self._read_new(f)
                line = make_line()
                self._append_lines(f, [*self._unsaved, line])
        except OSError as e:
            self._unsaved.append(line if line is not None else make_line())
            self._write_failed(e, "write")
            return
        self._unsaved.clear()
        if self.write_error is not None:
            self.write_error = None
            warnings.warn(f"{self.path}: writing works again; the trials kept in memory are now in the log",
                          RuntimeWarning, stacklevel=4)

    def _append_lines(self, f: Any, lines: list[bytes]) -> None:
        """Write whole lines and fsync; on failure cut the file back to where it was, then re-raise."""
        end = f.seek(0, os.SEEK_END)
        data = b"".join(lines)
        if end:
            f.seek(end - 1)
            if f.read(1) != b"\n":  # an unterminated line (unlocked writers): start a new one
                data = b"\n" + data
        fd = f.fileno()
        try:
            view = memoryview(data)
            while view:  # unbuffered: a short write is retried, a failed one leaves nothing pending
                view = view[os.write(fd, view):]
            os.fsync(fd)  # on disk before the trial counts as recorded
        except OSError:
            with contextlib.suppress(OSError):  # no partial line left to corrupt the next append
                os.ftruncate(fd, end)
            raise
        self._offset = f.seek(0, os.SEEK_END)

    def _write_failed(self, e: OSError, what: str) -> None:
        """Remember the failure and warn once per cause, saying how to keep the trials."""
        self.write_error = e
        why = e.strerror or str(e) or type(e).__name__
        self._warn_once(f"{what}:{e.errno}", (
            f"could not {what} the result log {self.path} ({why}). Trials stay in memory (bench.results); "
            f"save them elsewhere with bench.log.save('other/folder/log.jsonl'), or free space and the next "
            f"trial writes them all."))

    def _warn_once(self, key: str, text: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(text, RuntimeWarning, stacklevel=5)

    @property
    def unsaved(self) -> int:
        """How many records (trials, baseline changes) are in memory only, after failed writes."""
        return len(self._unsaved)

    def save(self, path: str | os.PathLike) -> Path:
        """Write every trial (and the baseline) to `path` and keep logging there; returns the path.

        The way out when the log cannot be written (a full disk, a read-only share): nothing
        measured is lost. Written to a temporary file first, then renamed into place.
        """
        target = Path(path)
        if target.suffix != ".jsonl":
            target = target / (self.path.name if self.path is not None else "log.jsonl")
        target.parent.mkdir(parents=True, exist_ok=True)
        lines = [self._trial_line(r.to_record(), target) for r in self.trials]
        if self._baseline_id is not None:
            lines.append(_line({"event": "baseline", "trial_id": self._baseline_id}))
        write_atomic(target, b"".join(lines), mode=0o666)  # a new temporary file (O_EXCL, no link followed), then renamed
        self.path, self._offset, self._unsaved, self.write_error = target, target.stat().st_size, [], None
        return target

    # ---- trials -----------------------------------------------------------------------------
    def append(self, result: TrialResult) -> TrialResult:
        """Number the trial after every trial in the file, persist it, tell the observers.

        Returns the numbered result. Trials that other processes appended to the same file since
        the last read join `trials` first (they are not sent to the observers). A failed write
        (full disk, read-only, permissions, a vanished folder) keeps the trial in memory and warns
        once (see `save`); it never loses the measured result.
        """
        participant = result.participant or self.participant
        if self.model is not None and not model_of(result):  # appended here without one: this log's model
            result = replace(result, extra={**(result.extra or {}), MODEL_KEY: self.model})
        numbered: list[TrialResult] = []

        def number() -> bytes:
            numbered.append(replace(result, trial_id=self._next_id(), participant=participant))
            return self._trial_line(numbered[0].to_record(), self.path)

        if self.path is None:
            numbered.append(replace(result, trial_id=self._next_id(), participant=participant))
        else:
            self._persist(number)
        result = numbered[0]
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
        """Stop calling `fn` after appends (a closed panel); unknown observers are ignored."""
        if fn in self._observers:
            self._observers.remove(fn)

    def get(self, trial_id: int) -> TrialResult:
        """The trial with this id; ValueError listing the known ids when there is none."""
        for r in self.trials:
            if r.trial_id == trial_id:
                return r
        raise ValueError(f"no trial #{trial_id}; known ids: {[r.trial_id for r in self.trials]}")

    def record_comparison(self, c: Comparison, a_knobs: Knobs, b_knobs: Knobs) -> LoggedComparison:
        """Keep a comparison of configurations `a_knobs` (A) and `b_knobs` (B): in memory and as one
        line of the file, so it survives a restart (a failed write keeps it in memory, like a trial)."""
        logged = LoggedComparison.of(c, a_knobs, b_knobs)
        self._write(_clean(logged.to_record()))
        self.comparisons.append(logged)
        return logged

    def decided(self, a_knobs: Knobs, b_knobs: Knobs) -> LoggedComparison | None:
        """The latest decided (not undecided) logged comparison of B's knobs against A's, either way round
        (a B-against-A one is returned as it was logged: check `.a_knobs`)."""
        ours = {r.trial_id for r in self.compared}
        for c in reversed(self.comparisons):
            if c.answer != "undecided" and {c.a_knobs, c.b_knobs} == {a_knobs, b_knobs} and a_knobs != b_knobs and (
                    self.model is None or {c.a, c.b} <= ours):  # a comparison of another model's trials: not this one's
                return c
        return None

    # ---- baseline ---------------------------------------------------------------------------
    @property
    def baseline(self) -> TrialResult | None:
        """The explicit baseline, else the first ok trial (of this log's `model` when it has one; a real run's
        row is never the default baseline)."""
        if self._baseline_id is not None and same_model(base := self.get(self._baseline_id), self.model):
            return base
        return next((r for r in self.trials if r.ok and not real_run(r) and same_model(r, self.model)), None)

    @property
    def compared(self) -> list[TrialResult]:
        """The trials that speedups, verdicts and noise come from: those of this log's `model` (all without one)."""
        return of_model(self.trials, self.model)

    def set_baseline(self, trial_id: int) -> None:
        """Make an ok trial the reference for speedups and verdicts; persisted as a "baseline" line."""
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
        return self._table.sync(self.compared).noise()

    def frame(self) -> pd.DataFrame:
        """One row per trial: summary columns first, then every knob, notes and environment.

        `trial_id` is a column (the index is a plain 0..n-1 range): `df.set_index("trial_id")`
        looks trials up by id. `speedup` is samples/s over the baseline's, or tokens/s where `judged_on`
        says so (`comparison.judged_on`, compare's own rule); `verdict` is exactly `compare(a, b)` of every
        ok trial so far with the baseline's knobs against every ok trial so far with this trial's knobs
        (just the two trials until repeats exist), unless a logged comparison decided those knobs:
        "faster", "slower", "same" or "undecided" ("baseline" for the baseline, "" for a failed trial). `samples_per_s_low/high` bound where a repeat of the trial
        would land (95%, from the between-trial noise); `df.attrs["noise"]` holds that noise.
        Kept up to date as trials arrive: a new trial adds its row, a new noise re-judges cheaply.
        """
        table = self._table.sync(self.compared)
        df = table.frame(self.baseline, table.noise(), self.defaults)
        return with_others(self._with_decided(df) if self.comparisons else df, self.trials, self.model, self.defaults)

    def _with_decided(self, df: pd.DataFrame) -> pd.DataFrame:
        """Rows whose knobs a logged comparison decided against the baseline's take its verdict; the
        columns `decided_speedup` (that comparison's B/A ratio) and `decided_by` say which."""
        base = self.baseline
        df["decided_speedup"], df["decided_by"] = np.nan, ""
        compared = self.compared
        if base is None or len(df) != len(compared):
            return df
        flip = {"faster": "slower", "slower": "faster"}  # the comparison may have run the other way round
        for i, r in enumerate(compared):
            c = self.decided(base.knobs, r.knobs) if r.ok and r.trial_id != base.trial_id else None
            if c is not None:
                df.loc[i, "verdict"] = c.answer if c.b_knobs == r.knobs else flip.get(c.answer, c.answer)
                df.loc[i, "decided_speedup"] = c.speedup if c.b_knobs == r.knobs else 1 / c.speedup
                df.loc[i, "decided_by"] = c.how
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


def _padded(values: Sequence[float], n: int) -> list[float]:
    """`values` cut or NaN-padded to n entries (a failed trial may have fewer losses than step times)."""
    out = [float(v) for v in values[:n]]
    return out + [float("nan")] * (n - len(out))


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
    try:  # unbuffered: a failed write leaves nothing behind; a symbolic link is not followed (Unreadable)
        f = open(path, "a+b", buffering=0, opener=lambda p, flags: os.open(p, flags | NO_FOLLOW, 0o666))
    except OSError as e:
        raise _why_not(e) from None
    with thread_lock, f:
        if _LOCKS:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)  # blocks while another process appends
        try:
            yield f
        finally:
            if _LOCKS:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _line(record: dict[str, Any]) -> bytes:
    """One JSONL line (newline included) of a record."""
    return (json.dumps(record, default=_json_default, allow_nan=False) + "\n").encode("utf-8")


def _clean(obj: Any) -> Any:
    """JSON's values only: numpy scalars and arrays become Python's (np.float32 -> float, np.bool_ -> bool),
    non-finite floats become None (JSON has no NaN), keys become text."""
    if isinstance(obj, np.ndarray):
        obj = obj.tolist()
    elif isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k if isinstance(k, str) else str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    return str(obj)
