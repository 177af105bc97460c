"""What tracing costs: the phase labels' price in the measured loop, and the time and bytes a
`run(trace=True)` adds to a trial.

1. phase labels when not tracing: `with phase(name):` on a shared nullcontext, 4 per micro-batch,
   timed with timeit against an empty function (best of 5 repeats);
2. a trial with and without trace=True, alternating (A B B A ...) for R rounds on the shared
   MLP workload; the figure is the median of per-round wall-time differences, plus the trace size.

Run: .venv/bin/python benchmarks/bench_trace.py [rounds]    (prints; asserts nothing)
"""

import contextlib
import os
import platform
import statistics
import sys
import tempfile
import time
import timeit
from pathlib import Path

import torch
from _workload import BATCH, make, optimizer
from torch.profiler import record_function

import workbench as wb


def label_overhead_ns() -> float:
    """ns per phase label (nullcontext path, as in the runner's measured steps)."""
    none = contextlib.nullcontext()
    traced = False

    def phase(name: str):
        return record_function(name) if traced else none

    def labelled() -> None:
        with phase("forward"):
            pass

    def bare() -> None:
        pass

    n = 500_000
    a = min(timeit.repeat(labelled, number=n, repeat=5)) / n
    b = min(timeit.repeat(bare, number=n, repeat=5)) / n
    return (a - b) * 1e9


def main(rounds: int) -> None:
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, torch {torch.__version__}, "
          f"python {platform.python_version()}")
    print(f"load average before: {os.getloadavg()}")
    ns = label_overhead_ns()
    print(f"phase label, not tracing: {ns:.0f} ns each, {4 * ns / 1e3:.2f} us per micro-batch (4 labels)")
    model, data = make()
    with tempfile.TemporaryDirectory() as tmp:
        bench = wb.Workbench(model, data, loss_fn=torch.nn.CrossEntropyLoss(), optimizer=optimizer, log=tmp,
                             knobs=wb.Knobs(batch_size=BATCH))
        walls: dict[bool, list[float]] = {False: [], True: []}
        steps: dict[bool, list[float]] = {False: [], True: []}
        sizes = []
        for i in range(rounds):
            for trace in ((False, True) if i % 2 == 0 else (True, False)):
                t = time.perf_counter()
                r = bench.run(trace=trace, progress=False)
                walls[trace].append(time.perf_counter() - t)
                steps[trace].append(r.step_time_s)
                if trace and r.trace_path:
                    sizes.append(Path(r.trace_path).stat().st_size)
        diffs = [b - a for a, b in zip(walls[False], walls[True])]
        print(f"trial wall time: {statistics.median(walls[False]):.2f} s without, {statistics.median(walls[True]):.2f} s "
              f"with trace=True; added {statistics.median(diffs):.2f} s (median of {rounds} paired rounds)")
        print(f"median step inside the window: {statistics.median(steps[False]) * 1e3:.2f} ms without, "
              f"{statistics.median(steps[True]) * 1e3:.2f} ms with trace=True (the trace runs after the window)")
        print(f"trace file: {statistics.median(sizes) / 1e6:.2f} MB for 3 steps")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4)
