"""The race: candidates measured in alternating rounds, the slower ones dropped, the winner confirmed.

`race(ctx, entries)` runs rounds over the live entries (`Entry`: knobs, where they came from, trials
so far); after every round any entry shown slower than the leader is dropped and the slower
half is out (successive halving, as in F-Race/irace), so further trials go only to contenders.
`confirm_winner` settles the winner against the start. `Ctx` holds the tuner's trial count and its
`Budget` (the seconds), runs every trial through `bench.run` (so each lands in the results and the chart), and
keeps the path's rows. tune.py builds the candidates and calls these; this module never imports it.

Interleaved drops: after a round's trials, a contender that the trials leave undecided
against the leader is compared with it by interleaved turns (`compare(method="interleave")`, a few seconds in
one process) when the two differ only in knobs that can take turns (`interleave.why_not`; on CUDA
both peaks fit in free memory) and the seconds fit; the slower side of a decided comparison drops at
once, instead of after more rounds of separate trials. Data-pipeline knobs and `world_size` keep
racing by trials. Every entry still runs at least one trial: absolute samples/s, peak memory and
steadiness come from trials, and so does the winner's reported figure.

Every decision goes through `answer_of`, one adapter over `compare` (the same function as
`bench.compare`), which maps a comparison to faster / slower / same / undecided.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..core.knobs import Knobs
from ..core.measure import TrialResult, fmt_bytes
from ..deciding.budget import Budget, cost_class
from ..deciding.interleave import INTERLEAVE_WARMUP, MIN_PAIRS, WARMUP_S, InterleaveFailed, why_not
from ..deciding.rounds import CONFIRM_ROUNDS, compare
from ..results.comparison import Trials
from ..results.log import ResultLog
from ..results.protocol import Bench
from ..results.rules import MARGIN
from ..results.stats import Comparison

SAME_MARGIN = MARGIN  # the one "same speed" margin (results/rules.py), by the name the race has always used
MAX_ROUNDS = 4  # alternating rounds per race
HALT_S = 20.0  # Ctrl-C in tune(parallel=N): how long the watchers get to cancel their jobs and end their trials
# Seconds for one interleaved comparison in a race: what one more round of its two sides' trials would
# cost, at least 2 s (two builds, warm-ups and a first look) and at most 10 s
RACE_INTERLEAVE_S = (2.0, 10.0)

# ---- the one decision adapter -------------------------------------------------------------------
def answer_of(a: Trials, b: Trials, *, rounds: int = 0, run: Callable[[Knobs], TrialResult] | None = None,
            log: ResultLog | None = None) -> tuple[str, Comparison]:
    """B against A as one of ANSWERS (results/rules.py); the ONE place tune() turns a comparison into a decision.

    Decisions pool each side's repeats against the log's learnt between-trial noise (integer rounds):
    the race already alternates its rounds and keeps every trial as evidence, whereas
    compare(rounds="auto") would judge only the fresh back-to-back pairs it runs itself.
    """
    c = compare(a, b, rounds=rounds, run=run, log=log, margin=SAME_MARGIN)
    return c.answer, c


# ---- entries, the budget, rounds ----------------------------------------------------------------
@dataclass
class Entry:
    """One candidate in a race: its knobs, where it came from, and its trials so far."""

    stage: str
    label: str
    knobs: Knobs
    change: dict[str, Any] = field(default_factory=dict)  # relative to the start
    trials: list[TrialResult] = field(default_factory=list)
    alive: bool = True

    @classmethod
    def of(cls, stage: str, k0: Knobs, change: dict[str, Any]) -> Entry:
        """The candidate `change` (knobs and values) applied to the start's knobs `k0`."""
        return cls(stage, _label(change), k0.replace(**change), dict(change))

    @property
    def mean(self) -> float:
        """Geometric mean samples/s over the trials (0 before any)."""
        rates = [r.samples_per_s for r in self.trials if r.samples_per_s]
        return math.exp(sum(map(math.log, rates)) / len(rates)) if rates else 0.0


class Ctx:
    """The tuner's trial count, its `Budget` (the seconds: made once by tune(), or here from a number),
    its trials, and the path's rows."""

    def __init__(self, bench: Bench, limit: int, budget_s: float | Budget | None, memory_cap: float | None,
                 max_bytes: int | None, stop_early: bool = True, parallel: int = 1) -> None:
        self.bench, self.limit = bench, limit
        self.budget = Budget.of(budget_s, "tune")  # the seconds: estimates, deadline, the account (spent)
        self.parallel = parallel  # trials in flight at once (jobs on an executor: tune(parallel=N))
        self.memory_cap, self.max_bytes = memory_cap, max_bytes
        self.used = 0
        self.rows: list[dict[str, Any]] = []
        self.start: Entry | None = None
        self.stop_early = stop_early
        self.purpose = "race"  # what the seconds of the next trials are spent on (race, confirm, explain)
        # (A's knobs, B's knobs) -> (interleaved comparison or None, the side that failed, what happened): once a pair
        self.interleaved: dict[tuple[Knobs, Knobs], tuple[Comparison | None, Entry | None, str]] = {}

    def verdict(self, a: Entry, b: Entry) -> str | None:
        """B against A as the interleaved comparison this tune() call ran says (None when none decided it)."""
        c = self.interleaved.get((a.knobs, b.knobs), (None, None, ""))[0]
        return c.answer if c is not None else None

    def affordable(self) -> int:
        """Trials still affordable: the trial cap, and the median trials the budget's seconds left hold."""
        n, fit = self.limit - self.used, self.budget.trials_left()
        return max(0, n if fit is None else min(n, fit))

    def run(self, knobs: Knobs) -> TrialResult | None:
        """One trial, None when its estimate does not fit the seconds left (Budget.trial); an unsteady
        trial runs once more when that fits, and the repeat is the evidence."""
        r = self._once(knobs)
        if r is not None and r.ok and r.steady is False and self.used < self.limit:
            again = self._once(knobs)  # kept only when it finished: a repeat stopped by the budget is no evidence
            r = again if again is not None and again.ok else r
        return r

    def run_many(self, knobs: list[Knobs]) -> list[TrialResult | None]:
        """`run` for each, in order; with `parallel` > 1 up to that many at once (each a job on the
        bench's executor, watched from its own thread), in batches, so the estimates of one batch
        decide what the next may start."""
        if self.parallel <= 1 or len(knobs) <= 1:
            return [self.run(k) for k in knobs]
        import concurrent.futures

        from ..launch.runner import PARALLEL_THREAD_NAME

        out: list[TrialResult | None] = []
        pool = concurrent.futures.ThreadPoolExecutor(self.parallel, thread_name_prefix=PARALLEL_THREAD_NAME)
        futures: list[concurrent.futures.Future[TrialResult | None]] = []
        try:
            for i in range(0, len(knobs), self.parallel):
                if not self.used:  # the first trial alone: its time is every estimate's reference
                    out.append(self.run(knobs[i]))
                    batch = knobs[i + 1:i + self.parallel]
                else:
                    batch = knobs[i:i + self.parallel]
                futures = [pool.submit(self.run, k) for k in batch]
                out += [f.result() for f in futures]
        except KeyboardInterrupt:  # Ctrl-C: cancel every job in flight, record their trials, then stop
            self._halt(futures)
            raise
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        return out

    def _halt(self, futures: list[Any]) -> None:
        """Ctrl-C during a parallel batch: the jobs in flight are cancelled and their watchers end their
        trials (recorded as interrupted) within HALT_S; a trial not started yet never starts."""
        import concurrent.futures

        from ..launch.runner import ROUTES

        for f in futures:
            f.cancel()
        workload = getattr(self.bench, "workload", None)
        jobs = ROUTES.get(workload) if workload is not None else None
        if jobs is None:
            return
        jobs.cancel_all()
        try:
            concurrent.futures.wait(futures, timeout=HALT_S)
        finally:
            jobs.resume()

    def _once(self, knobs: Knobs) -> TrialResult | None:
        r = self.budget.trial(self.bench.run, knobs, purpose=self.purpose, stop_early=self.stop_early)  # the start: whole
        if r is not None:
            self.used += 1
        return r

    def rejected(self, r: TrialResult) -> str | None:
        """Why a trial's configuration cannot be kept (failed, over max_bytes or the headroom)."""
        if self.budget.stopped(r):
            return "stopped by the budget at its deadline: not evidence"
        if not r.ok or not r.samples_per_s:
            return f"rejected: {r.status}"
        peak = r.peak_memory_bytes
        if peak is not None and self.max_bytes is not None and peak > self.max_bytes:
            return f"rejected: peak {fmt_bytes(peak)} over max_bytes={self.max_bytes:,}"
        if peak is not None and self.memory_cap is not None and peak > self.memory_cap:
            return f"rejected: peak {fmt_bytes(peak)} within the headroom of the memory edge"
        return None

    def row(self, e: Entry, r: TrialResult, decision: str) -> dict[str, Any]:
        ref = self.start.mean if self.start is not None and self.start.mean else None
        row = {"stage": e.stage, "change": e.label, "trial": r.trial_id, "samples_per_s": r.samples_per_s,
               "speedup": (r.samples_per_s / ref) if ref and r.samples_per_s else None, "decision": decision}
        if isinstance(r.extra.get("job"), dict):  # a job (an executor): which node measured it
            row["node"] = r.env.get("host") or r.extra["job"].get("node")
        self.rows.append(row)
        return row


def _label(change: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in change.items()) or "the start"


def race(ctx: Ctx, entries: list[Entry], rounds: int = MAX_ROUNDS, rested: tuple[Entry, ...] = ()) -> Entry:
    """Alternating rounds over the contenders; after each, drop those shown slower than the leader.

    `rested`: carried entries that already have two trials or more (the start, the last leader); they
    sit out the first round, so a small budget buys new candidates rather than a third look at old ones.
    The race ends once two entries are left after two rounds: the later races carry the start and
    the leader, and the confirmation settles the winner against the start.
    """
    log = ctx.bench.log
    for rnd in range(rounds):
        alive = [e for e in entries if e.alive]
        if len(alive) <= 1 or ctx.affordable() < len(alive) + (2 if rnd else 0):  # later rounds leave 2 to confirm
            break
        if rnd >= 2 and len(alive) == 2:  # a pair left: the next race carries the leader (and the start)
            break
        todo = [e for e in (alive if rnd % 2 == 0 else alive[::-1]) if not (rnd == 0 and any(e is x for x in rested))]
        for e, r in zip(todo, ctx.run_many([e.knobs for e in todo])):
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
        if _interleave_round(ctx, [e for e in ok if e.alive], leader):
            break
    ok = [e for e in entries if e.alive and e.trials]
    return max(ok, key=lambda e: e.mean) if ok else entries[0]


def _halve(ctx: Ctx, alive: list[Entry], rnd: int) -> None:
    """Successive halving: after a round, only the faster half (by mean rate) races on; the start
    always stays, as the reference the winner is confirmed against."""
    keep = max(2, math.ceil(len(alive) / 2))
    for e in sorted(alive, key=lambda e: e.mean, reverse=True)[keep:]:
        if e is not ctx.start:
            e.alive = False
            ctx.rows.append({"stage": e.stage, "change": e.label, "trial": None, "samples_per_s": None,
                             "speedup": None, "decision": f"out: in the slower half after round {rnd + 1}"})


def _drop_round(ctx: Ctx, ok: list[Entry], leader: Entry, log: ResultLog | None) -> bool:
    """Drop the entries shown slower than the leader, park those the same speed as the start
    (near-misses for stacking); True when the leader itself is the same speed as the start (race over)."""
    start = ctx.start
    for e in ok:
        if e is leader:
            continue
        ans, c = answer_of(leader.trials, e.trials, log=log)
        if ans == "slower":
            why = f"dropped: {c.speedup:.2f}x of the leader ({leader.label}), slower by trials ({_trials(c)})"
        elif e is not start and start is not None and answer_of(start.trials, e.trials, log=log)[0] == "same":
            why = f"parked: the same speed as the start within ±{SAME_MARGIN:.0%} (a near-miss for stacking)"
        else:
            continue
        e.alive = False
        ctx.rows.append({"stage": e.stage, "change": e.label, "trial": None, "samples_per_s": None,
                         "speedup": c.speedup, "decision": why})
    return start is not None and leader is not start and answer_of(start.trials, leader.trials, log=log)[0] == "same"


def _trials(c: Comparison) -> str:
    na, nb = len(c.a_rates), len(c.b_rates)
    return f"{na} trial{'s' if na != 1 else ''} each" if na == nb else f"{na} vs {nb} trials"


# ---- interleaved comparisons in the race --------------------------------------------------------
def interleave_seconds(ctx: Ctx, a: Entry, b: Entry) -> float | None:
    """Seconds for an interleaved comparison of `a` and `b`, or None when none should start.

    It gets what one more round of the two sides' trials would cost (within RACE_INTERLEAVE_S), and
    never more than the seconds left less two trials (kept for the confirmation). It does not start
    when that is below its least cost: both sides built and warmed (a compiled side compiles again:
    about its trial's seconds) and MIN_PAIRS pairs of one-step turns (then trials decide).
    """
    trial_s = [ctx.budget.estimate(e.knobs) or 0.0 for e in (a, b)]
    step_s = sum(e.trials[-1].step_time_s or 0.0 for e in (a, b))  # seconds per step, both sides
    lo, hi = RACE_INTERLEAVE_S
    seconds = min(hi, max(lo, sum(trial_s)))
    least = 2 * WARMUP_S + (INTERLEAVE_WARMUP + 2 + 2 * MIN_PAIRS) * step_s
    least += sum(s for e, s in zip((a, b), trial_s) if cost_class(e.knobs)[0])
    seconds = ctx.budget.cap(seconds, keep_s=2 * ctx.budget.median_trial_s())  # type: ignore[assignment]
    return seconds if seconds >= least else None


def qualifies(a: Knobs, b: Knobs) -> bool:
    """Whether the race may decide `a` against `b` by interleaved turns: they differ only in knobs that
    can take turns in one process (interleave.why_not), and not in compute threads beside loader
    workers (the turns replay prepared batches without the loader, so they cannot see worker
    processes competing with the threads for the cores: the tuner's workers x threads axis)."""
    if why_not(a, b) is not None:
        return False
    return a.cpu_threads == b.cpu_threads or not (a.num_workers or b.num_workers)


def interleaved_answer(ctx: Ctx, a: Entry, b: Entry, purpose: str) -> tuple[Comparison | None, Entry | None, str]:
    """B against A by interleaved turns (`compare(method="interleave")`), at most once per pair in a tune() call:
    (the comparison, or None when the pair does not qualify or it failed; the side that failed with
    NaN or an error, which drops; what happened). Its seconds count under `purpose`; it goes in the log.
    An OOM (two models in memory at once) decides nothing: trials decide."""
    key = (a.knobs, b.knobs)
    if key in ctx.interleaved:
        return ctx.interleaved[key]
    run = getattr(ctx.bench, "_interleave", None)  # a bench without it (a test double) races by trials
    if run is None or not a.trials or not b.trials or not qualifies(a.knobs, b.knobs):
        return None, None, ""
    seconds = interleave_seconds(ctx, a, b)
    if seconds is None:
        return None, None, ""
    out: tuple[Comparison | None, Entry | None, str] = (None, None, "")
    with ctx.budget.charge(purpose):
        try:  # the turns get a part of the same budget: at most `seconds`
            c = run(a.trials[-1], b.trials[-1], margin=SAME_MARGIN, budget_s=ctx.budget.part(seconds))
            ctx.bench.log.record_comparison(c, a.knobs, b.knobs)
            out = (c, None, "")
        except InterleaveFailed as e:
            side = {"A": a, "B": b}.get(e.side or "")
            failed = side if e.status in ("nan", "error") else None
            out = (None, failed, f"ended {e.status} while interleaved" + (f" ({side.label})" if side else ""))
        except ValueError:  # the memory check: both trials' peaks do not fit in free memory together
            pass
    ctx.interleaved[key] = out
    return out


def _interleave_round(ctx: Ctx, alive: list[Entry], leader: Entry) -> bool:
    """After a round: each contender (the start included) against the leader by interleaved turns
    when the pair qualifies (`interleaved_answer`); the slower side of a decided comparison drops, and
    so does a side that ended NaN or in an error; a contender the same speed as the leader within
    ±SAME_MARGIN is out (parked as a near-miss when the start leads). True when the start and the
    leader are decided the same speed (the race is over, as when trials decide it)."""
    start = ctx.start
    for e in sorted(alive, key=lambda e: e.mean, reverse=True):
        if e is leader or not e.alive:
            continue
        a, b = (e, leader) if e is start else (leader, e)  # the start is always side A (the confirmation's)
        fresh = (a.knobs, b.knobs) not in ctx.interleaved  # a pair is compared once; its row is written once
        c, failed, what = interleaved_answer(ctx, a, b, "interleave")
        if failed is not None:
            _out(ctx, failed, f"dropped: {what}", None)
            if failed is leader:
                leader = max([x for x in alive if x.alive], key=lambda x: x.mean, default=e)
            continue
        if c is None:
            continue
        if c.answer == "same":
            if e is start:
                return True
            word, ref = ("parked", "the start") if a is start else ("out", f"the leader ({a.label})")
            _out(ctx, e, f"{word}: the same speed as {ref} within ±{SAME_MARGIN:.0%}, interleaved, {c.turns} pairs",
                 c.speedup)
            continue
        if c.answer == "undecided":  # the seconds it took show in the path; trials race on
            if fresh:
                ctx.rows.append({"stage": e.stage, "change": e.label, "trial": None, "samples_per_s": None,
                                 "speedup": c.speedup if e is b else 1 / c.speedup,  # e against the other
                                 "decision": f"kept: undecided against {_ref(a, b, e, start)}, "
                                 f"interleaved, {c.turns} pairs in {c.seconds or 0:.1f} s; trials race on"})
            continue
        slower, faster = (a, b) if c.answer == "faster" else (b, a)
        ratio = c.speedup if slower is b else 1 / c.speedup
        who = "the start" if faster is start else f"the leader ({faster.label})"
        _out(ctx, slower, f"dropped: {ratio:.2f}x of {who}, interleaved, {c.turns} pairs", ratio)
        leader = faster
    return False


def _ref(a: Entry, b: Entry, e: Entry, start: Entry | None) -> str:
    """What `e` was compared with, in words: the start or the leader."""
    other = b if e is a else a
    return "the start" if other is start else f"the leader ({other.label})"


def _out(ctx: Ctx, e: Entry, why: str, speedup: float | None) -> None:
    e.alive = False
    ctx.rows.append({"stage": e.stage, "change": e.label, "trial": None, "samples_per_s": None,
                     "speedup": speedup, "decision": why})


# ---- between races, and after the last ---------------------------------------------------------
def near_misses(ctx: Ctx, entries: list[Entry], leader: Entry) -> list[Entry]:
    """Entries not shown slower than the start (dropped against the leader or not),
    unless an interleaved comparison found them slower than the start."""
    start, log = ctx.start, ctx.bench.log
    return [e for e in entries if e.trials and e is not leader and e is not start and start is not None
            and answer_of(start.trials, e.trials, log=log)[0] != "slower" and ctx.verdict(start, e) != "slower"]


def admit(ctx: Ctx, cands: list[Entry], seen: set[Knobs], carried: int, first_race: bool,
          waiting: list[Entry] | None = None) -> list[Entry]:
    """New candidates in entry order, as many as two rounds of the race can afford (and that fit memory);
    `carried`: the carried entries that run in the first round. Those left out for want of budget are
    appended to `waiting` (the next race offers them again, on its leader)."""
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
        elif waiting is not None:
            waiting.append(e)
    if len(fresh) > len(out):
        ctx.rows.append({"stage": "budget", "change": f"{len(fresh) - len(out)} candidate(s)", "trial": None,
                         "samples_per_s": None, "speedup": None, "decision": "not entered: no budget left for them"})
    return out


def settled(ctx: Ctx, leader: Entry, leaders: list[Entry]) -> Entry:
    """The last race's leader, unless it is not yet shown faster than the start and an
    earlier race's leader already is (a late leader with one lucky trial does not undo a win); beyond
    noise by trials, or by an interleaved comparison the race ran."""
    start, log = ctx.start, ctx.bench.log
    for e in [leader, *leaders[::-1]]:
        if e is start or start is None or not e.trials:
            continue
        if answer_of(start.trials, e.trials, log=log)[0] == "faster" or ctx.verdict(start, e) == "faster":
            return e
    return leader


def confirm_winner(ctx: Ctx, leader: Entry, rivals: list[Entry]) -> tuple[str, Comparison | None]:
    """The winner against the start (or, when the start leads, its best rival against it)."""
    start, log = ctx.start, ctx.bench.log
    assert start is not None
    other = leader if leader is not start else max(rivals, key=lambda e: e.mean, default=None)
    if other is None or not other.trials:
        return "undecided", None
    ans, c = answer_of(start.trials, other.trials, log=log)
    ctx.purpose = "confirm"
    if ans == "undecided":  # interleaved turns first when the pair qualifies (the race's own, if it ran one)
        inter = interleaved_answer(ctx, start, other, "confirm")[0]
        if inter is not None and inter.answer != "undecided":
            ans, c = inter.answer, inter
    if ans == "undecided" and ctx.affordable() >= 2:
        ans, c = answer_of(start.trials, other.trials, rounds=min(CONFIRM_ROUNDS, ctx.affordable() // 2), run=ctx.run, log=log)
    if leader is start or ans != "faster":
        what = {"same": "the same speed", "slower": "slower", "faster": "faster"}.get(ans, "not yet shown faster")
        ctx.rows.append({"stage": "confirm", "change": other.label, "trial": c.b_trials[-1], "samples_per_s": None,
                         "speedup": c.speedup, "decision": f"nothing beats the start: the best rival is {what} "
                         f"({c.verdict}, {_how(c)})"})
        return ("same" if ans in ("same", "slower") else "undecided"), c
    ctx.rows.append({"stage": "confirm", "change": leader.label, "trial": c.b_trials[-1], "samples_per_s": None,
                     "speedup": c.speedup, "decision": f"kept: faster than the start ({c.verdict}, {_how(c)})"})
    return ans, c


def _how(c: Comparison) -> str:
    """What a confirmation rests on, for its row."""
    return f"interleaved, {c.turns} pairs" if c.method == "interleaved" else f"{c.rounds} extra round(s)"

