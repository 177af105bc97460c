"""Trials as SLURM jobs against the same trials in process, on the same node (issue 44).

1. Submit-to-result overhead per trial: the wall time of `bench.run()` through a one-node SLURM
   (submitit's AutoExecutor) minus the wall time of the same trial in this process; split into the
   queue (sbatch to RUNNING), the job's start (its Python, imports, unpickling the workload) and the
   rest; and the calling process's own CPU seconds while a job trial runs (it trains nothing).
2. Agreement: the same knobs' samples/s in a job and in this process, alternating (ABBA, so drift
   hits both sides), R rounds: the ratio job/in-process with a 95% interval over rounds.

3. `tune`: the wall time of `tune(budget_s=40, parallel=2)` (every trial a job) against its budget:
   wall, the queue time the budget reports (`spent.queued_s`: seconds when all its jobs only waited,
   never spent), wall less that queue over budget_s (held to 1.1), the summed job start-up (`start_s`:
   a new Python, imports, unpickling the workload, per trial) and whether the account ever held a
   negative figure; once with a job per trial, then with held jobs (launch/held.py: a worker job runs
   trial after trial), in the same run, with the machine's load beside each.

The model class is defined in this script (`__main__`): it reaches the job by value.
Needs a running SLURM (sudo scripts/slurm_up.sh). Run:
    flock -x /tmp/cpu.lock .venv/bin/python benchmarks/bench_cluster.py [rounds]
    flock -x /tmp/cpu.lock .venv/bin/python benchmarks/bench_cluster.py tune [budget_s]
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import sys
import tempfile
import time

import torch
from torch.utils.data import TensorDataset

import workbench as wb

BATCH, WARMUP, STEPS = 64, 10, 200  # ~0.5 s measured windows: long enough to compare rates


class HeldOutMLP(torch.nn.Module):  # defined here, in __main__: travels to the job by value
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                       torch.nn.ReLU(), torch.nn.Linear(512, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def make_bench(executor: object | None, log: str) -> wb.Workbench:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(4096, 256), torch.randint(0, 10, (4096,)))
    return wb.Workbench(HeldOutMLP(), data, loss_fn=torch.nn.CrossEntropyLoss(),
                        optimizer=lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9), log=log, device="cpu",
                        warmup_steps=WARMUP, steps=STEPS, knobs=wb.Knobs(batch_size=BATCH), executor=executor)


def timed(bench: wb.Workbench) -> tuple[wb.TrialResult, float, float]:
    t, c = time.perf_counter(), time.process_time()
    r = bench.run(progress=False, stop_early=False)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    if not r.ok:
        raise SystemExit(f"trial failed: {r.status}: {r.message}")
    if r.extra.get("job"):
        gone(r.extra["job"]["id"])
    return r, wall, cpu


def gone(job_id: str, limit_s: float = 20.0) -> None:
    """Wait until the job has left the node: its process still exits (Python teardown, srun) after its
    result is written, and on this one node it would run beside the next in-process trial."""
    import subprocess

    t = time.monotonic()
    while time.monotonic() - t < limit_s:
        out = subprocess.run(["squeue", "-h", "-j", str(job_id)], capture_output=True, text=True).stdout.strip()
        if not out:
            return
        time.sleep(0.2)


def interval(ratios: list[float]) -> tuple[float, float, float]:
    """Geometric mean of the ratios and its 95% t-interval (over rounds, on the log scale)."""
    logs = [math.log(x) for x in ratios]
    m = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(m), math.nan, math.nan
    t = {2: 12.71, 3: 4.30, 4: 3.18, 5: 2.78, 6: 2.57, 7: 2.45, 8: 2.36, 9: 2.31, 10: 2.26}.get(len(logs), 2.2)
    half = t * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(m), math.exp(m - half), math.exp(m + half)


def main(rounds: int = 6) -> None:
    import submitit

    load0 = os.getloadavg()
    folder = tempfile.mkdtemp(prefix="bench-cluster-")
    ex = submitit.AutoExecutor(os.path.join(folder, "jobs"), cluster="slurm")
    ex.update_parameters(timeout_min=10, slurm_cpus_per_task=os.cpu_count() or 1)
    here, job = make_bench(None, os.path.join(folder, "here")), make_bench(ex, os.path.join(folder, "job"))
    timed(here)  # one unmeasured trial each: first-use costs (imports, allocator) out of the figures
    timed(job)
    rows = []
    for i in range(rounds):
        order = ("here", "job") if i % 2 == 0 else ("job", "here")  # ABBA
        got = {}
        for side in order:
            got[side] = timed(here if side == "here" else job)
        (rh, wh, _ch), (rj, wj, cj) = got["here"], got["job"]
        info = rj.extra["job"]
        rows.append({"wall_here": wh, "wall_job": wj, "cpu_caller": cj, "queue_s": info.get("queue_s") or 0.0,
                     "start_s": info.get("start_s") or 0.0, "sps_here": rh.samples_per_s, "sps_job": rj.samples_per_s,
                     "node": rj.env.get("host")})
        print(f"round {i + 1}: in process {wh:.2f} s {rh.samples_per_s:,.0f} samples/s | job {info['id']} on "
              f"{rj.env.get('host')} {wj:.2f} s (queue {info.get('queue_s') or 0:.2f} s, start "
              f"{info.get('start_s') or 0:.2f} s) {rj.samples_per_s:,.0f} samples/s | caller CPU {cj:.2f} s", flush=True)
    load1 = os.getloadavg()
    med = lambda key: statistics.median(r[key] for r in rows)  # noqa: E731
    over = [r["wall_job"] - r["wall_here"] for r in rows]
    g, lo, hi = interval([r["sps_job"] / r["sps_here"] for r in rows])
    print()
    print(f"machine: {platform.node()} ({platform.processor() or platform.machine()}), {os.cpu_count()} cores, "
          f"torch {torch.__version__}; SLURM one node; {rounds} rounds ABBA, {WARMUP}+{STEPS} steps per trial")
    print(f"load average before {load0[0]:.2f}, after {load1[0]:.2f}")
    print(f"wall per trial: in process {med('wall_here'):.2f} s, as a job {med('wall_job'):.2f} s; overhead median "
          f"{statistics.median(over):.2f} s (min {min(over):.2f}, max {max(over):.2f})")
    print(f"  of which queue (sbatch to RUNNING) {med('queue_s'):.2f} s, job start (Python, imports, unpickling) "
          f"{med('start_s'):.2f} s")
    print(f"caller's CPU while a job trial runs: {med('cpu_caller'):.2f} s of {med('wall_job'):.2f} s wall")
    print(f"samples/s job / in process: {g:.3f} (95% interval {lo:.3f} .. {hi:.3f}); in process median "
          f"{med('sps_here'):,.0f}, job median {med('sps_job'):,.0f}")


def tune_wall(budget_s: float = 40.0, parallel: int = 2) -> None:
    """Part 3: tune(budget_s, parallel) as jobs, held jobs off then on (launch/held.py), in one run: wall
    time, reported queue, start-up, against the budget."""
    import submitit

    from workbench.launch.held import held

    folder = tempfile.mkdtemp(prefix="bench-cluster-tune-")
    ex = submitit.AutoExecutor(os.path.join(folder, "jobs"), cluster="slurm")
    ex.update_parameters(timeout_min=10, slurm_cpus_per_task=1)
    print(f"machine: {platform.node()}, {os.cpu_count()} cores (shared: other work's load is in the load averages)")
    off = _tune_once(ex, os.path.join(folder, "off"), "held jobs off (a job per trial)", budget_s, parallel)
    kept = held(ex, idle_s=60)
    try:
        on = _tune_once(kept, os.path.join(folder, "on"), "held jobs on (held(ex, idle_s=60))", budget_s, parallel)
    finally:
        kept.close()
    print(f"wall per trial, on / off: {on[0] / on[1]:.2f} s / {off[0] / off[1]:.2f} s = "
          f"{(on[0] / on[1]) / (off[0] / off[1]):.2f} (same run, same node; the loads above say what else ran: "
          "a machine shared with other work)")


def _tune_once(ex: object, log: str, label: str, budget_s: float, parallel: int) -> tuple[float, int]:
    """One tune(budget_s, parallel) on `ex`, printed; its wall seconds and trials."""
    load0 = os.getloadavg()
    bench = make_bench(ex, log)
    bench.warmup_steps, bench.steps = 5, 30  # the Workbench's own defaults: a tune's many short trials
    t = time.perf_counter()
    res = bench.tune(budget_s=budget_s, parallel=parallel, explain=False, progress=False)
    wall = time.perf_counter() - t
    spent = res.spent
    jobs = [tr.extra.get("job") or {} for tr in bench.trials]
    queued = getattr(spent, "queued_s", None)  # a budget without its own account: the trials' waits, summed
    queued = queued if queued is not None else sum(j.get("queue_s") or 0.0 for j in jobs)
    start = sum(j.get("start_s") or 0.0 for j in jobs)
    workers = len({j.get("id") for j in jobs})
    negative = spent is not None and (any(v < 0 for v in spent.seconds.values())
                                      or any(s < 0 for _k, s, _f in spent.measured))
    print(f"{label}: load average before {load0[0]:.2f}, after {os.getloadavg()[0]:.2f}")
    print(f"  tune(budget_s={budget_s:g}, parallel={parallel}): {len(bench.trials)} trials in {workers} jobs, wall "
          f"{wall:.1f} s, reported queue {queued:.1f} s, wall less queue {wall - queued:.1f} s = "
          f"{(wall - queued) / budget_s:.2f} x budget_s (cap 1.10)")
    print(f"  job start-up summed over trials (Python, imports, unpickling; inside the budget) {start:.1f} s, "
          f"per trial {start / max(1, len(jobs)):.1f} s; account negative: {negative}")
    print(f"  account: {spent}")
    for line in res.jobs:
        print(f"  jobs: {line}")
    return wall, max(1, len(bench.trials))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "tune":
        tune_wall(float(sys.argv[2]) if len(sys.argv) > 2 else 40.0)
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 6)
