"""Every accelerator path of the workbench, checked in one prepared run (no arguments).

    python benchmarks/gpu_check.py                  # prints one table: check | expected | measured | result
    OUT=/some/dir python benchmarks/gpu_check.py    # ... and writes /some/dir/gpu_check.json

A GPU machine is lent only sometimes and briefly, so this script is written to run once, cold, in
at most ~5 minutes on one GPU: it checks the clock before each check, skips what no longer fits
("skipped: time"), and a watchdog prints the table and exits if one check hangs. Features that may
not exist in this version of the workbench (the `cudnn_benchmark` and `world_size` knobs, trace
export with a CUDA memory snapshot) are detected at run time and reported as "skipped: not in this
version". Everything goes through the public API (`wb.demo`, `wb.Workbench`, `bench.run`,
`TrialResult` fields), so a restructured core still runs it.

Without CUDA it prints "no CUDA device: N checks skipped" and exits 0 (CI runs it that way); on
Apple MPS it runs the checks that apply there and skips the CUDA-only ones. Exit status: 0 when
nothing failed, 1 when a check failed, 3 when the watchdog stopped the run.
Env: GPU_CHECK_BUDGET_S (default 300) sets the time budget in seconds. GPU_CHECK_DEVICE=cpu is a
dry run of the device-agnostic checks on the CPU at small sizes: it tests this script's own code
before a GPU is lent (tests/test_gpu_check.py), and verifies nothing about an accelerator.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import gc
import inspect
import itertools
import json
import math
import os
import platform
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

BUDGET_S = 300.0  # the limit: the whole run in <= 5 minutes on one GPU
WATCHDOG_GRACE_S = 45.0  # past the budget, a hung check gets this long before the watchdog exits
STEPS, WARMUP = 20, 3  # measured / warm-up optimizer steps of most trials (short: this is a check)
JSON_NAME = "gpu_check.json"

PASS, FAIL = "pass", "fail"
SKIP_NO_CUDA = "skipped: no CUDA device"
SKIP_TIME = "skipped: time"
SKIP_VERSION = "skipped: not in this version"


# ---- pure helpers (unit-tested on CPU in tests/test_gpu_check.py) ------------------------------
@dataclass
class Row:
    """One line of the table; `detail` (traceback, raw figures) goes to the JSON only."""

    check: str
    expected: str
    measured: str = "-"
    result: str = ""  # pass | fail | skipped: <why>
    seconds: float = 0.0
    detail: dict[str, Any] = field(default_factory=dict)


class Budget:
    """Wall-clock budget checked as the run goes: a check starts only if its estimate still fits."""

    def __init__(self, total_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if not total_s > 0:
            raise ValueError(f"the time budget must be > 0 seconds, got {total_s!r} (GPU_CHECK_BUDGET_S)")
        self.total_s = float(total_s)
        self._clock = clock
        self._start = clock()

    def elapsed(self) -> float:
        return self._clock() - self._start

    def left(self) -> float:
        return self.total_s - self.elapsed()

    def allows(self, estimate_s: float) -> bool:
        """True when a check estimated at `estimate_s` seconds still ends inside the budget."""
        return self.elapsed() + estimate_s <= self.total_s


def budget_from_env(env: dict[str, str] | None = None) -> float:
    """GPU_CHECK_BUDGET_S or the default 300 s; a bad value raises ValueError naming the variable."""
    raw = (os.environ if env is None else env).get("GPU_CHECK_BUDGET_S", "")
    if not raw:
        return BUDGET_S
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"GPU_CHECK_BUDGET_S={raw!r} is not a number of seconds (e.g. 300)") from None
    if not value > 0:
        raise ValueError(f"GPU_CHECK_BUDGET_S={raw!r} must be > 0 seconds")
    return value


def format_table(rows: Sequence[Row]) -> str:
    """A Markdown table (paste-able into benchmarks/README.md): check | expected | measured | pass/fail."""
    head = ("check", "expected", "measured", "pass/fail")
    cells = [head] + [(r.check, r.expected, r.measured, r.result) for r in rows]
    cells = [tuple(str(c).replace("|", "/").replace("\n", " ") for c in row) for row in cells]
    widths = [max(len(row[i]) for row in cells) for i in range(4)]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in cells]
    lines.insert(1, "| " + " | ".join("-" * w for w in widths) + " |")
    return "\n".join(lines)


def count(rows: Sequence[Row]) -> dict[str, int]:
    """How many rows passed, failed and were skipped (any 'skipped: ...' reason)."""
    return {
        "pass": sum(r.result == PASS for r in rows),
        "fail": sum(r.result == FAIL for r in rows),
        "skipped": sum(r.result.startswith("skipped") for r in rows),
    }


def summary_line(rows: Sequence[Row], device: str, elapsed_s: float) -> str:
    """The one line docs/devices.md's device table quotes."""
    n = count(rows)
    return (f"gpu_check: {n['pass']} pass, {n['fail']} fail, {n['skipped']} skipped "
            f"on {device} in {elapsed_s:.0f} s")


def write_json(rows: Sequence[Row], meta: dict[str, Any], out_dir: str | os.PathLike | None) -> Path | None:
    """Write {meta..., rows: [...]} to <out_dir>/gpu_check.json; None (nothing written) without a dir."""
    if not out_dir:
        return None
    path = Path(out_dir) / JSON_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {**meta, "rows": [asdict(r) for r in rows]}
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return path


def losses_match(a: Sequence[float], b: Sequence[float], rtol: float, atol: float = 0.0) -> tuple[bool, float]:
    """(every |a-b| <= atol + rtol*|b|, largest relative difference); unequal lengths never match."""
    if len(a) != len(b) or not a:
        return False, math.inf
    worst = 0.0
    ok = True
    for x, y in zip(a, b):
        if not (math.isfinite(x) and math.isfinite(y)):
            return False, math.inf
        diff = abs(x - y)
        worst = max(worst, diff / max(abs(y), 1e-12))
        ok = ok and diff <= atol + rtol * abs(y)
    return ok, worst


def all_identical(values: Sequence[float]) -> bool:
    """True for a loss series that never moves: the symptom of losses overwritten by graph replays."""
    return len(values) > 1 and len(set(values)) == 1


# ---- the checks ---------------------------------------------------------------------------------
class Skip(Exception):
    """Raised by a check that cannot run here; the message is the reason shown in the table."""


@dataclass
class Check:
    name: str
    expected: str
    run: Callable[[Context], tuple[str, bool, dict[str, Any]]]  # -> (measured, passed, detail)
    estimate_s: float  # cold, on one GPU, including compiles; what the budget reserves
    devices: tuple[str, ...] = ("cuda",)


class Context:
    """What the checks share: the device, the workbench module, a scratch dir, cached trials."""

    def __init__(self, device: str, tmp: Path) -> None:
        import torch

        import workbench as wb

        self.torch, self.wb = torch, wb
        self.device = device
        self.tmp = tmp
        self.cache: dict[str, Any] = {}
        self.small = device == "cpu"  # the CPU dry run: same code, sizes a 2-core CPU runs in seconds

    def size(self, gpu: int, cpu: int) -> int:
        """A size for the GPU run, or its small stand-in for the CPU dry run."""
        return cpu if self.small else gpu

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"

    def knob_names(self) -> list[str]:
        names = getattr(self.wb, "knob_names", None)
        return list(names()) if callable(names) else list(self.wb.Knobs.__dataclass_fields__)

    def demo(self, name: str, **kw: Any) -> Any:
        kw.setdefault("size", "tiny" if self.small else "default")
        kw.setdefault("steps", STEPS)
        kw.setdefault("warmup_steps", WARMUP)
        return self.wb.demo(name, device=self.device, log=None, **kw)

    def mlp(self, *, dim: int, hidden: int, depth: int, samples: int, batch_size: int, name: str,
            step_fn: Callable | None = None, steps: int = STEPS, warmup: int = WARMUP, log: Any = None) -> Any:
        """A Workbench on a seeded MLP classifier over random data (TensorDataset on the host)."""
        torch, nn = self.torch, self.torch.nn
        torch.manual_seed(0)
        layers: list[Any] = [nn.Linear(dim, hidden), nn.ReLU()]
        for _ in range(depth - 1):
            layers += [nn.Linear(hidden, hidden), nn.ReLU()]
        layers.append(nn.Linear(hidden, 10))
        g = torch.Generator().manual_seed(0)
        data = torch.utils.data.TensorDataset(torch.randn(samples, dim, generator=g),
                                              torch.randint(0, 10, (samples,), generator=g))
        loss_fn = None if step_fn is not None else nn.CrossEntropyLoss()
        return self.wb.Workbench(nn.Sequential(*layers), data, loss_fn=loss_fn, step_fn=step_fn,
                                 optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3), device=self.device,
                                 log=log, name=name, steps=steps, warmup_steps=warmup,
                                 knobs=self.wb.Knobs(batch_size=batch_size))

    def free(self) -> None:
        """Drop cycles and cached blocks between checks so one check's memory is not the next's."""
        gc.collect()
        if self.cuda:
            self.torch.cuda.empty_cache()


def _ok(r: Any) -> bool:
    return r.status == "ok" and bool(r.losses) and all(math.isfinite(x) for x in r.losses)


def _status(r: Any) -> str:
    return r.status if r.status == "ok" else f"{r.status}: {r.message[:120]}"


def _wall_s(r: Any) -> float:
    """Host wall time of the measured window (bracketed by device syncs)."""
    wall = (r.extra or {}).get("wall_s")
    if wall:
        return float(wall)
    return (r.samples_per_step or 0) * len(r.step_times_s) / r.samples_per_s


def check_step_clock(ctx: Context) -> tuple[str, bool, dict]:
    # A GPU-bound step (big matmuls, one cached batch): host timers would only see launches here.
    width = ctx.size(2048, 128)
    bench = ctx.mlp(dim=width, hidden=width, depth=3, samples=1024, batch_size=ctx.size(512, 64), name="clock",
                    steps=30, warmup=5)
    r = bench.run(data="cached")
    if not r.ok:
        return _status(r), False, {}
    total, wall = sum(r.step_times_s), _wall_s(r)
    ratio = total / wall
    good = 0.90 <= ratio <= 1.001 and min(r.step_times_s) > 0
    clock = "CUDA events" if ctx.cuda else "host clock"  # CPU and MPS: perf_counter
    return (f"{clock} sum {total * 1e3:.1f} ms / window {wall * 1e3:.1f} ms = {ratio:.3f}; "
            f"median step {r.step_time_s * 1e3:.2f} ms"), good, {"step_times_s": list(r.step_times_s), "wall_s": wall}


def check_peak_memory(ctx: Context) -> tuple[str, bool, dict]:
    torch = ctx.torch
    bench = ctx.demo("mlp-memory")
    base = bench.run()
    if not base.ok:
        return _status(base), False, {}
    if not ctx.cuda:  # MPS has no peak counter: the honest answer is "not measured", never 0
        good = base.peak_memory_bytes is None or base.peak_memory_bytes > 0
        return f"peak_memory_bytes={base.peak_memory_bytes}", good, {}
    stats_peak = torch.cuda.memory_stats(ctx.device)["allocated_bytes.all.peak"]  # same window, read after
    ck = bench.run(checkpoint=list(bench.blocks))
    if not ck.ok:
        return f"checkpointed trial {_status(ck)}", False, {}
    floor = 4 * 4 * bench.workload.num_parameters  # fp32 params + grads + AdamW's two moments
    same = abs(base.peak_memory_bytes - stats_peak) <= 0.01 * stats_peak
    ratio = ck.peak_memory_bytes / base.peak_memory_bytes
    good = same and base.peak_memory_bytes >= floor and ratio < 0.8
    return (f"peak {base.peak_memory_bytes / 2**20:.1f} MiB vs memory_stats {stats_peak / 2**20:.1f} MiB; "
            f"checkpoint all {len(bench.blocks)} blocks: {ck.peak_memory_bytes / 2**20:.1f} MiB ({ratio:.2f}x)"), good, {
        "peak": base.peak_memory_bytes, "memory_stats_peak": stats_peak, "checkpointed_peak": ck.peak_memory_bytes,
        "params_grads_adam_floor": floor}


def check_fp16_scaler(ctx: Context) -> tuple[str, bool, dict]:
    torch = ctx.torch
    spike_at = WARMUP + 3  # the 3rd measured step: its loss is scaled so fp16 gradients overflow
    seen: dict[str, Any] = {"n": 0, "params": []}

    def step_fn(model: Any, batch: Any) -> Any:
        x, y = batch
        seen["n"] += 1
        seen["params"].append(next(model.parameters()).detach().clone())  # weights before this step
        loss = torch.nn.functional.cross_entropy(model(x), y)
        return loss * 1e6 if seen["n"] == spike_at else loss  # x1e6 x scale 65536: inf in fp16 grads

    bench = ctx.mlp(dim=64, hidden=256, depth=2, samples=512, batch_size=64, name="fp16", step_fn=step_fn,
                    steps=8)
    seen.update(n=0, params=[])  # the constructor's probe called step_fn once
    r = bench.run(amp="fp16")
    if not _ok(r):
        return _status(r), False, {}
    p = seen["params"]
    updated = [not torch.equal(a, b) for a, b in itertools.pairwise(p)]  # step k changed the weights?
    skipped_spike = not updated[spike_at - 1]
    others = updated[: spike_at - 1] + updated[spike_at:]
    good = skipped_spike and sum(others) >= 0.8 * len(others)  # an early overflow at init may skip one more
    return (f"status ok, losses finite; overflow step {spike_at} (3rd measured) skipped: {skipped_spike}; "
            f"other steps updated: {sum(others)}/{len(others)}"), good, {"updated": updated}


def check_pinned_workers(ctx: Context) -> tuple[str, bool, dict]:
    bench = ctx.demo("cnn", steps=10)
    pinned = bench.run(num_workers=2, pin_memory=True)
    plain = bench.run(num_workers=0, pin_memory=False)
    if not (_ok(pinned) and _ok(plain)):
        return f"pinned {_status(pinned)}; plain {_status(plain)}", False, {}
    same, worst = losses_match(pinned.losses, plain.losses, rtol=1e-2)
    noted = [n for n in pinned.notes if "pin_memory" in n]
    if ctx.cuda:
        good = same and not noted
        tail = f"pin_memory note: {noted or 'none'}"
    else:  # MPS drops pin_memory: the result must say so
        good = same and bool(noted)
        tail = f"pin_memory note present: {bool(noted)}"
    return (f"losses match unpinned: {same} (max rel diff {worst:.1e}); data-wait {pinned.data_wait_share:.0%} "
            f"vs {plain.data_wait_share:.0%}; {tail}"), good, {"pinned": list(pinned.losses), "plain": list(plain.losses)}


class SleepSamples:
    """A data-bound dataset (issue 30): each sample sleeps `sleep_s`, so n workers deliver at most
    n / sleep_s samples/s, a truth no CPU load can raise. Module-level: workers pickle it."""

    def __init__(self, n: int, dim: int, sleep_s: float) -> None:
        import torch

        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, dim, generator=g), torch.randint(0, 10, (n,), generator=g)
        self.sleep_s = sleep_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> Any:
        time.sleep(self.sleep_s)
        return self.x[i], self.y[i]


def check_steady_compile_workers(ctx: Context) -> tuple[str, bool, dict]:
    """The first compiled trial in the process on a data-bound pipeline with workers: the compile
    lets the workers buffer num_workers x prefetch_factor batches; the steady warm-up must drain
    them, so the window never reads more than the workers can deliver (issue 30)."""
    torch, nn, wb = ctx.torch, ctx.torch.nn, ctx.wb
    workers, sleep_s, batch = ctx.size(8, 2), 0.001, 32
    limit = workers / sleep_s
    model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 10))
    bench = wb.Workbench(model, SleepSamples(32 * 400, 64, sleep_s), loss_fn=nn.CrossEntropyLoss(),
                         optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3), device=ctx.device, log=None,
                         name="steady", steps=STEPS, warmup_steps=WARMUP, knobs=wb.Knobs(batch_size=batch))
    r = bench.run(compile="default", num_workers=workers, prefetch_factor=2, pin_memory=ctx.cuda)
    if not _ok(r):
        return _status(r), False, {}
    rule = r.extra.get("warmup_rule", {})
    ratio = r.samples_per_s / limit
    good = ratio <= 1.05 and rule.get("steps", 0) > workers * 2
    return (f"{r.samples_per_s:,.0f} samples/s = {ratio:.2f}x the {workers} workers' limit; warm-up "
            f"{rule.get('steps')} steps ({rule.get('ended')}: {rule.get('reason', '')[:90]}); compile "
            f"{r.compile_s or 0:.1f} s; steady {r.extra.get('steady')}"), good, {"rule": rule, "limit": limit,
                                                                                 "rate": r.samples_per_s}


def _compile_check(ctx: Context, mode: str) -> tuple[str, bool, dict]:
    if "compile-bench" not in ctx.cache:
        bench = ctx.mlp(dim=64, hidden=256, depth=2, samples=512, batch_size=64, name="compile", steps=10)
        ctx.cache["compile-bench"] = bench
        ctx.cache["compile-eager"] = bench.run()
    bench, eager = ctx.cache["compile-bench"], ctx.cache["compile-eager"]
    if not _ok(eager):
        return f"eager reference {_status(eager)}", False, {}
    r = bench.run(compile=mode)
    if not _ok(r):
        return _status(r), False, {}
    same, worst = losses_match(r.losses, eager.losses, rtol=1e-3, atol=1e-5)
    frozen = all_identical(r.losses)
    return (f"{len(r.losses)} losses vs eager: max rel diff {worst:.1e}; all identical: {frozen}; "
            f"warm-up {r.compile_s:.1f} s"), same and not frozen, {"losses": list(r.losses), "eager": list(eager.losses)}


def check_compile_default(ctx: Context) -> tuple[str, bool, dict]:
    return _compile_check(ctx, "default")


def check_compile_cudagraphs(ctx: Context) -> tuple[str, bool, dict]:
    return _compile_check(ctx, "reduce-overhead")


def check_bf16_channels_last(ctx: Context) -> tuple[str, bool, dict]:
    torch = ctx.torch
    bench = ctx.demo("cnn")
    trials: dict[str, dict[str, Any]] = {"fp32": {}, "channels_last": {"channels_last": True}}
    if not ctx.cuda or torch.cuda.is_bf16_supported():
        trials.update({"bf16": {"amp": "bf16"}, "bf16+channels_last": {"amp": "bf16", "channels_last": True}})
    res = {k: bench.run(batch_size=ctx.size(128, 16), **kw) for k, kw in trials.items()}
    bad = [f"{k} {_status(r)}" for k, r in res.items() if not _ok(r)]
    if bad:
        return "; ".join(bad), False, {}
    base = res["fp32"]
    speed = {k: r.samples_per_s / base.samples_per_s for k, r in res.items() if k != "fp32"}
    close = all(abs(r.losses[0] - base.losses[0]) <= 0.05 * abs(base.losses[0]) for r in res.values())
    figures = ", ".join(f"{k} {v:.2f}x" for k, v in speed.items())
    missing = "" if "bf16" in res else " (bf16 not supported on this GPU)"
    return (f"vs fp32 {base.samples_per_s:,.0f} samples/s: {figures}{missing}; first losses within 5%: {close} "
            "(one trial each)"), close, {"samples_per_s": {k: r.samples_per_s for k, r in res.items()}}


def decoder_lm(vocab: int, width: int, layers: int, seq: int) -> Any:
    """A pre-norm causal decoder LM (the issue's held-out case: 8 layers, d=768, seq 512)."""
    import torch
    from torch import nn

    class DecoderLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(vocab, width)
            self.pos = nn.Parameter(torch.zeros(seq, width))
            self.blocks = nn.ModuleList(
                nn.TransformerEncoderLayer(width, max(1, width // 64), 4 * width, dropout=0.0, batch_first=True,
                                           norm_first=True) for _ in range(layers))
            self.head = nn.Linear(width, vocab)

        def forward(self, ids: Any) -> Any:
            t = ids.shape[1]
            h = self.emb(ids) + self.pos[:t]
            mask = nn.Transformer.generate_square_subsequent_mask(t, device=ids.device)
            for block in self.blocks:
                h = block(h, src_mask=mask, is_causal=True)
            return self.head(h)

    return DecoderLM()


def lm_step(model: Any, batch: Any) -> Any:
    """Next-token cross-entropy on a (batch, seq + 1) block of token ids."""
    import torch

    (ids,) = batch
    logits = model(ids[:, :-1])
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


LM_DATA_WAIT = 0.05  # a compute-bound LM with the default loader waits at most this share for data
STAGES_LOW, STAGES_HIGH = 0.80, 1.01  # device-side stages / the traced step


def stages_sum_ok(stage_ms: dict[str, float], step_ms: float) -> tuple[bool, float]:
    """(each stage once and their sum within [STAGES_LOW, STAGES_HIGH] of the traced step, the ratio).

    Why those bounds: the profiled steps are synced one by one, so data (host: the loader and its copy)
    and the kernels the other stages queued (one stream, one after another) never overlap: their sum
    cannot pass the step but for the host/device clock alignment (1%). What the step holds beyond them is
    device idle time (the first launch after the loader, gaps between kernels, the sync at the end), a few %
    on a compute-bound step; 0.80 leaves room for the profiler's own cost per launch."""
    ratio = sum(stage_ms.values()) / step_ms if step_ms > 0 else math.inf
    return STAGES_LOW <= ratio <= STAGES_HIGH, ratio


def _lm_diagnosis(ctx: Context) -> tuple[Any, Any]:
    """The LM trial with the default loader (pin_memory off, no workers) and its diagnosis (cached)."""
    if "lm" not in ctx.cache:
        torch, wb = ctx.torch, ctx.wb
        seq, batch = ctx.size(512, 16), ctx.size(16, 4)
        vocab = ctx.size(8192, 256)
        torch.manual_seed(0)
        model = decoder_lm(vocab, ctx.size(768, 32), ctx.size(8, 2), seq)
        ids = torch.randint(0, vocab, (batch * 64, seq + 1), generator=torch.Generator().manual_seed(0))
        bench = wb.Workbench(model, torch.utils.data.TensorDataset(ids), step_fn=lm_step,
                             optimizer=lambda p: torch.optim.AdamW(p, lr=3e-4), device=ctx.device, log=None,
                             name="lm", steps=ctx.size(STEPS, 8), warmup_steps=ctx.size(WARMUP, 2),
                             knobs=wb.Knobs(batch_size=batch))
        r = bench.run()
        d = bench.diagnose(memory=False, flops=False) if r.ok else None
        ctx.cache["lm"] = (r, d)
    return ctx.cache["lm"]


def check_lm_data_wait(ctx: Context) -> tuple[str, bool, dict]:
    r, d = _lm_diagnosis(ctx)
    if not _ok(r):
        return _status(r), False, {}
    share, copy = r.data_wait_share or 0.0, r.copy_share or 0.0
    speed = d.data.cached_speedup
    good = share <= LM_DATA_WAIT and d.bottleneck == "compute"
    return (f"data wait {share:.1%} (copy {copy:.1%}); one cached batch {speed or float('nan'):.2f}x the loader; "
            f"diagnose: {d.bottleneck}, next {d.next_knobs}"), good, \
        {"data_wait_share": share, "copy_share": copy, "cached_speedup": speed, "verdict": str(d.verdict),
         "samples_per_s": r.samples_per_s}


def check_device_stages(ctx: Context) -> tuple[str, bool, dict]:
    from workbench.core import trace as tracing

    r, d = _lm_diagnosis(ctx)
    if not _ok(r) or d is None or d.stages is None or not d.trace_path:
        return f"no profiled stages ({_status(r)}; problems: {getattr(d, 'problems', None)})", False, {}
    names = list(d.stages["stage"])
    split = dict(zip(names, d.stages["ms_per_step"]))
    spans, _ = tracing.step_events(d.trace_path)
    step_ms = sum(float(e["dur"]) for e in spans) / 1e3 / len(spans)
    within, ratio = stages_sum_ok(split, step_ms)
    once = len(names) == len(set(names)) == len(tracing.PHASES)
    parts = ", ".join(f"{k} {v:.1f}" for k, v in split.items())
    return (f"{parts} ms = {ratio:.2f} of the traced step ({step_ms:.1f} ms); each stage once: {once}"), \
        within and once, {"stages_ms": split, "step_ms": step_ms}


HIDDEN_WAIT = 0.05  # a loader well under a long GPU step (queued kernels ahead of it) waits at most this share
HIDDEN_LOADER, SLOW_LOADER = 0.3, 3.0  # the two loaders' sleep per batch, in GPU steps (the cached trial's)


def idle_expected(loader_s: float, step_s: float) -> tuple[float, float]:
    """The GPU's idle seconds per step a loader of `loader_s` host seconds should read against a `step_s`
    GPU step: the loader less the kernels queued before it, within [0.8x, that + half a step]. The bounds'
    why: the kernels queued ahead cover at most one step (the loader sits between steps), and at least the
    step less the host's launches; the window's first step (after its opening sync) hides nothing."""
    excess = max(0.0, loader_s - step_s)
    return 0.8 * excess, excess + 0.5 * step_s


class SleepCollate:
    """A collate that spends `sleep_s` of host time per batch, then gathers the batch's rows: the loader's
    cost set per trial (a module-level class: picklable)."""

    def __init__(self, x: Any, y: Any, sleep_s: float = 0.0) -> None:
        self.x, self.y, self.sleep_s = x, y, sleep_s

    def __call__(self, index: list[int]) -> tuple[Any, Any]:
        import torch

        time.sleep(self.sleep_s)
        rows = torch.tensor(index)
        return self.x[rows], self.y[rows]


def check_gpu_idle_wait(ctx: Context) -> tuple[str, bool, dict]:
    # A GPU-bound MLP step; one cached batch gives its GPU time S. A loader of 0.3 S (pageable copies, no
    # workers) runs while the previous step's kernels are still queued: no wait. One of 3 S leaves the
    # GPU idle ~2 S a step, which the share must read, without the part the queued kernels hid.
    torch, wb = ctx.torch, ctx.wb
    dim, width, batch = ctx.size(256, 32), ctx.size(8192, 64), ctx.size(2048, 32)  # 2 MB a batch: a short copy
    g = torch.Generator().manual_seed(0)
    collate = SleepCollate(torch.randn(batch * 4, dim, generator=g), torch.randint(0, 10, (batch * 4,), generator=g))
    loader = torch.utils.data.DataLoader(list(range(batch * 4)), batch_size=batch, shuffle=True, collate_fn=collate)
    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(nn.Linear(dim, width), nn.ReLU(), *[m for _ in range(3) for m in (nn.Linear(width, width),
                                                                                              nn.ReLU())],
                          nn.Linear(width, 10))
    bench = wb.Workbench(model, loader, loss_fn=nn.CrossEntropyLoss(), optimizer=lambda p: torch.optim.AdamW(p, lr=1e-4),
                         device=ctx.device, log=None, name="gpu-idle", steps=STEPS, warmup_steps=WARMUP,
                         knobs=wb.Knobs(batch_size=batch))
    cached = bench.run(data="cached")
    if not _ok(cached):
        return f"cached: {_status(cached)}", False, {}
    step = cached.step_time_s
    runs = {}
    for name, loader_steps in (("hidden", HIDDEN_LOADER), ("slow", SLOW_LOADER)):
        collate.sleep_s = loader_steps * step  # the same bench: its loader calls this collate
        runs[name] = bench.run()
        if not _ok(runs[name]):
            return f"{name} loader: {_status(runs[name])}", False, {}
    hidden, slow = runs["hidden"], runs["slow"]
    told_h, told_s = hidden.extra.get("data_wait", {}), slow.extra.get("data_wait", {})
    events = told_s.get("clock") == "device events"  # else the host clock: the loader's host time is the wait
    idle = (told_s.get("loader_idle_s") if events else told_s.get("loader_host_s")) or 0.0
    lo, hi = idle_expected(told_s.get("loader_host_s") or 0.0, step)
    good = hidden.data_wait_share <= HIDDEN_WAIT and lo <= idle <= hi
    if not ctx.cuda:  # the host is the device: nothing hides a loader there; the dry run checks the code
        good = told_h.get("clock") == "host"
    detail = {"step_s": step, "hidden": told_h, "slow": told_s, "hidden_share": hidden.data_wait_share,
              "slow_share": slow.data_wait_share, "expected_idle_s": [lo, hi]}
    return (f"step {step * 1e3:.1f} ms; loader {told_h.get('loader_host_s', 0) * 1e3:.0f} ms: data wait "
            f"{hidden.data_wait_share:.1%}; loader {told_s.get('loader_host_s', 0) * 1e3:.0f} ms: "
            f"{'GPU idle' if events else 'host wait'} "
            f"{idle * 1e3:.0f} ms/step (expected {lo * 1e3:.0f}-{hi * 1e3:.0f}), share {slow.data_wait_share:.0%}; "
            f"clock: {told_h.get('clock')}"), good, detail


# TF32 (matmul_precision='high'): inputs rounded to a 10-bit mantissa (unit roundoff 2**-11 = 4.9e-4),
# products accumulated in fp32. A K-long dot product of random inputs then has a relative error of a small
# multiple of 2**-11, and three layers compound it: ~1e-3 expected, 1e-2 allowed. tests/test_gpu_check.py
# emulates the rounding on the CPU (toward zero, twice round-to-nearest's error) on a narrower MLP and
# measures 2.2e-3. fp32 ('highest') sits near 1e-6 (emulated: 3.6e-7): TF32's error must be >= 10x that,
# or TF32 was not used. Loss trajectories are not an accuracy test: from random init every step feeds the
# last one's rounding into the next (AdamW amplifies tiny gradients), so the two trials of the 13-step check
# drifted 5.6% apart on an H200 (issue 48), a figure that grows with the steps, not with TF32's error.
TF32_FORWARD_RTOL = 1e-2  # TF32 forward vs float64: relative (Frobenius) error at most this
TF32_ENGAGED = 10.0  # ... and at least this many times fp32's own error (TF32 really was used)


def relative_error(out: Any, ref: Any) -> float:
    """||out - ref|| / ||ref|| (Frobenius), in float64."""
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm())


def tf32_expectation(err_high: float, err_highest: float, speedup: float, losses_ok: bool,
                     restored: bool) -> bool:
    """TF32 passes: its forward within TF32_FORWARD_RTOL of float64 and >= TF32_ENGAGED x fp32's error,
    >= 1.2x faster, both trials' losses finite and falling, the precision setting restored."""
    engaged = err_high >= TF32_ENGAGED * max(err_highest, 1e-12)
    return err_high <= TF32_FORWARD_RTOL and engaged and speedup >= 1.2 and losses_ok and restored


def _forward_errors(ctx: Context, model: Any, x: Any) -> tuple[float, float]:
    """(TF32 error, fp32 error) of one forward of `model` on `x` against its float64 forward."""
    torch = ctx.torch
    before = torch.get_float32_matmul_precision()
    with torch.no_grad():
        ref = model.double()(x.double())
        model.float()
        errors = []
        try:
            for precision in ("high", "highest"):
                torch.set_float32_matmul_precision(precision)
                errors.append(relative_error(model(x), ref))
        finally:
            torch.set_float32_matmul_precision(before)
    return errors[0], errors[1]


# ---- new input shapes and the demos' CUDA sizes (issue 48, items 2 and 4) ------------------------
@contextlib.contextmanager
def steady_warmup() -> Iterator[None]:
    """The steady-state warm-up rule inside a check (run_one sets WORKBENCH_FIXED_WARMUP=1 for the others):
    the shape rule is part of it."""
    before = os.environ.pop("WORKBENCH_FIXED_WARMUP", None)
    try:
        yield
    finally:
        if before is not None:
            os.environ["WORKBENCH_FIXED_WARMUP"] = before


class SkewedTokens:
    """Token dicts of Pareto lengths (most short, a few up to `top`): many distinct padded shapes."""

    def __init__(self, n: int, top: int, vocab: int) -> None:
        import random

        import torch

        rng = random.Random(0)
        g = torch.Generator().manual_seed(0)
        self.items = [torch.randint(1, vocab, (min(top, max(4, int(top / 16 * rng.paretovariate(1.2)))),), generator=g)
                      for _ in range(n)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.items[i], "labels": self.items[i]}


def pad_longest(features: list[dict[str, Any]]) -> dict[str, Any]:
    """Pad a batch to its longest sample (a tokenizer's padding='longest'): one shape per length."""
    import torch

    width = max(len(f["input_ids"]) for f in features)
    ids = torch.zeros(len(features), width, dtype=torch.long)
    labels = torch.full((len(features), width), -100)
    mask = torch.zeros(len(features), width, dtype=torch.long)
    for row, f in enumerate(features):
        n = len(f["input_ids"])
        ids[row, :n], labels[row, :n], mask[row, :n] = f["input_ids"], f["labels"], 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def token_model(ctx: Context, top: int, vocab: int) -> tuple[Any, Any, str]:
    """(model, step_fn, what it is): a GPT-2 from a config when transformers is installed, else the demos'
    decoder; `top` positions."""
    try:
        import transformers
    except ImportError:
        transformers = None
    ctx.torch.manual_seed(0)
    width, layers = ctx.size(512, 32), ctx.size(6, 2)
    if transformers is not None:
        cfg = transformers.GPT2Config(vocab_size=vocab, n_positions=top, n_embd=width, n_layer=layers, n_head=8 if
                                      width >= 256 else 2, bos_token_id=None, eos_token_id=None)
        return transformers.GPT2LMHeadModel(cfg), None, f"GPT-2 d={width} x{layers} (transformers)"
    from workbench.demos.transformer import TinyGPT

    def step(model: Any, batch: dict[str, Any]) -> Any:
        logits = model(batch["input_ids"])
        return ctx.torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())

    return TinyGPT(vocab, top, width, 8 if width >= 256 else 2, layers), step, f"decoder d={width} x{layers}"


def check_shapes_bf16(ctx: Context) -> tuple[str, bool, dict]:
    """Variable-length token batches under bf16: warm-up meets every shape, so two trials of the same knobs
    agree (within 15%) though the first paid the process's plans and the second did not; shapes reported."""
    torch, wb = ctx.torch, ctx.wb
    top, vocab = ctx.size(512, 64), 1000
    model, step, what = token_model(ctx, top, vocab)
    loader = torch.utils.data.DataLoader(SkewedTokens(ctx.size(2048, 128), top, vocab), batch_size=ctx.size(16, 4),
                                         collate_fn=pad_longest)
    bench = wb.Workbench(model, loader, step_fn=step, optimizer=lambda p: torch.optim.AdamW(p, lr=1e-4),
                         device=ctx.device, log=None, name="shapes", steps=ctx.size(STEPS, 8), warmup_steps=WARMUP)
    amp = "off" if ctx.small else "bf16" if not ctx.cuda or torch.cuda.is_bf16_supported() else "fp16"  # dry run: fp32
    with steady_warmup():
        first, again = bench.run(amp=amp), bench.run(amp=amp)
    if not (_ok(first) and _ok(again)):
        return f"first {_status(first)}; again {_status(again)}", False, {}
    ratio = again.tokens_per_s / first.tokens_per_s
    info, info2 = first.extra.get("shapes") or {}, again.extra.get("shapes") or {}
    per = info.get("per_shape_s")
    close = abs(ratio - 1) <= 0.15 or not ctx.cuda  # the dry run checks the code, not a 2-core CPU's noise
    good = (close and (first.shapes or 0) >= 2 and first.shape_warmup_s is not None
            and info.get("in_window") == 0 and info2.get("in_window") == 0)
    cost = f"{first.shapes} shapes x {per * 1e3:,.0f} ms" if per is not None else f"{first.shapes} shapes, cost n/a"
    return (f"{what}, {amp}: again/first {ratio:.2f}x tokens/s ({first.tokens_per_s:,.0f} vs "
            f"{again.tokens_per_s:,.0f}); {cost} in warm-up (again: {again.shape_warmup_s or 0:.2f} s); "
            f"window met new shapes: {info.get('in_window')}/{info2.get('in_window')}; warm-up "
            f"{first.extra.get('warmup_rule', {}).get('steps')} steps"), good, \
        {"shapes": info, "again": info2, "tokens_per_s": [first.tokens_per_s, again.tokens_per_s]}


def check_demo_lessons(ctx: Context) -> tuple[str, bool, dict]:
    """The demos at the size `wb.demo` picks here (demos.size_for): on CUDA, bf16 and channels_last pay on the
    convnet and bf16 on the transformer (one trial each: ratios with a margin, reported)."""
    from workbench.demos import cnn, size_for, transformer

    torch = ctx.torch
    bf16 = not ctx.cuda or torch.cuda.is_bf16_supported()
    amp = "bf16" if bf16 else "fp16"
    conv, lm = ctx.demo("cnn", steps=ctx.size(STEPS, 4)), ctx.demo("transformer", steps=ctx.size(STEPS, 4))
    sized = {name: size_for(name, "tiny" if ctx.small else "default", ctx.device) for name in ("cnn", "transformer")}
    picked = (conv.defaults.batch_size == cnn.SIZES[sized["cnn"]]["batch_size"]
              and lm.defaults.batch_size == transformer.SIZES[sized["transformer"]]["batch_size"])
    res = {"cnn fp32": conv.run(), f"cnn {amp}": conv.run(amp=amp),
           f"cnn {amp}+channels_last": conv.run(amp=amp, channels_last=True),
           "transformer fp32": lm.run(), f"transformer {amp}": lm.run(amp=amp)}
    bad = [f"{k} {_status(r)}" for k, r in res.items() if not _ok(r)]
    if bad:
        return "; ".join(bad), False, {}
    rate = {k: r.samples_per_s for k, r in res.items()}
    gains = {f"cnn {amp}/fp32": rate[f"cnn {amp}"] / rate["cnn fp32"],
             f"cnn +channels_last/{amp}": rate[f"cnn {amp}+channels_last"] / rate[f"cnn {amp}"],
             f"transformer {amp}/fp32": rate[f"transformer {amp}"] / rate["transformer fp32"]}
    need = {f"cnn {amp}/fp32": 1.2, f"cnn +channels_last/{amp}": 1.05, f"transformer {amp}/fp32": 1.5}
    held = {k: v >= need[k] for k, v in gains.items()}
    good = picked and (all(held.values()) if ctx.cuda else True)  # the lessons are a GPU's; the dry run runs the code
    figures = ", ".join(f"{k} {v:.2f}x (>= {need[k]})" for k, v in gains.items())
    return (f"sizes {sized['cnn']}/{sized['transformer']} picked: {picked}; {figures}"), good, \
        {"samples_per_s": rate, "gains": gains, "held": held}


def check_tf32(ctx: Context) -> tuple[str, bool, dict]:
    torch = ctx.torch
    if torch.cuda.get_device_capability(ctx.device) < (8, 0):
        raise Skip("skipped: no TF32 before compute capability 8.0")
    before = torch.get_float32_matmul_precision()
    bench = ctx.mlp(dim=4096, hidden=4096, depth=2, samples=2048, batch_size=1024, name="tf32", steps=10)
    highest = bench.run(data="cached", matmul_precision="highest")
    high = bench.run(data="cached", matmul_precision="high")
    after = torch.get_float32_matmul_precision()
    if not (_ok(highest) and _ok(high)):
        return f"highest {_status(highest)}; high {_status(high)}", False, {}
    speed = high.samples_per_s / highest.samples_per_s
    model = bench.workload.fresh_model().to(ctx.device)
    x = torch.randn(1024, 4096, generator=torch.Generator().manual_seed(1)).to(ctx.device)
    err_high, err_highest = _forward_errors(ctx, model, x)
    falling = all(r.losses[-1] < r.losses[0] for r in (high, highest))  # one cached batch: both learn it
    _, drift = losses_match(high.losses, highest.losses, rtol=0.0)
    good = tf32_expectation(err_high, err_highest, speed, falling, after == before)
    return (f"high/highest {speed:.2f}x; one forward vs float64: TF32 {err_high:.1e}, fp32 {err_highest:.1e} "
            f"(<= {TF32_FORWARD_RTOL:g}, >= {TF32_ENGAGED:g}x fp32's); losses falling: {falling}, trajectories "
            f"{drift:.1%} apart (reported, not judged); precision restored to {after!r}: {after == before}"), good, \
        {"speedup": speed, "err_tf32": err_high, "err_fp32": err_highest, "loss_drift": drift,
         "high": list(high.losses), "highest": list(highest.losses)}


def check_cudnn_benchmark(ctx: Context) -> tuple[str, bool, dict]:
    if "cudnn_benchmark" not in ctx.knob_names():
        raise Skip(f"{SKIP_VERSION} (no cudnn_benchmark knob)")
    torch = ctx.torch
    before = torch.backends.cudnn.benchmark
    bench = ctx.demo("cnn")
    off = bench.run(batch_size=128, cudnn_benchmark=False)
    on = bench.run(batch_size=128, cudnn_benchmark=True)
    after = torch.backends.cudnn.benchmark
    if not (_ok(off) and _ok(on)):
        return f"off {_status(off)}; on {_status(on)}", False, {}
    speed = on.samples_per_s / off.samples_per_s
    return (f"on/off {speed:.2f}x (one trial each); torch.backends.cudnn.benchmark restored: {after == before}"), \
        after == before, {"speedup": speed}


def check_memory_snapshot(ctx: Context) -> tuple[str, bool, dict]:
    if "trace" not in inspect.signature(ctx.wb.Workbench.run).parameters:
        raise Skip(f"{SKIP_VERSION} (bench.run has no trace=)")
    log_dir = ctx.tmp / "trace-log"
    bench = ctx.wb.demo("cnn", size="tiny", device=ctx.device, log=log_dir, steps=STEPS, warmup_steps=WARMUP)
    t0 = time.time()
    r = bench.run(trace=True)
    if not r.ok:
        return _status(r), False, {}
    trace = getattr(r, "trace_path", None) or (r.extra or {}).get("trace_path")
    if not trace or not Path(trace).is_file():
        return f"no trace file (trace_path={trace!r})", False, {}
    found = [p for p in Path(trace).parent.rglob("*") if p.is_file() and p.stat().st_mtime >= t0 - 1
             and ("snapshot" in p.name.lower() or "memory" in p.name.lower())]
    sizes = {p.name: p.stat().st_size for p in found}
    good = any(size > 0 for size in sizes.values())
    why = [n for n in r.notes if "snapshot" in n.lower()]  # a guarded private API says why it wrote none
    return (f"trace {Path(trace).name} ({Path(trace).stat().st_size:,} B); snapshot files: {sizes or 'none'}"
            + (f"; {why[0][:160]}" if why else "")), good, \
        {"trace": str(trace), "snapshot": {str(p): p.stat().st_size for p in found}, "notes": list(r.notes)}


def check_ddp(ctx: Context) -> tuple[str, bool, dict]:
    if "world_size" not in ctx.knob_names():
        raise Skip(f"{SKIP_VERSION} (no world_size knob)")
    n = ctx.torch.cuda.device_count()
    if n < 2:
        raise Skip(f"skipped: needs 2 GPUs ({n} here)")
    bench = ctx.demo("cnn")
    one = bench.run(batch_size=64, world_size=1)
    two = bench.run(batch_size=64, world_size=2)
    if not (_ok(one) and _ok(two)):
        return f"world_size=1 {_status(one)}; world_size=2 {_status(two)}", False, {}
    eff = two.samples_per_s / (2 * one.samples_per_s)
    return f"2 ranks: {two.samples_per_s:,.0f} samples/s, scaling efficiency {eff:.0%}", True, {"efficiency": eff}


FSDP_FACTORY = """
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.up, self.down = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


def make():
    torch.manual_seed(0)
    width = WIDTH
    model = nn.Sequential(nn.Linear(64, width), *[Block(width) for _ in range(4)], nn.Linear(width, 10))
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(4096, 64, generator=g), torch.randint(0, 10, (4096,), generator=g))
    return {"model": model, "data": data, "loss_fn": nn.CrossEntropyLoss(), "device": "DEVICE", "name": "fsdp2",
            "optimizer": lambda p: torch.optim.AdamW(p, lr=1e-3)}
"""


def _torchrun_trial(ctx: Context, *flags: str) -> dict[str, Any]:
    """One 2-rank trial under torchrun through the CLI (rank 0's JSON result): the ranks start fresh,
    so this works after CUDA is initialised here (a forked rank could not use it)."""
    import subprocess

    root = Path(ctx.wb.__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ctx.tmp), str(root), os.environ.get("PYTHONPATH", "")]),
           "PYTHONFAULTHANDLER": "1"}  # a rank that aborts prints its Python stacks, not just torchrun's summary
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "workbench",
           "run", "--model", "gck_fsdp:make", "--json", "--quiet", "--steps", str(ctx.size(STEPS, 6)),
           "--warmup-steps", "2", "--batch-size", str(ctx.size(256, 32)), "--log-path", str(ctx.tmp / "log"), *flags]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ctx.tmp, timeout=480)
    if out.returncode != 0 or "{" not in out.stdout:
        # the whole stderr: each rank's traceback sits above torchrun's summary (error_file: <N/A>)
        raise RuntimeError(f"torchrun exited {out.returncode}; its whole stderr:\n{out.stderr.strip()}")
    return json.JSONDecoder().raw_decode(out.stdout[out.stdout.index("{"):])[0]["result"]  # rank 0's document


def check_fsdp2(ctx: Context) -> tuple[str, bool, dict]:
    if "strategy" not in ctx.knob_names():
        raise Skip(f"{SKIP_VERSION} (no strategy knob)")
    if ctx.cuda and ctx.torch.cuda.device_count() < 2:
        raise Skip(f"skipped: needs 2 GPUs ({ctx.torch.cuda.device_count()} here)")
    factory = FSDP_FACTORY.replace("WIDTH", str(ctx.size(2048, 64))).replace("DEVICE", ctx.device)
    (ctx.tmp / "gck_fsdp.py").write_text(factory)
    ddp = _torchrun_trial(ctx, "--strategy", "ddp")
    fsdp = _torchrun_trial(ctx, "--strategy", "fsdp2")
    # bf16 parameters + CPU offload: a third job on the GPU only (offload is a no-op on CPU; the dry run saves ~10 s)
    mixed = (_torchrun_trial(ctx, "--strategy", "fsdp2", "--fsdp-param-dtype", "bf16", "--fsdp-cpu-offload")
             if ctx.cuda else {"status": "ok", "losses": [0.0], "samples_per_s": None, "notes": ["not in the dry run"]})
    same, worst = losses_match(ddp["losses"], fsdp["losses"], rtol=1e-3)
    share = fsdp["model_state_bytes"] / ddp["model_state_bytes"]
    good = (all(r["status"] == "ok" for r in (ddp, fsdp, mixed)) and same and share <= 0.65
            and all(math.isfinite(x) for x in mixed["losses"]))
    return (f"fsdp2 {fsdp['samples_per_s']:,.0f} vs ddp {ddp['samples_per_s']:,.0f} samples/s; model state "
            f"{share:.2f}x DDP's; losses within {worst:.1e}; bf16 + CPU offload {mixed['status']} "
            f"({mixed['samples_per_s'] or 0:,.0f} samples/s)"), good, \
        {"ddp": ddp["samples_per_s"], "fsdp2": fsdp["samples_per_s"], "bf16_offload": mixed["samples_per_s"],
         "state_share": share, "notes": mixed.get("notes")}


def check_oom(ctx: Context) -> tuple[str, bool, dict]:
    torch = ctx.torch
    hidden = 2**20
    total = torch.cuda.get_device_properties(ctx.device).total_memory
    huge = 2 * total // (4 * hidden) + 1  # the (huge, hidden) fp32 activation alone is 2x the GPU
    bench = ctx.mlp(dim=16, hidden=hidden, depth=1, samples=huge, batch_size=64, name="oom", steps=5, warmup=1)
    ctx.free()
    alloc0, reserved0 = torch.cuda.memory_allocated(ctx.device), torch.cuda.memory_reserved(ctx.device)
    boom = bench.run(batch_size=huge)
    ctx.free()
    alloc1, reserved1 = torch.cuda.memory_allocated(ctx.device), torch.cuda.memory_reserved(ctx.device)
    after = bench.run(batch_size=64)
    mib = 2**20
    returned = alloc1 - alloc0 <= 2 * mib and reserved1 - reserved0 <= 64 * mib
    good = boom.status == "oom" and _ok(after) and returned
    return (f"batch {huge:,}: status {boom.status}; next trial {_status(after)}; allocated "
            f"{(alloc1 - alloc0) / mib:+.1f} MiB, reserved {(reserved1 - reserved0) / mib:+.1f} MiB after the OOM"), \
        good, {"message": boom.message, "alloc_delta": alloc1 - alloc0, "reserved_delta": reserved1 - reserved0}


def check_worker_process(ctx: Context) -> tuple[str, bool, dict]:
    """The default place of trials: the workbench's worker process, which owns a CUDA context of its own. The
    model sits on the device in this process (as a notebook's often does); the trial runs in the worker, on
    the device, and reads what the same trial reads in this process (both one thread, one OpenMP team here)."""
    torch, nn = ctx.torch, ctx.torch.nn
    width = ctx.size(2048, 128)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)).to(ctx.device)
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(2048, width, generator=g), torch.randint(0, 10, (2048,), generator=g))
    kw = dict(loss_fn=nn.CrossEntropyLoss(), optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3), device=ctx.device,
              log=None, steps=STEPS, warmup_steps=WARMUP, knobs=ctx.wb.Knobs(batch_size=ctx.size(256, 32)))
    worker = ctx.wb.Workbench(model, data, name="worker", trials_in="worker", **kw)
    kernel = ctx.wb.Workbench(model, data, name="kernel", trials_in="kernel", **kw)
    w, k, w2 = worker.run(), kernel.run(), worker.run()
    if not (_ok(w) and _ok(k) and _ok(w2)):
        return f"worker {_status(w)}; kernel {_status(k)}", False, {}
    ratio = math.sqrt(w.samples_per_s * w2.samples_per_s) / k.samples_per_s
    where = {w.env.get("ran_in"), w2.env.get("ran_in")}
    good = where == {"worker"} and str(w.env.get("device", "")).startswith(ctx.device) and 0.85 <= ratio <= 1.15
    start = (w.extra.get("worker_startup") or {}).get("text", "")
    worker._worker.close()
    return (f"ran_in {sorted(where)} on {w.env.get('device')}; worker / kernel {ratio:.2f}; {start}"), good, \
        {"worker": [w.samples_per_s, w2.samples_per_s], "kernel": k.samples_per_s}


ANY = ("cuda", "mps", "cpu")  # "cpu" only ever runs in the GPU_CHECK_DEVICE=cpu dry run

# Order matters: the OOM trial runs last so a damaged allocator cannot spoil the others, and the
# cheap checks come before the compiles so a slow cold compile can only crowd out the OOM check.
CHECKS: list[Check] = [  # estimates: rough guesses of cold seconds on one GPU (not yet measured)
    Check("step times: CUDA events vs host window", "ok; sum of step events / synced host window in [0.90, 1.00]",
          check_step_clock, 10, ANY),
    Check("peak memory + checkpointing (mlp-memory)",
          "peak == memory_stats peak (1%), >= params+grads+AdamW; checkpointing all blocks < 0.8x",
          check_peak_memory, 10, ANY),
    Check("amp=fp16 GradScaler + overflow step", "ok, finite losses; the overflow step is skipped, >= 80% of the others update",
          check_fp16_scaler, 8, ANY),
    Check("pin_memory + non_blocking, 2 workers (cnn)", "ok; losses equal the unpinned run (1%); no no-op note (MPS: the note)",
          check_pinned_workers, 15, ANY),
    Check("bf16 and channels_last (cnn)", "ok; first losses within 5% of fp32; speedups reported",
          check_bf16_channels_last, 15, ANY),
    Check("compute-bound LM, default loader (8 layers, d=768, seq 512)",
          f"ok; data wait <= {LM_DATA_WAIT:.0%} (pageable copies: the queue they wait behind is compute); "
          "diagnose says compute", check_lm_data_wait, 45, ANY),
    Check("data wait is the GPU's idle time (hidden and slow loader)",
          f"ok; a loader of {HIDDEN_LOADER} GPU steps reads data wait <= {HIDDEN_WAIT:.0%}; one of {SLOW_LOADER:.0f} "
          "steps reads its excess over the step as GPU idle (0.8x to +0.5 step)", check_gpu_idle_wait, 25,
          ("cuda", "cpu")),
    Check("profile stages in device time (the LM)", f"each stage once; data + the kernels of forward, backward, "
          f"optimizer = {STAGES_LOW:.2f}-{STAGES_HIGH:.2f} of the traced step", check_device_stages, 5, ANY),
    Check("variable-length tokens under bf16: shapes", "two trials of the same knobs within 15% tokens/s; shapes and "
          "their first calls reported; no window meets a new shape", check_shapes_bf16, 30, ANY),
    Check("demos at the device's size (cnn, transformer)", "the CUDA sizes picked; cnn bf16 >= 1.2x fp32, "
          "+channels_last >= 1.05x bf16; transformer bf16 >= 1.5x fp32", check_demo_lessons, 30, ANY),
    Check("matmul_precision='high' (TF32)", "ok; >= 1.2x on fp32 matmuls; one forward within 1e-2 of float64 and "
          ">= 10x fp32's error; losses falling; precision restored", check_tf32, 12),
    Check("cudnn_benchmark knob", "ok; speedup reported; torch.backends.cudnn.benchmark restored",
          check_cudnn_benchmark, 10),
    Check("trace export + CUDA memory snapshot", "ok; a trace file and a non-empty memory snapshot next to it",
          check_memory_snapshot, 15),
    Check("DDP, NCCL, world_size=2", "ok on 2 GPUs; scaling efficiency reported", check_ddp, 40),
    Check("FSDP2, NCCL, world_size=2 (torchrun)",
          "ok on 2 GPUs; losses equal DDP's (1e-3); model state <= 0.65x DDP's; bf16 params + CPU offload ok",
          check_fsdp2, 60, ("cuda", "cpu")),
    # first compiled trial of the process: before the compile checks below
    Check("steady state: compile + 8 workers, data-bound", "ok; <= 1.05x what the workers deliver; warm-up drained "
          "the buffer (> 16 steps)", check_steady_compile_workers, 60, ("cuda", "cpu")),
    Check("compile='default'", "ok; losses equal eager (1e-3), not all identical", check_compile_default, 50,
          ("cuda", "cpu")),
    Check("compile='reduce-overhead' (CUDA graphs)", "ok; losses equal eager (1e-3) after graph replays, not all identical",
          check_compile_cudagraphs, 50, ("cuda", "cpu")),
    Check("trials in the worker process (the default)", "ok; ran_in worker, on the device, with the model on the "
          "device in this process; worker / in-process trial within 0.85-1.15", check_worker_process, 20, ANY),
    Check("OOM trial, then the next one", "status oom; next trial ok; allocated memory back (<= 2 MiB)",
          check_oom, 10),
]


# ---- running ------------------------------------------------------------------------------------
def pick_device(env: dict[str, str] | None = None) -> str | None:
    """'cuda', 'mps', 'cpu' (the dry run, only when asked) or None (then every check is skipped)."""
    import torch

    forced = (os.environ if env is None else env).get("GPU_CHECK_DEVICE", "")
    if forced:
        if forced != "cpu":
            raise ValueError(f"GPU_CHECK_DEVICE={forced!r}: the only value is 'cpu' (a dry run); unset it for a real run")
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return "mps"
    return None


def device_name(device: str | None) -> str:
    import torch

    if device == "cuda":
        return f"{torch.cuda.get_device_name()} x{torch.cuda.device_count()}"
    if device == "mps":
        return f"Apple MPS ({platform.machine()}, macOS {platform.mac_ver()[0] or '?'})"
    if device == "cpu":
        return f"CPU dry run ({platform.machine()}; verifies this script, not a GPU)"
    return f"no CUDA or MPS device ({platform.machine()})"


@contextlib.contextmanager
def warmup_for(check: Check) -> Iterator[None]:
    """Checks that compare losses step by step between two trials run with the fixed warm-up count
    (WORKBENCH_FIXED_WARMUP=1: both windows start at the same step); the steady-state check runs
    with the rule it checks."""
    before = os.environ.get("WORKBENCH_FIXED_WARMUP")
    if check.run is check_steady_compile_workers:
        os.environ.pop("WORKBENCH_FIXED_WARMUP", None)
    else:
        os.environ["WORKBENCH_FIXED_WARMUP"] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("WORKBENCH_FIXED_WARMUP", None)
        else:
            os.environ["WORKBENCH_FIXED_WARMUP"] = before


def run_one(check: Check, ctx: Context) -> Row:
    """Run a check; an exception is a failed row with the traceback in its detail, never a crash."""
    row = Row(check.name, check.expected)
    t0 = time.monotonic()
    try:
        with warmup_for(check):
            measured, passed, detail = check.run(ctx)
        row.measured, row.result, row.detail = measured, PASS if passed else FAIL, detail
    except Skip as e:
        row.result = str(e) if str(e).startswith("skipped") else f"skipped: {e}"
    except Exception as e:
        row.measured = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:160] if str(e).strip() else ''}"
        row.result = FAIL
        row.detail = {"traceback": traceback.format_exc()}
    finally:
        row.seconds = time.monotonic() - t0
        with contextlib.suppress(Exception):
            ctx.free()
    return row


def meta(device: str | None, rows: Sequence[Row], budget: Budget, started: str) -> dict[str, Any]:
    import torch

    return {
        "summary": summary_line(rows, device_name(device), budget.elapsed()),
        "device": device_name(device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "started": started,
        "elapsed_s": round(budget.elapsed(), 1),
        "budget_s": budget.total_s,
        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "counts": count(rows),
    }


def finish(rows: list[Row], device: str | None, budget: Budget, started: str) -> None:
    print()
    print(format_table(rows))
    doc = meta(device, rows, budget, started)
    print(doc["summary"])
    path = write_json(rows, doc, os.environ.get("OUT"))
    if path is not None:
        print(f"wrote {path}")
    sys.stdout.flush()


def main() -> int:
    # The checks read this process's device state around a trial (memory back after an OOM, settings restored):
    # their trials run here. Trials in the worker process, the default, have a check of their own.
    os.environ.setdefault("WORKBENCH_TRIALS", "kernel")
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    budget = Budget(budget_from_env())
    device = pick_device()
    if device is None:
        rows = [Row(c.name, c.expected, result=SKIP_NO_CUDA) for c in CHECKS]
        finish(rows, device, budget, started)
        print(f"no CUDA device: {len(CHECKS)} checks skipped")
        return 0

    todo = [c for c in CHECKS if device in c.devices]
    rows: list[Row] = [Row(c.name, c.expected, result=f"skipped: not on {device}") for c in CHECKS if c not in todo]
    if device == "mps":
        print(f"no CUDA device: {len(CHECKS) - len(todo)} checks skipped; running {len(todo)} on mps")
    done = threading.Event()

    def watchdog() -> None:  # a hung check must not cost the whole lent machine: print what we have
        if done.is_set():
            return
        late = [Row(c.name, c.expected, result=f"{SKIP_TIME} (watchdog)") for c in todo
                if c.name not in {r.check for r in rows}]
        finish(rows + late, device, budget, started)
        print(f"watchdog: stopped after {budget.elapsed():.0f} s (budget {budget.total_s:.0f} s)")
        os._exit(3)

    timer = threading.Timer(budget.total_s + WATCHDOG_GRACE_S, watchdog)
    timer.daemon = True
    timer.start()
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as tmp:
        ctx = Context(device, Path(tmp))
        print(f"gpu_check on {device_name(device)}, torch {ctx.torch.__version__}, budget {budget.total_s:.0f} s")
        for c in todo:
            if not budget.allows(c.estimate_s):
                row = Row(c.name, c.expected, result=SKIP_TIME)
            else:
                row = run_one(c, ctx)
            rows.append(row)
            print(f"[{budget.elapsed():6.1f} s] {row.result:<8} {row.check}: {row.measured}", flush=True)
    done.set()
    timer.cancel()
    order = {c.name: i for i, c in enumerate(CHECKS)}
    rows.sort(key=lambda r: order[r.check])
    finish(rows, device, budget, started)
    return 1 if count(rows)["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
