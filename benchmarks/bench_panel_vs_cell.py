"""Panel-started vs cell-started trials of the same knobs: does running from the panel cost speed?

Both go through bench.run on the one trial thread; the panel adds its queue thread and a progress
Poller. 10 pairs, alternating which goes first (A B, B A, ...), on the shared benchmark workload.
Figure: median samples/s of panel trials / median of cell trials. Goal: within 3% of 1.00.
Run: .venv/bin/python benchmarks/bench_panel_vs_cell.py [pairs] [steps]
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import tempfile

import torch
from _workload import BATCH, make, optimizer

import workbench as wb
from workbench.faces.panel import Panel


def main(pairs: int = 10, steps: int = 20) -> None:
    model, data = make()
    with tempfile.TemporaryDirectory() as log:
        bench = wb.Workbench(model, data, loss_fn=torch.nn.CrossEntropyLoss(), optimizer=optimizer, log=log,
                             device="cpu", steps=steps, warmup_steps=3, knobs=wb.Knobs(batch_size=BATCH))
        knobs = bench.defaults
        bench.run(knobs)  # first trial in the process pays one-off costs; not counted
        panel = Panel(bench, debounce_s=0.0)
        cell, from_panel = [], []
        loads = []
        try:
            for i in range(pairs):
                order = ("panel", "cell") if i % 2 == 0 else ("cell", "panel")
                for who in order:
                    if who == "cell":
                        r = bench.run(knobs)
                        cell.append(r.samples_per_s)
                    else:
                        panel.submit(knobs, force=True, debounce=False)
                        assert panel.wait(600)
                        r = bench.trials[-1]
                        from_panel.append(r.samples_per_s)
                    assert r.ok, r.message
                loads.append(os.getloadavg()[0])
        finally:
            panel.close()
    ratio = statistics.median(from_panel) / statistics.median(cell)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}; "
          f"load average during the run {min(loads):.2f}-{max(loads):.2f} (other work shares the cores)")
    print(f"{pairs} pairs x {steps} measured steps, batch {BATCH}")
    print(f"cell : median {statistics.median(cell):,.0f} samples/s (min {min(cell):,.0f}, max {max(cell):,.0f})")
    print(f"panel: median {statistics.median(from_panel):,.0f} samples/s "
          f"(min {min(from_panel):,.0f}, max {max(from_panel):,.0f})")
    print(f"panel / cell = {ratio:.3f} (goal: within 3% of 1.00)")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
