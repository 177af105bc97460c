"""Knobs: every tunable setting of a trial, as one frozen, validated, diff-able value.

A `Knobs` value says *what* to try; `apply.py` turns it into a DataLoader, autocast, GradScaler,
compile and checkpoint wrappers. Validation happens here (pure checks) and in `check()` (checks
that need the workload and the device), so a bad combination fails before any work starts.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, fields
from typing import Any

AMP_MODES = ("off", "bf16", "fp16")
COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune")
MATMUL_PRECISIONS = ("highest", "high", "medium")
DATA_MODES = ("loader", "cached")
COMM_HOOKS = ("none", "fp16", "bf16")
DDP_KNOBS = ("ddp_bucket_cap_mb", "ddp_gradient_as_bucket_view", "ddp_static_graph", "ddp_no_sync",
             "ddp_comm_hook", "ddp_find_unused_parameters", "ddp_broadcast_buffers")


@dataclass(frozen=True)
class Knobs:
    """One configuration of the training step. Build with keywords; `replace()` to vary one."""

    batch_size: int = 32  # samples per micro-batch (per optimizer step: batch_size * accum_steps)
    num_workers: int = 0  # DataLoader worker processes; 0 = load in the main process
    pin_memory: bool = False  # page-locked host buffers for faster async host->device copies
    persistent_workers: bool = False  # keep workers alive across epochs (needs num_workers > 0)
    prefetch_factor: int | None = None  # batches buffered per worker; None = torch's default (2)
    amp: str = "off"  # autocast dtype: "off" | "bf16" | "fp16" (fp16 adds a GradScaler)
    compile: str = "off"  # torch.compile mode: "off" | "default" | "reduce-overhead" | "max-autotune"
    checkpoint: tuple[str, ...] = ()  # block names wrapped in torch.utils.checkpoint (recompute)
    accum_steps: int = 1  # micro-batches per optimizer step (gradient accumulation)
    channels_last: bool = False  # NHWC memory format for the model and 4-D inputs (convnets)
    cpu_threads: int | None = None  # main-process intra-op threads; None = torch's default
    matmul_precision: str = "highest"  # torch.set_float32_matmul_precision: highest|high|medium
    data: str = "loader"  # "loader" = real DataLoader; "cached" = one batch kept on the device
    world_size: int = 1  # processes under DistributedDataParallel (one per GPU, or gloo CPU processes)
    ddp_bucket_cap_mb: float | None = None  # DDP gradient bucket size in MB; None = torch's default (25)
    ddp_gradient_as_bucket_view: bool = False  # gradients are views into the all-reduce buckets (no copy)
    ddp_static_graph: bool = False  # DDP static_graph=True: the same parameters are used every step
    ddp_no_sync: bool = False  # skip the all-reduce on all but the last accumulation micro-batch
    ddp_comm_hook: str = "none"  # gradient compression before the all-reduce: "none" | "fp16" | "bf16"
    ddp_find_unused_parameters: bool = False  # DDP searches the graph for parameters without gradients
    ddp_broadcast_buffers: bool = True  # DDP broadcasts rank 0's buffers (BatchNorm stats) every forward

    def __post_init__(self) -> None:
        # Normalise list -> tuple so Knobs stay hashable and compare by value.
        if isinstance(self.checkpoint, str):
            object.__setattr__(self, "checkpoint", (self.checkpoint,) if self.checkpoint else ())
        elif not isinstance(self.checkpoint, tuple):
            object.__setattr__(self, "checkpoint", tuple(self.checkpoint))
        self.validate()

    # ---- validation that needs nothing but the values -------------------------------------
    def validate(self) -> None:
        """Raise ValueError/TypeError naming the fix if a value or combination cannot work."""
        _int(self, "batch_size", minimum=1)
        _int(self, "num_workers", minimum=0)
        _int(self, "accum_steps", minimum=1)
        _int(self, "world_size", minimum=1)
        for name in ("pin_memory", "persistent_workers", "channels_last", "ddp_gradient_as_bucket_view",
                     "ddp_static_graph", "ddp_no_sync", "ddp_find_unused_parameters", "ddp_broadcast_buffers"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"Knobs.{name} must be True or False, got {getattr(self, name)!r}")
        if self.prefetch_factor is not None:
            _int(self, "prefetch_factor", minimum=1)
        if self.cpu_threads is not None:
            _int(self, "cpu_threads", minimum=1)
        _choice(self, "amp", AMP_MODES)
        _choice(self, "compile", COMPILE_MODES)
        _choice(self, "matmul_precision", MATMUL_PRECISIONS)
        _choice(self, "data", DATA_MODES)
        _choice(self, "ddp_comm_hook", COMM_HOOKS)
        cap = self.ddp_bucket_cap_mb
        if cap is not None:
            if isinstance(cap, bool) or not isinstance(cap, (int, float)):
                raise TypeError(f"Knobs.ddp_bucket_cap_mb must be a number of MB or None, got {cap!r}")
            if not cap > 0 or cap != cap or cap == float("inf"):
                raise ValueError(f"Knobs.ddp_bucket_cap_mb must be > 0 MB (None = torch's 25 MB), got {cap}")
        for name in self.checkpoint:
            if not isinstance(name, str) or not name:
                raise TypeError(
                    f"Knobs.checkpoint takes block names (strings such as 'blocks.0'), got {name!r}; "
                    "see bench.blocks for the candidates"
                )
        if len(set(self.checkpoint)) != len(self.checkpoint):
            raise ValueError(f"Knobs.checkpoint names a block twice: {self.checkpoint}; list each once")
        if self.persistent_workers and self.num_workers == 0:
            raise ValueError(
                "persistent_workers=True needs worker processes: set num_workers >= 1 "
                "or persistent_workers=False"
            )
        if self.data == "cached" and self.num_workers > 0:
            raise ValueError(
                "data='cached' reuses one batch already on the device, so there is nothing for "
                "workers to load: set num_workers=0 (or data='loader')"
            )

        if self.ddp_static_graph and self.ddp_no_sync and self.accum_steps > 1 and self.world_size > 1:
            # DDP's reducer fails an internal assert on the first no_sync backward with a static graph
            # (checked on torch 2.13, gloo): refuse it before any process starts
            raise ValueError(
                "ddp_static_graph=True cannot be combined with ddp_no_sync=True and accum_steps > 1 "
                "(DDP's reducer asserts on the skipped all-reduce): set ddp_static_graph=False or "
                "ddp_no_sync=False"
            )

    # ---- helpers ---------------------------------------------------------------------------
    def replace(self, **changes: Any) -> Knobs:
        """A copy with some knobs changed (validated)."""
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise TypeError(f"unknown knob(s) {sorted(unknown)}; known: {', '.join(knob_names())}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (checkpoint as a list)."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["checkpoint"] = list(self.checkpoint)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Knobs:
        """Inverse of `to_dict`; unknown keys raise TypeError naming the known knobs."""
        return cls().replace(**d)

    def diff(self, other: Knobs) -> dict[str, tuple[Any, Any]]:
        """{knob: (self value, other value)} for every knob that differs."""
        a, b = self.to_dict(), other.to_dict()
        return {k: (a[k], b[k]) for k in a if a[k] != b[k]}

    def label(self, base: Knobs | None = None) -> str:
        """Short label for charts: what differs from `base` (default: the default Knobs)."""
        changes = (base or Knobs()).diff(self)
        if not changes:
            return "baseline" if base is not None else "defaults"
        parts = []
        for k, (_, v) in changes.items():
            if k == "checkpoint":
                parts.append(f"ckpt={len(v)}" if v else "ckpt=none")
            elif isinstance(v, bool):
                parts.append(k if v else f"no {k}")
            else:
                parts.append(f"{k}={v}")
        return " ".join(parts)

    def to_code(self, **kwargs: Any) -> str:
        """A runnable plain-PyTorch training loop reproducing this configuration (see codegen.py)."""
        from .codegen import knobs_to_code

        return knobs_to_code(self, **kwargs)

    def __str__(self) -> str:
        changes = Knobs().diff(self)
        inner = ", ".join(f"{k}={v!r}" for k, (_, v) in changes.items())
        return f"Knobs({inner})"


def knob_names() -> list[str]:
    """The public knob names, in declaration order."""
    return [f.name for f in fields(Knobs)]


def _int(k: Knobs, name: str, minimum: int) -> None:
    v = getattr(k, name)
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"Knobs.{name} must be an int >= {minimum}, got {v!r}")
    if v < minimum:
        raise ValueError(f"Knobs.{name} must be >= {minimum}, got {v}")


def _choice(k: Knobs, name: str, choices: tuple[str, ...]) -> None:
    v = getattr(k, name)
    if v not in choices:
        raise ValueError(f"Knobs.{name}={v!r} is not one of {', '.join(map(repr, choices))}")


def device_notes(knobs: Knobs, device_type: str, *, has_conv: bool = True) -> list[str]:
    """Knobs that run but do nothing (or hurt) on this device, each as one sentence for `notes`."""
    notes = []
    accel = device_type in ("cuda", "mps", "xpu")
    if knobs.pin_memory and not accel:
        notes.append("pin_memory is a no-op without an accelerator (nothing is copied to a device)")
    if knobs.prefetch_factor is not None and knobs.num_workers == 0:
        notes.append("prefetch_factor is a no-op with num_workers=0 (the main process loads)")
    if knobs.persistent_workers and knobs.data == "cached":
        notes.append("persistent_workers is a no-op with data='cached'")
    if knobs.compile == "reduce-overhead" and device_type != "cuda":
        notes.append("compile='reduce-overhead' uses CUDA graphs; on this device it acts like 'default'")
    if knobs.amp == "fp16" and device_type == "cpu":
        notes.append(
            "amp='fp16' on CPU runs but is far slower than fp32 or bf16 there (measured 4-60x on "
            "a 2-core x86 CPU); use amp='bf16' on CPU"
        )
    if knobs.amp == "bf16" and device_type == "mps":
        notes.append("amp='bf16' needs macOS 14+ on MPS; fp16 is the safer choice there")
    if knobs.matmul_precision != "highest" and device_type == "cpu":
        notes.append(
            f"matmul_precision={knobs.matmul_precision!r} only changes float32 matmuls on GPUs "
            "with TF32/bf16 units (and a few oneDNN CPUs); usually a no-op on CPU"
        )
    if knobs.channels_last and not has_conv:
        notes.append("channels_last is a no-op for a model without Conv2d layers")
    if knobs.cpu_threads is not None and knobs.cpu_threads > (os.cpu_count() or 1):
        notes.append(
            f"cpu_threads={knobs.cpu_threads} is more than the {os.cpu_count()} cores here "
            "(oversubscription slows every thread)"
        )
    if knobs.world_size == 1:
        changed = [name for name in DDP_KNOBS if getattr(knobs, name) != getattr(DEFAULTS, name)]
        if changed:
            notes.append(f"{', '.join(changed)} only act with world_size > 1 (one process runs without DDP)")
    else:
        if knobs.ddp_no_sync and knobs.accum_steps == 1:
            notes.append("ddp_no_sync is a no-op with accum_steps=1 (every micro-batch ends an optimizer step)")
        threads = (knobs.cpu_threads or 1) * knobs.world_size
        if device_type == "cpu" and threads > (os.cpu_count() or 1):
            notes.append(
                f"world_size={knobs.world_size} x {knobs.cpu_threads or 1} thread(s) = {threads} threads on "
                f"{os.cpu_count()} cores: the ranks compete for cores (oversubscription)"
            )
    return notes


DEFAULTS = Knobs()
