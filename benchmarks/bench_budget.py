"""Issue 35's held-out figures on this machine (not a test): early stops, seconds budgets, small budgets.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_budget.py [early] [cap] [small] [--reps N]

- `early`: the held-out CNN (benchmarks/_heldout.py) with a knob of this script's own that runs the
  forward 8 times (7 of them without autograd): the forward is about 8x slower. Baseline trial, then
  the slow trial (stop_early on, the default), then `compare(rounds="auto")`. Goal: the slow trial's
  wall time is at most 40% of 8x the baseline's, its note says it stopped early, compare says slower.
- `cap`: `tune(budget_s=40)` twice and `tune(budget_s=20)` on the held-out workload, each on a fresh
  workbench. Goal: wall time <= budget_s x 1.1 (+ one whole trial at most).
- `small`: `tune(n_trials=12)` on the jpeg demo (data-bound by design), `--reps` times. Goal: >= 1.3x
  (the issue's goal 1.6x).

Each line prints its wall seconds measured around the call; the machine heads the output.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import _heldout
import torch
from torch import nn

import workbench as wb
from workbench.core.measure import environment


class _Repeat(nn.Module):
    """The inner model's forward run `times` times; only the last one is kept for backward."""

    def __init__(self, inner: nn.Module, times: int) -> None:
        super().__init__()
        self.inner, self.times = inner, times

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            for _ in range(self.times - 1):
                self.inner(x)
        return self.inner(x)


@wb.knob(choices=[1, 8], help="run the forward this many times (a known slowdown; bench_budget.py)")
def forward_times(model, value):
    """Wrap the model so its forward runs `value` times."""
    return _Repeat(model, value) if value > 1 else model


def early() -> None:
    bench = _heldout.bench(steps=30, warmup_steps=3)
    t0 = time.perf_counter()
    base = bench.run(progress=False)
    base_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    slow = bench.run(progress=False, forward_times=8)
    slow_s = time.perf_counter() - t0
    c = bench.compare(base, slow, rounds="auto")
    stopped = slow.extra.get("stopped_early")
    print(f"baseline #{base.trial_id}: {base_s:.1f} s, {base.samples_per_s:.0f} samples/s")
    print(f"forward x8 #{slow.trial_id}: {slow_s:.1f} s ({slow_s / (8 * base_s):.0%} of 8x the baseline's wall), "
          f"status {slow.status}, stopped early: {stopped}")
    print(f"  notes: {slow.notes}")
    print(f"compare: {c.answer} {c.speedup:.3f} ({c.low:.3f} … {c.high:.3f}), {c.method}, {c.seconds or 0:.1f} s")


def cap() -> None:
    print("| budget_s | wall s | wall / budget | trials | best / start | answer | spent |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for budget_s in (40, 40, 20):
        bench = _heldout.bench()
        t0 = time.perf_counter()
        res = bench.tune(budget_s=budget_s, progress=False)
        wall = time.perf_counter() - t0
        sp = f"{res.speedup:.2f}x" if res.speedup else "n/a"
        print(f"| {budget_s} | {wall:.1f} | {wall / budget_s:.2f} | {res.trials_used} | {sp} | {res.answer} | "
              f"{res.spent} |", flush=True)


def small(reps: int) -> None:
    print("| run | wall s | trials | best knobs | best / start | answer |")
    print("| --- | --- | --- | --- | --- | --- |")
    for i in range(reps):
        bench = wb.demo("jpeg", log=None)
        t0 = time.perf_counter()
        res = bench.tune(n_trials=12, progress=False)
        wall = time.perf_counter() - t0
        changed = {k: new for k, (_old, new) in res.start.knobs.diff(res.best_knobs).items()}
        sp = f"{res.speedup:.2f}x" if res.speedup else "n/a"
        print(f"| {i + 1} | {wall:.1f} | {res.trials_used} | {changed} | {sp} | {res.answer} |", flush=True)


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("parts", nargs="*", default=["early", "cap", "small"], choices=["early", "cap", "small"])
    p.add_argument("--reps", type=int, default=2)
    args = p.parse_args(argv)
    env = environment(torch.device("cpu"))
    print(f"# {env['device_name']} · {env['usable_cores']} usable cores · torch {torch.__version__} · {torch.get_num_threads()} threads · "
          f"load {os.getloadavg()[0]:.1f} · {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
    for part in args.parts:
        print(f"\n## {part}", flush=True)
        {"early": early, "cap": cap, "small": lambda: small(args.reps)}[part]()
    print(f"\n# load {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main(sys.argv[1:])
