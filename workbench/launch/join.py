"""Run a trial inside a job someone else launched (torchrun, any number of nodes).

Every rank calls `run_joined`; the process group comes from torchrun's environment (`env://`:
RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK). Every rank runs `worker.rank_trial`;
rank 0 gathers the reports and returns the assembled TrialResult, the other ranks return a
one-line result of their own. A rank that fails returns its failure and the caller exits non-zero,
so torchrun's agent ends the job (ranks still waiting in a collective fail after the timeout).
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

from ..core.knobs import Knobs, device_notes
from ..core.measure import TrialResult, environment, now_iso
from ..core.workload import Workload
from .result import assemble, failed_result, forwarded_result
from .worker import rank_device, rank_trial


def in_launched_job() -> bool:
    """True when this process is one rank of a torchrun job (its environment names the rank)."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def job_world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def run_joined(workload: Workload, knobs: Knobs, *, warmup_steps: int, steps: int, measure_memory: bool = True,
               loader_timeout_s: float = 120.0, collective_timeout_s: float = 120.0) -> TrialResult:
    """This rank's part of the trial; on rank 0 the whole job's TrialResult."""
    ws = job_world_size()
    if knobs.world_size != ws:
        raise ValueError(f"knobs.world_size={knobs.world_size} but this torchrun job has WORLD_SIZE={ws}: "
                         "leave world_size unset (the CLI takes it from the job) or launch that many ranks")
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    backend = "nccl" if workload.device.type == "cuda" else "gloo"
    started = now_iso()
    owned = not dist.is_initialized()  # a group this call makes, this call ends
    if owned:
        if workload.device.type == "cuda":
            torch.cuda.set_device(local_rank)
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=collective_timeout_s))
    device = rank_device(workload, local_rank)
    notes = device_notes(knobs, device.type, has_conv=workload.has_conv, token_data=workload.token_data)
    env = {**environment(device), "world_size": ws, "backend": backend,
           "nodes": int(os.environ.get("GROUP_WORLD_SIZE", os.environ.get("NNODES", "1")) or 1)}
    report = rank_trial(workload, knobs, rank=rank, world_size=ws, local_rank=local_rank, warmup_steps=warmup_steps,
                        steps=steps, measure_memory=measure_memory, loader_timeout_s=loader_timeout_s)
    if report["status"] != "ok":
        return failed_result(knobs, report["status"], report["message"], report.get("where", ""),
                             report.get("traceback", ""), env=env, started=started, notes=notes)
    gathered: list | None = [None] * ws if rank == 0 else None
    dist.gather_object(report, gathered, dst=0)
    dist.barrier()
    if owned:
        # Every rank closes its group before returning, as forked ranks do. Left open, the group is torn
        # down by the interpreter's exit while the peer may still be talking to it; a gloo transport
        # thread that meets a closed connection there can abort its process (SIGABRT, and torchrun then
        # SIGTERMs the other rank): the signature of the fsdp2 dry run's failure on a busy CI machine.
        dist.destroy_process_group()
    if rank != 0:
        return forwarded_result(knobs, rank, ws, env=env, started=started, notes=notes)
    reports = {rep["rank"]: rep for rep in gathered}  # type: ignore[union-attr]
    return assemble(reports, knobs, env=env, started=started, notes=notes, backend=backend)
