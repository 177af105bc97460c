"""Whether the process that owns a job still runs: the one rule for the jobs registry (jobs.py: a
restarted kernel takes over only the jobs whose owner is gone) and for a fresh process's watchdog
(fresh.py: the job ends with its caller).

A process is named by its pid and its start time, so a pid reused by another process is not the
owner; a zombie (killed, not yet reaped by its parent) runs nothing and is gone. On another host
the process cannot be looked at: its owner's heartbeat (a registry entry touched) within LEASE_S is.
"""

from __future__ import annotations

import functools
import os
import socket
import time
from typing import Any

LEASE_S = 120.0  # an entry from another host untouched this long: its owner is gone


def started_at(pid: int) -> float | None:
    """The start time of process `pid` (seconds since the epoch, 2 decimals); None when it is gone, a
    zombie, or unreadable."""
    try:
        import psutil

        proc = psutil.Process(pid)
        return None if proc.status() == psutil.STATUS_ZOMBIE else round(proc.create_time(), 2)
    except Exception:  # no such process, or psutil cannot read it
        return None


@functools.cache
def _own_start(pid: int) -> float | None:
    return started_at(pid)


def owner() -> dict[str, Any]:
    """This process as a job's owner: host, pid and the process's start time."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": _own_start(os.getpid())}


def process_alive(pid: int, started: float | None) -> bool:
    """Whether process `pid` on this host runs and is the one that started at `started` (None: any
    process with that pid, for an owner written without its start time)."""
    now = started_at(pid) if pid > 0 else None
    return now is not None and (started is None or abs(now - started) < 1.0)


def owner_alive(who: Any, touched: float) -> bool:
    """Whether a registry entry's owner still runs: on this host, its process (`process_alive`); on
    another, a heartbeat within LEASE_S of `touched` (the entry's mtime). An entry without an owner is
    an earlier kernel's."""
    if not isinstance(who, dict):
        return False
    if who.get("host") == socket.gethostname():
        return process_alive(int(who.get("pid") or 0), who.get("started"))
    return time.time() - touched < LEASE_S
