"""The device facts of the node a workbench's executor runs its trials on (core/devicefacts.py).

Without an executor (or with one whose jobs run on this machine: `FreshProcess`, a thread or process
pool, submitit's local executor) the facts are this machine's. With one that sends jobs elsewhere, the
first decision that needs them (tune's space, a knob's "changes nothing here" rule, `compare`'s
answer without measuring) submits one small probe job (launch/cluster.py's `probe_node`) through the seam's
`submit` and waits for its answer: the node's device type and name, its bf16/fp16/TF32 units, its cores
and memory. The answer is kept per executor and resources (the executor's type and its parameters:
partition, GPUs, CPUs, memory), in memory and in `node-facts.json` beside the log with the date it was
read; different resources, or facts older than MAX_AGE_DAYS, are probed again. A probe that fails falls
back to this machine's facts with a warning naming the fix, and is tried again RETRY_S later.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import threading
import time
from pathlib import Path
from typing import Any

from ..core.devicefacts import DeviceFacts
from ..launch.cluster import probe_node
from ..launch.folders import write_atomic
from .reloaded import announce
from .unchanged import warn_at_caller

CACHE_FILE = "node-facts.json"  # beside the log: {resources key: {"resources", "facts"}}
MAX_AGE_DAYS = 7.0  # cached facts older than this are probed again (a partition's nodes get replaced)
PROBE_WAIT_S = 900.0  # the most a probe may take, queue included, before this machine's facts stand in
RETRY_S = 300.0  # after a failed probe, this machine's facts stand in this long before the next probe
POLL_S = 0.2  # how often the wait asks the probe job whether it is done
LOCAL = ("FreshProcess", "ThreadPoolExecutor", "ProcessPoolExecutor", "LocalExecutor", "DebugExecutor")


def _chain(executor: Any) -> list[Any]:
    """The executor and those it wraps (held(ex).executor, submitit's AutoExecutor._executor)."""
    out: list[Any] = []
    while executor is not None and all(executor is not e for e in out) and len(out) < 8:
        out.append(executor)
        executor = getattr(executor, "_executor", None) or getattr(executor, "executor", None)
    return out


def runs_here(executor: Any) -> bool:
    """Whether `executor`'s jobs run on this machine (no probe needed: its facts are this machine's)."""
    return any(type(e).__name__ in LOCAL or getattr(e, "cluster", None) in ("local", "debug") for e in _chain(executor))


def resources(executor: Any, device: str) -> dict[str, Any]:
    """What decides the node a job lands on: each wrapped executor's type and its parameters (submitit's
    partition, gpus_per_node, cpus_per_task, mem_gb, constraint...), and the device asked for."""
    chain = []
    for e in _chain(executor):
        params = getattr(e, "parameters", None)
        chain.append({"type": type(e).__name__, "parameters": params if isinstance(params, dict) else {}})
    return {"executor": chain, "device": device}


def resources_key(res: dict[str, Any]) -> str:
    """16 hex digits naming `res` (its JSON, keys sorted; values JSON cannot hold are named by str)."""
    return hashlib.sha1(json.dumps(res, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _age_days(facts: DeviceFacts) -> float:
    try:
        return (_dt.datetime.now() - _dt.datetime.fromisoformat(facts.probed_at)).total_seconds() / 86400
    except (TypeError, ValueError):
        return float("inf")


class NodeFacts:
    """One workbench's device facts per executor and resources: memory, then the cache beside the log,
    else one probe job. `folder` holds the cache (None: memory only); `device` is what the user asked."""

    def __init__(self, folder: Path | None, device: str) -> None:
        self.path = Path(folder) / CACHE_FILE if folder is not None else None
        self.device = device
        self._known: dict[str, DeviceFacts] = {}
        self._retry: dict[str, float] = {}  # resources key -> monotonic time a failed probe may be tried again
        self._lock = threading.Lock()  # one probe at a time; other threads wait for its answer

    def known(self, executor: Any, local: DeviceFacts) -> DeviceFacts | None:
        """The facts for `executor` if already read (never submits anything), else None."""
        if executor is None or runs_here(executor):
            return local
        return self._known.get(resources_key(resources(executor, self.device)))

    def facts(self, executor: Any, local: DeviceFacts) -> DeviceFacts:
        """The facts of the node `executor` runs jobs on (`local`, this machine's, without one). After a failed
        probe, `local` stands in until RETRY_S have passed; the next decision after that probes again."""
        if executor is None or runs_here(executor):
            return local
        res = resources(executor, self.device)
        key = resources_key(res)
        with self._lock:
            if key in self._known and time.monotonic() < self._retry.get(key, float("inf")):
                return self._known[key]
            facts = self._cached(key)
            if facts is not None:
                announce(f"Device facts from {facts.line()} (cached in {self.path}): tune's space, the knobs' "
                         "rules and MFU read them")
            else:
                facts = self._probe(executor, res, key, local)
            self._known[key] = facts
            return facts

    def _cached(self, key: str) -> DeviceFacts | None:
        if self.path is None:
            return None
        try:
            entry = json.loads(self.path.read_text()).get(key)
            facts = DeviceFacts.from_dict(entry["facts"])
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return None
        return facts if _age_days(facts) <= MAX_AGE_DAYS else None

    def _save(self, key: str, res: dict[str, Any], facts: DeviceFacts) -> None:
        """Add the facts to the cache file (best effort: a read-only folder only costs a probe next time)."""
        if self.path is None:
            return
        try:
            table = json.loads(self.path.read_text()) if self.path.exists() else {}
        except (OSError, ValueError):
            table = {}
        if not isinstance(table, dict):
            table = {}
        table[key] = {"resources": res, "facts": facts.to_dict()}
        with contextlib.suppress(OSError):
            write_atomic(self.path, json.dumps(table, indent=1, default=str).encode(), mode=0o644, durable=False)

    def _probe(self, executor: Any, res: dict[str, Any], key: str, local: DeviceFacts) -> DeviceFacts:
        """One probe job's facts, saved; this machine's facts with a warning when the job fails."""
        job = None
        try:
            job = executor.submit(probe_node, self.device)
            deadline = time.monotonic() + PROBE_WAIT_S
            while not job.done():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no answer within {PROBE_WAIT_S:.0f} s (still queued or running)")
                time.sleep(POLL_S)
            facts = DeviceFacts.from_dict(job.result())
        except KeyboardInterrupt:
            if job is not None:
                with contextlib.suppress(Exception):
                    job.cancel()
            raise
        except Exception as e:
            if job is not None:
                with contextlib.suppress(Exception):
                    job.cancel()
            self._retry[key] = time.monotonic() + RETRY_S
            warn_at_caller(
                f"the probe job that reads the trials' node's device facts failed ({type(e).__name__}: "
                f"{str(e).strip()[:300]}): tune's space, the knobs' 'changes nothing here' rules and MFU use this "
                f"machine's facts ({local.type} {local.name}, {local.units()}, {local.cores} cores) for now. Fix "
                f"the executor so that a job runs (its error above): the first decision {RETRY_S / 60:.0f} minutes "
                "after this one probes again, and at once when the executor's resources change")
            return local
        self._retry.pop(key, None)
        self._save(key, res, facts)
        where = f" (saved in {self.path})" if self.path is not None else ""
        announce(f"Device facts from {facts.line()}{where}: tune's space, the knobs' rules and MFU read them")
        return facts


class OnNode:
    """The Workbench's device facts (`_facts`; the faces read them through results.protocol.Bench): its
    workload carries them (`bench.workload.facts`). A mixin: the class sets `executor`, `workload`, `log`,
    `_node` (a NodeFacts) and `_here` (this machine's facts)."""

    executor: Any
    workload: Any
    log: Any
    _node: NodeFacts
    _here: DeviceFacts

    @property
    def _facts(self) -> DeviceFacts:
        """What the workbench knows of the device its trials run on (type, name, bf16/fp16/TF32 units, cores,
        memory): this machine's without an executor; with one, its node's, read by one probe job the first
        time they are needed for these resources and cached beside the log. tune's space, the knobs' rules,
        `compare`'s "same" without measuring, MFU and the verdicts read them; the workload carries them."""
        self.workload.facts = self._node.facts(self.executor, self._here)
        return self.workload.facts

    def _known_facts(self) -> DeviceFacts | None:
        """The facts if already read (no probe job is submitted for them), else None."""
        return self._node.known(self.executor, self._here)

    def _stamp_facts(self, result: Any) -> None:
        """On an executor, write into a trial's environment whose device facts the workbench decided with
        (`facts`: "node gpu-17 (probe job 4242), cuda NVIDIA H100 ..."), once they were read."""
        facts = self._known_facts() if self.executor is not None else None
        if facts is not None:
            result.env.setdefault("facts", f"{facts.where}, {facts.type} {facts.name}".strip())

    def _expect_slow(self, knobs: Any, facts: DeviceFacts | None = None) -> str | None:
        """The warning before a trial known to be far slower where it runs (bf16 without native units, fp16
        on a CPU, CUDA-graph compile without CUDA: `facts`), with the factor earlier trials there measured
        (hopeless.py); None for any other trial."""
        from ..deciding.hopeless import warning

        facts = facts or self._facts
        here = self.workload.device
        return warning(knobs, self.log.trials, str(here) if facts.type == here.type else facts.type, bf16=facts.bf16)
