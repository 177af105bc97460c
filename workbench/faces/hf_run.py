"""`wb.TrainerCallback(bench)`: a Hugging Face `Trainer.train()` measured with the workbench's rules,
as a row of `bench.results` marked "real run" (see realrun.py for what is measured and how).

    trainer = Trainer(model=model, args=TrainingArguments(**bench.to_training_arguments(best), ...),
                      train_dataset=ds, data_collator=collator, callbacks=[wb.TrainerCallback(bench)])
    trainer.train()
    bench.compare(best, bench.trials[-1])

The Trainer shows its callbacks no batch: samples per step are the Trainer's train batch size (per device,
times the GPUs of a DataParallel process) x gradient_accumulation_steps, summed over the ranks under DDP,
and tokens come from `state.num_input_tokens_seen` when the arguments count them
(include_num_input_tokens_seen). Evaluation and checkpoint saves between steps are left out of the
measured window, with their seconds in the row's notes; under DDP rank zero writes the one row. This
module imports transformers at its top: `workbench` imports it only when `wb.TrainerCallback` is used.
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
        mode = str(getattr(args.parallel_mode, "value", args.parallel_mode))
        if mode == "distributed" and args.world_size > 1 and not (getattr(args, "fsdp", None) or args.deepspeed):
            start.update(world_size=int(args.world_size), strategy="ddp")
        elif mode == "not_distributed":  # one process driving its GPUs with torch.nn.DataParallel
            notes.append(f"DataParallel over {args.n_gpu} GPUs: a step's samples are {args.n_gpu} x the per-device "
                         "batch; trials have no DataParallel knob (world_size runs one process per GPU)")
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
        per_process = getattr(state, "train_batch_size", None) or args.train_batch_size  # x n_gpu (DataParallel)
        self.meter.step(samples=per_process * args.gradient_accumulation_steps, tokens=tokens)

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.meter is not None:  # called once the evaluation is done: it ran since the step (or save) ended
            self.meter.pause("evaluation", under_way=True)
            self.meter.resume()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.meter is not None:  # called once the checkpoint is written
            self.meter.pause("checkpoint saving", under_way=True)
            self.meter.resume()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.meter is None:
            return
        row = self.meter.combine_ranks()  # a collective under DDP: every rank's on_train_end runs it
        self.meter = None
        if row is not None:
            self.result = self.bench.log.append(row)
