"""The tuner's race decides compute candidates by interleaved comparisons (race.py, issue 34 item 5):
which pairs interleave, what the rows say, that budget_s still holds and that a side failing inside
an interleaved comparison never crashes tune(). Against a fake bench whose interleaved comparisons
are a pure function of the knobs (fast, no timing), and once on a real workbench."""

from __future__ import annotations

import math
import random

import pytest
import torch
from conftest import SleepNet
from test_tune import FakeBench, speed_model

import workbench as wb
from workbench.deciding.budget import OVERRUN
from workbench.deciding.interleave import InterleaveFailed, why_not
from workbench.results.stats import decide_interleaved
from workbench.search import race as race_mod
from workbench.search.tune import tune

PAIRS = 40  # pairs of blocks in a fake interleaved comparison


class InterleavingBench(FakeBench):
    """A FakeBench with `interleave`: PAIRS pairs of blocks at the two knobs' true rates times 1% noise,
    judged by the real rule; it advances the clock by the seconds it was given. `fail(knobs)` names a
    status ("nan", "oom", "error") for a side that fails inside the comparison."""

    def __init__(self, *args, fail=None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fail = fail or (lambda k: None)
        self.calls: list[tuple[wb.Knobs, wb.Knobs, float, float]] = []  # A, B, seconds given, clock at the start
        self.pair_rng = random.Random(7)

    def _interleave(self, a, b, *, margin=0.05, budget_s=None, cancel=None):
        budget_s = budget_s.left()  # the race passes its Budget's part: the seconds these turns may spend
        self.calls.append((a.knobs, b.knobs, budget_s, self.clock))
        self.clock += budget_s
        for side, r in (("A", a), ("B", b)):
            status = self.fail(r.knobs)
            if status:
                raise InterleaveFailed(f"side {side} ended {status}", side=side, status=status)
        rates = [[1 / self.speed(r.knobs) * math.exp(self.pair_rng.gauss(0, 0.01)) for _ in range(PAIRS)]
                 for r in (a, b)]
        return decide_interleaved(*rates, margin=margin, a=a.trial_id, b=b.trial_id, seconds=budget_s, turn_steps=4)


@pytest.fixture
def kernel_knob():
    """Registers `kernel_path`, a user knob with the given choices besides "naive" (the "yours" stage):
    the fake bench times its values."""

    def register(*choices: str) -> None:
        @wb.knob(choices=["naive", *choices], default="naive", help="a kernel path")
        def kernel_path(model, value):
            return model

    yield register
    wb.forget_knob("kernel_path")


def slow_kernel(k: wb.Knobs) -> float:
    """Seconds per sample: 'slow' is 10% slower (too close for one trial each to call), the rest equal."""
    return 1.1e-3 if k.kernel_path == "slow" else 1e-3


def decisions(res, change: str) -> list[str]:
    return list(res.steps.loc[res.steps["change"] == change, "decision"])


def test_a_slower_compute_candidate_is_dropped_by_an_interleaved_comparison(kernel_knob):
    kernel_knob("slow")
    bench = InterleavingBench(slow_kernel, lambda k: 1000.0, noise=0.05)
    res = tune(bench, n_trials=12, stages=("yours",), explain=False)
    dropped = [d for d in decisions(res, "kernel_path='slow'") if d.startswith("dropped")]
    assert dropped and dropped[0].startswith("dropped: 0.91x of the start, interleaved, 40 pairs"), str(res)
    assert sum(r.knobs.kernel_path == "slow" for r in bench.trials) == 1  # one trial, then interleaved: out
    assert (bench.defaults, bench.defaults.replace(kernel_path="slow")) in [c[:2] for c in bench.calls]
    logged = [c for c in bench.log.comparisons if c.method == "interleaved"]  # the log keeps them
    assert logged and logged[0].b_knobs.kernel_path == "slow" and logged[0].answer == "slower"
    assert res.spent.seconds.get("interleave", 0) > 0 and "interleave" in str(res.spent)
    assert res.best_knobs == res.best.knobs == bench.defaults and res.best in bench.trials  # its figure: a trial


def test_data_pipeline_candidates_race_by_trials(monkeypatch):
    """Workers and prefetch never interleave (their pairs with the start or leader differ in loader knobs);
    they run trials, and their drops say "by trials"; a compute-only candidate (fewer threads) may interleave."""
    bench = InterleavingBench(speed_model, lambda k: 1000.0, noise=0.02, cores=2)
    res = tune(bench, n_trials=30, stages=("data",), explain=False)
    assert all(why_not(a, b) is None for a, b, *_ in bench.calls), bench.calls
    assert not any(a.num_workers != b.num_workers or a.prefetch_factor != b.prefetch_factor for a, b, *_ in bench.calls)
    assert not any(a.cpu_threads != b.cpu_threads and (a.num_workers or b.num_workers) for a, b, *_ in bench.calls)
    workers = res.steps[res.steps["change"].str.contains("num_workers")]
    assert workers["trial"].notna().any() and not workers["decision"].str.contains("interleaved").any()
    assert res.best_knobs.num_workers == 1, str(res)  # the speed model's best: one worker


def test_a_side_failing_inside_an_interleaved_comparison_never_crashes_tune(kernel_knob):
    """NaN (or an error) on one side drops that side; an OOM (two models at once) decides nothing."""
    kernel_knob("poison", "hog")
    fail = {"poison": "nan", "hog": "oom"}
    bench = InterleavingBench(lambda k: 1e-3, lambda k: 1000.0, noise=0.05,
                              fail=lambda k: fail.get(k.kernel_path))
    res = tune(bench, n_trials=16, stages=("yours",), explain=False)
    assert "dropped: ended nan while interleaved (kernel_path='poison')" in decisions(res, "kernel_path='poison'")
    assert not any("oom" in d for d in decisions(res, "kernel_path='hog'"))
    assert res.answer in ("same", "undecided", "faster")


def test_budget_s_still_holds_with_interleaved_comparisons(kernel_knob, fake_clock):
    """Each comparison's seconds come out of budget_s (the fake one spends all it is given): the whole
    tune() ends within budget_s x OVERRUN on the fake clock, and none is started that does not fit."""
    kernel_knob("slow")
    bench = fake_clock(InterleavingBench(slow_kernel, lambda k: 1000.0, noise=0.05))
    res = tune(bench, budget_s=9, stages=("yours", "kernels"), explain=False)
    assert bench.calls and bench.clock <= 9 * OVERRUN, str(res)
    assert all(at + s <= 9 for _a, _b, s, at in bench.calls)  # each fitted the seconds left when it started
    assert res.spent.seconds["interleave"] == pytest.approx(sum(s for _a, _b, s, _at in bench.calls))


@pytest.mark.slow
def test_a_real_race_drops_a_slower_knob_by_interleaving(make_bench, monkeypatch):
    """On a workbench whose forward sleeps, a user knob that sleeps 3x longer is dropped by
    bench._interleave (trials held undecided here, so the path is the interleaved one)."""

    @wb.knob(choices=[1.0, 3.0], default=1.0, help="sleep longer in forward")
    def nap(model, value):
        model.sleep_s *= value

    real = race_mod.answer_of
    monkeypatch.setattr(race_mod, "answer_of", lambda a, b, **kw: ("undecided", real(a, b, **kw)[1]))
    monkeypatch.setattr(race_mod, "RACE_INTERLEAVE_S", (4.0, 10.0))  # room for its least cost on a loaded machine
    try:
        bench = make_bench(model=SleepNet(0.01), knobs=wb.Knobs(batch_size=8, cpu_threads=1))
        res = bench.tune(n_trials=6, stages=("yours",), explain=False, progress=False)
        assert any(d.startswith("dropped: 0.") and "interleaved" in d for d in decisions(res, "nap=3.0")), str(res)
        logged = bench.log.comparisons[-1]
        assert logged.method == "interleaved" and logged.answer == "slower" and logged.b_knobs.nap == 3.0
        assert res.best_knobs.nap == 1.0 and res.spent.seconds["interleave"] > 0
        assert torch.isfinite(torch.tensor(res.best.samples_per_s))
    finally:
        wb.forget_knob("nap")
