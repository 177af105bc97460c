"""Workshops: many learners run the same trials on their own machines; the instructor gathers them.

    # each learner (notebook 08)
    bench = wb.demo("jpeg", log="/shared/workshop", participant="ana")
    for knobs in workshop.TRIALS: bench.run(**knobs)      # the prescribed trials

    # the instructor (notebook 09)
    ws = wb.gather("/shared/workshop")
    ws.results          # one row per trial: participant, machine, torch, knobs, speedup, verdict
    ws.summary()        # per knob: on how many machines it was faster / same / slower / undecided, median speedup
    ws.chart()          # the same knob's speedup on every machine, side by side, with its interval
    ws.watch()          # re-read the folder every few seconds as learners add trials

Each learner appends to a file of their own (`<folder>/<participant>/<workbench name>.jsonl`), so
no two machines ever write one file and a network share needs no working file locks; within one
file, appends are locked (see `ResultLog`). Gathering only reads: a truncated or foreign file is
skipped with a warning, never repaired or deleted.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import stat
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..core.knobs import Knobs
from ..core.measure import TrialResult
from ..deciding.rounds import compare
from ..results.comparison import noise_of
from ..results.log import Unreadable, read_appended
from ..results.records import bad_lines_text
from ..results.rules import ANSWERS
from .display import VERDICT_COLORS
from .learners import TRIALS, SimulatedLearners, learner_session, simulate_learners

# The columns an instructor reads first; knobs and details follow.
RESULT_COLUMNS = [
    "uid", "participant", "workload", "trial_id", "label", "status", "samples_per_s", "speedup",
    "speedup_low", "speedup_high", "verdict", "machine", "cpu_model", "cpu_count", "gpu_name",
    "device", "torch",
]
# faster / same / slower / undecided: how many machines gave each answer of `compare` (an undecided machine
# is not a "same": its evidence could not tell); failed: no speedup to judge.
SUMMARY_COLUMNS = ["workload", "knob", "machines", "faster", "same", "slower", "undecided", "failed",
                   "median_speedup", "min_speedup", "max_speedup"]


MAX_GATHER_FILE_BYTES = 64 << 20  # a learner's log of a session is ~100 KB; beyond this it is not one
MAX_DEPTH = 8  # folder levels searched below the shared folder


@dataclass
class _Log:
    """One learner file as read so far: its trials, explicit baseline, and where reading stopped."""

    path: Path
    trials: list[TrialResult] = field(default_factory=list)
    baseline_id: int | None = None
    ident: tuple[int, int] = (0, 0)  # (device, inode): a replaced file is read again from the start
    offset: int = 0  # bytes read into `trials` (complete lines)
    lines: int = 0  # lines read so far (to number the bad ones)
    bad: int = 0  # unreadable lines skipped so far
    rows: list[dict[str, Any]] | None = None  # its rows in `results` (None: to be built)


def _read_into(log: _Log) -> list[str]:
    """Read what was appended to `log.path` since the last read into `log` (`read_appended`, the one log
    reader: no symbolic link followed, no FIFO blocking, a size cap); the bad lines' descriptions. An
    unfinished last line is left for the next read (a learner's write in progress) and reported."""
    got = read_appended(log.path, log.offset, log.ident, max_bytes=MAX_GATHER_FILE_BYTES, refuse_larger=True)
    if got.restarted:
        log.trials, log.baseline_id, log.offset, log.lines, log.bad = [], None, 0, 0, 0
    log.ident = got.ident
    descr = [bad_lines_text(got.bad, first_line=log.lines + 1)] if got.bad else []
    if got.tail:
        descr.append(f"last line unfinished ({len(got.tail):,} bytes; read again when it grows)")
    log.trials += got.trials
    if got.baseline_id is not None:
        log.baseline_id = got.baseline_id
    log.offset, log.lines, log.bad, log.rows = got.end, log.lines + got.lines, log.bad + len(got.bad), None
    return descr


def read_log(path: str | os.PathLike) -> tuple[list[TrialResult], int | None]:
    """Trials and the explicit baseline id of one JSONL log, read only (nothing is repaired).

    Untrusted input: a symlink, FIFO, device or over-large file raises `Unreadable` (a ValueError);
    unreadable lines are skipped with one warning naming the file and lines, never their content;
    a file with no readable trial raises ValueError (a foreign file).
    """
    log = _Log(Path(path))
    descr = _read_into(log)
    if not log.trials and (log.bad or log.baseline_id is not None):
        raise Unreadable(f"no workbench trial in it; unreadable: {'; '.join(descr)}")
    if descr:
        warnings.warn(f"{path}: skipped {'; '.join(descr)}", stacklevel=2)
    return log.trials, log.baseline_id


def machine_label(env: dict[str, Any]) -> str:
    """A short description of the machine a trial ran on: CPU model × cores, and the GPU if any."""
    cpu = env.get("cpu_model") or (env.get("device_name") if str(env.get("device", "")).startswith("cpu") else "") or "?"
    text = f"{cpu} ×{env.get('cpu_count', '?')}"
    if env.get("gpu_name"):
        text += f" + {env['gpu_name']}"
    return text


class Workshop:
    """Every learner's trials under one folder, re-read on `refresh()` (see module docstring)."""

    def __init__(self, folder: str | os.PathLike, *, pattern: str = "**/*.jsonl") -> None:
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise ValueError(f"{self.folder} is not a folder: pass the workshop's shared folder "
                             "(the `log=` the learners use)")
        self.pattern = pattern
        self.skipped: dict[str, str] = {}  # file -> why it was skipped (last refresh)
        self._stamps: dict[Path, tuple[int, int, int]] = {}
        self._logs: dict[Path, _Log] = {}
        self._results: pd.DataFrame = pd.DataFrame(columns=RESULT_COLUMNS)
        self._lock = threading.Lock()  # a watch thread and the notebook may refresh at once
        self.refresh()

    # ---- reading ------------------------------------------------------------------------------
    def refresh(self) -> bool:
        """Read what changed since the last read (appended bytes, new files); True when anything did."""
        with self._lock:
            return self._refresh()

    def _candidates(self) -> list[tuple[str, Path, os.stat_result]]:
        """(relative name, path, lstat) of every entry matching the pattern, without following links."""
        found = []
        root = str(self.folder)
        for here, dirs, files in os.walk(root, followlinks=False):
            rel_here = os.path.relpath(here, root)
            depth = 0 if rel_here == "." else rel_here.count(os.sep) + 1
            if depth >= MAX_DEPTH:
                dirs[:] = []
            for name in [*files, *dirs]:
                rel = name if rel_here == "." else f"{rel_here}/{name}".replace(os.sep, "/")
                if not (fnmatch.fnmatch(rel, self.pattern) or (self.pattern.startswith("**/")
                                                             and fnmatch.fnmatch(rel, self.pattern[3:]))):
                    continue
                path = Path(here) / name
                try:
                    found.append((rel, path, path.lstat()))
                except OSError:  # gone since the listing
                    continue
        return sorted(found)

    def _skip(self, key: str, why: str) -> None:
        if self.skipped.get(key) != why:
            warnings.warn(f"gather: skipped {self.folder / key}: {why}", stacklevel=4)
        self.skipped[key] = why

    def _refresh(self) -> bool:
        changed = False
        seen = set()
        candidates = self._candidates()
        listed = {key for key, _, _ in candidates}
        for gone in [k for k in self.skipped if k not in listed]:  # a bad file removed: no longer listed
            del self.skipped[gone]
        for key, path, st in candidates:
            if stat.S_ISDIR(st.st_mode):
                self._skip(key, "a folder, not a log file (the logs inside it are read as usual)")
                continue
            seen.add(path)
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
            if self._stamps.get(path) == stamp:
                continue
            self._stamps[path] = stamp
            changed |= self._read_file(key, path)
        for gone in set(self._logs) - seen:
            del self._logs[gone]
            changed = True
        for gone in set(self._stamps) - seen:
            del self._stamps[gone]
        if changed:
            self._results = self._frame()
        return changed

    def _read_file(self, key: str, path: Path) -> bool:
        """Read one file's new bytes; True when its rows changed. Never raises on content."""
        log = self._logs.get(path) or _Log(path)
        try:
            descr = _read_into(log)
        except (OSError, ValueError) as e:  # Unreadable: a link, FIFO, device, huge file
            self._skip(key, str(e) if isinstance(e, Unreadable) else f"cannot be read ({type(e).__name__})")
            return self._logs.pop(path, None) is not None
        if not log.trials:
            why = f"no workbench trial in it; {'; '.join(descr)}" if descr else "empty: no trial yet"
            self._skip(key, why)
            return self._logs.pop(path, None) is not None
        if descr:
            warnings.warn(f"gather: {path}: skipped {'; '.join(descr)}", stacklevel=3)
        self.skipped.pop(key, None)
        self._logs[path] = log
        return True

    @property
    def results(self) -> pd.DataFrame:
        """One row per trial of every learner: participant, machine, torch, knobs, speedup vs that
        learner's own baseline with its interval, verdict (from `compare`), status."""
        return self._results.copy()

    @property
    def participants(self) -> list[str]:
        return sorted(self._results["participant"].unique()) if len(self._results) else []

    def _frame(self) -> pd.DataFrame:
        rows = []
        for path, log in sorted(self._logs.items()):
            if log.rows is None:
                log.rows = self._rows_of(path, log)
            rows += log.rows
        if not rows:
            return pd.DataFrame(columns=RESULT_COLUMNS)
        return pd.DataFrame(rows).reset_index(drop=True)

    def _rows_of(self, path: Path, log: _Log) -> list[dict[str, Any]]:
        """The rows of one learner file (rebuilt only when that file changed)."""
        rows = []
        rel = path.relative_to(self.folder).with_suffix("").as_posix()  # e.g. "ana/demo-jpeg"
        folder_name = path.parent.name if path.parent != self.folder else "?"
        who_of = {id(r): r.participant or folder_name for r in log.trials}  # old logs: the folder names them
        bases = {who: _baseline(log, who, folder_name) for who in set(who_of.values())}
        # each learner's repeats of identical knobs, and the run-to-run noise they show
        repeats: dict[tuple[str, Knobs], list[TrialResult]] = {}
        for r in log.trials:
            if r.ok and len(r.step_times_s) >= 2:
                repeats.setdefault((who_of[id(r)], r.knobs), []).append(r)
        noise = {who: noise_of([r for r in log.trials if who_of[id(r)] == who]) for who in bases}
        for r in log.trials:
            participant = r.participant or folder_name  # logs written before participants existed
            base = bases[participant]  # each participant against their own baseline, even in a shared file
            row: dict[str, Any] = {
                "uid": f"{rel}#{r.trial_id}",  # file + id: unique, ids are unique within a file
                "participant": participant,
                "workload": path.stem,
                "trial_id": r.trial_id,
                "label": _label(r.knobs, base.knobs if base is not None else None),
                "status": r.status,
                "samples_per_s": r.samples_per_s,
                "speedup": None, "speedup_low": None, "speedup_high": None, "verdict": "",
                "machine": machine_label(r.env),
                "cpu_model": r.env.get("cpu_model") or r.env.get("device_name", ""),
                "cpu_count": r.env.get("cpu_count"),
                "gpu_name": r.env.get("gpu_name", ""),
                "device": r.env.get("device", ""),
                "torch": r.env.get("torch", ""),
            }
            if base is not None and r.trial_id == base.trial_id:
                row.update(speedup=1.0, speedup_low=1.0, speedup_high=1.0, verdict="baseline")
            elif base is not None and r.knobs == base.knobs:  # a repeat of the baseline: noise evidence
                ratio = (r.samples_per_s or 0.0) / base.samples_per_s if base.samples_per_s else None
                row.update(speedup=ratio, verdict="baseline")
            elif base is not None and r.ok and len(r.step_times_s) >= 2:
                # every repeat so far of each side, judged against this learner's own noise
                a_side = repeats.get((participant, base.knobs), [base])
                b_side = [x for x in repeats[(participant, r.knobs)] if (x.trial_id or 0) <= (r.trial_id or 0)]
                c = compare(a_side, b_side, noise=noise[participant])  # the same verdict as bench.compare
                row.update(speedup=c.speedup, speedup_low=c.low, speedup_high=c.high,
                           verdict=c.verdict)
            row.update({k: v for k, v in _knob_dict(r.knobs).items() if k not in row})
            row["checkpoint"] = ",".join(r.knobs.checkpoint)
            row["started_at"] = r.started_at
            row["message"] = r.message
            rows.append(row)
        return rows

    # ---- views --------------------------------------------------------------------------------
    def summary(self) -> pd.DataFrame:
        """Per knob change (vs each learner's baseline): on how many machines the answer was faster, same,
        slower or undecided (never counted as same), how many failed, and the median speedup.

        When a learner ran the same change twice, their latest trial counts.
        """
        df = self._results
        if df.empty:
            return pd.DataFrame(columns=SUMMARY_COLUMNS)
        df = df[df["verdict"] != "baseline"]
        rows = []
        for (workload, knob), g in df.groupby(["workload", "label"], sort=True):
            latest = g.sort_values("trial_id").groupby("participant").tail(1)
            ok = latest[latest["speedup"].notna()]
            speedup = pd.to_numeric(ok["speedup"])
            said = ok["verdict"]
            rows.append({
                "workload": workload,
                "knob": knob,
                "machines": int(latest["participant"].nunique()),
                **{answer: int((said == answer).sum()) for answer in ANSWERS},
                "failed": int(len(latest) - len(ok)),
                "median_speedup": float(np.median(speedup)) if len(speedup) else None,
                "min_speedup": float(speedup.min()) if len(speedup) else None,
                "max_speedup": float(speedup.max()) if len(speedup) else None,
            })
        return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)

    def chart(self, *, width: int = 140) -> Any:
        """One panel per knob change: each learner's speedup vs their own baseline, its 95%
        interval as a bar, coloured by verdict; the line at 1.0 is "no change"."""
        import altair as alt  # the notebook layer only; the core never needs altair

        df = self._results
        data = df[(df["verdict"] != "baseline") & df["speedup"].notna()] if len(df) else df
        if not data.empty:  # a learner's latest trial of a change carries the verdict over all its repeats
            data = data.sort_values("trial_id").groupby(["participant", "workload", "label"]).tail(1)
        if data.empty:
            return (alt.Chart(pd.DataFrame({"text": ["No compared trials yet: each learner needs a baseline "
                                                     "and at least one change"]}))
                    .mark_text(size=14, color="gray").encode(text="text:N"))
        data = data[["participant", "machine", "workload", "label", "speedup", "speedup_low",
                     "speedup_high", "verdict", "samples_per_s", "torch", "uid"]].copy()
        data["knob"] = data["workload"] + ": " + data["label"]
        data["who"] = data["participant"]
        x = alt.X("who:N", title=None, axis=alt.Axis(labelAngle=-40))
        y = alt.Y("speedup:Q", title="speedup vs own baseline", scale=alt.Scale(type="log", zero=False))
        colour = alt.Color("verdict:N", scale=alt.Scale(domain=list(ANSWERS),
                                                         range=[VERDICT_COLORS[a] for a in ANSWERS]))
        tooltip = ["participant:N", "machine:N", "knob:N", alt.Tooltip("speedup:Q", format=".2f"),
                   alt.Tooltip("speedup_low:Q", format=".2f", title="95% low"),
                   alt.Tooltip("speedup_high:Q", format=".2f", title="95% high"), "verdict:N", "torch:N"]
        bars = alt.Chart().mark_rule(strokeWidth=2).encode(x=x, y=alt.Y("speedup_low:Q"), y2="speedup_high:Q",
                                                             color=colour)
        points = alt.Chart().mark_point(filled=True, size=60).encode(x=x, y=y, color=colour, tooltip=tooltip)
        one = alt.Chart().mark_rule(color="black", strokeDash=[4, 3]).encode(y=alt.datum(1.0))
        return (alt.layer(bars, points, one, data=data)
                .properties(width=width, height=220)
                .facet(column=alt.Column("knob:N", title=None,  # one line per word: a title as wide as its panel
                                         header=alt.Header(labelLimit=width, labelExpr="split(datum.label, ' ')")))
                .properties(title="The same change on every learner's machine (bar: 95% interval)"))

    def watch(self, every_s: float = 5.0, *, callback: Callable[[Workshop], Any] | None = None,
              show: bool = True) -> Watch:
        """Re-read the folder every `every_s` seconds in a background thread.

        On a change it calls `callback(self)`; with `show=True` in a notebook it also redraws an
        output area under the cell with the summary and the chart. `.stop()` ends it.
        """
        if every_s <= 0:
            raise ValueError(f"every_s must be > 0 seconds, got {every_s}")
        return Watch(self, every_s, callback, show)

    def __repr__(self) -> str:
        df = self._results
        machines = df["machine"].nunique() if len(df) else 0
        skipped = f"; {len(self.skipped)} file(s) skipped" if self.skipped else ""
        return (f"<Workshop {str(self.folder)!r}: {len(df)} trials from {len(self.participants)} "
                f"participants on {machines} machine type(s){skipped}>")


class Watch:
    """The background refresh started by `Workshop.watch`; `stop()` ends it."""

    def __init__(self, workshop: Workshop, every_s: float, callback: Callable[[Workshop], Any] | None,
                 show: bool) -> None:
        self.workshop = workshop
        self.every_s = every_s
        self.callback = callback
        self.refreshes = 0  # how many refreshes found something new
        self.error: BaseException | None = None
        self.view = WatchView() if show and _in_kernel() else None
        self.output = self.view.widget if self.view is not None else None  # what the cell displays
        if self.view is not None:
            self.view.update(workshop)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="workbench-workshop-watch", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # skipped files are listed in `.skipped`
                    changed = self.workshop.refresh()
                if changed:
                    self.refreshes += 1
                    if self.callback is not None:
                        self.callback(self.workshop)
                    if self.view is not None:
                        self.view.update(self.workshop)
            except Exception as e:  # keep watching; the last error is kept for the instructor
                self.error = e

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.output if self.output is not None else repr(self))

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<Watch {state} every {self.every_s:g} s | {self.refreshes} refreshes with new trials>"


class WatchView:
    """One summary table and one chart, updated in place on every refresh (nothing stacks up).

    The summary is an HTML widget whose value is replaced; the chart is one altair JupyterChart
    whose `.chart` is replaced (it redraws where it is). Needs ipywidgets (and altair for the chart).
    """

    def __init__(self) -> None:
        import ipywidgets as widgets

        self.summary = widgets.HTML("")
        self.chart: Any = None  # one altair JupyterChart, made at the first update
        self.widget = widgets.VBox([self.summary])
        self.draws = 0

    def update(self, workshop: Workshop) -> None:
        """Show `workshop`'s current summary and chart in place of the previous ones."""
        self.summary.value = workshop.summary().to_html(index=False, na_rep="–", float_format="{:.2f}".format)
        try:
            chart = workshop.chart()
        except ImportError:  # no altair: the summary alone
            chart = None
        if chart is not None and self.chart is None:
            import altair as alt

            alt.JupyterChart.enable_offline()  # bundle the Vega JS from vl-convert: a classroom may have no internet
            self.chart = alt.JupyterChart(chart, embed_options={"renderer": "svg"})
            self.widget.children = (self.summary, self.chart)
        elif chart is not None:
            self.chart.chart = chart  # the same widget redraws where it is
        self.draws += 1


def _in_kernel() -> bool:
    """True under an IPython kernel with ipywidgets importable (where a widget can be shown)."""
    try:
        from IPython import get_ipython

        if get_ipython() is None or not hasattr(get_ipython(), "kernel"):
            return False
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True


@functools.lru_cache(maxsize=4096)
def _label(knobs: Knobs, base: Knobs | None) -> str:
    """`knobs.label(base)`, once per pair (a class runs the same few configurations)."""
    return knobs.label(base)


@functools.lru_cache(maxsize=4096)
def _knob_dict(knobs: Knobs) -> dict[str, Any]:
    """`knobs.to_dict()`, once per configuration (callers copy what they keep)."""
    return knobs.to_dict()


def _baseline(log: _Log, participant: str, default_name: str) -> TrialResult | None:
    """A participant's baseline in one file: the file's explicit baseline when it is theirs, else
    their first ok trial (as `ResultLog.baseline`). Several participants may share a file."""
    mine = [r for r in log.trials if (r.participant or default_name) == participant]
    explicit = next((r for r in mine if r.trial_id == log.baseline_id), None)
    return explicit or next((r for r in mine if r.ok and len(r.step_times_s) >= 2), None)


def gather(folder: str | os.PathLike, *, pattern: str = "**/*.jsonl") -> Workshop:
    """Every learner's trials under `folder` (their shared `log=`): see `Workshop`."""
    return Workshop(folder, pattern=pattern)


__all__ = ["RESULT_COLUMNS", "SUMMARY_COLUMNS", "TRIALS", "SimulatedLearners", "Unreadable", "Watch", "WatchView",
           "Workshop", "gather",
           "learner_session", "machine_label", "read_log", "simulate_learners"]
