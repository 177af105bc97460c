"""One prepared check of the CUDA/NCCL path of distributed trials, for a machine with GPUs.

Not a test (CI has no GPU) and not yet run: the path is written and reviewed only. On a machine
with N >= 1 GPUs it checks, printing one line per check:

1. a Workbench on device="cuda" refuses world_size=2 from this process (CUDA initialised: fork is
   unsafe) with the torchrun fix;
2. the exported DDP script runs under `torchrun --standalone --nproc-per-node=N` with NCCL;
3. with N >= 2, `torchrun -m workbench run --model ... --device cuda --json` joins as N ranks and
   rank 0 prints one ok result with backend nccl.

    .venv/bin/python benchmarks/check_ddp_cuda.py
"""

import json
import os
import subprocess
import sys
import tempfile

import torch

import workbench as wb

FACTORY = """
import torch
from torch import nn


def make():
    ds = torch.utils.data.TensorDataset(torch.randn(4096, 256), torch.randint(0, 10, (4096,)))
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    return {"model": model, "data": ds, "loss_fn": nn.CrossEntropyLoss(), "name": "cuda-check"}
"""

SETUP = """from torch import nn
model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10))
dataset = torch.utils.data.TensorDataset(torch.randn(4096, 256), torch.randint(0, 10, (4096,)))
loss_fn = nn.CrossEntropyLoss()
make_optimizer = lambda p: torch.optim.SGD(p, lr=0.05)
"""


def main() -> int:
    n = torch.cuda.device_count()
    if n == 0:
        print("no CUDA device: nothing to check")
        return 0
    print(f"{n} GPU(s): {torch.cuda.get_device_name(0)}, torch {torch.__version__}, NCCL {torch.cuda.nccl.version()}")
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "cudafactory.py"), "w") as f:
            f.write(FACTORY)
        sys.path.insert(0, tmp)
        import cudafactory

        bench = wb.Workbench(device="cuda", log=None, steps=5, warmup_steps=2, **cudafactory.make())
        try:
            bench.run(world_size=2)
            print("1. FAIL: world_size=2 was not refused with CUDA initialised")
            ok = False
        except ValueError as e:
            print(f"1. ok: refused ({str(e)[:90]}...)")
        script = os.path.join(tmp, "train_ddp.py")
        with open(script, "w") as f:
            f.write(wb.Knobs(batch_size=64, world_size=n, accum_steps=2, ddp_no_sync=True,
                             ddp_comm_hook="bf16").to_code(steps=20, setup=SETUP))
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                               f"--nproc-per-node={n}", script], capture_output=True, text=True, timeout=300)
        ok &= proc.returncode == 0
        print(f"2. {'ok' if proc.returncode == 0 else 'FAIL'}: generated DDP script on {n} rank(s) with NCCL"
              + ("" if proc.returncode == 0 else "\n" + proc.stderr[-2000:]))
        if n >= 2:
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([tmp, os.path.dirname(os.path.dirname(wb.__file__))])}
            proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                   f"--nproc-per-node={n}", "-m", "workbench", "run", "--model", "cudafactory:make",
                                   "--device", "cuda", "--json", "--quiet", "--steps", "10", "--warmup-steps", "3",
                                   "--log-path", "none"], capture_output=True, text=True, timeout=300, cwd=tmp, env=env)
            rec = json.loads(proc.stdout) if proc.returncode == 0 and proc.stdout.strip() else {}
            good = rec.get("status") == "ok" and rec.get("env", {}).get("backend") == "nccl"
            ok &= good
            print(f"3. {'ok' if good else 'FAIL'}: CLI joined {n} NCCL ranks: "
                  f"{rec.get('samples_per_s', 0):,.0f} samples/s, exposed comm "
                  f"{rec.get('extra', {}).get('distributed', {}).get('exposed_comm_share')}"
                  + ("" if good else "\n" + proc.stderr[-2000:]))
        else:
            print("3. skipped: needs 2 GPUs (NCCL needs one GPU per rank)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
