"""Built-in demo workloads: generated data (no downloads), seeded, one bottleneck each.

    bench = wb.demo("jpeg")            # data-bound: JPEG decode + augmentation per sample
    bench.run(num_workers=2, cpu_threads=1)

`wb.demo(name)` (faces/rebuild.py) makes a Workbench of one. Each demo module has `DESCRIPTION` and `build(size) -> dict` with the Workbench's inputs (model,
data, loss_fn, optimizer, step_fn) and `knobs`, the demo's default Knobs. `size="tiny"` is a
seconds-fast version for tests; `size="default"` is the one users see.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import cnn, jpeg, mlp_memory, transformer

SIZES = ("tiny", "default")


@dataclass(frozen=True)
class Demo:
    """A named demo: what it teaches, and how to build its parts for a size."""

    name: str
    description: str  # one line: the bottleneck it shows and the knob that fixes it
    build: Callable[[str], dict[str, Any]]  # size -> {model, data, loss_fn, optimizer, step_fn, knobs}


DEMOS: dict[str, Demo] = {
    name: Demo(name, module.DESCRIPTION, module.build)
    for name, module in (("jpeg", jpeg), ("cnn", cnn), ("mlp-memory", mlp_memory), ("transformer", transformer))
}

__all__ = ["DEMOS", "SIZES", "Demo"]
