"""Meters and the result type: step clocks, peak memory, foreign CPU load, environment, TrialResult.

Timing rules (see DESIGN.md): the measured window is bracketed by device syncs; per-step times
come from the host clock on CPU and from CUDA events on GPU (the host clock only sees kernel
launches there); data-wait is the host time blocked getting the next batch onto the device.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime as _dt
import functools
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .knobs import Knobs

STATUSES = ("ok", "oom", "error", "nan", "interrupted")
FOREIGN_LOAD_LIMIT = 0.25  # cores busy with other processes before a trial is flagged as disturbed


def sync(device: torch.device) -> None:
    """Wait until queued device work is done (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


class StepClock:
    """Per-step durations: CUDA events on CUDA (read once at the end), perf_counter elsewhere."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._marks: list[Any] = []

    def mark(self) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self._marks.append(ev)
        else:
            self._marks.append(time.perf_counter())

    def durations_s(self) -> list[float]:
        """Seconds between consecutive marks; on CUDA this syncs on the last event (once)."""
        if len(self._marks) < 2:
            return []
        if self.cuda:
            self._marks[-1].synchronize()
            return [a.elapsed_time(b) / 1e3 for a, b in zip(self._marks, self._marks[1:])]
        return [b - a for a, b in zip(self._marks, self._marks[1:])]


class CpuLoad:
    """Cores kept busy by *other* processes during a window (Linux /proc/stat minus our own tree)."""

    def __init__(self) -> None:
        self._start = self._read()

    @staticmethod
    def _read() -> tuple[float, float, float] | None:
        try:
            import psutil

            with open("/proc/stat") as f:
                parts = f.readline().split()[1:]
            ticks = os.sysconf("SC_CLK_TCK")
            busy = (sum(map(int, parts[:8])) - int(parts[3]) - int(parts[4])) / ticks  # minus idle, iowait
            proc = psutil.Process()
            own = sum(proc.cpu_times()[:2])
            for child in proc.children(recursive=True):
                try:
                    own += sum(child.cpu_times()[:2])
                except psutil.Error:
                    pass
            return busy, own, time.monotonic()
        except (OSError, ImportError, ValueError, IndexError):
            return None

    def foreign_cores(self) -> float | None:
        """Average number of cores used by other processes since construction (None off Linux)."""
        end = self._read()
        if self._start is None or end is None:
            return None
        wall = end[2] - self._start[2]
        if wall <= 0:
            return None
        foreign = (end[0] - self._start[0]) - (end[1] - self._start[1])
        return max(0.0, foreign / wall)


def live_tensor_bytes(*groups: Any) -> int:
    """Bytes of distinct storages reachable from parameters, grads and optimizer state."""
    seen: set[tuple[int, str]] = set()
    total = 0

    def add(t: Any) -> None:
        nonlocal total
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            st = t.untyped_storage()
            key = (st.data_ptr(), str(t.device))
            if key not in seen and st.data_ptr() != 0:
                seen.add(key)
                total += st.nbytes()
        elif isinstance(t, dict):
            for v in t.values():
                add(v)
        elif isinstance(t, (list, tuple)):
            for v in t:
                add(v)

    for g in groups:
        add(g)
    return total


def profile_peak_bytes(fn: Callable[[], Any], device: torch.device) -> int:
    """Peak extra bytes allocated on `device` while `fn` runs, from the profiler's memory events.

    On CPU there is no allocator with peak statistics and peak RSS hides reuse inside glibc, so
    we replay every allocation/free the profiler saw in time order and take the running maximum.
    """
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _quiet_stderr():  # kineto prints "USDT ... profiler_start/stop" lines on every start/stop
        prof.start()
    try:
        fn()
    finally:
        with _quiet_stderr():
            prof.stop()
    try:
        events = [
            e
            for e in prof.profiler.kineto_results.events()
            if e.name() == "[memory]" and e.device_type() == _profiler_device(device)
        ]
        events.sort(key=lambda e: e.start_ns())
        current = peak = 0
        for e in events:
            current += e.nbytes()  # positive = allocation, negative = free
            peak = max(peak, current)
        return peak
    finally:
        # `profile` sits in reference cycles; drop its event buffers now instead of at the next
        # full garbage collection (otherwise RSS saw-tooths by tens of MB across trials).
        prof.profiler = None


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 for a moment (C++ log lines that no setting turns off)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


@functools.cache
def _libc() -> Any:
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (macOS, musl, Windows)
        return None


def release_free_memory() -> None:
    """Hand freed heap pages back to the OS (glibc keeps them, so RSS would only ever grow).

    The profiler's threads leave freed memory in their own malloc arenas; without this a long
    session's RSS creeps up by ~1 MB per trial although nothing is leaked.
    """
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def _profiler_device(device: torch.device) -> Any:
    return torch.autograd.DeviceType.CPU if device.type == "cpu" else torch.autograd.DeviceType.CUDA


def environment(device: torch.device) -> dict[str, Any]:
    """What a number depends on: versions, device, CPU model and vector unit, GPU, cores, threads."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    elif device.type == "cpu":
        name = _cpu_name()
    else:
        name = device.type
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": str(device),
        "device_name": name,
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "platform": platform.platform(terse=True),
        # the machine, whatever device the trial ran on (a workshop compares machines)
        "cpu_model": _cpu_name(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # e.g. AVX2, AVX512
        "gpu_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "",
    }


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def _fmt_bytes(n: float | None) -> str:
    if n is None:
        return "n/a"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


@dataclass(frozen=True)
class TrialResult:
    """One measured trial: raw per-step samples kept, statistics derived from them."""

    knobs: Knobs
    status: str  # ok | oom | error | nan | interrupted
    message: str = ""  # what went wrong and what to try (empty when ok)
    samples_per_s: float | None = None  # samples in the measured window / its wall time
    step_time_s: float | None = None  # median optimizer-step time
    step_time_iqr_s: float | None = None  # interquartile range of step times (noise)
    step_times_s: tuple[float, ...] = ()  # raw per-step times, measured window only
    data_wait_s: tuple[float, ...] = ()  # raw per-step host time blocked on the next batch(es)
    data_wait_share: float | None = None  # sum(data wait) / window wall time
    peak_memory_bytes: int | None = None  # peak tensor memory on the device during a step
    startup_s: float | None = None  # loader start until the first batch is on the device
    compile_s: float | None = None  # warm-up steps' wall time (includes torch.compile)
    samples_per_step: int | None = None  # batch_size * accum_steps actually seen (last batch may be short)
    losses: tuple[float, ...] = ()  # per measured step (mean over its micro-batches)
    notes: tuple[str, ...] = ()  # no-op knobs, warnings, noise flags
    env: dict[str, Any] = field(default_factory=dict)
    trial_id: int | None = None
    started_at: str = ""
    where: str = ""  # the stage a failure happened in: model, loss, data, step_fn, optimizer, ...
    traceback: str = ""  # full traceback of a failure (not shown in the one-line repr)
    extra: dict[str, Any] = field(default_factory=dict)  # diagnostics attached by later stages
    participant: str = ""  # who ran it (set by the ResultLog; a workshop gathers many participants)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def relative_noise(self) -> float | None:
        """IQR / median of step time: 0.05 means the middle half of steps spread over 5%."""
        if not self.step_time_s or self.step_time_iqr_s is None:
            return None
        return self.step_time_iqr_s / self.step_time_s

    def __repr__(self) -> str:
        head = f"TrialResult#{self.trial_id}" if self.trial_id is not None else "TrialResult"
        if not self.ok and self.samples_per_s is None:
            return f"<{head} {self.status.upper()}: {self.message} | {self.knobs}>"
        noise = self.relative_noise or 0.0
        parts = [
            f"{self.samples_per_s:,.1f} samples/s ±{noise * 100:.0f}%",
            f"step {self.step_time_s * 1e3:.1f} ms",
            f"data-wait {self.data_wait_share * 100:.0f}%",
            f"peak {_fmt_bytes(self.peak_memory_bytes)}",
            self.status if self.ok else f"{self.status.upper()}: {self.message}",
        ]
        return f"<{head} " + " | ".join(parts) + f" | {self.knobs}>"

    def to_code(self, **kwargs: Any) -> str:
        """Plain-PyTorch code reproducing this trial's knobs (see `Knobs.to_code`)."""
        return self.knobs.to_code(**kwargs)

    def to_record(self) -> dict[str, Any]:
        """A flat, JSON-safe dict (knobs inlined) for the log and for pandas."""
        d = asdict(self)
        knobs = d.pop("knobs")
        d = {**{k: knobs[k] for k in knobs}, **d}
        d["checkpoint"] = list(self.knobs.checkpoint)
        d["step_times_s"] = list(self.step_times_s)
        d["data_wait_s"] = list(self.data_wait_s)
        d["losses"] = [None if not math.isfinite(x) else x for x in self.losses]
        d["notes"] = list(self.notes)
        d["final_loss"] = next((x for x in reversed(self.losses) if math.isfinite(x)), None)
        return d

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> TrialResult:
        """Rebuild a result from `to_record()` output (as read back from the JSONL log)."""
        from .knobs import knob_names

        knobs = Knobs.from_dict({k: rec[k] for k in knob_names() if k in rec})
        kw = {k: rec[k] for k in cls.__dataclass_fields__ if k in rec and k != "knobs"}
        for k in ("step_times_s", "data_wait_s", "notes"):
            kw[k] = tuple(kw.get(k) or ())
        kw["losses"] = tuple(float("nan") if x is None else x for x in (kw.get("losses") or ()))
        return cls(knobs=knobs, **kw)


def summarize(step_times: Sequence[float]) -> tuple[float, float]:
    """(median, IQR) of raw step times."""
    if len(step_times) == 1:
        return step_times[0], 0.0
    q = statistics.quantiles(step_times, n=4, method="inclusive")
    return statistics.median(step_times), q[2] - q[0]


def now_iso() -> str:
    return _dt.datetime.now().isoformat(timespec="seconds")
