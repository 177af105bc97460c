"""steady.py: warm-up ends at steady state (the loader's buffer consumed, no trend), with a cap.

The rule is tested on synthetic step times (pure, no clocks); the promise is tested on SleepData
(tests/conftest.py), whose workers deliver at most num_workers / 1.5 ms samples/s however busy the
machine is: a trial that reads more than that measured the loader's buffer, not the pipeline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import ROOT, SLEEP_S, SleepData, TinyNet, workers_limit
from torch.utils.data import DataLoader, IterableDataset, TensorDataset, get_worker_info

import workbench as wb
from workbench.core.loadmeter import LoaderMeter
from workbench.core.steady import CAP_STEPS, FIXED_ENV, WarmupRule, cycle_steps, is_steady, loader_buffer
from workbench.core.step import build_loader
from workbench.core.workload import loader_spec


def ceiling(workers: int, steps: int = 30) -> float:
    """The most a steady `steps`-step window can read from `workers` SleepData workers: their
    limit, plus one loader cycle (a batch per worker) that may be ready when the window starts
    (2 workers: 1.07x, 4: 1.15x). A window that drains a compile's buffer reads 1.3-1.9x."""
    return workers_limit(workers) * steps / (steps - workers)


# ---- the loader's buffer ------------------------------------------------------------------------
def test_loader_buffer_is_workers_times_prefetch():
    data = TensorDataset(torch.zeros(8, 2))
    assert loader_buffer(DataLoader(data, batch_size=2))[0] == 0
    assert loader_buffer(DataLoader(data, batch_size=2, num_workers=2))[0] == 4  # torch's default prefetch 2
    n, text = loader_buffer(DataLoader(data, batch_size=2, num_workers=3, prefetch_factor=8))
    assert n == 24 and "3 workers x prefetch_factor 8" in text


def test_loader_buffer_says_what_it_assumed():
    n, text = loader_buffer(object())
    assert n == 0 and "assumed" in text

    class Odd:
        num_workers = 2
        prefetch_factor = None

    n, text = loader_buffer(Odd())
    assert n == 4 and "assumed" in text


def test_cycle_steps_counts_optimizer_steps_per_round_of_workers():
    assert cycle_steps(0) == 1 and cycle_steps(4) == 4 and cycle_steps(4, accum_steps=2) == 2 and cycle_steps(2, 4) == 1


# ---- the trend test -----------------------------------------------------------------------------
def test_is_steady_compares_the_halves():
    assert is_steady([0.01] * 8) == (True, "")
    steady, why = is_steady([0.001] * 4 + [0.012] * 4)
    assert not steady and "slowing" in why
    steady, why = is_steady([0.01] * 8, [0.0] * 4 + [0.008] * 4)
    assert not steady and "data-wait share" in why


def test_is_steady_uses_whole_loader_cycles():
    bursts = [0.023, 0.001] * 4 + [0.023]  # two workers in step: a long wait, then a ready batch
    assert is_steady(bursts, cycle=2)[0]  # halves of 4 = two cycles each, the odd step left out


@pytest.mark.parametrize("kwargs", [dict(times_s=[0.1]), dict(times_s=[0.1] * 4, tolerance=0),
                                    dict(times_s=[0.1] * 4, cycle=0), dict(times_s=[0.1] * 4, waits_s=[0.0])])
def test_is_steady_rejects_bad_input(kwargs):
    with pytest.raises(ValueError):
        is_steady(**kwargs)


# ---- the rule on synthetic steps ----------------------------------------------------------------
def run_rule(rule: WarmupRule, steps) -> WarmupRule:
    for t, w, *event in steps:
        if rule.done():
            break
        rule.observe(t, w, *event)
    return rule


def test_a_compute_bound_trial_warms_past_the_first_step_and_a_trend_window():
    rule = run_rule(WarmupRule(min_steps=2), [(5.0, 0.0)] + [(0.01, 0.0)] * 50)
    assert rule.ended == "steady" and rule.steps == 1 + rule.needed() and rule.note() is None
    assert rule.outcome()["last_slow_step"] == 1 and "first step" in rule.outcome()["last_slow"]


def test_the_buffer_is_drained_before_warm_up_ends():
    """After a 5 s compile, 16 buffered batches come fast; the window must not start among them."""
    drain = [(5.0, 0.0)] + [(0.001, 0.0)] * 20 + [(0.012, 0.011)] * 60
    rule = run_rule(WarmupRule(min_steps=5, buffer_batches=16, num_workers=2), drain)
    assert rule.ended == "steady" and rule.steps >= 21 + rule.needed() - rule.buffer_steps
    assert all(t == 0.012 for t in rule.times_s[-2 * rule.half:])  # the trend window is past the buffer
    assert rule.outcome()["buffer_batches"] == 16


def test_a_pause_counts_as_a_slow_step_when_a_buffer_can_refill():
    steps = [(1.0, 0.0)] + [(0.01, 0.0)] * 4 + [(0.5, 0.0)] + [(0.01, 0.0)] * 40
    rule = run_rule(WarmupRule(min_steps=5, buffer_batches=4, num_workers=2), steps)
    assert rule.ended == "steady" and rule.outcome()["last_slow_step"] == 6 and "neighbours" in rule.reason
    assert rule.steps == 6 + rule.needed()
    # without workers a pause refills nothing: the same count as a trial without the pause
    rule = run_rule(WarmupRule(min_steps=5), steps)
    assert rule.ended == "steady" and rule.steps == 1 + rule.needed()


def test_one_pause_in_a_half_is_not_a_trend():
    assert is_steady([0.01, 0.01, 0.01, 0.01, 0.01, 0.2, 0.01, 0.01])[0]


def test_an_endless_trend_hits_the_cap_and_says_so():
    growing = [(1.0, 0.0)] + [(0.001 * 1.1 ** i, 0.0) for i in range(300)]
    rule = run_rule(WarmupRule(min_steps=5, cap_s=1e9), growing)
    assert rule.ended == "cap" and rule.steps == CAP_STEPS
    assert rule.note().startswith("warm-up cap:") and "slowing" in rule.note()


def test_the_cap_in_seconds_ends_warm_up():
    growing = [(1.0, 0.0)] + [(0.1 * 1.1 ** i, 0.0) for i in range(100)]
    rule = run_rule(WarmupRule(min_steps=1, cap_s=2.0), growing)
    assert rule.ended == "cap" and rule.steps < 20 and "warm-up cap" in rule.note()


@pytest.mark.parametrize("workers, prefetch, accum, probe", [(0, None, 1, True), (2, 8, 1, True), (4, None, 2, False)])
def test_planned_warmup_is_what_a_quiet_trial_takes(workers, prefetch, accum, probe):
    from workbench.core.steady import planned_warmup

    buffer = workers * (prefetch or 2)
    rule = WarmupRule(min_steps=5, buffer_batches=buffer, num_workers=workers, accum_steps=accum)
    steps = [(2.0, 0.0)] + [(0.01, 0.0, "memory probe" if probe and i == 0 else None) for i in range(100)]
    run_rule(rule, steps)
    assert rule.ended == "steady"
    assert planned_warmup(5, num_workers=workers, prefetch_factor=prefetch, accum_steps=accum, probe=probe) == rule.steps
    assert planned_warmup(0, num_workers=2) == 0 and planned_warmup(50) == 50


def test_fixed_warmup_restores_the_count(monkeypatch):
    monkeypatch.setenv(FIXED_ENV, "1")
    rule = run_rule(WarmupRule.for_loader(DataLoader(TensorDataset(torch.zeros(8, 2)), num_workers=2), 3),
                    [(5.0, 0.0)] * 10)
    assert rule.ended == "fixed" and rule.steps == 3 and rule.note() is None
    monkeypatch.setenv(FIXED_ENV, "0")
    assert not WarmupRule.for_loader(None, 3).fixed


def test_no_warm_up_asked_is_flagged():
    rule = run_rule(WarmupRule(min_steps=0), [(1.0, 0.0)])
    assert rule.steps == 0 and rule.note().startswith("not steady: warmup_steps=0")


def test_short_epochs_are_part_of_the_steady_state():
    """An epoch shorter than warm-up cannot be waited out: its boundary is not a slow step."""
    def epochs(rule):
        return run_rule(rule, [(1.0, 0.0)] + [(0.01, 0.0, "epoch start" if i % 5 == 4 else None) for i in range(99)])

    short = epochs(WarmupRule(min_steps=2, epoch_steps=5))
    assert short.ended == "steady" and not short.epoch_is_slow and short.steps < 20
    long = epochs(WarmupRule(min_steps=2, epoch_steps=None))  # unknown length: every start is slow
    assert long.ended == "cap" or long.outcome()["last_slow"] == "epoch start"


def test_short_epochs_with_workers_restarting_each_epoch_still_reach_steady_state():
    """Non-persistent workers start again at every epoch: with a buffer to refill, that step is far
    above its neighbours, yet it recurs every 6 steps (fewer than the rule needs after a slow step), so
    it must not count as slow: the rule ends at steady state, not at the 200-step cap."""
    def epochs(rule):
        return run_rule(rule, [(1.0, 0.0)] + [(0.13 if i % 6 == 5 else 0.01, 0.0, "epoch start" if i % 6 == 5 else None)
                                              for i in range(299)])

    short = epochs(WarmupRule(min_steps=2, buffer_batches=4, num_workers=2, epoch_steps=6))
    assert not short.epoch_is_slow and short.ended == "steady" and short.steps < 60, short.outcome()
    assert short.outcome()["last_slow_step"] == 1, short.outcome()
    # a slow step between two epoch starts is still found (a recompile): warm-up goes on past it
    spike = [(1.0, 0.0)] + [(0.13 if i % 6 == 5 or i == 40 else 0.01, 0.0, "epoch start" if i % 6 == 5 else None)
                            for i in range(299)]
    late = run_rule(WarmupRule(min_steps=45, buffer_batches=4, num_workers=2, epoch_steps=6), spike)
    assert late.ended == "steady" and late.outcome()["last_slow_step"] == 42, late.outcome()


def test_an_iterable_of_unknown_length_gets_a_rule():
    class Stream(IterableDataset):
        def __iter__(self):
            return iter(torch.zeros(4, 2))

    rule = WarmupRule.for_loader(DataLoader(Stream(), batch_size=2, num_workers=2, prefetch_factor=3), 5)
    assert rule.buffer_batches == 6 and rule.epoch_steps is None


@pytest.mark.parametrize("kwargs", [dict(min_steps=-1), dict(min_steps=1.5), dict(min_steps=1, accum_steps=0),
                                    dict(min_steps=1, buffer_batches=-2), dict(min_steps=1, cap_steps=0)])
def test_the_rule_rejects_bad_settings(kwargs):
    with pytest.raises(ValueError):
        WarmupRule(**kwargs)


def test_observe_rejects_a_bad_time():
    with pytest.raises(ValueError, match="finite"):
        WarmupRule(min_steps=1).observe(float("nan"))


# ---- the promise, on a data-bound pipeline --------------------------------------------------------
class SleepStream(IterableDataset):
    """SleepData as a stream of unknown length, each worker reading its own share."""

    def __init__(self, n: int = 4096) -> None:
        self.data = SleepData(n)

    def __iter__(self):
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return (self.data[i] for i in range(start, len(self.data), step))


@pytest.fixture(autouse=True)
def steady_warmup(monkeypatch):
    """These tests are about the steady rule: never the fixed count, whatever the caller's environment."""
    monkeypatch.delenv(FIXED_ENV, raising=False)


def sleep_bench(data=None, **kw) -> wb.Workbench:
    return wb.Workbench(TinyNet(), data if data is not None else SleepData(), loss_fn=torch.nn.CrossEntropyLoss(),
                        optimizer=lambda p: torch.optim.SGD(p, lr=0.05), log=None, device="cpu",
                        steps=kw.pop("steps", 30), warmup_steps=kw.pop("warmup_steps", 5),
                        knobs=wb.Knobs(batch_size=16, cpu_threads=1), **kw)


CONFIGS = {
    "2x2": dict(num_workers=2, prefetch_factor=2),
    "2x8": dict(num_workers=2, prefetch_factor=8),
    "4x4": dict(num_workers=4, prefetch_factor=4),
    "4x8": dict(num_workers=4, prefetch_factor=8),
    "persistent": dict(num_workers=2, prefetch_factor=8, persistent_workers=True),
}


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_no_trial_reads_more_than_the_workers_deliver():
    """Every configuration, and a second trial right after the first (its buffer full at start)."""
    bench = sleep_bench()
    for name, knobs in CONFIGS.items():
        for _ in range(2):
            r = bench.run(**knobs)
            limit = ceiling(knobs["num_workers"])
            rule = r.extra["warmup_rule"]
            assert r.ok and r.samples_per_s <= limit, (name, r.samples_per_s, limit, rule, r.notes)
            assert rule["rule"] == "steady" and rule["steps"] >= 5 and rule["reason"]


@pytest.mark.slow
def test_an_epoch_boundary_in_the_window_and_a_stream_stay_below_the_limit():
    epoch = sleep_bench(SleepData(16 * 40), steps=30)  # 40 batches an epoch: warm-up + window cross one
    r = epoch.run(num_workers=2, prefetch_factor=4)
    assert r.ok and r.samples_per_s <= ceiling(2), r.extra["warmup_rule"]
    r = sleep_bench(SleepStream()).run(num_workers=2, prefetch_factor=8)
    assert r.ok and r.samples_per_s <= ceiling(2), r.extra["warmup_rule"]
    assert r.extra["warmup_rule"]["epoch_steps"] is None


FIRST_COMPILED = textwrap.dedent("""
    import json, sys, torch
    sys.path.insert(0, {tests!r})
    from conftest import SleepData, TinyNet
    import workbench as wb
    bench = wb.Workbench(TinyNet(), SleepData(), loss_fn=torch.nn.CrossEntropyLoss(), log=None, device="cpu",
                         optimizer=lambda p: torch.optim.SGD(p, lr=0.05), steps=30, warmup_steps=5,
                         knobs=wb.Knobs(batch_size=16, cpu_threads=1))
    r = bench.run(num_workers=2, prefetch_factor=8, compile="default")
    print(json.dumps(dict(ok=r.ok, rate=r.samples_per_s, rule=r.extra["warmup_rule"], message=r.message,
                          compile_s=r.compile_s)))
""")


@pytest.mark.slow
def test_the_first_compiled_trial_in_a_process_is_not_the_buffer():
    """The compile step lets two workers fill 16 batches; the old fixed warm-up read 1.9x too much."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(FIXED_ENV, None)
    out = subprocess.run([sys.executable, "-c", FIRST_COMPILED.format(tests=str(ROOT / "tests"))], env=env,
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["ok"], r["message"]
    assert r["rate"] <= ceiling(2), r
    assert r["rule"]["steps"] > 16 and r["rule"]["buffer_batches"] == 16


def test_sleep_data_has_the_promised_latency():
    assert SleepData(4).sleep_s == SLEEP_S and workers_limit(2) == pytest.approx(1333.3, abs=0.1)


# ---- the loader-limit check -----------------------------------------------------------------------
def test_the_loader_meter_measures_what_the_workers_can_deliver():
    meter = LoaderMeter(2)
    assert meter.limit(16) is None
    loader = build_loader(loader_spec(SleepData(64)), wb.Knobs(batch_size=16, num_workers=2), seed=0,
                          device=torch.device("cpu"), meter=meter)
    assert sum(len(x) for x, _ in loader) == 64
    busy, batches = meter.read()
    assert batches == 4 and busy >= 64 * SLEEP_S  # sleeps only overshoot
    assert meter.limit(16) <= workers_limit(2) * 1.001
    stream = build_loader(loader_spec(SleepStream(32)), wb.Knobs(batch_size=16, num_workers=2), seed=0,
                          device=torch.device("cpu"), meter=LoaderMeter(2))
    assert sum(len(x) for x, _ in stream) == 32
    with pytest.raises(ValueError):
        LoaderMeter(0)


def pause_first_step(seconds: float):
    """A step_fn whose first trial step waits `seconds` (what a compile does to the loader), then
    trains (call 1 is the Workbench's construction probe)."""
    calls = [0]

    def step_fn(model, batch):
        import time

        calls[0] += 1
        if calls[0] == 2:
            time.sleep(seconds)
        x, y = batch
        return torch.nn.functional.cross_entropy(model(x), y)

    return step_fn


@pytest.mark.slow
def test_a_window_that_drains_the_buffer_is_flagged_and_the_rule_avoids_it(monkeypatch):
    """A 1.2 s first step lets two workers (4 ms a sample: 64 ms a batch) buffer 16 batches. With the
    old fixed warm-up the window drains them and reads far above the workers' limit (~1.8x): flagged.
    The steady rule drains them first."""
    knobs = dict(num_workers=2, prefetch_factor=8)
    slow = 0.004
    monkeypatch.setenv(FIXED_ENV, "1")
    fixed = sleep_bench(SleepData(2048, slow), step_fn=pause_first_step(1.2)).run(**knobs)
    assert fixed.ok and fixed.samples_per_s > ceiling(2) * SLEEP_S / slow, fixed.extra
    assert fixed.extra["steady"] is False and any("faster than the loader" in n for n in fixed.notes), fixed.notes
    assert fixed.extra["loader_limit_samples_per_s"] <= workers_limit(2, slow) * 1.001
    monkeypatch.delenv(FIXED_ENV)
    steady = sleep_bench(SleepData(2048, slow), step_fn=pause_first_step(1.2)).run(**knobs)
    assert steady.ok and steady.samples_per_s <= ceiling(2) * SLEEP_S / slow, steady.extra["warmup_rule"]
    assert not any("faster than the loader" in n for n in steady.notes), steady.notes


# ---- decisions read steady figures ----------------------------------------------------------------
def test_the_tuner_repeats_a_trial_that_was_not_steady():
    from workbench.core.measure import TrialResult
    from workbench.search.race import Ctx

    class Stub:
        calls = 0

        def run(self, knobs):
            Stub.calls += 1
            return TrialResult(knobs=knobs, status="ok", samples_per_s=100.0 * Stub.calls,
                               extra={"steady": Stub.calls > 1})

    ctx = Ctx(Stub(), limit=10, budget_s=None, memory_cap=None, max_bytes=None)
    r = ctx.run(wb.Knobs())
    assert r.steady is True and r.samples_per_s == 200.0 and ctx.used == 2
    assert ctx.run(wb.Knobs()).steady is True and ctx.used == 3  # a steady trial is not repeated


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_compile_on_top_of_data_bound_workers_is_never_a_win():
    """The first compiled trial used to read the buffer (1.9x); now it reads the workers' rate."""
    bench = sleep_bench()
    workers = bench.run(num_workers=2, prefetch_factor=8)
    compiled = bench.run(num_workers=2, prefetch_factor=8, compile="default")
    assert workers.ok and compiled.ok, compiled.message
    c = bench.compare(workers, compiled)
    assert not (c.differs and c.speedup > 1), str(c)
    assert compiled.samples_per_s <= ceiling(2)


@pytest.mark.slow
def test_a_window_that_was_not_steady_is_measured_again(make_bench, monkeypatch):
    """A window faster than its loader: its steps become warm-up; the result says why; at most
    MAX_REMEASURE more windows. A trend alone is flagged, not measured again."""
    from workbench.core import phases as runner  # the re-measure loop lives in phases.py

    real = runner.window_problems
    seen = []

    def first_unsteady(raw, knobs):
        seen.append(raw)
        return [runner.LOADER_NOTE + ": planted"] if len(seen) == 1 else real(raw, knobs)

    monkeypatch.setattr(runner, "window_problems", first_unsteady)
    r = make_bench(steps=4, warmup_steps=2).run()
    rule = r.extra["warmup_rule"]
    assert r.ok and rule["remeasured"] == [runner.LOADER_NOTE + ": planted"]
    assert r.extra["warmup_steps"] == rule["steps"] + 4
    monkeypatch.setattr(runner, "window_problems", lambda raw, knobs: ["not steady: a trend"])
    assert "remeasured" not in make_bench(steps=4, warmup_steps=2).run().extra["warmup_rule"]
    monkeypatch.setattr(runner, "window_problems", lambda raw, knobs: [runner.LOADER_NOTE])
    r = make_bench(steps=4, warmup_steps=2).run()
    assert len(r.extra["warmup_rule"]["remeasured"]) == runner.MAX_REMEASURE and r.steady is False
    assert any("not steady after 2 more window(s)" in n for n in r.notes), r.notes


@pytest.mark.slow  # worker start-ups at every short epoch
def test_a_users_dataloader_with_its_own_sampler_gets_a_rule_that_says_what_it_assumed():
    """Bad input keeps its promise: the rule reads the loader the trial really built, and terminates."""
    data = SleepData(64, sleep_s=0.0)
    loader = DataLoader(data, batch_size=8, sampler=list(reversed(range(64))), num_workers=0)
    bench = wb.Workbench(TinyNet(), loader, loss_fn=torch.nn.CrossEntropyLoss(), log=None, device="cpu",
                         optimizer=lambda p: torch.optim.SGD(p, lr=0.05), steps=3, warmup_steps=1)
    r = bench.run()
    rule = r.extra["warmup_rule"]
    assert r.ok and rule["ended"] in ("steady", "cap") and "nothing is buffered" in rule["buffer"]
    r = bench.run(num_workers=2)  # prefetch_factor None: torch's default, and the text says so
    assert r.ok and r.extra["warmup_rule"]["buffer_batches"] == 4 and "prefetch_factor 2" in r.extra["warmup_rule"]["buffer"]
