"""Launch a distributed trial from this process (a notebook kernel, a script): N forked ranks on
this machine, each running `worker.rank_trial`, watched until all report or one fails.

Why fork: the ranks must run a model, dataset, loss and optimizer defined in notebook cells,
which spawn cannot import and pickle cannot carry (lambdas, classes from `__main__`). A forked
child inherits them as they are, the way Accelerate's `notebook_launcher` does. Fork is unsafe
once CUDA is initialised in the parent, so that case is refused with the fix (torchrun).

PyTorch's own pieces do the work: `torch.multiprocessing.start_processes(start_method="fork")`
starts and reaps the ranks (a rank exiting non-zero makes `join` end the others), and
`init_process_group(timeout=...)` bounds every collective, so a hung or killed peer becomes an
error on the ranks waiting for it.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import signal
import socket
import threading
import time
import warnings
from typing import Any

import torch
from torch.multiprocessing.spawn import ProcessException

from ..core import compat
from ..core.knobs import Knobs, device_notes, traits
from ..core.measure import TrialResult, environment, now_iso
from ..core.progress import TrialProgress
from ..core.workload import Workload
from .result import assemble, failed_result
from .worker import PROGRESS, SLOTS, describe, forked_rank

HANG_GRACE_S = 30.0  # beyond the collective timeout, a launcher-side watchdog for ranks that never reach one
COMPILE_GRACE_S = 600.0  # more for torch.compile: a cold compile changes no stage for minutes
POLL_S = 0.05


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the rendezvous of this trial's ranks)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_launch(workload: Workload, knobs: Knobs) -> None:
    """Refuse, with the fix, what cannot be launched from this process."""
    from .join import in_launched_job

    if knobs.world_size == 1 or in_launched_job():
        return
    if "fork" not in multiprocessing.get_all_start_methods():
        raise ValueError("world_size > 1 from a notebook needs the fork start method (Linux, macOS); on this "
                         "platform launch with torchrun: torchrun --nproc-per-node=N -m workbench run --model ...")
    if workload.spec.iterable:
        raise ValueError("world_size > 1 shards the dataset with a DistributedSampler, which needs a map-style "
                         "dataset (with __len__): pass one, or shard your IterableDataset by rank and use torchrun")
    dev = workload.device
    if dev.type == "cuda":
        if knobs.world_size > torch.cuda.device_count():
            raise ValueError(f"world_size={knobs.world_size} needs one GPU per process but "
                             f"{torch.cuda.device_count()} are visible: lower world_size")
        if torch.cuda.is_initialized():
            raise ValueError(
                "CUDA is already initialised in this process, and forked children cannot use it: run "
                "multi-GPU trials with torchrun (torchrun --nproc-per-node=N -m workbench run --model "
                "pkg.module:factory), or build the Workbench on device='cpu' to try DDP with gloo here")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"world_size > 1 runs on CUDA (NCCL) or CPU (gloo), not on {dev.type}: use device='cpu'")


_PREPARED = False


def _prepare_parent(strategy: str = "ddp") -> None:
    """Import in the parent, once, what every rank would otherwise import after the fork: DDP's
    first construction imports torch._dynamo, measured at 5-11 s per rank on a loaded 2-core CPU
    (FSDP2's package: 0.7 s more, only when a trial uses it)."""
    global _PREPARED
    if strategy == "fsdp2":
        import torch.distributed.fsdp
    if not _PREPARED:
        compat.preload_dynamo()
        import torch.distributed.algorithms.ddp_comm_hooks.default_hooks  # noqa: F401
        from torch.nn.parallel import DistributedDataParallel  # noqa: F401

        logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)  # "Terminating process …"
        _PREPARED = True


def run_distributed(workload: Workload, knobs: Knobs, *, warmup_steps: int, steps: int,
                    progress: TrialProgress, cancel: threading.Event | None, measure_memory: bool = True,
                    loader_timeout_s: float = 120.0, collective_timeout_s: float = 120.0) -> TrialResult:
    """Run one trial on `knobs.world_size` forked ranks; never raises for a failing trial.

    Raises ValueError (nothing started) when the launch is impossible here, and TrialInterrupted
    on a KeyboardInterrupt in this thread (after stopping every rank).
    """
    check_launch(workload, knobs)
    _prepare_parent(knobs.strategy)
    from ..core.phases import TrialInterrupted

    ws = knobs.world_size
    started = now_iso()
    notes = device_notes(knobs, workload.device.type, has_conv=workload.has_conv, token_data=workload.token_data)
    backend = "nccl" if workload.device.type == "cuda" else "gloo"
    total = warmup_steps + steps
    ctx = multiprocessing.get_context("fork")
    slots = ctx.Array("i", [0] * (SLOTS * ws), lock=False)  # ints written by each rank, read here
    queue = ctx.SimpleQueue()
    run_args = dict(warmup_steps=warmup_steps, steps=steps, measure_memory=measure_memory,
                    loader_timeout_s=loader_timeout_s)
    reports: dict[int, dict[str, Any]] = {}
    exits: dict[int, str] = {}
    outcome = "running"
    progress.set("starting ranks", 0, total)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # "use of fork() may lead to deadlocks"
        pctx = torch.multiprocessing.start_processes(
            forked_rank, args=(workload, knobs, free_port(), backend, collective_timeout_s, queue, slots, run_args),
            nprocs=ws, join=False, start_method="fork")
    procs = pctx.processes
    last_seen = (None, time.monotonic())
    patience = collective_timeout_s + HANG_GRACE_S + (COMPILE_GRACE_S if traits(knobs)["compiles"] else 0.0)
    try:
        while True:
            _drain(queue, reports)
            try:
                if pctx.join(timeout=POLL_S, grace_period=1.0):
                    outcome = "done"
                    break
            except ProcessException as e:  # a rank exited non-zero: the rest are ended
                exits[e.error_index] = exit_text(procs[e.error_index].exitcode)
                outcome = "failed"
                break
            if cancel is not None and cancel.is_set():
                outcome = "stopped"
                break
            phase_code, done = slots[3], slots[4]
            progress.set(PROGRESS[phase_code] if 0 < phase_code < len(PROGRESS) else "starting ranks", done, total)
            state = tuple(slots)
            if state != last_seen[0]:
                last_seen = (state, time.monotonic())
            elif time.monotonic() - last_seen[1] > patience:
                outcome = "hung"
                break
    except KeyboardInterrupt:
        outcome = "interrupted"
    finally:
        _drain(queue, reports)
        _end(procs)  # exit codes after this are ours (SIGTERM/SIGKILL): only the first failure's counts
        progress.set("done", total, total)
    env = {**environment(workload.device), "world_size": ws, "backend": backend}
    if outcome == "done" and len(reports) == ws and all(r["status"] == "ok" for r in reports.values()):
        return assemble(reports, knobs, env=env, started=started, notes=notes, backend=backend)
    if outcome in ("stopped", "interrupted"):
        who = "stopped by the user" if outcome == "stopped" else "interrupted by the user"
        result = failed_result(knobs, "interrupted", f"{who} {describe(slots, 0)} (all {ws} ranks ended)",
                               env=env, started=started, notes=notes)
        if outcome == "interrupted":
            raise TrialInterrupted(result) from None
        return result
    return failed_result(knobs, *_blame(reports, exits, slots, ws, outcome, patience),
                         env=env, started=started, notes=notes)


def _drain(queue: Any, reports: dict[int, dict[str, Any]]) -> None:
    while not queue.empty():
        try:
            rep = queue.get()
        except (EOFError, OSError):
            return
        reports[rep["rank"]] = rep


def _end(procs: list[Any]) -> list[int | None]:
    """SIGTERM every live rank, SIGKILL after 2 s, reap all (no orphans, no zombies); exit codes."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 2.0
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join()
    codes = [p.exitcode for p in procs]
    with contextlib.suppress(Exception):
        for p in procs:
            p.close()
    return codes


def exit_text(code: int | None) -> str:
    """How a process ended, for a message: "still running", "killed by SIGKILL", "exited with code 1"."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def _blame(reports: dict[int, dict[str, Any]], exits: dict[int, str], slots: Any, ws: int, outcome: str,
           patience_s: float) -> tuple[str, str, str, str]:
    """(status, message, where, traceback) of the root cause among the ranks' failures."""
    silent = sorted(r for r in range(ws) if r not in reports and exits.get(r, "").startswith("killed"))
    own = sorted(r for r, rep in reports.items() if rep["status"] != "ok" and not rep.get("peer_failure"))
    peers = sorted(r for r, rep in reports.items() if rep["status"] != "ok" and rep.get("peer_failure"))
    others = "; the other ranks were stopped"
    if silent:  # a rank that died without a word (kill -9, the OOM killer, a segfault)
        r = silent[0]
        sig = exits[r]
        hint = " (kill -9, or the kernel's OOM killer: check dmesg)" if sig.endswith("SIGKILL") else ""
        return "error", f"rank {r} was {sig}{hint} {describe(slots, r)}{others}", "rank", ""
    if own or peers:
        rep = reports[(own or peers)[0]]
        # ranks that neither finished nor reported were stuck somewhere: say where (the hung rank)
        stuck = [f"rank {r} was {describe(slots, r)}" for r in range(ws) if r not in reports]
        if not own and stuck:
            lead = "; ".join(stuck) + " and did not answer"
            return rep["status"], f"{lead} ({rep['message']}){others}", rep.get("where", ""), rep.get("traceback", "")
        return rep["status"], rep["message"] + others, rep.get("where", ""), rep.get("traceback", "")
    if outcome == "hung":
        where = "; ".join(f"rank {r} {describe(slots, r)}" for r in range(ws))
        return ("error", f"no rank progressed for {patience_s:.0f} s (hung outside a collective?): "
                f"{where}; all ranks were stopped", "hang", "")
    lost = ", ".join(f"rank {r} {exits.get(r, 'ended')}" for r in range(ws) if r not in reports) or "no rank reported"
    return "error", f"the ranks ended without a result ({lost})", "launch", ""
