"""What this machine lets us use: cores (affinity and container quota), native bf16 on the CPU, and
glibc's malloc told to keep the memory a step frees (page faults, docs/measurement.md 'Page faults').

One helper per question, used everywhere the answer matters (thread checks, the tuner's worker
counts, knob notes, the environment record), so a container limited to 2 of 64 cores is treated
as the 2-core machine it is.

Core module: imports only torch and the standard library.
"""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path
from typing import Any

from . import compat


def usable_cores(cgroup_root: str | os.PathLike = "/sys/fs/cgroup",
                 proc_cgroup: str | os.PathLike = "/proc/self/cgroup") -> int:
    """Cores this process can keep busy: its CPU affinity, capped by a cgroup CPU quota (rounded up)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_limit(cgroup_root, proc_cgroup)
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return max(1, cores)


def cgroup_cpu_limit(cgroup_root: str | os.PathLike = "/sys/fs/cgroup",
                     proc_cgroup: str | os.PathLike = "/proc/self/cgroup") -> float | None:
    """The container's CPU quota in cores (quota / period), or None when unlimited or not Linux.

    cgroup v2: `cpu.max` ("max 100000" or "200000 100000") in our cgroup and each parent, the
    tightest wins. cgroup v1: `cpu.cfs_quota_us` / `cpu.cfs_period_us` (-1 = unlimited).
    """
    root = Path(cgroup_root)
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    limits: list[float] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        rel = rel.lstrip("/")
        if controllers == "":  # v2 unified hierarchy: walk up from our cgroup to the root
            here = root / rel if rel else root
            while True:
                limits += _v2_limit(here / "cpu.max")
                if here == root or root not in here.parents:
                    break
                here = here.parent
        elif "cpu" in controllers.split(","):  # v1: the cpu controller's own mount
            for mount in (root / "cpu", root / "cpu,cpuacct", root / controllers):
                limits += _v1_limit(mount / rel)
                limits += _v1_limit(mount) if rel else []
    return min(limits) if limits else None


def _v2_limit(path: Path) -> list[float]:
    try:
        quota, period = path.read_text().split()[:2]
    except (OSError, ValueError):
        return []
    if quota == "max":
        return []
    return [int(quota) / int(period)] if int(period) > 0 else []


def _v1_limit(folder: Path) -> list[float]:
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return []
    return [quota / period] if quota > 0 and period > 0 else []


def cpu_has_bf16() -> bool:
    """Native bf16 arithmetic on this CPU (AVX512-BF16, AMX, or Arm's BF16 extension).

    Asks torch first (the checks its own kernels dispatch on), then the kernel's CPU flags.
    Without native units bf16 is emulated: measured 0.09x of fp32 on an AVX2-only CPU.
    """
    native = compat.cpu_native_bf16()  # torch's private checks, guarded in compat
    if native:
        return True
    return bool(cpu_flags() & {"avx512_bf16", "amx_bf16", "bf16"})


def cpu_has_fp16() -> bool:
    """fp16 arithmetic units on this CPU (AMX-FP16, AVX512-FP16, Arm's FP16 extension), from its flags."""
    return bool(cpu_flags() & {"amx_fp16", "avx512_fp16", "fphp"})


def cpu_flags() -> set[str]:
    """The kernel's CPU flags (x86 `flags`, Arm `Features`); empty when /proc/cpuinfo cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            return {w for line in f if line.startswith(("flags", "Features")) for w in line.split()}
    except OSError:
        return set()


# glibc's malloc, told to keep what a step frees. By default memory freed at the end of a step can
# go back to the OS (heap trimmed, large allocations unmapped) and the next step faults it in again, one
# zeroed 4 KiB page at a time: 5-21% of the CPU time on a 2-core EPYC (docs/measurement.md 'Page faults').
KEEP_MMAP_BYTES = 32 * 2**20  # allocations up to this come from the heap (glibc's ceiling on 64-bit)
KEEP_TRIM_BYTES = 2**30  # free memory at the heap's top kept before any goes back to the OS
MALLOC_ENV = f"MALLOC_MMAP_THRESHOLD_={KEEP_MMAP_BYTES} MALLOC_TRIM_THRESHOLD_={KEEP_TRIM_BYTES}"
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)
_MALLOC_VARS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX", "MALLOC_TOP_PAD_")
_kept = False  # keep_freed_memory() succeeded in this process
_settled = False  # settle_malloc() fixed glibc's dynamic thresholds at their ceiling in this process
# a request whose mapped chunk (request + header, rounded up to 4 KiB pages) is 32 MiB - 4 KiB: glibc raises its
# thresholds only for a chunk below 32 MiB (it compares the size with the chunk's flag bits in it)
SETTLE_BYTES = KEEP_MMAP_BYTES - 8192


@functools.cache
def _glibc() -> Any:
    """This process's glibc as a ctypes library, or None (macOS, Windows, musl)."""
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc"):  # e.g. "glibc 2.36"
            return None
        import ctypes

        libc = ctypes.CDLL(None)
        return libc if hasattr(libc, "mallopt") else None
    except (AttributeError, ValueError, OSError):  # no confstr (Windows), no such name, no symbols
        return None


def keep_freed_memory() -> bool:
    """Tell glibc's malloc, in this running process, to keep the memory a step frees; True if it took.

    The same as starting Python with `MALLOC_ENV` (glibc reads those variables at start-up, so a
    running kernel cannot set them): later steps reuse the memory instead of faulting it in again,
    in every trial and in your own loop in this process. RSS then stays near its peak. Blocks above
    32 MiB are still mapped fresh each time (glibc's ceiling). It cannot be undone in this process:
    compare trials run before the call with trials run after only as different set-ups (the
    environment column `malloc` says which). Elsewhere than glibc it warns and returns False.
    A workbench's trials run in its worker process, which this call does not reach: there, ask for the
    mode per trial (`bench.run(allocator="glibc-kept")`); the call holds for trials run in this process
    (`Workbench(..., trials_in="kernel")`) and your own loop here.
    """
    global _kept
    libc = _glibc()
    if libc is None:
        import warnings

        warnings.warn("keep_freed_memory() needs glibc's malloc (Linux); this process has another allocator, "
                      "which it leaves as it is", RuntimeWarning, stacklevel=2)
        return False
    ok = libc.mallopt(_M_MMAP_THRESHOLD, KEEP_MMAP_BYTES) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, KEEP_TRIM_BYTES) == 1
    _kept = _kept or ok
    return ok


def settle_malloc() -> bool:
    """Fix glibc's dynamic malloc thresholds at their ceiling, so this process's past cannot move them; True
    when they are fixed there now (False: not glibc, or its thresholds were set at start-up or by
    keep_freed_memory(), which history cannot move either).

    glibc raises its mmap threshold to the largest mapped block freed so far (up to 32 MiB) and its trim
    threshold to twice that. Memory a step frees below them stays in the heap; above them it goes back to
    the OS and the next step faults it in again. So the same loop reads faster in a process that once freed
    a big block (loading a checkpoint, an earlier trial at a larger batch, the workload's own transfer) than
    in a fresh one: 8-14% on a small ViT at batch 64 (benchmarks/README.md, "Trial vs its exported script").
    One block freed at the ceiling puts both thresholds where no later free moves them: every trial, in any
    process and after any past, starts from the same state, and the exported script does the same at its
    top (knobs/process.py), so it reads what the trial read. Costs one mapping and unmapping, no page touched.
    """
    global _settled
    if _settled:
        return True
    libc = _glibc()
    if libc is None or _kept or any(k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")):
        return False
    if mapped_allocator() is not None:  # tcmalloc or jemalloc preloaded: malloc is theirs
        return False
    import ctypes

    malloc, free = libc.malloc, libc.free
    malloc.restype, malloc.argtypes, free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
    block = malloc(SETTLE_BYTES)
    if block:
        free(block)  # a mapped chunk freed: mmap threshold ~32 MiB, trim threshold ~64 MiB
    _settled = bool(block)
    return _settled


def malloc_settled() -> bool:
    """Whether settle_malloc() fixed this process's glibc thresholds at their ceiling."""
    return _settled


def release_free_memory() -> None:
    """Hand freed heap pages back to the OS (glibc keeps them, so RSS would only ever grow).

    The profiler's threads leave freed memory in their own malloc arenas; without this a long
    session's RSS creeps up by ~1 MB per trial although nothing is leaked.
    """
    libc = _glibc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def malloc_policy() -> str:
    """How this process's malloc treats freed memory, for the environment record: 'kept
    (keep_freed_memory)', the MALLOC_* variables it started with, 'glibc default', or '' (not glibc)."""
    if _kept:
        return "kept (keep_freed_memory)"
    named = [f"{k}={os.environ[k]}" for k in _MALLOC_VARS if k in os.environ]
    if named:
        return " ".join(named)
    if _glibc() is None:
        return ""
    return "glibc, thresholds settled" if _settled else "glibc default"


def keeps_freed_memory() -> bool:
    """Whether glibc was told (by call or by its start-up variables) to keep a step's freed memory."""
    return _kept or ("MALLOC_TRIM_THRESHOLD_" in os.environ and "MALLOC_MMAP_THRESHOLD_" in os.environ)


# ---- the process's allocator: a mode chosen when the process starts (the `allocator` knob) ----------------
# glibc reads MALLOC_* and the dynamic loader reads LD_PRELOAD only at start-up, so a mode other than the
# running process's own needs a fresh process (workbench/launch/fresh.py). "glibc" is glibc as a process starts;
# "glibc-kept" is what keep_freed_memory() does (MALLOC_ENV); tcmalloc and jemalloc replace malloc.
ALLOCATORS = ("glibc", "glibc-kept", "tcmalloc", "jemalloc")
PRELOADED = {"tcmalloc": ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4"), "jemalloc": ("libjemalloc.so.2",)}
ALLOCATOR_INSTALL = ("apt-get install libtcmalloc-minimal4 libjemalloc2 (Debian/Ubuntu), or "
                     "conda install -c conda-forge gperftools jemalloc")
KEPT_ENV = {"MALLOC_MMAP_THRESHOLD_": str(KEEP_MMAP_BYTES), "MALLOC_TRIM_THRESHOLD_": str(KEEP_TRIM_BYTES)}
LIB_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu",
            "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib", "/opt/homebrew/lib")


@functools.cache
def allocator_library(mode: str) -> str | None:
    """The shared library to LD_PRELOAD for `mode` ("tcmalloc", "jemalloc") on this machine, or None:
    the dynamic loader's cache (`ldconfig -p`) first, then the usual folders and the conda/venv prefix."""
    names = PRELOADED.get(mode, ())
    if not names:
        return None
    import subprocess
    import sys

    try:
        listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        listing = ""
    for name in names:
        for line in listing.splitlines():
            if line.strip().startswith(name + " ") and "=>" in line:
                path = line.split("=>", 1)[1].strip()
                if os.path.exists(path):
                    return path
    prefixes = [os.environ.get("CONDA_PREFIX", ""), sys.prefix]
    for folder in [*LIB_DIRS, *(os.path.join(p, "lib") for p in prefixes if p)]:
        for name in names:
            path = os.path.join(folder, name)
            if os.path.exists(path):
                return path
    return None


def available_allocators() -> tuple[str, ...]:
    """The allocator modes this machine can start a process in (glibc's need glibc, the others their library)."""
    glibc = ("glibc", "glibc-kept") if _glibc() is not None or not os.path.exists("/proc/self/maps") else ()
    return glibc + tuple(m for m in PRELOADED if allocator_library(m) is not None)


def mapped_allocator(maps: str | os.PathLike = "/proc/self/maps") -> str | None:
    """'tcmalloc' or 'jemalloc' when that library is mapped into this process (LD_PRELOAD took), else None."""
    try:
        text = Path(maps).read_text()
    except OSError:
        return None
    for mode in PRELOADED:
        if f"/lib{mode}" in text:  # e.g. /lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
            return mode
    return None


def process_allocator() -> str:
    """The allocator mode this process runs in: tcmalloc or jemalloc (mapped), glibc-kept (told by
    keep_freed_memory() or its MALLOC_* start-up variables), glibc, or '' (another libc's own)."""
    mapped = mapped_allocator()
    if mapped is not None:
        return mapped
    if _glibc() is None:
        return ""
    return "glibc-kept" if keeps_freed_memory() else "glibc"


def allocator_env(mode: str) -> dict[str, str | None]:
    """The variables a process starts with to run in `mode` (None: unset, so nothing is inherited)."""
    env: dict[str, str | None] = {"LD_PRELOAD": None, **dict.fromkeys(_MALLOC_VARS)}
    if mode == "glibc-kept":
        env.update(KEPT_ENV)
    elif mode in PRELOADED:
        path = allocator_library(mode)
        if path is None:
            raise ValueError(f"allocator={mode!r}: no {PRELOADED[mode][0]} on this machine; install it with "
                             f"{ALLOCATOR_INSTALL}")
        env["LD_PRELOAD"] = path
    elif mode != "glibc":
        raise ValueError(f"allocator={mode!r} is not one of {', '.join(map(repr, ALLOCATORS))}")
    return env


def package_version() -> str:
    """This package's installed version ("0+unknown" in a source tree that was never pip-installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tuning-workbench")
    except PackageNotFoundError:
        return "0+unknown"
