"""Steady state or not (issue 30): on a data-bound pipeline, does a 30-step trial read what the
pipeline delivers, or the loader's buffer? And what does the steady warm-up cost on the demos?

    PYTHONPATH=. .venv/bin/python benchmarks/bench_steady.py [--sleep-ms 1.5] [--batch 16]
        [--rounds 2] [--demo-size default] [--skip-demos] [--skip-data]

Part 1, before/after: a Dataset whose __getitem__ sleeps `--sleep-ms` per sample (a deterministic
truth: n workers deliver at most n / sleep samples/s, however busy the CPU). For each loader
configuration, a fresh process runs the first 30-step trial (the first compiled trial for the
compile row), a second trial, and a long run (150 steps after 40 fixed warm-up steps: the steady
state), once with the old fixed 5-step warm-up (WORKBENCH_FIXED_WARMUP=1) and once with the
steady rule. Printed: samples/s, trial / long-run ratio, trial / workers' limit, whether the trial
was flagged not steady, and the warm-up steps the rule took. Goal: every trial within ±10% of its
long run and never above 1.05x the limit.

Part 2, cost: each demo's default knobs, fixed vs steady warm-up alternating for `--rounds`, in
one process: trial wall time and warm-up seconds. Goal: trial wall time grows <= 20%.
Measures, asserts nothing; the machine's load is printed (figures under load are noisy).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil
import torch
from torch.utils.data import Dataset

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {
    "2 workers x prefetch 2": dict(num_workers=2, prefetch_factor=2),
    "2 workers x prefetch 8": dict(num_workers=2, prefetch_factor=8),
    "4 workers x prefetch 4": dict(num_workers=4, prefetch_factor=4),
    "4 workers x prefetch 8": dict(num_workers=4, prefetch_factor=8),
    "2 x 8, compile (first compiled trial)": dict(num_workers=2, prefetch_factor=8, compile="default"),
}
DEMOS = ("cnn", "jpeg", "transformer", "mlp-memory")


class SleepData(Dataset):
    """Each sample waits `sleep_s` (a sleep: no CPU), like a small file on a network disk."""

    def __init__(self, n: int, sleep_s: float) -> None:
        g = torch.Generator().manual_seed(2)
        self.x, self.y, self.sleep_s = torch.randn(n, 8, generator=g), torch.randint(0, 4, (n,), generator=g), sleep_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        time.sleep(self.sleep_s)
        return self.x[i], self.y[i]


def one(config: str, sleep_s: float, batch: int) -> dict:
    """In this (fresh) process: first trial, second trial, long run of one configuration."""
    import workbench as wb

    model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))
    bench = wb.Workbench(model, SleepData(8192, sleep_s), loss_fn=torch.nn.CrossEntropyLoss(), log=None,
                         device="cpu", optimizer=lambda p: torch.optim.SGD(p, lr=0.05), steps=30, warmup_steps=5,
                         knobs=wb.Knobs(batch_size=batch, cpu_threads=1))
    knobs = CONFIGS[config]
    out = {}
    for name in ("first", "second"):
        t0 = time.perf_counter()
        r = bench.run(**knobs)
        out[name] = dict(rate=r.samples_per_s, ok=r.ok, message=r.message, wall_s=time.perf_counter() - t0,
                         steady=r.extra.get("steady"), warmup=r.extra.get("warmup_rule", {}).get("steps"),
                         limit=r.extra.get("loader_limit_samples_per_s"))
    os.environ["WORKBENCH_FIXED_WARMUP"] = "1"
    bench.steps, bench.warmup_steps = 150, 40
    out["long"] = dict(rate=bench.run(**knobs).samples_per_s)
    return out


def data_table(sleep_s: float, batch: int) -> None:
    print(f"\n## Data-bound pipeline: {sleep_s * 1e3:g} ms per sample, batch {batch}, 30-step trials, "
          "each row a fresh process\n")
    print("| configuration | warm-up | first trial | second | long run | first/long | first/limit | flagged | "
          "warm-up steps |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for config, knobs in CONFIGS.items():
        limit = knobs["num_workers"] / sleep_s
        for mode in ("fixed", "steady"):
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            env.pop("WORKBENCH_FIXED_WARMUP", None)
            if mode == "fixed":
                env["WORKBENCH_FIXED_WARMUP"] = "1"
            cmd = [sys.executable, __file__, "--one", config, "--sleep-ms", str(sleep_s * 1e3), "--batch", str(batch)]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
            if done.returncode:
                print(f"| {config} | {mode} | failed: {done.stderr.strip().splitlines()[-1:]} |")
                continue
            r = json.loads(done.stdout.strip().splitlines()[-1])
            first, second, long = r["first"], r["second"], r["long"]
            print(f"| {config} | {mode} | {first['rate']:,.0f}/s | {second['rate']:,.0f}/s | {long['rate']:,.0f}/s | "
                  f"{first['rate'] / long['rate']:.2f} | {first['rate'] / limit:.2f} | "
                  f"{'not steady' if first['steady'] is False else '-'} | {first['warmup']} |", flush=True)


def demo_cost(size: str, rounds: int) -> None:
    import workbench as wb

    print(f"\n## Cost on the demos ({size} size, default knobs, {rounds} rounds alternating fixed / steady)\n")
    print("| demo | fixed: trial wall s | steady: trial wall s | growth | fixed warm-up s | steady warm-up s | "
          "steady warm-up steps |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    total = {"fixed": 0.0, "steady": 0.0}
    for name in DEMOS:
        bench = wb.demo(name, size=size, log=None)
        seen: dict[str, list] = {"fixed": [], "steady": []}
        for i in range(rounds):
            for mode in (("fixed", "steady") if i % 2 == 0 else ("steady", "fixed")):
                if mode == "fixed":
                    os.environ["WORKBENCH_FIXED_WARMUP"] = "1"
                else:
                    os.environ.pop("WORKBENCH_FIXED_WARMUP", None)
                t0 = time.perf_counter()
                r = bench.run()
                seen[mode].append((time.perf_counter() - t0, r.extra.get("warmup_wall_s", 0.0),
                                   r.extra.get("warmup_rule", {}).get("steps")))
        os.environ.pop("WORKBENCH_FIXED_WARMUP", None)
        med = {m: statistics.median(w for w, _, _ in v) for m, v in seen.items()}
        warm = {m: statistics.median(s for _, s, _ in v) for m, v in seen.items()}
        total["fixed"] += med["fixed"]
        total["steady"] += med["steady"]
        print(f"| {name} | {med['fixed']:.2f} | {med['steady']:.2f} | {med['steady'] / med['fixed'] - 1:+.0%} | "
              f"{warm['fixed']:.2f} | {warm['steady']:.2f} | {[s for _, _, s in seen['steady']]} |", flush=True)
    print(f"| all four | {total['fixed']:.2f} | {total['steady']:.2f} | {total['steady'] / total['fixed'] - 1:+.0%} "
          "| | | |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sleep-ms", type=float, default=1.5)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--demo-size", default="default")
    p.add_argument("--skip-demos", action="store_true")
    p.add_argument("--skip-data", action="store_true")
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.sleep_ms / 1e3, args.batch)))
        return
    load = psutil.getloadavg()
    print(f"# bench_steady: torch {torch.__version__}, {os.cpu_count()} cores, load average {load[0]:.2f} "
          f"(other processes share this machine: figures are noisy)")
    if not args.skip_data:
        data_table(args.sleep_ms / 1e3, args.batch)
    if not args.skip_demos:
        demo_cost(args.demo_size, args.rounds)
    print(f"\nload average at the end: {psutil.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
