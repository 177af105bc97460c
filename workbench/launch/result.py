"""Per-rank reports -> one TrialResult, the way a reader of a distributed run needs it.

Throughput is global: all ranks' samples over the window's wall time (the slowest rank's), so
samples_per_s compares directly with a 1-process trial; `samples_per_step` is the global batch
(batch_size x world_size x accum_steps). A step's time is the slowest rank's: the gradient
all-reduce makes every rank wait for the last one anyway.

Communication that compute did not hide is measured, not modelled: after the window each rank
times a few steps with every all-reduce skipped (DDP's no_sync); without communication a step
would take as long as the slowest rank's compute, so

    exposed_comm_share = 1 - max over ranks(median no-comm step) / median step of the window.

On CPU (gloo) this includes the cores the reduction itself uses. Load imbalance is read from the
same no-comm steps (in the window the all-reduce equalises step times): the slowest rank and its
compute time against the fastest's.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from ..core.knobs import Knobs
from ..core.measure import TrialResult
from ..core.phases import RawTrial, derive


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _elementwise(lists: list[list[float]], fn: Any) -> list[float]:
    n = min((len(x) for x in lists), default=0)
    return [fn([x[i] for x in lists]) for i in range(n)]


def _merged(raws: list[RawTrial], siblings_cores: list[float]) -> RawTrial:
    """The ranks' raw figures as one: per step the slowest rank's times, the mean loss, the samples summed."""
    first = raws[0]
    return RawTrial(
        warmup_steps=first.warmup_steps, steps=first.steps,
        startup_s=max(r.startup_s for r in raws),
        warm_times_s=_elementwise([r.warm_times_s for r in raws], max),
        warmup_wall_s=max(r.warmup_wall_s for r in raws),
        probe_s=max(r.probe_s for r in raws),
        step_times_s=_elementwise([r.step_times_s for r in raws], max),
        waits_s=_elementwise([r.waits_s for r in raws], max),
        copies_s=_elementwise([r.copies_s for r in raws], max),
        loader_host_s=_elementwise([r.loader_host_s for r in raws], max),
        loader_idle_s=(None if any(r.loader_idle_s is None for r in raws)  # the host clock on some rank
                       else _elementwise([r.loader_idle_s for r in raws], max)),
        host_idle_s=(None if any(r.host_idle_s is None for r in raws)
                     else _elementwise([r.host_idle_s for r in raws], max)),
        losses=_elementwise([r.losses for r in raws], lambda v: sum(v) / len(v)),  # what DDP trains on
        samples=sum(r.samples for r in raws),
        wall_s=max(r.wall_s for r in raws),
        epochs=max(r.epochs for r in raws),
        # the siblings' own CPU counts as "foreign" inside each rank: take it out again
        foreign_cores=(None if first.foreign_cores is None else
                       max(0.0, first.foreign_cores - sum(siblings_cores))),
        peak_bytes=max((r.peak_bytes for r in raws if r.peak_bytes is not None), default=None),
        compile_info=first.compile_info,
        state_bytes=max((r.state_bytes for r in raws if r.state_bytes is not None), default=None),  # largest rank's
        # the rank that faulted most: its steps set the pace
        page_faults=max((r.page_faults for r in raws if r.page_faults is not None), default=None),
        kernel_share=max((r.kernel_share for r in raws if r.kernel_share is not None), default=None),
        warmup_rule=first.warmup_rule,  # the ranks ended warm-up together (run_phases' agree)
        warmup_note=next((r.warmup_note for r in raws if r.warmup_note), None),
        shapes=first.shapes,  # rank 0's input shapes (each rank reads its own shard)
    )


def assemble(reports: dict[int, dict[str, Any]], knobs: Knobs, *, env: dict[str, Any], started: str,
             notes: list[str], backend: str) -> TrialResult:
    """One TrialResult from every rank's ok report (see the module docstring for the figures)."""
    ranks = sorted(reports)
    raws = [RawTrial(**reports[r]["raw"]) for r in ranks]
    merged = _merged(raws, [reports[r]["own_cores"] for r in ranks[1:]])
    fields_, more = derive(merged, knobs)
    if fields_["status"] == "nan":  # name the rank whose loss went bad first
        bad = [(i, r) for r in ranks for i, x in enumerate(reports[r]["raw"]["losses"]) if not math.isfinite(x)]
        if bad:
            r = min(bad)[1]
            fields_["message"] = f"rank {r}: " + fields_["message"]
    step_med = fields_["step_time_s"]
    per_rank = []
    for r, raw in zip(ranks, raws):
        rep = reports[r]
        probe_med = _median(rep["probe_times_s"])
        per_rank.append({
            "rank": r,
            "step_time_s": _median(raw.step_times_s),
            "step_times_s": list(raw.step_times_s),
            "data_wait_s": list(raw.waits_s),
            "data_wait_share": min(1.0, sum(raw.waits_s) / raw.wall_s),
            "samples_per_s": raw.samples / raw.wall_s,
            "no_comm_step_s": probe_med,
            "allreduce_calls": rep["comm"]["allreduce_calls"],
            "allreduce_bytes": rep["comm"]["allreduce_bytes"],
            "threads": rep.get("threads"),
        })
    compute = [p["no_comm_step_s"] for p in per_rank if p["no_comm_step_s"]]
    slowest = max(per_rank, key=lambda p: p["no_comm_step_s"] or 0.0)["rank"] if compute else None
    exposed = None
    if compute and step_med:
        exposed = min(1.0, max(0.0, 1.0 - max(compute) / step_med))
    dist_info = {
        "world_size": knobs.world_size,
        "backend": backend,
        "strategy": knobs.strategy,
        "global_batch": knobs.batch_size * knobs.world_size * knobs.accum_steps,
        "per_rank_samples_per_s": fields_["samples_per_s"] / knobs.world_size,
        "exposed_comm_share": exposed,
        "exposed_comm_method": ("not measured for fsdp2 (its all-gathers cannot be skipped)" if knobs.strategy == "fsdp2"
                                else "1 - slowest rank's median no-comm step (all-reduce skipped) / median window step"),
        "slowest_rank": slowest,
        "imbalance": (max(compute) / min(compute) - 1.0) if len(compute) == len(per_rank) and min(compute) else None,
        "allreduce_calls": per_rank[0]["allreduce_calls"],  # rank 0's, over the measured window
        "allreduce_per_step": per_rank[0]["allreduce_calls"] / merged.steps,
        "per_rank": per_rank,
    }
    extra = {**fields_.pop("extra"), "distributed": dist_info}
    rank_notes = [n for r in ranks for n in reports[r].get("notes", [])]
    all_notes = list(dict.fromkeys(notes + more + rank_notes))
    return TrialResult(knobs=knobs, env=env, started_at=started, notes=tuple(all_notes), extra=extra, **fields_)


def failed_result(knobs: Knobs, status: str, message: str, where: str = "", traceback: str = "", *,
                  env: dict[str, Any], started: str, notes: list[str]) -> TrialResult:
    """A failed distributed trial: one status and message for the whole job."""
    return TrialResult(knobs=knobs, status=status, message=message, where=where, traceback=traceback,
                       env=env, started_at=started, notes=tuple(notes))


def forwarded_result(knobs: Knobs, rank: int, world_size: int, *, env: dict[str, Any], started: str,
                     notes: list[str]) -> TrialResult:
    """A non-zero rank's own result in a torchrun job: ok, its report sent to rank 0 (which holds
    the job's measurements), no figures of its own."""
    return TrialResult(knobs=knobs, status="ok", message=f"rank {rank} of {world_size}: report sent to rank 0",
                       env=env, started_at=started, notes=tuple(notes))
