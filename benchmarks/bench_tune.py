"""Tuning outcome on this machine (not a test): tuner's best vs the default, and vs a full sweep.

    TORCHINDUCTOR_CACHE_DIR=.inductor-cache .venv/bin/python benchmarks/bench_tune.py [--size tiny] [--sweep]

Goals: jpeg best/default >= 1.6x, cnn best/default >= 2.3x; the tuner reaches >= 95% of the sweep's
best throughput using <= 30% of its trials. The best and the default are re-measured back to back
(alternating, 3 pairs) so the ratio is not a comparison of two different moments of machine load.
"""

from __future__ import annotations

import argparse
import statistics
import time

from _space import exhaustive_space

import workbench as wb


def paired_ratio(bench: wb.Workbench, best: wb.Knobs, default: wb.Knobs, pairs: int = 3) -> float:
    """Median over alternating pairs of best/default samples per second."""
    ratios = []
    for _ in range(pairs):
        d = bench.run(default)
        b = bench.run(best)
        if d.ok and b.ok:
            ratios.append(b.samples_per_s / d.samples_per_s)
    return statistics.median(ratios) if ratios else float("nan")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--size", default="default", choices=["tiny", "default"])
    p.add_argument("--budget", type=int, default=12)
    p.add_argument("--sweep", action="store_true", help="also run the exhaustive sweep (slow)")
    p.add_argument("--compile", action="store_true", help="include the compile stage (cold compiles are slow)")
    args = p.parse_args()
    stages = ("data", "precision", "compile", "batch") if args.compile else ("data", "precision", "batch")
    rows = []
    for name, goal in (("jpeg", 1.6), ("cnn", 2.3)):
        bench = wb.demo(name, size=args.size, log=None)
        t = time.perf_counter()
        res = bench.tune(budget=args.budget, stages=stages)
        tune_s = time.perf_counter() - t
        ratio = paired_ratio(bench, res.best_knobs, bench.defaults)
        row = {"demo": name, "best": str(res.best_knobs), "trials": res.trials_used, "tune_s": tune_s,
               "best/default": ratio, "goal": goal}
        if args.sweep:
            k0 = bench.defaults
            space = exhaustive_space(bench, batch_sizes=(k0.batch_size, 2 * k0.batch_size),
                                     stages=tuple(s for s in stages if s != "batch"))
            sweep = [bench.run(k) for k in space]
            top = max((r for r in sweep if r.ok), key=lambda r: r.samples_per_s)
            vs = paired_ratio(bench, res.best_knobs, top.knobs)
            row.update({"sweep_trials": len(space), "tuner/sweep_best": vs,
                        "trial_share": res.trials_used / len(space), "sweep_best": str(top.knobs)})
        rows.append(row)
        print(res)
        print()
    import pandas as pd

    with pd.option_context("display.width", 200, "display.max_colwidth", 80):
        print(pd.DataFrame(rows).to_string(index=False, float_format="{:.2f}".format))


if __name__ == "__main__":
    main()
