"""The data-pipeline knobs: how the DataLoader is built and how batches reach the device.

Each knob's run-time hook (DataLoader keywords, the device move, traits for the runner), its note
and its code hook sit together. `batch_size` and `data` are structural (the loop reads them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .spec import Context, Fuzz, declare

DATA_MODES = ("loader", "cached")
PINNING_DEVICES = ("cuda", "xpu")  # page-locked buffers only matter where there is a copy to a device


def pins(ctx: Context) -> bool:
    """Whether pinned host memory means anything on this device (the one rule for run and code)."""
    return ctx.device_type in PINNING_DEVICES


# ---- data: a real loader, or one cached batch (the short-circuit test) ---------------------------
def data_note(value: str, ctx: Context) -> str | None:
    if value != "cached":
        return None
    return "data='cached' trains on one batch over and over: its loss is not comparable with the loader's"


def data_code(k: Any) -> dict[str, list[str]]:
    if k.data != "cached":
        return {}
    return {
        "header": [
            "# data='cached' was a measurement short-circuit (one repeated batch); this loop uses the real data."
        ]
    }


# ---- num_workers -----------------------------------------------------------------------------------
def workers_loader(value: int, ctx: Context) -> dict[str, Any]:
    out: dict[str, Any] = {"num_workers": value}
    if value and ctx.loader_timeout_s:
        out["timeout"] = ctx.loader_timeout_s  # a hung worker becomes an error, not a frozen notebook
    return out


def workers_traits(value: int, ctx: Context) -> dict[str, Any]:
    return {"workers": value}


def workers_code(k: Any) -> dict[str, list[str]]:
    if not k.num_workers:
        return {}
    return {
        "header": ['# Worker processes: on Windows/macOS run this under `if __name__ == "__main__":`.'],
        "loader_args": [f"num_workers={k.num_workers}"],
    }


# ---- pin_memory --------------------------------------------------------------------------------------
def pin_loader(value: bool, ctx: Context) -> dict[str, Any]:
    return {"pin_memory": value and pins(ctx)}


def pin_move(value: bool, ctx: Context) -> dict[str, Any]:
    # pinned host buffers make the copy asynchronous; only then is non_blocking meaningful
    return {"non_blocking": True} if value and pins(ctx) else {}


def pin_note(value: bool, ctx: Context) -> str | None:
    if value and ctx.device_type == "mps":
        return "pin_memory is a no-op on MPS (unified memory): the loader does not pin, copies are synchronous"
    if value and not pins(ctx):
        return "pin_memory is a no-op without an accelerator (nothing is copied to a device)"
    return None


def pin_code(k: Any) -> dict[str, list[str]]:
    if not k.pin_memory:
        return {}
    rule = f"device.type in {PINNING_DEVICES!r}"
    return {"loader_args": [f"pin_memory={rule}"], "move_args": [f"non_blocking={rule}"]}


# ---- persistent_workers, prefetch_factor: only with worker processes ----------------------------------
def persistent_loader(value: bool, ctx: Context) -> dict[str, Any]:
    return {"persistent_workers": value} if ctx.knobs.num_workers > 0 else {}


def persistent_traits(value: bool, ctx: Context) -> dict[str, Any]:
    return {"persistent_workers": value}


def persistent_note(value: bool, ctx: Context) -> str | None:
    return "persistent_workers is a no-op with data='cached'" if value and ctx.knobs.data == "cached" else None


def persistent_code(k: Any) -> dict[str, list[str]]:
    return {"loader_args": ["persistent_workers=True"]} if k.persistent_workers else {}


def prefetch_loader(value: int | None, ctx: Context) -> dict[str, Any]:
    return {"prefetch_factor": value} if value is not None and ctx.knobs.num_workers > 0 else {}


def prefetch_traits(value: int | None, ctx: Context) -> dict[str, Any]:
    """Batches the workers can hold ready: num_workers x prefetch_factor (torch's default 2)."""
    return {"buffered_batches": ctx.knobs.num_workers * (2 if value is None else value)}


def prefetch_note(value: int | None, ctx: Context) -> str | None:
    if value is not None and ctx.knobs.num_workers == 0:
        return "prefetch_factor is a no-op with num_workers=0 (the main process loads)"
    return None


def prefetch_code(k: Any) -> dict[str, list[str]]:
    if k.prefetch_factor is None or not k.num_workers:  # DataLoader refuses it without workers
        return {}
    return {"loader_args": [f"prefetch_factor={k.prefetch_factor}"]}


# ---- the declarations: Knobs (value.py) inherits these fields, in this order ---------------------------
@dataclass(frozen=True, init=False)
class DataKnobs:
    """The data-pipeline knobs, declared once each (Knobs inherits these fields)."""

    batch_size: int = declare(32, interleave=True, kind="int", minimum=1, group="Data pipeline", widget="int", maximum="dataset",
        help="samples per micro-batch (per optimizer step: batch_size * accum_steps)",
        fuzz=Fuzz(range(1, 49), (-2, 0, 49, 10_000)))
    data: str = declare("loader", note=data_note, code=data_code, kind="choice", choices=DATA_MODES,
        group="Data pipeline", widget="dropdown",
        help="loader = real DataLoader; cached = one batch kept on the device (much faster = data-bound)",
        fuzz=Fuzz(DATA_MODES, ("disk",)))
    num_workers: int = declare(0, loader=workers_loader, traits=workers_traits, code=workers_code, kind="int",
        minimum=0, group="Data pipeline", widget="slider", maximum="workers", probe=1, fuzz=Fuzz(range(0, 3), (-1,)),
        help="DataLoader worker processes; 0 = load in the main process (start near half the cores)")
    pin_memory: bool = declare(False, loader=pin_loader, move=pin_move, note=pin_note, code=pin_code, kind="bool",
        group="Data pipeline", widget="checkbox", probe=True, fuzz=Fuzz((False, True)),
        help="page-locked host buffers for faster async host->device copies")
    persistent_workers: bool = declare(False, loader=persistent_loader, traits=persistent_traits,
        note=persistent_note, code=persistent_code, kind="bool", group="Data pipeline", widget="checkbox", probe=True,
        fuzz=Fuzz((False, True)), help="keep workers alive across epochs (needs num_workers > 0)")
    prefetch_factor: int | None = declare(None, loader=prefetch_loader, traits=prefetch_traits, note=prefetch_note,
        code=prefetch_code, kind="int", minimum=1, optional=True, group="Data pipeline", widget="dropdown",
        options=(None, 1, 2, 4, 8), probe=4, fuzz=Fuzz((None, 1, 2, 3, 4), (0,)),
        help="batches buffered per worker; None = torch's default (2); costs host memory")
