"""What this machine lets us use: cores (affinity and container quota) and native bf16 on the CPU.

One helper per question, used everywhere the answer matters (thread checks, the tuner's worker
counts, knob notes, the environment record), so a container limited to 2 of 64 cores is treated
as the 2-core machine it is.

Core module: imports only torch and the standard library.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

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
    try:
        with open("/proc/cpuinfo") as f:
            flags = {w for line in f if line.startswith(("flags", "Features")) for w in line.split()}
    except OSError:
        return False
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})
