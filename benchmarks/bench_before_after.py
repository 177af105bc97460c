"""Before/after a restructure: the demos' default trials measured with two checkouts of the package.

Each (checkout, demo, round) runs in its own process (PYTHONPATH = that checkout), alternating
before/after per round so slow drift of the machine's load hits both. Each process runs one
unmeasured trial, then `trials` measured ones, and prints their median samples/s and peak memory.
Run: .venv/bin/python benchmarks/bench_before_after.py BEFORE_DIR [AFTER_DIR] [rounds] [trials]
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

DEMOS = ("jpeg", "cnn", "mlp-memory", "transformer")
CHILD = """
import json, statistics, warnings, workbench as wb
warnings.simplefilter("ignore")
bench = wb.demo({demo!r}, log=None, steps={steps}, warmup_steps=3)
bench.run()  # the first trial in a process pays one-off costs
rs = [bench.run() for _ in range({trials})]
print(json.dumps({{"sps": statistics.median(r.samples_per_s for r in rs),
                   "peak": statistics.median(r.peak_memory_bytes or 0 for r in rs),
                   "ok": all(r.ok for r in rs), "file": wb.__file__}}))
"""


def measure(checkout: Path, demo: str, trials: int, steps: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    out = subprocess.run([sys.executable, "-c", CHILD.format(demo=demo, trials=trials, steps=steps)], env=env,
                         capture_output=True, text=True, timeout=900)
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(before: str, after: str | None = None, rounds: int = 2, trials: int = 3, steps: int = 20) -> None:
    sides = {"before": Path(before).resolve(), "after": Path(after or Path(__file__).resolve().parents[1]).resolve()}
    got: dict[tuple[str, str], list[dict]] = {}
    loads = []
    for r in range(rounds):
        for demo in DEMOS:
            for side in (("before", "after") if r % 2 == 0 else ("after", "before")):
                got.setdefault((side, demo), []).append(measure(sides[side], demo, trials, steps))
                loads.append(os.getloadavg()[0])
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores; load average {min(loads):.2f}-{max(loads):.2f} "
          f"(other work shares the cores); {rounds} rounds x {trials} trials x {steps} steps per side")
    print("| demo | before samples/s | after samples/s | after/before | before peak MB | after peak MB |")
    print("| --- | --- | --- | --- | --- | --- |")
    for demo in DEMOS:
        b, a = got[("before", demo)], got[("after", demo)]
        bs, as_ = statistics.median(x["sps"] for x in b), statistics.median(x["sps"] for x in a)
        bp, ap = statistics.median(x["peak"] for x in b) / 1e6, statistics.median(x["peak"] for x in a) / 1e6
        print(f"| {demo} | {bs:,.0f} | {as_:,.0f} | {as_ / bs:.2f} | {bp:,.1f} | {ap:,.1f} |")


if __name__ == "__main__":
    main(sys.argv[1], *(sys.argv[2:3] or [None]), *(int(a) for a in sys.argv[3:5]))
