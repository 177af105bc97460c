"""The user's own loop as referee, with the process pinned: the trials' speedups against the speedups
of the scripts `to_code()` writes, each script run as a fresh `python` process in the same allocator
mode (its header's launch line), alternating A B A B.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_referee.py [--rounds 3] [--mode glibc-kept] [--steps 20] \
        [--workloads cnn own]

Knob sets: the cnn demo's defaults, channels_last, amp="bf16" and batch_size 64; and a CNN of this
file's own (three convolutions, 32x32 inputs, batch 64, AdamW: the issue's held-out shape) with its
defaults and channels_last. Each round runs, per set and in alternating order (round 1 forward, round
2 backward, ...), three sides:
  kernel  the trial as it runs by default today: in this process, allocator=None (its mode recorded)
  fresh   the trial with allocator=MODE: a fresh process started in that mode (wb.FreshProcess)
  script  the exported script of the fresh trial (allocator=MODE in its header), started in MODE
Reported per set: each side's median samples/s and its speedup over its own defaults; per round the
speedups' ratio fresh/script and kernel/script with a 95% interval and a verdict within ±5%
(`--margin`). This is the measurement docs/measurement.md 'The process is a knob' decides the default
mode from: whichever side agrees with the script. Measures, asserts nothing.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

import workbench as wb
from workbench.core.codegen import script_warmup  # the trial's steady warm-up (issue 30)
from workbench.core.measure import environment
from workbench.core.system import allocator_env, process_allocator
from workbench.results.stats import t_quantile

ROOT = Path(__file__).resolve().parents[1]

# (workload, knob changes); the first set of each workload is its defaults (the speedup reference)
KNOB_SETS: list[tuple[str, dict]] = [
    ("cnn", {}),
    ("cnn", {"channels_last": True}),
    ("cnn", {"amp": "bf16"}),
    ("cnn", {"batch_size": 64}),
    ("own", {}),
    ("own", {"channels_last": True}),
]

DEMO_PREAMBLE = """\
from workbench.demos import DEMOS

parts = DEMOS[{demo!r}].build({size!r})
model, dataset, loss_fn, make_optimizer = parts["model"], parts["data"], parts["loss_fn"], parts["optimizer"]

"""
OWN_PREAMBLE = """\
import sys

sys.path.insert(0, {folder!r})
from bench_referee import own_parts

model, dataset, loss_fn, make_optimizer = own_parts()

"""


class ThreeConv(nn.Module):
    """The issue's held-out shape: three 3x3 convolutions on 32x32 inputs, a linear head."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, stride=2, padding=1),
                                  nn.ReLU(), nn.Conv2d(64, 64, 3, stride=2, padding=1), nn.ReLU())
        self.head = nn.Linear(64, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).mean(dim=(2, 3)))


def own_parts() -> tuple:
    """(model, dataset, loss_fn, make_optimizer) of the held-out CNN, seeded."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(1024, 3, 32, 32, generator=g), torch.randint(0, 10, (1024,), generator=g))
    return ThreeConv(), data, nn.CrossEntropyLoss(), lambda p: torch.optim.AdamW(p, lr=1e-3)


def benches(size: str, steps: int, warmup: int) -> dict[str, wb.Workbench]:
    model, data, loss_fn, opt = own_parts()
    own = wb.Workbench(model, data, loss_fn=loss_fn, optimizer=opt, log=None, name="own", steps=steps,
                       warmup_steps=warmup, knobs=wb.Knobs(batch_size=64), device="cpu")
    return {"cnn": wb.demo("cnn", size=size, log=None, steps=steps, warmup_steps=warmup), "own": own}


def script_rate(name: str, size: str, knobs: wb.Knobs, workdir: Path, mode: str, steps: int, warmup: int) -> float:
    """The exported script of `knobs` (allocator=mode in its header), run as a fresh `python` process
    started as that header says; the samples/s it prints."""
    pre = OWN_PREAMBLE.format(folder=str(ROOT / "benchmarks")) if name == "own" else \
        DEMO_PREAMBLE.format(demo=name, size=size)
    path = workdir / f"loop_{name}.py"
    path.write_text(pre + knobs.to_code(steps=script_warmup(knobs, warmup) + steps, warmup=warmup))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for k, v in allocator_env(mode).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    out = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env, timeout=600)
    m = re.search(r"([\d.]+) samples/s", out.stdout)
    if out.returncode != 0 or m is None or "does not run allocator" in out.stderr:
        raise RuntimeError(f"the generated loop failed or ran in another mode for {knobs}:\n{out.stderr[-2000:]}")
    return float(m.group(1))


def agreement(w: list[float], s: list[float], margin: float) -> tuple[str, str]:
    """(95% interval of w/s, verdict) from per-round log-ratios: "agrees within ±5%" when the 90%
    equivalence interval lies inside ±margin, "differs" when the 95% interval excludes ±margin."""
    d = [math.log(a / b) for a, b in zip(w, s) if a > 0 and b > 0 and math.isfinite(a / b)]
    if len(d) < 2:
        return "n/a", "undecided (fewer than 2 rounds)"
    mean, se = statistics.fmean(d), statistics.stdev(d) / math.sqrt(len(d))
    half, half_same = t_quantile(0.975, len(d) - 1) * se, t_quantile(0.95, len(d) - 1) * se
    interval = f"{math.exp(mean - half):.2f}…{math.exp(mean + half):.2f}"
    if abs(mean) + half_same <= math.log1p(margin):
        return interval, f"agrees within ±{margin:.0%}"
    if abs(mean) - half > math.log1p(margin):
        return interval, f"differs by more than {margin:.0%}"
    return interval, "undecided"


def measure(args: argparse.Namespace, sets: list, b: dict, tmp: Path) -> dict[int, dict[str, list[float]]]:
    rates: dict[int, dict[str, list[float]]] = {i: {"kernel": [], "fresh": [], "script": []} for i in range(len(sets))}
    for r in range(args.rounds):
        order = list(range(len(sets)))[:: 1 if r % 2 == 0 else -1]
        for i in order:
            name, knobs = sets[i]
            sides = ["kernel", "fresh", "script"][:: 1 if (r + i) % 2 == 0 else -1]  # A B A B
            for side in sides:
                if side == "kernel":
                    res = b[name].run(knobs, progress=False)
                    rates[i]["kernel"].append(res.samples_per_s if res.ok else float("nan"))
                elif side == "fresh":
                    res = b[name].run(knobs.replace(allocator=args.mode), progress=False)
                    ok = res.ok and res.env.get("allocator") == args.mode
                    rates[i]["fresh"].append(res.samples_per_s if ok else float("nan"))
                else:
                    rates[i]["script"].append(script_rate(name, args.size, knobs.replace(allocator=args.mode), tmp,
                                                          args.mode, args.steps, args.warmup))
            print(f"round {r + 1}, {name} {knobs.label(b[name].defaults)}: kernel {rates[i]['kernel'][-1]:,.0f}, "
                  f"fresh {rates[i]['fresh'][-1]:,.0f}, script {rates[i]['script'][-1]:,.0f} samples/s "
                  f"(load {os.getloadavg()[0]:.2f})", flush=True)
    return rates


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--mode", default="glibc-kept", help="the allocator mode the fresh trials and scripts are pinned to")
    p.add_argument("--size", default="default", choices=["tiny", "default"])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--margin", type=float, default=0.05)
    p.add_argument("--workloads", nargs="+", default=["cnn", "own"], choices=["cnn", "own"])
    args = p.parse_args()
    load_before, t0 = os.getloadavg(), time.perf_counter()
    b = benches(args.size, args.steps, args.warmup)
    sets = [(name, b[name].knobs(**ch)) for name, ch in KNOB_SETS if name in args.workloads]
    with tempfile.TemporaryDirectory() as tmp:
        rates = measure(args, sets, b, Path(tmp))

    import pandas as pd

    rows, ref = [], {}
    for i, (name, knobs) in enumerate(sets):
        ref.setdefault(name, i)
        row = {"workload": name, "knobs": knobs.label(b[name].defaults)}
        per_round = {}
        for side in ("kernel", "fresh", "script"):
            x, x0 = rates[i][side], rates[ref[name]][side]
            row[f"{side} samples/s"] = statistics.median(x)
            per_round[side] = [a / c for a, c in zip(x, x0)]
            row[f"{side} speedup"] = statistics.median(per_round[side])
        if i != ref[name]:
            for side in ("fresh", "kernel"):
                interval, verdict = agreement(per_round[side], per_round["script"], args.margin)
                row[f"{side}/script"] = f"{statistics.median(a / c for a, c in zip(per_round[side], per_round['script'])):.2f} ({interval}) {verdict}"
        rows.append(row)
    env = environment(b["own"].device)
    print(f"\n{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; {env['device_name']}, "
          f"{os.cpu_count()} cores ({env['cpu_capability']}), torch {env['torch']}, Python {platform.python_version()}; "
          f"{args.rounds} rounds, {args.steps} timed steps after {args.warmup} warm-up, size {args.size}; pinned mode "
          f"{args.mode!r}, this process (the kernel side) {process_allocator()!r}; load average {load_before[0]:.2f} "
          f"before, {os.getloadavg()[0]:.2f} after; {time.perf_counter() - t0:.0f} s")
    with pd.option_context("display.width", 250, "display.max_colwidth", 60):
        print(pd.DataFrame(rows).to_string(index=False, float_format="{:.2f}".format))


if __name__ == "__main__":
    main()
