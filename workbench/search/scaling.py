"""Scaling efficiency: the same knobs at several world sizes, one trial each, as a table.

    efficiency(N) = samples/s with N ranks / (N x samples/s with 1 rank)

What the figure means depends on the hardware. On GPUs each rank brings its own device, so
efficiency < 1 is the cost of communication and imbalance. On a CPU the ranks share the cores: by
default a rank gets 1 intra-op thread (as under torchrun), while a 1-process trial uses every core
(torch's default). On a 2-core machine, world_size=2 is then "2 processes x 1 thread" against
"1 process x 2 threads": the same cores, split by data parallelism instead of intra-op threading,
plus an all-reduce per step. Efficiency near 0.5 there means "as fast as one process", not "half
wasted"; pass cpu_threads=1 to compare per-rank work at equal threads instead.

With `strategies=("ddp", "fsdp2")` each world size above 1 runs once per strategy, so DDP and
FSDP2 stand side by side: throughput, peak memory and model state per rank (FSDP2's reason).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pandas as pd

from ..core.knobs import STRATEGIES
from ..deciding.budget import Budget
from ..results.protocol import Bench

COLUMNS = ["world_size", "strategy", "setup", "samples_per_s", "per_rank_samples_per_s", "efficiency",
           "threads_per_rank", "exposed_comm_share", "step_time_ms", "peak_memory_mb", "model_state_mb", "status",
           "trial_id"]


def plan(bench: Bench, world_sizes: Iterable[int], strategies: Iterable[str] | None, changes: dict[str, Any]) -> list:
    """The Knobs of every row, validated before any runs: each world size once per strategy; one
    process once, without the fsdp_* knobs (they need world_size >= 2)."""
    sizes = list(world_sizes)
    if not sizes or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in sizes):
        raise ValueError(f"world_sizes must be ints >= 1, e.g. (1, 2), got {world_sizes!r}")
    if len(set(sizes)) != len(sizes):
        raise ValueError(f"world_sizes lists a size twice: {sizes}")
    names = list(strategies) if strategies is not None else [changes.get("strategy", "ddp")]
    if not names or len(set(names)) != len(names) or any(s not in STRATEGIES for s in names):
        raise ValueError(f"strategies must list each of {', '.join(map(repr, STRATEGIES))} at most once, got {strategies!r}")
    one = {k: v for k, v in changes.items() if not k.startswith("fsdp_") and k != "strategy"}
    out = []
    for n in sorted(sizes):
        if n == 1:
            out.append(bench.knobs(**one, world_size=1))
            continue
        for name in names:
            mine = changes if name == "fsdp2" else {k: v for k, v in changes.items() if not k.startswith("fsdp_")}
            out.append(bench.knobs(**{**mine, "strategy": name}, world_size=n))
    return out


def scaling(bench: Bench, world_sizes: Iterable[int] = (1, 2), strategies: Iterable[str] | None = None,
            budget_s: float | None = None, **changes: Any) -> pd.DataFrame:
    """Run one trial per world size (and per strategy, e.g. ("ddp", "fsdp2")) with the same other
    knobs; a DataFrame with efficiency, peak memory and model state (params + grads + optimizer
    state) per rank, side by side with throughput.

    Efficiency is against the 1-rank trial when world_sizes includes 1, else against the first row
    (the smallest world size, first strategy): samples/s(N) / (N / N0 x samples/s(N0)).
    `budget_s` caps the seconds (budget.py, as in tune()): the first row's trial runs whole, a later
    one only when its estimate (which knows more ranks cost more) fits the seconds left, under a
    deadline; a row left out or stopped says so in `status`, and `frame.attrs["spent"]` (budget.Spend)
    and `frame.attrs["notes"]` say how the seconds went.
    """
    budget = Budget.of(budget_s, "scaling")  # validated once; its account is the result's
    rows = []
    for k in plan(bench, world_sizes, strategies, changes):
        r = budget.trial(bench.run, k, purpose="scaling", label=f"world_size={k.world_size} ({k.strategy})")
        if r is None:
            rows.append({"world_size": k.world_size, "strategy": k.strategy if k.world_size > 1 else "one process",
                         "status": "not run: over the budget"})
            continue
        rate = None if budget.stopped(r) else r.samples_per_s  # a trial stopped at the deadline is no evidence
        d = r.extra.get("distributed", {}) if rate else {}
        per_rank = d.get("per_rank_samples_per_s", rate if k.world_size == 1 else None)
        threads = (d.get("per_rank") or [{}])[0].get("threads") if d else r.env.get("threads")
        strategy = k.strategy if k.world_size > 1 else "one process"
        rows.append({"world_size": k.world_size, "strategy": strategy,
                     "setup": f"{k.world_size} x {strategy}" if k.world_size > 1 else "1",
                     "samples_per_s": rate, "per_rank_samples_per_s": per_rank,
                     "threads_per_rank": threads, "exposed_comm_share": d.get("exposed_comm_share"),
                     "step_time_ms": None if r.step_time_s is None else r.step_time_s * 1e3,
                     "peak_memory_mb": _mb(r.peak_memory_bytes), "model_state_mb": _mb(r.model_state_bytes),
                     "status": "stopped by the budget" if budget.stopped(r) else r.status, "trial_id": r.trial_id})
    df = pd.DataFrame(rows, columns=[c for c in COLUMNS if c != "efficiency"])
    base = df.iloc[0]
    if base["samples_per_s"]:
        df["efficiency"] = df["samples_per_s"] / (df["world_size"] / base["world_size"] * base["samples_per_s"])
    else:
        df["efficiency"] = None
    out = df[COLUMNS]
    out.attrs.update(spent=budget.spent, notes=budget.notes)
    return out


def _mb(n: int | None) -> float | None:
    return None if n is None else n / 1e6
