"""Turn Knobs into the concrete objects of one trial: DataLoader, autocast, GradScaler, compiled
model, checkpointed blocks, thread and matmul settings. Each function does one knob's job."""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader

from .knobs import Knobs
from .knobs import settings as knob_settings
from .workload import LoaderSpec

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def build_loader(spec: LoaderSpec, knobs: Knobs, *, seed: int, device: torch.device, timeout_s: float = 0,
                 sampler: Any = None) -> DataLoader:
    """A DataLoader over the user's dataset with the knobs' settings and a seeded data order.

    The generator fixes both the shuffle order and the workers' base seeds, so every trial with
    the same seed sees the same batches in the same order. `sampler` replaces the spec's sampler
    and shuffle (a DistributedSampler: each rank reads its own shard).
    """
    generator = torch.Generator().manual_seed(seed)
    kwargs: dict[str, Any] = dict(
        batch_size=knobs.batch_size,
        num_workers=knobs.num_workers,
        collate_fn=spec.collate_fn,
        drop_last=spec.drop_last,
        generator=generator,
        # pin_memory only means something when there is a device to copy to.
        pin_memory=knobs.pin_memory and device.type in ("cuda", "xpu"),
    )
    if not spec.iterable:
        if sampler is not None:
            kwargs["sampler"] = sampler
        elif spec.sampler is not None:
            kwargs["sampler"] = spec.sampler
        else:
            kwargs["shuffle"] = spec.shuffle
    if knobs.num_workers > 0:
        kwargs["persistent_workers"] = knobs.persistent_workers
        if knobs.prefetch_factor is not None:
            kwargs["prefetch_factor"] = knobs.prefetch_factor
        if timeout_s:
            kwargs["timeout"] = timeout_s  # a hung worker becomes an error, not a frozen notebook
    return DataLoader(spec.dataset, **kwargs)


def autocast(knobs: Knobs, device: torch.device) -> contextlib.AbstractContextManager:
    """The autocast context for the forward pass and loss (a null context when amp='off')."""
    if knobs.amp == "off":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=AMP_DTYPES[knobs.amp])


def grad_scaler(knobs: Knobs, device: torch.device) -> torch.amp.GradScaler | None:
    """A GradScaler for fp16 (its small range underflows gradients); bf16 and fp32 need none."""
    if knobs.amp != "fp16":
        return None
    return torch.amp.GradScaler(device.type)


def apply_checkpointing(model: nn.Module, names: tuple[str, ...], available: dict[str, int],
                        **options: Any) -> None:
    """Wrap exactly the named blocks' forward in torch.utils.checkpoint (use_reentrant=False).

    Their activations are dropped after forward and recomputed during backward: less memory,
    more compute. The module tree and parameter names stay unchanged. `options` are further
    keywords for checkpoint (e.g. a context_fn for selective checkpointing).
    """
    for name in names:
        if name not in available:
            raise ValueError(
                f"checkpoint names unknown block {name!r}; choose from bench.blocks: "
                f"{', '.join(available) or '(none found)'}"
            )
        block = model.get_submodule(name)
        original = block.forward

        @functools.wraps(original)
        def forward(*args: Any, __original=original, **kwargs: Any) -> Any:
            if not torch.is_grad_enabled():
                return __original(*args, **kwargs)
            return checkpoint(__original, *args, use_reentrant=False, **options, **kwargs)

        block.forward = forward  # instance attribute shadows the class method


def remove_checkpointing(model: nn.Module | None, names: tuple[str, ...]) -> None:
    """Undo `apply_checkpointing` (the wrapper refers back to its block: a reference cycle)."""
    if model is None:
        return
    for name in names:
        model.get_submodule(name).__dict__.pop("forward", None)


def compile_model(model: nn.Module, knobs: Knobs, device: torch.device) -> nn.Module:
    """torch.compile with the knob's mode; reduce-overhead (CUDA graphs) falls back to default off CUDA."""
    if knobs.compile == "off":
        return model
    mode = knobs.compile
    if mode == "reduce-overhead" and device.type != "cuda":
        mode = "default"
    return torch.compile(model, mode=None if mode == "default" else mode)


def process_settings(knobs: Knobs) -> contextlib.AbstractContextManager:
    """Hold the knobs' process-wide settings (threads, matmul precision...) for the trial,
    restoring the caller's afterwards; each knob declares its own in knobs.py."""
    return knob_settings(knobs)
