"""Fit three steps on two CPU (gloo) processes with what `to_lightning` exports for a world_size=2
trial: `python tests/lightning_two_ranks.py ddp|fsdp2`. Lightning's launcher starts the second process
by running this script again; each rank prints one line: its strategy and the module types after fit.
Run by tests/test_lightning.py (a Lightning fit cannot start its ranks inside pytest's process)."""

from __future__ import annotations

import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
warnings.simplefilter("ignore")

import lightning.pytorch as L  # noqa: E402
from test_lightning import Data, Net  # noqa: E402

import workbench as wb  # noqa: E402

which = sys.argv[1]
bench = wb.Workbench.from_lightning(Net(), Data(), None, log=None, steps=4, warmup_steps=1)
if which == "ddp":
    knobs = bench.knobs(world_size=2, ddp_bucket_cap_mb=5, ddp_gradient_as_bucket_view=True,
                        ddp_broadcast_buffers=False, ddp_comm_hook="fp16", accum_steps=2, ddp_no_sync=True)
else:
    knobs = bench.knobs(world_size=2, strategy="fsdp2", fsdp_prefetch=1, fsdp_reshard_after_forward=False)
out = bench.to_lightning(knobs)
hooks: dict = {}
exec(out.code or "", hooks)
module = type("Exported", (Net,), {n: hooks[n] for n in ("configure_model",) if n in hooks})()
trainer = L.Trainer(**out, max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False)
trainer.fit(module, Data(n=128))
kinds = sorted({type(m).__name__ for m in module.modules()})
line = (f"rank {trainer.global_rank}: steps={trainer.global_step} strategy={type(trainer.strategy).__name__} "
        f"modules={','.join(kinds)}\n")
os.write(1, line.encode())  # one write: the two ranks share the pipe, and print's parts could interleave
import torch.distributed as dist  # noqa: E402

if dist.is_initialized():  # leave together, then skip the interpreter's teardown: a gloo thread that drops a
    dist.barrier()  # finished collective's tensors once the interpreter exits cannot take the GIL and ends inside a
    dist.destroy_process_group()  # destructor ("terminate called without an active exception", exit code -6)
os._exit(0)
