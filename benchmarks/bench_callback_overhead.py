"""Overhead of wb.LightningCallback on a real Lightning fit (issue 51): goal <= 1% of step time.

Two figures, same process, fits alternating in ABBA order (with the callback, without) so drift hits
both alike:
  1. the median step time of each fit (steps after the first 50, from a bare clock callback that both
     arms carry), and the median over rounds of (with / without);
  2. the time spent inside the callback's own hooks per step (perf_counter around each hook call):
     the direct cost, which the first figure bounds from outside through the machine's noise.
The end-of-run work (the warm-up rule over the recorded steps, the row appended to the log) runs once
per fit, after training; it is reported apart.

    .venv/bin/python benchmarks/bench_callback_overhead.py [rounds] [steps]
"""

import functools
import statistics
import sys
import time
import warnings

import lightning.pytorch as L
import torch
from torch.utils.data import DataLoader, TensorDataset

import workbench as wb

warnings.filterwarnings("ignore")
QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
             accelerator="cpu", devices=1)
HOOKS = ("on_train_start", "on_train_epoch_start", "on_train_batch_start", "on_train_batch_end", "on_train_end")


class Net(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Clock(L.Callback):
    """Both arms: one perf_counter per batch end (the step times the ratio is read from)."""

    def __init__(self) -> None:
        self.marks: list[float] = []

    def on_train_batch_end(self, *args) -> None:
        self.marks.append(time.perf_counter())


def timed(callback: wb.LightningCallback, spent: dict[str, float]) -> wb.LightningCallback:
    """The callback with perf_counter around each hook (the time inside it, per hook)."""
    for name in HOOKS:
        hook = getattr(callback, name)

        @functools.wraps(hook)
        def wrapped(*args, __hook=hook, __name=name, **kwargs):
            t0 = time.perf_counter()
            out = __hook(*args, **kwargs)
            spent[__name] = spent.get(__name, 0.0) + time.perf_counter() - t0
            return out

        setattr(callback, name, wrapped)
    return callback


def fit(data, steps: int, bench=None, spent=None) -> list[float]:
    clock = Clock()
    callbacks = [clock] + ([timed(wb.LightningCallback(bench), spent)] if bench is not None else [])
    torch.manual_seed(0)
    L.Trainer(max_steps=steps, callbacks=callbacks, **QUIET).fit(Net(), DataLoader(data, batch_size=64))
    return [b - a for a, b in zip(clock.marks, clock.marks[1:])][50:]


def main(rounds: int = 4, steps: int = 600) -> None:
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(64 * steps, 256, generator=g), torch.randint(0, 10, (64 * steps,), generator=g))
    module = Net()
    module.train_dataloader = lambda: DataLoader(data, batch_size=64)
    bench = wb.Workbench.from_lightning(module, log=None, steps=10, warmup_steps=2)
    ratios, spent_per_step, end_s, medians, hook_us = [], [], [], [], []
    fit(data, 100)  # warm the process (allocator, thread pool)
    for r in range(rounds):
        order = (True, False) if r % 2 == 0 else (False, True)
        got = {}
        for with_cb in order:
            spent: dict[str, float] = {}
            times = fit(data, steps, bench if with_cb else None, spent)
            got[with_cb] = statistics.median(times)
            if with_cb:
                per_step = (spent.get("on_train_batch_start", 0) + spent.get("on_train_batch_end", 0)) / steps
                spent_per_step.append(per_step / got[with_cb])
                hook_us.append(per_step * 1e6)
                end_s.append(spent.get("on_train_end", 0.0))
        ratios.append(got[True] / got[False])
        medians.append((got[True], got[False]))
        print(f"round {r + 1}: step {got[True] * 1e3:.3f} ms with, {got[False] * 1e3:.3f} ms without "
              f"({got[True] / got[False] - 1:+.2%}); inside the hooks {hook_us[-1]:.0f} µs per step, "
              f"{spent_per_step[-1]:.3%} of a step")
    print(f"median over {rounds} rounds: with/without {statistics.median(ratios) - 1:+.2%}; inside the callback's "
          f"per-step hooks {statistics.median(hook_us):.0f} µs per step, {statistics.median(spent_per_step):.3%} of the step time; end of run (warm-up rule, "
          f"the row appended) {statistics.median(end_s) * 1e3:.0f} ms once per fit")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
