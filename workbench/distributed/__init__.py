"""Distributed trials on torch.distributed: N ranks under DistributedDataParallel.

    launch.py    fork N ranks from this process (a notebook kernel), watch them, end them all
    worker.py    one rank: the same BatchSource + TrainStep + runner phases, model wrapped by DDP
    strategy.py  the data-parallel strategy seam (DDP now; FSDP2 `fully_shard` would be a second)
    result.py    per-rank reports -> one TrialResult (global samples/s, per-rank times, exposed comm)
    join.py      run inside an externally launched job (torchrun, any number of nodes)

`run_trial` routes here when `knobs.world_size > 1`; nothing else in the core imports this package.
"""

from .launch import check_launch, run_distributed

__all__ = ["check_launch", "run_distributed"]
