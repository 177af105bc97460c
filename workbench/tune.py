"""Guided tuning: candidates entered in the seeds' order, raced under noise, the winner confirmed.

`tune(bench, budget_s=...)` builds candidates stage by stage (data pipeline → precision → kernels
→ compile → batch size → DDP buckets): each stage's options, plausible cross-stage pairs (batch
size × layout, bf16 × layout, compile × batch size; workers × threads are one axis) and, after
each race, stacks of the leader with the near-misses (changes that stayed within noise of it).
Candidates are measured in alternating rounds; after every round any candidate beyond noise slower
than the leader is dropped, so further trials go only to contenders (racing, as in F-Race/irace).
The race ends with the winner confirmed against the start, or "nothing beats the start".

Every decision goes through `_answer`, one adapter over `compare` (the same function as
`bench.compare`), which maps a comparison to faster / slower / same / undecided. Every trial goes
through `bench.run`, so it lands in the results and the chart.
"""

from __future__ import annotations

import functools
import html
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch

from .budget import DEADLINE, EXPLAIN_PRIOR, Spend, check_budget_s
from .comparison import Trials
from .fit import DEFAULT_HEADROOM, FitResult, fit_memory, memory_ceiling  # the memory rescue lives in fit.py
from .knobs import Knobs, tunable_knobs
from .measure import TrialResult, fmt_bytes
from .protocol import Bench
from .resultlog import ResultLog
from .rounds import compare
from .stats import Comparison
from .stepshape import StepShape

STAGES = ("data", "precision", "kernels", "yours", "compile", "batch", "ddp")  # "yours": @wb.knob knobs with choices
SAME_MARGIN = 0.05  # "same speed": the interval of the ratio lies within ±5%
ANSWERS = ("faster", "slower", "same", "undecided")
DEFAULT_TRIALS = 24  # the trial cap when neither budget nor budget_s is given
MAX_ROUNDS = 4  # alternating rounds per race
CONFIRM_ROUNDS = 4  # at most this many extra alternating rounds settle the winner against the start
MAX_GENERATIONS = 3  # races: singles and pairs, then stacks on the leader (twice)
BUCKET_SIZES_MB = (1, 5, 50, 100)  # DDP bucket sizes raced against torch's 25 MB default


# ---- the one decision adapter -------------------------------------------------------------------
def _answer(a: Trials, b: Trials, *, rounds: int = 0, run: Callable[[Knobs], TrialResult] | None = None,
            log: ResultLog | None = None) -> tuple[str, Comparison]:
    """B against A as one of ANSWERS; the ONE place tune() turns a comparison into a decision.

    Decisions pool each side's repeats against the log's learnt between-trial noise (integer rounds):
    the race already alternates its rounds and keeps every trial as evidence, whereas
    compare(rounds="auto") would judge only the fresh back-to-back pairs it runs itself.
    """
    c = compare(a, b, rounds=rounds, run=run, log=log, margin=SAME_MARGIN)
    return c.answer, c


# ---- the search space -------------------------------------------------------------------------
def _cores() -> int:
    from .system import usable_cores

    return usable_cores()


def _bf16_worth_trying(device: torch.device) -> bool:
    """bf16 on CUDA with bf16 support, MPS, or a CPU with native bf16 units (else it is emulated)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        from .system import cpu_has_bf16

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
    budget: int
    answer: str = "undecided"  # the best vs the start: faster | same | undecided (ANSWERS)
    confirmation: Comparison | None = None  # the comparison behind `answer`
    seconds: float = 0.0
    budget_s: float | None = None
    explanation: Any = None  # the winner explained against the start (bench.explain); None when the start won
    spent: Spend | None = None  # how the seconds went: race, confirm, explain; trials kept out or stopped by the budget

    @property
    def speedup(self) -> float | None:
        """Best vs start throughput (the confirmation's ratio when there is one)."""
        if self.confirmation is not None and self.best_knobs != self.start.knobs:
            return self.confirmation.speedup
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
        return f"Tuned in {budget}: {self.best_knobs}\n  {sp} vs the start; answer: {self.answer}{verdict}{spent}"

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


# ---- tune: candidates, races, confirmation ------------------------------------------------------
@dataclass
class _Entry:
    """One candidate in a race: its knobs, where it came from, and its trials so far."""

    stage: str
    label: str
    knobs: Knobs
    change: dict[str, Any] = field(default_factory=dict)  # relative to the start
    trials: list[TrialResult] = field(default_factory=list)
    alive: bool = True

    @property
    def mean(self) -> float:
        """Geometric mean samples/s over the trials (0 before any)."""
        rates = [r.samples_per_s for r in self.trials if r.samples_per_s]
        return math.exp(sum(map(math.log, rates)) / len(rates)) if rates else 0.0


class _Ctx:
    """The tuner's budget (trials and seconds), its trials, and the path's rows."""

    def __init__(self, bench: Bench, limit: int, budget_s: float | None, memory_cap: float | None,
                 memory_budget: int | None, stop_early: bool = True) -> None:
        self.bench, self.limit, self.budget_s = bench, limit, budget_s
        self.memory_cap, self.memory_budget = memory_cap, memory_budget
        self.t0, self.used, self.durations = time.perf_counter(), 0, []
        self.rows: list[dict[str, Any]] = []
        self.start: _Entry | None = None
        self.stop_early = stop_early
        self.spent = Spend(budget_s)  # seconds per purpose, and the trials behind the estimates
        self.purpose = "race"  # what the seconds of the next trials are spent on (race, confirm, explain)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def fits(self, knobs: Knobs, factor: float = 1.0) -> bool:
        """Whether a trial of `knobs` (its estimate x `factor`) fits the seconds left."""
        return self.budget_s is None or self.spent.fits(knobs, self.budget_s - self.elapsed(), factor)

    def affordable(self) -> int:
        """Trials still affordable: the trial cap, and the seconds left over the median trial's."""
        n = self.limit - self.used
        if self.budget_s is not None and self.durations:
            per = sorted(self.durations)[len(self.durations) // 2]
            n = min(n, int((self.budget_s - self.elapsed()) / max(per, 1e-6)))
        return max(0, n)

    def run(self, knobs: Knobs) -> TrialResult | None:
        """One trial, None when its estimate does not fit the seconds left (budget.py); an unsteady trial
        runs once more when that fits, and the repeat is the evidence (issue 30)."""
        r = self._once(knobs)
        if r is not None and r.ok and r.steady is False and self.used < self.limit:
            again = self._once(knobs)  # kept only when it finished: a repeat stopped by the budget is no evidence
            r = again if again is not None and again.ok else r
        return r

    def _once(self, knobs: Knobs) -> TrialResult | None:
        if self.used and not self.fits(knobs):
            self.spent.not_started += 1
            return None
        at = self.budget_s * DEADLINE - self.elapsed() if self.budget_s is not None and self.used else None
        r = self.spent.run(self.bench.run, knobs, purpose=self.purpose, deadline_in_s=at,  # the start runs whole
                           stop_early=self.stop_early, clock=time.perf_counter)
        self.used += 1
        if r.trial_id not in self.spent.stopped:
            self.durations.append(self.spent.measured[-1][1])
        return r

    def rejected(self, r: TrialResult) -> str | None:
        """Why a trial's configuration cannot be kept (failed, over the budget or the headroom)."""
        if r.trial_id in self.spent.stopped:
            return "stopped by the budget at its deadline: not evidence"
        if not r.ok or not r.samples_per_s:
            return f"rejected: {r.status}"
        peak = r.peak_memory_bytes
        if peak is not None and self.memory_budget is not None and peak > self.memory_budget:
            return f"rejected: peak {fmt_bytes(peak)} over the memory budget"
        if peak is not None and self.memory_cap is not None and peak > self.memory_cap:
            return f"rejected: peak {fmt_bytes(peak)} within the headroom of the memory edge"
        return None

    def row(self, e: _Entry, r: TrialResult, decision: str) -> dict[str, Any]:
        ref = self.start.mean if self.start is not None and self.start.mean else None
        row = {"stage": e.stage, "change": e.label, "trial": r.trial_id, "samples_per_s": r.samples_per_s,
               "speedup": (r.samples_per_s / ref) if ref and r.samples_per_s else None, "decision": decision}
        self.rows.append(row)
        return row


def _label(change: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in change.items()) or "the start"


def _race(ctx: _Ctx, entries: list[_Entry], rounds: int = MAX_ROUNDS) -> _Entry:
    """Alternating rounds over the contenders; after each, drop those beyond noise slower than the leader."""
    log = ctx.bench.log
    for rnd in range(rounds):
        alive = [e for e in entries if e.alive]
        if len(alive) <= 1 or ctx.affordable() < len(alive) + (2 if rnd else 0):  # later rounds leave 2 to confirm
            break
        for e in alive if rnd % 2 == 0 else alive[::-1]:
            r = ctx.run(e.knobs)
            if r is None:  # its estimate does not fit the seconds left
                ctx.rows.append({"stage": e.stage, "change": e.label, "trial": None, "samples_per_s": None,
                                 "speedup": None, "decision": "not run: its estimate does not fit the seconds left"})
                continue
            why = ctx.rejected(r)
            if why:
                e.alive = False
            else:
                e.trials.append(r)
            ctx.row(e, r, why or f"round {rnd + 1}")
        ok = [e for e in entries if e.alive and e.trials]
        if not ok:
            break
        leader = max(ok, key=lambda e: e.mean)
        if _drop_round(ctx, ok, leader, log):
            break
        _halve(ctx, [e for e in ok if e.alive], rnd)
    ok = [e for e in entries if e.alive and e.trials]
    return max(ok, key=lambda e: e.mean) if ok else entries[0]


def _halve(ctx: _Ctx, alive: list[_Entry], rnd: int) -> None:
    """Successive halving: after a round, only the faster half (by mean rate) races on; the start
    always stays, as the reference the winner is confirmed against."""
    keep = max(2, math.ceil(len(alive) / 2))
    for e in sorted(alive, key=lambda e: e.mean, reverse=True)[keep:]:
        if e is not ctx.start:
            e.alive = False
            ctx.rows.append({"stage": e.stage, "change": e.label, "trial": None, "samples_per_s": None,
                             "speedup": None, "decision": f"out: in the slower half after round {rnd + 1}"})


def _drop_round(ctx: _Ctx, ok: list[_Entry], leader: _Entry, log: ResultLog | None) -> bool:
    """Drop the entries beyond noise slower than the leader, park those the same speed as the start
    (near-misses for stacking); True when the leader itself is the same speed as the start (race over)."""
    start = ctx.start
    for e in ok:
        if e is leader:
            continue
        ans, c = _answer(leader.trials, e.trials, log=log)
        if ans == "slower":
            why = f"dropped: {c.speedup:.2f}x of the leader ({leader.label}), beyond noise"
        elif e is not start and start is not None and _answer(start.trials, e.trials, log=log)[0] == "same":
            why = f"parked: the same speed as the start within ±{SAME_MARGIN:.0%} (a near-miss for stacking)"
        else:
            continue
        e.alive = False
        ctx.rows.append({"stage": e.stage, "change": e.label, "trial": None, "samples_per_s": None,
                         "speedup": c.speedup, "decision": why})
    return start is not None and leader is not start and _answer(start.trials, leader.trials, log=log)[0] == "same"


def _entry(stage: str, k0: Knobs, change: dict[str, Any]) -> _Entry:
    return _Entry(stage, _label(change), k0.replace(**change), dict(change))


def _first_entries(axes_of: Callable[..., Any], k0: Knobs, stages: tuple[str, ...],
                   lead: tuple[str, ...] = ()) -> list[_Entry]:
    """The first race's candidates in entry order: every option of the `lead` axes (those the
    bottleneck names), then each axis's first (the seeds' preferred) option, stage by stage; then
    cross-stage pairs, preferred options first; then the other alternatives."""
    axes: dict[str, tuple[str, list[dict[str, Any]]]] = {}
    for stage in stages:
        for name, changes in axes_of(stage, k0):
            axes[name] = (stage, changes)
    led = [_entry(stage, k0, c) for name, (stage, changes) in axes.items() if name in lead for c in changes]
    axes = {name: v for name, v in axes.items() if name not in lead}
    first = led + [_entry(stage, k0, changes[0]) for stage, changes in axes.values()]
    pairs = []
    for x, y in PAIRS:
        for i, cx in enumerate(axes.get(x, ("", []))[1]):
            for j, cy in enumerate(axes.get(y, ("", []))[1]):
                if _valid(k0, {**cx, **cy}):
                    pairs.append((i + j, _entry(f"pair: {x} x {y}", k0, {**cx, **cy})))
    rest = [_entry(stage, k0, c) for stage, changes in axes.values() for c in changes[1:]]
    return first + [e for _rank, e in sorted(pairs, key=lambda p: p[0])] + rest


NEAR_MISSES = 6  # the best near-misses stacked pairwise on the leader


def _stacks(axes_of: Callable[..., Any], k0: Knobs, leader: _Entry, near: list[_Entry],
            stages: tuple[str, ...]) -> list[_Entry]:
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
    out = [_entry("stack", k0, c) for c in changes if _valid(k0, c)]
    for stage in stages:
        if stage in ("data", "batch"):
            for _name, options in axes_of(stage, leader.knobs):
                out += [_entry(f"{stage}, on the leader", k0, {**leader.change, **c}) for c in options
                        if not _valid(k0, c) or stage == "batch"]
    return out


def _near_misses(ctx: _Ctx, entries: list[_Entry], leader: _Entry) -> list[_Entry]:
    """Entries that measured within noise of the start or better (dropped against the leader or not)."""
    start, log = ctx.start, ctx.bench.log
    return [e for e in entries if e.trials and e is not leader and e is not start and start is not None
            and _answer(start.trials, e.trials, log=log)[0] != "slower"]


def _admit(ctx: _Ctx, cands: list[_Entry], seen: set[Knobs], carried: int, first_race: bool) -> list[_Entry]:
    """New candidates in entry order, as many as two rounds of the race can afford (and that fit memory)."""
    fresh, out = [], []
    for e in cands:
        if e.knobs not in seen:
            seen.add(e.knobs)
            fresh.append(e)
    room = ctx.affordable() // 2 - carried  # two rounds of the race, the carried entries included
    if first_race:  # a small budget still screens two candidates in one round
        room = max(room, min(2, ctx.affordable() - carried))
    start = ctx.start
    for e in fresh:
        peak = start.trials[0].peak_memory_bytes if start and start.trials else None
        grow = e.knobs.batch_size / start.knobs.batch_size if start else 1.0
        if ctx.memory_cap is not None and peak is not None and grow > 1 and peak * grow > ctx.memory_cap:
            ctx.rows.append({"stage": e.stage, "change": e.label, "trial": None, "samples_per_s": None, "speedup": None,
                             "decision": f"not run: predicted peak {fmt_bytes(peak * grow)} within the headroom"})
        elif len(out) < room:
            out.append(e)
    if len(fresh) > len(out):
        ctx.rows.append({"stage": "budget", "change": f"{len(fresh) - len(out)} candidate(s)", "trial": None,
                         "samples_per_s": None, "speedup": None, "decision": "not entered: no budget left for them"})
    return out


def _settled(ctx: _Ctx, leader: _Entry, leaders: list[_Entry]) -> _Entry:
    """The last race's leader, unless it is not yet faster than the start beyond noise and an
    earlier race's leader already is (a late leader with one lucky trial does not undo a win)."""
    start, log = ctx.start, ctx.bench.log
    for e in [leader, *leaders[::-1]]:
        if e is not start and start is not None and e.trials and _answer(start.trials, e.trials, log=log)[0] == "faster":
            return e
    return leader


def _confirm(ctx: _Ctx, leader: _Entry, rivals: list[_Entry]) -> tuple[str, Comparison | None]:
    """The winner against the start (or, when the start leads, its best rival against it)."""
    start, log = ctx.start, ctx.bench.log
    assert start is not None
    other = leader if leader is not start else max(rivals, key=lambda e: e.mean, default=None)
    if other is None or not other.trials:
        return "undecided", None
    ans, c = _answer(start.trials, other.trials, log=log)
    ctx.purpose = "confirm"
    if ans == "undecided" and ctx.affordable() >= 2:
        ans, c = _answer(start.trials, other.trials, rounds=min(CONFIRM_ROUNDS, ctx.affordable() // 2), run=ctx.run, log=log)
    if leader is start or ans != "faster":
        what = {"same": "the same speed", "slower": "slower", "faster": "faster"}.get(ans, "not faster beyond noise")
        ctx.rows.append({"stage": "confirm", "change": other.label, "trial": c.b_trials[-1], "samples_per_s": None,
                         "speedup": c.speedup, "decision": f"nothing beats the start: the best rival is {what} "
                         f"({c.verdict}, {c.rounds} extra round(s))"})
        return ("same" if ans in ("same", "slower") else "undecided"), c
    ctx.rows.append({"stage": "confirm", "change": leader.label, "trial": c.b_trials[-1], "samples_per_s": None,
                     "speedup": c.speedup, "decision": f"kept: faster than the start ({c.verdict}, {c.rounds} extra round(s))"})
    return ans, c


def _explain(ctx: _Ctx, start: TrialResult, best: TrialResult) -> Any:
    """The winner explained against the start, inside the budget: a side without a trace costs one
    traced repeat, counted in trials_used; when the budget cannot pay for them, no explanation."""
    from .diagnose.explain import explain_winner, has_trace  # analysis beside tune; imported only for a winner

    need = sum(not has_trace(t) for t in (start, best))
    fits = all(ctx.fits(t.knobs, EXPLAIN_PRIOR * need) for t in (start, best) if not has_trace(t))
    if need > ctx.affordable() or not fits:
        ctx.rows.append({"stage": "explain", "change": "", "trial": None, "samples_per_s": None, "speedup": None,
                         "decision": f"not explained: its {need} traced repeat(s) would pass the budget "
                                    "(bench.explain(start, best) runs them)"})
        return None
    before, t = len(ctx.bench.trials), time.perf_counter()
    why = explain_winner(ctx.bench, start, best)
    ctx.used += len(ctx.bench.trials) - before  # the traced repeats are trials of this tune() call
    ctx.spent.add("explain", time.perf_counter() - t)
    return why


DATA_BOUND = 0.2  # a start that waits for data this share of its window enters every worker option first


def _lead(ctx: _Ctx, start: TrialResult) -> tuple[str, ...]:
    """The axes the start's bottleneck names, entered first, and a row saying why (data-bound: workers)."""
    wait = start.data_wait_share or 0.0
    if wait >= DATA_BOUND:
        ctx.rows.append({"stage": "data", "change": "every worker count", "trial": None, "samples_per_s": None,
                         "speedup": None, "decision": f"entered first: the start waits for data {wait:.0%} of "
                         "its window: worker counts (with compute threads) before precision or kernels"})
    return ("workers",) if wait >= DATA_BOUND else ()


def _check(budget: int | None, budget_s: float | None, stages: tuple[str, ...], memory_budget: int | None,
           headroom: float) -> int:
    """Validate tune()'s arguments; returns the trial cap."""
    if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 2):
        raise ValueError(f"budget must be an int >= 2 (a cap on trials, the start included), got {budget!r}")
    check_budget_s(budget_s)
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        raise ValueError(f"unknown stage(s) {unknown}; choose from {STAGES}")
    if memory_budget is not None and (not isinstance(memory_budget, int) or memory_budget <= 0):
        raise ValueError(f"memory_budget must be a positive number of bytes, got {memory_budget!r}")
    if isinstance(headroom, bool) or not isinstance(headroom, (int, float)) or not 0 <= headroom < 1:
        raise ValueError(f"headroom must be a share of memory in [0, 1) (e.g. headroom=0.1), got {headroom!r}")
    return budget if budget is not None else (DEFAULT_TRIALS if budget_s is None else 10_000)


def tune(bench: Bench, budget: int | None = None, *, budget_s: float | None = None, start: Knobs | None = None,
         memory_budget: int | None = None, stages: tuple[str, ...] = STAGES, max_batch_size: int | None = None,
         headroom: float = DEFAULT_HEADROOM, axes: tuple[str, ...] | None = None, confirm: bool = True,
         explain: bool = True, stop_early: bool = True) -> TuneResult:
    """Race candidates under noise within `budget_s` seconds (and `budget` trials); returns the best.

    The first race holds the start, each stage's options and cross-stage pairs; later races stack
    the leader with its near-misses. The winner is kept only when it is faster than the start
    beyond noise (`TuneResult.answer`). `memory_budget` (bytes) rejects configurations over it;
    `headroom` keeps every trial that share below the memory ceiling (no batch on the OOM edge).
    `axes` narrows the space to named axes (see `stage_axes`). `confirm=False` skips the extra confirmation rounds (the race's own rounds still decide).
    `explain=True` explains a winner against the start from traced steps (up to two traced repeats after the search).
    `budget_s` is a cap (budget.py): a trial starts only when its estimate (from this search's trials of
    the most similar configuration) fits the seconds left, a running one is stopped at the deadline
    (recorded as stopped by the budget, never evidence); `TuneResult.spent` says how the seconds went.
    `stop_early=False` runs every trial's whole window (by default a trial far slower than the baseline
    stops after a few steps, earlystop.py).
    """
    limit = _check(budget, budget_s, stages, memory_budget, headroom)
    ceiling = memory_ceiling(bench, memory_budget)
    ctx = _Ctx(bench, limit, budget_s, None if ceiling is None else ceiling * (1 - headroom), memory_budget,
               stop_early=stop_early)
    k0 = start or bench.defaults
    ctx.start = first = _Entry("start", "the start", k0)
    ctx.purpose = "start"
    r = ctx.run(k0)
    assert r is not None  # the start always runs
    ctx.purpose = "race"
    ctx.row(first, r, "start" if r.ok else f"start failed: {r.status}")
    if not r.ok:
        return TuneResult(k0, r, r, pd.DataFrame(ctx.rows), ctx.used, limit, "undecided", None, ctx.elapsed(), budget_s,
                          spent=ctx.spent)
    if budget_s is not None and not ctx.fits(k0):
        ctx.rows.append({"stage": "budget", "change": "", "trial": None, "samples_per_s": None, "speedup": None,
                         "decision": f"the start alone took {ctx.elapsed():.1f} s of budget_s={budget_s:g}: no other "
                                     "trial fits; raise budget_s to tune"})
    first.trials.append(r)
    seen, leader = {k0}, first
    axes_of = functools.partial(stage_axes, bench, max_batch_size=max_batch_size, axes=axes)
    lead = _lead(ctx, r)
    cands = _first_entries(axes_of, k0, stages, lead)
    rivals: list[_Entry] = []
    leaders: list[_Entry] = []
    for _gen in range(MAX_GENERATIONS):
        carried = [first] if leader is first else [first, leader]
        new = _admit(ctx, cands, seen, len(carried), not leaders)
        if not new:
            break
        entries = carried + new
        leader = _race(ctx, entries)
        leaders.append(leader)
        rivals = [e for e in entries if e.trials and e is not leader and e is not first]
        cands = _stacks(axes_of, k0, leader, _near_misses(ctx, entries, leader), stages)
    rivals = [e for e in rivals if e is not first]
    leader = _settled(ctx, leader, leaders)
    if confirm:
        answer, c = _confirm(ctx, leader, rivals)
    else:
        answer, c = _answer(first.trials, leader.trials, log=bench.log) if leader is not first else ("same", None)
    best = leader if answer == "faster" else first
    why = _explain(ctx, r, best.trials[-1]) if explain and best is not first and hasattr(bench, "explain") else None
    return TuneResult(best.knobs, best.trials[-1], r, pd.DataFrame(ctx.rows), ctx.used, limit, answer, c,
                      ctx.elapsed(), budget_s, why, ctx.spent)


__all__ = ["PAIRS", "STAGES", "FitResult", "TuneResult", "fit_memory", "stage_axes", "stage_options", "tune"]
