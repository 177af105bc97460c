"""Workbench facade: the core imports without the notebook stack; run/results/compare contract."""

import subprocess
import sys

import pytest

import workbench as wb


def test_core_imports_without_ipywidgets_or_altair():
    code = (
        "import sys; sys.modules['ipywidgets'] = None; sys.modules['altair'] = None; sys.modules['anywidget'] = None\n"
        "import torch, workbench as wb\n"
        "from torch.utils.data import TensorDataset\n"
        "ds = TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))\n"
        "b = wb.Workbench(torch.nn.Linear(4, 2), ds, loss_fn=torch.nn.CrossEntropyLoss(), log=None, steps=2, warmup_steps=0)\n"
        "r = b.run(batch_size=8)\n"
        "assert r.ok, r\n"
        "assert len(b.results) == 1\n"
        "assert 'ipywidgets' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


def test_run_results_compare_contract(make_bench):
    bench = make_bench(steps=4)
    a = bench.run()
    b = bench.run(batch_size=16)
    df = bench.results
    assert list(df["trial_id"]) == [1, 2] and set(df["status"]) == {"ok"}
    by_id = df.set_index("trial_id")
    assert by_id.loc[2, "batch_size"] == 16 and by_id.loc[1, "verdict"] == "baseline"
    assert bench.baseline.trial_id == a.trial_id
    bench.baseline = b
    assert bench.results.set_index("trial_id").loc[2, "speedup"] == 1.0
    assert bench.compare(1, 2).b == 2
    assert "Workbench 'TinyNet'" in repr(bench) and "2 trials" in repr(bench)
    assert list(bench.blocks) == ["blocks.0", "blocks.1"] and bench.blocks["blocks.0"] > 0


def test_compare_in_rounds_runs_alternating_trials_and_teaches_the_noise(make_bench):
    bench = make_bench(steps=4)
    a, b = bench.run(), bench.run(batch_size=16)
    assert "conservative prior" in str(bench.noise)
    c = bench.compare(a, b, rounds=2)
    assert c.rounds == 2 and c.a_trials == (1, 4, 5) and c.b_trials == (2, 3, 6)
    assert [r.knobs.batch_size for r in bench.trials[2:]] == [16, 8, 8, 16]  # B A, A B after the first A B
    assert c.verdict in str(c) and "2 alternating rounds" in str(c)
    assert bench.noise.repeats == 4 and "from 4 repeats of 2 configurations" in str(bench.noise)
    assert bench.results.attrs["noise"] == bench.noise
    steps = bench.log.steps_frame()
    assert len(steps) == 6 * 4 and set(steps["trial_id"]) == set(range(1, 7))
    assert "<table" in c._repr_html_()
    with pytest.raises(ValueError, match="rounds must be"):
        bench.compare(a, b, rounds=-1)


def test_a_new_workbench_on_the_same_log_keeps_earlier_trials(make_bench, tmp_path):
    make_bench().run()
    again = make_bench()
    assert len(again.trials) == 1
    again.run()
    assert [r.trial_id for r in again.trials] == [1, 2]


def test_run_rejects_unknown_knob(make_bench):
    with pytest.raises(TypeError, match="unknown knob"):
        make_bench().run(workers=2)


def test_steps_must_allow_statistics(make_bench):
    with pytest.raises(ValueError, match="steps must be >= 2"):
        make_bench(steps=1)


def test_a_first_trial_with_its_own_knobs_is_labelled_by_them(make_bench):
    """Issue 40: labels name how knobs differ from the workbench's defaults, never "baseline"; which trial
    is the baseline is the boolean `baseline` column (and the verdict word "baseline")."""
    bench = make_bench(knobs=None)
    first = bench.run(batch_size=16, channels_last=True)
    bench.run()
    df = bench.results.set_index("trial_id")
    assert df.loc[first.trial_id, "label"] == "batch_size=16, channels_last"
    assert df.loc[2, "label"] == "defaults" and bench.defaults.batch_size != 16
    assert list(df["baseline"]) == [True, False] and df.loc[1, "verdict"] == "baseline"
    assert df.loc[2, "verdict"] in ("faster", "slower", "same", "undecided")


SURFACE = {"knobs", "run", "results", "trials", "baseline", "compare", "diagnose", "explain", "tune", "fit_memory",
           "scaling", "to_code", "panel", "chart", "blocks", "device", "noise", "to_tensorboard", "from_trainer",
           "to_training_arguments", "from_lightning", "to_lightning"}  # issue 42's twenty + issue 51's Lightning pair


def test_public_surface_is_the_agreed_names():
    public = {n for n in dir(wb.Workbench) if not n.startswith("_")}
    assert public == SURFACE and len(public) <= 22


def test_removed_names_warn_and_still_work(make_bench, tmp_path):
    bench = make_bench(steps=4)
    a, b = bench.run(), bench.run(batch_size=16)
    for name in ("log_to", "block_params", "expect_slow", "came_from", "set_baseline", "interleave",
                 "steps_frame", "scaling_chart"):
        assert name not in dir(bench)
        with pytest.warns(FutureWarning, match=f"Workbench.{name} is deprecated"):
            getattr(bench, name)
    with pytest.warns(FutureWarning):
        bench.set_baseline(b)
    assert bench.baseline.trial_id == b.trial_id
    with pytest.warns(FutureWarning):
        assert bench.block_params == bench.blocks
    with pytest.warns(FutureWarning):
        assert len(bench.steps_frame) == 2 * 4
    with pytest.warns(FutureWarning):
        assert bench.expect_slow(bench.knobs()) is None
    with pytest.warns(FutureWarning):
        bench.log_to(tmp_path / "other.jsonl")
    assert bench.log.path == tmp_path / "other.jsonl"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        bench.nope  # noqa: B018
    with pytest.raises(ValueError, match="method must be"):
        bench.compare(a, b, method="sideways")


def test_compare_method_interleave_is_the_old_interleave_path(make_bench):
    bench = make_bench(steps=4)
    a, b = bench.run(), bench.run(matmul_precision="high")
    new = bench.compare(a, b, method="interleave", budget_s=3)
    with pytest.warns(FutureWarning, match="method='interleave'"):
        old = bench.interleave(a, b, budget_s=3)
    assert new.method == old.method == "interleaved" and (new.a, new.b) == (old.a, old.b) == (1, 2)
    assert new.turns > 0 and old.turns > 0
    assert bench.compare(a, b, rounds=1, method="trials").method == "trials"
    bigger = bench.run(num_workers=1)  # a data-pipeline knob: cannot share a process
    with pytest.raises(ValueError, match="cannot interleave"):
        bench.compare(a, bigger, method="interleave")
