"""Fixed cost per trial: everything in bench.run() except the warm-up steps and the measured window.

That is model copy, optimizer and loader construction, worker start-up and shutdown, logging
(fsync) and clean-up. The memory probe (one profiled warm-up step on CPU) is reported on its own.
Goals: <= 0.3 s without workers, <= 0.7 s with 2 workers.
Run: .venv/bin/python benchmarks/bench_fixed_cost.py [repeats]
"""

import statistics
import sys
import tempfile
import time

import torch
from _workload import BATCH, make, optimizer

import workbench as wb


def main(repeats: int = 8) -> None:
    model, data = make()
    with tempfile.TemporaryDirectory() as log:
        bench = wb.Workbench(model, data, loss_fn=torch.nn.CrossEntropyLoss(), optimizer=optimizer, log=log,
                             device="cpu", knobs=wb.Knobs(batch_size=BATCH))
        for workers in (0, 2):
            fixed, probe_extra = [], []
            for _ in range(repeats):
                t = time.perf_counter()
                r = bench.run(num_workers=workers)
                total = time.perf_counter() - t
                fixed.append(total - r.extra["warmup_wall_s"] - r.extra["wall_s"])
                probe_extra.append(r.extra["memory_probe_s"] - r.step_time_s)
            print(f"num_workers={workers}: fixed cost median {statistics.median(fixed):.3f} s "
                  f"(min {min(fixed):.3f}, max {max(fixed):.3f}); memory-probe step costs "
                  f"{statistics.median(probe_extra):.3f} s more than a plain step")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 8)
