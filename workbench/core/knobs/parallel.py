"""The distributed knobs (world_size > 1: workbench/launch/): DDP's constructor flags,
bucket size, gradient compression and no_sync; FSDP2's resharding, mixed precision, prefetch,
offload and shard units. `world_size` and `strategy` are structural (they choose the loop).

Run-time seams: `ddp_kwargs` (DistributedDataParallel's keywords) and `parallel` (the strategy's
options: comm_hook, no_sync, and FSDP2's fully_shard options), `check_run` (refusals that need the
device). Each knob's hooks, its note and its code hook sit together.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from ..system import usable_cores
from .spec import Context, Fuzz, declare, function_source

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


def one_process(value: Any, ctx: Context) -> str | None:
    """The distributed knobs' `inert` hook: with world_size=1 one process runs the step, without DDP or FSDP2."""
    return "world_size=1: one process runs the step, without DDP or FSDP2" if ctx.knobs.world_size == 1 else None


def ddp_arg(
    name: str, arg: str, default: Any
) -> tuple[Callable[[Any, Context], dict[str, Any]], Callable[[Any], dict[str, list[str]]]]:
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
        raise ValueError(
            "ddp_comm_hook='bf16' needs NCCL 2.10+ on CUDA (DDP refuses it with gloo): use ddp_comm_hook='fp16' on CPU"
        )


def comm_hook_code(k: Any) -> dict[str, list[str]]:
    if k.world_size == 1 or k.ddp_comm_hook == "none":
        return {}
    return {
        "imports": ["from torch.distributed.algorithms.ddp_comm_hooks import default_hooks"],
        "ddp_model": [
            f"ddp_model.register_comm_hook(None, default_hooks.{COMM_HOOK_FN[k.ddp_comm_hook]})"
            f"  # {k.ddp_comm_hook} on the wire"
        ],
    }


# ---- world_size, strategy, ddp_no_sync ----------------------------------------------------------------
def world_size_note(value: int, ctx: Context) -> str | None:
    threads = (ctx.knobs.cpu_threads or 1) * value
    cores = usable_cores()  # affinity and container quota
    if value > 1 and ctx.device_type == "cpu" and threads > cores:
        return (
            f"world_size={value} x {ctx.knobs.cpu_threads or 1} thread(s) = {threads} threads on "
            f"{cores} cores: the ranks compete for cores (oversubscription)"
        )
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


def strategy_check(value: str, ctx: Context) -> None:
    """strategy='fsdp2' needs FSDP2's `torch.distributed.fsdp.fully_shard` (public from torch 2.6 on): an
    older torch is refused before any process starts, naming the fix."""
    if value != "fsdp2" or ctx.knobs.world_size == 1:
        return
    import importlib

    import torch

    if not hasattr(importlib.import_module("torch.distributed.fsdp"), "fully_shard"):
        raise ValueError(
            f"strategy='fsdp2' needs torch.distributed.fsdp.fully_shard (torch >= 2.6); this torch is "
            f"{torch.__version__}: upgrade torch (pip install 'torch>=2.6'), or use strategy='ddp'"
        )


def check_strategy(k: Any) -> None:
    """Refuse, with the fix, knobs of one data-parallel strategy set under the other."""
    changed = [f.name for f in fields(k) if f.name.startswith(("fsdp_", "ddp_")) and getattr(k, f.name) != f.default]
    fsdp = [n for n in changed if n.startswith("fsdp_")]
    ddp = [n for n in changed if n.startswith("ddp_")]
    if fsdp and k.world_size == 1:
        raise ValueError(
            f"{', '.join(fsdp)} shard the model across processes: set world_size >= 2 and "
            "strategy='fsdp2', or leave them at their defaults"
        )
    if fsdp and k.strategy != "fsdp2":
        raise ValueError(
            f"{', '.join(fsdp)} apply to FSDP2 only: set strategy='fsdp2', or leave them at their defaults"
        )
    if k.strategy != "fsdp2" or k.world_size == 1:  # one process: both strategies are no-ops (notes)
        return
    if ddp:
        raise ValueError(f"{', '.join(ddp)} apply to DDP only: set them back to their defaults, or strategy='ddp'")
    if k.amp == "fp16":
        raise ValueError(
            "amp='fp16' needs a GradScaler that understands sharded gradients, which the workbench does "
            "not set up for FSDP2: use amp='bf16' or fsdp_param_dtype='bf16', or strategy='ddp'"
        )
    if k.compile != "off":
        raise ValueError(
            "compile with strategy='fsdp2' is not wired up yet (the workbench compiles the whole "
            "wrapped model; FSDP2 wants each block compiled before fully_shard, as torchtitan does, and "
            "that order is untested here): set compile='off', or strategy='ddp'"
        )


# ---- FSDP2: fully_shard's options, one knob each (launch/strategy.py applies the merged dict) ------------
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
UNITS_CODE = fsdp_piece(
    "fsdp_shard",
    "fsdp_units",
    lambda v: (
        f"[{{model}}.get_submodule(n) for n in {list(v)!r}]"
        if v
        else "[{model}.get_submodule(n) for n in blocks_of({model})]  # the blocks bench.blocks finds"
    ),
)


def prefetch_code(k: Any) -> dict[str, list[str]]:
    if k.world_size == 1 or k.strategy != "fsdp2" or k.fsdp_prefetch is None:
        return {}
    n = k.fsdp_prefetch
    return {
        "fsdp_after": [
            f"for i, unit in enumerate(units):  # prefetch {n} unit(s) ahead in forward and in backward",
            f"    unit.set_modules_to_forward_prefetch(units[i + 1:i + 1 + {n}])",
            f"    unit.set_modules_to_backward_prefetch(units[max(0, i - {n}):i][::-1])",
        ]
    }


def offload_code(k: Any) -> dict[str, list[str]]:
    if k.world_size == 1 or k.strategy != "fsdp2" or not k.fsdp_cpu_offload:
        return {}
    return {
        "imports": ["from torch.distributed.fsdp import CPUOffloadPolicy"],
        "fsdp_before": [
            'if device.type == "cuda":  # offload parameters, gradients and optimizer state to the CPU',
            '    fsdp_options["offload_policy"] = CPUOffloadPolicy()',
        ],
    }


BUCKET = ddp_arg("ddp_bucket_cap_mb", "bucket_cap_mb", None)


def ddp_flag(name: str, arg: str, *, help: str) -> Any:
    """A DDP constructor flag as a knob (default False): a checkbox in "Distributed", passed as
    DDP(..., arg=True), a note while world_size == 1."""
    kwargs, code = ddp_arg(name, arg, False)
    return declare(
        False,
        kind="bool",
        group="Distributed",
        widget="checkbox",
        probe=True,
        note=ddp_note(name, False),
        inert=one_process,
        ddp_kwargs=kwargs,
        code=code,
        fuzz=Fuzz((False, True)),
        help=help,
    )


# ---- the declarations: Knobs (value.py) inherits these fields, in this order ---------------------------
@dataclass(frozen=True, init=False)
class ParallelKnobs:
    """The distributed knobs, declared once each (Knobs inherits these fields)."""

    world_size: int = declare(1, kind="int", minimum=1, group="Distributed", widget="dropdown", options=(1, 2, 4),
        note=world_size_note, fuzz=Fuzz((1,), (0, -1)),
        help="processes under DDP or FSDP2 (see strategy): one per GPU (NCCL), or gloo CPU "
        "processes with 1 thread each unless cpu_threads says otherwise")
    strategy: str = declare("ddp", kind="choice", choices=STRATEGIES, group="Distributed", widget="dropdown",
        probe="fsdp2", note=strategy_note, check_run=strategy_check, inert=one_process, code=fsdp_code, fuzz=Fuzz(STRATEGIES, ("fsdp", "zero3")),
        help='data parallelism at world_size > 1: "ddp" replicates the model and all-reduces '
        'gradients; "fsdp2" shards parameters, gradients and optimizer state (fully_shard, torch >= 2.6)')
    ddp_no_sync: bool = declare(False, kind="bool", group="Distributed", widget="checkbox", probe=True,
        parallel=no_sync_parallel, note=no_sync_note, inert=one_process, code=no_sync_code, fuzz=Fuzz((False, True)),
        help="skip the gradient all-reduce on all but the last accumulation micro-batch")
    ddp_bucket_cap_mb: int | None = declare(None, kind="int", minimum=1, optional=True, group="Distributed",
        widget="dropdown", options=(None, 1, 5, 25, 100), probe=5, note=ddp_note("ddp_bucket_cap_mb", None), inert=one_process,
        ddp_kwargs=BUCKET[0], code=BUCKET[1], fuzz=Fuzz((None, 1, 25), (0,)),
        help="DDP gradient bucket size in MB; None = torch's 25 (the first bucket "
        "is 1 MB); bigger = fewer all-reduces, later start")
    ddp_comm_hook: str = declare("none", kind="choice", choices=COMM_HOOKS, group="Distributed", widget="dropdown",
        probe="fp16", note=ddp_note("ddp_comm_hook", "none"), inert=one_process, parallel=comm_hook_parallel, check_run=comm_hook_check,
        code=comm_hook_code, fuzz=Fuzz(COMM_HOOKS, ("int8",)),
        help='compress gradients before the all-reduce; "bf16" needs NCCL on CUDA (gloo refuses it), "fp16" runs on both')
    ddp_gradient_as_bucket_view: bool = ddp_flag("ddp_gradient_as_bucket_view", "gradient_as_bucket_view",
        help="gradients are views into the all-reduce buckets: one copy less")
    ddp_static_graph: bool = ddp_flag("ddp_static_graph", "static_graph",
        help="DDP static_graph=True: the same parameters get gradients every step")
    ddp_find_unused_parameters: bool = ddp_flag("ddp_find_unused_parameters", "find_unused_parameters",
        help="DDP walks the graph each step for parameters without gradients")
    ddp_broadcast_buffers: bool = declare(True, kind="bool", group="Distributed", widget="checkbox", probe=False,
        note=ddp_note("ddp_broadcast_buffers", True), inert=one_process, ddp_kwargs=broadcast_kwargs, code=broadcast_code,
        fuzz=Fuzz((True, False)), help="DDP broadcasts rank 0's buffers (BatchNorm statistics) every forward")
    fsdp_reshard_after_forward: bool = declare(True, parallel=fsdp_option("reshard_after_forward"), code=RESHARD_CODE,
        kind="bool", group="Distributed", widget="checkbox", probe=False, fuzz=Fuzz((True,), ("yes",)),
        help="FSDP2 frees each shard unit's gathered parameters after forward "
        "and gathers them again in backward (less memory, more "
        "communication); the root follows FSDP2's default")
    fsdp_param_dtype: str = declare("fp32", parallel=fsdp_option("param_dtype", torch_dtype), code=PARAM_DTYPE_CODE,
        kind="choice", choices=FSDP_DTYPES, group="Distributed", widget="dropdown", probe="bf16",
        fuzz=Fuzz(("fp32",), ("fp16",)),
        help="FSDP2 MixedPrecisionPolicy: dtype of the gathered parameters for compute")
    fsdp_reduce_dtype: str = declare("fp32", parallel=fsdp_option("reduce_dtype", torch_dtype),
        code=REDUCE_DTYPE_CODE, kind="choice", choices=FSDP_DTYPES, group="Distributed", widget="dropdown",
        probe="bf16", fuzz=Fuzz(("fp32",), ("fp16",)),
        help="FSDP2 MixedPrecisionPolicy: dtype of the gradient reduce-scatter")
    fsdp_prefetch: int | None = declare(None, parallel=fsdp_option("prefetch"), code=prefetch_code, kind="int",
        minimum=0, optional=True, group="Distributed", widget="dropdown", options=(None, 0, 1, 2), probe=1,
        fuzz=Fuzz((None,), (-1,)),
        help="FSDP2 units gathered ahead in forward and backward; None = FSDP2's default (one ahead in backward)")
    fsdp_cpu_offload: bool = declare(False, kind="bool", group="Distributed", widget="checkbox", probe=True,
        parallel=offload_option, note=offload_note, code=offload_code, fuzz=Fuzz((False,), ("no",)),
        help="FSDP2 CPUOffloadPolicy: parameters, gradients and optimizer state in CPU memory (GPU only)")
    fsdp_shard: tuple[str, ...] = declare((), parallel=fsdp_option("units"), code=UNITS_CODE, kind="blocks",
        group="Distributed", widget="dropdown", options=(("bench.blocks, then the root", ()),), fuzz=Fuzz(((),)),
        help="FSDP2 shard units (block names); () = the blocks bench.blocks finds, then the root")
