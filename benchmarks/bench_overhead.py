"""Overhead of the workbench's measured step vs a bare hand-written loop on the same workload.

Paired rounds in ABBA order (workbench trial and bare loop, R times) so machine drift hits both
sides alike; the figure is the median over rounds of (workbench median step / bare median step).
Goal: <= 2% on a ~5 ms step.   Run: .venv/bin/python benchmarks/bench_overhead.py [rounds]
"""

import copy
import statistics
import sys
import time

import torch
from _workload import BATCH, make, optimizer
from torch.utils.data import DataLoader

import workbench as wb
from workbench.launch.runner import trial_thread

WARMUP, STEPS = 5, 30


def bare_loop(model: torch.nn.Module, data) -> list[float]:
    """The loop a user would write: same loader settings, same seeded order, per-step perf_counter."""
    model = copy.deepcopy(model)
    opt = optimizer(model.parameters())
    loss_fn = torch.nn.CrossEntropyLoss()
    loader = DataLoader(data, batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(0))
    it = iter(loader)
    times = []
    t = time.perf_counter()
    for i in range(WARMUP + STEPS):
        x, y = next(it)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        now = time.perf_counter()
        if i >= WARMUP:
            times.append(now - t)
        t = now
    return times


def main(rounds: int = 10) -> None:
    model, data = make()
    bench = wb.Workbench(model, data, loss_fn=torch.nn.CrossEntropyLoss(), optimizer=optimizer, log=None,
                         device="cpu", warmup_steps=WARMUP, steps=STEPS, knobs=wb.Knobs(batch_size=BATCH))
    ratios, wb_ms, bare_ms = [], [], []
    for i in range(rounds):
        # ABBA order (so neither side always runs second); the bare loop runs on the same
        # thread as the workbench's trials (same OpenMP pool)
        if i % 2:
            bare = statistics.median(trial_thread().submit(bare_loop, model, data).result())
            r = bench.run()
        else:
            r = bench.run()
            bare = statistics.median(trial_thread().submit(bare_loop, model, data).result())
        ratios.append(r.step_time_s / bare)
        wb_ms.append(r.step_time_s * 1e3)
        bare_ms.append(bare * 1e3)
    q = statistics.quantiles(ratios, n=4)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {rounds} paired rounds of {STEPS} steps")
    print(f"workbench median step {statistics.median(wb_ms):.2f} ms | bare loop {statistics.median(bare_ms):.2f} ms")
    print(f"overhead: {(statistics.median(ratios) - 1) * 100:+.2f}% (IQR of per-round ratios "
          f"{(q[0] - 1) * 100:+.2f}% … {(q[2] - 1) * 100:+.2f}%; goal <= +2%)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10)
