"""The one job watcher: a trial (or an analysis) running in another process, watched from the notebook.

Every executor goes through `watch` (a SLURM job through submitit, submitit's local executor, the local
`FreshProcess`, a Future): it reads the job's progress file (one format, `write_progress`: a JSON
object with phase, done, total, host, pid and time), asks the scheduler for the job's state (SLURM:
one batched `squeue` for every job in flight, `SlurmBoard`), shows the wait in the trial's progress,
cancels the job on Stop, a budget's deadline, Ctrl-C or `halt`, and turns a job that ended without a
result into one failed trial with the scheduler's reason (`JobFailed`, `failed_trial`).

Extension point (docs/cluster.md): an executor is any `submit(fn, *args) -> job` whose job has
`result()`, `done()` and `cancel()`; optional `job_id`. Scheduler states are read for SLURM jobs
(`is_slurm`); another scheduler plugs in by giving `Watch.ask` its state (a `SchedulerState`).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.measure import TrialResult
from ..core.progress import TrialProgress
from .folders import write_atomic

POLL_S = 0.25  # how often the notebook looks at the job (progress file, result)
ASK_EVERY_S = 1.0  # how often it asks the scheduler, at least (one squeue for every job in flight)
ASK_PER_JOB_S = 0.25  # ...and this much longer per job in flight (a cluster's rate limits)
ASK_MAX_S = 10.0  # ...up to this
# After the scheduler says a job ended, how long its result may take to appear in the job folder: a
# network filesystem shows another node's new file only once its cached lookup of the folder expires
# (NFS: acdirmax, 60 s by default). WORKBENCH_RESULT_GRACE_S (seconds) sets it for slower filesystems.
RESULT_GRACE_S = 90.0
GRACE_ENV = "WORKBENCH_RESULT_GRACE_S"
UNANSWERED_S = 600.0  # a scheduler silent this long ends the trial, the job left as it is (never forgotten)
KILLED = {"TIME LIMIT": "TIMEOUT", "PREEMPTION": "PREEMPTED", "NODE FAILURE": "NODE_FAIL"}  # slurmstepd's words
CANCEL_WAIT_S = 10.0  # after a cancel, how long to wait for the job to leave the node
ENDED = "cancelled (it has ended)"  # what stop_job says of a job that was no longer running
TERMINAL = {  # SLURM job states that end a job, and the trial status a job without a result gets
    "CANCELLED": "interrupted", "PREEMPTED": "interrupted", "DEADLINE": "interrupted",
    "TIMEOUT": "error", "NODE_FAIL": "error", "BOOT_FAIL": "error", "FAILED": "error",
    "OUT_OF_MEMORY": "oom", "COMPLETED": "error", "SPECIAL_EXIT": "error", "REVOKED": "error",
}
WHY = {
    "CANCELLED": "was cancelled on the scheduler (scancel, an administrator, or its dependency)",
    "PREEMPTED": "was preempted by a higher-priority job",
    "DEADLINE": "reached its deadline before it could finish",
    "TIMEOUT": "hit its time limit: raise the executor's timeout_min",
    "NODE_FAIL": "lost its node (the node failed or stopped answering)",
    "BOOT_FAIL": "could not start its node",
    "FAILED": "exited with an error before returning a result (see the job's stderr)",
    "OUT_OF_MEMORY": "ran out of host memory on its node: raise the executor's mem_gb (or lower batch_size)",
    "COMPLETED": "ended without writing its result",
}


def write_progress(path: Path, phase: str, done: int, total: int) -> bool:
    """Write the job's progress (the one format every watcher reads: phase, done, total, host, pid,
    time) atomically (folders.write_atomic); False, never raising, when the filesystem refuses: a
    progress file is a view, and losing it must not lose the trial's result."""
    snap = {"phase": phase, "done": done, "total": total, "pid": os.getpid(), "host": platform.node().split(".")[0],
            "t": time.time()}
    try:
        write_atomic(path, json.dumps(snap).encode(), durable=False)  # a view: no fsync every half second
        return True
    except OSError:
        return False


def result_grace_s() -> float:
    """Seconds a finished job's result may take to appear (RESULT_GRACE_S, or WORKBENCH_RESULT_GRACE_S);
    ValueError naming the variable when it is not a positive number of seconds."""
    raw = os.environ.get(GRACE_ENV, "").strip()
    if not raw:
        return RESULT_GRACE_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds < float("inf"):
        raise ValueError(f"{GRACE_ENV}={raw!r}: the seconds a finished job's result may take to appear in its "
                         f"folder must be a positive number (e.g. {GRACE_ENV}=300)")
    return seconds


def listed(path: Path) -> bool:
    """Whether `path` exists, asking its folder's listing when a lookup says no: a network filesystem
    (NFS) may cache a failed lookup of a file another node has since written, while a fresh listing of
    the folder has it. The folder is touched first (chmod to its own mode), as submitit does, so the
    client drops its cached view of it."""
    if path.exists():
        return True
    folder = path.parent
    with contextlib.suppress(OSError):  # not this user's folder: the listing alone
        folder.chmod(folder.stat().st_mode)
    try:
        return path.name in os.listdir(folder)
    except OSError:
        return False


def has_scheduler(job: Any) -> bool:
    """Whether a scheduler says when `job` runs: a SLURM job, or a job giving its own `scheduler_state()`
    (a held task: its worker's state, held.py). Other jobs run at once: their wait is start-up."""
    return is_slurm(job) or callable(getattr(job, "scheduler_state", None))


def is_slurm(job: Any) -> bool:
    """Whether `job` is a SLURM job (submitit's SlurmJob): its state then comes from squeue/scontrol."""
    return type(job).__name__ == "SlurmJob" and shutil.which("squeue") is not None


class QueueWaits:
    """What one budgeted trial's jobs report about their queue waits, given to them explicitly: a
    budget's Deadline holds one (`Deadline.waits`), and the jobs read it there by type (`waits_of`),
    never by attribute names on a cancel event. `account` is the budget's QueueAccount (each job's
    waiting, running, ended); `queued(seconds)` is a job that left the queue after `seconds`, summed in
    `waited` and passed to `on_wait` (the deadline moves on by as much)."""

    def __init__(self, account: Any, on_wait: Callable[[float], None] | None = None) -> None:
        self.account = account
        self.on_wait = on_wait
        self.waited = 0.0  # seconds this trial's jobs waited in a queue

    def queued(self, seconds: float) -> None:
        self.waited += max(0.0, seconds)
        if self.on_wait is not None:
            self.on_wait(seconds)


def waits_of(cancel: Any) -> QueueWaits | None:
    """The QueueWaits a trial's cancel event carries (a budget's Deadline, or the panel's Stop around
    one); None for any other event, whatever its attributes."""
    waits = getattr(cancel, "waits", None)
    return waits if isinstance(waits, QueueWaits) else None


@dataclass
class SchedulerState:
    """What the scheduler says about a job: its state word, why it waits or ended, and its node."""

    state: str = ""  # PENDING, RUNNING, COMPLETED, CANCELLED, TIMEOUT, ... ("" when unknown)
    reason: str = ""  # Resources, Priority, ... or the end's reason
    node: str = ""
    known: bool = True  # False once the scheduler no longer lists the job
    answered: bool = True  # False when the scheduler did not answer (timeout, slurmctld down, rate limits)


def _ask(cmd: list[str]) -> tuple[bool, str]:
    """(whether the scheduler answered, its output): an unknown job id is an answer; a timeout or an
    unreachable slurmctld is not."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False, ""
    return p.returncode == 0 or "Invalid job id" in p.stderr, p.stdout


def _clean(reason: str) -> str:
    return "" if reason in ("None", "(null)") else reason


def slurm_states(job_ids: list[str]) -> dict[str, SchedulerState]:
    """Every job's state from ONE `squeue -t all` (pending, running, and ended ones slurmctld still
    keeps for MinJobAge seconds), `scontrol show job` for any it does not list. Accounting (sacct) is
    not needed. A scheduler that does not answer gives `answered=False` states, never "lost"."""
    ids = sorted({str(j) for j in job_ids})
    ok, out = _ask(["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", "%i|%T|%r|%N"])
    if not ok:
        return {j: SchedulerState(known=False, answered=False) for j in ids}
    got = {}
    for line in out.splitlines():
        jid, state, reason, node = [*line.split("|"), "", "", ""][:4]
        got[jid.strip()] = SchedulerState(state.strip(), _clean(reason.strip()), node.strip())
    for j in ids:
        if j not in got:
            ok, text = _ask(["scontrol", "-o", "show", "job", j])
            fields = dict(w.split("=", 1) for w in text.split() if "=" in w)
            got[j] = (SchedulerState(fields["JobState"], _clean(fields.get("Reason", "")), fields.get("NodeList", ""))
                      if fields.get("JobState") else SchedulerState(known=False, answered=ok))
    return got


def slurm_state(job_id: str) -> SchedulerState:
    """One job's state (`slurm_states`)."""
    return slurm_states([str(job_id)])[str(job_id)]


class SlurmBoard:
    """The SLURM jobs this process watches, asked about together: one `squeue` for all of them at most
    every `interval()` seconds (ASK_EVERY_S, plus ASK_PER_JOB_S per job in flight, up to ASK_MAX_S),
    so ten watchers make one query, not ten. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[str, int] = {}  # job id -> watchers
        self._states: dict[str, SchedulerState] = {}
        self._at = -float("inf")

    def add(self, job_id: str) -> None:
        with self._lock:
            self._jobs[job_id] = self._jobs.get(job_id, 0) + 1

    def remove(self, job_id: str) -> None:
        with self._lock:
            n = self._jobs.pop(job_id, 1) - 1
            if n > 0:
                self._jobs[job_id] = n
            self._states.pop(job_id, None)

    def interval(self) -> float:
        return min(ASK_MAX_S, max(ASK_EVERY_S, ASK_PER_JOB_S * len(self._jobs)))

    def state(self, job_id: str) -> SchedulerState:
        """`job_id`'s state, from the last batched query when it is recent enough."""
        with self._lock:  # one query at a time: a watcher that waits here gets the fresh answer
            now = time.monotonic()
            if job_id in self._states and now - self._at < self.interval():
                return self._states[job_id]
            self._states = slurm_states(sorted({*self._jobs, job_id}))
            self._at = time.monotonic()
            return self._states[job_id]


BOARD = SlurmBoard()


def job_id_of(job: Any) -> str:
    """The scheduler's id of `job` ("" for an executor that has none)."""
    jid = getattr(job, "job_id", None)
    return "" if jid is None else str(jid)


class JobFailed(Exception):
    """A job ended without a result: `status` (a trial status) and `message` say why."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


@dataclass
class Watch:
    """One job watched from the notebook: submitted at `t_submit`, started when its progress file
    first appears; `queue_s` is the wait in between (never measurement)."""

    job: Any
    progress_file: Path
    t_submit: float
    t_start: float | None = None  # the job's first progress (its Python, imports and workload loaded)
    t_running: float | None = None  # the scheduler first said RUNNING (SLURM), else t_start
    sched: SchedulerState | None = None
    asked_at: float = 0.0
    ended_at: float | None = None  # when the scheduler first said the job ended without a result
    host: str = ""
    stopped: str = ""  # what stop_job said when a Ctrl-C cancelled the job
    silent_since: float | None = None  # when the scheduler stopped answering (None while it answers)
    listed_at: float = -float("inf")  # when the job folder's listing was last asked for the result (monotonic)

    @property
    def job_id(self) -> str:
        return job_id_of(self.job)

    @property
    def queue_s(self) -> float | None:
        """Seconds from submission until the scheduler ran the job (never measurement); None where no
        scheduler says when (a local process, a Future): their wait is all start-up (`start_s`)."""
        return None if self.t_running is None else max(0.0, self.t_running - self.t_submit)

    @property
    def start_s(self) -> float | None:
        """Seconds from the job running (or, without a scheduler, its submission) until its trial began:
        its Python, imports, unpickling the workload."""
        if self.t_start is None:
            return None
        return max(0.0, self.t_start - (self.t_running if self.t_running is not None else self.t_submit))

    def info(self) -> dict[str, Any]:
        """What the trial records about its job (`extra["job"]`)."""
        d: dict[str, Any] = {"id": self.job_id, "executor": type(self.job).__name__, "queue_s": self.queue_s,
                             "start_s": self.start_s}
        if getattr(self.job, "held_info", None):  # a held task: its number in its worker, workloads unpickled
            d["held"] = dict(self.job.held_info)
        if self.sched is not None and self.sched.node:
            d["node"] = self.sched.node
        if self.host:
            d.setdefault("node", self.host)
        return d

    def finished(self) -> bool:
        """Whether the job's result is there to read (without asking the scheduler for it). Once the
        scheduler said the job ended, the folder's listing is asked too, once per ASK_EVERY_S (`listed`)."""
        paths = getattr(self.job, "paths", None)
        if paths is not None and is_slurm(self.job):
            result = Path(paths.result_pickle)
            if self.ended_at is None or time.monotonic() - self.listed_at < ASK_EVERY_S:
                return result.exists()
            self.listed_at = time.monotonic()
            return listed(result)
        return bool(self.job.done())

    def read_progress(self) -> dict[str, Any] | None:
        try:
            snap = json.loads(self.progress_file.read_text())
        except (OSError, ValueError):
            return None
        if isinstance(snap, list) and len(snap) == 3:  # a job of an earlier version wrote [phase, done, total]
            snap = {"phase": snap[0], "done": snap[1], "total": snap[2]}
        if not isinstance(snap, dict):
            return None
        if self.t_start is None:
            self.t_start = time.monotonic()
        self.host = snap.get("host", self.host)
        return snap

    def ask(self, now: float) -> SchedulerState | None:
        """The scheduler's state (SLURM: at most once per ASK_EVERY_S); None for other executors."""
        own = getattr(self.job, "scheduler_state", None)
        if not is_slurm(self.job) and not callable(own):
            return None
        if self.sched is None or now - self.asked_at >= ASK_EVERY_S:  # BOARD batches and spaces the queries
            self.sched = own() if callable(own) else BOARD.state(self.job_id)
            self.asked_at = now
            if self.t_running is None and self.sched.state in ("RUNNING", "COMPLETING", "COMPLETED"):
                self.t_running = now
        return self.sched

    def phase(self, snap: dict[str, Any] | None, sched: SchedulerState | None) -> str:
        """The progress phase to show: the scheduler's wait (with its reason), else the job's own phase."""
        if sched is not None and not sched.answered and self.silent_since is not None:
            return (f"the scheduler does not answer ({time.monotonic() - self.silent_since:.0f} s): still watching "
                    f"job {self.job_id}")
        if snap is not None:
            return str(snap.get("phase", "running"))
        if sched is not None and sched.state == "PENDING":
            return f"pending ({sched.reason})" if sched.reason else "pending"
        if sched is not None and sched.state in ("RUNNING", "CONFIGURING"):
            return f"starting on {sched.node}" if sched.node else "starting"
        return f"submitted (job {self.job_id})" if self.job_id else "submitted"

    def check_alive(self, sched: SchedulerState | None, now: float) -> None:
        """JobFailed when the scheduler says the job ended (or forgot it) and no result came within
        `result_grace_s()`: its state and reason become the trial's status and message. A job the scheduler
        says was killed (slurmstepd's "CANCELLED AT" in its stderr while it is COMPLETING) ends at once.
        Any answer that the job lives resets the grace; a scheduler that does not answer never loses
        the job: the watch goes on (UNANSWERED_S at most, then the job is left as it is, saying so)."""
        if sched is None:
            return
        if not sched.answered:
            self.silent_since = self.silent_since if self.silent_since is not None else now
            if now - self.silent_since >= UNANSWERED_S:
                raise JobFailed("error", f"the scheduler has not answered for {now - self.silent_since:.0f} s: job "
                                f"{self.job_id} is left as it is (it may still run; scancel {self.job_id} to end it)")
            return
        self.silent_since = None
        killed = self.killed() if sched.state == "COMPLETING" else None
        if killed is None and sched.known and sched.state not in TERMINAL:
            self.ended_at = None  # the scheduler says it lives: any earlier grace is over
            return
        if killed is not None:
            sched = SchedulerState(killed, sched.reason, sched.node)
        if self.ended_at is None:
            self.ended_at = now
        grace = result_grace_s() if sched.state in ("COMPLETED", "") else 2.0
        if killed is None and now - self.ended_at < grace:
            return
        folder = getattr(getattr(self.job, "paths", None), "folder", "its folder")
        waited = (f" within {grace:g} s of its end (a network filesystem can show it later: raise {GRACE_ENV}, "
                  "in seconds)")
        if not sched.known:
            raise JobFailed("error", f"job {self.job_id} is lost: the scheduler no longer knows it and it left no "
                                     f"result in {folder}{waited}")
        why = WHY.get(sched.state, f"ended in state {sched.state}")
        where = f" on {sched.node}" if sched.node else ""
        reason = f" (reason: {sched.reason})" if sched.reason else ""
        seen = f": none appeared in {folder}{waited}" if sched.state == "COMPLETED" else ""
        raise JobFailed(TERMINAL[sched.state], f"job {self.job_id}{where} {why}{reason}{seen}")

    def killed(self) -> str | None:
        """The end state slurmstepd wrote into the job's stderr when it killed it (CANCELLED, TIMEOUT,
        PREEMPTED, NODE_FAIL), else None: SLURM says COMPLETING until the job's processes are gone,
        which can take its KillWait (30 s), while the kill itself is already written there."""
        paths = getattr(self.job, "paths", None)
        try:
            with open(paths.stderr, "rb") as f:  # type: ignore[union-attr]
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 4096))
                tail = f.read().decode(errors="replace")
        except (OSError, AttributeError):
            return None
        if f"*** JOB {self.job_id} ON" not in tail or " CANCELLED AT " not in tail:
            return None
        return next((state for words, state in KILLED.items() if f"DUE TO {words}" in tail), "CANCELLED")


def watch(job: Any, w: Watch, progress: TrialProgress, cancel: threading.Event | None,
          on_queue: Callable[[float], None] | None = None, queue_counts: bool = True,
          on_running: Callable[[], None] | None = None, halt: threading.Event | None = None,
          beat: Callable[[], None] | None = None) -> Any:
    """Wait for `job`'s value, showing its state in `progress`; JobFailed when it ends without one
    (cancelled by `cancel`, a fault, the scheduler's reason). Ctrl-C cancels the job, then propagates.
    `on_running()` is called once the scheduler runs the job (or it wrote progress), `on_queue(seconds)`
    once the job started (its queue time). A budget's deadline (an event carrying its QueueWaits, whose
    `expired` is true) that expires while the job still waits in the queue does not cancel it unless
    `queue_counts`: `on_queue` moves that deadline on by the wait. Any other set (Stop, Ctrl-C) cancels,
    as does `halt` (Ctrl-C in tune(parallel=N)'s main thread: Jobs.cancel_all). `beat()` is called at
    every look (the registry's heartbeat, jobs.py)."""
    reported = ran = False
    board = is_slurm(job) and bool(w.job_id)
    if board:
        BOARD.add(w.job_id)
    try:
        while True:
            now = time.monotonic()
            if w.finished():
                break
            if beat is not None:
                beat()
            snap = w.read_progress()
            sched = w.ask(now)
            progress.set(w.phase(snap, sched), int((snap or {}).get("done", 0)), int((snap or {}).get("total", 0)))
            if not ran and (snap is not None or w.t_running is not None or not has_scheduler(job)):
                ran = True
                if w.t_running is None and has_scheduler(job):  # progress before squeue said RUNNING
                    w.t_running = now
                if on_running is not None:
                    on_running()
                if on_queue is not None:
                    reported = True
                    on_queue(w.queue_s or 0.0)  # a deadline moves on by the queue's wait only
            waiting_deadline = (not queue_counts and not ran and waits_of(cancel) is not None
                                and bool(getattr(cancel, "expired", False)))
            if halt is not None and halt.is_set():
                raise JobFailed("interrupted", f"interrupted by the user: job {w.job_id} {stop_job(job)}"
                                .replace("job  ", "the job "))
            if cancel is not None and cancel.is_set() and not waiting_deadline:
                why = getattr(cancel, "reason", "") or "stopped by the user"
                raise JobFailed("interrupted", f"{why}: job {w.job_id} {stop_job(job)}".replace("job  ", "the job "))
            w.check_alive(sched, now)
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        w.stopped = stop_job(job)
        raise
    finally:
        if board:
            BOARD.remove(w.job_id)
    w.read_progress()
    if not reported and on_queue is not None:
        on_queue(w.queue_s or 0.0)
    try:
        return job.result()
    except Exception as e:  # the job's own exception, or submitit's UncompletedJobError
        if halt is not None and halt.is_set():  # it ended as we cancelled it: the user's stop, not a fault
            raise JobFailed("interrupted", f"interrupted by the user: job {w.job_id} cancelled") from e
        if cancel is not None and cancel.is_set():
            why = getattr(cancel, "reason", "") or "stopped by the user"
            raise JobFailed("interrupted", f"{why}: job {w.job_id} cancelled") from e
        raise JobFailed("error", job_error(w.job_id, e)) from e


def job_error(job_id: str, e: BaseException) -> str:
    """A job's failure in one line (its first line, and its last error line when they differ), with the
    fix when the node could not load the workload or the job hit its time limit."""
    text = str(e)
    if "ModuleNotFoundError" in text or "No module named" in text:
        return (f"job {job_id} could not load the workload on its node ({_last_line(text, 'No module named')}): the "
                "node must see the same Python environment and your modules (a shared filesystem; docs/cluster.md)")
    if "timed-out" in text or "TIMEOUT" in text:
        return (f"job {job_id} hit its time limit (submitit signals the job 90 s before timeout_min): raise the "
                "executor's timeout_min")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    head = lines[0] if lines else type(e).__name__
    last = _last_line(text, "Error")
    detail = head if last in ("", head) else f"{head} … {last}"
    return f"job {job_id} ended without a result: {detail}".replace("job  ended", "the job ended")


def _last_line(text: str, word: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    hits = [ln for ln in lines if word in ln]
    return (hits or lines or [""])[-1][:300]


def stop_job(job: Any) -> str:
    """Cancel `job` (scancel for SLURM, SIGINT for submitit's local executor), never raising; what
    happened, in words for the trial's message ("cancelled", or why the cancel may not have taken)."""
    if left_behind_local(job):
        return stop_local(job)
    try:
        if is_slurm(job):
            job.cancel(check=False)
            return "cancelled (scancel sent)"
        done = job.cancel()
    except Exception as e:  # an already finished job, or a scheduler that is gone
        jid = job_id_of(job)
        return (f"not cancelled: the cancel failed ({type(e).__name__}: {str(e).strip()[:200]}); it may still "
                f"run{f': scancel {jid}' if jid else ''}")
    if done is False and not job.done():  # a concurrent.futures Future that already runs cannot be cancelled
        return "not cancelled: its executor cannot stop a running job; it runs to its end, and its result is dropped"
    try:
        ended = bool(job.done())
    except Exception:  # a job that cannot say
        ended = False
    if not ended:
        return "cancelled"
    in_process = getattr(job, "proc", None) is not None or type(job).__name__ == "LocalJob"  # FreshJob, submitit local
    return "cancelled (its process was ended)" if in_process else ENDED


def left_behind_local(job: Any) -> bool:
    """Whether `job` is a submitit LocalJob without its process handle: rebuilt from its folder and id by
    another kernel than the one that started it (its `cancel()` then signals nothing)."""
    return type(job).__name__ == "LocalJob" and getattr(job, "_process", False) is None


def stop_local(job: Any, submitted_at: float | None = None) -> str:
    """End a left-behind submitit LocalJob by its pid, never raising; what happened, in words. Its id is
    the pid of submitit's controller (`python -m submitit.local._local FOLDER`, which runs the task as its
    child): SIGINT to it (it then stops its task), SIGKILL to whatever of them is left after
    CANCEL_WAIT_S. A pid that is not this job's controller (reused, or started after `submitted_at`, a
    wall-clock time) is never signalled."""
    import signal

    import psutil

    pid = job_id_of(job)
    try:
        top = psutil.Process(int(pid))
        tree = [top, *top.children(recursive=True)]
        controller = next((p for p in tree if "submitit.local._local" in p.cmdline()), None)
        if controller is None or _gone(top):
            return ENDED if _gone(top) else (
                f"not cancelled: process {pid} is not its submitit job any more (the pid was reused)")
        args = controller.cmdline()
        folder = args[args.index("submitit.local._local") + 1] if args[-1] != "submitit.local._local" else ""
        if not _same_folder(folder, pid, job) or (submitted_at is not None and top.create_time() > submitted_at + 1):
            return f"not cancelled: process {pid} is not its submitit job any more (the pid was reused)"
        controller.send_signal(signal.SIGINT)  # submitit's own cancel: the controller interrupts its task
        alive = _wait_gone(tree, CANCEL_WAIT_S)
        for p in alive:
            p.kill()
        alive = _wait_gone(alive, 2.0)
    except (ValueError, psutil.NoSuchProcess):
        return ENDED
    except psutil.Error as e:  # another user's process, or one psutil cannot read
        return f"not cancelled: its process {pid} could not be stopped ({type(e).__name__}); kill {pid} to end it"
    if alive:
        return f"not cancelled: its processes {', '.join(str(p.pid) for p in alive)} still run after SIGKILL"
    return "cancelled (its process was ended)"


def _same_folder(folder: str, job_id: str, job: Any) -> bool:
    """Whether a controller's FOLDER argument (submitit's pattern, `%j` the job id) is `job`'s folder."""
    try:
        from submitit.core.utils import JobPaths

        return Path(JobPaths(folder, job_id).folder).resolve() == Path(job.paths.folder).resolve()
    except Exception:  # no submitit, or a folder it cannot format
        return False


def _gone(p: Any) -> bool:
    """Whether process `p` has ended (a zombie, killed and not yet reaped, runs nothing)."""
    import psutil

    try:
        return not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_gone(procs: list[Any], timeout: float) -> list[Any]:
    """The processes of `procs` still running after up to `timeout` seconds (children are reaped)."""
    import psutil

    psutil.wait_procs(procs, timeout=0)  # reaps those that are this process's children
    end = time.monotonic() + timeout
    alive = [p for p in procs if not _gone(p)]
    while alive and time.monotonic() < end:
        time.sleep(0.05)
        psutil.wait_procs(alive, timeout=0)
        alive = [p for p in alive if not _gone(p)]
    return alive


def failed_trial(knobs: Any, status: str, message: str, w: Watch, started: str, where: str = "process") -> TrialResult:
    """The trial of a job that ended without a result (`where`: the stage, "process" as for the seam)."""
    return TrialResult(knobs=knobs, status=status, message=message, started_at=started, where=where,
                       env={"host": w.host} if w.host else {}, extra={"job": w.info()})

