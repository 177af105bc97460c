"""False-alarm rate and power of `compare` on the synthetic trials of tests/test_stats.py, with
more simulations than the tests run (the tests assert the bounds; this prints the figures).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_calibration.py [sessions]

Patterns: "jitter" (AR(1) step jitter + a per-trial level shift of up to ±10%), "bursty" (the
same plus a data pipeline that delivers batches in bursts), "walk" (jitter plus a random-walk
drift of the machine's level, 3% sd per trial) and "steps" (jitter plus sudden 5-15% level steps).
Part 1: one-look `compare` and integer `rounds=N` (jitter, bursty). Part 2: `rounds="auto"`,
max_rounds=8, a look after every round (all four patterns): false alarms under peeking, how often
identical knobs come out "same speed", power and rounds to decide for 1.2x and 1.3x. Pure
arithmetic: machine load does not change these figures.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_stats import A, B, SimBench  # the synthetic trials the tests use

from workbench.deciding.rounds import compare


def rate(hits: int, n: int) -> str:
    return f"{hits}/{n} = {hits / n:.1%}"


def one_look(n: int) -> None:
    """The single-comparison verdicts and integer rounds (unchanged by rounds='auto')."""
    for pattern in ("jitter", "bursty"):
        adjacent = first = pairs = 0
        for seed in range(n // 2):  # the held-out check: 8 identical trials, 7 adjacent pairs, 7 table verdicts
            sim = SimBench(50_000 + seed, pattern)
            t = [sim.run(A) for _ in range(8)]
            adjacent += sum(compare(x, y, log=sim.log).differs for x, y in itertools.pairwise(t))
            first += sum(compare(t[0], y, log=sim.log).differs for y in t[1:])
            pairs += 7
        fa3 = fa2 = p13 = p14 = single = 0
        for seed in range(n):
            s = SimBench(70_000 + seed, pattern)
            fa3 += compare(s.run(A), s.run(B), rounds=3, run=s.run, log=s.log).differs
            s = SimBench(80_000 + seed, pattern)
            fa2 += compare(s.run(A), s.run(B), rounds=2, run=s.run, log=s.log).differs
            s = SimBench(90_000 + seed, pattern, 1.3)
            c = compare(s.run(A), s.run(B), rounds=3, run=s.run, log=s.log)
            p13 += c.differs and c.speedup > 1
            s = SimBench(95_000 + seed, pattern, 1.4)
            c = compare(s.run(A), s.run(B), rounds=2, run=s.run, log=s.log)
            p14 += c.differs and c.speedup > 1
            s = SimBench(99_000 + seed, pattern, 1.3)
            single += compare(s.run(A), s.run(B), log=s.log).differs
        print(f"{pattern}: false alarms, 7 adjacent identical pairs per session {rate(adjacent, pairs)}; "
              f"verdict column (vs the first) {rate(first, pairs)}; rounds=3 {rate(fa3, n)}; rounds=2 {rate(fa2, n)} | "
              f"power: 1.3x rounds=3 {rate(p13, n)}; 1.4x rounds=2 {rate(p14, n)}; "
              f"1.3x one pair, no repeats yet {rate(single, n)}", flush=True)


def auto(n: int, max_rounds: int = 8, warm: int = 0) -> None:
    """rounds='auto': error rates under peeking and drift, and rounds to a decision."""
    for pattern in ("jitter", "bursty", "walk", "steps"):
        line = [f"{pattern}, rounds='auto' max_rounds={max_rounds}, {warm} identical trials in the log before:"]
        for speedup, margin, what in ((1.0, 0.05, "identical ±5%"), (1.0, 0.10, "identical ±10%"),
                                      (1.2, 0.05, "1.2x"), (1.3, 0.05, "1.3x")):
            answers, rounds = {"faster": 0, "slower": 0, "same": 0, "undecided": 0}, []
            for seed in range(n):
                s = SimBench(200_000 + int(speedup * 1000) * 1000 + seed, pattern, speedup)
                for _ in range(warm):  # identical repeats already in the log: a learnt back-to-back sd
                    s.run(A)
                c = compare(s.run(A), s.run(B), rounds="auto", max_rounds=max_rounds, margin=margin, run=s.run,
                            log=s.log)
                answers[c.answer] += 1
                rounds.append(c.rounds)
            if speedup == 1.0:
                line.append(f"{what}: false alarms {rate(answers['faster'] + answers['slower'], n)}, "
                            f"same speed {rate(answers['same'], n)}, mean rounds {np.mean(rounds):.1f};")
            else:
                line.append(f"{what}: found {rate(answers['faster'], n)} (wrong way {answers['slower']}), "
                            f"mean rounds {np.mean(rounds):.1f} (median {np.median(rounds):.0f});")
        print(" ".join(line), flush=True)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    one_look(n)
    auto(n)


if __name__ == "__main__":
    main()
