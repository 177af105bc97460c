"""Why is B faster? Two trials' traced steps compared phase by phase and op by op.

    e = bench.explain(a, b)     # trial ids or TrialResults (a trial without a trace gets a traced repeat)
    e.phases                    # data wait / forward / backward / optimizer / other: a_ms, b_ms, delta_ms per step
    e.ops                       # ops (and kernels on a GPU): calls_a, calls_b, a_ms, b_ms, delta_ms, sorted by |delta|
    print(e)                    # two or three sentences; e.chart() for the deltas

Evidence rules: the times come from *traced* steps (the Chrome trace that `run(trace=True)` writes
after the measured window), never from the measured ones, and the sentence says how much of the
measured step-time difference the traced difference accounts for (the profiler slows every op it
records; noise moves both). When the comparison itself answers "same" or "undecided", that comes first.

Why not HolisticTraceAnalysis' TraceDiff: it sums each op's inclusive duration (an `aten::linear`
and the `aten::addmm` inside it are both counted), compares one iteration, knows no phases, and
pulls jupyterlab, plotly, pydot, networkx and pytest as runtime dependencies. The trace is plain
JSON: reading it here costs nothing, works the same on CPU and CUDA traces, and gives self times.
"""

from __future__ import annotations

import html
import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ..core.measure import TrialResult
from ..core.trace import KERNEL_CATS, STEP_LABEL, kernel_phases, phase_ranges, stage_ms
from ..results.protocol import Bench
from ..results.stats import Comparison

PHASE_ROWS = ("data wait", "forward", "backward", "optimizer", "other")
_PHASE_OF = {"data": "data wait", "forward": "forward", "backward": "backward", "optimizer": "optimizer"}
OP_CATS = ("cpu_op",)  # host ops (self time)
RANGE_CATS = ("user_annotation", "python_function")  # nest around ops on the host
AGREE = 0.25  # traced vs measured difference: within this share they "agree"
PHASE_SAME_MS = 0.05  # a phase delta under this share of the traced step is "unchanged"


# ---- reading one trace ---------------------------------------------------------------------------
@dataclass(frozen=True)
class TraceSummary:
    """One Chrome trace per step: the traced step time, the phases and the ops (all in ms per step)."""

    path: str
    steps: int
    step_ms: float
    phases: dict[str, float]
    ops: pd.DataFrame  # op, kind (op | kernel), phase, calls, ms  (per step)
    device: bool = False  # True when the trace holds device kernels (GPU)
    used: str = ""  # which steps the figures come from ("ProfilerStep#2, the median of 3", "mean of 3 steps")


def read_trace(path: str | Path, *, median: bool = True) -> TraceSummary:
    """Phases and ops per traced step from a trace the workbench wrote (run(trace=True), diagnose).

    `median`: the figures are those of the traced step of median length (the measured figure is a
    median too), so one step disturbed by another process does not swing them; else the mean step.
    """
    doc = json.loads(Path(path).read_text())
    events = [e for e in doc.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    steps = [e for e in events if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith(STEP_LABEL)]
    if not steps:
        raise ValueError(f"{path} has no {STEP_LABEL}N ranges: pass a trace from bench.run(trace=True)")
    n = len(steps)
    used = f"mean of {n} traced steps"
    if median and n > 1:
        mid = sorted(steps, key=lambda e: float(e["dur"]))[(n - 1) // 2]
        steps, used = [mid], f"{mid['name']}, the median of {n} traced steps"
    spans = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in steps)
    total = n
    n = len(spans)
    inside = [e for e in events if any(lo <= float(e["ts"]) < hi for lo, hi in spans)]
    kernels = [e for e in inside if e.get("cat") in KERNEL_CATS]
    step_ms = sum(hi - lo for lo, hi in spans) / 1e3 / n
    # on a GPU the host ranges end when the launches do: the kernels each range queued say what ran
    # (core/trace.stage_ms, the split diagnose's profile shows too)
    phases = {_PHASE_OF[name]: ms for name, ms in stage_ms(inside, n).items()}
    phases["other"] = step_ms - sum(phases.values())
    rows = _op_rows(inside, phase_ranges(inside), n)
    return TraceSummary(str(path), total, step_ms, phases, rows, device=bool(kernels), used=used)


def _phase_at(ts: float, ranges: dict[str, list[tuple[float, float]]]) -> str:
    for name, spans in ranges.items():
        if any(lo <= ts < hi for lo, hi in spans):
            return _PHASE_OF[name]
    return "other"


def _self_times(events: list[dict[str, Any]]) -> dict[int, float]:
    """id(event) -> self time (us) of host events: duration minus their direct children, per thread."""
    by_thread: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e.get("cat") in OP_CATS + RANGE_CATS:
            by_thread[(e.get("pid"), e.get("tid"))].append(e)
    out: dict[int, float] = {}
    for evs in by_thread.values():
        evs.sort(key=lambda e: (float(e["ts"]), -float(e["dur"])))
        stack: list[dict[str, Any]] = []
        for e in evs:
            start = float(e["ts"])
            while stack and float(stack[-1]["ts"]) + float(stack[-1]["dur"]) <= start:
                stack.pop()
            out[id(e)] = float(e["dur"])
            if stack:
                out[id(stack[-1])] -= float(e["dur"])
            stack.append(e)
    return out


def _op_rows(events: list[dict[str, Any]], host: dict, n: int) -> pd.DataFrame:
    """Per (op, kind, phase): calls and ms per step (host ops by self time, kernels by duration, in the
    phase that queued them)."""
    self_us = _self_times(events)
    queued_in = {id(e): phase for e, phase in kernel_phases(events)}
    acc: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for e in events:
        cat = e.get("cat")
        if cat in OP_CATS:
            key = (str(e["name"]), "op", _phase_at(float(e["ts"]), host))
            us = max(0.0, self_us.get(id(e), 0.0))
        elif cat in KERNEL_CATS:
            phase = queued_in.get(id(e))
            key = (str(e["name"]), "kernel", _PHASE_OF[phase] if phase else "other")
            us = float(e["dur"])
        else:
            continue
        acc[key][0] += 1
        acc[key][1] += us
    rows = [{"op": k[0], "kind": k[1], "phase": k[2], "calls": c / n, "ms": us / 1e3 / n}
            for k, (c, us) in acc.items()]
    return pd.DataFrame(rows, columns=["op", "kind", "phase", "calls", "ms"])


# ---- comparing two ----------------------------------------------------------------------------
def phase_table(a: TraceSummary, b: TraceSummary) -> pd.DataFrame:
    """One row per phase: a_ms, b_ms, delta_ms (per traced step; the rows add up to the step)."""
    rows = [{"phase": p, "a_ms": a.phases.get(p, 0.0), "b_ms": b.phases.get(p, 0.0)} for p in PHASE_ROWS]
    df = pd.DataFrame(rows)
    df["delta_ms"] = df["b_ms"] - df["a_ms"]
    return df


def op_table(a: TraceSummary, b: TraceSummary) -> pd.DataFrame:
    """Ops of both traces side by side, sorted by |delta_ms|; `change` marks ops new in B or gone in B,
    `phase` is where most of the op's time is, `cumulative` the running share of the op-time change."""
    def per_op(ops: pd.DataFrame, side: str) -> pd.DataFrame:
        if ops.empty:
            return pd.DataFrame(columns=["op", "kind", f"calls_{side}", f"{side}_ms", f"phase_{side}"])
        top_phase = ops.sort_values("ms").groupby(["op", "kind"])["phase"].last().rename(f"phase_{side}")
        g = ops.groupby(["op", "kind"]).agg(**{f"calls_{side}": ("calls", "sum"), f"{side}_ms": ("ms", "sum")})
        return g.join(top_phase).reset_index()

    df = per_op(a.ops, "a").merge(per_op(b.ops, "b"), on=["op", "kind"], how="outer")
    for col in ("calls_a", "calls_b", "a_ms", "b_ms"):
        df[col] = pd.to_numeric(df[col], errors="coerce").fillna(0.0)
    df["phase"] = df["phase_b"].where(df["b_ms"] >= df["a_ms"], df["phase_a"]).fillna(df["phase_a"])
    df["phase"] = df["phase"].fillna(df["phase_b"])
    df["delta_ms"] = df["b_ms"] - df["a_ms"]
    df["change"] = ""
    df.loc[df["calls_a"] == 0, "change"] = "new in B"
    df.loc[df["calls_b"] == 0, "change"] = "gone in B"
    df = df.reindex(df["delta_ms"].abs().sort_values(ascending=False).index).reset_index(drop=True)
    total = float(df["delta_ms"].sum())
    df["cumulative"] = df["delta_ms"].cumsum() / total if abs(total) > 1e-9 else float("nan")
    return df[["op", "kind", "phase", "calls_a", "calls_b", "a_ms", "b_ms", "delta_ms", "change", "cumulative"]]


def verdict_word(c: Comparison) -> str:
    """'faster' | 'slower' | 'same' | 'undecided': the one adapter to the comparison's decision."""
    return c.answer


# ---- the explanation -----------------------------------------------------------------------------
@dataclass
class Explanation:
    """Trial B against trial A: the measured verdict, then where the traced time went."""

    a: int | None
    b: int | None
    comparison: Comparison
    measured_a_ms: float  # median measured step time (mean over each side's trials)
    measured_b_ms: float
    phases: pd.DataFrame
    ops: pd.DataFrame
    traced_a_ms: float
    traced_b_ms: float
    traces: tuple[str, str] = ("", "")
    compile: dict[str, Any] = field(default_factory=dict)  # a compiled side: compile_s, breaks
    notes: tuple[str, ...] = ()

    @property
    def verdict(self) -> str:
        """faster | slower | same | undecided: B against A, the comparison's answer."""
        return verdict_word(self.comparison)

    @property
    def measured_delta_ms(self) -> float:
        return self.measured_b_ms - self.measured_a_ms

    @property
    def traced_delta_ms(self) -> float:
        return self.traced_b_ms - self.traced_a_ms

    @property
    def accounted(self) -> float | None:
        """The traced step-time difference as a share of the measured one (1.0 = all of it)."""
        m = self.measured_delta_ms
        return None if abs(m) < 1e-9 else self.traced_delta_ms / m

    @property
    def text(self) -> list[str]:
        """The sentences (a property, so JSON documents of results that hold an Explanation carry them)."""
        return self.sentences()

    def sentences(self) -> list[str]:
        """The explanation in plain words; the answer first when it is "same" or "undecided"."""
        out = []
        c, d = self.comparison, self.measured_delta_ms
        gap = f"#{self.b} vs #{self.a} measured {(c.speedup - 1) * 100:+.1f}% ({c.low:.2f}×…{c.high:.2f}×)"
        if self.verdict == "same":
            out.append(f"Same: {gap}, within ±{c.margin:.0%}, so the split below is a difference too small "
                       "to matter, or noise.")
        elif self.verdict == "undecided":
            out.append(f"Undecided: {gap}; this evidence cannot tell the gap from noise, so the split below "
                       "may be noise, not a cause.")
        verb = "saves" if d < 0 else "costs"
        out.append(f"#{self.b} {verb} {abs(d):.1f} ms per step ({c.speedup:.2f}× the samples/s of #{self.a}; "
                   f"measured {self.measured_a_ms:.1f} → {self.measured_b_ms:.1f} ms).")
        out.append(self._agreement())
        out.append(self._where())
        if self.compile:
            out.append(self._compile_sentence())
        return [s for s in out if s]

    def _agreement(self) -> str:
        share, t = self.accounted, self.traced_delta_ms
        if share is None:
            return f"The traced steps differ by {t:+.1f} ms where the measured steps do not differ."
        m = self.measured_delta_ms
        if abs(t) < 0.005 * max(self.traced_a_ms, self.traced_b_ms, 1e-9):
            return (f"The traced steps barely differ ({t:+.2f} ms vs measured {m:+.1f} ms): profiler overhead and "
                    "noise make them disagree, so the split below explains little of it.")
        if abs(share - 1) <= AGREE:
            return f"The traced steps account for {share:.0%} of it ({t:+.1f} ms of {m:+.1f} ms)."
        how = "point the other way" if share < 0 else f"account for {share:.0%} of it"
        return (f"The traced steps {how} ({t:+.1f} ms vs measured {m:+.1f} ms, off by {t - m:+.1f} ms): "
                "profiler overhead and noise make them disagree, so read the split below as a direction, "
                "not a measurement.")

    def _where(self) -> str:
        ph = self.phases.set_index("phase")["delta_ms"]
        t = self.traced_delta_ms
        if abs(t) < 1e-9 or ph.empty:
            return ""
        sign = 1 if t > 0 else -1
        top = (ph * sign).idxmax()
        share = ph[top] / t
        ops = self.ops[(self.ops["phase"] == top) & (self.ops["delta_ms"] * sign > 0)]
        if (ops["kind"] == "kernel").any() and top != "data wait":  # GPU phases are device time: kernels explain them
            ops = ops[ops["kind"] == "kernel"]
        mostly = f", mostly {ops.iloc[0]['op']} ({ops.iloc[0]['delta_ms']:+.1f} ms)" if not ops.empty else ""
        if share <= 1.05:  # (floating point and rounding: a few percent over is "all of it")
            text = f"{share:.0%} of the traced change is in {top}{mostly}"
        else:  # phases moved both ways: name the biggest mover, not a share above 100%
            text = (f"{top} moves {ph[top]:+.1f} ms{mostly}, more than the whole traced change ({t:+.1f} ms): "
                    "other phases move the other way")
        tiny = PHASE_SAME_MS * max(self.traced_a_ms, self.traced_b_ms)
        if top != "data wait":
            wait = ph.get("data wait", 0.0)
            text += ("; data wait is unchanged" if abs(wait) < tiny else f"; data wait moves {wait:+.1f} ms")
        return text + "."

    def _compile_sentence(self) -> str:
        c = self.compile
        parts = [f"#{c['trial']} compiled: {c['compile_s']:.1f} s of compile + warm-up, paid once and not in "
                 "the per-step figures"]
        saving = -self.measured_delta_ms if c.get("side") == "b" else self.measured_delta_ms
        if saving > 0:
            parts.append(f"at {saving:.1f} ms saved per step it pays back after "
                         f"{math.ceil(round(c['compile_s'] * 1e3 / saving, 6)):,} steps")
        if c.get("breaks"):
            parts.append("distinct graph breaks: " + "; ".join(b.removeprefix("graph break ") for b in c["breaks"][:3]))
        return "; ".join(parts) + "."

    def __str__(self) -> str:
        lines = [" ".join(self.sentences())]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<Explanation #{self.b} vs #{self.a}: {self.verdict}, {self.measured_delta_ms:+.1f} ms/step>"

    def _repr_html_(self) -> str:
        fmt = "{:,.3g}".format
        parts = [f"<p>{html.escape(s)}</p>" for s in self.sentences()]
        parts.append("<b>Phases (ms per traced step)</b>" + self.phases.to_html(index=False, float_format=fmt, border=0))
        top = self.ops.head(10)
        parts.append("<b>Ops that explain most of the change</b>" + top.to_html(index=False, float_format=fmt, border=0))
        parts += [f"<p><small>{html.escape(n)}</small></p>" for n in self.notes]
        return f'<div class="wb-explanation">{"".join(parts)}</div>'

    def chart(self, top: int = 8) -> Any:
        """An altair chart of the phase deltas and the top op deltas (needs the notebook extra)."""
        return explanation_chart(self.phases, self.ops.head(top))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary: the sentences, the figures, and both tables as lists of rows."""
        return {"a": self.a, "b": self.b, "verdict": self.verdict, "text": self.sentences(),
                "speedup": self.comparison.speedup, "measured_a_ms": self.measured_a_ms,
                "measured_b_ms": self.measured_b_ms, "traced_a_ms": self.traced_a_ms, "traced_b_ms": self.traced_b_ms,
                "accounted": self.accounted, "phases": self.phases.to_dict(orient="records"),
                "ops": self.ops.to_dict(orient="records"), "traces": list(self.traces), "compile": self.compile,
                "notes": list(self.notes)}


def explain_traces(runs_a: list[TrialResult], runs_b: list[TrialResult], comparison: Comparison) -> Explanation:
    """The Explanation of B against A from trials whose last one carries a trace (`trace_path`)."""
    ta, tb = read_trace(_trace_of(runs_a[-1])), read_trace(_trace_of(runs_b[-1]))
    ma = sum(r.step_time_s or 0.0 for r in runs_a) / len(runs_a) * 1e3
    mb = sum(r.step_time_s or 0.0 for r in runs_b) / len(runs_b) * 1e3
    notes = [f"traced figures: A from {ta.used}, B from {tb.used} (after each measured window); measured: "
             "median step of each side's measured windows"]
    sa, sb = runs_a[-1].samples_per_step, runs_b[-1].samples_per_step
    if sa and sb and sa != sb:
        notes.append(f"the steps hold different samples ({sa} vs {sb}): per-step times are not per-sample; "
                     "the speedup is in samples/s")
    if ta.device != tb.device:
        notes.append("one trace has device kernels and the other not: compare trials on the same device")
    return Explanation(runs_a[0].trial_id, runs_b[0].trial_id, comparison, ma, mb, phase_table(ta, tb),
                       op_table(ta, tb), ta.step_ms, tb.step_ms, (ta.path, tb.path),
                       compile_summary(runs_a[-1], runs_b[-1]), tuple(notes))


def _trace_of(r: TrialResult) -> str:
    if not has_trace(r):
        raise ValueError(f"trial #{r.trial_id} has no readable trace: run it with bench.run(..., trace=True)")
    return str(r.trace_path)


def has_trace(r: TrialResult) -> bool:
    """True when the trial kept a Chrome trace that is still on disk."""
    return bool(r.trace_path) and Path(str(r.trace_path)).exists()


def compile_summary(a: TrialResult, b: TrialResult) -> dict[str, Any]:
    """For compiled vs eager: which side compiled, its compile + warm-up seconds, its distinct breaks."""
    from .compile import break_lines

    compiled = [(side, r) for side, r in (("a", a), ("b", b)) if r.knobs.compile != "off"]
    if len(compiled) != 1:
        return {}
    side, r = compiled[0]
    return {"side": side, "trial": r.trial_id, "compile_s": float(r.compile_s or 0.0),
            "breaks": break_lines(r.extra.get("compile"))}


# ---- from a workbench --------------------------------------------------------------------------
def explain(bench: Bench, a: Any = None, b: Any = None, *, progress: Any = None) -> Explanation:
    """Trial B explained against trial A (ids, TrialResults or Knobs; A defaults to the baseline).

    A trial without a readable trace gets one traced repeat of its knobs (`bench.run(knobs,
    trace=True)`, so it lands in the log); the repeat also joins its side of the comparison.
    A Knobs value is run with trace=True. Raises ValueError for a failed trial.
    """
    if a is None:
        if bench.baseline is None:
            raise ValueError("explain(a, b) needs A: pass a trial id, or set a baseline first")
        a = bench.baseline
    if b is None:
        raise ValueError("explain(a, b) needs B: a trial id, a TrialResult or a Knobs value")
    runs_a = traced_side(bench, a, progress)
    runs_b = traced_side(bench, b, progress)
    return explain_traces(runs_a, runs_b, compare_sides(bench, runs_a, runs_b))


def traced_side(bench: Bench, x: Any, progress: Any = None) -> list[TrialResult]:
    """[the trial] when it has a trace, else [the trial, a traced repeat of its knobs]."""
    from ..core.knobs import Knobs

    if isinstance(x, Knobs):
        first = bench.run(x, trace=True, progress=progress)
    elif isinstance(x, TrialResult):
        first = x
    elif isinstance(x, int) and not isinstance(x, bool):
        first = bench.log.get(x)
    else:
        raise TypeError(f"explain takes trial ids, TrialResults or Knobs, got {type(x).__name__}")
    runs = [first]
    if first.ok and not has_trace(first):
        runs.append(bench.run(first.knobs, trace=True, progress=progress))
    bad = [r for r in runs if not r.ok] or ([] if has_trace(runs[-1]) else runs[-1:])
    if bad:
        r = bad[0]
        why = r.message or "no trace was written (see result.notes)"
        raise ValueError(f"trial #{r.trial_id} cannot be explained: {r.status}: {why}")
    return runs


def compare_sides(bench: Bench, runs_a: list[TrialResult], runs_b: list[TrialResult]) -> Comparison:
    """The one call into the comparison: the trials as they are, judged against the log's noise (no extra rounds)."""
    from ..deciding.rounds import compare

    return compare(runs_a, runs_b, log=bench.log)


def explain_winner(bench: Bench, start: TrialResult, best: TrialResult, *, progress: Any = False) -> Explanation | None:
    """`tune()`'s winner explained against its start (None when the start won or a side failed).

    A side without a trace gets one traced repeat (two more trials at most, after the search)."""
    if best.knobs == start.knobs or not (best.ok and start.ok):
        return None
    try:
        return explain(bench, start, best, progress=progress)
    except ValueError:  # a traced repeat failed: the tuning result stands without its explanation
        return None


def explanation_chart(phases: pd.DataFrame, ops: pd.DataFrame, *, width: int = 420) -> Any:
    """Why B differs from A: the phase deltas beside the top op deltas (ms per traced step; < 0 = B saves).
    Needs altair (the notebook extra)."""
    import altair as alt

    def bars(df: pd.DataFrame, y: str, title: str) -> Any:
        data = df.assign(direction=df["delta_ms"].map(lambda d: "B saves" if d < 0 else "B costs"))
        return alt.Chart(data, title=title).mark_bar().encode(
            x=alt.X("delta_ms:Q", title="B − A, ms per step"),
            y=alt.Y(f"{y}:N", sort=None, title=None),
            color=alt.Color("direction:N", scale=alt.Scale(domain=["B saves", "B costs"], range=["#2e7d32", "#c62828"])),
            tooltip=[c for c in (y, "a_ms", "b_ms", "delta_ms", "phase", "change") if c in df.columns],
        ).properties(width=width)

    return alt.vconcat(bars(phases, "phase", "by phase"), bars(ops, "op", "top ops"))
