"""Is a gap between a trial and the plain script the workbench's, or the process's? (issue 23)

    PYTHONPATH=. .venv/bin/python benchmarks/bench_inprocess.py [--rounds 8] [--demo cnn] [--knobs channels_last=True]
        [--sides wb,script,inproc,noprobe]

One knob set of one demo, measured in alternating rounds (odd rounds forward, even rounds backward) by:

    wb       bench.run(knobs) from this script's main thread
    script   the loop `knobs.to_code()` writes, run as its own `python` process (bench_referee's referee)
    inproc   the same generated loop, compiled once and exec'd on this process's main thread: the
             script's code with this process's history (heap, threads, earlier trials)
    noprobe  run_trial(measure_memory=False): the trial without the profiled memory probe on its last
             warm-up step

wb against inproc is the workbench's own cost (same process, same thread, the user's code); inproc
against script is what the process adds. Printed: every round, then per side the median samples/s
and the median per-round ratio to the second side named, with the machine, the load, the malloc
setting and the process's thread count. Measures, asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import workbench as wb
from workbench.core.codegen import script_warmup  # the trial's steady warm-up (issue 30)
from workbench.core.measure import environment
from workbench.core.system import malloc_policy
from workbench.launch.runner import run_trial

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_referee import PREAMBLE, STEPS, WARMUP, run_script


def parse_knobs(text: str) -> dict:
    """'channels_last=True,batch_size=64' -> {'channels_last': True, 'batch_size': 64}."""
    out: dict = {}
    for item in filter(None, text.split(",")):
        name, _, value = item.partition("=")
        out[name] = {"True": True, "False": False}.get(value, int(value) if value.isdigit() else value)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--demo", default="cnn")
    p.add_argument("--knobs", default="", help="changes from the demo's defaults, e.g. channels_last=True")
    p.add_argument("--sides", default="wb,script,inproc,noprobe")
    args = p.parse_args()
    sides = args.sides.split(",")
    unknown = set(sides) - {"wb", "script", "inproc", "noprobe"}
    if unknown or len(sides) < 2:
        p.error(f"--sides: two or more of wb, script, inproc, noprobe (got {args.sides})")
    load_before, t_start = os.getloadavg(), time.perf_counter()
    bench = wb.demo(args.demo, log=None, steps=STEPS, warmup_steps=WARMUP)
    knobs = bench.knobs(**parse_knobs(args.knobs))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"loop_{args.demo}.py"
        path.write_text(PREAMBLE.format(demo=args.demo, size="default") + knobs.to_code(
            steps=script_warmup(knobs, WARMUP) + STEPS, warmup=WARMUP))
        code = compile(path.read_text(), str(path), "exec")

        def inproc() -> float:
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(code, {"__name__": "__main__"})  # the generated loop, on this thread, in this process
            return float(re.search(r"([\d.]+) samples/s", out.getvalue()).group(1))

        measure = {
            "wb": lambda: bench.run(knobs, progress=False).samples_per_s,
            "noprobe": lambda: run_trial(bench.workload, knobs, warmup_steps=WARMUP, steps=STEPS,
                                         measure_memory=False).samples_per_s,
            "script": lambda: run_script(path, knobs),
            "inproc": inproc,
        }
        rates: dict[str, list[float]] = {s: [] for s in sides}
        for r in range(args.rounds):
            for s in sides if r % 2 == 0 else sides[::-1]:
                rates[s].append(float(measure[s]() or "nan"))
            print(f"round {r + 1}: " + ", ".join(f"{s} {rates[s][-1]:.1f}" for s in sides)
                  + f"  (load {os.getloadavg()[0]:.2f})", flush=True)
    env = environment(torch.device("cpu"))
    print(f"\n{env['device_name']}, {os.cpu_count()} cores, torch {env['torch']}, Python {platform.python_version()}; "
          f"{args.demo} {knobs.label(bench.defaults)}; {args.rounds} rounds, {STEPS} timed steps after {WARMUP} "
          f"warm-up; load average {load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after; "
          f"{time.perf_counter() - t_start:.0f} s; malloc: {malloc_policy()}; "
          f"{len(os.listdir('/proc/self/task')) if os.path.isdir('/proc/self/task') else '?'} threads")
    ref = sides[1]
    for s in sides:
        ratio = statistics.median(a / b for a, b in zip(rates[s], rates[ref]))
        print(f"{s:8s} median {statistics.median(rates[s]):8.1f} samples/s, x{ratio:.3f} of {ref} (per-round median)")


if __name__ == "__main__":
    main()
