"""`diagnose(bench)`: run the analyses and gather them into one Diagnosis (text and HTML).

Trials go through `bench.run` so they land in the results table and the live chart; the
instrumented analyses (profiler, memory, FLOPs) run a few extra eager steps outside the log.
"""

from __future__ import annotations

import html
import traceback
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ..core import progress
from ..core.knobs import Knobs
from ..core.measure import TrialResult, fmt_bytes
from ..core.trace import trace_file
from ..deciding.budget import Budget, Spend
from ..deciding.rounds import CONFIRM_ROUNDS
from ..results.protocol import Bench
from .compile import explain_compile
from .data import (
    DATA_BOUND_SPEEDUP,
    DATA_WAIT_LIMIT,
    DataCheck,
    check_data,
    loader_rate,
    short_circuit_knobs,
)
from .flops import flops_per_step, mfu_frame, peak_flops
from .memory import block_activation_bytes, memory_breakdown
from .profile import profile_step
from .threads import thread_check, thread_frame
from .verdict import Verdict, allocator_fix, cite_phases, decide


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

    def _sections(self) -> list[tuple[str, Any]]:
        """(title, DataFrame | Series | list of lines) in reading order."""
        out: list[tuple[str, Any]] = [("Data pipeline", self.data.frame()),
                                      ("Threads and cores", thread_frame(self.threads))]
        if self.stages is not None:
            out.append(("Time by stage (eager, profiler)", self.stages))
        if self.ops is not None:
            out.append(("Top ops by self time", self.ops))
        if self.memory is not None:
            mem = self.memory.copy()
            mem["size"] = mem["bytes"].map(fmt_bytes)
            out.append(("Memory at the peak", mem[["kind", "size", "share"]]))
        if self.block_activations is not None and len(self.block_activations):
            blocks = self.block_activations.head(8).map(fmt_bytes).rename("saved for backward")
            out.append(("Activations by block (checkpoint the largest first)", blocks.to_frame()))
        if self.flops is not None:
            out.append(("FLOPs and MFU", self.flops))
        if self.compile:
            out.append(("torch.compile", self.compile))
        if self.trace_path:
            out.append(("Trace (open in ui.perfetto.dev or chrome://tracing)", [self.trace_path]))
        if self.problems:
            out.append(("Analyses that could not run", self.problems))
        if self.spent is not None and self.spent.budget_s:
            out.append((f"Budget ({self.spent.budget_s:g} s)", [str(self.spent), *self.budget_notes]))
        return out

    def __str__(self) -> str:
        lines = [f"Diagnosis of {self.knobs}", "", str(self.verdict)]
        with pd.option_context("display.width", 120, "display.max_colwidth", 70,
                               "display.float_format", "{:,.4g}".format):
            for title, body in self._sections():
                lines += ["", f"== {title} =="]
                if isinstance(body, list):
                    lines += [f"- {x}" for x in body]
                else:
                    lines.append(body.to_string(index=isinstance(body, pd.Series) or title.startswith("Activations")))
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
        for title, body in self._sections():
            parts.append(f"<details{' open' if title == 'Data pipeline' else ''}><summary><b>{html.escape(title)}</b></summary>")
            if isinstance(body, list):
                parts.append("<ul>" + "".join(f"<li>{html.escape(x)}</li>" for x in body) + "</ul>")
            else:
                frame = body.to_frame() if isinstance(body, pd.Series) else body
                parts.append(frame.to_html(float_format="{:,.4g}".format, index=isinstance(body, pd.Series)
                                           or title.startswith("Activations"), border=0))
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


ANALYSIS_STEPS = {"profiler": 3.0, "memory breakdown": 2.0, "block activations": 2.0, "FLOP count": 1.0}
LOADER_S = 20.0  # seconds: the loader-alone rate stops after this long (less when the budget has less left)
ANALYSIS_PRIOR = 3.0  # an instrumented eager step (profiler, hooks) over a measured step's seconds


def _compile_lines(bench: Bench) -> list[str]:
    """What the latest compiled trial in the log says about compile: time, breaks, pay-back."""
    compiled = [r for r in bench.trials if r.ok and r.knobs.compile != "off"]
    if not compiled:
        return []
    c, wl = compiled[-1], bench.workload
    eager = _find(bench, c.knobs.replace(compile="off"))
    speed = c.samples_per_s / eager.samples_per_s if eager and eager.samples_per_s and c.samples_per_s else None
    lines = [f"trial #{c.trial_id} ({c.knobs.label()}):",
             *explain_compile(c.extra.get("compile"), speedup=speed, device_type=wl.device.type,
                              num_parameters=wl.num_parameters, compile_s=c.compile_s)]
    if eager is None:
        lines.append("run bench.run(compile='off', ...) with the same other knobs to see whether it pays")
    return lines


def diagnose(bench: Bench, knobs: Knobs | None = None, *, reuse: bool = True, profile: bool = True,
             memory: bool = True, flops: bool = True, loader: bool = True, profile_steps: int = 3,
             budget_s: float | None = None) -> Diagnosis:
    """Diagnose `knobs` (default: the baseline's knobs, else the workbench defaults).

    Runs (or reuses, when `reuse`) the trial and its short-circuit twin through `bench.run`, then
    the loader-alone rate, thread check, profiler, memory breakdown and FLOPs; an analysis that
    fails is listed in `problems` instead of stopping the rest. `budget_s` caps the seconds
    (budget.py, as in tune()): the diagnosed trial runs whole, the twin and each analysis only when
    its estimate fits the seconds left (a trial under a deadline); `Diagnosis.spent` and its
    "Budget" section say how the seconds went and what was left out.
    """
    budget = Budget.of(budget_s, "diagnose")  # this call's one budget: its trials, analyses and rounds spend it
    if knobs is None:
        knobs = bench.baseline.knobs if bench.baseline is not None else bench.defaults
    if not isinstance(knobs, Knobs):
        raise TypeError(f"knobs must be a Knobs value (bench.knobs(...)), got {type(knobs).__name__}")
    wl = bench.workload
    problems: list[str] = []

    def attempt(name: str, fn: Any) -> Any:
        est = ANALYSIS_STEPS.get(name, 0.0) * (profile_steps if name == "profiler" else 1) * ANALYSIS_PRIOR \
            * (base.step_time_s or 0.0)  # seconds: instrumented eager steps
        if not budget.fits(est, label=name):  # a note says it was not run
            return None
        progress.note(name)  # the search bar says which analysis runs
        with budget.charge("analyses"):
            try:
                return fn()
            except Exception as e:
                problems.append(f"{name}: {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}")
                if not isinstance(e, (ValueError, TypeError, RuntimeError)):
                    problems.append(traceback.format_exc(limit=2))
                return None

    base = (_find(bench, knobs) if reuse else None) or _steady_run(bench, knobs, budget, "the diagnosed trial")
    if base is None:  # only a caller's deadline stops the first trial
        raise RuntimeError("the diagnosed trial was stopped before it measured anything: raise budget_s")
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
    threads = thread_check(knobs)

    stages = ops = mem = blocks = flop_df = trace_path = None
    if base.ok:
        stages, ops, trace_path = _profiled(bench, knobs, attempt, profile_steps) if profile else (None, None, None)
        if memory:
            mem = attempt("memory breakdown", lambda: memory_breakdown(wl, knobs))
            if wl.blocks:
                blocks = attempt("block activations", lambda: block_activation_bytes(wl, knobs))
        if flops:
            n = attempt("FLOP count", lambda: flops_per_step(wl, knobs))
            peak = attempt("peak FLOP/s", lambda: peak_flops(wl, knobs))
            if n is not None:
                flop_df = mfu_frame(n, base, *(peak or (None, "unknown")))

    compile_lines = _compile_lines(bench)
    compile_info = base.extra.get("compile") if knobs.compile != "off" else None
    mfu = None
    if flop_df is not None:
        v = flop_df.set_index("figure")["value"].get("MFU")
        mfu = None if v is None or pd.isna(v) else float(v)
    verdict = cite_phases(decide(knobs, data, threads, device=wl.device, ops=ops, mfu=mfu, has_conv=wl.has_conv,
                                 compile_info=compile_info, measured_fix=allocator_fix(bench.trials, knobs)), stages)  # the evidence cites the phase split
    return Diagnosis(knobs=knobs, data=data, threads=threads, verdict=verdict, stages=stages, ops=ops,
                     memory=mem, block_activations=blocks, flops=flop_df, compile=compile_lines, problems=problems,
                     trace_path=trace_path, spent=budget.spent, budget_notes=budget.notes)


def _profiled(bench: Bench, knobs: Knobs, attempt: Any, steps: int) -> tuple[Any, Any, str | None]:
    """The profiler's (stages, ops, trace path) through `attempt` (None when it could not run)."""
    trace_to = trace_file(bench.log.path.parent if bench.log.path is not None else None, bench.name, "diagnose")
    got = attempt("profiler", lambda: profile_step(bench.workload, knobs, steps=steps, trace_path=trace_to))
    if got is None:
        return None, None, None
    return got[0], got[1], str(trace_to) if trace_to.exists() else None


def _confirm_data(bench: Bench, base: TrialResult, cached: TrialResult | None, budget: Budget) -> Any:
    """Little data wait, yet the cached batch looks faster: one pair of trials is no evidence
    (identical trials differ by up to 20%), so confirm in alternating rounds, within the seconds left
    (a part of `budget`: the rounds' trials land in diagnose's account)."""
    if cached is None or not cached.ok or (base.data_wait_share or 0) >= DATA_WAIT_LIMIT:
        return None
    if bench.compare(base, cached).speedup < DATA_BOUND_SPEEDUP:
        return None
    if not budget.fits(0.0):
        budget.notes.append("the data-bound check was not confirmed in extra rounds: no seconds left")
        return None
    return bench.compare(base, cached, rounds="auto", max_rounds=CONFIRM_ROUNDS,
                         budget_s=budget.part())  # stops when decided
