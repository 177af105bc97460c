"""exhaustive_space: every combination of the tuner's axes, to benchmark the tuner against a full
sweep (bench_tune.py). A benchmark helper, not part of the package.

The axes come from `workbench.search.tune.stage_axes`, the tuner's own candidate source, so the sweep and
the tuner search the same space: one option (or none) per axis, every combination that is valid.
Options that only become valid on another change (prefetch needs workers) are taken from the
axes of the start with every worker option applied.
"""

from __future__ import annotations

import itertools
from typing import Any

from workbench.core.knobs import Knobs
from workbench.search.tune import stage_axes


def space_axes(bench: Any, start: Knobs, stages: tuple[str, ...], max_batch_size: int | None = None,
               keep: tuple[str, ...] | None = None) -> dict[str, list[dict[str, Any]]]:
    """{axis name: its alternative changes} over `stages`, as the tuner builds them."""
    axes: dict[str, list[dict[str, Any]]] = {}
    for stage in stages:
        for name, changes in stage_axes(bench, stage, start, max_batch_size, keep):
            axes[name] = changes
        if stage == "data":
            for w in axes.get("workers", []):  # options that need workers (prefetch)
                for name, changes in stage_axes(bench, stage, start.replace(**w), max_batch_size, keep):
                    if name not in axes:
                        axes[name] = changes
    return axes


def exhaustive_space(bench: Any, start: Knobs | None = None, stages: tuple[str, ...] = ("data", "precision", "batch"),
                     max_batch_size: int | None = None, axes: tuple[str, ...] | None = None) -> list[Knobs]:
    """Every valid combination of the tuner's axes (the start included), without duplicates."""
    k0 = start or bench.defaults
    found = space_axes(bench, k0, stages, max_batch_size, axes)
    out = []
    for combo in itertools.product(*[[{}, *changes] for changes in found.values()]):
        change = dict(itertools.chain.from_iterable(c.items() for c in combo))
        try:
            out.append(k0.replace(**change))
        except (ValueError, TypeError):
            continue
    return list(dict.fromkeys(out))
