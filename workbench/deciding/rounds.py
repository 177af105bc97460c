"""The driver of alternating rounds: `compare` runs more trials (B A, A B, ...) until it can decide.

It sits above the core, beside the tuner: the deciding is `comparison.judge` (one look, the rule
of `stats.decide`) and `stats.decide_sequential` (back-to-back pairs, an interval valid at every
look); this module only runs trials through the caller's `run(knobs)` and hands them over.
`results.compare` is this `compare`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ..core.knobs import Knobs
from ..core.measure import TrialResult
from ..results.comparison import Trials, caveats, check_margin, judge, judged_on, noise_of, rates, trials_of, usable
from ..results.log import ResultLog
from ..results.stats import MARGIN, Comparison, Noise, decide_sequential
from .budget import Budget, takes_cancel, work_clock

Run = Callable[[Knobs], TrialResult | None]
# A confirmation runs at most this many extra alternating rounds: the race's winner against the start
# (search/race.py), a cached batch's speedup before the data pipeline is called the bottleneck (diagnose/).
CONFIRM_ROUNDS = 4


def compare(a: Trials, b: Trials, *, rounds: int | str = 0, run: Run | None = None, log: ResultLog | None = None,
            noise: Noise | None = None, max_rounds: int = 8, margin: float = MARGIN,
            budget_s: float | Budget | None = None) -> Comparison:
    """Is configuration B faster than A, slower, the same speed, or is it undecided? From per-trial samples/s.

    `a`, `b`: a trial each (or lists of repeats). `rounds="auto"` runs alternating rounds (B A, A B,
    ...) through `run(knobs)` until the answer is faster, slower or same
    (interval within ±`margin`), or `max_rounds` (or `budget_s` seconds: a number, or the Budget of
    the verb that calls it, budget.py) run out; each round's B is
    judged against its back-to-back A, with an interval that stays valid however many rounds it
    looks at (see stats.decide_sequential). `rounds=N` runs exactly N rounds and decides once from
    all trials against the noise of `noise`, else `log`'s repeats (re-read after the rounds), else
    these trials alone; until repeats exist it is a conservative prior. `rounds=0` runs nothing
    (`comparison.judge`). The one comparison behind the results table's verdicts, `bench.compare`,
    the panel's "repeat to confirm", `tune()` and `diagnose()`.
    """
    runs_a, runs_b = trials_of(a), trials_of(b)
    check_margin(margin)
    if rounds == "auto":
        return _compare_auto(runs_a, runs_b, run=run, log=log, max_rounds=max_rounds, margin=margin,
                             budget_s=budget_s)
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
        raise ValueError(f"rounds must be 'auto' or an int >= 0 (extra trials of each configuration), got {rounds!r}")
    if rounds and run is None:
        raise ValueError("rounds need a way to run trials: call bench.compare(a, b, rounds=N), or pass run=bench.run")
    note, done, t0 = "", 0, work_clock()
    for i in range(rounds):
        pair, note = _one_round(run, runs_a, runs_b, i, done)  # type: ignore[arg-type]
        if note:
            break
        for side, r in pair:
            side.append(r)
        done += 1
    if log is not None and done:  # the rounds taught the log more about the noise: re-read it
        noise = None
    return judge(runs_a, runs_b, log=log, noise=noise, margin=margin, rounds=done, note=note,
                 seconds=work_clock() - t0 if rounds else None)


def _one_round(run: Run, runs_a: list[TrialResult], runs_b: list[TrialResult], i: int, done: int,
               knobs: tuple[Knobs, Knobs] | None = None) -> tuple[list[tuple[list[TrialResult], TrialResult]], str]:
    """Round i (0-based) after a and b ran A B: B A, then A B, ... ([(side, trial)], a note if it failed).

    `knobs`: (A's, B's) when a side holds no trial yet."""
    ka, kb = knobs or (runs_a[0].knobs, runs_b[0].knobs)
    order = [(runs_a, ka), (runs_b, kb)]
    pair: list[tuple[list[TrialResult], TrialResult]] = []
    for side, k in order[::-1] if i % 2 == 0 else order:
        r = run(k)
        if r is None or not usable(r):
            what = "was stopped" if r is None else f"#{r.trial_id} ended {r.status}"
            return pair, f"Round {i + 1} {what}; decided on {done} complete round{'s' if done != 1 else ''}."
        pair.append((side, r))
    return pair, ""


def _check_auto(run: Run | None, max_rounds: int, budget_s: float | Budget | None) -> Budget:
    """ValueError naming the first argument of rounds='auto' that cannot work; the rounds' Budget."""
    if isinstance(max_rounds, bool) or not isinstance(max_rounds, int) or max_rounds < 1:
        raise ValueError(f"max_rounds must be an int >= 1, got {max_rounds!r}")
    budget = Budget.of(budget_s, "compare", whole_first=False)  # the needed trials already ran
    if run is None:
        raise ValueError("rounds='auto' needs a way to run trials: call bench.compare(a, b, rounds='auto'), "
                         "or pass run=bench.run")
    return budget


def _compare_auto(runs_a: list[TrialResult], runs_b: list[TrialResult], *, run: Run | None, log: ResultLog | None,
                  max_rounds: int, margin: float, budget_s: float | Budget | None) -> Comparison:
    """rounds="auto": alternating rounds until decided, judged on back-to-back pairs (decide_sequential)."""
    budget = _check_auto(run, max_rounds, budget_s)
    # The Budget's rules for each round's trials: one starts only when its estimate fits the seconds left
    # and runs under a deadline (a stopped trial ends the rounds: a stopped round is no evidence)
    deadline, noted = takes_cancel(run), len(budget.notes)  # type: ignore[arg-type]

    def timed(knobs: Knobs) -> TrialResult | None:  # the first round always starts (still under the deadline)
        return budget.trial(run, knobs, purpose="rounds", starts=done == 0, deadline=deadline)  # type: ignore[arg-type]

    first_a, first_b = runs_a[-1], runs_b[-1]
    # The given pair counts as the first round only when the two trials ran back to back.
    paired = first_a.trial_id is not None and first_b.trial_id is not None and \
        abs(first_a.trial_id - first_b.trial_id) == 1
    pa, pb = ([first_a], [first_b]) if paired else ([], [])
    looks = max_rounds + len(pa)
    note, done, t0, c = "", 0, budget.clock(), None  # the budget's clock: its jobs' queue waits left out
    # The paired sd's prior is learnt from back-to-back repeats already in the log: evidence
    # independent of these rounds (re-learning it from them would over-trust their own spread).
    before = log.noise if log is not None else noise_of([*pa, *pb])

    def look() -> Comparison:
        basis = judged_on(pa, pb, margin)
        return replace(decide_sequential(rates(pa, basis.rate), rates(pb, basis.rate), before, looks=looks,
                                 margin=basis.margin, a_trials=[r.trial_id for r in pa],
                                 b_trials=[r.trial_id for r in pb], rounds=done,
                                 note=caveats(pa, pb, note),
                                 seconds=budget.clock() - t0, max_rounds=max_rounds), rate=basis.rate)

    if pa:
        c = look()
    while (c is None or c.answer == "undecided") and done < max_rounds:
        if done and not budget.fits((budget.clock() - t0) / done):  # another round, as long as the last ones
            note = f"Stopped after {done} rounds: another round would pass budget_s={budget.budget_s:.4g} s."
            break
        pair, note = _one_round(timed, pa, pb, done + (0 if paired else 1), done,
                                (first_a.knobs, first_b.knobs))
        if note:
            note = " ".join([note, *budget.notes[noted:]])  # why the budget ended the rounds, when it did
            break
        for side, r in pair:
            side.append(r)
        done += 1
        c = look()
    if not pa:  # not one complete back-to-back pair: judge what exists once, unpaired
        return replace(judge(runs_a, runs_b, log=log, margin=margin), note=note)
    if not paired:
        note = (f"{note} #{first_a.trial_id} and #{first_b.trial_id} did not run back to back, so the answer rests "
                "on the new rounds.").strip()
    return look()
