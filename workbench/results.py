"""ResultLog: every trial of a workbench, in order, on disk and as a pandas DataFrame.

The log is append-only JSONL (one record per line, flushed and fsynced), so a kernel restart or
a crash mid-trial loses nothing that finished. Nothing here ever unpickles: records are plain
JSON. `compare()` judges two configurations from their per-trial throughputs against the
between-trial noise learnt from the log's repeats (the model lives in stats.py), optionally after
running alternating confirmation rounds.
"""

from __future__ import annotations

import bisect
import contextlib
import getpass
import hashlib
import itertools
import json
import math
import os
import platform
import re
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .knobs import BLOCK_KNOBS, BUILTIN_KNOBS, KNOBS, Knobs, knob_names
from .measure import STATUSES, TrialResult
from .stats import (
    MARGIN,
    MIN_EFFECT,
    Comparison,
    Noise,
    adjacent_noise,
    critical,
    decide,
    decide_sequential,
    estimate_noise,
)

try:  # POSIX: appends from several processes are serialised by an OS file lock
    import fcntl

    _LOCKS = True
except ImportError:  # Windows: no lock; one file per process (see ResultLog)
    fcntl = None  # type: ignore[assignment]
    _LOCKS = False

# The columns a reader wants first; knobs and details follow.
SUMMARY_COLUMNS = [
    "trial_id", "label", "status", "samples_per_s", "speedup", "verdict", "step_time_ms",
    "step_time_iqr_ms", "data_wait_share", "peak_memory_mb", "model_state_mb", "startup_s", "compile_s",
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
    note = " ".join(filter(None, [note, allocator_note(runs_a, runs_b)]))
    return decide([r.samples_per_s or 0.0 for r in runs_a], [r.samples_per_s or 0.0 for r in runs_b], noise,
                  a_trials=[r.trial_id for r in runs_a], b_trials=[r.trial_id for r in runs_b], rounds=done,
                  note=note, margin=margin, seconds=time.perf_counter() - t0 if rounds else None)


def allocator_note(runs_a: Sequence[TrialResult], runs_b: Sequence[TrialResult]) -> str:
    """A sentence when the two sides ran with different malloc settings (env "malloc", e.g. one trial
    before wb.keep_freed_memory() and one after): page faults then differ as well as the knobs."""
    seen = {r.env.get("malloc") for r in [*runs_a, *runs_b] if r.env.get("malloc") is not None}
    if len(seen) < 2:  # one setting, or logs from before the environment recorded it
        return ""
    return (f"The trials ran with different malloc settings ({', '.join(sorted(s or 'not glibc' for s in seen))}): "
            "part of the difference may be page faults rather than the knobs (README 'Page faults').")


ANSWERS = ("faster", "slower", "same", "undecided")
METHODS = ("trials", "interleaved")


@dataclass(frozen=True)
class LoggedComparison:
    """A comparison as the log keeps it (one "comparison" line): both sides' knobs, how it was
    decided, and the answer with its interval. A restarted kernel reads it back; the table's
    verdict uses the latest decided one for a trial's knobs against the baseline's."""

    a: int | None
    b: int | None
    a_knobs: Knobs
    b_knobs: Knobs
    method: str  # "trials" or "interleaved"
    answer: str  # "faster", "slower", "same" or "undecided"
    speedup: float
    low: float
    high: float
    margin: float
    seconds: float | None = None
    blocks: int = 0  # interleaved: pairs of blocks
    block_steps: int = 0
    rounds: int = 0  # trials: alternating rounds
    note: str = ""
    at: str = ""  # when it was decided (UTC, ISO 8601)

    @classmethod
    def of(cls, c: Comparison, a_knobs: Knobs, b_knobs: Knobs) -> LoggedComparison:
        """The log's form of a Comparison between configurations `a_knobs` and `b_knobs`."""
        return cls(c.a, c.b, a_knobs, b_knobs, c.method, c.answer, c.speedup, c.low, c.high, c.margin, c.seconds,
                   c.blocks, c.block_steps, c.rounds, c.note, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))

    @property
    def how(self) -> str:
        """How it was decided, in a few words (the table's `decided_by` column)."""
        secs = f", {self.seconds:.0f} s" if self.seconds is not None else ""
        if self.method == "interleaved":
            return f"interleaved, {self.blocks} pairs of blocks{secs}"
        return f"trials, {self.rounds} round{'s' if self.rounds != 1 else ''}{secs}"

    def to_record(self) -> dict[str, Any]:
        """A flat JSON-safe dict: event "comparison", each side's knobs as a trial record holds them."""
        def side(k: Knobs) -> dict[str, Any]:
            d = k.to_dict()
            return {**d, "user_knobs": [n for n in d if n not in BUILTIN_KNOBS]}

        return {"event": "comparison", "a": self.a, "b": self.b, "a_knobs": side(self.a_knobs),
                "b_knobs": side(self.b_knobs), "method": self.method, "answer": self.answer,
                "speedup": self.speedup, "low": self.low, "high": self.high, "margin": self.margin,
                "seconds": self.seconds, "blocks": self.blocks, "block_steps": self.block_steps,
                "rounds": self.rounds, "note": self.note, "at": self.at}

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> LoggedComparison:
        """Rebuild from `to_record()` output read back from an untrusted line (BadRecord if it is not one)."""
        if rec.get("method") not in METHODS or rec.get("answer") not in ANSWERS:
            raise BadRecord("a comparison without a known method and answer")
        for key in ("speedup", "low", "high", "margin"):
            if not _num_ok(rec.get(key)) or not rec[key] > 0:
                raise BadRecord(f"a comparison's {key} is not a number > 0")
        for key in ("seconds",):
            _check_number(rec, key, (int, float))
        for key in ("a", "b", "blocks", "block_steps", "rounds"):
            _check_number(rec, key, int)
        if not isinstance(rec.get("note", ""), str) or not isinstance(rec.get("at", ""), str):
            raise BadRecord("a comparison's note is not text")
        sides = [rec.get("a_knobs"), rec.get("b_knobs")]
        if not all(isinstance(k, dict) for k in sides):
            raise BadRecord("a comparison without both sides' knobs")
        try:
            a_knobs, b_knobs = (_knobs_of(k) for k in sides)
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as e:
            raise BadRecord(f"a comparison's knobs fail validation ({type(e).__name__})") from None
        return cls(rec.get("a"), rec.get("b"), a_knobs, b_knobs, rec["method"], rec["answer"], float(rec["speedup"]),
                   float(rec["low"]), float(rec["high"]), float(rec["margin"]), rec.get("seconds"),
                   rec.get("blocks") or 0, rec.get("block_steps") or 0, rec.get("rounds") or 0,
                   rec.get("note", ""), rec.get("at", ""))


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
    # The paired sd's prior is learnt from back-to-back repeats already in the log: evidence
    # independent of these rounds (re-learning it from them would over-trust their own spread).
    before = log.noise if log is not None else noise_of([*pa, *pb])

    def judge() -> Comparison:
        return decide_sequential([r.samples_per_s or 0.0 for r in pa], [r.samples_per_s or 0.0 for r in pb],
                                 before, looks=looks,
                                 margin=margin, a_trials=[r.trial_id for r in pa],
                                 b_trials=[r.trial_id for r in pb], rounds=done,
                                 note=" ".join(filter(None, [note, allocator_note(pa, pb)])),
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
        self.comparisons: list[LoggedComparison] = []  # rounds="auto" comparisons, in the order they ended
        self._baseline_id: int | None = None
        self._observers: list[Callable[[TrialResult], None]] = []
        self._offset = 0  # bytes of the file already read into `trials`
        self._unsaved: list[bytes] = []  # records a failed write kept in memory (written with the next append)
        self.write_error: OSError | None = None  # the last write failure, None once writes work again
        self._warned: set[str] = set()
        self._table = _Table()
        if self.path is not None and self.path.exists():
            try:
                self._load()
            except OSError as e:  # unreadable (permissions, a vanished share): start empty, say so
                self._write_failed(e, "read")
        self._table.sync(self)  # rows, speedups and verdicts once, so `results` after a trial is cheap

    # ---- persistence ------------------------------------------------------------------------
    def _load(self) -> None:
        """Read the records appended since the last read (by this process or any other)."""
        with _locked(self.path) as f:
            self._read_new(f)

    def _read_new(self, f: Any) -> None:
        """Parse complete lines after `_offset` of the locked, open file `f` (binary, a+)."""
        f.seek(self._offset)
        data = f.read(max(0, MAX_FILE_BYTES - self._offset) + 1)
        if len(data) + self._offset > MAX_FILE_BYTES:
            self._warn_once("size", f"{self.path}: the log is over {MAX_FILE_BYTES:,} bytes; trials after that "
                                    "point are not read (start a new log: Workbench(log=...))")
            data = data[: data.rfind(b"\n", 0, MAX_FILE_BYTES - self._offset) + 1]
            if not data:
                return
        if not data:
            return
        complete = data[: data.rfind(b"\n") + 1]
        tail = data[len(complete):]
        trials, baseline_id, bad = read_records(complete.split(b"\n"), comparisons=self.comparisons)
        self.trials += trials
        if baseline_id is not None:
            self._baseline_id = baseline_id
        if bad:
            where = f" (after byte {self._offset})" if self._offset else ""
            warnings.warn(f"{self.path}: skipped {len(bad)} unreadable line(s){where}: {bad_lines_text(bad)}",
                          stacklevel=4)
        self._offset += len(complete)
        if tail:
            self._cut_tail(f, tail)

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
        try:
            with open(broken, "ab") as b:
                b.write(tail + b"\n")
        except OSError:  # no room for the copy either: the fragment is dropped, the log still heals
            with contextlib.suppress(OSError):
                if broken.stat().st_size == 0:
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
        why = e.strerror or type(e).__name__
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
        lines = [json.dumps(_clean(r.to_record()), default=_json_default, allow_nan=False) for r in self.trials]
        if self._baseline_id is not None:
            lines.append(json.dumps({"event": "baseline", "trial_id": self._baseline_id}))
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write("".join(x + "\n" for x in lines).encode("utf-8"))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()
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
        numbered: list[TrialResult] = []

        def number() -> bytes:
            numbered.append(replace(result, trial_id=self._next_id(), participant=participant))
            return _line(_clean(numbered[0].to_record()))

        if self.path is None:
            number()
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
        if fn in self._observers:
            self._observers.remove(fn)

    def get(self, trial_id: int) -> TrialResult:
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
        for c in reversed(self.comparisons):
            if c.answer != "undecided" and {c.a_knobs, c.b_knobs} == {a_knobs, b_knobs} and a_knobs != b_knobs:
                return c
        return None

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
        return self._table.sync(self).noise()

    def frame(self) -> pd.DataFrame:
        """One row per trial: summary columns first, then every knob, notes and environment.

        `trial_id` is a column (the index is a plain 0..n-1 range): `df.set_index("trial_id")`
        looks trials up by id. `speedup` is samples/s over the baseline's; `verdict` is exactly
        `compare(a, b)` of every ok trial so far with the baseline's knobs against every ok trial so far
        with this trial's knobs (just the two trials until repeats exist): "beyond noise", "same speed"
        or "within noise". `samples_per_s_low/high` bound where a repeat of the trial
        would land (95%, from the between-trial noise); `df.attrs["noise"]` holds that noise.
        Kept up to date as trials arrive: a new trial adds its row, a new noise re-judges cheaply.
        """
        table = self._table.sync(self)
        df = table.frame(self.baseline, table.noise())
        return self._with_decided(df) if self.comparisons else df

    def _with_decided(self, df: pd.DataFrame) -> pd.DataFrame:
        """Rows whose knobs a logged comparison decided against the baseline's take its verdict; the
        columns `decided_speedup` (that comparison's B/A ratio) and `decided_by` say which."""
        base = self.baseline
        df["decided_speedup"], df["decided_by"] = np.nan, ""
        if base is None or len(df) != len(self.trials):
            return df
        words = {"faster": "beyond noise", "slower": "beyond noise", "same": "same speed"}
        for i, r in enumerate(self.trials):
            c = self.decided(base.knobs, r.knobs) if r.ok and r.trial_id != base.trial_id else None
            if c is not None:
                df.loc[i, "verdict"] = words[c.answer]
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


def _sides(trials: Sequence[TrialResult], base: TrialResult, r: TrialResult) -> tuple[Trials, Trials]:
    """The table's evidence for trial r: the baseline's repeats and r's repeats up to r (r alone when it
    repeats the baseline's knobs: a repeat is judged as one more identical trial)."""
    if r.knobs == base.knobs:
        return base, r
    upto = [t for t in trials if _usable(t) and (t.trial_id or 0) <= max(r.trial_id or 0, base.trial_id or 0)]
    return ([t for t in upto if t.knobs == base.knobs] or [base],
            [t for t in upto if t.knobs == r.knobs and (t.trial_id or 0) <= (r.trial_id or 0)] or [r])


def _static_frame(trials: Sequence[TrialResult]) -> pd.DataFrame:
    """The columns of these trials' rows that depend on nothing else (no baseline, no noise)."""
    rows = []
    for r in trials:
        row = {
            "trial_id": r.trial_id, "label": "", "status": r.status, "samples_per_s": r.samples_per_s,
            "speedup": None, "verdict": "", "step_time_ms": _ms(r.step_time_s),
            "step_time_iqr_ms": _ms(r.step_time_iqr_s), "data_wait_share": r.data_wait_share,
            "peak_memory_mb": r.peak_memory_bytes / 1e6 if r.peak_memory_bytes is not None else None,
            "model_state_mb": r.model_state_bytes / 1e6 if r.model_state_bytes is not None else None,
            "startup_s": r.startup_s, "compile_s": r.compile_s,
            "final_loss": next((x for x in reversed(r.losses) if math.isfinite(x)), None),
            "message": r.message, "samples_per_s_low": None, "samples_per_s_high": None,
        }
        row.update(r.knobs.to_dict())
        row.update((name, ",".join(getattr(r.knobs, name))) for name in BLOCK_KNOBS)
        row["notes"] = "; ".join(r.notes)
        row["device"] = r.env.get("device", "")
        row["participant"] = r.participant
        row["trace_path"] = r.trace_path
        row["started_at"] = r.started_at
        rows.append(row)
    df = pd.DataFrame(rows)
    for col in ("speedup", "samples_per_s_low", "samples_per_s_high"):
        df[col] = df[col].astype(float)
    for col in OPTIONAL_INT_KNOBS:
        if col in df:
            df[col] = df[col].astype("Int64")
    df["status"] = pd.Categorical(df["status"], categories=list(STATUSES))
    df["started_at"] = pd.to_datetime(df["started_at"].replace("", None), errors="coerce")
    return df


class _Table:
    """`ResultLog.frame()` kept up to date: each trial's fixed columns built once; labels and
    speedups per baseline; verdicts re-judged when the noise changes in one vectorised pass of
    decide()'s rule over running sums per configuration. A test holds every verdict equal to `compare`."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.trials: list[TrialResult] = []
        self.static: pd.DataFrame | None = None
        self.groups: dict[Knobs, list[float]] = {}  # repeats of identical knobs: the noise evidence
        self.by_id: dict[int, tuple[Knobs, float]] = {}  # usable trials by id, for back-to-back pairs
        self.pairs: dict[int, tuple[float, float]] = {}  # first id of a back-to-back pair -> its two rates
        self._noise: Noise | None = None
        self.base_key: tuple[Any, ...] | None = None
        self.judged_noise: Noise | None = None
        self.labels: list[str] = []
        self.speedups: list[float | None] = []
        self.verdicts: list[str] = []
        self.label_of: dict[int, str] = {}  # id(knobs) -> label against the current baseline
        self.sides: list[Any] = []  # per row: ((knobs, repeats), (knobs, repeats)) of its comparison, or None
        self.ids: dict[Knobs, list[int]] = {}  # usable trials' ids per knobs, in log order
        self.rates: dict[Knobs, list[float]] = {}  # their samples/s
        self.rate_by_id: dict[int, float] = {}
        self.cums: dict[Knobs, tuple[np.ndarray, np.ndarray, float]] = {}  # running sums per knobs (_cum)

    def sync(self, log: ResultLog) -> _Table:
        """Take in the trials appended to `log` since the last call (all of them if it changed)."""
        with self.lock:
            trials = log.trials
            n = len(self.trials)
            if n > len(trials) or any(a is not b for a, b in zip(self.trials, trials)):
                self.__init__()  # trials were replaced or removed: start over
                n = 0
            new = trials[n:]
            if new:
                self.trials.extend(new)
                for r in new:
                    if _usable(r):
                        self.groups.setdefault(r.knobs, []).append(float(r.samples_per_s or 0.0))
                        self._pair(r)
                        self._noise = None
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", FutureWarning)  # all-NA columns in a small part
                    part = _static_frame(new)
                    self.static = part if self.static is None else pd.concat([self.static, part], ignore_index=True)
            return self

    def _pair(self, r: TrialResult) -> None:
        """Back-to-back repeats (consecutive trial ids, same knobs), as noise_of() finds them."""
        if r.trial_id is None:
            return
        t, rate = r.trial_id, float(r.samples_per_s or 0.0)
        self.by_id[t] = (r.knobs, rate)
        before, after = self.by_id.get(t - 1), self.by_id.get(t + 1)
        if before is not None and before[0] == r.knobs:
            self.pairs[t - 1] = (before[1], rate)
        if after is not None and after[0] == r.knobs:
            self.pairs[t] = (rate, after[1])

    def noise(self) -> Noise:
        with self.lock:
            if self._noise is None:
                pairs = [self.pairs[t] for t in sorted(self.pairs)]
                self._noise = replace(estimate_noise(list(self.groups.values())), adjacent=adjacent_noise(pairs),
                                      adjacent_pairs=len(pairs))
            return self._noise

    def frame(self, base: TrialResult | None, noise: Noise) -> pd.DataFrame:
        with self.lock:
            if self.static is None:
                df = pd.DataFrame(columns=SUMMARY_COLUMNS)
                df["status"] = pd.Categorical(df["status"], categories=list(STATUSES))
                df.attrs["noise"] = noise
                return df
            self._judge(base, noise)
            df = self.static.copy()
            df["label"] = self.labels
            df["speedup"] = np.array([np.nan if v is None else v for v in self.speedups], dtype=float)
            df["verdict"] = self.verdicts
        band = math.exp(critical(noise.df) * noise.sigma)
        rate = df["samples_per_s"].astype(float)
        rate = rate.where(rate > 0)
        df["samples_per_s_low"], df["samples_per_s_high"] = rate / band, rate * band
        df.attrs["noise"] = noise
        return df

    def _judge(self, base: TrialResult | None, noise: Noise) -> None:
        """Labels, speedups and verdicts for every trial against `base` under `noise` (see _sides)."""
        key = None if base is None else (base.trial_id, base.knobs, base.samples_per_s)
        if key != self.base_key:
            self.base_key, self.judged_noise = key, None
            self.labels, self.speedups, self.verdicts, self.label_of, self.sides = [], [], [], {}, []
            self.ids, self.rates, self.cums, self.rate_by_id = {}, {}, {}, {}
        start = len(self.labels)
        base_knobs = base.knobs if base is not None else None
        comparable = base is not None and _usable(base)
        new = self.trials[start:]
        count = []  # each new trial's place among its knobs' repeats (1 = the first)
        for r in new:  # first every repeat, so a row before the baseline sees the baseline's earlier repeats
            if _usable(r):
                self.ids.setdefault(r.knobs, []).append(r.trial_id or 0)
                self.rates.setdefault(r.knobs, []).append(float(r.samples_per_s or 0.0))
                self.rate_by_id[r.trial_id or 0] = float(r.samples_per_s or 0.0)
            count.append(len(self.ids.get(r.knobs, ())))
        for r, n in zip(new, count):
            label = self.label_of.get(id(r.knobs))
            if label is None:  # repeats share one Knobs object (the reader caches them)
                label = self.label_of[id(r.knobs)] = r.knobs.label(base_knobs)
            self.labels.append(label)
            speedup, verdict, sides = None, "", None
            if comparable and _usable(r):
                if r.trial_id == base.trial_id:
                    speedup, verdict = 1.0, "baseline"
                else:
                    sides = self._sides_of(base, r, n)
                    speedup, verdict = math.exp(self._mean(sides[1]) - self._mean(sides[0])), "?"
            self.speedups.append(speedup)
            self.verdicts.append(verdict)
            self.sides.append(sides)
        if noise != self.judged_noise:  # every verdict again, else only the new trials'
            self.judged_noise, start = noise, 0
        todo = [i for i in range(start, len(self.verdicts)) if self.sides[i] is not None]
        if todo:
            self._verdicts(noise, todo)

    def _sides_of(self, base: TrialResult, r: TrialResult, n: int) -> tuple[tuple[Knobs, int], tuple[Knobs, int]]:
        """`_sides(trials, base, r)` as (knobs, how many of its repeats) for each side: prefixes of the
        per-knobs lists, since a side is every usable repeat up to a trial id (`n`: r's place in its list)."""
        if r.knobs == base.knobs:  # a repeat of the baseline's knobs: one trial each, by id
            return (base.knobs, -(base.trial_id or 0)), (r.knobs, -(r.trial_id or 0))
        upto = max(r.trial_id or 0, base.trial_id or 0)
        na = bisect.bisect_right(self.ids.get(base.knobs, []), upto)
        return (base.knobs, na or -(base.trial_id or 0)), (r.knobs, n)

    def _cum(self, knobs: Knobs) -> tuple[np.ndarray, np.ndarray, float]:
        """Running sums of log samples/s (shifted by the first, against cancellation) of knobs' repeats."""
        rates = self.rates[knobs]
        got = self.cums.get(knobs)
        if got is None or len(got[0]) != len(rates):
            x = np.log(np.asarray(rates, dtype=float))
            got = self.cums[knobs] = (np.cumsum(x - x[0]), np.cumsum((x - x[0]) ** 2), float(x[0]))
        return got

    def _moments(self, side: tuple[Knobs, int]) -> tuple[int, float, float]:
        """(n, mean, sum of squared deviations) of a side's log samples/s: what decide() computes."""
        knobs, n = side
        if n < 0:  # one trial, by id
            return 1, math.log(self.rate_by_id[-n]), 0.0
        s1, s2, x0 = self._cum(knobs)
        t1, t2 = float(s1[n - 1]), float(s2[n - 1])
        return n, x0 + t1 / n, max(0.0, t2 - t1 * t1 / n)

    def _mean(self, side: tuple[Knobs, int]) -> float:
        return self._moments(side)[1]

    def _verdicts(self, noise: Noise, todo: list[int]) -> None:
        """The verdict of each row in `todo`: decide()'s rule (pooled t interval, the larger of the
        machine's noise and the sides' own spread, MIN_EFFECT, ±MARGIN for "same speed") on every row
        at once from running sums, so a new noise costs one vectorised pass, not n decide() calls.
        tests/test_results.py holds every verdict equal to compare(*_sides(...))."""
        m = np.array([(*self._moments(self.sides[i][0]), *self._moments(self.sides[i][1])) for i in todo], dtype=float)
        na, ma, ssa, nb, mb, ssb = m.T
        d = mb - ma
        local_df = na + nb - 2
        with np.errstate(divide="ignore", invalid="ignore"):
            local = np.sqrt((ssa + ssb) / local_df)
        sigma = np.where(local_df >= 2, np.maximum(noise.sigma, np.nan_to_num(local)), noise.sigma)
        half = critical(noise.df) * sigma * np.sqrt(1 / na + 1 / nb)
        beyond = (np.abs(d) > half) & (np.abs(np.exp(d) - 1) >= MIN_EFFECT)
        same = (np.exp(d - half) >= 1 / (1 + MARGIN)) & (np.exp(d + half) <= 1 + MARGIN)
        words = np.where(beyond, "beyond noise", np.where(same, "same speed", "within noise"))
        for i, w in zip(todo, words.tolist()):
            self.verdicts[i] = w


def _padded(values: Sequence[float], n: int) -> list[float]:
    """`values` cut or NaN-padded to n entries (a failed trial may have fewer losses than step times)."""
    out = [float(v) for v in values[:n]]
    return out + [float("nan")] * (n - len(out))


MAX_LINE_BYTES = 1 << 20  # a trial record is a few KB; a longer line is not one of ours
MAX_FILE_BYTES = 1 << 30  # a log beyond 1 GiB is read up to there (with a warning)
MAX_DEPTH = 16  # JSON nesting a trial record never needs (it uses 3): deeper lines are refused unparsed
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKETS = re.compile(r"[\[\]{}]")
_NUMBERS = ("samples_per_s", "data_wait_share", "startup_s", "compile_s")
_INTS = ("peak_memory_bytes", "model_state_bytes", "samples_per_step")
_TEXTS = ("message", "started_at", "where", "traceback", "participant")


_KNOBS_SEEN: dict[tuple[Any, ...], Knobs] = {}


class BadRecord(ValueError):
    """A log line that is not a usable workbench record; its message never quotes the line."""


def _no_constant(name: str) -> Any:
    raise BadRecord(f"a {name} number (not finite)")


def _depth_ok(line: str) -> bool:
    """True when the JSON text nests no deeper than MAX_DEPTH (cheap unless it has many brackets)."""
    if line.count("[") + line.count("{") <= MAX_DEPTH:
        return True
    depth = 0
    for b in _BRACKETS.findall(_STRINGS.sub("", line)):
        depth += 1 if b in "[{" else -1
        if depth > MAX_DEPTH:
            return False
    return True


def _num_ok(x: Any, kind: type | tuple[type, ...] = (int, float)) -> bool:
    """A JSON number of `kind`, >= 0 and within float range (bools and huge ints are not)."""
    return not isinstance(x, bool) and isinstance(x, kind) and 0 <= x < 1e300


def _numbers_ok(v: Any, low: float) -> bool:
    """A list of numbers in [low, 1e300) (C-speed min/max; anything not comparable fails)."""
    if not isinstance(v, list):
        return False
    try:
        return not v or (min(v) >= low and max(v) < 1e300)
    except TypeError:  # text, None, lists or objects among the numbers
        return False


def _check_number(rec: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> None:
    v = rec.get(key)
    if v is not None and not _num_ok(v, kind):
        raise BadRecord(f"{key} is not a number >= 0")


def _check_trial(rec: dict[str, Any]) -> None:
    """Types and ranges of a trial record's fields: BadRecord naming the first field that fails."""
    if rec.get("status") not in STATUSES:
        raise BadRecord("status is not a known trial status")
    tid = rec.get("trial_id")
    if not _num_ok(tid, int) or tid < 1:
        raise BadRecord("trial_id is not an int >= 1")
    for key in _NUMBERS:
        _check_number(rec, key, (int, float))
    for key in _INTS:
        _check_number(rec, key, int)
    for key in ("step_times_s", "data_wait_s"):
        v = rec.get(key) or []
        if not _numbers_ok(v, 0.0):
            raise BadRecord(f"{key} is not a list of numbers >= 0")
    losses = rec.get("losses") or []
    if not _numbers_ok([x for x in losses if x is not None] if isinstance(losses, list) else losses, -1e300):
        raise BadRecord("losses is not a list of numbers")
    for key in _TEXTS:
        if not isinstance(rec.get(key, ""), str):
            raise BadRecord(f"{key} is not text")
    if not isinstance(rec.get("notes") or [], list) or not all(isinstance(n, str) for n in rec.get("notes") or []):
        raise BadRecord("notes is not a list of text")
    for key in ("env", "extra"):
        if not isinstance(rec.get(key) or {}, dict):
            raise BadRecord(f"{key} is not an object")
    if rec.get("trace_path") is not None and not isinstance(rec["trace_path"], str):
        raise BadRecord("trace_path is not text")


def _knobs_of(rec: dict[str, Any]) -> Knobs:
    """The record's Knobs, validated once per distinct configuration (a long log repeats a few).

    Your own knobs (`user_knobs`) stay in the row even before their cell has run again (unknown)."""
    user = rec.get("user_knobs") or []
    if not isinstance(user, list) or not all(isinstance(n, str) and n.isidentifier() for n in user):
        raise BadRecord("user_knobs is not a list of knob names")
    names = [*knob_names(), *user]  # read each time: a notebook may register a knob of its own
    items = (tuple(names), *((k, type(rec[k]).__name__, tuple(rec[k]) if isinstance(rec[k], list) else rec[k])
                             for k in names if k in rec))
    try:
        knobs = _KNOBS_SEEN.get(items)
    except TypeError:  # a dict or nested list where a knob value belongs: validation says which
        return Knobs.from_dict({k: rec[k] for k in names if k in rec}, keep_unknown=True)
    if knobs is None:
        knobs = Knobs.from_dict({k: rec[k] for k in names if k in rec}, keep_unknown=True)
        if len(_KNOBS_SEEN) < 4096:
            _KNOBS_SEEN[items] = knobs
    return knobs


def parse_record(line: str | bytes) -> tuple[str, Any]:
    """One JSONL line of a log: ("baseline", trial id), ("comparison", LoggedComparison) or ("trial", TrialResult).

    Treats the line as untrusted: raises BadRecord (a ValueError whose message never quotes the
    line) for a line over MAX_LINE_BYTES, nesting deeper than MAX_DEPTH, not JSON, infinite or
    NaN numbers, fields of the wrong type or range, or knobs that fail `Knobs` validation.
    """
    if len(line) > MAX_LINE_BYTES:
        raise BadRecord(f"longer than {MAX_LINE_BYTES:,} bytes")
    if isinstance(line, bytes):
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError:
            raise BadRecord("not UTF-8 text") from None
    if not _depth_ok(line):
        raise BadRecord(f"nested deeper than {MAX_DEPTH} levels")
    try:
        rec = json.loads(line, parse_constant=_no_constant)  # 1e400 parses as inf: the range checks catch it
    except BadRecord:
        raise
    except (ValueError, RecursionError):
        raise BadRecord("not JSON") from None
    if not isinstance(rec, dict):
        raise BadRecord(f"a JSON {type(rec).__name__}, not a trial record")
    if rec.get("event") == "baseline":
        tid = rec.get("trial_id")
        if not _num_ok(tid, int) or tid < 1:
            raise BadRecord("a baseline event without a trial id")
        return "baseline", tid
    if rec.get("event") == "comparison":
        return "comparison", LoggedComparison.from_record(rec)
    if "status" not in rec or "trial_id" not in rec:
        raise BadRecord("no status/trial_id: not a workbench trial")
    _check_trial(rec)
    try:
        return "trial", TrialResult.from_record(rec, knobs=_knobs_of(rec))
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as e:
        where = str(e).split(" ", 1)[0] if str(e).startswith("Knobs.") else "a field"
        raise BadRecord(f"{where} fails validation ({type(e).__name__})") from None


def read_records(lines: Iterable[str | bytes], *, comparisons: list[LoggedComparison] | None = None,
                 ) -> tuple[list[TrialResult], int | None, list[tuple[int, Exception]]]:
    """(trials, the last explicit baseline id, [(line index, BadRecord) of unusable lines]) of log lines;
    logged comparisons are appended to `comparisons` when given (else skipped).

    Never raises on content (see `parse_record`); the errors never quote the lines.
    """
    trials: list[TrialResult] = []
    baseline_id: int | None = None
    bad: list[tuple[int, Exception]] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            kind, value = parse_record(line)
        except BadRecord as e:
            bad.append((i, e))
            continue
        if kind == "baseline":
            baseline_id = value
        elif kind == "comparison":
            if comparisons is not None:
                comparisons.append(value)
        else:
            trials.append(value)
    return trials, baseline_id, bad


def bad_lines_text(bad: Sequence[tuple[int, Exception]], *, first_line: int = 1, last: int | None = None) -> str:
    """"line 3 (not JSON), line 9 (...)" for a warning: line numbers and reasons, never the content."""
    parts = [f"{'last line' if last is not None and i == last else f'line {first_line + i}'} ({e})" for i, e in bad[:3]]
    more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
    return ", ".join(parts) + more


MAX_NAME_CHARS = 1000  # a participant or workbench name longer than this is refused
FILE_NAME_CHARS = 64  # the file/folder name made from it stays this short (well under NAME_MAX = 255 bytes)


def safe_file_name(name: str, *, what: str = "participant") -> str:
    """A short, stable, file-name-safe form of a participant or workbench name.

    Letters, digits and `_.@-` are kept (other characters become `_`); a name that had to change
    this way, or is longer than FILE_NAME_CHARS, gets a short hash of the full name appended so two
    names never share a file. The full name stays inside every record. ValueError names the rule
    for a name that cannot be used at all (not text, empty, over MAX_NAME_CHARS characters).
    """
    if not isinstance(name, str):
        raise TypeError(f"a {what} name must be text (str) such as 'ana', got {type(name).__name__}")
    if not name.strip():
        raise ValueError(f"the {what} name is empty: pass a name such as 'ana'")
    if len(name) > MAX_NAME_CHARS:
        raise ValueError(f"the {what} name has {len(name):,} characters; the limit is {MAX_NAME_CHARS:,}: "
                         "pass a shorter name")
    safe = re.sub(r"[^A-Za-z0-9_.@-]+", "_", name.strip()).strip(".")
    plain = re.fullmatch(r"[A-Za-z0-9_.@\s-]*", name.strip()) is not None  # only spaces change: no hash
    if plain and safe.strip("_") and len(safe) <= FILE_NAME_CHARS:
        return safe
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return f"{safe[: FILE_NAME_CHARS - 11].rstrip('.')}-{digest}" if safe.strip("_") else f"_-{digest}"


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
    with thread_lock, open(path, "a+b", buffering=0) as f:  # unbuffered: a failed write leaves nothing behind
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
