"""Learners of a workshop, real or simulated: what each runs, and a class of them on one machine.

`learner_session` is what one learner runs (notebook 08): a demo logging into the shared folder,
then the prescribed `TRIALS`. `simulate_learners` starts one Python process per name, each running
a session, to rehearse a workshop (notebook 09) or to test gathering. The instructor's side
(`gather`, `Workshop`) is workshop.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

# The prescribed trials of a workshop session (notebook 08 runs them one by one): each teaches a
# claim whose answer depends on the machine.
TRIALS: tuple[dict[str, Any], ...] = (
    {},  # the baseline: the demo's defaults
    {"data": "cached"},  # the short-circuit test: is the loop waiting for data?
    {"num_workers": 2, "cpu_threads": 1},  # workers, with the main process leaving them a core
    {"amp": "bf16"},  # bf16 autocast: native units (faster) or emulated (slower)?
)


def learner_session(folder: str | os.PathLike, participant: str | None, *, demo: str = "jpeg",
                    size: str = "default", trials: tuple[dict[str, Any], ...] = TRIALS,
                    **workbench_kwargs: Any) -> Any:
    """What one learner runs: `wb.demo(demo)` logging to the shared folder, then every trial in
    `trials`. Returns the Workbench (its `results` are the learner's own)."""
    from .rebuild import demo as build_demo

    bench = build_demo(demo, size=size, log=folder, participant=participant, **workbench_kwargs)
    for knobs in trials:
        bench.run(**knobs)
    return bench


class SimulatedLearners:
    """Learner processes started by `simulate_learners`; `wait()` until they are done."""

    def __init__(self, procs: dict[str, subprocess.Popen]) -> None:
        self.procs = procs

    @property
    def running(self) -> int:
        """How many learner processes have not ended yet."""
        return sum(p.poll() is None for p in self.procs.values())

    def wait(self, timeout: float = 600.0) -> None:
        """Block until every learner ends; RuntimeError with the failing learner's stderr tail."""
        for name, p in self.procs.items():
            _, err = p.communicate(timeout=timeout)
            if p.returncode != 0:
                raise RuntimeError(f"learner {name!r} exited with {p.returncode}: {err[-1500:]}")

    def stop(self) -> None:
        """Terminate every learner process still running."""
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()


def simulate_learners(folder: str | os.PathLike, names: list[str], *, threads: int = 1,
                      **session_kwargs: Any) -> SimulatedLearners:
    """Start one Python process per name, all at once, each running `learner_session` into
    `folder`: a workshop on one machine (for a rehearsal or a test).

    The processes run `sys.executable` and import the same `workbench` as this one. `threads`
    sets OMP_NUM_THREADS per learner so that N learners on one machine do not fight over cores.
    """
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads),
           "PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)}
    code = ("import json, sys\n"
            "from workbench.faces.learners import learner_session\n"
            "learner_session(sys.argv[1], sys.argv[2], **json.loads(sys.argv[3]))\n")
    args = json.dumps(session_kwargs)
    procs = {name: subprocess.Popen([sys.executable, "-c", code, str(folder), name, args], env=env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for name in names}
    return SimulatedLearners(procs)
