"""Panel: knob widgets + progress + live chart + results table, in one notebook output.

    panel = bench.panel()     # every knob change runs a measured trial; the chart gains a point
    panel                     # (display it: last line of a cell)
    bench.run(amp="bf16")     # programmatic trials land in the same chart and table

How it stays responsive: widget callbacks only record the wanted Knobs and wake one worker
thread; the worker waits out the debounce, runs `bench.run(...)` (which holds the workbench's
lock, so cell-driven and panel-driven trials never overlap), and the kernel's main thread is free
the whole time. A change made during a trial replaces any queued one (latest wins). Stop sets the
`cancel` event that `run_trial` checks at every step boundary. The chart and table update from
`bench.results` whenever the ResultLog appends a trial, whoever ran it: the chart gets new data,
not a new chart, and draws the baseline, the recent trials and the best of each configuration.

ipywidgets and altair are imported inside `Panel` only; without a notebook front-end `panel()`
prints how to use the workbench from code instead.
"""

from __future__ import annotations

import html
import threading
import time
import weakref
from typing import Any

from ...core.knobs import Knobs
from ...core.measure import TrialResult
from ...core.progress import FAILED_PHASES, Poller, TrialProgress
from ...launch.runner import check_knobs
from ...results.protocol import Bench
from ...results.stats import ANSWER_WORDS
from ..display import comparison_html
from .controls import GROUPS, KnobControls
from .queue import DEBOUNCE_S, TrialQueue
from .tuning import DEFAULT_BUDGET_S, Countdown, PanelBench, TuneStopped, tune_summary
from .view import explanation_html, noise_html, result_line, status_html, table_html, trace_html

__all__ = ["GROUPS", "Panel", "has_frontend", "panel"]


PHASES = {
    "loading data": "loading the first batch…",
    "starting workers": "starting workers…",
    "starting ranks": "starting the DDP processes (world_size > 1)…",
    "compiling": "compiling (torch.compile: seconds to minutes, not a hang)…",
    "warming up": "warming up (not measured)…",
    "measuring": "measuring…",
    "stopping early: clearly slower": "stopping early: clearly slower than the baseline (bench.run(stop_early=False) "
                                      "runs the whole window)",
    "done": "finishing…",
}

TERMINAL_HELP = """\
bench.panel() needs a Jupyter notebook with ipywidgets; here, drive the workbench from code:
    r = bench.run(num_workers=2, amp="bf16")   # one measured trial (blocks); returns a TrialResult
    bench.results                                # every trial as a pandas DataFrame
    bench.compare(1, 2)                          # trial 2 against 1: faster, slower, same or undecided
    bench.chart().save("runs.html")              # the comparison chart as a web page (needs altair)
"""

_ACTIVE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # bench -> its live Panel


def panel(bench: Bench, **kwargs: Any) -> Panel | None:
    """The panel for `bench` in a notebook; in a terminal, print how to work from code instead."""
    if not has_frontend():
        print(TERMINAL_HELP, end="")
        return None
    try:
        return Panel(bench, **kwargs)
    except ImportError as e:
        print(f"bench.panel() needs ipywidgets and altair ({e}).\n{TERMINAL_HELP}", end="")
        return None


def has_frontend() -> bool:
    """True inside a Jupyter kernel (where widgets can render), False in a terminal or script."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def mixed_threads_html(df: Any, started_here: set[int], device: str) -> str:
    """On CPU, a line under the table when its ok trials ran on different threads of this kernel (`ran_in`:
    a panel's trial thread and the main thread, with `trials_in="kernel"`): the thread alone can move a figure
    by ten percent or more either way (docs/measurement.md "Where a trial runs"), so their verdicts mix two
    settings. Trials in the worker process all run on its one thread: no line. Old logs without `ran_in`:
    the trials `started_here` (this panel's) against the others."""
    ok = df.loc[df["status"] == "ok"] if len(df) else df
    if device != "cpu" or not len(ok):
        return ""
    where = ok["ran_in"].fillna("") if "ran_in" in ok else None
    if where is not None and (where != "").all():
        mixed = "kernel thread" in set(where) and len(set(where)) > 1
    else:
        ids = set(ok["trial_id"])
        mixed = bool(ids & started_here) and bool(ids - started_here)
    if not mixed:
        return ""
    text = ("This table mixes trials run on the panel's thread of this kernel with trials run elsewhere (a cell's, "
            "on the main thread). On a CPU the thread alone can move a figure by ten percent or more either way "
            "(docs/measurement.md, 'Where a trial runs'): compare trials started the same way, or let the trials "
            "run in the workbench's worker process (Workbench(..., trials_in='worker'), the default).")
    return f'<p class="wb-mixed-threads" style="font-size:12px;color:#8d6e00">{html.escape(text)}</p>'


class Panel:
    """The widgets, the worker thread that runs trials, and the redraw-on-append observer.

    Drive it from code like a user would: set `panel.controls["num_workers"].value = 2`, then
    `panel.wait()`; `panel.stop()` cancels the running trial; `panel.repeat(trial_id)` confirms.
    """

    def __init__(self, bench: Bench, *, debounce_s: float = DEBOUNCE_S, repeat_rounds: int = 8) -> None:
        import altair as alt
        import ipywidgets as W

        if debounce_s < 0 or repeat_rounds < 1:
            raise ValueError(f"debounce_s must be >= 0 and repeat_rounds >= 1, got {debounce_s}, {repeat_rounds}")
        alt.JupyterChart.enable_offline()  # bundle the Vega JS from vl-convert: no CDN needed
        self.bench = bench
        self.debounce_s, self.repeat_rounds = debounce_s, repeat_rounds
        self.last_repeat: dict[str, Any] | None = None  # the latest "repeat to confirm" outcome
        self._device, self._has_conv = bench.device.type, bench.workload.has_conv
        self.started_here: set[int] = set()  # ids of the trials this panel ran (on the trial thread)
        self._running_on: threading.Thread | None = None  # the queue's thread while it runs a trial

        # ---- controls: one widget per knob, description = knob name --------------------------
        self.knob_controls = KnobControls(W, bench)
        self.controls = self.knob_controls.controls
        self.block_boxes = self.knob_controls.block_boxes
        self.knob_controls.observe(self._on_change)
        self.run_button = W.Button(description="Run", icon="play", tooltip="measure the current knobs now")
        self.stop_button = W.Button(description="Stop", icon="stop", button_style="",  # red only while a trial runs
                                    tooltip="cancel the running trial at the next step (recorded as interrupted)")
        self.run_button.on_click(lambda _: self._on_change(force=True))
        self.stop_button.on_click(lambda _: self.stop())
        self._tune_widgets(W)  # the Tune button and its budget box

        # ---- progress and status ---------------------------------------------------------------
        self.progress = W.IntProgress(value=0, min=0, max=1, description="trial",
                                      layout=W.Layout(width="320px"))
        self.rate = W.Label("")
        self.status = W.HTML(status_html("idle", "Change a knob to run a measured trial, or press Run."))
        self.trace_line = W.HTML("")  # the latest trial's Chrome trace (bench.run(trace=True))

        # ---- chart and table -------------------------------------------------------------------
        from ..charts import comparison_chart, on_trial_pick

        self.chart = alt.JupyterChart(comparison_chart(bench.results), embed_options={"renderer": "svg"})
        self.trial_pick = W.Dropdown(description="trial", options=[], layout=W.Layout(width="360px"))
        self.baseline_button = W.Button(description="set as baseline", icon="flag")
        self.repeat_button = W.Button(description="repeat to confirm", icon="refresh",
                                      tooltip=f"re-run this trial and the baseline in alternating rounds until the "
                                              f"answer is faster, slower or the same speed (at most {repeat_rounds})")
        self.explain_button, self.explanation = self._explain_widgets(W)
        self.baseline_button.on_click(lambda _: self._set_baseline())
        self.repeat_button.on_click(lambda _: self.repeat(self.trial_pick.value))
        self.verdict = W.HTML("")
        self.table = W.HTML("")  # stretched to the panel's width; its box scrolls (view.table_html)
        self.widget = W.VBox([
            W.HTML(f"<b>Tuning Workbench</b> · {bench.name} on {bench.device} · each change runs a trial: "
                   f"warm-up until steady (not measured), then {bench.steps} measured steps"),
            self.knob_controls.layout(),
            W.HBox([self.run_button, self.stop_button, self.progress, self.rate]),
            W.HBox([self.tune_button, self.budget_box]),
            self.status,
            self.trace_line,
            self.chart,
            W.HBox([self.trial_pick, self.baseline_button, self.repeat_button, self.explain_button]),
            self.verdict,
            self.explanation,
            self.table,
        ])
        for w, css in ((self.widget, "wb-panel"), (self.run_button, "wb-run"), (self.stop_button, "wb-stop"),
                       (self.rate, "wb-rate"), (self.table, "wb-table"), (self.chart, "wb-chart")):
            w.add_class(css)  # what the browser test and the page's CSS find

        # ---- the trial queue (its own thread) and the observer -------------------------------
        self.queue = TrialQueue(self._handle, debounce_s=debounce_s,
                                on_error=lambda e: self._set_status("error", f"{type(e).__name__}: {e}"))
        self.trial_progress = TrialProgress()  # stored into by the trial thread, read by a Poller
        self._last_knobs: Knobs | None = None  # knobs of the panel's latest trial (skip no-op re-runs)
        self._measure_start: tuple[float, int] | None = None
        self._draw_lock = threading.Lock()
        self.knobs()  # set the initial disabled states and tooltips
        self.redraw()
        previous = _ACTIVE.get(bench)
        if previous is not None:
            previous.detach()  # a re-run cell replaces the old panel's thread and observer
        _ACTIVE[bench] = self
        bench.log.observe(self._on_trial)
        self._unpick = on_trial_pick(self.chart, self._on_chart_pick)  # a click on a point picks its trial

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    # ---- reading the controls ----------------------------------------------------------------
    def knobs(self) -> Knobs:
        """The Knobs the controls describe; knobs that cannot apply here are disabled and left off."""
        return self.knob_controls.knobs()

    def _on_change(self, change: Any = None, *, force: bool = False) -> None:
        """A control changed (debounced trial) or Run was pressed (`force`: now, even if unchanged)."""
        try:
            k = self.knobs()
            check_knobs(self.bench.workload, k)
        except (ValueError, TypeError) as e:
            self._set_status("error", f"not run: {e}")
            return
        self.submit(k, force=force, debounce=not force)

    # ---- the job queue and the worker thread -----------------------------------------------
    def submit(self, knobs: Knobs, *, force: bool = False, debounce: bool = True) -> None:
        """Queue a trial of `knobs` (replacing any queued job); it starts after the debounce."""
        self.queue.put(("knobs", knobs, force), debounce=debounce)
        self._set_status("queued", f"queued: {knobs.label(self.bench.defaults)}")

    def repeat(self, trial_id: int | None) -> None:
        """Queue "repeat to confirm": the trial's knobs and the baseline's, alternating rounds."""
        if trial_id is None:
            self._set_status("error", "pick a trial first")
            return
        self.queue.put(("repeat", trial_id, True), debounce=False)

    def _explain_widgets(self, W: Any) -> tuple[Any, Any]:
        """The 'explain vs baseline' button and the HTML the explanation goes into."""
        button = W.Button(description="explain vs baseline", icon="search",
                          tooltip="why this trial is faster or slower than the baseline, by phase and op "
                                  "(traces a repeat of a trial that has no trace)")
        button.on_click(lambda _: self.explain(self.trial_pick.value, trace=True))
        return button, W.HTML("")

    def explain(self, trial_id: int | None, *, trace: bool = False) -> None:
        """Show this trial explained against the baseline (`bench.explain`). Without `trace` (a chart
        click) it only reads traces both already have, at once; with it, it queues like a trial
        and traces a repeat of a side without one."""
        if trial_id is None:
            return
        if trace:
            self.queue.put(("explain", trial_id, True), debounce=False)
        else:
            self._explain(trial_id, False)

    def _tune_widgets(self, W: Any) -> None:
        """The "Tune" button, the seconds budget box it reads, and the countdown its labels show."""
        self.tune_button = W.Button(description="Tune", icon="magic", tooltip="race candidates from the current "
                                    "knobs within the budget (bench.tune(budget_s=...)); Stop ends it")
        self.budget_box = W.BoundedFloatText(value=DEFAULT_BUDGET_S, min=1.0, max=86_400.0, step=10.0,  # seconds
                                             description="budget (s)", layout=W.Layout(width="170px"))
        self.tune_button.on_click(lambda _: self.tune(self.budget_box.value))
        self.last_tune: Any = None  # the latest TuneResult from the Tune button
        self._countdown = Countdown()  # the seconds left of a running tune, for the labels

    def tune(self, budget_s: float) -> None:
        """Queue `tune(budget_s=...)` from the current knobs: its trials show on the bar, the labels say
        the seconds left, and Stop ends it (the result: `last_tune`, shown under the chart)."""
        self.queue.put(("tune", budget_s, True), debounce=False)
        self._set_status("queued", f"queued: tune within {budget_s:g} s")

    def _tune(self, budget_s: float) -> None:
        """tune() on the queue thread, through PanelBench (the panel's progress and Stop)."""
        from ...search.tune import tune

        try:
            start = self.knobs()
        except (ValueError, TypeError) as e:
            self._set_status("error", f"not tuned: {e}")
            return
        self._countdown.start(budget_s)
        self.last_tune = None
        self.progress.description, self.stop_button.button_style = "tune", "danger"
        self._set_status("starting", f"tuning within {budget_s:g} s from {start.label(self.bench.defaults)}…")
        try:
            with Poller(self.trial_progress, self._progress):
                self.last_tune = tune(PanelBench(self.bench, self.trial_progress, self.queue.cancel),  # type: ignore[arg-type]
                                      budget_s=budget_s, start=start)
        except (ValueError, TypeError) as e:
            self._set_status("error", f"not tuned: {e}")
            return
        except TuneStopped:
            self.last_tune = None
        finally:
            self._countdown.stop()
            self.progress.description, self.stop_button.button_style = "trial", ""
        if self.last_tune is None or self.queue.cancel.is_set():  # Stop during the tune (maybe its start)
            self.last_tune = None  # a stopped tune decided nothing
            self._set_status("interrupted", "tune stopped by the user: its trials are in the table")
            return
        self.verdict.value = self.last_tune._repr_html_()
        self.rate.value = ""
        self._set_status("ok", tune_summary(self.last_tune))

    def stop(self) -> None:
        """Cancel the running trial at its next step boundary and drop any queued job."""
        running = self.queue.stop()
        self._set_status("stopping" if running else "idle", "stopping at the next step…" if running else "idle")

    def wait(self, timeout: float | None = None) -> bool:
        """Block until no trial is queued or running; False if `timeout` seconds passed first."""
        return self.queue.wait(timeout)

    @property
    def busy(self) -> bool:
        """True while a trial (or a repeat) runs or waits in the queue."""
        return self.queue.busy

    def _handle(self, job: tuple[str, Any, bool]) -> None:
        """The queue's handler (on its thread): one trial, or a repeat."""
        kind, payload, force = job
        if kind == "knobs":
            if force or payload != self._last_knobs:
                self._run_one(payload)
            else:
                self._set_status("idle", "no change: these knobs were just measured (press Run to re-measure)")
        elif kind == "explain":
            self._explain(payload, force)
        elif kind == "tune":
            self._tune(payload)
        else:
            self._repeat(payload)

    def _run_one(self, knobs: Knobs, what: str = "") -> TrialResult | None:
        """One trial through `bench.run` (blocking, in the worker thread)."""
        self._last_knobs = knobs
        self._measure_start = None
        self.progress.value, self.progress.bar_style = 0, "info"
        self.rate.value = ""
        self.stop_button.button_style = "danger"
        label = knobs.label(self.bench.defaults)
        hopeless = self.bench._expect_slow(knobs) if hasattr(self.bench, "_expect_slow") else None
        self._set_status("starting", f"{what}starting: {label}" + (f" (warning: {hopeless})" if hopeless else ""))
        try:
            with Poller(self.trial_progress, self._progress):  # widgets set from the poller's thread
                self._running_on = threading.current_thread()  # its trial is logged (and drawn) from this thread
                result = self.bench.run(knobs, progress=self.trial_progress, cancel=self.queue.cancel)
        except (ValueError, TypeError) as e:  # knobs the workload cannot take (unknown block, batch too big)
            self._set_status("error", f"not run: {e}")
            return None
        finally:
            self._running_on = None
            self.stop_button.button_style = ""  # nothing left to stop
        self.progress.bar_style = "success" if result.ok else "danger"
        if result.ok:  # the poller may not have seen the last step before "done"
            self.progress.value = self.progress.max
        done, total = self.progress.value, self.progress.max
        stopped = result.extra.get("stopped_early") if result.ok else None  # earlystop.py: clearly slower
        self.rate.value = (f"stopped early: clearly slower after {stopped['steps']}/{stopped['of']} steps" if stopped
                           else f"{total}/{total} steps" if result.ok else f"{result.status} after {done}/{total} steps")
        self._set_status(result.status, what + result_line(result, self.bench))
        return result

    def _progress(self, phase: str, done: int, total: int) -> None:
        """`bench.run`'s progress callback: (phase, steps done, steps total); runs in the worker."""
        now = time.monotonic()
        left = self._countdown.suffix()  # " · 23 s of 60 s left" while a tune runs
        if phase == "done" or phase in FAILED_PHASES:  # the trial's end: keep the bar where it stopped
            self.progress.max = max(1, total)  # a trial shorter than one poll shows only this state
            self._set_status(phase, PHASES.get(phase, phase) + left)
            return
        self.progress.max, self.progress.value = max(1, total), done
        if phase == "measuring":
            if self._measure_start is None:
                self._measure_start = (now, done)
            t0, d0 = self._measure_start
            if done > d0 and now > t0:
                self.rate.value = f"{done}/{total} steps · {(done - d0) / (now - t0):.1f} steps/s{left}"
        else:
            self._measure_start = None if phase == "warming up" else self._measure_start  # a tune's next trial
            self.rate.value = f"{done}/{total} steps{left}"
        self._set_status(phase, PHASES.get(phase, phase) + left)

    def _repeat(self, trial_id: int) -> None:
        """Re-run the baseline's knobs and the trial's through `bench.compare(rounds="auto")` (the same
        function as the table's verdicts, tune and diagnose): interleaved turns when the two can share
        the process, else alternating rounds; show its verdict."""
        base, pick = self.bench.baseline, self.bench.log.get(trial_id)
        if base is None or base.trial_id == pick.trial_id:
            self._set_status("error", "repeat needs a baseline and a different trial: set a baseline first")
            return
        n = 0

        def run(knobs: Knobs) -> TrialResult | None:  # one round trial; None (stopped) ends the rounds
            nonlocal n
            if self.queue.cancel.is_set():
                return None
            n += 1
            which = "baseline" if knobs == base.knobs else f"#{trial_id}"
            return self._run_one(knobs, what=f"repeat {n}/{2 * self.repeat_rounds} at most ({which}): ")

        c = self.bench.compare(base.trial_id, pick.trial_id, rounds="auto", max_rounds=self.repeat_rounds, run=run,
                               cancel=self.queue.cancel)
        self.last_repeat = {"trial_id": trial_id, "baseline_id": base.trial_id, "comparison": c,
                            "rounds": c.rounds, "confirmed": c.verdict, "answer": c.answer}
        self.verdict.value = (f"<b>Repeat to confirm #{trial_id} against baseline #{base.trial_id}:</b> "
                              + comparison_html(c))
        how = (f"{c.turns} pairs of interleaved turns, {c.seconds or 0:.0f} s" if c.method == "interleaved"
               else f"{c.rounds} round{'s' if c.rounds != 1 else ''}")
        self._set_status("ok", f"repeat done: {ANSWER_WORDS[c.answer]} after {how}")

    def _on_chart_pick(self, trial_id: int | None) -> None:
        """A click on a chart point selects that trial in the picker (baseline / repeat act on it)."""
        if trial_id is not None and trial_id in [v for _, v in self.trial_pick.options]:
            self.trial_pick.value = trial_id
            self.explain(trial_id)

    def _explain(self, trial_id: int, trace: bool) -> None:
        """The explanation of `trial_id` against the baseline into `self.explanation` (queue thread)."""
        from ...diagnose.explain import has_trace

        base, pick = self.bench.baseline, self.bench.log.get(trial_id)
        if base is None or base.trial_id == trial_id or not pick.ok:
            self.explanation.value = explanation_html(None, "pick an ok trial other than the baseline to explain it")
            return
        if not trace and not (has_trace(base) and has_trace(pick)):
            self.explanation.value = explanation_html(None, f"#{trial_id} or the baseline has no trace: press "
                                                      "'explain vs baseline' to trace a repeat of each")
            return
        if trace:
            self._set_status("starting", f"explaining #{trial_id} against baseline #{base.trial_id}…")
        try:
            e = self.bench.explain(base, pick, progress=self.trial_progress)
        except (ValueError, TypeError) as err:
            self.explanation.value = explanation_html(None, f"could not explain #{trial_id}: {err}")
            return
        self.explanation.value = explanation_html(e)
        if trace:
            self._set_status("ok", f"explained #{trial_id} against baseline #{base.trial_id}")

    # ---- drawing -----------------------------------------------------------------------------
    def _on_trial(self, result: TrialResult) -> None:
        """ResultLog observer (new trial or new baseline): redraw; never break the caller's run."""
        if self._running_on is threading.current_thread():  # this panel's own trial, not a cell's
            self.started_here.add(result.trial_id or 0)
            self._set_status("done", PHASES["done"])  # the trial has ended: say so now, not at the poller's next look
        try:
            self.redraw()
        except Exception as e:
            self._set_status("error", f"could not redraw the chart: {type(e).__name__}: {e}")

    def redraw(self) -> None:
        """Chart, table and trial picker from `bench.results` (what is in the log right now)."""
        from ..charts import chart_view, update_chart

        with self._draw_lock:
            df = self.bench.results  # kept up to date by the log: cheap on a long log
            update_chart(self.chart, df)  # new rows into the same chart (a new chart only at the first trial)
            shown = chart_view(df)  # the table and picker list what the chart draws, not 10,000 rows
            self.table.value = (table_html(shown, df.attrs.get("noise")) + noise_html(df.attrs.get("noise"), self.bench.trials)
                                + mixed_threads_html(df, self.started_here, self._device))
            self.trace_line.value = trace_html(self.bench.trials)
            picked = self.trial_pick.value
            options = [(f"#{r.trial_id} {r.label} ({r.status})", int(r.trial_id)) for r in shown.iloc[::-1].itertuples()]
            self.trial_pick.options = options
            ids = [v for _, v in options]
            self.trial_pick.value = picked if picked in ids else (ids[0] if ids else None)

    def _set_baseline(self) -> None:
        try:
            self.bench.baseline = self.trial_pick.value
        except (ValueError, TypeError) as e:
            self._set_status("error", str(e))

    def _set_status(self, phase: str, text: str) -> None:
        self.status.value = status_html(phase, text)

    # ---- lifecycle ---------------------------------------------------------------------------
    def detach(self) -> None:
        """Stop the worker thread and stop listening to the log (the widgets stay as they are)."""
        self.bench.log.unobserve(self._on_trial)
        self._unpick()
        self.queue.close()

    def close(self) -> None:
        """Detach and close every widget (removes the panel from the page)."""
        self.detach()
        stack = [self.widget]
        while stack:  # close this panel's widgets only (Widget.close_all would close every widget)
            w = stack.pop()
            stack.extend(getattr(w, "children", ()))
            w.close()

    def __repr__(self) -> str:
        return f"<Panel for {self.bench!r}{' (busy)' if self.busy else ''}>"


