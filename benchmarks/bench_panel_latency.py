"""Panel latency: widget change -> trial running, and trial end -> chart point.

Headless (ipywidgets models without a browser), on a tiny model with 3 measured steps, so the
figures are the panel's own overheads, not the trial:
  change -> running : from setting a control's value to the trial thread building the model
                      (the debounce, the queue's thread, bench.run's hand-off to the trial thread)
  end -> chart      : from run_trial returning to the JupyterChart holding the point (its spec updated)
                      (logging + fsync, the results frame, the altair chart)
Goal: each <= 0.5 s. Run: .venv/bin/python benchmarks/bench_panel_latency.py [repeats]
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import tempfile
import time

import torch
from torch import nn
from torch.utils.data import TensorDataset

import workbench as wb
import workbench.faces.bench as bench_module
from workbench.faces.panel import Panel


def main(repeats: int = 6) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
    data = TensorDataset(torch.randn(256, 8), torch.randint(0, 3, (256,)))
    marks: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as log:
        bench = wb.Workbench(model, data, loss_fn=nn.CrossEntropyLoss(), optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
                             log=log, steps=3, warmup_steps=1, knobs=wb.Knobs(batch_size=8))
        fresh = bench.workload.fresh_model
        bench.workload.fresh_model = lambda: (marks.setdefault("running", time.perf_counter()), fresh())[1]
        run_trial = bench_module.run_trial

        def timed_run_trial(*args, **kwargs):
            try:
                return run_trial(*args, **kwargs)
            finally:
                marks["ended"] = time.perf_counter()

        bench_module.run_trial = timed_run_trial
        panel = Panel(bench)
        # a new chart (first trial) or a data update (the spec gets the new rows)
        panel.chart.observe(lambda change: marks.setdefault("charted", time.perf_counter()), names=["chart", "spec"])
        to_running, to_chart = [], []
        try:
            for i in range(repeats):
                marks.clear()
                t0 = time.perf_counter()
                panel.controls["batch_size"].value = 8 + 2 * (i + 1)  # a new configuration each time
                assert panel.wait(120)
                to_running.append(marks["running"] - t0)
                to_chart.append(marks["charted"] - marks["ended"])
        finally:
            panel.close()
            bench_module.run_trial = run_trial
    load = os.getloadavg()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}; "
          f"load average {load[0]:.2f} (other work shares the cores)")
    print(f"debounce {panel.queue.debounce_s:.2f} s, {repeats} changes")
    for name, xs in (("widget change -> trial running", to_running), ("trial end -> chart point", to_chart)):
        print(f"{name}: median {statistics.median(xs):.3f} s (min {min(xs):.3f}, max {max(xs):.3f})")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 6)
