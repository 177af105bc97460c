"""The precision, compile and CPU knobs: autocast and loss scaling, torch.compile, matmul
precision, channels_last, cuDNN autotuning and the main process's threads.

Each knob's run-time hook, its note and its code hook sit together.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..system import usable_cores
from .spec import Context, Fuzz, declare

AMP_MODES = ("off", "bf16", "fp16")
COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune")
MATMUL_PRECISIONS = ("highest", "high", "medium")
AMP_CODE_DTYPE = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}


# ---- amp: autocast around forward + loss, a GradScaler for fp16 ---------------------------------------
def amp_forward(value: str, ctx: Context) -> contextlib.AbstractContextManager | None:
    """The autocast context for the forward pass and loss (None when amp='off')."""
    if value == "off":
        return None
    import torch

    return torch.autocast(device_type=ctx.device_type, dtype={"bf16": torch.bfloat16, "fp16": torch.float16}[value])


def amp_scaler(value: str, ctx: Context) -> Any:
    """A GradScaler for fp16 (its small range underflows gradients); bf16 and fp32 need none."""
    if value != "fp16":
        return None
    import torch

    return torch.amp.GradScaler(ctx.device_type)


def amp_traits(value: str, ctx: Context) -> dict[str, Any]:
    return {"loss_scaling": value == "fp16"}


def amp_note(value: str, ctx: Context) -> str | None:
    if value == "fp16" and ctx.device_type == "cpu":
        return (
            "amp='fp16' on CPU runs, but a CPU without fp16 arithmetic (AVX512-FP16 or AMX-FP16) converts "
            "to and from fp32 around each op, so it can be slower than fp32; compare it with fp32 and "
            "bf16 on this machine before keeping it"
        )
    if value == "bf16" and ctx.device_type == "mps":
        return "amp='bf16' needs macOS 14+ on MPS; fp16 is the safer choice there"
    return None


def amp_code(k: Any) -> dict[str, list[str]]:
    if k.amp == "off":
        return {}
    out = {"forward": [f"torch.autocast(device.type, dtype={AMP_CODE_DTYPE[k.amp]})"]}
    if k.amp == "fp16":
        out["scaler"] = ["scaler = torch.amp.GradScaler(device.type)  # fp16 gradients underflow without scaling"]
    return out


# ---- compile -----------------------------------------------------------------------------------------------
def compile_wrap(model: Any, value: str, ctx: Context) -> Any:
    """torch.compile with the knob's mode; reduce-overhead (CUDA graphs) falls back to default off CUDA."""
    if value == "off":
        return model
    import torch

    mode = "default" if value == "reduce-overhead" and ctx.device_type != "cuda" else value
    return torch.compile(model, mode=None if mode == "default" else mode)


def compile_traits(value: str, ctx: Context) -> dict[str, Any]:
    return {"compiles": value != "off"}


def compile_note(value: str, ctx: Context) -> str | None:
    if value == "reduce-overhead" and ctx.device_type != "cuda":
        return "compile='reduce-overhead' uses CUDA graphs; on this device it acts like 'default'"
    return None


def compile_code(k: Any) -> dict[str, list[str]]:
    if k.compile == "off":
        return {}
    mode = "" if k.compile == "default" else f', mode="{k.compile}"'
    return {"wrap": [f"torch.compile({{inner}}{mode})  # first steps compile (seconds to minutes)"]}


# ---- matmul_precision --------------------------------------------------------------------------------------
@contextlib.contextmanager
def matmul_settings(value: str, ctx: Context) -> Iterator[None]:
    import torch

    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision(value)
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def matmul_note(value: str, ctx: Context) -> str | None:
    if value != "highest" and ctx.device_type == "cpu":
        return (
            f"matmul_precision={value!r} only changes float32 matmuls on GPUs with TF32/bf16 units (and a "
            "few oneDNN CPUs); usually a no-op on CPU"
        )
    return None


def matmul_code(k: Any) -> dict[str, list[str]]:
    if k.matmul_precision == "highest":
        return {}
    return {"setup": [f'torch.set_float32_matmul_precision("{k.matmul_precision}")  # TF32/bf16 matmuls for float32']}


# ---- channels_last: the model and every 4-D floating-point input in NHWC ----------------------------------
def channels_last_model(model: Any, value: bool, ctx: Context) -> Any:
    if not value:
        return None
    import torch

    return model.to(memory_format=torch.channels_last)


def channels_last_move(value: bool, ctx: Context) -> dict[str, Any]:
    return {"channels_last": True} if value else {}


def channels_last_note(value: bool, ctx: Context) -> str | None:
    if value and not ctx.has_conv:
        return "channels_last is a no-op for a model without Conv2d layers"
    return None


def channels_last_inert(value: bool, ctx: Context) -> str | None:
    """NHWC changes the layout of 4-D tensors only (conv weights, image batches): none here, nothing changes."""
    if ctx.four_d is False:
        return "the model and its batches hold no 4-D tensor (no Conv2d, no image batch), so no tensor changes layout"
    return None


def channels_last_code(k: Any) -> dict[str, list[str]]:
    if not k.channels_last:
        return {}
    return {
        "model": ["{model} = {model}.to(memory_format=torch.channels_last)  # NHWC for convolutions"],
        "batch": [
            "batch = each_tensor(lambda t: t.contiguous(memory_format=torch.channels_last) "
            "if t.dim() == 4 and t.is_floating_point() else t, batch)  # NHWC 4-D inputs"
        ],
    }


# ---- cudnn_benchmark ---------------------------------------------------------------------------------------
@contextlib.contextmanager
def cudnn_settings(value: bool, ctx: Context) -> Iterator[None]:
    import torch

    before = torch.backends.cudnn.benchmark
    try:
        torch.backends.cudnn.benchmark = value  # autotune conv algorithms per input shape (CUDA only)
        yield
    finally:
        torch.backends.cudnn.benchmark = before


def cudnn_note(value: bool, ctx: Context) -> str | None:
    if value and ctx.device_type != "cuda":
        return "cudnn_benchmark is a no-op without CUDA (cuDNN autotunes convolutions on NVIDIA GPUs only)"
    return None


def cudnn_inert(value: bool, ctx: Context) -> str | None:
    return "cuDNN runs on NVIDIA GPUs only, and this step runs on " + ctx.device_type if ctx.device_type != "cuda" else None


def cudnn_code(k: Any) -> dict[str, list[str]]:
    if not k.cudnn_benchmark:
        return {}
    return {"setup": ["torch.backends.cudnn.benchmark = True  # autotune conv algorithms (fixed input shapes)"]}


# ---- cpu_threads: the main process's intra-op threads ---------------------------------------------------
@contextlib.contextmanager
def threads_settings(value: int | None, ctx: Context) -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    try:
        if value is not None:
            torch.set_num_threads(value)
        yield
    finally:
        torch.set_num_threads(before)


def threads_note(value: int | None, ctx: Context) -> str | None:
    cores = usable_cores()  # affinity and container quota, not the host's core count
    if value is not None and value > cores:
        return f"cpu_threads={value} is more than the {cores} cores here (oversubscription slows every thread)"
    return None


def threads_code(k: Any) -> dict[str, list[str]]:
    if k.cpu_threads is None:
        return {}
    return {"setup": [f"torch.set_num_threads({k.cpu_threads})  # main-process compute threads"]}


# ---- the declarations: Knobs (value.py) inherits these fields, in this order ---------------------------
@dataclass(frozen=True, init=False)
class PrecisionKnobs:
    """The precision, compile and CPU knobs, declared once each (Knobs inherits these fields)."""

    amp: str = declare("off", interleave=True, forward=amp_forward, scaler=amp_scaler, traits=amp_traits, note=amp_note, code=amp_code,
        kind="choice", choices=AMP_MODES, group="Precision & compile", widget="dropdown",
        fuzz=Fuzz(AMP_MODES, ("fp8", "BF16", "")),
        help='autocast dtype: "off" | "bf16" | "fp16" (fp16 adds a GradScaler)')
    compile: str = declare("off", interleave=True, wrap=compile_wrap, traits=compile_traits, note=compile_note, code=compile_code,
        kind="choice", choices=COMPILE_MODES, group="Precision & compile", widget="dropdown",
        fuzz=Fuzz(("off",), ("fast", "inductor")),
        help="torch.compile mode; the first steps compile (seconds to minutes) and are not measured")
    matmul_precision: str = declare("highest", interleave=True, kind="choice", choices=MATMUL_PRECISIONS, group="Precision & compile",
        widget="dropdown", probe="high", settings=matmul_settings, note=matmul_note, code=matmul_code,
        fuzz=Fuzz(MATMUL_PRECISIONS, ("low",)),
        help="torch.set_float32_matmul_precision: allow TF32/bf16 for float32 matmuls")
    channels_last: bool = declare(False, interleave=True, on_model=channels_last_model, move=channels_last_move,
        note=channels_last_note, inert=channels_last_inert, code=channels_last_code, kind="bool", group="Precision & compile", widget="checkbox",
        probe=True, fuzz=Fuzz((False, True)),
        help="NHWC memory format for the model and 4-D inputs (convnets, best with AMP)")
    cudnn_benchmark: bool = declare(False, interleave=True, kind="bool", group="Precision & compile", widget="checkbox", probe=True,
        settings=cudnn_settings, note=cudnn_note, inert=cudnn_inert, code=cudnn_code, fuzz=Fuzz((False, True)),
        help="torch.backends.cudnn.benchmark: autotune conv algorithms for fixed shapes (GPU)")
    cpu_threads: int | None = declare(None, interleave=True, kind="int", minimum=1, optional=True, group="CPU", widget="dropdown",
        options="cores", settings=threads_settings, note=threads_note, code=threads_code,
        fuzz=Fuzz((None, 1, 2, 3), (0,)),
        help="main-process intra-op threads; None = torch's default (with workers, fewer can be faster)")
