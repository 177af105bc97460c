"""Where the memory goes: parameters, gradients, optimizer state, activations at the peak, and
which blocks save the most activations (the ones worth checkpointing first)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd
import torch

from ..core import measure
from ..core.knobs import Knobs
from ..core.measure import fmt_bytes, live_tensor_bytes, profile_peak_bytes, sync
from ..core.step import built
from ..core.workload import Workload
from ..launch.runner import trial_threaded
from .analysis import Context, analysis


def _peak_extra(fn: Callable[[], Any], device: torch.device) -> int | None:
    """Peak bytes allocated on `device` beyond what was live when `fn` started (None: not measured)."""
    meter = measure.memory_meter(device.type)
    if meter is None:  # MPS: no peak counter; run the step anyway so gradients exist
        fn()
        return None
    if meter == "allocator":
        sync(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        sync(device)
        return max(0, torch.cuda.max_memory_allocated(device) - base)
    return profile_peak_bytes(fn, device)


@trial_threaded
def memory_breakdown(workload: Workload, knobs: Knobs) -> pd.DataFrame:
    """Bytes by kind at the step's peak (one micro-batch's forward+backward, eager).

    Activations = peak extra during forward+backward minus the gradients it creates: what
    autograd saves for backward plus temporaries; checkpointing and AMP shrink it.
    """
    with built(workload, knobs, label_phases=False) as (step, source):
        step(source)  # one full step so the optimizer state exists (Adam: 2 tensors per parameter)
        params = list(step.model.parameters())
        batch = source.next()
        param_b = live_tensor_bytes(params)
        opt_b = live_tensor_bytes(step.optimizer.state)
        batch_b = live_tensor_bytes([batch] if isinstance(batch, torch.Tensor) else batch)
        peak = _peak_extra(lambda: step.forward_backward(batch), workload.device)
        grad_b = live_tensor_bytes([p.grad for p in params if p.grad is not None])
        step.optimizer.zero_grad(set_to_none=True)
    act_b = None if peak is None else max(0, peak - grad_b)
    rows = [("parameters", param_b), ("gradients", grad_b), ("optimizer state", opt_b),
            ("activations at peak", act_b), ("input batch", batch_b)]
    df = pd.DataFrame(rows, columns=["kind", "bytes"])
    if act_b is None:  # shown as <NA> ("not measured on MPS"), never as 0
        df["bytes"] = df["bytes"].astype("Int64")
        df.attrs["note"] = f"activations at peak: not measured on {workload.device.type} (no peak-memory counter)"
    df["mb"] = df["bytes"] / 1e6
    df["share"] = df["bytes"] / max(1, int(df["bytes"].sum()))
    return df


@trial_threaded
def block_activation_bytes(workload: Workload, knobs: Knobs) -> pd.Series:
    """Bytes autograd saves for backward inside each checkpointable block, largest first.

    Counted with saved-tensor hooks during one forward pass: exactly what checkpointing a block
    would drop (and recompute in backward).
    """
    saved: dict[str, int] = dict.fromkeys(workload.blocks, 0)
    stack: list[str] = []
    seen: set[int] = set()

    def pack(t: torch.Tensor) -> torch.Tensor:
        if stack and isinstance(t, torch.Tensor) and not isinstance(t, torch.nn.Parameter):
            st = t.untyped_storage()
            key = st.data_ptr()
            if key and key not in seen:  # a storage saved twice costs once
                seen.add(key)
                saved[stack[-1]] += st.nbytes()
        return t

    with built(workload, knobs.replace(checkpoint=()), label_phases=False) as (step, source):
        def enter(name: str) -> Callable[..., None]:
            def hook(module: torch.nn.Module, args: Any) -> None:
                stack.append(name)
            return hook

        def leave(module: torch.nn.Module, args: Any, output: Any) -> None:
            stack.pop()  # returns None: a forward hook's return value would replace the output

        handles = []
        for name in workload.blocks:
            block = step.model.get_submodule(name)
            handles.append(block.register_forward_pre_hook(enter(name)))
            handles.append(block.register_forward_hook(leave))
        try:
            batch = source.next()
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                step.forward_backward(batch)
        finally:
            for h in handles:
                h.remove()
    return pd.Series(saved, name="saved_bytes", dtype="int64").sort_values(ascending=False)


def _memory_table(mem: pd.DataFrame) -> pd.DataFrame:
    mem = mem.copy()
    mem["size"] = mem["bytes"].map(fmt_bytes)
    return mem[["kind", "size", "share"]]


def _block_table(blocks: pd.Series) -> pd.DataFrame | None:
    return blocks.head(8).map(fmt_bytes).rename("saved for backward").to_frame() if len(blocks) else None


@analysis("memory breakdown", title="Memory at the peak", steps=2.0, order=10, field="memory", show=_memory_table)
def _memory(ctx: Context) -> pd.DataFrame:
    return memory_breakdown(ctx.workload, ctx.knobs)


@analysis("block activations", title="Activations by block (checkpoint the largest first)", steps=2.0, order=20,
          field="block_activations", show=_block_table, index=True, when=lambda ctx: bool(ctx.workload.blocks))
def _blocks(ctx: Context) -> pd.Series:
    return block_activation_bytes(ctx.workload, ctx.knobs)
