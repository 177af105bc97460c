"""Rebuild a workbench's objects from where it came from: a factory (`--model pkg.module:fn`) or a
built-in demo (`demo`, which is `wb.demo`). The CLI builds its Workbench with `load_factory`; an exported script of such a
workbench calls `load_parts` and so runs as it is, with no objects pasted above it."""

from __future__ import annotations

import copy
import os
import sys
from typing import Any

from ..core.stepshape import is_demo_source, is_import_path
from ..core.workload import resolve_device
from ..demos import DEMOS, DEVICE_SIZES, SIZES, size_for
from .bench import Workbench

_BUILT = ("model", "data")  # positional parts a caller cannot replace


def demo(name: str, *, size: str = "default", **workbench_kwargs: Any) -> Workbench:
    """A Workbench named `demo-<name>` on a built-in workload; extra keywords go to Workbench.

    `loss_fn`, `optimizer`, `step_fn`, `knobs` and `name` may be overridden (e.g. a different
    learning rate); `log`, `participant`, `steps`, `warmup_steps`, `device`, `seed` pass straight through.
    `size="default"` is sized for the device (demos.size_for: a CUDA device gets the `cnn` and
    `transformer` demos at sizes where their lessons hold on a GPU); `size="cuda"` asks for that size anywhere.
    """
    if name not in DEMOS:
        raise ValueError(f"unknown demo {name!r}; choose one of: {', '.join(DEMOS)}")
    if size not in SIZES and size not in DEVICE_SIZES.values():
        raise ValueError(f"unknown demo size {size!r}; choose one of: {', '.join(SIZES)}")
    size = size_for(name, size, resolve_device(workbench_kwargs.get("device", "auto")))
    if size not in DEMOS[name].sizes:  # "cuda" asked of a demo without one: its default is already the lesson
        size = "default"
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
        bench._came_from(f"demo:{name}:{size}")  # its to_code() script rebuilds this demo and runs as it is
    return bench


def load_factory(spec: str) -> Any:
    """`pkg.module:factory` -> factory() (a Workbench or a dict of its arguments): the module is
    imported, the current directory on the path (the CLI's --model, and scripts from `load_parts`)."""
    import importlib

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr.isidentifier():
        raise ValueError(f"--model takes PKG.MODULE:FACTORY, e.g. mytrain.bench:make, got {spec!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"--model {spec}: cannot import {module_name!r} ({e}); run from the directory that "
                         "holds it or put it on PYTHONPATH") from e
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ValueError(f"--model {spec}: {module_name} has no function {attr!r}")
    return factory()


def load_parts(source: str) -> dict[str, Any]:
    """The objects of a workbench rebuilt from where it came from, for an exported script.

    `source` is "demo:NAME:SIZE" (a built-in demo) or "pkg.module:factory" (the CLI's --model).
    Keys: model (a copy of the weights the trials start from), dataset, loss_fn, step_fn,
    make_optimizer, collate_fn, sampler (None where the workbench has none).
    """
    if is_demo_source(source):
        _, name, size = source.split(":")
        bench = demo(name, size=size, log=None)
    elif is_import_path(source):
        made = load_factory(source)
        bench = made if isinstance(made, Workbench) else Workbench(**{**made, "log": None}) \
            if isinstance(made, dict) else None
        if bench is None:
            raise TypeError(f"{source}: the factory returned {type(made).__name__}; return a workbench.Workbench "
                            "or a dict of its arguments (model, data, loss_fn, ...)")
    else:
        raise ValueError(f"source must be 'pkg.module:factory' or 'demo:NAME:SIZE', got {source!r}")
    wl = bench.workload
    return {"model": copy.deepcopy(wl.pristine), "dataset": wl.spec.dataset, "loss_fn": wl.loss_fn,
            "step_fn": wl.step_fn, "make_optimizer": wl.optimizer_factory, "collate_fn": wl.spec.collate_fn,
            "sampler": wl.spec.sampler}
