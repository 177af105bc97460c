"""Deciding between two configurations from trials already run: the core of `compare`, which runs nothing.

`judge(a, b)` checks the trials, learns the between-trial noise (given, a log's, or these trials'
own) and hands their samples/s to `stats.decide`. The driver that RUNS alternating rounds of trials
before deciding sits above the core, in `rounds.py` (`results.compare` is that one). The results
table judges its rows with the same rule (`stats.one_look`).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from ..core.knobs import Knobs
from ..core.measure import TrialResult
from .rules import MARGIN, check_margin
from .stats import Comparison, Noise, decide, pooled_noise

Trials = TrialResult | Sequence[TrialResult]


class HasNoise(Protocol):
    """What `judge` reads of a log: its between-trial noise (a `ResultLog` has it)."""

    @property
    def noise(self) -> Noise: ...


LENGTH_KNOBS = ("group_by_length", "pad_to_multiple_of", "packing")  # knobs that change how batches are padded
PADDING_GAP = 0.01  # padding shares further apart than this: the sides pad differently


def rate_for(runs_a: Sequence[TrialResult], runs_b: Sequence[TrialResult]) -> str:
    """"tokens/s" when every trial counted tokens and the sides pad or pack their batches differently
    (a length knob differs, or the padding shares do): samples/s would credit padding as work.
    Else "samples/s"."""
    runs = [*runs_a, *runs_b]
    if not runs or not all(r.tokens_per_s for r in runs):
        return "samples/s"
    a, b = runs_a[-1].knobs, runs_b[-1].knobs
    shares = [r.padding_share or 0.0 for r in runs]
    differ = any(getattr(a, n, None) != getattr(b, n, None) for n in LENGTH_KNOBS)
    return "tokens/s" if differ or max(shares) - min(shares) > PADDING_GAP else "samples/s"


@dataclass(frozen=True)
class Basis:
    """What a pair of sides is judged on: the figure ("samples/s" or "tokens/s") and the "same speed" margin."""

    rate: str
    margin: float = MARGIN


def judged_on(runs_a: Sequence[TrialResult], runs_b: Sequence[TrialResult], margin: float = MARGIN) -> Basis:
    """THE rule for what a comparison of these two sides is judged on: `rate_for`'s figure and `margin`
    (checked). `judge`, the results table's verdicts and `compare`'s rounds all ask this, so a row's
    verdict is its comparison's."""
    check_margin(margin)
    return Basis(rate_for(runs_a, runs_b), float(margin))


def rates(runs: Sequence[TrialResult], rate: str) -> list[float]:
    """Each trial's figure in `rate` ("samples/s" or "tokens/s")."""
    return [float((r.tokens_per_s if rate == "tokens/s" else r.samples_per_s) or 0.0) for r in runs]


def real_run(r: TrialResult) -> bool:
    """True for a row a callback measured in the user's own training run (source "real run"), not a trial."""
    return isinstance(r.extra, dict) and r.extra.get("source") == "real run"


def usable(r: TrialResult) -> bool:
    """True when a trial can be compared: ok, with a samples/s figure and at least 2 step times."""
    return r.ok and bool(r.samples_per_s) and len(r.step_times_s) >= 2


def trials_of(x: Trials) -> list[TrialResult]:
    """One side of a comparison as a list of repeats of one configuration (TypeError/ValueError if it is not)."""
    runs = [x] if isinstance(x, TrialResult) else list(x)
    if not runs or not all(isinstance(r, TrialResult) for r in runs):
        raise TypeError("compare takes TrialResults (or lists of trials of the same knobs); "
                        "bench.compare also takes trial ids")
    for r in runs:
        if not usable(r):
            raise ValueError(f"trial #{r.trial_id} has no step-time samples (status {r.status}); compare ok trials")
    if len({r.knobs for r in runs}) > 1:
        raise ValueError("a list passed to compare must hold trials of identical knobs (repeats of one configuration)")
    return runs


class NoiseTracker:
    """The between-trial noise of a growing set of trials, one trial at a time: the results table adds each
    trial as it arrives, `noise_of` a batch. Repeats of identical knobs pool by Welford's update of each
    configuration's log(samples/s); back-to-back pairs (consecutive trial ids, same knobs, in any arrival
    order) add their squared log-ratio to a running sum. The figure is `stats.pooled_noise` of those sums,
    as `estimate_noise` and `adjacent_noise` give it from the same trials all at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.groups: dict[Knobs, tuple[int, float, float]] = {}  # knobs -> (n, mean, ss) of log samples/s
        self.by_id: dict[int, tuple[Knobs, float]] = {}  # trial id -> (knobs, log samples/s), for the pairs
        self.ss, self.df, self.configs = 0.0, 0, 0
        self.adjacent_ss, self.pairs = 0.0, 0
        self._noise: Noise | None = None

    def add(self, r: TrialResult) -> None:
        """Take in one trial (a trial that cannot be compared carries no evidence and changes nothing)."""
        v = float(r.samples_per_s or 0.0)
        if not usable(r) or real_run(r) or not (v > 0 and math.isfinite(v)):
            return
        x = math.log(v)
        with self.lock:
            n, mean, ss = self.groups.get(r.knobs, (0, 0.0, 0.0))
            delta = x - mean
            mean += delta / (n + 1)
            grow = delta * (x - mean)
            self.groups[r.knobs] = (n + 1, mean, ss + grow)
            self.ss, self.df, self.configs = self.ss + grow, self.df + (n >= 1), self.configs + (n == 1)
            t = r.trial_id
            if t is not None and t not in self.by_id:
                self.by_id[t] = (r.knobs, x)
                for other in (self.by_id.get(t - 1), self.by_id.get(t + 1)):
                    if other is not None and other[0] == r.knobs:
                        self.adjacent_ss, self.pairs = self.adjacent_ss + (x - other[1]) ** 2, self.pairs + 1
            self._noise = None

    def noise(self) -> Noise:
        """The noise of the trials taken in so far (the prior until repeats exist)."""
        with self.lock:
            if self._noise is None:
                self._noise = pooled_noise(self.ss, self.df, self.configs, self.adjacent_ss, self.pairs)
            return self._noise


def noise_of(trials: Iterable[TrialResult]) -> Noise:
    """The between-trial noise these trials show: repeats of identical knobs, pooled (see stats.py),
    and how far back-to-back identical trials land apart (consecutive trial ids, same knobs)."""
    tracker = NoiseTracker()
    for r in trials:
        tracker.add(r)
    return tracker.noise()


def allocator_note(runs_a: Sequence[TrialResult], runs_b: Sequence[TrialResult]) -> str:
    """A sentence on the process modes: when the allocator is the knob compared, how its trials ran
    (each in a fresh process, alternating); otherwise when the two sides ran in different allocator
    modes or malloc settings (env "allocator", "malloc"): part of the difference is then the process."""
    runs = [*runs_a, *runs_b]
    if runs_a and runs_b and runs_a[0].knobs.allocator != runs_b[0].knobs.allocator:
        return ("The allocator is the knob compared: each trial ran in a fresh process started in its mode "
                "(never interleaved in one process, which cannot change its allocator), alternating A B.")
    modes = {r.env.get("allocator") for r in runs if r.env.get("allocator")}
    if len(modes) > 1:
        return (f"The trials' processes ran in different allocator modes ({', '.join(sorted(modes))}): part of "
                "the difference may be the process rather than the knobs; pin allocator= on both to compare "
                "the knobs alone (docs/measurement.md 'The process is a knob').")
    seen = {r.env.get("malloc") for r in runs if r.env.get("malloc") is not None}
    if len(seen) < 2:  # one setting, or logs from before the environment recorded it
        return ""
    return (f"The trials ran with different malloc settings ({', '.join(sorted(s or 'not glibc' for s in seen))}): "
            "part of the difference may be page faults rather than the knobs (docs/measurement.md 'Page faults').")


def steady_note(runs_a: Sequence[TrialResult], runs_b: Sequence[TrialResult]) -> str:
    """A sentence when any trial on either side was not steady (warm-up cap, a trending window, a
    window faster than its loader): the answer then rests on figures that may not be the pipeline's."""
    bad = [r for r in [*runs_a, *runs_b] if r.steady is False]
    if not bad:
        return ""
    ids = ", ".join(f"#{r.trial_id}" if r.trial_id is not None else "a trial" for r in bad)
    return (f"Not steady: {ids} (see its notes); the answer rests on figures that may not be the pipeline's "
            "steady state, so repeat those trials before believing it.")


def caveats(runs_a: Sequence[TrialResult], runs_b: Sequence[TrialResult], note: str = "") -> str:
    """The comparison's note: how it came about, then what may make its answer less than it says."""
    return " ".join(filter(None, [note, allocator_note(runs_a, runs_b), steady_note(runs_a, runs_b)]))


def judge(a: Trials, b: Trials, *, log: HasNoise | None = None, noise: Noise | None = None,
          margin: float = MARGIN, rounds: int = 0, note: str = "", seconds: float | None = None) -> Comparison:
    """Is B faster than A, slower, the same speed, or undecided? One look at trials already run (runs none).

    `a`, `b`: a trial each, or lists of repeats of one configuration. The noise is `noise`, else
    `log`'s (its repeats of identical knobs), else these trials' own; until repeats exist it is a
    conservative prior. `rounds`, `note` and `seconds` describe how the trials came about (a driver
    that ran alternating rounds passes them through). The figure judged is `judged_on`'s (tokens/s when
    the sides pad token batches differently, else samples/s); the rule is `stats.decide`'s.
    """
    runs_a, runs_b = trials_of(a), trials_of(b)
    basis = judged_on(runs_a, runs_b, margin)
    if noise is None:
        noise = log.noise if log is not None else noise_of([*runs_a, *runs_b])
    note = caveats(runs_a, runs_b, note)
    c = decide(rates(runs_a, basis.rate), rates(runs_b, basis.rate), noise,
               a_trials=[r.trial_id for r in runs_a], b_trials=[r.trial_id for r in runs_b], rounds=rounds,
               note=note, margin=basis.margin, seconds=seconds)
    return replace(c, rate=basis.rate)
