"""The workbench's 2-rank DDP throughput vs a bare torchrun DDP script doing the same work.

Same MLP, batch 64 per rank, SGD, gloo, 1 intra-op thread per rank, DistributedSampler with the
same seed, 5 warm-up + 30 measured optimizer steps. Both sides time only their measured window
(workbench: the trial's window; bare: perf_counter between barriers on rank 0), so process start-up
is excluded from both. Rounds alternate A B B A ... so machine drift hits both sides alike; the
figure is the median over rounds of (workbench samples/s / bare samples/s). Goal: within +-10%.

    .venv/bin/python benchmarks/bench_ddp.py [rounds]
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap

import torch

import workbench as wb

WARMUP, STEPS, BATCH, WIDTH = 5, 30, 64, 512

def timed_loop(model_call: str, batch: int = BATCH, warmup: int = WARMUP, steps: int = STEPS) -> str:
    """The bare scripts' shared tail: sampler, loader, untimed warm-up, the timed window between
    barriers on every rank, rank 0 writes samples/s (all ranks) to argv[1]. `model_call`: the module called."""
    return textwrap.dedent(f"""
        sampler = DistributedSampler(data, shuffle=True, seed=0)
        loader = DataLoader(data, batch_size={batch}, sampler=sampler)
        loss_fn = nn.CrossEntropyLoss()
        epoch, done, samples = 0, 0, 0
        t0 = None
        while done < {warmup + steps}:
            sampler.set_epoch(epoch)
            epoch += 1
            for x, y in loader:
                if done == {warmup}:
                    dist.barrier()
                    t0 = time.perf_counter()
                loss_fn({model_call}(x), y).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                done += 1
                if done > {warmup}:
                    samples += x.shape[0]
                if done == {warmup + steps}:
                    break
        dist.barrier()
        wall = time.perf_counter() - t0
        if dist.get_rank() == 0:
            json.dump({{"samples_per_s": samples * dist.get_world_size() / wall}}, open(sys.argv[1], "w"))
        dist.destroy_process_group()
    """)


BARE = textwrap.dedent(f"""
    import json, os, sys, time
    import torch, torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(4096, 64), torch.randint(0, 10, (4096,)))
    model = nn.Sequential(nn.Linear(64, {WIDTH}), nn.ReLU(), nn.Linear({WIDTH}, {WIDTH}), nn.ReLU(),
                          nn.Linear({WIDTH}, {WIDTH}), nn.ReLU(), nn.Linear({WIDTH}, 10))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
""") + timed_loop("ddp")


def bare_round(script: str) -> float:
    with tempfile.NamedTemporaryFile("r", suffix=".json") as out:
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                        script, out.name], check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        return json.load(open(out.name))["samples_per_s"]


def main(rounds: int = 6) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, WIDTH),
                                torch.nn.ReLU(), torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(),
                                torch.nn.Linear(WIDTH, 10))
    data = torch.utils.data.TensorDataset(torch.randn(4096, 64), torch.randint(0, 10, (4096,)))
    bench = wb.Workbench(model, data, loss_fn=torch.nn.CrossEntropyLoss(),
                         optimizer=lambda p: torch.optim.SGD(p, lr=0.05), device="cpu", log=None,
                         warmup_steps=WARMUP, steps=STEPS, knobs=wb.Knobs(batch_size=BATCH, world_size=2))
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "bare_ddp.py")
        with open(script, "w") as f:
            f.write(BARE)
        ratios, ours, bare = [], [], []
        load0 = os.getloadavg()
        for i in range(rounds):
            order = ("wb", "bare") if i % 2 == 0 else ("bare", "wb")  # A B, B A, ...
            got = {}
            for side in order:
                if side == "wb":
                    r = bench.run()
                    assert r.ok, r.message
                    got["wb"] = r.samples_per_s
                else:
                    got["bare"] = bare_round(script)
            ours.append(got["wb"])
            bare.append(got["bare"])
            ratios.append(got["wb"] / got["bare"])
            print(f"round {i + 1}: workbench {got['wb']:8.0f}  bare {got['bare']:8.0f}  ratio {ratios[-1]:.3f}",
                  flush=True)
        q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
        print(f"\nworkbench median {statistics.median(ours):.0f} samples/s, bare median {statistics.median(bare):.0f}")
        print(f"ratio (median of rounds) {statistics.median(ratios):.3f}  IQR {q[0]:.3f} .. {q[2]:.3f}  "
              f"(goal 0.90 .. 1.10)")
        print(f"machine: {os.cpu_count()} cores, torch {torch.__version__}; load average before "
              f"{load0[0]:.2f}, after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 6)
