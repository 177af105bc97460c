"""A bare training step outside the measured trial, for the analyses that instrument one step
(profiler ranges, FLOP counting, memory breakdown, per-block activations).

It applies the same knobs as `runner.run_trial` (fresh model, channels_last, checkpointing,
autocast, GradScaler, accumulation, threads) except torch.compile: instrumenting a compiled step
measures the compiler, not the model, so these analyses always run eager.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.profiler import record_function

from .. import apply
from ..knobs import Knobs
from ..runner import _check_loss, _seeded, _Stage
from ..workload import Workload, move_to


class Rig:
    """Model, optimizer, scaler and a cycling loader built from one workload and one Knobs."""

    def __init__(self, workload: Workload, knobs: Knobs) -> None:
        self.workload = workload
        self.knobs = knobs
        self.device = workload.device
        self.model = workload.fresh_model()
        if knobs.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        apply.apply_checkpointing(self.model, knobs.checkpoint, workload.blocks)
        self.model.train()
        self.optimizer = workload.check_optimizer(self.model)
        self.scaler = apply.grad_scaler(knobs, self.device)
        self.loader = apply.build_loader(workload.spec, knobs.replace(data="loader"), seed=workload.seed,
                                         device=self.device, timeout_s=120 if knobs.num_workers else 0)
        self._it: Iterator | None = None
        self._stage = _Stage()

    def next_batch(self) -> Any:
        """The next batch on the device (restarting the loader at the end of an epoch)."""
        if self._it is None:
            self._it = iter(self.loader)
        try:
            batch = next(self._it)
        except StopIteration:
            self._it = iter(self.loader)
            batch = next(self._it)
        return move_to(batch, self.device, channels_last=self.knobs.channels_last)

    def forward_backward(self, batch: Any) -> torch.Tensor:
        """Forward + loss + backward of one micro-batch; returns the detached loss."""
        with record_function("forward"), apply.autocast(self.knobs, self.device):
            loss = self.workload.compute_loss(self.model, batch, self._stage)
        _check_loss(loss, self._stage)
        with record_function("backward"):
            scaled = loss / self.knobs.accum_steps
            (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
        return loss.detach()

    def optimizer_step(self) -> None:
        with record_function("optimizer"):
            if self.scaler is not None:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)

    def step(self) -> None:
        """One optimizer step (accum_steps micro-batches) with record_function ranges per stage."""
        for _ in range(self.knobs.accum_steps):
            with record_function("data"):
                batch = self.next_batch()
            self.forward_backward(batch)
        self.optimizer_step()

    def close(self) -> None:
        apply.shutdown_loader(self.loader, self._it)
        self._it = None


@contextlib.contextmanager
def rig(workload: Workload, knobs: Knobs) -> Iterator[Rig]:
    """A Rig under the knobs' thread/precision settings and the workload's seed, cleaned up after."""
    with apply.process_settings(knobs), _seeded(workload.seed):
        r = Rig(workload, knobs)
        try:
            yield r
        finally:
            r.close()
