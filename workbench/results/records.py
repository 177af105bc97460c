"""Log records as untrusted input: parsing and validating JSONL lines, and names made safe for files.

A log line is read as something anyone could have written (a shared folder, a copied file): it
is never unpickled and never evaluated; a line that is too long, too deep, not JSON, holds
non-finite numbers, or fields of the wrong type or range is refused with a BadRecord whose message
never quotes the line. `safe_file_name` turns a participant's or workbench's name into a short,
stable file name. The log itself (reading files, locking, appends) is `log.py`.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import platform
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.knobs import BUILTIN_KNOBS, Knobs, knob_names
from ..core.measure import STATUSES, TrialResult
from .rules import ANSWERS
from .stats import Comparison

MAX_LINE_BYTES = 1 << 20  # a trial record is a few KB; a longer line is not one of ours
MAX_DEPTH = 16  # JSON nesting a trial record never needs (it uses 3): deeper lines are refused unparsed
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKETS = re.compile(r"[\[\]{}]")
_NUMBERS = ("samples_per_s", "data_wait_share", "copy_share", "startup_s", "compile_s", "shape_warmup_s")
_INTS = ("peak_memory_bytes", "model_state_bytes", "samples_per_step", "shapes")
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


METHODS = ("trials", "interleaved", "unchanged")  # unchanged: the same step on both sides, not measured


@dataclass(frozen=True)
class LoggedComparison:
    """A comparison as the log keeps it (one "comparison" line): both sides' knobs, how it was
    decided, and the answer with its interval. A restarted kernel reads it back; the table's
    verdict uses the latest decided one for a trial's knobs against the baseline's."""

    a: int | None
    b: int | None
    a_knobs: Knobs
    b_knobs: Knobs
    method: str  # "trials", "interleaved" or "unchanged" (the knobs that differ change nothing in the step)
    answer: str  # "faster", "slower", "same" or "undecided"
    speedup: float
    low: float
    high: float
    margin: float
    seconds: float | None = None
    turns: int = 0  # interleaved: pairs of turns ("blocks" in logs before round 5)
    turn_steps: int = 0
    rounds: int = 0  # trials: alternating rounds
    note: str = ""
    at: str = ""  # when it was decided (UTC, ISO 8601)

    @classmethod
    def of(cls, c: Comparison, a_knobs: Knobs, b_knobs: Knobs) -> LoggedComparison:
        """The log's form of a Comparison between configurations `a_knobs` and `b_knobs`."""
        return cls(c.a, c.b, a_knobs, b_knobs, c.method, c.answer, c.speedup, c.low, c.high, c.margin, c.seconds,
                   c.turns, c.turn_steps, c.rounds, c.note, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))

    @property
    def how(self) -> str:
        """How it was decided, in a few words (the table's `decided_by` column)."""
        secs = f", {self.seconds:.0f} s" if self.seconds is not None else ""
        if self.method == "interleaved":
            return f"interleaved, {self.turns} pairs of turns{secs}"
        if self.method == "unchanged":
            return "not measured: the same step"
        return f"trials, {self.rounds} round{'s' if self.rounds != 1 else ''}{secs}"

    def to_record(self) -> dict[str, Any]:
        """A flat JSON-safe dict: event "comparison", each side's knobs as a trial record holds them."""
        def side(k: Knobs) -> dict[str, Any]:
            d = k.to_dict()
            return {**d, "user_knobs": [n for n in d if n not in BUILTIN_KNOBS]}

        return {"event": "comparison", "a": self.a, "b": self.b, "a_knobs": side(self.a_knobs),
                "b_knobs": side(self.b_knobs), "method": self.method, "answer": self.answer,
                "speedup": self.speedup, "low": self.low, "high": self.high, "margin": self.margin,
                "seconds": self.seconds, "turns": self.turns, "turn_steps": self.turn_steps,
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
        for key in ("a", "b", "turns", "turn_steps", "blocks", "block_steps", "rounds"):  # blocks: older logs
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
                   rec.get("turns", rec.get("blocks")) or 0, rec.get("turn_steps", rec.get("block_steps")) or 0,
                   rec.get("rounds") or 0,
                   rec.get("note", ""), rec.get("at", ""))


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


