"""The memory knobs: activation checkpointing (which blocks, full or selective) and gradient
clipping. `accum_steps` is structural (the loop reads it). Each knob's run-time hook, its note
and its code hook sit together."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from .spec import Context, Fuzz, declare

CHECKPOINT_MODES = ("full", "selective")
# Selective checkpointing keeps the outputs of these (expensive) ops and recomputes the rest.
SAVED_OPS = (
    "mm",
    "addmm",
    "bmm",
    "baddbmm",
    "convolution",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
)


# ---- checkpoint: the named blocks recompute their activations in backward --------------------------
def checkpoint_model(model: Any, value: tuple[str, ...], ctx: Context) -> None:
    """Wrap exactly the named blocks' forward in torch.utils.checkpoint (use_reentrant=False).

    Their activations are dropped after forward and recomputed during backward: less memory, more
    compute. The module tree and parameter names stay unchanged. `ctx.checkpoint_kwargs` holds the
    further keywords other knobs' checkpoint_kwargs hooks give (checkpoint_mode's selective context_fn).
    """
    import torch
    from torch.utils.checkpoint import checkpoint

    options = ctx.checkpoint_kwargs
    for name in value:
        if name not in ctx.blocks:
            raise ValueError(
                f"checkpoint names unknown block {name!r}; choose from bench.blocks: "
                f"{', '.join(ctx.blocks) or '(none found)'}"
            )
        block = model.get_submodule(name)
        original = block.forward

        @functools.wraps(original)
        def forward(*args: Any, __original=original, **kwargs: Any) -> Any:
            if not torch.is_grad_enabled():
                return __original(*args, **kwargs)
            return checkpoint(__original, *args, use_reentrant=False, **options, **kwargs)

        block.forward = forward  # instance attribute shadows the class method


def checkpoint_release(model: Any, value: tuple[str, ...], ctx: Context) -> None:
    """Undo `checkpoint_model` (the wrapper refers back to its block: a reference cycle)."""
    for name in value:
        model.get_submodule(name).__dict__.pop("forward", None)


CHECKPOINT_HELPER = "\n".join(
    [
        "def checkpointed(forward, **options):",
        '    """Recompute this block\'s activations in backward instead of storing them."""',
        "    def run(*args, **kwargs):",
        "        if not torch.is_grad_enabled():",
        "            return forward(*args, **kwargs)",
        "        return checkpoint(forward, *args, use_reentrant=False, **options, **kwargs)",
        "    return run",
    ]
)


def checkpoint_code(k: Any) -> dict[str, list[str]]:
    if not k.checkpoint:
        return {}
    selective = (
        ", context_fn=functools.partial(create_selective_checkpoint_contexts, SAVED_OPS)"
        if k.checkpoint_mode == "selective"
        else ""
    )
    return {
        "imports": ["from torch.utils.checkpoint import checkpoint"],
        "functions": [CHECKPOINT_HELPER],
        "model": [
            f"for name in {list(k.checkpoint)!r}:",
            "    block = {model}.get_submodule(name)",
            f"    block.forward = checkpointed(block.forward{selective})",
        ],
    }


# ---- checkpoint_mode: full or selective recomputation ---------------------------------------------------
def selective_options(value: str, ctx: Context | None = None) -> dict[str, Any]:
    """checkpoint(...) keywords: selective = save matmul/conv/attention outputs, recompute cheap ops."""
    if value == "full":
        return {}
    import torch
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    ops = [getattr(torch.ops.aten, n).default for n in SAVED_OPS if hasattr(torch.ops.aten, n)]
    return {"context_fn": functools.partial(create_selective_checkpoint_contexts, ops)}


def selective_note(value: str, ctx: Context) -> str | None:
    if value == "selective" and not ctx.knobs.checkpoint:
        return "checkpoint_mode='selective' is a no-op without checkpointed blocks (pick some in checkpoint)"
    return None


def selective_inert(value: str, ctx: Context) -> str | None:
    return None if ctx.knobs.checkpoint else "no block is checkpointed (checkpoint=()), so nothing is recomputed"


def selective_code(k: Any) -> dict[str, list[str]]:
    if k.checkpoint_mode == "full" or not k.checkpoint:
        return {}
    return {
        "imports": ["import functools", "from torch.utils.checkpoint import create_selective_checkpoint_contexts"],
        "setup": [
            "# selective checkpointing: keep matmul/conv/attention outputs, recompute the cheap ops",
            f"SAVED_OPS = [getattr(torch.ops.aten, n).default for n in {list(SAVED_OPS)!r} "
            "if hasattr(torch.ops.aten, n)]",
        ],
    }


# ---- grad_clip_norm -------------------------------------------------------------------------------------
def clip_before_step(value: float | None, model: Any, optimizer: Any, ctx: Context) -> None:
    if value is not None:
        import torch

        torch.nn.utils.clip_grad_norm_(model.parameters(), value)


def clip_code(k: Any) -> dict[str, list[str]]:
    clip = f"torch.nn.utils.clip_grad_norm_({{model}}.parameters(), {k.grad_clip_norm})"
    return {} if k.grad_clip_norm is None else {"before_step": [clip]}


# ---- the declarations: Knobs (value.py) inherits these fields, in this order ---------------------------
@dataclass(frozen=True, init=False)
class MemoryKnobs:
    """The memory knobs, declared once each (Knobs inherits these fields)."""

    accum_steps: int = declare(1, interleave=True, kind="int", minimum=1, group="Memory", widget="int", maximum=1024,
        fuzz=Fuzz(range(1, 4), (0,)),
        help="micro-batches per optimizer step (gradient accumulation): a large batch in small memory")
    checkpoint: tuple[str, ...] = declare((), interleave=True, on_model=checkpoint_model, release=checkpoint_release,
        code=checkpoint_code, kind="blocks", group="Memory", widget="blocks",
        fuzz=Fuzz("blocks", ("no.such.block", "")),
        help="block names wrapped in torch.utils.checkpoint: recompute activations in backward")
    checkpoint_mode: str = declare("full", interleave=True, kind="choice", choices=CHECKPOINT_MODES, group="Memory", widget="dropdown",
        probe="selective", checkpoint_kwargs=selective_options, note=selective_note, inert=selective_inert, code=selective_code,
        fuzz=Fuzz(CHECKPOINT_MODES, ("some",)),
        help="full = recompute everything in checkpointed blocks; selective = keep "
        "matmul/conv outputs, recompute the cheap ops")
    grad_clip_norm: float | None = declare(None, interleave=True, kind="float", minimum=0.0, optional=True, group="Memory",
        widget="dropdown", options=(None, 0.5, 1.0, 5.0), before_step=clip_before_step, code=clip_code,
        fuzz=Fuzz((None, 0.5, 1.0), (-1.0,)), help="clip the gradients' total norm before each optimizer step")
