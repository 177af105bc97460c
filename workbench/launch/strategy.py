"""The data-parallel strategy seam: how a rank wraps its model copy. DDP and FSDP2.

A strategy turns the rank's fresh model into the module the step calls, and says how to skip the
gradient synchronisation of a micro-batch (`no_sync`). DDP replicates the model and all-reduces
gradients in buckets. FSDP2 (`torch.distributed.fsdp.fully_shard`) shards parameters, gradients
and optimizer state across the ranks: each shard unit all-gathers its parameters before its
forward and backward and reduce-scatters its gradients; its `no_sync` is
`module.set_requires_gradient_sync(False)`. FSDP2 replaces the parameters with sharded DTensors,
so the optimizer is built again after `wrap` (`rebuild_optimizer`). The rank worker only talks to
this interface.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import nn

from ..core.knobs import Knobs, ddp_options


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
    rebuild_optimizer: bool  # wrap() replaced the parameters: build the optimizer again on the module
    counter: Any  # .calls, .bytes, .reset(): the gradient all-reduces it launched

    def wrap(self, model: nn.Module, knobs: Knobs, device: torch.device, options: dict[str, Any]) -> nn.Module: ...

    def no_sync(self) -> contextlib.AbstractContextManager: ...


class DDPStrategy:
    """DistributedDataParallel with the ddp_* knobs and a counting communication hook."""

    name = "ddp"
    rebuild_optimizer = False

    def __init__(self, blocks: Any = ()) -> None:
        self.module: nn.Module | None = None
        self.counter: CommCounter | None = None

    def wrap(self, model: nn.Module, knobs: Knobs, device: torch.device, options: dict[str, Any]) -> nn.Module:
        """DDP with the ddp_* knobs' keywords; `options` (registry.parallel_options) names the comm hook."""
        from torch.nn.parallel import DistributedDataParallel as DDP

        kwargs = ddp_options(knobs)  # each ddp_* knob's declared ddp_kwargs hook (core/knobs/parallel.py)
        if device.type == "cuda":
            kwargs["device_ids"] = [device.index]
        self.module = DDP(model, **kwargs)  # broadcasts rank 0's parameters (all ranks hold the snapshot)
        self.counter = CommCounter(options.get("comm_hook", "none"))
        self.module.register_comm_hook(None, self.counter.hook())  # state None = the default process group
        return self.module

    def no_sync(self) -> contextlib.AbstractContextManager:
        assert self.module is not None, "wrap() first"
        return self.module.no_sync()


class NoAllReduce:
    """FSDP2 all-gathers parameters and reduce-scatters gradients: it launches no all-reduce."""

    calls = 0
    bytes = 0

    def reset(self) -> None:
        """Nothing to reset."""


class FSDP2Strategy:
    """fully_shard on each shard unit (fsdp_shard, else the workload's blocks), deepest first, then
    on the root, with the fsdp_* knobs; checkpoint wrappers are already on the blocks (torchtitan's
    order: checkpoint, then shard)."""

    name = "fsdp2"
    rebuild_optimizer = True

    def __init__(self, blocks: Any = ()) -> None:
        self.blocks = tuple(blocks)  # the workload's blocks (bench.blocks): the default shard units
        self.module: nn.Module | None = None
        self.counter = NoAllReduce()

    def wrap(self, model: nn.Module, knobs: Knobs, device: torch.device, options: dict[str, Any]) -> nn.Module:
        """fully_shard with the fsdp_* knobs' options (registry.parallel_options: units, param_dtype,
        reduce_dtype, cpu_offload, reshard_after_forward, prefetch)."""
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

        names = list(options.get("units") or self.blocks)
        units = [model.get_submodule(n) for n in names]
        mp = MixedPrecisionPolicy(param_dtype=options.get("param_dtype"), reduce_dtype=options.get("reduce_dtype"))
        offload = CPUOffloadPolicy() if options.get("cpu_offload") else OffloadPolicy()
        shard = dict(reshard_after_forward=options.get("reshard_after_forward", True), mp_policy=mp,
                     offload_policy=offload)
        for _, unit in sorted(zip(names, units), key=lambda nu: -nu[0].count(".")):  # inner units first
            fully_shard(unit, **shard)
        # the root: whatever no unit holds (embeddings, head, norms); None = FSDP2's own choice for a root,
        # no reshard after forward (backward needs its parameters at once), as in a bare FSDP2 loop
        fully_shard(model, **{**shard, "reshard_after_forward": None})
        n = options.get("prefetch")
        if n is not None:
            for i, unit in enumerate(units):
                unit.set_modules_to_forward_prefetch(units[i + 1:i + 1 + n])
                unit.set_modules_to_backward_prefetch(units[max(0, i - n):i][::-1])
        self.module = model
        return model

    def no_sync(self) -> contextlib.AbstractContextManager:
        assert self.module is not None, "wrap() first"
        return _gradient_sync_off(self.module)


@contextlib.contextmanager
def _gradient_sync_off(module: Any) -> Any:
    """FSDP2's no_sync: no reduce-scatter for the backward passes inside (gradients accumulate unsharded)."""
    module.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        module.set_requires_gradient_sync(True)


STRATEGIES: dict[str, Callable[..., Strategy]] = {"ddp": DDPStrategy, "fsdp2": FSDP2Strategy}
