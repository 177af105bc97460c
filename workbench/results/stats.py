"""The noise model: how far apart two trials of the *same* knobs land on this machine, and verdicts
that account for it.

Why between trials: the steps inside one trial are not independent draws of the next trial. Load
from other processes, thread placement, allocator state and the data pipeline's phase shift a
whole trial by several percent (identical trials measured up to 20% apart on a 2-core machine),
so a bootstrap over one trial's steps calls such pairs different. The unit of evidence here
is the trial: each trial contributes one number, log(samples/s), and

    log(samples/s of a trial) = log(true rate of its knobs) + e,   e ~ Normal(0, sigma^2)

`sigma` (the between-trial noise) is learnt from repeats of identical knobs (the log's own
repeats, the alternating rounds of `compare(..., rounds=N)`, a re-run baseline), pooled across
configurations and blended with a conservative prior that dominates until evidence exists. A
B is "faster" (or "slower") when a Student-t interval of the log-ratio of the two configurations'
mean rates excludes zero *and* the ratio is at least MIN_EFFECT away from 1; "same" (speed) when the
interval lies within ±margin; otherwise "undecided". That is the one-look rule of the
table's verdicts and of `compare(..., rounds=N)`.

Identical trials also drift: the level shifts for a while, then shifts back. `compare(...,
rounds="auto")` therefore judges each B against the A run just before it (per-round log-ratios,
where a shared level cancels) and looks after every round, spending the 5% error
rate across at most 1 + max_rounds looks (`look_alpha`), so stopping when decided keeps the error
rates (`decide_sequential`). The paired sd starts from what the log already knows (`paired_prior`:
its back-to-back repeats of identical knobs), and "same speed" is an equivalence test (two
one-sided tests at the look's rate), so a quiet machine can say "same speed" within a few rounds.

Pure numbers only (numpy and math): no torch, no trials; `rounds.compare` runs the rounds. `one_look` is the
one-look rule, vectorised: `decide` and the results table both call it.
"""

from __future__ import annotations

import functools
import math
import statistics
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..core.views import html_view
from .rules import ANSWER_WORDS, MARGIN, Answer, check_margin

CONFIDENCE = 0.95
MIN_EFFECT = 0.02  # ratios within 2% of 1 are called noise even when the interval excludes 1
PRIOR_NOISE = 0.10  # sd of log(samples/s) between identical trials assumed before any evidence
PRIOR_WEIGHT = 4.0  # the prior counts as this many degrees of freedom of evidence
MIN_NOISE = 0.01  # never believe identical trials agree better than 1% (sd), however quiet the log
MAX_ROUNDS_HINT = 20  # beyond this many rounds a gap is called too small to settle
PAIRED_PRIOR_SD = 0.10  # sd of log(B/A) between back-to-back trials assumed before any pair is measured
PAIRED_PRIOR_DF = 2.0  # the paired prior counts as this many degrees of freedom (weak: data win by round 3)
TOO_NOISY = 0.25  # identical trials landing further apart than ±25%: too noisy to decide small differences
PAIRED_PRIOR_MAX_DF = 6.0  # a paired sd learnt from the log's back-to-back repeats counts as at most this many


def t_quantile(p: float, df: float) -> float:
    """Student-t quantile: bisection on the exact CDF (see `t_cdf`), accurate far into the tails."""
    return _t_quantile(round(p, 12), round(df, 9))


@functools.lru_cache(maxsize=4096)
def _t_quantile(p: float, df: float) -> float:
    if not 0 < p < 1 or df <= 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    if p < 0.5:
        return -_t_quantile(1 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2


def t_cdf(x: float, df: float) -> float:
    """Student-t CDF through the regularized incomplete beta function."""
    tail = 0.5 * _betainc(df / 2, 0.5, df / (df + x * x))
    return 1 - tail if x >= 0 else tail


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b) (Lentz's continued fraction)."""
    if x <= 0 or x >= 1:
        return 0.0 if x <= 0 else 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x > (a + 1) / (a + b + 2):
        return 1 - _betainc(b, a, 1 - x)
    tiny, c, d = 1e-300, 1.0, 1 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1 + num * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + num / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1) < 1e-14:
            break
    return front * f / a


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

    adjacent: float | None = None  # sd of one trial's log(samples/s) against the identical trial just before it
    adjacent_pairs: int = 0  # back-to-back pairs of identical knobs behind `adjacent`

    @property
    def adjacent_spread(self) -> float | None:
        """How far apart two back-to-back identical trials land in 95% of cases (None without pairs)."""
        if self.adjacent is None:
            return None
        return math.exp(statistics.NormalDist().inv_cdf(0.975) * math.sqrt(2) * self.adjacent) - 1

    @property
    def too_noisy(self) -> bool:
        """True when this machine's own evidence says identical trials land more than TOO_NOISY apart
        (back-to-back, or minutes apart from 2+ repeats): too noisy to decide a small difference."""
        measured = (math.exp(critical(max(self.repeats, 1)) * math.sqrt(2) * self.measured) - 1
                    if self.measured is not None and self.repeats >= 2 else 0.0)
        return (self.adjacent_spread or 0.0) > TOO_NOISY or measured > TOO_NOISY

    def advice(self, busy_cores: float | None = None) -> str:
        """What to do on a machine too noisy to decide: who took the CPU (when known), and the fix."""
        who = (f"other processes kept {busy_cores:.1f} cores busy during the last trials: close them" if busy_cores
               else "something else is using this machine: close other programs")
        return (f"{who}, or decide with bench.compare(a, b, rounds=\"auto\"), which pairs "
                "back-to-back trials (or interleaves turns in one process) so slow drifts cancel")

    def __str__(self) -> str:
        if self.too_noisy:
            seen = [w for w in (self._adjacent_spread_words(), self.spread_words if self.repeats >= 2 else "") if w]
            return (f"too noisy to decide small differences: identical trials here landed {seen[0]} apart "
                    f"(from {self.repeats} repeat{'s' if self.repeats != 1 else ''} of {self.configs} "
                    f"configuration{'s' if self.configs != 1 else ''}); {self.advice()}")
        if not self.repeats:
            return (f"identical trials here may differ by {self.spread_words} (a conservative prior: no repeated "
                    "knobs yet; bench.compare(a, b, rounds='auto') or re-running the baseline teaches the workbench "
                    "this machine's noise)")
        return (f"{self.adjacent_words}; trials of identical knobs minutes apart differ by {self.spread_words} "
                f"(from {self.repeats} repeat{'s' if self.repeats != 1 else ''} of {self.configs} "
                f"configuration{'s' if self.configs != 1 else ''}; a single trial's samples/s varies by "
                f"{self.sigma:.1%} sd)")

    @property
    def adjacent_words(self) -> str:
        """Back-to-back identical trials in words (what alternating rounds pair against each other)."""
        if self.adjacent is None:
            return "no back-to-back repeats of identical knobs yet (alternating rounds measure them)"
        n = self.adjacent_pairs
        return (f"back-to-back trials of identical knobs typically land within {self._adjacent_spread_words()} of "
                f"each other ({self.adjacent:.1%} sd, from {n} pair{'s' if n != 1 else ''})")

    def _adjacent_spread_words(self) -> str:
        spread = self.adjacent_spread
        return "" if spread is None else words_of_spread(spread)

    __repr__ = __str__

    @property
    def spread_words(self) -> str:
        """The spread as people say it: ±12% when small, 'up to 2.6×' (a factor) when large."""
        return words_of_spread(self.spread)


def words_of_spread(spread: float) -> str:
    """A spread as people say it: ±12% when small, 'up to 2.6×' (a factor) when large (never ±103%)."""
    return f"±{spread:.0%}" if spread < 0.5 else f"up to {1 + spread:.1f}×"


def estimate_noise(groups: Sequence[Sequence[float]]) -> Noise:
    """Pool the spread of log(samples/s) within groups of identical knobs, blended with the prior. `groups`: one
    sequence of per-trial samples/s per configuration (singletons carry no evidence)."""
    ss, df, configs = 0.0, 0, 0
    for g in groups:
        x = np.log([v for v in g if v and v > 0 and math.isfinite(v)])
        if len(x) >= 2:
            ss += float(((x - x.mean()) ** 2).sum())
            df += len(x) - 1
            configs += 1
    return pooled_noise(ss, df, configs)


def pooled_noise(ss: float, df: int, configs: int, adjacent_ss: float = 0.0, pairs: int = 0) -> Noise:
    """The noise from sums of squares of log(samples/s): within `configs` repeated configurations (`df` repeats beyond
    each one's first) and over `pairs` back-to-back pairs; `estimate_noise` and `comparison.NoiseTracker` end here."""
    measured = math.sqrt(ss / df) if df else None
    var = (PRIOR_WEIGHT * PRIOR_NOISE**2 + ss) / (PRIOR_WEIGHT + df)
    adjacent = math.sqrt(adjacent_ss / pairs / 2) if pairs else None
    return Noise(max(MIN_NOISE, math.sqrt(var)), PRIOR_WEIGHT + df, df, configs, measured, adjacent, pairs)


def adjacent_noise(pairs: Sequence[tuple[float, float]]) -> float | None:
    """sd of one trial's log(samples/s) from back-to-back pairs of identical knobs (None without pairs)."""
    d = [math.log(y / x) for x, y in pairs if x and y and x > 0 and y > 0]
    return pooled_noise(0.0, 0, 0, sum(v * v for v in d), len(d)).adjacent


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
    differs: bool  # faster or slower: the interval excludes "no change" and the gap is at least MIN_EFFECT
    a_trials: tuple[int | None, ...] = ()  # every trial each side's verdict rests on
    b_trials: tuple[int | None, ...] = ()
    a_rates: tuple[float, ...] = ()  # their samples/s
    b_rates: tuple[float, ...] = ()
    rounds: int = 0  # alternating rounds run for this comparison
    noise: Noise = PRIOR
    rounds_needed: int | None = None  # more rounds that would settle a gap this size (undecided only)
    note: str = ""  # e.g. a round that failed
    margin: float = MARGIN  # "same speed" means the interval lies within ±margin
    seconds: float | None = None  # wall time the rounds of this comparison took
    max_rounds: int | None = None  # rounds="auto": the most rounds it could run (None: a fixed design)
    method: str = "trials"  # "trials" (separate trials), "interleaved" (turns of a few steps in one process), or
    # "unchanged" (the knobs that differ change nothing in the step: same, not measured; faces/unchanged.py)
    rate: str = "samples/s"  # the rate compared: "tokens/s" when the sides pad or pack token batches differently
    turns: int = 0  # interleaved: pairs of turns (A B or B A) behind the verdict
    turn_steps: int = 0  # interleaved: optimizer steps in each turn

    @property
    def same(self) -> bool:
        """True when the whole interval lies within ±margin: the two run at the same speed."""
        return self.low >= 1 / (1 + self.margin) and self.high <= 1 + self.margin

    @property
    def beyond_noise(self) -> bool:
        """Deprecated name of `differs` (the answer is faster or slower); read `answer` or `differs`."""
        warnings.warn("Comparison.beyond_noise is deprecated: read .answer ('faster', 'slower', 'same', "
                      "'undecided') or .differs", DeprecationWarning, stacklevel=2)
        return self.differs

    @property
    def answer(self) -> Answer:
        """B against A in one word: faster/slower (the interval excludes no change), same (within ±margin),
        or undecided."""
        if self.differs:
            return "faster" if self.speedup > 1 else "slower"
        return "same" if self.same else "undecided"

    @property
    def verdict(self) -> str:
        """The results table's word for this comparison: the answer itself (faster, slower, same, undecided)."""
        return self.answer

    def _evidence(self) -> str:
        if self.method == "unchanged":  # faces/unchanged.py: the knobs that differ change nothing in the step
            return "not measured: both sides run the same step"
        if self.method == "interleaved":
            secs = f", {self.seconds:.0f} s" if self.seconds is not None else ""
            return (f"{self.turns} pairs of interleaved turns of {self.turn_steps} step"
                    f"{'s' if self.turn_steps != 1 else ''}{secs}; an interval valid at every look")
        na, nb = len(self.a_rates), len(self.b_rates)
        each = f"{na} trial{'s' if na != 1 else ''} each" if na == nb else f"{na} vs {nb} trials"
        how = f" in {self.rounds} alternating round{'s' if self.rounds != 1 else ''}" if self.rounds else ""
        secs = f", {self.seconds:.0f} s" if self.seconds is not None else ""
        seq = ("; paired back-to-back rounds, an interval valid at every look"
               if self.max_rounds is not None else "")
        unit = ", compared in tokens/s (the sides pad or pack differently)" if self.rate == "tokens/s" else ""
        return f"{each}{how}{secs}{seq}{unit}"

    def _settle(self) -> str:
        ids = f"{self.a}, {self.b}" if self.a is not None and self.b is not None else "a, b"
        if self.method == "interleaved":
            n = self.rounds_needed
            if n is None:
                return (f"many more pairs would be needed at this noise: a quieter machine (close other programs), "
                        f"or a margin wider than ±{self.margin:.0%}, would settle it")
            more = ""
            if self.seconds and self.turns:
                more = f" (bench.compare({ids}, rounds='auto', budget_s={math.ceil(self.seconds * (1 + n / self.turns))}))"
            return f"about {n} more pair{'s' if n != 1 else ''} of turns would settle it{more}"
        if self.max_rounds is not None:  # rounds="auto" ran out of rounds or budget
            n = self.rounds_needed
            if n is None:
                return (f"more than {MAX_ROUNDS_HINT} more rounds would be needed at this noise: a quieter machine "
                        f"(close other programs), or a margin wider than ±{self.margin:.0%}, would settle it")
            return (f"about {n} more round{'s' if n != 1 else ''} would settle it "
                    f"(bench.compare({ids}, rounds='auto', max_rounds={self.rounds + n}))")
        if abs(self.speedup - 1) < MIN_EFFECT:
            return f"a gap under {MIN_EFFECT:.0%} counts as no difference"
        if self.rounds_needed is None:
            return f"a gap this small would need more than {MAX_ROUNDS_HINT} rounds to settle; treat it as no difference"
        n = self.rounds_needed
        return (f"about {n} more round{'s' if n != 1 else ''} (bench.compare({ids}, rounds={n})) "
                "would settle a gap this size if it is real")

    def __str__(self) -> str:
        pct = (self.speedup - 1) * 100
        interval = f"{(self.low - 1) * 100:+.1f}% … {(self.high - 1) * 100:+.1f}%"
        tail = f" {self.note}" if self.note else ""
        answer = self.answer
        if self.method == "unchanged":
            return f"#{self.b} vs #{self.a}: same: both run the same step, so nothing needs measuring.{tail}"
        if answer == "same":
            return (f"#{self.b} vs #{self.a}: same speed within ±{self.margin:.0%} ({pct:+.1f}%, {CONFIDENCE:.0%} "
                    f"interval {interval}, {self._evidence()}).{tail}")
        if answer == "undecided":
            return (f"#{self.b} vs #{self.a}: undecided ({pct:+.1f}%, {CONFIDENCE:.0%} interval {interval}, "
                    f"{self._evidence()}): no winner, and not shown to be the same speed within "
                    f"±{self.margin:.0%} either: {self._settle()}.{tail}")
        return (f"#{self.b} is {abs(pct):.1f}% {answer} than #{self.a} ({CONFIDENCE:.0%} interval "
                f"{interval}, {self._evidence()}).{tail}")

    __repr__ = __str__

    def _repr_html_(self) -> str | None:
        """What Jupyter draws: faces/display.py's `comparison_html`, registered in `views.HTML` (None: the str)."""
        return html_view(self)


class Looks(NamedTuple):
    """The one-look rule's result for many comparisons at once (arrays, one entry per comparison)."""

    log_ratio: np.ndarray  # mean log(rate) of B minus A's (the figure judged: samples/s or tokens/s)
    sigma: np.ndarray  # the noise each used: the model's, or the sides' own spread when that is larger
    half: np.ndarray  # half-width of the CONFIDENCE interval of the log-ratio
    beyond: np.ndarray  # faster or slower: the interval excludes 0 and the ratio is MIN_EFFECT away from 1
    same: np.ndarray  # same speed: the whole interval lies within ±margin

    @property
    def verdicts(self) -> list[str]:
        """The table's words per comparison (B against A): "faster", "slower", "same" or "undecided"."""
        return np.where(self.beyond, np.where(self.log_ratio > 0, "faster", "slower"),
                        np.where(self.same, "same", "undecided")).tolist()


def one_look(n_a: Sequence[float], mean_a: Sequence[float], ss_a: Sequence[float], n_b: Sequence[float],
             mean_b: Sequence[float], ss_b: Sequence[float], noise: Noise = PRIOR, *,
             margin: float | np.ndarray = MARGIN) -> Looks:
    """THE one-look rule, vectorised: every comparison at once from each side's moments of log(rate).

    Per comparison: n (trials), mean and sum of squared deviations of log(rate) on each side, the rate
    being the figure the pair is judged on (samples/s, or tokens/s: `comparison.judged_on`); `margin`
    one for all or one per comparison. A pooled Student-t interval of the log-ratio uses the larger of the model's sigma and the sides' own
    spread (when they have 2+ degrees of freedom of it), so a configuration noisier than the machine's
    usual cannot win on the pooled figure. `decide` (one comparison) and the results table (every row,
    re-judged when the noise changes) both call this: there is no second copy of the rule.
    """
    na, ma, ssa, nb, mb, ssb = (np.asarray(v, dtype=float) for v in (n_a, mean_a, ss_a, n_b, mean_b, ss_b))
    d = mb - ma
    local_df = na + nb - 2
    with np.errstate(divide="ignore", invalid="ignore"):
        local = np.sqrt((ssa + ssb) / local_df)
    sigma = np.where(local_df >= 2, np.maximum(noise.sigma, np.nan_to_num(local)), noise.sigma)
    half = critical(noise.df) * sigma * np.sqrt(1 / na + 1 / nb)
    beyond = (np.abs(d) > half) & (np.abs(np.exp(d) - 1) >= MIN_EFFECT)
    same = (np.exp(d - half) >= 1 / (1 + margin)) & (np.exp(d + half) <= 1 + margin)
    return Looks(d, sigma, half, beyond, same)


def decide(a_rates: Sequence[float], b_rates: Sequence[float], noise: Noise = PRIOR, *,
           a_trials: Sequence[int | None] = (), b_trials: Sequence[int | None] = (), rounds: int = 0,
           note: str = "", margin: float = MARGIN, seconds: float | None = None) -> Comparison:
    """B against A from per-trial samples/s: a t interval of the log-ratio of the mean rates (one look).

    The rule is `one_look`'s (the table's too): the noise is the larger of the model's and these
    trials' own spread (when they have any), so a configuration noisier than the machine's usual
    cannot win on the pooled figure.
    """
    xa, xb = np.log(np.asarray(a_rates, dtype=float)), np.log(np.asarray(b_rates, dtype=float))
    if len(xa) < 1 or len(xb) < 1 or not (np.isfinite(xa).all() and np.isfinite(xb).all()):
        raise ValueError("compare needs at least one positive samples/s figure on each side; compare ok trials")
    na, nb = len(xa), len(xb)
    look = one_look([na], [xa.mean()], [((xa - xa.mean()) ** 2).sum()], [nb], [xb.mean()],
                    [((xb - xb.mean()) ** 2).sum()], noise, margin=margin)
    d, sigma, half, beyond = float(look.log_ratio[0]), float(look.sigma[0]), float(look.half[0]), bool(look.beyond[0])
    crit = critical(noise.df)
    speedup = math.exp(d)
    needed = None
    if not beyond and abs(speedup - 1) >= MIN_EFFECT:
        needed = next((k for k in range(1, MAX_ROUNDS_HINT + 1)
                       if crit * sigma * math.sqrt(1 / (na + k) + 1 / (nb + k)) < abs(d)), None)
    return Comparison(a_trials[0] if a_trials else None, b_trials[0] if b_trials else None, speedup,
                      math.exp(d - half), math.exp(d + half), beyond, tuple(a_trials), tuple(b_trials),
                      tuple(float(v) for v in a_rates), tuple(float(v) for v in b_rates), rounds, noise, needed, note,
                      margin, seconds)


def look_alpha(look: int, looks: int) -> float:
    """The error rate spent at `look` (1-based) of at most `looks`: quadratic spending, summing to 1 - CONFIDENCE.

    A union bound over the looks: whatever round the comparison stops at, the chance that any of its
    intervals missed the truth is at most 1 - CONFIDENCE (peeking after every round is allowed). Early
    looks get little (few pairs decide only large gaps anyway), late looks most: "same speed" needs a
    narrow interval, which only many pairs give.
    """
    if not 1 <= look <= looks:
        raise ValueError(f"look must be between 1 and looks={looks}, got {look}")
    return (1 - CONFIDENCE) * look**2 / (looks * (looks + 1) * (2 * looks + 1) / 6)


def paired_prior(noise: Noise | None = None) -> tuple[float, float]:
    """(sd, df) of a back-to-back log(B/A) before a comparison's own pairs count.

    Learnt from the log's back-to-back trials of identical knobs when it has at least 3 (one trial's
    adjacent sd × √2, the sd of a difference of two), weighted as at most PAIRED_PRIOR_MAX_DF degrees
    of freedom so a comparison's own pairs still move it; else the weak default (10%, 2 df).
    """
    if noise is None or noise.adjacent is None or noise.adjacent_pairs < 3:
        return PAIRED_PRIOR_SD, PAIRED_PRIOR_DF
    return max(MIN_NOISE, math.sqrt(2) * noise.adjacent), min(float(noise.adjacent_pairs), PAIRED_PRIOR_MAX_DF)


def _paired_sd(a_rates: Sequence[float], b_rates: Sequence[float],
               prior: tuple[float, float]) -> tuple[float, float, float, int]:
    """(mean log-ratio, sd, its degrees of freedom, pairs) of back-to-back pairs (A_i, B_i).

    A level shift between rounds cancels in log(B_i / A_i). Their sd blends `prior` (sd, degrees of
    freedom; see paired_prior) with the pairs' own spread."""
    d = np.log(np.asarray(b_rates, dtype=float)) - np.log(np.asarray(a_rates, dtype=float))
    if len(d) < 1 or len(a_rates) != len(b_rates) or not np.isfinite(d).all():
        raise ValueError("a paired comparison needs equally many positive samples/s figures on each side")
    prior_sd, prior_df = prior
    ss = float(((d - d.mean()) ** 2).sum())
    df = prior_df + len(d) - 1
    return float(d.mean()), max(MIN_NOISE, math.sqrt((prior_df * prior_sd**2 + ss) / df)), df, len(d)


def _halves(sd: float, df: float, n: int, look: int, looks: int) -> tuple[float, float]:
    """Half-widths at one look: two-sided for "faster"/"slower", one-sided for "same".

    "Same speed within ±margin" is two one-sided tests (TOST: B is not slower by more than the
    margin, and not faster by more than it), each at the look's spent rate: the standard
    equivalence test, whose interval is 1 - 2·alpha rather than 1 - alpha.
    """
    alpha = look_alpha(look, looks)
    scale = sd / math.sqrt(n)
    return t_quantile(1 - alpha / 2, df) * scale, t_quantile(1 - alpha, df) * scale


def _answer(mean: float, half: float, half_same: float, margin: float) -> str:
    """faster/slower, same or undecided from a log-ratio and its two half-widths."""
    if abs(mean) > half and abs(math.exp(mean) - 1) >= MIN_EFFECT:
        return "faster" if mean > 0 else "slower"
    if mean - half_same >= -math.log1p(margin) and mean + half_same <= math.log1p(margin):
        return "same"
    return "undecided"


def decide_sequential(a_rates: Sequence[float], b_rates: Sequence[float], noise: Noise = PRIOR, *, looks: int,
                      margin: float = MARGIN, a_trials: Sequence[int | None] = (),
                      b_trials: Sequence[int | None] = (), rounds: int = 0, note: str = "",
                      seconds: float | None = None, max_rounds: int | None = None) -> Comparison:
    """B against A from back-to-back pairs, judged at look len(pairs) of at most `looks`.

    The paired sd starts from `noise`'s back-to-back figure (paired_prior). Faster or slower when the
    two-sided interval excludes 1 (and the ratio is MIN_EFFECT away from it); same speed when the
    equivalence interval lies within ±margin (the interval shown is then that one); otherwise
    undecided, with the extra rounds that would likely settle it if the gap and spread stay as measured.
    """
    n = len(a_rates)
    looks = max(looks, n)
    prior = paired_prior(noise)
    mean, sd, df, _ = _paired_sd(a_rates, b_rates, prior)
    half, half_same = _halves(sd, df, n, n, looks)
    answer = _answer(mean, half, half_same, margin)
    shown = half_same if answer == "same" else half
    needed = None
    if answer == "undecided":
        needed = next((k for k in range(1, MAX_ROUNDS_HINT + 1)
                       if _answer(mean, *_halves(sd, prior[1] + n + k - 1, n + k, n + k, n + k), margin)
                       != "undecided"), None)
    return Comparison(a_trials[0] if a_trials else None, b_trials[0] if b_trials else None, math.exp(mean),
                      math.exp(mean - shown), math.exp(mean + shown), answer in ("faster", "slower"),
                      tuple(a_trials), tuple(b_trials), tuple(float(v) for v in a_rates),
                      tuple(float(v) for v in b_rates), rounds, noise, needed, note, margin, seconds,
                      max_rounds if max_rounds is not None else looks)


INTERLEAVE_LOOKS = 20  # interleaved comparisons look at most this many times (the error rate is split over them)
# Two builds of one configuration are two model copies at other addresses: on the held-out CNN (2-core
# AMD EPYC, quiet), 8 fresh builds of identical knobs gave ratios whose spread was 1.28x what each
# run's own interval allowed (about 0.6% sd between builds), and one of them looked 2.4% "slower".
# Pairs within one build cannot see that, so it is added to the ratio's standard error (log units),
# rounded up. Simulated with 0.8% between builds (tests/test_interleave.py): false alarms 2-4% without
# it, under 1% with it; identical sides at 5% sd per pair are still called "same" 99% of the time.
BUILD_NOISE = 0.0075


def interleave_alpha(looks: int) -> float:
    """The error rate each look of an interleaved comparison spends: 1 - CONFIDENCE split evenly over `looks`.

    A union bound, like `look_alpha`, but flat: turns are cheap, so a large gap should be called at
    the first look (a few seconds) rather than wait for the late looks that quadratic spending favours.
    """
    if isinstance(looks, bool) or not isinstance(looks, int) or looks < 1:
        raise ValueError(f"looks must be an int >= 1, got {looks!r}")
    return (1 - CONFIDENCE) / looks


TRIM = 0.2  # interleaved pairs: the share of log-ratios trimmed from each end (Yuen's trimmed-mean t test)


def trimmed(d: Sequence[float], trim: float = TRIM) -> tuple[float, float, float]:
    """(trimmed mean, its standard error, degrees of freedom) of paired differences: Yuen's test.

    A turn that another program's burst lands on is an outlier, not a draw from the same spread:
    on a shared 2-core machine identical sides' turn log-ratios were bimodal (±0.6 at the 10th and
    90th percentiles, the middle near 0). Trimming `trim` of the pairs from each end and using the
    winsorized variance keeps the test's error rates under such bursts and loses little without them.
    """
    x = np.sort(np.asarray(d, dtype=float))
    n = len(x)
    g = math.floor(trim * n)
    h = n - 2 * g
    if h < 2:
        raise ValueError(f"a trimmed mean needs at least 2 values left after trimming, got {n} values")
    w = np.clip(x, x[g], x[n - g - 1])  # winsorized
    se = float(w.std(ddof=1)) / ((h / n) * math.sqrt(n))
    return float(x[g:n - g].mean()), se, float(h - 1)


def _interleaved_answer(d: np.ndarray, alpha: float, margin: float, extra: int = 0) -> tuple[str, float, float, float]:
    """(answer, mean, two-sided half-width, one-sided half-width) of paired log-ratios `d` at error
    rate `alpha`; `extra` > 0 asks what as many more pairs with the same spread would say."""
    mean, se, df = trimmed(d)
    n = len(d)
    if extra:
        se, df = se * math.sqrt(n / (n + extra)), df * (n + extra) / n
    se = max(se, MIN_NOISE / math.sqrt(n + extra))  # never believe the pairs agree better than MIN_NOISE each
    se = math.hypot(se, BUILD_NOISE)  # and the two builds' own difference, which more pairs do not shrink
    half, half_same = t_quantile(1 - alpha / 2, df) * se, t_quantile(1 - alpha, df) * se
    return _answer(mean, half, half_same, margin), mean, half, half_same


def decide_interleaved(a_rates: Sequence[float], b_rates: Sequence[float], *, looks: int = INTERLEAVE_LOOKS,
                       margin: float = MARGIN, a: int | None = None, b: int | None = None,
                       seconds: float | None = None, turn_steps: int = 1, look_every: int = 1, note: str = "",
                       noise: Noise = PRIOR) -> Comparison:
    """B against A from interleaved turns: pair i is A's and B's samples/s in two adjacent turns (A B or B A).

    The verdict rests on the pairs' log-ratios log(B_i / A_i): drift over seconds moves both turns
    of a pair and cancels; their 20%-trimmed mean and Yuen's interval (`trimmed`) keep turns that a
    burst of other work landed on from deciding; BUILD_NOISE widens it by what separates two builds
    of one configuration, which no number of pairs removes. It may be asked after every `look_every` pairs, up to `looks` times: each
    look spends an equal share of the 5% error rate (`interleave_alpha`), so stopping at the first
    decided look keeps false alarms at or below 5%. Faster or slower when the two-sided interval excludes
    1 and the ratio is MIN_EFFECT away from it; same speed when the TOST interval lies within ±margin.
    Undecided results say how many more pairs would likely settle it if the gap and spread stay as measured.
    """
    xa, xb = np.log(np.asarray(a_rates, dtype=float)), np.log(np.asarray(b_rates, dtype=float))
    if len(xa) != len(xb) or len(xa) < 2 or not (np.isfinite(xa).all() and np.isfinite(xb).all()):
        raise ValueError("an interleaved comparison needs at least 2 pairs of positive samples/s, equally many "
                         f"on each side; got {len(xa)} and {len(xb)}")
    check_margin(margin)
    d = xb - xa
    n = len(d)
    alpha = interleave_alpha(looks)
    answer, mean, half, half_same = _interleaved_answer(d, alpha, margin)
    needed = None
    if answer == "undecided":
        step = max(1, look_every)
        needed = next((k * step for k in range(1, 4 * looks + 1)
                       if _interleaved_answer(d, alpha, margin, k * step)[0] != "undecided"), None)
    shown = half_same if answer == "same" else half
    return Comparison(a, b, math.exp(mean), math.exp(mean - shown), math.exp(mean + shown),
                      answer in ("faster", "slower"), (a,), (b,), tuple(float(v) for v in a_rates),
                      tuple(float(v) for v in b_rates), 0, noise, needed, note, margin, seconds, None,
                      method="interleaved", turns=n, turn_steps=turn_steps)


__all__ = ["ANSWER_WORDS", "BUILD_NOISE", "CONFIDENCE", "MARGIN", "MIN_EFFECT", "PRIOR", "PRIOR_NOISE", "Comparison", "Looks",
           "Noise", "adjacent_noise", "critical", "decide", "decide_interleaved", "decide_sequential", "estimate_noise",
           "interleave_alpha", "look_alpha", "one_look", "paired_prior", "pooled_noise", "t_cdf", "t_quantile", "trimmed"]
