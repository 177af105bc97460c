"""Time to a decision (issue 34): `compare(a, b, rounds="auto")` before (alternating trials) and after
(interleaved turns in one process), for a ~10% effect, a ~3% effect and identical knobs.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_decide.py [model ...] [--reps N] [--methods after,before]
                                                             [--cases 10,3,0] [--budget S]

Models: the demos `cnn` and `transformer` (size default), `heldout` (benchmarks/_heldout.py: a CNN the
tuner was not shaped on) and `own` (a 1-D conv net over 4,000-sample signals, written for this
benchmark). The effects come from a user knob, `extra_work`, that runs each batch with an extra 10% or
3% of its samples appended (one call, the output cut back), so the change costs about that fraction of
the step for a model whose cost grows with the batch; the trials ("before") say what the ratio really is.

before: `bench.compare(a, b, rounds="auto", interleave=False)`, today's alternating trials (max_rounds=8).
after:  `bench.compare(a, b, rounds="auto")`, interleaved turns (budget_s=30 unless --budget).

Each line: model, case, method, answer, ratio and interval, rounds or pairs of blocks, seconds from the
call to the answer (the two trials a and b that name the pair are run before the clock starts).
`--cases workers`: `num_workers=2, persistent_workers=True` against the start, a data-pipeline knob
that cannot interleave: `rounds="auto"` must still answer, by trials.
`--simulate`: the sequential rule alone on simulated pairs (no machine): identical sides and 10% / 3%
effects at 10% sd per pair, with and without bursts (20% of blocks hit by a ±30-100% outlier), looked
at every 8 pairs up to 20 times; false alarms, answers and the median pairs to an answer.

`--truth [rounds]`: issue 34's agreement check: for bench_referee.py's knob sets that interleave (cnn:
channels_last, batch_size=64, cpu_threads=1), the interleaved ratio (20 s of blocks, judged once) against the ratio of
`rounds` alternating trials each (default 4); goal: within ±5%. (The exported script's side is
bench_referee.py's own run.)

`--cache`: what sharing the caches does to the ratio: the cnn `channels_last` pair at 1, 4 and 16 steps
per block (each judged once after 10 s), and A's block samples/s against A's own trial.

Measures and prints; asserts nothing. State the machine's load next to any figure you quote.
"""

from __future__ import annotations

import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import TensorDataset

import workbench as wb

CASES = {"10": 0.10, "3": 0.03, "0": 0.0, "workers": "workers"}  # "workers": num_workers=2 against 0 (trials)


class _Extra(nn.Module):
    """The model on each batch plus an extra `frac` of it, in one call (a known slowdown: for a model
    whose cost grows with the batch, about `frac` of the step), the output cut back to the batch."""

    def __init__(self, inner: nn.Module, frac: float) -> None:
        super().__init__()
        self.inner, self.frac = inner, frac

    def forward(self, x, *args, **kwargs):  # any model's signature
        if not (self.frac and isinstance(x, torch.Tensor)):
            return self.inner(x, *args, **kwargs)
        n = x.shape[0]
        m = max(1, round(self.frac * n))
        more = [torch.cat([a, a[:m]]) if isinstance(a, torch.Tensor) and a.shape[:1] == (n,) else a for a in args]
        out = self.inner(torch.cat([x, x[:m]]), *more, **kwargs)
        return out[:n] if isinstance(out, torch.Tensor) else out


@wb.knob(choices=[0.0, 0.03, 0.10], help="also train on an extra slice of each batch (a known slowdown)")
def extra_work(model, value):
    """Wrap the model so each step costs about `value` more (benchmarks/bench_decide.py)."""
    return _Extra(model, value) if value else model


def own() -> wb.Workbench:
    """A 1-D conv net over 4,000-sample signals, 8 classes: a model of this benchmark's own."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv1d(1, 16, 9, 4, 4), nn.ReLU(), nn.Conv1d(16, 32, 9, 4, 4), nn.ReLU(),
                        nn.Conv1d(32, 64, 9, 4, 4), nn.ReLU(), nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(64, 8))
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(512, 1, 4000, generator=g), torch.randint(0, 8, (512,), generator=g))
    return wb.Workbench(net, data, loss_fn=nn.CrossEntropyLoss(), optimizer=lambda p: torch.optim.AdamW(p, 1e-3),
                        knobs=wb.Knobs(batch_size=32), log=None, name="own-conv1d", device="cpu")


def make(name: str) -> wb.Workbench:
    if name == "own":
        return own()
    if name == "heldout":
        sys.path.insert(0, os.path.dirname(__file__))
        import _heldout

        return _heldout.bench()
    return wb.demo(name, log=None)


def one(bench: wb.Workbench, frac: float | str, method: str, budget: float | None) -> str:
    """One comparison from a fresh pair of trials; its line of the table."""
    a = bench.run(progress=False)
    if frac == "workers":  # a data-pipeline knob: it cannot interleave, so trials must answer
        b = bench.run(progress=False, num_workers=2, persistent_workers=True)
    else:
        b = bench.run(progress=False, extra_work=frac)  # frac 0: identical knobs (the default value)
    t0 = time.perf_counter()
    c = bench.compare(a, b, rounds="auto", interleave=None if method == "after" else False, max_rounds=8,
                      budget_s=budget if method == "after" else None)
    secs = time.perf_counter() - t0
    how = f"{c.turns} pairs x {c.turn_steps} steps" if c.method == "interleaved" else f"{c.rounds} rounds"
    return (f"| {c.answer} | {c.speedup:.3f} ({c.low:.3f} … {c.high:.3f}) | {how} | {secs:.1f} s |")


def simulate(sims: int = 1000, every: int = 8, looks: int = 20, sd: float = 0.10) -> None:
    """The interleaved rule on simulated pair log-ratios: error rates with peeking and pairs to an answer."""
    import numpy as np

    from workbench.results.stats import decide_interleaved

    rng = np.random.default_rng(34)
    print(f"simulated: {sims} comparisons per row, {sd:.0%} sd per pair, a look every {every} pairs, at most {looks}")
    print("| true B/A | bursts | faster | slower | same | undecided | median pairs to an answer |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for effect in (1.0, 0.97, 0.90):
        for burst in (0.0, 0.2):
            counts, pairs = dict.fromkeys(("faster", "slower", "same", "undecided"), 0), []
            for _ in range(sims):
                d = rng.normal(np.log(effect), sd, every * looks)
                hit = rng.random(len(d)) < burst
                d[hit] += rng.choice([-1.0, 1.0], hit.sum()) * rng.uniform(0.3, 1.0, hit.sum())
                a = np.full(len(d), 100.0)
                answer = "undecided"
                for look in range(1, looks + 1):
                    n = look * every
                    answer = decide_interleaved(a[:n], a[:n] * np.exp(d[:n]), looks=looks, look_every=every).answer
                    if answer != "undecided":
                        pairs.append(n)
                        break
                counts[answer] += 1
            med = f"{np.median(pairs):.0f}" if pairs else "-"
            print(f"| {effect:.2f} | {burst:.0%} | {counts['faster']} | {counts['slower']} | {counts['same']} | "
                  f"{counts['undecided']} | {med} |", flush=True)


def truth(rounds: int = 4, seconds: float = 20.0) -> None:
    """Interleaved ratio against separate trials' ratio, for bench_referee.py's interleavable knob sets."""
    sys.path.insert(0, os.path.dirname(__file__))
    from bench_referee import KNOB_SETS

    from workbench.deciding.interleave import interleaved, why_not

    benches: dict[str, wb.Workbench] = {}
    print("| demo | change | interleaved B/A (interval; pairs, s) | trials B/A (interval; rounds) | "
          "interleaved / trials | within ±5% | interleaved ratio inside the trials' interval |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for demo, change in KNOB_SETS:
        bench = benches.setdefault(demo, wb.demo(demo, log=None))
        if not change or why_not(bench.defaults, bench.knobs(**change)) is not None:
            continue
        a, b = bench.run(progress=False), bench.run(progress=False, **change)
        # the whole `seconds` and one look: a precise ratio, not the first decided one (which may be wide)
        inter = interleaved(bench.workload, a.knobs, b.knobs, budget_s=seconds, looks=1)
        trials = bench.compare(a, b, rounds=rounds, interleave=False)
        agree = inter.speedup / trials.speedup
        print(f"| {demo} | {change} | {inter.speedup:.3f} ({inter.low:.3f} … {inter.high:.3f}; {inter.turns}, "
              f"{inter.seconds:.0f}) | {trials.speedup:.3f} ({trials.low:.3f} … {trials.high:.3f}; {trials.rounds}) | "
              f"{agree:.3f} | {'yes' if 1 / 1.05 <= agree <= 1.05 else 'no'} | "
              f"{'yes' if trials.low <= inter.speedup <= trials.high else 'no'} |", flush=True)


def cache(demo: str = "cnn", change: dict | None = None, seconds: float = 10.0) -> None:
    """What sharing the machine's caches does: the same pair interleaved in blocks of 1, 4 and 16 steps
    (a block's first step runs after the other model's block), each judged once after `seconds`; the
    ratio, and A's block samples/s against A's own trial (which also pays for its loader)."""
    import statistics

    from workbench.deciding.interleave import interleaved

    change = change or {"channels_last": True}
    bench = wb.demo(demo, log=None)
    a, b = bench.run(progress=False), bench.run(progress=False, **change)
    print(f"{demo}, {change}: trial A {a.samples_per_s:.0f} samples/s, trial B {b.samples_per_s:.0f} "
          f"(B/A {b.samples_per_s / a.samples_per_s:.3f}, one trial each)")
    print("| steps per block | pairs | B/A (interval) | A's blocks, samples/s (median) | A's blocks / A's trial |")
    print("| --- | --- | --- | --- | --- |")
    for k in (1, 4, 16):
        c = interleaved(bench.workload, a.knobs, b.knobs, budget_s=seconds, turn_steps=k, looks=1)
        rate = statistics.median(c.a_rates)
        print(f"| {k} | {c.turns} | {c.speedup:.3f} ({c.low:.3f} … {c.high:.3f}) | {rate:.0f} | "
              f"{rate / a.samples_per_s:.3f} |", flush=True)


def main(argv: list[str]) -> None:
    import argparse

    p = argparse.ArgumentParser(description="time to a decision, before and after interleaving")
    p.add_argument("models", nargs="*", default=["cnn", "own"])
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--methods", default="after,before")
    p.add_argument("--cases", default="10,3,0")
    p.add_argument("--budget", type=float, default=None)
    p.add_argument("--simulate", action="store_true", help="the sequential rule on simulated pairs only")
    p.add_argument("--cache", action="store_true", help="the cnn channels_last pair at 1, 4 and 16 steps per block")
    p.add_argument("--truth", type=int, nargs="?", const=4, default=None, metavar="ROUNDS",
                   help="interleaved ratio against trials for bench_referee.py's knob sets")
    args = p.parse_args(argv)
    if args.simulate:
        simulate()
        return
    if args.cache:
        cache()
        return
    if args.truth is not None:
        truth(args.truth)
        return
    names, reps, budget = args.models, args.reps, args.budget
    methods, cases = args.methods.split(","), args.cases.split(",")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load {os.getloadavg()[0]:.1f} "
          f"(1-min average at the start)")
    print("| model | case | method | answer | B/A ratio (interval) | evidence | seconds to the answer |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in names:
        bench = make(name)
        for case in cases:
            for method in methods:
                for _ in range(reps):
                    label = ("num_workers=2" if case == "workers" else
                             f"~{case}% slower" if CASES[case] else "identical")
                    print(f"| {name} | {label} | {method} {one(bench, CASES[case], method, budget)}", flush=True)
    print(f"load at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main(sys.argv[1:])
