"""tune.py: the racing search (against a seeded fake bench), its budget, headroom and DDP stage; fit_memory."""

from __future__ import annotations

import dataclasses
import math
import random
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import workbench as wb
from workbench.core.measure import TrialResult
from workbench.core.workload import Workload
from workbench.results import ResultLog
from workbench.search import race as race_mod
from workbench.search import tune as tune_mod
from workbench.search.fit import FitResult, fit_memory
from workbench.search.tune import TuneResult, stage_options, tune

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from _space import exhaustive_space


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(16, 256), nn.ReLU()),
                                     nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 16))])
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def data(n: int = 256) -> TensorDataset:
    return TensorDataset(torch.randn(n, 16), torch.randint(0, 4, (n,)))


class FakeBench:
    """A bench whose trials are a pure function of the knobs (times a seeded log-normal noise).

    `speed(knobs)` gives seconds per sample, `peak(knobs)` bytes; a peak over `oom_at` is an OOM.
    Each trial advances `clock` by one second, so budget_s can be tested without real time.
    """

    def __init__(self, speed, peak, oom_at: float = float("inf"), defaults: wb.Knobs | None = None,
                 noise: float = 0.0, conv: bool = False, seed: int = 0, wait=None, copy=None,
                 cores: int | None = None) -> None:
        self.workload = Workload(Net(), data(), loss_fn=nn.CrossEntropyLoss(), device="cpu")
        self.workload.has_conv = conv
        if cores is not None:  # the device facts' cores (tune's worker counts read them)
            self.workload.facts = dataclasses.replace(self.workload.facts, cores=cores)
        self.device = torch.device("cpu")
        self.defaults = defaults or wb.Knobs(batch_size=16)
        self.log = ResultLog(None)
        self.speed, self.peak, self.oom_at = speed, peak, oom_at
        self.rng, self.noise, self.clock = random.Random(seed), noise, 0.0
        self.wait = wait or (lambda k: 0.0)  # data-wait share of a trial's window
        self.copy = copy or (lambda k: None)  # the host->device copy's part of it

    def run(self, knobs: wb.Knobs, **kwargs) -> TrialResult:  # cancel, stop_early: a fake trial ignores them
        self.clock += 1.0
        peak = self.peak(knobs)
        if peak > self.oom_at:
            r = TrialResult(knobs=knobs, status="oom", message="out of memory")
        else:
            jitter = math.exp(self.rng.gauss(0, self.noise)) if self.noise else 1.0
            step = self.speed(knobs) * knobs.batch_size * knobs.accum_steps * jitter
            times = tuple(step * (1 + 0.005 * ((i % 3) - 1)) for i in range(10))
            r = TrialResult(knobs=knobs, status="ok", samples_per_s=knobs.batch_size * knobs.accum_steps / step,
                            step_time_s=step, step_times_s=times, samples_per_step=knobs.batch_size * knobs.accum_steps,
                            peak_memory_bytes=int(peak), data_wait_share=self.wait(knobs),
                            copy_share=self.copy(knobs))
        return self.log.append(r)

    @property
    def trials(self):
        return self.log.trials

    @property
    def _facts(self):
        return self.workload.facts


def speed_model(k: wb.Knobs) -> float:
    """Workers help (1 best), prefetch does nothing, batch 32 helps, 64 helps no more."""
    s = 1.0
    if k.num_workers == 1:
        s *= 0.5
    elif k.num_workers == 2:
        s *= 0.8  # two workers on two cores: oversubscribed
    if k.batch_size >= 32:
        s *= 0.7
    return s / 1000


def interaction(k: wb.Knobs) -> float:
    """channels_last alone and batch 32 alone do nothing; together 1.45x (the cnn case)."""
    return 1e-3 / (1.45 if (k.channels_last and k.batch_size == 32) else 1.0)


def test_tune_finds_an_interaction_of_two_knobs_neutral_alone():
    bench = FakeBench(interaction, lambda k: 1000 * k.batch_size, conv=True, noise=0.03)
    res = tune(bench, n_trials=60, stages=("data", "precision", "batch"))
    assert isinstance(res, TuneResult)
    assert res.best_knobs.channels_last and res.best_knobs.batch_size == 32, str(res)
    assert res.answer == "faster" and res.speedup == pytest.approx(1.45, rel=0.1)
    assert res.trials_used == len(bench.trials) <= 60
    assert "kept: faster than the start" in set(res.steps["decision"].str.split(" [(]").str[0])
    assert "Tuned in" in str(res) and "<table" in res._repr_html_()


def stack_model(k: wb.Knobs) -> float:
    """optimizer foreach alone and 1 thread alone are neutral, together 1.4x (not a listed pair)."""
    return 1e-3 / (1.4 if (k.optimizer_impl == "foreach" and k.cpu_threads == 1) else 1.0)


def test_tune_stacks_near_misses_beyond_the_listed_pairs():
    bench = FakeBench(stack_model, lambda k: 1000.0, noise=0.02, seed=1)
    res = tune(bench, n_trials=120, stages=("data", "kernels"))
    assert res.answer == "faster"
    assert res.best_knobs.optimizer_impl == "foreach" and res.best_knobs.cpu_threads == 1, str(res)
    assert "stack" in set(res.steps["stage"])


def test_tune_races_spend_trials_on_contenders_only():
    bench = FakeBench(speed_model, lambda k: 1000 * k.batch_size, noise=0.02)
    res = tune(bench, n_trials=60, stages=("data", "batch"))
    assert res.best_knobs.num_workers == 1 and res.best_knobs.batch_size >= 32 and res.answer == "faster"
    assert res.speedup == pytest.approx(1 / (0.5 * 0.7), rel=0.1)
    per = pd.Series([r.knobs for r in bench.trials]).value_counts()
    slow = wb.Knobs(batch_size=8)  # half the batch is no faster and twice as slow as the leader: dropped early
    assert per[slow] < per[res.best_knobs]
    assert res.steps["decision"].str.startswith("dropped").any()
    # the seeds' order: data candidates enter before batch candidates
    stages = [s for s in res.steps["stage"] if s in ("data", "batch")]
    assert stages.index("batch") > stages.index("data")


def test_nothing_beats_the_start_is_a_confirmed_same_speed():
    bench = FakeBench(lambda k: 1e-3, lambda k: 1000.0, noise=0.01)
    res = tune(bench, n_trials=60, stages=("data", "precision"))
    assert res.best_knobs == bench.defaults and res.answer == "same", str(res)
    assert res.steps["decision"].str.startswith("nothing beats the start").any()
    assert res.speedup == 1.0  # the start kept: no change, whatever its trials' noise


def test_tune_budget_in_seconds_and_trial_cap(fake_clock):
    bench = fake_clock(FakeBench(speed_model, lambda k: 1000 * k.batch_size, noise=0.02))
    res = tune(bench, budget_s=12, stages=("data", "precision", "batch"))
    assert res.trials_used == len(bench.trials) <= 12 and res.budget_s == 12
    assert res.best_knobs.num_workers == 1  # the seeds' order puts the best data change in the first race
    bench = FakeBench(speed_model, lambda k: 1000 * k.batch_size)
    res = tune(bench, n_trials=3, stages=("data",))
    assert res.trials_used <= 3 and len(bench.trials) <= 3
    bench = fake_clock(FakeBench(speed_model, lambda k: 1000 * k.batch_size))
    res = tune(bench, budget_s=0.5, stages=("data",))  # smaller than one trial: the start alone, and why
    assert len(bench.trials) == 1 and res.steps["decision"].str.contains("the start alone took 1.0 s").any()
    assert "budget: start 1.0 s" in str(res)
    with pytest.raises(ValueError, match="finite"):
        tune(bench, budget_s=float("nan"))


def test_tune_batch_stage_keeps_headroom_below_memory():
    bench = FakeBench(lambda k: 1e-3 / (1 + k.batch_size / 16), lambda k: 1000 * k.batch_size, noise=0.01)
    res = tune(bench, n_trials=30, stages=("batch",), max_bytes=70_000)  # 64 x 1 kB = 64 kB > 90% of 70 kB
    assert res.best_knobs.batch_size == 32, str(res)
    assert all(r.knobs.batch_size <= 32 for r in bench.trials)  # predicted over the headroom: never run
    assert res.steps["decision"].str.contains("headroom").any()
    bench = FakeBench(lambda k: 1e-3 / (1 + k.batch_size / 16), lambda k: 1000 * k.batch_size, noise=0.01)
    res = tune(bench, n_trials=30, stages=("batch",), max_bytes=70_000, headroom=0.0)
    assert res.best_knobs.batch_size == 64


def test_tune_batch_search_is_oom_safe():
    bench = FakeBench(lambda k: 1e-3 / (1 + k.batch_size / 16), lambda k: 1000 * k.batch_size, oom_at=40_000)
    res = tune(bench, n_trials=20, stages=("batch",))
    assert res.best_knobs.batch_size == 32  # 64 runs out of memory: rejected
    assert res.steps["decision"].str.startswith("rejected: oom").any()


def test_tune_validates_inputs():
    bench = FakeBench(speed_model, lambda k: 1.0)
    with pytest.raises(ValueError, match="n_trials"):
        tune(bench, n_trials=1)
    with pytest.raises(ValueError, match="budget_s"):
        tune(bench, budget_s=0)
    with pytest.raises(ValueError, match="stage"):
        tune(bench, stages=("magic",))
    with pytest.raises(ValueError, match="headroom"):
        tune(bench, headroom=1.5)


def test_answer_adapter_maps_comparisons_and_prefers_answer(monkeypatch):
    bench = FakeBench(lambda k: 1e-3, lambda k: 1.0, noise=0.01)
    a = [bench.run(bench.defaults) for _ in range(12)]
    b = [bench.run(bench.defaults.replace(batch_size=32)) for _ in range(12)]
    assert race_mod.answer_of(a, b, log=bench.log)[0] == "same"
    fast = FakeBench(lambda k: 1e-3 / (2 if k.batch_size == 32 else 1), lambda k: 1.0, noise=0.01)
    a, b = [fast.run(fast.defaults) for _ in range(3)], [fast.run(fast.defaults.replace(batch_size=32)) for _ in range(3)]
    assert race_mod.answer_of(a, b, log=fast.log)[0] == "faster" and race_mod.answer_of(b, a, log=fast.log)[0] == "slower"

    class Decided:
        answer = "undecided"

    monkeypatch.setattr(race_mod, "compare", lambda *a, **k: Decided())
    assert race_mod.answer_of(a, b)[0] == "undecided"  # issue 16's Comparison.answer wins once it exists


def test_stage_options_prune_for_the_device():
    bench = FakeBench(speed_model, lambda k: 1.0)
    precision = stage_options(bench, "precision", bench.defaults)
    assert {"amp": "fp16"} not in precision  # fp16 on CPU is a trap
    assert {"channels_last": True} not in precision  # no convolutions here
    data_opts = stage_options(bench, "data", bench.defaults)
    assert data_opts[0]["num_workers"] >= 1 and data_opts[0]["persistent_workers"]
    assert stage_options(bench, "ddp", bench.defaults) == []  # buckets only under DDP
    buckets = stage_options(bench, "ddp", bench.defaults.replace(world_size=2))
    assert [c["ddp_bucket_cap_mb"] for c in buckets] == [1, 5, 50, 100]
    space = exhaustive_space(bench, stages=("data", "precision", "batch"))
    assert len(space) == len(set(space)) and bench.defaults in space
    assert wb.Knobs(batch_size=32) in space and wb.Knobs(batch_size=64) in space


def test_fit_memory_follows_rescue_order_and_keeps_effective_batch():
    def peak(k: wb.Knobs) -> float:
        act = 1000 * k.batch_size * (0.6 if k.amp == "bf16" else 1.0) * (0.5 ** len(k.checkpoint))
        return 5000 + act

    bench = FakeBench(lambda k: 1e-3 * (1 + 0.3 * len(k.checkpoint)), peak)
    fit = fit_memory(bench, max_bytes=12_000, effective_batch=64)
    assert isinstance(fit, FitResult) and fit.fits
    assert fit.knobs.batch_size * fit.knobs.accum_steps == 64
    assert fit.result.peak_memory_bytes <= 12_000
    assert list(fit.steps["step"])[:2] == ["start", "amp"]
    assert "accumulation" in set(fit.steps["step"])
    assert fit.steps["time_cost"].iloc[0] == pytest.approx(1.0)
    assert "Fits" in str(fit) and fit.to_code().startswith("#")
    nothing = fit_memory(FakeBench(lambda k: 1e-3, lambda k: 1e9), max_bytes=10, effective_batch=16, max_trials=4)
    assert not nothing.fits and len(nothing.steps) <= 4 and "nothing fits" in str(nothing)
    with pytest.raises(ValueError, match="max_bytes"):
        fit_memory(bench, max_bytes=0, effective_batch=8)
    with pytest.raises(ValueError, match="effective_batch"):
        fit_memory(bench, max_bytes=10, effective_batch=0)


def test_fit_memory_keeps_headroom_below_the_budget():
    def peak(k: wb.Knobs) -> float:
        return 1000 * k.batch_size  # 64 -> 64 kB, 32 -> 32 kB

    edge = FakeBench(lambda k: 1e-3, peak)
    assert fit_memory(edge, max_bytes=66_000, effective_batch=64, headroom=0.0).knobs.batch_size == 64
    fit = fit_memory(FakeBench(lambda k: 1e-3, peak), max_bytes=66_000, effective_batch=64)  # 10% by default
    assert fit.fits and fit.result.peak_memory_bytes <= 0.9 * 66_000 and fit.knobs.accum_steps > 1
    assert any("headroom" in n for n in fit.notes)
    with pytest.raises(ValueError, match="headroom"):
        fit_memory(edge, max_bytes=66_000, effective_batch=64, headroom=1.0)


class Wide(nn.Module):
    """Few parameters, wide activations: memory that accumulation and checkpointing can cut."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[nn.Sequential(nn.Linear(16, 1024), nn.ReLU(), nn.Linear(1024, 16))
                                      for _ in range(2)])
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.blocks(x))


@pytest.mark.slow
def test_fit_memory_real_model_reaches_a_budget():
    bench = wb.Workbench(Wide(), data(), loss_fn=nn.CrossEntropyLoss(), optimizer=lambda p: torch.optim.SGD(p, lr=0.01),
                         log=None, steps=3, warmup_steps=1, knobs=wb.Knobs(batch_size=128), device="cpu")
    full = bench.run()
    budget = int(full.peak_memory_bytes * 0.7)
    fit = bench.fit_memory(budget, 128)
    assert fit.fits, str(fit)
    assert fit.result.peak_memory_bytes <= budget
    assert fit.knobs.batch_size * fit.knobs.accum_steps == 128
    assert all(t in bench.results["trial_id"].tolist() for t in fit.steps["trial"])


@pytest.mark.slow
def test_tune_real_bench_lands_every_trial_in_results():
    bench = wb.Workbench(Net(), data(), loss_fn=nn.CrossEntropyLoss(), log=None, steps=3, warmup_steps=1,
                         knobs=wb.Knobs(batch_size=16), device="cpu")
    res = bench.tune(n_trials=4, stages=("data", "batch"))
    assert res.trials_used <= 4 and len(bench.results) == res.trials_used
    ran = set(res.steps["trial"].dropna().astype(int))  # decision rows (dropped, not entered) name no trial
    assert ran and ran <= set(bench.results["trial_id"])


@pytest.mark.slow
def test_tune_races_ddp_bucket_sizes_on_two_gloo_ranks():
    bench = wb.Workbench(Net(), data(), loss_fn=nn.CrossEntropyLoss(), log=None, steps=4, warmup_steps=1,
                         knobs=wb.Knobs(batch_size=16, world_size=2), device="cpu", collective_timeout_s=30.0)
    res = bench.tune(n_trials=14, stages=("ddp",))
    assert all(r.knobs.world_size == 2 and r.ok for r in bench.log.trials), str(res)
    raced = {r.knobs.ddp_bucket_cap_mb for r in bench.log.trials}
    assert {None, 1, 5, 50, 100} <= raced  # torch's default and every candidate size ran on 2 ranks
    c = res.confirmation  # the answer is the confirmation's: faster keeps the winner, same/slower keep the start
    assert c is not None and res.answer == {"faster": "faster" if res.best_knobs != res.start.knobs else "undecided",
                                            "same": "same", "slower": "same", "undecided": "undecided"}[c.answer], (c, res)
    assert (res.best_knobs != res.start.knobs) == (res.answer == "faster") and res.best_knobs.world_size == 2
    confirm = res.steps[res.steps["stage"] == "confirm"]  # a kept winner is explained after it (an "explain" row)
    assert len(confirm) and res.confirmation.verdict in confirm["decision"].iloc[-1], res.steps
    assert f"answer: {res.answer}" in str(res)


def test_tune_races_your_own_knob_with_choices():
    @wb.knob(choices=["naive", "fused"], default="naive", help="a kernel path (the fake bench times it)")
    def kernel_path(model, value):
        return model

    try:
        bench = FakeBench(lambda k: 1e-3 if k.kernel_path == "naive" else 0.5e-3, lambda k: 1000.0, noise=0.01)
        res = tune(bench, n_trials=40, stages=("yours",))
        assert res.best_knobs.kernel_path == "fused" and res.answer == "faster", str(res)
        assert (res.steps["stage"] == "yours").any()
    finally:
        wb.forget_knob("kernel_path")


def test_the_winners_explanation_is_paid_from_the_budget(tmp_path):
    """Explaining the winner costs traced repeats: they count in trials_used, or, when the budget cannot
    pay for them, the result says so and runs nothing more."""
    bench = wb.Workbench(Net(), data(), loss_fn=nn.CrossEntropyLoss(), log=tmp_path / "log.jsonl", steps=2,
                         warmup_steps=1, knobs=wb.Knobs(batch_size=16), device="cpu")
    start, best = bench.run(), bench.run(batch_size=32)
    ctx = race_mod.Ctx(bench, limit=10, budget_s=None, memory_cap=None, max_bytes=None)
    ctx.used = 2
    why = tune_mod._explain(ctx, start, best)
    assert why is not None and ctx.used == 4 and len(bench.trials) == 4  # two traced repeats, counted
    broke = race_mod.Ctx(bench, limit=4, budget_s=None, memory_cap=None, max_bytes=None)
    broke.used = 3
    fresh = bench.run(batch_size=8)
    assert tune_mod._explain(broke, start, fresh) is None and broke.used == 3 and len(bench.trials) == 5
    assert "not explained" in broke.rows[-1]["decision"]


def test_a_data_bound_start_enters_every_worker_count_first(monkeypatch):
    """Issue 35: with a small budget, a start that waits for data races worker counts (with compute
    threads) before precision or kernels, and `steps` says why."""
    bench = FakeBench(speed_model, lambda k: 1000, conv=True, cores=2, wait=lambda k: 0.0 if k.num_workers else 0.6)
    res = tune(bench, n_trials=12, stages=("data", "precision", "kernels"), confirm=False, explain=False)
    why = res.steps[res.steps["decision"].str.startswith("entered first")]
    assert len(why) == 1 and "waits for data 60%" in why["decision"].iloc[0]
    raced = [t.knobs for t in bench.trials[1:]]
    workers = [k for k in raced if k.num_workers]
    assert {(k.num_workers, k.cpu_threads) for k in workers} >= {(1, 1), (2, 1)}
    assert raced.index(workers[0]) == 1 and res.best_knobs.num_workers == 1  # the start, then the workers


def test_a_start_whose_wait_is_the_copy_does_not_race_workers_first(monkeypatch):
    """Issue 48: workers-first reads the loader's part of the data wait; a wait that is the host->device
    copy's own cost is not theirs to fix."""
    bench = FakeBench(speed_model, lambda k: 1000, conv=True, cores=2, wait=lambda k: 0.6, copy=lambda k: 0.5)
    res = tune(bench, n_trials=6, stages=("data", "precision", "kernels"), confirm=False, explain=False)
    assert not res.steps["decision"].str.startswith("entered first").any()


def test_an_unsteady_start_whose_repeat_the_budget_stops_keeps_the_start(fake_clock, monkeypatch):
    """The start's unsteady repeat runs under the deadline; stopped there, the first start stands."""
    bench = fake_clock(FakeBench(speed_model, lambda k: 1000))
    plain = bench.run

    def run(knobs, **kwargs):
        if getattr(kwargs.get("cancel"), "timed", False):  # the repeat, under the deadline: the budget stops it
            return bench.log.append(TrialResult(knobs=knobs, status="interrupted", message="stopped by the budget"))
        r = plain(knobs)
        r.extra["steady"] = False
        return r

    monkeypatch.setattr(bench, "run", run)
    res = tune(bench, budget_s=3, stages=("data",))
    assert res.start.ok and res.start.trial_id == 1 and bench.trials[1].status == "interrupted"


def test_a_small_budget_carries_candidates_it_could_not_enter_onto_the_leader(monkeypatch):
    """Issue 35: with budget=12, the first race (the start and every worker count) leaves no room for
    the kernel candidates; the next race offers them on the leader instead of dropping
    them, and the start and leader (two trials each already) sit out its first round."""

    def speed(k: wb.Knobs) -> float:  # workers help, and the foreach optimizer helps on top of them
        return speed_model(k) / (1.3 if k.optimizer_impl == "foreach" else 1.0)

    bench = FakeBench(speed, lambda k: 1000, conv=True, cores=2, wait=lambda k: 0.0 if k.num_workers else 0.6)
    res = tune(bench, n_trials=12, stages=("data", "kernels"), confirm=False, explain=False)
    on_leader = res.steps[res.steps["stage"].str.endswith("on the leader") & res.steps["trial"].notna()]
    assert len(on_leader) >= 1
    assert not any(t.knobs.optimizer_impl == "foreach" and not t.knobs.num_workers for t in bench.trials)
    assert res.best_knobs.num_workers == 1 and res.best_knobs.optimizer_impl == "foreach"
    assert res.trials_used <= 12


def test_page_faults_put_the_allocator_modes_first(make_bench):
    """Over 10% of the CPU time in page faults, the tuner's first race starts with every allocator mode
    available here (each a fresh-process trial); below it, no allocator axis at all."""
    from workbench.core.system import available_allocators
    from workbench.search.tune import _first_entries, _lead, stage_axes

    bench = make_bench(log=None)
    k = bench.defaults
    calm = TrialResult(knobs=k, status="ok", samples_per_s=100.0, step_times_s=(0.08,) * 4, samples_per_step=8,
                       extra={"kernel_share": 0.04})
    bench.log.append(calm)
    assert stage_axes(bench, "process", k) == []
    faulting = TrialResult(knobs=k, status="ok", samples_per_s=100.0, step_times_s=(0.08,) * 4, samples_per_step=8,
                           extra={"kernel_share": 0.22})
    bench.log.append(faulting)
    modes = [c["allocator"] for _, changes in stage_axes(bench, "process", k) for c in changes]
    assert modes == list(available_allocators()) and "glibc" in modes

    from types import SimpleNamespace

    ctx = SimpleNamespace(bench=bench, rows=[])
    lead = _lead(ctx, faulting)
    assert lead == ("allocator",) and "page faults took 22%" in ctx.rows[0]["decision"]
    axes_of = lambda stage, knobs: stage_axes(bench, stage, knobs)  # noqa: E731
    first = _first_entries(axes_of, k, tune_mod.STAGES, lead)
    assert [e.change for e in first[:len(modes)]] == [{"allocator": m} for m in modes]  # before compute knobs


def test_old_keywords_warn_and_still_work():
    """tune(budget=N) is tune(n_trials=N), tune(memory_budget=) is tune(max_bytes=) and fit_memory(budget_bytes=)
    is fit_memory(max_bytes=), each with a
    FutureWarning for one release; both names at once, or an unknown keyword, is a TypeError."""
    bench = FakeBench(speed_model, lambda k: 1.0)
    with pytest.warns(FutureWarning, match="n_trials"):
        res = tune(bench, budget=3, stages=("data",))
    assert res.n_trials == 3 and res.trials_used <= 3
    with pytest.raises(TypeError, match="n_trials"):
        tune(bench, n_trials=3, budget=3)
    with pytest.raises(TypeError, match="unexpected"):
        tune(bench, n_trial=3)
    with pytest.warns(FutureWarning, match="max_bytes"):
        res = tune(bench, n_trials=3, memory_budget=1 << 40, stages=("data",))
    assert res.n_trials == 3
    with pytest.raises(TypeError, match="max_bytes"):
        tune(bench, n_trials=3, max_bytes=1 << 40, memory_budget=1 << 40)
    with pytest.warns(FutureWarning, match="max_bytes"):
        fit = fit_memory(bench, budget_bytes=1 << 40, effective_batch=16)
    assert fit.max_bytes == 1 << 40
    with pytest.raises(TypeError, match="max_bytes"):
        fit_memory(bench, effective_batch=16)
