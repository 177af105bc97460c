"""One rank of a distributed trial: the same BatchSource + TrainStep + runner phases as a
single-process trial, with the model wrapped by a Strategy (DDP or FSDP2) and a DistributedSampler.

Each rank measures itself and returns a plain-dict report; rank 0's launcher (or, under torchrun,
`gather`) assembles the reports into one TrialResult (see result.py). A rank never raises for a
failing trial: it reports the failure with its rank, stage and step, then exits non-zero so the
launcher ends the other ranks at once instead of leaving them in a collective.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import datetime
import faulthandler
import gc
import os
import signal
import statistics
import sys
import time
import traceback
from dataclasses import asdict
from typing import Any

import torch
import torch.distributed as dist

from ..core.knobs import Knobs, parallel_options, settings
from ..core.measure import StepClock, environment, model_state_bytes, sync
from ..core.phases import build, run_phases, sort_failure
from ..core.step import BatchSource, Stage, TrainStep, seeded
from ..core.workload import Workload
from .strategy import STRATEGIES

# Shared-memory slots per rank (ints), written by the rank, read by the launcher's poll loop.
SLOTS = 5  # stage name, phase, step within phase, progress phase, steps done
STAGE_NAMES = ("setup", "data", "model", "loss", "step_fn", "backward", "optimizer", "comm", "done")
PHASES = ("setup", "warm-up", "measured", "no-comm probe")
PROGRESS = ("idle", "loading data", "starting workers", "compiling", "warming up", "measuring", "done")
PROBE_STEPS = 5  # steps without gradient all-reduce, timed after the window (exposed-comm estimate)


def _code(names: tuple[str, ...], value: str) -> int:
    return names.index(value) if value in names else -1


class SharedStage(Stage):
    """A Stage that also writes where it is into shared memory, so the launcher can say where a
    rank was when it died or hung (a killed process reports nothing itself)."""

    def __init__(self, slots: Any, rank: int) -> None:
        object.__setattr__(self, "slots", slots)
        object.__setattr__(self, "base", rank * SLOTS)

    def __setattr__(self, key: str, value: Any) -> None:
        object.__setattr__(self, key, value)
        if self.slots is None:
            return
        if key == "name":
            self.slots[self.base] = _code(STAGE_NAMES, value)
        elif key == "phase":
            self.slots[self.base + 1] = _code(PHASES, value)
        elif key == "step":
            self.slots[self.base + 2] = value


class SharedProgress:
    """The TrialProgress interface (`set`) backed by shared memory (a rank's progress)."""

    def __init__(self, slots: Any, rank: int) -> None:
        self.slots, self.base = slots, rank * SLOTS

    def set(self, phase: str, done: int, total: int) -> None:
        if self.slots is not None:
            self.slots[self.base + 3] = _code(PROGRESS, phase)
            self.slots[self.base + 4] = done


def describe(slots: Any, rank: int) -> str:
    """'in backward at measured step 3': where a rank last said it was."""
    base = rank * SLOTS
    name = STAGE_NAMES[slots[base]] if 0 <= slots[base] < len(STAGE_NAMES) else "setup"
    phase = PHASES[slots[base + 1]] if 0 <= slots[base + 1] < len(PHASES) else "setup"
    from ..core.phases import WHERE

    where = WHERE.get(name, f"in {name}")
    when = "while setting up" if phase == "setup" else f"at {phase} step {slots[base + 2]}"
    return f"{where} {when}"


def rank_device(workload: Workload, local_rank: int) -> torch.device:
    """One GPU per process on CUDA (cuda:local_rank); every rank shares the CPU otherwise."""
    if workload.device.type == "cuda":
        return torch.device("cuda", local_rank)
    return workload.device


def rank_sampler(workload: Workload, world_size: int, rank: int, notes: list[str]) -> Any:
    """This rank's DistributedSampler over the dataset (None for an iterable dataset): each rank
    reads its own shard, and set_epoch at every loader restart (BatchSource) reshuffles alike."""
    if workload.spec.iterable:
        return None
    from torch.utils.data.distributed import DistributedSampler

    if workload.spec.sampler is not None:
        notes.append("the dataset's own sampler is replaced by a DistributedSampler")
    return DistributedSampler(workload.spec.dataset, num_replicas=world_size, rank=rank,
                              shuffle=workload.spec.shuffle, seed=workload.seed)


def no_comm_probe(step: TrainStep, source: BatchSource, wrapper: Any, stage: Any, n: int,
                  notes: list[str]) -> list[float]:
    """The same step `n` times with every all-reduce skipped (after the window): its median against
    the window's is the communication compute did not hide. A failure costs the estimate, with a note."""
    probe = StepClock(step.device)
    stage.name = "comm"
    dist.barrier()
    try:
        probe.mark()
        for i in range(n):
            stage.phase, stage.step = "no-comm probe", i + 1
            with wrapper.no_sync():
                step(source)
            probe.mark()
        sync(step.device)
        return probe.durations_s()
    except Exception as e:
        notes.append(f"the no-communication probe failed ({type(e).__name__}: {e}); "
                     "exposed_comm_share is unknown for this trial")
        return []


def rank_trial(workload: Workload, knobs: Knobs, *, rank: int, world_size: int, local_rank: int,
               warmup_steps: int, steps: int, measure_memory: bool, loader_timeout_s: float,
               slots: Any = None) -> dict[str, Any]:
    """Run this rank's part of the trial (the process group is already initialised); a report."""
    stage = SharedStage(slots, rank)
    progress = SharedProgress(slots, rank)
    report: dict[str, Any] = {"rank": rank, "status": "ok", "message": "", "where": "", "traceback": "",
                              "pid": os.getpid(), "notes": []}
    device = rank_device(workload, local_rank)
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(settings(knobs))
            stack.enter_context(seeded(workload.seed))  # every rank: same seed, same snapshot
            if device != workload.device:
                workload = copy.copy(workload)
                workload.device = device  # this rank's GPU (fresh_model copies the snapshot there)
            report["env"] = environment(device)
            sampler = rank_sampler(workload, world_size, rank, report["notes"])
            wrapper = STRATEGIES[knobs.strategy](workload.blocks)
            options = parallel_options(knobs)  # the strategy's options, from the knobs' hooks

            def wrap(model: Any, ctx: Any) -> Any:  # the strategy around the model copy, before optimizer/compile
                return wrapper.wrap(model, knobs, device, options)

            step, source = build(workload, knobs, stack, stage=stage, loader_timeout_s=loader_timeout_s, wrap=wrap,
                                 sampler=sampler)
            if knobs.accum_steps > 1 and (options.get("no_sync") or wrapper.name == "fsdp2"):
                step.no_sync = wrapper.no_sync  # TrainStep enters it on all but the last micro-batch
            counter = wrapper.counter
            cpu0 = [0.0]

            def together() -> None:  # every rank starts the window together, all-reduces counted from here
                stage.name = "comm"
                dist.barrier()
                counter.reset()
                cpu0[0] = time.process_time()

            def agree(done: bool) -> bool:  # warm-up ends on every rank at the same step, or on none
                flag = torch.tensor([1.0 if done else 0.0], device=device if dist.get_backend() == "nccl" else "cpu")
                dist.all_reduce(flag, op=dist.ReduceOp.MIN)
                return bool(flag.item())

            raw = run_phases(step, source, stage, progress, warmup_steps, steps, None,  # type: ignore[arg-type]
                             measure_memory=measure_memory, before_window=together, agree=agree)
            own_cores = (time.process_time() - cpu0[0]) / raw.wall_s
            comm = {"allreduce_calls": counter.calls, "allreduce_bytes": counter.bytes}
            raw.state_bytes = model_state_bytes(step.model, step.optimizer)  # this rank's local shards
            # FSDP2's all-gathers cannot be skipped, so its exposed communication is not probed
            probe_times = ([] if wrapper.name == "fsdp2" else
                           no_comm_probe(step, source, wrapper, stage, min(PROBE_STEPS, steps), report["notes"]))
            stage.name = "done"
            report.update(raw=asdict(raw), comm=comm, probe_times_s=probe_times, own_cores=own_cores,
                          notes=report["notes"] + source.notes + step.notes, threads=torch.get_num_threads())
    except Exception as e:  # a failing rank is a report, whatever raised
        status, message = sort_failure(e, stage, knobs)
        peer = _peer_failure(e)
        report.update(status=status, message=f"rank {rank}: " + message,
                      where=stage.name, traceback="".join(traceback.format_exception(e)), peer_failure=peer)
    report["median_step_s"] = (statistics.median(report["raw"]["step_times_s"])
                               if report.get("raw") and report["raw"]["step_times_s"] else None)
    return report


_PEER = ("Connection closed by peer", "Connection reset by peer", "Timed out", "timed out", "Broken pipe",
         "DistBackendError", "connection", "ECONNRESET")


def _peer_failure(e: BaseException) -> bool:
    """Did this rank fail because a peer died or hung (the error surfaced in a collective)?"""
    text = f"{type(e).__name__}: {e}"
    return isinstance(e, getattr(dist, "DistBackendError", ())) or any(t in text for t in _PEER)


def _die_with_parent() -> None:
    """Linux: the kernel sends SIGKILL to this process if the launcher thread dies (no orphans)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass


def forked_rank(rank: int, workload: Workload, knobs: Knobs, port: int, backend: str, timeout_s: float,
                queue: Any, slots: Any, run_args: dict[str, Any]) -> None:
    """Entry point of a forked rank (torch.multiprocessing.start_processes calls fn(rank, *args)).

    Forked, so it inherits the notebook's objects (lambdas, classes defined in cells) unpickled.
    """
    _die_with_parent()
    faulthandler.enable()  # a rank that aborts (SIGABRT/SIGSEGV) prints every thread's Python stack to stderr
    gc.freeze()  # the kernel's objects, inherited: keep the collector from walking (and copying) them
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the launcher's to handle: it stops every rank
    torch.set_num_threads(1)  # as torchrun: 1 intra-op thread per rank; cpu_threads' settings hook sets its own
    world_size = knobs.world_size
    try:
        if workload.device.type == "cuda":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
    except Exception as e:
        queue.put({"rank": rank, "status": "error", "where": "setup", "peer_failure": False,
                   "message": f"rank {rank}: could not join the process group ({type(e).__name__}: {e})",
                   "traceback": "".join(traceback.format_exception(e)), "pid": os.getpid()})
        os._exit(1)
    report = rank_trial(workload, knobs, rank=rank, world_size=world_size, local_rank=rank, slots=slots, **run_args)
    queue.put(report)  # synchronous: in the pipe before this returns
    if report["status"] == "ok":
        dist.destroy_process_group()
    # A forked child skips the parent's exit machinery (its atexit hooks, thread-pool joins): the
    # exit code alone tells the launcher, and a non-zero one makes it end the other ranks now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if report["status"] == "ok" else 1)
