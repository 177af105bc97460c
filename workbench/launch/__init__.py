"""Where a trial runs: in this process, or in torch.distributed ranks it forks.

    runner.py    run_trial: routes a trial (this process, or ranks), the one trial thread
    ranks.py     fork N ranks from this process (a notebook kernel), watch them, end them all
    worker.py    one rank: the same BatchSource + TrainStep + phases, the model wrapped by a strategy
    strategy.py  the data-parallel strategies: DDP and FSDP2 (`fully_shard`)
    result.py    per-rank reports -> one TrialResult, assembled by the parent (global samples/s, per-rank times)
    join.py      run inside an externally launched job (torchrun, any number of nodes)
    remote.py    the executor seam: run_elsewhere (caller) and trial_job (the job), submit(fn, *args) -> job
    fresh.py     FreshProcess, the local executor: each job in a new Python process
    cluster.py   Workbench(..., executor=ex): every trial a job (submitit/SLURM or any executor)
    jobs.py      Jobs: one workbench's trials on an executor, submitted, watched, recorded
    watcher.py   the one job watcher (every executor): progress file, batched scheduler states, faults
    held.py      held(ex): worker jobs that run trial after trial (no job start per trial)
"""

from .held import held

__all__ = ["held"]
