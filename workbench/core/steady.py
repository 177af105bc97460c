"""When warm-up is over: the steady-state rule, and the check that a window is steady.

A DataLoader with workers keeps up to `num_workers x prefetch_factor` batches ready ahead of the
training loop. Any long step before the measured window (the first step's compile, the CPU memory
probe, a recompile, an epoch start) lets the workers fill that buffer, and a window that begins by
draining it measures the buffer, not the pipeline: a first compiled trial on a data-bound loader
reads well above what its workers can deliver (the figure, with its conditions:
benchmarks/README.md#the-buffer-drain-effect). So warm-up ends at steady state, not at a count:

    at least `warmup_steps` steps; after the last slow step, warm-up goes on until
      1. the loader's buffer (num_workers x prefetch_factor batches, + 1 in flight) has been consumed, and
      2. the last 2 x h steps do not trend: the two halves (h steps each, a whole number of loader
         cycles) took the same time within `tolerance`, and waited on data the same share of it.
    A cap (CAP_STEPS warm-up steps, or CAP_S seconds spent past the slow steps) ends warm-up
    anyway: the trial runs, and its notes say "warm-up cap: ...".

A slow step is the first step, the memory probe, an epoch start, or (with a loader buffer to refill)
any step that took more than `slow_factor` times the mean of the steps around it (a recompile,
CUDA graph capture, a pause). Without workers the count is the same in every trial of the same
knobs unless the trend test fails, so identical trials train identically (same losses).

New input shapes (shapes.py): when the loader repeats a fixed sample of `sample_batches` batches (the
length-stratified window of token data) and the shapes seen so far vary, warm-up also goes on until
one full pass over that sample has been read, so every shape the window meets has had its first,
one-time call (plans, autotune, graph capture, recompile) in warm-up. A fixed-shape workload warms up
exactly as without this rule; the cap does not cut the pass short (it is at most one window long).
`WORKBENCH_FIXED_WARMUP=1` in the environment restores the old fixed count (exactly `warmup_steps`).
This module is pure bookkeeping: no clocks, no torch.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

FIXED_ENV = "WORKBENCH_FIXED_WARMUP"
CAP_STEPS = 200  # warm-up steps at most (the minimum included, when it is smaller)
CAP_S = 30.0  # seconds of warm-up past the slow steps at most
TOLERANCE = 0.25  # two halves of recent steps may differ by this share of their time
HALF_STEPS = 3  # steps in each half of the trend test, at least (rounded up to whole loader cycles, >= 4 with workers)
SLOW_FACTOR = 4.0  # a step this many times the mean of its neighbours is slow, x max(1, workers / 2)
DEFAULT_PREFETCH = 2  # torch's DataLoader default with workers


def fixed_warmup() -> bool:
    """Whether `WORKBENCH_FIXED_WARMUP` asks for the old fixed warm-up count."""
    return os.environ.get(FIXED_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


def loader_buffer(loader: Any) -> tuple[int, str]:
    """(batches the loader can hold ready ahead of the loop, how that was found).

    A torch DataLoader with workers keeps `num_workers x prefetch_factor` batches requested at
    once, whatever its dataset (map-style or iterable) or sampler; without workers the main
    process loads each batch when asked and nothing is buffered. Anything else is assumed to
    buffer nothing, and the text says so.
    """
    workers = getattr(loader, "num_workers", None)
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 0:
        return 0, f"a {type(loader).__name__} without num_workers: assumed to buffer nothing"
    if workers == 0:
        return 0, "num_workers=0: the main process loads each batch when asked, nothing is buffered"
    prefetch = getattr(loader, "prefetch_factor", None)
    if not isinstance(prefetch, int) or prefetch < 1:
        return workers * DEFAULT_PREFETCH, (f"{workers} workers x prefetch_factor {DEFAULT_PREFETCH} "
                                            f"(assumed: the loader reports {prefetch!r})")
    return workers * prefetch, f"{workers} workers x prefetch_factor {prefetch}"


def cycle_steps(num_workers: int, accum_steps: int = 1) -> int:
    """Optimizer steps in one loader cycle (every worker delivers one batch): the trend test's unit."""
    return max(1, math.ceil(max(1, num_workers) / max(1, accum_steps)))


def is_steady(times_s: Sequence[float], waits_s: Sequence[float] | None = None, *, tolerance: float = TOLERANCE,
              cycle: int = 1) -> tuple[bool, str]:
    """(steady, why not) for a run of consecutive step times: no trend between its two halves.

    The halves are the last 2 x h steps, h a whole number of `cycle`s (a worker pipeline delivers
    in bursts of one batch per worker); they must take the same time within `tolerance` (a share
    of the first half's time) and wait on data (`waits_s`, same length) the same share of it.
    """
    if tolerance <= 0:
        raise ValueError(f"tolerance must be > 0, got {tolerance}")
    if cycle < 1:
        raise ValueError(f"cycle must be >= 1 step, got {cycle}")
    if waits_s is not None and len(waits_s) != len(times_s):
        raise ValueError(f"waits_s has {len(waits_s)} values for {len(times_s)} step times")
    half = len(times_s) // 2
    if half < 1:
        raise ValueError(f"the trend test needs at least 2 step times, got {len(times_s)}")
    if half >= cycle:
        half -= half % cycle
    waits = list(waits_s) if waits_s is not None else [0.0] * len(times_s)
    a, wait_a = _trimmed(list(times_s[-2 * half:-half]), waits[-2 * half:-half])
    b, wait_b = _trimmed(list(times_s[-half:]), waits[-half:])
    if a <= 0:
        return False, "the first half took no time"
    change = b / a - 1
    if abs(change) > tolerance:
        return False, (f"the last {half} steps took {change:+.0%} of the {half} before them "
                       f"({'slowing' if change > 0 else 'speeding'} up)")
    if waits_s is not None:
        share_a, share_b = wait_a / a, (wait_b / b if b > 0 else 0.0)
        if abs(share_b - share_a) > tolerance:
            return False, f"the data-wait share went from {share_a:.0%} to {share_b:.0%} of step time"
    return True, ""


def planned_warmup(min_steps: int, *, num_workers: int = 0, prefetch_factor: int | None = None,
                   accum_steps: int = 1, probe: bool = False) -> int:
    """The warm-up steps the rule takes when no step after the known slow ones (the first step, and
    the memory probe as the second when `probe`) is slow and nothing trends: what a quiet trial
    takes, and what the script `Knobs.to_code()` writes warms up (it has no clock-driven rule)."""
    if isinstance(min_steps, bool) or not isinstance(min_steps, int) or min_steps < 0:
        raise ValueError(f"min_steps must be an int >= 0, got {min_steps!r}")
    if min_steps == 0 or fixed_warmup():
        return min_steps
    buffer = num_workers * (prefetch_factor or DEFAULT_PREFETCH) if num_workers > 0 else 0
    rule = WarmupRule(min_steps=min_steps, buffer_batches=buffer, accum_steps=accum_steps,
                      num_workers=max(0, num_workers))
    last_slow = 1 if probe and min_steps >= 2 and buffer else 0
    return max(min_steps, last_slow + 1 + rule.needed())


def _trimmed(times: list[float], waits: list[float]) -> tuple[float, float]:
    """(seconds, seconds waiting) of a half without its longest step when it has 3 or more: one
    pause (another process took the core) is not a trend."""
    if len(times) >= 3:
        longest = max(range(len(times)), key=times.__getitem__)
        times, waits = times[:longest] + times[longest + 1:], waits[:longest] + waits[longest + 1:]
    return sum(times), sum(waits)


@dataclass
class WarmupRule:
    """Decides, step by step, when warm-up has reached steady state; see the module docstring.

        rule = WarmupRule(min_steps=5, buffer_batches=16)
        while not rule.done():
            rule.observe(step_seconds, wait_seconds, event="memory probe" or None)
        rule.outcome()    # steps taken, why warm-up ended, the slow steps seen

    `epoch_steps` (optimizer steps per epoch, None when unknown) decides whether an epoch start
    is a slow step: only when an epoch is long enough to warm up inside it; a shorter epoch's
    boundary is part of the steady state, and the rule says so.
    """

    min_steps: int
    buffer_batches: int = 0
    accum_steps: int = 1
    num_workers: int = 0
    buffer_text: str = ""
    epoch_steps: int | None = None
    fixed: bool = False
    sample_batches: int = 0  # batches in the sample the loader repeats (shapes.sample_batches), 0 when none
    cap_steps: int = CAP_STEPS
    cap_s: float = CAP_S
    tolerance: float = TOLERANCE
    times_s: list[float] = field(default_factory=list)
    waits_s: list[float] = field(default_factory=list)
    events: dict[int, str] = field(default_factory=dict)  # step index -> why it is slow
    boundaries: set[int] = field(default_factory=set)  # short epochs' first steps: steady, never "slow"
    ended: str = ""
    reason: str = ""
    shapes_seen: int = 0  # distinct input shapes read so far (observe's `shapes`)
    batches_read: int = 0  # batches read so far (observe's `batches`)

    def __post_init__(self) -> None:
        for name in ("min_steps", "buffer_batches", "num_workers", "sample_batches"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        if isinstance(self.accum_steps, bool) or not isinstance(self.accum_steps, int) or self.accum_steps < 1:
            raise ValueError(f"accum_steps must be an int >= 1, got {self.accum_steps!r}")
        if self.cap_steps < 1 or self.cap_s <= 0 or self.tolerance <= 0:
            raise ValueError(f"cap_steps, cap_s and tolerance must be > 0, got {self.cap_steps}, {self.cap_s}, "
                             f"{self.tolerance}")
        self.cycle = cycle_steps(self.num_workers, self.accum_steps)
        least = HALF_STEPS + 1 if self.num_workers else HALF_STEPS  # worker bursts: a little more to average
        self.half = self.cycle * math.ceil(least / self.cycle)
        self.buffer_steps = math.ceil((self.buffer_batches + 1) / self.accum_steps) if self.buffer_batches else 0
        self.slow_factor = SLOW_FACTOR * max(1.0, self.num_workers / 2)  # bursts grow with the workers
        self.epoch_is_slow = self.epoch_steps is None or self.epoch_steps > 2 * self.needed()

    @classmethod
    def for_loader(cls, loader: Any, min_steps: int, *, accum_steps: int = 1, cached: bool = False,
                   fixed: bool | None = None, sample_batches: int = 0) -> WarmupRule:
        """The rule for a trial reading `loader` (`cached`: one batch reused, nothing buffered;
        `sample_batches`: the batches of the fixed sample it repeats, shapes.sample_batches)."""
        if cached:
            buffer, text, workers = 0, "data='cached': one batch reused, no loader", 0
        else:
            buffer, text = loader_buffer(loader)
            workers = getattr(loader, "num_workers", 0) if buffer else 0
        try:
            batches = len(loader)
        except TypeError:  # an IterableDataset of unknown length
            batches = None
        epoch = None if batches is None or cached else max(1, batches // max(1, accum_steps))
        return cls(min_steps=min_steps, buffer_batches=buffer, accum_steps=accum_steps, num_workers=workers,
                   buffer_text=text, epoch_steps=epoch, fixed=fixed_warmup() if fixed is None else fixed,
                   sample_batches=0 if cached else sample_batches)

    def needed(self) -> int:
        """Steps after the last slow step before the trend test can end warm-up."""
        return self.buffer_steps + 2 * self.half

    def observe(self, step_s: float, wait_s: float = 0.0, event: str | None = None, *, shapes: int | None = None,
                batches: int | None = None, new_shapes: int = 0) -> None:
        """Record one warm-up step: its seconds, its host seconds waiting on data, and why it is
        known to be slow ('memory probe', 'epoch start', ...; the first step always is); `shapes` and
        `batches`: distinct input shapes and batches read so far, `new_shapes`: how many this step met
        first (shapes.ShapeWatch). With a repeated sample such a step is slow: its first calls are."""
        if not math.isfinite(step_s) or step_s < 0:
            raise ValueError(f"step_s must be a finite number of seconds >= 0, got {step_s!r}")
        if shapes is not None:
            self.shapes_seen = shapes
        if batches is not None:
            self.batches_read = batches
        i = len(self.times_s)
        if i == 0:
            event = event or "first step (start-up, compile)"
        if event == "epoch start" and not self.epoch_is_slow:
            event = None  # short epochs: their boundaries belong to the steady state
            self.boundaries.add(i)  # (workers restarting there make the step long: not a slow step either)
        if event == "memory probe" and not self.buffer_batches:
            event = None  # it refills no buffer; the trend test drops the longest step of each half
        if not event and new_shapes and self.sample_batches:
            event = f"first call on {new_shapes} new input shape{'s' if new_shapes > 1 else ''}"
        if event:
            self.events[i] = event
        self.times_s.append(float(step_s))
        self.waits_s.append(max(0.0, float(wait_s)))

    @property
    def steps(self) -> int:
        """Warm-up steps observed so far."""
        return len(self.times_s)

    def last_slow(self) -> tuple[int, str]:
        """(index, why) of the last slow step: a known event or a step far above its neighbours."""
        n = len(self.times_s)
        last_event = max(self.events, default=-1)
        if not self.buffer_batches:  # a pause fills no buffer: the trend test alone judges what follows
            return last_event, self.events.get(last_event, "")
        after, later = 0.0, 0
        for i in range(n - 1, last_event, -1):
            if i in self.boundaries:  # a short epoch's start recurs every epoch: it cannot be waited out
                continue
            if later:
                ref = after / later
            else:
                before = [self.times_s[j] for j in range(max(last_event + 1, i - 2 * self.half), i)
                          if j not in self.boundaries]
                ref = sum(before) / len(before) if before else math.inf
            if ref > 0 and self.times_s[i] > self.slow_factor * ref:
                return i, f"a step {self.times_s[i] / ref:.0f}x its neighbours (recompile or pause?)"
            after += self.times_s[i]
            later += 1
        return last_event, self.events.get(last_event, "")

    def done(self) -> bool:
        """Whether warm-up may end now (sets `ended` and `reason` when it does; asking again after
        another step decides afresh, so ranks that must agree can overrule a single answer)."""
        n = len(self.times_s)
        self.ended = self.reason = ""
        if n < self.min_steps:
            return False
        if self.fixed or self.min_steps == 0:
            self.ended = "fixed"
            self.reason = (f"{FIXED_ENV} is set: exactly warmup_steps={self.min_steps}" if self.fixed
                           else "warmup_steps=0: no warm-up asked, the window includes start-up")
            return True
        if not self._settled(n):
            return False
        if self.shapes_pending():  # steady (or capped), but some shapes of the repeated sample are unseen
            self.ended = self.reason = ""
            return False
        if self.sample_batches and self.shapes_seen > 1:
            self.reason += (f"; one pass over the {self.sample_batches} batches the window repeats met every input "
                            f"shape ({self.shapes_seen}) before the window")
        return True

    def shapes_pending(self) -> bool:
        """Whether the shapes read vary and the fixed sample the window repeats has not been read once yet."""
        return bool(self.sample_batches) and self.shapes_seen > 1 and self.batches_read < self.sample_batches

    def _settled(self, n: int) -> bool:
        """The steady-state test and the cap (sets `ended` and `reason` when either ends warm-up)."""
        slow, why = self.last_slow()
        since = n - 1 - slow
        if since >= self.needed():
            recent = slice(n - 2 * self.half, n)
            steady, trend = is_steady(self.times_s[recent], self.waits_s[recent], tolerance=self.tolerance,
                                      cycle=self.cycle)
            if steady:
                self.ended, self.reason = "steady", self._steady_text(slow, why)
                return True
        else:
            trend = f"only {since} steps since the last slow step ({why}), {self.needed()} needed"
        waited = sum(t for i, t in enumerate(self.times_s) if i not in self.events)
        if n >= max(self.cap_steps, self.min_steps) or waited >= self.cap_s:
            self.ended = "cap"
            self.reason = (f"no steady state after {n} warm-up steps ({waited:.1f} s past the slow steps): "
                           f"{trend}")
            return True
        return False

    def _steady_text(self, slow: int, why: str) -> str:
        buffer = (f"the loader's buffer ({self.buffer_batches} batches: {self.buffer_text}) consumed"
                  if self.buffer_batches else "no loader buffer to consume")
        return (f"steady after step {slow + 1} ({why}): {buffer}, and the last {2 * self.half} steps "
                f"show no trend")

    def outcome(self) -> dict[str, Any]:
        """What the rule did, for `TrialResult.extra['warmup_rule']`."""
        slow, why = self.last_slow() if self.times_s else (-1, "")
        return {"rule": "fixed" if self.ended == "fixed" else "steady", "steps": len(self.times_s),
                "min_steps": self.min_steps, "ended": self.ended or "stopped", "reason": self.reason,
                "buffer_batches": self.buffer_batches, "buffer": self.buffer_text,
                "last_slow_step": slow + 1, "last_slow": why,
                "slow_steps": {str(i + 1): w for i, w in sorted(self.events.items())},
                "epoch_steps": self.epoch_steps, "epoch_is_slow": self.epoch_is_slow,
                "seconds": sum(self.times_s), "shapes": self.shapes_seen, "sample_batches": self.sample_batches}

    def note(self) -> str | None:
        """The trial note for a warm-up that did not reach steady state (None when it did)."""
        if self.ended == "cap":
            return (f"warm-up cap: {self.reason}; the window may still drain the loader's buffer or "
                    "follow a trend, so treat the figure as not steady")
        if self.ended == "fixed" and self.min_steps == 0 and not self.fixed:
            return "not steady: warmup_steps=0, so the window includes start-up (and compile, if any)"
        return None
