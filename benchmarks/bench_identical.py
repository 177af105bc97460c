"""The held-out check on real trials, and time to decision.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_identical.py [demo] [trials]
    PYTHONPATH=. .venv/bin/python benchmarks/bench_identical.py [demo] decide [reps] [knob=value ...]
    PYTHONPATH=. .venv/bin/python benchmarks/bench_identical.py [demo] auto [pairs]

The first form: N identical trials, their adjacent pairs and the table's verdict column (false
alarms), the noise in words, then `compare(a, b, rounds=2)` for identical knobs and for a change.

`decide`: time to decision, `reps` times. After: `compare(a, b, rounds="auto", max_rounds=8)` for
identical knobs (margin ±10%: does it say "same speed"?) and for the change (default
batch_size=40). Before: the procedure integer rounds offered, `compare(rounds=N)` with the N the
previous answer suggested, until beyond noise, no hint, or 8 rounds. Seconds, trials and answers.

`auto`: the held-out check of rounds="auto": `pairs` fresh pairs of identical knobs, each
`compare(a, b, rounds="auto", max_rounds=8, margin=0.10)`; how many say beyond noise, same speed.

Measures and prints; asserts nothing (a loaded machine makes the noise, and the verdicts, wider).
"""

from __future__ import annotations

import ast
import itertools
import os
import sys
import time

import workbench as wb


def held_out(bench: wb.Workbench, n: int) -> None:
    """N identical trials: adjacent pairs, the verdict column, the noise, rounds=2."""
    trials = [bench.run() for _ in range(n)]
    print("samples/s:", [round(r.samples_per_s or 0) for r in trials])
    pairs = [bench.compare(a, b) for a, b in itertools.pairwise(trials)]
    for c in pairs:
        print(" ", c)
    df = bench.results
    print(f"false alarms: adjacent pairs {sum(c.differs for c in pairs)} of {n - 1}; verdict column "
          f"{df['verdict'].isin(['faster', 'slower']).sum()} of {n - 1}")
    print("noise:", bench.noise)
    print("identical, rounds=2:", bench.compare(trials[0], trials[1], rounds=2))
    base, other = bench.run(cpu_threads=1), bench.run(batch_size=64, channels_last=True, cpu_threads=1)
    print("a change, rounds=2:", bench.compare(base, other, rounds=2))


def before(bench: wb.Workbench, change: dict, max_rounds: int = 8) -> tuple[str, int, float]:
    """Integer rounds as a user drove them: rounds=N as the last answer suggested, until decided."""
    t = time.perf_counter()
    a, b = bench.run(), bench.run(**change)
    sa, sb, done = [a], [b], 0
    c = bench.compare(a, b)
    while not c.differs and c.rounds_needed and done < max_rounds:
        n = min(c.rounds_needed, max_rounds - done)
        c = wb.results.compare(sa, sb, rounds=n, run=bench.run, log=bench.log)
        sa, sb = [bench.log.get(i) for i in c.a_trials], [bench.log.get(i) for i in c.b_trials]
        done += c.rounds
    word = c.answer
    return f"{word} {c.speedup:.2f}x", 2 + 2 * done, time.perf_counter() - t


def after(bench: wb.Workbench, change: dict, margin: float) -> tuple[str, int, float]:
    """compare(rounds="auto", max_rounds=8) from a fresh back-to-back pair."""
    t = time.perf_counter()
    a, b = bench.run(), bench.run(**change)
    c = bench.compare(a, b, rounds="auto", max_rounds=8, margin=margin)
    return f"{c.answer} {c.speedup:.2f}x ({c.low:.2f}…{c.high:.2f})", 2 + 2 * c.rounds, time.perf_counter() - t


def decide(bench: wb.Workbench, reps: int, change: dict) -> None:
    """Time to decision before (integer rounds) and after (rounds="auto")."""
    for rep in range(reps):
        for label, fn, ch, margin in (("after, identical, ±10%", after, {}, 0.10),
                                      (f"after, {change}", after, change, 0.05),
                                      (f"before, {change}", before, change, None),
                                      ("before, identical", before, {}, None)):
            load = os.getloadavg()[0]
            answer, trials, secs = fn(bench, ch, margin) if margin else fn(bench, ch)
            print(f"rep {rep + 1} {label}: {answer}; {trials} trials, {secs:.0f} s "
                  f"(load {load:.1f} → {os.getloadavg()[0]:.1f})", flush=True)
    print("noise:", bench.noise)


def identical_auto(bench: wb.Workbench, pairs: int) -> None:
    """Fresh pairs of identical knobs, each settled with rounds="auto" (margin ±10%)."""
    answers = []
    for i in range(pairs):
        load, t = os.getloadavg()[0], time.perf_counter()
        c = bench.compare(bench.run(), bench.run(), rounds="auto", max_rounds=8, margin=0.10)
        answers.append(c.answer)
        print(f"pair {i + 1}: {c.answer} {c.speedup:.2f}x ({c.low:.2f}…{c.high:.2f}), {c.rounds} rounds, "
              f"{time.perf_counter() - t:.0f} s (load {load:.1f} → {os.getloadavg()[0]:.1f})", flush=True)
    beyond = sum(a in ("faster", "slower") for a in answers)
    print(f"beyond noise {beyond} of {pairs}; same speed {answers.count('same')} of {pairs}")
    print("noise:", bench.noise)


def main() -> None:
    demo = sys.argv[1] if len(sys.argv) > 1 else "cnn"
    t, load = time.perf_counter(), os.getloadavg()[0]
    bench = wb.demo(demo, log=None)
    if len(sys.argv) > 2 and sys.argv[2] == "decide":
        reps = int(sys.argv[3]) if len(sys.argv) > 3 else 1
        pairs = [a.split("=", 1) for a in sys.argv[4:]]
        decide(bench, reps, {k: ast.literal_eval(v) for k, v in pairs} or {"batch_size": 40})
    elif len(sys.argv) > 2 and sys.argv[2] == "auto":
        identical_auto(bench, int(sys.argv[3]) if len(sys.argv) > 3 else 6)
    else:
        held_out(bench, int(sys.argv[2]) if len(sys.argv) > 2 else 8)
    print(f"load average {load:.2f} before, {os.getloadavg()[0]:.2f} after; {time.perf_counter() - t:.0f} s")


if __name__ == "__main__":
    main()
