"""The verdict: the seeds' decision tree applied to what the diagnosis measured, in plain words,
with the next knob to try and why. Real jobs stack bottlenecks: fix this one, diagnose again."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pandas as pd
import torch

from ..core.knobs import Knobs
from ..core.measure import TrialResult
from ..core.phases import KERNEL_SHARE
from ..core.shapes import COSTLY_STEPS, costly
from ..core.system import available_allocators, keeps_freed_memory
from .data import DATA_WAIT_LIMIT, DataCheck

SYNC_OPS = ("aten::item", "aten::_local_scalar_dense", "cudaStreamSynchronize", "cudaDeviceSynchronize",
            "cudaMemcpy", "aten::nonzero")
SYNC_SHARE = 0.10  # sync-type ops above this share of device/CPU self time => sync-bound
MEMORY_FULL = 0.85  # peak above this share of device memory => memory is the constraint
COPY_MOST = 0.5  # the copy's share of the data wait from which pinned memory, not workers, is the fix
# page faults (kernel time) above this share of the CPU time => the next knob is the allocator mode. Faults are
# CPU time inside the step's own compute (the step's thread takes them), so the bottleneck stays "compute".
ALLOCATOR_SHARE = 0.10


@dataclass(frozen=True)
class Verdict:
    """Which bottleneck, the evidence, and the next knob change to try."""

    bottleneck: str  # data | cpu-threads | compile | memory | sync | compute | failed
    summary: str
    evidence: tuple[str, ...] = ()
    next_knobs: dict[str, Any] = field(default_factory=dict)  # changes to pass to bench.run(**...)
    why: str = ""

    def __str__(self) -> str:
        lines = [f"Bottleneck: {self.bottleneck} — {self.summary}"]
        lines += [f"  • {e}" for e in self.evidence]
        if self.next_knobs:
            args = ", ".join(f"{k}={v!r}" for k, v in self.next_knobs.items())
            lines.append(f"Next: bench.run({args}) — {self.why}")
        elif self.why:
            lines.append(f"Next: {self.why}")
        return "\n".join(lines)


def cite_phases(verdict: Verdict, stages: pd.DataFrame | None) -> Verdict:
    """The verdict with the profiled phase split added to its evidence (unchanged without a profile)."""
    split = phase_split(stages)
    return replace(verdict, evidence=(*verdict.evidence, split)) if split else verdict


def phase_split(stages: pd.DataFrame | None) -> str | None:
    """'the profiled step splits into data 2%, forward 31%, ...' from the profiler's stage table."""
    if stages is None or stages.empty or "share" not in stages:
        return None
    parts = ", ".join(f"{row.stage} {row.share:.0%}" for row in stages.itertuples())
    return f"the profiled step splits into {parts} (eager, profiler ranges)"


def with_shape_cost(verdict: Verdict, cost: Any, base: TrialResult) -> Verdict:
    """The verdict with the one-time cost of new input shapes when it is large (core/shapes.costly: each
    shape's first call over COSTLY_STEPS steady steps), whatever the bottleneck: a real run pays it once per
    distinct shape in every process. `cost` is the "input shapes" analysis (diagnose/shapes.ShapeCost);
    its offer (`pad_to_multiple_of`, token data) joins the next knobs, else the why says bucketing. The
    verdict as it is when the cost is small, unmeasured, or the analysis did not run."""
    per, n, step_s = getattr(cost, "per_shape_s", None), getattr(cost, "shapes", 0), base.step_time_s
    if per is None or not step_s or not costly({"distinct": n, "per_shape_s": per}, step_s):
        return verdict
    line = (f"{n} input shapes x {per * 1e3:,.0f} ms of first calls = {n * per:,.1f} s one-time "
            f"({per / step_s:,.0f} steady steps each; rule: over {COSTLY_STEPS:g}), kept out of the window")
    offer = dict(getattr(cost, "offer", None) or {})
    if offer and all(getattr(base.knobs, k, None) != v for k, v in offer.items()):
        knob, m = next(iter(offer.items()))
        left = _shapes_left(cost, m)
        fix = (f"new input shapes cost {per * 1e3:,.0f} ms each on their first calls, once per shape per process: "
               f"{knob}={m} leaves {left}")
        return replace(verdict, evidence=(*verdict.evidence, line), next_knobs={**verdict.next_knobs, **offer},
                       why=f"{verdict.why}; and {fix}" if verdict.why else fix)
    fix = (f"new input shapes cost {per * 1e3:,.0f} ms each on their first calls, once per shape per process: "
           "bucketing the inputs into a few fixed sizes (pad to fixed lengths) leaves fewer shapes")
    return replace(verdict, evidence=(*verdict.evidence, line), why=f"{verdict.why}; and {fix}" if verdict.why else fix)


def _shapes_left(cost: Any, multiple: int) -> str:
    """'3 shapes in one pass over your data (≈0.4 s once, against 16: ≈1.9 s)' at pad_to_multiple_of=`multiple`,
    from the analysis' options table (the same figures as its section); 'fewer shapes' when it has none."""
    table = getattr(cost, "options", None)
    if table is None or table.empty:
        return "fewer shapes"
    row, now = table[table["pad_to_multiple_of"] == multiple], table.iloc[0]
    if row.empty:
        return "fewer shapes"
    left, once = int(row["shapes_per_pass"].iloc[0]), row["one_time_s"].iloc[0]
    paid = f" (≈{once:,.1f} s once, against {int(now['shapes_per_pass'])}: ≈{now['one_time_s']:,.1f} s)" \
        if once is not None and now["one_time_s"] is not None else ""
    return f"{left} shapes in one pass over your data{paid}"


def data_evidence(data: DataCheck) -> list[str]:
    """What the data check measured, in words, plus the baseline's page-fault cost when it had one."""
    evidence: list[str] = []
    wait = data.data_wait_share or 0.0
    if data.comparison is not None:
        c = data.comparison
        how = f"{c.verdict}, {c.rounds} alternating rounds" if c.rounds else f"{c.verdict}, one pair of trials"
        evidence.append(f"one cached batch runs at {c.speedup:.2f}x the real loader ({how})")
    copy = f", of which the host->device copy {data.copy_share:.0%}" if data.copy_share else ""
    evidence.append(f"data wait is {wait:.0%} of the step{copy} (rule: under {DATA_WAIT_LIMIT:.0%}; data-bound "
                    "needs a cached batch faster beyond noise, confirmed in rounds or agreeing with that rule)")
    hidden = loader_hidden(data.baseline)
    if hidden:
        evidence.append(hidden)
    if wait >= DATA_WAIT_LIMIT and data.comparison is not None and not data.data_bound:
        evidence.append(f"a {wait:.0%} share, yet one cached batch gains nothing beyond noise: the step is not "
                        "waiting for data")
    if data.loader_headroom is not None:
        evidence.append(f"the loader alone delivers {data.loader_samples_per_s:,.0f} samples/s = "
                        f"{data.loader_headroom:.2f}x what the step can consume")
    faulting = page_fault_evidence(data.baseline)
    return [*evidence, faulting] if faulting else evidence


def loader_hidden(base: TrialResult) -> str | None:
    """A line when the data wait was timed on the device's clock and the host's time in the loader differs
    from the device's idle time in it: the part that ran under queued kernels was no wait."""
    told = base.extra.get("data_wait") or {}
    host, idle = told.get("loader_host_s"), told.get("loader_idle_s")
    if told.get("clock") != "device events" or not host or idle is None:
        return None
    return (f"the host spent {host * 1e3:,.1f} ms a step in the loader; the device sat idle {idle * 1e3:,.1f} ms of "
            "it (the rest ran under kernels queued before it: no wait)")


def page_fault_evidence(base: TrialResult) -> str | None:
    """A line when the baseline's window spent a real share of its CPU time in the kernel faulting
    memory in (phases.KERNEL_SHARE): a cost on top of whichever bottleneck the tree finds."""
    share, per_step = base.extra.get("kernel_share"), base.extra.get("page_faults_per_step")
    if share is None or per_step is None or share <= KERNEL_SHARE or not per_step:
        return None
    line = f"the kernel took {share:.0%} of the CPU time ({per_step:,.0f} page faults per step)"
    if base.knobs.num_workers or base.knobs.world_size > 1 or keeps_freed_memory():
        return line + " (see the trial's notes)"
    if base.env.get("ran_in") == "worker":  # the workbench's worker process: a mode per trial reaches it
        return line + ": freed memory is faulted in again each step; bench.run(allocator='glibc-kept') keeps it"
    return line + ": freed memory is faulted in again each step; wb.keep_freed_memory() removes that in this kernel"


def _data_fix(knobs: Knobs, threads: dict[str, Any], base: TrialResult, device: torch.device,
              cores: int) -> tuple[dict[str, Any], str]:
    """The next loader change for a data-bound step, and why (workers, then cores, then re-forks)."""
    workers = knobs.num_workers
    copy = base.copy_share or 0.0
    if device.type == "cuda" and not knobs.pin_memory and copy >= COPY_MOST * (base.data_wait_share or 0.0) > 0:
        return {"pin_memory": True}, (f"the host->device copy is {copy:.0%} of the step: from pinned memory it is "
                                      "faster, and asynchronous (non_blocking): it does not block the host, which "
                                      "goes on to load and launch while it runs (it still runs in turn with the "
                                      "kernels on their stream); workers would not speed it up")
    if workers == 0:
        w = max(1, cores // 2)
        change: dict[str, Any] = {"num_workers": w, "persistent_workers": True}
        if device.type == "cpu":
            change["cpu_threads"] = max(1, cores - w)
        return change, ("batches are loaded in the main process between steps; workers prepare the next ones "
                        "while the step runs" + (" (and one fewer compute thread leaves them a core)"
                                                 if device.type == "cpu" else ""))
    if threads["oversubscribed"]:
        return {"cpu_threads": threads["suggest_cpu_threads"]}, (
            f"{threads['main_threads']} compute threads + {workers} workers fight over {cores} cores; "
            "give the workers their own cores")
    if not knobs.persistent_workers and base.extra.get("epochs"):
        return {"persistent_workers": True}, "each epoch re-forks the workers; persistent workers start once"
    if workers < cores:
        return {"num_workers": workers + 1}, "the workers cannot keep up; one more may (watch the cores)"
    return ({"prefetch_factor": 4} if (knobs.prefetch_factor or 2) < 4 else {},
            "every core already loads data: make __getitem__ cheaper (pre-decode, cache decoded "
            "samples in RAM, pack small files into one array and np.load(mmap_mode='r'))")


def _recompile_verdict(knobs: Knobs, compile_info: dict[str, Any]) -> Verdict:
    """torch.compile recompiled for new shapes: fewer distinct lengths, or a dynamic graph."""
    from .compile import recompile_line

    change = {"pad_to_multiple_of": 8} if knobs.pad_to_multiple_of is None else {"group_by_length": True}
    return Verdict("compile", "torch.compile recompiles for new input shapes (varying sequence lengths)",
                   (recompile_line(compile_info), *compile_info.get("recompile_reasons", [])[:2]), change,
                   "fewer distinct shapes mean fewer compiles; or torch.compile(model, dynamic=True)")


def decide(knobs: Knobs, data: DataCheck, threads: dict[str, Any], *, device: torch.device,
           ops: pd.DataFrame | None = None, mfu: float | None = None, has_conv: bool = False,
           compile_info: dict[str, Any] | None = None, measured_fix: str | None = None) -> Verdict:
    """Walk the decision tree: failure → compile fallback → recompiles → data → threads → page faults (compute,
    next knob the allocator mode) → sync → memory → compute. `measured_fix`: what the log measured of the allocator modes on these knobs (`allocator_fix`)."""
    base: TrialResult = data.baseline
    cores = int(threads["cores"])
    if not base.ok and base.status == "oom":
        return Verdict("memory", "the step does not fit in memory", (base.message,),
                       {"amp": "bf16"} if knobs.amp == "off" else {"batch_size": max(1, knobs.batch_size // 2),
                                                                   "accum_steps": knobs.accum_steps * 2},
                       "lower precision activations first, then accumulation and checkpointing "
                       "(or let bench.fit_memory(max_bytes, effective_batch) search)")
    if not base.ok:
        return Verdict("failed", f"the baseline trial ended with status {base.status!r}", (base.message,),
                       why="fix the error first: see result.traceback")

    if compile_info and compile_info.get("fallback"):
        return Verdict("compile", "torch.compile fell back to eager for part of the model",
                       tuple(compile_info["fallback"][:3]), {"compile": "off"},
                       "a partly compiled model pays the compile time without the speed; run eager or fix the failing op")

    if compile_info and compile_info.get("recompiles"):
        return _recompile_verdict(knobs, compile_info)

    evidence = data_evidence(data)

    if data.data_bound:
        change, why = _data_fix(knobs, threads, base, device, cores)
        return Verdict("data", "the step waits for the data pipeline", tuple(evidence), change, why)

    if threads["oversubscribed"]:
        return Verdict("cpu-threads", "more runnable threads than cores", tuple(evidence),
                       {"cpu_threads": threads["suggest_cpu_threads"]},
                       f"{threads['threads_wanted']} threads on {cores} cores slow each other down")

    faulting = allocator_verdict(knobs, base, evidence, device, measured_fix)
    if faulting is not None:
        return faulting

    if ops is not None and not ops.empty and "share" in ops:
        sync_share = float(ops[ops["op"].isin(SYNC_OPS)]["share"].sum())
        if sync_share > SYNC_SHARE and device.type != "cpu":
            return Verdict("sync", "the host waits on the device (hidden syncs)", (*evidence,
                           f"sync-type ops take {sync_share:.0%} of the time"), {},
                           "remove .item()/.cpu()/print(tensor) and data-dependent ifs from the step")

    if device.type == "cuda" and base.peak_memory_bytes:
        total = torch.cuda.get_device_properties(device).total_memory
        if base.peak_memory_bytes > MEMORY_FULL * total:
            return Verdict("memory", f"the step uses {base.peak_memory_bytes / total:.0%} of device memory",
                           tuple(evidence), {"amp": "bf16"} if knobs.amp == "off" else {},
                           "near the limit a larger batch will OOM and the allocator fragments; "
                           "AMP, accumulation and checkpointing buy room")

    # Compute-bound: the data keeps up; make the step itself cheaper.
    if mfu is not None:
        evidence.append(f"MFU {mfu:.0%} of the {'measured' if device.type == 'cpu' else 'data-sheet'} peak")
    from .threads import cpu_has_bf16

    bf16_ok = device.type != "cpu" or cpu_has_bf16()
    if knobs.amp == "off" and bf16_ok:
        dtype = "bf16" if (device.type != "cuda" or torch.cuda.is_bf16_supported()) else "fp16"
        return Verdict("compute", "the step itself is the bottleneck (the data keeps up)", tuple(evidence),
                       {"amp": dtype}, "lower-precision matmuls/convs use tensor units and halve activation memory")
    if has_conv and knobs.amp != "off" and not knobs.channels_last:
        return Verdict("compute", "the step itself is the bottleneck (the data keeps up)", tuple(evidence),
                       {"channels_last": True}, "convolutions with AMP run fastest in NHWC layout")
    if knobs.compile == "off":
        note = "" if bf16_ok else " (AMP is skipped: this CPU has no bf16 units, so bf16 is emulated and slower)"
        return Verdict("compute", "the step itself is the bottleneck (the data keeps up)", tuple(evidence),
                       {"compile": "default"},
                       "compile fuses elementwise ops and cuts Python overhead; measure whether it pays" + note)
    return Verdict("compute", "the step itself is the bottleneck (the data keeps up)", tuple(evidence),
                   {"batch_size": knobs.batch_size * 2},
                   "a larger batch amortises per-step overhead (check the loss still trains well)")


def allocator_verdict(knobs: Knobs, base: TrialResult, evidence: list[str], device: torch.device,
                      measured_fix: str | None = None) -> Verdict | None:
    """Compute, with the allocator mode as the next knob, when page faults took more than ALLOCATOR_SHARE of a
    one-process CPU trial's CPU time (freed memory given back and faulted in again). The faults are CPU time
    spent inside the step's own compute, so the bottleneck is compute; the knob that may cut that time is the
    C heap's mode, each tried in a fresh process (`allocator`); `bench.tune()` races the modes first. None when
    the faults are small or no other mode is available."""
    share = base.extra.get("kernel_share")
    if device.type != "cpu" or share is None or share <= ALLOCATOR_SHARE or knobs.world_size > 1:
        return None
    modes = [m for m in ("tcmalloc", "glibc-kept", "jemalloc") if m in available_allocators()
             and m != (base.env.get("allocator") or knobs.allocator)]
    if not modes:
        return None
    mode = base.env.get("allocator") or "this process's"
    lines = [*evidence, f"page faults took {share:.0%} of the CPU time in the {mode} allocator mode "
                        f"(rule: over {ALLOCATOR_SHARE:.0%}, the next knob is the allocator mode)"]
    if measured_fix:
        lines.append(measured_fix)
    return Verdict("compute", f"the step itself is the bottleneck, and {share:.0%} of its CPU time is page faults "
                   "(the C heap gives freed memory back and each step faults it in again)",
                   tuple(lines), {"allocator": modes[0]},
                   f"each allocator mode runs in a fresh process (available here: {', '.join(modes)}); "
                   "bench.tune() races them first when page faults are this high")


def allocator_fix(trials: list[TrialResult], knobs: Knobs) -> str | None:
    """'measured here: tcmalloc 1.31x over glibc (trials #4, #7)': the best allocator mode against the
    baseline's mode among ok trials of these knobs (allocator aside), or None before two modes ran."""
    best: dict[str, TrialResult] = {}
    for r in trials:
        if r.ok and r.samples_per_s and r.env.get("allocator") and \
                r.knobs.replace(allocator=None) == knobs.replace(allocator=None):
            mode = r.env["allocator"]
            if mode not in best or r.samples_per_s > best[mode].samples_per_s:
                best[mode] = r
    if len(best) < 2:
        return None
    ranked = sorted(best.values(), key=lambda r: r.samples_per_s or 0.0)
    low, high = ranked[0], ranked[-1]
    return (f"measured here: allocator {high.env['allocator']!r} {high.samples_per_s / low.samples_per_s:.2f}x "
            f"over {low.env['allocator']!r} (trials #{high.trial_id}, #{low.trial_id})")
