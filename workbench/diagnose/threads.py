"""CPU oversubscription: main-process threads + DataLoader workers against the cores we have.

Each worker is a process that needs a core; the main process runs `torch.get_num_threads()`
intra-op threads. More runnable threads than cores makes every one of them slower: on a 2-core
machine, 2 workers looked useless (1.09x) until the main process used 1 thread (1.65x).
"""

from __future__ import annotations

import pandas as pd
import torch

from ..core.devicefacts import DeviceFacts
from ..core.knobs import Knobs
from ..core.system import cpu_has_bf16, usable_cores

__all__ = ["cpu_has_bf16", "thread_check", "thread_frame", "usable_cores"]


def thread_check(knobs: Knobs, cores: int | None = None, facts: DeviceFacts | None = None) -> dict[str, object]:
    """Threads wanted vs cores; `suggest_cpu_threads` is set when the main process should shrink. `facts`:
    the trials' machine (an executor's node: its cores, and torch's default of one thread per core there)."""
    node = facts is not None and not facts.here
    cores = cores or (facts.cores if node else usable_cores())
    main = knobs.cpu_threads or (facts.cores if node else torch.get_num_threads())
    workers = knobs.num_workers if knobs.data == "loader" else 0
    # each worker runs its dataset code in one process (torch sets 1 intra-op thread in workers)
    wanted = main + workers
    over = workers > 0 and wanted > cores
    suggest = max(1, cores - workers) if over else None
    return {"cores": cores, "main_threads": main, "workers": workers, "threads_wanted": wanted,
            "oversubscribed": over, "suggest_cpu_threads": suggest,
            "cpu_capability": "" if node else torch.backends.cpu.get_cpu_capability(),
            "cpu_bf16": facts.bf16 if node and facts.type == "cpu" else cpu_has_bf16()}


def thread_frame(check: dict[str, object]) -> pd.DataFrame:
    """The check as a two-column table for the report."""
    return pd.DataFrame({"figure": list(check), "value": [str(v) for v in check.values()]})
