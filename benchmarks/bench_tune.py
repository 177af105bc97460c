"""Tuning outcome on this machine (not a test): the tuner against an exhaustive sweep of the same space.

    TORCHINDUCTOR_CACHE_DIR=.inductor-cache .venv/bin/python benchmarks/bench_tune.py --sweep --twice \
        [--demos jpeg cnn heldout] [--axes workers prefetch layout batch] [--share 0.4] [--rounds 2] \
        [--steps 10 --warmup 3] [--size default]

With --sweep, every combination of the tuner's axes (benchmarks/_space.py, built from the tuner's
own `stage_axes`) runs once first; the tuner then gets `budget_s` = `--share` of the sweep's
seconds on a fresh workbench (its own log, so it learns nothing from the sweep). Goals (issue 18):
tuner/sweep best >= 0.95 (within noise or better) at <= 40% of the sweep's seconds; cnn >= 1.4x
over the defaults; two independent tune() runs within noise of each other. Every ratio is
`bench.compare(a, b, rounds=N)` on one workbench: both configurations re-measured in alternating
rounds, so no figure compares two different moments of machine load. `heldout` is
benchmarks/_heldout.py, a workload that is not a demo.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import _heldout
import pandas as pd
from _space import exhaustive_space

import workbench as wb
from workbench.core.measure import environment
from workbench.search.tune import STAGES, tune


def make(name: str, args: argparse.Namespace) -> Any:
    """A fresh workbench (its own log) on a demo or the held-out workload."""
    if name == "heldout":
        return _heldout.bench(steps=args.steps, warmup_steps=args.warmup)
    return wb.demo(name, size=args.size, log=None, steps=args.steps, warmup_steps=args.warmup)


def one(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Sweep, tune (twice), and the ratios in alternating rounds, for one workload."""
    bench = make(name, args)
    k0 = bench.defaults
    space_kw = {"stages": tuple(args.stages), "max_batch_size": args.max_batch_factor * k0.batch_size,
                "axes": tuple(args.axes) if args.axes else None}
    row: dict[str, Any] = {"workload": name, "load_before": os.getloadavg()[0]}
    budget_s = args.budget_s
    if args.sweep:
        space = exhaustive_space(bench, **space_kw)
        t = time.perf_counter()
        sweep = [bench.run(k) for k in space]
        row["sweep_s"] = time.perf_counter() - t
        top = max((r for r in sweep if r.ok and r.samples_per_s), key=lambda r: r.samples_per_s)
        row.update({"sweep_trials": len(space), "sweep_best": top.knobs.label(k0)})
        budget_s = budget_s or args.share * row["sweep_s"]
    runs = []
    for _ in range(2 if args.twice else 1):
        res = tune(make(name, args), budget_s=budget_s, **space_kw)
        print(res, "\n", flush=True)
        runs.append(res)
    res = runs[0]
    row.update({"budget_s": budget_s, "tune_s": res.seconds, "trials": res.trials_used, "answer": res.answer,
                "best": res.best_knobs.label(k0)})
    best = bench.run(res.best_knobs)
    if res.best_knobs != k0:
        c = bench.compare(bench.run(k0), best, rounds=args.rounds)
        row.update({"best/default": c.speedup, "vs default": c.verdict})
        print(f"best vs default: {c}", flush=True)
    if args.sweep:
        row["time share"] = res.seconds / row["sweep_s"]
        if top.knobs == res.best_knobs:  # two trials of one configuration: their ratio is noise, not a finding
            row.update({"tuner/sweep": 1.0, "vs sweep": "same knobs"})
        else:
            vs = bench.compare(top, best, rounds=args.rounds)
            row.update({"tuner/sweep": vs.speedup, "vs sweep": vs.verdict})
            print(f"tuner's best vs the sweep's best: {vs}", flush=True)
    if args.twice:
        second = runs[1]
        row["second best"] = second.best_knobs.label(k0)
        if second.best_knobs == res.best_knobs:
            row.update({"second/first": 1.0, "second vs first": "same knobs"})
        else:
            c2 = bench.compare(best, bench.run(second.best_knobs), rounds=args.rounds)
            row.update({"second/first": c2.speedup, "second vs first": c2.verdict})
            print(f"second tune vs first: {c2}", flush=True)
    row["load_after"] = os.getloadavg()[0]
    print(f"noise: {bench.noise}\n", flush=True)
    return row


def _rounds(text: str) -> int | str:
    return text if text == "auto" else int(text)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--size", default="default", choices=["tiny", "default"])
    p.add_argument("--demos", nargs="+", default=["jpeg", "cnn", "heldout"])
    p.add_argument("--stages", nargs="+", default=["data", "precision", "batch"], choices=STAGES)
    p.add_argument("--axes", nargs="*", default=None, help="keep only these axes (tuner and sweep alike)")
    p.add_argument("--max-batch-factor", type=int, default=2, help="largest batch = this x the default")
    p.add_argument("--sweep", action="store_true", help="run the exhaustive sweep first (sets budget_s)")
    p.add_argument("--share", type=float, default=0.4, help="the tuner's budget_s as a share of the sweep's seconds")
    p.add_argument("--budget-s", type=float, default=None, help="the tuner's budget in seconds (without --sweep)")
    p.add_argument("--twice", action="store_true", help="a second, independent tune() on a fresh workbench")
    p.add_argument("--rounds", type=_rounds, default=2,
                   help="alternating rounds behind every reported ratio, or 'auto' (until decided, at most 8)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args()
    if not args.sweep and args.budget_s is None:
        p.error("give --sweep (budget_s = --share of its seconds) or --budget-s")
    t_all = time.perf_counter()
    rows = [one(name, args) for name in args.demos]
    env = environment(make(args.demos[0], args).device)
    print(f"{env['device_name']}, {os.cpu_count()} cores, torch {env['torch']}; stages {args.stages}, axes {args.axes}, "
          f"steps {args.steps}+{args.warmup}, {args.rounds} rounds per ratio; {time.perf_counter() - t_all:.0f} s")
    with pd.option_context("display.width", 250, "display.max_colwidth", 70):
        print(pd.DataFrame(rows).T.to_string(float_format="{:.2f}".format))


if __name__ == "__main__":
    main()
