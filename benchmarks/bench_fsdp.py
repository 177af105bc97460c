"""The workbench's 2-rank FSDP2 trial vs a bare torchrun FSDP2 loop doing the same work.

The same residual MLP (4 blocks), sharded the same way (fully_shard per block, then the root,
FSDP2's defaults: reshard after forward, fp32), AdamW, batch 64 per rank, gloo, 1 intra-op thread
per rank, DistributedSampler with the same seed, 5 warm-up + 30 measured optimizer steps. Both
sides time only their measured window (workbench: the trial's window; bare: perf_counter between
barriers on rank 0), so process start-up is excluded. Rounds alternate A B, B A, ... so machine
drift hits both sides alike; the figure is the median over rounds of (workbench samples/s / bare
samples/s). Goal: within +-20% (issue 19). Run from the repository root:

    .venv/bin/python benchmarks/bench_fsdp.py [rounds]
"""

import os
import statistics
import sys
import tempfile
import textwrap

import torch
from bench_ddp import bare_round, timed_loop  # the torchrun launch and the timed loop of a bare script

import workbench as wb

WARMUP, STEPS, BATCH, WIDTH = 5, 30, 64, 256

MODEL = textwrap.dedent(f"""
    import torch
    from torch import nn


    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = nn.Linear({WIDTH}, 2 * {WIDTH}), nn.Linear(2 * {WIDTH}, {WIDTH})

        def forward(self, x):
            return x + self.down(torch.relu(self.up(x)))


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp, self.head = nn.Linear(64, {WIDTH}), nn.Linear({WIDTH}, 10)
            self.blocks = nn.ModuleList(Block() for _ in range(4))

        def forward(self, x):
            x = self.inp(x)
            for block in self.blocks:
                x = block(x)
            return self.head(x)
""")

BARE = MODEL + textwrap.dedent("""
    import json, sys, time
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(4096, 64), torch.randint(0, 10, (4096,)))
    model = Net()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
""") + timed_loop("model", BATCH, WARMUP, STEPS)


def workbench_side() -> wb.Workbench:
    """The same model (from MODEL), data and optimizer as the bare script, as a Workbench."""
    ns: dict = {}
    exec(compile(MODEL, "<bench_fsdp model>", "exec"), ns)
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(4096, 64), torch.randint(0, 10, (4096,)))
    return wb.Workbench(ns["Net"](), data, loss_fn=torch.nn.CrossEntropyLoss(),
                        optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3), device="cpu", log=None,
                        warmup_steps=WARMUP, steps=STEPS,
                        knobs=wb.Knobs(batch_size=BATCH, world_size=2, strategy="fsdp2"))


def main(rounds: int = 6) -> None:
    bench = workbench_side()
    sides = {"wb": [], "bare": []}
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "bare_fsdp.py")
        with open(script, "w") as f:
            f.write(BARE)
        for i in range(rounds):
            for side in ("wb", "bare") if i % 2 == 0 else ("bare", "wb"):  # A B, B A, ...
                if side == "bare":
                    sides["bare"].append(bare_round(script))
                    continue
                r = bench.run()
                assert r.ok, r.message
                sides["wb"].append(r.samples_per_s)
            print(f"round {i + 1}: workbench {sides['wb'][-1]:8.0f}  bare {sides['bare'][-1]:8.0f}  "
                  f"ratio {sides['wb'][-1] / sides['bare'][-1]:.3f}", flush=True)
    ratios = [a / b for a, b in zip(sides["wb"], sides["bare"])]
    q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
    print(f"\nworkbench median {statistics.median(sides['wb']):.0f} samples/s, "
          f"bare median {statistics.median(sides['bare']):.0f}; model state per rank "
          f"{bench.trials[-1].model_state_bytes / 1e6:.2f} MB")
    print(f"ratio (median of rounds) {statistics.median(ratios):.3f}  IQR {q[0]:.3f} .. {q[2]:.3f}  (goal 0.80 .. 1.20)")
    print(f"machine: {os.cpu_count()} cores, torch {torch.__version__}; load average before {load0[0]:.2f}, "
          f"after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 6)
