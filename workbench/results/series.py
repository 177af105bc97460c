"""A long trial's per-step series beside the log, so every record stays within the reader's line cap.

A trial of 200,000 steps holds three series (step times, data waits, losses) of 200,000 floats each:
several MB as JSON, over the 1 MiB a log reader takes per line (records.MAX_LINE_BYTES). When a
record holds more than INLINE_VALUES values (about 250 KB inline), its series go to one binary side file in `<log>.series/`
(little-endian float64: the step times, then the data waits, then the losses, NaN for a missing
loss), named by its SHA-256, and the record keeps their first KEPT_STEPS values inline and a pointer
in `extra["series"]` ({"file", "sha256", "counts"}). The log's reader puts the whole series back
(`join`), so the median, IQR and every figure derived from them reload exactly.

Side files are written like the log's `save()`, by the one atomic writer (launch/folders.py:
`write_atomic`: a new temporary file, O_EXCL, never through a link, fsynced, then renamed into place). They are read as untrusted input: a name that is only a hash, no
symbolic link followed, a regular file of exactly the size the counts say, and a matching hash.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ..launch.folders import write_atomic

INLINE_VALUES = 10_000  # a record with more series values keeps them in a side file (~25 bytes each inline)
KEPT_STEPS = 1_000  # values of each series kept inline (what a reader without the side file sees)
MAX_SIDE_BYTES = 1 << 30  # a side file is 8 bytes a value: 44 million steps at most
SERIES = ("step_times_s", "data_wait_s", "losses")
_NAME = re.compile(r"[0-9a-f]{64}\.f8")
_FLAGS = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def folder_of(log: Path) -> Path:
    """The side-file folder of the log at `log`: `runs.jsonl` -> `runs.series/`."""
    return log.with_suffix(".series")


def _own_folder(folder: Path) -> Path:
    """`folder` made if missing; OSError when it is a symbolic link or not a folder (never written through)."""
    with contextlib.suppress(FileExistsError):
        folder.mkdir()
    if not stat.S_ISDIR(os.lstat(folder).st_mode):
        raise NotADirectoryError(f"{folder} is not a folder of its own (a symbolic link or a file)")
    return folder


def split(record: dict[str, Any], log: Path | None) -> dict[str, Any]:
    """`record` with its series in a side file beside `log` (see the module's docstring). Without a log
    file, or when the side file cannot be written, the record keeps the first KEPT_STEPS values and says
    so in its pointer ({"unsaved": counts}): the line stays readable; the trial in memory stays whole."""
    counts = [len(record.get(k) or ()) for k in SERIES]
    out = {k: (list(v[:KEPT_STEPS]) if k in SERIES else v) for k, v in record.items()}
    values = [x if x is not None else float("nan") for k in SERIES for x in (record.get(k) or ())]
    data = np.asarray(values, dtype="<f8").tobytes()
    digest = hashlib.sha256(data).hexdigest()
    name = f"{digest}.f8"
    ref: dict[str, Any] = {"file": name, "sha256": digest, "counts": counts}
    try:
        if log is None:
            raise FileNotFoundError("no log file")
        folder = _own_folder(folder_of(log))
        if not _matches(folder / name, digest, len(data)):  # the same series written before: nothing to do
            write_atomic(folder / name, data, mode=0o666)
    except OSError:
        ref = {"unsaved": counts}
    out["extra"] = {**(record.get("extra") or {}), "series": ref}
    return out


def _matches(path: Path, digest: str, size: int) -> bool:
    try:
        return hashlib.sha256(_read(path, size)).hexdigest() == digest
    except (OSError, ValueError):
        return False


def _read(path: Path, size: int) -> bytes:
    """The bytes of a regular file of exactly `size` bytes, opened without following a link or blocking."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:
            raise ValueError("not a regular file of the size its record says")
        chunks, left = [], size
        while left:
            chunk = os.read(fd, min(left, 1 << 24))
            if not chunk:
                raise ValueError("shorter than its record says")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def join(trial: Any, log: Path) -> tuple[Any, str | None]:
    """(`trial` with its whole series read back from its side file, None) when its record points to one;
    (`trial` as read, why not) when the file is missing or does not match; (`trial`, None) without a pointer."""
    ref = trial.extra.get("series") if isinstance(trial.extra, dict) else None
    if not isinstance(ref, dict):
        return trial, None
    if "unsaved" in ref:
        return trial, "its side file could not be written"
    name, digest, counts = ref.get("file"), ref.get("sha256"), ref.get("counts")
    if (not isinstance(name, str) or not _NAME.fullmatch(name) or name != f"{digest}.f8"
            or not isinstance(counts, list) or len(counts) != len(SERIES)
            or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts)
            or 8 * sum(counts) > MAX_SIDE_BYTES):
        return trial, "its series pointer is malformed"
    folder = folder_of(log)
    try:
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            return trial, f"{folder} is not a folder of its own"
        data = _read(folder / name, 8 * sum(counts))
    except (OSError, ValueError) as e:
        return trial, f"{folder / name}: {e.strerror if isinstance(e, OSError) and e.strerror else e}"
    if hashlib.sha256(data).hexdigest() != digest:
        return trial, f"{folder / name} does not match its record's hash"
    values = np.frombuffer(data, dtype="<f8").tolist()
    parts, at = {}, 0
    for key, n in zip(SERIES, counts):
        parts[key], at = tuple(values[at:at + n]), at + n
    extra = {k: v for k, v in trial.extra.items() if k != "series"}
    return replace(trial, **parts, extra=extra), None
