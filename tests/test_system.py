"""Cores and bf16: affinity and container quotas, torch's CPU checks first."""

import os

import pytest
import torch

from workbench.core import system


def _cgroup(tmp_path, v2: str | None = None, v1: tuple[int, int] | None = None, path: str = "/job"):
    root = tmp_path / "cgroup"
    root.mkdir(parents=True)
    lines = []
    if v2 is not None:
        (root / path.lstrip("/")).mkdir(parents=True)
        (root / path.lstrip("/") / "cpu.max").write_text(v2 + "\n")
        (root / "cpu.max").write_text("max 100000\n")
        lines.append(f"0::{path}")
    if v1 is not None:
        cpu = root / "cpu"
        cpu.mkdir()
        (cpu / "cpu.cfs_quota_us").write_text(f"{v1[0]}\n")
        (cpu / "cpu.cfs_period_us").write_text(f"{v1[1]}\n")
        lines.append("3:cpu,cpuacct:/")
    proc = tmp_path / "cgroup.txt"
    proc.write_text("\n".join(lines) + "\n")
    return root, proc


def test_cgroup_v2_quota_in_a_nested_group(tmp_path):
    root, proc = _cgroup(tmp_path, v2="150000 100000")
    assert system.cgroup_cpu_limit(root, proc) == 1.5
    assert system.usable_cores(root, proc) == min(len(os.sched_getaffinity(0)), 2)


def test_cgroup_v2_unlimited_and_v1_quota(tmp_path):
    root, proc = _cgroup(tmp_path, v2="max 100000")
    assert system.cgroup_cpu_limit(root, proc) is None
    root1, proc1 = _cgroup(tmp_path / "v1", v1=(100000, 100000))
    assert system.cgroup_cpu_limit(root1, proc1) == 1.0
    assert system.usable_cores(root1, proc1) == 1
    root2, proc2 = _cgroup(tmp_path / "v1-unlimited", v1=(-1, 100000))
    assert system.cgroup_cpu_limit(root2, proc2) is None


def test_no_cgroup_files_means_affinity(tmp_path):
    assert system.cgroup_cpu_limit(tmp_path / "none", tmp_path / "none.txt") is None
    assert system.usable_cores(tmp_path / "none", tmp_path / "none.txt") == len(os.sched_getaffinity(0))


def test_bf16_asks_torch_first(monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True, raising=False)
    assert system.cpu_has_bf16() is True


def test_bf16_falls_back_to_cpu_flags_when_torch_has_no_check(monkeypatch):
    for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        monkeypatch.delattr(torch.cpu, name, raising=False)
    flags = open("/proc/cpuinfo").read().split()
    assert system.cpu_has_bf16() == bool({"avx512_bf16", "amx_bf16", "bf16"} & set(flags))


def test_the_thread_check_and_environment_use_the_helper(monkeypatch):
    from workbench.core.measure import environment
    from workbench.diagnose import threads

    assert threads.usable_cores is system.usable_cores
    assert environment(torch.device("cpu"))["usable_cores"] == system.usable_cores()


# A step that takes 3 x 24 MiB of fresh memory and frees it. Whether glibc's defaults hand it back to
# the OS depends on the heap's history: one and the same script faulted 12,256 or 768 pages per step
# from one process to the next (the bimodality of docs/measurement.md 'Page faults'). So the faulting reference
# is glibc told to trim and map eagerly (fixed 128 KiB thresholds, no dynamic adjustment), which
# faults every page in at every step; told to keep freed memory, later steps fault nothing.
_FAULTING_STEPS = """
import ctypes, json, resource, sys, torch
import workbench as wb
torch.set_num_threads(1)  # no thread pool allocating between steps
if sys.argv[1] == "eager":
    libc = ctypes.CDLL(None)
    assert libc.mallopt(-3, 128 * 1024) == 1 and libc.mallopt(-1, 128 * 1024) == 1  # M_MMAP_, M_TRIM_THRESHOLD
kept = wb.keep_freed_memory() if sys.argv[1] == "keep" else None
def step():
    bufs = [torch.empty(6 * 2**20).fill_(1.0) for _ in range(3)]  # 3 x 24 MiB, every page written
    del bufs
for _ in range(2):
    step()  # warm-up: glibc's thresholds settle
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(8):
    step()
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 8
from workbench.core.measure import environment
print(json.dumps({"kept": kept, "faults": faults, "malloc": environment(torch.device("cpu"))["malloc"]}))
"""


def _faulting_steps(mode: str) -> dict:
    import json
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}  # glibc's defaults
    out = subprocess.run([sys.executable, "-c", _FAULTING_STEPS, mode], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(system._glibc() is None, reason="glibc's malloc only")
def test_keep_freed_memory_stops_a_step_faulting_its_memory_in_again():
    """Run in fresh processes: the call changes a process's allocator for good."""
    eager, kept = _faulting_steps("eager"), _faulting_steps("keep")
    pages = 3 * 24 * 2**20 / 4096  # 18,432 pages of 4 KiB per step
    assert eager["kept"] is None and eager["malloc"] == "glibc default"
    assert eager["faults"] > pages / 2, eager  # the counter sees a step that faults its memory in
    assert kept["kept"] is True and kept["malloc"] == "kept (keep_freed_memory)"
    assert kept["faults"] < pages / 10, kept


def test_keep_freed_memory_warns_and_declines_without_glibc(monkeypatch):
    monkeypatch.setattr(system, "_glibc", lambda: None)
    monkeypatch.setattr(system, "_kept", False)
    for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX", "MALLOC_TOP_PAD_"):
        monkeypatch.delenv(k, raising=False)
    with pytest.warns(RuntimeWarning, match="glibc"):
        assert system.keep_freed_memory() is False
    assert system.malloc_policy() == "" and not system.keeps_freed_memory()  # not glibc: nothing to record


def test_malloc_policy_names_the_start_up_variables(monkeypatch):
    monkeypatch.setattr(system, "_kept", False)
    for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX", "MALLOC_TOP_PAD_"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("MALLOC_ARENA_MAX", "1")
    assert system.malloc_policy() == "MALLOC_ARENA_MAX=1" and not system.keeps_freed_memory()
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "33554432")
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1073741824")
    assert system.keeps_freed_memory()


def test_release_free_memory_trims_through_the_one_glibc_handle(monkeypatch):
    """release_free_memory (after every trial) asks the same `_glibc()` as keep_freed_memory, and does nothing
    where there is no glibc."""
    trims = []

    class FakeLibc:
        def malloc_trim(self, pad: int) -> int:
            trims.append(pad)
            return 1

    monkeypatch.setattr(system, "_glibc", FakeLibc)
    system.release_free_memory()
    assert trims == [0]
    monkeypatch.setattr(system, "_glibc", lambda: None)
    system.release_free_memory()
    assert trims == [0]


# Whether glibc serves a block of n bytes from a mapping of its own (above its mmap threshold): the count of
# mapped blocks (mallinfo2's hblks) while it is held. The probe's own free moves the threshold as any free does.
_THRESHOLDS = """
import ctypes, json, os, sys
libc = ctypes.CDLL(None)
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc.mallinfo2.restype = Info
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
def mapped(n):
    before = libc.mallinfo2().hblks
    p = libc.malloc(n)
    held = libc.mallinfo2().hblks
    libc.free(p)
    return held > before
MiB = 2**20
out = {"fresh_2": mapped(2 * MiB), "after_past_8": mapped(8 * MiB)}  # a past: 2 MiB, then 8 MiB freed
SETTLE
out["settled_24"] = mapped(24 * MiB)  # below the ceiling now: from the heap
out["above_40"] = mapped(40 * MiB)  # above glibc's ceiling: always mapped, and its free moves nothing
out["still_24"] = mapped(24 * MiB)
print(json.dumps(out))
"""


def _thresholds(settle: str, env: dict[str, str] | None = None) -> dict:
    import json
    import subprocess
    import sys

    base = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "LD_PRELOAD"}
    out = subprocess.run([sys.executable, "-c", _THRESHOLDS.replace("SETTLE", settle)], capture_output=True,
                         text=True, env={**base, **(env or {})}, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(system._glibc() is None or system.mapped_allocator() is not None, reason="glibc's malloc only")
def test_settle_malloc_puts_glibcs_thresholds_where_no_past_moves_them():
    """A process's past (blocks it freed) raises glibc's thresholds; after settle_malloc a 24 MiB block comes
    from the heap whatever came before, and blocks above the ceiling cannot move it. The exported script's lines
    do the same. Fresh processes: the state is the process's for good."""
    unsettled = _thresholds("pass")
    assert unsettled == {"fresh_2": True, "after_past_8": True, "settled_24": True, "above_40": True,
                         "still_24": False}  # the reference: one 24 MiB request, mapped or not by the past
    settled = _thresholds("from workbench.core import system\nout['settle'] = system.settle_malloc()\n"
                          "out['policy'] = system.malloc_policy()")
    assert settled["settle"] is True and settled["policy"] == "glibc, thresholds settled"
    assert settled["settled_24"] is False and settled["above_40"] is True and settled["still_24"] is False
    from workbench.core.knobs.process import settle_lines

    script = _thresholds("\n".join(settle_lines()))  # the exported script's lines, as written
    assert script["settled_24"] is False and script["still_24"] is False
    pinned = _thresholds("from workbench.core import system\nout['settle'] = system.settle_malloc()",
                         env={"MALLOC_MMAP_THRESHOLD_": str(128 * 1024)})
    assert pinned["settle"] is False and pinned["settled_24"] is True  # fixed at start-up: left as it is


def test_a_trial_settles_glibc_before_it_records_its_environment(make_bench):
    """The allocator knob's settings hook runs before the trial's environment is recorded: every trial of a
    glibc process says its thresholds were settled, the first one too."""
    if system._glibc() is None or system.mapped_allocator() is not None or system.keeps_freed_memory():
        pytest.skip("glibc with dynamic thresholds only")
    r = make_bench(steps=2, warmup_steps=1).run(progress=False)
    assert r.ok and r.env["malloc"] == "glibc, thresholds settled", r.env["malloc"]
    code = r.to_code()
    assert "libc.free(libc.malloc(32 * 2**20 - 8192))" in code and "import ctypes" in code
    compile(code, "train.py", "exec")
