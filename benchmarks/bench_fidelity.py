"""Fidelity: does a trial read what the user's own plain loop reads? (the held-out CNN of issue 23)

    PYTHONPATH=. .venv/bin/python benchmarks/bench_fidelity.py [--rounds 5] [--sets ab|all]
        [--sides wb,loop,script,wb-thread,loop-thread] [--steps 30] [--warmup 5] [--keep]

The model is not a demo: a 3-block CNN (32 -> 64 -> 128 channels, BatchNorm, ReLU, max-pool) on
48x48 inputs from a TensorDataset, SGD with momentum, batch 64. Each knob set (`--sets ab`: the
defaults and `channels_last` + bf16; `all`: fp32, bf16, channels_last, both) is measured by these
sides, in alternating rounds (odd rounds run the sets and sides forward, even rounds backward):

    wb           bench.run(knobs) from this script's main thread, as a cell calls it (runs inline)
    loop         a hand-written loop on the main thread of this process: DataLoader(shuffle=True),
                 `--warmup` untimed steps, then `--steps` timed steps (what issue 23's user wrote)
    script       the loop `knobs.to_code()` writes, run as its own `python` process
    wb-thread    bench.run(knobs) called from another thread, as the panel calls it: the trial runs
                 on the workbench's trial thread (before issue 23's fix every trial ran there)
    loop-thread  the same hand loop, run on the workbench's trial thread (diagnosis)
    wb-noprobe   run_trial(measure_memory=False) from the main thread: the trial without the CPU memory
                 probe (a profiled last warm-up step) just before its window (diagnosis)

Next to every in-process figure: the process's page faults per timed step and the kernel's share of
its CPU time in the timed window (`KernelTime`: counts the load does not change; memory glibc hands
back to the OS after a step is faulted in again, zeroed by the kernel, at the next one).

Printed: every figure as it lands, then per set the median samples/s of each side, the per-round
ratio side/loop (median over rounds), each side's speedup over the first set, and the speedup
ratio; then verdicts from the per-round ratios (`--margin`, default ±5%): each side against the loop,
in samples/s and in speedup; with the machine, the load average before and after, and the malloc
setting. `--keep` calls `wb.keep_freed_memory()` before anything runs (the in-process equivalent
of starting with `MALLOC_ENV`, which the scripts then get). Measures, asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import workbench as wb
from workbench.core.codegen import script_warmup  # the trial's steady warm-up (issue 30)
from workbench.core.measure import KernelTime, environment
from workbench.core.system import MALLOC_ENV, malloc_policy
from workbench.launch.runner import run_trial, trial_thread

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_referee import agreement, allocator_env, run_script

N_SAMPLES, SIZE, CLASSES, BATCH = 2048, 48, 10, 64
SETS = {
    "ab": [("A defaults", {}), ("B channels_last+bf16", {"channels_last": True, "amp": "bf16"})],
    "all": [("fp32", {}), ("bf16", {"amp": "bf16"}), ("channels_last", {"channels_last": True}),
            ("channels_last+bf16", {"channels_last": True, "amp": "bf16"})],
}

PARTS = f"""\
import torch
from torch import nn
from torch.utils.data import TensorDataset


def block(c_in, c_out):
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU(), nn.MaxPool2d(2))


def build():
    torch.manual_seed(0)
    model = nn.Sequential(block(3, 32), block(32, 64), block(64, 128), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(128, {CLASSES}))
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn({N_SAMPLES}, 3, {SIZE}, {SIZE}, generator=g),
                         torch.randint(0, {CLASSES}, ({N_SAMPLES},), generator=g))
    return model, data
"""
namespace: dict = {}
exec(PARTS, namespace)  # the same definitions in this process and in the generated script
build = namespace["build"]


def make_optimizer(params):
    return torch.optim.SGD(params, lr=0.01, momentum=0.9)


def hand_loop(model0: nn.Module, data: TensorDataset, knobs: wb.Knobs, warmup: int,
              steps: int) -> tuple[float, float | None, float | None]:
    """The user's plain loop: fresh model copy, DataLoader(shuffle=True), untimed warm-up, timed steps;
    (samples/s, page faults per timed step, kernel share of CPU time in the timed window)."""
    model = copy.deepcopy(model0)
    if knobs.channels_last:
        model = model.to(memory_format=torch.channels_last)
    opt = make_optimizer(model.parameters())
    loss_fn = nn.CrossEntropyLoss()
    loader = DataLoader(data, batch_size=knobs.batch_size, shuffle=True)
    amp = (torch.autocast("cpu", dtype=torch.bfloat16) if knobs.amp == "bf16" else contextlib.nullcontext())
    model.train()
    step = seen = 0
    t0, kernel = time.perf_counter(), KernelTime()
    while step < warmup + steps:
        for x, y in loader:
            if knobs.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            with amp:
                loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if step == warmup:
                t0, seen, kernel = time.perf_counter(), 0, KernelTime()
            elif step > warmup:
                seen += len(y)
            if step == warmup + steps:
                break
    rate = seen / (time.perf_counter() - t0)
    faults = kernel.since()
    return (rate, faults[0] / steps, faults[1]) if faults else (rate, None, None)


def script_rate(knobs: wb.Knobs, warmup: int, steps: int, workdir: Path) -> float:
    """The loop knobs.to_code() writes, as a plain `python` process; the samples/s it prints."""
    path = workdir / "fidelity_loop.py"
    preamble = PARTS + ("\nmodel, dataset = build()\nloss_fn = nn.CrossEntropyLoss()\n\n\ndef make_optimizer(params):\n"
                        "    return torch.optim.SGD(params, lr=0.01, momentum=0.9)\n\n\n")
    path.write_text(preamble + knobs.to_code(steps=script_warmup(knobs, warmup) + steps, warmup=warmup))
    return run_script(path, knobs)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--sets", default="ab", help="ab, all, or a comma list of names from all (fp32,channels_last)")
    p.add_argument("--sides", default="wb,loop,script")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--margin", type=float, default=0.05, help="the equivalence margin of the verdicts (0.05: ±5%%)")
    p.add_argument("--keep", action="store_true",
                   help="wb.keep_freed_memory() in this process first, and the same MALLOC_* variables for the scripts")
    args = p.parse_args()
    if args.keep:
        if not wb.keep_freed_memory():
            p.error("--keep needs glibc's malloc (Linux)")
        os.environ.update(v.split("=", 1) for v in MALLOC_ENV.split())  # the scripts start with it set

    sides = args.sides.split(",")
    load_before = os.getloadavg()
    t_start = time.perf_counter()
    model0, data = build()
    bench = wb.Workbench(model0, data, loss_fn=nn.CrossEntropyLoss(), optimizer=make_optimizer, log=None,
                         steps=args.steps, warmup_steps=args.warmup, knobs=wb.Knobs(batch_size=BATCH))
    known = dict(SETS["all"])
    unknown = [n for n in args.sets.split(",") if args.sets not in SETS and n not in known]
    if unknown:
        p.error(f"--sets: unknown {', '.join(unknown)}; use ab, all, or names from {', '.join(known)}")
    named = SETS.get(args.sets) or [(n, known[n]) for n in args.sets.split(",")]
    sets = [(name, bench.knobs(**ch)) for name, ch in named]

    def of(r: wb.TrialResult) -> tuple[float, float | None, float | None]:
        if not r.ok:
            return float("nan"), None, None
        return r.samples_per_s, r.extra.get("page_faults_per_step"), r.extra.get("kernel_share")

    def measure(side: str, knobs: wb.Knobs, tmp: Path) -> tuple[float, float | None, float | None]:
        """(samples/s, page faults per timed step, kernel share of CPU time) of one side's trial."""
        if side == "wb":
            return of(bench.run(knobs, progress=False))
        if side == "wb-thread":  # bench.run from a non-main caller (the panel's path): the trial thread
            box: list = []
            caller = threading.Thread(target=lambda: box.append(bench.run(knobs, progress=False)), name="caller")
            caller.start()
            caller.join()
            return of(box[0]) if box else (float("nan"), None, None)
        if side == "wb-noprobe":  # the same trial without the memory probe on its last warm-up step
            return of(run_trial(bench.workload, knobs, warmup_steps=args.warmup, steps=args.steps,
                                measure_memory=False))
        if side == "loop":
            return hand_loop(model0, data, knobs, args.warmup, args.steps)
        if side == "loop-thread":
            return trial_thread().submit(hand_loop, model0, data, knobs, args.warmup, args.steps).result()
        if side == "script":  # its own process: faults and kernel time are not seen from here
            return script_rate(knobs, args.warmup, args.steps, tmp), None, None
        raise ValueError(f"unknown side {side!r}: choose from wb, wb-thread, wb-noprobe, loop, loop-thread, script")

    rates = {(name, side): [] for name, _ in sets for side in sides}
    kernel = {(name, side): [] for name, _ in sets for side in sides}  # (faults/step, kernel share) per trial
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = sets if r % 2 == 0 else sets[::-1]
            for name, knobs in order:
                for side in (sides if r % 2 == 0 else sides[::-1]):
                    rate, faults, share = measure(side, knobs, Path(tmp))
                    rates[name, side].append(rate)
                    kernel[name, side].append((faults, share))
                print(f"round {r + 1} {name}: " + ", ".join(f"{s} {rates[name, s][-1]:.1f}{_kernel(kernel[name, s][-1])}"
                                                             for s in sides)
                      + f"  (load {os.getloadavg()[0]:.2f})", flush=True)
    report(sets, sides, rates, kernel, args, load_before, time.perf_counter() - t_start)


def _kernel(cell: tuple[float | None, float | None]) -> str:
    faults, share = cell
    return "" if faults is None else f" ({faults:.0f} faults/step, kernel {share:.1%})"


def report(sets, sides, rates, kernel, args, load_before, seconds) -> None:
    """The summary table: medians, same-round ratios against the main-thread loop, speedups."""
    env = environment(torch.device("cpu"))
    print(f"\n{env['device_name']}, {os.cpu_count()} cores, torch {env['torch']}, Python "
          f"{platform.python_version()}; {args.rounds} rounds, {args.steps} timed steps after {args.warmup} "
          f"warm-up; load average {load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after; {seconds:.0f} s; "
          f"malloc: {malloc_policy()}; scripts' MALLOC_* variables: {allocator_env()}")
    ref_side = "loop" if "loop" in sides else sides[0]
    base = sets[0][0]
    for name, _ in sets:
        cells = []
        for s in sides:
            med = statistics.median(rates[name, s])
            ratio = statistics.median(a / b for a, b in zip(rates[name, s], rates[name, ref_side]))
            speed = med / statistics.median(rates[base, s])
            ref_speed = statistics.median(rates[name, ref_side]) / statistics.median(rates[base, ref_side])
            shares = [k for _, k in kernel[name, s] if k is not None]
            cells.append(f"{s} {med:8.1f} (x{ratio:.3f} of {ref_side}; speedup {speed:.3f}, "
                         f"ratio {speed / ref_speed:.3f}"
                         + (f"; kernel {statistics.median(shares):.1%}" if shares else "") + ")")
        print(f"{name:22s} " + " | ".join(cells))
    # Verdicts from the per-round ratios (equivalence test, as bench_referee): each side against the
    # loop in samples/s, and each set's speedup over the first set against the loop's, round by round.
    for s in sides:
        if s == ref_side:
            continue
        for name, _ in sets:
            interval, verdict = agreement(rates[name, s], rates[name, ref_side], args.margin)
            line = f"{s}/{ref_side} {name:22s} samples/s: {verdict} (95%: {interval})"
            if name != base:
                ws = [b / a for a, b in zip(rates[base, s], rates[name, s])]
                ls = [b / a for a, b in zip(rates[base, ref_side], rates[name, ref_side])]
                interval, verdict = agreement(ws, ls, args.margin)
                line += f"; speedup over {base}: {verdict} (95%: {interval})"
            print(line)


if __name__ == "__main__":
    main()
