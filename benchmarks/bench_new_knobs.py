"""Measured effects of the knobs added with the knob registry, on the demos (CPU here).

- optimizer_impl on the transformer demo (AdamW): as-given vs foreach vs fused, samples/s.
- checkpoint_mode on the mlp-memory demo with every block checkpointed: full vs selective, peak
  memory and samples/s (selective keeps matmul outputs: more memory than full, less recompute).
Configurations alternate in rounds (A B C, C B A, ...) so drift hits all of them.
Run: .venv/bin/python benchmarks/bench_new_knobs.py [rounds] [steps]
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import warnings

import torch

import workbench as wb


def sweep(bench: wb.Workbench, configs: dict[str, dict], rounds: int) -> dict[str, list[wb.TrialResult]]:
    out: dict[str, list[wb.TrialResult]] = {name: [] for name in configs}
    names = list(configs)
    bench.run()  # one-off costs of the first trial
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            res = bench.run(**configs[name])
            assert res.ok, res.message
            out[name].append(res)
    return out


def main(rounds: int = 3, steps: int = 20) -> None:
    warnings.simplefilter("ignore")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}; "
          f"load average {os.getloadavg()[0]:.2f} at start (other work shares the cores)")
    tf = wb.demo("transformer", log=None, steps=steps, warmup_steps=3)
    got = sweep(tf, {"as-given": {}, "foreach": {"optimizer_impl": "foreach"}, "fused": {"optimizer_impl": "fused"}},
                rounds)
    base = statistics.median(r.samples_per_s for r in got["as-given"])
    print(f"transformer, AdamW ({rounds} rounds x {steps} steps):")
    for name, rs in got.items():
        sps = statistics.median(r.samples_per_s for r in rs)
        print(f"  optimizer_impl={name!r:<11} {sps:,.0f} samples/s  ({sps / base:.2f}x as-given)")
    mlp = wb.demo("mlp-memory", log=None, steps=steps, warmup_steps=3)
    blocks = tuple(mlp.blocks)
    got = sweep(mlp, {"none": {}, "full": {"checkpoint": blocks},
                      "selective": {"checkpoint": blocks, "checkpoint_mode": "selective"}}, rounds)
    print(f"mlp-memory, checkpoint={len(blocks)} blocks ({rounds} rounds x {steps} steps):")
    base = statistics.median(r.samples_per_s for r in got["none"])
    for name, rs in got.items():
        sps = statistics.median(r.samples_per_s for r in rs)
        peak = statistics.median(r.peak_memory_bytes for r in rs) / 1e6
        print(f"  {name:<10} peak {peak:,.1f} MB  {sps:,.0f} samples/s  ({sps / base:.2f}x no checkpointing)")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
