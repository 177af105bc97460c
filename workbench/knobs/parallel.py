"""The distributed knobs (world_size > 1: workbench/distributed/): DDP's constructor flags,
bucket size, gradient compression and no_sync; FSDP2's resharding, mixed precision, prefetch,
offload and shard units. `world_size` and `strategy` are structural (they choose the loop).

Run-time seams: `ddp_kwargs` (DistributedDataParallel's keywords) and `parallel` (the strategy's
options: comm_hook, no_sync, and FSDP2's fully_shard options), `check_run` (refusals that need the
device). Each knob's hooks, its note and its code hook sit together.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any

from ..system import usable_cores
from .spec import Context, function_source

COMM_HOOKS = ("none", "fp16", "bf16")
STRATEGIES = ("ddp", "fsdp2")
FSDP_DTYPES = ("fp32", "bf16")
COMM_HOOK_FN = {"fp16": "fp16_compress_hook", "bf16": "bf16_compress_hook"}
FSDP_TORCH_DTYPE = {"fp32": "None", "bf16": "torch.bfloat16"}  # None: FSDP2 keeps the parameters' own dtype


def ddp_note(name: str, default: Any) -> Callable[[Any, Context], str | None]:
    """A DDP knob changed while world_size == 1 is a note (and a disabled panel control), not an
    error: scaling() runs the same knobs at world_size 1 and N, and the panel lets a user set them
    before raising world_size. `default` is the knob's own (handed in: no registry lookup)."""

    def note(value: Any, ctx: Context) -> str | None:
        if ctx.knobs.world_size == 1 and value != default:
            return f"{name} is a no-op with world_size=1 (one process runs without DDP)"
        return None

    return note


def ddp_arg(name: str, arg: str, default: Any) -> tuple[Callable[[Any, Context], dict[str, Any]],
                                                         Callable[[Any], dict[str, list[str]]]]:
    """(ddp_kwargs hook, code hook) passing the knob to DistributedDataParallel as `arg` when it
    differs from DDP's own default (the knob's `default`)."""

    def kwargs(value: Any, ctx: Context) -> dict[str, Any]:
        return {} if value is None or value == default else {arg: value}

    def code(k: Any) -> dict[str, list[str]]:
        value = getattr(k, name)
        if k.world_size == 1 or value == default or value is None:
            return {}
        return {"ddp_args": [f"{arg}={value!r}"]}

    return kwargs, code


def broadcast_kwargs(value: bool, ctx: Context) -> dict[str, Any]:
    if value:
        return {}
    # torch >= 2.13 renames it forward_sync_buffers (for us the same: every rank starts from the
    # same snapshot, so the one sync at construction that forward_sync_buffers keeps changes nothing)
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    params = inspect.signature(DistributedDataParallel.__init__).parameters
    return {"forward_sync_buffers" if "forward_sync_buffers" in params else "broadcast_buffers": False}


def broadcast_code(k: Any) -> dict[str, list[str]]:
    if k.world_size == 1 or k.ddp_broadcast_buffers:
        return {}
    return {"ddp_args": ["broadcast_buffers=False  # forward_sync_buffers=False on torch >= 2.13"]}


# ---- ddp_comm_hook: compress gradients on the wire ------------------------------------------------------
def comm_hook_parallel(value: str, ctx: Context) -> dict[str, Any]:
    return {"comm_hook": value}


def comm_hook_check(value: str, ctx: Context) -> None:
    if value == "bf16" and ctx.knobs.world_size > 1 and ctx.device_type == "cpu":
        raise ValueError("ddp_comm_hook='bf16' needs NCCL 2.10+ on CUDA (DDP refuses it with gloo): use "
                         "ddp_comm_hook='fp16' on CPU")


def comm_hook_code(k: Any) -> dict[str, list[str]]:
    if k.world_size == 1 or k.ddp_comm_hook == "none":
        return {}
    return {"imports": ["from torch.distributed.algorithms.ddp_comm_hooks import default_hooks"],
            "ddp_model": [f"ddp_model.register_comm_hook(None, default_hooks.{COMM_HOOK_FN[k.ddp_comm_hook]})"
                          f"  # {k.ddp_comm_hook} on the wire"]}


# ---- world_size, strategy, ddp_no_sync ----------------------------------------------------------------
def world_size_note(value: int, ctx: Context) -> str | None:
    threads = (ctx.knobs.cpu_threads or 1) * value
    cores = usable_cores()  # affinity and container quota
    if value > 1 and ctx.device_type == "cpu" and threads > cores:
        return (f"world_size={value} x {ctx.knobs.cpu_threads or 1} thread(s) = {threads} threads on "
                f"{cores} cores: the ranks compete for cores (oversubscription)")
    return None


def no_sync_parallel(value: bool, ctx: Context) -> dict[str, Any]:
    """Micro-batches but the last skip DDP's all-reduce (FSDP2 always skips its reduce-scatter)."""
    return {"no_sync": value}


def no_sync_note(value: bool, ctx: Context) -> str | None:
    if ctx.knobs.world_size > 1 and value and ctx.knobs.accum_steps == 1:
        return "ddp_no_sync is a no-op with accum_steps=1 (every micro-batch ends an optimizer step)"
    return ddp_note("ddp_no_sync", False)(value, ctx)


def no_sync_code(k: Any) -> dict[str, list[str]]:
    return {"no_sync": ["ddp"]} if k.ddp_no_sync and k.world_size > 1 and k.accum_steps > 1 else {}


def strategy_note(value: str, ctx: Context) -> str | None:
    if ctx.knobs.world_size == 1 and value != "ddp":
        return f"strategy={value!r} is a no-op with world_size=1 (one process holds the whole model)"
    return None


def check_strategy(k: Any) -> None:
    """Refuse, with the fix, knobs of one data-parallel strategy set under the other."""
    changed = [f.name for f in fields(k) if f.name.startswith(("fsdp_", "ddp_")) and getattr(k, f.name) != f.default]
    fsdp = [n for n in changed if n.startswith("fsdp_")]
    ddp = [n for n in changed if n.startswith("ddp_")]
    if fsdp and k.world_size == 1:
        raise ValueError(f"{', '.join(fsdp)} shard the model across processes: set world_size >= 2 and "
                         "strategy='fsdp2', or leave them at their defaults")
    if fsdp and k.strategy != "fsdp2":
        raise ValueError(f"{', '.join(fsdp)} apply to FSDP2 only: set strategy='fsdp2', or leave them at their defaults")
    if k.strategy != "fsdp2" or k.world_size == 1:  # one process: both strategies are no-ops (notes)
        return
    if ddp:
        raise ValueError(f"{', '.join(ddp)} apply to DDP only: set them back to their defaults, or strategy='ddp'")
    if k.amp == "fp16":
        raise ValueError("amp='fp16' needs a GradScaler that understands sharded gradients, which the workbench does "
                         "not set up for FSDP2: use amp='bf16' or fsdp_param_dtype='bf16', or strategy='ddp'")
    if k.compile != "off":
        raise ValueError("compile with strategy='fsdp2' is not wired up yet (the workbench compiles the whole "
                         "wrapped model; FSDP2 wants each block compiled before fully_shard, as torchtitan does, and "
                         "that order is untested here): set compile='off', or strategy='ddp'")


# ---- FSDP2: fully_shard's options, one knob each (distributed/strategy.py applies the merged dict) ------------
def fsdp_option(key: str, convert: Callable[[Any], Any] = lambda v: v) -> Callable[[Any, Context], dict[str, Any]]:
    """The `parallel` hook handing FSDP2 one option (`key`: the value, converted)."""

    def option(value: Any, ctx: Context) -> dict[str, Any]:
        return {key: convert(value)}

    return option


def torch_dtype(name: str) -> Any:
    """fsdp_*_dtype -> the torch dtype for MixedPrecisionPolicy (None: keep the parameters' own)."""
    import torch

    return {"fp32": None, "bf16": torch.bfloat16}[name]


def offload_option(value: bool, ctx: Context) -> dict[str, Any]:
    return {"cpu_offload": value and ctx.device_type == "cuda"}


def offload_note(value: bool, ctx: Context) -> str | None:
    if value and ctx.device_type != "cuda":
        return "fsdp_cpu_offload is a no-op without a GPU (the sharded parameters already live in CPU memory)"
    return None


def fsdp_code(k: Any) -> dict[str, list[str]]:
    """strategy='fsdp2': the imports and the default shard units (bench.blocks' rule, as a function)."""
    if k.world_size == 1 or k.strategy != "fsdp2":
        return {}
    from ..workload import blocks_of

    out = {"imports": ["from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard"]}
    if not k.fsdp_shard:
        out["imports"].append("from torch import nn  # blocks_of")
        out["functions"] = [function_source(blocks_of)]
    return out


def fsdp_piece(name: str, section: str, render: Callable[[Any], str | None]) -> Callable[[Any], dict[str, list[str]]]:
    """The code hook of one fsdp_* knob: its piece of the FSDP2 section (codegen lays the section out)."""

    def code(k: Any) -> dict[str, list[str]]:
        if k.world_size == 1 or k.strategy != "fsdp2":
            return {}
        text = render(getattr(k, name))
        return {section: [text]} if text else {}

    return code


RESHARD_CODE = fsdp_piece("fsdp_reshard_after_forward", "fsdp_options", lambda v: f"reshard_after_forward={v}")
PARAM_DTYPE_CODE = fsdp_piece("fsdp_param_dtype", "fsdp_mp", lambda v: f"param_dtype={FSDP_TORCH_DTYPE[v]}")
REDUCE_DTYPE_CODE = fsdp_piece("fsdp_reduce_dtype", "fsdp_mp", lambda v: f"reduce_dtype={FSDP_TORCH_DTYPE[v]}")
UNITS_CODE = fsdp_piece("fsdp_shard", "fsdp_units", lambda v: f"[{{model}}.get_submodule(n) for n in {list(v)!r}]"
                        if v else "[{model}.get_submodule(n) for n in blocks_of({model})]  # the blocks bench.blocks finds")


def prefetch_code(k: Any) -> dict[str, list[str]]:
    if k.world_size == 1 or k.strategy != "fsdp2" or k.fsdp_prefetch is None:
        return {}
    n = k.fsdp_prefetch
    return {"fsdp_after": [f"for i, unit in enumerate(units):  # prefetch {n} unit(s) ahead in forward and in backward",
                           f"    unit.set_modules_to_forward_prefetch(units[i + 1:i + 1 + {n}])",
                           f"    unit.set_modules_to_backward_prefetch(units[max(0, i - {n}):i][::-1])"]}


def offload_code(k: Any) -> dict[str, list[str]]:
    if k.world_size == 1 or k.strategy != "fsdp2" or not k.fsdp_cpu_offload:
        return {}
    return {"imports": ["from torch.distributed.fsdp import CPUOffloadPolicy"],
            "fsdp_before": ['if device.type == "cuda":  # offload parameters, gradients and optimizer state to the CPU',
                            '    fsdp_options["offload_policy"] = CPUOffloadPolicy()']}
