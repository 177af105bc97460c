"""Data wait means data on every device (issue 48 item 1): the loader's host time plus the copy's
own cost; the queue a pageable CUDA copy waits behind is compute. Tested with a stand-in device
whose copy blocks the host until a queued "kernel" finishes, as a pageable `.to("cuda")` does."""

from __future__ import annotations

import time
from typing import ClassVar

import pytest
import torch
from conftest import tiny_data
from torch import nn

import workbench as wb
from workbench.core import step as step_mod
from workbench.core.measure import CopyClock, StepClock, TrialResult
from workbench.diagnose.data import DATA_WAIT_LIMIT, check_data, disagree

KERNEL_S = 0.2  # seconds of queued "device" work per forward (the step's compute)
COPY_S = 0.004  # seconds the copy itself takes on the "device"


def _sleep_until(t: float) -> None:
    while (left := t - time.perf_counter()) > 0:
        time.sleep(left)


class FakeDevice:
    """A stand-in for a GPU stream: kernels queue without blocking the host; a pageable copy blocks the
    host until the queue drained, then runs for `copy_s`; an event completes when the work ahead did."""

    def __init__(self, copy_s: float = COPY_S) -> None:
        self.busy_until = time.perf_counter()
        self.copy_s = copy_s

    def __deepcopy__(self, memo: dict) -> FakeDevice:
        return self  # one device: the trial's copy of the model queues on it too

    def launch(self, seconds: float) -> None:
        self.busy_until = max(time.perf_counter(), self.busy_until) + seconds

    def copy(self) -> None:
        self.busy_until = max(time.perf_counter(), self.busy_until) + self.copy_s
        _sleep_until(self.busy_until)  # the host waits for the queue, then for the copy

    def event(self) -> FakeEvent:
        return FakeEvent(self)


class FakeEvent:
    def __init__(self, device: FakeDevice) -> None:
        self.device, self.t = device, 0.0

    def record(self, stream: object = None) -> None:
        self.t = max(time.perf_counter(), self.device.busy_until)  # done when the queue ahead is done

    def elapsed_time(self, end: FakeEvent) -> float:
        return (end.t - self.t) * 1e3  # ms, as torch.cuda.Event

    def synchronize(self) -> None:
        _sleep_until(self.t)


class QueuedNet(nn.Module):
    """A forward that queues KERNEL_S of 'device' work and returns at once (a GPU launch)."""

    def __init__(self, device: FakeDevice) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 4)
        self.device = device

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.device.launch(KERNEL_S)
        return self.lin(x)


def _stand_in(monkeypatch: pytest.MonkeyPatch, fake: FakeDevice) -> None:
    """The trial's copy goes through the fake device and is timed with its events."""
    real_move = step_mod.move_to

    def move(batch, device, **kw):
        fake.copy()
        return real_move(batch, device, **kw)

    monkeypatch.setattr(step_mod, "move_to", move)
    monkeypatch.setattr(step_mod, "CopyClock", lambda device: CopyClock(device, event=fake.event))


@pytest.mark.fixed_warmup
def test_the_queue_a_blocking_copy_drains_is_not_data_wait(monkeypatch):
    fake = FakeDevice()
    _stand_in(monkeypatch, fake)
    bench = wb.Workbench(QueuedNet(fake), tiny_data(256), loss_fn=nn.CrossEntropyLoss(), device="cpu", log=None,
                         steps=5, warmup_steps=1, knobs=wb.Knobs(batch_size=8))
    r = bench.run()
    assert r.ok, r.message
    # host time in next() per step is what is left of the previous forward's queued work + the copy:
    # the old figure read most of the step; the loader + the copy's own cost is a few % of it
    assert r.data_wait_share < 0.5 * KERNEL_S / (KERNEL_S + COPY_S)
    assert r.copy_share is not None and r.copy_share <= r.data_wait_share
    copies = r.copy_share * r.extra["wall_s"] / len(r.step_times_s)
    assert copies >= COPY_S * 0.99  # each step's copy counted, at its own cost
    assert all(w >= COPY_S * 0.99 for w in r.data_wait_s)


@pytest.mark.fixed_warmup
def test_on_cpu_the_loader_and_the_move_are_the_data_wait_as_before(monkeypatch):
    """On the CPU nothing changes: a step's data wait is its host time in the loader plus the move's
    (a host-only cost with no queue ahead of it); the move is reported apart as copy_share."""
    move_s, sleep_s, batch = 0.01, 0.001, 8

    class SlowData(torch.utils.data.Dataset):
        def __len__(self):
            return 256

        def __getitem__(self, i):
            time.sleep(sleep_s)
            return torch.ones(8), torch.tensor(i % 4)

    real_move = step_mod.move_to

    def move(b, device, **kw):
        time.sleep(move_s)
        return real_move(b, device, **kw)

    monkeypatch.setattr(step_mod, "move_to", move)
    bench = wb.Workbench(nn.Linear(8, 4), SlowData(), loss_fn=nn.CrossEntropyLoss(), device="cpu", log=None,
                         steps=5, warmup_steps=1, knobs=wb.Knobs(batch_size=batch))
    r = bench.run()
    assert r.ok, r.message
    assert all(w >= batch * sleep_s + move_s for w in r.data_wait_s)  # loader + move: both in the wait
    per_step_copy = r.copy_share * r.extra["wall_s"] / len(r.step_times_s)
    assert move_s <= per_step_copy < min(r.data_wait_s)  # the move apart, and part of the wait
    assert r.data_wait_share <= 1.0 and r.data_wait_share > r.copy_share


def test_the_copy_clock_reads_events_once_and_only_when_armed():
    fake = FakeDevice(copy_s=0.002)
    clock = CopyClock(torch.device("cpu"), event=fake.event)
    with clock.timed():
        fake.copy()  # not armed (warm-up): nothing kept
    clock.arm()
    for _ in range(2):
        for _ in range(2):  # two micro-batches in one optimizer step
            with clock.timed():
                fake.copy()
        clock.end_step()
    got = clock.per_step_s()
    assert len(got) == 2 and all(s >= 2 * 0.002 * 0.99 for s in got)
    host = CopyClock(torch.device("cpu"))
    host.arm()
    with host.timed():
        time.sleep(0.002)
    host.end_step()
    assert not host.events and host.per_step_s()[0] >= 0.002


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
    with copies.timed():
        pass
    assert len(_Ev.made) == 3
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
    base, cached = _trial(1, 0.10, wait=0.40, copy=0.35), _trial(2, 0.05, cached=True)
    v = decide(base.knobs, check_data(base, cached, None), threads, device=torch.device("cuda"))
    assert v.bottleneck == "data" and v.next_knobs == {"pin_memory": True}
    assert any("of which the host->device copy 35%" in e for e in v.evidence)
    loader = _trial(1, 0.10, wait=0.40, copy=0.02)
    v = decide(loader.knobs, check_data(loader, cached, None), threads, device=torch.device("cuda"))
    assert v.next_knobs.get("num_workers", 0) >= 1
