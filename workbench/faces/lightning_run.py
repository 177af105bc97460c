"""`wb.LightningCallback(bench)`: a Lightning `fit()` measured with the workbench's rules, as a row of
`bench.results` marked "real run" (see realrun.py for what is measured and how).

    trainer = L.Trainer(**bench.to_lightning(best), max_steps=300, callbacks=[wb.LightningCallback(bench)])
    trainer.fit(module, datamodule)
    bench.compare(best, bench.trials[-1])      # does the trial's speed hold in the real run?

This module imports lightning at its top: `workbench` imports it only when `wb.LightningCallback` is used.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
import torch

from ..core.knobs import Knobs
from .lightning import loader_knobs, trainer_knobs
from .realrun import RunMeter


def run_knobs(trainer: Any, module: Any) -> tuple[Knobs, list[str]]:
    """The knobs a Lightning run trains with, read from its Trainer flags, loader and module."""
    notes = ["knobs read from the run: the Trainer's flags, the train loader, compile and channels_last; "
             "checkpoint, optimizer_impl, cpu_threads and your own knobs are taken as their defaults"]
    try:
        start, left = trainer_knobs(trainer)
    except ValueError as e:  # e.g. precision='bf16-true': measured all the same, knobs as far as they map
        start, left = {}, [str(e)]
    notes += [f"not a knob: {item}" for item in left]
    loader = trainer.train_dataloader
    if isinstance(loader, torch.utils.data.DataLoader):
        start.update(loader_knobs(loader))
    if getattr(module, "_compiler_ctx", None) is not None or any(
            isinstance(m, torch._dynamo.eval_frame.OptimizedModule) for m in module.modules()):
        start["compile"] = "default"
    convs = [m.weight for m in module.modules() if isinstance(m, torch.nn.Conv2d)]
    if convs and convs[0].is_contiguous(memory_format=torch.channels_last) and not convs[0].is_contiguous():
        start["channels_last"] = True
    matmul = torch.get_float32_matmul_precision()
    if matmul != "highest":
        start["matmul_precision"] = matmul
    return Knobs(**start), notes


class LightningCallback(pl.Callback):
    """Measures the fit it is passed to: steady warm-up, samples/s (tokens/s for token batches), data-wait
    share, peak memory (CUDA); at the end of training the run lands in `bench.results` as a row with
    source "real run" (`.result` holds it). Per step it reads the host clock and, on CUDA, records one
    event (read in chunks of long-finished events and at the end): no sync per step. Validation during
    fit and checkpoint saves are left out of the measured window (the row's notes give their seconds);
    the sanity check runs before the run's clock starts. Under DDP rank zero writes the one row, with
    every rank's samples (RunMeter.combine_ranks); a launcher that forks the ranks (ddp_notebook,
    ddp_spawn) writes it from a child process: `bench.log.refresh()` reads it into the notebook."""

    def __init__(self, bench: Any) -> None:
        self.bench = bench
        self.meter: RunMeter | None = None
        self.result: Any = None
        self._step = 0
        self._sanity: float | None = None  # host seconds of the sanity check (its start, then its length)

    def on_sanity_check_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._sanity = time.perf_counter()

    def on_sanity_check_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._sanity is not None:
            self._sanity = time.perf_counter() - self._sanity

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        knobs, notes = run_knobs(trainer, pl_module)
        if self._sanity is not None:
            notes.append(f"sanity check: {self._sanity:.2f} s before the first step, outside the run's clock")
            self._sanity = None
        loader = trainer.train_dataloader
        self.meter = RunMeter(knobs=knobs, device=pl_module.device, framework="lightning",
                              warmup_steps=self.bench.warmup_steps, notes=notes,
                              loader=loader if isinstance(loader, torch.utils.data.DataLoader) else None)
        self._step = trainer.global_step
        self.meter.start()

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.meter is not None and trainer.current_epoch > 0:
            self.meter.mark("epoch start")

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self.meter is not None:
            self.meter.batch(batch)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self.meter is None:
            return
        self.meter.batch_done(outputs.get("loss") if isinstance(outputs, Mapping) else outputs)
        if trainer.global_step != self._step:  # the optimizer stepped: one step of the workbench's
            self._step = trainer.global_step
            self.meter.step()

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # during fit's validation trainer.training is False (the stages exclude each other): the meter
        # exists only between on_train_start and on_train_end, so this is validation inside the fit
        if self.meter is not None and not trainer.sanity_checking:
            self.meter.pause("validation")

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: Any) -> None:
        if self.meter is not None:  # called as the checkpoint is assembled (the file is written after), by a
            self.meter.pause("checkpoint saving", under_way=True)  # callback that began after the last batch

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.meter is None:
            return
        row = self.meter.combine_ranks()  # a collective under DDP: every rank's on_train_end runs it
        self.meter = None
        if row is not None:
            self.result = self.bench.log.append(row)
