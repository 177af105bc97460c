"""fit_memory: the first configuration, in the seeds' memory-rescue order, whose measured peak fits
`max_bytes` of peak memory at a fixed effective batch (AMP -> accumulation -> checkpointing the heaviest blocks)."""

from __future__ import annotations

import html
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch

from ..core.knobs import Knobs
from ..core.measure import TrialResult, fmt_bytes
from ..deciding.budget import Budget, Spend
from ..diagnose.memory import block_activation_bytes
from ..results.protocol import Bench

DEFAULT_HEADROOM = 0.1  # stay 10% below max_bytes: a peak on the edge fails later (fragmentation, longer inputs)
BATCH_GROWTH_LIMIT = 0.8  # never try a batch whose predicted peak exceeds this share of free memory


def memory_ceiling(bench: Bench, max_bytes: int | None) -> float | None:
    """The most memory a trial may use: the caller's `max_bytes`, else most of the free device memory (on an
    executor's node, whose free memory is not known here: most of its total, from its device facts)."""
    if max_bytes is not None:
        return float(max_bytes)
    facts = bench._facts
    if not facts.here:
        return BATCH_GROWTH_LIMIT * facts.memory_bytes if facts.memory_bytes else None
    if bench.device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(bench.device)
        return BATCH_GROWTH_LIMIT * free
    try:
        import psutil

        return BATCH_GROWTH_LIMIT * psutil.virtual_memory().available
    except ImportError:
        return None


@dataclass
class FitResult:
    """A configuration whose peak memory fits `max_bytes` (or None), and what each rescue step cost."""

    knobs: Knobs | None
    result: TrialResult | None
    max_bytes: int
    effective_batch: int
    steps: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    spent: Spend | None = None  # how the seconds went (budget_s): trials run, not started, stopped at the deadline

    @property
    def fits(self) -> bool:
        return self.knobs is not None

    def to_code(self, **kwargs: Any) -> str:
        if self.knobs is None:
            raise ValueError("nothing fits max_bytes: raise it or lower effective_batch")
        if self.result is not None and self.result.knobs == self.knobs:
            return self.result.to_code(**kwargs)  # the step the trial measured (its batch format and loss)
        return self.knobs.to_code(**kwargs)

    def __str__(self) -> str:
        head = (f"Fits {fmt_bytes(self.max_bytes)} at effective batch {self.effective_batch}: {self.knobs}"
                if self.fits else
                f"Nothing tried fits {fmt_bytes(self.max_bytes)} at effective batch {self.effective_batch}")
        cols = ["step", "change", "trial", "status", "peak", "fits", "samples_per_s", "time_cost"]
        with pd.option_context("display.width", 140, "display.max_colwidth", 50, "display.float_format", "{:,.2f}".format):
            body = self.steps[cols].to_string(index=False) if len(self.steps) else "(no trials)"
        spent = [f"budget: {self.spent}"] if self.spent is not None and self.spent.budget_s else []
        return "\n".join([head, "", body, *self.notes, *spent])

    def __repr__(self) -> str:
        return f"<FitResult fits={self.fits} knobs={self.knobs}>"

    def _repr_html_(self) -> str:
        return f"<pre>{html.escape(str(self))}</pre>"



def accum_options(effective_batch: int, min_micro_batch: int) -> Iterator[int]:
    """Accumulation counts that divide the effective batch exactly: 2, 4, 8, ... (then any divisor)."""
    seen = set()
    a = 2
    while effective_batch // a >= min_micro_batch and a <= effective_batch:
        if effective_batch % a == 0:
            seen.add(a)
            yield a
        a *= 2
    for a in range(3, effective_batch + 1):
        if a not in seen and effective_batch % a == 0 and effective_batch // a >= min_micro_batch:
            yield a
            return


def _first_knobs(bench: Bench, max_bytes: float, effective_batch: int, headroom: float, base: Knobs | None) -> Knobs:
    """Validate fit_memory's arguments; the first configuration: the whole batch at once, or
    accumulated from the start when the batch exceeds the dataset."""
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, (int, float)) or max_bytes <= 0:
        raise ValueError(f"max_bytes must be a positive number of bytes (e.g. 2 * 1024**3), got {max_bytes!r}")
    if isinstance(effective_batch, bool) or not isinstance(effective_batch, int) or effective_batch < 1:
        raise ValueError(f"effective_batch must be an int >= 1 (samples per optimizer step), got {effective_batch!r}")
    if isinstance(headroom, bool) or not isinstance(headroom, (int, float)) or not 0 <= headroom < 1:
        raise ValueError(f"headroom must be a share of max_bytes in [0, 1) (e.g. headroom=0.1), got {headroom!r}")
    spec = bench.workload.spec
    if not spec.iterable and effective_batch > len(spec) * 64:
        raise ValueError(f"effective_batch={effective_batch} is far beyond the dataset ({len(spec)} samples)")
    k = (base or bench.defaults).replace(batch_size=effective_batch, accum_steps=1)
    if not spec.iterable and k.batch_size > len(spec):
        # accumulate from the start: the micro-batch cannot exceed the dataset
        a = next((a for a in range(2, effective_batch + 1) if effective_batch % a == 0
                  and effective_batch // a <= len(spec)), effective_batch)
        k = k.replace(batch_size=effective_batch // a, accum_steps=a)
    return k


def _lower(r: TrialResult, than: TrialResult | None) -> bool:
    """r is usable and uses less memory than `than` (a failed `than` counts as infinite)."""
    if not r.ok or r.peak_memory_bytes is None:
        return r.status == "ok"
    return than is None or not than.ok or than.peak_memory_bytes is None or r.peak_memory_bytes < than.peak_memory_bytes


def _checkpoint_steps(bench: Bench, k: Knobs) -> Iterator[tuple[Knobs, str]]:
    """Knobs checkpointing 1, 2, ... of the blocks that save the most activations, heaviest first."""
    if not bench.workload.blocks:
        return
    order = [n for n, v in block_activation_bytes(bench.workload, k).items() if v > 0]
    for i in range(1, len(order) + 1):
        yield k.replace(checkpoint=tuple(order[:i])), f"checkpoint {i} heaviest block(s): {', '.join(order[:i])}"


class _OutOfTime(Exception):
    """A fit_memory trial did not fit the seconds left, or was stopped at its deadline (budget_s)."""


def renamed(fn: str, new: str, value: Any, old: dict[str, Any], old_name: str, hint: str = "") -> Any:
    """`value` of keyword `new`, or of its old name `old_name` (in `old`, the caller's **kwargs) with a
    FutureWarning for one release; TypeError for both at once or any other unknown keyword."""
    unknown = sorted(set(old) - {old_name})
    if unknown:
        raise TypeError(f"{fn}() got unexpected keyword argument(s) {unknown}")
    if old_name not in old:
        return value
    if value is not None:
        raise TypeError(f"pass {new}= only ({old_name}= is its old name)")
    warnings.warn(f"{fn}({old_name}=...) is now {fn}({new}=...){hint}; {old_name}= stops working in the next release",
                  FutureWarning, stacklevel=4)
    return old[old_name]


def max_bytes_of(max_bytes: int | None, old: dict[str, Any]) -> int:
    """`max_bytes`, or the old keyword `budget_bytes=` (FutureWarning); TypeError when neither is given."""
    max_bytes = renamed("fit_memory", "max_bytes", max_bytes, old, "budget_bytes")
    if max_bytes is None:
        raise TypeError("fit_memory() needs max_bytes: the most memory a trial may use, in bytes (e.g. 2 * 1024**3)")
    return max_bytes


def fit_memory(bench: Bench, max_bytes: int | None = None, effective_batch: int | None = None, *,
               base: Knobs | None = None, min_micro_batch: int | None = None, max_trials: int = 12,
               headroom: float = DEFAULT_HEADROOM, budget_s: float | None = None, **old: Any) -> FitResult:
    """The first configuration (in rescue order) whose measured peak fits `max_bytes`.

    Effective batch = batch_size x accum_steps stays `effective_batch` throughout. Order: as is →
    AMP → accumulation (micro-batch down to `min_micro_batch`, default effective_batch // 8) →
    checkpointing the blocks that save the most activations, one more block per trial. Each row
    reports the time cost vs the first trial that ran (per-sample time ratio, 1.25 = 25% slower).
    A configuration fits when its peak stays `headroom` (a share, default 10%) below max_bytes,
    so the answer does not sit on the OOM edge; headroom=0 fits up to max_bytes itself.
    `budget_s` caps the seconds (budget.py, as in tune()): the first trial runs whole, a later one only
    when its estimate fits the seconds left, under a deadline; the search then ends with a note, and
    `FitResult.spent` says how the seconds went.
    """
    max_bytes = max_bytes_of(max_bytes, old)
    if effective_batch is None:
        raise TypeError("fit_memory() needs effective_batch: samples per optimizer step (batch_size x accum_steps)")
    k = _first_knobs(bench, max_bytes, effective_batch, headroom, base)
    budget = Budget.of(budget_s, "fit_memory")  # validated once; its account is the result's
    limit = max_bytes * (1 - headroom)  # the peak a fitting configuration may reach
    rows: list[dict[str, Any]] = []  # one per trial run
    notes: list[str] = []
    ref: list[TrialResult] = []  # the first ok trial: time costs are relative to it

    def run(step: str, change: str, knobs: Knobs) -> TrialResult:
        r = budget.trial(bench.run, knobs, purpose="fit", label=change)
        if r is None or budget.stopped(r):  # not started, or stopped at the deadline: no evidence, the search ends
            raise _OutOfTime
        peak = r.peak_memory_bytes
        if r.ok and not ref:
            ref.append(r)
        cost = ref[0].samples_per_s / r.samples_per_s if r.ok and ref and r.samples_per_s else None
        rows.append({"step": step, "change": change, "trial": r.trial_id, "status": r.status,
                     "batch_size": knobs.batch_size, "accum_steps": knobs.accum_steps, "amp": knobs.amp,
                     "checkpoint": ",".join(knobs.checkpoint), "peak_bytes": peak, "peak": fmt_bytes(peak),
                     "fits": r.ok and peak is not None and peak <= limit, "samples_per_s": r.samples_per_s,
                     "time_cost": cost})
        return r

    if headroom:
        notes.append(f"fits = a peak at most {fmt_bytes(limit)}: {headroom:.0%} headroom below max_bytes")
    try:
        r, knobs = _rescue(bench, k, effective_batch, min_micro_batch or max(1, effective_batch // 8), max_trials,
                           run, limit, rows, notes)
    except _OutOfTime:
        notes.append(f"the seconds ran out (budget_s={budget.budget_s:g}) before a configuration fit: raise budget_s")
        r, knobs = None, None
    return FitResult(knobs, r, int(max_bytes), effective_batch, pd.DataFrame(rows), notes + budget.notes,
                     budget.spent)


def _rescue(bench: Bench, k: Knobs, effective_batch: int, min_micro: int, max_trials: int, run: Any, limit: float,
            rows: list[dict[str, Any]], notes: list[str]) -> tuple[TrialResult | None, Knobs | None]:
    """fit_memory's steps in rescue order through `run(step, change, knobs)`: the first (trial, knobs)
    whose peak stays at most `limit` bytes, else (None, None) with a note saying what to try."""

    def fits(r: TrialResult) -> bool:
        return r.ok and r.peak_memory_bytes is not None and r.peak_memory_bytes <= limit

    cur = run("start", "as is", k)
    if fits(cur):
        return cur, k

    # 1. AMP: activations in half precision
    if k.amp == "off" and len(rows) < max_trials:
        amp = "fp16" if bench._facts.type == "cuda" and not bench._facts.bf16 else "bf16"
        r = run("amp", f"amp={amp!r}", k.replace(amp=amp))
        if fits(r):
            return r, k.replace(amp=amp)
        if _lower(r, cur):
            k, cur = k.replace(amp=amp), r
        else:
            rows[-1]["step"] = "amp (no help, reverted)"
            notes.append(f"amp={amp!r} did not lower the peak here (on CPU autocast keeps fp32 weights and "
                         "often adds bf16 copies), so later steps run without it")

    # 2. accumulation: smaller micro-batches, same effective batch
    for a in accum_options(effective_batch, min_micro):
        if len(rows) >= max_trials or a <= k.accum_steps:
            continue
        knobs = k.replace(batch_size=effective_batch // a, accum_steps=a)
        r = run("accumulation", f"batch_size={knobs.batch_size} x accum_steps={a}", knobs)
        if fits(r):
            return r, knobs
        if _lower(r, cur):
            k, cur = knobs, r

    # 3. checkpoint the blocks that save the most activations, one more per trial
    for knobs, change in _checkpoint_steps(bench, k):
        if len(rows) >= max_trials:
            break
        r = run("checkpoint", change, knobs)
        if fits(r):
            return r, knobs
    if len(rows) >= max_trials:
        notes.append(f"stopped after max_trials={max_trials}")
    notes.append("nothing fits: raise max_bytes, lower effective_batch, or pass min_micro_batch=1 "
                 "to accumulate over smaller micro-batches")
    return None, None
