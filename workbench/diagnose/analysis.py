"""The declared analyses: one file in diagnose/ adds one analysis to every `diagnose()`.

A module in this folder declares an analysis once, on the function that computes it:

    @analysis("memory breakdown", title="Memory at the peak", steps=2.0)
    def _memory(ctx: Context) -> pd.DataFrame:
        return memory_breakdown(ctx.workload, ctx.knobs)

`diagnose()` finds it (`discover()` imports every module of this folder, so a new file is picked up
with no other edit), runs it after the profiler when its estimate fits the call's one `Budget`
(`steps` instrumented eager steps x `ANALYSIS_PRIOR` x the diagnosed trial's step time), charges its
seconds to the budget's account under its name, keeps its result in `Diagnosis.analyses[name]` (the
built-ins: in their own `field`, e.g. `Diagnosis.memory`), and shows it as a titled section of the
Diagnosis (text and HTML). One that raises is listed in `Diagnosis.problems`; the others still run.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.knobs import Knobs
from ..core.measure import TrialResult
from ..core.workload import Workload

ANALYSIS_PRIOR = 3.0  # an instrumented eager step (profiler, hooks) over a measured step's seconds


@dataclass(frozen=True)
class Context:
    """What an analysis may read: the bench (its workload, trials, log), the diagnosed knobs and their
    ok trial, the profiler's step count, and the results of the analyses that ran before it."""

    bench: Any  # results.protocol.Bench
    knobs: Knobs
    base: TrialResult  # the diagnosed trial (ok)
    profile_steps: int
    results: dict[str, Any]  # name -> result of the declared analyses run so far (earlier `order`)
    attempt: Callable[[str, Callable[[], Any]], Any]  # a sub-step: a failure is listed in problems, None returned

    @property
    def workload(self) -> Workload:
        return self.bench.workload


@dataclass(frozen=True)
class Analysis:
    """One declared analysis: how to run it, what it costs, and how it shows."""

    name: str  # in the budget's notes and account, in `problems`, and for diagnose(skip=...)
    run: Callable[[Context], Any]
    title: str  # the section's title
    steps: float = 1.0  # instrumented eager steps it runs (the budget's estimate)
    order: int = 100  # sections in this order (built-ins: 10, 20, 30), then the compile section
    field: str | None = None  # the Diagnosis field that holds the result (the built-ins'); else `analyses[name]`
    show: Callable[[Any], Any] | None = None  # result -> DataFrame | Series | list of lines | None (no section)
    index: bool = False  # show the table's index
    when: Callable[[Context], bool] | None = None  # run only when this holds (e.g. the model has blocks)

    def estimate_s(self, step_time_s: float | None) -> float:
        """Seconds this analysis is expected to take, from the diagnosed trial's step time."""
        return self.steps * ANALYSIS_PRIOR * (step_time_s or 0.0)

    def section(self, result: Any) -> Any:
        """The section's body for `result` (None: no section)."""
        return None if result is None else (self.show(result) if self.show is not None else result)


ANALYSES: dict[str, Analysis] = {}  # name -> declaration, filled by the modules of this folder


def analysis(name: str, *, title: str, steps: float = 1.0, order: int = 100, field: str | None = None,
             show: Callable[[Any], Any] | None = None, index: bool = False,
             when: Callable[[Context], bool] | None = None) -> Callable[[Callable[[Context], Any]], Callable[[Context], Any]]:
    """Declare `fn(ctx) -> result` as the analysis `name` (see the module docstring); returns `fn`."""
    if not isinstance(name, str) or not name or not isinstance(title, str) or not title:
        raise TypeError("an analysis needs a name and a title (non-empty strings)")
    if not isinstance(steps, (int, float)) or steps < 0:
        raise ValueError(f"steps is the instrumented eager steps an analysis runs (>= 0), got {steps!r}")

    def declare(fn: Callable[[Context], Any]) -> Callable[[Context], Any]:
        old = ANALYSES.get(name)
        if old is not None and (old.run.__module__, old.run.__qualname__) != (fn.__module__, fn.__qualname__):
            raise ValueError(f"an analysis named {name!r} is already declared in {old.run.__module__}: rename one")
        ANALYSES[name] = Analysis(name, fn, title, float(steps), order, field, show, index, when)
        return fn

    return declare


def discover() -> tuple[list[Analysis], list[str]]:
    """Every declared analysis in section order, after importing each module of this folder (a file
    added since is picked up); and, per module that failed to import, a line for `problems`."""
    importlib.invalidate_caches()
    broken = []
    for mod in pkgutil.iter_modules([str(Path(__file__).parent)]):
        try:
            importlib.import_module(f"{__package__}.{mod.name}")
        except Exception as e:  # a broken analysis file is reported, never stops the diagnosis
            broken.append(f"{mod.name}.py could not be imported: {type(e).__name__}: {e}")
    return sorted(ANALYSES.values(), key=lambda a: a.order), broken
