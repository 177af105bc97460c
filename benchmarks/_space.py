"""exhaustive_space: every combination of the tuner's options, to benchmark the tuner against a
full sweep (bench_tune.py). A benchmark helper, not part of the package."""

from __future__ import annotations

from typing import Any

from workbench.knobs import Knobs
from workbench.tune import stage_options


def exhaustive_space(bench: Any, start: Knobs | None = None, batch_sizes: tuple[int, ...] | None = None,
                     stages: tuple[str, ...] = ("data", "precision", "compile")) -> list[Knobs]:
    """Every combination of the tuner's options (for benchmarking the tuner against a full sweep)."""
    import itertools

    k0 = start or bench.defaults
    per_stage = []
    for stage in stages:
        options = [{}, *stage_options(bench, stage, k0)]
        if stage == "data":
            # workers options are alternatives; prefetch/pin combine with any worker count
            workers = [o for o in options if "num_workers" in o]
            extras = [o for o in options if o and "num_workers" not in o]
            options = [{}] + workers + [{**w, **e} for w in workers for e in extras]
        elif stage == "precision":
            options = [{}] + [dict(itertools.chain.from_iterable(o.items() for o in combo))
                              for n in range(1, len(options)) for combo in itertools.combinations(options[1:], n)]
        per_stage.append(options)
    sizes = batch_sizes or (k0.batch_size,)
    out = []
    for combo in itertools.product(*per_stage):
        change = dict(itertools.chain.from_iterable(c.items() for c in combo))
        for bs in sizes:
            try:
                out.append(k0.replace(**change, batch_size=bs))
            except (ValueError, TypeError):
                continue
    return list(dict.fromkeys(out))
