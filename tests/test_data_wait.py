"""Data wait means data on every device: on the CPU the loader's host time plus the move's; on CUDA the
GPU's own idle time while the host was in the loader, plus the copy's own cost. Tested with a stand-in
device whose queue runs ahead of the host (work queued, run later by a worker thread, events that record
when the queue reaches them): the pageable copy that waits for the queue, the loader hidden under queued
work, and the loader slower than the queued work."""

from __future__ import annotations

import queue
import statistics
import threading
import time
from types import SimpleNamespace
from typing import ClassVar

import pytest
import torch
from conftest import tiny_data
from torch import nn

import workbench as wb
from workbench.core import phases
from workbench.core import step as step_mod
from workbench.core.measure import CopyClock, StepClock, TrialResult
from workbench.diagnose.data import DATA_WAIT_LIMIT, check_data, disagree

KERNEL_S = 0.2  # seconds of queued "device" work per forward (the step's compute)
COPY_S = 0.004  # seconds the copy itself takes on the "device"


class QueueDevice:
    """A stand-in for one GPU stream whose queue runs ahead of the host.

    `launch`, `copy` and an event's `record` put work on a queue and return; a worker thread runs it in
    order, later (time.sleep for a kernel or a copy). A full queue blocks the host, as CUDA's launch queue
    does. A pageable copy (`pinned=False`) blocks the host until the queue reached it and it ran (what a
    pageable `.to("cuda")` does); a pinned one is queued and the host goes on. An event completes when the
    worker reaches it and keeps that moment (perf_counter seconds)."""

    def __init__(self, *, copy_s: float = COPY_S, pinned: bool = False, depth: int = 16) -> None:
        self.copy_s, self.pinned = copy_s, pinned
        self.work: queue.Queue = queue.Queue(maxsize=depth)
        self.worker = threading.Thread(target=self._run, name="stand-in-gpu", daemon=True)
        self.worker.start()

    def _run(self) -> None:
        while True:
            item = self.work.get()
            if item is not None:
                item()
            self.work.task_done()
            if item is None:
                return

    def __deepcopy__(self, memo: dict) -> QueueDevice:
        return self  # one device: the trial's copy of the model queues on it too

    def launch(self, seconds: float) -> None:
        self.work.put(lambda: time.sleep(seconds))

    def copy(self) -> None:
        done = threading.Event()

        def run() -> None:
            time.sleep(self.copy_s)
            done.set()

        self.work.put(run)
        if not self.pinned:
            done.wait()  # pageable: the host waits for the queue ahead, then for the copy

    def event(self) -> QueuedEvent:
        return QueuedEvent(self)

    def drain(self) -> None:
        """What torch.cuda.synchronize does: wait until everything queued has run."""
        self.work.join()

    def close(self) -> None:
        self.work.put(None)
        self.worker.join()


class QueuedEvent:
    """torch.cuda.Event's surface for the stand-in: record() queues a marker; elapsed_time(end) in ms."""

    def __init__(self, device: QueueDevice) -> None:
        self.device, self.t = device, 0.0
        self.done = threading.Event()

    def record(self, stream: object = None) -> None:
        def reached() -> None:
            self.t = time.perf_counter()
            self.done.set()

        self.device.work.put(reached)

    def elapsed_time(self, end: QueuedEvent) -> float:
        self.synchronize()
        end.synchronize()
        return (end.t - self.t) * 1e3

    def synchronize(self) -> None:
        self.done.wait()


class QueuedNet(nn.Module):
    """A forward that queues `kernel_s` of 'device' work and returns at once (a GPU launch)."""

    def __init__(self, device: QueueDevice, kernel_s: float = KERNEL_S) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 4)
        self.device, self.kernel_s = device, kernel_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.device.launch(self.kernel_s)
        return self.lin(x)


class SlowData(torch.utils.data.Dataset):
    """256 samples of tiny_data's shape; each costs `batch_s / 8` seconds of host time (a batch of 8: `batch_s`)."""

    def __init__(self, batch_s: float) -> None:
        self.each_s = batch_s / 8

    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int):
        time.sleep(self.each_s)
        return torch.ones(8), torch.tensor(i % 4)


@pytest.fixture
def stand_in(monkeypatch):
    """`stand_in(pinned=...)`: a QueueDevice that the trial's copies, step clock, copy clock and syncs go through."""
    made: list[QueueDevice] = []

    def make(**kw) -> QueueDevice:
        dev = QueueDevice(**kw)
        made.append(dev)
        real_move = step_mod.move_to

        def move(batch, device, **kw):
            dev.copy()
            return real_move(batch, device, **kw)

        monkeypatch.setattr(step_mod, "move_to", move)
        monkeypatch.setattr(step_mod, "CopyClock", lambda device: CopyClock(device, event=dev.event))
        monkeypatch.setattr(phases, "StepClock", lambda device: StepClock(device, event=dev.event))
        monkeypatch.setattr(phases, "sync", lambda device: dev.drain())
        return dev

    yield make
    for dev in made:
        dev.close()


def _bench(net: nn.Module, data, steps: int = 5) -> wb.Workbench:
    return wb.Workbench(net, data, loss_fn=nn.CrossEntropyLoss(), device="cpu", log=None, steps=steps,
                        warmup_steps=1, knobs=wb.Knobs(batch_size=8))


def _lead(r: TrialResult) -> tuple[str, ...]:
    """tune's first axes for a start `r` on a GPU bench (no page-fault or shape lead there)."""
    from workbench.core.devicefacts import DeviceFacts
    from workbench.search.tune import _lead as lead

    bench = SimpleNamespace(device=torch.device("cuda"), trials=[], workload=None,
                            _facts=DeviceFacts(type="cuda", name="a stand-in GPU", cores=2))  # what tune reads
    return lead(SimpleNamespace(bench=bench, rows=[]), r)


@pytest.mark.fixed_warmup
def test_the_queue_a_pageable_copy_waits_behind_is_not_data_wait(stand_in):
    """The pageable copy of the first GPU run's LM: a fast loader, a copy that blocks the host until the
    previous step's queued kernels ran. The host spends most of each step in next(); the GPU waits for
    no data, only for the copy itself."""
    dev = stand_in(pinned=False)
    r = _bench(QueuedNet(dev), tiny_data(256)).run()
    assert r.ok, r.message
    assert r.data_wait_share < DATA_WAIT_LIMIT / 2  # the host time in next() is most of the step
    assert r.copy_share is not None and r.copy_share <= r.data_wait_share
    assert all(w >= COPY_S * 0.99 for w in r.data_wait_s)  # each step's copy counted, at its own cost
    told = r.extra["data_wait"]
    assert told["clock"] == "device events" and told["copy_s"] >= COPY_S * 0.99
    assert not check_data(r, None, None).data_bound and _lead(r) == ()


@pytest.mark.fixed_warmup
@pytest.mark.parametrize("pinned", [True, False])
def test_a_loader_hidden_under_queued_work_is_not_a_wait(stand_in, pinned):
    """A 60 ms loader under 200 ms of queued kernels: the host spends 60 ms of each step in the loader,
    the GPU none waiting for it (pinned or pageable: the kernels queued before the copy cover the loader)."""
    loader_s, kernel_s = 0.06, 0.20
    dev = stand_in(pinned=pinned)
    r = _bench(QueuedNet(dev, kernel_s), SlowData(loader_s), steps=8).run()
    assert r.ok, r.message
    told = r.extra["data_wait"]
    assert told["loader_host_s"] >= loader_s  # the host did spend it ...
    # ... under queued work: not a wait (but in the window's first step, which follows the sync that opens
    # the window: nothing is queued there, so that one loader is the device's idle time)
    assert statistics.median(r.data_wait_s) < 0.25 * loader_s and told["loader_idle_s"] < 0.5 * loader_s
    host_share = told["loader_host_s"] * len(r.data_wait_s) / r.extra["wall_s"]  # the host-time figure: ~30%
    assert r.data_wait_share < min(DATA_WAIT_LIMIT, host_share / 2)  # the copies and the window's first loader
    assert not check_data(r, None, None).data_bound
    assert _lead(r) == ()  # tune does not put workers first
    from workbench.diagnose.verdict import data_evidence

    said = [e for e in data_evidence(check_data(r, None, None)) if "in the loader" in e]
    assert said and "ms of it (the rest ran under kernels queued before it: no wait)" in said[0]


@pytest.mark.fixed_warmup
def test_a_loader_slower_than_the_queued_work_is_the_gpus_idle_time(stand_in):
    """A 250 ms loader against 100 ms of queued kernels: the GPU idles ~150 ms a step; the part of the
    loader hidden under the kernels is not counted."""
    loader_s, kernel_s = 0.25, 0.10
    dev = stand_in(pinned=True)
    r = _bench(QueuedNet(dev, kernel_s), SlowData(loader_s)).run()
    assert r.ok, r.message
    wait = statistics.median(r.data_wait_s)
    assert 0.8 * (loader_s - kernel_s) <= wait <= loader_s - kernel_s / 2  # the host-time figure read >= 0.25
    told = r.extra["data_wait"]
    assert told["loader_host_s"] >= loader_s and told["loader_idle_s"] < told["loader_host_s"]
    assert r.data_wait_share >= DATA_WAIT_LIMIT and check_data(r, None, None).data_bound
    assert _lead(r) == ("workers",)


def test_on_cpu_the_loader_and_the_move_are_the_data_wait_as_before(monkeypatch):
    """On the CPU nothing changes: a step's data wait is its host time in the loader plus the move's
    (a host-only cost with no queue ahead of it); the move is reported apart as copy_share."""
    move_s, batch_s = 0.01, 0.008

    real_move = step_mod.move_to

    def move(b, device, **kw):
        time.sleep(move_s)
        return real_move(b, device, **kw)

    monkeypatch.setattr(step_mod, "move_to", move)
    bench = wb.Workbench(nn.Linear(8, 4), SlowData(batch_s), loss_fn=nn.CrossEntropyLoss(), device="cpu", log=None,
                         steps=5, warmup_steps=1, knobs=wb.Knobs(batch_size=8))
    r = bench.run()
    assert r.ok, r.message
    assert all(w >= batch_s + move_s for w in r.data_wait_s)  # loader + move: both in the wait
    per_step_copy = r.copy_share * r.extra["wall_s"] / len(r.step_times_s)
    assert move_s <= per_step_copy < min(r.data_wait_s)  # the move apart, and part of the wait
    assert r.data_wait_share <= 1.0 and r.data_wait_share > r.copy_share
    told = r.extra["data_wait"]
    assert told["clock"] == "host" and told["loader_idle_s"] is None and told["host_idle_s"] is None


def test_the_copy_clock_reads_events_once_and_only_when_armed():
    dev = QueueDevice(copy_s=0.002)
    try:
        clock = CopyClock(torch.device("cpu"), event=dev.event)
        steps = StepClock(torch.device("cpu"), event=dev.event)
        clock.begin()
        with clock.timed():
            dev.copy()  # not armed (warm-up): nothing kept
        clock.arm()
        steps.mark()
        for _ in range(2):
            for _ in range(2):  # two micro-batches in one optimizer step
                clock.begin()
                time.sleep(0.01)  # the loader, with nothing queued: the device idles
                with clock.timed():
                    dev.copy()
            clock.end_step()
            steps.mark()
        got = clock.per_step_s()
        assert len(got) == 2 and all(s >= 2 * 0.002 * 0.99 for s in got)
        idle = clock.loader_idle_per_step_s()
        assert len(idle) == 2 and all(s >= 2 * 0.01 * 0.99 for s in idle)
        assert len(clock.host_idle_per_step_s(steps)) == 2
    finally:
        dev.close()
    host = CopyClock(torch.device("cpu"))
    host.arm()
    host.begin()
    with host.timed():
        time.sleep(0.002)
    host.end_step()
    assert not host.events and host.per_step_s()[0] >= 0.002
    assert host.loader_idle_per_step_s() is None and host.host_idle_per_step_s(StepClock(torch.device("cpu"))) is None


class _Ev:
    made: ClassVar[list[_Ev]] = []

    def __init__(self, enable_timing: bool = False) -> None:
        self.device = _current["device"]
        self.stream = None
        _Ev.made.append(self)

    def record(self, stream=None) -> None:
        self.stream = stream


_current = {"device": 0}


def test_events_are_recorded_on_the_trials_device_stream(monkeypatch):
    """Issue 48 item 5: a trial on cuda:1 times cuda:1 (its stream), whichever device is current."""
    import contextlib

    @contextlib.contextmanager
    def device(d):
        before = _current["device"]
        _current["device"] = torch.device(d).index
        try:
            yield
        finally:
            _current["device"] = before

    monkeypatch.setattr(torch.cuda, "Event", _Ev)
    monkeypatch.setattr(torch.cuda, "device", device)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda d=None: f"stream of {torch.device(d)}")
    _Ev.made.clear()
    dev = torch.device("cuda:1")
    StepClock(dev).mark()
    copies = CopyClock(dev)
    copies.arm()
    copies.begin()  # the host enters the loader
    with copies.timed():
        pass
    assert len(_Ev.made) == 4
    assert all(e.stream == "stream of cuda:1" and e.device == 1 for e in _Ev.made)
    assert _current["device"] == 0  # the current device is left as it was


# ---- diagnose: the share and one cached batch --------------------------------------------------
def _trial(tid: int, step_s: float, wait: float = 0.0, copy: float | None = None, cached: bool = False) -> TrialResult:
    knobs = wb.Knobs(batch_size=16, data="cached" if cached else "loader")
    times = tuple(step_s * (1 + 0.01 * ((i % 3) - 1)) for i in range(8))
    return TrialResult(knobs=knobs, status="ok", trial_id=tid, samples_per_s=16 / step_s, step_times_s=times,
                       data_wait_share=wait, copy_share=copy, samples_per_step=16)


def test_a_cached_batch_within_noise_is_never_data_bound_whatever_the_share():
    base, cached = _trial(1, 0.100, wait=0.75), _trial(2, 0.099, cached=True)  # the 0.75 at 1.01x
    check = check_data(base, cached, None)
    assert not check.data_bound
    assert disagree(base.data_wait_share, check.comparison)  # so diagnose runs the confirming rounds
    faster = check_data(base, _trial(3, 0.05, cached=True), None)  # 2x, agreeing with the share
    assert faster.data_bound and not disagree(base.data_wait_share, faster.comparison)
    assert check_data(_trial(1, 0.1, wait=DATA_WAIT_LIMIT), None, None).data_bound  # no twin: the 20% rule
    from workbench.diagnose.verdict import decide

    threads = {"cores": 8, "main_threads": 8, "workers": 0, "threads_wanted": 8, "oversubscribed": False,
               "suggest_cpu_threads": None}
    v = decide(base.knobs, check, threads, device=torch.device("cpu"))
    assert v.bottleneck != "data" and any("not waiting for data" in e for e in v.evidence)


def test_diagnose_runs_the_confirming_rounds_when_share_and_cached_batch_disagree(monkeypatch):
    from workbench.deciding.budget import Budget
    from workbench.diagnose import report

    calls = []

    class Bench:
        def compare(self, a, b, **kw):
            calls.append(kw)
            from workbench.deciding.rounds import compare

            return compare(a, b)

    base, same = _trial(1, 0.100, wait=0.75), _trial(2, 0.099, cached=True)
    report._confirm_data(Bench(), base, same, Budget(None, "diagnose"))
    assert calls[-1].get("rounds") == "auto"  # a 75% share against a cached batch as fast: rounds decide
    calls.clear()
    report._confirm_data(Bench(), base, _trial(3, 0.05, cached=True), Budget(None, "diagnose"))
    assert calls == [{}]  # they agree: one comparison, no rounds
    calls.clear()
    quiet = _trial(4, 0.100, wait=0.02)
    report._confirm_data(Bench(), quiet, _trial(5, 0.07, cached=True), Budget(None, "diagnose"))
    assert calls[-1].get("rounds") == "auto"  # little wait yet the cached batch looks faster: rounds


def test_a_copy_bound_step_on_cuda_is_told_to_pin_memory_not_to_add_workers():
    from workbench.diagnose.verdict import decide

    threads = {"cores": 8, "main_threads": 8, "workers": 0, "threads_wanted": 8, "oversubscribed": False,
               "suggest_cpu_threads": None}
    from workbench.core.devicefacts import DeviceFacts

    gpu = DeviceFacts(type="cuda", name="a stand-in GPU", cores=8)  # a GPU's facts on this CPU-only host
    base, cached = _trial(1, 0.10, wait=0.40, copy=0.35), _trial(2, 0.05, cached=True)
    v = decide(base.knobs, check_data(base, cached, None), threads, device=torch.device("cuda"), facts=gpu)
    assert v.bottleneck == "data" and v.next_knobs == {"pin_memory": True}
    assert any("of which the host->device copy 35%" in e for e in v.evidence)
    # the copy is queued on the compute stream: pinning makes it asynchronous for the host, not concurrent
    assert "overlap" not in v.why and "does not block the host" in v.why
    loader = _trial(1, 0.10, wait=0.40, copy=0.02)
    v = decide(loader.knobs, check_data(loader, cached, None), threads, device=torch.device("cuda"), facts=gpu)
    assert v.next_knobs.get("num_workers", 0) >= 1


def test_ranks_merge_the_data_wait_split_step_by_step():
    """A distributed trial's split is the slowest rank's per step, as its waits are; a rank on the host
    clock leaves the device figures out."""
    from dataclasses import asdict

    from workbench.core.phases import RawTrial
    from workbench.launch.result import assemble

    def report(idle, host):
        raw = RawTrial(warmup_steps=1, steps=2, startup_s=0.0, warm_times_s=[0.1], warmup_wall_s=0.1, probe_s=0.0,
                       step_times_s=[0.1, 0.1], waits_s=[0.02, 0.02], losses=[1.0, 1.0], samples=16, wall_s=0.2,
                       epochs=0, foreign_cores=None, peak_bytes=None, copies_s=[0.01, 0.01], loader_host_s=host,
                       loader_idle_s=idle, host_idle_s=None if idle is None else [0.0, 0.0])
        return {"raw": asdict(raw), "own_cores": 0.0, "probe_times_s": [], "comm": {"allreduce_calls": 0,
                                                                                      "allreduce_bytes": 0}}

    knobs = wb.Knobs(batch_size=8, world_size=2)
    r = assemble({0: report([0.01, 0.0], [0.05, 0.05]), 1: report([0.0, 0.03], [0.04, 0.06])}, knobs, env={},
                 started="", notes=[], backend="gloo")
    told = r.extra["data_wait"]
    assert told["clock"] == "device events"
    assert told["loader_idle_s"] == pytest.approx(0.02) and told["loader_host_s"] == pytest.approx(0.055)
    mixed = assemble({0: report([0.01, 0.0], [0.05, 0.05]), 1: report(None, [0.04, 0.06])}, knobs, env={},
                     started="", notes=[], backend="gloo")
    assert mixed.extra["data_wait"]["clock"] == "host" and mixed.extra["data_wait"]["host_idle_s"] is None
