"""Deciding between two configurations from trials already run: the core of `compare`, which runs nothing.

`judge(a, b)` checks the trials, learns the between-trial noise (given, a log's, or these trials'
own) and hands their samples/s to `stats.decide`. The driver that RUNS alternating rounds of trials
before deciding sits above the core, in `rounds.py` (`results.compare` is that one). The results
table judges its rows with the same rule (`stats.one_look`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Protocol

from ..core.knobs import Knobs
from ..core.measure import TrialResult
from .stats import MARGIN, Comparison, Noise, adjacent_noise, decide, estimate_noise

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


def rates(runs: Sequence[TrialResult], rate: str) -> list[float]:
    """Each trial's figure in `rate` ("samples/s" or "tokens/s")."""
    return [float((r.tokens_per_s if rate == "tokens/s" else r.samples_per_s) or 0.0) for r in runs]


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


def check_margin(margin: float) -> None:
    """ValueError unless `margin` is a fraction between 0 and 1."""
    if not isinstance(margin, (int, float)) or isinstance(margin, bool) or not 0 < margin < 1:
        raise ValueError(f"margin must be a fraction between 0 and 1 (0.05 = ±5%), got {margin!r}")


def noise_of(trials: Iterable[TrialResult]) -> Noise:
    """The between-trial noise these trials show: repeats of identical knobs, pooled (see stats.py),
    and how far back-to-back identical trials land apart (consecutive trial ids, same knobs)."""
    groups: dict[Knobs, list[float]] = {}
    ok = [r for r in trials if usable(r)]
    for r in ok:
        groups.setdefault(r.knobs, []).append(float(r.samples_per_s or 0.0))
    ordered = sorted((r for r in ok if r.trial_id is not None), key=lambda r: r.trial_id or 0)
    pairs = [(float(x.samples_per_s or 0.0), float(y.samples_per_s or 0.0)) for x, y in itertools.pairwise(ordered)
             if y.trial_id == (x.trial_id or 0) + 1 and x.knobs == y.knobs]
    noise = estimate_noise(list(groups.values()))
    return replace(noise, adjacent=adjacent_noise(pairs), adjacent_pairs=len(pairs))


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
    that ran alternating rounds passes them through). The rule is `stats.decide`'s.
    """
    runs_a, runs_b = trials_of(a), trials_of(b)
    check_margin(margin)
    if noise is None:
        noise = log.noise if log is not None else noise_of([*runs_a, *runs_b])
    note = caveats(runs_a, runs_b, note)
    rate = rate_for(runs_a, runs_b)
    c = decide(rates(runs_a, rate), rates(runs_b, rate), noise,
               a_trials=[r.trial_id for r in runs_a], b_trials=[r.trial_id for r in runs_b], rounds=rounds,
               note=note, margin=margin, seconds=seconds)
    return replace(c, rate=rate)
