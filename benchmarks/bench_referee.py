"""The user's own loop as referee: workbench samples/s against the plain script `Knobs.to_code()`
writes, run as an ordinary `python` process (the user's real training run).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_referee.py [--rounds 3] [--size default] [--margin 0.10]

For each demo, every knob set runs once per round through `bench.run` and once as the generated
script, in alternating order (round 1: sets forward, workbench first; round 2: sets backward,
script first; ...), so slow drift hits both sides alike. Reported per knob set: the medians of
both figures, the workbench/script ratio (median over rounds of the per-round ratio), and each
side's speedup over the demo's defaults, and whether the evidence shows the workbench agreeing with
the script within ±10% (`--margin`; an equivalence test on the per-round ratios, see `agreement`),
differing, or cannot tell yet, in samples/s and in speedup; the workbench trials' kernel share of
CPU time (page faults, docs/measurement.md 'Page faults'); the machine, the load and the glibc malloc variables
the run had (the scripts inherit them). Goal: every ratio within ±10%. Measures, asserts nothing.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import workbench as wb
from workbench.core.codegen import script_warmup  # the trial's steady warm-up (issue 30)
from workbench.core.measure import environment
from workbench.results.stats import t_quantile

ROOT = Path(__file__).resolve().parents[1]
WARMUP, STEPS = 5, 30

# (demo, knob changes); the first set of each demo is its defaults (the speedup reference)
KNOB_SETS: list[tuple[str, dict]] = [
    ("jpeg", {}),
    ("jpeg", {"num_workers": 1, "persistent_workers": True}),
    ("jpeg", {"num_workers": 2, "persistent_workers": True, "cpu_threads": 1}),
    ("cnn", {}),
    ("cnn", {"channels_last": True}),
    ("cnn", {"batch_size": 64}),
    ("cnn", {"cpu_threads": 1}),
]

PREAMBLE = """\
# The demo's parts under the names the generated loop expects (built outside the timed window).
from workbench.demos import DEMOS

parts = DEMOS[{demo!r}].build({size!r})
model, dataset, loss_fn, make_optimizer = parts["model"], parts["data"], parts["loss_fn"], parts["optimizer"]

"""


def script_rate(demo: str, size: str, knobs: wb.Knobs, workdir: Path) -> float:
    """Run the generated loop as a plain `python` process; the samples/s it prints."""
    path = workdir / f"loop_{demo}.py"
    path.write_text(PREAMBLE.format(demo=demo, size=size) + knobs.to_code(steps=script_warmup(knobs, WARMUP) + STEPS,
                                                                              warmup=WARMUP))
    return run_script(path, knobs)


def run_script(path: Path, knobs: wb.Knobs) -> float:
    """Run a generated loop as its own `python` process (main thread, fresh allocator); its samples/s."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env, timeout=600)
    m = re.search(r"([\d.]+) samples/s", out.stdout)
    if out.returncode != 0 or m is None:
        raise RuntimeError(f"the generated loop failed for {knobs}:\n{out.stderr[-2000:]}")
    return float(m.group(1))


def agreement(w: list[float], s: list[float], margin: float = 0.10) -> tuple[str, str]:
    """Does the workbench read like the script? From the per-round log-ratios log(wb/script).

    (95% interval of wb/script, verdict): "agrees within ±10%" when the equivalence interval (two
    one-sided tests, 90%) lies inside ±margin; "differs" when the 95% interval excludes 1 by more
    than the margin allows; else "undecided" (more rounds would tell: per-trial noise here is 5-15%).
    """
    d = [math.log(a / b) for a, b in zip(w, s) if a > 0 and b > 0 and math.isfinite(a / b)]
    if len(d) < 2:
        return "n/a", "undecided (fewer than 2 rounds)"
    mean, se = statistics.fmean(d), statistics.stdev(d) / math.sqrt(len(d))
    half, half_same = t_quantile(0.975, len(d) - 1) * se, t_quantile(0.95, len(d) - 1) * se
    interval = f"{math.exp(mean - half):.2f}…{math.exp(mean + half):.2f}"
    if abs(mean) + half_same <= math.log1p(margin):
        return interval, f"agrees within ±{margin:.0%}"
    if abs(mean) - half > math.log1p(margin):
        return interval, f"differs by more than {margin:.0%}"
    return interval, "undecided"


def allocator_env() -> str:
    """The glibc malloc variables this process (and the scripts it starts) run with: they decide
    whether freed memory goes back to the OS and is faulted in again (docs/measurement.md 'Page faults')."""
    named = {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}
    return " ".join(f"{k}={v}" for k, v in sorted(named.items())) or "defaults"


def kernel_of(shares: list[float]) -> str:
    """' (kernel 3.1%)' for the last trial's kernel share of CPU time, '' when not measured."""
    return f" (kernel {shares[-1]:.1%})" if shares else ""


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--size", default="default", choices=["tiny", "default"])
    p.add_argument("--margin", type=float, default=0.10, help="the equivalence margin of the verdicts (0.10: ±10%%)")
    args = p.parse_args()
    load_before = os.getloadavg()
    t_start = time.perf_counter()
    benches = {d: wb.demo(d, size=args.size, log=None, steps=STEPS, warmup_steps=WARMUP) for d in dict(KNOB_SETS)}
    sets = [(d, benches[d].knobs(**ch)) for d, ch in KNOB_SETS]
    rates: dict[int, dict[str, list[float]]] = {i: {"wb": [], "script": []} for i in range(len(sets))}
    shares: dict[int, list[float]] = {i: [] for i in range(len(sets))}  # the wb trials' kernel share
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = list(range(len(sets)))
            if r % 2:
                order.reverse()
            for i in order:
                demo, knobs = sets[i]
                sides = ["wb", "script"] if r % 2 == 0 else ["script", "wb"]
                for side in sides:
                    if side == "wb":
                        res = benches[demo].run(knobs)
                        rates[i]["wb"].append(res.samples_per_s if res.ok else float("nan"))
                        if res.extra.get("kernel_share") is not None:
                            shares[i].append(res.extra["kernel_share"])
                    else:
                        rates[i]["script"].append(script_rate(demo, args.size, knobs, Path(tmp)))
                print(f"round {r + 1}, {demo} {knobs.label(benches[demo].defaults)}: "
                      f"workbench {rates[i]['wb'][-1]:,.1f}{kernel_of(shares[i])}, script {rates[i]['script'][-1]:,.1f} "
                      f"samples/s  (load {os.getloadavg()[0]:.2f})", flush=True)

    import pandas as pd

    rows = []
    ref: dict[str, int] = {}
    for i, (demo, knobs) in enumerate(sets):
        ref.setdefault(demo, i)
        w, s = rates[i]["wb"], rates[i]["script"]
        w0, s0 = rates[ref[demo]]["wb"], rates[ref[demo]]["script"]
        wb_speedup = statistics.median(w) / statistics.median(w0)
        sc_speedup = statistics.median(s) / statistics.median(s0)
        rows.append({
            "demo": demo, "knobs": knobs.label(benches[demo].defaults),
            "workbench samples/s": statistics.median(w), "script samples/s": statistics.median(s),
            "wb/script": statistics.median(a / b for a, b in zip(w, s)),
            "wb/script 95%": agreement(w, s, args.margin)[0], "verdict": agreement(w, s, args.margin)[1],
            "wb kernel": statistics.median(shares[i]) if shares[i] else float("nan"),
            "wb speedup": wb_speedup, "script speedup": sc_speedup, "speedup ratio": wb_speedup / sc_speedup,
            # the speedup round by round (each side over its own defaults in that round), wb against script
            "speedup verdict": ("reference" if i == ref[demo] else agreement(
                [b / a for a, b in zip(w0, w)], [b / a for a, b in zip(s0, s)], args.margin)[1]),
        })
    df = pd.DataFrame(rows)
    env = environment(benches["cnn"].device)
    print(f"\n{env['device_name']}, {os.cpu_count()} cores, torch {env['torch']}, Python {platform.python_version()}; "
          f"{args.rounds} rounds, {STEPS} timed steps after {WARMUP} warm-up, size {args.size}; "
          f"load average {load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after; "
          f"{time.perf_counter() - t_start:.0f} s; glibc malloc: {allocator_env()}")
    with pd.option_context("display.width", 200):
        print(df.to_string(index=False, float_format="{:.2f}".format))
    worst = max(abs(df["wb/script"] - 1).max(), abs(df["speedup ratio"] - 1).max())
    print(f"\nlargest deviation from the script: {worst:.1%} (goal: within {args.margin:.0%}); verdicts: "
          + ", ".join(f"{v} {n}" for v, n in df["verdict"].value_counts().items()))


if __name__ == "__main__":
    main()
