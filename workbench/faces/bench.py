"""Workbench: the one object a user holds. Wraps a Workload, runs trials, keeps the ResultLog."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import threading
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn

from ..core.devicefacts import DeviceFacts
from ..core.earlystop import StopRule
from ..core.knobs import Knobs, device_notes
from ..core.measure import TrialResult
from ..core.progress import TrialProgress, search, shown
from ..core.stepshape import StepShape, is_demo_source, is_import_path, shape_of
from ..core.workload import StepFn, Workload, move_to
from ..deciding.budget import Budget
from ..deciding.rounds import compare
from ..launch.cluster import check_executor, local_device, where_note
from ..launch.local import routed, start_deferred, started_text, worker_of
from ..launch.runner import Progress, TrialInterrupted, check_knobs, in_parallel_slot, run_trial, submit_trial
from ..results import Comparison, ResultLog
from ..results.comparison import real_run
from ..results.stats import MARGIN, Noise
from .nodefacts import NodeFacts, OnNode
from .reloaded import announce, fingerprint, reload_text, stamp
from .scaling import Scaling
from .surface import DEPRECATED, fastest_trial, knobs_of, log_path, outcome_of, require_notebook, wait_for
from .unchanged import inert_note, unchanged, warn_at_caller, with_note

DEFAULT_LOG_DIR = "workbench-runs"
LOUD_NOTES = ("amp='fp16' on CPU",)  # notes worth a warning in the caller's cell, not only in `notes`


class Workbench(OnNode):
    """Measure your model's training step under different knobs; every trial lands in `results`.

    `log` is a folder (or a .jsonl file) that every trial is appended to. `participant` names who
    runs it (default user@host); with a name, trials go to `<log>/<participant>/<name>.jsonl`, so
    a workshop's learners share one folder and the instructor `wb.gather`s it.
    `executor` runs every trial in a process of its own: `wb.FreshProcess()` on this machine, or any
    object with `submit(fn, *args) -> job` (a submitit executor). Without one, trials, analyses and turns run
    in this workbench's worker process (`trials_in="worker"`), one thread as a plain script: the kernel's own
    torch work cannot change their figures (launch/local.py). `trials_in="kernel"` (or a workload that
    cannot be pickled, said) runs them in this process. The table's `ran_in` says where each trial ran.

    >>> bench = Workbench(model, dataset, loss_fn=torch.nn.CrossEntropyLoss(),
    ...                   optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3))
    >>> bench.run(num_workers=2, amp="bf16")
    """

    def __init__(
        self,
        model: nn.Module,
        data: Any,
        *,
        loss_fn: Any = None,
        optimizer: Any = None,
        step_fn: StepFn | None = None,
        device: str | torch.device = "auto",
        seed: int = 0,
        log: str | os.PathLike | None = DEFAULT_LOG_DIR,
        name: str | None = None,
        warmup_steps: int = 5,
        steps: int = 30,
        knobs: Knobs | None = None,
        loader_timeout_s: float = 120.0,
        participant: str | None = None,
        collective_timeout_s: float = 120.0,
        executor: Any = None,
        budget_counts_queue: bool = False,
        trials_in: str | None = None,
    ) -> None:
        if participant is not None and not isinstance(participant, str):
            raise TypeError(f"participant must be a name (str) such as 'ana', got {type(participant).__name__}")
        if participant is not None and not participant.strip():
            raise ValueError("participant is empty: pass your name, e.g. participant='ana'")

        self.executor = check_executor(executor)  # None: trials run here, unless their knobs ask for another process
        if not isinstance(budget_counts_queue, bool):
            raise TypeError(f"budget_counts_queue must be True or False, got {budget_counts_queue!r}")
        # On an executor the trials run on the job's node: "auto" (or "cuda" asked from a login node
        # without a GPU) is resolved there; here the one-step check runs on what this machine has.
        self.workload = Workload(model, data, loss_fn=loss_fn, optimizer=optimizer, step_fn=step_fn,
                                 device=local_device(device) if executor is not None else device, seed=seed)
        self._here: DeviceFacts = self.workload.facts  # this machine's; `facts` is the trials' node's
        self._device_asked = str(device)
        self.name = name or type(model).__name__
        if steps < 2 or warmup_steps < 0:
            raise ValueError(f"steps must be >= 2 (for a median and IQR) and warmup_steps >= 0; got {steps}, {warmup_steps}")
        self.warmup_steps = warmup_steps
        self.steps = steps
        self.loader_timeout_s = loader_timeout_s
        self.collective_timeout_s = collective_timeout_s  # world_size > 1: a hung rank fails the trial after this
        spec = self.workload.spec
        self.defaults = knobs or Knobs(batch_size=min(spec.default_batch_size, len(spec)) if not spec.iterable else spec.default_batch_size,
                                       num_workers=spec.default_num_workers)
        self._probe()
        # A workshop: each participant appends to a file of their own under the shared folder.
        self.participant = participant
        self.fingerprint = fingerprint(self.workload.pristine)  # each trial carries it (reloaded.py)
        self._log_to(log)
        announce(reload_text(self.log, self.fingerprint))  # an old log: what was reloaded, and the baseline
        self._lock = threading.Lock()  # one trial at a time, whoever asks (cell or panel thread)
        self._append_lock = threading.Lock()
        self._jobs, self._jobs_device, self._counts_queue = None, str(device), budget_counts_queue
        if executor is not None:  # every trial a job (launch/cluster.py); what cannot travel is said now
            self._jobs_now().travels(self.workload)  # diagnose's analyses of this workload run as jobs too
            for line in self._jobs.reattach(self._record, self._lock):
                warn_at_caller(f"a job from an earlier kernel: {line}")
        self.trials_in, self._worker, why = worker_of(self, self.workload, trials_in, executor)  # started now, or in _where
        if why:  # the workload cannot leave this process: its trials run here
            warn_at_caller(why)

    def _where(self) -> Any:
        """What runs this workbench's trials: its executor's Jobs, its worker process (a distributed rank's starts at
        its first trial, launch/local.py's in_rank), or None (this process)."""
        if self._worker is not None and self._worker.deferred:
            self.trials_in, self._worker, why = start_deferred(self._worker, self.workload)
            if why:  # the workload cannot leave this process: its trials run here
                warn_at_caller(why)
        return self._jobs_now() or routed(self.workload, self._worker)

    def _log_to(self, log: str | os.PathLike | None) -> None:
        """Append trials from now on to `log` (a folder, a .jsonl file, or None for memory only),
        under this workbench's participant folder when it has a participant."""
        self.log = ResultLog(log_path(log, self.name, self.participant), participant=self.participant)
        self.log.defaults = self.defaults  # labels name what differs from this workbench's defaults
        self.log.model = self.fingerprint  # speedups and verdicts from this model's trials only
        self._node = NodeFacts(self.log.path.parent if self.log.path is not None else None, self._device_asked)

    def _jobs_now(self) -> Any:
        """The jobs of the current `executor` (None: trials run here); made anew when it was replaced."""
        if self.executor is None:
            return None
        if self._jobs is None or self._jobs.executor is not self.executor:
            from ..launch.jobs import Jobs
            from ..launch.runner import ROUTES

            self._jobs = Jobs(check_executor(self.executor), self.log.path, device=self._jobs_device,
                              counts_queue=self._counts_queue)
            ROUTES[self.workload] = self._jobs
        return self._jobs

    # ---- validation ----------------------------------------------------------------------
    def _probe(self) -> None:
        """Run the step's forward once on a throw-away copy so mistakes surface now, with a fix."""
        from ..core.step import Stage, build_loader, check_loss

        wl = self.workload
        if not wl.spec.iterable and len(wl.spec) == 0:
            raise ValueError("the dataset is empty: pass a dataset with at least one batch of samples")
        probe_knobs = self.defaults.replace(num_workers=0, persistent_workers=False, prefetch_factor=None)
        loader = build_loader(wl.spec, probe_knobs, seed=wl.seed, device=wl.device)
        stage = Stage()
        try:
            batch = next(iter(loader))
        except StopIteration:
            raise ValueError("the data yields no batch: the dataset is shorter than one batch") from None
        batch = move_to(batch, wl.device)
        wl.see_batch(batch)  # what the knobs' `inert` hooks know before any trial (4-D tensors)
        model = wl.fresh_model().train()
        try:
            loss = wl.compute_loss(model, batch, stage)
            check_loss(loss, stage)
        except TypeError as e:
            raise TypeError(f"checking one step: {e}") from e
        except Exception as e:
            raise ValueError(
                f"checking one step: {type(e).__name__} in {stage.name}: {e}. Fix the model, loss_fn "
                "or step_fn so that one batch gives a scalar loss"
            ) from e
        wl.check_optimizer(model)
        self.step_shape: StepShape = shape_of(batch, has_loss_fn=wl.loss_fn is not None, step_fn=wl.step_fn, spec=wl.spec)

    # ---- the public surface ----------------------------------------------------------------
    @property
    def blocks(self) -> dict[str, int]:
        """{block name: parameter count}: the candidates for `checkpoint=[...]` and `fsdp_shard=[...]`
        (`checkpoint=bench.blocks` names them all)."""
        return dict(self.workload.blocks)

    @property
    def device(self) -> torch.device:
        return self.workload.device

    def knobs(self, base: Knobs | None = None, **changes: Any) -> Knobs:
        """The workbench's default Knobs (or `base`) with `changes` applied and validated."""
        return (base or self.defaults).replace(**changes)

    def run(self, knobs: Knobs | None = None, /, *, progress: TrialProgress | Progress | bool | None = None,
            cancel: threading.Event | None = None, trace: bool = False, stop_early: bool = True,
            **changes: Any) -> TrialResult:
        """Run one measured trial (blocking) and append it to `results`.

        `bench.run(num_workers=2, amp="bf16")` changes the defaults; `bench.run(knobs)` runs a
        Knobs value as is. A failing trial returns with its status; Ctrl-C is recorded, then
        re-raised. `progress`: None shows a tqdm bar in Jupyter or a terminal, True/False force
        it; a callable `(phase, steps done, steps total)` is called from its own thread at most 4
        times a second (never from inside the measured loop); a TrialProgress is stored into.
        `trace=True` profiles a few steps after the measured window into a Chrome-trace JSON next
        to the log (`result.trace_path`; open it in Perfetto or chrome://tracing).
        `stop_early=True` ends the measured window after a few steps when they already show the trial
        far slower than the baseline (earlystop.py: ≥ 2× per sample, ≤ 1% chance of stopping one that is
        not slower); it keeps status ok, its steps and a note. `stop_early=False` runs the whole window.
        """
        if not isinstance(stop_early, bool):
            raise TypeError(f"stop_early must be True or False, got {stop_early!r}")
        k = self.knobs(knobs, **changes)
        check_knobs(self.workload, k)  # a ValueError here, in the caller's thread, records nothing
        # the trials' device facts decide the notes below (the defaults: only facts already read, no probe job)
        facts = self._facts if k != self.defaults else self._known_facts()
        if threading.current_thread() is threading.main_thread() and facts is not None:  # a cell or a script: warn there, once
            loud = [n for n in device_notes(k, facts.type, has_conv=self.workload.has_conv,
                                             token_data=self.workload.token_data)
                    if n.startswith(LOUD_NOTES)]
            hopeless = self._expect_slow(k, facts)  # a known hopeless trial, with this machine's earlier factor
            if hopeless:  # one warning: the note (if any), then what to expect here
                loud = [f"{loud[0]}. {hopeless}" if loud else hopeless]
            loud += [n for n in [inert_note(self, k)] if n]  # a knob that changes nothing in this step
            for note in loud:
                warn_at_caller(note)
        trace_dir = (self.log.path.parent if self.log.path is not None else None) if trace else None
        # tune(parallel=N): each watcher thread waits on its own job; only the log's append is serialised
        lock = contextlib.nullcontext() if self.executor is not None and in_parallel_slot() else self._lock
        with lock, shown(progress, desc=self.name) as state:  # bars and callbacks poll it, off the trial thread
            stop = cancel or threading.Event()
            # In the worker (or a job); in this process inline from the main thread, else on the trial thread.
            jobs = self._where()
            future = submit_trial(jobs.run_trial if jobs else run_trial, self.workload, k, warmup_steps=self.warmup_steps,
                                  steps=self.steps, progress=state, cancel=stop,
                                  loader_timeout_s=self.loader_timeout_s, trace=trace,
                                  trace_dir=trace_dir, collective_timeout_s=self.collective_timeout_s,
                                  stop=self._stop_rule(k) if stop_early else None)
            try:
                result = with_note(wait_for(future), inert_note(self, k))
                announce(started_text(result.extra.get("worker_startup")))  # once per worker start
                if not result.ok:  # the bar ends in the trial's status, not the runner's "done"
                    state.set(result.status, state.done, state.total)
                return self._record(result)
            except TrialInterrupted as e:  # KeyboardInterrupt raised inside the trial (a callback)
                state.set("interrupted", state.done, state.total)
                e.result = self._record(e.result)
                raise
            except KeyboardInterrupt:  # Ctrl-C in this thread: stop at the next step boundary
                stop.set()
                try:
                    result = wait_for(future)
                except TrialInterrupted as e:
                    result = e.result
                except KeyboardInterrupt:  # a second Ctrl-C: record the trial whenever it ends
                    future.add_done_callback(lambda f: self._record(outcome_of(f)))
                    raise
                raise TrialInterrupted(self._record(result)) from None

    def _stop_rule(self, knobs: Knobs) -> StopRule | None:
        """The early-stop rule for a trial of `knobs` against the baseline: None without an ok baseline
        measured here (this device), for the baseline's own knobs (a repeat is noise evidence), and for
        several ranks."""
        base = self.log.baseline
        if (base is None or not base.ok or base.knobs == knobs or max(knobs.world_size, base.knobs.world_size) > 1
                or base.env.get("device", str(self.device)) != str(self.device)):
            return None
        return StopRule.against(base.step_times_s, base.samples_per_step, steps=self.steps,
                                baseline_id=base.trial_id)

    def _came_from(self, source: str) -> None:
        """Record where this workbench's objects can be rebuilt: "pkg.module:factory" (the CLI's
        --model) or "demo:NAME:SIZE". Its `to_code()` scripts then rebuild them and run as they are."""
        if not (is_import_path(source) or is_demo_source(source)):
            raise ValueError(f"source must be 'pkg.module:factory' or 'demo:NAME:SIZE', got {source!r}")
        self.step_shape = dataclasses.replace(self.step_shape, factory=source)

    def _record(self, result: TrialResult) -> TrialResult:
        """Append a finished trial to the log, stamped with the step it ran (for `to_code()`) and its label
        against this workbench's defaults (the card says what the table says)."""
        result.extra.setdefault("step", self.step_shape.to_record())
        result.extra.setdefault("label", result.knobs.label(self.defaults))
        self._stamp_facts(result)  # on an executor: whose device facts decided the space and rules around it
        stamp(result, self.fingerprint)
        with self._append_lock:  # the one writer of the log, whichever thread a trial ended on
            return self.log.append(result)

    def to_code(self, trial: int | TrialResult | Knobs | None = None, **kwargs: Any) -> str:
        """The training script of a trial (id or result), a Knobs value, or (None) the best trial so
        far: the step this workbench measured (its batch format, loss and sampling), the knobs' code,
        seeded like the trials. None takes this model's fastest finished trial (never a real run). Keywords go to `knobs_to_code` (steps, warmup, model=..., setup=...)."""
        from ..core.codegen import knobs_to_code, trial_shapes

        style = kwargs.pop("style", "loop")
        if style not in ("loop", "trainer"):
            raise ValueError(f"to_code(style={style!r}): use 'loop' (a plain PyTorch loop) or 'trainer' (a Trainer script)")
        if trial is None:  # this model's fastest trial that finished, else the defaults
            trial = fastest_trial(self.log) or self.defaults
        if isinstance(trial, int) and not isinstance(trial, bool):
            trial = self.log.get(trial)
        if isinstance(trial, TrialResult):
            if style == "loop":  # the input shapes it met (codegen.trial_shapes) go along
                kwargs.setdefault("shapes", trial_shapes(trial))
            trial = trial.pinned_knobs()  # the allocator mode its process ran in, carried into the script
        if not isinstance(trial, Knobs):
            raise TypeError(f"to_code takes a trial id, a TrialResult or a Knobs value, got {type(trial).__name__}")
        if style == "trainer":
            from .hf import trainer_script

            return trainer_script(self, trial, **kwargs)
        kwargs.setdefault("seed", self.workload.seed)
        return knobs_to_code(trial, shape=self.step_shape, **kwargs)

    @classmethod
    def from_trainer(cls, trainer: Any, **workbench_kwargs: Any) -> Workbench:
        """A Workbench on a Hugging Face Trainer: its model, train dataset, collator and optimizer, its
        TrainingArguments as the starting knobs; one warning lists what cannot be mapped (workbench/faces/hf.py)."""
        from .hf import from_trainer

        return from_trainer(cls, trainer, **workbench_kwargs)

    def to_training_arguments(self, trial: int | TrialResult | Knobs | None = None) -> dict[str, Any]:
        """Keyword arguments for transformers.TrainingArguments with a trial's knobs (default: the
        fastest); `.left_out` and a warning list what they cannot say (workbench/faces/hf.py)."""
        from .hf import to_training_arguments

        return to_training_arguments(self, knobs_of(self.log, trial, "to_training_arguments") or self.defaults)

    @classmethod
    def from_lightning(cls, module: Any, datamodule: Any = None, trainer: Any = None, **kwargs: Any) -> Workbench:
        """A Workbench on a LightningModule's training_step and configure_optimizers, the datamodule's
        train_dataloader() and the Trainer's flags as starting knobs; `bench.unmapped` lists the rest."""
        from .lightning import from_lightning

        return from_lightning(cls, module, datamodule, trainer, **kwargs)

    def to_lightning(self, trial: int | TrialResult | Knobs | None = None) -> dict[str, Any]:
        """Trainer(**kwargs) keywords for a trial's knobs (default: the fastest), with `.dataloader` (the
        DataModule's DataLoader arguments), `.code` (what has no Trainer flag) and `.left_out`."""
        from .lightning import to_lightning

        return to_lightning(self, knobs_of(self.log, trial, "to_lightning") or self.defaults)

    @property
    def trials(self) -> list[TrialResult]:
        return list(self.log.trials)

    @property
    def results(self) -> pd.DataFrame:
        """One row per trial: knobs, metrics, speedup vs baseline, verdict, status (docs/results.md names
        every column). `label` says how a trial's knobs differ from this workbench's defaults."""
        self.log.defaults = self.defaults  # `defaults` may have been replaced since (the CLI does)
        return self.log.frame()

    @property
    def baseline(self) -> TrialResult | None:
        """The trial speedups and verdicts are measured against; set it with `bench.baseline = trial`."""
        return self.log.baseline

    @baseline.setter
    def baseline(self, trial: int | TrialResult) -> None:
        """`bench.baseline = trial` (id or result) makes it the reference for speedups and verdicts."""
        self.log.set_baseline(trial.trial_id if isinstance(trial, TrialResult) else trial)

    def _set_baseline(self, trial: int | TrialResult) -> None:  # the deprecated set_baseline()
        self.baseline = trial

    def compare(self, a: int | TrialResult, b: int | TrialResult, rounds: int | str = 0, *,
                max_rounds: int = 8, margin: float = MARGIN, budget_s: float | None = None,
                run: Callable[[Knobs], TrialResult | None] | None = None,
                method: str = "auto", interleave: bool | None = None,
                cancel: threading.Event | None = None) -> Comparison:
        """Is B faster than A, slower, the same speed (within ±margin), or undecided? (trial ids or results)

        `rounds="auto"` decides until it can: when the two differ only in knobs that can share a
        process (compute knobs: amp, compile, channels_last, ...; see deciding/interleave.py), both
        are built once and take turns of a few steps in this process, and the answer usually comes
        in seconds (`budget_s`, default 30). Otherwise (data-pipeline or distributed knobs, or
        `method="trials"`) it runs alternating trials (B A, A B, ...) until decided, or until
        `max_rounds` (or `budget_s` seconds) run out, and the result's note says why. `.answer` is
        "faster", "slower", "same" or "undecided"; `.method` says "interleaved" or "trials". The error
        rates hold however often it looks. `rounds=N` runs exactly N rounds of each and decides
        once. `method="interleave"` compares by interleaved turns (as `rounds="auto"` does) and refuses (ValueError) a pair that cannot interleave. `run` replaces
        `self.run` for trials (the panel passes its own runner); a set `cancel` event stops the
        interleaved turns at the next pair (the panel's Stop button).
        """
        # this call's one budget (validated here, once): its turns and rounds spend it; rounds=0 spends nothing
        budget = Budget.of(budget_s, "compare", whole_first=False) if rounds or budget_s is not None else None
        ra = a if isinstance(a, TrialResult) else self.log.get(a)
        rb = b if isinstance(b, TrialResult) else self.log.get(b)
        if real_run(ra) or real_run(rb):  # the user's own run as referee: its windows against the trial (realrun.py)
            from .realrun import compare_real
            return compare_real(ra, rb, noise=self.log.noise, margin=margin)
        if interleave is not None:  # the keyword before `method`
            warnings.warn("compare(interleave=...) is deprecated: use method='interleave' or method='trials'",
                          FutureWarning, stacklevel=2)
            if interleave not in (True, False):
                raise TypeError(f"interleave takes None (when possible), True or False, got {interleave!r}")
            method = "interleave" if interleave else "trials"
        if method not in ("auto", "trials", "interleave"):
            raise ValueError(f"method must be 'auto', 'trials' or 'interleave', got {method!r}")
        if method == "interleave" and not rounds:
            rounds = "auto"
        interleave = {"auto": None, "trials": False, "interleave": True}[method]
        c, note = unchanged(self, ra, rb, margin), ""  # the same step on both sides: "same", nothing measured
        if c is not None:
            self.log.record_comparison(c, ra.knobs, rb.knobs)
            return c
        if rounds and ra.ok and rb.ok:  # the allocator compared: both sides in fresh processes, pinned
            ra, rb, note = self._pinned(ra, rb)
        if rounds == "auto" and interleave is not False and ra.ok and rb.ok:  # a failed trial: compare says why
            c, why = self._interleaved(ra, rb, margin=margin, budget=budget, required=interleave is True,
                                       cancel=cancel)
            note = f"{note} {why}".strip()
        if c is None:
            c = compare(ra, rb, rounds=rounds, run=run or self.run, log=self.log, max_rounds=max_rounds,
                        margin=margin, budget_s=budget)
            c = replace(c, note=f"{note} {c.note}".strip()) if note else c
        c = where_note(c, ra, rb)
        if rounds:  # new evidence was measured: the log keeps the comparison (the table's verdict uses it)
            self.log.record_comparison(c, ra.knobs, rb.knobs)
        return c

    def _pinned(self, ra: TrialResult, rb: TrialResult) -> tuple[TrialResult, TrialResult, str]:
        """When the allocator is what differs and one side leaves it None (the process as it is), that
        side is pinned to this process's own mode and measured afresh in a fresh process, so both sides
        alternate fresh-process trials (one process cannot change its allocator); the note says so."""
        from ..core.system import process_allocator

        ka, kb = ra.knobs, rb.knobs
        mode = process_allocator()
        if ka.allocator == kb.allocator or None not in (ka.allocator, kb.allocator) or not mode:
            return ra, rb, ""
        if ka.allocator is None:
            ra = self.run(ka.replace(allocator=mode), progress=False)
        else:
            rb = self.run(kb.replace(allocator=mode), progress=False)
        side = "A" if ka.allocator is None else "B"
        return ra, rb, (f"{side} left the allocator as this process runs it ({mode!r}): pinned to {mode!r} so that "
                        "both sides run in fresh processes.")

    def _interleave(self, a: TrialResult, b: TrialResult, *, margin: float = MARGIN,
                    budget_s: float | Budget | None = None, cancel: threading.Event | None = None) -> Comparison:
        """B's knobs against A's by interleaved turns in this process (deciding/interleave.py), on the
        trial thread like a trial; `budget_s` seconds at most (default 30; or the part of a calling
        verb's Budget it was given), build and warm-up included.

        Records nothing (`compare(rounds="auto")` and the tuner log what they use). Raises ValueError
        naming why when the pair cannot interleave (its knobs; on CUDA both trials' peaks against free
        memory), and interleave.InterleaveFailed when a side fails (its side, status and pairs so far).
        """
        from ..deciding.interleave import BUDGET_S, INTERLEAVE_WARMUP, in_one_job, interleaved, memory_reason, why_not

        reason = why_not(a.knobs, b.knobs) or memory_reason(self.device, a.peak_memory_bytes, b.peak_memory_bytes)
        if reason is not None:
            raise ValueError(f"these two cannot interleave: {reason}")
        with self._lock:
            jobs = self._where()
            run = functools.partial(in_one_job, jobs) if jobs else interleaved  # both sides in ONE job
            future = submit_trial(run, self.workload, a.knobs, b.knobs, a_id=a.trial_id, b_id=b.trial_id,
                                  margin=margin, budget_s=budget_s if budget_s is not None else BUDGET_S,
                                  warmup_steps=min(self.warmup_steps, INTERLEAVE_WARMUP), cancel=cancel)
            return wait_for(future)

    def _interleaved(self, ra: TrialResult, rb: TrialResult, *, margin: float, budget: Budget,
                     required: bool, cancel: threading.Event | None = None) -> tuple[Comparison | None, str]:
        """The interleaved comparison of two trials' knobs, or (None, why trials must decide instead);
        its turns spend a part of `budget` (all that is left; BUDGET_S without a budget_s)."""
        from ..deciding.interleave import BUDGET_S, InterleaveFailed, memory_reason, why_not

        reason = why_not(ra.knobs, rb.knobs) or memory_reason(self.device, ra.peak_memory_bytes,
                                                               rb.peak_memory_bytes)
        if reason is not None:
            if required:
                raise ValueError(f"interleave=True, but these two cannot interleave: {reason}")
            return None, f"By alternating trials: {reason}."
        try:
            with budget.charge("turns"):
                turns = budget.part(BUDGET_S if budget.budget_s is None else None)
                return self._interleave(ra, rb, margin=margin, budget_s=turns, cancel=cancel), ""
        except InterleaveFailed as e:
            if e.status == "interrupted":  # stopped before two pairs: the trials path sees the stop too
                return None, "Stopped by the user while interleaving."
            if e.comparison is not None and e.status != "oom":  # keep the evidence, say which side failed
                return replace(e.comparison, note=f"{e.comparison.note} Interleaving ended: {e}.".strip()), ""
            if required:
                raise
            return None, f"By alternating trials: interleaving failed ({e})."

    @property
    def noise(self) -> Noise:
        """This machine's noise, learnt from repeats in the log: `str()` says in words how far apart
        back-to-back identical trials land, and how far apart identical trials minutes apart land."""
        return self.log.noise

    def _steps_frame(self) -> pd.DataFrame:
        """Every measured step of every trial, long form: trial_id, step, step_time_s, data_wait_s, loss."""
        return self.log.steps_frame()

    # ---- notebook layer and analyses (lazy imports: the core never needs widgets or altair) ----
    def panel(self, **kwargs: Any) -> Any:
        """Knob widgets + progress + live chart + results table in one output (see workbench/faces/panel/).

        Outside a notebook it prints how to drive the workbench from code and returns None.
        """
        require_notebook("bench.panel()")
        from .panel import panel

        return panel(self, **kwargs)

    def chart(self, last: int | None = 30) -> Any:
        """The comparison chart as a plain altair Chart (save to HTML/PNG): the baseline, the last
        `last` trials and the best of each configuration; `last=None` draws every trial."""
        require_notebook("bench.chart()", ("altair",))
        from .charts import comparison_chart

        return comparison_chart(self.results, last=last)

    def diagnose(self, *, progress: bool | None = None, **kwargs: Any) -> Any:
        """Why is the step slow, and what to try next (see diagnose/)."""
        from ..diagnose import diagnose

        with search(progress, "diagnose", log=self.log, budget_s=kwargs.get("budget_s")):
            return diagnose(self, **kwargs)

    def explain(self, a: int | TrialResult | Knobs | None = None, b: int | TrialResult | Knobs | None = None, *,
                progress: bool | None = None) -> Any:
        """Why B is faster or slower than A (default A: the baseline), phase by phase and op by op,
        from traced steps (see diagnose/explain.py); a trial without a trace gets a traced repeat."""
        from ..diagnose.explain import explain

        return explain(self, a, b, progress=progress)

    def tune(self, n_trials: int | None = None, *, progress: bool | None = None, **kwargs: Any) -> Any:
        """Race candidates within `budget_s=` seconds (`n_trials` caps trials); keep a winner only when
        it is faster than the start. (`budget=` is the old name of `n_trials`: FutureWarning.)"""
        from ..search.tune import n_trials_of, tune

        old = {k: kwargs.pop(k) for k in ("budget",) if k in kwargs}
        n_trials = n_trials_of(n_trials, old)
        with search(progress, "tune", log=self.log, total=n_trials if isinstance(n_trials, int) else None,
                    budget_s=kwargs.get("budget_s")):
            return tune(self, n_trials=n_trials, **kwargs)

    def fit_memory(self, max_bytes: int | None = None, effective_batch: int | None = None, *,
                   progress: bool | None = None, **kwargs: Any) -> Any:
        """A configuration whose peak stays within `max_bytes` at `effective_batch` samples per optimizer
        step. (`budget_bytes=` is the old name of `max_bytes`: FutureWarning.)"""
        from ..search.fit import fit_memory, max_bytes_of

        old = {k: kwargs.pop(k) for k in ("budget_bytes",) if k in kwargs}
        max_bytes = max_bytes_of(max_bytes, old)
        total = kwargs.get("max_trials", 12)
        with search(progress, "fit_memory", log=self.log, total=total if isinstance(total, int) else None,
                    budget_s=kwargs.get("budget_s")):
            return fit_memory(self, max_bytes=max_bytes, effective_batch=effective_batch, **kwargs)

    def to_tensorboard(self, logdir: str | os.PathLike = "runs") -> list[Path]:
        """One TensorBoard run per trial under `logdir/<name>/` (knobs as hparams, per-step scalars);
        re-running rewrites the runs instead of duplicating them. Needs the tensorboard extra."""
        from .export import to_tensorboard

        return to_tensorboard(self.trials, logdir, name=self.name)

    def scaling(self, world_sizes: tuple[int, ...] = (1, 2), *, strategies: tuple[str, ...] | None = None,
                progress: bool | None = None, budget_s: float | None = None, **knobs: Any) -> Scaling:
        """One trial per world size (and per strategy: `strategies=("ddp", "fsdp2")`) with the same other
        knobs: samples/s, efficiency, peak memory and model state per rank (see scaling.py), as a `Scaling`
        (`.frame` the table, `.chart()` its picture, `["efficiency"]` a column); `budget_s` caps the seconds
        (budget.py)."""
        from ..search.scaling import plan, scaling

        budget = Budget.of(budget_s, "scaling")  # validated once, before anything runs
        total = len(plan(self, world_sizes, strategies, knobs))
        with search(progress, "scaling", log=self.log, total=total, budget_s=budget.budget_s):
            return Scaling(scaling(self, world_sizes, strategies, budget_s=budget, **knobs))

    def _scaling_chart(self, frame: pd.DataFrame | Scaling) -> Any:
        """The chart of a `scaling()` result (deprecated name: use `bench.scaling(...).chart()`)."""
        return (frame if isinstance(frame, Scaling) else Scaling(frame)).chart()

    def __getattr__(self, name: str) -> Any:
        """The names that left the public surface keep working for one release, with a FutureWarning."""
        if name not in DEPRECATED:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        new, hint = DEPRECATED[name]
        warnings.warn(f"Workbench.{name} is deprecated: {hint}", FutureWarning, stacklevel=2)
        return getattr(self, new)() if name == "steps_frame" else getattr(self, new)

    def __repr__(self) -> str:
        wl = self.workload
        return (f"<Workbench {self.name!r} on {wl.device} | {wl.num_parameters:,} parameters | "
                f"{len(self.log.trials)} trials | log: {self.log.path}>")

