"""How a rank's model copy is wrapped for data parallelism: a `Strategy` seam with one strategy, DDP.

A strategy turns the rank's fresh model into the module the step calls, and says how to skip the
gradient synchronisation of a micro-batch (`no_sync`). FSDP2 (`torch.distributed.fsdp.fully_shard`)
would be a second strategy: it shards parameters instead of all-reducing gradients, and its
`no_sync` equivalent is `module.set_requires_gradient_sync(False)`. It is not implemented (gloo's
FSDP2 support has known bugs); the rank worker only talks to this interface.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import nn

from ..knobs import Knobs, ddp_options


class CommCounter:
    """A DDP communication hook that forwards to torch's own hook for the knob and counts.

    `calls` = bucket all-reduces launched, `bytes` = bytes sent into them (after compression).
    How much of the communication was hidden is measured separately (the no-comm probe, result.py).
    """

    def __init__(self, comm_hook: str) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        self.base = {"none": default_hooks.allreduce_hook, "fp16": default_hooks.fp16_compress_hook,
                     "bf16": default_hooks.bf16_compress_hook}[comm_hook]
        self.compressed_bytes = 2 if comm_hook in ("fp16", "bf16") else None
        self.reset()

    def reset(self) -> None:
        self.calls = 0
        self.bytes = 0

    def hook(self) -> Callable:
        """The function to register: DDP inspects its name (bf16 needs a recent NCCL) and its
        annotations (none here), so a plain function rather than this object."""

        def hook(state, bucket):
            return self(state, bucket)

        hook.__name__ = hook.__qualname__ = self.base.__name__
        return hook

    def __call__(self, state: Any, bucket: Any) -> torch.futures.Future:
        self.calls += 1
        buffer = bucket.buffer()
        self.bytes += buffer.numel() * (self.compressed_bytes or buffer.element_size())
        return self.base(state, bucket)  # no timing callback: it would add work to every bucket


class Strategy(Protocol):
    """What the rank worker needs from a data-parallel strategy."""

    name: str

    def wrap(self, model: nn.Module, knobs: Knobs, device: torch.device) -> nn.Module: ...

    def no_sync(self) -> contextlib.AbstractContextManager: ...


class DDPStrategy:
    """DistributedDataParallel with the ddp_* knobs and a counting communication hook."""

    name = "ddp"

    def __init__(self) -> None:
        self.module: nn.Module | None = None
        self.counter: CommCounter | None = None

    def wrap(self, model: nn.Module, knobs: Knobs, device: torch.device) -> nn.Module:
        from torch.nn.parallel import DistributedDataParallel as DDP

        kwargs = ddp_options(knobs)  # each ddp_* knob's declared ddp_kwargs hook (knobs.py)
        if device.type == "cuda":
            kwargs["device_ids"] = [device.index]
        self.module = DDP(model, **kwargs)  # broadcasts rank 0's parameters (all ranks hold the snapshot)
        self.counter = CommCounter(knobs.ddp_comm_hook)
        self.module.register_comm_hook(None, self.counter.hook())  # state None = the default process group
        return self.module

    def no_sync(self) -> contextlib.AbstractContextManager:
        assert self.module is not None, "wrap() first"
        return self.module.no_sync()


STRATEGIES: dict[str, Callable[[], Strategy]] = {"ddp": DDPStrategy}
