"""The held-out check on real trials: N identical trials, their adjacent pairs and the table's
verdict column (false alarms), then `compare(a, b, rounds=2)` for identical knobs and for a change.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_identical.py [demo] [trials]

Measures and prints; asserts nothing (a loaded machine makes the noise, and the verdicts, wider).
"""

from __future__ import annotations

import itertools
import os
import sys
import time

import workbench as wb


def main() -> None:
    demo = sys.argv[1] if len(sys.argv) > 1 else "cnn"
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    t, load = time.perf_counter(), os.getloadavg()[0]
    bench = wb.demo(demo, log=None)
    trials = [bench.run() for _ in range(n)]
    print("samples/s:", [round(r.samples_per_s or 0) for r in trials])
    pairs = [bench.compare(a, b) for a, b in itertools.pairwise(trials)]
    for c in pairs:
        print(" ", c)
    df = bench.results
    print(f"false alarms: adjacent pairs {sum(c.beyond_noise for c in pairs)} of {n - 1}; verdict column "
          f"{(df['verdict'] == 'beyond noise').sum()} of {n - 1}")
    print("noise:", bench.noise)
    print("identical, rounds=2:", bench.compare(trials[0], trials[1], rounds=2))
    base, other = bench.run(cpu_threads=1), bench.run(batch_size=64, channels_last=True, cpu_threads=1)
    print("a change, rounds=2:", bench.compare(base, other, rounds=2))
    print(f"load average {load:.2f} before, {os.getloadavg()[0]:.2f} after; {time.perf_counter() - t:.0f} s")


if __name__ == "__main__":
    main()
