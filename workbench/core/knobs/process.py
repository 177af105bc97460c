"""The process knobs: how the trial's process starts. One knob: `allocator`, the C heap's mode.

Why a knob: on one 2-core CPU the same demo ran 12,176-22,346 samples/s depending only on the
allocator mode (jemalloc's defaults, glibc as it starts, glibc keeping freed memory, tcmalloc;
benchmarks/README.md, "The allocator, and the referee with the mode pinned"). glibc reads MALLOC_* and the loader reads LD_PRELOAD only
when a process starts, so a trial with an allocator runs in a fresh process started with them
(workbench/launch/fresh.py) and reads back, inside it, that the mode took. None (the default) runs the
trial where it is asked to, as that process is, and records its mode (the environment's `allocator`).

Each hook sits here: the process's environment, the check that it is active, the refusal of a
missing library (naming the package), the note, the settings hook that fixes glibc's malloc thresholds
before each trial (system.settle_malloc), and the code hook that writes the launch line into the
exported script's header, checks the mode at its start (every torchrun rank runs the check) and, for
glibc, fixes the thresholds there too.
"""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..system import (
    ALLOCATOR_INSTALL,
    ALLOCATORS,
    KEEP_MMAP_BYTES,
    KEPT_ENV,
    PRELOADED,
    SETTLE_BYTES,
    allocator_env,
    allocator_library,
    process_allocator,
    settle_malloc,
)
from .spec import Context, Fuzz, declare


def allocator_process_env(value: str | None, ctx: Context) -> dict[str, str | None]:
    """LD_PRELOAD / MALLOC_* for the trial's process ({} for None: the process as it is)."""
    return {} if value is None else allocator_env(value)


def allocator_differs(value: str | None, ctx: Context) -> str | None:
    """None when this process runs in `value`'s mode, else what it runs instead."""
    if value is None:
        return None
    here = process_allocator()
    if here == value:
        return None
    return f"allocator={value!r} asked, this process runs {here or 'its platform allocator'!r}"


@contextlib.contextmanager
def allocator_settings(value: str | None, ctx: Context) -> Iterator[None]:
    """glibc as it starts (None or "glibc" in a glibc process): its malloc thresholds fixed at their ceiling
    before the trial (`settle_malloc`), so the process's past cannot change the figure. It stays so after the
    block (glibc cannot lower them again); the exported script does the same at its top (`settle_lines`)."""
    if value in (None, "glibc"):
        settle_malloc()
    yield


def settle_lines() -> list[str]:
    """Script lines doing what `settle_malloc` did in the trial's process: one ~32 MiB block freed."""
    return ["", "",
            "def settle_malloc():",
            '    """glibc raises its malloc thresholds to the largest block freed so far (up to 32 MiB), so a',
            "    process's speed depends on its past: the trials fixed them at that ceiling first, and so does this",
            '    script (a mapped block freed, no page touched)."""',
            '    libc = ctypes.CDLL(None)',
            '    if hasattr(libc, "mallopt"):  # glibc',
            "        libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]",
            "        libc.free.argtypes = [ctypes.c_void_p]",
            f"        libc.free(libc.malloc({KEEP_MMAP_BYTES >> 20} * 2**20 - {KEEP_MMAP_BYTES - SETTLE_BYTES}))",
            "",
            "",
            'if os.name == "posix":',
            "    settle_malloc()"]


def launch_words(value: str) -> str:
    """How a script outside ours (a Trainer's, a Lightning fit) starts in `value`'s mode, as the trials did."""
    words = f"launch the training as `{launch_env(value)} python train.py`"
    if value == "glibc":
        words += " and call `wb.settle_malloc()` at its top (the trials fixed glibc's malloc thresholds first)"
    return words


def allocator_check_run(value: str | None, ctx: Context) -> None:
    """Refuse, naming the package, a mode whose library is not on this machine."""
    if value in PRELOADED and allocator_library(value) is None:
        raise ValueError(f"allocator={value!r} needs {PRELOADED[value][0]}, which is not on this machine: "
                         f"install it with {ALLOCATOR_INSTALL}")


def allocator_note(value: str | None, ctx: Context) -> str | None:
    if value is not None and ctx.device_type == "cuda":
        return (f"allocator={value!r} changes the host's malloc (the data pipeline, the Python side); CUDA "
                "memory has its own caching allocator, so on a GPU expect little from it")
    return None


def launch_env(value: str) -> str:
    """The variables a launch line sets for `value` (the library found here for a preload), quoted for a
    POSIX shell: a library path with spaces or quotes stays one word."""
    if value == "glibc-kept":
        return " ".join(f"{k}={shlex.quote(v)}" for k, v in KEPT_ENV.items())
    if value in PRELOADED:
        return "LD_PRELOAD=" + shlex.quote(allocator_library(value) or PRELOADED[value][0])
    return "env -u LD_PRELOAD -u MALLOC_MMAP_THRESHOLD_ -u MALLOC_TRIM_THRESHOLD_"


def check_lines(value: str) -> list[str]:
    """Script lines that warn when the process does not run in `value`'s mode."""
    maps = "open('/proc/self/maps').read() if os.path.exists('/proc/self/maps') else ''"
    if value in PRELOADED:
        test = f'"/lib{value}" not in ({maps})'
    elif value == "glibc-kept":
        test = " or ".join(f'os.environ.get("{k}") != "{v}"' for k, v in KEPT_ENV.items())
    else:
        test = (f'any(v in os.environ for v in ("LD_PRELOAD", {", ".join(repr(k) for k in KEPT_ENV)})) '
                f'or "/libtcmalloc" in ({maps}) or "/libjemalloc" in ({maps})')
    text = (f"this process does not run allocator={value!r}, which the trials measured: start it as the header "
            f"says ({launch_env(value)} ...); its samples/s can differ by up to 2x")
    return [f"if {test}:  # the trials ran with allocator={value!r}", f"    warnings.warn({text!r})"]


def allocator_code(k: Any) -> dict[str, list[str]]:
    if k.allocator is None:
        return {}
    launch = launch_env(k.allocator)
    run = f"torchrun --standalone --nproc-per-node={k.world_size} train_{k.strategy}.py" if k.world_size > 1 \
        else "python train.py"
    return {"header": [f"# The trials ran with allocator={k.allocator!r}; start the script the same way"
                       + (" (every rank inherits it)" if k.world_size > 1 else "") + ":",
                       f"#   {launch} {run}"],
            "imports": ["import os", "import warnings"] + (["import ctypes"] if k.allocator == "glibc" else []),
            "setup": check_lines(k.allocator) + (settle_lines() if k.allocator == "glibc" else [])}


def pin_allocator(knobs: Any, mode: str | None) -> Any:
    """`knobs` with allocator=`mode` (a mode read back from a trial's process) when they left it None."""
    if knobs.allocator is None and mode in ALLOCATORS:
        return knobs.replace(allocator=mode)
    return knobs


@dataclass(frozen=True, init=False)
class ProcessKnobs:
    """The process knobs, declared once each (Knobs inherits these fields)."""

    allocator: str | None = declare(None, interleave=False, kind="choice", choices=ALLOCATORS, optional=True,
        group="CPU", widget="dropdown", process_env=allocator_process_env, process_differs=allocator_differs,
        check_run=allocator_check_run, note=allocator_note, code=allocator_code, settings=allocator_settings,
        fuzz=Fuzz((None,), ("mimalloc", "TCMALLOC", "")),
        help='the C heap: "glibc" | "glibc-kept" | "tcmalloc" | "jemalloc", each in a fresh process '
             "(None: the process as it is)")
