"""Scaling efficiency: the same knobs at several world sizes, one trial each, as a table.

    efficiency(N) = samples/s with N ranks / (N x samples/s with 1 rank)

What the figure means depends on the hardware. On GPUs each rank brings its own device, so
efficiency < 1 is the cost of communication and imbalance. On a CPU the ranks share the cores: by
default a rank gets 1 intra-op thread (as under torchrun), while a 1-process trial uses every core
(torch's default). On a 2-core machine, world_size=2 is then "2 processes x 1 thread" against
"1 process x 2 threads": the same cores, split by data parallelism instead of intra-op threading,
plus an all-reduce per step. Efficiency near 0.5 there means "as fast as one process", not "half
wasted"; pass cpu_threads=1 to compare per-rank work at equal threads instead.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pandas as pd

from .protocol import Bench

COLUMNS = ["world_size", "samples_per_s", "per_rank_samples_per_s", "efficiency", "threads_per_rank",
           "exposed_comm_share", "step_time_ms", "status", "trial_id"]


def scaling(bench: Bench, world_sizes: Iterable[int] = (1, 2), **changes: Any) -> pd.DataFrame:
    """Run one trial per world size with the same other knobs; a DataFrame with efficiency.

    Efficiency is against the 1-rank trial when world_sizes includes 1, else against the smallest
    world size (N0): samples/s(N) / (N / N0 x samples/s(N0)).
    """
    sizes = list(world_sizes)
    if not sizes or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in sizes):
        raise ValueError(f"world_sizes must be ints >= 1, e.g. (1, 2), got {world_sizes!r}")
    if len(set(sizes)) != len(sizes):
        raise ValueError(f"world_sizes lists a size twice: {sizes}")
    knobs = [bench.knobs(**changes, world_size=n) for n in sorted(sizes)]  # validate all before running any
    rows = []
    for k in knobs:
        r = bench.run(k)
        d = r.extra.get("distributed", {})
        per_rank = d.get("per_rank_samples_per_s", r.samples_per_s if k.world_size == 1 else None)
        threads = (d.get("per_rank") or [{}])[0].get("threads") if d else r.env.get("threads")
        rows.append({"world_size": k.world_size, "samples_per_s": r.samples_per_s, "per_rank_samples_per_s": per_rank,
                     "threads_per_rank": threads, "exposed_comm_share": d.get("exposed_comm_share"),
                     "step_time_ms": None if r.step_time_s is None else r.step_time_s * 1e3,
                     "status": r.status, "trial_id": r.trial_id})
    df = pd.DataFrame(rows, columns=[c for c in COLUMNS if c != "efficiency"])
    base = df.iloc[0]
    if base["samples_per_s"]:
        df["efficiency"] = df["samples_per_s"] / (df["world_size"] / base["world_size"] * base["samples_per_s"])
    else:
        df["efficiency"] = None
    return df[COLUMNS]
