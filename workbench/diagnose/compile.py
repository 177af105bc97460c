"""Compile diagnostics: what torch.compile did during a block of code, and why it may not pay.

`CompileWatch` (kept in compat.py: it reads dynamo's private counters) snapshots dynamo's
process-wide counters and compilation metrics on entry and stores the difference on exit as a JSON-safe dict (graphs compiled, graph breaks and their
reasons, recompiles and their reasons, frames that failed and fell back to eager). The runner
wraps a compiled trial's warm-up + measurement in it and keeps `.info` as
`result.extra["compile"]`; `explain_compile` turns that into plain sentences.
"""

from __future__ import annotations

from typing import Any

from ..core.compat import CompileWatch
from ..results.rules import MARGIN

__all__ = ["CompileWatch", "break_lines", "explain_compile"]


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
        lines += break_lines(info)
        if r:
            lines.append(recompile_line(info))
        for reason in info.get("recompile_reasons", [])[:3]:
            lines.append(f"recompile: {reason} (varying shapes? a last short batch? drop_last=True helps)")
        for fail in info.get("fallback", [])[:3]:
            lines.append(f"fell back to eager: {fail}")
        if info.get("errors"):
            lines.extend(info["errors"][:2])
    if speedup is not None and speedup < 1 + MARGIN:  # within the "same speed" margin: no faster
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


RECOMPILE_FIX = ("pad_to_multiple_of=8 (fewer distinct sequence lengths), bucketing by length (group_by_length=True), "
                 "or torch.compile(model, dynamic=True) (one graph for every length)")


def recompile_line(info: dict[str, Any]) -> str:
    """The trial's recompiles, what they cost (dynamo's own compile seconds in this trial) and the fixes."""
    r = int(info.get("recompiles", 0))
    cost = info.get("dynamo_compile_s")
    spent = f", {cost:.1f} s of compilation in this trial" if cost else ""
    return (f"{r} recompile{'s' if r != 1 else ''} in this trial{spent}: each new input shape (a batch of another "
            f"sequence length) compiles a graph again; try {RECOMPILE_FIX}")


def break_lines(info: dict[str, Any] | None, limit: int = 5) -> list[str]:
    """One line per distinct graph break: how often, why, and where in the user's code."""
    if not info:
        return []
    breaks = info.get("breaks")
    if breaks is None:  # a trial logged before locations were kept: reasons only
        return [f"graph break: {reason}" for reason in info.get("break_reasons", [])[:limit]]
    lines = [f"graph break ×{b['count']}: {b['reason']}" + (f" at {b['where']}" if b.get("where") else "")
             for b in breaks[:limit]]
    if len(breaks) > limit:
        lines.append(f"… and {len(breaks) - limit} more distinct graph breaks")
    return lines
