"""Tuning Workbench: measure a PyTorch training step under different knobs, honestly.

    import workbench as wb
    bench = wb.Workbench(model, dataset, loss_fn=..., optimizer=...)   # or wb.demo("jpeg")
    bench.run(num_workers=2, amp="bf16")
    bench.results

    @wb.knob(choices=["naive", "sdpa"], default="naive", help="attention implementation")
    def attention(model, value):         # your own knob: on each trial's fresh model copy
        model.set_attention(value)
    ws = wb.gather("shared-folder")      # a workshop: every learner's trials (participant=...)

The measurement core (knobs, workload, runner, results) imports without ipywidgets or altair:
`pip install tuning-workbench` is the core; `pip install "tuning-workbench[notebook]"` adds the panel.
"""

from __future__ import annotations

import os
from typing import Any

from .core.knobs import Knobs, forget_knob, knob, knob_names, knob_table, tunable_knobs
from .core.measure import TrialResult
from .core.system import keep_freed_memory, package_version, settle_malloc
from .deciding.rounds import compare
from .faces.bench import Workbench
from .launch.fresh import FreshProcess
from .launch.runner import TrialInterrupted, run_trial
from .results import Comparison, ResultLog

__version__ = package_version()


def demo(name: str, **kwargs):
    """A Workbench on a built-in demo workload (generated data, no downloads); see `demos.DEMOS`."""
    from .faces.rebuild import demo as _demo

    return _demo(name, **kwargs)


def gather(folder: str | os.PathLike, **kwargs: Any) -> Any:
    """The instructor's view of a workshop folder: every learner's trials (see `workshop.Workshop`)."""
    from .faces.workshop import gather as _gather

    return _gather(folder, **kwargs)


CALLBACKS = {"LightningCallback": ("lightning_run", "lightning", 'pip install "tuning-workbench[lightning]"'),
             "TrainerCallback": ("hf_run", "transformers", 'pip install "tuning-workbench[hf]"')}


def __getattr__(name: str) -> Any:
    """`wb.LightningCallback` and `wb.TrainerCallback`, imported on first use: the core never imports
    lightning or transformers."""
    if name not in CALLBACKS:
        raise AttributeError(f"module 'workbench' has no attribute {name!r}")
    import importlib

    module, package, install = CALLBACKS[name]
    try:
        return getattr(importlib.import_module(f".faces.{module}", __name__), name)
    except ImportError as e:
        raise ImportError(f"wb.{name} needs {package}: {install}") from e


__all__ = [
    "Comparison", "FreshProcess", "Knobs", "ResultLog", "TrialInterrupted", "TrialResult", "Workbench", "compare",
    "demo", "forget_knob", "gather", "keep_freed_memory", "knob", "knob_names", "knob_table", "run_trial",
    "settle_malloc", "tunable_knobs",
]
