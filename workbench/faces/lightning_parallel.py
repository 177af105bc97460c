"""Lightning's data-parallel strategies <-> the world_size, strategy, ddp_* and fsdp_* knobs.

In: a Trainer's DDPStrategy (its DistributedDataParallel keywords and comm hook), ModelParallelStrategy
(FSDP2 over a data-parallel mesh) and FSDPStrategy (FSDP1, measured as its closest, FSDP2, and said).
Out: 'ddp' or a DDPStrategy with the ddp_* knobs; FSDP2 as ModelParallelStrategy, whose sharding the
user's configure_model does (the lines `shard_lines` writes). Imports `lightning` only when called.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..core.knobs import Knobs
from ..core.knobs.parallel import COMM_HOOK_FN, broadcast_kwargs

HINT = 'Lightning support needs lightning: pip install "tuning-workbench[lightning]"'

SINGLE = ("SingleDeviceStrategy",)
# DistributedDataParallel's keywords (DDPStrategy(**kwargs) passes them on) <-> the ddp_* knobs
DDP_ARG_KNOB = {"bucket_cap_mb": "ddp_bucket_cap_mb", "gradient_as_bucket_view": "ddp_gradient_as_bucket_view",
                "static_graph": "ddp_static_graph", "find_unused_parameters": "ddp_find_unused_parameters",
                "broadcast_buffers": "ddp_broadcast_buffers", "forward_sync_buffers": "ddp_broadcast_buffers"}
FSDP_KNOBS = ("fsdp_reshard_after_forward", "fsdp_param_dtype", "fsdp_reduce_dtype", "fsdp_prefetch",
              "fsdp_cpu_offload", "fsdp_shard")
HOOK_KNOB = {"fp16_compress_hook": "fp16", "bf16_compress_hook": "bf16"}  # torch's default_hooks <-> ddp_comm_hook


def lightning_pl() -> Any:
    """`lightning.pytorch`, imported now (never by the core), or ImportError with the install line."""
    try:
        return importlib.import_module("lightning.pytorch")
    except ImportError as e:
        raise ImportError(HINT) from e


def strip(name: str) -> str:
    """A block's name inside the LightningModule ('module.blocks.0' -> 'blocks.0')."""
    return name.removeprefix("module.")


def strategy_knobs(strategy: Any, world_size: int, num_devices: int, accum_steps: int) -> tuple[dict[str, Any],
                                                                                                 list[str]]:
    """(knobs, unmapped lines) from a Trainer's strategy: DDPStrategy -> strategy='ddp' with its DDP
    keywords and comm hook; ModelParallelStrategy (FSDP2 over a data-parallel mesh) -> 'fsdp2';
    FSDPStrategy is FSDP1 and is measured as its closest, FSDP2, said as such."""
    pl = lightning_pl()
    name = type(strategy).__name__
    if name in SINGLE or (world_size == 1 and isinstance(strategy, parallel_strategies(pl))):
        return {}, []
    k: dict[str, Any] = {"world_size": world_size}
    if isinstance(strategy, pl.strategies.DDPStrategy):
        return ddp_knobs(strategy, k, accum_steps)
    if isinstance(strategy, pl.strategies.ModelParallelStrategy):
        tp = strategy._tensor_parallel_size
        tp = num_devices if tp == "auto" else int(tp)  # "auto": the devices of one node, as Lightning sets it up
        if tp != 1:
            return {}, [f"ModelParallelStrategy with tensor_parallel_size={tp} (tensor parallelism has no knob: "
                        "trials run one process; pass ModelParallelStrategy(data_parallel_size=N, "
                        "tensor_parallel_size=1) for FSDP2 alone, which maps to strategy='fsdp2')"]
        return {**k, "strategy": "fsdp2"}, ["ModelParallelStrategy's sharding is what your configure_model does "
                                            "(trials shard bench.blocks, then the root, with the fsdp_* knobs)"]
    if isinstance(strategy, pl.strategies.FSDPStrategy):
        return {**k, "strategy": "fsdp2"}, [
            "strategy FSDPStrategy is FSDP1 (FullyShardedDataParallel: one flat parameter per wrapped unit); trials "
            "shard with FSDP2 (fully_shard, per parameter), its closest, so they measure FSDP2, not FSDP1; its "
            "auto_wrap_policy, sharding_strategy, cpu_offload and mixed_precision are not read (to train as "
            "measured, use ModelParallelStrategy: to_lightning gives it)"]
    return {}, [f"strategy {name} (trials use the workbench's world_size/strategy knobs: DDP, FSDP2)"]


def parallel_strategies(pl: Any) -> tuple[type, ...]:
    """The Lightning strategies that map to the strategy knob."""
    s = pl.strategies
    return s.DDPStrategy, s.FSDPStrategy, s.ModelParallelStrategy


def ddp_knobs(strategy: Any, k: dict[str, Any], accum_steps: int) -> tuple[dict[str, Any], list[str]]:
    """strategy='ddp' with the DDPStrategy's DistributedDataParallel keywords and comm hook as ddp_* knobs."""
    left: list[str] = []
    k["strategy"] = "ddp"
    for arg, value in strategy._ddp_kwargs.items():
        knob = DDP_ARG_KNOB.get(arg)
        if knob is None:
            left.append(f"DDPStrategy({arg}={value!r}) (no knob: trials build DDP without it)")
        else:
            k[knob] = value
    hook = strategy._ddp_comm_hook
    if hook is not None:
        hook_name = getattr(hook, "__name__", type(hook).__name__)
        if hook_name in HOOK_KNOB and strategy._ddp_comm_wrapper is None:
            k["ddp_comm_hook"] = HOOK_KNOB[hook_name]
        else:
            left.append(f"ddp_comm_hook {hook_name} (trials compress gradients only with fp16/bf16_compress_hook: "
                        "they run without it)")
    if strategy._model_averaging_period:
        left.append("model_averaging_period (post-local SGD: trials all-reduce every step)")
    if accum_steps > 1:
        k["ddp_no_sync"] = True  # Lightning's loop skips the all-reduce on every accumulating micro-batch
        if k.get("ddp_static_graph"):
            del k["ddp_static_graph"]
            left.append("static_graph=True with accumulation (DDP's reducer asserts on the skipped all-reduce in "
                        "trials: they run with static_graph=False)")
    return k, left


def shard_lines(k: Knobs, blocks: list[str], *, offload: bool) -> list[str]:
    """configure_model's lines for strategy='fsdp2' under ModelParallelStrategy: fully_shard each unit
    (inner first), then the module, with the fsdp_* knobs' options, as trials shard (`offload`: whether
    fsdp_cpu_offload offloads on the trial's device; off CUDA it is a no-op)."""
    if k.world_size == 1 or k.strategy != "fsdp2":
        return []
    names = [strip(n) for n in k.fsdp_shard] or blocks
    dtype = {"fp32": "None", "bf16": "torch.bfloat16"}
    lines = ["    # strategy='fsdp2': ModelParallelStrategy makes the mesh, you shard (FSDP2's fully_shard)",
             "    if self.device_mesh is None:  # outside trainer.fit",
             "        return",
             "    from torch.distributed.fsdp import (CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy,",
             "                                        fully_shard)",
             f"    shard = dict(mesh=self.device_mesh['data_parallel'], reshard_after_forward="
             f"{k.fsdp_reshard_after_forward}, mp_policy=MixedPrecisionPolicy(param_dtype="
             f"{dtype[k.fsdp_param_dtype]}, reduce_dtype={dtype[k.fsdp_reduce_dtype]}), offload_policy="
             f"{'CPUOffloadPolicy()' if k.fsdp_cpu_offload and offload else 'OffloadPolicy()'})",
             f"    names = {names!r}",
             "    units = [self.get_submodule(n) for n in names]",
             "    for name in sorted(names, key=lambda n: -n.count('.')):  # inner units first",
             "        fully_shard(self.get_submodule(name), **shard)",
             "    fully_shard(self, **{**shard, 'reshard_after_forward': None})  # the root: FSDP2's default"]
    if k.fsdp_prefetch is not None:
        n = k.fsdp_prefetch
        lines += [f"    for i, unit in enumerate(units):  # prefetch {n} unit(s) ahead in forward and in backward",
                  f"        unit.set_modules_to_forward_prefetch(units[i + 1:i + 1 + {n}])",
                  f"        unit.set_modules_to_backward_prefetch(units[max(0, i - {n}):i][::-1])"]
    return lines


def lightning_strategy(k: Knobs) -> tuple[Any, list[str], list[str]]:
    """(Trainer's strategy, knob names it carries, left_out lines) for world_size > 1: 'ddp' or a
    DDPStrategy with the ddp_* knobs as DistributedDataParallel keywords; FSDP2 is ModelParallelStrategy
    (the data-parallel mesh only; the snippet's configure_model shards)."""
    pl = lightning_pl()
    if k.strategy == "fsdp2":
        return pl.strategies.ModelParallelStrategy(data_parallel_size=k.world_size, tensor_parallel_size=1), [], []
    kwargs: dict[str, Any] = {}
    for arg, knob in DDP_ARG_KNOB.items():
        value, default = getattr(k, knob), getattr(Knobs(), knob)
        if arg != "forward_sync_buffers" and value != default:
            kwargs.update(broadcast_kwargs(value, None) if knob == "ddp_broadcast_buffers" else {arg: value})
    if k.ddp_comm_hook != "none":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        kwargs["ddp_comm_hook"] = getattr(default_hooks, COMM_HOOK_FN[k.ddp_comm_hook])
    left = []
    if k.accum_steps > 1 and not k.ddp_no_sync:
        left.append("ddp_no_sync=False (Lightning skips the all-reduce on every accumulating micro-batch, as "
                    "ddp_no_sync=True does; this trial all-reduced each one" + (
                        "; with ddp_static_graph=True the two together are untested: DDP's reducer refuses them "
                        "in trials)" if k.ddp_static_graph else ")"))
    carried = ["strategy", *DDP_ARG_KNOB.values(), "ddp_comm_hook", "ddp_no_sync"]
    return (pl.strategies.DDPStrategy(**kwargs) if kwargs else "ddp"), carried, left
