"""Interleaved comparisons (workbench/deciding/interleave.py, results/stats.decide_interleaved): which pairs qualify,
the error rates under peeking (simulation, fixed seed), and real comparisons on a model whose step
sleeps (so a known slowdown stays a known ratio on a loaded machine)."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

import workbench as wb
from workbench.core.knobs import INTERLEAVE_KNOBS, KNOBS, Knobs
from workbench.deciding.interleave import InterleaveFailed, interleaved, why_not
from workbench.results.stats import decide_interleaved, interleave_alpha, trimmed

DELAY_S = 0.01  # the sleepy model's step: long against scheduling jitter on a busy 2-core machine


class Sleepy(torch.nn.Module):
    """A linear layer whose forward sleeps `delay` seconds: its speed is known whatever the load."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)
        self.delay = DELAY_S

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.delay)
        return self.lin(x)


@pytest.fixture
def sleepy():
    """(Workbench on the sleepy model, the user's model); registers `slowdown` (x1.5 sleep) and `poison` (NaN
    weights). One thread: a busy machine delays a step's thread wake-ups far less than a two-thread pool's."""

    @wb.knob(choices=[1.0, 1.5], help="sleep longer in forward")
    def slowdown(model, value):
        model.delay *= value

    @wb.knob(default=False, help="turns the weights to NaN, so the loss is NaN")
    def poison(model, value):
        if value:
            with torch.no_grad():
                model.lin.weight.fill_(float("nan"))

    model = Sleepy()
    data = TensorDataset(torch.randn(128, 8), torch.randint(0, 4, (128,)))
    bench = wb.Workbench(model, data, loss_fn=torch.nn.CrossEntropyLoss(), steps=3, warmup_steps=1,
                         optimizer=lambda p: torch.optim.SGD(p, lr=0.1), log=None, knobs=wb.Knobs(batch_size=16, cpu_threads=1))
    yield bench, model
    wb.forget_knob("slowdown")
    wb.forget_knob("poison")


# ---- which pairs interleave ------------------------------------------------------------------
def test_builtin_knobs_declare_whether_they_interleave():
    assert {n for n, s in KNOBS.items() if s.interleave and s.function is None} == INTERLEAVE_KNOBS
    for name in ("num_workers", "pin_memory", "prefetch_factor", "data", "world_size", "strategy"):
        assert not KNOBS[name].interleave


def test_why_not_names_the_reason():
    a = Knobs()
    assert why_not(a, a) is None
    assert why_not(a, a.replace(channels_last=True, amp="bf16", cpu_threads=1)) is None
    assert "data-pipeline" in why_not(a, a.replace(num_workers=2))
    assert "world_size" in why_not(a, a.replace(world_size=2))
    with pytest.raises(TypeError):
        why_not(a, "amp")


def test_user_knob_can_refuse_interleaving():
    @wb.knob(default=False, interleave=False)
    def global_flag(model, value):
        """sets a global flag"""

    try:
        assert not KNOBS["global_flag"].interleave
        reason = why_not(Knobs(), Knobs(global_flag=True))
        assert "global_flag" in reason and "interleave=False" in reason
    finally:
        wb.forget_knob("global_flag")
    with pytest.raises(TypeError, match="interleave"):
        wb.knob(default=False, interleave="yes")


# ---- the statistics: error rates with peeking -------------------------------------------------
def _sequential(rng, effect, sd, looks=20, every=8, margin=0.05, burst=0.0, build=0.0):
    """One simulated interleaved comparison: (answer, pairs) at its first decided look. `build`: the sd
    of what separates this run's two builds (model copies), one draw per comparison."""
    d = rng.normal(math.log(effect) + (rng.normal(0.0, build) if build else 0.0), sd, every * looks)
    if burst:  # some blocks land on another program's burst: a large one-sided outlier
        hit = rng.random(len(d)) < burst
        d[hit] += rng.choice([-1.0, 1.0], hit.sum()) * rng.uniform(0.3, 1.0, hit.sum())
    a = np.full(len(d), 100.0)
    b = a * np.exp(d)
    for look in range(1, looks + 1):
        n = look * every
        c = decide_interleaved(a[:n], b[:n], looks=looks, margin=margin, look_every=every)
        if c.answer != "undecided":
            return c.answer, n
    return "undecided", n


@pytest.mark.parametrize(("sd", "burst", "same_at_least"), [(0.10, 0.0, 0.85), (0.10, 0.2, 0.6), (0.05, 0.2, 0.9)])
def test_false_alarms_stay_under_five_percent_with_peeking(sd, burst, same_at_least):
    """Identical sides at `sd` per pair (with `burst` of the blocks hit by another program's bursts),
    and the two builds 0.8% apart (as measured between builds, stats.BUILD_NOISE): looked at up to 20
    times, stopping at the first decided look, 'faster' or 'slower' comes out at most 5% of the time,
    and "same" most of the time (the build noise costs some of it at 10% sd with bursts)."""
    rng = np.random.default_rng(34)
    runs = [_sequential(rng, 1.0, sd, burst=burst, build=0.008) for _ in range(400)]
    alarms = sum(ans in ("faster", "slower") for ans, _ in runs)
    assert alarms / len(runs) <= 0.05
    same = [n for ans, n in runs if ans == "same"]
    assert len(same) >= same_at_least * len(runs)  # identical sides called the same speed (160 pairs at most)


def test_build_noise_keeps_a_real_gap_between_builds_from_deciding():
    """Two builds of identical knobs 2.2% apart (one of 8 real builds was 2.4% apart), measured very
    precisely: the pairs alone would call it slower; with BUILD_NOISE it is the same speed within ±5%."""
    d = np.random.default_rng(3).normal(math.log(0.978), 0.02, 160)
    a = np.full(len(d), 100.0)
    c = decide_interleaved(a, a * np.exp(d))
    assert c.answer == "same"
    mean, se, _df = trimmed(d)
    assert abs(mean) > 4 * se  # the pairs' own standard error alone is far too small to cover the gap


def test_a_ten_percent_effect_is_called_in_the_right_direction():
    rng = np.random.default_rng(7)
    runs = [_sequential(rng, 0.90, 0.10) for _ in range(200)]
    assert sum(ans == "slower" for ans, _ in runs) >= 0.95 * len(runs)
    assert not any(ans == "faster" for ans, _ in runs)
    assert np.median([n for _, n in runs]) <= 32


def test_trimmed_mean_and_alpha():
    mean, se, df = trimmed([0.0, 0.1, 0.1, 0.1, 5.0])
    assert mean == pytest.approx(0.1) and df == 2 and se >= 0
    assert interleave_alpha(20) == pytest.approx(0.0025)
    with pytest.raises(ValueError):
        interleave_alpha(0)
    with pytest.raises(ValueError):
        decide_interleaved([1.0], [1.0])
    with pytest.raises(ValueError):
        decide_interleaved([1.0, 2.0], [1.0])


def test_undecided_says_what_would_settle_it():
    c = decide_interleaved([100, 104, 97, 101], [99, 103, 98, 104], a=1, b=2, seconds=2.0, turn_steps=4,
                           look_every=4)
    assert c.method == "interleaved" and c.turns == 4 and c.turn_steps == 4
    text = str(c)
    assert c.answer == "undecided" and "more pair" in text and "interleaved turns of 4 steps" in text
    assert "turns, median" in c._repr_html_()


# ---- real comparisons ---------------------------------------------------------------------------
@pytest.mark.slow
def test_known_slowdown_is_called_slower_in_seconds(sleepy):
    bench, model = sleepy
    a = bench.run(progress=False)
    b = bench.run(progress=False, slowdown=1.5)
    t0 = time.perf_counter()
    c = bench.compare(a, b, rounds="auto", budget_s=25)
    assert c.method == "interleaved", c
    assert c.answer == "slower", c
    assert time.perf_counter() - t0 < 30
    assert 0.45 < c.speedup < 0.85  # 1/1.5 = 0.67, blurred by sleep overshoot under load
    assert model.delay == DELAY_S and model.lin.weight.grad is None  # the user's model was never run
    logged = bench.log.comparisons[-1]  # the log keeps it
    assert (logged.method, logged.answer, logged.b_knobs) == ("interleaved", "slower", b.knobs)


@pytest.mark.slow
def test_identical_knobs_are_never_called_different(sleepy):
    bench, _ = sleepy
    k = bench.defaults
    c = interleaved(bench.workload, k, k, margin=0.25, budget_s=20, a_id=1, b_id=2)
    assert c.answer in ("same", "undecided"), c  # the error rate: never faster or slower (95%)
    assert c.answer == "same", c  # ±25% is wide enough to be shown on a loaded machine


def test_data_pipeline_pair_falls_back_to_trials(sleepy):
    bench, _ = sleepy
    a = bench.run(progress=False)
    b = bench.run(progress=False, num_workers=1)
    c = bench.compare(a, b, rounds="auto", max_rounds=1)
    assert c.method == "trials"
    assert c.note.startswith("By alternating trials: num_workers is a data-pipeline knob")
    with pytest.raises(ValueError, match="cannot interleave"):
        bench.compare(a, b, rounds="auto", interleave=True)
    with pytest.raises(TypeError):
        bench.compare(a, b, rounds="auto", interleave="yes")


def test_a_failing_side_ends_with_its_status(sleepy):
    bench, model = sleepy
    k = bench.defaults
    with pytest.raises(InterleaveFailed) as e:
        interleaved(bench.workload, k, k.replace(poison=True), budget_s=5)
    assert e.value.side == "B" and e.value.status == "nan"
    assert not math.isnan(float(model.lin.weight.detach().sum()))  # the user's model is untouched


def test_bad_arguments_are_refused(sleepy):
    bench, _ = sleepy
    k = bench.defaults
    with pytest.raises(ValueError, match="budget_s"):
        interleaved(bench.workload, k, k, budget_s=0)
    with pytest.raises(ValueError, match="turn_steps"):
        interleaved(bench.workload, k, k, turn_steps=0)
    with pytest.raises(ValueError, match="cannot interleave"):
        interleaved(bench.workload, k, k.replace(num_workers=1))


# ---- the comparison is a record ----------------------------------------------------------------
def test_comparisons_go_into_the_log_and_survive_a_restart(tmp_path):
    from workbench.results import LoggedComparison, ResultLog, parse_record
    from workbench.results.stats import decide_interleaved

    log = ResultLog(tmp_path / "log.jsonl")
    a, b = Knobs(batch_size=8), Knobs(batch_size=8, channels_last=True)
    c = decide_interleaved([100.0] * 8, [80.0, 81, 79, 80, 80, 82, 78, 80], a=1, b=2, seconds=4.0, turn_steps=3)
    assert c.answer == "slower"
    logged = log.record_comparison(c, a, b)
    again = ResultLog(tmp_path / "log.jsonl")  # a restarted kernel
    assert again.comparisons == [logged]
    got = again.comparisons[0]
    assert (got.method, got.answer, got.turns, got.a_knobs, got.b_knobs) == ("interleaved", "slower", 8, a, b)
    assert got.how == "interleaved, 8 pairs of turns, 4 s"
    assert again.decided(b, a) is got and again.decided(a, a) is None
    kind, value = parse_record(json_line(logged))
    assert kind == "comparison" and value == logged
    for bad in ({"method": "magic"}, {"speedup": -1}, {"a_knobs": {"batch_size": 0}}, {"note": 3}):
        with pytest.raises(ValueError):
            parse_record(json_line(logged, **bad))
    assert isinstance(logged, LoggedComparison)


def json_line(logged, **changes) -> str:
    import json

    return json.dumps({**logged.to_record(), **changes})


def test_the_table_verdict_uses_the_logged_comparison(make_bench):
    bench = make_bench()
    a = bench.run(progress=False)
    b = bench.run(progress=False, batch_size=16)
    before = bench.results.set_index("trial_id").loc[b.trial_id, "verdict"]
    c = decide_interleaved([100.0] * 8, [150.0, 151, 149, 150, 150, 152, 148, 150], a=a.trial_id, b=b.trial_id,
                           seconds=3.0, turn_steps=2)
    bench.log.record_comparison(c, a.knobs, b.knobs)
    row = bench.results.set_index("trial_id").loc[b.trial_id]
    assert row["verdict"] == c.answer and row["decided_speedup"] == pytest.approx(c.speedup)
    assert row["decided_by"].startswith("interleaved") and before in ("faster", "slower", "undecided", "same")


@pytest.mark.slow
def test_a_stop_ends_it_at_the_next_pair(sleepy):
    import threading

    bench, _ = sleepy
    k = bench.defaults
    stop = threading.Event()
    stop.set()
    with pytest.raises(InterleaveFailed) as e:  # stopped before two pairs: nothing to judge
        interleaved(bench.workload, k, k, budget_s=20, cancel=stop)
    assert e.value.status == "interrupted"
    stop.clear()
    threading.Timer(3.0, stop.set).start()
    t0 = time.perf_counter()
    c = interleaved(bench.workload, k, k, budget_s=60, margin=0.01, cancel=stop)  # ±1%: not decided in 3 s
    assert time.perf_counter() - t0 < 20 and "Stopped by the user" in c.note, c
