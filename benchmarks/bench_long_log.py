"""A long log: open, results, one more trial, and the panel's trial end -> chart point, by log size.

Builds a log of N trials of the mlp-memory demo (one real trial, then N records varied from it:
batch sizes, workers, AMP, repeats), then, on that log:
  open        Workbench(...) on the log (the demo's model build and probe included), and the
              ResultLog alone
  results     `bench.results` right after opening (the first table), then after one more trial
  one more    `bench.run()` of the tiny demo (3 measured steps) appended to the long log
  chart       building the panel's chart from `bench.results` (the default view)
  end->chart  headless panel: from the log append to the JupyterChart's spec holding the point

Goals (issue 24, at 10,000 trials): results after one more trial <= 0.3 s, chart <= 0.3 s,
open <= 2 s. Run: .venv/bin/python benchmarks/bench_long_log.py [N ...]   (default 100 1000 10000 50000)
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import workbench as wb
from workbench.faces.charts import comparison_chart
from workbench.results.log import ResultLog, _clean

VARIANTS = [{}, {"batch_size": 16}, {"batch_size": 64}, {"num_workers": 1}, {"amp": "bf16"}, {"cpu_threads": 1},
            {"batch_size": 16, "cpu_threads": 1}, {"checkpoint": []}]


def make_log(path: Path, n: int, template: wb.TrialResult) -> None:
    """N records varied from one real trial: eight configurations, each repeated, rates spread 5%."""
    rec = _clean(template.to_record())
    with open(path, "w") as f:
        for i in range(n):
            knobs = template.knobs.replace(**VARIANTS[i % len(VARIANTS)])
            r = {**rec, **knobs.to_dict(), "checkpoint": list(knobs.checkpoint), "trial_id": i + 1,
                 "samples_per_s": rec["samples_per_s"] * (1 + 0.05 * ((i * 7919) % 101 - 50) / 50)}
            f.write(json.dumps(r) + "\n")


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def measure(n: int, template: wb.TrialResult, folder: Path) -> dict[str, float]:
    from workbench.faces.panel import Panel

    path = folder / f"long-{n}.jsonl"
    make_log(path, n, template)
    row: dict[str, float] = {}
    row["open_log"], _ = timed(lambda: ResultLog(path))
    row["open"], bench = timed(lambda: wb.demo("mlp-memory", size="tiny", log=path, steps=3, warmup_steps=1))
    row["results_first"], _ = timed(lambda: bench.results)
    row["one_more"], _ = timed(lambda: bench.run(progress=False))
    row["results"], df = timed(lambda: bench.results)
    row["chart"], _ = timed(lambda: comparison_chart(df))
    panel = Panel(bench)
    marks: dict[str, float] = {}
    panel.chart.observe(lambda c: marks.setdefault("charted", time.perf_counter()), names=["spec", "chart"])
    last = bench.trials[-1]
    t0 = time.perf_counter()
    bench.log.append(dataclasses.replace(last, knobs=last.knobs.replace(batch_size=24)))
    row["end_to_chart"] = marks["charted"] - t0
    panel.close()
    return row


def main(sizes: list[int]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        seed = wb.demo("mlp-memory", size="tiny", log=None, steps=3, warmup_steps=1)
        template = seed.run(progress=False)
        print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
              f"python {platform.python_version()}; load average at start {os.getloadavg()[0]:.2f}")
        print("| trials | open Workbench | open log only | first results | one more trial | results after it "
              "| panel chart build | trial end -> chart point | load |")
        print("|---|---|---|---|---|---|---|---|---|")
        for n in sizes:
            r = measure(n, template, folder)
            print(f"| {n:,} | {r['open']:.2f} s | {r['open_log']:.2f} s | {r['results_first']:.2f} s | "
                  f"{r['one_more']:.2f} s | {r['results']:.3f} s | {r['chart']:.3f} s | {r['end_to_chart']:.3f} s "
                  f"| {os.getloadavg()[0]:.1f} |", flush=True)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [100, 1000, 10000, 50000])
