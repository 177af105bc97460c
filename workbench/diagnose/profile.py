"""Which op? torch.profiler over a few eager steps, with record_function ranges per stage.

Two tables: the stages (data / forward / backward / optimizer, ms per step: the kernels each range
queued on a GPU, host time on the CPU and for data; the split `explain` uses) and the top ops by
self time on the device (self CPU time when the device is the CPU). Often the culprit is
a `.to(device)` copy, a slow collate or `__getitem__`, not the convolutions.
"""

from __future__ import annotations

import os

import pandas as pd

from ..core import trace as tracing
from ..core.knobs import Knobs
from ..core.measure import sync
from ..core.step import built
from ..core.workload import Workload
from ..launch.runner import trial_threaded


@trial_threaded
def profile_step(workload: Workload, knobs: Knobs, *, steps: int = 3, warmup: int = 1,
                 top: int = 15, trace_path: str | os.PathLike | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(stages, top ops) over `steps` profiled optimizer steps after `warmup` unprofiled ones.

    Times are per optimizer step, in milliseconds. Runs eager even when knobs.compile is set.
    The Chrome trace of those steps is kept at `trace_path` (a temp file when None).
    """
    device = workload.device
    path = trace_path if trace_path is not None else tracing.trace_file(None, "diagnose", "profile")
    with built(workload, knobs) as (step, source):  # phases labelled with record_function
        for _ in range(warmup):
            step(source)
        sync(device)
        # one profiler warm-up step, then `steps` traced ones labelled ProfilerStep#N
        files = tracing.capture(lambda: step(source), path, device=device, steps=steps, warmup=1, keep_averages=True)
    events = files.averages
    on_device = device.type == "cuda"
    rows = []
    for e in events:
        self_dev = getattr(e, "self_device_time_total", 0.0) if on_device else 0.0
        row = {
            "op": e.key,
            "calls_per_step": e.count / steps,
            "self_cpu_ms": e.self_cpu_time_total / 1e3 / steps,  # profiler reports microseconds
            "total_cpu_ms": e.cpu_time_total / 1e3 / steps,
        }
        if on_device:
            row["self_device_ms"] = self_dev / 1e3 / steps
        if e.key.startswith(tracing.STEP_LABEL[:-1]):
            continue  # the whole step: the sum of the rows below
        if e.key not in tracing.PHASES:  # the step's record_function ranges are the stages, below
            rows.append(row)
    sort_key = "self_device_ms" if on_device else "self_cpu_ms"
    ops = pd.DataFrame(rows)
    if not ops.empty:
        ops = ops.sort_values(sort_key, ascending=False).head(top).reset_index(drop=True)
        total = sum(r[sort_key] for r in rows) or 1.0
        ops["share"] = ops[sort_key] / total
    return stage_frame(files.path), ops


def stage_frame(trace_path: str | os.PathLike) -> pd.DataFrame:
    """stage | ms_per_step | share: each stage once, in PHASES order, from the trace's steps
    (core/trace.stage_ms: device time where a device ran the stage, host time otherwise; the split
    `explain` reads too). Shares are of the stages' sum."""
    spans, inside = tracing.step_events(trace_path)
    split = tracing.stage_ms(inside, len(spans))
    stages = pd.DataFrame([{"stage": k, "ms_per_step": v} for k, v in split.items() if v > 0],
                          columns=["stage", "ms_per_step"])
    if not stages.empty:
        stages["share"] = stages["ms_per_step"] / stages["ms_per_step"].sum()
    return stages
