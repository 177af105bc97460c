"""What moves identical trials? Candidate noise reducers, measured against each other in one process.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_noise.py [demo] [blocks] [--conditions base,gc-off,trim,steps60]

Every block runs each condition as a back-to-back pair of identical trials (the demo's defaults),
conditions in alternating order (forward in odd blocks, backward in even ones), so slow drift hits
all of them alike. Conditions:

    base      bench.run() as it is
    gc-off    Python's cyclic garbage collector disabled for the whole trial (gc.disable/enable)
    trim      glibc malloc_trim(0) before the trial: every trial starts from the same allocator state
    steps60   twice the measured window (60 steps): fewer, longer trials for the same time

Printed per condition: the back-to-back sd of one trial's log(samples/s) (what the paired rule of
`compare(rounds="auto")` sees), the sd across blocks (minutes apart), the median samples/s, seconds
per trial, and "sd² × seconds", the variance a second of measuring buys down to (lower is better:
it is what decides how many seconds a decision takes). With the machine and the load average.
Measures, asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import gc
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator

import torch

import workbench as wb
from workbench.core.measure import environment


@contextlib.contextmanager
def gc_off() -> Iterator[None]:
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def trimmed() -> contextlib.AbstractContextManager:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    libc.malloc_trim(0)
    return contextlib.nullcontext()


def conditions(bench: wb.Workbench) -> dict[str, Callable[[], float]]:
    """Each condition: a function that runs one trial and returns its samples/s."""

    def run(ctx: Callable[[], contextlib.AbstractContextManager], steps: int | None = None) -> Callable[[], float]:
        def one() -> float:
            saved = bench.steps
            bench.steps = steps or saved
            try:
                with ctx():
                    r = bench.run(progress=False)
            finally:
                bench.steps = saved
            return r.samples_per_s if r.ok and r.samples_per_s else float("nan")
        return one

    return {"base": run(contextlib.nullcontext), "gc-off": run(gc_off), "trim": run(trimmed),
            "steps60": run(contextlib.nullcontext, 60)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("demo", nargs="?", default="cnn")
    p.add_argument("blocks", nargs="?", type=int, default=6)
    p.add_argument("--conditions", default="base,gc-off,trim,steps60")
    args = p.parse_args()
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    bench = wb.demo(args.demo, log=None)
    table = conditions(bench)
    names = args.conditions.split(",")
    pairs: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    secs: dict[str, list[float]] = {n: [] for n in names}
    bench.run(progress=False)  # one untimed trial: the first trial in a process pays one-off costs
    for b in range(args.blocks):
        for name in names if b % 2 == 0 else names[::-1]:
            t = time.perf_counter()
            pairs[name].append((table[name](), table[name]()))
            secs[name].append((time.perf_counter() - t) / 2)
        print(f"block {b + 1}: " + ", ".join(f"{n} {pairs[n][-1][0]:.0f}/{pairs[n][-1][1]:.0f}" for n in names)
              + f" (load {os.getloadavg()[0]:.2f})", flush=True)
    env = environment(torch.device("cpu"))
    print(f"\n{args.demo}: {env['device_name']}, {os.cpu_count()} cores, torch {env['torch']}, Python "
          f"{platform.python_version()}; {args.blocks} blocks; load average {load0:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after; {time.perf_counter() - t0:.0f} s")
    for name in names:
        d = [math.log(y / x) for x, y in pairs[name] if x > 0 and y > 0]
        adjacent = math.sqrt(sum(v * v for v in d) / len(d) / 2)
        firsts = [math.log(x) for x, _ in pairs[name] if x > 0]
        apart = statistics.stdev(firsts) if len(firsts) > 1 else float("nan")
        s = statistics.median(secs[name])
        print(f"{name:8s} back-to-back sd {adjacent:6.1%}  minutes-apart sd {apart:6.1%}  median "
              f"{statistics.median(v for pr in pairs[name] for v in pr):8.1f} samples/s  {s:5.2f} s/trial  "
              f"sd²×s {adjacent**2 * s * 1e4:6.2f}e-4")


if __name__ == "__main__":
    main()
