"""Meters and the result type: step clocks, peak memory, foreign CPU load, environment, TrialResult.

Timing rules: the measured window is bracketed by device syncs; per-step times
come from the host clock on CPU and from CUDA events on GPU (the host clock only sees kernel
launches there); data wait is the loader's part plus the host->device copy's own cost (CopyClock): on
CUDA the device's idle time while the host was in the loader and the copy's device time, so the queue a
pageable copy waits behind, and a loader hidden under queued kernels, count as compute; elsewhere host time.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import math
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from . import compat
from .knobs import BUILTIN_KNOBS, Knobs
from .system import malloc_policy, process_allocator, usable_cores
from .views import html_view

STATUSES = ("ok", "oom", "error", "nan", "interrupted")  # their colours: faces/display.py's STATUS_COLORS
FOREIGN_LOAD_LIMIT = 0.25  # cores busy with other processes before a trial is flagged as disturbed


def sync(device: torch.device) -> None:
    """Wait until queued device work is done (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def record_event(device: torch.device) -> Any:
    """A timing CUDA event recorded on `device`'s current stream (cuda:1 is timed on cuda:1's stream,
    whichever device is current); it completes when the work queued before it on that stream has run."""
    with torch.cuda.device(device):  # the event belongs to the trial's device, not the current one
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(torch.cuda.current_stream(device))
    return ev


class StepClock:
    """Per-step durations: CUDA events on the trial's device (read once at the end), perf_counter elsewhere.

    `event` (a stand-in for tests) makes events without CUDA, as in CopyClock."""

    def __init__(self, device: torch.device, event: Callable[[], Any] | None = None) -> None:
        self.cuda = event is not None or device.type == "cuda"  # timed by device events
        self.device = device
        self._event = event
        self._marks: list[Any] = []

    def mark(self) -> None:
        if self._event is not None:
            ev = self._event()
            ev.record()
            self._marks.append(ev)
        elif self.cuda:
            self._marks.append(record_event(self.device))
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

    @property
    def marks(self) -> list[Any]:
        """The marks so far: events (device clock) or perf_counter seconds (host clock)."""
        return list(self._marks)


class CopyClock:
    """The data's part of each optimizer step of an armed (measured) window, on the device's own clock.

    On CUDA three events per micro-batch, on the copy's stream: `begin()` as the host enters the
    loader, then one before and one after the host->device copy (`timed()`). An event completes when
    the device reaches it, so the time from `begin` to the copy's start is how long the device sat idle
    while the host was in the loader: zero when the kernels queued before it (the previous step's
    backward) outlast the loader, the loader's time less those kernels when they do not. The time
    between the copy's events is the copy alone: a pageable copy blocks the host until every kernel
    queued before it has run, and that drain lies before its first event (compute, not data). The
    events are read once, at the end of the window (no sync per step). Elsewhere (CPU, MPS) the host
    clock times the move: a CPU 'copy' (channels_last, a dtype change) has no queue, and the loader's
    data wait is its host time. `event` (a stand-in for tests) makes events without CUDA: `event()` has
    record(), elapsed_time(end) in ms and synchronize().
    """

    def __init__(self, device: torch.device, event: Callable[[], Any] | None = None) -> None:
        self.device = device
        self._event = event
        self.events = event is not None or device.type == "cuda"
        self.armed = False
        # per step: per micro-batch (begin, copy start, copy end) events, or the copy's host seconds
        self._steps: list[list[Any]] = []
        self._open: list[Any] = []
        self._begin: Any = None

    def arm(self) -> None:
        """Start recording (the measured window); earlier records are dropped."""
        self.armed, self._steps, self._open, self._begin = True, [], [], None

    def disarm(self) -> None:
        self.armed = False

    def _mark(self) -> Any:
        if self._event is not None:
            ev = self._event()
            ev.record()
            return ev
        return record_event(self.device)

    def begin(self) -> None:
        """The host enters the loader: an event on the device's queue (armed, with events; no sync)."""
        if self.armed and self.events:
            self._begin = self._mark()

    @contextlib.contextmanager
    def timed(self) -> Iterator[None]:
        """Time the copy inside the block (nothing is recorded unless armed)."""
        if not self.armed:
            yield
            return
        if self.events:
            start = self._mark()
            yield
            self._open.append((self._begin if self._begin is not None else start, start, self._mark()))
            self._begin = None
        else:
            t0 = time.perf_counter()
            yield
            self._open.append(time.perf_counter() - t0)

    def end_step(self) -> None:
        """Close one optimizer step (its micro-batches' copies add up)."""
        if self.armed:
            self._steps.append(self._open)
            self._open = []

    def _read(self) -> None:
        """Wait for the last event recorded (once): every event before it on the queue has completed too."""
        last = next((marks[-1][-1] for marks in reversed(self._steps) if marks), None)
        if last is not None:
            last.synchronize()

    def per_step_s(self) -> list[float]:
        """Copy seconds per closed step; with events this waits for the last one (once)."""
        if not self.events:
            return [sum(step) for step in self._steps]
        self._read()
        return [sum(start.elapsed_time(end) for _, start, end in marks) / 1e3 for marks in self._steps]

    def loader_idle_per_step_s(self) -> list[float] | None:
        """Per closed step, the device's idle seconds while the host was in the loader (from each
        micro-batch's `begin` to its copy's start); None without events (there the host's loader time
        is the figure)."""
        if not self.events:
            return None
        self._read()
        return [sum(begin.elapsed_time(start) for begin, start, _ in marks) / 1e3 for marks in self._steps]

    def host_idle_per_step_s(self, steps: StepClock) -> list[float] | None:
        """Per closed step, the device's idle seconds from the end of the step before (the step clock's
        event) to the host entering the loader: host work between steps, not data. None without events
        on both clocks, or when the clocks do not cover the same steps."""
        marks = steps.marks
        if not self.events or not steps.cuda or len(marks) != len(self._steps) + 1:
            return None
        self._read()
        return [ended.elapsed_time(step[0][0]) / 1e3 if step else 0.0 for ended, step in zip(marks, self._steps)]


class CpuLoad:
    """Cores kept busy by *other* processes during a window: system CPU time minus our own tree's
    (psutil: Linux, macOS, Windows)."""

    def __init__(self) -> None:
        self._start = self._read()

    @staticmethod
    def _read() -> tuple[float, float, float] | None:
        try:
            import psutil

            t = psutil.cpu_times()
            # busy = everything but idle and iowait (iowait is Linux-only)
            busy = sum(t) - t.idle - getattr(t, "iowait", 0.0)
            # guest time is already counted inside user/nice on Linux
            busy -= getattr(t, "guest", 0.0) + getattr(t, "guest_nice", 0.0)
            proc = psutil.Process()
            own = sum(proc.cpu_times()[:2])
            for child in proc.children(recursive=True):
                try:
                    own += sum(child.cpu_times()[:2])
                except psutil.Error:
                    pass
            return busy, own, time.monotonic()
        except Exception:  # psutil missing, AccessDenied, an odd platform: no figure, never a failed trial
            return None

    def foreign_cores(self) -> float | None:
        """Average number of cores used by other processes since construction (None if unreadable)."""
        end = self._read()
        if self._start is None or end is None:
            return None
        wall = end[2] - self._start[2]
        if wall <= 0:
            return None
        foreign = (end[0] - self._start[0]) - (end[1] - self._start[1])
        return max(0.0, foreign / wall)


class KernelTime:
    """This process's page faults and kernel CPU time over a window (`resource.getrusage`; None
    where the module is missing, e.g. Windows).

    Why: on glibc, memory freed at the end of a step can go back to the OS and be faulted in again
    (a minor fault per 4 KiB page, zeroed by the kernel) by the next step. Whether it does depends on
    the heap's history in this process; on a 2-core EPYC each 10% of kernel time cost 10-16% of the
    samples/s (benchmarks/HISTORY.md). The kernel's share of CPU time shows it.
    """

    def __init__(self) -> None:
        self._start = self._read()

    @staticmethod
    def _read() -> tuple[int, float, float] | None:
        try:
            import resource

            u = resource.getrusage(resource.RUSAGE_SELF)
            return u.ru_minflt + u.ru_majflt, u.ru_utime, u.ru_stime
        except Exception:  # no resource module (Windows): no figure, never a failed trial
            return None

    def since(self) -> tuple[int, float] | None:
        """(page faults, kernel share of the process's CPU seconds) since construction, or None."""
        end = self._read()
        if self._start is None or end is None:
            return None
        faults = end[0] - self._start[0]
        user, kernel = end[1] - self._start[1], end[2] - self._start[2]
        return faults, (kernel / (user + kernel) if user + kernel > 0 else 0.0)


def live_tensor_bytes(*groups: Any) -> int:
    """Bytes of distinct storages reachable from parameters, grads and optimizer state (a DTensor's:
    its local shard's)."""
    seen: set[tuple[int, str]] = set()
    total = 0

    def add(t: Any) -> None:
        nonlocal total
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            st = local_tensor(t).untyped_storage()
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


def local_tensor(t: Any) -> Any:
    """This process's part of a tensor: a DTensor's local shard (FSDP2), anything else as it is."""
    return t.to_local() if hasattr(t, "to_local") else t


def model_state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Parameters + gradients + optimizer state this process holds, from its local shards.

    Gradients count once per trainable parameter, at the parameter's size: zero_grad frees them
    between steps, but every step holds them from backward to the optimizer step."""
    params = list(model.parameters())
    grads = sum(t.numel() * t.element_size() for t in map(local_tensor, params) if t.requires_grad)
    return live_tensor_bytes(params) + grads + live_tensor_bytes(list(optimizer.state.values()))


def memory_meter(device_type: str) -> str | None:
    """How peak memory is measured on this device type: 'allocator' (CUDA's max_memory_allocated),
    'profiler' (CPU: replay of the profiler's memory events) or None (not measured).

    MPS has no peak counter, and the profiler path looks for CPU or CUDA memory events, which an
    MPS step does not produce (the breakdown would read 0 there): it is reported as not measured. torch.mps's current/driver allocated memory are levels, not peaks.
    """
    return {"cuda": "allocator", "cpu": "profiler"}.get(device_type)


def profile_peak_bytes(fn: Callable[[], Any], device: torch.device) -> int:
    """Peak extra bytes allocated on `device` while `fn` runs, from the profiler's memory events.

    On CPU there is no allocator with peak statistics and peak RSS hides reuse inside glibc, so
    we replay every allocation/free the profiler saw in time order and take the running maximum.
    Raises ValueError on a device the profiler's memory events do not cover (MPS): see memory_meter.
    """
    from torch.profiler import ProfilerActivity, profile

    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"peak memory is not measured on {device.type!r} (see measure.memory_meter); "
                         "use device='cpu' or 'cuda' for a memory figure")

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with quiet_stderr():  # kineto prints "USDT ... profiler_start/stop" lines on every start/stop
        prof.start()
    try:
        fn()
    finally:
        with quiet_stderr():
            prof.stop()
    try:
        events = sorted(compat.memory_events(prof, device.type))  # (time ns, +alloc / -free bytes)
        current = peak = 0
        for _, nbytes in events:
            current += nbytes
            peak = max(peak, current)
        return peak
    finally:
        # `profile` sits in reference cycles; drop its event buffers now instead of at the next
        # full garbage collection (otherwise RSS saw-tooths by tens of MB across trials).
        prof.profiler = None


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
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


RAN_IN_ENV = "WORKBENCH_PROCESS"  # set to "worker" in a workbench's worker process (launch/local.py), "job" in a job


def ran_in() -> str:
    """Where this trial runs: "worker" (its workbench's worker process), "job" (a fresh process or a cluster
    job), "kernel" (the calling process's main thread) or "kernel thread" (another thread of it). In the
    calling process the figure can depend on what that process ran before (docs/measurement.md)."""
    where = os.environ.get(RAN_IN_ENV, "")
    if where:
        return where
    return "kernel" if threading.current_thread() is threading.main_thread() else "kernel thread"


def environment(device: torch.device) -> dict[str, Any]:
    """What a number depends on: versions, device, CPU model and vector unit, GPU, cores, threads."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    elif device.type == "cpu":
        name = cpu_name()
    else:
        name = device.type
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": str(device),
        "device_name": name,
        "cpu_count": os.cpu_count(),
        "usable_cores": usable_cores(),  # affinity and cgroup quota
        "threads": torch.get_num_threads(),
        "platform": platform.platform(terse=True),
        "host": platform.node().split(".")[0],  # the machine (a cluster's trials run on its nodes)
        # the machine, whatever device the trial ran on (a workshop compares machines)
        "cpu_model": cpu_name(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # e.g. AVX2, AVX512
        "gpu_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "",
        # whether a step's freed memory goes back to the OS (page faults; docs/measurement.md 'Page faults')
        "malloc": malloc_policy(),
        # the allocator mode the trial's process ran in (the `allocator` knob; read back, not assumed)
        "allocator": process_allocator(),
        "ran_in": ran_in(),  # the process and thread that ran it (launch/local.py: why it matters)
    }


def cpu_name() -> str:
    """This machine's CPU model, as the kernel names it ("cpu" when it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def fmt_bytes(n: float | None) -> str:
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
    step_time_s: float | None = None  # median optimizer-step time (derived from step_times_s)
    step_time_iqr_s: float | None = None  # interquartile range of step times (derived from step_times_s)
    step_times_s: tuple[float, ...] = ()  # raw per-step times, measured window only (the stored truth)
    data_wait_s: tuple[float, ...] = ()  # raw per-step data wait: the loader's (CUDA: device idle) + the copy's own cost
    data_wait_share: float | None = None  # sum(data wait) / window wall time (the copy included)
    copy_share: float | None = None  # the host->device copy's own cost / window wall time (part of data_wait_share)
    peak_memory_bytes: int | None = None  # peak tensor memory on the device during a step
    model_state_bytes: int | None = None  # params + grads + optimizer state per process (largest rank's)
    startup_s: float | None = None  # loader start until the first batch is on the device
    compile_s: float | None = None  # warm-up steps' wall time (includes torch.compile)
    samples_per_step: int | None = None  # batch_size * accum_steps actually seen (last batch may be short)
    losses: tuple[float, ...] = ()  # per measured step (mean over its micro-batches)
    tokens_per_s: float | None = None  # token batches: trained tokens in the window / its wall time
    padding_share: float | None = None  # token batches: share of the window's input_ids slots that were padding
    shapes: int | None = None  # distinct input shapes the trial's batches had (warm-up and window)
    shape_warmup_s: float | None = None  # their first calls' one-time cost (plans, autotune, recompiles), apart from the window
    notes: tuple[str, ...] = ()  # no-op knobs, warnings, noise flags
    env: dict[str, Any] = field(default_factory=dict)
    trial_id: int | None = None
    started_at: str = ""
    where: str = ""  # the stage a failure happened in: model, loss, data, step_fn, optimizer, ...
    traceback: str = ""  # full traceback of a failure (not shown in the one-line repr)
    extra: dict[str, Any] = field(default_factory=dict)  # diagnostics attached by later stages
    trace_path: str | None = None  # Chrome-trace JSON of steps profiled after the window (run(trace=True))
    participant: str = ""  # who ran it (set by the ResultLog; a workshop gathers many participants)

    def __post_init__(self) -> None:
        # Median and IQR are derived from the raw step times, never carried over: a copy with other
        # (e.g. pooled) step times gets their statistics, not the first run's.
        if self.step_times_s:
            median, iqr = summarize(list(self.step_times_s))
            object.__setattr__(self, "step_time_s", median)
            object.__setattr__(self, "step_time_iqr_s", iqr)

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
            f"peak {fmt_bytes(self.peak_memory_bytes)}",
            f"model state {fmt_bytes(self.model_state_bytes)}",
            self.status if self.ok else f"{self.status.upper()}: {self.message}",
        ]
        return f"<{head} " + " | ".join(parts) + f" | {self.knobs}>"

    def _repr_html_(self) -> str | None:
        """The card Jupyter draws: faces/display.py's `trial_html`, registered in `views.HTML` (None: the repr)."""
        return html_view(self)

    def to_code(self, **kwargs: Any) -> str:
        """Plain-PyTorch code reproducing this trial (`codegen.trial_to_code`: its knobs and the step it ran)."""
        from .codegen import trial_to_code

        return trial_to_code(self, **kwargs)

    def pinned_knobs(self) -> Knobs:
        """The knobs with the allocator mode the trial's process ran in (read back, env "allocator") when
        the knobs left it None: what the exported script must start with to measure what the trial did."""
        from .knobs.process import pin_allocator

        return pin_allocator(self.knobs, self.env.get("allocator") if isinstance(self.env, dict) else None)

    @property
    def steady(self) -> bool | None:
        """Whether the measured window was steady state (steady.py): False after a warm-up cap, a
        trending window or a window faster than its loader; None for trials recorded before the check."""
        value = self.extra.get("steady") if isinstance(self.extra, dict) else None
        return value if isinstance(value, bool) else None

    def to_record(self) -> dict[str, Any]:
        """A flat, JSON-safe dict (knobs inlined) for the log and for pandas."""
        d = asdict(self)
        d.pop("knobs")
        knobs = self.knobs.to_dict()  # your @wb.knob knobs too, and unknown ones read back earlier
        d = {**knobs, **d, "user_knobs": [n for n in knobs if n not in BUILTIN_KNOBS]}
        d["step_times_s"] = list(self.step_times_s)
        d["data_wait_s"] = list(self.data_wait_s)
        d["losses"] = [None if not math.isfinite(x) else x for x in self.losses]
        d["notes"] = list(self.notes)
        d["final_loss"] = next((x for x in reversed(self.losses) if math.isfinite(x)), None)
        return d

    @classmethod
    def from_record(cls, rec: dict[str, Any], knobs: Knobs | None = None) -> TrialResult:
        """Rebuild a result from `to_record()` output (as read back from the JSONL log); `knobs`:
        the record's knobs when the caller already built them (a reader caching repeats)."""
        from .knobs import knob_names

        if knobs is None:
            names = [*knob_names(), *(rec.get("user_knobs") or ())]  # a knob whose cell has not run stays, unknown
            knobs = Knobs.from_dict({k: rec[k] for k in names if k in rec}, keep_unknown=True)
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
    """A trial's `started_at`: the local time of the machine that runs it, ISO 8601 to the second, no offset
    (docs/results.md; the table parses it as a naive timestamp, so old and new logs stay comparable)."""
    return _dt.datetime.now().isoformat(timespec="seconds")
