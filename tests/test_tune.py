"""tune.py: the greedy search (against a deterministic fake bench) and fit_memory (fake and real)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import workbench as wb
from workbench.fit import FitResult, fit_memory
from workbench.measure import TrialResult
from workbench.results import ResultLog
from workbench.tune import TuneResult, stage_options, tune
from workbench.workload import Workload

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
    """A bench whose trials are a pure function of the knobs: the search logic, without the noise.

    `speed(knobs)` gives seconds per sample, `peak(knobs)` bytes; a peak over `oom_at` is an OOM.
    """

    def __init__(self, speed, peak, oom_at: float = float("inf"), defaults: wb.Knobs | None = None) -> None:
        self.workload = Workload(Net(), data(), loss_fn=nn.CrossEntropyLoss(), device="cpu")
        self.device = torch.device("cpu")
        self.defaults = defaults or wb.Knobs(batch_size=16)
        self.log = ResultLog(None)
        self.speed, self.peak, self.oom_at = speed, peak, oom_at

    def run(self, knobs: wb.Knobs) -> TrialResult:
        peak = self.peak(knobs)
        if peak > self.oom_at:
            r = TrialResult(knobs=knobs, status="oom", message="out of memory")
        else:
            step = self.speed(knobs) * knobs.batch_size * knobs.accum_steps
            times = tuple(step * (1 + 0.005 * ((i % 3) - 1)) for i in range(10))
            r = TrialResult(knobs=knobs, status="ok", samples_per_s=knobs.batch_size * knobs.accum_steps / step,
                            step_time_s=step, step_times_s=times, samples_per_step=knobs.batch_size * knobs.accum_steps,
                            peak_memory_bytes=int(peak), data_wait_share=0.0)
        return self.log.append(r)

    @property
    def trials(self):
        return self.log.trials


def speed_model(k: wb.Knobs) -> float:
    """Workers help (1 best), prefetch does nothing, batch 32 helps, 64 helps less than noise would."""
    s = 1.0
    if k.num_workers == 1:
        s *= 0.5
    elif k.num_workers == 2:
        s *= 0.8  # two workers on two cores: oversubscribed
    if k.batch_size >= 32:
        s *= 0.7
    return s / 1000


def test_tune_keeps_only_confirmed_wins_in_seed_order():
    bench = FakeBench(speed_model, lambda k: 1000 * k.batch_size)
    res = tune(bench, budget=20, stages=("data", "precision", "batch"))
    assert isinstance(res, TuneResult)
    assert res.best_knobs.num_workers == 1 and res.best_knobs.persistent_workers
    assert res.best_knobs.prefetch_factor is None  # no effect => not kept
    assert res.best_knobs.batch_size == 32  # 64 gives nothing more => stays at 32
    assert res.trials_used == len(bench.trials) <= 20
    kept = res.steps[res.steps["decision"] == "kept"]
    assert list(kept["stage"]) == ["data", "batch"]
    assert (res.steps["decision"].str.startswith("confirmed")).sum() == 2
    assert "Tuned in" in str(res) and "<table" in res._repr_html_()
    assert res.speedup == pytest.approx(1 / (0.5 * 0.7), rel=0.02)


def test_tune_respects_budget_and_memory():
    bench = FakeBench(speed_model, lambda k: 1000 * k.batch_size)
    res = tune(bench, budget=3, stages=("data",))
    assert res.trials_used <= 3 and len(bench.trials) <= 3
    bench = FakeBench(speed_model, lambda k: 1000 * k.batch_size)
    res = tune(bench, budget=12, stages=("batch",), memory_budget=20_000)
    assert res.best_knobs.batch_size == 16
    # the doubling is predicted (16 kB x 2 > 20 kB) not to fit: it is never run
    assert all(r.knobs.batch_size <= 16 for r in bench.trials if r.knobs.batch_size != 8)


def test_tune_batch_search_is_oom_safe():
    bench = FakeBench(lambda k: 1e-3 / (1 + k.batch_size / 16), lambda k: 1000 * k.batch_size, oom_at=40_000)
    res = tune(bench, budget=12, stages=("batch",))
    assert res.best_knobs.batch_size == 32  # 64 runs out of memory: the search stops there
    assert [r.status for r in bench.trials].count("oom") == 1


def test_tune_validates_inputs():
    bench = FakeBench(speed_model, lambda k: 1.0)
    with pytest.raises(ValueError, match="budget"):
        tune(bench, budget=1)
    with pytest.raises(ValueError, match="stage"):
        tune(bench, stages=("magic",))


def test_stage_options_prune_for_the_device():
    bench = FakeBench(speed_model, lambda k: 1.0)
    precision = stage_options(bench, "precision", bench.defaults)
    assert {"amp": "fp16"} not in precision  # fp16 on CPU is a trap
    assert {"channels_last": True} not in precision  # no convolutions here
    data_opts = stage_options(bench, "data", bench.defaults)
    assert data_opts[0]["num_workers"] >= 1 and data_opts[0]["persistent_workers"]
    space = exhaustive_space(bench, batch_sizes=(16, 32))
    assert len(space) == len(set(space)) and bench.defaults in space


def test_fit_memory_follows_rescue_order_and_keeps_effective_batch():
    def peak(k: wb.Knobs) -> float:
        act = 1000 * k.batch_size * (0.6 if k.amp == "bf16" else 1.0) * (0.5 ** len(k.checkpoint))
        return 5000 + act

    bench = FakeBench(lambda k: 1e-3 * (1 + 0.3 * len(k.checkpoint)), peak)
    fit = fit_memory(bench, budget_bytes=12_000, effective_batch=64)
    assert isinstance(fit, FitResult) and fit.fits
    assert fit.knobs.batch_size * fit.knobs.accum_steps == 64
    assert fit.result.peak_memory_bytes <= 12_000
    assert list(fit.steps["step"])[:2] == ["start", "amp"]
    assert "accumulation" in set(fit.steps["step"])
    assert fit.steps["time_cost"].iloc[0] == pytest.approx(1.0)
    assert "Fits" in str(fit) and fit.to_code().startswith("#")
    nothing = fit_memory(FakeBench(lambda k: 1e-3, lambda k: 1e9), budget_bytes=10, effective_batch=16, max_trials=4)
    assert not nothing.fits and len(nothing.steps) <= 4 and "nothing fits" in str(nothing)
    with pytest.raises(ValueError, match="budget_bytes"):
        fit_memory(bench, budget_bytes=0, effective_batch=8)
    with pytest.raises(ValueError, match="effective_batch"):
        fit_memory(bench, budget_bytes=10, effective_batch=0)


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
    res = bench.tune(budget=4, stages=("data", "batch"))
    assert res.trials_used <= 4 and len(bench.results) == res.trials_used
    assert set(res.steps["trial"]) <= set(bench.results["trial_id"])
