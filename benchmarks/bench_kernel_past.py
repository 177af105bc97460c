"""A trial's figure before and after the kernel's own torch work: another workbench's `diagnose()`.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_kernel_past.py [--trials 3] [--sides worker kernel]

Per side (`trials_in="worker"`, the default, and `"kernel"`), in this one process: a ViT workbench
(bench_script_truth.py's, batch 32) runs `--trials` trials; a Llama workbench is made and diagnosed
(its analyses run where its trials run); the ViT workbench runs `--trials` more. Reported: each
side's median samples/s before and after, after/before, and how long the ViT workbench took from
`Workbench(...)` to its first trial's result (the worker's start-up included). The kernel side runs
first, so the worker side's "before" already follows it. Measures, asserts nothing.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_script_truth import openmp_runtime, parts

import workbench as wb


def bench_of(arch: str, side: str) -> wb.Workbench:
    model, data, loss_fn, opt = parts(arch)
    return wb.Workbench(model, data, loss_fn=loss_fn, optimizer=opt, log=None, name=arch, device="cpu",
                        trials_in=side, knobs=wb.Knobs(batch_size=32))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--sides", nargs="+", default=["kernel", "worker"], choices=["worker", "kernel"])
    args = p.parse_args()
    load0 = os.getloadavg()[0]
    rows = []
    for side in args.sides:
        t0 = time.perf_counter()
        vit = bench_of("vit", side)
        first = vit.run(progress=False)
        first_s = time.perf_counter() - t0
        before = [first.samples_per_s] + [vit.run(progress=False).samples_per_s for _ in range(args.trials - 1)]
        other = bench_of("llama", side)
        other.diagnose(progress=False)
        after = [vit.run(progress=False).samples_per_s for _ in range(args.trials)]
        start = (first.extra.get("worker_startup") or {}).get("ready_s")
        rows.append((side, statistics.median(before), statistics.median(after), first_s, start, before, after))
        for b in (vit, other):
            if b._worker is not None:
                b._worker.close()
        print(f"{side}: before {[round(x) for x in before]}, after {[round(x) for x in after]} samples/s "
              f"(load {os.getloadavg()[0]:.2f})", flush=True)
    print(f"\n{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; {os.cpu_count()} CPUs, torch "
          f"{torch.__version__} ({torch.get_num_threads()} threads, OpenMP {openmp_runtime()}); {args.trials} trials "
          f"each way; load {load0:.2f} before, {os.getloadavg()[0]:.2f} after")
    print("| trials in | before (samples/s) | after another workbench's diagnose() | after / before | "
          "Workbench() to first result | worker ready |")
    print("| --- | --- | --- | --- | --- | --- |")
    for side, b, a, first_s, start, _, _ in rows:
        ready = f"{start:.1f} s" if start is not None else "-"
        print(f"| {side} | {b:,.0f} | {a:,.0f} | {a / b:.2f} | {first_s:.1f} s | {ready} |")


if __name__ == "__main__":
    main()
