"""Built-in demo workloads: generated data (no downloads), seeded, one bottleneck each.

    bench = wb.demo("jpeg")            # data-bound: JPEG decode + augmentation per sample
    bench.run(num_workers=2, cpu_threads=1)

`wb.demo(name)` (faces/rebuild.py) makes a Workbench of one. Each demo module has `DESCRIPTION` and `build(size) -> dict` with the Workbench's inputs (model,
data, loss_fn, optimizer, step_fn) and `knobs`, the demo's default Knobs. `size="tiny"` is a
seconds-fast version for tests; `size="default"` is the one users see, sized for the device
(`size_for`): on a CUDA device the demos whose lessons depend on the step's size (`cnn`: bf16 and
channels_last pay; `transformer`: a realistic width) build their "cuda" size, since at the CPU sizes
a GPU finishes a step in the time the host takes to launch it and no compute knob can show.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from . import cnn, jpeg, mlp_memory, transformer

SIZES = ("tiny", "default")  # what you pick; "default" is then sized for the device (size_for)
DEVICE_SIZES = {"cuda": "cuda"}  # device type -> the size "default" builds there, for a demo that has it


@dataclass(frozen=True)
class Demo:
    """A named demo: what it teaches, and how to build its parts for a size."""

    name: str
    description: str  # one line: the bottleneck it shows and the knob that fixes it
    build: Callable[[str], dict[str, Any]]  # size -> {model, data, loss_fn, optimizer, step_fn, knobs}
    sizes: tuple[str, ...] = SIZES  # every size build() takes ("tiny", "default", and "cuda" where it has one)


DEMOS: dict[str, Demo] = {
    name: Demo(name, module.DESCRIPTION, module.build, tuple(module.SIZES))
    for name, module in (("jpeg", jpeg), ("cnn", cnn), ("mlp-memory", mlp_memory), ("transformer", transformer))
}


def size_for(name: str, size: str, device: str | torch.device) -> str:
    """The size demo `name` builds when asked for `size` on `device` (a pure function of the device's type):
    "default" on a CUDA device is the demo's "cuda" size when it has one; any other size as asked."""
    kind = torch.device(device).type if not isinstance(device, torch.device) else device.type
    sized = DEVICE_SIZES.get(kind)
    if size == "default" and sized is not None and sized in DEMOS[name].sizes:
        return sized
    return size


__all__ = ["DEMOS", "DEVICE_SIZES", "SIZES", "Demo", "size_for"]
