"""The real run's meter (faces/realrun.py) and the trial its exports default to (faces/surface.py): pauses
left out of the window with their seconds, CUDA events on the model's device, `compile_s` as a trial means
it, ranks summed into one row, and `to_code()`/`to_lightning()`/`to_training_arguments()` with no trial."""

from __future__ import annotations

import json
import os
import re
import socket
from typing import ClassVar

import pytest
import torch

import workbench as wb
from workbench.core.measure import TrialResult
from workbench.faces import realrun
from workbench.faces.realrun import RunMeter
from workbench.faces.surface import knobs_of


class Clock:
    """The host clock the meter reads, advanced by hand (seconds)."""

    def __init__(self, monkeypatch) -> None:
        self.t = 0.0
        monkeypatch.setattr(realrun.time, "perf_counter", lambda: self.t)


def run(meter: RunMeter, clock: Clock, durations, *, pauses=None, samples: int = 4) -> None:
    """Feed the meter one optimizer step per duration (seconds); `pauses`: {step index: (what, seconds)}
    run between the previous step's end and this step's batch."""
    meter.start()
    for i, d in enumerate(durations):
        if pauses and i in pauses:
            what, s = pauses[i]
            meter.pause(what)
            clock.t += s
        meter.batch((torch.zeros(samples, 2),))
        clock.t += d
        meter.batch_done(torch.tensor(1.0))
        meter.step()


def meter_of(knobs=None, **kw) -> RunMeter:
    return RunMeter(knobs=knobs or wb.Knobs(batch_size=4), device=torch.device("cpu"), framework="test",
                    warmup_steps=2, **kw)


def test_pauses_are_left_out_and_said_with_their_seconds(monkeypatch):
    clock, meter = Clock(monkeypatch), meter_of()
    run(meter, clock, [1.0] + [0.1] * 40, pauses={20: ("validation", 2.0), 30: ("validation", 2.0),
                                                 35: ("checkpoint saving", 0.5)})
    row = meter.result()
    assert row.samples_per_s == pytest.approx(40.0)  # 4 samples per 0.1 s: the pauses never count
    assert max(row.step_times_s) == pytest.approx(0.1)
    notes = " ".join(row.notes)
    assert re.search(r"validation: 2 runs, 4\.00 s", notes), notes
    assert re.search(r"checkpoint saving: 1 run, 0\.50 s", notes), notes
    assert "3 steps" in notes


def test_a_pause_after_the_last_step_is_counted_too(monkeypatch):
    clock, meter = Clock(monkeypatch), meter_of()
    run(meter, clock, [1.0] + [0.1] * 30)
    meter.pause("validation")
    clock.t += 1.5
    row = meter.result()
    assert re.search(r"validation: 1 run, 1\.50 s", " ".join(row.notes)), row.notes
    assert row.samples_per_s == pytest.approx(40.0)


def test_compile_s_is_the_warm_up_beyond_steady_steps_and_empty_without_compile(monkeypatch):
    """As a trial's (core/phases.py): warm-up seconds beyond steady-state steps, None when nothing compiles."""
    steps = [5.0, 1.0] + [0.1] * 40
    clock, meter = Clock(monkeypatch), meter_of()
    run(meter, clock, steps)
    assert meter.result().compile_s is None
    clock, meter = Clock(monkeypatch), meter_of(wb.Knobs(batch_size=4, compile="default"))
    run(meter, clock, steps)
    row = meter.result()
    warm = row.extra["warmup_rule"]["steps"]
    assert row.compile_s == pytest.approx(sum(steps[:warm]) - 0.1 * warm)


# ---- CUDA: the model's device, whichever is current --------------------------------------------------
class _Ev:
    made: ClassVar[list[_Ev]] = []

    def __init__(self, enable_timing: bool = False) -> None:
        self.device, self.stream = _current["device"], None
        _Ev.made.append(self)

    def record(self, stream=None) -> None:
        self.stream = stream

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: _Ev) -> float:
        return 100.0  # ms


_current = {"device": 0}


class _OnDevice:
    """torch.cuda.device(d) stand-in: `d` is the current device inside the block."""

    def __init__(self, d) -> None:
        self.d, self.before = torch.device(d).index, None

    def __enter__(self) -> None:
        self.before, _current["device"] = _current["device"], self.d

    def __exit__(self, *exc) -> None:
        _current["device"] = self.before


def test_cuda_events_are_recorded_on_the_model_s_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", _Ev)
    monkeypatch.setattr(torch.cuda, "device", _OnDevice)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda d=None: f"stream of {torch.device(d)}")
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d=None: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d=None: 1 << 20)
    monkeypatch.setattr(realrun, "environment", lambda d: {"device": str(d)})
    _Ev.made.clear()
    meter = RunMeter(knobs=wb.Knobs(batch_size=4), device=torch.device("cuda:1"), framework="test", warmup_steps=2)
    meter.start()
    for _ in range(12):
        meter.batch((torch.zeros(4, 2),))
        meter.batch_done()
        meter.step()
    row = meter.result()
    assert row.ok and row.samples_per_s == pytest.approx(40.0)
    assert len(_Ev.made) == 13
    assert all(e.stream == "stream of cuda:1" and e.device == 1 for e in _Ev.made)
    assert _current["device"] == 0


# ---- ranks: one row, the world's samples --------------------------------------------------------------
def _rank(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        clock = [0.0]
        realrun.time.perf_counter = lambda: clock[0]
        meter = RunMeter(knobs=wb.Knobs(batch_size=4, world_size=2), device=torch.device("cpu"), framework="test",
                         warmup_steps=2)
        meter.start()
        for i in range(30):
            if i == 15:
                meter.pause("validation")
                clock[0] += 1.0
            meter.batch((torch.zeros(4 + rank, 2),))  # rank 1 reads 5 samples a step, rank 0 reads 4
            clock[0] += 0.1 if rank == 0 else 0.2  # rank 1 is the slow one: it sets each step's time
            meter.batch_done()
            meter.step()
        reduced = []  # each collective's tensors and their reference counts before it
        refs = realrun._refs
        realrun._refs = lambda ts: reduced.append((ts, refs(ts))) or reduced[-1][1]
        row = meter.combine_ranks()
        before = {id(ts): (ts, counts) for ts, counts in reversed(reduced)}  # each list's first count
        assert len(before) == 2 and all(refs(ts) == counts for ts, counts in before.values())  # gloo let go
        if rank == 0:
            with open(out, "w") as f:
                json.dump([row.samples_per_s, row.samples_per_step, max(row.step_times_s), list(row.notes)], f)
        else:
            assert row is None
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_make_one_row_with_the_world_s_samples(tmp_path):
    """One row on rank zero; and combine_ranks returns only once gloo's threads have dropped its tensors (a drop
    after the interpreter began to exit aborted the rank, when its collectives were a script's last)."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "row.txt"
    mp.start_processes(_rank, args=(2, port, str(out)), nprocs=2, start_method="fork")
    rate, per_step, slowest, notes = json.loads(out.read_text())
    assert per_step == 9 and slowest == pytest.approx(0.2)
    assert rate == pytest.approx(9 / 0.2)
    assert any("2 ranks" in n for n in notes) and any("validation: 1 run" in n for n in notes)


# ---- the trial the exports default to ---------------------------------------------------------------
def row(tid: int, rate: float, *, model: str = "m", real: bool = False, batch: int = 8) -> TrialResult:
    extra = {"model": model, **({"source": "real run"} if real else {})}
    return TrialResult(knobs=wb.Knobs(batch_size=batch), status="ok", samples_per_s=rate, step_times_s=(0.1, 0.1),
                       samples_per_step=batch, trial_id=tid, extra=extra)


def test_the_default_export_is_this_model_s_fastest_trial_never_a_run_nor_another_model_s():
    log = wb.ResultLog(None)
    log.model = "m"
    for r in (row(1, 100.0, batch=8), row(2, 150.0, batch=16), row(3, 900.0, batch=32, real=True),
              row(4, 800.0, batch=64, model="other")):
        log.append(r)
    assert knobs_of(log, None, "to_lightning").batch_size == 16
    log2 = wb.ResultLog(None)
    log2.append(row(1, 900.0, real=True))
    assert knobs_of(log2, None, "to_lightning") is None


def test_to_code_with_no_trial_takes_the_same_trial(make_bench):
    bench = make_bench()
    trial = bench.run(progress=False)
    assert trial.ok
    fast = row(0, 1e9, batch=32, real=True)
    fast.extra["model"] = bench.fingerprint
    bench.log.append(fast)
    bench.log.append(row(0, 1e9, batch=64, model="another model"))
    code = bench.to_code()
    assert "batch_size=8" in code.replace(" ", "") and "batch_size=32" not in code.replace(" ", "")
