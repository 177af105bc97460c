"""`wb.LightningCallback(bench)`: a Lightning `fit()` measured with the workbench's rules, as a row of
`bench.results` marked "real run" (see realrun.py for what is measured and how).

    trainer = L.Trainer(**bench.to_lightning(best), max_steps=300, callbacks=[wb.LightningCallback(bench)])
    trainer.fit(module, datamodule)
    bench.compare(best, bench.trials[-1])      # does the trial's speed hold in the real run?

This module imports lightning at its top: `workbench` imports it only when `wb.LightningCallback` is used.
"""

from __future__ import annotations

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
    event (read in chunks of long-finished events and at the end): no sync per step."""

    def __init__(self, bench: Any) -> None:
        self.bench = bench
        self.meter: RunMeter | None = None
        self.result: Any = None
        self._step = 0

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        knobs, notes = run_knobs(trainer, pl_module)
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
        if self.meter is not None and trainer.training:
            self.meter.pause()

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: Any) -> None:
        if self.meter is not None:
            self.meter.pause()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.meter is None:
            return
        self.result = self.bench.log.append(self.meter.result())
        self.meter = None
