"""Wall time on an executor: what tune(parallel=N) says before its first trial, and how its jobs' time went.

A trial run as a job waits in the scheduler's queue (`extra["job"]["queue_s"]`, outside the budget), then
starts (`start_s`: the job's Python, imports, the workload unpickled; a held worker's later trials skip
it, launch/held.py), then measures. Both figures come from the trials this workbench has run, never
from a constant: before any job ran, they are unknown.
"""

from __future__ import annotations

import statistics
from typing import Any


def _jobs(trials: list[Any]) -> list[dict[str, Any]]:
    return [t.extra["job"] for t in trials if isinstance(getattr(t, "extra", None), dict)
            and isinstance(t.extra.get("job"), dict)]


def _median(values: list[Any]) -> float | None:
    got = [float(v) for v in values if isinstance(v, (int, float))]
    return statistics.median(got) if got else None


def expect_line(trials: list[Any], budget_s: float | None, parallel: int) -> str:
    """One line before tune's first trial: its budget (queue time not counted in it) and, per job, the
    queue wait and start-up this workbench's jobs measured so far (medians), or that they are unknown."""
    cap = f"budget_s={budget_s:g} s of trials" if budget_s else "no seconds budget"
    head = f"tune(parallel={parallel}) on an executor: {cap}; each job also waits in the queue (not counted)"
    jobs = _jobs(trials)
    queue, start = _median([j.get("queue_s") for j in jobs]), _median([j.get("start_s") for j in jobs])
    if queue is None and start is None:
        return f"{head}; its queue wait and start-up are unknown until the first job starts"
    held = _median([j.get("start_s") for j in jobs if (j.get("held") or {}).get("task", 1) > 1])
    per = (f"queue ≈ {queue:.1f} s" if queue is not None else "queue unknown") + (
        f", start-up ≈ {start:.1f} s" if start is not None else ", start-up unknown")
    reuse = f" (a held worker's later trials: start-up ≈ {held:.1f} s)" if held is not None else ""
    return f"{head}; per job so far ({len(jobs)} jobs, medians): {per}{reuse}"


def jobs_line(trials: list[Any]) -> str | None:
    """How the jobs' time went (None without jobs): queue wait and start-up summed, apart, and how many
    trials ran on a held worker that was already up."""
    jobs = _jobs(trials)
    if not jobs:
        return None
    queue = sum(float(j.get("queue_s") or 0.0) for j in jobs)
    start = sum(float(j.get("start_s") or 0.0) for j in jobs)
    reused = [j for j in jobs if (j.get("held") or {}).get("task", 1) > 1]
    line = f"{len(jobs)} trials as jobs: {queue:.1f} s in the queue, {start:.1f} s of job start-up"
    if reused:
        line += (f"; {len(reused)} ran on a held worker already up (start-up ≈ "
                 f"{_median([j.get('start_s') for j in reused]) or 0.0:.1f} s each)")
    return line
