"""Why a trial on a second thread of the kernel read less than the same loop in a script: OpenMP teams.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_openmp_teams.py [--repeats 3] [--steps 60]

Each case runs in a fresh process (the state under test lives for a process's life): a small MLP
training loop (AdamW, batch 32, many small ops) timed on the main thread
  fresh            nothing else ran torch
  second team      a second thread ran torch ops first (GNU OpenMP gave it a team of its own)
  second, 1 thread that thread ran them with torch.set_num_threads(1) (no team: no extra OpenMP workers)
  passive          OMP_WAIT_POLICY=passive, nothing else ran torch (idle workers never spin)
If the second team's slowdown comes from libgomp managing more threads than there are CPUs (it then
spins only briefly before a worker sleeps, and every parallel region pays a wake-up), "second, 1
thread" reads like "fresh" and "passive" like "second team". Measures, asserts nothing.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys

CHILD = """
import sys, threading, time, torch
case, steps = sys.argv[1], int(sys.argv[2])
def other(n):
    if n:
        torch.set_num_threads(n)
    a = torch.randn(256, 256)
    for _ in range(50):
        a = torch.tanh(a @ a)
if case in ("second team", "second, 1 thread"):
    t = threading.Thread(target=other, args=(1 if case == "second, 1 thread" else 0,))
    t.start(); t.join()
torch.manual_seed(0)
model = torch.nn.Sequential(*[m for _ in range(6) for m in (torch.nn.Linear(128, 128), torch.nn.LayerNorm(128), torch.nn.GELU())])
opt = torch.optim.AdamW(model.parameters())
x, y = torch.randn(32, 128), torch.randn(32, 128)
def step():
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
for _ in range(10):
    step()
t0 = time.perf_counter()
for _ in range(steps):
    step()
print(32 * steps / (time.perf_counter() - t0))
"""
CASES = ("fresh", "second team", "second, 1 thread", "passive")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=60)
    args = p.parse_args()
    load0 = os.getloadavg()[0]
    rates: dict[str, list[float]] = {c: [] for c in CASES}
    for r in range(args.repeats):
        for case in CASES[:: 1 if r % 2 == 0 else -1]:
            env = {**os.environ}
            if case == "passive":
                env["OMP_WAIT_POLICY"] = "passive"
            out = subprocess.run([sys.executable, "-c", CHILD, case, str(args.steps)], capture_output=True,
                                 text=True, env=env, timeout=600, check=True)
            rates[case].append(float(out.stdout.strip()))
    import torch

    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, torch {torch.__version__} ({torch.get_num_threads()} threads); {args.repeats} "
          f"fresh processes a case, {args.steps} steps; load {load0:.2f} before, {os.getloadavg()[0]:.2f} after")
    base = statistics.median(rates["fresh"])
    for case in CASES:
        lo, hi = min(rates[case]), max(rates[case])
        print(f"  {case:<17} {statistics.median(rates[case]):>8,.0f} samples/s ({lo:,.0f}-{hi:,.0f})  "
              f"{statistics.median(rates[case]) / base:.2f}x fresh")


if __name__ == "__main__":
    main()
