"""Built-in demo workloads: generated data (no downloads), seeded, one bottleneck each.

    bench = wb.demo("jpeg")            # data-bound: JPEG decode + augmentation per sample
    bench.run(num_workers=2, cpu_threads=1)

Each demo module has `DESCRIPTION` and `build(size) -> dict` with the Workbench's inputs (model,
data, loss_fn, optimizer, step_fn) and `knobs`, the demo's default Knobs. `size="tiny"` is a
seconds-fast version for tests; `size="default"` is the one users see.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..bench import Workbench
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

_BUILT = ("model", "data")  # positional parts a caller cannot replace


def demo(name: str, *, size: str = "default", **workbench_kwargs: Any) -> Workbench:
    """A Workbench named `demo-<name>` on a built-in workload; extra keywords go to Workbench.

    `loss_fn`, `optimizer`, `step_fn`, `knobs` and `name` may be overridden (e.g. a different
    learning rate); `log`, `participant`, `steps`, `warmup_steps`, `device`, `seed` pass straight through.
    """
    if name not in DEMOS:
        raise ValueError(f"unknown demo {name!r}; choose one of: {', '.join(DEMOS)}")
    if size not in SIZES:
        raise ValueError(f"unknown demo size {size!r}; choose one of: {', '.join(SIZES)}")
    fixed = sorted(set(_BUILT) & set(workbench_kwargs))
    if fixed:
        raise TypeError(f"demo {name!r} builds its own {' and '.join(fixed)}; use wb.Workbench(...) for your own")
    parts = DEMOS[name].build(size)
    kwargs: dict[str, Any] = {
        "loss_fn": parts["loss_fn"],
        "optimizer": parts["optimizer"],
        "step_fn": parts["step_fn"],
        "knobs": parts["knobs"],
        "name": f"demo-{name}",
        **workbench_kwargs,
    }
    bench = Workbench(parts["model"], parts["data"], **kwargs)
    if not {"loss_fn", "optimizer", "step_fn"} & set(workbench_kwargs):  # the demo's own objects
        bench.came_from(f"demo:{name}:{size}")  # its to_code() script rebuilds this demo and runs as it is
    return bench


__all__ = ["DEMOS", "SIZES", "Demo", "demo"]
