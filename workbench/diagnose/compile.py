"""Compile diagnostics: what torch.compile did during a block of code, and why it may not pay.

`CompileWatch` snapshots dynamo's process-wide counters and compilation metrics on entry and
stores the difference on exit as a JSON-safe dict (graphs compiled, graph breaks and their
reasons, recompiles and their reasons, frames that failed and fell back to eager). The runner
wraps a compiled trial's warm-up + measurement in it and keeps `.info` as
`result.extra["compile"]`; `explain_compile` turns that into plain sentences.
"""

from __future__ import annotations

import time
from typing import Any

MAX_REASONS = 10  # reasons kept per list (a model can break on every layer)


def _counters() -> dict[str, dict[str, int]]:
    """A plain copy of dynamo's counters (empty when dynamo cannot be imported)."""
    try:
        from torch._dynamo.utils import counters
    except Exception:
        return {}
    return {k: dict(v) for k, v in counters.items()}


def _metrics_since(start_us: int) -> list[Any]:
    """Dynamo compilation records that started after `start_us` (microseconds since the epoch)."""
    try:
        from torch._dynamo.utils import get_compilation_metrics
    except Exception:
        return []
    return [m for m in get_compilation_metrics() if (getattr(m, "start_time_us", None) or 0) >= start_us]


def _first_line(text: Any) -> str:
    lines = [s.strip() for s in str(text).strip().splitlines() if s.strip()]
    return lines[0][:200] if lines else ""


class CompileWatch:
    """Context manager: `.info` holds what dynamo compiled inside the block (filled on exit).

    `with CompileWatch(enabled=knobs.compile != "off") as watch: ...`; disabled, it does nothing
    and `.info` stays {}. It never raises out of `__exit__`: a failure to read torch internals
    becomes `info["errors"]`.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = bool(enabled)
        self.info: dict[str, Any] = {}
        self._before: dict[str, dict[str, int]] = {}
        self._start_us = 0
        self._t0 = 0.0

    def __enter__(self) -> CompileWatch:
        if self.enabled:
            try:
                self._before = _counters()
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
        after = _counters()

        def delta(group: str) -> dict[str, int]:
            old = self._before.get(group, {})
            return {k: v - old.get(k, 0) for k, v in after.get(group, {}).items() if v - old.get(k, 0) > 0}

        breaks = delta("graph_break")  # {reason text: count}
        metrics = _metrics_since(self._start_us)
        recompile_reasons = [_first_line(m.recompile_reason) for m in metrics if getattr(m, "recompile_reason", None)]
        failures = [f"{m.fail_type}: {_first_line(m.fail_reason)}" for m in metrics if getattr(m, "fail_type", None)]
        frames = delta("frames")
        info: dict[str, Any] = {
            "graph_count": int(delta("stats").get("unique_graphs", 0)),
            "graph_breaks": int(sum(breaks.values())),
            "break_reasons": [_first_line(r) for r in list(breaks)[:MAX_REASONS]],
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


def explain_compile(info: dict[str, Any] | None, *, speedup: float | None = None, device_type: str = "cpu",
                    num_parameters: int | None = None, compile_s: float | None = None) -> list[str]:
    """Plain sentences on a compiled trial: graphs, breaks, recompiles, and why it may be no faster.

    `speedup` is compiled vs eager throughput (same knobs otherwise), when both were measured.
    """
    lines: list[str] = []
    if compile_s is not None:
        lines.append(f"compile + warm-up cost {compile_s:.1f} s beyond steady-state steps (paid once per process)")
    if info:
        g, b, r = info.get("graph_count", 0), info.get("graph_breaks", 0), info.get("recompiles", 0)
        lines.append(f"{g} graph(s) compiled, {b} graph break(s), {r} recompile(s)")
        for reason in info.get("break_reasons", [])[:3]:
            lines.append(f"graph break: {reason}")
        for reason in info.get("recompile_reasons", [])[:3]:
            lines.append(f"recompile: {reason} (varying shapes? a last short batch? drop_last=True helps)")
        for fail in info.get("fallback", [])[:3]:
            lines.append(f"fell back to eager: {fail}")
        if info.get("errors"):
            lines.extend(info["errors"][:2])
    if speedup is not None and speedup < 1.05:
        why = []
        if info and info.get("fallback"):
            why.append("part of the model fell back to eager")
        if info and info.get("graph_breaks"):
            why.append("graph breaks split the model into small graphs")
        if num_parameters is not None and num_parameters < 2_000_000:
            why.append(f"the model is small ({num_parameters:,} parameters), so there is little to fuse")
        if device_type == "cpu":
            why.append("on CPU inductor mostly fuses elementwise ops; matmuls/convs already run in oneDNN/BLAS")
        if not why:
            why.append("the step is dominated by large matmuls/convs that were already efficient")
        lines.append(f"compiled but no faster ({speedup:.2f}x): " + "; ".join(why))
    return lines
