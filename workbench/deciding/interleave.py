"""Interleaved comparisons: two configurations take turns of a few steps each in one process, so a
verdict comes in seconds instead of minutes of separate trials.

    why_not(a, b)                  -> None, or why the pair cannot share a process (then: trials)
    interleaved(workload, a, b)    -> Comparison(method="interleaved")

Both sides are built once (each its own fresh model copy, optimizer, GradScaler and compiled step:
the user's model is never touched, and neither side sees the other's weights or optimizer state)
and warmed. Then turns of a few steps alternate A B, B A, A B, ... on prepared batches (the same
seeded batches for both sides, replayed from memory), each turn under its own side's process
settings (threads, matmul precision, cuDNN flags). Turn i of A and turn i of B form a pair; drift
over seconds moves both turns of a pair, and cancels in their log-ratio. `stats.decide_interleaved`
looks at the pairs at times planned before the first pair (spread over the budget), spending the 5%
error rate evenly over at most `looks` looks, and the comparison stops at the first decided look or
when the time budget ends.

What the ratio is, and is not: the two models share the machine's caches, and each turn starts
with the other side's weights in them; prepared batches leave the data loader out of both sides.
The ratio is therefore that of the training step itself. Absolute samples/s (and anything the
loader changes) still come from trials, which is why data-pipeline knobs never interleave.
"""

from __future__ import annotations

import contextlib
import gc
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..core.knobs import KNOBS, Knobs, process_env, settings
from ..core.measure import sync
from ..core.shapes import signature
from ..core.step import BatchSource, LossBuffer, Stage, TrainStep, seeded
from ..core.system import release_free_memory
from ..core.workload import Workload
from ..launch.runner import check_knobs, sort_failure
from ..results.stats import INTERLEAVE_LOOKS, MARGIN, Comparison, decide_interleaved
from .budget import Budget

BUDGET_S = 30.0  # default seconds for a whole interleaved comparison, build and warm-up included
TURN_S = 0.03  # a turn lasts about this long (at least one step, at most MAX_TURN_STEPS)
MAX_TURN_STEPS = 32
MIN_PAIRS = 6  # the first look needs at least this many pairs (a t interval from fewer is too wide to use)
REPLAY_BATCHES = 8  # prepared batches per side, replayed in a cycle
INTERLEAVE_WARMUP = 3  # warm-up steps per side at most (each side's first trial already ran: compile caches are warm)
WARMUP_S = 0.3  # warm each side at least this long (beyond its warm-up steps): allocator, caches, threads
DATA_KNOBS = ("data", "num_workers", "pin_memory", "persistent_workers", "prefetch_factor")


class InterleaveFailed(RuntimeError):
    """An interleaved comparison could not finish: one side failed (status "oom", "nan", "error").

    `side` is "A" or "B" (None when it failed before either side ran); `comparison` holds the pairs
    measured before the failure (None with fewer than 2)."""

    def __init__(self, message: str, *, side: str | None = None, status: str = "error",
                 comparison: Comparison | None = None) -> None:
        super().__init__(message)
        self.side = side
        self.status = status
        self.comparison = comparison


def why_not(a: Knobs, b: Knobs) -> str | None:
    """Why configurations `a` and `b` cannot take turns in one process (None when they can).

    They can when every knob they differ in is declared `interleave=True` (knobs.INTERLEAVE_KNOBS,
    and your @wb.knob knobs unless marked `interleave=False`) and both run in one process.
    """
    if not isinstance(a, Knobs) or not isinstance(b, Knobs):
        raise TypeError(f"why_not takes two Knobs, got {type(a).__name__} and {type(b).__name__}")
    if a.world_size > 1 or b.world_size > 1:
        return "world_size > 1 runs in processes of its own, one per rank"
    started = [n for n in a.diff(b) if n in KNOBS and KNOBS[n].process_env is not None]
    if started:
        return (f"{', '.join(started)} sets how a process starts, which one process cannot switch: each side "
                "runs in a fresh process started in its own mode")
    if process_env(a):  # the same process knob on both sides (allocator='tcmalloc'): not this process's
        return (f"allocator={a.allocator!r} runs each trial in a fresh process started in that mode, not in "
                "this one")
    differing = [n for n in a.diff(b) if not (KNOBS[n].interleave if n in KNOBS else False)]
    if not differing:
        return None
    data = [n for n in differing if n in DATA_KNOBS]
    if data:
        return (f"{', '.join(data)} {'is a data-pipeline knob' if len(data) == 1 else 'are data-pipeline knobs'}: "
                "each side needs its own loader, which only a trial measures")
    users = [n for n in differing if n in KNOBS and KNOBS[n].function is not None]
    if users:
        return (f"your knob{'s' if len(users) != 1 else ''} {', '.join(users)} "
                f"{'is' if len(users) == 1 else 'are'} marked interleave=False (it changes global state)")
    return f"{', '.join(differing)} cannot switch between steps in one process (distributed or unknown knobs)"


def memory_reason(device: torch.device, a_peak: int | None, b_peak: int | None) -> str | None:
    """On CUDA: why both sides' peaks (from their trials) do not fit in free memory together (None if they do)."""
    if device.type != "cuda" or not a_peak or not b_peak:
        return None
    free, _ = torch.cuda.mem_get_info(device)
    if a_peak + b_peak > 0.9 * free:
        return (f"both models together need about {(a_peak + b_peak) / 2**30:.1f} GiB, more than the "
                f"{free / 2**30:.1f} GiB free on {device}")
    return None


class Replay:
    """A fixed list of batches, already on the device, handed out in a cycle (BatchSource's `next()`)."""

    def __init__(self, batches: list[Any]) -> None:
        if not batches:
            raise ValueError("Replay needs at least one batch")
        self.batches = batches
        self.i = 0

    def next(self) -> Any:
        """The next prepared batch (the first again after the last)."""
        batch = self.batches[self.i % len(self.batches)]
        self.i += 1
        return batch


@dataclass
class _Side:
    """One configuration's live state: its own step (model copy, optimizer, scaler) and batches."""

    name: str  # "A" or "B"
    knobs: Knobs
    step: TrainStep
    replay: Replay
    losses: LossBuffer
    stage: Stage
    rates: list[float] = field(default_factory=list)  # samples/s of each measured turn


def _prepared(workload: Workload, knobs: Knobs, n: int) -> list[Any]:
    """`n` micro-batches of the workload's seeded data order on the device, loaded in this process."""
    k = knobs.replace(data="loader", num_workers=0, persistent_workers=False, prefetch_factor=None,
                      pin_memory=False)
    with seeded(workload.seed), BatchSource(workload, k) as source:
        first = source.next()
        if knobs.data == "cached":
            return [first]
        return [first] + [source.next() for _ in range(n - 1)]


def _batch_key(k: Knobs) -> tuple[Any, ...]:
    """The knobs that shape the prepared batches: sides equal in these share one set."""
    return k.batch_size, k.accum_steps, k.channels_last, k.data


def _build(workload: Workload, name: str, knobs: Knobs, stack: contextlib.ExitStack,
           batches: list[Any] | None = None) -> _Side:
    """Build one side under its process settings and the workload's seed (so both start alike);
    `batches`: the other side's prepared batches when they are the same (see _batch_key)."""
    stage = Stage()
    try:
        with settings(knobs), seeded(workload.seed):
            step = stack.enter_context(TrainStep(workload, knobs, stage=stage))
            if batches is None:
                batches = _prepared(workload, knobs, REPLAY_BATCHES * knobs.accum_steps)
    except Exception as e:
        status, message = sort_failure(e, stage, knobs)
        raise InterleaveFailed(f"side {name} failed while being built: {message}", side=name, status=status) from e
    return _Side(name, knobs, step, Replay(batches), LossBuffer(1, workload.device), stage)


def _turn(side: _Side, steps: int, lead_in: bool) -> float:
    """Run `steps` optimizer steps of one side under its settings; its samples/s (raises on failure).

    `lead_in`: one unmeasured step first (after the other side changed a process setting such as
    the thread count, the first step pays for the switch)."""
    device = side.step.device
    samples = 0
    with settings(side.knobs):
        if lead_in:
            side.step(side.replay, side.losses, 0)
        sync(device)
        t0 = time.perf_counter()
        for _ in range(steps):
            samples += side.step(side.replay, side.losses, 0).samples
        sync(device)
        seconds = time.perf_counter() - t0
    return samples / max(seconds, 1e-9)


def _checked(side: _Side, run: Callable[[], float], pairs: Callable[[], Comparison | None]) -> float:
    """run() for `side`, turning an exception or a non-finite loss into InterleaveFailed."""
    try:
        rate = run()
        total = float(side.losses.sums[0].item())  # one host read per turn, outside the timed steps
        side.losses.sums.zero_()
    except Exception as e:
        status, message = sort_failure(e, side.stage, side.knobs)
        raise InterleaveFailed(f"side {side.name} ended {status}: {message}", side=side.name, status=status,
                               comparison=pairs()) from e
    if not math.isfinite(total):
        raise InterleaveFailed(f"side {side.name} ended nan: the loss became NaN or infinite", side=side.name,
                               status="nan", comparison=pairs())
    return rate


def _warm(sides: list[_Side], warmup_steps: int) -> float:
    """Warm each side for `warmup_steps` steps (at least one pass over its prepared batches when their input
    shapes vary: each shape's first call is a one-time cost, core/shapes.py), then at least 2 more and
    WARMUP_S seconds; the slower side's seconds per step, timed on those last steps."""
    per_step = []
    for side in sides:
        batches = side.replay.batches
        varied = len({signature(b) for b in batches}) > 1
        steps = max(1, warmup_steps, math.ceil(len(batches) / side.knobs.accum_steps) if varied else 0)
        _checked(side, lambda s=side, n=steps: _turn(s, n, False), lambda: None)
    for side in sides:
        t0, n = time.perf_counter(), 0
        while n < 2 or time.perf_counter() - t0 < WARMUP_S:
            _checked(side, lambda s=side: _turn(s, 1, False), lambda: None)
            n += 1
        per_step.append((time.perf_counter() - t0) / n)
    return max(per_step)


def interleaved(workload: Workload, a: Knobs, b: Knobs, *, a_id: int | None = None, b_id: int | None = None,
                margin: float = MARGIN, budget_s: float | Budget = BUDGET_S, warmup_steps: int = 5,
                turn_steps: int | None = None, looks: int = INTERLEAVE_LOOKS,
                cancel: threading.Event | None = None) -> Comparison:
    """B against A by interleaved turns in this process, until decided or `budget_s` seconds end.

    Raises ValueError when the pair cannot interleave (see `why_not`) and InterleaveFailed when a
    side fails (its status, and the pairs measured before). `turn_steps`: steps per turn (None:
    about TURN_S seconds). `a_id`/`b_id` label the result (the trials the knobs came from). A set
    `cancel` event ends it at the next pair: the pairs so far are judged (InterleaveFailed with status
    "interrupted" when fewer than 2). `budget_s`: seconds, or the part of a calling verb's Budget
    (compare's, the race's) that the turns may spend.
    """
    turns = Budget.of(BUDGET_S if budget_s is None else budget_s, "compare")  # a number: validated here, once
    turns = turns if turns.budget_s is not None else turns.part(BUDGET_S)  # turns always end
    reason = why_not(a, b)
    if reason is not None:
        raise ValueError(f"cannot interleave these two: {reason}")
    if turn_steps is not None and (isinstance(turn_steps, bool) or not isinstance(turn_steps, int)
                                    or turn_steps < 1):
        raise ValueError(f"turn_steps must be an int >= 1 (or None for about {TURN_S * 1000:.0f} ms), "
                         f"got {turn_steps!r}")
    check_knobs(workload, a)
    check_knobs(workload, b)
    compiled = a.compile != "off" or b.compile != "off"
    try:
        with contextlib.ExitStack() as stack:
            first = _build(workload, "A", a, stack)
            shared = first.replay.batches if _batch_key(a) == _batch_key(b) else None  # read-only: both may use them
            sides = [first, _build(workload, "B", b, stack, shared)]
            return _alternate(sides, turns, margin=margin, warmup_steps=warmup_steps,
                              turn_steps=turn_steps, looks=looks, ids=(a_id, b_id), cancel=cancel)
    finally:
        if compiled:
            gc.collect()  # compiled graphs hold reference cycles
        release_free_memory()
        if workload.device.type == "cuda":
            torch.cuda.empty_cache()


def _alternate(sides: list[_Side], turns: Budget, *, margin: float, warmup_steps: int,
               turn_steps: int | None, looks: int, ids: tuple[int | None, int | None],
               cancel: threading.Event | None = None) -> Comparison:
    """Warm both sides, then pairs of turns (A B, B A, ...), looking at the pairs at planned times, while
    another pair fits the seconds left of `turns` (the comparison's budget)."""
    step_s = _warm(sides, warmup_steps)
    k = turn_steps or max(1, min(MAX_TURN_STEPS, round(TURN_S / max(step_s, 1e-6))))
    # The looks are planned from the clock and the warm-up's timing alone, before any pair is measured
    # (so they cannot chase the data): as many as the budget holds pairs for (at least MIN_PAIRS a look,
    # at most `looks`), each spending an equal share of the error rate, spread evenly over the time
    # left; a slow step gets fewer, better-funded looks, and a step that speeds up still uses the budget.
    pair_s = 2 * k * step_s * 1.1
    started = time.perf_counter()
    span = max(0.0, turns.left() or 0.0)
    looks = max(1, min(looks, int(span / pair_s // MIN_PAIRS)))
    look_every = max(MIN_PAIRS, math.ceil(span / pair_s / looks))  # pairs between looks, as planned (for hints)
    switch = any(KNOBS[n].settings is not None for n in sides[0].knobs.diff(sides[1].knobs) if n in KNOBS)
    a, b = sides

    def judge(note: str = "") -> Comparison | None:
        n = min(len(a.rates), len(b.rates))
        if n < 2:
            return None
        return decide_interleaved(a.rates[:n], b.rates[:n], looks=looks, margin=margin, a=ids[0], b=ids[1],
                                  seconds=turns.elapsed(), turn_steps=k, look_every=look_every, note=note)

    c, look, pairs = None, 0, 0
    while look < looks:
        per_pair = (time.perf_counter() - started) / pairs if pairs else pair_s
        if pairs >= 2 and not turns.fits(per_pair):  # the budget ends: a last look at what there is
            c = judge(f"Stopped at the time budget (budget_s={turns.budget_s:.4g}).")
            break
        if cancel is not None and cancel.is_set():  # a Stop button: judge what there is
            c = judge("Stopped by the user.")
            if c is None:
                raise InterleaveFailed("stopped by the user before two pairs of turns ran", status="interrupted")
            break
        order = sides if pairs % 2 == 0 else sides[::-1]  # A B, then B A: a linear drift cancels over two pairs
        for side in order:
            side.rates.append(_checked(side, lambda s=side, n=k: _turn(s, n, switch), judge))
        pairs += 1
        if pairs == MIN_PAIRS and turn_steps is None:  # the warm-up's timing was a guess: size turns from the pairs
            k = max(k, min(MAX_TURN_STEPS, round(TURN_S * 2 * k * pairs / max(time.perf_counter() - started, 1e-6))))
        if pairs < MIN_PAIRS or time.perf_counter() - started < (look + 1) * span / looks:
            continue
        look += 1
        c = judge()
        if c is None or c.answer != "undecided":
            break
    if c is None:
        raise InterleaveFailed("no pair of turns was measured")
    return c


def on_node(workload: Workload, a: Knobs, b: Knobs, **kwargs: Any) -> tuple[str, Any]:
    """Inside a job: `interleaved` on this node; ("ok", Comparison) or ("failed", InterleaveFailed's fields)."""
    try:
        return "ok", interleaved(workload, a, b, **kwargs)
    except InterleaveFailed as e:
        return "failed", {"message": str(e), "side": e.side, "status": e.status, "comparison": e.comparison}


def in_one_job(jobs: Any, workload: Workload, a: Knobs, b: Knobs, *, cancel: threading.Event | None = None,
               **kwargs: Any) -> Comparison:
    """`interleaved` inside ONE job on the executor's node (launch/jobs.py): both sides take turns in
    the job's process, so differences between nodes cancel. The note names the job and its node; a
    side's failure, or a job that ends without a result (its scheduler's reason), raises InterleaveFailed."""
    from dataclasses import replace

    from ..launch.cluster import JobFailed

    if isinstance(kwargs.get("budget_s"), Budget):  # the job's node has its own clock: it gets the seconds left
        left = kwargs["budget_s"].left()
        kwargs["budget_s"] = BUDGET_S if left is None else max(1e-3, left)
    try:
        (outcome, value), env, job = jobs.call_where(on_node, workload, a, b, cancel=cancel, **kwargs)
    except JobFailed as e:
        raise InterleaveFailed(e.message, status=e.status) from None
    local = job.get("where") == "worker"  # this workbench's worker process (launch/local.py), not a node
    where = ("in the worker process" if local else f"inside job {job.get('id') or '?'} on {env.get('host', '?')} "
             f"({env.get('device_name') or env.get('device', '?')})")
    if outcome == "failed":
        raise InterleaveFailed(f"{value['message']} ({where})", side=value["side"], status=value["status"],
                               comparison=value["comparison"])
    if local:
        return value
    return replace(value, note=f"{value.note} Both sides took turns {where}, so node differences cancel.".strip())
