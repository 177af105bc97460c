"""What a multi-process test says when it fails: every failed rank's whole traceback, never a tail.

A trial on forked ranks carries its root-cause rank's traceback in `result.traceback`; a torchrun
job prints each rank's traceback to its stderr, above torchrun's own summary (whose `error_file:
<N/A>` lines say nothing). Cutting either to its last few hundred characters keeps the summary and
loses the cause, so these helpers keep all of it.
"""

from __future__ import annotations

import subprocess
from typing import Any


def why(*results: Any) -> str:
    """The status, message, stage and whole traceback of every result that is not ok."""
    parts = []
    for r in results:
        if getattr(r, "ok", False):
            continue
        parts.append(f"status={r.status!r} where={getattr(r, 'where', '')!r}\nmessage: {r.message}\n"
                     f"{getattr(r, 'traceback', '') or '(no traceback)'}")
    return "\n\n".join(parts) or "every result is ok"


def job_output(proc: subprocess.CompletedProcess | Any, stderr: str | None = None) -> str:
    """A finished torchrun job's exit code and its whole stdout and stderr (each rank's traceback)."""
    err = proc.stderr if stderr is None else stderr
    return f"exit code {proc.returncode}\n--- stderr (whole) ---\n{err}\n--- stdout ---\n{proc.stdout or ''}"
