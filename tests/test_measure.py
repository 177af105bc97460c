"""Meters and TrialResult: statistics from raw samples, records, readable repr."""

import math

import pytest
import torch

import workbench as wb
from workbench.core.measure import (
    CpuLoad,
    KernelTime,
    StepClock,
    TrialResult,
    live_tensor_bytes,
    memory_meter,
    profile_peak_bytes,
    summarize,
)


def test_summarize_median_and_iqr():
    med, iqr = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert med == 3.0 and iqr == 2.0  # an outlier moves neither


def test_step_clock_on_cpu(monkeypatch):
    import workbench.core.measure as M

    ticks = iter([10.0, 10.5, 10.75, 11.75])
    monkeypatch.setattr(M.time, "perf_counter", lambda: next(ticks))
    clock = StepClock(torch.device("cpu"))
    assert clock.durations_s() == []  # no step before two marks
    for _ in range(4):
        clock.mark()
    assert clock.durations_s() == [0.5, 0.25, 1.0]  # the gaps between consecutive marks, in order


def test_live_tensor_bytes_counts_shared_storage_once():
    w = torch.zeros(1000)
    assert live_tensor_bytes([w, w[10:], {"state": w}]) == 4000


def test_profile_peak_bytes_sees_transient_allocations():
    def work():
        a = torch.ones(1_000_000)  # 4 MB
        b = torch.ones(1_000_000)  # 8 MB live together
        del a, b
        c = torch.ones(500_000)
        del c

    peak = profile_peak_bytes(work, torch.device("cpu"))
    assert 7.9e6 < peak < 9e6


def test_memory_meter_per_device_type():
    assert memory_meter("cuda") == "allocator"
    assert memory_meter("cpu") == "profiler"
    assert memory_meter("mps") is None  # no peak counter: "not measured", never a 0 from the wrong profiler


def test_profile_peak_bytes_refuses_mps_instead_of_reading_zero():
    ran = []
    with pytest.raises(ValueError, match="not measured on 'mps'"):
        profile_peak_bytes(lambda: ran.append(1), torch.device("mps"))
    assert ran == []  # refused before running anything


def test_cpu_load_is_system_busy_time_minus_our_own_per_wall_second(monkeypatch):
    """(busy, own, clock) readings 10->16 s busy, 2->3 s ours, over 2 s: (6 - 1) / 2 = 2.5 cores."""
    readings = iter([(10.0, 2.0, 100.0), (16.0, 3.0, 102.0)])
    monkeypatch.setattr(CpuLoad, "_read", staticmethod(lambda: next(readings)))
    assert CpuLoad().foreign_cores() == pytest.approx(2.5)


def test_cpu_load_is_never_negative_and_none_when_unreadable(monkeypatch):
    readings = iter([(10.0, 2.0, 100.0), (10.5, 3.0, 101.0)])  # our children ran more than the counter saw
    monkeypatch.setattr(CpuLoad, "_read", staticmethod(lambda: next(readings)))
    assert CpuLoad().foreign_cores() == 0.0
    monkeypatch.setattr(CpuLoad, "_read", staticmethod(lambda: None))  # psutil missing or refused
    assert CpuLoad().foreign_cores() is None


def test_cpu_load_reads_psutil_on_this_machine():
    import psutil

    before = psutil.cpu_times()
    reading = CpuLoad._read()
    after = psutil.cpu_times()
    assert reading is not None, "psutil is a dependency: the reading should work here"
    busy, own, _ = reading

    def busy_of(t):  # what _read counts as busy: all but idle, iowait and the guest time inside user
        return sum(t) - t.idle - getattr(t, "iowait", 0.0) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)

    assert busy_of(before) <= busy <= busy_of(after)  # the machine's own counters, read between the two
    mine = sum(psutil.Process().cpu_times()[:2])
    assert 0 < own <= mine + 0.5  # this process has run (importing torch), and its tree is all of own


def test_kernel_time_counts_the_faults_of_memory_touched_for_the_first_time():
    """128 MiB of fresh anonymous memory, one byte written per 4 KiB page: the kernel maps and zeroes
    every page (at least one fault per 2 MiB even with transparent huge pages), and that is kernel time."""
    import mmap

    size = 128 * 2**20
    meter = KernelTime()
    with mmap.mmap(-1, size) as m:
        for offset in range(0, size, 4096):
            m[offset] = 1
    faults, share = meter.since()
    assert faults >= size // (2 * 2**20)
    assert 0.0 < share <= 1.0


def test_kernel_time_is_none_without_the_resource_module(monkeypatch):
    monkeypatch.setattr(KernelTime, "_read", staticmethod(lambda: None))  # Windows: no resource module
    assert KernelTime().since() is None


def test_record_round_trip_and_repr():
    r = TrialResult(knobs=wb.Knobs(num_workers=2), status="ok", samples_per_s=1234.5, step_time_s=0.0123,
                    step_time_iqr_s=0.001, step_times_s=(0.0118, 0.0123, 0.0128), data_wait_s=(0.0, 0.001, 0.0),
                    data_wait_share=0.04, peak_memory_bytes=12_300_000, samples_per_step=16,
                    losses=(2.0, float("inf")), notes=("a note",), trial_id=3)
    rec = r.to_record()
    assert rec["num_workers"] == 2 and rec["losses"] == [2.0, None] and rec["final_loss"] == 2.0
    back = TrialResult.from_record(rec)
    assert back.knobs == r.knobs and back.step_times_s == r.step_times_s and math.isnan(back.losses[1])
    text = repr(r)
    assert "1,234.5 samples/s" in text and "step 12.3 ms" in text and "peak 12.3 MB" in text and "#3" in text
    failed = TrialResult(knobs=wb.Knobs(), status="oom", message="out of memory in the model's forward")
    assert "OOM: out of memory" in repr(failed)


def test_cpu_load_comes_from_psutil(monkeypatch):
    """System times from psutil, in the shape macOS gives them (no iowait, no steal): a figure, not None."""
    import collections

    import psutil

    mac = collections.namedtuple("scputimes", "user nice system idle")
    ticks = iter([mac(10.0, 0.0, 5.0, 100.0), mac(12.0, 0.0, 6.0, 101.0)])  # 3 s busy in between

    class Proc:
        def cpu_times(self):
            return (0.5, 0.5)  # our own tree: constant, so all 3 busy seconds are foreign

        def children(self, recursive=False):
            return []

    monkeypatch.setattr(psutil, "cpu_times", lambda: next(ticks))
    monkeypatch.setattr(psutil, "Process", Proc)
    load = CpuLoad()
    foreign = load.foreign_cores()
    assert foreign is not None and foreign > 0
    monkeypatch.setattr(psutil, "cpu_times", lambda: mac(12.0, 0.0, 6.0, 101.0))  # the same ticks again
    load = CpuLoad()
    load._start = (15.0, 1.0, load._start[2] - 2.0)  # 3 busy s (18 - 15), all foreign, over 2 s of wall
    assert load.foreign_cores() == pytest.approx(1.5, rel=0.01)
