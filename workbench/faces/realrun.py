"""The user's own training run as referee: a real fit()/train() measured with the workbench's rules,
and a trial's speed judged against it.

`RunMeter` is the framework-neutral part the Lightning and Hugging Face callbacks feed: one call when a
(micro-)batch arrives, one when it is done, one when an optimizer step ends, and one when something that is
not training starts between steps (validation, evaluation, a checkpoint save). It times every optimizer
step (the host clock on CPU; CUDA events on the model's device, read in chunks of old events and at the
run's end, so the measuring adds no sync per step), the host time between the end of one batch and the
arrival of the next (data wait: the loader, the move to the device and the framework's loop between
batches), samples (tokens for token batches) and the device's peak memory. At the end the warm-up rule of
core/steady.py runs over the recorded steps, and the steps after warm-up are the measured window of one row
in `bench.results`, marked `source="real run"`. A step that validation, evaluation or a checkpoint save
fell in is left out of the window; the row's notes give each one's runs and host seconds. Under DDP every
rank measures its own steps and `combine_ranks` makes one row on rank zero the way a trial's ranks make one
(launch/result.py): samples and tokens summed over ranks, each step's time the slowest rank's.

`compare_real(bench, a, b)` decides whether a trial's speed holds in the real run: the real run's
window is cut into windows as long as the trial's, each one repeat of its side, judged against the
trial with the log's between-trial noise (stats.decide, the one-look rule of the results table).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, replace
from typing import Any

import torch

from ..core.knobs import Knobs, traits
from ..core.measure import TrialResult, environment, now_iso, record_event
from ..core.phases import compile_cost
from ..core.steady import WarmupRule
from ..core.tokens import count
from ..core.workload import batch_size_of
from ..results.comparison import rate_for, real_run
from ..results.stats import MARGIN, Comparison, decide

CHUNK = 256  # CUDA events older than this many steps are read (long finished: no wait) and dropped
MAX_STEPS = 20_000  # steps recorded at most (a log line stays under its size limit); later steps are counted only
PAUSE = "a pause (validation, evaluation, a checkpoint save)"  # a step holding one is left out of the window (it is not training speed)
LET_GO_S = 2.0  # reduced waits this long at most for the backend's threads to drop its tensors (milliseconds, usually)
KEEP_STEPS = 4_000  # measured steps kept in the row (the latest); its figures cover the whole window


class RunMeter:
    """Per-step records of a real training run; `result()` applies the warm-up rule and makes the row."""

    def __init__(self, *, knobs: Knobs, device: torch.device, framework: str, warmup_steps: int = 5,
                 loader: Any = None, notes: list[str] | None = None) -> None:
        self.knobs, self.device, self.framework = knobs, device, framework
        self.cuda = device.type == "cuda"
        self.rule = (WarmupRule.for_loader(loader, warmup_steps, accum_steps=knobs.accum_steps) if loader is not None
                     else WarmupRule(min_steps=warmup_steps))
        self.notes = list(notes or [])
        self.times: list[float] = []  # seconds per optimizer step (CUDA: filled from events in chunks)
        self.events: list[Any] = []  # CUDA: one event per step end not yet read (the first: the start mark)
        self.waits: list[float] = []  # host seconds waiting for batches, per optimizer step
        self.samples: list[int] = []
        self.tokens: list[Any] = []  # per step: an int (host batch) or a 0-d device tensor (read at the end)
        self.losses: list[Any] = []
        self.slow: dict[int, str] = {}  # step index -> why it is known to be slow (epoch start, validation)
        self.paused: dict[str, list[float]] = {}  # what -> [runs, host seconds] of pauses between steps
        self.skipped = 0  # steps beyond MAX_STEPS: counted, not recorded
        self.started_at = now_iso()
        self.peak: int | None = None  # CUDA: the run's peak allocated bytes (the largest rank's under DDP)
        self._wait = self._samples = 0.0
        self._tokens: Any = 0
        self._last = self._ready = None  # host clock at the last step end / batch end
        self._open: tuple[str, float] | None = None  # the pause under way: (what, host clock at its start)
        self._idle: float | None = None  # host clock when the last batch or pause ended
        self._pending_event: str | None = "first step (start-up, compile)"

    def start(self) -> None:
        """The run starts: the first step's clock starts here."""
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            self._record_event()
        self._last = self._ready = self._idle = time.perf_counter()

    def mark(self, event: str) -> None:
        """The next step is known to be slow (an epoch start, a validation run before it)."""
        self._pending_event = self._pending_event or event

    def batch(self, batch: Any = None) -> None:
        """A micro-batch (or, `batch=None`, a step's batches) arrived: its host wait is the time since the
        last batch ended; a batch given is counted (samples, tokens) on the host. A pause under way ends."""
        now = time.perf_counter()
        self._close(now)
        if self._ready is not None:
            self._wait += now - self._ready
        if batch is None:
            return
        told = count(batch)
        self._samples += told.sequences if told is not None else batch_size_of(batch)
        if told is not None:
            self._tokens = self._tokens + told.tokens

    def batch_done(self, loss: Any = None) -> None:
        """A micro-batch's step ended (the next batch's wait starts now)."""
        self._ready = self._idle = time.perf_counter()
        if isinstance(loss, torch.Tensor):  # Lightning's outputs hold it detached already: no op then
            self._loss = loss.detach() if loss.requires_grad else loss

    def pause(self, what: str, *, under_way: bool = False) -> None:
        """Something that is not training (`what`: "validation", "checkpoint saving") starts now, or, with
        `under_way`, started when the last batch or pause ended (a hook that runs once the work is under way
        or done: Lightning's on_save_checkpoint, Hugging Face's on_evaluate and on_save). The step it falls in
        is left out of the measured window; its host seconds, up to `resume()`, the next pause or the next
        training batch, go to the row's notes."""
        now = time.perf_counter()
        began = self._idle if under_way and self._open is None and self._idle is not None else now
        self._close(now)
        self._open = (what, began)
        self._pending_event = PAUSE

    def resume(self) -> None:
        """The pause under way ended now (a hook that runs after the work, such as Hugging Face's on_evaluate)."""
        self._close(time.perf_counter())

    def _close(self, now: float) -> None:
        """End the pause under way (if any) at host clock `now`, adding its seconds to its kind's."""
        if self._open is None:
            return
        what, began = self._open
        runs = self.paused.setdefault(what, [0, 0.0])
        runs[0] += 1
        runs[1] += max(0.0, now - began)
        self._open, self._idle = None, now

    def step(self, samples: int | None = None, tokens: int | None = None) -> None:
        """An optimizer step ended; `samples`/`tokens` override the batches' count (a framework that hides
        its batches from callbacks)."""
        now = time.perf_counter()
        if len(self.waits) >= MAX_STEPS:
            self.skipped += 1
        else:
            if self._pending_event:
                self.slow[len(self.waits)] = self._pending_event
            self.waits.append(self._wait)
            self.samples.append(int(samples if samples is not None else self._samples))
            self.tokens.append(self._tokens if tokens is None else tokens)
            self.losses.append(getattr(self, "_loss", None))
            if self.cuda:
                self._record_event()
            else:
                self.times.append(now - self._last if self._last is not None else 0.0)
        self._pending_event, self._wait, self._samples, self._tokens = None, 0.0, 0, 0
        self._last = now

    def _record_event(self) -> None:
        self.events.append(record_event(self.device))  # on the model's device, whichever is current
        if len(self.events) > 2 * CHUNK:  # read the oldest chunk: those events finished long ago
            self._read(CHUNK)

    def _read(self, n: int) -> None:
        """Turn the first n step intervals of `events` into seconds (one sync on an already-done event)."""
        self.events[n].synchronize()
        self.times += [a.elapsed_time(b) / 1e3 for a, b in zip(self.events[:n], self.events[1:n + 1])]
        del self.events[:n]

    def _finish(self) -> None:
        """The run ended: read the last events and the peak memory, end a pause under way (the last
        validation or checkpoint, after the last step), read device token counts (one read)."""
        if self.cuda and len(self.events) > 1:
            self._read(len(self.events) - 1)
        if self.cuda and self.peak is None:
            self.peak = int(torch.cuda.max_memory_allocated(self.device))
        self._close(time.perf_counter())
        on_device = [i for i, t in enumerate(self.tokens) if isinstance(t, torch.Tensor)]
        if on_device:
            read = torch.stack([self.tokens[i].reshape(()) for i in on_device]).tolist()
            for i, v in zip(on_device, read):
                self.tokens[i] = int(v)

    def combine_ranks(self) -> TrialResult | None:
        """The run's row with every rank's steps in it, on rank zero; None on the other ranks. Counted as a
        trial's ranks are (launch/result.py): samples and tokens summed over ranks, each step's time and data
        wait the slowest rank's, peak memory the largest rank's; a step any rank paused in is left out.
        A collective: every rank calls it at the same point (the framework's train-end hook). Without a
        process group of more than one rank it is `result()`."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return self.result()
        self._finish()
        world = dist.get_world_size()
        on = self.device if dist.get_backend() == "nccl" else torch.device("cpu")  # NCCL reduces CUDA tensors
        # DDP steps in lockstep: the same count, unless a rank failed
        k = int(reduced([[len(self.times)]], [dist.ReduceOp.MIN], on)[0][0])
        paused = [float(self.slow.get(i) == PAUSE) for i in range(k)]
        slowest, summed = reduced([[*self.times[:k], *self.waits[:k], *paused, float(self.peak or 0)],
                                   [*self.samples[:k], *(int(t) for t in self.tokens[:k])]],
                                  [dist.ReduceOp.MAX, dist.ReduceOp.SUM], on)
        self.times, self.waits = slowest[:k], slowest[k:2 * k]
        self.samples, self.tokens = [int(x) for x in summed[:k]], [int(x) for x in summed[k:]]
        self.losses = self.losses[:k]
        self.slow = {**{i: w for i, w in self.slow.items() if i < k and w != PAUSE},
                     **{i: PAUSE for i in range(k) if slowest[2 * k + i]}}
        self.peak = int(slowest[-1]) if self.cuda else None
        self.notes.append(f"{world} ranks: samples and tokens summed over the ranks, each step's time and data wait "
                          "the slowest rank's (as a trial's ranks are counted); the pauses' seconds and the losses are rank zero's")
        return self.result() if dist.get_rank() == 0 else None

    def result(self) -> TrialResult:
        """The run's row: warm-up by the steady-state rule, the rest its measured window."""
        self._finish()
        n = len(self.times)
        for i in range(n):
            if self.rule.done():
                break
            self.rule.observe(self.times[i], self.waits[i], self.slow.get(i))
        warm = self.rule.steps
        window = [i for i in range(warm, n) if self.slow.get(i) != PAUSE]
        if self.paused:
            told = "; ".join(f"{what}: {int(r)} run{'s' if r != 1 else ''}, {s:.2f} s" for what, (r, s)
                             in self.paused.items())
            self.notes.append(f"left out of the window: {told} (host seconds from each start to the next "
                              f"training batch); {n - warm - len(window)} steps of the window held one")
        outcome = self.rule.outcome()
        notes = [*self.notes, *filter(None, [self.rule.note()])]  # after the window's own note
        extra = {"source": "real run", "framework": self.framework, "warmup_rule": outcome, "steps_total": n,
                 "steady": self.rule.ended == "steady",
                 "left_out": {what: {"runs": int(r), "seconds": s} for what, (r, s) in self.paused.items()}}
        base = dict(knobs=self.knobs, env=environment(self.device), started_at=self.started_at, extra=extra)
        if len(window) < 2:
            return TrialResult(status="error", message=(
                f"the run recorded {n} optimizer steps and warm-up took {warm}: no measured window; train "
                "longer (a few hundred steps) so the steps after warm-up can be measured"), notes=tuple(notes), **base)
        if self.skipped:
            notes.append(f"{self.skipped} steps after the first {MAX_STEPS} were not recorded")
        times = [self.times[i] for i in window]
        wall, samples = sum(times), sum(self.samples[i] for i in window)
        total = sum(int(self.tokens[i]) for i in window)
        losses = [x for x in (self.losses[i] for i in window[-KEEP_STEPS:]) if x is not None]
        kept = times[-KEEP_STEPS:]
        if len(kept) < len(times):
            notes.append(f"the row keeps the last {KEEP_STEPS} of {len(times)} measured steps; its samples/s, "
                         "data-wait share and tokens/s cover all of them")
        if not self.cuda:
            notes.append("peak memory: not measured in a real run on this device (the profiler's replay that "
                         "trials use would slow the run)")
        else:
            notes.append("peak memory: the run's peak, warm-up included (torch.cuda.max_memory_allocated)")
        return TrialResult(
            status="ok", samples_per_s=samples / wall if wall > 0 else None, step_times_s=tuple(kept),
            data_wait_s=tuple(self.waits[i] for i in window)[-KEEP_STEPS:],
            data_wait_share=sum(self.waits[i] for i in window) / wall if wall > 0 else None,
            peak_memory_bytes=self.peak if self.cuda else None,
            compile_s=compile_cost(self.times[:warm], times, compiles=traits(self.knobs)["compiles"]),
            samples_per_step=round(samples / len(times)),
            losses=tuple(torch.stack([x.float().reshape(()) for x in losses]).cpu().tolist()) if losses else (),
            tokens_per_s=total / wall if total and wall > 0 else None,
            notes=tuple(notes), **base)


# ---- the referee: a trial against a real run ---------------------------------------------------------
@dataclass(frozen=True)
class RunComparison(Comparison):
    """A Comparison where a side is a real run: its evidence counts the run's windows, and an undecided
    answer says what would settle it (repeats of the trial, a longer run), not more rounds."""

    runs: tuple[bool, bool] = (False, False)  # (A is a real run, B is a real run)

    def _evidence(self) -> str:
        sides = [f"{len(rates)} window{'s' if len(rates) != 1 else ''} of the real run" if run
                 else f"{len(rates)} trial{'s' if len(rates) != 1 else ''}"
                 for rates, run in zip((self.a_rates, self.b_rates), self.runs)]
        unit = ", compared in tokens/s" if self.rate == "tokens/s" else ""
        return f"{sides[0]} vs {sides[1]}{unit}"

    def _settle(self) -> str:
        return ("one trial against one run cannot settle a gap this size at this noise: repeat the trial "
                "(bench.run(trial.knobs)) so the log learns the noise, or train longer")


def reduced(rows: list[list[float]], ops: list[Any], device: torch.device) -> list[list[float]]:
    """Each row of numbers all-reduced over the ranks with its op, returned once the process group's threads have
    let go of the tensors (at most LET_GO_S). A finished collective's work still holds its tensors until the
    backend's thread drops it, and that drop takes the GIL (the tensor's Python object): when it comes after the
    interpreter began to exit, as it can after these collectives at a run's end on a busy machine, the thread
    is ended inside a destructor and the rank aborts ("terminate called without an active exception", -6)."""
    import torch.distributed as dist

    tensors = [torch.tensor(row, dtype=torch.float64, device=device) for row in rows]
    before = _refs(tensors)
    for i, op in enumerate(ops):
        dist.all_reduce(tensors[i], op=op)
    out = [t.tolist() for t in tensors]
    deadline = time.monotonic() + LET_GO_S
    while any(a > b for a, b in zip(_refs(tensors), before)) and time.monotonic() < deadline:
        time.sleep(0.001)  # the backend's thread takes the GIL to let go
    return out


def _refs(tensors: list[torch.Tensor]) -> list[int]:
    """Each tensor's count of references to its Python object (the backend's work holds one until it ends)."""
    return [sys.getrefcount(t) for t in tensors]


def windows(real: TrialResult, steps: int) -> list[tuple[float, float]]:
    """(samples/s, tokens/s) of each whole window of `steps` consecutive measured steps of a real run."""
    times = list(real.step_times_s)
    mean = sum(times) / len(times)
    out = []
    for i in range(0, len(times) - steps + 1, steps):
        chunk = sum(times[i:i + steps])
        scale = mean * steps / chunk  # this window's speed against the run's mean
        out.append(((real.samples_per_s or 0.0) * scale, (real.tokens_per_s or 0.0) * scale))
    return out


def gap_evidence(trial: TrialResult, real: TrialResult) -> str:
    """Where a real run's step time differs from a trial's: data wait and the rest, per step, and knobs."""
    dt = (real.step_time_s - trial.step_time_s) * 1e3
    wait_real = sum(real.data_wait_s) / len(real.data_wait_s) * 1e3 if real.data_wait_s else 0.0
    wait_trial = sum(trial.data_wait_s) / len(trial.data_wait_s) * 1e3 if trial.data_wait_s else 0.0
    parts = [f"Evidence: the real run's median step is {dt:+.2f} ms against the trial's "
             f"({real.step_time_s * 1e3:.2f} vs {trial.step_time_s * 1e3:.2f} ms); waiting for batches "
             f"{wait_real:.2f} vs {wait_trial:.2f} ms per step ({wait_real - wait_trial:+.2f} ms: the loader, the "
             f"move to the device and the {real.extra.get('framework', 'framework')} loop between batches), so "
             f"{dt - (wait_real - wait_trial):+.2f} ms per step is in the step itself and its hooks (logging, "
             "callbacks, progress bar)."]
    diff = trial.knobs.diff(real.knobs)
    if diff:
        parts.append("The knobs differ: " + ", ".join(f"{k} {a!r} in the trial, {b!r} in the run"
                                                      for k, (a, b) in diff.items()) + ".")
    if real.steady is False:
        parts.append("The run's warm-up did not reach steady state (see its notes).")
    return " ".join(parts)


def compare_real(a: TrialResult, b: TrialResult, *, noise: Any, margin: float = MARGIN) -> Comparison:
    """B against A where one or both are real runs: each real run's window cut into windows of the other
    side's length (a trial's measured steps), each window one repeat; stats.decide over them."""
    for r in (a, b):
        if not (r.ok and r.samples_per_s and len(r.step_times_s) >= 2):
            raise ValueError(f"#{r.trial_id} has no measured steps (status {r.status}): compare ok trials and runs")
    trial = b if real_run(a) and not real_run(b) else a
    steps = len(trial.step_times_s) if not real_run(trial) else 30
    sides, counts = [], []
    rate = rate_for([a], [b])
    for r in (a, b):
        if real_run(r):
            cut = windows(r, steps) or [(r.samples_per_s, r.tokens_per_s or 0.0)]
            sides.append([w[1] if rate == "tokens/s" else w[0] for w in cut])
        else:
            sides.append([float((r.tokens_per_s if rate == "tokens/s" else r.samples_per_s) or 0.0)])
        counts.append(len(sides[-1]))
    real = b if real_run(b) else a
    how = (f"How: the real run #{real.trial_id} ({real.extra.get('framework', 'a framework')}, "
           f"{len(real.step_times_s)} measured steps after a warm-up of "
           f"{(real.extra.get('warmup_rule') or {}).get('steps', '?')} by the steady-state rule) is cut into "
           f"{counts[[a, b].index(real)]} windows of {steps} steps, as long as the trial's measured window; each "
           "window is one repeat of its side, judged against the other with this log's between-trial noise "
           "(the one-look rule of the results table).")
    c = decide(sides[0], sides[1], noise, a_trials=[a.trial_id], b_trials=[b.trial_id], margin=margin)
    c = RunComparison(**{f: getattr(c, f) for f in c.__dataclass_fields__}, runs=(real_run(a), real_run(b)))
    c = replace(c, rate=rate, rounds_needed=None)
    note = how if c.answer == "same" else f"{how} {gap_evidence(trial, real) if trial is not real else ''}".strip()
    return replace(c, note=note)
