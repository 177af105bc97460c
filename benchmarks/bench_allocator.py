"""The allocator modes on each demo: every trial a fresh process started in its mode, alternating.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_allocator.py [--rounds 3] [--demos cnn jpeg ...] [--steps 20]

For each demo, each round runs one trial per allocator mode available here (glibc as it starts,
glibc keeping freed memory, tcmalloc, jemalloc; `bench.run(allocator=...)`, wb.FreshProcess), the
modes in alternating order (forward, then backward), so drift hits every mode alike. Reported per
demo and mode: the median samples/s, the per-round ratio over glibc (median, 95% interval from the
rounds' log-ratios), the page-fault share of CPU time, and that the mode was read back inside each
trial's process; the machine, load and date. Measures, asserts nothing.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import statistics
import time

import torch

import workbench as wb
from workbench.core.measure import environment
from workbench.core.system import available_allocators
from workbench.results.stats import t_quantile


def interval(ratios: list[float]) -> str:
    """The 95% interval of the ratio from per-round ratios (t on the logs), or 'n/a'."""
    d = [math.log(r) for r in ratios if r > 0 and math.isfinite(r)]
    if len(d) < 2:
        return "n/a"
    mean, se = statistics.fmean(d), statistics.stdev(d) / math.sqrt(len(d))
    half = t_quantile(0.975, len(d) - 1) * se
    return f"{math.exp(mean - half):.2f}…{math.exp(mean + half):.2f}"


def run_demo(name: str, args: argparse.Namespace, modes: tuple[str, ...]) -> list[dict]:
    bench = wb.demo(name, size=args.size, log=None, steps=args.steps, warmup_steps=args.warmup)
    got: dict[str, list] = {m: [] for m in modes}
    for r in range(args.rounds):
        for m in modes[:: 1 if r % 2 == 0 else -1]:
            res = bench.run(allocator=m, progress=False)
            took = res.ok and res.env.get("allocator") == m
            got[m].append(res if took else None)
            rate = f"{res.samples_per_s:,.0f} samples/s" if took else f"{res.status}: {res.message[:80]}"
            print(f"{name} round {r + 1} {m}: {rate} (load {os.getloadavg()[0]:.2f})", flush=True)
    rows = []
    for m in modes:
        ok = [t for t in got[m] if t is not None]
        pairs = [(t, g) for t, g in zip(got[m], got["glibc"]) if t is not None and g is not None]
        ratios = [t.samples_per_s / g.samples_per_s for t, g in pairs]
        shares = [t.extra.get("kernel_share") for t in ok if t.extra.get("kernel_share") is not None]
        rows.append({"demo": name, "mode": m, "trials": f"{len(ok)}/{args.rounds}",
                     "samples/s": statistics.median(t.samples_per_s for t in ok) if ok else float("nan"),
                     "range": f"{min(t.samples_per_s for t in ok):,.0f}–{max(t.samples_per_s for t in ok):,.0f}"
                     if ok else "", "vs glibc": statistics.median(ratios) if ratios else float("nan"),
                     "95% interval": interval(ratios) if m != "glibc" else "",
                     "page faults (CPU share)": statistics.median(shares) if shares else float("nan")})
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--demos", nargs="+", default=["cnn", "jpeg", "transformer", "mlp-memory"])
    p.add_argument("--size", default="default", choices=["tiny", "default"])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args()
    modes = available_allocators()
    load_before, t0 = os.getloadavg(), time.perf_counter()
    rows = [row for name in args.demos for row in run_demo(name, args, modes)]

    import pandas as pd

    env = environment(torch.device("cpu"))
    print(f"\n{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; {env['device_name']}, "
          f"{os.cpu_count()} cores ({env['cpu_capability']}), torch {env['torch']}, Python {platform.python_version()}, "
          f"{platform.platform(terse=True)}; modes available: {', '.join(modes)}; {args.rounds} rounds, "
          f"{args.steps} timed steps after {args.warmup} warm-up, size {args.size}; load average "
          f"{load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after; {time.perf_counter() - t0:.0f} s")
    with pd.option_context("display.width", 200):
        print(pd.DataFrame(rows).to_string(index=False, float_format="{:.2f}".format))


if __name__ == "__main__":
    main()
