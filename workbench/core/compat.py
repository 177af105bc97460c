"""Every access to a private PyTorch internal, in one place, guarded.

PyTorch renames private names between releases. Each function here tries the private route and,
when it is gone, falls back to something that keeps the trial running and returns a sentence for
the result's `notes` instead of raising. `PRIVATE` lists every internal we touch; the test
suite checks each one against the installed torch and names the attribute that went missing.
"""

from __future__ import annotations

import contextlib
import importlib
import time
from collections.abc import Iterator
from typing import Any

import torch

# name, module and attribute path of every private internal used below; tests/test_compat.py checks them
_PRIVATE_TABLE = """
remove_worker_pids          torch.utils.data._utils.signal_handling  _remove_worker_pids
worker_pids_set             torch.utils.data.dataloader              _MultiProcessingDataLoaderIter._worker_pids_set
shutdown_workers            torch.utils.data.dataloader              _MultiProcessingDataLoaderIter._shutdown_workers
loader_iterator             torch.utils.data.dataloader              DataLoader._iterator
kineto_results              torch.autograd.profiler                  profile.kineto_results
dynamo_counters             torch._dynamo.utils                      counters
dynamo_compilation_metrics  torch._dynamo.utils                      get_compilation_metrics
dynamo_graph_break_reasons  torch._dynamo.utils                      graph_break_reasons
record_memory_history       torch.cuda.memory                        _record_memory_history
memory_snapshot             torch.cuda.memory                        _snapshot
memory_viz                  torch.cuda._memory_viz                   trace_plot
cpu_avx512_bf16             torch.cpu                                _is_avx512_bf16_supported
cpu_amx_tile                torch.cpu                                _is_amx_tile_supported
"""
PRIVATE: dict[str, tuple[str, str]] = {name: (module, attr) for name, module, attr in
                                       (line.split() for line in _PRIVATE_TABLE.strip().splitlines())}


def missing(name: str) -> str | None:
    """None if torch still has the internal `name` (a key of PRIVATE), else the dotted name that is
    gone. Instance attributes are looked up on a small live object (a 1-worker DataLoader, a profiler)."""
    module_name, path = PRIVATE[name]
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError:
        return module_name
    *owners, attr = path.split(".")
    for part in owners:
        if not hasattr(obj, part):
            return f"{module_name}.{'.'.join(owners)}"
        obj = getattr(obj, part)
    instance = _INSTANCES.get(name)
    if instance is not None:
        with instance() as live:
            return None if hasattr(live, attr) else f"{module_name}.{path}"
    return None if hasattr(obj, attr) else f"{module_name}.{path}"


@contextlib.contextmanager
def _worker_iterator() -> Iterator[Any]:
    from torch.utils.data import DataLoader

    loader = DataLoader(list(range(4)), batch_size=2, num_workers=1)
    it = iter(loader)
    try:
        yield it
    finally:
        shutdown_workers(loader, it)


@contextlib.contextmanager
def _loader() -> Iterator[Any]:
    from torch.utils.data import DataLoader

    yield DataLoader(list(range(4)), batch_size=2)


@contextlib.contextmanager
def _profiler() -> Iterator[Any]:
    with torch.autograd.profiler.profile() as prof:
        torch.ones(2) + 1
    yield prof


_INSTANCES = {"worker_pids_set": _worker_iterator, "loader_iterator": _loader, "kineto_results": _profiler}


# ---- DataLoader workers ------------------------------------------------------------------------
def unregister_workers(iterator: Iterator) -> str | None:
    """Keep a multi-process iterator's workers out of PyTorch's process-wide SIGCHLD check.

    Returns a note when torch's internals moved (the workers then stay registered: a crashing
    worker may raise into the main thread instead of ending only the trial).
    """
    if not getattr(iterator, "_worker_pids_set", False):
        return None
    try:
        from torch.utils.data._utils import signal_handling

        signal_handling._remove_worker_pids(id(iterator))
        iterator._worker_pids_set = False
    except (ImportError, AttributeError) as e:
        return f"could not unregister DataLoader workers from the SIGCHLD handler ({e}); a dying worker may interrupt the notebook"
    return None


def shutdown_workers(loader: Any, iterator: Any) -> None:
    """Stop worker processes now (persistent ones included); falls back to dropping references."""
    for it in (iterator, getattr(loader, "_iterator", None)):
        stop = getattr(it, "_shutdown_workers", None)
        if stop is not None:
            try:
                stop()
            except Exception:  # a dead worker, an interpreter shutting down: nothing left to stop
                pass
    if loader is not None and getattr(loader, "_iterator", None) is not None:
        loader._iterator = None


# ---- profiler memory events --------------------------------------------------------------------
def memory_events(prof: Any, device_type: str) -> list[tuple[int, int]]:
    """(start ns, bytes: + allocation / - free) of every [memory] event the profiler saw on the
    device. Raises RuntimeError naming the missing internal when torch moved it."""
    try:
        results = prof.profiler.kineto_results
        wanted = torch.autograd.DeviceType.CPU if device_type == "cpu" else torch.autograd.DeviceType.CUDA
        return [(e.start_ns(), e.nbytes()) for e in results.events()
                if e.name() == "[memory]" and e.device_type() == wanted]
    except AttributeError as e:
        raise RuntimeError(f"torch.profiler internals moved (profile.profiler.kineto_results: {e})") from e


# ---- torch.compile statistics --------------------------------------------------------------------
MAX_REASONS = 10  # reasons kept per list (a model can break on every layer)


def dynamo_counters() -> dict[str, dict[str, int]]:
    """A plain copy of dynamo's counters (empty when dynamo or the counters are gone)."""
    try:
        from torch._dynamo.utils import counters
    except Exception:
        return {}
    return {k: dict(v) for k, v in counters.items()}


def preload_dynamo() -> None:
    """Import torch._dynamo now (DDP's first construction does, seconds per process): done once in
    a parent before forking ranks; a torch without it is not an error (DDP then skips it too)."""
    with contextlib.suppress(ImportError):
        importlib.import_module("torch._dynamo")


def compilation_metrics_since(start_us: int) -> list[Any]:
    """Dynamo compilation records that started after `start_us` (microseconds since the epoch)."""
    try:
        from torch._dynamo.utils import get_compilation_metrics
    except Exception:
        return []
    return [m for m in get_compilation_metrics() if (getattr(m, "start_time_us", None) or 0) >= start_us]


def graph_break_records() -> list[Any]:
    """Dynamo's process-wide list of graph-break records (reason + user stack); [] when it is gone."""
    try:
        from torch._dynamo.utils import graph_break_reasons
    except Exception:
        return []
    return graph_break_reasons if isinstance(graph_break_reasons, list) else []


def user_location(stack: Any) -> str:
    """`file:line in function` of the innermost frame outside torch itself (the user's code), or ''."""
    frames = [f for f in (stack or []) if getattr(f, "filename", None)]
    user = [f for f in frames if "/torch/" not in f.filename.replace("\\", "/")] or frames
    if not user:
        return ""
    f = user[-1]
    return f"{f.filename}:{f.lineno} in {f.name}"


def distinct_breaks(records: list[Any]) -> list[dict[str, Any]]:
    """Graph-break records grouped by (reason, user-code location): each once, with its count."""
    seen: dict[tuple[str, str], int] = {}
    for rec in records:
        key = (first_line(getattr(rec, "reason", rec)), user_location(getattr(rec, "user_stack", None)))
        seen[key] = seen.get(key, 0) + 1
    return [{"reason": r, "where": w, "count": n} for (r, w), n in sorted(seen.items(), key=lambda kv: -kv[1])]


def first_line(text: Any) -> str:
    """The first non-empty line of `text`, at most 200 characters."""
    lines = [s.strip() for s in str(text).strip().splitlines() if s.strip()]
    return lines[0][:200] if lines else ""


class CompileWatch:
    """Context manager: `.info` holds what dynamo compiled inside the block (filled on exit).

    `with CompileWatch(enabled=knobs.compile != "off") as watch: ...`; disabled, it does nothing
    and `.info` stays {}. It never raises out of `__exit__`: a failure to read torch internals
    becomes `info["errors"]`.
    """

    counters = staticmethod(dynamo_counters)  # replaceable in tests
    metrics_since = staticmethod(compilation_metrics_since)
    break_records = staticmethod(graph_break_records)

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = bool(enabled)
        self.info: dict[str, Any] = {}
        self._before: dict[str, dict[str, int]] = {}
        self._start_us = 0
        self._t0 = 0.0
        self._breaks_seen = 0

    def __enter__(self) -> CompileWatch:
        if self.enabled:
            try:
                self._before = self.counters()
                self._breaks_seen = len(self.break_records())
                self._start_us = time.time_ns() // 1000
                self._t0 = time.perf_counter()
            except Exception:  # never let diagnostics break the trial
                self._before = {}
        return self

    def __exit__(self, *exc: object) -> bool:
        if not self.enabled:
            return False
        try:
            self.info = self._collect()
        except Exception as e:
            self.info = {"graph_count": 0, "graph_breaks": 0, "break_reasons": [], "recompiles": 0,
                         "errors": [f"could not read compile statistics: {type(e).__name__}: {e}"]}
        return False  # exceptions from the block propagate unchanged

    def _collect(self) -> dict[str, Any]:
        after = self.counters()

        def delta(group: str) -> dict[str, int]:
            old = self._before.get(group, {})
            return {k: v - old.get(k, 0) for k, v in after.get(group, {}).items() if v - old.get(k, 0) > 0}

        breaks = delta("graph_break")  # {reason text: count}
        metrics = self.metrics_since(self._start_us)
        recompile_reasons = [first_line(m.recompile_reason) for m in metrics if getattr(m, "recompile_reason", None)]
        failures = [f"{m.fail_type}: {first_line(m.fail_reason)}" for m in metrics if getattr(m, "fail_type", None)]
        frames = delta("frames")
        records = self.break_records()
        new_breaks = records[self._breaks_seen:] if len(records) >= self._breaks_seen else records  # reset: all
        info: dict[str, Any] = {
            "graph_count": int(delta("stats").get("unique_graphs", 0)),
            "graph_breaks": int(sum(breaks.values())),
            "break_reasons": [first_line(r) for r in list(breaks)[:MAX_REASONS]],
            # each distinct break once: its reason, the user-code line, how often it happened
            "breaks": distinct_breaks(new_breaks)[:MAX_REASONS],
            "recompiles": len(recompile_reasons),
            "recompile_reasons": recompile_reasons[:MAX_REASONS],
            "frames_compiled": int(frames.get("total", 0)),
            "frames_ok": int(frames.get("ok", 0)),
            # dynamo's own time in compilation (tracing + backend); excludes running the graphs
            "dynamo_compile_s": round(sum(getattr(m, "entire_frame_compile_time_s", None) or 0.0 for m in metrics), 3),
            "ops_captured": int(sum(getattr(m, "graph_op_count", None) or 0 for m in metrics)),
            "wall_s": round(time.perf_counter() - self._t0, 3),
        }
        if failures:
            # with suppress_errors these frames ran in eager: the "compiled" model partly is not
            info["fallback"] = failures[:MAX_REASONS]
        return info


# ---- CUDA memory snapshot ------------------------------------------------------------------------
# torch.cuda.memory._record_memory_history / _snapshot and torch.cuda._memory_viz are documented
# (pytorch.org/docs/stable/torch_cuda_memory.html) but underscored. A failure costs the snapshot,
# never the trace or the trial: each function returns a note instead of raising.

def start_memory_history(max_entries: int) -> str | None:
    """Start recording CUDA allocations (for a snapshot); None on success, else a note."""
    try:
        torch.cuda.memory._record_memory_history(max_entries=max_entries)
        return None
    except Exception as e:  # private API moved or CUDA not usable
        return (f"no CUDA memory snapshot: torch.cuda.memory._record_memory_history failed "
                f"({type(e).__name__}: {e}); see torch.cuda.memory_summary() instead")


def stop_memory_history() -> None:
    """Stop recording CUDA allocations (a no-op if starting failed)."""
    with contextlib.suppress(Exception):
        torch.cuda.memory._record_memory_history(enabled=None)


def memory_snapshot() -> tuple[dict[str, Any] | None, str | None]:
    """(the recorded CUDA memory snapshot, None), or (None, a note) when torch cannot give one."""
    try:
        return torch.cuda.memory._snapshot(), None
    except Exception as e:
        return None, f"no CUDA memory snapshot: torch.cuda.memory._snapshot failed ({type(e).__name__}: {e})"


def memory_timeline_html(snapshot: dict[str, Any]) -> tuple[str | None, str | None]:
    """(the snapshot's HTML timeline from torch.cuda._memory_viz, None), or (None, a note)."""
    try:
        from torch.cuda import _memory_viz

        return _memory_viz.trace_plot(snapshot), None
    except Exception as e:
        return None, f"no memory timeline page: torch.cuda._memory_viz.trace_plot failed ({type(e).__name__}: {e})"


# ---- CPU capabilities --------------------------------------------------------------------------
def cpu_native_bf16() -> bool | None:
    """torch's own answer to "does this CPU have bf16 units" (AVX512-BF16 or AMX tiles), or None
    when those private checks are gone (the caller falls back to the kernel's CPU flags)."""
    answers = []
    for name in ("cpu_avx512_bf16", "cpu_amx_tile"):
        check = getattr(torch.cpu, PRIVATE[name][1], None)
        if check is None:
            continue
        try:
            answers.append(bool(check()))
        except Exception:
            continue
    return any(answers) if answers else None
