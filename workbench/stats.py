"""The noise model: how far apart two trials of the *same* knobs land on this machine, and verdicts
that account for it.

Why between trials: the steps inside one trial are not independent draws of the next trial. Load
from other processes, thread placement, allocator state and the data pipeline's phase shift a
whole trial by several percent (identical trials measured up to 20% apart on a 2-core machine),
so a bootstrap over one trial's steps calls such pairs "beyond noise". The unit of evidence here
is the trial: each trial contributes one number, log(samples/s), and

    log(samples/s of a trial) = log(true rate of its knobs) + e,   e ~ Normal(0, sigma^2)

`sigma` (the between-trial noise) is learnt from repeats of identical knobs (the log's own
repeats, the alternating rounds of `compare(..., rounds=N)`, a re-run baseline), pooled across
configurations and blended with a conservative prior that dominates until evidence exists. A
difference is "beyond noise" when a Student-t interval of the log-ratio of the two configurations'
mean rates excludes zero *and* the ratio is at least MIN_EFFECT away from 1.

Pure numbers only (numpy and math): no torch, no trials; `results.compare` runs the rounds.
"""

from __future__ import annotations

import html
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95
MIN_EFFECT = 0.02  # ratios within 2% of 1 are called noise even when the interval excludes 1
PRIOR_NOISE = 0.10  # sd of log(samples/s) between identical trials assumed before any evidence
PRIOR_WEIGHT = 4.0  # the prior counts as this many degrees of freedom of evidence
MIN_NOISE = 0.01  # never believe identical trials agree better than 1% (sd), however quiet the log
MAX_ROUNDS_HINT = 20  # beyond this many rounds a gap is called too small to settle


def t_quantile(p: float, df: float) -> float:
    """Student-t quantile (Cornish-Fisher expansion around the normal; within 0.3% for df >= 3)."""
    z = statistics.NormalDist().inv_cdf(p)
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4


def critical(df: float) -> float:
    """The two-sided CONFIDENCE critical value of Student's t with `df` degrees of freedom."""
    return t_quantile(1 - (1 - CONFIDENCE) / 2, df)


@dataclass(frozen=True)
class Noise:
    """This machine's between-trial noise: sd of log(samples/s) for identical knobs, and its evidence."""

    sigma: float  # blended estimate (prior + evidence), relative sd of one trial's samples/s
    df: float  # degrees of freedom of the estimate, prior included
    repeats: int  # trials beyond the first of each repeated configuration (the evidence)
    configs: int  # configurations that were repeated
    measured: float | None = None  # the evidence alone (None without repeats)

    @property
    def spread(self) -> float:
        """How far apart two single identical trials land in 95% of cases (0.2 = 20%)."""
        return math.exp(critical(self.df) * math.sqrt(2) * self.sigma) - 1

    def __str__(self) -> str:
        if not self.repeats:
            return (f"identical trials here may differ by {self.spread_words} (a conservative prior: no repeated "
                    "knobs yet; bench.compare(a, b, rounds=2) or re-running the baseline teaches the workbench "
                    "this machine's noise)")
        return (f"identical trials here differ by {self.spread_words} (from {self.repeats} repeat"
                f"{'s' if self.repeats != 1 else ''} of {self.configs} configuration{'s' if self.configs != 1 else ''}"
                f"; a single trial's samples/s varies by {self.sigma:.1%} sd)")

    __repr__ = __str__

    @property
    def spread_words(self) -> str:
        """The spread as people say it: ±12% when small, 'up to 2.6×' (a factor) when large."""
        return f"±{self.spread:.0%}" if self.spread < 0.5 else f"up to {1 + self.spread:.1f}×"


def estimate_noise(groups: Sequence[Sequence[float]]) -> Noise:
    """Pool the spread of log(samples/s) within groups of identical knobs, blended with the prior.

    `groups`: one sequence of per-trial samples/s per configuration (singletons carry no evidence).
    """
    ss, df, configs = 0.0, 0, 0
    for g in groups:
        x = np.log([v for v in g if v and v > 0 and math.isfinite(v)])
        if len(x) >= 2:
            ss += float(((x - x.mean()) ** 2).sum())
            df += len(x) - 1
            configs += 1
    measured = math.sqrt(ss / df) if df else None
    var = (PRIOR_WEIGHT * PRIOR_NOISE**2 + ss) / (PRIOR_WEIGHT + df)
    return Noise(max(MIN_NOISE, math.sqrt(var)), PRIOR_WEIGHT + df, df, configs, measured)


PRIOR = estimate_noise([])


@dataclass(frozen=True)
class Comparison:
    """Configuration B against A from per-trial samples/s, judged against between-trial noise.

    `speedup` is the ratio of measured-window samples/s (geometric means over each side's trials):
    1.25 means B does 25% more samples per second. `low`/`high` bound it at CONFIDENCE.
    """

    a: int | None  # the trial ids asked about
    b: int | None
    speedup: float
    low: float
    high: float
    beyond_noise: bool
    a_trials: tuple[int | None, ...] = ()  # every trial each side's verdict rests on
    b_trials: tuple[int | None, ...] = ()
    a_rates: tuple[float, ...] = ()  # their samples/s
    b_rates: tuple[float, ...] = ()
    rounds: int = 0  # alternating rounds run for this comparison
    noise: Noise = PRIOR
    rounds_needed: int | None = None  # more rounds that would settle a gap this size (within noise only)
    note: str = ""  # e.g. a round that failed

    @property
    def verdict(self) -> str:
        return "beyond noise" if self.beyond_noise else "within noise"

    def _evidence(self) -> str:
        na, nb = len(self.a_rates), len(self.b_rates)
        each = f"{na} trial{'s' if na != 1 else ''} each" if na == nb else f"{na} vs {nb} trials"
        how = f" in {self.rounds} alternating round{'s' if self.rounds != 1 else ''}" if self.rounds else ""
        return f"{each}{how}"

    def _settle(self) -> str:
        if abs(self.speedup - 1) < MIN_EFFECT:
            return f"a gap under {MIN_EFFECT:.0%} counts as no difference"
        if self.rounds_needed is None:
            return f"a gap this small would need more than {MAX_ROUNDS_HINT} rounds to settle; treat it as no difference"
        n = self.rounds_needed
        ids = f"{self.a}, {self.b}" if self.a is not None and self.b is not None else "a, b"
        return (f"about {n} more round{'s' if n != 1 else ''} (bench.compare({ids}, rounds={n})) "
                "would settle a gap this size if it is real")

    def __str__(self) -> str:
        pct = (self.speedup - 1) * 100
        interval = f"{(self.low - 1) * 100:+.1f}% … {(self.high - 1) * 100:+.1f}%"
        tail = f" {self.note}" if self.note else ""
        if not self.beyond_noise:
            return (f"#{self.b} vs #{self.a}: within noise ({pct:+.1f}%, {CONFIDENCE:.0%} interval {interval}, "
                    f"{self._evidence()}); no winner: {self._settle()}.{tail}")
        word = "faster" if pct > 0 else "slower"
        return (f"#{self.b} is {abs(pct):.1f}% {word} than #{self.a} (beyond noise: {CONFIDENCE:.0%} interval "
                f"{interval}, {self._evidence()}).{tail}")

    __repr__ = __str__

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{side}</td><td>{', '.join(f'#{t}' for t in ids)}</td>"
            f"<td>{', '.join(f'{r:,.1f}' for r in rates)}</td></tr>"
            for side, ids, rates in (("A", self.a_trials, self.a_rates), ("B", self.b_trials, self.b_rates)))
        color = "#2e7d32" if self.beyond_noise else "#616161"
        return (f'<p style="color:{color}">{html.escape(str(self))}</p>'  # the sentence says the verdict once
                f'<table class="wb-comparison"><tr><th></th><th>trials</th><th>samples/s</th></tr>{rows}</table>'
                f"<p><small>{html.escape(str(self.noise))}</small></p>")


def decide(a_rates: Sequence[float], b_rates: Sequence[float], noise: Noise = PRIOR, *,
           a_trials: Sequence[int | None] = (), b_trials: Sequence[int | None] = (), rounds: int = 0,
           note: str = "") -> Comparison:
    """B against A from per-trial samples/s: a t interval of the log-ratio of the mean rates.

    The noise is the larger of the model's and these trials' own spread (when they have any),
    so a configuration noisier than the machine's usual cannot win on the pooled figure.
    """
    xa, xb = np.log(np.asarray(a_rates, dtype=float)), np.log(np.asarray(b_rates, dtype=float))
    if len(xa) < 1 or len(xb) < 1 or not (np.isfinite(xa).all() and np.isfinite(xb).all()):
        raise ValueError("compare needs at least one positive samples/s figure on each side; compare ok trials")
    na, nb = len(xa), len(xb)
    sigma = noise.sigma
    local_df = na + nb - 2
    if local_df >= 2:
        local = math.sqrt((((xa - xa.mean()) ** 2).sum() + ((xb - xb.mean()) ** 2).sum()) / local_df)
        sigma = max(sigma, local)
    d = float(xb.mean() - xa.mean())
    crit = critical(noise.df)
    half = crit * sigma * math.sqrt(1 / na + 1 / nb)
    speedup = math.exp(d)
    beyond = abs(d) > half and abs(speedup - 1) >= MIN_EFFECT
    needed = None
    if not beyond and abs(speedup - 1) >= MIN_EFFECT:
        needed = next((k for k in range(1, MAX_ROUNDS_HINT + 1)
                       if crit * sigma * math.sqrt(1 / (na + k) + 1 / (nb + k)) < abs(d)), None)
    return Comparison(a_trials[0] if a_trials else None, b_trials[0] if b_trials else None, speedup,
                      math.exp(d - half), math.exp(d + half), bool(beyond), tuple(a_trials), tuple(b_trials),
                      tuple(float(v) for v in a_rates), tuple(float(v) for v in b_rates), rounds, noise, needed, note)


__all__ = ["CONFIDENCE", "MIN_EFFECT", "PRIOR", "PRIOR_NOISE", "Comparison", "Noise", "critical", "decide",
           "estimate_noise", "t_quantile"]
