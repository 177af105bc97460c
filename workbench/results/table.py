"""The results table: `ResultLog.frame()` kept up to date as trials arrive.

Each trial's fixed columns are built once; labels and speedups are per baseline; the verdicts
("faster", "slower", "same", "undecided"; "baseline" for the baseline) are re-judged, when the noise changes, in one
vectorised pass of `stats.one_look` (the rule `stats.decide` and `compare` use) over running sums
per configuration.
"""

from __future__ import annotations

import bisect
import math
import threading
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from ..core.knobs import BLOCK_KNOBS, KNOBS, Knobs
from ..core.measure import STATUSES, TrialResult
from .comparison import Basis, NoiseTracker, Trials, judged_on, rates, real_run, usable
from .stats import Noise, critical, one_look

# The columns a reader wants first; knobs and details follow.
SUMMARY_COLUMNS = [
    "trial_id", "label", "baseline", "status", "samples_per_s", "tokens_per_s", "padding_share", "speedup", "verdict",
    "steady", "window", "step_time_ms",
    "step_time_iqr_ms", "data_wait_share", "peak_memory_mb", "model_state_mb", "startup_s", "compile_s",
    "shapes", "shape_warmup_s", "final_loss", "message",
]
# None = torch's default: nullable Int64 columns (every optional int knob in the registry)
OPTIONAL_INT_KNOBS = tuple(n for n, s in KNOBS.items() if s.kind == "int" and s.optional)


def _ms(s: float | None) -> float | None:
    return None if s is None else s * 1e3


def _window(r: TrialResult) -> str:
    """"5/30" for a trial stopped early (5 of 30 measured steps, earlystop.py), else empty."""
    stopped = r.extra.get("stopped_early") if isinstance(r.extra, dict) else None
    return f"{stopped.get('steps')}/{stopped.get('of')}" if isinstance(stopped, dict) else ""


def _sides(trials: Sequence[TrialResult], base: TrialResult, r: TrialResult) -> tuple[Trials, Trials]:
    """The table's evidence for trial r: the baseline's repeats and r's repeats up to r (r alone when it
    repeats the baseline's knobs: a repeat is judged as one more identical trial)."""
    if r.knobs == base.knobs:
        return base, r
    upto = [t for t in trials if usable(t) and (t.trial_id or 0) <= max(r.trial_id or 0, base.trial_id or 0)]
    return ([t for t in upto if t.knobs == base.knobs] or [base],
            [t for t in upto if t.knobs == r.knobs and (t.trial_id or 0) <= (r.trial_id or 0)] or [r])


def static_frame(trials: Sequence[TrialResult]) -> pd.DataFrame:
    """The columns of these trials' rows that depend on nothing else (no baseline, no noise)."""
    rows = []
    for r in trials:
        row = {
            "trial_id": r.trial_id, "label": "", "baseline": False, "status": r.status, "samples_per_s": r.samples_per_s,
            "tokens_per_s": r.tokens_per_s, "padding_share": r.padding_share,  # token batches only (else empty)
            "speedup": None, "verdict": "", "steady": r.steady, "window": _window(r),
            "step_time_ms": _ms(r.step_time_s),
            "step_time_iqr_ms": _ms(r.step_time_iqr_s), "source": "real run" if real_run(r) else "trial",
            "data_wait_share": r.data_wait_share,
            "copy_share": r.copy_share,  # the host->device copy's part of data_wait_share
            "peak_memory_mb": r.peak_memory_bytes / 1e6 if r.peak_memory_bytes is not None else None,
            "model_state_mb": r.model_state_bytes / 1e6 if r.model_state_bytes is not None else None,
            "startup_s": r.startup_s, "compile_s": r.compile_s,
            "shapes": r.shapes, "shape_warmup_s": r.shape_warmup_s,  # input shapes, their first calls' cost
            "final_loss": next((x for x in reversed(r.losses) if math.isfinite(x)), None),
            "message": r.message, "samples_per_s_low": None, "samples_per_s_high": None,
        }
        row.update(r.knobs.to_dict())
        row.update((name, ",".join(getattr(r.knobs, name))) for name in BLOCK_KNOBS)
        row["notes"] = "; ".join(r.notes)
        row["device"] = r.env.get("device", "")
        job = r.extra.get("job") if isinstance(r.extra, dict) else None
        row["job"] = str(job.get("id") or "") if isinstance(job, dict) else ""  # the scheduler's job id (cluster.py)
        row["node"] = r.env.get("host", "")
        row["queue_s"] = job.get("queue_s") if isinstance(job, dict) else None  # waited in the queue (not measured)
        row["process_mode"] = r.env.get("allocator", "")  # the allocator its process ran in, read back
        row["ran_in"] = r.env.get("ran_in", "")  # worker, job, kernel or kernel thread (measure.ran_in)
        row["participant"] = r.participant
        model = r.extra.get("model") if isinstance(r.extra, dict) else None  # its model's fingerprint (models.py)
        row["model"] = model if isinstance(model, str) else ""
        row["trace_path"] = r.trace_path
        row["started_at"] = r.started_at
        rows.append(row)
    df = pd.DataFrame(rows)
    for col in ("speedup", "samples_per_s_low", "samples_per_s_high", "queue_s"):
        df[col] = df[col].astype(float)
    df["shapes"] = df["shapes"].astype("Int64")  # empty for trials recorded before shapes were counted
    df["shape_warmup_s"] = df["shape_warmup_s"].astype(float)
    for col in OPTIONAL_INT_KNOBS:
        if col in df:
            df[col] = df[col].astype("Int64")
    df["status"] = pd.Categorical(df["status"], categories=list(STATUSES))
    df["started_at"] = pd.to_datetime(df["started_at"].replace("", None), errors="coerce")
    return df


def mode_differs(df: pd.DataFrame, base: TrialResult | None) -> pd.Series:
    """True on rows whose process ran in another allocator mode than the baseline's (both recorded):
    their speedup mixes the process with the knobs (docs/measurement.md 'The process is a knob')."""
    mode = (base.env.get("allocator") or "") if base is not None else ""
    if "process_mode" not in df or not mode:
        return pd.Series(False, index=df.index)
    return (df["process_mode"].fillna("") != "") & (df["process_mode"] != mode)


class Table:
    """`ResultLog.frame()` kept up to date: each trial's fixed columns built once; labels and
    speedups per baseline; verdicts re-judged when the noise changes in one vectorised pass of
    `stats.one_look` (decide()'s rule itself) over running sums per configuration. A test holds every
    verdict equal to `compare`."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.trials: list[TrialResult] = []
        self.static: pd.DataFrame | None = None
        self.noise_tracker = NoiseTracker()  # the noise evidence, updated per trial (no recount of the log)
        self.base_key: tuple[Any, ...] | None = None
        self.judged_noise: Noise | None = None
        self.labels: list[str] = []
        self.speedups: list[float | None] = []
        self.verdicts: list[str] = []
        self.label_of: dict[int, str] = {}  # id(knobs) -> label against `defaults`
        self.defaults: Knobs | None = None  # what the labels name differences from (a workbench's defaults)
        # per row: ((knobs, repeats), (knobs, repeats), what it is judged on) of its comparison, or None
        self.sides: list[Any] = []
        self.ids: dict[Knobs, list[int]] = {}  # usable trials' ids per knobs, in log order
        self.runs: dict[Knobs, list[TrialResult]] = {}  # those trials
        self.by_id: dict[int, TrialResult] = {}
        self.judged: list[str] = []  # per row: the figure its verdict is judged on ("" without a verdict)
        # running sums per (knobs, figure) (_cum)
        self.cums: dict[tuple[Knobs, str], tuple[np.ndarray, np.ndarray, float]] = {}

    def sync(self, trials: list[TrialResult]) -> Table:
        """Take in the trials appended to a log's `trials` since the last call (all of them if it changed)."""
        with self.lock:
            n = len(self.trials)
            if n > len(trials) or any(a is not b for a, b in zip(self.trials, trials)):
                self.__init__()  # trials were replaced or removed: start over
                n = 0
            new = trials[n:]
            if new:
                self.trials.extend(new)
                for r in new:
                    self.noise_tracker.add(r)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", FutureWarning)  # all-NA columns in a small part
                    part = static_frame(new)
                    self.static = part if self.static is None else pd.concat([self.static, part], ignore_index=True)
            return self

    def noise(self) -> Noise:
        """Between-trial noise of the trials taken in (repeats of identical knobs and back-to-back pairs):
        `comparison.NoiseTracker`, the estimator `noise_of` uses, updated as each trial arrived."""
        return self.noise_tracker.noise()

    def frame(self, base: TrialResult | None, noise: Noise, defaults: Knobs | None = None) -> pd.DataFrame:
        """The table against baseline `base` under `noise`, labels naming what differs from `defaults`
        (see `ResultLog.frame`)."""
        with self.lock:
            if self.static is None:
                df = pd.DataFrame(columns=SUMMARY_COLUMNS)
                df["status"] = pd.Categorical(df["status"], categories=list(STATUSES))
                df["baseline"] = df["baseline"].astype(bool)
                df.attrs["noise"] = noise
                return df
            if defaults != self.defaults:  # labels name differences from the defaults: all of them again
                self.defaults, self.label_of, self.base_key = defaults, {}, ("defaults changed",)
            self._judge(base, noise)
            df = self.static.copy()
            df["label"] = self.labels
            df["baseline"] = (df["trial_id"] == base.trial_id) if base is not None else False
            df["speedup"] = np.array([np.nan if v is None else v for v in self.speedups], dtype=float)
            df["verdict"] = self.verdicts
            df["judged_on"] = self.judged
        df["mode_differs"] = mode_differs(df, base)
        band = math.exp(critical(noise.df) * noise.sigma)
        rate = df["samples_per_s"].astype(float)
        rate = rate.where(rate > 0)
        df["samples_per_s_low"], df["samples_per_s_high"] = rate / band, rate * band
        df.attrs["noise"] = noise
        return df

    def _judge(self, base: TrialResult | None, noise: Noise) -> None:
        """Labels, speedups and verdicts for every trial against `base` under `noise` (see _sides)."""
        key = None if base is None else (base.trial_id, base.knobs, base.samples_per_s)
        if key != self.base_key:
            self.base_key, self.judged_noise = key, None
            self.labels, self.speedups, self.verdicts, self.label_of, self.sides = [], [], [], {}, []
            self.ids, self.runs, self.cums, self.by_id, self.judged = {}, {}, {}, {}, []
        start = len(self.labels)
        comparable = base is not None and usable(base)
        new = self.trials[start:]
        count = []  # each new trial's place among its knobs' repeats (1 = the first)
        for r in new:  # first every repeat, so a row before the baseline sees the baseline's earlier repeats
            if usable(r) and not real_run(r):  # a real run is no repeat of a trial: compare(trial, run) judges it
                self.ids.setdefault(r.knobs, []).append(r.trial_id or 0)
                self.runs.setdefault(r.knobs, []).append(r)
                self.by_id[r.trial_id or 0] = r
            count.append(len(self.ids.get(r.knobs, ())))
        for r, n in zip(new, count):
            label = self.label_of.get(id(r.knobs))
            if label is None:  # repeats share one Knobs object (the reader caches them)
                label = self.label_of[id(r.knobs)] = r.knobs.label(self.defaults)
            self.labels.append(label)
            speedup, verdict, sides, judged = None, "", None, ""
            if comparable and usable(r) and real_run(r):
                speedup = float(r.samples_per_s or 0.0) / float(base.samples_per_s or 1.0)
            elif comparable and usable(r):
                if r.trial_id == base.trial_id:
                    speedup, verdict = 1.0, "baseline"
                else:
                    sides = self._sides_of(base, r, n)
                    judged = sides[2].rate
                    speedup, verdict = math.exp(self._mean(sides[1], judged) - self._mean(sides[0], judged)), "?"
            self.speedups.append(speedup)
            self.verdicts.append(verdict)
            self.sides.append(sides)
            self.judged.append(judged)
        if noise != self.judged_noise:  # every verdict again, else only the new trials'
            self.judged_noise, start = noise, 0
        todo = [i for i in range(start, len(self.verdicts)) if self.sides[i] is not None]
        if todo:
            self._verdicts(noise, todo)

    def _sides_of(self, base: TrialResult, r: TrialResult,
                  n: int) -> tuple[tuple[Knobs, int], tuple[Knobs, int], Basis]:
        """`_sides(trials, base, r)` as (knobs, how many of its repeats) for each side: prefixes of the
        per-knobs lists, since a side is every usable repeat up to a trial id (`n`: r's place in its list);
        then what the pair is judged on (`comparison.judged_on`, as compare asks it: the figure, the margin)."""
        if r.knobs == base.knobs:  # a repeat of the baseline's knobs: one trial each, by id
            a, b = (base.knobs, -(base.trial_id or 0)), (r.knobs, -(r.trial_id or 0))
        else:
            upto = max(r.trial_id or 0, base.trial_id or 0)
            na = bisect.bisect_right(self.ids.get(base.knobs, []), upto)
            a, b = (base.knobs, na or -(base.trial_id or 0)), (r.knobs, n)
        return a, b, judged_on(self._runs(a), self._runs(b))

    def _runs(self, side: tuple[Knobs, int]) -> list[TrialResult]:
        """A side's trials: the first n repeats of its knobs, or one trial by id (n < 0)."""
        knobs, n = side
        return [self.by_id[-n]] if n < 0 else self.runs[knobs][:n]

    def _cum(self, knobs: Knobs, rate: str) -> tuple[np.ndarray, np.ndarray, float]:
        """Running sums of log `rate` (shifted by the first, against cancellation) of knobs' repeats."""
        runs = self.runs[knobs]
        got = self.cums.get((knobs, rate))
        if got is None or len(got[0]) != len(runs):
            x = np.log(np.asarray(rates(runs, rate), dtype=float))
            got = self.cums[(knobs, rate)] = (np.cumsum(x - x[0]), np.cumsum((x - x[0]) ** 2), float(x[0]))
        return got

    def _moments(self, side: tuple[Knobs, int], rate: str) -> tuple[int, float, float]:
        """(n, mean, sum of squared deviations) of a side's log `rate`: what decide() computes."""
        knobs, n = side
        if n < 0:  # one trial, by id
            return 1, math.log(rates([self.by_id[-n]], rate)[0]), 0.0
        s1, s2, x0 = self._cum(knobs, rate)
        t1, t2 = float(s1[n - 1]), float(s2[n - 1])
        return n, x0 + t1 / n, max(0.0, t2 - t1 * t1 / n)

    def _mean(self, side: tuple[Knobs, int], rate: str) -> float:
        return self._moments(side, rate)[1]

    def _verdicts(self, noise: Noise, todo: list[int]) -> None:
        """The verdict of each row in `todo` by `stats.one_look`, decide()'s rule itself, on every row at
        once from running sums, so a new noise costs one vectorised pass, not n decide() calls.
        tests/test_table.py holds every verdict equal to compare(*_sides(...))."""
        rows = [self.sides[i] for i in todo]
        m = np.array([(*self._moments(a, basis.rate), *self._moments(b, basis.rate)) for a, b, basis in rows],
                     dtype=float)
        margins = np.array([basis.margin for _, _, basis in rows], dtype=float)
        for i, w in zip(todo, one_look(*m.T, noise, margin=margins).verdicts):
            self.verdicts[i] = w
