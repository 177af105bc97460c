"""`diagnose(bench)`: run the analyses and gather them into one Diagnosis (text and HTML).

Trials go through `bench.run` so they land in the results table and the live chart; the
instrumented analyses (profiler, memory, FLOPs) run a few extra eager steps outside the log.
"""

from __future__ import annotations

import html
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ..core import progress
from ..core.knobs import Knobs
from ..core.measure import TrialResult
from ..core.trace import trace_file
from ..deciding.budget import Budget, Spend
from ..deciding.rounds import CONFIRM_ROUNDS
from ..results.protocol import Bench
from .analysis import ANALYSES, ANALYSIS_PRIOR, Analysis, Context, discover
from .compile import explain_compile
from .data import (
    DataCheck,
    check_data,
    disagree,
    loader_rate,
    short_circuit_knobs,
)
from .profile import profile_step
from .threads import thread_check, thread_frame
from .verdict import Verdict, allocator_fix, cite_phases, decide, with_shape_cost


@dataclass
class Diagnosis:
    """Everything the diagnosis measured; print it, or show it in a notebook."""

    knobs: Knobs
    data: DataCheck
    threads: dict[str, Any]
    verdict: Verdict
    stages: pd.DataFrame | None = None  # ms per step by stage (profiler ranges)
    ops: pd.DataFrame | None = None  # top ops by self time
    memory: pd.DataFrame | None = None  # bytes by kind
    block_activations: pd.Series | None = None  # saved bytes per checkpointable block
    flops: pd.DataFrame | None = None  # FLOPs, achieved, peak, MFU
    compile: list[str] = field(default_factory=list)  # sentences on compiled trials
    problems: list[str] = field(default_factory=list)  # analyses that could not run, and why
    trace_path: str | None = None  # Chrome trace of the profiled steps (Perfetto, chrome://tracing, HTA)
    spent: Spend | None = None  # how the seconds went (budget_s): trials run, not started, stopped at the deadline
    budget_notes: list[str] = field(default_factory=list)  # what the budget left out, and why
    analyses: dict[str, Any] = field(default_factory=dict)  # name -> result of a declared analysis without a field here

    @property
    def bottleneck(self) -> str:
        return self.verdict.bottleneck

    @property
    def next_knobs(self) -> dict[str, Any]:
        return dict(self.verdict.next_knobs)

    @property
    def mfu(self) -> float | None:
        if self.flops is None:
            return None
        v = self.flops.set_index("figure")["value"].get("MFU")
        return None if v is None or pd.isna(v) else float(v)

    def _sections(self) -> list[tuple[str, Any, bool]]:
        """(title, DataFrame | Series | list of lines, show the index) in reading order; the declared
        analyses (analysis.py) in their order after the profiler's."""
        out: list[tuple[str, Any, bool]] = [("Data pipeline", self.data.frame(), False),
                                            ("Threads and cores", thread_frame(self.threads), False)]
        if self.stages is not None:
            out.append(("Time by stage (eager, profiler)", self.stages, False))
        if self.ops is not None:
            out.append(("Top ops by self time", self.ops, False))
        for a in sorted(ANALYSES.values(), key=lambda a: a.order):
            body = a.section(getattr(self, a.field) if a.field else self.analyses.get(a.name))
            if body is not None:
                out.append((a.title, body, a.index or isinstance(body, pd.Series)))
        if self.compile:
            out.append(("torch.compile", self.compile, False))
        if self.trace_path:
            out.append(("Trace (open in ui.perfetto.dev or chrome://tracing)", [self.trace_path], False))
        if self.problems:
            out.append(("Analyses that could not run", self.problems, False))
        if self.spent is not None and self.spent.budget_s:
            out.append((f"Budget ({self.spent.budget_s:g} s)", [str(self.spent), *self.budget_notes], False))
        return out

    def __str__(self) -> str:
        lines = [f"Diagnosis of {self.knobs}", "", str(self.verdict)]
        with pd.option_context("display.width", 120, "display.max_colwidth", 70,
                               "display.float_format", "{:,.4g}".format):
            for title, body, index in self._sections():
                lines += ["", f"== {title} =="]
                if isinstance(body, list):
                    lines += [f"- {x}" for x in body]
                else:
                    lines.append(body.to_string(index=index))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<Diagnosis bottleneck={self.bottleneck!r} next={self.verdict.next_knobs}>"

    def _repr_html_(self) -> str:
        v = self.verdict
        parts = [f"<h3>Diagnosis: <b>{html.escape(v.bottleneck)}</b> — {html.escape(v.summary)}</h3>",
                 "<ul>" + "".join(f"<li>{html.escape(e)}</li>" for e in v.evidence) + "</ul>"]
        if v.next_knobs or v.why:
            args = ", ".join(f"{k}={val!r}" for k, val in v.next_knobs.items())
            call = f"<code>bench.run({html.escape(args)})</code> — " if v.next_knobs else ""
            parts.append(f"<p><b>Next:</b> {call}{html.escape(v.why)}</p>")
        for title, body, index in self._sections():
            parts.append(f"<details{' open' if title == 'Data pipeline' else ''}><summary><b>{html.escape(title)}</b></summary>")
            if isinstance(body, list):
                parts.append("<ul>" + "".join(f"<li>{html.escape(x)}</li>" for x in body) + "</ul>")
            else:
                frame = body.to_frame() if isinstance(body, pd.Series) else body
                parts.append(frame.to_html(float_format="{:,.4g}".format, index=index, border=0))
            parts.append("</details>")
        return "\n".join(parts)


def _find(bench: Bench, knobs: Knobs) -> TrialResult | None:
    """The latest ok, steady trial with exactly these knobs (to reuse instead of re-running)."""
    return next((r for r in reversed(bench.trials) if r.ok and r.steady is not False and r.knobs == knobs), None)


def _steady_run(bench: Bench, knobs: Knobs, budget: Budget | None = None, label: str = "the trial") -> TrialResult | None:
    """A trial of `knobs` within the budget (None when it did not fit or was stopped at its deadline),
    run once more when it was not steady (steady.py) and that fits: the verdict reads the repeat."""
    budget = budget or Budget(None, "diagnose")
    r = budget.trial(bench.run, knobs, purpose="trials", label=label)
    if r is None or budget.stopped(r):
        return None
    again = budget.trial(bench.run, knobs, purpose="trials", label=f"{label} (repeat: unsteady)") \
        if r.ok and r.steady is False else None
    return again if again is not None and not budget.stopped(again) else r


PROFILER_STEPS = 3.0  # instrumented eager steps per profiled step (the budget's estimate of the profiler)
LOADER_S = 20.0  # seconds: the loader-alone rate stops after this long (less when the budget has less left)


def _compile_lines(bench: Bench) -> list[str]:
    """What the latest compiled trial in the log says about compile: time, breaks, pay-back."""
    compiled = [r for r in bench.trials if r.ok and r.knobs.compile != "off"]
    if not compiled:
        return []
    c, wl = compiled[-1], bench.workload
    eager = _find(bench, c.knobs.replace(compile="off"))
    speed = c.samples_per_s / eager.samples_per_s if eager and eager.samples_per_s and c.samples_per_s else None
    lines = [f"trial #{c.trial_id} ({c.knobs.label(bench.defaults)}):",
             *explain_compile(c.extra.get("compile"), speedup=speed, device_type=wl.device.type,
                              num_parameters=wl.num_parameters, compile_s=c.compile_s)]
    if eager is None:
        lines.append("run bench.run(compile='off', ...) with the same other knobs to see whether it pays")
    return lines


def diagnose(bench: Bench, knobs: Knobs | None = None, *, reuse: bool = True, profile: bool = True,
             memory: bool = True, flops: bool = True, loader: bool = True, profile_steps: int = 3,
             budget_s: float | None = None, skip: Iterable[str] | str = ()) -> Diagnosis:
    """Diagnose `knobs` (default: the baseline's knobs, else the workbench defaults).

    Runs (or reuses, when `reuse`) the trial and its short-circuit twin through `bench.run`, then
    the loader-alone rate, thread check, profiler and every declared analysis (analysis.py: memory
    breakdown, block activations, FLOPs, and any file added to diagnose/); an analysis that fails is
    listed in `problems` instead of stopping the rest. `skip` names analyses not to run
    (`profile=False`, `memory=False`, `flops=False` skip the profiler, the memory ones, the FLOPs).
    `budget_s` caps the seconds (budget.py, as in tune()): the diagnosed trial runs whole, the twin
    and each analysis only when its estimate fits the seconds left (a trial under a deadline);
    `Diagnosis.spent` and its "Budget" section say how the seconds went and what was left out.
    """
    budget = Budget.of(budget_s, "diagnose")  # this call's one budget: its trials, analyses and rounds spend it
    if knobs is None:
        knobs = bench.baseline.knobs if bench.baseline is not None else bench.defaults
    if not isinstance(knobs, Knobs):
        raise TypeError(f"knobs must be a Knobs value (bench.knobs(...)), got {type(knobs).__name__}")
    declared, problems = discover()
    skipped = _skipped(skip, declared, profile=profile, memory=memory, flops=flops)
    loader = loader and "loader rate" not in skipped
    wl = bench.workload
    wl.facts = bench._facts  # the trials' device (the node's on an executor): MFU's peak and the verdict read it

    base = (_find(bench, knobs) if reuse else None) or _steady_run(bench, knobs, budget, "the diagnosed trial")
    if base is None:  # only a caller's deadline stops the first trial
        raise RuntimeError("the diagnosed trial was stopped before it measured anything: raise budget_s")

    def attempt(name: str, fn: Callable[[], Any], steps: float = 0.0) -> Any:
        est = steps * ANALYSIS_PRIOR * (base.step_time_s or 0.0)  # seconds: instrumented eager steps
        if not budget.fits(est, label=name):  # a note says it was not run
            return None
        progress.note(name)  # the search bar says which analysis runs
        with budget.charge(name):  # the account names each analysis's seconds
            return _tried(problems, name, fn)

    cached = None
    if knobs.data == "loader" and base.ok:
        ck = short_circuit_knobs(knobs)
        cached = (_find(bench, ck) if reuse else None) or _steady_run(bench, ck, budget, "the short-circuit twin")
    confirmed = _confirm_data(bench, base, cached, budget)
    loader_s = budget.cap(LOADER_S) or 0.0  # seconds: the loader-alone rate stops after this long
    rate = None
    if loader and knobs.data == "loader" and loader_s < 1.0:
        budget.notes.append(f"loader rate not run: under 1 s left of budget_s={budget.budget_s:g}")
    elif loader and knobs.data == "loader":
        rate = attempt("loader rate", lambda: loader_rate(wl, knobs, max_s=loader_s))
    data = check_data(base, cached, rate, confirmed)
    threads = thread_check(knobs, facts=wl.facts)

    stages = ops = trace_path = None
    results: dict[str, Any] = {}
    if base.ok:  # the profiler is wired here: the verdict reads its stages and ops
        if "profiler" not in skipped:
            stages, ops, trace_path = _profiled(bench, knobs, attempt, profile_steps)
        ctx = Context(bench, knobs, base, profile_steps, results, lambda name, fn: _tried(problems, name, fn))
        for a in declared:
            if a.name not in skipped and (a.when is None or a.when(ctx)):
                results[a.name] = attempt(a.name, lambda a=a: a.run(ctx), a.steps)
    return _gathered(bench, knobs, base, data, threads, stages, ops, trace_path, results, problems, budget)


def _tried(problems: list[str], name: str, fn: Callable[[], Any]) -> Any:
    """`fn()`, or None with a line in `problems` when it raises (an analysis never stops the rest)."""
    try:
        return fn()
    except Exception as e:
        problems.append(f"{name}: {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}")
        if not isinstance(e, (ValueError, TypeError, RuntimeError)):
            problems.append(traceback.format_exc(limit=2))
        return None


def _skipped(skip: Iterable[str] | str, declared: list[Analysis], *, profile: bool, memory: bool,
             flops: bool) -> set[str]:
    """The names of the analyses not to run: `skip`, checked against the known names, and the old keywords."""
    names = {skip} if isinstance(skip, str) else set(skip)
    known = {"profiler", "loader rate", *(a.name for a in declared)}
    if names - known:
        raise ValueError(f"skip= names analyses; unknown: {sorted(names - known)}; known: {sorted(known)}")
    off = {"profiler"} if not profile else set()  # the old keywords: the profiler, by field the others
    fields = {"memory", "block_activations"} if not memory else set()
    fields |= {"flops"} if not flops else set()
    return names | off | {a.name for a in declared if a.field in fields}


def _gathered(bench: Bench, knobs: Knobs, base: TrialResult, data: DataCheck, threads: dict[str, Any], stages: Any,
              ops: Any, trace_path: str | None, results: dict[str, Any], problems: list[str],
              budget: Budget) -> Diagnosis:
    """The verdict (it reads the profiler's ops and stages and the FLOPs' MFU) and the Diagnosis."""
    fields = {a.field: results.pop(a.name, None) for a in ANALYSES.values() if a.field}  # the built-ins' own fields
    flop_df = fields.get("flops")
    mfu = None
    if flop_df is not None:
        v = flop_df.set_index("figure")["value"].get("MFU")
        mfu = None if v is None or pd.isna(v) else float(v)
    wl = bench.workload
    compile_info = base.extra.get("compile") if knobs.compile != "off" else None
    verdict = cite_phases(decide(knobs, data, threads, device=wl.device, ops=ops, mfu=mfu, has_conv=wl.has_conv,
                                 compile_info=compile_info, facts=bench._facts, measured_fix=allocator_fix(bench.trials, knobs)), stages)  # the evidence cites the phase split
    verdict = with_shape_cost(verdict, results.get("input shapes"), base)  # a large one-time shape cost: its knob too
    return Diagnosis(knobs=knobs, data=data, threads=threads, verdict=verdict, stages=stages, ops=ops,
                     compile=_compile_lines(bench), problems=problems, trace_path=trace_path, spent=budget.spent,
                     budget_notes=budget.notes, analyses=results, **fields)


def _profiled(bench: Bench, knobs: Knobs, attempt: Any, steps: int) -> tuple[Any, Any, str | None]:
    """The profiler's (stages, ops, trace path) through `attempt` (None when it could not run)."""
    trace_to = trace_file(bench.log.path.parent if bench.log.path is not None else None, bench.name, "diagnose")
    got = attempt("profiler", lambda: profile_step(bench.workload, knobs, steps=steps, trace_path=trace_to),
                  PROFILER_STEPS * steps)
    if got is None:
        return None, None, None
    return got[0], got[1], str(trace_to) if trace_to.exists() else None


def _confirm_data(bench: Bench, base: TrialResult, cached: TrialResult | None, budget: Budget) -> Any:
    """The data-wait share and one pair of trials (real loader, one cached batch) disagree: little wait
    yet the cached batch looks faster, or a large wait yet it is not faster. One pair is no evidence
    (identical trials differ by up to 20%), so alternating rounds decide, within the seconds left (a part
    of `budget`: the rounds' trials land in diagnose's account). When they agree, no rounds."""
    if cached is None or not cached.ok:
        return None
    if not disagree(base.data_wait_share, bench.compare(base, cached)):
        return None
    if not budget.fits(0.0):
        budget.notes.append("the data-bound check was not confirmed in extra rounds: no seconds left")
        return None
    return bench.compare(base, cached, rounds="auto", max_rounds=CONFIRM_ROUNDS,
                         budget_s=budget.part())  # stops when decided
