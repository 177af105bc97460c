"""FLOPs per step and model FLOP utilisation (MFU): achieved FLOP/s against the device's peak.

FLOPs come from `torch.utils.flop_counter.FlopCounterMode` over one micro-batch's forward and
backward (matmuls, convolutions, attention; elementwise ops are not counted, so MFU is a lower
bound of how busy the units are). Peaks: dense (no sparsity) vendor figures for common GPUs; on
the CPU a matmul measured here, because CPU peaks depend on cores, clocks and vector units.
"""

from __future__ import annotations

import time

import pandas as pd
import torch
from torch.utils.flop_counter import FlopCounterMode

from ..core.knobs import Knobs
from ..core.measure import TrialResult, sync
from ..core.step import built
from ..core.workload import Workload
from ..launch.runner import trial_threaded
from .analysis import Context, analysis

# Dense peak TFLOP/s from vendor data sheets (SXM variants unless named): fp32, tf32, bf16, fp16.
# None = no tensor-core path for that dtype. Matched by substring of the device name, longest first.
GPU_PEAK_TFLOPS: dict[str, dict[str, float | None]] = {
    "H200": {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},
    "H100 PCIe": {"fp32": 51.2, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0},
    "H100": {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},
    "A100": {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
    "L40S": {"fp32": 91.6, "tf32": 183.0, "bf16": 362.0, "fp16": 362.0},
    "L4": {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0},
    "A10": {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0},
    "V100": {"fp32": 15.7, "tf32": None, "bf16": None, "fp16": 125.0},
    "T4": {"fp32": 8.1, "tf32": None, "bf16": None, "fp16": 65.0},
    "RTX 4090": {"fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2},
    "RTX 3090": {"fp32": 35.6, "tf32": 35.6, "bf16": 71.0, "fp16": 71.0},
}


def compute_dtype(knobs: Knobs) -> str:
    """The dtype the matmuls run in under these knobs: fp16, bf16, tf32 or fp32."""
    if knobs.amp != "off":
        return knobs.amp
    return "fp32" if knobs.matmul_precision == "highest" else "tf32"


def gpu_peak_flops(device_name: str, dtype: str) -> float | None:
    """Dense peak FLOP/s for a known GPU name and dtype, else None."""
    for key in sorted(GPU_PEAK_TFLOPS, key=len, reverse=True):
        if key.lower() in device_name.lower():
            tflops = GPU_PEAK_TFLOPS[key].get(dtype)
            return tflops * 1e12 if tflops else None
    return None


def measured_matmul_flops(device: torch.device, dtype: str = "fp32", n: int = 1024, repeats: int = 5) -> float:
    """Best-of-`repeats` FLOP/s of an n x n matmul on `device` with the current thread settings."""
    torch_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(dtype, torch.float32)
    a = torch.randn(n, n, device=device, dtype=torch_dtype)
    b = torch.randn(n, n, device=device, dtype=torch_dtype)
    a @ b  # warm the kernels
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        t = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best  # multiply-add = 2 FLOPs


@trial_threaded
def flops_per_step(workload: Workload, knobs: Knobs) -> int:
    """FLOPs of one optimizer step: one micro-batch's forward+backward x accum_steps (eager)."""
    with built(workload, knobs, label_phases=False) as (step, source):
        batch = source.next()
        with FlopCounterMode(display=False) as counter:
            step.forward_backward(batch)
        step.optimizer.zero_grad(set_to_none=True)
    return int(counter.get_total_flops()) * knobs.accum_steps


@trial_threaded
def peak_flops(workload: Workload, knobs: Knobs) -> tuple[float | None, str]:
    """(peak FLOP/s, where it came from) for the device the trials run on and the knobs' compute dtype.

    The device is the workload's facts' (core/devicefacts.py: the node's with an executor): a GPU by its
    data sheet, else a matmul measured on it; a CPU by a matmul measured here with the trial's threads.
    """
    device, facts = workload.device, workload.facts
    dtype = compute_dtype(knobs)
    if facts.type == "cuda":
        name = facts.name
        peak = gpu_peak_flops(name, dtype)
        if peak is not None:
            return peak, f"{name} data sheet, dense {dtype}"
        if device.type != "cuda":  # the facts are a node's this process cannot run a matmul on
            return None, f"no data-sheet peak for {name} ({dtype}), and no CUDA device here to measure one"
        return measured_matmul_flops(device, dtype, n=4096), f"measured {dtype} 4096^2 matmul on {name}"
    if device.type == "cpu" and facts.type == "cpu":
        from ..core.knobs import settings as process_settings

        with process_settings(knobs):  # the trial's thread count decides the CPU peak
            n_threads = torch.get_num_threads()
            peak = measured_matmul_flops(device, "bf16" if dtype == "bf16" else "fp32")
        return peak, f"measured {dtype if dtype == 'bf16' else 'fp32'} 1024^2 matmul, {n_threads} thread(s)"
    return None, f"no peak known for {facts.type}" + (f" (trials run on {facts.type}, this process on {device.type})"
                                                      if facts.type != device.type else "")


def mfu_frame(flops: int, result: TrialResult, peak: float | None, source: str) -> pd.DataFrame:
    """FLOPs per step, achieved FLOP/s (from the trial's median step time) and MFU."""
    achieved = flops / result.step_time_s if result.step_time_s else None
    mfu = achieved / peak if achieved and peak else None
    rows = [
        ("FLOPs per optimizer step", float(flops), "FlopCounterMode, forward+backward"),
        ("achieved FLOP/s", achieved, f"trial #{result.trial_id} median step time"),
        ("peak FLOP/s", peak, source),
        ("MFU", mfu, "achieved / peak (matmul-class ops only)"),
    ]
    return pd.DataFrame(rows, columns=["figure", "value", "note"])


@analysis("FLOP count", title="FLOPs and MFU", steps=1.0, order=30, field="flops")
def _flops(ctx: Context) -> pd.DataFrame:
    """FLOPs per step against the peak (a peak that cannot be found is a problem; MFU is then unknown)."""
    n = flops_per_step(ctx.workload, ctx.knobs)
    peak = ctx.attempt("peak FLOP/s", lambda: peak_flops(ctx.workload, ctx.knobs))
    return mfu_frame(n, ctx.base, *(peak or (None, "unknown")))
