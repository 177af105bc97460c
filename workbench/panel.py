"""Panel: knob widgets + progress + live chart + results table, in one notebook output.

    panel = bench.panel()     # every knob change runs a measured trial; the chart gains a point
    panel                     # (display it: last line of a cell)
    bench.run(amp="bf16")     # programmatic trials land in the same chart and table

How it stays responsive: widget callbacks only record the wanted Knobs and wake one worker
thread; the worker waits out the debounce, runs `bench.run(...)` (which holds the workbench's
lock, so cell-driven and panel-driven trials never overlap), and the kernel's main thread is free
the whole time. A change made during a trial replaces any queued one (latest wins). Stop sets the
`cancel` event that `run_trial` checks at every step boundary. The chart and table redraw from
`bench.results` whenever the ResultLog appends a trial, whoever ran it.

ipywidgets and altair are imported inside `Panel` only; without a notebook front-end `panel()`
prints how to use the workbench from code instead.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

import pandas as pd

from .knobs import AMP_MODES, COMM_HOOKS, COMPILE_MODES, DATA_MODES, MATMUL_PRECISIONS, Knobs, device_notes
from .measure import TrialResult
from .results import Comparison, compare
from .runner import check_knobs

if TYPE_CHECKING:
    from .bench import Workbench

# The seeds' teaching order: fix the data pipeline first, then precision/compile, then memory.
GROUPS: dict[str, list[str]] = {
    "Data pipeline": ["data", "batch_size", "num_workers", "pin_memory", "persistent_workers", "prefetch_factor"],
    "Precision & compile": ["amp", "compile", "matmul_precision", "channels_last"],
    "Memory": ["accum_steps", "checkpoint"],
    "CPU": ["cpu_threads"],
    "Distributed": ["world_size", "ddp_no_sync", "ddp_bucket_cap_mb", "ddp_comm_hook", "ddp_gradient_as_bucket_view",
                    "ddp_static_graph", "ddp_find_unused_parameters", "ddp_broadcast_buffers"],
}
# Knobs are read in this order, so a knob can depend on the ones before it (workers on data mode).
ORDER = [name for group in GROUPS.values() for name in group]  # tests check it covers knob_names()

HELP = {
    "data": "loader = real DataLoader; cached = one batch kept on the device (if much faster, you are data-bound)",
    "batch_size": "samples per micro-batch; throughput is samples/s, so sizes compare fairly",
    "num_workers": "DataLoader worker processes; start near half the physical cores, more is not always better",
    "pin_memory": "page-locked host buffers for faster async copies to an accelerator",
    "persistent_workers": "keep worker processes alive across epochs instead of re-forking them",
    "prefetch_factor": "batches each worker prepares ahead (default 2); costs host memory",
    "amp": "autocast dtype; bf16 on CPU and recent GPUs, fp16 (+GradScaler) on older GPUs",
    "compile": "torch.compile mode; the first steps compile (seconds to minutes) and are not measured",
    "matmul_precision": "allow TF32/bf16 for float32 matmuls on GPUs that have them",
    "channels_last": "NHWC memory layout for convnets (best with AMP)",
    "accum_steps": "micro-batches per optimizer step: a large effective batch in small memory",
    "checkpoint": "recompute these blocks' activations in backward: less memory, more time",
    "cpu_threads": "intra-op threads of the main process; with workers, fewer threads can be faster",
    "world_size": "processes under DDP: one per GPU, or gloo CPU processes sharing this machine's cores",
    "ddp_no_sync": "skip the gradient all-reduce on all but the last accumulation micro-batch",
    "ddp_bucket_cap_mb": "gradient bucket size: bigger = fewer all-reduces, later start of communication",
    "ddp_comm_hook": "compress gradients to fp16/bf16 before the all-reduce (half the bytes)",
    "ddp_gradient_as_bucket_view": "gradients live in the all-reduce buckets: one copy less, less memory",
    "ddp_static_graph": "promise DDP the same graph every step (lets it skip per-step bookkeeping)",
    "ddp_find_unused_parameters": "search for parameters without gradients each step (only for such models)",
    "ddp_broadcast_buffers": "broadcast rank 0's buffers (BatchNorm statistics) at every forward",
}
# A value that switches the knob "on": if the current context makes it invalid or a no-op, the
# widget is disabled with the reason as its tooltip.
PROBES: dict[str, Any] = {
    "num_workers": 1, "pin_memory": True, "persistent_workers": True, "prefetch_factor": 4,
    "matmul_precision": "high", "channels_last": True,
}
PHASES = {
    "loading data": "loading the first batch…",
    "starting workers": "starting workers…",
    "compiling": "compiling (torch.compile: seconds to minutes, not a hang)…",
    "warming up": "warming up (not measured)…",
    "measuring": "measuring…",
    "done": "finishing…",
}
DEFAULT = "default"  # dropdown value standing for a knob's None (torch's own default)
STATUS_COLORS = {"ok": "#2e7d32", "nan": "#ef6c00", "interrupted": "#6d4c41", "error": "#c62828", "oom": "#b71c1c"}
TABLE_COLUMNS = ["trial_id", "label", "status", "samples_per_s", "speedup", "verdict", "step_time_ms",
                 "data_wait_share", "peak_memory_mb", "final_loss", "message"]

TERMINAL_HELP = """\
bench.panel() needs a Jupyter notebook with ipywidgets; here, drive the workbench from code:
    r = bench.run(num_workers=2, amp="bf16")   # one measured trial (blocks); returns a TrialResult
    bench.results                                # every trial as a pandas DataFrame
    bench.compare(1, 2)                          # is trial 2 faster than trial 1 beyond noise?
    bench.chart().save("runs.html")              # the comparison chart as a web page (needs altair)
"""

_ACTIVE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # bench -> its live Panel


def panel(bench: Workbench, **kwargs: Any) -> Panel | None:
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


class Panel:
    """The widgets, the worker thread that runs trials, and the redraw-on-append observer.

    Drive it from code like a user would: set `panel.controls["num_workers"].value = 2`, then
    `panel.wait()`; `panel.stop()` cancels the running trial; `panel.repeat(trial_id)` confirms.
    """

    def __init__(self, bench: Workbench, *, debounce_s: float = 0.5, repeat_rounds: int = 2) -> None:
        import altair as alt
        import ipywidgets as W

        if debounce_s < 0 or repeat_rounds < 1:
            raise ValueError(f"debounce_s must be >= 0 and repeat_rounds >= 1, got {debounce_s}, {repeat_rounds}")
        alt.JupyterChart.enable_offline()  # bundle the Vega JS from vl-convert: no CDN needed
        self.bench = bench
        self.debounce_s = debounce_s
        self.repeat_rounds = repeat_rounds
        self.last_repeat: dict[str, Any] | None = None  # the latest "repeat to confirm" outcome
        self._device = bench.device.type
        self._has_conv = bench.workload.has_conv

        # ---- controls: one widget per knob, description = knob name --------------------------
        self.controls: dict[str, Any] = self._make_controls(W, bench.defaults)
        self.block_boxes: dict[str, Any] = {
            name: W.Checkbox(value=name in bench.defaults.checkpoint, description=f"{name} · {n:,} params",
                             indent=False, tooltip=f"checkpoint block {name} ({n:,} parameters)")
            for name, n in bench.block_params.items()
        }
        for w in [*self.controls.values(), *self.block_boxes.values()]:
            w.observe(self._on_change, names="value")
        self.run_button = W.Button(description="Run", icon="play", tooltip="measure the current knobs now")
        self.stop_button = W.Button(description="Stop", icon="stop", button_style="danger",
                                    tooltip="cancel the running trial at the next step (recorded as interrupted)")
        self.run_button.on_click(lambda _: self._on_change(force=True))
        self.stop_button.on_click(lambda _: self.stop())

        # ---- progress and status ---------------------------------------------------------------
        self.progress = W.IntProgress(value=0, min=0, max=1, description="trial",
                                      layout=W.Layout(width="320px"))
        self.rate = W.Label("")
        self.status = W.HTML(_status_html("idle", "Change a knob to run a measured trial, or press Run."))

        # ---- chart and table -------------------------------------------------------------------
        from .charts import comparison_chart

        self._comparison_chart = comparison_chart
        self.chart = alt.JupyterChart(comparison_chart(bench.results), embed_options={"renderer": "svg"})
        self.trial_pick = W.Dropdown(description="trial", options=[], layout=W.Layout(width="360px"))
        self.baseline_button = W.Button(description="set as baseline", icon="flag")
        self.repeat_button = W.Button(description="repeat to confirm", icon="refresh",
                                      tooltip=f"re-run this trial and the baseline in {repeat_rounds} alternating rounds")
        self.baseline_button.on_click(lambda _: self._set_baseline())
        self.repeat_button.on_click(lambda _: self.repeat(self.trial_pick.value))
        self.verdict = W.HTML("")
        self.table = W.HTML("")
        self.widget = W.VBox([
            W.HTML(f"<b>Tuning Workbench</b> · {bench.name} on {bench.device} · each change runs "
                   f"{bench.warmup_steps} warm-up + {bench.steps} measured steps"),
            self._layout_controls(W),
            W.HBox([self.run_button, self.stop_button, self.progress, self.rate]),
            self.status,
            self.chart,
            W.HBox([self.trial_pick, self.baseline_button, self.repeat_button]),
            self.verdict,
            self.table,
        ])
        self.widget.add_class("wb-panel")
        self.run_button.add_class("wb-run")
        self.stop_button.add_class("wb-stop")
        self.chart.add_class("wb-chart")

        # ---- the worker thread and the observer --------------------------------------------
        self._cv = threading.Condition()
        self._job: tuple[str, Any, bool] | None = None  # (kind, payload, force) waiting to run
        self._due = 0.0  # monotonic time the queued job may start (debounce)
        self._busy = False
        self._closed = False
        self._cancel = threading.Event()
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
        self._thread = threading.Thread(target=self._worker, name="workbench-panel", daemon=True)
        self._thread.start()

    # ---- building ------------------------------------------------------------------------------
    def _make_controls(self, W: Any, k: Knobs) -> dict[str, Any]:
        cores = os.cpu_count() or 1
        spec = self.bench.workload.spec
        max_batch = len(spec) if not spec.iterable else 1 << 16
        style = {"description_width": "130px"}
        lay = W.Layout(width="290px")

        def dropdown(name: str, options: list[Any], value: Any) -> Any:
            value = DEFAULT if value is None else value  # a Dropdown shows value None as "nothing selected"
            options = [o if isinstance(o, tuple) else (str(o), o) for o in options]  # all (label, value)
            if value not in [v for _, v in options]:
                options.append((str(value), value))
            return W.Dropdown(description=name, options=options, value=value, style=style, layout=lay)

        def checkbox(name: str) -> Any:
            return W.Checkbox(description=name, value=getattr(k, name), indent=False, layout=lay)

        c = {
            "data": dropdown("data", list(DATA_MODES), k.data),
            "batch_size": W.BoundedIntText(description="batch_size", value=k.batch_size, min=1,
                                           max=max(max_batch, k.batch_size), style=style, layout=lay),
            "num_workers": W.IntSlider(description="num_workers", value=k.num_workers, min=0,
                                       max=max(4, 2 * cores, k.num_workers), continuous_update=False,
                                       style=style, layout=lay),
            "pin_memory": checkbox("pin_memory"),
            "persistent_workers": checkbox("persistent_workers"),
            "prefetch_factor": dropdown("prefetch_factor", [("default (2)", DEFAULT), 1, 2, 4, 8], k.prefetch_factor),
            "amp": dropdown("amp", list(AMP_MODES), k.amp),
            "compile": dropdown("compile", list(COMPILE_MODES), k.compile),
            "matmul_precision": dropdown("matmul_precision", list(MATMUL_PRECISIONS), k.matmul_precision),
            "channels_last": checkbox("channels_last"),
            "accum_steps": W.BoundedIntText(description="accum_steps", value=k.accum_steps, min=1,
                                            max=max(1024, k.accum_steps), style=style, layout=lay),
            "cpu_threads": dropdown("cpu_threads", [("default", DEFAULT), *range(1, cores + 1)], k.cpu_threads),
            "world_size": dropdown("world_size", sorted({1, 2, 4, k.world_size}), k.world_size),
            "ddp_no_sync": checkbox("ddp_no_sync"),
            "ddp_bucket_cap_mb": dropdown("ddp_bucket_cap_mb", [("default (25)", DEFAULT), 1, 5, 25, 100],
                                          k.ddp_bucket_cap_mb),
            "ddp_comm_hook": dropdown("ddp_comm_hook", list(COMM_HOOKS), k.ddp_comm_hook),
            "ddp_gradient_as_bucket_view": checkbox("ddp_gradient_as_bucket_view"),
            "ddp_static_graph": checkbox("ddp_static_graph"),
            "ddp_find_unused_parameters": checkbox("ddp_find_unused_parameters"),
            "ddp_broadcast_buffers": checkbox("ddp_broadcast_buffers"),
        }
        for name, w in c.items():
            w.tooltip = HELP[name]
            w.add_class(f"wb-knob-{name}")  # stable hooks for browser tests and custom CSS
        return c

    def _layout_controls(self, W: Any) -> Any:
        columns = []
        for title, names in GROUPS.items():
            items: list[Any] = [W.HTML(f"<b>{title}</b>")]
            for name in names:
                if name == "checkpoint":
                    boxes = list(self.block_boxes.values()) or [W.HTML("<i>no blocks found</i>")]
                    items += [W.HTML("checkpoint <small>(per block)</small>", tooltip=HELP["checkpoint"]),
                              W.VBox(boxes, layout=W.Layout(max_height="160px", overflow="auto"))]
                else:
                    items.append(self.controls[name])
            columns.append(W.VBox(items))
        return W.GridBox(columns, layout=W.Layout(grid_template_columns="repeat(auto-fit, minmax(300px, 1fr))",
                                                  grid_gap="4px 12px"))

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    # ---- reading the controls ----------------------------------------------------------------
    def knobs(self) -> Knobs:
        """The Knobs the controls describe; knobs that cannot apply here are disabled and left off."""
        k = Knobs(batch_size=self.controls["batch_size"].value)
        for name in ORDER:
            if name == "checkpoint":
                k = k.replace(checkpoint=tuple(n for n, box in self.block_boxes.items() if box.value))
                continue
            w = self.controls[name]
            reason = self._blocked(name, k)
            w.disabled = reason is not None
            w.tooltip = f"disabled: {reason}" if reason else HELP[name]
            if reason is None:
                k = k.replace(**{name: None if w.value == DEFAULT else w.value})
        return k

    def _blocked(self, name: str, k: Knobs) -> str | None:
        """Why `name` cannot take effect given the knobs before it (device, other knobs), or None."""
        if name.startswith("ddp_") and k.world_size == 1:
            return "DDP knobs act with world_size > 1 (one process runs without DDP)"
        if name not in PROBES:
            return None
        try:
            trial = k.replace(**{name: PROBES[name]})
        except ValueError as e:
            return str(e)
        before = set(device_notes(k, self._device, has_conv=self._has_conv))
        for note in device_notes(trial, self._device, has_conv=self._has_conv):
            if note not in before and note.startswith(name) and "no-op" in note:
                return note
        return None

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
        self._queue(("knobs", knobs, force), debounce)
        self._set_status("queued", f"queued: {knobs.label(self._base_knobs())}")

    def repeat(self, trial_id: int | None) -> None:
        """Queue "repeat to confirm": the trial's knobs and the baseline's, alternating rounds."""
        if trial_id is None:
            self._set_status("error", "pick a trial first")
            return
        self._queue(("repeat", trial_id, True), debounce=False)

    def stop(self) -> None:
        """Cancel the running trial at its next step boundary and drop any queued job."""
        with self._cv:
            self._job = None
            if self._busy:
                self._cancel.set()
            self._cv.notify_all()
        self._set_status("stopping" if self._busy else "idle", "stopping at the next step…" if self._busy else "idle")

    def wait(self, timeout: float | None = None) -> bool:
        """Block until no trial is queued or running; False if `timeout` seconds passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while self._job is not None or self._busy:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cv.wait(left)
        return True

    @property
    def busy(self) -> bool:
        """True while a trial (or a repeat) runs or waits in the queue."""
        return self._busy or self._job is not None

    def _queue(self, job: tuple[str, Any, bool], debounce: bool) -> None:
        with self._cv:
            self._job = job  # latest wins: a queued job is replaced, never stacked
            self._due = time.monotonic() + (self.debounce_s if debounce else 0.0)
            self._cv.notify_all()

    def _worker(self) -> None:
        while True:
            with self._cv:
                while not self._closed and (self._job is None or time.monotonic() < self._due):
                    self._cv.wait(None if self._job is None else max(0.0, self._due - time.monotonic()))
                if self._closed:
                    return
                (kind, payload, force), self._job = self._job, None
                self._cancel.clear()
                self._busy = True
            try:
                if kind == "knobs":
                    if force or payload != self._last_knobs:
                        self._run_one(payload)
                    else:
                        self._set_status("idle", "no change: these knobs were just measured (press Run to re-measure)")
                else:
                    self._repeat(payload)
            except Exception as e:  # the panel must survive anything; the message, not a traceback
                self._set_status("error", f"{type(e).__name__}: {e}")
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()

    def _run_one(self, knobs: Knobs, what: str = "") -> TrialResult | None:
        """One trial through `bench.run` (blocking, in the worker thread)."""
        self._last_knobs = knobs
        self._measure_start = None
        self.progress.value, self.progress.bar_style = 0, "info"
        self.rate.value = ""
        label = knobs.label(self._base_knobs())
        self._set_status("starting", f"{what}starting: {label}")
        try:
            result = self.bench.run(knobs, progress=self._progress, cancel=self._cancel)
        except (ValueError, TypeError) as e:  # knobs the workload cannot take (unknown block, batch too big)
            self._set_status("error", f"not run: {e}")
            return None
        self.progress.bar_style = "success" if result.ok else "danger"
        self._set_status(result.status, what + _result_line(result, self.bench))
        return result

    def _progress(self, phase: str, done: int, total: int) -> None:
        """`bench.run`'s progress callback: (phase, steps done, steps total); runs in the worker."""
        now = time.monotonic()
        if phase == "done":  # run_trial's final report, also after a failure: keep the bar where it stopped
            self._set_status(phase, PHASES[phase])
            return
        self.progress.max, self.progress.value = max(1, total), done
        if phase == "measuring":
            if self._measure_start is None:
                self._measure_start = (now, done)
            t0, d0 = self._measure_start
            if done > d0 and now > t0:
                self.rate.value = f"{done}/{total} steps · {(done - d0) / (now - t0):.1f} steps/s"
        else:
            self.rate.value = f"{done}/{total} steps"
        self._set_status(phase, PHASES.get(phase, phase))

    def _repeat(self, trial_id: int) -> None:
        """Re-run the trial's knobs and the baseline's in alternating rounds (A B, B A, ...); verdict."""
        base, pick = self.bench.baseline, self.bench.log.get(trial_id)
        if base is None or base.trial_id == pick.trial_id:
            self._set_status("error", "repeat needs a baseline and a different trial: set a baseline first")
            return
        runs: dict[str, list[TrialResult]] = {"base": [], "pick": []}
        for i in range(self.repeat_rounds):
            order = [("base", base.knobs), ("pick", pick.knobs)]
            for which, knobs in order if i % 2 == 0 else order[::-1]:
                if self._cancel.is_set():
                    return
                r = self._run_one(knobs, what=f"repeat {i + 1}/{self.repeat_rounds} ({which}): ")
                if r is None or not r.ok:
                    return
                runs[which].append(r)
        rounds = [self.bench.compare(a, b) for a, b in zip(runs["base"], runs["pick"])]
        pooled = compare(_pooled(runs["base"], base.trial_id), _pooled(runs["pick"], pick.trial_id))
        self.last_repeat = {"trial_id": trial_id, "baseline_id": base.trial_id, "rounds": rounds, "pooled": pooled,
                            "confirmed": _confirmed(rounds, pooled)}
        self.verdict.value = _repeat_html(self.last_repeat)
        self._set_status("ok", f"repeat done: {self.last_repeat['confirmed']}")

    # ---- drawing -----------------------------------------------------------------------------
    def _on_trial(self, result: TrialResult) -> None:
        """ResultLog observer (new trial or new baseline): redraw; never break the caller's run."""
        try:
            self.redraw()
        except Exception as e:
            self._set_status("error", f"could not redraw the chart: {type(e).__name__}: {e}")

    def redraw(self) -> None:
        """Chart, table and trial picker from `bench.results` (what is in the log right now)."""
        with self._draw_lock:
            df = self.bench.results
            self.chart.chart = self._comparison_chart(df)  # a new chart: the JupyterChart redraws
            self.table.value = _table_html(df)
            picked = self.trial_pick.value
            options = [(f"#{r.trial_id} {r.label} ({r.status})", int(r.trial_id)) for r in df.iloc[::-1].itertuples()]
            self.trial_pick.options = options
            ids = [v for _, v in options]
            self.trial_pick.value = picked if picked in ids else (ids[0] if ids else None)

    def _set_baseline(self) -> None:
        try:
            self.bench.set_baseline(self.trial_pick.value)
        except (ValueError, TypeError) as e:
            self._set_status("error", str(e))

    def _set_status(self, phase: str, text: str) -> None:
        self.status.value = _status_html(phase, text)

    def _base_knobs(self) -> Knobs | None:
        base = self.bench.baseline
        return base.knobs if base is not None else None

    # ---- lifecycle ---------------------------------------------------------------------------
    def detach(self) -> None:
        """Stop the worker thread and stop listening to the log (the widgets stay as they are)."""
        self.bench.log.unobserve(self._on_trial)
        with self._cv:
            self._closed = True
            self._job = None
            self._cancel.set()
            self._cv.notify_all()

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


# ---- text helpers (pure) -------------------------------------------------------------------------
def _status_html(phase: str, text: str) -> str:
    """The status line; `data-phase` lets browser tests see what the panel is doing."""
    color = STATUS_COLORS.get(phase, "#455a64")
    safe = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return f'<span class="wb-status" data-phase="{phase}" style="color:{color}">{safe}</span>'


def _result_line(r: TrialResult, bench: Workbench) -> str:
    """One line about a finished trial: throughput and verdict, or the failure's message."""
    head = f"#{r.trial_id} {r.knobs.label(bench.baseline.knobs if bench.baseline else None)}"
    if not r.ok:
        return f"{head}: {r.status.upper()}: {r.message}"
    line = f"{head}: {r.samples_per_s:,.1f} samples/s"
    base = bench.baseline
    if base is not None and base.trial_id != r.trial_id and len(r.step_times_s) >= 2:
        line += f", {r.samples_per_s / base.samples_per_s:.2f}× baseline ({compare(base, r).verdict})"
    if r.notes:
        line += " · " + "; ".join(r.notes)
    return line


def _table_html(df: pd.DataFrame) -> str:
    """The results table, newest first, status coloured (pandas Styler → HTML)."""
    if df.empty:
        return "<i>No trials yet.</i>"
    view = df[[c for c in TABLE_COLUMNS if c in df.columns]].iloc[::-1]
    styler = (view.style
              .format({"samples_per_s": "{:,.1f}", "speedup": "{:.2f}×", "step_time_ms": "{:.2f}",
                       "data_wait_share": "{:.0%}", "peak_memory_mb": "{:,.1f}", "final_loss": "{:.4f}"},
                      na_rep="–")
              .map(lambda s: f"color:{STATUS_COLORS.get(s, '#000')};font-weight:bold", subset=["status"])
              .hide(axis="index")
              .set_table_styles([{"selector": "th, td", "props": "white-space: nowrap; padding: 1px 8px; font-size: 12px"}])
              .set_table_attributes('class="wb-results"'))
    return f'<div style="max-height:320px;overflow:auto">{styler.to_html()}</div>'


def _pooled(results: list[TrialResult], trial_id: int | None) -> TrialResult:
    """Several runs of the same knobs as one, their step times pooled (for one overall verdict)."""
    times = tuple(t for r in results for t in r.step_times_s)
    return dataclasses.replace(results[0], step_times_s=times, trial_id=trial_id)


def _confirmed(rounds: list[Comparison], pooled: Comparison) -> str:
    """A paired verdict: every round beyond noise in the same direction as the pooled result."""
    if pooled.beyond_noise and all(c.beyond_noise and (c.speedup > 1) == (pooled.speedup > 1) for c in rounds):
        return f"confirmed {'faster' if pooled.speedup > 1 else 'slower'} ({(pooled.speedup - 1) * 100:+.1f}%)"
    return f"not confirmed: the difference does not hold up beyond noise in every round ({(pooled.speedup - 1) * 100:+.1f}% pooled)"


def _repeat_html(rep: dict[str, Any]) -> str:
    rows = "".join(f"<li>round {i + 1}: {c}</li>" for i, c in enumerate(rep["rounds"]))
    return (f"<b>Repeat to confirm #{rep['trial_id']} against baseline #{rep['baseline_id']}:</b> "
            f"{rep['confirmed']}<ul>{rows}<li>pooled: {rep['pooled']}</li></ul>")
