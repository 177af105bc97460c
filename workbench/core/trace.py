"""Traces for the standard viewers: a few profiled steps as a Chrome-trace JSON file.

    files = capture(step, trace_file(log_dir, "cnn"), device=device)   # step: one optimizer step
    files.path      -> open in https://ui.perfetto.dev or chrome://tracing; load in HolisticTraceAnalysis

Each step is a `ProfilerStep#N` range (from `prof.step()`); the caller names the phases inside it
with `record_function("data" | "forward" | "backward" | "optimizer")`. Tracing is for steps
*after* the measured window: the profiler slows every op it records, so a traced step is never a
measured one. On CUDA it also writes a memory snapshot (allocations with stack traces) and the
snapshot's HTML timeline.

Core module: imports only torch and the standard library.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import os
import pickle
import re
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from . import compat
from .measure import quiet_stderr, sync

PHASES = ("data", "forward", "backward", "optimizer")  # record_function names inside each step
STEP_LABEL = "ProfilerStep#"  # torch.profiler's name for the range around step N ("ProfilerStep*" averaged)
MEMORY_HISTORY_ENTRIES = 100_000  # allocation events kept by the CUDA memory recorder


KERNEL_CATS = ("kernel", "gpu_memcpy", "gpu_memset")  # device work in a Chrome trace (duration on the GPU)
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")  # host calls that queue it (cudaLaunchKernel, cuLaunchKernel, ...)


def phase_ranges(events: list[dict[str, Any]], cat: str = "user_annotation") -> dict[str, list[tuple[float, float]]]:
    """{phase: [(start, end) us]} of the step's record_function ranges (PHASES) in category `cat`."""
    out: dict[str, list[tuple[float, float]]] = {}
    for e in events:
        if e.get("cat") == cat and e.get("name") in PHASES:
            out.setdefault(e["name"], []).append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    return out


def _within(ts: float, ranges: dict[str, list[tuple[float, float]]]) -> str | None:
    return next((name for name, spans in ranges.items() if any(lo <= ts < hi for lo, hi in spans)), None)


def kernel_phases(events: list[dict[str, Any]]) -> list[tuple[dict[str, Any], str | None]]:
    """Each device event (kernel, memcpy, memset) with the phase that queued it: the host range holding
    its launch call (matched by the trace's `correlation`), whichever thread launched it (autograd's
    backward kernels come from its own thread); a kernel without a matched launch: the device-side range
    (gpu_user_annotation) it ran in; else None."""
    host = phase_ranges(events)
    device = phase_ranges(events, "gpu_user_annotation")
    launches = {e["args"]["correlation"]: float(e["ts"]) for e in events
                if e.get("cat") in LAUNCH_CATS and "correlation" in (e.get("args") or {})}
    out = []
    for e in events:
        if e.get("cat") not in KERNEL_CATS:
            continue
        at = launches.get((e.get("args") or {}).get("correlation"))
        out.append((e, _within(at, host) if at is not None else _within(float(e["ts"]), device)))
    return out


def stage_ms(events: list[dict[str, Any]], steps: int) -> dict[str, float]:
    """Milliseconds per step of each stage (PHASES, each once) in a trace's steps: device time where a
    device ran the stage (the kernels its range queued, kernel_phases), host time of its range otherwise
    (the CPU; and `data`, whose loader runs on the host and whose blocking copy waits there)."""
    host = phase_ranges(events)
    device: dict[str, float] = {}
    for e, phase in kernel_phases(events):
        if phase is not None:
            device[phase] = device.get(phase, 0.0) + float(e["dur"])
    out = {}
    for name in PHASES:
        us = device[name] if name != "data" and device.get(name) else sum(hi - lo for lo, hi in host.get(name, []))
        out[name] = us / 1e3 / max(1, steps)
    return out


def step_events(path: str | os.PathLike) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the ProfilerStep ranges, every complete event inside one) of a trace this module wrote."""
    import json

    doc = json.loads(Path(path).read_text())
    events = [e for e in doc.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    steps = [e for e in events if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith(STEP_LABEL)]
    spans = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in steps]
    return steps, [e for e in events if any(lo <= float(e["ts"]) < hi for lo, hi in spans)]


@dataclass(frozen=True)
class TraceFiles:
    """What one capture wrote. `averages` is the profiler's key_averages() over the traced steps."""

    path: Path  # Chrome-trace JSON
    steps: int
    memory_snapshot: Path | None = None  # CUDA only: pickled torch.cuda.memory._snapshot()
    memory_html: Path | None = None  # CUDA only: the snapshot's timeline (torch.cuda._memory_viz)
    notes: tuple[str, ...] = ()
    averages: Any = None


def trace_file(directory: str | os.PathLike | None, stem: str, kind: str = "trace") -> Path:
    """A fresh `<stem>-<kind>-<time>-<id>.pt.trace.json` in `directory` (the log's folder; the
    temp dir when there is no log). The suffix is what HolisticTraceAnalysis and TensorBoard look for."""
    fallback = Path(tempfile.gettempdir()) / "workbench-traces"
    folder = Path(directory) if directory is not None else fallback
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:  # a read-only or vanished log folder must not fail the trial: trace to the temp dir
        folder = fallback
        with contextlib.suppress(OSError):  # if even that fails, capture() notes it; the trial stands
            folder.mkdir(parents=True, exist_ok=True)
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", stem) or "trial"
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return folder / f"{safe}-{kind}-{stamp}-{uuid.uuid4().hex[:6]}.pt.trace.json"


def capture(step: Callable[[], Any], path: str | os.PathLike, *, device: torch.device, steps: int = 3,
            warmup: int = 1, memory_snapshot: bool = True, keep_averages: bool = False) -> TraceFiles:
    """Profile `warmup` + `steps` calls of `step` (one optimizer step each); keep the last `steps`.

    Writes the Chrome trace to `path`. `step` should name its phases with `record_function`.
    On CUDA with `memory_snapshot`, also writes `<path>.memory.pickle` and `<path>.memory.html`.
    """
    if steps < 1 or warmup < 0:
        raise ValueError(f"steps must be >= 1 and warmup >= 0, got steps={steps}, warmup={warmup}")
    path = Path(path)
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    written: dict[str, Any] = {}

    def ready(prof: profile) -> None:  # called once, after the last active step
        try:
            prof.export_chrome_trace(str(path))
            if not _complete_json(path):  # the writer may not report a full disk: check the end
                raise OSError(errno.ENOSPC, "the trace file was cut short")
        except (OSError, RuntimeError) as e:  # a full disk, read-only folder: no half-written trace left
            written["error"] = e if isinstance(e, OSError) else OSError(errno.EIO, str(e))
            _remove(path)
            return
        if keep_averages:
            written["averages"] = prof.key_averages()

    notes: list[str] = []
    recording = cuda and memory_snapshot and _start_memory_history(notes)
    snap: dict[str, Any] | None = None
    try:
        # The schedule is what makes prof.step() label each step "ProfilerStep#N" in the trace.
        prof = profile(activities=activities, schedule=schedule(wait=0, warmup=warmup, active=steps, repeat=1),
                       on_trace_ready=ready)
        with quiet_stderr():  # kineto prints "profiler_start/stop" lines that no setting turns off
            prof.start()
        try:
            for _ in range(warmup + steps):
                step()
                sync(device)  # the step's device work lands inside its ProfilerStep range
                with quiet_stderr():
                    prof.step()
        finally:
            with quiet_stderr():
                prof.stop()
        if recording:
            snap = _memory_snapshot(notes)
    finally:
        if recording:
            _stop_memory_history()
    if "error" in written:
        e = written["error"]
        raise OSError(e.errno, f"could not write the trace to {path.parent} ({e.strerror or e}); "
                               "free space or pass a writable log folder") from e
    if not path.exists():
        raise RuntimeError("the profiler produced no trace (was the step interrupted?)")
    snap_path = html_path = None
    if snap is not None:
        snap_path, html_path = _write_memory_files(snap, path, notes)
    return TraceFiles(path=path, steps=steps, memory_snapshot=snap_path, memory_html=html_path,
                      notes=tuple(notes), averages=written.get("averages"))


# ---- CUDA memory snapshot: the private torch calls live in compat.py, each with a fallback note ---

def _start_memory_history(notes: list[str]) -> bool:
    note = compat.start_memory_history(MEMORY_HISTORY_ENTRIES)
    if note:
        notes.append(note)
    return note is None


def _memory_snapshot(notes: list[str]) -> dict[str, Any] | None:
    snap, note = compat.memory_snapshot()
    if note:
        notes.append(note)
    return snap


def _stop_memory_history() -> None:
    compat.stop_memory_history()


def _write_memory_files(snap: dict[str, Any], trace_path: Path, notes: list[str]) -> tuple[Path | None, Path | None]:
    """The snapshot as the pickle pytorch.org/memory_viz opens (what _dump_snapshot writes, taken
    from memory so nothing is unpickled here), and its HTML timeline."""
    base = str(trace_path).removesuffix(".json")
    snap_path = Path(base + ".memory.pickle")
    html_path: Path | None = Path(base + ".memory.html")
    try:
        with open(snap_path, "wb") as f:
            pickle.dump(snap, f)
    except OSError as e:  # the trace stands; only the snapshot is missing
        _remove(snap_path)
        notes.append(f"no memory snapshot: could not write it ({e.strerror or type(e).__name__})")
        return None, None
    page, note = compat.memory_timeline_html(snap)
    if page is not None:
        try:
            html_path.write_text(page)
        except OSError as e:
            _remove(html_path)
            notes.append(f"no memory timeline page: could not write it ({e.strerror or type(e).__name__})")
            return snap_path, None
        notes.append("the memory timeline page loads its viewer script from cdn.jsdelivr.net; offline, "
                     "open the .memory.pickle at pytorch.org/memory_viz from a connected machine")
    else:
        notes.append(f"{note}; drag {snap_path.name} onto pytorch.org/memory_viz instead")
        html_path = None
    return snap_path, html_path


def _remove(path: Path) -> None:
    """Delete a half-written file, if it is there and can be deleted."""
    with contextlib.suppress(OSError):
        path.unlink()


def _complete_json(path: Path) -> bool:
    """Whether the file ends like a whole JSON document (its last non-blank byte closes it)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 64))
            end = f.read().rstrip()
    except OSError:
        return False
    return end.endswith((b"}", b"]"))
