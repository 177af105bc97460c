"""Tuning outcome on this machine (not a test): tuner's best vs the default, and vs a full sweep.

    TORCHINDUCTOR_CACHE_DIR=.inductor-cache .venv/bin/python benchmarks/bench_tune.py \
        [--size tiny] [--budget 12] [--sweep] [--twice] [--demos jpeg cnn] [--rounds 3]

Goals: jpeg best/default >= 1.6x, cnn best/default >= 2.3x (on a CPU with bf16 units); the tuner
reaches >= 95% of the sweep's best throughput using <= 30% of its trials; two independent tune()
runs pick configurations within noise of each other. Every ratio is `bench.compare(a, b,
rounds=N)`: both configurations re-measured in alternating rounds and judged against the
between-trial noise, so no figure compares two different moments of machine load.
"""

from __future__ import annotations

import argparse
import os
import time

import pandas as pd
from _space import exhaustive_space

import workbench as wb
from workbench.measure import environment


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--size", default="default", choices=["tiny", "default"])
    p.add_argument("--budget", type=int, default=12)
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds behind every reported ratio")
    p.add_argument("--demos", nargs="+", default=["jpeg", "cnn"])
    p.add_argument("--sweep", action="store_true", help="also run the exhaustive sweep (slow)")
    p.add_argument("--twice", action="store_true", help="a second, independent tune() on a fresh workbench")
    p.add_argument("--compile", action="store_true", help="include the compile stage (cold compiles are slow)")
    args = p.parse_args()
    stages = ("data", "precision", "compile", "batch") if args.compile else ("data", "precision", "batch")
    goals = {"jpeg": 1.6, "cnn": 2.3}
    load_before, t_all = os.getloadavg(), time.perf_counter()
    rows = []
    for name in args.demos:
        bench = wb.demo(name, size=args.size, log=None)
        t = time.perf_counter()
        res = bench.tune(budget=args.budget, stages=stages)
        print(res, "\n", flush=True)
        row = {"demo": name, "best": res.best_knobs.label(bench.defaults), "trials": res.trials_used,
               "tune_s": time.perf_counter() - t}
        row["goal"] = goals.get(name)
        if res.best_knobs == bench.defaults:
            row.update({"best/default": 1.0, "verdict": "no change kept"})
        else:
            start = res.start if res.start.knobs == bench.defaults else bench.run(bench.defaults)
            c = bench.compare(start, res.best, rounds=args.rounds)
            row.update({"best/default": c.speedup, "verdict": c.verdict})
            print(f"best vs default: {c}", flush=True)
        if args.twice:
            other = wb.demo(name, size=args.size, log=None)
            res2 = other.tune(budget=args.budget, stages=stages)
            row["second best"] = res2.best_knobs.label(bench.defaults)
            if res2.best_knobs == res.best_knobs:
                row.update({"second/first": 1.0, "second vs first": "same knobs"})
            else:
                second = bench.run(res2.best_knobs)  # measured on the first bench, beside the first best
                c2 = bench.compare(res.best, second, rounds=args.rounds)
                row.update({"second/first": c2.speedup, "second vs first": c2.verdict})
                print(f"second tune vs first: {c2}", flush=True)
        if args.sweep:
            k0 = bench.defaults
            space = exhaustive_space(bench, batch_sizes=(k0.batch_size, 2 * k0.batch_size),
                                     stages=tuple(s for s in stages if s != "batch"))
            t = time.perf_counter()
            sweep = [bench.run(k) for k in space]
            top = max((r for r in sweep if r.ok), key=lambda r: r.samples_per_s)
            vs = bench.compare(top, res.best, rounds=args.rounds)
            row.update({"sweep_trials": len(space), "sweep_s": time.perf_counter() - t,
                        "sweep_best": top.knobs.label(k0), "tuner/sweep_best": vs.speedup,
                        "tuner vs sweep": vs.verdict, "trial_share": res.trials_used / len(space)})
            print(f"tuner's best vs the sweep's best: {vs}", flush=True)
        print(f"noise: {bench.noise}\n", flush=True)
        rows.append(row)
    env = environment(wb.demo(args.demos[0], size="tiny", log=None).device)
    print(f"{env['device_name']}, {os.cpu_count()} cores, torch {env['torch']}; budget {args.budget}, "
          f"{args.rounds} rounds per ratio, size {args.size}; load average {load_before[0]:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after; {time.perf_counter() - t_all:.0f} s")
    with pd.option_context("display.width", 250, "display.max_colwidth", 70):
        print(pd.DataFrame(rows).to_string(index=False, float_format="{:.2f}".format))


if __name__ == "__main__":
    main()
