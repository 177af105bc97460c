"""`Jobs`: one Workbench's trials on an executor (cluster.py): submit, watch, record where they ran,
and re-attach the jobs a restarted kernel left behind.

A small registry lives in the private jobs folder beside the log (`<log>.jobs/`): one JSON file per job
in flight, written at submission and removed once its trial is recorded. Each entry names its owner
(host, pid, the process's start time) and its watcher touches it every BEAT_S. A new Workbench on the
same log reads it back, and takes only the entries whose owner is gone (its process ended, or, on
another host, no beat for LEASE_S): a job whose result is there is recorded, one the scheduler still
runs is watched again (its trial is recorded when it ends), and one that vanished becomes a failed
trial saying so. Another kernel's live jobs are left to it. Each entry keeps the fingerprint of the model
its job runs, so a trial recorded by a kernel restarted after an edit of the model is the old model's. A
submitit local job still running is stopped (watcher.stop_local): it cannot be watched from another
kernel, and it would train beside this kernel's trials.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..core.fingerprint import UNKNOWN, fingerprint
from ..core.knobs import Knobs
from ..core.measure import TrialResult, now_iso
from ..core.progress import TrialProgress
from ..core.workload import Workload
from .cluster import (
    JobFailed,
    SchedulerState,
    Watch,
    check_travels,
    failed_trial,
    here_on_node,
    is_slurm,
    job_call,
    job_id_of,
    new_progress_file,
    quiet_sacct,
    slurm_state,
    waits_of,
    watch,
)
from .folders import owned_private_folder, write_atomic
from .owners import owner, owner_alive
from .watcher import ENDED, has_scheduler, left_behind_local, result_grace_s, stop_local

BEAT_S = 10.0  # how often a watcher touches its registry entry (its owner's heartbeat)
ACTIVE = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED")


class Jobs:
    """Runs trials and interleaved comparisons of one workload as jobs on `executor`.

    `device` is what the user asked for ("auto" resolves on the node). `counts_queue`: whether time
    in the scheduler's queue counts against a budget_s (by default it does not: each job reports its
    wait to the budget's own account, the cluster.QueueWaits its Deadline gives, `waits_of`).
    """

    def __init__(self, executor: Any, log_path: Path | None, *, device: str | None, counts_queue: bool = False) -> None:
        self.executor = executor
        self.device = device
        self.counts_queue = counts_queue
        if log_path is not None:
            self.dir = owned_private_folder(log_path.parent / f"{log_path.stem}.jobs")
        else:
            self.dir = Path(tempfile.mkdtemp(prefix="workbench-jobs-"))  # mkdtemp makes it 0700
            weakref.finalize(self, shutil.rmtree, self.dir, ignore_errors=True)  # removed with this Jobs, or at exit
        self.travel_bytes: int | None = None
        self.queue_s = 0.0  # seconds this workbench's jobs waited in the queue
        self.in_flight: dict[str, Any] = {}  # registry file name -> job (tune(parallel=N) keeps several)
        self.halted = threading.Event()  # cancel_all: every watcher cancels its job and ends its trial
        result_grace_s()  # a bad WORKBENCH_RESULT_GRACE_S is said now, not when a job ends
        quiet_sacct()

    def travels(self, workload: Workload) -> int:
        """The workload's pickled size, checked once (ValueError naming what cannot travel)."""
        if self.travel_bytes is None:
            self.travel_bytes = check_travels(workload)
        return self.travel_bytes

    # ---- trials ----------------------------------------------------------------------------
    def run_trial(self, workload: Workload, knobs: Knobs, *, progress: TrialProgress | None = None,
                  cancel: threading.Event | None = None, **run_kwargs: Any) -> TrialResult:
        """runner.run_trial's signature, run as a job through the seam's own job entry (remote.trial_job:
        the same phases, the process mode checked, the result as a record) on the node's device: the
        trial (with its node's environment and `extra["job"]`), or a failed trial with the scheduler's
        reason. Ctrl-C cancels the job and raises TrialInterrupted with the interrupted trial."""
        from ..core.knobs import context, process_env
        from .remote import by_value, executor_for, received, trial_job
        from .runner import TrialInterrupted

        self.travels(workload)
        progress = progress if progress is not None else TrialProgress()
        started = now_iso()
        pf = new_progress_file(self.dir)
        w = Watch(None, pf, time.monotonic())
        ex = executor_for(self.executor, process_env(knobs, context(knobs, workload.device)))
        payload = {"workload": workload, "knobs": knobs, "run": run_kwargs, "progress_path": str(pf),
                   "here": functools.partial(here_on_node, device=self.device)}
        progress.set("submitting", 0, 0)
        try:
            with by_value(workload):
                w.job = ex.submit(trial_job, payload)
        except Exception as e:  # cannot start, cannot pickle, sbatch refused: this trial fails, nothing else
            pf.unlink(missing_ok=True)
            return failed_trial(knobs, "error", f"the trial's process could not start ({type(ex).__name__}): "
                                f"{type(e).__name__}: {str(e).strip()[:500]}", w, started, where="process")
        entry = self._register(w, "trial", knobs, started, workload)
        account = self._account(cancel, w)
        try:
            out = watch(w.job, w, progress, cancel, on_queue=lambda q: self._queued(q, cancel),
                        queue_counts=self.counts_queue, on_running=account.running, halt=self.halted,
                        beat=self.beat(entry))
            r = received(out, knobs, type(ex).__name__, w.job_id or None)
        except JobFailed as e:
            r = failed_trial(knobs, e.status, e.message, w, started)
        except KeyboardInterrupt:
            r = failed_trial(knobs, "interrupted", f"interrupted by the user: job {w.job_id} "
                             f"{w.stopped or 'cancelled'}", w, started)
            self._forget(entry, pf)
            raise TrialInterrupted(r) from None
        except Exception as e:  # a job that returned something that is not a trial record
            r = failed_trial(knobs, "error", f"job {w.job_id} returned no trial: {type(e).__name__}: {e}", w, started)
        finally:
            account.ended()
        self._forget(entry, pf)
        r.extra["job"] = w.info()
        progress.set(r.status if not r.ok else "done", progress.done, progress.total)
        return r

    def call(self, fn: Callable[..., Any], workload: Workload, *args: Any, **kwargs: Any) -> Any:
        """`fn(workload, *args, **kwargs)` (an analysis, runner.trial_threaded) inside a job on the node;
        RuntimeError with the scheduler's reason when the job ends without a value."""
        try:
            return self.call_where(fn, workload, *args, **kwargs)[0]
        except JobFailed as e:
            raise RuntimeError(f"{getattr(fn, '__name__', 'analysis')}: {e.message}") from None

    def call_where(self, fn: Callable[..., Any], workload: Workload, *args: Any, cancel: threading.Event | None = None,
                   **kwargs: Any) -> tuple[Any, dict[str, Any], dict[str, Any]]:
        """`fn(workload, *args, **kwargs)` inside one job: (its value, the node's environment, the job's
        record). JobFailed (status, the scheduler's reason) when the job ends without one or `cancel` is set."""
        self.travels(workload)
        pf = new_progress_file(self.dir)
        w = Watch(None, pf, time.monotonic())
        from .remote import by_value

        with by_value(workload):
            w.job = self.executor.submit(job_call, fn, workload, self.device, args, kwargs, str(pf))
        entry = self._register(w, "call", Knobs(), now_iso(), workload)
        account = self._account(cancel, w)
        try:
            value, env = watch(w.job, w, TrialProgress(), cancel, on_queue=lambda q: self._queued(q, cancel),
                               queue_counts=self.counts_queue, on_running=account.running, halt=self.halted,
                               beat=self.beat(entry))
        finally:
            account.ended()
            self._forget(entry, pf)
        return value, env, w.info()

    def _account(self, cancel: threading.Event | None, w: Watch) -> _Waits:
        """The job's waiting/running/ended reports to its budget's queue account (the budget's explicit
        cluster.QueueWaits, `waits_of(cancel)`; none when the queue counts or no budget runs the trial)."""
        waits = None if self.counts_queue else waits_of(cancel)
        return _Waits(waits.account if waits is not None else None, w)

    def _queued(self, seconds: float, cancel: threading.Event | None) -> None:
        """A job left the queue after `seconds`: counted apart; a budget's deadline moves on by as much
        (its QueueWaits) unless the queue counts."""
        self.queue_s += seconds
        waits = None if self.counts_queue else waits_of(cancel)
        if waits is not None:
            waits.queued(seconds)

    # ---- the registry (re-attach after a restart) --------------------------------------------
    def _register(self, w: Watch, kind: str, knobs: Knobs, started: str, workload: Workload) -> Path:
        """The job's registry entry: what a restarted kernel needs to record its trial as the trial it was
        (its knobs, and the fingerprint of the model it runs, which the notebook may edit meanwhile)."""
        paths = getattr(w.job, "paths", None)
        entry = {"kind": kind, "job_id": w.job_id, "executor": type(w.job).__name__,
                 "folder": str(paths.folder) if paths is not None else None, "knobs": knobs.to_dict(),
                 "model": fingerprint(workload.pristine), "started_at": started, "submitted_at": time.time(),
                 "progress_file": str(w.progress_file), "owner": owner()}
        path = self.dir / f"job-{w.job_id or w.progress_file.stem}.json"
        _write(path, entry)
        self.in_flight[path.name] = w.job
        return path

    def beat(self, entry: Path) -> Callable[[], None]:
        """The watcher's heartbeat for `entry`: touch it every BEAT_S (another host reads its owner alive)."""
        last = [time.monotonic()]

        def touch() -> None:
            if time.monotonic() - last[0] >= BEAT_S:
                last[0] = time.monotonic()
                with contextlib.suppress(OSError):
                    os.utime(entry)

        return touch

    def _forget(self, entry: Path, progress_file: Path) -> None:
        self.in_flight.pop(entry.name, None)
        for p in (entry, progress_file):
            p.unlink(missing_ok=True)

    def left_behind(self) -> list[dict[str, Any]]:
        """The registry's entries whose owner is gone (an earlier kernel): this one's own jobs and those
        of another live kernel on the same folder are left to their watchers."""
        out = []
        for p in sorted(self.dir.glob("job-*.json")):
            if p.name in self.in_flight:
                continue
            try:
                entry = json.loads(p.read_text())
                if owner_alive(entry.get("owner"), p.stat().st_mtime):
                    continue
            except (OSError, ValueError):
                continue
            entry["_path"] = str(p)
            out.append(entry)
        return out

    def reattach(self, record: Callable[[TrialResult], TrialResult], lock: threading.Lock) -> list[str]:
        """Pick up the trials of jobs an earlier kernel left in flight: record the finished ones, watch the
        running ones on a daemon thread (recording each when it ends, under `lock`), stop the local ones
        still running ('stopped'), and record the vanished ones as failed ('lost'). Each is recorded as the
        model its job ran (`_settle`). Returns one line per job, for a note."""
        lines = []
        for entry in self.left_behind():
            if entry.get("kind") != "trial":  # an interleaved comparison's job: its caller is gone
                _cancel_entry(entry)
                Path(entry["_path"]).unlink(missing_ok=True)
                continue
            why = f"a {entry.get('executor')} job cannot be re-attached after a restart"
            try:
                job = _rebuild(entry)
            except ValueError as e:  # its folder is not this user's all the way down: its pickles are not loaded
                job, why = None, str(e)
            knobs = Knobs.from_dict(entry.get("knobs") or {}, keep_unknown=True)
            w = Watch(job, Path(entry.get("progress_file") or self.dir / "none.json"), time.monotonic())
            if job is None:
                r = failed_trial(knobs, "error", f"job {entry.get('job_id')} is lost: {why}", w,
                                 entry.get("started_at", ""))
                self._settle(entry, r, record, lock)
                lines.append(f"job {entry.get('job_id')}: lost")
                continue
            done = Path(job.paths.result_pickle).exists()
            said = stop_local(job, entry.get("submitted_at")) if not done and left_behind_local(job) else ENDED
            if said != ENDED:  # a local job that still ran: stopped, never left training beside this kernel's
                self._settle(entry, self._stopped_local(entry, said, w, knobs), record, lock)
                lines.append(f"job {w.job_id}: stopped")
                continue
            done = done or Path(job.paths.result_pickle).exists()
            sched = slurm_state(w.job_id) if is_slurm(job) and not done else SchedulerState(known=False)
            if not done and sched.known and sched.state in ACTIVE:
                _write(Path(entry["_path"]), {**{k: v for k, v in entry.items() if k != "_path"}, "owner": owner()})
                threading.Thread(target=self._rewatch, args=(entry, w, knobs, record, lock), daemon=True,
                                 name=f"workbench-job-{w.job_id}").start()
                lines.append(f"job {w.job_id}: re-attached ({sched.state.lower()})")
                continue
            if done:
                self._rewatch(entry, w, knobs, record, lock)
                lines.append(f"job {w.job_id}: recorded")
                continue
            state = (f"the scheduler says {sched.state}" if sched.known else "its process has ended"
                     if left_behind_local(job) else "the scheduler no longer knows it")
            r = failed_trial(knobs, "error", f"job {w.job_id} is lost: it was in flight when an earlier kernel stopped, "
                             f"{state}, and it left no result in {job.paths.folder}", w, entry.get("started_at", ""))
            r.extra["job"] = {**w.info(), "reattached": True}
            self._settle(entry, r, record, lock)
            lines.append(f"job {w.job_id}: lost")
        return lines

    @staticmethod
    def _stopped_local(entry: dict[str, Any], said: str, w: Watch, knobs: Knobs) -> TrialResult:
        """The trial of a left-behind submitit LocalJob that still ran: a local job cannot be watched from
        another kernel (its process is not this one's child), and left running it would train beside this
        kernel's trials, so it was stopped (`said`: watcher.stop_local's words); never evidence."""
        why = (f"job {w.job_id} was in flight when an earlier kernel stopped; a local job cannot be watched from "
               f"another kernel, and left running it would train beside this kernel's trials: {said}")
        r = failed_trial(knobs, "interrupted" if said.startswith("cancelled") else "error", why, w,
                         entry.get("started_at", ""))
        r.extra["job"] = {**w.info(), "reattached": True}
        return r

    def _rewatch(self, entry: dict[str, Any], w: Watch, knobs: Knobs, record: Callable[[TrialResult], TrialResult],
                 lock: threading.Lock) -> None:
        started = entry.get("started_at", "")
        try:
            out = watch(w.job, w, TrialProgress(), None, beat=self.beat(Path(entry["_path"])))
            r = _trial_of(out, knobs, w)
        except JobFailed as e:
            lost = "lost" in e.message or "without a result" in e.message
            msg = (f"{e.message} (it was in flight when an earlier kernel stopped)" if lost else e.message)
            r = failed_trial(knobs, e.status, msg, w, started)
        if not isinstance(r, TrialResult):
            r = failed_trial(knobs, "error", f"job {w.job_id} returned {type(r).__name__}", w, started)
        r.extra["job"] = {**w.info(), "reattached": True}
        self._settle(entry, r, record, lock)

    @staticmethod
    def _settle(entry: dict[str, Any], r: TrialResult, record: Callable[[TrialResult], TrialResult],
                lock: threading.Lock) -> None:
        """Record a left-behind job's trial as the model it ran (UNKNOWN when its entry does not say: never
        the current model's, so never compared with its trials nor its baseline), then forget the job."""
        model = entry.get("model")
        r.extra["model"] = model if isinstance(model, str) and model else UNKNOWN
        with lock:
            record(r)
        Path(entry["_path"]).unlink(missing_ok=True)
        if entry.get("progress_file"):
            Path(entry["progress_file"]).unlink(missing_ok=True)

    def cancel_all(self) -> None:
        """Cancel every job this workbench has in flight and end their trials at once (Ctrl-C during
        tune(parallel=N)): each watcher sees `halted`, cancels its job and records the trial as
        interrupted. `resume()` lets later trials run."""
        from .cluster import stop_job

        self.halted.set()
        for job in list(self.in_flight.values()):
            stop_job(job)
        close = getattr(self.executor, "close", None)  # a held executor's idle workers end too (held.py)
        if callable(close):
            close()

    def resume(self) -> None:
        """Trials may run again after `cancel_all` (its watchers have ended)."""
        self.halted.clear()


class _Waits:
    """One job's reports to a budget's QueueAccount: waiting from submission (a job without a
    scheduler runs at once: its wait is start-up), running once the scheduler runs it, ended."""

    def __init__(self, account: Any, w: Watch) -> None:
        self.account, self.key = account, object()
        if account is not None:
            account.waiting(self.key)
            if not has_scheduler(w.job):
                account.running(self.key)

    def running(self) -> None:
        if self.account is not None:
            self.account.running(self.key)

    def ended(self) -> None:
        if self.account is not None:
            self.account.ended(self.key)


def _write(path: Path, entry: dict[str, Any]) -> None:
    write_atomic(path, json.dumps(entry).encode())


def _trial_of(out: Any, knobs: Knobs, w: Watch) -> Any:
    """The TrialResult of a job's value: the seam's record (remote.trial_job), or a TrialResult as is."""
    if isinstance(out, dict) and "record" in out:
        from .remote import received

        return received(out, knobs, w.info()["executor"], w.job_id or None)
    return out


def _rebuild(entry: dict[str, Any]) -> Any:
    """A submitit job object for a registry entry (None for an executor that cannot be re-attached).
    ValueError when the entry's folder is not this user's all the way down: a registry is a file on disk,
    and the job object would load the result pickle from that folder."""
    kind, folder, jid = entry.get("executor"), entry.get("folder"), entry.get("job_id")
    if not folder or not jid or kind not in ("SlurmJob", "LocalJob"):
        return None
    owned_private_folder(folder)
    try:
        import submitit
    except ImportError:
        return None
    return (submitit.SlurmJob if kind == "SlurmJob" else submitit.LocalJob)(folder=folder, job_id=jid)


def _cancel_entry(entry: dict[str, Any]) -> None:
    try:
        job = _rebuild(entry)
    except ValueError:  # not this user's folder: nothing of it is loaded, nor cancelled
        return
    if job is not None and left_behind_local(job):
        stop_local(job, entry.get("submitted_at"))
    elif job is not None and job_id_of(job):
        from .cluster import stop_job

        stop_job(job)
