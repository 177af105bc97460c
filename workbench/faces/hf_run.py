"""`wb.TrainerCallback(bench)`: a Hugging Face `Trainer.train()` measured with the workbench's rules,
as a row of `bench.results` marked "real run" (see realrun.py for what is measured and how).

    trainer = Trainer(model=model, args=TrainingArguments(**bench.to_training_arguments(best), ...),
                      train_dataset=ds, data_collator=collator, callbacks=[wb.TrainerCallback(bench)])
    trainer.train()
    bench.compare(best, bench.trials[-1])

The Trainer shows its callbacks no batch: samples per step are per_device_train_batch_size x
gradient_accumulation_steps, and tokens come from `state.num_input_tokens_seen` when the arguments
count them (include_num_input_tokens_seen). This module imports transformers at its top: `workbench`
imports it only when `wb.TrainerCallback` is used.
"""

from __future__ import annotations

from typing import Any

import torch
import transformers

from ..core.knobs import Knobs
from .hf import knobs_from_args
from .realrun import RunMeter


class TrainerCallback(transformers.TrainerCallback):
    """Measures the train() it is passed to; at its end the run lands in `bench.results` as a row with
    source "real run" (`.result` holds it). Per step: the host clock and, on CUDA, one event (no sync)."""

    def __init__(self, bench: Any) -> None:
        self.bench = bench
        self.meter: RunMeter | None = None
        self.result: Any = None
        self._tokens = 0

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, train_dataloader: Any = None,
                       **kwargs: Any) -> None:
        blocks = list(self.bench.workload.blocks)
        optim = str(getattr(args.optim, "value", args.optim))
        start, left = knobs_from_args(args, blocks, "fused" if optim.endswith("_fused") else "as-given")
        notes = ["knobs read from the TrainingArguments; channels_last, cpu_threads, optimizer kernels and your own "
                 "knobs are taken as their defaults", *(f"not a knob: {item}" for item in left)]
        device = next(model.parameters()).device if model is not None else torch.device(args.device)
        loader = train_dataloader if isinstance(train_dataloader, torch.utils.data.DataLoader) else None
        self.meter = RunMeter(knobs=Knobs(**start), device=device, framework="transformers", loader=loader,
                              warmup_steps=self.bench.warmup_steps, notes=notes)
        self._tokens = int(state.num_input_tokens_seen or 0)
        self.meter.start()

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.meter is not None and state.epoch:
            self.meter.mark("epoch start")

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.meter is not None:  # the Trainer fetched this step's batches just before
            self.meter.batch()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.meter is None:
            return
        seen = int(state.num_input_tokens_seen or 0)
        tokens, self._tokens = seen - self._tokens, seen
        self.meter.batch_done()
        samples = args.per_device_train_batch_size * args.gradient_accumulation_steps
        self.meter.step(samples=samples, tokens=tokens)

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.meter is not None:
            self.meter.pause()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.meter is not None:
            self.meter.pause()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.meter is None:
            return
        self.result = self.bench.log.append(self.meter.result())
        self.meter = None
