"""Guided tuning: candidates entered in the seeds' order, raced under noise, the winner confirmed.

`tune(bench, budget_s=...)` builds candidates stage by stage (data pipeline → precision → kernels
→ compile → batch size → DDP buckets): each stage's options, plausible cross-stage pairs (batch
size × layout, bf16 × layout, compile × batch size; workers × threads are one axis) and, after
each race, stacks of the leader with the near-misses (changes not shown slower than it).
Candidates are measured in alternating rounds; after every round any candidate shown slower
than the leader is dropped, so further trials go only to contenders (racing, as in F-Race/irace;
race.py). The race ends with the winner confirmed against the start, or "nothing beats the start".

This module holds the search space (`stage_axes`, the first race's entries, the stacks), the
result and `tune()` itself; race.py holds the rounds, the drops, the seconds budget and the confirmation.
Every trial goes through `bench.run`, so it lands in the results and the chart.
"""

from __future__ import annotations

import functools
import html
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from ..core.knobs import Knobs, tunable_knobs
from ..core.measure import TrialResult
from ..core.shapes import costly
from ..core.stepshape import StepShape
from ..core.system import available_allocators
from ..deciding.budget import EXPLAIN_PRIOR, Budget, Spend
from ..diagnose.data import DATA_WAIT_LIMIT
from ..diagnose.verdict import ALLOCATOR_SHARE
from ..results.protocol import Bench
from ..results.rules import ANSWERS
from ..results.stats import Comparison
from .fit import DEFAULT_HEADROOM, FitResult, fit_memory, memory_ceiling, renamed  # the memory rescue lives in fit.py
from .jobtime import expect_line, jobs_line
from .race import SAME_MARGIN, Ctx, Entry, admit, answer_of, confirm_winner, near_misses, race, settled

STAGES = ("process", "data", "precision", "kernels", "yours", "compile", "batch", "ddp")  # "yours": @wb.knob knobs with choices
DEFAULT_TRIALS = 24  # the trial cap when neither budget nor budget_s is given
PADDED = 0.3  # a start whose token batches are this much padding gets the length knobs first
MAX_GENERATIONS = 3  # races: singles and pairs, then stacks on the leader (twice)
BUCKET_SIZES_MB = (1, 5, 50, 100)  # DDP bucket sizes raced against torch's 25 MB default


# ---- the search space -------------------------------------------------------------------------
def _cores() -> int:
    from ..core.system import usable_cores

    return usable_cores()


def _bf16_worth_trying(device: torch.device) -> bool:
    """bf16 on CUDA with bf16 support, MPS, or a CPU with native bf16 units (else it is emulated)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        from ..core.system import cpu_has_bf16

        return cpu_has_bf16()
    return True


def _batch_limit(bench: Bench, max_batch_size: int | None) -> int | None:
    spec = bench.workload.spec
    limit = len(spec) if not spec.iterable else None
    if max_batch_size is not None:
        limit = min(limit, max_batch_size) if limit else max_batch_size
    return limit


# ==== CANDIDATES: the one place the tuner's knobs and their choices come from ====================
# Your own knobs (@wb.knob with choices) come from the registry in the "yours" stage: one axis per
# knob. The races, pairs, stacks and the sweep (benchmarks/_space.py) all follow this function.
def stage_axes(bench: Bench, stage: str, knobs: Knobs, max_batch_size: int | None = None,
               axes: tuple[str, ...] | None = None) -> list[tuple[str, list[dict[str, Any]]]]:
    """A stage's axes: (name, alternative changes relative to `knobs`), in the seeds' order.

    `axes` keeps only the named axes (e.g. ("workers", "layout", "batch")); None keeps all.

    Changes on one axis exclude each other; changes on different axes combine. Device-aware: no
    fp16 on CPU (a trap), bf16 only with native units, channels_last only with convolutions,
    pin_memory / matmul precision / CUDA-graph compile modes only on CUDA, buckets only under DDP.
    """
    dev, cores, keep, axes = bench.device, _cores(), axes, []
    if stage == "process" and faulting(bench, knobs) is not None:
        axes.append(("allocator", [{"allocator": m} for m in available_allocators()]))
    if stage == "data" and knobs.data == "loader":
        workers = []
        for w in sorted({max(1, cores // 2), cores}):  # half the cores first, leaving workers their cores
            threads = [max(1, cores - w), cores] if dev.type == "cpu" else [None]
            workers += [{"num_workers": w, "persistent_workers": True, "cpu_threads": t} for t in dict.fromkeys(threads)]
        if dev.type == "cpu" and cores > 1:
            workers.append({"cpu_threads": max(1, cores // 2)})  # fewer intra-op threads, no workers
        axes += [("workers", workers), ("prefetch", [{"prefetch_factor": 4}])]
        if dev.type == "cuda":
            axes.append(("pin", [{"pin_memory": True}]))
        if getattr(bench.workload, "token_data", False):  # how token batches are padded: the length knobs
            length = [{"group_by_length": True}]
            if "position_ids" in getattr(bench.workload, "forward_params", ()):
                length.append({"packing": True})
            pads = [{"pad_to_multiple_of": 64}, {"pad_to_multiple_of": 8}] if shapes_costly(bench, knobs) \
                else [{"pad_to_multiple_of": 8}]  # costly first calls: a coarse multiple leaves few shapes
            axes += [("length", length), ("pad", pads)]
    elif stage == "precision":
        if dev.type == "cuda" and not _bf16_worth_trying(dev):
            axes.append(("amp", [{"amp": "fp16"}]))
        elif _bf16_worth_trying(dev):
            axes.append(("amp", [{"amp": "bf16"}]))
        if bench.workload.has_conv:
            axes.append(("layout", [{"channels_last": True}]))
        if dev.type == "cuda":
            axes.append(("matmul", [{"matmul_precision": "high"}]))
    elif stage == "kernels":
        axes.append(("optimizer", [{"optimizer_impl": "foreach"}, {"optimizer_impl": "fused"}]))
        if knobs.checkpoint:
            axes.append(("checkpoint_mode", [{"checkpoint_mode": "selective"}]))
    elif stage == "compile":
        modes = ("default", "max-autotune", "reduce-overhead") if dev.type == "cuda" else ("default",)
        axes.append(("compile", [{"compile": m} for m in modes]))
    elif stage == "batch":
        limit, bs = _batch_limit(bench, max_batch_size), knobs.batch_size
        sizes = [s for s in (2 * bs, 4 * bs, bs // 2) if s >= 1 and (limit is None or s <= limit)]
        axes.append(("batch", [{"batch_size": s} for s in sizes]))
    elif stage == "ddp" and knobs.world_size > 1:
        axes.append(("bucket", [{"ddp_bucket_cap_mb": mb} for mb in BUCKET_SIZES_MB]))
    elif stage == "yours":
        axes += [(name, [{name: c} for c in choices]) for name, choices in tunable_knobs().items()]
    out = []
    for name, changes in axes:
        valid = [c for c in changes if _valid(knobs, c)]
        if valid and (keep is None or name in keep):
            out.append((name, valid))
    return out


PAIRS = (("batch", "layout"), ("batch", "amp"), ("layout", "amp"), ("batch", "compile"))  # plausible interactions


def _valid(knobs: Knobs, change: dict[str, Any]) -> bool:
    try:
        return knobs.replace(**change) != knobs
    except (ValueError, TypeError):
        return False


def stage_options(bench: Bench, stage: str, knobs: Knobs) -> list[dict[str, Any]]:
    """Candidate changes for one stage, relative to `knobs`, in the order they enter the race."""
    return [c for _name, changes in stage_axes(bench, stage, knobs) for c in changes]


# ---- the result types ---------------------------------------------------------------------------
@dataclass
class TuneResult:
    """The best Knobs found, its trial, the path taken (one row per trial) and the final answer."""

    best_knobs: Knobs
    best: TrialResult
    start: TrialResult
    steps: pd.DataFrame
    trials_used: int
    n_trials: int  # the trial cap the search ran under
    answer: str = "undecided"  # the best vs the start: faster | same | undecided (ANSWERS)
    confirmation: Comparison | None = None  # the comparison behind `answer`
    seconds: float = 0.0
    budget_s: float | None = None
    explanation: Any = None  # the winner explained against the start (bench.explain); None when the start won
    spent: Spend | None = None  # how the seconds went: race, confirm, explain; trials kept out or stopped by the budget
    jobs: tuple[str, ...] = ()  # on an executor: the wall time said before the first trial, then its jobs' queue and start-up

    @property
    def speedup(self) -> float | None:
        """Best vs start throughput (the confirmation's ratio when there is one); 1.0 when the start
        is kept (two trials of the start differ by noise, not by a change)."""
        if self.best_knobs == self.start.knobs:
            return 1.0
        if self.confirmation is not None:
            return self.confirmation.speedup
        if self.start.tokens_per_s and self.best.tokens_per_s:  # token batches: tokens/s (padding, packing)
            return self.best.tokens_per_s / self.start.tokens_per_s
        if not self.start.samples_per_s or not self.best.samples_per_s:
            return None
        return self.best.samples_per_s / self.start.samples_per_s

    def to_code(self, **kwargs: Any) -> str:
        """The tuned training loop: the best knobs, on the step the trials measured (TrialResult.to_code)."""
        trial = self.best if self.best is not None and self.best.knobs == self.best_knobs else self.start
        kwargs.setdefault("shape", StepShape.from_record(trial.extra.get("step")))
        return self.best_knobs.to_code(**kwargs)

    def _head(self) -> str:
        sp = f"{self.speedup:.2f}x" if self.speedup else "n/a"
        budget = f"{self.trials_used} trials, {self.seconds:.0f} s" + (f" of {self.budget_s:.0f} s" if self.budget_s else "")
        verdict = f" ({self.confirmation})" if self.confirmation is not None else ""
        spent = f"\n  budget: {self.spent}" if self.spent is not None and self.budget_s else ""
        jobs = "".join(f"\n  jobs: {line}" for line in self.jobs[1:])
        return f"Tuned in {budget}: {self.best_knobs}\n  {sp} vs the start; answer: {self.answer}{verdict}{spent}{jobs}"

    def __str__(self) -> str:
        cols = ["stage", "change", "trial", "samples_per_s", "speedup", "decision"]
        with pd.option_context("display.width", 160, "display.max_colwidth", 70, "display.float_format", "{:,.2f}".format):
            table = self.steps[cols].to_string(index=False)
        why = f"\n\n{self.explanation}" if self.explanation is not None else ""
        return self._head() + "\n\n" + table + why

    def __repr__(self) -> str:
        return f"<TuneResult best={self.best_knobs} answer={self.answer} trials={self.trials_used}>"

    def _repr_html_(self) -> str:
        return (f"<pre>{html.escape(self._head())}</pre><p><code>result.to_code()</code> prints the training loop.</p>"
                + self.steps.to_html(index=False, float_format="{:,.2f}".format, border=0))


# ---- the races' entries -------------------------------------------------------------------------
def _first_entries(axes_of: Callable[..., Any], k0: Knobs, stages: tuple[str, ...],
                   lead: tuple[str, ...] = ()) -> list[Entry]:
    """The first race's candidates in entry order: every option of the `lead` axes (those the
    bottleneck names), then each axis's first (the seeds' preferred) option, stage by stage; then
    cross-stage pairs, preferred options first; then the other alternatives."""
    axes: dict[str, tuple[str, list[dict[str, Any]]]] = {}
    for stage in stages:
        for name, changes in axes_of(stage, k0):
            axes[name] = (stage, changes)
    led = [Entry.of(stage, k0, c) for name, (stage, changes) in axes.items() if name in lead for c in changes]
    axes = {name: v for name, v in axes.items() if name not in lead}
    first = led + [Entry.of(stage, k0, changes[0]) for stage, changes in axes.values()]
    pairs = []
    for x, y in PAIRS:
        for i, cx in enumerate(axes.get(x, ("", []))[1]):
            for j, cy in enumerate(axes.get(y, ("", []))[1]):
                if _valid(k0, {**cx, **cy}):
                    pairs.append((i + j, Entry.of(f"pair: {x} x {y}", k0, {**cx, **cy})))
    rest = [Entry.of(stage, k0, c) for stage, changes in axes.values() for c in changes[1:]]
    return first + [e for _rank, e in sorted(pairs, key=lambda p: p[0])] + rest


NEAR_MISSES = 6  # the best near-misses stacked pairwise on the leader


def _stacks(axes_of: Callable[..., Any], k0: Knobs, leader: Entry, near: list[Entry],
            stages: tuple[str, ...]) -> list[Entry]:
    """The next race's candidates: the leader with each near-miss, with pairs of them and with all of
    them; then options that only became possible on the leader (prefetch once there are workers)."""
    near = sorted(near, key=lambda e: e.mean, reverse=True)[:NEAR_MISSES]
    changes = [{**leader.change, **e.change} for e in near]
    changes += [{**leader.change, **a.change, **b.change} for i, a in enumerate(near) for b in near[i + 1:]
                if not set(a.change) & set(b.change)]
    together: dict[str, Any] = dict(leader.change)
    for e in near:
        if not set(e.change) & (set(together) - set(leader.change)):
            together.update(e.change)
    changes.append(together)
    out = [Entry.of("stack", k0, c) for c in changes if _valid(k0, c)]
    for stage in stages:
        if stage in ("data", "batch"):
            for _name, options in axes_of(stage, leader.knobs):
                out += [Entry.of(f"{stage}, on the leader", k0, {**leader.change, **c}) for c in options
                        if not _valid(k0, c) or stage == "batch"]
    return out


def _on_leader(k0: Knobs, leader: Entry, waiting: list[Entry]) -> list[Entry]:
    """The candidates an earlier race had no budget for, each applied on top of the leader (those that
    change a knob the leader already changed are left out: the race chose the leader's value)."""
    out = []
    for e in waiting:
        if set(e.change) & set(leader.change):
            continue
        change = {**leader.change, **e.change}
        if _valid(k0, change):
            out.append(Entry.of(f"{e.stage}, on the leader" if leader.change else e.stage, k0, change))
    return out


# ---- tune: the start, races, confirmation, explanation ------------------------------------------
def _explain(ctx: Ctx, start: TrialResult, best: TrialResult) -> Any:
    """The winner explained against the start, inside the budget: a side without a trace costs one
    traced repeat, counted in trials_used; when the budget cannot pay for them, no explanation."""
    from ..diagnose.explain import explain_winner, has_trace  # analysis beside tune; imported only for a winner

    need = sum(not has_trace(t) for t in (start, best))
    fits = all(ctx.budget.fits_trial(t.knobs, EXPLAIN_PRIOR * need) for t in (start, best) if not has_trace(t))
    if need > ctx.affordable() or not fits:
        ctx.rows.append({"stage": "explain", "change": "", "trial": None, "samples_per_s": None, "speedup": None,
                         "decision": f"not explained: its {need} traced repeat(s) would pass the budget "
                                    "(bench.explain(start, best) runs them)"})
        return None
    before = len(ctx.bench.trials)
    with ctx.budget.charge("explain"):
        why = explain_winner(ctx.bench, start, best)
    ctx.used += len(ctx.bench.trials) - before  # the traced repeats are trials of this tune() call
    return why


def faulting(bench: Bench, knobs: Knobs) -> float | None:
    """The page-fault share of CPU time of the latest one-process CPU trial of `knobs` when above the
    diagnosis's ALLOCATOR_SHARE (the allocator is then raced first, each mode in a fresh process)."""
    if bench.device.type != "cpu" or knobs.world_size > 1 or knobs.allocator is not None:
        return None
    last = next((r for r in reversed(bench.trials) if r.ok and r.knobs == knobs), None)
    share = last.extra.get("kernel_share") if last is not None else None
    return share if share is not None and share > ALLOCATOR_SHARE else None


def shapes_costly(bench: Bench, knobs: Knobs) -> bool:
    """Whether the latest ok trial of `knobs` on token data paid more than shapes.COSTLY_STEPS steady steps per
    input shape on its first calls (plans, autotune, recompiles): pad_to_multiple_of then enters first."""
    if not getattr(bench.workload, "token_data", False):
        return False
    last = next((r for r in reversed(bench.trials) if r.ok and r.knobs == knobs), None)
    return last is not None and costly(last.extra.get("shapes"), last.step_time_s)


def _lead(ctx: Ctx, start: TrialResult) -> tuple[str, ...]:
    """The axes the start's bottleneck names, entered first, and a row saying why (data-bound: workers;
    page faults over ALLOCATOR_SHARE of the CPU time: the allocator modes, before the compute knobs; input
    shapes whose first calls cost more than a few steps each: pad_to_multiple_of; token batches mostly
    padding: the length knobs)."""
    share = faulting(ctx.bench, start.knobs)
    if share is not None:
        return _entered_first(ctx, "process", "every allocator mode", ("allocator",),
                              f"page faults took {share:.0%} of the start's CPU time; each allocator mode runs "
                              "in a fresh process, alternating, before the compute knobs")
    if shapes_costly(ctx.bench, start.knobs):
        info = start.extra["shapes"]
        per = info["per_shape_s"]
        return _entered_first(ctx, "data", "pad_to_multiple_of", ("pad",),
                              f"each of the start's {info['distinct']} input shapes cost ≈{per * 1e3:,.0f} ms on its "
                              f"first call ({per / start.step_time_s:,.0f} steps; a real run pays it once per shape in "
                              "the data): padding to a multiple leaves fewer shapes, before the other knobs")
    padding = start.padding_share or 0.0
    if padding >= PADDED:
        return _entered_first(ctx, "data", "length grouping and packing", ("length",),
                              f"{padding:.0%} of the start's token slots are padding: group_by_length and "
                              "packing before workers, precision or kernels")
    # the loader's part of the data wait (the copy's own cost apart: workers do not speed up the copy);
    # on CUDA the device's idle time while the host loaded: a loader hidden under queued kernels is none
    # (core/measure.py, CopyClock)
    wait = max(0.0, (start.data_wait_share or 0.0) - (start.copy_share or 0.0))
    if wait >= DATA_WAIT_LIMIT:  # data-bound by diagnose's rule: every worker option enters first
        return _entered_first(ctx, "data", "every worker count", ("workers",),
                              f"the start waits for data {wait:.0%} of its window: worker counts (with compute "
                              "threads) before precision or kernels")
    return ()


def _entered_first(ctx: Ctx, stage: str, change: str, axes: tuple[str, ...], why: str) -> tuple[str, ...]:
    """The row saying why `axes` enter the first race first; returns them."""
    ctx.rows.append({"stage": stage, "change": change, "trial": None, "samples_per_s": None, "speedup": None,
                     "decision": f"entered first: {why}"})
    return axes


def _check(n_trials: int | None, budget: Budget, stages: tuple[str, ...], max_bytes: int | None,
           headroom: float) -> int:
    """Validate tune()'s arguments; returns the trial cap."""
    if n_trials is not None and (not isinstance(n_trials, int) or isinstance(n_trials, bool) or n_trials < 2):
        raise ValueError(f"n_trials must be an int >= 2 (a cap on trials, the start included), got {n_trials!r}")
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        raise ValueError(f"unknown stage(s) {unknown}; choose from {STAGES}")
    if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0):
        raise ValueError(f"max_bytes must be a positive number of bytes, got {max_bytes!r}")
    if isinstance(headroom, bool) or not isinstance(headroom, (int, float)) or not 0 <= headroom < 1:
        raise ValueError(f"headroom must be a share of memory in [0, 1) (e.g. headroom=0.1), got {headroom!r}")
    return n_trials if n_trials is not None else (DEFAULT_TRIALS if budget.budget_s is None else 10_000)


def n_trials_of(n_trials: int | None, old: dict[str, Any]) -> int | None:
    """`n_trials`, or the old keyword `budget=` (a trial count) with a FutureWarning."""
    return renamed("tune", "n_trials", n_trials, old, "budget", " (a cap on trials; seconds are budget_s)")


def _check_parallel(bench: Bench, parallel: object) -> None:
    """ValueError unless `parallel` is a whole number >= 1, and > 1 only with an executor (jobs)."""
    if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
        raise ValueError(f"parallel must be a whole number of jobs >= 1, got {parallel!r}")
    if parallel > 1 and getattr(bench, "executor", None) is None:
        raise ValueError(f"parallel={parallel} keeps several jobs in flight, which needs an executor: "
                         "Workbench(..., executor=submitit.AutoExecutor(folder, cluster='slurm')); trials in "
                         "this process run one at a time")


def tune(bench: Bench, n_trials: int | None = None, *, budget_s: float | None = None, start: Knobs | None = None,
         max_bytes: int | None = None, stages: tuple[str, ...] = STAGES, max_batch_size: int | None = None,
         headroom: float = DEFAULT_HEADROOM, axes: tuple[str, ...] | None = None, confirm: bool = True,
         explain: bool = True, stop_early: bool = True, parallel: int = 1, **old: Any) -> TuneResult:
    """Race candidates under noise within `budget_s` seconds (and `n_trials` trials); returns the best.

    The first race holds the start, each stage's options and cross-stage pairs; later races stack
    the leader with its near-misses. The winner is kept only when it is faster than the start
    (`TuneResult.answer` is "faster"). `max_bytes` rejects configurations whose peak memory is over it
    (`memory_budget=` is its old name: FutureWarning);
    `headroom` keeps every trial that share below the memory ceiling (no batch on the OOM edge).
    `axes` narrows the space to named axes (see `stage_axes`). `confirm=False` skips the extra confirmation rounds (the race's own rounds still decide).
    `explain=True` explains a winner against the start from traced steps (up to two traced repeats after the search).
    `budget_s` is a cap (budget.py): a trial starts only when its estimate (from this search's trials of
    the most similar configuration) fits the seconds left, a running one is stopped at the deadline
    (recorded as stopped by the budget, never evidence); `TuneResult.spent` says how the seconds went.
    `stop_early=False` runs every trial's whole window (by default a trial far slower than the baseline
    stops after a few steps, earlystop.py).
    `parallel=N` (a Workbench with an executor, docs/cluster.md) keeps up to N jobs in flight in each race
    round; the path's `node` column says which node measured each trial.
    """
    max_bytes = renamed("tune", "max_bytes", max_bytes, {k: old.pop(k) for k in ("memory_budget",) if k in old},
                        "memory_budget", " (peak memory in bytes)")
    n_trials = n_trials_of(n_trials, old)
    budget = Budget.of(budget_s, "tune")  # the one budget of this call: its race and confirmation spend it
    limit = _check(n_trials, budget, stages, max_bytes, headroom)
    _check_parallel(bench, parallel)
    ceiling = memory_ceiling(bench, max_bytes)
    ctx = Ctx(bench, limit, budget, None if ceiling is None else ceiling * (1 - headroom), max_bytes,
              stop_early=stop_early, parallel=parallel)
    said = _say_wall_time(bench, budget.budget_s, parallel)
    k0 = start or bench.defaults
    ctx.start = first = Entry("start", "the start", k0)
    ctx.purpose = "start"
    r = ctx.run(k0)
    assert r is not None  # the start always runs
    ctx.purpose = "race"
    ctx.row(first, r, "start" if r.ok else f"start failed: {r.status}")
    if not r.ok:
        return TuneResult(k0, r, r, pd.DataFrame(ctx.rows), ctx.used, limit, "undecided", None, budget.elapsed(),
                          budget.budget_s, spent=budget.spent, jobs=_jobs_after(bench, said))
    if not budget.fits_trial(k0):
        ctx.rows.append({"stage": "budget", "change": "", "trial": None, "samples_per_s": None, "speedup": None,
                         "decision": f"the start alone took {budget.elapsed():.1f} s of budget_s={budget.budget_s:g}: no other "
                                     "trial fits; raise budget_s to tune"})
    first.trials.append(r)
    seen, leader = {k0}, first
    axes_of = functools.partial(stage_axes, bench, max_batch_size=max_batch_size, axes=axes)
    lead = _lead(ctx, r)
    cands = _first_entries(axes_of, k0, stages, lead)
    rivals: list[Entry] = []
    leaders: list[Entry] = []
    waiting: list[Entry] = []  # candidates a race had no budget for: offered again, on the next leader
    for _gen in range(MAX_GENERATIONS):
        carried = [first] if leader is first else [first, leader]
        rested = tuple(e for e in carried if len(e.trials) >= 2) if leaders else ()
        new = admit(ctx, cands, seen, len(carried) - len(rested), not leaders, waiting)
        if not new:
            break
        entries = carried + new
        leader = race(ctx, entries, rested=rested)
        leaders.append(leader)
        rivals = [e for e in entries if e.trials and e is not leader and e is not first]
        cands = _stacks(axes_of, k0, leader, near_misses(ctx, entries, leader), stages) + _on_leader(k0, leader, waiting)
        waiting = []
    rivals = [e for e in rivals if e is not first]
    leader = settled(ctx, leader, leaders)
    if confirm:
        answer, c = confirm_winner(ctx, leader, rivals)
    else:
        answer, c = answer_of(first.trials, leader.trials, log=bench.log) if leader is not first else ("same", None)
    best = leader if answer == "faster" else first
    why = _explain(ctx, r, best.trials[-1]) if explain and best is not first and hasattr(bench, "explain") else None
    return TuneResult(best.knobs, best.trials[-1], r, pd.DataFrame(ctx.rows), ctx.used, limit, answer, c,
                      budget.elapsed(), budget.budget_s, why, budget.spent, _jobs_after(bench, said))


def _say_wall_time(bench: Bench, budget_s: float | None, parallel: int) -> tuple[str, int] | None:
    """On an executor: print, before the first trial, the wall time to expect (jobtime.expect_line,
    from this workbench's jobs so far); (that line, the trial count it was said at)."""
    if getattr(bench, "executor", None) is None:
        return None
    trials = list(getattr(bench, "trials", []))
    line = expect_line(trials, budget_s, parallel)
    print(line)
    return line, len(trials)


def _jobs_after(bench: Bench, said: tuple[str, int] | None) -> tuple[str, ...]:
    """The line said before, and how this call's jobs' queue wait and start-up went (apart)."""
    if said is None:
        return ()
    after = jobs_line(list(getattr(bench, "trials", []))[said[1]:])
    return (said[0], after) if after else (said[0],)


__all__ = ["ANSWERS", "PAIRS", "SAME_MARGIN", "STAGES", "FitResult", "TuneResult", "fit_memory", "stage_axes", "stage_options", "tune"]
