"""Guided tuning: a greedy search in the seeds' order, and fitting a memory budget.

`tune(bench)` walks data pipeline → precision → compile → batch size, trying one change at a time
against the incumbent and keeping it only when it wins beyond noise *twice*: once against the
incumbent's last measurement, then again in a fresh incumbent/candidate pair run back to back
(paired confirmation, so a burst of load from another process cannot crown a winner).

`fit_memory(bench, budget, effective_batch)` walks the memory rescue order: AMP → gradient
accumulation → checkpointing the blocks that save the most activations, reporting what each step
costs in time. Every trial goes through `bench.run`, so it lands in the results and the chart.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from .fit import FitResult, fit_memory  # the memory rescue lives in fit.py
from .knobs import Knobs
from .measure import TrialResult, fmt_bytes
from .results import compare

STAGES = ("data", "precision", "compile", "batch")
BATCH_GROWTH_LIMIT = 0.8  # never try a batch whose predicted peak exceeds this share of free memory


# ---- the search space -------------------------------------------------------------------------
def _cores() -> int:
    from .diagnose.threads import usable_cores

    return usable_cores()


def _bf16_worth_trying(device: torch.device) -> bool:
    """bf16 on CUDA with bf16 support, MPS, or a CPU with native bf16 units (else it is emulated)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        from .diagnose.threads import cpu_has_bf16

        return cpu_has_bf16()
    return True


def stage_options(bench: Any, stage: str, knobs: Knobs) -> list[dict[str, Any]]:
    """Candidate changes for one stage, relative to `knobs`, in the order they are tried.

    Device-aware pruning: no fp16 on CPU (a trap there), no bf16 where it is emulated, no
    channels_last without convolutions, no pin_memory without an accelerator.
    """
    device = bench.device
    out: list[dict[str, Any]] = []
    if stage == "data" and knobs.data == "loader":
        cores = _cores()
        for w in sorted({max(1, cores // 2), cores}):  # start at half the cores (seed advice)
            change: dict[str, Any] = {"num_workers": w, "persistent_workers": True}
            if device.type == "cpu":
                change["cpu_threads"] = max(1, cores - w)  # leave the workers their cores
            out.append(change)
        out.append({"prefetch_factor": 4})
        if device.type == "cuda":
            out.append({"pin_memory": True})
    elif stage == "precision":
        if device.type == "cuda" and not _bf16_worth_trying(device):
            out.append({"amp": "fp16"})
        elif _bf16_worth_trying(device):
            out.append({"amp": "bf16"})
        if bench.workload.has_conv:
            out.append({"channels_last": True})
        if device.type == "cuda":
            out.append({"matmul_precision": "high"})
    elif stage == "compile":
        out.append({"compile": "default"})
    # keep only changes that are valid and actually change something
    valid = []
    for change in out:
        try:
            k = knobs.replace(**change)
        except (ValueError, TypeError):
            continue
        if k != knobs:
            valid.append(change)
    return valid


def _predicted_peak(result: TrialResult, factor: float) -> float | None:
    """Peak memory if the batch grows by `factor`: the whole peak scaled (a safe over-estimate)."""
    return None if result.peak_memory_bytes is None else result.peak_memory_bytes * factor


def _memory_ceiling(bench: Any, memory_budget: int | None) -> float | None:
    """The most memory a trial may use: the caller's budget, else most of the free device memory."""
    if memory_budget is not None:
        return float(memory_budget)
    if bench.device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(bench.device)
        return BATCH_GROWTH_LIMIT * free
    try:
        import psutil

        return BATCH_GROWTH_LIMIT * psutil.virtual_memory().available
    except ImportError:
        return None


# ---- the result types ---------------------------------------------------------------------------
@dataclass
class TuneResult:
    """The best Knobs found, its trial, and the path taken (one row per trial the tuner ran)."""

    best_knobs: Knobs
    best: TrialResult
    start: TrialResult
    steps: pd.DataFrame
    trials_used: int
    budget: int

    @property
    def speedup(self) -> float | None:
        """Best vs start throughput (different trials, so read it with the path's verdicts)."""
        if not self.start.samples_per_s or not self.best.samples_per_s:
            return None
        return self.best.samples_per_s / self.start.samples_per_s

    def to_code(self, **kwargs: Any) -> str:
        return self.best_knobs.to_code(**kwargs)

    def __str__(self) -> str:
        sp = f"{self.speedup:.2f}x" if self.speedup else "n/a"
        head = (f"Tuned in {self.trials_used}/{self.budget} trials: {self.best_knobs}\n"
                f"  {self.best.samples_per_s or 0:,.1f} samples/s vs {self.start.samples_per_s or 0:,.1f} "
                f"at the start ({sp}; trial #{self.best.trial_id} vs #{self.start.trial_id})")
        cols = ["stage", "change", "trial", "samples_per_s", "speedup", "decision"]
        with pd.option_context("display.width", 140, "display.max_colwidth", 60, "display.float_format", "{:,.2f}".format):
            return head + "\n\n" + self.steps[cols].to_string(index=False)

    def __repr__(self) -> str:
        return f"<TuneResult best={self.best_knobs} trials={self.trials_used}/{self.budget}>"

    def _repr_html_(self) -> str:
        sp = f"{self.speedup:.2f}×" if self.speedup else "n/a"
        return (f"<h3>Tuned: {html.escape(str(self.best_knobs))}</h3><p>{self.best.samples_per_s or 0:,.1f} samples/s "
                f"vs {self.start.samples_per_s or 0:,.1f} at the start ({sp}); {self.trials_used} of "
                f"{self.budget} trials. <code>result.to_code()</code> prints the training loop.</p>"
                + self.steps.to_html(index=False, float_format="{:,.2f}".format, border=0))


# ---- tune ---------------------------------------------------------------------------------------
class _Budget:
    """Counts the trials the tuner runs (each one goes through bench.run)."""

    def __init__(self, bench: Any, limit: int) -> None:
        self.bench, self.limit, self.used = bench, limit, 0

    @property
    def left(self) -> int:
        return self.limit - self.used

    def run(self, knobs: Knobs) -> TrialResult:
        self.used += 1
        return self.bench.run(knobs)


def _wins(a: TrialResult, b: TrialResult) -> tuple[bool, float | None, str]:
    """(b beats a beyond noise, speedup, verdict text)."""
    if not (a.ok and b.ok) or len(a.step_times_s) < 2 or len(b.step_times_s) < 2:
        return False, None, "not comparable"
    c = compare(a, b)
    return c.beyond_noise and c.speedup > 1, c.speedup, c.verdict


def _label(change: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in change.items())


def tune(bench: Any, budget: int = 12, *, start: Knobs | None = None, memory_budget: int | None = None,
         stages: tuple[str, ...] = STAGES, confirm: bool = True, max_batch_size: int | None = None) -> TuneResult:
    """Greedy search; returns the best Knobs, its trial and the path taken.

    `budget` counts trials (the start, candidates and confirmations). `memory_budget` (bytes)
    rejects any configuration whose peak exceeds it. `stages` picks and orders the stages.
    """
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 2:
        raise ValueError(f"budget must be an int >= 2 (trials, including the starting point), got {budget!r}")
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        raise ValueError(f"unknown stage(s) {unknown}; choose from {STAGES}")
    if memory_budget is not None and (not isinstance(memory_budget, int) or memory_budget <= 0):
        raise ValueError(f"memory_budget must be a positive number of bytes, got {memory_budget!r}")
    b = _Budget(bench, budget)
    k = start or bench.defaults
    rows: list[dict[str, Any]] = []
    inc = b.run(k)
    rows.append({"stage": "start", "change": "", "trial": inc.trial_id, "samples_per_s": inc.samples_per_s,
                 "speedup": None, "decision": "start" if inc.ok else f"start failed: {inc.status}"})
    if not inc.ok:
        return TuneResult(k, inc, inc, pd.DataFrame(rows), b.used, budget)
    start_result = inc
    ceiling = _memory_ceiling(bench, memory_budget)

    def over_memory(r: TrialResult) -> bool:
        return memory_budget is not None and r.peak_memory_bytes is not None and r.peak_memory_bytes > memory_budget

    def attempt(stage: str, change: dict[str, Any]) -> str:
        """Try one change against the incumbent; returns the decision (and updates k/inc on a win)."""
        nonlocal k, inc
        cand_k = k.replace(**change)
        r = b.run(cand_k)
        row = {"stage": stage, "change": _label(change), "trial": r.trial_id, "samples_per_s": r.samples_per_s,
               "speedup": None, "decision": ""}
        rows.append(row)
        if not r.ok:
            row["decision"] = f"rejected: {r.status}"
            return "failed"
        if over_memory(r):
            row["decision"] = f"rejected: peak {fmt_bytes(r.peak_memory_bytes)} over the memory budget"
            return "over"
        won, speed, verdict = _wins(inc, r)
        row["speedup"] = speed
        if not won:
            row["decision"] = f"rejected ({verdict})"
            return "lost"
        if not confirm:
            row["decision"] = "kept"
            k, inc = cand_k, r
            return "won"
        if b.left < 2:
            row["decision"] = "won once; no budget left to confirm, not kept"
            return "lost"
        inc2 = b.run(k)  # paired confirmation: incumbent and candidate back to back
        r2 = b.run(cand_k)
        won2, speed2, verdict2 = _wins(inc2, r2)
        rows.append({"stage": stage, "change": f"confirm: {_label(change)}", "trial": r2.trial_id,
                     "samples_per_s": r2.samples_per_s, "speedup": speed2,
                     "decision": f"confirmed vs #{inc2.trial_id}" if won2 else f"not confirmed vs #{inc2.trial_id} ({verdict2})"})
        if won2:
            row["decision"] = "kept"
            k, inc = cand_k, r2
            return "won"
        row["decision"] = "rejected after confirmation"
        if inc2.ok:
            inc = inc2  # the fresher measurement of the incumbent is the better reference
        return "lost"

    for stage in stages:
        if stage == "batch":
            _tune_batch(bench, b, attempt, lambda: (k, inc), ceiling, max_batch_size)
            continue
        for change in stage_options(bench, stage, k):
            if b.left < 1:
                break
            if k.replace(**change) == k:
                continue  # an earlier win already made this change
            attempt(stage, change)
    return TuneResult(k, inc, start_result, pd.DataFrame(rows), b.used, budget)


def _tune_batch(bench: Any, b: _Budget, attempt: Any, current: Any, ceiling: float | None,
                max_batch_size: int | None) -> None:
    """Batch size for throughput: double while it wins and is predicted to fit; else try half.

    OOM-safe: a doubling whose predicted peak (today's peak x 2) exceeds the memory ceiling is not
    run at all, and a trial that does run out of memory ends the upward search.
    """
    spec = bench.workload.spec
    limit = len(spec) if not spec.iterable else None
    if max_batch_size is not None:
        limit = min(limit, max_batch_size) if limit else max_batch_size
    grew = False
    while b.left >= 1:
        k, inc = current()
        nxt = k.batch_size * 2
        if limit is not None and nxt > limit:
            break
        predicted = _predicted_peak(inc, 2.0)
        if ceiling is not None and predicted is not None and predicted > ceiling:
            break
        if attempt("batch", {"batch_size": nxt}) != "won":
            break
        grew = True
    k, _ = current()
    if not grew and b.left >= 1 and k.batch_size >= 2:
        attempt("batch", {"batch_size": k.batch_size // 2})


# ---- fit_memory -----------------------------------------------------------------------------------
__all__ = ["STAGES", "FitResult", "TuneResult", "fit_memory", "stage_options", "tune"]
