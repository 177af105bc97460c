"""What the workbench knows about the device its trials run on: one plain, serialisable record.

`DeviceFacts` is read wherever a decision depends on the device rather than on a measurement: the
tuner's space (pinned memory, TF32, CUDA graphs, bf16 or fp16, worker counts from the cores), the
knobs' "changes nothing here" rules, `compare`'s answer without measuring, the MFU's peak and the
verdicts. The workload carries it (`Workload.facts`). Without an executor it is this machine's
(`facts_here`); with one it is the node's, reported by a small probe job (launch/cluster.py's
`probe_node`, run there; faces/nodefacts.py submits it and caches the answer beside the log), so a CPU login node that tunes
for GPU nodes reasons about the GPU nodes.

Core module: imports only torch and the standard library.
"""

from __future__ import annotations

import dataclasses
import os
import platform
from dataclasses import dataclass
from typing import Any

import torch

from . import system
from .measure import cpu_name, now_iso

HERE = "this machine"  # DeviceFacts.where when the facts were read in this process


@dataclass(frozen=True)
class DeviceFacts:
    """The device trials run on, as facts (no measurement): read by the space, the rules and MFU.

    `where` says whose facts they are ("this machine", or "node gpu-17 (probe job 4242)"), `probed_at`
    when they were read (ISO 8601, the reading machine's local time).
    """

    type: str = "cpu"  # the torch device type trials run on: cpu, cuda, mps, xpu
    name: str = ""  # the GPU's name ("NVIDIA H100 80GB HBM3"), else the CPU's model
    bf16: bool = False  # native bf16 units (tensor cores from compute capability 8.0; AVX512-BF16/AMX on a CPU)
    fp16: bool = False  # fp16 units worth autocasting to (tensor cores from 7.0; AMX-FP16/AVX512-FP16 on a CPU)
    tf32: bool = False  # TF32 tensor cores (CUDA compute capability 8.0 and later)
    capability: str = ""  # CUDA compute capability, e.g. "9.0" ("" off CUDA)
    cores: int = 1  # CPU cores the trial's process may keep busy (affinity and container quota)
    memory_bytes: int = 0  # the device's memory: the GPU's total, or the host's RAM for cpu and mps
    host_memory_bytes: int = 0  # the node's RAM (loader workers and pinned buffers live there)
    host: str = ""  # the machine's name
    torch: str = ""  # torch's version there
    where: str = HERE
    probed_at: str = ""

    @property
    def device(self) -> torch.device:
        """A torch.device of this type (for the knobs' rules, which read its type; never allocated on)."""
        return torch.device(self.type)

    @property
    def here(self) -> bool:
        """Whether these are this process's own facts (no probe job)."""
        return self.where == HERE

    def units(self) -> str:
        """The precision units, e.g. "bf16, fp16, TF32" ("no bf16/fp16/TF32 units" when none)."""
        named = [n for n, has in (("bf16", self.bf16), ("fp16", self.fp16), ("TF32", self.tf32)) if has]
        return ", ".join(named) if named else "no bf16/fp16/TF32 units"

    def line(self) -> str:
        """One line for a person: whose facts, the device, its units, cores and memory, and when read."""
        gib = self.memory_bytes / 2**30
        cap = f" (compute capability {self.capability})" if self.capability else ""
        when = f", read {self.probed_at}" if self.probed_at else ""
        return (f"{self.where}: {self.type} {self.name or '?'}{cap}; {self.units()}; {self.cores} cores; "
                f"{gib:.0f} GiB{when}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (from_dict reads it back)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> DeviceFacts:
        """The facts in `record` (to_dict's); fields it lacks take their defaults, unknown ones are dropped.
        ValueError when it is not a mapping with a device type."""
        if not isinstance(record, dict) or not isinstance(record.get("type"), str):
            raise ValueError(f"device facts must be a dict with a 'type' (cpu, cuda, mps), got {record!r:.200}")
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in record.items() if k in names})


def _host_memory() -> int:
    """This machine's RAM in bytes (0 when the platform does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return 0


def facts_here(device: torch.device | str = "cpu", *, where: str = HERE) -> DeviceFacts:
    """This process's facts about `device` (a CUDA device is asked about its properties: no kernel runs)."""
    device = torch.device(device)
    host_memory = _host_memory()
    common = {"cores": system.usable_cores(), "host_memory_bytes": host_memory, "host": platform.node().split(".")[0],
              "torch": torch.__version__, "where": where, "probed_at": now_iso()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        major, minor = int(props.major), int(props.minor)
        return DeviceFacts("cuda", props.name, bf16=major >= 8, fp16=major >= 7, tf32=major >= 8,
                           capability=f"{major}.{minor}", memory_bytes=int(props.total_memory), **common)
    if device.type == "mps":
        return DeviceFacts("mps", "Apple GPU (MPS)", bf16=True, fp16=True, memory_bytes=host_memory, **common)
    if device.type == "cpu":
        return DeviceFacts("cpu", cpu_name(), bf16=system.cpu_has_bf16(), fp16=system.cpu_has_fp16(), memory_bytes=host_memory, **common)
    return DeviceFacts(device.type, device.type, memory_bytes=host_memory, **common)
