"""Cores and bf16: affinity and container quotas, torch's CPU checks first."""

import os

import torch

from workbench import system


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
    from workbench.diagnose import threads
    from workbench.measure import environment

    assert threads.usable_cores is system.usable_cores
    assert environment(torch.device("cpu"))["usable_cores"] == system.usable_cores()
